// veloxquant/cache.h — KV caches speaking mlx_lm's cache protocol.
//
//   KVCache          the interface: update_and_fetch, update, fused_sdpa, trim, state, ...
//   FP16KVCache      the baseline: fp16 (or bf16) storage growing in steps, like mlx_lm's
//   VecInferKVCache  smooth + Hadamard on keys, product VQ of keys and values, attention on
//                    the codes, an fp16 window of the most recent residual_length tokens
//   KVCacheFactory   builds either from a KVCacheConfig (CPU, or CUDA where built)
//
// Shapes: keys/values [batch, n_kv_heads, n_tokens, head_dim]; queries
// [batch, n_heads, q_len, head_dim]. Inputs may be f16, bf16 or f32 with any strides.
// Every method validates its inputs before it changes anything: a call that throws leaves the
// cache exactly as it was.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "veloxquant/attention.h"
#include "veloxquant/pq.h"
#include "veloxquant/smooth.h"

namespace veloxquant {
class ThreadPool;
}
#include "veloxquant/tensor.h"

namespace veloxquant {

/// The three behaviours of the original VecInferKVCache, chosen by the two fused_sdpa flags.
enum class CacheMode {
  Standard,     ///< quantize+dequantize on the way in; hold and return fp16 K̂, V̂
  Stash,        ///< Standard, plus the packed codes kept for fused_sdpa
  MemoryBound,  ///< only packed codes + the fp16 residual window are held; no fetch
};
const char* cache_mode_name(CacheMode m);

enum class CacheKind { FP16, VecInfer };

/// Precision of the codebooks a CUDA cache's attention kernel reads from shared memory (the
/// CPU caches, encoding and fetching always use the f32 codebooks and ignore it).
///  * F16: centroids rounded to fp16 (relative error <= 2^-11).
///  * E4M3: centroids stored as OCP FP8 E4M3 after a power-of-two scale per codebook (relative
///    error <= 2^-4): a shared-memory gather moves half the bytes, the kernel's bottleneck.
///    What it costs in attention error is measured in docs/cuda-kernels.md ("E4M3 codebooks").
///  * I8 (the default): key centroids as int8 with one scale per codebook (max |c| / 127) and
///    scored on int8 tensor cores against the transformed query held as two int8s per element
///    (q̃ ≈ s·(hi + lo/254), s = max |q̃| / 127, per row); values stay fp16. A key gather moves
///    half the bytes and needs no conversion. With KVCacheConfig::int8_key_grid (the default)
///    the int8 centroids are the cache's own, so the scores are exact in int32 up to the query's
///    1/508-step rounding: closer to the CPU cache than F16 (docs/cuda-kernels.md, "Int8 keys").
///    Without the grid (or with one int8 for the query, before 2026-12-03) the two roundings
///    moved tiny Qwen2/Qwen3 test models' logits 9-16% (run 82).
///  * I8KV: keys as I8, and the value centroids as int8 with one scale per codebook too
///    (max |c| / 127), widened exactly to fp16 in registers for the value MMAs (probabilities
///    stay fp16): a value gather moves half the bytes as well. docs/cuda-kernels.md ("Int8
///    keys and values").
enum class CodebookFormat { F16, E4M3, I8, I8KV };
const char* codebook_format_name(CodebookFormat f);  ///< "f16", "e4m3", "i8", "i8kv"
/// The format named "f16", "e4m3", "i8" or "i8kv"; ValueError naming the choices otherwise.
CodebookFormat parse_codebook_format(const std::string& name);

/// Configuration with the original's fields. Defaults follow the original / the paper.
struct KVCacheConfig {
  CacheKind kind = CacheKind::VecInfer;
  int head_dim = 128;
  int n_kv_heads = 0;             ///< 0: taken from smooth_factors, else from the first update
  int key_codebook_bits = 12;
  int value_codebook_bits = 8;
  int key_sub_dim = 4;
  int value_sub_dim = 8;
  /// λ, [n_kv_heads, head_dim] f32; empty optional = identity scaling.
  std::optional<std::vector<float>> smooth_factors;
  /// [2^key_codebook_bits, key_sub_dim]; empty = random initialisation (tests only: the
  /// cache reports uses_random_codebooks() and its description says so).
  std::optional<std::vector<float>> key_codebook;
  std::optional<std::vector<float>> value_codebook;
  bool use_hadamard = true;             ///< false: the "VQ without transforms" ablation
  bool fused_sdpa = false;              ///< keep codes for fused_sdpa (Stash)
  bool fused_sdpa_memory_bound = false; ///< hold only codes + residual (MemoryBound)
  int64_t fused_sdpa_max_ctx = 1 << 20; ///< fused_sdpa refuses longer contexts (ValueError)
  uint64_t seed = 0;                    ///< for random codebooks
  int residual_length = 128;            ///< most recent tokens kept exact in fp16 (0: none)
  DType storage_dtype = DType::F16;     ///< dtype of fetched/held fp16 parts (F16 or BF16)
  int64_t step = 256;                   ///< growth granularity in tokens, as mlx_lm
  int n_threads = 0;                    ///< CPU threads; 0: hardware concurrency
  /// A CPU thread pool to share (e.g. one for every layer of a model, or the model's own);
  /// null: the cache makes its own pool of n_threads. Concurrent calls on a shared pool are
  /// serialised (thread_pool.h), so sharing is safe but gives no parallelism across callers.
  std::shared_ptr<ThreadPool> thread_pool;
  Device device{};                      ///< CPU, or CUDA (builds with CUDA only)
  void* stream = nullptr;               ///< cudaStream_t for CUDA caches (opaque); null = default
  /// The key codebook moved onto an int8 grid at construction (snap_to_int8_grid: one scale
  /// per codebook, each entry within half a step of where it was), on every device, so that the
  /// CUDA kernels' int8 key scoring (CodebookFormat::I8, the default) reads exactly the centroids
  /// the CPU cache encodes and decodes with. false keeps the codebook as given (the CUDA int8
  /// formats then round it per call, as before 2026-12-03). On the CPU it makes the 10- and
  /// 12-bit key scores gather int8 rows (ProductQuantizer::codebook_i8; a d4b12 codebook in
  /// 16 KiB instead of 64). Recorded in meta_state.
  bool int8_key_grid = true;
  /// CUDA VecInfer caches: the codebooks fused_sdpa reads (see CodebookFormat).
  CodebookFormat attention_codebooks = CodebookFormat::I8;

