// src/cpu/cache_common.h — input checks, row conversion and meta_state parsing shared by the
// CPU caches (fp16_cache.cpp, vecinfer_cache.cpp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "veloxquant/cache.h"
#include "veloxquant/tensor.h"

namespace veloxquant::detail {

/// Shape of an update: [batch, n_kv_heads, n_new, head_dim].
struct KVDims {
  int64_t batch, n_kv_heads, n_new, head_dim;
};

/// Validates keys/values of an update against the cache: rank 4, float, CPU, equal shapes,
/// head_dim, n_kv_heads (when known, > 0), batch (when known, > 0); every value finite and
/// representable in `storage` (|x| <= 65504 for f16). Throws ShapeError / ValueError naming
/// the shapes or the first bad element; changes nothing.
KVDims check_kv_update(const TensorView& keys, const TensorView& values, int64_t head_dim, int64_t n_kv_heads,
                       int64_t batch, DType storage, const char* who);

/// Converts n f32 values to dtype dt at dst (contiguous), rounding to nearest even.
void store_row_from_f32(const float* src, int64_t n, void* dst, DType dt);

/// round_up(n, step) (n >= 0, step >= 1; n + step − 1 must fit in int64: restore checks it).
inline int64_t round_up(int64_t n, int64_t step) { return (n + step - 1) / step * step; }

/// meta_state access: throws FormatError naming the key when missing or not an integer.
int64_t meta_int(const CacheMetaState& m, const std::string& key);
/// An integer field held as int (head_dim, n_kv_heads, bits, sub_dims, residual_length):
/// FormatError naming the key when it does not fit in an int.
int meta_int32(const CacheMetaState& m, const std::string& key);
/// A restored cache's allocation, checked before anything is allocated: the product of
/// `factors` (batch, n_kv_heads, token slots, bytes a slot, ...; each >= 0) as bytes, or
/// FormatError naming `what` when it overflows or exceeds this machine's physical memory.
/// The token slots come from meta_state ("capacity", "step", "residual_length"), which no
/// tensor of the state backs: a small file must not make the loader allocate terabytes.
int64_t checked_restore_bytes(std::initializer_list<int64_t> factors, const std::string& what);
/// Unsigned 64-bit field (seeds): the full range, no sign.
uint64_t meta_uint64(const CacheMetaState& m, const std::string& key);
std::string meta_str(const CacheMetaState& m, const std::string& key);
bool meta_bool(const CacheMetaState& m, const std::string& key);

/// What a VecInfer cache (CPU or CUDA) records in meta_state: one schema, written in one place,
/// so the two backends' states stay interchangeable.
struct VecInferMeta {
  std::string class_name;
  CacheMode mode = CacheMode::Standard;
  int64_t offset = 0, residual_count = 0, capacity = 0, batch = 0;
  int n_kv_heads = 0;
  PQSpec key_spec, value_spec;
  bool identity_smooth = true, random_codebooks = false;
};
CacheMetaState vecinfer_meta_state(const VecInferMeta& m, const KVCacheConfig& config);

/// The tensor named `name` in a state, or nullptr.
const Tensor* state_find(const CacheState& s, const std::string& name);
/// Throws FormatError unless t is a CPU tensor of dtype dt and shape `shape`.
void check_state_tensor(const Tensor* t, const std::string& name, DType dt, const Shape& shape);

}  // namespace veloxquant::detail
