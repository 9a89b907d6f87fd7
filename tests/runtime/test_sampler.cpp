// Sampler: each step of the chain on hand-computed distributions, determinism for a seed,
// and empirical frequencies (statistical tier: 20000 draws, 5-sigma bounds).
#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "veloxquant/error.h"
#include "veloxquant/runtime/sampler.h"

using namespace veloxquant;
using namespace veloxquant::runtime;

namespace {

std::vector<double> softmax(const std::vector<double>& l) {
  double m = l[0];
  for (double x : l) m = std::max(m, x);
  double s = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) s += (p[i] = std::exp(l[i] - m));
  for (auto& x : p) x /= s;
  return p;
}

std::vector<float> dist(const SamplerParams& sp, std::vector<float> logits, std::vector<int32_t> hist = {}) {
  Sampler s(sp);
  return s.distribution(logits, hist);
}

}  // namespace

TEST(RuntimeSampler, GreedyIsArgmaxLowestOnTies) {
  Sampler s;
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(l, {}), 1);
  EXPECT_EQ(Sampler::argmax(std::vector<float>{-3.0f}), 0);
}

TEST(RuntimeSampler, RepetitionPenaltyHfRule) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 4.0f};
  const std::vector<int32_t> hist = {0, 1, 0, 0};  // id 0 repeated: penalised once
  Sampler::apply_repetition_penalty(l, hist, 2.0f);
  EXPECT_EQ(l, (std::vector<float>{1.0f, -4.0f, 1.0f, 4.0f}));
  // Window: only the last token counts.
  std::vector<float> l2 = {2.0f, -2.0f, 1.0f, 4.0f};
  Sampler::apply_repetition_penalty(l2, std::vector<int32_t>{3, 1}, 2.0f, 1);
  EXPECT_EQ(l2, (std::vector<float>{2.0f, -4.0f, 1.0f, 4.0f}));
  // Greedy sees the penalty: 3 would win, penalised to 1.5 < 2.
  SamplerParams sp;
  sp.repetition_penalty = 4.0f;
  Sampler s(sp);
  std::vector<float> l3 = {2.0f, 0.0f, 0.0f, 6.0f};
  EXPECT_EQ(s.sample(l3, std::vector<int32_t>{3}), 0);
}

TEST(RuntimeSampler, TemperatureTopKTopPDistributions) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f, 2.0f};
  SamplerParams sp;
  sp.temperature = 0.5f;
  {
    const auto p = dist(sp, logits);
    const auto ref = softmax({2, 6, 4, 0, 4});
    for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], ref[i], 1e-6) << i;
  }
  sp.top_k = 2;  // keeps 3.0 and the lower-id 2.0 (index 2), not index 4
  {
    const auto p = dist(sp, logits);
    const auto ref = softmax({6, 4});
    EXPECT_NEAR(p[1], ref[0], 1e-6);
    EXPECT_NEAR(p[2], ref[1], 1e-6);
    EXPECT_EQ(p[0] + p[3] + p[4], 0.0f);
  }
  sp.top_k = 0;
  sp.temperature = 1.0f;
  sp.top_p = 0.75f;  // probs sorted: .5206(1) .1915(2) .1915(4) .0705(0) .0259(3): .712 < .75 <= .904 → 3 kept
  {
    const auto p = dist(sp, logits);
    const auto ref = softmax({3, 2, 2});
    EXPECT_NEAR(p[1], ref[0], 1e-6);
    EXPECT_NEAR(p[2], ref[1], 1e-6);
    EXPECT_NEAR(p[4], ref[2], 1e-6);
    EXPECT_EQ(p[0] + p[3], 0.0f);
  }
  sp.top_p = 0.01f;  // at least one token
  {
    const auto p = dist(sp, logits);
    EXPECT_EQ(p[1], 1.0f);
  }
}

TEST(RuntimeSampler, SeedDeterminismAndFrequencies) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f};
  SamplerParams sp;
  sp.temperature = 1.0f;
  sp.seed = 42;
  Sampler a(sp), b(sp);
  std::vector<int> counts(4, 0);
  const int n = 20000;
  std::vector<int32_t> seq_a, seq_b;
  for (int i = 0; i < n; ++i) {
    std::vector<float> la = logits, lb = logits;
    seq_a.push_back(a.sample(la, {}));
    seq_b.push_back(b.sample(lb, {}));
    ++counts[size_t(seq_a.back())];
  }
  EXPECT_EQ(seq_a, seq_b);
  const auto ref = softmax({0, 1, 2, -1});
  for (int i = 0; i < 4; ++i) {
    const double sd = std::sqrt(n * ref[size_t(i)] * (1 - ref[size_t(i)]));
    EXPECT_NEAR(counts[size_t(i)], n * ref[size_t(i)], 5 * sd) << "token " << i << " seed 42";
  }
  // A different seed gives a different sequence.
  sp.seed = 43;
  Sampler c(sp);
  std::vector<int32_t> seq_c;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> l = logits;
    seq_c.push_back(c.sample(l, {}));
  }
  EXPECT_NE(seq_c, std::vector<int32_t>(seq_a.begin(), seq_a.begin() + 200));
}

TEST(RuntimeSampler, TopKSamplesOnlyKeptTokens) {
  SamplerParams sp;
  sp.temperature = 2.0f;
  sp.top_k = 2;
  sp.seed = 7;
  Sampler s(sp);
  for (int i = 0; i < 500; ++i) {
    std::vector<float> l = {5.0f, 0.0f, 4.9f, 4.8f};
    const int32_t t = s.sample(l, {});
    ASSERT_TRUE(t == 0 || t == 2) << t;
  }
}

TEST(RuntimeSampler, InvalidParamsNameTheField) {
  SamplerParams sp;
  sp.top_p = 0.0f;
  try {
    Sampler s(sp);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  sp = {};
  sp.temperature = -1.0f;
  EXPECT_THROW(Sampler{sp}, ValueError);
  sp = {};
  sp.repetition_penalty = 0.0f;
  EXPECT_THROW(Sampler{sp}, ValueError);
}
