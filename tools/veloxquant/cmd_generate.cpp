// cmd_generate.cpp — `veloxquant generate`: text generation with a Hugging Face checkpoint and
// an fp16 or VecInfer KV cache; reports prefill/decode speed and the KV bytes held.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime_options.h"
#include "subcommand.h"
#include "veloxquant/runtime/generate.h"
#include "veloxquant/runtime/model_cuda.h"
#include "veloxquant/runtime/prompt_cache.h"
#include "veloxquant/runtime/tokenizer.h"

namespace vqcli {
namespace {

struct GenerateArgs {
  ModelArgs model;
  CacheArgs cache;
  std::string prompt;
  std::string prompt_file;
  int max_tokens = 256;
  float temperature = -1.0f;  // < 0: generation_config.json's, else greedy
  int top_k = -1;
  float top_p = -1.0f;
  float repetition_penalty = -1.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool raw = false;
  std::string prompt_cache;       // load (when the file exists) / save
  std::string save_prompt_cache;  // save after the prefill
  int prefill_chunk = 512;
  bool quiet = false;
  bool progress = false;
};

int run_generate(const GenerateArgs& a) {
  using namespace veloxquant;
  using namespace veloxquant::runtime;
  const auto model = load_model(a.model);
  const std::unique_ptr<CudaModel> cuda_model = device_model(a.model, *model);
  auto forward = [&](std::span<const int32_t> t, LayerCaches& c, const ForwardOptions& o) {
    return cuda_model ? cuda_model->forward(t, c, o) : model->forward(t, c, o);
  };
  const Tokenizer tok = Tokenizer::from_file(std::filesystem::path(a.model.model_dir) / "tokenizer.json");

  std::string text = a.prompt;
  if (!a.prompt_file.empty()) text = read_text_file(a.prompt_file);
  if (text.empty() && a.prompt_cache.empty()) VQ_THROW(ValueError, "give --prompt TEXT or --prompt-file FILE");
  std::vector<int32_t> prompt = tok.encode(text, /*add_special_tokens=*/!a.raw);

  LayerCaches caches;
  bool loaded = false;
  if (!a.prompt_cache.empty() && std::filesystem::exists(a.prompt_cache)) {
    PromptCache pc = load_prompt_cache(a.prompt_cache);
    check_prompt_cache_fits(pc, *model);
    // The cached tokens must be a prefix of the prompt; an empty --prompt continues them.
    if (text.empty()) prompt = pc.tokens;
    VQ_CHECK_VALUE(pc.tokens.size() <= prompt.size() && std::equal(pc.tokens.begin(), pc.tokens.end(), prompt.begin()),
                   "--prompt-cache " << a.prompt_cache << " holds " << pc.tokens.size()
                                     << " tokens that are not a prefix of this prompt");
    caches = std::move(pc.caches);
    loaded = true;
    if (!a.quiet)
      std::fprintf(stderr, "prompt cache: %zu tokens loaded from %s (%s)\n", pc.tokens.size(), a.prompt_cache.c_str(),
                   caches[0]->class_name().c_str());
  } else {
    caches = layer_caches(cuda_model.get(), *model, cache_options(a.cache, a.model.threads), a.quiet);
  }
  VQ_CHECK_VALUE(!prompt.empty(), "the prompt encodes to no tokens");

  const std::string save_path = !a.save_prompt_cache.empty() ? a.save_prompt_cache
                                : (!a.prompt_cache.empty() && !loaded) ? a.prompt_cache
                                                                         : std::string();
  // A prefill bar where the prompt takes more than one forward call (on a terminal or with
  // --progress; never with --quiet): long prompts on a CPU take minutes.
  const bool show = !a.quiet && (a.progress || stderr_is_tty());
  auto prefill_bar = [&](int64_t to_run) {
    return std::make_unique<ProgressBar>("prefill", show && to_run > a.prefill_chunk);
  };
  if (!save_path.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t done = caches[0]->offset();
    const auto bar = prefill_bar(int64_t(prompt.size()) - done);
    for (int64_t i = done; i < int64_t(prompt.size()); i += a.prefill_chunk) {
      const int64_t len = std::min<int64_t>(a.prefill_chunk, int64_t(prompt.size()) - i);
      forward(std::span<const int32_t>(prompt.data() + i, size_t(len)), caches, ForwardOptions{});
      bar->update(double(i + len - done) / double(int64_t(prompt.size()) - done),
                  strf("%lld/%lld tokens", (long long)(i + len - done), (long long)(int64_t(prompt.size()) - done)));
    }
    bar->finish(strf("%lld tokens", (long long)(int64_t(prompt.size()) - done)));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    save_prompt_cache(save_path, caches, prompt, {{"model", a.model.model_dir}});
    if (!a.quiet)
      std::fprintf(stderr, "prompt cache: %zu tokens encoded (%lld new, %.1f tokens/s) and saved to %s\n", prompt.size(),
                   (long long)(int64_t(prompt.size()) - done), secs > 0 ? double(int64_t(prompt.size()) - done) / secs : 0.0,
                   save_path.c_str());
  }

  GenerateParams gp;
  gp.max_tokens = a.max_tokens;
  gp.prefill_chunk = a.prefill_chunk;
  if (cuda_model) gp.forward = forward;
  std::unique_ptr<ProgressBar> bar;
  gp.on_prefill = [&](int64_t done, int64_t total) {
    if (!bar) bar = prefill_bar(total);
    bar->update(double(done) / double(total), strf("%lld/%lld tokens", (long long)done, (long long)total));
    if (done == total) bar->finish(strf("%lld tokens", (long long)total));  // before the first generated text
  };
  const GenerationConfig& gc = model->generation_config();
  const bool sample_default = gc.do_sample.value_or(false);
  gp.sampler.temperature = a.temperature >= 0 ? a.temperature
                           : sample_default   ? float(gc.temperature.value_or(1.0))
                                              : 0.0f;
  gp.sampler.top_k = a.top_k >= 0 ? a.top_k : (sample_default ? gc.top_k.value_or(0) : 0);
  gp.sampler.top_p = a.top_p > 0 ? a.top_p : (sample_default ? float(gc.top_p.value_or(1.0)) : 1.0f);
  gp.sampler.repetition_penalty =
      a.repetition_penalty > 0 ? a.repetition_penalty : float(gc.repetition_penalty.value_or(1.0));
  gp.sampler.seed = a.seed;
  gp.stop_strings = a.stop;
  if (!a.ignore_eos) {
    gp.stop_ids = gc.eos_token_ids;
    for (int32_t e : model->config().eos_token_ids)
      if (std::find(gp.stop_ids.begin(), gp.stop_ids.end(), e) == gp.stop_ids.end()) gp.stop_ids.push_back(e);
    if (auto e = tok.eos_id(); e && std::find(gp.stop_ids.begin(), gp.stop_ids.end(), *e) == gp.stop_ids.end())
      gp.stop_ids.push_back(*e);
  }

  if (!a.quiet) {
    std::fprintf(stderr, "model: %s (%s, %s weights, on %s)\n", model->config().describe().c_str(),
                 a.model.model_dir.c_str(), model->weights().dominant_dtype().c_str(),
                 cuda_model ? device_name(cuda_model->device()).c_str() : "the cpu");
    std::fprintf(stderr, "cache: %s\n", caches[0]->describe().c_str());
    std::fprintf(stderr, "prompt: %zu tokens\n", prompt.size());
  }
  const GenerateResult r = generate(*model, caches, prompt, gp, &tok, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const GenerateStats& s = r.stats;
  if (!a.quiet) {
    std::fprintf(stderr, "prefill: %lld tokens in %.3f s = %.1f tokens/s%s\n", (long long)s.prompt_tokens,
                 s.prefill_seconds, s.prefill_tps(),
                 s.cached_tokens ? (" (" + std::to_string(s.cached_tokens) + " more from the prompt cache)").c_str() : "");
    std::fprintf(stderr, "decode: %lld tokens, %lld steps in %.3f s = %.1f tokens/s (stop: %s)\n",
                 (long long)s.generated_tokens, (long long)s.decode_steps, s.decode_seconds, s.decode_tps(),
                 s.stop_reason.c_str());
    if (cuda_model && s.decode_steps > 0) {
      const DecodeGraphStats g = cuda_model->graph_stats();
      if (g.replays > 0)
        std::fprintf(stderr,
                     "decode steps: %lld CUDA graph replays (%lld kernels a step), %lld captures (%lld instantiated), "
                     "%lld eager\n",
                     (long long)g.replays, (long long)g.kernel_nodes, (long long)g.captures,
                     (long long)g.instantiations, (long long)g.eager_steps);
      else
        std::fprintf(stderr, "decode steps: launched from the host (%s)\n",
                     (!g.off_reason.empty() ? g.off_reason : g.last_eager_reason).c_str());
    }
    std::fprintf(stderr, "KV cache: %s held for %lld tokens (capacity slack, codebooks, window included); fp16 K/V of those tokens: %s (held/fp16 = %.3f)\n",
                 human_bytes(double(s.kv_bytes)).c_str(), (long long)caches[0]->offset(),
                 human_bytes(double(s.kv_fp16_bytes)).c_str(),
                 s.kv_fp16_bytes > 0 ? double(s.kv_bytes) / double(s.kv_fp16_bytes) : 0.0);
  }
  return 0;
}

class GenerateCommand final : public Command {
 public:
  void configure(CLI::App& app_ref) override {
    CLI::App* app = &app_ref;
    GenerateArgs* a = &args_;
    add_model_options(app, a->model);
    add_cache_options(app, a->cache);
    app->add_option("--prompt,-p", a->prompt, "prompt text");
    app->add_option("--prompt-file", a->prompt_file, "read the prompt from a file")->check(CLI::ExistingFile);
    app->add_option("--max-tokens,-n", a->max_tokens, "new tokens at most");
    app->add_option("--temperature", a->temperature, "0: greedy (default unless generation_config.json samples)");
    app->add_option("--top-k", a->top_k, "keep the k most likely tokens (0: off)");
    app->add_option("--top-p", a->top_p, "nucleus sampling threshold in (0, 1]");
    app->add_option("--repetition-penalty", a->repetition_penalty, "> 1 discourages repeats (HF rule)");
    app->add_option("--seed", a->seed, "sampling seed");
    app->add_option("--stop", a->stop, "stop when the output contains this string (repeatable)");
    app->add_flag("--ignore-eos", a->ignore_eos, "do not stop at the EOS token");
    app->add_flag("--raw", a->raw, "do not add special tokens (BOS) to the prompt");
    app->add_option("--prompt-cache", a->prompt_cache,
                  "load the encoded prompt from FILE if it exists, else encode the prompt and save it there");
    app->add_option("--save-prompt-cache", a->save_prompt_cache, "save the encoded prompt to FILE");
    app->add_option("--prefill-chunk", a->prefill_chunk, "prompt tokens per forward pass");
    app->add_flag("--quiet,-q", a->quiet, "print only the generated text");
    app->add_flag("--progress", a->progress, "show the prefill's progress even when stderr is not a terminal");
  }
  int run() override { return run_generate(args_); }

 private:
  GenerateArgs args_;
};

}  // namespace

VQ_REGISTER_COMMAND(GenerateCommand, "generate", "Generate text with a Hugging Face Llama/Mistral/Qwen checkpoint and an fp16 or VecInfer KV cache")

}  // namespace vqcli
