// veloxquant/error.h — the library's exceptions and its checking macros.
//
// Every user-caused failure throws a veloxquant::Error (a std::runtime_error) whose message
// names the offending values, e.g.
//   "keys: expected [batch, n_kv_heads=8, seq_len, head_dim=128], got [1, 8, 7, 96]".
// Subclasses let callers tell apart the cases they may want to handle differently.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace veloxquant {

/// Base of every exception veloxquant throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};
/// A tensor of the wrong shape, rank, dtype or device.
class ShapeError : public Error {
 public:
  using Error::Error;
};
/// An invalid configuration or argument value (bits outside 1..16, alpha <= 0, ...).
class ValueError : public Error {
 public:
  using Error::Error;
};
/// A malformed, truncated or unsupported file.
class FormatError : public Error {
 public:
  using Error::Error;
};
/// A file that could not be opened, read or written.
class IoError : public Error {
 public:
  using Error::Error;
};
/// A failed CUDA call, or CUDA requested from a build without it / a machine without a GPU.
class CudaError : public Error {
 public:
  using Error::Error;
};
/// An operation the object does not support in its current mode (e.g. fetching fp16
/// tensors from a memory-bound cache, merging VecInfer caches).
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

}  // namespace veloxquant

/// Throws ErrType with the streamed message when `cond` is false. The message is built
/// only on failure: VQ_THROW_IF_NOT(a == b, ShapeError, "x: expected " << a << ", got " << b).
#define VQ_CHECK_T(cond, ErrType, msg)                                   \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::ostringstream vq_oss_;                                        \
      vq_oss_ << msg;                                                    \
      throw ::veloxquant::ErrType(vq_oss_.str());                        \
    }                                                                    \
  } while (0)

#define VQ_CHECK_SHAPE(cond, msg) VQ_CHECK_T(cond, ShapeError, msg)
#define VQ_CHECK_VALUE(cond, msg) VQ_CHECK_T(cond, ValueError, msg)
#define VQ_CHECK_FORMAT(cond, msg) VQ_CHECK_T(cond, FormatError, msg)
#define VQ_THROW(ErrType, msg)                  \
  do {                                          \
    std::ostringstream vq_oss_;                 \
    vq_oss_ << msg;                             \
    throw ::veloxquant::ErrType(vq_oss_.str()); \
  } while (0)
