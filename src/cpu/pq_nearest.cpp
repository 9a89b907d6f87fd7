// src/cpu/pq_nearest.cpp — exact nearest-centroid search, the kernel under PQ encode,
// kmeans_assign and every Lloyd iteration of kmeans_train.
//
// Computes, for points x [n, d] and centroids cb [k, d] (f32, row-major), assign[i] =
// argmin_c Σ_j (x[i][j] − cb[c][j])² — that sum taken exactly as the oracle takes it
// (detail::pq_sub_distance_ref, f32, j ascending), ties to the lowest index — and optionally
// dist[i], that oracle distance to the chosen centroid.
//
// Shape, and why:
//  * The centroids are re-laid out as SoA, cbT [d][Kp] and norms [Kp] = ||c||² (Kp = k rounded
//    up to 16, pad entries norm +inf), so one 16-float register holds one coordinate of 16
//    centroids. The score a_c = ||c||² − 2·x·c (= ||x − c||² − ||x||²) then costs d FMAs per 16
//    centroids; a block of kBlock points shares every codebook load (register blocking), and
//    for d ≤ 16 the coordinate loop is unrolled by a template (d registers stay resident).
//  * Each point's scores go to a small buffer [kBlock, Kp] (L1 for k ≤ 1024, L2 beyond) and
//    the running minimum is kept in registers. A second, compare-only scan lists every centroid
//    whose score is within a proven error bound of the minimum; when that list has one entry it
//    is the oracle's answer, otherwise the entries are re-ranked with the oracle's distance.
//    Bound: the fast score and the oracle's f32 distance each err by at most (d + 3)·u·R²,
//    R = ||x|| + max_c ||c||, u = 2^-24 (standard summation/dot-product bounds), so a centroid
//    whose score exceeds min + 2(2d + 5)·u·R² cannot be the oracle's argmin; we use twice that.
//    Result: exact agreement with the oracle, at ~1.25× the cost of the bare score pass.
//  * Points with a non-finite coordinate get centroid 0 (the oracle's rule); points so large
//    that squares could overflow (R² ≥ 1e36) take the oracle loop directly.
//  * Threads split the points into contiguous ranges; each point's answer does not depend on
//    the split, so results are identical for any thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "core/pq_internal.h"
#include "veloxquant/cache.h"
#include "veloxquant/error.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports its own _mm512_undefined_ps() inside _mm512_min_ps as maybe-uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace veloxquant::detail {

