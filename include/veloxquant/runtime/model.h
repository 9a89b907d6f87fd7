// veloxquant/runtime/model.h — a Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3)
// running on the CPU, with one veloxquant KV cache per layer.
//
// One decoder layer, for the n_tokens new tokens x [n_tokens, hidden]:
//   h  = RMSNorm(x)                                   (input_layernorm)
//   q  = h·Wqᵀ (+bq) [n_tokens, n_heads, head_dim];  k, v = h·Wk/vᵀ (+bk/bv) [n_tokens, n_kv_heads, head_dim]
//   q, k = RMSNorm over head_dim                      (Qwen3 only: q_norm, k_norm)
//   q, k = RoPE at positions offset .. offset+n_tokens−1
//   a  = attention(q, cache ∪ {k, v})                 (see AttentionPath)
//   x += a·Woᵀ (+bo)
//   x += Wd·(silu(RMSNorm(x)·Wgᵀ) ⊙ RMSNorm(x)·Wuᵀ)   (post_attention_layernorm, SwiGLU MLP)
// then logits = RMSNorm(x)·Wlmᵀ (Wlm = the embedding matrix when tied).
//
// Attention goes through the cache protocol (cache.h): either update_and_fetch, then
// attention_cpu over the returned K/V (AttentionPath::Fetch), or update, then the cache's own
// fused_sdpa (AttentionPath::Fused: the only option for a memory-bound VecInfer cache, which
// holds codes and has nothing to fetch). Auto picks Fused for MemoryBound VecInfer caches and
// for the fp16 cache (its fused_sdpa is attention_cpu over its storage, without the copy a
// fetch makes), Fetch for Standard/Stash VecInfer caches.
//
// Activations are f32 throughout; weights stay memory-mapped in their checkpoint dtype.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "veloxquant/cache.h"
#include "veloxquant/runtime/config.h"
#include "veloxquant/runtime/ops.h"
#include "veloxquant/runtime/weights.h"
#include "veloxquant/thread_pool.h"

namespace veloxquant {
struct Artifact;
}

namespace veloxquant::runtime {

/// One KV cache per layer.
using LayerCaches = std::vector<std::unique_ptr<KVCache>>;

enum class AttentionPath { Auto, Fetch, Fused };
const char* attention_path_name(AttentionPath p);

/// Called once per layer during a forward pass with the post-RoPE keys and the values of
/// the new tokens: k, v [n_tokens, n_kv_heads, head_dim] f32 (valid during the call only).
using KVObserver = std::function<void(int layer, const float* k, const float* v, int64_t n_tokens)>;

struct ForwardOptions {
  bool all_logits = false;                    ///< logits of every new token, else only the last
  AttentionPath path = AttentionPath::Auto;
  KVObserver observer;                        ///< may be empty
};

struct ModelOptions {
  int n_threads = 0;  ///< threads of the model's pool; 0: default_threads()
};

/// The weights of one decoder layer (views into the mapped checkpoint; small vectors in f32).
struct LayerWeights {
  std::vector<float> input_norm;      // [hidden]
  WeightView wq, wk, wv, wo;          // [n_heads·hd, hidden], [n_kv·hd, hidden] ×2, [hidden, n_heads·hd]
  std::vector<float> bq, bk, bv, bo;  // empty when absent
  std::vector<float> q_norm, k_norm;  // [head_dim], Qwen3 only
  std::vector<float> post_norm;       // [hidden]
  WeightView w_gate, w_up, w_down;    // [inter, hidden] ×2, [hidden, inter]
  std::vector<float> b_gate, b_up, b_down;  // Llama mlp_bias only
};

class Model {
 public:
  /// Loads config.json, generation_config.json and the safetensors weights of `dir`, checking
  /// every tensor's shape (FormatError naming it). The weights stay memory-mapped.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, const ModelOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const GenerationConfig& generation_config() const { return gen_config_; }
  const WeightStore& weights() const { return weights_; }
  const std::filesystem::path& dir() const { return dir_; }
  ThreadPool& pool() const { return *pool_; }
  /// The model's pool as shared ownership (the layer caches of make_caches use it).
  std::shared_ptr<ThreadPool> shared_pool() const { return pool_; }
  const RopeFrequencies& rope() const { return rope_; }
  /// The attention parameters every layer uses (scale 1/sqrt(head_dim), causal, sliding window).
  SdpaParams sdpa_params() const;

