// bench/cpu/bench_decode.cpp — decode attention: VecInfer fused_sdpa on codes vs the fp16 cache.
//
// Shape (Llama-3.1-8B decode): batch 1, q_len 1, 32 query heads, 8 kv heads, head_dim 128,
// 32768 tokens. VecInfer: keys and values d4b8 (2 bits/element), memory-bound mode (codes +
// a 128-token fp16 window), codebooks k-means-trained on a sample of the same synthetic data.
// Peer: FP16KVCache::fused_sdpa (attention_cpu: F16C/AVX-512, GQA groups share each K/V read,
// chunked two-pass softmax on the same persistent thread pool size). Both caches are filled
// with the same 32768 tokens; both use the same number of threads.
//
// Benchmarks:
//   decode/fp16, decode/vecinfer   each alone (median over repetitions)
//   decode/paired                  alternates the two inside one loop and reports the median
//                                  time of each — the ratio least sensitive to other load on
//                                  a shared machine; the summary line uses it
//   decode/paired_cold             the same with the last-level cache flushed before every call
//                                  (all threads read a buffer twice the L3's size, at least 64 MiB,
//                                  untimed): a model's decode step attends layer after layer, so
//                                  each layer's cache comes from memory, not from L3 as in the
//                                  warm loop — which flatters whichever cache fits L3 (the fp16
//                                  one up to ~4096 tokens here, VecInfer's codes up to ~32768)
//   stream_read                    reads 256 MiB: the machine's practical read bandwidth, the
//                                  physical limit the memory-bound fp16 path runs against
// Counters: bytes held (nbytes), bytes read per call, achieved GB/s.
//
// Run: build-b/bench/bench_decode [--benchmark_filter=...] ; env VQ_BENCH_TOKENS, VQ_BENCH_THREADS,
// VQ_BENCH_KV_HEADS (default 8),
// VQ_BENCH_KEY_SPEC / VQ_BENCH_VALUE_SPEC (e.g. d4b12 / d8b8, the cache defaults; default d4b8).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "llc_flush.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/kmeans.h"
#include "veloxquant/vecinfer_cache.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

using namespace veloxquant;

