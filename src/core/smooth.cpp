// src/core/smooth.cpp — smooth factors λ from calibration keys, and the KeyTransform.
//
// compute_smooth_factors: λ[h][c] = max(eps, (max_t |K[t][h][c]|)^alpha) for keys shaped
// [n_tokens, n_kv_heads, head_dim] (or [n_tokens, head_dim] = one kv head), any float dtype and
// any strides. One pass over the tokens keeps a running max per (h, c) in f32 (max is exact,
// so the result is bit-identical to compute_smooth_factors_ref); contiguous-channel rows of f32
// take a tight loop. The power is taken in double and rounded once, as the oracle does.
//
// KeyTransform: keys k̃ = (k ⊙ 1/λ[h])·H, queries q̃ = (q ⊙ λ[h])·H with H the orthonormal
// (block-diagonal) Walsh–Hadamard matrix, so q̃·k̃ᵀ = q·kᵀ. inverse_keys undoes forward_keys
// (H = Hᵀ = H⁻¹).
#include "veloxquant/smooth.h"

#include <cmath>
#include <cstring>

#include "veloxquant/error.h"
#include "veloxquant/hadamard.h"
#include "core/smooth_internal.h"

namespace veloxquant {

namespace detail {

SmoothShape smooth_check_inputs(const TensorView& k, const SmoothParams& p) {
  VQ_CHECK_VALUE(std::isfinite(p.alpha) && p.alpha > 0.0f,
                 "smooth factors: alpha must be finite and > 0, got " << p.alpha);
  VQ_CHECK_VALUE(std::isfinite(p.eps) && p.eps > 0.0f,
                 "smooth factors: eps must be finite and > 0, got " << p.eps);
  VQ_CHECK_SHAPE(k.ndim == 2 || k.ndim == 3,
                 "key_samples: expected [n_tokens, n_kv_heads, head_dim] or [n_tokens, head_dim], got "
                     << k.shape_string());
  VQ_CHECK_SHAPE(dtype_is_float(k.dtype),
                 "key_samples: expected a float dtype (f32, f16, bf16), got " << dtype_name(k.dtype));
  VQ_CHECK_SHAPE(k.device.is_cpu(), "key_samples: expected a CPU tensor, got " << device_name(k.device));
  SmoothShape s{};
  s.n_tokens = k.shape[0];
  if (k.ndim == 3) {
    s.n_kv_heads = k.shape[1];
    s.head_dim = k.shape[2];
    s.st = k.strides[0];
    s.sh = k.strides[1];
    s.sc = k.strides[2];
  } else {
    s.n_kv_heads = 1;
    s.head_dim = k.shape[1];
    s.st = k.strides[0];
    s.sh = 0;
    s.sc = k.strides[1];
  }
  VQ_CHECK_VALUE(s.n_tokens > 0, "key_samples: n_tokens must be > 0, got " << k.shape_string());
  VQ_CHECK_SHAPE(s.n_kv_heads > 0 && s.head_dim > 0,
                 "key_samples: n_kv_heads and head_dim must be > 0, got " << k.shape_string());
  return s;
}

float smooth_lambda_from_max(float max_abs, const SmoothParams& p) {
  const double l = std::pow(double(max_abs), double(p.alpha));
  const float lf = float(l);
  return lf > p.eps ? lf : p.eps;
}

[[noreturn]] void smooth_throw_nonfinite(const SmoothShape& s, int64_t t, int64_t h, int64_t c, float v) {
  if (s.sh == 0)
    VQ_THROW(ValueError, "key_samples[" << t << "][" << c << "] is " << (std::isnan(v) ? "nan" : "inf")
                                        << ": calibration keys must be finite");
  VQ_THROW(ValueError, "key_samples[" << t << "][" << h << "][" << c << "] is "
                                      << (std::isnan(v) ? "nan" : "inf") << ": calibration keys must be finite");
}

}  // namespace detail

namespace {

inline float load_as_f32(const void* base, DType t, int64_t off) {
  switch (t) {
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(base)[off]);
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[off]);
    default: return static_cast<const float*>(base)[off];
  }
}

}  // namespace

std::vector<float> compute_smooth_factors(const TensorView& key_samples, const SmoothParams& params) {
  const detail::SmoothShape s = detail::smooth_check_inputs(key_samples, params);
  const int64_t HD = s.n_kv_heads * s.head_dim;
  std::vector<float> mx(size_t(HD), 0.0f);  // [n_kv_heads, head_dim] running max |K|
  std::vector<float> row(size_t(s.head_dim));
  const DType dt = key_samples.dtype;
  const void* base = key_samples.data;
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    for (int64_t h = 0; h < s.n_kv_heads; ++h) {
      const int64_t off = t * s.st + h * s.sh;
      const float* src;
      if (dt == DType::F32 && s.sc == 1) {
        src = static_cast<const float*>(base) + off;
      } else {
        for (int64_t c = 0; c < s.head_dim; ++c) row[size_t(c)] = load_as_f32(base, dt, off + c * s.sc);
        src = row.data();
      }
      float* m = mx.data() + h * s.head_dim;
      bool finite = true;
      for (int64_t c = 0; c < s.head_dim; ++c) {
        const float a = std::fabs(src[c]);
        finite &= (a <= 3.402823466e38f);  // false for inf and nan
        m[c] = a > m[c] ? a : m[c];
      }
      if (!finite) {
        for (int64_t c = 0; c < s.head_dim; ++c)
          if (!std::isfinite(src[c])) detail::smooth_throw_nonfinite(s, t, h, c, src[c]);
      }
    }
  }
  for (int64_t i = 0; i < HD; ++i) mx[size_t(i)] = detail::smooth_lambda_from_max(mx[size_t(i)], params);
  return mx;
}

