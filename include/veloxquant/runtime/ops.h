// veloxquant/runtime/ops.h — the CPU operations of the runtime's forward pass.
//
// The ops know nothing about models: a matrix product against a weight matrix, RMSNorm,
// rotary embeddings, the SwiGLU gate, an embedding lookup. Activations are f32, row-major;
// weights are [out_features, in_features] row-major in f32, f16 or bf16 (as Hugging Face
// stores nn.Linear) and are converted to f32 on the fly, so memory-mapped bf16 checkpoints
// are never expanded in memory. Each optimised op has a plain `_ref` oracle beside it
// (double accumulation) that the tests compare against. Threading is explicit: the ops that
// parallelise take a ThreadPool* (null: the calling thread only).
#pragma once

#include <cstdint>
#include <vector>

#include "veloxquant/dtype.h"

namespace veloxquant {
class ThreadPool;
}

namespace veloxquant::runtime {

/// A weight matrix: `rows` × `cols` elements of `dtype` (F32, F16 or BF16), row-major,
/// rows contiguous (row stride == cols). Non-owning (usually a view into a mapped file).
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;  ///< out_features
  int64_t cols = 0;  ///< in_features
  /// Element (r, c) as f32.
  float at(int64_t r, int64_t c) const;
  /// Converts row r into `out` [cols].
  void row_f32(int64_t r, float* out) const;
};

/// y = x · wᵀ (+ bias): x [n, w.cols], y [n, w.rows], bias [w.rows] or null. y must not alias x.
/// AVX2/FMA micro-kernel (2 rows of x × 4 rows of w) where the compiler targets it, scalar
/// otherwise; rows of w are split over the pool's threads. f16/bf16 weights are converted to
/// f32 block by block (a block is reused by every row of x).
void matmul(const float* x, int64_t n, const WeightView& w, const float* bias, float* y,
            ThreadPool* pool);
/// Scalar oracle of matmul (double accumulation).
void matmul_ref(const float* x, int64_t n, const WeightView& w, const float* bias, float* y);

/// RMSNorm of n rows of `dim`: y = x / sqrt(mean(x²) + eps) ⊙ weight (Hugging Face's order:
/// normalise in f32, then scale). x and y may alias. weight [dim].
void rmsnorm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y);
void rmsnorm_ref(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y);

/// Rotary embedding tables for positions [start, start + n): cos and sin [n, head_dim/2],
/// already multiplied by the attention factor. angle = float(position) · inv_freq[i] (in f32,
/// as the reference computes it), cos/sin evaluated from that angle.
struct RopeTable {
  int64_t start = 0;
  int64_t n = 0;
  int half = 0;
  std::vector<float> cos;  // [n, half]
  std::vector<float> sin;  // [n, half]
};
RopeTable make_rope_table(const std::vector<float>& inv_freq, float attention_factor, int64_t start,
                          int64_t n);

/// Applies rotary embeddings in place ("rotate half" pairing: element i pairs with i + half):
/// x [n_tokens, n_heads, head_dim] with token t at position table.start + t.
///   x'[i]        = x[i] cos_i − x[i+half] sin_i
///   x'[i + half] = x[i+half] cos_i + x[i] sin_i
void rope_apply(float* x, int64_t n_tokens, int n_heads, int head_dim, const RopeTable& table);
/// Oracle: computes the angles itself in double from inv_freq (no table).
void rope_apply_ref(float* x, int64_t n_tokens, int n_heads, int head_dim, int64_t start,
                    const std::vector<float>& inv_freq, float attention_factor);

/// out = silu(gate) ⊙ up over n elements (silu(g) = g / (1 + e^−g)). out may alias gate.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void silu_mul_ref(const float* gate, const float* up, int64_t n, float* out);

/// out[t] = table row tokens[t] as f32; out [n, table.cols]. Throws ValueError naming the
/// token when an id is outside [0, table.rows).
void embedding_lookup(const WeightView& table, const int32_t* tokens, int64_t n, float* out);

/// In-place softmax over `n` logits (max-subtracted, f32 result, double sum).
void softmax_inplace(float* x, int64_t n);

}  // namespace veloxquant::runtime
