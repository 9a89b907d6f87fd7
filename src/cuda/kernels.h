// src/cuda/kernels.h — the host-side face of the CUDA kernels: plain parameter structs
// (device pointers, sizes, strides) and the launchers. No CUDA header here, so the caches
// (.cpp) and the tests can include it; streams travel as void* (a cudaStream_t).
//
// Layouts shared by every kernel (the CUDA caches own these buffers):
//   codes        U8  [batch, n_kv_heads, code_cap, row_stride]   one token-head per row,
//                    the pq.h LSB-first bit packing, rows padded with zero bytes to a multiple
//                    of 4 (row_stride = round_up(code_bytes, 4)) so kernels read whole words
//   window rows  F16/BF16 [batch, n_kv_heads, win_cap, head_dim]  ring (position p in slot
//                    p % win_cap) or linear (slot p)
//   lengths      I32 [batch]  seq_len (tokens held) and res_count (exact window tokens),
//                    device-resident so a captured decode step reads the current values
//   codebooks    F32 [n_centroids, sub_dim] for encoding (exact, as the CPU oracle),
//                F16 or E4M3 [n_centroids, sub_dim] for attention (shared memory, replicated)
#pragma once

#include <cstdint>
#include <string>

#include "veloxquant/dtype.h"

namespace veloxquant::cuda {

/// Division of 32-bit unsigned values by a divisor fixed for a launch, as one multiply-high, an
/// add and a shift (the round-up method of Granlund and Montgomery): with s = ceil(log2 d) and
/// m = floor(2^32·(2^s − d)/d) + 1, x / d = (umulhi(x, m) + x) >> s for every x < 2^32, the add
/// taken in 64 bits. The host fills it (make_fast_div); the kernels divide with fast_div, the
/// function the host tests: a 32-bit `/` by a runtime value is ~20 dependent instructions
/// and a 64-bit one a call of ~70, which every warp of a block ran in the attention setup.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
};
constexpr FastDiv make_fast_div(uint32_t d) {
  FastDiv f;
  f.d = d < 1 ? 1 : d;
  uint32_t s = 0;
  while ((uint64_t(1) << s) < f.d) ++s;
  f.s = s;
  f.m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - f.d)) / f.d + 1);
  return f;
}
#if defined(__CUDACC__)
#define VQ_HOST_DEVICE __host__ __device__
#else
#define VQ_HOST_DEVICE
#endif
/// x / f.d: the high half of x·m is __umulhi on the device, the same product in 64 bits on the
/// host (which the tests run).
constexpr VQ_HOST_DEVICE uint32_t fast_div(uint32_t x, FastDiv f) {
#if defined(__CUDA_ARCH__)
  return uint32_t((uint64_t(__umulhi(x, f.m)) + x) >> f.s);
#else
  return uint32_t((((uint64_t(x) * f.m) >> 32) + x) >> f.s);
#endif
}

/// A float tensor of rank 4 on the device: data, dtype (F32/F16/BF16) and element strides.
struct DevTensor4 {
  const void* data = nullptr;
  DType dtype = DType::F16;
  int64_t stride[4] = {0, 0, 0, 0};
};

