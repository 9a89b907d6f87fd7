// src/ref/smooth_ref.cpp — scalar oracle of compute_smooth_factors: reads every element
// through TensorView::get_f32 (any dtype, any strides), keeps max |K| per (kv head, channel),
// then λ = max(eps, max^alpha). Plain loops, never tuned.
#include <cmath>

#include "veloxquant/error.h"
#include "veloxquant/smooth.h"
#include "core/smooth_internal.h"

namespace veloxquant {


std::vector<float> compute_smooth_factors_ref(const TensorView& key_samples, const SmoothParams& params) {
  const detail::SmoothShape s = detail::smooth_check_inputs(key_samples, params);
  std::vector<float> lambda(size_t(s.n_kv_heads * s.head_dim), 0.0f);  // [n_kv_heads, head_dim]
  for (int64_t t = 0; t < s.n_tokens; ++t)
    for (int64_t h = 0; h < s.n_kv_heads; ++h)
      for (int64_t c = 0; c < s.head_dim; ++c) {
        const int64_t flat = (t * s.n_kv_heads + h) * s.head_dim + c;  // row-major logical index
        const float v = key_samples.get_f32(flat);
        if (!std::isfinite(v)) detail::smooth_throw_nonfinite(s, t, h, c, v);
        float& m = lambda[size_t(h * s.head_dim + c)];
        if (std::fabs(v) > m) m = std::fabs(v);
      }
  for (float& l : lambda) l = detail::smooth_lambda_from_max(l, params);
  return lambda;
}

}  // namespace veloxquant
