// src/cpu/pq_grid_search.cpp — see pq_grid_search.h.
//
// Exactness. The re-rank must produce pq_sub_distance_ref's f32 value for every candidate: the
// four terms (x_j − c_j)² are added in order, each product rounded before its sum. This file is
// compiled with -ffp-contract=off (CMakeLists.txt), so the vector intrinsics (GCC lowers them to
// generic vector arithmetic, which it may otherwise fuse) never become FMAs; the oracle's first step 0 + p0 equals p0 exactly (p0 >= +0). Candidates are taken in list
// order (ascending index) and only a strictly smaller distance replaces the best, within a vector
// chunk by taking the lowest lane among the minima: the oracle's lowest-index tie rule.
// tests/unit/test_pq_grid.cpp checks the codes against the oracle on points built to break it.
//
// Instruction sets. The AVX-512 and AVX2 re-ranks are compiled with target attributes whatever
// -march says and picked at run time (grid_isa_supported), so a portable build (VQ_NATIVE=OFF)
// gets them too and the tests run every one this CPU has. The portable path is the grid's own
// scalar search (grid_nearest, which uses pq_sub_distance_ref).
//
// Shape. Points in batches of 32 (cells, then cell words, then runs, each prefetched a step
// ahead), then each point's list in chunks of 16 (AVX-512) or 8 (AVX2) candidates: indices
// loaded (masked: never past the run) and widened from the 8- or 16-bit list, the four coordinates gathered from a transposed codebook, the distances, a horizontal
// minimum. A Gaussian d4b12 point sees ~31 candidates: two AVX-512 chunks instead of the SIMD
// scan's 4096 centroids.
#include "cpu/pq_grid_search.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/pq_internal.h"
#include "veloxquant/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define VQ_GRID_X86 1
#include <immintrin.h>
#else
#define VQ_GRID_X86 0
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers (bug 105593)
#endif

