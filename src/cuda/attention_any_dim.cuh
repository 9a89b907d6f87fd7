// src/cuda/attention_any_dim.cuh — the plain attention kernel's shape, shared by its host side
// (attention_any_dim.cu: entries, launches, replication) and its instantiations, one file a head
// dim (attn_any_hd80.cu ... attn_any_hd192.cu, compiled in parallel): the block's thread count,
// its tiles, the row variants, the value-phase mapping and the shared-memory layout. The kernel
// itself: attention_any_dim_kernel.cuh.
#pragma once

#include <cstdint>

namespace veloxquant::cuda::any_dim {

constexpr int kAnyThreads = 256;
constexpr int kAnyTile = 256;     // tokens a tile: one per thread in the score phase
constexpr int kAnyMaxRows = 16;   // query rows a chunk (8 · n_tiles)
/// Live rows a kernel instantiation serves (NR): the launch takes the smallest that holds its
/// chunks' rows, so a decode step of a model without GQA (Phi-2, Phi-3: one row a kv head) does
/// no work for the seven dead rows of an 8-row chunk.
constexpr int kAnyRowVariants[] = {1, 4, 8, 16};
constexpr int kAnyMaxBits = 12;   // codebooks of up to 4096 centroids (shared memory)

__host__ __device__ constexpr int any_align16(int x) { return (x + 15) & ~15; }

/// Value-phase mapping: a thread owns value sub-vector j of rows [rg·RPT, rg·RPT + RPT) and the
/// tile's tokens k, k + K, ... (RPT = min(32 / VS, NR): at most 32 accumulators a thread)
struct AnyMap {
  int nvs, rpt, rg, slots, k;
};
__host__ __device__ constexpr AnyMap any_map(int D, int VS, int rows) {
  const int nvs = D / VS, rpt = 32 / VS < rows ? 32 / VS : rows, rg = (rows + rpt - 1) / rpt;
  const int slots = nvs * rg;
  return {nvs, rpt, rg, slots, kAnyThreads / slots};
}

/// Shared-memory layout (byte offsets), the same on the host (launch size) and the device.
struct AnyLayout {
  int st, kcb, vcb, kraw, vraw, qt, qr, s, red, total;
};
/// AttnParams::plain_cb_rep: the key (bit 0) and value (bit 1) codebooks held once per lane of a
/// shared-memory wavefront. A replicated codebook of 2^bits entries takes 2^bits · 128 bytes:
/// entry c, copy l at halves c · 64 + l · sub_dim (l = lane mod 64 / sub_dim: 16 copies of a d4
/// entry, 8 of a d8 one), so the lanes of a half-warp (8-byte d4 entries) or quarter-warp (16-byte
/// d8 entries), which the hardware serves in one wavefront, each read banks of their own.
constexpr int kAnyRepKeys = 1, kAnyRepValues = 2;
constexpr int kAnyRepMaxBits = 8;  // 256 entries: 32 KB a replicated codebook
__host__ __device__ constexpr int any_cb_bytes(int sub, int bits, bool rep) {
  return rep ? (1 << bits) * 128 : any_align16((1 << bits) * sub * 2);
}
/// Bytes of a packed code row as the caches lay them out (pq.h, padded to 4 bytes).
__host__ __device__ constexpr int any_row_bytes(int D, int sub, int bits) { return ((D / sub * bits + 7) / 8 + 3) / 4 * 4; }
__host__ __device__ constexpr AnyLayout any_layout(int D, int KS, int KB, int VS, int VB, int rows, bool codes,
                                                    int rep) {
  const AnyMap m = any_map(D, VS, rows);
  AnyLayout L{};
  int o = 0;
  L.st = o, o += any_align16((kAnyThreads / 32 + 3) * rows * 4);            // warps' row maxima, running max (2 buffers), sum
  L.kcb = o, o += codes ? any_cb_bytes(KS, KB, rep & kAnyRepKeys) : 0;      // fp16 key centroids
  L.vcb = o, o += codes ? any_cb_bytes(VS, VB, rep & kAnyRepValues) : 0;    // fp16 value centroids
  L.kraw = o, o += codes ? 2 * kAnyTile * any_row_bytes(D, KS, KB) : 0;     // two tiles of key code rows
  L.vraw = o, o += codes ? 2 * kAnyTile * any_row_bytes(D, VS, VB) : 0;     // and of value code rows
  L.qt = o, o += rows * D * 4;                                               // q̃ per row (f32)
  L.qr = o, o += rows * D * 4;                                               // raw q per row (f32)
  L.s = o, o += rows * kAnyTile * 4;                                         // the tile's probabilities, token-major
  // the value partials' reduction, after the last tile: over everything but the running state
  L.red = L.kcb;
  const int red_end = L.red + m.k * rows * D * 4;
  L.total = o > red_end ? o : red_end;
  return L;
}

/// The kernel for (key sub_dim, value sub_dim, live rows NR of kAnyRowVariants) at head_dim D:
/// defined in attention_any_dim_kernel.cuh, instantiated once per head dim of kAnyHeadDims by
/// attn_any_hd<D>.cu.
template <int D>
const void* kernel_for(int key_sub_dim, int value_sub_dim, int nr);

}  // namespace veloxquant::cuda::any_dim
