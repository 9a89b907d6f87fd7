// src/cuda/runtime_decoder.cu — the runtime's forward pass of a Llama-family decoder on one GPU
// (core/cuda_decoder.h): the CPU forward of src/runtime/model.cpp, op for op, on the device.
//
// Activations (row-major, device):
//   x         [n_tokens, hidden] f32               residual stream
//   in        [n_tokens, max(hidden, inter, n_heads·hd)]  the next product's input: f32, or
//             rounded to that product's f16/bf16 weights (weights_f32 off) by the kernel that
//             wrote it (the norms, SwiGLU, the attention output's rounding)
//   h         [n_tokens, hidden] f32               the output and down products' rows
//   qkv       [n_tokens, (n_heads + 2·n_kv)·hd]    the stacked q/k/v product's rows
//   q, att    [n_tokens, n_heads, head_dim] f32    seen by the caches as [1, n_heads, n_tokens, head_dim]
//   k, v      [n_tokens, n_kv_heads, head_dim] f32 seen as [1, n_kv_heads, n_tokens, head_dim]
//   gu        [n_tokens, 2·intermediate] f32       the stacked gate/up product's rows
//   rope_cos, rope_sin [n_positions, head_dim/2]   the runtime's table (attention factor folded in)
// Weights: [out, in] row-major as the checkpoint stores nn.Linear, in f32 or their own dtype; the
// products that read the same input are stacked (q/k/v, gate/up: one matrix each).
//
// Matrix products are cublasGemmEx with CUBLAS_COMPUTE_32F (fp32 accumulation, never TF32: the
// tests compare against the CPU forward at ~1e-4). The small ops are fused around them, so a
// layer is: [residual add + RMSNorm + rounding] → q/k/v product → [biases + q/k norms + RoPE] →
// attention → [rounding] → output product → [residual add + bias + RMSNorm + rounding] →
// gate/up product → [biases + SwiGLU + rounding] → down product, whose residual the next layer's
// first kernel adds (the final norm's, after the last layer). Attention goes through the caches'
// own device path (update, then fused_sdpa on device tensors); CPU caches are also accepted
// (q/k/v copied over and back), so head sizes the device caches do not compile still run.
// Everything is queued on the runtime's stream of the device (runtime_stream: blocking, so caches
// on the legacy default stream stay ordered with it), which the caches created by the runtime use
// too.
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

// One block per row r: where `add` is given, the residual x[r, :] += add[r, :] (+ bias) first
// (the output or down product's rows, the bias added to them before the sum, as the unfused
// pass did); then out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) ⊙ w, stored as out_dt: the
// next product's input, already rounded to that product's weight dtype. Every element of x is
// read and written by the same thread.
__global__ void add_rmsnorm_kernel(float* x, const float* add, const float* bias, const float* w, void* out,
                                   DType out_dt, int dim, float eps) {
  const int64_t r = blockIdx.x;
  float* xr = x + r * dim;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) {
    float v = xr[c];
    if (add) {
      float a = add[r * dim + c];
      if (bias) a += bias[c];
      v += a;
      xr[c] = v;
    }
    ss += v * v;
  }
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
  for (int c = threadIdx.x; c < dim; c += blockDim.x) cuda::store_f(out, out_dt, r * dim + c, xr[c] * inv * w[c]);
}

