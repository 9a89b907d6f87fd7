// src/cpu/hadamard.cpp — the fast in-place orthonormal Walsh–Hadamard transform (FWHT).
//
// Computes x ← x·H for every row of x [n_vectors, head_dim] (f32, row-major), where H is
// block-diagonal with blocks H_B / sqrt(B), B = hadamard_block_size(head_dim) (the largest
// power of two dividing head_dim; head_dim itself for powers of two). The Sylvester H_B is
// symmetric, so x·H = H·x per block and the transform is its own inverse.
//
// Shape: log2(B) butterfly stages per block. Stages with a half-width h >= 8 run over
// contiguous runs of h floats, which the compiler vectorises with -march=native; the three
// short stages (h = 1, 2, 4) are fused into one pass over groups of 8. The 1/sqrt(B) scale is
// applied once at the end (exact for B a power of four, one rounding otherwise). Oracle:
// hadamard_transform_ref (src/ref/hadamard_ref.cpp), an explicit matrix multiply.
#include "veloxquant/hadamard.h"

#include <cmath>

#include "veloxquant/error.h"

namespace veloxquant {

int hadamard_block_size(int head_dim) {
  VQ_CHECK_VALUE(head_dim >= 1, "hadamard: head_dim must be >= 1, got " << head_dim);
  return head_dim & (-head_dim);  // lowest set bit = largest power of two dividing head_dim
}

namespace {

// Stages h = 1, 2, 4 on one group of 8 values.
inline void fwht8(float* v) {
  for (int i = 0; i < 8; i += 2) {
    const float a = v[i], b = v[i + 1];
    v[i] = a + b;
    v[i + 1] = a - b;
  }
  for (int i = 0; i < 8; i += 4) {
    for (int j = i; j < i + 2; ++j) {
      const float a = v[j], b = v[j + 2];
      v[j] = a + b;
      v[j + 2] = a - b;
    }
  }
  for (int j = 0; j < 4; ++j) {
    const float a = v[j], b = v[j + 4];
    v[j] = a + b;
    v[j + 4] = a - b;
  }
}

// Unnormalised butterflies on one block of B values (B a power of two).
inline void fwht_block(float* __restrict v, int B) {
  if (B < 8) {
    for (int h = 1; h < B; h <<= 1)
      for (int i = 0; i < B; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
    return;
  }
  for (int i = 0; i < B; i += 8) fwht8(v + i);
  for (int h = 8; h < B; h <<= 1) {
    for (int i = 0; i < B; i += 2 * h) {
      float* __restrict lo = v + i;
      float* __restrict hi = v + i + h;
      for (int j = 0; j < h; ++j) {
        const float a = lo[j], b = hi[j];
        lo[j] = a + b;
        hi[j] = a - b;
      }
    }
  }
}

}  // namespace

void hadamard_transform(float* x, int64_t n_vectors, int head_dim) {
  const int B = hadamard_block_size(head_dim);
  VQ_CHECK_VALUE(n_vectors >= 0, "hadamard: n_vectors must be >= 0, got " << n_vectors);
  if (B == 1) return;  // odd head_dim: every block is the 1x1 identity
  const float scale = float(1.0 / std::sqrt(double(B)));
  const int64_t total = n_vectors * int64_t(head_dim);
  for (int64_t off = 0; off < total; off += B) fwht_block(x + off, B);
  for (int64_t i = 0; i < total; ++i) x[i] *= scale;
}

}  // namespace veloxquant
