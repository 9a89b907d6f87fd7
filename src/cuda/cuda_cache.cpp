// src/cuda/cuda_cache.cpp — the device-resident FP16 and VecInfer caches (cuda_cache.h).
//
// Device buffers (B = batch, H = n_kv_heads, cap = capacity, R = residual_length,
// rs = code row stride = round_up(code_bytes, 4)):
//   held_k_, held_v_     [B, H, cap, D] storage dtype   FP16 cache; VecInfer Standard/Stash
//                        (window tokens exact, older ones dequantized, as the CPU cache)
//   codes_k_, codes_v_   [B, H, cap, rs] u8 (+ slack)   VecInfer Stash/MemoryBound
//   pend_k_, pend_v_     [B, H, R, rs] u8, ring         VecInfer Standard (codes of window tokens)
//   ring_k_, ring_v_     [B, H, R, D] storage, ring     VecInfer MemoryBound (the exact window)
//   len_, rc_            I32 [B]                        per-sequence lengths / window counts
// The CPU caches' semantics hold token for token (vecinfer_cache.h): every update encodes its
// tokens, tokens leaving the window get dequantized rows (Standard/Stash), trim only moves
// counters. state()/meta_state() produce the CPU caches' tensors and keys, and restore()
// validates through the CPU caches' own from_state before anything here changes.
//
// Host-path calls (update, fused_sdpa, trim, state, ...) validate, allocate, then launch; a
// call that throws before its launches leaves the cache as it was. decode_step only launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>

#include "core/attention_internal.h"
#include "core/cuda_hooks.h"
#include "cpu/cache_common.h"
#include "cuda/encode_grid.h"
#include "cuda/kernels.h"
#include "cuda/support.h"
#include "veloxquant/cuda_cache.h"
#include "veloxquant/error.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/hadamard.h"
#include "veloxquant/vecinfer_cache.h"

#define VQ_CU(expr)                                                                                 \
  do {                                                                                              \
    const cudaError_t vq_e_ = (expr);                                                               \
    if (vq_e_ != cudaSuccess)                                                                       \
      VQ_THROW(CudaError, #expr << " failed: " << cudaGetErrorString(vq_e_) << " (" << __FILE__ << ":" \
                                << __LINE__ << ")");                                                \
  } while (0)

namespace veloxquant {

namespace cuda {
namespace {
std::atomic<bool> g_overlap_allowed{true};
std::atomic<long long> g_overlapped_steps{0};
std::atomic<int> g_update_decode_max{256};
std::atomic<bool> g_overlap_two{true};
std::atomic<int64_t> g_grid_build_after{int64_t(1) << 20};
std::atomic<bool> g_step_checks{true};
std::atomic<int> g_prefill_launch_queries{0};
}  // namespace
bool set_overlapped_step(bool allowed) { return g_overlap_allowed.exchange(allowed); }
bool overlapped_step_allowed() { return g_overlap_allowed.load(); }
void note_overlapped_step() { g_overlapped_steps.fetch_add(1); }
long long overlapped_steps() { return g_overlapped_steps.load(); }
int set_update_decode_max(int token_heads) { return g_update_decode_max.exchange(token_heads); }
int update_decode_max() { return g_update_decode_max.load(); }
bool set_overlap_two_launches(bool allowed) { return g_overlap_two.exchange(allowed); }
bool overlap_two_launches() { return g_overlap_two.load(); }
int64_t set_grid_build_after(int64_t token_heads) { return g_grid_build_after.exchange(token_heads); }
int64_t grid_build_after() { return g_grid_build_after.load(); }
bool set_step_input_checks(bool on) { return g_step_checks.exchange(on); }
bool step_input_checks() { return g_step_checks.load(); }
int set_prefill_launch_queries(int queries) { return g_prefill_launch_queries.exchange(std::max(0, queries)); }
int prefill_launch_queries() { return g_prefill_launch_queries.load(); }
}  // namespace cuda

bool cuda_is_available() { return detail::cuda_available(); }

namespace {

using cuda::DevTensor4;
using detail::round_up;

/// A new serial for a device cache object (CudaKVCache::capture_key), never 0.
uint64_t next_cache_serial() {
  static std::atomic<uint64_t> serial{0};
  return serial.fetch_add(1) + 1;
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    VQ_CU(cudaGetDevice(&prev_));
    if (prev_ != dev) VQ_CU(cudaSetDevice(dev));
    dev_ = dev;
  }
  ~DeviceGuard() {
    if (prev_ != dev_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0, dev_ = 0;
};

DevTensor4 dev4(const TensorView& v) {
  DevTensor4 t;
  t.data = v.data;
  t.dtype = v.dtype;
  for (int i = 0; i < 4; ++i) t.stride[i] = v.strides[i];
  return t;
}

cudaStream_t cs(void* s) { return static_cast<cudaStream_t>(s); }

/// A device view of `v`: v itself when it lives on `dev`, else a device copy of a CPU tensor.
struct Staged {
  Tensor keep;
  TensorView view;
};
Staged stage(const TensorView& v, Device dev, const char* what) {
  if (v.device == dev) return {Tensor{}, v};
  VQ_CHECK_SHAPE(v.device.is_cpu(), what << ": on " << device_name(v.device) << ", the cache lives on "
                                         << device_name(dev));
  Tensor d = Tensor::copy_to(v, dev);
  return {d, d.view()};
}

/// Copies n_rows rows (row_bytes each) starting at first_row of each of n_blocks blocks of
/// src_rows rows (pitch src_pitch bytes) into a contiguous [n_blocks, n_rows, row_bytes] buffer.
void copy_rows_2d(void* dst, size_t dst_row_pitch, int64_t dst_rows_per_block, int64_t dst_first, const void* src,
                  size_t src_row_pitch, int64_t src_rows_per_block, int64_t src_first, int64_t n_blocks,
                  int64_t n_rows, size_t row_bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (n_rows <= 0 || n_blocks <= 0) return;
  if (dst_rows_per_block * dst_row_pitch == size_t(n_rows) * dst_row_pitch &&
      src_rows_per_block * src_row_pitch == size_t(n_rows) * src_row_pitch && dst_row_pitch == row_bytes &&
      src_row_pitch == row_bytes && dst_first == 0 && src_first == 0) {
    VQ_CU(cudaMemcpyAsync(dst, src, size_t(n_blocks * n_rows) * row_bytes, kind, s));
    return;
  }
  if (dst_row_pitch == row_bytes && src_row_pitch == row_bytes) {
    // whole row runs per block: one 2D copy, blocks as rows
    VQ_CU(cudaMemcpy2DAsync(static_cast<char*>(dst) + dst_first * row_bytes, dst_rows_per_block * row_bytes,
                            static_cast<const char*>(src) + src_first * row_bytes, src_rows_per_block * row_bytes,
                            size_t(n_rows) * row_bytes, size_t(n_blocks), kind, s));
    return;
  }
  for (int64_t bh = 0; bh < n_blocks; ++bh)
    VQ_CU(cudaMemcpy2DAsync(static_cast<char*>(dst) + (bh * dst_rows_per_block + dst_first) * dst_row_pitch,
                            dst_row_pitch,
                            static_cast<const char*>(src) + (bh * src_rows_per_block + src_first) * src_row_pitch,
                            src_row_pitch, row_bytes, size_t(n_rows), kind, s));
}

std::vector<uint16_t> to_half_bits(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = float_to_half(x[i]);
  return h;
}

/// Whether every element of a is within fp16 rounding (2^-11 of the largest magnitude) of b's.
bool within_fp16(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  float big = 0.0f;
  for (float x : b) big = std::max(big, std::fabs(x));
  const float tol = big * (1.0f / 2048.0f);
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= tol)) return false;
  return true;
}

Tensor upload_f32(const std::vector<float>& x, const Shape& shape, Device dev) {
  Tensor t = Tensor::empty(shape, DType::F32, dev);
  if (!x.empty()) detail::cuda_memcpy_h2d(t.data(), x.data(), x.size() * sizeof(float), dev);
  return t;
}

Tensor upload_u16(const std::vector<uint16_t>& x, const Shape& shape, Device dev) {
  Tensor t = Tensor::empty(shape, DType::U16, dev);
  if (!x.empty()) detail::cuda_memcpy_h2d(t.data(), x.data(), x.size() * sizeof(uint16_t), dev);
  return t;
}

Tensor upload_u8(const std::vector<uint8_t>& x, const Shape& shape, Device dev) {
  Tensor t = Tensor::empty(shape, DType::U8, dev);
  if (!x.empty()) detail::cuda_memcpy_h2d(t.data(), x.data(), x.size(), dev);
  return t;
}

/// An owning U8 device buffer of `bytes` plus slack (the kernels read whole words past a row
/// end and L2 prefetches round ranges up to 16 bytes).
Tensor code_buffer(int64_t bytes, Device dev) {
  Tensor t = Tensor::empty({bytes + 256}, DType::U8, dev);
  detail::cuda_memset(t.data(), 0, size_t(bytes + 256), dev);
  return t;
}

// ------------------------------------------------------------------------------------------
// What both caches share: lengths, stream, plan, workspace, the attention runner.
// ------------------------------------------------------------------------------------------
class CudaCacheBase : public CudaKVCache {
 public:
  explicit CudaCacheBase(const KVCacheConfig& c) : config_(c) {
    VQ_CHECK_VALUE(c.device.is_cuda(), "CUDA cache: config.device must be a CUDA device, got " << device_name(c.device));
    VQ_CHECK_T(detail::cuda_available(), CudaError, "CUDA cache: no CUDA device is present");
    int n = 0;
    VQ_CU(cudaGetDeviceCount(&n));
    VQ_CHECK_VALUE(c.device.index >= 0 && c.device.index < n,
                   "CUDA cache: device " << device_name(c.device) << " does not exist (" << n << " devices)");
    device_ = c.device;
    stream_ = c.stream;
    DeviceGuard g(device_.index);
    n_sms_ = cuda::device_sms(device_.index);
    err_ = Tensor::zeros({1}, DType::I32, device_);
    chk_ = Tensor::zeros({2}, DType::I32, device_);  // [keys, values] range flags
    done_ = Tensor::zeros({1}, DType::I32, device_);
    serial_ = next_cache_serial();
  }

  const KVCacheConfig& config() const override { return config_; }
  int64_t offset() const override {
    int64_t m = 0;
    for (int64_t l : lens_) m = std::max(m, l);
    return m;
  }
  ~CudaCacheBase() override {
    if (host_chk_) {
      DeviceGuard g(device_.index);
      // a range check queued since the last verdict may still write the words (the cache's
      // stream may be gone already: the device is waited for, not the stream)
      if (!pending_.empty()) cudaDeviceSynchronize();
      cudaFreeHost(host_chk_);
    }
  }
  CudaCacheBase(const CudaCacheBase&) = delete;
  CudaCacheBase& operator=(const CudaCacheBase&) = delete;

