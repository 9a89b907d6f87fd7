// src/cpu/attention_kernels.h — the building blocks of CPU decode/prefill attention, shared by
// attention_cpu (plain fp16/bf16/f32 K/V) and vecinfer_attention_cpu (codes + exact window).
//
// Work is cut into units: (batch, kv head, row block, token chunk). A row block is up to 4
// query rows of one GQA group (rows ordered query-major: row r = i·G + g, so during decode
// the 4 query heads of a group form one block and share every K/V read). A unit computes a
// *partial* softmax over its chunk — the chunk max m, the sum l = Σ exp(s − m) and the
// unnormalised o = Σ exp(s − m)·v — two-pass inside the chunk: all scores first (fp32), then
// max, exp, values. Partials of one row block are merged by log-sum-exp in a fixed order
// (so results do not depend on the thread count).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/attention_internal.h"
#include "cpu/simd_util.h"
#include "veloxquant/tensor.h"

namespace veloxquant {
class ThreadPool;
}

namespace veloxquant::detail {

constexpr int kRowBlock = 4;  // query rows sharing one pass over K/V (4 lanes of an SSE vector)

/// Up to 4 query rows of one (batch, kv head) and their visible key ranges.
struct RowBlock {
  int n_rows = 0;               ///< valid rows, 1..4 (lanes beyond hold zeros)
  int64_t row0 = 0;             ///< first row index r = i·G + g within the GQA group
  const float* q = nullptr;     ///< [4, head_dim] f32, already multiplied by the softmax scale
  const float* qt = nullptr;    ///< [4, head_dim] the same rows transformed, (q ⊙ λ)·H·scale (VecInfer)
  KeyRange range[kRowBlock]{};  ///< visible key positions per row (empty for padded lanes)
  int64_t lo = 0, hi = -1;      ///< union of the rows' ranges
};

/// A partial softmax of one row block over one chunk.
struct Partial {
  float m[kRowBlock];  ///< chunk max per row (−inf when the row saw nothing)
  float l[kRowBlock];  ///< Σ exp(s − m) per row
  float* o = nullptr;  ///< [4, head_dim] Σ exp(s − m)·v
};

/// Where token t's exact K/V rows live: linear (slot = t − pos0) or a ring
/// (slot = (first_slot + t − pos0) % n_slots). Strides in elements.
struct DenseSource {
  const void* k = nullptr;
  const void* v = nullptr;
  DType kt = DType::F16, vt = DType::F16;
  int64_t k_ts = 0, k_ds = 1;  ///< token stride, head_dim stride of keys
  int64_t v_ts = 0, v_ds = 1;
  int64_t pos0 = 0;
  int64_t n_slots = 0;  ///< 0: linear
  int64_t first_slot = 0;
  int64_t slot(int64_t t) const {
    return n_slots ? (first_slot + (t - pos0)) % n_slots : t - pos0;
  }
  /// The rows of (batch b, kv head kvh) of k and v [batch, n_kv_heads, tokens, head_dim],
  /// linear from position pos0 = 0 (set pos0 / n_slots / first_slot after for a window ring).
  static DenseSource of(const TensorView& k, const TensorView& v, int64_t b, int64_t kvh);
};

/// Scratch for one unit, grown as needed and kept per thread (the pool's threads persist, so
/// decode calls allocate nothing after the first).
struct UnitScratch {
  AlignedBuf scores;   // [chunk, 4] interleaved scores / probabilities ([chunk, 8]: two row blocks)
  AlignedBuf scores2;  // two row blocks' own [chunk, 4] scores (VecInfer)
  AlignedBuf tmp;      // a few rows of head_dim
  AlignedBuf lut;      // [n_sub, n_centroids, 4 or 8] key lookup table (VecInfer)
  AlignedBuf hist;     // [n_sub, n_centroids, 4 or 8] value weight histogram (VecInfer)
  AlignedBuf tile;     // decoded rows (VecInfer dequant paths)
  std::vector<uint16_t> idx;  // unpacked codes
};
UnitScratch& thread_scratch();

/// Partial over exact K/V tokens [t0, t1) (positions) for row block rb; head_dim D.
void dense_partial(const DenseSource& src, int64_t t0, int64_t t1, int64_t D, const RowBlock& rb,
                   UnitScratch& scratch, Partial& out);

/// The start of a unit over [t0, t1) for nb row blocks: zeroes their partials' o and sets
/// [a, b), the part of [t0, t1) any of them sees. When that is empty, marks every partial as
/// having seen nothing (m = −inf, l = 0) and returns false.
bool begin_partials(int64_t t0, int64_t t1, int64_t D, const RowBlock* const* rbs, int nb, Partial* const* outs,
                    int64_t& a, int64_t& b);

/// dense_partial for nb (<= kMaxGroupBlocks) row blocks of one (batch, kv head) whose units
/// cover the same tokens [t0, t1): each block keeps its own scores, softmax and partial, but
/// the chunk is walked in tiles of kGroupTile tokens with every block's pass over a tile back to
/// back, so K and V are read from memory once for all of them (then from L1 / L2).
constexpr int kMaxGroupBlocks = 8;
constexpr int64_t kGroupTile = 128;  // tiles of 16 to 2048 tokens measured within noise (about 5%)
void dense_partial_group(const DenseSource& src, int64_t t0, int64_t t1, int64_t D, const RowBlock* const* rbs, int nb,
                         UnitScratch& scratch, Partial* const* outs);

/// After the scores S4 [n, 4] (interleaved by row) of tokens [t0, t0+n): masks invisible
/// (token, row) pairs to −inf, computes the per-row max, replaces S4 by exp(S4 − max) and
/// fills part.m / part.l. Returns false when no row sees any token (part then says so).
bool softmax_chunk(float* S4, int64_t t0, int64_t n, const RowBlock& rb, Partial& part);

/// Merges partials[0..n) of one row block into out rows: row rr of the block goes to
/// out_row(rr) (a float pointer of dtype odt with head_dim stride ods). Rows seeing nothing
/// get zeros.
void merge_partials(const Partial* parts, int n, int n_rows, int64_t D, float* tmp,
                    void* const* out_rows, DType odt, int64_t ods);

/// The last phase of both paths: each row block's partials (units first_unit[id] ..
/// first_unit[id + 1]) merged into its rows of out [batch, n_heads, q_len, head_dim]. Row
/// blocks are ordered (batch, kv head, block), NRB blocks per (batch, kv head), G query heads
/// per kv head.
void merge_row_blocks(ThreadPool* pool, const std::vector<RowBlock>& rbs, const std::vector<int64_t>& first_unit,
                      const std::vector<Partial>& parts, int64_t Hkv, int64_t NRB, int64_t G, const TensorView& out);

/// The unit plan shared by both attention paths.
struct Unit {
  int64_t b, kvh, rb;  ///< batch, kv head, row block index within the group
  int64_t t0, t1;      ///< token chunk (positions), or the window piece
  int kind;            ///< 0: dense / coded chunk, 1: window piece (VecInfer)
};

/// Units done together: up to kMaxGroupBlocks units (u[0..n)) of row blocks of one (batch, kv
/// head) over the same tokens and of the same kind.
struct Task {
  int64_t u[kMaxGroupBlocks];
  int n = 0;
};

/// Groups units (ordered by row block, first_unit as in merge_row_blocks) into tasks: units of
/// the same (batch, kv head), kind and [t0, t1), at most max_blocks a task, largest tasks first.
std::vector<Task> group_units(const std::vector<Unit>& units, const std::vector<int64_t>& first_unit, int64_t NRB,
                              int max_blocks);

/// Visible range of every row of a GQA group: rows r = i·G + g, query i at position
/// kv_len − q_len + i.
inline KeyRange row_range(int64_t r, int64_t G, int64_t q_len, int64_t kv_len, const SdpaParams& p) {
  const int64_t i = r / G;
  return visible_range(kv_len - q_len + i, kv_len, p);
}

/// Runs fn(task, worker) on pool (inline when pool is null).
void run_tasks(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int)>& fn);

/// Phases of less work than this (element operations, roughly) run on the calling thread:
/// waking the pool's workers costs tens of microseconds on these machines (futex round trips:
/// 42% of a 256-token decode's samples under perf, 2026-12-04), more than the query setup or
/// the partials' merge of a decode step.
constexpr int64_t kInlineWork = int64_t(1) << 17;
inline ThreadPool* pool_for(ThreadPool* pool, int64_t work) { return work < kInlineWork ? nullptr : pool; }

}  // namespace veloxquant::detail
