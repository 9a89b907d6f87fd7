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
constexpr double kDelta = kGridDelta;
constexpr double kEps = kGridEps;
constexpr double kEnlarge = 0.01;  // cells enlarged by this fraction of their width per side
constexpr double kFar = 4.0;       // the far box: this many codebook spans beyond the grid
constexpr int kPruneInner = 64;    // inner boxes drop beaten survivors pairwise only up to this many
constexpr uint32_t kCountBits = kGridCountBits, kMaxCount = kGridMaxCount;

struct Box {
  double a[4], b[4];
};

/// A box of the subdivision: fine cell indices [l_j, h_j) per dimension.
struct Node {
  int l[4], h[4];
  bool leaf() const { return h[0] - l[0] == 1 && h[1] - l[1] == 1 && h[2] - l[2] == 1 && h[3] - l[3] == 1; }
};

class Builder {
 public:
  Builder(const float* cb, int g) : cb_(cb), g_(g) {}
  double blo[4][32], bhi[4][32];  // per dimension and cell index: the enlarged cell's bounds

  /// A node's box: the hull of its cells' (enlarged) boxes, so a child's box lies in its parent's.
  Box box(const Node& nd) const {
    Box B;
    for (int j = 0; j < 4; ++j) B.a[j] = blo[j][nd.l[j]], B.b[j] = bhi[j][nd.h[j] - 1];
    return B;
  }

  /// The children of an inner node: every dimension wider than one cell halved.
  static int children(const Node& nd, Node (&out)[16]) {
    int k = 0;
    for (int mask = 0; mask < 16; ++mask) {
      Node c = nd;
      bool dup = false;
      for (int j = 0; j < 4; ++j) {
        const int w = nd.h[j] - nd.l[j];
        if (w == 1) {
          dup |= (mask >> j) & 1;
          continue;
        }
        const int m = nd.l[j] + w / 2;
        if ((mask >> j) & 1) c.l[j] = m;
        else c.h[j] = m;
      }
      if (!dup) out[k++] = c;
    }
    return k;
  }

  /// Narrows `from` (ascending candidates of a box containing B) to B: the centroid nearest B's
  /// centre and every one it does not beat on B; with `prune`, then drops a survivor that another
  /// survivor beats. What leaves is beaten everywhere on B, so it is nobody's answer there.
  void narrow(const Box& B, const std::vector<uint16_t>& from, bool prune, std::vector<uint16_t>& out) {
    const size_t m = from.size();
    cd_.resize(m);
    size_t best = 0;
    for (size_t i = 0; i < m; ++i) {
      const float* c = cb_ + size_t(from[i]) * 4;
      double e = 0;
      for (int j = 0; j < 4; ++j) {
        const double t = 0.5 * (B.a[j] + B.b[j]) - double(c[j]);
        e += t * t;
      }
      cd_[i] = e;
      if (e < cd_[best]) best = i;
    }
    keep_.clear();
    for (size_t i = 0; i < m; ++i)
      if (i == best || !beats(B, from[best], from[i])) keep_.push_back(uint32_t(i));
    out.clear();
    if (!prune) {
      for (const uint32_t i : keep_) out.push_back(from[i]);
      return;
    }
    // tried nearest the centre first: early exits; the outcome does not depend on the order
    order_ = keep_;
    std::sort(order_.begin(), order_.end(), [&](uint32_t x, uint32_t y) { return cd_[x] < cd_[y]; });
    for (const uint32_t i : keep_) {  // ascending: the lists keep the oracle's scan order
      bool beaten = false;
      for (size_t oi = 0; oi < order_.size() && !beaten; ++oi)
        beaten = order_[oi] != i && beats(B, from[order_[oi]], from[i]);
      if (!beaten) out.push_back(from[i]);
    }
  }

  /// Depth-first below `nd` (whose candidates are `list`): each cell's list into per_cell.
  void descend(const Node& nd, const std::vector<uint16_t>& list, std::vector<std::vector<uint16_t>>& per_cell) {
    Node kids[16];
    const int nk = children(nd, kids);
    std::vector<uint16_t> sub;
    for (int k = 0; k < nk; ++k) {
      const Node& c = kids[k];
      if (c.leaf()) {
        const int cell = c.l[0] + g_ * (c.l[1] + g_ * (c.l[2] + g_ * c.l[3]));
        narrow(box(c), list, true, per_cell[size_t(cell)]);
        continue;
      }
      narrow(box(c), list, list.size() <= size_t(kPruneInner), sub);
      descend(c, sub, per_cell);
    }
  }

