// Tests of the Walsh–Hadamard rotation (src/cpu/hadamard.cpp) against the explicit matrix
// (src/ref/hadamard_ref.cpp), and of the q·kᵀ invariance of KeyTransform.
//
// Tolerance tier: bounded. The FWHT does log2(B) f32 add/sub stages and one scale; the oracle
// accumulates the explicit product in double. A stage adds at most u·|partial sums| of error
// and the transform is orthonormal, so |fwht − exact| ≤ (log2 B + 2)·u·sqrt(B)·||x||∞·...; we
// check max |diff| ≤ 4·(log2(B)+2)·2^-24·||x||₂, twice a generous naive-f32 bound.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "veloxquant/error.h"
#include "veloxquant/hadamard.h"
#include "veloxquant/smooth.h"
#include "common/random.h"

using namespace veloxquant;

namespace {

const int kHeadDims[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 80, 96, 112, 160, 192, 24, 40, 6, 3};

using vqtest::randn;

double l2(const float* x, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return std::sqrt(s);
}

}  // namespace

TEST(Hadamard, BlockSize) {
  EXPECT_EQ(hadamard_block_size(128), 128);
  EXPECT_EQ(hadamard_block_size(512), 512);
  EXPECT_EQ(hadamard_block_size(80), 16);
  EXPECT_EQ(hadamard_block_size(96), 32);
  EXPECT_EQ(hadamard_block_size(112), 16);
  EXPECT_EQ(hadamard_block_size(160), 32);
  EXPECT_EQ(hadamard_block_size(192), 64);
  EXPECT_EQ(hadamard_block_size(24), 8);
  EXPECT_EQ(hadamard_block_size(1), 1);
  EXPECT_EQ(hadamard_block_size(3), 1);
  EXPECT_THROW(hadamard_block_size(0), ValueError);
  EXPECT_THROW(hadamard_block_size(-4), ValueError);
}

TEST(Hadamard, MatrixIsOrthonormalAndSymmetric) {
  for (int hd : kHeadDims) {
    if (hd > 512) continue;
    SCOPED_TRACE("head_dim=" + std::to_string(hd));
    const std::vector<float> H = hadamard_matrix(hd);
    ASSERT_EQ(H.size(), size_t(hd) * hd);
    double worst = 0;
    for (int i = 0; i < hd; ++i) {
      for (int j = 0; j < hd; ++j) {
        ASSERT_EQ(H[size_t(i) * hd + j], H[size_t(j) * hd + i]);
        double s = 0;
        for (int k = 0; k < hd; ++k) s += double(H[size_t(i) * hd + k]) * H[size_t(j) * hd + k];
        worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
      }
    }
    // entries are ±float(1/sqrt(B)): each carries ≤ u relative error, so H·Hᵀ is I within ~2u
    EXPECT_LE(worst, 4.0 * std::ldexp(1.0, -24)) << "H·Hᵀ differs from I";
  }
}

TEST(Hadamard, FastEqualsExplicitMatrix) {
  for (int hd : kHeadDims) {
    const uint32_t seed = 1000u + uint32_t(hd);
    SCOPED_TRACE("head_dim=" + std::to_string(hd) + " seed=" + std::to_string(seed));
    const int n = 5;
    std::vector<float> x = randn(size_t(n) * hd, seed, 3.0f);
    x[0] = 1e3f;  // an outlier channel, as real keys have
    std::vector<float> fast = x, ref = x;
    hadamard_transform(fast.data(), n, hd);
    hadamard_transform_ref(ref.data(), n, hd);
    const int B = hadamard_block_size(hd);
    const double tol_per = 4.0 * (std::log2(double(B)) + 2.0) * std::ldexp(1.0, -24);
    for (int v = 0; v < n; ++v) {
      const double tol = tol_per * l2(x.data() + size_t(v) * hd, hd) + 1e-30;
      for (int i = 0; i < hd; ++i)
        ASSERT_NEAR(fast[size_t(v) * hd + i], ref[size_t(v) * hd + i], tol) << "vector " << v << " element " << i;
    }
  }
}

TEST(Hadamard, IsItsOwnInverseAndKeepsNorms) {
  for (int hd : kHeadDims) {
    SCOPED_TRACE("head_dim=" + std::to_string(hd));
    std::vector<float> x = randn(size_t(3) * hd, 7u + uint32_t(hd));
    std::vector<float> y = x;
    hadamard_transform(y.data(), 3, hd);
    for (int v = 0; v < 3; ++v)
      EXPECT_NEAR(l2(y.data() + size_t(v) * hd, hd), l2(x.data() + size_t(v) * hd, hd),
                  1e-5 * l2(x.data() + size_t(v) * hd, hd));
    hadamard_transform(y.data(), 3, hd);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-5 * (1.0 + std::fabs(x[i])));
  }
}

TEST(Hadamard, ZeroVectorsIsANoOp) {
  float x[4] = {1, 2, 3, 4};
  hadamard_transform(x, 0, 4);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_THROW(hadamard_transform(x, 1, 0), ValueError);
}

