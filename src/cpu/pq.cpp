// src/cpu/pq.cpp — the optimised product quantizer: construction/validation, encode (nearest
// centroid), decode, query lookup tables, and LSB-first bit packing of the codes.
//
// Layouts: x [n, head_dim] f32 row-major; codebook [n_centroids, sub_dim]; codes [n, code_bytes]
// with code m of a row in bits [m·codebook_bits, (m+1)·codebook_bits), LSB first.
//
// Encode is brute force over all n_centroids per sub-vector, shaped for SIMD:
//  * the codebook is re-laid out per call as SoA, cbT [sub_dim][Kp] plus norms [Kp] = ||c||²
//    (Kp = n_centroids rounded up to the vector width, pad entries get norm +inf), so one
//    vector register holds one coordinate of 16 (AVX-512) or 8 (AVX2) centroids;
//  * the score is a_c = ||c||² − 2·x·c (= ||x − c||² − ||x||²): sub_dim FMAs per 16 centroids,
//    with four sub-vectors sharing each codebook load (register blocking);
//  * exactness: rounding in that form can reorder centroids whose true distances differ by
//    less than its error bound, so every centroid whose score lies within a proven bound of
//    the minimum is a candidate, and when there is more than one the candidates are re-ranked
//    with the oracle's own distance (detail::pq_sub_distance_ref), ties to the lowest index.
//    The codes are therefore identical to pq_encode_ref's (the "exact" tolerance tier).
//    Bound: each of the two computations (fast score, oracle's f32 distance) errs by at most
//    (sub_dim + 3)·u·(||x|| + max||c||)², u = 2^-24 (standard dot-product bounds); a centroid
//    outside min + 2·that bound cannot win, and we use twice that again as a safety factor.
//    Sub-vectors so large that squares could overflow take the oracle path directly.
// The per-call SoA re-layout costs n_centroids·sub_dim floats, ≤ 1/n_sub of one vector's
// encode work, and keeps the struct free of derived caches that could go stale.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/pq_internal.h"
#include "veloxquant/error.h"
#include "veloxquant/pq.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports its own _mm512_undefined_ps() inside _mm512_min_ps as maybe-uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace veloxquant {

// ---- PQSpec -------------------------------------------------------------------------------

PQSpec PQSpec::parse(const std::string& s) {
  auto fail = [&]() {
    VQ_THROW(ValueError, "invalid PQ spec \"" << s
                                              << "\": expected d<sub_dim>b<codebook_bits> with both in 1..16, "
                                                 "e.g. \"d4b8\"");
  };
  size_t i = 0;
  auto read_int = [&](int& out) {
    const size_t start = i;
    int v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 6) v = v * 10 + (s[i++] - '0');
    if (i == start) fail();
    out = v;
  };
  PQSpec p;
  if (s.empty() || (s[0] != 'd' && s[0] != 'D')) fail();
  ++i;
  read_int(p.sub_dim);
  if (i >= s.size() || (s[i] != 'b' && s[i] != 'B')) fail();
  ++i;
  read_int(p.codebook_bits);
  if (i != s.size()) fail();
  if (p.sub_dim < 1 || p.sub_dim > 16 || p.codebook_bits < 1 || p.codebook_bits > 16) fail();
  return p;
}

std::string PQSpec::str() const {
  std::ostringstream o;
  o << 'd' << sub_dim << 'b' << codebook_bits;
  return o.str();
}

// ---- ProductQuantizer ---------------------------------------------------------------------

