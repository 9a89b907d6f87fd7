// tests/cuda/test_cuda_cache.cpp — the CUDA kernels against the CPU oracles, through the
// device caches (label `cuda`; every test skips with a message where no GPU is present).
//
// Tolerance tiers:
//  * exact: codes (the encoder reproduces the CPU oracle's nearest-centroid rule; a mismatch
//    is accepted only where the two centroids' oracle distances tie to 1e-6 relative, and the
//    count is printed), window rows, fetched K̂/V̂, states;
//  * bounded: attention outputs by NMSE against vecinfer_attention_ref / attention_ref
//    (double). The kernel runs q̃, centroids and P in fp16 on tensor cores with fp32
//    accumulation and softmax: per-score errors ~1e-3, so NMSE stays near 1e-6; the bound
//    kAttnNmse = 2e-4 leaves two orders of margin and still catches any indexing error
//    (a wrong token or dimension gives NMSE ~ 1).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>

#include "core/pq_internal.h"
#include "cuda_test_util.h"
#include "veloxquant/attention.h"
#include "veloxquant/error.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/vecinfer_cache.h"

namespace vq_cuda_test {
namespace {

constexpr double kAttnNmse = 2e-4;

const std::vector<Spec>& all_specs() {
  static const std::vector<Spec> s = {{4, 8, 4, 8}, {4, 12, 8, 8}, {8, 12, 8, 12}, {4, 10, 8, 12}, {8, 8, 8, 8}};
  return s;
}

std::unique_ptr<KVCache> make_cuda(const KVCacheConfig& c) { return KVCacheFactory::create(on_cuda(c)); }

/// Two states hold the same named tensors, byte for byte (host or device tensors).
void expect_same_state(const CacheState& sa, const CacheState& sb, const std::string& what = "") {
  ASSERT_EQ(sa.size(), sb.size()) << what;
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first) << what;
    const Tensor x = to_host(sa[i].second), y = to_host(sb[i].second);
    ASSERT_EQ(x.sizes(), y.sizes()) << what << ": " << sa[i].first;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), size_t(x.nbytes())), 0) << what << ": " << sa[i].first << " differs";
  }
}

CudaKVCache* as_cuda(KVCache* c) {
  auto* p = dynamic_cast<CudaKVCache*>(c);
  EXPECT_NE(p, nullptr);
  return p;
}

/// Counts code mismatches between two caches' codes, failing on any that is not a near tie.
/// x: the f32 (transformed, for keys) vectors [bh, n, D] the codes were computed from.
int check_codes(const Tensor& got, const Tensor& want, const std::vector<float>& x, const ProductQuantizer& pq,
                const std::string& what) {
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  if (got.sizes() != want.sizes()) return -1;
  const int64_t rows = got.numel() / pq.code_bytes;
  std::vector<uint32_t> a(size_t(rows * pq.n_sub)), b(a.size());
  unpack_codes(got.ptr<uint8_t>(), rows, pq.n_sub, pq.codebook_bits, a.data());
  unpack_codes(want.ptr<uint8_t>(), rows, pq.n_sub, pq.codebook_bits, b.data());
  int ties = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int m = 0; m < pq.n_sub; ++m) {
      const size_t i = size_t(r * pq.n_sub + m);
      if (a[i] == b[i]) continue;
      const float* xm = x.data() + r * pq.head_dim + m * pq.sub_dim;
      const float da = detail::pq_sub_distance_ref(xm, pq.codebook.data() + size_t(a[i]) * pq.sub_dim, pq.sub_dim);
      const float db = detail::pq_sub_distance_ref(xm, pq.codebook.data() + size_t(b[i]) * pq.sub_dim, pq.sub_dim);
      EXPECT_LE(std::fabs(da - db), 1e-6f * std::max(db, 1e-30f))
          << what << ": row " << r << " sub " << m << ": cuda code " << a[i] << " (dist " << da << "), cpu code "
          << b[i] << " (dist " << db << ")";
      ++ties;
    }
  return ties;
}

/// f32 rows [bh, n, D] of a [B, H, n, D] tensor, keys transformed as the cache does.
std::vector<float> encoder_inputs(const Tensor& kv, const KeyTransform* tf) {
  Tensor f = Tensor::to_f32(kv.view());
  std::vector<float> x(f.ptr<float>(), f.ptr<float>() + f.numel());
  if (tf) {
    const int64_t H = kv.dim(1), n = kv.dim(2), D = kv.dim(3);
    for (int64_t bh = 0; bh < kv.dim(0) * H; ++bh) tf->forward_keys(x.data() + bh * n * D, n, int(bh % H));
  }
  return x;
}

// ------------------------------------------------------------------------------------------
TEST(CudaEncode, CodesAndWindowMatchTheCpuCache) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0xC0DE5;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  int total_ties = 0, cases = 0;
  for (const Spec& s : all_specs())
    for (int D : {64, 128, 256, 80, 96, 112, 160, 192}) {
      if (!runs_on_cuda(s, D)) continue;  // (every one since the plain kernel serves 64, 128 and 256 too)
      for (CacheMode mode : {CacheMode::MemoryBound, CacheMode::Stash}) {
        const int B = 1 + int(rng() % 2), H = 1 + int(rng() % 3), R = int(rng() % 3) * 8;
        SCOPED_TRACE(s.str() + " D=" + std::to_string(D) + " mode=" + cache_mode_name(mode) +
                     " B=" + std::to_string(B) + " H=" + std::to_string(H) + " R=" + std::to_string(R));
        KVCacheConfig c = vq_config(s, mode, D, R, H, rng);
        VecInferKVCache cpu(c);
        auto gpu = make_cuda(c);
        for (int64_t n : {int64_t(37), int64_t(1), int64_t(5)}) {
          Tensor k = random_tensor({B, H, n, D}, DType::F32, rng, 2.0f);
          Tensor v = random_tensor({B, H, n, D}, DType::F16, rng);
          cpu.update(k.view(), v.view());
          gpu->update(to_device(k).view(), to_device(v).view());
          // codes of this update: compare the tail of the states
          const CacheState sc = cpu.state(), sg = gpu->state();
          auto find = [](const CacheState& st, const char* name) -> const Tensor* {
            for (const auto& [nm, t] : st)
              if (nm == name) return &t;
            return nullptr;
          };
          for (const char* name : {"key_codes", "value_codes"}) {
            const Tensor* a = find(sg, name);
            const Tensor* b = find(sc, name);
            ASSERT_TRUE(a && b) << name;
            // only the newest n tokens: slice [.., off-n .. off)
            const bool keys = name[0] == 'k';
            const ProductQuantizer& pq = keys ? cpu.key_quantizer() : cpu.value_quantizer();
            const int64_t off = cpu.offset();
            Tensor ga = Tensor::empty({B, H, n, pq.code_bytes}, DType::U8), gb = ga;
            gb = Tensor::empty({B, H, n, pq.code_bytes}, DType::U8);
            for (int64_t bh = 0; bh < B * H; ++bh) {
              std::memcpy(ga.ptr<uint8_t>() + bh * n * pq.code_bytes,
                          a->ptr<uint8_t>() + (bh * off + off - n) * pq.code_bytes, size_t(n * pq.code_bytes));
              std::memcpy(gb.ptr<uint8_t>() + bh * n * pq.code_bytes,
                          b->ptr<uint8_t>() + (bh * off + off - n) * pq.code_bytes, size_t(n * pq.code_bytes));
            }
            const std::vector<float> x = encoder_inputs(keys ? k : v, keys ? &cpu.key_transform() : nullptr);
            const int t = check_codes(ga, gb, x, pq, name);
            ASSERT_GE(t, 0);
            total_ties += t;
          }
          for (const char* name : {"window_keys", "window_values", "keys", "values"}) {
            const Tensor* a = find(sg, name);
            const Tensor* b = find(sc, name);
            ASSERT_EQ(a == nullptr, b == nullptr) << name;
            if (!a) continue;
            ASSERT_EQ(a->sizes(), b->sizes()) << name;
            // held K̂/V̂ (Stash): window rows exact, older rows dequantized: equal unless a tie moved a code
            const std::vector<float> fa = a->to_vector_f32(), fb = b->to_vector_f32();
            int64_t diff = 0;
            for (size_t i = 0; i < fa.size(); ++i) diff += fa[i] != fb[i];
            EXPECT_LE(diff, int64_t(total_ties) * D) << name << ": " << diff << " elements differ";
          }
          ++cases;
        }
      }
    }
  std::printf("[cuda encode] %d updates compared, %d near-tie code differences\n", cases, total_ties);
}

// ------------------------------------------------------------------------------------------
struct AttnCase {
  Spec spec;
  int D, B, H, G, prefix, q_len, R;
  bool causal;
  int window;
  DType qdt;
  CacheMode mode;
  float scale;
};

/// The cache's storage dtype: a bf16 model keeps a bf16 cache, so cases with bf16 queries hold
/// their exact window (and Stash rows) in bf16 — the kernels' bf16 window paths (gathers, the
/// d8 values' movmatrix path) run in every test that draws such a case.
DType case_storage(const AttnCase& a) { return a.qdt == DType::BF16 ? DType::BF16 : DType::F16; }

std::string describe(const AttnCase& a) {
  std::ostringstream o;
  o << a.spec.str() << " D=" << a.D << " B=" << a.B << " Hkv=" << a.H << " G=" << a.G << " prefix=" << a.prefix
    << " q_len=" << a.q_len << " R=" << a.R << " causal=" << a.causal << " window=" << a.window
    << " q=" << dtype_name(a.qdt) << " store=" << dtype_name(case_storage(a)) << " mode=" << cache_mode_name(a.mode)
    << " kscale=" << a.scale;
  return o.str();
}

/// The oracle's inputs for a CUDA cache with codebook format fmt: the CPU cache's, with the
/// centroids the kernel holds (E4M3: make_e4m3_codebook's decoded values, kept in kq/vq;
/// int8 keys: make_i8_codebook's decoded keys and the int8-rounded query; int8 keys and values:
/// also make_i8_codebook's decoded values).
VecInferAttentionInputs oracle_inputs(const VecInferKVCache& cpu, CodebookFormat fmt, ProductQuantizer& kq,
                                      ProductQuantizer& vq) {
  VecInferAttentionInputs in = cpu.attention_inputs();
  if (fmt == CodebookFormat::E4M3) {
    kq = *in.key_pq, vq = *in.value_pq;
    kq.set_codebook(make_e4m3_codebook(kq.codebook).decoded);
    vq.set_codebook(make_e4m3_codebook(vq.codebook).decoded);
    in.key_pq = &kq;
    in.value_pq = &vq;
  } else if (fmt == CodebookFormat::I8 || fmt == CodebookFormat::I8KV) {
    kq = *in.key_pq;
    kq.set_codebook(make_i8_codebook(kq.codebook).decoded);
    in.key_pq = &kq;
    in.int8_query = true;
    if (fmt == CodebookFormat::I8KV) {
      vq = *in.value_pq;
      vq.set_codebook(make_i8_codebook(vq.codebook).decoded);
      in.value_pq = &vq;
    }
  }
  return in;
}

/// What a CUDA cache with codebook format fmt must return for fused_sdpa(q) (host q): the oracle on
/// the kernel's operands in the fused modes; in Standard mode (fp16 attention on the dequantized
/// history, no codebooks read) the CPU cache's own result.
std::vector<float> device_oracle(const VecInferKVCache& cpu, CodebookFormat fmt, const Tensor& q,
                                 const SdpaParams& p) {
  if (cpu.config().mode() == CacheMode::Standard) return floats(cpu.fused_sdpa(q.view(), p));
  Tensor want = Tensor::empty(q.sizes(), DType::F32);
  ProductQuantizer kq, vq;
  vecinfer_attention_ref(oracle_inputs(cpu, fmt, kq, vq), q.view(), want.view(), p);
  return want.to_vector_f32();
}

/// Runs one case: both caches get the same tokens (a prefix, then the q_len newest tokens);
/// the CUDA cache's attention is compared with the oracle on the CPU cache's codes. With E4M3
/// codebooks the oracle computes with the centroids the kernel holds (make_e4m3_codebook's
/// decoded values), and *vs_f32 (if given) receives the NMSE against the f32-codebook oracle.
/// A case's caches: the CUDA cache and, with_cpu, a CPU twin, both given the same tokens (a
/// prefix, then the q_len newest).
struct CaseCaches {
  std::unique_ptr<VecInferKVCache> cpu;
  std::unique_ptr<KVCache> gpu;
};
CaseCaches fill_case_caches(const AttnCase& a, std::mt19937_64& rng, bool with_cpu,
                            CodebookFormat fmt = CodebookFormat::F16) {
  KVCacheConfig c = vq_config(a.spec, a.mode, a.D, a.R, a.H, rng);
  c.attention_codebooks = fmt;
  c.storage_dtype = case_storage(a);
  CaseCaches cc;
  if (with_cpu) cc.cpu = std::make_unique<VecInferKVCache>(c);
  cc.gpu = make_cuda(c);
  for (int64_t n : {int64_t(a.prefix), int64_t(a.q_len)}) {
    if (n == 0) continue;
    Tensor k = random_tensor({a.B, a.H, n, a.D}, DType::F32, rng, a.scale);
    Tensor v = random_tensor({a.B, a.H, n, a.D}, DType::F32, rng);
    if (cc.cpu) cc.cpu->update(k.view(), v.view());
    cc.gpu->update(to_device(k).view(), to_device(v).view());
  }
  return cc;
}

/// One attention case for comparisons against the oracle (device_oracle, codebook format fmt): the
/// filled caches (CPU and device), the device query, the SDPA parameters and the oracle's output.
struct OracleCase {
  CaseCaches cc;
  Tensor qd;
  SdpaParams sp;
  std::vector<float> ref;
};
OracleCase oracle_case(const AttnCase& a, std::mt19937_64& rng, CodebookFormat fmt) {
  OracleCase oc;
  oc.cc = fill_case_caches(a, rng, true, fmt);
  Tensor q = random_tensor({a.B, a.H * a.G, a.q_len, a.D}, a.qdt, rng);
  oc.sp.causal = a.causal;
  oc.sp.sliding_window = a.window;
  oc.ref = device_oracle(*oc.cc.cpu, fmt, q, oc.sp);
  oc.qd = to_device(q);
  return oc;
}

/// fused_sdpa of an oracle case with a process-wide kernel switch (attn_set_rows4,
/// attn_set_window_first, ...) on, then off, the switch restored after: both outputs and the
/// launches its counter saw with it on; with it off the counter must not move.
struct SwitchedOutputs {
  std::vector<float> on, off;
  long long launches_on = 0;
  double nmse_on = 0, nmse_off = 0, nmse_between = 0;  ///< against the oracle, and against each other
};
/// The worst NMSEs over a test's switched cases (against the oracle, between the two outputs).
struct SwitchedWorst {
  int cases = 0;
  double oracle = 0, between = 0;
  void add(const SwitchedOutputs& r) {
    ++cases;
    oracle = std::max({oracle, r.nmse_on, r.nmse_off});
    between = std::max(between, r.nmse_between);
  }
};
SwitchedOutputs with_and_without(bool (*set)(bool), long long (*count)(), const OracleCase& oc, const char* what) {
  SwitchedOutputs r;
  const bool prev = set(true);
  const long long before = count();
  r.on = floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp));
  r.launches_on = count() - before;
  set(false);
  r.off = floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp));
  EXPECT_EQ(count(), before + r.launches_on) << what << ": launched with its switch off";
  set(prev);
  r.nmse_on = nmse(r.on, oc.ref), r.nmse_off = nmse(r.off, oc.ref), r.nmse_between = nmse(r.on, r.off);
  EXPECT_LE(r.nmse_on, kAttnNmse) << what << " on";
  EXPECT_LE(r.nmse_off, kAttnNmse) << what << " off";
  return r;
}

double run_attn_case(const AttnCase& a, std::mt19937_64& rng, CodebookFormat fmt = CodebookFormat::F16,
                     double* vs_f32 = nullptr) {
  CaseCaches cc = fill_case_caches(a, rng, true, fmt);
  VecInferKVCache& cpu = *cc.cpu;
  KVCache* const gpu = cc.gpu.get();
  Tensor q = random_tensor({a.B, a.H * a.G, a.q_len, a.D}, a.qdt, rng);
  SdpaParams p;
  p.causal = a.causal;
  p.sliding_window = a.window;
  Tensor want = Tensor::empty(q.sizes(), DType::F32);
  if (a.mode == CacheMode::Standard) {
    const Tensor kd = cpu.dequantized_keys_f32(), vd = cpu.dequantized_values_f32();
    attention_ref(q.view(), kd.view(), vd.view(), want.view(), p);
  } else if (fmt != CodebookFormat::F16) {
    if (vs_f32) {
      Tensor exact = Tensor::empty(q.sizes(), DType::F32);
      vecinfer_attention_ref(cpu.attention_inputs(), q.view(), exact.view(), p);
      *vs_f32 = nmse(floats(gpu->fused_sdpa(to_device(q).view(), p)), exact.to_vector_f32());
    }
    ProductQuantizer kq, vq;
    vecinfer_attention_ref(oracle_inputs(cpu, fmt, kq, vq), q.view(), want.view(), p);
  } else {
    vecinfer_attention_ref(cpu.attention_inputs(), q.view(), want.view(), p);
  }
  Tensor got = gpu->fused_sdpa(to_device(q).view(), p);
  EXPECT_EQ(got.device(), Device::cuda(0));
  EXPECT_EQ(got.dtype(), a.qdt);
  return nmse(floats(got), want.to_vector_f32());
}

/// A random case for configuration s at head_dim D: batch, kv heads, GQA group, history,
/// q_len, window, causality, sliding window, query dtype and coded mode drawn from rng.
AttnCase random_attn_case(const Spec& s, int D, std::mt19937_64& rng) {
  return {s, D, 1 + int(rng() % 3), 1 + int(rng() % 4), int(std::vector<int>{1, 2, 4, 5, 8}[rng() % 5]),
          int(rng() % 1500), 1 + int(rng() % 16), int(std::vector<int>{0, 8, 64, 128}[rng() % 4]),
          rng() % 4 != 0, rng() % 5 == 0 ? 1 + int(rng() % 300) : 0,
          std::vector<DType>{DType::F16, DType::BF16, DType::F32}[rng() % 3],
          std::vector<CacheMode>{CacheMode::MemoryBound, CacheMode::Stash}[rng() % 2], 1.5f};
}

/// The cases a codebook format runs over (fixed shapes that reach the split, 16-row, prefill,
/// stash, sharp-softmax and two-blocks paths, then two random cases per configuration and
/// head_dim): each against the oracle on the operands the kernel computes with (kAttnNmse)
/// and, loosely, against the f32-codebook exact-query oracle (f32_bound). Returns the number run.
int run_format_cases(CodebookFormat fmt, uint64_t seed, double f32_bound) {
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<AttnCase> cases;
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  cases.push_back({d4b8, 128, 1, 8, 4, 6000, 1, 128, true, 0, DType::F16, CacheMode::MemoryBound, 1});   // splits
  cases.push_back({dflt, 128, 2, 2, 4, 3000, 1, 128, true, 0, DType::BF16, CacheMode::MemoryBound, 1});  // splits
  cases.push_back({d4b8, 64, 3, 2, 8, 700, 2, 32, true, 0, DType::F32, CacheMode::MemoryBound, 1});      // 16 rows
  cases.push_back({d4b8, 128, 2, 1, 4, 400, 37, 64, true, 0, DType::F16, CacheMode::MemoryBound, 1});    // prefill
  cases.push_back({dflt, 128, 2, 2, 4, 333, 2, 128, true, 0, DType::F16, CacheMode::Stash, 1});
  cases.push_back({d4b8, 128, 1, 2, 4, 800, 1, 128, true, 0, DType::F16, CacheMode::MemoryBound, 3});    // sharp
  cases.push_back({d4b8, 128, 40, 8, 4, 700, 1, 128, true, 0, DType::F16, CacheMode::MemoryBound, 1});   // two-blocks/SM
  // one row tile whose rows see different causal and sliding-window bounds (E4M3 and int8 keys
  // score it token-major: a lane masks rows 2t, 2t + 1), all 8 rows live, then 6 of 8
  cases.push_back({d4b8, 128, 1, 2, 4, 900, 2, 16, true, 100, DType::F16, CacheMode::MemoryBound, 1});
  cases.push_back({d4b8, 128, 2, 1, 2, 1200, 3, 64, true, 300, DType::BF16, CacheMode::MemoryBound, 1});
  for (const Spec& s : all_specs())
    for (int D : {64, 128, 256, 80, 96, 112, 160, 192})
      for (int r = 0; r < 2; ++r) cases.push_back(random_attn_case(s, D, rng));
  double worst = 0, worst_f32 = 0;
  int run = 0, run_bf16 = 0;
  for (const AttnCase& a : cases) {
    if (!compiled(a.spec, a.D)) continue;
    SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt));
    double vs_f32 = 0;
    const double e = run_attn_case(a, rng, fmt, &vs_f32);
    EXPECT_LE(e, kAttnNmse) << describe(a);
    EXPECT_LE(vs_f32, f32_bound) << describe(a);
    worst = std::max(worst, e), worst_f32 = std::max(worst_f32, vs_f32);
    ++run;
    run_bf16 += case_storage(a) == DType::BF16;
  }
  std::printf("[cuda attention %s] %d cases (%d with a bf16 cache), worst NMSE %.3g vs the oracle on the kernel's "
              "operands (bound %.1g), worst %.3g vs the f32-codebook exact-query oracle (bound %.1g)\n",
              codebook_format_name(fmt), run, run_bf16, worst, kAttnNmse, worst_f32, f32_bound);
  return run;
}

