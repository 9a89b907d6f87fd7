// tests/ops/test_vecinfer_attention.cpp — vecinfer_attention_cpu (attention on codes) against
// its scalar oracle vecinfer_attention_ref.
//
// Random codebooks, random λ (smooth) with the Hadamard rotation, random codes (every byte
// pattern is a valid packed code row), a random ring window. Covers the LUT and dequant key
// paths (codebook_bits <= 9 vs 10 and 12, short vs long chunks), the histogram and dequant value
// paths (<= 8 bits vs more), float and int8-grid codebooks (ProductQuantizer::codebook_i8),
// bits that are not a whole byte (4, 5, 6, 10, 12), rows with padding bits, head_dim 64 to 256,
// odd and even token counts (the key kernel takes tokens in pairs), GQA 1/3/4/5/8 (two row
// blocks of 4 rows done together from 5 rows on, and for neighbouring queries), causal
// prefill, sliding windows, windows that wrap around the ring, and permuted query layouts.
// Tolerance tier: bounded, as tests/ops/test_attention.cpp (vq_test::attention_tolerance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "ops/attention_test_util.h"
#include "veloxquant/error.h"
#include "veloxquant/vecinfer_cache.h"

using namespace veloxquant;
using namespace vq_test;

namespace {

struct VCase {
  int64_t batch, n_kv_heads, group, q_len, n_coded, n_window, n_slots, first_slot, head_dim;
  PQSpec kspec, vspec;
  bool causal;
  int64_t window;
  DType qt, wt, ot;
  bool permuted;
  bool int8_grid = false;  ///< both codebooks snapped to their int8 grid (the caches' keys by default)
  std::string str() const {
    std::ostringstream o;
    o << "batch=" << batch << " n_kv_heads=" << n_kv_heads << " group=" << group << " q_len=" << q_len
      << " n_coded=" << n_coded << " n_window=" << n_window << " n_slots=" << n_slots << " first_slot=" << first_slot
      << " head_dim=" << head_dim << " keys=" << kspec.str() << " values=" << vspec.str() << " causal=" << causal
      << " sliding_window=" << window << " q=" << dt_name(qt) << " window=" << dt_name(wt) << " out=" << dt_name(ot)
      << " permuted=" << permuted << " int8_grid=" << int8_grid;
    return o.str();
  }
};

struct Built {
  ProductQuantizer kp, vp;
  KeyTransform tf;
  Tensor kc, vc;
  Tensor4 wk, wv;
  VecInferAttentionInputs in;
};

void build(const VCase& c, std::mt19937_64& rng, Built& b) {
  b.kp = ProductQuantizer(int(c.head_dim), c.kspec);
  b.kp.set_random_codebook(rng(), 0.5f);
  b.vp = ProductQuantizer(int(c.head_dim), c.vspec);
  b.vp.set_random_codebook(rng());
  if (c.int8_grid) {
    b.kp.set_codebook(snap_to_int8_grid(b.kp.codebook));
    b.vp.set_codebook(snap_to_int8_grid(b.vp.codebook));
    EXPECT_FALSE(b.kp.codebook_i8.empty());
    EXPECT_FALSE(b.vp.codebook_i8.empty());
  }
  std::uniform_real_distribution<float> ud(0.3f, 3.0f);
  std::vector<float> lam(size_t(c.n_kv_heads * c.head_dim));
  for (auto& x : lam) x = ud(rng);
  b.tf = KeyTransform(int(c.n_kv_heads), int(c.head_dim), lam, true);
  b.kc = Tensor::empty({c.batch, c.n_kv_heads, c.n_coded, b.kp.code_bytes}, DType::U8);
  b.vc = Tensor::empty({c.batch, c.n_kv_heads, c.n_coded, b.vp.code_bytes}, DType::U8);
  for (int64_t i = 0; i < b.kc.numel(); ++i) b.kc.ptr<uint8_t>()[i] = uint8_t(rng());
  for (int64_t i = 0; i < b.vc.numel(); ++i) b.vc.ptr<uint8_t>()[i] = uint8_t(rng());
  b.in.key_pq = &b.kp;
  b.in.value_pq = &b.vp;
  b.in.transform = &b.tf;
  b.in.key_codes = b.kc.view();
  b.in.value_codes = b.vc.view();
  b.in.n_window = c.n_window;
  if (c.n_slots > 0) {
    b.wk = random_tensor4({c.batch, c.n_kv_heads, c.n_slots, c.head_dim}, c.wt, c.permuted, rng);
    b.wv = random_tensor4({c.batch, c.n_kv_heads, c.n_slots, c.head_dim}, c.wt, c.permuted, rng);
    b.in.window_keys = b.wk.view;
    b.in.window_values = b.wv.view;
    b.in.window_first_slot = c.first_slot;
  }
}

void run_vcase(const VCase& c, uint64_t seed, ThreadPool* pool) {
  SCOPED_TRACE("seed=" + std::to_string(seed) + " " + c.str());
  std::mt19937_64 rng(seed);
  Built b;
  build(c, rng, b);
  const int64_t H = c.n_kv_heads * c.group;
  Tensor4 q = random_tensor4({c.batch, H, c.q_len, c.head_dim}, c.qt, c.permuted, rng);
  Tensor4 o_ref = make_tensor4({c.batch, H, c.q_len, c.head_dim}, c.ot, false);
  Tensor4 o_cpu = make_tensor4({c.batch, H, c.q_len, c.head_dim}, c.ot, c.permuted);
  SdpaParams p;
  p.causal = c.causal;
  p.sliding_window = c.window;
  vecinfer_attention_ref(b.in, q.view, o_ref.view, p);
  vecinfer_attention_cpu(b.in, q.view, o_cpu.view, p, pool);
  const double e = nmse(values_of(o_cpu.view), values_of(o_ref.view));
  if (getenv("VQ_TEST_VERBOSE")) fprintf(stderr, "nmse %.3g %s\n", e, c.str().c_str());
  EXPECT_LE(e, attention_tolerance(c.ot)) << "NMSE " << e;
}

}  // namespace

