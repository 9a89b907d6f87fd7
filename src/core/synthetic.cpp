// Synthetic LLM-like KV caches (see include/veloxquant/synthetic.h and docs/synthetic-kv.md).
//
// Every random draw comes from a counter-based stream keyed by (model seed, sequence seed,
// layer, head, purpose), so any (layer, head) can be generated independently and in parallel
// with the same result.
#include "veloxquant/synthetic.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <thread>

#include "veloxquant/cache.h"
#include "veloxquant/error.h"

namespace veloxquant {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t mix(std::initializer_list<uint64_t> keys) {
  uint64_t s = 0x243F6A8885A308D3ull;
  for (uint64_t k : keys) {
    s ^= k + 0x9E3779B97F4A7C15ull + (s << 6) + (s >> 2);
    splitmix64(s);
  }
  return s;
}

// xoshiro256** with polar-method normals.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& x : s_) x = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  // Marsaglia's polar method (no trigonometry; two normals per accepted pair).
  float normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double m = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = float(v * m);
    has_spare_ = true;
    return float(u * m);
  }
  int64_t below(int64_t n) { return int64_t(uniform() * double(n)); }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  bool has_spare_ = false;
  float spare_ = 0;
};

enum Purpose : uint64_t { kParams = 1, kLatent = 2, kKeyNoise = 3, kValueNoise = 4, kQuery = 5 };

// Runs fn(i) for i in [0, n) on up to default_threads() threads.
template <class F>
void parallel(int64_t n, F&& fn) {
  const int nt = int(std::min<int64_t>(n, default_threads()));
  if (nt <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  for (auto& t : th) t.join();
}

}  // namespace

std::vector<float> rope_inv_freq(int head_dim, float theta) {
  std::vector<float> f(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) f[size_t(i)] = float(std::pow(double(theta), -2.0 * i / head_dim));
  return f;
}

void apply_rope(float* x, int64_t n, int head_dim, int64_t pos, const std::vector<float>& inv_freq) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double a = double(pos) * inv_freq[size_t(i)];
    const float c = float(std::cos(a)), s = float(std::sin(a));
    for (int64_t r = 0; r < n; ++r) {
      float* v = x + r * head_dim;
      const float x0 = v[i], x1 = v[i + half];
      v[i] = x0 * c - x1 * s;
      v[i + half] = x1 * c + x0 * s;
    }
  }
}

SyntheticKVModel::SyntheticKVModel(const SyntheticKVConfig& c) : config_(c) {
  VQ_CHECK_VALUE(c.n_layers >= 1, "synthetic: n_layers must be >= 1, got " << c.n_layers);
  VQ_CHECK_VALUE(c.n_kv_heads >= 1, "synthetic: n_kv_heads must be >= 1, got " << c.n_kv_heads);
  VQ_CHECK_VALUE(c.n_heads >= c.n_kv_heads && c.n_heads % c.n_kv_heads == 0,
                 "synthetic: n_heads (" << c.n_heads << ") must be a multiple of n_kv_heads (" << c.n_kv_heads << ")");
  VQ_CHECK_VALUE(c.head_dim >= 4 && c.head_dim % 2 == 0,
                 "synthetic: head_dim must be even and >= 4, got " << c.head_dim);
  VQ_CHECK_VALUE(c.latent_rank >= 1, "synthetic: latent_rank must be >= 1, got " << c.latent_rank);
  VQ_CHECK_VALUE(c.latent_corr >= 0 && c.latent_corr < 1, "synthetic: latent_corr must be in [0, 1), got "
                                                              << c.latent_corr);
  VQ_CHECK_VALUE(c.n_outlier_pairs >= 0 && c.n_outlier_pairs <= c.head_dim / 4,
                 "synthetic: n_outlier_pairs must be in [0, head_dim/4 = " << c.head_dim / 4 << "], got "
                                                                          << c.n_outlier_pairs);
  VQ_CHECK_VALUE(c.outlier_scale_min > 0 && c.outlier_scale_max >= c.outlier_scale_min,
                 "synthetic: need 0 < outlier_scale_min <= outlier_scale_max, got " << c.outlier_scale_min << ", "
                                                                                     << c.outlier_scale_max);
  VQ_CHECK_VALUE(c.rope_theta > 1, "synthetic: rope_theta must be > 1, got " << c.rope_theta);
  VQ_CHECK_VALUE(c.score_std > 0, "synthetic: score_std must be > 0, got " << c.score_std);

  const int D = c.head_dim, r = c.latent_rank, half = D / 2;
  inv_freq_ = rope_inv_freq(D, c.rope_theta);
  heads_.resize(size_t(c.n_layers) * size_t(c.n_kv_heads));
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      Rng rng(mix({c.seed, kParams, uint64_t(l), uint64_t(h)}));
      HeadParams& p = heads_[size_t(l) * size_t(c.n_kv_heads) + size_t(h)];
      p.key_mean.resize(size_t(D));
      p.key_scale.resize(size_t(D));
      p.value_mean.resize(size_t(D));
      p.value_scale.resize(size_t(D));
      p.key_map.resize(size_t(D) * size_t(r));
      p.value_map.resize(size_t(D) * size_t(r));
      const float map_std = float(1.0 / std::sqrt(double(r)));
      for (int ch = 0; ch < D; ++ch) {
        p.key_mean[size_t(ch)] = 0.5f * rng.normal();
        p.key_scale[size_t(ch)] = std::exp(c.channel_scale_spread * rng.normal() +
                                           c.key_freq_trend * (float(ch % half) / float(half) - 0.5f));
        p.value_mean[size_t(ch)] = 0.1f * rng.normal();
        p.value_scale[size_t(ch)] = std::exp(0.25f * rng.normal());
      }
      for (auto& a : p.key_map) a = map_std * rng.normal();
      for (auto& a : p.value_map) a = 0.8f * map_std * rng.normal();
      // Outlier pairs among the low-frequency half of the RoPE pairs (i in [D/4, D/2)),
      // where massive key channels sit in real models; distinct per (layer, head).
      std::vector<int> cand(size_t(half - D / 4));
      std::iota(cand.begin(), cand.end(), D / 4);
      for (int k = 0; k < c.n_outlier_pairs; ++k) {
        const int64_t j = k + rng.below(int64_t(cand.size()) - k);
        std::swap(cand[size_t(k)], cand[size_t(j)]);
        const int pair = cand[size_t(k)];
        const double lo = std::log(double(c.outlier_scale_min)), hi = std::log(double(c.outlier_scale_max));
        const float s = float(std::exp(lo + (hi - lo) * rng.uniform()));
        p.outlier_pairs.push_back(pair);
        p.outlier_scales.push_back(s);
        // A large, consistently signed mean and a larger spread on both channels of the pair.
        for (int ch : {pair, pair + half}) {
          const float sign = rng.uniform() < 0.5 ? -1.0f : 1.0f;
          p.key_mean[size_t(ch)] = sign * s * float(0.7 + 0.3 * rng.uniform());
          p.key_scale[size_t(ch)] *= c.outlier_spread * s;
        }
      }
    }
  }
}

