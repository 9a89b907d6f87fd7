// src/runtime/tokenizer_text.cpp — the text-side components of the tokenizer pipeline:
// UTF-8 helpers, the ICU-backed regex, normalizers, pre-tokenizers, decoders and the
// added-token matcher. Each follows the behaviour of the component of the same name in the
// Rust `tokenizers` crate (what the models' tokenizer.json files are run with), including
// its quirks (e.g. ByteFallback turns each byte of an invalid run into its own U+FFFD, the
// Metaspace decoder drops every "▁" of the first token).
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uregex.h>
#include <unicode/ustring.h>
#include <unicode/utext.h>

#include <algorithm>
#include <cstring>

#include "runtime/tokenizer_impl.h"
#include "veloxquant/error.h"

namespace veloxquant::runtime::tok {

// ---- UTF-8 ------------------------------------------------------------------------------------
int utf8_valid_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const size_t n = s.size();
  const unsigned c = b(i);
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  const auto cont = [&](size_t k) { return k < n && (b(k) & 0xC0) == 0x80; };
  if (c < 0xE0) return cont(i + 1) ? 2 : 0;
  if (c < 0xF0) {
    if (i + 1 >= n) return 0;
    const unsigned c1 = b(i + 1);
    if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F)) return 0;  // overlong / surrogate
    return cont(i + 1) && cont(i + 2) ? 3 : 0;
  }
  if (c < 0xF5) {
    if (i + 1 >= n) return 0;
    const unsigned c1 = b(i + 1);
    if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) return 0;  // overlong / > U+10FFFF
    return cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

// Length of the maximal prefix of an invalid sequence at s[i] that could start a valid one
// (Unicode "maximal subpart"): it is replaced by a single U+FFFD.
static size_t invalid_subpart_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = b(i);
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c < 0xE0) {
    need = 1;
  } else if (c >= 0xE0 && c < 0xF0) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c < 0xF5) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t k = 1;
  for (; k <= need && i + k < s.size(); ++k) {
    const unsigned ck = b(i + k);
    const unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (ck < l || ck > h) break;
  }
  return k;  // the lead byte plus the continuation bytes that fit
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int len = utf8_valid_len(bytes, i);
    if (len > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";
      i += invalid_subpart_len(bytes, i);
    }
  }
  return out;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = b(i);
  if (c < 0x80) {
    i += 1;
    return c;
  }
  if (c < 0xE0) {
    const char32_t r = ((c & 0x1F) << 6) | (b(i + 1) & 0x3F);
    i += 2;
    return r;
  }
  if (c < 0xF0) {
    const char32_t r = ((c & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    i += 3;
    return r;
  }
  const char32_t r =
      ((c & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F);
  i += 4;
  return r;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

bool is_whitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

bool is_alphanumeric(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC)) return true;
  const int8_t t = u_charType(cp);
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

// UTF-8 <-> UTF-16 for the ICU calls that need UTF-16 (normalization, case mapping).
static std::u16string to_u16(std::string_view s) {
  std::u16string out(s.size(), u'\0');
  int32_t len = 0;
  UErrorCode st = U_ZERO_ERROR;
  u_strFromUTF8(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &len, s.data(),
                static_cast<int32_t>(s.size()), &st);
  VQ_CHECK_VALUE(U_SUCCESS(st), "tokenizer: UTF-8 to UTF-16 conversion failed: " << u_errorName(st));
  out.resize(static_cast<size_t>(len));
  return out;
}
static std::string to_u8(std::u16string_view s) {
  std::string out(s.size() * 3, '\0');
  int32_t len = 0;
  UErrorCode st = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &len, reinterpret_cast<const UChar*>(s.data()),
              static_cast<int32_t>(s.size()), &st);
  VQ_CHECK_VALUE(U_SUCCESS(st), "tokenizer: UTF-16 to UTF-8 conversion failed: " << u_errorName(st));
  out.resize(static_cast<size_t>(len));
  return out;
}

// ---- Regex ------------------------------------------------------------------------------------
Regex::Regex(const std::string& pattern, const std::string& what) {
  UErrorCode st = U_ZERO_ERROR;
  UParseError pe{};
  const std::u16string p16 = to_u16(pattern);
  re_ = uregex_open(reinterpret_cast<const UChar*>(p16.data()), static_cast<int32_t>(p16.size()), 0, &pe, &st);
  VQ_CHECK_FORMAT(U_SUCCESS(st), "tokenizer.json: " << what << ": regex '" << pattern
                                                    << "' is not supported (ICU: " << u_errorName(st)
                                                    << " at offset " << pe.offset << ")");
}

Regex::~Regex() {
  if (re_) uregex_close(re_);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (text.empty()) return out;
  std::lock_guard<std::mutex> lock(mu_);
  UErrorCode st = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &st);
  uregex_setUText(re_, ut, &st);
  // Native indexes of a UTF-8 UText are byte offsets.
  while (U_SUCCESS(st) && uregex_findNext(re_, &st)) {
    const int64_t b = uregex_start64(re_, 0, &st);
    const int64_t e = uregex_end64(re_, 0, &st);
    if (e > b) out.emplace_back(static_cast<size_t>(b), static_cast<size_t>(e));
  }
  // Detach the text before it goes away.
  UErrorCode st2 = U_ZERO_ERROR;
  uregex_setText(re_, u"", 0, &st2);
  utext_close(ut);
  VQ_CHECK_VALUE(U_SUCCESS(st), "tokenizer: regex search failed: " << u_errorName(st));
  return out;
}

