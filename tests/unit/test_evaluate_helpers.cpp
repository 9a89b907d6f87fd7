// The small public helpers the evaluation, calibration and synthetic-data code is built on:
// attention_relative_error, the calibration-to-cache layout views, RoPE, pq_relative_error,
// the artifact's mean errors and safetensors dtype sizes. Each against a hand-computed value or
// an independent double-precision reference. Tolerance tier: exact where the arithmetic is
// (hand values, layouts), 1e-5 relative where float rounding enters (RoPE, rotations; 1e-4 for
// dot products of RoPE-d vectors far apart in position).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "veloxquant/artifact.h"
#include "veloxquant/calibrate.h"
#include "veloxquant/error.h"
#include "veloxquant/evaluate.h"
#include "veloxquant/pq.h"
#include "veloxquant/safetensors.h"
#include "veloxquant/smooth.h"
#include "veloxquant/synthetic.h"
#include "veloxquant/tensor.h"
#include "common/random.h"

using namespace veloxquant;

namespace {

using vqtest::randn;

// ---- attention_relative_error -------------------------------------------------------------

TEST(AttentionRelativeError, MeanOverRowsSkipsZeroReferenceRows) {
  // row 0: ||(0,0,5)|| / ||(3,4,0)|| = 1; row 1: reference all zeros, skipped whatever out holds;
  // row 2: ||(-0.5,0,0)|| / ||(1,0,0)|| = 0.5. Mean over the two counted rows: 0.75.
  Tensor ref = Tensor::from_floats({3, 4, 0, 0, 0, 0, 1, 0, 0}, {3, 3});
  Tensor out = Tensor::from_floats({3, 4, 5, 7, 7, 7, 0.5f, 0, 0}, {3, 3});
  EXPECT_DOUBLE_EQ(attention_relative_error(out, ref), 0.75);
  // the same values in f16 and bf16 (all exactly representable) give the same answer
  EXPECT_DOUBLE_EQ(attention_relative_error(Tensor::copy_of(out, DType::F16), ref), 0.75);
  EXPECT_DOUBLE_EQ(attention_relative_error(out, Tensor::copy_of(ref, DType::BF16)), 0.75);
  EXPECT_DOUBLE_EQ(attention_relative_error(ref, ref), 0.0);
  // every reference row zero: nothing to average
  EXPECT_DOUBLE_EQ(attention_relative_error(out, Tensor::zeros({3, 3}, DType::F32)), 0.0);
}

TEST(AttentionRelativeError, StridedViewsEqualTheirContiguousCopies) {
  // [2 rows, 4] read through a transposed layout: element (i, c) at i + 2c
  const std::vector<float> r = randn(8, 1), o = randn(8, 2);
  std::vector<float> rt(8), ot(8);
  for (int i = 0; i < 2; ++i)
    for (int c = 0; c < 4; ++c) rt[size_t(i + 2 * c)] = r[size_t(i * 4 + c)], ot[size_t(i + 2 * c)] = o[size_t(i * 4 + c)];
  const TensorView rv(rt.data(), DType::F32, {2, 4}, {1, 2}), ov(ot.data(), DType::F32, {2, 4}, {1, 2});
  double want = 0;
  for (int i = 0; i < 2; ++i) {
    double num = 0, den = 0;
    for (int c = 0; c < 4; ++c) {
      const double a = o[size_t(i * 4 + c)], b = r[size_t(i * 4 + c)];
      num += (a - b) * (a - b), den += b * b;
    }
    want += std::sqrt(num / den) / 2;
  }
  EXPECT_NEAR(attention_relative_error(ov, rv), want, 1e-12);
  EXPECT_NEAR(attention_relative_error(Tensor::copy_of(ov), Tensor::copy_of(rv)), want, 1e-12);
}

TEST(AttentionRelativeError, MismatchedShapesNameBoth) {
  Tensor a = Tensor::zeros({2, 3}, DType::F32), b = Tensor::zeros({3, 2}, DType::F32);
  try {
    attention_relative_error(a, b);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 2]"), std::string::npos) << e.what();
  }
}

// ---- calibration layout → cache layout ----------------------------------------------------

