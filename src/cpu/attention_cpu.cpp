// src/cpu/attention_cpu.cpp — optimised CPU attention over plain K/V (the fp16 baseline), and
// the unit machinery it shares with attention on codes (attention_kernels.h).
//
// Layout: q [batch, n_heads, q_len, head_dim], k/v [batch, n_kv_heads, kv_len, head_dim], any
// float dtype and strides. Work units are (batch, kv head, block of 4 query rows, chunk of
// kDenseChunk key positions); the 4 rows of a block share each K/V row read (GQA: K/V are
// never repeated). The units of up to 8 blocks of one (batch, kv head) over the same chunk
// (groups of more than 4 heads, several queries) run as one task that walks the chunk in
// tiles, every block's pass over a tile back to back (dense_partial_group), so those blocks
// too read each K/V byte from memory once. Inside a unit: scores of all chunk tokens
// (dot products of two key rows against 4 query rows, the sums reduced 4 at a time), then
// per-row max, exp and the value accumulation (up to 16 vector accumulators per pass). The
// fast kernels are written once over simd_vec.h's VecF: AVX-512 (4 rows × 64 dims a pass) or
// AVX2 + F16C (8 accumulators); elsewhere the scalar loops. Decode reads each K/V byte exactly once, so on this machine it runs
// at memory bandwidth.
#include <algorithm>
#include <cstring>
#include <limits>

#include "cpu/attention_kernels.h"
#include "cpu/simd_util.h"
#include "cpu/simd_vec.h"
#include "veloxquant/attention.h"
#include "veloxquant/cache.h"
#include "veloxquant/error.h"
#include "veloxquant/thread_pool.h"

