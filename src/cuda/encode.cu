// src/cuda/encode.cu — the write path: fused encode of new tokens, window eviction and
// dequantization, fp16 row appends, length updates.
//
// Encode computes, for each new token-head (keys and values in separate blocks):
//   keys   k̃ = FWHT(k ⊙ 1/λ)·(1/sqrt(D))   (A's CPU transform, same butterflies and roundings)
//   code_m = argmin_c Σ_j (x_m[j] − C[c][j])²   over the f32 codebook, ties to the lowest index
// then bit-packs the codes (pq.h layout) straight into their rows, writes the exact rows of
// window tokens (ring or linear slots) and, in the Standard/Stash layouts, the dequantized
// rows K̂ = (FWHT(Ĉ)·scale) ⊙ λ of tokens that arrive already outside the window.
//
// Exactness. The nearest centroid must agree with the CPU oracle (pq_sub_distance_ref). A
// fast score a_c = ||c||² − 2x·c (d FMAs) ranks the codebook; a proven bound, as in the CPU
// search (src/cpu/pq_nearest.cpp), limits the candidates to those within
// 8(2d+5)·u·R² of the best (R = ||x|| + max||c||, u = 2^-24), and the candidates are
// re-ranked with the oracle's own arithmetic (sub, then mul+add for the first 8·⌊d/8⌋
// elements and fma for the rest: what the -march=native build of the oracle executes). To
// keep that cheap the scan tracks the three smallest 16-centroid chunk minima: when the third
// is still inside the margin the lane falls back to a full oracle scan (rare).
//
// Shape. Throughput mode: one warp per job of TPJ token-heads (each lane SPL sub-vectors), the
// f32 codebook staged in shared memory and read as warp-wide broadcasts. Decode mode (a few
// tokens): the 8 warps of a block share the job and split the codebook scan, then take the
// best of the 8 exact answers (ties to the lower slice, i.e. the lower index); codebooks of
// 1024+ entries are split over up to 8 blocks per job as well (EncodeParams::dec_slices), whose
// answers the job's last block merges the same way from a workspace.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cstring>
#include <sstream>
#include <type_traits>

#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"