ProductQuantizer::ProductQuantizer(int head_dim_, PQSpec spec, std::vector<float> cb) {
  VQ_CHECK_VALUE(spec.sub_dim >= 1 && spec.sub_dim <= 16,
                 "ProductQuantizer: sub_dim must be in 1..16, got " << spec.sub_dim);
  VQ_CHECK_VALUE(spec.codebook_bits >= 1 && spec.codebook_bits <= 16,
                 "ProductQuantizer: codebook_bits must be in 1..16, got " << spec.codebook_bits);
  VQ_CHECK_VALUE(head_dim_ >= 1, "ProductQuantizer: head_dim must be >= 1, got " << head_dim_);
  VQ_CHECK_VALUE(head_dim_ % spec.sub_dim == 0, "ProductQuantizer: head_dim (" << head_dim_
                                                    << ") must be a multiple of sub_dim (" << spec.sub_dim
                                                    << ") for " << spec.str());
  head_dim = head_dim_;
  sub_dim = spec.sub_dim;
  codebook_bits = spec.codebook_bits;
  n_sub = head_dim / sub_dim;
  n_centroids = 1 << codebook_bits;
  code_bytes = packed_row_bytes(n_sub, codebook_bits);
  if (!cb.empty()) set_codebook(std::move(cb));
}

void ProductQuantizer::set_codebook(std::vector<float> cb) {
  VQ_CHECK_VALUE(sub_dim >= 1 && n_centroids >= 2, "set_codebook: the quantizer is not initialised");
  VQ_CHECK_SHAPE(cb.size() == size_t(n_centroids) * size_t(sub_dim),
                 "codebook: expected [n_centroids=" << n_centroids << ", sub_dim=" << sub_dim
                                                    << "] = " << size_t(n_centroids) * sub_dim << " floats, got "
                                                    << cb.size());
  for (size_t i = 0; i < cb.size(); ++i)
    VQ_CHECK_VALUE(std::isfinite(cb[i]),
                   "codebook[" << i / sub_dim << "][" << i % sub_dim << "] is " << cb[i] << ": must be finite");
  std::vector<float> norms(static_cast<size_t>(n_centroids));
  for (int c = 0; c < n_centroids; ++c) {
    float acc = 0.0f;
    for (int j = 0; j < sub_dim; ++j) acc += cb[size_t(c) * sub_dim + j] * cb[size_t(c) * sub_dim + j];
    norms[size_t(c)] = acc;
  }
  codebook = std::move(cb);
  centroid_norms = std::move(norms);
}

void ProductQuantizer::set_random_codebook(uint64_t seed, float stddev) {
  VQ_CHECK_VALUE(sub_dim >= 1 && n_centroids >= 2, "set_random_codebook: the quantizer is not initialised");
  // splitmix64 + Box–Muller: the same codebook for a seed on every platform.
  uint64_t s = seed;
  auto next = [&]() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  auto uniform = [&]() { return (double(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };  // (0, 1)
  std::vector<float> cb(size_t(n_centroids) * sub_dim);
  for (size_t i = 0; i < cb.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform())), th = 6.283185307179586 * uniform();
    cb[i] = float(stddev * r * std::cos(th));
    if (i + 1 < cb.size()) cb[i + 1] = float(stddev * r * std::sin(th));
  }
  set_codebook(std::move(cb));
}

// ---- encode ---------------------------------------------------------------------------------

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX2__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 16;
#endif
constexpr int kBlockSub = 4;  // sub-vectors sharing one pass over the codebook

// The codebook re-laid out for SIMD scoring.
struct SoACodebook {
  int d = 0, K = 0, Kp = 0;
  std::vector<float> cbT;    // [d, Kp]
  std::vector<float> norms;  // [Kp], ||c||² (pads: +inf)
  double cmax = 0;           // max ||c||
};

SoACodebook make_soa(const ProductQuantizer& pq) {
  SoACodebook s;
  s.d = pq.sub_dim;
  s.K = pq.n_centroids;
  s.Kp = (s.K + kLanes - 1) / kLanes * kLanes;
  s.cbT.assign(size_t(s.d) * s.Kp, 0.0f);
  s.norms.assign(size_t(s.Kp), INFINITY);
  for (int c = 0; c < s.K; ++c) {
    float acc = 0.0f;
    double dn = 0.0;
    for (int j = 0; j < s.d; ++j) {
      const float v = pq.codebook[size_t(c) * s.d + j];
      s.cbT[size_t(j) * s.Kp + c] = v;
      acc += v * v;
      dn += double(v) * v;
    }
    s.norms[size_t(c)] = acc;
    s.cmax = std::max(s.cmax, dn);
  }
  s.cmax = std::sqrt(s.cmax);
  return s;
}

