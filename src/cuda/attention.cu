// src/cuda/attention.cu — the one dispatch point of the attention kernels (runtime
// configuration → compiled instantiation, ending in a throwing default), occupancy queries
// and the split planner. Launch only here: planning (splits, workspace) happens in the cache
// before a decode step, so a captured step launches without host work.
#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/attention_kernel.cuh"
#include "cuda/kernels.h"
#include "cuda/support.h"

namespace veloxquant::cuda {

void attn_register_k4b8_v4b8(std::vector<AttnEntry>&);
void attn_register_k4b12_v8b8(std::vector<AttnEntry>&);
void attn_register_k8b12_v8b12(std::vector<AttnEntry>&);
void attn_register_k4b10_v8b12(std::vector<AttnEntry>&);
void attn_register_k8b8_v8b8(std::vector<AttnEntry>&);
void attn_register_wide_k4b8_v4b8(std::vector<AttnEntry>&);
void attn_register_rows4_k4b8_v4b8(std::vector<AttnEntry>&);
void attn_register_wide_rows4_k4b8_v4b8(std::vector<AttnEntry>&);
void attn_register_variants_k4b8_v4b8(std::vector<AttnVariantEntry>&);
void attn_register_variants_k4b12_v8b8(std::vector<AttnVariantEntry>&);

namespace {

using RegisterFn = void (*)(std::vector<AttnEntry>&);
std::vector<AttnEntry> collect(std::initializer_list<RegisterFn> fns) {
  std::vector<AttnEntry> v;
  for (RegisterFn f : fns) f(v);
  return v;
}

/// Every configuration's kernels; the two-blocks-per-SM ones (large unsplit grids: 8-row and
/// four-row forms); the four-row ones (chunks of <= 4 query rows).
const std::vector<AttnEntry>& registry() {
  static const std::vector<AttnEntry> r =
      collect({attn_register_k4b8_v4b8, attn_register_k4b12_v8b8, attn_register_k8b12_v8b12,
               attn_register_k4b10_v8b12, attn_register_k8b8_v8b8});
  return r;
}
const std::vector<AttnEntry>& wide_registry() {
  static const std::vector<AttnEntry> r = collect({attn_register_wide_k4b8_v4b8, attn_register_wide_rows4_k4b8_v4b8});
  return r;
}
const std::vector<AttnEntry>& rows4_registry() {
  static const std::vector<AttnEntry> r = collect({attn_register_rows4_k4b8_v4b8});
  return r;
}

bool same(const AttnConfigKey& a, const AttnConfigKey& b) {
  return a.head_dim == b.head_dim && a.key_sub_dim == b.key_sub_dim && a.key_bits == b.key_bits &&
         a.value_sub_dim == b.value_sub_dim && a.value_bits == b.value_bits && a.n_tiles == b.n_tiles &&
         a.cb_fmt == b.cb_fmt;
}

const AttnEntry* find_in(const std::vector<AttnEntry>& r, const AttnConfigKey& k, int rows4 = -1) {
  for (const AttnEntry& e : r)
    if (same(e.key, k) && (rows4 < 0 || e.rows4 == rows4)) return &e;
  return nullptr;
}
const AttnEntry* find(const AttnConfigKey& k) {
  if (const AttnEntry* e = find_in(registry(), k)) return e;
  return attn_any_dim_entry(k);  // keys without a tuned kernel: the plain kernel
}
/// The two-blocks form of k's 8-row (rows4 0) or four-row (rows4 1) kernel.
const AttnEntry* find_wide(const AttnConfigKey& k, int rows4) { return find_in(wide_registry(), k, rows4); }
const AttnEntry* find_rows4(const AttnConfigKey& k) { return find_in(rows4_registry(), k); }


std::string key_str(const AttnConfigKey& k) {
  std::ostringstream os;
  os << "d" << k.key_sub_dim << "b" << k.key_bits << "/d" << k.value_sub_dim << "b" << k.value_bits << "@"
     << k.head_dim << "x" << 8 * k.n_tiles << (k.cb_fmt == 1 ? " (e4m3 codebooks)" : k.cb_fmt == 2 ? " (int8 keys)" : k.cb_fmt == 3 ? " (int8 keys and values)" : "");
  return os.str();
}

/// Shared memory the driver reserves per block on the current device (cached per device).
int reserved_smem(int& dev) {
  static std::atomic<int> seen[64] = {};  // per device: 0 unqueried, else reserved bytes + 1
  VQ_CUDA_CHECK(cudaGetDevice(&dev));
  int reserved = dev >= 0 && dev < 64 ? seen[dev].load() - 1 : -1;
  if (reserved < 0) {
    VQ_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    if (dev >= 0 && dev < 64) seen[dev].store(reserved + 1);
  }
  return reserved;
}
/// Whether the dynamic shared base is where e's codebook layout assumes it: after the 0 or 1 KB
/// the driver reserves per block for the 64 KB-aligned layout (prmt 1), after 1 KB for the
/// two-blocks layout whose gathers carry the base as an immediate (prmt 2); sm_80/sm_90 reserve 1 KB.
bool smem_layout_fits(const AttnEntry& e, int& dev, int& reserved) {
  reserved = e.prmt ? reserved_smem(dev) : 1024;
  return e.prmt == 0 || reserved == 1024 || (reserved == 0 && e.prmt == 1);
}

/// Raises the dynamic shared-memory limit of a kernel once per device, after checking its
/// codebook layout against the device (smem_layout_fits).
void ensure_smem_attr(const AttnEntry& e) {
  if (e.prmt) {
    int dev = 0, reserved = 0;
    VQ_CHECK_T(smem_layout_fits(e, dev, reserved), UnsupportedError,
               "CUDA attention: device " << dev << " reserves " << reserved
                                         << " bytes of shared memory per block; the 8-bit codebook layout of "
                                         << key_str(e.key) << (e.prmt == 1 ? " is sized for 0 or 1024" : " (two blocks per SM) is sized for 1024"));
  }
  raise_smem_limit(e.kernel, size_t(e.smem));
}

std::atomic<bool> g_cluster_allowed{true};
std::atomic<long long> g_cluster_launches{0};
std::atomic<int> g_hint_shift{0};  // attn_set_hint_shift (tests)
std::atomic<long long> g_hinted_launches{0};
std::atomic<bool> g_rows4_allowed{true};
std::atomic<bool> g_window_first{true};  // attn_set_window_first
std::atomic<long long> g_window_first_launches{0};
std::atomic<long long> g_rows4_launches{0};
std::atomic<bool> g_wide_allowed{true};
std::atomic<long long> g_wide_launches{0};
std::atomic<bool> g_step_pdl{true};  // attn_set_step_pdl
std::atomic<long long> g_pdl_launches{0};

/// The entry a launch of configuration k with p's shape runs (before the two-blocks choice):
/// the four-row kernel when the chunk holds at most 4 query rows and one is built, else k's.
const AttnEntry* pick_entry(const AttnConfigKey& k, const AttnParams& p) {
  if (k.n_tiles == 1 && g_rows4_allowed.load() && p.n_kv_heads > 0 && p.n_row_chunks == 1 &&
      int64_t(p.n_heads / p.n_kv_heads) * p.q_len <= 4)
    if (const AttnEntry* r = find_rows4(k)) return r;
  return find(k);
}
const char* g_cluster_query_error = "";  // the last failed occupancy query (diagnosis)

/// The extended launch configuration of entry e's kernel over `grid`: with `cluster`, the grid's
/// x blocks (a segment's splits) form one cluster (for the occupancy query and for the launch);
/// priority != 0 is the launch's block-dispatch priority (see attn_launch); pdl: a programmatic
/// dependent of the kernel before it on the stream (attn_launch's pdl).
struct LaunchConfig {
  cudaLaunchAttribute attr[3]{};
  cudaLaunchConfig_t cfg{};
  LaunchConfig(const AttnEntry& e, dim3 grid, void* stream, bool cluster, int priority = 0, bool pdl = false) {
    unsigned n = 0;
    if (pdl) {
      attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[n].val.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    if (cluster) {
      attr[n].id = cudaLaunchAttributeClusterDimension;
      attr[n].val.clusterDim.x = grid.x, attr[n].val.clusterDim.y = 1, attr[n].val.clusterDim.z = 1;
      ++n;
    }
    if (priority != 0) {
      attr[n].id = cudaLaunchAttributePriority;
      attr[n].val.priority = priority;
      ++n;
    }
    cfg.gridDim = grid;
    cfg.blockDim = dim3(unsigned(e.threads));
    cfg.dynamicSmemBytes = size_t(e.smem);
    cfg.stream = as_stream(stream);
    cfg.attrs = attr;
    cfg.numAttrs = n;
  }
  LaunchConfig(const LaunchConfig&) = delete;  // cfg points at this object's attr
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

/// Whether entry e's kernel runs its own sm_90 code on the current device (sm_90+ and the kernel
/// built for it), which its sm_90-only paths need: the cluster merge, and the programmatic
/// dependent launch's grid_dep_wait (an sm_80 build run through PTX JIT has neither: it would read
/// code and window rows before the kernel before it wrote them). Cached per (device, kernel).
bool runs_sm90_code(const AttnEntry& e) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, bool> cache;
  int dev = 0;
  VQ_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, e.kernel);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int major = 0;
  VQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  cudaFuncAttributes fa{};
  VQ_CUDA_CHECK(cudaFuncGetAttributes(&fa, e.kernel));
  const bool ok = major >= 9 && fa.binaryVersion >= 90;
  cache[key] = ok;
  return ok;
}

/// How many clusters of `splits` blocks of the entry's kernel can be resident at once on the
/// current device (0: none, or the kernel/device cannot run clusters). Cached per (device,
/// kernel, splits); the first query also allows non-portable sizes (9..16) for the kernel.
int max_active_clusters(const AttnEntry& e, int splits) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> cache;
  int dev = 0;
  VQ_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, e.kernel, splits);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int n = 0;
  if (runs_sm90_code(e)) {
    if (splits > 8) VQ_CUDA_CHECK(cudaFuncSetAttribute(e.kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    VQ_CUDA_CHECK(cudaFuncSetAttribute(e.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem));
    const LaunchConfig cl(e, dim3(unsigned(splits), 1, 1), nullptr, true);
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&n, e.kernel, &cl.cfg);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not fatal: such launches merge through the workspace
      g_cluster_query_error = cudaGetErrorString(err);
      n = 0;
    }
  }
  cache[key] = n;
  return n;
}

