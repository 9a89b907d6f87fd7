// src/cuda/attention_kernel.cuh — fused attention on product-VQ codes (decode: q_len 1..16; prefill chunks: any q_len, as row chunks).
//
// What it computes. For every (batch b, kv head h, chunk of query rows) and split s, the
// online-softmax partial of
//   out[row] = Σ_j softmax_j(scale · q̃_row · K̃_j) V̂_j
// over the split's share of the history: coded tokens (K̃_j = key codebook centroids of the
// codes of token j, in the transformed space where q̃ = (q ⊙ λ)·H), then exact window tokens
// (raw q against the stored fp16/bf16 rows). The splits' partials merge by log-sum-exp:
// launched as one thread-block cluster per (b, h, chunk) (AttnParams::cluster_launch), every
// block merges a share through distributed shared memory; otherwise the last block to finish
// merges them from the workspace. With one split the block writes the output directly.
//
// Layout. codes [batch, n_kv_heads, cap, row_stride] (pq.h bit packing, rows padded to 4
// bytes); window rows [batch, n_kv_heads, win_cap, head_dim]; queries and outputs
// [batch, n_heads, q_len, head_dim] with any strides. Query rows of one kv head are
// row = qi·G + hg (G = n_heads / n_kv_heads), 8·NT rows per chunk.
//
// Why it is shaped so.
//  * One block serves all query heads of a GQA group, so every code byte leaves HBM once.
//  * Codes are never turned into a LUT: both products run on fp16 tensor cores (mma
//    m16n8k16) with centroids gathered straight into MMA fragments from shared memory.
//    Scores: Sᵀ[16 rows × 8 tokens] = q̃ · K̃ᵀ, queries as the A operand and lane (g, t)'s
//    B fragment = four key dims of token g, i.e. one gathered d4 centroid (half a d8 one)
//    exactly as it lands, with no register moves. With one row tile a single A fragment
//    serves two k-steps (rows g for the even one, rows g + 8 for the odd one, two chains).
//    Values: Oᵀ[16 dims × 8 rows] += V̂ᵀ · Pᵀ, where the score fragment (row g, tokens 2t,
//    2t + 1) is already P's B fragment: no shuffles between the two products. Kernels with one
//    row tile, several k-tiles per warp tile and E4M3 or int8 key centroids score token-major
//    instead (kTM): S[16 tokens × 8 rows] = K̃ · q̃ᵀ, the centroids of tokens g and g + 8 as the
//    A operand, half the score MMAs, P moved to its B fragment by movmatrix (runs 60-61). d8 values with
//    fp16 centroids come as V̂ᵀ's A fragments straight from `ldmatrix.x4.trans` (a 16-byte
//    centroid is one row of an 8×8 matrix); d4 centroids are paired per register by PRMT. The
//    four-row kernel with int8 values multiplies them on int8 tensor cores instead (kI8V).
//    Register pressure stays flat for 12-bit codebooks, where a LUT (4096 entries per
//    sub-vector and query row) cannot fit anyway.
//  * The per-token cost is shared-memory gathers (head_dim·2 bytes per K and per V), so the
//    codebooks are replicated across banks: lane l of a shared-memory phase reads copy
//    l mod R, each copy living in its own bank group, which makes the random gathers
//    conflict-free when R covers the phase (8-bit codebooks) and spreads them otherwise.
//    Codebook formats (template CBF = CodebookFormat): 0 fp16; 1 E4M3 (c·s, s a power of two
//    per codebook): a gather moves half the bytes (one wavefront per warp for d4 instead of
//    two) and one cvt per two elements makes the fp16 fragment; q̃ carries 1/s_k, the value
//    accumulators get 1/s_v; 2 int8 keys: the key centroids as int8 and q̃ rounded to int8 per
//    row, scores on int8 tensor cores (m16n8k32, exact int32) with the gathered int8 centroid
//    as the B fragment as it lands, then one multiply by s_q·s_k; values stay fp16.
//  * Codes stream through a per-warp ring of PIPE shared-memory stages filled by cp.async
//    (PIPE = 0: into registers one warp tile ahead with L1-bypassing loads), and L2 bulk
//    prefetches (sm_90) run a few block tiles ahead, keeping HBM busy.
//  * Every shared-memory access pattern is laid out against bank conflicts (codebook copies
//    rotated per row, padded query segments, a skewed combine stride, swizzled value-code
//    rows, padded window rows): ncu counts ~2% excess wavefronts (docs/cuda-kernels.md).
//  * Softmax state and accumulators are fp32 (scores in log2 units, exp2); P goes to fp16
//    only as an MMA operand.
#pragma once

#include <cfloat>
#include <climits>
#include <type_traits>

#include "cuda/attn_masks.cuh"
#include "cuda/cuda_util.cuh"
#include "cuda/kernels.h"

namespace veloxquant::cuda {

struct CbCopies {
  int k, v;
};
/// Replication of the two fp16 codebooks within the shared-memory budget: double whichever
/// is further from conflict-free, while both fit.
constexpr CbCopies pick_copies(int k_bytes, int k_max, int v_bytes, int v_max, int budget) {
  int rk = 1, rv = 1;
  for (;;) {
    const bool can_k = rk < k_max && 2 * rk * k_bytes + rv * v_bytes <= budget;
    const bool can_v = rv < v_max && rk * k_bytes + 2 * rv * v_bytes <= budget;
    if (!can_k && !can_v) break;
    if (can_k && (!can_v || k_max / rk >= v_max / rv)) rk *= 2;
    else rv *= 2;
  }
  return {rk, rv};
}

template <int D, int KS, int KB, int VS, int VB, int NT, int KT = 2, int MINB = 1, int W = 8, int PIPE = 0, int CBF = 0,
          int R4 = 0>
struct AttnTraits {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64/128/256");
  static_assert(KS == 4 || KS == 8, "key sub_dim 4 or 8");
  static_assert(VS == 4 || VS == 8, "value sub_dim 4 or 8");
  static_assert(NT == 1 || NT == 2, "one or two row tiles");
  static_assert(KT == 1 || KT == 2 || KT == 4, "1, 2 or 4 k-tiles of 16 tokens per warp tile");
  static constexpr int kWarps = W, kThreads = 32 * W;
  static_assert(W == 4 || W == 8 || W == 12 || W == 16, "4, 8, 12 or 16 warps");
  static constexpr int kRows = 8 * NT;
  static constexpr int kWarpTok = 16 * KT;             // KT k-tiles of 16 tokens
  static constexpr int kBlockTok = kWarps * kWarpTok;  // tokens per block iteration
  static constexpr int kPrefetchTiles = 4;             // L2 prefetch distance, block tiles
  // keys: lane t = lane & 3 owns sub-vectors [t·kKSpt, (t+1)·kKSpt)
  static constexpr int kKSubs = D / KS, kKSpt = kKSubs / 4, kKStepsPerSub = KS / 4, kKSteps = D / 16;
  static constexpr int kKBits = kKSpt * KB;
  static constexpr int kKW = lane_words(kKBits, 4);
  static constexpr int kKA = (kKBits + 31) / 32;
  static constexpr bool kKAligned = lanes_aligned(kKBits, 4);
  // values: lane g = lane >> 2 owns sub-vectors [g·kVSpt, (g+1)·kVSpt)
  static constexpr int kVSubs = D / VS, kVSpt = kVSubs / 8, kVWps = VS / 2, kMT = D / 16;
  static constexpr int kVBits = kVSpt * VB;
  static constexpr int kVW = lane_words(kVBits, 8);
  static constexpr int kVA = (kVBits + 31) / 32;
  static constexpr bool kVAligned = lanes_aligned(kVBits, 8);
  static_assert(kKSpt * 4 == kKSubs && kVSpt * 8 == kVSubs, "sub-vectors must split over lanes");
  // codebooks in shared memory, replicated over bank groups: CBF 0 fp16 keys and values, 1 E4M3
  // keys and values, 2 int8 keys (scored on int8 tensor cores against an int8 query) + fp16 values
  static_assert(CBF >= 0 && CBF <= 3, "CBF: 0 = fp16, 1 = E4M3, 2 = int8 keys + fp16 values, 3 = int8 keys and values");
  static constexpr bool kI8 = CBF == 2 || CBF == 3;  // int8 key centroids, int8 query, int8 score MMAs
  static constexpr bool kV8 = CBF == 3;  // int8 value centroids (offset binary), fp16 value MMAs (four-row: kI8V)
  static constexpr int kNK = 1 << KB, kNV = 1 << VB;
  static constexpr int kEK = KS * (CBF == 0 ? 2 : 1), kEV = VS * (CBF == 1 || CBF == 3 ? 1 : 2);  // bytes per entry
  static constexpr int kPK = 128 / kEK, kPV = 128 / kEV;  // lanes per shared-memory phase
  // code rows as laid out by the caches (pq.h packing, padded to 4 bytes)
  static constexpr int kKRow = ((D / KS * KB + 7) / 8 + 3) / 4 * 4, kVRow = ((D / VS * VB + 7) / 8 + 3) / 4 * 4;
  // PIPE > 0: each warp streams its tiles through its own ring of PIPE shared-memory stages
  // (cp.async), PIPE − 1 tiles ahead; PIPE = 0: one tile ahead in registers
  static constexpr int kStageBytes = 16 * KT * (kKRow + kVRow);
  // 32-byte value rows (d4b8): lane (g, t) reads word g of rows 2t + e (+ 8h), so rows T and
  // T + 4 (128 bytes apart) would meet in the same banks; rows with bit 2 set swap with their
  // neighbour (T ^ 1) inside the stage, which puts the four rows of a read in four bank groups.
  static constexpr bool kVSwz = kVRow == 32;
  // d8 values with fp16 centroids (CBF 0 and 2): a value centroid is one 16-byte row of an 8×8
  // fp16 matrix, so `ldmatrix.x4.trans` turns 32 gathered centroids (16 tokens × 2 sub-vectors)
  // straight into one A fragment of V̂ᵀ (rows = the two centroids' dims, k = tokens): one
  // instruction per m-tile instead of 4 gathers and 16 byte permutes per sub-vector pair. Lane
  // l supplies the address of token 8·(l >> 4) + (l & 7), sub-vector 2·mt + ((l >> 3) & 1), so
  // each lane holds one token's whole value code row (kVRowW words). Row g / g + 8 of m-tile
  // mt is then dim 16·mt + g / 16·mt + 8 + g (the "ldmatrix mapping"; the gather path's rows
  // are spread over the lanes' sub-vectors). AttnParams::value_ldsm = 0 keeps the gathers (A/B).
  static constexpr bool kLdsmV = VS == 8 && (CBF == 0 || CBF == 2);
  // d4 values without the repack (E4M3 codebooks only). The value MMA's K axis is tokens, two
  // per register, while a gathered d4 centroid holds two dims of one token per register; so
  // each MMA takes a token's word as it lands (K pair κ = one token, its two dims the pair's
  // two elements) against a B operand with P in one element of the pair and 0 in the other:
  // one MMA per element picks dims 0 and 2 (rows g, g + 8), the other dims 1 and 3. Twice the
  // value MMAs, none of the 8 PRMTs per sub-vector and 16 tokens. O's accumulators o[2i + e]
  // then hold dims 4σ + e (rows g) and 4σ + 2 + e (rows g + 8) of the lane's sub-vector
  // σ = g·kVSpt + i. Run 53 (every d4-value format through it, 26/26 cuda tests; rows whose
  // kernels did not change matched run 52's within 0.5%): E4M3 49.1 / 82.9 / 310.3 µs against
  // 51.5 / 87.1 / 328.7 (−5%: its loop is conversion-heavy, the MMAs fit), but fp16 40.2 /
  // 67.6 / 253.1 against 39.4 / 66.3 / 247.1 and int8 keys 37.8 / 63.0 / 232.3 against 37.3 /
  // 62.5 / 229.3 (+1–2%: the extra MMAs cost more than the PRMTs they save there).
  static constexpr bool kPairV = VS == 4 && CBF == 1;
  // Four query rows or fewer (a GQA group of <= 4 at q_len 1: Llama-3-8B, Mistral-7B), d4 values
  // reaching the MMA as fp16 words (fp16 and E4M3 centroids; R4 = 1, chosen by attn_launch): the
  // value MMA of kPairV without its second MMA. The chunk's 8 MMA rows hold each live row twice
  // (MMA row g is query row g / 2), so lane (g, t)'s own probabilities are those of row g / 2,
  // and the B operand's 8 columns are (row n / 2, element n & 1): column g takes P in element
  // g & 1 of each K pair and 0 in the other. One MMA per sub-vector and 8 tokens then yields O[row][dims 4σ..4σ+3] for the lane's
  // row t — a gathered centroid is (a0, a1) as it lands, no PRMT, and every accumulator is live
  // (kMTo = D/32 quads instead of D/16). The scores of the 4 duplicated rows cost what the 4
  // dead rows did.
  static constexpr bool kR4 = R4 != 0;
  static_assert(!kR4 || (NT == 1 && VS == 4),
                "the four-row kernel: one row tile, d4 values (fp16, E4M3 converted to fp16, or int8)");
  static constexpr int kMTo = kR4 ? kVSpt : kMT;  // accumulator quads per lane
  // The four-row kernel with int8 keys and values (CBF 3): P·V̂ on int8 tensor cores
  // (m16n8k32, s8 centroid · u8 probability → s32, exact), the gathered 4-byte centroid as the
  // A operand as it lands (K quad = one token's 4 dims), P in one byte of each quad of B: no
  // widening PRMTs, no all-ones offset MMA (the shared copies hold the centroids as signed
  // bytes). P goes to u8 per 32-token tile (see softmax_pv_i8), so each tile's s32 products
  // enter fp32 O by one I2F and one FFMA per accumulator.
  static constexpr bool kI8V = kR4 && CBF == 3;
  static_assert(!kI8V || kVSpt % 2 == 0, "the int8 value MMA pairs a lane's sub-vectors");
  static constexpr int kVRowW = kVRow / 4;
  static constexpr __host__ __device__ int vswz(int x) { return kVSwz ? x ^ ((x >> 2) & 32) : x; }
  // The swizzle of a value row kt·16 + 8·u + 2t + e depends on 2t + e alone (bit 2 of the row),
  // so a lane's value code words sit at one lane offset per e plus compile-time row offsets: the
  // ring reads are then LDS [lane base + immediate] (run 51: the per-address XORs cost ~35
  // instructions per 64-token warp tile).
  static constexpr bool vswz_splits() {
    for (int kt = 0; kt < 4; ++kt)
      for (int u = 0; u < 2; ++u)
        for (int r = 0; r < 8; ++r)
          if (vswz((kt * 16 + 8 * u + r) * kVRow) != (kt * 16 + 8 * u) * kVRow + vswz(r * kVRow)) return false;
    return true;
  }
  static_assert(vswz_splits(), "value-row swizzle must split into a lane part and a row part");
  static constexpr int kRingBytes = PIPE * W * kStageBytes;
  // exact window tokens a warp stages per round through its ring after the coded tokens (K and V
  // rows of D fp16); 0: the ring is too small, the window rows go through registers, and before
  // the coded tokens (AttnParams::window_first)
  static constexpr int kWinStaged = PIPE * kStageBytes >= 2 * 16 * D * 2 ? 16 : PIPE * kStageBytes >= 2 * 8 * D * 2 ? 8 : 0;
  // ... and with a ring, whose first stages are in flight while the window goes first (the
  // register-tile kernels, PIPE = 0, load their first tile only when the loop starts)
  static constexpr bool kWinFirst = kWinStaged == 0 && PIPE > 0;
  // Query buffers (fp16 q̃ and raw q): row r's quarter u, the D/4 elements lane (g, t) = (r, u)
  // reads as its MMA A fragments, is one segment of kQSegB bytes; the 16-byte pad puts the 8
  // lanes of a 128-bit shared-memory phase in 8 different bank groups (unpadded rows: 16-way).
  static constexpr int kQSegB = D / 2 + 16, kQRowB = 4 * kQSegB;
  // int8 keys: the int8 query in the same segmented layout (D/4 bytes per segment, padded), as
  // two int8 rows per query row (hi rows, then lo rows: q̃ ≈ s·(hi + lo/254)), and one score
  // scale s per row (query scale · key codebook scale)
  static constexpr int kQ8SegB = D / 4 + 16, kQ8RowB = 4 * kQ8SegB;
  static constexpr int kQ8Bytes = kI8 ? kRows * (2 * kQ8RowB + 4) : 0;
  static constexpr int kQBytes = kRows * 2 * kQRowB + kQ8Bytes + 64;  // + the merge flag
  // codebook copies fill what is left (two blocks per multiprocessor share its 227 KB)
  static constexpr int kCbBudget = (MINB == 1 ? 216 * 1024 : 105 * 1024) - kRingBytes - kQBytes;
  static constexpr CbCopies kCopies = pick_copies(kNK * kEK, kPK, kNV * kEV, kPV, kCbBudget);
  static constexpr int kRK = kCopies.k, kRV = kCopies.v;
  static constexpr int kGK = kPK / kRK, kGV = kPV / kRV;  // bank groups per copy
  static constexpr int kKcbBytes = kNK * kEK * kRK, kVcbBytes = kNV * kEV * kRV;
  static constexpr int kCbBytes = kKcbBytes + kVcbBytes;
  // block combine (aliases the codebooks once the loop is done)
  // Row stride (floats) and a skew of 2 per 32 columns: the 64-bit partial stores of a warp
  // (rows 2t + r, columns 16g + ...) then fill every bank once per phase (a bank model over
  // head_dim 64/128/256 and sub_dim 4/8 picked these; the plain D + 4 stride was 4-way).
  static constexpr int kCoStride = D == 64 ? 70 : D == 128 ? 134 : 276;
  static __device__ __forceinline__ int co_col(int d) { return d + ((d >> 5) << 1); }
  static constexpr int kCombineBytes = (kWarps * kRows * kCoStride + 2 * kWarps * kRows) * 4;
  static constexpr int kRegion = ((kCbBytes > kCombineBytes ? kCbBytes : kCombineBytes) + 15) / 16 * 16;
  // One-instruction lookups (8-bit codes, one 128-byte row of copies per entry): the key and
  // value rows interleave into 256-byte rows (keys in bytes 0..127, values in 128..255) of a
  // 64 KB region placed at a 64 KB-aligned shared-window address, so an entry's address is
  // the code byte permuted into byte 1 of the lane's base (one PRMT, no multiply-add). The
  // region follows the first window boundary past the dynamic base (0x400 on sm_80/sm_90,
  // after the 1 KB the driver reserves); the query buffers use the gap before it.
  static constexpr bool kCbFull = KB == 8 && VB == 8 && kGK == 1 && kGV == 1 && kNK == 256 && kNV == 256 &&
                                  kRK * kEK == 128 && kRV * kEV == 128;
  static constexpr bool kPrmt = MINB == 1 && kCbFull;
  // Two blocks per multiprocessor cannot place a 64 KB-aligned region (a block gets <= 113 KB):
  // the region then sits at the dynamic base itself, a lane's base is its copy offset alone
  // (< 256: bytes 1..3 zero), and the base's shared address, a compile-time constant (kDynBase,
  // checked at entry), rides in the gather's immediate offset: PRMT + LDS [r + imm] again.
  static constexpr bool kPrmtRel = MINB == 2 && kCbFull;
  static constexpr uint32_t kDynBase = 0x400;  // the dynamic shared base on sm_80/sm_90 (see kPrmt)
  static constexpr int kCbRow = kPrmt || kPrmtRel ? 256 : 128;
  static constexpr int kPrmtTail = kRingBytes > kCombineBytes - 65536 ? kRingBytes : kCombineBytes - 65536;
  static constexpr int kSmem = kPrmt ? 0xFC00 + 65536 + kPrmtTail : kRegion + kRingBytes + kQBytes;
  static_assert(kCbBytes <= kCbBudget || (kRK == 1 && kRV == 1), "codebooks do not fit");
  static_assert(!kPrmt || kQBytes <= 0xFC00, "query buffers must fit before the codebook window");
};

struct IdentityOffset {
  __device__ __forceinline__ int operator()(int x) const { return x; }
};
/// Copies `bytes` (a multiple of 4) from global src to shared dst with the lanes of a warp;
/// byte i lands at dst + at(i), for a layout map `at` that keeps 16-byte pieces whole.
template <class At = IdentityOffset>
__device__ __forceinline__ void warp_copy_async(uint32_t dst, const uint8_t* src, int bytes, int lane, At at = {}) {
  if (((reinterpret_cast<uintptr_t>(src) | dst) & 15) == 0) {
    for (int i = lane * 16; i < bytes; i += 32 * 16) cp_async16(dst + at(i), src + i);  // may round the tail up
  } else {
    for (int i = lane * 4; i < bytes; i += 32 * 4) cp_async4(dst + at(i), src + i);
  }
}

/// N 32-bit words from 16-byte aligned shared memory, as N/4 16-byte loads.
template <int N>
__device__ __forceinline__ void lds_words16(const unsigned char* src, uint32_t* w) {
  static_assert(N % 4 == 0, "whole 16-byte words");
#pragma unroll
  for (int u = 0; u < N / 4; ++u) {
    const uint4 v = reinterpret_cast<const uint4*>(src)[u];
    w[4 * u] = v.x, w[4 * u + 1] = v.y, w[4 * u + 2] = v.z, w[4 * u + 3] = v.w;
  }
}

/// Four 8×8 fp16 matrices from shared memory, transposed (ldmatrix .trans): lanes 8j..8j+7
/// give the 16-byte rows of matrix j; r[j] of lane (g, t) = rows 2t, 2t + 1 of column g. Only
/// for data that stays put once written (the codebooks): the asm does not clobber memory.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr));
}
/// An 8×8 fp16 matrix held as (row g, columns 2t, 2t + 1) per lane, transposed in registers.
__device__ __forceinline__ uint32_t movm_trans(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
/// softmax_pv's tag for value operands handed over as ready A fragments (the ldmatrix mapping).
struct VFragTag : std::false_type {};


/// Code i of a realigned little-endian stream (runtime i, constant after unrolling).
template <int B, int NA>
__device__ __forceinline__ uint32_t code_at(const uint32_t (&a)[NA], int i) {
  const int bit = i * B, w = bit >> 5, o = bit & 31;
  const uint32_t mask = (1u << B) - 1u;
  if (B == 8 && (o & 7) == 0) return __byte_perm(a[w], 0u, 0x4440u | uint32_t(o >> 3));
  if (o + B <= 32) return (a[w] >> o) & mask;
  return __funnelshift_r(a[w], a[w + 1 < NA ? w + 1 : w], o) & mask;
}

template <int NW, int NA>
__device__ __forceinline__ void realign(const uint32_t (&w)[NW], int sh, uint32_t (&a)[NA]) {
#pragma unroll
  for (int j = 0; j < NA; ++j) a[j] = __funnelshift_r(w[j], (j + 1 < NW) ? w[j + 1] : 0u, sh);
}

template <int NW>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[NW]) {
  if constexpr (NW == 4) {
    if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
      const uint4 v = ld_stream_u128(p);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
      return;
    }
  }
  if constexpr (NW == 2) {
    if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
      const uint2 v = ld_stream_u64(p);
      w[0] = v.x, w[1] = v.y;
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < NW; ++j) w[j] = ld_stream_u32(p + 4 * j);
}

