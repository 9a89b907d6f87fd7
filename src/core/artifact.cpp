// The codebook artifact: metadata ⇄ struct, tensors ⇄ safetensors, strict validation.
//
// Loading is written against untrusted input (fuzz_artifact runs it under ASan): every
// number in the metadata is parsed with full-string checks and range-checked before it sizes
// anything, every tensor is looked up by its expected name with its expected dtype and shape
// before its bytes are read, and nothing outside the validated safetensors regions is read.
#include "veloxquant/artifact.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "veloxquant/error.h"
#include "veloxquant/safetensors.h"

namespace veloxquant {

namespace {

const std::set<std::string>& our_keys() {
  static const std::set<std::string> keys = {
      "format", "format_version", "n_layers", "n_kv_heads", "head_dim", "key_config", "value_config",
      "key_sub_dim", "key_codebook_bits", "value_sub_dim", "value_codebook_bits", "alpha", "key_transform",
      "calibration_tokens", "calibration_source", "key_reconstruction_error", "value_reconstruction_error",
      "key_reconstruction_error_mean", "value_reconstruction_error_mean"};
  return keys;
}

std::string layer_name(int i, const char* what) { return "layers." + std::to_string(i) + "." + what; }

std::string fmt_double(double x) {
  std::ostringstream o;
  o.precision(9);
  o << x;
  return o.str();
}

const std::string& require(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  VQ_CHECK_FORMAT(it != m.end(), "artifact: metadata key '" << key << "' is missing");
  return it->second;
}

int64_t parse_int(const std::map<std::string, std::string>& m, const std::string& key, int64_t lo, int64_t hi) {
  const std::string& s = require(m, key);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  VQ_CHECK_FORMAT(ec == std::errc() && p == s.data() + s.size() && !s.empty(),
                  "artifact: metadata '" << key << "' is not an integer: '" << s.substr(0, 40) << "'");
  VQ_CHECK_FORMAT(v >= lo && v <= hi,
                  "artifact: metadata '" << key << "' = " << v << " is outside [" << lo << ", " << hi << "]");
  return v;
}

double parse_double(const std::string& key, const std::string& s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  VQ_CHECK_FORMAT(ec == std::errc() && p == s.data() + s.size() && !s.empty(),
                  "artifact: metadata '" << key << "' is not a number: '" << s.substr(0, 40) << "'");
  return v;
}

PQSpec parse_spec(const std::map<std::string, std::string>& m, const char* prefix) {
  const std::string p(prefix);
  PQSpec spec;
  spec.sub_dim = int(parse_int(m, p + "_sub_dim", 1, 16));
  spec.codebook_bits = int(parse_int(m, p + "_codebook_bits", 1, 16));
  const std::string cfg = require(m, p + "_config");
  VQ_CHECK_FORMAT(cfg == spec.str(), "artifact: metadata '" << p << "_config' = '" << cfg.substr(0, 40)
                                                            << "' disagrees with " << p << "_sub_dim/"
                                                            << p << "_codebook_bits (" << spec.str() << ")");
  return spec;
}

std::vector<double> parse_errors(const std::map<std::string, std::string>& m, const std::string& key, int n_layers) {
  auto it = m.find(key);
  if (it == m.end()) return std::vector<double>(size_t(n_layers), -1.0);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception&) {
    VQ_THROW(FormatError, "artifact: metadata '" << key << "' is not a JSON array of numbers");
  }
  VQ_CHECK_FORMAT(j.is_array() && j.size() == size_t(n_layers),
                  "artifact: metadata '" << key << "' must be a JSON array of n_layers = " << n_layers << " numbers");
  std::vector<double> out;
  for (const auto& x : j) {
    VQ_CHECK_FORMAT(x.is_number(), "artifact: metadata '" << key << "' holds a non-number");
    const double d = x.get<double>();
    VQ_CHECK_FORMAT(std::isfinite(d), "artifact: metadata '" << key << "' holds a non-finite number");
    out.push_back(d);
  }
  return out;
}

void check_finite(const std::vector<float>& v, const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i)
    VQ_CHECK_FORMAT(std::isfinite(v[i]), "artifact: tensor '" << what << "' has a non-finite value at index " << i);
}

std::string transform_name(bool smooth, bool hadamard) {
  if (smooth && hadamard) return "smooth+hadamard";
  if (smooth) return "smooth";
  if (hadamard) return "hadamard";
  return "none";
}

