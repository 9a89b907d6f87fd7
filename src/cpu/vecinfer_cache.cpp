// src/cpu/vecinfer_cache.cpp — VecInferKVCache on the CPU (semantics in vecinfer_cache.h).
//
// Buffers (B = batch, Hkv = n_kv_heads, cap = capacity, R = residual_length):
//   keys_, values_                 [B, Hkv, cap, head_dim] storage dtype     Standard, Stash
//   key_codes_, value_codes_       [B, Hkv, cap, code_bytes] u8             Stash, MemoryBound
//   pending_key/value_codes_       [B, Hkv, R, code_bytes] u8, ring         Standard
//   ring_keys_, ring_values_       [B, Hkv, R, head_dim] storage, ring      MemoryBound
// An update (1) validates, (2) encodes the new tokens into local buffers (threads over
// batch × kv head), (3) allocates any grown buffer, and only then (4) commits: copies into
// the grown buffers, dequantizes tokens leaving the window (Standard/Stash), writes codes,
// exact window rows and counters. Steps 1–3 may throw; step 4 only writes memory already held.
#include "veloxquant/vecinfer_cache.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/attention_internal.h"
#include "core/pq_internal.h"
#include "cpu/cache_common.h"
#include "cpu/pq_grid_search.h"
#include "cpu/simd_util.h"
#include "veloxquant/error.h"

