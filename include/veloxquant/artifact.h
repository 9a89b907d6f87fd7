// veloxquant/artifact.h — the codebook artifact: what calibration produces and caches load.
//
// One safetensors file (docs/artifact-format.md) holding, per layer i,
//   layers.{i}.smooth_factors   F32 [n_kv_heads, head_dim]            λ (all ones: no smoothing)
//   layers.{i}.key_codebook     F32 [2^key_bits, key_sub_dim]         trained on transformed keys
//   layers.{i}.value_codebook   F32 [2^value_bits, value_sub_dim]     trained on raw values
// and __metadata__ with the format name and version, the configurations, α, the shapes, the
// key transform, a description of the calibration data and the reconstruction errors.
// Loading validates every field and tensor (FormatError naming it) before returning.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "veloxquant/cache.h"
#include "veloxquant/pq.h"

namespace veloxquant {

constexpr const char* kArtifactFormatName = "veloxquant-artifact";
constexpr int kArtifactFormatVersion = 1;
/// Bounds the loader accepts (far above any real model; they keep a corrupt header from
/// requesting absurd allocations).
constexpr int kArtifactMaxLayers = 4096;
constexpr int kArtifactMaxKvHeads = 4096;
constexpr int kArtifactMaxHeadDim = 4096;

/// The per-layer tensors.
struct ArtifactLayer {
  std::vector<float> smooth_factors;  ///< λ [n_kv_heads, head_dim], > 0, finite
  std::vector<float> key_codebook;    ///< [2^key_bits, key_sub_dim], finite
  std::vector<float> value_codebook;  ///< [2^value_bits, value_sub_dim], finite
  double key_error = -1;              ///< relative MSE of keys after training (original space); -1 unknown
  double value_error = -1;            ///< relative MSE of values after training; -1 unknown
};

/// A complete artifact. Construct, fill, validate(), save(); or load().
struct Artifact {
  int format_version = kArtifactFormatVersion;
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  PQSpec key_spec{4, 12};    ///< key sub_dim and codebook_bits
  PQSpec value_spec{8, 8};   ///< value sub_dim and codebook_bits
  float alpha = 0.5f;        ///< smooth exponent used for λ
  bool use_smooth = true;    ///< λ applied to keys (false: λ stored as ones)
  bool use_hadamard = true;  ///< Hadamard rotation applied to keys before quantization
  int64_t calib_tokens = 0;  ///< tokens of calibration data per layer (max over layers)
  std::string calib_source;  ///< free text: file path, "synthetic seed=...", model name
  std::vector<ArtifactLayer> layers;  ///< [n_layers]
  /// Extra string metadata carried through save/load (keys must not clash with ours).
  std::map<std::string, std::string> extra;

  /// Checks counts, specs, tensor sizes, finiteness, λ > 0 (FormatError naming the field).
  void validate() const;
  /// The `__metadata__` map written to the file.
  std::map<std::string, std::string> metadata() const;

  /// Serialises (validates first).
  std::vector<uint8_t> serialize() const;
  void save(const std::string& path) const;
  /// Loads and validates. IoError when unreadable; FormatError for anything malformed:
  /// unknown format or version, missing/extra/mis-shaped tensors, bad metadata, non-finite values.
  static Artifact load(const std::string& path);
  /// Loads from an in-memory image (the fuzzer's entry).
  static Artifact from_bytes(const uint8_t* data, size_t size);

  /// Mean key / value reconstruction error over layers (-1 when unknown).
  double mean_key_error() const;
  double mean_value_error() const;
};

/// The VecInfer cache configuration of `layer`: kind VecInfer, head_dim, n_kv_heads, the
/// key/value specs, λ (absent when the artifact does not smooth), both codebooks and
/// use_hadamard from the artifact; every other field (mode flags, residual_length, device,
/// threads, storage dtype, ...) from `base`. Throws ValueError for a layer out of range.
KVCacheConfig artifact_cache_config(const Artifact& artifact, int layer, KVCacheConfig base = {});

/// KVCacheFactory::create(artifact_cache_config(artifact, layer, base)).
std::unique_ptr<KVCache> create_cache_from_artifact(const Artifact& artifact, int layer,
                                                    const KVCacheConfig& base = {});

}  // namespace veloxquant