TEST(CacheLayoutViews, KvAndQueriesMapEveryElementWithoutCopying) {
  const int n = 5, H = 3, D = 4;
  std::vector<float> x(size_t(n * H * D));
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) x[size_t((t * H + h) * D + d)] = float(100 * t + 10 * h + d);
  Tensor kv = Tensor::from_floats(x, {n, H, D});
  for (const TensorView& v : {kv_as_cache_layout(kv), queries_as_cache_layout(kv)}) {
    ASSERT_EQ(v.sizes(), (Shape{1, H, n, D}));
    EXPECT_EQ(v.data, kv.data());  // a view, not a copy
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < n; ++t)
        for (int d = 0; d < D; ++d)
          EXPECT_EQ(v.ptr<float>()[h * v.stride(1) + t * v.stride(2) + d * v.stride(3)], float(100 * t + 10 * h + d));
  }
  Tensor flat = Tensor::zeros({n * H, D}, DType::F32);
  EXPECT_THROW(kv_as_cache_layout(flat), ShapeError);
  EXPECT_THROW(queries_as_cache_layout(flat), ShapeError);
}

// ---- RoPE ---------------------------------------------------------------------------------

TEST(Rope, InverseFrequenciesAreThetaPowers) {
  const std::vector<float> f = rope_inv_freq(128, 10000.0f);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_FLOAT_EQ(f[32], 0.01f);  // 10000^(-64/128)
  for (int i = 0; i < 64; ++i) EXPECT_FLOAT_EQ(f[size_t(i)], float(std::pow(10000.0, -2.0 * i / 128)));
}

TEST(Rope, RotatesHalvesAsTheDoubleReferenceAndKeepsRelativePositions) {
  const int D = 64, n = 3;
  const std::vector<float> inv = rope_inv_freq(D, 500000.0f);
  const std::vector<float> x = randn(size_t(n * D), 7, 2.0f);
  for (int64_t pos : {int64_t(0), int64_t(7), int64_t(131071)}) {
    std::vector<float> y = x;
    apply_rope(y.data(), n, D, pos, inv);
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < D / 2; ++i) {
        const double a = double(pos) * inv[size_t(i)], x0 = x[size_t(r * D + i)], x1 = x[size_t(r * D + i + D / 2)];
        const double tol = 1e-5 * (std::fabs(x0) + std::fabs(x1)) + 1e-7;
        EXPECT_NEAR(y[size_t(r * D + i)], x0 * std::cos(a) - x1 * std::sin(a), tol) << "pos " << pos << " i " << i;
        EXPECT_NEAR(y[size_t(r * D + i + D / 2)], x1 * std::cos(a) + x0 * std::sin(a), tol) << "pos " << pos << " i " << i;
      }
    if (pos == 0) EXPECT_EQ(y, x);  // cos 0 = 1, sin 0 = 0 exactly
  }
  // q·k after RoPE depends on the positions' difference only
  const std::vector<float> q0 = randn(D, 8), k0 = randn(D, 9);
  auto dot_at = [&](int64_t pq, int64_t pk) {
    std::vector<float> q = q0, k = k0;
    apply_rope(q.data(), 1, D, pq, inv);
    apply_rope(k.data(), 1, D, pk, inv);
    double s = 0;
    for (int i = 0; i < D; ++i) s += double(q[size_t(i)]) * k[size_t(i)];
    return s;
  };
  const double base = dot_at(20, 3);
  EXPECT_NEAR(dot_at(1020, 1003), base, 1e-4 * std::fabs(base) + 1e-4);
  EXPECT_NEAR(dot_at(17, 0), base, 1e-4 * std::fabs(base) + 1e-4);
}

// ---- pq_relative_error --------------------------------------------------------------------

