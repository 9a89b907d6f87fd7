// src/runtime/tokenizer.cpp — loading tokenizer.json / tokenizer_config.json into the pipeline
// components of tokenizer_impl.h, the encode/decode drivers, and StreamDecoder.
//
// Loading validates everything it uses and rejects, with a FormatError naming the component,
// whatever it does not implement (other model types, normalizers, pre-tokenizers, decoders,
// post-processors, dropout), so an unsupported file never tokenizes silently wrong.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "runtime/tokenizer_impl.h"
#include "veloxquant/error.h"

namespace veloxquant::runtime {

using nlohmann::json;
using namespace tok;

namespace {

std::string read_file(const std::filesystem::path& p, const char* what) {
  std::ifstream f(p, std::ios::binary);
  if (!f) VQ_THROW(IoError, what << ": cannot open '" << p.string() << "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) VQ_THROW(IoError, what << ": error reading '" << p.string() << "'");
  return ss.str();
}

std::string type_of(const json& j, const std::string& where) {
  VQ_CHECK_FORMAT(j.is_object(), "tokenizer.json: " << where << " must be an object");
  auto it = j.find("type");
  VQ_CHECK_FORMAT(it != j.end() && it->is_string(), "tokenizer.json: " << where << " has no string 'type'");
  return it->get<std::string>();
}

std::string get_string(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  VQ_CHECK_FORMAT(it != j.end() && it->is_string(), "tokenizer.json: " << where << "." << key << " must be a string");
  return it->get<std::string>();
}

bool get_bool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  VQ_CHECK_FORMAT(it->is_boolean(), "tokenizer.json: '" << key << "' must be a boolean");
  return it->get<bool>();
}

// Ids index dense tables here (and an embedding matrix in the model): 2^24 ids, 100x the largest
// vocabularies in use (~256K), keeps a hostile file's "id": 2000000000 from asking for 64 GB.
constexpr int64_t kMaxTokenIds = int64_t(1) << 24;

// v as an integer in [0, end): a JSON integer, not a float (nlohmann's get<int> converts 1e91
// with undefined behaviour; found by fuzz_tokenizer_json), FormatError naming `where` otherwise.
int64_t get_index(const json& v, int64_t end, const std::string& where) {
  const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(end)
                                         : v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < end;
  VQ_CHECK_FORMAT(ok, "tokenizer.json: " << where << " must be an integer in [0, " << end << "), got " << v.dump());
  return v.get<int64_t>();
}

// {"String": "..."} or {"Regex": "..."} → literal or compiled regex.
void parse_pattern(const json& j, const std::string& where, std::string& literal, std::shared_ptr<Regex>& regex) {
  VQ_CHECK_FORMAT(j.is_object(), "tokenizer.json: " << where << ".pattern must be an object");
  if (auto s = j.find("String"); s != j.end() && s->is_string()) {
    literal = s->get<std::string>();
  } else if (auto r = j.find("Regex"); r != j.end() && r->is_string()) {
    regex = std::make_shared<Regex>(r->get<std::string>(), where);
  } else {
    VQ_THROW(FormatError, "tokenizer.json: " << where << ".pattern must hold 'String' or 'Regex'");
  }
}

Normalizer parse_normalizer(const json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  Normalizer n;
  if (type == "Sequence") {
    n.kind = Normalizer::Kind::Sequence;
    const json& list = j.at("normalizers");
    VQ_CHECK_FORMAT(list.is_array(), "tokenizer.json: " << where << ".normalizers must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      n.children.push_back(parse_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]"));
  } else if (type == "NFC") {
    n.kind = Normalizer::Kind::NFC;
  } else if (type == "NFD") {
    n.kind = Normalizer::Kind::NFD;
  } else if (type == "NFKC") {
    n.kind = Normalizer::Kind::NFKC;
  } else if (type == "NFKD") {
    n.kind = Normalizer::Kind::NFKD;
  } else if (type == "Prepend") {
    n.kind = Normalizer::Kind::Prepend;
    n.str = get_string(j, "prepend", where);
  } else if (type == "Replace") {
    n.kind = Normalizer::Kind::Replace;
    parse_pattern(j.at("pattern"), where, n.str, n.regex);
    n.content = get_string(j, "content", where);
  } else if (type == "Lowercase") {
    n.kind = Normalizer::Kind::Lowercase;
  } else if (type == "Strip") {
    n.kind = Normalizer::Kind::Strip;
    n.strip_left = get_bool(j, "strip_left", true);
    n.strip_right = get_bool(j, "strip_right", true);
  } else {
    VQ_THROW(FormatError, "tokenizer.json: " << where << ".type '" << type << "' is not supported");
  }
  return n;
}

// The pattern the ByteLevel pre-tokenizer uses when use_regex is true (GPT-2's).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

PreTokenizer::Prepend parse_prepend_scheme(const json& j, const std::string& where) {
  if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "always") return PreTokenizer::Prepend::Always;
    if (s == "first") return PreTokenizer::Prepend::First;
    if (s == "never") return PreTokenizer::Prepend::Never;
    VQ_THROW(FormatError, "tokenizer.json: " << where << ".prepend_scheme '" << s << "' is not supported");
  }
  // Older files: add_prefix_space true/false.
  return get_bool(j, "add_prefix_space", true) ? PreTokenizer::Prepend::Always : PreTokenizer::Prepend::Never;
}

