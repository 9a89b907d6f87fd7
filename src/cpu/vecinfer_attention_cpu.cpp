// src/cpu/vecinfer_attention_cpu.cpp — attention on VecInfer codes, optimised for CPU decode.
//
// Inputs (vecinfer_cache.h, VecInferAttentionInputs): key codes [batch, n_kv_heads, n_coded,
// key_code_bytes], value codes alike, an exact window (ring) of n_window tokens after them.
// Work is split as in attention_cpu (attention_kernels.h): (batch, kv head, block of 4 query
// rows, token chunk) units, each a two-pass partial softmax, merged by log-sum-exp.
//
// Keys (coded chunk). With q̃_r = (q_r ⊙ λ)·H·scale for the 4 rows of the block:
//   LUT path (codebook_bits <= 9, chunk >= n_centroids/2 tokens, to pay for the table):
//     LUT4[m][c][r] = q̃_r[m·d:(m+1)·d] · C_k[c]   ([n_sub, n_centroids, 4] f32)
//     score[t][r]  = Σ_m LUT4[m][code_{t,m}][r]   — one 16-byte load serves all 4 rows.
//   The table (128 KiB for d4b8) exceeds L1, so the m loop is blocked: MB sub-vectors whose
//   slices fit 32 KiB are done for 512 tokens before the next MB (scores accumulate in place).
//   Dequant path (otherwise, e.g. the default 12-bit keys, whose LUT would be 2 MiB): each
//   16-float slice of K̃_t is assembled in a register from 4 (d4) or 2 (d8) codebook rows and
//   dotted with the 4 rows, two tokens at a time (AVX-512; scalar elsewhere). A key codebook
//   on its int8 grid (the caches' default) is read as int8 rows (ProductQuantizer::codebook_i8,
//   16 KiB for d4b12 instead of 64: it stays in L1) against q̃·scale.
//   Codes that are not whole bytes are unpacked 16 at a time (AVX-512 VBMI byte permute); a
//   block of contiguous unpadded rows is unpacked as one stream (full-width loads).
// Values (coded chunk), after the chunk's scores became p = exp(s − max):
//   histogram path (codebook_bits <= 8, chunk >= 2·n_centroids tokens): T4[m][c][r] += p[t][r] for
//     c = code_{t,m} (one 16-byte read-modify-write per token and sub-vector, blocked like the
//     LUT), then o[r][m·d + e] = Σ_c T4[m][c][r]·C_v[c][e].
//   Dequant path (otherwise): o[r] += p[t][r]·V̂_t, 64 dims x 4 rows in registers (AVX-512).
// Window piece: dense_partial over the exact rows with the untransformed q (scale·q·K̂).
//
// The LUT build and histogram reduction use a codebook re-laid out as CX[e][c][4] (C[c][e]
// repeated over the 4 lanes), so 4 centroids × 4 rows are one 16-float vector.
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu/attention_kernels.h"
#include "cpu/simd_util.h"
#include "veloxquant/error.h"
#include "veloxquant/vecinfer_cache.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace veloxquant {
namespace detail {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kTokenBlock = 1024;    // tokens per inner block (codes + scores stay in L1/L2)
constexpr int64_t kMinChunk = 2048;      // smallest coded chunk worth its own unit
constexpr int64_t kTargetUnits = 16;     // split coded spans until about this many units exist
// Table paths only where they beat dequantizing (measured with `veloxquant bench`, 2 cores,
// 8192 to 131072 tokens): the key LUT up to 512 centroids (d4b10 keys: the int8 dequant kernel
// was 4-14% faster than a 512 KiB LUT), the value histogram up to 256 (d8b12 values: dequant
// 1.2-2.1x faster than a 1 MiB histogram, whose zeroing and reduction cost more than the tokens),
// and for 8 bits only from 2·n_centroids tokens on (384 tokens of d8b8 or d4b8 values: dequant
// 13-20% faster; from about 1024 the histogram wins).
constexpr int kMaxLutBits = 9;
constexpr int kMaxTableBits = 8;
constexpr size_t kL1Slice = 32 * 1024;   // bytes of table slice per m block

// ---- 4-lane float vector: SSE where present, plain floats elsewhere ----------------------------
#if defined(__SSE2__)
using F4 = __m128;
inline F4 f4_load(const float* p) { return _mm_loadu_ps(p); }
inline void f4_store(float* p, F4 x) { _mm_storeu_ps(p, x); }
inline F4 f4_add(F4 a, F4 b) { return _mm_add_ps(a, b); }
inline F4 f4_zero() { return _mm_setzero_ps(); }
#else
struct F4 {
  float v[4];
};
inline F4 f4_load(const float* p) { return {{p[0], p[1], p[2], p[3]}}; }
inline void f4_store(float* p, F4 x) { std::memcpy(p, x.v, 16); }
inline F4 f4_add(F4 a, F4 b) { return {{a.v[0] + b.v[0], a.v[1] + b.v[1], a.v[2] + b.v[2], a.v[3] + b.v[3]}}; }
inline F4 f4_zero() { return {{0, 0, 0, 0}}; }
#endif

// ---- LUT scores and histogram, blocked over m ----------------------------------------------
// idx: codes of n tokens, row stride istride (bytes for I = uint8_t, entries for uint16_t).
// NC > 0: the centroid count as a compile-time constant (table offsets become displacements,
// which frees the registers the runtime offsets would take); NC == 0: nc at run time.
template <int MB, int NC, typename I>
void lut_scores_t(const I* idx, int64_t istride, int64_t n, int n_sub, int nc_rt, const float* lut, float* S4) {
  const size_t nc = NC > 0 ? size_t(NC) : size_t(nc_rt);
  for (int m0 = 0; m0 < n_sub; m0 += MB) {
    const float* L = lut + size_t(m0) * nc * 4;
    for (int64_t t = 0; t < n; ++t) {
      const I* c = idx + t * istride + m0;
      F4 a0 = f4_load(S4 + 4 * t), a1 = f4_zero();
      if constexpr (MB == 1) {
        a0 = f4_add(a0, f4_load(L + size_t(c[0]) * 4));
      } else {
        for (int k = 0; k < MB; k += 2) {
          a0 = f4_add(a0, f4_load(L + size_t(k) * nc * 4 + size_t(c[k]) * 4));
          a1 = f4_add(a1, f4_load(L + size_t(k + 1) * nc * 4 + size_t(c[k + 1]) * 4));
        }
      }
      f4_store(S4 + 4 * t, f4_add(a0, a1));
    }
  }
}

template <int MB, int NC, typename I>
void hist_add_t(const I* idx, int64_t istride, int64_t n, int n_sub, int nc_rt, const float* P4, float* T4) {
  const size_t nc = NC > 0 ? size_t(NC) : size_t(nc_rt);
  for (int m0 = 0; m0 < n_sub; m0 += MB) {
    float* T = T4 + size_t(m0) * nc * 4;
    for (int64_t t = 0; t < n; ++t) {
      const I* c = idx + t * istride + m0;
      const F4 p = f4_load(P4 + 4 * t);
      for (int k = 0; k < MB; ++k) {
        float* d = T + size_t(k) * nc * 4 + size_t(c[k]) * 4;  // k·nc·4: a displacement when NC > 0
        f4_store(d, f4_add(f4_load(d), p));
      }
    }
  }
}

// The hot case (8-bit codes, 256 centroids, 8 sub-vectors per block): the 8 codes of a block
// come from one 64-bit load and each byte offset (code·16) is extracted with a shift and a
// mask, so a read-modify-write costs 4 µops (shift, and, load+add, store) with the table
// slice's base as a displacement.
inline void hist_add_b8_256_mb8(const uint8_t* idx, int64_t istride, int64_t n, int n_sub, const float* P4,
                                float* T4) {
  for (int m0 = 0; m0 < n_sub; m0 += 8) {
    char* T = reinterpret_cast<char*>(T4 + size_t(m0) * 256 * 4);
    for (int64_t t = 0; t < n; ++t) {
      uint64_t x;
      std::memcpy(&x, idx + t * istride + m0, 8);
      const F4 p = f4_load(P4 + 4 * t);
      auto rmw = [&](int k, uint64_t off) {
        float* d = reinterpret_cast<float*>(T + k * 4096 + off);
        f4_store(d, f4_add(f4_load(d), p));
      };
      rmw(0, (x << 4) & 0xFF0);
      rmw(1, (x >> 4) & 0xFF0);
      rmw(2, (x >> 12) & 0xFF0);
      rmw(3, (x >> 20) & 0xFF0);
      rmw(4, (x >> 28) & 0xFF0);
      rmw(5, (x >> 36) & 0xFF0);
      rmw(6, (x >> 44) & 0xFF0);
      rmw(7, (x >> 52) & 0xFF0);
    }
  }
}

inline void lut_scores_b8_256_mb8(const uint8_t* idx, int64_t istride, int64_t n, int n_sub, const float* lut,
                                  float* S4) {
  for (int m0 = 0; m0 < n_sub; m0 += 8) {
    const char* L = reinterpret_cast<const char*>(lut + size_t(m0) * 256 * 4);
    int64_t t = 0;
#if defined(__AVX__)
    // Two tokens per 256-bit vector (token t in the low half, t+1 in the high half): half the
    // adds and a shorter dependency chain per token.
    for (; t + 2 <= n; t += 2) {
      uint64_t x, y;
      std::memcpy(&x, idx + t * istride + m0, 8);
      std::memcpy(&y, idx + (t + 1) * istride + m0, 8);
      auto at = [&](int k, uint64_t ox, uint64_t oy) {
        const __m128 lo = _mm_loadu_ps(reinterpret_cast<const float*>(L + k * 4096 + ox));
        const __m128 hi = _mm_loadu_ps(reinterpret_cast<const float*>(L + k * 4096 + oy));
        return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
      };
      __m256 a0 = _mm256_add_ps(_mm256_loadu_ps(S4 + 4 * t), at(0, (x << 4) & 0xFF0, (y << 4) & 0xFF0));
      __m256 a1 = at(1, (x >> 4) & 0xFF0, (y >> 4) & 0xFF0);
      a0 = _mm256_add_ps(a0, at(2, (x >> 12) & 0xFF0, (y >> 12) & 0xFF0));
      a1 = _mm256_add_ps(a1, at(3, (x >> 20) & 0xFF0, (y >> 20) & 0xFF0));
      a0 = _mm256_add_ps(a0, at(4, (x >> 28) & 0xFF0, (y >> 28) & 0xFF0));
      a1 = _mm256_add_ps(a1, at(5, (x >> 36) & 0xFF0, (y >> 36) & 0xFF0));
      a0 = _mm256_add_ps(a0, at(6, (x >> 44) & 0xFF0, (y >> 44) & 0xFF0));
      a1 = _mm256_add_ps(a1, at(7, (x >> 52) & 0xFF0, (y >> 52) & 0xFF0));
      _mm256_storeu_ps(S4 + 4 * t, _mm256_add_ps(a0, a1));
    }
#endif
    for (; t < n; ++t) {
      uint64_t x;
      std::memcpy(&x, idx + t * istride + m0, 8);
      auto at = [&](int k, uint64_t off) { return f4_load(reinterpret_cast<const float*>(L + k * 4096 + off)); };
      F4 a0 = f4_add(f4_load(S4 + 4 * t), at(0, (x << 4) & 0xFF0));
      F4 a1 = at(1, (x >> 4) & 0xFF0);
      a0 = f4_add(a0, at(2, (x >> 12) & 0xFF0));
      a1 = f4_add(a1, at(3, (x >> 20) & 0xFF0));
      a0 = f4_add(a0, at(4, (x >> 28) & 0xFF0));
      a1 = f4_add(a1, at(5, (x >> 36) & 0xFF0));
      a0 = f4_add(a0, at(6, (x >> 44) & 0xFF0));
      a1 = f4_add(a1, at(7, (x >> 52) & 0xFF0));
      f4_store(S4 + 4 * t, f4_add(a0, a1));
    }
  }
}

// Largest m block (8, 4, 2, 1) dividing n_sub whose table slice fits kL1Slice.
int pick_mb(int n_sub, int nc) {
  for (int mb : {8, 4, 2}) {
    if (n_sub % mb == 0 && size_t(mb) * nc * 16 <= kL1Slice) return mb;
  }
  return 1;
}

template <int NC, typename I>
void lut_scores_nc(int mb, const I* idx, int64_t istride, int64_t n, int n_sub, int nc, const float* lut, float* S4) {
  switch (mb) {
    case 8: lut_scores_t<8, NC>(idx, istride, n, n_sub, nc, lut, S4); break;
    case 4: lut_scores_t<4, NC>(idx, istride, n, n_sub, nc, lut, S4); break;
    case 2: lut_scores_t<2, NC>(idx, istride, n, n_sub, nc, lut, S4); break;
    default: lut_scores_t<1, NC>(idx, istride, n, n_sub, nc, lut, S4); break;
  }
}

template <typename I>
void lut_scores(int mb, const I* idx, int64_t istride, int64_t n, int n_sub, int nc, const float* lut, float* S4) {
  if constexpr (std::is_same_v<I, uint8_t>) {
    if (nc == 256 && mb == 8) return lut_scores_b8_256_mb8(idx, istride, n, n_sub, lut, S4);
  }
  switch (nc) {
    case 256: return lut_scores_nc<256>(mb, idx, istride, n, n_sub, nc, lut, S4);
    case 1024: return lut_scores_nc<1024>(mb, idx, istride, n, n_sub, nc, lut, S4);
    case 4096: return lut_scores_nc<4096>(mb, idx, istride, n, n_sub, nc, lut, S4);
    default: return lut_scores_nc<0>(mb, idx, istride, n, n_sub, nc, lut, S4);
  }
}

template <int NC, typename I>
void hist_add_nc(int mb, const I* idx, int64_t istride, int64_t n, int n_sub, int nc, const float* P4, float* T4) {
  switch (mb) {
    case 8: hist_add_t<8, NC>(idx, istride, n, n_sub, nc, P4, T4); break;
    case 4: hist_add_t<4, NC>(idx, istride, n, n_sub, nc, P4, T4); break;
    case 2: hist_add_t<2, NC>(idx, istride, n, n_sub, nc, P4, T4); break;
    default: hist_add_t<1, NC>(idx, istride, n, n_sub, nc, P4, T4); break;
  }
}

template <typename I>
void hist_add(int mb, const I* idx, int64_t istride, int64_t n, int n_sub, int nc, const float* P4, float* T4) {
  if constexpr (std::is_same_v<I, uint8_t>) {
    if (nc == 256 && mb == 8) return hist_add_b8_256_mb8(idx, istride, n, n_sub, P4, T4);
  }
  switch (nc) {
    case 256: return hist_add_nc<256>(mb, idx, istride, n, n_sub, nc, P4, T4);
    case 1024: return hist_add_nc<1024>(mb, idx, istride, n, n_sub, nc, P4, T4);
    case 4096: return hist_add_nc<4096>(mb, idx, istride, n, n_sub, nc, P4, T4);
    default: return hist_add_nc<0>(mb, idx, istride, n, n_sub, nc, P4, T4);
  }
}

// ---- tables from the expanded codebook CX[e][c][4] ---------------------------------------------
// lut[m][c][r] = Σ_e qt[r][m·d + e] · C[c][e]
void build_lut(const float* CX, int d, int n_sub, int nc, const float* qt, int64_t D, float* lut) {
  for (int m = 0; m < n_sub; ++m) {
    float* L = lut + size_t(m) * nc * 4;
#if defined(__AVX512F__)
    if (nc % 4 == 0) {
      __m512 qp[16];
      for (int e = 0; e < d; ++e)
        qp[e] = _mm512_broadcast_f32x4(_mm_setr_ps(qt[m * d + e], qt[D + m * d + e], qt[2 * D + m * d + e],
                                                   qt[3 * D + m * d + e]));
      for (int c = 0; c < nc; c += 4) {
        __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(CX + size_t(c) * 4), qp[0]);
        for (int e = 1; e < d; ++e) acc = _mm512_fmadd_ps(_mm512_loadu_ps(CX + (size_t(e) * nc + c) * 4), qp[e], acc);
        _mm512_storeu_ps(L + size_t(c) * 4, acc);
      }
      continue;
    }
#endif
    for (int c = 0; c < nc; ++c)
      for (int r = 0; r < 4; ++r) {
        float acc = 0.0f;
        for (int e = 0; e < d; ++e) acc += qt[r * D + m * d + e] * CX[(size_t(e) * nc + c) * 4];
        L[size_t(c) * 4 + r] = acc;
      }
  }
}

