// veloxquant/safetensors.h — a general reader and writer for the safetensors format.
//
// The format (the one Hugging Face and MLX use):
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a UTF-8 JSON object, possibly padded with trailing spaces:
//                { "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//                  ...,
//                  "__metadata__": {"<key>": "<string value>", ...} }        (optional)
//   [rest]     the data region; a tensor's bytes are data[begin, end) (offsets relative to
//              the start of the data region), row-major, little-endian.
//
// Reading validates everything before a view is handed out (FormatError naming the tensor):
// the header length is bounded (kSafetensorsMaxHeaderBytes) and fits in the file; the header
// is a JSON object (nesting depth bounded, no duplicate names); every dtype is one of the
// format's names; shape × element size == end − begin without overflow; 0 <= begin <= end <=
// data size; no two tensors overlap; __metadata__ maps strings to strings. Holes between
// tensors are accepted (the Python package rejects them; our writer never makes them).
//
// SafetensorsFile::open memory-maps the file (zero copy: tensor() returns a view into the
// mapping; a tensor whose bytes are not aligned to its element size is copied once into an
// aligned buffer owned by the file object). The writer orders tensors by element size
// (largest first) and pads the header with spaces, so every tensor starts at a multiple of
// its element size and the data region starts at a multiple of 8; the files it writes are
// readable by Python's `safetensors` package.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "veloxquant/tensor.h"

namespace veloxquant {

/// Upper bound on the JSON header length N (the Python package uses the same 100 MB limit).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
/// Upper bound on nesting depth inside the JSON header (a valid header needs 3).
constexpr int kSafetensorsMaxJsonDepth = 16;

/// One tensor entry of a header.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_str;       ///< as written: "F32", "BF16", "I8", "BOOL", ...
  std::optional<DType> dtype;  ///< set when veloxquant has the dtype (F32 F16 BF16 U8 U16 U32 I32 I64)
  int element_size = 0;        ///< bytes per element of dtype_str
  Shape shape;                 ///< any rank (views need rank <= kMaxDims)
  uint64_t begin = 0;          ///< byte offset into the data region
  uint64_t end = 0;            ///< one past the last byte
  uint64_t nbytes() const { return end - begin; }
};

/// A parsed and validated header.
struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;     ///< sorted by data offset (file order)
  std::map<std::string, std::string> metadata;    ///< __metadata__ (empty if absent)
  uint64_t header_bytes = 0;                      ///< N
  uint64_t data_start = 0;                        ///< 8 + N: file offset of the data region
  uint64_t data_bytes = 0;                        ///< size of the data region
};

/// Parses and validates the header of a safetensors image held in memory (`size` bytes at
/// `data`, the whole file). Reads nothing outside [data, data + size). Throws FormatError
/// (never crashes) on any malformed input. Used by SafetensorsFile and the fuzzer.
SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size);

/// Element size of a safetensors dtype string ("F32" → 4, "BOOL" → 1, ...); 0 if unknown.
int safetensors_dtype_size(const std::string& dtype_str);
/// The safetensors name of a veloxquant dtype ("F32", "F16", "BF16", "U8", ...).
const char* safetensors_dtype_name(DType t);

/// A read-only safetensors file: memory-mapped (open) or an owned in-memory copy (from_bytes).
/// Copies share the mapping; views stay valid while any copy of the object lives.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  /// Memory-maps and validates `path`. Throws IoError (cannot open / map) or FormatError.
  static SafetensorsFile open(const std::string& path);
  /// Validates a copy of the `size` bytes at `data`.
  static SafetensorsFile from_bytes(const uint8_t* data, size_t size);
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes);

  bool is_open() const { return impl_ != nullptr; }
  const std::string& path() const;  ///< "" for in-memory files
  uint64_t file_size() const;
  const SafetensorsHeader& header() const;
  /// Tensor names in file order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  /// Entry of `name`; throws FormatError "no tensor named ..." when absent.
  const SafetensorsTensorInfo& info(const std::string& name) const;
  /// Zero-copy CPU view of `name` (contiguous). Throws FormatError when absent, when its
  /// dtype has no veloxquant equivalent, or when its rank exceeds kMaxDims.
  TensorView tensor(const std::string& name) const;
  /// The tensor converted to f32 (any float dtype), copied.
  std::vector<float> read_f32(const std::string& name) const;
  /// __metadata__.
  const std::map<std::string, std::string>& metadata() const;
  /// A metadata value, or nullopt.
  std::optional<std::string> metadata_value(const std::string& key) const;
  /// Raw bytes of a tensor (any dtype, including those without a veloxquant DType).
  const uint8_t* raw_data(const std::string& name) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// A named tensor to write. The view must be on the CPU; any strides (copied contiguously).
using NamedTensor = std::pair<std::string, TensorView>;

/// Serialises tensors and metadata into a safetensors image. Throws ValueError on empty or
/// duplicate names, the reserved name "__metadata__", or non-CPU views.
std::vector<uint8_t> serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});
/// Writes the image to `path` (through a temporary file renamed into place, so a failed
/// write never leaves a half-written file under `path`). Throws IoError when it cannot.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace veloxquant
