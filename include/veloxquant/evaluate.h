// veloxquant/evaluate.h — measuring a KV cache against exact attention on a known sequence.
//
// The quality measure used by the demo and the end-to-end tests:
//   attention-output error = mean over (layer, query head, query) of ||o − o_ref||₂ / ||o_ref||₂
// where o is the cache's fused_sdpa output and o_ref is attention_ref (double accumulation)
// over the ORIGINAL fp32 keys and values, both causal with the queries at the newest positions.
// Every method sees the same sequence, the same queries and its own residual window.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "veloxquant/attention.h"
#include "veloxquant/cache.h"
#include "veloxquant/synthetic.h"
#include "veloxquant/tensor.h"

namespace veloxquant {

/// Mean over rows of ||out − ref||₂ / ||ref||₂ for out/ref [..., head_dim] (same shape, any
/// float dtypes and strides). Rows whose reference is all zeros are skipped. ShapeError on
/// mismatched shapes.
double attention_relative_error(const TensorView& out, const TensorView& ref);

/// Views of calibration-layout tensors in the cache layout (no copy):
/// kv [n_tokens, n_kv_heads, head_dim] → [1, n_kv_heads, n_tokens, head_dim].
TensorView kv_as_cache_layout(const Tensor& kv);
/// queries [n_queries, n_heads, head_dim] → [1, n_heads, n_queries, head_dim].
TensorView queries_as_cache_layout(const Tensor& queries);

/// Reference outputs per layer over the original f32 K/V, f32 [1, n_heads, n_queries, head_dim]:
/// attention_ref (double accumulation) when use_oracle, else attention_cpu (fp32, threaded;
/// the demo uses it at long contexts, where the oracle would take seconds per layer).
std::vector<Tensor> reference_attention(const SyntheticSequence& seq, const SdpaParams& params = {},
                                        bool use_oracle = true);

struct EvaluationParams {
  int64_t prefill_chunk = 0;  ///< tokens per update() while filling (0: one update)
  bool time_decode = true;    ///< time one decode step (q_len 1) per layer
  int timing_repeats = 7;     ///< median over this many timed runs, after one warm-up
  SdpaParams sdpa{};          ///< causal, default scale
};

/// Outcome for one method over all layers.
struct CacheEvaluation {
  double attn_error = 0;             ///< mean over layers of attention_relative_error
  std::vector<double> layer_errors;  ///< [n_layers]
  int64_t bytes = 0;                 ///< Σ nbytes() over the layers' caches
  double decode_seconds = 0;         ///< Σ over layers of the median decode fused_sdpa time (0 if not timed)
  std::vector<std::unique_ptr<KVCache>> caches;  ///< the filled caches (for accounting)
};

/// Builds one cache per layer with make_cache(layer), fills it with the sequence's K/V,
/// runs fused_sdpa with the sequence's queries and compares with `reference`.
CacheEvaluation evaluate_cache(const SyntheticSequence& seq, const std::vector<Tensor>& reference,
                               const std::function<std::unique_ptr<KVCache>(int layer)>& make_cache,
                               const EvaluationParams& params = {});

}  // namespace veloxquant
