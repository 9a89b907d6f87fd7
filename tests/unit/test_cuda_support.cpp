// cuda_support / cuda_attention_configs (veloxquant/cuda_cache.h): what a CUDA cache of a given
// configuration would run, answered on the host with no GPU (CI has none). In a CUDA build the
// answers are checked rule by rule over a grid of head_dims, quantizer specs, modes and codebook
// formats against the compiled list; tests/cuda checks on a GPU that KVCacheFactory::create and
// fused_sdpa agree with them (CudaCache.CreateAndAttentionAgreeWithCudaSupport).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "veloxquant/cuda_cache.h"
#include "veloxquant/error.h"

namespace {

using namespace veloxquant;

KVCacheConfig config(CacheKind kind, int head_dim, PQSpec k, PQSpec v, CacheMode mode, CodebookFormat f) {
  KVCacheConfig c;
  c.kind = kind;
  c.head_dim = head_dim;
  c.key_sub_dim = k.sub_dim, c.key_codebook_bits = k.codebook_bits;
  c.value_sub_dim = v.sub_dim, c.value_codebook_bits = v.codebook_bits;
  c.fused_sdpa = mode != CacheMode::Standard;
  c.fused_sdpa_memory_bound = mode == CacheMode::MemoryBound;
  c.attention_codebooks = f;
  return c;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

#if defined(VQ_HAVE_CUDA) && VQ_HAVE_CUDA

std::string name(PQSpec k, PQSpec v, int head_dim, CodebookFormat f) {
  const char* suffix[] = {"", "+e4m3", "+i8", "+i8kv"};
  return k.str() + "/" + v.str() + "@" + std::to_string(head_dim) + suffix[static_cast<int>(f)];
}

TEST(CudaSupport, TheCompiledListHoldsTheDefaultBuildsConfigurations) {
  const std::vector<std::string> list = cuda_attention_configs();
  EXPECT_TRUE(std::is_sorted(list.begin(), list.end()));
  EXPECT_EQ(std::adjacent_find(list.begin(), list.end()), list.end()) << "duplicates";
  // the default build: d4b8/d4b8 and the defaults d4b12/d8b8, head_dim 64 and 128, every format
  for (PQSpec k : {PQSpec{4, 8}, PQSpec{4, 12}})
    for (int D : {64, 128})
      for (CodebookFormat f : {CodebookFormat::F16, CodebookFormat::E4M3, CodebookFormat::I8, CodebookFormat::I8KV}) {
        const PQSpec v = k.codebook_bits == 8 ? PQSpec{4, 8} : PQSpec{8, 8};
        const std::string n = name(k, v, D, f);
        EXPECT_NE(std::find(list.begin(), list.end(), n), list.end()) << n << " missing from the compiled list";
      }
}

// Every answer follows the rule the constructors apply: head_dim 64/128/256 or a plain-kernel head
// dim, sub_dim 4 or 8 and codebooks of >= 16 centroids for VecInfer, and an attention kernel (the
// configuration's own in the fused modes, d4b8/d4b8's fp16 one for the fp16 cache and the
// standard mode). Since the plain kernel serves every head dim (a tuned kernel or not), every
// d4/d8 configuration of 4 to 12 bits has one in every build; 13 bits has none. The reason names
// what is missing.
TEST(CudaSupport, AnswersFollowTheConstructorsRuleOverAGrid) {
  const std::vector<std::string> list = cuda_attention_configs();
  auto compiled = [&](const std::string& n) { return std::find(list.begin(), list.end(), n) != list.end(); };
  const std::vector<std::pair<PQSpec, PQSpec>> specs = {
      {{4, 8}, {4, 8}},  {{4, 12}, {8, 8}}, {{8, 12}, {8, 12}}, {{4, 10}, {8, 12}},
      {{8, 8}, {8, 8}},  {{2, 8}, {4, 8}},  {{4, 8}, {16, 8}},  {{4, 3}, {4, 8}},  {{4, 13}, {4, 8}}};
  int cases = 0, runs = 0, refused = 0, no_attention = 0;
  for (int D : {64, 80, 96, 112, 128, 160, 192, 256, 48})
    for (const auto& [ks, vs] : specs)
      for (CacheMode mode : {CacheMode::MemoryBound, CacheMode::Stash, CacheMode::Standard})
        for (CodebookFormat f : {CodebookFormat::F16, CodebookFormat::E4M3, CodebookFormat::I8, CodebookFormat::I8KV}) {
          const KVCacheConfig c = config(CacheKind::VecInfer, D, ks, vs, mode, f);
          SCOPED_TRACE(name(ks, vs, D, f) + " " + cache_mode_name(mode));
          const CudaSupport s = cuda_support(c);
          ++cases;
          EXPECT_TRUE(s.built);
          EXPECT_GE(s.devices, 0);
          // head_dim 80, 96, 112, 160 and 192: the plain kernel alone; 64, 128 and 256: a tuned
          // kernel where one is compiled (cuda_attention_configs lists those), else the plain one:
          // every d4/d8 configuration of 4 to 12 bits in every format; 48 has no kernel
          const bool plain = D == 80 || D == 96 || D == 112 || D == 160 || D == 192;
          const bool dims_ok = D == 64 || D == 128 || D == 256 || plain;
          const bool subs_ok = (ks.sub_dim == 4 || ks.sub_dim == 8) && (vs.sub_dim == 4 || vs.sub_dim == 8);
          const bool bits_ok = ks.codebook_bits >= 4 && vs.codebook_bits >= 4;
          const bool fused = mode != CacheMode::Standard;
          const std::string kernel = fused ? name(ks, vs, D, f) : name({4, 8}, {4, 8}, D, CodebookFormat::F16);
          const bool has_kernel = !fused || (ks.codebook_bits <= 12 && vs.codebook_bits <= 12);
          if (!plain && compiled(kernel)) EXPECT_TRUE(has_kernel) << "a tuned kernel is listed";
          const bool want_cache = dims_ok && subs_ok && bits_ok && (!fused || has_kernel);
          const bool want_attention = want_cache && has_kernel;
          EXPECT_EQ(s.cache, want_cache) << s.reason;
          EXPECT_EQ(s.attention, want_attention) << s.reason;
          EXPECT_EQ(s.reason.empty(), want_attention) << s.reason;
          if (!s.attention) EXPECT_FALSE(s.prefill_kernel);
          // tuned: the listed kernels (at 64, 128 and 256), never at the plain kernel's own dims
          EXPECT_EQ(s.tuned_kernel, s.attention && !plain && compiled(kernel)) << s.kernel;
          if (s.cache) EXPECT_EQ(s.kernel, kernel);
          else EXPECT_TRUE(s.kernel.empty());
          if (!dims_ok) EXPECT_TRUE(has(s.reason, "head_dim " + std::to_string(D))) << s.reason;
          else if (!subs_ok) EXPECT_TRUE(has(s.reason, "sub_dim must be 4 or 8")) << s.reason;
          else if (!bits_ok) EXPECT_TRUE(has(s.reason, "fewer than 16 centroids")) << s.reason;
          else if (!want_attention) {
            EXPECT_TRUE(has(s.reason, "has no kernel")) << s.reason;
            EXPECT_TRUE(has(s.reason, "4 to 12 bits")) << s.reason;  // the plain kernel's range, listed
          }
          runs += s.attention, refused += !s.cache, no_attention += s.cache && !s.attention;
        }
  // the grid reaches runs and refusals; a cache built without attention no longer exists (the
  // standard mode's exact-row kernel is served at every head dim, 256 by the plain kernel)
  EXPECT_GT(runs, 0);
  EXPECT_GT(refused, 0);
  EXPECT_EQ(no_attention, 0);
  std::printf("cuda_support grid: %d cases, %d run, %d refused, %d built without attention\n", cases, runs, refused,
              no_attention);
}

TEST(CudaSupport, Fp16CacheAndTheDefaultsAndInvalidConfigs) {
  // the fp16 cache: any head_dim the kernels take; its attention is d4b8/d4b8's fp16 path
  const CudaSupport f128 = cuda_support(config(CacheKind::FP16, 128, {}, {}, CacheMode::Standard, CodebookFormat::F16));
  EXPECT_TRUE(f128.cache && f128.attention) << f128.reason;
  EXPECT_EQ(f128.kernel, "d4b8/d4b8@128");
  EXPECT_TRUE(f128.prefill_kernel);
  // head_dim 96 (and 80): the plain kernel; prompts on the exact-rows prefill kernel
  const CudaSupport f96 = cuda_support(config(CacheKind::FP16, 96, {}, {}, CacheMode::Standard, CodebookFormat::F16));
  EXPECT_TRUE(f96.cache && f96.attention) << f96.reason;
  EXPECT_EQ(f96.kernel, "d4b8/d4b8@96");
  EXPECT_TRUE(f96.prefill_kernel);
  EXPECT_FALSE(f96.prefill_over_rows);
  // the plain kernel's head dims: a memory-bound VecInfer cache has no prefill kernel over its
  // codes; at 80 and 96 its prompts go over its tokens expanded into rows. 112, 160 and 192 have
  // no prefill kernel at all (prompts as the plain kernel's row chunks), neither over a Standard
  // cache's rows nor over a memory-bound cache's expanded tokens
  for (int D : {80, 96, 112, 160, 192}) {
    const bool exact_rows = D == 80 || D == 96;
    if (!exact_rows) {
      const CudaSupport f = cuda_support(config(CacheKind::FP16, D, {}, {}, CacheMode::Standard, CodebookFormat::F16));
      EXPECT_TRUE(f.cache && f.attention) << D << ": " << f.reason;
      EXPECT_EQ(f.kernel, "d4b8/d4b8@" + std::to_string(D));
      EXPECT_FALSE(f.prefill_kernel) << D;
    }
    KVCacheConfig v;
    v.fused_sdpa = v.fused_sdpa_memory_bound = true;
    v.head_dim = D;
    const CudaSupport sv = cuda_support(v);
    EXPECT_TRUE(sv.cache && sv.attention) << D << ": " << sv.reason;
    EXPECT_FALSE(sv.prefill_kernel) << D;
    EXPECT_EQ(sv.prefill_over_rows, exact_rows) << D;
  }
  const CudaSupport f48 = cuda_support(config(CacheKind::FP16, 48, {}, {}, CacheMode::Standard, CodebookFormat::F16));
  EXPECT_FALSE(f48.cache);
  EXPECT_EQ(f48.reason, "CUDA FP16 cache: head_dim 48 is not supported (64, 128, 256, 80, 96, 112, 160, 192)");
  // head_dim 256 (Gemma's): the cache and its attention, on the tuned kernel where one is compiled
  // (VQ_CUDA_ALL_CONFIGS builds), else on the plain kernel; prompts on the exact-rows prefill
  // kernel only where the tuned d4b8/d4b8@256 is compiled
  const CudaSupport f256 = cuda_support(config(CacheKind::FP16, 256, {}, {}, CacheMode::Standard, CodebookFormat::F16));
  const std::vector<std::string> list = cuda_attention_configs();
  const bool has256 = std::find(list.begin(), list.end(), "d4b8/d4b8@256") != list.end();
  EXPECT_TRUE(f256.cache && f256.attention) << f256.reason;
  EXPECT_EQ(f256.kernel, "d4b8/d4b8@256");
  if (!has256) EXPECT_FALSE(f256.prefill_kernel);
  // the paper's d8b12/d8b12 at head_dim 128, and 13-bit codebooks (no kernel in any build)
  KVCacheConfig p8 = config(CacheKind::VecInfer, 128, {8, 12}, {8, 12}, CacheMode::MemoryBound, CodebookFormat::I8);
  const CudaSupport s8 = cuda_support(p8);
  EXPECT_TRUE(s8.cache && s8.attention) << s8.reason;
  EXPECT_EQ(s8.kernel, "d8b12/d8b12@128+i8");
  EXPECT_EQ(s8.tuned_kernel, std::find(list.begin(), list.end(), "d8b12/d8b12@128+i8") != list.end());
  p8.key_codebook_bits = 13;
  const CudaSupport s13 = cuda_support(p8);
  EXPECT_FALSE(s13.cache);
  EXPECT_EQ(s13.reason.rfind("CUDA VecInfer cache: attention for keys d8b13, values d8b12 at head_dim 128 with i8 "
                             "codebooks has no kernel (built: ",
                             0),
            0u)
      << s13.reason;
  // the paper's defaults as a memory-bound cache with int8 keys (the CUDA default): prefill kernel too
  KVCacheConfig d;
  d.fused_sdpa = d.fused_sdpa_memory_bound = true;
  const CudaSupport sd = cuda_support(d);
  EXPECT_TRUE(sd.cache && sd.attention) << sd.reason;
  EXPECT_EQ(sd.kernel, "d4b12/d8b8@128+i8");
  EXPECT_TRUE(sd.prefill_kernel);
  // its prompt chunks go over the tokens expanded into rows while the workspace limit allows it;
  // the fp16 cache's rows are exact already, and stash caches keep the kernel over the codes
  EXPECT_TRUE(sd.prefill_over_rows);
  EXPECT_FALSE(f128.prefill_over_rows);
  KVCacheConfig st = d;
  st.fused_sdpa_memory_bound = false;
  ASSERT_EQ(st.mode(), CacheMode::Stash);
  EXPECT_FALSE(cuda_support(st).prefill_over_rows);
  const int64_t prev = set_cuda_prefill_workspace_limit(0);
  EXPECT_EQ(cuda_prefill_workspace_limit(), 0);
  EXPECT_FALSE(cuda_support(d).prefill_over_rows);
  set_cuda_prefill_workspace_limit(prev);
  EXPECT_TRUE(cuda_support(d).prefill_over_rows);
  EXPECT_THROW(set_cuda_prefill_workspace_limit(-1), ValueError);
  // a config KVCacheConfig::validate rejects is reported, not thrown
  KVCacheConfig bad = d;
  bad.head_dim = 130;  // not a multiple of the key sub_dim 4
  CudaSupport sb;
  EXPECT_NO_THROW(sb = cuda_support(bad));
  EXPECT_FALSE(sb.cache || sb.attention);
  EXPECT_TRUE(has(sb.reason, "invalid configuration")) << sb.reason;
}

#else  // a build without CUDA answers no, for everything

TEST(CudaSupport, ABuildWithoutCudaSaysSo) {
  EXPECT_FALSE(cuda_is_available());
  EXPECT_TRUE(cuda_attention_configs().empty());
  const CudaSupport s = cuda_support(KVCacheConfig{});
  EXPECT_FALSE(s.built || s.cache || s.attention || s.prefill_kernel || s.prefill_over_rows);
  EXPECT_EQ(cuda_prefill_workspace_limit(), 0);
  EXPECT_EQ(set_cuda_prefill_workspace_limit(1 << 20), 0);  // no effect without CUDA
  EXPECT_THROW(set_cuda_prefill_workspace_limit(-1), ValueError);
  EXPECT_EQ(s.devices, 0);
  EXPECT_TRUE(has(s.reason, "built without CUDA")) << s.reason;
}

#endif

}  // namespace
