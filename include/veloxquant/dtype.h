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

}  // namespace veloxquant