namespace {

constexpr int kHeads = 32, kHeadDim = 128;
// kv heads: 8 (Llama-3.1-8B, GQA group 4) unless VQ_BENCH_KV_HEADS says otherwise (4: group 8,
// as Llama-3-70B's; 32: MHA)
int kKvHeads = 8;

int64_t env_int(const char* name, int64_t def) {
  const char* s = std::getenv(name);
  return s ? std::atoll(s) : def;
}

struct Setup {
  int64_t tokens = 0;
  int threads = 0;
  PQSpec kspec, vspec;
  std::unique_ptr<FP16KVCache> fp16;
  std::unique_ptr<VecInferKVCache> vq;
  Tensor q, out;
};

Setup& setup() {
  static Setup s = [] {
    Setup st;
    st.tokens = env_int("VQ_BENCH_TOKENS", 32768);
    kKvHeads = int(env_int("VQ_BENCH_KV_HEADS", 8));
    if (kKvHeads < 1 || kHeads % kKvHeads != 0) {
      std::fprintf(stderr, "VQ_BENCH_KV_HEADS=%d: must divide the %d query heads\n", kKvHeads, kHeads);
      std::exit(2);
    }
    st.threads = int(env_int("VQ_BENCH_THREADS", std::max(1u, std::thread::hardware_concurrency())));
    std::mt19937_64 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    // Codebooks: k-means on sub-vectors of the (transformed) synthetic keys / values.
    const char* ks = std::getenv("VQ_BENCH_KEY_SPEC");
    const char* vs = std::getenv("VQ_BENCH_VALUE_SPEC");
    st.kspec = ks ? PQSpec::parse(ks) : PQSpec{4, 8};
    st.vspec = vs ? PQSpec::parse(vs) : PQSpec{4, 8};
    KMeansParams kp;
    kp.niter = 10;
    kp.seed = 1;
    auto train = [&](PQSpec sp) {
      const int64_t n_train = std::max<int64_t>(65536, int64_t(16) << sp.codebook_bits);
      std::vector<float> sample(size_t(n_train) * size_t(sp.sub_dim));
      for (auto& x : sample) x = nd(rng);
      return kmeans_train(sample.data(), n_train, sp.sub_dim, 1 << sp.codebook_bits, kp);
    };
    const KMeansResult kc = train(st.kspec);
    const KMeansResult vc = train(st.vspec);

    KVCacheConfig c;
    c.kind = CacheKind::FP16;
    c.head_dim = kHeadDim;
    c.n_kv_heads = kKvHeads;
    c.n_threads = st.threads;
    st.fp16 = std::make_unique<FP16KVCache>(c);
    c.kind = CacheKind::VecInfer;
    c.key_codebook_bits = st.kspec.codebook_bits;
    c.key_sub_dim = st.kspec.sub_dim;
    c.value_codebook_bits = st.vspec.codebook_bits;
    c.value_sub_dim = st.vspec.sub_dim;
    c.key_codebook = kc.centroids;
    c.value_codebook = vc.centroids;
    c.fused_sdpa = true;
    c.fused_sdpa_memory_bound = true;
    c.residual_length = 128;
    st.vq = std::make_unique<VecInferKVCache>(c);

    const int64_t chunk = 4096;
    Tensor k = Tensor::empty({1, kKvHeads, chunk, kHeadDim}, DType::F16);
    Tensor v = Tensor::empty({1, kKvHeads, chunk, kHeadDim}, DType::F16);
    for (int64_t t0 = 0; t0 < st.tokens; t0 += chunk) {
      const int64_t n = std::min(chunk, st.tokens - t0);
      for (int64_t i = 0; i < k.numel(); ++i) k.ptr<uint16_t>()[i] = float_to_half(nd(rng));
      for (int64_t i = 0; i < v.numel(); ++i) v.ptr<uint16_t>()[i] = float_to_half(nd(rng));
      const TensorView kv(k.data(), DType::F16, {1, kKvHeads, n, kHeadDim},
                          {kKvHeads * chunk * kHeadDim, chunk * kHeadDim, kHeadDim, 1});
      const TensorView vv(v.data(), DType::F16, {1, kKvHeads, n, kHeadDim},
                          {kKvHeads * chunk * kHeadDim, chunk * kHeadDim, kHeadDim, 1});
      st.fp16->update(kv, vv);
      st.vq->update(kv, vv);
    }
    st.q = Tensor::empty({1, kHeads, 1, kHeadDim}, DType::F16);
    for (int64_t i = 0; i < st.q.numel(); ++i) st.q.ptr<uint16_t>()[i] = float_to_half(nd(rng));
    st.out = Tensor::empty({1, kHeads, 1, kHeadDim}, DType::F16);
    std::fprintf(stderr, "setup: %lld tokens, %d threads\n  %s\n  %s\n", (long long)st.tokens, st.threads,
                 st.fp16->describe().c_str(), st.vq->describe().c_str());
    return st;
  }();
  return s;
}

// Bytes one decode call reads from the cache (K and V of every token; the VecInfer window is
// fp16, the rest codes).
double fp16_bytes_read(const Setup& s) { return double(s.fp16->offset()) * kKvHeads * kHeadDim * 2 * 2; }
double vq_bytes_read(const Setup& s) {
  const double win = double(s.vq->residual_count());
  const double coded = double(s.vq->offset()) - win;
  return coded * kKvHeads * double(s.vq->key_quantizer().code_bytes + s.vq->value_quantizer().code_bytes) +
         win * kKvHeads * kHeadDim * 2 * 2;
}

void BM_fp16(benchmark::State& state) {
  Setup& s = setup();
  SdpaParams p;
  for (auto _ : state) {
    s.fp16->fused_sdpa_into(s.q.view(), s.out.view(), p);
    benchmark::ClobberMemory();
  }
  state.counters["bytes_held"] = double(s.fp16->nbytes());
  state.counters["GB/s"] = benchmark::Counter(fp16_bytes_read(s) * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

void BM_vecinfer(benchmark::State& state) {
  Setup& s = setup();
  SdpaParams p;
  for (auto _ : state) {
    s.vq->fused_sdpa_into(s.q.view(), s.out.view(), p);
    benchmark::ClobberMemory();
  }
  state.counters["bytes_held"] = double(s.vq->nbytes());
  state.counters["GB/s"] = benchmark::Counter(vq_bytes_read(s) * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

struct Paired {
  double fp16_s = 0, vq_s = 0;
} g_paired, g_paired_cold;

// The last-level cache flush (bench/common/llc_flush.h), one for the whole run.
void flush_llc(int threads) {
  static veloxquant::bench::LlcFlush flush(threads);
  flush();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void BM_paired(benchmark::State& state, bool cold) {
  Setup& s = setup();
  SdpaParams p;
  std::vector<double> tf, tv;
  using clk = std::chrono::steady_clock;
  auto flush_if_cold = [&] {
    if (!cold) return;
    state.PauseTiming();
    flush_llc(s.threads);
    state.ResumeTiming();
  };
  for (auto _ : state) {
    flush_if_cold();
    const auto t0 = clk::now();
    s.fp16->fused_sdpa_into(s.q.view(), s.out.view(), p);
    const auto t1 = clk::now();
    flush_if_cold();
    const auto t2 = clk::now();
    s.vq->fused_sdpa_into(s.q.view(), s.out.view(), p);
    const auto t3 = clk::now();
    tf.push_back(std::chrono::duration<double>(t1 - t0).count());
    tv.push_back(std::chrono::duration<double>(t3 - t2).count());
  }
  Paired& out = cold ? g_paired_cold : g_paired;
  out.fp16_s = median(tf);
  out.vq_s = median(tv);
  state.counters["fp16_ms"] = out.fp16_s * 1e3;
  state.counters["vecinfer_ms"] = out.vq_s * 1e3;
  state.counters["speedup"] = out.vq_s > 0 ? out.fp16_s / out.vq_s : 0.0;
  state.counters["bytes_ratio"] = double(s.fp16->nbytes()) / double(s.vq->nbytes());
}

// Reads a 256 MiB buffer with all threads: the practical read bandwidth of this machine.
void BM_stream_read(benchmark::State& state) {
  Setup& s = setup();
  const size_t n = size_t(256) << 20;
  static std::vector<uint8_t> buf(n, 1);
  for (auto _ : state) {
    std::vector<std::thread> th;
    std::vector<uint64_t> sums(size_t(s.threads));
    for (int t = 0; t < s.threads; ++t)
      th.emplace_back([&, t] {
        const size_t a = n * size_t(t) / size_t(s.threads), b = n * size_t(t + 1) / size_t(s.threads);
        uint64_t acc = 0;
#if defined(__AVX512F__)
        __m512i x = _mm512_setzero_si512();
        size_t i = a;
        for (; i + 64 <= b; i += 64) x = _mm512_add_epi64(x, _mm512_loadu_si512(buf.data() + i));
        acc = uint64_t(_mm512_reduce_add_epi64(x));
#else
        for (size_t i = a; i < b; i += 8) acc += *reinterpret_cast<const uint64_t*>(buf.data() + i);
#endif
        sums[size_t(t)] = acc;
      });
    for (auto& t : th) t.join();
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] = benchmark::Counter(double(n) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const std::string name = r.benchmark_name();
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name == "median") {
        median_ms[r.run_name.function_name] = r.GetAdjustedRealTime();  // in the benchmark's unit: ms
        auto it = r.counters.find("GB/s");
        if (it != r.counters.end()) gbs[r.run_name.function_name] = double(it->second);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> median_ms, gbs;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("decode/fp16", BM_fp16)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5)->Repetitions(5);
  benchmark::RegisterBenchmark("decode/vecinfer", BM_vecinfer)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5)->Repetitions(5);
  benchmark::RegisterBenchmark("decode/paired", BM_paired, false)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  benchmark::RegisterBenchmark("decode/paired_cold", BM_paired, true)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  benchmark::RegisterBenchmark("stream_read", BM_stream_read)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5)->Repetitions(3);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  setup();  // fill the caches before any timing
  SummaryReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  Setup& s = setup();
  const double bytes_ratio = double(s.fp16->nbytes()) / double(s.vq->nbytes());
  std::printf("\ndecode attention, batch 1, q_len 1, %d query heads, %d kv heads, head_dim %d, %lld tokens, %d threads\n",
              kHeads, kKvHeads, kHeadDim, (long long)s.tokens, s.threads);
  std::printf("  bytes held: fp16 %lld, vecinfer keys %s values %s memory-bound %lld -> %.2fx fewer (goal >= 6x)\n",
              (long long)s.fp16->nbytes(), s.kspec.str().c_str(), s.vspec.str().c_str(), (long long)s.vq->nbytes(),
              bytes_ratio);
  if (rep.median_ms.count("decode/fp16") && rep.median_ms.count("decode/vecinfer")) {
    const double f = rep.median_ms["decode/fp16"], v = rep.median_ms["decode/vecinfer"];
    std::printf("  separate runs (median): fp16 %.3f ms (%.1f GB/s), vecinfer %.3f ms (%.1f GB/s) -> %.2fx\n", f,
                rep.gbs["decode/fp16"], v, rep.gbs["decode/vecinfer"], f / v);
  }
  if (rep.median_ms.count("stream_read")) {
    std::printf("  stream read bandwidth (median): %.1f GB/s", rep.gbs["stream_read"]);
    if (rep.gbs.count("decode/fp16"))
      std::printf("; fp16 path at %.0f%% of it", 100.0 * rep.gbs["decode/fp16"] / std::max(1e-9, rep.gbs["stream_read"]));
    std::printf("\n");
  }
  if (g_paired.vq_s > 0)
    std::printf("SUMMARY paired medians: fp16 %.3f ms, vecinfer %.3f ms, speedup %.2fx (goal >= 1.5x), bytes held %.2fx fewer (goal >= 6x)\n",
                g_paired.fp16_s * 1e3, g_paired.vq_s * 1e3, g_paired.fp16_s / g_paired.vq_s, bytes_ratio);
  if (g_paired_cold.vq_s > 0)
    std::printf("SUMMARY paired medians, cold (L3 flushed before each call): fp16 %.3f ms, vecinfer %.3f ms, speedup %.2fx\n",
                g_paired_cold.fp16_s * 1e3, g_paired_cold.vq_s * 1e3, g_paired_cold.fp16_s / g_paired_cold.vq_s);
  return 0;
}
