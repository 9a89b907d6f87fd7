// src/cuda/attn_k4b12_v8b8.cu — instantiations of the attention kernel for keys d4b12, values
// d8b8 (see attention_kernel.cuh). Always compiled: the tests and benchmarks use it.
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
VQ_ATTN_REGISTER(k4b12_v8b8, 4, 12, 8, 8)
}  // namespace veloxquant::cuda