// Scores a[b][c] = norms[c] − 2·x_b·c for kBlockSub sub-vectors (xm2[b][j] = −2·x_b[j]) over all
// Kp centroids into buf [kBlockSub, Kp]; returns the per-sub-vector minimum in amin.
template <int D>
void score_block(const SoACodebook& s, const float* xm2, int nb, float* buf, float* amin) {
  const int Kp = s.Kp;
  const float* cbT = s.cbT.data();
  const float* nrm = s.norms.data();
#if defined(__AVX512F__)
  __m512 mn[kBlockSub];
  for (int b = 0; b < kBlockSub; ++b) mn[b] = _mm512_set1_ps(INFINITY);
  for (int c0 = 0; c0 < Kp; c0 += 16) {
    __m512 cv[D];
    for (int j = 0; j < D; ++j) cv[j] = _mm512_loadu_ps(cbT + size_t(j) * Kp + c0);
    const __m512 nv = _mm512_loadu_ps(nrm + c0);
    for (int b = 0; b < kBlockSub; ++b) {
      if (b >= nb) break;
      __m512 acc = nv;
      for (int j = 0; j < D; ++j) acc = _mm512_fmadd_ps(_mm512_set1_ps(xm2[b * 16 + j]), cv[j], acc);
      _mm512_storeu_ps(buf + size_t(b) * Kp + c0, acc);
      mn[b] = _mm512_min_ps(mn[b], acc);
    }
  }
  for (int b = 0; b < nb; ++b) {  // (GCC 12's _mm512_reduce_min_ps trips -Wmaybe-uninitialized)
    alignas(64) float t[16];
    _mm512_store_ps(t, mn[b]);
    float m = t[0];
    for (int i = 1; i < 16; ++i) m = std::min(m, t[i]);
    amin[b] = m;
  }
#elif defined(__AVX2__)
  __m256 mn[kBlockSub];
  for (int b = 0; b < kBlockSub; ++b) mn[b] = _mm256_set1_ps(INFINITY);
  for (int c0 = 0; c0 < Kp; c0 += 8) {
    __m256 cv[D];
    for (int j = 0; j < D; ++j) cv[j] = _mm256_loadu_ps(cbT + size_t(j) * Kp + c0);
    const __m256 nv = _mm256_loadu_ps(nrm + c0);
    for (int b = 0; b < kBlockSub; ++b) {
      if (b >= nb) break;
      __m256 acc = nv;
      for (int j = 0; j < D; ++j) acc = _mm256_fmadd_ps(_mm256_set1_ps(xm2[b * 16 + j]), cv[j], acc);
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
  for (int b = 0; b < nb; ++b) {
    float m = INFINITY;
    float* out = buf + size_t(b) * Kp;
    for (int c0 = 0; c0 < Kp; c0 += kLanes) {
      float acc[kLanes];
      for (int l = 0; l < kLanes; ++l) acc[l] = nrm[c0 + l];
      for (int j = 0; j < D; ++j) {
        const float xj = xm2[b * 16 + j];
        const float* cj = cbT + size_t(j) * Kp + c0;
        for (int l = 0; l < kLanes; ++l) acc[l] += xj * cj[l];
      }
      for (int l = 0; l < kLanes; ++l) {
        out[c0 + l] = acc[l];
        m = std::min(m, acc[l]);
      }
    }
    amin[b] = m;
  }
#endif
}

using ScoreFn = void (*)(const SoACodebook&, const float*, int, float*, float*);

ScoreFn pick_score_fn(int d) {
  switch (d) {
    case 1: return score_block<1>;
    case 2: return score_block<2>;
    case 3: return score_block<3>;
    case 4: return score_block<4>;
    case 5: return score_block<5>;
    case 6: return score_block<6>;
    case 7: return score_block<7>;
    case 8: return score_block<8>;
    case 9: return score_block<9>;
    case 10: return score_block<10>;
    case 11: return score_block<11>;
    case 12: return score_block<12>;
    case 13: return score_block<13>;
    case 14: return score_block<14>;
    case 15: return score_block<15>;
    case 16: return score_block<16>;
    default: break;
  }
  VQ_THROW(ValueError, "pq encode: sub_dim must be in 1..16, got " << d);
}

// First index c < K with buf[c] <= thr, starting at c0; K if none.
inline int next_candidate(const float* buf, int c0, int K, float thr) {
#if defined(__AVX512F__)
  const __m512 t = _mm512_set1_ps(thr);
  int c = c0;
  for (; c + 16 <= K; c += 16) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(buf + c), t, _CMP_LE_OQ);
    if (m) return c + __builtin_ctz(m);
  }
  for (; c < K; ++c)
    if (buf[c] <= thr) return c;
  return K;
#else
  for (int c = c0; c < K; ++c)
    if (buf[c] <= thr) return c;
  return K;
#endif
}

