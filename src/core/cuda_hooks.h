// Internal: the few CUDA runtime calls the core needs (allocation, copies). Implemented in
// src/cuda/cuda_hooks.cu when built with CUDA, else in src/core/cuda_hooks_stub.cpp, which
// throws CudaError("veloxquant was built without CUDA").
#pragma once

#include <cstddef>
#include <memory>

#include "veloxquant/dtype.h"

namespace veloxquant {
class KVCache;
struct KVCacheConfig;
}  // namespace veloxquant

namespace veloxquant::detail {
std::shared_ptr<void> cuda_alloc_shared(size_t bytes, Device device);
void cuda_memset(void* p, int value, size_t bytes, Device device);
void cuda_memcpy_d2h(void* dst, const void* src, size_t bytes, Device device);
void cuda_memcpy_h2d(void* dst, const void* src, size_t bytes, Device device);
bool cuda_available();  ///< built with CUDA and a device is present

/// Builds a CUDA cache for config (config.device is CUDA). Implemented in src/cuda/ (helper D);
/// the stub throws CudaError. Called by KVCacheFactory::create.
std::unique_ptr<KVCache> create_cuda_cache(const KVCacheConfig& config);
}  // namespace veloxquant::detail