/// Loads E bytes (E = 8 or 16: one fp16 centroid) as words.
template <int E>
__device__ __forceinline__ void lds_entry(const unsigned char* s, uint32_t (&w)[E / 4]) {
  if constexpr (E == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(s);
    w[0] = v.x, w[1] = v.y;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(s);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  }
}

/// Loads E bytes (8 or 16: one fp16 centroid) at a 32-bit shared-window address.
template <int E>
__device__ __forceinline__ void lds_entry_s(uint32_t a, uint32_t (&w)[E / 4]) {
  if constexpr (E == 8) {
    asm("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "r"(a));
  } else {
    asm("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(a));
  }
}

/// One softmax row once its tile's max mx (in the tile's offset units) is known: the running max
/// m, sum l and score offset mb (m where finite, else 0) move to the new max; sc is the factor
/// for l and O, d the shift that moves the tile's scores to the new offset.
__device__ __forceinline__ void raise_row_max(float mx, float& m, float& l, float& mb, float& sc, float& d) {
  const float mnew = fmaxf(m, mx + mb);
  sc = mnew == -INFINITY ? 1.0f : ex2(m - mnew);
  m = mnew;
  l *= sc;
  const float mb_new = mnew == -INFINITY ? 0.0f : mnew;
  d = mb - mb_new;
  mb = mb_new;
}

/// Two E4M3 values (the low 16 bits of x) as an f16x2 word (exact: E4M3 ⊂ fp16).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t y;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(y) : "r"(x));
  return y;
#else
  // sm_80: the byte's exponent and mantissa placed under fp16's give the value · 2^-8 (the
  // biases differ by 8; subnormals map to subnormals), then an exact multiply by 2^8
  const uint32_t u = (x & 0xFFu) | ((x & 0xFF00u) << 8);
  const uint32_t h = ((u & 0x007F007Fu) << 7) | ((u & 0x00800080u) << 8);
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&h), __halves2half2(__float2half(256.0f), __float2half(256.0f)));
  return *reinterpret_cast<const uint32_t*>(&r);
#endif
}