// The fused q/k/v product's rows y [T, (nh + 2·nkv)·hd] (heads q0..q(nh−1), k0.., v0..) into
// q [T, nh, hd], k and v [T, nkv, hd]: each head's bias added, Qwen3's per-head RMSNorm on q and
// k (q_norm, k_norm: null where the model has none), then RoPE ("rotate half") on q and k at
// position start + t (start_dev: a captured decode step reads the position the host wrote).
// One warp per (token, head); lane l holds the rotation pairs (i, i + hd/2), i = l + 32·j.
template <int P>
__global__ void qkv_post_kernel(const float* __restrict__ y, const float* __restrict__ bias,
                                const float* __restrict__ q_norm, const float* __restrict__ k_norm, float* q, float* k,
                                float* v, int64_t T, int nh, int nkv, int hd, float eps, const float* cos_t,
                                const float* sin_t, int64_t start, const int32_t* start_dev) {
  if (start_dev) start = *start_dev;
  const int heads = nh + 2 * nkv, half = hd / 2, lane = threadIdx.x & 31;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= T * heads) return;
  const int64_t t = w / heads;
  const int hh = int(w % heads);
  const float* src = y + w * hd;
  const float* b = bias ? bias + int64_t(hh) * hd : nullptr;
  float a[P], c[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int i = lane + 32 * j;
    a[j] = c[j] = 0.0f;
    if (i < half) {
      a[j] = src[i];
      c[j] = src[i + half];
      if (b) a[j] += b[i], c[j] += b[i + half];
    }
  }
  float* dst;
  const float* norm;
  if (hh < nh) dst = q + (t * nh + hh) * hd, norm = q_norm;
  else if (hh < nh + nkv) dst = k + (t * nkv + hh - nh) * hd, norm = k_norm;
  else dst = v + (t * nkv + hh - nh - nkv) * hd, norm = nullptr;
  if (norm) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < P; ++j) ss += a[j] * a[j] + c[j] * c[j];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / float(hd) + eps);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int i = lane + 32 * j;
      if (i < half) a[j] = a[j] * inv * norm[i], c[j] = c[j] * inv * norm[i + half];
    }
  }
  const bool rotate = hh < nh + nkv;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int i = lane + 32 * j;
    if (i >= half) continue;
    if (rotate) {
      const float cs = cos_t[(start + t) * half + i], sn = sin_t[(start + t) * half + i];
      dst[i] = __fsub_rn(__fmul_rn(a[j], cs), __fmul_rn(c[j], sn));
      dst[i + half] = __fadd_rn(__fmul_rn(c[j], cs), __fmul_rn(a[j], sn));
    } else {
      dst[i] = a[j];
      dst[i + half] = c[j];
    }
  }
}

// out[t, i] = silu(gu[t, i] + b_gate[i]) · (gu[t, I + i] + b_up[i]), stored as out_dt (the down
// product's input): gu holds the fused gate/up product's rows [T, 2·I], gate first.
__global__ void silu_mul_kernel(const float* gu, const float* b_gate, const float* b_up, void* out, DType out_dt,
                                int64_t T, int64_t I) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * I) return;
  const int64_t t = idx / I, i = idx % I;
  float a = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
  if (b_gate) a += b_gate[i];
  if (b_up) u += b_up[i];
  cuda::store_f(out, out_dt, idx, (a / (1.0f + expf(-a))) * u);
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