// E4M3 codebooks: the same kernels reading 1-byte centroids. Exact up to the fp16/fp32
// arithmetic tier against the oracle on the decoded centroids (kAttnNmse). Against the f32
// codebooks, the rounding to 3 mantissa bits (relative error <= 2^-4 per centroid element)
// moves outputs by NMSE ~1e-3 on these random inputs and up to ~1e-2 with sharp softmaxes
// (H200, first run: worst 9.3e-3 over 37 cases); the 5e-2 bound only catches gross errors (a
// wrong scale or a misplaced byte gives NMSE ~1). docs/cuda-kernels.md measures the cost on
// model-like data (+0.1-0.4% relative attention-output error).
TEST(CudaAttention, E4M3CodebooksMatchTheOracleOnTheDecodedCentroids) {
  VQ_SKIP_WITHOUT_GPU();
  EXPECT_GT(run_format_cases(CodebookFormat::E4M3, 0xE4E3, 5e-2), 7);
}

// Int8 keys: key centroids as int8 (scale max|c|/127) scored on int8 tensor cores against q̃
// rounded to int8 per row. Exact in int32 against the oracle on the same rounded operands
// (int8_query), so held to kAttnNmse like every fp16 path; against f32 codebooks and the exact
// query the two roundings (~0.4% of each operand's range) cost NMSE <= 3.4e-4 on these inputs
// (H200, run 21), bounded loosely (5e-3) to catch a wrong scale or a misplaced byte (NMSE ~1).
TEST(CudaAttention, Int8KeysMatchTheOracleOnTheRoundedQueryAndCentroids) {
  VQ_SKIP_WITHOUT_GPU();
  EXPECT_GT(run_format_cases(CodebookFormat::I8, 0x1818, 5e-3), 7);
}

// Int8 keys and values: values as int8 centroids (scale max|c|/127) in offset binary, widened
// exactly to fp16 (1024 + byte) for the value MMAs, the offset removed after the loop with the
// probability sums the same MMAs produce; the four-row kernel (GQA groups of <= 4 at q_len 1)
// instead multiplies them as signed bytes on int8 tensor cores with P rounded to u8 per tile.
// Against the oracle on the decoded int8 centroids and the rounded query: held to kAttnNmse (an
// offset not removed exactly would show as a bias of 1152 per unit of probability, NMSE far above
// 1); against f32 codebooks loosely, as for int8 keys.
TEST(CudaAttention, Int8KeysAndValuesMatchTheOracleOnTheRoundedOperands) {
  VQ_SKIP_WITHOUT_GPU();
  EXPECT_GT(run_format_cases(CodebookFormat::I8KV, 0x18C8, 5e-3), 7);
}

// Int8 keys with queries too small for the step 127/max|q̃| to be finite (max|q̃| below ~3.7e-37),
// and zero ones: every score ~0, a uniform softmax, on the tuned kernels (head_dim 128: the
// four-row and the 8-row kernel) and the plain kernel (head_dim 96), as in the oracle, which
// rounds such a query to zero (VecInferAttentionRef.Int8QueryTooSmallForItsStepRoundsToZero: it
// gave NaN before). The outputs must be finite and within kAttnNmse of the oracle's.
TEST(CudaAttention, TinyQueriesAttendUniformlyLikeTheOracle) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(0x7171);
  const Spec d4b8{4, 8, 4, 8};
  int run = 0;
  for (CodebookFormat fmt : {CodebookFormat::I8, CodebookFormat::I8KV})
    for (int D : {128, 96})
      for (int G : {4, 8}) {
        const AttnCase a{d4b8, D, 2, 2, G, 700, 1, 64, true, 0, DType::F32, CacheMode::MemoryBound, 1};
        if (!compiled(a.spec, a.D)) continue;
        SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt));
        CaseCaches cc = fill_case_caches(a, rng, true, fmt);
        const Shape qs{a.B, a.H * a.G, a.q_len, a.D};
        std::vector<Tensor> queries;
        queries.push_back(Tensor::zeros(qs, DType::F32));
        for (float stddev : {1e-40f, 1e-38f}) queries.push_back(random_tensor(qs, DType::F32, rng, stddev));
        queries.push_back(Tensor::zeros(qs, DType::F32));  // (c, c, 0, ...) in every head
        for (int64_t h = 0; h < qs[1]; ++h) queries.back().ptr<float>()[h * a.D] = queries.back().ptr<float>()[h * a.D + 1] = 1e-36f;
        for (size_t i = 0; i < queries.size(); ++i) {
          SCOPED_TRACE("query " + std::to_string(i));
          const std::vector<float> want = device_oracle(*cc.cpu, fmt, queries[i], SdpaParams{});
          const std::vector<float> got = floats(cc.gpu->fused_sdpa(to_device(queries[i]).view(), SdpaParams{}));
          for (float v : want) ASSERT_TRUE(std::isfinite(v)) << "oracle " << v;
          for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "kernel " << v;
          EXPECT_LE(nmse(got, want), kAttnNmse);
          ++run;
        }
      }
  std::printf("[cuda attention] %d tiny- or zero-query launches matched the oracle\n", run);
  EXPECT_GE(run, 16);
}

TEST(CudaAttention, DecodeAndPrefillMatchTheOracleOnCodes) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0xA77E;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<AttnCase> cases;
  // awkward fixed shapes first
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  for (int len : {0, 1, 54, 97, 137}) cases.push_back({d4b8, 128, 1, 2, 4, len, 1, 16, true, 0, DType::F16, CacheMode::MemoryBound, 1});
  cases.push_back({d4b8, 128, 1, 8, 4, 6000, 1, 128, true, 0, DType::F16, CacheMode::MemoryBound, 1});    // splits
  cases.push_back({dflt, 128, 2, 2, 4, 3000, 1, 128, true, 0, DType::BF16, CacheMode::MemoryBound, 1});   // splits
  cases.push_back({d4b8, 64, 3, 2, 8, 700, 2, 32, true, 0, DType::F32, CacheMode::MemoryBound, 1});       // 16 rows
  cases.push_back({d4b8, 128, 1, 1, 1, 300, 16, 8, true, 0, DType::F16, CacheMode::MemoryBound, 1});      // q_len 16
  cases.push_back({dflt, 128, 1, 2, 4, 500, 5, 0, true, 0, DType::F16, CacheMode::MemoryBound, 1});       // rows 20, R 0
  cases.push_back({d4b8, 128, 2, 1, 4, 400, 37, 64, true, 0, DType::F16, CacheMode::MemoryBound, 1});     // prefill chunks
  // long prefill chunks: one launch of many row chunks (G·q_len/16 of them; run 115)
  cases.push_back({d4b8, 128, 2, 2, 4, 700, 300, 64, true, 0, DType::F16, CacheMode::MemoryBound, 1});
  cases.push_back({dflt, 64, 1, 3, 2, 1500, 211, 128, true, 150, DType::BF16, CacheMode::MemoryBound, 1});
  cases.push_back({d4b8, 128, 1, 1, 8, 0, 260, 16, true, 0, DType::F32, CacheMode::Stash, 1});             // no history
  cases.push_back({d4b8, 128, 1, 2, 4, 900, 3, 16, true, 100, DType::F16, CacheMode::MemoryBound, 1});    // sliding
  cases.push_back({dflt, 64, 1, 2, 2, 200, 4, 16, false, 0, DType::F32, CacheMode::MemoryBound, 1});      // non-causal
  cases.push_back({d4b8, 128, 1, 2, 4, 800, 1, 128, true, 0, DType::F16, CacheMode::MemoryBound, 3});     // sharp
  cases.push_back({dflt, 128, 2, 2, 4, 333, 2, 128, true, 0, DType::F16, CacheMode::Stash, 1});
  cases.push_back({d4b8, 64, 1, 3, 2, 250, 3, 16, true, 0, DType::F16, CacheMode::Standard, 1});
  // 40 x 8 unsplit segments, two waves of blocks or more on any GPU up to 160 SMs: the
  // two-blocks-per-SM d4b8 kernel
  cases.push_back({d4b8, 128, 40, 8, 4, 700, 1, 128, true, 0, DType::F16, CacheMode::MemoryBound, 1});
  // random ones over every compiled configuration
  for (const Spec& s : all_specs())
    for (int D : {64, 128, 256, 80, 96, 112, 160, 192})
      for (int r = 0; r < 3; ++r) {
        if (!compiled(s, D)) continue;
        cases.push_back(random_attn_case(s, D, rng));
      }
  double worst = 0;
  int run_bf16 = 0;
  for (const AttnCase& a : cases) {
    if (!compiled(a.spec, a.D)) continue;
    SCOPED_TRACE(describe(a));
    const double e = run_attn_case(a, rng);
    EXPECT_LE(e, kAttnNmse) << describe(a);
    worst = std::max(worst, e);
    run_bf16 += case_storage(a) == DType::BF16;
  }
  std::printf("[cuda attention] %zu cases (%d with a bf16 cache), worst NMSE %.3g (bound %.1g)\n", cases.size(),
              run_bf16, worst, kAttnNmse);
}

// Eager calls with more than 16 queries: the prefill kernel (64 or 128 rows a block, runs 116
// and 121) where its grid fills the device, else the decode kernel's row chunks in as few
// launches as the grid allows (run 115; before: one launch per 16 queries). Every path against
// the oracle: the prefill kernel forced (kPrefillAlways) with either block size in every
// codebook format (its interleaved codebook copies differ per format and size), and the decode kernel's
// row chunks with any number of queries per launch (every launch planned for itself, the last
// one short), each launch's rows under their own causal and sliding-window bounds.
TEST(CudaAttention, PrefillPathsMatchTheOracle) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0x9F11;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  const std::vector<AttnCase> cases = {
      {d4b8, 128, 2, 2, 4, 900, 150, 64, true, 0, DType::F16, CacheMode::MemoryBound, 1},
      {dflt, 128, 1, 2, 4, 1200, 97, 128, true, 200, DType::BF16, CacheMode::MemoryBound, 1},   // bf16 window, sliding
      {d4b8, 64, 1, 2, 8, 300, 120, 0, false, 0, DType::F32, CacheMode::Stash, 1},              // no window, non-causal
      {dflt, 64, 2, 1, 2, 70, 33, 16, true, 0, DType::F16, CacheMode::Stash, 1},                 // short history
      {d4b8, 128, 1, 3, 4, 500, 40, 64, true, 0, DType::F16, CacheMode::Standard, 1},           // every token exact
      {d4b8, 128, 1, 1, 8, 0, 260, 16, true, 0, DType::BF16, CacheMode::MemoryBound, 3},        // no history, sharp
  };
  int prefill_runs = 0;
  for (const AttnCase& a : cases) {
    if (!compiled(a.spec, a.D)) continue;
    const std::vector<CodebookFormat> fmts = {CodebookFormat::F16, CodebookFormat::E4M3, CodebookFormat::I8,
                                              CodebookFormat::I8KV};
    for (int rows : {64, 128}) {
      if (!cuda::prefill_compiled({a.D, a.spec.ks, a.spec.kb, a.spec.vs, a.spec.vb, 1}, rows)) continue;  // 64: VQ_CUDA_VARIANTS
      for (CodebookFormat fmt : fmts) {
        SCOPED_TRACE(describe(a) + " prefill kernel, blocks of " + std::to_string(rows) + " rows, " +
                     codebook_format_name(fmt));
        const int prev = cuda::set_prefill_mode(cuda::kPrefillAlways);
        const int prev_rows = cuda::set_prefill_block_rows(rows);
        const long long before = cuda::prefill_launches();
        std::mt19937_64 case_rng(seed ^ uint64_t(a.q_len));
        double vs_f32 = 0;
        const double e = run_attn_case(a, case_rng, fmt, &vs_f32);
        cuda::set_prefill_block_rows(prev_rows);
        cuda::set_prefill_mode(prev);
        EXPECT_LE(e, kAttnNmse);
        EXPECT_LE(vs_f32, 5e-2);
        const bool ran = cuda::prefill_launches() > before;
        EXPECT_TRUE(ran);
        prefill_runs += ran;
      }
    }
    for (int per_launch : {0, 16, 40, 7}) {
      SCOPED_TRACE(describe(a) + " decode kernel, queries per launch " + std::to_string(per_launch));
      const int prev_mode = cuda::set_prefill_mode(cuda::kPrefillOff);
      const int prev = cuda::set_prefill_launch_queries(per_launch);
      const long long before = cuda::prefill_launches();
      std::mt19937_64 case_rng(seed ^ uint64_t(a.q_len));  // the same cache and queries for each split
      const double e = run_attn_case(a, case_rng);
      cuda::set_prefill_launch_queries(prev);
      cuda::set_prefill_mode(prev_mode);
      EXPECT_LE(e, kAttnNmse);
      EXPECT_EQ(cuda::prefill_launches(), before);
    }
  }
  EXPECT_GT(prefill_runs, 0);
}

// Which path an eager call of many queries takes by default (cuda::kPrefillAuto), and that it
// answers as the oracle: the prefill kernel for a coded cache whose 128-row kernel gathers
// without bank conflicts (d4b8/d4b8) and for a cache of exact rows (Standard) once the chunk's
// blocks fill the device; for the defaults (d4b12 keys: 4 of 16 codebook copies, slower than
// the row chunks at long histories, runs 121-123) only while the cache holds at most
// kPrefillShortHistory chunks of tokens; the decode kernel's row chunks for a chunk too small
// to fill the device.
TEST(CudaAttention, AutoPrefillRouting) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0xA17;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int big_q = 16 * ((sms + 7) / 8) + 16;  // ceil(4·q / 64) · 8 kv heads >= sms
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  struct Route {
    AttnCase a;
    bool prefill;
  };
  const std::vector<Route> routes = {
      {{d4b8, 128, 1, 8, 4, 700, big_q, 128, true, 0, DType::F16, CacheMode::MemoryBound, 1}, true},
      {{d4b8, 128, 1, 8, 4, 300, big_q, 64, true, 0, DType::F16, CacheMode::Standard, 1}, true},
      // the defaults: over a short history only (tokens <= kPrefillShortHistory · chunk)
      {{dflt, 128, 1, 8, 4, 700, big_q, 128, true, 0, DType::F16, CacheMode::MemoryBound, 1}, true},
      {{dflt, 128, 1, 8, 4, cuda::kPrefillShortHistory * big_q, big_q, 128, true, 0, DType::F16,
        CacheMode::MemoryBound, 1}, false},
      {{d4b8, 128, 1, 1, 4, 700, 20, 128, true, 0, DType::F16, CacheMode::MemoryBound, 1}, false},  // 2 blocks
      {{d4b8, 128, 1, 8, 4, 700, big_q, 128, true, 0, DType::F16, CacheMode::Stash, 1}, true},
  };
  ASSERT_EQ(cuda::prefill_mode(), int(cuda::kPrefillAuto));
  ASSERT_EQ(cuda::prefill_rows_mode(), int(cuda::kRowsAuto));
  // over the codes (prefill over dequantized rows off)
  const int prev_rows = cuda::set_prefill_rows_mode(cuda::kRowsOff);
  for (const Route& r : routes) {
    if (!compiled(r.a.spec, r.a.D)) continue;
    SCOPED_TRACE(describe(r.a));
    const long long before = cuda::prefill_launches();
    const double e = run_attn_case(r.a, rng, CodebookFormat::I8);
    EXPECT_LE(e, kAttnNmse);
    const bool ran = cuda::prefill_launches() > before;
    EXPECT_EQ(ran, r.prefill && cuda::prefill_compiled({r.a.D, r.a.spec.ks, r.a.spec.kb, r.a.spec.vs, r.a.spec.vb, 1}));
  }
  cuda::set_prefill_rows_mode(prev_rows);
  // by default: memory-bound caches over dequantized rows wherever the grid fills the device
  // (the defaults at a long history too), Stash caches over the rows they hold (int8 keys on
  // their grid: they agree with the decode kernel's centroids); Standard caches (exact rows
  // already, the prefill kernel over them is counted apart) and chunks too small to fill the
  // device never
  const bool rows_kernel = cuda::prefill_compiled({128, 4, 8, 4, 8, 1});
  for (const Route& r : routes) {
    const AttnCase& a = r.a;
    if (!compiled(a.spec, a.D)) continue;
    SCOPED_TRACE(describe(a) + " (default: rows)");
    const long long before = cuda::prefill_rows_launches(), before_k = cuda::prefill_launches();
    const double e = run_attn_case(a, rng, CodebookFormat::I8);
    EXPECT_LE(e, kAttnNmse);
    const bool fills = (int64_t(a.G) * a.q_len + cuda::kPrefillRows - 1) / cuda::kPrefillRows * a.H * a.B >= sms;
    const bool want = rows_kernel && (a.mode == CacheMode::MemoryBound || a.mode == CacheMode::Stash) && fills;
    EXPECT_EQ(cuda::prefill_rows_launches() - before, want ? 1 : 0);
    if (want) EXPECT_EQ(cuda::prefill_launches() - before_k, 1);  // one prefill launch, over the rows
  }
}

// The exact-rows prefill kernel (prefill_exact_kernel.cuh: 32 query rows a warp), in both tile
// sizes, against the oracle and against vq_prefill_kernel on the same calls: Standard caches
// (every token an exact row) with the prefill kernel forced, and memory-bound caches over
// dequantized rows; head_dim 64 and 128, fp16 and bf16 rows, GQA groups of 1 to 8, causal,
// non-causal and sliding-window masks, chunks and histories that end mid-tile and mid-block,
// batch 2. Each mode's launches are counted, so a silent fallback to the other kernel fails.
TEST(CudaAttention, ExactRowsPrefillKernelMatchesTheOracleAndTheGeneralKernel) {
  VQ_SKIP_WITHOUT_GPU();
  if (!cuda::prefill_compiled({128, 4, 8, 4, 8, 1})) GTEST_SKIP() << "no prefill kernel over exact rows in this build";
  const uint64_t seed = 0xE8AC7;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  const std::vector<AttnCase> cases = {
      {d4b8, 128, 2, 2, 4, 900, 150, 64, true, 0, DType::F16, CacheMode::Standard, 1},        // batch 2
      {d4b8, 128, 1, 2, 4, 1200, 97, 128, true, 200, DType::BF16, CacheMode::Standard, 1},    // bf16 rows, sliding
      {d4b8, 64, 1, 2, 8, 300, 120, 0, false, 0, DType::F32, CacheMode::Standard, 1},         // non-causal, G 8
      {d4b8, 64, 2, 1, 1, 70, 33, 16, true, 0, DType::F16, CacheMode::Standard, 1},           // G 1, a short block
      {d4b8, 128, 1, 1, 8, 0, 260, 16, true, 0, DType::BF16, CacheMode::MemoryBound, 3},      // rows, no history, sharp
      {dflt, 128, 2, 2, 4, 1000, 77, 64, true, 0, DType::F16, CacheMode::MemoryBound, 1},     // rows, batch 2
      {dflt, 64, 1, 3, 2, 500, 45, 128, true, 100, DType::BF16, CacheMode::MemoryBound, 1},   // rows, sliding
      {d4b8, 128, 1, 2, 4, 37, 20, 128, true, 0, DType::F16, CacheMode::MemoryBound, 1},      // all in the window
  };
  double worst = 0, worst_between = 0, worst_split = 0;
  int run = 0;
  for (const AttnCase& a : cases) {
    if (!compiled(a.spec, a.D)) continue;
    SCOPED_TRACE(describe(a));
    OracleCase oc = oracle_case(a, rng, CodebookFormat::I8);
    const int prev_mode = cuda::set_prefill_mode(a.mode == CacheMode::Standard ? cuda::kPrefillAlways : cuda::kPrefillAuto);
    const int prev_rows = cuda::set_prefill_rows_mode(cuda::kRowsAlways);
    std::vector<float> out[3];
    for (int mode : {cuda::kExactOff, cuda::kExactTile64, cuda::kExactTile32}) {
      SCOPED_TRACE("exact-rows kernel mode " + std::to_string(mode));
      const int prev_exact = cuda::set_prefill_exact_kernel(mode);
      const long long before = cuda::prefill_exact_launches(), before_k = cuda::prefill_launches();
      out[mode] = floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp));
      EXPECT_EQ(cuda::prefill_exact_launches() - before, mode == cuda::kExactOff ? 0 : 1);
      EXPECT_EQ(cuda::prefill_launches() - before_k, 1);
      cuda::set_prefill_exact_kernel(prev_exact);
      const double e = nmse(out[mode], oc.ref);
      EXPECT_LE(e, kAttnNmse);
      worst = std::max(worst, e);
    }
    // the history split over 2 and 4 blocks a row block, then merged (tiles of 64 tokens)
    for (int splits : {2, 4}) {
      SCOPED_TRACE("history split over " + std::to_string(splits));
      const int prev_exact = cuda::set_prefill_exact_kernel(cuda::kExactTile64);
      const int prev_splits = cuda::set_prefill_exact_splits(splits);
      const long long before = cuda::prefill_split_launches(), before_k = cuda::prefill_launches();
      const std::vector<float> o = floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp));
      cuda::set_prefill_exact_splits(prev_splits);
      cuda::set_prefill_exact_kernel(prev_exact);
      EXPECT_EQ(cuda::prefill_split_launches() - before, 1);
      EXPECT_EQ(cuda::prefill_launches() - before_k, 1);
      EXPECT_LE(nmse(o, oc.ref), kAttnNmse);
      const double between = nmse(o, out[cuda::kExactTile64]);
      EXPECT_LE(between, 1e-5) << "against the unsplit kernel";
      worst_split = std::max(worst_split, between);
    }
    cuda::set_prefill_rows_mode(prev_rows);
    cuda::set_prefill_mode(prev_mode);
    // the same fp16 operands and fp32 sums: only the order of the online softmax's rescaling differs
    for (int mode : {cuda::kExactTile64, cuda::kExactTile32}) {
      const double between = nmse(out[mode], out[cuda::kExactOff]);
      EXPECT_LE(between, 1e-5) << "mode " << mode << " against vq_prefill_kernel";
      worst_between = std::max(worst_between, between);
    }
    ++run;
  }
  EXPECT_EQ(run, int(cases.size()));
  EXPECT_THROW(cuda::set_prefill_exact_kernel(4), ValueError);
  EXPECT_THROW(cuda::set_prefill_exact_kernel(-1), ValueError);
  EXPECT_THROW(cuda::set_prefill_exact_splits(cuda::kExactMaxSplits + 1), ValueError);
  EXPECT_THROW(cuda::set_prefill_exact_splits(-1), ValueError);
  std::printf("[cuda prefill exact rows] %d cases x 3 kernels + 2 history splits, worst NMSE %.3g against the oracle, "
              "%.3g between kernels, %.3g split against unsplit\n",
              run, worst, worst_between, worst_split);
}

