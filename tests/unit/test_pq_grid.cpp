// Tests of the candidate grid (src/core/pq_grid.cpp) against the encoder's oracle: the grid's
// answer must equal pq_encode_ref's code for every point (exact tier: the lists only narrow the
// oracle's own scan), on random and adversarial codebooks and points.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "common/pq_grid_cases.h"
#include "core/pq_grid.h"
#include "core/pq_internal.h"
#include "cpu/pq_grid_search.h"
#include "veloxquant/calibrate.h"
#include "veloxquant/pq.h"
#include "veloxquant/smooth.h"
#include "veloxquant/synthetic.h"

using namespace veloxquant;
using detail::CandidateGrid;
using vq_grid_cases::oracle;
using vq_grid_cases::points;

namespace {

struct Book {
  const char* name;
  std::vector<float> cb;
};

std::vector<Book> codebooks() {
  std::vector<Book> out;
  {
    ProductQuantizer pq(4, {4, 8});
    pq.set_random_codebook(7);
    out.push_back({"gaussian 256", pq.codebook});
  }
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  {  // clustered: 16 tight clusters of 16 (many near-equal distances inside a cluster)
    std::vector<float> cb;
    for (int k = 0; k < 16; ++k) {
      float m[4];
      for (float& v : m) v = 3.0f * nd(rng);
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 4; ++j) cb.push_back(m[j] + 0.01f * nd(rng));
    }
    out.push_back({"clustered", cb});
  }
  {  // a lattice: exact ties everywhere between neighbours
    std::vector<float> cb;
    for (int i = 0; i < 256; ++i)
      for (int j = 0; j < 4; ++j) cb.push_back(float((i >> (2 * j)) & 3) - 1.5f);
    out.push_back({"lattice 4^4", cb});
  }
  {  // duplicates, a flat dimension, 16 entries
    std::vector<float> cb;
    for (int i = 0; i < 16; ++i) {
      const int src = i % 5;  // entries 5.. repeat 0..4
      std::mt19937 r2(src);
      std::uniform_real_distribution<float> u2(-2.0f, 2.0f);
      cb.push_back(u2(r2)), cb.push_back(u2(r2)), cb.push_back(0.25f), cb.push_back(u2(r2));
    }
    out.push_back({"duplicates, flat dim", cb});
  }
  for (int bits : {10, 12}) {  // the 16-bit lists (codebooks of > 256 centroids)
    ProductQuantizer pq(4, {4, bits});
    pq.set_random_codebook(7 + uint64_t(bits));
    out.push_back({bits == 10 ? "gaussian 1024" : "gaussian 4096", pq.codebook});
  }
  {  // 4096 centroids on a sphere: every one on the hull, so a coarse grid's outer cells hold
     // more candidates than a cell word can count (those cells scan)
    std::vector<float> cb;
    for (int i = 0; i < 4096; ++i) {
      float v[4], r = 0;
      for (float& x : v) x = nd(rng), r += x * x;
      for (float x : v) cb.push_back(x / std::sqrt(r));
    }
    out.push_back({"sphere 4096", cb});
  }
  for (float scale : {1e-18f, 1e9f}) {
    std::vector<float> cb;
    for (int i = 0; i < 256 * 4; ++i) cb.push_back(scale * ud(rng));
    out.push_back({scale < 1 ? "tiny scale" : "huge scale", cb});
  }
  return out;
}

}  // namespace