// ---- normalizers ------------------------------------------------------------------------------
static void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

static void regex_replace_all(std::string& s, const Regex& re, std::string_view to) {
  const auto m = re.find_all(s);
  if (m.empty()) return;
  std::string out;
  size_t pos = 0;
  for (auto [b, e] : m) {
    out.append(s, pos, b - pos);
    out.append(to);
    pos = e;
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

// The reference normalizes with Unicode 9.0 tables (the unicode-normalization-alignments
// crate): characters assigned later have no decomposition and combining class 0 there. ICU
// knows them, so they are cut out and passed through unchanged; as starters that compose with
// nothing, they block reordering and composition exactly as the reference sees them.
static bool newer_than_unicode9(char32_t c) {
  UVersionInfo v;
  u_charAge(static_cast<UChar32>(c), v);
  return v[0] > 9;
}

static void icu_normalize(std::string& s, Normalizer::Kind kind);

static void unicode_normalize(std::string& s, Normalizer::Kind kind) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return;  // every normal form leaves ASCII unchanged
  std::string out, seg;
  bool split = false;
  for (size_t i = 0; i < s.size();) {
    const size_t b = i;
    const char32_t c = utf8_next(s, i);
    if (c >= 0x80 && newer_than_unicode9(c)) {
      icu_normalize(seg, kind);
      out += seg;
      seg.clear();
      out.append(s, b, i - b);
      split = true;
    } else {
      seg.append(s, b, i - b);
    }
  }
  if (!split) {
    icu_normalize(s, kind);
    return;
  }
  icu_normalize(seg, kind);
  out += seg;
  s.swap(out);
}

static void icu_normalize(std::string& s, Normalizer::Kind kind) {
  if (s.empty()) return;
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (kind) {
    case Normalizer::Kind::NFC: n = icu::Normalizer2::getNFCInstance(st); break;
    case Normalizer::Kind::NFD: n = icu::Normalizer2::getNFDInstance(st); break;
    case Normalizer::Kind::NFKC: n = icu::Normalizer2::getNFKCInstance(st); break;
    default: n = icu::Normalizer2::getNFKDInstance(st); break;
  }
  VQ_CHECK_VALUE(U_SUCCESS(st), "tokenizer: ICU normalizer unavailable: " << u_errorName(st));
  const std::u16string u = to_u16(s);
  icu::UnicodeString in(false, reinterpret_cast<const UChar*>(u.data()), static_cast<int32_t>(u.size()));
  if (n->isNormalized(in, st) && U_SUCCESS(st)) return;
  st = U_ZERO_ERROR;
  const icu::UnicodeString out = n->normalize(in, st);
  VQ_CHECK_VALUE(U_SUCCESS(st), "tokenizer: normalization failed: " << u_errorName(st));
  s = to_u8(std::u16string_view(reinterpret_cast<const char16_t*>(out.getBuffer()), static_cast<size_t>(out.length())));
}

void Normalizer::apply(std::string& s) const {
  switch (kind) {
    case Kind::Sequence:
      for (const auto& c : children) c.apply(s);
      break;
    case Kind::NFC:
    case Kind::NFD:
    case Kind::NFKC:
    case Kind::NFKD:
      unicode_normalize(s, kind);
      break;
    case Kind::Prepend:
      if (!s.empty()) s.insert(0, str);
      break;
    case Kind::Replace:
      if (regex)
        regex_replace_all(s, *regex, content);
      else
        replace_all(s, str, content);
      break;
    case Kind::Lowercase: {
      const std::u16string u = to_u16(s);
      std::u16string out(u.size() * 2 + 4, u'\0');
      UErrorCode st = U_ZERO_ERROR;
      const int32_t len = u_strToLower(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()),
                                       reinterpret_cast<const UChar*>(u.data()), static_cast<int32_t>(u.size()), "", &st);
      VQ_CHECK_VALUE(U_SUCCESS(st), "tokenizer: lowercase failed: " << u_errorName(st));
      out.resize(static_cast<size_t>(len));
      s = to_u8(out);
      break;
    }
    case Kind::Strip: {
      size_t b = 0, e = s.size();
      if (strip_left) {
        while (b < e) {
          size_t k = b;
          if (!is_whitespace(utf8_next(s, k))) break;
          b = k;
        }
      }
      if (strip_right) {
        while (e > b) {
          size_t k = e - 1;
          while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
          size_t j = k;
          if (!is_whitespace(utf8_next(s, j))) break;
          e = k;
        }
      }
      s = s.substr(b, e - b);
      break;
    }
  }
}

