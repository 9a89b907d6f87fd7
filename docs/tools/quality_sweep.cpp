// quality_sweep — how issue 3's two quality bars move with the synthetic generator's settings.
// The figures in docs/synthetic-kv.md ("How the results depend on it") come from this program.
// It is a measurement script, not part of the build or of CI. Build it against a CPU build:
//
//   cmake --build build-q --target veloxquant -j2
//   g++ -O2 -std=c++20 -Iinclude docs/tools/quality_sweep.cpp build-q/libveloxquant.a -lpthread -o /tmp/quality_sweep
//   /tmp/quality_sweep test 1 2 3 4 5 6 7 8          # the e2e test's configuration, per model seed
//   /tmp/quality_sweep demo 0 1 2                    # the demo's configuration (4 layers, 8192 tokens)
//   OSP=0.1 QW=0 /tmp/quality_sweep test 1 2 3 4 5 6 7 8   # with generator settings changed
//
// Environment: OSP = outlier_spread, QW = query_whitening, QB = query_outlier_bias,
// NOP = n_outlier_pairs, SSTD = score_std (SyntheticKVConfig fields); CT / ET / NQ = calibration
// tokens / evaluation tokens / queries; NIT / PPC = k-means iterations / points per centroid;
// SPEC = the VQ configuration of keys and values (default d4b8); OTT = r: the keys of token 0 and
// of a fraction r of the other tokens lose their outlier pairs (× 0.05), a post-processing that
// mimics the "outlier tokens" of Su et al. 2025 (the generator itself has no such tokens);
// SINK = p: token 0 becomes an attention sink taking a mean share p of the attention (see
// add_sink; the generator itself has no sinks);
// DETAIL = 1 adds keys-only / values-only attention errors and the key error per channel class.
//
// Per seed it prints the attention-output error (evaluate_cache: calibrate → artifact → cache →
// fused_sdpa, against exact attention on the original K/V) of VecInfer (smooth + Hadamard), the
// same VQ without transforms and KIVI-style b2g128, all with a 128-token fp16 residual window.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "veloxquant/artifact.h"
#include "veloxquant/calibrate.h"
#include "veloxquant/evaluate.h"
#include "veloxquant/kivi.h"
#include "veloxquant/pq.h"
#include "veloxquant/smooth.h"
#include "veloxquant/synthetic.h"

using namespace veloxquant;

