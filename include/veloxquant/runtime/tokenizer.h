// veloxquant/runtime/tokenizer.h — a Hugging Face `tokenizer.json` tokenizer (encode/decode)
// that reproduces the Rust `tokenizers` library bit for bit (see docs/tokenizer.md).
//
// Supported (anything else throws FormatError naming the component, e.g.
// "tokenizer.json: model.type 'Unigram' is not supported"):
//   * model BPE: byte-level (GPT-2 byte map: Llama-3, Qwen2/Qwen3; `ignore_merges`) and
//     sentencepiece-style (Llama-2, Mistral: `byte_fallback` with <0xNN> tokens, unk/fuse_unk).
//   * normalizers Sequence, NFC/NFD/NFKC/NFKD, Prepend, Replace, Lowercase, Strip;
//     pre-tokenizers Sequence, Split (regex or string, every behaviour), ByteLevel, Metaspace,
//     Digits; decoders Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace;
//     post-processors TemplateProcessing, ByteLevel, Sequence, Bert/RobertaProcessing.
//   * added tokens (`added_tokens`, special or not) are matched in the raw text before the
//     model runs, honouring lstrip/rstrip/single_word/normalized.
//
// Split regexes are run with ICU's regex engine on the pattern string found in the file,
// so \p{L}, \p{N}, (?i:...) and lookahead behave as in the reference (Oniguruma).
//
// A Tokenizer is immutable after construction (encode keeps an internal word cache guarded
// by a mutex), cheap to copy (shared state) and safe to use from several threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace veloxquant::runtime {

class Tokenizer {
 public:
  /// Loads `tokenizer_json` (a Hugging Face tokenizer.json) and, if given and present,
  /// `tokenizer_config_json` (its bos_token / eos_token / pad_token name the special ids;
  /// add_bos_token is not consulted: tokenizer.json's post_processor decides what
  /// encode(text, true) adds, as in the `tokenizers` library).
  /// When `tokenizer_config_json` is empty, "tokenizer_config.json" next to the first file
  /// is used if it exists. Added tokens get their ids as the reference assigns them (the id
  /// of the same string in the model vocabulary, else the next free id past it), which for
  /// files written by the library equals the ids in the file. Throws IoError (unreadable
  /// file) or FormatError (malformed or unsupported content, message names the component).
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json,
                             const std::filesystem::path& tokenizer_config_json = {});
  /// Same as from_file, from in-memory JSON texts (`tokenizer_config_json` may be empty).
  static Tokenizer from_json(std::string_view tokenizer_json,
                             std::string_view tokenizer_config_json = {});

  /// Encodes UTF-8 `text` (invalid UTF-8 sequences are treated as U+FFFD). With
  /// `add_special_tokens` the post-processor's template is applied (e.g. bos prepended
  /// for Llama-2/Llama-3; nothing for Qwen). Added/special token strings in `text` are
  /// always recognised as their tokens, as in the reference.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  /// Decodes `ids` to UTF-8 text with the file's decoder. Byte sequences that are not valid
  /// UTF-8 become U+FFFD (as in the reference). With `skip_special_tokens`, tokens marked
  /// special are dropped. Ids >= vocab_size() (e.g. padding rows of an embedding matrix) have
  /// no token and decode to nothing, as in the reference; a negative id throws ValueError.
  /// (transformers' clean_up_tokenization_spaces is not applied.)
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  /// Number of ids (model vocabulary plus added tokens): the largest id + 1.
  int vocab_size() const;
  /// The id of a token given by its vocabulary string (e.g. "Ġhello", "<|im_end|>").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// The vocabulary string of `id` (not decoded; e.g. "Ġhello", "▁hello", "<0x0A>").
  /// Throws ValueError for an id outside [0, vocab_size()).
  std::string id_to_token(int32_t id) const;
  /// True for ids of added tokens marked `special: true`.
  bool is_special(int32_t id) const;

  /// Beginning-of-sequence id (tokenizer_config bos_token, else the post-processor's
  /// leading special token), if known.
  std::optional<int32_t> bos_id() const;
  /// End-of-sequence id (tokenizer_config eos_token), if known.
  std::optional<int32_t> eos_id() const;
  /// Padding id (tokenizer_config pad_token), if known.
  std::optional<int32_t> pad_id() const;
  /// Whether encode(text, true) prepends bos (derived from the post-processor).
  bool adds_bos() const;

  /// Short description: model kind ("byte-level BPE" / "sentencepiece BPE"), vocab size.
  std::string describe() const;

  struct Impl;  // defined in src/runtime/tokenizer_impl.h

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamDecoder;
};

/// Incremental decoding for generation: push ids one at a time, get back only text that is
/// final — complete UTF-8 characters that later tokens cannot change (e.g. a multi-byte
/// character split over two byte tokens is returned once both arrived; the sentencepiece
/// leading-space strip is applied exactly once at the start). The concatenation of all
/// push() results and flush() equals decode(all ids, skip_special_tokens) (tested on the
/// reference corpora). Works as the reference's DecodeStream: the ids since the last emitted
/// text are decoded together with the ids emitted just before them as context.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);
  /// Forgets all pushed ids and takes `context_ids` (e.g. the last few prompt tokens) as
  /// already-emitted context: later pushes return only text beyond decode(context_ids), decoded
  /// in that context (so a sentencepiece "▁word" after a prompt keeps its leading space, which
  /// decoding it alone would strip).
  void prime(std::span<const int32_t> context_ids);
  /// Appends `id`; returns the newly completed text (possibly empty).
  std::string push(int32_t id);
  /// Returns whatever is still pending (incomplete bytes become U+FFFD) and resets.
  std::string flush();
  /// Forgets all pushed ids.
  void reset();

 private:
  Tokenizer tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // context ids followed by the ids whose text is pending
  std::string prefix_;        // text of the context ids ids_[0, prefix_index_)
  size_t prefix_index_ = 0;
};

}  // namespace veloxquant::runtime
