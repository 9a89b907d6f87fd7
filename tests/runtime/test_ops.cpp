// The runtime's CPU ops against their scalar _ref oracles.
//
// Tolerance tier: bounded. matmul in f32 (FMA, any summation order) against a
// double-accumulated oracle: every element must satisfy the classical bound of an f32 dot
// product of length K, |ŷ − y| <= K·u·Σ|x_c·w_c| (u = 2⁻²⁴), which no wrong index or missed
// term can meet. Weights in f16/bf16 convert to f32 exactly, so the same bound holds; larger
// shapes also get an NMSE bound of 1e-11.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "veloxquant/error.h"
#include "veloxquant/runtime/ops.h"
#include "veloxquant/thread_pool.h"

using namespace veloxquant;
using namespace veloxquant::runtime;

namespace {

double nmse(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? num / den : num;
}

struct Weights {
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  WeightView view;
};

Weights make_weights(int64_t rows, int64_t cols, DType dt, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Weights w;
  w.f32.resize(size_t(rows * cols));
  for (auto& x : w.f32) x = nd(rng);
  if (dt == DType::F32) {
    w.view = {w.f32.data(), dt, rows, cols};
  } else {
    w.u16.resize(w.f32.size());
    for (size_t i = 0; i < w.f32.size(); ++i)
      w.u16[i] = dt == DType::F16 ? float_to_half(w.f32[i]) : float_to_bf16(w.f32[i]);
    w.view = {w.u16.data(), dt, rows, cols};
  }
  return w;
}

}  // namespace

TEST(RuntimeOps, MatmulMatchesRefAllDtypesAndShapes) {
  ThreadPool pool(3);
  const uint32_t seed = 1234;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t n : {1, 2, 3, 4, 5, 17}) {
      for (int64_t rows : {1, 3, 4, 5, 33, 67}) {
        for (int64_t cols : {1, 7, 8, 9, 64, 100}) {
          Weights w = make_weights(rows, cols, dt, rng);
          std::vector<float> x(size_t(n * cols)), bias(static_cast<size_t>(rows));
          for (auto& v : x) v = nd(rng);
          for (auto& v : bias) v = nd(rng);
          for (bool use_bias : {false, true}) {
            for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
              std::vector<float> y(size_t(n * rows), -7.0f), yr(size_t(n * rows));
              matmul(x.data(), n, w.view, use_bias ? bias.data() : nullptr, y.data(), p);
              matmul_ref(x.data(), n, w.view, use_bias ? bias.data() : nullptr, yr.data());
              // Elementwise bound of an f32 dot product of length K: K·u·Σ|x_c·w_rc| (+|b|), u = 2⁻²⁴.
              for (int64_t i = 0; i < n; ++i)
                for (int64_t r = 0; r < rows; ++r) {
                  double mag = use_bias ? std::fabs(bias[size_t(r)]) : 0.0;
                  for (int64_t c = 0; c < cols; ++c)
                    mag += std::fabs(double(x[size_t(i * cols + c)]) * w.view.at(r, c));
                  const double bound = double(cols + 1) * 5.97e-8 * mag + 1e-30;
                  const size_t k = size_t(i * rows + r);
                  ASSERT_LE(std::fabs(double(y[k]) - yr[k]), bound)
                      << "seed " << seed << " dtype " << dtype_name(dt) << " n=" << n << " rows=" << rows
                      << " cols=" << cols << " bias=" << use_bias << " pool=" << (p != nullptr) << " at (" << i
                      << ", " << r << ")";
                }
            }
          }
        }
      }
    }
  }
}

TEST(RuntimeOps, MatmulLargeThreadedMatchesRef) {
  // A shape where the threaded block split and the f16/bf16 conversion buffer both engage.
  ThreadPool pool(4);
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (DType dt : {DType::F32, DType::BF16}) {
    Weights w = make_weights(301, 257, dt, rng);
    std::vector<float> x(size_t(9 * 257));
    for (auto& v : x) v = nd(rng);
    std::vector<float> y(size_t(9 * 301)), yr(y.size());
    matmul(x.data(), 9, w.view, nullptr, y.data(), &pool);
    matmul_ref(x.data(), 9, w.view, nullptr, yr.data());
    EXPECT_LT(nmse(y, yr), 1e-11) << dtype_name(dt);
  }
}

TEST(RuntimeOps, MatmulRejectsNonFloatWeights) {
  std::vector<int32_t> w(4);
  std::vector<float> x(2), y(2);
  WeightView v{w.data(), DType::I32, 2, 2};
  EXPECT_THROW(matmul(x.data(), 1, v, nullptr, y.data(), nullptr), ShapeError);
}