namespace {

constexpr int kPad = 16;   // Kp is a multiple of this (covers AVX-512 and AVX2 widths)
constexpr int kBlock = 8;  // points sharing one pass over the centroids
constexpr int kMaxUnrolledDim = 16;

struct SoACentroids {
  int d = 0, K = 0, Kp = 0;
  std::vector<float> cbT;    // [d, Kp]
  std::vector<float> norms;  // [Kp], ||c||² (pads: +inf)
  double cmax = 0;           // max_c ||c||
  double cmax2 = 0;          // max_c ||c||²
};

SoACentroids make_soa(const float* cb, int k, int d) {
  SoACentroids s;
  s.d = d;
  s.K = k;
  s.Kp = (k + kPad - 1) / kPad * kPad;
  s.cbT.assign(size_t(d) * s.Kp, 0.0f);
  s.norms.assign(size_t(s.Kp), INFINITY);
  double cmax2 = 0.0;
  for (int c = 0; c < k; ++c) {
    float acc = 0.0f;
    double dn = 0.0;
    for (int j = 0; j < d; ++j) {
      const float v = cb[size_t(c) * d + j];
      s.cbT[size_t(j) * s.Kp + c] = v;
      acc += v * v;
      dn += double(v) * v;
    }
    s.norms[size_t(c)] = acc;
    cmax2 = std::max(cmax2, dn);
  }
  s.cmax = std::sqrt(cmax2);
  s.cmax2 = cmax2;
  return s;
}

// Scores buf[b][c] = norms[c] + Σ_j xm2[b][j]·cbT[j][c] (xm2 = −2·x) for nb ≤ kBlock points,
// and amin[b] = min_c buf[b][c]. D > 0: d = D unrolled; D == 0: runtime d.
template <int D>
void score_block(const SoACentroids& s, const float* xm2, int ldx, int nb, float* buf, float* amin) {
  const int Kp = s.Kp;
  const int d = D > 0 ? D : s.d;
  const float* cbT = s.cbT.data();
  const float* nrm = s.norms.data();
#if defined(__AVX512F__)
  __m512 mn[kBlock];
  for (int b = 0; b < kBlock; ++b) mn[b] = _mm512_set1_ps(INFINITY);
  for (int c0 = 0; c0 < Kp; c0 += 16) {
    const __m512 nv = _mm512_loadu_ps(nrm + c0);
    if constexpr (D > 0) {
      __m512 cv[D];
#pragma GCC unroll 16
      for (int j = 0; j < D; ++j) cv[j] = _mm512_loadu_ps(cbT + size_t(j) * Kp + c0);
      if (nb == kBlock) {  // the common full block: fully unrolled, everything in registers
#pragma GCC unroll 8
        for (int b = 0; b < kBlock; ++b) {
          __m512 acc = nv;
#pragma GCC unroll 16
          for (int j = 0; j < D; ++j) acc = _mm512_fmadd_ps(_mm512_set1_ps(xm2[b * ldx + j]), cv[j], acc);
          _mm512_storeu_ps(buf + size_t(b) * Kp + c0, acc);
          mn[b] = _mm512_min_ps(mn[b], acc);
        }
      } else {
        for (int b = 0; b < nb; ++b) {
          __m512 acc = nv;
#pragma GCC unroll 16
          for (int j = 0; j < D; ++j) acc = _mm512_fmadd_ps(_mm512_set1_ps(xm2[b * ldx + j]), cv[j], acc);
          _mm512_storeu_ps(buf + size_t(b) * Kp + c0, acc);
          mn[b] = _mm512_min_ps(mn[b], acc);
        }
      }
    } else {
      for (int b = 0; b < nb; ++b) {
        __m512 acc = nv;
        for (int j = 0; j < d; ++j)
          acc = _mm512_fmadd_ps(_mm512_set1_ps(xm2[b * ldx + j]), _mm512_loadu_ps(cbT + size_t(j) * Kp + c0), acc);
        _mm512_storeu_ps(buf + size_t(b) * Kp + c0, acc);
        mn[b] = _mm512_min_ps(mn[b], acc);
      }
    }
  }
  for (int b = 0; b < nb; ++b) {
    alignas(64) float t[16];
    _mm512_store_ps(t, mn[b]);
    float m = t[0];
    for (int i = 1; i < 16; ++i) m = std::min(m, t[i]);
    amin[b] = m;
  }
#elif defined(__AVX2__)
  __m256 mn[kBlock];
  for (int b = 0; b < kBlock; ++b) mn[b] = _mm256_set1_ps(INFINITY);
  for (int c0 = 0; c0 < Kp; c0 += 8) {
    const __m256 nv = _mm256_loadu_ps(nrm + c0);
    for (int b = 0; b < nb; ++b) {
      __m256 acc = nv;
      for (int j = 0; j < d; ++j)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(xm2[b * ldx + j]), _mm256_loadu_ps(cbT + size_t(j) * Kp + c0), acc);
      _mm256_storeu_ps(buf + size_t(b) * Kp + c0, acc);
      mn[b] = _mm256_min_ps(mn[b], acc);
    }
  }
  for (int b = 0; b < nb; ++b) {
    alignas(32) float t[8];
    _mm256_store_ps(t, mn[b]);
    float m = t[0];
    for (int i = 1; i < 8; ++i) m = std::min(m, t[i]);
    amin[b] = m;
  }
#else
  // Portable: 16-wide chunks of plain loops, which compilers vectorise.
  for (int b = 0; b < nb; ++b) {
    float m = INFINITY;
    float* out = buf + size_t(b) * Kp;
    for (int c0 = 0; c0 < Kp; c0 += kPad) {
      float acc[kPad];
      for (int l = 0; l < kPad; ++l) acc[l] = nrm[c0 + l];
      for (int j = 0; j < d; ++j) {
        const float xj = xm2[b * ldx + j];
        const float* cj = cbT + size_t(j) * Kp + c0;
        for (int l = 0; l < kPad; ++l) acc[l] += xj * cj[l];
      }
      for (int l = 0; l < kPad; ++l) {
        out[c0 + l] = acc[l];
        m = std::min(m, acc[l]);
      }
    }
    amin[b] = m;
  }
#endif
}

using ScoreFn = void (*)(const SoACentroids&, const float*, int, int, float*, float*);