// ---- pre-tokenizers ---------------------------------------------------------------------------
// Rust NormalizedString::split: `matches` covers the text with (range, is_match) runs; the
// behaviour decides which runs are kept and how they merge; empty results are dropped.
static void split_piece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& hits, bool invert,
                        SplitBehavior behavior, std::vector<Piece>& out) {
  const std::string& s = piece.text;
  struct Run {
    size_t b, e;
    bool match;
  };
  std::vector<Run> runs;
  size_t prev = 0;
  for (auto [b, e] : hits) {
    if (prev != b) runs.push_back({prev, b, invert});
    runs.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != s.size()) runs.push_back({prev, s.size(), invert});

  std::vector<std::pair<size_t, size_t>> keep;  // ranges to emit
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const auto& r : runs)
        if (!r.match) keep.emplace_back(r.b, r.e);
      break;
    case SplitBehavior::Isolated:
      for (const auto& r : runs) keep.emplace_back(r.b, r.e);
      break;
    case SplitBehavior::Contiguous: {
      bool previous = false;
      for (const auto& r : runs) {
        if (r.match == previous && !keep.empty())
          keep.back().second = r.e;
        else
          keep.emplace_back(r.b, r.e);
        previous = r.match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool previous = false;
      for (const auto& r : runs) {
        if (r.match && !previous && !keep.empty())
          keep.back().second = r.e;
        else
          keep.emplace_back(r.b, r.e);
        previous = r.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous = false;
      for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
        if (it->match && !previous && !keep.empty())
          keep.back().first = it->b;
        else
          keep.emplace_back(it->b, it->e);
        previous = it->match;
      }
      std::reverse(keep.begin(), keep.end());
      break;
    }
  }
  for (auto [b, e] : keep) {
    if (e <= b) continue;
    out.push_back(Piece{s.substr(b, e - b), piece.at_input_start && b == 0});
  }
}

static std::vector<std::pair<size_t, size_t>> find_literal(std::string_view s, std::string_view lit) {
  std::vector<std::pair<size_t, size_t>> hits;
  if (lit.empty()) return hits;
  size_t pos = 0;
  while ((pos = s.find(lit, pos)) != std::string_view::npos) {
    hits.emplace_back(pos, pos + lit.size());
    pos += lit.size();
  }
  return hits;
}

// GPT-2's reversible byte ↦ printable-character map: printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in byte order.
static const std::string* byte_level_chars() {
  static const auto table = [] {
    static std::string t[256];
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      utf8_append(t[b], keep ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++));
    }
    return t;
  }();
  return table;
}

