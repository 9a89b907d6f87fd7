// Built only without CUDA: the runtime's CUDA forward pass is unavailable (cuda_decoder.h).
#include "core/cuda_decoder.h"

#include "veloxquant/error.h"

namespace veloxquant::detail {
std::unique_ptr<CudaDecoder> create_cuda_decoder(const CudaDecoderDesc&) {
  throw CudaError(
      "veloxquant was built without CUDA: the CUDA forward pass (--device cuda) needs a build with nvcc present "
      "(-DVQ_CUDA=ON)");
}
}  // namespace veloxquant::detail
