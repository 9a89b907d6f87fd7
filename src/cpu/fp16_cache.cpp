// src/cpu/fp16_cache.cpp — FP16KVCache: the uncompressed baseline (see fp16_cache.h).
#include "veloxquant/fp16_cache.h"

#include <cstring>
#include <limits>
#include <sstream>

#include "core/attention_internal.h"
#include "cpu/cache_common.h"
#include "cpu/simd_util.h"
#include "veloxquant/error.h"

namespace veloxquant {

using detail::round_up;

FP16KVCache::FP16KVCache(const KVCacheConfig& config) : config_(config) {
  KVCacheConfig c = config;
  c.kind = CacheKind::FP16;
  c.validate();
  VQ_CHECK_VALUE(config.device.is_cpu(), "FP16KVCache is the CPU cache; got device " << device_name(config.device)
                                                                                    << " (use KVCacheFactory)");
  config_.kind = CacheKind::FP16;
  n_kv_heads_ = config.n_kv_heads;
  pool_ = config.thread_pool ? config.thread_pool : std::make_shared<ThreadPool>(config.n_threads);
}

FP16KVCache::~FP16KVCache() = default;

void FP16KVCache::check_kv(const TensorView& keys, const TensorView& values) const {
  detail::check_kv_update(keys, values, config_.head_dim, n_kv_heads_, batch_, config_.storage_dtype,
                          "FP16KVCache::update");
}

void FP16KVCache::append(const TensorView& keys, const TensorView& values) {
  const int64_t B = keys.shape[0], Hkv = keys.shape[1], n = keys.shape[2], D = keys.shape[3];
  const DType st = config_.storage_dtype;
  const int es = dtype_size(st);
  if (n == 0) return;  // an update of no tokens changes nothing (batch is fixed by a real one)
  if (offset_ + n > capacity_ || batch_ == 0) {
    // Allocate first (may throw: nothing changed yet), then copy the live tokens.
    const int64_t cap = std::max<int64_t>(round_up(offset_ + n, config_.step), config_.step);
    Tensor nk = Tensor::empty({B, Hkv, cap, D}, st), nv = Tensor::empty({B, Hkv, cap, D}, st);
    for (int64_t bh = 0; bh < B * Hkv && offset_ > 0; ++bh) {
      std::memcpy(nk.ptr<char>() + bh * cap * D * es, keys_.ptr<char>() + bh * capacity_ * D * es,
                  size_t(offset_ * D * es));
      std::memcpy(nv.ptr<char>() + bh * cap * D * es, values_.ptr<char>() + bh * capacity_ * D * es,
                  size_t(offset_ * D * es));
    }
    keys_ = nk;
    values_ = nv;
    capacity_ = cap;
  }
  batch_ = B;
  n_kv_heads_ = int(Hkv);
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t t = 0; t < n; ++t) {
        const int64_t dst = ((b * Hkv + h) * capacity_ + offset_ + t) * D;
        for (int w = 0; w < 2; ++w) {
          const TensorView& x = w == 0 ? keys : values;
          char* out = (w == 0 ? keys_ : values_).ptr<char>() + dst * es;
          const char* src = static_cast<const char*>(x.data) +
                            (b * x.strides[0] + h * x.strides[1] + t * x.strides[2]) * dtype_size(x.dtype);
          if (x.dtype == st && x.strides[3] == 1) {
            std::memcpy(out, src, size_t(D * es));
          } else {
            detail::load_row_f32(src, x.dtype, x.strides[3], D, row.data());
            detail::store_row_from_f32(row.data(), D, out, st);
          }
        }
      }
  offset_ += n;
}

void FP16KVCache::update(const TensorView& keys, const TensorView& values) {
  check_kv(keys, values);
  append(keys, values);
}

std::pair<Tensor, Tensor> FP16KVCache::update_and_fetch(const TensorView& keys, const TensorView& values) {
  check_kv(keys, values);
  append(keys, values);
  if (offset_ == 0)  // nothing held yet (an update of no tokens)
    return {Tensor::empty({keys.shape[0], keys.shape[1], 0, config_.head_dim}, config_.storage_dtype),
            Tensor::empty({keys.shape[0], keys.shape[1], 0, config_.head_dim}, config_.storage_dtype)};
  return {Tensor::copy_of(keys_view()), Tensor::copy_of(values_view())};
}