// ------------------------------------------------------------------------------------------
// Decode / prefill attention over codes + an exact window (fused_sdpa on the device).
// ------------------------------------------------------------------------------------------
struct AttnParams {
  // shapes
  int batch = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int q_len = 0;   ///< queries handled by this launch: G·q_len rows per kv head in n_row_chunks chunks (decode steps: 1..16)
  int q_tail = 0;  ///< query i sits at position L − q_tail + i (q_tail = q_len for decode)
  DevTensor4 q;    ///< [batch, n_heads, q_len, head_dim]
  void* out = nullptr;        ///< [batch, n_heads, q_len, head_dim]
  DType out_dtype = DType::F16;
  int64_t out_stride[4] = {0, 0, 0, 0};
  // coded history (null when win_all)
  const uint8_t* k_codes = nullptr;  ///< [batch, n_kv_heads, code_cap, k_row_stride]
  const uint8_t* v_codes = nullptr;  ///< [batch, n_kv_heads, code_cap, v_row_stride]
  int64_t code_cap = 0;
  int k_row_stride = 0, v_row_stride = 0;
  const uint16_t* k_cb16 = nullptr;  ///< F16 [2^key_bits, key_sub_dim]
  const uint16_t* v_cb16 = nullptr;  ///< F16 [2^value_bits, value_sub_dim]
  /// E4M3 codebooks (kernels with cb_fmt 1): round_e4m3(c · s) for a power-of-two s per
  /// codebook; the kernel multiplies q̃ by k_cb_qmul = 1/s_k and the coded part of the value
  /// accumulators by v_cb_omul = 1/s_v. Int8 keys (cb_fmt 2): k_cb8 holds int8 bytes
  /// round(c / s_k) and k_cb_qmul = s_k (a centroid is byte · s_k); values in v_cb16. Int8
  /// keys and values (cb_fmt 3): keys as for cb_fmt 2; v_cb8 holds the value centroids'
  /// int8 round(c / s_v) as offset-binary bytes (int8 + 128) and v_cb_omul = s_v.
  const uint8_t* k_cb8 = nullptr;  ///< E4M3 or int8 [2^key_bits, key_sub_dim]
  const uint8_t* v_cb8 = nullptr;  ///< E4M3 or offset-binary int8 [2^value_bits, value_sub_dim]
  float k_cb_qmul = 1.0f, v_cb_omul = 1.0f;
  const float* lambda = nullptr;     ///< [n_kv_heads, head_dim] or null (identity)
  int use_hadamard = 1;
  float hadamard_scale = 1.0f;       ///< 1/sqrt(head_dim)
  // exact window
  const void* k_win = nullptr;  ///< [batch, n_kv_heads, win_cap, head_dim]
  const void* v_win = nullptr;
  int win_bf16 = 0;
  int64_t win_cap = 0;
  int win_ring = 0;  ///< 1: slot p % win_cap; 0: slot p
  int win_all = 0;   ///< 1: every token is a window token (the fp16 cache)
  // lengths: L = seq_len[b] + n_new, window = min(residual_length, res_count[b] + n_new)
  const int32_t* seq_len = nullptr;
  const int32_t* res_count = nullptr;
  int n_new = 0;
  int residual_length = 0;
  int advance = 0;  ///< 1: the last block adds n_new to seq_len/res_count (decode step)
  int32_t* seq_len_rw = nullptr;
  int32_t* res_count_rw = nullptr;
  /// Decode steps' input checks (the range flags, as EncodeParams::gate): when gate[0] | gate[1]
  /// is set the advance adds nothing (the step's tokens were not appended). Null: no gate.
  const int* gate = nullptr;
  /// Eager calls, whose host mirror of the lengths is exact: the coded tokens every sequence
  /// holds (hint_ncode) and the split length the kernel will compute from them (hint_chunk,
  /// attn_split_chunk; 0 = no hint). A block then starts the L2 prefetch of its first ring
  /// stages' code tiles while the device lengths are still on their way. Only a prefetch
  /// address: what the kernel computes never depends on it (a wrong hint costs bandwidth).
  /// Not for window-only launches (win_all).
  int hint_chunk = 0;
  int hint_ncode = 0;
  /// Prefill launches: the longest sequence's tokens as the host knows them (0: unknown), which
  /// sizes the exact-rows kernel's history split (prefill_launch); never read by a kernel.
  int64_t prefill_tokens = 0;
  // masking and scale
  float scale_log2 = 0.0f;  ///< softmax scale · log2(e)
  int causal = 1;
  int64_t sliding_window = 0;
  // plan
  int n_splits = 1;     ///< blocks per (batch, kv head, row chunk)
  int n_row_chunks = 1; ///< ceil(G·q_len / rows_per_chunk)
  int rows_per_chunk = 8;
  int window_weight = 10;  ///< one window token counts as this many code tokens when splitting (run 15: 4 / 7 / 10 → 51.2 / 49.2 / 47.4 us at 1x131072)
  float* ws_o = nullptr;  ///< [segments, n_splits, rows, head_dim] partial outputs
  float* ws_ml = nullptr; ///< [segments, n_splits, rows, 2] (max, sum) in log2 units
  int* counters = nullptr;     ///< [segments] arrival counters (zero between launches)
  int* done_counter = nullptr; ///< [1] finished segments (zero between launches)
  /// Diagnosis only (bench --profile): per block, kAttnProfSlots clock64/globaltimer stamps of
  /// the phases (see vq_attn_kernel); null in every library call.
  unsigned long long* prof = nullptr;
  int window_staged = 1;  ///< 1: residual window rows staged through shared memory (0: register loads; A/B tests)
  /// 1: a launch over codes and window rows attends the window rows first, through registers,
  /// while the ring's first code stages are in flight, each round on a warp with one code tile
  /// fewer — in the kernels whose ring cannot stage the window (AttnTraits::kWinFirst);
  /// 0: after the coded tokens (A/B tests)
  int window_first = 1;
  int value_ldsm = 1;     ///< 1: d8 fp16 value centroids into MMA fragments by ldmatrix.trans (0: per-lane gathers; A/B tests)
  /// Set by attn_launch, not by callers: 1 when the launch groups a segment's n_splits blocks
  /// into one thread-block cluster, whose blocks merge their partials through distributed
  /// shared memory (no workspace round trip, no last-block merge).
  int cluster_launch = 0;
  /// Set by attn_launch, not by callers (launch_entry): the launch's fixed divisors as
  /// multiply-high divisions (FastDiv): the GQA group n_heads / n_kv_heads, the row chunks,
  /// the splits and the window weight.
  FastDiv div_group, div_row_chunks, div_splits, div_window_weight;
  /// Set by attn_launch, not by callers: the configuration of a launch on the plain kernel (the
  /// keys without a tuned kernel: attn_any_dim_entry), which reads these at run time.
  int plain_key_bits = 0, plain_value_bits = 0, plain_cb_fmt = 0;
  /// Set by attn_launch, not by callers: the plain kernel's key (bit 0) and value (bit 1)
  /// codebooks held once per lane of a shared-memory wavefront (attention_any_dim.cu).
  int plain_cb_rep = 0;
};
/// Head dims served by the plain attention kernel (src/cuda/attention_any_dim.cu) alone, with no
/// tuned kernel: every codebook configuration of up to 12 bits and every format, any q_len. 80:
/// Phi-2, StableLM-3B; 96: Phi-3, GPT-NeoX-20B; 112: MPT-30B; 160: StableLM-2-12B; and 192.
inline constexpr int kAnyHeadDims[] = {80, 96, 112, 160, 192};
bool attn_any_head_dim(int head_dim);
/// Head dims with tuned kernels for some configurations (the default build: d4b8/d4b8 and
/// d4b12/d8b8 at 64 and 128; VQ_CUDA_ALL_CONFIGS: five configurations at 64, 128 and 256). The
/// plain kernel is instantiated at these too and serves every configuration a tuned kernel does
/// not (d8b12/d8b12 or head_dim 256 in the default build, e.g. Gemma's), so every d4/d8
/// configuration of 4 to 12 bits runs on CUDA in every build, the tuned ones faster.
inline constexpr int kTunedHeadDims[] = {64, 128, 256};
/// Whether the plain kernel is instantiated at head_dim (kAnyHeadDims and kTunedHeadDims): the
/// head dims the CUDA caches take.
bool attn_plain_head_dim(int head_dim);
/// Those head dims for messages: "64, 128, 256, 80, 96, 112, 160, 192".
std::string attn_head_dims_list();
constexpr int kAttnProfSlots = 15;  // 0-7, 10-13 clock64 stamps, 8-9 globaltimer, 14 the SM
/// Tokens (work units) per split: `units` of work over `splits` blocks, rounded up to whole
/// 32-token tiles. The kernel's plan and the host's hint (AttnParams::hint_chunk) both use it.
constexpr int64_t attn_split_chunk(int64_t units, int splits) { return ((units + splits - 1) / splits + 31) / 32 * 32; }
/// Largest cluster (splits per segment) the kernel's cluster merge holds; 9..16 are
/// non-portable cluster sizes on sm_90.
constexpr int kAttnMaxClusterSplits = 16;

