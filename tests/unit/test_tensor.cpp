// Tensor views, owning tensors, DLPack conversion and the scalar fp16/bf16 conversions.
// Tolerance tier: exact (conversions are checked bit for bit against the hardware
// conversion where the CPU has one, and against an independent double-precision rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "veloxquant/error.h"
#include "veloxquant/tensor.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

using namespace veloxquant;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent oracle: round a finite float to the nearest binary16 (ties to even) by searching
// the two neighbouring representable values in double precision.
uint16_t half_oracle(float f) {
  if (std::isnan(f)) return 0x7E00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return sign | 0x7C00;
  // enumerate: the largest half <= a, then compare with the next one
  uint16_t lo = 0;
  for (int step = 1 << 14; step; step >>= 1)
    if (lo + step <= 0x7BFF && double(half_to_float(uint16_t(lo + step))) <= a) lo = uint16_t(lo + step);
  const double vlo = half_to_float(lo);
  if (vlo == a) return sign | lo;
  const uint16_t hi = uint16_t(lo + 1);
  const double vhi = hi == 0x7C00 ? 65536.0 : double(half_to_float(hi));
  const double dlo = a - vlo, dhi = vhi - a;
  if (dlo < dhi) return sign | lo;
  if (dhi < dlo) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

}  // namespace

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(uint16_t(h));
    const bool nan = ((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF);
    if (nan) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
    } else {
      ASSERT_EQ(float_to_half(f), h) << "half 0x" << std::hex << h << " -> " << f;
    }
  }
  EXPECT_EQ(half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
}

TEST(Half, FloatToHalfRoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_real_distribution<float> expo(-27.0f, 17.0f);
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    // half of the samples: random bit patterns restricted to the half range; the rest:
    // values sitting exactly on or next to a rounding midpoint
    float f;
    if (i % 2 == 0) {
      f = std::ldexp(1.0f + float(any(rng) & 0xFFFFFF) / 16777216.0f, int(expo(rng)));
      if (any(rng) & 1) f = -f;
    } else {
      const uint16_t h = uint16_t(any(rng) % 0x7BFF);
      const float a = half_to_float(h), b = half_to_float(uint16_t(h + 1));
      const float mid = float((double(a) + double(b)) / 2.0);
      const int which = int(any(rng) % 3);
      f = which == 0 ? mid : float_of(bits_of(mid) + (which == 1 ? 1u : uint32_t(-1)));
    }
    const uint16_t got = float_to_half(f);
    ASSERT_EQ(got, half_oracle(f)) << "f = " << f << " (0x" << std::hex << bits_of(f) << ")";
#if defined(__F16C__)
    ASSERT_EQ(got, uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))) << "f = " << f;
#endif
    ++checked;
  }
  EXPECT_EQ(checked, 200000);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(float_to_half(65519.0f), 0x7BFF);  // just below the overflow midpoint
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // the midpoint rounds to even: infinity
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
}

TEST(BFloat16, RoundsToNearestEvenAndKeepsNaN) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = any(rng);
    const float f = float_of(u);
    const uint16_t b = float_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(b)));
      continue;
    }
    // oracle: the two bf16 neighbours by truncation, pick the nearer (ties to even) in double
    const uint16_t lo = uint16_t(u >> 16), hi = uint16_t(lo + 1);
    const double a = std::fabs(double(f)), vlo = std::fabs(double(bf16_to_float(lo)));
    // past the largest finite value the next step up is 2^128 (rounding as if the exponent
    // were unbounded, which is what makes values past the midpoint overflow to infinity)
    const double vhi = (hi & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128) : std::fabs(double(bf16_to_float(hi)));
    uint16_t want;
    if ((u & 0xFFFF) == 0) want = lo;
    else if (a - vlo < vhi - a) want = lo;
    else if (vhi - a < a - vlo) want = hi;
    else want = (lo & 1) ? hi : lo;
    ASSERT_EQ(b, want) << "f = " << f << " bits 0x" << std::hex << u;
  }
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
}

TEST(TensorView, ContiguityStridesAndElementAccess) {
  std::vector<float> x(2 * 3 * 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  TensorView v(x.data(), DType::F32, {2, 3, 4});
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.nbytes(), 96);
  EXPECT_EQ(v.shape_string(), "[2, 3, 4]");
  EXPECT_EQ(v.get_f32(13), 13.0f);
  // a transposed view [4, 3, 2] of the same memory
  TensorView t(x.data(), DType::F32, {4, 3, 2}, {1, 4, 12});
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.get_f32(0 * 6 + 2 * 2 + 1), x[1 * 12 + 2 * 4 + 0]);
  EXPECT_EQ(*static_cast<float*>(t.at({3, 1, 1})), x[1 * 12 + 1 * 4 + 3]);
  // copy_into converts dtypes and layouts
  Tensor h = Tensor::copy_of(t, DType::F16);
  EXPECT_TRUE(h.view().is_contiguous());
  Tensor back = Tensor::to_f32(h);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(back.ptr<float>()[i], t.get_f32(i)) << i;
  EXPECT_THROW(copy_into(v, h.view()), ShapeError);  // shapes differ: named in the message
  try {
    copy_into(v, h.view());
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3, 4]"), std::string::npos) << e.what();
  }
}

