// veloxquant/runtime/generate.h — the front end: text generation, perplexity, and the KV
// samples calibration needs, all driving a Model and its per-layer caches.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "veloxquant/calibrate.h"
#include "veloxquant/runtime/model.h"
#include "veloxquant/runtime/sampler.h"

namespace veloxquant::runtime {

class Tokenizer;

/// A forward pass with Model::forward's contract; CudaModel::forward (model_cuda.h) is another.
using ForwardFn = std::function<std::vector<float>(std::span<const int32_t>, LayerCaches&, const ForwardOptions&)>;
/// A cache-less forward pass with Model::forward_nocache's contract (tokens, kv_dtype,
/// all_logits, observer); CudaModel::forward_nocache is another.
using ForwardNocacheFn =
    std::function<std::vector<float>(std::span<const int32_t>, DType, bool, const KVObserver&)>;

struct GenerateParams {
  int max_tokens = 256;                   ///< new tokens at most
  SamplerParams sampler;                  ///< greedy by default
  std::vector<int32_t> stop_ids;          ///< end on any of these (typically the EOS ids)
  std::vector<std::string> stop_strings;  ///< end when the generated text contains one (needs a tokenizer)
  int prefill_chunk = 512;                ///< prompt tokens per forward call
  AttentionPath path = AttentionPath::Auto;
  /// The forward pass to run; empty: model.forward. Another implementation of the same contract
  /// (e.g. CudaModel::forward, model_cuda.h) generates on a device.
  ForwardFn forward;
  /// Called after every prefill chunk with the prompt tokens this call has run so far and the
  /// number it runs in all (cached ones excluded; progress bars); may be empty.
  std::function<void(int64_t done, int64_t total)> on_prefill;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;     ///< prompt tokens processed by this call (cached ones excluded)
  int64_t cached_tokens = 0;     ///< prompt tokens already in the caches
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double prefill_tps() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  int64_t decode_steps = 0;      ///< one-token forward calls after the prefill
  /// Decode steps per second (the first generated token comes from the prefill's logits and
  /// is not a step).
  double decode_tps() const { return decode_seconds > 0 ? decode_steps / decode_seconds : 0; }
  int64_t kv_bytes = 0;          ///< bytes the caches hold at the end
  int64_t kv_fp16_bytes = 0;     ///< what fp16 K/V of the same tokens take
  std::string stop_reason;       ///< "eos", "stop string", "max tokens", "stopped by caller"
};

struct GenerateResult {
  std::vector<int32_t> tokens;   ///< generated ids (the stop id excluded)
  std::string text;              ///< their text (empty without a tokenizer; cut before a stop string)
  GenerateStats stats;
};

/// Called for every piece of final text as it is produced; return false to stop.
using StreamCallback = std::function<bool(const std::string& piece)>;

/// Generates after `prompt`. The caches may already hold a prefix of `prompt` (a loaded
/// prompt cache): those tokens are not recomputed (if they cover the whole prompt, the last
/// one is trimmed and recomputed to get logits). The repetition penalty sees the whole
/// prompt plus the generated tokens. `tokenizer` may be null (no text, no stop strings).
/// With stop strings, streamed text is held back while it could still be the start of one.
GenerateResult generate(const Model& model, LayerCaches& caches, std::span<const int32_t> prompt,
                        const GenerateParams& params, const Tokenizer* tokenizer = nullptr,
                        const StreamCallback& on_text = {});

// ---- perplexity ----------------------------------------------------------------------------

struct PerplexityResult {
  double nll_sum = 0;         ///< Σ −log p(token | context), natural log
  int64_t n_scored = 0;       ///< tokens scored
  int64_t n_windows = 0;
  double seconds = 0;
  double ppl() const;
  int64_t kv_bytes_peak = 0;  ///< bytes the caches held at the end of a full window
  int64_t kv_fp16_bytes = 0;  ///< fp16 K/V of a full window
};

struct PerplexityParams {
  int64_t ctx = 512;          ///< window length in tokens (non-overlapping windows)
  int64_t chunk = 1;          ///< tokens per forward call inside a window (1: decode-exact)
  int64_t max_windows = 0;    ///< 0: all complete windows
  std::optional<int32_t> bos; ///< prepended to each window and not scored, if set
  AttentionPath path = AttentionPath::Auto;
  /// The forward pass to run; empty: model.forward (CudaModel::forward scores on a device).
  ForwardFn forward;
  /// Called after every window with the windows done, the windows in all and the running
  /// result (progress bars); may be empty.
  std::function<void(int64_t done, int64_t total, const PerplexityResult& so_far)> on_window;
};

/// Scores `tokens` in windows of params.ctx tokens with fresh caches per window (trimmed
/// back to empty between windows). Throws ValueError when not even one window of 2 tokens
/// fits.
PerplexityResult perplexity(const Model& model, LayerCaches& caches, std::span<const int32_t> tokens,
                            const PerplexityParams& params);

// ---- calibration samples -------------------------------------------------------------------

struct CollectParams {
  int64_t ctx = 512;           ///< tokens per forward pass (positions restart at 0 per window)
  int64_t max_tokens = 0;      ///< collect at most this many tokens, BOS included (0: all)
  std::optional<int32_t> bos;  ///< prepended to each window if set (its K/V are collected too)
  /// The cache-less forward pass to run per window; empty: model.forward_nocache
  /// (CudaModel::forward_nocache runs the products on a device).
  ForwardNocacheFn forward_nocache;
  /// Called after every window with the tokens collected so far and the most that will be
  /// (progress bars); may be empty.
  std::function<void(int64_t collected, int64_t total)> on_window;
};

/// Post-RoPE keys and the values of every layer, as the caches would receive them, from a
/// cache-less forward pass over `tokens`: KVSamples with keys/values f32 [n_tokens,
/// n_kv_heads, head_dim] per layer; `source` names the model directory and the token count.
KVSamples collect_kv_samples(const Model& model, std::span<const int32_t> tokens, const CollectParams& params);

}  // namespace veloxquant::runtime