// o[r][m·d + e] += Σ_c T4[m][c][r] · C[c][e]
void reduce_hist(const float* CX, int d, int n_sub, int nc, const float* T4, int64_t D, float* o) {
  for (int m = 0; m < n_sub; ++m) {
    const float* T = T4 + size_t(m) * nc * 4;
#if defined(__AVX512F__)
    if (nc % 4 == 0) {
      for (int e = 0; e < d; ++e) {
        const float* C = CX + size_t(e) * nc * 4;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
        int c = 0;
        for (; c + 8 <= nc; c += 8) {
          acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(T + size_t(c) * 4), _mm512_loadu_ps(C + size_t(c) * 4), acc0);
          acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(T + size_t(c + 4) * 4), _mm512_loadu_ps(C + size_t(c + 4) * 4), acc1);
        }
        for (; c < nc; c += 4)
          acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(T + size_t(c) * 4), _mm512_loadu_ps(C + size_t(c) * 4), acc0);
        const __m512 a = _mm512_add_ps(acc0, acc1);
        const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
        const __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        alignas(16) float r4[4];
        _mm_store_ps(r4, x);
        for (int r = 0; r < 4; ++r) o[r * D + m * d + e] += r4[r];
      }
      continue;
    }
#endif
    for (int e = 0; e < d; ++e)
      for (int r = 0; r < 4; ++r) {
        float acc = 0.0f;
        for (int c = 0; c < nc; ++c) acc += T[size_t(c) * 4 + r] * CX[(size_t(e) * nc + c) * 4];
        o[r * D + m * d + e] += acc;
      }
  }
}

