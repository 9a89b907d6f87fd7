// Calibration: per-layer smooth factors and k-means codebooks from KV samples, with the
// reconstruction errors measured after training; and the KV-samples file reader/writer.
#include "veloxquant/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "veloxquant/cache.h"
#include "veloxquant/error.h"
#include "veloxquant/kmeans.h"
#include "veloxquant/safetensors.h"
#include "veloxquant/smooth.h"

namespace veloxquant {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string layer_tensor(int i, const char* what) { return "layers." + std::to_string(i) + "." + what; }

// Rows of `keys` [n_tokens, n_kv_heads, head_dim] for a subset of tokens: every
// ceil(n_tokens / max_tokens)-th token, all heads. Returns [n_sel, n_kv_heads, head_dim].
std::vector<float> select_tokens(const float* x, int64_t n_tokens, int n_kv_heads, int head_dim, int64_t max_vectors,
                                 int64_t* n_sel) {
  const int64_t row = int64_t(n_kv_heads) * head_dim;
  int64_t max_tokens = max_vectors > 0 ? std::max<int64_t>(1, max_vectors / n_kv_heads) : n_tokens;
  max_tokens = std::min(max_tokens, n_tokens);
  std::vector<float> out(size_t(max_tokens * row));
  for (int64_t i = 0; i < max_tokens; ++i) {
    const int64_t t = i * n_tokens / max_tokens;  // evenly spread
    std::memcpy(out.data() + i * row, x + t * row, size_t(row) * sizeof(float));
  }
  *n_sel = max_tokens;
  return out;
}

// Applies `tr` (forward or inverse) to every row of x [n_tokens, n_kv_heads, head_dim].
void transform_rows(const KeyTransform& tr, float* x, int64_t n_tokens, bool inverse) {
  const int H = tr.n_kv_heads, D = tr.head_dim;
  std::vector<float> buf(size_t(n_tokens) * size_t(D));
  for (int h = 0; h < H; ++h) {
    for (int64_t t = 0; t < n_tokens; ++t)
      std::memcpy(buf.data() + t * D, x + (t * H + h) * D, size_t(D) * sizeof(float));
    if (inverse)
      tr.inverse_keys(buf.data(), n_tokens, h);
    else
      tr.forward_keys(buf.data(), n_tokens, h);
    for (int64_t t = 0; t < n_tokens; ++t)
      std::memcpy(x + (t * H + h) * D, buf.data() + t * D, size_t(D) * sizeof(float));
  }
}

}  // namespace

// ---- KVSamples ------------------------------------------------------------------------------

void KVSamples::validate() const {
  VQ_CHECK_VALUE(n_layers >= 1, "KV samples: n_layers must be >= 1, got " << n_layers);
  VQ_CHECK_VALUE(n_kv_heads >= 1 && head_dim >= 1,
                 "KV samples: n_kv_heads and head_dim must be >= 1, got " << n_kv_heads << ", " << head_dim);
  VQ_CHECK_SHAPE(keys.size() == size_t(n_layers) && values.size() == size_t(n_layers),
                 "KV samples: " << keys.size() << " key and " << values.size() << " value tensors for n_layers = "
                                << n_layers);
  for (int l = 0; l < n_layers; ++l) {
    for (const Tensor* t : {&keys[size_t(l)], &values[size_t(l)]}) {
      const char* what = t == &keys[size_t(l)] ? "keys" : "values";
      VQ_CHECK_SHAPE(t->defined() && t->ndim() == 3 && t->dim(1) == n_kv_heads && t->dim(2) == head_dim &&
                         t->dtype() == DType::F32 && t->device().is_cpu(),
                     "KV samples: layer " << l << " " << what << ": expected f32 [n_tokens, n_kv_heads=" << n_kv_heads
                                          << ", head_dim=" << head_dim << "] on cpu, got "
                                          << (t->defined() ? std::string(dtype_name(t->dtype())) + " " +
                                                                 shape_str(t->sizes())
                                                           : std::string("nothing")));
      VQ_CHECK_SHAPE(t->dim(0) >= 1, "KV samples: layer " << l << " " << what << " holds no tokens");
      const float* p = t->ptr<float>();
      for (int64_t i = 0; i < t->numel(); ++i)
        VQ_CHECK_VALUE(std::isfinite(p[i]), "KV samples: layer " << l << " " << what
                                                                 << " has a non-finite value at flat index " << i);
    }
    VQ_CHECK_SHAPE(keys[size_t(l)].dim(0) == values[size_t(l)].dim(0),
                   "KV samples: layer " << l << " has " << keys[size_t(l)].dim(0) << " key tokens but "
                                        << values[size_t(l)].dim(0) << " value tokens");
  }
}

