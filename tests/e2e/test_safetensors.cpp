// safetensors reader/writer: round trips of every dtype (exact), zero copy and alignment,
// and rejection of malformed files (every truncation, hand-made corrupt headers) with
// FormatError — never a crash. Tolerance tier: exact.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "veloxquant/error.h"
#include "veloxquant/safetensors.h"

using namespace veloxquant;

namespace {

// A raw safetensors image from a header string and a data region.
std::vector<uint8_t> raw_image(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(n >> (8 * i));
  // (sized once, then copied: two inserts made GCC 12 warn -Wstringop-overread, a false positive)
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + std::ptrdiff_t(header.size()));
  return out;
}

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("vq_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  std::mt19937 rng(7);
  std::vector<float> f32(2 * 3 * 5);
  for (auto& x : f32) x = std::normal_distribution<float>()(rng);
  std::vector<uint16_t> f16(7), bf16(4 * 2);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = float_to_half(float(i) * 0.25f - 1.0f);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = float_to_bf16(float(i) * 3.5f);
  std::vector<uint8_t> u8 = {1, 2, 3};  // odd byte size: must not misalign anything after it
  std::vector<uint16_t> u16 = {65535, 1, 2};
  std::vector<uint32_t> u32 = {0xDEADBEEFu};
  std::vector<int32_t> i32 = {-5, 7, 9, -11, 13};
  std::vector<int64_t> i64 = {-(int64_t(1) << 40), 3};
  std::vector<NamedTensor> ts = {
      {"u8", TensorView(u8.data(), DType::U8, {3})},
      {"a.f32", TensorView(f32.data(), DType::F32, {2, 3, 5})},
      {"f16", TensorView(f16.data(), DType::F16, {7})},
      {"bf16", TensorView(bf16.data(), DType::BF16, {4, 2})},
      {"u16", TensorView(u16.data(), DType::U16, {3})},
      {"u32", TensorView(u32.data(), DType::U32, {1})},
      {"i32", TensorView(i32.data(), DType::I32, {5})},
      {"i64", TensorView(i64.data(), DType::I64, {2})},
      {"empty", TensorView(f32.data(), DType::F32, {0, 4})},
      {"scalar", TensorView(f32.data(), DType::F32, Shape{})},
  };
  std::map<std::string, std::string> meta = {{"format", "test"}, {"note", "π ≈ 3.14"}};
  const std::string path = tmp_path("rt.safetensors");
  save_safetensors(path, ts, meta);
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.header().data_start % 8, 0u);
  EXPECT_EQ(f.names().size(), ts.size());
  for (const auto& [name, v] : ts) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.contains(name));
    TensorView r = f.tensor(name);
    EXPECT_EQ(r.dtype, v.dtype);
    EXPECT_EQ(r.sizes(), v.sizes());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data) % dtype_size(r.dtype), 0u);
    // Zero copy: the view points into the mapping.
    const uint8_t* raw = f.raw_data(name);
    EXPECT_EQ(static_cast<const void*>(raw), r.data);
    EXPECT_EQ(0, std::memcmp(r.data, v.data, size_t(v.nbytes())));
  }
  EXPECT_EQ(f.read_f32("a.f32"), f32);
  EXPECT_FLOAT_EQ(f.read_f32("f16")[3], -0.25f);
  std::remove(path.c_str());
}

TEST(Safetensors, StridedViewWrittenContiguously) {
  std::vector<float> x(4 * 6);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  // Transposed view [6, 4] of a [4, 6] buffer.
  TensorView t(x.data(), DType::F32, {6, 4}, {1, 6});
  auto img = serialize_safetensors({{"t", t}});
  SafetensorsFile f = SafetensorsFile::from_bytes(img);
  auto r = f.read_f32("t");
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(r[i * 4 + j], x[j * 6 + i]);
}

TEST(Safetensors, WriterRejectsBadNames) {
  float x = 1;
  TensorView v(&x, DType::F32, {1});
  EXPECT_THROW(serialize_safetensors({{"", v}}), ValueError);
  EXPECT_THROW(serialize_safetensors({{"__metadata__", v}}), ValueError);
  EXPECT_THROW(serialize_safetensors({{"a", v}, {"a", v}}), ValueError);
  EXPECT_THROW(save_safetensors("/nonexistent-dir/x.safetensors", {{"a", v}}), IoError);
}

