// src/core/attention_internal.h — pieces shared by the attention oracles (src/ref) and the
// optimised paths (src/cpu): strided element access, the visible key range of a query, the
// resolved softmax scale.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "veloxquant/attention.h"
#include "veloxquant/dtype.h"
#include "veloxquant/tensor.h"

namespace veloxquant::detail {

/// Element offset of (i0, i1, i2, i3) in a rank-4 view.
inline int64_t off4(const TensorView& v, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * v.strides[0] + i1 * v.strides[1] + i2 * v.strides[2] + i3 * v.strides[3];
}

/// Reads element `off` (in elements) of a float buffer of dtype t as f32.
inline float load_f32(const void* base, DType t, int64_t off) {
  switch (t) {
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(base)[off]);
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[off]);
    default: return static_cast<const float*>(base)[off];
  }
}

/// Writes f32 x at element `off` of a float buffer of dtype t (rounding to nearest even).
inline void store_f32(void* base, DType t, int64_t off, float x) {
  switch (t) {
    case DType::F16: static_cast<uint16_t*>(base)[off] = float_to_half(x); break;
    case DType::BF16: static_cast<uint16_t*>(base)[off] = float_to_bf16(x); break;
    default: static_cast<float*>(base)[off] = x; break;
  }
}

/// Rounds x as storing it in dtype t would.
inline float round_to(DType t, float x) {
  switch (t) {
    case DType::F16: return half_to_float(float_to_half(x));
    case DType::BF16: return bf16_to_float(float_to_bf16(x));
    default: return x;
  }
}

/// The softmax scale params asks for (0: 1/sqrt(head_dim)).
inline float resolved_scale(const SdpaParams& p, int64_t head_dim) {
  return p.scale != 0.0f ? p.scale : float(1.0 / std::sqrt(double(head_dim)));
}

/// Inclusive range [lo, hi] of key positions visible to a query at position `pos` among kv_len
/// keys (attn_visible as a range); lo > hi when none is visible.
struct KeyRange {
  int64_t lo, hi;
  bool empty() const { return lo > hi; }
};
inline KeyRange visible_range(int64_t pos, int64_t kv_len, const SdpaParams& p) {
  int64_t hi = p.causal ? std::min(pos, kv_len - 1) : kv_len - 1;
  int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
  return {lo, hi};
}

/// Checks the SdpaParams values themselves (finite scale, sliding_window >= 0, n_threads >= 0).
void check_sdpa_params(const SdpaParams& p);

}  // namespace veloxquant::detail
