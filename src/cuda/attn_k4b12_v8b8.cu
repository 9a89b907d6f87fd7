// src/cuda/attn_k4b12_v8b8.cu — instantiations of the attention kernel for keys d4b12, values
// d8b8 (see attention_kernel.cuh). Always compiled: the tests and benchmarks use it.
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
// 2 ring stages: the shared memory they free buys 4 copies of the 32 KB key codebook while
// the values keep 8 (conflict-free); run 14, same run: 58.9 / 101.7 / 387.0 us vs 68.4 /
// 121.0 / 465.5 with 4 stages (4 key copies, 2 value copies) at 1x131072 / 8x32768 / 64x16384.
VQ_ATTN_REGISTER_T(k4b12_v8b8, 4, 12, 8, 8, 1, 16, 2)
}  // namespace veloxquant::cuda
