// src/cuda/attn_var_k4b8_v4b8.cu — tuning variants of the attention kernel for keys d4b8,
// values d4b8 at head_dim 128 (one row tile): warp tiles of 1, 2 or 4 k-tiles, 1 or 2
// blocks per multiprocessor, 8 or 16 warps per block, codes
// staged through per-warp cp.async rings of PIPE stages (0: register double buffering). Compiled with VQ_CUDA_VARIANTS (or VQ_CUDA_ALL_CONFIGS) only; bench_decode_cuda
// times them side by side (docs/cuda-notes.md records which one became the default).
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
#if defined(VQ_CUDA_VARIANTS) && VQ_CUDA_VARIANTS
void attn_register_variants_k4b8_v4b8(std::vector<AttnVariantEntry>& out) {
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 16, 3>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 2, 8, 2>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 2, 8, 0>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 2, 8, 3>());
  // spill-free candidates for the fp16 kernel (the 16-warp, 2-k-tile default needs ~165 registers
  // and is capped at 128: 28 / 108 bytes spilled, scripts/cuda_resource_usage.sh): one k-tile per
  // warp tile at 16 warps, or 8 warps with the registers to hold 2 or 4 k-tiles
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 1, 16, 3>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 1, 16, 4>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 8, 3>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 8, 4>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 3>());  // the fp16 default since run 45
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 2>());
  // E4M3 in the 8-warp, 4-k-tile shape (its default: 2 k-tiles, 16 warps, no spill)
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 3, 1>());
  // int8 keys (E4M3 variants: run 16, docs/cuda-notes.md)
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 2>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 3, 2>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 8, 4, 2>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 1, 16, 3, 2>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 2>());
  // int8 keys and values
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 3>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 3, 3>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 3>());
}
#else
void attn_register_variants_k4b8_v4b8(std::vector<AttnVariantEntry>&) {}
#endif
}  // namespace veloxquant::cuda
