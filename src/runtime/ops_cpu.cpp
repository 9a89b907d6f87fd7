// ops_cpu.cpp — the optimised CPU ops of the runtime (see ops.h for the contracts).
//
// matmul computes y[n, rows] = x[n, cols] · wᵀ with w [rows, cols] row-major (nn.Linear's
// layout), so every output element is a dot product of two contiguous rows. That layout
// decides the kernel: a register tile of kTileRows rows of x × 4 rows of w streams along
// `cols`, loading each w element once per kTileRows rows of x — 4 × 4 with AVX-512 (16 zmm
// accumulators of 32 registers, masked loads for the tail), 2 × 4 with AVX2 (8 of 16 ymm). Threads take blocks
// of w rows. For f16/bf16 weights and n >= 4 a block of w rows is first converted to f32 in a
// per-thread buffer (the conversion is then amortised over all rows of x); for decode (n < 4)
// the rows are converted on the fly inside the dot products (one pass over the weights, which
// is what bounds a decode step).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define VQ_RT_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define VQ_RT_AVX512 1
#endif
#endif

#include "veloxquant/error.h"
#include "veloxquant/runtime/ops.h"
#include "veloxquant/thread_pool.h"

namespace veloxquant::runtime {

float WeightView::at(int64_t r, int64_t c) const {
  const int64_t i = r * cols + c;
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    default: VQ_THROW(ShapeError, "weight dtype " << dtype_name(dtype) << " is not a float type");
  }
}

namespace {

void convert_row(const WeightView& w, int64_t r, float* out) {
  const int64_t cols = w.cols;
  switch (w.dtype) {
    case DType::F32:
      std::memcpy(out, static_cast<const float*>(w.data) + r * cols, size_t(cols) * 4);
      return;
    case DType::F16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * cols;
      int64_t c = 0;
#ifdef VQ_RT_AVX2
      for (; c + 8 <= cols; c += 8)
        _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c))));
#endif
      for (; c < cols; ++c) out[c] = half_to_float(p[c]);
      return;
    }
    case DType::BF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * cols;
      int64_t c = 0;
#ifdef VQ_RT_AVX2
      for (; c + 8 <= cols; c += 8) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c)));
        _mm256_storeu_ps(out + c, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
      }
#endif
      for (; c < cols; ++c) out[c] = bf16_to_float(p[c]);
      return;
    }
    default: VQ_THROW(ShapeError, "weight dtype " << dtype_name(w.dtype) << " is not a float type");
  }
}

