// tests/ops/attention_test_util.h — helpers for the attention and cache tests: random tensors
// of any float dtype in contiguous or permuted (non-contiguous) layouts, NMSE, and the
// tolerance tiers used beside each check.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "veloxquant/dtype.h"
#include "veloxquant/tensor.h"

namespace vq_test {

using veloxquant::DType;
using veloxquant::Shape;
using veloxquant::Tensor;
using veloxquant::TensorView;

/// A rank-4 tensor [a, b, c, d] whose storage may be laid out as [a, c, b, d] (the "seq-major"
/// layout models produce), so the view has non-trivial strides.
struct Tensor4 {
  Tensor storage;
  TensorView view;
};

inline Tensor4 make_tensor4(const Shape& s, DType dt, bool permuted) {
  Tensor4 t;
  if (!permuted) {
    t.storage = Tensor::zeros(s, dt);
    t.view = t.storage.view();
  } else {
    t.storage = Tensor::zeros({s[0], s[2], s[1], s[3]}, dt);
    t.view = TensorView(t.storage.data(), dt, s, {s[1] * s[2] * s[3], s[3], s[1] * s[3], 1});
  }
  return t;
}

/// Element offset of (i0..i3) in v.
inline int64_t off(const TensorView& v, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * v.strides[0] + i1 * v.strides[1] + i2 * v.strides[2] + i3 * v.strides[3];
}

inline void set_elem(const TensorView& v, int64_t o, float x) {
  switch (v.dtype) {
    case DType::F16: static_cast<uint16_t*>(v.data)[o] = veloxquant::float_to_half(x); break;
    case DType::BF16: static_cast<uint16_t*>(v.data)[o] = veloxquant::float_to_bf16(x); break;
    default: static_cast<float*>(v.data)[o] = x; break;
  }
}

inline float get_elem(const TensorView& v, int64_t o) {
  switch (v.dtype) {
    case DType::F16: return veloxquant::half_to_float(static_cast<const uint16_t*>(v.data)[o]);
    case DType::BF16: return veloxquant::bf16_to_float(static_cast<const uint16_t*>(v.data)[o]);
    default: return static_cast<const float*>(v.data)[o];
  }
}

/// Fills every element with N(mean, stddev).
inline void fill_normal(const TensorView& v, std::mt19937_64& rng, float stddev = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> nd(mean, stddev);
  for (int64_t a = 0; a < v.shape[0]; ++a)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      for (int64_t c = 0; c < v.shape[2]; ++c)
        for (int64_t d = 0; d < v.shape[3]; ++d) set_elem(v, off(v, a, b, c, d), nd(rng));
}

inline Tensor4 random_tensor4(const Shape& s, DType dt, bool permuted, std::mt19937_64& rng, float stddev = 1.0f) {
  Tensor4 t = make_tensor4(s, dt, permuted);
  fill_normal(t.view, rng, stddev);
  return t;
}

/// All elements of a rank-4 view as f32, row-major over the logical shape.
inline std::vector<float> values_of(const TensorView& v) {
  std::vector<float> out;
  out.reserve(size_t(v.numel()));
  for (int64_t a = 0; a < v.shape[0]; ++a)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      for (int64_t c = 0; c < v.shape[2]; ++c)
        for (int64_t d = 0; d < v.shape[3]; ++d) out.push_back(get_elem(v, off(v, a, b, c, d)));
  return out;
}

/// Normalised MSE Σ(a−b)² / Σb² (0 when both are all zero).
inline double nmse(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    const double d = double(a[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  if (a.size() != ref.size()) return INFINITY;
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return num / den;
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return false;
  return true;
}

/// Tolerance tier "bounded": the fp32 fast paths against the double oracle. The error is
/// dominated by rounding the output into its dtype (relative 2^-11 for f16, 2^-8 for bf16,
/// about 1e-7 accumulated for f32), so NMSE must stay below twice that rounding's NMSE
/// (u²/3 for a uniform rounding error of relative size u), with a floor for f32.
inline double attention_tolerance(DType out) {
  switch (out) {
    case DType::F16: return 2.0 * std::pow(2.0, -22) / 3.0 * 4.0;   // ~6.4e-7: u = 2^-11 (+ input rounding margin)
    case DType::BF16: return 2.0 * std::pow(2.0, -16) / 3.0 * 4.0;  // ~4.1e-5: u = 2^-8
    default: return 1e-10;
  }
}

inline const char* dt_name(DType t) { return veloxquant::dtype_name(t); }

}  // namespace vq_test
