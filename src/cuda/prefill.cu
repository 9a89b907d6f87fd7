// src/cuda/prefill.cu — the prefill kernels' instantiations and their one launch point (see
// prefill_kernel.cuh, prefill_exact_kernel.cuh). The default build compiles d4b8/d4b8 and the
// defaults d4b12/d8b8 at head_dim 64 and 128 in blocks of 128 rows; VQ_CUDA_ALL_CONFIGS adds
// d8b12/d8b12, d4b10/d8b12 and d8b8/d8b8, VQ_CUDA_VARIANTS the blocks of 64 rows. The exact-rows
// kernel: head_dim 64 (tiles of 64 tokens) and 128 (tiles of 64 or 32), taken where its grid
// fills two blocks a multiprocessor (set_prefill_exact_kernel, prefill_exact_pays), its history
// split (prefill_exact_split_plan) where that fills them instead; at head_dim 80 and 96 it is
// the only prefill kernel (exact rows only: the fp16 cache's, a coded cache's expanded ones).
// Anything else (head_dim 256 among them) keeps the decode kernel's row chunks.
#include <atomic>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/prefill_exact_kernel.cuh"
#include "cuda/prefill_kernel.cuh"

namespace veloxquant::cuda {
namespace {

struct PrefillEntry {
  int d, ks, kb, vs, vb, rows;
  const void* kernel;
  int smem;
  bool full_copies;  // codebook copies enough for conflict-free gathers (PrefillTraits::kRK / kRV at their maxima)
};

template <int D, int KS, int KB, int VS, int VB, int W>
void add_one(std::vector<PrefillEntry>& r) {
  using T = PrefillTraits<D, KS, KB, VS, VB, W>;
  r.push_back({D, KS, KB, VS, VB, T::kRows, reinterpret_cast<const void*>(&vq_prefill_kernel<D, KS, KB, VS, VB, W>),
               T::kSmem, T::kRK == T::kMaxRK && T::kRV == T::kMaxRV});
}
/// Head_dim 64 and 128 in blocks of 128 rows (8 warps, the default since run 121); blocks of 64
/// rows (4 warps, two blocks a multiprocessor: runs 116-120) with VQ_CUDA_VARIANTS only.
template <int KS, int KB, int VS, int VB>
void add_both_d(std::vector<PrefillEntry>& r) {
  add_one<64, KS, KB, VS, VB, 8>(r);
  add_one<128, KS, KB, VS, VB, 8>(r);
#if defined(VQ_CUDA_VARIANTS) && VQ_CUDA_VARIANTS
  add_one<64, KS, KB, VS, VB, 4>(r);
  add_one<128, KS, KB, VS, VB, 4>(r);
#endif
}

const std::vector<PrefillEntry>& registry() {
  static const std::vector<PrefillEntry> r = [] {
    std::vector<PrefillEntry> v;
    add_both_d<4, 8, 4, 8>(v);
    add_both_d<4, 12, 8, 8>(v);
#if defined(VQ_CUDA_ALL_CONFIGS) && VQ_CUDA_ALL_CONFIGS
    add_both_d<8, 12, 8, 12>(v);
    add_both_d<4, 10, 8, 12>(v);
    add_both_d<8, 8, 8, 8>(v);
#endif
    return v;
  }();
  return r;
}

const PrefillEntry* find(const AttnConfigKey& k, int rows) {
  for (const PrefillEntry& e : registry())
    if (e.d == k.head_dim && e.ks == k.key_sub_dim && e.kb == k.key_bits && e.vs == k.value_sub_dim &&
        e.vb == k.value_bits && (rows == 0 || e.rows == rows))
      return &e;
  return nullptr;
}

std::atomic<int> g_prefill_mode{kPrefillAuto};
std::atomic<int> g_exact_mode{kExactAuto};  // run 179: faster where its grid fills two blocks a multiprocessor
std::atomic<long long> g_exact_launches{0};
std::atomic<int> g_exact_splits{0};  // 0: prefill_exact_split_plan decides
std::atomic<long long> g_split_launches{0};
std::atomic<int> g_block_rows{0};
std::atomic<long long> g_prefill_launches{0};
std::atomic<int> g_rows_mode{kRowsAuto};
std::atomic<long long> g_rows_launches{0};

/// The rows path's workspaces come from one stream-ordered memory pool per device, which keeps up
/// to the limit reserved between calls (its release threshold): a model's layers, and the next
/// chunk, reuse the same memory without mapping it again.
struct RowsPools {
  std::mutex m;
  std::map<int, cudaMemPool_t> pools;
  int64_t limit = kRowsWorkspaceDefault;
};
RowsPools& rows_pools() {
  static RowsPools* p = new RowsPools;  // never destroyed: pools outlive every cache
  return *p;
}

}  // namespace

int set_prefill_rows_mode(int mode) {
  VQ_CHECK_VALUE(mode == kRowsOff || mode == kRowsAuto || mode == kRowsAlways,
                 "prefill over dequantized rows: mode 0 (off), 1 (auto) or 2 (always), got " << mode);
  return g_rows_mode.exchange(mode);
}
int prefill_rows_mode() { return g_rows_mode.load(); }
long long prefill_rows_launches() { return g_rows_launches.load(); }
void count_prefill_rows_launch() { g_rows_launches.fetch_add(1); }

int64_t set_rows_workspace_limit(int64_t bytes) {
  VQ_CHECK_VALUE(bytes >= 0, "prefill workspace limit: " << bytes << " bytes (must be >= 0)");
  RowsPools& rp = rows_pools();
  std::lock_guard<std::mutex> lk(rp.m);
  const int64_t prev = rp.limit;
  rp.limit = bytes;
  for (auto& [dev, pool] : rp.pools) {
    uint64_t thr = uint64_t(bytes);
    VQ_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
    if (bytes == 0) VQ_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  }
  return prev;
}
int64_t rows_workspace_limit() {
  RowsPools& rp = rows_pools();
  std::lock_guard<std::mutex> lk(rp.m);
  return rp.limit;
}
int64_t rows_workspace_reserved(int device) {
  RowsPools& rp = rows_pools();
  std::lock_guard<std::mutex> lk(rp.m);
  auto it = rp.pools.find(device);
  if (it == rp.pools.end()) return 0;
  uint64_t v = 0;
  VQ_CUDA_CHECK(cudaMemPoolGetAttribute(it->second, cudaMemPoolAttrReservedMemCurrent, &v));
  return int64_t(v);
}

void* rows_workspace_alloc(int device, size_t bytes, void* stream) {
  RowsPools& rp = rows_pools();
  cudaMemPool_t pool = nullptr;
  {
    std::lock_guard<std::mutex> lk(rp.m);
    if (bytes > size_t(rp.limit)) return nullptr;
    auto it = rp.pools.find(device);
    if (it == rp.pools.end()) {
      int supported = 0;
      VQ_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
      if (!supported) {
        rp.pools[device] = nullptr;
      } else {
        cudaMemPoolProps props{};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        VQ_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
        uint64_t thr = uint64_t(rp.limit);
        VQ_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
        rp.pools[device] = pool;
      }
    } else {
      pool = it->second;
    }
  }
  if (pool == nullptr) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool, as_stream(stream));
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // out of memory: the caller keeps the kernel over codes
    return nullptr;
  }
  VQ_CUDA_CHECK(e);
  return p;
}
void rows_workspace_free(void* p, void* stream) {
  if (p != nullptr) VQ_CUDA_CHECK(cudaFreeAsync(p, as_stream(stream)));
}