// ---- dequant paths ---------------------------------------------------------------------------
template <typename I>
inline void decode_row(const I* c, int n_sub, int d, const float* cb, float* out) {
  for (int m = 0; m < n_sub; ++m) std::memcpy(out + m * d, cb + size_t(c[m]) * d, sizeof(float) * size_t(d));
}

// S4[t][r] = qt[r] · decode(codes_t)
template <typename I>
void dequant_scores(const I* idx, int64_t istride, int64_t n, const ProductQuantizer& pq, const float* qt, int64_t D,
                    float* row, float* S4) {
  for (int64_t t = 0; t < n; ++t) {
    decode_row(idx + t * istride, pq.n_sub, pq.sub_dim, pq.codebook.data(), row);
    for (int r = 0; r < 4; ++r) {
      const float* q = qt + r * D;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t dd = 0;
      for (; dd + 8 <= D; dd += 8)
        for (int j = 0; j < 8; ++j) acc[j] += q[dd + j] * row[dd + j];
      for (; dd < D; ++dd) acc[0] += q[dd] * row[dd];
      S4[4 * t + r] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// S4[t][r] = qt[r] · decode(codes_t) for sub_dim 4 or 8 and head_dim % 16 == 0: each 16-float
// slice of K̃_t is assembled from 4 (or 2) codebook rows straight into a register, then one
// FMA per query row; the 4 row sums are reduced together. Used for codebooks too large for a
// per-query table (12-bit keys: a 2 MiB LUT would not stay cached, the codebook does).
// Tokens go in pairs: each of the 4 query slices loaded serves both tokens' FMAs, which cuts
// the loads per token by a third (the loop is bound by loads and the inserts' shuffle port).
//
// Two codebook forms, one loop (scores_pairs_512 takes the slice loader):
//   F32Slices: float rows (16 / 32 bytes a centroid: a d4b12 codebook is 64 KiB, past L1);
//   I8Slices:  int8 rows (ProductQuantizer::codebook_i8, 4 / 8 bytes a centroid: 16 KiB for
//              d4b12), widened in a register; the caller passes qt·codebook_i8_scale, so
//              Σ qt·(byte·scale) becomes Σ (qt·scale)·byte — the same centroids (the codebook
//              is byte·scale exactly); only the products' rounding differs.
template <int DSUB>
struct F32Slices {
  const float* cb;
  template <typename I>
  __m512 operator()(const I* c, int64_t d) const {
    if constexpr (DSUB == 4) {
      const int64_t m = d / 4;
      __m512 kv = _mm512_castps128_ps512(_mm_loadu_ps(cb + size_t(c[m]) * 4));
      kv = _mm512_insertf32x4(kv, _mm_loadu_ps(cb + size_t(c[m + 1]) * 4), 1);
      kv = _mm512_insertf32x4(kv, _mm_loadu_ps(cb + size_t(c[m + 2]) * 4), 2);
      return _mm512_insertf32x4(kv, _mm_loadu_ps(cb + size_t(c[m + 3]) * 4), 3);
    } else {
      const int64_t m = d / 8;
      const __m512 kv = _mm512_castps256_ps512(_mm256_loadu_ps(cb + size_t(c[m]) * 8));
      return _mm512_insertf32x8(kv, _mm256_loadu_ps(cb + size_t(c[m + 1]) * 8), 1);
    }
  }
};

template <int DSUB>
struct I8Slices {
  const int8_t* cb;
  template <typename I>
  __m512 operator()(const I* c, int64_t d) const {
    __m128i x;
    if constexpr (DSUB == 4) {
      const int64_t m = d / 4;
      int32_t w[4];
      for (int j = 0; j < 4; ++j) std::memcpy(&w[j], cb + size_t(c[m + j]) * 4, 4);
      x = _mm_setr_epi32(w[0], w[1], w[2], w[3]);
    } else {
      const int64_t m = d / 8;
      long long w[2];
      std::memcpy(&w[0], cb + size_t(c[m]) * 8, 8);
      std::memcpy(&w[1], cb + size_t(c[m + 1]) * 8, 8);
      x = _mm_set_epi64x(w[1], w[0]);
    }
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x));
  }
};

template <typename Slices, typename I>
void scores_pairs_512(const Slices& slice, const I* idx, int64_t istride, int64_t n, const float* qt, int64_t D,
                      float* S4) {
  int64_t t = 0;
  for (; t + 2 <= n; t += 2) {
    const I* c0 = idx + t * istride;
    const I* c1 = c0 + istride;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 k0 = slice(c0, d), k1 = slice(c1, d);
      __m512 q = _mm512_loadu_ps(qt + d);
      a0 = _mm512_fmadd_ps(q, k0, a0);
      b0 = _mm512_fmadd_ps(q, k1, b0);
      q = _mm512_loadu_ps(qt + D + d);
      a1 = _mm512_fmadd_ps(q, k0, a1);
      b1 = _mm512_fmadd_ps(q, k1, b1);
      q = _mm512_loadu_ps(qt + 2 * D + d);
      a2 = _mm512_fmadd_ps(q, k0, a2);
      b2 = _mm512_fmadd_ps(q, k1, b2);
      q = _mm512_loadu_ps(qt + 3 * D + d);
      a3 = _mm512_fmadd_ps(q, k0, a3);
      b3 = _mm512_fmadd_ps(q, k1, b3);
    }
    _mm_storeu_ps(S4 + 4 * t, hsum4_512(a0, a1, a2, a3));
    _mm_storeu_ps(S4 + 4 * t + 4, hsum4_512(b0, b1, b2, b3));
  }
  if (t < n) {  // the odd last token
    const I* c = idx + t * istride;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 kv = slice(c, d);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qt + d), kv, a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(qt + D + d), kv, a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(qt + 2 * D + d), kv, a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(qt + 3 * D + d), kv, a3);
    }
    _mm_storeu_ps(S4 + 4 * t, hsum4_512(a0, a1, a2, a3));
  }
}
#endif

