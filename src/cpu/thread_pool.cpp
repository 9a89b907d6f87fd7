// src/cpu/thread_pool.cpp — the persistent pool behind CPU attention and the caches.
//
// size()−1 worker threads wait for a job; parallel_for publishes one (the function and the
// task count), wakes them, and works on tasks itself as worker 0.
//
// Tasks, not workers, end a job. One 64-bit ticket holds (job number, next task index); a
// thread claims task i of job j by a compare-and-swap of (j, i) to (j, i + 1), and the caller
// returns once every task of its job has finished (a count of finished tasks). A worker that
// was not scheduled while the job ran (a busy machine: other processes on the cores) therefore
// holds nobody up: the caller runs the tasks itself, and the late worker's claim fails against
// the newer ticket. Before 2026-12-05 the caller waited for every worker to check in, even one
// with nothing left to do: with two busy loops beside a 2-thread pool on this 2-core machine,
// a back-to-back call took 458 us (median) instead of 0.40, and a 256-token decode sometimes
// 4 ms, one scheduler tick.
//
// Waiting spins before it sleeps. A condition-variable round trip (the caller's notify, a
// sleeping worker scheduled again, its "done" waking the caller) cost 64 us per parallel_for
// on the 2-core CI machine (a VM; measured 2026-12-04), more than a decode step's query setup
// or a short context's whole attention. So a worker polls the ticket for up to kSpinMicros
// after each job before it sleeps, and the caller polls the finished count as long before it
// sleeps: back-to-back calls (layer after layer) find the workers awake. The poll yields the
// CPU every 64 checks, so a spinning worker of one idle pool (each cache may own one) gives way
// to runnable threads of another.
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

// The ticket: job number in the high 32 bits, the next task index in the low 32.
constexpr int kJobShift = 32;
constexpr uint64_t kIndexMask = (uint64_t(1) << kJobShift) - 1;
inline uint32_t ticket_job(uint64_t v) { return uint32_t(v >> kJobShift); }
inline uint64_t ticket_index(uint64_t v) { return v & kIndexMask; }

}  // namespace

struct ThreadPool::Impl {
  std::vector<std::thread> threads;
  std::mutex call_mutex;  // serialises parallel_for calls
  std::mutex m;
  std::condition_variable wake;  // workers wait for a new job
  std::condition_variable done;  // the caller waits for the job's last task
  std::atomic<bool> stop{false};

  // The job's description, in the slot of its number's parity: a late worker may read the slot
  // of a job that has ended while the caller writes the next-but-one job there, so the fields
  // are atomics (the worker's claim then fails, as the ticket has moved on).
  struct Slot {
    std::atomic<const std::function<void(int64_t, int)>*> fn{nullptr};
    std::atomic<int64_t> n_tasks{0};
  };
  Slot slots[2];
  std::atomic<uint64_t> ticket{0};      // (job, next task); job 0 is "none yet"
  std::atomic<int64_t> finished{0};     // tasks of the current job done (or skipped after an error)
  std::exception_ptr error;
  std::mutex error_mutex;

  // Claims and runs tasks of job `job` until none is left or the job has ended.
  void run_tasks(uint32_t job, int worker) {
    const bool was = t_in_pool_task;
    t_in_pool_task = true;
    uint64_t v = ticket.load(std::memory_order_acquire);
    for (;;) {
      if (ticket_job(v) != job) break;
      const Slot& s = slots[job & 1];
      const int64_t n = s.n_tasks.load(std::memory_order_relaxed);
      const auto* fn = s.fn.load(std::memory_order_relaxed);
      const uint64_t i = ticket_index(v);
      if (int64_t(i) >= n) break;
      if (!ticket.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      // task i of the current job is ours: the caller waits for it, so fn is alive
      int64_t count = 1;
      try {
        (*fn)(int64_t(i), worker);
      } catch (...) {
        {
          std::lock_guard<std::mutex> g(error_mutex);
          if (!error) error = std::current_exception();
        }
        count += skip_rest(job, n);
      }
      if (finished.fetch_add(count, std::memory_order_acq_rel) + count == n) {
        // the job's last task: wake the caller if it stopped polling (taking m orders this
        // notify after the caller's predicate check, so it cannot be lost)
        std::lock_guard<std::mutex> lk(m);
        done.notify_one();
      }
      v = ticket.load(std::memory_order_acquire);
    }
    t_in_pool_task = was;
  }

  // After a task threw: claims every task not handed out yet, so none of them runs; returns
  // how many (they count as finished).
  int64_t skip_rest(uint32_t job, int64_t n) {
    uint64_t v = ticket.load(std::memory_order_acquire);
    for (;;) {
      if (ticket_job(v) != job || int64_t(ticket_index(v)) >= n) return 0;
      const uint64_t end = (uint64_t(job) << kJobShift) | uint64_t(n);
      if (ticket.compare_exchange_weak(v, end, std::memory_order_acq_rel, std::memory_order_acquire))
        return n - int64_t(ticket_index(v));
    }
  }

  void worker_loop(int worker) {
    uint32_t seen = 0;
    for (;;) {
      auto ready = [&] {
        return stop.load(std::memory_order_acquire) || ticket_job(ticket.load(std::memory_order_acquire)) != seen;
      };
      if (!spin_until(ready)) {
        std::unique_lock<std::mutex> lk(m);
        wake.wait(lk, ready);
      }
      if (stop.load(std::memory_order_acquire)) return;
      seen = ticket_job(ticket.load(std::memory_order_acquire));
      run_tasks(seen, worker);
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
  VQ_CHECK_VALUE(uint64_t(n_tasks) <= kIndexMask,
                 "ThreadPool::parallel_for: " << n_tasks << " tasks, at most " << kIndexMask);
  std::lock_guard<std::mutex> call(impl_->call_mutex);
  Impl& s = *impl_;
  uint32_t job = 0;
  {
    std::lock_guard<std::mutex> lk(s.m);
    // the previous job has no task left running (its caller waited for them all), so nobody
    // touches `finished` or `error` now; a late worker of an older job only reads the slots
    job = ticket_job(s.ticket.load(std::memory_order_relaxed)) + 1;
    if (job == 0) job = 1;  // after 2^32 jobs: 0 stays "none yet"
    Impl::Slot& slot = s.slots[job & 1];
    slot.fn.store(&fn, std::memory_order_relaxed);
    slot.n_tasks.store(n_tasks, std::memory_order_relaxed);
    s.finished.store(0, std::memory_order_relaxed);
    s.error = nullptr;
    s.ticket.store(uint64_t(job) << kJobShift, std::memory_order_release);  // publishes the slot
  }
  s.wake.notify_all();
  s.run_tasks(job, 0);
  auto finished = [&] { return s.finished.load(std::memory_order_acquire) == n_tasks; };
  if (!spin_until(finished)) {
    std::unique_lock<std::mutex> lk(s.m);
    s.done.wait(lk, finished);
  }
  if (s.error) {
    std::exception_ptr e = s.error;
    s.error = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace veloxquant
