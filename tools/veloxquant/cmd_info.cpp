// veloxquant info: what this build runs, and whether a cache configuration runs on CUDA, asked
// before anything is allocated (cuda_support: the same rule KVCacheFactory::create applies, so
// nothing fails later for want of a kernel and nothing falls back to the CPU).
#include <cstdio>

#include "common.h"
#include "subcommand.h"
#include "veloxquant/artifact.h"
#include "veloxquant/cuda_cache.h"

#ifndef VQ_VERSION
#define VQ_VERSION "unknown"
#endif

namespace vqcli {
namespace {

using namespace veloxquant;

class InfoCommand final : public Command {
 public:
  void configure(CLI::App& app) override {
    app.add_option("--cache", kind_, "cache kind")->check(CLI::IsMember({"vecinfer", "fp16"}))->capture_default_str();
    app.add_option("--keys", keys_, "VecInfer key quantizer")->capture_default_str();
    app.add_option("--values", values_, "VecInfer value quantizer")->capture_default_str();
    app.add_option("--artifact", artifact_, "take head_dim and the key/value quantizers from this artifact")
        ->check(CLI::ExistingFile);
    app.add_option("--head-dim", head_dim_, "head_dim")->capture_default_str();
    app.add_option("--mode", mode_, "VecInfer mode: memory_bound (codes + window), stash, standard")
        ->check(CLI::IsMember({"memory_bound", "stash", "standard"}))
        ->capture_default_str();
    app.add_option("--attention-codebooks", codebooks_, "codebooks the CUDA attention kernel reads")
        ->check(CLI::IsMember({"f16", "e4m3", "i8", "i8kv"}))
        ->capture_default_str();
    app.add_flag("--json", json_, "print JSON instead of text");
  }

  int run() override {
    KVCacheConfig c;
    c.kind = kind_ == "fp16" ? CacheKind::FP16 : CacheKind::VecInfer;
    c.head_dim = head_dim_;
    PQSpec ks = PQSpec::parse(keys_), vs = PQSpec::parse(values_);
    if (!artifact_.empty()) {
      const Artifact a = Artifact::load(artifact_);
      c.head_dim = a.head_dim;
      ks = a.key_spec, vs = a.value_spec;
    }
    c.key_sub_dim = ks.sub_dim, c.key_codebook_bits = ks.codebook_bits;
    c.value_sub_dim = vs.sub_dim, c.value_codebook_bits = vs.codebook_bits;
    c.fused_sdpa = mode_ != "standard";
    c.fused_sdpa_memory_bound = mode_ == "memory_bound";
    c.attention_codebooks = parse_codebook_format(codebooks_);
    const CudaSupport s = cuda_support(c);
    const std::vector<std::string> configs = cuda_attention_configs();

    const std::string what = c.kind == CacheKind::FP16
                                 ? strf("fp16 cache, head_dim %d", c.head_dim)
                                 : strf("VecInfer %s/%s, head_dim %d, %s, %s codebooks", ks.str().c_str(),
                                        vs.str().c_str(), c.head_dim, cache_mode_name(c.mode()), codebooks_.c_str());
    if (json_) {
      nlohmann::json j;
      j["version"] = VQ_VERSION;
      j["cuda"] = {{"built", s.built}, {"devices", s.devices}, {"attention_configs", configs}};
      j["config"] = {{"cache", kind_}, {"head_dim", c.head_dim}};
      if (c.kind == CacheKind::VecInfer) {
        j["config"]["keys"] = ks.str();
        j["config"]["values"] = vs.str();
        j["config"]["mode"] = cache_mode_name(c.mode());
        j["config"]["attention_codebooks"] = codebooks_;
      }
      j["cuda_support"] = {{"cache", s.cache},           {"attention", s.attention}, {"prefill_kernel", s.prefill_kernel},
                           {"prefill_over_rows", s.prefill_over_rows}, {"tuned_kernel", s.tuned_kernel},
                           {"kernel", s.kernel},         {"reason", s.reason}};
      write_json(j, "-");
      return 0;
    }
    std::printf("veloxquant %s\n", VQ_VERSION);
    std::printf("CUDA backend: %s; devices visible: %d\n", s.built ? "built" : "not built", s.devices);
    if (s.built) {
      std::printf("CUDA attention configurations compiled (key/value @ head_dim + codebooks):\n");
      for (const std::string& n : configs) std::printf("  %s\n", n.c_str());
    }
    std::printf("\n%s on CUDA:\n", what.c_str());
    if (s.cache && s.attention)
      std::printf("  runs: attention kernel %s (%s); prompts (q_len > 16) %s%s\n", s.kernel.c_str(),
                  s.tuned_kernel ? "tuned" : "the plain kernel: every configuration, slower than the tuned ones",
                  s.prefill_kernel ? "on the prefill kernel" : "on the decode kernel in row chunks",
                  s.prefill_over_rows ? " (chunks that fill the GPU: over their tokens expanded into exact rows, "
                                        "within the prefill workspace limit)"
                                      : "");
    else if (s.cache)
      std::printf("  the cache builds, but fused_sdpa would raise: %s\n", s.reason.c_str());
    else
      std::printf("  not supported: %s\n", s.reason.c_str());
    return 0;
  }

 private:
  std::string kind_ = "vecinfer", keys_ = "d4b12", values_ = "d8b8", artifact_, mode_ = "memory_bound",
              codebooks_ = "i8";
  int head_dim_ = 128;
  bool json_ = false;
};

VQ_REGISTER_COMMAND(InfoCommand, "info",
                    "What this build runs: CUDA kernels compiled, and whether a cache configuration runs on CUDA")

}  // namespace
}  // namespace vqcli