// kExactAuto's rule (host code, no GPU needed), against run 179 (H100, 132 SMs, fp16 cache,
// blocks of 128 rows): 128 blocks (8192 x 512, 32768 x 512) were 20% / 14% slower on the
// exact-rows kernel, 256 (3072 x 1024) 2% faster, 512 (32768 x 2048) 15%, 1024 (0 x 4096) 3%.
TEST(CudaAttention, ExactRowsKernelRuleTakesGridsOfTwoBlocksAMultiprocessor) {
  for (int64_t b : {256, 512, 1024, 4096}) EXPECT_TRUE(cuda::prefill_exact_pays(b, 132)) << b << " blocks";
  for (int64_t b : {0, 1, 64, 128, 132, 197}) EXPECT_FALSE(cuda::prefill_exact_pays(b, 132)) << b << " blocks";
  EXPECT_TRUE(cuda::prefill_exact_pays(198, 132));
  EXPECT_FALSE(cuda::prefill_exact_pays(1000, 0));
  for (int64_t sms : {46, 84, 108, 132, 144, 170}) {
    EXPECT_TRUE(cuda::prefill_exact_pays(2 * sms, sms)) << sms << " SMs";
    EXPECT_FALSE(cuda::prefill_exact_pays(sms, sms)) << sms << " SMs";
  }
  // the history split (run 180: 128 blocks over 2 shares lost 6% at 4352 tokens a share, won 4% at
  // 16640): the least share count that pays, where every share keeps 160 tiles of 64 tokens
  EXPECT_EQ(cuda::prefill_exact_split_plan(128, 132, 8704), 1);   // 8192 x 512: shares too short
  EXPECT_EQ(cuda::prefill_exact_split_plan(128, 132, 33280), 2);  // 32768 x 512: 256 blocks
  EXPECT_EQ(cuda::prefill_exact_split_plan(64, 132, 65536), 4);   // 198 of 4 x 64 = 256 blocks
  EXPECT_EQ(cuda::prefill_exact_split_plan(64, 132, 40959), 1);   // 639 tiles: 4 shares too short
  EXPECT_EQ(cuda::prefill_exact_split_plan(128, 132, 20479), 1);
  EXPECT_EQ(cuda::prefill_exact_split_plan(128, 132, 20480), 2);
  EXPECT_EQ(cuda::prefill_exact_split_plan(16, 132, 1 << 20), 1);  // 4 x 16 blocks do not pay either
  EXPECT_EQ(cuda::prefill_exact_split_plan(128, 0, 1 << 20), 1);
}

// The default (kExactAuto) on the fp16 device cache: a chunk whose grid fills two blocks a
// multiprocessor takes the exact-rows kernel, a smaller one over a long enough history the
// kernel with its history split (then the merge), a small one over a short history
// vq_prefill_kernel (launches counted); each output equals the forced route's bit for bit and
// agrees with vq_prefill_kernel's. Then the split without its workspace (the rows path's pool
// limit below it): the unsplit kernel where forced, vq_prefill_kernel where chosen.
TEST(CudaAttention, ExactRowsKernelTakesTheLaunchesItsRuleNames) {
  VQ_SKIP_WITHOUT_GPU();
  if (!cuda::prefill_compiled({128, 4, 8, 4, 8, 1})) GTEST_SKIP() << "no prefill kernel over exact rows in this build";
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::mt19937_64 rng(0xE8A);
  const int H = 32, Hkv = 8, D = 128;
  int routed[3] = {0, 0, 0};  // vq_prefill_kernel, split, unsplit
  const int prev_mode = cuda::set_prefill_mode(cuda::kPrefillAlways);
  for (const auto& [q_len, hist] : std::vector<std::pair<int, int64_t>>{{64, 300}, {512, 24576}, {2048, 300}}) {
    const int64_t blocks = int64_t(Hkv) * ((int64_t(H / Hkv) * q_len + 127) / 128);
    const bool pays = cuda::prefill_exact_pays(blocks, sms);
    const int splits = pays ? 1 : cuda::prefill_exact_split_plan(blocks, sms, hist + q_len);
    const int route = pays ? 2 : splits > 1 ? 1 : 0;
    ++routed[route];
    SCOPED_TRACE(std::to_string(q_len) + " queries over " + std::to_string(hist) + ", " + std::to_string(blocks) +
                 " blocks on " + std::to_string(sms) + " SMs: route " + std::to_string(route));
    KVCacheConfig c;
    c.kind = CacheKind::FP16;
    c.head_dim = D;
    c.n_kv_heads = Hkv;
    auto cache = make_cuda(c);
    cache->update(to_device(random_tensor({1, Hkv, hist + q_len, D}, DType::F16, rng)).view(),
                  to_device(random_tensor({1, Hkv, hist + q_len, D}, DType::F16, rng)).view());
    const Tensor q = to_device(random_tensor({1, H, q_len, D}, DType::F16, rng));
    const SdpaParams sp;
    struct Way {
      int mode, splits;
    };
    auto attend = [&](Way w, long long* exact, long long* split) {
      const int prev = cuda::set_prefill_exact_kernel(w.mode), prev_s = cuda::set_prefill_exact_splits(w.splits);
      const long long e0 = cuda::prefill_exact_launches(), s0 = cuda::prefill_split_launches(), k0 = cuda::prefill_launches();
      std::vector<float> o = floats(cache->fused_sdpa(q.view(), sp));
      cuda::set_prefill_exact_splits(prev_s);
      cuda::set_prefill_exact_kernel(prev);
      EXPECT_EQ(cuda::prefill_launches() - k0, 1);
      *exact = cuda::prefill_exact_launches() - e0;
      *split = cuda::prefill_split_launches() - s0;
      return o;
    };
    long long e = 0, sl = 0;
    const std::vector<float> dflt = attend({cuda::kExactAuto, 0}, &e, &sl);
    EXPECT_EQ(e, route == 0 ? 0 : 1);
    EXPECT_EQ(sl, route == 1 ? 1 : 0);
    const std::vector<float> general = attend({cuda::kExactOff, 0}, &e, &sl);
    EXPECT_EQ(e, 0);
    const std::vector<float> forced = attend({cuda::kExactTile64, route == 1 ? splits : 1}, &e, &sl);
    EXPECT_EQ(e, 1);
    EXPECT_EQ(sl, route == 1 ? 1 : 0);
    EXPECT_EQ(dflt, route == 0 ? general : forced);
    EXPECT_LE(nmse(forced, general), 1e-5);
    if (route == 1) {  // no workspace for the split
      const int64_t prev_limit = cuda::set_rows_workspace_limit(1024);
      const std::vector<float> o_auto = attend({cuda::kExactAuto, 0}, &e, &sl);
      EXPECT_EQ(e, 0) << "chosen split without its workspace: vq_prefill_kernel";
      EXPECT_EQ(sl, 0);
      EXPECT_EQ(o_auto, general);
      const std::vector<float> o_forced = attend({cuda::kExactTile64, splits}, &e, &sl);
      EXPECT_EQ(e, 1) << "forced split without its workspace: the unsplit kernel";
      EXPECT_EQ(sl, 0);
      cuda::set_rows_workspace_limit(prev_limit);
      EXPECT_LE(nmse(o_forced, general), 1e-5);
    }
  }
  cuda::set_prefill_mode(prev_mode);
  std::printf("[cuda prefill exact routes] %d SMs: vq_prefill_kernel %d, split %d, unsplit %d of 3 chunks\n", sms,
              routed[0], routed[1], routed[2]);
  // on the H100 / H200 (132 SMs) each route once; elsewhere at least two of them
  EXPECT_GE(int(routed[0] > 0) + int(routed[1] > 0) + int(routed[2] > 0), sms == 132 ? 3 : 2);
}

// Prefill over dequantized rows (run 169): a memory-bound cache's eager call of more than 16
// queries may write its tokens once as exact rows (window tokens as held, older ones dequantized
// with the centroids the decode kernel reads) into a workspace from the device's pool and attend
// over them with the prefill kernel. Forced (kRowsAlways) in every codebook format: against the
// oracle on the kernel's operands, against the same call over the codes, the cache's state byte
// for byte unchanged; then with a workspace limit below what the call needs it must not run (and
// still answer right); with the default limit the pool keeps the workspace after the call, and
// a limit of 0 turns the path off and empties the pool.
TEST(CudaAttention, PrefillOverDequantizedRowsMatchesTheOracle) {
  VQ_SKIP_WITHOUT_GPU();
  if (!cuda::prefill_compiled({128, 4, 8, 4, 8, 1})) GTEST_SKIP() << "no prefill kernel over exact rows in this build";
  const uint64_t seed = 0x50A5;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  const std::vector<AttnCase> cases = {
      {d4b8, 128, 2, 2, 4, 900, 150, 64, true, 0, DType::F16, CacheMode::MemoryBound, 1},      // batch 2
      {dflt, 128, 1, 2, 4, 1200, 97, 128, true, 200, DType::BF16, CacheMode::MemoryBound, 1},  // bf16 rows, sliding
      {d4b8, 64, 1, 2, 8, 300, 120, 0, false, 0, DType::F32, CacheMode::MemoryBound, 1},       // no window, non-causal
      {dflt, 64, 2, 1, 2, 70, 33, 16, true, 0, DType::F16, CacheMode::MemoryBound, 1},         // window < chunk
      {d4b8, 128, 1, 1, 8, 0, 260, 16, true, 0, DType::BF16, CacheMode::MemoryBound, 3},       // no history, sharp
      {d4b8, 128, 1, 3, 4, 37, 20, 128, true, 0, DType::F16, CacheMode::MemoryBound, 1},       // all in the window
      // Stash caches attend over the rows they hold (no workspace) where those agree with the
      // decode kernel's centroids: fp16 codebooks, int8 ones on their grid (run 173)
      {dflt, 128, 2, 2, 4, 333, 40, 64, true, 0, DType::BF16, CacheMode::Stash, 1},
      {d4b8, 64, 1, 2, 8, 300, 120, 0, false, 0, DType::F32, CacheMode::Stash, 1},  // no window
  };
  const std::vector<CodebookFormat> fmts = {CodebookFormat::F16, CodebookFormat::E4M3, CodebookFormat::I8,
                                            CodebookFormat::I8KV};
  // the rule, restated: every centroid within fp16 rounding of its int8 decoding
  auto on_int8_grid = [](const std::vector<float>& cb) {
    const std::vector<float> dec = make_i8_codebook(cb).decoded;
    float big = 0, err = 0;
    for (size_t i = 0; i < cb.size(); ++i) big = std::max(big, std::fabs(cb[i])), err = std::max(err, std::fabs(dec[i] - cb[i]));
    return err <= big / 2048;
  };
  double worst = 0, worst_between = 0;
  int run = 0, stash_rows = 0, stash_codes = 0;
  const int prev_lanes = cuda::set_materialize_lanes(0);
  for (int lanes : {0, 1})  // the expansion a warp a row, and head_dim / 16 lanes a row
  for (const AttnCase& a : cases) {
    if (!compiled(a.spec, a.D)) continue;
    cuda::set_materialize_lanes(lanes);
    for (CodebookFormat fmt : fmts) {
      SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt) + (lanes ? " lanes-per-row expansion" : ""));
      OracleCase oc = oracle_case(a, rng, fmt);
      bool expect_rows = true;
      if (a.mode == CacheMode::Stash) {
        const VecInferAttentionInputs in = oc.cc.cpu->attention_inputs();
        const bool i8 = fmt == CodebookFormat::I8 || fmt == CodebookFormat::I8KV;
        expect_rows = fmt == CodebookFormat::F16 || (i8 && on_int8_grid(in.key_pq->codebook) &&
                                                     (fmt == CodebookFormat::I8 || on_int8_grid(in.value_pq->codebook)));
        ++(expect_rows ? stash_rows : stash_codes);
      }
      const CacheState before_state = oc.cc.gpu->state();
      const int prev = cuda::set_prefill_rows_mode(cuda::kRowsAlways);
      const long long before = cuda::prefill_rows_launches();
      const std::vector<float> rows = floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp));
      EXPECT_EQ(cuda::prefill_rows_launches() - before, expect_rows ? 1 : 0);
      cuda::set_prefill_rows_mode(cuda::kRowsOff);
      const std::vector<float> codes = floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp));
      EXPECT_EQ(cuda::prefill_rows_launches() - before, expect_rows ? 1 : 0);
      cuda::set_prefill_rows_mode(prev);
      const double e = nmse(rows, oc.ref), e_codes = nmse(codes, oc.ref), between = nmse(rows, codes);
      EXPECT_LE(e, kAttnNmse);
      EXPECT_LE(e_codes, kAttnNmse);
      EXPECT_LE(between, kAttnNmse);
      expect_same_state(before_state, oc.cc.gpu->state(), "after prefill over rows");
      worst = std::max(worst, e), worst_between = std::max(worst_between, between);
      ++run;
    }
  }
  cuda::set_materialize_lanes(prev_lanes);
  EXPECT_GE(run, 48);
  // fp16 and int8-key Stash caches over their rows (the int8 key grid is the default), E4M3 ones over the codes
  EXPECT_GE(stash_rows, 8);
  EXPECT_GE(stash_codes, 4);
  // a limit below the workspace (2 sides x B x Hkv x tokens x D x 2 bytes): the call attends over the codes
  const AttnCase& a = cases[0];
  OracleCase oc = oracle_case(a, rng, CodebookFormat::I8);
  const int64_t need = int64_t(2) * a.B * a.H * (a.prefix + a.q_len) * a.D * 2;
  const int64_t prev_limit = set_cuda_prefill_workspace_limit(need - 1);
  const int prev = cuda::set_prefill_rows_mode(cuda::kRowsAlways);
  long long before = cuda::prefill_rows_launches();
  EXPECT_LE(nmse(floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp)), oc.ref), kAttnNmse);
  EXPECT_EQ(cuda::prefill_rows_launches(), before);
  set_cuda_prefill_workspace_limit(need);
  EXPECT_LE(nmse(floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp)), oc.ref), kAttnNmse);
  EXPECT_EQ(cuda::prefill_rows_launches(), before + 1);
  // the pool keeps what it mapped while that is within the limit (its own granularity may pass a
  // limit this small, and it then gives the memory back at the synchronisation): with the default
  // limit it holds the workspace after the call
  set_cuda_prefill_workspace_limit(cuda::kRowsWorkspaceDefault);
  EXPECT_LE(nmse(floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp)), oc.ref), kAttnNmse);
  EXPECT_EQ(cuda::prefill_rows_launches(), before + 2);
  as_cuda(oc.cc.gpu.get())->synchronize();
  const int64_t held = cuda::rows_workspace_reserved(0);
  EXPECT_GE(held, need);
  EXPECT_LE(held, cuda::kRowsWorkspaceDefault);
  set_cuda_prefill_workspace_limit(0);  // off, and the pool's memory released (its work is done)
  before = cuda::prefill_rows_launches();
  EXPECT_LE(nmse(floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp)), oc.ref), kAttnNmse);
  EXPECT_EQ(cuda::prefill_rows_launches(), before);
  EXPECT_EQ(cuda::rows_workspace_reserved(0), 0);
  EXPECT_EQ(cuda_prefill_workspace_limit(), 0);
  set_cuda_prefill_workspace_limit(prev_limit);
  cuda::set_prefill_rows_mode(prev);
  EXPECT_THROW(set_cuda_prefill_workspace_limit(-1), ValueError);
  std::printf("[cuda prefill over rows] %d cases (Stash: %d over held rows, %d over codes), worst NMSE %.3g vs the "
              "oracle, %.3g vs the kernel over the codes (bound %.1g); the pool held %lld bytes for a %lld-byte "
              "workspace\n",
              run, stash_rows, stash_codes, worst, worst_between, kAttnNmse, (long long)held, (long long)need);
}

// Split launches merge their partials either as one thread-block cluster per segment
// (distributed shared memory, sm_90+, when every cluster fits at once) or through the
// workspace (the segment's last block). Both paths, on the same caches and queries: each
// against the oracle, and against each other (the same merge arithmetic in the same split
// order: equal to a few ulps). On an sm_90+ device the cluster path must actually run.
TEST(CudaAttention, ClusterAndWorkspaceSplitMergesAgree) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0xC1u;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  const CacheMode mb = CacheMode::MemoryBound;
  std::vector<AttnCase> cases = {
      {d4b8, 128, 1, 8, 4, 9000, 1, 128, true, 0, DType::F16, mb, 1},   // 16 splits: a non-portable cluster size
      {d4b8, 128, 1, 8, 4, 6000, 1, 128, true, 0, DType::F16, mb, 1},   // 11 splits
      {dflt, 128, 2, 2, 4, 3000, 1, 128, true, 0, DType::BF16, mb, 1},  // 5 splits, batch 2
      {d4b8, 64, 3, 2, 8, 2000, 2, 32, true, 0, DType::F32, mb, 1},     // 16 rows (two row tiles)
      {d4b8, 256, 1, 2, 4, 3000, 1, 64, true, 0, DType::F16, mb, 1},    // head_dim 256
      {d4b8, 128, 2, 1, 4, 2000, 37, 64, true, 0, DType::F16, mb, 1},   // prefill chunks
      {d4b8, 128, 1, 2, 4, 3000, 3, 16, true, 700, DType::F16, mb, 1},  // sliding window
      {dflt, 128, 1, 2, 4, 2500, 2, 128, true, 0, DType::F16, CacheMode::Stash, 1},
  };
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  const bool prev = cuda::attn_set_cluster_merge(true);
  long long clustered = 0;
  int run = 0;
  double worst = 0, worst_diff = 0;
  for (const AttnCase& a : cases) {
    if (!compiled(a.spec, a.D)) continue;
    SCOPED_TRACE(describe(a));
    CaseCaches cc = fill_case_caches(a, rng, true);
    VecInferKVCache& cpu = *cc.cpu;
    KVCache* const gpu = cc.gpu.get();
    Tensor q = random_tensor({a.B, a.H * a.G, a.q_len, a.D}, a.qdt, rng);
    SdpaParams sp;
    sp.causal = a.causal;
    sp.sliding_window = a.window;
    Tensor want = Tensor::empty(q.sizes(), DType::F32);
    vecinfer_attention_ref(cpu.attention_inputs(), q.view(), want.view(), sp);
    const Tensor qd = to_device(q);
    cuda::attn_set_cluster_merge(true);
    const long long before = cuda::attn_cluster_launches();
    const std::vector<float> with_clusters = floats(gpu->fused_sdpa(qd.view(), sp));
    clustered += cuda::attn_cluster_launches() - before;
    cuda::attn_set_cluster_merge(false);
    const long long before_ws = cuda::attn_cluster_launches();
    const std::vector<float> with_workspace = floats(gpu->fused_sdpa(qd.view(), sp));
    EXPECT_EQ(cuda::attn_cluster_launches(), before_ws) << "a cluster launch with the cluster merge switched off";
    const std::vector<float> ref = want.to_vector_f32();
    const double e1 = nmse(with_clusters, ref), e2 = nmse(with_workspace, ref);
    EXPECT_LE(e1, kAttnNmse);
    EXPECT_LE(e2, kAttnNmse);
    const double d = nmse(with_clusters, with_workspace);
    EXPECT_LE(d, 1e-12) << "the two merges disagree";
    worst = std::max({worst, e1, e2});
    worst_diff = std::max(worst_diff, d);
    ++run;
  }
  cuda::attn_set_cluster_merge(prev);
  if (major >= 9) EXPECT_GT(clustered, 0) << "no split launch ran as clusters on an sm_" << major << "x device";
  std::printf("[cuda attention split merge] %d cases, %lld clustered launches (sm_%d), worst NMSE %.3g vs the oracle, "
              "%.3g between the cluster and workspace merges\n",
              run, clustered, major * 10, worst, worst_diff);
}

