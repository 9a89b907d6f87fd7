// bench/cpu/bench_encode.cpp — key encode throughput: KeyTransform forward (1/λ scaling +
// Hadamard) + nearest-centroid encode + bit packing, for d4b8 and d4b12 at head_dim 128.
//
// Data: calibration-like keys [n_tokens, n_kv_heads = 8, head_dim = 128], Student-t(3) with
// a few outlier channels (×20), λ from compute_smooth_factors, a codebook trained by
// kmeans_train on the transformed sub-vectors (so near-tie frequency is realistic). Each
// benchmark iteration encodes every (token, head) once; the counter `token_heads_per_s` is the
// throughput. The peer is the scalar oracle (pq_encode_ref) on the same data in the same run;
// the program prints the speed-up over it at the end. Times are wall-clock (UseRealTime), so on
// a machine shared with other work the multi-thread figure only shows what was left over; the
// per-CPU-second columns (process CPU time, all threads) are the load-independent view.
//
// The candidate-grid search (src/cpu/pq_grid_search.h, what the CPU caches switch to for
// codebooks of > 1024 centroids) runs on the same data, one thread, against the scan of the same
// run; its one-time build is timed apart and printed.
//
// Run:  ./bench_encode      (threads: 1 and hardware concurrency)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/pq_grid_search.h"
#include "veloxquant/kmeans.h"
#include "veloxquant/pq.h"
#include "veloxquant/smooth.h"
#include "veloxquant/tensor.h"

using namespace veloxquant;

namespace {

constexpr int kHeads = 8, kHeadDim = 128;

struct Setup {
  int64_t n_tokens = 0;
  std::vector<float> keys;  // [n_tokens, kHeads, kHeadDim]
  KeyTransform kt;
  ProductQuantizer pq;
  std::shared_ptr<const detail::GridSearch> grid;  // null where the codebook has none
  double grid_build_ms = 0;
};

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::vector<float> make_keys(int64_t n_tokens, uint32_t seed) {
  std::mt19937 g(seed);
  std::student_t_distribution<float> td(3.0f);
  std::vector<float> k(size_t(n_tokens) * kHeads * kHeadDim);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int h = 0; h < kHeads; ++h)
      for (int c = 0; c < kHeadDim; ++c) {
        const float scale = (c % 37 == 3) ? 20.0f : 1.0f + 0.02f * c;  // outlier channels
        k[size_t((t * kHeads + h) * kHeadDim + c)] = td(g) * scale;
      }
  return k;
}

const Setup& setup_for(int bits) {
  static std::map<int, Setup> cache;
  auto it = cache.find(bits);
  if (it != cache.end()) return it->second;
  Setup s;
  s.n_tokens = 512;
  // calibration on separate keys
  const int64_t n_cal = 2048;
  std::vector<float> cal = make_keys(n_cal, 1);
  const std::vector<float> lambda = compute_smooth_factors(TensorView(cal.data(), DType::F32, {n_cal, kHeads, kHeadDim}));
  s.kt = KeyTransform(kHeads, kHeadDim, lambda);
  std::vector<float> tr(cal.size());  // transformed, head-major [kHeads, n_cal, kHeadDim]
  for (int h = 0; h < kHeads; ++h) {
    float* dst = tr.data() + size_t(h) * n_cal * kHeadDim;
    for (int64_t t = 0; t < n_cal; ++t)
      std::memcpy(dst + t * kHeadDim, cal.data() + size_t((t * kHeads + h) * kHeadDim), sizeof(float) * kHeadDim);
    s.kt.forward_keys(dst, n_cal, h);
  }
  s.pq = ProductQuantizer(kHeadDim, {4, bits});
  KMeansParams kp;
  kp.niter = 8;
  kp.max_points_per_centroid = 64;
  const KMeansResult r = kmeans_train(tr.data(), int64_t(tr.size() / 4), 4, 1 << bits, kp);
  s.pq.set_codebook(r.centroids);
  s.keys = make_keys(s.n_tokens, 2);
  const auto t0 = std::chrono::steady_clock::now();
  s.grid = detail::GridSearch::make(s.pq.codebook.data(), s.pq.n_centroids, s.pq.sub_dim);
  s.grid_build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return cache.emplace(bits, std::move(s)).first->second;
}

