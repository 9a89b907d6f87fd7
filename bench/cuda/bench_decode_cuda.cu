// bench/cuda/bench_decode_cuda.cu — fused decode attention on VQ codes vs the fp16 peer.
//
// What it measures, all in one run on one GPU:
//   * the HBM copy bandwidth (cudaMemcpy device→device, bytes read + written): the ceiling;
//   * our decode attention (q_len 1) on Llama-3.1-8B layer shapes (32 query heads, 8 kv heads,
//     head_dim 128, a 128-token fp16 window) at batch×context 1×131072, 8×32768, 64×16384,
//     per codebook configuration: median time over reps with L2 flushed before each (by a read
//     of 256 MB; --flush dirty: by a memset, as before run 130; see Flush), the bytes it must
//     read (codes + window), GB/s and the share of the copy bandwidth;
//   * our own fp16 path (the same kernel over plain fp16 K/V) for context;
//   * the peer, read from --peer FILE (written by peer_sdpa.py in the same device command),
//     giving the speedup per shape;
//   * encode throughput (token-heads/s) for keys and values of each configuration;
//   * one captured decode step (encode the token + attention) replayed through a CUDA graph.
// Every kernel is validated against the CPU oracle (vecinfer_attention_ref, double) on two
// (batch, kv head) segments of the very launch configuration that is timed, before timing.
//
// Usage: bench_decode_cuda --help (kUsage, above main)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_util.cuh"
#include "cuda/encode_grid.h"
#include "cuda/kernels.h"
#include "veloxquant/cuda_cache.h"
#include "veloxquant/calibrate.h"
#include "veloxquant/pq.h"
#include "veloxquant/smooth.h"
#include "veloxquant/synthetic.h"
#include "veloxquant/vecinfer_cache.h"

using namespace veloxquant;

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

constexpr int kH = 32, kKV = 8, kD = 128, kR = 128;

__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 0x9E3779B1u ^ seed ^ uint32_t(i >> 32) * 0x85EBCA77u;
    x ^= x >> 15, x *= 0x2C1B3C6Du, x ^= x >> 12, x *= 0x297A2D39u, x ^= x >> 15;
    p[i] = uint8_t(x);
  }
}
// The read-only ceiling: every byte of n (16-byte aligned) read once, 4 loads in flight per thread,
// no L1 allocation; the xor of what was read is stored only where `sink` is set (never), which
// keeps the loads alive.
__global__ void __launch_bounds__(512) stream_read(const uint4* p, size_t n16, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  const size_t step = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * step < n16; i += 4 * step) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w)
                   : "l"(p + i + k * step));
#pragma unroll
    for (int k = 0; k < 4; ++k) acc.x ^= v[k].x, acc.y ^= v[k].y, acc.z ^= v[k].z, acc.w ^= v[k].w;
  }
  for (; i < n16; i += step) {
    const uint4 v = p[i];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if (sink) sink[size_t(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}
// The GPU's nanosecond timer.
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Spins one thread for ns nanoseconds (globaltimer): the guard between a flush and a start event.
__global__ void spin_ns(unsigned long long ns) {
  const unsigned long long t0 = globaltimer_ns();
  while (globaltimer_ns() - t0 < ns) {
  }
}
__global__ void fill_halves(__half* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 0x9E3779B1u ^ seed;
    x ^= x >> 15, x *= 0x2C1B3C6Du, x ^= x >> 12, x *= 0x297A2D39u, x ^= x >> 15;
    uint32_t y = x * 0x9E3779B1u + 0x7F4A7C15u;
    y ^= y >> 13, y *= 0x5bd1e995u, y ^= y >> 15;
    const float u1 = (float(x >> 8) + 0.5f) / 16777216.0f, u2 = float(y >> 8) / 16777216.0f;
    p[i] = __float2half(scale * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2));
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  /// device ms of what launch() queues on the legacy stream, between two events
  template <class F>
  float ms(F&& launch) {
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    return t;
  }
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0f : v[v.size() / 2];
}

/// How L2 is emptied before each timed run (--flush):
///  * kClean (the default since run 130): one launch that reads a 256 MB buffer. L2 is left full
///    of clean lines, as a decoder's weight reads (the GEMMs between two attention calls) leave
///    it, and the timed launch pays for its own traffic only.
///  * kDirty (every run before 130): a memset of the buffer. L2 is left full of dirty lines,
///    which the timed launch writes back to HBM as its reads evict them: up to L2's size (~50 MB)
///    of writes that are the flush's, not the kernel's, and weigh most on the smallest transfers.
///  * kNone: L2 kept warm (diagnosis only).
struct Flush {
  enum Mode { kNone, kClean, kDirty } mode = kClean;
  void* buf = nullptr;
  size_t bytes = 0;
  int blocks = 0;
  /// then (--guard-us N) a spin of N us on one thread, so that the host's time to issue the timed
  /// launch (argument checks, the plan) would end before the GPU reaches the start event; run 135
  /// found no such gap here or in the peer (peer_sdpa.py --guard-us): off by default
  unsigned long long guard_ns = 0;
  void operator()(cudaStream_t st, int r) const {
    if (mode == kDirty) CK(cudaMemsetAsync(buf, r & 0xFF, bytes, st));
    if (mode == kClean) stream_read<<<blocks, 512, 0, st>>>(static_cast<const uint4*>(buf), bytes / 16, nullptr);
    if (guard_ns) spin_ns<<<1, 1, 0, st>>>(guard_ns);
  }
  const char* name() const { return mode == kClean ? "clean (a 256 MB read)" : mode == kDirty ? "dirty (a 256 MB memset)" : "none (L2 warm)"; }
};

/// Median device us of launch() over `reps` timed runs after `warm` untimed ones, each after an
/// L2 flush, on the legacy stream.
template <class F>
double flushed_median_us(Timer& tm, const Flush& flush, int warm, int reps, F&& launch) {
  std::vector<float> t;
  for (int r = 0; r < warm + reps; ++r) {
    flush(0, r);
    const float ms = tm.ms(launch);
    if (r >= warm) t.push_back(ms);
  }
  return median(t) * 1e3;
}

/// Start-up probe (--startup-probe; diagnosis of run 141): how long after block entry a warp's
/// first cp.async tile of a cold buffer lands when the kernel does nothing else. One block of 512
/// threads per SM (as much dynamic shared memory as the d4b8 attention kernel), 128 blocks (the
/// batch-1 grid), each warp one 2 KB tile (a d4b8 ring stage) at its block's 512 KB share.
/// mode 0: copies issued at entry; 1: after a dependent load of one int from another cold buffer
/// (the attention setup waits for the lengths so); 2: an empty kernel (launch and drain only).
/// Thread 0 writes globaltimer at entry, at issue and once its copies have landed.
__global__ void startup_probe(const uint8_t* buf, const int* len, size_t per_block, int mode,
                              unsigned long long* out) {
  extern __shared__ __align__(16) unsigned char probe_smem[];
  if (mode == 2) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const unsigned long long g0 = globaltimer_ns();
  unsigned long long g1;
  size_t off = size_t(blockIdx.x) * per_block + size_t(warp) * 2048;
  int dep = 0;
  if (mode == 1) dep = __ldg(len);  // 0 in the buffer: a dependency, not an offset
  off += size_t(dep);
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1) : "r"(dep));
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(probe_smem + warp * 2048));
#pragma unroll
  for (int i = 0; i < 4; ++i) veloxquant::cuda::cp_async16(dst + i * 512 + lane * 16, buf + off + i * 512 + lane * 16);
  veloxquant::cuda::cp_async_commit();
  veloxquant::cuda::cp_async_wait<0>();
  const unsigned long long g2 = globaltimer_ns();
  if (tid == 0) out[blockIdx.x * 3] = g0, out[blockIdx.x * 3 + 1] = g1, out[blockIdx.x * 3 + 2] = g2;
}

void run_startup_probe(Timer& tm, const Flush& flush_clean) {
  const int nblk = 128;
  const size_t per_block = size_t(512) << 10;
  uint8_t* buf = nullptr;
  int* len = nullptr;
  unsigned long long* out = nullptr;
  CK(cudaMalloc(&buf, nblk * per_block));
  CK(cudaMalloc(&len, 4096));
  CK(cudaMalloc(&out, nblk * 3 * 8));
  CK(cudaMemset(buf, 1, nblk * per_block));
  CK(cudaMemset(len, 0, 4096));
  const int smem = 220 << 10;
  CK(cudaFuncSetAttribute(startup_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  Flush none = flush_clean;
  none.mode = Flush::kNone;
  const char* mode_names[3] = {"cp.async at entry", "cp.async after a cold dependent load", "empty kernel"};
  for (int mode = 0; mode < 3; ++mode)
    for (const Flush* f : std::vector<const Flush*>{&flush_clean, &none}) {
      if (mode == 2 && f == &none) continue;
      auto launch = [&] { startup_probe<<<nblk, 512, smem>>>(buf, len, per_block, mode, out); };
      const double us = flushed_median_us(tm, *f, 3, 20, launch);
      std::vector<unsigned long long> h(size_t(nblk) * 3);
      CK(cudaMemcpy(h.data(), out, h.size() * 8, cudaMemcpyDeviceToHost));
      std::vector<double> issue_land, entry_land;
      unsigned long long first = ~0ull;
      for (int i = 0; i < nblk; ++i) first = std::min(first, h[size_t(i) * 3]);
      for (int i = 0; i < nblk && mode < 2; ++i) {
        issue_land.push_back((h[size_t(i) * 3 + 2] - h[size_t(i) * 3 + 1]) / 1e3);
        entry_land.push_back((h[size_t(i) * 3 + 2] - first) / 1e3);
      }
      std::sort(issue_land.begin(), issue_land.end());
      std::sort(entry_land.begin(), entry_land.end());
      std::printf("startup probe, %-38s after flush %-22s launch %5.1f us", mode_names[mode], f->name(), us);
      if (mode < 2)
        std::printf("; tile landed %.2f us (median) / %.2f (max) after issue, %.2f / %.2f after the first block's entry",
                    issue_land[nblk / 2], issue_land.back(), entry_land[nblk / 2], entry_land.back());
      std::printf("\n");
    }
  CK(cudaFree(buf));
  CK(cudaFree(len));
  CK(cudaFree(out));
}

struct Spec {
  int ks, kb, vs, vb;
  int fmt = 0;  ///< CodebookFormat: 0 fp16, 1 E4M3 codebooks, 2 int8 keys, 3 int8 keys and values
  std::string str() const {
    return "d" + std::to_string(ks) + "b" + std::to_string(kb) + "/d" + std::to_string(vs) + "b" + std::to_string(vb) +
           (fmt == 1 ? "+e4m3" : fmt == 2 ? "+i8" : fmt == 3 ? "+i8kv" : "");
  }
};

/// A MemoryBound VecInfer cache on device 0 with the bench's layer shape (kKV kv heads, head_dim
/// kD, a kR-token window), queueing on `stream` (the step and update sections).
KVCacheConfig device_cache_config(const Spec& s, CodebookFormat fmt, cudaStream_t stream) {
  KVCacheConfig c;
  c.attention_codebooks = fmt;
  c.kind = CacheKind::VecInfer;
  c.head_dim = kD;
  c.key_sub_dim = s.ks, c.key_codebook_bits = s.kb, c.value_sub_dim = s.vs, c.value_codebook_bits = s.vb;
  c.fused_sdpa = true, c.fused_sdpa_memory_bound = true;
  c.residual_length = kR;
  c.n_kv_heads = kKV;
  c.device = Device::cuda(0);
  c.stream = stream;
  return c;
}

/// The caches the prefill and head_dim 80/96 tables time through the cache API: d4b8 and the
/// defaults with int8 keys, and the fp16 cache.
struct BenchCache {
  std::string name;
  CacheKind kind;
  Spec s;
  CodebookFormat fmt;
};
const std::vector<BenchCache>& bench_caches() {
  static const std::vector<BenchCache> v = {
      {"d4b8/d4b8+i8", CacheKind::VecInfer, {4, 8, 4, 8, 2}, CodebookFormat::I8},
      {"d4b12/d8b8+i8", CacheKind::VecInfer, {4, 12, 8, 8, 2}, CodebookFormat::I8},
      {"d8b12/d8b12+i8", CacheKind::VecInfer, {8, 12, 8, 12, 2}, CodebookFormat::I8},  // the paper's; --filter d8b12
      {"fp16 cache", CacheKind::FP16, {4, 8, 4, 8, 0}, CodebookFormat::F16}};
  return v;
}

/// A bench cache's device configuration at another layer shape (the head_dim 96/80 tables).
KVCacheConfig bench_cache_config(const BenchCache& pc, int head_dim, int n_kv_heads) {
  KVCacheConfig cfg = device_cache_config(pc.s, pc.fmt, nullptr);
  cfg.kind = pc.kind;
  cfg.head_dim = head_dim;
  cfg.n_kv_heads = n_kv_heads;
  return cfg;
}

/// Fills a host fp16 tensor with uniform values in [-1, 1] from a fast LCG (state `st`).
void lcg_fill_f16(Tensor& t, uint64_t& st) {
  uint16_t* h = t.ptr<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = float_to_half(float(int32_t(st >> 33) % 20001) * 1e-4f - 1.0f);
  }
}

/// NMSE of device fp16 rows `got` (n floats' worth, read back) against the CPU's `want`; false
/// where a value is not finite.
bool nmse_vs(const uint16_t* got, const std::vector<float>& w, size_t n, double& e) {
  double num = 0, den = 0;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const double g = half_to_float(got[i]);
    finite &= std::isfinite(g);
    num += (g - w[i]) * (g - w[i]), den += double(w[i]) * w[i];
  }
  e = den > 0 ? num / den : 1.0;
  return finite;
}