  void synchronize() const override {
    wait();
    collect_deferred("KVCache::synchronize (cuda)");
  }
  void set_deferred_checks(bool on) override {
    DeviceGuard g(device_.index);
    if (!on) {
      deferred_ = false;  // (also when the pending verdict below raises)
      collect_deferred("KVCache::set_deferred_checks (cuda)");
      return;
    }
    if (!host_chk_) {
      // the failing check also writes mapped host words, so a clean verdict costs the host one
      // read after a synchronisation it makes anyway (no copy); without mappable host memory
      // the verdict is copied back
      int can_map = 0;
      VQ_CU(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, device_.index));
      void* h = nullptr;
      if (can_map && cudaHostAlloc(&h, 2 * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess) {
        void* d = nullptr;
        if (cudaHostGetDevicePointer(&d, h, 0) == cudaSuccess) {
          host_chk_ = static_cast<int*>(h);
          host_chk_dev_ = static_cast<int*>(d);
          host_chk_[0] = host_chk_[1] = 0;
        } else {
          cudaFreeHost(h);
        }
      }
      (void)cudaGetLastError();  // (a refused mapping only means the copy-back path)
    }
    deferred_ = true;
  }
  void check_inputs() override { collect_deferred("KVCache::check_inputs (cuda)"); }
  bool device_error() override {
    DeviceGuard g(device_.index);
    collect_deferred("KVCache::device_error (cuda)");
    int32_t e = 0;
    VQ_CU(cudaMemcpy(&e, err_.data(), 4, cudaMemcpyDeviceToHost));
    if (e) VQ_CU(cudaMemset(err_.data(), 0, 4));
    return e != 0;
  }
  int32_t* device_seq_lens() const override { return len_.defined() ? len_.ptr<int32_t>() : nullptr; }
  void sync_seq_lens() override {
    collect_deferred("KVCache::sync_seq_lens (cuda)");
    if (!len_.defined()) return;
    DeviceGuard g(device_.index);
    VQ_CU(cudaStreamSynchronize(cs(stream_)));
    std::vector<int32_t> l(static_cast<size_t>(batch_)), r(static_cast<size_t>(batch_));
    VQ_CU(cudaMemcpy(l.data(), len_.data(), l.size() * 4, cudaMemcpyDeviceToHost));
    if (rc_.defined()) VQ_CU(cudaMemcpy(r.data(), rc_.data(), r.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t b = 0; b < batch_; ++b) {
      lens_[size_t(b)] = l[size_t(b)];
      if (rc_.defined()) rch_[size_t(b)] = r[size_t(b)];
    }
  }

  /// Whether the device's sequence lengths equal the host's mirror (waits for the stream; one
  /// small copy): after a captured step, replays move the device's without a host call.
  bool device_lengths_are_host_ones() const {
    if (!len_.defined()) return true;
    DeviceGuard g(device_.index);
    VQ_CU(cudaStreamSynchronize(cs(stream_)));
    std::vector<int32_t> l(static_cast<size_t>(batch_));
    VQ_CU(cudaMemcpy(l.data(), len_.data(), l.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t b = 0; b < batch_; ++b)
      if (int64_t(l[size_t(b)]) != lens_[size_t(b)]) return false;
    return true;
  }

  void advance_seq_lens(int64_t steps) override {
    VQ_CHECK_VALUE(steps >= 0, "advance_seq_lens: steps must be >= 0, got " << steps);
    VQ_CHECK_VALUE(steps == 0 || plan_.valid, "advance_seq_lens: no decode step is planned (plan_decode)");
    // the verdict first: a failed step resets the mirror to the device's lengths and raises
    collect_deferred("KVCache::advance_seq_lens (cuda)");
    advance_host_lengths(steps * plan_.q_len);
  }

  uint64_t capture_key() const override {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    auto mix = [&h](uint64_t v) {
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdull;
      h ^= h >> 33;
    };
    mix(serial_);
    mix(generation_);
    mix(uint64_t(capacity_));
    mix(uint64_t(batch_));
    mix(uint64_t(n_kv_heads_));
    mix(plan_.valid ? 1 : 0);
    for (int v : {plan_.n_heads, plan_.q_len, plan_.nt, plan_.row_chunks, plan_.splits}) mix(uint64_t(uint32_t(v)));
    mix(uint64_t(reinterpret_cast<uintptr_t>(host_chk_dev_)));
    mix((cuda::overlapped_step_allowed() ? 1u : 0u) | (cuda::overlap_two_launches() ? 2u : 0u) |
        (cuda::step_input_checks() ? 4u : 0u));
    std::vector<const Tensor*> bufs{&len_, &rc_, &err_, &chk_, &done_, &counters_, &ws_o_, &ws_ml_};
    step_buffers(bufs);
    for (const Tensor* t : bufs) {
      mix(t->defined() ? uint64_t(reinterpret_cast<uintptr_t>(t->data())) : 0);
      mix(t->defined() ? uint64_t(t->nbytes()) : 0);
    }
    return h;
  }

  void plan_decode(int n_heads, int q_len, int64_t typical_len) override {
    VQ_CHECK_VALUE(batch_ > 0 && n_kv_heads_ > 0,
                   "plan_decode: batch and n_kv_heads are unknown (update or reserve first)");
    VQ_CHECK_VALUE(n_heads > 0 && n_heads % n_kv_heads_ == 0,
                   "plan_decode: n_heads=" << n_heads << " is not a positive multiple of n_kv_heads=" << n_kv_heads_);
    VQ_CHECK_VALUE(q_len >= 1 && q_len <= 16, "plan_decode: q_len must be in 1..16, got " << q_len);
    DeviceGuard g(device_.index);
    Plan p = make_plan(n_heads, q_len, typical_len);
    ensure_workspace(p);
    ensure_step_workspace(q_len);
    plan_ = p;
  }

  bool is_trimmable() const override { return true; }

  Tensor fused_sdpa(const TensorView& queries, const SdpaParams& params) const override {
    Tensor out = Tensor::empty(queries.sizes(), queries.dtype, queries.device);
    fused_sdpa_into(queries, out.view(), params);
    return out;
  }

  /// Eager attention (both caches): queries and out on any device; every check before the
  /// first launch, so a refused call changes nothing.
  void fused_sdpa_into(const TensorView& queries, const TensorView& out, const SdpaParams& params) const override {
    auto* self = const_cast<CudaCacheBase*>(this);
    DeviceGuard g(device_.index);
    const std::string who = class_name() + "::fused_sdpa (cuda)";
    check_queries(queries, who.c_str());
    VQ_CHECK_SHAPE(out.sizes() == queries.sizes(), "fused_sdpa: out " << out.shape_string() << " must match queries "
                                                                      << queries.shape_string());
    check_attention_context();
    detail::check_sdpa_params(params);
    VQ_CHECK_VALUE(!params.causal || queries.shape[2] <= offset(),
                   "fused_sdpa: causal attention of " << queries.shape[2] << " queries over " << offset() << " tokens");
    const Staged sq = stage(queries, device_, "queries");
    Tensor dout;
    TensorView o = out;
    if (out.device != device_) {
      dout = Tensor::empty(out.sizes(), out.dtype, device_);
      o = dout.view();
    }
    self->run_attention(sq.view, o, params, 0, false, false);
    if (dout.defined()) {
      synchronize();
      Tensor host = Tensor::copy_of(dout.view());
      copy_into(host.view(), out);
    }
  }

  /// decode_step over raw device pointers, shaped by the plan and the cache's batch and heads.
  void decode_step_raw(const void* q, const void* k, const void* v, void* out, DType dt, int n_heads, int q_len,
                       const SdpaParams& params) override {
    const int64_t D = config_.head_dim;
    decode_step(TensorView(const_cast<void*>(q), dt, {batch_, n_heads, q_len, D}, device_),
                TensorView(const_cast<void*>(k), dt, {batch_, n_kv_heads_, q_len, D}, device_),
                TensorView(const_cast<void*>(v), dt, {batch_, n_kv_heads_, q_len, D}, device_),
                TensorView(out, dt, {batch_, n_heads, q_len, D}, device_), params);
  }

 protected:
  /// A cache's own refusal of eager attention over what it holds (none by default).
  virtual void check_attention_context() const {}

  struct Plan {
    int n_heads = 0, q_len = 0, nt = 1, row_chunks = 1, splits = 1;
    cuda::AttnConfigKey key{};
    bool valid = false;
  };

  /// Waits for the stream (internal: raises no deferred check; see collect_deferred).
  void wait() const {
    DeviceGuard g(device_.index);
    VQ_CU(cudaStreamSynchronize(cs(stream_)));
  }

  /// Deferred input checks (set_deferred_checks): waits for the stream and, when a queued range
  /// check failed, clears the flags, resets the host mirror of the lengths to the device's (the
  /// failed update and every later one were no-ops there) and throws ValueError naming the call.
  /// Nothing to do (no wait) when no deferred update is pending.
  void collect_deferred(const char* who) const {
    if (pending_.empty() && !steps_unverified_ && !steps_captured_) return;
    DeviceGuard g(device_.index);
    VQ_CU(cudaStreamSynchronize(cs(stream_)));
    int32_t bad[2] = {0, 0};
    if (host_chk_) {
      bad[0] = host_word(0);
      bad[1] = host_word(1);
    } else {
      VQ_CU(cudaMemcpy(bad, chk_.data(), 8, cudaMemcpyDeviceToHost));
    }
    std::vector<Pending> pend;
    pend.swap(pending_);
    steps_unverified_ = false;
    if (!bad[0] && !bad[1]) return;
    auto* self = const_cast<CudaCacheBase*>(this);
    clear_check_flags();
    self->sync_seq_lens();  // (nothing pending, flags clear: its own verdict finds nothing)
    const bool keys = bad[0] != 0;
    const int32_t tag = keys ? bad[0] : bad[1];
    if (tag == kStepTag)
      VQ_THROW(ValueError, who << ": a decode step's input check failed: its " << (keys ? "k_new" : "v_new")
                               << " held a non-finite value or one beyond +-" << storage_limit() << " ("
                               << dtype_name(config_.storage_dtype)
                               << " storage); that step and every update() and decode step queued after it were "
                                  "not applied (their attention outputs are unspecified): the cache holds what it "
                                  "held before it ("
                               << offset() << " tokens per sequence at most)");
    size_t k = 0;
    while (k + 1 < pend.size() && pend[k].tag != tag) ++k;
    VQ_THROW(ValueError, who << ": a deferred input check failed: the " << (keys ? "keys " : "values ")
                             << shape_str(pend[k].shape) << " of update() " << k + 1 << " of the " << pend.size()
                             << " queued since the last check held a non-finite value or one beyond +-"
                             << storage_limit() << " (" << dtype_name(config_.storage_dtype)
                             << " storage); that update and the " << pend.size() - k - 1
                             << " after it were not applied: the cache holds what it held before it ("
                             << offset() << " tokens per sequence at most)");
  }

  /// After a restore replaced everything: pending verdicts are about a state that is gone.
  void discard_deferred() {
    // (a captured step's replays may have failed since the last verdict)
    if (pending_.empty() && !steps_unverified_ && !steps_captured_) return;
    DeviceGuard g(device_.index);
    clear_check_flags();
    pending_.clear();
    steps_unverified_ = false;
  }

  /// The range flags (device words and their host copies) back to zero; waits for the stream.
  void clear_check_flags() const {
    VQ_CU(cudaMemsetAsync(chk_.data(), 0, 8, cs(stream_)));
    VQ_CU(cudaStreamSynchronize(cs(stream_)));
    if (host_chk_) host_chk_[0] = host_chk_[1] = 0;
  }
  /// A range flag's host copy (deferred checks with mapped host memory), as the device left it.
  int host_word(int i) const { return reinterpret_cast<volatile int*>(host_chk_)[i]; }

  /// decode_step: deferred updates still unverified are verified first (a synchronisation, not
  /// possible while capturing: then the caller is told to check first).
  void collect_before_step() {
    if (pending_.empty()) return;
    VQ_CHECK_VALUE(!capturing(), "decode_step: " << pending_.size()
                                                 << " update() calls with deferred input checks are not verified yet; "
                                                    "call check_inputs() before capturing");
    collect_deferred("decode_step (cuda)");
  }

  float storage_limit() const { return config_.storage_dtype == DType::F16 ? 65504.0f : 3.3895314e38f; }

  virtual cuda::AttnConfigKey attn_key(int nt) const = 0;
  /// What a decode step needs beyond attention's workspace, allocated when it is planned (a
  /// captured step must not allocate).
  virtual void ensure_step_workspace(int /*q_len*/) {}
  /// Fills the cache-specific parts of the attention parameters (codes, window, lengths).
  virtual void fill_attn(cuda::AttnParams& p) const = 0;

  /// Raises what cuda_support() reports when this cache has no attention kernel (the fp16 cache
  /// and the standard mode are built without it; the fused modes are refused at construction).
  /// The answer depends on the configuration alone: the constructors store it in no_attention_.
  void require_attention_kernel() const { VQ_CHECK_T(no_attention_.empty(), UnsupportedError, no_attention_); }

  Plan make_plan(int n_heads, int q_len, int64_t typical_len) const {
    require_attention_kernel();
    Plan p;
    const int G = n_heads / n_kv_heads_, D = config_.head_dim;
    const int rows = G * q_len;
    p.n_heads = n_heads;
    p.q_len = q_len;
    p.nt = (rows > 8 && D <= 128) ? 2 : 1;
    p.row_chunks = (rows + 8 * p.nt - 1) / (8 * p.nt);
    p.key = attn_key(p.nt);
    const int bps = cuda::attn_blocks_per_sm(p.key, device_.index);
    p.splits = cuda::plan_splits(int(batch_ * n_kv_heads_ * p.row_chunks), typical_len, n_sms_, bps);
    p.valid = true;
    return p;
  }

  void ensure_workspace(const Plan& p) {
    const int64_t segs = batch_ * n_kv_heads_ * p.row_chunks;
    const int64_t rows = 8 * p.nt;
    if (p.splits > 1) {
      const int64_t no = segs * p.splits * rows * config_.head_dim, nml = segs * p.splits * rows * 2;
      if (!ws_o_.defined() || ws_o_.numel() < no) ws_o_ = Tensor::empty({no}, DType::F32, device_);
      if (!ws_ml_.defined() || ws_ml_.numel() < nml) ws_ml_ = Tensor::empty({nml}, DType::F32, device_);
    }
    if (!counters_.defined() || counters_.numel() < segs) counters_ = Tensor::zeros({segs}, DType::I32, device_);
  }

  void check_queries(const TensorView& q, const char* who) const {
    check_float4d(q, "queries", q.device);
    VQ_CHECK_VALUE(n_kv_heads_ > 0 && batch_ > 0,
                   who << ": the cache has never been updated (batch and n_kv_heads unknown)");
    VQ_CHECK_SHAPE(q.shape[0] == batch_ && q.shape[3] == config_.head_dim && q.shape[1] > 0 &&
                       q.shape[1] % n_kv_heads_ == 0,
                   who << ": queries: expected [batch=" << batch_ << ", n_heads (a multiple of n_kv_heads="
                       << n_kv_heads_ << "), q_len, head_dim=" << config_.head_dim << "], got "
                       << q.shape_string());
  }

  /// Queries one launch of an eager call takes: every row chunk of them must fit gridDim.y
  /// (n_kv_heads · row_chunks <= 65535, row chunks of 8 rows at the least), capped by
  /// cuda::prefill_launch_queries() when that is set.
  int launch_queries(int n_heads) const {
    const int G = n_heads / n_kv_heads_;
    const int64_t by_grid = std::max<int64_t>(1, int64_t(65535 / n_kv_heads_) * 8 / G);
    const int cap = cuda::prefill_launch_queries();
    return int(cap > 0 ? std::min<int64_t>(cap, by_grid) : by_grid);
  }

  /// Attention of device queries q into device out. Decode steps (use_plan): the planned launch,
  /// at most 16 queries. Eager calls: as few launches as the grid allows (launch_queries), each
  /// planned for its own rows; a prefill chunk of Q queries is one launch of G·Q/16 row chunks
  /// (before run 115: one launch per 16 queries, each re-reading the history). n_new: tokens
  /// appended on the device since the host lengths (decode step); advance: the last launch
  /// advances the device lengths. plan: use plan_ (no allocation) or plan per call. pdl: decode
  /// steps, whose kernel before attention is the step's own (cuda::attn_launch's pdl).
  void run_attention(const TensorView& q, const TensorView& out, const SdpaParams& sp, int n_new, bool advance,
                     bool use_plan, int priority = 0, bool pdl = false) {
    require_attention_kernel();
    const int H = int(q.shape[1]), Q = int(q.shape[2]), D = config_.head_dim;
    const float scale = sp.scale > 0.0f ? sp.scale : 1.0f / std::sqrt(float(D));
    // More than 16 queries of an eager call: the prefill kernel (128 rows a block, the history
    // unsplit) where it is compiled and its blocks fill the device once, over exact rows (the
    // fp16 cache, Standard caches: 4.8-9.0x the row chunks, run 121) and over codes whose
    // kernel gathers without bank conflicts (d4b8 1.04-1.24x the row chunks); other coded
    // caches (the defaults) only over a short history, a prompt or an early chunk (1.24x on a
    // 4096-token prompt, 0.90-0.93x at 32768 tokens of history): cuda::prefill_auto_on_codes.
    // kPrefillAlways runs it everywhere (tests).
    const int G = H / n_kv_heads_;
    const int pmode = cuda::prefill_mode();
    // Prefill over dequantized rows (run 169): the held tokens expanded once into exact rows, then
    // the prefill kernel over those rows, where every 128-row block would otherwise dequantize
    // every tile of the history itself (cuda::PrefillRowsMode; kPrefillAuto only)
    if (!use_plan && Q > 16 && pmode == cuda::kPrefillAuto && n_new == 0 && prefill_over_rows(q, out, sp, scale))
      return;
    bool prefill = false;
    if (!use_plan && Q > 16 && pmode != cuda::kPrefillOff) {
      cuda::AttnParams probe;
      fill_attn(probe);
      // (exact rows: the exact-rows kernel also serves head_dim 80 and 96, codes have none there)
      const bool compiled = probe.win_all ? cuda::prefill_rows_compiled(D) : cuda::prefill_compiled(attn_key(1));
      prefill = compiled && (pmode == cuda::kPrefillAlways ||
                             ((probe.win_all || cuda::prefill_auto_on_codes(attn_key(1), offset(), Q)) &&
                              prefill_row_blocks(G, Q) * n_kv_heads_ * batch_ >= n_sms_));
    }
    const int per_launch = use_plan ? 16 : prefill ? Q : launch_queries(H);
    for (int c0 = 0; c0 < Q; c0 += per_launch) {
      const int nq = std::min(per_launch, Q - c0);
      Plan pl;
      if (use_plan) {
        pl = plan_;
      } else if (!prefill) {
        pl = make_plan(H, nq, offset());
        ensure_workspace(pl);
      }
      cuda::AttnParams p = attn_params(q, out, sp, scale, c0, nq);
      p.n_splits = pl.splits;
      p.n_row_chunks = pl.row_chunks;
      p.rows_per_chunk = 8 * pl.nt;
      p.ws_o = ws_o_.defined() ? ws_o_.ptr<float>() : nullptr;
      p.ws_ml = ws_ml_.defined() ? ws_ml_.ptr<float>() : nullptr;
      p.counters = counters_.defined() ? counters_.ptr<int>() : nullptr;
      p.done_counter = done_.ptr<int>();
      p.n_new = n_new;
      p.advance = (advance && c0 + nq == Q) ? 1 : 0;
      if (p.advance) p.gate = step_gate();
      fill_attn(p);
      if (prefill) {
        p.prefill_tokens = offset();
        cuda::prefill_launch(attn_key(1), p, stream_);
        continue;
      }
      // eager calls: the host mirror of the lengths is exact, so the kernel may start each
      // split's first L2 prefetch before the device lengths arrive (a hint; see AttnParams)
      if (n_new == 0 && !p.win_all && sp.sliding_window <= 0 && !lens_.empty() && uniform() && !capturing())
        cuda::attn_set_length_hint(p, lens_[0], std::min<int64_t>(p.residual_length, rch_.empty() ? 0 : rch_[0]));
      cuda::attn_launch(pl.key, p, stream_, priority, pdl);
    }
  }

  /// Row blocks of kPrefillRows rows per (sequence, kv head) that a chunk of Q queries (GQA group
  /// G) makes: the prefill routing rule's unit (the grid fills the GPU once this times
  /// n_kv_heads · batch reaches the multiprocessor count).
  static int64_t prefill_row_blocks(int G, int Q) {
    return (int64_t(G) * Q + cuda::kPrefillRows - 1) / cuda::kPrefillRows;
  }

  /// The launch parameters every attention launch shares: shapes, queries c0 .. c0 + nq of q
  /// (the last Q - c0 of its chunk) into out, scale and masks.
  cuda::AttnParams attn_params(const TensorView& q, const TensorView& out, const SdpaParams& sp, float scale, int c0,
                               int nq) const {
    cuda::AttnParams p;
    p.batch = int(batch_);
    p.n_heads = int(q.shape[1]);
    p.n_kv_heads = n_kv_heads_;
    p.head_dim = config_.head_dim;
    p.q_len = nq;
    p.q_tail = int(q.shape[2]) - c0;
    p.q = dev4(q);
    p.q.data = static_cast<const char*>(q.data) + int64_t(c0) * q.strides[2] * dtype_size(q.dtype);
    p.out = static_cast<char*>(out.data) + int64_t(c0) * out.strides[2] * dtype_size(out.dtype);
    p.out_dtype = out.dtype;
    for (int i = 0; i < 4; ++i) p.out_stride[i] = out.strides[i];
    p.scale_log2 = scale * 1.4426950408889634f;
    p.causal = sp.causal ? 1 : 0;
    p.sliding_window = sp.sliding_window;
    return p;
  }

  /// Prefill over dequantized rows (cuda::PrefillRowsMode) of an eager call of more than 16
  /// queries: the held tokens written once as exact rows into a workspace from the device's pool
  /// (materialize_rows), the prefill kernel over them as over an fp16 cache's rows, the
  /// workspace freed behind it on the stream; a Stash cache attends over the rows it holds
  /// (holds_every_row: no workspace, no expansion). False (nothing queued) where it does not
  /// apply: a cache without codes to expand, one on which a step was captured and whose device
  /// lengths differ from the host's (replays the caller has not counted yet may have moved
  /// them: the workspace is sized by the host's mirror), auto mode with a grid that does not
  /// fill the device, a workspace beyond the limit or that cannot be allocated.
  bool prefill_over_rows(const TensorView& q, const TensorView& out, const SdpaParams& sp, float scale) {
    const int rmode = cuda::prefill_rows_mode();
    const bool held = holds_every_row();
    if (rmode == cuda::kRowsOff || capturing() || !(held || can_materialize())) return false;
    const int D = config_.head_dim, H = int(q.shape[1]), Q = int(q.shape[2]), G = H / n_kv_heads_;
    const cuda::AttnConfigKey rows_key{D, 4, 8, 4, 8, 1};  // the fp16 cache's: exact rows
    if (!cuda::prefill_rows_compiled(D)) return false;
    const int64_t row_blocks = prefill_row_blocks(G, Q);
    if (rmode == cuda::kRowsAuto && row_blocks * n_kv_heads_ * batch_ < n_sms_) return false;  // the grid fills the GPU
    if (row_blocks > 65535) return false;  // gridDim.y: the row chunks
    cuda::AttnParams p = attn_params(q, out, sp, scale, 0, Q);
    p.done_counter = done_.ptr<int>();
    fill_attn(p);
    p.k_codes = p.v_codes = nullptr;
    p.win_ring = 0;
    p.win_all = 1;
    p.prefill_tokens = offset();
    if (held) {  // the rows are there (fill_attn: k_win / v_win, every token at its slot, device lengths)
      cuda::prefill_launch(rows_key, p, stream_);
      cuda::count_prefill_rows_launch();
      return true;
    }
    const int64_t cap = offset();  // >= every device length: the device's only trail the host's (failed deferred updates)
    const size_t side = size_t(batch_ * n_kv_heads_ * cap * D) * dtype_size(config_.storage_dtype);
    if (cap == 0 || 2 * side > size_t(cuda::rows_workspace_limit())) return false;
    // (after the cheap gates: this one waits for the stream)
    if (steps_captured_ && !device_lengths_are_host_ones()) return false;
    void* ws = cuda::rows_workspace_alloc(device_.index, 2 * side, stream_);
    if (ws == nullptr) return false;
    try {
      void* wk = ws;
      void* wv = static_cast<char*>(ws) + side;
      materialize_rows(wk, wv, cap);
      p.k_win = wk;
      p.v_win = wv;
      p.win_cap = cap;
      cuda::prefill_launch(rows_key, p, stream_);
    } catch (...) {
      cuda::rows_workspace_free(ws, stream_);
      throw;
    }
    cuda::rows_workspace_free(ws, stream_);
    cuda::count_prefill_rows_launch();
    return true;
  }
  /// Whether materialize_rows has codes to expand (MemoryBound caches holding tokens).
  virtual bool can_materialize() const { return false; }
  /// Whether fill_attn's rows (k_win / v_win, slot = position) already hold every token as the
  /// kernel over the codes would see it, next to those codes: then prefill over rows needs no
  /// workspace (Stash caches whose dequantized rows agree with the decode kernel's centroids).
  virtual bool holds_every_row() const { return false; }
  /// Writes every held token of every sequence as an exact row (the storage dtype) into k and v,
  /// [batch, n_kv_heads, cap, head_dim]: window tokens as held, older ones dequantized (keys
  /// inverse-transformed), with the centroids the decode kernel reads.
  virtual void materialize_rows(void* /*k*/, void* /*v*/, int64_t /*cap*/) const {}

  void set_lengths_host(const std::vector<int64_t>& lens, const std::vector<int64_t>& rcs) {
    std::vector<int32_t> l(lens.begin(), lens.end()), r(rcs.begin(), rcs.end());
    VQ_CU(cudaMemcpyAsync(len_.data(), l.data(), l.size() * 4, cudaMemcpyHostToDevice, cs(stream_)));
    if (rc_.defined()) VQ_CU(cudaMemcpyAsync(rc_.data(), r.data(), r.size() * 4, cudaMemcpyHostToDevice, cs(stream_)));
    VQ_CU(cudaStreamSynchronize(cs(stream_)));  // the host vectors die here
    lens_ = lens;
    rch_ = rcs;
  }

  /// Whether the cache's stream is being captured into a graph (the host mirror then stays put).
  bool capturing() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    VQ_CU(cudaStreamIsCapturing(cs(stream_), &st));
    return st != cudaStreamCaptureStatusNone;
  }

  bool uniform() const {
    for (int64_t l : lens_)
      if (l != lens_[0]) return false;
    return true;
  }
  void require_uniform(const char* who) const {
    VQ_CHECK_T(uniform(), UnsupportedError,
               who << ": the sequences of the batch hold different numbers of tokens (ragged batch)");
  }

  /// Validates keys/values of an update like the CPU caches (shapes, finite values within the
  /// storage range); returns n_new and the gate the update's kernels take (deferred checks:
  /// the range flags; else null). Any device or the CPU; the range check runs where they live.
  /// Deferred checks (device inputs, shape known): the range checks are queued, not waited for.
  struct Checked {
    int64_t n = 0;
    const int* gate = nullptr;
  };
  Checked check_update(const TensorView& keys, const TensorView& values, const char* who) const {
    // a deferred check that already failed is raised now (its words are in host memory; no wait)
    if (host_chk_ && (host_word(0) | host_word(1))) collect_deferred(who);
    // decode steps since the last verdict: an update that waits for its own check verifies
    // them first (its check must not find their flags)
    if ((steps_unverified_ || steps_captured_) && !deferred_) collect_deferred(who);
    check_float4d(keys, "keys", keys.device);
    check_float4d(values, "values", values.device);
    VQ_CHECK_SHAPE(keys.sizes() == values.sizes(),
                   who << ": keys " << keys.shape_string() << " and values " << values.shape_string() << " differ");
    VQ_CHECK_SHAPE(keys.shape[3] == config_.head_dim,
                   who << ": keys: expected [batch, n_kv_heads, n_new, head_dim=" << config_.head_dim << "], got "
                       << keys.shape_string());
    VQ_CHECK_SHAPE(keys.shape[0] > 0 && keys.shape[1] > 0,
                   who << ": keys: batch and n_kv_heads must be > 0, got " << keys.shape_string());
    if (n_kv_heads_ > 0)
      VQ_CHECK_SHAPE(keys.shape[1] == n_kv_heads_, who << ": keys: expected n_kv_heads=" << n_kv_heads_ << ", got "
                                                       << keys.shape_string());
    if (batch_ > 0)
      VQ_CHECK_SHAPE(keys.shape[0] == batch_,
                     who << ": keys: expected batch=" << batch_ << ", got " << keys.shape_string());
    VQ_CHECK_SHAPE(keys.device == device_ || keys.device.is_cpu(),
                   who << ": keys on " << device_name(keys.device) << ", the cache lives on " << device_name(device_));
    VQ_CHECK_SHAPE(values.device == keys.device, who << ": keys and values on different devices");
    const float lim = storage_limit();
    // device inputs: one range-check launch for keys and values, then one read-back and one
    // synchronisation (the call must throw before it changes anything, so it waits for the
    // verdict), or with deferred checks no wait at all
    const bool defer = deferred_ && batch_ > 0;
    const int32_t tag = defer ? next_tag() : 1;
    int32_t bad[2] = {0, 0};
    const bool on_device = !keys.device.is_cpu();
    if (!on_device) {
      for (const TensorView* t : {&keys, &values}) {
        const Tensor f = Tensor::to_f32(*t);
        const float* x = f.ptr<float>();
        for (int64_t i = 0; i < f.numel(); ++i)
          VQ_CHECK_VALUE(std::fabs(x[i]) <= lim, who << ": " << (t == &keys ? "keys" : "values") << " element " << i
                                                     << " is " << x[i] << ": must be finite and within +-" << lim
                                                     << " (" << dtype_name(config_.storage_dtype) << " storage)");
      }
    } else {
      // one launch for both; the flags are zero here (a verdict that finds one set clears it)
      cuda::check_range_launch(dev4(keys), dev4(values), keys.shape[0], keys.shape[1], keys.shape[2], keys.shape[3],
                               lim, chk_.ptr<int>(), stream_, tag, defer ? chk_.ptr<int>() : nullptr,
                               defer ? host_chk_dev_ : nullptr);
    }
    // (host inputs were checked above: tag 0, never a failing one, but counted among the
    // updates queued since the last verdict, which a failed one before them gates)
    if (defer) pending_.push_back({on_device ? tag : 0, keys.sizes()});
    if (on_device && !defer) {
      VQ_CU(cudaMemcpyAsync(bad, chk_.data(), 8, cudaMemcpyDeviceToHost, cs(stream_)));
      VQ_CU(cudaStreamSynchronize(cs(stream_)));
      // (the words gate deferred updates: a failure reported here must not leave them set)
      if (bad[0] || bad[1]) VQ_CU(cudaMemsetAsync(chk_.data(), 0, 8, cs(stream_)));
    }
    for (const TensorView* t : {&keys, &values})
      VQ_CHECK_VALUE(!bad[t == &keys ? 0 : 1], who << ": " << (t == &keys ? "keys" : "values") << " "
                                                   << t->shape_string() << " hold a non-finite value or one beyond +-"
                                                   << lim << " (" << dtype_name(config_.storage_dtype) << " storage)");
    return {keys.shape[2], deferred_ ? chk_.ptr<int>() : nullptr};
  }

  int32_t next_tag() const {
    tag_ = tag_ == INT32_MAX ? 1 : tag_ + 1;
    return tag_;
  }

  /// Shape checks of decode_step (host only, no device work).
  void check_step(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) const {
    VQ_CHECK_VALUE(plan_.valid, "decode_step: call plan_decode first");
    for (const TensorView* t : {&q, &k, &v, &out})
      VQ_CHECK_SHAPE(t->ndim == 4 && t->device == device_ && dtype_is_float(t->dtype),
                     "decode_step: q, k_new, v_new and out must be rank-4 float tensors on "
                         << device_name(device_) << ", got " << t->shape_string() << " on "
                         << device_name(t->device));
    VQ_CHECK_SHAPE(q.shape[0] == batch_ && q.shape[1] == plan_.n_heads && q.shape[2] == plan_.q_len &&
                       q.shape[3] == config_.head_dim,
                   "decode_step: q: expected [batch=" << batch_ << ", n_heads=" << plan_.n_heads
                                                      << ", q_len=" << plan_.q_len << ", head_dim=" << config_.head_dim
                                                      << "] (as planned), got " << q.shape_string());
    VQ_CHECK_SHAPE(out.sizes() == q.sizes(),
                   "decode_step: out " << out.shape_string() << " must match q " << q.shape_string());
    const Shape kv{batch_, n_kv_heads_, plan_.q_len, config_.head_dim};
    VQ_CHECK_SHAPE(k.sizes() == kv && v.sizes() == kv, "decode_step: k_new/v_new: expected "
                                                           << shape_str(kv) << ", got " << k.shape_string()
                                                           << " and " << v.shape_string());
    for (int64_t l : lens_)
      VQ_CHECK_VALUE(l + plan_.q_len <= capacity_,
                     "decode_step: a sequence of " << l << " tokens plus " << plan_.q_len
                                                   << " does not fit the capacity " << capacity_ << " (reserve more)");
  }

  void ensure_length_arrays(int64_t B, bool with_rc) {
    if (len_.defined()) return;
    len_ = Tensor::zeros({B}, DType::I32, device_);
    if (with_rc) rc_ = Tensor::zeros({B}, DType::I32, device_);
    lens_.assign(size_t(B), 0);
    rch_.assign(size_t(B), 0);
  }

  int64_t nbytes_common() const {
    int64_t n = 0;
    for (const Tensor* t : {&len_, &rc_, &err_, &chk_, &done_, &counters_, &ws_o_, &ws_ml_})
      if (t->defined()) n += t->nbytes();
    return n;
  }

  /// The device buffers of this kind of cache that a captured decode step may use, beyond the
  /// base's (capture_key hashes their addresses and sizes).
  virtual void step_buffers(std::vector<const Tensor*>& out) const = 0;
  /// The host mirror moved as decode steps of n tokens in all move it on the device.
  virtual void advance_host_lengths(int64_t n) = 0;

  KVCacheConfig config_;
  Plan plan_;
  uint64_t serial_ = 0;      ///< this object's (capture_key)
  uint64_t generation_ = 0;  ///< restores (capture_key: the state, config included, replaced)
  int n_sms_ = 1;
  std::string no_attention_;  // why this cache has no attention kernel (cuda::cache_attention_missing), else empty
  std::vector<int64_t> rch_;  // host mirror of res_count
  Tensor len_, rc_, err_, chk_, done_, counters_, ws_o_, ws_ml_;
  // deferred input checks: mapped host copies of chk_'s words (null: read chk_ back), the
  // updates queued since the last verdict, the last tag given
  struct Pending {
    int32_t tag;
    Shape shape;
  };
  int* host_chk_ = nullptr;
  int* host_chk_dev_ = nullptr;
  mutable std::vector<Pending> pending_;
  mutable int32_t tag_ = 0;
  /// decode steps (eager or replayed from a graph) since the last verdict: their range checks
  /// write kStepTag into the flags, read by the next collect_deferred
  mutable bool steps_unverified_ = false;
  /// a decode step was captured: its replays run without a host call, so every verdict reads
  /// the flags from then on
  bool steps_captured_ = false;
  static constexpr int32_t kStepTag = -1;
  /// A decode step's k_new/v_new range check, for the launch that runs it: the flags to write
  /// (empty where cuda::step_input_checks() is off: benchmarks' A/B only); the step is noted as
  /// unverified (captured: every later verdict reads the flags).
  cuda::StepCheck step_check() {
    if (!cuda::step_input_checks()) return {};
    steps_unverified_ = true;
    if (capturing()) steps_captured_ = true;
    return {chk_.ptr<int>(), storage_limit(), kStepTag, host_chk_dev_};
  }

  /// The check as a launch of its own: queued (never waited for), gated by an earlier failure
  /// (which keeps its tag), the step's kernels gated by its flags (step_gate()).
  void check_step_inputs(const TensorView& k, const TensorView& v) {
    const cuda::StepCheck c = step_check();
    if (c.flags)
      cuda::check_range_launch(dev4(k), dev4(v), k.shape[0], k.shape[1], k.shape[2], k.shape[3], c.limit, c.flags,
                               stream_, c.tag, c.flags, c.host_flags);
  }
  const int* step_gate() const { return chk_.ptr<int>(); }
};

// ------------------------------------------------------------------------------------------
// FP16 baseline on the device.
// ------------------------------------------------------------------------------------------
class CudaFP16Cache final : public CudaCacheBase {
 public:
  explicit CudaFP16Cache(const KVCacheConfig& c) : CudaCacheBase(c) {
    config_.kind = CacheKind::FP16;
    config_.validate();
    const std::string why = cuda::cache_unsupported(CacheKind::FP16, CacheMode::Standard, config_.head_dim, {}, {},
                                                    CodebookFormat::F16);
    VQ_CHECK_T(why.empty(), UnsupportedError, why);
    no_attention_ = cuda::cache_attention_missing(CacheKind::FP16, CacheMode::Standard, config_.head_dim, {}, {},
                                                  CodebookFormat::F16);
    n_kv_heads_ = config_.n_kv_heads;
  }