TensorView FP16KVCache::keys_view() const {
  const int64_t D = config_.head_dim;
  return TensorView(keys_.data(), config_.storage_dtype, {batch_, n_kv_heads_, offset_, D},
                    {n_kv_heads_ * capacity_ * D, capacity_ * D, D, 1});
}

TensorView FP16KVCache::values_view() const {
  const int64_t D = config_.head_dim;
  return TensorView(values_.data(), config_.storage_dtype, {batch_, n_kv_heads_, offset_, D},
                    {n_kv_heads_ * capacity_ * D, capacity_ * D, D, 1});
}

void FP16KVCache::fused_sdpa_into(const TensorView& queries, const TensorView& out, const SdpaParams& params) const {
  detail::check_sdpa_params(params);
  check_float4d(queries, "queries", Device::cpu());
  VQ_CHECK_VALUE(n_kv_heads_ > 0 && batch_ > 0,
                 "FP16KVCache::fused_sdpa: the cache has never been updated (batch and n_kv_heads unknown)");
  VQ_CHECK_SHAPE(queries.shape[0] == batch_ && queries.shape[3] == config_.head_dim &&
                     queries.shape[1] % n_kv_heads_ == 0 && queries.shape[1] > 0,
                 "FP16KVCache::fused_sdpa: queries: expected [batch=" << batch_ << ", n_heads (a multiple of n_kv_heads="
                                                                       << n_kv_heads_ << "), q_len, head_dim="
                                                                       << config_.head_dim << "], got "
                                                                       << queries.shape_string());
  attention_cpu(queries, keys_view(), values_view(), out, params, pool_.get());
}

Tensor FP16KVCache::fused_sdpa(const TensorView& queries, const SdpaParams& params) const {
  check_float4d(queries, "queries", Device::cpu());
  Tensor out = Tensor::empty(queries.sizes(), queries.dtype);
  fused_sdpa_into(queries, out.view(), params);
  return out;
}

int64_t FP16KVCache::trim(int64_t n) {
  VQ_CHECK_VALUE(n >= 0, "FP16KVCache::trim: n must be >= 0, got " << n);
  const int64_t k = std::min(n, offset_);
  offset_ -= k;
  return k;
}

CacheState FP16KVCache::state() const {
  CacheState s;
  if (batch_ > 0 && n_kv_heads_ > 0) {
    s.emplace_back("keys", Tensor::copy_of(keys_view()));
    s.emplace_back("values", Tensor::copy_of(values_view()));
  }
  return s;
}

CacheMetaState FP16KVCache::meta_state() const {
  return {{"class", class_name()},
          {"offset", std::to_string(offset_)},
          {"head_dim", std::to_string(config_.head_dim)},
          {"n_kv_heads", std::to_string(n_kv_heads_)},
          {"batch", std::to_string(batch_)},
          {"storage_dtype", dtype_name(config_.storage_dtype)},
          {"step", std::to_string(config_.step)},
          {"capacity", std::to_string(capacity_)}};
}

