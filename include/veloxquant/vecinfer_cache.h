// veloxquant/vecinfer_cache.h — the VecInfer KV cache (CPU) and attention on its codes.
//
// Keys k become k̃ = (k ⊙ 1/λ)·H (KeyTransform) and are product-quantized with the key
// codebook; values are quantized untransformed with the value codebook. Codes are computed
// from the f32 input on arrival (every mode), so every token always has its codes.
//
// Residual window (every mode). The most recent residual_count tokens are also kept exact
// (rounded to storage_dtype); older tokens are represented by their codes. On an append of
// n_new tokens residual_count = min(residual_length, residual_count + n_new); on trim(n)
// residual_count = max(0, residual_count − n). After a trim the window may hold fewer than
// residual_length tokens until new tokens refill it: the cache never re-creates exact values
// it no longer has. The window therefore always covers positions [offset − residual_count,
// offset), and attention sees, for token j:
//   j <  offset − residual_count : K̂_j = inverse_transform(decode_k(codes_j)), V̂_j = decode_v(codes_j)
//   j >= offset − residual_count : K̂_j = round(k_j), V̂_j = round(v_j)   (round = storage_dtype)
//
// Modes (KVCacheConfig::mode()):
//   Standard     holds fp16 K̂/V̂ [batch, n_kv_heads, capacity, head_dim]: window tokens exact,
//                older ones dequantized (a token leaving the window gets its dequantized value,
//                from codes kept for window tokens only: the "pending" codes). update_and_fetch
//                returns copies of K̂/V̂; fused_sdpa runs attention_cpu over the held K̂/V̂.
//   Stash        Standard, plus the codes of every token [batch, n_kv_heads, capacity,
//                code_bytes]; fetches are identical to Standard; fused_sdpa runs on the codes
//                (older tokens) and the held K̂/V̂ rows of the window.
//   MemoryBound  holds only the codes of every token and a ring of residual_length fp16
//                slots per (batch, kv head) for the window (position p lives in slot
//                p % residual_length). update_and_fetch throws UnsupportedError: use update()
//                and fused_sdpa(); nothing can read placeholder tensors.
// Stash and MemoryBound give bit-identical fused_sdpa results; Standard equals them up to the
// fp16 rounding of the held dequantized K̂/V̂.
//
// fused_sdpa on codes (vecinfer_attention_cpu): per query row q̃ = (q ⊙ λ_h)·H (λ of the row's
// kv head), score_j = scale·Σ_m LUT[m][code_j,m] with LUT[m][c] = q̃_m·C_k[c] for coded tokens
// and scale·q·K̂_j for window tokens; out = Σ_j p_j V̂_j with V̂ of coded tokens taken from the
// value codebook. Softmax in fp32, two-pass per token chunk (all chunk scores first, then the
// chunk max, exp and value accumulation); chunks are merged by log-sum-exp.
//
// Storage grows in whole multiples of config.step tokens; trim only moves offset and
// residual_count (codes, window and byte counts stay in step per token).
//
// Byte accounting (VecInferAccounting), counted per live token (no capacity slack):
//   compressed_key_bytes   batch·n_kv_heads·n_coded·key_code_bytes, where n_coded = offset in
//                          Stash/MemoryBound and residual_count (the pending codes) in Standard
//   fp16_key_bytes         batch·n_kv_heads·n·head_dim·2, n = offset (Standard/Stash: held K̂)
//                          or residual_count (MemoryBound: the window)
//   (values alike)
//   codebook_bytes         both codebooks as held, in f32 (n_centroids·sub_dim·4 each, not
//                          the paper's fp16 count) + their centroid norms (n_centroids·4 each)
//                          + their int8 rows where a codebook lies on its int8 grid (the key
//                          codebook by default: n_centroids·sub_dim bytes; the CPU attention
//                          reads them, ProductQuantizer::codebook_i8)
//                          + λ and 1/λ (n_kv_heads·head_dim·4 each, f32; 0 for identity)
//                          + both codebooks as the encoder's scan reads them, transposed
//                          ((sub_dim + 1)·n_centroids·4 each, n_centroids rounded up to 16)
//   nbytes()               every buffer actually allocated: capacity slack, the whole ring /
//                          pending ring, plus codebook_bytes(). Per-thread attention scratch
//                          (LUT, histogram, scores: ~0.5 MiB per thread for d4b8 decode) and
//                          the thread pool are not counted.
//
// state(): tensors trimmed to the live tokens, oldest first:
//   "key_codes", "value_codes"       U8 [batch, n_kv_heads, offset, code_bytes]   Stash, MemoryBound
//   "pending_key_codes", "pending_value_codes"
//                                    U8 [batch, n_kv_heads, residual_count, code_bytes]  Standard
//   "keys", "values"                 storage_dtype [batch, n_kv_heads, offset, head_dim]  Standard, Stash
//   "window_keys", "window_values"   storage_dtype [batch, n_kv_heads, residual_count, head_dim]  MemoryBound
//   "smooth_factors"                 F32 [n_kv_heads, head_dim] (all ones for identity)
//   "key_codebook", "value_codebook" F32 [n_centroids, sub_dim]
// Tensors whose token count is 0 are omitted; an empty cache whose n_kv_heads is still unknown
// has only the codebooks. meta_state(): "class", "mode", "offset", "residual_count", "batch",
// "n_kv_heads", "head_dim", the bit/sub_dim fields, "residual_length", "storage_dtype",
// "step", "fused_sdpa_max_ctx", "use_hadamard", "identity_smooth", "random_codebooks", "seed".
// "capacity" (token slots allocated, so nbytes() is reproduced too). restore() validates all
// of it before changing anything; afterwards the cache behaves bit for bit like the one saved.
// set_state / set_meta_state follow mlx_lm's order (state first, then meta_state): a state that
// does not fit the current meta is validated for names and staged, and the following
// set_meta_state restores both; a meta alone is applied to the current tensors.
//
// config() reports the configuration, except that the codebooks and smooth factors it was
// given are moved into the quantizers and the transform (config().key_codebook etc. are empty
// afterwards): read them from key_quantizer(), value_quantizer() and key_transform().
#pragma once