TEST(VecInferAttentionCpu, DecodeShapesAndSpecs) {
  ThreadPool pool(2);
  const PQSpec specs[][2] = {{{4, 8}, {4, 8}}, {{4, 12}, {8, 8}}, {{8, 12}, {8, 12}}, {{4, 10}, {8, 4}},
                             {{2, 4}, {2, 4}}, {{8, 8}, {4, 10}}};
  uint64_t seed = 100;
  for (const auto& s : specs)
    for (int64_t n_coded : {0, 1, 54, 97, 137, 2600})
      for (int64_t group : {1, 4, 8}) {
        const int64_t nw = n_coded == 0 ? 5 : (n_coded % 3 == 0 ? 0 : 17);
        VCase c{1, 2, group, 1, n_coded, nw, nw ? 24 : 0, nw ? 20 : 0, 128, s[0], s[1],
                true, 0, DType::F16, DType::F16, DType::F32, false};
        run_vcase(c, seed++, &pool);
      }
}

TEST(VecInferAttentionCpu, RandomShapesPrefillWindows) {
  ThreadPool pool(2);
  std::mt19937_64 pick(2024);
  const DType dts[] = {DType::F16, DType::BF16, DType::F32};
  const PQSpec kspecs[] = {{4, 8}, {4, 12}, {8, 8}, {4, 10}, {2, 6}};
  const PQSpec vspecs[] = {{8, 8}, {4, 8}, {8, 12}, {2, 5}};
  for (int i = 0; i < 50; ++i) {
    VCase c;
    c.batch = 1 + int64_t(pick() % 2);
    c.n_kv_heads = 1 + int64_t(pick() % 3);
    const int64_t groups[] = {1, 3, 4, 5, 8};
    c.group = groups[pick() % 5];
    const int64_t hds[] = {64, 80, 96, 128};
    c.head_dim = hds[pick() % 4];
    c.kspec = kspecs[pick() % 5];
    c.vspec = vspecs[pick() % 4];
    if (c.head_dim % c.kspec.sub_dim) c.kspec.sub_dim = 4;
    if (c.head_dim % c.vspec.sub_dim) c.vspec.sub_dim = 4;
    const int64_t ncs[] = {0, 1, 54, 97, 137, 700};
    c.n_coded = ncs[pick() % 6];
    c.n_window = int64_t(pick() % 20);
    if (c.n_coded + c.n_window == 0) c.n_window = 1;
    c.n_slots = c.n_window ? c.n_window + int64_t(pick() % 8) : 0;
    c.first_slot = c.n_slots ? int64_t(pick() % uint64_t(c.n_slots)) : 0;
    const int64_t total = c.n_coded + c.n_window;
    c.q_len = 1 + int64_t(pick() % uint64_t(std::min<int64_t>(total, 6)));
    c.causal = pick() % 4 != 0;
    const int64_t wins[] = {0, 0, 1, 9, 100};
    c.window = wins[pick() % 5];
    c.qt = dts[pick() % 3];
    c.wt = pick() % 2 ? DType::F16 : DType::BF16;
    c.ot = dts[pick() % 3];
    c.permuted = pick() % 2 == 0;
    run_vcase(c, 5000 + uint64_t(i), &pool);
  }
}

