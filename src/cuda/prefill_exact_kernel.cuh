// src/cuda/prefill_exact_kernel.cuh — prefill attention over exact rows only: the fp16 cache,
// Standard caches, and the coded caches' prefill over dequantized rows (every token a window row,
// AttnParams::win_all). FlashAttention-2's warp tiling: 32 query rows a warp.
//
// What it computes: what vq_prefill_kernel (prefill_kernel.cuh) computes for win_all launches,
//   out[row] = Σ_j softmax_j(scale · q_row · k_j) v_j over the rows' visible tokens,
// query rows row = qi·G + hg of one kv head, as in decode, under causal and sliding-window masks.
//
// Why a second kernel. vq_prefill_kernel gives each warp 16 query rows (one MMA row tile), so
// every K and V fragment a warp reads from shared memory by ldmatrix feeds one MMA row tile:
// 2 shared-memory wavefronts per m16n8k16 MMA, against the tensor cores' ~1 MMA a clock per
// multiprocessor, so its loop is bound by shared memory. Here a warp holds 32 rows (two row
// tiles, as FlashAttention-2 does): each K / V fragment feeds two MMAs, and the queries' A
// fragments are re-read from shared memory per k-step (in registers they would not fit beside
// 32 rows' fp32 outputs and scores): 1.5 wavefronts per MMA in S = Q·Kᵀ, 1 in O += P·V.
// 4 warps (128 rows) a block, two blocks a multiprocessor (about 102 KB each at head_dim 128).
//
// The pipeline (as vq_prefill_kernel's exact rows): two K/V tile buffers; at tile t's barrier
// tile t sits in buffer t & 1, every thread issues tile t + 1's rows by cp.async into the other
// buffer and then runs tile t's MMAs, so a tile's loads fly during the previous tile's MMAs.
// bf16 rows are turned into fp16 in place after they land (each thread the pieces it issued).
//
// Reference: attention_ref / vecinfer_attention_ref (the tests), and vq_prefill_kernel, which
// the tests also run on the same inputs (cuda::set_prefill_exact_kernel).
//
// Status: run 179 (H100, same command as vq_prefill_kernel): 3-15% faster than vq_prefill_kernel
// on grids of two blocks a multiprocessor or more, 14-20% slower on grids of one, where it has
// half the warps a multiprocessor; so it takes the launches prefill_exact_pays names
// (cuda::kExactAuto, the default), and smaller grids over long histories with the history split
// over 2-4 blocks (SPLIT, then vq_prefill_merge_kernel; prefill_exact_split_plan, run 180).
// Registers at sm_90, no spill: 255 at head_dim 128 with tiles of 64 tokens, 244 with 32 (251
// split), 226 at head_dim 64. Head dims 80 and 96 (Phi-2 / StableLM, Phi-3: multiples of 16, as
// every k-step and output tile needs) take the same code, tiles of 64 tokens: the prefill of the
// plain kernel's head dims over rows (the fp16 cache's, or a coded cache's expanded ones). On the edge: staging the queries by cp.async instead of row by row
// (~32 dependent round trips a warp before the first tile), computing the rows' mask bounds in
// the loop instead of holding them, or packing all of P before O += P·V each made ptxas spill
// 56-84 bytes at head_dim 128 x 64 (not measured; the next step where the prologue matters, 0 x
// 4096: 1024 blocks of ~150 us, a few us of it staging).
#pragma once

#include <cstdint>

#include "cuda/attn_masks.cuh"
#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"
#include "cuda/prefill_tiles.cuh"

