// The int8 key codebooks the CUDA attention kernels read with CodebookFormat::I8, and the
// format names. Tolerance tier: exact (each byte against an independent nearest-integer search).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "veloxquant/cache.h"
#include "veloxquant/dtype.h"
#include "veloxquant/error.h"
#include "veloxquant/pq.h"

using namespace veloxquant;

namespace {
// The nearest integer in [-127, 127] to x by search; ties to the even one.
int nearest_i8(double x) {
  int best = -127;
  for (int k = -126; k <= 127; ++k) {
    const double d = std::fabs(x - k), bd = std::fabs(x - best);
    if (d < bd || (d == bd && (k & 1) == 0)) best = k;
  }
  return best;
}
}  // namespace

TEST(I8Codebook, BytesAreTheNearestStepsOfMaxOver127) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.7f);
  std::vector<float> cb(4096 * 4);
  for (float& x : cb) x = nd(rng);
  cb[5] = 0.0f;
  float mx = 0;
  for (float x : cb) mx = std::max(mx, std::fabs(x));
  const float scale = mx / 127.0f;
  cb[9] = 2.5f * scale;    // a tie: rounds to the even 2
  cb[10] = -3.5f * scale;  // rounds to -4
  const I8Codebook q = make_i8_codebook(cb);
  ASSERT_EQ(q.bytes.size(), cb.size());
  ASSERT_EQ(q.decoded.size(), cb.size());
  EXPECT_EQ(q.scale, scale);
  double err2 = 0, ref2 = 0;
  bool saw_127 = false;
  for (size_t i = 0; i < cb.size(); ++i) {
    EXPECT_EQ(int(q.bytes[i]), nearest_i8(double(cb[i] / q.scale))) << i;
    EXPECT_EQ(q.decoded[i], float(q.bytes[i]) * q.scale) << i;
    EXPECT_LE(std::fabs(q.decoded[i] - cb[i]), 0.5f * q.scale * (1 + 1e-5f)) << i;
    saw_127 |= std::abs(int(q.bytes[i])) == 127;
    err2 += double(q.decoded[i] - cb[i]) * (q.decoded[i] - cb[i]);
    ref2 += double(cb[i]) * cb[i];
  }
  EXPECT_TRUE(saw_127);  // the largest element maps to ±127
  EXPECT_EQ(q.bytes[5], 0);
  EXPECT_EQ(q.bytes[9], 2);
  EXPECT_EQ(q.bytes[10], -4);
  // a uniform step of max/127 on Gaussian entries: RMS error well under 1% of the RMS value
  EXPECT_LT(std::sqrt(err2 / ref2), 0.01);
}

TEST(I8Codebook, ZeroAndNonFiniteCodebooks) {
  const I8Codebook z = make_i8_codebook(std::vector<float>(64, 0.0f));
  EXPECT_EQ(z.scale, 1.0f);
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_EQ(z.bytes[i], 0);
    EXPECT_EQ(z.decoded[i], 0.0f);
  }
  std::vector<float> bad(64, 0.5f);
  bad[7] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(make_i8_codebook(bad), ValueError);
  // Subnormals so small that max/127 underflows to 0 (found by fuzz_cache_state: a restored
  // state's codebook made 0/0 = NaN and cast it to int8): they are zeros on any int8 grid.
  std::vector<float> tiny(64, 0.0f);
  tiny[3] = std::numeric_limits<float>::denorm_min();
  tiny[9] = -60 * std::numeric_limits<float>::denorm_min();
  const I8Codebook t = make_i8_codebook(tiny);
  EXPECT_EQ(t.scale, 1.0f);
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_EQ(t.bytes[i], 0) << i;
    EXPECT_EQ(t.decoded[i], 0.0f) << i;
  }
  EXPECT_EQ(snap_to_int8_grid(tiny), std::vector<float>(64, 0.0f));
  // 127 subnormal steps still have a (subnormal) scale of their own
  std::vector<float> small(64, 0.0f);
  small[0] = 127 * std::numeric_limits<float>::denorm_min();
  small[1] = -std::numeric_limits<float>::denorm_min();
  const I8Codebook u = make_i8_codebook(small);
  EXPECT_EQ(u.scale, std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(u.bytes[0], 127);
  EXPECT_EQ(u.bytes[1], -1);
}

