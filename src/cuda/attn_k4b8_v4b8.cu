// src/cuda/attn_k4b8_v4b8.cu — instantiations of the attention kernel for keys d4b8, values
// d4b8 (see attention_kernel.cuh). Always compiled: the tests and benchmarks use it.
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
VQ_ATTN_REGISTER_T(k4b8_v4b8, 4, 8, 4, 8, 2, 16, 3)
}  // namespace veloxquant::cuda
