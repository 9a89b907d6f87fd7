// src/cuda/encode_grid_build.cu — a codebook's candidate grid (src/core/pq_grid.h) built on the
// GPU, for codebooks of more than 256 centroids (16-bit lists).
//
// Why. The host build narrows each box's list from its parent's (pq_grid.cpp); for the
// defaults' 4096-centroid d4b12 keys at 16^4 cells it takes 180-250 ms on the H200 machine's 16
// cores and ~0.6 s on two (runs 103-105). Here one block per cell runs the flat rule of the
// proof (the centroid nearest the cell's centre, every centroid it does not beat on the cell,
// then those no other survivor beats): 46 ms for the whole grid, 9 ms for a 1024-centroid one
// (run 105). Still the cost of scanning ~1.4 M token-heads, so the caches build it only once
// their bulk encodes reach cuda::grid_build_after().
//
// Exactness. The lists need not equal the host build's (neither is minimal in general); they
// must be complete, and the proof in pq_grid.h holds for any evaluation order of beats(): the
// decision allows 1e-12 of the terms' size for double rounding, far above what contracting the
// products into FMAs can change. The encoders re-rank a list with the oracle's arithmetic, so
// codes are the oracle's whichever complete list they scan (tests: CudaEncode.*Grid*).
//
// Two passes over the cells, the same code: the first writes each cell's list length, the host
// turns them into the cell words (first list word << 9 | count; 0 = a cell whose list would
// exceed 511 entries, whose points scan), the second writes the lists where the words say.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/cuda_hooks.h"
#include "cuda/cuda_util.cuh"
#include "cuda/encode_grid.h"
#include "veloxquant/error.h"

namespace veloxquant::cuda {

namespace {

constexpr int kThreads = 256;

struct BuildParams {
  int n = 0, g = 0;
  int pow2 = 0;  // n rounded up to a power of two (the sort's buffers)
  double blo[4][32], bhi[4][32];  // per dimension and cell index: the enlarged cell's bounds
};

/// Whether centroid o beats c by the margin everywhere on box [a, b] (pq_grid.cpp's Builder::beats).
__device__ __forceinline__ bool beats(const float4* cb, const double (&a)[4], const double (&b)[4], int o, int c) {
  const float4 fc = __ldg(cb + c), fo = __ldg(cb + o);
  const double cj[4] = {fc.x, fc.y, fc.z, fc.w}, oj[4] = {fo.x, fo.y, fo.z, fo.w};
  double m = 0, size = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const double ca = a[j] - cj[j], cb2 = b[j] - cj[j], oa = a[j] - oj[j], ob = b[j] - oj[j];
    m += fmin(ca * ca - (1 + detail::kGridDelta) * oa * oa, cb2 * cb2 - (1 + detail::kGridDelta) * ob * ob);
    size += fmax(ca * ca, cb2 * cb2) + fmax(oa * oa, ob * ob);
  }
  return m > detail::kGridEps + 1e-12 * size;
}

/// The squared distance of centroid c to the centre of box [a, b], in double.
__device__ __forceinline__ double centre_dist2(const float4* cb, const double (&a)[4], const double (&b)[4], int c) {
  const float4 f = __ldg(cb + c);
  const double v[4] = {f.x, f.y, f.z, f.w};
  double e = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const double t = 0.5 * (a[j] + b[j]) - v[j];
    e += t * t;
  }
  return e;
}

/// Appends, in ascending index order, every i < m with keep(i) to out (shared) and returns how
/// many: rounds of kThreads candidates, a warp ballot and a prefix over the block's warps each.
template <class Keep>
__device__ int compact(int m, Keep keep, const uint16_t* in, uint16_t* out, int* s_warp) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int total = 0;
  for (int r = 0; r < m; r += kThreads) {
    const int i = r + tid;
    const bool k = i < m && keep(i);
    const unsigned bal = __ballot_sync(0xffffffffu, k);
    if (lane == 0) s_warp[warp] = __popc(bal);
    __syncthreads();
    int before = 0, round = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      before += w < warp ? s_warp[w] : 0;
      round += s_warp[w];
    }
    if (k) out[total + before + __popc(bal & ((1u << lane) - 1u))] = in ? in[i] : uint16_t(i);
    total += round;
    __syncthreads();
  }
  return total;
}

