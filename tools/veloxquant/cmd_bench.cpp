// veloxquant bench: decode attention of VecInfer against the fp16 cache, same shape, same run.
//
// Both caches are filled with the same random K/V (ctx tokens; timing does not depend on the
// values, and the VecInfer cache uses seeded random codebooks unless --artifact is given), then
// one decode step is timed on each: one warm-up, then the median of --repeats runs. The step
// has q_len 1, or --q-len queries at the last positions, causal (a speculative-decoding verify
// batch or a small prefill chunk). With --step each timed call is a whole decode step: update
// with one new token per kv head (the VecInfer cache encodes the token leaving its window),
// then attend; the caches grow by one token per call. Printed: both medians, the speed ratio,
// and the ratio of bytes held. With --cold (CPU) the last-level cache is flushed before every
// timed call (untimed: every thread reads its share of a buffer twice the L3's size), as a
// model's other layers would between two calls on one layer's cache: both caches then read
// from memory, where the warm loop flatters whichever fits in L3.
//
// Device: the caches come from KVCacheFactory with config.device, so --device cuda runs the
// CUDA caches where the build has them. time_decode() is the one place that would need a
// device synchronisation for asynchronous backends (fused_sdpa returns a host-visible Tensor).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common.h"
#include "llc_flush.h"
#include "subcommand.h"
#include "veloxquant/artifact.h"
#include "veloxquant/cache.h"
#include "veloxquant/error.h"

