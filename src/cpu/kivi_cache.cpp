// KiviKVCache: the KIVI-style 2-bit baseline (asymmetric, keys per channel over token groups,
// values per token over channel groups, fp16 scale + zero per group, fp16 residual window).
//
// Storage per (batch, kv head) slot, all without capacity slack in the byte count:
//   key_codes    [n_qkeys, row_bytes]             bit-packed (pack_codes layout), blocks of G tokens
//   key_scale    [n_qkeys / G, head_dim] fp16     key_zero alike
//   value_codes  [n_qvalues, row_bytes]
//   value_scale  [n_qvalues, head_dim / G] fp16   value_zero alike
//   exact_keys   [offset − n_qkeys, head_dim] fp16
//   exact_values [offset − n_qvalues, head_dim] fp16
// Attention works on the codes directly: a key score is Σ_c (q_c·scale_c)·code_c + Σ_c q_c·zero_c
// (per key block), a value row adds (p·scale_g)·code_c + p·zero_g. It is a scalar quality
// baseline, not a tuned kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "veloxquant/error.h"
#include "veloxquant/kivi.h"
#include "veloxquant/pq.h"
#include "veloxquant/thread_pool.h"

namespace veloxquant {

void KiviConfig::validate() const {
  VQ_CHECK_VALUE(head_dim >= 1, "kivi: head_dim must be >= 1, got " << head_dim);
  VQ_CHECK_VALUE(n_kv_heads >= 0, "kivi: n_kv_heads must be >= 0, got " << n_kv_heads);
  VQ_CHECK_VALUE(bits >= 1 && bits <= 8, "kivi: bits must be in 1..8, got " << bits);
  VQ_CHECK_VALUE(group_size >= 1, "kivi: group_size must be >= 1, got " << group_size);
  VQ_CHECK_VALUE(head_dim % group_size == 0, "kivi: head_dim " << head_dim << " must be a multiple of group_size "
                                                               << group_size << " (values are grouped along channels)");
  VQ_CHECK_VALUE(residual_length >= 0, "kivi: residual_length must be >= 0, got " << residual_length);
}

std::string KiviConfig::str() const {
  // appends, not "b" + ...: GCC 12 -O2 warns (-Wrestrict, a false positive: GCC bug 105329) on the operator+ chain
  std::string s = "b";
  s += std::to_string(bits);
  s += 'g';
  s += std::to_string(group_size);
  return s;
}

namespace {

// Quantizes n values (stride apart) to codes with fp16 scale/zero; same arithmetic as the oracle.
void quantize_group(const float* x, int64_t n, int64_t stride, int bits, uint32_t* codes, int64_t code_stride,
                    uint16_t* scale_h, uint16_t* zero_h) {
  float mn = x[0], mx = x[0];
  for (int64_t i = 1; i < n; ++i) {
    mn = std::min(mn, x[i * stride]);
    mx = std::max(mx, x[i * stride]);
  }
  const float levels = float((1 << bits) - 1);
  *scale_h = float_to_half((mx - mn) / levels);
  *zero_h = float_to_half(mn);
  const float scale = half_to_float(*scale_h), zero = half_to_float(*zero_h);
  for (int64_t i = 0; i < n; ++i) {
    float q = 0.0f;
    if (scale > 0.0f) q = std::min(levels, std::max(0.0f, std::nearbyint((x[i * stride] - zero) / scale)));
    codes[i * code_stride] = uint32_t(q);
  }
}

// Unpacks n_rows packed rows of n codes into one byte per code (pack_codes layout: LSB first).
void unpack_to_u8(const uint8_t* packed, int64_t n_rows, int n, int bits, uint8_t* out) {
  const int64_t rb = packed_row_bytes(n, bits);
  if (bits == 2 && n % 4 == 0) {  // the comparison's case: four codes per byte
    for (int64_t r = 0; r < n_rows; ++r) {
      const uint8_t* p = packed + r * rb;
      uint8_t* o = out + r * n;
      for (int j = 0; j < n / 4; ++j) {
        const uint8_t b = p[j];
        o[4 * j] = b & 3u;
        o[4 * j + 1] = (b >> 2) & 3u;
        o[4 * j + 2] = (b >> 4) & 3u;
        o[4 * j + 3] = uint8_t(b >> 6);
      }
    }
    return;
  }
  for (int64_t r = 0; r < n_rows; ++r)
    for (int c = 0; c < n; ++c) out[r * n + c] = uint8_t(read_code(packed + r * rb, c, bits));
}

}  // namespace

struct KiviKVCache::Impl {
  int64_t row_bytes = 0;
  struct Slot {
    std::vector<uint8_t> key_codes, value_codes;
    std::vector<uint16_t> key_scale, key_zero, value_scale, value_zero;
    std::vector<uint16_t> exact_keys, exact_values;
  };
  std::vector<Slot> slots;  // [batch · n_kv_heads]
  std::shared_ptr<ThreadPool> pool;
};

KiviKVCache::KiviKVCache(const KiviConfig& config) : config_(config), impl_(std::make_unique<Impl>()) {
  config_.validate();
  base_config_.kind = CacheKind::FP16;
  base_config_.head_dim = config_.head_dim;
  base_config_.n_kv_heads = config_.n_kv_heads;
  base_config_.residual_length = config_.residual_length;
  base_config_.n_threads = config_.n_threads;
  n_kv_heads_ = config_.n_kv_heads;
  impl_->row_bytes = packed_row_bytes(config_.head_dim, config_.bits);
  impl_->pool = std::make_shared<ThreadPool>(config_.n_threads);
}

KiviKVCache::~KiviKVCache() = default;

void KiviKVCache::check_kv(const TensorView& keys, const TensorView& values) const {
  check_float4d(keys, "keys", Device::cpu());
  check_float4d(values, "values", Device::cpu());
  VQ_CHECK_SHAPE(keys.sizes() == values.sizes(),
                 "keys " << keys.shape_string() << " and values " << values.shape_string() << " differ");
  VQ_CHECK_SHAPE(keys.dim(3) == config_.head_dim, "keys: expected [batch, n_kv_heads, n_tokens, head_dim="
                                                      << config_.head_dim << "], got " << keys.shape_string());
  if (n_kv_heads_ > 0)
    VQ_CHECK_SHAPE(keys.dim(1) == n_kv_heads_, "keys: expected [batch, n_kv_heads=" << n_kv_heads_
                                                                                  << ", n_tokens, head_dim], got "
                                                                                  << keys.shape_string());
  if (batch_ > 0)
    VQ_CHECK_SHAPE(keys.dim(0) == batch_, "keys: expected [batch=" << batch_ << ", n_kv_heads, n_tokens, head_dim], got "
                                                                  << keys.shape_string());
  VQ_CHECK_SHAPE(keys.dim(0) >= 1 && keys.dim(1) >= 1, "keys: empty batch or heads " << keys.shape_string());
}

void KiviKVCache::update(const TensorView& keys, const TensorView& values) {
  check_kv(keys, values);
  const int64_t n_new = keys.dim(2);
  const int D = config_.head_dim;
  if (batch_ == 0) {
    batch_ = keys.dim(0);
    n_kv_heads_ = int(keys.dim(1));
    base_config_.n_kv_heads = n_kv_heads_;
    impl_->slots.assign(size_t(batch_ * n_kv_heads_), {});
  }
  if (n_new == 0) return;
  Tensor kf = Tensor::to_f32(keys), vf = Tensor::to_f32(values);  // [B, H, n_new, D] contiguous
  for (int64_t s = 0; s < batch_ * n_kv_heads_; ++s) {
    auto& slot = impl_->slots[size_t(s)];
    const float* kp = kf.ptr<float>() + s * n_new * D;
    const float* vp = vf.ptr<float>() + s * n_new * D;
    for (int64_t i = 0; i < n_new * D; ++i) {
      slot.exact_keys.push_back(float_to_half(kp[i]));
      slot.exact_values.push_back(float_to_half(vp[i]));
    }
  }
  offset_ += n_new;
  residual_count_ = std::min<int64_t>(config_.residual_length, residual_count_ + n_new);
  requantize();
}

// Moves values older than the window, and key blocks entirely older than it, into codes.
void KiviKVCache::requantize() {
  const int D = config_.head_dim, G = config_.group_size, bits = config_.bits;
  const int64_t rb = impl_->row_bytes;
  const int64_t boundary = offset_ - residual_count_;  // positions < boundary are outside the window
  const int64_t new_qvalues = std::max(n_qvalues_, boundary);
  const int64_t new_qkeys = std::max(n_qkeys_, boundary / G * G);
  if (new_qvalues == n_qvalues_ && new_qkeys == n_qkeys_) return;
  std::vector<float> buf(size_t(G) * size_t(D));
  std::vector<uint32_t> codes(size_t(G) * size_t(D));
  for (auto& slot : impl_->slots) {
    // Values: per token, groups of G channels.
    const int64_t nv = new_qvalues - n_qvalues_;
    if (nv > 0) {
      const size_t c0 = slot.value_codes.size();
      slot.value_codes.resize(c0 + size_t(nv * rb));
      for (int64_t t = 0; t < nv; ++t) {
        std::vector<float> x(static_cast<size_t>(D));
        for (int c = 0; c < D; ++c) x[size_t(c)] = half_to_float(slot.exact_values[size_t(t * D + c)]);
        for (int g = 0; g < D / G; ++g) {
          uint16_t sh, zh;
          quantize_group(x.data() + g * G, G, 1, bits, codes.data() + g * G, 1, &sh, &zh);
          slot.value_scale.push_back(sh);
          slot.value_zero.push_back(zh);
        }
        pack_codes(codes.data(), 1, D, bits, slot.value_codes.data() + c0 + size_t(t * rb));
      }
      slot.exact_values.erase(slot.exact_values.begin(), slot.exact_values.begin() + nv * D);
    }
    // Keys: per channel, blocks of G tokens.
    const int64_t nk = new_qkeys - n_qkeys_;
    if (nk > 0) {
      const size_t c0 = slot.key_codes.size();
      slot.key_codes.resize(c0 + size_t(nk * rb));
      for (int64_t b0 = 0; b0 < nk; b0 += G) {
        for (int64_t i = 0; i < int64_t(G) * D; ++i) buf[size_t(i)] = half_to_float(slot.exact_keys[size_t(b0 * D + i)]);
        for (int c = 0; c < D; ++c) {
          uint16_t sh, zh;
          quantize_group(buf.data() + c, G, D, bits, codes.data() + c, D, &sh, &zh);
          slot.key_scale.push_back(sh);
          slot.key_zero.push_back(zh);
        }
        pack_codes(codes.data(), G, D, bits, slot.key_codes.data() + c0 + size_t(b0 * rb));
      }
      slot.exact_keys.erase(slot.exact_keys.begin(), slot.exact_keys.begin() + nk * D);
    }
  }
  n_qvalues_ = new_qvalues;
  n_qkeys_ = new_qkeys;
}

int64_t KiviKVCache::trim(int64_t n) {
  if (n <= 0 || offset_ == 0) return 0;
  n = std::min(n, offset_);
  const int D = config_.head_dim, G = config_.group_size;
  const int64_t rb = impl_->row_bytes;
  const int64_t new_off = offset_ - n;
  const int64_t keep_qv = std::min(n_qvalues_, new_off);
  const int64_t keep_qk = std::min(n_qkeys_, new_off / G * G);
  for (auto& slot : impl_->slots) {
    // Values: drop coded rows past new_off, then exact rows past new_off.
    slot.value_codes.resize(size_t(keep_qv * rb));
    slot.value_scale.resize(size_t(keep_qv * (D / G)));
    slot.value_zero.resize(size_t(keep_qv * (D / G)));
    slot.exact_values.resize(size_t(std::max<int64_t>(0, new_off - keep_qv) * D));
    // Keys: a partly trimmed coded block goes back to the exact part as its dequantized rows
    // (what attention saw), so nothing kept changes.
    if (keep_qk < n_qkeys_) {
      const int64_t n_back = std::max<int64_t>(0, std::min(new_off, n_qkeys_) - keep_qk);
      std::vector<uint16_t> back(size_t(n_back * D));
      const int64_t blk = keep_qk / G;
      for (int64_t t = 0; t < n_back; ++t)
        for (int c = 0; c < D; ++c) {
          const float sc = half_to_float(slot.key_scale[size_t(blk * D + c)]);
          const float z = half_to_float(slot.key_zero[size_t(blk * D + c)]);
          const uint32_t q = read_code(slot.key_codes.data() + (keep_qk + t) * rb, c, config_.bits);
          back[size_t(t * D + c)] = float_to_half(float(q) * sc + z);
        }
      slot.key_codes.resize(size_t(keep_qk * rb));
      slot.key_scale.resize(size_t(keep_qk / G * D));
      slot.key_zero.resize(size_t(keep_qk / G * D));
      slot.exact_keys = std::move(back);
    } else {
      slot.exact_keys.resize(size_t((new_off - n_qkeys_) * D));
    }
  }
  n_qvalues_ = keep_qv;
  n_qkeys_ = keep_qk;
  offset_ = new_off;
  residual_count_ = std::max<int64_t>(0, residual_count_ - n);
  requantize();
  return n;
}

Tensor KiviKVCache::dequantized_keys_f32() const {
  const int D = config_.head_dim, G = config_.group_size;
  const int64_t rb = impl_->row_bytes;
  Tensor out = Tensor::zeros({std::max<int64_t>(batch_, 0), n_kv_heads_, offset_, D}, DType::F32);
  for (int64_t s = 0; s < batch_ * n_kv_heads_; ++s) {
    const auto& slot = impl_->slots[size_t(s)];
    float* o = out.ptr<float>() + s * offset_ * D;
    for (int64_t t = 0; t < n_qkeys_; ++t)
      for (int c = 0; c < D; ++c) {
        const int64_t blk = t / G;
        o[t * D + c] = float(read_code(slot.key_codes.data() + t * rb, c, config_.bits)) *
                           half_to_float(slot.key_scale[size_t(blk * D + c)]) +
                       half_to_float(slot.key_zero[size_t(blk * D + c)]);
      }
    for (int64_t i = 0; i < (offset_ - n_qkeys_) * D; ++i) o[n_qkeys_ * D + i] = half_to_float(slot.exact_keys[size_t(i)]);
  }
  return out;
}

Tensor KiviKVCache::dequantized_values_f32() const {
  const int D = config_.head_dim, G = config_.group_size;
  const int64_t rb = impl_->row_bytes;
  Tensor out = Tensor::zeros({std::max<int64_t>(batch_, 0), n_kv_heads_, offset_, D}, DType::F32);
  for (int64_t s = 0; s < batch_ * n_kv_heads_; ++s) {
    const auto& slot = impl_->slots[size_t(s)];
    float* o = out.ptr<float>() + s * offset_ * D;
    for (int64_t t = 0; t < n_qvalues_; ++t)
      for (int c = 0; c < D; ++c) {
        const int64_t g = t * (D / G) + c / G;
        o[t * D + c] = float(read_code(slot.value_codes.data() + t * rb, c, config_.bits)) *
                           half_to_float(slot.value_scale[size_t(g)]) +
                       half_to_float(slot.value_zero[size_t(g)]);
      }
    for (int64_t i = 0; i < (offset_ - n_qvalues_) * D; ++i)
      o[n_qvalues_ * D + i] = half_to_float(slot.exact_values[size_t(i)]);
  }
  return out;
}

std::pair<Tensor, Tensor> KiviKVCache::update_and_fetch(const TensorView& keys, const TensorView& values) {
  update(keys, values);
  return {Tensor::copy_of(dequantized_keys_f32().view(), DType::F16),
          Tensor::copy_of(dequantized_values_f32().view(), DType::F16)};
}

Tensor KiviKVCache::fused_sdpa(const TensorView& queries, const SdpaParams& params) const {
  check_float4d(queries, "queries", Device::cpu());
  Tensor out = Tensor::empty(queries.sizes(), queries.dtype);
  fused_sdpa_into(queries, out.view(), params);
  return out;
}

void KiviKVCache::fused_sdpa_into(const TensorView& queries, const TensorView& out, const SdpaParams& params) const {
  check_float4d(queries, "queries", Device::cpu());
  check_float4d(out, "out", Device::cpu());
  VQ_CHECK_SHAPE(queries.sizes() == out.sizes(), "out " << out.shape_string() << " must match queries "
                                                        << queries.shape_string());
  VQ_CHECK_SHAPE(offset_ > 0, "fused_sdpa on an empty cache");
  const int D = config_.head_dim, G = config_.group_size, bits = config_.bits;
  VQ_CHECK_SHAPE(queries.dim(0) == batch_ && queries.dim(3) == D && queries.dim(1) % n_kv_heads_ == 0,
                 "queries: expected [batch=" << batch_ << ", n_heads (multiple of " << n_kv_heads_
                                             << "), q_len, head_dim=" << D << "], got " << queries.shape_string());
  const int64_t Hq = queries.dim(1), Lq = queries.dim(2);
  VQ_CHECK_SHAPE(!params.causal || Lq <= offset_, "queries: q_len " << Lq << " > cached tokens " << offset_);
  const int group = int(Hq / n_kv_heads_);
  const float scale = params.scale > 0 ? params.scale : float(1.0 / std::sqrt(double(D)));
  Tensor qf = Tensor::to_f32(queries);
  Tensor of = Tensor::empty(queries.sizes(), DType::F32);
  // One task per (batch, kv head): the codes are unpacked once and serve every query head of
  // the GQA group and every query row.
  const int64_t n_tasks = batch_ * n_kv_heads_;
  impl_->pool->parallel_for(n_tasks, [&](int64_t task, int) {
    const int64_t b = task / n_kv_heads_, h = task % n_kv_heads_;
    const auto& slot = impl_->slots[size_t(task)];
    std::vector<uint8_t> kc(size_t(n_qkeys_ * D)), vc(size_t(n_qvalues_ * D));
    unpack_to_u8(slot.key_codes.data(), n_qkeys_, D, bits, kc.data());
    unpack_to_u8(slot.value_codes.data(), n_qvalues_, D, bits, vc.data());
    std::vector<float> exact_k(size_t((offset_ - n_qkeys_) * D)), exact_v(size_t((offset_ - n_qvalues_) * D));
    for (size_t i = 0; i < exact_k.size(); ++i) exact_k[i] = half_to_float(slot.exact_keys[i]);
    for (size_t i = 0; i < exact_v.size(); ++i) exact_v[i] = half_to_float(slot.exact_values[i]);
    std::vector<float> kscale(slot.key_scale.size()), kzero(slot.key_zero.size());
    for (size_t i = 0; i < kscale.size(); ++i) {
      kscale[i] = half_to_float(slot.key_scale[i]);
      kzero[i] = half_to_float(slot.key_zero[i]);
    }
    std::vector<float> sc(static_cast<size_t>(offset_)), qs(static_cast<size_t>(D)), acc(static_cast<size_t>(D));
    for (int64_t qh = h * group; qh < (h + 1) * group; ++qh) {
      for (int64_t i = 0; i < Lq; ++i) {
        const float* q = qf.ptr<float>() + ((b * Hq + qh) * Lq + i) * D;
        const int64_t pos = offset_ - Lq + i;
        // Scores: coded key blocks, then the exact keys.
        for (int64_t blk = 0; blk * G < n_qkeys_; ++blk) {
          float cst = 0;
          for (int c = 0; c < D; ++c) {
            qs[size_t(c)] = q[c] * kscale[size_t(blk * D + c)];
            cst += q[c] * kzero[size_t(blk * D + c)];
          }
          for (int64_t t = blk * G; t < (blk + 1) * G; ++t) {
            const uint8_t* code = kc.data() + t * D;
            float s = cst;
            for (int c = 0; c < D; ++c) s += qs[size_t(c)] * float(code[c]);
            sc[size_t(t)] = s * scale;
          }
        }
        for (int64_t t = n_qkeys_; t < offset_; ++t) {
          const float* k = exact_k.data() + (t - n_qkeys_) * D;
          float s = 0;
          for (int c = 0; c < D; ++c) s += q[c] * k[c];
          sc[size_t(t)] = s * scale;
        }
        float mx = -INFINITY;
        for (int64_t t = 0; t < offset_; ++t) {
          if (!attn_visible(pos, t, params)) sc[size_t(t)] = -INFINITY;
          mx = std::max(mx, sc[size_t(t)]);
        }
        float* o = of.ptr<float>() + ((b * Hq + qh) * Lq + i) * D;
        if (mx == -INFINITY) {
          std::fill(o, o + D, 0.0f);
          continue;
        }
        double denom = 0;
        for (int64_t t = 0; t < offset_; ++t) {
          const float p = sc[size_t(t)] == -INFINITY ? 0.0f : std::exp(sc[size_t(t)] - mx);
          sc[size_t(t)] = p;
          denom += p;
        }
        // Values: Σ_t p_t·(code·scale_g + zero_g) per channel group, then the exact rows.
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t t = 0; t < n_qvalues_; ++t) {
          const float p = sc[size_t(t)];
          if (p == 0.0f) continue;
          const uint8_t* code = vc.data() + t * D;
          for (int g = 0; g < D / G; ++g) {
            const float ps = p * half_to_float(slot.value_scale[size_t(t * (D / G) + g)]);
            const float pz = p * half_to_float(slot.value_zero[size_t(t * (D / G) + g)]);
            for (int c = g * G; c < (g + 1) * G; ++c) acc[size_t(c)] += ps * float(code[c]) + pz;
          }
        }
        for (int64_t t = n_qvalues_; t < offset_; ++t) {
          const float p = sc[size_t(t)];
          if (p == 0.0f) continue;
          const float* v = exact_v.data() + (t - n_qvalues_) * D;
          for (int c = 0; c < D; ++c) acc[size_t(c)] += p * v[c];
        }
        const float inv = float(1.0 / denom);
        for (int c = 0; c < D; ++c) o[c] = acc[size_t(c)] * inv;
      }
    }
  });
  copy_into(of.view(), out);
}