TEST(VecInferAttentionCpu, LongContextLutAndHistogramPaths) {
  ThreadPool pool(2);
  // 9000 coded tokens: several chunks, LUT + histogram (b8) and dequant (b12) paths.
  run_vcase({1, 2, 4, 1, 9000, 128, 128, 77, 128, {4, 8}, {4, 8}, true, 0, DType::F16, DType::F16, DType::F32, false},
            1, &pool);
  run_vcase({1, 1, 4, 3, 5000, 40, 128, 100, 128, {4, 12}, {8, 8}, true, 0, DType::F32, DType::F16, DType::F32, false},
            2, &pool);
  run_vcase({1, 1, 8, 2, 6000, 64, 64, 0, 64, {4, 10}, {8, 10}, true, 2500, DType::BF16, DType::BF16, DType::F32, true},
            3, &pool);
}

// Codebooks on their int8 grid: keys and values are read as int8 rows (scores against q̃·scale,
// value sums scaled once), in token pairs with an odd last token, 16-dim slices grouped by 4
// with a partial last group (head_dim 80, 96), a head_dim that is no multiple of 16 (72: the
// scalar path) whose 10-bit rows carry padding bits (the per-row unpack), and contiguous rows
// unpacked as one stream.
TEST(VecInferAttentionCpu, Int8GridCodebooksOnTheDequantPaths) {
  ThreadPool pool(2);
  std::mt19937_64 pick(77);
  const PQSpec kspecs[] = {{4, 12}, {8, 12}, {4, 10}, {8, 10}};
  const PQSpec vspecs[] = {{8, 12}, {4, 10}, {8, 8}, {4, 12}};
  const int64_t hds[] = {64, 72, 80, 96, 128, 256};
  const int64_t ncs[] = {1, 2, 3, 96, 97, 2601};
  for (int i = 0; i < 48; ++i) {
    VCase c{1, 2, 4, 1, 0, 0, 0, 0, 128, {4, 12}, {8, 8}, true, 0, DType::F32, DType::F16, DType::F32, false, true};
    c.head_dim = hds[i % 6];
    c.kspec = kspecs[pick() % 4];
    c.vspec = vspecs[pick() % 4];
    if (c.head_dim % c.kspec.sub_dim) c.kspec.sub_dim = 4;
    if (c.head_dim % c.vspec.sub_dim) c.vspec.sub_dim = 4;
    c.n_coded = ncs[pick() % 6];
    c.n_kv_heads = 1 + int64_t(pick() % 2);
    const int64_t groups[] = {1, 4, 5};
    c.group = groups[pick() % 3];
    c.q_len = 1 + int64_t(pick() % 3);
    c.n_window = int64_t(pick() % 3) * 7;
    c.n_slots = c.n_window ? c.n_window + 3 : 0;
    c.first_slot = c.n_slots ? int64_t(pick() % uint64_t(c.n_slots)) : 0;
    c.q_len = std::min(c.q_len, c.n_coded + c.n_window);  // causal: no more queries than keys
    c.batch = 1 + int64_t(pick() % 2);
    c.permuted = pick() % 2 == 0;
    run_vcase(c, 9000 + uint64_t(i), &pool);
  }
  // the defaults at decode, both parities of a long history
  for (int64_t n_coded : {2600, 2601})
    run_vcase({1, 2, 4, 1, n_coded, 17, 24, 5, 128, {4, 12}, {8, 8}, true, 0, DType::F16, DType::F16, DType::F32, false,
               true},
              n_coded, &pool);
}