// ---- element loaders: 8 consecutive weights as f32 ------------------------------------------
struct LoadF32 {
  using T = float;
  static float scalar(const T* p) { return *p; }
#ifdef VQ_RT_AVX2
  static __m256 vec(const T* p) { return _mm256_loadu_ps(p); }
#endif
#ifdef VQ_RT_AVX512
  static __m512 vec16(const T* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
#endif
};
struct LoadF16 {
  using T = uint16_t;
  static float scalar(const T* p) { return half_to_float(*p); }
#ifdef VQ_RT_AVX2
  static __m256 vec(const T* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif
#ifdef VQ_RT_AVX512
  static __m512 vec16(const T* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
#endif
};
struct LoadBF16 {
  using T = uint16_t;
  static float scalar(const T* p) { return bf16_to_float(*p); }
#ifdef VQ_RT_AVX2
  static __m256 vec(const T* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
#endif
#ifdef VQ_RT_AVX512
  static __m512 vec16(const T* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
#endif
};

#ifdef VQ_RT_AVX2
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}
#endif

#ifdef VQ_RT_AVX512
constexpr int kTileRows = 4;
#else
constexpr int kTileRows = 2;
#endif

// out[i][j] = dot(x row i, w row j) for i < NI (<= kTileRows), j < NJ (1 or 4).
template <class L, int NI, int NJ>
inline void dot_tile(const float* const* xs, const typename L::T* const* ws, int64_t cols, float out[4][4]) {
  int64_t c = 0;
#if defined(VQ_RT_AVX512)
  __m512 acc[NI][NJ];
  for (int i = 0; i < NI; ++i)
    for (int j = 0; j < NJ; ++j) acc[i][j] = _mm512_setzero_ps();
  auto step = [&](__mmask16 m) {
    __m512 xv[NI];
    for (int i = 0; i < NI; ++i) xv[i] = _mm512_maskz_loadu_ps(m, xs[i] + c);
    for (int j = 0; j < NJ; ++j) {
      const __m512 wv = L::vec16(ws[j] + c, m);
      for (int i = 0; i < NI; ++i) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  };
  for (; c + 16 <= cols; c += 16) step(__mmask16(0xFFFF));  // full vectors (plain loads)
  if (c < cols) {
    step(__mmask16((1u << (cols - c)) - 1u));  // masked tail
    c = cols;
  }
  for (int i = 0; i < NI; ++i)
    for (int j = 0; j < NJ; ++j) out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
#elif defined(VQ_RT_AVX2)
  __m256 acc[NI][NJ];
  for (int i = 0; i < NI; ++i)
    for (int j = 0; j < NJ; ++j) acc[i][j] = _mm256_setzero_ps();
  for (; c + 8 <= cols; c += 8) {
    __m256 xv[NI];
    for (int i = 0; i < NI; ++i) xv[i] = _mm256_loadu_ps(xs[i] + c);
    for (int j = 0; j < NJ; ++j) {
      const __m256 wv = L::vec(ws[j] + c);
      for (int i = 0; i < NI; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < NI; ++i)
    for (int j = 0; j < NJ; ++j) out[i][j] = hsum(acc[i][j]);
#else
  for (int i = 0; i < NI; ++i)
    for (int j = 0; j < NJ; ++j) out[i][j] = 0.0f;
#endif
  for (; c < cols; ++c) {  // scalar tail (none with AVX-512: masked loads cover it)
    for (int j = 0; j < NJ; ++j) {
      const float wv = L::scalar(ws[j] + c);
      for (int i = 0; i < NI; ++i) out[i][j] += xs[i][c] * wv;
    }
  }
}

template <class L, int NJ>
inline void dot_tile_n(int ni, const float* const* xs, const typename L::T* const* ws, int64_t cols,
                       float out[4][4]) {
  switch (ni) {
    case 1: dot_tile<L, 1, NJ>(xs, ws, cols, out); break;
    case 2: dot_tile<L, 2, NJ>(xs, ws, cols, out); break;
#ifdef VQ_RT_AVX512
    case 3: dot_tile<L, 3, NJ>(xs, ws, cols, out); break;
    case 4: dot_tile<L, 4, NJ>(xs, ws, cols, out); break;
#endif
    default: break;
  }
}

// Rows [r0, r1) of w against all n rows of x. `wbase` points at row r0, rows `wstride`
// elements apart; y [n, out_stride]. (Blocking x rows for L2 and cols for L1 was tried and
// measured no faster on this machine: the tile is bound in-core, not by cache.)
template <class L>
void matmul_rows(const float* x, int64_t n, const typename L::T* wbase, int64_t wstride, int64_t r0, int64_t r1,
                 int64_t cols, int64_t out_stride, const float* bias, float* y) {
  float out[4][4];
  for (int64_t r = r0; r < r1; r += 4) {
    const int nj = int(std::min<int64_t>(4, r1 - r));
    for (int64_t i = 0; i < n; i += kTileRows) {
      const int ni = int(std::min<int64_t>(kTileRows, n - i));
      const float* xs[4];
      for (int ii = 0; ii < 4; ++ii) xs[ii] = x + (i + std::min(ii, ni - 1)) * cols;
      if (nj == 4) {
        const typename L::T* ws[4] = {wbase + (r - r0) * wstride, wbase + (r - r0 + 1) * wstride,
                                      wbase + (r - r0 + 2) * wstride, wbase + (r - r0 + 3) * wstride};
        dot_tile_n<L, 4>(ni, xs, ws, cols, out);
      } else {  // edge block: one w row at a time
        for (int j = 0; j < nj; ++j) {
          const typename L::T* ws[1] = {wbase + (r - r0 + j) * wstride};
          float o1[4][4] = {};
          dot_tile_n<L, 1>(ni, xs, ws, cols, o1);
          for (int ii = 0; ii < ni; ++ii) out[ii][j] = o1[ii][0];
        }
      }
      for (int ii = 0; ii < ni; ++ii)
        for (int j = 0; j < nj; ++j) y[(i + ii) * out_stride + r + j] = out[ii][j] + (bias ? bias[r + j] : 0.0f);
    }
  }
}

template <class L>
void matmul_direct(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, int64_t r0,
                   int64_t r1) {
  const auto* base = static_cast<const typename L::T*>(w.data) + r0 * w.cols;
  matmul_rows<L>(x, n, base, w.cols, r0, r1, w.cols, w.rows, bias, y);
}

}  // namespace

void WeightView::row_f32(int64_t r, float* out) const { convert_row(*this, r, out); }

void matmul(const float* x, int64_t n, const WeightView& w, const float* bias, float* y, ThreadPool* pool) {
  VQ_CHECK_SHAPE(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16,
                 "matmul: weight dtype " << dtype_name(w.dtype) << " is not f32/f16/bf16");
  VQ_CHECK_SHAPE(w.rows > 0 && w.cols > 0 && n >= 0, "matmul: bad sizes n=" << n << " rows=" << w.rows
                                                                             << " cols=" << w.cols);
  if (n == 0) return;
  const int n_threads = pool ? pool->size() : 1;
  // Block of w rows per task: a multiple of 4, about 4 tasks per thread, at least 16 rows.
  int64_t block = (w.rows + int64_t(n_threads) * 4 - 1) / (int64_t(n_threads) * 4);
  block = std::max<int64_t>(16, (block + 3) / 4 * 4);
  const int64_t n_tasks = (w.rows + block - 1) / block;
  const bool convert = w.dtype != DType::F32 && n >= 4;

  auto task = [&](int64_t t, int /*worker*/) {
    const int64_t r0 = t * block;
    const int64_t r1 = std::min(w.rows, r0 + block);
    if (convert) {
      thread_local std::vector<float> buf;
      buf.resize(size_t((r1 - r0) * w.cols));
      for (int64_t r = r0; r < r1; ++r) convert_row(w, r, buf.data() + (r - r0) * w.cols);
      matmul_rows<LoadF32>(x, n, buf.data(), w.cols, r0, r1, w.cols, w.rows, bias, y);
      return;
    }
    switch (w.dtype) {
      case DType::F32: matmul_direct<LoadF32>(x, n, w, bias, y, r0, r1); break;
      case DType::F16: matmul_direct<LoadF16>(x, n, w, bias, y, r0, r1); break;
      case DType::BF16: matmul_direct<LoadBF16>(x, n, w, bias, y, r0, r1); break;
      default: break;
    }
  };
  // Waking the pool costs a few microseconds; below ~128k multiply-adds (a tiny model's
  // decode step) one thread finishes sooner.
  const bool parallel = pool && n_tasks > 1 && n * w.rows * w.cols >= (int64_t(1) << 17);
  if (parallel) {
    pool->parallel_for(n_tasks, task);
  } else {
    for (int64_t t = 0; t < n_tasks; ++t) task(t, 0);
  }
}

void rmsnorm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * dim;
    float* yr = y + i * dim;
    float ss = 0.0f;
    int64_t c = 0;
#ifdef VQ_RT_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; c + 8 <= dim; c += 8) {
      const __m256 v = _mm256_loadu_ps(xr + c);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    ss = hsum(acc);
#endif
    for (; c < dim; ++c) ss += xr[c] * xr[c];
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    for (c = 0; c < dim; ++c) yr[c] = weight[c] * (xr[c] * inv);
  }
}

RopeTable make_rope_table(const std::vector<float>& inv_freq, float attention_factor, int64_t start, int64_t n) {
  RopeTable t;
  t.start = start;
  t.n = n;
  t.half = int(inv_freq.size());
  t.cos.resize(size_t(n * t.half));
  t.sin.resize(size_t(n * t.half));
  for (int64_t p = 0; p < n; ++p) {
    const float pos = float(start + p);
    for (int i = 0; i < t.half; ++i) {
      const float angle = pos * inv_freq[i];  // f32, as the reference
      t.cos[p * t.half + i] = float(std::cos(double(angle))) * attention_factor;
      t.sin[p * t.half + i] = float(std::sin(double(angle))) * attention_factor;
    }
  }
  return t;
}

void rope_apply(float* x, int64_t n_tokens, int n_heads, int head_dim, const RopeTable& table) {
  const int half = head_dim / 2;
  VQ_CHECK_SHAPE(table.half == half && table.n >= n_tokens,
                 "rope_apply: table for half=" << table.half << ", n=" << table.n << " does not fit head_dim="
                                               << head_dim << ", n_tokens=" << n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* cs = table.cos.data() + t * half;
    const float* sn = table.sin.data() + t * half;
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.0f + std::exp(-g))) * up[i];
  }
}

void embedding_lookup(const WeightView& table, const int32_t* tokens, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    VQ_CHECK_VALUE(tokens[t] >= 0 && tokens[t] < table.rows,
                   "token id " << tokens[t] << " at position " << t << " is outside the vocabulary [0, "
                               << table.rows << ")");
  }
  for (int64_t t = 0; t < n; ++t) convert_row(table, tokens[t], out + t * table.cols);
}

void softmax_inplace(float* x, int64_t n) {
  if (n <= 0) return;
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = float(1.0 / s);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace veloxquant::runtime
