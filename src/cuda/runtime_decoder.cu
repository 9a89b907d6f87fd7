// src/cuda/runtime_decoder.cu — the runtime's forward pass of a Llama-family decoder on one GPU
// (core/cuda_decoder.h): the CPU forward of src/runtime/model.cpp, op for op, on the device.
//
// Activations (all f32, row-major, device):
//   x, h      [n_tokens, hidden]                   residual stream / normed or projected rows
//   q, att    [n_tokens, n_heads, head_dim]        seen by the caches as [1, n_heads, n_tokens, head_dim]
//   k, v      [n_tokens, n_kv_heads, head_dim]     seen as [1, n_kv_heads, n_tokens, head_dim]
//   g, u      [n_tokens, intermediate]
//   lowp      [n_tokens, max(hidden, inter, n_heads·hd)] f16/bf16: activations rounded to the
//             weights' dtype for a half-precision product (weights_f32 off)
//   rope_cos, rope_sin [n_positions, head_dim/2]   the runtime's table (attention factor folded in)
// Weights: [out, in] row-major as the checkpoint stores nn.Linear, in f32 or their own dtype.
//
// Matrix products are cublasGemmEx with CUBLAS_COMPUTE_32F (fp32 accumulation, never TF32: the
// tests compare against the CPU forward at ~1e-4). The small ops are one plain kernel each: at
// decode time they move a few KB and the products (weight streaming) dominate; fusing them is a
// later optimisation. Attention goes through the caches' own device path (update, then
// fused_sdpa on device tensors); CPU caches are also accepted (q/k/v copied over and back), so
// head sizes the device caches do not compile still run. Everything is queued on the runtime's
// stream of the device (runtime_stream: blocking, so caches on the legacy default stream stay
// ordered with it), which the caches created by the runtime use too.
//
// Decode steps (one token, device caches on that stream) replay a CUDA graph of the whole step
// (CudaDecoder::set_graphs): the same kernels and products as the eager call, the RoPE position
// and the token read from a device word the host fills before each replay, and each cache's
// decode_step in place of update + fused_sdpa (its plan follows the length as the eager call's
// does).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "core/cuda_decoder.h"
#include "cuda/cuda_util.cuh"
#include "veloxquant/attention.h"
#include "veloxquant/cache.h"
#include "veloxquant/cuda_cache.h"
#include "veloxquant/error.h"
#include "veloxquant/tensor.h"

namespace veloxquant::detail {
namespace {

#define VQ_CUBLAS(expr)                                                                       \
  do {                                                                                        \
    const cublasStatus_t vq_st_ = (expr);                                                     \
    if (vq_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      VQ_THROW(CudaError, #expr << " failed: cuBLAS status " << int(vq_st_) << " (" << __FILE__ \
                                << ":" << __LINE__ << ")");                                  \
  } while (0)

// Deferred input checks (CudaKVCache::set_deferred_checks) on the device caches of one forward
// call, restored to their previous setting at the end. collect(T) reads every verdict: a layer
// whose check failed did not apply its update (its cache is as it was), every other layer's T
// tokens are trimmed, and a ValueError names the first failing layer. On other errors the
// forward's own handler trims the updated layers (trim raises and repairs a failed check first).
class DeferredChecks {
 public:
  explicit DeferredChecks(const std::vector<KVCache*>& caches) : caches_(caches), was_(caches.size(), -1) {
    for (size_t l = 0; l < caches_.size(); ++l)
      if (auto* cc = dynamic_cast<CudaKVCache*>(caches_[l])) {
        was_[l] = cc->deferred_checks() ? 1 : 0;
        cc->set_deferred_checks(true);
      }
  }
  ~DeferredChecks() {
    for (size_t l = 0; l < caches_.size(); ++l)
      if (was_[l] == 0) try {
          static_cast<CudaKVCache*>(caches_[l])->set_deferred_checks(false);
        } catch (...) {  // (the forward is unwinding already; trim repaired the cache)
        }
  }
  DeferredChecks(const DeferredChecks&) = delete;
  DeferredChecks& operator=(const DeferredChecks&) = delete;

  void collect(int64_t T) {
    std::vector<char> failed(caches_.size(), 0);
    std::string first;
    int first_layer = -1, n_failed = 0;
    for (size_t l = 0; l < caches_.size(); ++l) {
      if (was_[l] < 0) continue;
      try {
        static_cast<CudaKVCache*>(caches_[l])->check_inputs();
      } catch (const ValueError& e) {
        failed[l] = 1;
        ++n_failed;
        if (first_layer < 0) first_layer = int(l), first = e.what();
      }
    }
    if (n_failed == 0) return;
    for (size_t l = 0; l < caches_.size(); ++l)
      if (!failed[l]) caches_[l]->trim(T);
    VQ_THROW(ValueError, "CUDA forward: layer " << first_layer << " (" << n_failed << " layer(s) in all): " << first
                                                << "; no cache keeps this call's " << T << " token(s)");
  }

 private:
  const std::vector<KVCache*>& caches_;
  std::vector<int> was_;  // -1: not a device cache; else its setting before the call
};

// ---- kernels -------------------------------------------------------------------------------

// out[t, :] = table[tokens[t], :] as f32. grid: n_tokens blocks.
__global__ void embed_kernel(const void* table, DType dt, const int32_t* tokens, int64_t hidden, float* out) {
  const int64_t t = blockIdx.x;
  const int64_t row = tokens[t];
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x)
    out[t * hidden + c] = cuda::load_f(table, dt, row * hidden + c);
}

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) ⊙ w. One block per row; x and y may alias
// (every element is read and written by the same thread).
__global__ void rmsnorm_kernel(const float* x, const float* w, float* y, int dim, float eps) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += xr[c] * xr[c];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    ss = lane < int(blockDim.x >> 5) ? part[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) part[0] = ss;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(part[0] / float(dim) + eps);
  for (int c = threadIdx.x; c < dim; c += blockDim.x) yr[c] = xr[c] * inv * w[c];
}

