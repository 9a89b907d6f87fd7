// src/cuda/attention_any_dim.cu — the host side of the plain attention kernel (the head dims
// without a tuned kernel, kAnyHeadDims, and the configurations no tuned kernel serves at the
// others, kTunedHeadDims; the kernel and what it computes: attention_any_dim_kernel.cuh, its
// instantiations attn_any_hd<D>.cu): which configurations it serves (attn_any_dim_entry), the
// instantiation and the codebook replication of a launch (attn_any_dim_launch).
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda/attention_any_dim.cuh"
#include "cuda/attention_kernel.cuh"
#include "cuda/kernels.h"

namespace veloxquant::cuda {

using namespace any_dim;

namespace {

const void* any_kernel_for(int D, int ks, int vs, int nr) {
  static_assert(sizeof(kAnyHeadDims) / sizeof(int) == 5 && sizeof(kTunedHeadDims) / sizeof(int) == 3,
                "the cases below follow kAnyHeadDims and kTunedHeadDims");
  switch (D) {
    case 64: return kernel_for<64>(ks, vs, nr);
    case 80: return kernel_for<80>(ks, vs, nr);
    case 96: return kernel_for<96>(ks, vs, nr);
    case 112: return kernel_for<112>(ks, vs, nr);
    case 128: return kernel_for<128>(ks, vs, nr);
    case 160: return kernel_for<160>(ks, vs, nr);
    case 192: return kernel_for<192>(ks, vs, nr);
    default: return kernel_for<256>(ks, vs, nr);
  }
}

/// The instantiation (NR of kAnyRowVariants) for chunks of at most `rows` live rows.
int any_rows_variant(int rows) {
  for (int nr : kAnyRowVariants)
    if (rows <= nr) return nr;
  return kAnyMaxRows;
}

std::atomic<bool> g_plain_rep{true};
std::atomic<long long> g_plain_rep_launches{0};
std::atomic<long long> g_plain_launches{0};

/// Blocks of `smem` dynamic bytes a multiprocessor holds (at most the kernel's 2; the driver's
/// 1 KB a block and the kernel's static bytes counted), 0 where one block does not fit.
int any_blocks(int smem, int smem_sm, int smem_block) {
  if (smem > smem_block) return 0;
  return std::min(2, smem_sm / (smem + 1024 + 64));
}

/// The replication (AttnParams::plain_cb_rep) of a launch of `nr` rows on key k: the most
/// codebooks of at most kAnyRepMaxBits that keep as many blocks a multiprocessor as none would
/// (keys first: scores gather a centroid a sub-vector, values one a value sub-vector), none
/// while attn_set_plain_replicated is off.
int any_rep(const AttnConfigKey& k, int nr) {
  if (!g_plain_rep.load()) return 0;
  auto bytes = [&](int rep) {
    return any_layout(k.head_dim, k.key_sub_dim, k.key_bits, k.value_sub_dim, k.value_bits, nr, true, rep).total;
  };
  const int sm = device_smem_per_sm(), block = device_smem_per_block();
  const int base = any_blocks(bytes(0), sm, block);
  const bool rk = k.key_bits <= kAnyRepMaxBits, rv = k.value_bits <= kAnyRepMaxBits;
  for (int rep : {kAnyRepKeys | kAnyRepValues, kAnyRepKeys, kAnyRepValues}) {
    if (((rep & kAnyRepKeys) && !rk) || ((rep & kAnyRepValues) && !rv)) continue;
    if (any_blocks(bytes(rep), sm, block) >= std::max(base, 1)) return rep;
  }
  return 0;
}

}  // namespace

bool attn_set_plain_replicated(bool allowed) { return g_plain_rep.exchange(allowed); }
long long attn_plain_replicated_launches() { return g_plain_rep_launches.load(); }
long long attn_plain_launches() { return g_plain_launches.load(); }

bool attn_any_head_dim(int head_dim) {
  for (int d : kAnyHeadDims)
    if (d == head_dim) return true;
  return false;
}
bool attn_plain_head_dim(int head_dim) {
  for (int d : kTunedHeadDims)
    if (d == head_dim) return true;
  return attn_any_head_dim(head_dim);
}
std::string attn_head_dims_list() {
  std::string s;
  for (int d : kTunedHeadDims) s += (s.empty() ? "" : ", ") + std::to_string(d);
  for (int d : kAnyHeadDims) s += ", " + std::to_string(d);
  return s;
}

const AttnEntry* attn_any_dim_entry(const AttnConfigKey& k) {
  if (!attn_plain_head_dim(k.head_dim)) return nullptr;
  if ((k.key_sub_dim != 4 && k.key_sub_dim != 8) || (k.value_sub_dim != 4 && k.value_sub_dim != 8)) return nullptr;
  if (k.key_bits < 4 || k.key_bits > kAnyMaxBits || k.value_bits < 4 || k.value_bits > kAnyMaxBits) return nullptr;
  if (k.n_tiles < 1 || k.n_tiles > 2 || k.cb_fmt < 0 || k.cb_fmt > 3) return nullptr;
  const int D = k.head_dim, rows = 8 * k.n_tiles;
  int smem = 0;  // the largest of the instantiations a launch of this key may take, unreplicated
  for (int nr : kAnyRowVariants)
    if (nr <= rows)
      smem = std::max(smem, any_layout(D, k.key_sub_dim, k.key_bits, k.value_sub_dim, k.value_bits, nr, true, 0).total);
  if (smem > 227 * 1024) return nullptr;
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int, int, int, int>, AttnEntry> entries;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(D, k.key_sub_dim, k.key_bits, k.value_sub_dim, k.value_bits, k.n_tiles, k.cb_fmt);
  auto it = entries.find(key);
  if (it == entries.end()) {
    AttnEntry e{};
    e.key = k;
    e.kernel = any_kernel_for(D, k.key_sub_dim, k.value_sub_dim, rows);  // (occupancy queries: the widest)
    e.smem = smem;
    e.threads = kAnyThreads;
    e.k_row = any_row_bytes(D, k.key_sub_dim, k.key_bits);  // what the kernel stages a row as
    e.v_row = any_row_bytes(D, k.value_sub_dim, k.value_bits);
    e.plain = 1;
    it = entries.emplace(key, e).first;
  }
  return &it->second;  // std::map nodes never move
}

AnyDimLaunch attn_any_dim_launch(const AttnEntry& e, const AttnParams& p) {
  const int rows = std::min(8 * e.key.n_tiles, p.n_heads / std::max(p.n_kv_heads, 1) * p.q_len);
  const int nr = any_rows_variant(rows);
  const AttnConfigKey& k = e.key;
  AnyDimLaunch l;
  l.kernel = any_kernel_for(k.head_dim, k.key_sub_dim, k.value_sub_dim, nr);
  l.cb_rep = p.win_all ? 0 : any_rep(k, nr);
  l.smem = any_layout(k.head_dim, k.key_sub_dim, k.key_bits, k.value_sub_dim, k.value_bits, nr, true, l.cb_rep).total;
  if (l.cb_rep) g_plain_rep_launches.fetch_add(1);
  g_plain_launches.fetch_add(1);
  return l;
}

}  // namespace veloxquant::cuda