int set_prefill_mode(int mode) { return g_prefill_mode.exchange(mode); }
int prefill_mode() { return g_prefill_mode.load(); }
long long prefill_launches() { return g_prefill_launches.load(); }
bool prefill_compiled(const AttnConfigKey& k, int rows) { return find(k, rows) != nullptr; }
bool prefill_rows_compiled(int head_dim) {
  return head_dim == 80 || head_dim == 96 || prefill_compiled({head_dim, 4, 8, 4, 8, 1});
}
bool prefill_auto_on_codes(const AttnConfigKey& k, int64_t tokens, int q_len) {
  const PrefillEntry* e = find(k, kPrefillAutoRows);
  if (e == nullptr) return false;
  return e->full_copies || tokens <= int64_t(kPrefillShortHistory) * q_len;
}
int set_prefill_block_rows(int rows) {
  VQ_CHECK_VALUE(rows == 0 || rows == 64 || rows == 128, "prefill block rows: 0 (automatic), 64 or 128, got " << rows);
  return g_block_rows.exchange(rows);
}
int prefill_block_rows(const AttnParams& p) {
  const int forced = g_block_rows.load();
  (void)p;  // one size serves exact rows and codes alike (run 121: 128 rows 2-5% faster over exact rows)
  return forced != 0 ? forced : kPrefillAutoRows;
}