namespace veloxquant::cuda {

template <int D, int TILE>
struct PrefillExactTraits {
  static_assert(D == 64 || D == 128 || D == 80 || D == 96, "exact-rows prefill kernel: head_dim 64, 128, 80 or 96");
  static_assert(TILE == 32 || TILE == 64, "exact-rows prefill kernel: tiles of 32 or 64 tokens");
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kWarpRows = 32, kRows = kWarpRows * kWarps;  // query rows per warp / block
  static constexpr int kTile = TILE;
  static constexpr int kStride = D + 8;  // halves per shared row (odd multiple of 16 bytes: ldmatrix conflict-free)
  static constexpr int kQBytes = kRows * kStride * 2;
  static constexpr int kTileBytes = kTile * kStride * 2;
  static constexpr int kBufBytes = 2 * kTileBytes;  // K tile, then V tile
  static constexpr int kSmem = kQBytes + 2 * kBufBytes;
  // two blocks a multiprocessor: 2 x (kSmem + the 1 KB the hardware reserves per block) <= 228 KB
  static_assert(kSmem <= 113 * 1024, "exact-rows prefill kernel: two blocks must fit a multiprocessor");
};

/// Where share s of a split prefill launch keeps row gr of (sequence b, kv head kvh): p.ws_o
/// [index · D, + D) (unnormalised O) and p.ws_ml [2 · index, + 2) (max, sum; log2 units).
__device__ __forceinline__ int64_t prefill_split_index(const AttnParams& p, int s, int b, int kvh, int gr) {
  const int rows_total = p.n_heads / p.n_kv_heads * p.q_len;
  return ((int64_t(s) * p.batch + b) * p.n_kv_heads + kvh) * rows_total + gr;
}

/// One MMA row tile's two rows of a split launch's share (as store_tile_rows, unnormalised): O,
/// and the row's max and sum (lrow reduced over the row's four lanes here; mrow is already the
/// row's), for the live rows.
template <int D>
__device__ __forceinline__ void store_tile_partial(const AttnParams& p, const float (&o)[D / 8][4], const float (&mrow)[2],
                                                   float (&lrow)[2], const int (&gr)[2], int rows_total, int kvh, int b,
                                                   int share, int t4) {
  prefill_tiles::reduce_row_sums(lrow);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (gr[r] >= rows_total) continue;
    const int64_t i = prefill_split_index(p, share, b, kvh, gr[r]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(p.ws_o + i * D + n * 8 + 2 * t4) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
    if (t4 == 0) *reinterpret_cast<float2*>(p.ws_ml + 2 * i) = make_float2(mrow[r], lrow[r]);
  }
}

/// One block: 128 query rows, row block gridDim.y - 1 - blockIdx.y (heaviest first), of kv head
/// blockIdx.x of sequence blockIdx.z. Requires p.win_all (every token an exact row) and p.n_new == 0.
/// SPLIT: the history split over p.n_splits blocks (blockIdx.z = sequence · n_splits + share),
/// share s taking tiles [n_tiles·s / n_splits, n_tiles·(s + 1) / n_splits) of the block's visible
/// ones and writing its rows' unnormalised O, max and sum (log2 units) to p.ws_o / p.ws_ml
/// (prefill_split_index) for vq_prefill_merge_kernel: more blocks where one a row block would
/// leave the multiprocessors half empty (prefill_launch). Without SPLIT the code is the one run 179
/// measured.
template <int D, int TILE, bool SPLIT = false>
__global__ void __launch_bounds__(128, 2) vq_prefill_exact_kernel(const AttnParams p) {
  using T = PrefillExactTraits<D, TILE>;
  using namespace prefill_tiles;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int kvh = blockIdx.x;
  const int b = SPLIT ? int(blockIdx.z) / p.n_splits : int(blockIdx.z);
  const int share = SPLIT ? int(blockIdx.z) % p.n_splits : 0;
  const int G = p.n_heads / p.n_kv_heads;
  const int rows_total = G * p.q_len, row0 = int(gridDim.y - 1 - blockIdx.y) * T::kRows;
  const int64_t bh = int64_t(b) * p.n_kv_heads + kvh;
  const uint32_t s_base = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t q_base = s_base, buf_base = s_base + uint32_t(T::kQBytes);
  __half* const sQ = reinterpret_cast<__half*>(smem);
  auto k_tile = [&](int buf) { return reinterpret_cast<__half*>(smem + T::kQBytes + buf * T::kBufBytes); };
  auto v_tile = [&](int buf) {
    return reinterpret_cast<__half*>(smem + T::kQBytes + buf * T::kBufBytes + T::kTileBytes);
  };

  // ---- lengths and this block's visible tokens ----------------------------------------------
  const int L = p.seq_len[b] + p.n_new;
  auto bounds = [&](int gr, int& lo, int& hi) { row_bounds(p, gr, rows_total, G, L, lo, hi); };
  int lo_u, hi_min, lo_max, hi_u;
  block_span(p, row0, T::kRows, rows_total, G, L, lo_u, hi_min, lo_max, hi_u);
  const int wA = max(lo_u, 0), wB = min(hi_u, L);
  const int n_tiles = wB > wA ? (wB - wA + T::kTile - 1) / T::kTile : 0;
  const int t_lo = SPLIT ? int(int64_t(n_tiles) * share / p.n_splits) : 0;
  const int t_hi = SPLIT ? int(int64_t(n_tiles) * (share + 1) / p.n_splits) : n_tiles;

  // tile w (tokens [wA + TILE·w, ..) ∩ [.., wB)) → K/V buffer `buf` by cp.async; tokens past the
  // end get zeros (a finite filler that the mask removes)
  const uint16_t* const kwin = static_cast<const uint16_t*>(p.k_win) + bh * p.win_cap * D;
  const uint16_t* const vwin = static_cast<const uint16_t*>(p.v_win) + bh * p.win_cap * D;
  auto issue_tile = [&](int w, int buf) {
    const int j0 = wA + w * T::kTile;
    issue_row_tile<D, T::kStride, T::kTile, T::kThreads>(p, kwin, vwin, j0, min(T::kTile, wB - j0), k_tile(buf),
                                                         v_tile(buf), tid);
  };
  auto fix_bf16_tile = [&](int w, int buf) {  // the pieces this thread issued, bf16 → fp16
    fix_bf16_row_tile<D, T::kStride, T::kThreads>(min(T::kTile, wB - (wA + w * T::kTile)), k_tile(buf), v_tile(buf), tid);
  };
  if (t_hi > t_lo) issue_tile(t_lo, 0);

  // ---- the block's queries · scale·log2 e as fp16 rows in shared memory (while tile 0 lands) --
  // warp w stages its own 32 rows; lane l holds dims 2l, 2l + 1 (and 64 + 2l, 65 + 2l)
  for (int k = 0; k < T::kWarpRows; ++k) {
    const int r = warp * T::kWarpRows + k, gr = row0 + r;
    const bool live = gr < rows_total;
    const int qi = live ? gr / G : 0, h = kvh * G + (live ? gr % G : 0);
    const int64_t qb = b * p.q.stride[0] + h * p.q.stride[1] + qi * p.q.stride[2];
#pragma unroll
    for (int c = 0; c < (D + 63) / 64; ++c) {
      const int d = c * 64 + 2 * lane;
      if (D % 64 != 0 && d >= D) continue;  // (head_dim 80 / 96: the last 64 dims in part)
      const float x0 = live ? load_f(p.q.data, p.q.dtype, qb + d * p.q.stride[3]) : 0.0f;
      const float x1 = live ? load_f(p.q.data, p.q.dtype, qb + (d + 1) * p.q.stride[3]) : 0.0f;
      *reinterpret_cast<uint32_t*>(sQ + r * T::kStride + d) = pack_half2(x0 * p.scale_log2, x1 * p.scale_log2);
    }
  }

  // ---- online softmax state: [m][r] is row m·16 + g + 8r of this warp's 32 --------------------
  float o[2][D / 8][4];
  float mrow[2][2], lrow[2][2];
  int lo_r[2][2], hi_r[2][2];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mrow[m][r] = -INFINITY, lrow[m][r] = 0.0f;
      bounds(row0 + warp * T::kWarpRows + m * 16 + g + 8 * r, lo_r[m][r], hi_r[m][r]);
    }
  }
  const int m8 = lane >> 3, r8 = lane & 7;
  // lane offsets (bytes) of the ldmatrix addresses: Q as A (rows (m & 1)·8 + i, dims (m >> 1)·8),
  // K non-transposed as B (tokens (m >> 1)·8 + i, dims (m & 1)·8), V transposed as B (tokens
  // (m & 1)·8 + i, dims (m >> 1)·8)
  const uint32_t qoff = uint32_t(((warp * T::kWarpRows + (m8 & 1) * 8 + r8) * T::kStride + (m8 >> 1) * 8) * 2);
  const uint32_t koff = uint32_t((((m8 >> 1) * 8 + r8) * T::kStride + (m8 & 1) * 8) * 2);
  const uint32_t voff = uint32_t((((m8 & 1) * 8 + r8) * T::kStride + (m8 >> 1) * 8) * 2);
  constexpr int kN = T::kTile / 8;  // score column tiles (8 tokens each)

  auto run_tile = [&](int buf, int j0, int end) {
    const uint32_t kbase = buf_base + uint32_t(buf * T::kBufBytes), vbase = kbase + uint32_t(T::kTileBytes);
    float s[2][kN][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < kN; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
    // S = Q·Kᵀ: per k-step the two row tiles' A fragments, then each 16-token K fragment feeds both
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) ldsm_x4(q_base + qoff + uint32_t((m * 16 * T::kStride + kk * 16) * 2), qa[m]);
#pragma unroll
      for (int np = 0; np < kN / 2; ++np) {
        uint32_t kf[4];
        ldsm_x4(kbase + koff + uint32_t((np * 16 * T::kStride + kk * 16) * 2), kf);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          mma_f16(s[m][2 * np], qa[m][0], qa[m][1], qa[m][2], qa[m][3], kf[0], kf[1]);
          mma_f16(s[m][2 * np + 1], qa[m][0], qa[m][1], qa[m][2], qa[m][3], kf[2], kf[3]);
        }
      }
    }
    const bool full = j0 >= lo_max && j0 + T::kTile <= hi_min && j0 + T::kTile <= end;
    if (!full) {
#pragma unroll
      for (int m = 0; m < 2; ++m) mask_tile<kN>(s[m], j0, end, t4, lo_r[m], hi_r[m]);
    }
    float alpha[2][2];
