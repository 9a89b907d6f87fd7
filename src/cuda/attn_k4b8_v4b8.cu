// src/cuda/attn_k4b8_v4b8.cu — instantiations of the attention kernel for keys d4b8, values
// d4b8 (see attention_kernel.cuh). Always compiled: the tests and benchmarks use it.
#include "cuda/attn_configs.h"

namespace veloxquant::cuda {
// fp16 codebooks and int8 keys (and values): warp tiles of 4 k-tiles, 8 warps, 3 ring stages.
// fp16 moved to this shape in run 45 (same run, variants table: 42.2 / 68.7 / 258.0 us against
// 43.9 / 72.4 / 270.2 us for 2 k-tiles at 16 warps and 271.7 us for the two-blocks kernel at
// 64 x 16384): the 16-warp kernel needs ~165 registers, is capped at 128 and spilled; at 8 warps
// the 4-k-tile kernel holds 218 without spilling. E4M3 keeps 2 k-tiles at 16 warps (128
// registers, no spill). Int8 keys: run 22 (39.6 / 66.6 / 237.1 us against 40.9 / 66.6 / 240.5
// us with the 16-warp shape, 248.9 us for the two-blocks kernel at 64 x 16384).
void attn_register_k4b8_v4b8(std::vector<AttnEntry>& out) {
  VQ_ATTN_ENTRIES_F(4, 8, 4, 8, 4, 8, 3, 0)
  VQ_ATTN_ENTRIES_F(4, 8, 4, 8, 2, 16, 3, 1)
  VQ_ATTN_ENTRIES_F(4, 8, 4, 8, 4, 8, 3, 2)
  VQ_ATTN_ENTRIES_F(4, 8, 4, 8, 4, 8, 3, 3)  // int8 keys and values: the int8-key shape
}
// Large batches (every (batch, kv head) its own block, two waves of blocks or more), E4M3
// codebooks: 8 warps and two blocks per multiprocessor, so one block's setup and tail overlap the
// other's streaming (docs/cuda-notes.md, run 12: 268.7 vs 291.0 us at 64 x 16384 for fp16 then,
// same run). Its shared-memory budget must still buy every lane its own codebook copy: one more
// KB of query buffers once cost it half the value copies and 23% at 64 x 16384 (run 20). fp16
// codebooks have no two-blocks kernel since run 45 (the 8-warp, 4-k-tile kernel is faster).
static_assert(AttnTraits<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 1>::kRK == 32 && AttnTraits<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 1>::kRV == 32,
              "the two-blocks-per-SM d4b8 E4M3 kernel lost conflict-free codebook replication");
void attn_register_wide_k4b8_v4b8(std::vector<AttnEntry>& out) {
  AttnEntry f = attn_entry<128, 4, 8, 4, 8, 1, 2, 2, 8, 2, 1>();  // E4M3 codebooks
  f.wide = 1;
  out.push_back(f);
}
// Four query rows or fewer per chunk (AttnTraits::kR4; attn_launch picks them), with the value
// MMA that needs no repack (E4M3: one MMA per converted value word instead of kPairV's two; run
// 78: -8.5 to -9.5% at every shape, also against the two-blocks kernel at 64 x 16384, which the
// four-row kernel therefore replaces). Holding half the accumulators, the fp16 and int8-key
// four-row kernels fit 16 warps of 2-k-tile warp tiles under the 128-register cap without
// spilling, and that shape beat their 8-warp, 4-k-tile one (run 80, variants, 2 repetitions:
// fp16 35.8-35.9 / 61.7-61.9 / 231.3-231.6 us against 36.7 / 62.3-63.1 / 233.0-233.5; int8 keys
// 32.2-32.8 / 56.6-56.7 / 202.8 against 33.1-33.8 / 57.4-57.7 / 206.5-207.5; 12 warps lost).
void attn_register_rows4_k4b8_v4b8(std::vector<AttnEntry>& out) {
  out.push_back(attn_entry<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 0, 1>());
  out.push_back(attn_entry<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 2, 1>());
  out.push_back(attn_entry<64, 4, 8, 4, 8, 1, 2, 1, 16, 3, 0, 1>());
  out.push_back(attn_entry<64, 4, 8, 4, 8, 1, 2, 1, 16, 3, 2, 1>());
  out.push_back(attn_entry<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 1, 1>());  // E4M3
  out.push_back(attn_entry<64, 4, 8, 4, 8, 1, 2, 1, 16, 3, 1, 1>());
  // int8 keys and values (run 143; since run 157 P·V̂ on int8 tensor cores, softmax_pv_i8): a
  // value gather moves 4 bytes instead of 8, at parity with int8 keys and fp16 values (H100,
  // run 157: 33.9 / 57.7 / 205.2 against 34.4 / 57.1 / 203.8 us). 8 warps x 4 k-tiles (one
  // flush per 64 tokens, 167 registers) was 1-2% slower than this shape (run 158).
  out.push_back(attn_entry<128, 4, 8, 4, 8, 1, 2, 1, 16, 3, 3, 1>());
  out.push_back(attn_entry<64, 4, 8, 4, 8, 1, 2, 1, 16, 3, 3, 1>());
}
// The four-row kernels' two-blocks form (8 warps of 2-k-tile warp tiles, 2 ring stages, 104 KB:
// every codebook copy kept, gathers by one PRMT with the base as an immediate, AttnTraits::
// kPrmtRel), for unsplit grids where the wave model says it pays (attn_wide_pays). Run 145, same
// binary with and without it, 2 repetitions, 64 x 16384: int8 keys 188.4 / 188.6 us against
// 196.6 / 196.4 (71.1-71.6% of copy), fp16 221.4 / 221.3 against 227.8 / 227.4, E4M3 252.9 /
// 253.9 against 263.2 / 264.1, int8 keys and values 210.8 / 211.5 against 218.2 / 218.1; int8
// keys at 128 x 8192 / 256 x 4096: 206.0 / 235.6 against 225.3 / 276.8 us. At batch 1 and 8
// (split grids) the variants lost 5-9% (run 144), so split launches keep the one-block kernel.
template <int D, int CBF>
AttnEntry wide_rows4() {
  static_assert(AttnTraits<D, 4, 8, 4, 8, 1, 2, 2, 8, 2, CBF, 1>::kPrmtRel,
                "the two-blocks four-row kernels lost full codebook replication");
  AttnEntry e = attn_entry<D, 4, 8, 4, 8, 1, 2, 2, 8, 2, CBF, 1>();
  e.wide = 1;
  return e;
}
void attn_register_wide_rows4_k4b8_v4b8(std::vector<AttnEntry>& out) {
  for (AttnEntry e : {wide_rows4<128, 0>(), wide_rows4<64, 0>(), wide_rows4<128, 2>(), wide_rows4<64, 2>(),
                      wide_rows4<128, 1>(), wide_rows4<64, 1>(),    // E4M3
                      wide_rows4<128, 3>(), wide_rows4<64, 3>()})  // int8 keys and values
    out.push_back(e);
}
}  // namespace veloxquant::cuda