PreTokenizer parse_pre_tokenizer(const json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  PreTokenizer p;
  if (type == "Sequence") {
    p.kind = PreTokenizer::Kind::Sequence;
    const json& list = j.at("pretokenizers");
    VQ_CHECK_FORMAT(list.is_array(), "tokenizer.json: " << where << ".pretokenizers must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      p.children.push_back(parse_pre_tokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]"));
  } else if (type == "Split") {
    p.kind = PreTokenizer::Kind::Split;
    parse_pattern(j.at("pattern"), where, p.literal, p.regex);
    const std::string b = get_string(j, "behavior", where);
    if (b == "Removed") p.behavior = SplitBehavior::Removed;
    else if (b == "Isolated") p.behavior = SplitBehavior::Isolated;
    else if (b == "MergedWithPrevious") p.behavior = SplitBehavior::MergedWithPrevious;
    else if (b == "MergedWithNext") p.behavior = SplitBehavior::MergedWithNext;
    else if (b == "Contiguous") p.behavior = SplitBehavior::Contiguous;
    else VQ_THROW(FormatError, "tokenizer.json: " << where << ".behavior '" << b << "' is not supported");
    p.invert = get_bool(j, "invert", false);
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::Kind::ByteLevel;
    p.add_prefix_space = get_bool(j, "add_prefix_space", true);
    if (get_bool(j, "use_regex", true)) p.regex = std::make_shared<Regex>(kGpt2Pattern, where);
  } else if (type == "Metaspace") {
    p.kind = PreTokenizer::Kind::Metaspace;
    p.replacement = get_string(j, "replacement", where);
    p.prepend = parse_prepend_scheme(j, where);
    p.split = get_bool(j, "split", true);
  } else if (type == "Digits") {
    p.kind = PreTokenizer::Kind::Digits;
    p.individual_digits = get_bool(j, "individual_digits", false);
  } else {
    VQ_THROW(FormatError, "tokenizer.json: " << where << ".type '" << type << "' is not supported");
  }
  return p;
}

Decoder parse_decoder(const json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  Decoder d;
  if (type == "Sequence") {
    d.kind = Decoder::Kind::Sequence;
    const json& list = j.at("decoders");
    VQ_CHECK_FORMAT(list.is_array(), "tokenizer.json: " << where << ".decoders must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      d.children.push_back(parse_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]"));
  } else if (type == "ByteLevel") {
    d.kind = Decoder::Kind::ByteLevel;
  } else if (type == "Replace") {
    d.kind = Decoder::Kind::Replace;
    parse_pattern(j.at("pattern"), where, d.pattern, d.regex);
    d.content = get_string(j, "content", where);
  } else if (type == "ByteFallback") {
    d.kind = Decoder::Kind::ByteFallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::Kind::Fuse;
  } else if (type == "Strip") {
    d.kind = Decoder::Kind::Strip;
    d.content = get_string(j, "content", where);
    d.strip_start = size_t(get_index(j.at("start"), int64_t(1) << 31, where + ".start"));
    d.strip_stop = size_t(get_index(j.at("stop"), int64_t(1) << 31, where + ".stop"));
  } else if (type == "Metaspace") {
    d.kind = Decoder::Kind::Metaspace;
    d.replacement = get_string(j, "replacement", where);
    d.metaspace_strip_first = parse_prepend_scheme(j, where) != PreTokenizer::Prepend::Never;
  } else {
    VQ_THROW(FormatError, "tokenizer.json: " << where << ".type '" << type << "' is not supported");
  }
  return d;
}