  std::pair<Tensor, Tensor> update_and_fetch(const TensorView& keys, const TensorView& values) override {
    update(keys, values);
    collect_deferred("KVCache::update_and_fetch (cuda)");
    return {fetch(held_k_, keys.device), fetch(held_v_, keys.device)};
  }

  void update(const TensorView& keys, const TensorView& values) override {
    DeviceGuard g(device_.index);
    const Checked ck = check_update(keys, values, "KVCache::update (cuda)");
    const int64_t n = ck.n;
    const int64_t B = keys.shape[0], H = keys.shape[1];
    const Staged sk = stage(keys, device_, "keys"), sv = stage(values, device_, "values");
    if (batch_ == 0) {
      batch_ = B;
      n_kv_heads_ = int(H);
      config_.n_kv_heads = int(H);
      ensure_length_arrays(B, false);
    }
    grow_to(offset() + n);
    const int bf = config_.storage_dtype == DType::BF16;
    cuda::append_rows_launch(dev4(sk.view), int(B), int(H), int(n), config_.head_dim, held_k_.data(), bf, capacity_,
                             len_.ptr<int32_t>(), err_.ptr<int>(), stream_, ck.gate);
    cuda::append_rows_launch(dev4(sv.view), int(B), int(H), int(n), config_.head_dim, held_v_.data(), bf, capacity_,
                             len_.ptr<int32_t>(), err_.ptr<int>(), stream_, ck.gate);
    cuda::advance_lengths_launch(len_.ptr<int32_t>(), nullptr, int(B), int(n), 0, stream_, ck.gate);
    for (auto& l : lens_) l += n;
    if (sk.keep.defined() || sv.keep.defined()) wait();  // the staged copies die here
  }

