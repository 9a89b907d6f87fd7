// src/cuda/prefill_kernel.cuh — prefill attention on product-VQ codes: a chunk of many queries
// (q_len > 16) against the coded history and the exact window, FlashAttention-2 style.
//
// What it computes: the same as vq_attn_kernel (attention_kernel.cuh) for a whole chunk —
//   out[row] = Σ_j softmax_j(scale · q_row · k_j) v_j,
// coded tokens scored as q̃·K̃ (q̃ = (q ⊙ λ)·H, K̃ = the key centroids of token j's codes),
// window tokens as raw q against the stored rows, under causal and sliding-window masks, with
// query rows row = qi·G + hg of one kv head (G = n_heads / n_kv_heads), as in decode.
//
// Why a second kernel. The decode kernel serves at most 16 query rows per block and gathers
// every centroid straight into MMA fragments: right for decode (1-16 queries, the codes read
// once from HBM), but a prefill chunk of Q queries then pays the gathers of every token once
// per 16 rows (run 115: 0.56-0.67x of PyTorch's fp16 SDPA at 32768 tokens of history). Here a
// block serves 128 rows (8 warps of 16; 64 rows in 4 warps, two blocks a multiprocessor, with
// VQ_CUDA_VARIANTS): it dequantizes a tile of 64 tokens into fp16 K/V tiles in shared memory
// once (codes staged by cp.async, centroids gathered from interleaved shared-memory copies of
// the codebooks, byte-wide codes read as bytes; window rows copied by cp.async), and its warps
// run the tile on fp16 tensor cores through ldmatrix (each k-step's fragments loaded one step
// ahead), with an fp32 online softmax (scores in log2 units) held in registers. Tiles are
// software-pipelined with one barrier each (see the kernel). Measured (run 121, against the
// decode kernel's row chunks): over exact rows (the fp16 cache, Standard caches) 3.7-4.0x
// faster; over d4b8/d4b8 codes 1.04-1.24x; over the defaults (d4b12 keys: a 32 KB codebook,
// 4 copies) 1.10x on a 4096-token prompt but 0.89-0.91x at 32768 tokens of history, so those
// take it by default over a short history only (cuda::prefill_auto_on_codes; run 123, blocks
// heaviest first: 1.24x on the prompt). History: run 116 (v1, 64
// rows, a load or dequantization between two barriers per tile), 117 (producer / consumer
// warps: slower, reverted), 118 (fragments a step ahead), 120 (the one-barrier pipeline:
// the fp16 cache 1.6-2.4x), 121 (128-row blocks, codebook copies, byte codes), 123 (row
// blocks launched heaviest first: -9 to -10% on a prompt without history).
//
// Codebooks in any CodebookFormat are turned into true fp16 centroids when staged (E4M3 and
// int8 bytes times their scale, offset-binary int8 values recentred), so q̃ and the outputs
// need no per-format scaling; the only rounding beyond the decode kernel's is the centroid's
// own fp16 rounding (relative 2^-11). bf16 windows are read as fp16, as the decode kernel does.
//
// Shapes: head_dim 64 or 128 (D), key/value sub_dim 4 or 8, any code bits up to 16; one
// launch covers G·q_len rows per (batch, kv head) in blocks of 64; no split of the history
// (the caller routes chunks with too few blocks to fill the GPU to the decode kernel, which
// splits). Reference: vecinfer_attention_ref (the tests), as for decode.
#pragma once

#include <cuda_fp8.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/attn_masks.cuh"
#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"
#include "cuda/prefill_tiles.cuh"

