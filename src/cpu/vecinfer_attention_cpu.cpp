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
//   slices fit 32 KiB are done for 1024 tokens before the next MB (scores accumulate in place).
//   Dequant path (otherwise, e.g. the default 12-bit keys, whose LUT would be 2 MiB): each
//   vector slice of K̃_t (16 floats with AVX-512, 8 with AVX2) is assembled in a register from
//   codebook rows (4 or 2 of d4, 2 or 1 of d8) and dotted with the 4 rows, two tokens at a time
//   where the registers allow (simd_vec.h's VecF; scalar without AVX2). A key codebook
//   on its int8 grid (the caches' default) is read as int8 rows (ProductQuantizer::codebook_i8,
//   16 KiB for d4b12 instead of 64: it stays in L1) against q̃·scale.
//   Codes that are not whole bytes are unpacked 16 at a time (AVX-512 VBMI byte permute) or 8
//   (AVX2 byte shuffle); a block of contiguous unpadded rows is unpacked as one stream.
// Values (coded chunk), after the chunk's scores became p = exp(s − max):
//   histogram path (codebook_bits <= 8, chunk >= 2·n_centroids tokens): T4[m][c][r] += p[t][r] for
//     c = code_{t,m} (one 16-byte read-modify-write per token and sub-vector, blocked like the
//     LUT), then o[r][m·d + e] = Σ_c T4[m][c][r]·C_v[c][e].
//   Dequant path (otherwise): o[r] += p[t][r]·V̂_t, 64 dims x 4 rows in registers (AVX-512;
//   16 dims with AVX2).
// Window piece: dense_partial over the exact rows with the untransformed q (scale·q·K̂).
//
// Paired row blocks: where row blocks 2i and 2i+1 of one (batch, kv head) both have a coded unit
// over the same tokens (GQA groups of 5 to 8 at decode, neighbouring queries of a prefill chunk),
// one task does both with W = 8 lanes: LUT8 / T8 tables [n_sub, n_centroids, 8] (one 32-byte
// access per token and sub-vector serves 8 rows; slices of up to 64 KiB) and 8-row dequant
// kernels (each assembled slice feeds 8 FMAs; values in 32-dim groups). Each block keeps its
// own scores [n, 4], softmax and partial; the 8-lane tables read and write them interleaved.
//
// The LUT build and histogram reduction use a codebook re-laid out as CX[e][c][W] (C[c][e]
// repeated over the W lanes), so kLanes / W centroids × W rows are one vector.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "cpu/attention_kernels.h"
#include "cpu/simd_util.h"
#include "cpu/simd_vec.h"
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

// ---- W-lane float vectors: W = 4 lanes are the rows of one row block, W = 8 of two ----------
// (two row blocks of one GQA group over the same tokens: groups of 5 to 8 query heads, or
// neighbouring queries of a prefill chunk, so every code and table read serves 8 rows).
// SSE / AVX where present, plain floats elsewhere.
template <int W>
struct Lanes;
template <>
struct Lanes<4> {
#if defined(__SSE2__)
  using V = __m128;
  static V load(const float* p) { return _mm_loadu_ps(p); }
  static void store(float* p, V x) { _mm_storeu_ps(p, x); }
  static V add(V a, V b) { return _mm_add_ps(a, b); }
  static V zero() { return _mm_setzero_ps(); }
#else
  struct V {
    float v[4];
  };
  static V load(const float* p) { return {{p[0], p[1], p[2], p[3]}}; }
  static void store(float* p, V x) { std::memcpy(p, x.v, 16); }
  static V add(V a, V b) { return {{a.v[0] + b.v[0], a.v[1] + b.v[1], a.v[2] + b.v[2], a.v[3] + b.v[3]}}; }
  static V zero() { return {{0, 0, 0, 0}}; }
#endif
};
template <>
struct Lanes<8> {
#if defined(__AVX__)
  using V = __m256;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V zero() { return _mm256_setzero_ps(); }
#else
  using H = Lanes<4>;
  struct V {
    H::V lo, hi;
  };
  static V load(const float* p) { return {H::load(p), H::load(p + 4)}; }
  static void store(float* p, V x) { H::store(p, x.lo), H::store(p + 4, x.hi); }
  static V add(V a, V b) { return {H::add(a.lo, b.lo), H::add(a.hi, b.hi)}; }
  static V zero() { return {H::zero(), H::zero()}; }
#endif
};

// ---- LUT scores and histogram, blocked over m ----------------------------------------------
// idx: codes of n tokens, row stride istride (bytes for I = uint8_t, entries for uint16_t).
// Tables are [n_sub, nc, W], scores / weights [n, W]. NC > 0: the centroid count as a
// compile-time constant (table offsets become displacements, which frees the registers the
// runtime offsets would take); NC == 0: nc at run time.
template <int W, int MB, int NC, typename I>
void lut_scores_t(const I* idx, int64_t istride, int64_t n, int n_sub, int nc_rt, const float* lut, float* S) {
  using L = Lanes<W>;
  const size_t nc = NC > 0 ? size_t(NC) : size_t(nc_rt);
  for (int m0 = 0; m0 < n_sub; m0 += MB) {
    const float* T = lut + size_t(m0) * nc * W;
    for (int64_t t = 0; t < n; ++t) {
      const I* c = idx + t * istride + m0;
      auto a0 = L::load(S + W * t), a1 = L::zero();
      if constexpr (MB == 1) {
        a0 = L::add(a0, L::load(T + size_t(c[0]) * W));
      } else {
        for (int k = 0; k < MB; k += 2) {
          a0 = L::add(a0, L::load(T + size_t(k) * nc * W + size_t(c[k]) * W));
          a1 = L::add(a1, L::load(T + size_t(k + 1) * nc * W + size_t(c[k + 1]) * W));
        }
      }
      L::store(S + W * t, L::add(a0, a1));
    }
  }
}