// Dequant scores, dispatched to the register-assembling kernels where they apply. qt_i8 is qt
// multiplied by pq.codebook_i8_scale (null when the codebook has no int8 form).
template <typename I>
void dequant_scores_any(const I* idx, int64_t istride, int64_t n, const ProductQuantizer& pq, const float* qt,
                        const float* qt_i8, int64_t D, float* row, float* S4) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  if (D % 16 == 0 && (pq.sub_dim == 4 || pq.sub_dim == 8)) {
    if (qt_i8 && !pq.codebook_i8.empty()) {
      if (pq.sub_dim == 4) return scores_pairs_512(I8Slices<4>{pq.codebook_i8.data()}, idx, istride, n, qt_i8, D, S4);
      return scores_pairs_512(I8Slices<8>{pq.codebook_i8.data()}, idx, istride, n, qt_i8, D, S4);
    }
    if (pq.sub_dim == 4) return scores_pairs_512(F32Slices<4>{pq.codebook.data()}, idx, istride, n, qt, D, S4);
    return scores_pairs_512(F32Slices<8>{pq.codebook.data()}, idx, istride, n, qt, D, S4);
  }
#endif
  (void)qt_i8;
  dequant_scores(idx, istride, n, pq, qt, D, row, S4);
}

template <typename I>
void dequant_values(const I* idx, int64_t istride, int64_t n, const ProductQuantizer& pq, const float* P4, int64_t D,
                    float* row, float* o) {
  for (int64_t t = 0; t < n; ++t) {
    const float* p = P4 + 4 * t;
    if (p[0] == 0.0f && p[1] == 0.0f && p[2] == 0.0f && p[3] == 0.0f) continue;
    decode_row(idx + t * istride, pq.n_sub, pq.sub_dim, pq.codebook.data(), row);
    for (int r = 0; r < 4; ++r) {
      float* orow = o + r * D;
      const float pr = p[r];
      for (int64_t dd = 0; dd < D; ++dd) orow[dd] += pr * row[dd];
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// o[r] += Σ_t P4[t][r]·V̂_t for sub_dim 4 or 8 and head_dim % 16 == 0, with the slice loaders
// of the key kernel: dims in groups of up to 64 (16 accumulators: 4 rows x 4 slices stay in
// registers over every token of the block), each 16-float slice of V̂_t assembled once per
// group and multiplied by the 4 rows' broadcast weights. `scale` multiplies the group's sums
// as they are added to o (codebook_i8_scale for int8 rows, 1 for floats). Tokens whose 4
// weights are all zero (masked) are skipped, as in dequant_values.
template <typename Slices, typename I>
void values_512(const Slices& slice, const I* idx, int64_t istride, int64_t n, const float* P4, int64_t D,
                float scale, float* o) {
  for (int64_t g0 = 0; g0 < D; g0 += 64) {
    const int ns = int(std::min<int64_t>(4, (D - g0) / 16));
    __m512 acc[4][4];
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      const float* p = P4 + 4 * t;
      if (p[0] == 0.0f && p[1] == 0.0f && p[2] == 0.0f && p[3] == 0.0f) continue;
      const I* c = idx + t * istride;
      const __m512 p0 = _mm512_set1_ps(p[0]), p1 = _mm512_set1_ps(p[1]), p2 = _mm512_set1_ps(p[2]),
                   p3 = _mm512_set1_ps(p[3]);
      auto step = [&](int j) {
        const __m512 kv = slice(c, g0 + 16 * j);
        acc[0][j] = _mm512_fmadd_ps(p0, kv, acc[0][j]);
        acc[1][j] = _mm512_fmadd_ps(p1, kv, acc[1][j]);
        acc[2][j] = _mm512_fmadd_ps(p2, kv, acc[2][j]);
        acc[3][j] = _mm512_fmadd_ps(p3, kv, acc[3][j]);
      };
      if (ns == 4) {  // the common case, unrolled so the accumulators stay in registers
        step(0), step(1), step(2), step(3);
      } else {
        for (int j = 0; j < ns; ++j) step(j);
      }
    }
    const __m512 sv = _mm512_set1_ps(scale);
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < ns; ++j) {
        float* dst = o + r * D + g0 + 16 * j;
        _mm512_storeu_ps(dst, _mm512_fmadd_ps(acc[r][j], sv, _mm512_loadu_ps(dst)));
      }
  }
}
#endif

// Dequant values, dispatched like dequant_scores_any.
template <typename I>
void dequant_values_any(const I* idx, int64_t istride, int64_t n, const ProductQuantizer& pq, const float* P4,
                        int64_t D, float* row, float* o) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  if (D % 16 == 0 && (pq.sub_dim == 4 || pq.sub_dim == 8)) {
    if (!pq.codebook_i8.empty()) {
      const float s = pq.codebook_i8_scale;
      if (pq.sub_dim == 4) return values_512(I8Slices<4>{pq.codebook_i8.data()}, idx, istride, n, P4, D, s, o);
      return values_512(I8Slices<8>{pq.codebook_i8.data()}, idx, istride, n, P4, D, s, o);
    }
    if (pq.sub_dim == 4) return values_512(F32Slices<4>{pq.codebook.data()}, idx, istride, n, P4, D, 1.0f, o);
    return values_512(F32Slices<8>{pq.codebook.data()}, idx, istride, n, P4, D, 1.0f, o);
  }
#endif
  dequant_values(idx, istride, n, pq, P4, D, row, o);
}

