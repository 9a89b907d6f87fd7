// src/cuda/cuda_hooks.cu — the core's CUDA hooks (allocation, copies, presence) for builds
// with CUDA. Every call selects the tensor's device first and throws CudaError on failure.
#include <memory>

#include "core/cuda_hooks.h"
#include "cuda/cuda_util.cuh"

namespace veloxquant::detail {

namespace {
/// Runs f with `device` current, restoring the previous device afterwards.
template <class F>
void on_device(Device device, F&& f) {
  VQ_CHECK_SHAPE(device.is_cuda(), "expected a CUDA device, got " << device_name(device));
  int prev = 0;
  VQ_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != device.index) VQ_CUDA_CHECK(cudaSetDevice(device.index));
  try {
    f();
  } catch (...) {
    if (prev != device.index) cudaSetDevice(prev);
    throw;
  }
  if (prev != device.index) VQ_CUDA_CHECK(cudaSetDevice(prev));
}
}  // namespace

std::shared_ptr<void> cuda_alloc_shared(size_t bytes, Device device) {
  void* p = nullptr;
  on_device(device, [&] {
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      VQ_THROW(CudaError, "cudaMalloc of " << bytes << " bytes on " << device_name(device)
                                           << " failed: " << cudaGetErrorString(e));
    }
  });
  const int idx = device.index;
  return std::shared_ptr<void>(p, [idx](void* q) {
    int prev = 0;
    cudaGetDevice(&prev);
    if (prev != idx) cudaSetDevice(idx);
    cudaFree(q);
    if (prev != idx) cudaSetDevice(prev);
  });
}

void cuda_memset(void* p, int value, size_t bytes, Device device) {
  on_device(device, [&] { VQ_CUDA_CHECK(cudaMemset(p, value, bytes)); });
}

void cuda_memcpy_d2h(void* dst, const void* src, size_t bytes, Device device) {
  on_device(device, [&] { VQ_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost)); });
}

void cuda_memcpy_h2d(void* dst, const void* src, size_t bytes, Device device) {
  on_device(device, [&] { VQ_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice)); });
}

bool cuda_available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

}  // namespace veloxquant::detail
