// src/cuda/attention_any_dim_kernel.cuh — fused attention on the codes at the head dims that have no
// tuned kernel (kAnyHeadDims: 80, 96, 112, 160 and 192: Phi-2/StableLM-3B, Phi-3, MPT-30B,
// StableLM-2-12B), every codebook configuration and format, in the plain form: the same launch
// contract as vq_attn_kernel (AttnParams: splits merged by log-sum-exp, row chunks, the exact
// window as ring or linear rows, the fp16 cache's window-only launches, causal and sliding-window
// masks, per-sequence lengths, the decode step's length advance and input gate), so every cache
// path above it (decode steps and their CUDA graphs, eager calls, prefill chunks as row chunks,
// the Standard and Stash modes, the fp16 cache) runs unchanged at these head dims.
//
// What it computes, per (batch b, kv head h, chunk of query rows) and split s: the online-softmax
// partial of out[row] = Σ_j softmax_j(scale · q̃_row · K̃_j) V̂_j over the split's share of the
// coded tokens (q̃ = (q ⊙ λ)·H, H the block-diagonal Walsh–Hadamard rotation of hadamard.h, K̃_j
// the key centroids of token j's codes) and of the exact window (raw q against the stored rows).
// With int8 key centroids (CodebookFormat I8, I8KV) q̃ is rounded per row to the two-int8 form the
// tuned kernels score with (vecinfer_attention_ref's int8_query), so a cache answers the same at
// every head dim.
//
// Shape, and why. The tuned kernels gather centroids straight into tensor-core fragments, a
// layout built on head dims of 32·2^k; this one is the reference-first form, kept simple:
//  * 256 threads a block; the codebooks decoded once into shared memory as fp16 (int8 and E4M3
//    entries times their scale), so the loop is the same for every format. A codebook of at most
//    256 entries is held once per lane of a shared-memory wavefront (16 copies of a d4 codebook,
//    8 of a d8 one, 32 KB either way; AttnParams::plain_cb_rep) with copy l in banks of its own,
//    so the random centroid gathers of the score and value phases never conflict (run 187's
//    profile found the kernel bound by shared-memory wavefronts; the copies gained 5-8%, run 188).
//  * Tiles of 256 tokens, their code rows staged into shared memory by cp.async one tile ahead
//    (run 185's first version read them through L1, a thread a row, and was latency-bound:
//    0.55x of the fp16 peer). Scores: a thread a token, each key centroid dotted with every live
//    row's q̃ (shared-memory broadcasts). The value phase reads the value codes from the staged
//    rows.
//  * Softmax, fp32 in log2 units, without a pass of its own (run 190; before it a warp a row
//    made a pass over the tile's scores while the other warps waited at the barrier: at one live
//    row, Phi-2 and Phi-3's decode, seven warps of eight): each thread keeps its token's scores,
//    the tile's row maxima come from warp shuffles and the warps' maxima, each thread writes its
//    token's probabilities (token-major, so the value phase reads a token's rows in one vector
//    load) and keeps running sums of its own, combined once at the end.
//  * Values: a thread owns one value sub-vector (VS dims) of up to 32 / VS rows and every K-th
//    token of the tile; its fp32 accumulators are summed over the K token lanes once, at the end.
//  * The value partials are summed over the token lanes in shared memory that the tiles no
#pragma once

#include <cuda_fp8.h>

#include "cuda/attention_any_dim.cuh"
#include "cuda/attention_kernel.cuh"
#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"