namespace veloxquant::cuda {

namespace {

constexpr int kEncWarps = 8;

/// Blocks that split one token group's scan of an n-centroid codebook in decode mode: at most
/// `slices`, each block's `warps` warps keeping >= 64 centroids apiece (the kernel's rule, which
/// the host's grid and shared-memory sizing repeat through this one function).
__host__ __device__ constexpr int dec_blocks(int n_centroids, int slices, int warps) {
  const int fit = n_centroids / (warps * 64);
  const int nb = slices < fit ? slices : fit;
  return nb > 1 ? nb : 1;
}

struct Side {
  const float* cb;
  const float* norms;
  int bits, sub;
  float cmax;
  uint8_t* codes;
  int row_stride;
  void* win;
  DevTensor4 src;
  bool keys;
};

/// Deferred input checks: whether a queued range check failed (EncodeParams::gate), in which
/// case an update's kernels write nothing.
__device__ __forceinline__ bool gated(const int* gate) { return gate != nullptr && (gate[0] | gate[1]) != 0; }
/// The range checks' rule: non-finite or beyond the storage dtype's range.
__device__ __forceinline__ bool out_of_range(float x, float limit) { return !(fabsf(x) <= limit); }
/// A range check's failure for side w (0: keys, 1: values): its tag into flags[w] unless an
/// earlier failure's is there, and (mapped, if given) into the host's copy.
__device__ __forceinline__ void report_range(int* flags, int* host_flags, int w, int tag) {
  atomicCAS(flags + w, 0, tag);
  if (host_flags) reinterpret_cast<volatile int*>(host_flags)[w] = tag;  // every writer writes this tag
}

__device__ __forceinline__ Side side_of(const EncodeParams& p, bool keys) {
  if (keys) return {p.k_cb, p.k_norms, p.k_bits, p.k_sub, p.k_cmax, p.k_codes, p.k_row_stride, p.k_win, p.k, true};
  return {p.v_cb, p.v_norms, p.v_bits, p.v_sub, p.v_cmax, p.v_codes, p.v_row_stride, p.v_win, p.v, false};
}

/// The oracle's distance, reproduced operation for operation.
template <int SD>
__device__ __forceinline__ float oracle_dist(const float (&x)[SD], const float* c) {
  // No FMA anywhere: every difference, square and partial sum rounded to f32 (the CPU rule).
  float e = 0.0f;
#pragma unroll
  for (int j = 0; j < SD; ++j) {
    const float t = __fsub_rn(x[j], c[j]);
    e = __fadd_rn(e, __fmul_rn(t, t));
  }
  return e;
}

template <int SD>
__device__ __forceinline__ void load_centroid(const float* cb, int c, float (&v)[SD]) {
  const float4* q = reinterpret_cast<const float4*>(cb + size_t(c) * SD);
#pragma unroll
  for (int j = 0; j < SD / 4; ++j) {
    const float4 f = q[j];
    v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
  }
}

/// Exact argmin of the oracle distance over centroids [c0, c1) (ties: lowest index).
template <int SD>
__device__ __forceinline__ void oracle_scan(const float (&x)[SD], const float* cb, int c0, int c1, float& best,
                                            int& code) {
#pragma unroll 4
  for (int c = c0; c < c1; ++c) {
    float v[SD];
    load_centroid<SD>(cb, c, v);
    float e = 0.0f;
#pragma unroll
    for (int j = 0; j < SD; ++j) {
      const float t = __fsub_rn(x[j], v[j]);
      e = __fadd_rn(e, __fmul_rn(t, t));
    }
    if (e < best || (e == best && c < code)) best = e, code = c;
  }
}

/// Searches centroids [cbeg, cend) for the SPL sub-vectors of this lane.
/// Returns per slot the exact best distance and code within the range.
template <int SD, int SPL>
__device__ __forceinline__ void search(const float (&x)[SPL][SD], const bool (&live)[SPL], const float* cb, const float* norms,
                       float cmax, int cbeg, int cend, float (&best)[SPL], int (&code)[SPL]) {
  float xm2[SPL][SD], m1[SPL], m2[SPL], m3[SPL], margin[SPL];
  int b1[SPL], b2[SPL];
  bool slow[SPL], done[SPL];
#pragma unroll
  for (int s = 0; s < SPL; ++s) {
    float n2 = 0.0f;
    bool finite = true;
#pragma unroll
    for (int j = 0; j < SD; ++j) {
      xm2[s][j] = -2.0f * x[s][j];
      n2 = fmaf(x[s][j], x[s][j], n2);
      finite &= isfinite(x[s][j]);
    }
    const float r = sqrtf(n2) + cmax;
    const float r2 = r * r;
    margin[s] = 8.0f * float(2 * SD + 5) * 5.9604645e-8f * r2 + 1e-30f;
    slow[s] = !(r2 < 1e36f);
    m1[s] = m2[s] = m3[s] = INFINITY;
    b1[s] = b2[s] = cbeg;
    best[s] = INFINITY;
    code[s] = finite ? cbeg : 0;
    done[s] = !finite || !live[s];  // code already decided (non-finite: 0, as the oracle)
  }
  // Fast scores a_c = ||c||² − 2x·c over chunks of 8 centroids; the three smallest chunk minima
  // (and the chunks of the first two) are tracked without branches.
  constexpr int chunk = 8;  // every slice holds a multiple of 8 centroids (>= 16 per codebook)
  for (int ch = cbeg; ch < cend; ch += chunk) {
    float cm[SPL];
#pragma unroll
    for (int s = 0; s < SPL; ++s) cm[s] = INFINITY;
#pragma unroll
    for (int c = ch; c < ch + chunk; ++c) {
      float v[SD];
      load_centroid<SD>(cb, c, v);
      const float nc = norms[c];
#pragma unroll
      for (int s = 0; s < SPL; ++s) {
        float d = nc;
#pragma unroll
        for (int j = 0; j < SD; ++j) d = fmaf(xm2[s][j], v[j], d);
        cm[s] = fminf(cm[s], d);
      }
    }
#pragma unroll
    for (int s = 0; s < SPL; ++s) {
      const float c = cm[s];
      const bool lt1 = c < m1[s], lt2 = c < m2[s];
      m3[s] = lt2 ? m2[s] : fminf(m3[s], c);
      m2[s] = lt1 ? m1[s] : (lt2 ? c : m2[s]);
      b2[s] = lt1 ? b1[s] : (lt2 ? ch : b2[s]);
      m1[s] = lt1 ? c : m1[s];
      b1[s] = lt1 ? ch : b1[s];
    }
  }
#pragma unroll
  for (int s = 0; s < SPL; ++s) {
    if (done[s]) continue;
    const float thr = m1[s] + margin[s];
    float bst = INFINITY;
    int cd = cbeg;
    if (slow[s] || m3[s] <= thr || !(m1[s] < INFINITY)) {
      oracle_scan<SD>(x[s], cb, cbeg, cend, bst, cd);
    } else {
      oracle_scan<SD>(x[s], cb, b1[s], b1[s] + chunk, bst, cd);
      if (m2[s] <= thr) oracle_scan<SD>(x[s], cb, b2[s], b2[s] + chunk, bst, cd);
    }
    best[s] = bst;
    code[s] = cd;
  }
}

/// In-place FWHT (stages h = 1, 2, 4, ... as the CPU) of TPJ vectors of D floats in a warp's
/// shared buffer, then the scale (1/sqrt(B)). Block-diagonal for head dims that are not powers of
/// two (hadamard.h): blocks of B = the largest power of two dividing D, i.e. the stages h < B,
/// whose pairs (i, i + h) never cross a block.
template <int D, int TPJ>
__device__ __forceinline__ void warp_fwht(float* xs, int lane, float scale) {
  constexpr int kB = D & -D;
  for (int h = 1; h < kB; h <<= 1) {
    for (int i = lane; i < TPJ * D / 2; i += 32) {
      const int tt = i / (D / 2), j = i % (D / 2);
      const int i0 = tt * D + (j / h) * 2 * h + (j % h);
      const float a = xs[i0], b = xs[i0 + h];
      xs[i0] = __fadd_rn(a, b);
      xs[i0 + h] = __fsub_rn(a, b);
    }
    __syncwarp();
  }
  for (int i = lane; i < TPJ * D; i += 32) xs[i] = __fmul_rn(xs[i], scale);
  __syncwarp();
}

struct Pos {
  int b, kvh, i;
};
/// (batch, kv head, token) of a flat token-head index; 32-bit divisions (the host checks that
/// batch·n_kv_heads·n fits), once per token, never per element: 64-bit division is emulated.
__device__ __forceinline__ Pos decompose(int64_t th64, int n_kv_heads, int n) {
  const uint32_t th = uint32_t(th64), un = uint32_t(n), uh = uint32_t(n_kv_heads);
  const uint32_t bh = th / un;
  return {int(bh / uh), int(bh - (bh / uh) * uh), int(th - bh * un)};
}

/// Packs n_sub codes (u32 in smem) into row words; lanes own words.
__device__ __forceinline__ void pack_row(const uint32_t* codes, int n_sub, int bits, uint32_t* dst_row, int n_words,
                                         int lane) {
  for (int w = lane; w < n_words; w += 32) {
    const int bit0 = 32 * w;
    uint32_t word = 0;
    const int i0 = bit0 / bits;
    for (int i = i0; i < n_sub && i * bits < bit0 + 32; ++i) {
      const int sh = i * bits - bit0;
      const uint32_t c = codes[i];
      word |= sh >= 0 ? (c << sh) : (c >> (-sh));
    }
    dst_row[w] = word;
  }
}

template <int D, int SD, int SPL, int CS>
__global__ void __launch_bounds__(256) vq_encode_kernel(const EncodeParams p) {
  constexpr int kNSub = D / SD;
  constexpr int TPJ = 32 * SPL / kNSub;
  static_assert(TPJ >= 1 && (32 * SPL) % kNSub == 0, "slots must cover whole tokens");
  extern __shared__ __align__(16) unsigned char smem[];
  grid_dep_launch_dependents();  // a decode step's attention may start now (it waits for this kernel's writes)
  const bool keys = blockIdx.y == 0;
  const Side sd = side_of(p, keys);
  if (sd.sub != SD || !(p.sides & (keys ? 1 : 2)) || gated(p.gate)) return;  // served elsewhere / not asked for
  const int nC = 1 << sd.bits;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Decode mode over several blocks (EncodeParams::dec_slices): NB blocks share a job, block
  // `bslice` scans centroids [c_blk0, c_blk0 + per_blk) with its CS warps; the last block of a
  // job to finish merges the NB partial answers (workspace) and writes. Slices keep >= 64
  // centroids per warp (8-centroid chunks); blocks past this side's NB have nothing to do.
  const int64_t n_th = int64_t(p.batch) * p.n_kv_heads * p.n_new;
  const int64_t n_jobs = (n_th + TPJ - 1) / TPJ;
  int NB = 1;
  if (CS > 1 && p.dec_slices > 1 && p.dec_ws_best && n_jobs <= p.dec_ws_jobs)
    NB = dec_blocks(nC, p.dec_slices, CS);
  const int NBL = CS > 1 && p.dec_slices > 1 ? p.dec_slices : 1;  // blocks per job in the grid
  const int bslice = CS > 1 ? int(blockIdx.x % NBL) : 0;
  if (bslice >= NB) return;
  const int per_blk = nC / NB, c_blk0 = bslice * per_blk;
  // (sized by the staged range: the whole codebook, or a sliced decode-mode block's slice)
  float* const s_cb = reinterpret_cast<float*>(smem);                  // [per_blk][SD]
  float* const s_nrm = s_cb + per_blk * SD;                             // [per_blk]
  float* const s_x = s_nrm + per_blk;                                   // [warps][TPJ][D]
  uint32_t* const s_code = reinterpret_cast<uint32_t*>(s_x + kEncWarps * TPJ * D);  // [warps][TPJ·kNSub]
  float* const s_best = reinterpret_cast<float*>(s_code + kEncWarps * TPJ * kNSub); // [warps][32·SPL]
  int* const s_bcode = reinterpret_cast<int*>(s_best + kEncWarps * 32 * SPL);       // [warps][32·SPL]

  // the f32 codebook in shared memory: every scan reads it as warp-wide broadcasts. Copied
  // with cp.async, all in flight at once: a load-then-store loop through registers waited one
  // L2 round trip per iteration (the generic loads may alias the shared stores, so the
  // compiler cannot hoist them): 20 + 16 round trips for a 4096-entry d4 codebook and its
  // norms, most of a decode step's encode
  // (a block of a sliced decode job stages its slice only, at the start of the buffers)
  const float* const g_cb = sd.cb + size_t(c_blk0) * SD;
  const float* const g_nrm = sd.norms + c_blk0;
  if (((reinterpret_cast<uintptr_t>(g_cb) | reinterpret_cast<uintptr_t>(g_nrm)) & 15) == 0) {
    const uint32_t cb_s = uint32_t(__cvta_generic_to_shared(s_cb)), nrm_s = uint32_t(__cvta_generic_to_shared(s_nrm));
    for (int i = tid; i < per_blk * SD / 4; i += 256) cp_async16(cb_s + 16u * uint32_t(i), g_cb + 4 * i);
    for (int i = tid; i < per_blk / 4; i += 256) cp_async16(nrm_s + 16u * uint32_t(i), g_nrm + 4 * i);
    cp_async_commit();
    cp_async_wait<0>();
  } else {
    for (int i = tid; i < per_blk * SD; i += 256) s_cb[i] = __ldg(g_cb + i);
    for (int i = tid; i < per_blk; i += 256) s_nrm[i] = __ldg(g_nrm + i);
  }
  __syncthreads();
  // indexed by absolute centroid number (the search's ranges lie inside the staged slice)
  const float* const cb = s_cb - size_t(c_blk0) * SD;
  const float* const nrm = s_nrm - c_blk0;
  // the dequantized rows read any centroid: the whole codebook (global when sliced)
  const float* const deq_cb = NB > 1 ? sd.cb : s_cb;
  float* const xs = s_x + warp * TPJ * D;
  uint32_t* const cc = s_code + warp * TPJ * kNSub;
  const int row_words = sd.row_stride / 4;
  const int64_t job_step = CS == 1 ? int64_t(gridDim.x) * kEncWarps : int64_t(gridDim.x / NBL);
  const int64_t job0 = CS == 1 ? int64_t(blockIdx.x) * kEncWarps + warp : int64_t(blockIdx.x / NBL);
  const int cbeg = CS == 1 ? 0 : c_blk0 + warp * (per_blk / CS), cend = CS == 1 ? nC : cbeg + per_blk / CS;
  __shared__ int s_last;  // sliced decode: whether this block merges the job

  for (int64_t job = job0; job < n_jobs; job += job_step) {
    const int64_t th0 = job * TPJ;
    // 1. the job's vectors, f32, transformed for keys
#pragma unroll 1
    for (int tt = 0; tt < TPJ; ++tt) {
      const int64_t th = th0 + tt;
      if (th >= n_th) {
        for (int d = lane; d < D; d += 32) xs[tt * D + d] = 0.0f;
        continue;
      }
      const Pos q = decompose(th, p.n_kv_heads, p.n_new);
      const int64_t base = q.b * sd.src.stride[0] + q.kvh * sd.src.stride[1] + q.i * sd.src.stride[2];
      const float* il = (keys && p.inv_lambda) ? p.inv_lambda + q.kvh * D : nullptr;
      // every load issued before any use (one round trip, not D/32): raw 16-bit values or
      // floats first, the dtype branch outside the unrolled loops
      // (kE = ceil(D / 32) elements a lane; the last one only on lanes below D mod 32)
      constexpr int kE = (D + 31) / 32;
      auto on = [&](int k) { return D % 32 == 0 || lane + 32 * k < D; };
      float xv[kE], lv[kE];
      const int64_t es = sd.src.stride[3];
#pragma unroll
      for (int k = 0; k < kE; ++k) lv[k] = il && on(k) ? __ldg(il + lane + 32 * k) : 1.0f;
      if (sd.src.dtype == DType::F32) {
        const float* src = static_cast<const float*>(sd.src.data) + base;
#pragma unroll
        for (int k = 0; k < kE; ++k) xv[k] = on(k) ? src[(lane + 32 * k) * es] : 0.0f;
      } else {
        const uint16_t* src = static_cast<const uint16_t*>(sd.src.data) + base;
        uint16_t raw[kE];
#pragma unroll
        for (int k = 0; k < kE; ++k) raw[k] = on(k) ? src[(lane + 32 * k) * es] : uint16_t(0);
        const int bf16 = sd.src.dtype == DType::BF16;
#pragma unroll
        for (int k = 0; k < kE; ++k) xv[k] = store16_to_f(raw[k], bf16);
      }
#pragma unroll
      for (int k = 0; k < kE; ++k)
        if (on(k)) xs[tt * D + lane + 32 * k] = il ? __fmul_rn(xv[k], lv[k]) : xv[k];
    }
    __syncwarp();
    if (keys && p.use_hadamard) warp_fwht<D, TPJ>(xs, lane, p.hadamard_scale);
    // 2. this lane's sub-vectors
    float x[SPL][SD];
    bool live[SPL];
#pragma unroll
    for (int s = 0; s < SPL; ++s) {
      const int gs = s * 32 + lane, tt = gs / kNSub, sub = gs % kNSub;
      live[s] = th0 + tt < n_th;
#pragma unroll
      for (int j = 0; j < SD; ++j) x[s][j] = xs[tt * D + sub * SD + j];
    }
    // 3. nearest centroid, exact
    float best[SPL];
    int code[SPL];
    search<SD, SPL>(x, live, cb, nrm, sd.cmax, cbeg, cend, best, code);
    if (CS > 1) {
#pragma unroll
      for (int s = 0; s < SPL; ++s) {
        s_best[warp * 32 * SPL + s * 32 + lane] = best[s];
        s_bcode[warp * 32 * SPL + s * 32 + lane] = code[s];
      }
      __syncthreads();
#pragma unroll
      for (int s = 0; s < SPL; ++s) {
        float bb = s_best[s * 32 + lane];
        int bc = s_bcode[s * 32 + lane];
        for (int w = 1; w < CS; ++w) {
          const float e = s_best[w * 32 * SPL + s * 32 + lane];
          if (e < bb) bb = e, bc = s_bcode[w * 32 * SPL + s * 32 + lane];
        }
        code[s] = bc;
        best[s] = bb;
      }
      if (NB > 1) {
        // this block's answer into the workspace; the last of the job's NB blocks merges them
        // in slice order (strict <: ties keep the lower slice, i.e. the lower index)
        const int64_t jslot = (blockIdx.y ? p.dec_ws_jobs : 0) + job;
        if (warp == 0) {
#pragma unroll
          for (int s = 0; s < SPL; ++s) {
            const int64_t i = (jslot * NB + bslice) * 32 * SPL + s * 32 + lane;
            p.dec_ws_best[i] = best[s];
            p.dec_ws_code[i] = code[s];
          }
          __threadfence();
        }
        __syncthreads();
        if (tid == 0) {
          const int done = atomicAdd(p.dec_ws_count + jslot, 1);
          s_last = done == NB - 1;
          if (s_last) p.dec_ws_count[jslot] = 0;  // ready for the next launch (graph replays)
        }
        __syncthreads();
        if (!s_last) continue;  // (block-uniform) another block of the job writes it
        __threadfence();
#pragma unroll
        for (int s = 0; s < SPL; ++s) {
          const int64_t i0 = jslot * NB * 32 * SPL + s * 32 + lane;
          float bb = __ldcg(p.dec_ws_best + i0);
          int bc = __ldcg(p.dec_ws_code + i0);
          for (int b = 1; b < NB; ++b) {
            const float e = __ldcg(p.dec_ws_best + i0 + int64_t(b) * 32 * SPL);
            if (e < bb) bb = e, bc = __ldcg(p.dec_ws_code + i0 + int64_t(b) * 32 * SPL);
          }
          code[s] = bc;
        }
      }
    }
#pragma unroll
    for (int s = 0; s < SPL; ++s) {
      const int gs = s * 32 + lane;
      cc[(gs / kNSub) * kNSub + gs % kNSub] = uint32_t(code[s]);
    }
    __syncwarp();
    // 4. codes, window rows, dequantized rows (one warp per job writes; in decode mode warp 0)
    const bool writer = CS == 1 || warp == 0;
    bool any_deq = false;
    for (int tt = 0; tt < TPJ; ++tt) {
      const int64_t th = th0 + tt;
      if (th >= n_th) break;
      const Pos q = decompose(th, p.n_kv_heads, p.n_new);
      const int L0 = p.seq_len[q.b];
      const int pos = L0 + q.i;
      const int Lnew = L0 + p.n_new;
      const int rcn = min(p.residual_length, (p.res_count ? p.res_count[q.b] : 0) + p.n_new);
      const bool in_win = pos >= Lnew - rcn;
      const int64_t bh = int64_t(q.b) * p.n_kv_heads + q.kvh;
      if (writer && sd.codes && (!p.codes_ring || in_win)) {
        const int64_t slot = p.codes_ring ? pos % p.code_cap : pos;
        if (slot < p.code_cap) {
          pack_row(cc + tt * kNSub, kNSub, sd.bits,
                   reinterpret_cast<uint32_t*>(sd.codes + (bh * p.code_cap + slot) * sd.row_stride), row_words, lane);
        } else if (lane == 0 && p.error_flag) {
          atomicExch(p.error_flag, 1);
        }
      }
      if (writer && sd.win && in_win) {
        const int64_t slot = p.win_ring ? pos % p.win_cap : pos;
        if (slot < p.win_cap) {
          uint16_t* dst = static_cast<uint16_t*>(sd.win) + (bh * p.win_cap + slot) * D;
          for (int d = lane; d < D; d += 32) {
            const float v = load_f(sd.src.data, sd.src.dtype,
                                   q.b * sd.src.stride[0] + q.kvh * sd.src.stride[1] + q.i * sd.src.stride[2] +
                                       d * sd.src.stride[3]);
            dst[d] = f_to_store16(v, p.win_bf16);
          }
        } else if (lane == 0 && p.error_flag) {
          atomicExch(p.error_flag, 1);
        }
      }
      any_deq |= (sd.win && p.deq_outside && !in_win);
    }
    if (writer && any_deq) {  // dequantized rows for tokens born outside the window
      for (int idx = lane; idx < TPJ * D; idx += 32) {
        const int tt = idx / D, d = idx % D;
        xs[idx] = deq_cb[size_t(cc[tt * kNSub + d / SD]) * SD + d % SD];
      }
      __syncwarp();
      if (keys && p.use_hadamard) warp_fwht<D, TPJ>(xs, lane, p.hadamard_scale);
      for (int tt = 0; tt < TPJ; ++tt) {
        const int64_t th = th0 + tt;
        if (th >= n_th) break;
        const Pos q = decompose(th, p.n_kv_heads, p.n_new);
        const int L0 = p.seq_len[q.b], pos = L0 + q.i;
        const int rcn = min(p.residual_length, (p.res_count ? p.res_count[q.b] : 0) + p.n_new);
        if (pos >= L0 + p.n_new - rcn) continue;
        if (pos >= p.win_cap) {
          if (lane == 0 && p.error_flag) atomicExch(p.error_flag, 1);
          continue;
        }
        uint16_t* dst = static_cast<uint16_t*>(sd.win) + ((int64_t(q.b) * p.n_kv_heads + q.kvh) * p.win_cap + pos) * D;
        for (int d = lane; d < D; d += 32) {
          float v = xs[tt * D + d];
          if (keys && p.lambda) v = __fmul_rn(v, p.lambda[q.kvh * D + d]);
          dst[d] = f_to_store16(v, p.win_bf16);
        }
      }
    }
    if (CS > 1) __syncthreads();
    else __syncwarp();
  }
}

// ---- throughput mode, v2 (EncodeParams::bulk_variant = 1) ----------------------------------
// Same contract and arithmetic as vq_encode_kernel in throughput mode, fewer instructions per
// token-head:
//  * The FWHT runs in registers. Slot s of lane l holds sub-vector g mod n_sub of the job's
//    token g / n_sub (g = 32·s + l), so butterflies of span h < sub_dim stay inside a slot,
//    spans up to 32·sub_dim are one shuffle + one FFMA (fma(±1, mine, partner) rounds exactly
//    as the CPU's a + b / a − b), and larger spans pair two slots of the lane.
//  * Scores are made non-negative by a per-lane offset O = 4·max_s||x_s||·cmax + 2·cmax²
//    (O + 2x·c − ||c||² ≥ 2||x||·cmax + cmax² ≥ 0), so their float order is the integer order of
//    their bits: the max of a chunk of 8 scores takes 3-input integer max instructions, and the
//    best two chunks are tracked as keys (score bits with the low idb bits replaced by the
//    chunk number): one LOP3 + three IMNMX per chunk, no branches, no float compares.
//  * The bound on the fast score's error is the previous kernel's, widened by the offset (every
//    partial sum now carries O): margin = 8(2d + 5)·u·(R² + 2·O). A key bounds its chunk's max
//    from below (low bits cleared) and the others' from above (low bits set); when a second
//    chunk may hold a score within the margin of the best, the lane scans every centroid with
//    the oracle (rare). Otherwise only chunk b1 can hold candidates: its 8 fast scores are
//    recomputed bit for bit, and when a single one lies within the margin it is the oracle's
//    argmin (the CPU search's rule); else the oracle re-ranks the chunk (ties: lowest index).
template <int SD>
__device__ __forceinline__ float fast_score(const float (&x)[SD], const float* cb2, int c, float off) {
  float v[SD];
  load_centroid<SD>(cb2, c, v);
  float d = off;
#pragma unroll
  for (int j = 0; j < SD; ++j) d = __fmaf_rn(x[j], v[j], d);
  return d;
}

/// Position of token th0 + tt given the position of th0 (tt small: a few wrap steps at most).
__device__ __forceinline__ Pos pos_after(Pos q, int tt, int n_kv_heads, int n) {
  int i = q.i + tt;
  while (i >= n) {
    i -= n;
    if (++q.kvh == n_kv_heads) q.kvh = 0, ++q.b;
  }
  q.i = i;
  return q;
}

//  * GRID (sub_dim 4, <= 4096 centroids, EncodeParams::k_grid / v_grid set): no scan. The
//    sub-vector's cell of the codebook's candidate grid (src/core/pq_grid.h) lists every centroid
//    that can be the oracle's answer for it; the lane re-ranks that list (~10 of 256, ~30 of 4096
//    on Gaussian data) with the oracle's own arithmetic, ascending with strict <, so the code is
//    the oracle's. Points without a cell (outside the grid's far box) or in a cell without a list
//    scan the whole codebook with the oracle.
//    The parameters are __grid_constant__ so the grid can be read in place (a reference into an
//    ordinary kernel parameter makes a local copy of the whole struct: 156 bytes of spills).
template <int D, int SD, int SPL, bool GRID = false>
__global__ void __launch_bounds__(256, (SPL * SD <= 16 && D <= 128) ? 4 : (SPL * SD <= 32 ? 2 : 1))
    vq_encode_bulk_kernel(const __grid_constant__ EncodeParams p) {
  static_assert(!GRID || SD == 4, "the candidate grid is built for sub_dim 4");
  constexpr int kNSub = D / SD;
  constexpr int TPJ = 32 * SPL / kNSub;
  constexpr int kChunk = 8;
  static_assert(TPJ >= 1 && (32 * SPL) % kNSub == 0, "slots must cover whole tokens");
  extern __shared__ __align__(16) unsigned char smem[];
  const bool keys = blockIdx.y == 0;
  const Side sd = side_of(p, keys);
  if (sd.sub != SD || !(p.sides & (keys ? 1 : 2)) || gated(p.gate)) return;
  const int nC = 1 << sd.bits;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* const s_cb2 = reinterpret_cast<float*>(smem);                           // [nC][SD] 2·c
  float* const s_nn = s_cb2 + nC * SD;                                            // [nC] −||c||²
  uint32_t* const s_code = reinterpret_cast<uint32_t*>(s_nn + nC);               // [warps][TPJ·kNSub]
  float* const s_x = reinterpret_cast<float*>(s_code + kEncWarps * TPJ * kNSub);  // [warps][TPJ][D] (deq only)
  for (int i = tid; i < nC * SD / 4; i += 256) {
    float4 f = reinterpret_cast<const float4*>(sd.cb)[i];
    if constexpr (!GRID) f.x *= 2.0f, f.y *= 2.0f, f.z *= 2.0f, f.w *= 2.0f;  // GRID: the centroids as they are
    reinterpret_cast<float4*>(s_cb2)[i] = f;
  }
  __shared__ int s_nmin;  // min_c ||c||² (non-negative floats compare as their bits)
  if (tid == 0) s_nmin = INT_MAX;
  __syncthreads();
  {
    float nmin = INFINITY;
    for (int i = tid; i < nC; i += 256) {
      const float nrm = sd.norms[i];
      s_nn[i] = -nrm;
      nmin = fminf(nmin, nrm);
    }
    atomicMin(&s_nmin, __float_as_int(fmaxf(nmin, 0.0f)));
  }
  __syncthreads();
  const float cmin = sqrtf(__int_as_float(s_nmin));
  uint32_t* const cc = s_code + warp * TPJ * kNSub;
  const int64_t n_th = int64_t(p.batch) * p.n_kv_heads * p.n_new;
  const int64_t n_jobs = (n_th + TPJ - 1) / TPJ;
  const int row_words = sd.row_stride / 4;
  const int idmask = (1 << (sd.bits - 3)) - 1;  // chunk numbers: nC / 8
  const float cmax = sd.cmax;
  const float* const il_all = (keys && p.inv_lambda) ? p.inv_lambda : nullptr;
  const bool had = keys && p.use_hadamard;

  for (int64_t job = int64_t(blockIdx.x) * kEncWarps + warp; job < n_jobs; job += int64_t(gridDim.x) * kEncWarps) {
    const int64_t th0 = job * TPJ;
    const Pos q0 = decompose(th0, p.n_kv_heads, p.n_new);
    // 1. this lane's sub-vectors, f32, scaled by 1/λ for keys
    float x[SPL][SD];
    bool live[SPL];
#pragma unroll
    for (int s = 0; s < SPL; ++s) {
      const int gs = s * 32 + lane, tt = gs / kNSub, sub = gs % kNSub;
      live[s] = th0 + tt < n_th;
#pragma unroll
      for (int j = 0; j < SD; ++j) x[s][j] = 0.0f;
      if (live[s]) {
        const Pos q = pos_after(q0, tt, p.n_kv_heads, p.n_new);
        const int64_t e0 = q.b * sd.src.stride[0] + q.kvh * sd.src.stride[1] + q.i * sd.src.stride[2] +
                           int64_t(sub * SD) * sd.src.stride[3];
        const __half* hp = static_cast<const __half*>(sd.src.data) + e0;
        if (sd.src.dtype == DType::F16 && sd.src.stride[3] == 1 && (reinterpret_cast<uintptr_t>(hp) & (2 * SD - 1)) == 0) {
          if constexpr (SD == 4) {
            const uint2 w = *reinterpret_cast<const uint2*>(hp);
            const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&w.x));
            const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&w.y));
            x[s][0] = a.x, x[s][1] = a.y, x[s][2] = b.x, x[s][3] = b.y;
          } else {
#pragma unroll
            for (int k = 0; k < SD / 8; ++k) {
              const uint4 w = reinterpret_cast<const uint4*>(hp)[k];
              const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
              for (int u = 0; u < 4; ++u) {
                const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&ws[u]));
                x[s][8 * k + 2 * u] = a.x, x[s][8 * k + 2 * u + 1] = a.y;
              }
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < SD; ++j) x[s][j] = load_f(sd.src.data, sd.src.dtype, e0 + j * sd.src.stride[3]);
        }
        if (il_all) {
          const float* il = il_all + q.kvh * D + sub * SD;
#pragma unroll
          for (int j = 0; j < SD; ++j) x[s][j] = __fmul_rn(x[s][j], __ldg(il + j));
        }
      }
    }
    // 2. keys: FWHT (h = 1, 2, 4, ... as the CPU), then × 1/sqrt(D)
    if (had) {
#pragma unroll
      for (int h = 1; h < D; h <<= 1) {
        if (h < SD) {
#pragma unroll
          for (int s = 0; s < SPL; ++s)
#pragma unroll
            for (int j = 0; j < SD; ++j)
              if (!(j & h)) {
                const float a = x[s][j], b = x[s][j + h];
                x[s][j] = __fadd_rn(a, b);
                x[s][j + h] = __fsub_rn(a, b);
              }
        } else if (h / SD < 32) {
          const int ph = h / SD;
          const float sg = (lane & ph) ? -1.0f : 1.0f;  // upper half: partner − mine
#pragma unroll
          for (int s = 0; s < SPL; ++s)
#pragma unroll
            for (int j = 0; j < SD; ++j) {
              const float v = __shfl_xor_sync(0xffffffffu, x[s][j], ph);
              x[s][j] = __fmaf_rn(sg, x[s][j], v);
            }
        } else {
          const int ps = h / SD / 32;
#pragma unroll
          for (int s = 0; s < SPL; ++s)
            if (!(s & ps))
#pragma unroll
              for (int j = 0; j < SD; ++j) {
                const float a = x[s][j], b = x[s + ps][j];
                x[s][j] = __fadd_rn(a, b);
                x[s + ps][j] = __fsub_rn(a, b);
              }
        }
      }
      const float sc = p.hadamard_scale;
#pragma unroll
      for (int s = 0; s < SPL; ++s)
#pragma unroll
        for (int j = 0; j < SD; ++j) x[s][j] = __fmul_rn(x[s][j], sc);
    }
    if constexpr (GRID) {
      // 3–5 with the candidate grid: the cell, then its list re-ranked with the oracle
      const EncodeGrid& gd = keys ? p.k_grid : p.v_grid;
#pragma unroll 1
      for (int s = 0; s < SPL; ++s) {
        int code = 0;
        bool fin = live[s];
#pragma unroll
        for (int j = 0; j < SD; ++j) fin &= isfinite(x[s][j]);
        if (fin) {
          int cell = 0;
          bool in = gd.cells != nullptr;
#pragma unroll
          for (int j = SD - 1; j >= 0; --j) {
            const float xv = x[s][j];
            in &= xv >= gd.far_lo[j] && xv <= gd.far_hi[j];
            const int t = __float2int_rd(__fmul_rn(__fsub_rn(xv, gd.lo[j]), gd.inv_w[j]));
            cell = cell * gd.g + min(max(t, 0), gd.g - 1);
          }
          float bst = INFINITY;
          // the cell's word; count 0: a cell without a list (it would hold > 511 candidates)
          const uint32_t cw = in ? __ldg(gd.cells + cell) : 0u, first = cw >> 9, cnt = cw & 511u;
          if (cnt != 0 && !gd.wide) {  // 8-bit indices, 4 per word
            for (uint32_t i = 0; i < cnt; i += 4) {
              const uint32_t w = __ldg(gd.lists + first + i / 4);
#pragma unroll
              for (int q = 0; q < 4; ++q) {  // a run's padding repeats its last index: no effect
                const int c = int((w >> (8 * q)) & 255u);
                float v[SD];
                load_centroid<SD>(s_cb2, c, v);
                const float e = oracle_dist<SD>(x[s], v);
                if (e < bst) bst = e, code = c;
              }
            }
          } else if (cnt != 0) {  // 16-bit indices (codebooks of > 256 centroids), 2 per word
            for (uint32_t i = 0; i < cnt; i += 2) {
              const uint32_t w = __ldg(gd.lists + first + i / 2);
#pragma unroll
              for (int q = 0; q < 2; ++q) {
                const int c = int((w >> (16 * q)) & 0xFFFFu);
                float v[SD];
                load_centroid<SD>(s_cb2, c, v);
                const float e = oracle_dist<SD>(x[s], v);
                if (e < bst) bst = e, code = c;
              }
            }
          } else {
            oracle_scan<SD>(x[s], s_cb2, 0, nC, bst, code);
          }
        }
        cc[s * 32 + lane] = uint32_t(code);
      }
    } else {
      // 3. the lane's offset (from its live, finite, not huge slots)
      float xn = 0.0f;
#pragma unroll
      for (int s = 0; s < SPL; ++s) {
        float n2 = 0.0f;
#pragma unroll
        for (int j = 0; j < SD; ++j) n2 = fmaf(x[s][j], x[s][j], n2);
        const float r = sqrtf(n2) + cmax;
        if (live[s] && r * r < 1e36f) xn = fmaxf(xn, sqrtf(n2));
      }
      // O + max_c(2x·c − ||c||²) = O + ||x||² − min_c||x − c||² ≥ O − 2||x||·cmin − cmin², so this O
      // keeps the best score of every slot ≥ 2||x||·cmin + cmin² + 1e-3·R² > the margin
      const float off = 2.0f * (2.0f * xn * cmin + cmin * cmin) + 1e-3f * (xn + cmax) * (xn + cmax);
      // 4. scan: chunk maxima of O + 2x·c − ||c||² as integers, the best two chunks as keys
      int m1[SPL], m2[SPL];
#pragma unroll
      for (int s = 0; s < SPL; ++s) m1[s] = m2[s] = INT_MIN;
      const float4* const nn4 = reinterpret_cast<const float4*>(s_nn);
#pragma unroll(SPL >= 8 ? 2 : 1)
      for (int ch = 0, k = 0; ch < nC; ch += kChunk, ++k) {
        const float4 na = nn4[ch / 4], nb = nn4[ch / 4 + 1];
        const float no[kChunk] = {__fadd_rn(na.x, off), __fadd_rn(na.y, off), __fadd_rn(na.z, off), __fadd_rn(na.w, off),
                                  __fadd_rn(nb.x, off), __fadd_rn(nb.y, off), __fadd_rn(nb.z, off), __fadd_rn(nb.w, off)};
        int cm[SPL];
#pragma unroll
        for (int c = 0; c < kChunk; c += 2) {
          float v0[SD], v1[SD];
          load_centroid<SD>(s_cb2, ch + c, v0);
          load_centroid<SD>(s_cb2, ch + c + 1, v1);
#pragma unroll
          for (int s = 0; s < SPL; ++s) {
            float a = no[c], b = no[c + 1];
#pragma unroll
            for (int j = 0; j < SD; ++j) a = __fmaf_rn(x[s][j], v0[j], a), b = __fmaf_rn(x[s][j], v1[j], b);
            const int ia = __float_as_int(a), ib = __float_as_int(b);
            cm[s] = c == 0 ? max(ia, ib) : max(max(cm[s], ia), ib);
          }
        }
#pragma unroll
        for (int s = 0; s < SPL; ++s) {
          const int key = (cm[s] & ~idmask) | k;
          const int lo = min(m1[s], key);
          m1[s] = max(m1[s], key);
          m2[s] = max(m2[s], lo);
        }
      }
      // 5. candidates and the exact answer
#pragma unroll
      for (int s = 0; s < SPL; ++s) {
        int code = 0;
        if (live[s]) {
          float n2 = 0.0f;
          bool finite = true;
#pragma unroll
          for (int j = 0; j < SD; ++j) n2 = fmaf(x[s][j], x[s][j], n2), finite &= isfinite(x[s][j]);
          const float r = sqrtf(n2) + cmax, r2 = r * r;
          if (finite) {
            bool full = !(r2 < 1e36f);
            if (!full) {
              // twice the first-order bound: fast scores err ≤ (2d+2)·u·(O + R²) each, oracle
              // distances ≤ (d+2)·u·R² each, + u·(O + R²) for rounding thr
              const float margin =
                  5.9604645e-8f * (float(12 * SD + 17) * r2 + float(8 * SD + 9) * off) + 1e-30f;
              const float thr = __int_as_float(m1[s] & ~idmask) - margin;
              const bool others_out = m2[s] < 0 ? thr >= 0.0f : __int_as_float(m2[s] | idmask) < thr;
              full = !(m1[s] >= 0 && others_out);
              if (!full) {
                const int ch = (m1[s] & idmask) * kChunk;
                uint32_t mask = 0;
#pragma unroll
                for (int c = 0; c < kChunk; ++c) {
                  const float sc = fast_score<SD>(x[s], s_cb2, ch + c, __fadd_rn(s_nn[ch + c], off));
                  mask |= uint32_t(sc >= thr) << c;
                }
                if (__popc(mask) == 1) {
                  code = ch + __ffs(mask) - 1;
                } else {
                  float bst = INFINITY;
                  code = ch;
                  oracle_scan<SD>(x[s], sd.cb, ch, ch + kChunk, bst, code);
                }
              }
            }
            if (full) {
              float bst = INFINITY;
              code = 0;
              const float thr = __int_as_float(m1[s] & ~idmask) -
                                5.9604645e-8f * (float(12 * SD + 17) * r2 + float(8 * SD + 9) * off) - 1e-30f;
              if (r2 < 1e36f && m1[s] >= 0) {  // thr is then below the best fast score
                // every centroid within the margin, by its fast score, re-ranked by the oracle (ascending
                // index, strict <: ties to the lowest)
                for (int c = 0; c < nC; ++c) {
                  if (fast_score<SD>(x[s], s_cb2, c, __fadd_rn(s_nn[c], off)) >= thr) {
                    float v[SD];
                    load_centroid<SD>(sd.cb, c, v);
                    const float e = oracle_dist<SD>(x[s], v);
                    if (e < bst) bst = e, code = c;
                  }
                }
              } else {
                oracle_scan<SD>(x[s], sd.cb, 0, nC, bst, code);
              }
            }
          }
        }
        cc[s * 32 + lane] = uint32_t(code);
      }
    }
    __syncwarp();
    // 6. code rows: lanes own (token, word) pairs
    for (int w = lane; w < TPJ * row_words; w += 32) {
      const int tt = w / row_words, wi = w - tt * row_words;
      if (th0 + tt >= n_th || !sd.codes) continue;
      const Pos q = pos_after(q0, tt, p.n_kv_heads, p.n_new);
      const int L0 = p.seq_len[q.b];
      const int pos = L0 + q.i;
      const int rcn = min(p.residual_length, (p.res_count ? p.res_count[q.b] : 0) + p.n_new);
      const bool in_win = pos >= L0 + p.n_new - rcn;
      if (p.codes_ring && !in_win) continue;
      const int64_t slot = p.codes_ring ? pos % p.code_cap : pos;
      if (slot < p.code_cap) {
        const uint32_t* cs = cc + tt * kNSub;
        const int bit0 = 32 * wi;
        uint32_t word = 0;
        for (int i = bit0 / sd.bits; i < kNSub && i * sd.bits < bit0 + 32; ++i) {
          const int sh = i * sd.bits - bit0;
          word |= sh >= 0 ? (cs[i] << sh) : (cs[i] >> (-sh));
        }
        const int64_t bh = int64_t(q.b) * p.n_kv_heads + q.kvh;
        reinterpret_cast<uint32_t*>(sd.codes + (bh * p.code_cap + slot) * sd.row_stride)[wi] = word;
      } else if (wi == 0 && p.error_flag) {
        atomicExch(p.error_flag, 1);
      }
    }
    // 7. exact window rows, and dequantized rows of tokens born outside the window
    if (sd.win) {
      bool any_deq = false;
      for (int tt = 0; tt < TPJ; ++tt) {
        if (th0 + tt >= n_th) break;
        const Pos q = pos_after(q0, tt, p.n_kv_heads, p.n_new);
        const int L0 = p.seq_len[q.b];
        const int pos = L0 + q.i;
        const int rcn = min(p.residual_length, (p.res_count ? p.res_count[q.b] : 0) + p.n_new);
        const bool in_win = pos >= L0 + p.n_new - rcn;
        const int64_t bh = int64_t(q.b) * p.n_kv_heads + q.kvh;
        if (in_win) {
          const int64_t slot = p.win_ring ? pos % p.win_cap : pos;
          if (slot < p.win_cap) {
            uint16_t* dst = static_cast<uint16_t*>(sd.win) + (bh * p.win_cap + slot) * D;
            for (int d = lane; d < D; d += 32) {
              const float v = load_f(sd.src.data, sd.src.dtype,
                                     q.b * sd.src.stride[0] + q.kvh * sd.src.stride[1] + q.i * sd.src.stride[2] +
                                         d * sd.src.stride[3]);
              dst[d] = f_to_store16(v, p.win_bf16);
            }
          } else if (lane == 0 && p.error_flag) {
            atomicExch(p.error_flag, 1);
          }
        }
        any_deq |= p.deq_outside && !in_win;
      }
      if (any_deq) {
        float* const xs = s_x + warp * TPJ * D;
        for (int idx = lane; idx < TPJ * D; idx += 32) {
          const int tt = idx / D, d = idx % D;
          xs[idx] = sd.cb[size_t(cc[tt * kNSub + d / SD]) * SD + d % SD];
        }
        __syncwarp();
        if (had) warp_fwht<D, TPJ>(xs, lane, p.hadamard_scale);
        for (int tt = 0; tt < TPJ; ++tt) {
          if (th0 + tt >= n_th) break;
          const Pos q = pos_after(q0, tt, p.n_kv_heads, p.n_new);
          const int L0 = p.seq_len[q.b], pos = L0 + q.i;
          const int rcn = min(p.residual_length, (p.res_count ? p.res_count[q.b] : 0) + p.n_new);
          if (pos >= L0 + p.n_new - rcn) continue;
          if (pos >= p.win_cap) {
            if (lane == 0 && p.error_flag) atomicExch(p.error_flag, 1);
            continue;
          }
          uint16_t* dst =
              static_cast<uint16_t*>(sd.win) + ((int64_t(q.b) * p.n_kv_heads + q.kvh) * p.win_cap + pos) * D;
          for (int d = lane; d < D; d += 32) {
            float v = xs[tt * D + d];
            if (keys && p.lambda) v = __fmul_rn(v, p.lambda[q.kvh * D + d]);
            dst[d] = f_to_store16(v, p.win_bf16);
          }
        }
      }
    }
    __syncwarp();
  }
}

