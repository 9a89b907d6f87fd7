// veloxquant/runtime/sampler.h — next-token selection: greedy, temperature, top-k, top-p,
// repetition penalty, seeded.
//
// The logits pass through the same chain as Hugging Face's generate():
//   1. repetition penalty over the tokens of `history` (each distinct id once):
//        logit > 0 ? logit / penalty : logit · penalty
//   2. greedy (temperature == 0): the arg max (ties: the lowest id); nothing else applies
//   3. logits / temperature
//   4. top-k: keep the k largest (ties at the k-th value broken towards lower ids)
//   5. top-p: softmax over what is left; keep the smallest set of most probable tokens whose
//      probability sums to at least top_p (always at least one)
//   6. softmax over the kept tokens, one uniform draw from the sampler's generator
//      (std::mt19937_64 seeded with `seed`; the draw is u = (x >> 11) · 2⁻⁵³), inverse CDF in
//      id order.
// A sampler with a given seed produces the same token sequence on every machine.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace veloxquant::runtime {

struct SamplerParams {
  float temperature = 0.0f;         ///< 0: greedy
  int top_k = 0;                    ///< 0: no top-k
  float top_p = 1.0f;               ///< 1: no top-p
  float repetition_penalty = 1.0f;  ///< 1: none
  int repetition_window = 0;        ///< penalise only the last N tokens of history (0: all)
  uint64_t seed = 0;
  /// Throws ValueError naming the field (temperature < 0, top_p outside (0, 1],
  /// repetition_penalty <= 0, top_k < 0, ...).
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params = {});
  const SamplerParams& params() const { return params_; }

  /// Picks the next token from `logits` [vocab] given the tokens so far (for the repetition
  /// penalty). `logits` is used as scratch (modified).
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

  /// The distribution step 6 draws from, over the whole vocabulary (zeros for removed
  /// tokens; one-hot on the arg max when greedy). `logits` is modified.
  std::vector<float> distribution(std::span<float> logits, std::span<const int32_t> history) const;

  /// Step 1 alone, in place.
  static void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> history, float penalty,
                                       int window = 0);
  /// Arg max, ties to the lowest index.
  static int32_t argmax(std::span<const float> logits);

 private:
  SamplerParams params_;
  std::mt19937_64 rng_;
};

}  // namespace veloxquant::runtime