int set_prefill_exact_kernel(int mode) {
  VQ_CHECK_VALUE(mode == kExactOff || mode == kExactTile64 || mode == kExactTile32 || mode == kExactAuto,
                 "exact-rows prefill kernel: mode 0 (off), 1 (tiles of 64 tokens), 2 (of 32) or 3 (automatic), got "
                     << mode);
  return g_exact_mode.exchange(mode);
}
bool prefill_exact_pays(int64_t blocks, int64_t sms) { return sms > 0 && 2 * blocks >= 3 * sms; }
int prefill_exact_split_plan(int64_t blocks, int64_t sms, int64_t tokens) {
  for (int s = 2; s <= kExactMaxSplits; ++s)
    if (prefill_exact_pays(blocks * s, sms)) return tokens / 64 >= int64_t(kExactMinSplitTiles) * s ? s : 1;
  return 1;
}
int set_prefill_exact_splits(int n) {
  VQ_CHECK_VALUE(n >= 0 && n <= kExactMaxSplits,
                 "exact-rows prefill kernel: history split 0 (automatic) or 1 to " << kExactMaxSplits << ", got " << n);
  return g_exact_splits.exchange(n);
}
long long prefill_split_launches() { return g_split_launches.load(); }
int prefill_exact_kernel() { return g_exact_mode.load(); }
long long prefill_exact_launches() { return g_exact_launches.load(); }