/// Device us per call of `call` (the runtime's eager calls on `cache`): 2 warm-up calls, then 20
/// queued between the timer's events on `stream`, with `decode_max` as cuda::update_decode_max
/// and deferred input checks on or off (their verdict read after the 20); host_us, when given,
/// receives the host's issue time per call.
double time_calls(KVCache& cache, cudaStream_t stream, Timer& tm, int decode_max, bool deferred,
                  const std::function<void()>& call, double* host_us = nullptr) {
  auto* cc = dynamic_cast<CudaKVCache*>(&cache);
  const int prev = cuda::set_update_decode_max(decode_max);
  cc->set_deferred_checks(deferred);
  for (int w = 0; w < 2; ++w) call();
  CK(cudaEventRecord(tm.a, stream));
  const auto h0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 20; ++r) call();
  if (host_us) *host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() / 20;
  CK(cudaEventRecord(tm.b, stream));
  CK(cudaEventSynchronize(tm.b));
  cc->check_inputs();
  cc->set_deferred_checks(false);
  cuda::set_update_decode_max(prev);
  float ms;
  CK(cudaEventElapsedTime(&ms, tm.a, tm.b));
  return double(ms) * 1e3 / 20;
}

struct Peer {
  double us = 0, tbps = 0;
  std::string backend;
};

/// The peer's lines `<tag> <a> <b> <us> <rate> <backend>`, keyed by (a, b): decode
/// `PEER <batch> <context> <us> <TB/s of K/V read> <backend>`, prefill `PREFILL <history> <q_len>
/// <us> <TFLOP/s> <backend>` (peer_sdpa.py, and with --prefill).
std::map<std::pair<int, int>, Peer> read_peer(const std::string& path, const std::string& tag) {
  std::map<std::pair<int, int>, Peer> m;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(tag + " ", 0) != 0) continue;
    std::istringstream is(line.substr(tag.size() + 1));
    int a, b;
    Peer p;
    is >> a >> b >> p.us >> p.tbps >> p.backend;
    if (is) m[{a, b}] = p;
  }
  return m;
}

/// A table row's peer columns "us | backend | speedup" for `key` (our time `us`), or dashes where
/// the peer has no line for it.
std::string peer_columns(const std::map<std::pair<int, int>, Peer>& peer, std::pair<int, int> key, double us) {
  auto it = peer.find(key);
  if (it == peer.end()) return "- | - | -";
  char b[96];
  std::snprintf(b, sizeof b, "%.1f | %s | %.2fx", it->second.us, it->second.backend.c_str(), it->second.us / us);
  return b;
}

/// TFLOP/s of a causal prefill chunk of q queries over hist tokens of history: 4·head_dim per
/// (query head, visible key), kH query heads.
double prefill_tflops(int hist, int q, int head_dim, double us) {
  const double keys = double(q) * hist + double(q) * (q + 1) / 2;
  return 4.0 * head_dim * kH * keys / (us * 1e-6) / 1e12;
}

struct Buffers {
  uint8_t *kc = nullptr, *vc = nullptr;
  __half *kw = nullptr, *vw = nullptr, *q = nullptr, *out = nullptr;
  uint16_t *kcb = nullptr, *vcb = nullptr;
  uint8_t *kcb8 = nullptr, *vcb8 = nullptr;
  int32_t *len = nullptr, *rc = nullptr;
  float *ws_o = nullptr, *ws_ml = nullptr;
  int *counters = nullptr, *done = nullptr;
  size_t kc_bytes = 0, vc_bytes = 0;
  void free_all() {
    for (void* p : {(void*)kc, (void*)vc, (void*)kw, (void*)vw, (void*)q, (void*)out, (void*)kcb, (void*)vcb,
                    (void*)kcb8, (void*)vcb8, (void*)len, (void*)rc, (void*)ws_o, (void*)ws_ml, (void*)counters, (void*)done})
      if (p) cudaFree(p);
    *this = Buffers{};
  }
};

void grid_fill(uint8_t* p, size_t n, uint32_t seed) {
  fill_bytes<<<2048, 256>>>(p, n, seed);
  CK(cudaGetLastError());
}
void grid_fill(__half* p, size_t n, uint32_t seed, float scale) {
  fill_halves<<<2048, 256>>>(p, n, seed, scale);
  CK(cudaGetLastError());
}

Tensor to_device_bench(const Tensor& host) { return Tensor::copy_to(host.view(), Device::cuda(0)); }

std::vector<float> fp16_codebook(int n, int sub, std::mt19937_64& rng, std::vector<uint16_t>& bits) {
  std::normal_distribution<float> nd(0.0f, 0.7f);
  std::vector<float> cb(size_t(n) * sub);
  bits.resize(cb.size());
  for (size_t i = 0; i < cb.size(); ++i) {
    bits[i] = float_to_half(nd(rng));
    cb[i] = half_to_float(bits[i]);
  }
  return cb;
}

/// Host copies of one (b, kvh) segment and the oracle on them: NMSE of our output rows.
double validate_segment(const Buffers& bf, const cuda::AttnParams& p, const Spec& s, const std::vector<float>& kcb,
                        const std::vector<float>& vcb, int b, int kvh, bool win_all, bool int8_query = false) {
  const int L = p.seq_len ? 0 : 0;
  (void)L;
  int32_t len = 0, rc = 0;
  CK(cudaMemcpy(&len, p.seq_len + b, 4, cudaMemcpyDeviceToHost));
  if (p.res_count) CK(cudaMemcpy(&rc, p.res_count + b, 4, cudaMemcpyDeviceToHost));
  const int G = kH / kKV;
  ProductQuantizer kp(kD, {s.ks, s.kb}, kcb), vp(kD, {s.vs, s.vb}, vcb);
  KeyTransform tf(1, kD, {}, true);
  const int64_t n_code = win_all ? 0 : len - std::min(rc, len);
  const int64_t n_win = win_all ? len : std::min(rc, len);
  const int64_t bh = int64_t(b) * kKV + kvh;
  std::vector<uint8_t> kc(size_t(std::max<int64_t>(n_code, 1) * p.k_row_stride)),
      vc(size_t(std::max<int64_t>(n_code, 1) * p.v_row_stride));
  if (n_code > 0) {
    CK(cudaMemcpy(kc.data(), p.k_codes + bh * p.code_cap * p.k_row_stride, size_t(n_code) * p.k_row_stride,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vc.data(), p.v_codes + bh * p.code_cap * p.v_row_stride, size_t(n_code) * p.v_row_stride,
                  cudaMemcpyDeviceToHost));
  }
  const int64_t slots = p.win_ring ? p.win_cap : n_win;
  std::vector<uint16_t> kw(size_t(std::max<int64_t>(slots, 1) * kD)), vw(kw.size());
  if (n_win > 0) {
    CK(cudaMemcpy(kw.data(), static_cast<const uint16_t*>(p.k_win) + bh * p.win_cap * kD, size_t(slots) * kD * 2,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vw.data(), static_cast<const uint16_t*>(p.v_win) + bh * p.win_cap * kD, size_t(slots) * kD * 2,
                  cudaMemcpyDeviceToHost));
  }
  std::vector<uint16_t> q(size_t(G) * kD), o(size_t(G) * kD);
  for (int g = 0; g < G; ++g) {
    CK(cudaMemcpy(q.data() + g * kD, static_cast<const uint16_t*>(p.q.data) + (int64_t(b) * kH + kvh * G + g) * kD,
                  kD * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(o.data() + g * kD, static_cast<const uint16_t*>(p.out) + (int64_t(b) * kH + kvh * G + g) * kD,
                  kD * 2, cudaMemcpyDeviceToHost));
  }
  VecInferAttentionInputs in;
  in.key_pq = &kp;
  in.value_pq = &vp;
  in.transform = &tf;
  in.key_codes = TensorView(kc.data(), DType::U8, {1, 1, n_code, kp.code_bytes},
                            {n_code * p.k_row_stride, n_code * p.k_row_stride, p.k_row_stride, 1});
  in.value_codes = TensorView(vc.data(), DType::U8, {1, 1, n_code, vp.code_bytes},
                              {n_code * p.v_row_stride, n_code * p.v_row_stride, p.v_row_stride, 1});
  in.n_window = n_win;
  in.int8_query = int8_query;
  if (n_win > 0) {
    in.window_keys = TensorView(kw.data(), DType::F16, {1, 1, slots, kD});
    in.window_values = TensorView(vw.data(), DType::F16, {1, 1, slots, kD});
    in.window_first_slot = p.win_ring ? n_code % p.win_cap : 0;
  }
  TensorView qv(q.data(), DType::F16, {1, G, 1, kD});
  std::vector<float> want(size_t(G) * kD);
  TensorView wv(want.data(), DType::F32, {1, G, 1, kD});
  SdpaParams sp;
  vecinfer_attention_ref(in, qv, wv, sp);
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = half_to_float(o[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - want[i]) * (g - want[i]);
    den += double(want[i]) * want[i];
  }
  return num / std::max(den, 1e-30);
}

struct Row {
  std::string cfg;
  int B, L;
  double us, gbps, pct_copy, bytes;
  double nmse;
  double nmse_f32 = -1;  ///< E4M3 / int8 rows: NMSE against the oracle on the f32 (fp16-exact) codebooks and exact query
};

}  // namespace

/// "BxL" as (B, L); (0, 0) when it is not two positive integers around an x.
static std::pair<int, int> parse_shape(const std::string& s) {
  int b = 0, l = 0, used = 0;
  if (std::sscanf(s.c_str(), "%dx%d%n", &b, &l, &used) != 2 || used != int(s.size()) || b <= 0 || l <= 0) return {0, 0};
  return {b, l};
}

constexpr const char* kUsage = R"(usage: bench_decode_cuda [flags]   (on a GPU; one table, ratios against --peer)
  --peer FILE         the peer's times (bench/cuda/peer_sdpa.py --out FILE; scripts/cuda_bench.sh runs both)
  --reps N            timed calls per row (default 30)
  --filter TEXT       rows whose name contains TEXT; TEXT$: the one row named TEXT
  --shape BxL         one shape instead of the three (e.g. 1x131072)
  --quick             the batch-1 shape only
  --prefill           only the prefill table
  --plain             only the decode table at head_dim 96 and 80 (the plain kernel, through the cache API;
                      --plain-dim for 112, 160 or 192, or 64, 128 and 256, where the plain kernel serves
                      what no tuned kernel does: rows say which kernel ran; d8b12/d8b12 only with --filter d8b12)
  --plain-kv N        that table's kv heads (default 8, Llama's GQA; 32 is Phi-3's shape, no GQA)
  --plain-dim D       that table at head_dim D only (64, 80, 96, 112, 128, 160, 192 or 256; default 96 and 80)
  --plain --prefill   prompts at head_dim 96 and 80 (or --plain-dim) instead (peer: peer_sdpa.py --plain --prefill)
  --skip-encode, --skip-step          leave out the encode and decode-step tables
  --flush clean|dirty|none, --noflush  the L2 flush before each timed call (default clean)
  --guard-us US       a GPU spin after each flush (diagnosis)
  --profile           per-block phase timestamps (diagnosis)
  --startup-probe     a cold tile's landing at launch (diagnosis)
  A/B switches: --window-regs --window-last --value-gathers --no-cluster --no-hint --no-rows4 --no-wide
                --no-plain-rep (the plain kernel of head_dim 80/96 on one copy of each codebook)
                --window-weight W (the split planner's weight of a window token)
                --materialize-lanes [1|0] (the prefill expansion over head_dim / 16 lanes a row,
                the default, or a warp a row)
                --prefill-exact 0|1|2|3 (exact rows: vq_prefill_kernel / the 32-rows-a-warp kernel,
                tiles of 64 / of 32 tokens / automatic, the default: the latter where its grid fills
                two blocks a multiprocessor, or where its history split over 2-4 blocks does)
                --prefill-splits N (that split forced: 1 unsplit, 2-4 shares; 0 automatic)
)";

