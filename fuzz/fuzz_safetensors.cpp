// libFuzzer target: the safetensors header parser and tensor access on arbitrary bytes.
// Any input must either parse (and then every tensor view stays inside the buffer) or throw
// veloxquant::FormatError; crashes, hangs, leaks and out-of-bounds reads are bugs.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "veloxquant/error.h"
#include "veloxquant/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const veloxquant::SafetensorsHeader h = veloxquant::parse_safetensors(data, size);
    // Touch every byte of every tensor: ASan flags any region outside the input.
    volatile uint8_t sink = 0;
    for (const auto& t : h.tensors) {
      const uint8_t* p = data + h.data_start + t.begin;
      for (uint64_t i = 0; i < t.nbytes(); ++i) sink ^= p[i];
    }
    // The file object (owned copy) and its zero-copy views.
    veloxquant::SafetensorsFile f = veloxquant::SafetensorsFile::from_bytes(data, size);
    for (const auto& name : f.names()) {
      try {
        const veloxquant::TensorView v = f.tensor(name);
        const auto* b = static_cast<const uint8_t*>(v.data);
        for (int64_t i = 0; i < v.nbytes(); ++i) sink ^= b[i];
        if (veloxquant::dtype_is_float(v.dtype) && v.numel() > 0 && v.numel() < 4096) (void)f.read_f32(name);
      } catch (const veloxquant::FormatError&) {
        // dtypes without a veloxquant equivalent, rank > 8: refused cleanly
      }
    }
    (void)sink;
  } catch (const veloxquant::FormatError&) {
  }
  return 0;
}
