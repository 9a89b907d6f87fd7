// src/core/pq_grid.h — candidate grid of a sub_dim-4 codebook: the exact nearest-centroid search
// of the encoders, restricted per point to the few centroids that can win in its grid cell.
//
// Why. The CUDA bulk encoder scans every centroid for every sub-vector (~6 instructions per
// (sub-vector, centroid) pair, docs/cuda-notes.md "Encode"); in 4 dimensions a point's nearest
// centroid is one of a handful near it. A uniform g^4 grid over the codebook's bounding box lists,
// per cell, every centroid that can be the oracle's answer (pq_encode_ref: f32 distances without
// FMA, ties to the lowest index) for some point of the cell; the search then re-ranks only that
// list with the oracle's arithmetic, in ascending index order with strict <, so its codes are the
// oracle's, bit for bit.
//
// Why the lists are complete. Centroid c leaves cell B's list only if some c' beats it by a
// relative margin everywhere in B, or in a box that contains B (the build narrows each box's
// list from its parent's): D_c(x) − (1 + δ)·D_c'(x) > ε on that box (D = exact squared
// distance). That function is concave in x (its quadratic part is −δ·||x||²), so its minimum over
// the box is at one of the 16 corners; it is also a sum of one term per dimension, so that minimum
// is the sum of the per-dimension minima over the two ends of the box's side. The oracle's f32 distance of
// d = 4 terms is within (d + 2)·2^-24 (relative) of D plus ~1e-44 absolute (underflow), so with
// δ = 1e-5 ≫ 2·6·2^-24 and ε = 1e-42 the f32 distance of c' is strictly below c's: c cannot be the
// answer, whatever the tie rule. Cells are enlarged by 1% of their width on every side (a point's
// cell index is computed in f32, error < 1e-5 cells), the outer cells reach out to a far box
// (4 spans of the codebook beyond it); points outside the far box, or with a non-finite
// coordinate, have no cell and take the full scan.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

namespace veloxquant::detail {

struct CandidateGrid {
  int g = 0;  ///< cells per dimension (0: no grid)
  /// cell index per dimension: t_j = floor((x_j − lo_j)·inv_w_j) in f32, clamped to [0, g − 1]
  float lo[4] = {}, inv_w[4] = {};
  /// points with far_lo_j <= x_j <= far_hi_j in every dimension have a cell
  float far_lo[4] = {}, far_hi[4] = {};
  /// per cell (index t0 + g·(t1 + g·(t2 + g·t3))): (first list word << 9) | candidate count;
  /// count 0: the cell has no list (it would exceed 511 candidates) and its points scan
  std::vector<uint32_t> cells;
  /// bits per candidate index in `lists`: 8 for codebooks of <= 256 centroids, else 16
  int index_bits = 8;
  /// candidate indices, ascending, 32 / index_bits per word (field i of word w = candidate
  /// (32 / index_bits)·w + i of the cell's run, lowest bits first); a cell's run is padded to
  /// whole words by repeating its last index (harmless: the re-rank's strict < ignores a repeat)
  std::vector<uint32_t> lists;
  /// statistics of the build: mean candidates per cell, the largest list, cells without a list
  double mean_candidates = 0;
  int max_candidates = 0;
  int scan_cells = 0;
};

/// The largest codebook a grid is built for (d4b12 keys: 4096 centroids).
constexpr int kMaxGridCentroids = 4096;
/// The margins of the proof above (relative δ ≫ 2·(d + 2)·2^-24 for d = 4; absolute ε ≫ the f32
/// underflow of four squares, ~1e-44) and the cell word's count field (9 bits: <= 511).
constexpr double kGridDelta = 1e-5, kGridEps = 1e-42;
constexpr int kGridCountBits = 9;
constexpr uint32_t kGridMaxCount = (1u << kGridCountBits) - 1;

/// Fills grid.cells from each cell's list length (counts, one per cell) as the encoders read them:
/// runs packed in cell order, each padded to whole words of grid.index_bits-bit entries; a count
/// above kGridMaxCount makes a cell without a list (word 0: its points scan). Also fills
/// scan_cells, max_candidates and mean_candidates. Returns the number of list words, or -1 where
/// the word offsets would overflow a cell word. Shared by the host and the CUDA builds.
int64_t pack_cell_words(const std::vector<uint32_t>& counts, CandidateGrid& grid);

/// The grid's geometry for a codebook [n_centroids, 4] with g cells per dimension: fills grid's
/// g, index_bits, lo, inv_w, far_lo, far_hi (no cells, no lists) and each cell's enlarged box per
/// dimension and cell index, [blo[j][t], bhi[j][t]] (t < g). False (grid left empty) where
/// build_candidate_grid gives no grid. Shared by the host build and the CUDA one
/// (src/cuda/encode_grid_build.cu).
bool grid_geometry(const float* codebook, int n_centroids, int sub_dim, int g, CandidateGrid& grid,
                   double (&blo)[4][32], double (&bhi)[4][32]);

/// Builds the grid of a codebook [n_centroids, 4] with g cells per dimension (2..32). Returns a
/// grid with g = 0 (the caller keeps the full scan) when the codebook is not sub_dim 4, has more
/// than kMaxGridCentroids centroids, holds a non-finite or huge (|c| > 1e15) value, or is
/// degenerate (a dimension whose centroids all coincide). The lists come from a recursive halving
/// of the grid (each box's list narrowed from its parent's), so the build costs about
/// O(cells · parent list), not O(cells · n_centroids).
CandidateGrid build_candidate_grid(const float* codebook, int n_centroids, int sub_dim, int g);

/// The grid the encoders use for a codebook: g = default_grid_cells(n_centroids), built once per
/// distinct codebook per process and shared. Null where build_candidate_grid gives none.
constexpr int kDefaultGridCells = 10;  ///< g for codebooks of <= 256 centroids
/// Cells per dimension for a codebook of n centroids: 10 up to 256 centroids, more for larger
/// codebooks so a cell's list stays about as short.
int default_grid_cells(int n_centroids);
std::shared_ptr<const CandidateGrid> shared_candidate_grid(const float* codebook, int n_centroids, int sub_dim);

/// The cell of x[4] (−1: no cell: x outside the far box, or NaN), exactly as the CUDA encoder
/// computes it. Inline: the CPU grid search calls it per point.
inline int candidate_cell(const CandidateGrid& grid, const float* x) {
  if (grid.g == 0) return -1;
  int cell = 0;
  for (int j = 3; j >= 0; --j) {
    if (!(x[j] >= grid.far_lo[j] && x[j] <= grid.far_hi[j])) return -1;  // also NaN
    const float u = (x[j] - grid.lo[j]) * grid.inv_w[j];
    const int t = std::min(std::max(int(std::floor(u)), 0), grid.g - 1);
    cell = cell * grid.g + t;
  }
  return cell;
}

/// The encoder's answer for one sub-vector x[4] through the grid: equal to pq_encode_ref's code
/// (points without a cell take the full oracle scan; a non-finite x gives 0).
int grid_nearest(const CandidateGrid& grid, const float* codebook, int n_centroids, const float* x);

}  // namespace veloxquant::detail