/// Whether a launch of entry e with p's plan runs as clusters: 2..16 splits, the switch on,
/// and every segment's cluster resident at once (a second wave of clusters would cost more
/// than the merge saves).
bool use_cluster(const AttnEntry& e, const AttnParams& p) {
  if (e.plain || !g_cluster_allowed.load() || p.n_splits < 2 || p.n_splits > kAttnMaxClusterSplits) return false;
  const int64_t segments = int64_t(p.n_kv_heads) * p.n_row_chunks * p.batch;
  return segments <= max_active_clusters(e, p.n_splits);
}

/// The launch's fixed divisors as FastDivs (AttnParams::div_*), and the check that the split
/// arithmetic, which the kernel runs in 32 bits, cannot overflow: a block's work units are its
/// coded tokens plus window_weight per window token, at most the code capacity plus
/// window_weight x residual_length. A window-only launch (win_all: the fp16 cache, Standard
/// caches) has no coded tokens to weigh its window against, so its weight is 1 there.
void derive_divisors(AttnParams& p) {
  VQ_CHECK_VALUE(p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0,
                 "CUDA attention: n_heads " << p.n_heads << " is not a multiple of n_kv_heads " << p.n_kv_heads);
  VQ_CHECK_VALUE(p.window_weight >= 1, "CUDA attention: window_weight must be >= 1, got " << p.window_weight);
  if (p.win_all) p.window_weight = 1;
  const int64_t max_units = p.win_all ? p.win_cap
                                      : p.code_cap + int64_t(p.window_weight) * std::max(p.residual_length, 0);
  VQ_CHECK_T(max_units < (int64_t(1) << 31), UnsupportedError,
             "CUDA attention: code capacity " << p.code_cap << " + window weight " << p.window_weight
                                              << " x residual length " << p.residual_length
                                              << " passes the split arithmetic's 2^31 units");
  p.div_group = make_fast_div(uint32_t(p.n_heads / p.n_kv_heads));
  p.div_row_chunks = make_fast_div(uint32_t(std::max(p.n_row_chunks, 1)));
  p.div_splits = make_fast_div(uint32_t(std::max(p.n_splits, 1)));
  p.div_window_weight = make_fast_div(uint32_t(p.window_weight));
}

