// src/ref/pq_ref.cpp — scalar oracles of product-quantizer encode / decode / lookup tables and
// of the LSB-first bit packing. Plain loops, never tuned; the optimised paths in
// src/cpu/pq.cpp are tested against these.
//
// Encode rule (the definition every backend reproduces): for each sub-vector x_m the code is
// argmin_c Σ_j (x_m[j] − codebook[c][j])², each difference, square and partial sum rounded to
// f32 with j ascending and no FMA contraction (pq_sub_distance_ref), ties to the lowest index.
// A sub-vector holding a non-finite value encodes to code 0.
#include <cmath>
#include <cstring>

#include "core/pq_internal.h"
#include "veloxquant/error.h"
#include "veloxquant/pq.h"

namespace veloxquant {

namespace detail {

// Every operation rounded to f32 on its own: t = x − c, p = t·t, acc = acc + p, j ascending.
// Contraction into FMAs is switched off so the definition does not depend on the target ISA
// (a CUDA port reproduces it with __fsub_rn / __fmul_rn / __fadd_rn).
#if defined(__clang__)
__attribute__((noinline)) float pq_sub_distance_ref(const float* x, const float* c, int sub_dim) {
#pragma clang fp contract(off)
#elif defined(__GNUC__)
__attribute__((noinline, optimize("fp-contract=off"))) float pq_sub_distance_ref(const float* x, const float* c,
                                                                                   int sub_dim) {
#else
float pq_sub_distance_ref(const float* x, const float* c, int sub_dim) {
#endif
  float acc = 0.0f;
  for (int j = 0; j < sub_dim; ++j) {
    const float t = x[j] - c[j];
    const float p = t * t;
    acc = acc + p;
  }
  return acc;
}

void pq_check_ready(const ProductQuantizer& pq, const char* what) {
  VQ_CHECK_VALUE(pq.sub_dim >= 1 && pq.n_sub >= 1 && pq.n_centroids >= 2,
                 what << ": the quantizer is not initialised (head_dim=" << pq.head_dim << ", sub_dim="
                      << pq.sub_dim << ", codebook_bits=" << pq.codebook_bits << ")");
  VQ_CHECK_SHAPE(pq.codebook.size() == size_t(pq.n_centroids) * size_t(pq.sub_dim),
                 what << ": codebook: expected [n_centroids=" << pq.n_centroids << ", sub_dim=" << pq.sub_dim
                      << "] = " << size_t(pq.n_centroids) * pq.sub_dim << " floats, got " << pq.codebook.size()
                      << (pq.codebook.empty() ? " (no codebook set)" : ""));
}

void pq_check_pack_args(int64_t n_rows, int64_t n_codes, int bits, const char* what) {
  VQ_CHECK_VALUE(bits >= 1 && bits <= 16, what << ": bits must be in 1..16, got " << bits);
  VQ_CHECK_VALUE(n_rows >= 0 && n_codes >= 0,
                 what << ": n_rows and n_codes must be >= 0, got n_rows=" << n_rows << ", n_codes=" << n_codes);
}

void pq_check_code_range(const uint32_t* idx, int64_t n_rows, int64_t n_codes, int bits, const char* what) {
  const int64_t n = n_rows * n_codes;
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) any |= idx[i];
  if ((any >> bits) == 0) return;
  for (int64_t i = 0; i < n; ++i)
    VQ_CHECK_VALUE((idx[i] >> bits) == 0, what << ": idx[" << i / n_codes << "][" << i % n_codes << "] = "
                                                << idx[i] << " does not fit in " << bits << " bits");
}

}  // namespace detail

void pq_encode_ref(const ProductQuantizer& pq, const float* x, int64_t n, uint8_t* codes) {
  detail::pq_check_ready(pq, "pq_encode_ref");
  VQ_CHECK_VALUE(n >= 0, "pq_encode_ref: n must be >= 0, got " << n);
  const int d = pq.sub_dim, K = pq.n_centroids;
  for (int64_t v = 0; v < n; ++v) {
    uint8_t* row = codes + v * pq.code_bytes;
    std::memset(row, 0, size_t(pq.code_bytes));
    for (int m = 0; m < pq.n_sub; ++m) {
      const float* xs = x + v * pq.head_dim + int64_t(m) * d;
      bool finite = true;
      for (int j = 0; j < d; ++j) finite = finite && std::isfinite(xs[j]);
      uint32_t best = 0;
      if (finite) {
        float best_d = detail::pq_sub_distance_ref(xs, pq.codebook.data(), d);
        for (int c = 1; c < K; ++c) {
          const float dist = detail::pq_sub_distance_ref(xs, pq.codebook.data() + size_t(c) * d, d);
          if (dist < best_d) {
            best_d = dist;
            best = uint32_t(c);
          }
        }
      }
      for (int b = 0; b < pq.codebook_bits; ++b) {  // write code m bit by bit, LSB first
        const int64_t bit = int64_t(m) * pq.codebook_bits + b;
        if ((best >> b) & 1u) row[bit >> 3] = uint8_t(row[bit >> 3] | (1u << (bit & 7)));
      }
    }
  }
}

void pq_decode_ref(const ProductQuantizer& pq, const uint8_t* codes, int64_t n, float* x) {
  detail::pq_check_ready(pq, "pq_decode_ref");
  VQ_CHECK_VALUE(n >= 0, "pq_decode_ref: n must be >= 0, got " << n);
  const int d = pq.sub_dim;
  for (int64_t v = 0; v < n; ++v) {
    const uint8_t* row = codes + v * pq.code_bytes;
    for (int m = 0; m < pq.n_sub; ++m) {
      uint32_t c = 0;
      for (int b = 0; b < pq.codebook_bits; ++b) {
        const int64_t bit = int64_t(m) * pq.codebook_bits + b;
        c |= uint32_t((row[bit >> 3] >> (bit & 7)) & 1u) << b;
      }
      for (int j = 0; j < d; ++j) x[v * pq.head_dim + int64_t(m) * d + j] = pq.codebook[size_t(c) * d + j];
    }
  }
}

void pq_compute_lut_ref(const ProductQuantizer& pq, const float* q, float* lut) {
  detail::pq_check_ready(pq, "pq_compute_lut_ref");
  const int d = pq.sub_dim, K = pq.n_centroids;
  for (int m = 0; m < pq.n_sub; ++m)
    for (int c = 0; c < K; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < d; ++j) acc += q[m * d + j] * pq.codebook[size_t(c) * d + j];
      lut[size_t(m) * K + c] = acc;
    }
}

void pack_codes_ref(const uint32_t* idx, int64_t n_rows, int64_t n_codes, int bits, uint8_t* out) {
  detail::pq_check_pack_args(n_rows, n_codes, bits, "pack_codes_ref");
  detail::pq_check_code_range(idx, n_rows, n_codes, bits, "pack_codes_ref");
  const int64_t rb = packed_row_bytes(n_codes, bits);
  for (int64_t r = 0; r < n_rows; ++r) {
    uint8_t* row = out + r * rb;
    for (int64_t i = 0; i < rb; ++i) row[i] = 0;
    for (int64_t i = 0; i < n_codes; ++i)
      for (int b = 0; b < bits; ++b) {
        const int64_t bit = i * bits + b;
        if ((idx[r * n_codes + i] >> b) & 1u) row[bit >> 3] = uint8_t(row[bit >> 3] | (1u << (bit & 7)));
      }
  }
}

}  // namespace veloxquant
