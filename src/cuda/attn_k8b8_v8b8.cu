// src/cuda/attn_k8b8_v8b8.cu — instantiations of the attention kernel for keys d8b8, values
// d8b8 (see attention_kernel.cuh). Compiled with VQ_CUDA_ALL_CONFIGS only; otherwise
// the registration adds nothing and the dispatcher reports the configuration as not built.
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
#if defined(VQ_CUDA_ALL_CONFIGS) && VQ_CUDA_ALL_CONFIGS
VQ_ATTN_REGISTER(k8b8_v8b8, 8, 8, 8, 8)
#else
void attn_register_k8b8_v8b8(std::vector<AttnEntry>&) {}
#endif
}  // namespace veloxquant::cuda
