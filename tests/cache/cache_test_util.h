// tests/cache/cache_test_util.h — helpers for the cache tests: configs, random K/V updates,
// whole-cache snapshots (state + meta + counters) to check "unchanged" after a failed call.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "ops/attention_test_util.h"
#include "veloxquant/cache.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/vecinfer_cache.h"

namespace vq_test {

using veloxquant::CacheKind;
using veloxquant::CacheMode;
using veloxquant::KVCache;
using veloxquant::KVCacheConfig;

inline KVCacheConfig vq_config(CacheMode mode, int head_dim = 64, int residual = 8, int kbits = 8, int ksub = 4,
                               int vbits = 8, int vsub = 8) {
  KVCacheConfig c;
  c.kind = CacheKind::VecInfer;
  c.head_dim = head_dim;
  c.key_codebook_bits = kbits;
  c.key_sub_dim = ksub;
  c.value_codebook_bits = vbits;
  c.value_sub_dim = vsub;
  c.residual_length = residual;
  c.fused_sdpa = mode != CacheMode::Standard;
  c.fused_sdpa_memory_bound = mode == CacheMode::MemoryBound;
  c.step = 16;
  c.n_threads = 2;
  c.seed = 7;
  return c;
}

/// Everything observable about a cache, to compare before/after a failing call.
struct Snapshot {
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  veloxquant::CacheMetaState meta;
  int64_t offset = 0, nbytes = 0;
  bool operator==(const Snapshot&) const = default;
};

inline Snapshot snapshot(const KVCache& c) {
  Snapshot s;
  for (const auto& [name, t] : c.state()) {
    std::vector<float> v;
    if (t.dtype() == veloxquant::DType::U8) {
      for (int64_t i = 0; i < t.numel(); ++i) v.push_back(float(t.ptr<uint8_t>()[i]));
    } else {
      v = t.to_vector_f32();
    }
    s.tensors.emplace_back(name, v);
  }
  s.meta = c.meta_state();
  s.offset = c.offset();
  s.nbytes = c.nbytes();
  return s;
}

/// Random keys/values [batch, n_kv_heads, n, head_dim] of dtype dt (permuted layout optional).
struct KV {
  Tensor4 k, v;
};
inline KV random_kv(int64_t batch, int64_t heads, int64_t n, int64_t head_dim, veloxquant::DType dt, bool permuted,
                    std::mt19937_64& rng, float stddev = 1.0f) {
  return {random_tensor4({batch, heads, n, head_dim}, dt, permuted, rng, stddev),
          random_tensor4({batch, heads, n, head_dim}, dt, permuted, rng, stddev)};
}

/// fused_sdpa of a cache into an f32 vector.
inline std::vector<float> sdpa_values(const KVCache& c, const TensorView& q, const veloxquant::SdpaParams& p) {
  const Tensor o = c.fused_sdpa(q, p);
  return values_of(o.view());
}

/// A simple model of a VecInfer cache: the same tokens kept in f32, offset and residual_count
/// by the documented rules, and what attention must see computed token by token with the
/// cache's own quantizers and transform (encode → decode → inverse transform for coded tokens,
/// storage rounding for window tokens and for the held K̂/V̂).
struct CacheModel {
  int64_t batch = 0, heads = 0, head_dim = 0, residual_length = 0;
  veloxquant::DType storage = veloxquant::DType::F16;
  std::vector<std::vector<float>> k, v;  // [batch·heads][tokens·head_dim] f32 inputs
  int64_t offset = 0, rc = 0;

  void append(const TensorView& keys, const TensorView& values) {
    batch = keys.shape[0];
    heads = keys.shape[1];
    head_dim = keys.shape[3];
    k.resize(size_t(batch * heads));
    v.resize(size_t(batch * heads));
    const int64_t n = keys.shape[2];
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < n; ++t)
          for (int64_t d = 0; d < head_dim; ++d) {
            k[size_t(b * heads + h)].push_back(get_elem(keys, off(keys, b, h, t, d)));
            v[size_t(b * heads + h)].push_back(get_elem(values, off(values, b, h, t, d)));
          }
    offset += n;
    rc = std::min(residual_length, rc + n);
  }
  int64_t trim(int64_t n) {
    const int64_t t = std::min(n, offset);
    offset -= t;
    rc = std::max<int64_t>(0, rc - t);
    for (auto& x : k) x.resize(size_t(offset * head_dim));
    for (auto& x : v) x.resize(size_t(offset * head_dim));
    return t;
  }
  float round_st(float x) const {
    return storage == veloxquant::DType::F16 ? veloxquant::round_to_half(x)
                                             : veloxquant::bf16_to_float(veloxquant::float_to_bf16(x));
  }
  /// [batch, heads, offset, head_dim] f32 as attention sees it; `rounded_coded`: the coded
  /// tokens as held in fp16 (Standard mode, and the fetched K̂ of Standard/Stash).
  std::vector<float> expected(bool keys, const veloxquant::VecInferKVCache& c, bool rounded_coded) const {
    const veloxquant::ProductQuantizer& pq = keys ? c.key_quantizer() : c.value_quantizer();
    std::vector<float> out;
    std::vector<float> x(static_cast<size_t>(head_dim));
    std::vector<uint8_t> code(static_cast<size_t>(pq.code_bytes));
    for (int64_t bh = 0; bh < batch * heads; ++bh)
      for (int64_t t = 0; t < offset; ++t) {
        const float* src = (keys ? k : v)[size_t(bh)].data() + t * head_dim;
        if (t >= offset - rc) {
          for (int64_t d = 0; d < head_dim; ++d) out.push_back(round_st(src[d]));
          continue;
        }
        std::copy(src, src + head_dim, x.begin());
        if (keys) c.key_transform().forward_keys(x.data(), 1, int(bh % heads));
        pq.encode(x.data(), 1, code.data(), 1);
        pq.decode(code.data(), 1, x.data());
        if (keys) c.key_transform().inverse_keys(x.data(), 1, int(bh % heads));
        for (int64_t d = 0; d < head_dim; ++d) out.push_back(rounded_coded ? round_st(x[size_t(d)]) : x[size_t(d)]);
      }
    return out;
  }
};

inline Tensor tensor_of(const std::vector<float>& x, const Shape& s) { return Tensor::from_floats(x, s); }

}  // namespace vq_test