TEST(PqRelativeError, ExactCodebookGivesZeroAndZeroCodebookGivesOne) {
  const int D = 8, H = 2, n_tokens = 6, n = n_tokens * H;
  ProductQuantizer pq(D, PQSpec{2, 3});  // 8 centroids of 2 dims
  pq.set_random_codebook(3);
  // rows made of codebook entries: reconstructed exactly
  std::vector<float> x(size_t(n * D));
  std::mt19937 g(5);
  for (int r = 0; r < n; ++r)
    for (int s = 0; s < D / 2; ++s) {
      const int c = int(g() % 8);
      x[size_t(r * D + 2 * s)] = pq.codebook[size_t(2 * c)];
      x[size_t(r * D + 2 * s + 1)] = pq.codebook[size_t(2 * c + 1)];
    }
  EXPECT_DOUBLE_EQ(pq_relative_error(pq, x.data(), n, H, nullptr), 0.0);
  // every centroid at the origin: x̂ = 0, so Σ||x − x̂||² / Σ||x||² = 1, with or without the
  // key transform (its inverse maps 0 to 0)
  ProductQuantizer zero(D, PQSpec{2, 3}, std::vector<float>(16, 0.0f));
  const std::vector<float> lambda = [&] {
    std::vector<float> l = randn(size_t(H * D), 11);
    for (float& v : l) v = 0.5f + std::fabs(v);
    return l;
  }();
  const KeyTransform tf(H, D, lambda, true);
  EXPECT_DOUBLE_EQ(pq_relative_error(zero, x.data(), n, H, nullptr), 1.0);
  EXPECT_NEAR(pq_relative_error(zero, x.data(), n, H, &tf), 1.0, 1e-12);
  try {
    pq_relative_error(pq, x.data(), n - 1, H, nullptr);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("n_kv_heads = 2"), std::string::npos) << e.what();
  }
}

TEST(PqRelativeError, MeasuredInTheOriginalSpaceARotationDoesNotChangeIt) {
  // With λ = 1 the transform is the orthonormal Hadamard rotation: quantizing x through it, as
  // pq_relative_error does, has the same error as quantizing the rotated rows directly.
  const int D = 16, H = 2, n = 64 * H;
  ProductQuantizer pq(D, PQSpec{4, 4});
  pq.set_random_codebook(4);
  const std::vector<float> x = randn(size_t(n * D), 12);
  const KeyTransform rot(H, D, {}, true);
  std::vector<float> y = x;  // rows are [token][kv head]: row r belongs to head r % H
  for (int r = 0; r < n; ++r) rot.forward_keys(y.data() + size_t(r) * D, 1, r % H);
  const double through = pq_relative_error(pq, x.data(), n, H, &rot);
  const double direct = pq_relative_error(pq, y.data(), n, H, nullptr);
  EXPECT_GT(direct, 0.01);  // a 16-centroid codebook is far from exact
  EXPECT_NEAR(through, direct, 1e-5 * direct);
}

// ---- artifact means, safetensors dtype sizes ----------------------------------------------

TEST(ArtifactErrors, MeansOverLayersOrMinusOneWhenAnyIsUnknown) {
  Artifact a;
  EXPECT_EQ(a.mean_key_error(), -1.0);  // no layers
  a.layers.resize(2);
  a.layers[0].key_error = 0.1, a.layers[1].key_error = 0.3;
  a.layers[0].value_error = 0.2, a.layers[1].value_error = -1;
  EXPECT_DOUBLE_EQ(a.mean_key_error(), 0.2);
  EXPECT_EQ(a.mean_value_error(), -1.0);
  a.layers[1].value_error = 0.4;
  EXPECT_DOUBLE_EQ(a.mean_value_error(), 0.3);
}

TEST(SafetensorsDtypes, SizesOfKnownNamesAndZeroForUnknown) {
  EXPECT_EQ(safetensors_dtype_size("F32"), 4);
  EXPECT_EQ(safetensors_dtype_size("F16"), 2);
  EXPECT_EQ(safetensors_dtype_size("BF16"), 2);
  EXPECT_EQ(safetensors_dtype_size("U8"), 1);
  EXPECT_EQ(safetensors_dtype_size("BOOL"), 1);
  EXPECT_EQ(safetensors_dtype_size("F64"), 8);
  EXPECT_EQ(safetensors_dtype_size("f32"), 0);  // names are case-sensitive
  EXPECT_EQ(safetensors_dtype_size("Q4_0"), 0);
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    EXPECT_EQ(safetensors_dtype_size(safetensors_dtype_name(t)), dtype_size(t)) << safetensors_dtype_name(t);
  EXPECT_FALSE(SafetensorsFile().is_open());
}

}  // namespace
