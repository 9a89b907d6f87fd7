// Artifact format, KV-samples files, calibration and the cache factory (tolerance: exact for
// round trips and rejections; statistical for the calibration sanity bounds).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "veloxquant/artifact.h"
#include "veloxquant/calibrate.h"
#include "veloxquant/error.h"
#include "veloxquant/kivi.h"
#include "veloxquant/safetensors.h"
#include "veloxquant/synthetic.h"
#include "veloxquant/vecinfer_cache.h"

using namespace veloxquant;

namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("vq_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

SyntheticKVConfig small_model() {
  SyntheticKVConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.n_heads = 4;
  c.head_dim = 64;
  c.seed = 3;
  return c;
}

Artifact small_artifact() {
  SyntheticKVModel m(small_model());
  auto seq = m.generate(512, 0, 1);
  CalibrationParams p;
  p.key_spec = PQSpec::parse("d4b6");
  p.value_spec = PQSpec::parse("d8b5");
  p.niter = 5;
  p.max_points_per_centroid = 32;
  return calibrate(seq.kv, p).artifact;
}

// Rewrites one metadata entry (or tensor) of a valid artifact image and returns the new image.
std::vector<uint8_t> with_metadata(const Artifact& a, const std::string& key, const std::string& value) {
  SafetensorsFile f = SafetensorsFile::from_bytes(a.serialize());
  auto meta = f.metadata();
  if (value == "<erase>")
    meta.erase(key);
  else
    meta[key] = value;
  std::vector<NamedTensor> ts;
  for (const auto& n : f.names()) ts.emplace_back(n, f.tensor(n));
  return serialize_safetensors(ts, meta);
}

}  // namespace

TEST(Artifact, SaveLoadRoundTripIsExact) {
  const Artifact a = small_artifact();
  const std::string path = tmp_path("a.safetensors");
  a.save(path);
  const Artifact b = Artifact::load(path);
  EXPECT_EQ(b.n_layers, 2);
  EXPECT_EQ(b.n_kv_heads, 2);
  EXPECT_EQ(b.head_dim, 64);
  EXPECT_EQ(b.key_spec, PQSpec::parse("d4b6"));
  EXPECT_EQ(b.value_spec, PQSpec::parse("d8b5"));
  EXPECT_EQ(b.calib_tokens, 512);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(b.layers[l].smooth_factors, a.layers[l].smooth_factors);
    EXPECT_EQ(b.layers[l].key_codebook, a.layers[l].key_codebook);
    EXPECT_EQ(b.layers[l].value_codebook, a.layers[l].value_codebook);
    EXPECT_NEAR(b.layers[l].key_error, a.layers[l].key_error, 1e-9);
  }
  // Readable as plain safetensors, with the documented names and metadata.
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata_value("format"), std::string("veloxquant-artifact"));
  EXPECT_EQ(f.metadata_value("format_version"), std::string("1"));
  EXPECT_EQ(f.info("layers.1.key_codebook").shape, (Shape{64, 4}));
  EXPECT_EQ(f.info("layers.0.smooth_factors").shape, (Shape{2, 64}));
  std::remove(path.c_str());
}

