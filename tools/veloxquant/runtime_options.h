// runtime_options.h — the model and cache options shared by `generate` and `perplexity`:
// parsing into runtime::CacheOptions, loading the model, its device copy and its caches.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "common.h"

#include "veloxquant/error.h"
#include "veloxquant/runtime/model.h"
#include "veloxquant/runtime/model_cuda.h"

namespace vqcli {

struct ModelArgs {
  std::string model_dir;
  std::string device = "cpu";
  int threads = 0;
  bool no_cuda_graphs = false;
};

struct CacheArgs {
  std::string cache = "fp16";  // fp16 | vecinfer
  std::string artifact;
  std::string mode = "memory-bound";
  int residual = 128;
  std::string kv_dtype = "f16";
  bool random_codebooks = false;
  std::string key_spec = "d4b12";
  std::string value_spec = "d8b8";
  std::string attention_codebooks = "i8";
  bool no_int8_key_grid = false;
  uint64_t seed = 0;
};

inline void add_model_options(CLI::App* app, ModelArgs& a) {
  app->add_option("--model", a.model_dir, "Hugging Face model directory (config.json, safetensors, tokenizer.json)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app->add_option("--device", a.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app->add_option("--threads", a.threads, "CPU threads (0: all cores)")->capture_default_str();
  app->add_flag("--no-cuda-graphs", a.no_cuda_graphs,
                "--device cuda: launch every decode step's kernels from the host instead of replaying a CUDA "
                "graph of the step (for comparison; the results agree)");
}

inline void add_cache_options(CLI::App* app, CacheArgs& a) {
  app->add_option("--cache", a.cache, "KV cache: fp16 or vecinfer")->check(CLI::IsMember({"fp16", "vecinfer"}));
  app->add_option("--artifact", a.artifact, "VecInfer codebook artifact (from `veloxquant calibrate`)");
  app->add_option("--mode", a.mode, "VecInfer cache mode: memory-bound, stash or standard")
      ->check(CLI::IsMember({"memory-bound", "stash", "standard"}));
  app->add_option("--residual", a.residual, "VecInfer: most recent tokens kept exact in fp16");
  app->add_option("--kv-dtype", a.kv_dtype, "storage of the fp16 parts: f16 or bf16")
      ->check(CLI::IsMember({"f16", "bf16"}));
  app->add_flag("--random-codebooks", a.random_codebooks,
                "VecInfer without an artifact: random codebooks (testing only; quality is meaningless)");
  app->add_option("--key-spec", a.key_spec, "random codebooks: key sub_dim/bits, e.g. d4b12");
  app->add_option("--value-spec", a.value_spec, "random codebooks: value sub_dim/bits, e.g. d8b8");
  app->add_option("--attention-codebooks", a.attention_codebooks,
                  "VecInfer on cuda: codebooks the attention kernel reads: i8 (int8 keys on the cache's int8 key "
                  "grid, scored on int8 tensor cores against a two-int8 query, fp16 values: the fastest for "
                  "8-bit value codebooks and as close to the CPU cache as f16), f16, e4m3 (FP8: faster for "
                  "12-bit codebooks, about +0.1-0.4% attention error) or i8kv (int8 keys and values: fastest "
                  "for 12-bit value codebooks, about +0.01-0.06% attention error); see docs/cuda-kernels.md")
      ->check(CLI::IsMember({"f16", "e4m3", "i8", "i8kv"}))
      ->capture_default_str();
  app->add_flag("--no-int8-key-grid", a.no_int8_key_grid,
                "VecInfer: keep the key codebook as trained instead of snapping it to its int8 grid "
                "(KVCacheConfig::int8_key_grid; the grid changed the attention error by -0.14 to +0.39% on the demo "
                "data, +0.70% on codebooks trained without transforms, and makes the cuda i8 kernels exact; "
                "without it they round the codebook per call)");
}

/// Loads the model's weights on the host (mapped from the checkpoint); `--device cuda` then
/// uploads them once with device_model().
inline std::unique_ptr<veloxquant::runtime::Model> load_model(const ModelArgs& a) {
  veloxquant::runtime::ModelOptions mo;
  mo.n_threads = a.threads;
  return veloxquant::runtime::Model::load(a.model_dir, mo);
}

/// `--device cuda`: the model's forward pass on the GPU (weights uploaded once); null for cpu.
/// Throws CudaError without CUDA in the build or without a visible device.
inline std::unique_ptr<veloxquant::runtime::CudaModel> device_model(const ModelArgs& a,
                                                                    const veloxquant::runtime::Model& model) {
  if (a.device != "cuda") return nullptr;
  veloxquant::runtime::CudaModelOptions o;
  o.cuda_graphs = !a.no_cuda_graphs;
  return veloxquant::runtime::CudaModel::create(model, o);
}

/// The per-layer caches for `co`: device-resident ones with a device model, else (or where the
/// device kernels do not compile the shape, e.g. a head_dim they lack, said on stderr unless
/// quiet) CPU caches, which the device forward pass also accepts.
inline veloxquant::runtime::LayerCaches layer_caches(const veloxquant::runtime::CudaModel* cuda_model,
                                                     const veloxquant::runtime::Model& model,
                                                     const veloxquant::runtime::CacheOptions& co, bool quiet) {
  if (cuda_model) {
    try {
      return cuda_model->make_caches(co);
    } catch (const veloxquant::UnsupportedError& e) {
      if (!quiet) std::fprintf(stderr, "cache: %s; attention runs on the host\n", e.what());
    }
  }
  return veloxquant::runtime::make_caches(model, co);
}

inline veloxquant::runtime::CacheOptions cache_options(const CacheArgs& a, int threads) {
  using namespace veloxquant;
  runtime::CacheOptions o;
  o.kind = a.cache == "vecinfer" ? CacheKind::VecInfer : CacheKind::FP16;
  o.storage_dtype = a.kv_dtype == "bf16" ? DType::BF16 : DType::F16;
  o.mode = a.mode == "stash" ? CacheMode::Stash : a.mode == "standard" ? CacheMode::Standard : CacheMode::MemoryBound;
  o.residual_length = a.residual;
  o.artifact_path = a.artifact;
  o.key_spec = PQSpec::parse(a.key_spec);
  o.value_spec = PQSpec::parse(a.value_spec);
  o.seed = a.seed;
  o.n_threads = threads;
  o.attention_codebooks = parse_codebook_format(a.attention_codebooks);
  o.int8_key_grid = !a.no_int8_key_grid;
  if (o.kind == CacheKind::VecInfer && a.artifact.empty() && !a.random_codebooks)
    VQ_THROW(ValueError, "--cache vecinfer needs --artifact FILE (from `veloxquant calibrate --model ...`), or "
                         "--random-codebooks for a smoke test");
  if (o.kind == CacheKind::FP16 && !a.artifact.empty())
    VQ_THROW(ValueError, "--artifact is only used with --cache vecinfer");
  return o;
}

}  // namespace vqcli