/// Launches through the entry's own kernel pointer, the one ensure_smem_attr configured. (A
/// `<<<>>>` launch from a template instantiated in several translation units, as the tuning
/// variants re-instantiate defaults, may reach another unit's registration of the kernel,
/// whose shared-memory limit was never raised: "invalid argument".) With clusters, the n_splits
/// blocks of each segment (grid x) form one cluster.
void launch_entry(const AttnEntry& entry, const AttnParams& p, dim3 grid, void* stream, int priority = 0,
                  bool pdl = false) {
  AttnEntry e = entry;
  AnyDimLaunch any;
  if (e.plain) {  // the plain kernel's instantiation for this launch's rows, its codebooks' replication
    any = attn_any_dim_launch(entry, p);
    e.kernel = any.kernel, e.smem = any.smem;
    raise_smem_limit(e.kernel, size_t(e.smem));
  }
  const bool cluster = use_cluster(e, p);
  pdl = pdl && g_step_pdl.load() && runs_sm90_code(e);
  AttnParams pg = p;
  pg.cluster_launch = cluster ? 1 : 0;
  if (e.plain) {
    pg.plain_key_bits = e.key.key_bits, pg.plain_value_bits = e.key.value_bits, pg.plain_cb_fmt = e.key.cb_fmt;
    pg.plain_cb_rep = any.cb_rep;
  }
  derive_divisors(pg);
  void* args[] = {&pg};
  if (!cluster && priority == 0 && !pdl) {
    VQ_CUDA_CHECK(cudaLaunchKernel(e.kernel, grid, dim3(unsigned(e.threads)), args, size_t(e.smem), as_stream(stream)));
    return;
  }
  const LaunchConfig lc(e, grid, stream, cluster, priority, pdl);
  VQ_CUDA_CHECK(cudaLaunchKernelExC(&lc.cfg, e.kernel, args));
  if (cluster) g_cluster_launches.fetch_add(1);
  if (pdl) g_pdl_launches.fetch_add(1);
}

}  // namespace

