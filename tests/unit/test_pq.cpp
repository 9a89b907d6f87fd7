// Tests of the product quantizer (src/cpu/pq.cpp) against its scalar oracles (src/ref/pq_ref.cpp).
//
// Tolerance tiers:
//  * exact — code assignment (encode re-ranks near-ties with the oracle's own distance, so its
//    codes equal pq_encode_ref's byte for byte, ties included), decode (a copy of centroids),
//    pack/unpack (bits).
//  * bounded — lookup tables: both sum sub_dim f32 products; we allow sub_dim·u·Σ|q_j c_j|·2.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/pq_internal.h"
#include "veloxquant/error.h"
#include "veloxquant/pq.h"
#include "common/random.h"

using namespace veloxquant;

namespace {

using vqtest::randn;

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no throw>";
}

struct Combo {
  int head_dim, sub_dim, bits;
};

}  // namespace

TEST(PQSpec, ParseAndStr) {
  EXPECT_EQ(PQSpec::parse("d4b8"), (PQSpec{4, 8}));
  EXPECT_EQ(PQSpec::parse("d2b12"), (PQSpec{2, 12}));
  EXPECT_EQ(PQSpec::parse("d16b16"), (PQSpec{16, 16}));
  EXPECT_EQ((PQSpec{4, 12}).str(), "d4b12");
  EXPECT_DOUBLE_EQ((PQSpec{4, 8}).bits_per_element(), 2.0);
  for (const char* bad : {"", "d4", "b8", "d4b", "d0b8", "d4b0", "d17b8", "d4b17", "d4b8x", "x4b8", "d-4b8", "d4 b8"}) {
    const std::string w = what_of([&] { PQSpec::parse(bad); });
    EXPECT_NE(w.find(std::string("\"") + bad + "\""), std::string::npos) << bad << ": " << w;
  }
}

