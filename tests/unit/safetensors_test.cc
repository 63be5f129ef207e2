#include "engine/model/safetensors.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/test_util.h"

namespace switchserve {
namespace {

using ::testing::HasSubstr;

// Writes a safetensors file by hand: `header_length` (8 bytes LE), the header
// text and `data_bytes` zero bytes.
std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes,
                     uint64_t header_length) {
  const std::string path = testing::MakeTempDir("safetensors_raw") + "/" + name;
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(header_length >> (8 * i)));
  out << header << std::string(data_bytes, '\0');
  return path;
}
std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes) {
  return WriteRaw(name, header, data_bytes, header.size());
}

std::string OpenError(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  EXPECT_FALSE(file.ok()) << path;
  return file.ok() ? "" : std::string(file.status().message());
}

TEST(SafetensorsTest, RoundTripsEveryFloatDtype) {
  const std::string dir = testing::MakeTempDir("safetensors_round_trip");
  // Values exactly representable in bf16 and f16 so all three dtypes round trip exactly.
  const std::vector<float> a = {0.0f, -1.5f, 2.0f, 0.25f, -0.125f, 3.0f};
  const std::vector<float> b = {1.0f, -2.0f, 0.5f, 8.0f};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::string path = dir + "/" + std::string(ToString(dtype)) + ".safetensors";
    ASSERT_TRUE(WriteSafetensors(path, {{"a", {2, 3}, a.data(), dtype},
                                        {"layers.0.b", {4}, b.data(), dtype},
                                        {"empty", {0, 3}, nullptr, dtype}})
                    .ok());
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->tensors().size(), 3u);
    const TensorInfo* info = (*file)->Find("a");
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, dtype);
    EXPECT_EQ(info->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(info->numel(), 6);
    EXPECT_EQ(info->size_bytes, 6u * DTypeSize(dtype));
    EXPECT_EQ(*(*file)->ReadAsF32("a"), a);
    EXPECT_EQ(*(*file)->ReadAsF32("layers.0.b"), b);
    EXPECT_TRUE((*file)->ReadAsF32("empty")->empty());
    EXPECT_EQ((*file)->Find("missing"), nullptr);
    EXPECT_EQ((*file)->ReadAsF32("missing").status().code(), absl::StatusCode::kNotFound);
  }
}

// Written as f16 / bf16 and read back: each value lands on the nearest
// representable one, ties to the even mantissa. The expected values are worked
// out by hand (u = the format's unit in the last place at that exponent):
// truncation, rounding ties away from zero or up would each miss some.
TEST(SafetensorsTest, NarrowDtypesRoundToNearestEven) {
  const float h = std::ldexp(1.0f, -10);  // f16 u at [1, 2)
  const float b = std::ldexp(1.0f, -7);   // bf16 u at [1, 2)
  const std::vector<float> to_half = {
      1.0f + 0.75f * h,               // up to 1 + u
      1.0f + 0.5f * h,                // tie: down to 1 (even)
      1.0f + 1.5f * h,                // tie: up to 1 + 2u (even)
      -(2.0f + 0.75f * 2 * h),        // negative, u = 2h at [2, 4)
      0.75f * std::ldexp(1.0f, -24),  // subnormal: up to the smallest
  };
  const std::vector<float> want_half = {1.0f + h, 1.0f, 1.0f + 2 * h, -(2.0f + 2 * h),
                                        std::ldexp(1.0f, -24)};
  const std::vector<float> to_bf16 = {1.0f + 0.75f * b, 1.0f + 0.5f * b, 1.0f + 1.5f * b,
                                      -(3.0f + 0.75f * 2 * b)};
  const std::vector<float> want_bf16 = {1.0f + b, 1.0f, 1.0f + 2 * b, -(3.0f + 2 * b)};
  const std::string path = testing::MakeTempDir("safetensors_narrow") + "/x.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"h", {5}, to_half.data(), DType::kF16},
                                      {"b", {4}, to_bf16.data(), DType::kBF16}})
                  .ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*(*file)->ReadAsF32("h"), want_half);
  EXPECT_EQ(*(*file)->ReadAsF32("b"), want_bf16);
}

TEST(SafetensorsTest, HalfConversionEdgeValues) {
  EXPECT_EQ(HalfToFloat(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));  // signalling nan stays nan

  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // tie goes to even: infinity
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  const uint16_t nan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  // A signalling f32 nan whose payload lives only in the low bits stays a nan.
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::bit_cast<float>(0x7f800001u)))));
  // Round to nearest even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  // Subnormals.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie to even 2
  EXPECT_EQ(FloatToHalf(std::ldexp(5.0f, -25)), 0x0002);  // 2.5 units: tie to even 2
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.0f, -24)), 0x03ff);
  EXPECT_EQ(FloatToHalf(std::ldexp(2047.0f, -25)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(FloatToHalf(1e-30f), 0x0000);
  // Every finite half survives a trip through f32.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0) continue;  // nan
    ASSERT_EQ(FloatToHalf(HalfToFloat(h)), h) << bits;
  }
}

