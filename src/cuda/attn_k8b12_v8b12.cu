// src/cuda/attn_k8b12_v8b12.cu — instantiations of the attention kernel for keys d8b12, values
// d8b12 (see attention_kernel.cuh). Compiled with VQ_CUDA_ALL_CONFIGS only; otherwise
// the registration adds nothing and the dispatcher reports the configuration as not built.
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
#if defined(VQ_CUDA_ALL_CONFIGS) && VQ_CUDA_ALL_CONFIGS
VQ_ATTN_REGISTER(k8b12_v8b12, 8, 12, 8, 12)
#else
void attn_register_k8b12_v8b12(std::vector<AttnEntry>&) {}
#endif
}  // namespace veloxquant::cuda
