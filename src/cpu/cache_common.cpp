// src/cpu/cache_common.cpp — see cache_common.h.
#include "cpu/cache_common.h"

#include <cmath>
#include <limits>
#include <vector>

#include <unistd.h>

#include "cpu/simd_util.h"
#include "veloxquant/error.h"

namespace veloxquant::detail {

namespace {

[[noreturn]] void throw_bad_value(const char* who, const char* what, int64_t b, int64_t h, int64_t t, int64_t d,
                                  float x, DType storage) {
  if (!std::isfinite(x))
    VQ_THROW(ValueError, who << ": " << what << "[" << b << "][" << h << "][" << t << "][" << d << "] is " << x
                             << ": keys and values must be finite (the cache is unchanged)");
  VQ_THROW(ValueError, who << ": " << what << "[" << b << "][" << h << "][" << t << "][" << d << "] = " << x
                           << " overflows " << dtype_name(storage)
                           << " storage (|x| <= 65504): the cache is unchanged");
}

void check_values(const TensorView& x, const char* who, const char* what, DType storage) {
  const float lim = storage == DType::F16 ? 65504.0f : 3.3895314e38f;
  const int64_t B = x.shape[0], H = x.shape[1], T = x.shape[2], D = x.shape[3];
  std::vector<float> row(static_cast<size_t>(D));
  const int es = dtype_size(x.dtype);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const char* p = static_cast<const char*>(x.data) +
                        (b * x.strides[0] + h * x.strides[1] + t * x.strides[2]) * es;
        load_row_f32(p, x.dtype, x.strides[3], D, row.data());
        bool ok = true;
        for (int64_t d = 0; d < D; ++d) ok &= std::fabs(row[size_t(d)]) <= lim;  // false for nan
        if (!ok)
          for (int64_t d = 0; d < D; ++d)
            if (!(std::fabs(row[size_t(d)]) <= lim)) throw_bad_value(who, what, b, h, t, d, row[size_t(d)], storage);
      }
}

}  // namespace

KVDims check_kv_update(const TensorView& keys, const TensorView& values, int64_t head_dim, int64_t n_kv_heads,
                       int64_t batch, DType storage, const char* who) {
  check_float4d(keys, "keys", Device::cpu());
  check_float4d(values, "values", Device::cpu());
  VQ_CHECK_SHAPE(keys.sizes() == values.sizes(), who << ": keys " << keys.shape_string() << " and values "
                                                     << values.shape_string() << " differ in shape");
  const KVDims d{keys.shape[0], keys.shape[1], keys.shape[2], keys.shape[3]};
  VQ_CHECK_SHAPE(d.head_dim == head_dim && (n_kv_heads == 0 || d.n_kv_heads == n_kv_heads) &&
                     (batch == 0 || d.batch == batch),
                 who << ": keys: expected [batch=" << (batch ? std::to_string(batch) : std::string("any"))
                     << ", n_kv_heads=" << (n_kv_heads ? std::to_string(n_kv_heads) : std::string("any"))
                     << ", n_tokens, head_dim=" << head_dim << "], got " << keys.shape_string());
  VQ_CHECK_SHAPE(d.batch >= 1 && d.n_kv_heads >= 1,
                 who << ": keys: batch and n_kv_heads must be >= 1, got " << keys.shape_string());
  check_values(keys, who, "keys", storage);
  check_values(values, who, "values", storage);
  return d;
}

void store_row_from_f32(const float* src, int64_t n, void* dst, DType dt) {
  if (dt == DType::F32) {
    std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  uint16_t* o = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  if (dt == DType::F16) {
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; ++i) o[i] = float_to_half(src[i]);
  } else {
    for (; i < n; ++i) o[i] = float_to_bf16(src[i]);
  }
}

int64_t meta_int(const CacheMetaState& m, const std::string& key) {
  auto it = m.find(key);
  VQ_CHECK_FORMAT(it != m.end(), "meta_state: missing \"" << key << "\"");
  const std::string& s = it->second;
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (...) {
    pos = std::string::npos;
  }
  VQ_CHECK_FORMAT(pos == s.size() && !s.empty(), "meta_state: \"" << key << "\" = \"" << s << "\" is not an integer");
  return int64_t(v);
}

int meta_int32(const CacheMetaState& m, const std::string& key) {
  const int64_t v = meta_int(m, key);
  VQ_CHECK_FORMAT(v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(),
                  "meta_state: \"" << key << "\" = " << v << " is out of range");
  return int(v);
}