// Rotary embedding in place ("rotate half"), x [n_tokens, heads, head_dim], token t at
// position start + t; one thread per (t, head, i < half).
__global__ void rope_kernel(float* x, int64_t n_tokens, int heads, int head_dim, const float* cos_t,
                            const float* sin_t, int64_t start, const int32_t* start_dev) {
  if (start_dev) start = *start_dev;  // a captured decode step: the position the host wrote
  const int half = head_dim / 2;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * heads * half) return;
  const int i = int(idx % half);
  const int64_t th = idx / half;  // t * heads + h
  const int64_t t = th / heads;
  const float c = cos_t[(start + t) * half + i], s = sin_t[(start + t) * half + i];
  float* v = x + th * head_dim;
  const float a = v[i], b = v[i + half];
  v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float a = g[i];
  out[i] = (a / (1.0f + expf(-a))) * u[i];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// y [rows, cols] += bias [cols] per row.
__global__ void add_bias_kernel(float* y, const float* bias, int64_t n, int64_t cols) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += bias[i % cols];
}

__global__ void round_kernel(const float* x, void* out, DType dt, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) cuda::store_f(out, dt, i, x[i]);
}

// x rounded through dt (F16 or BF16, round to nearest even) and back to f32, in place: the
// cache-less pass's K/V storage rounding (Model::forward_nocache's round_through).
__global__ void round_through_kernel(float* x, DType dt, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  x[i] = dt == DType::F16 ? __half2float(__float2half_rn(x[i])) : __bfloat162float(__float2bfloat16_rn(x[i]));
}

// The cache-less pass's attention on the device (Model::forward_nocache: each query attends over
// the window's own keys, query t at position t): q [T, nh, hd], k, v [T, nkv, hd], out [T, nh,
// hd], all f32. One warp per (query, head), lane l holding dims l, l + 32, ... (E of them, the
// tail masked for head_dim not a multiple of 32); per visible key one warp-reduced dot product
// and an online-softmax update in f32 (attn_visible's rule: causal, sliding window). A row that
// sees no key gets zeros, as attention_ref. Plain on purpose: O(T²) CUDA-core work, meant for
// calibration's windows (512 tokens by default), not for long ones; checked against the CPU pass
// (CudaRuntime*.Cacheless*).
template <int E>
__global__ void window_attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                        const float* __restrict__ v, float* __restrict__ out, int T, int nh,
                                        int nkv, int hd, float scale, bool causal, int64_t window) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(T) * nh) return;
  const int p = int(w / nh), h = int(w % nh), kh = h / (nh / nkv);
  const float* qr = q + (int64_t(p) * nh + h) * hd;
  float qv[E], acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int d = lane + 32 * e;
    qv[e] = d < hd ? qr[d] * scale : 0.0f;
    acc[e] = 0.0f;
  }
  const int64_t first = int64_t(p) - window + 1;
  const int lo = window > 0 && first > 0 ? int(first) : 0;
  const int hi = causal ? p : T - 1;
  float m = -INFINITY, l = 0.0f;
  for (int j = lo; j <= hi; ++j) {
    const float* kr = k + (int64_t(j) * nkv + kh) * hd;
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane + 32 * e;
      if (d < hd) s = fmaf(qv[e], kr[d], s);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), pj = expf(s - m_new);
    l = l * corr + pj;
    const float* vr = v + (int64_t(j) * nkv + kh) * hd;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane + 32 * e;
      acc[e] = acc[e] * corr + (d < hd ? pj * vr[d] : 0.0f);
    }
    m = m_new;
  }
  float* orow = out + (int64_t(p) * nh + h) * hd;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int d = lane + 32 * e;
    if (d < hd) orow[d] = acc[e] * inv;
  }
}

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

