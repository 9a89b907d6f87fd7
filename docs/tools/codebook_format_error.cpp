// codebook_format_error — what the CUDA attention kernel's codebook precision costs in
// attention-output error, on the demo's model-like synthetic KV. The figures in
// docs/cuda-kernels.md ("E4M3 codebooks", "Int8 keys", "Int8 keys and values") come from this program. A measurement script, not
// part of the build or of CI. Build it against a CPU build:
//
//   cmake --build build --target veloxquant -j2
//   g++ -O2 -std=c++20 -Iinclude docs/tools/codebook_format_error.cpp build/libveloxquant.a -lpthread \
//       -o /tmp/codebook_format_error
//   /tmp/codebook_format_error 0 1 2          # model seeds (the demo's default is 0)
//
// Per seed and configuration: calibrate (the demo's settings) → one CPU cache per layer with
// the artifact's f32 codebooks (codes as the CUDA encoder writes them: nearest f32 centroid) →
// attention on the codes (vecinfer_attention_ref, double) with the centroids as the kernel
// holds them: f32 (the CPU caches), fp16 (CodebookFormat::F16), E4M3 (CodebookFormat::E4M3,
// make_e4m3_codebook's decoded values) and int8 keys (CodebookFormat::I8: make_i8_codebook's
// decoded keys scored against the int8-rounded query, fp16 values), int8 keys and values
// (CodebookFormat::I8KV: the same, with make_i8_codebook's decoded values) → the demo's attention-output error against exact
// attention on the original K/V (evaluate.h: mean over rows of ||o − o_ref|| / ||o_ref||).
// The five columns use the artifact's key codebook as trained (KVCacheConfig::int8_key_grid off,
// the int8 columns with the query as two int8s, as the kernels hold it since 2026-12-03); "grid
// f32" and "grid i8" are the caches' defaults since then: the key codebook on the int8 grid, with
// f32 centroids (the CPU cache) and as CodebookFormat::I8 (the CUDA cache).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "veloxquant/artifact.h"
#include "veloxquant/calibrate.h"
#include "veloxquant/evaluate.h"
#include "veloxquant/pq.h"
#include "veloxquant/synthetic.h"
#include "veloxquant/vecinfer_cache.h"

using namespace veloxquant;

namespace {

std::vector<float> rounded_f16(const std::vector<float>& cb) {
  std::vector<float> r(cb.size());
  for (size_t i = 0; i < cb.size(); ++i) r[i] = round_to_half(cb[i]);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> seeds;
  for (int i = 1; i < argc; ++i) seeds.push_back(std::strtoull(argv[i], nullptr, 10));
  if (seeds.empty()) seeds.push_back(0);
  std::printf("%-5s %-12s %10s %10s %10s %10s %10s %10s %10s %12s %12s %12s %12s\n", "seed", "keys/values", "f32", "fp16",
              "e4m3", "i8", "i8kv", "grid f32", "grid i8", "e4m3 vs f32", "i8 vs f32", "i8kv vs f32", "grid vs f32");
  for (uint64_t seed : seeds) {
    SyntheticKVConfig cfg;  // the demo's model: 4 layers, 32/8 heads, head_dim 128
    cfg.n_layers = 4;
    cfg.seed = seed;
    const SyntheticKVModel model(cfg);
    const SyntheticSequence calib = model.generate(2048, 0, 1);
    const SyntheticSequence eval = model.generate(8192, 16, 2);
    const std::vector<Tensor> ref = reference_attention(eval, {}, /*use_oracle=*/false);
    for (const char* spec : {"d4b8/d4b8", "d4b12/d8b8", "d8b12/d8b12"}) {
      const std::string s(spec);
      CalibrationParams p;
      p.key_spec = PQSpec::parse(s.substr(0, s.find('/')));
      p.value_spec = PQSpec::parse(s.substr(s.find('/') + 1));
      p.niter = 20;
      p.seed = 1234;
      p.max_points_per_centroid = 256;
      p.max_eval_vectors = 2048;
      p.measure_untransformed = false;
      p.int8_key_grid = false;  // the codebooks as trained; the grid columns snap them in the cache
      const Artifact art = calibrate(calib.kv, p).artifact;
      KVCacheConfig base;
      base.fused_sdpa = true;
      base.fused_sdpa_memory_bound = true;
      base.residual_length = 128;
      double err[7] = {0, 0, 0, 0, 0, 0, 0};
      for (int l = 0; l < cfg.n_layers; ++l) {
        base.int8_key_grid = false;
        auto cache = create_cache_from_artifact(art, l, base);
        base.int8_key_grid = true;
        auto grid = create_cache_from_artifact(art, l, base);
        grid->update(kv_as_cache_layout(eval.kv.keys[size_t(l)]), kv_as_cache_layout(eval.kv.values[size_t(l)]));
        cache->update(kv_as_cache_layout(eval.kv.keys[size_t(l)]), kv_as_cache_layout(eval.kv.values[size_t(l)]));
        const auto* vc = dynamic_cast<const VecInferKVCache*>(cache.get());
        const TensorView q = queries_as_cache_layout(eval.queries[size_t(l)]);
        for (int f = 0; f < 7; ++f) {
          VecInferAttentionInputs in =
              (f < 5 ? vc : dynamic_cast<const VecInferKVCache*>(grid.get()))->attention_inputs();
          ProductQuantizer kq = *in.key_pq, vq = *in.value_pq;
          if (f == 1) {
            kq.set_codebook(rounded_f16(kq.codebook));
            vq.set_codebook(rounded_f16(vq.codebook));
          } else if (f == 2) {
            kq.set_codebook(make_e4m3_codebook(kq.codebook).decoded);
            vq.set_codebook(make_e4m3_codebook(vq.codebook).decoded);
          } else if (f == 6) {  // on the grid, make_i8_codebook's decoded keys are the codebook itself
            vq.set_codebook(rounded_f16(vq.codebook));
            in.int8_query = true;
          } else if (f >= 3 && f <= 4) {
            kq.set_codebook(make_i8_codebook(kq.codebook).decoded);
            vq.set_codebook(f == 3 ? rounded_f16(vq.codebook) : make_i8_codebook(vq.codebook).decoded);
            in.int8_query = true;
          }
          in.key_pq = &kq;
          in.value_pq = &vq;
          Tensor o = Tensor::empty(q.sizes(), DType::F32);
          vecinfer_attention_ref(in, q, o.view(), {});
          err[f] += attention_relative_error(o.view(), ref[size_t(l)].view()) / cfg.n_layers;
        }
      }
      std::printf("%-5llu %-12s %10.5f %10.5f %10.5f %10.5f %10.5f %10.5f %10.5f %+11.2f%% %+11.2f%% %+11.2f%% %+11.2f%%\n",
                  (unsigned long long)seed, spec, err[0], err[1], err[2], err[3], err[4], err[5], err[6],
                  100.0 * (err[2] / err[0] - 1.0), 100.0 * (err[3] / err[0] - 1.0), 100.0 * (err[4] / err[0] - 1.0),
                  100.0 * (err[5] / err[0] - 1.0));
      std::fflush(stdout);
    }
  }
}