namespace veloxquant::detail {

namespace {

constexpr int kLanes = 16;  // the widest chunk (the transposed codebook is padded to it)

/// What the grid says of a point: kNonFinite (code 0), kScan (no list: the exact scan) or a run
/// of `count` candidates to re-rank.
struct Plan {
  const uint8_t* run;
  uint32_t count;
};
constexpr uint32_t kNonFinite = 0xFFFFFFFFu, kScan = 0;

/// The inputs every re-rank loop reads.
struct Loop {
  const CandidateGrid& g;
  const uint8_t* lists;
  const float* cb;   // [n, 4]
  const float* cbt;  // [4, kp]
  size_t kp;
  bool wide;  // 16-bit list entries
};

/// Points are planned kBatch at a time, each step's loads prefetched a step ahead: cells and
/// lists (1.6 MB for d4b12) live in L2/L3, and one point at a time waited on two dependent
/// misses (~90 ns a point for d4b12 before).
constexpr int kBatch = 32;

/// Plans points [0, n) of x (n <= kBatch): the cell (candidate_cell), then the cell word, then
/// the run.
inline void plan_batch(const Loop& L, const float* x, int n, Plan* pl) {
  const CandidateGrid& g = L.g;
  int32_t cell[kBatch];
  for (int i = 0; i < n; ++i) {
    const float* p = x + 4 * i;
    const bool finite = std::isfinite(p[0]) && std::isfinite(p[1]) && std::isfinite(p[2]) && std::isfinite(p[3]);
    cell[i] = finite ? candidate_cell(g, p) : -2;
    if (cell[i] >= 0) __builtin_prefetch(&g.cells[size_t(cell[i])]);
  }
  for (int i = 0; i < n; ++i) {
    if (cell[i] < 0) {
      pl[i] = {nullptr, cell[i] == -2 ? kNonFinite : kScan};
      continue;
    }
    const uint32_t w = g.cells[size_t(cell[i])];
    pl[i] = {L.lists + size_t(w >> kGridCountBits) * 4, w & kGridMaxCount};  // count 0: kScan
    __builtin_prefetch(pl[i].run);
    if (pl[i].count * (L.wide ? 2u : 1u) > 64u - (uintptr_t(pl[i].run) & 63u)) __builtin_prefetch(pl[i].run + 64);
  }
}

/// Runs the points in batches: code 0, the exact scan (noted in `scan`), or rerank(x, plan).
template <class Rerank>
inline void run_points(const Loop& L, const float* x, int64_t n, int32_t* assign, std::vector<int64_t>& scan,
                       Rerank&& rerank) {
  Plan pl[kBatch];
  for (int64_t i0 = 0; i0 < n; i0 += kBatch) {
    const int nb = int(std::min<int64_t>(kBatch, n - i0));
    plan_batch(L, x + 4 * i0, nb, pl);
    for (int i = 0; i < nb; ++i) {
      if (pl[i].count == kNonFinite) assign[i0 + i] = 0;
      else if (pl[i].count == kScan) scan.push_back(i0 + i);
      else assign[i0 + i] = rerank(x + 4 * (i0 + i), pl[i]);
    }
  }
}

/// The portable path: one point at a time through grid_nearest (pq_grid.cpp), the grid's own
/// scalar search (its points without a list take the oracle's scan there).
void nearest_scalar(const Loop& L, const float* x, int64_t n, int n_centroids, int32_t* assign) {
  for (int64_t i = 0; i < n; ++i) assign[i] = grid_nearest(L.g, L.cb, n_centroids, x + 4 * i);
}

#if VQ_GRID_X86
/// The AVX-512 re-rank of one point's run: 16 candidates a chunk. The indices come in by masked
/// loads (AVX512BW/VL): nothing past the run is read, so the grid's own lists serve as they are.
struct RerankAvx512 {
  const Loop& L;
  __attribute__((target("avx512f,avx512bw,avx512vl"))) int operator()(const float* p, const Plan& pl) const {
    const float* const t0 = L.cbt;
    const size_t kp = L.kp;
    const __m512 inf = _mm512_set1_ps(INFINITY);
    const __m512 x0 = _mm512_set1_ps(p[0]), x1 = _mm512_set1_ps(p[1]), x2 = _mm512_set1_ps(p[2]),
                 x3 = _mm512_set1_ps(p[3]);
    float bd = INFINITY;
    int best = 0;
    for (uint32_t c0 = 0; c0 < pl.count; c0 += 16) {
      const __mmask16 m = pl.count - c0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (pl.count - c0)) - 1u);
      const __m512i idx = L.wide ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, pl.run + 2 * c0))
                                 : _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, pl.run + c0));
      const __m512 c0v = _mm512_mask_i32gather_ps(inf, m, idx, t0, 4);
      const __m512 c1v = _mm512_mask_i32gather_ps(inf, m, idx, t0 + kp, 4);
      const __m512 c2v = _mm512_mask_i32gather_ps(inf, m, idx, t0 + 2 * kp, 4);
      const __m512 c3v = _mm512_mask_i32gather_ps(inf, m, idx, t0 + 3 * kp, 4);
      __m512 t = _mm512_sub_ps(x0, c0v);
      __m512 acc = _mm512_mul_ps(t, t);
      t = _mm512_sub_ps(x1, c1v);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(t, t));
      t = _mm512_sub_ps(x2, c2v);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(t, t));
      t = _mm512_sub_ps(x3, c3v);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(t, t));
      acc = _mm512_mask_blend_ps(m, inf, acc);  // lanes past the list: +inf, never below bd
      const float mn = _mm512_reduce_min_ps(acc);
      if (mn < bd) {
        bd = mn;
        const __mmask16 eq = _mm512_cmp_ps_mask(acc, _mm512_set1_ps(mn), _CMP_EQ_OQ);
        alignas(64) int32_t lane_idx[16];
        _mm512_store_si512(lane_idx, idx);
        best = lane_idx[__builtin_ctz(uint32_t(eq))];  // the lowest lane: the lowest index
      }
    }
    return best;
  }
};