  void decode_step(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const SdpaParams& params) override {
    DeviceGuard g(device_.index);
    check_step(q, k, v, out);
    collect_before_step();
    check_step_inputs(k, v);
    const int n = plan_.q_len;
    const int bf = config_.storage_dtype == DType::BF16;
    cuda::append_rows_launch(dev4(k), int(batch_), n_kv_heads_, n, config_.head_dim, held_k_.data(), bf, capacity_,
                             len_.ptr<int32_t>(), err_.ptr<int>(), stream_, step_gate());
    cuda::append_rows_launch(dev4(v), int(batch_), n_kv_heads_, n, config_.head_dim, held_v_.data(), bf, capacity_,
                             len_.ptr<int32_t>(), err_.ptr<int>(), stream_, step_gate());
    run_attention(q, out, params, n, true, true, 0, true);  // starts while the rows' append ends
    if (!capturing()) advance_host_lengths(n);
  }
  void advance_host_lengths(int64_t n) override {
    for (auto& l : lens_) l += n;
  }

  void reserve(int64_t max_tokens, int64_t batch) override {
    DeviceGuard g(device_.index);
    if (batch_ == 0) {
      VQ_CHECK_VALUE(batch > 0 && n_kv_heads_ > 0,
                     "reserve: batch and n_kv_heads are unknown (give batch, and n_kv_heads in the config)");
      batch_ = batch;
      ensure_length_arrays(batch, false);
    }
    grow_to(max_tokens);
  }

  void set_seq_lens(const std::vector<int64_t>& lens) override {
    collect_deferred("set_seq_lens (cuda)");
    VQ_CHECK_SHAPE(int64_t(lens.size()) == batch_, "set_seq_lens: expected " << batch_ << " lengths, got "
                                                                             << lens.size());
    for (size_t b = 0; b < lens.size(); ++b)
      VQ_CHECK_VALUE(lens[b] >= 0 && lens[b] <= lens_[b],
                     "set_seq_lens: sequence " << b << " holds " << lens_[b] << " tokens; cannot set " << lens[b]);
    DeviceGuard g(device_.index);
    set_lengths_host(lens, std::vector<int64_t>(lens.size(), 0));
  }

  int64_t trim(int64_t n) override {
    VQ_CHECK_VALUE(n >= 0, "KVCache::trim: n must be >= 0, got " << n);
    collect_deferred("KVCache::trim (cuda)");
    if (batch_ == 0) return 0;
    std::vector<int64_t> l = lens_;
    int64_t k = 0;
    for (auto& x : l) {
      const int64_t d = std::min(n, x);
      x -= d;
      k = std::max(k, d);
    }
    DeviceGuard g(device_.index);
    set_lengths_host(l, std::vector<int64_t>(l.size(), 0));
    return k;
  }

  CacheState state() const override {
    collect_deferred("KVCache::state (cuda)");
    CacheState s;
    if (batch_ == 0 || offset() == 0) return s;
    require_uniform("KVCache::state (cuda)");
    s.emplace_back("keys", fetch(held_k_, Device::cpu()));
    s.emplace_back("values", fetch(held_v_, Device::cpu()));
    return s;
  }
  CacheMetaState meta_state() const override {
    collect_deferred("KVCache::meta_state (cuda)");
    return {{"class", class_name()},
            {"offset", std::to_string(offset())},
            {"head_dim", std::to_string(config_.head_dim)},
            {"n_kv_heads", std::to_string(n_kv_heads_)},
            {"batch", std::to_string(batch_)},
            {"storage_dtype", dtype_name(config_.storage_dtype)},
            {"step", std::to_string(config_.step)},
            {"capacity", std::to_string(capacity_)}};
  }
  void set_state(const CacheState& s) override { restore(s, meta_state()); }
  void set_meta_state(const CacheMetaState& m) override { restore(state(), m); }
  void restore(const CacheState& state_in, const CacheMetaState& meta) override {
    // The CPU cache validates everything (shapes, dtypes, meta) first, on CPU copies.
    CacheState state;
    for (const auto& [name, t] : state_in) state.emplace_back(name, t.device().is_cpu() ? t : Tensor::copy_of(t.view()));
    std::unique_ptr<FP16KVCache> cpu = FP16KVCache::from_state(state, meta);
    DeviceGuard g(device_.index);
    const int64_t B = cpu->batch(), H = cpu->n_kv_heads(), off = cpu->offset();
    const KVCacheConfig& c = cpu->config();
    const int64_t cap = B > 0 ? std::max(cpu->capacity(), c.step) : 0;
    Tensor nk, nv, nl;
    if (B > 0) {
      nk = Tensor::empty({B, H, cap, c.head_dim}, c.storage_dtype, device_);
      nv = Tensor::empty({B, H, cap, c.head_dim}, c.storage_dtype, device_);
      nl = Tensor::zeros({B}, DType::I32, device_);
      const size_t row = size_t(c.head_dim) * dtype_size(c.storage_dtype);
      if (off > 0) {
        const Tensor* k = detail::state_find(state, "keys");
        const Tensor* v = detail::state_find(state, "values");
        copy_rows_2d(nk.data(), row, cap, 0, k->data(), row, off, 0, B * H, off, row, cudaMemcpyHostToDevice,
                     cs(stream_));
        copy_rows_2d(nv.data(), row, cap, 0, v->data(), row, off, 0, B * H, off, row, cudaMemcpyHostToDevice,
                     cs(stream_));
      }
      std::vector<int32_t> l(static_cast<size_t>(B), static_cast<int32_t>(off));
      VQ_CU(cudaMemcpyAsync(nl.data(), l.data(), l.size() * 4, cudaMemcpyHostToDevice, cs(stream_)));
      VQ_CU(cudaStreamSynchronize(cs(stream_)));
    }
    // commit
    KVCacheConfig nc = c;
    nc.device = device_;
    nc.stream = stream_;
    config_ = nc;
    held_k_ = nk;
    held_v_ = nv;
    len_ = nl;
    capacity_ = cap;
    batch_ = B;
    n_kv_heads_ = int(H);
    lens_.assign(size_t(B), off);
    rch_.assign(size_t(B), 0);
    plan_ = Plan{};
    ++generation_;
    discard_deferred();
  }