TEST(Artifact, LoadingRejectsBadFiles) {
  const Artifact a = small_artifact();
  struct Case {
    const char* what;
    std::string key, value;
  };
  const std::vector<Case> cases = {
      {"unknown version", "format_version", "2"},
      {"not an artifact", "format", "something-else"},
      {"missing key", "n_layers", "<erase>"},
      {"more layers than tensors", "n_layers", "3"},
      {"non-integer", "head_dim", "64.5"},
      {"spec mismatch", "key_config", "d4b8"},
      {"bits out of range", "key_codebook_bits", "17"},
      {"bad transform", "key_transform", "rotate"},
      {"bad alpha", "alpha", "nan"},
      {"bad errors array", "key_reconstruction_error", "[1,"},
      {"wrong shape via head_dim", "head_dim", "32"},
      {"huge layer count", "n_layers", "100000000"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto img = with_metadata(a, c.key, c.value);
    EXPECT_THROW(Artifact::from_bytes(img.data(), img.size()), FormatError);
  }
  // A non-finite codebook value, named in the error.
  {
    Artifact b = a;
    b.layers[1].key_codebook[7] = NAN;
    EXPECT_THROW(b.serialize(), FormatError);
    SafetensorsFile f = SafetensorsFile::from_bytes(a.serialize());
    std::vector<NamedTensor> ts;
    std::vector<float> bad = f.read_f32("layers.1.key_codebook");
    bad[7] = INFINITY;
    for (const auto& n : f.names())
      ts.emplace_back(n, n == "layers.1.key_codebook" ? TensorView(bad.data(), DType::F32, {64, 4}) : f.tensor(n));
    auto img = serialize_safetensors(ts, f.metadata());
    try {
      Artifact::from_bytes(img.data(), img.size());
      ADD_FAILURE() << "no exception";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("layers.1.key_codebook"), std::string::npos) << e.what();
    }
  }
  // A missing tensor and an extra tensor.
  {
    SafetensorsFile f = SafetensorsFile::from_bytes(a.serialize());
    std::vector<NamedTensor> ts;
    for (const auto& n : f.names())
      if (n != "layers.0.value_codebook") ts.emplace_back(n, f.tensor(n));
    auto img = serialize_safetensors(ts, f.metadata());
    EXPECT_THROW(Artifact::from_bytes(img.data(), img.size()), FormatError);
    float x = 1;
    ts.clear();
    for (const auto& n : f.names()) ts.emplace_back(n, f.tensor(n));
    ts.emplace_back("layers.9.extra", TensorView(&x, DType::F32, {1}));
    img = serialize_safetensors(ts, f.metadata());
    EXPECT_THROW(Artifact::from_bytes(img.data(), img.size()), FormatError);
  }
  // Every truncation of a valid image fails cleanly.
  const auto img = a.serialize();
  for (size_t n = 0; n < img.size(); n += 97) EXPECT_THROW(Artifact::from_bytes(img.data(), n), FormatError);
}

TEST(Artifact, CacheFromArtifactUsesItsCodebooks) {
  const Artifact a = small_artifact();
  KVCacheConfig base;
  base.residual_length = 16;
  base.fused_sdpa = true;
  const KVCacheConfig cfg = artifact_cache_config(a, 1, base);
  EXPECT_EQ(cfg.kind, CacheKind::VecInfer);
  EXPECT_EQ(cfg.key_sub_dim, 4);
  EXPECT_EQ(cfg.key_codebook_bits, 6);
  EXPECT_EQ(cfg.value_sub_dim, 8);
  EXPECT_EQ(cfg.value_codebook_bits, 5);
  EXPECT_EQ(cfg.residual_length, 16);
  ASSERT_TRUE(cfg.key_codebook.has_value());
  EXPECT_EQ(*cfg.key_codebook, a.layers[1].key_codebook);
  EXPECT_EQ(*cfg.smooth_factors, a.layers[1].smooth_factors);
  auto cache = create_cache_from_artifact(a, 1, base);
  auto* vc = dynamic_cast<VecInferKVCache*>(cache.get());
  ASSERT_NE(vc, nullptr);
  EXPECT_FALSE(vc->uses_random_codebooks());
  // the key codebook on the int8 grid (KVCacheConfig::int8_key_grid, the default), the values' as trained
  EXPECT_EQ(vc->key_quantizer().codebook, snap_to_int8_grid(a.layers[1].key_codebook));
  EXPECT_EQ(vc->value_quantizer().codebook, a.layers[1].value_codebook);
  KVCacheConfig as_given = base;
  as_given.int8_key_grid = false;
  auto cache2 = create_cache_from_artifact(a, 1, as_given);
  EXPECT_EQ(dynamic_cast<VecInferKVCache*>(cache2.get())->key_quantizer().codebook, a.layers[1].key_codebook);
  EXPECT_THROW(artifact_cache_config(a, 2), ValueError);
  EXPECT_THROW(artifact_cache_config(a, -1), ValueError);
}