  /// Runs `tokens` at positions caches[0]->offset() .. and appends their K/V to the caches
  /// (one per layer, all at the same offset). Returns logits [n_out, vocab_size], n_out =
  /// tokens.size() with all_logits, else 1. Throws ValueError for an empty token list, a token
  /// outside the vocabulary or caches of mismatched offsets / count. If a layer's cache throws,
  /// the layers already updated are trimmed back, so the caches are left as they were.
  std::vector<float> forward(std::span<const int32_t> tokens, LayerCaches& caches,
                             const ForwardOptions& options = {}) const;

  /// The same network without any cache: causal attention over `tokens` alone (positions
  /// 0 .. n−1). K/V are rounded through `kv_dtype` first (F32: not rounded; F16/BF16: as a
  /// cache of that storage dtype holds them), so this is the full-recompute reference of the
  /// incremental path. Returns logits [n_out, vocab_size] as forward().
  std::vector<float> forward_nocache(std::span<const int32_t> tokens, DType kv_dtype = DType::F32,
                                     bool all_logits = true, const KVObserver& observer = {}) const;

  /// fp16 bytes the K/V of `n_tokens` tokens take over all layers (2·layers·n_kv·hd·2·n).
  int64_t fp16_kv_bytes(int64_t n_tokens) const;

 private:
  Model() = default;
  std::vector<float> run(std::span<const int32_t> tokens, LayerCaches* caches, DType kv_dtype,
                         const ForwardOptions& options) const;

  std::filesystem::path dir_;
  ModelConfig config_;
  GenerationConfig gen_config_;
  WeightStore weights_;
  RopeFrequencies rope_;
  WeightView embed_;
  WeightView lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  std::shared_ptr<ThreadPool> pool_;
};

// ---- caches --------------------------------------------------------------------------------

/// Which caches a run uses.
struct CacheOptions {
  CacheKind kind = CacheKind::FP16;
  DType storage_dtype = DType::F16;  ///< fp16 parts (F16 or BF16)
  /// VecInfer: MemoryBound (codes + residual window), Stash or Standard.
  CacheMode mode = CacheMode::MemoryBound;
  int residual_length = 128;         ///< VecInfer: exact recent tokens
  /// VecInfer: the calibration artifact (artifact.h). Empty: random codebooks (tests and
  /// demos only; the caches say so) with the specs and seed below.
  std::string artifact_path;
  PQSpec key_spec{4, 12};
  PQSpec value_spec{8, 8};
  uint64_t seed = 0;                 ///< random codebooks: layer i uses seed + i
  int n_threads = 0;                 ///< cache threads; 0 or the model's count: the model's pool, shared by every layer; else one pool of n_threads shared by every layer
  /// VecInfer on CUDA: the codebooks fused_sdpa reads (cache.h CodebookFormat).
  CodebookFormat attention_codebooks = CodebookFormat::I8;
  /// VecInfer: the key codebook snapped to its int8 grid (KVCacheConfig::int8_key_grid).
  bool int8_key_grid = true;
};

/// The base KVCacheConfig of `model` for `options` (head_dim, n_kv_heads, mode flags, ...).
KVCacheConfig cache_config_for(const Model& model, const CacheOptions& options);
/// One cache per layer. With an artifact, its shapes must match the model (ValueError naming
/// the mismatch: layers, kv heads, head_dim).
LayerCaches make_caches(const Model& model, const CacheOptions& options);
/// Same from an artifact already loaded.
LayerCaches make_caches(const Model& model, const CacheOptions& options, const Artifact& artifact);

/// Bytes held by all caches (KVCache::nbytes summed).
int64_t caches_nbytes(const LayerCaches& caches);
/// Trims every cache by n tokens.
void trim_caches(LayerCaches& caches, int64_t n);

}  // namespace veloxquant::runtime
