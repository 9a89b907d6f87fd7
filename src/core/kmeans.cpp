// src/core/kmeans.cpp — k-means codebook training (Lloyd), the faiss Clustering shape.
//
// Input x [n, d] f32 row-major; output centroids [k, d]. Steps:
//  1. Validation (before any allocation): d >= 1, k >= 1, n >= k, every x finite (the first
//     offender is named: "x[1234][2] is nan").
//  2. Subsampling: when max_points_per_centroid > 0 and n > k·max_points_per_centroid, a seeded
//     random subset of k·max_points_per_centroid distinct points is trained on (n_train).
//  3. Initialisation: k-means++ (D² sampling) on a seeded subsample of the training points of
//     n_pp = min(n_train, max(2k, 2^29 / (k·d))) points, which bounds its sequential
//     O(k·n_pp·d) cost to ~0.5 G multiply-adds; when even 2k points would exceed four times
//     that (2k²d > 2^31, e.g. k = 65536), or when kmeanspp_init is false, the centroids are k
//     distinct random training points (faiss's default initialisation).
//  4. Lloyd iterations (at most niter): assign every training point to its nearest centroid
//     (detail::nearest_centroids: exact, SIMD, threaded over points), record the inertia, move
//     each centroid to the mean of its points (sums in double, in point order), re-seed empty
//     clusters by splitting the largest cluster (faiss style: the empty centroid becomes a copy
//     of the largest one, the two pushed apart by a small symmetric perturbation, the count
//     halved so several empty clusters split different clusters), and stop early once the
//     relative inertia change falls below tol. (No re-seeding after the last iteration.)
//  5. A final assignment gives the inertia of the returned centroids (KMeansResult::inertia).
// Determinism: every random choice comes from one splitmix64 stream seeded by params.seed;
// assignment is exact per point and all reductions run in point order on one thread, so the
// centroids are bit-identical for a seed whatever n_threads is.
#include "veloxquant/kmeans.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/pq_internal.h"
#include "veloxquant/error.h"

namespace veloxquant {

namespace {

struct SplitMix64 {
  uint64_t s;
  explicit SplitMix64(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }  // bias < n/2^64: negligible
};

// The first `m` entries of a seeded random permutation of [0, n) (partial Fisher–Yates).
std::vector<int64_t> sample_indices(int64_t n, int64_t m, SplitMix64& rng) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t(0));
  for (int64_t i = 0; i < m; ++i) std::swap(perm[size_t(i)], perm[size_t(i + rng.below(n - i))]);
  perm.resize(size_t(m));
  return perm;
}

void check_finite(const float* x, int64_t n, int d, const char* what) {
  const int64_t total = n * int64_t(d);
  uint32_t bad = 0;  // exponent all ones ⇔ inf or nan; written on the bits so it vectorises
  for (int64_t i = 0; i < total; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    bad |= uint32_t((u & 0x7F800000u) == 0x7F800000u);
  }
  if (!bad) return;
  for (int64_t i = 0; i < total; ++i)
    if (!std::isfinite(x[i]))
      VQ_THROW(ValueError, what << ": x[" << i / d << "][" << i % d << "] is " << (std::isnan(x[i]) ? "nan" : "inf")
                                << ": training data must be finite");
}

inline float sq_dist(const float* a, const float* b, int d) {
  float s = 0.0f;
  for (int j = 0; j < d; ++j) {
    const float t = a[j] - b[j];
    s += t * t;
  }
  return s;
}