/// One warp per (token, kv head): rows of codes → dequantized rows (keys inverse-transformed).
/// evict: positions [L − rc, min(L, L + n − min(R, rc + n))) per batch row, at most n each;
/// else positions [t0, t0 + n).
template <int D, int SD>
__global__ void __launch_bounds__(256) vq_dequant_kernel(const EncodeParams p, int evict, int64_t t0, int64_t n,
                                                         int keys_only_side) {
  __shared__ float s_x[kEncWarps][D];
  __shared__ uint32_t s_c[kEncWarps][D / SD];
  const bool keys = keys_only_side >= 0 ? keys_only_side == 1 : blockIdx.y == 0;
  const Side sd = side_of(p, keys);
  if (sd.sub != SD || gated(p.gate)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kNSub = D / SD;
  const int64_t items = int64_t(p.batch) * p.n_kv_heads * n;
  for (int64_t it = int64_t(blockIdx.x) * kEncWarps + warp; it < items; it += int64_t(gridDim.x) * kEncWarps) {
    const Pos q = decompose(it, p.n_kv_heads, int(n));
    int64_t pos;
    if (evict) {
      const int L = p.seq_len[q.b], rc = p.res_count ? p.res_count[q.b] : 0;
      const int rcn = min(p.residual_length, rc + p.n_new);
      const int first = L - rc, last = min(L, L + p.n_new - rcn);
      pos = first + q.i;
      if (pos >= last) continue;
    } else {
      pos = t0 + q.i;
    }
    const int64_t bh = int64_t(q.b) * p.n_kv_heads + q.kvh;
    const int64_t cslot = p.codes_ring ? pos % p.code_cap : pos;
    const uint8_t* row = sd.codes + (bh * p.code_cap + cslot) * sd.row_stride;
    for (int m = lane; m < kNSub; m += 32) {
      const int bit = m * sd.bits;
      const uint32_t* w = reinterpret_cast<const uint32_t*>(row) + (bit >> 5);
      const int o = bit & 31;
      const uint32_t lo = w[0];
      const uint32_t hi = (o + sd.bits > 32) ? w[1] : 0u;
      s_c[warp][m] = __funnelshift_r(lo, hi, o) & ((1u << sd.bits) - 1u);
    }
    __syncwarp();
    for (int d = lane; d < D; d += 32) s_x[warp][d] = sd.cb[size_t(s_c[warp][d / SD]) * SD + d % SD];
    __syncwarp();
    if (keys && p.use_hadamard) warp_fwht<D, 1>(s_x[warp], lane, p.hadamard_scale);
    if (pos < p.win_cap) {
      uint16_t* dst = static_cast<uint16_t*>(sd.win) + (bh * p.win_cap + pos) * D;
      for (int d = lane; d < D; d += 32) {
        float v = s_x[warp][d];
        if (keys && p.lambda) v = __fmul_rn(v, p.lambda[q.kvh * D + d]);
        dst[d] = f_to_store16(v, p.win_bf16);
      }
    } else if (lane == 0 && p.error_flag) {
      atomicExch(p.error_flag, 1);
    }
    __syncwarp();
  }
}

/// N consecutive floats from global memory (read-only), in 16-byte loads (one 8-byte load for N =
/// 2): src must be aligned to 4·min(N, 4) bytes. A lane's centroid elements or λ then cost one
/// load instruction per 16 bytes, not one per float (run 173).
template <int N>
__device__ __forceinline__ void ldg_floats(const float* src, float* dst) {
  static_assert(N == 1 || N == 2 || N % 4 == 0, "1, 2 or a multiple of 4 floats");
  if constexpr (N == 1) {
    dst[0] = __ldg(src);
  } else if constexpr (N == 2) {
    const float2 f = __ldg(reinterpret_cast<const float2*>(src));
    dst[0] = f.x, dst[1] = f.y;
  } else {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(src) + k);
      dst[4 * k] = f.x, dst[4 * k + 1] = f.y, dst[4 * k + 2] = f.z, dst[4 * k + 3] = f.w;
    }
  }
}

