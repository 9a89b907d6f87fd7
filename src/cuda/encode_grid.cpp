// src/cuda/encode_grid.cpp — see encode_grid.h.
#include "cuda/encode_grid.h"

#include <algorithm>

#include "core/cuda_hooks.h"

namespace veloxquant::cuda {

DeviceEncodeGrid upload_encode_grid(const float* codebook, int n_centroids, int sub_dim, Device device) {
  return upload_encode_grid(detail::shared_candidate_grid(codebook, n_centroids, sub_dim), device);
}

DeviceEncodeGrid upload_encode_grid(std::shared_ptr<const detail::CandidateGrid> grid, Device device) {
  DeviceEncodeGrid d;
  d.host = std::move(grid);
  if (!d.host || d.host->g == 0) {
    d.host = nullptr;
    return d;
  }
  const detail::CandidateGrid& g = *d.host;
  d.cells = Tensor::empty({int64_t(g.cells.size())}, DType::U32, device);
  d.lists = Tensor::empty({int64_t(std::max<size_t>(g.lists.size(), 1))}, DType::U32, device);
  detail::cuda_memcpy_h2d(d.cells.data(), g.cells.data(), g.cells.size() * 4, device);
  if (!g.lists.empty()) detail::cuda_memcpy_h2d(d.lists.data(), g.lists.data(), g.lists.size() * 4, device);
  fill_encode_grid_view(d);
  return d;
}

void fill_encode_grid_view(DeviceEncodeGrid& d) {
  const detail::CandidateGrid& g = *d.host;
  d.view.cells = d.cells.ptr<uint32_t>();
  d.view.lists = d.lists.ptr<uint32_t>();
  d.view.g = g.g;
  d.view.wide = g.index_bits == 16 ? 1 : 0;
  for (int j = 0; j < 4; ++j)
    d.view.lo[j] = g.lo[j], d.view.inv_w[j] = g.inv_w[j], d.view.far_lo[j] = g.far_lo[j], d.view.far_hi[j] = g.far_hi[j];
}

}  // namespace veloxquant::cuda