/// Which compiled configuration serves (head_dim, key spec, value spec, rows per chunk).
struct AttnConfigKey {
  int head_dim, key_sub_dim, key_bits, value_sub_dim, value_bits, n_tiles;
  int cb_fmt = 0;  ///< CodebookFormat: 0 fp16 (k_cb16/v_cb16), 1 E4M3 (k_cb8/v_cb8), 2 int8 keys (k_cb8) + fp16 values (v_cb16), 3 int8 keys and values (k_cb8/v_cb8)
};

/// Whether this build holds a kernel for the configuration.
bool attn_config_compiled(const AttnConfigKey& k);
/// Whether a tuned kernel serves k in this build (attn_config_compiled: a tuned or the plain kernel).
bool attn_tuned_compiled(const AttnConfigKey& k);
/// Launches of the plain kernel so far in this process (tests check which kernel ran).
long long attn_plain_launches();
/// Lists the compiled configurations as "d4b8/d4b8@128" strings (for messages and tests).
const char* attn_compiled_list();
/// Dynamic shared memory of the kernel for the configuration (bytes).
int attn_smem_bytes(const AttnConfigKey& k);
/// Blocks of that kernel resident per multiprocessor (from the occupancy calculator).
int attn_blocks_per_sm(const AttnConfigKey& k, int device);
/// Launches the attention kernel (plan already folded into p). Throws UnsupportedError for a
/// configuration this build does not hold, CudaError on a launch failure. A split launch
/// (2..16 splits) on an sm_90+ device runs as one thread-block cluster per segment when every
/// segment's cluster can be resident at once (attn_would_cluster); otherwise the splits merge
/// through the workspace. priority != 0 gives the launch that block-dispatch priority (lower
/// numbers first, as cudaDeviceGetStreamPriorityRange; a captured launch keeps it as its node's
/// priority, which a graph uses when instantiated with cudaGraphInstantiateFlagUseNodePriority).
/// pdl: launched as a programmatic dependent of the kernel before it on the stream (sm_90+, a
/// kernel built for it, attn_set_step_pdl on): its blocks start while that kernel runs and wait
/// for it (grid_dep_wait) before they read codes or window rows. Only for a kernel of the
/// caller's own that writes none of what the kernel reads before that wait: the queries, the
/// codebooks, λ and the lengths (decode steps: window rows, encode or row append, none of which
/// writes the lengths; captured graphs keep it as a programmatic edge).
void attn_launch(const AttnConfigKey& k, const AttnParams& p, void* stream, int priority = 0, bool pdl = false);
/// Prefill attention (prefill_kernel.cuh): a chunk of many queries against the codes and the
/// window, 128 query rows per block (64 with VQ_CUDA_VARIANTS), the history unsplit.
/// prefill_compiled: whether (head_dim, key spec, value spec) has a prefill kernel with blocks
/// of `rows` rows (0: any; n_tiles ignored; every codebook format runs on it).
/// prefill_auto_on_codes: whether kPrefillAuto takes it for a coded cache holding `tokens` tokens
/// a sequence (the chunk's included) when a chunk of q_len queries attends: always where its
/// 128-row kernel holds enough codebook copies for conflict-free gathers (d4b8/d4b8 and
/// d8b8/d8b8; run 122: d4b8 1.04-1.24x over the row chunks), otherwise (the defaults: 4 of 16
/// key copies) only while tokens <= kPrefillShortHistory · q_len, a prompt or an early chunk of
/// one (run 123: the defaults 1.24x the row chunks on a 4096-token prompt, 0.90-0.93x at 32768
/// tokens of history). prefill_launch: one launch for all of p's rows (p.n_row_chunks,
/// n_splits and the workspace are ignored; eager calls only: p.n_new = 0). kPrefillRows: the
/// row granularity of the routing rule (a chunk takes the prefill kernel once
/// ceil(G·q_len / 64) · n_kv_heads · batch reaches the multiprocessor count).
constexpr int kPrefillRows = 64;
constexpr int kPrefillAutoRows = 128;
bool prefill_compiled(const AttnConfigKey& k, int rows = 0);
/// Whether head_dim has a prefill kernel over exact rows (the fp16 cache's rows, a Standard
/// cache's, or a coded cache's expanded by materialize_launch): 64 and 128 (both prefill
/// kernels, where d4b8 is compiled) and 80 and 96 (the exact-rows kernel only: a coded cache's
/// prompt at these head dims runs over its expanded rows, or as the plain kernel's row chunks).
bool prefill_rows_compiled(int head_dim);
constexpr int kPrefillShortHistory = 4;
bool prefill_auto_on_codes(const AttnConfigKey& k, int64_t tokens, int q_len);
void prefill_launch(const AttnConfigKey& k, const AttnParams& p, void* stream);
/// Query rows per prefill block: 128 (8 warps, one block a multiprocessor: each dequantized tile
/// serves 128 rows; the default) or 64 (4 warps, two blocks; VQ_CUDA_VARIANTS builds only).
/// prefill_block_rows: what a launch of p takes (the forced value, else 128);
/// set_prefill_block_rows forces 64 or 128 (0: back to automatic; the benchmark's A/B, tests),
/// process-wide, and returns the previous setting. A forced size this build lacks makes
/// prefill_launch throw UnsupportedError.
int set_prefill_block_rows(int rows);
int prefill_block_rows(const AttnParams& p);
/// When eager calls of more than 16 queries use the prefill kernel (where it is compiled):
/// kPrefillAuto (the default) for caches whose every token is an exact row (the fp16 cache,
/// Standard caches; since run 116) and for coded caches where prefill_auto_on_codes says so
/// (since run 122), when ceil(G·q_len / kPrefillRows) · n_kv_heads · batch reaches the multiprocessor count
/// (fewer blocks leave the device idle: the decode kernel's row chunks split the history);
/// kPrefillAlways (tests: every cache, every size); kPrefillOff (the decode kernel's row chunks:
/// the benchmark's A/B). Process-wide; returns the previous mode.
enum PrefillMode : int { kPrefillOff = 0, kPrefillAuto = 1, kPrefillAlways = 2 };
int set_prefill_mode(int mode);
int prefill_mode();
/// Prefill-kernel launches so far in this process (tests: which path ran).
long long prefill_launches();
/// Launches over exact rows only (p.win_all: the fp16 cache, Standard caches, prefill over
/// dequantized rows) at head_dim 64 / 128 in blocks of 128 rows may take vq_prefill_exact_kernel
/// (prefill_exact_kernel.cuh: 32 rows a warp, each K / V fragment feeding two MMA row tiles, two
/// blocks of 4 warps a multiprocessor) instead of vq_prefill_kernel (16 rows a warp, 8 warps):
/// kExactAuto (the default) where prefill_exact_pays says so, with tiles of 64 tokens, or split
/// where prefill_exact_split_plan says so (run 181: 1.01-1.16x over vq_prefill_kernel);
/// kExactTile64 / kExactTile32 (tiles of 32 tokens at head_dim 128) on every such launch;
/// kExactOff never. Run 179 (H100, same command): 3-15% faster than vq_prefill_kernel on grids
/// of two blocks a multiprocessor or more, 14-20% slower on grids of one (there it has half the
/// warps a multiprocessor). Process-wide; returns the previous mode. prefill_exact_launches: its
/// launches so far (also counted in prefill_launches).
enum PrefillExactMode : int { kExactOff = 0, kExactTile64 = 1, kExactTile32 = 2, kExactAuto = 3 };
int set_prefill_exact_kernel(int mode);
int prefill_exact_kernel();
long long prefill_exact_launches();
/// kExactAuto's rule: the exact-rows kernel for a grid of `blocks` 128-row blocks on `sms`
/// multiprocessors when blocks >= 1.5 x sms (most multiprocessors then hold two of its blocks).
bool prefill_exact_pays(int64_t blocks, int64_t sms);
/// Where it does not pay, kExactAuto splits the history of each row block over s blocks (s = 2
/// to kExactMaxSplits, the least for which blocks · s pays), each with its share of the tiles,
/// followed by a merge kernel, when the longest sequence (the host's `tokens`; AttnParams::
/// prefill_tokens) gives every share at least kExactMinSplitTiles tiles of 64 tokens; returns 1
/// where not (vq_prefill_kernel then takes the launch). Run 180 (H100, 128 blocks split over 2,
/// tiles of 32 at head_dim 128): 6% slower than vq_prefill_kernel at 4352 tokens a share (8192
/// x 512), 4% faster at 16640 (32768 x 512); the bound sits between. The partial results
/// (batch · kv heads · rows · s · (head_dim + 2) floats) come from the rows path's pool within
/// its limit (set_rows_workspace_limit); without them vq_prefill_kernel runs.
constexpr int kExactMaxSplits = 4, kExactMinSplitTiles = 160;
int prefill_exact_split_plan(int64_t blocks, int64_t sms, int64_t tokens);
/// Forces the exact-rows kernel's history split to n shares (1: unsplit; the kernel then takes
/// every launch over exact rows it can, as in kExactTile64) for the tests and the benchmark; 0
/// (the default) leaves it to prefill_exact_split_plan. Tiles of 32 tokens never split.
/// Process-wide; returns the previous setting. prefill_split_launches: split launches so far
/// (also counted in prefill_exact_launches and prefill_launches).
int set_prefill_exact_splits(int n);
long long prefill_split_launches();
/// Prefill over dequantized rows (MemoryBound caches, eager calls of more than 16 queries): the
/// cache's held tokens are first written once as exact rows into a stream-ordered workspace
/// (materialize_launch: codes dequantized, keys inverse-transformed; window tokens copied), and
/// the prefill kernel then attends over those rows as over an fp16 cache's (win_all), instead of
/// every 128-row block dequantizing every tile itself. kRowsAuto (the default) takes it where the
/// prefill kernel's grid fills the device (the rule above) and the workspace fits the limit
/// (veloxquant::set_cuda_prefill_workspace_limit); kRowsAlways wherever the workspace fits (tests);
/// kRowsOff never (the benchmark's A/B). Only under kPrefillAuto: kPrefillAlways / kPrefillOff
/// keep meaning the kernel over codes / the row chunks. Process-wide; returns the previous mode.
enum PrefillRowsMode : int { kRowsOff = 0, kRowsAuto = 1, kRowsAlways = 2 };
int set_prefill_rows_mode(int mode);
int prefill_rows_mode();
/// Prefill launches over dequantized rows so far in this process (tests: which path ran).
long long prefill_rows_launches();
void count_prefill_rows_launch();
/// The rows path's workspace (2 · batch · n_kv_heads · tokens · head_dim · 2 bytes), from a
/// stream-ordered pool per device that keeps up to the limit reserved between calls (released
/// down to it at the next synchronisation). rows_workspace_alloc returns null where the request
/// passes the limit, the device has no memory pools or the allocation fails (the caller then
/// attends over the codes); set_rows_workspace_limit(0) turns the path off and releases the
/// pools' memory. Public as veloxquant::set_cuda_prefill_workspace_limit.
constexpr int64_t kRowsWorkspaceDefault = int64_t(1) << 30;
int64_t set_rows_workspace_limit(int64_t bytes);
int64_t rows_workspace_limit();
/// Bytes the device's pool holds now (0 before its first use).
int64_t rows_workspace_reserved(int device);
void* rows_workspace_alloc(int device, size_t bytes, void* stream);
void rows_workspace_free(void* p, void* stream);
/// Clusters of `splits` blocks of the configuration's kernel resident at once on the current
/// device (0 where clusters cannot run; *error, if given, gets the last failed query's message).
int attn_max_active_clusters(const AttnConfigKey& k, int splits, const char** error = nullptr);
/// Whether attn_launch would run p as clusters on the current device.
bool attn_would_cluster(const AttnConfigKey& k, const AttnParams& p);
/// Process-wide switch for the cluster merge (default on): off, split launches always merge
/// through the workspace (A/B benchmarks, tests of both paths). Returns the previous setting.
bool attn_set_cluster_merge(bool allowed);
/// Process-wide switch for decode steps' programmatic dependent launch of attention (attn_launch's
/// pdl; default on): off, every attention launch waits for the kernel before it to end (A/B
/// benchmarks, tests). Returns the previous setting. attn_pdl_launches: such launches so far.
bool attn_set_step_pdl(bool allowed);
long long attn_pdl_launches();
/// Sets p's length hint (hint_ncode, hint_chunk) for sequences of `len` tokens of which
/// `window` are exact window tokens, from p's n_splits and window_weight (set those first):
/// the share the kernel computes when every row sees the whole history (decode; no sliding
/// window).
void attn_set_length_hint(AttnParams& p, int64_t len, int64_t window);
/// Test hook: every later launch's hint_chunk (when set) is moved by `shift` tokens, a result
/// <= 0 dropping the hint (0: hints as passed). The hint steers only an L2 prefetch, so outputs
/// must not change. Returns the previous shift.
int attn_set_hint_shift(int shift);
/// Launches so far in this process that carried a length hint (tests check that eager calls do).
long long attn_hinted_launches();
/// Clustered attention launches so far in this process (tests check which path ran).
long long attn_cluster_launches();
/// Process-wide switch for the four-row kernels (default on): launches whose row chunk holds
/// at most 4 query rows (GQA group × q_len <= 4) take the kernel built for it where the
/// configuration has one (d4b8 with F16, I8 or E4M3 codebooks, whose value centroids reach the
/// MMA as fp16; not I8KV). Off, they run
/// the 8-row kernel (A/B benchmarks, tests of both). Returns the previous setting.
bool attn_set_rows4(bool allowed);
/// Four-row kernel launches so far in this process (tests check which path ran).
long long attn_rows4_launches();
/// Process-wide switch for the two-blocks-per-multiprocessor kernels (default on): unsplit
/// launches take the configuration's two-blocks kernel where one is built (d4b8: the four-row
/// kernels with F16, I8, E4M3 and I8KV codebooks, where attn_wide_pays says so; the 8-row E4M3
/// kernel at two waves of blocks or more). Off, they run the one-block kernel (A/B benchmarks,
/// tests of both). Returns the previous setting.
bool attn_set_wide(bool allowed);
/// Two-blocks kernel launches so far in this process (tests check which path ran).
long long attn_wide_launches();
/// Whether an unsplit grid of `blocks` blocks on `sms` multiprocessors runs faster on a four-row
/// kernel's two-blocks form than on its one-block form, by a wave model fitted on the H200
/// (attention.cu): on 132 SMs 264 blocks yes (-2.6%), 265-396 no (the two-blocks kernel's last
/// round runs single 8-warp blocks), 512 / 1024 / 2048 yes (-4 / -9 / -15%).
bool attn_wide_pays(int64_t blocks, int64_t sms);
/// Multiprocessors of device `dev` (the current device where dev < 0), cached per device: the
/// launch rules of decode, prefill and encode.
int device_sms(int dev = -1);
/// Shared memory of a multiprocessor, and the most a block may opt into, on device `dev` (the
/// current device where dev < 0), cached per device as device_sms.
int device_smem_per_sm(int dev = -1);
int device_smem_per_block(int dev = -1);
/// Process-wide switch for the window-first order (default on, AttnParams::window_first):
/// off, every launch attends its exact window rows after the coded tokens (A/B benchmarks,
/// tests of both orders). Only the kernels with a ring too small to stage the window rows take
/// the window first (AttnTraits::kWinFirst: the defaults' one-row-tile kernels, d8 values); the
/// others attend it last either way. Returns the previous setting.
bool attn_set_window_first(bool on);
/// Process-wide switch for the plain kernel's replicated codebooks (default on; head dims 80 and
/// 96): a key or value codebook of at most 256 entries is held once per lane of a shared-memory
/// wavefront, so its random gathers never conflict, where that keeps as many blocks a
/// multiprocessor as without. Off, every launch reads one copy (A/B benchmarks, tests of both:
/// the results are the same bit for bit). Returns the previous setting.
bool attn_set_plain_replicated(bool allowed);
/// Plain-kernel launches so far in this process with a replicated codebook (tests check which
/// path ran).
long long attn_plain_replicated_launches();
/// Launches so far in this process by a window-first kernel with the window first on (whether
/// or not the launch holds window rows; tests check which path ran).
long long attn_window_first_launches();

