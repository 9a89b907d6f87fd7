// src/ref/attention_ref.cpp — the scalar oracle of scaled dot-product attention.
//
// For every (batch, head, query) row: scores in double over the visible keys (attention.h's
// positions and masks), a plain softmax in double, the weighted sum of values in double, one
// rounding into the output dtype. Any float dtypes and strides. Never tuned.
#include <cmath>
#include <vector>

#include "core/attention_internal.h"
#include "veloxquant/attention.h"
#include "veloxquant/error.h"

namespace veloxquant {

namespace detail {

void check_sdpa_params(const SdpaParams& p) {
  VQ_CHECK_VALUE(std::isfinite(p.scale), "sdpa: scale must be finite, got " << p.scale);
  VQ_CHECK_VALUE(p.sliding_window >= 0,
                 "sdpa: sliding_window must be >= 0 (0: none), got " << p.sliding_window);
  VQ_CHECK_VALUE(p.n_threads >= 0, "sdpa: n_threads must be >= 0 (0: default), got " << p.n_threads);
}

}  // namespace detail

void check_attention_shapes(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out) {
  check_float4d(q, "queries", q.device);
  check_float4d(k, "keys", q.device);
  check_float4d(v, "values", q.device);
  check_float4d(out, "out", q.device);
  const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Lk = k.shape[2];
  VQ_CHECK_SHAPE(k.shape[0] == B && k.shape[3] == D,
                 "keys: expected [batch=" << B << ", n_kv_heads, kv_len, head_dim=" << D << "], got "
                                          << k.shape_string() << " (queries " << q.shape_string() << ")");
  VQ_CHECK_SHAPE(v.shape[0] == B && v.shape[1] == Hkv && v.shape[2] == Lk && v.shape[3] == D,
                 "values: expected [batch=" << B << ", n_kv_heads=" << Hkv << ", kv_len=" << Lk
                                            << ", head_dim=" << D << "], got " << v.shape_string());
  VQ_CHECK_SHAPE(Hkv > 0 && H % Hkv == 0,
                 "queries: n_heads=" << H << " must be a positive multiple of n_kv_heads=" << Hkv
                                     << " (queries " << q.shape_string() << ", keys " << k.shape_string()
                                     << ")");
  VQ_CHECK_SHAPE(out.shape[0] == B && out.shape[1] == H && out.shape[2] == Lq && out.shape[3] == D,
                 "out: expected " << q.shape_string() << " (the queries' shape), got " << out.shape_string());
  VQ_CHECK_SHAPE(D > 0, "queries: head_dim must be > 0, got " << q.shape_string());
}

void attention_ref(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const SdpaParams& params) {
  detail::check_sdpa_params(params);
  check_attention_shapes(q, k, v, out);
  VQ_CHECK_SHAPE(q.device.is_cpu(), "attention_ref: expected CPU tensors, got " << device_name(q.device));
  const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Lk = k.shape[2];
  VQ_CHECK_SHAPE(!params.causal || Lq <= Lk,
                 "attention: causal with q_len=" << Lq << " > kv_len=" << Lk << " (queries "
                                                 << q.shape_string() << ", keys " << k.shape_string() << ")");
  const int64_t G = H / Hkv;
  const double scale = detail::resolved_scale(params, D);
  std::vector<double> s(size_t(Lk > 0 ? Lk : 1)), acc(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / G;
      for (int64_t i = 0; i < Lq; ++i) {
        const int64_t pos = Lk - Lq + i;
        double mx = -INFINITY;
        for (int64_t j = 0; j < Lk; ++j) {
          if (!attn_visible(pos, j, params)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += double(detail::load_f32(q.data, q.dtype, detail::off4(q, b, h, i, d))) *
                   double(detail::load_f32(k.data, k.dtype, detail::off4(k, b, kh, j, d)));
          s[size_t(j)] = dot * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0;
        for (int64_t j = 0; j < Lk; ++j) {
          if (!attn_visible(pos, j, params)) continue;
          const double p = std::exp(s[size_t(j)] - mx);
          sum += p;
          for (int64_t d = 0; d < D; ++d)
            acc[size_t(d)] += p * double(detail::load_f32(v.data, v.dtype, detail::off4(v, b, kh, j, d)));
        }
        for (int64_t d = 0; d < D; ++d)
          detail::store_f32(out.data, out.dtype, detail::off4(out, b, h, i, d),
                            sum > 0 ? float(acc[size_t(d)] / sum) : 0.0f);
      }
    }
}

}  // namespace veloxquant