#pragma unroll
    for (int m = 0; m < 2; ++m) softmax_tile<kN>(s[m], mrow[m], lrow[m], alpha[m]);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        o[m][n][0] *= alpha[m][0], o[m][n][1] *= alpha[m][0], o[m][n][2] *= alpha[m][1], o[m][n][3] *= alpha[m][1];
    // O += P·V: per 16 tokens the two row tiles' P as A fragments; each V fragment feeds both
#pragma unroll
    for (int kk = 0; kk < T::kTile / 16; ++kk) {
      uint32_t pa[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        pa[m][0] = pack_half2(s[m][2 * kk][0], s[m][2 * kk][1]);
        pa[m][1] = pack_half2(s[m][2 * kk][2], s[m][2 * kk][3]);
        pa[m][2] = pack_half2(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        pa[m][3] = pack_half2(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldsm_x4_t(vbase + voff + uint32_t((kk * 16 * T::kStride + dp * 16) * 2), vf);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          mma_f16(o[m][2 * dp], pa[m][0], pa[m][1], pa[m][2], pa[m][3], vf[0], vf[1]);
          mma_f16(o[m][2 * dp + 1], pa[m][0], pa[m][1], pa[m][2], pa[m][3], vf[2], vf[3]);
        }
      }
    }
  };

  // ---- the pipeline --------------------------------------------------------------------------
  for (int t = t_lo; t < t_hi; ++t) {
    const int buf = (t - t_lo) & 1;
    cp_async_wait<0>();  // what this thread issued during tile t - 1: tile t's rows
    if (p.win_bf16) fix_bf16_tile(t, buf);
    __syncthreads();  // tile t (and, at the first, the queries) in place for every warp; tile t - 1 done
    if (t + 1 < t_hi) issue_tile(t + 1, buf ^ 1);
    run_tile(buf, wA + t * T::kTile, wB);
  }

  // ---- outputs: O / l per row, or this share's O, max and sum ------------------------------------
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int gr[2] = {row0 + warp * T::kWarpRows + m * 16 + g, row0 + warp * T::kWarpRows + m * 16 + g + 8};
    if constexpr (SPLIT) {
      store_tile_partial<D>(p, o[m], mrow[m], lrow[m], gr, rows_total, kvh, b, share, t4);
    } else {
      store_tile_rows<D>(p, o[m], lrow[m], gr, rows_total, G, kvh, b, t4);
    }
  }
}

