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
// block serves 64 rows: it dequantizes a tile of 64 tokens into fp16 K/V tiles in shared
// memory once (codes staged by cp.async one tile ahead, centroids from a shared-memory copy of
// the codebooks; window rows loaded as they are), and its four warps (16 rows each) run the
// tile on fp16 tensor cores through ldmatrix (each k-step's fragments loaded one step ahead),
// with an fp32 online softmax (scores in log2 units) held in registers; two blocks share a
// multiprocessor. Measured (run 118): over exact rows (the fp16 cache, Standard caches)
// 1.5-2.3x faster than the decode kernel's row chunks, so it serves those by default; over
// codes 0.70-0.95x of them on three of four shapes, so coded caches keep the row chunks
// (kPrefillAlways runs it there too). A version with producer and consumer warps (one block
// per multiprocessor, named barriers, run 117) was slower over codes than the first version
// (run 116), which loaded each k-step's fragments just before its MMAs.
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

namespace veloxquant::cuda {

template <int D, int KS, int KB, int VS, int VB>
struct PrefillTraits {
  static_assert(D == 64 || D == 128, "prefill kernel: head_dim 64 or 128");
  static_assert((KS == 4 || KS == 8) && (VS == 4 || VS == 8), "sub_dim 4 or 8");
  static_assert(KB >= 1 && KB <= 16 && VB >= 1 && VB <= 16, "code bits 1..16");
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kWarps;  // query rows per block
  static constexpr int kTile = 64;           // tokens per tile
  static constexpr int kStride = D + 8;      // halves per shared row (odd multiple of 16 bytes: ldmatrix conflict-free)
  static constexpr int kKSubs = D / KS, kVSubs = D / VS;
  static constexpr int kKRow = ((kKSubs * KB + 7) / 8 + 3) / 4 * 4, kVRow = ((kVSubs * VB + 7) / 8 + 3) / 4 * 4;
  static constexpr int kNK = 1 << KB, kNV = 1 << VB;
  // shared memory (bytes): raw q, the K tile (q̃ staged there first), the V tile, two code
  // buffers (+16 bytes: a straddling code reads one word past a row), the codebooks
  static constexpr int kTileBytes = kTile * kStride * 2;
  static constexpr int kQrOff = 0, kKOff = kQrOff + kRows * kStride * 2, kVOff = kKOff + kTileBytes;
  static constexpr int kCodeBuf = kTile * (kKRow + kVRow);
  static constexpr int kCodeOff = kVOff + kTileBytes;
  static constexpr int kKcbOff = (kCodeOff + 2 * kCodeBuf + 16 + 15) / 16 * 16;
  static constexpr int kVcbOff = kKcbOff + kNK * KS * 2;
  static constexpr int kSmem = (kVcbOff + kNV * VS * 2 + 15) / 16 * 16;
};

namespace prefill_detail {

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

/// One block: 64 query rows (blockIdx.x) of kv head blockIdx.y of sequence blockIdx.z.
/// kfmt / vfmt: the key / value codebooks' formats (prefill_detail::cb_elem).
template <int D, int KS, int KB, int VS, int VB>
__global__ void __launch_bounds__(128, 2) vq_prefill_kernel(const AttnParams p, int kfmt, int vfmt) {
  using T = PrefillTraits<D, KS, KB, VS, VB>;
  using namespace prefill_detail;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int G = p.n_heads / p.n_kv_heads;
  const int rows_total = G * p.q_len, row0 = blockIdx.x * T::kRows;
  const int64_t bh = int64_t(b) * p.n_kv_heads + kvh;
  const uint32_t s_base = uint32_t(__cvta_generic_to_shared(smem));
  __half* const sQr = reinterpret_cast<__half*>(smem + T::kQrOff);
  __half* const sK = reinterpret_cast<__half*>(smem + T::kKOff);
  __half* const sV = reinterpret_cast<__half*>(smem + T::kVOff);
  unsigned char* const sCode = smem + T::kCodeOff;
  __half* const sKcb = reinterpret_cast<__half*>(smem + T::kKcbOff);
  __half* const sVcb = reinterpret_cast<__half*>(smem + T::kVcbOff);

  // ---- lengths and this block's visible tokens ----------------------------------------------
  const int L = p.seq_len[b] + p.n_new;
  int rc = p.win_all ? L : min(p.residual_length, (p.res_count ? p.res_count[b] : 0) + p.n_new);
  rc = max(0, min(rc, L));
  const int n_code = L - rc;
  auto bounds = [&](int gr, int& lo, int& hi) {  // visible [lo, hi) of block-row gr (dead rows: all)
    if (gr < rows_total) {
      attn_query_bounds(p, L - p.q_tail + gr / G, L, lo, hi);
    } else {
      lo = 0, hi = L;
    }
  };
  const int last_row = min(row0 + T::kRows, rows_total) - 1;
  int lo_u, hi_min, lo_max, hi_u;
  bounds(row0, lo_u, hi_min);  // a row's bounds never decrease with the row
  bounds(last_row, lo_max, hi_u);
  const int cA = max(lo_u, 0), cB = min(hi_u, n_code);
  const int wA = max(lo_u, n_code), wB = min(hi_u, L);
  const bool has_code = cB > cA && p.k_codes != nullptr;
  const uint8_t* const kcodes = has_code ? p.k_codes + bh * p.code_cap * p.k_row_stride : nullptr;
  const uint8_t* const vcodes = has_code ? p.v_codes + bh * p.code_cap * p.v_row_stride : nullptr;

  // code rows of tile [j0, j0 + 64) ∩ [.., cB) into code buffer `buf` (rows contiguous per head)
  auto issue_codes = [&](int j0, int buf) {
    const int n = min(T::kTile, cB - j0);
    const uint32_t dk = s_base + T::kCodeOff + buf * T::kCodeBuf, dv = dk + T::kTile * T::kKRow;
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
  if (has_code) issue_codes(cA, 0);

  // ---- codebooks as true fp16 centroids ------------------------------------------------------
  if (has_code) {
    const float kmul = kfmt == 0 ? 1.0f : p.k_cb_qmul, vmul = vfmt == 0 ? 1.0f : p.v_cb_omul;
    for (int i = tid; i < T::kNK * KS; i += T::kThreads)
      sKcb[i] = __float2half_rn(cb_elem(p.k_cb16, p.k_cb8, kfmt, kmul, i));
    for (int i = tid; i < T::kNV * VS; i += T::kThreads)
      sVcb[i] = __float2half_rn(cb_elem(p.v_cb16, p.v_cb8, vfmt, vmul, i));
  }

  // ---- queries: raw q (· scale·log2 e) into sQr, q̃ = (q ⊙ λ)·H (· the same) staged in sK ----
  {
    constexpr int kQE = D / 32;
    const float qscale = (p.use_hadamard ? p.hadamard_scale : 1.0f) * p.scale_log2;
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
        sQr[r * T::kStride + d] = __float2half_rn(x * p.scale_log2);
        y[j] = x * (p.lambda ? p.lambda[kvh * D + d] : 1.0f);
      }
      if (p.use_hadamard) warp_fwht_row(y, lane);
#pragma unroll
      for (int j = 0; j < kQE; ++j) sK[r * T::kStride + lane * kQE + j] = __float2half_rn(y[j] * qscale);
    }
  }
  __syncthreads();
  // this warp's 16 rows as A fragments (rows (m & 1)·8 + i, dims 16·kk + (m >> 1)·8 for lane 8m + i)
  uint32_t qa[D / 16][4];
  auto load_qa = [&](uint32_t base) {
    const int m = lane >> 3, i = lane & 7;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ldsm_x4(base + uint32_t(((warp * 16 + (m & 1) * 8 + i) * T::kStride + kk * 16 + (m >> 1) * 8) * 2), qa[kk]);
  };
  load_qa(s_base + T::kKOff);
  __syncthreads();  // sK is the first tile's from here on

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

