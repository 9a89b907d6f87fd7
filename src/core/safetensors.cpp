// safetensors reader (validating header parser + mmap) and writer.
//
// Every check happens in parse_safetensors before any tensor is exposed, on a buffer whose
// size is known: the parser never reads outside it (the fuzz target fuzz_safetensors runs it
// under AddressSanitizer). JSON parsing is nlohmann-json with a callback that bounds nesting
// depth and rejects duplicate tensor names (nlohmann would silently keep the last one).
#include "veloxquant/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "veloxquant/error.h"

namespace veloxquant {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Printable, length-bounded form of text taken from an untrusted header (for messages).
std::string printable(const std::string& s, size_t max_len = 80) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max_len) out += "...";
  return out;
}
std::string quoted(const std::string& s) {
  std::string out(1, '\'');  // appends: GCC 12 warns (-Wrestrict, bug 105329) on "'" + ... + "'"
  out += printable(s);
  out += '\'';
  return out;
}

std::optional<DType> vq_dtype_of(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "U8") return DType::U8;
  if (s == "U16") return DType::U16;
  if (s == "U32") return DType::U32;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  return std::nullopt;
}

}  // namespace

int safetensors_dtype_size(const std::string& s) {
  static const std::unordered_map<std::string, int> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2},
      {"F16", 2},  {"BF16", 2}, {"U32", 4}, {"I32", 4},    {"F32", 4},     {"U64", 8}, {"I64", 8},
      {"F64", 8}};
  auto it = sizes.find(s);
  return it == sizes.end() ? 0 : it->second;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::U8: return "U8";
    case DType::U16: return "U16";
    case DType::U32: return "U32";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size) {
  VQ_CHECK_FORMAT(data != nullptr || size == 0, "safetensors: null buffer");
  VQ_CHECK_FORMAT(size >= 8, "safetensors: file too small (" << size
                                 << " bytes; the 8-byte header length alone needs 8)");
  SafetensorsHeader h;
  h.header_bytes = read_le64(data);
  VQ_CHECK_FORMAT(h.header_bytes <= kSafetensorsMaxHeaderBytes,
                  "safetensors: header length " << h.header_bytes << " exceeds the limit of "
                                                << kSafetensorsMaxHeaderBytes << " bytes");
  VQ_CHECK_FORMAT(h.header_bytes <= size - 8,
                  "safetensors: truncated file: header length " << h.header_bytes << " but only "
                                                                << size - 8 << " bytes follow it");
  VQ_CHECK_FORMAT(h.header_bytes >= 2, "safetensors: header length " << h.header_bytes
                                                                     << " is too small for a JSON object");
  h.data_start = 8 + h.header_bytes;
  h.data_bytes = size - h.data_start;
  const char* hb = reinterpret_cast<const char*>(data + 8);
  VQ_CHECK_FORMAT(hb[0] == '{', "safetensors: header does not start with '{'");

  // Parse with a callback: bound the nesting depth, reject duplicate top-level names.
  std::set<std::string> seen;
  auto cb = [&seen](int depth, json::parse_event_t ev, json& parsed) -> bool {
    if (depth > kSafetensorsMaxJsonDepth)
      VQ_THROW(FormatError, "safetensors: header JSON nested deeper than " << kSafetensorsMaxJsonDepth);
    if (ev == json::parse_event_t::key && depth == 1) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second) VQ_THROW(FormatError, "safetensors: duplicate tensor name " << quoted(k));
    }
    return true;
  };
  json root;
  try {
    root = json::parse(hb, hb + h.header_bytes, cb, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    VQ_THROW(FormatError, "safetensors: header is not valid JSON: " << printable(e.what(), 300));
  }
  VQ_CHECK_FORMAT(root.is_object(), "safetensors: header is not a JSON object");

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      VQ_CHECK_FORMAT(v.is_object(), "safetensors: __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        VQ_CHECK_FORMAT(m.value().is_string(),
                        "safetensors: __metadata__ value of " << quoted(m.key()) << " is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    VQ_CHECK_FORMAT(!name.empty(), "safetensors: empty tensor name");
    VQ_CHECK_FORMAT(v.is_object(), "safetensors: entry of tensor " << quoted(name) << " is not an object");
    SafetensorsTensorInfo ti;
    ti.name = name;
    auto dt = v.find("dtype");
    VQ_CHECK_FORMAT(dt != v.end() && dt->is_string(), "safetensors: tensor " << quoted(name)
                                                                            << " has no string 'dtype'");
    ti.dtype_str = dt->get<std::string>();
    ti.element_size = safetensors_dtype_size(ti.dtype_str);
    VQ_CHECK_FORMAT(ti.element_size > 0,
                    "safetensors: tensor " << quoted(name) << " has unknown dtype " << quoted(ti.dtype_str));
    ti.dtype = vq_dtype_of(ti.dtype_str);

    auto sh = v.find("shape");
    VQ_CHECK_FORMAT(sh != v.end() && sh->is_array(), "safetensors: tensor " << quoted(name)
                                                                           << " has no array 'shape'");
    VQ_CHECK_FORMAT(sh->size() <= 64, "safetensors: tensor " << quoted(name) << " has rank " << sh->size()
                                                             << " (at most 64 accepted)");
    uint64_t numel = 1;
    for (const json& d : *sh) {
      VQ_CHECK_FORMAT(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                      "safetensors: tensor " << quoted(name) << " has a shape entry that is not a "
                                             << "non-negative integer: " << d.dump());
      const uint64_t dim = d.get<uint64_t>();
      VQ_CHECK_FORMAT(dim <= uint64_t(INT64_MAX),
                      "safetensors: tensor " << quoted(name) << " has dimension " << dim << " out of range");
      ti.shape.push_back(int64_t(dim));
      VQ_CHECK_FORMAT(!__builtin_mul_overflow(numel, dim, &numel),
                      "safetensors: tensor " << quoted(name) << " shape " << shape_str(ti.shape)
                                             << "... overflows 64 bits");
    }
    uint64_t expect_bytes = 0;
    VQ_CHECK_FORMAT(!__builtin_mul_overflow(numel, uint64_t(ti.element_size), &expect_bytes),
                    "safetensors: tensor " << quoted(name) << " byte size overflows 64 bits");

    auto off = v.find("data_offsets");
    VQ_CHECK_FORMAT(off != v.end() && off->is_array() && off->size() == 2,
                    "safetensors: tensor " << quoted(name) << " needs 'data_offsets': [begin, end]");
    for (const json& o : *off)
      VQ_CHECK_FORMAT(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
                      "safetensors: tensor " << quoted(name) << " has a data offset that is not a "
                                             << "non-negative integer: " << o.dump());
    ti.begin = (*off)[0].get<uint64_t>();
    ti.end = (*off)[1].get<uint64_t>();
    VQ_CHECK_FORMAT(ti.begin <= ti.end, "safetensors: tensor " << quoted(name) << " has data_offsets ["
                                                               << ti.begin << ", " << ti.end << "] with begin > end");
    VQ_CHECK_FORMAT(ti.end <= h.data_bytes,
                    "safetensors: tensor " << quoted(name) << " ends at byte " << ti.end
                                           << " of the data region, which holds only " << h.data_bytes
                                           << " bytes (truncated file?)");
    VQ_CHECK_FORMAT(ti.end - ti.begin == expect_bytes,
                    "safetensors: tensor " << quoted(name) << " of dtype " << ti.dtype_str << " and shape "
                                           << shape_str(ti.shape) << " needs " << expect_bytes
                                           << " bytes, but data_offsets span " << ti.end - ti.begin);
    for (auto k = v.begin(); k != v.end(); ++k)
      VQ_CHECK_FORMAT(k.key() == "dtype" || k.key() == "shape" || k.key() == "data_offsets",
                      "safetensors: tensor " << quoted(name) << " has unknown field " << quoted(k.key()));
    h.tensors.push_back(std::move(ti));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const auto& a = h.tensors[i - 1];
    const auto& b = h.tensors[i];
    // Zero-byte tensors overlap nothing.
    VQ_CHECK_FORMAT(b.begin >= a.end || a.nbytes() == 0 || b.nbytes() == 0,
                    "safetensors: tensors " << quoted(a.name) << " [" << a.begin << ", " << a.end << ") and "
                                            << quoted(b.name) << " [" << b.begin << ", " << b.end << ") overlap");
  }
  return h;
}

