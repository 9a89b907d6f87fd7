// tiny_checkpoint.cpp — see tiny_checkpoint.h.
#include "tiny_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "veloxquant/dtype.h"
#include "veloxquant/error.h"
#include "veloxquant/safetensors.h"

namespace vqtest {

using nlohmann::ordered_json;
using veloxquant::DType;

std::vector<TinySpec> tiny_specs() {
  std::vector<TinySpec> v;
  {
    TinySpec s;  // Llama-3 style: llama3 rope scaling, untied head, bf16, two shards.
    s.name = "tiny-llama";
    s.architecture = "LlamaForCausalLM";
    s.model_type = "llama";
    s.hidden = 64, s.intermediate = 96, s.n_heads = 4, s.n_kv_heads = 2;
    s.rope_theta = 10000.0;
    s.rope_scaling_json =
        R"({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32, "rope_type": "llama3"})";
    s.dtype = "bfloat16";
    s.n_shards = 2;
    s.seed = 11;
    v.push_back(s);
  }
  {
    TinySpec s;  // Qwen2 style: q/k/v biases, tied embeddings, linear rope scaling, f32.
    s.name = "tiny-qwen2";
    s.architecture = "Qwen2ForCausalLM";
    s.model_type = "qwen2";
    s.hidden = 32, s.intermediate = 64, s.n_heads = 4, s.n_kv_heads = 2;
    s.rope_theta = 1000000.0;
    s.rope_scaling_json = R"({"factor": 2.0, "rope_type": "linear"})";
    s.tied = true;
    s.qkv_bias = true;
    s.dtype = "float32";
    s.add_bos = false;
    s.seed = 22;
    v.push_back(s);
  }
  {
    TinySpec s;  // Qwen3 style: q/k norms, head_dim != hidden / heads, yarn, f16, tied.
    s.name = "tiny-qwen3";
    s.architecture = "Qwen3ForCausalLM";
    s.model_type = "qwen3";
    s.hidden = 64, s.intermediate = 64, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 32;
    s.rope_theta = 1000000.0;
    // max_position_embeddings / original = factor, so every reading of yarn's factor agrees.
    s.rope_scaling_json = R"({"factor": 4.0, "original_max_position_embeddings": 64, "rope_type": "yarn"})";
    s.max_position_embeddings = 256;
    s.tied = true;
    s.qk_norm = true;
    s.dtype = "float16";
    s.add_bos = false;
    s.seed = 33;
    v.push_back(s);
  }
  {
    TinySpec s;  // Mistral style: sliding window shorter than the test sequences, GQA 4:1.
    s.name = "tiny-mistral";
    s.architecture = "MistralForCausalLM";
    s.model_type = "mistral";
    s.hidden = 32, s.intermediate = 64, s.n_heads = 4, s.n_kv_heads = 1;
    s.rope_theta = 10000.0;
    s.sliding_window = 7;
    s.dtype = "bfloat16";
    s.seed = 44;
    v.push_back(s);
  }
  return v;
}

namespace {

// ---- deterministic random numbers (platform independent) ----------------------------------
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {  // Box–Muller, one value per call (two draws)
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }
  /// The generator as it will be after n more draws (splitmix64's state only counts draws).
  Rng skipped(uint64_t n) const {
    Rng r = *this;
    r.s += n * 0x9E3779B97F4A7C15ull;
    return r;
  }
};

unsigned g_writer_threads = 0;  // set_tiny_writer_threads (0: hardware_concurrency)

/// fn(begin, end) over [0, n) in contiguous chunks on up to g_writer_threads threads (one below
/// 2^20 items). The large presets of bench_runtime_decode (~0.4 G values) are written in seconds
/// on the GPU machine's 16 cores instead of ~17 s; chunking never changes a value.

template <typename Fn>
void parallel_chunks(size_t n, Fn&& fn) {
  const unsigned want = g_writer_threads ? g_writer_threads : std::thread::hardware_concurrency();
  const size_t threads = n < (size_t(1) << 20) ? 1 : std::clamp<size_t>(want, 1, 32);
  if (threads == 1) {
    fn(size_t(0), n);
    return;
  }
  std::vector<std::thread> pool;
  const size_t per = (n + threads - 1) / threads;
  for (size_t b = 0; b < n; b += per) pool.emplace_back([&fn, b, e = std::min(n, b + per)] { fn(b, e); });
  for (auto& t : pool) t.join();
}

// ---- the byte-level BPE tokenizer ----------------------------------------------------------
// GPT-2's byte <-> printable-unicode map.
std::vector<std::string> byte_symbols() {
  std::vector<int> cps(256, -1);
  for (int b = 0; b < 256; ++b)
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) cps[b] = b;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (cps[b] < 0) cps[b] = 256 + n++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const int cp = cps[b];
    std::string s;
    if (cp < 0x80) {
      s += char(cp);
    } else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
    out[b] = s;
  }
  return out;
}