/// One centroid of S elements from shared memory as S/2 fp16 words (an MMA fragment): fp16
/// entries (2·S bytes) load as they are, E4M3 entries (S bytes: half the shared-memory
/// wavefronts per gather) are converted.
template <int S, int CBF>
__device__ __forceinline__ void lds_centroid(uint32_t a, uint32_t (&w)[S / 2]) {
  if constexpr (!CBF) {
    lds_entry_s<2 * S>(a, w);
  } else {
    uint32_t r[S / 4];
    if constexpr (S == 4) asm("ld.shared.u32 %0, [%1];" : "=r"(r[0]) : "r"(a));
    else asm("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
#pragma unroll
    for (int j = 0; j < S / 4; ++j) {
      w[2 * j] = e4m3x2_to_f16x2(r[j]);
      w[2 * j + 1] = e4m3x2_to_f16x2(r[j] >> 16);
    }
  }
}

/// Loads E bytes of a window row (fp16, or bf16 converted to fp16) as fp16 words; zeros where
/// !valid. Branch-free (the row address must be readable either way), so the compiler can
/// issue every load of a tile before the first use: the window is latency-bound otherwise.
template <int E, bool BF16>
__device__ __forceinline__ void ldg_row(const uint16_t* row, bool valid, uint32_t (&w)[E / 4]) {
  ldg_words(row, w);
#pragma unroll
  for (int j = 0; j < E / 4; ++j) {
    if constexpr (BF16) w[j] = bf16x2_to_f16x2(w[j]);
    w[j] = valid ? w[j] : 0u;
  }
}

template <int D, int KS, int KB, int VS, int VB, int NT, int KT = 2, int MINB = 1, int W = 8, int PIPE = 0, int CBF = 0,
          int R4 = 0>
__global__ void __launch_bounds__(32 * W, MINB) vq_attn_kernel(const AttnParams p) {
  using T = AttnTraits<D, KS, KB, VS, VB, NT, KT, MINB, W, PIPE, CBF, R4>;
  constexpr int kRows = T::kRows;
  extern __shared__ __align__(16) unsigned char smem[];
  // region: codebooks, later the block combine; ring: per-warp code stages; then the queries
  unsigned char *region = smem, *sRing = smem + T::kRegion, *sQbuf = smem + T::kRegion + T::kRingBytes;
  if constexpr (T::kPrmt) {
    const uint32_t sb = uint32_t(__cvta_generic_to_shared(smem));
    const uint32_t off = ((sb + 0xFFFFu) & ~0xFFFFu) - sb;
    region = smem + off;
    sRing = region + 65536;
    sQbuf = off >= uint32_t(T::kQBytes) ? smem : sRing + T::kPrmtTail;
    if (off + 65536u + T::kPrmtTail + (off >= uint32_t(T::kQBytes) ? 0u : uint32_t(T::kQBytes)) > uint32_t(T::kSmem))
      __trap();  // a dynamic shared base this layout was not sized for
  }
  if constexpr (T::kPrmtRel) {
    if (uint32_t(__cvta_generic_to_shared(smem)) != T::kDynBase) __trap();  // the gathers' immediate
  }
  unsigned char* const sK = region;
  unsigned char* const sV = region + (T::kPrmt || T::kPrmtRel ? 128 : T::kKcbBytes);
  unsigned char* const sQt = sQbuf;                                // [kRows] segmented rows: q̃·scale
  unsigned char* const sQr = sQt + kRows * T::kQRowB;              // [kRows] segmented rows: q·scale
  unsigned char* const sQ8 = sQr + kRows * T::kQRowB;  // int8 keys: [2·kRows] segmented int8 q̃ (hi, then lo rows)
  float* const sQs = reinterpret_cast<float*>(sQ8 + 2 * kRows * T::kQ8RowB);  // int8 keys: [kRows] score scales
  int* const sFlag = reinterpret_cast<int*>(sQr + kRows * T::kQRowB + T::kQ8Bytes);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  // the query row of MMA row g (the four-row kernel holds each live row twice, see kR4)
  constexpr bool kR4 = T::kR4;
  const int qrow = kR4 ? g >> 1 : g;
  // byte offset of element d (of E bytes) of row r in a segmented query buffer: quarter d/(D/4)
  // of the row is its segment (fp16: T::kQRowB/kQSegB; int8: kQ8RowB/kQ8SegB)
  auto q_seg_off = [](int row_b, int seg_b, int elem_b, int r, int d) {
    return r * row_b + (d / (D / 4)) * seg_b + (d % (D / 4)) * elem_b;
  };
  auto q_elem = [&](unsigned char* buf, int r, int d) -> __half* {
    return reinterpret_cast<__half*>(buf + q_seg_off(T::kQRowB, T::kQSegB, 2, r, d));
  };
  int split = blockIdx.x;
  const int S = p.n_splits;
  // diagnosis (bench --profile): clock64 at the phase boundaries, globaltimer at entry and exit
  unsigned long long* const prof =
      p.prof ? p.prof + (int64_t(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * kAttnProfSlots
             : nullptr;
  auto stamp = [&](int k) {
    if (prof && tid == 0) prof[k] = clock64();
  };
  // a stamp taken once `dep` is known (the asm's operand must be computed before it runs)
  auto stamp_after = [&](int k, int dep) {
    if (prof && tid == 0) {
      unsigned long long c;
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) : "r"(dep));
      prof[k] = c;
    }
  };
  if (prof && tid == 0) {
    unsigned long long gt;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    prof[8] = gt;
    prof[14] = sm;
  }
  stamp(0);
  // Every division below by a per-launch value goes through the host's FastDiv: a 32-bit `/` is
  // ~20 dependent instructions and a 64-bit one a ~70-instruction call, and every warp of the
  // block runs this setup (16 warps x ~800 instructions was the issue-bound part of it).
  int kvh = int(fast_div(blockIdx.y, p.div_row_chunks)), rchunk = int(blockIdx.y) - kvh * p.n_row_chunks;
  int b = blockIdx.z;
  int seg = (b * p.n_kv_heads + kvh) * p.n_row_chunks + rchunk;
  const int G = int(p.div_group.d);
  const int rows_total = G * p.q_len;
  // query row gr of the launch: query index gr / G, head kvh·G + gr % G
  auto row_qi = [&](int gr) { return int(fast_div(uint32_t(gr), p.div_group)); };

  // ---- setup loads, all issued before any is used (one memory round trip, not three) -------
  // The codebook entries this thread will replicate (none for the fp16 cache's launches).
  constexpr int kKPer = (T::kNK + T::kThreads - 1) / T::kThreads, kVPer = (T::kNV + T::kThreads - 1) / T::kThreads;
  uint32_t kreg[kKPer][T::kEK / 4], vreg[kVPer][T::kEV / 4];
  const unsigned char* const kcb = CBF ? p.k_cb8 : reinterpret_cast<const unsigned char*>(p.k_cb16);
  const unsigned char* const vcb = (CBF == 1 || CBF == 3) ? p.v_cb8 : reinterpret_cast<const unsigned char*>(p.v_cb16);
  // entry c of a codebook (n entries of E bytes) for c = tid, tid + threads, ... (clamped)
  auto load_entries = [&](auto& regs, const unsigned char* cb, auto n_tag, auto entry_tag) {
    constexpr int N = decltype(n_tag)::value, E = decltype(entry_tag)::value;
    constexpr int kPer = int(sizeof(regs) / E);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const uint32_t* src = reinterpret_cast<const uint32_t*>(cb + min(tid + i * T::kThreads, N - 1) * E);
#pragma unroll
      for (int j = 0; j < E / 4; ++j) regs[i][j] = __ldg(src + j);
    }
  };
  if (kcb && vcb) {
    load_entries(kreg, kcb, std::integral_constant<int, T::kNK>{}, std::integral_constant<int, T::kEK>{});
    load_entries(vreg, vcb, std::integral_constant<int, T::kNV>{}, std::integral_constant<int, T::kEV>{});
  }

  // This warp's query rows (warp + k·W), kQE consecutive elements per lane, raw and λ.
  constexpr int kQE = D / 32, kQRowsPerWarp = (kRows + T::kWarps - 1) / T::kWarps;
  float qx[kQRowsPerWarp][kQE], ql[kQRowsPerWarp][kQE];
#pragma unroll
  for (int k = 0; k < kQRowsPerWarp; ++k) {
    const int r = warp + k * T::kWarps, gr = rchunk * kRows + r;
    const bool live = r < kRows && gr < rows_total;
    const int qi = live ? row_qi(gr) : 0, h = kvh * G + (live ? gr - qi * G : 0);
#pragma unroll
    for (int j = 0; j < kQE; ++j) {
      const int d = lane * kQE + j;
      qx[k][j] = live ? load_f(p.q.data, p.q.dtype,
                               b * p.q.stride[0] + h * p.q.stride[1] + qi * p.q.stride[2] + d * p.q.stride[3])
                      : 0.0f;
      ql[k][j] = p.lambda ? p.lambda[kvh * D + d] : 1.0f;
    }
  }

  // ---- lengths, visibility, this block's share ---------------------------------------------
  const int len_b = p.seq_len[b], rcount_b = p.res_count ? p.res_count[b] : 0;  // loads issued, not waited on
  if constexpr (MINB >= 2)  // read back after the loop (below)
    if (tid == 0) sFlag[1] = split, sFlag[2] = b, sFlag[3] = int(blockIdx.y);
  // The host's hint (eager calls): this split's first ring stages' code tiles into L2 now, while
  // the lengths, queries and codebooks are on their way, so the first stages' copies find them
  // there. Issued after those loads (a prefetch at entry delayed them: run 72, setup +2 us),
  // and only what the first stages read; a few instructions (run 67: computing the whole
  // share for it delayed the setup more than it saved).
  if (p.hint_chunk > 0 && tid == 0) {
    const int c0h = int(min(int64_t(split) * p.hint_chunk, int64_t(p.hint_ncode)));
    const int eh = min(p.hint_ncode, c0h + (PIPE > 1 ? PIPE - 1 : 1) * T::kBlockTok);
    if (eh > c0h) {
      const int64_t bhh = int64_t(b) * p.n_kv_heads + kvh;
      prefetch_l2(p.k_codes + (bhh * p.code_cap + c0h) * p.k_row_stride, uint32_t(eh - c0h) * p.k_row_stride);
      prefetch_l2(p.v_codes + (bhh * p.code_cap + c0h) * p.v_row_stride, uint32_t(eh - c0h) * p.v_row_stride);
    }
  }
  const int L = len_b + p.n_new;
  int rc = p.win_all ? L : min(p.residual_length, rcount_b + p.n_new);
  rc = max(0, min(rc, L));
  const int n_code = L - rc;
  // bounds [lo, hi) of the visible tokens of row r of this chunk (dead rows: everything)
  auto row_bounds = [&](int r, int& lo, int& hi) {
    const int gr = rchunk * kRows + r;
    if (gr < rows_total) {
      attn_query_bounds(p, L - p.q_tail + row_qi(gr), L, lo, hi);
    } else {
      lo = 0, hi = INT_MAX;
    }
  };
  // A row's query position, and with it both of its bounds, never decreases with the row, so
  // the chunk's union [lo_u, hi_u) and intersection [lo_max, hi_min) are its first and last
  // live rows' bounds (two rows' arithmetic instead of kRows: the setup is latency-bound)
  int lo_u = INT_MAX, hi_u = 0, lo_max = 0, hi_min = INT_MAX;
  if (const int n_live = min(kRows, rows_total - rchunk * kRows); n_live > 0) {
    if (kR4 && n_live > 4) __trap();  // attn_launch picks the four-row kernel for <= 4 rows only
    row_bounds(0, lo_u, hi_min);
    row_bounds(n_live - 1, lo_max, hi_u);
  }
  int lo_t[NT], hi_t[NT];  // bounds of this lane's score rows n·8 + g (kR4: query row g / 2)
#pragma unroll
  for (int n = 0; n < NT; ++n) row_bounds(kR4 ? qrow : n * 8 + g, lo_t[n], hi_t[n]);
  // One row tile: the coded tokens' scores run token-major (kTM, see softmax_pv_t), where a lane
  // holds rows 2t and 2t + 1, for the codebook formats whose key centroids arrive word by word
  // (E4M3 through conversions, int8 as 32-bit words): an fp16 centroid's 64-bit load would be
  // split into the A quad by moves (+2%), and 32-bit loads instead cost 17-20% (runs 60-61). Not
  // with one k-tile per warp tile either (the 16-warp kernels' 128-register cap): ptxas then
  // builds the quads with moves too, and spills.
  constexpr bool kTM = NT == 1 && KT >= 2 && CBF != 0;
  [[maybe_unused]] int loT[2], hiT[2];
  if constexpr (kTM) row_bounds(kR4 ? t : 2 * t, loT[0], hiT[0]), row_bounds(kR4 ? t : 2 * t + 1, loT[1], hiT[1]);
  // The split arithmetic in 32 bits (launch_entry checks that the units fit in 31: code
  // capacity + window weight x residual length), the divisions by the host's FastDivs: the same
  // values as attn_split_chunk's 64-bit ones, which the host's hint uses.
  const int cA = max(lo_u, 0), cB = min(hi_u, n_code);
  const uint32_t Nc = uint32_t(max(0, cB - cA));
  const int wA = max(lo_u, n_code), wB = min(hi_u, L);
  const uint32_t Nw = uint32_t(max(0, wB - wA));
  const uint32_t ww = p.div_window_weight.d;
  const uint32_t units = Nc + ww * Nw;
  const uint32_t chunk = (fast_div(units + uint32_t(S - 1), p.div_splits) + 31u) & ~31u;
  const uint32_t u0 = min(units, uint32_t(split) * chunk), u1 = min(units, u0 + chunk);
  const int c0 = cA + int(min(u0, Nc)), c1 = cA + int(min(u1, Nc));
  int w0 = 0, w1 = 0;
  if (u1 > Nc) {
    const uint32_t r0 = fast_div(max(u0, Nc) - Nc + ww - 1, p.div_window_weight);
    const uint32_t r1 = min(Nw, fast_div(u1 - Nc + ww - 1, p.div_window_weight));
    w0 = wA + int(r0), w1 = wA + int(max(r0, r1));
  }
  const bool has_code = c1 > c0;
  stamp_after(10, c1 + w1);  // the lengths have arrived and the share is known
  const int64_t bh = int64_t(b) * p.n_kv_heads + kvh;
  const uint8_t* const kcodes = has_code ? p.k_codes + bh * p.code_cap * p.k_row_stride : nullptr;
  const uint8_t* const vcodes = has_code ? p.v_codes + bh * p.code_cap * p.v_row_stride : nullptr;
  if (has_code && tid == 0) {  // start HBM early: the first tiles while shared memory fills
    const int e = min(c1, c0 + T::kPrefetchTiles * T::kBlockTok);
    prefetch_l2(kcodes + int64_t(c0) * p.k_row_stride, uint32_t(e - c0) * p.k_row_stride);
    prefetch_l2(vcodes + int64_t(c0) * p.v_row_stride, uint32_t(e - c0) * p.v_row_stride);
  }
  if (w1 > w0 && !p.win_all && tid == 32) {  // the residual window rows: read last, latency-bound
    const int64_t row0 = bh * p.win_cap;
    const int n = min(w1 - w0, 1024), s0 = p.win_ring ? w0 % p.win_cap : w0;
    const int first = p.win_ring ? min(n, int(p.win_cap) - s0) : n;
    const uint16_t* kw = static_cast<const uint16_t*>(p.k_win) + row0 * D;
    const uint16_t* vw = static_cast<const uint16_t*>(p.v_win) + row0 * D;
    prefetch_l2(kw + int64_t(s0) * D, uint32_t(first) * D * 2);
    prefetch_l2(vw + int64_t(s0) * D, uint32_t(first) * D * 2);
    if (first < n) {
      prefetch_l2(kw, uint32_t(n - first) * D * 2);
      prefetch_l2(vw, uint32_t(n - first) * D * 2);
    }
  }

  // A decode step launches this kernel as a programmatic dependent of the step's kernel before
  // it (attn_launch's pdl: window rows, the encode or the rows' append), which may write code
  // rows and window rows, read from here on (the L2 prefetches above only warm L2, where those
  // writes land). What was read before this point was not written inside the step: queries
  // (the caller's), codebooks and λ (the cache's), and the lengths, which within a step only
  // this kernel's last block advances. So the launch, those loads and the split arithmetic
  // overlap that kernel; nothing before this wait writes global memory (diagnosis stamps aside).
  grid_dep_wait();
  // ---- code ring (PIPE > 0): the first stages start now, so their latency hides under the
  // query transform and the codebook copies below (the ring aliases nothing those touch).
  const uint32_t ring_s = uint32_t(__cvta_generic_to_shared(sRing + warp * (PIPE > 0 ? PIPE : 1) * T::kStageBytes));
  auto issue = [&](int j, uint32_t stage_off) {  // tile j of this warp into stage j % PIPE (at stage_off)
    const int base = c0 + warp * T::kWarpTok + j * T::kBlockTok;
    if (base < c1) {
      const int ntok = min(T::kWarpTok, c1 - base);
      const uint32_t st = ring_s + stage_off;
      const uint8_t* ks_ = kcodes + int64_t(base) * T::kKRow;
      const uint8_t* vs_ = vcodes + int64_t(base) * T::kVRow;
      constexpr int kKB = T::kWarpTok * T::kKRow, kVB = T::kWarpTok * T::kVRow;
      if (ntok == T::kWarpTok && ((reinterpret_cast<uintptr_t>(ks_) | reinterpret_cast<uintptr_t>(vs_)) & 15) == 0) {
        // the common case: a whole tile, 16-byte aligned, as a fixed run of 16-byte copies
#pragma unroll
        for (int o = 0; o < kKB; o += 512)
          if (kKB % 512 == 0 || o + lane * 16 < kKB) cp_async16(st + o + lane * 16, ks_ + o + lane * 16);
#pragma unroll
        for (int o = 0; o < kVB; o += 512)
          if (kVB % 512 == 0 || o + lane * 16 < kVB)
            cp_async16(st + 16 * KT * T::kKRow + T::vswz(o + lane * 16), vs_ + o + lane * 16);
      } else {
        warp_copy_async(st, ks_, ntok * T::kKRow, lane);
        // the value rows' swizzle (32-byte rows: 16- and 4-byte pieces stay whole)
        warp_copy_async(st + 16 * KT * T::kKRow, vs_, ntok * T::kVRow, lane, [](int x) { return T::vswz(x); });
      }
    }
    cp_async_commit();
  };
  if constexpr (PIPE > 0) {
    if (has_code)
#pragma unroll 1
      for (int j = 0; j < PIPE - 1; ++j) issue(j, uint32_t(j * T::kStageBytes));
  }
  stamp(11);

  // ---- queries: q̃ = (q ⊙ λ)·H and raw q, both times scale·log2(e), as fp16 -----------------
  // One warp per row, kQE consecutive elements per lane: the Walsh–Hadamard butterflies run in
  // registers and shuffles, with no block barrier per stage.
  {
    // E4M3 key centroids are stored times k_cb_scale: q̃ carries its inverse (a power of two)
    const float qscale = (p.use_hadamard ? p.hadamard_scale : 1.0f) * p.scale_log2 * (CBF == 1 ? p.k_cb_qmul : 1.0f);
#pragma unroll
    for (int k = 0; k < kQRowsPerWarp; ++k) {
      const int r = warp + k * T::kWarps;
      if (r < kRows) {
        float y[kQE];
#pragma unroll
        for (int j = 0; j < kQE; ++j) {
          const int d = lane * kQE + j;
          *q_elem(sQr, r, d) = __float2half_rn(qx[k][j] * p.scale_log2);
          y[j] = qx[k][j] * ql[k][j];
        }
        if (p.use_hadamard) warp_fwht_row(y, lane);
#pragma unroll
        for (int j = 0; j < kQE; ++j) *q_elem(sQt, r, lane * kQE + j) = __float2half_rn(y[j] * qscale);
        if constexpr (T::kI8) {
          // int8 q̃ as two int8s, symmetric per row: hi = rn(q̃/s), lo = rn((q̃ − hi·s)·254/s) with
          // s = max|q̃|/127, so q̃ = s·(hi + lo/254) to 1/508 of a step; a score is then
          // ((hi · key bytes) + (lo · key bytes)/254) · s · s_k, each product exact in int32.
          // With one int8 (and the centroids rounded per call, run 82) the attention error was
          // 20-40x the fp16 path's in RMS; with the pair and the int8 key grid it is about 1/100
          // of the fp16 path's in NMSE (docs/cuda-kernels.md, "Int8 keys").
          float mx = 0.0f;
#pragma unroll
          for (int j = 0; j < kQE; ++j) mx = fmaxf(mx, fabsf(y[j] * qscale));
#pragma unroll
          for (int m = 1; m < 32; m <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
          const float inv = mx > 0.0f ? 127.0f / mx : 0.0f, sq = mx * (1.0f / 127.0f);
#pragma unroll
          for (int j = 0; j < kQE; ++j) {
            const int d = lane * kQE + j;
            const float x = y[j] * qscale;
            const float hi = fminf(127.0f, fmaxf(-127.0f, rintf(x * inv)));
            const int lo = max(-127, min(127, __float2int_rn(__fmul_rn(__fsub_rn(x, __fmul_rn(hi, sq)), inv) * 254.0f)));
            sQ8[q_seg_off(T::kQ8RowB, T::kQ8SegB, 1, r, d)] = static_cast<unsigned char>(int8_t(int(hi)));
            sQ8[q_seg_off(T::kQ8RowB, T::kQ8SegB, 1, kRows + r, d)] = static_cast<unsigned char>(int8_t(lo));
          }
          if (lane == 0) sQs[r] = mx * (1.0f / 127.0f) * p.k_cb_qmul;
        }
      }
    }
  }

  stamp(12);
  // ---- codebooks into shared memory, replicated (loads issued before the query work) -------
  // Copy k of entry c sits at row c / G, bank group k·G + c mod G (G entries per 128-byte group).
  auto replicate = [&](unsigned char* base, const auto& regs, auto n_tag, auto copies_tag, auto groups_tag,
                       auto entry_tag) {
    constexpr int N = decltype(n_tag)::value, R = decltype(copies_tag)::value;
    constexpr int Gp = decltype(groups_tag)::value, E = decltype(entry_tag)::value;
    constexpr int kPer = int(sizeof(regs) / (E));
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int c = tid + i * T::kThreads;
      const int row = c / Gp, col = c % Gp;
#pragma unroll
      for (int cp = 0; cp < R; ++cp) {
        if (c >= N) break;
        // neighbouring rows start their copies at different bank groups: a warp's stores then
        // spread over the banks (the same copy for every row was a 32-way conflict)
        const int k = (cp + row) & (R - 1);
        uint32_t* dst = reinterpret_cast<uint32_t*>(base + row * T::kCbRow + (k * Gp + col) * E);
#pragma unroll
        for (int j = 0; j < E / 4; ++j) dst[j] = regs[i][j];
      }
    }
  };
  if constexpr (T::kI8V) {  // offset binary -> signed bytes (x ^ 0x80 = x - 128 as s8)
#pragma unroll
    for (int i = 0; i < kVPer; ++i)
#pragma unroll
      for (int j = 0; j < T::kEV / 4; ++j) vreg[i][j] ^= 0x80808080u;
  }
  if (has_code) {
    using std::integral_constant;
    replicate(sK, kreg, integral_constant<int, T::kNK>{}, integral_constant<int, T::kRK>{},
              integral_constant<int, T::kGK>{}, integral_constant<int, T::kEK>{});
    replicate(sV, vreg, integral_constant<int, T::kNV>{}, integral_constant<int, T::kRV>{},
              integral_constant<int, T::kGV>{}, integral_constant<int, T::kEV>{});
  }
  __syncthreads();
  stamp(1);
  if constexpr (PIPE > 1) {
    if (prof && has_code) {  // diagnosis: when this thread's part of the first code stage has landed
      cp_async_wait<PIPE - 2>();
      stamp(13);
    }
  }

  // ---- per-warp state -----------------------------------------------------------------------
  // Scores run as Sᵀ[16 rows × 8 tokens] = q̃ · K̃ᵀ: the queries are the MMA's A operand (a
  // lane's rows g and g + 8; the second row tile, or zeros), a gathered centroid is the B
  // operand as it lands (b0, b1 = one d4 centroid or half a d8 one: no register moves), and
  // the score fragment (row g, tokens 2t, 2t + 1) is already P's B fragment for O += P·V̂.
  // One row tile (NT = 1) has no rows g + 8, so one A fragment serves two k-steps: k-step 2j
  // as rows g (a0, a2) and k-step 2j + 1 as rows g + 8 (a1, a3); the two MMAs that use it
  // accumulate into separate chains, each keeping only its own rows (no zero registers, no
  // moves). Two row tiles hold both rows per k-step.
  constexpr int kQA = NT == 2 ? T::kKSteps : T::kKSteps / 2;
  static_assert(T::kKSteps % 2 == 0, "an even number of k-steps");
  uint32_t qa[kQA][4];
  // Lane (g, t) takes quarter t of row g (and of row g + 8 with two row tiles): its segment,
  // read as 16-byte words, holds every element its A fragments need.
  // The first of the two words of k-step ks in a lane's query segment: elements
  // (t·kKSpt + i)·KS + 4·part of the row are the segment's i·KS + 4·part.
  auto q_word = [](int ks) {
    const int i = ks / T::kKStepsPerSub, part = ks % T::kKStepsPerSub;
    return (i * KS + 4 * part) / 2;
  };
  auto load_qa = [&](const unsigned char* src) {
    constexpr int kW = D / 8;  // 32-bit words per segment (D/4 fp16)
    uint32_t w0[kW], w1[NT == 2 ? kW : 1];
    lds_words16<kW>(src + qrow * T::kQRowB + t * T::kQSegB, w0);
    if constexpr (NT == 2) lds_words16<kW>(src + (8 + g) * T::kQRowB + t * T::kQSegB, w1);
#pragma unroll
    for (int ks = 0; ks < T::kKSteps; ++ks) {
      const int wl = q_word(ks);
      if constexpr (NT == 2) {
        qa[ks][0] = w0[wl], qa[ks][2] = w0[wl + 1];
        qa[ks][1] = w1[wl], qa[ks][3] = w1[wl + 1];
      } else {
        qa[ks / 2][ks & 1] = w0[wl];
        qa[ks / 2][2 + (ks & 1)] = w0[wl + 1];
      }
    }
  };
  // kTM: the queries are the B operand, k-step ks's fragment (the same two words of row g) kept
  // as an aligned register pair, so the MMAs need no moves.
  [[maybe_unused]] uint32_t qb[kTM ? T::kKSteps : 1][2];
  auto load_qb = [&]() {
    constexpr int kW = D / 8;
    uint32_t w0[kW];
    lds_words16<kW>(sQt + qrow * T::kQRowB + t * T::kQSegB, w0);
#pragma unroll
    for (int ks = 0; ks < T::kKSteps; ++ks) {
      const int wl = q_word(ks);
      qb[ks][0] = w0[wl], qb[ks][1] = w0[wl + 1];
    }
  };
  // int8 keys: scores run on mma m16n8k32 (s8 · s8 → s32). K-step ks covers 32 permuted dims:
  // lane (g, t) puts the 8 dims of its sub-vectors 2ks, 2ks + 1 (d4) or ks (d8) at k = 4t..4t+3
  // and 16 + 4t..16 + 4t + 3 — the B fragment is the gathered int8 centroid(s) as they land, the
  // A fragment words 2ks, 2ks + 1 of the lane's int8 query segment. The query's lo half (see the
  // query transform) costs no MMA where the tile has a spare row or column for it: one row tile
  // in the query-major layout puts hi in rows g and lo in rows g + 8 (one A fragment per
  // k-step), the four-row kernel's duplicate columns 2t + 1 take lo; two row tiles, and
  // token-major tiles of up to 8 rows, hold a second operand set and run a second MMA (kLoSep).
  constexpr int kKSteps8 = D / 32;
  // kHiLo: a score's hi and lo dot products meet in int32 as hi·254 + lo, |.| <= 255·127²·D
  // (1.05e9 at head_dim 256), then one conversion to f32 (2^-24 relative above 2^24) and one FFMA
  static_assert(int64_t(255) * 127 * 127 * D < (int64_t(1) << 31), "hi·254 + lo must fit int32");
  constexpr bool kLoSep = T::kI8 && (NT == 2 || (kTM && !kR4));
  constexpr int kQA8 = kTM ? kKSteps8 / 2 : kKSteps8;
  [[maybe_unused]] uint32_t qa8[T::kI8 ? kQA8 : 1][4];
  [[maybe_unused]] uint32_t qa8lo[kLoSep ? kQA8 : 1][4];
  [[maybe_unused]] float qs8[NT];  // s/254 (kHiLo) of rows g (and g + 8)
  [[maybe_unused]] float qs8T[2];  // kTM: of rows 2t, 2t + 1 (kR4: both row t)
  auto load_qa8 = [&]() {
    if constexpr (T::kI8) {
      constexpr int kW = D / 16;  // 32-bit words per segment (D/4 int8)
      constexpr float kLo = 1.0f / 254.0f;
      auto seg = [&](int row8) { return sQ8 + row8 * T::kQ8RowB + t * T::kQ8SegB; };
      uint32_t w0[kW], w1[NT == 2 ? kW : 1], l0[kR4 && kTM ? 1 : kW], l1[NT == 2 ? kW : 1];
      lds_words16<kW>(seg(kR4 && kTM && (g & 1) ? kRows + qrow : qrow), w0);  // kR4 token-major: column g
      if constexpr (!(kR4 && kTM)) lds_words16<kW>(seg(kRows + qrow), l0);
      qs8[0] = sQs[qrow] * kLo;
      if constexpr (kTM) {
        qs8T[0] = sQs[kR4 ? t : 2 * t] * kLo, qs8T[1] = sQs[kR4 ? t : 2 * t + 1] * kLo;
      }
      if constexpr (NT == 2) {
        lds_words16<kW>(seg(8 + g), w1), lds_words16<kW>(seg(kRows + 8 + g), l1);
        qs8[1] = sQs[8 + g] * kLo;
      }
#pragma unroll
      for (int ks = 0; ks < kKSteps8; ++ks) {
        if constexpr (NT == 2) {
          qa8[ks][0] = w0[2 * ks], qa8[ks][2] = w0[2 * ks + 1];
          qa8[ks][1] = w1[2 * ks], qa8[ks][3] = w1[2 * ks + 1];
          qa8lo[ks][0] = l0[2 * ks], qa8lo[ks][2] = l0[2 * ks + 1];
          qa8lo[ks][1] = l1[2 * ks], qa8lo[ks][3] = l1[2 * ks + 1];
        } else if constexpr (kTM) {  // k-step ks's B fragment (words 2ks, 2ks + 1) as an aligned pair
          qa8[ks / 2][2 * (ks & 1)] = w0[2 * ks];
          qa8[ks / 2][2 * (ks & 1) + 1] = w0[2 * ks + 1];
          if constexpr (kLoSep) {
            qa8lo[ks / 2][2 * (ks & 1)] = l0[2 * ks];
            qa8lo[ks / 2][2 * (ks & 1) + 1] = l0[2 * ks + 1];
          }
        } else {  // rows g: hi, rows g + 8: lo
          qa8[ks][0] = w0[2 * ks], qa8[ks][2] = w0[2 * ks + 1];
          qa8[ks][1] = l0[2 * ks], qa8[ks][3] = l0[2 * ks + 1];
        }
      }
    }
  };
  // m, l: running max and sum of this lane's score rows n·8 + g (equal across the quad).
  // mb: the offset the scores of a tile carry, m where finite, else 0 (see softmax_pv); it
  // enters the score accumulators as their start value, so the exponentials need no subtraction.
  // o: kR4 holds row t, dims 4σ..4σ+3 of sub-vector σ = g·kVSpt + i in o[i][0] (see kR4)
  float m[NT], l[NT], mb[NT], o[T::kMTo][NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) m[n] = -INFINITY, l[n] = 0.0f, mb[n] = 0.0f;
  // kTM: the same state for rows 2t, 2t + 1 during the coded tokens (lT: this lane's tokens only)
  [[maybe_unused]] float mT[2] = {-INFINITY, -INFINITY}, lT[2] = {0.0f, 0.0f}, mbT[2] = {0.0f, 0.0f};
  // the start value of a score accumulator (row g: elements 0, 1; row g + 8: 2, 3, which
  // with one row tile hold the odd k-steps' partial sums and start at 0)
  auto score_init = [&](int e) -> float { return e < 2 ? -mb[0] : (NT == 2 ? -mb[NT - 1] : 0.0f); };
#pragma unroll
  for (int mt = 0; mt < T::kMTo; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.0f;

  const int k_off = (lane & (T::kRK - 1)) * T::kGK * T::kEK;  // this lane's codebook copy
  const int v_off = (lane & (T::kRV - 1)) * T::kGV * T::kEV;
  // 32-bit shared-window addresses: with full replication a lookup is one IMAD (c·128 + base)
  // kPrmtRel: the bases are the copy offsets within a 256-byte row, the region's address kImm
  // is added last, as a constant the gathers fold into their immediate offsets
  constexpr uint32_t kImm = T::kPrmtRel ? T::kDynBase : 0u;
  const uint32_t k_base = (T::kPrmtRel ? 0u : uint32_t(__cvta_generic_to_shared(sK))) + uint32_t(k_off);
  const uint32_t v_base = (T::kPrmtRel ? 128u : uint32_t(__cvta_generic_to_shared(sV))) + uint32_t(v_off);
  auto k_addr = [&](uint32_t c) -> uint32_t {
    if constexpr (T::kGK == 1) return c * uint32_t(T::kCbRow) + k_base + kImm;
    else return (c / T::kGK) * 128u + (c % T::kGK) * uint32_t(T::kEK) + k_base;
  };
  auto v_addr = [&](uint32_t c) -> uint32_t {
    if constexpr (T::kGV == 1) return c * uint32_t(T::kCbRow) + v_base + kImm;
    else return (c / T::kGV) * 128u + (c % T::kGV) * uint32_t(T::kEV) + v_base;
  };
  // Shared address of the entry of code i in a realigned code stream: one PRMT in kPrmt and
  // kPrmtRel mode.
  auto k_at = [&](const auto& a, int i) -> uint32_t {
    if constexpr (T::kPrmt || T::kPrmtRel) return __byte_perm(a[i >> 2], k_base, 0x7604u | (uint32_t(i & 3) << 4)) + kImm;
    else return k_addr(code_at<KB>(a, i));
  };
  auto v_at = [&](const auto& a, int i) -> uint32_t {
    if constexpr (T::kPrmt || T::kPrmtRel) return __byte_perm(a[i >> 2], v_base, 0x7604u | (uint32_t(i & 3) << 4)) + kImm;
    else return v_addr(code_at<VB>(a, i));
  };
  // The k-tile tokens whose values lane (g, t) feeds to the value MMA: 2t, 2t + 1, 2t + 8, 2t + 9.
  auto vtok = [&](int q) -> int { return 2 * t + (q & 1) + 8 * (q >> 1); };
  // kR4: the byte selectors that put P (the low or high half of a lane's pair) into element
  // g & 1 of a B operand's K pair, 0 into the other (fp16: the lower K index in the low half)
  [[maybe_unused]] const uint32_t r4_sel0 = (g & 1) ? 0x1044u : 0x4410u, r4_sel1 = (g & 1) ? 0x3244u : 0x4432u;
  // The ldmatrix mapping of the values (T::kLdsmV; the fp16 cache's launches keep the gathers'
  // mapping, their rows stream from global memory): lane l's token in a k-tile and the parity
  // of its sub-vectors. Block-uniform, so the combine below knows which mapping O is in.
  const bool nm = T::kLdsmV && p.value_ldsm && !p.win_all;
  const int lv_tok = 8 * (lane >> 4) + (lane & 7), lv_b = (lane >> 3) & 1;
  // shared addresses of the centroids this lane feeds to ldmatrix for each m-tile: code
  // 2·mt + lv_b of its token's value code row w
  auto v_addrs_ldsm = [&](const uint32_t (&w)[T::kVRowW], uint32_t (&ad)[T::kMT]) {
    if constexpr (VB == 8) {
      const uint32_t b0 = uint32_t(lv_b), b1 = uint32_t(2 + lv_b);
#pragma unroll
      for (int mt = 0; mt < T::kMT; ++mt) {
        const uint32_t byte = (mt & 1) ? b1 : b0;
        if constexpr (T::kPrmt || T::kPrmtRel) ad[mt] = __byte_perm(w[mt >> 1], v_base, 0x7604u | (byte << 4)) + kImm;
        else ad[mt] = v_addr(__byte_perm(w[mt >> 1], 0u, 0x4440u | byte));
      }
    } else {
      uint32_t a[T::kVRowW];
      realign(w, lv_b * VB, a);
#pragma unroll
      for (int mt = 0; mt < T::kMT; ++mt) ad[mt] = v_addr(code_at<VB>(a, 2 * mt));
    }
  };

  // Score MMAs of sub-vector i for token groups h < kGroups (B fragments e[h], one centroid
  // each): even k-steps accumulate into `even`, odd ones into `odd` with one row tile (they
  // run as rows g + 8 of the shared A fragment) or, with kSplit, for ILP; fold() adds them.
  using std::integral_constant;
  auto score_sub = [&](int i, const uint32_t (&e0)[KS / 2], const uint32_t (&e1)[KS / 2], float (&even)[2][4],
                       float (&odd)[2][4], auto split_tag, auto groups_tag) {
    constexpr bool kSplit = decltype(split_tag)::value;
    constexpr int kGroups = decltype(groups_tag)::value;
#pragma unroll
    for (int part = 0; part < T::kKStepsPerSub; ++part) {
      const int ks = i * T::kKStepsPerSub + part;
      const uint32_t(&q)[4] = qa[NT == 2 ? ks : ks / 2];
      float(&acc)[2][4] = ((NT == 1 || kSplit) && (ks & 1)) ? odd : even;
      mma_f16(acc[0], q[0], q[1], q[2], q[3], e0[2 * part], e0[2 * part + 1]);
      if constexpr (kGroups == 2) mma_f16(acc[1], q[0], q[1], q[2], q[3], e1[2 * part], e1[2 * part + 1]);
    }
  };
  auto fold = [&](float (&even)[2][4], const float (&odd)[2][4], auto split_tag) {
    [[maybe_unused]] constexpr bool kSplit = decltype(split_tag)::value;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (NT == 1) {  // odd k-steps ran as rows g + 8
        even[h][0] += odd[h][2], even[h][1] += odd[h][3];
      } else if constexpr (kSplit) {
#pragma unroll
        for (int e = 0; e < 4; ++e) even[h][e] += odd[h][e];
      }
    }
  };

  // Masks a tile's scores s[kt][h][2n + e] (row n·8 + g, token base + kt·16 + 8h + 2t + e)
  // against [.., end) and the rows' bounds.
  auto mask_scores = [&]<int KTs>(float (&s)[KTs][2][4], int base, int end) {
#pragma unroll
    for (int kt = 0; kt < KTs; ++kt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = base + kt * 16 + 8 * h + 2 * t + e;
#pragma unroll
          for (int n = 0; n < NT; ++n)
            if (tok >= end || tok < lo_t[n] || tok >= hi_t[n]) s[kt][h][2 * n + e] = -INFINITY;
        }
  };

  // O += P·V̂ over KTs k-tiles: bp[kt][n][h] is P's B fragment (row n·8 + g, tokens kt·16 + 8h +
  // 2t, 2t + 1 of the tile), V̂ words from vwords(kt, i, w) (see softmax_pv below).
  auto pv = [&]<int KTs>(const uint32_t (&bp)[KTs][NT][2], auto vals8_tag, auto&& vwords) {
    constexpr bool kFrag = std::is_same_v<std::decay_t<decltype(vals8_tag)>, VFragTag>;
    constexpr bool kVals8 = !kFrag && decltype(vals8_tag)::value;
    // int8 values: a value element enters the MMA as the fp16 1024 + u (u = x + 128, the offset-
    // binary byte: one PRMT puts it under fp16's exponent byte 0x64, exact), so O gains
    // Σ p·(x + 1152); o1 sums this tile's p with the same fp16 P on the same tensor cores (an
    // all-ones A operand) and the offset leaves O at the end of every tile, so the accumulators
    // never carry more than one tile's offset (carried over a split, the offset's rounding
    // in the fp32 accumulators reached NMSE 3e-4 at 16384 tokens: run 27). s_v after the loop.
    [[maybe_unused]] float o1[kVals8 ? NT : 1][4];
    if constexpr (kVals8)
#pragma unroll
      for (int n = 0; n < NT; ++n) o1[n][0] = o1[n][1] = o1[n][2] = o1[n][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < KTs; ++kt) {
      if constexpr (kFrag) {  // vwords(kt, mt, a): m-tile mt's A fragment in the ldmatrix mapping
#pragma unroll
        for (int mt = 0; mt < T::kMTo; ++mt) {
          uint32_t a[4];
          vwords(kt, mt, a);
#pragma unroll
          for (int n = 0; n < NT; ++n) mma_f16(o[mt][n], a[0], a[1], a[2], a[3], bp[kt][n][0], bp[kt][n][1]);
        }
      } else {
        constexpr uint32_t kOnes = 0x3C003C00u;  // fp16 1.0, 1.0
        if constexpr (kVals8 && !T::kR4) {
#pragma unroll
          for (int n = 0; n < NT; ++n) mma_f16(o1[n], kOnes, kOnes, kOnes, kOnes, bp[kt][n][0], bp[kt][n][1]);
        }
        if constexpr ((T::kPairV && !kVals8) || T::kR4) {
          // B operands of octet h (tokens 2t + 8h, 2t + 1 + 8h at K pairs t, t + 4) with P in
          // element e of each pair and 0 in the other (fp16: the lower K index in the low half).
          // kR4: one operand per octet, P (this lane's own pair x: row g / 2) in element g & 1 —
          // its 8 columns are (row n / 2, element n & 1), see kR4
          constexpr int kE = T::kR4 ? 1 : 2;
          uint32_t bz[NT][2][kE][2];  // [n][h][e][b0/b1]
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint32_t x = bp[kt][n][h];  // (p of token 2t + 8h, p of token 2t + 1 + 8h)
              if constexpr (T::kR4) {
                bz[n][h][0][0] = prmt(x, 0u, r4_sel0), bz[n][h][0][1] = prmt(x, 0u, r4_sel1);
              } else {
                bz[n][h][0][0] = x & 0xFFFFu, bz[n][h][0][1] = x >> 16;
                bz[n][h][kE - 1][0] = x << 16, bz[n][h][kE - 1][1] = x & 0xFFFF0000u;
              }
            }
          // kR4 with int8 values: the all-ones MMA per octet sums row t's P (every accumulator of
          // o1 then holds it: the operand's columns 2t, 2t + 1 are both row t), for the offset
          if constexpr (kVals8) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int n = 0; n < NT; ++n) mma_f16(o1[n], kOnes, kOnes, kOnes, kOnes, bz[n][h][0][0], bz[n][h][0][1]);
          }
#pragma unroll
          for (int i = 0; i < T::kVSpt; ++i) {
            uint32_t vw[4][2];  // tokens vtok(q): words (dims 0, 1) and (dims 2, 3)
            vwords(kt, i, vw);
            if constexpr (kVals8) {
              // int8 (kR4): a token's 4 offset-binary bytes become (dims 0, 1), (dims 2, 3) as fp16
              // 1024 + u, each byte under the exponent byte 0x64 (one PRMT a word, exact)
              constexpr uint32_t kExp = 0x64646464u;
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                const uint32_t w = vw[q][0];
                vw[q][0] = prmt(w, kExp, 0x4140u), vw[q][1] = prmt(w, kExp, 0x4342u);
              }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int e = 0; e < kE; ++e)
#pragma unroll
                for (int n = 0; n < NT; ++n)
                  mma_f16(o[T::kR4 ? i : 2 * i + e][n], vw[2 * h][0], vw[2 * h][1], vw[2 * h + 1][0], vw[2 * h + 1][1],
                          bz[n][h][e][0], bz[n][h][e][1]);
          }
        } else {
#pragma unroll
        for (int i = 0; i < T::kVSpt; ++i) {
          // fp16: a token's centroid as kVWps words; int8: as VS/4 words of offset-binary bytes
          uint32_t vw[4][T::kVWps];
          vwords(kt, i, vw);
#pragma unroll
          for (int j = 0; j < T::kVWps; ++j) {
            const int mt = i * T::kVWps + j;
            uint32_t a0, a1, a2, a3;
            if constexpr (kVals8) {
              // dims 2j, 2j + 1 are bytes 2(j & 1), +1 of word j / 2: interleave the two tokens'
              // bytes, then set each byte under the exponent byte 0x64 (fp16 1024 + u)
              constexpr uint32_t kExp = 0x64646464u;
              const uint32_t sel = (j & 1) ? 0x7362u : 0x5140u;
              const uint32_t y01 = prmt(vw[0][j >> 1], vw[1][j >> 1], sel), y23 = prmt(vw[2][j >> 1], vw[3][j >> 1], sel);
              a0 = prmt(y01, kExp, 0x4140u), a1 = prmt(y01, kExp, 0x4342u);
              a2 = prmt(y23, kExp, 0x4140u), a3 = prmt(y23, kExp, 0x4342u);
            } else {
              a0 = prmt(vw[0][j], vw[1][j], 0x5410u), a1 = prmt(vw[0][j], vw[1][j], 0x7632u);
              a2 = prmt(vw[2][j], vw[3][j], 0x5410u), a3 = prmt(vw[2][j], vw[3][j], 0x7632u);
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) mma_f16(o[mt][n], a0, a1, a2, a3, bp[kt][n][0], bp[kt][n][1]);
          }
        }
        }
      }
    }
    if constexpr (kVals8)
