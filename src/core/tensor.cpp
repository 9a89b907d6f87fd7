// Tensor views, owning tensors, DLPack conversion and dtype names.
#include "veloxquant/tensor.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/cuda_hooks.h"
#include "veloxquant/error.h"

namespace veloxquant {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::U8: return "u8";
    case DType::U16: return "u16";
    case DType::U32: return "u32";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "f32" || n == "float32" || n == "F32") return DType::F32;
  if (n == "f16" || n == "float16" || n == "fp16" || n == "F16") return DType::F16;
  if (n == "bf16" || n == "bfloat16" || n == "BF16") return DType::BF16;
  if (n == "u8" || n == "uint8" || n == "U8") return DType::U8;
  if (n == "u16" || n == "uint16" || n == "U16") return DType::U16;
  if (n == "u32" || n == "uint32" || n == "U32") return DType::U32;
  if (n == "i32" || n == "int32" || n == "I32") return DType::I32;
  if (n == "i64" || n == "int64" || n == "I64") return DType::I64;
  VQ_THROW(ValueError, "unknown dtype '" << n << "' (expected f32, f16, bf16, u8, u16, u32, i32 or i64)");
}

std::string device_name(Device d) {
  return d.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

TensorView::TensorView(void* d, DType t, const Shape& sh, Device dev) : data(d), dtype(t), device(dev) {
  VQ_CHECK_SHAPE(sh.size() <= size_t(kMaxDims), "tensor rank " << sh.size() << " exceeds " << kMaxDims);
  ndim = int(sh.size());
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    shape[i] = sh[i];
    strides[i] = st;
    st *= sh[i];
  }
}

TensorView::TensorView(void* d, DType t, const Shape& sh, const Shape& st, Device dev)
    : data(d), dtype(t), device(dev) {
  VQ_CHECK_SHAPE(sh.size() <= size_t(kMaxDims) && sh.size() == st.size(),
                 "tensor shape " << shape_str(sh) << " and strides " << shape_str(st) << " do not fit");
  ndim = int(sh.size());
  for (int i = 0; i < ndim; ++i) {
    shape[i] = sh[i];
    strides[i] = st[i];
  }
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != st) return false;
    st *= shape[i];
  }
  return true;
}

void* TensorView::at(std::initializer_list<int64_t> idx) const {
  int64_t off = 0;
  int i = 0;
  for (int64_t x : idx) off += x * strides[i++];
  return static_cast<char*>(data) + off * dtype_size(dtype);
}

static int64_t flat_to_offset(const TensorView& v, int64_t flat) {
  int64_t off = 0;
  for (int i = v.ndim - 1; i >= 0; --i) {
    const int64_t n = v.shape[i];
    off += (flat % n) * v.strides[i];
    flat /= n;
  }
  return off;
}

static inline float load_float(const void* base, DType t, int64_t off) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[off];
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(base)[off]);
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[off]);
    default: break;
  }
  VQ_THROW(ShapeError, "expected a float tensor (f32, f16 or bf16), got " << dtype_name(t));
}

static inline void store_float(void* base, DType t, int64_t off, float x) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[off] = x; return;
    case DType::F16: static_cast<uint16_t*>(base)[off] = float_to_half(x); return;
    case DType::BF16: static_cast<uint16_t*>(base)[off] = float_to_bf16(x); return;
    default: break;
  }
  VQ_THROW(ShapeError, "expected a float tensor (f32, f16 or bf16), got " << dtype_name(t));
}

float TensorView::get_f32(int64_t flat) const {
  VQ_CHECK_SHAPE(device.is_cpu(), "get_f32 needs a CPU tensor, got " << device_name(device));
  return load_float(data, dtype, flat_to_offset(*this, flat));
}

