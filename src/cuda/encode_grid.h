// src/cuda/encode_grid.h — a codebook's candidate grid (src/core/pq_grid.h) on the device, as
// the bulk encoder reads it (cuda::EncodeGrid). Host-side, no CUDA header: the caches, the tests
// and the benchmark upload grids through this one function.
#pragma once

#include <memory>

#include "core/pq_grid.h"
#include "cuda/kernels.h"
#include "veloxquant/tensor.h"

namespace veloxquant::cuda {

struct DeviceEncodeGrid {
  std::shared_ptr<const detail::CandidateGrid> host;  ///< null: the codebook has no grid
  Tensor cells, lists;                                ///< device copies (U32)
  EncodeGrid view;                                    ///< what EncodeParams::k_grid / v_grid take
  int64_t nbytes() const { return (cells.defined() ? cells.nbytes() : 0) + (lists.defined() ? lists.nbytes() : 0); }
};

/// The grid the encoders use for a codebook [n_centroids, sub_dim] (detail::shared_candidate_grid:
/// built once per distinct codebook), uploaded to `device`. view.cells is null where the codebook
/// has none (sub_dim 8, more than 4096 centroids, non-finite values): the encoder then scans.
DeviceEncodeGrid upload_encode_grid(const float* codebook, int n_centroids, int sub_dim, Device device);

/// The kernel's view of d: d.cells / d.lists device pointers and d.host's geometry (d.host set).
void fill_encode_grid_view(DeviceEncodeGrid& d);

/// A given grid (e.g. one built with another cell count) uploaded to `device`; none for a null
/// grid or one with g = 0.
DeviceEncodeGrid upload_encode_grid(std::shared_ptr<const detail::CandidateGrid> grid, Device device);

/// The grid of a codebook of more than 256 centroids (16-bit lists, g = default_grid_cells),
/// built on `device` itself (src/cuda/encode_grid_build.cu: 46 ms for 4096 centroids on the H200
/// where the host build takes 0.2-1 s) and downloaded into `host` too. The lists are complete but need not equal the host
/// build's. None for codebooks of <= 256 centroids (upload_encode_grid builds those) and where
/// build_candidate_grid gives none. Synchronous (the legacy default stream).
DeviceEncodeGrid build_encode_grid_on_device(const float* codebook, int n_centroids, int sub_dim, Device device);

}  // namespace veloxquant::cuda
