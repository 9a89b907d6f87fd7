// src/cuda/cuda_util.cuh — small device helpers shared by the kernels: error checking, float
// loads/stores by runtime dtype, streaming loads, the fp16 tensor-core MMA and bit extraction.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/kernels.h"
#include "veloxquant/dtype.h"
#include "veloxquant/error.h"

#define VQ_CUDA_CHECK(expr)                                                                       \
  do {                                                                                            \
    const cudaError_t vq_err_ = (expr);                                                           \
    if (vq_err_ != cudaSuccess)                                                                   \
      VQ_THROW(CudaError, #expr << " failed: " << cudaGetErrorString(vq_err_) << " (" << __FILE__ \
                                << ":" << __LINE__ << ")");                                      \
  } while (0)

namespace veloxquant::cuda {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

/// Raises a kernel's dynamic shared-memory limit to `bytes` on the current device, once: a later
/// call asking no more returns without touching the driver (so a decode step captured after its
/// first eager launch does no configuration inside the capture). Safe from several host threads.
inline void raise_smem_limit(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> raised;
  int dev = 0;
  VQ_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = raised[{dev, kernel}];
  if (have >= bytes) return;
  VQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  have = bytes;
}

// ---- loads and stores by runtime dtype (F32 = 0, F16 = 1, BF16 = 2) -----------------------
__device__ __forceinline__ float load_f(const void* base, DType dt, int64_t i) {
  if (dt == DType::F16) return __half2float(static_cast<const __half*>(base)[i]);
  if (dt == DType::BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  return static_cast<const float*>(base)[i];
}
__device__ __forceinline__ void store_f(void* base, DType dt, int64_t i, float x) {
  if (dt == DType::F16) static_cast<__half*>(base)[i] = __float2half_rn(x);
  else if (dt == DType::BF16) static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
  else static_cast<float*>(base)[i] = x;
}
/// Rounds to the 16-bit storage type and returns the raw bits.
__device__ __forceinline__ uint16_t f_to_store16(float x, int bf16) {
  if (bf16) {
    __nv_bfloat16 h = __float2bfloat16_rn(x);
    return *reinterpret_cast<uint16_t*>(&h);
  }
  __half h = __float2half_rn(x);
  return *reinterpret_cast<uint16_t*>(&h);
}
__device__ __forceinline__ float store16_to_f(uint16_t v, int bf16) {
  if (bf16) return __uint_as_float(uint32_t(v) << 16);
  __half h = *reinterpret_cast<__half*>(&v);
  return __half2float(h);
}

// ---- streaming loads: read once, keep out of L1 -------------------------------------------
/// NW 32-bit words (NW = 2 or 4: one 8- or 16-byte aligned load) through the read-only path.
template <int NW>
__device__ __forceinline__ void ldg_words(const void* p, uint32_t (&w)[NW]) {
  static_assert(NW == 2 || NW == 4, "one 8- or 16-byte load");
  if constexpr (NW == 2) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = u.x, w[1] = u.y;
  } else {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
  }
}

__device__ __forceinline__ uint32_t ld_stream_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_stream_u64(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_stream_u128(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/// atomicAdd with acquire-release semantics at gpu scope (returns the old value): thread 0's
/// arrival on a counter after a block barrier publishes the whole block's prior stores, and
/// the thread that reads the final count sees every arrival's stores.
__device__ __forceinline__ int atom_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

/// Asks L2 to fetch [p, p + bytes) ahead of use (sm_90 bulk prefetch; a no-op before).
/// p and bytes are rounded outward to 16 bytes; the buffers carry slack for that.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = a & ~uintptr_t(15);
  const uint32_t n = uint32_t(((a + bytes + 15) & ~uintptr_t(15)) - lo);
  if (n > 0)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"(n) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// ---- fp16 tensor-core MMA: D[16x8] += A[16x16] · B[16x8], fp32 accumulators ---------------
// Fragment ownership (lane = 4·g + t): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1],
// a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9]; b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g];
// c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]. Lower column/row index in the low half.
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// D += A·B on int8 tensor cores, m16n8k32 (s8 · s8 → s32, exact): a0/a2 hold row g's k =
/// 4t..4t+3 / 16+4t..16+4t+3, a1/a3 row g + 8's; b0/b1 column g's same k ranges.
__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// D += A·B on int8 tensor cores, m16n8k32, signed A · unsigned B → s32 (exact), with the
/// fragment ownership of mma_s8.
__device__ __forceinline__ void mma_s8u8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// One 32-bit word at a 32-bit shared-window address.
__device__ __forceinline__ uint32_t lds_u32(uint32_t a) {
  uint32_t r;
  asm("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(a));
  return r;
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }

/// Two bf16 values (one word) to two fp16 values (one word).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w) {
  return pack_half2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}

/// 2^x, approximate (MUFU.EX2, flush-to-zero): ex2(-inf) = 0. The softmaxes in log2 units.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- Walsh–Hadamard butterflies of one row held by a warp ---------------------------------
/// The unnormalised fast Walsh–Hadamard transform of a 32·E-element row whose elements
/// [l·E, (l+1)·E) lane l holds in y: the in-lane stages first, then the lane stages by
/// shuffles (no shared memory, no barrier). The query transforms of the attention kernels.
/// kFma: each lane stage as one FFMA, y = o + s·y with s = ±1 (the same sums and differences,
/// rounded once as the select form rounds them: bit-identical), for kernels that run it on
/// every row (vq_materialize_kernel) and are bound by issue; the attention kernels keep the
/// select form, whose register allocation their streaming loops were tuned with.
template <int E, bool kFma = false>
__device__ __forceinline__ void warp_fwht_row(float (&y)[E], int lane) {
#pragma unroll
  for (int h = 1; h < E; h <<= 1)
#pragma unroll
    for (int j = 0; j < E; ++j)
      if ((j & h) == 0) {
        const float a = y[j], c = y[j + h];
        y[j] = a + c, y[j + h] = a - c;
      }
  if constexpr (kFma) {
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) {
      const float s = (lane & m) ? -1.0f : 1.0f;
#pragma unroll
      for (int j = 0; j < E; ++j) y[j] = __fmaf_rn(s, y[j], __shfl_xor_sync(0xffffffffu, y[j], m));
    }
  } else {
#pragma unroll
    for (int m = 1; m < 32; m <<= 1)
#pragma unroll
      for (int j = 0; j < E; ++j) {
        const float o = __shfl_xor_sync(0xffffffffu, y[j], m);
        y[j] = (lane & m) ? o - y[j] : y[j] + o;
      }
  }
}

// ---- cp.async (sm_80+): global → shared without registers ------------------------------------
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- bit extraction from words realigned to the first code's bit ---------------------------
/// Code i (bits [i·B, i·B + B)) of the little-endian bit stream held in a[].
template <int B, int I, int NA>
__device__ __forceinline__ uint32_t extract_code(const uint32_t (&a)[NA]) {
  constexpr int bit = I * B, w = bit >> 5, o = bit & 31;
  constexpr uint32_t mask = (B >= 32) ? 0xFFFFFFFFu : ((1u << B) - 1u);
  if constexpr (B == 8 && (o & 7) == 0) {
    return __byte_perm(a[w], 0u, 0x4440u | uint32_t(o >> 3));
  } else if constexpr (o + B <= 32) {
    return (a[w] >> o) & mask;
  } else {
    static_assert(w + 1 < NA, "extract_code: window too small");
    return __funnelshift_r(a[w], a[w + 1], o) & mask;
  }
}

/// Words that one lane must load (from word (l·nbits)/32 on) so that, for every lane
/// l < n_lanes, the bits [l·nbits, (l+1)·nbits) lie inside.
constexpr int lane_words(int nbits, int n_lanes) {
  int m = 0;
  for (int l = 0; l < n_lanes; ++l) {
    const int first = (l * nbits) >> 5, last = (l * nbits + nbits - 1) >> 5;
    m = (last - first + 1) > m ? (last - first + 1) : m;
  }
  return m;
}
constexpr bool lanes_aligned(int nbits, int n_lanes) {
  for (int l = 0; l < n_lanes; ++l)
    if (((l * nbits) & 31) != 0) return false;
  return true;
}
// ---- thread-block clusters (sm_90): barrier and distributed shared memory ----------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// Every thread of every block of the cluster: writes before it are visible to reads after it
/// in any block of the cluster (release/acquire), shared memory included.
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/// The address of the same shared-memory byte in block `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_map(uint32_t smem_addr, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t cluster_addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_addr) : "memory");
  return v;
}
#endif

// ---- programmatic dependent launch (sm_90): a decode step's kernels ---------------------------
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the
// kernel before it on the stream still runs; grid_dep_wait() then blocks until that kernel has
// finished and its writes are visible. Such a kernel must read nothing the kernel before it
// writes, and write nothing, before its wait. grid_dep_launch_dependents() lets the next kernel,
// if it was launched so, start before this one ends (all blocks must have called it or exited).
// Without the attribute, or built for sm_80, both do nothing.
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

constexpr int ilog2(int x) { return x <= 1 ? 0 : 1 + ilog2(x >> 1); }

}  // namespace veloxquant::cuda