// (q·diag(λ)·H)·(k·diag(λ)⁻¹·H)ᵀ = q·kᵀ for random λ, q, K, several heads.
// Tolerance tier: bounded. Each transformed vector is within (log2 B + 2)·u of its norm
// (orthonormal FWHT in f32, plus the scaling), so the transformed dot product is within
// ~2·(log2 B + 2)·u·||q⊙λ||·||k⊙1/λ|| of q·kᵀ; we allow twice (log2 B + 4)·u of that product.
TEST(KeyTransform, PreservesQueryKeyDotProducts) {
  for (int hd : {64, 128, 80, 96, 256, 40}) {
    const int n_kv_heads = 3, n_keys = 7;
    const uint32_t seed = 4242u + uint32_t(hd);
    SCOPED_TRACE("head_dim=" + std::to_string(hd) + " seed=" + std::to_string(seed));
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> ul(0.05f, 8.0f);
    std::vector<float> lambda(size_t(n_kv_heads) * hd);
    for (auto& l : lambda) l = ul(g);
    for (bool had : {true, false}) {
      KeyTransform kt(n_kv_heads, hd, lambda, had);
      for (int h = 0; h < n_kv_heads; ++h) {
        std::vector<float> q = randn(size_t(hd), seed + 10u * h + 1u);
        std::vector<float> K = randn(size_t(n_keys) * hd, seed + 10u * h + 2u, 2.0f);
        std::vector<float> qt = q, Kt = K;
        kt.forward_queries(qt.data(), 1, h);
        kt.forward_keys(Kt.data(), n_keys, h);
        for (int t = 0; t < n_keys; ++t) {
          double exact = 0, nq = 0, nk = 0, got = 0;
          for (int i = 0; i < hd; ++i) {
            const double l = lambda[size_t(h) * hd + i];
            exact += double(q[size_t(i)]) * K[size_t(t) * hd + i];
            nq += (q[size_t(i)] * l) * (q[size_t(i)] * l);
            nk += (K[size_t(t) * hd + i] / l) * (K[size_t(t) * hd + i] / l);
            got += double(qt[size_t(i)]) * Kt[size_t(t) * hd + i];
          }
          EXPECT_NEAR(got, exact, 4.0 * (std::log2(hd) + 4.0) * std::ldexp(1.0, -24) * std::sqrt(nq * nk))
              << "head " << h << " key " << t << " hadamard=" << had;
        }
      }
    }
  }
}

TEST(KeyTransform, InverseUndoesForward) {
  const int hd = 96, H = 2, n = 9;
  std::vector<float> lambda = randn(size_t(H) * hd, 5u);
  for (auto& l : lambda) l = 0.1f + std::fabs(l);
  KeyTransform kt(H, hd, lambda);
  for (int h = 0; h < H; ++h) {
    std::vector<float> k = randn(size_t(n) * hd, 99u + h, 4.0f);
    std::vector<float> y = k;
    kt.forward_keys(y.data(), n, h);
    bool changed = false;
    for (size_t i = 0; i < k.size(); ++i) changed |= (y[i] != k[i]);
    EXPECT_TRUE(changed);
    kt.inverse_keys(y.data(), n, h);
    for (size_t i = 0; i < k.size(); ++i) ASSERT_NEAR(y[i], k[i], 2e-5 * (1.0 + std::fabs(k[i]))) << i;
  }
}

TEST(KeyTransform, EmptyLambdaIsPureRotationAndNoHadamardIsIdentity) {
  const int hd = 128;
  std::vector<float> k = randn(size_t(2) * hd, 3u);
  KeyTransform rot(1, hd, {});
  EXPECT_FALSE(rot.use_smooth);
  std::vector<float> a = k, b = k;
  rot.forward_keys(a.data(), 2, 0);
  hadamard_transform(b.data(), 2, hd);
  EXPECT_EQ(a, b);
  KeyTransform ident(1, hd, {}, /*use_hadamard=*/false);
  std::vector<float> c = k;
  ident.forward_keys(c.data(), 2, 0);
  ident.forward_queries(c.data(), 2, 0);
  EXPECT_EQ(c, k);
}

TEST(KeyTransform, ValidatesArguments) {
  EXPECT_THROW(KeyTransform(2, 64, std::vector<float>(100, 1.0f)), ShapeError);
  EXPECT_THROW(KeyTransform(0, 64, {}), ValueError);
  EXPECT_THROW(KeyTransform(1, 0, {}), ValueError);
  std::vector<float> bad(64, 1.0f);
  bad[5] = 0.0f;
  try {
    KeyTransform(1, 64, bad);
    FAIL() << "no throw";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("lambda[0][5]"), std::string::npos) << e.what();
  }
  KeyTransform kt(2, 64, {});
  std::vector<float> x(64);
  EXPECT_THROW(kt.forward_keys(x.data(), 1, 2), ValueError);
  EXPECT_THROW(kt.forward_queries(x.data(), 1, -1), ValueError);
  KeyTransform empty;
  EXPECT_THROW(empty.forward_keys(x.data(), 1, 0), ValueError);
}