 private:
  /// Whether centroid o beats c by the margin everywhere on the box: min over the box of
  /// D_c − (1 + δ)·D_o > ε. The function is concave (a corner holds the minimum) and a sum of one
  /// term per dimension, so the minimum over the 16 corners is the sum of the per-dimension minima
  /// over {a_j, b_j}. The test allows 1e-12 of the terms' size for double rounding.
  bool beats(const Box& B, int o, int c) const {
    double m = 0, size = 0;
    for (int j = 0; j < 4; ++j) {
      const double cj = cb_[size_t(c) * 4 + j], oj = cb_[size_t(o) * 4 + j];
      const double ca = B.a[j] - cj, cb2 = B.b[j] - cj, oa = B.a[j] - oj, ob = B.b[j] - oj;
      m += std::min(ca * ca - (1 + kDelta) * oa * oa, cb2 * cb2 - (1 + kDelta) * ob * ob);
      size += std::max(ca * ca, cb2 * cb2) + std::max(oa * oa, ob * ob);
    }
    return m > kEps + 1e-12 * size;
  }

  const float* cb_;
  int g_;
  std::vector<double> cd_;
  std::vector<uint32_t> keep_, order_;
};
}  // namespace

int default_grid_cells(int n_centroids) { return n_centroids <= 256 ? kDefaultGridCells : n_centroids <= 1024 ? 14 : 16; }

bool grid_geometry(const float* cb, int n, int sub_dim, int g, CandidateGrid& grid, double (&blo)[4][32],
                   double (&bhi)[4][32]) {
  grid = CandidateGrid{};
  if (sub_dim != 4 || n < 1 || n > kMaxGridCentroids || g < 2 || g > 32) return false;
  float lo[4], hi[4];
  for (int j = 0; j < 4; ++j) lo[j] = INFINITY, hi[j] = -INFINITY;
  for (int c = 0; c < n; ++c)
    for (int j = 0; j < 4; ++j) {
      const float v = cb[size_t(c) * 4 + j];
      if (!std::isfinite(v) || std::fabs(v) > 1e15f) return false;
      lo[j] = std::min(lo[j], v), hi[j] = std::max(hi[j], v);
    }
  double span_max = 0;
  for (int j = 0; j < 4; ++j) span_max = std::max(span_max, double(hi[j]) - double(lo[j]));
  if (!(span_max > 1e-30)) return false;
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
  grid.g = g;
  grid.index_bits = n > 256 ? 16 : 8;
  return true;
}

CandidateGrid build_candidate_grid(const float* cb, int n, int sub_dim, int g) {
  CandidateGrid grid;
  Builder root_builder(cb, g);
  if (!grid_geometry(cb, n, sub_dim, g, grid, root_builder.blo, root_builder.bhi)) return CandidateGrid{};
  // The cells' lists by recursive halving: a box's candidates are narrowed from its parent's
  // (a child's box lies in its parent's, so whatever is beaten everywhere on the parent is on the
  // child too). Breadth-first down to a frontier of >= 64 boxes, then depth-first per frontier
  // box on the threads: O(cells · parent list) instead of O(cells · n).
  const int n_cells = g * g * g * g;
  std::vector<std::vector<uint16_t>> per_cell(static_cast<size_t>(n_cells));
  std::vector<Node> frontier{Node{{0, 0, 0, 0}, {g, g, g, g}}};
  std::vector<std::vector<uint16_t>> lists(1);
  for (int c = 0; c < n; ++c) lists[0].push_back(uint16_t(c));
  root_builder.narrow(root_builder.box(frontier[0]), std::vector<uint16_t>(lists[0]), n <= kPruneInner, lists[0]);
  while (frontier.size() < 64 && !frontier[0].leaf()) {
    std::vector<Node> next;
    std::vector<std::vector<uint16_t>> next_lists;
    for (size_t i = 0; i < frontier.size(); ++i) {
      Node kids[16];
      const int nk = Builder::children(frontier[i], kids);
      for (int k = 0; k < nk; ++k) {
        next.push_back(kids[k]);
        next_lists.emplace_back();
        root_builder.narrow(root_builder.box(kids[k]), lists[i], kids[k].leaf() || lists[i].size() <= size_t(kPruneInner),
                            next_lists.back());
      }
    }
    frontier.swap(next);
    lists.swap(next_lists);
  }
  if (frontier[0].leaf()) {
    for (size_t i = 0; i < frontier.size(); ++i) {
      const Node& c = frontier[i];
      per_cell[size_t(c.l[0] + g * (c.l[1] + g * (c.l[2] + g * c.l[3])))] = std::move(lists[i]);
    }
  } else {
    const int nf = int(frontier.size());
    parallel_ranges(nf, resolve_thread_count(0, nf, 4), [&](int64_t f0, int64_t f1) {
      Builder b = root_builder;
      for (int64_t f = f0; f < f1; ++f) b.descend(frontier[size_t(f)], lists[size_t(f)], per_cell);
    });
  }
  std::vector<uint32_t> counts(static_cast<size_t>(n_cells));
  for (int cell = 0; cell < n_cells; ++cell) counts[size_t(cell)] = uint32_t(per_cell[size_t(cell)].size());
  const int64_t words = pack_cell_words(counts, grid);
  if (words < 0) return CandidateGrid{};
  const uint32_t per_word = 32u / uint32_t(grid.index_bits);
  grid.lists.assign(size_t(words), 0u);
  for (int cell = 0; cell < n_cells; ++cell) {
    const std::vector<uint16_t>& l = per_cell[size_t(cell)];
    const uint32_t w = grid.cells[size_t(cell)];
    if ((w & kMaxCount) == 0) continue;  // a cell without a list
    for (size_t i = 0; i < l.size(); i += per_word) {
      uint32_t word = 0;
      for (size_t q = 0; q < per_word; ++q) word |= uint32_t(l[std::min(i + q, l.size() - 1)]) << (size_t(grid.index_bits) * q);
      grid.lists[(w >> kCountBits) + i / per_word] = word;
    }
  }
  return grid;
}

