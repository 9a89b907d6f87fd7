// Internal: the device side of the runtime's CUDA forward pass (a Llama-family decoder on one
// GPU). It knows nothing about checkpoints or the Model class: src/runtime/model_cuda.cpp fills a
// CudaDecoderDesc from a loaded Model (host weight pointers, f32 small vectors, RoPE tables the
// runtime computes) and drives it. Implemented in src/cuda/runtime_decoder.cu when built with
// CUDA, else in src/core/cuda_decoder_stub.cpp, which throws CudaError("veloxquant was built
// without CUDA"). No CUDA header here: the stream is opaque.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "veloxquant/attention.h"
#include "veloxquant/dtype.h"

namespace veloxquant {
class KVCache;
}

namespace veloxquant::detail {

/// A host weight matrix [rows, cols] row-major (F32, F16 or BF16), rows contiguous.
struct HostMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;  ///< out_features
  int64_t cols = 0;  ///< in_features
};

/// One decoder layer's host weights; empty vectors: absent.
struct CudaDecoderLayerDesc {
  std::vector<float> input_norm, post_norm;  // [hidden]
  std::vector<float> q_norm, k_norm;         // [head_dim] (Qwen3)
  HostMatrix wq, wk, wv, wo;                 // [n_heads·hd, hidden], [n_kv·hd, hidden] ×2, [hidden, n_heads·hd]
  std::vector<float> bq, bk, bv, bo;
  HostMatrix w_gate, w_up, w_down;           // [inter, hidden] ×2, [hidden, inter]
  std::vector<float> b_gate, b_up, b_down;
};

struct CudaDecoderDesc {
  int hidden = 0, intermediate = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, vocab = 0;
  float rms_eps = 1e-6f;
  bool qk_norm = false;
  HostMatrix embed;    // [vocab, hidden]
  HostMatrix lm_head;  // [vocab, hidden] (may be the same memory as embed: uploaded once)
  std::vector<float> final_norm;  // [hidden]
  std::vector<CudaDecoderLayerDesc> layers;
  /// Weights on the device in f32 (exact products with f32 activations; 2× the memory of a
  /// bf16 checkpoint), else in their checkpoint dtype with activations rounded to that dtype
  /// before each matrix product (as a half-precision framework computes).
  bool weights_f32 = false;
  Device device = Device::cuda(0);
};

/// The decoder on one device. Activations are f32 on the device; matrix products are
/// cublasGemmEx with fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32).
class CudaDecoder {
 public:
  virtual ~CudaDecoder() = default;
  /// RoPE cos/sin tables [n_positions, head_dim/2] for positions 0 .. n_positions−1, already
  /// multiplied by the attention factor (the runtime's make_rope_table). Replaces the old ones.
  virtual void set_rope_table(const std::vector<float>& cos, const std::vector<float>& sin,
                              int64_t n_positions) = 0;
  virtual int64_t rope_positions() const = 0;
  /// Called once per layer with the post-RoPE keys and the values of the new tokens, k, v
  /// [n, n_kv_heads, head_dim] f32 on the host (valid during the call only); the runtime's
  /// KVObserver (runtime/model.h) has this signature.
  using LayerObserver = std::function<void(int layer, const float* k, const float* v, int64_t n)>;

  /// Runs tokens [n] at positions start .. start+n−1 through every layer, attending through
  /// caches (one per layer: CUDA caches on this device — update + fused_sdpa on device tensors —
  /// or CPU caches — q/k/v copied to the host and back; fetch_path: for CPU caches, use
  /// update_and_fetch + attention_cpu instead of update + fused_sdpa). With no caches at all
  /// (`caches` empty), the pass is cache-less as Model::forward_nocache: each layer attends
  /// over the new tokens' own K/V (the model's mask: causal, sliding window), rounded through
  /// `nocache_kv_dtype` (F32: exact), in f32 on the device (a warp per query row and head).
  /// `observer` (may be empty) sees every layer's K/V before they are
  /// stored or rounded. Returns logits [n_out, vocab] on the host (n_out = n with all_logits,
  /// else 1). On an exception (the observer's included), caches already updated by this call
  /// are trimmed back.
  virtual std::vector<float> forward(const int32_t* tokens, int64_t n, int64_t start,
                                     const std::vector<KVCache*>& caches, const std::vector<bool>& fetch_path,
                                     const SdpaParams& params, bool all_logits, DType nocache_kv_dtype,
                                     const LayerObserver& observer) = 0;
  /// Bytes of device memory the weights take.
  virtual int64_t weight_bytes() const = 0;

  /// The stream everything is queued on (a cudaStream_t): one per device for the process,
  /// created at the first decoder and never destroyed, so caches made on it (CudaModel::
  /// make_caches) outlive any decoder. It is a blocking stream: work on the legacy default
  /// stream (caches made elsewhere) stays ordered with it.
  virtual void* stream() const = 0;

  /// Decode steps through CUDA graphs (on by default). A forward call of one token whose caches
  /// are all device caches on stream(), with one sequence each and no observer, runs as one
  /// graph replay: the step (embedding, every layer's products and small ops, each cache's
  /// CudaKVCache::decode_step, the final norm, lm_head and the logits' copy) is captured once
  /// and replayed while every cache's capture_key(), the attention parameters, the RoPE table
  /// and the activation buffers stay as captured; otherwise it is captured again (the caches'
  /// capacity is grown ahead in steps of max(step, capacity/8) tokens, and plan_decode follows
  /// the length, so that happens a few dozen times over a long generation). The token and its
  /// position go in by one copy before the replay; each cache's host lengths advance through
  /// advance_seq_lens, which reads the step's input-check verdict. Any other call, and a step
  /// whose capture fails (graphs then stay off for this decoder: graph_stats().off_reason),
  /// runs eagerly as before.
  virtual void set_graphs(bool on) = 0;
  struct GraphStats {
    int64_t captures = 0;        ///< steps captured
    int64_t instantiations = 0;  ///< of those, the ones instantiated anew (else updated in place)
    int64_t replays = 0;         ///< decode calls served by a replay
    int64_t eager_steps = 0;     ///< one-token calls with caches that ran eagerly
    int64_t kernel_nodes = 0;    ///< kernels in the last captured step (cuBLAS's included)
    std::string off_reason;      ///< why graphs are off ("" while on)
    std::string last_eager_reason;  ///< why the last eager one-token call was not replayed
  };
  virtual GraphStats graph_stats() const = 0;
};

std::unique_ptr<CudaDecoder> create_cuda_decoder(const CudaDecoderDesc& desc);

}  // namespace veloxquant::detail