// Codes of 7 to 16 bits, which the vector paths unpack in groups (16 codes with AVX-512 VBMI, 8
// with AVX2, whose 16-byte window must hold a group's codes at every bit offset) before the
// scalar loop takes a row's or a block's last codes: head_dim 64 (16 codes a row: whole bytes,
// rows unpacked as one stream) and 72 (18 codes: odd widths leave padding bits, rows unpacked
// one by one), float and int8-grid codebooks, an odd token count.
TEST(VecInferAttentionCpu, CodesOf7To16BitsUnpackAtEveryWidth) {
  ThreadPool pool(2);
  uint64_t seed = 41000;
  for (int bits : {7, 9, 11, 13, 14, 15, 16})
    for (int64_t hd : {64, 72}) {
      const PQSpec k{4, bits}, v{4, bits == 16 ? 9 : bits + 1};
      VCase c{1, 1, 4, 1, 301, 5, 8, 3, hd, k, v, true, 0, DType::F16, DType::F16, DType::F32, false, bits % 2 == 0};
      run_vcase(c, seed++, &pool);
    }
}

// Two row blocks of one (batch, kv head) whose units cover the same tokens are done together
// with 8-lane tables and 8-row dequant kernels (coded_partial<2>): groups of 5 to 8 query heads
// at decode (a full pair at 8, a pair with 1 to 3 idle lanes at 5 to 7), neighbouring queries of
// a prefill chunk (group 2 to 4), and causal / sliding-window rows, where a pair's rows see
// different tokens, some rows of a block none of them, and a block's last chunk may have no
// partner. Long histories take the 8-lane LUT and histogram (8-bit codes of 256 centroids: the
// hot kernels; 6-bit: the generic ones), short ones and 10 / 12-bit codes the dequant kernels,
// float and int8-grid codebooks, head_dim 64 to 256.
TEST(VecInferAttentionCpu, PairedRowBlocksMatchTheReference) {
  ThreadPool pool(2);
  struct Shape {
    int64_t group, q_len, n_coded, head_dim;
    PQSpec k, v;
    int64_t window;
    bool int8_grid;
  };
  const Shape shapes[] = {
      {8, 1, 2600, 128, {4, 8}, {4, 8}, 0, false},    // d4b8/d4b8: 8-lane LUT + histogram
      {8, 1, 2601, 128, {4, 12}, {8, 8}, 0, true},    // the defaults: int8 8-row dequant keys
      {7, 1, 1500, 128, {8, 8}, {8, 8}, 0, false},    // 7 rows: a pair with an idle lane
      {6, 1, 700, 64, {4, 6}, {2, 6}, 0, false},      // 6-bit codes: the generic 8-lane kernels
      {5, 1, 97, 256, {8, 12}, {8, 12}, 0, false},    // float 8-row dequant keys and values
      {5, 1, 2600, 96, {4, 8}, {4, 8}, 0, false},     // head_dim 96
      {8, 2, 3000, 80, {4, 10}, {8, 10}, 0, true},    // int8 dequant, head_dim 80 (a 16-dim tail)
      {4, 3, 2600, 128, {4, 8}, {8, 8}, 0, false},    // prefill: queries 0 and 1 paired
      {2, 6, 900, 128, {4, 12}, {4, 8}, 0, true},     // prefill, group 2: 3 blocks, 1 pair
      {3, 5, 2600, 128, {4, 8}, {4, 8}, 9, false},    // sliding window 9: rows see different tokens
      {8, 4, 5000, 64, {4, 8}, {8, 8}, 1000, false},  // sliding window over several chunks
      {5, 2, 2700, 128, {4, 12}, {8, 8}, 1, true},    // window 1: most rows of a block see nothing
  };
  uint64_t seed = 31000;
  for (const Shape& sh : shapes)
    for (DType ot : {DType::F32, DType::F16}) {
      VCase c{1, 2, sh.group, sh.q_len, sh.n_coded, 17, 24, 9, sh.head_dim, sh.k, sh.v,
              true, sh.window, DType::F16, DType::F16, ot, seed % 2 == 0, sh.int8_grid};
      run_vcase(c, seed++, &pool);
    }
}

