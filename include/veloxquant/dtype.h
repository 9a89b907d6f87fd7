// veloxquant/dtype.h — element types, devices and the scalar fp16/bf16 conversions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace veloxquant {

/// Element type of a tensor. Float inputs may be F16, BF16 or F32.
enum class DType : uint8_t { F32, F16, BF16, U8, U16, U32, I32, I64 };

/// Bytes per element.
constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::U8: return 1;
    case DType::U16: return 2;
    case DType::U32: return 4;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}
/// "f32", "f16", "bf16", "u8", ...
const char* dtype_name(DType t);
/// Parses the names above (and "float16", "bfloat16", "float32"); throws ValueError otherwise.
DType dtype_from_name(const std::string& name);
constexpr bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

enum class DeviceType : uint8_t { CPU, CUDA };
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  ///< CUDA ordinal; 0 for the CPU
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
};
std::string device_name(Device d);  ///< "cpu", "cuda:0"

// ---- scalar conversions (IEEE binary16 and bfloat16, round to nearest even) ----
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3FFu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx >= 0x7F800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7C00u | (absx > 0x7F800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // underflow to zero
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // half subnormal mantissa = m >> shift
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ((absx >> 13) - (112u << 10));
  const uint32_t rem = absx & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7FFFu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

/// Rounds a float through fp16 and back (what storing it in an fp16 buffer does).
inline float round_to_half(float f) { return half_to_float(float_to_half(f)); }

// ---- OCP FP8 E4M3 (bias 7, no infinities, 0x7F/0xFF = NaN, largest finite 448) ----
// Used for the codebooks the CUDA attention kernel reads (CodebookFormat::E4M3), stored as
// round_e4m3(c·s) with a power-of-two scale s (e4m3_codebook_scale) that the kernel undoes.

/// The value of an E4M3 byte (exact in float).
inline float e4m3_to_float(uint8_t b) {
  const bool neg = (b & 0x80u) != 0;
  const int e = (b >> 3) & 0xF, m = b & 0x7;
  if (e == 0xF && m == 0x7) return neg ? -__builtin_nanf("") : __builtin_nanf("");
  // subnormals: m · 2^-9; normals: (8 + m) · 2^(e − 10)
  const float v = e == 0 ? float(m) * (1.0f / 512.0f) : float(8 + m) * __builtin_ldexpf(1.0f, e - 10);
  return neg ? -v : v;
}

/// Round to nearest even, saturating to ±448 (PTX cvt.rn.satfinite.e4m3x2 semantics); NaN → 0x7F.
inline uint8_t float_to_e4m3(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return 0x7F;
  if (ax >= 0x43E00000u) return uint8_t(sign | 0x7E);  // >= 448 (and inf): the largest finite
  const int e = int(ax >> 23) - 127;                   // unbiased exponent (-127: zero/subnormal)
  // quantum of the target: 2^-9 below 2^-6 (subnormals), else 2^(e − 3)
  const int qexp = e < -6 ? -9 : e - 3;
  float a;
  std::memcpy(&a, &ax, 4);
  const float q = __builtin_ldexpf(a, -qexp);  // exact: a power-of-two scaling
  // round half to even on the integer grid
  float r = __builtin_floorf(q);
  const float frac = q - r;
  if (frac > 0.5f || (frac == 0.5f && __builtin_fmodf(r, 2.0f) != 0.0f)) r += 1.0f;
  uint32_t code;
  if (qexp == -9) {
    code = uint32_t(r);  // 0..8; 8 is the smallest normal (exponent field 1, mantissa 0)
  } else {
    // r in [8, 16]: 16 carries into the next binade
    int ee = e, mm = int(r) - 8;
    if (mm == 8) ++ee, mm = 0;
    code = uint32_t((ee + 7) << 3 | mm);
    if (code > 0x7Eu) code = 0x7E;
  }
  return uint8_t(sign | code);
}

/// The power of two s that maps a codebook of largest magnitude max_abs into [224, 448]
/// (E4M3's top binade), so every centroid stays clear of its subnormals; 1 for 0 or non-finite.
inline float e4m3_codebook_scale(float max_abs) {
  if (!(max_abs > 0.0f) || !(max_abs < 3.0e38f)) return 1.0f;
  if (448.0f / max_abs >= 0x1p126f) return 0x1p126f;  // a degenerate, all-but-zero codebook
  int e = 0;
  (void)__builtin_frexpf(448.0f / max_abs, &e);  // 448/max = f·2^e, f in [0.5, 1)
  const float s = __builtin_ldexpf(1.0f, e - 1);
  return max_abs * s <= 448.0f ? s : s * 0.5f;
}

}  // namespace veloxquant
