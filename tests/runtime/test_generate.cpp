// Generation with a tokenizer: the tiny tokenizers agree with Hugging Face tokenizers,
// streamed text equals the returned text, stop strings cut the text at their first
// occurrence (also when it spans tokens), sampling is reproducible for a seed.
#include <cstdio>

#include <gtest/gtest.h>

#include "runtime_test_util.h"
#include "veloxquant/runtime/generate.h"
#include "veloxquant/runtime/model.h"
#include "veloxquant/runtime/tokenizer.h"

using namespace veloxquant;
using namespace veloxquant::runtime;

namespace {
std::unique_ptr<Model> load(const std::string& name) {
  ModelOptions o;
  o.n_threads = 2;
  return Model::load(vqtest::tiny_dir(name), o);
}
}  // namespace

TEST(RuntimeGenerate, TinyTokenizersMatchHuggingFaceTokenizers) {
  for (const char* name : {"tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"}) {
    const auto ref = vqtest::load_reference(name);
    ASSERT_FALSE(ref.tok_ids.empty()) << name;
    const Tokenizer tok = Tokenizer::from_file(vqtest::tiny_dir(name) / "tokenizer.json");
    EXPECT_EQ(tok.encode(ref.tokenizer_text, true), ref.tok_ids) << name;
    EXPECT_EQ(tok.decode(ref.tok_ids, true), ref.tokenizer_text) << name;
  }
}

TEST(RuntimeGenerate, StreamedTextEqualsResultAndStopStringsCut) {
  const auto m = load("tiny-llama");
  const Tokenizer tok = Tokenizer::from_file(m->dir() / "tokenizer.json");
  const std::vector<int32_t> prompt = tok.encode("the keys and the values", true);
  ASSERT_EQ(prompt[0], 286);  // <|bos|>
  CacheOptions co;
  co.n_threads = 2;
  GenerateParams gp;
  gp.max_tokens = 24;
  std::string streamed;
  LayerCaches c1 = make_caches(*m, co);
  const GenerateResult r = generate(*m, c1, prompt, gp, &tok, [&](const std::string& piece) {
    streamed += piece;
    return true;
  });
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.text, tok.decode(r.tokens, true));
  ASSERT_GE(r.text.size(), 8u) << r.text;

  // A stop string taken from the middle of that text: generation stops there, the text is
  // cut before it, and nothing past the cut was streamed.
  const std::string stop = r.text.substr(r.text.size() / 2, 3);
  const size_t first = r.text.find(stop);
  gp.stop_strings = {stop};
  std::string streamed2;
  LayerCaches c2 = make_caches(*m, co);
  const GenerateResult r2 = generate(*m, c2, prompt, gp, &tok, [&](const std::string& piece) {
    streamed2 += piece;
    return true;
  });
  EXPECT_EQ(r2.stats.stop_reason, "stop string");
  EXPECT_EQ(r2.text, r.text.substr(0, first));
  EXPECT_EQ(streamed2, r2.text);
  EXPECT_LT(r2.tokens.size(), r.tokens.size());

  // The callback can stop generation.
  LayerCaches c3 = make_caches(*m, co);
  gp.stop_strings.clear();
  int calls = 0;
  const GenerateResult r3 = generate(*m, c3, prompt, gp, &tok, [&](const std::string&) { return ++calls < 2; });
  EXPECT_EQ(r3.stats.stop_reason, "stopped by caller");
  EXPECT_LT(r3.tokens.size(), r.tokens.size());
}

TEST(RuntimeGenerate, SeededSamplingIsReproducible) {
  const auto m = load("tiny-qwen3");
  const Tokenizer tok = Tokenizer::from_file(m->dir() / "tokenizer.json");
  const std::vector<int32_t> prompt = tok.encode("scaling the keys", true);
  CacheOptions co;
  co.n_threads = 2;
  GenerateParams gp;
  gp.max_tokens = 16;
  gp.sampler.temperature = 1.0f;
  gp.sampler.top_k = 50;
  gp.sampler.top_p = 0.95f;
  gp.sampler.repetition_penalty = 1.3f;
  gp.sampler.seed = 1234;
  LayerCaches a = make_caches(*m, co), b = make_caches(*m, co);
  const GenerateResult ra = generate(*m, a, prompt, gp, &tok);
  const GenerateResult rb = generate(*m, b, prompt, gp, &tok);
  EXPECT_EQ(ra.tokens, rb.tokens);
  EXPECT_EQ(ra.text, rb.text);
  gp.sampler.seed = 99;
  LayerCaches c = make_caches(*m, co);
  const GenerateResult rc = generate(*m, c, prompt, gp, &tok);
  EXPECT_NE(ra.tokens, rc.tokens);
}

// The prefill reports each chunk (prompt tokens run so far, tokens to run), counting from the
// tokens the caches already hold; the generated tokens do not depend on the callback.
TEST(RuntimeGenerate, PrefillReportsEveryChunkAfterTheCachedTokens) {
  const auto m = load("tiny-qwen2");
  std::vector<int32_t> prompt;
  for (int i = 0; i < 13; ++i) prompt.push_back(int32_t(7 * i + 3) % m->config().vocab_size);
  CacheOptions co;
  co.n_threads = 2;
  GenerateParams gp;
  gp.max_tokens = 4;
  gp.prefill_chunk = 5;
  LayerCaches plain = make_caches(*m, co);
  const GenerateResult want = generate(*m, plain, prompt, gp);
  std::vector<std::pair<int64_t, int64_t>> seen;
  gp.on_prefill = [&](int64_t done, int64_t total) { seen.emplace_back(done, total); };
  LayerCaches c = make_caches(*m, co);
  const GenerateResult got = generate(*m, c, prompt, gp);
  EXPECT_EQ(got.tokens, want.tokens);
  const std::vector<std::pair<int64_t, int64_t>> expect = {{5, 13}, {10, 13}, {13, 13}};
  EXPECT_EQ(seen, expect);
  // Six prompt tokens already cached: 7 to run, in chunks of 5 and 2.
  LayerCaches warm = make_caches(*m, co);
  m->forward(std::span<const int32_t>(prompt.data(), 6), warm);
  seen.clear();
  const GenerateResult cont = generate(*m, warm, prompt, gp);
  EXPECT_EQ(cont.stats.cached_tokens, 6);
  const std::vector<std::pair<int64_t, int64_t>> expect_cont = {{5, 7}, {7, 7}};
  EXPECT_EQ(seen, expect_cont);
}