/// materialize_launch: every held position of every (batch, kv head) as an exact row. One warp per
/// row, lane l holding elements [l·E, l·E + E) (E = D / 32) in registers: window rows copied as
/// stored, coded ones dequantized (the lane's codes, its centroid elements, for keys the FWHT
/// across the warp by shuffles, the 1/sqrt(D) scale and λ) and stored in one vector store. U rows
/// a warp at a time, and every load of a row issued before any is used: the lengths, the code
/// words and the ring's row do not depend on each other (codes and ring slots exist for every
/// position below the capacity), so a row costs two dependent round trips (those loads, then the
/// centroids) instead of four (runs 169-170: 0.5-0.7 TB/s of rows written with the chain).
/// Centroid elements and λ come in 16-byte loads (ldg_floats), λ only when a row is written
/// (run 173), and the key rows' inverse transform outside any branch (run 175).
// blocks of 256 a multiprocessor: as many as fit without spilling (ptxas, sm_90: 64-80
// registers at head_dim <= 128, 105-110 at 256; four blocks spilled <128, 4>)
template <int D, int SD>
constexpr int kMaterializeBlocks = D <= 128 ? 3 : 2;
template <int D, int SD>
__global__ void __launch_bounds__(256, kMaterializeBlocks<D, SD>) vq_materialize_kernel(const EncodeParams p, int64_t n) {
  constexpr int E = D / 32, U = 4;
  constexpr int NS = E >= SD ? E / SD : 1;  // sub-vectors a lane touches
  constexpr int EP = E >= SD ? SD : E;      // its elements of each
  using Vec = typename std::conditional<E == 2, uint32_t, typename std::conditional<E == 4, uint2, uint4>::type>::type;
  static_assert(sizeof(Vec) == size_t(E) * 2, "a lane's part of a 16-bit row");
  const bool keys = blockIdx.y == 0;
  const Side sd = side_of(p, keys);
  if (sd.sub != SD) return;
  const int lane = threadIdx.x & 31;
  constexpr int kWarps = 8;  // blockDim.x = 256
  const int64_t items = int64_t(p.batch) * p.n_kv_heads * n;
  const uint32_t mask = (1u << sd.bits) - 1u;
  const uint16_t* ring = static_cast<const uint16_t*>(keys ? p.k_ring : p.v_ring);
  // The loop runs over the block's groups of kWarps·U rows (a trip count that depends on the
  // block alone; rows past the end are clamped and their stores dropped): run 176, -2% against
  // a per-warp grid-stride bound.
  for (int64_t g0 = int64_t(blockIdx.x) * kWarps * U; g0 < items; g0 += int64_t(gridDim.x) * kWarps * U) {
    const int64_t base = g0 + (threadIdx.x >> 5) * U;
    int L[U], w[U], kvh[U], bh[U], pos[U];  // 32-bit: the host checks batch·n_kv_heads·n < 2^31
    Vec win[U];
    uint32_t lo[U][NS], hi[U][NS];
    // the U rows' (batch, head, position): one division per group, the next rows by increments
    // unless the group crosses a (batch, head) (warp-uniform either way)
    const Pos q0 = decompose(min(base, items - 1), p.n_kv_heads, int(n));
    const bool one_head = q0.i + U <= n;
    const int slot0 = p.ring_cap > 0 ? q0.i % p.ring_cap : 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of the U rows
      Pos q = {q0.b, q0.kvh, q0.i + u};
      int slot = slot0 + u;
      if (!one_head) {
        q = decompose(min(base + u, items - 1), p.n_kv_heads, int(n));  // (a duplicate of the last row is dropped below)
        slot = p.ring_cap > 0 ? q.i % p.ring_cap : 0;
      } else if (slot >= p.ring_cap) {  // (slot0 < ring_cap, u < U)
        slot = p.ring_cap >= U ? slot - p.ring_cap : slot % p.ring_cap;
      }
      bh[u] = q.b * p.n_kv_heads + q.kvh;
      kvh[u] = q.kvh;
      pos[u] = base + u < items ? q.i : -1;
      L[u] = __ldg(p.seq_len + q.b);
      w[u] = p.res_count ? __ldg(p.res_count + q.b) : 0;
      if (ring != nullptr)  // (whether the row is a window row is known once its length lands)
        win[u] = __ldg(reinterpret_cast<const Vec*>(ring + (int64_t(bh[u]) * p.ring_cap + slot) * D) + lane);
      const uint32_t* row = reinterpret_cast<const uint32_t*>(sd.codes + (int64_t(bh[u]) * p.code_cap + q.i) * sd.row_stride);
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int bit = ((lane * E) / SD + s) * sd.bits, o = bit & 31;
        lo[u][s] = __ldg(row + (bit >> 5));
        hi[u][s] = (o + sd.bits > 32) ? __ldg(row + (bit >> 5) + 1) : 0u;
      }
    }
    float y[U][E];
