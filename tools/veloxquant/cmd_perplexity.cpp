// cmd_perplexity.cpp — `veloxquant perplexity`: perplexity of a text file through a KV cache;
// for VecInfer caches the fp16 perplexity of the same windows is printed beside it. With
// `--device cuda` the forward pass and both caches live on the GPU (the VecInfer one attends
// on its codes with the CUDA kernels, as `generate --device cuda` does).
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "runtime_options.h"
#include "subcommand.h"
#include "veloxquant/runtime/generate.h"
#include "veloxquant/runtime/tokenizer.h"

namespace vqcli {
namespace {

struct PerplexityArgs {
  ModelArgs model;
  CacheArgs cache;
  std::string text_file;
  int64_t ctx = 512;
  int64_t chunk = 1;
  int64_t max_windows = 0;
  bool no_bos = false;
  bool progress = false;
};

int run_perplexity(const PerplexityArgs& a) {
  using namespace veloxquant;
  using namespace veloxquant::runtime;
  const auto model = load_model(a.model);
  const std::unique_ptr<CudaModel> cuda_model = device_model(a.model, *model);
  const Tokenizer tok = Tokenizer::from_file(std::filesystem::path(a.model.model_dir) / "tokenizer.json");
  const std::string text = read_text_file(a.text_file);
  const std::vector<int32_t> tokens = tok.encode(text, /*add_special_tokens=*/false);
  PerplexityParams pp;
  pp.ctx = a.ctx;
  pp.chunk = a.chunk;
  pp.max_windows = a.max_windows;
  if (!a.no_bos && tok.adds_bos()) pp.bos = tok.bos_id();
  if (cuda_model)
    pp.forward = [&](std::span<const int32_t> t, LayerCaches& c, const ForwardOptions& o) {
      return cuda_model->forward(t, c, o);
    };

  const CacheOptions co = cache_options(a.cache, a.model.threads);
  std::fprintf(stderr, "model: %s (on %s)\n", model->config().describe().c_str(),
               cuda_model ? device_name(cuda_model->device()).c_str() : "the cpu");
  std::fprintf(stderr, "text: %s, %zu tokens; windows of %lld tokens%s, %lld token(s) per forward\n",
               a.text_file.c_str(), tokens.size(), (long long)a.ctx, pp.bos ? " (BOS first)" : "",
               (long long)a.chunk);

  const bool show = a.progress || stderr_is_tty();
  auto run_one = [&](const CacheOptions& o) {
    LayerCaches caches = layer_caches(cuda_model.get(), *model, o, /*quiet=*/false);
    const std::string desc = caches[0]->describe();
    const char* name = o.kind == CacheKind::FP16 ? "fp16" : "vecinfer";
    ProgressBar bar(name, show);
    PerplexityParams p = pp;
    p.on_window = [&](int64_t done, int64_t total, const PerplexityResult& so_far) {
      bar.update(double(done) / double(total),
                 strf("window %lld/%lld, ppl %.4f", (long long)done, (long long)total, so_far.ppl()));
    };
    const PerplexityResult r = perplexity(*model, caches, tokens, p);
    bar.finish(strf("%lld windows, ppl %.4f", (long long)r.n_windows, r.ppl()));
    std::printf("%-9s ppl %10.4f   (%lld tokens scored in %lld windows, %.1f s; KV %s held per window vs fp16 %s)\n",
                name, r.ppl(), (long long)r.n_scored,
                (long long)r.n_windows, r.seconds, human_bytes(double(r.kv_bytes_peak)).c_str(),
                human_bytes(double(r.kv_fp16_bytes)).c_str());
    std::fprintf(stderr, "  cache: %s\n", desc.c_str());
    return r;
  };
  if (co.kind == CacheKind::VecInfer) {
    CacheOptions fp = co;
    fp.kind = CacheKind::FP16;
    fp.artifact_path.clear();
    const PerplexityResult base = run_one(fp);
    const PerplexityResult q = run_one(co);
    std::printf("vecinfer vs fp16: %+.4f ppl (%+.2f%%)\n", q.ppl() - base.ppl(), 100.0 * (q.ppl() / base.ppl() - 1.0));
  } else {
    run_one(co);
  }
  return 0;
}

class PerplexityCommand final : public Command {
 public:
  void configure(CLI::App& app_ref) override {
    CLI::App* app = &app_ref;
    PerplexityArgs* a = &args_;
    add_model_options(app, a->model);
    add_cache_options(app, a->cache);
    app->add_option("--text", a->text_file, "text file to score")->required()->check(CLI::ExistingFile);
    app->add_option("--ctx", a->ctx, "window length in tokens");
    app->add_option("--chunk", a->chunk, "tokens per forward pass inside a window (1: decode-exact)");
    app->add_option("--max-windows", a->max_windows, "score at most this many windows (0: all)");
    app->add_flag("--no-bos", a->no_bos, "do not prepend BOS to each window");
    app->add_flag("--progress", a->progress, "show progress even when stderr is not a terminal");
  }
  int run() override { return run_perplexity(args_); }

 private:
  PerplexityArgs args_;
};

}  // namespace

VQ_REGISTER_COMMAND(PerplexityCommand, "perplexity", "Perplexity of a text file with an fp16 or VecInfer KV cache (VecInfer: fp16 beside it)")

}  // namespace vqcli