template <int W, int MB, int NC, typename I>
void hist_add_t(const I* idx, int64_t istride, int64_t n, int n_sub, int nc_rt, const float* P, float* T4) {
  using L = Lanes<W>;
  const size_t nc = NC > 0 ? size_t(NC) : size_t(nc_rt);
  for (int m0 = 0; m0 < n_sub; m0 += MB) {
    float* T = T4 + size_t(m0) * nc * W;
    for (int64_t t = 0; t < n; ++t) {
      const I* c = idx + t * istride + m0;
      const auto p = L::load(P + W * t);
      for (int k = 0; k < MB; ++k) {
        float* d = T + size_t(k) * nc * W + size_t(c[k]) * W;  // k·nc·W: a displacement when NC > 0
        L::store(d, L::add(L::load(d), p));
      }
    }
  }
}

// The hot case (8-bit codes, 256 centroids, MB sub-vectors per block): the MB codes of a block
// come from one load and each byte offset (code·W·4) is extracted with a shift and a mask, so
// a table access costs a shift, an and and the load (plus the store for the histogram), with
// the table slice's base as a displacement.
template <int W, int K>
inline uint64_t b8_offset(uint64_t x) {
  constexpr int sh = W == 4 ? 4 : 5;  // log2 of the bytes per centroid entry (W floats)
  constexpr uint64_t mask = uint64_t(0xFF) << sh;
  if constexpr (8 * K >= sh) return (x >> (8 * K - sh)) & mask;
  else return (x << (sh - 8 * K)) & mask;
}

// MB codes from one load: MB <= 8 bytes at p, as a little-endian integer.
template <int MB>
inline uint64_t load_codes(const uint8_t* p) {
  uint64_t x = 0;
  std::memcpy(&x, p, MB);
  return x;
}

// fn(integral_constant<int, K>) for K = 0 .. N-1, in order.
template <int N, typename Fn>
inline void unrolled(Fn&& fn) {
  [&]<int... K>(std::integer_sequence<int, K...>) { (fn(std::integral_constant<int, K>{}), ...); }(
      std::make_integer_sequence<int, N>{});
}

template <int W, int MB>
inline void hist_add_b8_256(const uint8_t* idx, int64_t istride, int64_t n, int n_sub, const float* P, float* T4) {
  using L = Lanes<W>;
  constexpr int slice = 256 * W * 4;  // bytes of one sub-vector's table
  constexpr int G8 = MB >= 8 ? 8 : MB;  // codes per load
  for (int m0 = 0; m0 < n_sub; m0 += MB) {
    char* T = reinterpret_cast<char*>(T4 + size_t(m0) * 256 * W);
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* c = idx + t * istride + m0;
      const auto p = L::load(P + W * t);
      unrolled<MB / G8>([&](auto g) {
        const uint64_t x = load_codes<G8>(c + g.value * G8);
        unrolled<G8>([&](auto k) {
          float* d = reinterpret_cast<float*>(T + (g.value * G8 + k.value) * slice + b8_offset<W, k.value>(x));
          L::store(d, L::add(L::load(d), p));
        });
      });
    }
  }
}

template <int W, int MB>
inline void lut_scores_b8_256(const uint8_t* idx, int64_t istride, int64_t n, int n_sub, const float* lut, float* S) {
  using L = Lanes<W>;
  constexpr int slice = 256 * W * 4;
  for (int m0 = 0; m0 < n_sub; m0 += MB) {
    const char* T = reinterpret_cast<const char*>(lut + size_t(m0) * 256 * W);
    int64_t t = 0;
#if defined(__AVX__)
    if constexpr (W == 4 && MB <= 8) {
      // Two tokens per 256-bit vector (token t in the low half, t+1 in the high half): half the
      // adds and a shorter dependency chain per token.
      for (; t + 2 <= n; t += 2) {
        uint64_t x = 0, y = 0;
        std::memcpy(&x, idx + t * istride + m0, MB);
        std::memcpy(&y, idx + (t + 1) * istride + m0, MB);
        auto at = [&](auto k) {
          const char* base = T + k.value * slice;
          const __m128 lo = _mm_loadu_ps(reinterpret_cast<const float*>(base + b8_offset<4, k.value>(x)));
          const __m128 hi = _mm_loadu_ps(reinterpret_cast<const float*>(base + b8_offset<4, k.value>(y)));
          return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
        };
        __m256 a0 = _mm256_loadu_ps(S + 4 * t), a1 = _mm256_setzero_ps();
        unrolled<MB>([&](auto k) {
          if constexpr (k.value % 2 == 0) a0 = _mm256_add_ps(a0, at(k));
          else if constexpr (k.value == 1) a1 = at(k);
          else a1 = _mm256_add_ps(a1, at(k));
        });
        _mm256_storeu_ps(S + 4 * t, _mm256_add_ps(a0, a1));
      }
    }
#endif
    constexpr int G8 = MB >= 8 ? 8 : MB;  // codes per load
    for (; t < n; ++t) {
      const uint8_t* c = idx + t * istride + m0;
      auto a0 = L::load(S + W * t), a1 = L::zero();
      unrolled<MB / G8>([&](auto g) {
        const uint64_t x = load_codes<G8>(c + g.value * G8);
        unrolled<G8>([&](auto k) {
          const auto v = L::load(reinterpret_cast<const float*>(T + (g.value * G8 + k.value) * slice +
                                                                b8_offset<W, k.value>(x)));
          if constexpr (k.value % 2 == 0) a0 = L::add(a0, v);
          else if constexpr (g.value == 0 && k.value == 1) a1 = v;
          else a1 = L::add(a1, v);
        });
      });
      L::store(S + W * t, L::add(a0, a1));
    }
  }
}