// ---- SafetensorsFile -------------------------------------------------------------------------

struct SafetensorsFile::Impl {
  std::string path;
  const uint8_t* base = nullptr;
  size_t size = 0;
  void* map = nullptr;         // mmap'ed region (open), or null
  size_t map_size = 0;
  std::vector<uint8_t> owned;  // from_bytes
  SafetensorsHeader header;
  std::unordered_map<std::string, size_t> index;
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, std::shared_ptr<void>> aligned_copies;

  ~Impl() {
    if (map) munmap(map, map_size);
  }
  void build_index() {
    for (size_t i = 0; i < header.tensors.size(); ++i) index[header.tensors[i].name] = i;
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) VQ_THROW(IoError, "cannot open '" << path << "': " << std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    VQ_THROW(IoError, "cannot stat '" << path << "': " << std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    VQ_THROW(IoError, "'" << path << "' is not a regular file");
  }
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->size = size_t(st.st_size);
  if (impl->size > 0) {
    void* m = mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      VQ_THROW(IoError, "cannot memory-map '" << path << "': " << std::strerror(e));
    }
    impl->map = m;
    impl->map_size = impl->size;
    impl->base = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  try {
    impl->header = parse_safetensors(impl->base, impl->size);
  } catch (const FormatError& e) {
    VQ_THROW(FormatError, path << ": " << e.what());
  }
  impl->build_index();
  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes) {
  auto impl = std::make_shared<Impl>();
  impl->owned = std::move(bytes);
  impl->base = impl->owned.data();
  impl->size = impl->owned.size();
  impl->header = parse_safetensors(impl->base, impl->size);
  impl->build_index();
  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(const uint8_t* data, size_t size) {
  return from_bytes(std::vector<uint8_t>(data, data + size));
}

static void require_open(const void* impl) {
  if (!impl) VQ_THROW(Error, "SafetensorsFile: no file is open");
}

const std::string& SafetensorsFile::path() const {
  require_open(impl_.get());
  return impl_->path;
}
uint64_t SafetensorsFile::file_size() const {
  require_open(impl_.get());
  return impl_->size;
}
const SafetensorsHeader& SafetensorsFile::header() const {
  require_open(impl_.get());
  return impl_->header;
}
std::vector<std::string> SafetensorsFile::names() const {
  require_open(impl_.get());
  std::vector<std::string> out;
  out.reserve(impl_->header.tensors.size());
  for (const auto& t : impl_->header.tensors) out.push_back(t.name);
  return out;
}
bool SafetensorsFile::contains(const std::string& name) const {
  require_open(impl_.get());
  return impl_->index.count(name) != 0;
}
const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  require_open(impl_.get());
  auto it = impl_->index.find(name);
  if (it == impl_->index.end()) {
    VQ_THROW(FormatError, (impl_->path.empty() ? std::string("safetensors") : impl_->path)
                              << ": no tensor named " << quoted(name));
  }
  return impl_->header.tensors[it->second];
}
const uint8_t* SafetensorsFile::raw_data(const std::string& name) const {
  const auto& ti = info(name);
  return impl_->base + impl_->header.data_start + ti.begin;
}

TensorView SafetensorsFile::tensor(const std::string& name) const {
  const auto& ti = info(name);
  VQ_CHECK_FORMAT(ti.dtype.has_value(), "tensor " << quoted(name) << " has dtype " << ti.dtype_str
                                                  << ", which veloxquant does not read");
  VQ_CHECK_FORMAT(ti.shape.size() <= size_t(kMaxDims), "tensor " << quoted(name) << " has rank "
                                                                 << ti.shape.size() << " > " << kMaxDims);
  const uint8_t* p = impl_->base + impl_->header.data_start + ti.begin;
  if (ti.nbytes() > 0 && reinterpret_cast<uintptr_t>(p) % uintptr_t(ti.element_size) != 0) {
    // Misaligned for its element type: hand out an aligned copy owned by this file object.
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto& slot = impl_->aligned_copies[name];
    if (!slot) {
      void* q = std::aligned_alloc(64, (ti.nbytes() + 63) / 64 * 64);
      if (!q) throw std::bad_alloc();
      std::memcpy(q, p, ti.nbytes());
      slot = std::shared_ptr<void>(q, [](void* x) { std::free(x); });
    }
    return TensorView(slot.get(), *ti.dtype, ti.shape);
  }
  return TensorView(const_cast<uint8_t*>(p), *ti.dtype, ti.shape);
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const TensorView v = tensor(name);
  VQ_CHECK_FORMAT(dtype_is_float(v.dtype), "tensor " << quoted(name) << " has dtype " << info(name).dtype_str
                                                     << "; expected F32, F16 or BF16");
  Tensor t = Tensor::to_f32(v);
  return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel());
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  require_open(impl_.get());
  return impl_->header.metadata;
}