template <int... Ds>
ScoreFn pick_impl(int d, std::integer_sequence<int, Ds...>) {
  ScoreFn f = score_block<0>;
  ((d == Ds + 1 ? (f = score_block<Ds + 1>, 0) : 0), ...);
  return f;
}
ScoreFn pick_score_fn(int d) { return pick_impl(d, std::make_integer_sequence<int, kMaxUnrolledDim>{}); }

// The margin above the minimum score a_w within which the oracle's argmin must lie.
// κ = (d + 3)·u bounds the relative error of both the fast score (||c||² − 2x·c, error
// ≤ (d + 2)·u·(||x|| + ||c||)²) and the oracle's f32 distance (≤ (d + 3)·u·||x − c||²). Only
// centroids that could tie or beat w matter; those satisfy ||x − c||² ≤ T1 ≈ ||x − w||², hence
// ||x|| + ||c|| ≤ R = 2||x|| + sqrt(T1), R² ≤ 8||x||² + 2·T1, and their scores err by at most
// E = κR². The oracle's argmin o then has a_o ≤ a_w + 2E + 2κT1. We return twice that; the
// factor 2 also absorbs the f32 rounding of nx, tw and of this expression (~1e-6 relative).
// @param nx ||x||²  @param tw ||x − w||² for the fast argmin w (both in f32)
inline float tie_margin(int d, float nx, float tw) {
  const float kappa = float(d + 3) * 0x1p-24f;
  const float t1 = tw * (1.0f + 8.0f * kappa) + 1e-30f;
  return 2.0f * (2.0f * kappa * (8.0f * nx + 2.0f * t1) + 2.0f * kappa * t1);
}

inline float dist_f(const float* x, const float* c, int d) {
  float s = 0.0f;
  for (int j = 0; j < d; ++j) {
    const float t = x[j] - c[j];
    s += t * t;
  }
  return s;
}

int32_t oracle_argmin(const float* xs, const float* cb, int k, int d, float* best_out);

#if defined(__AVX512F__)
// Register-only variant (AVX-512, d <= 16). Per lane it keeps the smallest score, that score's
// centroid index and the second-smallest score, so no score buffer and no second scan are
// needed. Afterwards the answer is proven unique when exactly one lane's minimum, and no
// lane's second minimum, lies within the error margin of the overall minimum; otherwise the
// caller runs the oracle over all centroids (near-ties: rare on real data).
// Large codebooks are walked in tiles of ~128 KiB (cbT rows of kTileBytes / (4·d) centroids)
// while a group of points keeps its running state in memory between tiles, so the tile is
// reused from L2 by every point of the group instead of being streamed from L3/DRAM per point.
struct alignas(64) Top2State {
  __m512 mn1, mn2;
  __m512i id1;
};

__attribute__((always_inline)) inline void top2_step(__m512& mn1, __m512& mn2, __m512i& id1, __m512 acc, __m512i cur) {
  const __mmask16 lt = _mm512_cmp_ps_mask(acc, mn1, _CMP_LT_OQ);  // strict: equal keeps the lower index
  mn2 = _mm512_min_ps(mn2, _mm512_max_ps(acc, mn1));
  mn1 = _mm512_min_ps(mn1, acc);
  id1 = _mm512_mask_mov_epi32(id1, lt, cur);
}

// Advances the state of NB points (xm2 [NB, 16] = −2·x, zero-padded) over centroids [c0, c1)
// (multiples of 16). Always NB points: constant indices everywhere keep the state in registers.
template <int D, int NB>
void top2_tile(const SoACentroids& s, const float* xm2, int c0, int c1, Top2State* st) {
  const int Kp = s.Kp;
  const float* cbT = s.cbT.data();
  const float* nrm = s.norms.data();
  __m512 mn1[NB], mn2[NB];
  __m512i id1[NB];
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) {
    mn1[b] = st[b].mn1;
    mn2[b] = st[b].mn2;
    id1[b] = st[b].id1;
  }
  __m512i cur = _mm512_add_epi32(_mm512_set1_epi32(c0),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m512i step = _mm512_set1_epi32(16);
  for (int c = c0; c < c1; c += 16) {
    __m512 cv[D];
#pragma GCC unroll 16
    for (int j = 0; j < D; ++j) cv[j] = _mm512_loadu_ps(cbT + size_t(j) * Kp + c);
    const __m512 nv = _mm512_loadu_ps(nrm + c);
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      __m512 acc = nv;
#pragma GCC unroll 16
      for (int j = 0; j < D; ++j) acc = _mm512_fmadd_ps(_mm512_set1_ps(xm2[b * 16 + j]), cv[j], acc);
      top2_step(mn1[b], mn2[b], id1[b], acc, cur);
    }
    cur = _mm512_add_epi32(cur, step);
  }
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) {
    st[b].mn1 = mn1[b];
    st[b].mn2 = mn2[b];
    st[b].id1 = id1[b];
  }
}