// Largest m block (8, 4, 2, 1) dividing n_sub whose table slice (mb · nc · W floats) fits
// kL1Slice · W / 4: 32 KiB for one row block's tables, 64 KiB for two (an 8-lane table slice of
// 8 sub-vectors in L2 beat 4 in L1 with the [n, 8] scores streamed twice as often: d4b8/d4b8 at
// group 8, 32768 tokens, one thread: 4.86 ms against 5.59; 16 or 32 key sub-vectors a slice were
// within noise of 8, value slices of 16 or 32 slower, 5.7 and 6.5 ms).
int pick_mb(int n_sub, int nc, int W) {
  for (int mb : {8, 4, 2}) {
    if (n_sub % mb == 0 && size_t(mb) * nc * W * 4 <= kL1Slice * size_t(W) / 4) return mb;
  }
  return 1;
}

// The two table passes, as kernel families for table_pass: `generic` for any code type and
// centroid count, `hot` for bytes and 256 centroids. Both read `in` ([n_sub, nc, W] LUT /
// [n, W] weights) and accumulate into `out` ([n, W] scores / [n_sub, nc, W] histogram).
struct LutPass {
  template <int W, int MB, int NC, typename I>
  static void generic(const I* idx, int64_t istride, int64_t n, int n_sub, int nc, const float* in, float* out) {
    lut_scores_t<W, MB, NC>(idx, istride, n, n_sub, nc, in, out);
  }
  template <int W, int MB>
  static void hot(const uint8_t* idx, int64_t istride, int64_t n, int n_sub, const float* in, float* out) {
    lut_scores_b8_256<W, MB>(idx, istride, n, n_sub, in, out);
  }
};
struct HistPass {
  template <int W, int MB, int NC, typename I>
  static void generic(const I* idx, int64_t istride, int64_t n, int n_sub, int nc, const float* in, float* out) {
    hist_add_t<W, MB, NC>(idx, istride, n, n_sub, nc, in, out);
  }
  template <int W, int MB>
  static void hot(const uint8_t* idx, int64_t istride, int64_t n, int n_sub, const float* in, float* out) {
    hist_add_b8_256<W, MB>(idx, istride, n, n_sub, in, out);
  }
};

// K's kernel for the run-time m block and centroid count (the key LUT has at most
// 2^kMaxLutBits = 512 centroids, the histogram 256: only 256 is a compile-time constant).
template <typename K, int W, typename I>
void table_pass(int mb, const I* idx, int64_t istride, int64_t n, int n_sub, int nc, const float* in, float* out) {
  if constexpr (std::is_same_v<I, uint8_t>) {
    if (nc == 256 && mb == 8) return K::template hot<W, 8>(idx, istride, n, n_sub, in, out);
    if (nc == 256 && mb == 4) return K::template hot<W, 4>(idx, istride, n, n_sub, in, out);
  }
  auto with_nc = [&]<int NC>() {
    switch (mb) {
      case 8: return K::template generic<W, 8, NC>(idx, istride, n, n_sub, nc, in, out);
      case 4: return K::template generic<W, 4, NC>(idx, istride, n, n_sub, nc, in, out);
      case 2: return K::template generic<W, 2, NC>(idx, istride, n, n_sub, nc, in, out);
      default: return K::template generic<W, 1, NC>(idx, istride, n, n_sub, nc, in, out);
    }
  };
  if (nc == 256) return with_nc.template operator()<256>();
  return with_nc.template operator()<0>();
}

// ---- tables from the expanded codebook CX[e][c][W] ---------------------------------------------
// lut[m][c][r] = Σ_e q[r][m·d + e] · C[c][e]   (q: W row pointers)
template <int W>
void build_lut(const float* CX, int d, int n_sub, int nc, const float* const* q, float* lut) {
  for (int m = 0; m < n_sub; ++m) {
    float* L = lut + size_t(m) * nc * W;
#if VQ_HAVE_VECF
    using V = VecF;
    constexpr int CPV = V::kLanes / W;  // centroids per vector
    if (nc % CPV == 0 && d <= 16) {
      typename V::T qp[16];
      for (int e = 0; e < d; ++e) {
        float v[W];
        for (int r = 0; r < W; ++r) v[r] = q[r][m * d + e];
        qp[e] = V::template rep<W>(v);
      }
      for (int c = 0; c < nc; c += CPV) {
        auto acc = V::mul(V::load(CX + size_t(c) * W), qp[0]);
        for (int e = 1; e < d; ++e) acc = V::fmadd(V::load(CX + (size_t(e) * nc + c) * W), qp[e], acc);
        V::store(L + size_t(c) * W, acc);
      }
      continue;
    }
#endif
    for (int c = 0; c < nc; ++c)
      for (int r = 0; r < W; ++r) {
        float acc = 0.0f;
        for (int e = 0; e < d; ++e) acc += q[r][m * d + e] * CX[(size_t(e) * nc + c) * W];
        L[size_t(c) * W + r] = acc;
      }
  }
}

