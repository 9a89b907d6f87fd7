// src/cuda/attn_masks.cuh — the attention kernels' one masking rule (decode and prefill), and
// the decode step's length advance that every decode kernel ends with.
#pragma once

#include <cstdint>

#include "cuda/kernels.h"

namespace veloxquant::cuda {

/// The tokens [lo, hi) that the query at position pos of an L-token sequence sees: up to itself
/// when p.causal, the last p.sliding_window of those when that is > 0.
__device__ __forceinline__ void attn_query_bounds(const AttnParams& p, int pos, int L, int& lo, int& hi) {
  lo = p.sliding_window > 0 ? int(max(int64_t(0), int64_t(pos) - p.sliding_window + 1)) : 0;
  hi = p.causal ? min(L, pos + 1) : L;
}

/// A decode step (p.advance): called by one thread of each block whose segment is done; the
/// last of the launch's segments adds n_new to every sequence's length and window count (nothing
/// when a range check of this step's, or an earlier queued, inputs failed: p.gate) and resets
/// the done counter for the next launch (graph replays).
__device__ __forceinline__ void attn_advance_lengths(const AttnParams& p) {
  __threadfence();
  const int n_seg = p.batch * p.n_kv_heads * p.n_row_chunks;
  if (atomicAdd(p.done_counter, 1) == n_seg - 1) {
    const bool gated = p.gate != nullptr && (p.gate[0] | p.gate[1]) != 0;
    for (int bb = 0; bb < p.batch && !gated; ++bb) {
      p.seq_len_rw[bb] += p.n_new;
      if (p.res_count_rw) p.res_count_rw[bb] = min(p.residual_length, p.res_count_rw[bb] + p.n_new);
    }
    *p.done_counter = 0;
    __threadfence();
  }
}

}  // namespace veloxquant::cuda