namespace veloxquant::cuda {

template <int D, int KS, int KB, int VS, int VB, int W>
struct PrefillTraits {
  static_assert(D == 64 || D == 128, "prefill kernel: head_dim 64 or 128");
  static_assert((KS == 4 || KS == 8) && (VS == 4 || VS == 8), "sub_dim 4 or 8");
  static_assert(KB >= 1 && KB <= 16 && VB >= 1 && VB <= 16, "code bits 1..16");
  static_assert(W == 4 || W == 8, "prefill kernel: 4 warps (two blocks a multiprocessor) or 8 (one)");
  static constexpr int kWarps = W, kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kWarps;  // query rows per block
  static constexpr int kTile = 64;           // tokens per tile
  static constexpr int kStride = D + 8;      // halves per shared row (odd multiple of 16 bytes: ldmatrix conflict-free)
  static constexpr int kKSubs = D / KS, kVSubs = D / VS;
  static constexpr int kKRow = ((kKSubs * KB + 7) / 8 + 3) / 4 * 4, kVRow = ((kVSubs * VB + 7) / 8 + 3) / 4 * 4;
  static constexpr int kNK = 1 << KB, kNV = 1 << VB;
  // shared memory (bytes): two K/V tile buffers (tile t in buffer t & 1: one is read by the
  // MMAs while the next tile is dequantized or loaded into the other; q̃ is staged in buffer 1
  // first, its K and V tiles being 128 rows of one stride), two code buffers (+16 bytes: a
  // straddling code reads one word past a row), the codebooks in kRK / kRV interleaved copies
  // (entry e of copy c at e·R + c; lane l gathers from copy l mod R, so that R lanes asking for
  // one entry, or entries R apart, hit different banks).
  static constexpr int kTileBytes = kTile * kStride * 2;
  static constexpr int kBufBytes = 2 * kTileBytes;  // K tile, then V tile
  static constexpr int kCodeBuf = kTile * (kKRow + kVRow);
  static constexpr int kCodeOff = 2 * kBufBytes;
  static constexpr int kKcbOff = (kCodeOff + 2 * kCodeBuf + 16 + 15) / 16 * 16;
  // a block's budget: one block a multiprocessor may take 227 KB; two need 2 x (113 KB + the
  // 1 KB the hardware reserves per block) <= 228 KB
  static constexpr int kBudget = W == 8 ? 227 * 1024 : 113 * 1024;
  static constexpr int kKEntry = KS * 2, kVEntry = VS * 2;  // bytes of one fp16 centroid
  static constexpr int kMaxRK = 128 / kKEntry, kMaxRV = 128 / kVEntry;  // copies that spread a warp's gathers over all banks
  static constexpr int bytes_with(int rk, int rv) {
    return kKcbOff + (kNK * kKEntry * rk + 15) / 16 * 16 + (kNV * kVEntry * rv + 15) / 16 * 16;
  }
  // the copies: of all (rk, rv) within the budget, the least expected bank conflict (gathers
  // per token weighted by the conflict left: max / copies)
  static constexpr int pick_copies() {
    int best = 1 * 64 + 1, best_cost = INT_MAX;
    for (int rk = 1; rk <= kMaxRK; rk *= 2)
      for (int rv = 1; rv <= kMaxRV; rv *= 2)
        if (bytes_with(rk, rv) <= kBudget) {
          const int cost = kKSubs * (kMaxRK / rk) + kVSubs * (kMaxRV / rv);
          if (cost < best_cost) best_cost = cost, best = rk * 64 + rv;
        }
    return best;
  }
  static constexpr int kRK = pick_copies() / 64, kRV = pick_copies() % 64;
  static constexpr int kVcbOff = kKcbOff + (kNK * kKEntry * kRK + 15) / 16 * 16;
  static constexpr int kSmem = bytes_with(kRK, kRV);
  static_assert(kSmem <= 227 * 1024, "prefill kernel: shared memory over the sm_90 limit");
};

namespace prefill_detail {

/// One codebook entry element as a float, whatever the codebook's format.
/// fmt: 0 fp16 bits; 1 E4M3 byte · mul; 2 int8 byte · mul; 3 offset-binary byte: (byte − 128) · mul.
__device__ __forceinline__ float cb_elem(const uint16_t* cb16, const uint8_t* cb8, int fmt, float mul, int i) {
  if (fmt == 0) {
    const uint16_t b = cb16[i];
    return __half2float(*reinterpret_cast<const __half*>(&b));
  }
  const uint8_t b = cb8[i];
  if (fmt == 1) {
    __nv_fp8_e4m3 v;
    v.__x = b;
    return float(v) * mul;
  }
  if (fmt == 2) return float(int8_t(b)) * mul;
  return float(int(b) - 128) * mul;
}

}  // namespace prefill_detail

/// One block: 128 (or 64) query rows, row block gridDim.y - 1 - blockIdx.y, of kv head blockIdx.x
/// of sequence blockIdx.z.
/// kfmt / vfmt: the key / value codebooks' formats (prefill_detail::cb_elem).
///
/// The block's tiles, coded ones first (tokens [cA, cB) in tiles of 64), then window ones
/// ([wA, wB)), run as one software pipeline with one block barrier per tile: at the barrier of
/// tile t, tile t sits in K/V buffer t & 1 and the other buffer is free, so each thread first
/// prepares tile t + 1 into it (coded: dequantizes it from codes that landed during tile t - 1,
/// then issues tile t + 2's codes; window: issues its rows by cp.async) and then runs tile t's
/// MMAs. Warps that finish preparing start their MMAs while others still prepare, and the
/// window rows' loads fly during a whole tile's MMAs (before run 120 every tile was loaded or
/// dequantized between two barriers, with nothing else in flight).
template <int D, int KS, int KB, int VS, int VB, int W>
__global__ void __launch_bounds__(32 * W, 8 / W) vq_prefill_kernel(const AttnParams p, int kfmt, int vfmt) {
  using T = PrefillTraits<D, KS, KB, VS, VB, W>;
  using namespace prefill_detail;
  using namespace prefill_tiles;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // blocks go out heaviest first: row blocks from the last (the longest causal prefixes), every
  // kv head of one row block before the next, so that the light ones fill the last wave
  const int kvh = blockIdx.x, b = blockIdx.z;
  const int G = p.n_heads / p.n_kv_heads;
  const int rows_total = G * p.q_len, row0 = int(gridDim.y - 1 - blockIdx.y) * T::kRows;
  const int64_t bh = int64_t(b) * p.n_kv_heads + kvh;
  const uint32_t s_base = uint32_t(__cvta_generic_to_shared(smem));
  unsigned char* const sCode = smem + T::kCodeOff;
  __half* const sKcb = reinterpret_cast<__half*>(smem + T::kKcbOff);
  __half* const sVcb = reinterpret_cast<__half*>(smem + T::kVcbOff);
  auto k_tile = [&](int buf) { return reinterpret_cast<__half*>(smem + buf * T::kBufBytes); };
  auto v_tile = [&](int buf) { return reinterpret_cast<__half*>(smem + buf * T::kBufBytes + T::kTileBytes); };

  // ---- lengths and this block's visible tokens ----------------------------------------------
  const int L = p.seq_len[b] + p.n_new;
  int rc = p.win_all ? L : min(p.residual_length, (p.res_count ? p.res_count[b] : 0) + p.n_new);
  rc = max(0, min(rc, L));
  const int n_code = L - rc;
  auto bounds = [&](int gr, int& lo, int& hi) { row_bounds(p, gr, rows_total, G, L, lo, hi); };
  int lo_u, hi_min, lo_max, hi_u;
  block_span(p, row0, T::kRows, rows_total, G, L, lo_u, hi_min, lo_max, hi_u);
  const int cA = max(lo_u, 0), cB = min(hi_u, n_code);
  const int wA = max(lo_u, n_code), wB = min(hi_u, L);
  const bool has_code = cB > cA && p.k_codes != nullptr;
  const int n_ct = has_code ? (cB - cA + T::kTile - 1) / T::kTile : 0;  // coded tiles
  const int n_wt = wB > wA ? (wB - wA + T::kTile - 1) / T::kTile : 0;   // window tiles
  const int n_tiles = n_ct + n_wt;
  const uint8_t* const kcodes = has_code ? p.k_codes + bh * p.code_cap * p.k_row_stride : nullptr;
  const uint8_t* const vcodes = has_code ? p.v_codes + bh * p.code_cap * p.v_row_stride : nullptr;

  // code rows of coded tile c (tokens [cA + 64c, ..) ∩ [.., cB)) into code buffer c & 1
  auto issue_codes = [&](int c) {
    const int j0 = cA + c * T::kTile, n = min(T::kTile, cB - j0);
    const uint32_t dk = s_base + T::kCodeOff + (c & 1) * T::kCodeBuf, dv = dk + T::kTile * T::kKRow;
    const uint8_t* srck = kcodes + int64_t(j0) * p.k_row_stride;
    const uint8_t* srcv = vcodes + int64_t(j0) * p.v_row_stride;
    const int nk = n * T::kKRow, nv = n * T::kVRow;
    if (((reinterpret_cast<uintptr_t>(srck) | reinterpret_cast<uintptr_t>(srcv) | uintptr_t(nk) | uintptr_t(nv)) & 15) == 0) {
      for (int i = tid * 16; i < nk; i += T::kThreads * 16) cp_async16(dk + i, srck + i);
      for (int i = tid * 16; i < nv; i += T::kThreads * 16) cp_async16(dv + i, srcv + i);
    } else {
      for (int i = tid * 4; i < nk; i += T::kThreads * 4) cp_async4(dk + i, srck + i);
      for (int i = tid * 4; i < nv; i += T::kThreads * 4) cp_async4(dv + i, srcv + i);
    }
    cp_async_commit();
  };
  if (n_ct > 0) issue_codes(0);
  if (n_ct > 1) issue_codes(1);

  // coded tile c: its codes (code buffer c & 1) → fp16 K/V tiles in buffer c & 1
  auto dequant_tile = [&](int c) {
    const int n = min(T::kTile, cB - (cA + c * T::kTile));
    const unsigned char* ck = sCode + (c & 1) * T::kCodeBuf;
    const unsigned char* cv = ck + T::kTile * T::kKRow;
    auto dequant = [&](const unsigned char* codes, auto row_tag, auto subs_tag, auto bits_tag, auto sub_tag,
                       auto copies_tag, const __half* cb, __half* dst) {
      constexpr int kRow = decltype(row_tag)::value, kSubs = decltype(subs_tag)::value;
      constexpr int kB = decltype(bits_tag)::value, kS = decltype(sub_tag)::value;
      constexpr int kR = decltype(copies_tag)::value;
      const __half* const cbl = cb + (lane & (kR - 1)) * kS;  // this lane's copy
#pragma unroll 8
      for (int idx = tid; idx < T::kTile * kSubs; idx += T::kThreads) {
        const int tok = idx / kSubs, sv = idx % kSubs;
        uint32_t c = 0;
        if (tok < n) {
          if constexpr (kB == 8) {
            c = codes[tok * kRow + sv];
          } else {
            const int bit = sv * kB;
            const uint32_t* w = reinterpret_cast<const uint32_t*>(codes + tok * kRow) + (bit >> 5);
            const uint64_t x = uint64_t(w[0]) | (uint64_t(w[1]) << 32);
            c = uint32_t(x >> (bit & 31)) & ((1u << kB) - 1u);
          }
        }
        __half* out = dst + tok * T::kStride + sv * kS;
        if constexpr (kS == 4) {
          *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(cbl + c * (kR * 4));
        } else {
          *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(cbl + c * (kR * 8));
        }
      }
    };
    dequant(ck, std::integral_constant<int, T::kKRow>{}, std::integral_constant<int, T::kKSubs>{},
            std::integral_constant<int, KB>{}, std::integral_constant<int, KS>{}, std::integral_constant<int, T::kRK>{},
            sKcb, k_tile(c & 1));
    dequant(cv, std::integral_constant<int, T::kVRow>{}, std::integral_constant<int, T::kVSubs>{},
            std::integral_constant<int, VB>{}, std::integral_constant<int, VS>{}, std::integral_constant<int, T::kRV>{},
            sVcb, v_tile(c & 1));
  };

  // window tile w (tokens [wA + 64w, ..) ∩ [.., wB)) → K/V buffer `buf` by cp.async (tokens past
  // the end: zeros, a finite filler); fix_window_tile turns bf16 rows to fp16 in place after
  // they land, each thread the 16-byte pieces it issued itself
  const uint16_t* const kwin = static_cast<const uint16_t*>(p.k_win) + bh * p.win_cap * D;
  const uint16_t* const vwin = static_cast<const uint16_t*>(p.v_win) + bh * p.win_cap * D;
  auto issue_window = [&](int w, int buf) {
    const int j0 = wA + w * T::kTile;
    issue_row_tile<D, T::kStride, T::kTile, T::kThreads>(p, kwin, vwin, j0, min(T::kTile, wB - j0), k_tile(buf),
                                                         v_tile(buf), tid);
  };
  auto fix_window_tile = [&](int w, int buf) {
    fix_bf16_row_tile<D, T::kStride, T::kThreads>(min(T::kTile, wB - (wA + w * T::kTile)), k_tile(buf), v_tile(buf), tid);
  };

  // ---- codebooks as true fp16 centroids, kRK / kRV interleaved copies ------------------------
  if (has_code) {
    const float kmul = kfmt == 0 ? 1.0f : p.k_cb_qmul, vmul = vfmt == 0 ? 1.0f : p.v_cb_omul;
    for (int i = tid; i < T::kNK * KS * T::kRK; i += T::kThreads) {
      const int e = i / (KS * T::kRK), j = i % KS;  // entry e, element j (copy (i / KS) mod kRK)
      sKcb[i] = __float2half_rn(cb_elem(p.k_cb16, p.k_cb8, kfmt, kmul, e * KS + j));
    }
    for (int i = tid; i < T::kNV * VS * T::kRV; i += T::kThreads) {
      const int e = i / (VS * T::kRV), j = i % VS;
      sVcb[i] = __float2half_rn(cb_elem(p.v_cb16, p.v_cb8, vfmt, vmul, e * VS + j));
    }
  }

  // ---- queries as A fragments: rows g / g + 8 of this warp's 16, dims 16·kk + 2·t4 (+ 8) ------
  // q̃ = (q ⊙ λ)·H (· scale·log2 e) for coded tokens, staged in buffer 1's K tile and read by
  // ldmatrix; raw q (· the same) for window tokens, read straight from global memory.
  uint32_t qa[D / 16][4];
  auto load_qa_raw = [&]() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int gr = row0 + warp * 16 + g + 8 * r;
      const bool live = gr < rows_total;
      const int qi = live ? gr / G : 0, h = kvh * G + (live ? gr % G : 0);
      const int64_t qb = b * p.q.stride[0] + h * p.q.stride[1] + qi * p.q.stride[2];
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int d = kk * 16 + hi * 8 + 2 * t4;
          const float x0 = live ? load_f(p.q.data, p.q.dtype, qb + d * p.q.stride[3]) : 0.0f;
          const float x1 = live ? load_f(p.q.data, p.q.dtype, qb + (d + 1) * p.q.stride[3]) : 0.0f;
          qa[kk][r + 2 * hi] = pack_half2(x0 * p.scale_log2, x1 * p.scale_log2);
        }
    }
  };
  if (has_code) {
    constexpr int kQE = D / 32;
    const float qscale = (p.use_hadamard ? p.hadamard_scale : 1.0f) * p.scale_log2;
    __half* const sQ = k_tile(1);
    for (int k = 0; k < 16; ++k) {
      const int r = warp * 16 + k, gr = row0 + r;
      const bool live = gr < rows_total;
      const int qi = live ? gr / G : 0, h = kvh * G + (live ? gr % G : 0);
      float y[kQE];
#pragma unroll
      for (int j = 0; j < kQE; ++j) {
        const int d = lane * kQE + j;
        const float x = live ? load_f(p.q.data, p.q.dtype,
                                      b * p.q.stride[0] + h * p.q.stride[1] + qi * p.q.stride[2] + d * p.q.stride[3])
                             : 0.0f;
        y[j] = x * (p.lambda ? p.lambda[kvh * D + d] : 1.0f);
      }
      if (p.use_hadamard) warp_fwht_row(y, lane);
#pragma unroll
      for (int j = 0; j < kQE; ++j) sQ[r * T::kStride + lane * kQE + j] = __float2half_rn(y[j] * qscale);
    }
  } else if (n_wt > 0) {
    issue_window(0, 0);
    load_qa_raw();
  }
  if (n_ct > 1) {
    cp_async_wait<1>();  // tile 0's codes (this thread's part)
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();  // q̃, the codebooks and tile 0's codes are in place
  if (has_code) {
    // lane 8m + i addresses row (m & 1)·8 + i, dims 16·kk + (m >> 1)·8
    const int m = lane >> 3, i = lane & 7;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ldsm_x4(s_base + T::kBufBytes + uint32_t(((warp * 16 + (m & 1) * 8 + i) * T::kStride + kk * 16 + (m >> 1) * 8) * 2),
              qa[kk]);
    dequant_tile(0);  // into buffer 0, while buffer 1 still holds q̃
  }

  // ---- online softmax state: rows g (index 0) and g + 8 (index 1) of this warp ---------------
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
  int lo_r[2], hi_r[2];
  bounds(row0 + warp * 16 + g, lo_r[0], hi_r[0]);
  bounds(row0 + warp * 16 + g + 8, lo_r[1], hi_r[1]);
  const int m8 = lane >> 3, r8 = lane & 7;
  // lane offsets (bytes) of the B fragments: K non-transposed (tokens (m >> 1)·8 + i, dims
  // (m & 1)·8), V transposed (tokens (m & 1)·8 + i, dims (m >> 1)·8)
  const uint32_t koff = uint32_t((((m8 >> 1) * 8 + r8) * T::kStride + (m8 & 1) * 8) * 2);
  const uint32_t voff = uint32_t((((m8 & 1) * 8 + r8) * T::kStride + (m8 >> 1) * 8) * 2);

  // one tile of tokens [j0, j0 + 64) in buffer buf (tokens at or past `end` hold finite filler)
  auto run_tile = [&](int buf, int j0, int end) {
    const uint32_t kbase = s_base + uint32_t(buf * T::kBufBytes), vbase = kbase + uint32_t(T::kTileBytes);
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    {
      // S = q̃·Kᵀ: k-step kk's four fragments (tokens 16·np .., dims 16·kk ..) loaded a step ahead
      uint32_t kf[2][4][4];
#pragma unroll
      for (int np = 0; np < 4; ++np) ldsm_x4(kbase + koff + uint32_t(np * 16 * T::kStride * 2), kf[0][np]);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        if (kk + 1 < D / 16)
#pragma unroll
          for (int np = 0; np < 4; ++np)
            ldsm_x4(kbase + koff + uint32_t((np * 16 * T::kStride + (kk + 1) * 16) * 2), kf[(kk + 1) & 1][np]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          const uint32_t* f = kf[kk & 1][np];
          mma_f16(s[2 * np], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], f[0], f[1]);
          mma_f16(s[2 * np + 1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], f[2], f[3]);
        }
      }
    }
    const bool full = j0 >= lo_max && j0 + T::kTile <= hi_min && j0 + T::kTile <= end;
    if (!full) mask_tile<8>(s, j0, end, t4, lo_r, hi_r);
    float alpha[2];
    softmax_tile<8>(s, mrow, lrow, alpha);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    {
      // O += P·V: step (kk, dp) = tokens 16·kk .., dims 16·dp .., fragments loaded a step ahead
      constexpr int kDP = D / 16, kSteps = 4 * kDP;
      uint32_t vf[2][4];
      ldsm_x4_t(vbase + voff, vf[0]);
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const int kk = st / kDP, dp = st % kDP;
        if (st + 1 < kSteps) {
          const int kn = (st + 1) / kDP, dn = (st + 1) % kDP;
          ldsm_x4_t(vbase + voff + uint32_t((kn * 16 * T::kStride + dn * 16) * 2), vf[(st + 1) & 1]);
        }
        const uint32_t a0 = pack_half2(s[2 * kk][0], s[2 * kk][1]), a1 = pack_half2(s[2 * kk][2], s[2 * kk][3]);
        const uint32_t a2 = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                       a3 = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        mma_f16(o[2 * dp], a0, a1, a2, a3, vf[st & 1][0], vf[st & 1][1]);
        mma_f16(o[2 * dp + 1], a0, a1, a2, a3, vf[st & 1][2], vf[st & 1][3]);
      }
    }
  };

  // ---- the pipeline: coded tiles [0, n_ct), then window tiles [n_ct, n_tiles) --------------
  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<0>();  // what this thread issued during tile t - 1: tile t's rows, tile t + 1's codes
    if (t >= n_ct && p.win_bf16) fix_window_tile(t - n_ct, t & 1);
    __syncthreads();  // tile t in buffer t & 1 for every warp; everyone is done with tile t - 1
    const int u = t + 1;
    if (u < n_ct) {
      if (u + 1 < n_ct) issue_codes(u + 1);  // into the code buffer tile t - 1's codes held
      dequant_tile(u);
    } else if (u < n_tiles) {
      issue_window(u - n_ct, u & 1);
    }
    if (t == n_ct && n_ct > 0) load_qa_raw();  // the first window tile after coded ones
    if (t < n_ct) {
      run_tile(t & 1, cA + t * T::kTile, cB);
    } else {
      run_tile(t & 1, wA + (t - n_ct) * T::kTile, wB);
    }
  }

  // ---- outputs: O / l per row -----------------------------------------------------------------
  const int gr[2] = {row0 + warp * 16 + g, row0 + warp * 16 + g + 8};
  store_tile_rows<D>(p, o, lrow, gr, rows_total, G, kvh, b, t4);
}

}  // namespace veloxquant::cuda