// Oracle argmin over all centroids (non-finite thresholds, huge inputs).
uint32_t exact_argmin(const ProductQuantizer& pq, const float* xs) {
  const int d = pq.sub_dim;
  uint32_t best = 0;
  float best_d = detail::pq_sub_distance_ref(xs, pq.codebook.data(), d);
  for (int c = 1; c < pq.n_centroids; ++c) {
    const float dist = detail::pq_sub_distance_ref(xs, pq.codebook.data() + size_t(c) * d, d);
    if (dist < best_d) {
      best_d = dist;
      best = uint32_t(c);
    }
  }
  return best;
}

// Writes code value c at position m of a zeroed packed row.
inline void put_code(uint8_t* row, int m, int bits, uint32_t c) {
  const int64_t bit = int64_t(m) * bits;
  uint8_t* p = row + (bit >> 3);
  const uint32_t w = c << (bit & 7);
  p[0] = uint8_t(p[0] | (w & 0xFF));
  if ((bit & 7) + bits > 8) p[1] = uint8_t(p[1] | ((w >> 8) & 0xFF));
  if ((bit & 7) + bits > 16) p[2] = uint8_t(p[2] | ((w >> 16) & 0xFF));
}

void encode_rows(const ProductQuantizer& pq, const SoACodebook& s, ScoreFn score, const float* x, int64_t r0,
                 int64_t r1, uint8_t* codes) {
  const int d = pq.sub_dim, K = pq.n_centroids, bits = pq.codebook_bits;
  std::vector<float> buf(size_t(kBlockSub) * s.Kp);
  alignas(64) float xm2[kBlockSub * 16];
  float amin[kBlockSub];
  // error bound factor per (||x|| + cmax)², see the file comment
  const double kFactor = 2.0 * 2.0 * (2.0 * d + 6.0) * std::ldexp(1.0, -24);
  for (int64_t v = r0; v < r1; ++v) {
    const float* xv = x + v * pq.head_dim;
    uint8_t* row = codes + v * pq.code_bytes;
    std::memset(row, 0, size_t(pq.code_bytes));
    for (int m0 = 0; m0 < pq.n_sub; m0 += kBlockSub) {
      const int nb = std::min(kBlockSub, pq.n_sub - m0);
      double margin[kBlockSub];
      bool simd_ok[kBlockSub];
      bool any_ok = false;
      for (int b = 0; b < nb; ++b) {
        const float* xs = xv + int64_t(m0 + b) * d;
        double nx = 0.0;
        bool finite = true;
        for (int j = 0; j < d; ++j) {
          finite = finite && std::isfinite(xs[j]);
          nx += double(xs[j]) * xs[j];
          xm2[b * 16 + j] = -2.0f * xs[j];
        }
        const double r = std::sqrt(nx) + s.cmax;
        margin[b] = kFactor * r * r + 1e-30;
        simd_ok[b] = finite && r * r < 1e36;  // far from f32 overflow
        if (!finite) {
          // non-finite sub-vector → code 0 (the oracle's rule); keep the kernel's inputs finite
          for (int j = 0; j < d; ++j) xm2[b * 16 + j] = 0.0f;
        }
        any_ok = any_ok || simd_ok[b];
      }
      if (any_ok) score(s, xm2, nb, buf.data(), amin);
      for (int b = 0; b < nb; ++b) {
        const int m = m0 + b;
        const float* xs = xv + int64_t(m) * d;
        uint32_t code = 0;
        bool finite = true;
        for (int j = 0; j < d; ++j) finite = finite && std::isfinite(xs[j]);
        if (!finite) {
          code = 0;
        } else if (!simd_ok[b]) {
          code = exact_argmin(pq, xs);
        } else {
          const float* bb = buf.data() + size_t(b) * s.Kp;
          const float thr = float(double(amin[b]) + margin[b]);
          int c = next_candidate(bb, 0, K, thr);
          code = uint32_t(c);
          int c2 = next_candidate(bb, c + 1, K, thr);
          if (c2 < K) {  // near-tie: re-rank the candidates with the oracle's distance
            float best_d = detail::pq_sub_distance_ref(xs, pq.codebook.data() + size_t(c) * d, d);
            while (c2 < K) {
              const float dist = detail::pq_sub_distance_ref(xs, pq.codebook.data() + size_t(c2) * d, d);
              if (dist < best_d) {
                best_d = dist;
                code = uint32_t(c2);
              }
              c2 = next_candidate(bb, c2 + 1, K, thr);
            }
          }
          if (code >= uint32_t(K)) code = exact_argmin(pq, xs);  // cannot happen; belt and braces
        }
        put_code(row, m, bits, code);
      }
    }
  }
}

