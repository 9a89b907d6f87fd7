// tests/cache/test_vecinfer_cache.cpp — VecInferKVCache: the three modes, the residual window,
// trim, byte accounting per token, state round trips, and errors that leave the cache as it was.
//
// Tolerance tiers: exact (dequantized views, fetched K̂/V̂, counters, Stash vs MemoryBound
// fused_sdpa, restored caches: bit for bit); bounded (fused_sdpa against attention_ref over the
// cache's own dequantized K̂/V̂: vq_test::attention_tolerance; Standard vs the code modes: NMSE
// <= 1e-5, the held K̂/V̂ being fp16-rounded, relative error <= 2^-11 per element).
#include <gtest/gtest.h>

#include <limits>

#include "cache/cache_test_util.h"
#include "cpu/pq_grid_search.h"
#include "veloxquant/error.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/thread_pool.h"
#include "veloxquant/vecinfer_cache.h"

using namespace veloxquant;
using namespace vq_test;

namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// fused_sdpa of the cache against the oracle over its own dequantized K̂/V̂.
double sdpa_vs_oracle(const VecInferKVCache& c, const TensorView& q, const SdpaParams& p) {
  const Tensor out = c.fused_sdpa(q, p);
  const Tensor k = c.dequantized_keys_f32(), v = c.dequantized_values_f32();
  Tensor4 ref = make_tensor4(q.sizes(), DType::F32, false);
  attention_ref(q, k.view(), v.view(), ref.view, p);
  return nmse(values_of(out.view()), values_of(ref.view));
}

int64_t expected_nbytes(const VecInferKVCache& c) {
  const KVCacheConfig& cf = c.config();
  const int64_t B = c.batch(), H = c.n_kv_heads(), cap = c.capacity(), D = cf.head_dim, R = cf.residual_length;
  const int64_t kcb = c.key_quantizer().code_bytes, vcb = c.value_quantizer().code_bytes;
  int64_t n = c.codebook_bytes();
  if (B == 0) return n;
  switch (c.mode()) {
    case CacheMode::Standard: return n + 2 * B * H * cap * D * 2 + B * H * R * (kcb + vcb);
    case CacheMode::Stash: return n + 2 * B * H * cap * D * 2 + B * H * cap * (kcb + vcb);
    case CacheMode::MemoryBound: return n + B * H * cap * (kcb + vcb) + 2 * B * H * R * D * 2;
  }
  return -1;
}

void check_accounting(const VecInferKVCache& c) {
  const int64_t B = c.batch(), H = c.n_kv_heads(), D = c.config().head_dim;
  const int64_t kcb = c.key_quantizer().code_bytes, vcb = c.value_quantizer().code_bytes;
  const int64_t coded = c.mode() == CacheMode::Standard ? c.residual_count() : c.offset();
  const int64_t fp = c.mode() == CacheMode::MemoryBound ? c.residual_count() : c.offset();
  EXPECT_EQ(c.compressed_key_bytes(), B * H * coded * kcb);
  EXPECT_EQ(c.compressed_value_bytes(), B * H * coded * vcb);
  EXPECT_EQ(c.fp16_key_bytes(), B * H * fp * D * 2);
  EXPECT_EQ(c.fp16_value_bytes(), B * H * fp * D * 2);
  EXPECT_EQ(c.nbytes(), expected_nbytes(c));
}

}  // namespace