namespace {

constexpr int kResidual = 128;

const char* env(const char* name) { return std::getenv(name); }

// K (keys = true) or V of one layer quantized through the artifact, except the newest kResidual
// tokens (an approximation of the cache's fp16 window; used only for the DETAIL breakdown).
Tensor round_trip(const Artifact& a, const Tensor& x, int layer, bool keys) {
  const int64_t n = x.dim(0);
  const int H = int(x.dim(1)), D = int(x.dim(2));
  Tensor out = Tensor::empty({n, H, D}, DType::F32);
  std::copy(x.ptr<float>(), x.ptr<float>() + n * H * D, out.ptr<float>());
  const ArtifactLayer& L = a.layers[size_t(layer)];
  ProductQuantizer pq(D, keys ? a.key_spec : a.value_spec, keys ? L.key_codebook : L.value_codebook);
  KeyTransform tr(H, D, a.use_smooth ? L.smooth_factors : std::vector<float>{}, a.use_hadamard);
  std::vector<float> row(static_cast<size_t>(D));
  std::vector<uint8_t> code(static_cast<size_t>(pq.code_bytes));
  for (int64_t t = 0; t + kResidual < n; ++t)
    for (int h = 0; h < H; ++h) {
      float* v = out.ptr<float>() + (t * H + h) * D;
      std::copy(v, v + D, row.begin());
      if (keys) tr.forward_keys(row.data(), 1, h);
      pq.encode(row.data(), 1, code.data());
      pq.decode(code.data(), 1, row.data());
      if (keys) tr.inverse_keys(row.data(), 1, h);
      std::copy(row.begin(), row.end(), v);
    }
  return out;
}

double attention_error_with(const SyntheticSequence& s, const std::vector<Tensor>& ref, const std::vector<Tensor>* K,
                            const std::vector<Tensor>* V) {
  double sum = 0;
  for (int l = 0; l < s.kv.n_layers; ++l) {
    const TensorView q = queries_as_cache_layout(s.queries[size_t(l)]);
    Tensor o = Tensor::empty(q.sizes(), DType::F32);
    attention_cpu(q, kv_as_cache_layout(K ? (*K)[size_t(l)] : s.kv.keys[size_t(l)]),
                  kv_as_cache_layout(V ? (*V)[size_t(l)] : s.kv.values[size_t(l)]), o.view(), {});
    sum += attention_relative_error(o.view(), ref[size_t(l)].view());
  }
  return sum / s.kv.n_layers;
}

// Mean squared key error (original space) on outlier channels and on ordinary ones.
void channel_errors(const SyntheticKVModel& model, const SyntheticSequence& s, const Artifact& a, double* outlier,
                    double* ordinary) {
  const int H = s.kv.n_kv_heads, D = s.kv.head_dim;
  double eo = 0, er = 0;
  int64_t no = 0, nr = 0;
  for (int l = 0; l < s.kv.n_layers; ++l) {
    const Tensor k = round_trip(a, s.kv.keys[size_t(l)], l, true);
    for (int h = 0; h < H; ++h) {
      std::vector<char> is_out(size_t(D), 0);
      for (int p : model.outlier_pairs(l, h)) is_out[size_t(p)] = is_out[size_t(p + D / 2)] = 1;
      for (int64_t t = 0; t + kResidual < s.n_tokens; ++t)
        for (int c = 0; c < D; ++c) {
          const int64_t i = (t * H + h) * D + c;
          const double e = double(k.ptr<float>()[i]) - s.kv.keys[size_t(l)].ptr<float>()[i];
          if (is_out[size_t(c)]) {
            eo += e * e;
            ++no;
          } else {
            er += e * e;
            ++nr;
          }
        }
    }
  }
  *outlier = no ? eo / double(no) : 0;
  *ordinary = nr ? er / double(nr) : 0;
}

// Makes token 0 an attention sink in both sequences (a post-processing; the generator has no
// sinks), by the "key bias" mechanism Gu et al. (ICLR 2025, arXiv 2410.10781) describe: per
// (layer, kv head) token 0's key becomes r·u, with u a direction the other keys barely use (below)
// and r the median key norm of the head (the sink is found by direction, not
// by size), every query of the group gets b·u added (post-RoPE), with b set by bisection so that
// the mean attention weight on token 0 over those queries is `mass`; token 0's value is scaled by
// 0.1 (a sink takes attention without contributing much value).
void add_sink(SyntheticSequence& eval, SyntheticSequence& calib, double mass) {
  const int H = eval.kv.n_kv_heads, D = eval.kv.head_dim;
  const int nh = int(eval.queries[0].dim(1)), group = nh / H;
  const int64_t nq = eval.queries[0].dim(0), n = eval.n_tokens;
  const double scale = 1.0 / std::sqrt(double(D));
  for (int l = 0; l < eval.kv.n_layers; ++l)
    for (int h = 0; h < H; ++h) {
      float* Q = eval.queries[size_t(l)].ptr<float>();
      const float* K = eval.kv.keys[size_t(l)].ptr<float>();
      // u: a fixed random direction on the high-frequency half of the RoPE pairs (where keys are
      // smallest), made orthogonal to the head's mean key, so that ordinary keys barely project
      // on it (the sink's key stands apart from the others by direction).
      std::vector<double> u(size_t(D), 0.0), mean(size_t(D), 0.0);
      uint64_t st = 0x9E3779B97F4A7C15ull * uint64_t(l * 131 + h + 7);
      for (int c = 0; c < D; ++c) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        if (c % (D / 2) < D / 4) u[size_t(c)] = double(st >> 11) / 9007199254740992.0 - 0.5;
      }
      for (int64_t t = 0; t < n; ++t)
        for (int c = 0; c < D; ++c) mean[size_t(c)] += K[(t * H + h) * D + c] / double(n);
      double um = 0, mm = 0;
      for (int c = 0; c < D; ++c) {
        um += u[size_t(c)] * mean[size_t(c)];
        mm += mean[size_t(c)] * mean[size_t(c)];
      }
      for (int c = 0; c < D; ++c) u[size_t(c)] -= um / mm * mean[size_t(c)];
      double norm = 0;
      for (double x : u) norm += x * x;
      norm = std::sqrt(norm);
      for (double& x : u) x /= norm;
      std::vector<double> norms, ku(static_cast<size_t>(n));  // key norms; u·k_t
      for (int64_t t = 0; t < n; ++t) {
        double a = 0, d = 0;
        for (int c = 0; c < D; ++c) {
          const double k = K[(t * H + h) * D + c];
          a += k * k;
          d += k * u[size_t(c)];
        }
        norms.push_back(std::sqrt(a));
        ku[size_t(t)] = d;
      }
      std::nth_element(norms.begin(), norms.begin() + long(norms.size() / 2), norms.end());
      const double r = norms[norms.size() / 2];
      // scores of each query (sink excluded) without the added component
      std::vector<std::vector<double>> sc;
      std::vector<double> qu;
      for (int64_t i = 0; i < nq; ++i)
        for (int g = 0; g < group; ++g) {
          const float* q = Q + (i * nh + h * group + g) * D;
          double d = 0;
          for (int c = 0; c < D; ++c) d += q[c] * u[size_t(c)];
          qu.push_back(d);
          std::vector<double> row;
          for (int64_t t = 1; t <= eval.query_positions[size_t(i)]; ++t) {
            double x = 0;
            for (int c = 0; c < D; ++c) x += double(q[c]) * K[(t * H + h) * D + c];
            row.push_back(x);
          }
          sc.push_back(std::move(row));
        }
      auto mean_mass = [&](double b) {
        double sum = 0;
        for (size_t j = 0; j < sc.size(); ++j) {
          const double s0 = (qu[j] + b) * r * scale;
          double m = s0;
          for (size_t t = 0; t < sc[j].size(); ++t) m = std::max(m, (sc[j][t] + b * ku[t + 1]) * scale);
          double z = 0;
          for (size_t t = 0; t < sc[j].size(); ++t) z += std::exp((sc[j][t] + b * ku[t + 1]) * scale - m);
          const double e0 = std::exp(s0 - m);
          sum += e0 / (e0 + z);
        }
        return sum / double(sc.size());
      };
      double lo = 0, hi = 1;
      while (mean_mass(hi) < mass && hi < 1e6) hi *= 2;
      for (int it = 0; it < 50; ++it) (mean_mass(0.5 * (lo + hi)) < mass ? lo : hi) = 0.5 * (lo + hi);
      if (env("SINK_DEBUG") && l == 0 && h < 2) {
        double su = 0, su2 = 0;
        for (int64_t t = 1; t < n; ++t) { su += ku[size_t(t)]; su2 += ku[size_t(t)] * ku[size_t(t)]; }
        const double mu = su / double(n - 1);
        std::printf("[sink l%d h%d: r %.3f b %.3f, u·k mean %.3f std %.3f]\n", l, h, r, hi, mu, std::sqrt(su2 / double(n - 1) - mu * mu));
      }
      for (int64_t i = 0; i < nq; ++i)
        for (int g = 0; g < group; ++g)
          for (int c = 0; c < D; ++c) Q[(i * nh + h * group + g) * D + c] += float(hi * u[size_t(c)]);
      for (SyntheticSequence* sq : {&eval, &calib}) {
        float* k0 = sq->kv.keys[size_t(l)].ptr<float>() + h * D;
        float* v0 = sq->kv.values[size_t(l)].ptr<float>() + h * D;
        for (int c = 0; c < D; ++c) {
          k0[c] = float(r * u[size_t(c)]);
          v0[c] *= 0.1f;
        }
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "test";
  const bool demo = mode == "demo";
  const bool detail = env("DETAIL") != nullptr;
  double sum_cut = 0, min_cut = 1e9;
  int n_seeds = 0, kivi_wins = 0;
  for (int i = 2; i < argc; ++i) {
    SyntheticKVConfig cfg;
    cfg.n_layers = demo ? 4 : 2;
    cfg.seed = std::strtoull(argv[i], nullptr, 10);
    if (env("QW")) cfg.query_whitening = float(std::atof(env("QW")));
    if (env("QB")) cfg.query_outlier_bias = float(std::atof(env("QB")));
    if (env("NOP")) cfg.n_outlier_pairs = std::atoi(env("NOP"));
    if (env("OSP")) cfg.outlier_spread = float(std::atof(env("OSP")));
    if (env("SSTD")) cfg.score_std = float(std::atof(env("SSTD")));
    const SyntheticKVModel model(cfg);
    SyntheticSequence calib = model.generate(env("CT") ? std::atoi(env("CT")) : 2048, 0, 1);
    SyntheticSequence eval =
        model.generate(env("ET") ? std::atoi(env("ET")) : (demo ? 8192 : 3072), env("NQ") ? std::atoi(env("NQ")) : 16, 2);
    if (env("OTT")) {
      const double rate = std::atof(env("OTT"));
      for (SyntheticSequence* sq : {&calib, &eval}) {
        uint64_t st = 12345 + cfg.seed;
        for (int l = 0; l < cfg.n_layers; ++l)
          for (int64_t t = 0; t < sq->n_tokens; ++t) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            if (t != 0 && double(st >> 11) / 9007199254740992.0 >= rate) continue;
            for (int h = 0; h < cfg.n_kv_heads; ++h) {
              float* k = sq->kv.keys[size_t(l)].ptr<float>() + (t * cfg.n_kv_heads + h) * cfg.head_dim;
              for (int p : model.outlier_pairs(l, h)) {
                k[p] *= 0.05f;
                k[p + cfg.head_dim / 2] *= 0.05f;
              }
            }
          }
      }
    }
    if (env("SINK")) add_sink(eval, calib, std::atof(env("SINK")));
    // The demo uses attention_cpu for its reference at long contexts, the test attention_ref.
    const std::vector<Tensor> ref = reference_attention(eval, {}, /*use_oracle=*/!demo);
    Artifact art[2];  // [0] smooth + Hadamard, [1] no transforms
    for (int t = 0; t < 2; ++t) {
      CalibrationParams p;
      p.key_spec = PQSpec::parse(env("SPEC") ? env("SPEC") : "d4b8");
      p.value_spec = p.key_spec;
      p.use_smooth = p.use_hadamard = (t == 0);
      p.niter = env("NIT") ? std::atoi(env("NIT")) : 20;
      p.seed = demo ? 1234 : 5;  // the demo's calibrate default / the test's seed
      p.max_points_per_centroid = env("PPC") ? std::atoi(env("PPC")) : (demo ? 256 : 128);
      p.max_eval_vectors = demo ? 2048 : 1024;
      p.measure_untransformed = false;
      art[t] = calibrate(calib.kv, p).artifact;
    }
    double err[2];
    for (int t = 0; t < 2; ++t) {
      EvaluationParams ep;
      ep.time_decode = false;
      KVCacheConfig base;
      base.fused_sdpa = true;
      base.fused_sdpa_memory_bound = true;
      base.residual_length = kResidual;
      err[t] = evaluate_cache(eval, ref, [&](int l) { return create_cache_from_artifact(art[t], l, base); }, ep).attn_error;
    }
    KiviConfig kc;
    kc.bits = 2;
    kc.group_size = 128;
    kc.residual_length = kResidual;
    kc.head_dim = cfg.head_dim;
    EvaluationParams ep;
    ep.time_decode = false;
    const double kivi = evaluate_cache(eval, ref, [&](int) { return std::make_unique<KiviKVCache>(kc); }, ep).attn_error;
    const double cut = 100 * (1 - err[0] / err[1]);
    std::printf("seed %3s: VecInfer %.4f  no transforms %.4f  cut %5.1f%% | KIVI b2g128 %.4f  VecInfer lower by %5.1f%%",
                argv[i], err[0], err[1], cut, kivi, 100 * (1 - err[0] / kivi));
    if (detail) {
      double keys_only[2], values_only = 0, ch_out[2], ch_ord[2];
      for (int t = 0; t < 2; ++t) {
        std::vector<Tensor> K, V;
        for (int l = 0; l < cfg.n_layers; ++l) {
          K.push_back(round_trip(art[t], eval.kv.keys[size_t(l)], l, true));
          if (t == 0) V.push_back(round_trip(art[t], eval.kv.values[size_t(l)], l, false));
        }
        keys_only[t] = attention_error_with(eval, ref, &K, nullptr);
        if (t == 0) values_only = attention_error_with(eval, ref, nullptr, &V);
        channel_errors(model, eval, art[t], &ch_out[t], &ch_ord[t]);
      }
      std::printf(" | keys only %.4f / %.4f (cut %.1f%%), values only %.4f | key MSE outlier ch %.2f / %.2f, ordinary ch %.3f / %.3f",
                  keys_only[0], keys_only[1], 100 * (1 - keys_only[0] / keys_only[1]), values_only, ch_out[0], ch_out[1],
                  ch_ord[0], ch_ord[1]);
    }
    std::printf("\n");
    std::fflush(stdout);
    sum_cut += cut;
    min_cut = std::min(min_cut, cut);
    ++n_seeds;
    kivi_wins += err[0] >= kivi;
  }
  if (n_seeds)
    std::printf("cut: mean %.1f%%, min %.1f%%; seeds where KIVI b2g128 is at least as accurate: %d/%d\n",
                sum_cut / n_seeds, min_cut, kivi_wins, n_seeds);
}