TEST(VecInferAttentionCpu, ThreadCountDoesNotChangeResults) {
  std::mt19937_64 rng(11);
  VCase c{1, 2, 4, 1, 7000, 100, 128, 90, 128, {4, 8}, {4, 8}, true, 0, DType::F16, DType::F16, DType::F32, false};
  Built b;
  build(c, rng, b);
  Tensor4 q = random_tensor4({1, 8, 1, 128}, DType::F16, false, rng);
  Tensor4 o1 = make_tensor4({1, 8, 1, 128}, DType::F32, false), o2 = make_tensor4({1, 8, 1, 128}, DType::F32, false);
  ThreadPool pool(2);
  vecinfer_attention_cpu(b.in, q.view, o1.view, SdpaParams{}, nullptr);
  vecinfer_attention_cpu(b.in, q.view, o2.view, SdpaParams{}, &pool);
  EXPECT_TRUE(bit_equal(values_of(o1.view), values_of(o2.view)));
}

TEST(VecInferAttentionCpu, BadInputsThrowNamingShapes) {
  std::mt19937_64 rng(12);
  VCase c{1, 2, 4, 1, 50, 10, 16, 3, 64, {4, 8}, {8, 8}, true, 0, DType::F16, DType::F16, DType::F32, false};
  Built b;
  build(c, rng, b);
  Tensor4 q = random_tensor4({1, 6, 1, 64}, DType::F16, false, rng);  // GQA 3 over 2 kv heads: fine
  Tensor4 o = make_tensor4({1, 6, 1, 64}, DType::F32, false);
  EXPECT_NO_THROW(vecinfer_attention_cpu(b.in, q.view, o.view, SdpaParams{}, nullptr));
  Tensor4 q5 = random_tensor4({1, 5, 1, 64}, DType::F16, false, rng);
  Tensor4 o5 = make_tensor4({1, 5, 1, 64}, DType::F32, false);
  try {
    vecinfer_attention_cpu(b.in, q5.view, o5.view, SdpaParams{}, nullptr);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("n_heads=5"), std::string::npos) << e.what();
  }
  VecInferAttentionInputs bad = b.in;
  bad.window_first_slot = 16;
  EXPECT_THROW(vecinfer_attention_ref(bad, q.view, o.view, SdpaParams{}), ValueError);
  bad = b.in;
  bad.n_window = 17;  // more than the 16 slots
  EXPECT_THROW(vecinfer_attention_cpu(bad, q.view, o.view, SdpaParams{}, nullptr), ShapeError);
  Tensor4 q96 = random_tensor4({1, 4, 1, 96}, DType::F16, false, rng);
  Tensor4 o96 = make_tensor4({1, 4, 1, 96}, DType::F32, false);
  EXPECT_THROW(vecinfer_attention_cpu(b.in, q96.view, o96.view, SdpaParams{}, nullptr), ShapeError);
}