// The unique nearest centroid from a finished state, or -1 when near-ties need the oracle.
// @param xs the point [d]  @param nx ||x||²
inline int32_t top2_finish(const Top2State& st, const SoACentroids& s, const float* xs, const float* cb, float nx) {
  const float m = _mm512_reduce_min_ps(st.mn1);
  const __mmask16 at_min = _mm512_cmp_ps_mask(st.mn1, _mm512_set1_ps(m), _CMP_EQ_OQ);
  if (at_min == 0) return -1;  // cannot happen for finite scores; let the oracle decide
  alignas(64) int32_t ids[16];
  _mm512_store_si512(reinterpret_cast<__m512i*>(ids), st.id1);
  const int32_t w = ids[__builtin_ctz(unsigned(at_min))];
  const float margin = tie_margin(s.d, nx, dist_f(xs, cb + size_t(w) * s.d, s.d));
  // m + margin, nudged up (2 ulps) so rounding can only widen the candidate set
  const float t = m + margin;
  const __m512 thr = _mm512_set1_ps(t + std::fabs(t) * 0x1p-22f);
  const __mmask16 lanes = _mm512_cmp_ps_mask(st.mn1, thr, _CMP_LE_OQ);
  const __mmask16 second = _mm512_cmp_ps_mask(st.mn2, thr, _CMP_LE_OQ);
  return (__builtin_popcount(unsigned(lanes)) == 1 && second == 0) ? w : -1;
}

// Points per kernel call: enough to amortise the codebook loads, few enough for 32 registers.
constexpr int top2_nb(int d) { return d <= 4 ? 8 : 4; }
constexpr int kTop2MaxNb = 8;
constexpr int kTileBytes = 128 * 1024;
constexpr int kGroupPoints = 128;  // points sharing each tile (state: 192 B per point)

using Top2Fn = void (*)(const SoACentroids&, const float*, int, int, Top2State*);
template <int... Ds>
Top2Fn pick_top2_impl(int d, std::integer_sequence<int, Ds...>) {
  Top2Fn f = nullptr;
  ((d == Ds + 1 ? (f = top2_tile<Ds + 1, top2_nb(Ds + 1)>, 0) : 0), ...);
  return f;
}
Top2Fn pick_top2_fn(int d) { return pick_top2_impl(d, std::make_integer_sequence<int, kMaxUnrolledDim>{}); }

void nearest_range_top2(const SoACentroids& s, Top2Fn top2, const float* x, const float* cb, int64_t i0, int64_t i1,
                        int32_t* assign, float* dist) {
  const int d = s.d, K = s.K, Kp = s.Kp;
  const int nb = top2_nb(d);
  const int tile = std::max(16, (kTileBytes / (4 * (d + 1))) / 16 * 16);
  std::vector<float> xm2(size_t(kGroupPoints) * 16);
  std::vector<Top2State> st(static_cast<size_t>(kGroupPoints));
  float nxs[kGroupPoints];
  bool direct[kGroupPoints];
  const Top2State init{_mm512_set1_ps(INFINITY), _mm512_set1_ps(INFINITY), _mm512_setzero_si512()};
  for (int64_t g0 = i0; g0 < i1; g0 += kGroupPoints) {
    const int np = int(std::min<int64_t>(kGroupPoints, i1 - g0));
    const int npad = (np + nb - 1) / nb * nb;
    for (int b = 0; b < npad; ++b) {
      float* xm = xm2.data() + size_t(b) * 16;
      st[size_t(b)] = init;
      if (b >= np) {  // padding points: zeros, results ignored
        for (int j = 0; j < d; ++j) xm[j] = 0.0f;
        continue;
      }
      const float* xs = x + (g0 + b) * d;
      float nx = 0.0f;
      for (int j = 0; j < d; ++j) {
        nx += xs[j] * xs[j];
        xm[j] = -2.0f * xs[j];
      }
      nxs[b] = nx;
      // non-finite (nx is then inf or nan), or squares could overflow: no kernel
      direct[b] = !(nx < 1e34f) || !(2.0 * nx + 2.0 * s.cmax2 < 1e36);  // (||x|| + ||c||)² ≤ 2nx + 2cmax²
      if (direct[b])
        for (int j = 0; j < d; ++j) xm[j] = 0.0f;  // keep the kernel's inputs tame
    }
    for (int c0 = 0; c0 < Kp; c0 += tile) {
      const int c1 = std::min(Kp, c0 + tile);
      for (int b = 0; b < npad; b += nb) top2(s, xm2.data() + size_t(b) * 16, c0, c1, st.data() + b);
    }
    for (int b = 0; b < np; ++b) {
      const int64_t i = g0 + b;
      const float* xs = x + i * d;
      float best_d = NAN;
      int32_t c;
      if (direct[b]) {
        bool fin = true;
        for (int j = 0; j < d; ++j) fin = fin && std::isfinite(xs[j]);
        c = fin ? oracle_argmin(xs, cb, K, d, &best_d) : 0;
      } else {
        c = top2_finish(st[size_t(b)], s, xs, cb, nxs[b]);
        if (c < 0) c = oracle_argmin(xs, cb, K, d, &best_d);
        else if (dist) best_d = pq_sub_distance_ref(xs, cb + size_t(c) * d, d);
      }
      assign[i] = c;
      if (dist) dist[i] = best_d;
    }
  }
}
#else
using Top2Fn = void (*)();
Top2Fn pick_top2_fn(int) { return nullptr; }
void nearest_range_top2(const SoACentroids&, Top2Fn, const float*, const float*, int64_t, int64_t, int32_t*, float*) {}
#endif