bool attn_config_compiled(const AttnConfigKey& k) { return find(k) != nullptr; }
bool attn_tuned_compiled(const AttnConfigKey& k) { return find_in(registry(), k) != nullptr; }

bool attn_set_cluster_merge(bool allowed) { return g_cluster_allowed.exchange(allowed); }
bool attn_set_rows4(bool allowed) { return g_rows4_allowed.exchange(allowed); }
bool attn_set_window_first(bool on) { return g_window_first.exchange(on); }
long long attn_window_first_launches() { return g_window_first_launches.load(); }
long long attn_rows4_launches() { return g_rows4_launches.load(); }
bool attn_set_wide(bool allowed) { return g_wide_allowed.exchange(allowed); }
bool attn_wide_pays(int64_t blocks, int64_t sms) {
  if (sms <= 0 || blocks < 2 * sms) return false;
  // In units of a one-block kernel's block time: that kernel runs ceil(blocks / sms) waves; the
  // two-blocks kernel runs rounds of 2·sms blocks, a pair on an SM taking kPair, and a last
  // round of sms blocks or fewer, one alone on an SM (8 warps), taking kLone. Run 145, int8 keys,
  // one-block against two-blocks kernel: kPair 1.92 at 16384 tokens a block (1.83 at 8192, 1.70
  // at 4096: the longest, least favourable one is taken), kLone 1.12 (34-48 x 16384).
  constexpr double kPair = 1.92, kLone = 1.12;
  const double one = double((blocks + sms - 1) / sms);
  const int64_t rounds = blocks / (2 * sms), rest = blocks % (2 * sms);
  const double wide = kPair * double(rounds + (rest > sms ? 1 : 0)) + (rest > 0 && rest <= sms ? kLone : 0.0);
  return wide < 0.98 * one;
}
long long attn_wide_launches() { return g_wide_launches.load(); }
long long attn_cluster_launches() { return g_cluster_launches.load(); }
namespace {
/// A device attribute, asked of the driver once per device and attribute (`cache` is the
/// attribute's own table).
int cached_device_attr(std::atomic<int> (&cache)[64], cudaDeviceAttr attr, int dev) {
  if (dev < 0) VQ_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 64) return 0;
  int n = cache[dev].load();
  if (n == 0) {
    VQ_CUDA_CHECK(cudaDeviceGetAttribute(&n, attr, dev));
    cache[dev].store(n);
  }
  return n;
}
}  // namespace
int device_sms(int dev) {
  static std::atomic<int> cache[64] = {};
  return cached_device_attr(cache, cudaDevAttrMultiProcessorCount, dev);
}
int device_smem_per_sm(int dev) {
  static std::atomic<int> cache[64] = {};
  return cached_device_attr(cache, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
}
int device_smem_per_block(int dev) {
  static std::atomic<int> cache[64] = {};
  return cached_device_attr(cache, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
}

bool attn_set_step_pdl(bool allowed) { return g_step_pdl.exchange(allowed); }
long long attn_pdl_launches() { return g_pdl_launches.load(); }

std::string attn_config_name(const AttnConfigKey& k) {
  std::ostringstream os;
  os << "d" << k.key_sub_dim << "b" << k.key_bits << "/d" << k.value_sub_dim << "b" << k.value_bits << "@"
     << k.head_dim << (k.cb_fmt == 1 ? "+e4m3" : k.cb_fmt == 2 ? "+i8" : k.cb_fmt == 3 ? "+i8kv" : "");
  return os.str();
}

std::string attn_not_compiled_message(const AttnConfigKey& k) {
  std::ostringstream os;
  os << "CUDA attention: configuration " << key_str(k) << " has no kernel (built: " << attn_compiled_list() << ")";
  return os.str();
}

const std::vector<std::string>& attn_compiled_names() {
  static const std::vector<std::string> v = [] {
    std::set<std::string> names;
    for (const AttnEntry& e : registry()) names.insert(attn_config_name(e.key));
    return std::vector<std::string>(names.begin(), names.end());
  }();
  return v;
}

const char* attn_compiled_list() {
  static const std::string s = [] {
    std::string out;
    for (const auto& n : attn_compiled_names()) out += (out.empty() ? "" : ", ") + n;
    std::ostringstream any;
    any << "; every other d4/d8 configuration of 4 to 12 bits at head_dim";
    std::set<int> dims(std::begin(kTunedHeadDims), std::end(kTunedHeadDims));
    dims.insert(std::begin(kAnyHeadDims), std::end(kAnyHeadDims));
    for (int d : dims) any << ' ' << d;
    any << ", any codebook format (the plain kernel)";
    out += any.str();
    return out;
  }();
  return s.c_str();
}

int attn_smem_bytes(const AttnConfigKey& k) {
  const AttnEntry* e = find(k);
  return e ? e->smem : 0;
}

int attn_blocks_per_sm(const AttnConfigKey& k, int device) {
  const AttnEntry* e = find(k);
  VQ_CHECK_T(e, UnsupportedError, attn_not_compiled_message(k));
  // cached per (device, kernel): eager calls plan every time, and the query costs host time
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find({device, e->kernel}); it != cache.end()) return it->second;
  }
  int prev = 0;
  VQ_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != device) VQ_CUDA_CHECK(cudaSetDevice(device));
  ensure_smem_attr(*e);
  int n = 0;
  VQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, e->kernel, e->threads, e->smem));
  if (prev != device) VQ_CUDA_CHECK(cudaSetDevice(prev));
  n = std::max(n, 1);
  std::lock_guard<std::mutex> lock(mu);
  cache[{device, e->kernel}] = n;
  return n;
}

