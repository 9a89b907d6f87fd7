// veloxquant/thread_pool.h — a small persistent thread pool, passed explicitly.
//
// CPU attention splits its work into tasks (batch × kv head × token chunk). Creating threads
// per decode call would cost tens of microseconds each, so the threads are made once and
// owned by whoever needs them (a cache owns one; the runtime may own one and pass it). The
// pool is not a global singleton.
//
// parallel_for(n, fn) runs fn(task, worker) for task in [0, n) on the pool's threads and the
// calling thread (worker 0 is the caller), and returns when all tasks are done: a worker the
// OS has not scheduled meanwhile (a busy machine) does not hold it up, the caller runs the
// tasks itself. The first exception a task throws is rethrown in the caller after the tasks
// already handed out finish; the others are skipped. Concurrent parallel_for calls from
// different threads are serialised; a parallel_for called from inside a task runs inline on
// that thread (no deadlock). Idle workers poll for the next job for about 100 us before they
// sleep (the caller likewise polls for the end of a job), so back-to-back calls cost about
// 0.3 us instead of a sleep/wake round trip (64 us on the 2-core CI machine); the poll yields
// the CPU to other runnable threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace veloxquant {

class ThreadPool {
 public:
  /// @param n_threads total threads including the caller; 0 = default_threads() (cache.h)
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Threads that run tasks, the caller included (>= 1).
  int size() const { return n_threads_; }

  /// Runs fn(task, worker) for every task in [0, n_tasks); worker is in [0, size()).
  /// Tasks are handed out dynamically (an atomic counter), so uneven tasks balance.
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t task, int worker)>& fn);

 private:
  struct Impl;
  int n_threads_ = 1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace veloxquant
