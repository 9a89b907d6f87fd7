// veloxquant/fp16_cache.h — the baseline cache: plain fp16 (or bf16) K/V, like mlx_lm's KVCache.
//
// Storage: keys and values each [batch, n_kv_heads, capacity, head_dim] in storage_dtype.
// capacity grows in whole multiples of config.step tokens (mlx_lm uses 256): when an update
// does not fit, the buffers are reallocated to round_up(offset + n_new, step) tokens and the
// live tokens copied. trim only moves the offset (the slack stays allocated and is counted by
// nbytes). fused_sdpa runs attention_cpu over strided views of the storage on the cache's own
// persistent thread pool (config.n_threads).
//
// state(): {"keys", "values"} each [batch, n_kv_heads, offset, head_dim] in storage_dtype
// (absent until the first update fixes batch and n_kv_heads). meta_state(): "class" =
// "KVCache", "offset", "head_dim", "n_kv_heads", "batch", "storage_dtype", "step", "capacity".
// restore() validates both before changing anything; set_state() derives offset/batch from
// the tensors, set_meta_state() re-applies the current tensors under the new meta.
// An update of 0 tokens changes nothing. nbytes() counts both buffers at full capacity.
#pragma once

#include <memory>

#include "veloxquant/cache.h"
#include "veloxquant/thread_pool.h"

namespace veloxquant {

class FP16KVCache final : public KVCache {
 public:
  /// Uses config.head_dim, n_kv_heads (0: from the first update), storage_dtype, step,
  /// n_threads. Validates them (ValueError naming the field).
  explicit FP16KVCache(const KVCacheConfig& config);
  ~FP16KVCache() override;

  /// Returns copies [batch, n_kv_heads, offset, head_dim] in storage_dtype.
  std::pair<Tensor, Tensor> update_and_fetch(const TensorView& keys,
                                             const TensorView& values) override;
  void update(const TensorView& keys, const TensorView& values) override;
  Tensor fused_sdpa(const TensorView& queries, const SdpaParams& params) const override;
  void fused_sdpa_into(const TensorView& queries, const TensorView& out,
                       const SdpaParams& params) const override;

  int64_t offset() const override { return offset_; }
  int64_t trim(int64_t n) override;

  CacheState state() const override;
  void set_state(const CacheState& state) override;
  CacheMetaState meta_state() const override;
  void set_meta_state(const CacheMetaState& meta) override;
  void restore(const CacheState& state, const CacheMetaState& meta) override;
  /// A new cache rebuilt from state + meta alone (mlx_lm's from_state).
  static std::unique_ptr<FP16KVCache> from_state(const CacheState& state,
                                                 const CacheMetaState& meta);

  int64_t nbytes() const override;
  std::string class_name() const override { return "KVCache"; }
  std::string describe() const override;
  const KVCacheConfig& config() const override { return config_; }

  int64_t capacity() const { return capacity_; }
  /// Non-owning strided views of the live tokens, [batch, n_kv_heads, offset, head_dim]
  /// (stride of dim 2 = head_dim, of dim 1 = capacity·head_dim). Invalidated by any update.
  TensorView keys_view() const;
  TensorView values_view() const;
  ThreadPool& pool() const { return *pool_; }

 private:
  void check_kv(const TensorView& keys, const TensorView& values) const;
  void append(const TensorView& keys, const TensorView& values);

  KVCacheConfig config_;
  Tensor keys_;    // [batch, n_kv_heads, capacity, head_dim] storage_dtype
  Tensor values_;  // [batch, n_kv_heads, capacity, head_dim] storage_dtype
  int64_t capacity_ = 0;
  int64_t offset_ = 0;
  std::shared_ptr<ThreadPool> pool_;  // config.thread_pool, or its own
};

}  // namespace veloxquant