void window_attention(const float* q, const float* k, const float* v, float* out, int T, int nh, int nkv, int hd,
                      const SdpaParams& sp, cudaStream_t stream) {
  const float scale = sp.scale > 0.0f ? sp.scale : 1.0f / std::sqrt(float(hd));
  const unsigned blocks = blocks_for(int64_t(T) * nh * 32);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(q, k, v, out, T, nh, nkv, hd, scale, sp.causal, sp.sliding_window);
  };
  if (hd <= 32) launch(window_attention_kernel<1>);
  else if (hd <= 64) launch(window_attention_kernel<2>);
  else if (hd <= 96) launch(window_attention_kernel<3>);
  else if (hd <= 128) launch(window_attention_kernel<4>);
  else if (hd <= 256) launch(window_attention_kernel<8>);
  else if (hd <= 512) launch(window_attention_kernel<16>);
  else VQ_THROW(UnsupportedError, "CUDA forward: the cache-less pass supports head_dim up to 512, got " << hd);
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) VQ_THROW(CudaError, "runtime forward: launching " << what << " failed: " << cudaGetErrorString(e));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: VQ_THROW(ValueError, "runtime forward: weights must be f32, f16 or bf16, got " << dtype_name(t));
  }
}

/// The runtime's stream on `device` (the current device): created once per process and never
/// destroyed, since the caches CudaModel::make_caches builds keep it (CudaDecoder::stream).
/// Blocking: the legacy default stream waits for it and it for that stream.
cudaStream_t runtime_stream(int device) {
  static std::mutex mu;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(device);
  if (it != streams.end()) return it->second;
  cudaStream_t s = nullptr;
  VQ_CUDA_CHECK(cudaStreamCreate(&s));
  streams[device] = s;
  return s;
}

/// Device memory freed on destruction.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void alloc(size_t n) {
    if (n <= bytes) return;
    if (p) {
      VQ_CUDA_CHECK(cudaDeviceSynchronize());  // a queued kernel may still use the old buffer
      VQ_CUDA_CHECK(cudaFree(p));
      p = nullptr;
      bytes = 0;
    }
    VQ_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 4)));
    bytes = n;
  }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

struct DevMatrix {
  const void* data = nullptr;  // device, [rows, cols]
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
};

struct DevLayer {
  const float *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;
  const float *b_gate = nullptr, *b_up = nullptr, *b_down = nullptr;
  DevMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
};