#include <memory>

#include "veloxquant/cache.h"
#include "veloxquant/thread_pool.h"

namespace veloxquant {

namespace detail {
class GridSearch;
struct PreparedCentroids;
}

/// Everything attention on codes needs, as non-owning views (CPU). Token positions: 0 ..
/// n_coded−1 come from the codes, n_coded .. n_coded+n_window−1 from the window.
struct VecInferAttentionInputs {
  const ProductQuantizer* key_pq = nullptr;    ///< key codebook, d, code layout
  const ProductQuantizer* value_pq = nullptr;  ///< value codebook
  const KeyTransform* transform = nullptr;     ///< λ and Hadamard; n_kv_heads must match
  TensorView key_codes;    ///< U8 [batch, n_kv_heads, n_coded, key_pq->code_bytes], any strides
  TensorView value_codes;  ///< U8 [batch, n_kv_heads, n_coded, value_pq->code_bytes]
  /// Window rows, float (f16/bf16/f32) [batch, n_kv_heads, n_slots, head_dim]; position
  /// n_coded + i lives in slot (window_first_slot + i) % n_slots. ndim 0 when n_window is 0.
  TensorView window_keys;
  TensorView window_values;  ///< same layout as window_keys
  int64_t n_window = 0;           ///< exact tokens after the coded ones (<= n_slots)
  int64_t window_first_slot = 0;  ///< slot of the oldest window token
  /// Coded keys scored as the CUDA kernels with CodebookFormat::I8 score them: the transformed
  /// query q̃ = (q ⊙ λ)·H rounded per row to two int8s, q̃ ≈ s·(hi + lo/254) with s = max |q̃| / 127
  /// (hi the nearest step, lo the remainder's nearest 254th of one), against the decoded keys in
  /// the transformed space (give key_pq those kernels' int8 centroids). Window tokens keep the
  /// exact query.
  bool int8_query = false;
  int64_t n_tokens() const { return key_codes.ndim ? key_codes.dim(2) + n_window : n_window; }
};

/// Validates `in`, q [batch, n_heads, q_len, head_dim] and out (same shape), throwing
/// ShapeError/ValueError that name them. Used by both implementations below.
void check_vecinfer_attention(const VecInferAttentionInputs& in, const TensorView& q,
                              const TensorView& out, const SdpaParams& params);

/// Scalar oracle of attention on codes: dequantizes every coded key (decode, then the inverse
/// transform, in f32 as the codebook holds it) and value, then scores, a plain softmax and the
/// weighted sum in double, positions and masks as attention.h. Window rows are used as stored.
/// A row that sees no key gets zeros.
void vecinfer_attention_ref(const VecInferAttentionInputs& in, const TensorView& q,
                            const TensorView& out, const SdpaParams& params);

/// Optimised CPU attention on codes (query-side LUTs shared by 4 query heads of a GQA group,
/// centroid histograms for values, fp32 softmax per chunk). pool may be null (caller only).
void vecinfer_attention_cpu(const VecInferAttentionInputs& in, const TensorView& q,
                            const TensorView& out, const SdpaParams& params, ThreadPool* pool);

class VecInferKVCache final : public KVCache, public VecInferAccounting {
 public:
  /// Validates the config (config.validate()); builds the quantizers (given codebooks, or
  /// random ones seeded by config.seed — tests only, reported by uses_random_codebooks()).
  explicit VecInferKVCache(const KVCacheConfig& config);
  ~VecInferKVCache() override;

  /// Standard/Stash: returns copies of K̂/V̂ [batch, n_kv_heads, offset, head_dim] in
  /// storage_dtype. MemoryBound: throws UnsupportedError (use update + fused_sdpa).
  std::pair<Tensor, Tensor> update_and_fetch(const TensorView& keys,
                                             const TensorView& values) override;
  void update(const TensorView& keys, const TensorView& values) override;
  /// Throws ValueError when offset > fused_sdpa_max_ctx, ShapeError on query shapes.
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
  /// A new cache rebuilt from state + meta alone (mlx_lm's from_state); n_threads default.
  static std::unique_ptr<VecInferKVCache> from_state(const CacheState& state,
                                                     const CacheMetaState& meta);

