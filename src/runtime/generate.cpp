// generate.cpp — the generation loop: prefill in chunks, then one token per forward call.
#include "veloxquant/runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "veloxquant/error.h"
#include "veloxquant/runtime/tokenizer.h"

namespace veloxquant::runtime {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Length of the longest proper prefix of any stop string that `text` ends with: that much
// text must be held back because the next token may complete a stop string.
size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops) {
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

// Earliest position at which any stop string occurs in text, or npos.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops, size_t from) {
  size_t best = std::string::npos;
  for (const auto& s : stops) {
    const size_t p = text.find(s, from);
    if (p != std::string::npos && p < best) best = p;
  }
  return best;
}

}  // namespace

GenerateResult generate(const Model& model, LayerCaches& caches, std::span<const int32_t> prompt,
                        const GenerateParams& params, const Tokenizer* tokenizer, const StreamCallback& on_text) {
  VQ_CHECK_VALUE(!prompt.empty(), "generate: empty prompt");
  VQ_CHECK_VALUE(params.max_tokens >= 0, "generate: max_tokens must be >= 0, got " << params.max_tokens);
  VQ_CHECK_VALUE(params.prefill_chunk > 0, "generate: prefill_chunk must be > 0, got " << params.prefill_chunk);
  VQ_CHECK_VALUE(!caches.empty(), "generate: no caches");
  for (const auto& s : params.stop_strings) VQ_CHECK_VALUE(!s.empty(), "generate: empty stop string");
  params.sampler.validate();
  const int64_t n = int64_t(prompt.size());
  int64_t cached = caches[0]->offset();
  VQ_CHECK_VALUE(cached <= n, "generate: the caches hold " << cached << " tokens, more than the prompt's " << n);
  if (cached == n) {  // everything cached: recompute the last token to get its logits
    trim_caches(caches, 1);
    --cached;
  }

  GenerateResult res;
  GenerateStats& st = res.stats;
  st.cached_tokens = cached;
  st.prompt_tokens = n - cached;
  ForwardOptions fo;
  fo.path = params.path;
  auto forward = [&](std::span<const int32_t> t) {
    return params.forward ? params.forward(t, caches, fo) : model.forward(t, caches, fo);
  };

  const auto t_prefill = Clock::now();
  std::vector<float> logits;
  for (int64_t i = cached; i < n; i += params.prefill_chunk) {
    const int64_t len = std::min<int64_t>(params.prefill_chunk, n - i);
    logits = forward(prompt.subspan(size_t(i), size_t(len)));
    if (params.on_prefill) params.on_prefill(i + len - cached, n - cached);
  }
  st.prefill_seconds = seconds_since(t_prefill);

  std::vector<int32_t> history(prompt.begin(), prompt.end());
  Sampler sampler(params.sampler);
  std::optional<StreamDecoder> decoder;
  if (tokenizer) {
    decoder.emplace(*tokenizer, /*skip_special_tokens=*/true);
    // Decode in the prompt's context (a sentencepiece "▁word" right after the prompt keeps its
    // space); the last few prompt tokens are context enough.
    const size_t ctx = std::min<size_t>(prompt.size(), 16);
    decoder->prime(prompt.subspan(prompt.size() - ctx));
  }
  size_t emitted = 0;  // bytes of res.text handed to on_text
  bool stopped = false;
  auto emit_upto = [&](size_t end) {
    if (end > emitted) {
      if (on_text && !on_text(res.text.substr(emitted, end - emitted))) stopped = true;
      emitted = end;
    }
  };

  const auto t_decode = Clock::now();
  st.stop_reason = "max tokens";
  for (int step = 0; step < params.max_tokens; ++step) {
    const int32_t id = sampler.sample(logits, history);
    if (std::find(params.stop_ids.begin(), params.stop_ids.end(), id) != params.stop_ids.end()) {
      st.stop_reason = "eos";
      break;
    }
    res.tokens.push_back(id);
    history.push_back(id);
    if (decoder) {
      const size_t before = res.text.size();
      res.text += decoder->push(id);
      if (!params.stop_strings.empty()) {
        const size_t from = before >= 64 ? before - 64 : 0;  // a stop string may straddle pieces
        const size_t p = find_stop(res.text, params.stop_strings, std::min(from, emitted));
        if (p != std::string::npos) {
          res.text.resize(p);
          emit_upto(p);
          st.stop_reason = "stop string";
          break;
        }
        emit_upto(res.text.size() - stop_holdback(res.text, params.stop_strings));
      } else {
        emit_upto(res.text.size());
      }
      if (stopped) {
        st.stop_reason = "stopped by caller";
        break;
      }
    }
    if (step + 1 == params.max_tokens) break;  // no forward for a token nobody will sample after
    const int32_t one[1] = {id};
    logits = forward(std::span<const int32_t>(one, 1));
    ++st.decode_steps;
  }
  st.decode_seconds = seconds_since(t_decode);
  if (decoder && st.stop_reason != "stop string") {
    res.text += decoder->flush();
    if (!params.stop_strings.empty()) {
      const size_t p = find_stop(res.text, params.stop_strings, 0);
      if (p != std::string::npos) res.text.resize(p), st.stop_reason = "stop string";
    }
    if (!stopped) emit_upto(res.text.size());
  }
  st.generated_tokens = int64_t(res.tokens.size());
  st.kv_bytes = caches_nbytes(caches);
  st.kv_fp16_bytes = model.fp16_kv_bytes(caches[0]->offset());
  return res;
}

}  // namespace veloxquant::runtime