TEST(Safetensors, MisalignedTensorIsCopiedAligned) {
  // Header of odd length: the data region starts at an odd address.
  std::string h = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  if ((8 + h.size()) % 2 == 0) h += " ";
  std::vector<uint8_t> data(8);
  const float vals[2] = {1.5f, -2.25f};
  std::memcpy(data.data(), vals, 8);
  SafetensorsFile f = SafetensorsFile::from_bytes(raw_image(h, data));
  TensorView v = f.tensor("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 4, 0u);
  EXPECT_EQ(v.ptr<float>()[0], 1.5f);
  EXPECT_EQ(v.ptr<float>()[1], -2.25f);
}

TEST(Safetensors, DtypesWithoutVeloxquantEquivalent) {
  std::string h = R"({"b":{"dtype":"I8","shape":[3],"data_offsets":[0,3]}})";
  SafetensorsFile f = SafetensorsFile::from_bytes(raw_image(h, {1, 2, 3}));
  EXPECT_EQ(f.info("b").element_size, 1);
  EXPECT_FALSE(f.info("b").dtype.has_value());
  EXPECT_THROW(f.tensor("b"), FormatError);
  EXPECT_THROW(f.tensor("missing"), FormatError);
}

TEST(Safetensors, EveryTruncationIsRejected) {
  std::vector<float> x(10, 1.0f);
  auto img = serialize_safetensors({{"x", TensorView(x.data(), DType::F32, {10})}}, {{"k", "v"}});
  for (size_t n = 0; n < img.size(); ++n) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " bytes");
    EXPECT_THROW(parse_safetensors(img.data(), n), FormatError);
  }
  EXPECT_NO_THROW(parse_safetensors(img.data(), img.size()));
}

TEST(Safetensors, CorruptHeadersAreRejected) {
  const std::vector<uint8_t> d16(16, 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "{hello"},
      {"not an object", "[1,2]"},
      {"unknown dtype", R"({"x":{"dtype":"F31","shape":[4],"data_offsets":[0,16]}})"},
      {"size mismatch", R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})"},
      {"end past data", R"({"x":{"dtype":"F32","shape":[5],"data_offsets":[0,20]}})"},
      {"begin > end", R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})"},
      {"negative dim", R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})"},
      {"float dim", R"({"x":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}})"},
      {"huge dims overflow", R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})"},
      {"huge offset", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[18446744073709551615,16]}})"},
      {"missing offsets", R"({"x":{"dtype":"F32","shape":[4]}})"},
      {"three offsets", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16,16]}})"},
      {"overlap", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})"},
      {"duplicate", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})"},
      {"metadata not strings", R"({"__metadata__":{"a":1}})"},
      {"metadata not object", R"({"__metadata__":"a"})"},
      {"entry not object", R"({"x":5})"},
      {"unknown field", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"extra":1}})"},
      {"deep nesting", "{\"__metadata__\":" + std::string(200, '[') + std::string(200, ']') + "}"},
      {"bad utf8", "{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}"},
  };
  for (const auto& [what, header] : cases) {
    SCOPED_TRACE(what);
    auto img = raw_image(header, d16);
    EXPECT_THROW(parse_safetensors(img.data(), img.size()), FormatError);
  }
  // Header length larger than the file, and larger than the bound.
  auto img = raw_image("{}", {});
  img[0] = 0xFF;
  EXPECT_THROW(parse_safetensors(img.data(), img.size()), FormatError);
  std::fill(img.begin(), img.begin() + 8, uint8_t(0xFF));
  EXPECT_THROW(parse_safetensors(img.data(), img.size()), FormatError);
}

TEST(Safetensors, AcceptsEmptyHeaderAndTrailingSpaces) {
  auto img = raw_image("{}      ", {});
  auto h = parse_safetensors(img.data(), img.size());
  EXPECT_TRUE(h.tensors.empty());
  EXPECT_TRUE(h.metadata.empty());
}

TEST(Safetensors, OpenErrorsAreIoErrors) {
  EXPECT_THROW(SafetensorsFile::open("/nonexistent/file.safetensors"), IoError);
  EXPECT_THROW(SafetensorsFile::open("/tmp"), IoError);
  const std::string path = tmp_path("bad.safetensors");
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fputs("garbage", f);
  std::fclose(f);
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "no exception";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}
