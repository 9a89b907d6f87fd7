// Scalar oracle of KIVI-style asymmetric group quantization (see include/veloxquant/kivi.h).
// Plain loops; the cache (src/cpu/kivi_cache.cpp) must reproduce it bit for bit.
#include <algorithm>
#include <cmath>

#include "veloxquant/dtype.h"
#include "veloxquant/error.h"
#include "veloxquant/kivi.h"

namespace veloxquant {

void kivi_quantize_group_ref(const float* x, int64_t n, int64_t stride, int bits, float* out) {
  VQ_CHECK_VALUE(bits >= 1 && bits <= 8, "kivi: bits must be in 1..8, got " << bits);
  VQ_CHECK_VALUE(n >= 1, "kivi: a group needs at least one value, got " << n);
  float mn = x[0], mx = x[0];
  for (int64_t i = 1; i < n; ++i) {
    mn = std::min(mn, x[i * stride]);
    mx = std::max(mx, x[i * stride]);
  }
  const float levels = float((1 << bits) - 1);
  const float scale = round_to_half((mx - mn) / levels);
  const float zero = round_to_half(mn);
  for (int64_t i = 0; i < n; ++i) {
    float q = 0.0f;
    if (scale > 0.0f) q = std::min(levels, std::max(0.0f, std::nearbyint((x[i * stride] - zero) / scale)));
    out[i * stride] = q * scale + zero;
  }
}

}  // namespace veloxquant
