// OCP FP8 E4M3 conversions and the E4M3 codebooks the CUDA attention kernels read.
// Tolerance tier: exact (every byte decoded against the format's definition; rounding against
// an independent nearest-value search over all 254 finite E4M3 values, ties to even).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "veloxquant/dtype.h"
#include "veloxquant/error.h"
#include "veloxquant/pq.h"

using namespace veloxquant;

namespace {

// The format's definition, written independently of e4m3_to_float: sign, 4 exponent bits
// (bias 7), 3 mantissa bits; exponent 0 is subnormal; S.1111.111 is NaN; no infinities.
double e4m3_definition(int b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

// Nearest finite E4M3 value to f by search (ties: even mantissa), saturating past 448.
uint8_t e4m3_oracle(float f) {
  if (std::isnan(f)) return 0x7F;
  const double a = std::fabs(double(f));
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  int best = 0;
  double bd = a;
  for (int b = 1; b <= 0x7E; ++b) {
    const double d = std::fabs(e4m3_definition(b) - a);
    if (d < bd || (d == bd && (b & 1) == 0)) best = b, bd = d;
  }
  return uint8_t(sign | best);
}

}  // namespace

TEST(E4M3, EveryByteDecodesAsTheFormatDefinesAndRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const float f = e4m3_to_float(uint8_t(b));
    if ((b & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f)) << b;
      EXPECT_EQ(float_to_e4m3(f) & 0x7F, 0x7F);
      continue;
    }
    ASSERT_EQ(double(f), e4m3_definition(b)) << "byte " << b;
    ASSERT_EQ(float_to_e4m3(f), (b == 0x80 ? 0x80 : b)) << "byte " << b << " value " << f;
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
}

TEST(E4M3, FloatToE4M3RoundsToNearestEvenAndSaturates) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_real_distribution<float> expo(-13.0f, 10.0f);
  for (int i = 0; i < 100000; ++i) {
    float f;
    if (i % 2 == 0) {  // random values over the whole range, past both ends
      f = std::ldexp(1.0f + float(any(rng) & 0xFFFFFF) / 16777216.0f, int(expo(rng)));
    } else {  // on or one float ulp beside a midpoint between neighbouring E4M3 values
      const int b = int(any(rng) % 0x7E);
      const float mid = float((e4m3_definition(b) + e4m3_definition(b + 1)) / 2.0);
      const int which = int(any(rng) % 3);
      uint32_t u;
      std::memcpy(&u, &mid, 4);
      u += which == 0 ? 0u : which == 1 ? 1u : uint32_t(-1);
      std::memcpy(&f, &u, 4);
    }
    if (any(rng) & 1) f = -f;
    ASSERT_EQ(float_to_e4m3(f), e4m3_oracle(f)) << "f = " << f;
  }
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xFE);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);  // past 448 saturates (satfinite), no NaN
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: to even (zero)
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal steps: to even (2)
  EXPECT_EQ(float_to_e4m3(std::ldexp(5.0f, -10)), 0x02);  // 2.5 subnormal steps: to even (2)
}

TEST(E4M3, CodebookScaleIsAPowerOfTwoIntoTheTopBinade) {
  for (float mx : {1e-20f, 3e-3f, 0.37f, 1.0f, 2.5f, 448.0f, 449.0f, 1e6f, 3e37f}) {
    const float s = e4m3_codebook_scale(mx);
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << mx;  // a power of two
    EXPECT_LE(mx * s, 448.0f) << mx;
    EXPECT_GT(mx * s, 224.0f) << mx;
  }
  EXPECT_EQ(e4m3_codebook_scale(0.0f), 1.0f);
  EXPECT_EQ(e4m3_codebook_scale(std::numeric_limits<float>::infinity()), 1.0f);
}

TEST(E4M3, CodebookDecodesToTheNearestScaledValues) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.8f);
  std::vector<float> cb(256 * 4);
  for (float& x : cb) x = nd(rng);
  cb[17] = 0.0f;
  cb[18] = 1e-9f;  // far below the scaled subnormals: rounds to zero
  const E4M3Codebook e = make_e4m3_codebook(cb);
  ASSERT_EQ(e.bytes.size(), cb.size());
  ASSERT_EQ(e.decoded.size(), cb.size());
  float mx = 0;
  for (float x : cb) mx = std::max(mx, std::fabs(x));
  EXPECT_EQ(e.scale, e4m3_codebook_scale(mx));
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < cb.size(); ++i) {
    EXPECT_EQ(e.bytes[i], e4m3_oracle(cb[i] * e.scale)) << i;
    EXPECT_EQ(e.decoded[i], e4m3_to_float(e.bytes[i]) / e.scale) << i;
    // three mantissa bits: within half a quantum (2^-4 relative) in the normal range
    if (std::fabs(cb[i] * e.scale) >= std::ldexp(1.0f, -6))
      EXPECT_LE(std::fabs(e.decoded[i] - cb[i]), std::ldexp(std::fabs(cb[i]), -4)) << i;
    err2 += double(e.decoded[i] - cb[i]) * (e.decoded[i] - cb[i]);
    ref2 += double(cb[i]) * cb[i];
  }
  EXPECT_EQ(e.decoded[17], 0.0f);
  EXPECT_EQ(e.decoded[18], 0.0f);
  // uniform relative rounding of 3 mantissa bits: RMS about 2^-4/√3 ≈ 3.6% at worst
  EXPECT_LT(std::sqrt(err2 / ref2), 0.04);
  std::vector<float> bad = cb;
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(make_e4m3_codebook(bad), ValueError);
}