// Eager fused_sdpa calls pass the host's lengths as a hint (AttnParams::hint_chunk /
// hint_ncode): each block prefetches its first code tiles into L2 while the device lengths
// load. Nothing but that prefetch may depend on it: with the hint exact, wrong either way, or
// dropped, the outputs are equal bit for bit (split launches with a window, batch 2, two row
// tiles, prefill chunks).
TEST(CudaAttention, LengthHintsChangeNothingButSpeed) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0x417u;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  const CacheMode mb = CacheMode::MemoryBound;
  const std::vector<AttnCase> cases = {
      {d4b8, 128, 1, 8, 4, 9000, 1, 128, true, 0, DType::F16, mb, 1},   // 16 splits, the window in the last
      {dflt, 128, 2, 2, 4, 3000, 1, 128, true, 0, DType::BF16, mb, 1},  // batch 2
      {d4b8, 64, 3, 2, 8, 2000, 2, 32, true, 0, DType::F32, mb, 1},     // two row tiles
      {d4b8, 128, 2, 1, 4, 2000, 37, 64, true, 0, DType::F16, mb, 1},   // prefill chunks
  };
  int run = 0;
  for (const AttnCase& a : cases) {
    if (!compiled(a.spec, a.D)) continue;
    SCOPED_TRACE(describe(a));
    CaseCaches cc = fill_case_caches(a, rng, false);
    KVCache* const gpu = cc.gpu.get();
    const Tensor qd = to_device(random_tensor({a.B, a.H * a.G, a.q_len, a.D}, a.qdt, rng));
    SdpaParams sp;
    sp.causal = a.causal;
    sp.sliding_window = a.window;
    const int prev = cuda::attn_set_hint_shift(0);
    const long long hinted = cuda::attn_hinted_launches();
    const std::vector<float> exact = floats(gpu->fused_sdpa(qd.view(), sp));
    EXPECT_GT(cuda::attn_hinted_launches(), hinted) << "an eager call launched without the length hint";
    for (int shift : {-(a.prefix / 3), -32, 32, 100000, -(1 << 30)}) {
      cuda::attn_set_hint_shift(shift);
      EXPECT_EQ(floats(gpu->fused_sdpa(qd.view(), sp)), exact) << "hint_chunk moved by " << shift;
    }
    cuda::attn_set_hint_shift(prev);
    ++run;
  }
  EXPECT_GT(run, 0);
  std::printf("[cuda attention length hints] %d cases, outputs equal with the hint exact, moved or dropped\n", run);
}

// Chunks of at most 4 query rows (GQA group x q_len <= 4) run the four-row kernel where the
// configuration has one (d4b8, in every codebook format): each live row held twice by the MMA
// rows, a different value MMA and accumulator layout. Every case runs with it and with the 8-row
// kernel (attn_set_rows4): both against the oracle on the kernel's operands, against each other,
// and the launch counter must show which kernel ran. Between the kernels: where both split the tokens
// the same way (E4M3: 16 warps x 32-token warp tiles in both) they compute the same products
// summed in another order, equal to f32 rounding (1e-10); the fp16 and int8-key four-row kernels
// run 16 warps x 32 tokens against the 8-row kernels' 8 x 64, so each warp's running maximum,
// to which the probabilities are rounded to fp16 before the value MMA, differs: the outputs
// then differ by that rounding (relative 2^-11 per probability; NMSE up to 5.4e-7 measured,
// bound 4e-6, 50x below the oracle bound kAttnNmse, far above f32 rounding). Int8 values: the
// four-row kernel rounds P to u8 per 32-token tile for its int8 value MMA, the 8-row kernel to
// fp16: each is held to kAttnNmse against the oracle, and so is their difference.
TEST(CudaAttention, FourRowKernelMatchesTheOracleAndTheEightRowKernel) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0x4404u;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8};
  const CacheMode mb = CacheMode::MemoryBound;
  const std::vector<AttnCase> cases = {
      {d4b8, 128, 1, 8, 4, 9000, 1, 128, true, 0, DType::F16, mb, 1},    // G 4: 16 splits, the window in the last
      {d4b8, 128, 2, 2, 4, 3000, 1, 128, true, 0, DType::BF16, mb, 1},   // batch 2, a bf16 window
      {d4b8, 64, 1, 3, 2, 1500, 2, 64, true, 0, DType::F32, mb, 1},      // G 2 x q_len 2: rows see different bounds
      {d4b8, 128, 1, 2, 1, 2000, 4, 16, true, 300, DType::F16, mb, 1},   // MHA x q_len 4, sliding window
      {d4b8, 128, 2, 1, 3, 700, 1, 32, true, 0, DType::F16, mb, 1},      // G 3: one dead row
      {d4b8, 64, 1, 2, 1, 500, 1, 8, false, 0, DType::F16, mb, 1},       // one row, non-causal
      {d4b8, 128, 1, 2, 4, 800, 1, 128, true, 0, DType::F16, mb, 3},     // sharp softmax: rescales
      {d4b8, 128, 1, 2, 2, 333, 2, 128, true, 0, DType::F16, CacheMode::Stash, 1},
      {d4b8, 128, 1, 2, 4, 0, 1, 16, true, 0, DType::F16, mb, 1},        // window only
  };
  SwitchedWorst worst;
  for (CodebookFormat fmt : {CodebookFormat::F16, CodebookFormat::I8, CodebookFormat::E4M3, CodebookFormat::I8KV}) {
    for (const AttnCase& a : cases) {
      if (!compiled(a.spec, a.D)) continue;
      SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt));
      const OracleCase oc = oracle_case(a, rng, fmt);
      const SwitchedOutputs r = with_and_without(cuda::attn_set_rows4, cuda::attn_rows4_launches, oc, "the four-row kernel");
      EXPECT_GT(r.launches_on, 0) << "the four-row kernel did not run";
      const bool same_tiling = fmt == CodebookFormat::E4M3;  // int8 values: 8 warps x 64 tokens on the 8-row kernel
      const double between = fmt == CodebookFormat::I8KV ? kAttnNmse : same_tiling ? 1e-10 : 4e-6;
      EXPECT_LE(r.nmse_between, between) << "the four-row and 8-row kernels disagree";
      worst.add(r);
    }
  }
  EXPECT_GT(worst.cases, 0);
  std::printf("[cuda attention four-row kernel] %d cases, worst NMSE %.3g vs the oracle, %.3g between the four-row "
              "and 8-row kernels\n",
              worst.cases, worst.oracle, worst.between);
}

// The wave model that picks the two-blocks four-row kernels (host code, no GPU needed), on the
// H200's 132 SMs against run 145-146's measurements: 264 blocks (33 x 8 kv heads) took 99.5 us
// on the two-blocks kernel against 102.2; 272-384 (34-48 x 8) were 1.4-1.8% slower there (its
// last round runs single 8-warp blocks); 512 / 1024 / 2048 were 4 / 9 / 15% faster. Fewer than
// two waves, or no SMs, never pay.
TEST(CudaAttention, WaveModelTakesTwoBlocksWhereTheyWereMeasuredFaster) {
  for (int64_t b : {264, 512, 1024, 2048}) EXPECT_TRUE(cuda::attn_wide_pays(b, 132)) << b << " blocks";
  for (int64_t b : {0, 1, 132, 263, 272, 320, 384, 396}) EXPECT_FALSE(cuda::attn_wide_pays(b, 132)) << b << " blocks";
  EXPECT_FALSE(cuda::attn_wide_pays(1000, 0));
  // the model scales with the SM count: 4 waves less a few blocks pay on any GPU
  for (int64_t sms : {46, 84, 108, 132, 144, 170}) EXPECT_TRUE(cuda::attn_wide_pays(4 * sms - 4, sms)) << sms << " SMs";
}

// Unsplit grids of two waves of blocks or more take a two-blocks-per-multiprocessor kernel where
// the configuration has one (attn_set_wide): d4b8's four-row kernels in every codebook format
// (8 warps, 2 ring stages, the codebook gathers' base as an immediate: AttnTraits::kPrmtRel)
// where the wave model says it pays (attn_wide_pays), and its 8-row E4M3 kernel. Every case runs
// with and without them: both against the oracle on the kernel's operands, against each other,
// and the launch counter must show which kernel ran (an 8-row chunk in another format has no
// two-blocks kernel; a four-row grid the model turns down keeps the one-block kernel). The two
// kernels split a block's tokens over 8 and 16 warps, so each warp's running maximum, to which
// the probabilities are rounded to fp16 for the value MMA, differs: bound 4e-6 between them, as
// between the four-row and 8-row kernels. Batches are chosen from this GPU's multiprocessor count:
// the smallest grid of two waves or more where the model takes the two-blocks kernel (33 x 8
// kv heads on the H200's 132), and the smallest where it does not (34 x 8).
TEST(CudaAttention, TwoBlocksKernelsMatchTheOracleAndTheOneBlockKernels) {
  VQ_SKIP_WITHOUT_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int H = 8;
  auto batch_where = [&](bool pays) {
    int b = (2 * sms + H - 1) / H;
    while (cuda::attn_wide_pays(int64_t(b) * H, sms) != pays) ++b;
    return b;
  };
  const int b_yes = batch_where(true), b_no = batch_where(false);
  const uint64_t seed = 0x2b10cu;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(sms) + " SMs");
  const Spec d4b8{4, 8, 4, 8};
  const CacheMode mb = CacheMode::MemoryBound;
  struct Case {
    AttnCase a;
    bool pays;
  };
  const std::vector<Case> cases = {
      {{d4b8, 128, b_yes, H, 4, 700, 1, 128, true, 0, DType::F16, mb, 1}, true},   // G 4 (Llama-3-8B's group)
      {{d4b8, 64, b_yes, H, 2, 500, 2, 64, true, 0, DType::BF16, mb, 1}, true},    // G 2 x q_len 2, a bf16 window
      {{d4b8, 128, b_yes, H, 1, 900, 4, 16, true, 300, DType::F16, mb, 3}, true},  // MHA x q_len 4, sliding, sharp
      {{d4b8, 128, b_yes, H, 4, 400, 1, 32, true, 0, DType::F32, CacheMode::Stash, 1}, true},
      {{d4b8, 128, b_no, H, 4, 300, 1, 32, true, 0, DType::F16, mb, 1}, false},    // the model says no
      {{d4b8, 128, b_yes, H, 8, 300, 1, 32, true, 0, DType::F16, mb, 1}, true},    // G 8: the 8-row kernels
  };
  SwitchedWorst worst;
  int ran_wide = 0;
  for (CodebookFormat fmt : {CodebookFormat::F16, CodebookFormat::I8, CodebookFormat::E4M3, CodebookFormat::I8KV}) {
    for (const Case& c : cases) {
      const AttnCase& a = c.a;
      if (!compiled(a.spec, a.D)) continue;
      SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt));
      const OracleCase oc = oracle_case(a, rng, fmt);
      const SwitchedOutputs r = with_and_without(cuda::attn_set_wide, cuda::attn_wide_launches, oc, "the two-blocks kernel");
      const bool rows4 = a.G * a.q_len <= 4;
      const bool has_wide = rows4 ? c.pays : fmt == CodebookFormat::E4M3;  // the 8-row E4M3 rule: two waves
      EXPECT_EQ(r.launches_on > 0, has_wide) << "which kernel ran";
      EXPECT_LE(r.nmse_between, has_wide ? 4e-6 : 0.0) << "the two-blocks and one-block kernels disagree";
      ran_wide += has_wide;
      worst.add(r);
    }
  }
  EXPECT_GT(ran_wide, 0);
  std::printf("[cuda attention two-blocks kernels] %d cases (%d on a two-blocks kernel; batches %d and %d on %d SMs), "
              "worst NMSE %.3g vs the oracle, %.3g between the two-blocks and one-block kernels\n",
              worst.cases, ran_wide, b_yes, b_no, sms, worst.oracle, worst.between);
}

// Kernels whose ring cannot stage the window rows (the defaults' d4b12/d8b8 kernels, d8
// values) attend them first (AttnParams::window_first: through registers before the coded
// tokens, on the warps with one code tile fewer; the token-major kernels then carry the
// window's softmax state into the coded loop, and E4M3 / int8 value codebooks pre-divide its
// part of O by the scale the coded part gets after the loop) or last
// (attn_set_window_first(false)). Both orders, on the same caches and queries, in every
// codebook format: each against the oracle on the kernel's operands, and against each other —
// the same products summed in another order, and each warp's running maximum, to which its
// probabilities are rounded to fp16 for the value MMA, differs with the order: bound 4e-6 as
// between the four-row and 8-row kernels, 50x below kAttnNmse. The launch counter must show
// that the defaults' one-row-tile kernels took the window first and d4b8's (staged window) did
// not; launches that took one order only must give outputs equal bit for bit in both settings.
// Cases: the window in the last of 16 splits, batch 2 with a bf16 window, a window ring
// (Stash), a sliding window over part of the codes, a sharp softmax (rescales at the switch),
// head_dim 64, prefill chunks, a window only.
TEST(CudaAttention, WindowFirstAndWindowLastAgree) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0x3F1u;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  const CacheMode mb = CacheMode::MemoryBound;
  // (case, whether its launches must take the window first: the defaults' one-row-tile kernel
  // for up to 8 query rows; d4b8's rings stage the window; 16-row chunks run register-tile
  // kernels, which keep the window last)
  const std::vector<std::pair<AttnCase, bool>> cases = {
      {{dflt, 128, 1, 8, 4, 9000, 1, 128, true, 0, DType::F16, mb, 1}, true},    // 16 splits, the window in the last
      {{dflt, 128, 2, 2, 4, 3000, 1, 128, true, 0, DType::BF16, mb, 1}, true},   // batch 2, a bf16 window
      {{dflt, 128, 2, 2, 4, 2500, 2, 96, true, 0, DType::BF16, CacheMode::Stash, 1}, true},  // a window ring
      {{dflt, 128, 1, 2, 4, 3000, 2, 128, true, 200, DType::F16, mb, 1}, true},  // sliding window: the codes in part
      {{dflt, 128, 1, 2, 4, 700, 1, 128, true, 0, DType::F16, mb, 3}, true},     // sharp softmax
      {{dflt, 64, 2, 2, 2, 2000, 3, 32, true, 0, DType::F32, mb, 1}, true},      // head_dim 64, 6 rows
      {{dflt, 128, 2, 1, 4, 2000, 37, 64, true, 0, DType::F16, mb, 1}, false},   // prefill chunks
      {{dflt, 128, 1, 2, 4, 0, 1, 16, true, 0, DType::F16, mb, 1}, false},       // window only
      {{d4b8, 128, 1, 8, 4, 9000, 1, 128, true, 0, DType::F16, mb, 1}, false},   // d4b8: staged window, last
      {{d4b8, 128, 2, 2, 4, 3000, 2, 128, true, 0, DType::BF16, mb, 1}, false},
  };
  int first_cases = 0;
  SwitchedWorst worst;
  for (CodebookFormat fmt : {CodebookFormat::F16, CodebookFormat::I8, CodebookFormat::E4M3, CodebookFormat::I8KV}) {
    for (const auto& [a, must_first] : cases) {
      if (!compiled(a.spec, a.D)) continue;
      SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt));
      const OracleCase oc = oracle_case(a, rng, fmt);
      const SwitchedOutputs r =
          with_and_without(cuda::attn_set_window_first, cuda::attn_window_first_launches, oc, "the window-first order");
      if (must_first) EXPECT_GT(r.launches_on, 0) << "the defaults' one-row-tile kernel did not take the window first";
      if (a.spec.kb == 8 && a.spec.vs == 4) EXPECT_EQ(r.launches_on, 0) << "a d4b8 kernel took the window first";
      const bool one_order = r.launches_on == 0 || a.prefix == 0;
      if (one_order) EXPECT_EQ(r.on, r.off) << "one order only: the outputs must be equal";
      else EXPECT_LE(r.nmse_between, 4e-6) << "the two orders disagree";
      first_cases += !one_order;
      worst.add(r);
    }
  }
  EXPECT_GT(first_cases, 0);
  std::printf("[cuda attention window order] %d cases (%d with both orders), worst NMSE %.3g vs the oracle, %.3g "
              "between window first and last\n",
              worst.cases, first_cases, worst.oracle, worst.between);
}

/// One decode_step captured in a CUDA graph over a CPU twin: prefix of P tokens, reserve and
/// plan for `steps` more, fp16 step tensors. replay() runs the steps (fresh q, k, v each),
/// comparing every step's output with the oracle on the CPU cache (codebook format fmt).
struct GraphDecodeRig {
  int B = 0, H = 0, G = 0, D = 0, P = 0, steps = 0;
  CodebookFormat fmt = CodebookFormat::F16;
  cudaStream_t stream = nullptr;
  std::unique_ptr<VecInferKVCache> cpu;
  std::unique_ptr<KVCache> gpu_owner;
  CudaKVCache* gpu = nullptr;
  Tensor dq, dk, dv, dout;
  SdpaParams p;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  long long captured_clusters = 0;  ///< cluster launches recorded by the capture
  long long captured_overlaps = 0;  ///< overlapped steps (encode beside attention) captured

  void init(const KVCacheConfig& c, int batch, int groups, int prefix, int n_steps, std::mt19937_64& rng) {
    B = batch, H = c.n_kv_heads, G = groups, D = c.head_dim, P = prefix, steps = n_steps;
    fmt = c.attention_codebooks;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    cpu = std::make_unique<VecInferKVCache>(c);
    KVCacheConfig cc = on_cuda(c);
    cc.stream = stream;
    gpu_owner = KVCacheFactory::create(cc);
    gpu = as_cuda(gpu_owner.get());
    Tensor k = random_tensor({B, H, P, D}, DType::F32, rng), v = random_tensor({B, H, P, D}, DType::F32, rng);
    cpu->update(k.view(), v.view());
    gpu->update(to_device(k).view(), to_device(v).view());
    gpu->reserve(P + steps);
    gpu->plan_decode(H * G, 1, P + steps);
    dq = Tensor::empty({B, H * G, 1, D}, DType::F16, Device::cuda(0));
    dk = Tensor::empty({B, H, 1, D}, DType::F16, Device::cuda(0));
    dv = Tensor::empty({B, H, 1, D}, DType::F16, Device::cuda(0));
    dout = Tensor::empty({B, H * G, 1, D}, DType::F16, Device::cuda(0));
    const long long before = cuda::attn_cluster_launches(), before_ov = cuda::overlapped_steps();
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    gpu->decode_step(dq.view(), dk.view(), dv.view(), dout.view(), p);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    captured_clusters = cuda::attn_cluster_launches() - before;
    captured_overlaps = cuda::overlapped_steps() - before_ov;
    EXPECT_EQ(gpu->offset(), P) << "capturing must not advance the host lengths";
  }

  /// Replays the graph `steps` times, each step's NMSE EXPECTed under kAttnNmse (the worst into
  /// *worst), then checks that the device lengths advanced by `steps` without an error.
  void replay(std::mt19937_64& rng, double* worst) {
    *worst = 0;
    for (int st = 0; st < steps; ++st) {
      Tensor q = random_tensor({B, H * G, 1, D}, DType::F16, rng);
      Tensor kn = random_tensor({B, H, 1, D}, DType::F16, rng), vn = random_tensor({B, H, 1, D}, DType::F16, rng);
      ASSERT_EQ(cudaMemcpy(dq.data(), q.data(), size_t(q.nbytes()), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dk.data(), kn.data(), size_t(kn.nbytes()), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dv.data(), vn.data(), size_t(vn.nbytes()), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      cpu->update(kn.view(), vn.view());
      Tensor want = Tensor::empty(q.sizes(), DType::F32);
      ProductQuantizer kq, vq;
      vecinfer_attention_ref(oracle_inputs(*cpu, fmt, kq, vq), q.view(), want.view(), p);
      const double e = nmse(floats(dout), want.to_vector_f32());
      EXPECT_LE(e, kAttnNmse) << "step " << st;
      *worst = std::max(*worst, e);
    }
    gpu->sync_seq_lens();
    EXPECT_EQ(gpu->offset(), P + steps);
    EXPECT_FALSE(gpu->device_error());
  }

  ~GraphDecodeRig() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    gpu_owner.reset();
    if (stream) cudaStreamDestroy(stream);
  }
};

// A captured decode step whose attention splits (8 segments x 5 splits): on sm_90 it is
// captured as a cluster launch (the other graph tests plan one split), replayed, and must
// match the CPU oracle at every step.
TEST(CudaDecode, GraphCapturedSplitStepsMatchTheOracle) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(47);
  const Spec s{4, 8, 4, 8};
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  GraphDecodeRig rig;
  rig.init(vq_config(s, CacheMode::MemoryBound, 128, 128, 8, rng), 1, 4, 2600, 12, rng);
  if (HasFatalFailure()) return;
  if (major >= 9)
    EXPECT_EQ(rig.captured_clusters, 1) << "the captured split attention should be a cluster launch on sm_" << major
                                        << "x";
  double worst = 0;
  rig.replay(rng, &worst);
  if (HasFatalFailure()) return;
  std::printf("[cuda graph split] d4b8/d4b8 1x%d kv heads, %d replayed steps, %lld clustered launch(es) captured, "
              "worst NMSE %.3g\n",
              rig.H, rig.steps, rig.captured_clusters, worst);
}