int64_t pack_cell_words(const std::vector<uint32_t>& counts, CandidateGrid& grid) {
  const uint32_t per_word = 32u / uint32_t(grid.index_bits);
  grid.cells.assign(counts.size(), 0u);
  grid.scan_cells = 0;
  grid.max_candidates = 0;
  uint64_t words = 0, total = 0;
  for (size_t cell = 0; cell < counts.size(); ++cell) {
    const uint32_t k = counts[cell];
    total += k;
    grid.max_candidates = std::max(grid.max_candidates, int(k));
    if (k > kMaxCount) {  // too long for the count field: the cell's points scan
      ++grid.scan_cells;
      continue;
    }
    if (words >= (uint64_t(1) << (32 - kCountBits))) return -1;  // offsets overflow
    grid.cells[cell] = uint32_t(words << kCountBits) | k;
    words += (k + per_word - 1) / per_word;
  }
  grid.mean_candidates = counts.empty() ? 0.0 : double(total) / double(counts.size());
  return int64_t(words);
}

std::shared_ptr<const CandidateGrid> shared_candidate_grid(const float* cb, int n, int sub_dim) {
  if (sub_dim != 4 || n < 1 || n > kMaxGridCentroids) return nullptr;
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const CandidateGrid>> memo;  // codebook bytes → grid
  std::string key(reinterpret_cast<const char*>(cb), size_t(n) * 4 * sizeof(float));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = memo.find(key); it != memo.end())
      if (auto g = it->second.lock()) return g;
  }
  auto grid = std::make_shared<const CandidateGrid>(build_candidate_grid(cb, n, sub_dim, default_grid_cells(n)));
  if (grid->g == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = memo.begin(); it != memo.end();) it = it->second.expired() ? memo.erase(it) : std::next(it);
  memo[std::move(key)] = grid;
  return grid;
}

int grid_nearest(const CandidateGrid& grid, const float* cb, int n, const float* x) {
  for (int j = 0; j < 4; ++j)
    if (!std::isfinite(x[j])) return 0;
  const int cell = candidate_cell(grid, x);
  const uint32_t w = cell < 0 ? 0u : grid.cells[size_t(cell)];
  const uint32_t first = w >> kCountBits, count = w & kMaxCount;
  int best = 0;
  float bd = INFINITY;
  if (count == 0) {  // no cell, or a cell without a list: the oracle's full scan
    bd = pq_sub_distance_ref(x, cb, 4);
    for (int c = 1; c < n; ++c) {
      const float e = pq_sub_distance_ref(x, cb + size_t(c) * 4, 4);
      if (e < bd) bd = e, best = c;
    }
    return best;
  }
  const uint32_t per_word = 32u / uint32_t(grid.index_bits), mask = (1u << grid.index_bits) - 1u;
  for (uint32_t i = 0; i < count; ++i) {
    const int c = int((grid.lists[first + i / per_word] >> (uint32_t(grid.index_bits) * (i % per_word))) & mask);
    const float e = pq_sub_distance_ref(x, cb + size_t(c) * 4, 4);
    if (e < bd) bd = e, best = c;
  }
  return best;
}

}  // namespace veloxquant::detail
