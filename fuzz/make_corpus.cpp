// Writes the seed corpus of the fuzz targets: small valid files and a few broken ones.
//   make_corpus <corpus dir>   → <dir>/safetensors/*.safetensors, <dir>/artifact/*.safetensors
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "veloxquant/artifact.h"
#include "veloxquant/fp16_cache.h"
#include "veloxquant/safetensors.h"
#include "veloxquant/vecinfer_cache.h"

using namespace veloxquant;

static void write(const std::string& path, const std::vector<uint8_t>& b) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(b.data(), 1, b.size(), f);
  std::fclose(f);
}

// A cache's state and meta_state as one safetensors image (what fuzz_cache_state reads).
static std::vector<uint8_t> state_image(const KVCache& c) {
  const CacheState s = c.state();
  std::vector<NamedTensor> ts;
  for (const auto& [n, t] : s) ts.emplace_back(n, t.view());
  return serialize_safetensors(ts, c.meta_state());
}

// Small caches of both classes in every mode, empty, inside the window, past it and trimmed:
// head_dim 8, 2 kv heads, keys d2b3, values d4b2, a window of 2, step 4.
static void write_cache_states(const std::string& dir) {
  auto tokens = [](int64_t n, int64_t seed) {
    Tensor t = Tensor::zeros({1, 2, n, 8}, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = float((i * 7 + seed) % 11) * 0.25f - 1.0f;
    return t;
  };
  const char* modes[] = {"standard", "stash", "memory_bound"};
  for (int m = 0; m < 3; ++m) {
    KVCacheConfig c;
    c.head_dim = 8;
    c.n_kv_heads = 2;
    c.key_sub_dim = 2;
    c.key_codebook_bits = 3;
    c.value_sub_dim = 4;
    c.value_codebook_bits = 2;
    c.residual_length = 2;
    c.step = 4;
    c.n_threads = 1;
    c.fused_sdpa = m > 0;
    c.fused_sdpa_memory_bound = m == 2;
    for (int64_t n : {0, 1, 5}) {
      VecInferKVCache v(c);
      if (n > 0) v.update(tokens(n, 1).view(), tokens(n, 2).view());
      write(dir + "/cache_state/vecinfer_" + modes[m] + "_" + std::to_string(n) + ".safetensors", state_image(v));
      if (n == 5) {
        v.trim(2);
        write(dir + "/cache_state/vecinfer_" + modes[m] + "_trimmed.safetensors", state_image(v));
      }
    }
  }
  KVCacheConfig f;
  f.kind = CacheKind::FP16;
  f.head_dim = 8;
  f.step = 4;
  f.storage_dtype = DType::BF16;
  for (int64_t n : {0, 3}) {
    FP16KVCache c(f);
    if (n > 0) c.update(tokens(n, 3).view(), tokens(n, 4).view());
    write(dir + "/cache_state/fp16_" + std::to_string(n) + ".safetensors", state_image(c));
  }
}

static std::vector<uint8_t> raw(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0x3f);
  return out;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus <corpus dir>\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir + "/safetensors");
  std::filesystem::create_directories(dir + "/artifact");
  std::filesystem::create_directories(dir + "/cache_state");
  write_cache_states(dir);

  // --- safetensors
  std::vector<float> f32 = {1.5f, -2.0f, 0.25f, 3.0f, 4.0f, -5.0f};
  std::vector<uint16_t> f16 = {0x3c00, 0xbc00, 0x4000};
  std::vector<uint8_t> u8 = {1, 2, 3};
  std::vector<int64_t> i64 = {-1, 1 << 20};
  write(dir + "/safetensors/valid_mixed.safetensors",
        serialize_safetensors({{"a", TensorView(f32.data(), DType::F32, {2, 3})},
                               {"h", TensorView(f16.data(), DType::F16, {3})},
                               {"b", TensorView(u8.data(), DType::U8, {3})},
                               {"i", TensorView(i64.data(), DType::I64, {2})},
                               {"e", TensorView(f32.data(), DType::F32, {0, 4})}},
                              {{"k", "v"}, {"format", "test"}}));
  write(dir + "/safetensors/valid_empty.safetensors", raw("{}", 0));
  write(dir + "/safetensors/valid_i8_unaligned.safetensors",
        raw(R"({"x":{"dtype":"I8","shape":[3],"data_offsets":[0,3]},"y":{"dtype":"F32","shape":[1],"data_offsets":[3,7]}})", 7));
  write(dir + "/safetensors/bad_overlap.safetensors",
        raw(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  write(dir + "/safetensors/bad_size.safetensors", raw(R"({"x":{"dtype":"BF16","shape":[3,3],"data_offsets":[0,16]}})", 16));
  write(dir + "/safetensors/bad_truncated.safetensors", raw(R"({"x":{"dtype":"F64","shape":[4],"data_offsets":[0,32]}})", 8));
  write(dir + "/safetensors/bad_metadata.safetensors", raw(R"({"__metadata__":{"a":[1,2]}})", 0));

  // --- artifacts: one layer, 2 kv heads, head_dim 8, keys d2b3, values d4b2
  Artifact a;
  a.n_layers = 1;
  a.n_kv_heads = 2;
  a.head_dim = 8;
  a.key_spec = PQSpec{2, 3};
  a.value_spec = PQSpec{4, 2};
  a.calib_tokens = 16;
  a.calib_source = "corpus";
  ArtifactLayer L;
  for (int i = 0; i < 16; ++i) L.smooth_factors.push_back(1.0f + 0.125f * float(i));
  for (int i = 0; i < 16; ++i) L.key_codebook.push_back(0.5f * float(i) - 4.0f);
  for (int i = 0; i < 16; ++i) L.value_codebook.push_back(0.25f * float(i % 5) - 0.5f);
  L.key_error = 0.01;
  L.value_error = 0.02;
  a.layers = {L};
  const std::vector<uint8_t> img = a.serialize();
  write(dir + "/artifact/valid_small.safetensors", img);
  Artifact b = a;
  b.use_smooth = false;
  b.use_hadamard = false;
  b.layers[0].smooth_factors.assign(16, 1.0f);
  write(dir + "/artifact/valid_no_transforms.safetensors", b.serialize());
  write(dir + "/artifact/bad_truncated.safetensors", std::vector<uint8_t>(img.begin(), img.begin() + long(img.size() - 9)));
  SafetensorsFile f = SafetensorsFile::from_bytes(img);
  auto meta = f.metadata();
  meta["format_version"] = "2";
  std::vector<NamedTensor> ts;
  for (const auto& n : f.names()) ts.emplace_back(n, f.tensor(n));
  write(dir + "/artifact/bad_version.safetensors", serialize_safetensors(ts, meta));
  meta["format_version"] = "1";
  meta["head_dim"] = "4";
  write(dir + "/artifact/bad_shape.safetensors", serialize_safetensors(ts, meta));
  std::printf("corpus written to %s\n", dir.c_str());
  return 0;
}