void attn_launch(const AttnConfigKey& k, const AttnParams& p, void* stream, int priority, bool pdl) {
  const AttnEntry* e = find(k);
  VQ_CHECK_T(e, UnsupportedError, attn_not_compiled_message(k));
  VQ_CHECK_VALUE(p.n_splits >= 1 && p.n_splits <= 32, "CUDA attention: n_splits must be in 1..32, got " << p.n_splits);
  VQ_CHECK_VALUE(p.n_splits == 1 || (p.ws_o && p.ws_ml && p.counters),
                 "CUDA attention: a split launch needs a workspace (plan first)");
  VQ_CHECK_VALUE(!p.advance || p.done_counter, "CUDA attention: advancing lengths needs the done counter");
  VQ_CHECK_VALUE(p.hint_chunk <= 0 || (!p.win_all && p.hint_ncode >= 0 && p.hint_ncode <= p.code_cap),
                 "CUDA attention: length hint (hint_ncode " << p.hint_ncode << ") outside the code capacity 0.."
                                                           << p.code_cap << ", or given to a window-only launch");
  const int64_t gy = int64_t(p.n_kv_heads) * p.n_row_chunks;
  VQ_CHECK_VALUE(gy <= 65535 && p.batch <= 65535,
                 "CUDA attention: grid too large (n_kv_heads·row chunks = " << gy << ", batch = " << p.batch << ")");
  if (p.batch == 0 || p.n_kv_heads == 0 || p.q_len == 0) return;
  VQ_CHECK_VALUE(p.win_all || (p.k_row_stride == e->k_row && p.v_row_stride == e->v_row),
                 "CUDA attention: code row strides " << p.k_row_stride << "/" << p.v_row_stride << " differ from the "
                                                     << e->k_row << "/" << e->v_row << " the kernel is built for");
  e = pick_entry(k, p);
  if (e->rows4) g_rows4_launches.fetch_add(1);
  // Unsplit grids of two waves of blocks or more: the two-blocks-per-SM instantiation where one
  // exists and the wave model says it pays (attn_wide_pays), so one block's setup and tail
  // overlap the other's loop (the four-row kernels' own since run 145; the 8-row E4M3 one lost to
  // the one-block four-row kernel, run 78, and keeps the older rule: two waves or more).
  if (p.n_splits == 1 && g_wide_allowed.load()) {
    if (const AttnEntry* w = find_wide(k, e->rows4)) {
      int dev = 0;
      VQ_CUDA_CHECK(cudaGetDevice(&dev));
      const int64_t blocks = gy * p.batch, sms = device_sms(dev);
      int reserved = 0;  // a device whose shared base the two-blocks layout does not fit keeps the one-block kernel
      if ((e->rows4 ? attn_wide_pays(blocks, sms) : blocks >= 2 * sms) && smem_layout_fits(*w, dev, reserved)) e = w;
    }
  }
  if (e->wide) g_wide_launches.fetch_add(1);
  ensure_smem_attr(*e);
  if (p.hint_chunk > 0) g_hinted_launches.fetch_add(1);
  const bool window_first = p.window_first && g_window_first.load();
  if (e->win_first && window_first && !p.win_all) g_window_first_launches.fetch_add(1);
  const int shift = g_hint_shift.load();
  if ((shift != 0 && p.hint_chunk > 0) || window_first != bool(p.window_first)) {  // test and A/B hooks
    AttnParams q = p;
    if (shift != 0 && p.hint_chunk > 0) q.hint_chunk = int(std::clamp<int64_t>(int64_t(p.hint_chunk) + shift, 0, INT32_MAX));
    q.window_first = window_first;
    launch_entry(*e, q, dim3(p.n_splits, unsigned(gy), p.batch), stream, priority, pdl);
    return;
  }
  launch_entry(*e, p, dim3(p.n_splits, unsigned(gy), p.batch), stream, priority, pdl);
}

