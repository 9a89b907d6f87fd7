// src/core/cache_factory.cpp — KVCacheFactory::create: the config's kind on the config's device.
#include "core/cuda_hooks.h"
#include "veloxquant/cache.h"
#include "veloxquant/error.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/vecinfer_cache.h"

namespace veloxquant {

std::unique_ptr<KVCache> KVCacheFactory::create(const KVCacheConfig& config) {
  config.validate();
  if (config.device.is_cuda()) return detail::create_cuda_cache(config);
  switch (config.kind) {
    case CacheKind::FP16: return std::make_unique<FP16KVCache>(config);
    case CacheKind::VecInfer: return std::make_unique<VecInferKVCache>(config);
  }
  VQ_THROW(ValueError, "KVCacheFactory::create: unknown cache kind " << int(config.kind));
}

}  // namespace veloxquant