// CX[e][c][4] = C[c][e]
std::vector<float> expand_codebook(const ProductQuantizer& pq) {
  const int nc = pq.n_centroids, d = pq.sub_dim;
  std::vector<float> cx(size_t(nc) * d * 4);
  for (int e = 0; e < d; ++e)
    for (int c = 0; c < nc; ++c)
      for (int r = 0; r < 4; ++r) cx[(size_t(e) * nc + c) * 4 + r] = pq.codebook[size_t(c) * d + e];
  return cx;
}

// How many coded tokens a chunk needs before its table path pays (the thresholds above): the
// key LUT from n_centroids / 2, the value histogram from 2·n_centroids. coded_partial asks per
// chunk; vecinfer_attention_cpu asks for the whole coded span before expanding a codebook.
inline bool key_lut_pays(int64_t n_tokens, const ProductQuantizer& pq) { return n_tokens * 2 >= pq.n_centroids; }
inline bool value_hist_pays(int64_t n_tokens, const ProductQuantizer& pq) {
  return n_tokens >= 2 * int64_t(pq.n_centroids);
}

struct CodedContext {
  const VecInferAttentionInputs* in;
  int64_t D;
  bool key_table_ok, value_table_ok;  // bits small enough for LUT / histogram
  int key_mb, value_mb;
  std::vector<float> kcx, vcx;  // expanded codebooks (only when the table paths may run)
};

