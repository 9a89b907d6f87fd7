// src/ref/vecinfer_attention_ref.cpp — the scalar oracle of attention on VecInfer codes, and
// the input checks both implementations share.
//
// The oracle works the way the method is *defined*, not the way the fast path computes it:
// every coded key is decoded (codebook lookup) and inverse-transformed back to the original
// key space, K̂ = ((decode(codes))·H) ⊙ λ; every coded value is decoded; window rows are
// used as stored. Then plain attention in double (scores, softmax, weighted sum) with the
// positions and masks of attention.h. The fast path instead scores with the transformed query
// q̃ = (q ⊙ λ)·H against the codebook directly; both agree to float rounding because H is
// orthonormal.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/attention_internal.h"
#include "veloxquant/error.h"
#include "veloxquant/vecinfer_cache.h"

namespace veloxquant {

void check_vecinfer_attention(const VecInferAttentionInputs& in, const TensorView& q, const TensorView& out,
                              const SdpaParams& params) {
  detail::check_sdpa_params(params);
  VQ_CHECK_VALUE(in.key_pq && in.value_pq && in.transform,
                 "attention on codes: key_pq, value_pq and transform must be set");
  const ProductQuantizer& kp = *in.key_pq;
  const ProductQuantizer& vp = *in.value_pq;
  VQ_CHECK_VALUE(kp.n_sub > 0 && kp.codebook.size() == size_t(kp.n_centroids) * kp.sub_dim,
                 "attention on codes: the key quantizer has no codebook");
  VQ_CHECK_VALUE(vp.n_sub > 0 && vp.codebook.size() == size_t(vp.n_centroids) * vp.sub_dim,
                 "attention on codes: the value quantizer has no codebook");
  check_float4d(q, "queries", Device::cpu());
  check_float4d(out, "out", Device::cpu());
  const int64_t D = q.shape[3];
  VQ_CHECK_SHAPE(kp.head_dim == D && vp.head_dim == D && in.transform->head_dim == D,
                 "attention on codes: head_dim of queries " << q.shape_string() << " (" << D << "), key quantizer ("
                                                            << kp.head_dim << "), value quantizer (" << vp.head_dim
                                                            << ") and transform (" << in.transform->head_dim
                                                            << ") must agree");
  const TensorView& kc = in.key_codes;
  const TensorView& vc = in.value_codes;
  VQ_CHECK_SHAPE(kc.ndim == 4 && kc.dtype == DType::U8 && kc.device.is_cpu(),
                 "key_codes: expected a CPU u8 tensor [batch, n_kv_heads, n_coded, " << kp.code_bytes << "], got "
                                                                                     << dtype_name(kc.dtype) << " "
                                                                                     << kc.shape_string());
  const int64_t B = kc.shape[0], Hkv = kc.shape[1], Nc = kc.shape[2];
  VQ_CHECK_SHAPE(kc.shape[3] == kp.code_bytes && (kc.strides[3] == 1 || kc.shape[3] <= 1),
                 "key_codes: expected [batch, n_kv_heads, n_coded, code_bytes=" << kp.code_bytes
                                                                                << "] with contiguous rows, got "
                                                                                << kc.shape_string());
  VQ_CHECK_SHAPE(vc.ndim == 4 && vc.dtype == DType::U8 && vc.device.is_cpu() && vc.shape[0] == B &&
                     vc.shape[1] == Hkv && vc.shape[2] == Nc && vc.shape[3] == vp.code_bytes &&
                     (vc.strides[3] == 1 || vc.shape[3] <= 1),
                 "value_codes: expected u8 [batch=" << B << ", n_kv_heads=" << Hkv << ", n_coded=" << Nc
                                                    << ", code_bytes=" << vp.code_bytes
                                                    << "] with contiguous rows, got " << dtype_name(vc.dtype) << " "
                                                    << vc.shape_string());
  VQ_CHECK_SHAPE(Nc == 0 || (kc.data && vc.data), "key_codes/value_codes: null data");
  VQ_CHECK_SHAPE(in.transform->n_kv_heads == Hkv,
                 "attention on codes: transform has n_kv_heads=" << in.transform->n_kv_heads << ", codes have "
                                                                 << Hkv << " (" << kc.shape_string() << ")");
  VQ_CHECK_VALUE(in.n_window >= 0, "attention on codes: n_window must be >= 0, got " << in.n_window);
  if (in.n_window > 0) {
    for (int w = 0; w < 2; ++w) {
      const TensorView& x = w == 0 ? in.window_keys : in.window_values;
      const char* name = w == 0 ? "window_keys" : "window_values";
      check_float4d(x, name, Device::cpu());
      VQ_CHECK_SHAPE(x.shape[0] == B && x.shape[1] == Hkv && x.shape[2] >= in.n_window && x.shape[3] == D,
                     name << ": expected [batch=" << B << ", n_kv_heads=" << Hkv << ", n_slots >= n_window="
                          << in.n_window << ", head_dim=" << D << "], got " << x.shape_string());
    }
    VQ_CHECK_SHAPE(in.window_keys.shape[2] == in.window_values.shape[2],
                   "window_keys " << in.window_keys.shape_string() << " and window_values "
                                  << in.window_values.shape_string() << " differ in slots");
    VQ_CHECK_VALUE(in.window_first_slot >= 0 && in.window_first_slot < in.window_keys.shape[2],
                   "window_first_slot=" << in.window_first_slot << " outside [0, " << in.window_keys.shape[2] << ")");
  }
  const int64_t H = q.shape[1], Lq = q.shape[2], N = Nc + in.n_window;
  VQ_CHECK_SHAPE(q.shape[0] == B,
                 "queries: expected batch=" << B << " (the codes' " << kc.shape_string() << "), got " << q.shape_string());
  VQ_CHECK_SHAPE(H > 0 && Hkv > 0 && H % Hkv == 0,
                 "queries: n_heads=" << H << " must be a positive multiple of n_kv_heads=" << Hkv << " (queries "
                                     << q.shape_string() << ")");
  VQ_CHECK_SHAPE(out.sizes() == q.sizes(),
                 "out: expected " << q.shape_string() << " (the queries' shape), got " << out.shape_string());
  VQ_CHECK_SHAPE(!params.causal || Lq <= N, "attention on codes: causal with q_len=" << Lq << " > kv_len=" << N
                                                                                      << " (queries "
                                                                                      << q.shape_string() << ")");
}

void vecinfer_attention_ref(const VecInferAttentionInputs& in, const TensorView& q, const TensorView& out,
                            const SdpaParams& params) {
  check_vecinfer_attention(in, q, out, params);
  const ProductQuantizer& kp = *in.key_pq;
  const ProductQuantizer& vp = *in.value_pq;
  const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = in.key_codes.shape[1], Nc = in.key_codes.shape[2], N = Nc + in.n_window;
  const int64_t G = H / Hkv;
  const double scale = detail::resolved_scale(params, D);
  std::vector<float> K(size_t(std::max<int64_t>(N, 1) * D)), V(size_t(std::max<int64_t>(N, 1) * D));
  std::vector<double> s(size_t(std::max<int64_t>(N, 1))), acc(static_cast<size_t>(D));
  std::vector<float> Kt(in.int8_query ? K.size() : 0), qt(static_cast<size_t>(D));  // int8 query: keys and query in the transformed space
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kh = 0; kh < Hkv; ++kh) {
      // K̂, V̂ of every token of this (batch, kv head), [N, head_dim] f32.
      for (int64_t j = 0; j < Nc; ++j) {
        const uint8_t* krow = static_cast<const uint8_t*>(in.key_codes.data) + b * in.key_codes.strides[0] +
                              kh * in.key_codes.strides[1] + j * in.key_codes.strides[2];
        const uint8_t* vrow = static_cast<const uint8_t*>(in.value_codes.data) + b * in.value_codes.strides[0] +
                              kh * in.value_codes.strides[1] + j * in.value_codes.strides[2];
        for (int m = 0; m < kp.n_sub; ++m) {
          const uint32_t c = read_code(krow, m, kp.codebook_bits);
          for (int e = 0; e < kp.sub_dim; ++e)
            K[size_t(j * D + m * kp.sub_dim + e)] = kp.codebook[size_t(c) * kp.sub_dim + e];
        }
        for (int m = 0; m < vp.n_sub; ++m) {
          const uint32_t c = read_code(vrow, m, vp.codebook_bits);
          for (int e = 0; e < vp.sub_dim; ++e)
            V[size_t(j * D + m * vp.sub_dim + e)] = vp.codebook[size_t(c) * vp.sub_dim + e];
        }
      }
      if (in.int8_query) std::copy(K.begin(), K.begin() + Nc * D, Kt.begin());
      if (Nc > 0) in.transform->inverse_keys(K.data(), Nc, int(kh));
      for (int64_t i = 0; i < in.n_window; ++i) {
        const int64_t slot = (in.window_first_slot + i) % in.window_keys.shape[2];
        for (int64_t d = 0; d < D; ++d) {
          K[size_t((Nc + i) * D + d)] = detail::load_f32(in.window_keys.data, in.window_keys.dtype,
                                                         detail::off4(in.window_keys, b, kh, slot, d));
          V[size_t((Nc + i) * D + d)] = detail::load_f32(in.window_values.data, in.window_values.dtype,
                                                         detail::off4(in.window_values, b, kh, slot, d));
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = kh * G + g;
        for (int64_t i = 0; i < Lq; ++i) {
          const int64_t pos = N - Lq + i;
          if (in.int8_query) {  // q̃, then its two-int8 rounding (the dequantized values)
            for (int64_t d = 0; d < D; ++d) qt[size_t(d)] = detail::load_f32(q.data, q.dtype, detail::off4(q, b, h, i, d));
            in.transform->forward_queries(qt.data(), 1, int(kh));
            float amax = 0.0f;
            for (float x : qt) amax = std::max(amax, std::fabs(x));
            // The step's inverse 127/max|q̃|, or 0 where it is not finite: a zero query, or one whose
            // largest element is below 127/FLT_MAX (~3.7e-37), rounds to zero. (Before, such a query's
            // zero elements became 0·inf = NaN; the CUDA kernels' scores there are ~1e-70, i.e. zero.)
            const float sq = amax / 127.0f, step_inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            const float inv = step_inv <= std::numeric_limits<float>::max() ? step_inv : 0.0f;
            for (float& x : qt) {
              const float hi = std::clamp(std::nearbyint(x * inv), -127.0f, 127.0f);
              const float lo = std::clamp(std::nearbyint((x - hi * sq) * inv * 254.0f), -127.0f, 127.0f);
              x = inv > 0.0f ? hi * sq + lo * (sq / 254.0f) : 0.0f;
            }
          }
          double mx = -INFINITY;
          for (int64_t j = 0; j < N; ++j) {
            if (!attn_visible(pos, j, params)) continue;
            double dot = 0;
            if (in.int8_query && j < Nc) {
              for (int64_t d = 0; d < D; ++d) dot += double(qt[size_t(d)]) * double(Kt[size_t(j * D + d)]);
            } else {
              for (int64_t d = 0; d < D; ++d)
                dot += double(detail::load_f32(q.data, q.dtype, detail::off4(q, b, h, i, d))) * double(K[size_t(j * D + d)]);
            }
            s[size_t(j)] = dot * scale;
            mx = std::max(mx, s[size_t(j)]);
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double sum = 0;
          for (int64_t j = 0; j < N; ++j) {
            if (!attn_visible(pos, j, params)) continue;
            const double p = std::exp(s[size_t(j)] - mx);
            sum += p;
            for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p * double(V[size_t(j * D + d)]);
          }
          for (int64_t d = 0; d < D; ++d)
            detail::store_f32(out.data, out.dtype, detail::off4(out, b, h, i, d),
                              sum > 0 ? float(acc[size_t(d)] / sum) : 0.0f);
        }
      }
    }
}

}  // namespace veloxquant
