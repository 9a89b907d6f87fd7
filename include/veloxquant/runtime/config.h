// veloxquant/runtime/config.h — a Llama-family model's configuration, read from a Hugging Face
// model directory (config.json, generation_config.json).
//
// Supported architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM. Every config.json field that changes the maths is either honoured or
// rejected with a ValueError / UnsupportedError that names it (e.g. hidden_act "gelu",
// rope_scaling.rope_type "longrope", Qwen2's use_sliding_window true, partial_rotary_factor
// 0.5). Fields that do not change the maths (bos/eos ids, dtype, max_position_embeddings,
// initializer_range, ...) are read where useful and otherwise ignored.
//
// RoPE: inv_freq[i] for i in [0, head_dim/2) and an attention factor that multiplies cos and
// sin, following the formulas of the reference implementation for the rope types
//   default  inv_freq = theta^(-2i/head_dim)
//   linear   default / factor
//   llama3   low frequencies divided by factor, high ones kept, a smooth blend between
//            (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
//   yarn     blend of interpolated and extrapolated frequencies over a linear ramp between
//            the correction dims of beta_fast / beta_slow; attention factor 0.1·ln(factor)+1
//            (or from mscale / mscale_all_dim / attention_factor)
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace veloxquant::runtime {

/// The architecture families the runtime implements.
enum class Arch { Llama, Mistral, Qwen2, Qwen3 };
const char* arch_name(Arch a);

enum class RopeType { Default, Linear, Llama3, Yarn };
const char* rope_type_name(RopeType t);

/// rope_scaling (or rope_parameters) of config.json. Unset optionals take the reference's
/// defaults when the frequencies are computed.
struct RopeScaling {
  RopeType type = RopeType::Default;
  double factor = 1.0;                          ///< linear, llama3, yarn
  double low_freq_factor = 1.0;                 ///< llama3
  double high_freq_factor = 4.0;                ///< llama3
  std::optional<int64_t> original_max_position_embeddings;  ///< llama3 (required), yarn
  std::optional<double> beta_fast;              ///< yarn (default 32)
  std::optional<double> beta_slow;              ///< yarn (default 1)
  std::optional<double> mscale;                 ///< yarn
  std::optional<double> mscale_all_dim;         ///< yarn
  std::optional<double> attention_factor;       ///< yarn: overrides the computed factor
  bool truncate = true;                         ///< yarn: round the correction range
};

/// What the forward pass needs to know about a model.
struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string architecture;   ///< as written in config.json ("LlamaForCausalLM")
  std::string model_type;     ///< "llama", "mistral", "qwen2", "qwen3"
  int hidden_size = 0;        ///< d_model
  int intermediate_size = 0;  ///< MLP hidden width
  int n_layers = 0;           ///< num_hidden_layers
  int n_heads = 0;            ///< num_attention_heads
  int n_kv_heads = 0;         ///< num_key_value_heads (defaults to n_heads)
  int head_dim = 0;           ///< head_dim, or hidden_size / n_heads when absent
  int vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;   ///< q/k/v (and for Llama/Qwen3 also o) projections carry biases
  bool attention_o_bias = false; ///< o_proj carries a bias (Llama/Mistral/Qwen3 with attention_bias)
  bool mlp_bias = false;         ///< Llama's mlp_bias
  bool qk_norm = false;          ///< Qwen3: RMSNorm over head_dim on q and k before RoPE
  int64_t sliding_window = 0;    ///< > 0: attention sees only the last sliding_window positions
  std::string torch_dtype;       ///< informative ("bfloat16")
  std::optional<int32_t> bos_token_id;      ///< from config.json
  std::vector<int32_t> eos_token_ids;       ///< from config.json (int or list)

  /// Softmax scale of attention: 1/sqrt(head_dim).
  double attn_scale() const;
  /// Throws ValueError naming the field when sizes are inconsistent (n_heads % n_kv_heads,
  /// head_dim odd, non-positive sizes, ...).
  void validate() const;
  /// One line: "qwen2: 2 layers, hidden 64, heads 4/2 x 16, vocab 256, rope default".
  std::string describe() const;
};

/// generation_config.json (all optional).
struct GenerationConfig {
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  std::optional<double> temperature;
  std::optional<int> top_k;
  std::optional<double> top_p;
  std::optional<double> repetition_penalty;
  std::optional<bool> do_sample;
};

/// Parses config.json text. Throws FormatError (malformed JSON, missing required field —
/// named), UnsupportedError (architecture or maths-changing field not supported — named) or
/// ValueError (inconsistent values — named).
ModelConfig parse_model_config(const std::string& json_text);
/// Reads `dir`/config.json.
ModelConfig load_model_config(const std::filesystem::path& dir);
/// Parses generation_config.json text.
GenerationConfig parse_generation_config(const std::string& json_text);
/// Reads `dir`/generation_config.json; an empty config when the file is absent.
GenerationConfig load_generation_config(const std::filesystem::path& dir);

/// The RoPE frequencies of a model: inv_freq [head_dim/2] and the attention factor that
/// scales cos and sin (1 except for yarn).
struct RopeFrequencies {
  std::vector<float> inv_freq;  ///< [head_dim / 2]
  float attention_factor = 1.0f;
};
/// Computes them from head_dim, rope_theta, rope_scaling and max_position_embeddings.
RopeFrequencies compute_rope_frequencies(const ModelConfig& config);

/// Reads a whole text file (IoError naming the path when it cannot).
std::string read_text_file(const std::filesystem::path& path);

}  // namespace veloxquant::runtime