TEST(VecInferCache, WindowHoldsRecentTokensExactlyAndOldOnesDequantized) {
  for (CacheMode mode : {CacheMode::Standard, CacheMode::Stash, CacheMode::MemoryBound}) {
    SCOPED_TRACE(cache_mode_name(mode));
    std::mt19937_64 rng(10);
    VecInferKVCache c(vq_config(mode, 64, 8));
    CacheModel m;
    m.residual_length = 8;
    for (int64_t n : {5, 7, 1, 20, 3}) {
      KV a = random_kv(1, 2, n, 64, DType::F32, n % 2 == 1, rng);
      c.update(a.k.view, a.v.view);
      m.append(a.k.view, a.v.view);
      EXPECT_EQ(c.offset(), m.offset);
      EXPECT_EQ(c.residual_count(), m.rc);
      const bool rounded = mode == CacheMode::Standard;
      EXPECT_TRUE(bit_equal(values_of(c.dequantized_keys_f32().view()), m.expected(true, c, rounded)));
      EXPECT_TRUE(bit_equal(values_of(c.dequantized_values_f32().view()), m.expected(false, c, rounded)));
      check_accounting(c);
    }
    // Trim shrinks the window; it refills only with new tokens.
    EXPECT_EQ(c.trim(3), 3);
    m.trim(3);
    EXPECT_EQ(c.residual_count(), 5);
    KV a = random_kv(1, 2, 1, 64, DType::F16, false, rng);
    c.update(a.k.view, a.v.view);
    m.append(a.k.view, a.v.view);
    EXPECT_EQ(c.residual_count(), 6);
    const bool rounded = mode == CacheMode::Standard;
    EXPECT_TRUE(bit_equal(values_of(c.dequantized_keys_f32().view()), m.expected(true, c, rounded)));
    EXPECT_TRUE(bit_equal(values_of(c.dequantized_values_f32().view()), m.expected(false, c, rounded)));
    check_accounting(c);
    EXPECT_EQ(c.trim(1000), m.offset);
    m.trim(1000);
    EXPECT_EQ(c.residual_count(), 0);
    EXPECT_TRUE(c.empty());
    check_accounting(c);
  }
}

TEST(VecInferCache, ModesAgreeAndMatchTheOracle) {
  std::mt19937_64 rng(11);
  VecInferKVCache st(vq_config(CacheMode::Standard, 128, 16, 8, 4, 8, 8));
  VecInferKVCache sh(vq_config(CacheMode::Stash, 128, 16, 8, 4, 8, 8));
  VecInferKVCache mb(vq_config(CacheMode::MemoryBound, 128, 16, 8, 4, 8, 8));
  for (int64_t n : {300, 1, 9, 40}) {
    KV a = random_kv(2, 2, n, 128, DType::F16, true, rng);
    auto f1 = st.update_and_fetch(a.k.view, a.v.view);
    auto f2 = sh.update_and_fetch(a.k.view, a.v.view);
    mb.update(a.k.view, a.v.view);
    // Standard and Stash fetch identical K̂/V̂.
    EXPECT_TRUE(bit_equal(values_of(f1.first.view()), values_of(f2.first.view())));
    EXPECT_TRUE(bit_equal(values_of(f1.second.view()), values_of(f2.second.view())));
    if (n == 9) {
      st.trim(12);
      sh.trim(12);
      mb.trim(12);
    }
    for (int64_t q_len : {int64_t(1), int64_t(5)}) {
      Tensor4 q = random_tensor4({2, 8, q_len, 128}, DType::F16, false, rng);
      for (int64_t win : {int64_t(0), int64_t(50)}) {
        SdpaParams p;
        p.sliding_window = win;
        const auto o_sh = sdpa_values(sh, q.view, p), o_mb = sdpa_values(mb, q.view, p);
        EXPECT_TRUE(bit_equal(o_sh, o_mb));  // same codes, same window values, same kernel
        EXPECT_LE(nmse(sdpa_values(st, q.view, p), o_sh), 1e-5);
        for (const VecInferKVCache* c : {&st, &sh, &mb})
          EXPECT_LE(sdpa_vs_oracle(*c, q.view, p), attention_tolerance(DType::F16)) << cache_mode_name(c->mode());
      }
    }
  }
  // Stash/MemoryBound attention also equals the attention-on-codes oracle on the raw codes.
  Tensor4 q = random_tensor4({2, 4, 1, 128}, DType::F32, false, rng);
  Tensor4 ref = make_tensor4({2, 4, 1, 128}, DType::F32, false);
  vecinfer_attention_ref(mb.attention_inputs(), q.view, ref.view, SdpaParams{});
  EXPECT_LE(nmse(sdpa_values(mb, q.view, SdpaParams{}), values_of(ref.view)), attention_tolerance(DType::F32));
  EXPECT_THROW(st.attention_inputs(), UnsupportedError);
}

