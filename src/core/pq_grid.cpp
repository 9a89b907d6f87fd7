// src/core/pq_grid.cpp — candidate grid of a sub_dim-4 codebook (see pq_grid.h for the proof
// that every cell's list holds the oracle's answer for every point of the cell).
#include "core/pq_grid.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/pq_internal.h"

namespace veloxquant::detail {

namespace {
constexpr double kDelta = 1e-5;    // relative margin: ≫ 2·(d + 2)·2^-24 for d = 4
constexpr double kEps = 1e-42;     // absolute margin: ≫ f32 underflow of four squares (~1e-44)
constexpr double kEnlarge = 0.01;  // cells enlarged by this fraction of their width per side
constexpr double kFar = 4.0;       // the far box: this many codebook spans beyond the grid
}  // namespace

CandidateGrid build_candidate_grid(const float* cb, int n, int sub_dim, int g) {
  CandidateGrid grid;
  if (sub_dim != 4 || n < 1 || n > 256 || g < 2 || g > 32) return grid;
  float lo[4], hi[4];
  for (int j = 0; j < 4; ++j) lo[j] = INFINITY, hi[j] = -INFINITY;
  for (int c = 0; c < n; ++c)
    for (int j = 0; j < 4; ++j) {
      const float v = cb[size_t(c) * 4 + j];
      if (!std::isfinite(v) || std::fabs(v) > 1e15f) return grid;
      lo[j] = std::min(lo[j], v), hi[j] = std::max(hi[j], v);
    }
  double span_max = 0;
  for (int j = 0; j < 4; ++j) span_max = std::max(span_max, double(hi[j]) - double(lo[j]));
  if (!(span_max > 1e-30)) return grid;
  grid.g = g;
  double blo[4][32], bhi[4][32];  // per dimension and cell index: the enlarged cell's bounds
  for (int j = 0; j < 4; ++j) {
    const double span = double(hi[j]) - double(lo[j]) > 1e-3 * span_max ? double(hi[j]) - double(lo[j]) : 1e-3 * span_max;
    grid.lo[j] = lo[j];
    grid.inv_w[j] = float(g / span);
    grid.far_lo[j] = float(double(lo[j]) - kFar * span);
    grid.far_hi[j] = float(double(lo[j]) + span + kFar * span);
    const double w = 1.0 / double(grid.inv_w[j]);  // the width the f32 index computation implies
    for (int t = 0; t < g; ++t) {
      blo[j][t] = t == 0 ? double(grid.far_lo[j]) : double(lo[j]) + (t - kEnlarge) * w;
      bhi[j][t] = t == g - 1 ? double(grid.far_hi[j]) : double(lo[j]) + (t + 1 + kEnlarge) * w;
    }
  }
  const int n_cells = g * g * g * g;
  std::vector<std::vector<uint8_t>> per_cell(static_cast<size_t>(n_cells));
  parallel_ranges(n_cells, resolve_thread_count(0, n_cells, 64), [&](int64_t c0, int64_t c1) {
    std::vector<double> centre_d(static_cast<size_t>(n));
    std::vector<int> keep, order;
    for (int64_t cell = c0; cell < c1; ++cell) {
      double a[4], b[4];
      int64_t r = cell;
      for (int j = 0; j < 4; ++j) a[j] = blo[j][r % g], b[j] = bhi[j][r % g], r /= g;
      // Whether centroid o beats c by the margin everywhere on the box: min over the box of
      // D_c − (1 + δ)·D_o > ε. The function is concave (a corner holds the minimum) and a sum of
      // one term per dimension, so the minimum over the 16 corners is the sum of the per-dimension
      // minima over {a_j, b_j}. The test allows 1e-12 of the terms' size for double rounding.
      auto beats = [&](int o, int c) {
        double m = 0, size = 0;
        for (int j = 0; j < 4; ++j) {
          const double cj = cb[size_t(c) * 4 + j], oj = cb[size_t(o) * 4 + j];
          const double ca = a[j] - cj, cb2 = b[j] - cj, oa = a[j] - oj, ob = b[j] - oj;
          m += std::min(ca * ca - (1 + kDelta) * oa * oa, cb2 * cb2 - (1 + kDelta) * ob * ob);
          size += std::max(ca * ca, cb2 * cb2) + std::max(oa * oa, ob * ob);
        }
        return m > kEps + 1e-12 * size;
      };
      // 1. the centroid nearest the box's centre, and everything it does not beat
      int best = 0;
      for (int c = 0; c < n; ++c) {
        double e = 0;
        for (int j = 0; j < 4; ++j) {
          const double t = 0.5 * (a[j] + b[j]) - double(cb[size_t(c) * 4 + j]);
          e += t * t;
        }
        centre_d[size_t(c)] = e;
        if (e < centre_d[size_t(best)]) best = c;
      }
      keep.clear();
      for (int c = 0; c < n; ++c)
        if (c == best || !beats(best, c)) keep.push_back(c);
      // 2. drop a survivor that another survivor beats (tried nearest the centre first: early
      // exits; the outcome does not depend on the order)
      order = keep;
      std::sort(order.begin(), order.end(), [&](int x, int y) { return centre_d[size_t(x)] < centre_d[size_t(y)]; });
      std::vector<uint8_t>& out = per_cell[size_t(cell)];
      for (const int c : keep) {  // ascending: the lists keep the oracle's scan order
        bool beaten = false;
        for (size_t oi = 0; oi < order.size() && !beaten; ++oi) beaten = order[oi] != c && beats(order[oi], c);
        if (!beaten) out.push_back(uint8_t(c));
      }
    }
  });
  grid.cells.resize(size_t(n_cells));
  size_t total = 0;
  for (int cell = 0; cell < n_cells; ++cell) {
    const std::vector<uint8_t>& l = per_cell[size_t(cell)];
    grid.cells[size_t(cell)] = uint32_t(grid.lists.size() << 9) | uint32_t(l.size());
    for (size_t i = 0; i < l.size(); i += 4) {
      uint32_t w = 0;
      for (size_t q = 0; q < 4; ++q) w |= uint32_t(l[std::min(i + q, l.size() - 1)]) << (8 * q);
      grid.lists.push_back(w);
    }
    total += l.size();
    grid.max_candidates = std::max(grid.max_candidates, int(l.size()));
  }
  grid.mean_candidates = double(total) / n_cells;
  return grid;
}

std::shared_ptr<const CandidateGrid> shared_candidate_grid(const float* cb, int n, int sub_dim) {
  if (sub_dim != 4 || n < 1 || n > 256) return nullptr;
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const CandidateGrid>> memo;  // codebook bytes → grid
  std::string key(reinterpret_cast<const char*>(cb), size_t(n) * 4 * sizeof(float));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = memo.find(key); it != memo.end())
      if (auto g = it->second.lock()) return g;
  }
  auto grid = std::make_shared<const CandidateGrid>(build_candidate_grid(cb, n, sub_dim, kDefaultGridCells));
  if (grid->g == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = memo.begin(); it != memo.end();) it = it->second.expired() ? memo.erase(it) : std::next(it);
  memo[std::move(key)] = grid;
  return grid;
}

int candidate_cell(const CandidateGrid& grid, const float* x) {
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

int grid_nearest(const CandidateGrid& grid, const float* cb, int n, const float* x) {
  for (int j = 0; j < 4; ++j)
    if (!std::isfinite(x[j])) return 0;
  const int cell = candidate_cell(grid, x);
  int best = 0;
  float bd = INFINITY;
  if (cell < 0) {
    bd = pq_sub_distance_ref(x, cb, 4);
    for (int c = 1; c < n; ++c) {
      const float e = pq_sub_distance_ref(x, cb + size_t(c) * 4, 4);
      if (e < bd) bd = e, best = c;
    }
    return best;
  }
  const uint32_t w = grid.cells[size_t(cell)];
  const uint32_t first = w >> 9, count = w & 511u;
  for (uint32_t i = 0; i < count; ++i) {
    const int c = int((grid.lists[first + i / 4] >> (8 * (i % 4))) & 255u);
    const float e = pq_sub_distance_ref(x, cb + size_t(c) * 4, 4);
    if (e < bd) bd = e, best = c;
  }
  return best;
}

}  // namespace veloxquant::detail
