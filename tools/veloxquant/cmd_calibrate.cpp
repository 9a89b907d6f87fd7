// veloxquant calibrate: KV samples → codebook artifact, with per-layer progress and a summary.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common.h"
#include "subcommand.h"
#include "veloxquant/calibrate.h"
#include "veloxquant/error.h"
#include "veloxquant/synthetic.h"

namespace vqcli {
namespace {

/// `--kv FILE`: a KV samples safetensors file (docs/kv-samples.md).
class KvFileSource final : public KvSource {
 public:
  void configure(CLI::App& app) override {
    opt_ = app.add_option("--kv", path_, "KV samples file (safetensors: layers.{i}.keys / layers.{i}.values)")
               ->check(CLI::ExistingFile);
  }
  bool selected() const override { return opt_ && opt_->count() > 0; }
  std::string usage() const override { return "--kv FILE"; }
  veloxquant::KVSamples load(int64_t max_tokens) override { return veloxquant::KVSamples::load(path_, max_tokens); }

 private:
  std::string path_;
  CLI::Option* opt_ = nullptr;
};
VQ_REGISTER_KV_SOURCE(KvFileSource, "kv-file")

/// `--synthetic`: KV from the synthetic generator (docs/synthetic-kv.md), for trying the tool
/// without a model.
class SyntheticSource final : public KvSource {
 public:
  void configure(CLI::App& app) override {
    opt_ = app.add_flag("--synthetic", flag_, "calibrate on synthetic LLM-like KV instead of a file");
    app.add_option("--synthetic-tokens", tokens_, "synthetic: tokens per layer")->capture_default_str();
    app.add_option("--synthetic-seed", cfg_.seed, "synthetic: model seed")->capture_default_str();
    app.add_option("--synthetic-layers", cfg_.n_layers, "synthetic: layers")->capture_default_str();
  }
  bool selected() const override { return opt_ && opt_->count() > 0; }
  std::string usage() const override { return "--synthetic"; }
  veloxquant::KVSamples load(int64_t max_tokens) override {
    const int64_t n = max_tokens > 0 ? std::min(max_tokens, tokens_) : tokens_;
    return veloxquant::SyntheticKVModel(cfg_).generate(n, 0, /*sequence_seed=*/1).kv;
  }

 private:
  veloxquant::SyntheticKVConfig cfg_;
  int64_t tokens_ = 4096;
  bool flag_ = false;
  CLI::Option* opt_ = nullptr;
};
VQ_REGISTER_KV_SOURCE(SyntheticSource, "synthetic")

class CalibrateCommand final : public Command {
 public:
  void configure(CLI::App& app) override {
    for (const auto& s : registered_kv_sources()) {
      sources_.push_back(s.make());
      sources_.back()->configure(app);
    }
    app.add_option("--keys", keys_, "key quantizer: sub_dim and codebook bits, e.g. d4b8, d4b12")
        ->capture_default_str();
    app.add_option("--values", values_, "value quantizer, e.g. d4b8, d8b8")->capture_default_str();
    app.add_option("--alpha", params_.alpha, "smooth exponent: λ = max|K|^alpha")->capture_default_str();
    app.add_option("--iters", params_.niter, "k-means iterations (at most)")->capture_default_str();
    app.add_option("--seed", params_.seed, "random seed (k-means)")->capture_default_str();
    app.add_option("--points-per-centroid", params_.max_points_per_centroid,
                   "k-means trains on at most 2^bits x this many sub-vectors (0: all)")
        ->capture_default_str();
    app.add_option("--max-tokens", max_tokens_, "use at most this many tokens per layer (0: all)")
        ->capture_default_str();
    app.add_option("--eval-vectors", params_.max_eval_vectors,
                   "head vectors per layer used to measure reconstruction errors (0: all)")
        ->capture_default_str();
    app.add_flag("--no-transforms", no_transforms_,
                 "train keys without smooth and Hadamard (the ablation; the artifact records it)");
    app.add_flag("--no-int8-key-grid", no_grid_,
                 "write the key codebook as k-means left it instead of on its int8 grid (the caches snap it to the "
                 "grid at load unless they are told not to: KVCacheConfig::int8_key_grid)");
    app.add_flag("--skip-ablation", skip_ablation_,
                 "do not train the untransformed key codebook used for the 'without transforms' column");
    app.add_option("--threads", params_.n_threads, "CPU threads (0: all cores)")->capture_default_str();
    app.add_option("-o,--output", output_, "artifact to write (.safetensors)")->required();
    app.add_option("--json", json_, "also write the summary as JSON to this path ('-' = stdout)");
    app.add_flag("--progress", progress_, "show progress bars even when stderr is not a terminal");
  }

