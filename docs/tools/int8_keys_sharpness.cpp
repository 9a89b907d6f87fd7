// int8_keys_sharpness — where CodebookFormat::I8's error comes from, on synthetic KV: the
// query's int8 rounding, the key centroids' int8 rounding, how both grow with the softmax's
// sharpness and with a bias shared by every key and query, and whether scoring the exact
// residual window with the same rounded query (so that a common score offset cancels) helps.
// Written after run 82 (docs/cuda-notes.md), where int8 keys as the default moved the tiny
// Qwen2/Qwen3 test models' logits far more than the demo data predicted. A measurement script,
// not part of the build or of CI. Build it against a CPU build (a CUDA-enabled libveloxquant.a
// also needs -L<cuda>/lib64 -lcudart_static -ldl -lrt):
//
//   cmake --build build --target veloxquant -j2
//   g++ -O2 -std=c++20 -Iinclude docs/tools/int8_keys_sharpness.cpp build/libveloxquant.a -lpthread -o /tmp/i8s
//   /tmp/i8s
//
// Setup: one kv head, head_dim 64, d4b12 keys / d8b8 values with the cache's random codebooks
// (no smoothing), 400 tokens of which the last 16 stay exact in the window; keys N(0,1) + b_k,
// queries S·(N(0,1) + b_q) with b_k, b_q ~ bias·N(0,1) per channel; 64 queries. NMSE of the
// attention output against f32 centroids and the exact query, on the same codes.
//
// Result (2026-12-03): int8 keys' NMSE is 0.9e-4 to 1.4e-3, 300-1500x fp16 codebooks' (7e-8 to
// 3.3e-6, i.e. 20-40x in RMS), and grows about linearly with the sharpness S, as fp16's does; the
// query's and the centroids' rounding contribute about equally; a shared bias (up to 6x the
// noise) does not raise it, and scoring the window with the rounded query as well does not help
// (7.3e-3 at bias 6, S 8: worse). So int8 keys cost what their two roundings cost, scaled by the
// softmax's sharpness: far below the VQ error itself (the demo's +0.04%), but 20-40x the fp16
// path's distance from the CPU cache, which is what run 82's test bounds.
//
// The last two columns (added for run 87) are the fix: the key codebook on its int8 grid
// (KVCacheConfig::int8_key_grid, so the int8 centroids are the codebook) and the query as two
// int8s (hi + lo/254 steps), both against the exact query on the grid codebook: fp16 codebooks
// 7e-8 to 2e-6 as before, the two-int8 query 5e-10 to 3e-8, about 100x below fp16's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "veloxquant/dtype.h"
#include "veloxquant/pq.h"
#include "veloxquant/smooth.h"
#include "veloxquant/vecinfer_cache.h"

using namespace veloxquant;

namespace {

constexpr int kD = 64, kTokens = 400, kWindow = 16, kQueries = 64;

/// Softmax attention of one query over coded keys (transformed space) and window keys.
std::vector<double> attend(const std::vector<float>& q_coded, const std::vector<float>& keys_coded, int64_t n_coded,
                           const std::vector<float>& q_window, const std::vector<float>& keys_window,
                           int64_t n_window, const std::vector<float>& values) {
  std::vector<double> s(size_t(n_coded + n_window)), o(kD, 0.0);
  double mx = -INFINITY;
  auto dot = [](const float* a, const float* b) {
    double d = 0;
    for (int i = 0; i < kD; ++i) d += double(a[i]) * double(b[i]);
    return d / std::sqrt(double(kD));
  };
  for (int64_t j = 0; j < n_coded; ++j) s[size_t(j)] = dot(q_coded.data(), keys_coded.data() + j * kD);
  for (int64_t i = 0; i < n_window; ++i) s[size_t(n_coded + i)] = dot(q_window.data(), keys_window.data() + i * kD);
  for (double x : s) mx = std::max(mx, x);
  double sum = 0;
  for (size_t j = 0; j < s.size(); ++j) {
    const double p = std::exp(s[j] - mx);
    sum += p;
    for (int d = 0; d < kD; ++d) o[size_t(d)] += p * values[j * kD + size_t(d)];
  }
  for (double& x : o) x /= sum;
  return o;
}

/// q rounded to int8 with one scale per row (max |q| / 127), dequantized, as the kernel scores.
std::vector<float> int8_rounded(const std::vector<float>& q) {
  float amax = 0;
  for (float x : q) amax = std::max(amax, std::fabs(x));
  std::vector<float> r(q.size(), 0.0f);
  if (amax > 0)
    for (size_t i = 0; i < q.size(); ++i) r[i] = std::nearbyint(q[i] * (127.0f / amax)) * (amax / 127.0f);
  return r;
}

/// q as the kernels hold it since run 87: two int8s per element, q ≈ s·(hi + lo/254), s = max |q| / 127.
std::vector<float> int8_hilo(const std::vector<float>& q) {
  float amax = 0;
  for (float x : q) amax = std::max(amax, std::fabs(x));
  std::vector<float> r(q.size(), 0.0f);
  if (amax > 0) {
    const float s = amax / 127.0f, s2 = s / 254.0f;
    for (size_t i = 0; i < q.size(); ++i) {
      const float h = std::nearbyint(q[i] / s);
      const float l = std::max(-127.0f, std::min(127.0f, std::nearbyint((q[i] - h * s) / s2)));
      r[i] = h * s + l * s2;
    }
  }
  return r;
}
}  // namespace

