// tests/ops/test_attention.cpp — attention_cpu against the scalar oracle attention_ref.
//
// Tolerance tier: bounded (vq_test::attention_tolerance): NMSE of the fp32 fast path against the
// double oracle, both rounded once into the output dtype. Shapes: the awkward kv lengths
// (1, 54, 97, 137) and a few past the 2048-token chunk, GQA group sizes 1/4/8 (and 3, 5 for
// padded row blocks), head_dim 64/80/96/128/256 and 72 (not a multiple of 16: the generic path),
// causal and not, sliding windows, q_len > 1, mixed dtypes, permuted strides.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <random>

#include "ops/attention_test_util.h"
#include "veloxquant/attention.h"
#include "veloxquant/error.h"
#include "veloxquant/thread_pool.h"

using namespace veloxquant;
using namespace vq_test;

namespace {

struct Case {
  int64_t batch, n_kv_heads, group, q_len, kv_len, head_dim;
  bool causal;
  int64_t window;
  DType qt, kt, vt, ot;
  bool permuted;
  std::string str() const {
    std::ostringstream o;
    o << "batch=" << batch << " n_kv_heads=" << n_kv_heads << " group=" << group << " q_len=" << q_len
      << " kv_len=" << kv_len << " head_dim=" << head_dim << " causal=" << causal << " window=" << window
      << " q=" << dt_name(qt) << " k=" << dt_name(kt) << " v=" << dt_name(vt) << " out=" << dt_name(ot)
      << " permuted=" << permuted;
    return o.str();
  }
};

void run_case(const Case& c, uint64_t seed, ThreadPool* pool) {
  SCOPED_TRACE("seed=" + std::to_string(seed) + " " + c.str());
  std::mt19937_64 rng(seed);
  const int64_t H = c.n_kv_heads * c.group;
  Tensor4 q = random_tensor4({c.batch, H, c.q_len, c.head_dim}, c.qt, c.permuted, rng);
  Tensor4 k = random_tensor4({c.batch, c.n_kv_heads, c.kv_len, c.head_dim}, c.kt, c.permuted, rng);
  Tensor4 v = random_tensor4({c.batch, c.n_kv_heads, c.kv_len, c.head_dim}, c.vt, c.permuted, rng);
  Tensor4 o_ref = make_tensor4({c.batch, H, c.q_len, c.head_dim}, c.ot, false);
  Tensor4 o_cpu = make_tensor4({c.batch, H, c.q_len, c.head_dim}, c.ot, c.permuted);
  SdpaParams p;
  p.causal = c.causal;
  p.sliding_window = c.window;
  attention_ref(q.view, k.view, v.view, o_ref.view, p);
  attention_cpu(q.view, k.view, v.view, o_cpu.view, p, pool);
  const double e = nmse(values_of(o_cpu.view), values_of(o_ref.view));
  if (getenv("VQ_TEST_VERBOSE")) fprintf(stderr, "nmse %.3g tol %.3g %s\n", e, attention_tolerance(c.ot), c.str().c_str());
  EXPECT_LE(e, attention_tolerance(c.ot)) << "NMSE " << e;
}

}  // namespace

TEST(AttentionCpu, AwkwardShapesAgainstRef) {
  ThreadPool pool(2);
  const uint64_t seed = 20260101;
  int i = 0;
  for (int64_t kv : {1, 54, 97, 137})
    for (int64_t group : {1, 4, 8})
      for (int64_t hd : {64, 80, 96, 128, 256}) {
        Case c{1, 2, group, 1, kv, hd, true, 0, DType::F16, DType::F16, DType::F16, DType::F32, false};
        run_case(c, seed + i++, &pool);
      }
}