/// Tuning variants (builds with VQ_CUDA_ALL_CONFIGS): the same kernel with other warp-tile
/// lengths (kt k-tiles of 16 tokens) and register caps (minb blocks per multiprocessor), for
/// the benchmark to time side by side. key says which configuration each serves.
struct AttnVariantInfo {
  AttnConfigKey key;
  int kt, minb, warps, pipe;
  int rows4 = 0;  ///< 1: a four-row kernel (chunks of <= 4 query rows only)
};
int attn_variant_count();
AttnVariantInfo attn_variant_info(int i);
int attn_variant_blocks_per_sm(int i, int device);
void attn_launch_variant(int i, const AttnParams& p, void* stream);

/// The split planner: blocks per (batch, kv head, row chunk) so the grid fills the device
/// about once (or in whole waves), at least `min_tokens_per_split` tokens per block.
int plan_splits(int segments, int64_t typical_len, int n_sms, int blocks_per_sm,
                int64_t min_tokens_per_split = 512);

// ------------------------------------------------------------------------------------------
// Encode: smooth scaling + FWHT (keys) + exact nearest centroid + packing, plus the window
// rows and (Standard/Stash) the held fp16 K̂/V̂ rows.
// ------------------------------------------------------------------------------------------
/// Candidate grid of a sub_dim-4 codebook of <= 256 centroids (src/core/pq_grid.h), on the
/// device: the bulk encoder re-ranks a sub-vector's cell list instead of scanning the codebook.
struct EncodeGrid {
  const uint32_t* cells = nullptr;  ///< g^4 words: (first list word << 9) | count (0: scan); null: no grid
  const uint32_t* lists = nullptr;  ///< candidate indices, 4 per word (8-bit) or 2 (16-bit: `wide`)
  int g = 0;
  int wide = 0;  ///< 16-bit indices (codebooks of > 256 centroids)
  float lo[4] = {}, inv_w[4] = {}, far_lo[4] = {}, far_hi[4] = {};
};