TEST(SafetensorsTest, BFloat16ConversionEdgeValues) {
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xc040), -3.0f);
  EXPECT_EQ(BFloat16ToFloat(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
  EXPECT_EQ(BFloat16ToFloat(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7fc0)));

  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (down).
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie up to even
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBFloat16(std::ldexp(1.0f, -133)), 0x0001);
  EXPECT_EQ(FloatToBFloat16(std::ldexp(1.0f, -134)), 0x0000);  // tie to even
  // A nan whose payload lives only in the low 16 bits must not become inf.
  const uint16_t nan = FloatToBFloat16(std::bit_cast<float>(0x7f800001u));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(nan)));
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(-std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(
      std::signbit(BFloat16ToFloat(FloatToBFloat16(-std::numeric_limits<float>::quiet_NaN()))));
}

TEST(SafetensorsTest, AcceptsMetadataAndIntegerDtypes) {
  const std::string path = WriteRaw(
      "ints.safetensors",
      R"({"__metadata__":{"format":"pt"},"i":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
      R"("j":{"dtype":"I32","shape":[],"data_offsets":[16,20]}})",
      20);
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Find("i")->dtype, DType::kI64);
  EXPECT_EQ((*file)->Find("j")->numel(), 1);  // a scalar
  EXPECT_EQ((*file)->Find("__metadata__"), nullptr);
  const absl::Status status = (*file)->ReadAsF32("i").status();
  EXPECT_THAT(status.message(), HasSubstr("tensor i: expected dtype F32, F16 or BF16, found I64"));
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  auto file = SafetensorsFile::Open("/nonexistent/model.safetensors");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("/nonexistent/model.safetensors"));
}

TEST(SafetensorsTest, TooShortForHeaderLength) {
  const std::string path = testing::MakeTempDir("safetensors_short") + "/short.safetensors";
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_THAT(OpenError(path), HasSubstr("short.safetensors: file is 3 bytes, too short"));
}

TEST(SafetensorsTest, HeaderLengthTooBig) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string path = WriteRaw("big.safetensors", header, 4, header.size() + 100);
  EXPECT_THAT(OpenError(path), HasSubstr("big.safetensors: header length"));
  const std::string huge = WriteRaw("huge.safetensors", header, 4, ~uint64_t{0});
  EXPECT_THAT(OpenError(huge), HasSubstr("header length 18446744073709551615"));
}

// nlohmann's lexer ends its input at a NUL: a valid header followed by one
// and garbage used to load.
TEST(SafetensorsTest, NulByteInTheHeaderIsInvalid) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string path =
      WriteRaw("nul.safetensors", header + std::string(1, '\0') + "garbage{{", 4);
  EXPECT_THAT(OpenError(path),
              HasSubstr("nul.safetensors (header): invalid JSON at byte 54: a NUL byte"));
}

TEST(SafetensorsTest, TruncatedData) {
  const std::string path = testing::MakeTempDir("safetensors_truncated") + "/t.safetensors";
  const std::vector<float> a(64, 1.0f);
  ASSERT_TRUE(WriteSafetensors(path, {{"a", {8, 8}, a.data(), DType::kF32}}).ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 10);
  const std::string message = OpenError(path);
  EXPECT_THAT(message,
              HasSubstr("t.safetensors: tensor a: data_offsets [0, 256] run past the end"));
  EXPECT_THAT(message, HasSubstr("truncated"));
}

TEST(SafetensorsTest, OffsetsOutsideDataSection) {
  const std::string path = WriteRaw(
      "outside.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8);
  EXPECT_THAT(OpenError(path), HasSubstr("outside.safetensors: tensor w: data_offsets [8, 16] run "
                                         "past the end of the data section (8 bytes"));
}

TEST(SafetensorsTest, BadOffsets) {
  for (const char* offsets : {"[8,4]", "[0]", "[-4,0]", "\"0,4\"", "[0,4.0]"}) {
    const std::string path = WriteRaw(
        "offsets.safetensors",
        std::string(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":)") + offsets + "}}", 16);
    EXPECT_THAT(OpenError(path), HasSubstr("tensor w: data_offsets: expected [begin, end]"))
        << offsets;
  }
}

TEST(SafetensorsTest, OverlappingTensors) {
  const std::string path = WriteRaw("overlap.safetensors",
                                    R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                    16);
  EXPECT_THAT(OpenError(path),
              HasSubstr("tensor b: data_offsets [8, 16] overlap tensor a [0, 16]"));
  // An empty tensor in between does not hide the overlap.
  const std::string hidden = WriteRaw("overlap2.safetensors",
                                      R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},)"
                                      R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                      R"("c":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                      32);
  EXPECT_THAT(OpenError(hidden), HasSubstr("tensor c: data_offsets [8, 16] overlap tensor a"));
}

TEST(SafetensorsTest, SizeDoesNotMatchShape) {
  const std::string path = WriteRaw(
      "size.safetensors", R"({"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,16]}})", 16);
  EXPECT_THAT(OpenError(path), HasSubstr("size.safetensors: tensor w: shape [3, 2] of BF16 needs "
                                         "12 bytes, but data_offsets [0, 16] span 16"));
  const std::string overflow =
      WriteRaw("overflow.safetensors",
               R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  EXPECT_THAT(OpenError(overflow), HasSubstr("needs more than 2^64 bytes"));
}