TEST(VecInferCache, SmoothFactorsBf16StorageNoHadamardAndOddHeadDims) {
  std::mt19937_64 rng(12);
  for (int hd : {80, 96}) {
    for (bool hadamard : {true, false}) {
      KVCacheConfig cf = vq_config(CacheMode::Stash, hd, 6, 6, 4, 5, 8);
      std::vector<float> lam(size_t(3 * hd));
      std::uniform_real_distribution<float> ud(0.2f, 4.0f);
      for (auto& x : lam) x = ud(rng);
      cf.smooth_factors = lam;
      cf.use_hadamard = hadamard;
      cf.storage_dtype = DType::BF16;
      VecInferKVCache c(cf);
      EXPECT_EQ(c.n_kv_heads(), 3);  // from the smooth factors
      EXPECT_EQ(c.key_transform().lambda, lam);
      KV a = random_kv(1, 3, 50, hd, DType::F32, false, rng);
      auto [k, v] = c.update_and_fetch(a.k.view, a.v.view);
      EXPECT_EQ(k.dtype(), DType::BF16);
      Tensor4 q = random_tensor4({1, 6, 2, hd}, DType::F32, true, rng);
      EXPECT_LE(sdpa_vs_oracle(c, q.view, SdpaParams{}), attention_tolerance(DType::F32));
      // the key codebook sits on its int8 grid (int8_key_grid), so its int8 rows are held too
      EXPECT_EQ(c.key_quantizer().codebook_i8.size(), size_t(64 * 4));
      EXPECT_TRUE(c.value_quantizer().codebook_i8.empty());  // random values: off the grid
      // + the encoder's transposed forms, (sub_dim + 1) x n_centroids floats each (64 and 32
      // centroids: already multiples of the 16 they are padded to)
      EXPECT_EQ(c.codebook_bytes(), 4 * (64 * 4 + 64 + 32 * 8 + 32 + 2 * 3 * hd) + 64 * 4 + 4 * (5 * 64 + 9 * 32));
      EXPECT_DOUBLE_EQ(c.assigned_avg_bits(), (6.0 / 4 + 5.0 / 8) / 2);
      KV b = random_kv(1, 2, 5, hd, DType::F32, false, rng);
      EXPECT_THROW(c.update(b.k.view, b.v.view), ShapeError);  // n_kv_heads 2 vs λ's 3
    }
  }
}

TEST(VecInferCache, StateRoundTripIsBitForBit) {
  for (CacheMode mode : {CacheMode::Standard, CacheMode::Stash, CacheMode::MemoryBound}) {
    SCOPED_TRACE(cache_mode_name(mode));
    std::mt19937_64 rng(13);
    VecInferKVCache c(vq_config(mode, 64, 8));
    KV a = random_kv(2, 2, 29, 64, DType::F16, false, rng);
    c.update(a.k.view, a.v.view);
    c.trim(3);
    KV b = random_kv(2, 2, 1, 64, DType::F16, false, rng);
    c.update(b.k.view, b.v.view);
    // restore into a fresh cache made with other codebooks and another mode: everything is replaced
    VecInferKVCache d(vq_config(mode == CacheMode::Stash ? CacheMode::Standard : CacheMode::Stash, 64, 4));
    d.restore(c.state(), c.meta_state());
    EXPECT_EQ(d.mode(), mode);
    EXPECT_EQ(snapshot(d), snapshot(c));
    auto e = VecInferKVCache::from_state(c.state(), c.meta_state());
    EXPECT_EQ(snapshot(*e), snapshot(c));
    VecInferKVCache f(vq_config(CacheMode::Standard, 128, 2));
    f.set_state(c.state());  // staged: does not fit f's meta
    f.set_meta_state(c.meta_state());
    EXPECT_EQ(snapshot(f), snapshot(c));
    for (int step = 0; step < 3; ++step) {
      KV x = random_kv(2, 2, 3 + step * 5, 64, DType::F32, false, rng);
      for (VecInferKVCache* y : {&c, &d, e.get(), &f}) y->update(x.k.view, x.v.view);
      Tensor4 q = random_tensor4({2, 4, 2, 64}, DType::F16, false, rng);
      const auto ref = sdpa_values(c, q.view, SdpaParams{});
      for (VecInferKVCache* y : {&d, e.get(), &f}) {
        EXPECT_TRUE(bit_equal(sdpa_values(*y, q.view, SdpaParams{}), ref));
        EXPECT_EQ(snapshot(*y), snapshot(c));
      }
      c.trim(2);
      d.trim(2);
      e->trim(2);
      f.trim(2);
    }
  }
}