struct EncodeParams {
  int batch = 0, n_kv_heads = 0, head_dim = 0, n_new = 0;
  DevTensor4 k, v;  ///< [batch, n_kv_heads, n_new, head_dim]
  const float* inv_lambda = nullptr;  ///< [n_kv_heads, head_dim] or null
  const float* lambda = nullptr;      ///< for the dequantized K̂ rows
  int use_hadamard = 1;
  float hadamard_scale = 1.0f;
  // exact codebooks (F32) and their derived values
  const float* k_cb = nullptr;  ///< [2^key_bits, key_sub_dim]
  const float* v_cb = nullptr;
  const float* k_norms = nullptr;  ///< [2^key_bits] ||c||²
  const float* v_norms = nullptr;
  int k_bits = 8, v_bits = 8, k_sub = 4, v_sub = 4;
  float k_cmax = 0, v_cmax = 0;  ///< max_c ||c|| (for the exactness margin)
  // destinations
  uint8_t* k_codes = nullptr;  ///< main codes [batch, kvh, code_cap, row] (position p)
  uint8_t* v_codes = nullptr;
  int64_t code_cap = 0;
  int k_row_stride = 0, v_row_stride = 0;
  int codes_ring = 0;  ///< 1: codes go to slot p % code_cap (Standard's pending codes) and
                       ///< only for tokens inside the window
  void* k_win = nullptr;  ///< exact rows [batch, kvh, win_cap, head_dim] (null: none)
  void* v_win = nullptr;
  int64_t win_cap = 0;
  int win_ring = 0;   ///< 1: slot p % win_cap (MemoryBound); 0: slot p (the held K̂/V̂)
  int win_bf16 = 0;
  int deq_outside = 0;  ///< 1: new tokens already outside the window get dequantized rows in
                        ///< k_win/v_win at slot p (Standard/Stash with their linear K̂/V̂)
  // lengths (device): positions are seq_len[b] + i; window = min(R, res_count[b] + n_new)
  const int32_t* seq_len = nullptr;
  const int32_t* res_count = nullptr;
  int residual_length = 0;
  int* error_flag = nullptr;  ///< set to 1 when a position does not fit code_cap / win_cap
  const int* gate = nullptr;  ///< input checks (update() with deferred checks, decode steps): when
                              ///< gate[0] | gate[1] is set (a queued range check failed), the
                              ///< kernel writes nothing
  int sides = 3;              ///< 1: keys only, 2: values only, 3: both (benchmarks time one side)
  EncodeGrid k_grid, v_grid;  ///< throughput mode, bulk_variant 1: every sub_dim-4 side with a grid
                              ///< takes the grid kernel (same codes, no scan)
  int bulk_variant = 1;       ///< throughput mode only (decode mode always runs the split scan):
                              ///< 1 (default): codebooks of <= 256 centroids run the v2 kernel
                              ///< (transform in registers, packed chunk keys, per-lane score
                              ///< offset, 4 sub-vectors per lane), larger ones the previous one;
                              ///< 2: v2 with 8 sub-vectors per lane, any codebook; 0: the previous
                              ///< kernel. Same codes from all (kept for same-run comparisons).
  // Decode mode over several blocks per token group: dec_slices blocks split the codebook (a
  // side keeps >= 64 centroids per warp, so 4096-entry codebooks use 8, 256-entry ones 1), and
  // the last block of a group merges their answers from this workspace. Null: one block per
  // group. Sizes: best/code 2·dec_ws_jobs·dec_slices·32·max(1, head_dim/128), count 2·dec_ws_jobs
  // zeros (the merging block resets its counter); more jobs than dec_ws_jobs: one block each.
  int dec_slices = 1;
  float* dec_ws_best = nullptr;
  int* dec_ws_code = nullptr;
  int* dec_ws_count = nullptr;
  int64_t dec_ws_jobs = 0;
  // materialize_launch only: the exact window's ring (the sources of window positions)
  const void* k_ring = nullptr;
  const void* v_ring = nullptr;
  int64_t ring_cap = 0;
};
/// Blocks per token group of a decode-mode encode with a workspace (EncodeParams::dec_slices).
constexpr int kEncDecSlices = 8;
/// Sub-vectors a lane of an encode job holds (the kernels' SPL): the fewest, at least
/// `at_least`, for which the job's 32 lanes hold whole tokens of n_sub sub-vectors.
constexpr int encode_lane_slots(int n_sub, int at_least) {
  int s = at_least < 1 ? 1 : at_least;
  while ((32 * s) % n_sub != 0) ++s;
  return s;
}
/// Entries per token group and block of the decode-mode workspace (EncodeParams::dec_ws_best),
/// over 32: the decode kernels' largest SPL at this head_dim (sub_dim 4 or 8).
constexpr int encode_decode_slots(int head_dim) {
  const int a = encode_lane_slots(head_dim / 4, (head_dim / 4 + 31) / 32);
  const int b = encode_lane_slots(head_dim / 8, (head_dim / 8 + 31) / 32);
  return a > b ? a : b;
}
static_assert(encode_decode_slots(64) == 1 && encode_decode_slots(128) == 1 && encode_decode_slots(256) == 2 &&
              encode_decode_slots(96) == 3 && encode_decode_slots(80) == 5);