namespace vqcli {
namespace {

using namespace veloxquant;

using bench::LlcFlush;  // bench/common/llc_flush.h

// step_kv: null, or one token per kv head [batch, n_kv_heads, 1, head_dim] appended before
// each attention call (a decode step). flush: null, or run before each call, untimed.
double time_decode(KVCache& cache, const TensorView& q, const SdpaParams& sdpa, int repeats,
                   const std::pair<TensorView, TensorView>* step_kv, std::vector<double>* all,
                   LlcFlush* flush) {
  if (step_kv) cache.update(step_kv->first, step_kv->second);
  Tensor out = cache.fused_sdpa(q, sdpa);  // warm-up (and allocation)
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    if (flush) (*flush)();
    const auto t0 = std::chrono::steady_clock::now();
    if (step_kv) cache.update(step_kv->first, step_kv->second);
    out = cache.fused_sdpa(q, sdpa);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (all) *all = t;
  std::nth_element(t.begin(), t.begin() + long(t.size() / 2), t.end());
  return t[t.size() / 2];
}

class BenchCommand final : public Command {
 public:
  void configure(CLI::App& app) override {
    app.add_option("--heads", heads_, "query heads")->capture_default_str();
    app.add_option("--kv-heads", kv_heads_, "kv heads")->capture_default_str();
    app.add_option("--head-dim", head_dim_, "head_dim")->capture_default_str();
    app.add_option("--ctx", ctx_, "tokens in the cache")->capture_default_str();
    app.add_option("--batch", batch_, "batch")->capture_default_str();
    app.add_option("--q-len", q_len_, "queries per step, causal at the last positions (1: decode; 2-16: a verify batch)")
        ->capture_default_str();
    app.add_flag("--step", step_,
                 "time whole decode steps: update with one new token per kv head, then attend (the caches grow by one "
                 "token per call)");
    app.add_option("--keys", keys_, "VecInfer key quantizer")->capture_default_str();
    app.add_option("--values", values_, "VecInfer value quantizer")->capture_default_str();
    app.add_option("--residual", residual_, "VecInfer fp16 residual window")->capture_default_str();
    app.add_option("--artifact", artifact_, "use layer 0 of this artifact (its keys/values override --keys/--values)");
    app.add_option("--device", device_, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
    app.add_option("--attention-codebooks", codebooks_,
                   "cuda: codebooks the VecInfer attention kernel reads (i8 = int8 keys: fastest for 8-bit value "
                   "codebooks, f16, e4m3, i8kv = int8 keys and values: fastest for 12-bit value codebooks)")
        ->check(CLI::IsMember({"f16", "e4m3", "i8", "i8kv"}))
        ->capture_default_str();
    app.add_option("--repeats", repeats_, "timed repetitions (median)")->capture_default_str();
    app.add_flag("--cold", cold_,
                 "cpu: flush the last-level cache before every timed call (untimed), as a model's other layers "
                 "would; without it both caches are timed warm, from L3 where they fit");
    app.add_option("--threads", threads_, "CPU threads (0: all cores)")->capture_default_str();
    app.add_option("--seed", seed_, "seed for K/V, queries and random codebooks")->capture_default_str();
    app.add_flag("--json", json_, "print JSON instead of text");
  }

  int run() override {
    VQ_CHECK_VALUE(heads_ >= 1 && kv_heads_ >= 1 && heads_ % kv_heads_ == 0,
                   "bench: --heads (" << heads_ << ") must be a positive multiple of --kv-heads (" << kv_heads_ << ")");
    VQ_CHECK_VALUE(ctx_ >= 1 && batch_ >= 1 && head_dim_ >= 1 && repeats_ >= 1,
                   "bench: --ctx, --batch, --head-dim and --repeats must be >= 1");
    VQ_CHECK_VALUE(q_len_ >= 1 && q_len_ <= ctx_,
                   "bench: --q-len (" << q_len_ << ") must be between 1 and --ctx (" << ctx_ << ")");
    const Device dev = device_ == "cuda" ? Device::cuda(0) : Device::cpu();
    VQ_CHECK_VALUE(!cold_ || dev.is_cpu(),
                   "bench: --cold flushes the CPU's last-level cache; on cuda, bench_decode_cuda flushes the GPU's L2 "
                   "(its default --flush clean)");

    KVCacheConfig fp;
    fp.kind = CacheKind::FP16;
    fp.head_dim = head_dim_;
    fp.n_kv_heads = kv_heads_;
    fp.n_threads = threads_;
    fp.device = dev;
    KVCacheConfig vq;
    if (!artifact_.empty()) {
      const Artifact a = Artifact::load(artifact_);
      VQ_CHECK_VALUE(a.head_dim == head_dim_ && a.n_kv_heads == kv_heads_,
                     "bench: the artifact has head_dim " << a.head_dim << " and " << a.n_kv_heads
                                                         << " kv heads; the bench shape has " << head_dim_ << " and "
                                                         << kv_heads_);
      vq = artifact_cache_config(a, 0);
      keys_ = a.key_spec.str();
      values_ = a.value_spec.str();
    } else {
      const PQSpec ks = PQSpec::parse(keys_), vs = PQSpec::parse(values_);
      vq.head_dim = head_dim_;
      vq.n_kv_heads = kv_heads_;
      vq.key_sub_dim = ks.sub_dim;
      vq.key_codebook_bits = ks.codebook_bits;
      vq.value_sub_dim = vs.sub_dim;
      vq.value_codebook_bits = vs.codebook_bits;
      vq.seed = seed_;
    }
    vq.kind = CacheKind::VecInfer;
    vq.fused_sdpa = true;
    vq.fused_sdpa_memory_bound = true;
    vq.residual_length = residual_;
    vq.n_threads = threads_;
    vq.device = dev;
    vq.attention_codebooks = parse_codebook_format(codebooks_);
    vq.fused_sdpa_max_ctx = std::max<int64_t>(vq.fused_sdpa_max_ctx, ctx_);

    auto fp16 = KVCacheFactory::create(fp);
    auto vec = KVCacheFactory::create(vq);

    // Fill in chunks of random K/V (f32 on the host; the caches convert/copy).
    std::mt19937_64 rng(seed_);
    std::normal_distribution<float> nd;
    const int64_t chunk = std::min<int64_t>(ctx_, 4096);
    Tensor k = Tensor::empty({batch_, kv_heads_, chunk, head_dim_}, DType::F32);
    Tensor v = Tensor::empty({batch_, kv_heads_, chunk, head_dim_}, DType::F32);
    for (int64_t t0 = 0; t0 < ctx_; t0 += chunk) {
      const int64_t m = std::min(chunk, ctx_ - t0);
      for (int64_t i = 0; i < k.numel(); ++i) k.ptr<float>()[i] = nd(rng);
      for (int64_t i = 0; i < v.numel(); ++i) v.ptr<float>()[i] = nd(rng);
      TensorView kv = k.view(), vv = v.view();
      kv.shape[2] = vv.shape[2] = m;  // a prefix of each head's rows (strides unchanged)
      fp16->update(kv, vv);
      vec->update(kv, vv);
    }
    Tensor q = Tensor::empty({batch_, heads_, q_len_, head_dim_}, DType::F32);
    for (int64_t i = 0; i < q.numel(); ++i) q.ptr<float>()[i] = nd(rng);
    SdpaParams sdpa;
    sdpa.n_threads = threads_;
    sdpa.causal = true;  // q_len 1: every token visible either way

    Tensor k1 = Tensor::empty({batch_, kv_heads_, 1, head_dim_}, DType::F32);
    Tensor v1 = Tensor::empty({batch_, kv_heads_, 1, head_dim_}, DType::F32);
    for (int64_t i = 0; i < k1.numel(); ++i) k1.ptr<float>()[i] = nd(rng), v1.ptr<float>()[i] = nd(rng);
    const std::pair<TensorView, TensorView> step_kv{k1.view(), v1.view()};
    std::vector<double> tf_all, tv_all;
    std::unique_ptr<LlcFlush> flush;
    if (cold_) flush = std::make_unique<LlcFlush>(threads_ > 0 ? threads_ : default_threads());
    const double tf = time_decode(*fp16, q.view(), sdpa, repeats_, step_ ? &step_kv : nullptr, &tf_all, flush.get());
    const double tv = time_decode(*vec, q.view(), sdpa, repeats_, step_ ? &step_kv : nullptr, &tv_all, flush.get());
    const int64_t bf = fp16->nbytes(), bv = vec->nbytes();
    const double kv_bytes = double(batch_) * kv_heads_ * double(ctx_) * head_dim_ * 2 * 2;  // fp16 K+V

    if (json_) {
      nlohmann::json j = {{"shape",
                           {{"batch", batch_},
                            {"heads", heads_},
                            {"kv_heads", kv_heads_},
                            {"head_dim", head_dim_},
                            {"ctx", ctx_},
                            {"q_len", q_len_}}},
                          {"step", step_},
                          {"device", device_},
                          {"attention_codebooks", codebooks_},
                          {"keys", keys_},
                          {"values", values_},
                          {"residual_length", residual_},
                          {"repeats", repeats_},
                          {"cold", cold_},
                          {"flush_bytes", flush ? int64_t(flush->bytes()) : int64_t(0)},
                          {"fp16", {{"median_ms", tf * 1e3}, {"bytes", bf}, {"times_ms", ms(tf_all)}}},
                          {"vecinfer", {{"median_ms", tv * 1e3}, {"bytes", bv}, {"times_ms", ms(tv_all)}}},
                          {"speedup", tf / tv},
                          {"bytes_ratio", double(bf) / double(bv)},
                          {"fp16_bandwidth_gbs", kv_bytes / tf / 1e9}};
      write_json(j, "-");
      return 0;
    }
    std::printf("%s, batch %lld, q_len %lld, %d query / %d kv heads, head_dim %d, %lld tokens, %s, median of %d%s\n",
                step_ ? "decode step (update one token + attention)" : "decode attention", (long long)batch_,
                (long long)q_len_, heads_, kv_heads_, head_dim_, (long long)ctx_, device_.c_str(), repeats_,
                flush ? strf(", cold (%.0f MiB read before each call)", double(flush->bytes()) / 1048576.0).c_str()
                      : ", warm");
    Table t({"cache", "config", "median ms", "bytes held", "fp16 K/V read GB/s"});
    t.add_row({fp16->class_name(), "fp16", strf("%.3f", tf * 1e3), human_bytes(double(bf)),
               strf("%.1f", kv_bytes / tf / 1e9)});
    t.add_row({vec->class_name(), keys_ + "/" + values_, strf("%.3f", tv * 1e3), human_bytes(double(bv)), "-"});
    t.print();
    // a ratio below 1 is reported as what it is: slower
    if (tf >= tv) std::printf("\nVecInfer vs fp16: %.2fx faster", tf / tv);
    else std::printf("\nVecInfer vs fp16: %.2fx slower", tv / tf);
    std::printf(", %.2fx fewer bytes held\n", double(bf) / double(bv));
    if (!vec->describe().empty()) std::printf("(%s)\n", vec->describe().c_str());
    return 0;
  }

 private:
  static std::vector<double> ms(const std::vector<double>& s) {
    std::vector<double> o;
    for (double x : s) o.push_back(x * 1e3);
    return o;
  }
  int heads_ = 32, kv_heads_ = 8, head_dim_ = 128, residual_ = 128, repeats_ = 20, threads_ = 0;
  bool cold_ = false;
  int64_t ctx_ = 32768, batch_ = 1, q_len_ = 1;
  uint64_t seed_ = 0;
  std::string keys_ = "d4b8", values_ = "d4b8", device_ = "cpu", artifact_, codebooks_ = "i8";
  bool json_ = false, step_ = false;
};

VQ_REGISTER_COMMAND(BenchCommand, "bench", "Time decode attention: VecInfer vs the fp16 cache, same shape")

}  // namespace
}  // namespace vqcli