void attn_set_length_hint(AttnParams& p, int64_t len, int64_t window) {
  const int64_t rc = std::clamp<int64_t>(window, 0, len), n_code = len - rc;
  p.hint_ncode = int(n_code);
  p.hint_chunk = int(attn_split_chunk(n_code + int64_t(p.window_weight) * rc, p.n_splits));
}

int attn_set_hint_shift(int shift) { return g_hint_shift.exchange(shift); }
long long attn_hinted_launches() { return g_hinted_launches.load(); }

int attn_max_active_clusters(const AttnConfigKey& k, int splits, const char** error) {
  const AttnEntry* e = find(k);
  if (!e) return 0;
  ensure_smem_attr(*e);
  const int n = max_active_clusters(*e, splits);
  if (error) *error = g_cluster_query_error;
  return n;
}

bool attn_would_cluster(const AttnConfigKey& k, const AttnParams& p) {
  const AttnEntry* e = find(k) ? pick_entry(k, p) : nullptr;  // split launches never take the two-blocks entry
  return e && p.n_splits > 1 && use_cluster(*e, p);
}

namespace {
const std::vector<AttnVariantEntry>& variants() {
  static const std::vector<AttnVariantEntry> v = [] {
    std::vector<AttnVariantEntry> r;
    attn_register_variants_k4b8_v4b8(r);
    attn_register_variants_k4b12_v8b8(r);
    return r;
  }();
  return v;
}
const AttnVariantEntry& variant(int i) {
  VQ_CHECK_VALUE(i >= 0 && i < int(variants().size()),
                 "attention variant " << i << " does not exist (" << variants().size() << " built)");
  return variants()[size_t(i)];
}
}  // namespace