namespace {
/// A prefill launch's grid in blocks of `rows` query rows: (kv head, row block, batch), the
/// kernels taking row blocks heaviest first; UnsupportedError where the row blocks pass gridDim.y.
dim3 prefill_grid(const AttnParams& p, int rows) {
  const int G = p.n_heads / p.n_kv_heads;
  const int64_t row_blocks = (int64_t(G) * p.q_len + rows - 1) / rows;
  VQ_CHECK_T(row_blocks <= 65535, UnsupportedError,
             "CUDA prefill attention: " << row_blocks << " blocks of " << rows << " rows (" << p.q_len
                                        << " queries x " << G << " heads a kv head) pass gridDim.y (65535)");
  return dim3(unsigned(p.n_kv_heads), unsigned(row_blocks), unsigned(p.batch));
}

/// The exact-rows kernel's blocks for a launch (its grid's size; see prefill_grid).
int64_t exact_blocks(const AttnParams& p) {
  const int64_t rows = int64_t(p.n_heads / p.n_kv_heads) * p.q_len;
  constexpr int kRows = PrefillExactTraits<128, 64>::kRows;  // every instantiation's
  return int64_t(p.n_kv_heads) * p.batch * ((rows + kRows - 1) / kRows);
}

template <int D, int TILE>
void exact_launch(const AttnParams& p, cudaStream_t s) {
  using T = PrefillExactTraits<D, TILE>;
  const void* kern = reinterpret_cast<const void*>(&vq_prefill_exact_kernel<D, TILE>);
  raise_smem_limit(kern, size_t(T::kSmem));
  void* args[] = {const_cast<AttnParams*>(&p)};
  VQ_CUDA_CHECK(cudaLaunchKernel(kern, prefill_grid(p, T::kRows), dim3(unsigned(T::kThreads)), args, size_t(T::kSmem), s));
}

/// The split kernel's tile: 64 tokens at head_dim 64; 32 at 128, where the unsplit kernel's tiles
/// of 64 take 255 registers and the split's few more made ptxas spill ~100 bytes (244 with 32).
template <int D>
constexpr int kExactSplitTile = D == 128 ? 32 : 64;
/// The unsplit kernel's tile (kExactAuto, kExactTile64): 64 tokens, 32 at head_dim 96 (ptxas,
/// sm_90: tiles of 64 spill 40 bytes there at 255 registers).
template <int D>
constexpr int kExactTile = D == 96 ? 32 : 64;

/// f(std::integral_constant<int, D>{}) for the exact-rows kernel's head dims (64, 128, 80, 96);
/// false for any other.
template <class F>
bool with_exact_d(int head_dim, F&& f) {
  switch (head_dim) {
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    case 80: f(std::integral_constant<int, 80>{}); return true;
    case 96: f(std::integral_constant<int, 96>{}); return true;
    default: return false;
  }
}

/// The exact-rows kernel with the history split over `splits` blocks, then the merge, the
/// partial results in a workspace from the rows path's pool (freed behind the merge). False
/// (nothing launched) where the workspace is not to be had or batch · splits passes gridDim.z:
/// the caller launches otherwise.
template <int D>
bool exact_split_launch(const AttnParams& p0, int splits, cudaStream_t s) {
  constexpr int kTile = kExactSplitTile<D>;
  using T = PrefillExactTraits<D, kTile>;
  const int64_t rows = int64_t(p0.n_heads / p0.n_kv_heads) * p0.q_len;
  const int64_t items = int64_t(splits) * p0.batch * p0.n_kv_heads * rows;
  if (int64_t(p0.batch) * splits > 65535) return false;
  int dev = 0;
  VQ_CUDA_CHECK(cudaGetDevice(&dev));
  void* ws = rows_workspace_alloc(dev, size_t(items) * (D + 2) * sizeof(float), s);
  if (ws == nullptr) return false;
  AttnParams p = p0;
  p.n_splits = splits;
  p.ws_o = static_cast<float*>(ws);
  p.ws_ml = p.ws_o + items * D;
  const void* kern = reinterpret_cast<const void*>(&vq_prefill_exact_kernel<D, kTile, true>);
  raise_smem_limit(kern, size_t(T::kSmem));
  dim3 grid = prefill_grid(p, T::kRows);
  grid.z *= unsigned(splits);
  void* args[] = {&p};
  try {
    VQ_CUDA_CHECK(cudaLaunchKernel(kern, grid, dim3(unsigned(T::kThreads)), args, size_t(T::kSmem), s));
    const int64_t merge_rows = int64_t(p.batch) * p.n_kv_heads * rows;
    vq_prefill_merge_kernel<D><<<unsigned((merge_rows + 7) / 8), 256, 0, s>>>(p);
    VQ_CUDA_CHECK(cudaGetLastError());
  } catch (...) {
    rows_workspace_free(ws, s);
    throw;
  }
  rows_workspace_free(ws, s);
  return true;
}
}  // namespace