// o[r][m·d + e] += Σ_c T[m][c][r] · C[c][e]   (o: W row pointers)
template <int W>
void reduce_hist(const float* CX, int d, int n_sub, int nc, const float* T4, float* const* o) {
  for (int m = 0; m < n_sub; ++m) {
    const float* T = T4 + size_t(m) * nc * W;
#if VQ_HAVE_VECF
    using V = VecF;
    constexpr int CPV = V::kLanes / W;
    if (nc % CPV == 0) {
      for (int e = 0; e < d; ++e) {
        const float* C = CX + size_t(e) * nc * W;
        auto acc0 = V::zero(), acc1 = acc0;
        int c = 0;
        for (; c + 2 * CPV <= nc; c += 2 * CPV) {
          acc0 = V::fmadd(V::load(T + size_t(c) * W), V::load(C + size_t(c) * W), acc0);
          acc1 = V::fmadd(V::load(T + size_t(c + CPV) * W), V::load(C + size_t(c + CPV) * W), acc1);
        }
        for (; c < nc; c += CPV) acc0 = V::fmadd(V::load(T + size_t(c) * W), V::load(C + size_t(c) * W), acc0);
        float rw[W];
        V::template fold<W>(V::add(acc0, acc1), rw);
        for (int r = 0; r < W; ++r) o[r][m * d + e] += rw[r];
      }
      continue;
    }
#endif
    for (int e = 0; e < d; ++e)
      for (int r = 0; r < W; ++r) {
        float acc = 0.0f;
        for (int c = 0; c < nc; ++c) acc += T[size_t(c) * W + r] * CX[(size_t(e) * nc + c) * W];
        o[r][m * d + e] += acc;
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

#if VQ_HAVE_VECF
// S[t][r] = q[r] · decode(codes_t) for NR = 4 or 8 query rows, sub_dim 4 or 8 and
// head_dim % V::kLanes == 0: each L-float slice of K̃_t is assembled from L / sub_dim codebook
// rows straight into a register, then one FMA per query row; the row sums are reduced 4 at a
// time. Used for codebooks too large for a per-query table (12-bit keys: a 2 MiB LUT would not
// stay cached, the codebook does). Tokens go in pairs where the registers hold both tokens'
// accumulators (AVX-512; AVX2 at 4 rows): each query slice loaded serves both tokens' FMAs,
// which cuts the loads per token by a third (the loop is bound by loads and the inserts'
// shuffle port); with 8 rows each assembled slice serves 8 FMAs instead of 4.
//
// Two codebook forms, one loop (scores_rows takes the slice loader):
//   F32Slices: float rows (16 / 32 bytes a centroid: a d4b12 codebook is 64 KiB, past L1);
//   I8Slices:  int8 rows (ProductQuantizer::codebook_i8, 4 / 8 bytes a centroid: 16 KiB for
//              d4b12), widened in a register; the caller passes q·codebook_i8_scale, so
//              Σ q·(byte·scale) becomes Σ (q·scale)·byte — the same centroids (the codebook
//              is byte·scale exactly); only the products' rounding differs.
template <typename V, int DSUB>
struct F32Slices {
  const float* cb;
  template <typename I>
  typename V::T operator()(const I* c, int64_t d) const {
    return V::template f32_slice<DSUB>(cb, c + d / DSUB);
  }
};

template <typename V, int DSUB>
struct I8Slices {
  const int8_t* cb;
  template <typename I>
  typename V::T operator()(const I* c, int64_t d) const {
    return V::template i8_slice<DSUB>(cb, c + d / DSUB);
  }
};

// q: NR row pointers; S: NR / 4 score arrays [n, 4] (rows 4j..4j+3 go to S[j]).
template <typename V, int NR, typename Slices, typename I>
__attribute__((noinline)) void scores_rows(const Slices& slice_ref, const I* idx, int64_t istride, int64_t n,
                                           const float* const* q_ref, int64_t D, float* const* S) {
  using T = typename V::T;
  constexpr int L = V::kLanes;
  constexpr bool kPairs = 2 * NR + 3 <= V::kRegs;  // both tokens' accumulators, 2 slices and q
  const Slices slice = slice_ref;  // (locals: no reloads through the pointers in the loop)
  const float* q[NR];
  for (int r = 0; r < NR; ++r) q[r] = q_ref[r];
  int64_t t = 0;
  if constexpr (kPairs) {
    for (; t + 2 <= n; t += 2) {
      const I* c0 = idx + t * istride;
      const I* c1 = c0 + istride;
      T a[NR], b[NR];
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) a[r] = b[r] = V::zero();
      for (int64_t d = 0; d < D; d += L) {
        const T k0 = slice(c0, d), k1 = slice(c1, d);
#pragma GCC unroll 8
        for (int r = 0; r < NR; ++r) {
          const T qv = V::load(q[r] + d);
          a[r] = V::fmadd(qv, k0, a[r]);
          b[r] = V::fmadd(qv, k1, b[r]);
        }
      }
#pragma GCC unroll 2
      for (int j = 0; j < NR / 4; ++j) {
        _mm_storeu_ps(S[j] + 4 * t, V::hsum4(a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3]));
        _mm_storeu_ps(S[j] + 4 * t + 4, V::hsum4(b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]));
      }
    }
  }
  for (; t < n; ++t) {  // one token at a time: the odd last one, or all where pairs do not fit
    const I* c = idx + t * istride;
    T a[NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) a[r] = V::zero();
    for (int64_t d = 0; d < D; d += L) {
      const T kv = slice(c, d);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) a[r] = V::fmadd(V::load(q[r] + d), kv, a[r]);
    }
#pragma GCC unroll 2
    for (int j = 0; j < NR / 4; ++j)
      _mm_storeu_ps(S[j] + 4 * t, V::hsum4(a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3]));
  }
}