#pragma unroll
      for (int mt = 0; mt < T::kMTo; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][n][e] = fmaf(-1152.0f, o1[n][e], o[mt][n][e]);
  };

  // Online softmax over KTs k-tiles (a warp tile of codes, or one k-tile of staged window rows),
  // then O += P·V̂ with V̂ words from vwords(kt, i, w), where
  // lane (g, t) holds the value codes of tokens 2t, 2t + 1, 2t + 8, 2t + 9 of a k-tile.
  // The scores s arrive offset by −mb (the accumulators started there), mb = the running row
  // max m where finite, else 0: p = 2^s needs no subtraction.
  // Lazy rescaling: the exponentials use the running row max m as long as no score exceeds it
  // by more than kLazy (log2 units), so P <= 2^kLazy stays well inside fp16 and fp32 sums;
  // only then (always on a row's first visible tile) is the exact row max reduced across the
  // quad, O, l rescaled and the tile's scores moved to the new offset. The common path has no
  // shuffle at all: the probabilities of row g, tokens 2t, 2t + 1 are exactly the B fragment
  // the value MMA wants.
  // vals8_tag: whether vwords yields int8 centroid bytes (coded tokens with int8 values) or
  // fp16 words (fp16/E4M3 centroids, and the exact window rows in every format); VFragTag:
  // vwords(kt, mt, a) hands over m-tile mt's A fragment ready (the ldmatrix mapping).
  constexpr float kLazy = 8.0f;
  auto softmax_pv = [&]<int KTs>(float (&s)[KTs][2][4], auto vals8_tag, auto&& vwords) {
    bool need = false;
    float lm[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      lm[n] = fmaxf(fmaxf(s[0][0][2 * n], s[0][0][2 * n + 1]), fmaxf(s[0][1][2 * n], s[0][1][2 * n + 1]));
#pragma unroll
      for (int kt = 1; kt < KTs; ++kt)
        lm[n] = fmaxf(lm[n], fmaxf(fmaxf(s[kt][0][2 * n], s[kt][0][2 * n + 1]),
                                   fmaxf(s[kt][1][2 * n], s[kt][1][2 * n + 1])));
      need |= lm[n] > m[n] - mb[n] + kLazy;  // m = −∞: any finite score
    }
    if (__any_sync(0xffffffffu, need)) {
      float sc[NT];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float mx = lm[n];
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float d;  // move this tile's scores from the old offset to the new one
        raise_row_max(mx, m[n], l[n], mb[n], sc[n], d);
#pragma unroll
        for (int kt = 0; kt < KTs; ++kt)
#pragma unroll
          for (int h = 0; h < 2; ++h) s[kt][h][2 * n] += d, s[kt][h][2 * n + 1] += d;
      }
      // O's columns are the rows n·8 + 2t + r, whose scores live on lanes 4·(2t + r); kR4: the
      // lane's O is row t, whose scores live on lanes g = 2t, 2t + 1
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float s0 = __shfl_sync(0xffffffffu, sc[n], 8 * t);
        const float s1 = kR4 ? s0 : __shfl_sync(0xffffffffu, sc[n], 8 * t + 4);
#pragma unroll
        for (int mt = 0; mt < T::kMTo; ++mt) {
          if constexpr (kR4) {
            o[mt][n][0] *= s0, o[mt][n][1] *= s0;
            o[mt][n][2] *= s0, o[mt][n][3] *= s0;
          } else {
            o[mt][n][0] *= s0, o[mt][n][1] *= s1;
            o[mt][n][2] *= s0, o[mt][n][3] *= s1;
          }
        }
      }
    }
    uint32_t bp[KTs][NT][2];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int kt = 0; kt < KTs; ++kt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float p0 = ex2(s[kt][h][2 * n]), p1 = ex2(s[kt][h][2 * n + 1]);
          l[n] += p0 + p1;
          bp[kt][n][h] = pack_half2(p0, p1);
        }
    }
    pv(bp, vals8_tag, vwords);
  };

  // The coded tokens' softmax with token-major scores (one row tile, see kTM): s[kt][e] is the
  // score of token kt·16 + g + 8·(e >> 1) and row 2t + (e & 1), offset by −mbT of its row. The
  // state mT, lT, mbT is that of rows 2t, 2t + 1 (lT a partial sum over this lane's tokens),
  // which are also the rows of O's columns on this lane: rescaling O needs no shuffle. P goes
  // to the value MMA's B fragment (row g, tokens 2t, 2t + 1 | 2t + 8, 2t + 9) by one movmatrix
  // transpose per 8 tokens.
  auto softmax_pv_t = [&]<int KTs>(float (&s)[KTs][4], auto vals8_tag, auto&& vwords) {
    bool need = false;
    float lm[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lm[r] = fmaxf(s[0][r], s[0][2 + r]);
#pragma unroll
      for (int kt = 1; kt < KTs; ++kt) lm[r] = fmaxf(lm[r], fmaxf(s[kt][r], s[kt][2 + r]));
      need |= lm[r] > mT[r] - mbT[r] + kLazy;  // m = −∞: any finite score
    }
    if (__any_sync(0xffffffffu, need)) {
      float sc[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = lm[r];  // the row's tokens are spread over the 8 lanes g
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        float d;
        raise_row_max(mx, mT[r], lT[r], mbT[r], sc[r], d);
#pragma unroll
        for (int kt = 0; kt < KTs; ++kt) s[kt][r] += d, s[kt][2 + r] += d;
      }
      // (kR4: rows 2t and 2t + 1 are both query row t, the row of the lane's O)
#pragma unroll
      for (int mt = 0; mt < T::kMTo; ++mt) {
        o[mt][0][0] *= sc[0], o[mt][0][1] *= sc[kR4 ? 0 : 1];
        o[mt][0][2] *= sc[0], o[mt][0][3] *= sc[kR4 ? 0 : 1];
      }
    }
    uint32_t bp[KTs][NT][2];
#pragma unroll
    for (int kt = 0; kt < KTs; ++kt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = ex2(s[kt][2 * h]), p1 = ex2(s[kt][2 * h + 1]);
        lT[0] += p0, lT[1] += p1;
        // (token g + 8h; rows 2t, 2t + 1) transposed to (row g; tokens 8h + 2t, 8h + 2t + 1)
        bp[kt][0][h] = movm_trans(pack_half2(p0, p1));
      }
    pv(bp, vals8_tag, vwords);
  };
  // kI8V: the coded tokens' softmax (token-major, as softmax_pv_t) and P·V̂ on int8 tensor cores.
  // The value MMA (m16n8k32, s8 · u8): K quad κ is one token, its 4 bytes the 4 dims of the
  // gathered d4 centroid as it lands; A rows g and g + 8 are two of the lane's sub-vectors, j and
  // j + kVSpt/2; B column n is (query row n / 2, element sel), holding P in byte sel of each K quad
  // and 0 in the others: one MMA with sel = n & 1 yields dims 0 and 1 of both sub-vectors for the
  // lane's row t, a second with sel = 2 + (n & 1) dims 2 and 3 (the accumulators land as o[i][0]
  // of the fp16 four-row kernel: the combine is unchanged). K quads t and t + 4 are tokens 2t + 8h
  // and 2t + 1 + 8h of octet h, where movmatrix leaves P (as for the fp16 MMA).
  // P goes to u8 scaled per tile: p' = round(254 · 2^(s − tile max)), each row's largest in the
  // 32-token tile 254 (a row-wide scale would flush every token far below an attention sink to
  // zero); l sums the same rounded p', so the output is the softmax of the rounded weights. A
  // tile's s32 products enter O (fp32) by one FFMA each with 2^(tile max) / 254.
  // PRMT selectors from m = (p' of token 8h + 2t in byte 0, of token 8h + 2t + 1 in byte 2):
  // into byte sel of a word, zeros elsewhere.
  [[maybe_unused]] uint32_t i8_sel[4];
  if constexpr (T::kI8V) {
    const bool odd = g & 1;
    i8_sel[0] = odd ? 0x4404u : 0x4440u, i8_sel[1] = odd ? 0x4424u : 0x4442u;  // sel = g & 1
    i8_sel[2] = odd ? 0x0444u : 0x4044u, i8_sel[3] = odd ? 0x2444u : 0x4244u;  // sel = 2 + (g & 1)
  }
  auto softmax_pv_i8 = [&]<int KTs>(float (&s)[KTs][4], auto&& vwords) {
    // row t's scores on this lane: s[kt][0] (token g) and s[kt][2] (token g + 8); [1] and [3]
    // are their duplicates (the four-row kernel's column 2t + 1)
    float lm = fmaxf(s[0][0], s[0][2]);
#pragma unroll
    for (int kt = 1; kt < KTs; ++kt) lm = fmaxf(lm, fmaxf(s[kt][0], s[kt][2]));
    lm = fmaxf(lm, __shfl_xor_sync(0xffffffffu, lm, 4));
    lm = fmaxf(lm, __shfl_xor_sync(0xffffffffu, lm, 8));
    lm = fmaxf(lm, __shfl_xor_sync(0xffffffffu, lm, 16));
    if (__any_sync(0xffffffffu, lm > mT[0] - mbT[0] + kLazy)) {
      float sc, d;
      raise_row_max(lm, mT[0], lT[0], mbT[0], sc, d);  // (rows 2t + 1: copied after the loop)
#pragma unroll
      for (int kt = 0; kt < KTs; ++kt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[kt][e] += d;
      lm += d;
#pragma unroll
      for (int mt = 0; mt < T::kMTo; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][0][e] *= sc;
    }
    constexpr float kLog2P = 7.988684687f;  // log2(254)
    constexpr float kMagic = 12582912.0f;   // 1.5 · 2^23: x + kMagic holds round(x) in its low bits
    const bool live = lm != -INFINITY;      // lm <= kLazy here, so 254 · 2^(s − lm) <= 254
    const float c = live ? kLog2P - lm : 0.0f, u = live ? ex2(lm - kLog2P) : 0.0f;
    float tl = 0.0f;
    uint32_t pm[KTs][2];
#pragma unroll
    for (int kt = 0; kt < KTs; ++kt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t x = __float_as_uint(ex2(s[kt][2 * h] + c) + kMagic);
        tl += __uint_as_float(x) - kMagic;
        // (token g + 8h; rows 2t, 2t + 1, both row t) transposed to (row g; tokens 8h + 2t, 8h + 2t + 1)
        pm[kt][h] = movm_trans(prmt(x, 0u, 0x4040u));
      }
    lT[0] = fmaf(tl, u, lT[0]);
    constexpr int kH = T::kVSpt / 2;
    int acc[kH][2][4];  // [sub-vector pair j][dims 0-1 | 2-3][C fragment]
#pragma unroll
    for (int j = 0; j < kH; ++j)
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][x][e] = 0;
#pragma unroll
    for (int kt = 0; kt < KTs; ++kt) {
      uint32_t bz[2][4];  // [h][lo b0, lo b1, hi b0, hi b1]
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int x = 0; x < 4; ++x) bz[h][x] = prmt(pm[kt][h], 0u, i8_sel[x]);
#pragma unroll
      for (int j = 0; j < kH; ++j) {
        uint32_t va[4][T::kVWps], vb[4][T::kVWps];  // tokens vtok(q), sub-vectors j and j + kH
        vwords(kt, j, va);
        vwords(kt, j + kH, vb);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mma_s8u8(acc[j][0], va[2 * h][0], vb[2 * h][0], va[2 * h + 1][0], vb[2 * h + 1][0], bz[h][0], bz[h][1]);
          mma_s8u8(acc[j][1], va[2 * h][0], vb[2 * h][0], va[2 * h + 1][0], vb[2 * h + 1][0], bz[h][2], bz[h][3]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kH; ++j) {
      o[j][0][0] = fmaf(u, float(acc[j][0][0]), o[j][0][0]), o[j][0][1] = fmaf(u, float(acc[j][0][1]), o[j][0][1]);
      o[j][0][2] = fmaf(u, float(acc[j][1][0]), o[j][0][2]), o[j][0][3] = fmaf(u, float(acc[j][1][1]), o[j][0][3]);
      o[j + kH][0][0] = fmaf(u, float(acc[j][0][2]), o[j + kH][0][0]);
      o[j + kH][0][1] = fmaf(u, float(acc[j][0][3]), o[j + kH][0][1]);
      o[j + kH][0][2] = fmaf(u, float(acc[j][1][2]), o[j + kH][0][2]);
      o[j + kH][0][3] = fmaf(u, float(acc[j][1][3]), o[j + kH][0][3]);
    }
  };
  static_assert(!T::kI8V || kTM, "the int8 value MMA follows the token-major scores");
  // the coded tokens' softmax and P·V̂ in whichever score layout the kernel uses
  auto smx_pv = [&](auto& s, auto vals8_tag, auto&& vwords) {
    if constexpr (kTM) softmax_pv_t(s, vals8_tag, vwords);
    else softmax_pv(s, vals8_tag, vwords);
  };
  // Masks token-major scores s[kt][e] (token base + kt·16 + g + 8·(e >> 1), row 2t + (e & 1)).
  auto mask_scores_t = [&]<int KTs>(float (&s)[KTs][4], int base, int end) {
#pragma unroll
    for (int kt = 0; kt < KTs; ++kt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = base + kt * 16 + g + 8 * (e >> 1);
        // (kI8V: rows 2t and 2t + 1 are both row t; one pair of bounds held through the loop)
        const int r = T::kI8V ? 0 : (e & 1);
        if (tok >= end || tok < loT[r] || tok >= hiT[r]) s[kt][e] = -INFINITY;
      }
  };

  // ---- exact window tokens (positions [w0, w1)) ---------------------------------------------
  constexpr int kWinStaged = T::kWinStaged;
  auto window_tokens = [&](auto bf16_tag, int rot) {
    constexpr bool kBf16 = decltype(bf16_tag)::value;
    load_qa(sQr);
    const uint16_t* kwin = static_cast<const uint16_t*>(p.k_win) + bh * p.win_cap * D;
    const uint16_t* vwin = static_cast<const uint16_t*>(p.v_win) + bh * p.win_cap * D;
    auto slot = [&](int pos) -> int64_t { return p.win_ring ? int64_t(pos % p.win_cap) : int64_t(pos); };
    // The residual window (a few hundred tokens at most) is latency-bound: each warp takes
    // kWT tokens at a time, copies their K and V rows into its own (now idle) ring stages with
    // one cp.async round trip, and runs the tile from shared memory (slots >= kWT masked).
    // The fp16 cache's launches (every token in the window) stream in full register tiles.
    // Staged rows are padded by 16 bytes where that costs no tokens per round, so the quads'
    // vector reads of rows g (keys) and 2t + e (values) spread over the bank groups (unpadded:
    // 8-way conflicts); a ring too small for padded rows stages them unpadded.
    constexpr int kWT = kWinStaged;
    if constexpr (kWT > 0) {
      constexpr int kRowB = D * 2, kRing = PIPE * T::kStageBytes, kWTRaw = kWT;
      constexpr int kWTPad = kRing >= 2 * 16 * (kRowB + 16) ? 16 : kRing >= 2 * 8 * (kRowB + 16) ? 8 : 0;
      constexpr int kRowP = kWTPad == kWTRaw ? kRowB + 16 : kRowB;
      // (the ldmatrix value mapping takes the register path below: no staged-window variant of it,
      // and no d8-value kernel has a ring large enough to stage the window anyway)
      if (!p.win_all && p.window_staged && !(T::kLdsmV && nm)) {
        unsigned char* const wk = sRing + warp * PIPE * T::kStageBytes;
        unsigned char* const wv = wk + kWT * kRowP;
        const uint32_t wk_s = uint32_t(__cvta_generic_to_shared(wk)), wv_s = wk_s + kWT * kRowP;
        for (int base = w0 + warp * kWT; base < w1; base += T::kWarps * kWT) {
          const int n = min(kWT, w1 - base);
          for (int i = lane; i < n * (kRowB / 16); i += 32) {
            const int r = i / (kRowB / 16), off = (i % (kRowB / 16)) * 16;
            cp_async16(wk_s + r * kRowP + off, reinterpret_cast<const unsigned char*>(kwin + slot(base + r) * D) + off);
            cp_async16(wv_s + r * kRowP + off, reinterpret_cast<const unsigned char*>(vwin + slot(base + r) * D) + off);
          }
          cp_async_commit();
          cp_async_wait<0>();
          __syncwarp();
          auto row_words = [&](const unsigned char* rows, int sl, int d0, auto& w) {
            constexpr int NWd = int(sizeof(w) / 4);
            const unsigned char* src = rows + min(sl, n - 1) * kRowP + d0 * 2;
            uint32_t x[NWd];
            if constexpr (NWd == 4) {
              const uint4 v = *reinterpret_cast<const uint4*>(src);
              x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
            } else if constexpr (NWd == 2) {
              const uint2 v = *reinterpret_cast<const uint2*>(src);
              x[0] = v.x, x[1] = v.y;
            } else {
#pragma unroll
              for (int j = 0; j < NWd; ++j) x[j] = reinterpret_cast<const uint32_t*>(src)[j];
            }
#pragma unroll
            for (int j = 0; j < NWd; ++j) {
              if constexpr (kBf16) x[j] = bf16x2_to_f16x2(x[j]);
              w[j] = sl < n ? x[j] : 0u;
            }
          };
          // one k-tile of scores (kWT <= 16 tokens): softmax_pv runs on it alone, not on a whole
          // KT-k-tile warp tile of which all but the first would be masked (run 58, ncu: ~1400
          // instructions per warp for its 16 window tokens at 64 x 16384, 8x a coded token's)
          float s[1][2][4];
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[0][h][e] = -INFINITY;
          {
            float s0[2][4], s1[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int e = 0; e < 4; ++e) s0[h][e] = score_init(e), s1[h][e] = 0.0f;
#pragma unroll
            for (int i = 0; i < T::kKSpt; ++i) {
              const int d0 = (t * T::kKSpt + i) * KS;
              uint32_t e0[KS / 2];
              [[maybe_unused]] uint32_t e1[KS / 2];  // kWT == 16 only
              row_words(wk, g, d0, e0);
              if constexpr (kWT == 16) row_words(wk, g + 8, d0, e1);
              score_sub(i, e0, e1, s0, s1, integral_constant<bool, false>{}, integral_constant<int, kWT / 8>{});
            }
            fold(s0, s1, integral_constant<bool, false>{});
#pragma unroll
            for (int h = 0; h < kWT / 8; ++h)
#pragma unroll
              for (int e = 0; e < 2 * NT; ++e) s[0][h][e] = s0[h][e];
          }
          mask_scores(s, base, base + n);
          softmax_pv(s, std::false_type{}, [&](int kt, int i, uint32_t (&vw)[4][T::kVWps]) {
            const int d0 = (g * T::kVSpt + i) * VS;
#pragma unroll
            for (int q = 0; q < 4; ++q) row_words(wv, kt * 16 + vtok(q), d0, vw[q]);
          });
          __syncwarp();  // every lane is done with the stage before the next copy
        }
        return;
      }
    }
    // (rot: round r goes to warp (rot + r) mod W, so the window-first rounds land on the warps
    // with one code tile fewer; 0 after the coded tokens)
    const int wr = warp >= rot ? warp - rot : warp + T::kWarps - rot;
    for (int base = w0 + wr * T::kWarpTok; base < w1; base += T::kBlockTok) {
      float s[KT][2][4];
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
        float s1[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[kt][h][e] = score_init(e), s1[h][e] = 0.0f;
        const int p0 = base + kt * 16 + g, p1 = p0 + 8;
        const uint16_t* r0 = kwin + slot(min(p0, w1 - 1)) * D;
        const uint16_t* r1 = kwin + slot(min(p1, w1 - 1)) * D;
#pragma unroll
        for (int i = 0; i < T::kKSpt; ++i) {
          const int d0 = (t * T::kKSpt + i) * KS;
          uint32_t e0[KS / 2], e1[KS / 2];
          ldg_row<2 * KS, kBf16>(r0 + d0, p0 < w1, e0);
          ldg_row<2 * KS, kBf16>(r1 + d0, p1 < w1, e1);
          score_sub(i, e0, e1, s[kt], s1, integral_constant<bool, false>{}, integral_constant<int, 2>{});
        }
        fold(s[kt], s1, integral_constant<bool, false>{});
      }
      mask_scores(s, base, w1);
      auto gathers = [&](int kt, int i, uint32_t (&vw)[4][T::kVWps]) {
        const int d0 = (g * T::kVSpt + i) * VS;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int pos = base + kt * 16 + vtok(q);
          ldg_row<2 * VS, kBf16>(vwin + slot(min(pos, w1 - 1)) * D + d0, pos < w1, vw[q]);
        }
      };
      bool frag = false;
      if constexpr (T::kLdsmV) {
        frag = nm;
        if (frag) {
          // the ldmatrix mapping from global rows: lane (g, t) loads dims 2t, 2t + 1 of both
          // centroids of m-tile mt for tokens g and g + 8 (four 8×8 matrices in the row layout),
          // and movmatrix transposes each into its A-fragment register
          softmax_pv(s, VFragTag{}, [&](int kt, int mt, uint32_t (&a)[4]) {
            const int p0 = base + kt * 16 + g, p1 = p0 + 8;
            const uint16_t* r0 = vwin + slot(min(p0, w1 - 1)) * D + 16 * mt + 2 * t;
            const uint16_t* r1 = vwin + slot(min(p1, w1 - 1)) * D + 16 * mt + 2 * t;
            uint32_t x[4] = {__ldg(reinterpret_cast<const uint32_t*>(r0)), __ldg(reinterpret_cast<const uint32_t*>(r0 + 8)),
                             __ldg(reinterpret_cast<const uint32_t*>(r1)), __ldg(reinterpret_cast<const uint32_t*>(r1 + 8))};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if constexpr (kBf16) x[j] = bf16x2_to_f16x2(x[j]);
              x[j] = ((j < 2 ? p0 : p1) < w1) ? x[j] : 0u;
              a[j] = movm_trans(x[j]);
            }
          });
        }
      }
      if (!frag) softmax_pv(s, std::false_type{}, gathers);
    }
  };

  // ---- window first (AttnParams::window_first) -----------------------------------------------
  // The exact window rows through registers before the coded tokens, while the ring's first
  // stages are in flight, instead of a phase of its own after them in which every warp waits on
  // one round trip and the block's code stream stops (~3 us of a 54 us block at 64 x 16384, run
  // 65). Round r goes to warp (n_tiles + r) mod W: the warps with one code tile fewer.
  // Only kernels with a ring too small to stage the window (T::kWinFirst: the defaults' 16-token
  // warp tiles, d8 values) take it: there the window runs through registers either way, and
  // first it overlaps the setup's latency (run 125, 64 x 16384: the defaults' int8-key kernel
  // 302.5 -> 282.1 us). Where the window is staged (d4b8), the register rounds before the
  // loop were slower than the staged rounds after it (run 125: 206.5 -> 214.0 us, batch 1
  // 33.0 -> 37.8 us), and those kernels compile without this branch.
  // (their rings cannot stage the window, so window_tokens takes its register rounds)
  [[maybe_unused]] const bool win_first = T::kWinFirst && p.window_first && has_code && w1 > w0 && !p.win_all;
  if constexpr (T::kWinFirst) if (win_first) {
    const int n_tiles = int((int64_t(c1 - c0) + T::kWarpTok - 1) / T::kWarpTok);
    const int rot = n_tiles % T::kWarps;
    if (p.win_bf16) window_tokens(std::true_type{}, rot);
    else window_tokens(std::false_type{}, rot);
    if constexpr (kTM) {
      // row-g state -> the token-major state of rows 2t, 2t + 1 (kR4: row t twice): the max and
      // offset from a lane of that row, its quad-summed sum on the lanes g = 0 (the loop's sums
      // are partial per lane and meet over g after it, see the conversion there)
      float lq = l[0];
      lq += __shfl_xor_sync(0xffffffffu, lq, 1);
      lq += __shfl_xor_sync(0xffffffffu, lq, 2);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int src = 4 * (kR4 ? 2 * t : 2 * t + r);
        mT[r] = __shfl_sync(0xffffffffu, m[0], src);
        mbT[r] = __shfl_sync(0xffffffffu, mb[0], src);
        const float lr = __shfl_sync(0xffffffffu, lq, src);
        lT[r] = g == 0 ? lr : 0.0f;
      }
    }
    // E4M3 and int8 value centroids: the coded tokens' accumulators are scaled by v_cb_omul
    // after the loop, the window's part of them is exact: divide it by that scale now
    if constexpr (CBF == 1 || T::kV8) {
      const float inv = 1.0f / p.v_cb_omul;
#pragma unroll
      for (int mt = 0; mt < T::kMTo; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][n][e] *= inv;
    }
  }


  // ---- coded tokens -------------------------------------------------------------------------
  if (has_code) {
    if constexpr (T::kI8) load_qa8();
    else if constexpr (kTM) load_qb();
    else load_qa(sQt);
    const int kw0 = (t * T::kKBits) >> 5, ksh = (t * T::kKBits) & 31;
    const int vw0 = (g * T::kVBits) >> 5, vsh = (g * T::kVBits) & 31;
    const int krs = p.k_row_stride, vrs = p.v_row_stride;
    struct Tile {  // k: tokens g, g + 8 of each k-tile; v: tokens vtok(0..3); vr: token lv_tok (nm)
      uint32_t k[KT][2][T::kKW];
      uint32_t v[KT][4][T::kVW];
      uint32_t vr[KT][T::kVRowW];
    };
    // the coded tokens' loop, in the gathers' value mapping or (kNM) the ldmatrix mapping
    auto coded = [&](auto nm_tag) {
    constexpr bool kNM = decltype(nm_tag)::value;
    auto load_tile = [&](Tile& tl, int base) {
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int tok = base + kt * 16 + g + 8 * j;
          if (tok < c1) load_words<T::kKW>(kcodes + int64_t(tok) * krs + 4 * kw0, tl.k[kt][j]);
          else
#pragma unroll
            for (int w = 0; w < T::kKW; ++w) tl.k[kt][j][w] = 0;
        }
        if constexpr (kNM) {
          const int tok = base + kt * 16 + lv_tok;
          if (tok < c1) load_words<T::kVRowW>(vcodes + int64_t(tok) * vrs, tl.vr[kt]);
          else
#pragma unroll
            for (int w = 0; w < T::kVRowW; ++w) tl.vr[kt][w] = 0;
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int tok = base + kt * 16 + vtok(q);
            if (tok < c1) load_words<T::kVW>(vcodes + int64_t(tok) * vrs + 4 * vw0, tl.v[kt][q]);
            else
#pragma unroll
              for (int w = 0; w < T::kVW; ++w) tl.v[kt][q][w] = 0;
          }
        }
      }
    };
    // int8 keys: the 8 key bytes of k-step ks (32 permuted dims) of the token whose code stream
    // is a: two d4 centroids or one d8 centroid, as two words
    [[maybe_unused]] auto gather_i8 = [&](const uint32_t (&a)[T::kKA], int ks, uint32_t (&b)[2]) {
      if constexpr (KS == 4) b[0] = lds_u32(k_at(a, 2 * ks)), b[1] = lds_u32(k_at(a, 2 * ks + 1));
      else lds_entry_s<8>(k_at(a, ks), b);
    };
    // One warp tile: scores (two accumulator chains per 8 tokens for ILP), masks, softmax and
    // P·V̂, from the codes in `cur`.
    auto process = [&](const Tile& cur, int base) {
      std::conditional_t<kTM, float[KT][4], float[KT][2][4]> s;
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
        uint32_t a0[T::kKA], a1[T::kKA];  // the key code streams of tokens g and g + 8
        if constexpr (T::kKAligned) {
#pragma unroll
          for (int j = 0; j < T::kKA; ++j) a0[j] = cur.k[kt][0][j], a1[j] = cur.k[kt][1][j];
        } else {
          realign(cur.k[kt][0], ksh, a0);
          realign(cur.k[kt][1], ksh, a1);
        }
        if constexpr (kTM) {
          // token-major: the centroids of tokens g (a0, a2) and g + 8 (a1, a3) as the A operand,
          // row g of the queries as the B operand, one MMA per k-step and 16 tokens
          if constexpr (T::kI8) {
            int acc[2][4] = {};
            [[maybe_unused]] int accl[kLoSep ? 4 : 1] = {};
#pragma unroll
            for (int ks = 0; ks < kKSteps8; ++ks) {
              uint32_t b0[2], b1[2];  // tokens g and g + 8
              gather_i8(a0, ks, b0), gather_i8(a1, ks, b1);
              const uint32_t(&q)[4] = qa8[ks / 2];
              mma_s8(acc[ks & 1], b0[0], b1[0], b0[1], b1[1], q[2 * (ks & 1)], q[2 * (ks & 1) + 1]);
              if constexpr (kLoSep) {
                const uint32_t(&ql)[4] = qa8lo[ks / 2];
                mma_s8(accl, b0[0], b1[0], b0[1], b1[1], ql[2 * (ks & 1)], ql[2 * (ks & 1) + 1]);
              }
            }
            // hi·254 + lo in int32 (see kHiLo), then one conversion and one FFMA by s/254
            if constexpr (kR4) {  // columns 2t (hi) and 2t + 1 (lo) are row t: its score, twice
#pragma unroll
              for (int e = 0; e < 4; e += 2)
                s[kt][e] = s[kt][e + 1] =
                    fmaf(float((acc[0][e] + acc[1][e]) * 254 + acc[0][e + 1] + acc[1][e + 1]), qs8T[0], -mbT[0]);
            } else {
#pragma unroll
              for (int e = 0; e < 4; ++e)
                s[kt][e] = fmaf(float((acc[0][e] + acc[1][e]) * 254 + accl[e]), qs8T[e & 1], -mbT[e & 1]);
            }
          } else {
            float acc[2][4];
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[0][e] = -mbT[e & 1], acc[1][e] = 0.0f;
#pragma unroll
            for (int i = 0; i < T::kKSpt; ++i) {
              uint32_t e0[KS / 2], e1[KS / 2];
              lds_centroid<KS, CBF == 1>(k_at(a0, i), e0);
              lds_centroid<KS, CBF == 1>(k_at(a1, i), e1);
#pragma unroll
              for (int part = 0; part < T::kKStepsPerSub; ++part) {
                const int ks = i * T::kKStepsPerSub + part;
                mma_f16(acc[ks & 1], e0[2 * part], e1[2 * part], e0[2 * part + 1], e1[2 * part + 1], qb[ks][0],
                        qb[ks][1]);
              }
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) s[kt][e] = acc[0][e] + acc[1][e];
          }
        } else if constexpr (T::kI8) {
          int ev[2][4] = {}, od[2][4] = {};
          [[maybe_unused]] int lv[kLoSep ? 2 : 1][4] = {};
#pragma unroll
          for (int ks = 0; ks < kKSteps8; ++ks) {
            uint32_t b0[2], b1[2];  // tokens g and g + 8
            gather_i8(a0, ks, b0), gather_i8(a1, ks, b1);
            const uint32_t(&q)[4] = qa8[ks];
            int(&acc)[2][4] = (ks & 1) ? od : ev;
            mma_s8(acc[0], q[0], q[1], q[2], q[3], b0[0], b0[1]);
            mma_s8(acc[1], q[0], q[1], q[2], q[3], b1[0], b1[1]);
            if constexpr (kLoSep) {
              const uint32_t(&ql)[4] = qa8lo[ks];
              mma_s8(lv[0], ql[0], ql[1], ql[2], ql[3], b0[0], b0[1]);
              mma_s8(lv[1], ql[0], ql[1], ql[2], ql[3], b1[0], b1[1]);
            }
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            // exact int32 dot products combined as hi·254 + lo (kHiLo), scaled by s/254, minus
            // the rows' offsets: one conversion and one FFMA per score
            if constexpr (NT == 1) {  // lo ran as rows g + 8
              s[kt][h][0] = fmaf(float((ev[h][0] + od[h][0]) * 254 + ev[h][2] + od[h][2]), qs8[0], -mb[0]);
              s[kt][h][1] = fmaf(float((ev[h][1] + od[h][1]) * 254 + ev[h][3] + od[h][3]), qs8[0], -mb[0]);
              s[kt][h][2] = s[kt][h][3] = 0.0f;
            } else {
              s[kt][h][0] = fmaf(float((ev[h][0] + od[h][0]) * 254 + lv[h][0]), qs8[0], -mb[0]);
              s[kt][h][1] = fmaf(float((ev[h][1] + od[h][1]) * 254 + lv[h][1]), qs8[0], -mb[0]);
              s[kt][h][2] = fmaf(float((ev[h][2] + od[h][2]) * 254 + lv[h][2]), qs8[NT - 1], -mb[NT - 1]);
              s[kt][h][3] = fmaf(float((ev[h][3] + od[h][3]) * 254 + lv[h][3]), qs8[NT - 1], -mb[NT - 1]);
            }
          }
        } else {
          float s1[2][4];
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[kt][h][e] = score_init(e), s1[h][e] = 0.0f;
#pragma unroll
          for (int i = 0; i < T::kKSpt; ++i) {
            uint32_t e0[KS / 2], e1[KS / 2];
            lds_centroid<KS, CBF == 1>(k_at(a0, i), e0);
            lds_centroid<KS, CBF == 1>(k_at(a1, i), e1);
            score_sub(i, e0, e1, s[kt], s1, integral_constant<bool, true>{}, integral_constant<int, 2>{});
          }
          fold(s[kt], s1, integral_constant<bool, true>{});
        }
      }
      const bool full = base + T::kWarpTok <= c1 && base >= lo_max && base + T::kWarpTok <= hi_min;
      if (!full) {
        if constexpr (kTM) mask_scores_t(s, base, c1);
        else mask_scores(s, base, c1);
      }
      if constexpr (kNM) {
        uint32_t vad[KT][T::kMT];
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) v_addrs_ldsm(cur.vr[kt], vad[kt]);
        smx_pv(s, VFragTag{}, [&](int kt, int mt, uint32_t (&a)[4]) { ldsm_x4_trans(vad[kt][mt], a); });
        return;
      }
      auto vgather = [&](int kt, int i, uint32_t (&vw)[4][T::kVWps]) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t a[T::kVA];
          if constexpr (T::kVAligned) {
#pragma unroll
            for (int j = 0; j < T::kVA; ++j) a[j] = cur.v[kt][q][j];
          } else {
            realign(cur.v[kt][q], vsh, a);
          }
          if constexpr (T::kV8) {
            if constexpr (VS == 4) asm("ld.shared.u32 %0, [%1];" : "=r"(vw[q][0]) : "r"(v_at(a, i)));
            else asm("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(vw[q][0]), "=r"(vw[q][1]) : "r"(v_at(a, i)));
          } else {
            lds_centroid<VS, CBF == 1>(v_at(a, i), vw[q]);
          }
        }
      };
      if constexpr (T::kI8V) softmax_pv_i8(s, vgather);
      else smx_pv(s, integral_constant<bool, T::kV8>{}, vgather);
    };
    auto prefetch = [&](int base) {
      if (warp == 0 && lane == 0) {
        const int pb = base + T::kPrefetchTiles * T::kBlockTok;
        if (pb < c1) {
          const int pe = min(c1, pb + T::kBlockTok);
          prefetch_l2(kcodes + int64_t(pb) * krs, uint32_t(pe - pb) * krs);
          prefetch_l2(vcodes + int64_t(pb) * vrs, uint32_t(pe - pb) * vrs);
        }
      }
    };
    if constexpr (PIPE == 0) {
      // Two register buffers, alternated: the next tile's codes load while this one computes.
      Tile ta, tb;
      int base = c0 + warp * T::kWarpTok;
      if (base < c1) load_tile(ta, base);
      while (base < c1) {
        const int nb = base + T::kBlockTok;
        if (nb < c1) load_tile(tb, nb);
        prefetch(base);
        process(ta, base);
        base = nb;
        if (base >= c1) break;
        const int nb2 = base + T::kBlockTok;
        if (nb2 < c1) load_tile(ta, nb2);
        prefetch(base);
        process(tb, base);
        base = nb2;
      }
    } else {
      // This warp's ring: tile j lives in stage j % PIPE, issued PIPE − 1 tiles ahead.
      unsigned char* const ring = sRing + warp * PIPE * T::kStageBytes;
      // loop-invariant lane offsets inside a stage (see AttnTraits::vswz_splits)
      const int k_lane = g * T::kKRow + 4 * kw0;
      const int v_lane[2] = {16 * KT * T::kKRow + T::vswz(2 * t * T::kVRow) + 4 * vw0,
                             16 * KT * T::kKRow + T::vswz((2 * t + 1) * T::kVRow) + 4 * vw0};
      auto fill = [&](Tile& tl, int stage_off) {
        const unsigned char* st = ring + stage_off;
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const uint32_t* w = reinterpret_cast<const uint32_t*>(st + k_lane + (kt * 16 + 8 * jj) * T::kKRow);
            if constexpr (T::kKW == 2 && T::kKBits % 64 == 0 && T::kKRow % 8 == 0) {
              const uint2 v = *reinterpret_cast<const uint2*>(w);
              tl.k[kt][jj][0] = v.x, tl.k[kt][jj][1] = v.y;
            } else {
#pragma unroll
              for (int x = 0; x < T::kKW; ++x) tl.k[kt][jj][x] = w[x];
            }
          }
          if constexpr (kNM) {  // the whole row of token lv_tok
            const unsigned char* r = st + 16 * KT * T::kKRow + T::vswz((kt * 16 + lv_tok) * T::kVRow);
            if constexpr (T::kVRow % 16 == 0) {
              lds_words16<T::kVRowW>(r, tl.vr[kt]);
            } else if constexpr (T::kVRow % 8 == 0) {
#pragma unroll
              for (int x = 0; x < T::kVRowW; x += 2) {
                const uint2 v = reinterpret_cast<const uint2*>(r)[x / 2];
                tl.vr[kt][x] = v.x, tl.vr[kt][x + 1] = v.y;
              }
            } else {
#pragma unroll
              for (int x = 0; x < T::kVRowW; ++x) tl.vr[kt][x] = reinterpret_cast<const uint32_t*>(r)[x];
            }
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              // token vtok(q) = 2t + (q & 1) + 8·(q >> 1) of k-tile kt
              const uint32_t* w = reinterpret_cast<const uint32_t*>(st + v_lane[q & 1] + (kt * 16 + 8 * (q >> 1)) * T::kVRow);
#pragma unroll
              for (int x = 0; x < T::kVW; ++x) tl.v[kt][q][x] = w[x];
            }
          }
        }
      };
      // (the first PIPE − 1 stages were issued before the setup work)
      // stage offsets carried from tile to tile: tile j reads stage j % PIPE while tile
      // j + PIPE − 1 goes into stage (j − 1) % PIPE, the one read by the tile before
      constexpr int kRingEnd = PIPE * T::kStageBytes;
      int st_read = 0, st_fill = (PIPE - 1) * T::kStageBytes;