void prefill_launch(const AttnConfigKey& k, const AttnParams& p, void* stream) {
  VQ_CHECK_T(p.n_new == 0, ValueError, "CUDA prefill attention: eager calls only (n_new = " << p.n_new << ")");
  // every token an exact row: the kernel of 32 rows a warp (prefill_exact_kernel.cuh) where it is
  // switched on and no other block size is forced; kExactAuto: where its grid fills two blocks a
  // multiprocessor, else split over 2 to kExactMaxSplits blocks a row block where that fills them
  // and the history is long enough (prefill_exact_split_plan), else vq_prefill_kernel below
  // Head dims 80 and 96 have no other prefill kernel: the exact-rows one whatever the mode.
  const bool only_exact = k.head_dim == 80 || k.head_dim == 96;
  VQ_CHECK_T(!only_exact || p.win_all, UnsupportedError,
             "CUDA prefill attention: head_dim " << k.head_dim << " has a prefill kernel over exact rows only");
  const int exact = only_exact ? kExactAuto : g_exact_mode.load();
  if (p.win_all && exact != kExactOff && (k.head_dim == 64 || k.head_dim == 128 || only_exact) &&
      (only_exact || prefill_block_rows(p) == kPrefillAutoRows)) {
    const int forced = g_exact_splits.load();
    int splits = forced != 0 ? forced : 1;
    bool use = exact != kExactAuto || forced != 0 || only_exact;
    if (exact == kExactAuto && forced == 0) {
      const int64_t blocks = exact_blocks(p), sms = device_sms();
      if (!prefill_exact_pays(blocks, sms)) splits = prefill_exact_split_plan(blocks, sms, p.prefill_tokens);
      else use = true;
    }
    const cudaStream_t s = as_stream(stream);
    bool split_done = false;
    if (splits > 1 && exact != kExactTile32)
      with_exact_d(k.head_dim, [&](auto d) { split_done = exact_split_launch<decltype(d)::value>(p, splits, s); });
    if (split_done) {
      g_prefill_launches.fetch_add(1);
      g_exact_launches.fetch_add(1);
      g_split_launches.fetch_add(1);
      return;
    }
    if (use) {  // (a split the workspace could not be had for, chosen automatically: vq_prefill_kernel)
      if (exact == kExactTile32 && k.head_dim == 128) {
        exact_launch<128, 32>(p, s);
      } else {
        with_exact_d(k.head_dim, [&](auto d) { exact_launch<decltype(d)::value, kExactTile<decltype(d)::value>>(p, s); });
      }
      g_prefill_launches.fetch_add(1);
      g_exact_launches.fetch_add(1);
      return;
    }
  }
  const PrefillEntry* e = find(k, prefill_block_rows(p));
  VQ_CHECK_T(e != nullptr, UnsupportedError,
             "CUDA prefill attention: no kernel for head_dim " << k.head_dim << ", keys d" << k.key_sub_dim << "b"
                                                                << k.key_bits << ", values d" << k.value_sub_dim << "b"
                                                                << k.value_bits << " in blocks of "
                                                                << prefill_block_rows(p) << " rows");
  const int k_row = ((k.head_dim / k.key_sub_dim * k.key_bits + 7) / 8 + 3) / 4 * 4;
  const int v_row = ((k.head_dim / k.value_sub_dim * k.value_bits + 7) / 8 + 3) / 4 * 4;
  VQ_CHECK_T(p.win_all || (p.k_row_stride == k_row && p.v_row_stride == v_row), UnsupportedError,
             "CUDA prefill attention: code rows of " << p.k_row_stride << " / " << p.v_row_stride
                                                     << " bytes, the kernel reads " << k_row << " / " << v_row);
  raise_smem_limit(e->kernel, size_t(e->smem));
  // codebook formats (CodebookFormat): keys fp16 / E4M3 / int8 / int8; values fp16 / E4M3 / fp16 / offset int8
  const int kfmt = k.cb_fmt == 0 ? 0 : k.cb_fmt == 1 ? 1 : 2;
  const int vfmt = k.cb_fmt == 1 ? 1 : k.cb_fmt == 3 ? 3 : 0;
  const dim3 grid = prefill_grid(p, e->rows);
  void* args[] = {const_cast<AttnParams*>(&p), const_cast<int*>(&kfmt), const_cast<int*>(&vfmt)};
  VQ_CUDA_CHECK(cudaLaunchKernel(e->kernel, grid, dim3(unsigned(e->rows * 2)), args, size_t(e->smem), as_stream(stream)));
  g_prefill_launches.fetch_add(1);
}

}  // namespace veloxquant::cuda