  // one tile of tokens [j0, j0 + 64) in sK / sV (tokens at or past `end` hold finite filler)
  auto run_tile = [&](int j0, int end) {
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    {
      // S = q̃·Kᵀ: k-step kk's four fragments (tokens 16·np .., dims 16·kk ..) loaded a step ahead
      uint32_t kf[2][4][4];
#pragma unroll
      for (int np = 0; np < 4; ++np) ldsm_x4(s_base + T::kKOff + koff + uint32_t(np * 16 * T::kStride * 2), kf[0][np]);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        if (kk + 1 < D / 16)
#pragma unroll
          for (int np = 0; np < 4; ++np)
            ldsm_x4(s_base + T::kKOff + koff + uint32_t((np * 16 * T::kStride + (kk + 1) * 16) * 2), kf[(kk + 1) & 1][np]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          const uint32_t* f = kf[kk & 1][np];
          mma_f16(s[2 * np], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], f[0], f[1]);
          mma_f16(s[2 * np + 1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], f[2], f[3]);
        }
      }
    }
    const bool full = j0 >= lo_max && j0 + T::kTile <= hi_min && j0 + T::kTile <= end;
    if (!full) {
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = j0 + n * 8 + 2 * t + (e & 1), r = e >> 1;
          if (!(j < end && j >= lo_r[r] && j < hi_r[r])) s[n][e] = -INFINITY;
        }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mnew = fmaxf(mrow[r], mx);
      const float base = mnew == -INFINITY ? 0.0f : mnew;
      alpha[r] = ex2(mrow[r] - base);  // ex2(-inf) = 0
      mrow[r] = mnew;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        s[n][2 * r] = ex2(s[n][2 * r] - base);
        s[n][2 * r + 1] = ex2(s[n][2 * r + 1] - base);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      lrow[r] = lrow[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    {
      // O += P·V: step (kk, dp) = tokens 16·kk .., dims 16·dp .., fragments loaded a step ahead
      constexpr int kDP = D / 16, kSteps = 4 * kDP;
      uint32_t vf[2][4];
      ldsm_x4_t(s_base + T::kVOff + voff, vf[0]);
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const int kk = st / kDP, dp = st % kDP;
        if (st + 1 < kSteps) {
          const int kn = (st + 1) / kDP, dn = (st + 1) % kDP;
          ldsm_x4_t(s_base + T::kVOff + voff + uint32_t((kn * 16 * T::kStride + dn * 16) * 2), vf[(st + 1) & 1]);
        }
        const uint32_t a0 = pack_half2(s[2 * kk][0], s[2 * kk][1]), a1 = pack_half2(s[2 * kk][2], s[2 * kk][3]);
        const uint32_t a2 = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                       a3 = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        mma_f16(o[2 * dp], a0, a1, a2, a3, vf[st & 1][0], vf[st & 1][1]);
        mma_f16(o[2 * dp + 1], a0, a1, a2, a3, vf[st & 1][2], vf[st & 1][3]);
      }
    }
  };

  // ---- coded tokens: codes one tile ahead, dequantized into sK / sV --------------------------
  if (has_code) {
    int buf = 0;
    for (int j0 = cA; j0 < cB; j0 += T::kTile, buf ^= 1) {
      if (j0 + T::kTile < cB) {
        issue_codes(j0 + T::kTile, buf ^ 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // this tile's codes landed; the previous tile's MMAs are done with sK / sV
      const int n = min(T::kTile, cB - j0);
      const unsigned char* ck = sCode + buf * T::kCodeBuf;
      const unsigned char* cv = ck + T::kTile * T::kKRow;
      auto dequant = [&](const unsigned char* codes, auto row_tag, auto subs_tag, auto bits_tag, auto sub_tag,
                         const __half* cb, __half* dst) {
        constexpr int kRow = decltype(row_tag)::value, kSubs = decltype(subs_tag)::value;
        constexpr int kB = decltype(bits_tag)::value, kS = decltype(sub_tag)::value;
#pragma unroll 8
        for (int idx = tid; idx < T::kTile * kSubs; idx += T::kThreads) {
          const int tok = idx / kSubs, sv = idx % kSubs;
          uint32_t c = 0;
          if (tok < n) {
            const int bit = sv * kB;
            const uint32_t* w = reinterpret_cast<const uint32_t*>(codes + tok * kRow) + (bit >> 5);
            const uint64_t x = uint64_t(w[0]) | (uint64_t(w[1]) << 32);
            c = uint32_t(x >> (bit & 31)) & ((1u << kB) - 1u);
          }
          __half* out = dst + tok * T::kStride + sv * kS;
          if constexpr (kS == 4) {
            *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(cb + c * 4);
          } else {
            *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(cb + c * 8);
          }
        }
      };
      dequant(ck, std::integral_constant<int, T::kKRow>{}, std::integral_constant<int, T::kKSubs>{},
              std::integral_constant<int, KB>{}, std::integral_constant<int, KS>{}, sKcb, sK);
      dequant(cv, std::integral_constant<int, T::kVRow>{}, std::integral_constant<int, T::kVSubs>{},
              std::integral_constant<int, VB>{}, std::integral_constant<int, VS>{}, sVcb, sV);
      __syncthreads();
      run_tile(j0, cB);
    }
  }

  // ---- exact window tokens: raw q against the stored rows (fp16, or bf16 read as fp16) -------
  if (wB > wA) {
    load_qa(s_base + T::kQrOff);
    const uint16_t* kwin = static_cast<const uint16_t*>(p.k_win) + bh * p.win_cap * D;
    const uint16_t* vwin = static_cast<const uint16_t*>(p.v_win) + bh * p.win_cap * D;
    constexpr int kChunks = D / 8;  // 16-byte pieces per row
    for (int j0 = wA; j0 < wB; j0 += T::kTile) {
      __syncthreads();  // the previous tile's MMAs are done with sK / sV
      const int n = min(T::kTile, wB - j0);
#pragma unroll 8
      for (int idx = tid; idx < T::kTile * kChunks; idx += T::kThreads) {
        const int tok = idx / kChunks, ch = idx % kChunks;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
        if (tok < n) {
          const int pos = j0 + tok;
          const int64_t slot = p.win_ring ? int64_t(pos % p.win_cap) : int64_t(pos);
          kv = *reinterpret_cast<const uint4*>(kwin + slot * D + ch * 8);
          vv = *reinterpret_cast<const uint4*>(vwin + slot * D + ch * 8);
          if (p.win_bf16) {
            kv.x = bf16x2_to_f16x2(kv.x), kv.y = bf16x2_to_f16x2(kv.y), kv.z = bf16x2_to_f16x2(kv.z),
            kv.w = bf16x2_to_f16x2(kv.w);
            vv.x = bf16x2_to_f16x2(vv.x), vv.y = bf16x2_to_f16x2(vv.y), vv.z = bf16x2_to_f16x2(vv.z),
            vv.w = bf16x2_to_f16x2(vv.w);
          }
        }
        *reinterpret_cast<uint4*>(sK + tok * T::kStride + ch * 8) = kv;
        *reinterpret_cast<uint4*>(sV + tok * T::kStride + ch * 8) = vv;
      }
      __syncthreads();
      run_tile(j0, wB);
    }
  }

  // ---- outputs: O / l per row -----------------------------------------------------------------
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int gr = row0 + warp * 16 + g + 8 * r;
    if (gr >= rows_total) continue;
    const int qi = gr / G, h = kvh * G + gr % G;
    const float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
    const int64_t ob = b * p.out_stride[0] + h * p.out_stride[1] + qi * p.out_stride[2];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        store_f(p.out, p.out_dtype, ob + (n * 8 + 2 * t + e) * p.out_stride[3], o[n][2 * r + e] * inv);
  }
}

}  // namespace veloxquant::cuda
