// tests/cuda/cuda_test_util.h — helpers for the CUDA tests: skip without a device, random
// K/V, host<->device copies, NMSE, and the CPU twin of a CUDA cache config.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/encode_grid.h"
#include "cuda/kernels.h"
#include "veloxquant/cache.h"
#include "veloxquant/cuda_cache.h"
#include "veloxquant/tensor.h"

#define VQ_SKIP_WITHOUT_GPU()                                                                                \
  do {                                                                                                       \
    if (!veloxquant::cuda_is_available())                                                                    \
      GTEST_SKIP() << "no CUDA device present: the CUDA kernels are built but cannot run here (label cuda)"; \
  } while (0)

namespace vq_cuda_test {

using namespace veloxquant;

inline Tensor random_tensor(const Shape& shape, DType dt, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return Tensor::from_floats(x, shape, dt);
}

inline Tensor to_device(const Tensor& host, int dev = 0) { return Tensor::copy_to(host.view(), Device::cuda(dev)); }

inline Tensor to_host(const Tensor& dev) {
  if (dev.device().is_cpu()) return dev;
  return Tensor::copy_of(dev.view());
}

inline std::vector<float> floats(const Tensor& t) { return to_host(t).to_vector_f32(); }

/// ||a − b||² / ||b||² (NaN-safe: NaN anywhere gives +inf).
inline double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? num / den : num;
}

struct Spec {
  int ks, kb, vs, vb;
  std::string str() const {
    return "d" + std::to_string(ks) + "b" + std::to_string(kb) + "/d" + std::to_string(vs) + "b" + std::to_string(vb);
  }
};

/// Whether the kernels the tests of a path were written for serve (s, head_dim): a tuned kernel,
/// or the plain kernel at a head dim without tuned ones (kAnyHeadDims). The plain kernel also
/// serves what no tuned kernel does at 64, 128 and 256 (runs_on_cuda), which
/// CudaAttention.PlainKernelServesWhatNoTunedKernelDoes tests; the path tests (clusters, the
/// four-row and two-blocks kernels, ...) keep to the kernels they were written for.
inline bool compiled(const Spec& s, int head_dim) {
  const cuda::AttnConfigKey k{head_dim, s.ks, s.kb, s.vs, s.vb, 1};
  return cuda::attn_tuned_compiled(k) || (cuda::attn_any_head_dim(head_dim) && cuda::attn_config_compiled(k));
}
/// Whether any kernel (tuned or plain) serves (s, head_dim) in this build.
inline bool runs_on_cuda(const Spec& s, int head_dim) {
  return cuda::attn_config_compiled({head_dim, s.ks, s.kb, s.vs, s.vb, 1});
}

inline KVCacheConfig vq_config(const Spec& s, CacheMode mode, int head_dim, int residual, int n_kv_heads,
                               std::mt19937_64& rng, bool smooth = true) {
  KVCacheConfig c;
  c.kind = CacheKind::VecInfer;
  c.head_dim = head_dim;
  c.key_sub_dim = s.ks;
  c.key_codebook_bits = s.kb;
  c.value_sub_dim = s.vs;
  c.value_codebook_bits = s.vb;
  c.residual_length = residual;
  c.fused_sdpa = mode != CacheMode::Standard;
  c.fused_sdpa_memory_bound = mode == CacheMode::MemoryBound;
  c.step = 64;
  c.n_threads = 2;
  c.seed = rng() >> 1;  // meta_state stores the seed as a signed integer
  c.n_kv_heads = n_kv_heads;
  if (smooth) {
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    std::vector<float> lam(size_t(n_kv_heads) * head_dim);
    for (auto& x : lam) x = u(rng);
    c.smooth_factors = lam;
  }
  return c;
}

inline KVCacheConfig on_cuda(KVCacheConfig c) {
  c.device = Device::cuda(0);
  return c;
}

}  // namespace vq_cuda_test