// k-means++ on points xs [m, d]; writes k centroids.
void kmeanspp(const float* xs, int64_t m, int d, int k, SplitMix64& rng, float* centroids) {
  // SoA copy so the per-step distance update vectorises over points.
  std::vector<float> xT(size_t(m) * d);
  for (int64_t i = 0; i < m; ++i)
    for (int j = 0; j < d; ++j) xT[size_t(j) * m + i] = xs[i * d + j];
  std::vector<float> dmin(static_cast<size_t>(m), INFINITY);
  int64_t pick = rng.below(m);
  for (int c = 0;; ++c) {
    std::memcpy(centroids + size_t(c) * d, xs + pick * d, sizeof(float) * d);
    if (c + 1 == k) break;
    const float* cc = centroids + size_t(c) * d;
    std::vector<float> acc(static_cast<size_t>(m), 0.0f);
    for (int j = 0; j < d; ++j) {
      const float cj = cc[j];
      const float* col = xT.data() + size_t(j) * m;
      float* a = acc.data();
      for (int64_t i = 0; i < m; ++i) {
        const float t = col[i] - cj;
        a[i] += t * t;
      }
    }
    double total = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      dmin[size_t(i)] = std::min(dmin[size_t(i)], acc[size_t(i)]);
      total += dmin[size_t(i)];
    }
    if (!(total > 0.0)) {  // every point coincides with a chosen centroid: pick uniformly
      pick = rng.below(m);
      continue;
    }
    const double target = rng.uniform() * total;
    double run = 0.0;
    pick = m - 1;
    for (int64_t i = 0; i < m; ++i) {
      run += dmin[size_t(i)];
      if (run > target) {
        pick = i;
        break;
      }
    }
    while (pick > 0 && dmin[size_t(pick)] == 0.0f) --pick;  // never a zero-weight point
  }
}

}  // namespace

double kmeans_assign(const float* x, int64_t n, int d, const float* centroids, int k, int32_t* assign,
                     int n_threads) {
  VQ_CHECK_VALUE(d >= 1, "kmeans_assign: d must be >= 1, got " << d);
  VQ_CHECK_VALUE(k >= 1, "kmeans_assign: k must be >= 1, got " << k);
  VQ_CHECK_VALUE(n >= 0, "kmeans_assign: n must be >= 0, got " << n);
  if (n == 0) return 0.0;
  check_finite(x, n, d, "kmeans_assign");
  check_finite(centroids, k, d, "kmeans_assign (centroids)");
  std::vector<float> dist(static_cast<size_t>(n));
  detail::nearest_centroids(x, n, d, centroids, k, assign, dist.data(), n_threads);
  double inertia = 0.0;
  for (int64_t i = 0; i < n; ++i) inertia += dist[size_t(i)];
  return inertia;
}