/// The AVX2 re-rank of one point's run: 8 candidates a chunk. The indices come in as 32-bit words
/// by a masked load of the run's words only (runs are whole words).
struct RerankAvx2 {
  const Loop& L;
  __attribute__((target("avx2"))) int operator()(const float* p, const Plan& pl) const {
    const float* const t0 = L.cbt;
    const size_t kp = L.kp;
    const __m256 inf = _mm256_set1_ps(INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 x0 = _mm256_set1_ps(p[0]), x1 = _mm256_set1_ps(p[1]), x2 = _mm256_set1_ps(p[2]),
                 x3 = _mm256_set1_ps(p[3]);
    float bd = INFINITY;
    int best = 0;
    for (uint32_t c0 = 0; c0 < pl.count; c0 += 8) {
      const int per_word = L.wide ? 2 : 4, words_left = int((pl.count - c0 + per_word - 1) / per_word);
      const __m128i wm = _mm_cmpgt_epi32(_mm_set1_epi32(words_left), _mm_setr_epi32(0, 1, 2, 3));
      const __m128i w = _mm_maskload_epi32(reinterpret_cast<const int*>(pl.run + (L.wide ? 2 : 1) * c0), wm);
      const __m256i idx = L.wide ? _mm256_cvtepu16_epi32(w) : _mm256_cvtepu8_epi32(w);
      const __m256 m = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(pl.count - c0)), lane));
      const __m256 c0v = _mm256_mask_i32gather_ps(inf, t0, idx, m, 4);
      const __m256 c1v = _mm256_mask_i32gather_ps(inf, t0 + kp, idx, m, 4);
      const __m256 c2v = _mm256_mask_i32gather_ps(inf, t0 + 2 * kp, idx, m, 4);
      const __m256 c3v = _mm256_mask_i32gather_ps(inf, t0 + 3 * kp, idx, m, 4);
      __m256 t = _mm256_sub_ps(x0, c0v);
      __m256 acc = _mm256_mul_ps(t, t);
      t = _mm256_sub_ps(x1, c1v);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(t, t));
      t = _mm256_sub_ps(x2, c2v);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(t, t));
      t = _mm256_sub_ps(x3, c3v);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(t, t));
      acc = _mm256_blendv_ps(inf, acc, m);
      __m256 r = _mm256_min_ps(acc, _mm256_permute2f128_ps(acc, acc, 1));
      r = _mm256_min_ps(r, _mm256_permute_ps(r, 0x4E));
      r = _mm256_min_ps(r, _mm256_permute_ps(r, 0xB1));
      const float mn = _mm256_cvtss_f32(r);
      if (mn < bd) {
        bd = mn;
        const int eq = _mm256_movemask_ps(_mm256_cmp_ps(acc, _mm256_set1_ps(mn), _CMP_EQ_OQ));
        alignas(32) int32_t lane_idx[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lane_idx), idx);
        best = lane_idx[__builtin_ctz(uint32_t(eq))];
      }
    }
    return best;
  }
};
#endif

}  // namespace

GridIsa grid_isa_supported() {
#if VQ_GRID_X86
  static const GridIsa isa = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                     __builtin_cpu_supports("avx512vl")
                                 ? GridIsa::Avx512
                             : __builtin_cpu_supports("avx2")  ? GridIsa::Avx2
                                                               : GridIsa::Scalar;
  return isa;
#else
  return GridIsa::Scalar;
#endif
}

std::shared_ptr<const GridSearch> GridSearch::make(const float* codebook, int n_centroids, int sub_dim) {
  return from_grid(shared_candidate_grid(codebook, n_centroids, sub_dim), codebook, n_centroids);
}

std::shared_ptr<const GridSearch> GridSearch::from_grid(std::shared_ptr<const CandidateGrid> grid,
                                                        const float* codebook, int n_centroids) {
  if (!grid || grid->g == 0) return nullptr;
  auto gs = std::make_shared<GridSearch>();
  gs->grid_ = std::move(grid);
  gs->n_ = n_centroids;
  gs->kp_ = (n_centroids + kLanes - 1) / kLanes * kLanes;
  gs->cb_.assign(codebook, codebook + size_t(n_centroids) * 4);
  gs->cbt_.assign(size_t(4) * size_t(gs->kp_), 0.0f);
  for (int c = 0; c < n_centroids; ++c)
    for (int j = 0; j < 4; ++j) gs->cbt_[size_t(j) * size_t(gs->kp_) + size_t(c)] = codebook[size_t(c) * 4 + size_t(j)];
  return gs;
}

