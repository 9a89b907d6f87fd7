// config.json parsing (errors name the field) and the RoPE frequency formulas against values
// written out by hand for configurations whose regimes are known.
#include <cmath>
#include <numbers>
#include <string>

#include <gtest/gtest.h>

#include "veloxquant/error.h"
#include "veloxquant/runtime/config.h"

using namespace veloxquant;
using namespace veloxquant::runtime;

namespace {

std::string base_config(const std::string& extra = "", const std::string& arch = "LlamaForCausalLM") {
  return R"({"architectures": [")" + arch + R"("], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0)" +
         extra + "}";
}

template <class E>
void expect_error_naming(const std::string& json, const std::string& needle) {
  try {
    parse_model_config(json);
    FAIL() << "no exception; expected one naming '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  } catch (const std::exception& e) {
    FAIL() << "wrong exception type: " << e.what();
  }
}

}  // namespace

TEST(RuntimeConfig, ParsesLlamaDefaults) {
  const ModelConfig c = parse_model_config(base_config());
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.rope_scaling.type, RopeType::Default);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
}

TEST(RuntimeConfig, ArchitectureSpecifics) {
  const ModelConfig q2 = parse_model_config(base_config(R"(, "tie_word_embeddings": true)", "Qwen2ForCausalLM"));
  EXPECT_EQ(q2.arch, Arch::Qwen2);
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_FALSE(q2.attention_o_bias);
  EXPECT_TRUE(q2.tie_word_embeddings);
  const ModelConfig q3 = parse_model_config(base_config(R"(, "head_dim": 32)", "Qwen3ForCausalLM"));
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_EQ(q3.head_dim, 32);
  const ModelConfig m = parse_model_config(base_config(R"(, "sliding_window": 4096)", "MistralForCausalLM"));
  EXPECT_EQ(m.sliding_window, 4096);
  const ModelConfig m0 = parse_model_config(base_config(R"(, "sliding_window": null)", "MistralForCausalLM"));
  EXPECT_EQ(m0.sliding_window, 0);
  const ModelConfig eos = parse_model_config(base_config(R"(, "eos_token_id": [5, 7], "bos_token_id": 1)"));
  EXPECT_EQ(eos.eos_token_ids, (std::vector<int32_t>{5, 7}));
  EXPECT_EQ(eos.bos_token_id, 1);
}

TEST(RuntimeConfig, ErrorsNameTheField) {
  expect_error_naming<UnsupportedError>(base_config("", "GemmaForCausalLM"), "GemmaForCausalLM");
  expect_error_naming<FormatError>(R"({"architectures": ["LlamaForCausalLM"], "intermediate_size": 1})", "hidden_size");
  expect_error_naming<FormatError>(base_config(R"(, "hidden_size": "big")"), "hidden_size");
  expect_error_naming<FormatError>("{not json", "malformed");
  expect_error_naming<UnsupportedError>(base_config(R"(, "hidden_act": "gelu")"), "hidden_act");
  expect_error_naming<UnsupportedError>(base_config(R"(, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0})"),
                                        "dynamic");
  expect_error_naming<UnsupportedError>(base_config(R"(, "rope_scaling": {"type": "longrope", "factor": 2.0})"),
                                        "rope_type");
  expect_error_naming<FormatError>(base_config(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0})"),
                                   "low_freq_factor");
  expect_error_naming<UnsupportedError>(base_config(R"(, "partial_rotary_factor": 0.5)"), "partial_rotary_factor");
  expect_error_naming<UnsupportedError>(base_config(R"(, "use_sliding_window": true)", "Qwen2ForCausalLM"),
                                        "use_sliding_window");
  expect_error_naming<UnsupportedError>(base_config(R"(, "sliding_window": 128)"), "sliding_window");
  expect_error_naming<ValueError>(base_config(R"(, "num_key_value_heads": 3)"), "num_key_value_heads");
  expect_error_naming<UnsupportedError>(base_config(R"(, "mlp_bias": true)", "Qwen2ForCausalLM"), "mlp_bias");
  expect_error_naming<UnsupportedError>(base_config(R"(, "layer_types": ["sliding_attention"])"), "layer_types");
}

// Integer fields take integers inside their type's range: 3e24 (a JSON float; converting it to
// int was undefined behaviour, found by fuzz_model_config), 2^40 or a fractional value are
// FormatErrors naming the field; an integral float is the integer it spells.
TEST(RuntimeConfig, IntegerFieldsOutOfRangeNameTheField) {
  expect_error_naming<FormatError>(base_config(R"(, "hidden_size": 3355555555555555555555555)"), "hidden_size");
  expect_error_naming<FormatError>(base_config(R"(, "num_hidden_layers": 1099511627776)"), "num_hidden_layers");
  expect_error_naming<FormatError>(base_config(R"(, "vocab_size": 100.5)"), "vocab_size");
  expect_error_naming<FormatError>(base_config(R"(, "num_attention_heads": -4294967292)"), "num_attention_heads");
  expect_error_naming<FormatError>(base_config(R"(, "eos_token_id": [5, 4294967301])"), "eos_token_id");
  expect_error_naming<FormatError>(base_config(R"(, "max_position_embeddings": 1e300)"), "max_position_embeddings");
  EXPECT_EQ(parse_model_config(base_config(R"(, "max_position_embeddings": 4096.0)")).max_position_embeddings, 4096);
  EXPECT_THROW(parse_generation_config(R"({"eos_token_id": 9999999999})"), FormatError);
}

