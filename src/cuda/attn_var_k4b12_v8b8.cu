// src/cuda/attn_var_k4b12_v8b8.cu — tuning variants of the attention kernel for keys d4b12,
// values d8b8 at head_dim 128 (one row tile): warp tiles of 1, 2 or 4 k-tiles, 1 or 2
// blocks per multiprocessor, 8 or 16 warps per block, codes
// staged through per-warp cp.async rings of PIPE stages (0: register double buffering). Compiled with VQ_CUDA_VARIANTS (or VQ_CUDA_ALL_CONFIGS) only; bench_decode_cuda
// times them side by side (docs/cuda-notes.md records which one became the default).
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
#if defined(VQ_CUDA_VARIANTS) && VQ_CUDA_VARIANTS
void attn_register_variants_k4b12_v8b8(std::vector<AttnVariantEntry>& out) {
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 16, 4>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 16, 3>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 16, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 16, 0>());
  // 8 warps with 2 or 4 k-tiles per warp tile (the d4b8 kernels' shape since run 45)
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 2, 1, 8, 3>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 4, 1, 8, 3>());
  // int8 keys (E4M3 variants: run 16, docs/cuda-notes.md): a 16 KB key codebook, so 8 key
  // copies fit beside 2 or 3 ring stages; or two k-tiles per warp tile
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 16, 2, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 16, 3, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 2, 1, 16, 2, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 1, 1, 8, 4, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 2, 1, 8, 3, 2>());
  out.push_back(attn_variant<128, 4, 12, 8, 8, 1, 4, 1, 8, 3, 2>());
}
#else
void attn_register_variants_k4b12_v8b8(std::vector<AttnVariantEntry>&) {}
#endif
}  // namespace veloxquant::cuda