CacheState KiviKVCache::state() const {
  if (offset_ == 0) return {};
  return {{"keys", dequantized_keys_f32()}, {"values", dequantized_values_f32()}};
}

void KiviKVCache::set_state(const CacheState&) {
  VQ_THROW(UnsupportedError, "KiviKVCache is a comparison baseline: its state cannot be restored");
}

CacheMetaState KiviKVCache::meta_state() const {
  return {{"class", "KiviKVCache"},
          {"offset", std::to_string(offset_)},
          {"bits", std::to_string(config_.bits)},
          {"group_size", std::to_string(config_.group_size)},
          {"residual_length", std::to_string(config_.residual_length)},
          {"residual_count", std::to_string(residual_count_)},
          {"head_dim", std::to_string(config_.head_dim)},
          {"n_kv_heads", std::to_string(n_kv_heads_)},
          {"batch", std::to_string(batch_)}};
}

void KiviKVCache::set_meta_state(const CacheMetaState&) {
  VQ_THROW(UnsupportedError, "KiviKVCache is a comparison baseline: its state cannot be restored");
}

void KiviKVCache::restore(const CacheState&, const CacheMetaState&) {
  VQ_THROW(UnsupportedError, "KiviKVCache is a comparison baseline: its state cannot be restored");
}

int64_t KiviKVCache::nbytes() const {
  int64_t n = 0;
  for (const auto& s : impl_->slots)
    n += int64_t(s.key_codes.size() + s.value_codes.size()) +
         2 * int64_t(s.key_scale.size() + s.key_zero.size() + s.value_scale.size() + s.value_zero.size() +
                     s.exact_keys.size() + s.exact_values.size());
  return n;
}

std::string KiviKVCache::describe() const {
  std::ostringstream o;
  o << "KiviKVCache " << config_.str() << " (" << config_.bits_per_element() << " bits/element), head_dim "
    << config_.head_dim << ", " << offset_ << " tokens (" << n_qkeys_ << " keys and " << n_qvalues_
    << " values quantized), residual " << config_.residual_length;
  return o.str();
}

}  // namespace veloxquant
