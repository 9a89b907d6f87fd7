// src/cuda/support.cpp — which cache configurations this build runs on a CUDA device: the rule
// the caches' constructors raise (support.h) and the public query built on it (cuda_support,
// cuda_attention_configs in veloxquant/cuda_cache.h). No device is needed to answer.
#include "cuda/support.h"

#include "cuda/kernels.h"

#include <cuda_runtime.h>

#include <sstream>

#include "veloxquant/cuda_cache.h"
#include "veloxquant/error.h"

namespace veloxquant {
namespace cuda {
namespace {

const char* who(CacheKind kind) { return kind == CacheKind::FP16 ? "CUDA FP16 cache" : "CUDA VecInfer cache"; }

bool attends_over_fp16_rows(CacheKind kind, CacheMode mode) {
  return kind == CacheKind::FP16 || mode == CacheMode::Standard;
}

}  // namespace

AttnConfigKey cache_attention_key(CacheKind kind, CacheMode mode, int head_dim, PQSpec keys, PQSpec values,
                                  CodebookFormat fmt, int nt) {
  if (attends_over_fp16_rows(kind, mode)) return {head_dim, 4, 8, 4, 8, nt, 0};
  return {head_dim, keys.sub_dim, keys.codebook_bits, values.sub_dim, values.codebook_bits, nt, static_cast<int>(fmt)};
}

std::string cache_attention_missing(CacheKind kind, CacheMode mode, int head_dim, PQSpec keys, PQSpec values,
                                    CodebookFormat fmt) {
  // the planner takes two row tiles for chunks of more than 8 rows at head_dim <= 128, else one
  bool ok = true;
  for (int nt : {1, 2}) {
    if (nt == 2 && head_dim > 128) break;
    ok = ok && attn_config_compiled(cache_attention_key(kind, mode, head_dim, keys, values, fmt, nt));
  }
  if (ok) return {};
  // every supported head dim has the plain kernel (kAnyHeadDims, kTunedHeadDims), which serves
  // every d4/d8 configuration of 4 to 12 bits: what is missing is beyond it in every build
  std::ostringstream os;
  os << who(kind);
  if (attends_over_fp16_rows(kind, mode))
    os << (kind == CacheKind::FP16 ? "" : " (standard mode)") << ": fused_sdpa at head_dim " << head_dim
       << " has no exact-row attention kernel " << attn_config_name(cache_attention_key(kind, mode, head_dim, keys, values, fmt, 1))
       << " (update_and_fetch works)";
  else
    os << ": attention for keys " << keys.str() << ", values " << values.str() << " at head_dim " << head_dim
       << " with " << codebook_format_name(fmt) << " codebooks has no kernel";
  os << " (built: " << attn_compiled_list() << ")";
  return os.str();
}

std::string cache_unsupported(CacheKind kind, CacheMode mode, int head_dim, PQSpec keys, PQSpec values,
                              CodebookFormat fmt) {
  std::ostringstream os;
  if (!attn_plain_head_dim(head_dim)) {
    os << who(kind) << ": head_dim " << head_dim << " is not supported (" << attn_head_dims_list() << ")";
    return os.str();
  }
  if (kind == CacheKind::FP16) return {};
  if ((keys.sub_dim != 4 && keys.sub_dim != 8) || (values.sub_dim != 4 && values.sub_dim != 8)) {
    os << who(kind) << ": sub_dim must be 4 or 8 (keys d" << keys.sub_dim << ", values d" << values.sub_dim << ")";
    return os.str();
  }
  if (keys.codebook_bits < 4 || values.codebook_bits < 4) {
    os << who(kind) << ": codebooks of fewer than 16 centroids are not supported (keys b" << keys.codebook_bits
       << ", values b" << values.codebook_bits << ")";
    return os.str();
  }
  // the fused modes hold only what their kernel reads: no kernel, no cache
  if (mode != CacheMode::Standard) return cache_attention_missing(kind, mode, head_dim, keys, values, fmt);
  return {};
}

}  // namespace cuda

CudaSupport cuda_support(const KVCacheConfig& config) {
  CudaSupport s;
  s.built = true;
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess) s.devices = n;
  else cudaGetLastError();  // no driver or no GPU: clear the error, report 0
  try {
    config.validate();
  } catch (const Error& e) {
    s.reason = std::string("invalid configuration: ") + e.what();
    return s;
  }
  const CacheMode mode = config.mode();
  const PQSpec ks = config.key_spec(), vs = config.value_spec();
  s.reason = cuda::cache_unsupported(config.kind, mode, config.head_dim, ks, vs, config.attention_codebooks);
  if (!s.reason.empty()) return s;
  s.cache = true;
  const cuda::AttnConfigKey k1 =
      cuda::cache_attention_key(config.kind, mode, config.head_dim, ks, vs, config.attention_codebooks, 1);
  s.kernel = cuda::attn_config_name(k1);
  s.reason = cuda::cache_attention_missing(config.kind, mode, config.head_dim, ks, vs, config.attention_codebooks);
  if (!s.reason.empty()) return s;
  s.attention = true;
  s.tuned_kernel = cuda::attn_tuned_compiled(k1);
  // (the fp16 cache and the standard mode attend over exact rows: the exact-rows kernel, which
  // also serves head_dim 80 and 96)
  const bool rows_only = config.kind == CacheKind::FP16 || mode == CacheMode::Standard;
  s.prefill_kernel = rows_only ? cuda::prefill_rows_compiled(config.head_dim) : cuda::prefill_compiled(k1);
  s.prefill_over_rows = config.kind == CacheKind::VecInfer && mode == CacheMode::MemoryBound &&
                        cuda::prefill_rows_compiled(config.head_dim) && cuda::rows_workspace_limit() > 0;
  return s;
}

std::vector<std::string> cuda_attention_configs() { return cuda::attn_compiled_names(); }

int64_t set_cuda_prefill_workspace_limit(int64_t bytes) { return cuda::set_rows_workspace_limit(bytes); }
int64_t cuda_prefill_workspace_limit() { return cuda::rows_workspace_limit(); }

}  // namespace veloxquant
