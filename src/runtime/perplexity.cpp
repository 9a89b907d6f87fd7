// perplexity.cpp — windowed perplexity through the caches (see generate.h).
#include <algorithm>
#include <chrono>
#include <cmath>

#include "veloxquant/error.h"
#include "veloxquant/runtime/generate.h"

namespace veloxquant::runtime {

double PerplexityResult::ppl() const { return n_scored > 0 ? std::exp(nll_sum / double(n_scored)) : 0.0; }

PerplexityResult perplexity(const Model& model, LayerCaches& caches, std::span<const int32_t> tokens,
                            const PerplexityParams& params) {
  VQ_CHECK_VALUE(params.ctx >= 2, "perplexity: ctx must be >= 2, got " << params.ctx);
  VQ_CHECK_VALUE(params.chunk >= 1, "perplexity: chunk must be >= 1, got " << params.chunk);
  VQ_CHECK_VALUE(!caches.empty(), "perplexity: no caches");
  const int64_t bos = params.bos ? 1 : 0;
  const int64_t text_per_window = params.ctx - bos;  // text tokens per window
  VQ_CHECK_VALUE(text_per_window >= 2 || (bos && text_per_window >= 1),
                 "perplexity: ctx " << params.ctx << " leaves no token to score");
  int64_t n_windows = int64_t(tokens.size()) / text_per_window;
  if (params.max_windows > 0) n_windows = std::min(n_windows, params.max_windows);
  VQ_CHECK_VALUE(n_windows >= 1, "perplexity: the text has " << tokens.size() << " tokens, fewer than one window of "
                                                             << text_per_window);
  const int V = model.config().vocab_size;
  PerplexityResult r;
  const auto t0 = std::chrono::steady_clock::now();
  ForwardOptions fo;
  fo.all_logits = true;
  fo.path = params.path;
  std::vector<int32_t> win;
  for (int64_t w = 0; w < n_windows; ++w) {
    trim_caches(caches, caches[0]->offset());
    win.clear();
    if (params.bos) win.push_back(*params.bos);
    win.insert(win.end(), tokens.begin() + w * text_per_window, tokens.begin() + (w + 1) * text_per_window);
    const int64_t L = int64_t(win.size());
    // Logits of position i predict token i+1; the first window token (bos or text) is context only.
    for (int64_t i = 0; i < L - 1; i += params.chunk) {
      const int64_t len = std::min(params.chunk, L - 1 - i);
      const std::span<const int32_t> part(win.data() + i, size_t(len));
      const std::vector<float> logits = params.forward ? params.forward(part, caches, fo) : model.forward(part, caches, fo);
      VQ_CHECK_VALUE(int64_t(logits.size()) == len * V, "perplexity: the forward pass returned " << logits.size()
                                                             << " logits for " << len << " tokens of vocabulary " << V);
      for (int64_t j = 0; j < len; ++j) {
        const float* l = logits.data() + j * V;
        const int32_t target = win[size_t(i + j + 1)];
        double m = l[0];
        for (int v = 1; v < V; ++v) m = std::max(m, double(l[v]));
        double s = 0.0;
        for (int v = 0; v < V; ++v) s += std::exp(double(l[v]) - m);
        r.nll_sum += (m + std::log(s)) - double(l[target]);
        ++r.n_scored;
      }
    }
    r.kv_bytes_peak = std::max(r.kv_bytes_peak, caches_nbytes(caches));
    r.kv_fp16_bytes = model.fp16_kv_bytes(caches[0]->offset());
    ++r.n_windows;
    if (params.on_window) {
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      params.on_window(r.n_windows, n_windows, r);
    }
  }
  trim_caches(caches, caches[0]->offset());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace veloxquant::runtime