int attn_variant_count() { return int(variants().size()); }
AttnVariantInfo attn_variant_info(int i) {
  const AttnVariantEntry& e = variant(i);
  return {e.entry.key, e.kt, e.minb, e.warps, e.pipe, e.entry.rows4};
}
int attn_variant_blocks_per_sm(int i, int device) {
  const AttnEntry& e = variant(i).entry;
  int prev = 0;
  VQ_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != device) VQ_CUDA_CHECK(cudaSetDevice(device));
  ensure_smem_attr(e);
  int n = 0;
  VQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, e.kernel, e.threads, e.smem));
  if (prev != device) VQ_CUDA_CHECK(cudaSetDevice(prev));
  return std::max(n, 1);
}
void attn_launch_variant(int i, const AttnParams& p, void* stream) {
  const AttnEntry& e = variant(i).entry;
  ensure_smem_attr(e);
  launch_entry(e, p, dim3(p.n_splits, unsigned(p.n_kv_heads * p.n_row_chunks), p.batch), stream);
}

int plan_splits(int segments, int64_t typical_len, int n_sms, int blocks_per_sm, int64_t min_tokens_per_split) {
  if (segments <= 0) return 1;
  const int64_t slots = int64_t(std::max(n_sms, 1)) * std::max(blocks_per_sm, 1);
  int64_t s = std::max<int64_t>(1, slots / segments);
  s = std::min<int64_t>(s, std::max<int64_t>(1, typical_len / std::max<int64_t>(min_tokens_per_split, 1)));
  return int(std::clamp<int64_t>(s, 1, 32));
}

}  // namespace veloxquant::cuda
