// veloxquant/pq.h — product vector quantization of head vectors against one shared codebook.
//
// A head vector of head_dim floats is cut into n_sub = head_dim / sub_dim sub-vectors; each
// is replaced by the codebook_bits-bit index of its nearest centroid (squared L2, ties to the
// lowest index). As in the paper, one codebook of n_centroids = 2^codebook_bits entries is
// shared by every sub-vector position (and every head) of a layer.
//
// Code layout: the n_sub indices of one vector are bit-packed LSB-first into a byte row:
// index i occupies bits [i·codebook_bits, (i+1)·codebook_bits) of the row, and the row is
// padded to whole bytes (code_bytes = ceil(n_sub·codebook_bits / 8)). A 12-bit code costs
// 12 bits; for d4b12 at head_dim 128 a row is exactly 48 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace veloxquant {

/// A (sub_dim, codebook_bits) pair, written "d4b8".
struct PQSpec {
  int sub_dim = 4;        ///< dsub: elements per sub-vector, 1..16
  int codebook_bits = 8;  ///< bits per code, 1..16
  /// Parses "d4b8" (throws ValueError naming the string).
  static PQSpec parse(const std::string& s);
  std::string str() const;  ///< "d4b8"
  double bits_per_element() const { return double(codebook_bits) / sub_dim; }
  bool operator==(const PQSpec&) const = default;
};

/// Bytes of one packed row of `n_codes` codes of `bits` each.
inline int64_t packed_row_bytes(int64_t n_codes, int bits) { return (n_codes * bits + 7) / 8; }

/// Packs n_rows rows of n_codes indices (each < 2^bits) into rows of packed_row_bytes bytes.
/// @param idx [n_rows, n_codes]  @param out [n_rows, packed_row_bytes(n_codes, bits)]
void pack_codes(const uint32_t* idx, int64_t n_rows, int64_t n_codes, int bits, uint8_t* out);
/// Inverse of pack_codes.
void unpack_codes(const uint8_t* packed, int64_t n_rows, int64_t n_codes, int bits, uint32_t* idx);
/// Reads code i of one packed row.
inline uint32_t read_code(const uint8_t* row, int64_t i, int bits) {
  const int64_t bit = i * bits;
  const uint8_t* p = row + (bit >> 3);
  const int shift = int(bit & 7);
  uint32_t w = p[0];
  if (shift + bits > 8) w |= uint32_t(p[1]) << 8;
  if (shift + bits > 16) w |= uint32_t(p[2]) << 16;
  return (w >> shift) & ((1u << bits) - 1u);
}

/// The quantizer: shapes, the codebook, and encode / decode / lookup tables.
struct ProductQuantizer {
  int head_dim = 0;       ///< d: elements per vector
  int sub_dim = 0;        ///< dsub
  int codebook_bits = 0;  ///< nbits
  int n_sub = 0;          ///< M = head_dim / sub_dim (derived)
  int n_centroids = 0;    ///< ksub = 2^codebook_bits (derived)
  int64_t code_bytes = 0; ///< bytes per packed vector (derived)
  std::vector<float> codebook;  ///< [n_centroids, sub_dim]
  std::vector<float> centroid_norms;  ///< [n_centroids] ||c||², derived from the codebook
  /// The codebook as int8 steps, codebook[i] == codebook_i8[i]·codebook_i8_scale exactly, when
  /// it lies on its int8 grid (make_i8_codebook(codebook).decoded == codebook, as
  /// snap_to_int8_grid leaves it: the caches' key codebooks by default); empty otherwise.
  /// Derived by set_codebook, like centroid_norms. The CPU attention's dequantizing key scores
  /// gather these rows, 4x smaller than the floats (a d4b12 codebook: 16 KiB, L1-resident).
  std::vector<int8_t> codebook_i8;
  float codebook_i8_scale = 0.0f;