// KVCacheConfig::int8_key_grid (on by default): the key codebook, random or given, is moved onto
// the int8 grid at construction and the value codebook is left alone; false keeps both as given.
// meta_state records the choice, and a state written before it existed (no "int8_key_grid")
// restores its codebook as given.
TEST(VecInferCache, KeyCodebookSitsOnTheInt8GridUnlessAskedNot) {
  KVCacheConfig on = vq_config(CacheMode::MemoryBound, 64, 8), off = on;
  EXPECT_TRUE(on.int8_key_grid);
  off.int8_key_grid = false;
  const VecInferKVCache a(on), b(off);
  EXPECT_EQ(a.key_quantizer().codebook, snap_to_int8_grid(b.key_quantizer().codebook));
  EXPECT_NE(a.key_quantizer().codebook, b.key_quantizer().codebook);
  EXPECT_EQ(a.value_quantizer().codebook, b.value_quantizer().codebook);
  EXPECT_EQ(a.meta_state().at("int8_key_grid"), "true");
  EXPECT_EQ(b.meta_state().at("int8_key_grid"), "false");
  // a given codebook, too
  KVCacheConfig given = on;
  given.key_codebook = b.key_quantizer().codebook;
  given.value_codebook = b.value_quantizer().codebook;
  EXPECT_EQ(VecInferKVCache(given).key_quantizer().codebook, a.key_quantizer().codebook);
  // an older state: no flag, its codebook restored as given (into a cache that snaps by default)
  std::mt19937_64 rng(5);
  VecInferKVCache c(off);
  KV x = random_kv(1, 2, 20, 64, DType::F16, false, rng);
  c.update(x.k.view, x.v.view);
  CacheMetaState old_meta = c.meta_state();
  old_meta.erase("int8_key_grid");
  VecInferKVCache d(on);
  d.restore(c.state(), old_meta);
  EXPECT_EQ(d.key_quantizer().codebook, b.key_quantizer().codebook);
  EXPECT_FALSE(d.config().int8_key_grid);
  EXPECT_EQ(snapshot(d), snapshot(c));
}

TEST(VecInferCache, BadRestoreLeavesTheCacheUnchanged) {
  std::mt19937_64 rng(14);
  VecInferKVCache c(vq_config(CacheMode::MemoryBound, 64, 8));
  KV a = random_kv(1, 2, 20, 64, DType::F16, false, rng);
  c.update(a.k.view, a.v.view);
  const CacheState s = c.state();
  const CacheMetaState m = c.meta_state();
  VecInferKVCache d(vq_config(CacheMode::MemoryBound, 64, 8));
  KV b = random_kv(1, 2, 3, 64, DType::F16, false, rng);
  d.update(b.k.view, b.v.view);
  const Snapshot before = snapshot(d);
  auto m2 = m;
  m2["residual_count"] = "9";  // > residual_length
  EXPECT_THROW(d.restore(s, m2), FormatError);
  m2 = m;
  m2["offset"] = "21";
  EXPECT_THROW(d.restore(s, m2), FormatError);
  m2 = m;
  m2["mode"] = "turbo";
  EXPECT_THROW(d.restore(s, m2), FormatError);
  m2 = m;
  m2.erase("key_codebook_bits");
  EXPECT_THROW(d.restore(s, m2), FormatError);
  CacheState s2 = s;
  s2.pop_back();  // no value codebook
  EXPECT_THROW(d.restore(s2, m), FormatError);
  s2 = s;
  s2.emplace_back("extra", Tensor::zeros({1}, DType::F32));
  EXPECT_THROW(d.restore(s2, m), FormatError);
  s2 = s;
  for (auto& [n, t] : s2)
    if (n == "window_keys") {
      t = Tensor::copy_of(t.view());
      t.ptr<uint16_t>()[3] = 0x7C00;  // +inf
    }
  EXPECT_THROW(d.restore(s2, m), FormatError);
  EXPECT_EQ(snapshot(d), before);
}