int64_t KVSamples::max_tokens() const {
  int64_t m = 0;
  for (const auto& k : keys) m = std::max(m, k.dim(0));
  return m;
}

KVSamples KVSamples::load(const std::string& path, int64_t max_tokens) {
  SafetensorsFile f = SafetensorsFile::open(path);
  KVSamples s;
  s.source = path;
  if (auto src = f.metadata_value("source")) s.source = path + " (" + *src + ")";
  auto read = [&](int l, const char* what) -> Tensor {
    const std::string name = layer_tensor(l, what);
    const auto& info = f.info(name);
    VQ_CHECK_FORMAT(info.dtype_str == "F32" || info.dtype_str == "F16" || info.dtype_str == "BF16",
                    path << ": tensor '" << name << "' has dtype " << info.dtype_str << "; expected F32, F16 or BF16");
    TensorView v = f.tensor(name);
    if (v.ndim == 4) {
      // [batch=1, n_kv_heads, n_tokens, head_dim], as caches hold them: view as [n_tokens, H, D].
      VQ_CHECK_FORMAT(v.dim(0) == 1, path << ": tensor '" << name << "' " << v.shape_string()
                                          << ": a rank-4 sample must be [1, n_kv_heads, n_tokens, head_dim]");
      v = TensorView(v.data, v.dtype, {v.dim(2), v.dim(1), v.dim(3)}, {v.stride(2), v.stride(1), v.stride(3)});
    }
    VQ_CHECK_FORMAT(v.ndim == 3, path << ": tensor '" << name << "' " << v.shape_string()
                                      << ": expected [n_tokens, n_kv_heads, head_dim]");
    VQ_CHECK_FORMAT(v.dim(0) >= 1, path << ": tensor '" << name << "' holds no tokens");
    if (max_tokens > 0 && v.dim(0) > max_tokens) v.shape[0] = max_tokens;
    return Tensor::copy_of(v, DType::F32);
  };
  VQ_CHECK_FORMAT(f.contains(layer_tensor(0, "keys")),
                  path << ": no tensor 'layers.0.keys' (a KV samples file holds layers.{i}.keys and layers.{i}.values;"
                          " see docs/kv-samples.md)");
  for (int l = 0; f.contains(layer_tensor(l, "keys")) || f.contains(layer_tensor(l, "values")); ++l) {
    VQ_CHECK_FORMAT(f.contains(layer_tensor(l, "keys")) && f.contains(layer_tensor(l, "values")),
                    path << ": layer " << l << " has " << (f.contains(layer_tensor(l, "keys")) ? "keys" : "values")
                         << " but not " << (f.contains(layer_tensor(l, "keys")) ? "values" : "keys"));
    s.keys.push_back(read(l, "keys"));
    s.values.push_back(read(l, "values"));
  }
  s.n_layers = int(s.keys.size());
  s.n_kv_heads = int(s.keys[0].dim(1));
  s.head_dim = int(s.keys[0].dim(2));
  for (const auto& n : f.names()) {
    bool ours = false;
    for (int l = 0; l < s.n_layers && !ours; ++l) ours = n == layer_tensor(l, "keys") || n == layer_tensor(l, "values");
    VQ_CHECK_FORMAT(ours, path << ": unexpected tensor '" << n.substr(0, 80) << "' (layers must be numbered 0.."
                               << s.n_layers - 1 << " without gaps)");
  }
  try {
    s.validate();
  } catch (const Error& e) {
    VQ_THROW(FormatError, path << ": " << e.what());
  }
  return s;
}

void KVSamples::save(const std::string& path, DType dtype) const {
  validate();
  VQ_CHECK_VALUE(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16,
                 "KV samples: save dtype must be f32, f16 or bf16, got " << dtype_name(dtype));
  std::vector<Tensor> conv;
  std::vector<NamedTensor> ts;
  for (int l = 0; l < n_layers; ++l) {
    for (const char* what : {"keys", "values"}) {
      const Tensor& t = std::string(what) == "keys" ? keys[size_t(l)] : values[size_t(l)];
      conv.push_back(dtype == DType::F32 ? t : Tensor::copy_of(t.view(), dtype));
      ts.emplace_back(layer_tensor(l, what), conv.back().view());
    }
  }
  save_safetensors(path, ts, {{"source", source}, {"format", "veloxquant-kv-samples"}});
}

