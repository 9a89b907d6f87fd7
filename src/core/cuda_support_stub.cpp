// Built only without CUDA: the public CUDA queries answer "no" (veloxquant/cuda_cache.h).
#include "veloxquant/cuda_cache.h"
#include "veloxquant/error.h"

namespace veloxquant {

bool cuda_is_available() { return false; }

CudaSupport cuda_support(const KVCacheConfig&) {
  CudaSupport s;
  s.reason = "veloxquant was built without CUDA: rebuild with nvcc present (-DVQ_CUDA=ON)";
  return s;
}

std::vector<std::string> cuda_attention_configs() { return {}; }

int64_t set_cuda_prefill_workspace_limit(int64_t bytes) {
  VQ_CHECK_VALUE(bytes >= 0, "prefill workspace limit: " << bytes << " bytes (must be >= 0)");
  return 0;
}
int64_t cuda_prefill_workspace_limit() { return 0; }

}  // namespace veloxquant