#pragma unroll
    for (int u = 0; u < U; ++u)  // the centroids (also for rows that turn out not to need them)
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int o = (((lane * E) / SD + s) * sd.bits) & 31;
        const uint32_t code = __funnelshift_r(lo[u][s], hi[u][s], o) & mask;
        ldg_floats<EP>(sd.cb + size_t(code) * SD + (E >= SD ? 0 : (lane * E) % SD), &y[u][s * EP]);
      }
    // Rows in turn, every row's inverse transform done whether or not it is written (window or
    // dead rows), only the store predicated: no branch on loaded values around the shuffles.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (keys && p.use_hadamard) {
        warp_fwht_row<E, true>(y[u], lane);
#pragma unroll
        for (int j = 0; j < E; ++j) y[u][j] = __fmul_rn(y[u][j], p.hadamard_scale);
      }
      // λ last: a 4-byte-per-channel table that stays in L1, so holding it from the first round
      // of loads would only cost registers (and with them occupancy)
      float lam[E];
      if (keys && p.lambda) {
        ldg_floats<E>(p.lambda + kvh[u] * D + lane * E, lam);
      } else {
#pragma unroll
        for (int j = 0; j < E; ++j) lam[j] = 1.0f;
      }
      uint16_t h[E];
#pragma unroll
      for (int j = 0; j < E; ++j) h[j] = f_to_store16(__fmul_rn(y[u][j], lam[j]), p.win_bf16);
      Vec out;
      memcpy(&out, h, sizeof(out));
      const int wn = min(p.residual_length, w[u]);
      if (pos[u] >= L[u] - wn) out = win[u];  // an exact window row, as stored
      if (pos[u] >= 0 && pos[u] < L[u])
        reinterpret_cast<Vec*>(static_cast<uint16_t*>(sd.win) + (int64_t(bh[u]) * p.win_cap + pos[u]) * D)[lane] = out;
    }
  }
}