TEST(SafetensorsTest, UnknownDtype) {
  const std::string path = WriteRaw(
      "dtype.safetensors", R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4);
  EXPECT_THAT(OpenError(path),
              HasSubstr("dtype.safetensors: tensor w: unsupported dtype \"F8_E4M3\""));
}

TEST(SafetensorsTest, MalformedEntries) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"w":[1,2]})", "tensor w: expected an object, found [1,2]"},
      {R"({"w":{"dtype":"F32","shape":[1]}})", "tensor w: missing \"data_offsets\""},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})",
       "tensor w: unknown key \"x\""},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
       "tensor w: shape: expected an array of non-negative integers, found [-1]"},
      {R"({"w":{"dtype":"F32","shape":"4","data_offsets":[0,4]}})", "tensor w: shape: expected"},
      {R"({"__metadata__":{"a":1}})", "__metadata__: expected an object of strings"},
      {R"([1,2,3])", "header: expected a JSON object, found [1,2,3]"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       "duplicate key \"w\""},
  };
  for (const auto& [header, expected] : cases) {
    EXPECT_THAT(OpenError(WriteRaw("bad.safetensors", header, 4)), HasSubstr(expected)) << header;
  }
}

TEST(SafetensorsTest, BadJsonHeader) {
  const std::string path = WriteRaw("json.safetensors", R"({"w":{"dtype":"F32",)", 4);
  const std::string message = OpenError(path);
  EXPECT_THAT(message, HasSubstr("json.safetensors (header): invalid JSON at byte"));
  // Header bytes that are not UTF-8 at all.
  EXPECT_THAT(OpenError(WriteRaw("binary.safetensors", std::string("\xff\xfe\x00\x01", 4), 0)),
              HasSubstr("invalid JSON"));
}

// A header of nothing but "[" (up to the 100 MiB a header may hold) is refused
// by a scan before the parser builds its levels: 24 MiB of them took 2 GB.
TEST(SafetensorsTest, DeeplyNestedHeaderIsRefusedBeforeParsing) {
  const std::string path =
      WriteRaw("deep.safetensors", std::string(1 << 20, '[') + std::string(1 << 20, ']'), 0);
  EXPECT_THAT(OpenError(path),
              HasSubstr("deep.safetensors (header): nests arrays and objects more than 64 levels "
                        "deep"));
}

// Corrupts a valid file at random (header bytes flipped, file cut short): Open
// must either fail cleanly or describe tensors that lie inside the file.
TEST(SafetensorsTest, RandomCorruptionNeverCrashes) {
  const std::string dir = testing::MakeTempDir("safetensors_fuzz");
  const std::vector<float> a(12, 0.5f), b(5, -1.0f);
  const std::string good_path = dir + "/good.safetensors";
  ASSERT_TRUE(WriteSafetensors(good_path, {{"a", {3, 4}, a.data(), DType::kF16},
                                           {"b", {5}, b.data(), DType::kF32}})
                  .ok());
  std::string good;
  {
    std::ifstream in(good_path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::mt19937 rng(1234);
  int opened = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < flips; ++i) {
      const size_t at = rng() % std::min<size_t>(bytes.size(), 160);  // mostly the header
      bytes[at] = static_cast<char>(rng() % 2 ? rng() % 256 : "0123456789[]{},:\"F"[rng() % 17]);
    }
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    const std::string path = dir + "/fuzz.safetensors";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      EXPECT_THAT(file.status().message(), HasSubstr("fuzz.safetensors"));
      continue;
    }
    ++opened;
    for (const auto& [name, info] : (*file)->tensors()) {
      EXPECT_EQ(info.size_bytes, static_cast<size_t>(info.numel() * DTypeSize(info.dtype)));
      auto data = (*file)->ReadAsF32(name);  // reads every byte: ASan checks the bounds
      if (data.ok()) {
        EXPECT_EQ(data->size(), static_cast<size_t>(info.numel()));
      }
    }
  }
  EXPECT_GT(opened, 0);  // some flips land in harmless places (e.g. the data)
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  const std::string dir = testing::MakeTempDir("safetensors_writer");
  const float x[2] = {1, 2};
  EXPECT_FALSE(WriteSafetensors(dir + "/a", {{"a", {2}, x, DType::kI32}}).ok());
  EXPECT_FALSE(WriteSafetensors(dir + "/b", {{"a", {2}, x}, {"a", {2}, x}}).ok());
  EXPECT_FALSE(WriteSafetensors(dir + "/c", {{"a", {2}, nullptr}}).ok());
  EXPECT_FALSE(WriteSafetensors(dir + "/no/such/dir/d", {{"a", {2}, x}}).ok());
  EXPECT_THAT(WriteSafetensors(dir + "/e", {{"bad\xff", {2}, x}}).message(),
              HasSubstr("cannot write header"));
}

}  // namespace
}  // namespace switchserve
