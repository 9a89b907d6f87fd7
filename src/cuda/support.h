// src/cuda/support.h — internal: which cache configurations this build runs on a CUDA device.
// One rule serves the caches' constructors (which raise its message as UnsupportedError) and
// the public query cuda_support() (veloxquant/cuda_cache.h), so the two cannot disagree.
#pragma once

#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "veloxquant/cache.h"

namespace veloxquant::cuda {

/// A configuration's name in attn_compiled_list's form, "d4b12/d8b8@128+i8" (n_tiles left out).
/// Defined in attention.cu, beside the registry.
std::string attn_config_name(const AttnConfigKey& k);
/// The compiled configurations' names, sorted (attn_compiled_list joins them). Defined in
/// attention.cu.
const std::vector<std::string>& attn_compiled_names();
/// The UnsupportedError message for a configuration this build does not hold (planning and
/// launches raise it; cuda_support reports it). Defined in attention.cu.
std::string attn_not_compiled_message(const AttnConfigKey& k);

/// The attention kernel a cache of this kind and mode runs with `nt` row tiles: the fp16 cache
/// and the standard mode attend over fp16 rows through d4b8/d4b8's exact-window path (fp16
/// codebooks); the fused modes through their own configuration in `fmt`.
AttnConfigKey cache_attention_key(CacheKind kind, CacheMode mode, int head_dim, PQSpec keys, PQSpec values,
                                  CodebookFormat fmt, int nt);

/// Why the constructor of a CUDA cache with these parameters refuses it (UnsupportedError), or
/// an empty string: head_dim outside 64/128/256; for VecInfer, sub_dim outside 4/8 or codebooks
/// of fewer than 16 centroids, and in the fused modes an attention configuration this build does
/// not hold. (The fp16 cache and the standard mode build without their attention kernel:
/// cache_attention_missing says whether their fused_sdpa can run.)
std::string cache_unsupported(CacheKind kind, CacheMode mode, int head_dim, PQSpec keys, PQSpec values,
                              CodebookFormat fmt);

/// Why fused_sdpa / decode_step of such a cache would fail for want of a kernel, or an empty
/// string (every row-tile form the planner may pick is checked). The caches raise it before
/// planning any attention; for the fused modes it is also the constructor's refusal.
std::string cache_attention_missing(CacheKind kind, CacheMode mode, int head_dim, PQSpec keys, PQSpec values,
                                    CodebookFormat fmt);

}  // namespace veloxquant::cuda
