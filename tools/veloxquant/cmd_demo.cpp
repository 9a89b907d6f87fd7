// veloxquant demo: the main job on its embedded default.
//
// Synthesises a model's KV cache (synthetic.h: outlier key channels, RoPE, GQA queries),
// calibrates codebooks on one sequence, fills caches with another (a long context), and
// compares fp16, VecInfer at several bit configurations, VQ without the transforms and the
// KIVI-style 2-bit baseline: bits per element, bytes held, attention-output error against
// exact fp32 attention (attention_ref on the original K/V), and decode-attention time.
// Writes the table to stdout, optionally JSON (--json) and a PNG of error vs bits (--plot).
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "common.h"
#include "subcommand.h"
#include "veloxquant/artifact.h"
#include "veloxquant/calibrate.h"
#include "veloxquant/error.h"
#include "veloxquant/evaluate.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/kivi.h"
#include "veloxquant/synthetic.h"
#include "veloxquant/vecinfer_cache.h"

namespace vqcli {
namespace {

using namespace veloxquant;

struct MethodRow {
  std::string name;
  std::string keys, values;  // configuration strings
  double nominal_bits = 0;   // codes only (VecInfer), codes + scale/zero (KIVI), 16 (fp16)
  double effective_bits = 0; // every byte the caches hold / elements
  int64_t bytes = 0;
  double attn_error = 0;
  std::vector<double> layer_errors;
  double decode_ms = 0;
  bool vecinfer = false;
};

MethodRow make_row(std::string name, std::string keys, std::string values, double nominal_bits = 0, bool vecinfer = false) {
  MethodRow r;
  r.name = std::move(name);
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.nominal_bits = nominal_bits;
  r.vecinfer = vecinfer;
  return r;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class DemoCommand final : public Command {
 public:
  void configure(CLI::App& app) override {
    app.add_option("--layers", syn_.n_layers, "synthetic model: layers")->capture_default_str();
    app.add_option("--kv-heads", syn_.n_kv_heads, "synthetic model: kv heads")->capture_default_str();
    app.add_option("--heads", syn_.n_heads, "synthetic model: query heads")->capture_default_str();
    app.add_option("--head-dim", syn_.head_dim, "synthetic model: head_dim")->capture_default_str();
    app.add_option("--ctx", ctx_, "tokens in the caches (the context)")->capture_default_str();
    app.add_option("--calib-tokens", calib_tokens_, "calibration tokens per layer")->capture_default_str();
    app.add_option("--queries", n_queries_, "decode queries per layer for the error (newest positions)")
        ->capture_default_str();
    app.add_option("--residual", residual_, "fp16 residual window (every method)")->capture_default_str();
    app.add_option("--iters", iters_, "k-means iterations for codebooks of <= 10 bits (calibrate: 30)")
        ->capture_default_str();
    app.add_option("--iters-large", iters_large_, "k-means iterations for larger codebooks (12-bit)")
        ->capture_default_str();
    app.add_option("--train-points", train_points_,
                   "k-means trains on at most this many sub-vectors per codebook (and <= 256 per centroid)")
        ->capture_default_str();
    app.add_option("--seed", syn_.seed, "synthetic model seed")->capture_default_str();
    app.add_option("--threads", threads_, "CPU threads (0: all cores)")->capture_default_str();
    app.add_option("--repeats", repeats_, "timed decode repetitions (median)")->capture_default_str();
    app.add_option("--json", json_, "write the table as JSON to this path ('-' = stdout)");
    app.add_option("--plot", plot_, "PNG of attention error vs bits per element (gnuplot)")->capture_default_str();
    app.add_flag("--no-plot", no_plot_, "do not draw the PNG");
    app.add_flag("--progress", progress_, "show progress even when stderr is not a terminal");
  }

  int run() override {
    const auto t_start = std::chrono::steady_clock::now();
    VQ_CHECK_VALUE(ctx_ > n_queries_ && ctx_ >= 2, "demo: --ctx must exceed --queries");
    const bool show = progress_ || stderr_is_tty();
    SyntheticKVModel model(syn_);
    std::printf("veloxquant demo: synthetic model %d layers, %d query / %d kv heads, head_dim %d (seed %llu)\n",
                syn_.n_layers, syn_.n_heads, syn_.n_kv_heads, syn_.head_dim, (unsigned long long)syn_.seed);
    std::printf("  calibration: %lld tokens per layer (demo k-means: %d iterations for <= 10-bit codebooks, %d for\n"
                "               12-bit ones, on at most %lld sub-vectors each; calibrate defaults to 30 iterations)\n",
                (long long)calib_tokens_, iters_, iters_large_, (long long)train_points_);
    std::printf("  evaluation:  context %lld tokens, %d decode queries per layer at the newest positions, "
                "fp16 residual window %d for every method\n",
                (long long)ctx_, n_queries_, residual_);
    std::fflush(stdout);

    ProgressBar gen("synthesise", show);
    const SyntheticSequence calib = model.generate(calib_tokens_, 0, /*sequence_seed=*/1);
    gen.update(0.4, "evaluation sequence");
    const SyntheticSequence eval = model.generate(ctx_, n_queries_, /*sequence_seed=*/2);
    gen.update(0.8, "exact attention");
    SdpaParams ref_params;
    ref_params.n_threads = threads_;
    const std::vector<Tensor> reference = reference_attention(eval, ref_params, /*use_oracle=*/false);
    gen.finish(strf("%.1f s", seconds_since(t_start)));

    // Calibrations: one per distinct (keys, values, transforms).
    struct Vq {
      std::string name, keys, values;
      bool transforms;
    };
    const std::vector<Vq> vqs = {{"VecInfer", "d4b8", "d4b8", true},
                                 {"VecInfer", "d4b12", "d8b8", true},
                                 {"VecInfer", "d8b12", "d8b12", true},
                                 {"VQ, no transforms", "d4b8", "d4b8", false}};
    std::vector<Artifact> artifacts;
    std::vector<CalibrationResult> calib_results;
    for (const auto& v : vqs) {
      CalibrationParams p;
      p.key_spec = PQSpec::parse(v.keys);
      p.value_spec = PQSpec::parse(v.values);
      p.use_smooth = p.use_hadamard = v.transforms;
      // k-means budget: at most train_points_ sub-vectors (and 256 per centroid) per codebook;
      // fewer iterations for 12-bit codebooks, whose Lloyd steps cost 16x those of 8-bit ones.
      const int max_bits = std::max(p.key_spec.codebook_bits, p.value_spec.codebook_bits);
      p.niter = max_bits > 10 ? iters_large_ : iters_;
      p.max_points_per_centroid = int(std::clamp<int64_t>(train_points_ >> max_bits, 1, 256));
      p.max_eval_vectors = 2048;
      p.measure_untransformed = false;
      p.n_threads = threads_;
      ProgressBar bar(strf("calibrate %s/%s%s", v.keys.c_str(), v.values.c_str(), v.transforms ? "" : " (raw)"), show);
      p.on_progress = [&](const CalibrationProgress& pr) {
        bar.update((pr.layer + pr.fraction) / pr.n_layers, strf("layer %d/%d %s", pr.layer + 1, pr.n_layers,
                                                                 pr.stage.c_str()));
      };
      const auto t0 = std::chrono::steady_clock::now();
      calib_results.push_back(calibrate(calib.kv, p));
      artifacts.push_back(calib_results.back().artifact);
      bar.finish(strf("%.1f s", seconds_since(t0)));
    }

    EvaluationParams ep;
    ep.timing_repeats = repeats_;
    ep.sdpa.n_threads = threads_;
    std::vector<MethodRow> rows;
    const double elements = double(syn_.n_layers) * syn_.n_kv_heads * double(ctx_) * syn_.head_dim * 2.0;
    auto run_method = [&](MethodRow row, const std::function<std::unique_ptr<KVCache>(int)>& make) {
      ProgressBar bar(strf("evaluate %s %s/%s", row.name.c_str(), row.keys.c_str(), row.values.c_str()), show);
      bar.update(0.0, "filling caches");
      const auto t0 = std::chrono::steady_clock::now();
      CacheEvaluation ev = evaluate_cache(eval, reference, make, ep);
      row.attn_error = ev.attn_error;
      row.layer_errors = ev.layer_errors;
      row.bytes = ev.bytes;
      row.effective_bits = double(ev.bytes) * 8.0 / elements;
      row.decode_ms = ev.decode_seconds * 1e3;
      if (row.vecinfer) {
        const auto* acc = dynamic_cast<const VecInferAccounting*>(ev.caches.at(0).get());
        if (acc) row.nominal_bits = acc->assigned_avg_bits();
      }
      bar.finish(strf("%.1f s", seconds_since(t0)));
      rows.push_back(row);
    };

    KVCacheConfig fp16cfg;
    fp16cfg.kind = CacheKind::FP16;
    fp16cfg.head_dim = syn_.head_dim;
    fp16cfg.n_kv_heads = syn_.n_kv_heads;
    fp16cfg.n_threads = threads_;
    run_method(make_row("fp16", "-", "-", 16.0), [&](int) { return KVCacheFactory::create(fp16cfg); });
    for (size_t i = 0; i < vqs.size(); ++i) {
      KVCacheConfig base;
      base.fused_sdpa = true;
      base.fused_sdpa_memory_bound = true;
      base.residual_length = residual_;
      base.n_threads = threads_;
      MethodRow r = make_row(vqs[i].name, vqs[i].keys, vqs[i].values, 0, true);
      const Artifact& a = artifacts[i];
      run_method(r, [&](int l) { return create_cache_from_artifact(a, l, base); });
    }
    for (int g : {32, 128}) {
      KiviConfig kc;
      kc.head_dim = syn_.head_dim;
      kc.bits = 2;
      kc.group_size = g;
      kc.residual_length = residual_;
      kc.n_threads = threads_;
      MethodRow r = make_row("KIVI-style", kc.str(), kc.str(), kc.bits_per_element());
      run_method(r, [&](int) { return std::make_unique<KiviKVCache>(kc); });
    }

    // ---- the table ----
    const double fp16_ms = rows[0].decode_ms;
    std::printf("\n");
    Table t({"method", "keys", "values", "bits/elem nominal", "bits/elem effective", "bytes held",
             "attn-output error", "decode attn ms", "vs fp16"});
    for (const auto& r : rows)
      t.add_row({r.name, r.keys, r.values, strf("%.3g", r.nominal_bits), strf("%.3f", r.effective_bits),
                 human_bytes(double(r.bytes)), strf("%.4f", r.attn_error), strf("%.2f", r.decode_ms),
                 strf("%.2fx", r.decode_ms > 0 ? fp16_ms / r.decode_ms : 0.0)});
    t.print();
    std::printf(
        "\nbits/elem nominal: codes only for VQ (the paper's count), codes + fp16 scale/zero for KIVI.\n"
        "bits/elem effective: every byte the %d layers' caches hold at %lld tokens (codes, fp16 window,\n"
        "codebooks and smooth factors as held: f32, plus int8 key rows) / (K and V elements).\n"
        "attn-output error: mean over layers, query heads and %d decode queries of ||o - o_exact|| / ||o_exact||,\n"
        "o_exact = exact fp32 attention (attention_cpu) over the original K/V. decode attn ms: one decode step (q_len 1),\n"
        "median of %d, summed over layers (speedup vs fp16 in the last column; the KIVI-style baseline is a\n"
        "scalar quality reference, not a tuned kernel).\n",
        syn_.n_layers, (long long)ctx_, n_queries_, repeats_);
    const double red = 1.0 - rows[1].attn_error / rows[4].attn_error;
    std::printf("Smooth + Hadamard change the d4b8/d4b8 attention-output error by %+.1f%% (%.4f vs %.4f without).\n",
                -100.0 * red, rows[1].attn_error, rows[4].attn_error);

    const double total = seconds_since(t_start);
    nlohmann::json j;
    j["model"] = {{"layers", syn_.n_layers},   {"heads", syn_.n_heads}, {"kv_heads", syn_.n_kv_heads},
                  {"head_dim", syn_.head_dim}, {"seed", syn_.seed}};
    j["context"] = ctx_;
    j["calibration_tokens"] = calib_tokens_;
    j["queries"] = n_queries_;
    j["residual_length"] = residual_;
    j["kmeans"] = {{"iterations", iters_}, {"iterations_12bit", iters_large_}, {"train_points", train_points_}};
    nlohmann::json jm = nlohmann::json::array();
    for (const auto& r : rows)
      jm.push_back({{"method", r.name},
                    {"keys", r.keys},
                    {"values", r.values},
                    {"bits_per_element_nominal", r.nominal_bits},
                    {"bits_per_element_effective", r.effective_bits},
                    {"bytes", r.bytes},
                    {"attention_output_error", r.attn_error},
                    {"attention_output_error_per_layer", r.layer_errors},
                    {"decode_attention_ms", r.decode_ms}});
    j["methods"] = jm;
    nlohmann::json jc = nlohmann::json::array();
    for (size_t i = 0; i < vqs.size(); ++i)
      jc.push_back({{"keys", vqs[i].keys},
                    {"values", vqs[i].values},
                    {"transforms", vqs[i].transforms},
                    {"key_error_mean", artifacts[i].mean_key_error()},
                    {"value_error_mean", artifacts[i].mean_value_error()},
                    {"seconds", calib_results[i].seconds}});
    j["calibration"] = jc;
    j["seconds"] = total;
    if (!json_.empty()) write_json(j, json_);
    if (!no_plot_) draw_plot(rows);
    std::printf("demo finished in %.1f s\n", seconds_since(t_start));
    return 0;
  }

 private:
  void draw_plot(const std::vector<MethodRow>& rows) {
    namespace fs = std::filesystem;
    const fs::path out(plot_);
    if (out.has_parent_path()) fs::create_directories(out.parent_path());
    // One data block per compressed method (fp16 sits at 16 bits with ~1e-4 error and would
    // squash the rest: it is quoted in the title instead). Filled marker: effective bits;
    // open marker of the same colour: nominal bits.
    const std::string dat = plot_ + ".dat";
    std::vector<std::string> titles;
    double fp16_err = 0;
    {
      FILE* f = std::fopen(dat.c_str(), "w");
      if (!f) VQ_THROW(IoError, "cannot write '" << dat << "'");
      for (const auto& r : rows) {
        if (r.name == "fp16") {
          fp16_err = r.attn_error;
          continue;
        }
        std::string label = r.name + " " + (r.keys == r.values ? r.keys : r.keys + "/" + r.values);
        for (char& c : label)
          if (c == '\'' || c == '"') c = ' ';
        titles.push_back(label);
        std::fprintf(f, "%g %g %g\n\n\n", r.effective_bits, r.attn_error, r.nominal_bits);
      }
      std::fclose(f);
    }
    const std::string script = plot_ + ".gp";
    {
      FILE* f = std::fopen(script.c_str(), "w");
      if (!f) VQ_THROW(IoError, "cannot write '" << script << "'");
      std::fprintf(f,
                   "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1000,650 font ',11' }"
                   " else { set terminal png size 1000,650 }\n"
                   "set output '%s'\n"
                   "set title \"veloxquant demo: attention-output error vs bits per element\\n"
                   "(%d layers, %lld tokens, residual window %d; fp16: 16 bits, error %.1e)\"\n"
                   "set xlabel 'bits per K/V element (filled: effective, all bytes held; open: nominal)'\n"
                   "set ylabel 'attention-output relative error'\n"
                   "set grid\nset key outside right top\nset offsets 0.1, 0.1, 0.02, 0.02\n"
                   "plot ",
                   plot_.c_str(), syn_.n_layers, (long long)ctx_, residual_, fp16_err);
      for (size_t i = 0; i < titles.size(); ++i)
        std::fprintf(f,
                     "%s'%s' index %zu using 1:2 with points pt 7 ps 2 lc %zu title '%s', "
                     "'' index %zu using 3:2 with points pt 6 ps 2 lc %zu notitle",
                     i ? ", " : "", dat.c_str(), i, i + 1, titles[i].c_str(), i, i + 1);
      std::fprintf(f, "\n");
      std::fclose(f);
    }
    const std::string cmd = "gnuplot '" + script + "' 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string output;
    if (p) {
      char buf[256];
      while (std::fgets(buf, sizeof buf, p)) output += buf;
    }
    const int rc = p ? ::pclose(p) : -1;
    if (rc != 0) {
      std::fprintf(stderr, "veloxquant: warning: gnuplot failed (is gnuplot installed?), no plot drawn: %s\n",
                   output.c_str());
      return;
    }
    std::remove(dat.c_str());
    std::remove(script.c_str());
    std::printf("plot: %s\n", plot_.c_str());
  }

  SyntheticKVConfig syn_;
  int64_t ctx_ = 8192;
  int64_t calib_tokens_ = 2048;
  int n_queries_ = 16;
  int residual_ = 128;
  int iters_ = 20;
  int iters_large_ = 8;
  int64_t train_points_ = 65536;
  int threads_ = 0;
  int repeats_ = 5;
  std::string json_, plot_ = "out/demo.png";
  bool no_plot_ = false, progress_ = false;
};

VQ_REGISTER_COMMAND(DemoCommand, "demo",
                    "Synthesise KV, calibrate, fill caches to a long context, compare fp16 / VecInfer / KIVI")

}  // namespace
}  // namespace vqcli
