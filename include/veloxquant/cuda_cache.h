// veloxquant/cuda_cache.h — the device-resident caches (builds with CUDA) and their batched,
// graph-capturable decode step. No CUDA header: streams are opaque (a cudaStream_t as void*).
//
// KVCacheFactory::create(config) with config.device = Device::cuda(i) returns one of these
// (kind FP16 or VecInfer); dynamic_cast<CudaKVCache*> reaches the extra API below. Both speak
// the whole KVCache protocol with the CPU caches' semantics, state() and meta_state() (same
// tensor names, layouts and meta keys, so a state saved from one restores into the other):
//   update / update_and_fetch / fused_sdpa   inputs may be CUDA tensors on the cache's device
//                                            (the normal case) or CPU tensors (copied over);
//                                            outputs live where the queries live
//   trim, state, restore, nbytes, ...        as FP16KVCache / VecInferKVCache
// Work is queued on config.stream (null: the legacy default stream); host-path calls that
// return tensors synchronise that stream.
//
// Ragged batches. Every sequence b of the batch has its own length (device array
// seq_len[b], host mirror seq_lens()). update() appends n tokens to every sequence at its own
// length; attention masks each sequence at its own length (queries are its newest tokens).
// state(), update_and_fetch() and offset() need equal lengths (offset() returns the longest).
//
// Graph capture. decode_step() appends one step's tokens and attends, launching only kernels
// (no allocation, no host synchronisation, lengths read and advanced on the device), so it can
// be captured in a CUDA graph and replayed: call reserve() and plan_decode() first (they
// allocate), then capture. After replays, sync_seq_lens() refreshes the host mirror (or
// advance_seq_lens(n), for a caller that counts its n replays: no copy back); capture_key()
// changes when the captured step would no longer replay (runtime::CudaModel's decode graphs).
//
// Overlapped steps. In MemoryBound mode with residual_length >= q_len (the step's tokens land in
// the exact window, so this step's attention reads none of their codes), decode_step writes the
// new window rows first and then runs the tokens' encode on the cache's own side streams
// (non-blocking, forked from and joined back into config.stream through events) beside the
// attention launch: a captured step is a graph with two branches that ends joined. Attention
// is launched at the device's highest block-dispatch priority; a graph keeps that as its node's
// priority, which CUDA applies when the graph is instantiated with
// cudaGraphInstantiateFlagUseNodePriority. Other modes, and shorter windows, run the encode
// first and attention after it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "veloxquant/cache.h"

