// config.cpp — config.json / generation_config.json parsing and the RoPE frequency formulas.
#include "veloxquant/runtime/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "veloxquant/error.h"

namespace veloxquant::runtime {

using nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Mistral: return "mistral";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
  }
  return "?";
}

const char* rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::Default: return "default";
    case RopeType::Linear: return "linear";
    case RopeType::Llama3: return "llama3";
    case RopeType::Yarn: return "yarn";
  }
  return "?";
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) VQ_THROW(IoError, "cannot open " << path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) VQ_THROW(IoError, "cannot read " << path.string());
  return ss.str();
}

namespace {

json parse_json(const std::string& text, const char* what) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) VQ_THROW(FormatError, what << ": expected a JSON object at the top level");
    return j;
  } catch (const json::exception& e) {
    VQ_THROW(FormatError, what << ": malformed JSON: " << e.what());
  }
}

bool present(const json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

// j[key] as T. An integer field takes a JSON integer (or a float with an integral value) inside
// T's range; nlohmann's get<int> would convert 3e24 or 2^40 without a word (the first is
// undefined behaviour; found by fuzz_model_config).
template <class T>
T convert(const json& v, const char* key, const char* what) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    constexpr double lo = double(std::numeric_limits<T>::min()), hi = double(std::numeric_limits<T>::max()) + 1.0;
    bool ok = false;
    T out{};
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      ok = u <= uint64_t(std::numeric_limits<T>::max());
      out = T(u);
    } else if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      ok = x >= int64_t(std::numeric_limits<T>::min()) && uint64_t(std::max<int64_t>(x, 0)) <= uint64_t(std::numeric_limits<T>::max());
      out = T(x);
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      ok = std::isfinite(d) && d == std::floor(d) && d >= lo && d < hi;
      if (ok) out = T(d);
    }
    if (!ok)
      VQ_THROW(FormatError, what << ": field '" << key << "' must be an integer in [" << +std::numeric_limits<T>::min()
                                 << ", " << +std::numeric_limits<T>::max() << "], got " << v.dump());
    return out;
  } else {
    return v.get<T>();
  }
}

template <class T>
T get_required(const json& j, const char* key, const char* what) {
  if (!present(j, key)) VQ_THROW(FormatError, what << ": missing required field '" << key << "'");
  try {
    return convert<T>(j.at(key), key, what);
  } catch (const json::exception&) {
    VQ_THROW(FormatError, what << ": field '" << key << "' has the wrong type (" << j.at(key).dump() << ")");
  }
}

template <class T>
std::optional<T> get_optional(const json& j, const char* key, const char* what) {
  if (!present(j, key)) return std::nullopt;
  try {
    return convert<T>(j.at(key), key, what);
  } catch (const json::exception&) {
    VQ_THROW(FormatError, what << ": field '" << key << "' has the wrong type (" << j.at(key).dump() << ")");
  }
}

// eos_token_id may be an int or a list of ints.
std::vector<int32_t> get_id_list(const json& j, const char* key, const char* what) {
  std::vector<int32_t> out;
  if (!present(j, key)) return out;
  const json& v = j.at(key);
  if (v.is_number_integer()) {
    out.push_back(convert<int32_t>(v, key, what));
  } else if (v.is_array()) {
    for (const auto& e : v) {
      if (!e.is_number_integer()) VQ_THROW(FormatError, what << ": field '" << key << "' must hold integers, got " << v.dump());
      out.push_back(convert<int32_t>(e, key, what));
    }
  } else {
    VQ_THROW(FormatError, what << ": field '" << key << "' must be an integer or a list, got " << v.dump());
  }
  return out;
}

