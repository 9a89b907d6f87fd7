// Attention-output error of a cache against exact attention (see include/veloxquant/evaluate.h).
#include "veloxquant/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "veloxquant/error.h"

namespace veloxquant {

double attention_relative_error(const TensorView& out, const TensorView& ref) {
  VQ_CHECK_SHAPE(out.sizes() == ref.sizes() && out.ndim >= 1,
                 "attention_relative_error: out " << out.shape_string() << " and ref " << ref.shape_string()
                                                  << " differ");
  const Tensor o = Tensor::to_f32(out), r = Tensor::to_f32(ref);
  const int64_t d = out.dim(-1);
  const int64_t rows = d > 0 ? o.numel() / d : 0;
  double sum = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double num = 0, den = 0;
    for (int64_t c = 0; c < d; ++c) {
      const double a = o.ptr<float>()[i * d + c], b = r.ptr<float>()[i * d + c];
      num += (a - b) * (a - b);
      den += b * b;
    }
    if (den == 0) continue;
    sum += std::sqrt(num / den);
    ++n;
  }
  return n ? sum / double(n) : 0.0;
}

TensorView kv_as_cache_layout(const Tensor& kv) {
  VQ_CHECK_SHAPE(kv.ndim() == 3, "expected [n_tokens, n_kv_heads, head_dim], got " << shape_str(kv.sizes()));
  const int64_t n = kv.dim(0), H = kv.dim(1), D = kv.dim(2);
  return TensorView(kv.data(), kv.dtype(), {1, H, n, D}, {n * H * D, D, H * D, 1});
}

TensorView queries_as_cache_layout(const Tensor& q) {
  VQ_CHECK_SHAPE(q.ndim() == 3, "expected [n_queries, n_heads, head_dim], got " << shape_str(q.sizes()));
  const int64_t n = q.dim(0), H = q.dim(1), D = q.dim(2);
  return TensorView(q.data(), q.dtype(), {1, H, n, D}, {n * H * D, D, H * D, 1});
}

std::vector<Tensor> reference_attention(const SyntheticSequence& seq, const SdpaParams& params, bool use_oracle) {
  std::vector<Tensor> out;
  for (int l = 0; l < seq.kv.n_layers; ++l) {
    const TensorView q = queries_as_cache_layout(seq.queries[size_t(l)]);
    Tensor o = Tensor::empty(q.sizes(), DType::F32);
    const TensorView k = kv_as_cache_layout(seq.kv.keys[size_t(l)]), v = kv_as_cache_layout(seq.kv.values[size_t(l)]);
    if (use_oracle)
      attention_ref(q, k, v, o.view(), params);
    else
      attention_cpu(q, k, v, o.view(), params);
    out.push_back(std::move(o));
  }
  return out;
}

CacheEvaluation evaluate_cache(const SyntheticSequence& seq, const std::vector<Tensor>& reference,
                               const std::function<std::unique_ptr<KVCache>(int layer)>& make_cache,
                               const EvaluationParams& params) {
  const int L = seq.kv.n_layers;
  VQ_CHECK_SHAPE(reference.size() == size_t(L), "evaluate_cache: " << reference.size() << " reference outputs for "
                                                                   << L << " layers");
  CacheEvaluation ev;
  for (int l = 0; l < L; ++l) {
    std::unique_ptr<KVCache> cache = make_cache(l);
    VQ_CHECK_VALUE(cache != nullptr, "evaluate_cache: make_cache returned no cache for layer " << l);
    const TensorView K = kv_as_cache_layout(seq.kv.keys[size_t(l)]);
    const TensorView V = kv_as_cache_layout(seq.kv.values[size_t(l)]);
    const int64_t n = K.dim(2);
    const int64_t chunk = params.prefill_chunk > 0 ? params.prefill_chunk : n;
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t m = std::min(chunk, n - t0);
      TensorView k = K, v = V;
      k.data = static_cast<float*>(K.data) + t0 * K.stride(2);
      v.data = static_cast<float*>(V.data) + t0 * V.stride(2);
      k.shape[2] = v.shape[2] = m;
      cache->update(k, v);
    }
    const TensorView q = queries_as_cache_layout(seq.queries[size_t(l)]);
    Tensor out = cache->fused_sdpa(q, params.sdpa);
    const double err = attention_relative_error(out.view(), reference[size_t(l)].view());
    ev.layer_errors.push_back(err);
    ev.bytes += cache->nbytes();
    if (params.time_decode) {
      // One decode step: the newest query alone (q_len 1).
      TensorView q1 = q;
      q1.data = static_cast<float*>(q.data) + (q.dim(2) - 1) * q.stride(2);
      q1.shape[2] = 1;
      Tensor o1 = Tensor::empty(q1.sizes(), DType::F32);
      cache->fused_sdpa_into(q1, o1.view(), params.sdpa);  // warm-up
      std::vector<double> times;
      for (int r = 0; r < std::max(1, params.timing_repeats); ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        cache->fused_sdpa_into(q1, o1.view(), params.sdpa);
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::nth_element(times.begin(), times.begin() + long(times.size() / 2), times.end());
      ev.decode_seconds += times[times.size() / 2];
    }
    ev.caches.push_back(std::move(cache));
  }
  double s = 0;
  for (double e : ev.layer_errors) s += e;
  ev.attn_error = L ? s / L : 0;
  return ev;
}

}  // namespace veloxquant