// KVCacheConfig::int8_key_grid: the snapped codebook is what make_i8_codebook decodes, bit for
// bit (so the CUDA kernels' int8 keys are the cache's own centroids), every entry is an integer
// number of steps, no entry moved by more than half a step, and snapping again changes nothing
// (a restored cache snaps its saved codebook once more). Scales from tiny to large, where the
// step's float products round differently.
TEST(I8Codebook, SnapToInt8GridIsAFixedPointOnTheGrid) {
  std::mt19937_64 rng(11);
  for (float sigma : {1e-3f, 0.37f, 1.0f, 3.7f, 1e4f}) {
    SCOPED_TRACE(sigma);
    std::normal_distribution<float> nd(0.0f, sigma);
    std::vector<float> cb(256 * 4);
    for (float& x : cb) x = nd(rng);
    const std::vector<float> s = snap_to_int8_grid(cb);
    ASSERT_EQ(s.size(), cb.size());
    const I8Codebook q = make_i8_codebook(s);
    EXPECT_EQ(q.decoded, s);                 // the kernels' centroids are these
    EXPECT_EQ(snap_to_int8_grid(s), s);      // a fixed point
    const float step = make_i8_codebook(cb).scale;
    bool moved = false;
    for (size_t i = 0; i < cb.size(); ++i) {
      EXPECT_EQ(s[i], float(q.bytes[i]) * q.scale) << i;
      EXPECT_LE(std::fabs(s[i] - cb[i]), 0.5f * step * (1 + 1e-5f)) << i;
      moved |= s[i] != cb[i];
    }
    EXPECT_TRUE(moved);  // Gaussian entries are not on the grid to begin with
  }
  EXPECT_EQ(snap_to_int8_grid(std::vector<float>(16, 0.0f)), std::vector<float>(16, 0.0f));
  std::vector<float> bad(16, 0.25f);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(snap_to_int8_grid(bad), ValueError);
}

// CodebookFormat::I8KV's layout: the kernel puts byte u under fp16's exponent byte 0x64 (the
// fp16 1024 + u) and removes 1152 = 1024 + 128 per unit of probability, so u must be byte + 128
// and 0x6400 | u must decode to exactly 1024 + u for every byte the codebook can hold.
TEST(I8Codebook, OffsetBinaryBytesWidenExactlyToFp16) {
  std::vector<float> cb(256 * 4);
  for (size_t i = 0; i < cb.size(); ++i) cb[i] = float(int(i % 255) - 127) * 0.01f;  // every byte -127..127
  const I8Codebook q = make_i8_codebook(cb);
  const std::vector<uint8_t> u = i8_offset_binary(q);
  ASSERT_EQ(u.size(), q.bytes.size());
  bool saw_min = false, saw_max = false;
  for (size_t i = 0; i < u.size(); ++i) {
    EXPECT_EQ(int(u[i]), int(q.bytes[i]) + 128) << i;
    const float widened = half_to_float(uint16_t(0x6400u | u[i]));
    EXPECT_EQ(widened, 1024.0f + float(u[i])) << i;
    EXPECT_EQ((widened - 1152.0f) * q.scale, q.decoded[i]) << i;
    saw_min |= u[i] == 1, saw_max |= u[i] == 255;
  }
  EXPECT_TRUE(saw_min && saw_max);  // ±127 map to 1 and 255: no byte collides with 0
}

TEST(CodebookFormat, NamesParseBackAndUnknownNamesAreErrors) {
  for (CodebookFormat f : {CodebookFormat::F16, CodebookFormat::E4M3, CodebookFormat::I8, CodebookFormat::I8KV})
    EXPECT_EQ(parse_codebook_format(codebook_format_name(f)), f);
  EXPECT_STREQ(codebook_format_name(CodebookFormat::I8), "i8");
  EXPECT_STREQ(codebook_format_name(CodebookFormat::I8KV), "i8kv");
  try {
    parse_codebook_format("int4");
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'int4'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f16, e4m3, i8, i8kv"), std::string::npos) << e.what();
  }
}

// ProductQuantizer::codebook_i8 is derived by set_codebook, and only when exact: the CPU
// attention scores keys from these bytes as if they were the float codebook.
TEST(I8Codebook, QuantizerKeepsTheInt8FormOnlyOnTheGrid) {
  ProductQuantizer pq(128, PQSpec{4, 12});
  pq.set_random_codebook(3, 0.5f);
  EXPECT_TRUE(pq.codebook_i8.empty());  // a Gaussian codebook is not on its int8 grid
  EXPECT_EQ(pq.codebook_i8_scale, 0.0f);

  pq.set_codebook(snap_to_int8_grid(pq.codebook));
  ASSERT_EQ(pq.codebook_i8.size(), pq.codebook.size());
  EXPECT_GT(pq.codebook_i8_scale, 0.0f);
  bool saw_127 = false;
  for (size_t i = 0; i < pq.codebook.size(); ++i) {
    ASSERT_EQ(float(pq.codebook_i8[i]) * pq.codebook_i8_scale, pq.codebook[i]) << i;
    saw_127 |= std::abs(int(pq.codebook_i8[i])) == 127;
  }
  EXPECT_TRUE(saw_127);

  // one entry moved off the grid by an ulp: no int8 form (a stale one would score wrong keys)
  std::vector<float> off = pq.codebook;
  off[7] = std::nextafter(off[7], 1e30f);
  pq.set_codebook(off);
  EXPECT_TRUE(pq.codebook_i8.empty());
  EXPECT_EQ(pq.codebook_i8_scale, 0.0f);

  // an all-zero codebook is on every grid
  pq.set_codebook(std::vector<float>(pq.codebook.size(), 0.0f));
  ASSERT_EQ(pq.codebook_i8.size(), pq.codebook.size());
  for (int8_t b : pq.codebook_i8) ASSERT_EQ(b, 0);
}