/// A captured decode-step sequence on the plain kernel's head dims: configuration, mode, codebook
/// format, head_dim, window R, kv heads H, batch B, history, replayed steps (GQA group 4).
struct PlainGraphCase {
  Spec s;
  CacheMode mode;
  CodebookFormat fmt;
  int D, R, H, B, prefix, steps;
};
/// Captures and replays each case against the CPU cache (GraphDecodeRig), raising `worst` to the
/// worst NMSE; the plain kernel never runs as a cluster. Returns at a fatal failure.
void replay_plain_graph_cases(const std::vector<PlainGraphCase>& graphs, std::mt19937_64& rng, double& worst) {
  for (const PlainGraphCase& g : graphs) {
    SCOPED_TRACE(g.s.str() + "@" + std::to_string(g.D) + " " + cache_mode_name(g.mode) + " " +
                 codebook_format_name(g.fmt) + " graph");
    KVCacheConfig c = vq_config(g.s, g.mode, g.D, g.R, g.H, rng);
    c.attention_codebooks = g.fmt;
    GraphDecodeRig rig;
    rig.init(c, g.B, 4, g.prefix, g.steps, rng);
    if (::testing::Test::HasFatalFailure()) return;
    if (!cuda::attn_tuned_compiled({g.D, g.s.ks, g.s.kb, g.s.vs, g.s.vb, 1, int(g.fmt)})) EXPECT_EQ(rig.captured_clusters, 0);
    double w = 0;
    rig.replay(rng, &w);
    if (::testing::Test::HasFatalFailure()) return;
    worst = std::max(worst, w);
  }
}

// ------------------------------------------------------------------------------------------
// Head dims 80, 96, 112, 160 and 192 (Phi-2, StableLM; Phi-3; MPT-30B; StableLM-2-12B): the plain
// attention kernel (attention_any_dim_kernel.cuh) over codes the encoder wrote with the
// block-diagonal Hadamard rotation (blocks of 16, 32, 16, 32 and 64). Fixed shapes that reach each
// of its paths (splits merged through the workspace, 16-row chunks, a prompt as row chunks, ring
// and linear window rows, Standard and Stash, no history, sliding and non-causal masks, GQA 1 to
// 8, batch 3, 320 segments; a subset at 112-192), in every codebook format, against the oracle on
// the kernel's operands (kAttnNmse) and loosely against the f32-codebook exact-query oracle; then
// captured decode steps (one at each head dim but 80's, one of them split), replayed against the
// oracle. The random cases of the tests above draw these head dims too.
TEST(CudaAttention, PlainKernelHeadDimsMatchTheOracle) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0x9680;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8}, d8b12{8, 12, 8, 12}, mixed{4, 10, 8, 12};
  const CacheMode mb = CacheMode::MemoryBound;
  std::vector<AttnCase> cases;
  for (int D : {80, 96, 112, 160, 192}) {
    // 112, 160, 192 (the same kernel, other shapes: value-phase mapping, layout, Hadamard blocks
    // of 16, 32 and 64, window rows loaded in two halves past 128): the cases marked `all`
    const bool all = D <= 96;
    cases.push_back({d4b8, D, 1, 8, 4, 6000, 1, 128, true, 0, DType::F16, mb, 1});        // splits
    cases.push_back({dflt, D, 2, 2, 4, 3000, 1, 128, true, 0, DType::BF16, mb, 1});       // splits, bf16 rows
    cases.push_back({d4b8, D, 3, 2, 8, 700, 2, 32, true, 0, DType::F32, mb, 1});          // 16 rows, batch 3
    cases.push_back({d8b12, D, 1, 1, 1, 300, 16, 8, true, 0, DType::F16, mb, 1});         // q_len 16, GQA 1
    cases.push_back({mixed, D, 2, 1, 4, 400, 37, 64, true, 0, DType::F16, mb, 1});        // a prompt: row chunks
    if (all) cases.push_back({dflt, D, 1, 3, 2, 1500, 211, 128, true, 150, DType::BF16, mb, 1});  // long chunk, sliding
    cases.push_back({d4b8, D, 1, 1, 8, 0, 260, 16, true, 0, DType::F32, CacheMode::Stash, 1});  // no history
    cases.push_back({d4b8, D, 1, 2, 4, 900, 3, 16, true, 100, DType::F16, mb, 1});        // sliding window
    if (all) cases.push_back({dflt, D, 1, 2, 2, 200, 4, 16, false, 0, DType::F32, mb, 1});  // non-causal
    if (all) cases.push_back({d4b8, D, 1, 2, 4, 800, 1, 128, true, 0, DType::F16, mb, 3});  // sharp softmax
    cases.push_back({dflt, D, 2, 2, 4, 333, 2, 128, true, 0, DType::F16, CacheMode::Stash, 1});
    if (all) cases.push_back({d4b8, D, 1, 3, 2, 250, 3, 16, true, 0, DType::F16, CacheMode::Standard, 1});
    cases.push_back({d4b8, D, 1, 2, 4, 500, 40, 64, true, 0, DType::BF16, CacheMode::Standard, 1});  // Standard prompt
    if (all) cases.push_back({d4b8, D, 40, 8, 4, 700, 1, 128, true, 0, DType::F16, mb, 1});  // 320 segments
  }
  const std::vector<std::pair<CodebookFormat, double>> fmts = {
      {CodebookFormat::F16, kAttnNmse}, {CodebookFormat::E4M3, 5e-2}, {CodebookFormat::I8, 5e-3}, {CodebookFormat::I8KV, 5e-3}};
  double worst = 0, worst_f32 = 0;
  int run = 0;
  for (const AttnCase& a : cases) {
    ASSERT_TRUE(compiled(a.spec, a.D)) << describe(a);
    for (const auto& [fmt, f32_bound] : fmts) {
      SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt));
      double vs_f32 = 0;
      const double e = run_attn_case(a, rng, fmt, &vs_f32);
      EXPECT_LE(e, kAttnNmse);
      if (a.mode != CacheMode::Standard) EXPECT_LE(vs_f32, f32_bound);
      worst = std::max(worst, e), worst_f32 = std::max(worst_f32, vs_f32);
      ++run;
    }
  }
  // captured decode steps: the encode beside attention (MemoryBound with a window), the serial
  // step (Stash), and a split step (8 segments over several splits, merged through the workspace:
  // the plain kernel never runs as a cluster)
  double worst_graph = 0;
  const std::vector<PlainGraphCase> graphs = {{dflt, mb, CodebookFormat::I8, 96, 32, 2, 2, 300, 20},
                                              {d4b8, CacheMode::Stash, CodebookFormat::F16, 80, 32, 2, 2, 300, 20},
                                              {d4b8, mb, CodebookFormat::I8KV, 96, 128, 8, 1, 2600, 12},
                                              {dflt, mb, CodebookFormat::I8, 192, 32, 2, 2, 300, 12},
                                              {d4b8, CacheMode::Stash, CodebookFormat::F16, 112, 32, 2, 2, 300, 12},
                                              {d4b8, mb, CodebookFormat::E4M3, 160, 64, 2, 1, 1200, 8}};
  replay_plain_graph_cases(graphs, rng, worst_graph);
  if (HasFatalFailure()) return;
  std::printf("[cuda plain kernel, head_dim 80-192] %d cases, worst NMSE %.3g vs the oracle on the kernel's operands "
              "(bound %.1g), %.3g vs the f32-codebook exact-query oracle; %zu captured step sequences, worst %.3g\n",
              run, worst, kAttnNmse, worst_f32, graphs.size(), worst_graph);
}

// The plain kernel at head_dim 64, 128 and 256 serves every configuration no tuned kernel does
// (the default build tunes only d4b8/d4b8 and d4b12/d8b8 at 64 and 128: the paper's d8b12/d8b12
// and Gemma's head_dim 256 were refused before): decode, 12-row chunks (two row tiles at <= 128),
// prompts, sliding windows, Stash and Standard caches, every codebook format, captured decode
// steps, and the fp16 cache at 256; each against the oracle, and the plain kernel counted where
// this build has no tuned kernel for the case (an ALL_CONFIGS build runs the tuned ones).
TEST(CudaAttention, PlainKernelServesWhatNoTunedKernelDoes) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0x64128256;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8}, d8b12{8, 12, 8, 12}, mixed{4, 10, 8, 12}, d8b8{8, 8, 8, 8};
  const CacheMode mb = CacheMode::MemoryBound;
  std::vector<AttnCase> cases;
  for (int D : {64, 128, 256}) {
    cases.push_back({d8b12, D, 1, 8, 4, 3000, 1, 128, true, 0, DType::F16, mb, 1});        // decode, splits
    cases.push_back({mixed, D, 2, 2, 4, 700, 3, 32, true, 0, DType::BF16, mb, 1});        // 12 rows a kv head
    cases.push_back({d8b8, D, 1, 2, 2, 400, 37, 64, true, 0, DType::F16, mb, 1});         // a prompt
    cases.push_back({d8b12, D, 1, 2, 4, 900, 2, 16, true, 100, DType::F32, mb, 1});       // sliding window
    cases.push_back({d8b8, D, 2, 2, 4, 333, 2, 128, true, 0, DType::F16, CacheMode::Stash, 1});
    cases.push_back({mixed, D, 1, 2, 4, 500, 20, 64, true, 0, DType::BF16, CacheMode::Standard, 1});
    if (D == 256) {  // no tuned kernel at 256 in the default build
      cases.push_back({d4b8, D, 1, 8, 4, 6000, 1, 128, true, 0, DType::F16, mb, 1});
      cases.push_back({dflt, D, 2, 2, 4, 3000, 1, 128, true, 0, DType::BF16, mb, 1});
      cases.push_back({d4b8, D, 1, 2, 4, 800, 1, 128, true, 0, DType::F16, mb, 3});       // sharp softmax
    }
  }
  const std::vector<std::pair<CodebookFormat, double>> fmts = {
      {CodebookFormat::F16, kAttnNmse}, {CodebookFormat::E4M3, 5e-2}, {CodebookFormat::I8, 5e-3}, {CodebookFormat::I8KV, 5e-3}};
  double worst = 0;
  int run = 0, plain_cases = 0;
  for (const AttnCase& a : cases) {
    ASSERT_TRUE(runs_on_cuda(a.spec, a.D)) << describe(a);
    for (const auto& [fmt, f32_bound] : fmts) {
      SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt));
      // (a Standard cache attends over its dequantized rows: the fp16 cache's kernel)
      const cuda::AttnConfigKey key = a.mode == CacheMode::Standard
                                          ? cuda::AttnConfigKey{a.D, 4, 8, 4, 8, 1, 0}
                                          : cuda::AttnConfigKey{a.D, a.spec.ks, a.spec.kb, a.spec.vs, a.spec.vb, 1, int(fmt)};
      const bool plain = !cuda::attn_tuned_compiled(key);
      const long long before = cuda::attn_plain_launches();
      double vs_f32 = 0;
      const double e = run_attn_case(a, rng, fmt, &vs_f32);
      EXPECT_LE(e, kAttnNmse);
      if (a.mode != CacheMode::Standard) EXPECT_LE(vs_f32, f32_bound);
      // (decode-sized chunks: a prompt may take a prefill kernel over expanded rows instead)
      if (a.q_len <= 16) EXPECT_EQ(cuda::attn_plain_launches() > before, plain) << "which kernel ran";
      worst = std::max(worst, e);
      plain_cases += plain;
      ++run;
    }
  }
  // captured decode steps: the encode beside attention, the serial step (Stash), a split step
  double worst_graph = 0;
  const std::vector<PlainGraphCase> graphs = {{d8b12, mb, CodebookFormat::I8, 128, 32, 2, 2, 300, 12},
                                              {d4b8, CacheMode::Stash, CodebookFormat::F16, 256, 32, 2, 2, 300, 12},
                                              {dflt, mb, CodebookFormat::I8, 256, 128, 8, 1, 2600, 8},
                                              {mixed, mb, CodebookFormat::E4M3, 64, 64, 2, 1, 1200, 8}};
  replay_plain_graph_cases(graphs, rng, worst_graph);
  if (HasFatalFailure()) return;
  // the fp16 cache at head_dim 256: decode, two chunks of 8 rows, a prompt
  double worst_fp16 = 0;
  {
    KVCacheConfig c;
    c.kind = CacheKind::FP16;
    c.head_dim = 256;
    c.step = 32;
    FP16KVCache cpu(c);
    auto gpu = make_cuda(c);
    const int B = 2, H = 2, G = 4;
    for (int64_t n : {int64_t(45), int64_t(600)}) {
      Tensor k = random_tensor({B, H, n, 256}, DType::F32, rng), v = random_tensor({B, H, n, 256}, DType::F32, rng);
      auto [ck, cv] = cpu.update_and_fetch(k.view(), v.view());
      auto [gk, gv] = gpu->update_and_fetch(to_device(k).view(), to_device(v).view());
      EXPECT_EQ(floats(gk), ck.to_vector_f32());
      for (int q_len : {1, 3, 40}) {
        Tensor q = random_tensor({B, H * G, q_len, 256}, DType::F16, rng);
        Tensor want = Tensor::empty(q.sizes(), DType::F32);
        attention_ref(q.view(), ck.view(), cv.view(), want.view(), SdpaParams{});
        const double e = nmse(floats(gpu->fused_sdpa(to_device(q).view(), SdpaParams{})), want.to_vector_f32());
        EXPECT_LE(e, kAttnNmse) << "fp16 cache, q_len " << q_len;
        worst_fp16 = std::max(worst_fp16, e);
      }
    }
  }
  std::printf("[cuda plain kernel, head_dim 64/128/256] %d cases (%d on the plain kernel in this build), worst NMSE "
              "%.3g vs the oracle on the kernel's operands (bound %.1g); %zu captured step sequences, worst %.3g; fp16 "
              "cache at 256 worst %.3g\n",
              run, plain_cases, worst, kAttnNmse, graphs.size(), worst_graph, worst_fp16);
  if (!cuda::attn_tuned_compiled({128, 8, 12, 8, 12, 1, 0})) EXPECT_GT(plain_cases, 0);
}

// The plain kernel's replicated codebooks (attn_set_plain_replicated): a codebook of at most 256
// entries held once per lane of a shared-memory wavefront changes where a centroid is read, not
// what is computed, so the outputs with and without must agree bit for bit; the launch counter
// says which path ran (keys and values replicated at d4b8 and d8b8, values only for the
// defaults' 4096-entry keys, neither at d8b12), and both match the oracle. Every codebook
// format (each decodes into the fp16 copies differently); GQA 1 to 8 (the 1-, 4-, 8- and 16-row
// instantiations: at 16 rows d4b8 keeps one copy of its values, as both would cost a block a
// multiprocessor), splits, a window-only Standard launch, Stash, bf16 windows, sliding masks.
TEST(CudaAttention, PlainKernelReplicatedCodebooksChangeNothing) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0x9680e;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8}, d8b8{8, 8, 8, 8}, d8b12{8, 12, 8, 12};
  const CacheMode mb = CacheMode::MemoryBound;
  struct Case {
    AttnCase a;
    bool replicated;  // whether any codebook of the case is held per lane
  };
  std::vector<Case> cases;
  for (int D : {80, 96}) {
    cases.push_back({{d4b8, D, 1, 4, 4, 5000, 1, 128, true, 0, DType::F16, mb, 1}, true});        // G 4, splits
    cases.push_back({{d4b8, D, 2, 4, 1, 900, 1, 64, true, 0, DType::BF16, mb, 3}, true});         // G 1 (Phi-3), sharp
    cases.push_back({{d4b8, D, 1, 2, 8, 700, 2, 32, true, 0, DType::F16, mb, 1}, true});          // 16 rows
    cases.push_back({{dflt, D, 2, 2, 4, 1500, 1, 128, true, 0, DType::BF16, mb, 1}, true});       // values only
    cases.push_back({{d8b8, D, 1, 2, 8, 600, 1, 16, true, 200, DType::F32, mb, 1}, true});        // d8, sliding
    cases.push_back({{d8b12, D, 1, 2, 4, 400, 1, 16, true, 0, DType::F16, mb, 1}, false});        // nothing fits
    cases.push_back({{d4b8, D, 1, 2, 4, 333, 1, 32, true, 0, DType::F16, CacheMode::Stash, 1}, true});
    cases.push_back({{d4b8, D, 1, 2, 4, 250, 1, 16, true, 0, DType::F16, CacheMode::Standard, 1}, false});  // rows only
  }
  SwitchedWorst worst;
  int replicated = 0;
  for (CodebookFormat fmt : {CodebookFormat::F16, CodebookFormat::E4M3, CodebookFormat::I8, CodebookFormat::I8KV}) {
    for (const Case& c : cases) {
      const AttnCase& a = c.a;
      if (a.mode == CacheMode::Standard && fmt != CodebookFormat::F16) continue;  // (exact rows: no codebook format)
      ASSERT_TRUE(compiled(a.spec, a.D)) << describe(a);
      SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt));
      const OracleCase oc = oracle_case(a, rng, fmt);
      const SwitchedOutputs r =
          with_and_without(cuda::attn_set_plain_replicated, cuda::attn_plain_replicated_launches, oc, "replicated codebooks");
      EXPECT_EQ(r.launches_on > 0, c.replicated) << "which path ran";
      ASSERT_EQ(r.on.size(), r.off.size());
      size_t differ = 0;
      for (size_t i = 0; i < r.on.size(); ++i) differ += std::memcmp(&r.on[i], &r.off[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << "outputs that differ with and without the copies, of " << r.on.size();
      replicated += r.launches_on > 0;
      worst.add(r);
    }
  }
  EXPECT_GT(replicated, 0);
  std::printf("[cuda plain kernel, replicated codebooks] %d cases (%d with copies), outputs equal bit for bit with and "
              "without; worst NMSE %.3g vs the oracle\n",
              worst.cases, replicated, worst.oracle);
}