  int run() override {
    KvSource* src = nullptr;
    std::string choices;
    for (auto& s : sources_) {
      choices += (choices.empty() ? "" : " or ") + s->usage();
      if (!s->selected()) continue;
      if (src) VQ_THROW(ValueError, "calibrate: give one input source (" << choices << "), not several");
      src = s.get();
    }
    if (!src) VQ_THROW(ValueError, "calibrate: no input: give " << choices);
    params_.key_spec = veloxquant::PQSpec::parse(keys_);
    params_.value_spec = veloxquant::PQSpec::parse(values_);
    params_.use_smooth = params_.use_hadamard = !no_transforms_;
    params_.measure_untransformed = !skip_ablation_ && !no_transforms_;
    params_.int8_key_grid = !no_grid_;

    veloxquant::KVSamples samples = src->load(max_tokens_);
    std::fprintf(stderr, "calibrating %d layers x %d kv heads x head_dim %d, %lld tokens per layer, keys %s, values %s\n",
                 samples.n_layers, samples.n_kv_heads, samples.head_dim, (long long)samples.max_tokens(),
                 params_.key_spec.str().c_str(), params_.value_spec.str().c_str());

    const bool show = progress_ || stderr_is_tty();
    std::unique_ptr<ProgressBar> bar;
    int bar_layer = -1;
    params_.on_progress = [&](const veloxquant::CalibrationProgress& p) {
      if (p.layer != bar_layer) {
        if (bar) bar->finish();
        bar = std::make_unique<ProgressBar>(strf("layer %d/%d", p.layer + 1, p.n_layers), show);
        bar_layer = p.layer;
      }
      if (p.stage == "done") {
        bar->finish("done");
        return;
      }
      bar->update(p.fraction, p.n_iter ? strf("%s, k-means %d/%d", p.stage.c_str(), p.iter, p.n_iter) : p.stage);
    };
    veloxquant::CalibrationResult res = veloxquant::calibrate(samples, params_);
    bar.reset();
    res.artifact.extra["created_by"] = "veloxquant " VQ_VERSION " calibrate";
    res.artifact.save(output_);

    Table t({"layer", "tokens", "key err", "key err (no transforms)", "value err", "seconds"});
    nlohmann::json jl = nlohmann::json::array();
    for (const auto& L : res.layers) {
      const bool has_raw = L.key_error_untransformed >= 0;
      t.add_row({std::to_string(L.layer), std::to_string(samples.n_tokens(L.layer)), strf("%.5f", L.key_error),
                 has_raw ? strf("%.5f", L.key_error_untransformed) : std::string("-"), strf("%.5f", L.value_error),
                 strf("%.1f", L.seconds)});
      jl.push_back({{"layer", L.layer},
                    {"tokens", samples.n_tokens(L.layer)},
                    {"key_error", L.key_error},
                    {"key_error_untransformed", has_raw ? nlohmann::json(L.key_error_untransformed) : nullptr},
                    {"value_error", L.value_error},
                    {"seconds", L.seconds}});
    }
    std::printf("Reconstruction error (relative MSE ||x - x^||^2 / ||x||^2; keys in the original space).\n");
    std::printf("Values are never transformed, so their error is the same with and without the transforms.\n");
    std::printf("Key transforms: %s.\n\n", no_transforms_ ? "none" : "smooth (alpha) + Hadamard");
    t.print();
    std::printf("\nwrote %s (%d layers, keys %s, values %s) in %.1f s\n", output_.c_str(), res.artifact.n_layers,
                params_.key_spec.str().c_str(), params_.value_spec.str().c_str(), res.seconds);
    if (!json_.empty()) {
      nlohmann::json j = {{"artifact", output_},
                          {"source", samples.source},
                          {"keys", params_.key_spec.str()},
                          {"values", params_.value_spec.str()},
                          {"alpha", params_.alpha},
                          {"transforms", !no_transforms_},
                          {"int8_key_grid", !no_grid_},
                          {"seconds", res.seconds},
                          {"layers", jl}};
      write_json(j, json_);
    }
    return 0;
  }

 private:
  std::vector<std::unique_ptr<KvSource>> sources_;
  veloxquant::CalibrationParams params_;
  std::string keys_ = "d4b12", values_ = "d8b8", output_, json_;
  int64_t max_tokens_ = 0;
  bool no_transforms_ = false, skip_ablation_ = false, progress_ = false, no_grid_ = false;
};

VQ_REGISTER_COMMAND(CalibrateCommand, "calibrate", "Train smooth factors and codebooks from KV samples")

}  // namespace
}  // namespace vqcli