// The oracle's int8_query option (the CUDA kernels' CodebookFormat::I8 scoring): coded keys are
// scored against q̃ rounded per row to two int8s (hi + lo/254 steps of max|q̃|/127), window keys
// against the exact query. So it moves outputs that see coded keys by about the rounding (tiny,
// non-zero) and leaves a window-only history exactly as it was.
TEST(VecInferAttentionRef, Int8QueryRoundsOnlyTheCodedScores) {
  for (int64_t n_coded : {int64_t(300), int64_t(0)}) {
    const VCase c{1, 2, 4, 2, n_coded, 20, 24, 3, 128, {4, 8}, {4, 8}, true, 0, DType::F32, DType::F32, DType::F32, false};
    SCOPED_TRACE(c.str());
    std::mt19937_64 rng(77);
    Built b;
    build(c, rng, b);
    Tensor4 q = random_tensor4({c.batch, c.n_kv_heads * c.group, c.q_len, c.head_dim}, c.qt, false, rng);
    Tensor4 o_exact = make_tensor4(q.view.sizes(), DType::F32, false);
    Tensor4 o_i8 = make_tensor4(q.view.sizes(), DType::F32, false);
    vecinfer_attention_ref(b.in, q.view, o_exact.view, {});
    b.in.int8_query = true;
    vecinfer_attention_ref(b.in, q.view, o_i8.view, {});
    const std::vector<float> x = values_of(o_exact.view), y = values_of(o_i8.view);
    const double e = nmse(y, x);
    if (getenv("VQ_TEST_VERBOSE")) fprintf(stderr, "int8 query: nmse %.3g vs the exact query\n", e);
    if (n_coded > 0) {
      EXPECT_GT(e, 0.0);   // the rounding took place
      // and is tiny: at most half a 254th of a step of max|q̃|/127 per element, ~1e-5 of the
      // rounding's range (NMSE of order 1e-10; one int8 alone gave ~1e-5 here)
      EXPECT_LT(e, 1e-7);
    } else {
      EXPECT_EQ(y, x);  // no coded keys: the exact query throughout
    }
  }
}

// A query too small for the int8 step 127/max|q̃| to be finite (max|q̃| below ~3.7e-37) rounds to
// zero, like a zero query: every score ~0, so the softmax is uniform. Before, its zero elements
// became 0·inf = NaN and so did the whole output (found by reading the fuzzing notes; the CUDA
// kernels gave the uniform result, CudaAttention.TinyQueriesAttendUniformlyLikeTheOracle).
TEST(VecInferAttentionRef, Int8QueryTooSmallForItsStepRoundsToZero) {
  const VCase c{1, 2, 4, 1, 300, 20, 24, 3, 128, {4, 8}, {4, 8}, true, 0, DType::F32, DType::F32, DType::F32, false};
  std::mt19937_64 rng(91);
  Built b;
  build(c, rng, b);
  b.in.int8_query = true;
  // λ = 1, so that the pair queries below reach the rotation as built: (c, c, 0, ...) rotates
  // exactly into 64 elements of 2c/√128 and 64 exact zeros (x·(127/max|q̃|) = 0·inf before the fix)
  const KeyTransform rotation_only(int(c.n_kv_heads), int(c.head_dim), {}, true);
  b.in.transform = &rotation_only;
  const Shape qs{c.batch, c.n_kv_heads * c.group, c.q_len, c.head_dim};
  Tensor4 q0 = make_tensor4(qs, DType::F32, false);  // all zero
  Tensor4 o0 = make_tensor4(qs, DType::F32, false);
  vecinfer_attention_ref(b.in, q0.view, o0.view, {});
  const std::vector<float> uniform = values_of(o0.view);
  // Random queries of tiny elements (subnormal and normal), then pairs (c, c, 0, ...).
  std::vector<Tensor4> queries;
  for (float stddev : {1e-40f, 1e-38f}) queries.push_back(random_tensor4(qs, DType::F32, false, rng, stddev));
  for (float mag : {1e-36f, 2e-36f}) {
    queries.push_back(make_tensor4(qs, DType::F32, false));
    for (int64_t h = 0; h < qs[1]; ++h)
      for (int64_t d : {0, 1}) set_elem(queries.back().view, off(queries.back().view, 0, h, 0, d), mag);
  }
  for (size_t i = 0; i < queries.size(); ++i) {
    SCOPED_TRACE("query " + std::to_string(i));
    const TensorView qv = queries[i].view;
    const std::vector<float> vals = values_of(qv);
    ASSERT_GT(*std::max_element(vals.begin(), vals.end()), 0.0f);  // not flushed to zero on this machine
    Tensor4 o = make_tensor4(qs, DType::F32, false);
    vecinfer_attention_ref(b.in, qv, o.view, {});
    const std::vector<float> y = values_of(o.view);
    for (float v : y) ASSERT_TRUE(std::isfinite(v)) << v;
    EXPECT_LT(nmse(y, uniform), 1e-12);
  }
}