void parse_post_processor(const json& j, const std::string& where, const Tokenizer::Impl& impl, PostProcessor& pp) {
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    const json& list = j.at("processors");
    VQ_CHECK_FORMAT(list.is_array(), "tokenizer.json: " << where << ".processors must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_post_processor(list[i], where + ".processors[" + std::to_string(i) + "]", impl, pp);
  } else if (type == "ByteLevel") {
    // offsets only
  } else if (type == "TemplateProcessing") {
    const json& single = j.at("single");
    const json& specials = j.at("special_tokens");
    VQ_CHECK_FORMAT(single.is_array(), "tokenizer.json: " << where << ".single must be an array");
    PostProcessor t;
    bool seen_a = false;
    for (const json& item : single) {
      if (auto s = item.find("SpecialToken"); s != item.end()) {
        const std::string name = get_string(*s, "id", where + ".single");
        auto sp = specials.find(name);
        VQ_CHECK_FORMAT(sp != specials.end(),
                        "tokenizer.json: " << where << ": special token '" << name << "' missing from special_tokens");
        for (const json& id : sp->at("ids"))
          (seen_a ? t.suffix : t.prefix).push_back(int32_t(get_index(id, kMaxTokenIds, where + ": special token '" + name + "'")));
      } else if (auto q = item.find("Sequence"); q != item.end()) {
        VQ_CHECK_FORMAT(get_string(*q, "id", where + ".single") == "A" && !seen_a,
                        "tokenizer.json: " << where << ".single must hold sequence A exactly once");
        seen_a = true;
      } else {
        VQ_THROW(FormatError, "tokenizer.json: " << where << ".single holds an unknown item");
      }
    }
    VQ_CHECK_FORMAT(seen_a, "tokenizer.json: " << where << ".single has no sequence A");
    // A later processor in a Sequence wraps the result of the earlier ones.
    pp.prefix.insert(pp.prefix.begin(), t.prefix.begin(), t.prefix.end());
    pp.suffix.insert(pp.suffix.end(), t.suffix.begin(), t.suffix.end());
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    const json& cls = j.at("cls");
    const json& sep = j.at("sep");
    pp.prefix.insert(pp.prefix.begin(), int32_t(get_index(cls.at(1), kMaxTokenIds, where + ".cls")));
    pp.suffix.push_back(int32_t(get_index(sep.at(1), kMaxTokenIds, where + ".sep")));
  } else {
    VQ_THROW(FormatError, "tokenizer.json: " << where << ".type '" << type << "' is not supported");
  }
}

void parse_bpe(const json& m, Bpe& bpe) {
  if (auto d = m.find("dropout"); d != m.end() && !d->is_null())
    VQ_CHECK_FORMAT(d->get<double>() == 0.0, "tokenizer.json: model.dropout " << d->get<double>() << " is not supported");
  const json& vocab = m.at("vocab");
  VQ_CHECK_FORMAT(vocab.is_object(), "tokenizer.json: model.vocab must be an object");
  bpe.vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    bpe.vocab.emplace(it.key(), int32_t(get_index(it.value(), kMaxTokenIds, "model.vocab['" + it.key() + "']")));
  }
  const auto str_or = [&](const char* key) {
    auto it = m.find(key);
    return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  bpe.continuing_subword_prefix = str_or("continuing_subword_prefix");
  bpe.end_of_word_suffix = str_or("end_of_word_suffix");
  if (auto u = m.find("unk_token"); u != m.end() && u->is_string()) {
    auto it = bpe.vocab.find(u->get<std::string>());
    VQ_CHECK_FORMAT(it != bpe.vocab.end(),
                    "tokenizer.json: model.unk_token '" << u->get<std::string>() << "' is not in the vocabulary");
    bpe.unk_id = it->second;
  }
  bpe.fuse_unk = get_bool(m, "fuse_unk", false);
  bpe.byte_fallback = get_bool(m, "byte_fallback", false);
  bpe.ignore_merges = get_bool(m, "ignore_merges", false);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = bpe.vocab.find(name);
    bpe.byte_ids[b] = it == bpe.vocab.end() ? -1 : it->second;
  }
  const json& merges = m.at("merges");
  VQ_CHECK_FORMAT(merges.is_array(), "tokenizer.json: model.merges must be an array");
  bpe.merges.reserve(merges.size());
  const size_t plen = bpe.continuing_subword_prefix.size();
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      VQ_CHECK_FORMAT(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                      "tokenizer.json: model.merges[" << r << "] '" << s << "' is not 'a b'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      VQ_CHECK_FORMAT(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                      "tokenizer.json: model.merges[" << r << "] must be 'a b' or [a, b]");
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    auto ia = bpe.vocab.find(a), ib = bpe.vocab.find(b);
    const std::string merged = a + (plen && b.compare(0, plen, bpe.continuing_subword_prefix) == 0 ? b.substr(plen) : b);
    auto im = bpe.vocab.find(merged);
    VQ_CHECK_FORMAT(ia != bpe.vocab.end() && ib != bpe.vocab.end() && im != bpe.vocab.end(),
                    "tokenizer.json: model.merges[" << r << "] ('" << a << "', '" << b
                                                    << "') uses a token missing from the vocabulary");
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second);
    bpe.merges.insert_or_assign(key, std::make_pair(static_cast<int32_t>(r), im->second));
  }
}