Artifact load_from(const SafetensorsFile& f) {
  const auto& m = f.metadata();
  auto fmt = m.find("format");
  VQ_CHECK_FORMAT(fmt != m.end() && fmt->second == kArtifactFormatName,
                  "artifact: not a veloxquant artifact (metadata 'format' is "
                      << (fmt == m.end() ? std::string("missing") : "'" + fmt->second.substr(0, 40) + "'")
                      << ", expected '" << kArtifactFormatName << "')");
  const int64_t version = parse_int(m, "format_version", 0, INT32_MAX);
  VQ_CHECK_FORMAT(version == kArtifactFormatVersion, "artifact: unsupported format_version " << version
                                                         << " (this build reads version " << kArtifactFormatVersion << ")");
  Artifact a;
  a.format_version = int(version);
  a.n_layers = int(parse_int(m, "n_layers", 1, kArtifactMaxLayers));
  a.n_kv_heads = int(parse_int(m, "n_kv_heads", 1, kArtifactMaxKvHeads));
  a.head_dim = int(parse_int(m, "head_dim", 1, kArtifactMaxHeadDim));
  a.key_spec = parse_spec(m, "key");
  a.value_spec = parse_spec(m, "value");
  a.alpha = float(parse_double("alpha", require(m, "alpha")));
  const std::string tr = require(m, "key_transform");
  VQ_CHECK_FORMAT(tr == "smooth+hadamard" || tr == "smooth" || tr == "hadamard" || tr == "none",
                  "artifact: metadata 'key_transform' = '" << tr.substr(0, 40)
                                                           << "' (expected smooth+hadamard, smooth, hadamard or none)");
  a.use_smooth = tr == "smooth+hadamard" || tr == "smooth";
  a.use_hadamard = tr == "smooth+hadamard" || tr == "hadamard";
  a.calib_tokens = parse_int(m, "calibration_tokens", 0, INT64_MAX);
  a.calib_source = require(m, "calibration_source");
  for (const auto& [k, v] : m)
    if (!our_keys().count(k)) a.extra[k] = v;
  // Shapes must fit before any tensor is read.
  VQ_CHECK_FORMAT(a.head_dim % a.key_spec.sub_dim == 0 && a.head_dim % a.value_spec.sub_dim == 0,
                  "artifact: head_dim " << a.head_dim << " is not divisible by the key sub_dim "
                                        << a.key_spec.sub_dim << " and value sub_dim " << a.value_spec.sub_dim);
  const auto kerr = parse_errors(m, "key_reconstruction_error", a.n_layers);
  const auto verr = parse_errors(m, "value_reconstruction_error", a.n_layers);

  std::set<std::string> expected;
  a.layers.resize(size_t(a.n_layers));
  auto read = [&](int i, const char* what, const Shape& shape) {
    const std::string name = layer_name(i, what);
    expected.insert(name);
    VQ_CHECK_FORMAT(f.contains(name), "artifact: tensor '" << name << "' is missing");
    const auto& info = f.info(name);
    VQ_CHECK_FORMAT(info.dtype_str == "F32", "artifact: tensor '" << name << "' has dtype " << info.dtype_str
                                                                  << ", expected F32");
    VQ_CHECK_FORMAT(info.shape == shape, "artifact: tensor '" << name << "': expected shape " << shape_str(shape)
                                                              << ", got " << shape_str(info.shape));
    std::vector<float> v = f.read_f32(name);
    check_finite(v, name);
    return v;
  };
  for (int i = 0; i < a.n_layers; ++i) {
    ArtifactLayer& L = a.layers[size_t(i)];
    L.smooth_factors = read(i, "smooth_factors", {a.n_kv_heads, a.head_dim});
    L.key_codebook = read(i, "key_codebook", {int64_t(1) << a.key_spec.codebook_bits, a.key_spec.sub_dim});
    L.value_codebook = read(i, "value_codebook", {int64_t(1) << a.value_spec.codebook_bits, a.value_spec.sub_dim});
    L.key_error = kerr[size_t(i)];
    L.value_error = verr[size_t(i)];
  }
  for (const auto& n : f.names())
    VQ_CHECK_FORMAT(expected.count(n), "artifact: unexpected tensor '" << n.substr(0, 80) << "'");
  a.validate();
  return a;
}

}  // namespace