// ---- calibration ----------------------------------------------------------------------------

double pq_relative_error(const ProductQuantizer& pq, const float* x, int64_t n, int n_kv_heads,
                         const KeyTransform* transform, int n_threads) {
  VQ_CHECK_VALUE(n >= 0 && n_kv_heads >= 1 && n % n_kv_heads == 0,
                 "pq_relative_error: n = " << n << " rows is not a multiple of n_kv_heads = " << n_kv_heads);
  const int D = pq.head_dim;
  const int64_t n_tokens = n / n_kv_heads;
  std::vector<float> work(x, x + n * D);
  if (transform) transform_rows(*transform, work.data(), n_tokens, false);
  std::vector<uint8_t> codes(size_t(n) * size_t(pq.code_bytes));
  pq.encode(work.data(), n, codes.data(), n_threads > 0 ? n_threads : default_threads());
  pq.decode(codes.data(), n, work.data());
  if (transform) transform_rows(*transform, work.data(), n_tokens, true);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n * D; ++i) {
    const double d = double(work[size_t(i)]) - x[i];
    num += d * d;
    den += double(x[i]) * x[i];
  }
  return den > 0 ? num / den : 0.0;
}

CalibrationResult calibrate(const KVSamples& samples, const CalibrationParams& p) {
  samples.validate();
  const int H = samples.n_kv_heads, D = samples.head_dim, L = samples.n_layers;
  // Validates specs against head_dim (ValueError naming them).
  ProductQuantizer kpq(D, p.key_spec), vpq(D, p.value_spec);
  VQ_CHECK_VALUE(std::isfinite(p.alpha) && p.alpha > 0, "calibrate: alpha must be > 0, got " << p.alpha);
  VQ_CHECK_VALUE(p.niter >= 1, "calibrate: iterations must be >= 1, got " << p.niter);
  VQ_CHECK_VALUE(p.max_points_per_centroid >= 0, "calibrate: max_points_per_centroid must be >= 0");
  const int n_threads = p.n_threads > 0 ? p.n_threads : default_threads();

  const auto t_all = std::chrono::steady_clock::now();
  CalibrationResult res;
  Artifact& a = res.artifact;
  a.n_layers = L;
  a.n_kv_heads = H;
  a.head_dim = D;
  a.key_spec = p.key_spec;
  a.value_spec = p.value_spec;
  a.alpha = p.alpha;
  a.use_smooth = p.use_smooth;
  a.use_hadamard = p.use_hadamard;
  a.calib_tokens = samples.max_tokens();
  a.calib_source = samples.source;

  // Fractions of a layer's work per stage, for the progress callback.
  const bool raw = p.measure_untransformed;
  const double w_keys = 0.4, w_values = 0.25, w_raw = raw ? 0.25 : 0.0, w_eval = 0.1;
  const double w_total = w_keys + w_values + w_raw + w_eval;

  for (int l = 0; l < L; ++l) {
    const auto t_layer = std::chrono::steady_clock::now();
    double done = 0;
    auto report = [&](const char* stage, int iter, int n_iter, double stage_frac, double w) {
      if (!p.on_progress) return;
      CalibrationProgress pr;
      pr.layer = l;
      pr.n_layers = L;
      pr.stage = stage;
      pr.iter = iter;
      pr.n_iter = n_iter;
      pr.fraction = std::min(1.0, (done + stage_frac * w) / w_total);
      p.on_progress(pr);
    };
    auto train = [&](const float* x, int64_t n_vec, const PQSpec& spec, const char* stage, double w,
                     uint64_t seed) -> std::vector<float> {
      const int64_t npts = n_vec * (D / spec.sub_dim);
      const int k = 1 << spec.codebook_bits;
      VQ_CHECK_VALUE(npts >= k, "calibrate: layer " << l << " " << stage << ": " << npts << " sub-vectors of dimension "
                                                    << spec.sub_dim << " cannot train " << k << " centroids ("
                                                    << spec.str() << "); provide more calibration tokens");
      KMeansParams kp;
      kp.niter = p.niter;
      kp.seed = seed;
      kp.max_points_per_centroid = p.max_points_per_centroid;
      kp.n_threads = n_threads;
      kp.on_iteration = [&](const KMeansIterationStats& s) { report(stage, s.iter + 1, p.niter, double(s.iter + 1) / p.niter, w); };
      report(stage, 0, p.niter, 0.0, w);
      KMeansResult r = kmeans_train(x, npts, spec.sub_dim, k, kp);
      done += w;
      return std::move(r.centroids);
    };

    LayerCalibrationReport rep;
    rep.layer = l;
    const Tensor& K = samples.keys[size_t(l)];
    const Tensor& V = samples.values[size_t(l)];
    const int64_t n_tok = K.dim(0);
    ArtifactLayer layer;

    // λ and the transform.
    report("smooth", 0, 0, 0.0, 0.0);
    if (p.use_smooth) {
      layer.smooth_factors = compute_smooth_factors(K.view(), SmoothParams{p.alpha, 1e-5f});
    } else {
      layer.smooth_factors.assign(size_t(H) * size_t(D), 1.0f);
    }
    KeyTransform tr(H, D, p.use_smooth ? layer.smooth_factors : std::vector<float>{}, p.use_hadamard);
    tr.use_smooth = p.use_smooth;

    // Key codebook on transformed keys (all sub-vectors of all heads and positions).
    {
      std::vector<float> kt(K.ptr<float>(), K.ptr<float>() + K.numel());
      transform_rows(tr, kt.data(), n_tok, false);
      layer.key_codebook = train(kt.data(), n_tok * H, p.key_spec, "keys", w_keys, p.seed + 1000003ull * l);
      if (p.int8_key_grid) layer.key_codebook = snap_to_int8_grid(layer.key_codebook);
    }
    // Value codebook on raw values.
    layer.value_codebook = train(V.ptr<float>(), n_tok * H, p.value_spec, "values", w_values, p.seed + 1000003ull * l + 1);
    // The ablation: the same k-means on untransformed keys.
    std::vector<float> raw_cb;
    if (raw) raw_cb = train(K.ptr<float>(), n_tok * H, p.key_spec, "keys (no transform)", w_raw, p.seed + 1000003ull * l + 2);
    rep.n_train_key_subvectors =
        std::min<int64_t>(n_tok * H * (D / p.key_spec.sub_dim),
                          p.max_points_per_centroid > 0 ? int64_t(p.max_points_per_centroid) << p.key_spec.codebook_bits
                                                        : INT64_MAX);
    rep.n_train_value_subvectors =
        std::min<int64_t>(n_tok * H * (D / p.value_spec.sub_dim),
                          p.max_points_per_centroid > 0 ? int64_t(p.max_points_per_centroid) << p.value_spec.codebook_bits
                                                        : INT64_MAX);

    // Reconstruction errors on an evenly spread subset of tokens.
    report("evaluate", 0, 0, 0.0, w_eval);
    int64_t n_sel = 0;
    std::vector<float> ks = select_tokens(K.ptr<float>(), n_tok, H, D, p.max_eval_vectors, &n_sel);
    std::vector<float> vs = select_tokens(V.ptr<float>(), n_tok, H, D, p.max_eval_vectors, &n_sel);
    kpq.set_codebook(layer.key_codebook);
    vpq.set_codebook(layer.value_codebook);
    rep.key_error = pq_relative_error(kpq, ks.data(), n_sel * H, H, &tr, n_threads);
    rep.value_error = pq_relative_error(vpq, vs.data(), n_sel * H, H, nullptr, n_threads);
    if (raw) {
      ProductQuantizer rpq(D, p.key_spec, raw_cb);
      rep.key_error_untransformed = pq_relative_error(rpq, ks.data(), n_sel * H, H, nullptr, n_threads);
    }
    done += w_eval;
    layer.key_error = rep.key_error;
    layer.value_error = rep.value_error;
    rep.seconds = seconds_since(t_layer);
    report("done", 0, 0, 0.0, 0.0);
    a.layers.push_back(std::move(layer));
    res.layers.push_back(rep);
  }
  res.seconds = seconds_since(t_all);
  a.validate();
  return res;
}

}  // namespace veloxquant
