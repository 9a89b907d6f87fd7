// Tests of compute_smooth_factors (src/core/smooth.cpp) against its oracle and against λ
// computed by hand. Tolerance tier: exact — both take the max |K| exactly in f32 and one
// pow in double rounded to f32, so the results must be bit-identical; the by-hand check
// recomputes that same expression.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "veloxquant/error.h"
#include "veloxquant/smooth.h"
#include "veloxquant/tensor.h"

using namespace veloxquant;

namespace {

std::vector<float> heavy_tailed(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::student_t_distribution<float> td(3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = td(g);
  return v;
}

// λ by hand from f32 data [T, H, D].
std::vector<float> by_hand(const std::vector<float>& x, int64_t T, int64_t H, int64_t D, float alpha, float eps) {
  std::vector<float> l(size_t(H * D));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t c = 0; c < D; ++c) {
      float m = 0;
      for (int64_t t = 0; t < T; ++t) m = std::max(m, std::fabs(x[size_t((t * H + h) * D + c)]));
      l[size_t(h * D + c)] = std::max(eps, float(std::pow(double(m), double(alpha))));
    }
  return l;
}

}  // namespace

TEST(Smooth, MatchesDefinitionForAlphaHalfAndOne) {
  const int64_t T = 37, H = 4, D = 64;
  const uint32_t seed = 11;
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::vector<float> x = heavy_tailed(size_t(T * H * D), seed);
  for (int64_t t = 0; t < T; ++t) x[size_t((t * H + 2) * D + 5)] = 0.0f;  // an all-zero channel → eps
  Tensor k = Tensor::from_floats(x, {T, H, D});
  for (float alpha : {0.5f, 1.0f}) {
    SmoothParams p;
    p.alpha = alpha;
    const std::vector<float> got = compute_smooth_factors(k, p);
    const std::vector<float> ref = compute_smooth_factors_ref(k, p);
    const std::vector<float> hand = by_hand(x, T, H, D, alpha, p.eps);
    ASSERT_EQ(got.size(), size_t(H * D));
    EXPECT_EQ(got, ref) << "alpha=" << alpha;
    EXPECT_EQ(got, hand) << "alpha=" << alpha;
    EXPECT_EQ(got[size_t(2 * D + 5)], p.eps);
  }
}

TEST(Smooth, EpsFloor) {
  std::vector<float> x(2 * 8, 1e-12f);
  x[3] = 4.0f;
  Tensor k = Tensor::from_floats(x, {2, 8});
  SmoothParams p;
  p.eps = 1e-3f;
  const std::vector<float> l = compute_smooth_factors(k, p);
  ASSERT_EQ(l.size(), 8u);
  EXPECT_EQ(l[3], 2.0f);
  for (int c = 0; c < 8; ++c)
    if (c != 3) EXPECT_EQ(l[size_t(c)], 1e-3f) << c;
}

TEST(Smooth, Rank2IsOneHead) {
  const int64_t T = 19, D = 96;
  std::vector<float> x = heavy_tailed(size_t(T * D), 3);
  const std::vector<float> l2 = compute_smooth_factors(Tensor::from_floats(x, {T, D}));
  const std::vector<float> l3 = compute_smooth_factors(Tensor::from_floats(x, {T, 1, D}));
  EXPECT_EQ(l2, l3);
  EXPECT_EQ(l2, compute_smooth_factors_ref(Tensor::from_floats(x, {T, D})));
  EXPECT_EQ(l2, by_hand(x, T, 1, D, 0.5f, 1e-5f));
}

TEST(Smooth, HalfAndBfloatInputsAndStridedViews) {
  const int64_t T = 23, H = 2, D = 32;
  const uint32_t seed = 5;
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::vector<float> x = heavy_tailed(size_t(T * H * D), seed);
  for (DType dt : {DType::F16, DType::BF16, DType::F32}) {
    Tensor k = Tensor::from_floats(x, {T, H, D}, dt);
    std::vector<float> rounded = k.to_vector_f32();  // what the tensor really holds
    const std::vector<float> got = compute_smooth_factors(k);
    EXPECT_EQ(got, compute_smooth_factors_ref(k)) << dtype_name(dt);
    EXPECT_EQ(got, by_hand(rounded, T, H, D, 0.5f, 1e-5f)) << dtype_name(dt);
  }
  // A strided view: the [T, H, D] keys stored inside a [H, T, D+3] buffer (heads outermost,
  // padded rows), viewed with strides (D+3, T·(D+3), 1) — and a channel-strided one.
  std::vector<float> big(size_t(H * T * (D + 3)), 1e30f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < D; ++c) big[size_t((h * T + t) * (D + 3) + c)] = x[size_t((t * H + h) * D + c)];
  TensorView v(big.data(), DType::F32, {T, H, D}, {D + 3, T * (D + 3), 1});
  const std::vector<float> want = by_hand(x, T, H, D, 0.5f, 1e-5f);
  EXPECT_EQ(compute_smooth_factors(v), want);
  EXPECT_EQ(compute_smooth_factors_ref(v), want);
  // channel stride 2 over an interleaved buffer
  std::vector<float> inter(size_t(T * H * D * 2), -1e30f);
  for (size_t i = 0; i < x.size(); ++i) inter[2 * i] = x[i];
  TensorView w(inter.data(), DType::F32, {T, H, D}, {H * D * 2, D * 2, 2});
  EXPECT_EQ(compute_smooth_factors(w), want);
}

TEST(Smooth, Errors) {
  std::vector<float> x(4 * 2 * 8, 1.0f);
  x[size_t((3 * 2 + 1) * 8 + 6)] = std::numeric_limits<float>::quiet_NaN();
  Tensor k = Tensor::from_floats(x, {4, 2, 8});
  for (int which = 0; which < 2; ++which) {
    try {
      if (which == 0) compute_smooth_factors(k);
      else compute_smooth_factors_ref(k);
      FAIL() << "no throw for nan";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("key_samples[3][1][6] is nan"), std::string::npos) << e.what();
    }
  }
  x[size_t((3 * 2 + 1) * 8 + 6)] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(compute_smooth_factors(Tensor::from_floats(x, {4, 2, 8})), ValueError);
  EXPECT_THROW(compute_smooth_factors(Tensor::from_floats(x, {4, 2, 8}, DType::F16)), ValueError);

  std::vector<float> ok(16, 1.0f);
  EXPECT_THROW(compute_smooth_factors(Tensor::from_floats(ok, {16})), ShapeError);
  EXPECT_THROW(compute_smooth_factors(Tensor::from_floats(ok, {1, 2, 2, 4})), ShapeError);
  EXPECT_THROW(compute_smooth_factors_ref(Tensor::from_floats(ok, {16})), ShapeError);
  TensorView zero_tokens(ok.data(), DType::F32, {0, 2, 8});
  EXPECT_THROW(compute_smooth_factors(zero_tokens), ValueError);
  EXPECT_THROW(compute_smooth_factors_ref(zero_tokens), ValueError);
  std::vector<int32_t> ints(16, 1);
  EXPECT_THROW(compute_smooth_factors(TensorView(ints.data(), DType::I32, {2, 8})), ShapeError);
  SmoothParams bad;
  bad.alpha = 0.0f;
  EXPECT_THROW(compute_smooth_factors(Tensor::from_floats(ok, {2, 8}), bad), ValueError);
  bad.alpha = 0.5f;
  bad.eps = 0.0f;
  EXPECT_THROW(compute_smooth_factors(Tensor::from_floats(ok, {2, 8}), bad), ValueError);
}