const char* kCorpus =
    "the cache holds the keys and the values of every token that the model has seen so far. "
    "when the context grows the cache grows with it, and at some length it is larger than the "
    "weights themselves. quantizing the keys and the values lets a longer context fit in the "
    "same memory, and reading fewer bytes makes each decoding step faster. the keys have a few "
    "channels with large values; scaling them and then rotating them spreads those values out, "
    "so that one shared codebook can represent the rotated vectors well. then the attention "
    "scores are computed from tables of dot products between the query and the codebook.";

struct Bpe {
  std::vector<std::string> vocab;                        // id -> token string
  std::vector<std::pair<std::string, std::string>> merges;
};

Bpe train_bpe() {
  const auto sym = byte_symbols();
  Bpe bpe;
  for (int b = 0; b < 256; ++b) bpe.vocab.push_back(sym[b]);
  // Words: split on spaces, a word after a space carries the space (like GPT-2's pre-tokenizer).
  std::vector<std::vector<std::string>> words;
  std::string text = kCorpus;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i + 1;
    while (j < text.size() && text[j] != ' ') ++j;
    std::vector<std::string> w;
    for (size_t k = i; k < j; ++k) w.push_back(sym[uint8_t(text[k])]);
    words.push_back(w);
    i = j;
  }
  for (int m = 0; m < kTinyMerges; ++m) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& w : words)
      for (size_t k = 0; k + 1 < w.size(); ++k) ++counts[{w[k], w[k + 1]}];
    std::pair<std::string, std::string> best;
    int best_n = 0;
    for (const auto& [p, c] : counts)  // map order: ties go to the smallest pair
      if (c > best_n) best = p, best_n = c;
    if (best_n == 0) break;
    bpe.merges.push_back(best);
    const std::string merged = best.first + best.second;
    bpe.vocab.push_back(merged);
    for (auto& w : words) {
      std::vector<std::string> nw;
      for (size_t k = 0; k < w.size(); ++k) {
        if (k + 1 < w.size() && w[k] == best.first && w[k + 1] == best.second) {
          nw.push_back(merged);
          ++k;
        } else {
          nw.push_back(w[k]);
        }
      }
      w = std::move(nw);
    }
  }
  VQ_CHECK_VALUE(int(bpe.merges.size()) == kTinyMerges, "tiny tokenizer: corpus too small for the merges");
  return bpe;
}

ordered_json tokenizer_json(bool add_bos) {
  const Bpe bpe = train_bpe();
  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < bpe.vocab.size(); ++id) vocab[bpe.vocab[id]] = id;
  ordered_json merges = ordered_json::array();
  for (const auto& [a, b] : bpe.merges) merges.push_back(a + " " + b);
  auto added = [](int id, const char* content) {
    return ordered_json{{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
                        {"rstrip", false},  {"normalized", false}, {"special", true}};
  };
  ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = ordered_json::array({added(kTinyBos, "<|bos|>"), added(kTinyEos, "<|eos|>")});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  if (add_bos) {
    auto special = [](int type_id) { return ordered_json{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", type_id}}}}; };
    auto seq = [](const char* id, int type_id) { return ordered_json{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
    j["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", ordered_json::array({special(0), seq("A", 0)})},
        {"pair", ordered_json::array({special(0), seq("A", 0), special(1), seq("B", 1)})},
        {"special_tokens", {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {kTinyBos}}, {"tokens", {"<|bos|>"}}}}}}};
  } else {
    j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}};
  }
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  return j;
}

