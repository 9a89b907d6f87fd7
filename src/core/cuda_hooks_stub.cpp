// Built only without CUDA: every device request fails with a clear error.
#include "core/cuda_hooks.h"
#include "veloxquant/cache.h"
#include "veloxquant/error.h"

namespace veloxquant::detail {
[[noreturn]] static void no_cuda() {
  throw CudaError("veloxquant was built without CUDA: rebuild with nvcc present (-DVQ_CUDA=ON)");
}
std::shared_ptr<void> cuda_alloc_shared(size_t, Device) { no_cuda(); }
void cuda_memset(void*, int, size_t, Device) { no_cuda(); }
void cuda_memcpy_d2h(void*, const void*, size_t, Device) { no_cuda(); }
void cuda_memcpy_h2d(void*, const void*, size_t, Device) { no_cuda(); }
bool cuda_available() { return false; }
std::unique_ptr<KVCache> create_cuda_cache(const KVCacheConfig&) { no_cuda(); }
}  // namespace veloxquant::detail