// Codes of tokens [t, t + n) of one (b, kv head): bytes when bits == 8 (no unpacking), else
// unpacked into scratch as uint16.
struct CodeRows {
  const uint8_t* bytes = nullptr;
  const uint16_t* wide = nullptr;
  int64_t stride = 0;
};

// Unpacks the n_codes codes of one packed row (pq.h: LSB-first, code i at bits
// [i·bits, (i+1)·bits)). With AVX-512 VBMI, 16 codes at a time: a chunk of 16 codes starts on
// a byte boundary, one byte permute gives every 32-bit lane the 4 bytes holding its code, a
// variable shift and a mask extract it, vpmovdw narrows to 16 bits. Scalar: a 64-bit window
// per code where 8 bytes fit in the row, read_code for the last ones.
struct UnpackPlan {
  int bits = 0;
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
  __m512i idx, shift, mask;
#endif
  explicit UnpackPlan(int b) : bits(b) {
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
    alignas(64) uint8_t ib[64];
    alignas(64) uint32_t sh[16];
    for (int j = 0; j < 16; ++j) {
      const int bit = j * b;
      for (int k = 0; k < 4; ++k) ib[4 * j + k] = uint8_t(bit / 8 + k);
      sh[j] = uint32_t(bit % 8);
    }
    idx = _mm512_load_si512(ib);
    shift = _mm512_load_si512(sh);
    mask = _mm512_set1_epi32(int((1u << b) - 1u));
#endif
  }
};

#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
// 16 codes whose first bit starts byte p[0] (avail bytes readable from p): one 64-byte load
// (masked to avail when fewer remain), a byte permute giving each 32-bit lane the 4 bytes of
// its code, a variable shift, a mask, and a narrowing store.
inline void unpack16(const uint8_t* p, int64_t avail, const UnpackPlan& plan, uint16_t* out) {
  const __m512i bytes = avail >= 64 ? _mm512_loadu_si512(p)
                                    : _mm512_maskz_loadu_epi8(__mmask64((uint64_t(1) << avail) - 1), p);
  const __m512i w =
      _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi8(plan.idx, bytes), plan.shift), plan.mask);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(w));
}
#endif

inline void unpack_row(const uint8_t* row, int n_codes, int64_t code_bytes, const UnpackPlan& plan, uint16_t* out) {
  const int bits = plan.bits;
  int i = 0;
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
  for (; i + 16 <= n_codes; i += 16) {
    const int64_t byte0 = int64_t(i) * bits / 8;
    unpack16(row + byte0, code_bytes - byte0, plan, out + i);
  }
#endif
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  for (; i < n_codes; ++i) {
    const int64_t bit = int64_t(i) * bits;
    if ((bit >> 3) + 8 <= code_bytes) {
      uint64_t w;
      std::memcpy(&w, row + (bit >> 3), 8);
      out[i] = uint16_t((w >> (bit & 7)) & mask);
    } else {
      out[i] = uint16_t(read_code(row, i, bits));
    }
  }
}

// Unpacks n_codes codes of `bits` bits packed LSB-first from p (n_bytes bytes in all): as
// unpack_row over rows that follow each other without padding bits, so the 64-byte window of a
// 16-code group (2·bits bytes, starting on a byte) runs into the next rows and only the last
// groups of the block need a masked load. Out: n_codes entries.
inline void unpack_stream(const uint8_t* p, int64_t n_codes, int64_t n_bytes, const UnpackPlan& plan, uint16_t* out) {
  int64_t i = 0;
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
  const int64_t gb = 2 * plan.bits;  // bytes per 16 codes
  for (; i + 16 <= n_codes; i += 16) unpack16(p + i / 16 * gb, n_bytes - i / 16 * gb, plan, out + i);
#endif
  for (; i < n_codes; ++i) out[i] = uint16_t(read_code(p, i, plan.bits));
}

