// src/cuda/prefill_tiles.cuh — the pieces both prefill kernels share (prefill_kernel.cuh over codes
// and exact rows, prefill_exact_kernel.cuh over exact rows only): ldmatrix of rewritten tiles,
// exact rows into shared K/V tiles by cp.async, the mask and the online softmax of one MMA row
// tile's scores, and the outputs of one row.
#pragma once

#include <cstdint>

#include "cuda/attn_masks.cuh"
#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"

namespace veloxquant::cuda::prefill_tiles {

// ldmatrix of the K/V tiles: volatile, unlike the decode kernel's ldsm_x4_trans (codebooks that
// stay put), since these tiles are rewritten between block barriers.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// The visible tokens [lo, hi) of block row gr (query gr / G of an L-token sequence whose last
/// q_tail tokens are the chunk's); dead rows (gr >= rows_total) see all of them.
__device__ __forceinline__ void row_bounds(const AttnParams& p, int gr, int rows_total, int G, int L, int& lo, int& hi) {
  if (gr < rows_total) {
    attn_query_bounds(p, L - p.q_tail + gr / G, L, lo, hi);
  } else {
    lo = 0, hi = L;
  }
}

/// The tokens a block of query rows row0 .. row0 + rows - 1 may see, from its first and last
/// live rows (a row's bounds never decrease with the row): the first row's [lo_first, hi_first)
/// and the last's [lo_last, hi_last); hi_first is the least upper bound, lo_last the greatest
/// lower one.
__device__ __forceinline__ void block_span(const AttnParams& p, int row0, int rows, int rows_total, int G, int L,
                                           int& lo_first, int& hi_first, int& lo_last, int& hi_last) {
  row_bounds(p, row0, rows_total, G, L, lo_first, hi_first);
  row_bounds(p, min(row0 + rows, rows_total) - 1, rows_total, G, L, lo_last, hi_last);
}

/// Exact rows j0 .. j0 + n - 1 of one (sequence, kv head) (kwin / vwin: its [win_cap, D] rows;
/// token pos at slot pos, or pos % win_cap in a ring) into the K / V tiles sk / sv (kTile rows of
/// kStride halves) by cp.async, one commit group; rows n .. kTile - 1 get zeros, a finite filler
/// that the mask removes. Thread tid of kThreads issues pieces tid, tid + kThreads, ...
template <int D, int kStride, int kTile, int kThreads>
__device__ __forceinline__ void issue_row_tile(const AttnParams& p, const uint16_t* kwin, const uint16_t* vwin, int j0,
                                               int n, __half* sk, __half* sv, int tid) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
#pragma unroll 4
  for (int idx = tid; idx < kTile * kChunks; idx += kThreads) {
    const int tok = idx / kChunks, ch = idx % kChunks;
    __half* const dk = sk + tok * kStride + ch * 8;
    __half* const dv = sv + tok * kStride + ch * 8;
    if (tok < n) {
      const int pos = j0 + tok;
      const int64_t slot = p.win_ring ? int64_t(pos % p.win_cap) : int64_t(pos);
      cp_async16(uint32_t(__cvta_generic_to_shared(dk)), kwin + slot * D + ch * 8);
      cp_async16(uint32_t(__cvta_generic_to_shared(dv)), vwin + slot * D + ch * 8);
    } else {
      *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
    }
  }
  cp_async_commit();
}

/// bf16 rows to fp16 in place once they landed: the pieces of the first n rows that thread tid
/// issued itself (issue_row_tile's assignment), so no barrier is needed before.
template <int D, int kStride, int kThreads>
__device__ __forceinline__ void fix_bf16_row_tile(int n, __half* sk, __half* sv, int tid) {
  constexpr int kChunks = D / 8;
  for (int idx = tid; idx < n * kChunks; idx += kThreads) {
    const int tok = idx / kChunks, ch = idx % kChunks;
    uint4* const pk = reinterpret_cast<uint4*>(sk + tok * kStride + ch * 8);
    uint4* const pv = reinterpret_cast<uint4*>(sv + tok * kStride + ch * 8);
    uint4 kv = *pk, vv = *pv;
    kv.x = bf16x2_to_f16x2(kv.x), kv.y = bf16x2_to_f16x2(kv.y), kv.z = bf16x2_to_f16x2(kv.z),
    kv.w = bf16x2_to_f16x2(kv.w);
    vv.x = bf16x2_to_f16x2(vv.x), vv.y = bf16x2_to_f16x2(vv.y), vv.z = bf16x2_to_f16x2(vv.z),
    vv.w = bf16x2_to_f16x2(vv.w);
    *pk = kv, *pv = vv;
  }
}

/// The mask of one MMA row tile's scores s[kN][4] (tokens j0 + 8n + 2t4 + (e & 1), rows g and
/// g + 8 by e >> 1): -inf where a token is at or past `end` or outside its row's [lo, hi).
template <int kN>
__device__ __forceinline__ void mask_tile(float (&s)[kN][4], int j0, int end, int t4, const int (&lo)[2],
                                          const int (&hi)[2]) {
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + n * 8 + 2 * t4 + (e & 1), r = e >> 1;
      if (!(j < end && j >= lo[r] && j < hi[r])) s[n][e] = -INFINITY;
    }
}

/// The online softmax (log2 units) of one MMA row tile: s becomes its probabilities against the
/// rows' new maxima, mrow / lrow (this lane's part of the sums) are updated, and alpha[r] is the
/// factor row r's outputs must be scaled by. A row with no visible token keeps max -inf and
/// probabilities 0.
template <int kN>
__device__ __forceinline__ void softmax_tile(float (&s)[kN][4], float (&mrow)[2], float (&lrow)[2], float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kN; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(mrow[r], mx);
    const float base = mnew == -INFINITY ? 0.0f : mnew;
    alpha[r] = ex2(mrow[r] - base);  // ex2(-inf) = 0
    mrow[r] = mnew;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      s[n][2 * r] = ex2(s[n][2 * r] - base);
      s[n][2 * r + 1] = ex2(s[n][2 * r + 1] - base);
      sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    lrow[r] = lrow[r] * alpha[r] + sum;
  }
}

/// The softmax sums of one MMA row tile's two rows, each lane's part reduced over the row's four
/// lanes (a quad of the MMA layout).
__device__ __forceinline__ void reduce_row_sums(float (&lrow)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
  }
}

/// Outputs O / l of one MMA row tile's two rows (row r: block row gr[r], dead past rows_total;
/// lrow holds this lane's part of each sum, reduced here over the row's four lanes).
template <int D>
__device__ __forceinline__ void store_tile_rows(const AttnParams& p, const float (&o)[D / 8][4], float (&lrow)[2],
                                                const int (&gr)[2], int rows_total, int G, int kvh, int b, int t4) {
  reduce_row_sums(lrow);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (gr[r] >= rows_total) continue;
    const int qi = gr[r] / G, h = kvh * G + gr[r] % G;
    const float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
    const int64_t ob = b * p.out_stride[0] + h * p.out_stride[1] + qi * p.out_stride[2];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        store_f(p.out, p.out_dtype, ob + (n * 8 + 2 * t4 + e) * p.out_stride[3], o[n][2 * r + e] * inv);
  }
}

}  // namespace veloxquant::cuda::prefill_tiles