// o[r] += Σ_t P[t][r]·V̂_t for NR = 4 or 8 rows, sub_dim 4 or 8 and head_dim % V::kLanes == 0,
// with the slice loaders of the key kernel: dims in groups of NS = kAcc / NR vectors (NR · NS
// accumulators stay in registers over every token of the block), each slice of V̂_t assembled
// once per group and multiplied by the rows' broadcast weights. `scale` multiplies the group's
// sums as they are added to o (codebook_i8_scale for int8 rows, 1 for floats). Tokens whose
// weights are all zero (masked) are skipped, as in dequant_values. P: NR / 4 weight arrays
// [n, 4]; o: NR row pointers.
template <typename V, int NR, typename Slices, typename I>
__attribute__((noinline)) void values_rows(const Slices& slice_ref, const I* idx, int64_t istride, int64_t n,
                                           const float* const* P, int64_t D, float scale, float* const* o) {
  using T = typename V::T;
  constexpr int L = V::kLanes;
  constexpr int NS = V::kAcc / NR;  // slices per group
  const Slices slice = slice_ref;  // (locals: no reloads through the pointers in the loop)
  const float* const P0 = P[0];
  const float* const P1 = P[NR / 4 - 1];
  for (int64_t g0 = 0; g0 < D; g0 += L * NS) {
    const int ns = int(std::min<int64_t>(NS, (D - g0) / L));
    T acc[NR][NS];
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < NS; ++j) acc[r][j] = V::zero();
    for (int64_t t = 0; t < n; ++t) {
      const float* p0 = P0 + 4 * t;
      const float* p1 = P1 + 4 * t;
      bool zero = p0[0] == 0.0f && p0[1] == 0.0f && p0[2] == 0.0f && p0[3] == 0.0f;
      if constexpr (NR == 8) zero = zero && p1[0] == 0.0f && p1[1] == 0.0f && p1[2] == 0.0f && p1[3] == 0.0f;
      if (zero) continue;
      const I* c = idx + t * istride;
      T pv[NR];
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) pv[r] = V::set1(r < 4 ? p0[r] : p1[r - 4]);
      auto step = [&](int j) {
        const T kv = slice(c, g0 + L * j);
#pragma GCC unroll 8
        for (int r = 0; r < NR; ++r) acc[r][j] = V::fmadd(pv[r], kv, acc[r][j]);
      };
      if (ns == NS) {  // the common case, unrolled so the accumulators stay in registers
#pragma GCC unroll 4
        for (int j = 0; j < NS; ++j) step(j);
      } else {
        for (int j = 0; j < ns; ++j) step(j);
      }
    }
    const T sv = V::set1(scale);
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < ns; ++j) {
        float* dst = o[r] + g0 + L * j;
        V::store(dst, V::fmadd(acc[r][j], sv, V::load(dst)));
      }
  }
}
#endif