TEST(Calibration, ErrorsAreSaneAndDeterministic) {
  SyntheticKVModel m(small_model());
  auto seq = m.generate(1024, 0, 1);
  CalibrationParams p;
  p.key_spec = PQSpec::parse("d4b8");
  p.value_spec = PQSpec::parse("d4b8");
  p.niter = 10;
  auto r1 = calibrate(seq.kv, p);
  auto r2 = calibrate(seq.kv, p);
  ASSERT_EQ(r1.layers.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    const auto& L = r1.layers[l];
    // Two bits per element: well below the trivial error of 1 (all zeros), above 0.
    EXPECT_GT(L.key_error, 0.0);
    EXPECT_LT(L.key_error, 0.3);
    EXPECT_GT(L.value_error, 0.0);
    EXPECT_LT(L.value_error, 0.3);
    EXPECT_GT(L.key_error_untransformed, 0.0);
    EXPECT_EQ(r1.artifact.layers[l].key_codebook, r2.artifact.layers[l].key_codebook) << "layer " << l;
    EXPECT_EQ(L.key_error, r2.layers[l].key_error);
    // the key codebook on its int8 grid (CalibrationParams::int8_key_grid), the values' as trained
    const std::vector<float>& kcb = r1.artifact.layers[l].key_codebook;
    EXPECT_EQ(snap_to_int8_grid(kcb), kcb) << "layer " << l;
    EXPECT_NE(snap_to_int8_grid(r1.artifact.layers[l].value_codebook), r1.artifact.layers[l].value_codebook);
    // λ = sqrt(max |K|) per (head, channel).
    const float* K = seq.kv.keys[l].ptr<float>();
    float mx = 0;
    for (int64_t t = 0; t < 1024; ++t) mx = std::max(mx, std::fabs(K[(t * 2 + 1) * 64 + 5]));
    EXPECT_NEAR(r1.artifact.layers[l].smooth_factors[64 + 5], std::sqrt(mx), 1e-4f * std::sqrt(mx));
  }
  // without the grid: the k-means result as it is (not on the grid), a key error within a few
  // percent of the grid's
  CalibrationParams raw = p;
  raw.int8_key_grid = false;
  auto r3 = calibrate(seq.kv, raw);
  for (int l = 0; l < 2; ++l) {
    const std::vector<float>& kcb = r3.artifact.layers[l].key_codebook;
    EXPECT_NE(snap_to_int8_grid(kcb), kcb) << "layer " << l;
    EXPECT_EQ(snap_to_int8_grid(kcb), r1.artifact.layers[l].key_codebook) << "layer " << l;
    EXPECT_NEAR(r1.layers[l].key_error, r3.layers[l].key_error, 0.05 * r3.layers[l].key_error) << "layer " << l;
  }
  // Too few tokens for the codebook size: a clear error.
  auto tiny = m.generate(2, 0, 1);
  p.key_spec = PQSpec::parse("d4b12");
  EXPECT_THROW(calibrate(tiny.kv, p), ValueError);
}

TEST(KVSamples, FileRoundTripAndCacheLayout) {
  SyntheticKVModel m(small_model());
  auto seq = m.generate(100, 0, 1);
  const std::string path = tmp_path("kv.safetensors");
  seq.kv.save(path);
  KVSamples s = KVSamples::load(path);
  EXPECT_EQ(s.n_layers, 2);
  EXPECT_EQ(s.n_tokens(1), 100);
  EXPECT_EQ(s.keys[1].to_vector_f32(), seq.kv.keys[1].to_vector_f32());
  KVSamples capped = KVSamples::load(path, 40);
  EXPECT_EQ(capped.n_tokens(0), 40);
  // The cache layout [1, n_kv_heads, n_tokens, head_dim] in f16 is accepted and transposed.
  std::vector<Tensor> keep;
  std::vector<NamedTensor> ts;
  for (int l = 0; l < 2; ++l)
    for (const char* what : {"keys", "values"}) {
      const Tensor& src = std::string(what) == "keys" ? seq.kv.keys[l] : seq.kv.values[l];
      Tensor t = Tensor::empty({1, 2, 100, 64}, DType::F16);
      copy_into(TensorView(src.data(), DType::F32, {1, 2, 100, 64}, {0, 64, 128, 1}), t.view());
      keep.push_back(t);
      ts.emplace_back("layers." + std::to_string(l) + "." + what, t.view());
    }
  save_safetensors(path, ts);
  KVSamples c = KVSamples::load(path);
  EXPECT_EQ(c.keys[0].sizes(), (Shape{100, 2, 64}));
  EXPECT_EQ(c.keys[0].ptr<float>()[(7 * 2 + 1) * 64 + 3], round_to_half(seq.kv.keys[0].ptr<float>()[(7 * 2 + 1) * 64 + 3]));
  // A layer with keys but no values.
  ts.pop_back();
  save_safetensors(path, ts);
  EXPECT_THROW(KVSamples::load(path), FormatError);
  std::remove(path.c_str());
}