RopeScaling parse_rope_scaling(const json& rs, const char* field) {
  RopeScaling r;
  if (!rs.is_object()) VQ_THROW(FormatError, "config.json: '" << field << "' must be an object, got " << rs.dump());
  std::string type;
  if (present(rs, "rope_type")) {
    type = get_required<std::string>(rs, "rope_type", "config.json rope_scaling");
  } else if (present(rs, "type")) {
    type = get_required<std::string>(rs, "type", "config.json rope_scaling");
  } else {
    type = "default";
  }
  const std::string ctx = std::string("config.json ") + field;
  if (type == "default") {
    r.type = RopeType::Default;
  } else if (type == "linear") {
    r.type = RopeType::Linear;
    r.factor = get_required<double>(rs, "factor", ctx.c_str());
  } else if (type == "llama3") {
    r.type = RopeType::Llama3;
    r.factor = get_required<double>(rs, "factor", ctx.c_str());
    r.low_freq_factor = get_required<double>(rs, "low_freq_factor", ctx.c_str());
    r.high_freq_factor = get_required<double>(rs, "high_freq_factor", ctx.c_str());
    r.original_max_position_embeddings =
        get_required<int64_t>(rs, "original_max_position_embeddings", ctx.c_str());
    VQ_CHECK_VALUE(r.high_freq_factor > r.low_freq_factor,
                   ctx << ": high_freq_factor (" << r.high_freq_factor
                       << ") must exceed low_freq_factor (" << r.low_freq_factor << ")");
  } else if (type == "yarn") {
    r.type = RopeType::Yarn;
    r.factor = get_required<double>(rs, "factor", ctx.c_str());
    r.original_max_position_embeddings =
        get_optional<int64_t>(rs, "original_max_position_embeddings", ctx.c_str());
    r.beta_fast = get_optional<double>(rs, "beta_fast", ctx.c_str());
    r.beta_slow = get_optional<double>(rs, "beta_slow", ctx.c_str());
    r.mscale = get_optional<double>(rs, "mscale", ctx.c_str());
    r.mscale_all_dim = get_optional<double>(rs, "mscale_all_dim", ctx.c_str());
    r.attention_factor = get_optional<double>(rs, "attention_factor", ctx.c_str());
    r.truncate = get_optional<bool>(rs, "truncate", ctx.c_str()).value_or(true);
  } else {
    VQ_THROW(UnsupportedError, ctx << ".rope_type '" << type
                                   << "' is not supported (supported: default, linear, llama3, yarn)");
  }
  if (r.type != RopeType::Default) {
    VQ_CHECK_VALUE(r.factor > 0, ctx << ".factor must be > 0, got " << r.factor);
  }
  return r;
}

}  // namespace

double ModelConfig::attn_scale() const { return 1.0 / std::sqrt(double(head_dim)); }

void ModelConfig::validate() const {
  VQ_CHECK_VALUE(hidden_size > 0, "config.json: hidden_size must be > 0, got " << hidden_size);
  VQ_CHECK_VALUE(intermediate_size > 0, "config.json: intermediate_size must be > 0, got " << intermediate_size);
  VQ_CHECK_VALUE(n_layers > 0, "config.json: num_hidden_layers must be > 0, got " << n_layers);
  VQ_CHECK_VALUE(n_heads > 0, "config.json: num_attention_heads must be > 0, got " << n_heads);
  VQ_CHECK_VALUE(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                 "config.json: num_attention_heads (" << n_heads
                     << ") must be a multiple of num_key_value_heads (" << n_kv_heads << ")");
  VQ_CHECK_VALUE(head_dim > 0 && head_dim % 2 == 0,
                 "config.json: head_dim must be even and > 0, got " << head_dim);
  VQ_CHECK_VALUE(vocab_size > 0, "config.json: vocab_size must be > 0, got " << vocab_size);
  VQ_CHECK_VALUE(rms_norm_eps > 0, "config.json: rms_norm_eps must be > 0, got " << rms_norm_eps);
  VQ_CHECK_VALUE(rope_theta > 0, "config.json: rope_theta must be > 0, got " << rope_theta);
}