void Artifact::validate() const {
  VQ_CHECK_FORMAT(format_version == kArtifactFormatVersion, "artifact: format_version " << format_version
                                                                << " (expected " << kArtifactFormatVersion << ")");
  VQ_CHECK_FORMAT(n_layers >= 1 && n_layers <= kArtifactMaxLayers, "artifact: n_layers " << n_layers
                                                                    << " outside [1, " << kArtifactMaxLayers << "]");
  VQ_CHECK_FORMAT(n_kv_heads >= 1 && n_kv_heads <= kArtifactMaxKvHeads,
                  "artifact: n_kv_heads " << n_kv_heads << " outside [1, " << kArtifactMaxKvHeads << "]");
  VQ_CHECK_FORMAT(head_dim >= 1 && head_dim <= kArtifactMaxHeadDim,
                  "artifact: head_dim " << head_dim << " outside [1, " << kArtifactMaxHeadDim << "]");
  for (const PQSpec* s : {&key_spec, &value_spec}) {
    const char* what = s == &key_spec ? "key" : "value";
    VQ_CHECK_FORMAT(s->sub_dim >= 1 && s->sub_dim <= 16 && s->codebook_bits >= 1 && s->codebook_bits <= 16,
                    "artifact: " << what << " config " << s->str() << ": sub_dim and bits must be in 1..16");
    VQ_CHECK_FORMAT(head_dim % s->sub_dim == 0, "artifact: head_dim " << head_dim << " is not divisible by the "
                                                                      << what << " sub_dim " << s->sub_dim);
  }
  VQ_CHECK_FORMAT(std::isfinite(alpha) && alpha > 0, "artifact: alpha must be finite and > 0, got " << alpha);
  VQ_CHECK_FORMAT(calib_tokens >= 0, "artifact: calib_tokens " << calib_tokens << " < 0");
  VQ_CHECK_FORMAT(layers.size() == size_t(n_layers), "artifact: " << layers.size() << " layers held, n_layers = "
                                                                  << n_layers);
  for (const auto& [k, v] : extra)
    VQ_CHECK_FORMAT(!our_keys().count(k), "artifact: extra metadata key '" << k << "' clashes with a reserved key");
  const size_t n_smooth = size_t(n_kv_heads) * size_t(head_dim);
  const size_t n_kcb = (size_t(1) << key_spec.codebook_bits) * size_t(key_spec.sub_dim);
  const size_t n_vcb = (size_t(1) << value_spec.codebook_bits) * size_t(value_spec.sub_dim);
  for (int i = 0; i < n_layers; ++i) {
    const ArtifactLayer& L = layers[size_t(i)];
    VQ_CHECK_FORMAT(L.smooth_factors.size() == n_smooth,
                    "artifact: tensor '" << layer_name(i, "smooth_factors") << "' has " << L.smooth_factors.size()
                                         << " values, expected [n_kv_heads=" << n_kv_heads << ", head_dim=" << head_dim
                                         << "] = " << n_smooth);
    VQ_CHECK_FORMAT(L.key_codebook.size() == n_kcb,
                    "artifact: tensor '" << layer_name(i, "key_codebook") << "' has " << L.key_codebook.size()
                                         << " values, expected [" << (1 << key_spec.codebook_bits) << ", "
                                         << key_spec.sub_dim << "] = " << n_kcb);
    VQ_CHECK_FORMAT(L.value_codebook.size() == n_vcb,
                    "artifact: tensor '" << layer_name(i, "value_codebook") << "' has " << L.value_codebook.size()
                                         << " values, expected [" << (1 << value_spec.codebook_bits) << ", "
                                         << value_spec.sub_dim << "] = " << n_vcb);
    check_finite(L.key_codebook, layer_name(i, "key_codebook"));
    check_finite(L.value_codebook, layer_name(i, "value_codebook"));
    for (size_t j = 0; j < L.smooth_factors.size(); ++j) {
      const float x = L.smooth_factors[j];
      VQ_CHECK_FORMAT(std::isfinite(x) && x > 0, "artifact: tensor '" << layer_name(i, "smooth_factors")
                                                                      << "' has a non-positive or non-finite value "
                                                                      << x << " at index " << j);
      if (!use_smooth)
        VQ_CHECK_FORMAT(x == 1.0f, "artifact: key_transform has no smoothing but '"
                                       << layer_name(i, "smooth_factors") << "' is not all ones (index " << j << ")");
    }
  }
}

