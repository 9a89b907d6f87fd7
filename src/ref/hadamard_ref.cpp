// src/ref/hadamard_ref.cpp — scalar oracle for the Walsh–Hadamard rotation: builds the
// explicit (block-diagonal) orthonormal matrix and multiplies by it, accumulating in double.
// Plain loops, never tuned; O(head_dim²) per vector.
#include <cmath>
#include <vector>

#include "veloxquant/error.h"
#include "veloxquant/hadamard.h"

namespace veloxquant {

std::vector<float> hadamard_matrix(int head_dim) {
  const int B = hadamard_block_size(head_dim);
  const double s = 1.0 / std::sqrt(double(B));
  std::vector<float> H(size_t(head_dim) * head_dim, 0.0f);  // [head_dim, head_dim]
  for (int r = 0; r < head_dim; ++r) {
    for (int c = 0; c < head_dim; ++c) {
      if (r / B != c / B) continue;  // off the diagonal blocks
      // Sylvester: H_B[i][j] = (-1)^popcount(i & j)
      const int i = r % B, j = c % B;
      int parity = 0;
      for (int b = i & j; b; b >>= 1) parity ^= (b & 1);
      H[size_t(r) * head_dim + c] = float(parity ? -s : s);
    }
  }
  return H;
}

void hadamard_transform_ref(float* x, int64_t n_vectors, int head_dim) {
  const std::vector<float> H = hadamard_matrix(head_dim);
  std::vector<float> y(static_cast<size_t>(head_dim));
  for (int64_t v = 0; v < n_vectors; ++v) {
    float* row = x + v * head_dim;
    for (int c = 0; c < head_dim; ++c) {  // y = row · H
      double acc = 0.0;
      for (int r = 0; r < head_dim; ++r) acc += double(row[r]) * double(H[size_t(r) * head_dim + c]);
      y[size_t(c)] = float(acc);
    }
    for (int c = 0; c < head_dim; ++c) row[c] = y[size_t(c)];
  }
}

}  // namespace veloxquant
