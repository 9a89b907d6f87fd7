// src/cuda/attn_configs.h — which attention configurations each translation unit compiles.
// One .cu per (key spec, value spec) so the instantiations build in parallel. The default
// build (VQ_CUDA_ALL_CONFIGS off) compiles what the tests and benchmarks need: d4b8/d4b8 and
// the defaults d4b12/d8b8, head_dim 64 and 128. With VQ_CUDA_ALL_CONFIGS=ON: also d8b12/d8b12,
// d4b10/d8b12 and d8b8/d8b8, and head_dim 256 (one row tile) for every configuration.
#pragma once

#include <vector>

#include "cuda/attention_kernel.cuh"

#if defined(VQ_CUDA_ALL_CONFIGS) && VQ_CUDA_ALL_CONFIGS
#define VQ_ATTN_IF_ALL(x) x
#else
#define VQ_ATTN_IF_ALL(x)
#endif


// Per configuration: the single-row-tile kernel at head_dim 64/128 uses the variant measured
// fastest on the H200 (KT k-tiles per warp tile, W warps, PIPE cp.async stages: docs/cuda-notes.md);
// two row tiles and head_dim 256 keep 8 warps with register double buffering (they need the
// registers a 16-warp block cannot give). Every configuration comes with fp16 codebooks (F = 0),
// E4M3 codebooks (F = 1, CodebookFormat::E4M3), int8 keys (F = 2, CodebookFormat::I8) and int8
// keys and values (F = 3, CodebookFormat::I8KV).
#define VQ_ATTN_ENTRIES_F(KS, KB, VS, VB, KT1, W1, P1, F)                       \
  out.push_back(attn_entry<128, KS, KB, VS, VB, 1, KT1, 1, W1, P1, F>());       \
  out.push_back(attn_entry<128, KS, KB, VS, VB, 2, 2, 1, 8, 0, F>());           \
  out.push_back(attn_entry<64, KS, KB, VS, VB, 1, KT1, 1, W1, P1, F>());        \
  out.push_back(attn_entry<64, KS, KB, VS, VB, 2, 2, 1, 8, 0, F>());            \
  VQ_ATTN_IF_ALL(out.push_back(attn_entry<256, KS, KB, VS, VB, 1, 2, 1, 8, 0, F>());)
#define VQ_ATTN_REGISTER_T(name, KS, KB, VS, VB, KT1, W1, P1)  \
  void attn_register_##name(std::vector<AttnEntry>& out) {      \
    VQ_ATTN_ENTRIES_F(KS, KB, VS, VB, KT1, W1, P1, 0)           \
    VQ_ATTN_ENTRIES_F(KS, KB, VS, VB, KT1, W1, P1, 1)           \
    VQ_ATTN_ENTRIES_F(KS, KB, VS, VB, KT1, W1, P1, 2)           \
    VQ_ATTN_ENTRIES_F(KS, KB, VS, VB, KT1, W1, P1, 3)           \
  }
#define VQ_ATTN_REGISTER(name, KS, KB, VS, VB) VQ_ATTN_REGISTER_T(name, KS, KB, VS, VB, 1, 16, 4)