  int64_t nbytes() const override;
  std::string class_name() const override { return "VecInferKVCache"; }
  std::string describe() const override;
  const KVCacheConfig& config() const override { return config_; }

  // VecInferAccounting
  int64_t compressed_key_bytes() const override;
  int64_t compressed_value_bytes() const override;
  int64_t fp16_key_bytes() const override;
  int64_t fp16_value_bytes() const override;
  int64_t codebook_bytes() const override;
  double assigned_avg_bits() const override;
  bool uses_random_codebooks() const override { return random_codebooks_; }
  CacheMode mode() const override { return mode_; }

  // Introspection for tests, the CLI and other backends.
  const ProductQuantizer& key_quantizer() const { return key_pq_; }
  const ProductQuantizer& value_quantizer() const { return value_pq_; }
  /// The key/query transform; has n_kv_heads == 0 until n_kv_heads is known.
  const KeyTransform& key_transform() const { return transform_; }
  int64_t residual_count() const { return residual_count_; }
  int64_t capacity() const { return capacity_; }
  /// What the cache's attention sees, f32 [batch, n_kv_heads, offset, head_dim]: window
  /// tokens exact-rounded, older ones dequantized (inverse-transformed keys). In Standard
  /// mode older tokens come from the held fp16 K̂/V̂ (so they are fp16-rounded too).
  Tensor dequantized_keys_f32() const;
  Tensor dequantized_values_f32() const;
  /// Copies of the codes of all tokens, U8 [batch, n_kv_heads, offset, code_bytes].
  /// Stash/MemoryBound only (Standard keeps no codes for older tokens: UnsupportedError).
  Tensor key_codes() const;
  Tensor value_codes() const;
  /// Copies of the exact window, storage_dtype [batch, n_kv_heads, residual_count, head_dim].
  Tensor window_keys() const;
  Tensor window_values() const;
  /// Non-owning views of the cache's codes and window for vecinfer_attention_{ref,cpu}
  /// (Stash/MemoryBound; UnsupportedError in Standard). Invalidated by any update/trim.
  VecInferAttentionInputs attention_inputs() const;
  ThreadPool& pool() const { return *pool_; }

 private:
  Tensor dequantized_f32(bool keys) const;  // the two dequantized_*_f32 above
  Tensor window_rows(bool keys) const;      // window_keys / window_values
  std::optional<CacheState> staged_state_;  // set_state waiting for its set_meta_state
  void check_kv(const TensorView& keys, const TensorView& values) const;
  void append(const TensorView& keys, const TensorView& values);
  void ensure_heads(int n_kv_heads);
  void grow(int64_t needed);
  int64_t window_start() const { return offset_ - residual_count_; }

  KVCacheConfig config_;
  CacheMode mode_ = CacheMode::Standard;
  ProductQuantizer key_pq_;
  ProductQuantizer value_pq_;
  KeyTransform transform_;
  bool random_codebooks_ = false;

  int64_t offset_ = 0;
  int64_t residual_count_ = 0;
  int64_t capacity_ = 0;
  // Standard/Stash: held K̂/V̂, window rows exact.
  Tensor keys_;        // [batch, n_kv_heads, capacity, head_dim] storage_dtype
  Tensor values_;      // [batch, n_kv_heads, capacity, head_dim] storage_dtype
  // Stash/MemoryBound: codes of every token.
  Tensor key_codes_;   // [batch, n_kv_heads, capacity, key_code_bytes] U8
  Tensor value_codes_; // [batch, n_kv_heads, capacity, value_code_bytes] U8
  // Standard: codes of window tokens, ring slot p % residual_length.
  Tensor pending_key_codes_;    // [batch, n_kv_heads, residual_length, key_code_bytes] U8
  Tensor pending_value_codes_;  // [batch, n_kv_heads, residual_length, value_code_bytes] U8
  // MemoryBound: the exact window, ring slot p % residual_length.
  Tensor ring_keys_;    // [batch, n_kv_heads, residual_length, head_dim] storage_dtype
  Tensor ring_values_;  // [batch, n_kv_heads, residual_length, head_dim] storage_dtype
  std::shared_ptr<ThreadPool> pool_;  // config.thread_pool, or its own
  // Candidate-grid searches of sub_dim-4 codebooks of > 1024 centroids (src/cpu/pq_grid_search.h):
  // built once this cache has encoded detail::cpu_grid_build_after() token-heads, then every
  // encode goes through them (same codes; d4b12 keys ~1.8x faster on one thread).
  std::shared_ptr<const detail::GridSearch> key_grid_, value_grid_;
  // The codebooks prepared for the nearest-centroid scan (pq_internal.h), kept so a decode
  // step's encode does not re-prepare them; rebuilt wherever key_pq_ / value_pq_ change.
  std::shared_ptr<const detail::PreparedCentroids> key_prep_, value_prep_;
  int64_t encoded_token_heads_ = 0;  // counted towards that threshold
  bool grids_tried_ = false;
};

}  // namespace veloxquant
