// src/core/cache_config.cpp — KVCacheConfig validation, the mode it selects, and the few
// non-virtual pieces of the KVCache interface.
#include <cmath>
#include <thread>

#include "veloxquant/cache.h"
#include "veloxquant/error.h"

namespace veloxquant {

const char* cache_mode_name(CacheMode m) {
  switch (m) {
    case CacheMode::Standard: return "standard";
    case CacheMode::Stash: return "stash";
    case CacheMode::MemoryBound: return "memory_bound";
  }
  return "?";
}

const char* codebook_format_name(CodebookFormat f) {
  switch (f) {
    case CodebookFormat::F16: return "f16";
    case CodebookFormat::E4M3: return "e4m3";
    case CodebookFormat::I8: return "i8";
    case CodebookFormat::I8KV: return "i8kv";
  }
  return "?";
}

CodebookFormat parse_codebook_format(const std::string& name) {
  for (CodebookFormat f : {CodebookFormat::F16, CodebookFormat::E4M3, CodebookFormat::I8, CodebookFormat::I8KV})
    if (name == codebook_format_name(f)) return f;
  VQ_THROW(ValueError, "codebook format '" << name << "' is not one of f16, e4m3, i8, i8kv");
}

CacheMode KVCacheConfig::mode() const {
  if (fused_sdpa_memory_bound) return CacheMode::MemoryBound;
  if (fused_sdpa) return CacheMode::Stash;
  return CacheMode::Standard;
}

namespace {

void check_codebook(const std::optional<std::vector<float>>& cb, int bits, int sub_dim, const char* name) {
  if (!cb) return;
  const size_t want = (size_t(1) << bits) * size_t(sub_dim);
  VQ_CHECK_SHAPE(cb->size() == want, name << ": expected [2^" << bits << "=" << (size_t(1) << bits)
                                          << ", sub_dim=" << sub_dim << "] = " << want << " floats, got "
                                          << cb->size());
  for (size_t i = 0; i < cb->size(); ++i)
    VQ_CHECK_VALUE(std::isfinite((*cb)[i]),
                   name << "[" << i / sub_dim << "][" << i % sub_dim << "] is " << (*cb)[i] << ": must be finite");
}

void check_pq_fields(int head_dim, int bits, int sub_dim, const char* bits_name, const char* sub_name) {
  VQ_CHECK_VALUE(bits >= 1 && bits <= 16, bits_name << " must be in 1..16, got " << bits);
  VQ_CHECK_VALUE(sub_dim >= 1 && sub_dim <= 16, sub_name << " must be in 1..16, got " << sub_dim);
  VQ_CHECK_VALUE(head_dim % sub_dim == 0,
                 "head_dim=" << head_dim << " is not divisible by " << sub_name << "=" << sub_dim);
}

}  // namespace

void KVCacheConfig::validate() const {
  VQ_CHECK_VALUE(head_dim >= 1, "head_dim must be >= 1, got " << head_dim);
  VQ_CHECK_VALUE(n_kv_heads >= 0, "n_kv_heads must be >= 0 (0: from the first update), got " << n_kv_heads);
  VQ_CHECK_VALUE(storage_dtype == DType::F16 || storage_dtype == DType::BF16,
                 "storage_dtype must be f16 or bf16, got " << dtype_name(storage_dtype));
  VQ_CHECK_VALUE(step >= 1, "step must be >= 1, got " << step);
  VQ_CHECK_VALUE(n_threads >= 0, "n_threads must be >= 0 (0: hardware concurrency), got " << n_threads);
  if (kind == CacheKind::FP16) return;
  check_pq_fields(head_dim, key_codebook_bits, key_sub_dim, "key_codebook_bits", "key_sub_dim");
  check_pq_fields(head_dim, value_codebook_bits, value_sub_dim, "value_codebook_bits", "value_sub_dim");
  check_codebook(key_codebook, key_codebook_bits, key_sub_dim, "key_codebook");
  check_codebook(value_codebook, value_codebook_bits, value_sub_dim, "value_codebook");
  VQ_CHECK_VALUE(residual_length >= 0, "residual_length must be >= 0, got " << residual_length);
  VQ_CHECK_VALUE(fused_sdpa_max_ctx >= 1, "fused_sdpa_max_ctx must be >= 1, got " << fused_sdpa_max_ctx);
  if (smooth_factors) {
    const size_t n = smooth_factors->size();
    if (n_kv_heads > 0) {
      VQ_CHECK_SHAPE(n == size_t(n_kv_heads) * size_t(head_dim),
                     "smooth_factors: expected [n_kv_heads=" << n_kv_heads << ", head_dim=" << head_dim << "] = "
                                                             << size_t(n_kv_heads) * head_dim << " floats, got "
                                                             << n);
    } else {
      VQ_CHECK_SHAPE(n > 0 && n % size_t(head_dim) == 0,
                     "smooth_factors: expected [n_kv_heads, head_dim=" << head_dim
                                                                       << "] (a non-zero multiple of head_dim), got "
                                                                       << n << " floats");
    }
    for (size_t i = 0; i < n; ++i)
      VQ_CHECK_VALUE(std::isfinite((*smooth_factors)[i]) && (*smooth_factors)[i] > 0.0f,
                     "smooth_factors[" << i / head_dim << "][" << i % head_dim << "] must be finite and > 0, got "
                                       << (*smooth_factors)[i]);
  }
}

void KVCache::merge(const std::vector<const KVCache*>& others) {
  VQ_THROW(UnsupportedError, class_name() << "::merge: batching caches is not supported yet (merging "
                                          << others.size() << " caches was requested)");
}

int default_threads() {
  // Asked once: std::thread::hardware_concurrency() reads a sysfs file on every call with glibc
  // (open, read, close: ~10 us, more than a decode step's whole encode of one token per head).
  static const int n = [] {
    const unsigned hw = std::thread::hardware_concurrency();
    return hw > 0 ? int(hw) : 1;
  }();
  return n;
}

}  // namespace veloxquant