// A state's token slots (capacity, step, residual_length) and batch are meta_state strings that no
// tensor backs: restore checks what they would allocate before allocating it (found while
// writing fuzz_cache_state, with crafted inputs: capacity=2^40 asked a 500-byte file's loader for
// 2 TB, 2^62 overflowed the shape's product), and integer fields held as int must fit one.
TEST(VecInferCache, RestoreRefusesSizesNoMachineHolds) {
  std::mt19937_64 rng(16);
  for (CacheMode mode : {CacheMode::Standard, CacheMode::Stash, CacheMode::MemoryBound}) {
    VecInferKVCache c(vq_config(mode, 64, 8));
    KV a = random_kv(2, 2, 5, 64, DType::F16, false, rng);
    c.update(a.k.view, a.v.view);
    c.trim(5);  // batch 2, no tokens: nothing in the state backs batch or capacity
    const CacheState s = c.state();
    const CacheMetaState m = c.meta_state();
    const Snapshot before = snapshot(c);
    EXPECT_NO_THROW(VecInferKVCache::from_state(s, m));
    auto bad = [&](const char* key, const std::string& value, const char* named) {
      auto m2 = m;
      m2[key] = value;
      if (std::string(key) == "step") m2.erase("capacity");  // else: "not a multiple of step"
      const std::string e = error_of([&] { c.restore(s, m2); });
      EXPECT_NE(e.find(named), std::string::npos) << key << "=" << value << ": " << e;
      EXPECT_THROW(VecInferKVCache::from_state(s, m2), FormatError) << key << "=" << value;
      EXPECT_EQ(snapshot(c), before);
    };
    bad("capacity", std::to_string(int64_t(1) << 40), "capacity=1099511627776");
    bad("capacity", std::to_string(int64_t(1) << 62), "more than 2^63");
    bad("step", std::to_string(int64_t(1) << 41), "this machine's");
    bad("batch", std::to_string(int64_t(1) << 40), "batch=1099511627776");
    if (mode != CacheMode::Stash)  // the window's own slots (Stash keeps it in the full keys)
      bad("residual_length", "2000000000", "residual_length=2000000000");
    bad("step", std::to_string(std::numeric_limits<int64_t>::max()), "this machine's");
    bad("head_dim", std::to_string((int64_t(1) << 32) + 64), "out of range");
    bad("n_kv_heads", "-4294967294", "out of range");
  }
}