TEST(RuntimeConfig, GenerationConfig) {
  const GenerationConfig g =
      parse_generation_config(R"({"bos_token_id": 1, "eos_token_id": [2, 3], "temperature": 0.6, "top_p": 0.9})");
  EXPECT_EQ(g.bos_token_id, 1);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_DOUBLE_EQ(*g.temperature, 0.6);
  EXPECT_DOUBLE_EQ(*g.top_p, 0.9);
  EXPECT_FALSE(g.top_k.has_value());
}

TEST(RuntimeConfig, RopeParametersFormIsAccepted) {
  const ModelConfig c =
      parse_model_config(base_config(R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0})"));
  EXPECT_EQ(c.rope_scaling.type, RopeType::Linear);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500.0);
}

// ---- RoPE frequencies against hand-written values ------------------------------------------
// head_dim 16, theta 10000: inv_freq_i = 10000^(-i/8), wavelengths 2π/inv_freq:
// 6.28, 19.9, 62.8, 199, ... — so for original_max_position_embeddings 32 with
// low_freq_factor 1 / high_freq_factor 4 (wavelength thresholds 32 and 8), i = 0 is a high
// frequency (kept), i = 1 a medium one (blended), i >= 2 low ones (divided by the factor).

TEST(RuntimeRope, DefaultAndLinear) {
  ModelConfig c = parse_model_config(base_config());
  RopeFrequencies f = compute_rope_frequencies(c);
  ASSERT_EQ(f.inv_freq.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(f.inv_freq[size_t(i)], float(std::pow(10000.0, -i / 8.0))) << i;
  EXPECT_EQ(f.attention_factor, 1.0f);
  c = parse_model_config(base_config(R"(, "rope_scaling": {"type": "linear", "factor": 4.0})"));
  f = compute_rope_frequencies(c);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(f.inv_freq[size_t(i)], float(std::pow(10000.0, -i / 8.0) / 4.0)) << i;
}

TEST(RuntimeRope, Llama3) {
  const ModelConfig c = parse_model_config(base_config(
      R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32})"));
  const RopeFrequencies f = compute_rope_frequencies(c);
  const double f0 = 1.0, f1 = std::pow(10000.0, -1.0 / 8.0);
  EXPECT_FLOAT_EQ(f.inv_freq[0], float(f0));  // high frequency: unchanged
  const double wavelen1 = 2 * std::numbers::pi / f1;
  const double smooth = (32.0 / wavelen1 - 1.0) / (4.0 - 1.0);
  EXPECT_GT(smooth, 0.0);
  EXPECT_LT(smooth, 1.0);
  EXPECT_FLOAT_EQ(f.inv_freq[1], float((1 - smooth) * f1 / 8.0 + smooth * f1));  // medium: blended
  for (int i = 2; i < 8; ++i)
    EXPECT_FLOAT_EQ(f.inv_freq[size_t(i)], float(std::pow(10000.0, -i / 8.0) / 8.0)) << i;  // low: / factor
  EXPECT_EQ(f.attention_factor, 1.0f);
}

TEST(RuntimeRope, Yarn) {
  // head_dim 32, theta 1e6, factor 4, original 64. Correction dims:
  //   d(n) = 32·ln(64 / (2πn)) / (2·ln 1e6);  d(32) = −1.33 → floor −2 → 0;  d(1) = 2.69 → ceil 3
  // so ramp(i) = clamp(i / 3, 0, 1) and inv_i = base_i·(1 − ramp) + base_i/4·ramp.
  const ModelConfig c = parse_model_config(base_config(
      R"(, "head_dim": 32, "rope_theta": 1000000.0, "max_position_embeddings": 256,
          "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})"));
  const RopeFrequencies f = compute_rope_frequencies(c);
  ASSERT_EQ(f.inv_freq.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    const double base = std::pow(1e6, -2.0 * i / 32.0);
    const double ramp = std::min(1.0, i / 3.0);
    EXPECT_FLOAT_EQ(f.inv_freq[size_t(i)], float(base * (1 - ramp) + base / 4.0 * ramp)) << i;
  }
  EXPECT_FLOAT_EQ(f.attention_factor, float(0.1 * std::log(4.0) + 1.0));

  // Explicit attention_factor wins; mscale / mscale_all_dim give their ratio.
  const ModelConfig c2 = parse_model_config(base_config(
      R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 0.5})"));
  EXPECT_FLOAT_EQ(compute_rope_frequencies(c2).attention_factor, 0.5f);
  const ModelConfig c3 = parse_model_config(base_config(
      R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 2.0, "mscale_all_dim": 1.0})"));
  EXPECT_FLOAT_EQ(compute_rope_frequencies(c3).attention_factor,
                  float((0.2 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0)));
}