namespace veloxquant {

using detail::round_up;

namespace {

// Copies `count` rows of row_bytes from rows [src_first, ...) of each of n_bh blocks of a
// buffer with src_rows rows per block into rows [dst_first, ...) of blocks of dst_rows rows.
void copy_block_rows(const void* src, int64_t src_rows, int64_t src_first, void* dst, int64_t dst_rows,
                     int64_t dst_first, int64_t n_bh, int64_t count, int64_t row_bytes) {
  if (count <= 0) return;
  for (int64_t bh = 0; bh < n_bh; ++bh)
    std::memcpy(static_cast<char*>(dst) + (bh * dst_rows + dst_first) * row_bytes,
                static_cast<const char*>(src) + (bh * src_rows + src_first) * row_bytes, size_t(count * row_bytes));
}

// Ring <-> linear: positions [p0, p0 + count) live in ring slot p % ring_rows.
void ring_to_linear(const void* ring, int64_t ring_rows, int64_t p0, void* dst, int64_t dst_rows, int64_t n_bh,
                    int64_t count, int64_t row_bytes) {
  for (int64_t bh = 0; bh < n_bh; ++bh)
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(static_cast<char*>(dst) + (bh * dst_rows + i) * row_bytes,
                  static_cast<const char*>(ring) + (bh * ring_rows + (p0 + i) % ring_rows) * row_bytes,
                  size_t(row_bytes));
}

void linear_to_ring(const void* src, int64_t src_rows, void* ring, int64_t ring_rows, int64_t p0, int64_t n_bh,
                    int64_t count, int64_t row_bytes) {
  for (int64_t bh = 0; bh < n_bh; ++bh)
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(static_cast<char*>(ring) + (bh * ring_rows + (p0 + i) % ring_rows) * row_bytes,
                  static_cast<const char*>(src) + (bh * src_rows + i) * row_bytes, size_t(row_bytes));
}

// Strided view of rows [first, first + count) of a [B, Hkv, rows, X] buffer.
TensorView rows_view(const Tensor& buf, DType dt, int64_t B, int64_t Hkv, int64_t rows, int64_t X, int64_t first,
                     int64_t count) {
  return TensorView(static_cast<char*>(buf.data()) + first * X * dtype_size(dt), dt, {B, Hkv, count, X},
                    {Hkv * rows * X, rows * X, X, 1});
}

}  // namespace

// ---- construction ------------------------------------------------------------------------------

VecInferKVCache::VecInferKVCache(const KVCacheConfig& config) : config_(config) {
  config_.kind = CacheKind::VecInfer;
  config_.validate();
  VQ_CHECK_VALUE(config.device.is_cpu(), "VecInferKVCache is the CPU cache; got device "
                                             << device_name(config.device) << " (use KVCacheFactory)");
  mode_ = config_.mode();
  key_pq_ = ProductQuantizer(config_.head_dim, config_.key_spec(),
                             config_.key_codebook ? std::move(*config_.key_codebook) : std::vector<float>{});
  value_pq_ = ProductQuantizer(config_.head_dim, config_.value_spec(),
                               config_.value_codebook ? std::move(*config_.value_codebook) : std::vector<float>{});
  random_codebooks_ = !config_.key_codebook || !config_.value_codebook;
  if (!config_.key_codebook) key_pq_.set_random_codebook(config_.seed);
  if (!config_.value_codebook) value_pq_.set_random_codebook(config_.seed + 0x5bd1e995ull);
  if (config_.int8_key_grid) key_pq_.set_codebook(snap_to_int8_grid(key_pq_.codebook));
  key_prep_ = detail::prepare_centroids(key_pq_);
  value_prep_ = detail::prepare_centroids(value_pq_);
  config_.key_codebook.reset();
  config_.value_codebook.reset();
  int h = config_.n_kv_heads;
  if (config_.smooth_factors) h = int(config_.smooth_factors->size() / size_t(config_.head_dim));
  if (h > 0) {
    transform_ = KeyTransform(h, config_.head_dim,
                              config_.smooth_factors ? std::move(*config_.smooth_factors) : std::vector<float>{},
                              config_.use_hadamard);
    n_kv_heads_ = h;
    config_.n_kv_heads = h;
  }
  config_.smooth_factors.reset();
  pool_ = config_.thread_pool ? config_.thread_pool : std::make_shared<ThreadPool>(config_.n_threads);
}

VecInferKVCache::~VecInferKVCache() = default;

// ---- update ------------------------------------------------------------------------------------

void VecInferKVCache::check_kv(const TensorView& keys, const TensorView& values) const {
  detail::check_kv_update(keys, values, config_.head_dim, n_kv_heads_, batch_, config_.storage_dtype,
                          "VecInferKVCache::update");
}

void VecInferKVCache::append(const TensorView& keys, const TensorView& values) {
  const int64_t B = keys.shape[0], Hkv = keys.shape[1], n = keys.shape[2], D = keys.shape[3];
  const int64_t R = config_.residual_length;
  const int64_t kcb = key_pq_.code_bytes, vcb = value_pq_.code_bytes;
  const DType st = config_.storage_dtype;
  const int es = dtype_size(st);
  const bool held = mode_ != CacheMode::MemoryBound;   // keys_/values_
  const bool all_codes = mode_ != CacheMode::Standard;  // key_codes_/value_codes_
  const int64_t o = offset_, w = residual_count_;
  const int64_t new_off = o + n, new_rc = std::min(R, w + n), new_start = new_off - new_rc;
  const int64_t nbh = B * Hkv;
  if (n == 0) return;  // an update of no tokens changes nothing (batch is fixed by a real one)

  // (1) transform (first update only).
  KeyTransform fresh;
  if (n_kv_heads_ == 0) fresh = KeyTransform(int(Hkv), int(D), {}, config_.use_hadamard);
  const KeyTransform& tf = n_kv_heads_ > 0 ? transform_ : fresh;

  // (2) encode the new tokens: [B·Hkv, n, code_bytes]. Codebooks with a candidate grid search
  // (pq_grid_search.h) get it once this cache has encoded enough token-heads to pay its build;
  // kept (on the cache) only at the commit.
  std::shared_ptr<const detail::GridSearch> kgs = key_grid_, vgs = value_grid_;
  const bool build_grids = !grids_tried_ && (detail::cpu_grid_wanted(key_pq_) || detail::cpu_grid_wanted(value_pq_)) &&
                           encoded_token_heads_ + nbh * n >= detail::cpu_grid_build_after();
  if (build_grids) {
    if (detail::cpu_grid_wanted(key_pq_))
      kgs = detail::GridSearch::make(key_pq_.codebook.data(), key_pq_.n_centroids, key_pq_.sub_dim);
    if (detail::cpu_grid_wanted(value_pq_))
      vgs = detail::GridSearch::make(value_pq_.codebook.data(), value_pq_.n_centroids, value_pq_.sub_dim);
  }
  std::vector<uint8_t> kc(size_t(nbh * n * kcb)), vc(size_t(nbh * n * vcb));
  pool_->parallel_for(nbh, [&](int64_t bh, int) {
    const int64_t b = bh / Hkv, h = bh % Hkv;
    thread_local detail::AlignedBuf buf;
    float* x = buf.get(size_t(n * D));
    for (int w2 = 0; w2 < 2; ++w2) {
      const TensorView& src = w2 == 0 ? keys : values;
      const int ses = dtype_size(src.dtype);
      for (int64_t t = 0; t < n; ++t)
        detail::load_row_f32(static_cast<const char*>(src.data) +
                                 (b * src.strides[0] + h * src.strides[1] + t * src.strides[2]) * ses,
                             src.dtype, src.strides[3], D, x + t * D);
      if (w2 == 0) {
        tf.forward_keys(x, n, int(h));
        if (kgs) detail::pq_encode_grid(key_pq_, *kgs, x, n, kc.data() + bh * n * kcb);
        else detail::pq_encode_prepared(key_pq_, *key_prep_, x, n, kc.data() + bh * n * kcb);
      } else {
        if (vgs) detail::pq_encode_grid(value_pq_, *vgs, x, n, vc.data() + bh * n * vcb);
        else detail::pq_encode_prepared(value_pq_, *value_prep_, x, n, vc.data() + bh * n * vcb);
      }
    }
  });

  // (3) allocate what grows.
  int64_t cap = capacity_;
  Tensor nk = keys_, nv = values_, nkc = key_codes_, nvc = value_codes_;
  Tensor pkc = pending_key_codes_, pvc = pending_value_codes_, rk = ring_keys_, rv = ring_values_;
  const bool grow = new_off > capacity_ || batch_ == 0;
  if (grow) {
    cap = std::max<int64_t>(round_up(new_off, config_.step), config_.step);
    if (held) {
      nk = Tensor::empty({B, Hkv, cap, D}, st);
      nv = Tensor::empty({B, Hkv, cap, D}, st);
    }
    if (all_codes) {
      nkc = Tensor::empty({B, Hkv, cap, kcb}, DType::U8);
      nvc = Tensor::empty({B, Hkv, cap, vcb}, DType::U8);
    }
  }
  if (R > 0 && !pkc.defined() && mode_ == CacheMode::Standard) {
    pkc = Tensor::zeros({B, Hkv, R, kcb}, DType::U8);
    pvc = Tensor::zeros({B, Hkv, R, vcb}, DType::U8);
  }
  if (R > 0 && !rk.defined() && mode_ == CacheMode::MemoryBound) {
    rk = Tensor::zeros({B, Hkv, R, D}, st);
    rv = Tensor::zeros({B, Hkv, R, D}, st);
  }
  // Scratch for the commit, allocated before it.
  const int64_t max_deq = std::max<int64_t>(std::min(w, o) + n, 1);
  std::vector<float> deq_all(size_t(pool_->size()) * size_t(max_deq * D));

  // (4) commit.
  if (grow && o > 0) {
    if (held) {
      copy_block_rows(keys_.data(), capacity_, 0, nk.data(), cap, 0, nbh, o, D * es);
      copy_block_rows(values_.data(), capacity_, 0, nv.data(), cap, 0, nbh, o, D * es);
    }
    if (all_codes) {
      copy_block_rows(key_codes_.data(), capacity_, 0, nkc.data(), cap, 0, nbh, o, kcb);
      copy_block_rows(value_codes_.data(), capacity_, 0, nvc.data(), cap, 0, nbh, o, vcb);
    }
  }
  const int64_t leave0 = o - w, leave1 = std::min(o, new_start);  // old window tokens leaving it
  pool_->parallel_for(nbh, [&](int64_t bh, int worker) {
    const int64_t b = bh / Hkv, h = bh % Hkv;
    float* deq = deq_all.data() + size_t(worker) * size_t(max_deq * D);
    if (held && leave1 > leave0) {
      // Dequantize the leaving tokens from their codes (pending ring or all codes).
      const int64_t cnt = leave1 - leave0;
      for (int w2 = 0; w2 < 2; ++w2) {
        const ProductQuantizer& pq = w2 == 0 ? key_pq_ : value_pq_;
        const int64_t cb = pq.code_bytes;
        std::vector<uint8_t> rows(size_t(cnt * cb));
        for (int64_t i = 0; i < cnt; ++i) {
          const int64_t p = leave0 + i;
          const uint8_t* src = mode_ == CacheMode::Standard
                                   ? (w2 == 0 ? pkc : pvc).ptr<uint8_t>() + (bh * R + p % R) * cb
                                   : (w2 == 0 ? nkc : nvc).ptr<uint8_t>() + (bh * cap + p) * cb;
          std::memcpy(rows.data() + i * cb, src, size_t(cb));
        }
        pq.decode(rows.data(), cnt, deq);
        if (w2 == 0) tf.inverse_keys(deq, cnt, int(h));
        char* dst = (w2 == 0 ? nk : nv).ptr<char>() + (bh * cap + leave0) * D * es;
        for (int64_t i = 0; i < cnt; ++i) detail::store_row_from_f32(deq + i * D, D, dst + i * D * es, st);
      }
    }
    // New tokens below the window (only when n > R): dequantized from the new codes.
    const int64_t n_below = std::max<int64_t>(0, new_start - o);
    if (held && n_below > 0) {
      for (int w2 = 0; w2 < 2; ++w2) {
        const ProductQuantizer& pq = w2 == 0 ? key_pq_ : value_pq_;
        const uint8_t* codes = (w2 == 0 ? kc.data() + bh * n * kcb : vc.data() + bh * n * vcb);
        pq.decode(codes, n_below, deq);
        if (w2 == 0) tf.inverse_keys(deq, n_below, int(h));
        char* dst = (w2 == 0 ? nk : nv).ptr<char>() + (bh * cap + o) * D * es;
        for (int64_t i = 0; i < n_below; ++i) detail::store_row_from_f32(deq + i * D, D, dst + i * D * es, st);
      }
    }
    // Codes of every new token (Stash/MemoryBound), pending codes of window tokens (Standard).
    if (all_codes) {
      std::memcpy(nkc.ptr<uint8_t>() + (bh * cap + o) * kcb, kc.data() + bh * n * kcb, size_t(n * kcb));
      std::memcpy(nvc.ptr<uint8_t>() + (bh * cap + o) * vcb, vc.data() + bh * n * vcb, size_t(n * vcb));
    }
    for (int64_t t = std::max<int64_t>(0, new_start - o); t < n; ++t) {
      const int64_t p = o + t;
      if (mode_ == CacheMode::Standard) {
        std::memcpy(pkc.ptr<uint8_t>() + (bh * R + p % R) * kcb, kc.data() + (bh * n + t) * kcb, size_t(kcb));
        std::memcpy(pvc.ptr<uint8_t>() + (bh * R + p % R) * vcb, vc.data() + (bh * n + t) * vcb, size_t(vcb));
      }
      for (int w2 = 0; w2 < 2; ++w2) {
        const TensorView& src = w2 == 0 ? keys : values;
        char* dst = held ? (w2 == 0 ? nk : nv).ptr<char>() + (bh * cap + p) * D * es
                         : (w2 == 0 ? rk : rv).ptr<char>() + (bh * R + p % R) * D * es;
        const char* s = static_cast<const char*>(src.data) +
                        (b * src.strides[0] + h * src.strides[1] + t * src.strides[2]) * dtype_size(src.dtype);
        if (src.dtype == st && src.strides[3] == 1) {
          std::memcpy(dst, s, size_t(D * es));
        } else {
          detail::load_row_f32(s, src.dtype, src.strides[3], D, deq);
          detail::store_row_from_f32(deq, D, dst, st);
        }
      }
    }
  });
  keys_ = nk;
  values_ = nv;
  key_codes_ = nkc;
  value_codes_ = nvc;
  pending_key_codes_ = pkc;
  pending_value_codes_ = pvc;
  ring_keys_ = rk;
  ring_values_ = rv;
  capacity_ = cap;
  if (n_kv_heads_ == 0) transform_ = std::move(fresh);
  batch_ = B;
  n_kv_heads_ = int(Hkv);
  config_.n_kv_heads = int(Hkv);
  offset_ = new_off;
  residual_count_ = new_rc;
  key_grid_ = std::move(kgs);
  value_grid_ = std::move(vgs);
  grids_tried_ = grids_tried_ || build_grids;
  encoded_token_heads_ += nbh * n;
}

void VecInferKVCache::update(const TensorView& keys, const TensorView& values) {
  check_kv(keys, values);
  append(keys, values);
}

std::pair<Tensor, Tensor> VecInferKVCache::update_and_fetch(const TensorView& keys, const TensorView& values) {
  if (mode_ == CacheMode::MemoryBound)
    VQ_THROW(UnsupportedError,
             "VecInferKVCache::update_and_fetch: a memory-bound cache holds only codes and the fp16 window, so "
             "there is no full K/V to fetch; use update() and fused_sdpa() (the cache is unchanged)");
  check_kv(keys, values);
  append(keys, values);
  const int64_t D = config_.head_dim;
  if (offset_ == 0)  // nothing held yet (an update of no tokens)
    return {Tensor::empty({keys.shape[0], keys.shape[1], 0, D}, config_.storage_dtype),
            Tensor::empty({keys.shape[0], keys.shape[1], 0, D}, config_.storage_dtype)};
  return {Tensor::copy_of(rows_view(keys_, config_.storage_dtype, batch_, n_kv_heads_, capacity_, D, 0, offset_)),
          Tensor::copy_of(rows_view(values_, config_.storage_dtype, batch_, n_kv_heads_, capacity_, D, 0, offset_))};
}

// ---- attention ---------------------------------------------------------------------------------

VecInferAttentionInputs VecInferKVCache::attention_inputs() const {
  VQ_CHECK_T(mode_ != CacheMode::Standard, UnsupportedError,
             "VecInferKVCache::attention_inputs: a standard-mode cache keeps no codes of older tokens "
             "(use fused_sdpa=true for stash mode)");
  VQ_CHECK_VALUE(batch_ > 0, "VecInferKVCache::attention_inputs: the cache has never been updated");
  const int64_t D = config_.head_dim, R = config_.residual_length, nc = offset_ - residual_count_;
  VecInferAttentionInputs in;
  in.key_pq = &key_pq_;
  in.value_pq = &value_pq_;
  in.transform = &transform_;
  in.key_codes = rows_view(key_codes_, DType::U8, batch_, n_kv_heads_, capacity_, key_pq_.code_bytes, 0, nc);
  in.value_codes = rows_view(value_codes_, DType::U8, batch_, n_kv_heads_, capacity_, value_pq_.code_bytes, 0, nc);
  in.n_window = residual_count_;
  if (residual_count_ > 0) {
    if (mode_ == CacheMode::Stash) {
      in.window_keys = rows_view(keys_, config_.storage_dtype, batch_, n_kv_heads_, capacity_, D, nc, residual_count_);
      in.window_values =
          rows_view(values_, config_.storage_dtype, batch_, n_kv_heads_, capacity_, D, nc, residual_count_);
      in.window_first_slot = 0;
    } else {
      in.window_keys = rows_view(ring_keys_, config_.storage_dtype, batch_, n_kv_heads_, R, D, 0, R);
      in.window_values = rows_view(ring_values_, config_.storage_dtype, batch_, n_kv_heads_, R, D, 0, R);
      in.window_first_slot = nc % R;
    }
  }
  return in;
}

void VecInferKVCache::fused_sdpa_into(const TensorView& queries, const TensorView& out,
                                      const SdpaParams& params) const {
  detail::check_sdpa_params(params);
  check_float4d(queries, "queries", Device::cpu());
  VQ_CHECK_VALUE(n_kv_heads_ > 0 && batch_ > 0,
                 "VecInferKVCache::fused_sdpa: the cache has never been updated (batch and n_kv_heads unknown)");
  VQ_CHECK_SHAPE(queries.shape[0] == batch_ && queries.shape[3] == config_.head_dim && queries.shape[1] > 0 &&
                     queries.shape[1] % n_kv_heads_ == 0,
                 "VecInferKVCache::fused_sdpa: queries: expected [batch=" << batch_
                                                                          << ", n_heads (a multiple of n_kv_heads="
                                                                          << n_kv_heads_ << "), q_len, head_dim="
                                                                          << config_.head_dim << "], got "
                                                                          << queries.shape_string());
  VQ_CHECK_VALUE(offset_ <= config_.fused_sdpa_max_ctx,
                 "VecInferKVCache::fused_sdpa: context of " << offset_ << " tokens exceeds fused_sdpa_max_ctx="
                                                            << config_.fused_sdpa_max_ctx);
  if (mode_ == CacheMode::Standard) {
    const int64_t D = config_.head_dim;
    attention_cpu(queries, rows_view(keys_, config_.storage_dtype, batch_, n_kv_heads_, capacity_, D, 0, offset_),
                  rows_view(values_, config_.storage_dtype, batch_, n_kv_heads_, capacity_, D, 0, offset_), out,
                  params, pool_.get());
  } else {
    vecinfer_attention_cpu(attention_inputs(), queries, out, params, pool_.get());
  }
}

Tensor VecInferKVCache::fused_sdpa(const TensorView& queries, const SdpaParams& params) const {
  check_float4d(queries, "queries", Device::cpu());
  Tensor out = Tensor::empty(queries.sizes(), queries.dtype);
  fused_sdpa_into(queries, out.view(), params);
  return out;
}

// ---- trim, accounting ----------------------------------------------------------------------------

int64_t VecInferKVCache::trim(int64_t n) {
  VQ_CHECK_VALUE(n >= 0, "VecInferKVCache::trim: n must be >= 0, got " << n);
  const int64_t k = std::min(n, offset_);
  offset_ -= k;
  residual_count_ = std::max<int64_t>(0, residual_count_ - k);
  return k;
}

int64_t VecInferKVCache::compressed_key_bytes() const {
  const int64_t n = mode_ == CacheMode::Standard ? residual_count_ : offset_;
  return batch_ * n_kv_heads_ * n * key_pq_.code_bytes;
}
int64_t VecInferKVCache::compressed_value_bytes() const {
  const int64_t n = mode_ == CacheMode::Standard ? residual_count_ : offset_;
  return batch_ * n_kv_heads_ * n * value_pq_.code_bytes;
}
int64_t VecInferKVCache::fp16_key_bytes() const {
  const int64_t n = mode_ == CacheMode::MemoryBound ? residual_count_ : offset_;
  return batch_ * n_kv_heads_ * n * config_.head_dim * dtype_size(config_.storage_dtype);
}
int64_t VecInferKVCache::fp16_value_bytes() const { return fp16_key_bytes(); }

int64_t VecInferKVCache::codebook_bytes() const {
  const int64_t f = int64_t(sizeof(float));
  return f * int64_t(key_pq_.codebook.size() + key_pq_.centroid_norms.size() + value_pq_.codebook.size() +
                     value_pq_.centroid_norms.size() + transform_.lambda.size() + transform_.inv_lambda.size()) +
         int64_t(key_pq_.codebook_i8.size() + value_pq_.codebook_i8.size()) +  // int8 rows, where on the grid
         detail::prepared_bytes(*key_prep_) + detail::prepared_bytes(*value_prep_);  // the scan's forms
}


double VecInferKVCache::assigned_avg_bits() const {
  return (key_pq_.spec().bits_per_element() + value_pq_.spec().bits_per_element()) / 2.0;
}

int64_t VecInferKVCache::nbytes() const {
  int64_t n = codebook_bytes() + (key_grid_ ? key_grid_->nbytes() : 0) + (value_grid_ ? value_grid_->nbytes() : 0);
  for (const Tensor* t : {&keys_, &values_, &key_codes_, &value_codes_, &pending_key_codes_, &pending_value_codes_,
                          &ring_keys_, &ring_values_})
    if (t->defined()) n += t->nbytes();
  return n;
}

std::string VecInferKVCache::describe() const {
  std::ostringstream o;
  o << "VecInferKVCache " << cache_mode_name(mode_) << ": keys " << key_pq_.spec().str() << ", values "
    << value_pq_.spec().str() << " (" << assigned_avg_bits() << " bits/element assigned), residual "
    << config_.residual_length << " " << dtype_name(config_.storage_dtype) << " tokens"
    << (transform_.use_smooth ? ", smooth" : "") << (config_.use_hadamard ? " + Hadamard" : ", no Hadamard")
    << " [batch=" << batch_ << ", n_kv_heads=" << n_kv_heads_ << ", head_dim=" << config_.head_dim << "], "
    << offset_ << " tokens (" << residual_count_ << " exact), " << nbytes() << " bytes";
  if (key_grid_ || value_grid_)
    o << "; encode through candidate grids (" << (key_grid_ ? "keys" : "") << (key_grid_ && value_grid_ ? ", " : "")
      << (value_grid_ ? "values" : "") << ")";
  if (random_codebooks_) o << "; RANDOM CODEBOOKS (tests only, not a trained artifact)";
  return o.str();
}

// ---- introspection -------------------------------------------------------------------------------

Tensor VecInferKVCache::key_codes() const {
  VQ_CHECK_T(mode_ != CacheMode::Standard, UnsupportedError,
             "VecInferKVCache::key_codes: a standard-mode cache keeps no codes of older tokens");
  return Tensor::copy_of(rows_view(key_codes_, DType::U8, batch_, n_kv_heads_, capacity_, key_pq_.code_bytes, 0, offset_));
}

Tensor VecInferKVCache::value_codes() const {
  VQ_CHECK_T(mode_ != CacheMode::Standard, UnsupportedError,
             "VecInferKVCache::value_codes: a standard-mode cache keeps no codes of older tokens");
  return Tensor::copy_of(
      rows_view(value_codes_, DType::U8, batch_, n_kv_heads_, capacity_, value_pq_.code_bytes, 0, offset_));
}

Tensor VecInferKVCache::window_keys() const { return window_rows(true); }
Tensor VecInferKVCache::window_values() const { return window_rows(false); }

Tensor VecInferKVCache::window_rows(bool keys) const {
  const int64_t D = config_.head_dim, R = config_.residual_length, rc = residual_count_;
  Tensor t = Tensor::empty({batch_, n_kv_heads_, rc, D}, config_.storage_dtype);
  const int es = dtype_size(config_.storage_dtype);
  if (rc == 0) return t;
  if (mode_ == CacheMode::MemoryBound)
    ring_to_linear((keys ? ring_keys_ : ring_values_).data(), R, offset_ - rc, t.data(), rc, batch_ * n_kv_heads_, rc,
                   D * es);
  else
    copy_block_rows((keys ? keys_ : values_).data(), capacity_, offset_ - rc, t.data(), rc, 0, batch_ * n_kv_heads_, rc,
                    D * es);
  return t;
}

Tensor VecInferKVCache::dequantized_keys_f32() const { return dequantized_f32(true); }
Tensor VecInferKVCache::dequantized_values_f32() const { return dequantized_f32(false); }

Tensor VecInferKVCache::dequantized_f32(bool keys) const {
  const int64_t D = config_.head_dim, nc = offset_ - residual_count_;
  Tensor out = Tensor::empty({batch_, n_kv_heads_, offset_, D}, DType::F32);
  if (mode_ == CacheMode::Standard) {
    copy_into(rows_view(keys ? keys_ : values_, config_.storage_dtype, batch_, n_kv_heads_, capacity_, D, 0, offset_),
              out.view());
    return out;
  }
  const ProductQuantizer& pq = keys ? key_pq_ : value_pq_;
  const Tensor codes = keys ? key_codes() : value_codes();
  const Tensor win = keys ? window_keys() : window_values();
  for (int64_t bh = 0; bh < batch_ * n_kv_heads_; ++bh) {
    float* dst = out.ptr<float>() + bh * offset_ * D;
    pq.decode(codes.ptr<uint8_t>() + bh * offset_ * pq.code_bytes, nc, dst);
    if (keys && nc > 0) transform_.inverse_keys(dst, nc, int(bh % n_kv_heads_));
    detail::load_row_f32(static_cast<const char*>(win.data()) + bh * residual_count_ * D * 2, config_.storage_dtype, 1,
                         residual_count_ * D, dst + nc * D);
  }
  return out;
}

// ---- state ---------------------------------------------------------------------------------------

CacheState VecInferKVCache::state() const {
  CacheState s;
  const int64_t D = config_.head_dim, R = config_.residual_length, rc = residual_count_;
  const int64_t nbh = batch_ * n_kv_heads_;
  if (batch_ > 0) {
    if (mode_ != CacheMode::Standard && offset_ > 0) {
      s.emplace_back("key_codes", key_codes());
      s.emplace_back("value_codes", value_codes());
    }
    if (mode_ == CacheMode::Standard && rc > 0) {
      Tensor pk = Tensor::empty({batch_, n_kv_heads_, rc, key_pq_.code_bytes}, DType::U8);
      Tensor pv = Tensor::empty({batch_, n_kv_heads_, rc, value_pq_.code_bytes}, DType::U8);
      ring_to_linear(pending_key_codes_.data(), R, offset_ - rc, pk.data(), rc, nbh, rc, key_pq_.code_bytes);
      ring_to_linear(pending_value_codes_.data(), R, offset_ - rc, pv.data(), rc, nbh, rc, value_pq_.code_bytes);
      s.emplace_back("pending_key_codes", pk);
      s.emplace_back("pending_value_codes", pv);
    }
    if (mode_ != CacheMode::MemoryBound && offset_ > 0) {
      s.emplace_back("keys", Tensor::copy_of(rows_view(keys_, config_.storage_dtype, batch_, n_kv_heads_, capacity_, D,
                                                       0, offset_)));
      s.emplace_back("values", Tensor::copy_of(rows_view(values_, config_.storage_dtype, batch_, n_kv_heads_,
                                                         capacity_, D, 0, offset_)));
    }
    if (mode_ == CacheMode::MemoryBound && rc > 0) {
      s.emplace_back("window_keys", window_keys());
      s.emplace_back("window_values", window_values());
    }
  }
  if (n_kv_heads_ > 0) {
    std::vector<float> lam = transform_.lambda;
    if (lam.empty()) lam.assign(size_t(n_kv_heads_) * size_t(D), 1.0f);
    s.emplace_back("smooth_factors", Tensor::from_floats(lam, {n_kv_heads_, D}));
  }
  s.emplace_back("key_codebook", Tensor::from_floats(key_pq_.codebook, {key_pq_.n_centroids, key_pq_.sub_dim}));
  s.emplace_back("value_codebook",
                 Tensor::from_floats(value_pq_.codebook, {value_pq_.n_centroids, value_pq_.sub_dim}));
  return s;
}

CacheMetaState VecInferKVCache::meta_state() const {
  return detail::vecinfer_meta_state({class_name(), mode_, offset_, residual_count_, capacity_, batch_, n_kv_heads_,
                                      key_pq_.spec(), value_pq_.spec(),
                                      !transform_.use_smooth || transform_.lambda.empty(), random_codebooks_},
                                     config_);
}

void VecInferKVCache::restore(const CacheState& state, const CacheMetaState& meta) {
  using namespace detail;
  // ---- validate meta -----------------------------------------------------------------------------
  VQ_CHECK_FORMAT(meta_str(meta, "class") == class_name(),
                  "meta_state: class \"" << meta_str(meta, "class") << "\" cannot be restored into a " << class_name());
  KVCacheConfig c = config_;
  c.kind = CacheKind::VecInfer;
  const std::string mode = meta_str(meta, "mode");
  VQ_CHECK_FORMAT(mode == "standard" || mode == "stash" || mode == "memory_bound",
                  "meta_state: mode \"" << mode << "\" is not standard, stash or memory_bound");
  c.fused_sdpa = mode != "standard";
  c.fused_sdpa_memory_bound = mode == "memory_bound";
  c.head_dim = meta_int32(meta, "head_dim");
  c.n_kv_heads = meta_int32(meta, "n_kv_heads");
  c.key_codebook_bits = meta_int32(meta, "key_codebook_bits");
  c.value_codebook_bits = meta_int32(meta, "value_codebook_bits");
  c.key_sub_dim = meta_int32(meta, "key_sub_dim");
  c.value_sub_dim = meta_int32(meta, "value_sub_dim");
  c.residual_length = meta_int32(meta, "residual_length");
  c.step = meta_int(meta, "step");
  c.fused_sdpa_max_ctx = meta_int(meta, "fused_sdpa_max_ctx");
  c.use_hadamard = meta_bool(meta, "use_hadamard");
  c.seed = meta_uint64(meta, "seed");
  // states written before the int8 key grid existed hold codebooks as given
  c.int8_key_grid = meta.count("int8_key_grid") ? meta_bool(meta, "int8_key_grid") : false;
  const bool identity = meta_bool(meta, "identity_smooth");
  const bool random_cb = meta_bool(meta, "random_codebooks");
  try {
    c.storage_dtype = dtype_from_name(meta_str(meta, "storage_dtype"));
  } catch (const ValueError& e) {
    VQ_THROW(FormatError, "meta_state: storage_dtype: " << e.what());
  }
  const int64_t offset = meta_int(meta, "offset"), rc = meta_int(meta, "residual_count");
  const int64_t batch = meta_int(meta, "batch");
  const CacheMode m = c.mode();
  const int64_t D = c.head_dim, R = c.residual_length;
  // ---- validate tensors --------------------------------------------------------------------------
  const Tensor* kcb = state_find(state, "key_codebook");
  const Tensor* vcb = state_find(state, "value_codebook");
  const int64_t nck = int64_t(1) << std::clamp(c.key_codebook_bits, 1, 16);
  const int64_t ncv = int64_t(1) << std::clamp(c.value_codebook_bits, 1, 16);
  check_state_tensor(kcb, "key_codebook", DType::F32, {nck, c.key_sub_dim});
  check_state_tensor(vcb, "value_codebook", DType::F32, {ncv, c.value_sub_dim});
  c.key_codebook = kcb->to_vector_f32();
  c.value_codebook = vcb->to_vector_f32();
  const Tensor* sf = state_find(state, "smooth_factors");
  if (c.n_kv_heads > 0) {
    check_state_tensor(sf, "smooth_factors", DType::F32, {c.n_kv_heads, D});
    if (!identity) c.smooth_factors = sf->to_vector_f32();
    else c.smooth_factors.reset();
  } else {
    VQ_CHECK_FORMAT(sf == nullptr, "state: smooth_factors given but meta_state says n_kv_heads=0");
    c.smooth_factors.reset();
  }
  try {
    c.validate();
  } catch (const Error& e) {
    VQ_THROW(FormatError, "meta_state/state: " << e.what());
  }
  VQ_CHECK_FORMAT(offset >= 0 && batch >= 0 && rc >= 0 && rc <= std::min<int64_t>(offset, R),
                  "meta_state: offset=" << offset << ", residual_count=" << rc << ", batch=" << batch
                                        << " are inconsistent (need 0 <= residual_count <= min(offset, "
                                           "residual_length="
                                        << R << "))");
  VQ_CHECK_FORMAT(batch == 0 ? offset == 0 : c.n_kv_heads > 0,
                  "meta_state: batch=" << batch << ", offset=" << offset << ", n_kv_heads=" << c.n_kv_heads
                                       << " are inconsistent");
  int64_t cap = 0;
  if (batch > 0) {
    VQ_CHECK_FORMAT(offset <= std::numeric_limits<int64_t>::max() - c.step,
                    "meta_state: offset=" << offset << " and step=" << c.step << " overflow");
    cap = std::max<int64_t>(round_up(offset, c.step), c.step);
    if (meta.count("capacity")) {
      const int64_t mc = meta_int(meta, "capacity");
      VQ_CHECK_FORMAT(mc >= offset && mc >= 1 && mc % c.step == 0,
                      "meta_state: capacity=" << mc << " must be a positive multiple of step=" << c.step
                                              << " and >= offset=" << offset);
      cap = mc;
    }
  }
  const ProductQuantizer kp(c.head_dim, c.key_spec(), *c.key_codebook);
  const ProductQuantizer vp(c.head_dim, c.value_spec(), *c.value_codebook);
  const int64_t H = c.n_kv_heads;
  if (batch > 0) {  // what the buffers below take, before any tensor is read or allocated
    const int64_t kv_row = 2 * D * dtype_size(c.storage_dtype), code_row = kp.code_bytes + vp.code_bytes;
    const int64_t per_slot = m == CacheMode::Standard ? kv_row : m == CacheMode::Stash ? kv_row + code_row : code_row;
    const int64_t per_window_slot = m == CacheMode::Standard ? code_row : m == CacheMode::MemoryBound ? kv_row : 0;
    std::ostringstream what;
    what << "meta_state: a cache of batch=" << batch << ", n_kv_heads=" << H << ", capacity=" << cap
         << ", residual_length=" << R << ", head_dim=" << D;
    const int64_t held = checked_restore_bytes({batch, H, cap, per_slot}, what.str());
    checked_restore_bytes({held + checked_restore_bytes({batch, H, R, per_window_slot}, what.str())}, what.str());
  }
  size_t expected = 2 + (H > 0 ? 1 : 0);
  const Tensor *t_kc = nullptr, *t_vc = nullptr, *t_pk = nullptr, *t_pv = nullptr, *t_k = nullptr, *t_v = nullptr,
               *t_wk = nullptr, *t_wv = nullptr;
  if (batch > 0) {
    if (m != CacheMode::Standard && offset > 0) {
      t_kc = state_find(state, "key_codes");
      t_vc = state_find(state, "value_codes");
      check_state_tensor(t_kc, "key_codes", DType::U8, {batch, H, offset, kp.code_bytes});
      check_state_tensor(t_vc, "value_codes", DType::U8, {batch, H, offset, vp.code_bytes});
      expected += 2;
    }
    if (m == CacheMode::Standard && rc > 0) {
      t_pk = state_find(state, "pending_key_codes");
      t_pv = state_find(state, "pending_value_codes");
      check_state_tensor(t_pk, "pending_key_codes", DType::U8, {batch, H, rc, kp.code_bytes});
      check_state_tensor(t_pv, "pending_value_codes", DType::U8, {batch, H, rc, vp.code_bytes});
      expected += 2;
    }
    if (m != CacheMode::MemoryBound && offset > 0) {
      t_k = state_find(state, "keys");
      t_v = state_find(state, "values");
      check_state_tensor(t_k, "keys", c.storage_dtype, {batch, H, offset, D});
      check_state_tensor(t_v, "values", c.storage_dtype, {batch, H, offset, D});
      expected += 2;
    }
    if (m == CacheMode::MemoryBound && rc > 0) {
      t_wk = state_find(state, "window_keys");
      t_wv = state_find(state, "window_values");
      check_state_tensor(t_wk, "window_keys", c.storage_dtype, {batch, H, rc, D});
      check_state_tensor(t_wv, "window_values", c.storage_dtype, {batch, H, rc, D});
      expected += 2;
    }
  }
  if (state.size() != expected) {
    std::ostringstream names;
    for (const auto& [n, t] : state) names << " " << n;
    VQ_THROW(FormatError, "state: expected " << expected << " tensors for a " << mode << " cache with offset="
                                             << offset << ", residual_count=" << rc << ", got " << state.size()
                                             << ":" << names.str());
  }
  for (const Tensor* t : {t_k, t_v, t_wk, t_wv}) {
    if (!t) continue;
    const float lim = c.storage_dtype == DType::F16 ? 65504.0f : 3.3895314e38f;
    for (int64_t i = 0; i < t->numel(); ++i) {
      const float x = load_f32(t->data(), t->dtype(), i);
      VQ_CHECK_FORMAT(std::fabs(x) <= lim, "state: element " << i << " is " << x << ": must be finite");
    }
  }
  // ---- build -------------------------------------------------------------------------------------
  KeyTransform tf;
  if (H > 0) tf = KeyTransform(int(H), int(D), identity ? std::vector<float>{} : *c.smooth_factors, c.use_hadamard);
  const DType st = c.storage_dtype;
  const int es = dtype_size(st);
  const int64_t nbh = batch * H;
  Tensor nk, nv, nkc, nvc, pkc, pvc, rk, rv;
  if (batch > 0) {
    if (m != CacheMode::MemoryBound) {
      nk = Tensor::empty({batch, H, cap, D}, st);
      nv = Tensor::empty({batch, H, cap, D}, st);
      if (t_k) copy_block_rows(t_k->data(), offset, 0, nk.data(), cap, 0, nbh, offset, D * es);
      if (t_v) copy_block_rows(t_v->data(), offset, 0, nv.data(), cap, 0, nbh, offset, D * es);
    }
    if (m != CacheMode::Standard) {
      nkc = Tensor::empty({batch, H, cap, kp.code_bytes}, DType::U8);
      nvc = Tensor::empty({batch, H, cap, vp.code_bytes}, DType::U8);
      if (t_kc) copy_block_rows(t_kc->data(), offset, 0, nkc.data(), cap, 0, nbh, offset, kp.code_bytes);
      if (t_vc) copy_block_rows(t_vc->data(), offset, 0, nvc.data(), cap, 0, nbh, offset, vp.code_bytes);
    }
    if (m == CacheMode::Standard && R > 0) {
      pkc = Tensor::zeros({batch, H, R, kp.code_bytes}, DType::U8);
      pvc = Tensor::zeros({batch, H, R, vp.code_bytes}, DType::U8);
      if (t_pk) linear_to_ring(t_pk->data(), rc, pkc.data(), R, offset - rc, nbh, rc, kp.code_bytes);
      if (t_pv) linear_to_ring(t_pv->data(), rc, pvc.data(), R, offset - rc, nbh, rc, vp.code_bytes);
    }
    if (m == CacheMode::MemoryBound && R > 0) {
      rk = Tensor::zeros({batch, H, R, D}, st);
      rv = Tensor::zeros({batch, H, R, D}, st);
      if (t_wk) linear_to_ring(t_wk->data(), rc, rk.data(), R, offset - rc, nbh, rc, D * es);
      if (t_wv) linear_to_ring(t_wv->data(), rc, rv.data(), R, offset - rc, nbh, rc, D * es);
    }
  }
  // the scan's prepared codebooks: the cache's own when the codebooks are
  const bool same_codebooks = kp.codebook == key_pq_.codebook && vp.codebook == value_pq_.codebook;
  std::shared_ptr<const detail::PreparedCentroids> kprep = key_prep_, vprep = value_prep_;
  if (!same_codebooks) kprep = detail::prepare_centroids(kp), vprep = detail::prepare_centroids(vp);
  // ---- commit (no throws below) --------------------------------------------------------------------
  c.key_codebook.reset();
  c.value_codebook.reset();
  c.smooth_factors.reset();
  c.n_threads = config_.n_threads;
  c.device = config_.device;
  c.stream = config_.stream;
  config_ = std::move(c);
  mode_ = m;
  if (!same_codebooks) {  // grids of other codebooks
    key_grid_.reset();
    value_grid_.reset();
    grids_tried_ = false;
    encoded_token_heads_ = 0;
  }
  key_pq_ = kp;
  value_pq_ = vp;
  key_prep_ = std::move(kprep);
  value_prep_ = std::move(vprep);
  transform_ = std::move(tf);
  random_codebooks_ = random_cb;
  offset_ = offset;
  residual_count_ = rc;
  capacity_ = cap;
  keys_ = nk;
  values_ = nv;
  key_codes_ = nkc;
  value_codes_ = nvc;
  pending_key_codes_ = pkc;
  pending_value_codes_ = pvc;
  ring_keys_ = rk;
  ring_values_ = rv;
  batch_ = batch;
  n_kv_heads_ = int(H);
  staged_state_.reset();
}

void VecInferKVCache::set_state(const CacheState& state) {
  try {
    restore(state, meta_state());
    return;
  } catch (const FormatError&) {
    // Does not fit the current meta: stage it for the set_meta_state that follows (mlx_lm order).
  }
  static const char* const kNames[] = {"key_codes", "value_codes", "pending_key_codes", "pending_value_codes",
                                       "keys", "values", "window_keys", "window_values", "smooth_factors",
                                       "key_codebook", "value_codebook"};
  for (const auto& [name, t] : state) {
    bool known = false;
    for (const char* k : kNames) known |= name == k;
    VQ_CHECK_FORMAT(known, "state: unknown tensor \"" << name << "\" for a VecInferKVCache");
    VQ_CHECK_FORMAT(t.defined() && t.device().is_cpu(), "state: \"" << name << "\" must be a CPU tensor");
  }
  staged_state_ = state;
}

void VecInferKVCache::set_meta_state(const CacheMetaState& meta) {
  if (staged_state_) {
    const CacheState s = *staged_state_;
    restore(s, meta);  // clears the staging on success
    return;
  }
  restore(state(), meta);
}

std::unique_ptr<VecInferKVCache> VecInferKVCache::from_state(const CacheState& state, const CacheMetaState& meta) {
  KVCacheConfig c;
  c.kind = CacheKind::VecInfer;
  c.key_codebook_bits = 1;  // the cheapest valid quantizers; restore replaces them
  c.value_codebook_bits = 1;
  auto cache = std::make_unique<VecInferKVCache>(c);
  cache->restore(state, meta);
  return cache;
}

}  // namespace veloxquant
