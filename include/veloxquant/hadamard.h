// veloxquant/hadamard.h — the orthonormal (block-diagonal) Walsh–Hadamard rotation.
//
// For a power-of-two head_dim (2..512, and beyond) the rotation is the Sylvester Hadamard
// matrix H_D scaled by 1/sqrt(D), so H·Hᵀ = I and H = Hᵀ = H⁻¹. For other head dims
// (80, 96, 112, 160, 192, ...) it is block-diagonal: head_dim is cut into equal blocks whose
// size is the largest power of two dividing head_dim, and each block gets its own H_block.
// That keeps every real model working (the MLX version rejected such head dims).
#pragma once

#include <cstdint>
#include <vector>

namespace veloxquant {

/// Size of each diagonal block: the largest power of two dividing head_dim (head_dim itself
/// when it is a power of two). Throws ValueError for head_dim < 1.
int hadamard_block_size(int head_dim);

/// In-place fast transform, O(head_dim·log block) per vector.
/// @param x  [n_vectors, head_dim] row-major, f32
void hadamard_transform(float* x, int64_t n_vectors, int head_dim);

/// Scalar oracle: multiplies each vector by the explicit (block-diagonal) matrix.
void hadamard_transform_ref(float* x, int64_t n_vectors, int head_dim);

/// The explicit orthonormal matrix, [head_dim, head_dim] row-major.
std::vector<float> hadamard_matrix(int head_dim);

}  // namespace veloxquant