int64_t checked_restore_bytes(std::initializer_list<int64_t> factors, const std::string& what) {
  static const int64_t kPhysical = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : std::numeric_limits<int64_t>::max();
  }();
  int64_t bytes = 1;
  bool overflow = false;
  for (int64_t f : factors) {
    VQ_CHECK_FORMAT(f >= 0, what << ": a negative size (" << f << ")");
    overflow = overflow || __builtin_mul_overflow(bytes, f, &bytes);
  }
  VQ_CHECK_FORMAT(!overflow && bytes <= kPhysical,
                  what << " would take " << (overflow ? std::string("more than 2^63") : std::to_string(bytes))
                       << " bytes, more than this machine's " << kPhysical << " bytes of memory");
  return bytes;
}

CacheMetaState vecinfer_meta_state(const VecInferMeta& m, const KVCacheConfig& config) {
  auto b = [](bool x) { return std::string(x ? "true" : "false"); };
  return {{"class", m.class_name},
          {"mode", cache_mode_name(m.mode)},
          {"offset", std::to_string(m.offset)},
          {"residual_count", std::to_string(m.residual_count)},
          {"capacity", std::to_string(m.capacity)},
          {"batch", std::to_string(m.batch)},
          {"n_kv_heads", std::to_string(m.n_kv_heads)},
          {"head_dim", std::to_string(config.head_dim)},
          {"key_codebook_bits", std::to_string(m.key_spec.codebook_bits)},
          {"value_codebook_bits", std::to_string(m.value_spec.codebook_bits)},
          {"key_sub_dim", std::to_string(m.key_spec.sub_dim)},
          {"value_sub_dim", std::to_string(m.value_spec.sub_dim)},
          {"residual_length", std::to_string(config.residual_length)},
          {"storage_dtype", dtype_name(config.storage_dtype)},
          {"step", std::to_string(config.step)},
          {"fused_sdpa_max_ctx", std::to_string(config.fused_sdpa_max_ctx)},
          {"use_hadamard", b(config.use_hadamard)},
          {"int8_key_grid", b(config.int8_key_grid)},
          {"identity_smooth", b(m.identity_smooth)},
          {"random_codebooks", b(m.random_codebooks)},
          {"seed", std::to_string(config.seed)}};
}

uint64_t meta_uint64(const CacheMetaState& m, const std::string& key) {
  auto it = m.find(key);
  VQ_CHECK_FORMAT(it != m.end(), "meta_state: missing \"" << key << "\"");
  const std::string& s = it->second;
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    // stoull accepts a leading '-' (wrapping it); an unsigned field must not have one
    if (!s.empty() && s[0] != '-') v = std::stoull(s, &pos);
  } catch (...) {
    pos = std::string::npos;
  }
  VQ_CHECK_FORMAT(pos == s.size() && !s.empty(),
                  "meta_state: \"" << key << "\" = \"" << s << "\" is not an unsigned integer");
  return uint64_t(v);
}

std::string meta_str(const CacheMetaState& m, const std::string& key) {
  auto it = m.find(key);
  VQ_CHECK_FORMAT(it != m.end(), "meta_state: missing \"" << key << "\"");
  return it->second;
}

bool meta_bool(const CacheMetaState& m, const std::string& key) {
  const std::string s = meta_str(m, key);
  VQ_CHECK_FORMAT(s == "true" || s == "false", "meta_state: \"" << key << "\" = \"" << s << "\" is not true/false");
  return s == "true";
}

const Tensor* state_find(const CacheState& s, const std::string& name) {
  for (const auto& [n, t] : s)
    if (n == name) return &t;
  return nullptr;
}

void check_state_tensor(const Tensor* t, const std::string& name, DType dt, const Shape& shape) {
  VQ_CHECK_FORMAT(t != nullptr, "state: missing tensor \"" << name << "\" (expected " << dtype_name(dt) << " "
                                                           << shape_str(shape) << ")");
  VQ_CHECK_FORMAT(t->device().is_cpu(), "state: \"" << name << "\" must be a CPU tensor");
  VQ_CHECK_FORMAT(t->dtype() == dt && t->sizes() == shape,
                  "state: \"" << name << "\": expected " << dtype_name(dt) << " " << shape_str(shape) << ", got "
                              << dtype_name(t->dtype()) << " " << shape_str(t->sizes()));
}

}  // namespace veloxquant::detail