TensorView from_dlpack(const DLTensor& t) {
  DType dt;
  const int bits = t.dtype.bits, lanes = t.dtype.lanes;
  VQ_CHECK_SHAPE(lanes == 1, "DLPack tensor with " << lanes << " lanes is not supported");
  if (t.dtype.code == kDLFloat && bits == 32) dt = DType::F32;
  else if (t.dtype.code == kDLFloat && bits == 16) dt = DType::F16;
  else if (t.dtype.code == kDLBfloat && bits == 16) dt = DType::BF16;
  else if (t.dtype.code == kDLUInt && bits == 8) dt = DType::U8;
  else if (t.dtype.code == kDLUInt && bits == 16) dt = DType::U16;
  else if (t.dtype.code == kDLUInt && bits == 32) dt = DType::U32;
  else if (t.dtype.code == kDLInt && bits == 32) dt = DType::I32;
  else if (t.dtype.code == kDLInt && bits == 64) dt = DType::I64;
  else VQ_THROW(ShapeError, "DLPack dtype (code " << int(t.dtype.code) << ", bits " << bits << ") is not supported");
  Device dev;
  if (t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost) dev = Device::cpu();
  else if (t.device.device_type == kDLCUDA) dev = Device::cuda(t.device.device_id);
  else VQ_THROW(ShapeError, "DLPack device type " << int(t.device.device_type) << " is not supported");
  VQ_CHECK_SHAPE(t.ndim >= 0 && t.ndim <= kMaxDims, "DLPack tensor rank " << t.ndim << " is not supported");
  VQ_CHECK_SHAPE(t.byte_offset % dtype_size(dt) == 0,
                 "DLPack byte_offset " << t.byte_offset << " is not a multiple of the element size");
  Shape shape(t.shape, t.shape + t.ndim), strides;
  if (t.strides) strides.assign(t.strides, t.strides + t.ndim);
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  return t.strides ? TensorView(data, dt, shape, strides, dev) : TensorView(data, dt, shape, dev);
}

void to_dlpack(const TensorView& v, DLTensor& out, int64_t* shape_storage, int64_t* stride_storage) {
  out.data = v.data;
  out.byte_offset = 0;
  out.ndim = v.ndim;
  out.device.device_type = v.device.is_cpu() ? kDLCPU : kDLCUDA;
  out.device.device_id = v.device.index;
  out.dtype.lanes = 1;
  out.dtype.bits = uint8_t(dtype_size(v.dtype) * 8);
  switch (v.dtype) {
    case DType::F32: case DType::F16: out.dtype.code = kDLFloat; break;
    case DType::BF16: out.dtype.code = kDLBfloat; break;
    case DType::I32: case DType::I64: out.dtype.code = kDLInt; break;
    default: out.dtype.code = kDLUInt; break;
  }
  for (int i = 0; i < v.ndim; ++i) {
    shape_storage[i] = v.shape[i];
    stride_storage[i] = v.strides[i];
  }
  out.shape = shape_storage;
  out.strides = stride_storage;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  // The product of the non-zero dimensions is at most 2^62 bytes, so that numel, nbytes, every
  // stride and every byte offset fit in int64 in whatever order they are multiplied.
  int64_t n = 1;
  bool no_elements = false;
  for (auto s : shape) {
    VQ_CHECK_SHAPE(s >= 0, "negative dimension in " << shape_str(shape));
    if (s == 0) {
      no_elements = true;
      continue;
    }
    VQ_CHECK_SHAPE(n <= (int64_t(1) << 62) / dtype_size(dtype) / s,
                   "shape " << shape_str(shape) << " of " << dtype_name(dtype) << " holds more than 2^62 bytes");
    n *= s;
  }
  if (no_elements) n = 0;
  const size_t bytes = size_t(std::max<int64_t>(n, 1)) * dtype_size(dtype);
  if (device.is_cpu()) {
    // 64-byte aligned for SIMD
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    t.storage_ = detail::cuda_alloc_shared(bytes, device);
  }
  t.view_ = TensorView(t.storage_.get(), dtype, shape, device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) std::memset(t.data(), 0, size_t(t.nbytes()));
  else detail::cuda_memset(t.data(), 0, size_t(t.nbytes()), device);
  return t;
}

Tensor Tensor::copy_of(const TensorView& v) { return copy_of(v, v.dtype); }