void FP16KVCache::restore(const CacheState& state, const CacheMetaState& meta) {
  using namespace detail;
  // Validate everything first.
  VQ_CHECK_FORMAT(meta_str(meta, "class") == class_name(),
                  "meta_state: class \"" << meta_str(meta, "class") << "\" cannot be restored into a " << class_name());
  KVCacheConfig c = config_;
  c.head_dim = meta_int32(meta, "head_dim");
  c.n_kv_heads = meta_int32(meta, "n_kv_heads");
  c.step = meta_int(meta, "step");
  try {
    c.storage_dtype = dtype_from_name(meta_str(meta, "storage_dtype"));
  } catch (const ValueError& e) {
    VQ_THROW(FormatError, "meta_state: storage_dtype: " << e.what());
  }
  const int64_t offset = meta_int(meta, "offset"), batch = meta_int(meta, "batch");
  try {
    c.validate();
  } catch (const Error& e) {
    VQ_THROW(FormatError, "meta_state: " << e.what());
  }
  VQ_CHECK_FORMAT(offset >= 0 && batch >= 0, "meta_state: offset=" << offset << ", batch=" << batch << " must be >= 0");
  VQ_CHECK_FORMAT(batch == 0 ? offset == 0 : c.n_kv_heads > 0,
                  "meta_state: offset=" << offset << ", batch=" << batch << ", n_kv_heads=" << c.n_kv_heads
                                        << " are inconsistent");
  const Tensor* k = state_find(state, "keys");
  const Tensor* v = state_find(state, "values");
  if (batch > 0) {
    const Shape shape{batch, c.n_kv_heads, offset, c.head_dim};
    check_state_tensor(k, "keys", c.storage_dtype, shape);
    check_state_tensor(v, "values", c.storage_dtype, shape);
  } else {
    VQ_CHECK_FORMAT(k == nullptr && v == nullptr, "state: tensors given for an empty cache (batch=0)");
  }
  VQ_CHECK_FORMAT(state.size() == (batch > 0 ? 2u : 0u), "state: unexpected tensors (" << state.size()
                                                                                      << " given, expected keys and values)");
  VQ_CHECK_FORMAT(offset <= std::numeric_limits<int64_t>::max() - c.step,
                  "meta_state: offset=" << offset << " and step=" << c.step << " overflow");
  int64_t cap = batch > 0 ? std::max<int64_t>(round_up(offset, c.step), c.step) : 0;
  if (batch > 0 && meta.count("capacity")) {
    const int64_t mc = meta_int(meta, "capacity");
    VQ_CHECK_FORMAT(mc >= offset && mc >= 1 && mc % c.step == 0,
                    "meta_state: capacity=" << mc << " must be a positive multiple of step=" << c.step
                                            << " and >= offset=" << offset);
    cap = mc;
  }
  if (batch > 0) {  // what the new storage takes, before it is allocated
    std::ostringstream what;
    what << "meta_state: a cache of batch=" << batch << ", n_kv_heads=" << c.n_kv_heads << ", capacity=" << cap
         << ", head_dim=" << c.head_dim;
    checked_restore_bytes({batch, c.n_kv_heads, cap, 2 * c.head_dim * int64_t(dtype_size(c.storage_dtype))},
                          what.str());
  }
  // Build the new storage, then swap in.
  Tensor nk, nv;
  if (batch > 0) {
    const int64_t D = c.head_dim, es = dtype_size(c.storage_dtype);
    nk = Tensor::empty({batch, c.n_kv_heads, cap, D}, c.storage_dtype);
    nv = Tensor::empty({batch, c.n_kv_heads, cap, D}, c.storage_dtype);
    for (int64_t bh = 0; bh < batch * c.n_kv_heads && offset > 0; ++bh) {
      std::memcpy(nk.ptr<char>() + bh * cap * D * es, k->ptr<char>() + bh * offset * D * es, size_t(offset * D * es));
      std::memcpy(nv.ptr<char>() + bh * cap * D * es, v->ptr<char>() + bh * offset * D * es, size_t(offset * D * es));
    }
  }
  config_.head_dim = c.head_dim;
  config_.n_kv_heads = c.n_kv_heads;
  config_.step = c.step;
  config_.storage_dtype = c.storage_dtype;
  keys_ = nk;
  values_ = nv;
  capacity_ = cap;
  offset_ = offset;
  batch_ = batch;
  n_kv_heads_ = c.n_kv_heads;
}

void FP16KVCache::set_state(const CacheState& state) {
  CacheMetaState m = meta_state();
  m.erase("capacity");
  const Tensor* k = detail::state_find(state, "keys");
  if (k && k->ndim() == 4) {
    m["batch"] = std::to_string(k->dim(0));
    m["n_kv_heads"] = std::to_string(k->dim(1));
    m["offset"] = std::to_string(k->dim(2));
  } else {  // std::string(1, '0'), not "0": GCC 12 -O2 warns (-Wrestrict) on that assignment (GCC bug 105329)
    m["batch"] = std::string(1, '0');
    m["offset"] = std::string(1, '0');
  }
  restore(state, m);
}

void FP16KVCache::set_meta_state(const CacheMetaState& meta) { restore(state(), meta); }

std::unique_ptr<FP16KVCache> FP16KVCache::from_state(const CacheState& state, const CacheMetaState& meta) {
  KVCacheConfig c;
  c.kind = CacheKind::FP16;
  auto cache = std::make_unique<FP16KVCache>(c);
  cache->restore(state, meta);
  return cache;
}

int64_t FP16KVCache::nbytes() const { return keys_.defined() ? keys_.nbytes() + values_.nbytes() : 0; }

std::string FP16KVCache::describe() const {
  std::ostringstream o;
  o << "KVCache " << dtype_name(config_.storage_dtype) << " [batch=" << batch_ << ", n_kv_heads=" << n_kv_heads_
    << ", head_dim=" << config_.head_dim << "], " << offset_ << " tokens (capacity " << capacity_ << "), "
    << nbytes() << " bytes";
  return o.str();
}

}  // namespace veloxquant
