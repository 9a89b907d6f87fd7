// veloxquant/smooth.h — smooth factors λ and the key/query transform built from them.
//
// λ[kv_head][channel] = max(eps, (max over calibration tokens of |K|)^alpha), alpha = 0.5 by
// default. Keys become k̃ = (k ⊙ 1/λ)·H, queries q̃ = (q ⊙ λ)·H, so q̃·k̃ᵀ = q·kᵀ.
#pragma once

#include <cstdint>
#include <vector>

#include "veloxquant/tensor.h"

namespace veloxquant {

struct SmoothParams {
  float alpha = 0.5f;   ///< migration exponent; 0.5 as in the paper, 1.0 also used
  float eps = 1e-5f;    ///< floor for λ (channels that are all zero)
};

/// λ from calibration keys shaped [n_tokens, n_kv_heads, head_dim] or [n_tokens, head_dim]
/// (the latter is one kv head). Any float dtype. Returns [n_kv_heads, head_dim] f32.
/// Throws ValueError on non-finite samples or n_tokens == 0, ShapeError on other ranks.
std::vector<float> compute_smooth_factors(const TensorView& key_samples,
                                          const SmoothParams& params = {});
/// Scalar oracle of the above.
std::vector<float> compute_smooth_factors_ref(const TensorView& key_samples,
                                              const SmoothParams& params = {});

/// The per-(kv-head, channel) smooth scaling followed by the per-head Hadamard rotation.
struct KeyTransform {
  int n_kv_heads = 0;
  int head_dim = 0;
  bool use_smooth = true;         ///< false: λ = 1 (identity scaling)
  bool use_hadamard = true;       ///< false: no rotation (the "VQ without transforms" ablation)
  std::vector<float> lambda;      ///< [n_kv_heads, head_dim]; empty means all ones
  std::vector<float> inv_lambda;  ///< [n_kv_heads, head_dim]; 1/λ, derived

  KeyTransform() = default;
  /// `lambda` may be empty (identity). Validates the size against n_kv_heads × head_dim.
  KeyTransform(int n_kv_heads, int head_dim, std::vector<float> lambda, bool use_hadamard = true);

  /// k ← (k ⊙ 1/λ[h])·H for n vectors of kv head h. @param k [n, head_dim]
  void forward_keys(float* k, int64_t n, int kv_head) const;
  /// Inverse of forward_keys: k ← (k·H) ⊙ λ[h]. @param k [n, head_dim]
  void inverse_keys(float* k, int64_t n, int kv_head) const;
  /// q ← (q ⊙ λ[h])·H for n query vectors whose kv head is h. @param q [n, head_dim]
  void forward_queries(float* q, int64_t n, int kv_head) const;
};

}  // namespace veloxquant
