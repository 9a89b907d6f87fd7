// src/runtime/tokenizer_impl.h — the pieces of a Hugging Face tokenizer pipeline, as the Rust
// `tokenizers` crate runs them:
//
//   text ─► added-token split (raw text) ─► normalizer (per piece) ─► added-token split
//        (normalized text) ─► pre-tokenizer (pieces → words) ─► model (BPE: word → ids)
//        ─► post-processor (template: bos/eos)
//   ids ─► token strings (added tokens win) ─► decoder chain ─► concatenation
//
// Every component is a small tagged struct built once from tokenizer.json; the pipeline runs
// on std::string pieces (UTF-8). Offsets are not tracked except for what behaviour needs
// (Metaspace prepend_scheme "first" needs "does this piece start the input").
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "veloxquant/runtime/tokenizer.h"

struct URegularExpression;

namespace veloxquant::runtime::tok {

// ---- UTF-8 helpers (tokenizer_text.cpp) ------------------------------------------------------
/// Length of the UTF-8 sequence starting at s[i] if it is a valid, complete encoding of one
/// scalar value (1..4), else 0.
int utf8_valid_len(std::string_view s, size_t i);
/// `bytes` with every maximal invalid subsequence replaced by U+FFFD (the behaviour of Rust's
/// String::from_utf8_lossy and of the WHATWG decoder).
std::string utf8_lossy(std::string_view bytes);
/// Decodes the scalar at s[i] (s must be valid UTF-8 there); advances i.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t c);
/// Unicode White_Space (what Rust's char::is_whitespace tests).
bool is_whitespace(char32_t c);
/// Rust's char::is_alphanumeric (categories L* and N*).
bool is_alphanumeric(char32_t c);
/// GPT-2 byte-level map, inverse direction: the byte a map character stands for, or -1.
int byte_level_char_to_byte(char32_t c);

/// A compiled regex (ICU). Thread-safe: each call clones the compiled pattern.
class Regex {
 public:
  /// `pattern` in the Oniguruma/fancy-regex dialect of tokenizer.json; `what` names the
  /// component for error messages.
  Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  /// Byte ranges [begin, end) of the successive non-overlapping matches in `text` (UTF-8).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  URegularExpression* re_ = nullptr;
  mutable std::mutex mu_;  // guards re_ (ICU regex objects are not thread-safe)
};

// ---- normalizers ----------------------------------------------------------------------------
struct Normalizer {
  enum class Kind { Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace, Lowercase, Strip };
  Kind kind = Kind::Sequence;
  std::vector<Normalizer> children;      ///< Sequence
  std::string str;                       ///< Prepend: prepended text; Replace: literal pattern
  std::string content;                   ///< Replace: replacement
  std::shared_ptr<Regex> regex;          ///< Replace with a Regex pattern
  bool strip_left = false, strip_right = false;  ///< Strip
  void apply(std::string& s) const;
};

// ---- pre-tokenizers -------------------------------------------------------------------------
/// One piece of text flowing through pre-tokenization.
struct Piece {
  std::string text;
  bool at_input_start = false;  ///< starts at offset 0 of the original input
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizer {
  enum class Kind { Sequence, Split, ByteLevel, Metaspace, Digits };
  Kind kind = Kind::Sequence;
  std::vector<PreTokenizer> children;  ///< Sequence
  // Split
  std::shared_ptr<Regex> regex;        ///< Split with a Regex pattern (or ByteLevel use_regex)
  std::string literal;                 ///< Split with a String pattern
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  // ByteLevel
  bool add_prefix_space = false;
  // Metaspace
  std::string replacement = "\u2581";
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;
  bool split = true;
  // Digits
  bool individual_digits = false;

  void apply(std::vector<Piece>& pieces) const;
};

// ---- the BPE model --------------------------------------------------------------------------
struct Bpe {
  std::unordered_map<std::string, int32_t> vocab;
  /// (left id << 32 | right id) → (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  std::optional<int32_t> unk_id;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  int32_t byte_ids[256];  ///< id of "<0xNN>" or -1 (byte_fallback)

  /// Appends the ids of one pre-tokenized word to `out`.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  // word → ids cache (results do not depend on it)
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;
  static constexpr size_t kCacheCapacity = 100000;
  static constexpr size_t kCacheMaxWordBytes = 256;
};

// ---- decoders ---------------------------------------------------------------------------
struct Decoder {
  enum class Kind { Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace };
  Kind kind = Kind::Sequence;
  std::vector<Decoder> children;  ///< Sequence
  std::string pattern, content;   ///< Replace (String pattern); Strip content (one char)
  std::shared_ptr<Regex> regex;   ///< Replace with a Regex pattern
  size_t strip_start = 0, strip_stop = 0;
  std::string replacement = "\u2581";  ///< Metaspace
  bool metaspace_strip_first = true;   ///< Metaspace prepend_scheme != never

  void decode_chain(std::vector<std::string>& tokens) const;
};

// ---- post-processor -----------------------------------------------------------------------
struct PostProcessor {
  /// Template for a single sequence: ids before and after it (TemplateProcessing "single",
  /// Bert/Roberta cls/sep; ByteLevel adds nothing).
  std::vector<int32_t> prefix, suffix;
};

// ---- added tokens -------------------------------------------------------------------------
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

/// Leftmost-longest matching of a set of added-token strings (a byte trie: few hundred
/// tokens, matched at most max_len bytes ahead of each position).
class AddedMatcher {
 public:
  /// (pattern, token) pairs; the first of equal patterns wins.
  void build(const std::vector<std::pair<std::string, const AddedToken*>>& patterns);
  bool empty() const { return n_patterns_ == 0; }
  /// Splits `text` into (token or nullptr, byte range) as Rust's AddedVocabulary::find_matches.
  std::vector<std::pair<const AddedToken*, std::pair<size_t, size_t>>> split(std::string_view text) const;

 private:
  struct Node {
    std::unordered_map<unsigned char, int> next;
    const AddedToken* token = nullptr;
  };
  std::vector<Node> nodes_;
  size_t n_patterns_ = 0;
  bool first_byte_[256] = {};
};

}  // namespace veloxquant::runtime::tok

namespace veloxquant::runtime {

struct Tokenizer::Impl {
  std::string kind_name;  ///< "byte-level BPE" / "sentencepiece BPE" / "BPE"
  std::optional<tok::Normalizer> normalizer;
  std::optional<tok::PreTokenizer> pre_tokenizer;
  tok::Bpe model;
  std::optional<tok::PostProcessor> post_processor;
  std::optional<tok::Decoder> decoder;
  std::vector<tok::AddedToken> added;  ///< matching order: special ones first, ids assigned
  std::unordered_map<std::string, int32_t> added_content_to_id;
  std::unordered_map<int32_t, std::string> added_id_to_content;
  std::unordered_set<std::string> special_contents;  ///< contents of special added tokens
  tok::AddedMatcher raw_matcher;                    ///< added tokens with normalized=false
  tok::AddedMatcher normalized_matcher;             ///< added tokens with normalized=true
  std::vector<std::string> id_to_token;             ///< "" where an id has no token
  std::vector<bool> has_token;
  std::vector<bool> special;                        ///< by id
  int vocab_size = 0;
  std::optional<int32_t> bos, eos, pad;

  std::optional<int32_t> token_to_id(const std::string& token) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  std::string decode(const int32_t* ids, size_t n, bool skip_special_tokens) const;
};

}  // namespace veloxquant::runtime