TEST(ProductQuantizer, ConstructorDerivesAndValidates) {
  ProductQuantizer pq(128, {4, 12});
  EXPECT_EQ(pq.n_sub, 32);
  EXPECT_EQ(pq.n_centroids, 4096);
  EXPECT_EQ(pq.code_bytes, 48);
  EXPECT_EQ(packed_row_bytes(32, 12), 48);
  EXPECT_EQ(packed_row_bytes(3, 5), 2);
  EXPECT_EQ(packed_row_bytes(0, 5), 0);
  EXPECT_EQ(ProductQuantizer(128, {4, 8}).code_bytes, 32);
  EXPECT_EQ(pq.codebook_bytes_f16(), 4096 * 4 * 2);

  std::string w = what_of([] { ProductQuantizer(100, {8, 8}); });
  EXPECT_NE(w.find("head_dim (100)"), std::string::npos) << w;
  EXPECT_NE(w.find("sub_dim (8)"), std::string::npos) << w;
  w = what_of([] { ProductQuantizer(128, {4, 0}); });
  EXPECT_NE(w.find("got 0"), std::string::npos) << w;
  w = what_of([] { ProductQuantizer(128, {4, 17}); });
  EXPECT_NE(w.find("got 17"), std::string::npos) << w;
  w = what_of([] { ProductQuantizer(128, {32, 8}); });
  EXPECT_NE(w.find("got 32"), std::string::npos) << w;
  EXPECT_THROW(ProductQuantizer(128, {0, 8}), ValueError);
  EXPECT_THROW(ProductQuantizer(0, {4, 8}), ValueError);
  w = what_of([] { ProductQuantizer(128, {4, 8}, std::vector<float>(100)); });
  EXPECT_NE(w.find("got 100"), std::string::npos) << w;
  EXPECT_THROW(ProductQuantizer(128, {4, 8}, std::vector<float>(100)), ShapeError);
  std::vector<float> cb(256 * 4, 0.5f);
  cb[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(ProductQuantizer(128, {4, 8}, cb), ValueError);
  // encode without a codebook
  ProductQuantizer empty(128, {4, 8});
  std::vector<float> x(128);
  std::vector<uint8_t> codes(32);
  EXPECT_THROW(empty.encode(x.data(), 1, codes.data()), ShapeError);
}

TEST(ProductQuantizer, CodebookNormsAndRandomCodebookDeterminism) {
  ProductQuantizer a(64, {4, 6}), b(64, {4, 6});
  a.set_random_codebook(7);
  b.set_random_codebook(7);
  EXPECT_EQ(a.codebook, b.codebook);
  b.set_random_codebook(8);
  EXPECT_NE(a.codebook, b.codebook);
  ASSERT_EQ(a.centroid_norms.size(), 64u);
  for (int c = 0; c < 64; ++c) {
    double n = 0;
    for (int j = 0; j < 4; ++j) n += double(a.codebook[size_t(c) * 4 + j]) * a.codebook[size_t(c) * 4 + j];
    EXPECT_NEAR(a.centroid_norms[size_t(c)], n, 1e-5 * (1 + n));
  }
}

// Exact tier: codes identical to the oracle's, byte for byte.
TEST(ProductQuantizer, EncodeEqualsRefManyCombos) {
  const Combo combos[] = {{128, 4, 8},  {128, 4, 12}, {128, 2, 8},  {128, 8, 10}, {64, 16, 11}, {96, 3, 7},
                          {80, 5, 9},   {128, 1, 4},  {64, 4, 1},   {64, 4, 2},   {60, 6, 3},   {112, 7, 5},
                          {128, 16, 6}, {24, 12, 13}, {22, 11, 14}, {9, 9, 16},   {40, 10, 15}, {26, 13, 3},
                          {30, 15, 12}, {56, 14, 4}};
  for (const Combo& cb : combos) {
    const uint32_t seed = uint32_t(cb.head_dim * 1000 + cb.sub_dim * 31 + cb.bits);
    SCOPED_TRACE("head_dim=" + std::to_string(cb.head_dim) + " sub_dim=" + std::to_string(cb.sub_dim) +
                 " bits=" + std::to_string(cb.bits) + " seed=" + std::to_string(seed));
    ProductQuantizer pq(cb.head_dim, {cb.sub_dim, cb.bits});
    pq.set_random_codebook(seed);
    const int64_t n = cb.bits >= 14 ? 3 : 29;
    std::vector<float> x = randn(size_t(n) * cb.head_dim, seed + 1);
    // a few exact duplicates of centroids and of each other → genuine ties must go to the lowest index
    for (int j = 0; j < cb.sub_dim; ++j) x[size_t(j)] = pq.codebook[size_t(1) * cb.sub_dim + j];
    std::vector<uint8_t> got(size_t(n * pq.code_bytes), 0xAB), ref(size_t(n * pq.code_bytes), 0xCD);
    pq.encode(x.data(), n, got.data());
    pq_encode_ref(pq, x.data(), n, ref.data());
    ASSERT_EQ(got, ref);
    std::vector<uint8_t> got_mt(got.size(), 0x11);
    pq.encode(x.data(), n, got_mt.data(), 3);
    ASSERT_EQ(got_mt, ref) << "multithreaded encode";
  }
}

// A codebook prepared once (what the CPU cache keeps, so a decode step's one-token encode does
// not re-prepare it) gives the oracle's codes, call after call, one row or many, ties and
// non-finite rows included; one prepared for another shape is refused naming both.
TEST(ProductQuantizer, PreparedCodebookEncodesAsTheOracle) {
  const Combo combos[] = {{128, 4, 8}, {128, 4, 12}, {128, 8, 8}, {96, 3, 7}, {64, 16, 11}, {128, 1, 4}};
  for (const Combo& cb : combos) {
    const uint32_t seed = uint32_t(cb.head_dim * 7 + cb.sub_dim * 3 + cb.bits);
    SCOPED_TRACE("head_dim=" + std::to_string(cb.head_dim) + " sub_dim=" + std::to_string(cb.sub_dim) +
                 " bits=" + std::to_string(cb.bits));
    ProductQuantizer pq(cb.head_dim, {cb.sub_dim, cb.bits});
    pq.set_random_codebook(seed);
    const auto prep = detail::prepare_centroids(pq);
    EXPECT_EQ(detail::prepared_bytes(*prep),
              int64_t(4) * (cb.sub_dim + 1) * ((pq.n_centroids + 15) / 16 * 16));
    std::vector<float> x = randn(size_t(40) * cb.head_dim, seed + 1);
    for (int j = 0; j < cb.sub_dim; ++j) x[size_t(j)] = pq.codebook[size_t(1) * cb.sub_dim + j];  // a tie
    x[size_t(cb.head_dim + 1)] = std::numeric_limits<float>::infinity();                        // row 1
    std::vector<uint8_t> ref(size_t(40 * pq.code_bytes));
    pq_encode_ref(pq, x.data(), 40, ref.data());
    std::vector<uint8_t> got(ref.size(), 0xAB);
    for (int64_t r = 0; r < 40; ++r)  // one row a call, as a decode step
      detail::pq_encode_prepared(pq, *prep, x.data() + r * cb.head_dim, 1, got.data() + r * pq.code_bytes);
    EXPECT_EQ(got, ref);
    std::vector<uint8_t> all(ref.size(), 0xCD);
    detail::pq_encode_prepared(pq, *prep, x.data(), 40, all.data(), 2);
    EXPECT_EQ(all, ref);
  }
  ProductQuantizer a(16, {4, 6}), b(16, {4, 7});
  a.set_random_codebook(1);
  b.set_random_codebook(2);
  const auto pa = detail::prepare_centroids(a.codebook.data(), a.n_centroids, a.sub_dim);
  std::vector<float> x = randn(16, 3);
  std::vector<uint8_t> codes(size_t(b.code_bytes));
  const std::string w = what_of([&] { detail::pq_encode_prepared(b, *pa, x.data(), 1, codes.data()); });
  EXPECT_NE(w.find("64 x 4"), std::string::npos) << w;
  EXPECT_NE(w.find("128 x 4"), std::string::npos) << w;
}

TEST(ProductQuantizer, EncodeTiesGoToLowestIndex) {
  // Codebook with exact duplicate centroids and points equidistant from two centroids.
  ProductQuantizer pq(8, {2, 3});
  std::vector<float> cb = {0, 0, 1, 0, 1, 0, -1, 0, 0, 1, 0, -1, 2, 2, 1, 0};  // c1 = c2 = c7
  pq.set_codebook(cb);
  std::vector<float> x = {1, 0, 0.5f, 0, 0, 0.5f, 5, 5};  // → 1 (not 2/7); tie c0/c1 → 0; tie c0/c4 → 0; → 6
  std::vector<uint8_t> codes(size_t(pq.code_bytes)), ref(size_t(pq.code_bytes));
  pq.encode(x.data(), 1, codes.data());
  pq_encode_ref(pq, x.data(), 1, ref.data());
  EXPECT_EQ(codes, ref);
  std::vector<uint32_t> idx(4);
  unpack_codes(codes.data(), 1, 4, 3, idx.data());
  EXPECT_EQ(idx, (std::vector<uint32_t>{1, 0, 0, 6}));
}

TEST(ProductQuantizer, EncodeNearTiesOnClusteredCodebook) {
  // Centroids 1e-6 apart around a large offset: the ||c||² − 2x·c form cannot separate them,
  // the re-ranking must still pick the oracle's code.
  const int hd = 16, d = 4, bits = 8;
  ProductQuantizer pq(hd, {d, bits});
  std::vector<float> cb = randn(size_t(256) * d, 77, 1e-3f);
  for (size_t i = 0; i < cb.size(); ++i) cb[i] += 100.0f;
  pq.set_codebook(cb);
  std::vector<float> x = randn(size_t(50) * hd, 78, 1e-3f);
  for (auto& v : x) v += 100.0f;
  std::vector<uint8_t> got(size_t(50 * pq.code_bytes)), ref(got.size());
  pq.encode(x.data(), 50, got.data());
  pq_encode_ref(pq, x.data(), 50, ref.data());
  EXPECT_EQ(got, ref);
}

TEST(ProductQuantizer, NonFiniteSubVectorsEncodeToZero) {
  ProductQuantizer pq(8, {4, 4});
  pq.set_random_codebook(1);
  std::vector<float> x = {1, 2, std::numeric_limits<float>::quiet_NaN(), 4, 0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<uint8_t> got(1), ref(1);
  pq.encode(x.data(), 1, got.data());
  pq_encode_ref(pq, x.data(), 1, ref.data());
  EXPECT_EQ(got, ref);
  EXPECT_EQ(got[0] & 0xF, 0);
}

TEST(ProductQuantizer, DecodeEqualsRefAndLutMatches) {
  const Combo combos[] = {{128, 4, 8}, {128, 4, 12}, {96, 3, 7}, {64, 16, 5}, {80, 5, 13}, {128, 2, 1}};
  for (const Combo& cb : combos) {
    const uint32_t seed = uint32_t(cb.head_dim * 7 + cb.sub_dim * 3 + cb.bits);
    SCOPED_TRACE("head_dim=" + std::to_string(cb.head_dim) + " sub_dim=" + std::to_string(cb.sub_dim) +
                 " bits=" + std::to_string(cb.bits) + " seed=" + std::to_string(seed));
    ProductQuantizer pq(cb.head_dim, {cb.sub_dim, cb.bits});
    pq.set_random_codebook(seed);
    const int64_t n = 13;
    std::vector<float> x = randn(size_t(n) * cb.head_dim, seed + 1);
    std::vector<uint8_t> codes(size_t(n * pq.code_bytes));
    pq.encode(x.data(), n, codes.data());
    std::vector<float> dec(x.size()), dec_ref(x.size(), -1.0f);
    pq.decode(codes.data(), n, dec.data());
    pq_decode_ref(pq, codes.data(), n, dec_ref.data());
    ASSERT_EQ(dec, dec_ref);
    // reconstruction is the nearest centroid: never farther than centroid 0
    for (int64_t v = 0; v < n; ++v)
      for (int m = 0; m < pq.n_sub; ++m) {
        double dq = 0, d0 = 0;
        for (int j = 0; j < cb.sub_dim; ++j) {
          const size_t i = size_t(v * cb.head_dim + m * cb.sub_dim + j);
          dq += (x[i] - dec[i]) * double(x[i] - dec[i]);
          d0 += (x[i] - pq.codebook[size_t(j)]) * double(x[i] - pq.codebook[size_t(j)]);
        }
        ASSERT_LE(dq, d0 * (1 + 1e-6) + 1e-12);
      }
    // LUT: equals the oracle within the bounded tier, and Σ_m lut[m][code_m] = q·decode(code)
    std::vector<float> q = randn(size_t(cb.head_dim), seed + 2);
    std::vector<float> lut(size_t(pq.n_sub) * pq.n_centroids), lut_ref(lut.size());
    pq.compute_lut(q.data(), lut.data());
    pq_compute_lut_ref(pq, q.data(), lut_ref.data());
    for (int m = 0; m < pq.n_sub; ++m)
      for (int c = 0; c < pq.n_centroids; ++c) {
        double cond = 0;
        for (int j = 0; j < cb.sub_dim; ++j)
          cond += std::fabs(double(q[size_t(m * cb.sub_dim + j)]) * pq.codebook[size_t(c) * cb.sub_dim + j]);
        const size_t i = size_t(m) * pq.n_centroids + c;
        ASSERT_NEAR(lut[i], lut_ref[i], 2.0 * cb.sub_dim * std::ldexp(1.0, -24) * cond + 1e-30) << m << "," << c;
      }
    for (int64_t v = 0; v < n; ++v) {
      double via_lut = 0, direct = 0, cond = 0;
      for (int m = 0; m < pq.n_sub; ++m)
        via_lut += lut[size_t(m) * pq.n_centroids + read_code(codes.data() + v * pq.code_bytes, m, cb.bits)];
      for (int i = 0; i < cb.head_dim; ++i) {
        direct += double(q[size_t(i)]) * dec[size_t(v * cb.head_dim + i)];
        cond += std::fabs(double(q[size_t(i)]) * dec[size_t(v * cb.head_dim + i)]);
      }
      EXPECT_NEAR(via_lut, direct, 2.0 * cb.sub_dim * std::ldexp(1.0, -24) * cond + 1e-12) << "vector " << v;
    }
  }
}

// Exact tier: every bits value 1..16, odd counts, byte-for-byte agreement with the oracle.
TEST(PackCodes, RoundTripEveryBitsAndOddCounts) {
  for (int bits = 1; bits <= 16; ++bits) {
    for (int64_t n_codes : {1, 2, 3, 5, 7, 8, 9, 16, 31, 32, 33, 63, 65, 128}) {
      const int64_t n_rows = 3;
      const uint32_t seed = uint32_t(bits * 1000 + n_codes);
      SCOPED_TRACE("bits=" + std::to_string(bits) + " n_codes=" + std::to_string(n_codes) + " seed=" +
                   std::to_string(seed));
      std::mt19937 g(seed);
      std::vector<uint32_t> idx(size_t(n_rows * n_codes));
      for (auto& v : idx) v = g() & ((1u << bits) - 1u);
      idx[0] = (1u << bits) - 1u;  // all ones at the row start
      idx.back() = (1u << bits) - 1u;
      const int64_t rb = packed_row_bytes(n_codes, bits);
      std::vector<uint8_t> packed(size_t(n_rows * rb), 0xEE), packed_ref(size_t(n_rows * rb), 0x77);
      pack_codes(idx.data(), n_rows, n_codes, bits, packed.data());
      pack_codes_ref(idx.data(), n_rows, n_codes, bits, packed_ref.data());
      ASSERT_EQ(packed, packed_ref);
      // padding bits of each row are zero
      const int pad = int(rb * 8 - n_codes * bits);
      for (int64_t r = 0; r < n_rows; ++r)
        if (pad > 0) ASSERT_EQ(packed[size_t(r * rb + rb - 1)] >> (8 - pad), 0) << "row " << r;
      std::vector<uint32_t> back(idx.size(), 0xFFFFFFFFu);
      unpack_codes(packed.data(), n_rows, n_codes, bits, back.data());
      ASSERT_EQ(back, idx);
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t i = 0; i < n_codes; ++i)
          ASSERT_EQ(read_code(packed.data() + r * rb, i, bits), idx[size_t(r * n_codes + i)]) << r << "," << i;
    }
  }
}

TEST(PackCodes, KnownLayoutAndErrors) {
  // 12-bit codes 0xABC, 0x123 → bytes BC 3A 12 (LSB first)
  const uint32_t idx[2] = {0xABC, 0x123};
  uint8_t out[3];
  pack_codes(idx, 1, 2, 12, out);
  EXPECT_EQ(out[0], 0xBC);
  EXPECT_EQ(out[1], 0x3A);
  EXPECT_EQ(out[2], 0x12);
  // 3-bit codes 5, 6, 7 → bits 101 110 111 → 0b11_110_101 = 0xF5, 0b0000000_1 = 0x01
  const uint32_t i3[3] = {5, 6, 7};
  uint8_t o3[2];
  pack_codes(i3, 1, 3, 3, o3);
  EXPECT_EQ(o3[0], 0xF5);
  EXPECT_EQ(o3[1], 0x01);
  const uint32_t too_big[2] = {3, 8};
  const std::string w = what_of([&] { pack_codes(too_big, 1, 2, 3, out); });
  EXPECT_NE(w.find("idx[0][1] = 8"), std::string::npos) << w;
  EXPECT_THROW(pack_codes_ref(too_big, 1, 2, 3, out), ValueError);
  EXPECT_THROW(pack_codes(idx, 1, 2, 0, out), ValueError);
  EXPECT_THROW(pack_codes(idx, 1, 2, 17, out), ValueError);
  uint32_t back[2];
  EXPECT_THROW(unpack_codes(out, 1, 2, 17, back), ValueError);
}