// tokenizer_config.json names tokens as a string or {"content": ...}.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object())
    if (auto c = it->find("content"); c != it->end() && c->is_string()) return c->get<std::string>();
  VQ_THROW(FormatError, "tokenizer_config.json: '" << key << "' must be a string or an object with 'content'");
}

// Registers the file's added tokens as the reference does when it loads a tokenizer.json:
// the ids written in the file are not used; a token whose content is in the model vocabulary
// takes that id, any other the next id past the model vocabulary (its entry count) and the
// added ids so far. Tokens equal in every field to an earlier one are ignored. Matching uses
// the special tokens first, then the others (leftmost-longest; the first of equal patterns
// wins), and a normalized token is matched by its content passed through the normalizer.
void register_added_tokens(Tokenizer::Impl& impl, std::vector<AddedToken> file_added) {
  const auto model_id = [&](const std::string& c) -> std::optional<int32_t> {
    auto it = impl.model.vocab.find(c);
    return it == impl.model.vocab.end() ? std::nullopt : std::optional<int32_t>(it->second);
  };
  const int32_t model_size = static_cast<int32_t>(impl.model.vocab.size());
  std::vector<AddedToken> specials, others;
  const auto same = [](const AddedToken& a, const AddedToken& b) {
    return a.content == b.content && a.special == b.special && a.lstrip == b.lstrip && a.rstrip == b.rstrip &&
           a.single_word == b.single_word && a.normalized == b.normalized;
  };
  std::unordered_map<int32_t, AddedToken> by_id;
  for (AddedToken& t : file_added)
    if (t.special && !t.content.empty() && !impl.special_contents.count(t.content)) {
      impl.special_contents.insert(t.content);
      specials.push_back(t);
    }
  for (AddedToken& t : file_added) {
    if (t.content.empty()) continue;
    bool dup = false;
    for (const auto& [id, e] : by_id) dup |= same(e, t);
    if (dup) continue;
    int32_t id;
    if (auto a = impl.added_content_to_id.find(t.content); a != impl.added_content_to_id.end()) {
      id = a->second;
    } else if (auto m = model_id(t.content)) {
      id = *m;
    } else {
      id = model_size;
      bool any = false;
      int32_t max_id = 0;
      for (const auto& [c, i] : impl.added_content_to_id) {
        max_id = any ? std::max(max_id, i) : i;
        any = true;
      }
      if (any && max_id >= model_size) id = max_id + 1;
    }
    impl.added_content_to_id[t.content] = id;
    t.id = id;
    by_id[id] = t;
    if (!impl.special_contents.count(t.content)) others.push_back(t);
  }
  for (const auto& [id, t] : by_id) impl.added_id_to_content[id] = t.content;
  impl.added.clear();
  for (auto* list : {&specials, &others})
    for (AddedToken& t : *list) {
      t.id = impl.added_content_to_id.at(t.content);
      impl.added.push_back(t);
    }
  std::vector<std::pair<std::string, const AddedToken*>> raw, norm;
  for (const AddedToken& t : impl.added) {
    if (t.normalized) {
      std::string pattern = t.content;
      if (impl.normalizer) impl.normalizer->apply(pattern);
      norm.emplace_back(std::move(pattern), &t);
    } else {
      raw.emplace_back(t.content, &t);
    }
  }
  impl.raw_matcher.build(raw);
  impl.normalized_matcher.build(norm);
}

}  // namespace