int byte_level_char_to_byte(char32_t c) {
  static const auto inverse = [] {
    std::vector<int> inv(512, -1);
    const std::string* t = byte_level_chars();
    for (int b = 0; b < 256; ++b) {
      size_t i = 0;
      inv[utf8_next(t[b], i)] = b;
    }
    return inv;
  }();
  return c < inverse.size() ? inverse[c] : -1;
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  if (kind == Kind::Sequence) {
    for (const auto& c : children) c.apply(pieces);
    return;
  }
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    switch (kind) {
      case Kind::Split: {
        const auto hits = regex ? regex->find_all(p.text) : find_literal(p.text, literal);
        split_piece(p, hits, invert, behavior, out);
        break;
      }
      case Kind::ByteLevel: {
        if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(p.text.begin(), ' ');
        std::vector<Piece> words;
        if (regex)
          split_piece(p, regex->find_all(p.text), false, SplitBehavior::Isolated, words);
        else if (!p.text.empty())
          words.push_back(std::move(p));
        const std::string* map = byte_level_chars();
        for (Piece& w : words) {
          std::string mapped;
          mapped.reserve(w.text.size() * 2);
          for (unsigned char c : w.text) mapped += map[c];
          out.push_back(Piece{std::move(mapped), w.at_input_start});
        }
        break;
      }
      case Kind::Metaspace: {
        replace_all(p.text, " ", replacement);
        const bool starts = p.text.compare(0, replacement.size(), replacement) == 0;
        if (!starts && (prepend == Prepend::Always || (prepend == Prepend::First && p.at_input_start)))
          p.text.insert(0, replacement);
        if (split)
          split_piece(p, find_literal(p.text, replacement), false, SplitBehavior::MergedWithNext, out);
        else if (!p.text.empty())
          out.push_back(std::move(p));
        break;
      }
      case Kind::Digits: {
        std::vector<std::pair<size_t, size_t>> hits;
        size_t i = 0;
        while (i < p.text.size()) {
          const size_t b = i;
          const char32_t c = utf8_next(p.text, i);
          const int8_t t = u_charType(static_cast<UChar32>(c));
          if (t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER) hits.emplace_back(b, i);
        }
        split_piece(p, hits, false, individual_digits ? SplitBehavior::Isolated : SplitBehavior::Contiguous, out);
        break;
      }
      case Kind::Sequence:
        break;
    }
  }
  pieces.swap(out);
}

// ---- decoders ---------------------------------------------------------------------------------
static std::string strip_chars(const std::string& t, char32_t ch, size_t start, size_t stop) {
  std::vector<size_t> starts;  // byte offset of each char
  for (size_t i = 0; i < t.size();) {
    starts.push_back(i);
    utf8_next(t, i);
  }
  const size_t n = starts.size();
  const auto char_at = [&](size_t k) {
    size_t i = starts[k];
    return utf8_next(t, i);
  };
  size_t cut_b = 0;
  for (size_t k = 0; k < start && k < n; ++k) {
    if (char_at(k) == ch)
      cut_b = k + 1;
    else
      break;
  }
  size_t cut_e = n;
  for (size_t k = 0; k < stop && k < n; ++k) {
    const size_t idx = n - k - 1;
    if (char_at(idx) == ch)
      cut_e = idx;
    else
      break;
  }
  if (cut_e <= cut_b) return std::string();
  const size_t bb = cut_b < n ? starts[cut_b] : t.size();
  const size_t be = cut_e < n ? starts[cut_e] : t.size();
  return t.substr(bb, be - bb);
}

