// src/cpu/simd_util.h — small SIMD helpers shared by the CPU attention paths: a vectorised
// expf (for the softmax), row conversion from f16/bf16/f32 to f32, a 64-byte aligned scratch
// buffer that lives as long as the (persistent) thread.
//
// exp: e^x = 2^n · e^r with n = round(x·log2 e), r = x − n·ln 2 (ln 2 split hi/lo), e^r by a
// degree-6 Taylor/Horner polynomial on |r| <= ln2/2; relative error ~2e-7, below f32 rounding
// of the sums it feeds. Inputs below −87 give exactly 0 (masked scores are −inf).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "veloxquant/dtype.h"

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace veloxquant::detail {

// ---- scalar exp (the portable path; same polynomial as the vector paths) --------------------
inline float exp_poly_scalar(float x) {
  if (!(x >= -87.0f)) return 0.0f;  // also catches nan -> 0 (never produced by finite inputs)
  if (x > 88.0f) x = 88.0f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r - n * (-2.12194440e-4f);
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t e = int32_t(n) + 127;
  uint32_t bits = uint32_t(e) << 23;
  float s;
  std::memcpy(&s, &bits, 4);
  return p * s;
}

#if defined(__AVX512F__)
inline __m512 exp_poly_512(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NGE_UQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 res = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  return _mm512_mask_blend_ps(tiny, res, _mm512_setzero_ps());
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 exp_poly_256(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_NGE_UQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(tiny, res);
}
#endif

#if defined(__AVX512F__)
// Sums each of a0..a3 horizontally; returns {Σa0, Σa1, Σa2, Σa3}.
inline __m128 hsum4_512(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
  const __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
  // u = [a0.l0+a0.l2, a0.l1+a0.l3, a1.l0+a1.l2, a1.l1+a1.l3] (128-bit lanes), v alike for a2, a3
  __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(u, v, 0x88), _mm512_shuffle_f32x4(u, v, 0xDD));
  // w = [a0 partial, a1 partial, a2 partial, a3 partial], 4 floats each
  w = _mm512_add_ps(w, _mm512_permute_ps(w, 0x4E));
  w = _mm512_add_ps(w, _mm512_permute_ps(w, 0xB1));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, w));
}

#endif

/// x[i] = exp(x[i] − m[i % 4]) for i in [0, 4·n) (4 interleaved lanes: one per query row), and
/// sum[l] += Σ over lane l. Any alignment.
inline void exp_sub_lanes4(float* x, int64_t n, const float m[4], float sum[4]) {
  int64_t i = 0;
  const int64_t total = 4 * n;
#if defined(__AVX512F__)
  const __m512 mv = _mm512_setr_ps(m[0], m[1], m[2], m[3], m[0], m[1], m[2], m[3], m[0], m[1], m[2], m[3],
                                   m[0], m[1], m[2], m[3]);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= total; i += 16) {
    const __m512 e = exp_poly_512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  alignas(64) float a[16];
  _mm512_store_ps(a, acc);
  for (int l = 0; l < 16; ++l) sum[l & 3] += a[l];
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 mv = _mm256_setr_ps(m[0], m[1], m[2], m[3], m[0], m[1], m[2], m[3]);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= total; i += 8) {
    const __m256 e = exp_poly_256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float a[8];
  _mm256_store_ps(a, acc);
  for (int l = 0; l < 8; ++l) sum[l & 3] += a[l];
#endif
  for (; i < total; ++i) {
    const float e = exp_poly_scalar(x[i] - m[i & 3]);
    x[i] = e;
    sum[i & 3] += e;
  }
}

/// out[i] = f32(src[i·stride]) for i in [0, n); src of dtype t (f16, bf16 or f32).
inline void load_row_f32(const void* src, DType t, int64_t stride, int64_t n, float* out) {
  if (t == DType::F32) {
    const float* s = static_cast<const float*>(src);
    if (stride == 1) {
      std::memcpy(out, s, size_t(n) * 4);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = s[i * stride];
    }
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  if (t == DType::F16) {
    if (stride == 1) {
#if defined(__AVX512F__)
      for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
#elif defined(__F16C__)
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
    }
    for (; i < n; ++i) out[i] = half_to_float(s[i * stride]);
  } else {
    for (; i < n; ++i) out[i] = bf16_to_float(s[i * stride]);
  }
}

/// A growable 64-byte aligned float buffer (scratch owned by one thread or one call).
class AlignedBuf {
 public:
  float* get(size_t n) {
    if (n > cap_) {
      void* p = std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
      if (!p) throw std::bad_alloc();
      data_.reset(static_cast<float*>(p));
      cap_ = n;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  size_t cap_ = 0;
};

}  // namespace veloxquant::detail
