// weights.cpp — memory-mapped checkpoint tensors (single file or index + shards).
#include "veloxquant/runtime/weights.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "veloxquant/error.h"
#include "veloxquant/runtime/config.h"

namespace veloxquant::runtime {

WeightStore WeightStore::open(const std::filesystem::path& dir) {
  WeightStore ws;
  const auto index_path = dir / "model.safetensors.index.json";
  const auto single_path = dir / "model.safetensors";
  if (std::filesystem::exists(index_path)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text_file(index_path));
    } catch (const nlohmann::json::exception& e) {
      VQ_THROW(FormatError, index_path.string() << ": malformed JSON: " << e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      VQ_THROW(FormatError, index_path.string() << ": missing object field 'weight_map'");
    std::map<std::string, size_t> file_index;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        VQ_THROW(FormatError, index_path.string() << ": weight_map['" << it.key() << "'] is not a file name");
      const std::string fname = it.value().get<std::string>();
      if (fname.find('/') != std::string::npos || fname.find("..") != std::string::npos)
        VQ_THROW(FormatError, index_path.string() << ": shard name '" << fname << "' must be a plain file name");
      auto f = file_index.find(fname);
      if (f == file_index.end()) {
        ws.files_.push_back(SafetensorsFile::open((dir / fname).string()));
        f = file_index.emplace(fname, ws.files_.size() - 1).first;
      }
      if (!ws.files_[f->second].contains(it.key()))
        VQ_THROW(FormatError, index_path.string() << ": tensor '" << it.key() << "' is assigned to " << fname
                                                  << ", which does not contain it");
      ws.where_[it.key()] = f->second;
    }
  } else if (std::filesystem::exists(single_path)) {
    ws.files_.push_back(SafetensorsFile::open(single_path.string()));
    for (const auto& n : ws.files_[0].names()) ws.where_[n] = 0;
  } else {
    VQ_THROW(IoError, "no model.safetensors or model.safetensors.index.json in " << dir.string());
  }
  return ws;
}

TensorView WeightStore::tensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) VQ_THROW(FormatError, "checkpoint: no tensor named '" << name << "'");
  return files_[it->second].tensor(name);
}

WeightView WeightStore::matrix(const std::string& name, int64_t rows, int64_t cols) const {
  const TensorView t = tensor(name);
  VQ_CHECK_FORMAT(t.ndim == 2 && t.dim(0) == rows && t.dim(1) == cols,
                  "checkpoint: tensor '" << name << "': expected shape [" << rows << ", " << cols << "], got "
                                         << t.shape_string());
  VQ_CHECK_FORMAT(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16,
                  "checkpoint: tensor '" << name << "' has dtype " << dtype_name(t.dtype)
                                         << " (expected f32, f16 or bf16)");
  return WeightView{t.data, t.dtype, rows, cols};
}

std::vector<float> WeightStore::vector_f32(const std::string& name, int64_t n) const {
  const TensorView t = tensor(name);
  VQ_CHECK_FORMAT(t.ndim == 1 && t.dim(0) == n,
                  "checkpoint: tensor '" << name << "': expected shape [" << n << "], got " << t.shape_string());
  VQ_CHECK_FORMAT(dtype_is_float(t.dtype), "checkpoint: tensor '" << name << "' has dtype " << dtype_name(t.dtype)
                                                                  << " (expected f32, f16 or bf16)");
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = t.get_f32(i);
  return out;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [n, f] : where_) out.push_back(n);
  return out;
}

uint64_t WeightStore::total_bytes() const {
  uint64_t s = 0;
  for (const auto& f : files_) s += f.header().data_bytes;
  return s;
}

std::string WeightStore::dominant_dtype() const {
  std::map<std::string, uint64_t> bytes;
  for (const auto& [n, f] : where_) {
    const auto& info = files_[f].info(n);
    bytes[info.dtype_str] += info.nbytes();
  }
  std::string best;
  uint64_t most = 0;
  for (const auto& [d, b] : bytes)
    if (b > most) most = b, best = d;
  return best;
}

}  // namespace veloxquant::runtime
