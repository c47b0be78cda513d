// records/dtype.h: one dtype enum for the spec, the parser and the pipeline.
#include "records/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "records/errors.h"
#include "records/example_parser.h"
#include "records/feature_spec.h"

namespace recflow::records {
namespace {

constexpr DType kAll[] = {DType::kFloat32, DType::kFloat64, DType::kInt32,
                          DType::kInt64,   DType::kUInt8,   DType::kBytes};

TEST(DTypeTest, NamesParseBackAndSizesAreTheElements) {
  for (DType d : kAll) EXPECT_EQ(ParseDType(DTypeName(d)), d) << DTypeName(d);
  EXPECT_EQ(ParseDType("float"), std::nullopt);
  EXPECT_EQ(ParseDType(""), std::nullopt);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kInt32), 4u);
  EXPECT_EQ(DTypeSize(DType::kUInt8), 1u);
  EXPECT_EQ(DTypeSize(DType::kBytes), 0u);
  EXPECT_EQ(TensorFlowDTypeName(DType::kBytes), "string");
  EXPECT_EQ(TensorFlowDTypeName(DType::kFloat32), "float");
}

TEST(DTypeTest, OnlyTheThreeListsOfAFeatureAreExampleDTypes) {
  int example = 0;
  for (DType d : kAll) example += IsExampleDType(d);
  EXPECT_EQ(example, 3);
  EXPECT_EQ(ParseExampleDType("float"), DType::kFloat32);
  EXPECT_EQ(ParseExampleDType("string"), DType::kBytes);
  EXPECT_EQ(ParseExampleDType("float64"), std::nullopt);
}

TEST(DTypeTest, ASpecRefusesADTypeNoExampleHolds) {
  FeatureSpec spec;
  FeatureConfig c;
  c.dtype = DType::kFloat64;
  try {
    spec.Add("x", c);
    FAIL() << "float64 accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "spec: feature 'x': dtype float64 is not one an Example "
                 "holds (float32, int64 or bytes)");
  }
  EXPECT_TRUE(spec.features.empty());
  // A spec assembled by hand reaches the parser's own check.
  spec.features.emplace_back("y", c);
  EXPECT_THROW(ExampleParser{spec}, Error);
  EXPECT_THROW(FeatureSpec::FromJsonText(
                   R"({"features": {"x": {"kind": "fixed", "dtype": "uint8",
                                          "shape": []}}})"),
               Error);
}

// Every half against its definition: (-1)^s * 2^(e-15) * (1 + m/1024),
// subnormals 2^-14 * m/1024, e = 31 infinities and NaN.
TEST(DTypeTest, EveryHalfConvertsExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const int e = static_cast<int>((h >> 10) & 0x1f);
    const int m = static_cast<int>(h & 0x3ff);
    const double sign = (h & 0x8000) != 0 ? -1 : 1;
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    if (e == 31) {
      EXPECT_TRUE(m == 0 ? std::isinf(got) : std::isnan(got)) << h;
      EXPECT_EQ(std::signbit(got), sign < 0) << h;
      continue;
    }
    const double want = e == 0 ? sign * std::ldexp(m, -24)
                               : sign * std::ldexp(1024 + m, e - 25);
    EXPECT_EQ(got, static_cast<float>(want)) << h;
    EXPECT_EQ(std::signbit(got), sign < 0) << h;
  }
}

}  // namespace
}  // namespace recflow::records