  int64_t nbytes() const override {
    int64_t n = nbytes_common();
    for (const Tensor* t : {&held_k_, &held_v_})
      if (t->defined()) n += t->nbytes();
    return n;
  }
  std::string class_name() const override { return "KVCache"; }
  std::string describe() const override {
    std::ostringstream o;
    o << "KVCache (cuda " << device_name(device_) << ") " << dtype_name(config_.storage_dtype) << " [batch=" << batch_
      << ", n_kv_heads=" << n_kv_heads_ << ", head_dim=" << config_.head_dim << "], " << offset() << " tokens, "
      << nbytes() << " bytes";
    return o.str();
  }

 protected:
  cuda::AttnConfigKey attn_key(int nt) const override { return {config_.head_dim, 4, 8, 4, 8, nt}; }
  void fill_attn(cuda::AttnParams& p) const override {
    p.k_win = held_k_.data();
    p.v_win = held_v_.data();
    p.win_bf16 = config_.storage_dtype == DType::BF16;
    p.win_cap = capacity_;
    p.win_ring = 0;
    p.win_all = 1;
    p.seq_len = len_.ptr<int32_t>();
    p.seq_len_rw = len_.ptr<int32_t>();
    p.res_count = nullptr;
    p.res_count_rw = nullptr;
  }

 private:
  Tensor fetch(const Tensor& held, Device where) const {
    require_uniform("KVCache::update_and_fetch (cuda)");
    const int64_t off = offset(), D = config_.head_dim;
    const size_t row = size_t(D) * dtype_size(config_.storage_dtype);
    Tensor t = Tensor::empty({batch_, n_kv_heads_, off, D}, config_.storage_dtype, where.is_cpu() ? where : device_);
    DeviceGuard g(device_.index);
    copy_rows_2d(t.data(), row, off, 0, held.data(), row, capacity_, 0, batch_ * n_kv_heads_, off, row,
                 where.is_cpu() ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice, cs(stream_));
    if (where.is_cpu()) wait();
    return t;
  }

  void grow_to(int64_t needed) {
    if (needed <= capacity_ && held_k_.defined()) return;
    const int64_t cap = std::max<int64_t>(round_up(std::max<int64_t>(needed, 1), config_.step), config_.step);
    const int64_t D = config_.head_dim;
    Tensor nk = Tensor::empty({batch_, n_kv_heads_, cap, D}, config_.storage_dtype, device_);
    Tensor nv = Tensor::empty({batch_, n_kv_heads_, cap, D}, config_.storage_dtype, device_);
    const size_t row = size_t(D) * dtype_size(config_.storage_dtype);
    const int64_t keep = offset();
    if (held_k_.defined() && keep > 0) {
      copy_rows_2d(nk.data(), row, cap, 0, held_k_.data(), row, capacity_, 0, batch_ * n_kv_heads_, keep, row,
                   cudaMemcpyDeviceToDevice, cs(stream_));
      copy_rows_2d(nv.data(), row, cap, 0, held_v_.data(), row, capacity_, 0, batch_ * n_kv_heads_, keep, row,
                   cudaMemcpyDeviceToDevice, cs(stream_));
      wait();
    }
    held_k_ = nk;
    held_v_ = nv;
    capacity_ = cap;
  }

  void step_buffers(std::vector<const Tensor*>& out) const override {
    out.insert(out.end(), {&held_k_, &held_v_});
  }

  Tensor held_k_, held_v_;
};

// ------------------------------------------------------------------------------------------
// VecInfer on the device.
// ------------------------------------------------------------------------------------------
class CudaVecInferCache final : public CudaCacheBase, public VecInferAccounting {
 public:
  explicit CudaVecInferCache(const KVCacheConfig& c) : CudaCacheBase(c) {
    config_.kind = CacheKind::VecInfer;
    config_.validate();
    KVCacheConfig cpu_cfg = config_;
    cpu_cfg.device = Device::cpu();
    cpu_cfg.stream = nullptr;
    cpu_cfg.n_threads = 1;
    VecInferKVCache proto(cpu_cfg);  // quantizers and transform exactly as the CPU cache builds them
    init_from(proto.key_quantizer(), proto.value_quantizer(), proto.key_transform(), proto.uses_random_codebooks(),
              proto.config());
  }
  ~CudaVecInferCache() override {
    // (pending work on the side stream finishes first: cudaStreamDestroy does not wait, the
    // device releases the stream when its work is done)
    DeviceGuard g(device_.index);
    for (cudaEvent_t ev : {ev_join_, ev_join2_, ev_fork_})
      if (ev) cudaEventDestroy(ev);
    for (cudaStream_t st : {side_, side2_})
      if (st) cudaStreamDestroy(st);
  }
  CudaVecInferCache(const CudaVecInferCache&) = delete;
  CudaVecInferCache& operator=(const CudaVecInferCache&) = delete;

  std::pair<Tensor, Tensor> update_and_fetch(const TensorView& keys, const TensorView& values) override {
    if (mode_ == CacheMode::MemoryBound)
      VQ_THROW(UnsupportedError,
               "VecInferKVCache::update_and_fetch (cuda): a memory-bound cache holds only codes and the fp16 "
               "window, so there is no full K/V to fetch; use update() and fused_sdpa() (the cache is unchanged)");
    update(keys, values);
    collect_deferred("VecInferKVCache::update_and_fetch (cuda)");
    return {fetch_rows(held_k_, keys.device), fetch_rows(held_v_, keys.device)};
  }

  void update(const TensorView& keys, const TensorView& values) override {
    DeviceGuard g(device_.index);
    const Checked ck = check_update(keys, values, "VecInferKVCache::update (cuda)");
    const int64_t n = ck.n;
    const int64_t B = keys.shape[0], H = keys.shape[1];
    const Staged sk = stage(keys, device_, "keys"), sv = stage(values, device_, "values");
    // allocations first
    if (batch_ == 0) first_shape(B, H);
    grow_to(offset() + n);
    // A few token-heads (decode-time updates): the latency-mode encode, every block of a token
    // group on one slice of the codebook (the throughput kernel gives each group one warp, which
    // re-ranks a candidate-grid cell's list where the codebook has a grid but scans the whole
    // codebook otherwise: see update_decode_max). Codebooks of > 256 centroids get their grids
    // (built once on the device, ensure_grids) when the cache's throughput-mode encodes reach
    // cuda::grid_build_after() token-heads, about where the scan has cost what the build costs;
    // one without a grid keeps the latency mode ahead up to 4x the token-heads (runs 98 and 103's
    // update tables)
    const int64_t th = B * H * n, base = cuda::update_decode_max();
    if (th > base && bulk_th_ + th >= cuda::grid_build_after()) ensure_grids();
    auto scanned_big = [](const ProductQuantizer& pq, const cuda::DeviceEncodeGrid& gr) {
      return pq.n_centroids > 256 && !gr.host;
    };
    const bool few = th <= base * (scanned_big(key_pq_, k_grid_) || scanned_big(value_pq_, v_grid_) ? 4 : 1);
    if (few) ensure_step_workspace(int(n));
    // launches
    launch_append(dev4(sk.view), dev4(sv.view), int(n), few, ck.gate);
    if (!few) bulk_th_ += th;
    cuda::advance_lengths_launch(len_.ptr<int32_t>(), rc_.ptr<int32_t>(), int(B), int(n), config_.residual_length,
                                 stream_, ck.gate);
    for (size_t b = 0; b < lens_.size(); ++b) {
      lens_[b] += n;
      rch_[b] = std::min<int64_t>(config_.residual_length, rch_[b] + n);
    }
    if (sk.keep.defined() || sv.keep.defined()) wait();  // the staged copies die here
  }

  void check_attention_context() const override {
    VQ_CHECK_VALUE(offset() <= config_.fused_sdpa_max_ctx,
                   "VecInferKVCache::fused_sdpa: context of " << offset() << " tokens exceeds fused_sdpa_max_ctx="
                                                              << config_.fused_sdpa_max_ctx);
  }

  void decode_step(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const SdpaParams& params) override {
    DeviceGuard g(device_.index);
    check_step(q, k, v, out);
    collect_before_step();
    const int n = plan_.q_len;
    const bool overlapped = overlap_ready(n);
    if (!overlapped) check_step_inputs(k, v);  // (the overlapped step's window_rows launch checks)
    if (overlapped) {
      // Overlapped step: the new tokens' exact rows go into the window first (and the lengths
      // into a snapshot); attention, which reads them from there and never reads the new
      // tokens' codes (they are inside the window), then runs beside their encode, which goes
      // on a side stream forked and joined through events (capturable: the graph gets two
      // branches). The attention launch gets the highest block-dispatch priority, so the encode
      // fills the multiprocessors it leaves free.
      cuda::EncodeParams e = enc_params(dev4(k), dev4(v), n);
      e.gate = step_gate();  // window rows and the encode beside: nothing written after a failed check
      int32_t* const snap = snap_.ptr<int32_t>();
      cuda::window_rows_launch(e, snap, snap + batch_, stream_, step_check());
      VQ_CU(cudaEventRecord(ev_fork_, cs(stream_)));
      run_attention(q, out, params, n, true, true, prio_hi_, true);  // starts while window_rows runs
      e.k_win = e.v_win = nullptr;  // written above
      e.seq_len = snap;             // attention advances the lengths while this runs
      e.res_count = snap + batch_;
      // keys and values of different sub_dims are two launches: each on its own side stream,
      // so the side branch is one launch long
      const bool two = key_pq_.sub_dim != value_pq_.sub_dim;
      for (int i = 0; i < (two ? 2 : 1); ++i)
        encode_beside(e, two ? (i == 0 ? 1 : 2) : 3, i == 0 ? side_ : side2_, i == 0 ? ev_join_ : ev_join2_);
      cuda::note_overlapped_step();
    } else {
      // attention starts while the encode ends, unless the encode was two launches joined from a
      // side stream (an event wait, not a kernel, before it)
      const bool joined = launch_append(dev4(k), dev4(v), n, true, step_gate());
      run_attention(q, out, params, n, true, true, 0, !joined);
    }
    if (capturing()) return;  // replays advance the device lengths; sync_seq_lens() reads them
    advance_host_lengths(n);
  }
  void advance_host_lengths(int64_t n) override {
    for (size_t b = 0; b < lens_.size(); ++b) {
      lens_[b] += n;
      rch_[b] = std::min<int64_t>(config_.residual_length, rch_[b] + n);
    }
  }

  void reserve(int64_t max_tokens, int64_t batch) override {
    DeviceGuard g(device_.index);
    if (batch_ == 0) {
      VQ_CHECK_VALUE(batch > 0 && n_kv_heads_ > 0,
                     "reserve: batch and n_kv_heads are unknown (give batch, and n_kv_heads in the config)");
      first_shape(batch, n_kv_heads_);
    }
    grow_to(max_tokens);
  }

  void set_seq_lens(const std::vector<int64_t>& lens) override {
    collect_deferred("set_seq_lens (cuda)");
    VQ_CHECK_SHAPE(int64_t(lens.size()) == batch_, "set_seq_lens: expected " << batch_ << " lengths, got "
                                                                             << lens.size());
    std::vector<int64_t> rc = rch_;
    for (size_t b = 0; b < lens.size(); ++b) {
      VQ_CHECK_VALUE(lens[b] >= 0 && lens[b] <= lens_[b],
                     "set_seq_lens: sequence " << b << " holds " << lens_[b] << " tokens; cannot set " << lens[b]);
      rc[b] = std::max<int64_t>(0, rc[b] - (lens_[b] - lens[b]));
    }
    DeviceGuard g(device_.index);
    set_lengths_host(lens, rc);
  }

  int64_t trim(int64_t n) override {
    VQ_CHECK_VALUE(n >= 0, "VecInferKVCache::trim: n must be >= 0, got " << n);
    collect_deferred("VecInferKVCache::trim (cuda)");
    if (batch_ == 0) return 0;
    std::vector<int64_t> l = lens_, rc = rch_;
    int64_t k = 0;
    for (size_t b = 0; b < l.size(); ++b) {
      const int64_t d = std::min(n, l[b]);
      l[b] -= d;
      rc[b] = std::max<int64_t>(0, rc[b] - d);
      k = std::max(k, d);
    }
    DeviceGuard g(device_.index);
    set_lengths_host(l, rc);
    return k;
  }

  // ---- state -----------------------------------------------------------------------------
  CacheState state() const override {
    collect_deferred("VecInferKVCache::state (cuda)");
    CacheState s;
    const int64_t D = config_.head_dim, R = config_.residual_length;
    const int64_t off = offset(), rc = rch_.empty() ? 0 : rch_[0];
    if (batch_ > 0) {
      require_uniform("VecInferKVCache::state (cuda)");
      for (int64_t r : rch_)
        VQ_CHECK_T(r == rc, UnsupportedError, "VecInferKVCache::state (cuda): window counts differ across the batch");
      DeviceGuard g(device_.index);
      wait();
      const int64_t nbh = batch_ * n_kv_heads_;
      if (mode_ != CacheMode::Standard && off > 0) {
        s.emplace_back("key_codes", download_codes(codes_k_, k_rs_, key_pq_.code_bytes, capacity_, 0, off, false));
        s.emplace_back("value_codes", download_codes(codes_v_, v_rs_, value_pq_.code_bytes, capacity_, 0, off, false));
      }
      if (mode_ == CacheMode::Standard && rc > 0) {
        s.emplace_back("pending_key_codes", download_codes(pend_k_, k_rs_, key_pq_.code_bytes, R, off - rc, rc, true));
        s.emplace_back("pending_value_codes",
                       download_codes(pend_v_, v_rs_, value_pq_.code_bytes, R, off - rc, rc, true));
      }
      if (mode_ != CacheMode::MemoryBound && off > 0) {
        s.emplace_back("keys", fetch_rows(held_k_, Device::cpu()));
        s.emplace_back("values", fetch_rows(held_v_, Device::cpu()));
      }
      if (mode_ == CacheMode::MemoryBound && rc > 0) {
        s.emplace_back("window_keys", download_ring(ring_k_, R, off - rc, rc));
        s.emplace_back("window_values", download_ring(ring_v_, R, off - rc, rc));
      }
      (void)nbh;
    }
    if (n_kv_heads_ > 0) {
      std::vector<float> lam = transform_.lambda;
      if (lam.empty()) lam.assign(size_t(n_kv_heads_) * size_t(D), 1.0f);
      s.emplace_back("smooth_factors", Tensor::from_floats(lam, {n_kv_heads_, D}));
    }
    s.emplace_back("key_codebook", Tensor::from_floats(key_pq_.codebook, {key_pq_.n_centroids, key_pq_.sub_dim}));
    s.emplace_back("value_codebook",
                   Tensor::from_floats(value_pq_.codebook, {value_pq_.n_centroids, value_pq_.sub_dim}));
    return s;
  }