/// Launches the encode kernel. decode_mode: all warps of a block share one token group and
/// split the codebook scan (latency), else one warp per token group (throughput); in throughput
/// mode sub_dim-4 codebooks with a candidate grid (EncodeParams::k_grid / v_grid) take the grid
/// kernel.
void encode_launch(const EncodeParams& p, bool decode_mode, void* stream);

/// Standard/Stash eviction: the tokens leaving the window on an append of n_new tokens,
/// positions [L − rc, min(L, L + n_new − min(R, rc + n_new))), get their dequantized rows
/// (inverse-transformed keys) written into the linear K̂/V̂ rows. Reads codes from `codes`
/// (ring slot p % code_cap when codes_ring). Uses p.n_new, lengths, codebooks, lambda.
void evict_launch(const EncodeParams& p, void* stream);

/// Dequantizes rows [t0, t0 + n) of the codes of every (batch, kv head) into rows of `dst`
/// (same positions) — used by restore and fetch paths. Keys are inverse-transformed.
void dequant_launch(const EncodeParams& p, int64_t t0, int64_t n, bool keys, void* stream);
/// Prefill over dequantized rows (PrefillRowsMode): every held position p < seq_len[b] of each
/// (batch, kv head) as an exact row into k_win/v_win (slot p, capacity win_cap, storage dtype
/// win_bf16): positions inside the exact window (p >= seq_len[b] - min(residual_length,
/// res_count[b])) copied from the ring k_ring/v_ring (slot p % ring_cap), older ones dequantized
/// from the codes with k_cb/v_cb (keys inverse-transformed: Hadamard, then λ). n_max bounds
/// seq_len (the host's mirror). Keys and values in one launch per sub_dim.
void materialize_launch(const EncodeParams& p, int64_t n_max, void* stream);
/// Which expansion kernel materialize_launch runs: 0 a warp a row (vq_materialize_kernel), 1
/// (the default since run 180) head_dim / 16 lanes a row (vq_materialize_lanes_kernel).
/// Process-wide; returns the previous setting (the tests and the benchmark's A/B).
int set_materialize_lanes(int on);
bool materialize_lanes();

