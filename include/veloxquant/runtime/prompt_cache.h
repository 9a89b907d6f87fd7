// veloxquant/runtime/prompt_cache.h — saving the caches of an encoded prompt to a file and
// loading them back, so a long prompt is encoded once (mlx_lm's save_prompt_cache /
// load_prompt_cache).
//
// File: one safetensors file.
//   tensors   "layers.{i}.{name}" for every (name, tensor) of cache i's state()
//             "tokens"  I32 [n_tokens]  the token ids the caches hold
//   metadata  "format" = "veloxquant-prompt-cache", "version" = "1", "n_layers",
//             "layers.{i}.class" (class_name()), "layers.{i}.meta.{key}" for every meta_state()
//             entry, plus caller-supplied entries under "user.{key}" (e.g. the model directory).
// Loading rebuilds each cache from its state alone (FP16KVCache::from_state /
// VecInferKVCache::from_state), so a VecInfer prompt cache carries its codebooks with it.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "veloxquant/runtime/model.h"

namespace veloxquant::runtime {

constexpr const char* kPromptCacheFormat = "veloxquant-prompt-cache";

struct PromptCache {
  LayerCaches caches;
  std::vector<int32_t> tokens;                ///< what the caches hold
  std::map<std::string, std::string> user;    ///< the "user.*" metadata, prefix stripped
};

/// Writes the caches' state and `tokens` (must have caches[0]->offset() entries; all caches
/// at the same offset — ValueError otherwise). Written through a temporary file.
void save_prompt_cache(const std::string& path, const LayerCaches& caches, std::span<const int32_t> tokens,
                       const std::map<std::string, std::string>& user = {});

/// Reads a prompt cache. IoError when unreadable, FormatError naming what is wrong (format,
/// version, a layer's class or state).
PromptCache load_prompt_cache(const std::string& path);

/// Checks that loaded caches fit `model` (count, kv heads, head_dim): ValueError naming the
/// mismatch.
void check_prompt_cache_fits(const PromptCache& pc, const Model& model);

}  // namespace veloxquant::runtime