// One layer's device weights. The products that read the same input are stacked into one
// matrix (rows concatenated): q/k/v as wqkv [(nh + 2·nkv)·hd, hidden], gate/up as w_gate_up
// [2·inter, hidden]; bqkv holds the three biases in that order (zeros for a projection without
// one; null where none has one).
struct DevLayer {
  const float *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  const float *bqkv = nullptr, *bo = nullptr;
  const float *b_gate = nullptr, *b_up = nullptr, *b_down = nullptr;
  DevMatrix wqkv, wo, w_gate_up, w_down;
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
    VQ_CHECK_VALUE(d.head_dim > 0 && d.head_dim % 2 == 0 && d.head_dim <= 512,
                   "CUDA forward: head_dim must be even and at most 512 (RoPE pairs, one warp a head), got "
                       << d.head_dim);
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
      o.bqkv = upload_stacked_bias({{&L.bq, L.wq.rows}, {&L.bk, L.wk.rows}, {&L.bv, L.wv.rows}});
      o.bo = upload_vec(L.bo);
      o.b_gate = upload_vec(L.b_gate);
      o.b_up = upload_vec(L.b_up);
      o.b_down = upload_vec(L.b_down);
      o.wqkv = upload_stacked({&L.wq, &L.wk, &L.wv});
      o.wo = upload_matrix(L.wo);
      o.w_gate_up = upload_stacked({&L.w_gate, &L.w_up});
      o.w_down = upload_matrix(L.w_down);
      const int64_t l = int64_t(layers_.size());
      VQ_CHECK_SHAPE(o.wqkv.rows == int64_t(d.n_heads + 2 * d.n_kv_heads) * d.head_dim && o.wqkv.cols == d.hidden,
                     "CUDA forward: layer " << l << "'s q/k/v products stack to [" << o.wqkv.rows << ", " << o.wqkv.cols
                                            << "], expected [" << (d.n_heads + 2 * d.n_kv_heads) * d.head_dim << ", "
                                            << d.hidden << "]");
      VQ_CHECK_SHAPE(o.w_gate_up.rows == 2 * int64_t(d.intermediate) && o.w_gate_up.cols == d.hidden,
                     "CUDA forward: layer " << l << "'s gate/up products stack to [" << o.w_gate_up.rows << ", "
                                            << o.w_gate_up.cols << "], expected [" << 2 * int64_t(d.intermediate)
                                            << ", " << d.hidden << "]");
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
    float *q = q_.as<float>(), *k = k_.as<float>(), *v = v_.as<float>(), *att = att_.as<float>();
    upload(tok_.p, tokens, size_t(T) * 4);
    embed_and_norm(T, tok_.as<int32_t>());

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
    // (the last layer's after_attention left the final norm's rows in in_)
    const int64_t rows = all_logits ? T : 1;
    gemm_in(static_cast<const char*>(in_.p) + size_t((T - rows) * H) * dtype_size(lm_head_.dtype), rows, lm_head_,
            logits_.as<float>());
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
    const int nh = d_.n_heads;
    if (!host_logits_) VQ_CUDA_CHECK(cudaMallocHost(&host_logits_, size_t(d_.vocab) * sizeof(float)));
    step_in_.alloc(2 * sizeof(int32_t));
    const int32_t* in = step_in_.as<int32_t>();
    cudaGraph_t graph = nullptr;
    VQ_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
    try {
      embed_and_norm(1, in);
      for (int l = 0; l < int(layers_.size()); ++l) {
        before_attention(l, 1, 0, in + 1);
        cc[size_t(l)]->decode_step_raw(q_.p, k_.p, v_.p, att_.p, DType::F32, nh, 1, sp);
        after_attention(l, 1);
      }
      gemm_in(in_.p, 1, lm_head_, logits_.as<float>());
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
    stats_.kernel_nodes = count_kernel_nodes(graph);
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

  static int64_t count_kernel_nodes(cudaGraph_t graph) {
    size_t n = 0;
    if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) return cudaGetLastError(), 0;
    std::vector<cudaGraphNode_t> nodes(n);
    if (n == 0 || cudaGraphGetNodes(graph, nodes.data(), &n) != cudaSuccess) return cudaGetLastError(), 0;
    int64_t k = 0;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType t{};
      if (cudaGraphNodeGetType(node, &t) == cudaSuccess && t == cudaGraphNodeTypeKernel) ++k;
    }
    return k;
  }

  // ---- one layer's ops around attention (eager calls and captured steps) -----------------------

  /// The embedding of tokens [T] (device) into x_, then the first layer's input norm into in_.
  void embed_and_norm(int64_t T, const int32_t* tokens) {
    embed_kernel<<<unsigned(T), kThreads, 0, s_>>>(embed_.data, embed_.dtype, tokens, d_.hidden, x_.as<float>());
    check_launch("embed");
    norm_for(0, T, nullptr, nullptr);
  }

  /// From in_ (layer l's normed input, rounded for its products): the stacked q/k/v product,
  /// then biases, Qwen3's q/k norms and RoPE at positions start .. (start_dev: read from the
  /// device instead) into q_, k_, v_.
  void before_attention(int l, int64_t T, int64_t start, const int32_t* start_dev) {
    const DevLayer& L = layers_[size_t(l)];
    const int nh = d_.n_heads, nkv = d_.n_kv_heads, hd = d_.head_dim;
    gemm_in(in_.p, T, L.wqkv, qkv_.as<float>());
    const unsigned blocks = unsigned((T * (nh + 2 * nkv) * 32 + kThreads - 1) / kThreads);
    auto launch = [&](auto kernel) {
      kernel<<<blocks, kThreads, 0, s_>>>(qkv_.as<float>(), L.bqkv, d_.qk_norm ? L.q_norm : nullptr,
                                          d_.qk_norm ? L.k_norm : nullptr, q_.as<float>(), k_.as<float>(),
                                          v_.as<float>(), T, nh, nkv, hd, d_.rms_eps, rope_cos_.as<float>(),
                                          rope_sin_.as<float>(), start, start_dev);
    };
    if (hd <= 64) launch(qkv_post_kernel<1>);
    else if (hd <= 128) launch(qkv_post_kernel<2>);
    else if (hd <= 256) launch(qkv_post_kernel<4>);
    else launch(qkv_post_kernel<8>);
    check_launch("qkv_post");
  }

  /// The output product from att_, the residual, the post-attention norm, the stacked gate/up
  /// product, SwiGLU and the down product; its residual is added by the next norm (the next
  /// layer's input norm, or the final norm after the last layer), which leaves in_ ready for
  /// the next product.
  void after_attention(int l, int64_t T) {
    const DevLayer& L = layers_[size_t(l)];
    const int64_t I = d_.intermediate;
    float *h = h_.as<float>(), *att = att_.as<float>();
    const void* a = att;
    if (L.wo.dtype != DType::F32) {
      round_kernel<<<blocks_for(T * L.wo.cols), kThreads, 0, s_>>>(att, in_.p, L.wo.dtype, T * L.wo.cols);
      check_launch("round");
      a = in_.p;
    }
    gemm_in(a, T, L.wo, h);
    add_norm(T, h, L.bo, L.post_norm, L.w_gate_up.dtype);
    gemm_in(in_.p, T, L.w_gate_up, gu_.as<float>());
    silu_mul_kernel<<<blocks_for(T * I), kThreads, 0, s_>>>(gu_.as<float>(), L.b_gate, L.b_up, in_.p,
                                                            L.w_down.dtype, T, I);
    check_launch("silu_mul");
    gemm_in(in_.p, T, L.w_down, h);
    norm_for(l + 1, T, h, L.b_down);
  }

  /// The norm before layer l's products (l == n_layers: the final norm before lm_head), adding
  /// the residual `add` (+ bias) to x_ first where given; into in_, rounded for those products.
  void norm_for(int l, int64_t T, const float* add, const float* bias) {
    if (l < int(layers_.size())) add_norm(T, add, bias, layers_[size_t(l)].input_norm, layers_[size_t(l)].wqkv.dtype);
    else add_norm(T, add, bias, final_norm_, lm_head_.dtype);
  }

  void add_norm(int64_t T, const float* add, const float* bias, const float* w, DType out_dt) {
    const int64_t dim = d_.hidden;
    const int threads = dim >= 256 ? 256 : (dim >= 128 ? 128 : (dim >= 64 ? 64 : 32));
    add_rmsnorm_kernel<<<unsigned(T), threads, 0, s_>>>(x_.as<float>(), add, bias, w, in_.p, out_dt, int(dim),
                                                         d_.rms_eps);
    check_launch("add_rmsnorm");
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
    auto it = uploaded_.find(m.data);
    if (it != uploaded_.end()) return it->second;  // tied embeddings: one copy
    return uploaded_[m.data] = upload_stacked({&m});
  }

  /// The matrices' rows stacked into one device matrix [Σ rows, cols], in their dtype where they
  /// share one (and weights_f32 is off), else in f32.
  DevMatrix upload_stacked(std::initializer_list<const HostMatrix*> parts) {
    DevMatrix o;
    const HostMatrix& first = **parts.begin();
    o.cols = first.cols;
    o.dtype = d_.weights_f32 ? DType::F32 : first.dtype;
    for (const HostMatrix* m : parts) {
      VQ_CHECK_VALUE(m->data != nullptr && m->rows > 0 && m->cols > 0, "CUDA forward: empty weight matrix");
      (void)cuda_type(m->dtype);
      VQ_CHECK_SHAPE(m->cols == o.cols, "CUDA forward: matrices that read the same input must have as many columns: "
                                            << m->cols << " against " << o.cols);
      if (m->dtype != o.dtype) o.dtype = DType::F32;
      o.rows += m->rows;
    }
    auto& b = owned_.emplace_back(std::make_unique<DevBuf>());
    b->alloc(size_t(o.rows * o.cols) * dtype_size(o.dtype));
    char* dst = static_cast<char*>(b->p);
    for (const HostMatrix* m : parts) {
      const int64_t n = m->rows * m->cols;
      if (m->dtype == o.dtype) {
        upload(dst, m->data, size_t(n) * dtype_size(m->dtype));
      } else {  // f16/bf16 into an f32 matrix
        std::vector<float> f(static_cast<size_t>(n));
        const uint16_t* h = static_cast<const uint16_t*>(m->data);
        for (int64_t i = 0; i < n; ++i) f[size_t(i)] = m->dtype == DType::F16 ? half_to_float(h[i]) : bf16_to_float(h[i]);
        upload(dst, f.data(), size_t(n) * 4);
      }
      dst += size_t(n) * dtype_size(o.dtype);
    }
    o.data = b->p;
    weight_bytes_ += int64_t(b->bytes);
    return o;
  }

  /// Biases of stacked products (vector, that product's rows; an empty vector: no bias) as one
  /// vector with zeros for the missing ones; null where none has a bias.
  const float* upload_stacked_bias(std::initializer_list<std::pair<const std::vector<float>*, int64_t>> parts) {
    bool any = false;
    for (const auto& [v, rows] : parts) any = any || !v->empty();
    if (!any) return nullptr;
    std::vector<float> all;
    for (const auto& [v, rows] : parts) {
      VQ_CHECK_SHAPE(v->empty() || int64_t(v->size()) == rows,
                     "CUDA forward: a bias of " << v->size() << " values for a product of " << rows << " rows");
      if (v->empty()) all.insert(all.end(), size_t(rows), 0.0f);
      else all.insert(all.end(), v->begin(), v->end());
    }
    return upload_vec(all);
  }

  void ensure_buffers(int64_t T) {
    const int64_t H = d_.hidden, nh = d_.n_heads, nkv = d_.n_kv_heads, hd = d_.head_dim, I = d_.intermediate;
    if (T <= cap_) return;
    const int64_t c = std::max<int64_t>(T, 16);
    x_.alloc(size_t(c * H) * 4);
    in_.alloc(size_t(c * std::max({H, I, nh * hd})) * 4);
    h_.alloc(size_t(c * H) * 4);
    qkv_.alloc(size_t(c * (nh + 2 * nkv) * hd) * 4);
    q_.alloc(size_t(c * nh * hd) * 4);
    att_.alloc(size_t(c * nh * hd) * 4);
    k_.alloc(size_t(c * nkv * hd) * 4);
    v_.alloc(size_t(c * nkv * hd) * 4);
    gu_.alloc(size_t(c * 2 * I) * 4);
    logits_.alloc(size_t(c * d_.vocab) * 4);
    tok_.alloc(size_t(c) * 4);
    cap_ = c;
    ++bufs_gen_;  // (a captured step reads the old buffers' addresses)
  }

  /// y [n, w.rows] = in [n, w.cols] · wᵀ, `in` already in w's dtype (f32, or the activations
  /// rounded to the weights' half type by the kernel that wrote them). Column-major view:
  /// y(w.rows × n) = W(cols × rows)ᵀ · in(cols × n), so both operands are read as stored.
  void gemm_in(const void* in, int64_t n, const DevMatrix& w, float* y) {
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = cuda_type(w.dtype);
    VQ_CUBLAS(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(w.rows), int(n), int(w.cols), &one, w.data, t,
                           int(w.cols), in, t, int(w.cols), &zero, y, CUDA_R_32F, int(w.rows), CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
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
  // activations: x_ the residual stream, in_ the next product's input (f32 or rounded to that
  // product's weight dtype), h_ a product's f32 rows, qkv_ / gu_ the stacked products' rows
  DevBuf x_, in_, h_, qkv_, q_, k_, v_, att_, gu_, logits_, tok_;
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
