// tests/cache/test_fp16_cache.cpp — KVCacheConfig validation, KVCacheFactory, and the fp16
// baseline cache (mlx_lm KVCache protocol): fetch, growth in steps, trim, state round trips,
// fused_sdpa against the oracle, errors that leave the cache unchanged.
#include <gtest/gtest.h>

#include <limits>

#include "cache/cache_test_util.h"
#include "veloxquant/error.h"

using namespace veloxquant;
using namespace vq_test;

namespace {

KVCacheConfig fp16_config(int head_dim = 64, int64_t step = 16) {
  KVCacheConfig c;
  c.kind = CacheKind::FP16;
  c.head_dim = head_dim;
  c.step = step;
  c.n_threads = 2;
  return c;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CacheConfig, ValidationNamesTheField) {
  KVCacheConfig c = vq_config(CacheMode::Stash);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.mode(), CacheMode::Stash);
  c.fused_sdpa_memory_bound = true;
  EXPECT_EQ(c.mode(), CacheMode::MemoryBound);
  EXPECT_STREQ(cache_mode_name(CacheMode::MemoryBound), "memory_bound");

  auto bad = [](auto edit) {
    KVCacheConfig x = vq_config(CacheMode::Standard);
    edit(x);
    return error_of([&] { x.validate(); });
  };
  EXPECT_NE(bad([](KVCacheConfig& x) { x.key_codebook_bits = 17; }).find("key_codebook_bits must be in 1..16, got 17"),
            std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) { x.value_codebook_bits = 0; }).find("value_codebook_bits"), std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) { x.key_sub_dim = 5; }).find("head_dim=64 is not divisible by key_sub_dim=5"),
            std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) { x.key_codebook = std::vector<float>(10); }).find("key_codebook: expected [2^8"),
            std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) {
              x.n_kv_heads = 2;
              x.smooth_factors = std::vector<float>(64, 1.0f);
            }).find("smooth_factors: expected [n_kv_heads=2, head_dim=64]"),
            std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) { x.smooth_factors = std::vector<float>(64, -1.0f); }).find("finite and > 0"),
            std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) { x.residual_length = -1; }).find("residual_length"), std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) { x.storage_dtype = DType::F32; }).find("storage_dtype"), std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) { x.step = 0; }).find("step"), std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) { x.fused_sdpa_max_ctx = 0; }).find("fused_sdpa_max_ctx"), std::string::npos);
  EXPECT_NE(bad([](KVCacheConfig& x) { x.head_dim = 0; }).find("head_dim must be >= 1"), std::string::npos);
}

TEST(CacheFactory, BuildsEachKindAndRefusesCudaWithoutIt) {
  auto fp = KVCacheFactory::create(fp16_config());
  EXPECT_EQ(fp->class_name(), "KVCache");
  auto vq = KVCacheFactory::create(vq_config(CacheMode::MemoryBound));
  EXPECT_EQ(vq->class_name(), "VecInferKVCache");
  auto* acc = dynamic_cast<VecInferAccounting*>(vq.get());
  ASSERT_NE(acc, nullptr);
  EXPECT_EQ(acc->mode(), CacheMode::MemoryBound);
  EXPECT_TRUE(acc->uses_random_codebooks());
  EXPECT_NE(vq->describe().find("RANDOM CODEBOOKS"), std::string::npos) << vq->describe();
  KVCacheConfig bad = vq_config(CacheMode::Stash);
  bad.key_sub_dim = 3;
  EXPECT_THROW(KVCacheFactory::create(bad), ValueError);
#if !defined(VQ_HAVE_CUDA)
  KVCacheConfig cu = vq_config(CacheMode::Stash);
  cu.device = Device::cuda(0);
  EXPECT_THROW(KVCacheFactory::create(cu), CudaError);
#endif
}