TEST(VecInferCache, BadInputsThrowNamingThemAndLeaveTheCacheUnchanged) {
  std::mt19937_64 rng(15);
  KVCacheConfig cf = vq_config(CacheMode::Stash, 64, 8);
  cf.fused_sdpa_max_ctx = 30;
  VecInferKVCache c(cf);
  KV a = random_kv(1, 2, 25, 64, DType::F16, false, rng);
  c.update(a.k.view, a.v.view);
  const Snapshot before = snapshot(c);
  std::string e;
  KV hd = random_kv(1, 2, 3, 32, DType::F16, false, rng);
  e = error_of([&] { c.update(hd.k.view, hd.v.view); });
  EXPECT_NE(e.find("head_dim=64"), std::string::npos) << e;
  KV heads = random_kv(1, 4, 3, 64, DType::F16, false, rng);
  e = error_of([&] { c.update_and_fetch(heads.k.view, heads.v.view); });
  EXPECT_NE(e.find("n_kv_heads=2"), std::string::npos) << e;
  EXPECT_NE(e.find("[1, 4, 3, 64]"), std::string::npos) << e;
  KV batch = random_kv(3, 2, 3, 64, DType::F16, false, rng);
  EXPECT_THROW(c.update(batch.k.view, batch.v.view), ShapeError);
  KV inf = random_kv(1, 2, 3, 64, DType::F32, true, rng);
  set_elem(inf.k.view, off(inf.k.view, 0, 1, 2, 7), INFINITY);
  e = error_of([&] { c.update(inf.k.view, inf.v.view); });
  EXPECT_NE(e.find("keys[0][1][2][7] is inf"), std::string::npos) << e;
  KV big = random_kv(1, 2, 3, 64, DType::F32, false, rng);
  set_elem(big.v.view, off(big.v.view, 0, 0, 1, 0), 70000.0f);
  e = error_of([&] { c.update(big.k.view, big.v.view); });
  EXPECT_NE(e.find("overflows f16"), std::string::npos) << e;
  Tensor ints = Tensor::zeros({1, 2, 3, 64}, DType::U8);
  e = error_of([&] { c.update(ints.view(), ints.view()); });
  EXPECT_NE(e.find("u8"), std::string::npos) << e;
  KV mism = random_kv(1, 2, 3, 64, DType::F16, false, rng);
  Tensor4 v4 = random_tensor4({1, 2, 4, 64}, DType::F16, false, rng);
  EXPECT_THROW(c.update(mism.k.view, v4.view), ShapeError);
  // fused_sdpa: query heads not a multiple of n_kv_heads; head_dim; context past max_ctx.
  Tensor4 q3 = random_tensor4({1, 3, 1, 64}, DType::F16, false, rng);
  e = error_of([&] { c.fused_sdpa(q3.view, SdpaParams{}); });
  EXPECT_NE(e.find("n_kv_heads=2"), std::string::npos) << e;
  Tensor4 qd = random_tensor4({1, 4, 1, 32}, DType::F16, false, rng);
  EXPECT_THROW(c.fused_sdpa(qd.view, SdpaParams{}), ShapeError);
  EXPECT_EQ(snapshot(c), before);
  KV more = random_kv(1, 2, 6, 64, DType::F16, false, rng);
  c.update(more.k.view, more.v.view);  // 31 > 30 tokens
  Tensor4 q = random_tensor4({1, 4, 1, 64}, DType::F16, false, rng);
  e = error_of([&] { c.fused_sdpa(q.view, SdpaParams{}); });
  EXPECT_NE(e.find("fused_sdpa_max_ctx=30"), std::string::npos) << e;
  EXPECT_THROW(c.merge({&c}), UnsupportedError);
  EXPECT_THROW(c.trim(-2), ValueError);
}

TEST(VecInferCache, MemoryBoundRefusesToFetch) {
  std::mt19937_64 rng(16);
  VecInferKVCache c(vq_config(CacheMode::MemoryBound, 64, 8));
  KV a = random_kv(1, 2, 10, 64, DType::F16, false, rng);
  c.update(a.k.view, a.v.view);
  const Snapshot before = snapshot(c);
  const std::string e = error_of([&] { c.update_and_fetch(a.k.view, a.v.view); });
  EXPECT_NE(e.find("use update() and fused_sdpa()"), std::string::npos) << e;
  EXPECT_EQ(snapshot(c), before);
  // nothing in the state is a placeholder: no full-length fp16 tensors at all
  for (const auto& [n, t] : c.state()) EXPECT_TRUE(n != "keys" && n != "values") << n;
  EXPECT_EQ(c.fp16_key_bytes(), 1 * 2 * 8 * 64 * 2);
}

TEST(VecInferCache, EmptyCacheBehaviour) {
  VecInferKVCache c(vq_config(CacheMode::Stash, 64, 8));
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(c.n_kv_heads(), 0);
  EXPECT_EQ(c.trim(5), 0);
  std::mt19937_64 rng(17);
  Tensor4 q = random_tensor4({1, 2, 1, 64}, DType::F16, false, rng);
  EXPECT_THROW(c.fused_sdpa(q.view, SdpaParams{}), ValueError);  // never updated
  KV none = random_kv(1, 1, 0, 64, DType::F16, false, rng);  // an update of no tokens changes nothing
  auto [k0, v0] = c.update_and_fetch(none.k.view, none.v.view);
  EXPECT_EQ(k0.sizes(), (Shape{1, 1, 0, 64}));
  EXPECT_EQ(c.batch(), 0);
  EXPECT_TRUE(c.empty());
  auto d = VecInferKVCache::from_state(c.state(), c.meta_state());
  EXPECT_EQ(snapshot(*d), snapshot(c));
  KV a = random_kv(1, 1, 4, 64, DType::F16, false, rng);
  c.update(a.k.view, a.v.view);
  c.trim(4);
  SdpaParams p;
  p.causal = false;
  for (float x : sdpa_values(c, q.view, p)) EXPECT_EQ(x, 0.0f);  // nothing to attend to
  check_accounting(c);
}