#pragma unroll 1
      for (int j = 0;; ++j) {
        const int base = c0 + warp * T::kWarpTok + j * T::kBlockTok;
        if (base >= c1) break;
        issue(j + PIPE - 1, uint32_t(st_fill));
        cp_async_wait<PIPE - 1>();
        __syncwarp();
        Tile cur;
        fill(cur, st_read);
        prefetch(base);
        process(cur, base);
        __syncwarp();  // every lane is done with stage j % PIPE before it is refilled
        st_fill = st_read;
        st_read = st_read + T::kStageBytes == kRingEnd ? 0 : st_read + T::kStageBytes;
      }
      cp_async_wait<0>();
    }
    };
    if constexpr (T::kLdsmV) {
      if (nm) coded(std::true_type{});
      else coded(std::false_type{});
    } else {
      coded(std::false_type{});
    }
    if constexpr (T::kI8V) mT[1] = mT[0], lT[1] = lT[0], mbT[1] = mbT[0];  // row t's state, twice
    if constexpr (kTM) {
      // back to the row-g state of the window tokens and the combine: row g's max and offset
      // from a lane with t = g / 2; its sum over the 8 lanes g, held by quad lane t = 0
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) lT[r] += __shfl_xor_sync(0xffffffffu, lT[r], x);
      const int src = g >> 1;
      const float m0 = __shfl_sync(0xffffffffu, mT[0], src), m1 = __shfl_sync(0xffffffffu, mT[1], src);
      const float b0 = __shfl_sync(0xffffffffu, mbT[0], src), b1 = __shfl_sync(0xffffffffu, mbT[1], src);
      const float l0 = __shfl_sync(0xffffffffu, lT[0], src), l1 = __shfl_sync(0xffffffffu, lT[1], src);
      m[0] = (g & 1) ? m1 : m0, mb[0] = (g & 1) ? b1 : b0;
      l[0] = t == 0 ? ((g & 1) ? l1 : l0) : 0.0f;
    }
    // E4M3 value centroids are stored times v_cb_scale: undo it before the exact window
    // tokens add to the same accumulators (a power of two: exact in fp32)
    if constexpr (CBF == 1) {
#pragma unroll
      for (int mt = 0; mt < T::kMTo; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][n][e] *= p.v_cb_omul;
    }
    // int8 values: the codebook scale (the offset left O tile by tile)
    if constexpr (T::kV8) {
#pragma unroll
      for (int mt = 0; mt < T::kMTo; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][n][e] *= p.v_cb_omul;
    }
  }

  stamp(2);
  if (w1 > w0 && !win_first) {
    if (p.win_bf16) window_tokens(std::true_type{}, 0);
    else window_tokens(std::false_type{}, 0);
  }


  stamp(3);
  // ---- block combine: warps → one (max, sum, O) per row ------------------------------------
