// tiny_checkpoint.h — writes tiny, randomly initialised Llama-family checkpoints in Hugging
// Face format (config.json, generation_config.json, safetensors weights — single file or
// index + shards —, tokenizer.json, tokenizer_config.json) with fixed seeds.
//
// The committed copies under tests/data/runtime/<name>/ were produced by this code; the test
// RuntimeTinyCheckpoint.CommittedFilesMatchGenerator regenerates them and checks they are
// byte-identical, and with VQ_WRITE_TINY_CHECKPOINTS=1 it (re)writes the committed copies.
// The reference logits next to them come from Hugging Face transformers
// (tests/runtime/reference_logits.py, run on a machine with PyTorch).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace vqtest {

struct TinySpec {
  std::string name;          ///< directory name, e.g. "tiny-llama"
  std::string architecture;  ///< "LlamaForCausalLM", ...
  std::string model_type;    ///< "llama", ...
  int hidden = 64;
  int intermediate = 96;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 2;
  int head_dim = 0;          ///< 0: hidden / n_heads and not written to config.json
  double rope_theta = 10000.0;
  std::string rope_scaling_json;  ///< "" or a JSON object
  int64_t max_position_embeddings = 256;
  bool tied = false;
  bool qkv_bias = false;     ///< q/k/v biases (Qwen2)
  bool qk_norm = false;      ///< q_norm / k_norm (Qwen3)
  int64_t sliding_window = 0;  ///< Mistral: written when > 0
  std::string dtype = "float32";  ///< float32, float16, bfloat16
  std::string k_proj_dtype;  ///< "": as dtype; else the dtype of every self_attn.k_proj.weight (a mixed-dtype checkpoint)
  int n_shards = 1;          ///< > 1: model-0000i-of-0000n.safetensors + index
  bool add_bos = true;       ///< tokenizer adds <|bos|>
  uint64_t seed = 1;
  int poison_token = -1;     ///< >= 0: that token's embedding row is +inf (non-finite activations)
};

/// The four committed checkpoints (llama / qwen2 / qwen3 / mistral variants).
std::vector<TinySpec> tiny_specs();

/// Vocabulary of every tiny tokenizer: 256 byte tokens, kTinyMerges merges, <|bos|>, <|eos|>.
constexpr int kTinyMerges = 30;
constexpr int kTinyVocab = 256 + kTinyMerges + 2;
constexpr int kTinyBos = 256 + kTinyMerges;
constexpr int kTinyEos = 256 + kTinyMerges + 1;

/// Writes the checkpoint of `spec` into `dir` (created; existing files overwritten).
/// Tensors of 2^20 values or more are drawn and converted on several threads, each starting
/// at its chunk's place in the one random stream, so the files do not depend on the count.
void write_tiny_checkpoint(const TinySpec& spec, const std::filesystem::path& dir);

/// The writer's thread count for large tensors (0: hardware_concurrency, the default); returns
/// the previous setting. For the test that the files do not depend on it.
unsigned set_tiny_writer_threads(unsigned n);

}  // namespace vqtest