int main() {
  std::printf("NMSE of the attention output vs f32 centroids and the exact query\n");
  std::printf("%5s %6s | %10s %10s %16s | %11s %10s | %10s %13s\n", "bias", "sharp", "fp16", "int8 keys", "+window rounded",
              "query only", "keys only", "grid: fp16", "grid: 2x int8");
  for (float bias : {0.0f, 3.0f, 6.0f})
    for (float sharp : {1.0f, 4.0f, 8.0f}) {
      std::mt19937_64 rng(7);
      std::normal_distribution<float> nd(0, 1);
      KVCacheConfig c;
      c.kind = CacheKind::VecInfer;
      c.head_dim = kD;
      c.key_sub_dim = 4, c.key_codebook_bits = 12;
      c.value_sub_dim = 8, c.value_codebook_bits = 8;
      c.residual_length = kWindow;
      c.fused_sdpa = c.fused_sdpa_memory_bound = true;
      c.n_kv_heads = 1, c.seed = 5, c.n_threads = 1;
      c.int8_key_grid = false;  // the codebook as given: the first five columns round it per call
      VecInferKVCache cache(c);
      std::vector<float> bk(kD), bq(kD), k(size_t(kTokens) * kD), v(k.size());
      for (float& x : bk) x = bias * nd(rng);
      for (float& x : bq) x = bias * nd(rng);
      for (int t = 0; t < kTokens; ++t)
        for (int d = 0; d < kD; ++d) k[size_t(t * kD + d)] = nd(rng) + bk[size_t(d)], v[size_t(t * kD + d)] = nd(rng);
      cache.update(Tensor::from_floats(k, {1, 1, kTokens, kD}).view(), Tensor::from_floats(v, {1, 1, kTokens, kD}).view());
      const VecInferAttentionInputs in = cache.attention_inputs();
      const ProductQuantizer& kp = *in.key_pq;
      const ProductQuantizer& vp = *in.value_pq;
      const int64_t nc = in.key_codes.shape[2], nw = in.n_window;
      const std::vector<float> k_i8 = make_i8_codebook(kp.codebook).decoded;
      // decoded keys (transformed space; f32 and int8 centroids) and values; the window is the
      // exact last nw tokens (raw, and transformed for the rounded-query window variant)
      std::vector<uint32_t> kidx(size_t(nc * kp.n_sub)), vidx(size_t(nc * vp.n_sub));
      unpack_codes(static_cast<const uint8_t*>(in.key_codes.data), nc, kp.n_sub, kp.codebook_bits, kidx.data());
      unpack_codes(static_cast<const uint8_t*>(in.value_codes.data), nc, vp.n_sub, vp.codebook_bits, vidx.data());
      std::vector<float> kf(size_t(nc) * kD), k8(kf.size()), k16(kf.size()), values(size_t(nc + nw) * kD);
      for (int64_t j = 0; j < nc; ++j) {
        for (int m = 0; m < kp.n_sub; ++m)
          for (int e = 0; e < kp.sub_dim; ++e) {
            const size_t src = size_t(kidx[size_t(j * kp.n_sub + m)]) * kp.sub_dim + e;
            kf[size_t(j * kD + m * kp.sub_dim + e)] = kp.codebook[src];
            k8[size_t(j * kD + m * kp.sub_dim + e)] = k_i8[src];
            k16[size_t(j * kD + m * kp.sub_dim + e)] = round_to_half(kp.codebook[src]);
          }
        for (int m = 0; m < vp.n_sub; ++m)
          for (int e = 0; e < vp.sub_dim; ++e)
            values[size_t(j * kD + m * vp.sub_dim + e)] =
                vp.codebook[size_t(vidx[size_t(j * vp.n_sub + m)]) * vp.sub_dim + e];
      }
      std::vector<float> kw(k.begin() + nc * kD, k.end());
      std::copy(v.begin() + nc * kD, v.end(), values.begin() + nc * kD);
      std::vector<float> kw_t = kw;
      in.transform->forward_keys(kw_t.data(), nw, 0);
      double gref2 = 0, eg16 = 0, eghl = 0, e_16 = 0, e_i8 = 0, e_win = 0, e_q = 0, e_k = 0, ref2 = 0;
      for (int qi = 0; qi < kQueries; ++qi) {
        std::vector<float> q(kD);
        for (int d = 0; d < kD; ++d) q[size_t(d)] = sharp * (nd(rng) + bq[size_t(d)]);
        std::vector<float> qt = q;
        in.transform->forward_queries(qt.data(), 1, 0);
        const std::vector<float> q8 = int8_rounded(qt);
        std::vector<float> q16 = qt;
        for (float& x : q16) x = round_to_half(x);
        const auto ref = attend(qt, kf, nc, q, kw, nw, values);
        const auto f16 = attend(q16, k16, nc, q, kw, nw, values);  // CodebookFormat::F16's operands
        const auto i8 = attend(q8, k8, nc, q, kw, nw, values);     // CodebookFormat::I8's
        const auto win = attend(q8, k8, nc, q8, kw_t, nw, values);  // window scored with q8 too
        const auto qo = attend(q8, kf, nc, q, kw, nw, values);
        const auto ko = attend(qt, k8, nc, q, kw, nw, values);
        // the int8 key grid (KVCacheConfig::int8_key_grid): the codebook is k8 itself, so the
        // reference is the exact query on k8 (same codes: the grid moves a few of them, which
        // changes nothing measured here); fp16 codebooks and the two-int8 query against it
        const auto qh = int8_hilo(qt);
        std::vector<float> k8_16 = k8;
        for (float& x : k8_16) x = round_to_half(x);
        const auto gref = attend(qt, k8, nc, q, kw, nw, values);
        const auto g16 = attend(q16, k8_16, nc, q, kw, nw, values);
        const auto ghl = attend(qh, k8, nc, q, kw, nw, values);
        for (int d = 0; d < kD; ++d) {
          const double r = gref[size_t(d)];
          gref2 += r * r;
          eg16 += std::pow(g16[size_t(d)] - r, 2), eghl += std::pow(ghl[size_t(d)] - r, 2);
        }
        for (int d = 0; d < kD; ++d) {
          const double r = ref[size_t(d)];
          ref2 += r * r;
          e_16 += std::pow(f16[size_t(d)] - r, 2), e_i8 += std::pow(i8[size_t(d)] - r, 2);
          e_win += std::pow(win[size_t(d)] - r, 2);
          e_q += std::pow(qo[size_t(d)] - r, 2), e_k += std::pow(ko[size_t(d)] - r, 2);
        }
      }
      std::printf("%5.0f %6.0f | %10.3g %10.3g %16.3g | %11.3g %10.3g | %10.3g %13.3g\n", bias, sharp, e_16 / ref2,
                  e_i8 / ref2, e_win / ref2, e_q / ref2, e_k / ref2, eg16 / gref2, eghl / gref2);
    }
  return 0;
}