/// materialize_launch, lanes-per-row form (the default since run 180; run 179 measured it ~25%
/// faster than vq_materialize_kernel: ~104 against ~136 us to expand 33280 tokens on an H100): a
/// row over LPR = D / 16 lanes, 16 consecutive elements a lane, so a warp instruction serves
/// 32 / LPR rows and the per-row bookkeeping (the row's indices, lengths, addresses, window
/// test) that the warp-a-row kernel repeats in all 32 lanes (~100 of its ~180 warp instructions
/// a row, run 175's SASS) is shared by 32 / LPR rows.
/// The key FWHT: bits 0-3 in the lane, bits 4.. across the row's lanes by shuffles (the same
/// ascending order of stages as warp_fwht_row: the same sums). U passes of 32 / LPR rows a warp
/// with every load issued before any is used, as in vq_materialize_kernel.
///
/// Head dims that are not powers of two (80, 96, 112, 160, 192: LPR 5, 6, 7, 10, 12 lanes a row,
/// 6, 5, 4, 3, 2 rows a warp, its last 2, 2, 4, 2, 8 lanes idle): the rotation is block-diagonal
/// (hadamard.h: blocks of B = 16, 32, 16, 32, 64), so a lane's 16 elements lie in one block, and
/// only the stages within a block cross lanes (m < B / 16: a row's lanes start at a multiple of
/// LPR, itself a multiple of B / 16, so lane ^ m stays in the row and block).
template <int D, int SD>
__global__ void __launch_bounds__(256, 2) vq_materialize_lanes_kernel(const EncodeParams p, int64_t n) {
  constexpr int EL = 16, LPR = D / EL, RW = 32 / LPR, U = 2, NS = EL / SD, kWarps = 8;
  constexpr int kBL = (D & -D) / EL;  // lanes a Hadamard block spans (LPR for powers of two)
  static_assert(D % EL == 0 && LPR >= 4 && LPR <= 32 && LPR % kBL == 0,
                "head_dim a multiple of 16 from 64 to 512 (a row's lanes start at a multiple of a block's)");
  const bool keys = blockIdx.y == 0;
  const Side sd = side_of(p, keys);
  if (sd.sub != SD) return;
  const int lane = threadIdx.x & 31, sub = lane % LPR, rsel = lane / LPR;
  const bool idle = rsel >= RW;  // (32 % LPR lanes past the warp's last row: head dims not powers of two)
  const int64_t items = int64_t(p.batch) * p.n_kv_heads * n;
  const uint32_t mask = (1u << sd.bits) - 1u;
  const uint16_t* ring = static_cast<const uint16_t*>(keys ? p.k_ring : p.v_ring);
  constexpr int kRowsPerGroup = kWarps * RW * U;
  for (int64_t g0 = int64_t(blockIdx.x) * kRowsPerGroup; g0 < items; g0 += int64_t(gridDim.x) * kRowsPerGroup) {
    const int64_t wbase = g0 + int64_t(threadIdx.x >> 5) * RW * U;
    int L[U], w[U], kvh[U], bh[U], pos[U];
    uint4 win[U][2];  // the lane's 16 window elements (32 bytes)
    uint32_t lo[U][NS], hi[U][NS];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of the lane's U rows
      const int64_t it = wbase + u * RW + rsel;
      const Pos q = decompose(min(it, items - 1), p.n_kv_heads, int(n));
      bh[u] = q.b * p.n_kv_heads + q.kvh;
      kvh[u] = q.kvh;
      pos[u] = it < items && !idle ? q.i : -1;
      L[u] = __ldg(p.seq_len + q.b);
      w[u] = p.res_count ? __ldg(p.res_count + q.b) : 0;
      win[u][0] = win[u][1] = make_uint4(0, 0, 0, 0);
      if (ring != nullptr) {
        const uint4* src = reinterpret_cast<const uint4*>(ring + (int64_t(bh[u]) * p.ring_cap + q.i % p.ring_cap) * D + sub * EL);
        win[u][0] = __ldg(src);
        win[u][1] = __ldg(src + 1);
      }
      const uint32_t* row = reinterpret_cast<const uint32_t*>(sd.codes + (int64_t(bh[u]) * p.code_cap + q.i) * sd.row_stride);
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int bit = (sub * NS + s) * sd.bits, o = bit & 31;
        lo[u][s] = __ldg(row + (bit >> 5));
        hi[u][s] = (o + sd.bits > 32) ? __ldg(row + (bit >> 5) + 1) : 0u;
      }
    }
    float y[U][EL];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int o = ((sub * NS + s) * sd.bits) & 31;
        const uint32_t code = __funnelshift_r(lo[u][s], hi[u][s], o) & mask;
        ldg_floats<SD>(sd.cb + size_t(code) * SD, &y[u][s * SD]);
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (keys && p.use_hadamard) {
#pragma unroll
        for (int h = 1; h < EL; h <<= 1)
#pragma unroll
          for (int j = 0; j < EL; ++j)
            if ((j & h) == 0) {
              const float a = y[u][j], c = y[u][j + h];
              y[u][j] = a + c, y[u][j + h] = a - c;
            }
#pragma unroll
        for (int m = 1; m < kBL; m <<= 1) {  // lanes of one block differ in their low log2(kBL) bits
          const float sgn = (lane & m) ? -1.0f : 1.0f;
#pragma unroll
          for (int j = 0; j < EL; ++j) y[u][j] = __fmaf_rn(sgn, y[u][j], __shfl_xor_sync(0xffffffffu, y[u][j], m));
        }
#pragma unroll
        for (int j = 0; j < EL; ++j) y[u][j] = __fmul_rn(y[u][j], p.hadamard_scale);
      }
      float lam[EL];
      if (keys && p.lambda) {
        ldg_floats<EL>(p.lambda + kvh[u] * D + sub * EL, lam);
      } else {
#pragma unroll
        for (int j = 0; j < EL; ++j) lam[j] = 1.0f;
      }
      uint32_t hw[EL / 2];
#pragma unroll
      for (int j = 0; j < EL / 2; ++j)
        hw[j] = uint32_t(f_to_store16(__fmul_rn(y[u][2 * j], lam[2 * j]), p.win_bf16)) |
                uint32_t(f_to_store16(__fmul_rn(y[u][2 * j + 1], lam[2 * j + 1]), p.win_bf16)) << 16;
      uint4 out0 = make_uint4(hw[0], hw[1], hw[2], hw[3]), out1 = make_uint4(hw[4], hw[5], hw[6], hw[7]);
      const int wn = min(p.residual_length, w[u]);
      if (pos[u] >= L[u] - wn) out0 = win[u][0], out1 = win[u][1];  // an exact window row, as stored
      if (pos[u] >= 0 && pos[u] < L[u]) {
        uint4* dst = reinterpret_cast<uint4*>(static_cast<uint16_t*>(sd.win) + (int64_t(bh[u]) * p.win_cap + pos[u]) * D + sub * EL);
        dst[0] = out0;
        dst[1] = out1;
      }
    }
  }
}

__global__ void append_rows_kernel(DevTensor4 src, int batch, int n_kv_heads, int n_new, int head_dim, void* dst,
                                   int dst_bf16, int64_t cap, const int32_t* seq_len, int* error_flag,
                                   const int* gate) {
  grid_dep_launch_dependents();  // a decode step's attention may start now (it waits for this kernel's writes)
  if (gated(gate)) return;
  const int64_t total = int64_t(batch) * n_kv_heads * n_new * head_dim;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int d = int(idx % head_dim);
    const int64_t r = idx / head_dim;
    const int i = int(r % n_new);
    const int64_t bh = r / n_new;
    const int b = int(bh / n_kv_heads), h = int(bh % n_kv_heads);
    const int64_t pos = int64_t(seq_len[b]) + i;
    if (pos >= cap) {
      if (error_flag) atomicExch(error_flag, 1);
      continue;
    }
    const float v = load_f(src.data, src.dtype, b * src.stride[0] + h * src.stride[1] + i * src.stride[2] + d * src.stride[3]);
    static_cast<uint16_t*>(dst)[(bh * cap + pos) * head_dim + d] = f_to_store16(v, dst_bf16);
  }
}

__global__ void check_range_kernel(DevTensor4 keys, DevTensor4 values, int64_t d1, int64_t d2, int64_t d3,
                                   int64_t total, float limit, int* flags, int tag, const int* gate, int* host_flags) {
  if (gated(gate)) return;  // an earlier queued check failed: its tag is the one to report
  const int w = blockIdx.y;  // 0: keys, 1: values
  const DevTensor4& t = w == 0 ? keys : values;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i3 = idx % d3, r2 = idx / d3, i2 = r2 % d2, r1 = r2 / d2, i1 = r1 % d1, i0 = r1 / d1;
    const float x = load_f(t.data, t.dtype, i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2] + i3 * t.stride[3]);
    if (out_of_range(x, limit)) report_range(flags, host_flags, w, tag);
  }
}

