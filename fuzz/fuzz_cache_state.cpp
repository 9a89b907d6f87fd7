// libFuzzer target: a cache rebuilt from a saved state (the prompt-cache file's per-layer
// state and meta_state, mlx_lm's from_state) on arbitrary bytes. The input is a safetensors
// file: its tensors are the state, its metadata the meta_state ("class" picks KVCache or
// VecInferKVCache), as save_prompt_cache writes one layer without the "layers.i." prefix.
// What must hold:
//   * from_state rebuilds the cache or throws veloxquant::Error (never another exception, a
//     crash, an out-of-bounds access or an allocation the file's contents do not back);
//   * a rebuilt cache's state + meta_state rebuild a cache with byte-equal state, the same
//     meta_state and the same offset and nbytes;
//   * on a rebuilt cache with tokens and at most 2^16 elements a token, update (one token),
//     fused_sdpa (one query a head) and trim(1) succeed or throw veloxquant::Error, and trim
//     leaves offset − 1 tokens.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "veloxquant/error.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/safetensors.h"
#include "veloxquant/vecinfer_cache.h"

using namespace veloxquant;

namespace {

std::unique_ptr<KVCache> rebuild(const std::string& cls, const CacheState& s, const CacheMetaState& m) {
  if (cls == "KVCache") return FP16KVCache::from_state(s, m);
  return VecInferKVCache::from_state(s, m);
}

bool same_state(const CacheState& a, const CacheState& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor &x = a[i].second, &y = b[i].second;
    if (a[i].first != b[i].first || x.dtype() != y.dtype() || x.sizes() != y.sizes()) return false;
    if (x.nbytes() && std::memcmp(x.data(), y.data(), size_t(x.nbytes())) != 0) return false;
  }
  return true;
}

// The library refuses states whose buffers exceed the machine's memory (FormatError, tested in
// tests/cache/test_vecinfer_cache.cpp); below that, a state may still claim gigabytes of slots
// that no tensor backs (capacity, step, residual_length). Those are valid and would trip the
// fuzzer's memory limit, so inputs that claim more than 256 MiB are skipped.
bool claims_too_much(const CacheMetaState& m) {
  auto get = [&](const char* k) -> double {
    auto it = m.find(k);
    return it == m.end() ? 0.0 : std::fabs(std::strtod(it->second.c_str(), nullptr));
  };
  const double slots = std::max(get("capacity"), get("step")) + get("residual_length") + get("offset");
  return get("batch") * std::max(get("n_kv_heads"), 1.0) * slots * get("head_dim") * 8.0 > 256.0 * (1 << 20);
}

void exercise(KVCache& c) {
  const KVCacheConfig& cfg = c.config();
  const int64_t B = c.batch(), H = c.n_kv_heads(), D = cfg.head_dim;
  if (B <= 0 || H <= 0 || D <= 0 || B * H * D > (1 << 16)) return;
  const int64_t before = c.offset();
  try {
    Tensor k = Tensor::zeros({B, H, 1, D}, DType::F32), v = Tensor::zeros({B, H, 1, D}, DType::F32);
    for (int64_t i = 0; i < k.numel(); ++i) k.ptr<float>()[i] = float(i % 7) - 3.0f, v.ptr<float>()[i] = 0.5f;
    c.update(k.view(), v.view());
    if (c.offset() != before + 1) std::abort();
  } catch (const Error&) {
    if (c.offset() != before) std::abort();  // a failed call leaves the cache as it was
  }
  try {
    SdpaParams p;
    p.n_threads = 1;
    Tensor q = Tensor::zeros({B, H, 1, D}, DType::F32);
    for (int64_t i = 0; i < q.numel(); ++i) q.ptr<float>()[i] = 0.25f * float(i % 5);
    (void)c.fused_sdpa(q.view(), p);
  } catch (const Error&) {
  }
  const int64_t n = c.offset();
  try {
    if (n > 0 && c.trim(1) != 1) std::abort();
  } catch (const Error&) {
    return;
  }
  if (n > 0 && c.offset() != n - 1) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CacheState state;
  CacheMetaState meta;
  std::string cls;
  try {
    const SafetensorsFile f = SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size));
    for (const auto& name : f.names()) state.emplace_back(name, Tensor::copy_of(f.tensor(name)));
    meta = f.metadata();
    cls = meta.count("class") ? meta.at("class") : "";
  } catch (const Error&) {
    return 0;
  }
  if (cls != "KVCache" && cls != "VecInferKVCache") return 0;
  if (claims_too_much(meta)) return 0;
  std::unique_ptr<KVCache> c;
  try {
    c = rebuild(cls, state, meta);
  } catch (const Error&) {
    return 0;
  }
  // the rebuilt cache describes itself completely: its own state and meta rebuild it
  const CacheState s1 = c->state();
  const CacheMetaState m1 = c->meta_state();
  std::unique_ptr<KVCache> c2 = rebuild(cls, s1, m1);
  if (!same_state(c2->state(), s1) || c2->meta_state() != m1 || c2->offset() != c->offset() ||
      c2->nbytes() != c->nbytes())
    std::abort();
  exercise(*c);
  return 0;
}