/// One block per cell. pass 0: counts[cell] = the cell's list length; pass 1: the list written at
/// the word offset of cells[cell] (16-bit entries, the run padded by repeating its last entry).
__global__ void __launch_bounds__(kThreads) grid_build_kernel(const float4* cb, const __grid_constant__ BuildParams p,
                                                             int pass, uint32_t* counts, const uint32_t* cells,
                                                             uint32_t* lists) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* const key = reinterpret_cast<float*>(smem);              // [P] survivors' centre distances
  uint16_t* const ord = reinterpret_cast<uint16_t*>(key + p.pow2);  // [P] survivors by centre distance
  uint16_t* const surv = ord + p.pow2;                              // [n] step 2's survivors, ascending
  uint16_t* const fin = surv + p.n;                                 // [n] the list
  __shared__ double s_e[kThreads / 32];
  __shared__ int s_i[kThreads / 32], s_warp[kThreads / 32], s_best;
  const int cell = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (pass == 1 && (cells[cell] & detail::kGridMaxCount) == 0) return;  // a scan cell: no list
  double a[4], b[4];
  {
    int r = cell;
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = p.blo[j][r % p.g], b[j] = p.bhi[j][r % p.g], r /= p.g;
  }
  // 1. the centroid nearest the box's centre (ties: the lowest index)
  double be = INFINITY;
  int bi = 0x7fffffff;
  for (int c = tid; c < p.n; c += kThreads) {
    const double e = centre_dist2(cb, a, b, c);
    if (e < be) be = e, bi = c;  // ascending c: a tie keeps the lower index
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const double e2 = __shfl_xor_sync(0xffffffffu, be, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
    if (e2 < be || (e2 == be && i2 < bi)) be = e2, bi = i2;
  }
  if (lane == 0) s_e[warp] = be, s_i[warp] = bi;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < kThreads / 32; ++w)
      if (s_e[w] < be || (s_e[w] == be && s_i[w] < bi)) be = s_e[w], bi = s_i[w];
    s_best = bi;
  }
  __syncthreads();
  const int best = s_best;
  // 2. every centroid the nearest does not beat on the box
  const int S = compact(p.n, [&](int c) { return c == best || !beats(cb, a, b, best, c); }, nullptr, surv, s_warp);
  // 3. those no other survivor beats. The outcome does not depend on the order of the tests;
  // tried nearest the centre first, a beaten candidate usually leaves after a few (outer cells
  // keep thousands after step 2: testing them in index order cost S^2). Bitonic sort of the
  // survivors by centre distance over the next power of two (pads: +inf).
  int P2 = 1;
  while (P2 < S) P2 <<= 1;
  for (int k = tid; k < P2; k += kThreads) {
    key[k] = k < S ? float(centre_dist2(cb, a, b, surv[k])) : INFINITY;
    ord[k] = k < S ? surv[k] : 0;
  }
  __syncthreads();
  for (int size = 2; size <= P2; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = tid; t < P2 / 2; t += kThreads) {
        const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
        const bool up = (lo & size) == 0;
        const float klo = key[lo], khi = key[hi];
        if ((klo > khi) == up) {
          key[lo] = khi, key[hi] = klo;
          const uint16_t o = ord[lo];
          ord[lo] = ord[hi], ord[hi] = o;
        }
      }
      __syncthreads();
    }
  const int F = compact(S, [&](int i) {
    const int c = surv[i];
    for (int k = 0; k < S; ++k)
      if (ord[k] != c && beats(cb, a, b, ord[k], c)) return false;
    return true;
  }, surv, fin, s_warp);
  if (pass == 0) {
    if (tid == 0) counts[cell] = uint32_t(F);
    return;
  }
  const uint32_t first = cells[cell] >> detail::kGridCountBits;
  uint16_t* const out = reinterpret_cast<uint16_t*>(lists + first);
  const int padded = (F + 1) & ~1;
  for (int k = tid; k < padded; k += kThreads) out[k] = fin[min(k, F - 1)];
}

/// `dev` current for the scope (the previous device restored after).
struct CurrentDevice {
  int prev = 0;
  explicit CurrentDevice(int dev) {
    VQ_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != dev) VQ_CUDA_CHECK(cudaSetDevice(dev));
  }
  ~CurrentDevice() { cudaSetDevice(prev); }
};

}  // namespace

DeviceEncodeGrid build_encode_grid_on_device(const float* codebook, int n_centroids, int sub_dim, Device device) {
  DeviceEncodeGrid d;
  if (n_centroids <= 256) return d;  // (8-bit lists: the host build, upload_encode_grid)
  auto grid = std::make_shared<detail::CandidateGrid>();
  BuildParams p;
  const int g = detail::default_grid_cells(n_centroids);
  if (!detail::grid_geometry(codebook, n_centroids, sub_dim, g, *grid, p.blo, p.bhi)) return d;
  p.n = n_centroids, p.g = g;
  p.pow2 = 1;
  while (p.pow2 < n_centroids) p.pow2 <<= 1;
  const int n_cells = g * g * g * g;
  CurrentDevice on(device.index);
  Tensor cb = Tensor::empty({int64_t(n_centroids) * 4}, DType::F32, device);
  detail::cuda_memcpy_h2d(cb.data(), codebook, size_t(n_centroids) * 16, device);
  d.cells = Tensor::empty({n_cells}, DType::U32, device);
  const size_t smem = size_t(p.pow2) * (sizeof(float) + sizeof(uint16_t)) + size_t(n_centroids) * 2 * sizeof(uint16_t);
  // pass 0: list lengths (into the cells buffer, rewritten below as cell words)
  grid_build_kernel<<<n_cells, kThreads, smem>>>(cb.ptr<float4>(), p, 0, d.cells.ptr<uint32_t>(), nullptr, nullptr);
  VQ_CUDA_CHECK(cudaGetLastError());
  std::vector<uint32_t> count(static_cast<size_t>(n_cells));
  VQ_CUDA_CHECK(cudaMemcpy(count.data(), d.cells.data(), count.size() * 4, cudaMemcpyDeviceToHost));
  const int64_t words = detail::pack_cell_words(count, *grid);
  if (words < 0) return DeviceEncodeGrid{};  // offsets overflow
  grid->lists.resize(size_t(std::max<int64_t>(words, 1)));
  VQ_CUDA_CHECK(cudaMemcpy(d.cells.data(), grid->cells.data(), grid->cells.size() * 4, cudaMemcpyHostToDevice));
  d.lists = Tensor::empty({int64_t(grid->lists.size())}, DType::U32, device);
  // pass 1: the lists
  grid_build_kernel<<<n_cells, kThreads, smem>>>(cb.ptr<float4>(), p, 1, nullptr, d.cells.ptr<uint32_t>(),
                                                 d.lists.ptr<uint32_t>());
  VQ_CUDA_CHECK(cudaGetLastError());
  VQ_CUDA_CHECK(cudaMemcpy(grid->lists.data(), d.lists.data(), grid->lists.size() * 4, cudaMemcpyDeviceToHost));
  d.host = grid;
  fill_encode_grid_view(d);
  return d;
}

}  // namespace veloxquant::cuda
