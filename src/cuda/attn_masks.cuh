// src/cuda/attn_masks.cuh — the attention kernels' one masking rule (decode and prefill).
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

}  // namespace veloxquant::cuda
