// src/cuda/attn_k4b8_v4b8.cu — instantiations of the attention kernel for keys d4b8, values
// d4b8 (see attention_kernel.cuh). Always compiled: the tests and benchmarks use it.
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
// fp16 and E4M3 codebooks: warp tiles of 2 k-tiles, 16 warps, 3 ring stages; int8 keys: 4
// k-tiles, 8 warps, 3 stages (run 22, same run: 39.6 / 66.6 / 237.1 us against 40.9 / 66.6 /
// 240.5 us with the fp16 shape at 1x131072 / 8x32768 / 64x16384), without the two-blocks kernel
// below (248.9 us at 64 x 16384 for int8 keys)
void attn_register_k4b8_v4b8(std::vector<AttnEntry>& out) {
  VQ_ATTN_ENTRIES_F(4, 8, 4, 8, 2, 16, 3, 0)
  VQ_ATTN_ENTRIES_F(4, 8, 4, 8, 2, 16, 3, 1)
  VQ_ATTN_ENTRIES_F(4, 8, 4, 8, 4, 8, 3, 2)
  VQ_ATTN_ENTRIES_F(4, 8, 4, 8, 4, 8, 3, 3)  // int8 keys and values: the int8-key shape
}
// Large batches (every (batch, kv head) its own block, two waves of blocks or more): 8 warps
// and two blocks per multiprocessor, so one block's setup and tail overlap the other's
// streaming (docs/cuda-notes.md, run 12: 268.7 vs 291.0 us at 64 x 16384, same run).
// Its shared-memory budget must still buy every lane its own codebook copy (16 of each): one
// more KB of query buffers once cost it half the value copies and 23% at 64 x 16384 (run 20).
static_assert(AttnTraits<128, 4, 8, 4, 8, 1, 2, 2, 8, 2>::kRK == 16 && AttnTraits<128, 4, 8, 4, 8, 1, 2, 2, 8, 2>::kRV == 16,
              "the two-blocks-per-SM d4b8 kernel lost conflict-free codebook replication");
void attn_register_wide_k4b8_v4b8(std::vector<AttnEntry>& out) {
  AttnEntry e = attn_entry<128, 4, 8, 4, 8, 1, 2, 2, 8, 2>();
  e.wide = 1;
  out.push_back(e);
  AttnEntry f = attn_entry<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 1>();  // E4M3 codebooks
  f.wide = 1;
  out.push_back(f);
}
}  // namespace veloxquant::cuda
