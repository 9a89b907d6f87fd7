// bench/cpu/bench_kmeans.cpp — veloxquant::kmeans_train against faiss::Clustering, same data,
// same run, same parameters (niter, seed, max_points_per_centroid, threads).
//
// Data: n sub-vectors of d dims from a heavy-tailed distribution with outliers (Student-t(3),
// per-dimension scales spread over 8×, 1% of points ×10) — what smoothed/rotated key
// sub-vectors look like. Both libraries run every iteration (veloxquant with tol = 0; faiss has
// no early stop). Both final inertias are computed by us on the full data with kmeans_assign,
// so they are comparable (faiss reports its own objective from inside its last iteration).
// veloxquant runs twice: with its default k-means++ initialisation, and with random distinct
// points (faiss's initialisation), which isolates the Lloyd engine in the comparison.
// Counters: inertia (full data), seconds (median over repetitions). After the run the program
// prints time and inertia ratios veloxquant / faiss per configuration.
//
// Run:  OMP_NUM_THREADS=2 ./bench_kmeans            (threads: VQ_BENCH_THREADS, default 2)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "veloxquant/kmeans.h"

#if defined(VQ_HAVE_FAISS)
#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>
#if defined(_OPENMP)
#include <omp.h>
#endif
#endif

namespace {

struct Config {
  const char* name;
  int64_t n;
  int d, k, niter;
};
// k=4096/d=8 uses 10 iterations to keep the whole program at a few minutes on 2 cores.
const Config kConfigs[] = {{"n65536_d4_k256", 65536, 4, 256, 30}, {"n163840_d8_k4096", 163840, 8, 4096, 10}};
constexpr int kMaxPointsPerCentroid = 256;
constexpr uint64_t kSeed = 1234;

int bench_threads() {
  const char* e = std::getenv("VQ_BENCH_THREADS");
  return e ? std::max(1, std::atoi(e)) : 2;
}

const std::vector<float>& data_for(const Config& c) {
  static std::map<std::string, std::vector<float>> cache;
  auto it = cache.find(c.name);
  if (it != cache.end()) return it->second;
  std::mt19937 g(7);
  std::student_t_distribution<float> td(3.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(size_t(c.n) * c.d);
  for (int64_t i = 0; i < c.n; ++i) {
    const float outlier = u(g) < 0.01f ? 10.0f : 1.0f;
    for (int j = 0; j < c.d; ++j) x[size_t(i) * c.d + j] = td(g) * (1.0f + 7.0f * float(j) / c.d) * outlier;
  }
  return cache.emplace(c.name, std::move(x)).first->second;
}

struct Outcome {
  std::vector<double> seconds;
  double inertia = 0;
};
std::map<std::string, Outcome> g_vq, g_vq_rand, g_faiss;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double full_inertia(const Config& c, const std::vector<float>& centroids) {
  const std::vector<float>& x = data_for(c);
  std::vector<int32_t> a(static_cast<size_t>(c.n));
  return veloxquant::kmeans_assign(x.data(), c.n, c.d, centroids.data(), c.k, a.data(), bench_threads());
}

void BM_veloxquant(benchmark::State& st, Config c, bool kmeanspp) {
  const std::vector<float>& x = data_for(c);
  veloxquant::KMeansParams p;
  p.kmeanspp_init = kmeanspp;
  p.niter = c.niter;
  p.tol = 0.0;
  p.seed = kSeed;
  p.max_points_per_centroid = kMaxPointsPerCentroid;
  p.n_threads = bench_threads();
  Outcome& out = (kmeanspp ? g_vq : g_vq_rand)[c.name];
  std::vector<float> centroids;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    veloxquant::KMeansResult r = veloxquant::kmeans_train(x.data(), c.n, c.d, c.k, p);
    out.seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    centroids = std::move(r.centroids);
  }
  out.inertia = full_inertia(c, centroids);
  st.counters["inertia"] = out.inertia;
  st.counters["median_s"] = median(out.seconds);
}

#if defined(VQ_HAVE_FAISS)
void BM_faiss(benchmark::State& st, Config c) {
  const std::vector<float>& x = data_for(c);
#if defined(_OPENMP)
  omp_set_num_threads(bench_threads());
#endif
  faiss::ClusteringParameters cp;
  cp.niter = c.niter;
  cp.seed = int(kSeed);
  cp.max_points_per_centroid = kMaxPointsPerCentroid;
  cp.verbose = false;
  Outcome& out = g_faiss[c.name];
  std::vector<float> centroids;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    faiss::Clustering clus(c.d, c.k, cp);
    faiss::IndexFlatL2 index(c.d);
    clus.train(size_t(c.n), x.data(), index);
    out.seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    centroids = clus.centroids;
  }
  out.inertia = full_inertia(c, centroids);
  st.counters["inertia"] = out.inertia;
  st.counters["median_s"] = median(out.seconds);
}
#endif

void register_all() {
  for (const Config& c : kConfigs) {
    const int reps = c.k >= 4096 ? 2 : 5;
    for (bool pp : {true, false})
      benchmark::RegisterBenchmark(
          (std::string(pp ? "veloxquant_kmeans/" : "veloxquant_kmeans_randinit/") + c.name).c_str(), BM_veloxquant,
          c, pp)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1)
          ->Repetitions(reps)
          ->ReportAggregatesOnly(true)
          ->UseRealTime();
#if defined(VQ_HAVE_FAISS)
    benchmark::RegisterBenchmark((std::string("faiss_kmeans/") + c.name).c_str(), BM_faiss, c)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1)
        ->Repetitions(reps)
        ->ReportAggregatesOnly(true)
        ->UseRealTime();
#endif
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\nk-means, %d threads, max_points_per_centroid %d, seed %llu (medians; inertia on the full data)\n",
              bench_threads(), kMaxPointsPerCentroid, (unsigned long long)kSeed);
  std::printf("%-18s %-9s %6s %10s %10s %14s %14s %8s %9s\n", "config", "vq_init", "niter", "vq_s", "faiss_s",
              "vq_inertia", "faiss_inertia", "time_x", "inertia_x");
  for (const Config& c : kConfigs) {
    auto f = g_faiss.find(c.name);
    for (int pp = 1; pp >= 0; --pp) {
      const auto& table = pp ? g_vq : g_vq_rand;
      auto v = table.find(c.name);
      if (v == table.end()) continue;
      const double vs = median(v->second.seconds);
      if (f == g_faiss.end()) {
        std::printf("%-18s %-9s %6d %10.4f %10s %14.6g %14s %8s %9s\n", c.name, pp ? "kmeans++" : "random",
                    c.niter, vs, "-", v->second.inertia, "-", "-", "-");
        continue;
      }
      const double fs = median(f->second.seconds);
      std::printf("%-18s %-9s %6d %10.4f %10.4f %14.6g %14.6g %8.3f %9.4f\n", c.name, pp ? "kmeans++" : "random",
                  c.niter, vs, fs, v->second.inertia, f->second.inertia, vs / fs,
                  v->second.inertia / f->second.inertia);
    }
  }
  std::printf("time_x = veloxquant seconds / faiss seconds (< 1: faster); inertia_x = veloxquant / faiss (< 1: better)\n");
#if !defined(VQ_HAVE_FAISS)
  std::printf("(built without faiss: no peer numbers)\n");
#endif
  return 0;
}
