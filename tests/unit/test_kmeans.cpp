// Tests of k-means training (src/core/kmeans.cpp) and assignment (src/cpu/pq_nearest.cpp).
// Tolerance tiers: exact for determinism (same seed → bit-identical centroids, any thread
// count) and for assignment (equals a brute-force argmin of the oracle distance);
// statistical for quality (recovering well-separated blobs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "core/pq_internal.h"
#include "veloxquant/error.h"
#include "veloxquant/kmeans.h"

using namespace veloxquant;

namespace {

// n points around `n_blobs` centres on a grid spaced `spacing` apart, unit-variance noise·sigma.
std::vector<float> blobs(int64_t n, int d, int n_blobs, float spacing, float sigma, uint32_t seed,
                         std::vector<float>* centres = nullptr) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> C(size_t(n_blobs) * d);
  for (int b = 0; b < n_blobs; ++b)
    for (int j = 0; j < d; ++j) C[size_t(b) * d + j] = spacing * float((b >> (2 * j)) & 3);  // 4 levels per dim
  std::vector<float> x(size_t(n) * d);
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) x[size_t(i) * d + j] = C[size_t(i % n_blobs) * d + j] + nd(g);
  if (centres) *centres = C;
  return x;
}

std::vector<float> heavy(int64_t n, int d, uint32_t seed) {
  std::mt19937 g(seed);
  std::student_t_distribution<float> td(2.5f);
  std::vector<float> x(size_t(n) * d);
  for (auto& v : x) v = td(g);
  return x;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no throw>";
}

}  // namespace

TEST(KMeans, DeterministicForASeedAndThreadCountIndependent) {
  const int64_t n = 6000;
  const int d = 4, k = 64;
  const uint32_t seed = 21;
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::vector<float> x = heavy(n, d, seed);
  KMeansParams p;
  p.niter = 10;
  p.n_threads = 1;
  const KMeansResult a = kmeans_train(x.data(), n, d, k, p);
  const KMeansResult b = kmeans_train(x.data(), n, d, k, p);
  p.n_threads = 2;
  const KMeansResult c = kmeans_train(x.data(), n, d, k, p);
  p.n_threads = 3;
  const KMeansResult e = kmeans_train(x.data(), n, d, k, p);
  EXPECT_EQ(a.centroids, b.centroids);
  EXPECT_EQ(a.centroids, c.centroids);
  EXPECT_EQ(a.centroids, e.centroids);
  EXPECT_EQ(a.inertia, c.inertia);
  ASSERT_EQ(a.iterations.size(), c.iterations.size());
  for (size_t i = 0; i < a.iterations.size(); ++i) EXPECT_EQ(a.iterations[i].inertia, c.iterations[i].inertia);
  p.seed = 22;
  const KMeansResult f = kmeans_train(x.data(), n, d, k, p);
  EXPECT_NE(a.centroids, f.centroids);
}

TEST(KMeans, InertiaNonIncreasingAndCallbackCalled) {
  const int64_t n = 8000;
  const int d = 8, k = 50;
  std::vector<float> x = heavy(n, d, 3);
  KMeansParams p;
  p.niter = 15;
  p.tol = 0;  // run all iterations
  int calls = 0;
  p.on_iteration = [&](const KMeansIterationStats& s) {
    EXPECT_EQ(s.iter, calls);
    ++calls;
  };
  const KMeansResult r = kmeans_train(x.data(), n, d, k, p);
  EXPECT_EQ(calls, 15);
  ASSERT_EQ(r.iterations.size(), 15u);
  for (size_t i = 1; i < r.iterations.size(); ++i) {
    // Lloyd never increases the objective; f32 centroids allow a few ulps of slack
    if (r.iterations[i - 1].n_reseeded == 0)
      EXPECT_LE(r.iterations[i].inertia, r.iterations[i - 1].inertia * (1 + 1e-6)) << "iteration " << i;
    EXPECT_GE(r.iterations[i].seconds, r.iterations[i - 1].seconds);
  }
  EXPECT_LE(r.inertia, r.iterations.back().inertia * (1 + 1e-6));
  EXPECT_LT(r.inertia, 0.9 * r.iterations.front().inertia);
  // the reported inertia is that of the returned centroids
  std::vector<int32_t> a(static_cast<size_t>(n));
  EXPECT_DOUBLE_EQ(kmeans_assign(x.data(), n, d, r.centroids.data(), k, a.data()), r.inertia);
}

TEST(KMeans, EarlyStopOnTolerance) {
  std::vector<float> x = blobs(4000, 2, 16, 10.0f, 0.1f, 9);
  KMeansParams p;
  p.niter = 30;
  p.tol = 1e-3;
  const KMeansResult r = kmeans_train(x.data(), 4000, 2, 16, p);
  EXPECT_LT(r.iterations.size(), 30u);
}

TEST(KMeans, RecoversSeparatedBlobs) {
  const int d = 3, n_blobs = 27;  // 3 dims × levels {0,1,2} used via the 4-level grid → distinct centres
  std::vector<float> centres;
  const int64_t n = 27 * 200;
  std::vector<float> x = blobs(n, d, n_blobs, 20.0f, 0.5f, 17, &centres);
  KMeansParams p;
  p.niter = 25;
  const KMeansResult r = kmeans_train(x.data(), n, d, n_blobs, p);
  // each true centre has a learned centroid within 0.5 (noise σ = 0.5, 200 points → mean error ~0.06)
  for (int b = 0; b < n_blobs; ++b) {
    double best = 1e30;
    for (int c = 0; c < n_blobs; ++c) {
      double s = 0;
      for (int j = 0; j < d; ++j) {
        const double t = double(r.centroids[size_t(c) * d + j]) - centres[size_t(b) * d + j];
        s += t * t;
      }
      best = std::min(best, s);
    }
    EXPECT_LT(std::sqrt(best), 0.5) << "blob " << b;
  }
  EXPECT_LT(r.inertia / double(n), 3 * 0.25 * 1.2);  // ≈ d·σ²
}

