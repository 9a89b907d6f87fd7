// libFuzzer target: Tokenizer::from_json on arbitrary text (a tokenizer.json from an untrusted
// model directory). Seeds: the committed tiny models' tokenizer.json and the hand-made variants
// in fuzz/corpus/tokenizer_json (normalizers, Split regexes, Metaspace, byte fallback, added
// tokens, post-processors). What must hold:
//   * from_json loads or throws veloxquant::Error (never a JSON library exception, a crash or
//     an out-of-bounds access);
//   * a loaded tokenizer encodes a fixed set of texts to ids in [0, vocab_size) (without special
//     tokens; >= 0 with them) or throws veloxquant::Error, and decodes those ids without crashing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "veloxquant/error.h"
#include "veloxquant/runtime/tokenizer.h"

using veloxquant::runtime::Tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  std::optional<Tokenizer> tok;
  try {
    tok.emplace(Tokenizer::from_json(json));
  } catch (const veloxquant::Error&) {
    return 0;
  }
  for (const char* text : {"", "Hello, world! 123", "  leading  spaces\n\ttabs", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
                           "<|bos|>x<|eos|>", "\xff\xfe bad utf-8"}) {
    for (bool special : {false, true}) {
      std::vector<int32_t> ids;
      try {
        ids = tok->encode(text, special);
      } catch (const veloxquant::Error&) {
        continue;
      }
      // the model's ids; a post-processor's template adds the ids the file writes there, which
      // (as in the reference) need not be in the vocabulary: the model checks every id it embeds
      for (int32_t id : ids)
        if (id < 0 || (!special && id >= tok->vocab_size())) std::abort();
      try {
        (void)tok->decode(ids, special);
      } catch (const veloxquant::Error&) {
      }
    }
  }
  return 0;
}