namespace veloxquant {

/// True when this build has CUDA and at least one device is visible.
bool cuda_is_available();

/// What this build runs on a CUDA device for a cache configuration, answered on the host before
/// anything is allocated, with or without a GPU. KVCacheFactory::create on a CUDA device refuses
/// (UnsupportedError, the same message as `reason`) exactly the configurations reported with
/// cache == false; nothing a CUDA cache does falls back to the CPU.
struct CudaSupport {
  bool built = false;           ///< this build has the CUDA backend
  int devices = 0;              ///< CUDA devices visible now (0 without a GPU or driver)
  bool cache = false;           ///< the cache can be built (config valid, head_dim, specs, kernel)
  /// fused_sdpa and decode_step have their kernel. Differs from `cache` only for the fp16 cache
  /// and the standard mode, which attend over fp16 rows through d4b8/d4b8's kernel and are built
  /// without it (update_and_fetch works; fused_sdpa would raise `reason`).
  bool attention = false;
  bool prefill_kernel = false;  ///< q_len > 16 has the prefill kernel (else the decode kernel in row chunks)
  /// q_len > 16 chunks whose blocks fill the GPU attend over the held tokens expanded once into
  /// exact rows (memory-bound VecInfer caches, while set_cuda_prefill_workspace_limit is above 0
  /// and the workspace fits it; see there). Stash caches also attend over rows, the ones they
  /// hold (no workspace), where those agree with the decode kernel's centroids (fp16 codebooks,
  /// int8 ones on their grid); this flag does not cover them (that depends on the codebooks)
  bool prefill_over_rows = false;
  /// `kernel` is a tuned kernel of this build (cuda_attention_configs lists those); false: the
  /// plain kernel, which serves every other d4/d8 configuration of 4 to 12 bits, slower
  bool tuned_kernel = false;
  std::string kernel;           ///< the decode attention configuration, e.g. "d4b12/d8b8@128+i8"
  std::string reason;           ///< why `cache` or `attention` is false (the error the call raises)
};
/// See CudaSupport. The answer is the build's: config.device is ignored, and a device found at
/// run time to lack something (an sm_90 kernel on an older GPU, a shared-memory layout it cannot
/// place) still fails there, with a CudaError or UnsupportedError. An invalid config is
/// reported (reason "invalid configuration: ..."), not thrown.
CudaSupport cuda_support(const KVCacheConfig& config);
/// The decode-attention configurations this build compiled tuned kernels for, as
/// "d4b8/d4b8@128+i8" (key spec / value spec @ head_dim + codebook format: none fp16, e4m3, i8,
/// i8kv), sorted; empty without CUDA. The default build tunes d4b8/d4b8 and d4b12/d8b8 at head_dim
/// 64 and 128; -DVQ_CUDA_ALL_CONFIGS=ON adds d8b12/d8b12, d4b10/d8b12, d8b8/d8b8 and head_dim 256.
/// Not listed: every other configuration of sub_dim 4 or 8 and 4- to 12-bit codebooks, in every
/// codebook format, at head_dim 64, 80, 96, 112, 128, 160, 192 and 256 (Phi-2, StableLM, Phi-3,
/// MPT-30B, StableLM-2-12B, Gemma), which every build runs on one plain kernel
/// (src/cuda/attention_any_dim_kernel.cuh), slower than the tuned ones.
/// Prompts at 80 and 96 run on the exact-rows prefill kernel over rows (the fp16 cache's and the
/// standard mode's; a memory-bound cache's tokens expanded into rows, a Stash cache's held rows);
/// elsewhere, and at 112-192, as the plain kernel's row chunks.
std::vector<std::string> cuda_attention_configs();

/// Prefill over dequantized rows. An eager fused_sdpa of more than 16 queries (a prompt chunk)
/// on a memory-bound VecInfer cache on the device first writes the tokens it holds once as
/// exact rows (storage dtype; codes dequantized, keys inverse-transformed, window rows as held)
/// into a transient workspace of 2 · batch · n_kv_heads · tokens · head_dim · 2 bytes, then
/// attends over those rows with the prefill kernel, where attending over the codes directly
/// would dequantize every tile once per block of 128 query rows. The workspace comes from a
/// stream-ordered memory pool per device that keeps up to `bytes` reserved between calls (so a
/// model's layers and the next chunk reuse it); a call that would need more attends over the
/// codes. Default 1 GiB; 0 turns the path off and releases the pool's memory. Returns the
/// previous limit (negative limits throw ValueError). Decode steps and graph captures never use
/// it (a Stash cache's chunk attends over the dequantized rows it holds, without a workspace,
/// where they agree with the decode kernel's centroids: fp16 codebooks, or int8 ones on their
/// grid). The same pool and limit also serve a prefill chunk over exact rows (any device cache:
/// the fp16 cache, Standard caches, the rows above) whose grid is too small to fill the GPU but
/// whose history is long: its attention is split over the history, the partial results
/// (2-4 · batch · n_heads · chunk · (head_dim + 2) floats) held here until merged; without room,
/// the chunk attends unsplit. A build without CUDA ignores the limit and reads 0.
int64_t set_cuda_prefill_workspace_limit(int64_t bytes);
int64_t cuda_prefill_workspace_limit();

/// The extra API of the CUDA caches (both kinds).
class CudaKVCache : public KVCache {
 public:
  /// Grows every buffer to hold `max_tokens` tokens per sequence now (batch and n_kv_heads must
  /// be known: from the config or a first update, or give them here when still unknown).
  virtual void reserve(int64_t max_tokens, int64_t batch = 0) = 0;
  int64_t capacity() const { return capacity_; }

  /// Plans decode attention for `n_heads` query heads and q_len query rows per step, sized for
  /// contexts around `typical_len` tokens: split count and workspace (allocated here).
  virtual void plan_decode(int n_heads, int q_len, int64_t typical_len) = 0;

  /// Appends k_new/v_new [batch, n_kv_heads, q_len, head_dim] at each sequence's own length and
  /// writes out [batch, n_heads, q_len, head_dim] = attention of q [batch, n_heads, q_len,
  /// head_dim] (the newest q_len positions) over everything held. All four are CUDA tensors on
  /// the cache's device (any float dtype, any strides). Needs reserve() and plan_decode(); does
  /// not check lengths against the capacity on the host (kernels flag an overflow instead:
  /// device_error()). Validates shapes on the host without touching the device.
  virtual void decode_step(const TensorView& q, const TensorView& k_new, const TensorView& v_new,
                           const TensorView& out, const SdpaParams& params) = 0;
  /// Raw-pointer form of decode_step for contiguous tensors of one dtype (F16, BF16 or F32):
  /// q and out [batch, n_heads, q_len, head_dim], k_new and v_new [batch, n_kv_heads, q_len,
  /// head_dim].
  virtual void decode_step_raw(const void* q, const void* k_new, const void* v_new, void* out, DType dtype,
                               int n_heads, int q_len, const SdpaParams& params) = 0;

