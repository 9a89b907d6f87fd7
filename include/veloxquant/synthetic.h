// veloxquant/synthetic.h — a seeded generator of LLM-like KV caches, for tests and the demo.
//
// What it models (docs/synthetic-kv.md has the full description and what it leaves out):
//   keys    per (layer, kv head): a mean vector plus a low-rank token signal plus noise; a few
//           RoPE channel pairs (i, i + head_dim/2) are heavy outliers whose scale differs by
//           head and layer (chosen among the low-frequency pairs, as observed in real models);
//           then RoPE at the token's position, which rotates each pair.
//   values  a per-channel mean and mildly varying per-channel scale plus low-rank signal and
//           noise: close to Gaussian, no heavy outlier channels.
//   tokens  a latent content vector per token (an AR(1) process over positions, shared by all
//           layers and heads and mapped per head), so nearby tokens are correlated.
//   queries per query head (GQA: kv head = head / (n_heads / n_kv_heads)): a retrieval
//           component aligned with the latent of a random earlier token (weighted by
//           key_scale^-β, so it is *smaller* on the outlier channels), plus a small random bias
//           on the outlier channels (std query_outlier_bias; real queries share the keys' massive
//           channels far more strongly: docs/synthetic-kv.md says how that moves the quality
//           bars), plus noise, RoPE'd
//           at the query's position, then scaled so that the scores q·k/√head_dim over the
//           context have standard deviation `score_std` (neither uniform nor one-hot softmax).
#pragma once

#include <cstdint>
#include <vector>

#include "veloxquant/calibrate.h"
#include "veloxquant/tensor.h"

namespace veloxquant {

struct SyntheticKVConfig {
  int n_layers = 4;
  int n_kv_heads = 8;
  int n_heads = 32;              ///< query heads (multiple of n_kv_heads)
  int head_dim = 128;            ///< even
  uint64_t seed = 0;             ///< the "model": means, maps, outlier channels and scales
  float rope_theta = 10000.0f;   ///< RoPE base
  int latent_rank = 16;          ///< rank of the token content signal
  float latent_corr = 0.9f;      ///< AR(1) coefficient of the latent over positions
  int n_outlier_pairs = 8;       ///< RoPE channel pairs per (layer, kv head) that are outliers
  float outlier_scale_min = 8.0f;   ///< outlier magnitude relative to ordinary channels ...
  float outlier_scale_max = 32.0f;  ///< ... drawn log-uniformly per (layer, head, pair)
  float channel_scale_spread = 0.5f;  ///< log-normal σ of ordinary key channels' scales
  /// γ: ordinary key channel scales grow with RoPE wavelength, × exp(γ·(i/(head_dim/2) − 0.5))
  /// for pair i (low-frequency pairs carry larger keys, as measured in real models)
  float key_freq_trend = 1.0f;
  float outlier_spread = 0.25f;  ///< token-to-token std of an outlier channel / its magnitude
  float query_whitening = 1.0f;  ///< β: the retrieval part of q weights channel c by key_scale_c^(−β)
  float query_outlier_bias = 0.3f;  ///< std of the query bias on outlier channels
  float score_std = 2.5f;        ///< target std of q·k/√head_dim for generated queries
};

/// One generated sequence: per-layer K/V in the calibration layout and decode queries.
struct SyntheticSequence {
  int64_t n_tokens = 0;
  KVSamples kv;                   ///< keys/values per layer, f32 [n_tokens, n_kv_heads, head_dim]
  std::vector<Tensor> queries;    ///< per layer, f32 [n_queries, n_heads, head_dim]
  std::vector<int64_t> query_positions;  ///< [n_queries] position of each query (RoPE)
};

class SyntheticKVModel {
 public:
  /// Validates the config (ValueError naming the field) and draws the model's parameters.
  explicit SyntheticKVModel(const SyntheticKVConfig& config);
  const SyntheticKVConfig& config() const { return config_; }

  /// Generates a sequence of n_tokens tokens (positions 0..n_tokens−1) with `sequence_seed`
  /// and n_queries queries at positions n_tokens − n_queries .. n_tokens − 1 (the newest
  /// tokens, as decode queries are). Deterministic in (model seed, sequence_seed).
  SyntheticSequence generate(int64_t n_tokens, int n_queries, uint64_t sequence_seed) const;

  /// Pairs i (channels i and i + head_dim/2) that are outliers in (layer, kv_head).
  const std::vector<int>& outlier_pairs(int layer, int kv_head) const;
  /// Outlier scale of those pairs, same order.
  const std::vector<float>& outlier_scales(int layer, int kv_head) const;

 private:
  struct HeadParams {
    std::vector<float> key_mean;    // [head_dim]
    std::vector<float> key_scale;   // [head_dim]
    std::vector<float> key_map;     // [head_dim, latent_rank]
    std::vector<float> value_mean;  // [head_dim]
    std::vector<float> value_scale; // [head_dim]
    std::vector<float> value_map;   // [head_dim, latent_rank]
    std::vector<int> outlier_pairs;
    std::vector<float> outlier_scales;
  };
  const HeadParams& head(int layer, int kv_head) const {
    return heads_[size_t(layer) * size_t(config_.n_kv_heads) + size_t(kv_head)];
  }
  SyntheticKVConfig config_;
  std::vector<HeadParams> heads_;  // [n_layers, n_kv_heads]
  std::vector<float> inv_freq_;    // [head_dim / 2] RoPE frequencies
};

/// Applies RoPE (rotate-half convention: channel i pairs with i + head_dim/2) in place to
/// x [n, head_dim] at position `pos` for every row.
void apply_rope(float* x, int64_t n, int head_dim, int64_t pos, const std::vector<float>& inv_freq);
/// RoPE inverse frequencies θ^(−2i/head_dim), i < head_dim/2.
std::vector<float> rope_inv_freq(int head_dim, float theta);

}  // namespace veloxquant