TEST(PqGrid, EveryAnswerEqualsTheOracleOnRandomAndAdversarialInputs) {
  int cases = 0, isa_runs = 0, grids = 0;
  int scan_cells_sphere = 0;
  for (const Book& b : codebooks()) {
    const int n = int(b.cb.size() / 4);
    for (int g : n > 256 ? std::vector<int>{2, 7, 16} : std::vector<int>{2, 5, 8, 10}) {
      const CandidateGrid grid = detail::build_candidate_grid(b.cb.data(), n, 4, g);
      ASSERT_EQ(grid.g, g) << b.name;
      ++grids;
      ASSERT_EQ(grid.cells.size(), size_t(g) * g * g * g);
      ASSERT_EQ(grid.index_bits, n > 256 ? 16 : 8) << b.name;
      if (std::string(b.name) == "sphere 4096") scan_cells_sphere += grid.scan_cells;
      SCOPED_TRACE(std::string(b.name) + " g=" + std::to_string(g));
      int64_t mism = 0, with_cell = 0, cand = 0;
      for (const auto& x : points(b.cb, grid, uint32_t(g * 31 + n))) {
        const int want = oracle(b.cb, x.data()), got = detail::grid_nearest(grid, b.cb.data(), n, x.data());
        if (got != want && mism++ < 5)
          ADD_FAILURE() << "x = (" << x[0] << ", " << x[1] << ", " << x[2] << ", " << x[3] << "): grid " << got
                        << ", oracle " << want;
        const int cell = detail::candidate_cell(grid, x.data());
        if (cell >= 0) ++with_cell, cand += grid.cells[size_t(cell)] & 511u;
        ++cases;
      }
      EXPECT_EQ(mism, 0);
      EXPECT_GT(with_cell, 0);  // the grid path ran, not only the full scan
      // The CPU encoder's search through the same grid (pq_grid_search.cpp), all points in one
      // call, with every instruction set this CPU has (scalar, AVX2, AVX-512 re-ranks)
      const auto pts = points(b.cb, grid, uint32_t(g * 31 + n));
      std::vector<float> flat;
      for (const auto& x : pts) flat.insert(flat.end(), x.begin(), x.end());
      const auto gs = detail::GridSearch::from_grid(std::make_shared<CandidateGrid>(grid), b.cb.data(), n);
      ASSERT_TRUE(gs);
      for (int isa = 0; isa <= int(detail::grid_isa_supported()); ++isa) {
        std::vector<int32_t> got(pts.size(), -1);
        gs->nearest(flat.data(), int64_t(pts.size()), got.data(), detail::GridIsa(isa));
        int64_t bad = 0;
        for (size_t i = 0; i < pts.size(); ++i) {
          const int want = oracle(b.cb, pts[i].data());
          if (got[i] != want && bad++ < 5)
            ADD_FAILURE() << "CPU grid search, instruction set " << isa << ", x = (" << pts[i][0] << ", " << pts[i][1]
                          << ", " << pts[i][2] << ", " << pts[i][3] << "): " << got[i] << ", oracle " << want;
        }
        EXPECT_EQ(bad, 0) << "instruction set " << isa;
        ++isa_runs;
      }
      std::printf("[pq grid] %-22s g=%2d: %zu list words, mean %.1f candidates per cell (max %d, %d cells "
                  "without a list), %.1f per point with a listed cell\n",
                  b.name, g, grid.lists.size(), grid.mean_candidates, grid.max_candidates, grid.scan_cells,
                  with_cell ? double(cand) / double(with_cell) : 0.0);
    }
  }
  EXPECT_GT(cases, 100000);
  // every grid above, with every re-rank this CPU runs
  EXPECT_EQ(isa_runs, grids * (1 + int(detail::grid_isa_supported())));
  std::printf("[pq grid] CPU grid search: best instruction set here %d (0 scalar, 1 AVX2, 2 AVX-512)\n",
              int(detail::grid_isa_supported()));
  // the sphere's coarse grids have cells whose lists would overflow the count field: their
  // points took the full scan above, and answered as the oracle
  EXPECT_GT(scan_cells_sphere, 0);
}

TEST(PqGrid, NarrowsTheSearchOnGaussianData) {
  // What makes the grid worth it: on the bench's data (N(0,1) codebook and points) a point's
  // list holds a small fraction of the codebook.
  ProductQuantizer pq(4, {4, 8});
  pq.set_random_codebook(99 + 8);
  const CandidateGrid grid = detail::build_candidate_grid(pq.codebook.data(), 256, 4, 10);
  ASSERT_EQ(grid.g, 10);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  double cand = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    float x[4] = {nd(rng), nd(rng), nd(rng), nd(rng)};
    const int cell = detail::candidate_cell(grid, x);
    ASSERT_GE(cell, 0);
    cand += grid.cells[size_t(cell)] & 511u;
  }
  EXPECT_LT(cand / n, 32.0);  // 1/8 of the codebook (the simulation gave ~12)
  std::printf("[pq grid] N(0,1) codebook and points, g=10: %.1f candidates per point of 256\n", cand / n);
  // the defaults' d4b12 keys: 4096 centroids at the grid size the encoders use
  ProductQuantizer big(4, {4, 12});
  big.set_random_codebook(99 + 12);
  const auto bg = detail::shared_candidate_grid(big.codebook.data(), 4096, 4);
  ASSERT_TRUE(bg);
  ASSERT_EQ(bg->g, detail::default_grid_cells(4096));
  double cand_big = 0;
  for (int i = 0; i < n; ++i) {
    float x[4] = {nd(rng), nd(rng), nd(rng), nd(rng)};
    const int cell = detail::candidate_cell(*bg, x);
    ASSERT_GE(cell, 0);
    const uint32_t cnt = bg->cells[size_t(cell)] & 511u;
    cand_big += cnt ? cnt : 4096;
  }
  EXPECT_LT(cand_big / n, 64.0);  // 1/64 of the codebook (measured ~31)
  std::printf("[pq grid] N(0,1) codebook and points, g=%d: %.1f candidates per point of 4096 (%zu KB of cells and "
              "lists)\n",
              bg->g, cand_big / n, (bg->cells.size() + bg->lists.size()) * 4 / 1024);
}