TEST(AttentionCpu, CausalPrefillSlidingWindowAndLayouts) {
  ThreadPool pool(2);
  std::mt19937_64 pick(77);
  const DType dts[] = {DType::F16, DType::BF16, DType::F32};
  for (int i = 0; i < 60; ++i) {
    Case c;
    c.batch = 1 + int64_t(pick() % 2);
    c.n_kv_heads = 1 + int64_t(pick() % 3);
    const int64_t groups[] = {1, 3, 4, 5, 8};
    c.group = groups[pick() % 5];
    const int64_t kvs[] = {1, 54, 97, 137, 300};
    c.kv_len = kvs[pick() % 5];
    c.q_len = 1 + int64_t(pick() % std::min<int64_t>(c.kv_len, 9));
    const int64_t hds[] = {64, 72, 80, 96, 128, 256};
    c.head_dim = hds[pick() % 6];
    c.causal = pick() % 4 != 0;
    const int64_t wins[] = {0, 0, 1, 17, 64};
    c.window = wins[pick() % 5];
    c.qt = dts[pick() % 3];
    c.kt = dts[pick() % 3];
    c.vt = dts[pick() % 3];
    c.ot = dts[pick() % 3];
    c.permuted = pick() % 2 == 0;
    run_case(c, 1000 + uint64_t(i), &pool);
  }
}

TEST(AttentionCpu, LongContextManyChunks) {
  ThreadPool pool(2);
  // 5000 tokens = 3 chunks of 2048; decode and a short causal prefill, GQA 4 and 8.
  run_case({1, 2, 4, 1, 5000, 128, true, 0, DType::F16, DType::F16, DType::F16, DType::F32, false}, 5, &pool);
  run_case({1, 1, 4, 7, 4200, 64, true, 3000, DType::F32, DType::F16, DType::F16, DType::F32, false}, 6, &pool);
  run_case({1, 1, 8, 3, 2049, 96, false, 0, DType::BF16, DType::BF16, DType::BF16, DType::F32, true}, 7, nullptr);
  // Row blocks of one kv head over the same chunk are done as one task, K/V walked in tiles
  // (dense_partial_group): group 8 at decode (2 blocks), 16 queries of group 4 (16 blocks: two
  // tasks of 8 a chunk), a sliding window so the blocks of a task see different tokens (and the
  // last chunk's units differ), head_dim 80 (the slab value kernels), a generic-path layout.
  run_case({1, 2, 8, 1, 5000, 128, true, 0, DType::F16, DType::F16, DType::F16, DType::F32, false}, 8, &pool);
  run_case({1, 2, 4, 16, 4500, 128, true, 700, DType::F16, DType::F16, DType::F16, DType::F32, false}, 9, &pool);
  run_case({2, 1, 6, 5, 3000, 80, true, 0, DType::F32, DType::BF16, DType::F16, DType::F16, false}, 10, &pool);
  run_case({1, 1, 5, 4, 2600, 72, true, 333, DType::F16, DType::F16, DType::F16, DType::F32, true}, 11, &pool);
}

TEST(AttentionCpu, SameResultWithAndWithoutThreads) {
  // Units and their merge order do not depend on the thread count: results are bit-identical.
  std::mt19937_64 rng(3);
  Tensor4 q = random_tensor4({1, 8, 2, 128}, DType::F16, false, rng);
  Tensor4 k = random_tensor4({1, 2, 4500, 128}, DType::F16, false, rng);
  Tensor4 v = random_tensor4({1, 2, 4500, 128}, DType::F16, false, rng);
  Tensor4 o1 = make_tensor4({1, 8, 2, 128}, DType::F32, false), o2 = make_tensor4({1, 8, 2, 128}, DType::F32, false);
  SdpaParams p;
  ThreadPool pool(2);
  attention_cpu(q.view, k.view, v.view, o1.view, p, nullptr);
  attention_cpu(q.view, k.view, v.view, o2.view, p, &pool);
  EXPECT_TRUE(bit_equal(values_of(o1.view), values_of(o2.view)));
}

