// libFuzzer target: artifact loading (safetensors parsing + metadata and tensor validation)
// on arbitrary bytes. Must load or throw veloxquant::FormatError — never crash or read out of
// bounds. A loaded artifact must also serialise again and reload to the same layers.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "veloxquant/artifact.h"
#include "veloxquant/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  veloxquant::Artifact a;
  try {
    a = veloxquant::Artifact::from_bytes(data, size);
  } catch (const veloxquant::FormatError&) {
    return 0;
  }
  const std::vector<uint8_t> img = a.serialize();
  const veloxquant::Artifact b = veloxquant::Artifact::from_bytes(img.data(), img.size());
  if (b.n_layers != a.n_layers || b.layers.size() != a.layers.size()) std::abort();
  for (size_t i = 0; i < a.layers.size(); ++i)
    if (b.layers[i].key_codebook != a.layers[i].key_codebook ||
        b.layers[i].smooth_factors != a.layers[i].smooth_factors)
      std::abort();
  return 0;
}
