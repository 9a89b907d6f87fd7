// veloxquant inspect: what an artifact (or any safetensors file) holds.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common.h"
#include "subcommand.h"
#include "veloxquant/artifact.h"
#include "veloxquant/safetensors.h"

namespace vqcli {
namespace {

struct Stats {
  double min = 0, max = 0, mean = 0;
};
Stats stats(const std::vector<float>& v) {
  Stats s;
  if (v.empty()) return s;
  s.min = s.max = v[0];
  double sum = 0;
  for (float x : v) {
    s.min = std::min<double>(s.min, x);
    s.max = std::max<double>(s.max, x);
    sum += x;
  }
  s.mean = sum / double(v.size());
  return s;
}

// Norms of the rows of a [n, d] codebook.
std::vector<float> row_norms(const std::vector<float>& cb, int d) {
  std::vector<float> out;
  for (size_t i = 0; i + size_t(d) <= cb.size(); i += size_t(d)) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += double(cb[i + size_t(j)]) * cb[i + size_t(j)];
    out.push_back(float(std::sqrt(s)));
  }
  return out;
}

class InspectCommand final : public Command {
 public:
  void configure(CLI::App& app) override {
    app.add_option("file", path_, "artifact or other safetensors file")->required()->check(CLI::ExistingFile);
    app.add_flag("--json", json_, "print JSON instead of text");
  }

  int run() override {
    veloxquant::SafetensorsFile f = veloxquant::SafetensorsFile::open(path_);
    if (f.metadata_value("format") == std::string(veloxquant::kArtifactFormatName)) return inspect_artifact();
    return inspect_generic(f);
  }

 private:
  int inspect_artifact() {
    const veloxquant::Artifact a = veloxquant::Artifact::load(path_);
    nlohmann::json j;
    j["file"] = path_;
    j["metadata"] = a.metadata();
    nlohmann::json layers = nlohmann::json::array();
    Table t({"layer", "lambda min", "lambda max", "lambda mean", "key cb |c| mean", "key cb |c| max",
             "value cb |c| mean", "value cb |c| max", "key err", "value err"});
    for (int l = 0; l < a.n_layers; ++l) {
      const auto& L = a.layers[size_t(l)];
      const Stats ls = stats(L.smooth_factors);
      const Stats kn = stats(row_norms(L.key_codebook, a.key_spec.sub_dim));
      const Stats vn = stats(row_norms(L.value_codebook, a.value_spec.sub_dim));
      t.add_row({std::to_string(l), strf("%.4g", ls.min), strf("%.4g", ls.max), strf("%.4g", ls.mean),
                 strf("%.4g", kn.mean), strf("%.4g", kn.max), strf("%.4g", vn.mean), strf("%.4g", vn.max),
                 L.key_error >= 0 ? strf("%.5f", L.key_error) : "-",
                 L.value_error >= 0 ? strf("%.5f", L.value_error) : "-"});
      layers.push_back({{"layer", l},
                        {"smooth_factors", {{"min", ls.min}, {"max", ls.max}, {"mean", ls.mean}}},
                        {"key_centroid_norm", {{"mean", kn.mean}, {"max", kn.max}}},
                        {"value_centroid_norm", {{"mean", vn.mean}, {"max", vn.max}}},
                        {"key_error", L.key_error},
                        {"value_error", L.value_error}});
    }
    j["layers"] = layers;
    if (json_) {
      write_json(j, "-");
      return 0;
    }
    const double kb = double(int64_t(1) << a.key_spec.codebook_bits) * a.key_spec.sub_dim * 4;
    const double vb = double(int64_t(1) << a.value_spec.codebook_bits) * a.value_spec.sub_dim * 4;
    std::printf("%s: veloxquant artifact, format version %d\n", path_.c_str(), a.format_version);
    std::printf("  layers %d, kv heads %d, head_dim %d\n", a.n_layers, a.n_kv_heads, a.head_dim);
    std::printf("  keys   %s (%.3g bits/element), codebook [%d, %d] f32 = %s per layer\n", a.key_spec.str().c_str(),
                a.key_spec.bits_per_element(), 1 << a.key_spec.codebook_bits, a.key_spec.sub_dim,
                human_bytes(kb).c_str());
    std::printf("  values %s (%.3g bits/element), codebook [%d, %d] f32 = %s per layer\n", a.value_spec.str().c_str(),
                a.value_spec.bits_per_element(), 1 << a.value_spec.codebook_bits, a.value_spec.sub_dim,
                human_bytes(vb).c_str());
    std::printf("  key transform %s, alpha %g\n", a.use_smooth && a.use_hadamard ? "smooth + Hadamard"
                                                 : a.use_smooth                  ? "smooth"
                                                 : a.use_hadamard                ? "Hadamard"
                                                                                 : "none",
                a.alpha);
    std::printf("  calibration: %lld tokens per layer from %s\n", (long long)a.calib_tokens, a.calib_source.c_str());
    if (a.mean_key_error() >= 0)
      std::printf("  reconstruction error (relative MSE, mean over layers): keys %.5f, values %.5f\n",
                  a.mean_key_error(), a.mean_value_error());
    for (const auto& [k, v] : a.extra) std::printf("  %s: %s\n", k.c_str(), v.c_str());
    std::printf("\n");
    t.print();
    return 0;
  }

  int inspect_generic(const veloxquant::SafetensorsFile& f) {
    nlohmann::json j;
    j["file"] = path_;
    j["metadata"] = f.metadata();
    nlohmann::json ts = nlohmann::json::array();
    Table t({"tensor", "dtype", "shape", "bytes"});
    for (const auto& n : f.names()) {
      const auto& info = f.info(n);
      ts.push_back({{"name", n}, {"dtype", info.dtype_str}, {"shape", info.shape}, {"bytes", info.nbytes()}});
      t.add_row({n, info.dtype_str, veloxquant::shape_str(info.shape), std::to_string(info.nbytes())});
    }
    j["tensors"] = ts;
    if (json_) {
      write_json(j, "-");
      return 0;
    }
    std::printf("%s: safetensors, %zu tensors, %s\n", path_.c_str(), ts.size(),
                human_bytes(double(f.file_size())).c_str());
    for (const auto& [k, v] : f.metadata()) std::printf("  %s: %s\n", k.c_str(), v.c_str());
    std::printf("\n");
    t.print();
    return 0;
  }

  std::string path_;
  bool json_ = false;
};

VQ_REGISTER_COMMAND(InspectCommand, "inspect", "Print what an artifact (or any safetensors file) holds")

}  // namespace
}  // namespace vqcli