CodeRows code_rows(const TensorView& codes, const ProductQuantizer& pq, int64_t b, int64_t kh, int64_t t, int64_t n,
                   std::vector<uint16_t>& buf) {
  const uint8_t* base = static_cast<const uint8_t*>(codes.data) + b * codes.strides[0] + kh * codes.strides[1];
  CodeRows r;
  if (pq.codebook_bits == 8 && codes.strides[2] == pq.code_bytes) {
    r.bytes = base + t * codes.strides[2];
    r.stride = pq.code_bytes;
    return r;
  }
  if (pq.codebook_bits == 8) {  // strided rows: gather them
    buf.resize(size_t(n * pq.n_sub));
    for (int64_t i = 0; i < n; ++i)
      for (int m = 0; m < pq.n_sub; ++m) buf[size_t(i * pq.n_sub + m)] = base[(t + i) * codes.strides[2] + m];
  } else {
    buf.resize(size_t(n * pq.n_sub) + 16);
    const UnpackPlan plan(pq.codebook_bits);
    if (codes.strides[2] == pq.code_bytes && int64_t(pq.n_sub) * pq.codebook_bits % 8 == 0) {
      // contiguous rows without padding bits: one stream of n·n_sub codes
      unpack_stream(base + t * pq.code_bytes, n * pq.n_sub, n * pq.code_bytes, plan, buf.data());
    } else {
      for (int64_t i = 0; i < n; ++i)
        unpack_row(base + (t + i) * codes.strides[2], pq.n_sub, pq.code_bytes, plan, buf.data() + i * pq.n_sub);
    }
  }
  r.wide = buf.data();
  r.stride = pq.n_sub;
  return r;
}

void coded_partial(const CodedContext& cx, int64_t b, int64_t kh, int64_t t0, int64_t t1, const RowBlock& rb,
                   UnitScratch& scratch, Partial& out) {
  const VecInferAttentionInputs& in = *cx.in;
  const ProductQuantizer& kp = *in.key_pq;
  const ProductQuantizer& vp = *in.value_pq;
  const int64_t D = cx.D;
  std::fill(out.o, out.o + 4 * D, 0.0f);
  const int64_t a = std::max(t0, rb.lo), e = std::min(t1, rb.hi + 1);
  if (a >= e) {
    for (int r = 0; r < 4; ++r) out.m[r] = kNegInf, out.l[r] = 0.0f;
    return;
  }
  const int64_t n = e - a;
  float* S4 = scratch.scores.get(size_t(4 * n + 16));
  float* row = scratch.tmp.get(size_t(D));
  const bool use_lut = cx.key_table_ok && key_lut_pays(n, kp);
  const bool use_hist = cx.value_table_ok && value_hist_pays(n, vp);

  // Pass 1: scores.
  float* lut = nullptr;
  if (use_lut) {
    lut = scratch.lut.get(size_t(kp.n_sub) * kp.n_centroids * 4);
    build_lut(cx.kcx.data(), kp.sub_dim, kp.n_sub, kp.n_centroids, rb.qt, D, lut);
    std::fill(S4, S4 + 4 * n, 0.0f);
  }
  // The int8 codebook form's query: qt·scale (dequant path only).
  const float* qt_i8 = nullptr;
  if (!use_lut && !kp.codebook_i8.empty()) {
    float* qs = scratch.tmp.get(size_t(5 * D)) + D;
    for (int64_t x = 0; x < 4 * D; ++x) qs[x] = rb.qt[x] * kp.codebook_i8_scale;
    qt_i8 = qs;
    row = qs - D;
  }
  for (int64_t t = 0; t < n; t += kTokenBlock) {
    const int64_t nb = std::min(kTokenBlock, n - t);
    const CodeRows cr = code_rows(in.key_codes, kp, b, kh, a + t, nb, scratch.idx);
    if (use_lut) {
      if (cr.bytes) lut_scores(cx.key_mb, cr.bytes, cr.stride, nb, kp.n_sub, kp.n_centroids, lut, S4 + 4 * t);
      else lut_scores(cx.key_mb, cr.wide, cr.stride, nb, kp.n_sub, kp.n_centroids, lut, S4 + 4 * t);
    } else {
      if (cr.bytes) dequant_scores_any(cr.bytes, cr.stride, nb, kp, rb.qt, qt_i8, D, row, S4 + 4 * t);
      else dequant_scores_any(cr.wide, cr.stride, nb, kp, rb.qt, qt_i8, D, row, S4 + 4 * t);
    }
  }
  if (!softmax_chunk(S4, a, n, rb, out)) return;

  // Pass 2: values.
  float* T4 = nullptr;
  if (use_hist) {
    const size_t tn = size_t(vp.n_sub) * vp.n_centroids * 4;
    T4 = scratch.hist.get(tn);
    std::fill(T4, T4 + tn, 0.0f);
  }
  for (int64_t t = 0; t < n; t += kTokenBlock) {
    const int64_t nb = std::min(kTokenBlock, n - t);
    const CodeRows cr = code_rows(in.value_codes, vp, b, kh, a + t, nb, scratch.idx);
    if (use_hist) {
      if (cr.bytes) hist_add(cx.value_mb, cr.bytes, cr.stride, nb, vp.n_sub, vp.n_centroids, S4 + 4 * t, T4);
      else hist_add(cx.value_mb, cr.wide, cr.stride, nb, vp.n_sub, vp.n_centroids, S4 + 4 * t, T4);
    } else {
      if (cr.bytes) dequant_values_any(cr.bytes, cr.stride, nb, vp, S4 + 4 * t, D, row, out.o);
      else dequant_values_any(cr.wide, cr.stride, nb, vp, S4 + 4 * t, D, row, out.o);
    }
  }
  if (use_hist) reduce_hist(cx.vcx.data(), vp.sub_dim, vp.n_sub, vp.n_centroids, T4, D, out.o);
}

}  // namespace
}  // namespace detail

