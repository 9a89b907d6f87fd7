// src/cpu/pq_grid_search.h — the CPU encoder's nearest-centroid search through a candidate grid
// (src/core/pq_grid.h): for sub_dim-4 codebooks, each point re-ranks only its cell's list with
// the oracle's arithmetic instead of scanning every centroid. Same codes as pq_encode_ref and
// detail::nearest_centroids, bit for bit.
//
// Where it pays (bench/cpu/bench_encode.cpp): codebooks of many centroids — the defaults' d4b12
// keys scan 4096 centroids per sub-vector, a grid cell lists a few dozen. The grid costs a
// one-time host build (detail::build_candidate_grid, 1-3 s for 4096 centroids on this 2-core machine), so
// the caches switch to it only after enough encodes (cpu_grid_build_after).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/pq_grid.h"
#include "veloxquant/pq.h"

namespace veloxquant::detail {

/// The instruction sets the re-rank is built for (all of them on x86-64 with GCC or Clang,
/// whatever -march says; picked at run time).
enum class GridIsa { Scalar = 0, Avx2 = 1, Avx512 = 2 };
/// The best of them this CPU runs.
GridIsa grid_isa_supported();

class GridSearch {
 public:
  /// The search for a codebook [n_centroids, sub_dim]; null where it has no grid
  /// (shared_candidate_grid gives none: sub_dim != 4, more than kMaxGridCentroids centroids, a
  /// degenerate or non-finite codebook). The grid itself is shared per distinct codebook.
  static std::shared_ptr<const GridSearch> make(const float* codebook, int n_centroids, int sub_dim);
  /// The search through a given grid of that codebook (tests: grids of any g).
  static std::shared_ptr<const GridSearch> from_grid(std::shared_ptr<const CandidateGrid> grid,
                                                     const float* codebook, int n_centroids);

  /// assign[i] = pq_encode_ref's code of the sub-vector x[4i .. 4i + 3] for i < n: the cell's
  /// candidates re-ranked with the oracle's distance (f32, no contraction, ascending, ties to the
  /// lowest index); points without a cell (far, or a cell whose list was too long) take the
  /// exact scan; a non-finite point gets 0.
  void nearest(const float* x, int64_t n, int32_t* assign) const { nearest(x, n, assign, grid_isa_supported()); }
  /// The same with a given instruction set (at most grid_isa_supported(); tests run each).
  void nearest(const float* x, int64_t n, int32_t* assign, GridIsa isa) const;

  const CandidateGrid& grid() const { return *grid_; }
  int n_centroids() const { return n_; }
  /// Bytes held: the grid's cells and lists (shared by the searches of one codebook) and the
  /// codebook copies.
  int64_t nbytes() const;

 private:
  std::shared_ptr<const CandidateGrid> grid_;
  int n_ = 0, kp_ = 0;
  std::vector<float> cb_;         // [n, 4] as given (the exact scan)
  std::vector<float> cbt_;        // [4, kp_]: coordinate j of centroid c at j·kp_ + c (gathers)
};

/// Whether the CPU caches build a grid search for this quantizer: sub_dim 4 and more than 1024
/// centroids (d4b12). bench/cpu/bench_encode.cpp on calibrated keys (k-means codebooks,
/// Student-t data with outlier channels), one thread: d4b12 1.77-1.79x the SIMD scan, but d4b10
/// 0.90-0.94x and d4b8 0.73-0.74x — their scans are short enough that the grid's gathers lose.
bool cpu_grid_wanted(const ProductQuantizer& pq);
/// Token-heads a CPU cache encodes with the scan before it builds its grids: 2^20 by default
/// (the d4b12 build takes ~1-3 s here, about the scan of 0.3 M token-heads, and the grid
/// saves ~45% of each later encode: it has paid for itself by ~0.7 M), or the value set by
/// set_cpu_grid_build_after (tests; -1 restores the default).
int64_t cpu_grid_build_after();
/// Returns the previous setting (-1: the default).
int64_t set_cpu_grid_build_after(int64_t token_heads);

/// ProductQuantizer::encode's codes, with the nearest-centroid search through gs (built for
/// pq's codebook). @param x [n, head_dim] @param codes [n, code_bytes]
void pq_encode_grid(const ProductQuantizer& pq, const GridSearch& gs, const float* x, int64_t n, uint8_t* codes);

}  // namespace veloxquant::detail