namespace veloxquant {
namespace detail {

namespace {
constexpr int64_t kDenseChunk = 2048;  // tokens per unit: 32 KiB of scores, fine-grained balance
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

UnitScratch& thread_scratch() {
  thread_local UnitScratch s;
  return s;
}

void run_tasks(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (pool) {
    pool->parallel_for(n, fn);
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
  }
}

bool softmax_chunk(float* S4, int64_t t0, int64_t n, const RowBlock& rb, Partial& part) {
  bool full = true;
  for (int r = 0; r < kRowBlock; ++r)
    full &= rb.range[r].lo <= t0 && rb.range[r].hi >= t0 + n - 1;
  if (!full) {
    for (int r = 0; r < kRowBlock; ++r) {
      const int64_t lo = rb.range[r].lo, hi = rb.range[r].hi;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = t0 + t;
        if (pos < lo || pos > hi) S4[4 * t + r] = kNegInf;
      }
    }
  }
  float m[4] = {kNegInf, kNegInf, kNegInf, kNegInf};
  int64_t i = 0;
#if VQ_HAVE_VECF
  constexpr int L = VecF::kLanes;
  auto mv = VecF::set1(kNegInf);
  for (; i + L / 4 <= n; i += L / 4) mv = VecF::max(mv, VecF::load(S4 + 4 * i));
  float a[L];
  VecF::store(a, mv);
  for (int l = 0; l < L; ++l) m[l & 3] = std::max(m[l & 3], a[l]);
#endif
  for (; i < n; ++i)
    for (int r = 0; r < 4; ++r) m[r] = std::max(m[r], S4[4 * i + r]);
  bool any = false;
  for (int r = 0; r < 4; ++r) {
    part.m[r] = m[r];
    part.l[r] = 0.0f;
    if (m[r] == kNegInf) m[r] = 0.0f;  // every score is −inf: exp gives 0
    else any |= r < rb.n_rows;
  }
  if (!any) return false;
  exp_sub_lanes4(S4, n, m, part.l);
  return true;
}

void merge_partials(const Partial* parts, int n, int n_rows, int64_t D, float* tmp, void* const* out_rows,
                    DType odt, int64_t ods) {
  for (int r = 0; r < n_rows; ++r) {
    float M = kNegInf;
    for (int i = 0; i < n; ++i)
      if (parts[i].l[r] > 0.0f) M = std::max(M, parts[i].m[r]);
    std::fill(tmp, tmp + D, 0.0f);
    float L = 0.0f;
    if (M != kNegInf) {
      for (int i = 0; i < n; ++i) {
        if (!(parts[i].l[r] > 0.0f)) continue;
        const float w = std::exp(parts[i].m[r] - M);
        L += w * parts[i].l[r];
        const float* o = parts[i].o + r * D;
        for (int64_t d = 0; d < D; ++d) tmp[d] += w * o[d];
      }
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int64_t d = 0; d < D; ++d) store_f32(out_rows[r], odt, d * ods, tmp[d] * inv);
  }
}

void merge_row_blocks(ThreadPool* pool, const std::vector<RowBlock>& rbs, const std::vector<int64_t>& first_unit,
                      const std::vector<Partial>& parts, int64_t Hkv, int64_t NRB, int64_t G, const TensorView& out) {
  const int64_t D = out.shape[3];
  run_tasks(pool_for(pool, int64_t(parts.size() + rbs.size()) * 4 * D), int64_t(rbs.size()), [&](int64_t id, int) {
    const RowBlock& rb = rbs[size_t(id)];
    const int64_t b = id / (Hkv * NRB), kh = (id / NRB) % Hkv;
    void* rows[4];
    for (int r = 0; r < rb.n_rows; ++r) {
      const int64_t row = rb.row0 + r, i = row / G, h = kh * G + row % G;
      rows[r] = static_cast<char*>(out.data) + off4(out, b, h, i, 0) * dtype_size(out.dtype);
    }
    const int64_t u0 = first_unit[size_t(id)], u1 = first_unit[size_t(id) + 1];
    merge_partials(parts.data() + u0, int(u1 - u0), rb.n_rows, D, thread_scratch().tmp.get(size_t(D)), rows,
                   out.dtype, out.strides[3]);
  });
}

DenseSource DenseSource::of(const TensorView& k, const TensorView& v, int64_t b, int64_t kvh) {
  DenseSource src;
  src.k = static_cast<const char*>(k.data) + off4(k, b, kvh, 0, 0) * dtype_size(k.dtype);
  src.v = static_cast<const char*>(v.data) + off4(v, b, kvh, 0, 0) * dtype_size(v.dtype);
  src.kt = k.dtype;
  src.vt = v.dtype;
  src.k_ts = k.strides[2];
  src.k_ds = k.strides[3];
  src.v_ts = v.strides[2];
  src.v_ds = v.strides[3];
  return src;
}

// ---- dense partial ------------------------------------------------------------------------

namespace {

inline const char* row_ptr(const void* base, DType t, int64_t elem_off) {
  return static_cast<const char*>(base) + elem_off * dtype_size(t);
}

// Generic path: any dtype, any head_dim stride, any head_dim.
void dense_scores_generic(const DenseSource& src, int64_t a, int64_t b, int64_t D, const RowBlock& rb,
                          float* S4, float* krow) {
  for (int64_t t = a; t < b; ++t) {
    load_row_f32(row_ptr(src.k, src.kt, src.slot(t) * src.k_ts), src.kt, src.k_ds, D, krow);
    for (int r = 0; r < 4; ++r) {
      const float* q = rb.q + r * D;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t d = 0;
      for (; d + 8 <= D; d += 8)
        for (int j = 0; j < 8; ++j) acc[j] += q[d + j] * krow[d + j];
      for (; d < D; ++d) acc[0] += q[d] * krow[d];
      S4[4 * (t - a) + r] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
  }
}

void dense_values_generic(const DenseSource& src, int64_t a, int64_t b, int64_t D, const float* P4, float* o,
                          float* vrow) {
  for (int64_t t = a; t < b; ++t) {
    const float* p = P4 + 4 * (t - a);
    if (p[0] == 0.0f && p[1] == 0.0f && p[2] == 0.0f && p[3] == 0.0f) continue;
    load_row_f32(row_ptr(src.v, src.vt, src.slot(t) * src.v_ts), src.vt, src.v_ds, D, vrow);
    for (int r = 0; r < 4; ++r) {
      float* orow = o + r * D;
      const float pr = p[r];
      for (int64_t d = 0; d < D; ++d) orow[d] += pr * vrow[d];
    }
  }
}

#if VQ_HAVE_VECF
// The fast dense kernels (head_dim % V::kLanes == 0, unit head_dim stride), on VecF.
template <typename V, DType T>
void dense_scores_simd(const DenseSource& src, int64_t a, int64_t b, int64_t D, const RowBlock& rb, float* S4) {
  constexpr int L = V::kLanes;
  const int es = dtype_size(T);
  const float* q0 = rb.q;
  const float* q1 = rb.q + D;
  const float* q2 = rb.q + 2 * D;
  const float* q3 = rb.q + 3 * D;
  int64_t t = a;
  // Two tokens at a time: 8 independent FMA chains instead of 4 (one token's 4 chains, each
  // head_dim / L deep, leave the FMA pipes half idle on their latency), and each query slice
  // loaded once for both.
  for (; t + 2 <= b; t += 2) {
    const char* kp0 = static_cast<const char*>(src.k) + src.slot(t) * src.k_ts * es;
    const char* kp1 = static_cast<const char*>(src.k) + src.slot(t + 1) * src.k_ts * es;
    if (!src.n_slots) {
      const char* pf = kp0 + 16 * src.k_ts * es;
      for (int64_t off = 0; off < 2 * D * es; off += 64) _mm_prefetch(pf + off, _MM_HINT_T0);
    }
    typename V::T a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t d = 0; d < D; d += L) {
      const auto k0 = V::template load_as<T>(kp0 + d * es), k1 = V::template load_as<T>(kp1 + d * es);
      auto qv = V::load(q0 + d);
      a0 = V::fmadd(qv, k0, a0);
      b0 = V::fmadd(qv, k1, b0);
      qv = V::load(q1 + d);
      a1 = V::fmadd(qv, k0, a1);
      b1 = V::fmadd(qv, k1, b1);
      qv = V::load(q2 + d);
      a2 = V::fmadd(qv, k0, a2);
      b2 = V::fmadd(qv, k1, b2);
      qv = V::load(q3 + d);
      a3 = V::fmadd(qv, k0, a3);
      b3 = V::fmadd(qv, k1, b3);
    }
    _mm_storeu_ps(S4 + 4 * (t - a), V::hsum4(a0, a1, a2, a3));
    _mm_storeu_ps(S4 + 4 * (t + 1 - a), V::hsum4(b0, b1, b2, b3));
  }
  for (; t < b; ++t) {
    const char* kp = static_cast<const char*>(src.k) + src.slot(t) * src.k_ts * es;
    typename V::T a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D; d += L) {
      const auto kv = V::template load_as<T>(kp + d * es);
      a0 = V::fmadd(V::load(q0 + d), kv, a0);
      a1 = V::fmadd(V::load(q1 + d), kv, a1);
      a2 = V::fmadd(V::load(q2 + d), kv, a2);
      a3 = V::fmadd(V::load(q3 + d), kv, a3);
    }
    _mm_storeu_ps(S4 + 4 * (t - a), V::hsum4(a0, a1, a2, a3));
  }
}

// o[r] += Σ_t P[t][r]·V_t for the 4 rows, over sub-blocks of 32 tokens; within one, dims in
// groups of NZ vectors and rows RP at a time (RP·NZ accumulators in registers). With one group
// (NZ·L == head_dim) the first row pass streams each V row once, in order (what the hardware
// prefetcher wants); the other passes re-read the sub-block from L1.
template <typename V, DType T, int NZ, int RP>
void dense_values_rows(const DenseSource& src, int64_t a, int64_t b, int64_t D, const float* P4, float* o) {
  constexpr int L = V::kLanes;
  const int es = dtype_size(T);
  for (int64_t tb = a; tb < b; tb += 32) {
    const int64_t te = std::min(b, tb + 32);
    for (int64_t g0 = 0; g0 < D; g0 += NZ * L) {
      for (int r0 = 0; r0 < 4; r0 += RP) {
        typename V::T acc[RP][NZ];
        for (int i = 0; i < RP; ++i)
          for (int j = 0; j < NZ; ++j) acc[i][j] = V::load(o + (r0 + i) * D + g0 + L * j);
        for (int64_t t = tb; t < te; ++t) {
          const float* p = P4 + 4 * (t - a) + r0;
          const char* vp = static_cast<const char*>(src.v) + (src.slot(t) * src.v_ts + g0) * es;
          typename V::T pr[RP];
          for (int i = 0; i < RP; ++i) pr[i] = V::set1(p[i]);
          for (int j = 0; j < NZ; ++j) {
            const auto vv = V::template load_as<T>(vp + L * j * es);
            for (int i = 0; i < RP; ++i) acc[i][j] = V::fmadd(pr[i], vv, acc[i][j]);
          }
        }
        for (int i = 0; i < RP; ++i)
          for (int j = 0; j < NZ; ++j) V::store(o + (r0 + i) * D + g0 + L * j, acc[i][j]);
      }
    }
  }
}

template <typename V, DType T>
void dense_values_simd(const DenseSource& src, int64_t a, int64_t b, int64_t D, const float* P4, float* o) {
  constexpr int L = V::kLanes;
  if constexpr (V::kAcc >= 16) {  // the whole head_dim in one group where it fits 16 accumulators
    switch (D / L) {
      case 4: return dense_values_rows<V, T, 4, 4>(src, a, b, D, P4, o);
      case 5: return dense_values_rows<V, T, 5, 2>(src, a, b, D, P4, o);
      case 6: return dense_values_rows<V, T, 6, 2>(src, a, b, D, P4, o);
      case 8: return dense_values_rows<V, T, 8, 2>(src, a, b, D, P4, o);
      case 16: return dense_values_rows<V, T, 16, 1>(src, a, b, D, P4, o);
      default: break;
    }
  }
  constexpr int RP4 = V::kAcc >= 16 ? 4 : 2;  // rows a pass with 4 vectors a group
  if (D % (4 * L) == 0) return dense_values_rows<V, T, 4, RP4>(src, a, b, D, P4, o);
  if (D % (2 * L) == 0) return dense_values_rows<V, T, 2, 4>(src, a, b, D, P4, o);
  return dense_values_rows<V, T, 1, 4>(src, a, b, D, P4, o);
}
#endif

}  // namespace

bool begin_partials(int64_t t0, int64_t t1, int64_t D, const RowBlock* const* rbs, int nb, Partial* const* outs,
                    int64_t& a, int64_t& b) {
  a = t1, b = t0;
  for (int j = 0; j < nb; ++j) {
    std::fill(outs[j]->o, outs[j]->o + 4 * D, 0.0f);
    a = std::min(a, std::max(t0, rbs[j]->lo));
    b = std::max(b, std::min(t1, rbs[j]->hi + 1));
  }
  if (a < b) return true;
  for (int j = 0; j < nb; ++j)
    for (int r = 0; r < 4; ++r) outs[j]->m[r] = kNegInf, outs[j]->l[r] = 0.0f;
  return false;
}

void dense_partial(const DenseSource& src, int64_t t0, int64_t t1, int64_t D, const RowBlock& rb,
                   UnitScratch& scratch, Partial& out) {
  const RowBlock* rbs[1] = {&rb};
  Partial* outs[1] = {&out};
  dense_partial_group(src, t0, t1, D, rbs, 1, scratch, outs);
}

void dense_partial_group(const DenseSource& src, int64_t t0, int64_t t1, int64_t D, const RowBlock* const* rbs, int nb,
                         UnitScratch& scratch, Partial* const* outs) {
  int64_t a, b;
  if (!begin_partials(t0, t1, D, rbs, nb, outs, a, b)) return;
  const int64_t n = b - a, stride = 4 * n + 16;
  const int64_t tile = nb == 1 ? n : kGroupTile;
  float* S = scratch.scores.get(size_t(nb * stride));
  float* tmp = scratch.tmp.get(size_t(D));
#if VQ_HAVE_VECF
  const bool fast_k = src.k_ds == 1 && D % VecF::kLanes == 0;
  const bool fast_v = src.v_ds == 1 && D % VecF::kLanes == 0;
#else
  const bool fast_k = false, fast_v = false;
#endif
  // Pass 1: every block's scores, tile by tile (the blocks after the first read the tile's keys
  // from L1 / L2, so the chunk's keys come from memory once).
  for (int64_t ts = a; ts < b; ts += tile) {
    const int64_t te = std::min(b, ts + tile);
    for (int j = 0; j < nb; ++j) {
      float* Sj = S + j * stride + 4 * (ts - a);
      if (fast_k) {
#if VQ_HAVE_VECF
        switch (src.kt) {
          case DType::F16: dense_scores_simd<VecF, DType::F16>(src, ts, te, D, *rbs[j], Sj); break;
          case DType::BF16: dense_scores_simd<VecF, DType::BF16>(src, ts, te, D, *rbs[j], Sj); break;
          default: dense_scores_simd<VecF, DType::F32>(src, ts, te, D, *rbs[j], Sj); break;
        }
#endif
      } else {
        dense_scores_generic(src, ts, te, D, *rbs[j], Sj, tmp);
      }
    }
  }
  bool seen[kMaxGroupBlocks];
  bool any = false;
  for (int j = 0; j < nb; ++j) any |= seen[j] = softmax_chunk(S + j * stride, a, n, *rbs[j], *outs[j]);
  if (!any) return;
  // Pass 2: values, tile by tile alike.
  for (int64_t ts = a; ts < b; ts += tile) {
    const int64_t te = std::min(b, ts + tile);
    for (int j = 0; j < nb; ++j) {
      if (!seen[j]) continue;
      const float* Pj = S + j * stride + 4 * (ts - a);
      if (fast_v) {
#if VQ_HAVE_VECF
        switch (src.vt) {
          case DType::F16: dense_values_simd<VecF, DType::F16>(src, ts, te, D, Pj, outs[j]->o); break;
          case DType::BF16: dense_values_simd<VecF, DType::BF16>(src, ts, te, D, Pj, outs[j]->o); break;
          default: dense_values_simd<VecF, DType::F32>(src, ts, te, D, Pj, outs[j]->o); break;
        }
#endif
      } else {
        dense_values_generic(src, ts, te, D, Pj, outs[j]->o, tmp);
      }
    }
  }
}

std::vector<Task> group_units(const std::vector<Unit>& units, const std::vector<int64_t>& first_unit, int64_t NRB,
                              int max_blocks) {
  std::vector<Task> tasks;
  tasks.reserve(units.size());
  const int64_t n_rbs = int64_t(first_unit.size()) - 1;
  // The tasks of the current (batch, kv head) that can still take a unit: a few per chunk, so
  // a linear search (this runs every decode step; a map's allocations cost more).
  std::vector<size_t> open;
  for (int64_t id = 0; id < n_rbs; ++id) {
    if (id % NRB == 0) open.clear();  // a new (batch, kv head)
    for (int64_t u = first_unit[size_t(id)]; u < first_unit[size_t(id + 1)]; ++u) {
      const Unit& x = units[size_t(u)];
      size_t* hit = nullptr;
      for (size_t& o : open) {
        const Unit& y = units[size_t(tasks[o].u[0])];
        if (y.kind == x.kind && y.t0 == x.t0 && y.t1 == x.t1) hit = &o;
      }
      if (hit) {  // (at most one open task per key: full ones leave the list)
        Task& t = tasks[*hit];
        t.u[t.n++] = u;
        if (t.n == max_blocks) *hit = open.back(), open.pop_back();
      } else {
        Task t;
        t.u[0] = u;
        t.n = 1;
        if (max_blocks > 1) open.push_back(tasks.size());
        tasks.push_back(t);
      }
    }
  }
  // Largest first (dynamic scheduling balances the rest).
  auto work = [&](const Task& t) { return (units[size_t(t.u[0])].t1 - units[size_t(t.u[0])].t0) * t.n; };
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& x, const Task& y) { return work(x) > work(y); });
  return tasks;
}

}  // namespace detail