// First index c in [c0, K) with buf[c] <= thr; K if none.
inline int next_candidate(const float* buf, int c0, int K, float thr) {
  int c = c0;
#if defined(__AVX512F__)
  const __m512 t = _mm512_set1_ps(thr);
  for (; c + 16 <= K; c += 16) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(buf + c), t, _CMP_LE_OQ);
    if (m) return c + __builtin_ctz(unsigned(m));
  }
#elif defined(__AVX2__)
  const __m256 t = _mm256_set1_ps(thr);
  for (; c + 8 <= K; c += 8) {
    const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(buf + c), t, _CMP_LE_OQ));
    if (m) return c + __builtin_ctz(unsigned(m));
  }
#endif
  for (; c < K; ++c)
    if (buf[c] <= thr) return c;
  return K;
}

int32_t oracle_argmin(const float* xs, const float* cb, int k, int d, float* best_out) {
  int32_t best = 0;
  float best_d = pq_sub_distance_ref(xs, cb, d);
  for (int c = 1; c < k; ++c) {
    const float dist = pq_sub_distance_ref(xs, cb + size_t(c) * d, d);
    if (dist < best_d) {
      best_d = dist;
      best = c;
    }
  }
  *best_out = best_d;
  return best;
}

void nearest_range(const SoACentroids& s, ScoreFn score, const float* x, const float* cb, int64_t i0, int64_t i1,
                   int32_t* assign, float* dist) {
  const int d = s.d, K = s.K;
  const int ldx = d;
  std::vector<float> buf(size_t(kBlock) * s.Kp);
  std::vector<float> xm2(size_t(kBlock) * d);
  float amin[kBlock];
  double nxs[kBlock];
  bool fast[kBlock], finite[kBlock];
  for (int64_t p0 = i0; p0 < i1; p0 += kBlock) {
    const int nb = int(std::min<int64_t>(kBlock, i1 - p0));
    bool any_fast = false;
    for (int b = 0; b < nb; ++b) {
      const float* xs = x + (p0 + b) * d;
      double nx = 0.0;
      bool fin = true;
      for (int j = 0; j < d; ++j) {
        fin = fin && std::isfinite(xs[j]);
        nx += double(xs[j]) * xs[j];
        xm2[size_t(b) * ldx + j] = -2.0f * xs[j];
      }
      const double r = std::sqrt(nx) + s.cmax;
      finite[b] = fin;
      fast[b] = fin && r * r < 1e36;
      nxs[b] = nx;
      if (!fast[b])
        for (int j = 0; j < d; ++j) xm2[size_t(b) * ldx + j] = 0.0f;  // keep the kernel's inputs tame
      any_fast = any_fast || fast[b];
    }
    if (any_fast) score(s, xm2.data(), ldx, nb, buf.data(), amin);
    for (int b = 0; b < nb; ++b) {
      const int64_t i = p0 + b;
      const float* xs = x + i * d;
      int32_t code = 0;
      float best_d = NAN;
      if (!finite[b]) {
        code = 0;
      } else if (!fast[b]) {
        code = oracle_argmin(xs, cb, K, d, &best_d);
      } else {
        const float* bb = buf.data() + size_t(b) * s.Kp;
        const int w = next_candidate(bb, 0, K, amin[b]);  // first index at the minimum
        const float margin = w < K ? tie_margin(d, float(nxs[b]), dist_f(xs, cb + size_t(w) * d, d)) : 0.0f;
        const float thr = (amin[b] + margin) + std::fabs(amin[b] + margin) * 0x1p-22f;
        int c = w < K ? next_candidate(bb, 0, K, thr) : K;
        if (c >= K) {  // cannot happen for finite scores; stay correct regardless
          code = oracle_argmin(xs, cb, K, d, &best_d);
        } else {
          code = c;
          int c2 = next_candidate(bb, c + 1, K, thr);
          if (c2 < K || dist) best_d = pq_sub_distance_ref(xs, cb + size_t(c) * d, d);
          while (c2 < K) {  // near-tie: re-rank with the oracle's distance
            const float dd = pq_sub_distance_ref(xs, cb + size_t(c2) * d, d);
            if (dd < best_d) {
              best_d = dd;
              code = c2;
            }
            c2 = next_candidate(bb, c2 + 1, K, thr);
          }
        }
      }
      assign[i] = code;
      if (dist) dist[i] = best_d;
    }
  }
}

}  // namespace