TEST(TensorView, DLPackRoundTripKeepsEverything) {
  std::vector<uint16_t> x(5 * 7, 0);
  for (auto dt : {DType::F32, DType::F16, DType::BF16, DType::U8, DType::I32, DType::I64}) {
    TensorView v(x.data(), dt, {5, 7}, {1, 5});
    DLTensor d{};
    int64_t sh[kMaxDims], st[kMaxDims];
    to_dlpack(v, d, sh, st);
    const TensorView w = from_dlpack(d);
    EXPECT_EQ(w.data, v.data);
    EXPECT_EQ(w.dtype, dt);
    EXPECT_EQ(w.sizes(), v.sizes());
    EXPECT_EQ(w.stride(0), 1);
    EXPECT_EQ(w.stride(1), 5);
    EXPECT_TRUE(w.device.is_cpu());
  }
  // byte_offset is honoured; strides = NULL means row-major
  DLTensor d{};
  int64_t shape[2] = {2, 3};
  d.data = x.data();
  d.byte_offset = 4;
  d.ndim = 2;
  d.shape = shape;
  d.strides = nullptr;
  d.dtype = {kDLFloat, 16, 1};
  d.device = {kDLCPU, 0};
  const TensorView w = from_dlpack(d);
  EXPECT_EQ(static_cast<char*>(w.data), reinterpret_cast<char*>(x.data()) + 4);
  EXPECT_TRUE(w.is_contiguous());
  EXPECT_EQ(w.dtype, DType::F16);
  // what veloxquant does not take is refused with a message naming it
  d.dtype = {kDLFloat, 64, 1};
  EXPECT_THROW(from_dlpack(d), ShapeError);
  d.dtype = {kDLFloat, 16, 1};
  d.byte_offset = 3;
  EXPECT_THROW(from_dlpack(d), ShapeError);
  d.byte_offset = 0;
  d.device = {kDLOpenCL, 0};
  EXPECT_THROW(from_dlpack(d), ShapeError);
}

// copy_to on the CPU: a packed, independent copy of any layout; without CUDA a CUDA target is a
// CudaError (the CUDA directions: tests/cuda, CudaTensor.CopyToRoundTripsEveryDirection).
TEST(Tensor, CopyToTheCpuPacksAndOwnsItsStorage) {
  std::vector<float> x(2 * 3 * 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.5f;
  const TensorView t(x.data(), DType::F32, {4, 3, 2}, {1, 4, 12});  // transposed
  Tensor c = Tensor::copy_to(t, Device::cpu());
  EXPECT_TRUE(c.view().is_contiguous());
  EXPECT_EQ(c.sizes(), t.sizes());
  EXPECT_EQ(c.dtype(), DType::F32);
  EXPECT_TRUE(c.device().is_cpu());
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(c.ptr<float>()[i], t.get_f32(i)) << i;
  c.ptr<float>()[0] = -1.0f;
  EXPECT_EQ(x[0], 0.0f) << "the copy shares the source's memory";
  const Tensor none = Tensor::copy_to(TensorView(x.data(), DType::F32, {0, 4}), Device::cpu());
  EXPECT_EQ(none.numel(), 0);
#if !defined(VQ_HAVE_CUDA)
  EXPECT_THROW(Tensor::copy_to(t, Device::cuda()), CudaError);
#endif
}

// Shapes whose byte count does not fit (2^62 at most) are ShapeErrors naming the shape, not a
// wrapped product (found while writing fuzz_cache_state: a restored capacity of 2^62 tokens).
TEST(Tensor, ShapesPastTwoToTheSixtyTwoBytesAreRefused) {
  const int64_t big = int64_t(1) << 31;
  try {
    (void)Tensor::empty({big, big, 4}, DType::F32);
    ADD_FAILURE() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[2147483648, 2147483648, 4]"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)Tensor::zeros({int64_t(1) << 62, 2}, DType::U8), ShapeError);
  EXPECT_THROW((void)Tensor::empty({4, std::numeric_limits<int64_t>::max()}, DType::F16), ShapeError);
  // the bound is on the non-zero dimensions, so numel and the strides never overflow either
  EXPECT_EQ(Tensor::empty({4, 0, int64_t(1) << 40}, DType::F32).numel(), 0);
  EXPECT_THROW((void)Tensor::empty({std::numeric_limits<int64_t>::max(), 3, 0}, DType::F32), ShapeError);
}

TEST(Tensor, OwningTensorsShareStorageAndCheckShapes) {
  Tensor a = Tensor::zeros({3, 4}, DType::F32);
  Tensor b = a;  // shares
  b.ptr<float>()[5] = 2.5f;
  EXPECT_EQ(a.ptr<float>()[5], 2.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_THROW(Tensor::from_floats({1, 2, 3}, {2, 2}), ShapeError);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::F32), ShapeError);
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::BF16);
  EXPECT_THROW(dtype_from_name("f64"), ValueError);
  float dummy = 0;
  EXPECT_THROW(check_float4d(TensorView(&dummy, DType::F32, {1, 1, 1}), "keys", Device::cpu()), ShapeError);
  EXPECT_THROW(check_float4d(TensorView(&dummy, DType::I32, {1, 1, 1, 1}), "keys", Device::cpu()), ShapeError);
#if !defined(VQ_HAVE_CUDA)
  EXPECT_THROW(Tensor::empty({4}, DType::F32, Device::cuda()), CudaError);
#endif
}