  CacheMetaState meta_state() const override {
    collect_deferred("VecInferKVCache::meta_state (cuda)");
    return detail::vecinfer_meta_state({class_name(), mode_, offset(), rch_.empty() ? 0 : int64_t(rch_[0]), capacity_,
                                        batch_, n_kv_heads_, key_pq_.spec(), value_pq_.spec(),
                                        !transform_.use_smooth || transform_.lambda.empty(), random_codebooks_},
                                       config_);
  }

  void set_state(const CacheState& s) override {
    try {
      restore(s, meta_state());
      return;
    } catch (const FormatError&) {
    }
    staged_ = std::make_unique<CacheState>(s);  // for the set_meta_state that follows (mlx_lm order)
  }
  void set_meta_state(const CacheMetaState& m) override {
    if (staged_) {
      const CacheState s = *staged_;
      restore(s, m);
      return;
    }
    restore(state(), m);
  }

  void restore(const CacheState& state_in, const CacheMetaState& meta) override {
    // CPU copies of device tensors, then the CPU cache validates everything.
    CacheState state;
    for (const auto& [name, t] : state_in) state.emplace_back(name, t.device().is_cpu() ? t : Tensor::copy_of(t.view()));
    std::unique_ptr<VecInferKVCache> cpu = VecInferKVCache::from_state(state, meta);
    DeviceGuard g(device_.index);
    CudaVecInferCache fresh(*this, *cpu);  // builds every device buffer (may throw: nothing changed)
    const int64_t B = cpu->batch(), off = cpu->offset(), rc = cpu->residual_count();
    const CacheMode m = cpu->mode();
    const int64_t D = fresh.config_.head_dim, R = fresh.config_.residual_length;
    const int64_t nbh = B * fresh.n_kv_heads_;
    if (B > 0) {
      auto up_codes = [&](const char* name, Tensor& dst, int64_t rs, int64_t cb, int64_t rows, bool ring) {
        const Tensor* t = detail::state_find(state, name);
        if (!t) return;
        const int64_t n = t->dim(2);
        const int64_t p0 = off - n;
        std::vector<uint8_t> buf(size_t(nbh * rows * rs), 0);
        for (int64_t bh = 0; bh < nbh; ++bh)
          for (int64_t i = 0; i < n; ++i) {
            const int64_t slot = ring ? (p0 + i) % rows : i;
            std::memcpy(buf.data() + (bh * rows + slot) * rs, t->ptr<uint8_t>() + (bh * n + i) * cb, size_t(cb));
          }
        VQ_CU(cudaMemcpyAsync(dst.data(), buf.data(), buf.size(), cudaMemcpyHostToDevice, cs(fresh.stream_)));
        VQ_CU(cudaStreamSynchronize(cs(fresh.stream_)));
      };
      if (m != CacheMode::Standard) {
        up_codes("key_codes", fresh.codes_k_, fresh.k_rs_, fresh.key_pq_.code_bytes, fresh.capacity_, false);
        up_codes("value_codes", fresh.codes_v_, fresh.v_rs_, fresh.value_pq_.code_bytes, fresh.capacity_, false);
      } else if (R > 0) {
        up_codes("pending_key_codes", fresh.pend_k_, fresh.k_rs_, fresh.key_pq_.code_bytes, R, true);
        up_codes("pending_value_codes", fresh.pend_v_, fresh.v_rs_, fresh.value_pq_.code_bytes, R, true);
      }
      const size_t row = size_t(D) * dtype_size(fresh.config_.storage_dtype);
      if (m != CacheMode::MemoryBound && off > 0) {
        const Tensor* k = detail::state_find(state, "keys");
        const Tensor* v = detail::state_find(state, "values");
        copy_rows_2d(fresh.held_k_.data(), row, fresh.capacity_, 0, k->data(), row, off, 0, nbh, off, row,
                     cudaMemcpyHostToDevice, cs(fresh.stream_));
        copy_rows_2d(fresh.held_v_.data(), row, fresh.capacity_, 0, v->data(), row, off, 0, nbh, off, row,
                     cudaMemcpyHostToDevice, cs(fresh.stream_));
      }
      if (m == CacheMode::MemoryBound && rc > 0) {
        for (int w = 0; w < 2; ++w) {
          const Tensor* t = detail::state_find(state, w == 0 ? "window_keys" : "window_values");
          std::vector<uint8_t> buf(size_t(nbh * R) * row, 0);
          for (int64_t bh = 0; bh < nbh; ++bh)
            for (int64_t i = 0; i < rc; ++i)
              std::memcpy(buf.data() + (bh * R + (off - rc + i) % R) * row, t->ptr<uint8_t>() + (bh * rc + i) * row,
                          row);
          VQ_CU(cudaMemcpyAsync((w == 0 ? fresh.ring_k_ : fresh.ring_v_).data(), buf.data(), buf.size(),
                                cudaMemcpyHostToDevice, cs(fresh.stream_)));
          VQ_CU(cudaStreamSynchronize(cs(fresh.stream_)));
        }
      }
      fresh.set_lengths_host(std::vector<int64_t>(size_t(B), off), std::vector<int64_t>(size_t(B), rc));
    }
    VQ_CU(cudaStreamSynchronize(cs(fresh.stream_)));
    // commit (no throws below)
    swap_state(fresh);
    ++generation_;
    staged_.reset();
    discard_deferred();
  }

  // ---- accounting ------------------------------------------------------------------------
  int64_t compressed_key_bytes() const override {
    const int64_t n = mode_ == CacheMode::Standard ? (rch_.empty() ? 0 : rch_[0]) : offset();
    return batch_ * n_kv_heads_ * n * key_pq_.code_bytes;
  }
  int64_t compressed_value_bytes() const override {
    const int64_t n = mode_ == CacheMode::Standard ? (rch_.empty() ? 0 : rch_[0]) : offset();
    return batch_ * n_kv_heads_ * n * value_pq_.code_bytes;
  }
  int64_t fp16_key_bytes() const override {
    const int64_t n = mode_ == CacheMode::MemoryBound ? (rch_.empty() ? 0 : rch_[0]) : offset();
    return batch_ * n_kv_heads_ * n * config_.head_dim * dtype_size(config_.storage_dtype);
  }
  int64_t fp16_value_bytes() const override { return fp16_key_bytes(); }
  int64_t codebook_bytes() const override {
    int64_t n = 0;
    for (const Tensor* t : {&k_cb_, &v_cb_, &k_nrm_, &v_nrm_, &k_cb16_, &v_cb16_, &k_cb8_, &v_cb8_, &k_cb_op_,
                            &v_cb_op_, &lambda_, &inv_lambda_})
      if (t->defined()) n += t->nbytes();
    return n;
  }
  double assigned_avg_bits() const override {
    return (key_pq_.spec().bits_per_element() + value_pq_.spec().bits_per_element()) / 2.0;
  }
  bool uses_random_codebooks() const override { return random_codebooks_; }
  CacheMode mode() const override { return mode_; }

  int64_t nbytes() const override {
    int64_t n = nbytes_common() + codebook_bytes();
    // + the encoder's candidate grids (~124 KB per sub_dim-4 codebook of <= 256 centroids, 0.7-1.4
    // MB for 1024-4096 centroids once a throughput-mode encode has built them: overhead, not payload)
    for (const Tensor* t : {&held_k_, &held_v_, &codes_k_, &codes_v_, &pend_k_, &pend_v_, &ring_k_, &ring_v_,
                            &dec_best_, &dec_code_, &dec_count_, &snap_})
      if (t->defined()) n += t->nbytes();
    return n + k_grid_.nbytes() + v_grid_.nbytes();
  }
  std::string class_name() const override { return "VecInferKVCache"; }
  std::string describe() const override {
    std::ostringstream o;
    o << "VecInferKVCache (cuda " << device_name(device_) << ") " << cache_mode_name(mode_) << ": keys "
      << key_pq_.spec().str() << ", values " << value_pq_.spec().str() << " (" << assigned_avg_bits()
      << " bits/element assigned), residual " << config_.residual_length << " " << dtype_name(config_.storage_dtype)
      << " tokens" << (transform_.use_smooth && !transform_.lambda.empty() ? ", smooth" : "")
      << (config_.use_hadamard ? " + Hadamard" : ", no Hadamard") << " [batch=" << batch_
      << ", n_kv_heads=" << n_kv_heads_ << ", head_dim=" << config_.head_dim << "], " << offset() << " tokens, "
      << nbytes() << " bytes";
    if (cb_fmt() == 1) o << "; fused_sdpa reads e4m3 codebooks";
    if (cb_fmt() == 2) o << "; fused_sdpa scores int8 keys";
    if (cb_fmt() == 3) o << "; fused_sdpa scores int8 keys and reads int8 values";
    if (random_codebooks_) o << "; RANDOM CODEBOOKS (tests only, not a trained artifact)";
    for (const auto& [side, gr] : {std::pair<const char*, const cuda::DeviceEncodeGrid*>{"key", &k_grid_}, {"value", &v_grid_}})
      if (gr->host)
        o << "; " << side << " encoder grid " << gr->host->g << "^4 cells (" << gr->nbytes() / 1024 << " KB)";
    return o.str();
  }

 protected:
  cuda::AttnConfigKey attn_key(int nt) const override {
    if (mode_ == CacheMode::Standard) return {config_.head_dim, 4, 8, 4, 8, nt};  // fp16 path over K̂/V̂
    return {config_.head_dim, key_pq_.sub_dim,         key_pq_.codebook_bits, value_pq_.sub_dim, value_pq_.codebook_bits,
            nt,               cb_fmt()};
  }

  void fill_attn(cuda::AttnParams& p) const override {
    p.seq_len = len_.ptr<int32_t>();
    p.seq_len_rw = len_.ptr<int32_t>();
    p.res_count = rc_.ptr<int32_t>();
    p.res_count_rw = rc_.ptr<int32_t>();
    p.residual_length = config_.residual_length;
    p.win_bf16 = config_.storage_dtype == DType::BF16;
    if (mode_ == CacheMode::Standard) {
      p.k_win = held_k_.data();
      p.v_win = held_v_.data();
      p.win_cap = capacity_;
      p.win_ring = 0;
      p.win_all = 1;
      return;
    }
    p.k_codes = codes_k_.ptr<uint8_t>();
    p.v_codes = codes_v_.ptr<uint8_t>();
    p.code_cap = capacity_;
    p.k_row_stride = int(k_rs_);
    p.v_row_stride = int(v_rs_);
    if (cb_fmt() == 1 || cb_fmt() == 3) {
      p.k_cb8 = k_cb8_.ptr<uint8_t>();
      p.v_cb8 = v_cb8_.ptr<uint8_t>();
      p.k_cb_qmul = k_cb_qmul_;
      p.v_cb_omul = v_cb_omul_;
    } else if (cb_fmt() == 2) {
      p.k_cb8 = k_cb8_.ptr<uint8_t>();
      p.v_cb16 = v_cb16_.ptr<uint16_t>();
      p.k_cb_qmul = k_cb_qmul_;
    } else {
      p.k_cb16 = k_cb16_.ptr<uint16_t>();
      p.v_cb16 = v_cb16_.ptr<uint16_t>();
    }
    p.lambda = lambda_.defined() ? lambda_.ptr<float>() : nullptr;
    p.use_hadamard = config_.use_hadamard ? 1 : 0;
    p.hadamard_scale = float(1.0 / std::sqrt(double(hadamard_block_size(config_.head_dim))));  // hadamard.h's blocks
    if (mode_ == CacheMode::Stash) {
      p.k_win = held_k_.data();
      p.v_win = held_v_.data();
      p.win_cap = capacity_;
      p.win_ring = 0;
    } else {
      p.k_win = ring_k_.defined() ? ring_k_.data() : nullptr;
      p.v_win = ring_v_.defined() ? ring_v_.data() : nullptr;
      p.win_cap = std::max(config_.residual_length, 1);
      p.win_ring = 1;
    }
  }

 private:
  /// For restore: a new cache with `like`'s device/stream and `cpu`'s configuration, buffers
  /// allocated for cpu's batch and capacity, lengths zero (the caller uploads the contents).
  CudaVecInferCache(const CudaVecInferCache& like, const VecInferKVCache& cpu) : CudaCacheBase(like.config_) {
    KVCacheConfig c = cpu.config();
    c.device = like.device_;
    c.stream = like.stream_;
    c.attention_codebooks = like.config_.attention_codebooks;  // a device choice, not part of the state
    config_ = c;
    init_from(cpu.key_quantizer(), cpu.value_quantizer(), cpu.key_transform(), cpu.uses_random_codebooks(), c);
    if (cpu.batch() > 0) {
      first_shape(cpu.batch(), cpu.n_kv_heads());
      grow_to(std::max(cpu.capacity(), cpu.offset()));
    }
  }