// ---- loading -------------------------------------------------------------------------------------
Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  json j;
  try {
    j = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    VQ_THROW(FormatError, "tokenizer.json: not valid JSON: " << e.what());
  }
  json cfg = json::object();
  if (!tokenizer_config_json.empty()) {
    try {
      cfg = json::parse(tokenizer_config_json);
    } catch (const json::exception& e) {
      VQ_THROW(FormatError, "tokenizer_config.json: not valid JSON: " << e.what());
    }
    VQ_CHECK_FORMAT(cfg.is_object(), "tokenizer_config.json: must be a JSON object");
  }
  VQ_CHECK_FORMAT(j.is_object(), "tokenizer.json: must be a JSON object");

  auto impl = std::make_shared<Impl>();
  try {
    // Model.
    const json& m = j.at("model");
    VQ_CHECK_FORMAT(m.is_object(), "tokenizer.json: model must be an object");
    std::string mtype = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>()
                                                                     : (m.contains("merges") ? "BPE" : "?");
    VQ_CHECK_FORMAT(mtype == "BPE", "tokenizer.json: model.type '" << mtype << "' is not supported");
    parse_bpe(m, impl->model);

    // Added tokens: parsed here, registered after the normalizer is known (below).
    std::vector<AddedToken> file_added;
    if (auto at = j.find("added_tokens"); at != j.end() && !at->is_null()) {
      VQ_CHECK_FORMAT(at->is_array(), "tokenizer.json: added_tokens must be an array");
      for (const json& a : *at) {
        AddedToken t;
        t.id = int32_t(get_index(a.at("id"), kMaxTokenIds, "added token id"));
        t.content = a.at("content").get<std::string>();
        t.special = get_bool(a, "special", false);
        t.lstrip = get_bool(a, "lstrip", false);
        t.rstrip = get_bool(a, "rstrip", false);
        t.single_word = get_bool(a, "single_word", false);
        t.normalized = get_bool(a, "normalized", !t.special);
        file_added.push_back(std::move(t));
      }
    }

    // Pipeline.
    if (auto n = j.find("normalizer"); n != j.end() && !n->is_null())
      impl->normalizer = parse_normalizer(*n, "normalizer");
    if (auto p = j.find("pre_tokenizer"); p != j.end() && !p->is_null())
      impl->pre_tokenizer = parse_pre_tokenizer(*p, "pre_tokenizer");
    if (auto d = j.find("decoder"); d != j.end() && !d->is_null()) impl->decoder = parse_decoder(*d, "decoder");
    if (auto p = j.find("post_processor"); p != j.end() && !p->is_null()) {
      PostProcessor pp;
      parse_post_processor(*p, "post_processor", *impl, pp);
      impl->post_processor = std::move(pp);
    }
    register_added_tokens(*impl, std::move(file_added));
    if (auto t = j.find("truncation"); t != j.end() && !t->is_null())
      VQ_THROW(FormatError, "tokenizer.json: truncation is not supported (set it to null)");
    if (auto p = j.find("padding"); p != j.end() && !p->is_null())
      VQ_THROW(FormatError, "tokenizer.json: padding is not supported (set it to null)");
  } catch (const json::exception& e) {
    VQ_THROW(FormatError, "tokenizer.json: unexpected structure: " << e.what());
  }

  // Id tables.
  int32_t max_id = -1;
  for (const auto& [tokstr, id] : impl->model.vocab) max_id = std::max(max_id, id);
  for (const auto& a : impl->added) max_id = std::max(max_id, a.id);
  // the id tables below are dense: a file must not make them hold billions of entries
  VQ_CHECK_FORMAT(max_id < kMaxTokenIds, "tokenizer.json: token id " << max_id << " is past the " << kMaxTokenIds
                                                                      << " ids a tokenizer may have");
  impl->vocab_size = max_id + 1;
  impl->id_to_token.assign(static_cast<size_t>(impl->vocab_size), std::string());
  impl->has_token.assign(static_cast<size_t>(impl->vocab_size), false);
  impl->special.assign(static_cast<size_t>(impl->vocab_size), false);
  for (const auto& [tokstr, id] : impl->model.vocab) {
    impl->id_to_token[id] = tokstr;
    impl->has_token[id] = true;
  }
  for (const auto& [id, content] : impl->added_id_to_content) {  // added tokens win over the model's entry
    impl->id_to_token[id] = content;
    impl->has_token[id] = true;
    impl->special[id] = impl->special_contents.count(content) > 0;
  }

  // Kind name (for describe()).
  const auto has_byte_level = [&] {
    if (!impl->decoder) return false;
    std::vector<const Decoder*> st{&*impl->decoder};
    while (!st.empty()) {
      const Decoder* d = st.back();
      st.pop_back();
      if (d->kind == Decoder::Kind::ByteLevel) return true;
      for (const auto& c : d->children) st.push_back(&c);
    }
    return false;
  };
  impl->kind_name = has_byte_level() ? "byte-level BPE" : impl->model.byte_fallback ? "sentencepiece BPE" : "BPE";

  // Special ids.
  const auto lookup = [&](const std::string& s) { return impl->token_to_id(s); };
  const auto resolve = [&](const char* key) -> std::optional<int32_t> {
    if (auto name = config_token(cfg, key)) {
      auto id = lookup(*name);
      VQ_CHECK_FORMAT(id.has_value(),
                      "tokenizer_config.json: " << key << " '" << *name << "' is not a token of tokenizer.json");
      return id;
    }
    return std::nullopt;
  };
  impl->bos = resolve("bos_token");
  impl->eos = resolve("eos_token");
  impl->pad = resolve("pad_token");
  if (!impl->bos && impl->post_processor && impl->post_processor->prefix.size() == 1)
    impl->bos = impl->post_processor->prefix[0];
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json,
                               const std::filesystem::path& tokenizer_config_json) {
  const std::string text = read_file(tokenizer_json, "tokenizer.json");
  std::string cfg;
  if (!tokenizer_config_json.empty()) {
    cfg = read_file(tokenizer_config_json, "tokenizer_config.json");
  } else {
    const auto sibling = tokenizer_json.parent_path() / "tokenizer_config.json";
    std::error_code ec;
    if (std::filesystem::is_regular_file(sibling, ec)) cfg = read_file(sibling, "tokenizer_config.json");
  }
  return from_json(text, cfg);
}

