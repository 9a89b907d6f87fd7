// Helpers shared by the runtime tests: paths of the committed tiny checkpoints and their
// transformers reference files, and error metrics.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "veloxquant/runtime/model.h"
#include "veloxquant/safetensors.h"

namespace vqtest {

/// The committed test data: VQ_TEST_DATA_DIR from the environment if set (a test binary run
/// away from its source tree, e.g. built on one machine and run on another), else the path
/// compiled in.
inline std::filesystem::path test_data() {
  const char* env = std::getenv("VQ_TEST_DATA_DIR");
  return std::filesystem::path(env && *env ? env : VQ_TEST_DATA_DIR);
}
inline std::filesystem::path runtime_data() { return test_data() / "runtime"; }
inline std::filesystem::path tiny_dir(const std::string& name) { return runtime_data() / name; }

/// The prompt in one forward (every position's logits), then one token per forward (HF's
/// procedure): the logits of all positions, [tokens, vocab]. M: a CPU or CUDA model.
template <class M>
std::vector<float> incremental_logits(const M& m, veloxquant::runtime::LayerCaches& caches,
                                      const std::vector<int32_t>& tokens, int64_t n_prompt,
                                      veloxquant::runtime::AttentionPath path = veloxquant::runtime::AttentionPath::Auto) {
  veloxquant::runtime::ForwardOptions fo;
  fo.all_logits = true;
  fo.path = path;
  std::vector<float> all = m.forward(std::span<const int32_t>(tokens.data(), size_t(n_prompt)), caches, fo);
  for (size_t t = size_t(n_prompt); t < tokens.size(); ++t) {
    const auto l = m.forward(std::span<const int32_t>(&tokens[t], 1), caches, fo);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

/// What tests/runtime/reference_logits.py wrote for one checkpoint.
struct Reference {
  std::vector<int32_t> tokens;   // [n] prompt + greedy tokens
  int32_t next_token = -1;
  int64_t n_prompt = 0;
  int64_t vocab = 0;
  std::vector<float> logits;     // [n, vocab] HF float32 (prefill rows, then decode steps)
  std::vector<float> logits_f64; // [n, vocab] HF float64, no cache
  std::vector<float> rope_inv_freq;
  float rope_attention_scaling = 1.0f;
  std::vector<int32_t> tok_ids;  // tokenizers' encoding of tokenizer_text
  std::string tokenizer_text;
  std::string transformers_version;
};

inline Reference load_reference(const std::string& name) {
  const auto f = veloxquant::SafetensorsFile::open((runtime_data() / "reference" / (name + ".safetensors")).string());
  Reference r;
  auto ints = [&](const char* n) {
    const auto v = f.tensor(n);
    return std::vector<int32_t>(v.ptr<int32_t>(), v.ptr<int32_t>() + v.numel());
  };
  r.tokens = ints("tokens");
  r.next_token = ints("next_token").at(0);
  r.logits = f.read_f32("logits");
  r.logits_f64 = f.read_f32("logits_f64");
  r.vocab = f.tensor("logits").dim(1);
  r.rope_inv_freq = f.read_f32("rope_inv_freq");
  r.rope_attention_scaling = f.read_f32("rope_attention_scaling").at(0);
  if (f.contains("tok_ids")) r.tok_ids = ints("tok_ids");
  r.tokenizer_text = f.metadata_value("tokenizer_text").value_or("");
  r.transformers_version = f.metadata_value("transformers").value_or("?");
  const std::string prompt = f.metadata_value("prompt").value_or("");
  r.n_prompt = prompt.empty() ? 0 : int64_t(std::count(prompt.begin(), prompt.end(), ',')) + 1;
  return r;
}

struct ErrStats {
  double max_abs = 0;  ///< max |a − b|
  double max_rel = 0;  ///< max over rows of max|a − b| / max|b| (row scale)
};

/// Compares rows [row0, row0 + n_rows) of a against b (both [*, vocab]).
inline ErrStats compare_rows(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab, int64_t n_rows,
                             int64_t a_row0 = 0, int64_t b_row0 = 0) {
  ErrStats s;
  for (int64_t r = 0; r < n_rows; ++r) {
    double row_max = 0, row_scale = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double x = a[size_t((a_row0 + r) * vocab + v)], y = b[size_t((b_row0 + r) * vocab + v)];
      row_max = std::max(row_max, std::fabs(x - y));
      row_scale = std::max(row_scale, std::fabs(y));
    }
    s.max_abs = std::max(s.max_abs, row_max);
    s.max_rel = std::max(s.max_rel, row_max / std::max(row_scale, 1e-30));
  }
  return s;
}

inline int32_t argmax_row(const std::vector<float>& l, int64_t vocab, int64_t row) {
  int64_t best = 0;
  for (int64_t v = 1; v < vocab; ++v)
    if (l[size_t(row * vocab + v)] > l[size_t(row * vocab + best)]) best = v;
  return int32_t(best);
}

/// Gap between the largest and second largest logit of a row.
inline double top2_gap(const std::vector<float>& l, int64_t vocab, int64_t row) {
  double a = -INFINITY, b = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) {
    const double x = l[size_t(row * vocab + v)];
    if (x > a) b = a, a = x;
    else if (x > b) b = x;
  }
  return a - b;
}

}  // namespace vqtest