// The overlapped decode step's first launch (window_rows_launch): every new token-head's exact
// row into the window, as the encode kernel writes it (same slot rule, same rounding), and the
// lengths copied for the step's encode, which runs beside the attention that advances them.
//
// With the step's range check (chk.flags), one block: it reads every element of k_new and v_new
// before it writes any, and writes nothing when one is non-finite or beyond the storage range
// (the flags then gate the step's other kernels). A thread keeps its first kHold elements per
// side in registers from the check to the write, so a decode-sized step (batch x 8 heads x 128
// dims per side, up to 4 per thread of 1024 at batch 4) costs one round trip, as without the
// check; a separate check launch had cost the graph-captured step ~3-4 us (run 109).
constexpr int kWinHold = 4;
__global__ void window_rows_kernel(const EncodeParams p, int32_t* snap_len, int32_t* snap_rc, StepCheck chk) {
  grid_dep_launch_dependents();  // the step's attention may start now (it waits for this kernel's writes)
  if (gated(p.gate)) return;  // an earlier queued range check failed: nothing written
  const int D = p.head_dim;
  const int64_t per_side = int64_t(p.batch) * p.n_kv_heads * p.n_new * D;
  struct Where {
    int b, h, i, d;
    int64_t bh;
  };
  auto where = [&](int64_t j) {
    const int d = int(j % D);
    const int64_t r = j / D;
    const int i = int(r % p.n_new);
    const int64_t bh = r / p.n_new;
    return Where{int(bh / p.n_kv_heads), int(bh % p.n_kv_heads), i, d, bh};
  };
  auto load = [&](bool keys, const Where& w) {
    const DevTensor4& src = keys ? p.k : p.v;
    return load_f(src.data, src.dtype, w.b * src.stride[0] + w.h * src.stride[1] + w.i * src.stride[2] + w.d * src.stride[3]);
  };
  auto store = [&](bool keys, const Where& w, float v) {
    void* const win = keys ? p.k_win : p.v_win;
    if (!win) return;
    const int L0 = p.seq_len[w.b], pos = L0 + w.i;
    const int rcn = min(p.residual_length, (p.res_count ? p.res_count[w.b] : 0) + p.n_new);
    if (pos < L0 + p.n_new - rcn) return;  // not in the window (the caller's plan excludes this)
    const int64_t slot = p.win_ring ? pos % p.win_cap : pos;
    if (slot >= p.win_cap) {
      if (w.d == 0 && p.error_flag) atomicExch(p.error_flag, 1);
      return;
    }
    static_cast<uint16_t*>(win)[(w.bh * p.win_cap + slot) * D + w.d] = f_to_store16(v, p.win_bf16);
  };
  if (chk.flags) {
    float hk[kWinHold], hv[kWinHold];
    int bad_k = 0, bad_v = 0;
#pragma unroll
    for (int u = 0; u < kWinHold; ++u) {
      const int64_t j = threadIdx.x + int64_t(u) * blockDim.x;
      hk[u] = hv[u] = 0.0f;
      if (j < per_side) {
        const Where w = where(j);
        hk[u] = load(true, w), hv[u] = load(false, w);
      }
    }
    for (int64_t j = threadIdx.x + int64_t(kWinHold) * blockDim.x; j < per_side; j += blockDim.x) {
      const Where w = where(j);
      bad_k |= out_of_range(load(true, w), chk.limit);
      bad_v |= out_of_range(load(false, w), chk.limit);
    }
#pragma unroll
    for (int u = 0; u < kWinHold; ++u) bad_k |= out_of_range(hk[u], chk.limit), bad_v |= out_of_range(hv[u], chk.limit);
    bad_k = __syncthreads_or(bad_k);
    bad_v = __syncthreads_or(bad_v);
    if (bad_k | bad_v) {
      if (threadIdx.x < 2 && (threadIdx.x == 0 ? bad_k : bad_v)) report_range(chk.flags, chk.host_flags, threadIdx.x, chk.tag);
      return;
    }
    for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {
      snap_len[b] = p.seq_len[b];
      snap_rc[b] = p.res_count ? p.res_count[b] : 0;
    }
#pragma unroll
    for (int u = 0; u < kWinHold; ++u) {
      const int64_t j = threadIdx.x + int64_t(u) * blockDim.x;
      if (j < per_side) {
        const Where w = where(j);
        store(true, w, hk[u]), store(false, w, hv[u]);
      }
    }
    for (int64_t j = threadIdx.x + int64_t(kWinHold) * blockDim.x; j < per_side; j += blockDim.x) {
      const Where w = where(j);
      store(true, w, load(true, w)), store(false, w, load(false, w));
    }
    return;
  }
  if (blockIdx.x == 0)
    for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {
      snap_len[b] = p.seq_len[b];
      snap_rc[b] = p.res_count ? p.res_count[b] : 0;
    }
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < 2 * per_side;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const bool keys = idx < per_side;
    // the input element first: its load and the lengths' are in flight together
    const Where w = where(keys ? idx : idx - per_side);
    store(keys, w, load(keys, w));
  }
}

__global__ void advance_kernel(int32_t* seq_len, int32_t* res_count, int batch, int n_new, int R, const int* gate) {
  if (gated(gate)) return;
  for (int b = threadIdx.x; b < batch; b += blockDim.x) {
    seq_len[b] += n_new;
    if (res_count) res_count[b] = min(R, res_count[b] + n_new);
  }
}

template <int D, int SD, int SPL, int CS>
void encode_t(const EncodeParams& p, cudaStream_t s) {
  constexpr int kNSub = D / SD, TPJ = 32 * SPL / kNSub;
  const int nmax = 1 << (p.k_sub == SD && p.v_sub == SD ? (p.k_bits > p.v_bits ? p.k_bits : p.v_bits)
                                                        : (p.k_sub == SD ? p.k_bits : p.v_bits));
  const int64_t n_th = int64_t(p.batch) * p.n_kv_heads * p.n_new;
  const int64_t jobs = (n_th + TPJ - 1) / TPJ;
  EncodeParams q = p;
  if (CS > 1) {  // decode mode: dec_slices blocks per token group where a workspace is given
    if (!(q.dec_ws_best && q.dec_ws_code && q.dec_ws_count) || q.dec_slices < 1) q.dec_slices = 1;
    // no more blocks than the launch's largest codebook can use (>= 64 centroids per warp):
    // 256-entry codebooks keep one block per group (run 37: empty blocks cost ~1.5 us)
    q.dec_slices = dec_blocks(nmax, q.dec_slices, CS);
  }
  // the centroids one block stages: a sliced decode-mode block holds its slice only (the
  // kernel's NB rule, per side of this sub_dim), so 4096-entry codebooks take 10 KB, not 80,
  // and blocks pack onto whatever multiprocessors attention leaves free (overlapped steps)
  int staged = nmax;
  if (CS > 1 && q.dec_slices > 1 && jobs <= q.dec_ws_jobs) {
    staged = 0;
    for (const bool keys : {true, false})
      if ((keys ? p.k_sub : p.v_sub) == SD && (p.sides & (keys ? 1 : 2))) {
        const int nc = 1 << (keys ? p.k_bits : p.v_bits);
        staged = std::max(staged, nc / dec_blocks(nc, q.dec_slices, CS));
      }
    staged = std::max(staged, 1);
  }
  const size_t smem = size_t(staged) * (SD + 1) * 4 + size_t(kEncWarps) * TPJ * D * 4 +
                      size_t(kEncWarps) * TPJ * kNSub * 4 + size_t(kEncWarps) * 32 * SPL * 8;
  auto kern = vq_encode_kernel<D, SD, SPL, CS>;
  raise_smem_limit(reinterpret_cast<const void*>(kern), smem);  // once per device (a decode step may be captured)
  int blocks;
  if (CS == 1) {
    int per_sm = 1;
    VQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 256, smem));
    blocks = int(std::min<int64_t>((jobs + kEncWarps - 1) / kEncWarps, int64_t(device_sms()) * std::max(per_sm, 1)));
  } else {  // decode mode: dec_slices blocks per token group (the grid loops over further groups)
    blocks = int(std::min<int64_t>(jobs, 65535 / q.dec_slices)) * q.dec_slices;
  }
  dim3 grid(std::max(blocks, 1), 2);  // y: keys, values (a block whose side has another sub_dim exits)
  kern<<<grid, 256, smem, s>>>(q);
  VQ_CUDA_CHECK(cudaGetLastError());
}

template <int D, int SD, int SPL, bool GRID = false>
void encode_bulk_t(const EncodeParams& p, cudaStream_t s) {
  constexpr int kNSub = D / SD, TPJ = 32 * SPL / kNSub;
  const int nmax = 1 << (p.k_sub == SD && p.v_sub == SD ? (p.k_bits > p.v_bits ? p.k_bits : p.v_bits)
                                                        : (p.k_sub == SD ? p.k_bits : p.v_bits));
  const size_t smem = size_t(nmax) * (SD + 1) * 4 + size_t(kEncWarps) * TPJ * kNSub * 4 +
                      (p.deq_outside ? size_t(kEncWarps) * TPJ * D * 4 : 0);
  auto kern = vq_encode_bulk_kernel<D, SD, SPL, GRID>;
  raise_smem_limit(reinterpret_cast<const void*>(kern), smem);  // once per device (a decode step may be captured)
  const int64_t n_th = int64_t(p.batch) * p.n_kv_heads * p.n_new;
  const int64_t jobs = (n_th + TPJ - 1) / TPJ;
  int per_sm = 1;
  VQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 256, smem));
  const int blocks =
      int(std::min<int64_t>((jobs + kEncWarps - 1) / kEncWarps, int64_t(device_sms()) * std::max(per_sm, 1)));
  dim3 grid(std::max(blocks, 1), 2);  // y: keys, values (a block whose side has another sub_dim exits)
  kern<<<grid, 256, smem, s>>>(p);
  VQ_CUDA_CHECK(cudaGetLastError());
}

template <int D, int SD>
void encode_sub(const EncodeParams& p, bool decode_mode, cudaStream_t s) {
  constexpr int kNSub = D / SD;
  constexpr int kSplDec = encode_lane_slots(kNSub, (kNSub + 31) / 32);
  constexpr int kSplBulk = encode_lane_slots(kNSub, 4);  // sub-vectors per lane (8 measured slower: run 2)
  const int bits = p.k_sub == SD ? p.k_bits : p.v_bits;
  // every asked side of this sub_dim has a candidate grid (a side without one would scan its
  // whole codebook with the oracle in the grid kernel)
  const bool grids = SD == 4 && (p.k_sub != SD || !(p.sides & 1) || p.k_grid.cells) &&
                     (p.v_sub != SD || !(p.sides & 2) || p.v_grid.cells);
  // decode steps keep the split scan: the grid kernel (one warp per token group, a dependent
  // global load per candidate word) took 17.3 us for 64 token-heads against its 11.5 us for
  // d4b8, and the graph step 65.6 against 53.1 (run 47); for d4b12 34.8 against 22.1 us, the
  // defaults' graph step 69.4 against 62.7 and the eager pair 100.6 against 64.4 (run 103)
  if (decode_mode && (1 << bits) >= 64) return encode_t<D, SD, kSplDec, 8>(p, s);
  if constexpr ((D & (D - 1)) != 0) {
    // head dims that are not powers of two (80, 96, 112, 160, 192): the first kernel only (the v2 and grid
    // kernels' in-register transform spans whole power-of-two rows)
    (void)grids;
    encode_t<D, SD, kSplBulk, 1>(p, s);
  } else {
    if constexpr (SD == 4)
      if (grids && p.bulk_variant == 1) return encode_bulk_t<D, SD, kSplBulk, true>(p, s);
    if (p.bulk_variant == 1 && (1 << bits) <= 256)
      encode_bulk_t<D, SD, kSplBulk>(p, s);  // larger codebooks: the previous kernel (faster there, run enc-1)
    else if (p.bulk_variant == 2) encode_bulk_t<D, SD, 8>(p, s);  // 8 slots per lane (timing variant)
    else encode_t<D, SD, kSplBulk, 1>(p, s);
  }
}