// meta_state carries the seed as an unsigned 64-bit number: the whole range round-trips, and a
// signed or malformed value is refused (FormatError) without touching the cache.
TEST(VecInferCache, SeedRoundTripsOverTheFullUnsignedRange) {
  for (uint64_t seed : {uint64_t(0), uint64_t(1) << 63, ~uint64_t(0)}) {
    KVCacheConfig cfg = vq_config(CacheMode::MemoryBound, 64, 8);
    cfg.seed = seed;
    VecInferKVCache c(cfg);
    std::mt19937_64 rng(seed ^ 5);
    KV a = random_kv(1, 2, 12, 64, DType::F32, false, rng);
    c.update(a.k.view, a.v.view);
    auto r = VecInferKVCache::from_state(c.state(), c.meta_state());
    EXPECT_EQ(r->config().seed, seed);
    EXPECT_EQ(snapshot(*r), snapshot(c));
    CacheMetaState bad = c.meta_state();
    bad["seed"] = "-1";
    VecInferKVCache d(vq_config(CacheMode::MemoryBound, 64, 8));
    d.update(a.k.view, a.v.view);
    const auto before = snapshot(d);
    EXPECT_THROW(d.restore(c.state(), bad), FormatError);
    EXPECT_EQ(snapshot(d), before);
  }
}

// A thread pool shared through KVCacheConfig::thread_pool (one set of threads for every layer
// of a model): every cache runs on it, and results are bit-identical to caches with their own
// pools of the same size (tasks are thread-count independent; the pool only schedules them).
TEST(VecInferCache, SharedThreadPoolIsUsedAndGivesIdenticalResults) {
  std::mt19937_64 rng(31);
  auto shared = std::make_shared<ThreadPool>(2);
  std::vector<std::unique_ptr<KVCache>> own, with_shared;
  for (int layer = 0; layer < 3; ++layer) {
    KVCacheConfig c = vq_config(CacheMode::MemoryBound, 128, 16, 8, 4, 8, 8);
    c.seed = uint64_t(layer);
    c.n_threads = 2;
    own.push_back(KVCacheFactory::create(c));
    c.thread_pool = shared;
    with_shared.push_back(KVCacheFactory::create(c));
  }
  KVCacheConfig cf;
  cf.kind = CacheKind::FP16;
  cf.head_dim = 128;
  cf.n_threads = 2;
  own.push_back(KVCacheFactory::create(cf));
  cf.thread_pool = shared;
  with_shared.push_back(KVCacheFactory::create(cf));
  EXPECT_EQ(&dynamic_cast<VecInferKVCache&>(*with_shared[0]).pool(), shared.get());
  EXPECT_EQ(&dynamic_cast<VecInferKVCache&>(*with_shared[2]).pool(), shared.get());
  EXPECT_EQ(&dynamic_cast<FP16KVCache&>(*with_shared[3]).pool(), shared.get());
  EXPECT_NE(&dynamic_cast<VecInferKVCache&>(*own[0]).pool(), shared.get());
  for (int64_t n : {200, 1, 37}) {
    for (size_t i = 0; i < own.size(); ++i) {
      KV a = random_kv(2, 2, n, 128, DType::F16, true, rng);
      own[i]->update(a.k.view, a.v.view);
      with_shared[i]->update(a.k.view, a.v.view);
      Tensor4 q = random_tensor4({2, 8, 1, 128}, DType::F16, false, rng);
      EXPECT_TRUE(bit_equal(sdpa_values(*own[i], q.view, SdpaParams{}), sdpa_values(*with_shared[i], q.view, SdpaParams{})))
          << "cache " << i << " after " << n << " tokens";
    }
  }
  own.clear();
  with_shared.clear();
  // The caches are gone; the pool they shared still works for its owner.
  std::atomic<int> count{0};
  shared->parallel_for(10, [&](int64_t, int) { ++count; });
  EXPECT_EQ(count.load(), 10);
}