namespace veloxquant::cuda::any_dim {

/// Code m of a packed row (pq.h: LSB-first, `bits` bits a code) staged in shared memory.
__device__ __forceinline__ uint32_t any_code(const uint32_t* row, int m, int bits) {
  const int bit = m * bits;
  const uint32_t* w = row + (bit >> 5);
  const int o = bit & 31;
  const uint32_t lo = w[0];
  const uint32_t hi = (o + bits > 32) ? w[1] : 0u;
  return __funnelshift_r(lo, hi, o) & ((1u << bits) - 1u);
}

/// N fp16 values (N = 4 or 8, 8- or 16-byte aligned) from shared memory as floats, one load.
template <int N>
__device__ __forceinline__ void any_halves(const __half* p, float (&v)[N]) {
  static_assert(N == 4 || N == 8, "a d4 or d8 centroid");
  uint32_t w[N / 2];
  lds_entry<2 * N>(reinterpret_cast<const unsigned char*>(p), w);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

/// Entry c of an fp16 codebook in shared memory of sub_dim N: copy (lane mod 64 / N) of a
/// replicated one (kAnyRepKeys / kAnyRepValues), else the one copy.
template <int N>
__device__ __forceinline__ const __half* any_entry(const __half* cb, uint32_t c, bool rep, int lane) {
  return rep ? cb + c * 64u + uint32_t(lane & (64 / N - 1)) * N : cb + c * N;
}

/// N consecutive floats of shared memory (N = 1, 4, 8; 16-byte aligned where N > 1) to and from
/// registers in as few instructions as their alignment allows.
template <int N>
__device__ __forceinline__ void any_load_rows(const float* p, float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(p + i);
      v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = p[i];
  }
}
template <int N>
__device__ __forceinline__ void any_store_rows(float* p, const float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) *reinterpret_cast<float4*>(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = v[i];
  }
}

/// N 16-bit window values (fp16 or bf16; N = 4 or 8, 8- or 16-byte aligned) from global memory.
template <int N>
__device__ __forceinline__ void any_row16(const uint16_t* p, int bf16, float (&v)[N]) {
  uint32_t w[N / 2];
  ldg_words(p, w);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    v[2 * i] = store16_to_f(uint16_t(w[i] & 0xFFFFu), bf16);
    v[2 * i + 1] = store16_to_f(uint16_t(w[i] >> 16), bf16);
  }
}

/// Queues the copy of `bytes` bytes (a multiple of 4) from global `src` to shared `dst`
/// (16-byte aligned) with cp.async: 16-byte pieces where src and the size allow, else 4-byte.
__device__ __forceinline__ void any_stage(const uint8_t* src, unsigned char* dst, int bytes, int tid) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  if (((reinterpret_cast<uintptr_t>(src) | uintptr_t(bytes)) & 15) == 0) {
    for (int i = tid; i < bytes / 16; i += kAnyThreads) cp_async16(d + 16u * uint32_t(i), src + 16 * i);
  } else {
    for (int i = tid; i < bytes / 4; i += kAnyThreads) cp_async4(d + 4u * uint32_t(i), src + 4 * i);
  }
}

/// Entry i of a codebook as a float, the scale folded in: fp16 (kind 0),
/// E4M3 (1) times mul, int8 (2) times mul, offset-binary int8 (3) times mul.
__device__ __forceinline__ float any_centroid(const void* cb, int kind, int64_t i, float mul) {
  if (kind == 0) return __half2float(static_cast<const __half*>(cb)[i]);
  const uint8_t byte = static_cast<const uint8_t*>(cb)[i];
  if (kind == 1) {
    const __nv_fp8_e4m3 f = *reinterpret_cast<const __nv_fp8_e4m3*>(&byte);
    return float(f) * mul;
  }
  if (kind == 2) return float(int8_t(byte)) * mul;
  return float(int(byte) - 128) * mul;
}

/// A codebook of 2^bits entries of sub_dim N decoded into fp16 shared memory (any_centroid's
/// kinds), in one copy or, replicated, in 64 / N (any_entry's layout).
template <int N>
__device__ __forceinline__ void any_fill_codebook(__half* dst, const void* src, int kind, int bits, float mul, bool rep,
                                                  int tid) {
  for (int i = tid; i < (N << bits); i += kAnyThreads) {
    const __half x = __float2half_rn(any_centroid(src, kind, i, mul));
    if (!rep) {
      dst[i] = x;
      continue;
    }
    const int c = i / N, e = i - c * N;
    for (int l = 0; l < 64 / N; ++l) dst[c * 64 + l * N + e] = x;
  }
}

