// veloxquant/kivi.h — a KIVI-style scalar-quantized KV cache, the baseline VecInfer is compared to.
//
// Asymmetric uniform quantization to `bits` bits (2 in the comparisons) with an fp16 scale and
// an fp16 minimum ("zero") per group:
//   keys    per channel: a group is G consecutive tokens of one (batch, kv head, channel);
//   values  per token:   a group is G consecutive channels of one (batch, kv head, token).
// q = clamp(round((x − zero) / scale), 0, 2^bits − 1), x̂ = q·scale + zero, with scale and zero
// rounded to fp16 before encoding (so encoding sees what decoding will). scale = (max − min) /
// (2^bits − 1); a constant group gets scale 0 and decodes exactly to its (fp16) value.
//
// Residual window, the same semantics as VecInferKVCache: residual_count = min(residual_length,
// residual_count + n_new) on append, max(0, residual_count − n) on trim, and the window is the
// positions [offset − residual_count, offset), kept exact (rounded to fp16). Outside it:
//   values  a token is quantized as soon as it leaves the window;
//   keys    tokens are grouped by absolute position into blocks [g·G, (g+1)·G); a block is
//           quantized once all of its tokens have left the window, so between residual_count and
//           residual_count + G − 1 of the newest keys are fp16 (KIVI's own policy; it favours KIVI
//           slightly and its bytes are counted).
// Quantization reads the fp16-rounded rows. trim() into a quantized key block moves that block's
// surviving rows back to the fp16 part as their dequantized values rounded to fp16 (what attention
// saw, up to that rounding); the block is quantized again (from those values) once it has left
// the window again. Everything else kept is unchanged by a trim.
//
// Bits per element, KIVI's own count: bits + 32/G (b2g32 → 3.0, b2g128 → 2.25).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "veloxquant/cache.h"

namespace veloxquant {

struct KiviConfig {
  int head_dim = 128;
  int n_kv_heads = 0;         ///< 0: from the first update
  int bits = 2;               ///< 1..8
  int group_size = 128;       ///< G, tokens per key group and channels per value group
  int residual_length = 128;  ///< newest tokens kept exact (0: none)
  int n_threads = 0;          ///< CPU threads for fused_sdpa; 0: default_threads()
  /// Throws ValueError naming the field (bits outside 1..8, group_size < 1, head_dim not a
  /// multiple of group_size for values, ...).
  void validate() const;
  /// bits + 32 / group_size (the fp16 scale and zero per group).
  double bits_per_element() const { return bits + 32.0 / group_size; }
  std::string str() const;  ///< "b2g128"
};

/// The cache. CPU only. fetch returns the dequantized history; fused_sdpa dequantizes into
/// f32 scratch and runs attention_cpu (it is a quality baseline, not a fast kernel).
class KiviKVCache final : public KVCache {
 public:
  explicit KiviKVCache(const KiviConfig& config);
  ~KiviKVCache() override;

  std::pair<Tensor, Tensor> update_and_fetch(const TensorView& keys, const TensorView& values) override;
  void update(const TensorView& keys, const TensorView& values) override;
  Tensor fused_sdpa(const TensorView& queries, const SdpaParams& params) const override;
  void fused_sdpa_into(const TensorView& queries, const TensorView& out,
                       const SdpaParams& params) const override;

  int64_t offset() const override { return offset_; }
  int64_t trim(int64_t n) override;

  /// "keys", "values": the dequantized history (f32) — KIVI state is not round-tripped
  /// bit-exactly; set_state/restore throw UnsupportedError.
  CacheState state() const override;
  void set_state(const CacheState& state) override;
  CacheMetaState meta_state() const override;
  void set_meta_state(const CacheMetaState& meta) override;
  void restore(const CacheState& state, const CacheMetaState& meta) override;

  /// Bytes held: packed codes, fp16 scales/zeros, the fp16 exact part (no capacity slack).
  int64_t nbytes() const override;
  std::string class_name() const override { return "KiviKVCache"; }
  std::string describe() const override;
  /// A KVCacheConfig carrying the shared fields (head_dim, n_kv_heads, residual_length,
  /// n_threads; kind FP16 storage semantics). Use kivi_config() for the KIVI fields.
  const KVCacheConfig& config() const override { return base_config_; }
  const KiviConfig& kivi_config() const { return config_; }

  /// What attention sees, f32 [batch, n_kv_heads, offset, head_dim].
  Tensor dequantized_keys_f32() const;
  Tensor dequantized_values_f32() const;
  int64_t quantized_key_tokens() const { return n_qkeys_; }    ///< keys held as codes
  int64_t quantized_value_tokens() const { return n_qvalues_; }///< values held as codes
  int64_t residual_count() const { return residual_count_; }

 private:
  struct Impl;
  void check_kv(const TensorView& keys, const TensorView& values) const;
  void requantize();

  KiviConfig config_;
  KVCacheConfig base_config_;
  int64_t offset_ = 0;
  int64_t residual_count_ = 0;
  int64_t n_qkeys_ = 0;
  int64_t n_qvalues_ = 0;
  std::unique_ptr<Impl> impl_;
};

/// Scalar oracle: quantize+dequantize one group of n values (strided) asymmetrically to
/// `bits` bits with fp16 scale and zero. Writes x̂ into out (same stride).
void kivi_quantize_group_ref(const float* x, int64_t n, int64_t stride, int bits, float* out);

}  // namespace veloxquant