Tensor Tensor::copy_of(const TensorView& v, DType to) {
  if (v.device.is_cuda()) {
    Tensor host = empty(v.sizes(), v.dtype);
    VQ_CHECK_SHAPE(v.is_contiguous(), "copying a strided CUDA tensor to the host is not supported (shape "
                                          << v.shape_string() << ", strides "
                                          << shape_str(Shape(v.strides.begin(), v.strides.begin() + v.ndim))
                                          << ")");
    detail::cuda_memcpy_d2h(host.data(), v.data, size_t(v.nbytes()), v.device);
    return to == v.dtype ? host : copy_of(host.view(), to);
  }
  Tensor t = empty(v.sizes(), to);
  copy_into(v, t.view());
  return t;
}

Tensor Tensor::copy_to(const TensorView& v, Device device) {
  if (device.is_cpu()) return copy_of(v);
  // the bytes to upload: the view itself where it is a contiguous CPU view, else a packed host copy
  Tensor host;
  if (!v.device.is_cpu() || !v.is_contiguous()) host = copy_of(v);
  Tensor d = empty(v.sizes(), v.dtype, device);
  const void* src = host.defined() ? host.data() : v.data;
  if (d.nbytes() > 0) detail::cuda_memcpy_h2d(d.data(), src, size_t(d.nbytes()), device);
  return d;
}

Tensor Tensor::to_f32(const TensorView& v) { return copy_of(v, DType::F32); }

Tensor Tensor::from_floats(const std::vector<float>& x, const Shape& shape, DType dtype) {
  TensorView src(const_cast<float*>(x.data()), DType::F32, shape);
  VQ_CHECK_SHAPE(src.numel() == int64_t(x.size()),
                 "from_floats: " << x.size() << " values do not fill shape " << shape_str(shape));
  return copy_of(src, dtype);
}

std::vector<float> Tensor::to_vector_f32() const {
  Tensor f = to_f32(view_);
  return std::vector<float>(f.ptr<float>(), f.ptr<float>() + f.numel());
}

void copy_into(const TensorView& src, const TensorView& dst) {
  VQ_CHECK_SHAPE(src.device.is_cpu() && dst.device.is_cpu(), "copy_into works on CPU tensors");
  VQ_CHECK_SHAPE(src.sizes() == dst.sizes(),
                 "copy_into: source " << src.shape_string() << " and destination " << dst.shape_string() << " differ");
  const int64_t n = src.numel();
  if (src.dtype == dst.dtype && src.is_contiguous() && dst.is_contiguous()) {
    std::memcpy(dst.data, src.data, size_t(n) * dtype_size(src.dtype));
    return;
  }
  if (dtype_is_float(src.dtype) && dtype_is_float(dst.dtype)) {
    for (int64_t i = 0; i < n; ++i)
      store_float(dst.data, dst.dtype, flat_to_offset(dst, i), load_float(src.data, src.dtype, flat_to_offset(src, i)));
    return;
  }
  VQ_CHECK_SHAPE(src.dtype == dst.dtype, "copy_into: cannot convert " << dtype_name(src.dtype) << " to "
                                                                    << dtype_name(dst.dtype));
  const int es = dtype_size(src.dtype);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(static_cast<char*>(dst.data) + flat_to_offset(dst, i) * es,
                static_cast<const char*>(src.data) + flat_to_offset(src, i) * es, size_t(es));
}

void check_float4d(const TensorView& v, const char* what, Device device) {
  VQ_CHECK_SHAPE(v.ndim == 4, what << ": expected rank 4 [batch, heads, seq_len, head_dim], got "
                                   << v.shape_string());
  VQ_CHECK_SHAPE(dtype_is_float(v.dtype),
                 what << ": expected dtype f16, bf16 or f32, got " << dtype_name(v.dtype));
  VQ_CHECK_SHAPE(v.device == device, what << ": expected a tensor on " << device_name(device) << ", got one on "
                                          << device_name(v.device));
  VQ_CHECK_SHAPE(v.data != nullptr || v.numel() == 0, what << ": null data pointer");
}

}  // namespace veloxquant