int main(int argc, char** argv) {
  std::string peer_path, filter;
  std::pair<int, int> shape_opt{0, 0};  // --shape, parsed (0, 0: the default shapes)
  int reps = 30;
  int window_weight = 0;  // 0: the library default
  Flush::Mode flush_mode = Flush::kClean;
  double guard_us = 0.0;
  bool startup_probe_only = false;
  bool quick = false, skip_encode = false, skip_step = false, profile = false, window_regs = false,
       value_gathers = false, window_last = false, no_cluster = false, no_hint = false, no_rows4 = false, no_wide = false, no_plain_rep = false, prefill = false, plain = false;
  int plain_kv = kKV, plain_dim = 0;  // --plain-kv, --plain-dim (0: 96 and 80)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--peer" && i + 1 < argc) peer_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--filter" && i + 1 < argc) filter = argv[++i];     // rows whose name contains it; TEXT$: the one row named TEXT
    else if (a == "--shape" && i + 1 < argc) {  // e.g. 1x16384
      shape_opt = parse_shape(argv[++i]);
      if (shape_opt.first <= 0) {
        std::fprintf(stderr, "bench_decode_cuda: --shape takes BATCHxTOKENS (e.g. 8x32768), not '%s'\n", argv[i]);
        return 2;
      }
    }
    else if (a == "--quick") quick = true;
    else if (a == "--prefill") prefill = true;  // only the prefill table (peer lines PREFILL from peer_sdpa.py --prefill)
    else if (a == "--plain") plain = true;  // only the head_dim 80/96 table (peer lines PEER80/PEER96 from peer_sdpa.py --plain)
    else if (a == "--plain-kv" && i + 1 < argc) plain_kv = std::atoi(argv[++i]);
    else if (a == "--plain-dim" && i + 1 < argc) plain_dim = std::atoi(argv[++i]);
    else if (a == "--skip-encode") skip_encode = true;
    else if (a == "--skip-step") skip_step = true;
    else if (a == "--noflush") flush_mode = Flush::kNone;  // L2 kept warm (diagnosis only)
    else if (a == "--guard-us" && i + 1 < argc) guard_us = std::atof(argv[++i]);  // a GPU spin after each flush (diagnosis)
    else if (a == "--flush" && i + 1 < argc) {  // clean (default) | dirty (before run 130) | none
      const std::string m = argv[++i];
      if (m != "clean" && m != "dirty" && m != "none") {
        std::fprintf(stderr, "--flush takes clean, dirty or none, not '%s'\n", m.c_str());
        return 2;
      }
      flush_mode = m == "clean" ? Flush::kClean : m == "dirty" ? Flush::kDirty : Flush::kNone;
    }
    else if (a == "--profile") profile = true;  // per-block phase timestamps (diagnosis only)
    else if (a == "--startup-probe") startup_probe_only = true;  // diagnosis: a cold tile's landing at launch
    else if (a == "--window-regs") window_regs = true;  // A/B: residual window through registers
    else if (a == "--window-last") window_last = true;  // A/B: residual window after the coded tokens (before run 125)
    else if (a == "--value-gathers") value_gathers = true;  // A/B: d8 value centroids gathered per lane (no ldmatrix)
    else if (a == "--no-cluster") no_cluster = true;  // A/B: splits merge through the workspace, never as clusters
    else if (a == "--no-hint") no_hint = true;  // A/B: no host length hint (as a captured decode step)
    else if (a == "--no-rows4") no_rows4 = true;  // A/B: GQA groups of <= 4 on the 8-row kernel
    else if (a == "--no-wide") no_wide = true;  // A/B: grids of two waves or more on the one-block kernels
    else if (a == "--no-plain-rep") no_plain_rep = true;  // A/B: the plain kernel (head_dim 80/96) on one codebook copy
    else if (a == "--materialize-lanes") {  // A/B: the prefill expansion, D/16 lanes a row (1, the default) or a warp (0)
      const bool arg = i + 1 < argc && (std::string(argv[i + 1]) == "0" || std::string(argv[i + 1]) == "1");
      cuda::set_materialize_lanes(arg ? std::atoi(argv[++i]) : 1);
    }
    else if (a == "--prefill-exact" && i + 1 < argc) cuda::set_prefill_exact_kernel(std::atoi(argv[++i]));  // A/B: exact rows' kernel
    else if (a == "--prefill-splits" && i + 1 < argc) cuda::set_prefill_exact_splits(std::atoi(argv[++i]));  // A/B: its history split
    else if (a == "--window-weight" && i + 1 < argc) window_weight = std::atoi(argv[++i]);  // A/B: split planning
    else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {  // a mistyped A/B flag must not time the default silently
      std::fprintf(stderr, "bench_decode_cuda: unknown argument '%s' (or a missing value)\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  // --filter: a trailing '$' asks for the one row of exactly that name ('d4b8/d4b8+i8$' leaves out +i8kv)
  const bool exact = !filter.empty() && filter.back() == '$';
  if (exact) filter.pop_back();
  auto selected = [&](const std::string& name) {
    return filter.empty() || (exact ? name == filter : name.find(filter) != std::string::npos);
  };
  cuda::attn_set_cluster_merge(!no_cluster);
  cuda::attn_set_rows4(!no_rows4);
  cuda::attn_set_wide(!no_wide);
  cuda::attn_set_plain_replicated(!no_plain_rep);
  cuda::attn_set_window_first(!window_last);
  if (!cuda_is_available()) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %.0f MB, smem/block opt-in %zu KB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6, prop.sharedMemPerBlockOptin / 1024);
  Timer tm;

  // ---- ceiling: device-to-device copy --------------------------------------------------------
  double copy_gbps = 0;
  {
    const size_t n = size_t(2) << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    std::vector<float> t;
    for (int r = 0; r < 12; ++r) {
      const float ms = tm.ms([&] { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); });
      if (r >= 2) t.push_back(ms);
    }
    copy_gbps = 2.0 * n / (median(t) * 1e-3) / 1e9;
    std::printf("HBM copy (D2D, read+write): %.0f GB/s\n", copy_gbps);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  Flush flush;
  flush.mode = flush_mode;
  flush.bytes = size_t(256) << 20;
  flush.blocks = 2 * prop.multiProcessorCount;
  flush.guard_ns = static_cast<unsigned long long>(guard_us * 1e3);
  CK(cudaMalloc(&flush.buf, flush.bytes));
  CK(cudaMemset(flush.buf, 1, flush.bytes));
  if (startup_probe_only) {
    Flush clean = flush;
    clean.mode = Flush::kClean;
    run_startup_probe(tm, clean);
    return 0;
  }
  {
    // Does the flush empty L2, and what does it leave for the timed launch? A 32 MB buffer X (half
    // of L2) is timed after "read X, flush" and after "read Y, flush" (Y another 32 MB): where the
    // flush empties L2, both are X's HBM time; were X's lines left in L2, the first would be
    // faster. Warm: after "read X" alone. The dirty flush's times carry its write-back.
    const size_t n = size_t(32) << 20;
    uint4 *x = nullptr, *y = nullptr;
    CK(cudaMalloc(&x, n));
    CK(cudaMalloc(&y, n));
    CK(cudaMemset(x, 1, n));
    CK(cudaMemset(y, 2, n));
    const int blocks = 4 * prop.multiProcessorCount;
    auto timed = [&](const uint4* before, Flush::Mode mode) {
      Flush f = flush;
      f.mode = mode;
      std::vector<float> t;
      for (int r = 0; r < 18; ++r) {
        stream_read<<<blocks, 512>>>(before, n / 16, nullptr);
        f(0, r);
        const float ms = tm.ms([&] { stream_read<<<blocks, 512>>>(x, n / 16, nullptr); });
        if (r >= 3) t.push_back(ms);
      }
      return median(t) * 1e3;
    };
    const double warm = timed(x, Flush::kNone), cx = timed(x, Flush::kClean), cy = timed(y, Flush::kClean),
                 dx = timed(x, Flush::kDirty), dy = timed(y, Flush::kDirty);
    CK(cudaGetLastError());
    CK(cudaFree(x));
    CK(cudaFree(y));
    std::printf("L2 flush check, a 32 MB read of X: %.1f us warm; clean flush %.1f us (X read before it) / %.1f us (Y read "
                "before it); dirty flush %.1f / %.1f us. Timed here with the %s flush\n",
                warm, cx, cy, dx, dy, flush.name());
  }

  // ---- decode at head_dim 96 and 80 or --plain-dim (--plain): the plain kernel, through the cache API
  // A MemoryBound cache (int8 keys, a 128-token window) or the fp16 cache, 32 q / 8 kv heads at
  // head_dim 96 (Phi-3) and 80 (Phi-2), filled by update() with random fp16 K/V, then
  // fused_sdpa_into of one query per sequence (an eager call, as a decode step's attention):
  // median device time, L2 flushed before each; GB/s over the bytes the call reads (code rows and
  // window rows, or the fp16 rows); the peer (peer_sdpa.py --plain: PyTorch SDPA over fp16 K/V
  // at the same head_dim, GQA native) from the same run. Validation: batch row 0 of every shape
  // against a CPU cache of the same configuration fed the same tokens (NMSE, bound 1e-2: the
  // int8 keys' rounding; a wrong token or dimension gives ~1).
  if (plain) {
    if (plain_kv <= 0 || kH % plain_kv != 0 || (plain_dim != 0 && !cuda::attn_plain_head_dim(plain_dim))) {
      std::fprintf(stderr, "bench_decode_cuda: --plain-kv takes a divisor of %d (got %d), --plain-dim one of 64, 80, 96, "
                   "112, 128, 160, 192, 256 (got %d)\n", kH, plain_kv, plain_dim);
      return 2;
    }
    const int KV = plain_kv;
    const std::vector<int> dims = plain_dim ? std::vector<int>{plain_dim} : std::vector<int>{96, 80};
    std::string dim_list;  // "96 and 80" (the tables' titles)
    for (int D : dims) dim_list += (dim_list.empty() ? "" : " and ") + std::to_string(D);
    const std::vector<BenchCache>& cfgs = bench_caches();
    // ---- --plain --prefill: prompts at head_dim 96 / 80 (or --plain-dim) ---------------------
    // A cache (batch 1) holding `hist` tokens takes a chunk of q (update), then fused_sdpa_into
    // of the chunk's q queries, causal, by whatever path the cache takes at these head dims (the
    // exact-rows prefill kernel over rows where the grid fills the GPU, else row chunks of the plain
    // kernel): median device time, L2 flushed before each. Validation: the
    // chunk's last 16 queries against a CPU cache fed the same tokens (a causal query sees the
    // same keys whether it comes in a chunk of q or of 16). Peer: peer_sdpa.py --plain --prefill
    // (lines PREFILL96 / PREFILL80; PyTorch SDPA over fp16 K/V, lower-right causal mask).
    if (prefill) {
      struct PCase {
        int hist, q;
      };
      const std::vector<PCase> pcases = {{0, 4096}, {3072, 1024}, {32768, 512}};  // PLAIN_PREFILL_CASES
      bool ok_all = true;
      std::printf("\nprefill attention at head_dim %s (the cache's default path: the exact-rows prefill kernel over rows where the grid fills the GPU, at 80 and 96), batch 1, %d q / %d kv heads, "
                  "window %d, causal\n", dim_list.c_str(), kH, KV, kR);
      std::printf("| head_dim | cache | history | chunk | us | TFLOP/s | peer us | peer | speedup | NMSE vs CPU (last 16) |\n");
      std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
      for (int D : dims) {
        const auto ppeer = peer_path.empty() ? std::map<std::pair<int, int>, Peer>{}
                                             : read_peer(peer_path, "PREFILL" + std::to_string(D));
        for (const BenchCache& pc : cfgs)
          for (const PCase& c : pcases) {
            if (!selected(pc.name) || (filter.empty() && pc.s.ks == 8 && pc.s.kb == 12)) continue;  // d8b12: asked for
            const KVCacheConfig cfg = bench_cache_config(pc, D, KV);
            auto cache = KVCacheFactory::create(cfg);
            dynamic_cast<CudaKVCache*>(cache.get())->reserve(c.hist + c.q, 1);
            KVCacheConfig ccpu = cfg;
            ccpu.device = Device::cpu();
            auto cpu = KVCacheFactory::create(ccpu);
            uint64_t st = 0xD1B54A32D192ED03ull ^ uint64_t(D * 7919 + c.hist + c.q);
            auto feed = [&](int n) {  // n tokens into both caches
              Tensor hk = Tensor::empty({1, KV, n, D}, DType::F16), hv = Tensor::empty({1, KV, n, D}, DType::F16);
              lcg_fill_f16(hk, st), lcg_fill_f16(hv, st);
              Tensor dk = to_device_bench(hk), dv = to_device_bench(hv);
              cache->update(dk.view(), dv.view());
              cpu->update(hk.view(), hv.view());
            };
            for (int h = 0; h < c.hist; h += 8192) feed(std::min(8192, c.hist - h));
            feed(c.q);
            Tensor hq = Tensor::empty({1, kH, c.q, D}, DType::F16);
            lcg_fill_f16(hq, st);
            Tensor q = to_device_bench(hq);
            Tensor out = Tensor::empty({1, kH, c.q, D}, DType::F16, Device::cuda(0));
            CK(cudaDeviceSynchronize());
            SdpaParams sp;
            sp.causal = true;
            const double us = flushed_median_us(tm, flush, 2, std::max(5, reps / 2),
                                                [&] { cache->fused_sdpa_into(q.view(), out.view(), sp); });
            // the last 16 queries against the CPU cache
            const int t = std::min(16, c.q);
            Tensor hq16 = Tensor::empty({1, kH, t, D}, DType::F16);
            std::vector<uint16_t> got(size_t(kH) * t * D), all(size_t(kH) * c.q * D);
            CK(cudaMemcpy(all.data(), out.data(), all.size() * 2, cudaMemcpyDeviceToHost));
            for (int h = 0; h < kH; ++h) {
              std::memcpy(hq16.ptr<uint16_t>() + size_t(h) * t * D, hq.ptr<uint16_t>() + (size_t(h) * c.q + c.q - t) * D,
                          size_t(t) * D * 2);
              std::memcpy(got.data() + size_t(h) * t * D, all.data() + (size_t(h) * c.q + c.q - t) * D, size_t(t) * D * 2);
            }
            double e = 1.0;
            const bool ok = nmse_vs(got.data(), cpu->fused_sdpa(hq16.view(), sp).to_vector_f32(), got.size(), e) && e < 1e-2;
            ok_all &= ok;
            std::printf("| %d | %s | %d | %d | %.1f | %.1f | %s | %.1e%s |\n", D, pc.name.c_str(), c.hist, c.q, us,
                        prefill_tflops(c.hist, c.q, D, us), peer_columns(ppeer, {c.hist, c.q}, us).c_str(), e,
                        ok ? "" : " FAILED");
            std::fflush(stdout);
          }
      }
      std::printf("\nhead_dim %s prefill validation: %s\n", dim_list.c_str(), ok_all ? "every chunk's last 16 queries within 1e-2 of the CPU cache" : "FAILED");
      cudaFree(flush.buf);
      return ok_all ? 0 : 1;
    }
    const std::vector<std::pair<int, int>> pshapes =
        quick ? std::vector<std::pair<int, int>>{{1, 131072}}
              : std::vector<std::pair<int, int>>{{1, 131072}, {8, 32768}, {64, 16384}};
    bool plain_ok = true;
    std::printf("\ndecode attention at head_dim %s (through the cache API: the plain kernel where no tuned kernel "
                "serves), %d q / %d kv heads, q_len 1, window %d\n", dim_list.c_str(), kH, KV, kR);
    std::printf("| head_dim | cache | kernel | batch x tokens | us | GB/s | bytes read | peer us | peer | speedup | NMSE vs CPU (row 0) |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int D : dims) {
      const auto dpeer =
          peer_path.empty() ? std::map<std::pair<int, int>, Peer>{} : read_peer(peer_path, "PEER" + std::to_string(D));
      for (const BenchCache& pc : cfgs)
        for (const auto& [B, L] : pshapes) {
          if (!selected(pc.name) || (filter.empty() && pc.s.ks == 8 && pc.s.kb == 12)) continue;  // d8b12: asked for
          const KVCacheConfig cfg = bench_cache_config(pc, D, KV);
          const bool fp = pc.kind == CacheKind::FP16;
          const bool tuned = cuda::attn_tuned_compiled(
              {D, fp ? 4 : pc.s.ks, fp ? 8 : pc.s.kb, fp ? 4 : pc.s.vs, fp ? 8 : pc.s.vb, 1, fp ? 0 : int(pc.fmt)});
          auto cache = KVCacheFactory::create(cfg);
          auto* cc = dynamic_cast<CudaKVCache*>(cache.get());
          cc->reserve(L, B);
          KVCacheConfig ccpu = cfg;
          ccpu.device = Device::cpu();
          auto cpu = KVCacheFactory::create(ccpu);
          // fill: host chunks [B, kv, n, D] of fp16 from a fast LCG, uploaded; row 0 also to the CPU twin
          const int chunk = std::max(1, std::min(L, (1 << 21) / B));
          Tensor hk = Tensor::empty({B, KV, chunk, D}, DType::F16), hv = Tensor::empty({B, KV, chunk, D}, DType::F16);
          uint64_t st = 0x9E3779B97F4A7C15ull ^ uint64_t(D * 1000003 + B);
          auto fill_host = [&](Tensor& t) { lcg_fill_f16(t, st); };
          for (int t0 = 0; t0 < L; t0 += chunk) {
            const int n = std::min(chunk, L - t0);
            fill_host(hk), fill_host(hv);
            Tensor dk = to_device_bench(hk), dv = to_device_bench(hv);
            TensorView kd = dk.view(), vd = dv.view(), k0 = hk.view(), v0 = hv.view();
            kd.shape[2] = vd.shape[2] = n;
            cache->update(kd, vd);
            // row 0 of the host chunk, its first n tokens: [1, kv, n, D] with the chunk's strides
            k0.shape[0] = v0.shape[0] = 1;
            k0.shape[2] = v0.shape[2] = n;
            cpu->update(k0, v0);
          }
          Tensor hq = Tensor::empty({B, kH, 1, D}, DType::F16);
          fill_host(hq);
          Tensor q = to_device_bench(hq);
          Tensor out = Tensor::empty({B, kH, 1, D}, DType::F16, Device::cuda(0));
          CK(cudaDeviceSynchronize());
          SdpaParams sp;
          sp.causal = true;
          const double us = flushed_median_us(tm, flush, 3, reps, [&] { cache->fused_sdpa_into(q.view(), out.view(), sp); });
          // validation: row 0 against the CPU twin
          TensorView q0 = hq.view();
          q0.shape[0] = 1;
          const Tensor want = cpu->fused_sdpa(q0, sp);
          std::vector<uint16_t> got(size_t(kH) * D);
          CK(cudaMemcpy(got.data(), out.data(), got.size() * 2, cudaMemcpyDeviceToHost));
          double e = 1.0;
          const bool ok = nmse_vs(got.data(), want.to_vector_f32(), got.size(), e) && e < 1e-2;
          plain_ok &= ok;
          // bytes read: the coded tokens' rows and the window's (VecInfer), or every fp16 row
          const int64_t R = pc.kind == CacheKind::VecInfer ? std::min<int64_t>(kR, L) : L;
          const int krs = ((D / pc.s.ks * pc.s.kb + 7) / 8 + 3) / 4 * 4, vrs = ((D / pc.s.vs * pc.s.vb + 7) / 8 + 3) / 4 * 4;
          const double bytes = double(B) * KV *
                                   (pc.kind == CacheKind::VecInfer ? double(L - R) * (krs + vrs) : 0.0) +
                               double(B) * KV * R * D * 4.0 + 2.0 * B * kH * D * 2.0;
          std::printf("| %d | %s | %s | %dx%d | %.1f | %.0f | %.1f MB | %s | %.1e%s |\n", D, pc.name.c_str(),
                      tuned ? "tuned" : "plain", B, L, us,
                      bytes / (us * 1e-6) / 1e9, bytes / 1e6, peer_columns(dpeer, {B, L}, us).c_str(), e,
                      ok ? "" : " FAILED");
          std::fflush(stdout);
        }
    }
    std::printf("\nhead_dim %s validation: %s\n", dim_list.c_str(), plain_ok ? "every row 0 within 1e-2 of the CPU cache" : "FAILED");
    cudaFree(flush.buf);
    return plain_ok ? 0 : 1;
  }

  // ---- prefill: attention of a chunk of queries over the coded history (--prefill) ----------
  // A cache (MemoryBound, int8 keys, batch 1, Llama-3.1-8B layer) holding `hist` tokens takes a
  // chunk of q tokens (update), then fused_sdpa_into of the chunk's q queries, causal (query i
  // sees hist + i + 1 tokens): median device time of the attention alone, L2 flushed before
  // each, by the prefill kernel (run 116; blocks of 64 and of 128 query rows, run 121), by the
  // decode kernel's row chunks in one launch
  // (run 115) and in one launch per 16 queries (before run 115), by the prefill kernel over the
  // tokens expanded once into exact rows (run 169; coded caches), and which of them the default
  // (cuda::kPrefillAuto, cuda::kRowsAuto) takes; all outputs must agree (the prefill kernel's fp16 query and
  // centroids differ from the decode kernel's int8 ones by rounding only); the fp16 device
  // cache over the same tokens for context; the peer (peer_sdpa.py --prefill: PyTorch SDPA over
  // fp16 K/V with a lower-right causal mask) from the same run. TFLOP/s count 4·head_dim per
  // (query head, visible key).
  if (prefill) {
    const auto ppeer = peer_path.empty() ? std::map<std::pair<int, int>, Peer>{} : read_peer(peer_path, "PREFILL");
    struct PCase {
      int hist, q;
    };
    // (3072 x 1024: the defaults' routing threshold, cuda::kPrefillShortHistory = 4 chunks of tokens)
    const std::vector<PCase> pcases = {{0, 4096}, {3072, 1024}, {8192, 512}, {32768, 512}, {32768, 2048}};
    const std::vector<BenchCache>& pcfgs = bench_caches();
    std::printf("\nprefill attention, batch 1, %d q / %d kv heads, head_dim %d, window %d, causal; int8 keys\n", kH, kKV, kD, kR);
    std::printf("| cache | history | chunk | prefill kernel, 64-row blocks us | prefill kernel, 128-row blocks us | "
                "prefill kernel over dequantized rows us | decode kernel, one launch us | 16-query launches us | "
                "default path | default us | default vs 16-query | TFLOP/s | peer us | peer | speedup | "
                "NMSE prefill 64 / 128 / rows / one launch vs 16 |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    bool prefill_ok = true;
    for (const BenchCache& pc : pcfgs)
      for (const PCase& c : pcases) {
        if (!selected(pc.name)) continue;  // --filter applies to the prefill table's caches too
        if (pc.s.ks == 8 && pc.s.kb == 12) continue;  // (the --plain tables' plain-kernel configuration)
        KVCacheConfig cfg = device_cache_config(pc.s, pc.fmt, nullptr);
        cfg.kind = pc.kind;
        auto cache = KVCacheFactory::create(cfg);
        auto* cc = dynamic_cast<CudaKVCache*>(cache.get());
        cc->reserve(c.hist + c.q, 1);
        const int fill = 8192;
        Tensor kx = Tensor::empty({1, kKV, fill, kD}, DType::F16, Device::cuda(0));
        Tensor vx = Tensor::empty({1, kKV, fill, kD}, DType::F16, Device::cuda(0));
        grid_fill(static_cast<__half*>(kx.data()), size_t(kx.numel()), 71, 1.0f);
        grid_fill(static_cast<__half*>(vx.data()), size_t(vx.numel()), 72, 1.0f);
        for (int h = 0; h < c.hist; h += fill) {
          const int n = std::min(fill, c.hist - h);
          TensorView kv = kx.view(), vv = vx.view();
          kv.shape[2] = vv.shape[2] = n;
          cache->update(kv, vv);
        }
        Tensor kn = Tensor::empty({1, kKV, c.q, kD}, DType::F16, Device::cuda(0));
        Tensor vn = Tensor::empty({1, kKV, c.q, kD}, DType::F16, Device::cuda(0));
        Tensor q = Tensor::empty({1, kH, c.q, kD}, DType::F16, Device::cuda(0));
        Tensor od = Tensor::empty({1, kH, c.q, kD}, DType::F16, Device::cuda(0));
        Tensor od128 = Tensor::empty({1, kH, c.q, kD}, DType::F16, Device::cuda(0));
        Tensor odef = Tensor::empty({1, kH, c.q, kD}, DType::F16, Device::cuda(0));
        Tensor orows = Tensor::empty({1, kH, c.q, kD}, DType::F16, Device::cuda(0));
        Tensor o1 = Tensor::empty({1, kH, c.q, kD}, DType::F16, Device::cuda(0));
        Tensor o16 = Tensor::empty({1, kH, c.q, kD}, DType::F16, Device::cuda(0));
        grid_fill(static_cast<__half*>(kn.data()), size_t(kn.numel()), 73, 1.0f);
        grid_fill(static_cast<__half*>(vn.data()), size_t(vn.numel()), 74, 1.0f);
        grid_fill(static_cast<__half*>(q.data()), size_t(q.numel()), 75, 1.0f);
        cache->update(kn.view(), vn.view());
        CK(cudaDeviceSynchronize());
        SdpaParams sp;
        sp.causal = true;
        long long pre_launches = 0;
        long long rows_launches = 0;
        auto time_with = [&](int mode, int per_launch, Tensor& out, int rows = 0, int rows_mode = cuda::kRowsOff) {
          const int prev_rows_mode = cuda::set_prefill_rows_mode(rows_mode);
          const long long rows_before = cuda::prefill_rows_launches();
          const int prev_mode = cuda::set_prefill_mode(mode);
          const int prev = cuda::set_prefill_launch_queries(per_launch);
          const int prev_rows = cuda::set_prefill_block_rows(rows);
          const long long before = cuda::prefill_launches();
          const double us = flushed_median_us(tm, flush, 2, std::max(5, reps / 2),
                                              [&] { cache->fused_sdpa_into(q.view(), out.view(), sp); });
          pre_launches = cuda::prefill_launches() - before;
          cuda::set_prefill_block_rows(prev_rows);
          cuda::set_prefill_launch_queries(prev);
          cuda::set_prefill_mode(prev_mode);
          rows_launches = cuda::prefill_rows_launches() - rows_before;
          cuda::set_prefill_rows_mode(prev_rows_mode);
          return us;
        };
        // blocks of 64 rows: VQ_CUDA_VARIANTS builds only
        const bool has64 = cuda::prefill_compiled({kD, pc.s.ks, pc.s.kb, pc.s.vs, pc.s.vb, 1}, 64);
        const double usp = has64 ? time_with(cuda::kPrefillAlways, 0, od, 64) : 0.0;
        const double usp128 = time_with(cuda::kPrefillAlways, 0, od128, 128);
        // over dequantized rows (run 169): forced, coded caches only (the fp16 cache's rows are exact)
        const bool coded = pc.kind == CacheKind::VecInfer;
        const double usr = coded ? time_with(cuda::kPrefillAuto, 0, orows, 0, cuda::kRowsAlways) : 0.0;
        const bool rows_ran = coded && rows_launches > 0;
        const double us1 = time_with(cuda::kPrefillOff, 0, o1), us16 = time_with(cuda::kPrefillOff, 16, o16);
        const double usd = time_with(cuda::kPrefillAuto, 0, odef, 0, cuda::kRowsAuto);  // the default path, timed itself
        const bool ran_prefill = pre_launches > 0, def_rows = rows_launches > 0;
        auto nmse_vs16 = [&](const Tensor& o, bool& finite) {
          std::vector<uint16_t> ha(size_t(o.numel())), hb(ha.size());
          CK(cudaMemcpy(ha.data(), o.data(), ha.size() * 2, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hb.data(), o16.data(), hb.size() * 2, cudaMemcpyDeviceToHost));
          double num = 0, den = 0;
          for (size_t i = 0; i < ha.size(); ++i) {
            const double a = half_to_float(ha[i]), b = half_to_float(hb[i]);
            finite &= std::isfinite(a) && std::isfinite(b);
            num += (a - b) * (a - b), den += b * b;
          }
          finite &= den > 0;
          return den > 0 ? num / den : 1.0;
        };
        bool finite = true;
        const double nmse_d = has64 ? nmse_vs16(od, finite) : 0.0, nmse_128 = nmse_vs16(od128, finite), nmse_1 = nmse_vs16(o1, finite);
        const double nmse_def = nmse_vs16(odef, finite), nmse_rows = rows_ran ? nmse_vs16(orows, finite) : 0.0;
        const bool ok = finite && nmse_d < 1e-4 && nmse_128 < 1e-4 && nmse_1 < 1e-5 && nmse_def < 1e-4 &&
                        nmse_rows < 1e-4 && rows_ran == coded;
        prefill_ok &= ok;
        const double tflops = prefill_tflops(c.hist, c.q, kD, usd);
        const std::string peer_cols = peer_columns(ppeer, {c.hist, c.q}, usd);
        char us64[32] = "-", nmse64[32] = "-", usrows[48] = "-", nmserows[32] = "-";
        if (has64) std::snprintf(us64, sizeof us64, "%.1f", usp), std::snprintf(nmse64, sizeof nmse64, "%.1e", nmse_d);
        if (rows_ran)
          std::snprintf(usrows, sizeof usrows, "%.1f (%.2fx the codes)", usr, usp128 / usr),
              std::snprintf(nmserows, sizeof nmserows, "%.1e", nmse_rows);
        std::printf("| %s | %d | %d | %s | %.1f | %s | %.1f | %.1f | %s | %.1f | %.2fx | %.0f | %s | %s / %.1e / %s / %.1e%s |\n",
                    pc.name.c_str(), c.hist, c.q, us64, usp128, usrows, us1, us16,
                    def_rows ? "prefill kernel over rows" : ran_prefill ? "prefill kernel" : "decode kernel", usd,
                    us16 / usd, tflops, peer_cols.c_str(), nmse64, nmse_128, nmserows, nmse_1, ok ? "" : " FAILED");
        std::fflush(stdout);
      }
    std::printf("\nprefill validation: %s\n", prefill_ok ? "every path's output agrees with the 16-query launches'"
                                                          : "PREFILL PATHS DISAGREE");
    cudaFree(flush.buf);
    return prefill_ok ? 0 : 1;
  }

  const std::map<std::pair<int, int>, Peer> peer = peer_path.empty() ? std::map<std::pair<int, int>, Peer>{}
                                                                     : read_peer(peer_path, "PEER");
  std::vector<std::pair<int, int>> shapes = quick ? std::vector<std::pair<int, int>>{{1, 131072}}
                                                  : std::vector<std::pair<int, int>>{{1, 131072}, {8, 32768}, {64, 16384}};
  if (shape_opt.first > 0) {
    shapes = {shape_opt};
  }

  // ---- ceiling per shape: one launch that only reads the d4b8 rows' bytes ---------------------
  // The % of copy of a decode row compares a single launch over tens of MB with a 2 GB copy; this
  // is what any one kernel reading exactly those bytes (codes + window + q and out, as the rows
  // count them) reaches here, launch and ramp included: the best of a few grid sizes, median of
  // 20 runs after an L2 flush.
  std::map<std::pair<int, int>, std::pair<double, double>> read_ceiling;  // (B, L) -> (us, GB/s)
  if (selected("ceiling") || selected("d4b8")) {
    for (auto [B, L] : shapes) {
      const double bytes = double(B) * kKV * (double(L - kR) * (32 + 32) + double(kR) * kD * 2 * 2) + 2.0 * B * kH * kD * 2;
      const size_t n16 = size_t(bytes + 15) / 16;
      uint4* buf = nullptr;
      CK(cudaMalloc(&buf, n16 * 16));
      CK(cudaMemset(buf, 1, n16 * 16));
      double best = 1e30;
      int best_blocks = 0;
      for (int per_sm : {1, 2, 4, 8}) {
        const int blocks = prop.multiProcessorCount * per_sm;
        const double us = flushed_median_us(tm, flush, 3, 20,
                                            [&] { stream_read<<<blocks, 512>>>(buf, n16, nullptr); });
        if (us < best) best = us, best_blocks = blocks;
      }
      CK(cudaGetLastError());
      CK(cudaFree(buf));
      const double gbps = bytes / (best * 1e-6) / 1e9;
      read_ceiling[{B, L}] = {best, gbps};
      std::printf("read-only ceiling, d4b8 bytes at B=%-3d L=%-7d %7.1f MB: %7.1f us, %6.0f GB/s (%5.1f%% of copy; %d blocks of "
                  "512); 70%% of copy would be %.1f us\n",
                  B, L, bytes / 1e6, best, gbps, 100.0 * gbps / copy_gbps, best_blocks, bytes / (0.7 * copy_gbps * 1e3));
    }
  }
  // each configuration with fp16 codebooks, E4M3 codebooks, int8 keys, int8 keys and values
  std::vector<Spec> specs;
  for (const Spec& s : std::vector<Spec>{{4, 8, 4, 8}, {4, 12, 8, 8}, {8, 12, 8, 12}, {4, 10, 8, 12}, {8, 8, 8, 8}})
    for (int f = 0; f < 4; ++f) specs.push_back({s.ks, s.kb, s.vs, s.vb, f});
  std::vector<Row> rows;
  std::mt19937_64 rng(1234);
  int dev = 0;
  const int sms = prop.multiProcessorCount;
  bool all_valid = true;

  // ---- decode attention --------------------------------------------------------------------
  // One measurement: buffers for (spec, B, L), the launch validated on two segments, then timed.
  // launch(p) runs the kernel; bps is its occupancy (for the split planner).
  auto measure = [&](const std::string& name, const Spec& s, int B, int L, bool fp, int bps,
                     const std::function<void(const cuda::AttnParams&)>& launch, int splits = 0) -> Row {
    std::vector<uint16_t> kbits, vbits;
    std::mt19937_64 crng(s.kb * 131 + s.vb);
    const std::vector<float> kcb = fp16_codebook(1 << s.kb, s.ks, crng, kbits);
    const std::vector<float> vcb = fp16_codebook(1 << s.vb, s.vs, crng, vbits);
    Buffers bf;
    const int krs = int(packed_row_bytes(kD / s.ks, s.kb) + 3) / 4 * 4;
    const int vrs = int(packed_row_bytes(kD / s.vs, s.vb) + 3) / 4 * 4;
    const int64_t nbh = int64_t(B) * kKV;
    const int64_t wcap = fp ? L : kR;
    if (!fp) {
      bf.kc_bytes = size_t(nbh * L) * krs + 256;
      bf.vc_bytes = size_t(nbh * L) * vrs + 256;
      CK(cudaMalloc(&bf.kc, bf.kc_bytes));
      CK(cudaMalloc(&bf.vc, bf.vc_bytes));
      grid_fill(bf.kc, bf.kc_bytes, 17);
      grid_fill(bf.vc, bf.vc_bytes, 29);
    }
    CK(cudaMalloc(&bf.kw, size_t(nbh * wcap * kD) * 2));
    CK(cudaMalloc(&bf.vw, size_t(nbh * wcap * kD) * 2));
    grid_fill(bf.kw, size_t(nbh * wcap * kD), 5, 1.0f);
    grid_fill(bf.vw, size_t(nbh * wcap * kD), 7, 1.0f);
    CK(cudaMalloc(&bf.q, size_t(B) * kH * kD * 2));
    CK(cudaMalloc(&bf.out, size_t(B) * kH * kD * 2));
    grid_fill(bf.q, size_t(B) * kH * kD, 3, 1.0f);
    CK(cudaMalloc(&bf.kcb, kbits.size() * 2));
    CK(cudaMalloc(&bf.vcb, vbits.size() * 2));
    CK(cudaMemcpy(bf.kcb, kbits.data(), kbits.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bf.vcb, vbits.data(), vbits.size() * 2, cudaMemcpyHostToDevice));
    const E4M3Codebook k8 = make_e4m3_codebook(kcb), v8 = make_e4m3_codebook(vcb);
    const I8Codebook ki = make_i8_codebook(kcb), vi = make_i8_codebook(vcb);
    if (s.fmt == 1) {
      CK(cudaMalloc(&bf.kcb8, k8.bytes.size()));
      CK(cudaMalloc(&bf.vcb8, v8.bytes.size()));
      CK(cudaMemcpy(bf.kcb8, k8.bytes.data(), k8.bytes.size(), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(bf.vcb8, v8.bytes.data(), v8.bytes.size(), cudaMemcpyHostToDevice));
    } else if (s.fmt >= 2) {
      CK(cudaMalloc(&bf.kcb8, ki.bytes.size()));
      CK(cudaMemcpy(bf.kcb8, ki.bytes.data(), ki.bytes.size(), cudaMemcpyHostToDevice));
      if (s.fmt == 3) {  // values in offset binary (int8 + 128), as the CUDA cache uploads them
        const std::vector<uint8_t> vb = i8_offset_binary(vi);
        CK(cudaMalloc(&bf.vcb8, vb.size()));
        CK(cudaMemcpy(bf.vcb8, vb.data(), vb.size(), cudaMemcpyHostToDevice));
      }
    }
    CK(cudaMalloc(&bf.len, B * 4));
    CK(cudaMalloc(&bf.rc, B * 4));
    std::vector<int32_t> lens(size_t(B), L), rcs(size_t(B), fp ? 0 : kR);
    CK(cudaMemcpy(bf.len, lens.data(), B * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bf.rc, rcs.data(), B * 4, cudaMemcpyHostToDevice));
    const int S = splits > 0 ? splits : cuda::plan_splits(int(nbh), L, sms, bps);
    CK(cudaMalloc(&bf.ws_o, size_t(nbh) * S * 8 * kD * 4));
    CK(cudaMalloc(&bf.ws_ml, size_t(nbh) * S * 8 * 2 * 4));
    CK(cudaMalloc(&bf.counters, size_t(nbh) * 4));
    CK(cudaMalloc(&bf.done, 4));
    CK(cudaMemset(bf.counters, 0, size_t(nbh) * 4));
    CK(cudaMemset(bf.done, 0, 4));
    cuda::AttnParams p;
    p.batch = B;
    p.n_heads = kH;
    p.n_kv_heads = kKV;
    p.head_dim = kD;
    p.q_len = 1;
    p.q_tail = 1;
    p.q.data = bf.q;
    p.q.dtype = DType::F16;
    p.q.stride[0] = int64_t(kH) * kD, p.q.stride[1] = kD, p.q.stride[2] = kD, p.q.stride[3] = 1;
    p.out = bf.out;
    p.out_dtype = DType::F16;
    p.out_stride[0] = int64_t(kH) * kD, p.out_stride[1] = kD, p.out_stride[2] = kD, p.out_stride[3] = 1;
    p.k_codes = bf.kc;
    p.v_codes = bf.vc;
    p.code_cap = L;
    p.k_row_stride = krs;
    p.v_row_stride = vrs;
    p.k_cb16 = bf.kcb;
    p.v_cb16 = bf.vcb;
    if (s.fmt == 1) {
      p.k_cb8 = bf.kcb8;
      p.v_cb8 = bf.vcb8;
      p.k_cb_qmul = 1.0f / k8.scale;
      p.v_cb_omul = 1.0f / v8.scale;
    } else if (s.fmt >= 2) {
      p.k_cb8 = bf.kcb8;
      p.k_cb_qmul = ki.scale;
      if (s.fmt == 3) p.v_cb8 = bf.vcb8, p.v_cb_omul = vi.scale;
    }
    p.use_hadamard = 1;
    p.hadamard_scale = float(1.0 / std::sqrt(double(kD)));
    p.k_win = bf.kw;
    p.v_win = bf.vw;
    p.win_cap = wcap;
    p.win_ring = fp ? 0 : 1;
    p.win_all = fp;
    p.seq_len = bf.len;
    p.res_count = fp ? nullptr : bf.rc;
    p.residual_length = fp ? 0 : kR;
    p.scale_log2 = float(1.0 / std::sqrt(double(kD)) * 1.4426950408889634);
    p.causal = 1;
    p.n_splits = S;
    p.window_staged = window_regs ? 0 : 1;
    p.value_ldsm = value_gathers ? 0 : 1;
    if (window_weight > 0) p.window_weight = window_weight;
    p.n_row_chunks = 1;
    p.rows_per_chunk = 8;
    // the length hint, as an eager cache call passes it (CudaCacheBase::run_attention)
    if (!fp && !no_hint) cuda::attn_set_length_hint(p, L, kR);
    p.ws_o = bf.ws_o;
    p.ws_ml = bf.ws_ml;
    p.counters = bf.counters;
    p.done_counter = bf.done;
    CK(cudaMemset(bf.out, 0xFF, size_t(B) * kH * kD * 2));  // poison: NaN halves
    const long long clusters_before = cuda::attn_cluster_launches(), wide_before = cuda::attn_wide_launches();
    launch(p);
    // how the splits merged: as clusters (distributed shared memory) or through the workspace
    const char* merge = S == 1 ? "-" : cuda::attn_cluster_launches() > clusters_before ? "cl" : "ws";
    // blocks per SM of the kernel that ran: a two-blocks kernel (attn_set_wide) or the planned one
    const int occ = cuda::attn_wide_launches() > wide_before ? 2 : bps;
    CK(cudaDeviceSynchronize());
    double worst = 0, worst_f32 = -1;
    for (auto [b, h] : {std::pair{0, 0}, std::pair{B - 1, kKV - 1}}) {
      // E4M3 / int8 rows: the oracle on the centroids (and int8 query) the kernel computes
      // with, and (reported) the one on the f32 codebooks and exact query
      const std::vector<float>& kc = s.fmt == 1 ? k8.decoded : s.fmt >= 2 ? ki.decoded : kcb;
      const std::vector<float>& vc = s.fmt == 1 ? v8.decoded : s.fmt == 3 ? vi.decoded : vcb;
      worst = std::max(worst, validate_segment(bf, p, s, kc, vc, b, h, fp, s.fmt >= 2));
      if (s.fmt) worst_f32 = std::max(worst_f32, validate_segment(bf, p, s, kcb, vcb, b, h, fp));
    }
    const bool ok = worst <= 2e-4;
    all_valid &= ok;
    const double us = flushed_median_us(tm, flush, 3, reps, [&] { launch(p); });
    if (profile && !fp) {
      // One more launch with phase stamps: where a block's time goes (clock64 per phase) and how
      // the blocks spread in time (globaltimer). Cycles become microseconds at the SM clock the
      // blocks ran at: the median over blocks of clock64 cycles per globaltimer nanosecond from
      // entry to exit (under load the clock sits below the driver's nominal rate).
      const int nblk = S * kKV * B;
      unsigned long long* dprof = nullptr;
      CK(cudaMalloc(&dprof, size_t(nblk) * cuda::kAttnProfSlots * 8));
      CK(cudaMemset(dprof, 0, size_t(nblk) * cuda::kAttnProfSlots * 8));
      flush(0, 7);
      cuda::AttnParams pp = p;
      pp.prof = dprof;
      launch(pp);
      CK(cudaDeviceSynchronize());
      std::vector<unsigned long long> h(size_t(nblk) * cuda::kAttnProfSlots);
      CK(cudaMemcpy(h.data(), dprof, h.size() * 8, cudaMemcpyDeviceToHost));
      CK(cudaFree(dprof));
      int khz = 0;
      CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
      const char* names[] = {"setup", "coded loop (warp 0)", "window (warp 0)", "wait for all warps",
                             "combine + partial write", "fence + arrival / cluster barrier", "merge (last block / cluster share)"};
      unsigned long long g0 = ~0ull, g1 = 0, e1 = 0;
      for (int i = 0; i < nblk; ++i) {
        const unsigned long long* r = &h[size_t(i) * cuda::kAttnProfSlots];
        g0 = std::min(g0, r[8]), g1 = std::max(g1, r[9]), e1 = std::max(e1, r[8]);
      }
      double ghz = khz / 1e6;  // cycles per ns; nominal unless the stamps measure it
      {
        std::vector<double> rate;
        for (int i = 0; i < nblk; ++i) {
          const unsigned long long* r = &h[size_t(i) * cuda::kAttnProfSlots];
          if (r[9] > r[8] + 1000 && r[7] > r[0]) rate.push_back(double(r[7] - r[0]) / double(r[9] - r[8]));
        }
        if (!rate.empty()) std::sort(rate.begin(), rate.end()), ghz = rate[rate.size() / 2];
      }
      std::printf("  profile (%d blocks, SM clock %.2f GHz measured, %.2f nominal): first entry -> last exit %.1f us, "
                  "entries spread %.1f us\n",
                  nblk, ghz, khz / 1e6, (g1 - g0) / 1e3, (e1 - g0) / 1e3);
      {  // how busy the multiprocessors were: block time over (blocks resident at once x span)
        std::vector<double> life;
        double busy = 0.0;
        for (int i = 0; i < nblk; ++i) {
          const unsigned long long* r = &h[size_t(i) * cuda::kAttnProfSlots];
          if (r[9] > r[8]) life.push_back(double(r[9] - r[8]) / 1e3), busy += life.back();
        }
        int sms = 0;
        CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        if (!life.empty()) {
          std::sort(life.begin(), life.end());
          const int slots = std::min(nblk, sms * std::max(1, bps));
          std::printf("    block lifetime median %.1f us, max %.1f us; %d block slots busy %.1f%% of the span\n",
                      life[life.size() / 2], life.back(), slots, 100.0 * busy / (slots * ((g1 - g0) / 1e3)));
        }
      }
      auto at = [&](int i, int k) { return h[size_t(i) * cuda::kAttnProfSlots + k]; };  // block i's stamp k
      // one phase, stamp `from` to stamp `to`, over the blocks that took both stamps
      auto phase = [&](const char* what, int from, int to) {
        std::vector<double> d;
        for (int i = 0; i < nblk; ++i)
          if (at(i, from) != 0 && at(i, to) != 0) d.push_back((double(at(i, to)) - double(at(i, from))) / (ghz * 1e3));
        if (d.empty()) return;
        std::sort(d.begin(), d.end());
        std::printf("    %-36s median %7.2f us  max %7.2f us  (%zu blocks)\n", what, d[d.size() / 2], d.back(), d.size());
      };
      for (int k = 0; k < 7; ++k) {
        if (k == 6 && S == 1) continue;
        phase(names[k], k, (k == 5 && S == 1) ? 7 : k + 1);  // S == 1: no arrival stamp, phase 5 runs to the exit
      }
      {  // the blocks on the critical path: the slowest coded loops and the last exits, with
         // their split, kv head and SM (is the slow one the window's split, or one SM?)
        std::vector<int> idx;
        for (int i = 0; i < nblk; ++i)
          if (at(i, 2) > at(i, 1)) idx.push_back(i);
        auto show = [&](const char* what, auto key) {
          std::sort(idx.begin(), idx.end(), [&](int a, int c) { return key(a) > key(c); });
          std::printf("    %-28s", what);
          for (size_t j = 0; j < std::min<size_t>(4, idx.size()); ++j) {
            const int i = idx[j];
            std::printf("  [split %d head %d sm %llu: loop %.2f, exit %.2f us]", i % S, (i / S) % kKV, at(i, 14),
                        double(at(i, 2) - at(i, 1)) / (ghz * 1e3), (at(i, 9) - g0) / 1e3);
          }
          std::printf("\n");
        };
        if (!idx.empty()) {
          show("slowest coded loops:", [&](int i) { return double(at(i, 2) - at(i, 1)); });
          show("last exits:", [&](int i) { return double(at(i, 9)); });
        }
      }
      // the setup's steps (thread 0), and when its first code stage lands after the setup
      phase("  setup: lengths, split bounds", 0, 10);
      phase("  setup: first stages issued", 10, 11);
      phase("  setup: query transform", 11, 12);
      phase("  setup: codebook copies, barrier", 12, 1);
      phase("first stage landed after the setup", 1, 13);
    }
    const int64_t n_code = fp ? 0 : L - kR, n_win = fp ? L : kR;
    const double bytes = double(nbh) * (double(n_code) * (krs + vrs) + double(n_win) * kD * 2 * 2) +
                         2.0 * B * kH * kD * 2;
    const double gbps = bytes / (us * 1e-6) / 1e9;
    std::printf("%-22s B=%-3d L=%-7d splits=%-2d merge=%-2s occ=%d %9.1f us %8.0f GB/s (%5.1f%% of copy) valid NMSE %.2e %s",
                name.c_str(), B, L, S, merge, occ, us, gbps, 100.0 * gbps / copy_gbps, worst, ok ? "ok" : "FAILED");
    if (s.fmt) std::printf(" (vs f32 codebooks %.2e)", worst_f32);
    std::printf("\n");
    std::fflush(stdout);
    bf.free_all();
    return {name, B, L, us, gbps, 100.0 * gbps / copy_gbps, bytes, worst, worst_f32};
  };

  for (int fp = 0; fp < 2; ++fp)
    for (const Spec& s : specs) {
      if (fp == 1 && !(s.ks == 4 && s.kb == 8 && s.vs == 4 && s.vb == 8 && !s.fmt)) continue;  // fp16 path: once
      const cuda::AttnConfigKey key{kD, s.ks, s.kb, s.vs, s.vb, 1, s.fmt};
      if (!cuda::attn_config_compiled(key)) {
        std::printf("%-16s not compiled in this build (VQ_CUDA_ALL_CONFIGS=OFF)\n", s.str().c_str());
        continue;
      }
      const int bps = cuda::attn_blocks_per_sm(key, dev);
      if (!selected(fp ? "ours-fp16" : s.str())) continue;
      for (auto [B, L] : shapes)
        rows.push_back(measure(fp ? "ours-fp16" : s.str(), s, B, L, fp == 1, bps,
                               [&](const cuda::AttnParams& p) { cuda::attn_launch(key, p, nullptr); }));
    }

  // ---- split-count sweep (d4b8/d4b8, batch 1): the planner's choice against its neighbours ----
  std::vector<Row> split_rows;
  if (selected("splits")) {
    const Spec s{4, 8, 4, 8};
    const cuda::AttnConfigKey key{kD, 4, 8, 4, 8, 1};
    if (cuda::attn_config_compiled(key)) {
      std::printf("clusters resident at once (d4b8/d4b8 kernel; a launch clusters when its segments fit):");
      for (int S : {2, 4, 8, 12, 16}) {
        const char* err = "";
        const int n = cuda::attn_max_active_clusters(key, S, &err);
        std::printf(" %d x %d%s%s", S, n, *err ? " " : "", err);
      }
      std::printf("\n");
    }
    if (cuda::attn_config_compiled(key))
      for (auto [B, L, S] : std::vector<std::tuple<int, int, int>>{
               {1, 131072, 8}, {1, 131072, 12}, {1, 131072, 16}, {1, 131072, 24}, {1, 131072, 32},
               // 64 x 16384: 512 segments on 132 SMs; the planner's 1 split (3.9 waves) against 2 and 3
               {64, 16384, 1}, {64, 16384, 2}, {64, 16384, 3}})
        split_rows.push_back(measure("d4b8/d4b8 splits=" + std::to_string(S), s, B, L, false,
                                     cuda::attn_blocks_per_sm(key, dev),
                                     [&](const cuda::AttnParams& p) { cuda::attn_launch(key, p, nullptr); }, S));
  }

  // ---- tuning variants of the two headline configurations -------------------------------------
  std::vector<Row> var_rows;
  if (cuda::attn_variant_count() > 0) std::printf("\nvariants (kt = k-tiles of 16 tokens per warp tile, minb = "
                                                 "blocks/SM asked, w = warps/block)\n");
  for (int i = 0; i < cuda::attn_variant_count(); ++i) {
    const cuda::AttnVariantInfo v = cuda::attn_variant_info(i);
    const Spec s{v.key.key_sub_dim, v.key.key_bits, v.key.value_sub_dim, v.key.value_bits, v.key.cb_fmt};
    const int bps = cuda::attn_variant_blocks_per_sm(i, dev);
    const std::string name = s.str() + " kt" + std::to_string(v.kt) + " mb" + std::to_string(v.minb) + " w" +
                             std::to_string(v.warps) + " p" + std::to_string(v.pipe) + (v.rows4 ? " r4" : "");
    if (!selected(name)) continue;
    for (auto [B, L] : shapes)
      var_rows.push_back(
          measure(name, s, B, L, false, bps, [&](const cuda::AttnParams& p) { cuda::attn_launch_variant(i, p, nullptr); }));
  }

  // ---- encode throughput -------------------------------------------------------------------
  // median us of reps encode launches after two warm-ups
  auto time_launch = [&](const cuda::EncodeParams& ep, bool decode_mode, int reps) {
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      const float ms = tm.ms([&] { cuda::encode_launch(ep, decode_mode, nullptr); });
      if (r >= 2) t.push_back(ms);
    }
    return median(t) * 1e3;
  };
  std::vector<std::pair<std::string, double>> enc_rows;
  if (!skip_encode) std::printf("\nencode (bulk, 8 x 8 kv heads x 4096 tokens, head_dim 128)\n");
  for (const Spec& s : skip_encode ? std::vector<Spec>{} : std::vector<Spec>{{4, 8, 4, 8}, {4, 12, 8, 8}, {8, 12, 8, 12}, {4, 10, 8, 12}})
    for (int side = 1; side <= 2; ++side) {
      const int B = 8, n = 4096;
      const int sub = side == 1 ? s.ks : s.vs, bits = side == 1 ? s.kb : s.vb;
      ProductQuantizer pq(kD, {sub, bits});
      pq.set_random_codebook(99 + bits);
      const int rs = int(pq.code_bytes + 3) / 4 * 4;
      const size_t elems = size_t(B) * kKV * n * kD;
      __half* x;
      uint8_t* codes;
      float *cb, *nrm;
      int32_t *len, *rc;
      int* err;
      CK(cudaMalloc(&x, elems * 2));
      grid_fill(x, elems, 77, 1.0f);
      CK(cudaMalloc(&codes, size_t(B) * kKV * n * rs + 256));
      CK(cudaMalloc(&cb, pq.codebook.size() * 4));
      CK(cudaMalloc(&nrm, pq.centroid_norms.size() * 4));
      CK(cudaMemcpy(cb, pq.codebook.data(), pq.codebook.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(nrm, pq.centroid_norms.data(), pq.centroid_norms.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMalloc(&len, B * 4));
      CK(cudaMalloc(&rc, B * 4));
      CK(cudaMalloc(&err, 4));
      CK(cudaMemset(len, 0, B * 4));
      CK(cudaMemset(rc, 0, B * 4));
      CK(cudaMemset(err, 0, 4));
      float cmax = 0;
      for (float v : pq.centroid_norms) cmax = std::max(cmax, std::sqrt(v));
      cuda::EncodeParams e;
      e.batch = B, e.n_kv_heads = kKV, e.head_dim = kD, e.n_new = n;
      cuda::DevTensor4 dt;
      dt.data = x, dt.dtype = DType::F16;
      dt.stride[0] = int64_t(kKV) * n * kD, dt.stride[1] = int64_t(n) * kD, dt.stride[2] = kD, dt.stride[3] = 1;
      e.k = e.v = dt;
      e.use_hadamard = 1;
      e.hadamard_scale = float(1.0 / std::sqrt(double(kD)));
      e.k_cb = e.v_cb = cb;
      e.k_norms = e.v_norms = nrm;
      e.k_bits = e.v_bits = bits;
      e.k_sub = e.v_sub = sub;
      e.k_cmax = e.v_cmax = cmax;
      e.k_codes = e.v_codes = codes;
      e.code_cap = n;
      e.k_row_stride = e.v_row_stride = rs;
      e.seq_len = len;
      e.res_count = rc;
      e.residual_length = 0;
      e.error_flag = err;
      e.sides = side;
      // the codebook's candidate grid (sub_dim 4, <= 256 centroids: src/core/pq_grid.h), as the
      // caches build it
      const auto tg0 = std::chrono::steady_clock::now();
      const cuda::DeviceEncodeGrid dg = cuda::upload_encode_grid(pq.codebook.data(), pq.n_centroids, pq.sub_dim, Device::cuda(0));
      const double grid_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tg0).count();
      const auto& grid = dg.host;
      if (grid)
        std::printf("encode %s d%db%d: candidate grid %d^4 cells, %.1f candidates per cell (max %d), %lld KB, built and "
                    "uploaded in %.0f ms\n",
                    side == 1 ? "keys" : "values", sub, bits, grid->g, grid->mean_candidates, grid->max_candidates,
                    (long long)(dg.nbytes() / 1024), grid_ms);
      // every bulk kernel (EncodeParams::bulk_variant: 1 default — with the candidate grid where
      // the codebook has one ("grid"), else the v2 scan; 2 eight slots per lane, 0 the previous
      // kernel) on the same data, back to back: same-run ratios
      std::vector<uint8_t> first_all;  // the whole code buffer of the first variant
      for (const int variant : {3, 1, 2, 0}) {
      if (variant == 3 && !grid) continue;
      e.bulk_variant = variant == 3 ? 1 : variant;
      e.k_grid = e.v_grid = variant == 3 ? dg.view : cuda::EncodeGrid{};
      CK(cudaMemset(codes, 0xEE, size_t(B) * kKV * n * rs));
      cuda::encode_launch(e, false, nullptr);
      CK(cudaDeviceSynchronize());
      std::vector<uint8_t> all(size_t(B) * kKV * n * rs);
      CK(cudaMemcpy(all.data(), codes, all.size(), cudaMemcpyDeviceToHost));
      if (first_all.empty()) first_all = all;
      const bool same_all = all == first_all;
      // validate the first 256 token-heads against the CPU encoder (exact)
      const int nchk = 256;
      std::vector<uint16_t> xh(size_t(nchk) * kD);
      CK(cudaMemcpy(xh.data(), x, xh.size() * 2, cudaMemcpyDeviceToHost));
      std::vector<float> xf(xh.size());
      for (size_t i = 0; i < xh.size(); ++i) xf[i] = half_to_float(xh[i]);
      if (side == 1) {
        KeyTransform tf(1, kD, {}, true);
        tf.forward_keys(xf.data(), nchk, 0);
      }
      std::vector<uint8_t> want(size_t(nchk) * pq.code_bytes), got(size_t(nchk) * rs);
      pq.encode(xf.data(), nchk, want.data(), 1);
      CK(cudaMemcpy(got.data(), codes, got.size(), cudaMemcpyDeviceToHost));
      int64_t bad = 0;
      for (int r = 0; r < nchk; ++r) bad += std::memcmp(got.data() + r * rs, want.data() + r * pq.code_bytes, pq.code_bytes) != 0;
      const double us = time_launch(e, false, 8), rate = double(B) * kKV * n / (us * 1e-6);
      // decode mode: one new token per (batch, kv head), all warps of a block on one token
      // group; with the workspace (the caches' planned decode steps) several blocks split the
      // codebook. Both timed, and the sliced codes checked against the one-block codes.
      cuda::EncodeParams e1 = e;
      e1.n_new = 1;
      const int64_t jobs1 = int64_t(B) * kKV;
      const size_t nws = size_t(2 * jobs1 * cuda::kEncDecSlices * 32);
      float* ws_best;
      int *ws_code, *ws_count;
      CK(cudaMalloc(&ws_best, nws * 4));
      CK(cudaMalloc(&ws_code, nws * 4));
      CK(cudaMalloc(&ws_count, size_t(2 * jobs1) * 4));
      CK(cudaMemset(ws_count, 0, size_t(2 * jobs1) * 4));
      const size_t step_bytes = size_t(B) * kKV * n * rs;  // codes of position 0 of every group
      std::vector<uint8_t> c_one(step_bytes), c_sliced(step_bytes);
      const double us1 = time_launch(e1, true, 12);
      CK(cudaMemcpy(c_one.data(), codes, step_bytes, cudaMemcpyDeviceToHost));
      CK(cudaMemset(codes, 0xEE, step_bytes));
      cuda::EncodeParams e2 = e1;
      e2.dec_slices = cuda::kEncDecSlices;
      e2.dec_ws_best = ws_best, e2.dec_ws_code = ws_code, e2.dec_ws_count = ws_count, e2.dec_ws_jobs = jobs1;
      const double us2 = time_launch(e2, true, 12);
      CK(cudaMemcpy(c_sliced.data(), codes, step_bytes, cudaMemcpyDeviceToHost));
      bool same_dec = true;
      for (int64_t bh = 0; bh < jobs1; ++bh)  // the decode launches wrote position 0 of each row
        same_dec &= std::memcmp(c_one.data() + bh * n * rs, c_sliced.data() + bh * n * rs, rs) == 0;
      for (void* ptr : {(void*)ws_best, (void*)ws_code, (void*)ws_count}) cudaFree(ptr);
      // the grid kernel on the same 64 token-heads (what update() runs in throughput mode)
      char grid_small[96] = "";
      if (variant == 3) std::snprintf(grid_small, sizeof grid_small, "; the grid kernel on them: %.1f us", time_launch(e1, false, 12));
      const std::string nm = std::string(side == 1 ? "keys " : "values ") + "d" + std::to_string(sub) + "b" +
                             std::to_string(bits) + (variant == 3 ? " grid" : " v" + std::to_string(variant));
      std::printf("encode %-17s %9.1f us  %7.0f M token-heads/s  (%lld of %d rows differ from the CPU encoder; "
                  "all %d rows %s the first variant's); decode step (64 token-heads): %.1f us, with the "
                  "workspace (up to %d blocks per group, as the caches): %.1f us (codes %s)%s\n",
                  nm.c_str(), us, rate / 1e6, (long long)bad, nchk, B * kKV * n, same_all ? "equal" : "DIFFER FROM",
                  us1, cuda::kEncDecSlices, us2, same_dec ? "equal" : "DIFFER", grid_small);
      enc_rows.push_back({nm, rate});
      all_valid &= bad == 0 && same_all && same_dec;
      }
      // the bulk grid kernel with another grid of this codebook: us per launch, and whether its
      // codes equal the first variant's
      auto grid_run = [&](const cuda::EncodeGrid& view, double& us) {
        e.bulk_variant = 1;
        e.k_grid = e.v_grid = view;
        CK(cudaMemset(codes, 0xEE, size_t(B) * kKV * n * rs));
        cuda::encode_launch(e, false, nullptr);
        CK(cudaDeviceSynchronize());
        std::vector<uint8_t> all(size_t(B) * kKV * n * rs);
        CK(cudaMemcpy(all.data(), codes, all.size(), cudaMemcpyDeviceToHost));
        us = time_launch(e, false, 8);
        return all == first_all;
      };
      // codebooks of > 256 centroids: the grid as the caches build it, on the device (the host
      // build's time is the "built and uploaded" figure above); codes compared with the variants'
      if (grid && pq.n_centroids > 256) {
        double build_ms[2];
        cuda::DeviceEncodeGrid dgd;
        for (double& ms : build_ms) {  // the first call loads the kernel
          const auto t0 = std::chrono::steady_clock::now();
          dgd = cuda::build_encode_grid_on_device(pq.codebook.data(), pq.n_centroids, pq.sub_dim, Device::cuda(0));
          ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        }
        if (dgd.host) {
          double us = 0;
          const bool same = grid_run(dgd.view, us);
          const double rate = double(B) * kKV * n / (us * 1e-6);
          std::printf("encode %s d%db%d grid built on the device: %9.1f us  %7.0f M token-heads/s  (%.1f candidates per "
                      "cell, max %d, %lld KB; built in %.1f ms, first call %.1f ms; all rows %s the first variant's)\n",
                      side == 1 ? "keys" : "values", sub, bits, us, rate / 1e6, dgd.host->mean_candidates,
                      dgd.host->max_candidates, (long long)(dgd.nbytes() / 1024), build_ms[1], build_ms[0],
                      same ? "equal" : "DIFFER FROM");
          all_valid &= same;
          enc_rows.push_back({std::string(side == 1 ? "keys" : "values") + " d" + std::to_string(sub) + "b" +
                                  std::to_string(bits) + " device-built grid",
                              rate});
        } else {
          std::printf("encode d%db%d: NO device-built grid\n", sub, bits);
          all_valid = false;
        }
      }
      // the grid's cell count against its default (memory against candidates per point), host
      // build, codes compared with the variants' above
      if (grid && pq.n_centroids > 256)
        for (const int g : {pq.n_centroids <= 1024 ? 10 : 12, pq.n_centroids <= 1024 ? 18 : 20}) {
          const auto t0 = std::chrono::steady_clock::now();
          auto hg = std::make_shared<const detail::CandidateGrid>(
              detail::build_candidate_grid(pq.codebook.data(), pq.n_centroids, pq.sub_dim, g));
          const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          const cuda::DeviceEncodeGrid dgx = cuda::upload_encode_grid(hg, Device::cuda(0));
          if (!dgx.host) continue;
          double us = 0;
          const bool same = grid_run(dgx.view, us);
          const double rate = double(B) * kKV * n / (us * 1e-6);
          std::printf("encode %s d%db%d grid g=%d: %9.1f us  %7.0f M token-heads/s  (%.1f candidates per cell, %lld KB, "
                      "built in %.0f ms here; all rows %s the first variant's)\n",
                      side == 1 ? "keys" : "values", sub, bits, g, us, rate / 1e6, hg->mean_candidates,
                      (long long)(dgx.nbytes() / 1024), build_ms, same ? "equal" : "DIFFER FROM");
          all_valid &= same;
        }
      for (void* ptr : {(void*)x, (void*)codes, (void*)cb, (void*)nrm, (void*)len, (void*)rc, (void*)err}) cudaFree(ptr);
    }

  // ---- encode on model-like data: the demo's synthetic KV, d4b8 codebooks calibrated on another
  // sequence of the same model (the grid's lists depend on the data: the bench data above is an
  // N(0,1) codebook against N(0,1) points). Keys smoothed + rotated, values raw (outlier
  // channels). The grid kernel against the scan on the same data, codes compared.
  if (!skip_encode) {
    SyntheticKVConfig sc;
    sc.n_layers = 1, sc.n_kv_heads = kKV, sc.head_dim = kD;
    const SyntheticKVModel model(sc);
    const int n = 32768;  // x 8 kv heads: 262144 token-heads, as above
    const SyntheticSequence calib = model.generate(8192, 0, 1), data = model.generate(n, 0, 2);
    CalibrationParams cp;
    cp.key_spec = {4, 8}, cp.value_spec = {4, 8};
    cp.measure_untransformed = false;
    const ArtifactLayer al = calibrate(calib.kv, cp).artifact.layers[0];
    KeyTransform tf(kKV, kD, al.smooth_factors, true);
    const std::vector<float> kf = data.kv.keys[0].to_vector_f32(), vf = data.kv.values[0].to_vector_f32();
    for (int side = 1; side <= 2; ++side) {
      const std::vector<float>& cbk = side == 1 ? al.key_codebook : al.value_codebook;
      ProductQuantizer pq(kD, {4, 8});
      pq.set_codebook(cbk);
      const cuda::DeviceEncodeGrid dg = cuda::upload_encode_grid(cbk.data(), 256, 4, Device::cuda(0));
      Tensor xd = to_device_bench(Tensor::from_floats(side == 1 ? kf : vf, {n, kKV, kD}, DType::F16));
      Tensor cbd = to_device_bench(Tensor::from_floats(cbk, {256, 4}, DType::F32));
      Tensor nrm = to_device_bench(Tensor::from_floats(pq.centroid_norms, {256}, DType::F32));
      Tensor il = to_device_bench(Tensor::from_floats(tf.inv_lambda, {kKV, kD}, DType::F32));
      const int rs = int(pq.code_bytes + 3) / 4 * 4;
      Tensor codes = Tensor::empty({int64_t(kKV) * n * rs}, DType::U8, Device::cuda(0));
      Tensor zero = Tensor::empty({2}, DType::I32, Device::cuda(0));
      CK(cudaMemset(zero.data(), 0, 8));
      float cmax = 0;
      for (float v : pq.centroid_norms) cmax = std::max(cmax, std::sqrt(v));
      cuda::EncodeParams e;
      e.batch = 1, e.n_kv_heads = kKV, e.head_dim = kD, e.n_new = n;
      cuda::DevTensor4 dt;  // [n, kv heads, head_dim] read as [1, kv heads, n, head_dim]
      dt.data = xd.data(), dt.dtype = DType::F16;
      dt.stride[0] = int64_t(n) * kKV * kD, dt.stride[1] = kD, dt.stride[2] = int64_t(kKV) * kD, dt.stride[3] = 1;
      e.k = e.v = dt;
      e.inv_lambda = side == 1 ? il.ptr<float>() : nullptr;
      e.use_hadamard = 1, e.hadamard_scale = float(1.0 / std::sqrt(double(kD)));
      e.k_cb = e.v_cb = cbd.ptr<float>();
      e.k_norms = e.v_norms = nrm.ptr<float>();
      e.k_bits = e.v_bits = 8, e.k_sub = e.v_sub = 4, e.k_cmax = e.v_cmax = cmax;
      e.k_codes = e.v_codes = codes.ptr<uint8_t>();
      e.code_cap = n, e.k_row_stride = e.v_row_stride = rs;
      e.seq_len = e.res_count = zero.ptr<int32_t>();
      e.error_flag = zero.ptr<int>() + 1;
      e.sides = side;
      std::vector<uint8_t> first;
      double rate[2] = {0, 0};
      bool same = true;
      for (int v = 0; v < 2; ++v) {  // 0: grid, 1: the v2 scan
        e.k_grid = e.v_grid = v == 0 ? dg.view : cuda::EncodeGrid{};
        rate[v] = double(kKV) * n / (time_launch(e, false, 10) * 1e-6);
        std::vector<uint8_t> all(size_t(kKV) * n * rs);
        CK(cudaMemcpy(all.data(), codes.data(), all.size(), cudaMemcpyDeviceToHost));
        if (v == 0) first = all;
        else same = all == first;
      }
      // the first 256 tokens of kv head 0 against the CPU pipeline
      const int nchk = 256;
      std::vector<float> xs(size_t(nchk) * kD);
      for (int t = 0; t < nchk; ++t)
        for (int d = 0; d < kD; ++d)
          xs[size_t(t * kD + d)] = half_to_float(float_to_half((side == 1 ? kf : vf)[size_t(t * kKV * kD + d)]));
      if (side == 1) tf.forward_keys(xs.data(), nchk, 0);
      std::vector<uint8_t> want(size_t(nchk) * pq.code_bytes);
      pq.encode(xs.data(), nchk, want.data(), 1);
      int bad = 0;
      for (int r = 0; r < nchk; ++r) bad += std::memcmp(first.data() + size_t(r) * rs, want.data() + size_t(r) * pq.code_bytes, pq.code_bytes) != 0;
      std::printf("encode %s d4b8, calibrated synthetic KV: grid %.0f M token-heads/s, scan %.0f M (%.2fx); %.1f candidates "
                  "per cell; all rows %s; %d of %d rows differ from the CPU encoder\n",
                  side == 1 ? "keys" : "values", rate[0] / 1e6, rate[1] / 1e6, rate[0] / rate[1], dg.host->mean_candidates,
                  same ? "equal" : "DIFFER", bad, nchk);
      enc_rows.push_back({std::string(side == 1 ? "keys" : "values") + " d4b8 synthetic grid", rate[0]});
      all_valid &= same && bad == 0;
    }
  }

  // ---- one decode step through the cache API, captured in a graph --------------------------
  // d4b8/d4b8 in every codebook format, and the defaults d4b12/d8b8 (their 4096-entry key
  // codebook makes the new token's encode a visible part of the step)
  struct StepCase {
    Spec s;
    CodebookFormat fmt;
  };
  const std::vector<StepCase> step_cases = {{{4, 8, 4, 8}, CodebookFormat::F16},   {{4, 8, 4, 8}, CodebookFormat::E4M3},
                                            {{4, 8, 4, 8}, CodebookFormat::I8},    {{4, 8, 4, 8}, CodebookFormat::I8KV},
                                            {{4, 12, 8, 8}, CodebookFormat::F16}, {{4, 12, 8, 8}, CodebookFormat::I8}};
  for (const StepCase& sc : step_cases) {
    if (skip_step) break;
    const CodebookFormat fmt = sc.fmt;
    double step_us = 0;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    auto cache = KVCacheFactory::create(device_cache_config(sc.s, fmt, st));
    auto* cc = dynamic_cast<CudaKVCache*>(cache.get());
    const int L = 131072;
    cc->reserve(L + 512, 1);
    Tensor kx = Tensor::empty({1, kKV, 8192, kD}, DType::F16, Device::cuda(0));
    grid_fill(static_cast<__half*>(kx.data()), size_t(kx.numel()), 91, 1.0f);
    for (int i = 0; i < L / 8192; ++i) cache->update(kx.view(), kx.view());
    cc->plan_decode(kH, 1, L);
    Tensor q = Tensor::empty({1, kH, 1, kD}, DType::F16, Device::cuda(0));
    Tensor kn = Tensor::empty({1, kKV, 1, kD}, DType::F16, Device::cuda(0));
    Tensor out = Tensor::empty({1, kH, 1, kD}, DType::F16, Device::cuda(0));
    grid_fill(static_cast<__half*>(q.data()), size_t(q.numel()), 1, 1.0f);
    grid_fill(static_cast<__half*>(kn.data()), size_t(kn.numel()), 2, 1.0f);
    CK(cudaDeviceSynchronize());
    SdpaParams sp;
    // the step captured three ways, each replayed 40 times after an L2 flush: serial (encode,
    // then attention), overlapped (the encode on a side stream beside attention; default), and
    // overlapped in a graph instantiated with per-node priorities (attention's launch priority
    // then holds in the graph too)
    auto time_step = [&](bool overlap, unsigned long long flags) {
      const bool prev = cuda::set_overlapped_step(overlap);
      const bool prev_two = cuda::set_overlap_two_launches(true);  // (the defaults: measured either way)
      const long long before = cuda::overlapped_steps();
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      cc->decode_step(q.view(), kn.view(), kn.view(), out.view(), sp);
      CK(cudaStreamEndCapture(st, &g));
      cuda::set_overlapped_step(prev);
      cuda::set_overlap_two_launches(prev_two);
      if ((cuda::overlapped_steps() > before) != overlap) {
        std::printf("decode step: the %s path was not taken\n", overlap ? "overlapped" : "serial");
        all_valid = false;
      }
      CK(cudaGraphInstantiateWithFlags(&ge, g, flags));
      std::vector<float> t;
      for (int r = 0; r < 40; ++r) {
        flush(st, r);
        CK(cudaEventRecord(tm.a, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(tm.b, st));
        CK(cudaEventSynchronize(tm.b));
        float ms;
        CK(cudaEventElapsedTime(&ms, tm.a, tm.b));
        if (r >= 3) t.push_back(ms);
      }
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
      return median(t) * 1e3;
    };
    const double serial_us = time_step(false, 0);
    step_us = time_step(true, 0);
    const double prio_us = time_step(true, cudaGraphInstantiateFlagUseNodePriority);
    // attention launched as a programmatic dependent of the step's kernel before it (sm_90, the
    // default; cuda::attn_set_step_pdl): the same two steps with the plain launch
    const bool pdl_prev = cuda::attn_set_step_pdl(false);
    const double nopdl_us = time_step(true, 0), nopdl_serial_us = time_step(false, 0);
    cuda::attn_set_step_pdl(pdl_prev);
    // what the step's k_new/v_new range check costs (one small launch ahead of the step's
    // kernels): the same two steps captured without it
    const bool checks_prev = cuda::set_step_input_checks(false);
    const double unchecked_us = time_step(true, 0), unchecked_serial_us = time_step(false, 0);
    cuda::set_step_input_checks(checks_prev);
    // (diagnosis: a split attention launch runs as clusters, whose blocks must be co-resident:
    // the same two steps with the workspace merge instead)
    const bool clusters_prev = cuda::attn_set_cluster_merge(false);
    const double serial_nc_us = time_step(false, 0), overlap_nc_us = time_step(true, 0);
    cuda::attn_set_cluster_merge(clusters_prev);
    // the runtime's path: eager update() of one token, then fused_sdpa_into(), 20 of them
    // between two events, with the update's encode in throughput mode (update_decode_max 0, as
    // before run 91) and in latency mode (the default for few token-heads)
    // (host_us: the host's time to issue one pair, which bounds the eager path from below)
    // (deferred: the update's input range check queued, not waited for: set_deferred_checks, as
    // the runtime's forward does; the verdict is read once, after the 20 pairs)
    double host_us = 0;
    auto time_eager = [&](int decode_max, bool deferred = false) {
      CK(cudaStreamSynchronize(st));
      flush(st, 3);
      return time_calls(*cache, st, tm, decode_max, deferred, [&] {
        cache->update(kn.view(), kn.view());
        cache->fused_sdpa_into(q.view(), out.view(), sp);
      }, &host_us);
    };
    cc->sync_seq_lens();
    const double eager_bulk_us = time_eager(0);
    const double host_bulk_us = host_us;
    const double eager_lat_us = time_eager(cuda::update_decode_max());
    const double host_lat_us = host_us;
    const double eager_def_us = time_eager(cuda::update_decode_max(), true);
    const double host_def_us = host_us;
    // (the defaults: keys and values of different sub_dims are two encode launches, side by side
    // on two streams by default; here one after the other)
    const bool two_prev = cuda::set_overlap_two_launches(false);
    const double eager_def_serial_us = time_eager(cuda::update_decode_max(), true);
    cuda::set_overlap_two_launches(two_prev);
    cc->sync_seq_lens();
    if (auto* acc = dynamic_cast<VecInferAccounting*>(cache.get())) {
      const double ideal = double(acc->compressed_key_bytes() + acc->compressed_value_bytes() +
                                  acc->fp16_key_bytes() + acc->fp16_value_bytes() + acc->codebook_bytes());
      std::printf("bytes held: %lld (packed codes %lld + window %lld + codebooks %lld): %.2f%% above the payload\n",
                  (long long)cache->nbytes(), (long long)(acc->compressed_key_bytes() + acc->compressed_value_bytes()),
                  (long long)(acc->fp16_key_bytes() + acc->fp16_value_bytes()), (long long)acc->codebook_bytes(),
                  100.0 * (double(cache->nbytes()) / ideal - 1.0));
    }
    std::printf("\ndecode step (graph: encode 1 token + attention, d%db%d/d%db%d, %s codebooks, 1 x %d): %.1f us "
                "overlapped%s (%.1f us with node priorities), %.1f us serial (%.2fx); without the dependent launch %.1f us "
                "overlapped, %.1f us serial; without clusters %.1f us overlapped, "
                "%.1f us serial; eager update + fused_sdpa: %.1f us "
                "with the latency-mode encode, %.1f us with the throughput-mode encode (%.2fx), host issue %.1f / %.1f us "
                "a pair; with deferred input checks (latency mode) %.1f us, host issue %.1f us (%.2fx over checked), "
                "%.1f us with two encode launches in series; without the step's input check %.1f us overlapped, "
                "%.1f us serial; %lld tokens held, overflow=%d\n",
                sc.s.ks, sc.s.kb, sc.s.vs, sc.s.vb, codebook_format_name(fmt), L, step_us,
                sc.s.ks == sc.s.vs || cuda::overlap_two_launches() ? "" : " [two launches: not the default path]",
                prio_us, serial_us,
                serial_us / step_us, nopdl_us, nopdl_serial_us, overlap_nc_us, serial_nc_us, eager_lat_us, eager_bulk_us, eager_bulk_us / eager_lat_us,
                host_lat_us, host_bulk_us, eager_def_us, host_def_us, eager_lat_us / eager_def_us, eager_def_serial_us,
                unchecked_us, unchecked_serial_us, (long long)cache->offset(), int(cc->device_error()));
  }

  // ---- update(): the encode mode by token-heads (what cuda::update_decode_max should be) ------
  // One token per sequence appended to B sequences of 8 kv heads (8·B token-heads), int8-key
  // caches (the default format), MemoryBound: 20 updates queued back to back (deferred input
  // checks, so the host does not wait between them), device time per update, with every update
  // in latency mode (decode-mode encode, the codebook split over several blocks per token group)
  // and in throughput mode (bulk encode, one warp per group). Both write the same bytes
  // (CudaEncode.UpdateLatencyAndThroughputModesAgree).
  if (!skip_step) {
    std::printf("\nupdate() of one token per sequence, 8 kv heads, device us per update by encode mode "
                "(default: latency mode up to update_decode_max = %d token-heads, 4x that where a codebook of more than 256 centroids has no candidate grid)\n",
                cuda::update_decode_max());
    std::printf("(the throughput mode with the candidate grids of codebooks of more than 256 centroids: each cache "
                "builds them at its first throughput-mode update here, grid_build_after 0)\n");
    std::printf("| keys / values | token-heads | latency mode us | throughput mode us | throughput / latency |\n");
    std::printf("|---|---|---|---|---|\n");
    const int64_t build_after_prev = cuda::set_grid_build_after(0);
    for (const Spec& sp : {Spec{4, 8, 4, 8}, Spec{4, 12, 8, 8}})
      for (int B : {1, 4, 16, 32, 64, 128, 256}) {
        cudaStream_t st;
        CK(cudaStreamCreate(&st));
        {
          auto cache = KVCacheFactory::create(device_cache_config(sp, KVCacheConfig{}.attention_codebooks, st));
          auto* cc = dynamic_cast<CudaKVCache*>(cache.get());
          cc->reserve(64, B);
          Tensor kn = Tensor::empty({B, kKV, 1, kD}, DType::F16, Device::cuda(0));
          grid_fill(static_cast<__half*>(kn.data()), size_t(kn.numel()), 5 + B, 1.0f);
          auto per_update = [&](int decode_max) {
            return time_calls(*cache, st, tm, decode_max, true, [&] { cache->update(kn.view(), kn.view()); });
          };
          const double lat = per_update(1 << 30), thr = per_update(0);
          std::printf("| %s | %d | %.1f | %.1f | %.2fx |\n", sp.str().c_str(), B * kKV, lat, thr, thr / lat);
        }
        CK(cudaStreamDestroy(st));
      }
    cuda::set_grid_build_after(build_after_prev);
  }

  // ---- summary table -------------------------------------------------------------------------
  // (e4m3 rows: NMSE of the output against the oracle on the f32 codebooks, i.e. what the
  // 1-byte centroids cost on these random codebooks; fp16 rows are within 2e-4 of it by validation)
  std::printf("\n(config: no suffix = fp16 codebooks; +e4m3, +i8 (int8 keys), +i8kv (int8 keys and values): the "
              "other CodebookFormats; the caches' default: KVCacheConfig::attention_codebooks = %s)\n",
              codebook_format_name(KVCacheConfig{}.attention_codebooks));
  std::printf("\n| config | batch x context | ours us | ours GB/s | %% of copy BW | peer us | peer TB/s | speedup | "
              "e4m3/i8 NMSE vs f32 codebooks |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    auto it = peer.find({r.B, r.L});
    char cost[32] = "-";
    if (r.nmse_f32 >= 0) std::snprintf(cost, sizeof cost, "%.1e", r.nmse_f32);
    if (it != peer.end())
      std::printf("| %s | %d x %d | %.1f | %.0f | %.1f | %.1f | %.2f (%s) | %.2fx | %s |\n", r.cfg.c_str(), r.B, r.L,
                  r.us, r.gbps, r.pct_copy, it->second.us, it->second.tbps, it->second.backend.c_str(),
                  it->second.us / r.us, cost);
    else
      std::printf("| %s | %d x %d | %.1f | %.0f | %.1f | - | - | - | %s |\n", r.cfg.c_str(), r.B, r.L, r.us, r.gbps,
                  r.pct_copy, cost);
  }
  if (!var_rows.empty()) {
    std::printf("\n| variant | batch x context | us | GB/s | %% of copy | speedup vs peer |\n|---|---|---|---|---|---|\n");
    for (const Row& r : var_rows) {
      auto it = peer.find({r.B, r.L});
      std::printf("| %s | %d x %d | %.1f | %.0f | %.1f | %s |\n", r.cfg.c_str(), r.B, r.L, r.us, r.gbps, r.pct_copy,
                  it == peer.end() ? "-" : (std::to_string(it->second.us / r.us).substr(0, 4) + "x").c_str());
    }
  }
  for (const auto& [shape, c] : read_ceiling)
    std::printf("\nread-only ceiling (d4b8 bytes, one launch) at %d x %d: %.1f us = %.1f%% of copy", shape.first,
                shape.second, c.first, 100.0 * c.second / copy_gbps);
  if (!read_ceiling.empty()) std::printf("\n");
  std::printf("\nHBM copy bandwidth: %.0f GB/s. L2 flush before each timed run: %s. Encode: ", copy_gbps, flush.name());
  for (auto& [n, r] : enc_rows) std::printf("%s %.0fM/s; ", n.c_str(), r / 1e6);
  std::printf("\nvalidation: %s\n", all_valid ? "all kernels match the oracle" : "SOME KERNELS FAILED VALIDATION");
  cudaFree(flush.buf);
  return all_valid ? 0 : 1;
}
