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