  void init_from(const ProductQuantizer& kp, const ProductQuantizer& vp, const KeyTransform& tf, bool random_cb,
                 const KVCacheConfig& c) {
    mode_ = c.mode();
    key_pq_ = kp;
    value_pq_ = vp;
    transform_ = tf;
    random_codebooks_ = random_cb;
    const int D = c.head_dim;
    const std::string why = cuda::cache_unsupported(CacheKind::VecInfer, mode_, D, kp.spec(), vp.spec(),
                                                    c.attention_codebooks);  // cuda_support() reports the same
    VQ_CHECK_T(why.empty(), UnsupportedError, why);
    no_attention_ = cuda::cache_attention_missing(CacheKind::VecInfer, mode_, D, kp.spec(), vp.spec(),
                                                  c.attention_codebooks);
    k_rs_ = round_up(kp.code_bytes, 4);
    v_rs_ = round_up(vp.code_bytes, 4);
    k_cb_ = upload_f32(kp.codebook, {kp.n_centroids, kp.sub_dim}, device_);
    v_cb_ = upload_f32(vp.codebook, {vp.n_centroids, vp.sub_dim}, device_);
    k_nrm_ = upload_f32(kp.centroid_norms, {kp.n_centroids}, device_);
    v_nrm_ = upload_f32(vp.centroid_norms, {vp.n_centroids}, device_);
    k_cb16_ = v_cb16_ = k_cb8_ = v_cb8_ = Tensor{};
    k_cb_qmul_ = v_cb_omul_ = 1.0f;
    cb_fmt_ = 0;
    if (mode_ != CacheMode::Standard && c.attention_codebooks == CodebookFormat::E4M3) {
      const E4M3Codebook ke = make_e4m3_codebook(kp.codebook), ve = make_e4m3_codebook(vp.codebook);
      k_cb8_ = upload_u8(ke.bytes, {kp.n_centroids, kp.sub_dim}, device_);
      v_cb8_ = upload_u8(ve.bytes, {vp.n_centroids, vp.sub_dim}, device_);
      k_cb_qmul_ = 1.0f / ke.scale, v_cb_omul_ = 1.0f / ve.scale;  // powers of two: exact
      cb_fmt_ = 1;
    } else if (mode_ != CacheMode::Standard &&
               (c.attention_codebooks == CodebookFormat::I8 || c.attention_codebooks == CodebookFormat::I8KV)) {
      const I8Codebook ki = make_i8_codebook(kp.codebook);
      const std::vector<uint8_t> kb(ki.bytes.begin(), ki.bytes.end());  // the int8 bytes as stored
      k_cb8_ = upload_u8(kb, {kp.n_centroids, kp.sub_dim}, device_);
      k_cb_qmul_ = ki.scale;
      if (c.attention_codebooks == CodebookFormat::I8KV) {
        const I8Codebook vi = make_i8_codebook(vp.codebook);
        v_cb8_ = upload_u8(i8_offset_binary(vi), {vp.n_centroids, vp.sub_dim}, device_);
        v_cb_omul_ = vi.scale;
        cb_fmt_ = 3;
      } else {
        v_cb16_ = upload_u16(to_half_bits(vp.codebook), {vp.n_centroids, vp.sub_dim}, device_);
        cb_fmt_ = 2;
      }
    } else if (mode_ != CacheMode::Standard) {
      k_cb16_ = upload_u16(to_half_bits(kp.codebook), {kp.n_centroids, kp.sub_dim}, device_);
      v_cb16_ = upload_u16(to_half_bits(vp.codebook), {vp.n_centroids, vp.sub_dim}, device_);
    }
    // The centroids the decode kernel reads, as f32, where they differ from the codebooks by more
    // than fp16 rounding (E4M3 keys and values, int8 keys, int8 values): prefill over
    // dequantized rows expands the codes with these, so its rows agree with every other path
    // of the cache (materialize_rows). Elsewhere it reads the f32 codebooks.
    k_cb_op_ = v_cb_op_ = Tensor{};
    // A Stash cache's rows are dequantized with the f32 codebooks: prefill may attend over them
    // (holds_every_row) only where those are the decode kernel's centroids up to fp16 rounding
    // (fp16 codebooks; int8 ones whose codebooks lie on their int8 grid, int8_key_grid), so
    // that a chunk's prefill and its decode agree; E4M3 codebooks never do.
    held_rows_match_ = false;
    if (mode_ == CacheMode::Stash) {
      const CodebookFormat f = c.attention_codebooks;
      held_rows_match_ = f == CodebookFormat::F16 ||
                         ((f == CodebookFormat::I8 || f == CodebookFormat::I8KV) &&
                          within_fp16(make_i8_codebook(kp.codebook).decoded, kp.codebook) &&
                          (f == CodebookFormat::I8 || within_fp16(make_i8_codebook(vp.codebook).decoded, vp.codebook)));
    }
    if (mode_ == CacheMode::MemoryBound) {
      const CodebookFormat f = c.attention_codebooks;
      if (f == CodebookFormat::E4M3) {
        k_cb_op_ = upload_f32(make_e4m3_codebook(kp.codebook).decoded, {kp.n_centroids, kp.sub_dim}, device_);
        v_cb_op_ = upload_f32(make_e4m3_codebook(vp.codebook).decoded, {vp.n_centroids, vp.sub_dim}, device_);
      } else if (f == CodebookFormat::I8 || f == CodebookFormat::I8KV) {
        k_cb_op_ = upload_f32(make_i8_codebook(kp.codebook).decoded, {kp.n_centroids, kp.sub_dim}, device_);
        if (f == CodebookFormat::I8KV)
          v_cb_op_ = upload_f32(make_i8_codebook(vp.codebook).decoded, {vp.n_centroids, vp.sub_dim}, device_);
      }
    }
    // candidate grids of sub_dim-4 codebooks: the bulk encoder re-ranks a cell's few candidates
    // instead of scanning the codebook (src/core/pq_grid.h). Codebooks of <= 256 centroids get
    // theirs here (host build, ~35 ms, ~124 KB, shared between caches of one codebook); larger
    // ones (up to 4096: 0.7-1.4 MB) built on the device once the cache's throughput-mode encodes
    // reach cuda::grid_build_after() token-heads (ensure_grids), so a cache that only decodes, or
    // prefills little, never holds one
    // (none at head dims that are not powers of two: their encoder scans, cuda::encode_launch)
    const bool grids = (c.head_dim & (c.head_dim - 1)) == 0;
    if (grids && kp.n_centroids <= 256) k_grid_ = cuda::upload_encode_grid(kp.codebook.data(), kp.n_centroids, kp.sub_dim, device_);
    if (grids && vp.n_centroids <= 256) v_grid_ = cuda::upload_encode_grid(vp.codebook.data(), vp.n_centroids, vp.sub_dim, device_);
    grids_tried_ = !grids || (kp.n_centroids <= 256 && vp.n_centroids <= 256);
    k_cmax_ = v_cmax_ = 0.0f;
    for (float x : kp.centroid_norms) k_cmax_ = std::max(k_cmax_, std::sqrt(x));
    for (float x : vp.centroid_norms) v_cmax_ = std::max(v_cmax_, std::sqrt(x));
    if (tf.n_kv_heads > 0) n_kv_heads_ = tf.n_kv_heads, config_.n_kv_heads = tf.n_kv_heads;
    config_.key_codebook.reset();
    config_.value_codebook.reset();
    config_.smooth_factors.reset();
    upload_transform();
  }

  void upload_transform() {
    lambda_ = Tensor{};
    inv_lambda_ = Tensor{};
    if (transform_.n_kv_heads > 0 && transform_.use_smooth && !transform_.lambda.empty()) {
      lambda_ = upload_f32(transform_.lambda, {transform_.n_kv_heads, transform_.head_dim}, device_);
      inv_lambda_ = upload_f32(transform_.inv_lambda, {transform_.n_kv_heads, transform_.head_dim}, device_);
    }
  }

  /// First update (or reserve): batch and heads known now; transform (identity if none yet),
  /// per-batch arrays, ring/pending buffers.
  void first_shape(int64_t B, int64_t H) {
    if (transform_.n_kv_heads == 0) {
      transform_ = KeyTransform(int(H), config_.head_dim, {}, config_.use_hadamard);
      upload_transform();
    }
    batch_ = B;
    n_kv_heads_ = int(H);
    config_.n_kv_heads = int(H);
    ensure_length_arrays(B, true);
    const int64_t R = config_.residual_length;
    if (R > 0 && mode_ == CacheMode::Standard) {
      pend_k_ = code_buffer(B * H * R * k_rs_, device_);
      pend_v_ = code_buffer(B * H * R * v_rs_, device_);
    }
    if (R > 0 && mode_ == CacheMode::MemoryBound) {
      ring_k_ = Tensor::zeros({B, H, R, config_.head_dim}, config_.storage_dtype, device_);
      ring_v_ = Tensor::zeros({B, H, R, config_.head_dim}, config_.storage_dtype, device_);
    }
  }

  void grow_to(int64_t needed) {
    const bool held = mode_ != CacheMode::MemoryBound, codes = mode_ != CacheMode::Standard;
    if (needed <= capacity_ && (held ? held_k_.defined() : codes_k_.defined())) return;
    const int64_t cap = std::max<int64_t>(round_up(std::max<int64_t>(needed, 1), config_.step), config_.step);
    const int64_t B = batch_, H = n_kv_heads_, D = config_.head_dim, keep = offset();
    Tensor nk, nv, nck, ncv;
    if (held) {
      nk = Tensor::empty({B, H, cap, D}, config_.storage_dtype, device_);
      nv = Tensor::empty({B, H, cap, D}, config_.storage_dtype, device_);
    }
    if (codes) {
      nck = code_buffer(B * H * cap * k_rs_, device_);
      ncv = code_buffer(B * H * cap * v_rs_, device_);
    }
    if (keep > 0 && capacity_ > 0) {
      const size_t row = size_t(D) * dtype_size(config_.storage_dtype);
      if (held) {
        copy_rows_2d(nk.data(), row, cap, 0, held_k_.data(), row, capacity_, 0, B * H, keep, row,
                     cudaMemcpyDeviceToDevice, cs(stream_));
        copy_rows_2d(nv.data(), row, cap, 0, held_v_.data(), row, capacity_, 0, B * H, keep, row,
                     cudaMemcpyDeviceToDevice, cs(stream_));
      }
      if (codes) {
        copy_rows_2d(nck.data(), k_rs_, cap, 0, codes_k_.data(), k_rs_, capacity_, 0, B * H, keep, k_rs_,
                     cudaMemcpyDeviceToDevice, cs(stream_));
        copy_rows_2d(ncv.data(), v_rs_, cap, 0, codes_v_.data(), v_rs_, capacity_, 0, B * H, keep, v_rs_,
                     cudaMemcpyDeviceToDevice, cs(stream_));
      }
      wait();
    }
    held_k_ = nk;
    held_v_ = nv;
    codes_k_ = nck;
    codes_v_ = ncv;
    capacity_ = cap;
  }

  bool can_materialize() const override { return mode_ == CacheMode::MemoryBound && offset() > 0; }
  bool holds_every_row() const override {
    return mode_ == CacheMode::Stash && held_rows_match_ && held_k_.defined() && offset() > 0;
  }
  void materialize_rows(void* k, void* v, int64_t cap) const override {
    cuda::EncodeParams e = enc_params(DevTensor4{}, DevTensor4{}, 0);
    if (k_cb_op_.defined()) e.k_cb = k_cb_op_.ptr<float>();
    if (v_cb_op_.defined()) e.v_cb = v_cb_op_.ptr<float>();
    e.k_ring = ring_k_.defined() ? ring_k_.data() : nullptr;
    e.v_ring = ring_v_.defined() ? ring_v_.data() : nullptr;
    e.ring_cap = std::max<int64_t>(config_.residual_length, 1);
    e.k_win = k;
    e.v_win = v;
    e.win_cap = cap;
    e.win_ring = 0;
    e.gate = nullptr;
    cuda::materialize_launch(e, cap, stream_);
  }

  cuda::EncodeParams enc_params(const DevTensor4& k, const DevTensor4& v, int n) const {
    cuda::EncodeParams e;
    e.batch = int(batch_);
    e.n_kv_heads = n_kv_heads_;
    e.head_dim = config_.head_dim;
    e.n_new = n;
    e.k = k;
    e.v = v;
    e.inv_lambda = inv_lambda_.defined() ? inv_lambda_.ptr<float>() : nullptr;
    e.lambda = lambda_.defined() ? lambda_.ptr<float>() : nullptr;
    e.use_hadamard = config_.use_hadamard ? 1 : 0;
    e.hadamard_scale = float(1.0 / std::sqrt(double(hadamard_block_size(config_.head_dim))));
    e.k_cb = k_cb_.ptr<float>();
    e.v_cb = v_cb_.ptr<float>();
    e.k_norms = k_nrm_.ptr<float>();
    e.v_norms = v_nrm_.ptr<float>();
    e.k_bits = key_pq_.codebook_bits;
    e.v_bits = value_pq_.codebook_bits;
    e.k_sub = key_pq_.sub_dim;
    e.v_sub = value_pq_.sub_dim;
    e.k_cmax = k_cmax_;
    e.v_cmax = v_cmax_;
    e.k_grid = k_grid_.view;
    e.v_grid = v_grid_.view;
    e.k_row_stride = int(k_rs_);
    e.v_row_stride = int(v_rs_);
    e.win_bf16 = config_.storage_dtype == DType::BF16;
    e.seq_len = len_.ptr<int32_t>();
    e.res_count = rc_.ptr<int32_t>();
    e.residual_length = config_.residual_length;
    e.error_flag = err_.ptr<int>();
    if (dec_best_.defined()) {  // decode-mode encode over several blocks (planned decode steps)
      e.dec_slices = cuda::kEncDecSlices;
      e.dec_ws_best = dec_best_.ptr<float>();
      e.dec_ws_code = dec_code_.ptr<int>();
      e.dec_ws_count = dec_count_.ptr<int>();
      e.dec_ws_jobs = dec_jobs_;
    }
    const int64_t R = config_.residual_length;
    switch (mode_) {
      case CacheMode::Standard:
        e.k_codes = R > 0 ? pend_k_.ptr<uint8_t>() : nullptr;
        e.v_codes = R > 0 ? pend_v_.ptr<uint8_t>() : nullptr;
        e.code_cap = std::max<int64_t>(R, 1);
        e.codes_ring = 1;
        e.k_win = held_k_.data();
        e.v_win = held_v_.data();
        e.win_cap = capacity_;
        e.win_ring = 0;
        e.deq_outside = 1;
        break;
      case CacheMode::Stash:
        e.k_codes = codes_k_.ptr<uint8_t>();
        e.v_codes = codes_v_.ptr<uint8_t>();
        e.code_cap = capacity_;
        e.codes_ring = 0;
        e.k_win = held_k_.data();
        e.v_win = held_v_.data();
        e.win_cap = capacity_;
        e.win_ring = 0;
        e.deq_outside = 1;
        break;
      case CacheMode::MemoryBound:
        e.k_codes = codes_k_.ptr<uint8_t>();
        e.v_codes = codes_v_.ptr<uint8_t>();
        e.code_cap = capacity_;
        e.codes_ring = 0;
        e.k_win = R > 0 ? ring_k_.data() : nullptr;
        e.v_win = R > 0 ? ring_v_.data() : nullptr;
        e.win_cap = std::max<int64_t>(R, 1);
        e.win_ring = 1;
        e.deq_outside = 0;
        break;
    }
    return e;
  }

