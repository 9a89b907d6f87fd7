// src/cuda/attn_var_k4b8_v4b8.cu — tuning variants of the attention kernel for keys d4b8,
// values d4b8 at head_dim 128 (one row tile): warp tiles of 1, 2 or 4 k-tiles, 1 or 2
// blocks per multiprocessor, 8, 12 or 16 warps per block, codes
// staged through per-warp cp.async rings of PIPE stages (0: register double buffering). Compiled with VQ_CUDA_VARIANTS (or VQ_CUDA_ALL_CONFIGS) only; bench_decode_cuda
// times them side by side (docs/cuda-notes.md records which one became the default).
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
#if defined(VQ_CUDA_VARIANTS) && VQ_CUDA_VARIANTS
void attn_register_variants_k4b8_v4b8(std::vector<AttnVariantEntry>& out) {
  // Earlier sweeps (runs 2, 3, 22, 45, 47: docs/cuda-notes.md) settled on 8 warps with 4-k-tile
  // warp tiles (fp16, int8 keys) and 16 warps with 2 (E4M3); the 16-warp fp16 and int8 kernels
  // are capped at 128 registers and spill or lose ILP. 12 warps (3 per scheduler, a 168-register
  // cap) hold a 2-k-tile warp tile without spilling (ptxas: 150-168): more warps to hide the
  // loop's latencies at one block per SM. Each list starts with its configuration's default.
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 3>());  // fp16 default
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 12, 3>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 12, 4>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 12, 2>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 3, 2>());  // int8 keys default
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 12, 3, 2>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 12, 4, 2>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 3, 3>());  // int8 keys and values default
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 12, 3, 3>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 1>());  // E4M3 default
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 12, 3, 1>());
  // four-row kernels (run 80): they hold half the accumulators, so 12 and 16 warps fit their caps
  // without spilling; 16 warps of 2-k-tile warp tiles became their default
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 0, 1>());  // fp16 four-row default
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 3, 0, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 12, 3, 0, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 12, 2, 0, 1>());
  // run 85: ring depth at 16 warps (2 k-tiles x 4 stages does not fit 227 KB): all slower than
  // the default 2 k-tiles x 3 stages (1 k-tile: +5-13%; 2 stages: +1-5%)
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 16, 2, 0, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 1, 16, 3, 0, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 1, 16, 4, 0, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 1, 16, 6, 0, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 2, 1>());  // int8 keys four-row default
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 8, 3, 2, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 12, 3, 2, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 4, 1, 12, 2, 2, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 1, 16, 2, 2, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 1, 16, 3, 2, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 1, 16, 4, 2, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 1, 16, 6, 2, 1>());
  // two blocks of 8 warps per multiprocessor for the four-row kernels, so one block's setup and
  // tail overlap the other's loop at large batch; their codebooks keep one-PRMT gathers
  // (AttnTraits::kPrmtRel). Run 144 (2 repetitions): int8 keys 2 k-tiles x 2 stages 189.7 / 190.2
  // us at 64 x 16384 against the one-block kernel's 196.2 / 196.1 (1 k-tile: 223.5-225.0), fp16
  // 221.6 / 222.6 against 228.2; at 1 x 131072 and 8 x 32768 (split grids) 5-9% slower. The
  // 2 x 2 shape became the four-row kernels' two-blocks form (attn_k4b8_v4b8.cu, run 145).
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 2, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 2, 8, 4, 2, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 1, 2, 8, 3, 2, 1>());
  out.push_back(attn_variant<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 0, 1>());
}
static_assert(AttnTraits<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 2, 1>::kPrmtRel &&
                  AttnTraits<128, 4, 8, 4, 8, 1, 1, 2, 8, 4, 2, 1>::kPrmtRel &&
                  AttnTraits<128, 4, 8, 4, 8, 1, 1, 2, 8, 3, 2, 1>::kPrmtRel &&
                  AttnTraits<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 0, 1>::kPrmtRel,
              "two-blocks four-row variants lost full codebook replication");
#else
void attn_register_variants_k4b8_v4b8(std::vector<AttnVariantEntry>&) {}
#endif
}  // namespace veloxquant::cuda