  CacheMode mode() const;
  PQSpec key_spec() const { return {key_sub_dim, key_codebook_bits}; }
  PQSpec value_spec() const { return {value_sub_dim, value_codebook_bits}; }
  /// Throws ValueError/ShapeError naming the offending field (bits outside 1..16, head_dim not
  /// divisible by sub_dim, codebook or smooth-factor sizes that do not fit, ...).
  void validate() const;
};

/// Tensors of a cache's state, by name (mlx_lm's `state`), and string metadata (`meta_state`).
using CacheState = std::vector<std::pair<std::string, Tensor>>;
using CacheMetaState = std::map<std::string, std::string>;

/// The cache protocol (mlx_lm's _BaseCache).
class KVCache {
 public:
  virtual ~KVCache() = default;

  /// Appends keys/values [batch, n_kv_heads, n_new, head_dim] and returns the whole history
  /// [batch, n_kv_heads, offset, head_dim] in storage_dtype. Throws UnsupportedError in
  /// memory-bound mode (nothing there to fetch: use update + fused_sdpa).
  virtual std::pair<Tensor, Tensor> update_and_fetch(const TensorView& keys,
                                                     const TensorView& values) = 0;
  /// Appends without fetching (every mode).
  virtual void update(const TensorView& keys, const TensorView& values) = 0;
  /// Attention of queries [batch, n_heads, q_len, head_dim] against everything held, from
  /// the cache's own representation (codes for VecInfer). Output has the queries' dtype.
  virtual Tensor fused_sdpa(const TensorView& queries, const SdpaParams& params) const = 0;
  /// Writes the output into `out` [batch, n_heads, q_len, head_dim] instead of allocating.
  virtual void fused_sdpa_into(const TensorView& queries, const TensorView& out,
                               const SdpaParams& params) const = 0;

  virtual int64_t offset() const = 0;          ///< tokens held
  int64_t size() const { return offset(); }
  bool empty() const { return offset() == 0; }
  virtual bool is_trimmable() const { return true; }
  /// Drops the newest min(n, offset) tokens; returns how many were dropped.
  virtual int64_t trim(int64_t n) = 0;

  virtual CacheState state() const = 0;
  virtual void set_state(const CacheState& state) = 0;
  virtual CacheMetaState meta_state() const = 0;
  virtual void set_meta_state(const CacheMetaState& meta) = 0;
  /// Restores both at once (validating both before changing anything).
  virtual void restore(const CacheState& state, const CacheMetaState& meta) = 0;

  /// Bytes actually held (capacity slack included).
  virtual int64_t nbytes() const = 0;
  /// Batching is not supported yet: always throws UnsupportedError.
  virtual void merge(const std::vector<const KVCache*>& others);
  virtual std::string class_name() const = 0;  ///< "KVCache", "VecInferKVCache"
  virtual std::string describe() const = 0;    ///< one human line
  virtual const KVCacheConfig& config() const = 0;
  int64_t batch() const { return batch_; }
  int n_kv_heads() const { return n_kv_heads_; }

 protected:
  int64_t batch_ = 0;   // fixed by the first update
  int n_kv_heads_ = 0;  // fixed by config or the first update
};

/// Byte accounting specific to VecInfer (also implemented by the CUDA cache).
class VecInferAccounting {
 public:
  virtual ~VecInferAccounting() = default;
  virtual int64_t compressed_key_bytes() const = 0;    ///< packed key codes of tokens held
  virtual int64_t compressed_value_bytes() const = 0;
  virtual int64_t fp16_key_bytes() const = 0;          ///< fp16 keys held (window or full K̂)
  virtual int64_t fp16_value_bytes() const = 0;
  virtual int64_t codebook_bytes() const = 0;          ///< codebooks + smooth factors, as held
  /// Bits per K/V element assigned by the codebooks: (key_bits/key_sub_dim +
  /// value_bits/value_sub_dim) / 2 (the paper's count: no codebooks, no residual).
  virtual double assigned_avg_bits() const = 0;
  virtual bool uses_random_codebooks() const = 0;
  virtual CacheMode mode() const = 0;
};

class FP16KVCache;
class VecInferKVCache;

struct KVCacheFactory {
  /// Builds a cache of config.kind on config.device (validates the config first).
  static std::unique_ptr<KVCache> create(const KVCacheConfig& config);
};

/// Default number of CPU threads (hardware concurrency, at least 1).
int default_threads();

}  // namespace veloxquant
