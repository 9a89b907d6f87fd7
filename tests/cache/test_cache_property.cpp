// tests/cache/test_cache_property.cpp — property test: random sequences of update,
// update_and_fetch, trim, state save/restore and fused_sdpa, checked step by step against
// CacheModel (the same tokens kept in f32, offset/residual_count by the documented rules).
//
// Checked after every step: offset and residual_count; what attention sees
// (dequantized_keys/values_f32) bit for bit against the model; fetched K̂/V̂ bit for bit; the
// byte counters exactly per token; fused_sdpa against attention_ref over the model's K̂/V̂
// (bounded tier); a save/restore step swaps the cache for a restored copy, so the rest of the
// sequence also checks that the copy behaves the same. The seed is printed on failure.
#include <gtest/gtest.h>

#include "cache/cache_test_util.h"
#include "veloxquant/error.h"

using namespace veloxquant;
using namespace vq_test;

namespace {

void run_sequence(CacheMode mode, uint64_t seed) {
  SCOPED_TRACE("mode=" + std::string(cache_mode_name(mode)) + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t R = int64_t(rng() % 3) * 6;  // 0, 6 or 12
  const int64_t D = 64, B = 1 + int64_t(rng() % 2), H = 2;
  KVCacheConfig cf = vq_config(mode, int(D), int(R), rng() % 2 ? 8 : 6, 4, rng() % 2 ? 8 : 5, 8);
  cf.step = 8;
  auto cache = std::make_unique<VecInferKVCache>(cf);
  CacheModel model;
  model.residual_length = R;
  const DType dts[] = {DType::F16, DType::BF16, DType::F32};
  for (int step = 0; step < 40; ++step) {
    SCOPED_TRACE("step=" + std::to_string(step));
    const int op = int(rng() % 10);
    if (op <= 3 || model.offset == 0) {  // update or update_and_fetch
      const int64_t n = 1 + int64_t(rng() % (rng() % 4 == 0 ? 30 : 4));
      KV a = random_kv(B, H, n, D, dts[rng() % 3], rng() % 2 == 0, rng);
      model.append(a.k.view, a.v.view);
      if (mode != CacheMode::MemoryBound && op % 2 == 0) {
        auto [k, v] = cache->update_and_fetch(a.k.view, a.v.view);
        ASSERT_TRUE(bit_equal(values_of(k.view()), model.expected(true, *cache, true)));
        ASSERT_TRUE(bit_equal(values_of(v.view()), model.expected(false, *cache, true)));
      } else {
        cache->update(a.k.view, a.v.view);
      }
    } else if (op <= 5) {  // trim
      const int64_t n = int64_t(rng() % uint64_t(model.offset + 3));
      ASSERT_EQ(cache->trim(n), model.trim(n));
    } else if (op == 6) {  // save / restore into a fresh cache of another configuration
      auto fresh = std::make_unique<VecInferKVCache>(vq_config(CacheMode::Standard, 128, 3, 4, 4, 4, 4));
      if (rng() % 2) {
        fresh->restore(cache->state(), cache->meta_state());
      } else {
        fresh->set_state(cache->state());
        fresh->set_meta_state(cache->meta_state());
      }
      ASSERT_EQ(snapshot(*fresh), snapshot(*cache));
      cache = std::move(fresh);
    } else {  // fused_sdpa
      const int64_t group = int64_t(1) << (rng() % 3);
      const int64_t q_len = 1 + int64_t(rng() % uint64_t(std::min<int64_t>(model.offset, 5)));
      Tensor4 q = random_tensor4({B, H * group, q_len, D}, dts[rng() % 3], rng() % 2 == 0, rng);
      SdpaParams p;
      p.causal = rng() % 4 != 0;
      p.sliding_window = rng() % 3 == 0 ? 1 + int64_t(rng() % 20) : 0;
      const Tensor out = cache->fused_sdpa(q.view, p);
      const bool rounded = mode == CacheMode::Standard;
      const Shape s{B, H, model.offset, D};
      const Tensor k = tensor_of(model.expected(true, *cache, rounded), s);
      const Tensor v = tensor_of(model.expected(false, *cache, rounded), s);
      Tensor4 ref = make_tensor4(q.view.sizes(), q.view.dtype, false);
      attention_ref(q.view, k.view(), v.view(), ref.view, p);
      ASSERT_LE(nmse(values_of(out.view()), values_of(ref.view)), attention_tolerance(q.view.dtype));
    }
    ASSERT_EQ(cache->offset(), model.offset);
    ASSERT_EQ(cache->residual_count(), model.rc);
    if (model.offset > 0) {
      const bool rounded = mode == CacheMode::Standard;
      ASSERT_TRUE(bit_equal(values_of(cache->dequantized_keys_f32().view()), model.expected(true, *cache, rounded)));
      ASSERT_TRUE(bit_equal(values_of(cache->dequantized_values_f32().view()), model.expected(false, *cache, rounded)));
    }
    const int64_t kcb = cache->key_quantizer().code_bytes, vcb = cache->value_quantizer().code_bytes;
    const int64_t coded = mode == CacheMode::Standard ? model.rc : model.offset;
    const int64_t fp = mode == CacheMode::MemoryBound ? model.rc : model.offset;
    ASSERT_EQ(cache->compressed_key_bytes(), B * H * coded * kcb);
    ASSERT_EQ(cache->compressed_value_bytes(), B * H * coded * vcb);
    ASSERT_EQ(cache->fp16_key_bytes(), B * H * fp * D * 2);
    ASSERT_EQ(cache->fp16_value_bytes(), B * H * fp * D * 2);
    ASSERT_GE(cache->capacity(), model.offset);
    ASSERT_EQ(cache->capacity() % 8, 0);
  }
}

}  // namespace

TEST(CacheProperty, RandomSequencesStandard) {
  for (uint64_t s = 1; s <= 6; ++s) run_sequence(CacheMode::Standard, 100 + s);
}
TEST(CacheProperty, RandomSequencesStash) {
  for (uint64_t s = 1; s <= 6; ++s) run_sequence(CacheMode::Stash, 200 + s);
}
TEST(CacheProperty, RandomSequencesMemoryBound) {
  for (uint64_t s = 1; s <= 6; ++s) run_sequence(CacheMode::MemoryBound, 300 + s);
}