std::string ModelConfig::describe() const {
  std::ostringstream s;
  s << arch_name(arch) << ": " << n_layers << " layers, hidden " << hidden_size << ", heads " << n_heads
    << "/" << n_kv_heads << " x " << head_dim << ", mlp " << intermediate_size << ", vocab " << vocab_size
    << ", rope " << rope_type_name(rope_scaling.type) << " theta " << rope_theta;
  if (qk_norm) s << ", qk-norm";
  if (attention_bias) s << ", qkv bias";
  if (tie_word_embeddings) s << ", tied embeddings";
  if (sliding_window > 0) s << ", sliding window " << sliding_window;
  return s.str();
}

ModelConfig parse_model_config(const std::string& json_text) {
  const char* what = "config.json";
  const json j = parse_json(json_text, what);
  ModelConfig c;

  // Architecture.
  std::vector<std::string> archs;
  if (present(j, "architectures")) archs = get_required<std::vector<std::string>>(j, "architectures", what);
  c.model_type = get_optional<std::string>(j, "model_type", what).value_or("");
  if (archs.size() > 1) {
    std::ostringstream s;
    for (auto& a : archs) s << a << " ";
    VQ_THROW(UnsupportedError, "config.json: architectures lists several entries (" << s.str() << "); expected one");
  }
  c.architecture = archs.empty() ? c.model_type : archs[0];
  if (c.architecture == "LlamaForCausalLM" || (archs.empty() && c.model_type == "llama")) {
    c.arch = Arch::Llama;
  } else if (c.architecture == "MistralForCausalLM" || (archs.empty() && c.model_type == "mistral")) {
    c.arch = Arch::Mistral;
  } else if (c.architecture == "Qwen2ForCausalLM" || (archs.empty() && c.model_type == "qwen2")) {
    c.arch = Arch::Qwen2;
  } else if (c.architecture == "Qwen3ForCausalLM" || (archs.empty() && c.model_type == "qwen3")) {
    c.arch = Arch::Qwen3;
  } else {
    VQ_THROW(UnsupportedError, "config.json: architecture '"
                                   << (c.architecture.empty() ? std::string("<none>") : c.architecture)
                                   << "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                                      "Qwen2ForCausalLM, Qwen3ForCausalLM)");
  }

  c.hidden_size = get_required<int>(j, "hidden_size", what);
  c.intermediate_size = get_required<int>(j, "intermediate_size", what);
  c.n_layers = get_required<int>(j, "num_hidden_layers", what);
  c.n_heads = get_required<int>(j, "num_attention_heads", what);
  c.n_kv_heads = get_optional<int>(j, "num_key_value_heads", what).value_or(c.n_heads);
  c.vocab_size = get_required<int>(j, "vocab_size", what);
  VQ_CHECK_VALUE(c.n_heads > 0, "config.json: num_attention_heads must be > 0, got " << c.n_heads);
  c.head_dim = get_optional<int>(j, "head_dim", what).value_or(c.hidden_size / c.n_heads);
  if (!present(j, "head_dim")) {
    VQ_CHECK_VALUE(c.hidden_size % c.n_heads == 0,
                   "config.json: hidden_size (" << c.hidden_size << ") is not a multiple of num_attention_heads ("
                                                << c.n_heads << ") and head_dim is absent");
  }
  c.rms_norm_eps = get_optional<double>(j, "rms_norm_eps", what).value_or(1e-6);
  c.max_position_embeddings = get_optional<int64_t>(j, "max_position_embeddings", what).value_or(0);
  c.tie_word_embeddings = get_optional<bool>(j, "tie_word_embeddings", what).value_or(false);
  c.torch_dtype = get_optional<std::string>(j, "torch_dtype", what)
                      .value_or(get_optional<std::string>(j, "dtype", what).value_or(""));
  if (present(j, "bos_token_id") && j.at("bos_token_id").is_number_integer())
    c.bos_token_id = convert<int32_t>(j.at("bos_token_id"), "bos_token_id", "config.json");
  c.eos_token_ids = get_id_list(j, "eos_token_id", what);

  // RoPE: rope_theta + rope_scaling (classic), or rope_parameters (newer configs).
  c.rope_theta = get_optional<double>(j, "rope_theta", what).value_or(10000.0);
  if (present(j, "rope_scaling")) {
    c.rope_scaling = parse_rope_scaling(j.at("rope_scaling"), "rope_scaling");
  } else if (present(j, "rope_parameters")) {
    const json& rp = j.at("rope_parameters");
    c.rope_scaling = parse_rope_scaling(rp, "rope_parameters");
    if (rp.is_object() && present(rp, "rope_theta"))
      c.rope_theta = get_required<double>(rp, "rope_theta", "config.json rope_parameters");
  }
  if (present(j, "partial_rotary_factor")) {
    const double prf = get_required<double>(j, "partial_rotary_factor", what);
    if (prf != 1.0)
      VQ_THROW(UnsupportedError, "config.json: partial_rotary_factor " << prf << " is not supported (only 1.0)");
  }

  // Activation.
  const std::string act = get_optional<std::string>(j, "hidden_act", what).value_or("silu");
  if (act != "silu" && act != "swish")
    VQ_THROW(UnsupportedError, "config.json: hidden_act '" << act << "' is not supported (only silu)");

  // Biases.
  switch (c.arch) {
    case Arch::Qwen2:
      // Qwen2 always has q/k/v biases and no o_proj bias.
      c.attention_bias = true;
      c.attention_o_bias = false;
      break;
    case Arch::Mistral:
      // Mistral's projections never carry biases (the reference ignores attention_bias).
      c.attention_bias = c.attention_o_bias = false;
      break;
    case Arch::Llama:
    case Arch::Qwen3:
      // Llama and Qwen3 put attention_bias on all four projections.
      c.attention_bias = get_optional<bool>(j, "attention_bias", what).value_or(false);
      c.attention_o_bias = c.attention_bias;
      break;
  }
  c.mlp_bias = get_optional<bool>(j, "mlp_bias", what).value_or(false);
  if (c.mlp_bias && c.arch != Arch::Llama)
    VQ_THROW(UnsupportedError, "config.json: mlp_bias true is only defined for llama, not " << arch_name(c.arch));
  c.qk_norm = c.arch == Arch::Qwen3;

  // Sliding window.
  if (c.arch == Arch::Mistral) {
    c.sliding_window = get_optional<int64_t>(j, "sliding_window", what).value_or(0);
    VQ_CHECK_VALUE(c.sliding_window >= 0, "config.json: sliding_window must be >= 0, got " << c.sliding_window);
  } else if (c.arch == Arch::Qwen2 || c.arch == Arch::Qwen3) {
    if (get_optional<bool>(j, "use_sliding_window", what).value_or(false))
      VQ_THROW(UnsupportedError, "config.json: use_sliding_window true is not supported for "
                                     << arch_name(c.arch) << " (per-layer sliding windows)");
  } else if (present(j, "sliding_window")) {
    VQ_THROW(UnsupportedError, "config.json: sliding_window is not supported for " << arch_name(c.arch));
  }
  if (present(j, "layer_types")) {
    for (const auto& t : j.at("layer_types")) {
      if (!t.is_string() || t.get<std::string>() != "full_attention")
        VQ_THROW(UnsupportedError, "config.json: layer_types entry " << t.dump()
                                                                     << " is not supported (only full_attention)");
    }
  }
  c.validate();
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& dir) {
  return parse_model_config(read_text_file(dir / "config.json"));
}

