// bench/cpu/bench_pool.cpp — the cost of one ThreadPool::parallel_for handoff, against peers.
//
// CPU attention runs one or more parallel_for calls per decode step and layer, so a handoff's
// fixed cost adds to every step; on small contexts and small models it dominated (a 256-token
// decode spent 42% of its samples in futex wake-ups before the pool polled, 2026-12-04).
//
// Benchmarks (every call runs size() trivial tasks, one per thread):
//   pool/back_to_back   calls one after another: the workers are still polling
//   pool/after_pause    a 1 ms pause before each timed call: the workers have gone to sleep,
//                       so this is the sleep/wake round trip (manual timing of the call only)
//   openmp/back_to_back the peer: an OpenMP parallel region of the same width (libgomp also
//                       spins before it sleeps), when the compiler has OpenMP
//   spawn/join          the naive alternative: std::thread per task, joined
//   */busy_machine      back to back while size() other processes spin on the cores: the
//                       pool's caller runs the tasks itself rather than wait for a worker the
//                       OS has not scheduled
//
// Run: build/bench/bench_pool ; env VQ_BENCH_THREADS (default: all cores).
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "veloxquant/cache.h"
#include "veloxquant/thread_pool.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

using namespace veloxquant;

namespace {

int threads() {
  const char* s = std::getenv("VQ_BENCH_THREADS");
  const int n = s ? std::atoi(s) : 0;
  return n > 0 ? n : default_threads();
}

ThreadPool& pool() {
  static ThreadPool p(threads());
  return p;
}

std::atomic<int64_t> g_sink{0};

void BM_pool_back_to_back(benchmark::State& state) {
  ThreadPool& p = pool();
  for (auto _ : state)
    p.parallel_for(p.size(), [](int64_t t, int) { g_sink.fetch_add(t, std::memory_order_relaxed); });
  state.counters["threads"] = p.size();
}

void BM_pool_after_pause(benchmark::State& state) {
  ThreadPool& p = pool();
  for (auto _ : state) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto t0 = std::chrono::steady_clock::now();
    p.parallel_for(p.size(), [](int64_t t, int) { g_sink.fetch_add(t, std::memory_order_relaxed); });
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.counters["threads"] = p.size();
}

// size() processes that spin until destroyed: a machine busy with other programs. (Spinning
// threads of this process do not reproduce it: the scheduler treats them differently.)
struct BusyMachine {
  std::vector<pid_t> children;
  explicit BusyMachine(int n) {
    const pid_t parent = getpid();
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the bench, however that ends
        if (getppid() != parent) _exit(0);
        for (uint64_t x = 0;; ++x) asm volatile("" : : "r"(x));  // spin, not optimised away
      }
      if (pid > 0) children.push_back(pid);
    }
  }
  ~BusyMachine() {
    for (pid_t pid : children) kill(pid, SIGKILL);
    for (pid_t pid : children) waitpid(pid, nullptr, 0);
  }
};

void BM_pool_busy_machine(benchmark::State& state) {
  ThreadPool& p = pool();
  BusyMachine busy(p.size());
  for (auto _ : state)
    p.parallel_for(p.size(), [](int64_t t, int) { g_sink.fetch_add(t, std::memory_order_relaxed); });
  state.counters["threads"] = p.size();
}

#if defined(_OPENMP)
void BM_openmp_busy_machine(benchmark::State& state) {
  const int n = threads();
  BusyMachine busy(n);
  for (auto _ : state) {
#pragma omp parallel for num_threads(n) schedule(static)
    for (int t = 0; t < n; ++t) g_sink.fetch_add(t, std::memory_order_relaxed);
  }
  state.counters["threads"] = n;
}
#endif

#if defined(_OPENMP)
void BM_openmp_back_to_back(benchmark::State& state) {
  const int n = threads();
  for (auto _ : state) {
#pragma omp parallel for num_threads(n) schedule(static)
    for (int t = 0; t < n; ++t) g_sink.fetch_add(t, std::memory_order_relaxed);
  }
  state.counters["threads"] = n;
}
#endif

void BM_spawn_join(benchmark::State& state) {
  const int n = threads();
  for (auto _ : state) {
    std::vector<std::thread> ts;
    for (int t = 1; t < n; ++t) ts.emplace_back([t] { g_sink.fetch_add(t, std::memory_order_relaxed); });
    g_sink.fetch_add(0, std::memory_order_relaxed);
    for (auto& t : ts) t.join();
  }
  state.counters["threads"] = n;
}

}  // namespace

BENCHMARK(BM_pool_back_to_back)->Name("pool/back_to_back")->Repetitions(3)->ReportAggregatesOnly(true);
BENCHMARK(BM_pool_after_pause)
    ->Name("pool/after_pause")
    ->UseManualTime()
    ->Iterations(300)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);
#if defined(_OPENMP)
BENCHMARK(BM_openmp_back_to_back)->Name("openmp/back_to_back")->Repetitions(3)->ReportAggregatesOnly(true);
#endif
BENCHMARK(BM_spawn_join)->Name("spawn/join")->Repetitions(3)->ReportAggregatesOnly(true);
BENCHMARK(BM_pool_busy_machine)->Name("pool/busy_machine")->UseRealTime()->Repetitions(3)->ReportAggregatesOnly(true);
#if defined(_OPENMP)
BENCHMARK(BM_openmp_busy_machine)->Name("openmp/busy_machine")->UseRealTime()->Repetitions(3)->ReportAggregatesOnly(true);
#endif

BENCHMARK_MAIN();
