// src/cuda/attn_any_hd128.cu — the plain attention kernel (attention_any_dim_kernel.cuh) at head_dim
// 128, for the configurations no tuned kernel serves there (in the default build every one but
// d4b8/d4b8 and d4b12/d8b8: the paper's d8b12/d8b12, d4b10/d8b12, d8b8/d8b8, ...): its 16
// instantiations (key and value sub_dim 4 or 8, 1 / 4 / 8 / 16 live rows), a file of their own so
// the head dims compile in parallel.
#include "cuda/attention_any_dim_kernel.cuh"

namespace veloxquant::cuda::any_dim {
template const void* kernel_for<128>(int, int, int);
}  // namespace veloxquant::cuda::any_dim
