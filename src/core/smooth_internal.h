// src/core/smooth_internal.h — validation and helpers shared by compute_smooth_factors and
// its oracle compute_smooth_factors_ref, so both accept, reject and round exactly alike.
#pragma once

#include <cstdint>

#include "veloxquant/smooth.h"

namespace veloxquant::detail {

/// The three logical dims of key_samples and their element strides (sh = 0 for rank 2).
struct SmoothShape {
  int64_t n_tokens, n_kv_heads, head_dim;
  int64_t st, sh, sc;
};
/// Validates params and key_samples (rank 2/3, float, CPU, n_tokens > 0); throws otherwise.
SmoothShape smooth_check_inputs(const TensorView& k, const SmoothParams& p);
/// max(eps, max_abs^alpha), the power in double rounded once to f32.
float smooth_lambda_from_max(float max_abs, const SmoothParams& p);
/// Throws ValueError "key_samples[t][h][c] is nan: ...".
[[noreturn]] void smooth_throw_nonfinite(const SmoothShape& s, int64_t t, int64_t h, int64_t c, float v);

}  // namespace veloxquant::detail