template <int D>
void encode_d(const EncodeParams& p, bool decode_mode, cudaStream_t s) {
  // keys and values may differ in sub_dim: each instantiation serves the side(s) it matches
  // (of those asked for: a launch for one side only skips the other side's sub_dim)
  const bool k = p.sides & 1, v = p.sides & 2;
  const bool has4 = (k && p.k_sub == 4) || (v && p.v_sub == 4), has8 = (k && p.k_sub == 8) || (v && p.v_sub == 8);
  if (has4) encode_sub<D, 4>(p, decode_mode, s);
  if (has8) encode_sub<D, 8>(p, decode_mode, s);
}

template <int D>
void dequant_d(const EncodeParams& p, int evict, int64_t t0, int64_t n, int side, cudaStream_t s) {
  const int64_t items = int64_t(p.batch) * p.n_kv_heads * n;
  const int blocks = int(std::min<int64_t>((items + kEncWarps - 1) / kEncWarps, 4096));
  dim3 grid(std::max(blocks, 1), side >= 0 ? 1 : 2);
  auto run = [&](auto kern) {
    kern<<<grid, 256, 0, s>>>(p, evict, t0, n, side);
    VQ_CUDA_CHECK(cudaGetLastError());
  };
  const bool has4 = p.k_sub == 4 || p.v_sub == 4, has8 = p.k_sub == 8 || p.v_sub == 8;
  if (has4) run(vq_dequant_kernel<D, 4>);
  if (has8) run(vq_dequant_kernel<D, 8>);
}

void check_encode_geometry(const EncodeParams& p) {
  VQ_CHECK_T(attn_plain_head_dim(p.head_dim), UnsupportedError,
             "CUDA VecInfer: head_dim " << p.head_dim << " is not supported (" << attn_head_dims_list() << ")");
  VQ_CHECK_T((p.k_sub == 4 || p.k_sub == 8) && (p.v_sub == 4 || p.v_sub == 8), UnsupportedError,
             "CUDA VecInfer: sub_dim must be 4 or 8 (key " << p.k_sub << ", value " << p.v_sub << ")");
  VQ_CHECK_T(p.k_bits >= 4 && p.k_bits <= 16 && p.v_bits >= 4 && p.v_bits <= 16, UnsupportedError,
             "CUDA VecInfer: codebook_bits must be in 4..16 (key " << p.k_bits << ", value " << p.v_bits << ")");
}

/// Calls f(std::integral_constant<int, D>{}) for the call's head_dim D (64, 128, 256, and the
/// plain attention kernel's kAnyHeadDims), or throws UnsupportedError naming `what` and the
/// head_dim: the one dispatch of the launches below.
template <class F>
void with_head_dim(int head_dim, const char* what, F&& f) {
  static_assert(sizeof(kAnyHeadDims) / sizeof(int) == 5 && kAnyHeadDims[0] == 80 && kAnyHeadDims[1] == 96 &&
                    kAnyHeadDims[2] == 112 && kAnyHeadDims[3] == 160 && kAnyHeadDims[4] == 192,
                "the cases below follow kAnyHeadDims");
  switch (head_dim) {
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    case 256: f(std::integral_constant<int, 256>{}); break;
    case 80: f(std::integral_constant<int, 80>{}); break;
    case 96: f(std::integral_constant<int, 96>{}); break;
    case 112: f(std::integral_constant<int, 112>{}); break;
    case 160: f(std::integral_constant<int, 160>{}); break;
    case 192: f(std::integral_constant<int, 192>{}); break;
    default: VQ_THROW(UnsupportedError, what << ": head_dim " << head_dim);
  }
}

}  // namespace

void encode_launch(const EncodeParams& p, bool decode_mode, void* stream) {
  check_encode_geometry(p);
  VQ_CHECK_VALUE(int64_t(p.batch) * p.n_kv_heads * std::max(p.n_new, 1) < (int64_t(1) << 31),
                 "CUDA encode: batch·n_kv_heads·n_new = " << int64_t(p.batch) * p.n_kv_heads * p.n_new
                                                          << " token-heads in one call (limit 2^31)");
  if (p.batch == 0 || p.n_new == 0 || p.n_kv_heads == 0) return;
  const cudaStream_t s = as_stream(stream);
  with_head_dim(p.head_dim, "CUDA encode", [&](auto d) { encode_d<decltype(d)::value>(p, decode_mode, s); });
}

void evict_launch(const EncodeParams& p, void* stream) {
  check_encode_geometry(p);
  if (p.batch == 0 || p.n_new == 0 || p.n_kv_heads == 0) return;
  const cudaStream_t s = as_stream(stream);
  with_head_dim(p.head_dim, "CUDA evict", [&](auto d) { dequant_d<decltype(d)::value>(p, 1, 0, p.n_new, -1, s); });
}

namespace {
std::atomic<int> g_materialize_lanes{1};  // run 179: the expansion ~25% faster
}  // namespace

int set_materialize_lanes(int on) { return g_materialize_lanes.exchange(on ? 1 : 0); }
bool materialize_lanes() { return g_materialize_lanes.load() != 0; }

template <int D>
void materialize_d(const EncodeParams& p, int64_t n, cudaStream_t s) {
  const int64_t items = int64_t(p.batch) * p.n_kv_heads * n;
  const int64_t blocks = std::min<int64_t>((items + 31) / 32, int64_t(1) << 20);  // 8 warps of 4 rows a block
  const dim3 grid(unsigned(std::max<int64_t>(blocks, 1)), 2);
  auto run = [&](auto kern) {
    kern<<<grid, 256, 0, s>>>(p, n);
    VQ_CUDA_CHECK(cudaGetLastError());
  };
  constexpr int64_t kLaneRows = 16 * (32 / (D / 16));  // rows a block: 8 warps x U (2) passes x 32 / (D / 16) rows
  const int64_t lane_blocks = std::min<int64_t>((items + kLaneRows - 1) / kLaneRows, int64_t(1) << 20);
  const dim3 lane_grid(unsigned(std::max<int64_t>(lane_blocks, 1)), 2);
  auto run_lanes = [&](auto kern) {  // 8 warps of U · 32 / LPR rows a block
    kern<<<lane_grid, 256, 0, s>>>(p, n);
    VQ_CUDA_CHECK(cudaGetLastError());
  };
  if (materialize_lanes() || (D & (D - 1)) != 0) {  // (80 ... 192: the lanes form only)
    if (p.k_sub == 4 || p.v_sub == 4) run_lanes(vq_materialize_lanes_kernel<D, 4>);
    if (p.k_sub == 8 || p.v_sub == 8) run_lanes(vq_materialize_lanes_kernel<D, 8>);
    return;
  }
  if constexpr ((D & (D - 1)) == 0) {
    if (p.k_sub == 4 || p.v_sub == 4) run(vq_materialize_kernel<D, 4>);
    if (p.k_sub == 8 || p.v_sub == 8) run(vq_materialize_kernel<D, 8>);
  }
}

void materialize_launch(const EncodeParams& p, int64_t n_max, void* stream) {
  check_encode_geometry(p);
  VQ_CHECK_VALUE(p.seq_len != nullptr && p.k_win != nullptr && p.v_win != nullptr && n_max <= p.win_cap &&
                     (p.residual_length == 0 || (p.k_ring != nullptr && p.v_ring != nullptr && p.ring_cap > 0)),
                 "CUDA materialize: lengths, destinations of " << p.win_cap << " rows (need " << n_max
                                                               << ") and the window's ring are required");
  VQ_CHECK_VALUE(int64_t(p.batch) * p.n_kv_heads * n_max < (int64_t(1) << 31),
                 "CUDA materialize: batch·n_kv_heads·tokens = " << int64_t(p.batch) * p.n_kv_heads * n_max
                                                                << " rows (limit 2^31)");
  if (p.batch == 0 || n_max == 0 || p.n_kv_heads == 0) return;
  const cudaStream_t s = as_stream(stream);
  with_head_dim(p.head_dim, "CUDA materialize", [&](auto d) { materialize_d<decltype(d)::value>(p, n_max, s); });
}

void dequant_launch(const EncodeParams& p, int64_t t0, int64_t n, bool keys, void* stream) {
  check_encode_geometry(p);
  if (p.batch == 0 || n == 0 || p.n_kv_heads == 0) return;
  const cudaStream_t s = as_stream(stream);
  const int side = keys ? 1 : 0;
  with_head_dim(p.head_dim, "CUDA dequant", [&](auto d) { dequant_d<decltype(d)::value>(p, 0, t0, n, side, s); });
}

void append_rows_launch(const DevTensor4& src, int batch, int n_kv_heads, int n_new, int head_dim, void* dst,
                        int dst_bf16, int64_t dst_cap, const int32_t* seq_len, int* error_flag, void* stream,
                        const int* gate) {
  const int64_t total = int64_t(batch) * n_kv_heads * n_new * head_dim;
  if (total == 0) return;
  const int blocks = int(std::min<int64_t>((total + 255) / 256, 65535));
  append_rows_kernel<<<blocks, 256, 0, as_stream(stream)>>>(src, batch, n_kv_heads, n_new, head_dim, dst, dst_bf16,
                                                            dst_cap, seq_len, error_flag, gate);
  VQ_CUDA_CHECK(cudaGetLastError());
}

void check_range_launch(const DevTensor4& keys, const DevTensor4& values, int64_t d0, int64_t d1, int64_t d2,
                        int64_t d3, float limit, int* flags, void* stream, int tag, const int* gate, int* host_flags) {
  VQ_CHECK_VALUE(tag != 0, "CUDA range check: the tag must be non-zero");
  const int64_t total = d0 * d1 * d2 * d3;
  if (total == 0) return;
  const dim3 grid(unsigned(std::min<int64_t>((total + 255) / 256, 2048)), 2);
  check_range_kernel<<<grid, 256, 0, as_stream(stream)>>>(keys, values, d1, d2, d3, total, limit, flags, tag, gate,
                                                          host_flags);
  VQ_CUDA_CHECK(cudaGetLastError());
}

void window_rows_launch(const EncodeParams& p, int32_t* snap_len, int32_t* snap_rc, void* stream,
                        const StepCheck& chk) {
  check_encode_geometry(p);
  VQ_CHECK_VALUE(p.seq_len && snap_len && snap_rc, "CUDA window rows: lengths and their snapshot are required");
  VQ_CHECK_VALUE(!chk.flags || chk.tag != 0, "CUDA window rows: the range check's tag must be non-zero");
  if (p.batch == 0 || p.n_kv_heads == 0) return;
  const int64_t total = 2 * int64_t(p.batch) * p.n_kv_heads * p.n_new * p.head_dim;
  // with the range check: one block, which must see every element before it writes any
  const int threads = chk.flags ? 1024 : 256;
  const int blocks = chk.flags ? 1 : int(std::clamp<int64_t>((total + 255) / 256, 1, 1024));
  window_rows_kernel<<<blocks, threads, 0, as_stream(stream)>>>(p, snap_len, snap_rc, chk);
  VQ_CUDA_CHECK(cudaGetLastError());
}

void advance_lengths_launch(int32_t* seq_len, int32_t* res_count, int batch, int n_new, int R, void* stream,
                            const int* gate) {
  if (batch == 0 || n_new == 0) return;
  advance_kernel<<<1, 128, 0, as_stream(stream)>>>(seq_len, res_count, batch, n_new, R, gate);
  VQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace veloxquant::cuda
