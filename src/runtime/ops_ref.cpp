// ops_ref.cpp — scalar oracles of the runtime's ops: plain loops, double accumulation, never
// tuned. The optimised ops in ops_cpu.cpp are tested against these.
#include <cmath>

#include "veloxquant/error.h"
#include "veloxquant/runtime/ops.h"

namespace veloxquant::runtime {

void matmul_ref(const float* x, int64_t n, const WeightView& w, const float* bias, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < w.rows; ++r) {
      double s = bias ? double(bias[r]) : 0.0;
      for (int64_t c = 0; c < w.cols; ++c) s += double(x[i * w.cols + c]) * double(w.at(r, c));
      y[i * w.rows + r] = float(s);
    }
  }
}

void rmsnorm_ref(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0.0;
    for (int64_t c = 0; c < dim; ++c) ss += double(x[i * dim + c]) * x[i * dim + c];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + double(eps));
    for (int64_t c = 0; c < dim; ++c) y[i * dim + c] = float(double(weight[c]) * (double(x[i * dim + c]) * inv));
  }
}

void rope_apply_ref(float* x, int64_t n_tokens, int n_heads, int head_dim, int64_t start,
                    const std::vector<float>& inv_freq, float attention_factor) {
  const int half = head_dim / 2;
  VQ_CHECK_SHAPE(int(inv_freq.size()) == half,
                 "rope_apply_ref: inv_freq has " << inv_freq.size() << " entries, head_dim/2 = " << half);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double angle = double(start + t) * double(inv_freq[i]);
        const double c = std::cos(angle) * attention_factor, s = std::sin(angle) * attention_factor;
        const double a = v[i], b = v[i + half];
        v[i] = float(a * c - b * s);
        v[i + half] = float(b * c + a * s);
      }
    }
  }
}

void silu_mul_ref(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = float(g / (1.0 + std::exp(-g)) * double(up[i]));
  }
}

}  // namespace veloxquant::runtime
