// src/core/pq_internal.h — pieces shared by the optimised PQ paths (src/cpu/pq.cpp) and the
// scalar oracles (src/ref/pq_ref.cpp), so both validate alike and the optimised encoder can
// re-rank near-ties with exactly the oracle's arithmetic.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

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

/// Exact nearest centroid (src/cpu/pq_nearest.cpp): assign[i] = argmin_c of the oracle distance
/// pq_sub_distance_ref(x[i], cb[c], d), ties to the lowest index; dist[i] (if not null) = that
/// distance. Points with a non-finite coordinate get 0 (dist unspecified). Any d >= 1 (unrolled
/// up to 16). Results do not depend on n_threads (0 = hardware concurrency).
/// @param x [n, d]  @param cb [k, d]  @param assign [n]  @param dist [n] or null
void nearest_centroids(const float* x, int64_t n, int d, const float* cb, int k, int32_t* assign, float* dist,
                       int n_threads);

/// A codebook prepared for nearest_centroids: its centroids transposed and padded, and their
/// norms. nearest_centroids(x, ..., cb, ...) prepares one per call; callers that search a few
/// points at a time (a decode step encodes one token per head) keep one, since preparing reads
/// and rewrites the whole codebook: more work than one token's search (a d4b12 codebook: 16384
/// floats against 32 sub-vectors).
struct PreparedCentroids;
std::shared_ptr<const PreparedCentroids> prepare_centroids(const float* cb, int k, int d);
/// pq's codebook, prepared (the form pq_encode_prepared takes).
inline std::shared_ptr<const PreparedCentroids> prepare_centroids(const ProductQuantizer& pq) {
  return prepare_centroids(pq.codebook.data(), pq.n_centroids, pq.sub_dim);
}
/// The bytes a prepared codebook holds ((d + 1)·k floats, k rounded up to 16).
int64_t prepared_bytes(const PreparedCentroids& p);
/// nearest_centroids against p, prepared from cb [k, d] (cb itself is read for the exact
/// re-ranking of near-ties). ValueError when p was prepared for another k or d.
void nearest_centroids(const PreparedCentroids& p, const float* x, int64_t n, int d, const float* cb, int k,
                       int32_t* assign, float* dist, int n_threads);
/// ProductQuantizer::encode through p, prepared from pq.codebook: the same codes.
void pq_encode_prepared(const ProductQuantizer& pq, const PreparedCentroids& p, const float* x, int64_t n,
                        uint8_t* codes, int n_threads = 1);

/// n_threads (0 = hardware concurrency) capped so each thread gets >= min_items_per_thread items.
int resolve_thread_count(int n_threads, int64_t n_items, int64_t min_items_per_thread);
/// Runs fn on n_threads contiguous sub-ranges of [0, n) (the calling thread takes the first);
/// rethrows the first exception after all have finished.
void parallel_ranges(int64_t n, int n_threads, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace veloxquant::detail