TEST(FP16Cache, FetchGrowTrimAndAccounting) {
  std::mt19937_64 rng(1);
  FP16KVCache c(fp16_config(64, 16));
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(c.nbytes(), 0);
  KV a = random_kv(2, 3, 5, 64, DType::F32, true, rng);
  auto [k, v] = c.update_and_fetch(a.k.view, a.v.view);
  EXPECT_EQ(k.sizes(), (Shape{2, 3, 5, 64}));
  EXPECT_EQ(k.dtype(), DType::F16);
  const std::vector<float> in = values_of(a.k.view), got = values_of(k.view());
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(got[i], round_to_half(in[i])) << i;
  EXPECT_EQ(c.capacity(), 16);
  EXPECT_EQ(c.nbytes(), 2 * 2 * 3 * 16 * 64 * 2);
  KV b = random_kv(2, 3, 20, 64, DType::F16, false, rng);
  c.update(b.k.view, b.v.view);
  EXPECT_EQ(c.offset(), 25);
  EXPECT_EQ(c.capacity(), 32);  // grown to a multiple of step
  EXPECT_EQ(c.nbytes(), 2 * 2 * 3 * 32 * 64 * 2);
  EXPECT_EQ(c.trim(4), 4);
  EXPECT_EQ(c.offset(), 21);
  EXPECT_EQ(c.trim(100), 21);
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(c.nbytes(), 2 * 2 * 3 * 32 * 64 * 2);  // trim keeps the capacity
  EXPECT_THROW(c.trim(-1), ValueError);
  EXPECT_THROW(c.merge({&c}), UnsupportedError);
}

TEST(FP16Cache, FusedSdpaMatchesOracleOverHeldKV) {
  std::mt19937_64 rng(2);
  FP16KVCache c(fp16_config(128, 16));
  KV a = random_kv(1, 2, 70, 128, DType::F32, false, rng);
  c.update(a.k.view, a.v.view);
  Tensor4 q = random_tensor4({1, 8, 3, 128}, DType::BF16, true, rng);
  for (bool causal : {true, false}) {
    SdpaParams p;
    p.causal = causal;
    p.sliding_window = causal ? 20 : 0;
    const Tensor out = c.fused_sdpa(q.view, p);
    EXPECT_EQ(out.dtype(), DType::BF16);
    Tensor4 ref = make_tensor4({1, 8, 3, 128}, DType::BF16, false);
    attention_ref(q.view, c.keys_view(), c.values_view(), ref.view, p);
    EXPECT_LE(nmse(values_of(out.view()), values_of(ref.view)), attention_tolerance(DType::BF16));
  }
  Tensor4 q5 = random_tensor4({1, 5, 1, 128}, DType::F16, false, rng);
  const std::string e = error_of([&] { c.fused_sdpa(q5.view, SdpaParams{}); });
  EXPECT_NE(e.find("n_kv_heads=2"), std::string::npos) << e;
}

TEST(FP16Cache, StateRoundTripAndFromState) {
  std::mt19937_64 rng(3);
  FP16KVCache c(fp16_config(64, 16));
  KV a = random_kv(1, 2, 37, 64, DType::F16, false, rng);
  c.update(a.k.view, a.v.view);
  c.trim(3);
  auto d = FP16KVCache::from_state(c.state(), c.meta_state());
  EXPECT_EQ(snapshot(*d), snapshot(c));
  KV b = random_kv(1, 2, 9, 64, DType::F32, false, rng);
  c.update(b.k.view, b.v.view);
  d->update(b.k.view, b.v.view);
  Tensor4 q = random_tensor4({1, 4, 1, 64}, DType::F16, false, rng);
  EXPECT_TRUE(bit_equal(sdpa_values(c, q.view, SdpaParams{}), sdpa_values(*d, q.view, SdpaParams{})));
  EXPECT_EQ(snapshot(*d), snapshot(c));
  // mlx_lm order: state, then meta_state, into a fresh cache.
  FP16KVCache e(fp16_config(64, 16));
  e.set_state(c.state());
  e.set_meta_state(c.meta_state());
  EXPECT_EQ(snapshot(e), snapshot(c));
  // Bad meta leaves the cache unchanged.
  const Snapshot before = snapshot(e);
  auto m = c.meta_state();
  m["offset"] = "7";
  EXPECT_THROW(e.restore(c.state(), m), FormatError);
  m = c.meta_state();
  m["class"] = "QuantizedKVCache";
  EXPECT_THROW(e.restore(c.state(), m), FormatError);
  EXPECT_EQ(snapshot(e), before);
}