#pragma unroll
  for (int n = 0; n < NT; ++n) {  // a row's sum is spread over its quad
    l[n] += __shfl_xor_sync(0xffffffffu, l[n], 1);
    l[n] += __shfl_xor_sync(0xffffffffu, l[n], 2);
  }
  __syncthreads();  // the codebooks are dead: reuse their space
  // The two-blocks kernels (MINB 2) read the block's position back from shared memory (stored at
  // the lengths' load) for the combine, merge and output writes: held in registers through the
  // coded loop it made the fp16 and int8-keys-and-values ones, at their 128-register cap, spill
  // 4-12 bytes. Run 161 (H100, A/B, two repetitions, applied to every kernel): 64 x 16384 -1.3%
  // for d4b8's int8 keys and values (a two-blocks kernel), parity elsewhere, except the defaults'
  // one-block kernel (they have no two-blocks kernel): -1.2% at 64 x 16384 but +1.6% at batch 1,
  // the closer bar, and +1.3% at 8 x 32768 (run 163, four alternating repetitions), so it and
  // the other one-block kernels keep the registers.
  if constexpr (MINB >= 2) {
    const volatile int* const pos = sFlag;
    split = pos[1], b = pos[2];
    const int gy = pos[3];
    kvh = int(fast_div(uint32_t(gy), p.div_row_chunks)), rchunk = gy - kvh * p.n_row_chunks;
    seg = (b * p.n_kv_heads + kvh) * p.n_row_chunks + rchunk;
  }
  stamp(4);
  float* const co = reinterpret_cast<float*>(region);  // [warps][rows][kCoStride]
  float* const cm = co + T::kWarps * kRows * T::kCoStride;
  float* const cl = cm + T::kWarps * kRows;
  if (t == 0 && (!kR4 || (g & 1) == 0)) {  // kR4: lanes g = 2r, 2r + 1 both hold row r
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      cm[warp * kRows + n * 8 + qrow] = m[n];
      cl[warp * kRows + n * 8 + qrow] = l[n];
    }
  }
  // rows past the chunk's live ones (a GQA group of 4 fills half of 8) are neither stored nor combined
  const int live_rows = min(kRows, rows_total - rchunk * kRows);
  if constexpr (kR4) {  // row t, dims 4σ..4σ+3 of sub-vector σ = g·kVSpt + i
    if (t < live_rows)
#pragma unroll
      for (int i = 0; i < T::kVSpt; ++i) {
        float* dst = co + (warp * kRows + t) * T::kCoStride + T::co_col(4 * (g * T::kVSpt + i));
        reinterpret_cast<float2*>(dst)[0] = make_float2(o[i][0][0], o[i][0][1]);
        reinterpret_cast<float2*>(dst)[1] = make_float2(o[i][0][2], o[i][0][3]);
      }
  } else {
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt) {
      const int i = mt / T::kVWps, j = mt % T::kVWps;
      const int dlo = (g * T::kVSpt + i) * VS + 2 * j;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (n * 8 + 2 * t + r >= live_rows) continue;
          float* dst = co + (warp * kRows + n * 8 + 2 * t + r) * T::kCoStride + T::co_col(dlo);
          if constexpr (T::kPairV) {  // dims dlo, dlo + 1 = elements 0, 1 of the lane's pair j
            dst[0] = o[2 * i][n][2 * j + r];
            dst[1] = o[2 * i + 1][n][2 * j + r];
          } else {
            dst[0] = o[mt][n][r];
            dst[1] = o[mt][n][2 + r];
          }
        }
    }
  }
  __syncthreads();

  auto write_out = [&](int row, int d, float v) {
    const int gr = rchunk * kRows + row;
    if (gr >= rows_total) return;
    const int qi = row_qi(gr), h = kvh * G + gr - qi * G;
    store_f(p.out, p.out_dtype, b * p.out_stride[0] + h * p.out_stride[1] + qi * p.out_stride[2] + d * p.out_stride[3],
            v);
  };
  // O's column of dim d: the gathers' mapping stored m-tile mt's rows g, g + 8 at columns
  // dlo, dlo + 1 (above); in the ldmatrix mapping those rows are dims 16·mt + g, 16·mt + 8 + g,
  // stored at the same columns (the same conflict-free store pattern)
  auto o_col = [&](int d) -> int {
    if (!(T::kLdsmV && nm)) return d;
    const int mt = d >> 4, half = (d >> 3) & 1, gg = d & 7;
    return (gg * T::kVSpt + mt / T::kVWps) * VS + 2 * (mt % T::kVWps) + half;
  };
  // Cluster launches: this block's partial (O[row][d], then max and sum per row) goes to the
  // query buffers, dead since the window phase (the barrier above): 4·D + 8 bytes a row fit the
  // 2·kQRowB = 4·D + 128 bytes a row of sQt and sQr hold.
  static_assert(kRows * D * 4 + 2 * kRows * 4 <= 2 * kRows * T::kQRowB, "the cluster partial fits the query buffers");
  float* const cpo = reinterpret_cast<float*>(sQt);
  float* const cpm = cpo + kRows * D;
  float* const cpl = cpm + kRows;
  for (int idx = tid; idx < live_rows * D; idx += T::kThreads) {
    const int row = idx / D, d = idx % D, dc = o_col(d);
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < T::kWarps; ++w) M = fmaxf(M, cm[w * kRows + row]);
    const float Mu = M == -INFINITY ? 0.0f : M;
    float acc = 0.0f, lsum = 0.0f;
