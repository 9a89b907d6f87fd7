// libFuzzer target: parse_model_config and parse_generation_config (config.json and
// generation_config.json of an untrusted model directory) on arbitrary text. Both must parse
// or throw veloxquant::Error (never a JSON library exception, a crash or undefined
// behaviour); a parsed model config has positive sizes that fit together.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "veloxquant/error.h"
#include "veloxquant/runtime/config.h"

using namespace veloxquant::runtime;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ModelConfig c = parse_model_config(text);
    if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
        c.vocab_size <= 0 || c.n_heads % c.n_kv_heads != 0)
      std::abort();
  } catch (const veloxquant::Error&) {
  }
  try {
    (void)parse_generation_config(text);
  } catch (const veloxquant::Error&) {
  }
  return 0;
}