template <int D, int KS, int VS, int NR>
__global__ void __launch_bounds__(kAnyThreads, 2) vq_attn_any_dim_kernel(const AttnParams p) {
  static_assert(D % 16 == 0 && D % KS == 0 && D % VS == 0 && D <= 256, "head_dim a multiple of 16 and the sub_dims");
  static_assert(NR <= kAnyMaxRows && kAnyThreads == 256, "eight warps: sW holds two float4s of warp maxima a row");
  constexpr int kB = D & -D;  // the Hadamard block (hadamard_block_size)
  constexpr int kNK = D / KS, kRPT = any_map(D, VS, NR).rpt;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kRows = p.rows_per_chunk;
  const int split = blockIdx.x, S = p.n_splits;
  const int kvh = int(blockIdx.y) / p.n_row_chunks, rchunk = int(blockIdx.y) - kvh * p.n_row_chunks;
  const int b = blockIdx.z;
  const int seg = (b * p.n_kv_heads + kvh) * p.n_row_chunks + rchunk;
  const int G = p.n_heads / p.n_kv_heads;
  const int rows_total = G * p.q_len;
  const int n_live = min(kRows, rows_total - rchunk * kRows);
  if (n_live > NR) __trap();  // attn_launch picks an instantiation of at least the chunk's live rows
  const bool codes = !p.win_all;
  const int KB = codes ? p.plain_key_bits : 0, VB = codes ? p.plain_value_bits : 0;
  const int rep = codes ? p.plain_cb_rep : 0;
  const bool krep = rep & kAnyRepKeys, vrep = rep & kAnyRepValues;
  const AnyLayout lay = any_layout(D, KS, KB, VS, VB, NR, codes, rep);
  const int krs = any_row_bytes(D, KS, max(KB, 1)), vrs = any_row_bytes(D, VS, max(VB, 1));
  constexpr AnyMap map = any_map(D, VS, NR);
  __half* const sKcb = reinterpret_cast<__half*>(smem + lay.kcb);
  __half* const sVcb = reinterpret_cast<__half*>(smem + lay.vcb);
  float* const sQt = reinterpret_cast<float*>(smem + lay.qt);
  float* const sQr = reinterpret_cast<float*>(smem + lay.qr);
  float* const sS = reinterpret_cast<float*>(smem + lay.s);
  // each warp's row maxima (then row sums) of a tile, sW[r * 8 + warp] (16-byte aligned: read as
  // two float4s a row), the running max per row in two buffers (tile j reads buffer j & 1 and
  // writes the other), the final sums
  float* const sW = reinterpret_cast<float*>(smem + lay.st);
  float* const sM2 = sW + (kAnyThreads / 32) * NR;
  float* const sL = sM2 + 2 * NR;
  float* const sRed = reinterpret_cast<float*>(smem + lay.red);
  __shared__ int sLast;

  // A decode step may launch this kernel as a programmatic dependent of its own kernel before
  // it (attn_launch's pdl): wait for it before anything is read.
  grid_dep_wait();

  // ---- codebooks, decoded into fp16 ------------------------------------------------------
  // Every format as a float times its scale (AttnParams: E4M3 entries c·s with k_cb_qmul =
  // 1/s_k and v_cb_omul = 1/s_v; int8 keys round(c/s_k) with k_cb_qmul = s_k; offset-binary
  // int8 values with v_cb_omul = s_v), rounded once to fp16.
  const int fmt = p.plain_cb_fmt;
  const int kkind = fmt == 0 ? 0 : fmt == 1 ? 1 : 2, vkind = fmt == 1 ? 1 : fmt == 3 ? 3 : 0;
  const bool int8_query = fmt == 2 || fmt == 3;
  if (codes) {
    const void* kc = kkind ? static_cast<const void*>(p.k_cb8) : static_cast<const void*>(p.k_cb16);
    const void* vc = vkind ? static_cast<const void*>(p.v_cb8) : static_cast<const void*>(p.v_cb16);
    const float kmul = kkind ? p.k_cb_qmul : 1.0f, vmul = vkind ? p.v_cb_omul : 1.0f;
    any_fill_codebook<KS>(sKcb, kc, kkind, KB, kmul, krep, tid);
    any_fill_codebook<VS>(sVcb, vc, vkind, VB, vmul, vrep, tid);
  }

  // ---- queries: raw q and q̃ = (q ⊙ λ)·H per live row ----------------------------------------
  for (int i = tid; i < NR * D; i += kAnyThreads) {
    const int r = i / D, d = i - r * D;
    float x = 0.0f;
    if (r < n_live) {
      const int gr = rchunk * kRows + r, qi = gr / G, h = kvh * G + (gr - qi * G);
      x = load_f(p.q.data, p.q.dtype, b * p.q.stride[0] + h * p.q.stride[1] + qi * p.q.stride[2] + d * p.q.stride[3]);
    }
    sQr[i] = x;
    sQt[i] = p.lambda ? x * p.lambda[kvh * D + d] : x;
  }
  if (tid < NR) sM2[tid] = -INFINITY;
  __syncthreads();
  if (codes) {
    for (int r = warp; r < n_live; r += kAnyThreads / 32) {
      float* y = sQt + r * D;
      if (p.use_hadamard) {
        for (int h = 1; h < kB; h <<= 1) {
          for (int j = lane; j < D / 2; j += 32) {
            const int i0 = (j / h) * 2 * h + (j % h);
            const float a = y[i0], c = y[i0 + h];
            y[i0] = a + c;
            y[i0 + h] = a - c;
          }
          __syncwarp();
        }
        for (int d = lane; d < D; d += 32) y[d] *= p.hadamard_scale;
        __syncwarp();
      }
      if (int8_query) {  // int8 keys: q̃ as two int8s, s·(hi + lo/254), s = max|q̃|/127 (the tuned kernels' rounding)
        float mx = 0.0f;
        for (int d = lane; d < D; d += 32) mx = fmaxf(mx, fabsf(y[d]));
        for (int m = 16; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
        const float inv = mx > 0.0f ? 127.0f / mx : 0.0f, sq = mx * (1.0f / 127.0f);
        for (int d = lane; d < D; d += 32) {
          const float x = y[d];
          const float hi = fminf(127.0f, fmaxf(-127.0f, rintf(x * inv)));
          const float lo = fminf(127.0f, fmaxf(-127.0f, rintf(__fmul_rn(__fsub_rn(x, __fmul_rn(hi, sq)), inv) * 254.0f)));
          y[d] = mx > 0.0f ? hi * sq + lo * (sq / 254.0f) : 0.0f;
        }
        __syncwarp();
      }
    }
  }

  __syncthreads();  // q̃ complete before any thread scores with it

  // ---- lengths, visibility, this block's share (vq_attn_kernel's arithmetic) -------------------
  const int L = p.seq_len[b] + p.n_new;
  int rc = p.win_all ? L : min(p.residual_length, (p.res_count ? p.res_count[b] : 0) + p.n_new);
  rc = max(0, min(rc, L));
  const int n_code = L - rc;
  auto row_bounds = [&](int r, int& lo, int& hi) {
    attn_query_bounds(p, L - p.q_tail + (rchunk * kRows + r) / G, L, lo, hi);
  };
  int lo_u = 0, hi_u = 0, dummy = 0;
  row_bounds(0, lo_u, dummy);
  row_bounds(n_live - 1, dummy, hi_u);
  const int cA = max(lo_u, 0), cB = min(hi_u, n_code);
  const int64_t Nc = max(0, cB - cA);
  const int wA = max(lo_u, n_code), wB = min(hi_u, L);
  const int64_t Nw = max(0, wB - wA);
  const int64_t ww = p.win_all ? 1 : p.window_weight;
  const int64_t units = Nc + ww * Nw;
  const int64_t chunk = ((units + S - 1) / S + 31) / 32 * 32;
  const int64_t u0 = min(units, int64_t(split) * chunk), u1 = min(units, u0 + chunk);
  const int c0 = cA + int(min(u0, Nc)), c1 = cA + int(min(u1, Nc));
  int w0 = 0, w1 = 0;
  if (u1 > Nc) {
    const int64_t r0 = (max(u0, Nc) - Nc + ww - 1) / ww;
    const int64_t r1 = min(Nw, (u1 - Nc + ww - 1) / ww);
    w0 = wA + int(r0), w1 = wA + int(max(r0, r1));
  }
  const int64_t bh = int64_t(b) * p.n_kv_heads + kvh;

  // ---- value-phase ownership ---------------------------------------------------------------
  const int vslot = tid % map.slots, vk = tid / map.slots;
  const bool vown = vk < map.k;
  const int vj = vslot % map.nvs, vrg = vslot / map.nvs;
  float o[kRPT][VS];
#pragma unroll
  for (int rr = 0; rr < kRPT; ++rr)
#pragma unroll
    for (int e = 0; e < VS; ++e) o[rr][e] = 0.0f;

  // A tile's code rows into shared memory (buffer `buf` of two), queued as one cp.async group:
  // the next tile's copies run while this one computes (one HBM round trip per tile, not one
  // per thread and sub-vector).
  auto stage = [&](int t0, int n, int buf) {
    any_stage(p.k_codes + (bh * p.code_cap + t0) * krs, smem + lay.kraw + buf * kAnyTile * krs, n * krs, tid);
    any_stage(p.v_codes + (bh * p.code_cap + t0) * vrs, smem + lay.vraw + buf * kAnyTile * vrs, n * vrs, tid);
    cp_async_commit();
  };

  // The online softmax without a pass of its own: each thread holds its token's scores, the
  // tile's row maxima come from warp shuffles and the eight warps' maxima in shared memory, each
  // thread turns its scores into probabilities and keeps its own running sums (lsum, combined
  // once at the end), and the running max, identical in every thread, lives in two buffers
  // (tile j reads sM2[(j & 1) * NR + r] and writes the other). Rows past n_live score -inf: p 0.
  float lsum[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) lsum[r] = 0.0f;
  int jt = 0;  // tiles so far

  // one tile: scores of tokens [t0, t0 + n) at positions t0.. (coded when `coded`, their rows in
  // buffer `buf`), probabilities, values
  auto tile = [&](int t0, int n, bool coded, int buf) {
    const float* const mcur = sM2 + (jt & 1) * NR;
    float* const mnext = sM2 + ((jt + 1) & 1) * NR;
    ++jt;
    // scores (log2 units), masked per row
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = -INFINITY;
    if (tid < n) {
      const int t = t0 + tid;
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
      if (coded) {
        const uint32_t* krow = reinterpret_cast<const uint32_t*>(smem + lay.kraw + (buf * kAnyTile + tid) * krs);
#pragma unroll 4
        for (int m = 0; m < kNK; ++m) {
          const uint32_t c = any_code(krow, m, KB);
          float cv[KS];
          any_halves<KS>(any_entry<KS>(sKcb, c, krep, lane), cv);
#pragma unroll
          for (int r = 0; r < NR; ++r) {
            const float* q = sQt + r * D + m * KS;
            float s = acc[r];
#pragma unroll
            for (int e = 0; e < KS; ++e) s = fmaf(q[e], cv[e], s);
            acc[r] = s;
          }
        }
      } else {
        const int64_t slot = p.win_ring ? t % p.win_cap : t;
        const uint16_t* krow = static_cast<const uint16_t*>(p.k_win) + (bh * p.win_cap + slot) * D;
        // the row's loads issued together (D / 8 16-byte loads in flight, not two); past head_dim
        // 128 in two halves, so a row holds at most 64 registers of raw words
        constexpr int kParts = D > 128 ? 2 : 1, kPart = D / 8 / kParts;
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
          uint4 raw[kPart];
#pragma unroll
          for (int k = 0; k < kPart; ++k) raw[k] = __ldg(reinterpret_cast<const uint4*>(krow) + part * kPart + k);
#pragma unroll
          for (int k = 0; k < kPart; ++k) {
            const int d0 = (part * kPart + k) * 8;
            const uint32_t ws[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
            float kv[8];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              kv[2 * e] = store16_to_f(uint16_t(ws[e] & 0xFFFFu), p.win_bf16);
              kv[2 * e + 1] = store16_to_f(uint16_t(ws[e] >> 16), p.win_bf16);
            }
#pragma unroll
            for (int r = 0; r < NR; ++r) {
              const float* q = sQr + r * D + d0;
              float s = acc[r];
#pragma unroll
              for (int e = 0; e < 8; ++e) s = fmaf(q[e], kv[e], s);
              acc[r] = s;
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < NR; ++r) {  // (unrolled: acc stays in registers)
        int lo = 0, hi = 0;
        if (r < n_live) row_bounds(r, lo, hi);
        acc[r] = (t >= lo && t < hi) ? acc[r] * p.scale_log2 : -INFINITY;
      }
    }
    // the tile's row maxima: over the warp, then over the eight warps
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      float mx = acc[r];
      for (int m = 16; m >= 1; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
      if (lane == 0) sW[r * 8 + warp] = mx;
    }
    __syncthreads();
    float pr[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const float4 w0 = *reinterpret_cast<const float4*>(sW + r * 8), w1 = *reinterpret_cast<const float4*>(sW + r * 8 + 4);
      const float m_old = mcur[r];
      const float m_new = fmaxf(fmaxf(fmaxf(fmaxf(m_old, w0.x), fmaxf(w0.y, w0.z)), fmaxf(w0.w, w1.x)),
                                fmaxf(fmaxf(w1.y, w1.z), w1.w));
      const float mu = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: every p is 0
      pr[r] = ex2(acc[r] - mu);
      lsum[r] = lsum[r] * ex2(m_old - mu) + pr[r];  // (m_old = -inf: the factor is 0, the old sum 0)
      if (tid == r) mnext[r] = m_new;
    }
    if (tid < n) any_store_rows<NR>(sS + tid * NR, pr);
    __syncthreads();
    // values
    if (vown) {
#pragma unroll
      for (int rr = 0; rr < kRPT; ++rr) {
        const int r = vrg * kRPT + rr;
        const float m_new = mnext[r];
        const float a = ex2(mcur[r] - (m_new == -INFINITY ? 0.0f : m_new));
#pragma unroll
        for (int e = 0; e < VS; ++e) o[rr][e] *= a;
      }
#pragma unroll 4
      for (int i = vk; i < n; i += map.k) {
        float cv[VS];
        if (coded) {
          const uint32_t* vrow = reinterpret_cast<const uint32_t*>(smem + lay.vraw + (buf * kAnyTile + i) * vrs);
          any_halves<VS>(any_entry<VS>(sVcb, any_code(vrow, vj, VB), vrep, lane), cv);
        } else {
          const int t = t0 + i;
          const int64_t slot = p.win_ring ? t % p.win_cap : t;
          any_row16<VS>(static_cast<const uint16_t*>(p.v_win) + (bh * p.win_cap + slot) * D + vj * VS, p.win_bf16, cv);
        }
        float pv[kRPT];
        any_load_rows<kRPT>(sS + i * NR + vrg * kRPT, pv);
#pragma unroll
        for (int rr = 0; rr < kRPT; ++rr)
#pragma unroll
          for (int e = 0; e < VS; ++e) o[rr][e] = fmaf(pv[rr], cv[e], o[rr][e]);
      }
    }
    __syncthreads();  // the next tile rewrites the scores (and its staging, the buffer before)
  };
  if (c1 > c0) stage(c0, min(kAnyTile, c1 - c0), 0);
  for (int t0 = c0, buf = 0; t0 < c1; t0 += kAnyTile, buf ^= 1) {
    const int t1 = t0 + kAnyTile;
    if (t1 < c1) {
      stage(t1, min(kAnyTile, c1 - t1), buf ^ 1);  // (buffer buf ^ 1 was last read by the tile before)
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of this tile have landed
    tile(t0, min(kAnyTile, c1 - t0), true, buf);
  }
  for (int t0 = w0; t0 < w1; t0 += kAnyTile) tile(t0, min(kAnyTile, w1 - t0), false, 0);

  // ---- the running sums combined (warp, then the eight warps), the final max ----------------
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    float l = lsum[r];
    for (int m = 16; m >= 1; m >>= 1) l += __shfl_xor_sync(0xffffffffu, l, m);
    if (lane == 0) sW[r * 8 + warp] = l;
  }
  __syncthreads();
  if (tid < NR) {
    float l = 0.0f;
    for (int w = 0; w < kAnyThreads / 32; ++w) l += sW[tid * 8 + w];
    sL[tid] = l;
  }
  const float* const sM = sM2 + (jt & 1) * NR;

  // ---- the value partials summed over the K token lanes ------------------------------------
  if (vown) {
#pragma unroll
    for (int rr = 0; rr < kRPT; ++rr) {
      const int r = vrg * kRPT + rr;
      if (r < NR)
#pragma unroll
        for (int e = 0; e < VS; ++e) sRed[(vk * NR + r) * D + vj * VS + e] = o[rr][e];
    }
  }
  __syncthreads();
  auto write_out = [&](int r, int d, float v) {
    const int gr = rchunk * kRows + r, qi = gr / G, h = kvh * G + (gr - qi * G);
    store_f(p.out, p.out_dtype, b * p.out_stride[0] + h * p.out_stride[1] + qi * p.out_stride[2] + d * p.out_stride[3],
            v);
  };
  bool seg_done = true;
  if (S == 1) {
    for (int i = tid; i < n_live * D; i += kAnyThreads) {
      const int r = i / D, d = i - r * D;
      float acc = 0.0f;
      for (int k = 0; k < map.k; ++k) acc += sRed[(k * NR + r) * D + d];
      write_out(r, d, sL[r] > 0.0f ? acc / sL[r] : 0.0f);
    }
  } else {
    const int64_t sbase = (int64_t(seg) * S + split) * kRows;
    for (int i = tid; i < n_live * D; i += kAnyThreads) {
      const int r = i / D, d = i - r * D;
      float acc = 0.0f;
      for (int k = 0; k < map.k; ++k) acc += sRed[(k * NR + r) * D + d];
      p.ws_o[(sbase + r) * D + d] = acc;
    }
    if (tid < n_live) {
      p.ws_ml[(sbase + tid) * 2] = sM[tid];
      p.ws_ml[(sbase + tid) * 2 + 1] = sL[tid];
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) sLast = atom_add_acq_rel_gpu(&p.counters[seg], 1) == S - 1;
    __syncthreads();
    seg_done = sLast != 0;
    if (seg_done) {
      __threadfence();
      const int64_t s0 = int64_t(seg) * S * kRows;
      for (int i = tid; i < n_live * D; i += kAnyThreads) {
        const int r = i / D, d = i - r * D;
        float M = -INFINITY;
        for (int s = 0; s < S; ++s) M = fmaxf(M, __ldcg(p.ws_ml + (s0 + int64_t(s) * kRows + r) * 2));
        const float Mu = M == -INFINITY ? 0.0f : M;
        float acc = 0.0f, lt = 0.0f;
        for (int s = 0; s < S; ++s) {
          const int64_t rs = s0 + int64_t(s) * kRows + r;
          const float f = ex2(__ldcg(p.ws_ml + rs * 2) - Mu);
          acc += __ldcg(p.ws_o + rs * D + d) * f;
          lt += __ldcg(p.ws_ml + rs * 2 + 1) * f;
        }
        write_out(r, d, lt > 0.0f ? acc / lt : 0.0f);
      }
      if (tid == 0) p.counters[seg] = 0;  // ready for the next launch (graph replays)
    }
  }

  // ---- decode step: the very last segment advances the lengths ------------------------------
  if (p.advance && seg_done && tid == 0) attn_advance_lengths(p);
}

template <int D, int KS, int VS>
const void* kernel_rows(int nr) {
  static_assert(sizeof(kAnyRowVariants) / sizeof(int) == 4, "the cases below follow kAnyRowVariants");
  switch (nr) {
    case 1: return reinterpret_cast<const void*>(&vq_attn_any_dim_kernel<D, KS, VS, 1>);
    case 4: return reinterpret_cast<const void*>(&vq_attn_any_dim_kernel<D, KS, VS, 4>);
    case 8: return reinterpret_cast<const void*>(&vq_attn_any_dim_kernel<D, KS, VS, 8>);
    default: return reinterpret_cast<const void*>(&vq_attn_any_dim_kernel<D, KS, VS, 16>);
  }
}

template <int D>
const void* kernel_for(int ks, int vs, int nr) {
  if (ks == 4) return vs == 4 ? kernel_rows<D, 4, 4>(nr) : kernel_rows<D, 4, 8>(nr);
  return vs == 4 ? kernel_rows<D, 8, 4>(nr) : kernel_rows<D, 8, 8>(nr);
}

}  // namespace veloxquant::cuda::any_dim