// Dequant scores of NB row blocks (4·NB rows q, NB score arrays S), on the register-assembling
// kernels where they apply. q_i8: the rows multiplied by pq.codebook_i8_scale (null when the
// codebook has no int8 form). Elsewhere the scalar kernel, one row block at a time (its 4 rows
// follow each other at stride D).
template <int NB, typename I>
void dequant_scores_any(const I* idx, int64_t istride, int64_t n, const ProductQuantizer& pq, const float* const* q,
                        const float* const* q_i8, int64_t D, float* row, float* const* S) {
#if VQ_HAVE_VECF
  if (D % VecF::kLanes == 0 && (pq.sub_dim == 4 || pq.sub_dim == 8)) {
    constexpr int NR = 4 * NB;
    using V = VecF;
    if (q_i8 && !pq.codebook_i8.empty()) {
      const int8_t* cb = pq.codebook_i8.data();
      if (pq.sub_dim == 4) return scores_rows<V, NR>(I8Slices<V, 4>{cb}, idx, istride, n, q_i8, D, S);
      return scores_rows<V, NR>(I8Slices<V, 8>{cb}, idx, istride, n, q_i8, D, S);
    }
    const float* cb = pq.codebook.data();
    if (pq.sub_dim == 4) return scores_rows<V, NR>(F32Slices<V, 4>{cb}, idx, istride, n, q, D, S);
    return scores_rows<V, NR>(F32Slices<V, 8>{cb}, idx, istride, n, q, D, S);
  }
#endif
  (void)q_i8;
  for (int j = 0; j < NB; ++j) dequant_scores(idx, istride, n, pq, q[4 * j], D, row, S[j]);
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

// Dequant values of NB row blocks (weights P: NB arrays [n, 4]; o: 4·NB row pointers), dispatched
// like dequant_scores_any.
template <int NB, typename I>
void dequant_values_any(const I* idx, int64_t istride, int64_t n, const ProductQuantizer& pq, const float* const* P,
                        int64_t D, float* row, float* const* o) {
#if VQ_HAVE_VECF
  if (D % VecF::kLanes == 0 && (pq.sub_dim == 4 || pq.sub_dim == 8)) {
    constexpr int NR = 4 * NB;
    using V = VecF;
    if (!pq.codebook_i8.empty()) {
      const int8_t* cb = pq.codebook_i8.data();
      const float s = pq.codebook_i8_scale;
      if (pq.sub_dim == 4) return values_rows<V, NR>(I8Slices<V, 4>{cb}, idx, istride, n, P, D, s, o);
      return values_rows<V, NR>(I8Slices<V, 8>{cb}, idx, istride, n, P, D, s, o);
    }
    const float* cb = pq.codebook.data();
    if (pq.sub_dim == 4) return values_rows<V, NR>(F32Slices<V, 4>{cb}, idx, istride, n, P, D, 1.0f, o);
    return values_rows<V, NR>(F32Slices<V, 8>{cb}, idx, istride, n, P, D, 1.0f, o);
  }
#endif
  for (int j = 0; j < NB; ++j) dequant_values(idx, istride, n, pq, P[j], D, row, o[4 * j]);
}

// CX[e][c][W] = C[c][e]
std::vector<float> expand_codebook(const ProductQuantizer& pq, int W) {
  const int nc = pq.n_centroids, d = pq.sub_dim;
  std::vector<float> cx(size_t(nc) * d * W);
  for (int e = 0; e < d; ++e)
    for (int c = 0; c < nc; ++c)
      for (int r = 0; r < W; ++r) cx[(size_t(e) * nc + c) * W + r] = pq.codebook[size_t(c) * d + e];
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
  int key_mb[2], value_mb[2];         // m blocks for one row block (4 lanes) and for two (8 lanes)
  std::vector<float> kcx[2], vcx[2];  // expanded codebooks, 4 and 8 lanes (only where used)
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
// variable shift and a mask extract it, vpmovdw narrows to 16 bits. With AVX2, 8 codes at a
// time alike: a chunk of 8 codes is `bits` <= 16 bytes from a byte boundary, so one 16-byte
// load, copied to both 128-bit halves, lets an in-lane byte shuffle (vpshufb) give each 32-bit
// lane its code's bytes (those past the 16 zeroed: a code of up to 16 bits at a shift of up to
// 7 never needs them); then the variable shift, the mask, and a pack to 16 bits. Scalar: a
// 64-bit window per code where 8 bytes fit in the row, read_code for the last ones.
struct UnpackPlan {
  int bits = 0;
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
  static constexpr int kGroup = 16;  // codes a vector step
  __m512i idx, shift, mask;
#elif defined(__AVX2__)
  static constexpr int kGroup = 8;
  __m256i idx, shift, mask;
#else
  static constexpr int kGroup = 0;
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
#elif defined(__AVX2__)
    alignas(32) uint8_t ib[32];
    alignas(32) uint32_t sh[8];
    for (int j = 0; j < 8; ++j) {
      const int bit = j * b;
      for (int k = 0; k < 4; ++k) ib[4 * j + k] = bit / 8 + k < 16 ? uint8_t(bit / 8 + k) : uint8_t(0x80);
      sh[j] = uint32_t(bit % 8);
    }
    idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(ib));
    shift = _mm256_load_si256(reinterpret_cast<const __m256i*>(sh));
    mask = _mm256_set1_epi32(int((1u << b) - 1u));
#endif
  }
};

#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
// 16 codes whose first bit starts byte p[0] (avail bytes readable from p): one 64-byte load
// (masked to avail when fewer remain), a byte permute giving each 32-bit lane the 4 bytes of
// its code, a variable shift, a mask, and a narrowing store. Always true (the masked load
// reads any group safely).
inline bool unpack_group(const uint8_t* p, int64_t avail, const UnpackPlan& plan, uint16_t* out) {
  const __m512i bytes = avail >= 64 ? _mm512_loadu_si512(p)
                                    : _mm512_maskz_loadu_epi8(__mmask64((uint64_t(1) << avail) - 1), p);
  const __m512i w =
      _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi8(plan.idx, bytes), plan.shift), plan.mask);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(w));
  return true;
}
#elif defined(__AVX2__)
// 8 codes whose first bit starts byte p[0]; false (nothing written) where fewer than 16 bytes
// are readable from p, for the scalar loop to finish.
inline bool unpack_group(const uint8_t* p, int64_t avail, const UnpackPlan& plan, uint16_t* out) {
  if (avail < 16) return false;
  const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i w = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, plan.idx), plan.shift), plan.mask);
  // codes fit 16 bits: packus keeps them; it interleaves the halves as [0-3, 0-3 | 4-7, 4-7]
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  return true;
}
#endif

