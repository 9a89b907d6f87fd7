// src/core/pq_internal.h — pieces shared by the optimised PQ paths (src/cpu/pq.cpp) and the
// scalar oracles (src/ref/pq_ref.cpp), so both validate alike and the optimised encoder can
// re-rank near-ties with exactly the oracle's arithmetic.
#pragma once

#include <cstdint>

#include "veloxquant/pq.h"

namespace veloxquant::detail {

/// Σ_j (x[j] − c[j])² in f32, j ascending — THE distance of pq_encode_ref. Defined out of line
/// (and noinline) in pq_ref.cpp so every caller gets bit-identical results whatever the
/// compiler's FMA contraction does at the call site.
float pq_sub_distance_ref(const float* x, const float* c, int sub_dim);

/// Throws unless pq is initialised and holds a codebook of n_centroids × sub_dim floats.
void pq_check_ready(const ProductQuantizer& pq, const char* what);
/// Throws ValueError unless bits is in 1..16 and n_rows, n_codes >= 0.
void pq_check_pack_args(int64_t n_rows, int64_t n_codes, int bits, const char* what);
/// Throws ValueError naming the first idx[r][i] >= 2^bits, if any.
void pq_check_code_range(const uint32_t* idx, int64_t n_rows, int64_t n_codes, int bits, const char* what);

}  // namespace veloxquant::detail
