// src/cpu/thread_pool.cpp — the persistent pool behind CPU attention and the caches.
//
// size()−1 worker threads sleep on a condition variable; parallel_for publishes a job (the
// function, the task count, an atomic next-task counter), wakes them, and works on tasks
// itself as worker 0. Workers grab task indices with fetch_add until none are left, then the
// last one to finish signals the caller. A generation counter tells workers a new job exists.
#include "veloxquant/thread_pool.h"

#include <atomic>
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
}

struct ThreadPool::Impl {
  std::vector<std::thread> threads;
  std::mutex call_mutex;  // serialises parallel_for calls

  std::mutex m;
  std::condition_variable wake;  // workers wait for a new generation
  std::condition_variable done;  // the caller waits for the workers
  uint64_t generation = 0;
  bool stop = false;

  // The current job (valid while a parallel_for is running).
  const std::function<void(int64_t, int)>* fn = nullptr;
  int64_t n_tasks = 0;
  std::atomic<int64_t> next{0};
  int active = 0;  // workers still inside the current job
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
      {
        std::unique_lock<std::mutex> lk(m);
        wake.wait(lk, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
      }
      run_tasks(worker);
      {
        std::lock_guard<std::mutex> lk(m);
        if (--active == 0) done.notify_one();
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
    impl_->stop = true;
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
    s.active = n_threads_ - 1;
    ++s.generation;
  }
  s.wake.notify_all();
  s.run_tasks(0);
  {
    std::unique_lock<std::mutex> lk(s.m);
    s.done.wait(lk, [&] { return s.active == 0; });
    s.fn = nullptr;
  }
  if (s.error) {
    std::exception_ptr e = s.error;
    s.error = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace veloxquant