// Prompts at head dims 80 and 96: the exact-rows prefill kernel (prefill_exact_kernel.cuh, its
// only prefill kernel there) over a Standard cache's rows (the prefill kernel forced), a
// memory-bound cache's tokens expanded into rows (vq_materialize_lanes_kernel: LPR 5 and 6 lanes a
// row, the block-diagonal rotation's cross-lane stages within a block of 32 only) and a Stash
// cache's held rows; fp16 and bf16 rows, GQA 1 to 8, causal, non-causal and sliding masks, batch 2,
// chunks and histories that end mid-tile; every codebook format. Against the oracle on the
// kernel's operands and against the plain kernel's row chunks on the same call (launches counted,
// so a silent fallback fails), the cache's state unchanged; then the history split over 2 and 4
// blocks (vq_prefill_merge_kernel at 80: a lane's last dims in part) against the unsplit kernel.
TEST(CudaAttention, ExactRowsPrefillAtHeadDims80And96) {
  VQ_SKIP_WITHOUT_GPU();
  const uint64_t seed = 0x8096E;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8}, d8b12{8, 12, 8, 12};
  const CacheMode mb = CacheMode::MemoryBound;
  std::vector<AttnCase> cases;
  for (int D : {80, 96}) {
    cases.push_back({d4b8, D, 2, 2, 4, 900, 150, 64, true, 0, DType::F16, CacheMode::Standard, 1});     // batch 2
    cases.push_back({d4b8, D, 1, 2, 4, 1200, 97, 128, true, 200, DType::BF16, CacheMode::Standard, 1});  // bf16, sliding
    cases.push_back({dflt, D, 2, 2, 4, 1000, 77, 64, true, 0, DType::F16, mb, 1});                      // rows, batch 2
    cases.push_back({dflt, D, 1, 3, 2, 500, 45, 128, true, 100, DType::BF16, mb, 1});                   // rows, sliding
    cases.push_back({d4b8, D, 1, 2, 8, 300, 120, 0, false, 0, DType::F32, mb, 1});                      // no window, G 8
    cases.push_back({d8b12, D, 2, 1, 1, 70, 33, 16, true, 0, DType::F16, mb, 1});                       // G 1, d8 keys
    cases.push_back({d4b8, D, 1, 1, 8, 0, 260, 16, true, 0, DType::BF16, mb, 3});                       // no history, sharp
    cases.push_back({dflt, D, 2, 2, 4, 333, 40, 64, true, 0, DType::BF16, CacheMode::Stash, 1});       // held rows
  }
  const std::vector<CodebookFormat> fmts = {CodebookFormat::F16, CodebookFormat::E4M3, CodebookFormat::I8,
                                            CodebookFormat::I8KV};
  double worst = 0, worst_chunks = 0, worst_split = 0;
  int run = 0, over_rows = 0;
  for (const AttnCase& a : cases) {
    ASSERT_TRUE(compiled(a.spec, a.D)) << describe(a);
    for (CodebookFormat fmt : fmts) {
      if (a.mode == CacheMode::Standard && fmt != CodebookFormat::F16) continue;  // (exact rows: no codebook format)
      if (a.mode == CacheMode::Stash && fmt != CodebookFormat::F16) continue;      // (held rows agree with fp16 codebooks)
      SCOPED_TRACE(describe(a) + " " + codebook_format_name(fmt));
      OracleCase oc = oracle_case(a, rng, fmt);
      const CacheState before_state = oc.cc.gpu->state();
      const bool std_mode = a.mode == CacheMode::Standard;
      // the exact-rows kernel: forced for the Standard cache (its small grid), over rows otherwise
      const int prev_mode = cuda::set_prefill_mode(std_mode ? cuda::kPrefillAlways : cuda::kPrefillAuto);
      const int prev_rows = cuda::set_prefill_rows_mode(cuda::kRowsAlways);
      const long long e0 = cuda::prefill_exact_launches(), r0 = cuda::prefill_rows_launches();
      const std::vector<float> rows = floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp));
      EXPECT_EQ(cuda::prefill_exact_launches() - e0, 1);
      EXPECT_EQ(cuda::prefill_rows_launches() - r0, std_mode ? 0 : 1);
      over_rows += !std_mode;
      // the history split over 2 and 4 blocks, then merged
      for (int splits : {2, 4}) {
        SCOPED_TRACE("history split over " + std::to_string(splits));
        const int prev_splits = cuda::set_prefill_exact_splits(splits);
        const long long s0 = cuda::prefill_split_launches();
        const std::vector<float> o = floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp));
        cuda::set_prefill_exact_splits(prev_splits);
        EXPECT_EQ(cuda::prefill_split_launches() - s0, 1);
        const double between = nmse(o, rows);
        EXPECT_LE(between, 1e-5) << "against the unsplit kernel";
        worst_split = std::max(worst_split, between);
      }
      // the plain kernel's row chunks on the same call
      cuda::set_prefill_mode(cuda::kPrefillOff);
      cuda::set_prefill_rows_mode(cuda::kRowsOff);
      const long long k0 = cuda::prefill_launches();
      const std::vector<float> chunks = floats(oc.cc.gpu->fused_sdpa(oc.qd.view(), oc.sp));
      EXPECT_EQ(cuda::prefill_launches(), k0);
      cuda::set_prefill_rows_mode(prev_rows);
      cuda::set_prefill_mode(prev_mode);
      const double e = nmse(rows, oc.ref), e_chunks = nmse(chunks, oc.ref);
      EXPECT_LE(e, kAttnNmse);
      EXPECT_LE(e_chunks, kAttnNmse);
      EXPECT_LE(nmse(rows, chunks), kAttnNmse);
      expect_same_state(before_state, oc.cc.gpu->state(), "after prefill over rows");
      worst = std::max(worst, e), worst_chunks = std::max(worst_chunks, e_chunks);
      ++run;
    }
  }
  EXPECT_EQ(run, 2 * (2 + 5 * 4 + 1));
  EXPECT_EQ(over_rows, 2 * (5 * 4 + 1));
  std::printf("[cuda prefill, head_dim 80/96] %d calls (%d over expanded or held rows), worst NMSE %.3g (row chunks "
              "%.3g) against the oracle, %.3g split against unsplit\n",
              run, over_rows, worst, worst_chunks, worst_split);
}

// ------------------------------------------------------------------------------------------
TEST(CudaFP16Cache, FetchAndAttentionMatchTheCpuCache) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(11);
  for (DType st : {DType::F16, DType::BF16})
    for (int D : {64, 128, 80, 96}) {
      const bool tuned = D == 64 || D == 128;  // 80, 96: the plain kernel (no four-row kernel)
      KVCacheConfig c;
      c.kind = CacheKind::FP16;
      c.head_dim = D;
      c.storage_dtype = st;
      c.step = 32;
      FP16KVCache cpu(c);
      auto gpu = make_cuda(c);
      const int B = 2, H = 2, G = 4;
      for (int64_t n : {int64_t(45), int64_t(1), int64_t(600)}) {
        Tensor k = random_tensor({B, H, n, D}, DType::F32, rng), v = random_tensor({B, H, n, D}, DType::F32, rng);
        auto [ck, cv] = cpu.update_and_fetch(k.view(), v.view());
        auto [gk, gv] = gpu->update_and_fetch(to_device(k).view(), to_device(v).view());
        EXPECT_EQ(floats(gk), ck.to_vector_f32());
        EXPECT_EQ(floats(gv), cv.to_vector_f32());
        // q_len 3: 12 rows a kv head (8-row kernel, two chunks); q_len 1: 4 rows (the four-row
        // kernel); q_len 40: the prefill kernel (forced: this small grid would not fill the GPU;
        // at 80 and 96 the exact-rows one)
        for (int q_len : {3, 1, 40}) {
          Tensor q = random_tensor({B, H * G, q_len, D}, DType::F16, rng);
          Tensor want = Tensor::empty(q.sizes(), DType::F32);
          SdpaParams p;
          attention_ref(q.view(), ck.view(), cv.view(), want.view(), p);
          const long long rows4 = cuda::attn_rows4_launches(), pre = cuda::prefill_launches();
          const int prev = cuda::set_prefill_mode(cuda::kPrefillAlways);
          Tensor got = gpu->fused_sdpa(to_device(q).view(), p);
          cuda::set_prefill_mode(prev);
          EXPECT_LE(nmse(floats(got), want.to_vector_f32()), kAttnNmse) << dtype_name(st) << " D=" << D << " q_len=" << q_len;
          EXPECT_EQ(cuda::attn_rows4_launches() > rows4, tuned && q_len == 1) << "which kernel ran, q_len=" << q_len;
          EXPECT_EQ(cuda::prefill_launches() > pre, q_len == 40) << "which kernel ran, q_len=" << q_len;
        }
      }
      EXPECT_EQ(gpu->trim(100), 100);
      EXPECT_EQ(gpu->offset(), 546);
      EXPECT_EQ(gpu->state().size(), 2u);
    }
}

// ------------------------------------------------------------------------------------------
TEST(CudaCache, StatesRoundTripBetweenCpuAndCuda) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(21);
  const Spec s{4, 8, 4, 8};
  for (CacheMode mode : {CacheMode::MemoryBound, CacheMode::Stash, CacheMode::Standard}) {
    SCOPED_TRACE(cache_mode_name(mode));
    KVCacheConfig c = vq_config(s, mode, 128, 16, 2, rng);
    VecInferKVCache cpu(c);
    auto gpu = make_cuda(c);
    Tensor k = random_tensor({1, 2, 150, 128}, DType::F32, rng), v = random_tensor({1, 2, 150, 128}, DType::F32, rng);
    cpu.update(k.view(), v.view());
    gpu->update(to_device(k).view(), to_device(v).view());
    ASSERT_EQ(gpu->trim(7), 7);
    ASSERT_EQ(cpu.trim(7), 7);
    const CacheState sg = gpu->state();
    const CacheMetaState mg = gpu->meta_state(), mc = cpu.meta_state();
    for (const auto& [key, val] : mc)
      if (key != "capacity") EXPECT_EQ(mg.at(key), val) << key;
    // CUDA state → CPU cache, and CPU state → a fresh CUDA cache
    auto back = VecInferKVCache::from_state(sg, mg);
    auto gpu2 = make_cuda(c);
    gpu2->restore(cpu.state(), cpu.meta_state());
    EXPECT_EQ(gpu2->offset(), 143);
    Tensor q = random_tensor({1, 8, 1, 128}, DType::F32, rng);
    SdpaParams p;
    const std::vector<float> a = floats(back->fused_sdpa(q.view(), p));
    const std::vector<float> b = floats(gpu2->fused_sdpa(to_device(q).view(), p));
    const std::vector<float> r = floats(cpu.fused_sdpa(q.view(), p));
    EXPECT_LE(nmse(a, r), 1e-10);
    EXPECT_LE(nmse(b, device_oracle(cpu, c.attention_codebooks, q, p)), kAttnNmse);
    // both continue identically after more tokens
    Tensor k2 = random_tensor({1, 2, 20, 128}, DType::F32, rng), v2 = random_tensor({1, 2, 20, 128}, DType::F32, rng);
    cpu.update(k2.view(), v2.view());
    gpu2->update(to_device(k2).view(), to_device(v2).view());
    EXPECT_LE(nmse(floats(gpu2->fused_sdpa(to_device(q).view(), p)), device_oracle(cpu, c.attention_codebooks, q, p)),
              kAttnNmse);
  }
}

TEST(CudaCache, BadInputsThrowAndLeaveTheCacheUnchanged) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  const Spec s{4, 8, 4, 8};
  KVCacheConfig c = vq_config(s, CacheMode::MemoryBound, 64, 8, 2, rng);
  auto gpu = make_cuda(c);
  Tensor k = random_tensor({1, 2, 10, 64}, DType::F32, rng), v = random_tensor({1, 2, 10, 64}, DType::F32, rng);
  gpu->update(to_device(k).view(), to_device(v).view());
  const CacheState before = gpu->state();
  Tensor bad = random_tensor({1, 2, 3, 64}, DType::F32, rng);
  bad.ptr<float>()[17] = NAN;
  Tensor ok = random_tensor({1, 2, 3, 64}, DType::F32, rng);
  EXPECT_THROW(gpu->update(to_device(bad).view(), to_device(ok).view()), ValueError);
  Tensor wrong = random_tensor({1, 3, 3, 64}, DType::F32, rng);
  EXPECT_THROW(gpu->update(to_device(wrong).view(), to_device(wrong).view()), ShapeError);
  Tensor big = random_tensor({1, 2, 3, 64}, DType::F32, rng);
  big.ptr<float>()[5] = 1e6f;  // beyond f16
  EXPECT_THROW(gpu->update(to_device(big).view(), to_device(ok).view()), ValueError);
  expect_same_state(before, gpu->state());
  EXPECT_EQ(gpu->offset(), 10);
  EXPECT_THROW(gpu->update_and_fetch(to_device(ok).view(), to_device(ok).view()), UnsupportedError);
  EXPECT_FALSE(as_cuda(gpu.get())->device_error());
}

// Eager attention's refusals, shared by both device caches: each names the offending shape or
// limit, raises before any launch and leaves the cache as it was (state and an accepted call's
// answer unchanged); the VecInfer cache's own limit (fused_sdpa_max_ctx) is refused the same way.
TEST(CudaCache, RefusedAttentionNamesTheProblemAndLeavesTheCacheUnchanged) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(17);
  for (bool vecinfer : {false, true}) {
    KVCacheConfig c;
    if (vecinfer) {
      c = vq_config(Spec{4, 8, 4, 8}, CacheMode::MemoryBound, 64, 8, 2, rng);
      c.fused_sdpa_max_ctx = 40;
    } else {
      c.kind = CacheKind::FP16;
      c.head_dim = 64;
      c.step = 32;
    }
    const std::string cls = vecinfer ? "VecInferKVCache" : "KVCache";
    SCOPED_TRACE(cls);
    auto gpu = make_cuda(c);
    Tensor k = random_tensor({1, 2, 30, 64}, DType::F32, rng), v = random_tensor({1, 2, 30, 64}, DType::F32, rng);
    gpu->update(to_device(k).view(), to_device(v).view());
    const Tensor q = to_device(random_tensor({1, 8, 2, 64}, DType::F32, rng));
    const std::vector<float> answer = floats(gpu->fused_sdpa(q.view(), {}));
    const CacheState before = gpu->state();
    auto refused = [&](auto&& call) -> std::string {
      try {
        call();
      } catch (const Error& e) {
        return e.what();
      }
      ADD_FAILURE() << "the call was accepted";
      return {};
    };
    // out of another shape
    Tensor wrong_out = Tensor::empty({1, 8, 3, 64}, DType::F32, Device::cuda(0));
    EXPECT_NE(refused([&] { gpu->fused_sdpa_into(q.view(), wrong_out.view(), {}); }).find("[1, 8, 3, 64]"),
              std::string::npos);
    EXPECT_THROW(gpu->fused_sdpa_into(q.view(), wrong_out.view(), {}), ShapeError);
    // queries whose heads are not a multiple of the cache's kv heads: the message names the class
    const Tensor q3 = to_device(random_tensor({1, 3, 1, 64}, DType::F32, rng));
    const std::string e3 = refused([&] { gpu->fused_sdpa(q3.view(), {}); });
    EXPECT_NE(e3.find(cls + "::fused_sdpa (cuda)"), std::string::npos) << e3;
    EXPECT_NE(e3.find("n_kv_heads=2"), std::string::npos) << e3;
    // a causal call of more queries than the cache holds
    const Tensor q40 = to_device(random_tensor({1, 8, 40, 64}, DType::F32, rng));
    SdpaParams causal;
    causal.causal = true;
    EXPECT_NE(refused([&] { gpu->fused_sdpa(q40.view(), causal); }).find("40 queries over 30 tokens"),
              std::string::npos);
    SdpaParams bad_scale;
    bad_scale.scale = NAN;
    EXPECT_THROW(gpu->fused_sdpa(q.view(), bad_scale), ValueError);
    if (vecinfer) {  // past fused_sdpa_max_ctx (40): refused, after a second update of 12 tokens
      Tensor k2 = random_tensor({1, 2, 12, 64}, DType::F32, rng), v2 = random_tensor({1, 2, 12, 64}, DType::F32, rng);
      auto twin = make_cuda(c);
      twin->update(to_device(k).view(), to_device(v).view());
      twin->update(to_device(k2).view(), to_device(v2).view());
      const CacheState twin_before = twin->state();
      const std::string e = refused([&] { twin->fused_sdpa(q.view(), {}); });
      EXPECT_NE(e.find("context of 42 tokens exceeds fused_sdpa_max_ctx=40"), std::string::npos) << e;
      expect_same_state(twin_before, twin->state());
    }
    expect_same_state(before, gpu->state());
    EXPECT_EQ(gpu->offset(), 30);
    const std::vector<float> again = floats(gpu->fused_sdpa(q.view(), {}));
    EXPECT_LE(nmse(again, answer), 1e-12) << "an accepted call after the refusals answers as before them";
    EXPECT_FALSE(as_cuda(gpu.get())->device_error());
  }
}

// decode_step_raw is decode_step over raw device pointers: two twin caches, one stepped through
// each, give the same outputs (the same kernels on the same inputs: NMSE <= 1e-12 between them)
// and end in the same state, byte for byte (fp16 and VecInfer caches, f16 and f32 inputs).
TEST(CudaDecode, RawPointerStepsEqualTensorSteps) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(23);
  for (bool vecinfer : {false, true})
    for (DType dt : {DType::F16, DType::F32}) {
      KVCacheConfig c;
      if (vecinfer) {
        c = vq_config(Spec{4, 8, 4, 8}, CacheMode::MemoryBound, 128, 16, 2, rng);
      } else {
        c.kind = CacheKind::FP16;
        c.head_dim = 128;
        c.step = 64;
      }
      SCOPED_TRACE(std::string(vecinfer ? "VecInfer " : "fp16 ") + dtype_name(dt));
      auto a = make_cuda(c), b = make_cuda(c);
      CudaKVCache *ca = as_cuda(a.get()), *cb = as_cuda(b.get());
      const int B = 2, H = 2, G = 4, D = 128, P = 70, steps = 5;
      Tensor k = random_tensor({B, H, P, D}, DType::F32, rng), v = random_tensor({B, H, P, D}, DType::F32, rng);
      for (CudaKVCache* x : {ca, cb}) {
        x->update(to_device(k).view(), to_device(v).view());
        x->reserve(P + steps, B);
        x->plan_decode(H * G, 1, P + steps);
      }
      for (int st = 0; st < steps; ++st) {
        const Tensor q = to_device(random_tensor({B, H * G, 1, D}, dt, rng));
        const Tensor kn = to_device(random_tensor({B, H, 1, D}, dt, rng));
        const Tensor vn = to_device(random_tensor({B, H, 1, D}, dt, rng));
        Tensor oa = Tensor::empty({B, H * G, 1, D}, dt, Device::cuda(0));
        Tensor ob = Tensor::empty({B, H * G, 1, D}, dt, Device::cuda(0));
        ca->decode_step(q.view(), kn.view(), vn.view(), oa.view(), {});
        cb->decode_step_raw(q.data(), kn.data(), vn.data(), ob.data(), dt, H * G, 1, {});
        ca->synchronize();
        cb->synchronize();
        EXPECT_LE(nmse(floats(oa), floats(ob)), 1e-12) << "step " << st;
      }
      EXPECT_EQ(ca->offset(), P + steps);
      EXPECT_EQ(cb->offset(), P + steps);
      expect_same_state(a->state(), b->state());
      EXPECT_FALSE(ca->device_error());
      EXPECT_FALSE(cb->device_error());
    }
}

// KVCacheFactory::create refuses exactly the configurations cuda_support reports with cache ==
// false, with its reason as the message; a cache built without its attention kernel (the fp16
// cache and the standard mode at head_dims this build lacks) raises that reason from fused_sdpa;
// everything reported as running does run, decode (q_len 1) and prompt (q_len 20) alike, close to
// the CPU cache of the same configuration (bound 1e-2: a wrong kernel or layout gives NMSE ~1; the
// kernels' own tolerances are checked by the tests above).
TEST(CudaCache, CreateAndAttentionAgreeWithCudaSupport) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(0x5099);
  const std::vector<Spec> specs = {{4, 8, 4, 8}, {4, 12, 8, 8}, {8, 12, 8, 12}, {2, 8, 4, 8}};
  int built = 0, attended = 0, refused = 0, no_kernel = 0;
  auto exercise = [&](const KVCacheConfig& c, const std::string& what) {
    SCOPED_TRACE(what);
    const CudaSupport sup = cuda_support(c);
    std::unique_ptr<KVCache> gpu;
    try {
      gpu = make_cuda(c);
    } catch (const UnsupportedError& e) {
      EXPECT_FALSE(sup.cache) << e.what();
      EXPECT_EQ(std::string(e.what()), sup.reason);
      ++refused;
      return;
    }
    ASSERT_TRUE(sup.cache) << "built, but cuda_support says: " << sup.reason;
    ++built;
    const int D = c.head_dim, H = 2;
    KVCacheConfig cc = c;
    cc.device = Device::cpu();
    auto cpu = KVCacheFactory::create(cc);
    Tensor k = random_tensor({1, H, 40, D}, DType::F16, rng), v = random_tensor({1, H, 40, D}, DType::F16, rng);
    gpu->update(to_device(k).view(), to_device(v).view());
    cpu->update(k.view(), v.view());
    for (int q_len : {1, 20}) {
      SCOPED_TRACE("q_len " + std::to_string(q_len));
      Tensor q = random_tensor({1, 2 * H, q_len, D}, DType::F16, rng, 0.3f);
      SdpaParams sp;
      sp.causal = true;
      if (sup.attention) {
        Tensor out = gpu->fused_sdpa(to_device(q).view(), sp);
        const Tensor want = cpu->fused_sdpa(q.view(), sp);
        EXPECT_LT(nmse(floats(out), floats(want)), 1e-2);
        ++attended;
      } else {
        try {
          (void)gpu->fused_sdpa(to_device(q).view(), sp);
          ADD_FAILURE() << "fused_sdpa ran where cuda_support said: " << sup.reason;
        } catch (const UnsupportedError& e) {
          EXPECT_EQ(std::string(e.what()), sup.reason);
          ++no_kernel;
        }
      }
    }
  };
  for (int D : {64, 80, 96, 112, 128, 160, 192, 256, 48})
    for (const Spec& s : specs)
      for (CacheMode mode : {CacheMode::MemoryBound, CacheMode::Standard})
        for (CodebookFormat f : {CodebookFormat::F16, CodebookFormat::I8}) {
          if (D == 48 && s.ks == 4 && s.kb == 12) continue;  // 48 is refused by head_dim alone: one spec suffices
          KVCacheConfig c = vq_config(s, mode, D, 16, 2, rng);
          c.attention_codebooks = f;
          exercise(c, s.str() + "@" + std::to_string(D) + " " + cache_mode_name(mode) + " " + codebook_format_name(f));
        }
  for (int D : {64, 80, 96, 112, 128, 160, 192, 256, 48}) {
    KVCacheConfig c;
    c.kind = CacheKind::FP16;
    c.head_dim = D;
    c.n_kv_heads = 2;
    exercise(c, "fp16 cache @" + std::to_string(D));
  }
  std::printf("create/cuda_support: %d built (%d attention calls, %d refused for want of a kernel), %d refused\n",
              built, attended, no_kernel, refused);
  EXPECT_GT(attended, 0);
  EXPECT_GT(refused, 0);
}