std::optional<std::string> SafetensorsFile::metadata_value(const std::string& key) const {
  const auto& m = metadata();
  auto it = m.find(key);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// ---- writer ----------------------------------------------------------------------------------

std::vector<uint8_t> serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const auto& [name, v] : tensors) {
    VQ_CHECK_VALUE(!name.empty(), "save_safetensors: empty tensor name");
    VQ_CHECK_VALUE(name != "__metadata__", "save_safetensors: '__metadata__' is reserved");
    VQ_CHECK_VALUE(names.insert(name).second, "save_safetensors: duplicate tensor name '" << name << "'");
    VQ_CHECK_VALUE(v.device.is_cpu(), "save_safetensors: tensor '" << name << "' is on "
                                                                   << device_name(v.device) << ", expected cpu");
    VQ_CHECK_VALUE(v.data != nullptr || v.numel() == 0, "save_safetensors: tensor '" << name
                                                                                    << "' has no data");
  }
  // Largest element size first, then by name: each tensor starts at a multiple of its
  // element size because every earlier tensor's byte size is a multiple of it.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int ea = dtype_size(tensors[a].second.dtype), eb = dtype_size(tensors[b].second.dtype);
    if (ea != eb) return ea > eb;
    return tensors[a].first < tensors[b].first;
  });

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, val] : metadata) m[k] = val;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& [name, v] = tensors[i];
    ordered_json e = ordered_json::object();
    e["dtype"] = safetensors_dtype_name(v.dtype);
    e["shape"] = v.sizes();
    const uint64_t n = uint64_t(v.nbytes());
    e["data_offsets"] = {offset, offset + n};
    header[name] = std::move(e);
    offset += n;
  }
  std::string hs = header.dump();
  while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');

  std::vector<uint8_t> out(8 + hs.size() + offset);
  uint64_t n = hs.size();
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(n >> (8 * i));
  std::memcpy(out.data() + 8, hs.data(), hs.size());
  uint8_t* dst = out.data() + 8 + hs.size();
  for (size_t i : order) {
    const TensorView& v = tensors[i].second;
    if (v.numel() == 0) continue;
    if (v.is_contiguous()) {
      std::memcpy(dst, v.data, size_t(v.nbytes()));
    } else {
      TensorView d(dst, v.dtype, v.sizes());
      copy_into(v, d);
    }
    dst += v.nbytes();
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::vector<uint8_t> img = serialize_safetensors(tensors, metadata);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) VQ_THROW(IoError, "cannot write '" << tmp << "': " << std::strerror(errno));
  const size_t w = img.empty() ? 0 : std::fwrite(img.data(), 1, img.size(), f);
  const bool ok = (w == img.size()) && std::fflush(f) == 0;
  const int e = errno;
  std::fclose(f);
  if (!ok) {
    std::remove(tmp.c_str());
    VQ_THROW(IoError, "cannot write '" << path << "': " << std::strerror(e));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e2 = errno;
    std::remove(tmp.c_str());
    VQ_THROW(IoError, "cannot rename '" << tmp << "' to '" << path << "': " << std::strerror(e2));
  }
}

}  // namespace veloxquant