// As VecInferCache.RestoreRefusesSizesNoMachineHolds: capacity, step and batch from
// meta_state are checked before they are allocated.
TEST(FP16Cache, RestoreRefusesSizesNoMachineHolds) {
  KVCacheConfig cfg;
  cfg.kind = CacheKind::FP16;
  cfg.head_dim = 16;
  FP16KVCache c(cfg);
  const Tensor k = Tensor::zeros({2, 3, 4, 16}, DType::F32);
  c.update(k.view(), k.view());
  c.trim(4);
  const CacheState s = c.state();
  const CacheMetaState m = c.meta_state();
  EXPECT_NO_THROW(FP16KVCache::from_state(s, m));
  for (auto [key, value] : {std::pair<std::string, std::string>{"capacity", std::to_string(int64_t(1) << 40)},
                            {"capacity", std::to_string(int64_t(1) << 62)},
                            {"batch", std::to_string(int64_t(1) << 40)},
                            {"step", std::to_string(std::numeric_limits<int64_t>::max())},
                            {"head_dim", std::to_string((int64_t(1) << 32) + 16)}}) {
    auto m2 = m;
    m2[key] = value;
    if (key == "step") m2.erase("capacity");
    EXPECT_THROW(c.restore(s, m2), FormatError) << key << "=" << value;
    EXPECT_EQ(c.batch(), 2);
    EXPECT_EQ(c.meta_state(), m);
  }
}

TEST(FP16Cache, BadUpdatesThrowAndLeaveTheCacheUnchanged) {
  std::mt19937_64 rng(4);
  FP16KVCache c(fp16_config(64, 16));
  KV a = random_kv(1, 2, 10, 64, DType::F16, false, rng);
  c.update(a.k.view, a.v.view);
  const Snapshot before = snapshot(c);
  KV wrong_dim = random_kv(1, 2, 3, 32, DType::F16, false, rng);
  std::string e = error_of([&] { c.update(wrong_dim.k.view, wrong_dim.v.view); });
  EXPECT_NE(e.find("head_dim=64"), std::string::npos) << e;
  EXPECT_NE(e.find("[1, 2, 3, 32]"), std::string::npos) << e;
  KV wrong_heads = random_kv(1, 3, 3, 64, DType::F16, false, rng);
  e = error_of([&] { c.update(wrong_heads.k.view, wrong_heads.v.view); });
  EXPECT_NE(e.find("n_kv_heads=2"), std::string::npos) << e;
  KV wrong_batch = random_kv(2, 2, 3, 64, DType::F16, false, rng);
  EXPECT_THROW(c.update(wrong_batch.k.view, wrong_batch.v.view), ShapeError);
  KV nan = random_kv(1, 2, 3, 64, DType::F32, false, rng);
  set_elem(nan.v.view, off(nan.v.view, 0, 1, 2, 5), NAN);
  e = error_of([&] { c.update(nan.k.view, nan.v.view); });
  EXPECT_NE(e.find("values[0][1][2][5] is nan"), std::string::npos) << e;
  Tensor ints = Tensor::zeros({1, 2, 3, 64}, DType::I32);
  EXPECT_THROW(c.update(ints.view(), ints.view()), ShapeError);
  EXPECT_EQ(snapshot(c), before);
}