// ------------------------------------------------------------------------------------------
/// decode_step captured in a CUDA graph and replayed, against the CPU cache step by step.
TEST(CudaDecode, GraphCapturedStepsMatchTheCpuCache) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  for (const Spec& s : {Spec{4, 8, 4, 8}, Spec{4, 12, 8, 8}})
    for (CacheMode mode : {CacheMode::MemoryBound, CacheMode::Stash})
    for (CodebookFormat fmt : {CodebookFormat::F16, CodebookFormat::E4M3, CodebookFormat::I8, CodebookFormat::I8KV}) {
      SCOPED_TRACE(s.str() + " " + cache_mode_name(mode) + " " + codebook_format_name(fmt));
      KVCacheConfig c = vq_config(s, mode, 128, 32, 2, rng);
      c.attention_codebooks = fmt;
      GraphDecodeRig rig;
      rig.init(c, 2, 4, 300, 40, rng);
      if (HasFatalFailure()) return;
      // MemoryBound with a window: the captured step holds the encode as a branch beside attention
      // (keys and values of two sub_dims only where two overlapped launches are allowed)
      const bool overlapped = mode == CacheMode::MemoryBound && (s.ks == s.vs || cuda::overlap_two_launches());
      EXPECT_EQ(rig.captured_overlaps, overlapped ? 1 : 0);
      double worst = 0;
      rig.replay(rng, &worst);
      if (HasFatalFailure()) return;
      // the codes written by the replays equal the CPU cache's (up to near ties)
      Tensor gk, ck;
      for (const auto& [n, t] : rig.gpu->state())
        if (n == "key_codes") gk = t;
      ck = rig.cpu->key_codes();
      ASSERT_EQ(gk.sizes(), ck.sizes());
      int64_t diff = 0;
      for (int64_t i = 0; i < gk.numel(); ++i) diff += gk.ptr<uint8_t>()[i] != ck.ptr<uint8_t>()[i];
      EXPECT_LE(diff, 4) << "code bytes differing after the replays";
      std::printf("[cuda graph] %s %s %s codebooks: %d replayed steps, worst NMSE %.3g, %lld code bytes differ\n",
                  s.str().c_str(), cache_mode_name(mode), codebook_format_name(fmt), rig.steps, worst, (long long)diff);
    }
}

/// Ragged batch: sequences of different lengths decode together; each matches its own CPU cache.
TEST(CudaDecode, RaggedBatchMatchesPerSequenceCpuCaches) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(41);
  const Spec s{4, 12, 8, 8};
  const int B = 3, H = 2, G = 4, D = 128, P = 300, steps = 6;
  const std::vector<int64_t> lens{300, 170, 41};
  KVCacheConfig c = vq_config(s, CacheMode::MemoryBound, D, 64, H, rng);
  auto gpu_owner = make_cuda(c);
  CudaKVCache* gpu = as_cuda(gpu_owner.get());
  Tensor k = random_tensor({B, H, P, D}, DType::F32, rng), v = random_tensor({B, H, P, D}, DType::F32, rng);
  gpu->update(to_device(k).view(), to_device(v).view());
  gpu->set_seq_lens(lens);
  std::vector<std::unique_ptr<VecInferKVCache>> cpus;
  for (int b = 0; b < B; ++b) {
    cpus.push_back(std::make_unique<VecInferKVCache>(c));
    Tensor kb = Tensor::empty({1, H, P, D}, DType::F32), vb = Tensor::empty({1, H, P, D}, DType::F32);
    std::memcpy(kb.data(), k.ptr<float>() + b * H * P * D, size_t(H * P * D * 4));
    std::memcpy(vb.data(), v.ptr<float>() + b * H * P * D, size_t(H * P * D * 4));
    cpus[b]->update(kb.view(), vb.view());
    cpus[b]->trim(P - lens[size_t(b)]);
  }
  gpu->reserve(P + steps);
  gpu->plan_decode(H * G, 1, P);
  SdpaParams p;
  double worst = 0;
  for (int st = 0; st < steps; ++st) {
    Tensor q = random_tensor({B, H * G, 1, D}, DType::F32, rng);
    Tensor kn = random_tensor({B, H, 1, D}, DType::F32, rng), vn = random_tensor({B, H, 1, D}, DType::F32, rng);
    Tensor dout = Tensor::empty(q.sizes(), DType::F32, Device::cuda(0));
    Tensor dq = to_device(q), dk = to_device(kn), dv = to_device(vn);
    gpu->decode_step(dq.view(), dk.view(), dv.view(), dout.view(), p);
    const std::vector<float> got = floats(dout);
    for (int b = 0; b < B; ++b) {
      Tensor kb = Tensor::empty({1, H, 1, D}, DType::F32), vb = Tensor::empty({1, H, 1, D}, DType::F32);
      Tensor qb = Tensor::empty({1, H * G, 1, D}, DType::F32);
      std::memcpy(kb.data(), kn.ptr<float>() + b * H * D, size_t(H * D * 4));
      std::memcpy(vb.data(), vn.ptr<float>() + b * H * D, size_t(H * D * 4));
      std::memcpy(qb.data(), q.ptr<float>() + b * H * G * D, size_t(H * G * D * 4));
      cpus[b]->update(kb.view(), vb.view());
      const std::vector<float> want = device_oracle(*cpus[b], c.attention_codebooks, qb, p);
      const std::vector<float> g(got.begin() + b * H * G * D, got.begin() + (b + 1) * H * G * D);
      const double e = nmse(g, want);
      EXPECT_LE(e, kAttnNmse) << "step " << st << " sequence " << b;
      worst = std::max(worst, e);
    }
  }
  for (int b = 0; b < B; ++b) EXPECT_EQ(gpu->seq_lens()[size_t(b)], lens[size_t(b)] + steps);
  // 24 queries over every sequence's own length: the prefill kernel over the codes (forced), the
  // decode kernel's row chunks, and the prefill kernel over dequantized rows (forced: each
  // sequence's rows up to its own length, its own window copied), each against every sequence's oracle
  {
    Tensor q = random_tensor({B, H * G, 24, D}, DType::F32, rng);
    constexpr int kRows = 3, kRowsLanes = 4;  // over rows: the expansion a warp a row, and D / 16 lanes a row
    for (int mode : {int(cuda::kPrefillAlways), int(cuda::kPrefillOff), kRows, kRowsLanes}) {
      const int prev_lanes = cuda::set_materialize_lanes(mode == kRowsLanes ? 1 : 0);
      if (mode == kRowsLanes) mode = kRows;
      const int prev = cuda::set_prefill_mode(mode == kRows ? int(cuda::kPrefillAuto) : mode);
      const int prev_rows = cuda::set_prefill_rows_mode(mode == kRows ? cuda::kRowsAlways : cuda::kRowsOff);
      const long long pre = cuda::prefill_launches(), pre_rows = cuda::prefill_rows_launches();
      const std::vector<float> got = floats(gpu->fused_sdpa(to_device(q).view(), p));
      cuda::set_prefill_rows_mode(prev_rows);
      cuda::set_prefill_mode(prev);
      cuda::set_materialize_lanes(prev_lanes);
      EXPECT_EQ(cuda::prefill_launches() > pre, mode != cuda::kPrefillOff);
      EXPECT_EQ(cuda::prefill_rows_launches() - pre_rows, mode == kRows ? 1 : 0);
      for (int b = 0; b < B; ++b) {
        Tensor qb = Tensor::empty({1, H * G, 24, D}, DType::F32);
        std::memcpy(qb.data(), q.ptr<float>() + int64_t(b) * H * G * 24 * D, size_t(H * G * 24 * D * 4));
        const std::vector<float> want = device_oracle(*cpus[b], c.attention_codebooks, qb, p);
        const std::vector<float> g(got.begin() + int64_t(b) * H * G * 24 * D, got.begin() + int64_t(b + 1) * H * G * 24 * D);
        EXPECT_LE(nmse(g, want), kAttnNmse) << "24 queries, mode " << mode << ", sequence " << b;
      }
    }
  }
  EXPECT_THROW(gpu->state(), UnsupportedError);
  std::printf("[cuda ragged] %d steps x %d sequences, worst NMSE %.3g\n", steps, B, worst);
}

/// Tensor::copy_to in every direction: a strided CPU view uploads packed, CUDA → CUDA and CUDA →
/// CPU copy the bytes exactly (bf16: no conversion on the way), a strided CUDA view is refused
/// with its shape named, and an empty tensor copies to an empty one.
TEST(CudaTensor, CopyToRoundTripsEveryDirection) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(61);
  const Tensor h = random_tensor({3, 5, 7}, DType::BF16, rng);
  const TensorView strided(h.data(), DType::BF16, {7, 5, 3}, {1, 7, 35});  // transposed
  const Tensor packed = Tensor::copy_of(strided);
  const Tensor d = Tensor::copy_to(strided, Device::cuda(0));
  EXPECT_EQ(d.device(), Device::cuda(0));
  EXPECT_EQ(d.sizes(), strided.sizes());
  EXPECT_EQ(d.dtype(), DType::BF16);
  const Tensor back = Tensor::copy_to(d.view(), Device::cpu());
  ASSERT_EQ(back.nbytes(), packed.nbytes());
  EXPECT_EQ(std::memcmp(back.data(), packed.data(), size_t(packed.nbytes())), 0);
  const Tensor d2 = Tensor::copy_to(d.view(), Device::cuda(0));
  EXPECT_NE(d2.data(), d.data());
  const Tensor back2 = Tensor::copy_of(d2.view());
  EXPECT_EQ(std::memcmp(back2.data(), packed.data(), size_t(packed.nbytes())), 0);
  const TensorView dstrided(d.data(), DType::BF16, {5, 7, 3}, {3, 15, 1}, Device::cuda(0));
  try {
    (void)Tensor::copy_to(dstrided, Device::cpu());
    ADD_FAILURE() << "a strided CUDA view was copied";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("strided"), std::string::npos) << e.what();
  }
  const Tensor empty = Tensor::copy_to(TensorView(h.data(), DType::BF16, {0, 7}), Device::cuda(0));
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.device(), Device::cuda(0));
}

/// Standard mode: fetched K̂/V̂ equal the CPU cache's (window exact, older dequantized).
TEST(CudaCache, StandardFetchMatchesTheCpuCache) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(51);
  for (const Spec& s : {Spec{4, 8, 4, 8}, Spec{4, 12, 8, 8}}) {
    KVCacheConfig c = vq_config(s, CacheMode::Standard, 128, 16, 2, rng);
    c.storage_dtype = DType::BF16;
    VecInferKVCache cpu(c);
    auto gpu = make_cuda(c);
    int64_t mism = 0, total = 0;
    for (int64_t n : {int64_t(10), int64_t(1), int64_t(30), int64_t(2)}) {
      Tensor k = random_tensor({1, 2, n, 128}, DType::F32, rng), v = random_tensor({1, 2, n, 128}, DType::F32, rng);
      auto [ck, cv] = cpu.update_and_fetch(k.view(), v.view());
      auto [gk, gv] = gpu->update_and_fetch(to_device(k).view(), to_device(v).view());
      const std::vector<float> a = floats(gk), b = ck.to_vector_f32(), a2 = floats(gv), b2 = cv.to_vector_f32();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) mism += (a[i] != b[i]) + (a2[i] != b2[i]);
      total += int64_t(a.size()) * 2;
    }
    EXPECT_LE(mism, total / 1000) << s.str() << ": " << mism << " of " << total << " elements differ";
    std::printf("[cuda standard] %s: %lld of %lld fetched elements differ\n", s.str().c_str(), (long long)mism,
                (long long)total);
  }
}


/// Every tensor of two caches' states byte for byte (lengths must be uniform).
void expect_same_state(KVCache& a, KVCache& b, const std::string& what) { expect_same_state(a.state(), b.state(), what); }

/// update() of a few token-heads encodes in latency mode (the codebook split over the warps of
/// several blocks per token group); the throughput mode (set_update_decode_max(0)) must leave
/// the same bytes everywhere, through eviction (Standard) and the window ring (MemoryBound).
TEST(CudaEncode, UpdateLatencyAndThroughputModesAgree) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(61);
  ASSERT_GE(cuda::update_decode_max(), 64) << "the default should send decode-sized updates to the latency mode";
  struct BuildAfter {  // grids of > 256-centroid codebooks at the first throughput-mode update
    int64_t prev = cuda::set_grid_build_after(0);
    ~BuildAfter() { cuda::set_grid_build_after(prev); }
  } build_after;
  for (const Spec& s : {Spec{4, 8, 4, 8}, Spec{4, 12, 8, 8}, Spec{8, 12, 8, 12}})
    for (CacheMode mode : {CacheMode::MemoryBound, CacheMode::Standard}) {
      if (!runs_on_cuda(s, 128)) continue;  // (the cache needs an attention kernel: d8b12's is the plain one by default)
      const std::string what = s.str() + " " + cache_mode_name(mode);
      KVCacheConfig c = vq_config(s, mode, 128, 16, 2, rng);
      auto lat = make_cuda(c), thr = make_cuda(c);
      // B·H = 4 token-heads per token: 160, 4, 12, 4, 64 token-heads, all in latency mode
      for (int64_t n : {int64_t(40), int64_t(1), int64_t(3), int64_t(1), int64_t(16)}) {
        Tensor k = random_tensor({2, 2, n, 128}, DType::F32, rng, 2.0f), v = random_tensor({2, 2, n, 128}, DType::F16, rng);
        const Tensor dk = to_device(k), dv = to_device(v);
        lat->update(dk.view(), dv.view());
        const int prev = cuda::set_update_decode_max(0);
        thr->update(dk.view(), dv.view());
        cuda::set_update_decode_max(prev);
      }
      expect_same_state(*lat, *thr, what);
      // the throughput-mode cache built the candidate grid of its 4096-centroid d4 key codebook
      // on its first bulk update (the grid kernel wrote its codes); the latency-mode one never
      // encoded in bulk, so it holds none (codebooks of <= 256 centroids: both from construction)
      const bool big_d4 = s.ks == 4 && s.kb > 8;
      EXPECT_EQ(thr->describe().find("key encoder grid") != std::string::npos, s.ks == 4) << thr->describe();
      EXPECT_EQ(lat->describe().find("key encoder grid") != std::string::npos, s.ks == 4 && !big_d4) << lat->describe();
      EXPECT_FALSE(as_cuda(lat.get())->device_error()) << what;
      std::printf("[cuda update modes] %s: latency- and throughput-mode updates leave equal states\n", what.c_str());
    }
  // when the grid is built (cuda::grid_build_after): once the throughput-mode updates, the pending
  // one included, reach the threshold; latency-mode updates do not count
  cuda::set_grid_build_after(1000);
  KVCacheConfig c = vq_config(Spec{4, 12, 8, 8}, CacheMode::MemoryBound, 128, 16, 2, rng);
  auto x = make_cuda(c);
  auto has_grid = [&] { return x->describe().find("key encoder grid") != std::string::npos; };
  const int prev = cuda::set_update_decode_max(64);
  for (const auto& [n, want] : std::vector<std::pair<int64_t, bool>>{{16, false}, {100, false}, {100, false}, {100, true}}) {
    // 2 x 2 x n token-heads: 64 (latency mode), then 400 at a time (throughput mode: 400, 800, 1200)
    Tensor k = random_tensor({2, 2, n, 128}, DType::F32, rng, 2.0f), v = random_tensor({2, 2, n, 128}, DType::F16, rng);
    x->update(to_device(k).view(), to_device(v).view());
    EXPECT_EQ(has_grid(), want) << "after an update of " << 4 * n << " token-heads: " << x->describe();
  }
  cuda::set_update_decode_max(prev);
}

/// Deferred input checks (CudaKVCache::set_deferred_checks): good updates leave the same bytes
/// as checked ones; a bad key or value (non-finite, or beyond f16) does not throw at its call,
/// makes that update and every later one no-ops on the device, and is raised by the next
/// verdict (check_inputs, a later update once the flag is visible, trim, state, decode_step,
/// turning the checks off), after which the cache is byte for byte the twin that never saw the
/// bad call, and goes on like it. VecInfer MemoryBound and Standard, and the FP16 cache.
TEST(CudaCache, DeferredChecksRaiseLaterAndLeaveTheCacheAsItWas) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(71);
  std::vector<std::pair<std::string, KVCacheConfig>> cases;
  for (CacheMode mode : {CacheMode::MemoryBound, CacheMode::Standard})
    cases.emplace_back(std::string("d4b8 ") + cache_mode_name(mode), vq_config(Spec{4, 8, 4, 8}, mode, 64, 8, 2, rng));
  KVCacheConfig f;
  f.kind = CacheKind::FP16;
  f.head_dim = 64;
  f.step = 32;
  cases.emplace_back("fp16", f);
  for (const auto& [what, c] : cases) {
    SCOPED_TRACE(what);
    auto ref = make_cuda(c), def = make_cuda(c);
    CudaKVCache* dc = as_cuda(def.get());
    EXPECT_FALSE(dc->deferred_checks());
    dc->set_deferred_checks(true);
    EXPECT_TRUE(dc->deferred_checks());
    auto kv = [&](int64_t n) { return random_tensor({2, 2, n, 64}, DType::F32, rng); };
    auto both = [&](const Tensor& k, const Tensor& v) {
      const Tensor dk = to_device(k), dv = to_device(v);
      ref->update(dk.view(), dv.view());
      def->update(dk.view(), dv.view());
    };
    // the raised message, from whichever call raised it first (a later update raises it once the
    // failed check's flag has reached the host; `verdict` raises it otherwise)
    auto raised = [&](const Tensor& bk, const Tensor& bv, const std::function<void()>& verdict) {
      std::string msg;
      try {
        def->update(to_device(bk).view(), to_device(bv).view());
        Tensor k = kv(1), v = kv(1);
        def->update(to_device(k).view(), to_device(v).view());  // queued after the bad one: not applied
        def->update(k.view(), v.view());                        // host inputs too
        verdict();
      } catch (const ValueError& e) {
        msg = e.what();
      }
      EXPECT_NE(msg.find("deferred input check failed"), std::string::npos) << msg;
      return msg;
    };
    // the first update fixes batch and heads, so it is checked at the call (and a failure there
    // must not gate the deferred updates after it); then good updates: the same bytes
    Tensor first_bad = kv(4);
    first_bad.ptr<float>()[3] = NAN;
    EXPECT_THROW(def->update(to_device(first_bad).view(), to_device(kv(4)).view()), ValueError);
    EXPECT_EQ(def->offset(), 0);
    for (int64_t n : {10, 1, 3, 1}) both(kv(n), kv(n));
    dc->check_inputs();
    expect_same_state(*ref, *def, what + ", good updates");
    // a NaN key: check_inputs raises it, naming the keys and the call
    Tensor bad = kv(3);
    bad.ptr<float>()[200] = NAN;
    std::string msg = raised(bad, kv(3), [&] { dc->check_inputs(); });
    EXPECT_NE(msg.find("keys [2, 2, 3, 64]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("update() 1 of the"), std::string::npos) << msg;
    expect_same_state(*ref, *def, what + ", after a NaN key");
    EXPECT_EQ(def->offset(), ref->offset());
    EXPECT_EQ(dc->seq_lens(), as_cuda(ref.get())->seq_lens());
    both(kv(2), kv(2));  // it goes on like the twin
    expect_same_state(*ref, *def, what + ", an update after the verdict");
    // an infinite value: trim raises it and trims nothing
    Tensor inf_v = kv(1);
    inf_v.ptr<float>()[5] = INFINITY;
    msg = raised(kv(1), inf_v, [&] { def->trim(1); });
    EXPECT_NE(msg.find("values [2, 2, 1, 64]"), std::string::npos) << msg;
    expect_same_state(*ref, *def, what + ", after an infinite value");
    // beyond f16: state() raises it
    Tensor big = kv(2);
    big.ptr<float>()[77] = 1e6f;
    raised(big, kv(2), [&] { (void)def->state(); });
    expect_same_state(*ref, *def, what + ", after a key beyond f16");
    // decode_step verifies queued updates before its own launches
    dc->reserve(64);
    dc->plan_decode(4, 1, 64);
    const Tensor q = to_device(random_tensor({2, 4, 1, 64}, DType::F32, rng)), o = to_device(random_tensor({2, 4, 1, 64}, DType::F32, rng));
    const Tensor sk = to_device(kv(1)), sv = to_device(kv(1));
    raised(bad, kv(3), [&] { dc->decode_step(q.view(), sk.view(), sv.view(), o.view(), SdpaParams{}); });
    expect_same_state(*ref, *def, what + ", after a step that found a failed check");
    // turning the checks off raises a pending failure (queued alone: no later update can raise
    // it first) and takes effect; updates are then checked at the call
    def->update(to_device(bad).view(), to_device(kv(3)).view());
    msg.clear();
    try {
      dc->set_deferred_checks(false);
    } catch (const ValueError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("update() 1 of the 1 queued"), std::string::npos) << msg;
    EXPECT_FALSE(dc->deferred_checks());
    EXPECT_THROW(def->update(to_device(bad).view(), to_device(kv(3)).view()), ValueError);
    expect_same_state(*ref, *def, what + ", checks off again");
    EXPECT_FALSE(dc->device_error());
    std::printf("[cuda deferred checks] %s: NaN / inf / beyond-f16 updates raised later, state as the twin's\n",
                what.c_str());
  }
}

/// Overlapped decode steps (the new tokens' rows written first, their encode on a side stream
/// beside attention) against serial ones (encode, then attention) on twin caches: the same
/// outputs and, after the steps, the same bytes in every state tensor. q_len 1 and 4 (causal),
/// fp16 and f32 step tensors, with two encode launches (d4 keys, d8 values) allowed to overlap;
/// a window shorter than q_len, and two launches where they are not allowed, take the serial path.
TEST(CudaDecode, OverlappedStepsMatchSerialSteps) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(67);
  struct TwoLaunches {
    bool prev = cuda::set_overlap_two_launches(true);
    ~TwoLaunches() { cuda::set_overlap_two_launches(prev); }
  } two_launches;
  const int B = 2, H = 2, G = 4, D = 128, P = 70, steps = 6;
  for (const Spec& s : {Spec{4, 8, 4, 8}, Spec{4, 12, 8, 8}})
    for (int q_len : {1, 4})
      for (DType dt : {DType::F16, DType::F32}) {
        const std::string what = s.str() + " q_len " + std::to_string(q_len) + " " + dtype_name(dt);
        KVCacheConfig c = vq_config(s, CacheMode::MemoryBound, D, 8, H, rng);
        auto a_owner = make_cuda(c), b_owner = make_cuda(c);
        CudaKVCache *a = as_cuda(a_owner.get()), *b = as_cuda(b_owner.get());
        const Tensor k = to_device(random_tensor({B, H, P, D}, DType::F32, rng));
        const Tensor v = to_device(random_tensor({B, H, P, D}, DType::F32, rng));
        for (CudaKVCache* x : {a, b}) {
          x->update(k.view(), v.view());
          x->reserve(P + steps * q_len);
          x->plan_decode(H * G, q_len, P);
        }
        SdpaParams p;
        p.causal = q_len > 1;
        double worst = 0;
        for (int st = 0; st < steps; ++st) {
          const Tensor dq = to_device(random_tensor({B, H * G, q_len, D}, dt, rng));
          const Tensor dk = to_device(random_tensor({B, H, q_len, D}, dt, rng));
          const Tensor dv = to_device(random_tensor({B, H, q_len, D}, dt, rng));
          Tensor oa = Tensor::empty(dq.sizes(), dt, Device::cuda(0)), ob = Tensor::empty(dq.sizes(), dt, Device::cuda(0));
          const long long n0 = cuda::overlapped_steps();
          a->decode_step(dq.view(), dk.view(), dv.view(), oa.view(), p);
          EXPECT_EQ(cuda::overlapped_steps(), n0 + 1) << what << ": the overlapped path was not taken";
          const bool prev = cuda::set_overlapped_step(false);
          b->decode_step(dq.view(), dk.view(), dv.view(), ob.view(), p);
          cuda::set_overlapped_step(prev);
          EXPECT_EQ(cuda::overlapped_steps(), n0 + 1) << what << ": the switch did not hold";
          const double e = nmse(floats(oa), floats(ob));
          EXPECT_LE(e, 1e-12) << what << " step " << st;
          worst = std::max(worst, e);
        }
        a->sync_seq_lens();
        b->sync_seq_lens();
        EXPECT_EQ(a->offset(), P + steps * q_len) << what;
        expect_same_state(*a, *b, what);
        EXPECT_FALSE(a->device_error()) << what;
        std::printf("[cuda overlapped step] %s: %d steps, outputs within NMSE %.3g of the serial steps, equal states\n",
                    what.c_str(), steps, worst);
      }
  // One causal step of q_len fresh fp16 tokens on a new cache of config c after a P-token
  // prefix; returns how many overlapped steps it issued.
  auto one_step = [&](const KVCacheConfig& c, int q_len) -> long long {
    auto owner = make_cuda(c);
    CudaKVCache* x = as_cuda(owner.get());
    x->update(to_device(random_tensor({B, H, P, D}, DType::F32, rng)).view(),
              to_device(random_tensor({B, H, P, D}, DType::F32, rng)).view());
    x->reserve(P + q_len);
    x->plan_decode(H * G, q_len, P);
    const Tensor dq = to_device(random_tensor({B, H * G, q_len, D}, DType::F16, rng));
    const Tensor dk = to_device(random_tensor({B, H, q_len, D}, DType::F16, rng));
    Tensor o = Tensor::empty(dq.sizes(), DType::F16, Device::cuda(0));
    SdpaParams p;
    p.causal = true;
    const long long n0 = cuda::overlapped_steps();
    x->decode_step(dq.view(), dk.view(), dk.view(), o.view(), p);
    x->synchronize();
    return cuda::overlapped_steps() - n0;
  };
  // a window of 2 tokens cannot hold a 4-token step: its codes are read by this step's attention
  EXPECT_EQ(one_step(vq_config(Spec{4, 8, 4, 8}, CacheMode::MemoryBound, D, 2, H, rng), 4), 0)
      << "a window shorter than the step must take the serial path";
  // two encode launches (d4 keys, d8 values) where they may not overlap
  cuda::set_overlap_two_launches(false);
  EXPECT_EQ(one_step(vq_config(Spec{4, 12, 8, 8}, CacheMode::MemoryBound, D, 8, H, rng), 1), 0)
      << "two encode launches overlapped although not allowed";
}