// ---- weights -------------------------------------------------------------------------------
struct Param {
  std::string name;
  veloxquant::Shape shape;
  std::vector<float> values;
};

void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  if (!f) VQ_THROW(IoError, "cannot write " << p.string());
  f << s;
}

}  // namespace

unsigned set_tiny_writer_threads(unsigned n) {
  const unsigned prev = g_writer_threads;
  g_writer_threads = n;
  return prev;
}

void write_tiny_checkpoint(const TinySpec& s, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const int hd = s.head_dim > 0 ? s.head_dim : s.hidden / s.n_heads;
  Rng rng(s.seed);
  std::vector<Param> params;
  auto normal = [&](const std::string& name, veloxquant::Shape shape, double stddev, double mean = 0.0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    Param p{name, shape, std::vector<float>(size_t(n))};
    // value k is the k-th normal of one stream (two draws each), whichever thread computes it
    parallel_chunks(p.values.size(), [&](size_t b, size_t e) {
      Rng r = rng.skipped(2 * b);
      for (size_t k = b; k < e; ++k) p.values[k] = float(mean + stddev * r.normal());
    });
    rng = rng.skipped(2 * p.values.size());
    params.push_back(std::move(p));
  };
  const int H = s.hidden, I = s.intermediate, V = kTinyVocab;
  // Tied: a small embedding scale keeps the logits from being dominated by e_t·e_t (which
  // makes greedy decoding repeat the last token and the decode test weak).
  normal("model.embed_tokens.weight", {V, H}, s.tied ? 0.1 : 1.0);
  if (s.poison_token >= 0 && s.poison_token < V)
    std::fill_n(params.back().values.begin() + int64_t(s.poison_token) * H, H, std::numeric_limits<float>::infinity());
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    normal(p + "input_layernorm.weight", {H}, 0.1, 1.0);
    normal(p + "self_attn.q_proj.weight", {s.n_heads * hd, H}, 1.0 / std::sqrt(double(H)));
    normal(p + "self_attn.k_proj.weight", {s.n_kv_heads * hd, H}, 1.0 / std::sqrt(double(H)));
    normal(p + "self_attn.v_proj.weight", {s.n_kv_heads * hd, H}, 1.0 / std::sqrt(double(H)));
    if (s.qkv_bias) {
      normal(p + "self_attn.q_proj.bias", {s.n_heads * hd}, 0.5);
      normal(p + "self_attn.k_proj.bias", {s.n_kv_heads * hd}, 0.5);
      normal(p + "self_attn.v_proj.bias", {s.n_kv_heads * hd}, 0.5);
    }
    if (s.qk_norm) {
      normal(p + "self_attn.q_norm.weight", {hd}, 0.1, 1.0);
      normal(p + "self_attn.k_norm.weight", {hd}, 0.1, 1.0);
    }
    normal(p + "self_attn.o_proj.weight", {H, s.n_heads * hd}, 1.0 / std::sqrt(double(s.n_heads * hd)));
    normal(p + "post_attention_layernorm.weight", {H}, 0.1, 1.0);
    normal(p + "mlp.gate_proj.weight", {I, H}, 1.0 / std::sqrt(double(H)));
    normal(p + "mlp.up_proj.weight", {I, H}, 1.0 / std::sqrt(double(H)));
    normal(p + "mlp.down_proj.weight", {H, I}, 1.0 / std::sqrt(double(I)));
  }
  normal("model.norm.weight", {H}, 0.1, 1.0);
  if (!s.tied) normal("lm_head.weight", {V, H}, 1.0 / std::sqrt(double(H)));

  // Store in the checkpoint dtype (k_proj_dtype: the k projections in another).
  auto dtype_of = [](const std::string& n) { return n == "float32" ? DType::F32 : n == "float16" ? DType::F16 : DType::BF16; };
  std::vector<std::vector<uint8_t>> storage(params.size());
  std::vector<veloxquant::NamedTensor> named;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const bool k_proj = !s.k_proj_dtype.empty() && p.name.find("self_attn.k_proj.weight") != std::string::npos;
    const DType dt = dtype_of(k_proj ? s.k_proj_dtype : s.dtype);
    auto& buf = storage[i];
    buf.resize(p.values.size() * size_t(veloxquant::dtype_size(dt)));
    parallel_chunks(p.values.size(), [&](size_t b, size_t e) {
      for (size_t k = b; k < e; ++k) {
        if (dt == DType::F32) {
          std::memcpy(buf.data() + 4 * k, &p.values[k], 4);
        } else {
          const uint16_t h =
              dt == DType::F16 ? veloxquant::float_to_half(p.values[k]) : veloxquant::float_to_bf16(p.values[k]);
          std::memcpy(buf.data() + 2 * k, &h, 2);
        }
      }
    });
    named.emplace_back(p.name, veloxquant::TensorView(buf.data(), dt, p.shape));
  }
  const std::map<std::string, std::string> st_meta{{"format", "pt"}};
  if (s.n_shards <= 1) {
    veloxquant::save_safetensors((dir / "model.safetensors").string(), named, st_meta);
  } else {
    // Contiguous runs of tensors per shard.
    ordered_json weight_map = ordered_json::object();
    uint64_t total = 0;
    const size_t per = (named.size() + size_t(s.n_shards) - 1) / size_t(s.n_shards);
    for (int sh = 0; sh < s.n_shards; ++sh) {
      char fname[64];
      std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, s.n_shards);
      std::vector<veloxquant::NamedTensor> part;
      for (size_t i = size_t(sh) * per; i < std::min(named.size(), size_t(sh + 1) * per); ++i) {
        part.push_back(named[i]);
        total += uint64_t(named[i].second.nbytes());
      }
      veloxquant::save_safetensors((dir / fname).string(), part, st_meta);
      for (const auto& [n, t] : part) weight_map[n] = fname;
    }
    ordered_json idx;
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = weight_map;
    write_text(dir / "model.safetensors.index.json", idx.dump(2) + "\n");
  }

  // config.json
  ordered_json c;
  c["architectures"] = {s.architecture};
  c["model_type"] = s.model_type;
  c["hidden_size"] = H;
  c["intermediate_size"] = I;
  c["num_hidden_layers"] = s.n_layers;
  c["num_attention_heads"] = s.n_heads;
  c["num_key_value_heads"] = s.n_kv_heads;
  if (s.head_dim > 0) c["head_dim"] = s.head_dim;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = s.max_position_embeddings;
  c["rms_norm_eps"] = 1e-6;
  c["rope_theta"] = s.rope_theta;
  c["rope_scaling"] = s.rope_scaling_json.empty() ? ordered_json(nullptr) : ordered_json::parse(s.rope_scaling_json);
  c["tie_word_embeddings"] = s.tied;
  c["vocab_size"] = V;
  c["torch_dtype"] = s.dtype;
  c["bos_token_id"] = kTinyBos;
  c["eos_token_id"] = kTinyEos;
  c["attention_dropout"] = 0.0;
  if (s.model_type == "llama") {
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
  }
  if (s.model_type == "qwen3") c["attention_bias"] = false;
  if (s.model_type == "qwen2" || s.model_type == "qwen3") {
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = s.n_layers;
  }
  if (s.model_type == "mistral") c["sliding_window"] = s.sliding_window > 0 ? ordered_json(s.sliding_window) : ordered_json(nullptr);
  c["use_cache"] = true;
  write_text(dir / "config.json", c.dump(2) + "\n");

  ordered_json g;
  g["bos_token_id"] = kTinyBos;
  g["eos_token_id"] = kTinyEos;
  g["do_sample"] = false;
  write_text(dir / "generation_config.json", g.dump(2) + "\n");

  write_text(dir / "tokenizer.json", tokenizer_json(s.add_bos).dump(1) + "\n");
  ordered_json tc;
  tc["bos_token"] = "<|bos|>";
  tc["eos_token"] = "<|eos|>";
  tc["add_bos_token"] = s.add_bos;
  tc["tokenizer_class"] = "PreTrainedTokenizerFast";
  write_text(dir / "tokenizer_config.json", tc.dump(2) + "\n");
}

}  // namespace vqtest