/// Converts/copies new rows [batch, kvh, n_new, head_dim] (any float dtype and strides) into
/// dst [batch, kvh, cap, head_dim] (F16 or BF16) at positions seq_len[b] + i (the fp16 cache).
void append_rows_launch(const DevTensor4& src, int batch, int n_kv_heads, int n_new, int head_dim,
                        void* dst, int dst_bf16, int64_t dst_cap, const int32_t* seq_len, int* error_flag,
                        void* stream, const int* gate = nullptr);

/// The update's input range check, keys and values in one launch (both [d0, d1, d2, d3]): sets
/// flags[0] (keys) / flags[1] (values) = tag (tag != 0; the first failing check's tag stays)
/// when an element is non-finite or |x| > limit. Deferred checks: gate (the same two flags)
/// non-null makes the check a no-op once either flag is set (an earlier queued check failed, so
/// this update is not applied anyway), and host_flags (mapped host memory, may be null) receive
/// the tag too, for the host to read after a stream synchronisation.
void check_range_launch(const DevTensor4& keys, const DevTensor4& values, int64_t d0, int64_t d1, int64_t d2,
                        int64_t d3, float limit, int* flags, void* stream, int tag = 1, const int* gate = nullptr,
                        int* host_flags = nullptr);

/// len[b] += n_new; rc[b] = min(R, rc[b] + n_new) (rc may be null); nothing when gated
/// (EncodeParams::gate).
void advance_lengths_launch(int32_t* seq_len, int32_t* res_count, int batch, int n_new, int R, void* stream,
                            const int* gate = nullptr);