TEST(PqGrid, NoGridWhereTheProofDoesNotHold) {
  std::vector<float> cb(16 * 4, 1.0f);
  EXPECT_EQ(detail::build_candidate_grid(cb.data(), 16, 4, 8).g, 0);  // every centroid equal
  cb[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(detail::build_candidate_grid(cb.data(), 16, 4, 8).g, 0);
  std::vector<float> cb8(16 * 8, 0.5f);
  cb8[3] = 2.0f;
  EXPECT_EQ(detail::build_candidate_grid(cb8.data(), 16, 8, 8).g, 0);  // sub_dim 8
  std::vector<float> big(8192 * 4);
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i % 7);
  EXPECT_EQ(detail::build_candidate_grid(big.data(), 8192, 4, 8).g, 0);  // > 4096 centroids
  EXPECT_EQ(detail::shared_candidate_grid(big.data(), 8192, 4), nullptr);
  std::vector<float> huge(16 * 4, 0.0f);
  huge[0] = 1e20f;
  EXPECT_EQ(detail::build_candidate_grid(huge.data(), 16, 4, 8).g, 0);
  // and a codebook without a grid still answers through the full scan
  const CandidateGrid none;
  const float x[4] = {0.2f, 0.4f, 0.6f, 0.8f};
  std::vector<float> ok = {0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_EQ(detail::grid_nearest(none, ok.data(), 2, x), 1);
}

TEST(PqGrid, SharedGridsAreBuiltOncePerDistinctCodebook) {
  ProductQuantizer a(4, {4, 8}), b(4, {4, 8});
  a.set_random_codebook(21);
  b.set_random_codebook(22);
  const auto ga = detail::shared_candidate_grid(a.codebook.data(), 256, 4);
  const auto ga2 = detail::shared_candidate_grid(a.codebook.data(), 256, 4);
  const auto gb = detail::shared_candidate_grid(b.codebook.data(), 256, 4);
  ASSERT_TRUE(ga && gb);
  EXPECT_EQ(ga.get(), ga2.get());  // the same codebook: the same grid object
  EXPECT_NE(ga.get(), gb.get());
  EXPECT_EQ(ga->g, detail::kDefaultGridCells);
  EXPECT_EQ(detail::shared_candidate_grid(a.codebook.data(), 256, 8), nullptr);  // sub_dim 8: none
}

TEST(PqGrid, ListsStayShortOnCalibratedSyntheticKV) {
  // The grid kernel's time follows the candidates per point (the longest lane of a warp sets the
  // pace). On the demo's synthetic KV with d4b8 codebooks calibrated on another sequence of the
  // same model: transformed keys and raw values (with their outlier channels).
  SyntheticKVConfig sc;
  sc.n_layers = 1;
  const SyntheticKVModel model(sc);
  const SyntheticSequence calib = model.generate(4096, 0, 1), eval = model.generate(2048, 0, 2);
  CalibrationParams cp;
  cp.key_spec = {4, 8}, cp.value_spec = {4, 8};
  cp.measure_untransformed = false;
  cp.niter = 10;
  const CalibrationResult res = calibrate(calib.kv, cp);
  const ArtifactLayer& al = res.artifact.layers[0];
  KeyTransform tf(sc.n_kv_heads, sc.head_dim, al.smooth_factors, true);
  const std::vector<float> kf = eval.kv.keys[0].to_vector_f32(), vf = eval.kv.values[0].to_vector_f32();
  const int64_t T = eval.kv.keys[0].dim(0);
  const int H = sc.n_kv_heads, D = sc.head_dim;
  for (int side = 0; side < 2; ++side) {
    const std::vector<float>& cbk = side == 0 ? al.key_codebook : al.value_codebook;
    const CandidateGrid grid = detail::build_candidate_grid(cbk.data(), 256, 4, detail::kDefaultGridCells);
    ASSERT_GT(grid.g, 0);
    double cand = 0;
    int64_t pts = 0, outside = 0;
    for (int h = 0; h < H; ++h) {
      std::vector<float> x(size_t(T) * D);
      for (int64_t t = 0; t < T; ++t)
        for (int d = 0; d < D; ++d) x[size_t(t * D + d)] = (side == 0 ? kf : vf)[size_t((t * H + h) * D + d)];
      if (side == 0) tf.forward_keys(x.data(), T, h);
      for (size_t i = 0; i + 4 <= x.size(); i += 4) {
        const int cell = detail::candidate_cell(grid, x.data() + i);
        outside += cell < 0;
        cand += cell < 0 ? 256 : (grid.cells[size_t(cell)] & 511u);
        ++pts;
        // and the answer is the oracle's
        if ((i / 4) % 97 == 0) ASSERT_EQ(detail::grid_nearest(grid, cbk.data(), 256, x.data() + i), oracle(cbk, x.data() + i));
      }
    }
    std::printf("[pq grid] calibrated synthetic %s: %.1f candidates per sub-vector of 256, %.4f%% outside the grid\n",
                side == 0 ? "keys (smoothed, rotated)" : "values (raw)", cand / double(pts), 100.0 * double(outside) / double(pts));
    EXPECT_LT(cand / double(pts), 32.0);  // an eighth of the codebook (measured: keys ~10, values ~17)
    EXPECT_LT(double(outside) / double(pts), 1e-3);
  }
}