KMeansResult kmeans_train(const float* x, int64_t n, int d, int k, const KMeansParams& params) {
  VQ_CHECK_VALUE(d >= 1, "kmeans: dimension d must be >= 1, got " << d);
  VQ_CHECK_VALUE(k >= 1, "kmeans: number of clusters k must be >= 1, got " << k);
  VQ_CHECK_VALUE(n >= k, "kmeans: number of training points (" << n
                                                               << ") should be at least as large as number of clusters ("
                                                               << k << ")");
  VQ_CHECK_VALUE(x != nullptr, "kmeans: x is null");
  VQ_CHECK_VALUE(params.niter >= 0, "kmeans: niter must be >= 0, got " << params.niter);
  VQ_CHECK_VALUE(params.tol >= 0.0, "kmeans: tol must be >= 0, got " << params.tol);
  VQ_CHECK_VALUE(params.max_points_per_centroid >= 0,
                 "kmeans: max_points_per_centroid must be >= 0, got " << params.max_points_per_centroid);
  check_finite(x, n, d, "kmeans");

  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&]() { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  SplitMix64 rng(params.seed);

  // 2. subsample
  KMeansResult res;
  std::vector<float> sub;
  const float* xt = x;
  int64_t nt = n;
  const int64_t cap = params.max_points_per_centroid > 0 ? int64_t(k) * params.max_points_per_centroid : n;
  if (n > cap) {
    std::vector<int64_t> idx = sample_indices(n, cap, rng);
    std::sort(idx.begin(), idx.end());  // keep the data's order: cache-friendlier, same set
    sub.resize(size_t(cap) * d);
    for (int64_t i = 0; i < cap; ++i) std::memcpy(sub.data() + size_t(i) * d, x + idx[size_t(i)] * d, sizeof(float) * d);
    xt = sub.data();
    nt = cap;
  }
  res.n_train = nt;

  // 3. initialisation
  std::vector<float>& C = res.centroids;  // [k, d]
  C.assign(size_t(k) * d, 0.0f);
  const double kBudget = double(int64_t(1) << 29);
  const bool pp = params.kmeanspp_init && k > 1 && 2.0 * k * double(k) * d <= 4.0 * kBudget;
  if (pp) {
    const int64_t want = std::max<int64_t>(2 * int64_t(k), int64_t(kBudget / (double(k) * d)));
    const int64_t m = std::min(nt, want);
    if (m < nt) {
      std::vector<int64_t> idx = sample_indices(nt, m, rng);
      std::vector<float> xs(size_t(m) * d);
      for (int64_t i = 0; i < m; ++i) std::memcpy(xs.data() + size_t(i) * d, xt + idx[size_t(i)] * d, sizeof(float) * d);
      kmeanspp(xs.data(), m, d, k, rng, C.data());
    } else {
      kmeanspp(xt, nt, d, k, rng, C.data());
    }
  } else {
    std::vector<int64_t> idx = sample_indices(nt, k, rng);
    for (int c = 0; c < k; ++c) std::memcpy(C.data() + size_t(c) * d, xt + idx[size_t(c)] * d, sizeof(float) * d);
  }

  // 4. Lloyd
  std::vector<int32_t> assign(static_cast<size_t>(nt));
  std::vector<float> dist(static_cast<size_t>(nt));
  std::vector<double> sums(size_t(k) * d);
  std::vector<int64_t> counts(static_cast<size_t>(k));
  double prev = 0.0;
  auto assign_all = [&]() {
    detail::nearest_centroids(xt, nt, d, C.data(), k, assign.data(), dist.data(), params.n_threads);
    double in = 0.0;
    for (int64_t i = 0; i < nt; ++i) in += dist[size_t(i)];
    return in;
  };
  for (int it = 0; it < params.niter; ++it) {
    const double inertia = assign_all();
    // update: means in double, points in order
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(counts.begin(), counts.end(), int64_t(0));
    for (int64_t i = 0; i < nt; ++i) {
      const int32_t c = assign[size_t(i)];
      ++counts[size_t(c)];
      double* s = sums.data() + size_t(c) * d;
      const float* p = xt + i * d;
      for (int j = 0; j < d; ++j) s[j] += p[j];
    }
    for (int c = 0; c < k; ++c) {
      if (counts[size_t(c)] == 0) continue;
      const double inv = 1.0 / double(counts[size_t(c)]);
      for (int j = 0; j < d; ++j) C[size_t(c) * d + j] = float(sums[size_t(c) * d + j] * inv);
    }
    // empty clusters: split the currently largest cluster (ties → lowest index). Not after the
    // last iteration: no assignment would use the new centroid, and the push would only move
    // the largest cluster's centroid off its mean (an empty cluster keeps its old centroid).
    int n_reseeded = 0;
    for (int c = 0; c < k && it + 1 < params.niter; ++c) {
      if (counts[size_t(c)] != 0) continue;
      const int big = int(std::max_element(counts.begin(), counts.end()) - counts.begin());
      float* ce = C.data() + size_t(c) * d;
      float* cb = C.data() + size_t(big) * d;
      for (int j = 0; j < d; ++j) {
        // symmetric push, relative to the coordinate (with a floor for zeros), sign alternating
        const float delta = 1.0f / 1024.0f * (std::fabs(cb[j]) + 1e-3f) * ((j & 1) ? -1.0f : 1.0f);
        const float base = cb[j];
        ce[j] = base + delta;
        cb[j] = base - delta;
      }
      counts[size_t(c)] = counts[size_t(big)] / 2;
      counts[size_t(big)] -= counts[size_t(c)];
      ++n_reseeded;
    }
    KMeansIterationStats st;
    st.iter = it;
    st.inertia = inertia;
    st.seconds = seconds();
    st.n_reseeded = n_reseeded;
    res.iterations.push_back(st);
    if (params.on_iteration) params.on_iteration(st);
    const bool converged = it > 0 && n_reseeded == 0 && (prev <= 0.0 || std::fabs(prev - inertia) / prev < params.tol);
    prev = inertia;
    if (converged) break;
  }
  // 5. final inertia of the returned centroids
  res.inertia = assign_all();
  return res;
}

}  // namespace veloxquant