  ProductQuantizer() = default;
  /// Validates head_dim % sub_dim == 0, bits in 1..16, sub_dim in 1..16 (ValueError naming
  /// them) and, if given, codebook.size() == n_centroids·sub_dim (ShapeError).
  ProductQuantizer(int head_dim, PQSpec spec, std::vector<float> codebook = {});
  PQSpec spec() const { return {sub_dim, codebook_bits}; }
  /// Replaces the codebook (size-checked) and recomputes the derived norms.
  void set_codebook(std::vector<float> cb);
  /// A random codebook (Gaussian, seeded) — for tests only.
  void set_random_codebook(uint64_t seed, float stddev = 1.0f);

  /// Nearest-centroid codes. @param x [n, head_dim] @param codes [n, code_bytes]
  void encode(const float* x, int64_t n, uint8_t* codes, int n_threads = 1) const;
  /// Reconstruction. @param codes [n, code_bytes] @param x [n, head_dim]
  void decode(const uint8_t* codes, int64_t n, float* x) const;
  /// Per-query lookup table lut[m][c] = q_sub_m · codebook[c]. @param q [head_dim]
  /// @param lut [n_sub, n_centroids]
  void compute_lut(const float* q, float* lut) const;
  /// Bytes of the codebook stored as fp16 (what the paper counts).
  int64_t codebook_bytes_f16() const { return int64_t(n_centroids) * sub_dim * 2; }
};

/// A codebook as the CUDA attention kernels hold it with CodebookFormat::E4M3: bytes =
/// float_to_e4m3(c · scale), scale = e4m3_codebook_scale(max |c|) (a power of two), and the
/// centroids those bytes stand for, decoded = e4m3_to_float(byte) / scale (exact) — what the
/// kernel's attention is computed with, so the oracle for it.
struct E4M3Codebook {
  std::vector<uint8_t> bytes;
  float scale = 1.0f;
  std::vector<float> decoded;
};
/// ValueError if the codebook holds a non-finite value.
E4M3Codebook make_e4m3_codebook(const std::vector<float>& codebook);

/// A key codebook as the CUDA attention kernels hold it with CodebookFormat::I8: bytes =
/// int8 round-to-nearest-even(c / scale) clamped to ±127, scale = max |c| / 127 (1 for an
/// all-zero codebook), and decoded = byte · scale — the centroids the kernel scores with.
struct I8Codebook {
  std::vector<int8_t> bytes;
  float scale = 1.0f;
  std::vector<float> decoded;
};
/// ValueError if the codebook holds a non-finite value.
I8Codebook make_i8_codebook(const std::vector<float>& codebook);
/// The codebook moved onto the grid make_i8_codebook rounds to: every entry an integer multiple
/// n·s (|n| <= 127) of one scale s = max |c| / 127, so that CodebookFormat::I8 holds it exactly and
/// the CUDA kernels' int8 key scores use the very centroids the CPU cache encodes and decodes with
/// (KVCacheConfig::int8_key_grid). The rounding moves an entry by at most s/2: about 0.4% of the
/// codebook's range, far below the quantization error itself (docs/cuda-kernels.md, "Int8 keys").
/// A fixed point: snapping a snapped codebook returns it bit for bit. ValueError if an entry is
/// not finite.
std::vector<float> snap_to_int8_grid(const std::vector<float>& codebook);
/// The bytes in offset binary (byte + 128, 1..255): the layout the CUDA attention kernel reads
/// int8 value centroids in (CodebookFormat::I8KV widens u to the fp16 1024 + u exactly).
std::vector<uint8_t> i8_offset_binary(const I8Codebook& cb);

// Scalar oracles (src/ref/pq_ref.cpp): plain loops, never tuned.
void pq_encode_ref(const ProductQuantizer& pq, const float* x, int64_t n, uint8_t* codes);
void pq_decode_ref(const ProductQuantizer& pq, const uint8_t* codes, int64_t n, float* x);
void pq_compute_lut_ref(const ProductQuantizer& pq, const float* q, float* lut);
void pack_codes_ref(const uint32_t* idx, int64_t n_rows, int64_t n_codes, int bits, uint8_t* out);

}  // namespace veloxquant