class CudaDecoderImpl final : public CudaDecoder {
 public:
  explicit CudaDecoderImpl(const CudaDecoderDesc& d) : d_(d) {
    VQ_CHECK_VALUE(d.device.is_cuda(), "CUDA forward: device must be a CUDA device, got " << device_name(d.device));
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
      cudaGetLastError();
      VQ_THROW(CudaError, "CUDA forward: no CUDA device is visible");
    }
    VQ_CHECK_VALUE(d.device.index < n_dev,
                   "CUDA forward: device cuda:" << d.device.index << " requested, " << n_dev << " visible");
    VQ_CUDA_CHECK(cudaSetDevice(d.device.index));
    s_ = runtime_stream(d.device.index);
    VQ_CUBLAS(cublasCreate(&blas_));
    VQ_CUBLAS(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));  // no TF32 with CUBLAS_COMPUTE_32F
    VQ_CUBLAS(cublasSetStream(blas_, s_));
    // One workspace of our own for eager and captured products alike (the same algorithms in
    // both; a capture allocates nothing)
    blas_ws_.alloc(size_t(32) << 20);
    VQ_CUBLAS(cublasSetWorkspace(blas_, blas_ws_.p, blas_ws_.bytes));
    VQ_CUDA_CHECK(cudaMallocHost(&host_in_, 2 * sizeof(int32_t)));
    embed_ = upload_matrix(d.embed);
    lm_head_ = upload_matrix(d.lm_head);
    final_norm_ = upload_vec(d.final_norm);
    for (const CudaDecoderLayerDesc& L : d.layers) {
      DevLayer o;
      o.input_norm = upload_vec(L.input_norm);
      o.post_norm = upload_vec(L.post_norm);
      o.q_norm = upload_vec(L.q_norm);
      o.k_norm = upload_vec(L.k_norm);
      o.bq = upload_vec(L.bq);
      o.bk = upload_vec(L.bk);
      o.bv = upload_vec(L.bv);
      o.bo = upload_vec(L.bo);
      o.b_gate = upload_vec(L.b_gate);
      o.b_up = upload_vec(L.b_up);
      o.b_down = upload_vec(L.b_down);
      o.wq = upload_matrix(L.wq);
      o.wk = upload_matrix(L.wk);
      o.wv = upload_matrix(L.wv);
      o.wo = upload_matrix(L.wo);
      o.w_gate = upload_matrix(L.w_gate);
      o.w_up = upload_matrix(L.w_up);
      o.w_down = upload_matrix(L.w_down);
      layers_.push_back(o);
    }
    VQ_CUDA_CHECK(cudaDeviceSynchronize());
  }

  ~CudaDecoderImpl() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (host_logits_) cudaFreeHost(host_logits_);
    if (host_in_) cudaFreeHost(host_in_);
    if (blas_) cublasDestroy(blas_);
  }

  int64_t weight_bytes() const override { return weight_bytes_; }
  int64_t rope_positions() const override { return rope_n_; }
  void* stream() const override { return s_; }
  void set_graphs(bool on) override { graphs_ = on; }
  GraphStats graph_stats() const override { return stats_; }

  void set_rope_table(const std::vector<float>& cos, const std::vector<float>& sin, int64_t n) override {
    const int64_t half = d_.head_dim / 2;
    VQ_CHECK_SHAPE(int64_t(cos.size()) == n * half && int64_t(sin.size()) == n * half,
                   "set_rope_table: expected cos and sin [n_positions=" << n << ", head_dim/2=" << half << "], got "
                                                                        << cos.size() << " and " << sin.size()
                                                                        << " values");
    VQ_CUDA_CHECK(cudaSetDevice(d_.device.index));
    rope_cos_.alloc(cos.size() * 4);
    rope_sin_.alloc(sin.size() * 4);
    upload(rope_cos_.p, cos.data(), cos.size() * 4);
    upload(rope_sin_.p, sin.data(), sin.size() * 4);
    rope_n_ = n;
    ++rope_gen_;  // (a captured step reads the old table's address)
  }

  std::vector<float> forward(const int32_t* tokens, int64_t T, int64_t start, const std::vector<KVCache*>& caches,
                             const std::vector<bool>& fetch_path, const SdpaParams& sp, bool all_logits,
                             DType nocache_kv_dtype, const LayerObserver& observer) override {
    const int64_t H = d_.hidden, nh = d_.n_heads, nkv = d_.n_kv_heads, hd = d_.head_dim;
    const int n_layers = int(layers_.size());
    const bool nocache = caches.empty();
    VQ_CHECK_VALUE(T > 0, "CUDA forward: no tokens");
    VQ_CHECK_VALUE((nocache || int64_t(caches.size()) == n_layers) && fetch_path.size() == caches.size(),
                   "CUDA forward: expected " << n_layers << " caches (one per layer), got " << caches.size());
    VQ_CHECK_VALUE(!nocache || start == 0, "CUDA forward: a cache-less pass starts at position 0, got " << start);
    VQ_CHECK_VALUE(start + T <= rope_n_, "CUDA forward: positions up to " << start + T << " but the RoPE table holds "
                                                                           << rope_n_);
    for (int l = 0; l < int(caches.size()); ++l) {
      const Device cd = caches[size_t(l)]->config().device;
      VQ_CHECK_VALUE(cd.is_cpu() || cd == d_.device, "CUDA forward: the cache of layer "
                                                         << l << " lives on " << device_name(cd)
                                                         << ", the model on " << device_name(d_.device));
    }
    VQ_CUDA_CHECK(cudaSetDevice(d_.device.index));
    ensure_buffers(T);
    if (T == 1 && !nocache) {
      if (std::optional<std::vector<float>> r = graph_step(tokens[0], start, caches, sp, observer)) return *r;
      ++stats_.eager_steps;
    }
    float *x = x_.as<float>(), *h = h_.as<float>(), *q = q_.as<float>(), *k = k_.as<float>(), *v = v_.as<float>();
    float *att = att_.as<float>();
    upload(tok_.p, tokens, size_t(T) * 4);
    embed_kernel<<<unsigned(T), kThreads, 0, s_>>>(embed_.data, embed_.dtype, tok_.as<int32_t>(), H, x);
    check_launch("embed");

    // The device caches' update() queues its input range check instead of waiting for it (one
    // host round trip per layer otherwise): the verdicts are read once, after the logits' copy
    DeferredChecks deferred(caches);
    const Device dev = d_.device;
    auto heads_view = [&](float* p, int64_t heads, Device where) {
      return TensorView(p, DType::F32, {1, heads, T, hd}, {T * heads * hd, hd, heads * hd, 1}, where);
    };
    int layers_updated = 0;
    try {
      for (int l = 0; l < n_layers; ++l) {
        before_attention(l, T, start, nullptr);
        const Device cpu = Device::cpu();
        auto to_host = [&](std::vector<float>& dst, const float* src, int64_t heads) {
          dst.resize(size_t(T * heads * hd));
          download(dst.data(), src, dst.size() * 4);
        };
        if (observer) {  // before the K/V are stored or rounded, as the CPU pass calls it
          to_host(hk_, k, nkv);
          to_host(hv_, v, nkv);
          observer(l, hk_.data(), hv_.data(), T);
        }
        if (nocache) {
          // Model::forward_nocache: this window's own K/V, rounded as asked, attended in f32.
          if (nocache_kv_dtype != DType::F32) {
            round_through_kernel<<<blocks_for(T * nkv * hd), kThreads, 0, s_>>>(k, nocache_kv_dtype, T * nkv * hd);
            round_through_kernel<<<blocks_for(T * nkv * hd), kThreads, 0, s_>>>(v, nocache_kv_dtype, T * nkv * hd);
            check_launch("round_through");
          }
          window_attention(q, k, v, att, int(T), int(nh), int(nkv), int(hd), sp, s_);
          check_launch("window_attention");
        } else if (KVCache& cache = *caches[size_t(l)]; cache.config().device.is_cuda()) {
          cache.update(heads_view(k, nkv, dev), heads_view(v, nkv, dev));
          ++layers_updated;
          cache.fused_sdpa_into(heads_view(q, nh, dev), heads_view(att, nh, dev), sp);
        } else {
          // CPU cache: the host does attention (as model.cpp) on copies of q/k/v.
          to_host(hq_, q, nh);
          if (!observer) {
            to_host(hk_, k, nkv);
            to_host(hv_, v, nkv);
          }
          ho_.resize(size_t(T * nh * hd));
          const TensorView qv = heads_view(hq_.data(), nh, cpu), kv = heads_view(hk_.data(), nkv, cpu);
          const TensorView vv = heads_view(hv_.data(), nkv, cpu), ov = heads_view(ho_.data(), nh, cpu);
          if (!fetch_path[size_t(l)]) {
            cache.update(kv, vv);
            ++layers_updated;
            cache.fused_sdpa_into(qv, ov, sp);
          } else {
            auto [K, V] = cache.update_and_fetch(kv, vv);
            ++layers_updated;
            attention_cpu(qv, K.view(), V.view(), ov, sp);
          }
          upload(att, ho_.data(), ho_.size() * 4);
        }
        after_attention(l, T);
      }
    } catch (...) {
      for (int l = 0; l < layers_updated; ++l) {
        try {
          caches[size_t(l)]->trim(T);
        } catch (...) {
        }
      }
      throw;
    }
    const int64_t rows = all_logits ? T : 1;
    rmsnorm(x + (T - rows) * H, rows, H, final_norm_, h);
    gemm(h, rows, lm_head_, nullptr, logits_.as<float>());
    std::vector<float> out(size_t(rows * d_.vocab));
    download(out.data(), logits_.p, out.size() * 4);
    deferred.collect(T);
    return out;
  }

 private:
  // ---- decode steps through a CUDA graph (set_graphs) ------------------------------------------

  /// One token at `start` as a graph replay, capturing the step first where the graph is
  /// missing or stale; nullopt (nothing done, nothing changed) where this call must run eagerly.
  std::optional<std::vector<float>> graph_step(int32_t token, int64_t start, const std::vector<KVCache*>& caches,
                                               const SdpaParams& sp, const LayerObserver& observer) {
    auto eager = [&](std::string why) -> std::optional<std::vector<float>> {
      stats_.last_eager_reason = std::move(why);
      return std::nullopt;
    };
    if (!graphs_) return eager("CUDA graphs are off");
    if (!stats_.off_reason.empty()) return eager(stats_.off_reason);
    if (observer) return eager("a KV observer is set");
    const int nh = d_.n_heads;
    std::vector<CudaKVCache*> cc(caches.size());
    for (size_t l = 0; l < caches.size(); ++l) {
      auto* c = dynamic_cast<CudaKVCache*>(caches[l]);
      if (!c) return eager("the cache of layer " + std::to_string(l) + " is on the CPU");
      if (c->stream() != static_cast<void*>(s_))
        return eager("the cache of layer " + std::to_string(l) + " is on another stream than the model's");
      if (c->seq_lens().size() != 1 || c->offset() != start)
        return eager("the cache of layer " + std::to_string(l) + " does not hold one sequence of " +
                     std::to_string(start) + " tokens");
      cc[l] = c;
    }
    // Room for the token (ahead, so the graph outlives several growths' worth of steps), the
    // plan of a step at this length (as the eager call plans it), mapped verdict words (the
    // first set_deferred_checks(true) allocates them) and no unverified update before capturing.
    for (CudaKVCache* c : cc) {
      if (c->capacity() < start + 1) {
        const int64_t step = std::max<int64_t>(c->config().step, 1);
        const int64_t want = start + 1 + std::max<int64_t>(step, c->capacity() / 8);
        c->reserve((want + step - 1) / step * step);
      }
      c->plan_decode(nh, 1, start + 1);
    }
    std::vector<uint64_t> keys(cc.size());
    for (size_t l = 0; l < cc.size(); ++l) keys[l] = cc[l]->capture_key();
    const bool stale = !exec_ || caches != g_caches_ || keys != g_keys_ || sp.scale != g_sp_.scale ||
                       sp.causal != g_sp_.causal || sp.sliding_window != g_sp_.sliding_window ||
                       bufs_gen_ != g_bufs_gen_ || rope_gen_ != g_rope_gen_;
    if (stale) {
      for (CudaKVCache* c : cc) {
        if (!c->deferred_checks()) {
          c->set_deferred_checks(true);
          c->set_deferred_checks(false);
        } else {
          c->check_inputs();
        }
      }
      for (size_t l = 0; l < cc.size(); ++l) keys[l] = cc[l]->capture_key();
      if (!capture(cc, sp)) return eager(stats_.off_reason);
      g_caches_ = caches;
      g_keys_ = keys;
      g_sp_ = sp;
      g_bufs_gen_ = bufs_gen_;
      g_rope_gen_ = rope_gen_;
    }
    host_in_[0] = token;
    host_in_[1] = int32_t(start);
    VQ_CUDA_CHECK(cudaMemcpyAsync(step_in_.p, host_in_, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, s_));
    VQ_CUDA_CHECK(cudaGraphLaunch(exec_, s_));
    VQ_CUDA_CHECK(cudaStreamSynchronize(s_));
    ++stats_.replays;
    std::vector<float> out(host_logits_, host_logits_ + d_.vocab);
    // Every cache's verdict, as DeferredChecks::collect: a layer whose step failed its input
    // check applied nothing (its lengths reset to the device's); the others are trimmed back.
    std::vector<char> failed(cc.size(), 0);
    std::string first;
    int first_layer = -1, n_failed = 0;
    for (size_t l = 0; l < cc.size(); ++l) {
      try {
        cc[l]->advance_seq_lens(1);
      } catch (const ValueError& e) {
        failed[l] = 1;
        ++n_failed;
        if (first_layer < 0) first_layer = int(l), first = e.what();
      }
    }
    if (n_failed > 0) {
      for (size_t l = 0; l < cc.size(); ++l)
        if (!failed[l]) caches[l]->trim(1);
      VQ_THROW(ValueError, "CUDA forward: layer " << first_layer << " (" << n_failed << " layer(s) in all): "
                                                  << first << "; no cache keeps this call's 1 token(s)");
    }
    return out;
  }

  /// Captures the decode step into exec_ (updated in place where the graph's shape allows).
  /// False, with graphs off for this decoder and the reason in stats_.off_reason, where the
  /// capture fails (nothing ran, no cache changed).
  bool capture(const std::vector<CudaKVCache*>& cc, const SdpaParams& sp) {
    const int64_t H = d_.hidden;
    const int nh = d_.n_heads;
    if (!host_logits_) VQ_CUDA_CHECK(cudaMallocHost(&host_logits_, size_t(d_.vocab) * sizeof(float)));
    step_in_.alloc(2 * sizeof(int32_t));
    const int32_t* in = step_in_.as<int32_t>();
    cudaGraph_t graph = nullptr;
    VQ_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
    try {
      float *x = x_.as<float>(), *h = h_.as<float>();
      embed_kernel<<<1, kThreads, 0, s_>>>(embed_.data, embed_.dtype, in, H, x);
      check_launch("embed");
      for (int l = 0; l < int(layers_.size()); ++l) {
        before_attention(l, 1, 0, in + 1);
        cc[size_t(l)]->decode_step_raw(q_.p, k_.p, v_.p, att_.p, DType::F32, nh, 1, sp);
        after_attention(l, 1);
      }
      rmsnorm(x, 1, H, final_norm_, h);
      gemm(h, 1, lm_head_, nullptr, logits_.as<float>());
      VQ_CUDA_CHECK(cudaMemcpyAsync(host_logits_, logits_.p, size_t(d_.vocab) * sizeof(float),
                                    cudaMemcpyDeviceToHost, s_));
      VQ_CUDA_CHECK(cudaStreamEndCapture(s_, &graph));
    } catch (const std::exception& e) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(s_, &broken);
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();
      stats_.off_reason = std::string("capturing a decode step failed: ") + e.what();
      return false;
    }
    ++stats_.captures;
    if (exec_) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(exec_, graph, &info) != cudaSuccess) {
        cudaGetLastError();
        cudaGraphExecDestroy(exec_);
        exec_ = nullptr;
      }
    }
    if (!exec_) {
      const cudaError_t e = cudaGraphInstantiateWithFlags(&exec_, graph, cudaGraphInstantiateFlagUseNodePriority);
      if (e != cudaSuccess) {
        cudaGetLastError();
        exec_ = nullptr;
        cudaGraphDestroy(graph);
        stats_.off_reason = std::string("instantiating the decode step's graph failed: ") + cudaGetErrorString(e);
        return false;
      }
      ++stats_.instantiations;
    }
    cudaGraphDestroy(graph);
    return true;
  }

  // ---- one layer's ops around attention (eager calls and captured steps) -----------------------

  /// RMSNorm, the q/k/v products (+ biases), Qwen3's q/k norms and RoPE at positions start ..
  /// (start_dev: read from the device instead) into q_, k_, v_.
  void before_attention(int l, int64_t T, int64_t start, const int32_t* start_dev) {
    const DevLayer& L = layers_[size_t(l)];
    const int64_t H = d_.hidden, nh = d_.n_heads, nkv = d_.n_kv_heads, hd = d_.head_dim;
    float *x = x_.as<float>(), *h = h_.as<float>(), *q = q_.as<float>(), *k = k_.as<float>(), *v = v_.as<float>();
    rmsnorm(x, T, H, L.input_norm, h);
    gemm(h, T, L.wq, L.bq, q);
    gemm(h, T, L.wk, L.bk, k);
    gemm(h, T, L.wv, L.bv, v);
    if (d_.qk_norm) {
      rmsnorm(q, T * nh, hd, L.q_norm, q);
      rmsnorm(k, T * nkv, hd, L.k_norm, k);
    }
    rope(q, T, int(nh), start, start_dev);
    rope(k, T, int(nkv), start, start_dev);
  }

  /// The output product, the residual, RMSNorm and the SwiGLU MLP from att_ back into x_.
  void after_attention(int l, int64_t T) {
    const DevLayer& L = layers_[size_t(l)];
    const int64_t H = d_.hidden, I = d_.intermediate;
    float *x = x_.as<float>(), *h = h_.as<float>(), *att = att_.as<float>(), *g = g_.as<float>(), *u = u_.as<float>();
    gemm(att, T, L.wo, L.bo, h);
    add(x, h, T * H);
    rmsnorm(x, T, H, L.post_norm, h);
    gemm(h, T, L.w_gate, L.b_gate, g);
    gemm(h, T, L.w_up, L.b_up, u);
    silu_mul_kernel<<<blocks_for(T * I), kThreads, 0, s_>>>(g, u, g, T * I);
    check_launch("silu_mul");
    gemm(g, T, L.w_down, L.b_down, h);
    add(x, h, T * H);
  }

  /// Host → device and device → host copies on the stream, waited for.
  void upload(void* dst, const void* src, size_t bytes) {
    VQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s_));
    VQ_CUDA_CHECK(cudaStreamSynchronize(s_));
  }
  void download(void* dst, const void* src, size_t bytes) {
    VQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s_));
    VQ_CUDA_CHECK(cudaStreamSynchronize(s_));
  }

  const float* upload_vec(const std::vector<float>& v) {
    if (v.empty()) return nullptr;
    auto& b = owned_.emplace_back(std::make_unique<DevBuf>());
    b->alloc(v.size() * 4);
    upload(b->p, v.data(), v.size() * 4);
    weight_bytes_ += int64_t(v.size() * 4);
    return b->as<float>();
  }

  DevMatrix upload_matrix(const HostMatrix& m) {
    VQ_CHECK_VALUE(m.data != nullptr && m.rows > 0 && m.cols > 0, "CUDA forward: empty weight matrix");
    (void)cuda_type(m.dtype);
    auto it = uploaded_.find(m.data);
    if (it != uploaded_.end()) return it->second;  // tied embeddings: one copy
    DevMatrix o;
    o.rows = m.rows;
    o.cols = m.cols;
    const int64_t n = m.rows * m.cols;
    auto& b = owned_.emplace_back(std::make_unique<DevBuf>());
    if (d_.weights_f32 && m.dtype != DType::F32) {
      std::vector<float> f(static_cast<size_t>(n));
      const uint16_t* s = static_cast<const uint16_t*>(m.data);
      for (int64_t i = 0; i < n; ++i) f[size_t(i)] = m.dtype == DType::F16 ? half_to_float(s[i]) : bf16_to_float(s[i]);
      b->alloc(size_t(n) * 4);
      upload(b->p, f.data(), size_t(n) * 4);
      o.dtype = DType::F32;
    } else {
      const size_t bytes = size_t(n) * dtype_size(m.dtype);
      b->alloc(bytes);
      upload(b->p, m.data, bytes);
      o.dtype = m.dtype;
    }
    o.data = b->p;
    weight_bytes_ += int64_t(b->bytes);
    uploaded_[m.data] = o;
    return o;
  }

  void ensure_buffers(int64_t T) {
    const int64_t H = d_.hidden, nh = d_.n_heads, nkv = d_.n_kv_heads, hd = d_.head_dim, I = d_.intermediate;
    if (T <= cap_) return;
    const int64_t c = std::max<int64_t>(T, 16);
    x_.alloc(size_t(c * H) * 4);
    h_.alloc(size_t(c * H) * 4);
    q_.alloc(size_t(c * nh * hd) * 4);
    att_.alloc(size_t(c * nh * hd) * 4);
    k_.alloc(size_t(c * nkv * hd) * 4);
    v_.alloc(size_t(c * nkv * hd) * 4);
    g_.alloc(size_t(c * I) * 4);
    u_.alloc(size_t(c * I) * 4);
    lowp_.alloc(size_t(c * std::max({H, I, nh * hd})) * 2);
    logits_.alloc(size_t(c * d_.vocab) * 4);
    tok_.alloc(size_t(c) * 4);
    cap_ = c;
    ++bufs_gen_;  // (a captured step reads the old buffers' addresses)
  }

  void rmsnorm(const float* x, int64_t rows, int64_t dim, const float* w, float* y) {
    const int threads = dim >= 256 ? 256 : (dim >= 128 ? 128 : (dim >= 64 ? 64 : 32));
    rmsnorm_kernel<<<unsigned(rows), threads, 0, s_>>>(x, w, y, int(dim), d_.rms_eps);
    check_launch("rmsnorm");
  }

  void rope(float* x, int64_t T, int heads, int64_t start, const int32_t* start_dev) {
    const int64_t n = T * heads * (d_.head_dim / 2);
    rope_kernel<<<blocks_for(n), kThreads, 0, s_>>>(x, T, heads, d_.head_dim, rope_cos_.as<float>(),
                                                    rope_sin_.as<float>(), start, start_dev);
    check_launch("rope");
  }

  void add(float* x, const float* y, int64_t n) {
    add_kernel<<<blocks_for(n), kThreads, 0, s_>>>(x, y, n);
    check_launch("add");
  }

  /// y [n, w.rows] = x [n, w.cols] · wᵀ (+ bias). Column-major view: y(w.rows × n) =
  /// W(cols × rows)ᵀ · x(cols × n), so both operands are read as stored.
  void gemm(const float* x, int64_t n, const DevMatrix& w, const float* bias, float* y) {
    const void* b = x;
    if (w.dtype != DType::F32) {
      round_kernel<<<blocks_for(n * w.cols), kThreads, 0, s_>>>(x, lowp_.p, w.dtype, n * w.cols);
      check_launch("round");
      b = lowp_.p;
    }
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = cuda_type(w.dtype);
    VQ_CUBLAS(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(w.rows), int(n), int(w.cols), &one, w.data, t,
                           int(w.cols), b, t, int(w.cols), &zero, y, CUDA_R_32F, int(w.rows), CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
    if (bias) {
      add_bias_kernel<<<blocks_for(n * w.rows), kThreads, 0, s_>>>(y, bias, n * w.rows, w.rows);
      check_launch("add_bias");
    }
  }

  CudaDecoderDesc d_;
  cudaStream_t s_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DevBuf blas_ws_;
  std::vector<std::unique_ptr<DevBuf>> owned_;
  std::map<const void*, DevMatrix> uploaded_;
  int64_t weight_bytes_ = 0;
  DevMatrix embed_, lm_head_;
  const float* final_norm_ = nullptr;
  std::vector<DevLayer> layers_;
  DevBuf rope_cos_, rope_sin_;
  int64_t rope_n_ = 0;
  DevBuf x_, h_, q_, k_, v_, att_, g_, u_, lowp_, logits_, tok_;
  int64_t cap_ = 0;
  std::vector<float> hq_, hk_, hv_, ho_;
  // decode steps through a graph: the instantiated step, what it was captured against (caches,
  // their capture keys, the attention parameters, the buffers' and RoPE table's generations),
  // the device words of the token and its position and their pinned host source, the pinned
  // logits the step copies out
  bool graphs_ = true;
  GraphStats stats_;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<KVCache*> g_caches_;
  std::vector<uint64_t> g_keys_;
  SdpaParams g_sp_;
  uint64_t bufs_gen_ = 0, rope_gen_ = 0, g_bufs_gen_ = 0, g_rope_gen_ = 0;
  DevBuf step_in_;
  int32_t* host_in_ = nullptr;
  float* host_logits_ = nullptr;
};

}  // namespace

std::unique_ptr<CudaDecoder> create_cuda_decoder(const CudaDecoderDesc& desc) {
  return std::make_unique<CudaDecoderImpl>(desc);
}

}  // namespace veloxquant::detail
