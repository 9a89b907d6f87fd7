// veloxquant/tensor.h — a small non-owning tensor view and an owning tensor.
//
// TensorView is what the API takes: a data pointer, dtype, device, shape and strides (in
// elements, any layout). It converts to and from DLPack's DLTensor, so NumPy, PyTorch and
// JAX arrays pass in without copies. Tensor owns its memory (CPU heap or CUDA device
// memory) and hands out views; copying a Tensor shares the storage (like a shared_ptr).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "veloxquant/dtype.h"

#include <dlpack/dlpack.h>  // DLTensor (a small C header; Debian libdlpack-dev)

namespace veloxquant {

constexpr int kMaxDims = 8;
using Shape = std::vector<int64_t>;

/// "[1, 8, 7, 96]"
std::string shape_str(const Shape& s);

/// A non-owning, strided view of memory. Strides count elements, not bytes.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device{};
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};

  TensorView() = default;
  /// Contiguous (row-major) view.
  TensorView(void* data, DType dtype, const Shape& shape, Device device = Device::cpu());
  /// Strided view; `strides` in elements.
  TensorView(void* data, DType dtype, const Shape& shape, const Shape& strides,
             Device device = Device::cpu());

  int64_t dim(int i) const { return shape[i < 0 ? i + ndim : i]; }
  int64_t stride(int i) const { return strides[i < 0 ? i + ndim : i]; }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * dtype_size(dtype); }
  bool is_contiguous() const;
  Shape sizes() const { return Shape(shape.begin(), shape.begin() + ndim); }
  std::string shape_string() const { return shape_str(sizes()); }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  /// Byte address of element (i0, i1, ...); indices count from the first dimension.
  void* at(std::initializer_list<int64_t> idx) const;
  /// Reads element `flat` (row-major index over the logical shape) of a float tensor as f32.
  float get_f32(int64_t flat) const;
};

/// Wraps a DLTensor (no copy). Throws ShapeError for dtypes/devices veloxquant does not take
/// and for byte offsets that are not element-aligned.
TensorView from_dlpack(const DLTensor& t);
/// Fills a DLTensor describing `v` (no copy). `shape_storage`/`stride_storage` must outlive `out`
/// and hold at least v.ndim entries.
void to_dlpack(const TensorView& v, DLTensor& out, int64_t* shape_storage, int64_t* stride_storage);

/// An owning, contiguous tensor. Copies share the same storage.
class Tensor {
 public:
  Tensor() = default;
  /// Uninitialised memory of `shape` on `device` (CUDA needs a build with CUDA).
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  /// A contiguous CPU copy of any view (any dtype; converts float dtypes when `to` differs).
  static Tensor copy_of(const TensorView& v);
  static Tensor copy_of(const TensorView& v, DType to);
  /// A contiguous copy of any view on `device` (same dtype): CPU → CUDA uploads (a strided CPU
  /// view is packed first), CUDA → CPU as copy_of, CUDA → CUDA through the host. A CUDA source
  /// must be contiguous (ShapeError); a CUDA target needs a build with CUDA (CudaError).
  static Tensor copy_to(const TensorView& v, Device device);
  /// CPU f32 copy of a float view (any layout, any float dtype, CPU or CUDA).
  static Tensor to_f32(const TensorView& v);
  /// Copies a CPU float vector into a new tensor of `shape` and dtype `dtype`.
  static Tensor from_floats(const std::vector<float>& x, const Shape& shape, DType dtype = DType::F32);

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: views are what the API takes
  bool defined() const { return view_.data != nullptr || view_.ndim > 0; }
  void* data() const { return view_.data; }
  template <class T>
  T* ptr() const { return static_cast<T*>(view_.data); }
  DType dtype() const { return view_.dtype; }
  Device device() const { return view_.device; }
  int ndim() const { return view_.ndim; }
  int64_t dim(int i) const { return view_.dim(i); }
  int64_t numel() const { return view_.numel(); }
  int64_t nbytes() const { return view_.nbytes(); }
  Shape sizes() const { return view_.sizes(); }
  /// All elements as f32 (copies to the CPU where needed).
  std::vector<float> to_vector_f32() const;

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

/// Copies `src` into `dst` elementwise (same logical shape; any layouts; float dtypes are
/// converted, other dtypes must match). CPU only.
void copy_into(const TensorView& src, const TensorView& dst);

/// Validates that `v` is a rank-4 float tensor on `device`; throws ShapeError naming `what`.
void check_float4d(const TensorView& v, const char* what, Device device);

}  // namespace veloxquant