TEST(KMeans, EmptyClustersAreReseeded) {
  // 40 points but only 10 distinct values, k = 16: some clusters must go empty and be split
  std::vector<float> x;
  for (int i = 0; i < 40; ++i) {
    x.push_back(float(i % 10));
    x.push_back(float((i % 10) * (i % 10)));
  }
  KMeansParams p;
  p.niter = 8;
  p.kmeanspp_init = false;  // random points: duplicates guarantee coinciding initial centroids
  const KMeansResult r = kmeans_train(x.data(), 40, 2, 16, p);
  int reseeded = 0;
  for (const auto& s : r.iterations) reseeded += s.n_reseeded;
  EXPECT_GT(reseeded, 0);
  for (float v : r.centroids) EXPECT_TRUE(std::isfinite(v));
  // every distinct point ends up (numerically) on a centroid: inertia ≈ 0
  EXPECT_LT(r.inertia, 1e-3);
}

TEST(KMeans, SubsamplingRespected) {
  const int64_t n = 5000;
  const int d = 2, k = 10;
  std::vector<float> x = heavy(n, d, 4);
  KMeansParams p;
  p.niter = 3;
  p.max_points_per_centroid = 39;
  EXPECT_EQ(kmeans_train(x.data(), n, d, k, p).n_train, 390);
  p.max_points_per_centroid = 0;
  EXPECT_EQ(kmeans_train(x.data(), n, d, k, p).n_train, n);
  p.max_points_per_centroid = 1000;  // more than available → all
  EXPECT_EQ(kmeans_train(x.data(), n, d, k, p).n_train, n);
}

TEST(KMeans, Errors) {
  std::vector<float> x(100 * 4, 1.0f);
  std::string w = what_of([&] { kmeans_train(x.data(), 100, 4, 101); });
  EXPECT_NE(w.find("number of training points (100) should be at least as large as number of clusters (101)"),
            std::string::npos)
      << w;
  EXPECT_THROW(kmeans_train(x.data(), 100, 0, 4), ValueError);
  EXPECT_THROW(kmeans_train(x.data(), 100, 4, 0), ValueError);
  x[size_t(57 * 4 + 2)] = std::numeric_limits<float>::quiet_NaN();
  w = what_of([&] { kmeans_train(x.data(), 100, 4, 4); });
  EXPECT_NE(w.find("x[57][2] is nan"), std::string::npos) << w;
  x[size_t(57 * 4 + 2)] = -std::numeric_limits<float>::infinity();
  w = what_of([&] { kmeans_train(x.data(), 100, 4, 4); });
  EXPECT_NE(w.find("x[57][2] is inf"), std::string::npos) << w;
  std::vector<int32_t> a(100);
  EXPECT_THROW(kmeans_assign(x.data(), 100, 4, x.data(), 1, a.data()), ValueError);
}

TEST(KMeans, AssignEqualsBruteForceWithTiesToLowestIndex) {
  for (int d : {1, 3, 4, 8, 16, 17, 24}) {
    const int k = 37;
    const int64_t n = 301;
    const uint32_t seed = 100u + uint32_t(d);
    SCOPED_TRACE("d=" + std::to_string(d) + " seed=" + std::to_string(seed));
    std::vector<float> x = heavy(n, d, seed), c = heavy(k, d, seed + 1);
    for (int j = 0; j < d; ++j) c[size_t(5 * d + j)] = c[size_t(2 * d + j)];  // duplicate centroid 2 as 5
    for (int j = 0; j < d; ++j) x[size_t(j)] = c[size_t(2 * d + j)];           // point 0 on it → 2
    std::vector<int32_t> a(static_cast<size_t>(n)), a2(static_cast<size_t>(n));
    const double in1 = kmeans_assign(x.data(), n, d, c.data(), k, a.data(), 1);
    const double in2 = kmeans_assign(x.data(), n, d, c.data(), k, a2.data(), 2);
    EXPECT_EQ(a, a2);
    EXPECT_EQ(in1, in2);
    EXPECT_EQ(a[0], 2);
    double brute_in = 0;
    for (int64_t i = 0; i < n; ++i) {
      int best = 0;
      float bd = INFINITY;
      for (int cc = 0; cc < k; ++cc) {
        const float s = detail::pq_sub_distance_ref(x.data() + size_t(i) * d, c.data() + size_t(cc) * d, d);
        if (s < bd) {
          bd = s;
          best = cc;
        }
      }
      ASSERT_EQ(a[size_t(i)], best) << "point " << i;  // exact tier: the oracle distance's argmin
      brute_in += bd;
    }
    EXPECT_NEAR(in1, brute_in, 1e-5 * brute_in);
  }
}

TEST(KMeans, LargeKOnSmallDataIsQuick) {
  // k = 4096 (12-bit codebook) on 3·k points: must finish well within the suite budget.
  const int k = 4096, d = 4;
  const int64_t n = 3 * k;
  std::vector<float> x = heavy(n, d, 8);
  KMeansParams p;
  p.niter = 5;
  const KMeansResult r = kmeans_train(x.data(), n, d, k, p);
  EXPECT_EQ(r.centroids.size(), size_t(k) * d);
  std::set<std::vector<float>> distinct;
  for (int c = 0; c < k; ++c)
    distinct.insert(std::vector<float>(r.centroids.begin() + c * d, r.centroids.begin() + (c + 1) * d));
  EXPECT_GT(distinct.size(), size_t(k * 0.95));
}