#pragma unroll
    for (int w = 0; w < T::kWarps; ++w) {
      const float f = ex2(cm[w * kRows + row] - Mu);
      acc += co[(w * kRows + row) * T::kCoStride + T::co_col(dc)] * f;
      lsum += cl[w * kRows + row] * f;
    }
    if (S == 1) {
      write_out(row, d, lsum > 0.0f ? acc / lsum : 0.0f);
    } else if (p.cluster_launch) {
      cpo[row * D + d] = acc;
      if (d == 0) cpm[row] = M, cpl[row] = lsum;
    } else {
      const int64_t slot = (int64_t(seg) * S + split) * kRows + row;
      p.ws_o[slot * D + d] = acc;
      if (d == 0) p.ws_ml[slot * 2] = M, p.ws_ml[slot * 2 + 1] = lsum;
    }
  }

  // ---- split merge --------------------------------------------------------------------------
  stamp(5);
  bool seg_done = (S == 1);
  if (S > 1 && p.cluster_launch) {
    // The segment's S blocks form one cluster (rank = split): after one cluster barrier every
    // block merges a 1/S share of the outputs, reading the S partials from the blocks' shared
    // memory (one round of S·3 independent loads per element); a second barrier keeps each
    // block's partial alive until all have read it. No workspace, no fence, no counter.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int kMaxCluster = kAttnMaxClusterSplits;
    cluster_sync_all();
    stamp(6);
    const int n_el = live_rows * D, per = (n_el + S - 1) / S;
    const uint32_t base = uint32_t(__cvta_generic_to_shared(cpo));
    for (int i = tid; i < per; i += T::kThreads) {
      const int idx = split * per + i;
      if (idx >= n_el) break;
      const int row = idx / D, d = idx % D;
      const uint32_t off_o = uint32_t(row * D + d) * 4u, off_m = uint32_t(kRows * D + row) * 4u,
                     off_l = uint32_t(kRows * D + kRows + row) * 4u;
      float mv[kMaxCluster], lv[kMaxCluster], ov[kMaxCluster];
#pragma unroll
      for (int s2 = 0; s2 < kMaxCluster; ++s2) {
        if (s2 < S) {
          const uint32_t rb = cluster_map(base, s2);
          mv[s2] = ld_cluster_f32(rb + off_m);
          lv[s2] = ld_cluster_f32(rb + off_l);
          ov[s2] = ld_cluster_f32(rb + off_o);
        } else {
          mv[s2] = -INFINITY, lv[s2] = 0.0f, ov[s2] = 0.0f;
        }
      }
      float M = -INFINITY;
#pragma unroll
      for (int s2 = 0; s2 < kMaxCluster; ++s2) M = fmaxf(M, mv[s2]);
      const float Mu = M == -INFINITY ? 0.0f : M;
      float acc = 0.0f, lt = 0.0f;
#pragma unroll
      for (int s2 = 0; s2 < kMaxCluster; ++s2) {
        const float f = s2 < S ? ex2(mv[s2] - Mu) : 0.0f;
        acc += ov[s2] * f;
        lt += lv[s2] * f;
      }
      write_out(row, d, lt > 0.0f ? acc / lt : 0.0f);
    }
    cluster_sync_all();
    seg_done = split == 0;
#else
    __trap();  // attn_launch clusters only kernels built for sm_90+
#endif
  } else if (S > 1) {
    // Arrival without a fence per thread: the barrier orders every thread's partial stores
    // before thread 0's gpu-scope release (a release is cumulative), and the acquire half of
    // the same atomic orders the last block's loads after every other block's release (the
    // split-K semaphore pattern). Run 68, batch 1: the last block's merge phase went from 2.67
    // to 2.35 us (max over blocks) without the two __threadfence() (fence.sc.gpu) it had.
    __syncthreads();
    if (tid == 0) sFlag[0] = (atom_add_acq_rel_gpu(&p.counters[seg], 1) == S - 1);
    __syncthreads();
    seg_done = sFlag[0] != 0;
    stamp(6);
    if (seg_done) {
      // The merge in one round trip: it is the tail of every split launch, so latency is all
      // that matters. A warp takes 32 consecutive outputs of one row (D is a multiple of 32),
      // kGr groups of them per pass: lane s < S loads split s's (max, sum) of the group's row,
      // every lane the partials of its output, all issued before any is used; a warp reduction
      // gives the row max, lane s puts split s's factor and sum into the warp's slot of the dead
      // combine region; one __syncwarp, no block barrier. The version before run 52 read the
      // statistics, then the partials, two round trips and a serial per-row loop apart: 3.6 us
      // at batch 1 (run 39); a serial max over the slots and every lane's own exp2 per split
      // then kept it at 2.35 us, 1.87 us without them (run 68). The arithmetic, in split order,
      // is the cluster merge's.
      static_assert(D % 32 == 0, "a warp's 32 outputs lie in one row");
      static_assert(T::kWarps * 2 * 32 * 8 <= T::kCombineBytes, "merge slots fit the combine's space");
      // Partials in chunks of kCh splits: one round trip up to 16 splits (the batch-1 plan), one
      // more per further chunk. Kernels capped at 128 registers take one group per pass (a GQA
      // group of 4 at head_dim 128 has 512 outputs: one pass of 512 threads), and the E4M3 ones,
      // already at 128, chunks of 8 (with 16, ptxas spilled 16 / 68 bytes in the 16-warp kernel
      // and its loop lost 2-7%: run 52).
      constexpr int kGr = T::kThreads * MINB >= 512 ? 1 : 2, kCh = kGr == 1 && CBF == 1 ? 8 : 16;
      float2* const slot = reinterpret_cast<float2*>(region) + warp * kGr * 32;  // [groups][32 splits] (factor, l)
      const int n_el = live_rows * D;
      const int64_t sbase = int64_t(seg) * S * kRows;
      for (int e0 = warp * 32; e0 < n_el; e0 += kGr * T::kThreads) {
        float ov[kGr][kCh];
        auto load_ov = [&](int sc) {
#pragma unroll
          for (int u = 0; u < kGr; ++u) {
            const int e = e0 + u * T::kThreads;
            const bool on = e < n_el;  // the warp's 32 outputs are all live or none
            const int64_t rs = sbase + (on ? e / D : 0);
            const int d = on ? e % D + lane : 0;
#pragma unroll
            for (int j = 0; j < kCh; ++j)
              ov[u][j] = on && sc + j < S ? __ldcg(p.ws_o + (rs + int64_t(sc + j) * kRows) * D + d) : 0.0f;
          }
        };
        // lane s < S: split s's (max, sum) of group u's row
        float mv[kGr], lv[kGr];
#pragma unroll
        for (int u = 0; u < kGr; ++u) {
          const int e = e0 + u * T::kThreads;
          mv[u] = -INFINITY, lv[u] = 0.0f;
          if (e < n_el && lane < S) {
            const float* ml = p.ws_ml + (sbase + e / D + int64_t(lane) * kRows) * 2;
            mv[u] = __ldcg(ml), lv[u] = __ldcg(ml + 1);
          }
        }
        load_ov(0);
        // the row max by a warp reduction, each split's factor once (by its lane), into the slots
        float acc[kGr], lt[kGr];
#pragma unroll
        for (int u = 0; u < kGr; ++u) {
          float M = mv[u];
#pragma unroll
          for (int m = 16; m >= 1; m >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, m));
          const float Mu = M == -INFINITY ? 0.0f : M;
          slot[u * 32 + lane] = make_float2(lane < S ? ex2(mv[u] - Mu) : 0.0f, lv[u]);
          acc[u] = 0.0f, lt[u] = 0.0f;
        }
        __syncwarp();
        for (int sc = 0; sc < S; sc += kCh) {
          if (sc > 0) load_ov(sc);
#pragma unroll
          for (int u = 0; u < kGr; ++u)
#pragma unroll
            for (int j = 0; j < kCh; ++j) {
              if (sc + j < S) {
                const float2 st = slot[u * 32 + sc + j];  // (factor, sum) of split sc + j
                acc[u] += ov[u][j] * st.x;
                lt[u] += st.y * st.x;
              }
            }
        }
#pragma unroll
        for (int u = 0; u < kGr; ++u) {
          const int e = e0 + u * T::kThreads;
          if (e < n_el) write_out(e / D, e % D + lane, lt[u] > 0.0f ? acc[u] / lt[u] : 0.0f);
        }
        __syncwarp();  // the slots are rewritten by the next pass
      }
      if (tid == 0) p.counters[seg] = 0;
    }
  }

  stamp(7);
  if (prof && tid == 0) {
    unsigned long long gt;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
    prof[9] = gt;
  }
  // ---- decode step: the very last segment advances the lengths ------------------------------
  if (p.advance && seg_done && tid == 0) attn_advance_lengths(p);
}