// Unpacks n_codes codes of `bits` bits packed LSB-first from p, n_bytes readable: one row, or
// a block of rows that follow each other without padding bits (one stream, whose groups' windows
// run into the next rows, so only the block's last groups need a masked load or the scalar loop).
inline void unpack_codes(const uint8_t* p, int64_t n_codes, int64_t n_bytes, const UnpackPlan& plan, uint16_t* out) {
  const int bits = plan.bits;
  int64_t i = 0;
#if defined(__AVX512VBMI__) && defined(__AVX512BW__) || defined(__AVX2__)
  constexpr int G = UnpackPlan::kGroup;
  for (; i + G <= n_codes; i += G) {
    const int64_t byte0 = i * bits / 8;
    if (!unpack_group(p + byte0, n_bytes - byte0, plan, out + i)) break;
  }
#endif
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  for (; i < n_codes; ++i) {
    const int64_t bit = i * bits;
    if ((bit >> 3) + 8 <= n_bytes) {
      uint64_t w;
      std::memcpy(&w, p + (bit >> 3), 8);
      out[i] = uint16_t((w >> (bit & 7)) & mask);
    } else {
      out[i] = uint16_t(read_code(p, i, bits));
    }
  }
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
      unpack_codes(base + t * pq.code_bytes, n * pq.n_sub, n * pq.code_bytes, plan, buf.data());
    } else {
      for (int64_t i = 0; i < n; ++i)
        unpack_codes(base + (t + i) * codes.strides[2], pq.n_sub, pq.code_bytes, plan, buf.data() + i * pq.n_sub);
    }
  }
  r.wide = buf.data();
  r.stride = pq.n_sub;
  return r;
}