// ---- KeyTransform ------------------------------------------------------------------------

KeyTransform::KeyTransform(int n_kv_heads_, int head_dim_, std::vector<float> lambda_, bool use_hadamard_)
    : n_kv_heads(n_kv_heads_), head_dim(head_dim_), use_hadamard(use_hadamard_) {
  VQ_CHECK_VALUE(n_kv_heads_ >= 1, "KeyTransform: n_kv_heads must be >= 1, got " << n_kv_heads_);
  VQ_CHECK_VALUE(head_dim_ >= 1, "KeyTransform: head_dim must be >= 1, got " << head_dim_);
  const size_t want = size_t(n_kv_heads_) * size_t(head_dim_);
  VQ_CHECK_SHAPE(lambda_.empty() || lambda_.size() == want,
                 "KeyTransform: lambda: expected [n_kv_heads=" << n_kv_heads_ << ", head_dim=" << head_dim_
                                                              << "] = " << want << " values, got "
                                                              << lambda_.size());
  for (size_t i = 0; i < lambda_.size(); ++i)
    VQ_CHECK_VALUE(std::isfinite(lambda_[i]) && lambda_[i] > 0.0f,
                   "KeyTransform: lambda[" << i / head_dim_ << "][" << i % head_dim_
                                           << "] must be finite and > 0, got " << lambda_[i]);
  use_smooth = !lambda_.empty();
  inv_lambda.resize(lambda_.size());
  for (size_t i = 0; i < lambda_.size(); ++i) inv_lambda[i] = 1.0f / lambda_[i];
  lambda = std::move(lambda_);
}

namespace {

void check_call(const KeyTransform& t, const float* x, int64_t n, int kv_head, const char* what) {
  VQ_CHECK_VALUE(t.head_dim >= 1 && t.n_kv_heads >= 1,
                 "KeyTransform::" << what << ": transform is not initialised (n_kv_heads=" << t.n_kv_heads
                                  << ", head_dim=" << t.head_dim << ")");
  VQ_CHECK_VALUE(kv_head >= 0 && kv_head < t.n_kv_heads,
                 "KeyTransform::" << what << ": kv_head " << kv_head << " out of range [0, " << t.n_kv_heads << ")");
  VQ_CHECK_VALUE(n >= 0, "KeyTransform::" << what << ": n must be >= 0, got " << n);
  VQ_CHECK_VALUE(n == 0 || x != nullptr, "KeyTransform::" << what << ": null data");
  const size_t want = size_t(t.n_kv_heads) * size_t(t.head_dim);
  VQ_CHECK_SHAPE(t.lambda.empty() || (t.lambda.size() == want && t.inv_lambda.size() == want),
                 "KeyTransform::" << what << ": lambda has " << t.lambda.size() << " values and inv_lambda "
                                  << t.inv_lambda.size() << ", expected " << want);
}

// x[i][c] *= s[c] for n rows of head_dim.
void scale_rows(float* x, int64_t n, int head_dim, const float* s) {
  for (int64_t i = 0; i < n; ++i) {
    float* __restrict r = x + i * head_dim;
    for (int c = 0; c < head_dim; ++c) r[c] *= s[c];
  }
}

}  // namespace

void KeyTransform::forward_keys(float* k, int64_t n, int kv_head) const {
  check_call(*this, k, n, kv_head, "forward_keys");
  if (use_smooth && !inv_lambda.empty()) scale_rows(k, n, head_dim, inv_lambda.data() + size_t(kv_head) * head_dim);
  if (use_hadamard) hadamard_transform(k, n, head_dim);
}

void KeyTransform::inverse_keys(float* k, int64_t n, int kv_head) const {
  check_call(*this, k, n, kv_head, "inverse_keys");
  if (use_hadamard) hadamard_transform(k, n, head_dim);
  if (use_smooth && !lambda.empty()) scale_rows(k, n, head_dim, lambda.data() + size_t(kv_head) * head_dim);
}

void KeyTransform::forward_queries(float* q, int64_t n, int kv_head) const {
  check_call(*this, q, n, kv_head, "forward_queries");
  if (use_smooth && !lambda.empty()) scale_rows(q, n, head_dim, lambda.data() + size_t(kv_head) * head_dim);
  if (use_hadamard) hadamard_transform(q, n, head_dim);
}

}  // namespace veloxquant
