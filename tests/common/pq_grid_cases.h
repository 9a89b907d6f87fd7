// tests/common/pq_grid_cases.h — shared by the candidate grid's tests (tests/unit/test_pq_grid.cpp,
// host builds) and the CUDA ones (tests/cuda/test_cuda_encode_bulk.cpp, device builds): the
// encoder's oracle for one sub_dim-4 sub-vector and the points built to break a grid.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/pq_grid.h"
#include "core/pq_internal.h"

namespace vq_grid_cases {

using veloxquant::detail::CandidateGrid;

/// pq_encode_ref's rule for one sub-vector: ascending scan, strict <, 0 for a non-finite point.
inline int oracle(const std::vector<float>& cb, const float* x) {
  for (int j = 0; j < 4; ++j)
    if (!std::isfinite(x[j])) return 0;
  const int n = int(cb.size() / 4);
  int best = 0;
  float bd = veloxquant::detail::pq_sub_distance_ref(x, cb.data(), 4);
  for (int c = 1; c < n; ++c) {
    const float e = veloxquant::detail::pq_sub_distance_ref(x, cb.data() + size_t(c) * 4, 4);
    if (e < bd) bd = e, best = c;
  }
  return best;
}

/// Points: the codebook's own entries, midpoints and near-midpoints of random pairs, cell
/// boundaries, Gaussian points at the codebook's scale, far and non-finite points.
inline std::vector<std::array<float, 4>> points(const std::vector<float>& cb, const CandidateGrid& grid, uint32_t seed) {
  const int n = int(cb.size() / 4);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, n - 1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  float scale = 0;
  for (float v : cb) scale = std::max(scale, std::fabs(v));
  std::vector<std::array<float, 4>> p;
  for (int c = 0; c < n; ++c) p.push_back({cb[4 * c], cb[4 * c + 1], cb[4 * c + 2], cb[4 * c + 3]});
  for (int i = 0; i < 3000; ++i) {
    const int a = pick(rng), b = pick(rng);
    std::array<float, 4> m;
    for (int j = 0; j < 4; ++j) m[j] = 0.5f * (cb[4 * a + j] + cb[4 * b + j]);
    p.push_back(m);
    for (int j = 0; j < 4; ++j) m[j] = std::nextafter(m[j], (i & 1) ? INFINITY : -INFINITY);
    p.push_back(m);
  }
  for (int i = 0; i < 20000; ++i) {
    std::array<float, 4> x;
    const float s = scale * ((i % 10 == 0) ? 3.0f : 0.6f);
    for (float& v : x) v = s * nd(rng);
    p.push_back(x);
  }
  if (grid.g > 0)
    for (int i = 0; i < 3000; ++i) {  // on cell boundaries of the f32 index computation
      std::array<float, 4> x;
      for (int j = 0; j < 4; ++j) {
        const int t = std::uniform_int_distribution<int>(0, grid.g)(rng);
        x[j] = grid.lo[j] + float(t) / grid.inv_w[j];
        if (i & 1) x[j] = std::nextafter(x[j], (i & 2) ? INFINITY : -INFINITY);
      }
      p.push_back(x);
    }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  p.push_back({0, 0, 0, 0});
  p.push_back({1e30f, 0, 0, 0});
  p.push_back({-1e30f, 1e30f, 0, 1});
  p.push_back({20 * scale, -20 * scale, 0, 0});
  p.push_back({inf, 0, 0, 0});
  p.push_back({nan, 1, 2, 3});
  if (grid.g > 0)
    for (int j = 0; j < 4; ++j) {  // exactly at and just past the far box
      std::array<float, 4> x = {grid.lo[0], grid.lo[1], grid.lo[2], grid.lo[3]};
      x[j] = grid.far_hi[j];
      p.push_back(x);
      x[j] = std::nextafter(grid.far_hi[j], inf);
      p.push_back(x);
      x[j] = grid.far_lo[j];
      p.push_back(x);
    }
  return p;
}

}  // namespace vq_grid_cases
