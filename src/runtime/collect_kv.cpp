// collect_kv.cpp — post-RoPE keys and values of a model run, for calibration.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "veloxquant/error.h"
#include "veloxquant/runtime/generate.h"

namespace veloxquant::runtime {

KVSamples collect_kv_samples(const Model& model, std::span<const int32_t> tokens, const CollectParams& params) {
  VQ_CHECK_VALUE(params.ctx >= 1, "collect_kv_samples: ctx must be >= 1, got " << params.ctx);
  VQ_CHECK_VALUE(!tokens.empty(), "collect_kv_samples: no tokens");
  const ModelConfig& c = model.config();
  const int64_t row = int64_t(c.n_kv_heads) * c.head_dim;  // floats per token
  const int64_t bos = params.bos ? 1 : 0;
  const int64_t text_per_window = std::max<int64_t>(1, params.ctx - bos);
  const int64_t n_text = int64_t(tokens.size());
  const int64_t cap = params.max_tokens > 0 ? params.max_tokens : INT64_MAX;  // tokens collected, BOS included

  std::vector<std::vector<float>> keys(size_t(c.n_layers)), values(size_t(c.n_layers));
  auto observer = [&](int layer, const float* k, const float* v, int64_t n) {
    keys[size_t(layer)].insert(keys[size_t(layer)].end(), k, k + n * row);
    values[size_t(layer)].insert(values[size_t(layer)].end(), v, v + n * row);
  };
  // The windows [pos, pos + len) of text, each after its BOS, planned first so that progress
  // can name the total: windows of text_per_window text tokens until the text or the cap ends.
  std::vector<std::pair<int64_t, int64_t>> windows;
  int64_t total = 0;
  for (int64_t pos = 0; pos < n_text;) {
    const int64_t room = cap - total - bos;
    if (room <= 0) break;
    const int64_t len = std::min({text_per_window, n_text - pos, room});
    windows.emplace_back(pos, len);
    total += len + bos;
    pos += len;
  }
  std::vector<int32_t> win;
  int64_t collected = 0;
  for (const auto& [pos, len] : windows) {
    win.clear();
    if (params.bos) win.push_back(*params.bos);
    win.insert(win.end(), tokens.begin() + pos, tokens.begin() + pos + len);
    if (params.forward_nocache)
      params.forward_nocache(win, DType::F32, /*all_logits=*/false, observer);
    else
      model.forward_nocache(win, DType::F32, /*all_logits=*/false, observer);
    collected += int64_t(win.size());
    if (params.on_window) params.on_window(collected, total);
  }
  VQ_CHECK_VALUE(collected > 0, "collect_kv_samples: max_tokens " << params.max_tokens << " leaves no room for a token");

  for (int l = 0; l < c.n_layers; ++l)
    VQ_CHECK_VALUE(int64_t(keys[size_t(l)].size()) == collected * row && int64_t(values[size_t(l)].size()) == collected * row,
                   "collect_kv_samples: the forward pass reported K/V of "
                       << keys[size_t(l)].size() / size_t(row) << " / " << values[size_t(l)].size() / size_t(row)
                       << " tokens for layer " << l << ", expected " << collected << " (one observer call per layer "
                       << "and window)");

  KVSamples s;
  s.n_layers = c.n_layers;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    s.keys.push_back(Tensor::from_floats(keys[size_t(l)], {collected, c.n_kv_heads, c.head_dim}));
    s.values.push_back(Tensor::from_floats(values[size_t(l)], {collected, c.n_kv_heads, c.head_dim}));
  }
  s.source = "model " + model.dir().string() + " (" + arch_name(c.arch) + "), " + std::to_string(collected) +
             " tokens in windows of " + std::to_string(params.ctx);
  return s;
}

}  // namespace veloxquant::runtime