// Codebooks of > 1024 sub_dim-4 centroids (d4b12) encode through a candidate grid
// (src/cpu/pq_grid_search.h) once the cache has encoded detail::cpu_grid_build_after() token-heads
// (2^20 by default; 16384 here): the update that reaches it builds the grid and encodes through
// it, and every state stays byte-equal to a cache that only scans. The grid counts in nbytes and
// shows in describe(); a restore with other codebooks drops it.
TEST(VecInferCache, GridEncodesStartAtTheThresholdAndEqualTheScan) {
  struct Restore {
    int64_t v;
    ~Restore() { detail::set_cpu_grid_build_after(v); }
  } restore{detail::set_cpu_grid_build_after(-1)};
  ASSERT_EQ(detail::cpu_grid_build_after(), int64_t(1) << 20);
  const int64_t kAfter = 16384;
  // one d4b12 codebook for every mode (the same seed): its grid is built once and shared
  const KVCacheConfig c0 = vq_config(CacheMode::Stash, 64, 8, /*kbits=*/12, 4, /*vbits=*/8, 4);
  const VecInferKVCache probe(c0);
  ASSERT_TRUE(detail::cpu_grid_wanted(probe.key_quantizer()));
  ASSERT_FALSE(detail::cpu_grid_wanted(probe.value_quantizer()));  // 256 centroids: the scan
  const auto keep = detail::GridSearch::make(probe.key_quantizer().codebook.data(), 4096, 4);
  ASSERT_TRUE(keep);
  for (CacheMode mode : {CacheMode::Stash, CacheMode::Standard, CacheMode::MemoryBound}) {
    SCOPED_TRACE(cache_mode_name(mode));
    const KVCacheConfig cf = vq_config(mode, 64, 8, 12, 4, 8, 4);
    VecInferKVCache gridded(cf), scanned(cf);
    std::mt19937_64 rng(5);
    auto both = [&](int64_t n) {
      KV x = random_kv(2, 4, n, 64, DType::F32, false, rng);
      detail::set_cpu_grid_build_after(kAfter);
      gridded.update(x.k.view, x.v.view);
      detail::set_cpu_grid_build_after(std::numeric_limits<int64_t>::max());
      scanned.update(x.k.view, x.v.view);
    };
    both(1024);  // 8192 token-heads: below the threshold
    EXPECT_EQ(gridded.describe().find("candidate grids"), std::string::npos) << gridded.describe();
    EXPECT_EQ(gridded.nbytes(), scanned.nbytes());
    both(1024);  // 16384: this update builds the key grid and encodes through it
    EXPECT_NE(gridded.describe().find("candidate grids (keys)"), std::string::npos) << gridded.describe();
    EXPECT_EQ(scanned.describe().find("candidate grids"), std::string::npos);
    const int64_t grid_bytes = gridded.nbytes() - scanned.nbytes();
    EXPECT_EQ(grid_bytes, keep->nbytes());  // a 16^4-cell grid (~1.4 MB) and its codebook copies
    both(37);
    both(1);
    Snapshot a = snapshot(gridded), b = snapshot(scanned);
    EXPECT_EQ(a.nbytes - b.nbytes, grid_bytes);
    a.nbytes = b.nbytes = 0;
    EXPECT_EQ(a, b);  // codes, window, counters: byte for byte
    Tensor4 q = random_tensor4({2, 8, 1, 64}, DType::F16, false, rng);
    if (mode != CacheMode::Standard)
      EXPECT_TRUE(bit_equal(sdpa_values(gridded, q.view, SdpaParams{}), sdpa_values(scanned, q.view, SdpaParams{})));
    // a restore with other codebooks drops the grid (it would answer for the old one)
    KVCacheConfig cf2 = cf;
    cf2.seed = 99;
    VecInferKVCache fresh(cf2);
    KV y = random_kv(1, 2, 3, 64, DType::F32, false, rng);
    fresh.update(y.k.view, y.v.view);
    gridded.restore(fresh.state(), fresh.meta_state());
    EXPECT_EQ(gridded.describe().find("candidate grids"), std::string::npos) << gridded.describe();
    EXPECT_EQ(snapshot(gridded), snapshot(fresh));
  }
}