int resolve_threads(int n_threads, int64_t n_items, int64_t min_per_thread) {
  int t = n_threads > 0 ? n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t cap = std::max<int64_t>(1, n_items / std::max<int64_t>(1, min_per_thread));
  return int(std::min<int64_t>(t, cap));
}

}  // namespace

void ProductQuantizer::encode(const float* x, int64_t n, uint8_t* codes, int n_threads) const {
  detail::pq_check_ready(*this, "ProductQuantizer::encode");
  VQ_CHECK_VALUE(n >= 0, "ProductQuantizer::encode: n must be >= 0, got " << n);
  if (n == 0) return;
  const SoACodebook s = make_soa(*this);
  const ScoreFn score = pick_score_fn(sub_dim);
  // at least ~64k centroid·sub-vector evaluations per thread before another thread pays off
  const int64_t per_row = int64_t(n_sub) * n_centroids;
  const int nt = resolve_threads(n_threads, n, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, per_row)));
  if (nt <= 1) {
    encode_rows(*this, s, score, x, 0, n, codes);
    return;
  }
  std::vector<std::thread> th;
  std::vector<std::exception_ptr> errs(static_cast<size_t>(nt));
  for (int t = 0; t < nt; ++t) {
    const int64_t r0 = n * t / nt, r1 = n * (t + 1) / nt;
    th.emplace_back([&, t, r0, r1]() {
      try {
        encode_rows(*this, s, score, x, r0, r1, codes);
      } catch (...) {
        errs[size_t(t)] = std::current_exception();
      }
    });
  }
  for (auto& t : th) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

// ---- decode / LUT ---------------------------------------------------------------------------