// ---- encode / decode -----------------------------------------------------------------------------
std::vector<int32_t> Tokenizer::Impl::encode(std::string_view input, bool add_special_tokens) const {
  // The reference works on Rust strings, always valid UTF-8: make ours so too.
  std::string owned;
  bool valid = true;
  for (size_t i = 0; i < input.size();) {
    const int len = utf8_valid_len(input, i);
    if (len == 0) {
      valid = false;
      break;
    }
    i += static_cast<size_t>(len);
  }
  if (!valid) {
    owned = utf8_lossy(input);
    input = owned;
  }

  std::vector<int32_t> ids;
  if (add_special_tokens && post_processor)
    ids.insert(ids.end(), post_processor->prefix.begin(), post_processor->prefix.end());

  std::vector<Piece> pieces;
  const auto run_pieces = [&] {
    if (pieces.empty()) return;
    if (pre_tokenizer) pre_tokenizer->apply(pieces);
    for (const Piece& p : pieces) model.tokenize(p.text, ids);
    pieces.clear();
  };
  const auto segments = raw_matcher.empty()
                            ? std::vector<std::pair<const AddedToken*, std::pair<size_t, size_t>>>{{nullptr, {0, input.size()}}}
                            : raw_matcher.split(input);
  for (const auto& [tok, range] : segments) {
    if (tok) {
      run_pieces();
      ids.push_back(tok->id);
      continue;
    }
    std::string s(input.substr(range.first, range.second - range.first));
    if (normalizer) normalizer->apply(s);
    const bool at_start = range.first == 0;
    // Empty pieces are dropped before pre-tokenization (so e.g. Metaspace never turns ""
    // into "▁"), as the reference filters empty splits.
    if (normalized_matcher.empty()) {
      if (!s.empty()) pieces.push_back(Piece{std::move(s), at_start});
    } else {
      for (const auto& [ntok, nrange] : normalized_matcher.split(s)) {
        if (ntok) {
          run_pieces();
          ids.push_back(ntok->id);
        } else if (nrange.second > nrange.first) {
          pieces.push_back(Piece{s.substr(nrange.first, nrange.second - nrange.first), at_start && nrange.first == 0});
        }
      }
    }
    run_pieces();
  }
  if (add_special_tokens && post_processor)
    ids.insert(ids.end(), post_processor->suffix.begin(), post_processor->suffix.end());
  return ids;
}

