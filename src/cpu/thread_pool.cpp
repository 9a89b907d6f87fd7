// src/cpu/thread_pool.cpp — the persistent pool behind CPU attention and the caches.
//
// size()−1 worker threads wait for a job; parallel_for publishes one (the function, the task
// count, an atomic next-task counter), wakes them, and works on tasks itself as worker 0.
// Workers grab task indices with fetch_add until none are left, then the last one to finish
// signals the caller. A generation counter tells workers a new job exists.
//
// Waiting spins before it sleeps. A condition-variable round trip (the caller's notify, a
// sleeping worker scheduled again, its "done" waking the caller) cost 64 us per parallel_for
// on the 2-core CI machine (a VM; measured 2026-12-04), more than a decode step's query setup
// or a short context's whole attention. So a worker polls the generation for up to
// kSpinMicros after each job before it sleeps, and the caller polls `active` as long before
// it sleeps on `done`: back-to-back calls (layer after layer) find the workers awake. The poll
// yields the CPU every 64 checks, so a spinning worker of one idle pool (each cache may own
// one) gives way to runnable threads of another.
#include "veloxquant/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "veloxquant/cache.h"
#include "veloxquant/error.h"

namespace veloxquant {

namespace {
thread_local bool t_in_pool_task = false;  // set while this thread runs a pool task

constexpr int kSpinMicros = 100;  // how long a waiter polls before it sleeps

// Polls ready() for up to kSpinMicros (yielding every 64 polls); true once it held.
template <typename F>
bool spin_until(F&& ready) {
  using clock = std::chrono::steady_clock;
  const auto end = clock::now() + std::chrono::microseconds(kSpinMicros);
  for (int i = 1;; ++i) {
    if (ready()) return true;
    if (i % 64 == 0) {
      if (clock::now() >= end) return ready();
      std::this_thread::yield();
    }
  }
}
}  // namespace

struct ThreadPool::Impl {
  std::vector<std::thread> threads;
  std::mutex call_mutex;  // serialises parallel_for calls

  std::mutex m;
  std::condition_variable wake;  // workers wait for a new generation
  std::condition_variable done;  // the caller waits for the workers
  std::atomic<uint64_t> generation{0};  // written under m; polled without it
  std::atomic<bool> stop{false};

  // The current job (valid while a parallel_for is running; written before the generation's
  // release increment, read after a worker's acquire load of it).
  const std::function<void(int64_t, int)>* fn = nullptr;
  int64_t n_tasks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int> active{0};  // workers still inside the current job
  std::exception_ptr error;
  std::mutex error_mutex;

  void run_tasks(int worker) {
    const bool was = t_in_pool_task;
    t_in_pool_task = true;
    for (;;) {
      const int64_t t = next.fetch_add(1, std::memory_order_relaxed);
      if (t >= n_tasks) break;
      try {
        (*fn)(t, worker);
      } catch (...) {
        std::lock_guard<std::mutex> g(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n_tasks, std::memory_order_relaxed);  // stop handing out tasks
      }
    }
    t_in_pool_task = was;
  }

  void worker_loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
      auto ready = [&] {
        return stop.load(std::memory_order_acquire) || generation.load(std::memory_order_acquire) != seen;
      };
      if (!spin_until(ready)) {
        std::unique_lock<std::mutex> lk(m);
        wake.wait(lk, ready);
      }
      if (stop.load(std::memory_order_acquire)) return;
      seen = generation.load(std::memory_order_acquire);
      run_tasks(worker);
      if (active.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // the last worker out: wake the caller if it stopped polling (taking m orders this
        // notify after the caller's predicate check, so it cannot be lost)
        std::lock_guard<std::mutex> lk(m);
        done.notify_one();
      }
    }
  }
};

ThreadPool::ThreadPool(int n_threads) : impl_(std::make_unique<Impl>()) {
  VQ_CHECK_VALUE(n_threads >= 0, "ThreadPool: n_threads must be >= 0, got " << n_threads);
  n_threads_ = n_threads > 0 ? n_threads : default_threads();
  impl_->threads.reserve(size_t(n_threads_ - 1));
  for (int w = 1; w < n_threads_; ++w) impl_->threads.emplace_back([this, w] { impl_->worker_loop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(impl_->m);
    impl_->stop.store(true, std::memory_order_release);
  }
  impl_->wake.notify_all();
  for (auto& t : impl_->threads) t.join();
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1 || t_in_pool_task) {
    // Inline: a single task, a one-thread pool, or a nested call from inside a task.
    const bool was = t_in_pool_task;
    t_in_pool_task = true;
    try {
      for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    } catch (...) {
      t_in_pool_task = was;
      throw;
    }
    t_in_pool_task = was;
    return;
  }
  std::lock_guard<std::mutex> call(impl_->call_mutex);
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lk(s.m);
    s.fn = &fn;
    s.n_tasks = n_tasks;
    s.next.store(0, std::memory_order_relaxed);
    s.error = nullptr;
    s.active.store(n_threads_ - 1, std::memory_order_relaxed);
    s.generation.fetch_add(1, std::memory_order_release);
  }
  s.wake.notify_all();
  s.run_tasks(0);
  auto finished = [&] { return s.active.load(std::memory_order_acquire) == 0; };
  if (!spin_until(finished)) {
    std::unique_lock<std::mutex> lk(s.m);
    s.done.wait(lk, finished);
  }
  s.fn = nullptr;
  if (s.error) {
    std::exception_ptr e = s.error;
    s.error = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace veloxquant
