// veloxquant/kmeans.h — k-means codebook training (the faiss Clustering shape).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace veloxquant {

/// Statistics of one Lloyd iteration.
struct KMeansIterationStats {
  int iter = 0;          ///< 0-based
  double inertia = 0;    ///< sum of squared distances to the assigned centroid
  double seconds = 0;    ///< wall time since training started
  int n_reseeded = 0;    ///< empty clusters re-seeded (split from the largest) this iteration
};

struct KMeansParams {
  int niter = 30;                    ///< at most this many Lloyd iterations
  double tol = 1e-4;                 ///< stop when relative inertia change < tol
  uint64_t seed = 1234;              ///< everything is deterministic for a seed
  int max_points_per_centroid = 256; ///< subsample to k·this points (0: use all)
  int n_threads = 0;                 ///< 0: hardware concurrency
  bool kmeanspp_init = true;         ///< k-means++ seeding; false: random distinct points
  /// Called after every iteration (progress bars); may be empty.
  std::function<void(const KMeansIterationStats&)> on_iteration;
};

struct KMeansResult {
  std::vector<float> centroids;  ///< [k, d]
  double inertia = 0;            ///< final, on the training points used
  int64_t n_train = 0;           ///< points used after subsampling
  std::vector<KMeansIterationStats> iterations;
};

/// Trains k centroids of dimension d on x [n, d] (f32, row-major).
/// Throws ValueError when n < k, d < 1, k < 1, or x has a non-finite value (naming the index).
KMeansResult kmeans_train(const float* x, int64_t n, int d, int k, const KMeansParams& params = {});

/// Index of the nearest centroid for each point (ties to the lowest index), and the inertia.
/// @param x [n, d]  @param centroids [k, d]  @param assign [n]
double kmeans_assign(const float* x, int64_t n, int d, const float* centroids, int k,
                     int32_t* assign, int n_threads = 0);

}  // namespace veloxquant