// ---- attention_cpu ---------------------------------------------------------------------------

void attention_cpu(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const SdpaParams& params, ThreadPool* pool) {
  using namespace detail;
  check_sdpa_params(params);
  check_attention_shapes(q, k, v, out);
  VQ_CHECK_SHAPE(q.device.is_cpu(), "attention_cpu: expected CPU tensors, got " << device_name(q.device));
  const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Lk = k.shape[2];
  VQ_CHECK_SHAPE(!params.causal || Lq <= Lk,
                 "attention: causal with q_len=" << Lq << " > kv_len=" << Lk << " (queries "
                                                 << q.shape_string() << ", keys " << k.shape_string() << ")");
  if (B == 0 || H == 0 || Lq == 0) return;
  const int64_t G = H / Hkv, R = G * Lq, NRB = (R + 3) / 4;
  const float scale = resolved_scale(params, D);

  // Query rows, scaled, f32: [batch, n_kv_heads, NRB, 4, head_dim]; row blocks alike.
  std::vector<float> qbuf(size_t(B * Hkv * NRB * 4 * D), 0.0f);
  std::vector<RowBlock> rbs(size_t(B * Hkv * NRB));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kh = 0; kh < Hkv; ++kh)
      for (int64_t blk = 0; blk < NRB; ++blk) {
        const int64_t id = (b * Hkv + kh) * NRB + blk;
        RowBlock& rb = rbs[size_t(id)];
        float* qb = qbuf.data() + id * 4 * D;
        rb.q = qb;
        rb.row0 = blk * 4;
        rb.n_rows = int(std::min<int64_t>(4, R - blk * 4));
        rb.lo = std::numeric_limits<int64_t>::max();
        rb.hi = -1;
        for (int r = 0; r < 4; ++r) {
          if (r >= rb.n_rows) {
            rb.range[r] = rb.range[0];  // padded lane: computes garbage, never written out
            continue;
          }
          const int64_t row = rb.row0 + r, i = row / G, h = kh * G + row % G;
          rb.range[r] = row_range(row, G, Lq, Lk, params);
          load_row_f32(row_ptr(q.data, q.dtype, off4(q, b, h, i, 0)), q.dtype, q.strides[3], D, qb + r * D);
          for (int64_t d = 0; d < D; ++d) qb[r * D + d] *= scale;
          if (!rb.range[r].empty()) {
            rb.lo = std::min(rb.lo, rb.range[r].lo);
            rb.hi = std::max(rb.hi, rb.range[r].hi);
          }
        }
        if (rb.hi < 0) rb.lo = 0;
      }

  // Units: chunks aligned to multiples of kDenseChunk inside each block's visible union.
  std::vector<Unit> units;
  std::vector<int64_t> first_unit(rbs.size() + 1, 0);
  for (size_t id = 0; id < rbs.size(); ++id) {
    first_unit[id] = int64_t(units.size());
    const RowBlock& rb = rbs[id];
    const int64_t b = int64_t(id) / (Hkv * NRB), kh = (int64_t(id) / NRB) % Hkv, blk = int64_t(id) % NRB;
    if (rb.hi < rb.lo) continue;
    for (int64_t c = rb.lo / kDenseChunk; c <= rb.hi / kDenseChunk; ++c)
      units.push_back({b, kh, blk, std::max(rb.lo, c * kDenseChunk), std::min(rb.hi + 1, (c + 1) * kDenseChunk), 0});
  }
  first_unit[rbs.size()] = int64_t(units.size());
  std::vector<float> obuf(units.size() * size_t(4 * D));
  std::vector<Partial> parts(units.size());
  for (size_t u = 0; u < units.size(); ++u) parts[u].o = obuf.data() + u * size_t(4 * D);

  // Tasks: the units of up to kMaxGroupBlocks row blocks of one (batch, kv head) over the same
  // chunk (GQA groups of more than 4 heads, several queries), so K/V come from memory once.
  const std::vector<Task> tasks = group_units(units, first_unit, NRB, kMaxGroupBlocks);
  run_tasks(pool, int64_t(tasks.size()), [&](int64_t k_, int) {
    const Task& tk = tasks[size_t(k_)];
    const Unit& un = units[size_t(tk.u[0])];
    const RowBlock* blocks[kMaxGroupBlocks];
    Partial* outs[kMaxGroupBlocks];
    for (int j = 0; j < tk.n; ++j) {
      const Unit& uj = units[size_t(tk.u[j])];
      blocks[j] = &rbs[size_t((uj.b * Hkv + uj.kvh) * NRB + uj.rb)];
      outs[j] = &parts[size_t(tk.u[j])];
    }
    const DenseSource src = DenseSource::of(k, v, un.b, un.kvh);
    dense_partial_group(src, un.t0, un.t1, D, blocks, tk.n, thread_scratch(), outs);
  });

  merge_row_blocks(pool, rbs, first_unit, parts, Hkv, NRB, G, out);  // rows with no unit at all get zeros
}

void attention_cpu(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const SdpaParams& params) {
  detail::check_sdpa_params(params);
  const int n = params.n_threads > 0 ? params.n_threads : default_threads();
  if (n <= 1) {
    attention_cpu(q, k, v, out, params, nullptr);
    return;
  }
  ThreadPool pool(n);
  attention_cpu(q, k, v, out, params, &pool);
}

}  // namespace veloxquant
