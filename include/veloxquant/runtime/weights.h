// veloxquant/runtime/weights.h — the tensors of a Hugging Face checkpoint, memory-mapped.
//
// A model directory holds either one `model.safetensors` or shards listed by
// `model.safetensors.index.json` ({"weight_map": {"<tensor name>": "<shard file>", ...}}).
// Every file is memory-mapped through SafetensorsFile (zero copy); views stay valid while the
// WeightStore lives. Lookups validate name, dtype and shape and throw FormatError naming the
// tensor and the expected and actual shapes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "veloxquant/runtime/ops.h"
#include "veloxquant/safetensors.h"
#include "veloxquant/tensor.h"

namespace veloxquant::runtime {

class WeightStore {
 public:
  WeightStore() = default;
  /// Opens the safetensors file(s) of `dir` (single or sharded). Throws IoError when neither
  /// model.safetensors nor model.safetensors.index.json exists, FormatError on a malformed
  /// index or a shard that lacks a tensor the index assigns to it.
  static WeightStore open(const std::filesystem::path& dir);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// Zero-copy view of a tensor (FormatError "no tensor named ..." when absent).
  TensorView tensor(const std::string& name) const;
  /// A float matrix [rows, cols] (f32, f16 or bf16), checked against the expected shape.
  WeightView matrix(const std::string& name, int64_t rows, int64_t cols) const;
  /// A float vector [n] converted to f32, checked against the expected size.
  std::vector<float> vector_f32(const std::string& name, int64_t n) const;
  /// All tensor names, sorted.
  std::vector<std::string> names() const;
  /// Number of files mapped (1, or the number of shards).
  size_t n_files() const { return files_.size(); }
  /// Total bytes of tensor data across the files.
  uint64_t total_bytes() const;
  /// The dtype most tensors have ("bf16"), for display.
  std::string dominant_dtype() const;

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

}  // namespace veloxquant::runtime
