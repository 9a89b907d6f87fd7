// veloxquant/calibrate.h — calibration: KV samples in, a codebook artifact out.
//
// Input is an in-memory KVSamples (per-layer keys and values); where they come from is the
// caller's business: a samples file (KVSamples::load, docs/kv-samples.md), the synthetic
// generator (synthetic.h) or a model run (the runtime fills a KVSamples the same way).
//
// Per layer: λ = compute_smooth_factors(keys, α); keys → KeyTransform (÷λ, Hadamard); the
// key codebook = k-means over every key_sub_dim sub-vector of the transformed keys (all heads
// and positions pooled, subsampled to max_points_per_centroid·2^bits); the value codebook =
// k-means over raw value sub-vectors. Then the reconstruction errors are measured (relative
// MSE ||x − x̂||² / ||x||², keys in their ORIGINAL space after the inverse transform) on up
// to max_eval_vectors head vectors, together with the same k-means on untransformed keys
// (the "without transforms" column) when requested.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "veloxquant/artifact.h"
#include "veloxquant/pq.h"
#include "veloxquant/smooth.h"
#include "veloxquant/tensor.h"

namespace veloxquant {

/// Per-layer calibration keys and values.
struct KVSamples {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  std::vector<Tensor> keys;    ///< per layer, f32 [n_tokens, n_kv_heads, head_dim] (post-RoPE)
  std::vector<Tensor> values;  ///< per layer, f32 [n_tokens, n_kv_heads, head_dim]
  std::string source;          ///< description recorded in the artifact

  /// Shapes agree (same n_kv_heads/head_dim everywhere, keys and values of a layer have the
  /// same n_tokens > 0), values finite. Throws ShapeError/ValueError naming the layer.
  void validate() const;
  int64_t n_tokens(int layer) const { return keys.at(size_t(layer)).dim(0); }
  int64_t max_tokens() const;

  /// Reads `layers.{i}.keys` / `layers.{i}.values` (F32, F16 or BF16; [n_tokens, n_kv_heads,
  /// head_dim], or [1, n_kv_heads, n_tokens, head_dim] as caches hold them) for i = 0, 1, ...
  /// until a layer is missing. max_tokens > 0 keeps only the first max_tokens tokens.
  /// Throws IoError / FormatError naming the tensor.
  static KVSamples load(const std::string& path, int64_t max_tokens = 0);
  /// Writes the layout load() reads (F32 or F16), with __metadata__ "source".
  void save(const std::string& path, DType dtype = DType::F32) const;
};

/// What a progress callback is told.
struct CalibrationProgress {
  int layer = 0;
  int n_layers = 0;
  std::string stage;    ///< "smooth", "keys", "values", "keys (no transform)", "evaluate", "done"
  int iter = 0;         ///< k-means iteration within the stage
  int n_iter = 0;       ///< k-means iterations planned for the stage
  double fraction = 0;  ///< of the whole layer, in [0, 1]
};

struct CalibrationParams {
  PQSpec key_spec{4, 12};
  PQSpec value_spec{8, 8};
  float alpha = 0.5f;
  bool use_smooth = true;
  bool use_hadamard = true;
  int niter = 30;                    ///< k-means iterations (at most)
  uint64_t seed = 1234;
  int max_points_per_centroid = 64;  ///< k-means training subsample: 2^bits · this points
  int64_t max_eval_vectors = 8192;   ///< head vectors used to measure errors (0: all)
  bool measure_untransformed = true; ///< also train/measure keys without the transforms
  /// The trained key codebook snapped to its int8 grid (snap_to_int8_grid) before it is measured
  /// and written, as the caches use it by default (KVCacheConfig::int8_key_grid): the reported
  /// key error is then the one the caches get. false writes the k-means result as it is.
  bool int8_key_grid = true;
  int n_threads = 0;                 ///< 0: default_threads()
  std::function<void(const CalibrationProgress&)> on_progress;
};

/// Per-layer outcome.
struct LayerCalibrationReport {
  int layer = 0;
  double key_error = 0;                 ///< relative MSE, transforms as configured
  double value_error = 0;               ///< relative MSE (values are never transformed)
  double key_error_untransformed = -1;  ///< relative MSE of the same VQ on raw keys (-1: not measured)
  int64_t n_train_key_subvectors = 0;
  int64_t n_train_value_subvectors = 0;
  double seconds = 0;
};

struct CalibrationResult {
  Artifact artifact;
  std::vector<LayerCalibrationReport> layers;
  double seconds = 0;
};

/// Calibrates every layer of `samples` (validated first). Deterministic for a seed.
CalibrationResult calibrate(const KVSamples& samples, const CalibrationParams& params);

/// Relative MSE Σ||x − x̂||² / Σ||x||² of head vectors x [n, head_dim] quantized with
/// `pq` (its codebook set), optionally through `transform` (keys: encode the transformed
/// vector, measure after the inverse transform). kv_head_of_row(i) = i % n_kv_heads when the
/// rows are [n_tokens, n_kv_heads] flattened.
double pq_relative_error(const ProductQuantizer& pq, const float* x, int64_t n, int n_kv_heads,
                         const KeyTransform* transform, int n_threads = 0);

}  // namespace veloxquant