/// Overlapped decode steps (CudaVecInferCache::decode_step, MemoryBound with a window of at least
/// q_len tokens): the new tokens' encode runs on a side stream beside attention. Process-wide
/// switch (default on; off: the serial step, encode then attention) for A/B benchmarks and tests;
/// returns the previous setting. overlapped_steps() counts the steps issued that way.
bool set_overlapped_step(bool allowed);
bool overlapped_step_allowed();
/// Whether steps whose keys and values differ in sub_dim (two encode launches, one per side
/// stream; the defaults d4b12/d8b8) overlap too. Default on since run 95 (run 94: 61.6 vs 68.9 us
/// at 1x131072; with one side stream, runs 91-93, they had gained nothing); off for A/B runs.
/// Since run 99 it also runs those two launches side by side (keys on the cache's stream, values
/// on a side stream, joined before the call returns) in every latency-mode encode outside an
/// overlapped step: update() of few token-heads and the serial step.
bool set_overlap_two_launches(bool allowed);
bool overlap_two_launches();
/// decode_step's range check of k_new/v_new (on by default; off only for the benchmark's
/// same-run A/B of its cost: an unchecked step stores whatever it is given).
bool set_step_input_checks(bool on);
bool step_input_checks();
/// Queries per attention launch of an eager call with more than 16 queries (prefill chunks):
/// 0 (default since run 115) = as many as one grid holds (its row chunks x kv heads within
/// gridDim.y), so a chunk of Q queries is one launch of G·Q/16 row chunks; 16 = one launch per
/// 16 queries (the path before run 115). Decode steps (plan_decode) are unaffected. Process-wide;
/// returns the previous value (A/B benchmarks, tests: a small value forces several launches).
int set_prefill_launch_queries(int queries);
int prefill_launch_queries();
/// A VecInfer cache builds the candidate grid of a sub_dim-4 codebook of more than 256 centroids
/// (on the device, build_encode_grid_on_device) before the throughput-mode update() that brings
/// its throughput-mode encodes to this many token-heads; before that they scan the codebook.
/// Default 2^20 (131072 tokens of 8 kv heads): the build (run 105, H200: 46 ms for 4096
/// centroids, 9 ms for 1024) costs what scanning costs over 1.4 M (d4b12: 25 against 147 M
/// token-heads/s with the grid) and 1.1 M token-heads (d4b10: 88 against 310 M/s), so waiting
/// that long before building keeps a cache within ~2x of the better choice in hindsight
/// whatever it goes on to encode. 0: at the first throughput-mode update. Process-wide; returns
/// the previous value (tests, benchmarks).
int64_t set_grid_build_after(int64_t token_heads);
int64_t grid_build_after();
void note_overlapped_step();
long long overlapped_steps();
/// update() of at most this many token-heads (batch·n_kv_heads·n) encodes in latency mode
/// (encode_launch's decode_mode, codebook slices over several blocks), larger ones in
/// throughput mode; caches with a codebook of more than 256 centroids and no candidate grid
/// (sub_dim 8: d8b12) use 4x this. Default 256;
/// returns the previous value (A/B benchmarks, tests). Run 98 (bench_decode_cuda's update
/// table, one token, 8 kv heads, int8 keys): d4b8 latency mode 15.9 / 19.6 / 27.0 us at 8 / 256 /
/// 512 token-heads against 20.9 / 23.2 / 23.7 in throughput mode; the defaults d4b12/d8b8 with
/// the key codebook scanned 191 vs 231 us at 1024 and 357 vs 332 at 2048; run 103, with its
/// candidate grid: 59.8 vs 94.3 us at 256, 103.7 vs 86.2 at 512.
int set_update_decode_max(int token_heads);
int update_decode_max();
/// The first launch of an overlapped decode step (MemoryBound caches whose window holds the
/// step's tokens): writes the new tokens' exact rows into the window (p.k_win / p.v_win, as the
/// encode kernel would) and copies the lengths (p.seq_len, p.res_count) into snap_len and
/// snap_rc [batch], so that the step's encode, run beside the attention that advances the
/// lengths, reads the lengths as they were before the step.
/// decode steps' range check of k_new/v_new fused into window_rows_launch (flags null: none):
/// an element non-finite or with |x| > limit writes `tag` into flags[0] (keys) / flags[1]
/// (values) (and host_flags, mapped, if given), and nothing is written.
struct StepCheck {
  int* flags = nullptr;
  float limit = 0.0f;
  int tag = 0;
  int* host_flags = nullptr;
};
void window_rows_launch(const EncodeParams& p, int32_t* snap_len, int32_t* snap_rc, void* stream,
                        const StepCheck& chk = {});

}  // namespace veloxquant::cuda