TEST(AttentionCpu, RowsThatSeeNothingGetZeros) {
  // Non-causal with an empty kv: zeros. (A causal query always sees itself.)
  std::mt19937_64 rng(4);
  Tensor4 q = random_tensor4({1, 2, 3, 64}, DType::F32, false, rng);
  Tensor4 k = make_tensor4({1, 1, 0, 64}, DType::F32, false);
  Tensor4 v = make_tensor4({1, 1, 0, 64}, DType::F32, false);
  Tensor4 o = random_tensor4({1, 2, 3, 64}, DType::F32, false, rng);
  Tensor4 o_ref = random_tensor4({1, 2, 3, 64}, DType::F32, false, rng);
  SdpaParams p;
  p.causal = false;
  attention_cpu(q.view, k.view, v.view, o.view, p, nullptr);
  attention_ref(q.view, k.view, v.view, o_ref.view, p);
  for (float x : values_of(o.view)) EXPECT_EQ(x, 0.0f);
  for (float x : values_of(o_ref.view)) EXPECT_EQ(x, 0.0f);
}

TEST(AttentionCpu, ScaleParameterIsUsed) {
  std::mt19937_64 rng(8);
  Tensor4 q = random_tensor4({1, 4, 1, 64}, DType::F32, false, rng);
  Tensor4 k = random_tensor4({1, 1, 40, 64}, DType::F32, false, rng);
  Tensor4 v = random_tensor4({1, 1, 40, 64}, DType::F32, false, rng);
  Tensor4 o1 = make_tensor4({1, 4, 1, 64}, DType::F32, false), o2 = make_tensor4({1, 4, 1, 64}, DType::F32, false);
  SdpaParams p;
  p.scale = 0.7f;
  attention_cpu(q.view, k.view, v.view, o1.view, p, nullptr);
  attention_ref(q.view, k.view, v.view, o2.view, p);
  EXPECT_LE(nmse(values_of(o1.view), values_of(o2.view)), 1e-10);
  SdpaParams p0;
  attention_ref(q.view, k.view, v.view, o2.view, p0);
  EXPECT_GT(nmse(values_of(o1.view), values_of(o2.view)), 1e-6);  // a different scale changes the output
}

TEST(AttentionCpu, BadShapesThrowNamingThem) {
  std::mt19937_64 rng(9);
  Tensor4 q = random_tensor4({1, 6, 1, 64}, DType::F32, false, rng);
  Tensor4 k = random_tensor4({1, 4, 10, 64}, DType::F32, false, rng);
  Tensor4 v = random_tensor4({1, 4, 10, 64}, DType::F32, false, rng);
  Tensor4 o = make_tensor4({1, 6, 1, 64}, DType::F32, false);
  try {
    attention_cpu(q.view, k.view, v.view, o.view, SdpaParams{}, nullptr);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("n_heads=6"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("n_kv_heads=4"), std::string::npos) << e.what();
  }
  Tensor4 k2 = random_tensor4({1, 2, 10, 32}, DType::F32, false, rng);
  EXPECT_THROW(attention_ref(q.view, k2.view, k2.view, o.view, SdpaParams{}), ShapeError);
  Tensor4 q3 = random_tensor4({1, 4, 11, 64}, DType::F32, false, rng);
  Tensor4 o3 = make_tensor4({1, 4, 11, 64}, DType::F32, false);
  EXPECT_THROW(attention_cpu(q3.view, k.view, v.view, o3.view, SdpaParams{}, nullptr), ShapeError);  // causal q_len > kv_len
  SdpaParams bad;
  bad.sliding_window = -1;
  EXPECT_THROW(attention_cpu(q.view, k.view, v.view, o.view, bad, nullptr), ValueError);
  Tensor ki = Tensor::zeros({1, 4, 10, 64}, DType::I32);
  EXPECT_THROW(attention_cpu(q.view, ki.view(), v.view, o.view, SdpaParams{}, nullptr), ShapeError);
}