/// decode_step range-checks k_new/v_new on the device without waiting: a step with a NaN or an
/// out-of-range value and every later step and update are no-ops on the cache, and the next
/// verdict (check_inputs, sync_seq_lens after replays, an update with immediate checks) raises
/// a ValueError naming the step; the cache is then byte-equal to one that never saw the bad
/// steps, and steps work again. Eager and graph-replayed steps; the overlapped MemoryBound step,
/// the serial Stash step and the fp16 cache.
// ... and advance_seq_lens (the host lengths moved by the caller's count of replays, after the
// verdict) agrees with sync_seq_lens and raises a failed replay the same way; capture_key changes
// exactly where a captured step would no longer replay.
TEST(CudaDecode, BadStepInputsFailLaterAndLeaveTheCacheAsItWas) {
  VQ_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(83);
  std::vector<std::pair<std::string, KVCacheConfig>> cases;
  for (CacheMode mode : {CacheMode::MemoryBound, CacheMode::Stash})
    cases.emplace_back(std::string("d4b8 ") + cache_mode_name(mode), vq_config(Spec{4, 8, 4, 8}, mode, 64, 8, 2, rng));
  KVCacheConfig f;
  f.kind = CacheKind::FP16;
  f.head_dim = 64;
  f.step = 32;
  f.n_kv_heads = 2;
  cases.emplace_back("fp16", f);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const auto& [what, c0] : cases) {
    SCOPED_TRACE(what);
    KVCacheConfig c = c0;
    c.stream = stream;
    auto ref = make_cuda(c), tst = make_cuda(c);
    CudaKVCache *rc = as_cuda(ref.get()), *tc = as_cuda(tst.get());
    const int B = 2, H = 2, G = 2, D = 64;
    const Tensor k0 = random_tensor({B, H, 20, D}, DType::F32, rng), v0 = random_tensor({B, H, 20, D}, DType::F32, rng);
    for (KVCache* x : {ref.get(), tst.get()}) x->update(to_device(k0).view(), to_device(v0).view());
    for (CudaKVCache* x : {rc, tc}) {
      x->reserve(64);
      x->plan_decode(H * G, 1, 64);
    }
    Tensor dq = to_device(random_tensor({B, H * G, 1, D}, DType::F16, rng));
    Tensor dout = Tensor::empty({B, H * G, 1, D}, DType::F16, Device::cuda(0));
    auto step = [&](CudaKVCache* x, const Tensor& k, const Tensor& v) {
      const Tensor dk = to_device(k), dv = to_device(v);
      x->decode_step(dq.view(), dk.view(), dv.view(), dout.view(), SdpaParams{});
      // (dk/dv die here; not x->synchronize(), a verdict point that would raise a failed step now)
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    };
    auto good = [&] { return random_tensor({B, H, 1, D}, DType::F16, rng); };
    auto bad = [&](bool nan) {
      Tensor t = random_tensor({B, H, 1, D}, DType::F32, rng);
      t.ptr<float>()[D + 5] = nan ? NAN : 1e6f;  // 1e6: beyond fp16 storage
      return t;
    };
    auto raised = [&](const std::function<void()>& verdict) {
      std::string msg;
      try {
        verdict();
      } catch (const ValueError& e) {
        msg = e.what();
      }
      EXPECT_NE(msg.find("a decode step's input check failed"), std::string::npos) << msg;
      return msg;
    };
    // eager steps: good ones on both, then a bad one and two good ones on tst only
    for (int i = 0; i < 3; ++i) {
      const Tensor k = good(), v = good();
      step(rc, k, v), step(tc, k, v);
    }
    expect_same_state(*ref, *tst, what + ", good eager steps");
    step(tc, bad(true), good());  // raises nothing here: the check is not waited for
    step(tc, good(), good());
    step(tc, good(), good());
    std::string msg = raised([&] { tc->check_inputs(); });
    EXPECT_NE(msg.find("k_new"), std::string::npos) << msg;
    EXPECT_EQ(tst->offset(), ref->offset());
    expect_same_state(*ref, *tst, what + ", after the failed eager step");
    // an update with immediate checks verifies the steps before it, and is not applied either
    step(tc, good(), bad(false));
    msg = raised([&] { tst->update(to_device(good()).view(), to_device(good()).view()); });
    EXPECT_NE(msg.find("v_new"), std::string::npos) << msg;
    expect_same_state(*ref, *tst, what + ", after a failed step and an update");
    // with deferred checks, an update queued after a failed step is gated and the step named
    tc->set_deferred_checks(true);
    step(tc, bad(true), good());
    raised([&] {
      // raised here once the step's failure has reached the host (it has: step() waited for
      // the stream), else gated and raised by check_inputs()
      tst->update(to_device(good()).view(), to_device(good()).view());
      tc->check_inputs();
    });
    expect_same_state(*ref, *tst, what + ", deferred update after a failed step");
    tc->set_deferred_checks(false);
    // graph replays: capture one step on tst, replay good data (eager on ref), then a bad replay
    Tensor dk = Tensor::empty({B, H, 1, D}, DType::F16, Device::cuda(0)), dv = Tensor::empty({B, H, 1, D}, DType::F16, Device::cuda(0));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    tc->decode_step(dq.view(), dk.view(), dv.view(), dout.view(), SdpaParams{});
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    auto replay = [&](const Tensor& k, const Tensor& v) {
      ASSERT_EQ(cudaMemcpy(dk.data(), k.data(), size_t(k.nbytes()), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dv.data(), v.data(), size_t(v.nbytes()), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    };
    for (int i = 0; i < 3; ++i) {
      const Tensor k = good(), v = good();
      replay(k, v);
      step(rc, k, v);
    }
    tc->sync_seq_lens();
    expect_same_state(*ref, *tst, what + ", good replays");
    Tensor bk = Tensor::empty({B, H, 1, D}, DType::F16);  // fp16 +inf in one key
    std::memcpy(bk.data(), good().data(), size_t(bk.nbytes()));
    bk.ptr<uint16_t>()[7] = 0x7C00;
    replay(bk, good());
    replay(good(), good());
    raised([&] { tc->sync_seq_lens(); });
    expect_same_state(*ref, *tst, what + ", after a failed replay");
    for (int i = 0; i < 2; ++i) {  // and the graph works again
      const Tensor k = good(), v = good();
      replay(k, v);
      step(rc, k, v);
    }
    tc->sync_seq_lens();
    expect_same_state(*ref, *tst, what + ", replays after the verdict");
    EXPECT_EQ(tst->offset(), 20 + 3 + 3 + 2);
    EXPECT_FALSE(tc->device_error());
    // advance_seq_lens: the caller counts its replays; the verdict is read, nothing copied back
    const uint64_t key = tc->capture_key();
    for (int i = 0; i < 2; ++i) {
      const Tensor k = good(), v = good();
      replay(k, v);
      step(rc, k, v);
    }
    tc->advance_seq_lens(2);
    const std::vector<int64_t> counted = tc->seq_lens();
    const CacheMetaState counted_meta = tst->meta_state();
    tc->sync_seq_lens();
    EXPECT_EQ(tc->seq_lens(), counted) << "advance_seq_lens and sync_seq_lens disagree";
    EXPECT_EQ(tst->meta_state(), counted_meta) << "the window counts disagree";
    expect_same_state(*ref, *tst, what + ", replays counted by advance_seq_lens");
    replay(bk, good());
    replay(good(), good());
    raised([&] { tc->advance_seq_lens(2); });
    expect_same_state(*ref, *tst, what + ", a failed replay seen by advance_seq_lens");
    EXPECT_EQ(tst->offset(), 20 + 3 + 3 + 2 + 2);
    EXPECT_THROW(tc->advance_seq_lens(-1), ValueError);
    EXPECT_EQ(tc->capture_key(), key) << "replays or verdicts changed the capture key";
    // a prompt chunk (20 queries) after replays, on the cache that has codes to expand: over the
    // codes while a replay is not counted (the rows' workspace is sized by the host's lengths),
    // over dequantized rows once it is (device and host lengths agree), as on the cache that
    // never captured a step (the same kernels: equal bit for bit). A chunk may grow the
    // attention's workspace, which changes the capture key: no replay after it.
    if (c.kind == CacheKind::VecInfer && c.mode() == CacheMode::MemoryBound) {
      const int prev_rows = cuda::set_prefill_rows_mode(cuda::kRowsAlways);
      const Tensor pq = to_device(random_tensor({B, H * G, 20, D}, DType::F16, rng));
      const Tensor k = good(), v = good();
      replay(k, v);  // not counted yet
      const long long r0 = cuda::prefill_rows_launches();
      (void)tst->fused_sdpa(pq.view(), SdpaParams{});
      EXPECT_EQ(cuda::prefill_rows_launches(), r0) << "rows sized by the host's stale lengths";
      tc->advance_seq_lens(1);
      step(rc, k, v);
      expect_same_state(*ref, *tst, what + ", a replay counted after a prompt chunk");
      const long long r1 = cuda::prefill_rows_launches();
      const std::vector<float> a = floats(tst->fused_sdpa(pq.view(), SdpaParams{}));
      const std::vector<float> b = floats(ref->fused_sdpa(pq.view(), SdpaParams{}));
      EXPECT_EQ(cuda::prefill_rows_launches() - r1, 2) << "counted replays kept the chunk off the rows path";
      EXPECT_EQ(a, b) << "the chunk over the rows after replays differs from the one on the other cache";
      cuda::set_prefill_rows_mode(prev_rows);
    }
    // capture_key (replays and verdicts moved no buffer: above): planning the same step again
    // neither; another cache object, a new plan, growth and a restore each change it
    const uint64_t key1 = tc->capture_key();
    tc->plan_decode(H * G, 1, 64);
    EXPECT_EQ(tc->capture_key(), key1) << "the same plan again changed the capture key";
    EXPECT_NE(rc->capture_key(), key1) << "two caches share a capture key";
    tc->plan_decode(H * G, 4, 64);
    const uint64_t key_q4 = tc->capture_key();
    EXPECT_NE(key_q4, key1) << "a plan of 4 queries kept the capture key";
    tc->reserve(tc->capacity() + 1000);
    const uint64_t key_grown = tc->capture_key();
    EXPECT_NE(key_grown, key_q4) << "growth kept the capture key";
    tst->restore(tst->state(), tst->meta_state());
    EXPECT_NE(tc->capture_key(), key_grown) << "a restore kept the capture key";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

/// Decode steps launch attention as a programmatic dependent of the step's kernel before it
/// (cuda::attn_launch's pdl, sm_90; attn_set_step_pdl): its blocks start while that kernel runs
/// and wait for its writes. The same steps with the plain launch must give the same outputs and
/// leave the same state, bit for bit (same kernels, same inputs), eager and graph-captured, on
/// the overlapped path (MemoryBound: window rows, then attention beside the encode), the serial
/// path (Stash: the encode, then attention; the defaults' two encode launches joined from a side
/// stream keep the plain launch) and the fp16 cache (the rows' append, then attention).
TEST(CudaDecode, ProgrammaticLaunchChangesNothingButWhenAttentionStarts) {
  VQ_SKIP_WITHOUT_GPU();
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  struct Case {
    std::string what;
    Spec s;
    CacheMode mode;
    bool fp16;
  };
  const Spec d4b8{4, 8, 4, 8}, dflt{4, 12, 8, 8};
  const std::vector<Case> cases = {{"d4b8 MemoryBound", d4b8, CacheMode::MemoryBound, false},
                                   {"d4b8 Stash", d4b8, CacheMode::Stash, false},
                                   {"defaults MemoryBound", dflt, CacheMode::MemoryBound, false},
                                   {"defaults Stash", dflt, CacheMode::Stash, false},
                                   {"fp16", d4b8, CacheMode::MemoryBound, true}};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const int B = 2, H = 2, G = 4, D = 128, P = 300, steps = 5;
  int checked = 0;
  for (const Case& cs : cases)
    for (bool graph : {false, true}) {
      SCOPED_TRACE(cs.what + (graph ? ", graph replays" : ", eager steps"));
      std::vector<float> outs[2];
      CacheState states[2];
      long long pdl_launches[2] = {0, 0};
      for (int on = 0; on < 2; ++on) {
        std::mt19937_64 rng(97);  // the same codebooks and data both times
        KVCacheConfig c;
        if (cs.fp16) {
          c.kind = CacheKind::FP16;
          c.head_dim = D;
          c.step = 32;
          c.n_kv_heads = H;
        } else {
          c = vq_config(cs.s, cs.mode, D, 32, H, rng);
        }
        c.stream = stream;
        auto owner = make_cuda(c);
        CudaKVCache* x = as_cuda(owner.get());
        x->update(to_device(random_tensor({B, H, P, D}, DType::F32, rng)).view(),
                  to_device(random_tensor({B, H, P, D}, DType::F32, rng)).view());
        x->reserve(P + steps);
        x->plan_decode(H * G, 1, P + steps);
        Tensor dq = Tensor::empty({B, H * G, 1, D}, DType::F16, Device::cuda(0));
        Tensor dk = Tensor::empty({B, H, 1, D}, DType::F16, Device::cuda(0));
        Tensor dv = Tensor::empty({B, H, 1, D}, DType::F16, Device::cuda(0));
        Tensor dout = Tensor::empty({B, H * G, 1, D}, DType::F16, Device::cuda(0));
        const bool prev = cuda::attn_set_step_pdl(on == 1);
        const long long before = cuda::attn_pdl_launches();
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        if (graph) {
          EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
          x->decode_step(dq.view(), dk.view(), dv.view(), dout.view(), SdpaParams{});
          EXPECT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
          EXPECT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
        }
        cuda::attn_set_step_pdl(prev);
        pdl_launches[on] = cuda::attn_pdl_launches() - before;
        if (graph && !ge) break;
        for (int st = 0; st < steps; ++st) {
          for (auto [t, shape] : {std::pair{&dq, Shape{B, H * G, 1, D}}, std::pair{&dk, Shape{B, H, 1, D}},
                                  std::pair{&dv, Shape{B, H, 1, D}}}) {
            const Tensor h = random_tensor(shape, DType::F16, rng);
            ASSERT_EQ(cudaMemcpyAsync(t->data(), h.data(), size_t(h.nbytes()), cudaMemcpyHostToDevice, stream),
                      cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // (h dies here)
          }
          if (graph) {
            ASSERT_EQ(cudaGraphLaunch(ge, stream), cudaSuccess);
          } else {
            const bool p2 = cuda::attn_set_step_pdl(on == 1);
            const long long b2 = cuda::attn_pdl_launches();
            x->decode_step(dq.view(), dk.view(), dv.view(), dout.view(), SdpaParams{});
            cuda::attn_set_step_pdl(p2);
            pdl_launches[on] += cuda::attn_pdl_launches() - b2;
          }
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          const std::vector<float> o = floats(dout);
          outs[on].insert(outs[on].end(), o.begin(), o.end());
        }
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        x->sync_seq_lens();
        EXPECT_EQ(x->offset(), P + steps);
        EXPECT_FALSE(x->device_error());
        states[on] = owner->state();
      }
      if (HasFailure()) break;
      // where the programmatic launch applies: sm_90 and a kernel before attention of the step's own
      const bool joined = !cs.fp16 && cs.mode == CacheMode::Stash && cs.s.ks != cs.s.vs && cuda::overlap_two_launches();
      const bool applies = major >= 9 && !joined;
      EXPECT_EQ(pdl_launches[0], 0) << "the switch was off";
      if (applies) EXPECT_EQ(pdl_launches[1], graph ? 1 : steps) << "attention was not launched as a dependent";
      else EXPECT_EQ(pdl_launches[1], 0) << "a dependent launch where none applies (sm_" << major << "x)";
      EXPECT_EQ(outs[1], outs[0]) << "outputs differ between the two launches";
      expect_same_state(states[1], states[0], "states after the steps");
      checked += applies;
    }
  cudaStreamDestroy(stream);
  if (major >= 9) EXPECT_EQ(checked, 8);  // every case but the defaults' Stash (joined launches), both ways
  std::printf("[cuda decode pdl] %d case-ways with attention as a programmatic dependent launch (sm_%dx), outputs and "
              "states equal to the plain launch's\n",
              checked, major);
}

}  // namespace
}  // namespace vq_cuda_test
