// Link stubs for the fuzz targets, which compile only the sources they exercise. Artifact
// loading never builds a cache, so the factory is never called from a fuzz target.
#include <cstdlib>

#include "veloxquant/cache.h"

namespace veloxquant {
std::unique_ptr<KVCache> KVCacheFactory::create(const KVCacheConfig&) { std::abort(); }
}  // namespace veloxquant
