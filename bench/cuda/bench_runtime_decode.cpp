// bench_runtime_decode — the runtime's decode calls on the GPU with and without CUDA graphs
// (CudaModelOptions::cuda_graphs), measured in the same run: the eager calls (every kernel and
// cuBLAS product launched from the host, ~15 per layer) are the peer of the graph replays.
//
// A randomly initialised checkpoint of a real model's shapes (tests/runtime/tiny_checkpoint.cpp,
// bf16, the tiny tokenizer's 288-token vocabulary, so lm_head is small) is written to a temporary
// folder; then, for each cache (fp16; VecInfer d4b8/d4b8 and the defaults d4b12/d8b8 with random
// codebooks, memory-bound, a 128-token window), a prompt of --ctx tokens is prefilled in chunks
// of 512 and --steps decode calls are timed, wall clock on the host as `veloxquant generate`
// sees them (each call waits for its logits). Eager and graph models alternate over --reps
// rounds; the best round of each is printed with the ratio.
//
//   bench_runtime_decode [--preset qwen0.5b|llama8b-2l|tiny] [--ctx N] [--steps N] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/tiny_checkpoint.h"
#include "veloxquant/cuda_cache.h"
#include "veloxquant/error.h"
#include "veloxquant/runtime/model.h"
#include "veloxquant/runtime/model_cuda.h"

using namespace veloxquant;
using namespace veloxquant::runtime;

namespace {

vqtest::TinySpec preset(const std::string& name, int64_t positions) {
  vqtest::TinySpec s;
  s.architecture = "LlamaForCausalLM";
  s.model_type = "llama";
  s.dtype = "bfloat16";
  s.max_position_embeddings = positions;
  s.seed = 7;
  if (name == "qwen0.5b") {  // Qwen2.5-0.5B's layer shapes (its q/k/v biases, GQA 7), 24 layers
    s.name = "bench-qwen0.5b";
    s.architecture = "Qwen2ForCausalLM";
    s.model_type = "qwen2";
    s.hidden = 896, s.intermediate = 4864, s.n_layers = 24, s.n_heads = 14, s.n_kv_heads = 2;
    s.qkv_bias = true;
    s.tied = true;
  } else if (name == "llama8b-2l") {  // two of Llama-3.1-8B's layers
    s.name = "bench-llama8b-2l";
    s.hidden = 4096, s.intermediate = 14336, s.n_layers = 2, s.n_heads = 32, s.n_kv_heads = 8;
  } else if (name == "tiny") {  // head_dim 64, two small layers: launch-bound
    s.name = "bench-tiny";
    s.hidden = 256, s.intermediate = 384, s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2;
  } else {
    VQ_THROW(ValueError, "unknown preset " << name << " (qwen0.5b, llama8b-2l, tiny)");
  }
  return s;
}

struct Timing {
  double ms_per_step = 1e30;
  int64_t replays = 0, captures = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string name = "qwen0.5b";
  int64_t ctx = 4096, steps = 128;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--preset") name = next();
    else if (a == "--ctx") ctx = std::stoll(next());
    else if (a == "--steps") steps = std::stoll(next());
    else if (a == "--reps") reps = std::stoi(next());
    else {
      std::fprintf(stderr, "usage: %s [--preset qwen0.5b|llama8b-2l|tiny] [--ctx N] [--steps N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  if (!cuda_is_available()) {
    std::fprintf(stderr, "no CUDA device: nothing to measure\n");
    return 1;
  }
  try {
    const vqtest::TinySpec spec = preset(name, ctx + steps + 64);
    const auto dir = std::filesystem::temp_directory_path() / ("vq_" + spec.name);
    const auto t_write = std::chrono::steady_clock::now();
    vqtest::write_tiny_checkpoint(spec, dir);
    std::printf("checkpoint %s: %d layers, hidden %d, %d heads / %d kv heads, head_dim %d, intermediate %d, bf16 "
                "(written in %.1f s)\n",
                spec.name.c_str(), spec.n_layers, spec.hidden, spec.n_heads, spec.n_kv_heads,
                spec.hidden / spec.n_heads, spec.intermediate,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_write).count());
    ModelOptions mo;
    mo.n_threads = 4;
    const auto model = Model::load(dir, mo);
    CudaModelOptions co;
    co.cuda_graphs = false;
    const auto eager = CudaModel::create(*model, co);
    co.cuda_graphs = true;
    const auto graphed = CudaModel::create(*model, co);
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int> tok(0, model->config().vocab_size - 1);
    std::vector<int32_t> prompt(static_cast<size_t>(ctx));
    for (auto& t : prompt) t = tok(rng);

    struct Kind {
      const char* label;
      CacheOptions o;
    };
    std::vector<Kind> kinds;
    {
      CacheOptions o;
      o.kind = CacheKind::FP16;
      kinds.push_back({"fp16", o});
      o.kind = CacheKind::VecInfer;
      o.mode = CacheMode::MemoryBound;
      o.residual_length = 128;
      o.key_spec = PQSpec{4, 8};
      o.value_spec = PQSpec{4, 8};
      kinds.push_back({"d4b8/d4b8", o});
      o.key_spec = PQSpec{4, 12};
      o.value_spec = PQSpec{8, 8};
      kinds.push_back({"d4b12/d8b8", o});
    }
    std::printf("decode calls after a %lld-token prompt, %lld timed steps, best of %d rounds (wall clock per call, "
                "logits on the host)\n",
                (long long)ctx, (long long)steps, reps);
    std::printf("| cache | eager ms/step | graph ms/step | graph speed-up | graph tokens/s | captures | kernels/step |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (const Kind& k : kinds) {
      Timing best[2];
      for (int r = 0; r < reps; ++r) {
        for (int g = 0; g < 2; ++g) {
          const CudaModel& m = g ? *graphed : *eager;
          LayerCaches caches = m.make_caches(k.o);
          for (int64_t i = 0; i < ctx; i += 512)
            m.forward(std::span<const int32_t>(prompt.data() + i, size_t(std::min<int64_t>(512, ctx - i))), caches);
          int32_t next = 1;
          for (int w = 0; w < 8; ++w) {  // warm-up: first captures, lazy module loads
            const auto l = m.forward(std::span<const int32_t>(&next, 1), caches);
            next = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
          }
          const DecodeGraphStats s0 = m.graph_stats();
          const auto t0 = std::chrono::steady_clock::now();
          for (int64_t st = 0; st < steps; ++st) {
            const auto l = m.forward(std::span<const int32_t>(&next, 1), caches);
            next = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
          }
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
                            double(steps);
          const DecodeGraphStats s1 = m.graph_stats();
          if (ms < best[g].ms_per_step) best[g] = {ms, s1.replays - s0.replays, s1.captures - s0.captures};
          if (g == 1 && s1.replays - s0.replays != steps) {
            std::fprintf(stderr, "FAILED: %s: %lld of %lld steps replayed (%s)\n", k.label,
                         (long long)(s1.replays - s0.replays), (long long)steps,
                         (s1.off_reason.empty() ? s1.last_eager_reason : s1.off_reason).c_str());
            return 1;
          }
        }
      }
      std::printf("| %s | %.4f | %.4f | %.2fx | %.0f | %lld | %lld |\n", k.label, best[0].ms_per_step,
                  best[1].ms_per_step, best[0].ms_per_step / best[1].ms_per_step, 1000.0 / best[1].ms_per_step,
                  (long long)best[1].captures, (long long)graphed->graph_stats().kernel_nodes);
    }
    std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