  /// Sets per-sequence lengths (each <= the current longest; shortening drops tokens like
  /// trim, per sequence).
  virtual void set_seq_lens(const std::vector<int64_t>& lens) = 0;
  /// Host mirror of the per-sequence lengths.
  const std::vector<int64_t>& seq_lens() const { return lens_; }
  /// Re-reads the lengths from the device (after graph replays); synchronises the stream.
  virtual void sync_seq_lens() = 0;
  /// The device array of lengths, I32 [batch] (decode steps read and advance it).
  virtual int32_t* device_seq_lens() const = 0;
  /// After `steps` replays of a captured decode_step (q_len tokens each, as planned), advances
  /// the host mirror of the lengths (and of the window counts) as those steps did on the
  /// device, without copying them back: the cheap form of sync_seq_lens() for a caller that
  /// counts its own replays. It reads the steps' input-check verdict first (check_inputs: one
  /// stream synchronisation; no copy where mapped host memory is available): a failed step
  /// raises as sync_seq_lens() does, with the mirror reset to the device's lengths. The caller
  /// answers for the count: a wrong one leaves a wrong mirror (sync_seq_lens() repairs it).
  virtual void advance_seq_lens(int64_t steps) = 0;
  /// A value that changes whenever a decode step captured earlier would no longer replay on
  /// this cache as it is now: a device buffer the step reads or writes was reallocated (reserve,
  /// growth, a larger attention workspace, restore), the plan (plan_decode) or the capacity
  /// changed, the step's launch settings changed, or this is another cache object (each has a
  /// serial of its own). Read it right after capturing; capture again when it differs.
  virtual uint64_t capture_key() const = 0;

  /// Deferred input checks (off by default). update() with device inputs must throw before it
  /// changes the cache when keys or values hold a non-finite value (or one beyond the storage
  /// dtype's range), so it waits for its range check: one stream synchronisation per call,
  /// which keeps a host that queues a model's layers (update, attention, the next layer's
  /// products) from running ahead of the device. With deferred checks on, update() queues the
  /// range check and its own kernels without waiting; a failed check makes that update and every
  /// later update() a no-op on the device (nothing written, lengths unchanged), and the error is
  /// raised, as the same ValueError naming the call's shape, by check_inputs() or by the next
  /// call that waits for the stream anyway (synchronize, device_error, sync_seq_lens, state,
  /// meta_state, trim, set_seq_lens, update_and_fetch, decode_step, a fused_sdpa into host
  /// memory, turning deferred checks off), or by the next update() once the failure has reached
  /// the host (no wait); the verdict also resets the host's length mirror to what the
  /// device holds: the cache is then exactly as it was before the failed update. Attention
  /// calls queued in between read the cache without the updates that were not applied. Shape
  /// errors, CPU inputs, and an update that fixes the batch and head count (the first one) are
  /// still checked at the call. decode_step() refuses to capture while deferred updates are
  /// unverified (call check_inputs() before capturing).
  ///
  /// decode_step() checks its k_new/v_new the deferred way whether or not deferred checks are on
  /// (it never waits, so that it can be captured): one small range-check launch before the
  /// step's kernels, which write nothing and advance no length when it fails; every later
  /// update() and decode step (eager or replayed) is then a no-op on the cache too, and their
  /// attention outputs are unspecified. The ValueError ("a decode step's input check failed",
  /// naming k_new or v_new) is raised by check_inputs() or the next call that waits for the
  /// stream (as above; also sync_seq_lens() after graph replays, and an update() with immediate
  /// checks, which verifies earlier steps first); it resets the host's length mirror to the
  /// device's, so the cache is exactly as it was before the failed step. Once a step has been
  /// captured, its replays may fail at any time: every such call then reads the flags.
  virtual void set_deferred_checks(bool on) = 0;
  bool deferred_checks() const { return deferred_; }
  /// Waits for the stream and raises the first failed deferred check, if any (see above).
  virtual void check_inputs() = 0;

  /// Whether a kernel found a position beyond the capacity (synchronises; clears the flag).
  virtual bool device_error() = 0;
  /// Waits for the cache's stream.
  virtual void synchronize() const = 0;
  void* stream() const { return stream_; }
  Device device() const { return device_; }

 protected:
  std::vector<int64_t> lens_;  // host mirror, [batch]
  bool deferred_ = false;
  int64_t capacity_ = 0;
  void* stream_ = nullptr;
  Device device_{};
};

}  // namespace veloxquant