// One pass over all (token, head): gather the head's rows, transform, encode (+ pack).
enum class How { Ref, Scan, Grid };
void BM_encode(benchmark::State& st, int bits, How how, int n_threads) {
  const Setup& s = setup_for(bits);
  const bool use_ref = how == How::Ref;
  if (how == How::Grid && !s.grid) {
    st.SkipWithError("no candidate grid for this codebook");
    return;
  }
  const int64_t T = use_ref ? std::min<int64_t>(s.n_tokens, bits >= 12 ? 16 : 128) : s.n_tokens;
  std::vector<float> rows(size_t(T) * kHeadDim);
  std::vector<uint8_t> codes(size_t(T) * s.pq.code_bytes * kHeads);
  const double cpu0 = process_cpu_seconds();
  for (auto _ : st) {
    for (int h = 0; h < kHeads; ++h) {
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(rows.data() + t * kHeadDim, s.keys.data() + size_t((t * kHeads + h) * kHeadDim),
                    sizeof(float) * kHeadDim);
      s.kt.forward_keys(rows.data(), T, h);
      uint8_t* out = codes.data() + size_t(h) * T * s.pq.code_bytes;
      if (use_ref) pq_encode_ref(s.pq, rows.data(), T, out);
      else if (how == How::Grid) detail::pq_encode_grid(s.pq, *s.grid, rows.data(), T, out);
      else s.pq.encode(rows.data(), T, out, n_threads);
    }
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  const double token_heads = double(st.iterations()) * double(T) * kHeads;
  st.counters["token_heads_per_s"] = benchmark::Counter(token_heads, benchmark::Counter::kIsRate);
  // per CPU-second of the whole process (all threads): meaningful on a shared machine
  st.counters["per_cpu_s"] = token_heads / std::max(1e-9, process_cpu_seconds() - cpu0);
  st.SetItemsProcessed(int64_t(token_heads));
}

// Console output plus the token_heads_per_s of every run, for the summary table.
class RateReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      auto it = r.counters.find("token_heads_per_s");
      if (it != r.counters.end() && r.run_type == Run::RT_Iteration) rates[r.benchmark_name()] = double(it->second);
      auto ic = r.counters.find("per_cpu_s");
      if (ic != r.counters.end() && r.run_type == Run::RT_Iteration) cpu_rates[r.benchmark_name()] = double(ic->second);
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> rates, cpu_rates;
};

}  // namespace

int main(int argc, char** argv) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int bits : {8, 10, 12}) {
    for (int th : {1, hw}) {
      const std::string n = "encode_keys/d4b" + std::to_string(bits) + "/fast/threads:" + std::to_string(th);
      benchmark::RegisterBenchmark(n.c_str(), BM_encode, bits, How::Scan, th)->UseRealTime()->MinTime(0.5);
      if (hw == 1) break;
    }
    const std::string gname = "encode_keys/d4b" + std::to_string(bits) + "/grid/threads:1";
    benchmark::RegisterBenchmark(gname.c_str(), BM_encode, bits, How::Grid, 1)->UseRealTime()->MinTime(0.5);
    const std::string r = "encode_keys/d4b" + std::to_string(bits) + "/ref/threads:1";
    benchmark::RegisterBenchmark(r.c_str(), BM_encode, bits, How::Ref, 1)->UseRealTime()->MinTime(0.5);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RateReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  std::printf("\nkey encode (KeyTransform + encode + pack), head_dim %d, %d kv heads; token-heads per second\n",
              kHeadDim, kHeads);
  std::printf("%-8s %14s %14s %14s %10s %4s %16s %16s %16s %14s %10s %10s\n", "spec", "ref_t1", "fast_t1", "fast_tN",
              "x_ref_t1", "N", "ref_t1/cpu_s", "fast_t1/cpu_s", "fast_tN/cpu_s", "grid_t1", "x_fast_t1", "build_ms");
  for (int bits : {8, 10, 12}) {
    const std::string b = "encode_keys/d4b" + std::to_string(bits);
    auto get = [&](const std::map<std::string, double>& m, const std::string& k) {
      for (auto& [name, v] : m)
        if (name.rfind(k, 0) == 0) return v;
      return 0.0;
    };
    const std::string kr = b + "/ref/threads:1", k1 = b + "/fast/threads:1", kn = b + "/fast/threads:" + std::to_string(hw);
    const double ref = get(rep.rates, kr), f1 = get(rep.rates, k1), fn = get(rep.rates, kn);
    const double gr = get(rep.rates, b + "/grid/threads:1");
    std::printf("d4b%-5d %14.0f %14.0f %14.0f %10.1f %4d %16.0f %16.0f %16.0f %14.0f %10.2f %10.0f\n", bits, ref, f1, fn,
                ref > 0 ? f1 / ref : 0.0, hw, get(rep.cpu_rates, kr), get(rep.cpu_rates, k1), get(rep.cpu_rates, kn), gr,
                f1 > 0 ? gr / f1 : 0.0, setup_for(bits).grid_build_ms);
  }
  std::printf("grid_t1: the candidate-grid search, one thread (instruction set %d: 0 scalar, 1 AVX2, 2 AVX-512);"
              " x_fast_t1: over the scan's fast_t1 of this run; build_ms: its one-time build (the CPU caches build it"
              " for > 1024 centroids after 2^20 token-heads)\n",
              int(detail::grid_isa_supported()));
  return 0;
}
