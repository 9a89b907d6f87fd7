// veloxquant/runtime/model_cuda.h — the forward pass of a loaded Model on a CUDA device.
//
// CudaModel uploads the Model's weights once (f16/bf16 kept as they are, or expanded to f32 on
// request) and runs the same network as Model::forward, op for op: embedding lookup, RMSNorm,
// q/k/v projections (+ biases), Qwen3's q/k RMSNorm, RoPE from the runtime's own tables
// (make_rope_table: the same scalings as the CPU), attention through the per-layer caches,
// SwiGLU MLP, final norm and lm_head. Matrix products run on cuBLAS with fp32 accumulation
// (no TF32); activations are f32 on the device. Work is queued on one stream per device
// (blocking, kept for the whole process); decode calls replay a CUDA graph of the step
// (CudaModelOptions::cuda_graphs).
//
// Caches: make_caches() builds device-resident caches (KVCacheFactory with config.device =
// the model's device: fp16 or VecInfer, whose update/fused_sdpa take device tensors). The
// device caches take head_dim 64, 80, 96, 112, 128, 160, 192 and 256; CPU caches (the
// runtime's make_caches) are accepted too: q/k/v then go to the host for attention and back.
//
// Without CUDA in the build, CudaModel::create throws CudaError ("veloxquant was built without
// CUDA"). Nothing here includes a CUDA header and nothing changes with the CUDA option.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "veloxquant/runtime/model.h"

namespace veloxquant::detail {
class CudaDecoder;
}

namespace veloxquant::runtime {

struct CudaModelOptions {
  int device = 0;            ///< CUDA ordinal
  /// Keep weights in f32 on the device (exact products with the f32 activations, 2× the
  /// memory of a bf16 checkpoint). Off: f16/bf16 weights stay as they are and activations are
  /// rounded to that dtype before each matrix product, as a half-precision framework does.
  bool weights_f32 = false;
  /// Decode calls (one token, the device caches of make_caches) replay a CUDA graph of the
  /// whole step instead of launching its ~15 kernels and products per layer from the host; the
  /// graph is captured again where the caches grow or re-plan (see DecodeGraphStats). Off: every
  /// call runs eagerly (the results agree up to the order of floating-point sums, which is the
  /// same in both: the tests compare them).
  bool cuda_graphs = true;
};

/// What the decode graphs did so far (CudaModel::graph_stats).
struct DecodeGraphStats {
  int64_t captures = 0;        ///< decode steps captured (the first, then after growth or a new plan)
  int64_t instantiations = 0;  ///< captures instantiated anew (the others updated the graph in place)
  int64_t replays = 0;         ///< decode calls served by a graph replay
  int64_t eager_steps = 0;     ///< one-token calls with caches that ran eagerly
  int64_t kernel_nodes = 0;    ///< kernels in the last captured step (the products' included): its launches
  std::string off_reason;      ///< why graphs are off for this model ("" while they are on)
  std::string last_eager_reason;  ///< why the last eager one-token call was not a replay
};

class CudaModel {
 public:
  /// Uploads `model`'s weights to the device. `model` must outlive the CudaModel (its config
  /// and RoPE frequencies are read at every call). Throws CudaError without CUDA or a device.
  static std::unique_ptr<CudaModel> create(const Model& model, const CudaModelOptions& options = {});
  ~CudaModel();

  const Model& model() const { return model_; }
  Device device() const { return Device::cuda(options_.device); }
  /// Bytes of device memory the weights take.
  int64_t weight_bytes() const;
  /// The decode graphs' counters (CudaModelOptions::cuda_graphs).
  DecodeGraphStats graph_stats() const;

  /// As Model::forward: runs `tokens` at positions caches[0]->offset() .., appends their K/V to
  /// the caches and returns logits [n_out, vocab] on the host. Caches are device caches of
  /// this device or CPU caches. options.path picks Fetch or Fused for CPU caches as the CPU
  /// forward does; device caches use update + fused_sdpa, or, for one token with the caches of
  /// make_caches and no observer, a replay of the captured decode step (their decode_step).
  /// options.observer sees each layer's post-RoPE K/V on the host (one device-to-host copy per
  /// layer when set). On an exception the caches are left as they were.
  std::vector<float> forward(std::span<const int32_t> tokens, LayerCaches& caches,
                             const ForwardOptions& options = {}) const;

  /// As Model::forward_nocache: `tokens` at positions 0 .. n−1 without caches, each layer
  /// attending over the tokens' own K/V (the model's mask) rounded through kv_dtype (F32:
  /// exact), attention in f32 on the device: what calibration's collection (collect_kv_samples
  /// with CollectParams::forward_nocache) needs, the CPU pass's samples up to summation order.
  std::vector<float> forward_nocache(std::span<const int32_t> tokens, DType kv_dtype = DType::F32,
                                     bool all_logits = true, const KVObserver& observer = {}) const;

  /// Device-resident caches (one per layer) for `options` on this model's device and stream
  /// (random codebooks, or the artifact's with options.artifact_path, as runtime::make_caches).
  LayerCaches make_caches(const CacheOptions& options) const;

 private:
  CudaModel(const Model& model, const CudaModelOptions& options);
  void ensure_rope(int64_t n_positions) const;

  const Model& model_;
  CudaModelOptions options_;
  std::unique_ptr<detail::CudaDecoder> dec_;
};

}  // namespace veloxquant::runtime
