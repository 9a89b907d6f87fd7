// src/cuda/attn_any_hd256.cu — the plain attention kernel (attention_any_dim_kernel.cuh) at head_dim
// 256 (Gemma's), for the configurations no tuned kernel serves there (every one in the default
// build; VQ_CUDA_ALL_CONFIGS builds tune five): its 16 instantiations (key and value sub_dim 4 or
// 8, 1 / 4 / 8 / 16 live rows), a file of their own so the head dims compile in parallel.
#include "cuda/attention_any_dim_kernel.cuh"

namespace veloxquant::cuda::any_dim {
template const void* kernel_for<256>(int, int, int);
}  // namespace veloxquant::cuda::any_dim
