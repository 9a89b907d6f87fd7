// veloxquant/attention.h — scaled dot-product attention over plain (uncompressed) K/V.
//
// Shapes follow mlx_lm: queries [batch, n_heads, q_len, head_dim], keys and values
// [batch, n_kv_heads, kv_len, head_dim], output [batch, n_heads, q_len, head_dim].
// GQA: query head h reads kv head h / (n_heads / n_kv_heads); K/V are never repeated.
// Positions: key j sits at position j; query i at position kv_len - q_len + i (the queries
// are the newest tokens). Key j is visible to a query at position p when
//   (!causal || j <= p) && (sliding_window <= 0 || j > p - sliding_window).
#pragma once

#include <cstdint>

#include "veloxquant/tensor.h"

namespace veloxquant {

struct SdpaParams {
  float scale = 0.0f;          ///< softmax scale; 0 means 1/sqrt(head_dim)
  bool causal = true;          ///< mask keys after the query's position
  int64_t sliding_window = 0;  ///< > 0: only the last `sliding_window` positions are visible
  int n_threads = 0;           ///< CPU threads; 0: hardware concurrency
};

/// Whether key position k is visible to query position p.
inline bool attn_visible(int64_t p, int64_t k, const SdpaParams& s) {
  return (!s.causal || k <= p) && (s.sliding_window <= 0 || k > p - s.sliding_window);
}

/// Checks q/k/v/out shapes (rank 4, head_dim and batch agree, n_heads % n_kv_heads == 0,
/// q_len <= kv_len when causal) and throws ShapeError naming them.
void check_attention_shapes(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out);

/// Scalar oracle: double accumulation, plain softmax. Any float dtypes and strides, CPU.
/// A query row that sees no key gets zeros.
void attention_ref(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const SdpaParams& params);

/// Optimised CPU attention (threads over batch × kv-head groups × token chunks, F16C/AVX-512
/// dot products shared by the query heads of a GQA group, fp32 softmax with a per-chunk max
/// merged by log-sum-exp). Same contract as attention_ref; the fp16 baseline cache uses it.
/// This overload runs on params.n_threads threads made for the call (1: the caller only);
/// hot paths should pass a persistent pool to the overload below.
void attention_cpu(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const SdpaParams& params);

class ThreadPool;
/// As above, on `pool` (null: the calling thread only); params.n_threads is ignored.
void attention_cpu(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const SdpaParams& params, ThreadPool* pool);

}  // namespace veloxquant