std::string Tokenizer::Impl::decode(const int32_t* ids, size_t n, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    VQ_CHECK_VALUE(id >= 0, "decode: ids[" << i << "] = " << id << " is negative");
    if (id >= vocab_size || !has_token[id]) continue;  // no token: nothing, as the reference
    if (skip_special_tokens && special[id]) continue;
    tokens.push_back(id_to_token[id]);
  }
  if (!decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

// ---- public API ----------------------------------------------------------------------------------
std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids.data(), ids.size(), skip_special_tokens);
}

int Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::Impl::token_to_id(const std::string& token) const {
  if (auto it = added_content_to_id.find(token); it != added_content_to_id.end()) return it->second;
  if (auto it = model.vocab.find(token); it != model.vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->token_to_id(std::string(token));
}

std::string Tokenizer::id_to_token(int32_t id) const {
  VQ_CHECK_VALUE(id >= 0 && id < impl_->vocab_size && impl_->has_token[id],
                 "id_to_token: id " << id << " has no token (vocab_size " << impl_->vocab_size << ")");
  return impl_->id_to_token[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id];
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }

bool Tokenizer::adds_bos() const {
  return impl_->post_processor && impl_->bos && !impl_->post_processor->prefix.empty() &&
         impl_->post_processor->prefix.front() == *impl_->bos;
}

std::string Tokenizer::describe() const {
  std::ostringstream ss;
  ss << impl_->kind_name << ", vocab_size " << impl_->vocab_size << " (" << impl_->model.vocab.size() << " model tokens, "
     << impl_->model.merges.size() << " merges, " << impl_->added.size() << " added tokens)";
  return ss.str();
}

// ---- StreamDecoder -------------------------------------------------------------------------------
// As the reference's DecodeStream: keep the ids since the last emitted boundary; decode them
// and emit the text beyond what the context ids (ids_[0, prefix_index_)) already produced,
// unless it ends in U+FFFD (an incomplete character that later byte tokens may complete).
StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  const std::string text = tok_.impl_->decode(ids_.data(), ids_.size(), skip_special_);
  static constexpr std::string_view kRepl = "\xEF\xBF\xBD";
  const bool incomplete = text.size() >= kRepl.size() && text.compare(text.size() - kRepl.size(), kRepl.size(), kRepl) == 0;
  if (text.size() <= prefix_.size() || incomplete) return std::string();
  std::string out;
  if (text.compare(0, prefix_.size(), prefix_) == 0) {
    out = text.substr(prefix_.size());
  } else {
    // The context's text changed (a decoder that is not prefix-stable): emit the tail past the
    // common prefix so nothing is lost.
    size_t k = 0;
    while (k < text.size() && k < prefix_.size() && text[k] == prefix_[k]) ++k;
    out = text.substr(k);
  }
  // The ids decoded so far become the context of the next step: keep them from prefix_index_
  // on (the previous context still shapes how they decode) and remember their text.
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tok_.impl_->decode(ids_.data(), ids_.size(), skip_special_);
  prefix_index_ = new_prefix_index;
  return out;
}

void StreamDecoder::prime(std::span<const int32_t> context_ids) {
  ids_.assign(context_ids.begin(), context_ids.end());
  prefix_ = tok_.impl_->decode(ids_.data(), ids_.size(), skip_special_);
  prefix_index_ = ids_.size();
}

std::string StreamDecoder::flush() {
  const std::string text = tok_.impl_->decode(ids_.data(), ids_.size(), skip_special_);
  std::string out;
  if (text.size() > prefix_.size() && text.compare(0, prefix_.size(), prefix_) == 0) out = text.substr(prefix_.size());
  reset();
  return out;
}

void StreamDecoder::reset() {
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
}

}  // namespace veloxquant::runtime
