// sampler.cpp — see sampler.h for the chain and its order.
#include "veloxquant/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

#include "veloxquant/error.h"

namespace veloxquant::runtime {

void SamplerParams::validate() const {
  VQ_CHECK_VALUE(std::isfinite(temperature) && temperature >= 0.0f,
                 "sampler: temperature must be >= 0, got " << temperature);
  VQ_CHECK_VALUE(top_k >= 0, "sampler: top_k must be >= 0, got " << top_k);
  VQ_CHECK_VALUE(top_p > 0.0f && top_p <= 1.0f, "sampler: top_p must be in (0, 1], got " << top_p);
  VQ_CHECK_VALUE(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
                 "sampler: repetition_penalty must be > 0, got " << repetition_penalty);
  VQ_CHECK_VALUE(repetition_window >= 0, "sampler: repetition_window must be >= 0, got " << repetition_window);
}

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) { params_.validate(); }

void Sampler::apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> history, float penalty,
                                       int window) {
  if (penalty == 1.0f) return;
  const size_t first = (window > 0 && history.size() > size_t(window)) ? history.size() - size_t(window) : 0;
  std::unordered_set<int32_t> seen;
  for (size_t i = first; i < history.size(); ++i) {
    const int32_t id = history[i];
    if (id < 0 || size_t(id) >= logits.size() || !seen.insert(id).second) continue;
    float& l = logits[size_t(id)];
    l = l > 0.0f ? l / penalty : l * penalty;
  }
}

int32_t Sampler::argmax(std::span<const float> logits) {
  VQ_CHECK_VALUE(!logits.empty(), "sampler: empty logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

std::vector<float> Sampler::distribution(std::span<float> logits, std::span<const int32_t> history) const {
  const SamplerParams& p = params_;
  const size_t n = logits.size();
  VQ_CHECK_VALUE(n > 0, "sampler: empty logits");
  apply_repetition_penalty(logits, history, p.repetition_penalty, p.repetition_window);
  std::vector<float> probs(n, 0.0f);
  if (p.temperature == 0.0f) {
    probs[size_t(argmax(logits))] = 1.0f;
    return probs;
  }
  for (auto& l : logits) l /= p.temperature;

  // Candidates sorted by logit descending, ties by id ascending.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  size_t keep = n;
  if (p.top_k > 0 && size_t(p.top_k) < n) {
    keep = size_t(p.top_k);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), better);
  } else {
    std::sort(order.begin(), order.end(), better);
  }
  // order[0, keep) is sorted (partial_sort sorts its prefix). Softmax over it (max: order[0]).
  const double m = logits[size_t(order[0])];
  std::vector<double> e(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    e[i] = std::exp(double(logits[size_t(order[i])]) - m);
    sum += e[i];
  }
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t k = 0;
    while (k < keep) {
      cum += e[k] / sum;
      ++k;
      if (cum >= double(p.top_p)) break;
    }
    keep = std::max<size_t>(1, k);
    sum = 0.0;
    for (size_t i = 0; i < keep; ++i) sum += e[i];
  }
  for (size_t i = 0; i < keep; ++i) probs[size_t(order[i])] = float(e[i] / sum);
  return probs;
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  if (params_.temperature == 0.0f) {
    apply_repetition_penalty(logits, history, params_.repetition_penalty, params_.repetition_window);
    return argmax(logits);
  }
  const std::vector<float> probs = distribution(logits, history);
  const double u = double(rng_() >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  double cum = 0.0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    last_nonzero = int32_t(i);
    cum += probs[i];
    if (u < cum) return int32_t(i);
  }
  return last_nonzero;  // rounding left u above the total: the last kept token
}

}  // namespace veloxquant::runtime
