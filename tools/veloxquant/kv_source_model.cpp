// kv_source_model.cpp — `veloxquant calibrate --model DIR --text FILE`: calibration samples
// collected from the model itself (post-RoPE keys and values of every layer, as its caches
// would receive them), through runtime::collect_kv_samples. Registers itself as a calibrate
// input source (subcommand.h), next to `--kv FILE`. `--device cuda` runs the pass on the GPU
// (CudaModel::forward_nocache: attention in f32 over each window's exact K/V, as the CPU pass,
// so the samples are the CPU's up to summation order).
#include <cstdio>
#include <filesystem>

#include "common.h"
#include "subcommand.h"
#include "veloxquant/error.h"
#include "veloxquant/runtime/generate.h"
#include "veloxquant/runtime/model.h"
#include "veloxquant/runtime/model_cuda.h"
#include "veloxquant/runtime/tokenizer.h"

namespace vqcli {
namespace {

class ModelKvSource final : public KvSource {
 public:
  void configure(CLI::App& app) override {
    model_opt_ = app.add_option("--model", model_dir_,
                                "Hugging Face model directory: collect post-RoPE K/V by running it on --text")
                     ->check(CLI::ExistingDirectory);
    text_opt_ = app.add_option("--text", text_file_, "calibration text (with --model)")->check(CLI::ExistingFile);
    app.add_option("--ctx", ctx_, "with --model: tokens per forward pass (positions restart per window)")
        ->capture_default_str();
    app.add_option("--device", device_, "with --model: run the model on cpu or cuda")
        ->check(CLI::IsMember({"cpu", "cuda"}))
        ->capture_default_str();
    app_ = &app;
  }
  bool selected() const override {
    return (model_opt_ && model_opt_->count() > 0) || (text_opt_ && text_opt_->count() > 0);
  }
  std::string usage() const override { return "--model DIR --text FILE"; }

  veloxquant::KVSamples load(int64_t max_tokens) override {
    using namespace veloxquant;
    using namespace veloxquant::runtime;
    if (model_dir_.empty() || text_file_.empty())
      VQ_THROW(ValueError, "calibrate: --model DIR and --text FILE go together");
    const auto model = Model::load(model_dir_);
    const std::unique_ptr<CudaModel> cuda_model = device_ == "cuda" ? CudaModel::create(*model) : nullptr;
    const Tokenizer tok = Tokenizer::from_file(std::filesystem::path(model_dir_) / "tokenizer.json");
    const std::vector<int32_t> tokens = tok.encode(read_text_file(text_file_), /*add_special_tokens=*/false);
    VQ_CHECK_VALUE(!tokens.empty(), "calibrate: " << text_file_ << " encodes to no tokens");
    CollectParams cp;
    cp.ctx = ctx_;
    cp.max_tokens = max_tokens;
    if (tok.adds_bos()) cp.bos = tok.bos_id();
    if (cuda_model)
      cp.forward_nocache = [&](std::span<const int32_t> t, DType kv, bool all, const KVObserver& obs) {
        return cuda_model->forward_nocache(t, kv, all, obs);
      };
    std::fprintf(stderr, "collecting K/V: %s on %s (%zu tokens, windows of %lld, on %s)\n",
                 model->config().describe().c_str(), text_file_.c_str(), tokens.size(), (long long)ctx_,
                 cuda_model ? device_name(cuda_model->device()).c_str() : "the cpu");
    // calibrate's own --progress flag (added after the sources' options) also shows this bar
    const bool show = (app_ && app_->count("--progress") > 0) || stderr_is_tty();
    ProgressBar bar("collect", show);
    cp.on_window = [&](int64_t collected, int64_t total) {
      bar.update(double(collected) / double(total),
                 strf("%lld/%lld tokens", (long long)collected, (long long)total));
    };
    KVSamples s = collect_kv_samples(*model, tokens, cp);
    bar.finish(strf("%lld tokens", (long long)s.max_tokens()));
    s.source = "model " + model_dir_ + ", text " + text_file_ + ", " + std::to_string(s.max_tokens()) +
               " tokens in windows of " + std::to_string(ctx_);
    return s;
  }

 private:
  std::string model_dir_, text_file_;
  int64_t ctx_ = 512;
  std::string device_ = "cpu";
  CLI::App* app_ = nullptr;
  CLI::Option* model_opt_ = nullptr;
  CLI::Option* text_opt_ = nullptr;
};

}  // namespace

VQ_REGISTER_KV_SOURCE(ModelKvSource, "model")

}  // namespace vqcli