// The partials of NB row blocks (NB = 2: two blocks of one (b, kv head) whose units cover the
// same tokens, done with 8-lane tables and 8-row dequant kernels) over coded tokens [t0, t1).
template <int NB>
void coded_partial(const CodedContext& cx, int64_t b, int64_t kh, int64_t t0, int64_t t1, const RowBlock* const* rbs,
                   UnitScratch& scratch, Partial* const* outs) {
  constexpr int W = 4 * NB;
  const VecInferAttentionInputs& in = *cx.in;
  const ProductQuantizer& kp = *in.key_pq;
  const ProductQuantizer& vp = *in.value_pq;
  const int64_t D = cx.D;
  int64_t a, e;
  if (!begin_partials(t0, t1, D, rbs, NB, outs, a, e)) return;
  const int64_t n = e - a;
  // Scores of each block, [n, 4]; with two blocks also their interleaved form SW [n, 8] (the
  // 8-lane LUT's output and the 8-lane histogram's input).
  float* SW = scratch.scores.get(size_t(W * n + 16));
  float* S4[NB];
  if constexpr (NB == 1) {
    S4[0] = SW;
  } else {
    float* s2 = scratch.scores2.get(size_t(8 * n + 32));
    S4[0] = s2, S4[1] = s2 + 4 * n + 16;
  }
  const float* qrows[W];
  float* orows[W];
  for (int j = 0; j < NB; ++j)
    for (int r = 0; r < 4; ++r) qrows[4 * j + r] = rbs[j]->qt + r * D, orows[4 * j + r] = outs[j]->o + r * D;
  const bool use_lut = cx.key_table_ok && key_lut_pays(n, kp);
  const bool use_hist = cx.value_table_ok && value_hist_pays(n, vp);
  float* row = scratch.tmp.get(size_t((W + 1) * D));  // one decoded row, then the int8 query rows

  // Pass 1: scores.
  float* lut = nullptr;
  if (use_lut) {
    lut = scratch.lut.get(size_t(kp.n_sub) * kp.n_centroids * W);
    build_lut<W>(cx.kcx[NB - 1].data(), kp.sub_dim, kp.n_sub, kp.n_centroids, qrows, lut);
    std::fill(SW, SW + W * n, 0.0f);
  }
  // The int8 codebook form's query: q̃·scale (dequant path only).
  const float* qi8[W];
  const bool have_i8 = !use_lut && !kp.codebook_i8.empty();
  if (have_i8) {
    float* qs = row + D;
    for (int r = 0; r < W; ++r) {
      for (int64_t x = 0; x < D; ++x) qs[r * D + x] = qrows[r][x] * kp.codebook_i8_scale;
      qi8[r] = qs + r * D;
    }
  }
  for (int64_t t = 0; t < n; t += kTokenBlock) {
    const int64_t nb = std::min(kTokenBlock, n - t);
    const CodeRows cr = code_rows(in.key_codes, kp, b, kh, a + t, nb, scratch.idx);
    if (use_lut) {
      const int mb = cx.key_mb[NB - 1];
      if (cr.bytes) table_pass<LutPass, W>(mb, cr.bytes, cr.stride, nb, kp.n_sub, kp.n_centroids, lut, SW + W * t);
      else table_pass<LutPass, W>(mb, cr.wide, cr.stride, nb, kp.n_sub, kp.n_centroids, lut, SW + W * t);
    } else {
      float* St[NB];
      for (int j = 0; j < NB; ++j) St[j] = S4[j] + 4 * t;
      const float* const* q8 = have_i8 ? qi8 : nullptr;
      if (cr.bytes) dequant_scores_any<NB>(cr.bytes, cr.stride, nb, kp, qrows, q8, D, row, St);
      else dequant_scores_any<NB>(cr.wide, cr.stride, nb, kp, qrows, q8, D, row, St);
    }
  }
  if constexpr (NB == 2) {
    if (use_lut)
      for (int64_t t = 0; t < n; ++t) {
        std::memcpy(S4[0] + 4 * t, SW + 8 * t, 16);
        std::memcpy(S4[1] + 4 * t, SW + 8 * t + 4, 16);
      }
  }
  bool any = false;
  for (int j = 0; j < NB; ++j) {
    if (softmax_chunk(S4[j], a, n, *rbs[j], *outs[j])) {
      any = true;
    } else {
      std::fill(S4[j], S4[j] + 4 * n, 0.0f);  // no row of this block sees these tokens: weight 0
    }
  }
  if (!any) return;

  // Pass 2: values.
  const float* P = S4[0];
  float* T = nullptr;
  if (use_hist) {
    if constexpr (NB == 2) {
      for (int64_t t = 0; t < n; ++t) {
        std::memcpy(SW + 8 * t, S4[0] + 4 * t, 16);
        std::memcpy(SW + 8 * t + 4, S4[1] + 4 * t, 16);
      }
      P = SW;
    }
    const size_t tn = size_t(vp.n_sub) * vp.n_centroids * W;
    T = scratch.hist.get(tn);
    std::fill(T, T + tn, 0.0f);
  }
  for (int64_t t = 0; t < n; t += kTokenBlock) {
    const int64_t nb = std::min(kTokenBlock, n - t);
    const CodeRows cr = code_rows(in.value_codes, vp, b, kh, a + t, nb, scratch.idx);
    if (use_hist) {
      const int mb = cx.value_mb[NB - 1];
      if (cr.bytes) table_pass<HistPass, W>(mb, cr.bytes, cr.stride, nb, vp.n_sub, vp.n_centroids, P + W * t, T);
      else table_pass<HistPass, W>(mb, cr.wide, cr.stride, nb, vp.n_sub, vp.n_centroids, P + W * t, T);
    } else {
      const float* Pt[NB];
      for (int j = 0; j < NB; ++j) Pt[j] = S4[j] + 4 * t;
      if (cr.bytes) dequant_values_any<NB>(cr.bytes, cr.stride, nb, vp, Pt, D, row, orows);
      else dequant_values_any<NB>(cr.wide, cr.stride, nb, vp, Pt, D, row, orows);
    }
  }
  if (use_hist) reduce_hist<W>(cx.vcx[NB - 1].data(), vp.sub_dim, vp.n_sub, vp.n_centroids, T, orows);
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
  // Two row blocks of a (batch, kv head) share their coded units' passes (8 lanes) wherever
  // both have a unit over the same tokens (group_units pairs them in order): groups of 5 to 8
  // heads at decode, neighbouring queries in a prefill chunk. VQ_CPU_PAIR_ROW_BLOCKS=0 turns it
  // off (A/B).
  static const bool pair_env = [] {
    const char* s = std::getenv("VQ_CPU_PAIR_ROW_BLOCKS");
    return !(s && s[0] == '0');
  }();
  const bool pairs = pair_env && NRB >= 2;

  CodedContext cx;
  cx.in = &in;
  cx.D = D;
  cx.key_table_ok = kp.codebook_bits <= kMaxLutBits;
  cx.value_table_ok = vp.codebook_bits <= kMaxTableBits;
  for (int w = 0; w < 2; ++w) {
    cx.key_mb[w] = pick_mb(kp.n_sub, kp.n_centroids, 4 * (w + 1));
    cx.value_mb[w] = pick_mb(vp.n_sub, vp.n_centroids, 4 * (w + 1));
  }
  // the expanded codebooks only where some chunk can take the table path (see coded_partial)
  const bool key_tables = cx.key_table_ok && key_lut_pays(Nc, kp);
  const bool value_tables = cx.value_table_ok && value_hist_pays(Nc, vp);
  for (int w = 0; w < (pairs ? 2 : 1); ++w) {
    if (key_tables) cx.kcx[w] = expand_codebook(kp, 4 * (w + 1));
    if (value_tables) cx.vcx[w] = expand_codebook(vp, 4 * (w + 1));
  }
  cx.key_table_ok = key_tables;
  cx.value_table_ok = value_tables;

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

  // Tasks: one unit, or two units of one (batch, kv head) over the same tokens (row blocks of
  // one GQA group, or of neighbouring queries): coded ones done together by coded_partial<2>,
  // window ones by dense_partial_group.
  const std::vector<Task> tasks = group_units(units, first_unit, NRB, pairs ? 2 : 1);
  run_tasks(pool, int64_t(tasks.size()), [&](int64_t k, int) {
    const Task& tk = tasks[size_t(k)];
    const Unit& un = units[size_t(tk.u[0])];
    const RowBlock* blocks[2];
    Partial* outs[2];
    for (int j = 0; j < tk.n; ++j) {
      const Unit& uj = units[size_t(tk.u[j])];
      blocks[j] = &rbs[size_t((uj.b * Hkv + uj.kvh) * NRB + uj.rb)];
      outs[j] = &parts[size_t(tk.u[j])];
    }
    UnitScratch& scratch = thread_scratch();
    if (un.kind == 0) {
      if (tk.n == 2) coded_partial<2>(cx, un.b, un.kvh, un.t0, un.t1, blocks, scratch, outs);
      else coded_partial<1>(cx, un.b, un.kvh, un.t0, un.t1, blocks, scratch, outs);
    } else {
      DenseSource src = DenseSource::of(in.window_keys, in.window_values, un.b, un.kvh);
      src.pos0 = Nc;
      src.n_slots = in.window_keys.shape[2];
      src.first_slot = in.window_first_slot;
      dense_partial_group(src, un.t0, un.t1, D, blocks, tk.n, scratch, outs);
    }
  });

  merge_row_blocks(pool, rbs, first_unit, parts, Hkv, NRB, G, out);
}

}  // namespace veloxquant