  void ensure_step_workspace(int q_len) override {
    // token groups per side, at most (the workspace only grows: update() sizes it for its
    // own token count, and a planned step's count must stay covered)
    const int64_t jobs = std::max<int64_t>(batch_ * n_kv_heads_ * q_len, dec_jobs_);
    const int64_t n = 2 * jobs * cuda::kEncDecSlices * 32 * cuda::encode_decode_slots(config_.head_dim);
    if (!dec_best_.defined() || dec_best_.numel() < n) {
      dec_best_ = Tensor::empty({n}, DType::F32, device_);
      dec_code_ = Tensor::empty({n}, DType::I32, device_);
    }
    if (!dec_count_.defined() || dec_count_.numel() < 2 * jobs) dec_count_ = Tensor::zeros({2 * jobs}, DType::I32, device_);
    dec_jobs_ = jobs;
    // the overlapped decode step's lengths snapshot, side stream and events (plan time: a
    // captured step must not create them)
    if (mode_ == CacheMode::MemoryBound && config_.residual_length >= q_len) {
      if (!snap_.defined() || snap_.numel() < 2 * batch_) snap_ = Tensor::zeros({2 * batch_}, DType::I32, device_);
      ensure_side_streams();
    }
    if (key_pq_.sub_dim != value_pq_.sub_dim) ensure_side_streams();  // (launch_append's two encodes)
  }

  /// The cache's side streams (lowest priority, non-blocking) and fork/join events.
  void ensure_side_streams() {
    if (side_) return;
    int least = 0, greatest = 0;
    VQ_CU(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    prio_hi_ = greatest;
    VQ_CU(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, least));
    VQ_CU(cudaStreamCreateWithPriority(&side2_, cudaStreamNonBlocking, least));
    VQ_CU(cudaEventCreateWithFlags(&ev_fork_, cudaEventDisableTiming));
    VQ_CU(cudaEventCreateWithFlags(&ev_join_, cudaEventDisableTiming));
    VQ_CU(cudaEventCreateWithFlags(&ev_join2_, cudaEventDisableTiming));
  }

  /// Whether a decode step of n tokens can overlap its encode with attention: a MemoryBound
  /// window that holds the step's tokens (attention then reads none of their codes), planned
  /// (snapshot, side streams), the process-wide switch on, and, for keys and values of two
  /// sub_dims (two encode launches, one per side stream), cuda::overlap_two_launches() (default
  /// on: run 94).
  bool overlap_ready(int n) const {
    return cuda::overlapped_step_allowed() && mode_ == CacheMode::MemoryBound && config_.residual_length >= n &&
           n >= 1 && side_ && snap_.defined() && snap_.numel() >= 2 * batch_ &&
           (key_pq_.sub_dim == value_pq_.sub_dim || cuda::overlap_two_launches());
  }

  /// Evicts (Standard/Stash) and encodes n new tokens at the device lengths (not advanced). In
  /// latency mode, keys and values of different sub_dims (two encode launches, e.g. the
  /// defaults' d4 keys and d8 values) run side by side: the values' launch on a side stream
  /// forked from and joined back into the cache's stream before this returns
  /// (cuda::overlap_two_launches() off: one after the other). Both ways write the same bytes.
  /// Returns whether the side stream was joined back (the last operation on the cache's stream is
  /// then an event wait, not a kernel).
  bool launch_append(const DevTensor4& k, const DevTensor4& v, int n, bool decode_mode, const int* gate = nullptr) {
    cuda::EncodeParams e = enc_params(k, v, n);
    e.gate = gate;
    if (mode_ != CacheMode::MemoryBound && config_.residual_length > 0) cuda::evict_launch(e, stream_);
    if (decode_mode && side_ && key_pq_.sub_dim != value_pq_.sub_dim && cuda::overlap_two_launches()) {
      VQ_CU(cudaEventRecord(ev_fork_, cs(stream_)));
      cuda::EncodeParams ek = e;
      ek.sides = 1;
      cuda::encode_launch(ek, true, stream_);
      encode_beside(e, 2, side_, ev_join_);
      return true;
    }
    cuda::encode_launch(e, decode_mode, stream_);
    return false;
  }

  /// The candidate grids of codebooks of more than 256 centroids, built on the device once
  /// (update() decides when; not while the stream is being captured: that encode scans).
  /// The build (synchronous, 9-46 ms) happens before the call changes anything, so a failure
  /// leaves the cache as it was.
  void ensure_grids() {
    if (grids_tried_ || capturing()) return;
    cuda::DeviceEncodeGrid kg = k_grid_, vg = v_grid_;
    if (!kg.host && key_pq_.n_centroids > 256)
      kg = cuda::build_encode_grid_on_device(key_pq_.codebook.data(), key_pq_.n_centroids, key_pq_.sub_dim, device_);
    if (!vg.host && value_pq_.n_centroids > 256)
      vg = cuda::build_encode_grid_on_device(value_pq_.codebook.data(), value_pq_.n_centroids, value_pq_.sub_dim, device_);
    k_grid_ = std::move(kg), v_grid_ = std::move(vg);
    grids_tried_ = true;
  }

  /// The latency-mode encode of `sides` of e on side stream `sd`, after the work the cache's
  /// stream had queued when ev_fork_ was recorded (the caller records it), and joined back: the
  /// cache's stream waits for it through `join` before anything queued after this call.
  void encode_beside(cuda::EncodeParams e, int sides, cudaStream_t sd, cudaEvent_t join) {
    VQ_CU(cudaStreamWaitEvent(sd, ev_fork_, 0));
    e.sides = sides;
    cuda::encode_launch(e, true, sd);
    VQ_CU(cudaEventRecord(join, sd));
    VQ_CU(cudaStreamWaitEvent(cs(stream_), join, 0));
  }

  Tensor fetch_rows(const Tensor& held, Device where) const {
    require_uniform("VecInferKVCache::update_and_fetch (cuda)");
    const int64_t off = offset(), D = config_.head_dim;
    const size_t row = size_t(D) * dtype_size(config_.storage_dtype);
    Tensor t = Tensor::empty({batch_, n_kv_heads_, off, D}, config_.storage_dtype, where.is_cpu() ? where : device_);
    DeviceGuard g(device_.index);
    copy_rows_2d(t.data(), row, off, 0, held.data(), row, capacity_, 0, batch_ * n_kv_heads_, off, row,
                 where.is_cpu() ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice, cs(stream_));
    if (where.is_cpu()) wait();
    return t;
  }

  /// Codes of positions [p0, p0 + n) as U8 [B, H, n, code_bytes] on the CPU (ring: slot p % rows).
  Tensor download_codes(const Tensor& buf, int64_t rs, int64_t cb, int64_t rows, int64_t p0, int64_t n,
                        bool ring) const {
    const int64_t nbh = batch_ * n_kv_heads_;
    std::vector<uint8_t> all(size_t(nbh * rows * rs));
    VQ_CU(cudaMemcpy(all.data(), buf.data(), all.size(), cudaMemcpyDeviceToHost));
    Tensor t = Tensor::empty({batch_, n_kv_heads_, n, cb}, DType::U8);
    for (int64_t bh = 0; bh < nbh; ++bh)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t slot = ring ? (p0 + i) % rows : p0 + i;
        std::memcpy(t.ptr<uint8_t>() + (bh * n + i) * cb, all.data() + (bh * rows + slot) * rs, size_t(cb));
      }
    return t;
  }

  Tensor download_ring(const Tensor& ring, int64_t R, int64_t p0, int64_t n) const {
    const int64_t nbh = batch_ * n_kv_heads_, D = config_.head_dim;
    const size_t row = size_t(D) * dtype_size(config_.storage_dtype);
    std::vector<uint8_t> all(size_t(nbh * R) * row);
    VQ_CU(cudaMemcpy(all.data(), ring.data(), all.size(), cudaMemcpyDeviceToHost));
    Tensor t = Tensor::empty({batch_, n_kv_heads_, n, D}, config_.storage_dtype);
    for (int64_t bh = 0; bh < nbh; ++bh)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(t.ptr<uint8_t>() + (bh * n + i) * row, all.data() + (bh * R + (p0 + i) % R) * row, row);
    return t;
  }

  void swap_state(CudaVecInferCache& o) {
    std::swap(config_, o.config_);
    std::swap(plan_, o.plan_);
    std::swap(rch_, o.rch_);
    std::swap(len_, o.len_);
    std::swap(rc_, o.rc_);
    std::swap(counters_, o.counters_);
    std::swap(ws_o_, o.ws_o_);
    std::swap(ws_ml_, o.ws_ml_);
    std::swap(lens_, o.lens_);
    std::swap(capacity_, o.capacity_);
    std::swap(batch_, o.batch_);
    std::swap(n_kv_heads_, o.n_kv_heads_);
    std::swap(mode_, o.mode_);
    std::swap(key_pq_, o.key_pq_);
    std::swap(value_pq_, o.value_pq_);
    std::swap(transform_, o.transform_);
    std::swap(random_codebooks_, o.random_codebooks_);
    std::swap(k_rs_, o.k_rs_);
    std::swap(v_rs_, o.v_rs_);
    std::swap(k_cmax_, o.k_cmax_);
    std::swap(v_cmax_, o.v_cmax_);
    std::swap(k_cb_qmul_, o.k_cb_qmul_);
    std::swap(cb_fmt_, o.cb_fmt_);
    std::swap(held_rows_match_, o.held_rows_match_);
    std::swap(v_cb_omul_, o.v_cb_omul_);
    std::swap(dec_best_, o.dec_best_);
    std::swap(dec_code_, o.dec_code_);
    std::swap(dec_count_, o.dec_count_);
    std::swap(dec_jobs_, o.dec_jobs_);
    std::swap(k_grid_, o.k_grid_);
    std::swap(v_grid_, o.v_grid_);
    std::swap(grids_tried_, o.grids_tried_);
    std::swap(bulk_th_, o.bulk_th_);
    const auto mine = content_tensors(), theirs = o.content_tensors();
    for (size_t i = 0; i < mine.size(); ++i) std::swap(*mine[i], *theirs[i]);
  }

  /// The device tensors of what the cache holds (codebooks, transforms, held rows, codes, window
  /// rings): what a restore swaps in (swap_state) and what a captured step reads (step_buffers).
  std::array<Tensor*, 20> content_tensors() {
    return {&k_cb_,   &v_cb_,       &k_nrm_,  &v_nrm_,  &k_cb16_,  &v_cb16_,  &k_cb8_,  &v_cb8_,  &k_cb_op_, &v_cb_op_,
            &lambda_, &inv_lambda_, &held_k_, &held_v_, &codes_k_, &codes_v_, &pend_k_, &pend_v_, &ring_k_,  &ring_v_};
  }

  void step_buffers(std::vector<const Tensor*>& out) const override {
    for (const Tensor* t : const_cast<CudaVecInferCache*>(this)->content_tensors()) out.push_back(t);
    out.insert(out.end(), {&dec_best_, &dec_code_, &dec_count_, &snap_, &k_grid_.cells, &k_grid_.lists,
                           &v_grid_.cells, &v_grid_.lists});
  }

  CacheMode mode_ = CacheMode::Standard;
  ProductQuantizer key_pq_, value_pq_;
  KeyTransform transform_;
  bool random_codebooks_ = false;
  int64_t k_rs_ = 4, v_rs_ = 4;
  float k_cmax_ = 0, v_cmax_ = 0;
  float k_cb_qmul_ = 1, v_cb_omul_ = 1;  // E4M3: 1/scale of the key and value codebooks; int8 keys: the key scale
  Tensor k_cb_, v_cb_, k_nrm_, v_nrm_, k_cb16_, v_cb16_, k_cb8_, v_cb8_, lambda_, inv_lambda_;
  bool held_rows_match_ = false;  // Stash: the held rows agree with the decode kernel's centroids
  Tensor k_cb_op_, v_cb_op_;  // the decode kernel's centroids as f32, where they differ (materialize_rows)
  /// candidate grids of the codebooks (counted in nbytes, not in codebook_bytes; null pointers: none)
  cuda::DeviceEncodeGrid k_grid_, v_grid_;
  bool grids_tried_ = false;  ///< every codebook's grid built (or found impossible)
  int64_t bulk_th_ = 0;       ///< token-heads encoded in throughput mode (when to build the grids)
  /// The codebooks fused_sdpa reads (AttnConfigKey::cb_fmt: 0 fp16, 1 E4M3, 2 int8 keys; coded modes).
  int cb_fmt_ = 0;
  int cb_fmt() const { return cb_fmt_; }
  Tensor held_k_, held_v_, codes_k_, codes_v_, pend_k_, pend_v_, ring_k_, ring_v_;
  // decode-mode encode workspace (EncodeParams::dec_*), sized by plan_decode
  Tensor dec_best_, dec_code_, dec_count_;
  int64_t dec_jobs_ = 0;
  // the overlapped decode step (plan_decode): lengths snapshot I32 [2·batch], the encode's side
  // streams (non-blocking; the second for values of another sub_dim), the fork/join events,
  // attention's launch priority. Not swapped by swap_state: they belong to this object, not to
  // its contents.
  Tensor snap_;
  cudaStream_t side_ = nullptr, side2_ = nullptr;
  cudaEvent_t ev_fork_ = nullptr, ev_join_ = nullptr, ev_join2_ = nullptr;
  int prio_hi_ = 0;
  std::unique_ptr<CacheState> staged_;
};

}  // namespace

namespace detail {
std::unique_ptr<KVCache> create_cuda_cache(const KVCacheConfig& config) {
  config.validate();
  switch (config.kind) {
    case CacheKind::FP16: return std::make_unique<CudaFP16Cache>(config);
    case CacheKind::VecInfer: return std::make_unique<CudaVecInferCache>(config);
  }
  VQ_THROW(ValueError, "create_cuda_cache: unknown cache kind " << int(config.kind));
}
}  // namespace detail

}  // namespace veloxquant