const std::vector<int>& SyntheticKVModel::outlier_pairs(int layer, int kv_head) const {
  VQ_CHECK_VALUE(layer >= 0 && layer < config_.n_layers && kv_head >= 0 && kv_head < config_.n_kv_heads,
                 "synthetic: (layer " << layer << ", kv head " << kv_head << ") out of range");
  return head(layer, kv_head).outlier_pairs;
}

const std::vector<float>& SyntheticKVModel::outlier_scales(int layer, int kv_head) const {
  outlier_pairs(layer, kv_head);  // range check
  return head(layer, kv_head).outlier_scales;
}

SyntheticSequence SyntheticKVModel::generate(int64_t n_tokens, int n_queries, uint64_t sequence_seed) const {
  const SyntheticKVConfig& c = config_;
  VQ_CHECK_VALUE(n_tokens >= 1, "synthetic: n_tokens must be >= 1, got " << n_tokens);
  VQ_CHECK_VALUE(n_queries >= 0 && n_queries <= n_tokens,
                 "synthetic: n_queries must be in [0, n_tokens = " << n_tokens << "], got " << n_queries);
  const int D = c.head_dim, r = c.latent_rank, H = c.n_kv_heads, L = c.n_layers;
  const int group = c.n_heads / c.n_kv_heads;

  // Token latents z_t [n_tokens, r]: AR(1) over positions, shared by all layers and heads.
  std::vector<float> z(size_t(n_tokens) * size_t(r));
  {
    Rng rng(mix({c.seed, sequence_seed, kLatent}));
    const float a = c.latent_corr, b = std::sqrt(1.0f - a * a);
    for (int k = 0; k < r; ++k) z[size_t(k)] = rng.normal();
    for (int64_t t = 1; t < n_tokens; ++t)
      for (int k = 0; k < r; ++k)
        z[size_t(t * r + k)] = a * z[size_t((t - 1) * r + k)] + b * rng.normal();
  }

  SyntheticSequence seq;
  seq.n_tokens = n_tokens;
  seq.kv.n_layers = L;
  seq.kv.n_kv_heads = H;
  seq.kv.head_dim = D;
  seq.kv.source = "synthetic(seed=" + std::to_string(c.seed) + ", sequence=" + std::to_string(sequence_seed) + ")";
  for (int l = 0; l < L; ++l) {
    seq.kv.keys.push_back(Tensor::empty({n_tokens, H, D}, DType::F32));
    seq.kv.values.push_back(Tensor::empty({n_tokens, H, D}, DType::F32));
    seq.queries.push_back(Tensor::empty({n_queries, c.n_heads, D}, DType::F32));
  }
  for (int i = 0; i < n_queries; ++i) seq.query_positions.push_back(n_tokens - n_queries + i);

  // Keys and values, one (layer, kv head) per task.
  parallel(int64_t(L) * H, [&](int64_t task) {
    const int l = int(task / H), h = int(task % H);
    const HeadParams& p = head(l, h);
    Rng kn(mix({c.seed, sequence_seed, kKeyNoise, uint64_t(l), uint64_t(h)}));
    Rng vn(mix({c.seed, sequence_seed, kValueNoise, uint64_t(l), uint64_t(h)}));
    float* K = seq.kv.keys[size_t(l)].ptr<float>();
    float* V = seq.kv.values[size_t(l)].ptr<float>();
    std::vector<float> row(static_cast<size_t>(D));
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* zt = z.data() + t * r;
      for (int ch = 0; ch < D; ++ch) {
        const float* a = p.key_map.data() + size_t(ch) * r;
        float s = 0;
        for (int k = 0; k < r; ++k) s += a[k] * zt[k];
        row[size_t(ch)] = p.key_mean[size_t(ch)] + p.key_scale[size_t(ch)] * (s + 0.5f * kn.normal());
      }
      apply_rope(row.data(), 1, D, t, inv_freq_);
      std::copy(row.begin(), row.end(), K + (t * H + h) * D);
      float* v = V + (t * H + h) * D;
      for (int ch = 0; ch < D; ++ch) {
        const float* a = p.value_map.data() + size_t(ch) * r;
        float s = 0;
        for (int k = 0; k < r; ++k) s += a[k] * zt[k];
        v[ch] = p.value_mean[size_t(ch)] + p.value_scale[size_t(ch)] * (s + 0.6f * vn.normal());
      }
    }
  });

  // Queries, one (layer, query head) per task.
  parallel(int64_t(L) * c.n_heads, [&](int64_t task) {
    const int l = int(task / c.n_heads), qh = int(task % c.n_heads), h = qh / group;
    const HeadParams& p = head(l, h);
    Rng rng(mix({c.seed, sequence_seed, kQuery, uint64_t(l), uint64_t(qh)}));
    const float* K = seq.kv.keys[size_t(l)].ptr<float>();
    float* Q = seq.queries[size_t(l)].ptr<float>();
    // Per query head: a fixed bias on the outlier channels (shares the keys' massive channels).
    std::vector<float> bias(size_t(D), 0.0f);
    for (size_t k = 0; k < p.outlier_pairs.size(); ++k)
      for (int ch : {p.outlier_pairs[k], p.outlier_pairs[k] + D / 2})
        bias[size_t(ch)] = c.query_outlier_bias * rng.normal() * (p.key_mean[size_t(ch)] > 0 ? 1.0f : -1.0f);
    std::vector<float> q(static_cast<size_t>(D));
    for (int i = 0; i < n_queries; ++i) {
      const int64_t pos = seq.query_positions[size_t(i)];
      const int64_t j = rng.below(pos + 1);  // the token this query "looks for"
      const float* zj = z.data() + j * r;
      for (int ch = 0; ch < D; ++ch) {
        const float* a = p.key_map.data() + size_t(ch) * r;
        float s = 0;
        for (int k = 0; k < r; ++k) s += a[k] * zj[k];
        // Normalised by the channel's key scale so outlier channels do not dominate the
        // query by construction; the keys' own outliers still dominate q·k.
        q[size_t(ch)] = s * std::pow(p.key_scale[size_t(ch)], -c.query_whitening) + bias[size_t(ch)] + 0.3f * rng.normal();
      }
      apply_rope(q.data(), 1, D, pos, inv_freq_);
      // Scale so std over visible keys of q·k/√D equals score_std (strided sample of keys).
      const int64_t n_vis = pos + 1;
      const int64_t stride = std::max<int64_t>(1, n_vis / 2048);
      double sum = 0, sum2 = 0;
      int64_t cnt = 0;
      for (int64_t t = 0; t < n_vis; t += stride) {
        const float* k = K + (t * H + h) * D;
        double d = 0;
        for (int ch = 0; ch < D; ++ch) d += double(q[size_t(ch)]) * k[ch];
        d /= std::sqrt(double(D));
        sum += d;
        sum2 += d * d;
        ++cnt;
      }
      const double mean = sum / double(cnt);
      const double var = std::max(sum2 / double(cnt) - mean * mean, 0.0);
      const float scale = var > 1e-20 ? float(c.score_std / std::sqrt(var)) : 1.0f;
      float* out = Q + (int64_t(i) * c.n_heads + qh) * D;
      for (int ch = 0; ch < D; ++ch) out[ch] = q[size_t(ch)] * scale;
    }
  });
  return seq;
}

}  // namespace veloxquant