/// The merge of a split prefill launch: one warp per (sequence, kv head, row), the shares' O
/// weighted by 2^(max_s − max) and divided by the weighted sums, stored as vq_prefill_exact_kernel
/// stores its rows (rows that see no token: zeros). Grid: ceil(batch · n_kv_heads · rows / 8)
/// blocks of 256 threads.
template <int D>
__global__ void __launch_bounds__(256) vq_prefill_merge_kernel(const AttnParams p) {
  const int G = p.n_heads / p.n_kv_heads, rows_total = G * p.q_len;
  const int64_t item = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (item >= int64_t(p.batch) * p.n_kv_heads * rows_total) return;
  const int lane = threadIdx.x & 31;
  const int gr = int(item % rows_total), kvh = int(item / rows_total % p.n_kv_heads);
  const int b = int(item / rows_total / p.n_kv_heads);
  float mx = -INFINITY;
  for (int s = 0; s < p.n_splits; ++s) mx = fmaxf(mx, p.ws_ml[2 * prefill_split_index(p, s, b, kvh, gr)]);
  const float base = mx == -INFINITY ? 0.0f : mx;
  constexpr int kE = (D + 31) / 32;  // a lane's dims: e·32 + lane (head_dim 80: the last in part)
  const bool last = D % 32 == 0 || (kE - 1) * 32 + lane < D;
  float acc[kE] = {}, sum = 0.0f;
  for (int s = 0; s < p.n_splits; ++s) {
    const int64_t i = prefill_split_index(p, s, b, kvh, gr);
    const float w = ex2(p.ws_ml[2 * i] - base);  // ex2(-inf) = 0: a share that saw no token
    sum += w * p.ws_ml[2 * i + 1];
#pragma unroll
    for (int e = 0; e < kE; ++e)
      if (e < kE - 1 || last) acc[e] += w * p.ws_o[i * D + e * 32 + lane];
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  const int qi = gr / G, h = kvh * G + gr % G;
  const int64_t ob = b * p.out_stride[0] + h * p.out_stride[1] + qi * p.out_stride[2];
#pragma unroll
  for (int e = 0; e < kE; ++e)
    if (e < kE - 1 || last) store_f(p.out, p.out_dtype, ob + (e * 32 + lane) * p.out_stride[3], acc[e] * inv);
}

}  // namespace veloxquant::cuda
