// src/cpu/simd_vec.h — one float vector type for the CPU attention kernels, so each kernel is
// written once and compiled for the widest vectors the build has:
//   V512 (AVX-512F): 16 floats, 32 registers;
//   V256 (AVX2 + FMA + F16C, e.g. AMD Zen 1-3, Intel before Skylake-SP): 8 floats, 16 registers.
// `VecF` names the one in use; VQ_HAVE_VECF is 0 where neither is (the kernels' scalar paths).
//
// Besides the arithmetic, a type knows the loads the kernels need:
//   load_as<E>(p):            kLanes elements of dtype E (f16, bf16, f32) widened to floats;
//   f32_slice<DSUB>(cb, c):   kLanes consecutive dims of a decoded product-quantized row: the
//                             float codebook rows (DSUB floats each) of codes c[0], c[1], ...;
//   i8_slice<DSUB>(cb, c):    the same from the int8 codebook form (the caller scales);
//   rep<W>(v):                v[0..W) repeated over the lanes (W = 4 or 8);
//   fold<W>(x, out):          out[r] = Σ of the lanes l with l % W == r;
//   hsum4(a0..a3):            {Σa0, Σa1, Σa2, Σa3}.
// kAcc is how many accumulators a kernel keeps live beside its operands (half the registers).
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/simd_util.h"
#include "veloxquant/dtype.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#include <immintrin.h>
#endif

namespace veloxquant::detail {

#if defined(__AVX512F__)
struct V512 {
  using T = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kRegs = 32;
  static constexpr int kAcc = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static __m128 hsum4(T a0, T a1, T a2, T a3) { return hsum4_512(a0, a1, a2, a3); }

  template <DType E>
  static T load_as(const char* p) {
    if constexpr (E == DType::F16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    } else if constexpr (E == DType::BF16) {
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
    } else {
      return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    }
  }

  template <int DSUB, typename I>
  static T f32_slice(const float* cb, const I* c) {
    if constexpr (DSUB == 4) {
      T kv = _mm512_castps128_ps512(_mm_loadu_ps(cb + size_t(c[0]) * 4));
      kv = _mm512_insertf32x4(kv, _mm_loadu_ps(cb + size_t(c[1]) * 4), 1);
      kv = _mm512_insertf32x4(kv, _mm_loadu_ps(cb + size_t(c[2]) * 4), 2);
      return _mm512_insertf32x4(kv, _mm_loadu_ps(cb + size_t(c[3]) * 4), 3);
    } else {
      static_assert(DSUB == 8);
      const __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(cb + size_t(c[0]) * 8)));
      return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(cb + size_t(c[1]) * 8)), 1));
    }
  }

  template <int DSUB, typename I>
  static T i8_slice(const int8_t* cb, const I* c) {
    __m128i x;
    if constexpr (DSUB == 4) {
      int32_t w[4];
      for (int j = 0; j < 4; ++j) std::memcpy(&w[j], cb + size_t(c[j]) * 4, 4);
      x = _mm_setr_epi32(w[0], w[1], w[2], w[3]);
    } else {
      static_assert(DSUB == 8);
      long long w[2];
      std::memcpy(&w[0], cb + size_t(c[0]) * 8, 8);
      std::memcpy(&w[1], cb + size_t(c[1]) * 8, 8);
      x = _mm_set_epi64x(w[1], w[0]);
    }
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x));
  }

  template <int W>
  static T rep(const float* v) {
    if constexpr (W == 4) {
      return _mm512_broadcast_f32x4(_mm_loadu_ps(v));
    } else {
      static_assert(W == 8);
      const T x = _mm512_castps256_ps512(_mm256_loadu_ps(v));
      return _mm512_shuffle_f32x4(x, x, 0x44);
    }
  }

  template <int W>
  static void fold(T a, float* out) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    if constexpr (W == 4) {
      _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    } else {
      static_assert(W == 8);
      _mm256_storeu_ps(out, h);
    }
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
struct V256 {
  using T = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kRegs = 16;
  static constexpr int kAcc = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static __m128 hsum4(T a0, T a1, T a2, T a3) {
    const T s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    // s = [Σa0.lo, Σa1.lo, Σa2.lo, Σa3.lo | Σa0.hi, Σa1.hi, Σa2.hi, Σa3.hi] (128-bit halves)
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  }

  template <DType E>
  static T load_as(const char* p) {
    if constexpr (E == DType::F16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else if constexpr (E == DType::BF16) {
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
    } else {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    }
  }

  template <int DSUB, typename I>
  static T f32_slice(const float* cb, const I* c) {
    if constexpr (DSUB == 4) {
      return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(cb + size_t(c[0]) * 4)),
                                  _mm_loadu_ps(cb + size_t(c[1]) * 4), 1);
    } else {
      static_assert(DSUB == 8);
      return _mm256_loadu_ps(cb + size_t(c[0]) * 8);
    }
  }

  template <int DSUB, typename I>
  static T i8_slice(const int8_t* cb, const I* c) {
    uint64_t w = 0;
    if constexpr (DSUB == 4) {
      uint32_t lo, hi;
      std::memcpy(&lo, cb + size_t(c[0]) * 4, 4);
      std::memcpy(&hi, cb + size_t(c[1]) * 4, 4);
      w = uint64_t(lo) | uint64_t(hi) << 32;
    } else {
      static_assert(DSUB == 8);
      std::memcpy(&w, cb + size_t(c[0]) * 8, 8);
    }
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(static_cast<long long>(w))));
  }

  template <int W>
  static T rep(const float* v) {
    if constexpr (W == 4) {
      const __m128 x = _mm_loadu_ps(v);
      return _mm256_insertf128_ps(_mm256_castps128_ps256(x), x, 1);
    } else {
      static_assert(W == 8);
      return _mm256_loadu_ps(v);
    }
  }

  template <int W>
  static void fold(T a, float* out) {
    if constexpr (W == 4) {
      _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)));
    } else {
      static_assert(W == 8);
      _mm256_storeu_ps(out, a);
    }
  }
};
#endif

#if defined(__AVX512F__)
using VecF = V512;
#define VQ_HAVE_VECF 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
using VecF = V256;
#define VQ_HAVE_VECF 1
#else
#define VQ_HAVE_VECF 0
#endif

}  // namespace veloxquant::detail