void vecinfer_attention_cpu(const VecInferAttentionInputs& in, const TensorView& q, const TensorView& out,
                            const SdpaParams& params, ThreadPool* pool) {
  using namespace detail;
  check_vecinfer_attention(in, q, out, params);
  const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = in.key_codes.shape[1], Nc = in.key_codes.shape[2], N = Nc + in.n_window;
  if (B == 0 || Lq == 0) return;
  const int64_t G = H / Hkv, R = G * Lq, NRB = (R + 3) / 4;
  const float scale = resolved_scale(params, D);
  const ProductQuantizer& kp = *in.key_pq;
  const ProductQuantizer& vp = *in.value_pq;

  CodedContext cx;
  cx.in = &in;
  cx.D = D;
  cx.key_table_ok = kp.codebook_bits <= kMaxLutBits;
  cx.value_table_ok = vp.codebook_bits <= kMaxTableBits;
  cx.key_mb = pick_mb(kp.n_sub, kp.n_centroids);
  cx.value_mb = pick_mb(vp.n_sub, vp.n_centroids);
  // the expanded codebooks only where some chunk can take the table path (see coded_partial)
  if (cx.key_table_ok && key_lut_pays(Nc, kp)) cx.kcx = expand_codebook(kp);
  if (cx.value_table_ok && value_hist_pays(Nc, vp)) cx.vcx = expand_codebook(vp);
  if (cx.kcx.empty()) cx.key_table_ok = false;
  if (cx.vcx.empty()) cx.value_table_ok = false;

  // Row blocks: q (scaled) for the window, q̃ (transformed, scaled) for the codes.
  std::vector<float> qbuf(size_t(B * Hkv * NRB * 8 * D), 0.0f);
  std::vector<RowBlock> rbs(size_t(B * Hkv * NRB));
  const int qes = dtype_size(q.dtype);
  // (load, Hadamard and scale of 8 rows of D per row block: about 8·D·log2(D) operations)
  int log2d = 0;
  while ((int64_t(1) << log2d) < D) ++log2d;
  run_tasks(pool_for(pool, B * Hkv * NRB * 8 * D * (log2d + 2)), B * Hkv, [&](int64_t bk, int) {
    const int64_t b = bk / Hkv, kh = bk % Hkv;
    for (int64_t blk = 0; blk < NRB; ++blk) {
      const int64_t id = bk * NRB + blk;
      RowBlock& rb = rbs[size_t(id)];
      float* qb = qbuf.data() + id * 8 * D;
      rb.q = qb;
      rb.qt = qb + 4 * D;
      rb.row0 = blk * 4;
      rb.n_rows = int(std::min<int64_t>(4, R - blk * 4));
      rb.lo = std::numeric_limits<int64_t>::max();
      rb.hi = -1;
      for (int r = 0; r < 4; ++r) {
        if (r >= rb.n_rows) {
          rb.range[r] = rb.range[0];
          continue;
        }
        const int64_t rr = rb.row0 + r, i = rr / G, h = kh * G + rr % G;
        rb.range[r] = row_range(rr, G, Lq, N, params);
        load_row_f32(static_cast<const char*>(q.data) + off4(q, b, h, i, 0) * qes, q.dtype, q.strides[3], D, qb + r * D);
        if (!rb.range[r].empty()) {
          rb.lo = std::min(rb.lo, rb.range[r].lo);
          rb.hi = std::max(rb.hi, rb.range[r].hi);
        }
      }
      if (rb.hi < 0) rb.lo = 0;
      std::memcpy(qb + 4 * D, qb, sizeof(float) * size_t(4 * D));
      in.transform->forward_queries(qb + 4 * D, 4, int(kh));
      for (int64_t x = 0; x < 8 * D; ++x) qb[x] *= scale;
    }
  });

  // Units: coded chunks (kind 0) then the window piece (kind 1) of every row block.
  const int64_t n_rbs = int64_t(rbs.size());
  int64_t chunk = std::max<int64_t>(kMinChunk, (Nc * n_rbs + kTargetUnits - 1) / kTargetUnits);
  chunk = std::max<int64_t>(1, std::min(chunk, std::max<int64_t>(Nc, 1)));
  chunk = (chunk + kTokenBlock - 1) / kTokenBlock * kTokenBlock;
  std::vector<Unit> units;
  std::vector<int64_t> first_unit(rbs.size() + 1, 0);
  for (int64_t id = 0; id < n_rbs; ++id) {
    first_unit[size_t(id)] = int64_t(units.size());
    const RowBlock& rb = rbs[size_t(id)];
    if (rb.hi < rb.lo) continue;
    const int64_t b = id / (Hkv * NRB), kh = (id / NRB) % Hkv, blk = id % NRB;
    const int64_t chi = std::min(rb.hi, Nc - 1);
    if (rb.lo <= chi)
      for (int64_t c = rb.lo / chunk; c <= chi / chunk; ++c)
        units.push_back({b, kh, blk, std::max(rb.lo, c * chunk), std::min(chi + 1, (c + 1) * chunk), 0});
    if (rb.hi >= Nc) units.push_back({b, kh, blk, std::max(rb.lo, Nc), rb.hi + 1, 1});
  }
  first_unit[rbs.size()] = int64_t(units.size());
  std::vector<float> obuf(units.size() * size_t(4 * D));
  std::vector<Partial> parts(units.size());
  for (size_t u = 0; u < units.size(); ++u) parts[u].o = obuf.data() + u * size_t(4 * D);

  // Longest units first (dynamic scheduling balances the rest).
  std::vector<int64_t> order(units.size());
  for (size_t u = 0; u < units.size(); ++u) order[u] = int64_t(u);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return units[size_t(x)].t1 - units[size_t(x)].t0 > units[size_t(y)].t1 - units[size_t(y)].t0;
  });

  run_tasks(pool, int64_t(units.size()), [&](int64_t k, int) {
    const int64_t u = order[size_t(k)];
    const Unit& un = units[size_t(u)];
    const RowBlock& rb = rbs[size_t((un.b * Hkv + un.kvh) * NRB + un.rb)];
    UnitScratch& scratch = thread_scratch();
    if (un.kind == 0) {
      coded_partial(cx, un.b, un.kvh, un.t0, un.t1, rb, scratch, parts[size_t(u)]);
    } else {
      DenseSource src = DenseSource::of(in.window_keys, in.window_values, un.b, un.kvh);
      src.pos0 = Nc;
      src.n_slots = in.window_keys.shape[2];
      src.first_slot = in.window_first_slot;
      dense_partial(src, un.t0, un.t1, D, rb, scratch, parts[size_t(u)]);
    }
  });

  merge_row_blocks(pool, rbs, first_unit, parts, Hkv, NRB, G, out);
}

}  // namespace veloxquant