void Decoder::decode_chain(std::vector<std::string>& tokens) const {
  switch (kind) {
    case Kind::Sequence:
      for (const auto& c : children) c.decode_chain(tokens);
      break;
    case Kind::ByteLevel: {
      std::string bytes;
      for (const std::string& t : tokens) {
        const size_t mark = bytes.size();
        bool ok = true;
        for (size_t i = 0; i < t.size();) {
          const int b = byte_level_char_to_byte(utf8_next(t, i));
          if (b < 0) {
            ok = false;
            break;
          }
          bytes += static_cast<char>(b);
        }
        if (!ok) {  // a char outside the map: the token's own UTF-8 bytes
          bytes.resize(mark);
          bytes += t;
        }
      }
      tokens.assign(1, utf8_lossy(bytes));
      break;
    }
    case Kind::Replace:
      for (auto& t : tokens) {
        if (regex)
          regex_replace_all(t, *regex, content);
        else
          replace_all(t, pattern, content);
      }
      break;
    case Kind::ByteFallback: {
      std::vector<std::string> out;
      out.reserve(tokens.size());
      std::string pending;
      const auto flush = [&] {
        if (pending.empty()) return;
        bool valid = true;
        for (size_t i = 0; i < pending.size();) {
          const int len = utf8_valid_len(pending, i);
          if (len == 0) {
            valid = false;
            break;
          }
          i += static_cast<size_t>(len);
        }
        if (valid)
          out.push_back(pending);
        else
          for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
        pending.clear();
      };
      for (auto& t : tokens) {
        int byte = -1;
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
          const auto hex = [](char c) {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            return -1;
          };
          const int h = hex(t[3]), l = hex(t[4]);
          if (h >= 0 && l >= 0) byte = h * 16 + l;
        }
        if (byte >= 0) {
          pending += static_cast<char>(byte);
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      tokens.swap(out);
      break;
    }
    case Kind::Fuse: {
      std::string all;
      for (const auto& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      break;
    }
    case Kind::Strip: {
      size_t i = 0;
      const char32_t ch = content.empty() ? U' ' : utf8_next(content, i);
      for (auto& t : tokens) t = strip_chars(t, ch, strip_start, strip_stop);
      break;
    }
    case Kind::Metaspace: {
      for (size_t k = 0; k < tokens.size(); ++k) {
        std::string out;
        const bool drop = k == 0 && metaspace_strip_first;
        const std::string& t = tokens[k];
        for (size_t i = 0; i < t.size();) {
          if (t.compare(i, replacement.size(), replacement) == 0) {
            if (!drop) out += ' ';
            i += replacement.size();
          } else {
            const size_t b = i;
            utf8_next(t, i);
            out.append(t, b, i - b);
          }
        }
        tokens[k] = std::move(out);
      }
      break;
    }
  }
}

// ---- added tokens -----------------------------------------------------------------------------
void AddedMatcher::build(const std::vector<std::pair<std::string, const AddedToken*>>& patterns) {
  n_patterns_ = 0;
  nodes_.assign(1, Node{});
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (const auto& [pattern, t] : patterns) {
    if (pattern.empty()) continue;
    ++n_patterns_;
    int node = 0;
    for (unsigned char c : pattern) {
      auto it = nodes_[node].next.find(c);
      if (it == nodes_[node].next.end()) {
        nodes_.push_back(Node{});
        const int id = static_cast<int>(nodes_.size()) - 1;
        nodes_[node].next.emplace(c, id);
        node = id;
      } else {
        node = it->second;
      }
    }
    if (!nodes_[node].token) nodes_[node].token = t;
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  }
}

// A Unicode "word" character, as the reference's regex \w: Alphabetic, a mark, a decimal
// digit, connector punctuation or a join control.
static bool is_word_char(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) return true;
  const int8_t t = u_charType(cp);
  return t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK ||
         t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION;
}
static bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return is_word_char(utf8_next(s, k));
}
static bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t k = 0;
  return is_word_char(utf8_next(s, k));
}

std::vector<std::pair<const AddedToken*, std::pair<size_t, size_t>>> AddedMatcher::split(std::string_view text) const {
  std::vector<std::pair<const AddedToken*, std::pair<size_t, size_t>>> out;
  size_t start_offset = 0;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest added token starting at i.
    int node = 0;
    const AddedToken* best = nullptr;
    size_t best_end = 0;
    for (size_t j = i; j < n; ++j) {
      auto it = nodes_[node].next.find(static_cast<unsigned char>(text[j]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].token) {
        best = nodes_[node].token;
        best_end = j + 1;
      }
    }
    if (!best) {
      ++i;
      continue;
    }
    size_t start = i, stop = best_end;
    i = best_end;  // non-overlapping, as the automaton's iterator
    if (best->single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == n || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (best->lstrip) {
      size_t newstart = start;
      while (newstart > 0) {
        size_t k = newstart - 1;
        while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        size_t kk = k;
        if (!is_whitespace(utf8_next(text, kk))) break;
        newstart = k;
      }
      start = std::max(newstart, start_offset);
    }
    if (best->rstrip) {
      size_t k = stop;
      while (k < n) {
        size_t kk = k;
        if (!is_whitespace(utf8_next(text, kk))) break;
        k = kk;
      }
      stop = k;
      i = std::max(i, stop);
    }
    if (start_offset < start) out.push_back({nullptr, {start_offset, start}});
    out.push_back({best, {start, stop}});
    start_offset = stop;
  }
  if (start_offset != n || n == 0) out.push_back({nullptr, {start_offset, n}});
  return out;
}

}  // namespace veloxquant::runtime::tok