// ---- host side: one entry per compiled configuration ----------------------------------------
struct AttnEntry {
  AttnConfigKey key;
  const void* kernel;
  int smem, threads;
  int k_row, v_row;  ///< code row strides the kernel is compiled for
  int wide = 0;  ///< 1: two blocks per multiprocessor, chosen for grids of two waves or more
  int prmt = 0;  ///< 1: the 64 KB-aligned codebook layout (needs the dynamic base at 0 or 0x400); 2: kPrmtRel (at 0x400)
  int rows4 = 0; ///< 1: the four-row kernel (AttnTraits::kR4), for chunks of <= 4 query rows
  int win_first = 0; ///< 1: attends the window rows before the coded tokens (AttnTraits::kWinFirst)
  int plain = 0;     ///< 1: the plain kernel of attention_any_dim.cu (configuration read at run time, no clusters)
};
/// The plain kernel's entry for k (head dims kAnyHeadDims), or null where it does not serve k.
const AttnEntry* attn_any_dim_entry(const AttnConfigKey& k);
/// A launch of a plain entry's kernel with p's rows: the instantiation (the fewest rows that hold
/// a chunk's live rows; the entry's own kernel is the widest, for occupancy queries), its
/// codebooks' replication (AttnParams::plain_cb_rep) and its shared memory.
struct AnyDimLaunch {
  const void* kernel = nullptr;
  int smem = 0, cb_rep = 0;
};
AnyDimLaunch attn_any_dim_launch(const AttnEntry& e, const AttnParams& p);


template <int D, int KS, int KB, int VS, int VB, int NT, int KT = 2, int MINB = 1, int W = 8, int PIPE = 0, int CBF = 0,
          int R4 = 0>
AttnEntry attn_entry() {
  using T = AttnTraits<D, KS, KB, VS, VB, NT, KT, MINB, W, PIPE, CBF, R4>;
  static_assert(T::kSmem <= 227 * 1024, "shared memory over the sm_90 limit");
  return {{D, KS, KB, VS, VB, NT, CBF},
          reinterpret_cast<const void*>(&vq_attn_kernel<D, KS, KB, VS, VB, NT, KT, MINB, W, PIPE, CBF, R4>),
          T::kSmem,
          T::kThreads,
          T::kKRow,
          T::kVRow,
          0,
          T::kPrmt ? 1 : T::kPrmtRel ? 2 : 0,
          int(T::kR4),
          int(T::kWinFirst)};
}

/// A tuning variant (VQ_CUDA_ALL_CONFIGS builds): the kernel and the parameters it was built with.
struct AttnVariantEntry {
  AttnEntry entry;
  int kt, minb, warps, pipe;
};
template <int D, int KS, int KB, int VS, int VB, int NT, int KT, int MINB, int W, int PIPE, int CBF = 0, int R4 = 0>
AttnVariantEntry attn_variant() {
  return {attn_entry<D, KS, KB, VS, VB, NT, KT, MINB, W, PIPE, CBF, R4>(), KT, MINB, W, PIPE};
}

}  // namespace veloxquant::cuda