TEST(RuntimeOps, RmsnormMatchesRef) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t dim : {1, 7, 8, 16, 33, 128}) {
    std::vector<float> x(size_t(5 * dim)), w(static_cast<size_t>(dim));
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = 1.0f + 0.1f * nd(rng);
    std::vector<float> y(x.size()), yr(x.size());
    rmsnorm(x.data(), 5, dim, w.data(), 1e-6f, y.data());
    rmsnorm_ref(x.data(), 5, dim, w.data(), 1e-6f, yr.data());
    EXPECT_LT(nmse(y, yr), 1e-12) << "dim " << dim;
    // In place gives the same.
    rmsnorm(x.data(), 5, dim, w.data(), 1e-6f, x.data());
    EXPECT_EQ(x, y) << "dim " << dim;
  }
}

TEST(RuntimeOps, RmsnormOfConstantRowIsWeight) {
  // x = c·1 → x / rms(x) = 1 (eps negligible), so y = weight.
  std::vector<float> x(8, 3.0f), w = {1, 2, 3, 4, 5, 6, 7, 8}, y(8);
  rmsnorm(x.data(), 1, 8, w.data(), 0.0f, y.data());
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(y[size_t(i)], w[size_t(i)]);
}

TEST(RuntimeOps, RopeMatchesRefAndRotatesPairs) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int head_dim = 16, half = 8, n_heads = 3;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) inv[size_t(i)] = float(1.0 / std::pow(10000.0, 2.0 * i / head_dim));
  for (int64_t start : {0, 1, 37, 5000}) {
    const int64_t T = 5;
    std::vector<float> x(size_t(T * n_heads * head_dim));
    for (auto& v : x) v = nd(rng);
    std::vector<float> a = x, b = x;
    const RopeTable t = make_rope_table(inv, 0.75f, start, T);
    rope_apply(a.data(), T, n_heads, head_dim, t);
    rope_apply_ref(b.data(), T, n_heads, head_dim, start, inv, 0.75f);
    // The table rounds the angle to f32 first (as the reference implementation does); the
    // oracle does not, so at position p the angles differ by up to p·ulp(inv_freq).
    const double tol = 1e-5 + double(start) * 6e-8 * 8;
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol) << "start " << start << " i " << i;
    // A rotation scaled by 0.75 scales each (i, i+half) pair's norm by 0.75.
    for (int64_t tok = 0; tok < T; ++tok)
      for (int h = 0; h < n_heads; ++h)
        for (int i = 0; i < half; ++i) {
          const size_t base = size_t((tok * n_heads + h) * head_dim);
          const double n0 = std::hypot(x[base + i], x[base + i + half]);
          const double n1 = std::hypot(a[base + i], a[base + i + half]);
          ASSERT_NEAR(n1, 0.75 * n0, 1e-5);
        }
  }
}

TEST(RuntimeOps, RopeAtPositionZeroIsIdentity) {
  std::vector<float> inv = {1.0f, 0.1f};
  std::vector<float> x = {1, 2, 3, 4}, y = x;
  rope_apply(y.data(), 1, 1, 4, make_rope_table(inv, 1.0f, 0, 1));
  EXPECT_EQ(x, y);
}

TEST(RuntimeOps, SiluMulMatchesRef) {
  std::vector<float> g = {-20, -3, -0.5f, 0, 0.5f, 3, 20}, u = {1, 2, 3, 4, 5, 6, 7};
  std::vector<float> y(g.size()), yr(g.size());
  silu_mul(g.data(), u.data(), int64_t(g.size()), y.data());
  silu_mul_ref(g.data(), u.data(), int64_t(g.size()), yr.data());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(y[i], yr[i], 1e-6 * std::max(1.0f, std::fabs(yr[i])));
  EXPECT_FLOAT_EQ(y[3], 0.0f);
}

TEST(RuntimeOps, EmbeddingLookupConvertsAndChecksIds) {
  std::vector<uint16_t> tab = {float_to_bf16(1.5f), float_to_bf16(-2.0f), float_to_bf16(0.25f), float_to_bf16(8.0f)};
  WeightView w{tab.data(), DType::BF16, 2, 2};
  const int32_t ids[3] = {1, 0, 1};
  std::vector<float> out(6);
  embedding_lookup(w, ids, 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{0.25f, 8.0f, 1.5f, -2.0f, 0.25f, 8.0f}));
  const int32_t bad[1] = {2};
  try {
    embedding_lookup(w, bad, 1, out.data());
    FAIL() << "no throw";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 2"), std::string::npos) << e.what();
  }
}

TEST(RuntimeOps, SoftmaxSumsToOne) {
  std::vector<float> x = {1000.0f, 999.0f, -5.0f};
  softmax_inplace(x.data(), 3);
  EXPECT_NEAR(x[0] + x[1] + x[2], 1.0, 1e-6);
  EXPECT_NEAR(x[0] / x[1], std::exp(1.0), 1e-4);
}
