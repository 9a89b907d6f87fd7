// Built only without CUDA: the public CUDA queries answer "no" (veloxquant/cuda_cache.h).
#include "veloxquant/cuda_cache.h"

namespace veloxquant {

bool cuda_is_available() { return false; }

CudaSupport cuda_support(const KVCacheConfig&) {
  CudaSupport s;
  s.reason = "veloxquant was built without CUDA: rebuild with nvcc present (-DVQ_CUDA=ON)";
  return s;
}

std::vector<std::string> cuda_attention_configs() { return {}; }

}  // namespace veloxquant