int64_t GridSearch::nbytes() const {
  return int64_t(grid_->cells.size() + grid_->lists.size()) * 4 + int64_t(cb_.size() + cbt_.size()) * 4;
}

void GridSearch::nearest(const float* x, int64_t n, int32_t* assign, GridIsa isa) const {
  VQ_CHECK_VALUE(int(isa) <= int(grid_isa_supported()),
                 "GridSearch::nearest: instruction set " << int(isa) << " is not supported by this CPU");
  const Loop L{*grid_, reinterpret_cast<const uint8_t*>(grid_->lists.data()), cb_.data(), cbt_.data(), size_t(kp_),
               grid_->index_bits == 16};
  std::vector<int64_t> scan;  // points that take the exact scan
#if VQ_GRID_X86
  // (the SIMD re-ranks are called once per point: a target-specific function is not inlined
  // into the shared batch loop; measured as fast as a loop written out per instruction set)
  if (isa == GridIsa::Avx512) run_points(L, x, n, assign, scan, RerankAvx512{L});
  else if (isa == GridIsa::Avx2) run_points(L, x, n, assign, scan, RerankAvx2{L});
  else nearest_scalar(L, x, n, n_, assign);
#else
  nearest_scalar(L, x, n, n_, assign);
#endif
  // The rest: one exact scan for all of them (detail::nearest_centroids: the oracle's answers).
  if (!scan.empty()) {
    std::vector<float> xs(scan.size() * 4);
    for (size_t k = 0; k < scan.size(); ++k) std::memcpy(&xs[4 * k], x + 4 * scan[k], 4 * sizeof(float));
    std::vector<int32_t> a(scan.size());
    nearest_centroids(xs.data(), int64_t(scan.size()), 4, cb_.data(), n_, a.data(), nullptr, 1);
    for (size_t k = 0; k < scan.size(); ++k) assign[scan[k]] = a[k];
  }
}

namespace {
std::atomic<int64_t> g_build_after{-1};
}

bool cpu_grid_wanted(const ProductQuantizer& pq) {
  return pq.sub_dim == 4 && pq.n_centroids > 1024 && pq.n_centroids <= kMaxGridCentroids;
}

int64_t cpu_grid_build_after() {
  const int64_t v = g_build_after.load();
  return v >= 0 ? v : int64_t(1) << 20;
}

int64_t set_cpu_grid_build_after(int64_t token_heads) { return g_build_after.exchange(token_heads); }

void pq_encode_grid(const ProductQuantizer& pq, const GridSearch& gs, const float* x, int64_t n, uint8_t* codes) {
  pq_check_ready(pq, "ProductQuantizer::encode (grid)");
  VQ_CHECK_VALUE(pq.sub_dim == 4 && gs.n_centroids() == pq.n_centroids,
                 "pq_encode_grid: the grid search was built for " << gs.n_centroids()
                                                                  << " centroids of sub_dim 4, the quantizer is d"
                                                                  << pq.sub_dim << "b" << pq.codebook_bits);
  VQ_CHECK_VALUE(n >= 0, "ProductQuantizer::encode (grid): n must be >= 0, got " << n);
  if (n == 0) return;
  const int64_t slab = std::max<int64_t>(1, 65536 / pq.n_sub);
  std::vector<int32_t> idx(size_t(std::min(n, slab) * pq.n_sub));
  for (int64_t r0 = 0; r0 < n; r0 += slab) {
    const int64_t rows = std::min(slab, n - r0);
    gs.nearest(x + r0 * pq.head_dim, rows * pq.n_sub, idx.data());
    pack_codes(reinterpret_cast<const uint32_t*>(idx.data()), rows, pq.n_sub, pq.codebook_bits,
               codes + r0 * pq.code_bytes);
  }
}

}  // namespace veloxquant::detail