GenerationConfig parse_generation_config(const std::string& json_text) {
  const char* what = "generation_config.json";
  const json j = parse_json(json_text, what);
  GenerationConfig g;
  if (present(j, "bos_token_id") && j.at("bos_token_id").is_number_integer())
    g.bos_token_id = convert<int32_t>(j.at("bos_token_id"), "bos_token_id", "generation_config.json");
  g.eos_token_ids = get_id_list(j, "eos_token_id", what);
  g.temperature = get_optional<double>(j, "temperature", what);
  g.top_k = get_optional<int>(j, "top_k", what);
  g.top_p = get_optional<double>(j, "top_p", what);
  g.repetition_penalty = get_optional<double>(j, "repetition_penalty", what);
  g.do_sample = get_optional<bool>(j, "do_sample", what);
  return g;
}

GenerationConfig load_generation_config(const std::filesystem::path& dir) {
  const auto p = dir / "generation_config.json";
  if (!std::filesystem::exists(p)) return {};
  return parse_generation_config(read_text_file(p));
}

// ---- RoPE frequencies ----------------------------------------------------------------------
// Computed in double and rounded once; the reference computes in float32, so the two agree to
// a few ulps (the rope tests check against hand-written formulas and the reference's values).
RopeFrequencies compute_rope_frequencies(const ModelConfig& c) {
  const int dim = c.head_dim;
  const int half = dim / 2;
  const double base = c.rope_theta;
  const RopeScaling& rs = c.rope_scaling;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(base, double(2 * i) / dim);

  RopeFrequencies out;
  out.inv_freq.resize(half);
  double attention_factor = 1.0;
  switch (rs.type) {
    case RopeType::Default:
      break;
    case RopeType::Linear:
      for (auto& f : inv) f /= rs.factor;
      break;
    case RopeType::Llama3: {
      const double old_ctx = double(*rs.original_max_position_embeddings);
      const double low_wavelen = old_ctx / rs.low_freq_factor;
      const double high_wavelen = old_ctx / rs.high_freq_factor;
      for (auto& f : inv) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f = f / rs.factor;  // low frequencies: interpolate
        } else if (wavelen >= high_wavelen) {
          // medium: blend between interpolated and original
          const double smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
          f = (1.0 - smooth) * f / rs.factor + smooth * f;
        }
        // high frequencies: unchanged
      }
      break;
    }
    case RopeType::Yarn: {
      const double factor = rs.factor;
      const double orig = double(rs.original_max_position_embeddings.value_or(c.max_position_embeddings));
      VQ_CHECK_VALUE(orig > 0, "config.json: yarn rope scaling needs original_max_position_embeddings or "
                               "max_position_embeddings");
      auto get_mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
      if (rs.attention_factor) {
        attention_factor = *rs.attention_factor;
      } else if (rs.mscale && rs.mscale_all_dim && *rs.mscale != 0 && *rs.mscale_all_dim != 0) {
        attention_factor = get_mscale(factor, *rs.mscale) / get_mscale(factor, *rs.mscale_all_dim);
      } else {
        attention_factor = get_mscale(factor, 1.0);
      }
      const double beta_fast = rs.beta_fast.value_or(32.0);
      const double beta_slow = rs.beta_slow.value_or(1.0);
      auto correction_dim = [&](double n_rot) {
        return (dim * std::log(orig / (n_rot * 2.0 * std::numbers::pi))) / (2.0 * std::log(base));
      };
      double low = correction_dim(beta_fast);
      double high = correction_dim(beta_slow);
      if (rs.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, double(dim - 1));
      if (low == high) high += 0.001;  // avoid a division by zero in the ramp
      for (int i = 0; i < half; ++i) {
        const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation_weight = 1.0 - ramp;
        const double f_extra = inv[i];
        const double f_inter = inv[i] / factor;
        inv[i] = f_inter * (1.0 - extrapolation_weight) + f_extra * extrapolation_weight;
      }
      break;
    }
  }
  for (int i = 0; i < half; ++i) out.inv_freq[i] = float(inv[i]);
  out.attention_factor = float(attention_factor);
  return out;
}

}  // namespace veloxquant::runtime