TEST(Kivi, CacheMatchesTheOracleAndItsWindowPolicy) {
  KiviConfig kc;
  kc.head_dim = 64;
  kc.bits = 2;
  kc.group_size = 32;
  kc.residual_length = 40;
  kc.n_threads = 2;
  KiviKVCache cache(kc);
  SyntheticKVModel m(small_model());
  auto seq = m.generate(200, 4, 1);
  const Tensor& K = seq.kv.keys[0];
  const Tensor& V = seq.kv.values[0];
  // Fill in uneven chunks.
  int64_t t0 = 0;
  for (int64_t n : {1, 50, 7, 100, 42}) {
    TensorView k(K.ptr<float>() + t0 * 128, DType::F32, {1, 2, n, 64}, {0, 64, 128, 1});
    TensorView v(V.ptr<float>() + t0 * 128, DType::F32, {1, 2, n, 64}, {0, 64, 128, 1});
    cache.update(k, v);
    t0 += n;
  }
  ASSERT_EQ(cache.offset(), 200);
  EXPECT_EQ(cache.residual_count(), 40);
  EXPECT_EQ(cache.quantized_value_tokens(), 160);  // everything outside the window
  EXPECT_EQ(cache.quantized_key_tokens(), 160);    // 5 whole blocks of 32 end at 160
  // Against the oracle, group by group (exact: same fp16 arithmetic).
  Tensor dk = cache.dequantized_keys_f32(), dv = cache.dequantized_values_f32();
  for (int h = 0; h < 2; ++h) {
    std::vector<float> x(200 * 64), ref(200 * 64);
    for (int64_t t = 0; t < 200; ++t)
      for (int c = 0; c < 64; ++c) x[t * 64 + c] = round_to_half(K.ptr<float>()[(t * 2 + h) * 64 + c]);
    ref = x;
    for (int64_t b = 0; b < 160; b += 32)
      for (int c = 0; c < 64; ++c) kivi_quantize_group_ref(x.data() + b * 64 + c, 32, 64, 2, ref.data() + b * 64 + c);
    for (int64_t i = 0; i < 200 * 64; ++i)
      ASSERT_EQ(dk.ptr<float>()[h * 200 * 64 + i], ref[i]) << "key head " << h << " index " << i;
    for (int64_t t = 0; t < 200; ++t)
      for (int c = 0; c < 64; ++c) x[t * 64 + c] = round_to_half(V.ptr<float>()[(t * 2 + h) * 64 + c]);
    ref = x;
    for (int64_t t = 0; t < 160; ++t)
      for (int g = 0; g < 2; ++g) kivi_quantize_group_ref(x.data() + t * 64 + g * 32, 32, 1, 2, ref.data() + t * 64 + g * 32);
    for (int64_t i = 0; i < 200 * 64; ++i)
      ASSERT_EQ(dv.ptr<float>()[h * 200 * 64 + i], ref[i]) << "value head " << h << " index " << i;
  }
  // fused_sdpa equals attention_ref over the dequantized K/V (bounded: fp32 vs double).
  const TensorView q(seq.queries[0].data(), DType::F32, {1, 4, 4, 64}, {0, 64, 256, 1});
  Tensor out = cache.fused_sdpa(q, {});
  Tensor ref = Tensor::empty({1, 4, 4, 64}, DType::F32);
  attention_ref(q, dk.view(), dv.view(), ref.view(), {});
  for (int64_t i = 0; i < ref.numel(); ++i) EXPECT_NEAR(out.ptr<float>()[i], ref.ptr<float>()[i], 1e-4f) << i;
  // Bytes: 2-bit codes, fp16 scale+zero per group, fp16 exact part.
  const int64_t expect = 2 * (160 * 16 /*key codes*/ + 5 * 64 * 4 /*key scale+zero*/ + 40 * 64 * 2 /*exact keys*/ +
                              160 * 16 /*value codes*/ + 160 * 2 * 4 /*value scale+zero*/ + 40 * 64 * 2);
  EXPECT_EQ(cache.nbytes(), expect);
  // trim into a coded key block: coded blocks kept are unchanged; the surviving rows of the cut
  // block (positions 128, 129) move to the fp16 part as their fp16-rounded dequantized values.
  const std::vector<float> before = cache.dequantized_keys_f32().to_vector_f32();
  EXPECT_EQ(cache.trim(70), 70);
  EXPECT_EQ(cache.offset(), 130);
  const Tensor after = cache.dequantized_keys_f32();
  for (int h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 130 * 64; ++i)
      ASSERT_EQ(after.ptr<float>()[h * 130 * 64 + i],
                i < 128 * 64 ? before[h * 200 * 64 + i] : round_to_half(before[h * 200 * 64 + i]))
          << "head " << h << " index " << i;
  EXPECT_THROW(cache.restore({}, {}), UnsupportedError);
}
