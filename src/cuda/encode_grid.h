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
/// has none (sub_dim 8, more than 256 centroids, non-finite values): the encoder then scans.
DeviceEncodeGrid upload_encode_grid(const float* codebook, int n_centroids, int sub_dim, Device device);

}  // namespace veloxquant::cuda
