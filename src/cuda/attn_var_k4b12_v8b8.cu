// src/cuda/attn_var_k4b12_v8b8.cu — tuning variants of the attention kernel for keys d4b12,
// values d8b8 at head_dim 128 (one row tile): warp tiles of 1, 2 or 4 k-tiles, 1 or 2
// blocks per multiprocessor, 8, 12 or 16 warps per block, codes
// staged through per-warp cp.async rings of PIPE stages (0: register double buffering). Compiled with VQ_CUDA_VARIANTS (or VQ_CUDA_ALL_CONFIGS) only; bench_decode_cuda
// times them side by side (docs/cuda-notes.md records which one became the default).
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
#if defined(VQ_CUDA_VARIANTS) && VQ_CUDA_VARIANTS
void attn_register_variants_k4b12_v8b8(std::vector<AttnVariantEntry>& out) {
  // Earlier sweeps (runs 2-3, 14, 22, 47: docs/cuda-notes.md): one k-tile at 16 warps and 2 ring
  // stages for fp16 and int8 keys (the 4096-entry key codebook needs the shared memory; 8-warp
  // shapes lost in run 47). 12 warps (168-register cap, ptxas 147-160, no spill) try 1 or 2
  // k-tiles per warp tile with 3 warps per scheduler. Each list starts with its default.
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 16, 2>());  // fp16 default
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 12, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 2, 1, 12, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 12, 3>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 16, 2, 2>());  // int8 keys default
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 12, 2, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 2, 1, 12, 2, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 12, 3, 2>());
}
#else
void attn_register_variants_k4b12_v8b8(std::vector<AttnVariantEntry>&) {}
#endif
}  // namespace veloxquant::cuda