std::map<std::string, std::string> Artifact::metadata() const {
  std::map<std::string, std::string> m = extra;
  m["format"] = kArtifactFormatName;
  m["format_version"] = std::to_string(format_version);
  m["n_layers"] = std::to_string(n_layers);
  m["n_kv_heads"] = std::to_string(n_kv_heads);
  m["head_dim"] = std::to_string(head_dim);
  m["key_config"] = key_spec.str();
  m["value_config"] = value_spec.str();
  m["key_sub_dim"] = std::to_string(key_spec.sub_dim);
  m["key_codebook_bits"] = std::to_string(key_spec.codebook_bits);
  m["value_sub_dim"] = std::to_string(value_spec.sub_dim);
  m["value_codebook_bits"] = std::to_string(value_spec.codebook_bits);
  m["alpha"] = fmt_double(alpha);
  m["key_transform"] = transform_name(use_smooth, use_hadamard);
  m["calibration_tokens"] = std::to_string(calib_tokens);
  m["calibration_source"] = calib_source;
  nlohmann::json ke = nlohmann::json::array(), ve = nlohmann::json::array();
  for (const auto& L : layers) {
    ke.push_back(L.key_error);
    ve.push_back(L.value_error);
  }
  m["key_reconstruction_error"] = ke.dump();
  m["value_reconstruction_error"] = ve.dump();
  m["key_reconstruction_error_mean"] = fmt_double(mean_key_error());
  m["value_reconstruction_error_mean"] = fmt_double(mean_value_error());
  return m;
}

namespace {
std::vector<NamedTensor> artifact_tensors(const Artifact& a) {
  std::vector<NamedTensor> ts;
  auto view = [](const std::vector<float>& v, Shape s) {
    return TensorView(const_cast<float*>(v.data()), DType::F32, s);
  };
  for (int i = 0; i < a.n_layers; ++i) {
    const ArtifactLayer& L = a.layers[size_t(i)];
    ts.emplace_back(layer_name(i, "smooth_factors"), view(L.smooth_factors, {a.n_kv_heads, a.head_dim}));
    ts.emplace_back(layer_name(i, "key_codebook"),
                    view(L.key_codebook, {int64_t(1) << a.key_spec.codebook_bits, a.key_spec.sub_dim}));
    ts.emplace_back(layer_name(i, "value_codebook"),
                    view(L.value_codebook, {int64_t(1) << a.value_spec.codebook_bits, a.value_spec.sub_dim}));
  }
  return ts;
}
}  // namespace

std::vector<uint8_t> Artifact::serialize() const {
  validate();
  return serialize_safetensors(artifact_tensors(*this), metadata());
}

void Artifact::save(const std::string& path) const {
  validate();
  save_safetensors(path, artifact_tensors(*this), metadata());
}

Artifact Artifact::load(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::open(path);
  try {
    return load_from(f);
  } catch (const FormatError& e) {
    VQ_THROW(FormatError, path << ": " << e.what());
  }
}

Artifact Artifact::from_bytes(const uint8_t* data, size_t size) {
  return load_from(SafetensorsFile::from_bytes(data, size));
}

double Artifact::mean_key_error() const {
  double s = 0;
  for (const auto& L : layers) {
    if (L.key_error < 0) return -1;
    s += L.key_error;
  }
  return layers.empty() ? -1 : s / double(layers.size());
}

double Artifact::mean_value_error() const {
  double s = 0;
  for (const auto& L : layers) {
    if (L.value_error < 0) return -1;
    s += L.value_error;
  }
  return layers.empty() ? -1 : s / double(layers.size());
}

KVCacheConfig artifact_cache_config(const Artifact& a, int layer, KVCacheConfig base) {
  VQ_CHECK_VALUE(layer >= 0 && layer < a.n_layers,
                 "artifact: layer " << layer << " out of range (the artifact has " << a.n_layers << " layers)");
  const ArtifactLayer& L = a.layers.at(size_t(layer));
  base.kind = CacheKind::VecInfer;
  base.head_dim = a.head_dim;
  base.n_kv_heads = a.n_kv_heads;
  base.key_sub_dim = a.key_spec.sub_dim;
  base.key_codebook_bits = a.key_spec.codebook_bits;
  base.value_sub_dim = a.value_spec.sub_dim;
  base.value_codebook_bits = a.value_spec.codebook_bits;
  if (a.use_smooth)
    base.smooth_factors = L.smooth_factors;
  else
    base.smooth_factors.reset();
  base.key_codebook = L.key_codebook;
  base.value_codebook = L.value_codebook;
  base.use_hadamard = a.use_hadamard;
  return base;
}

std::unique_ptr<KVCache> create_cache_from_artifact(const Artifact& a, int layer, const KVCacheConfig& base) {
  return KVCacheFactory::create(artifact_cache_config(a, layer, base));
}

}  // namespace veloxquant