TEST(ThreadPool, RunsEveryTaskOnceAndRethrows) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, [&](int64_t t, int w) {
    ASSERT_GE(w, 0);
    ASSERT_LT(w, 3);
    hits[size_t(t)]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(pool.parallel_for(50, [&](int64_t t, int) {
    if (t == 17) throw ValueError("task 17");
  }),
               ValueError);
  // Still usable afterwards, and nested calls run inline.
  std::atomic<int> n{0};
  pool.parallel_for(4, [&](int64_t, int) { pool.parallel_for(5, [&](int64_t, int) { n++; }); });
  EXPECT_EQ(n.load(), 20);
}

// Workers poll for the next job for a while and then sleep; the caller polls for "done" and
// then sleeps. Every handoff must work: back-to-back jobs (workers still polling), jobs after
// a pause longer than the poll (workers asleep), calls from several threads at once, several
// pools sharing the cores, and destruction right after a job (workers still polling).
TEST(ThreadPool, HandsOffJobsWhetherWorkersPollOrSleep) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(64);
  auto job = [&](ThreadPool& p, int n_tasks) {
    for (auto& h : hits) h = 0;
    p.parallel_for(n_tasks, [&](int64_t t, int) { hits[size_t(t)]++; });
    for (int t = 0; t < n_tasks; ++t) ASSERT_EQ(hits[size_t(t)].load(), 1) << t;
  };
  for (int i = 0; i < 2000; ++i) job(pool, 2 + i % 60);  // back to back
  for (int i = 0; i < 20; ++i) {                          // after the poll ran out
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    job(pool, 2 + i);
  }
  // a slow task: the caller's poll for "done" runs out and it sleeps until the worker ends
  std::atomic<int> slow{0};
  pool.parallel_for(2, [&](int64_t t, int) {
    if (t == 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    slow++;
  });
  EXPECT_EQ(slow.load(), 2);

  // four threads calling one pool (serialised), each with its own pool as well
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      ThreadPool own(2);
      for (int i = 0; i < 300; ++i) {
        ThreadPool& p = i % 2 ? own : pool;
        p.parallel_for(8 + c, [&](int64_t, int) { total++; });
        if (i % 97 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), int64_t(300) * (8 + 9 + 10 + 11));

  // destroyed while its workers still poll
  for (int i = 0; i < 50; ++i) {
    ThreadPool p(2);
    std::atomic<int> n{0};
    p.parallel_for(4, [&](int64_t, int) { n++; });
    EXPECT_EQ(n.load(), 4);
  }
}

// A job ends when its tasks have, not when every worker has checked in: a worker that was not
// scheduled during a job (a busy machine) may wake after the caller returned, and must then
// neither run a task of that job nor disturb the next one. Checked over many short jobs: every
// task once, none after its call returned, the first exception rethrown and no task started
// after it unless already handed out.
TEST(ThreadPool, NoTaskRunsAfterItsCallReturns) {
  ThreadPool pool(4);
  constexpr int kJobs = 3000;
  std::vector<std::atomic<int>> ran(kJobs);
  std::vector<int> at_return(kJobs, 0);
  std::mt19937 rng(7);
  for (int j = 0; j < kJobs; ++j) {
    const int n = 2 + int(rng() % 40);
    pool.parallel_for(n, [&, j](int64_t, int) { ran[size_t(j)]++; });
    at_return[size_t(j)] = ran[size_t(j)].load();
    ASSERT_EQ(at_return[size_t(j)], n) << "job " << j;
    if (j % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // workers go to sleep
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // late workers, if any, wake
  for (int j = 0; j < kJobs; ++j) ASSERT_EQ(ran[size_t(j)].load(), at_return[size_t(j)]) << "job " << j;

  for (int rep = 0; rep < 200; ++rep) {
    std::atomic<int> started{0};
    int after = -1;
    EXPECT_THROW(pool.parallel_for(64, [&](int64_t t, int) {
      started++;
      if (t == 5) throw ValueError("task 5");
    }),
                 ValueError);
    after = started.load();
    EXPECT_GE(after, 1);
    EXPECT_LE(after, 64);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    EXPECT_EQ(started.load(), after) << "a task started after the call rethrew";
  }
}