int resolve_thread_count(int n_threads, int64_t n_items, int64_t min_items_per_thread) {
  const int t = n_threads > 0 ? n_threads : default_threads();
  const int64_t cap = std::max<int64_t>(1, n_items / std::max<int64_t>(1, min_items_per_thread));
  return int(std::max<int64_t>(1, std::min<int64_t>(t, cap)));
}

void parallel_ranges(int64_t n, int n_threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (n_threads <= 1 || n <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  std::vector<std::thread> th;
  std::vector<std::exception_ptr> errs(static_cast<size_t>(n_threads));
  th.reserve(size_t(n_threads));
  for (int t = 1; t < n_threads; ++t) {
    const int64_t r0 = n * t / n_threads, r1 = n * (t + 1) / n_threads;
    th.emplace_back([&, t, r0, r1]() {
      try {
        fn(r0, r1);
      } catch (...) {
        errs[size_t(t)] = std::current_exception();
      }
    });
  }
  try {
    fn(0, n / n_threads);
  } catch (...) {
    errs[0] = std::current_exception();
  }
  for (auto& t : th) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

struct PreparedCentroids {
  SoACentroids s;
};

std::shared_ptr<const PreparedCentroids> prepare_centroids(const float* cb, int k, int d) {
  auto p = std::make_shared<PreparedCentroids>();
  p->s = make_soa(cb, k, d);
  return p;
}

int64_t prepared_bytes(const PreparedCentroids& p) {
  return int64_t(sizeof(float)) * int64_t(p.s.cbT.size() + p.s.norms.size());
}

void nearest_centroids(const float* x, int64_t n, int d, const float* cb, int k, int32_t* assign, float* dist,
                       int n_threads) {
  if (n <= 0) return;
  const PreparedCentroids p{make_soa(cb, k, d)};
  nearest_centroids(p, x, n, d, cb, k, assign, dist, n_threads);
}

void nearest_centroids(const PreparedCentroids& p, const float* x, int64_t n, int d, const float* cb, int k,
                       int32_t* assign, float* dist, int n_threads) {
  VQ_CHECK_VALUE(p.s.K == k && p.s.d == d, "nearest_centroids: the prepared codebook has " << p.s.K << " x " << p.s.d
                                                                                          << " centroids, the search "
                                                                                          << k << " x " << d);
  if (n <= 0) return;
  const SoACentroids& s = p.s;
  const ScoreFn score = pick_score_fn(d);
  const Top2Fn top2 = pick_top2_fn(d);
  // ≥ ~256k point·centroid·dim evaluations per thread before another thread pays for its start
  const int64_t per_point = int64_t(k) * d;
  const int nt = resolve_thread_count(n_threads, n, std::max<int64_t>(1, (int64_t(1) << 18) / per_point));
  parallel_ranges(n, nt, [&](int64_t r0, int64_t r1) {
    if (top2) nearest_range_top2(s, top2, x, cb, r0, r1, assign, dist);
    else nearest_range(s, score, x, cb, r0, r1, assign, dist);
  });
}

}  // namespace veloxquant::detail