void ProductQuantizer::decode(const uint8_t* codes, int64_t n, float* x) const {
  detail::pq_check_ready(*this, "ProductQuantizer::decode");
  VQ_CHECK_VALUE(n >= 0, "ProductQuantizer::decode: n must be >= 0, got " << n);
  const int d = sub_dim, bits = codebook_bits;
  const float* cb = codebook.data();
  for (int64_t v = 0; v < n; ++v) {
    const uint8_t* row = codes + v * code_bytes;
    float* out = x + v * head_dim;
    if (bits == 8) {
      for (int m = 0; m < n_sub; ++m) std::memcpy(out + m * d, cb + size_t(row[m]) * d, sizeof(float) * d);
    } else {
      for (int m = 0; m < n_sub; ++m)
        std::memcpy(out + m * d, cb + size_t(read_code(row, m, bits)) * d, sizeof(float) * d);
    }
  }
}

void ProductQuantizer::compute_lut(const float* q, float* lut) const {
  detail::pq_check_ready(*this, "ProductQuantizer::compute_lut");
  const int d = sub_dim, K = n_centroids;
  const float* cb = codebook.data();
  for (int m = 0; m < n_sub; ++m) {
    const float* qm = q + m * d;
    float* out = lut + size_t(m) * K;
    for (int c = 0; c < K; ++c) {
      const float* cc = cb + size_t(c) * d;
      float acc = 0.0f;
      for (int j = 0; j < d; ++j) acc += qm[j] * cc[j];
      out[c] = acc;
    }
  }
}

// ---- bit packing ----------------------------------------------------------------------------

void pack_codes(const uint32_t* idx, int64_t n_rows, int64_t n_codes, int bits, uint8_t* out) {
  detail::pq_check_pack_args(n_rows, n_codes, bits, "pack_codes");
  detail::pq_check_code_range(idx, n_rows, n_codes, bits, "pack_codes");
  const int64_t rb = packed_row_bytes(n_codes, bits);
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint32_t* in = idx + r * n_codes;
    uint8_t* o = out + r * rb;
    if (bits == 8) {
      for (int64_t i = 0; i < n_codes; ++i) o[i] = uint8_t(in[i]);
      continue;
    }
    if (bits == 16) {
      for (int64_t i = 0; i < n_codes; ++i) {
        o[2 * i] = uint8_t(in[i]);
        o[2 * i + 1] = uint8_t(in[i] >> 8);
      }
      continue;
    }
    // 64-bit accumulator, flushed a byte at a time; the last partial byte is zero-padded
    uint64_t acc = 0;
    int nacc = 0;
    int64_t ob = 0;
    for (int64_t i = 0; i < n_codes; ++i) {
      acc |= uint64_t(in[i]) << nacc;
      nacc += bits;
      while (nacc >= 8) {
        o[ob++] = uint8_t(acc);
        acc >>= 8;
        nacc -= 8;
      }
    }
    if (nacc > 0) o[ob++] = uint8_t(acc);
  }
}

void unpack_codes(const uint8_t* packed, int64_t n_rows, int64_t n_codes, int bits, uint32_t* idx) {
  detail::pq_check_pack_args(n_rows, n_codes, bits, "unpack_codes");
  const int64_t rb = packed_row_bytes(n_codes, bits);
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* p = packed + r * rb;
    uint32_t* o = idx + r * n_codes;
    if (bits == 8) {
      for (int64_t i = 0; i < n_codes; ++i) o[i] = p[i];
      continue;
    }
    uint64_t acc = 0;
    int nacc = 0;
    int64_t ib = 0;
    for (int64_t i = 0; i < n_codes; ++i) {
      while (nacc < bits) {
        acc |= uint64_t(p[ib++]) << nacc;
        nacc += 8;
      }
      o[i] = uint32_t(acc) & mask;
      acc >>= bits;
      nacc -= bits;
    }
  }
}

}  // namespace veloxquant
