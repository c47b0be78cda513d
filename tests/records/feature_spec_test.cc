// records/feature_spec.cc: the spec's JSON form, as `--spec FILE` and
// `recflow inspect --spec` read and write it.
#include "records/feature_spec.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "records/errors.h"
#include "test_util.h"

namespace recflow::records {
namespace {

// The error reading `json`, "" when it reads.
std::string SpecErrorOf(const std::string& json) {
  try {
    FeatureSpec::FromJsonText(json);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
std::string FeatureErrorOf(const std::string& feature) {
  return SpecErrorOf(R"({"features": {"x": )" + feature + "}}");
}

// Every malformed spec is refused, naming the feature and what was
// expected; none is read as something it does not say.
TEST(FeatureSpecTest, AMalformedSpecIsRefusedWithTheFeatureAndWhatWasExpected) {
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "int64", "shape": [2], "default": 7})"),
            "");
  EXPECT_EQ(SpecErrorOf("{").rfind("spec: not valid JSON: ", 0), 0u)
      << SpecErrorOf("{");
  // A key twice in one object: JSON parsers keep the last value.
  EXPECT_EQ(SpecErrorOf(R"({"features": {"x": {"dtype": "int64"},
                                         "x": {"dtype": "bytes"}}})"),
            "spec: key \"x\" appears twice in one object; JSON keeps the "
            "last value, so the first would be ignored");
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "int64", "shape": [2], "shape": []})"),
            "spec: key \"shape\" appears twice in one object; JSON keeps the "
            "last value, so the first would be ignored");
  // One name in different objects is no repeat.
  EXPECT_EQ(SpecErrorOf(R"({"features": {"dtype": {"dtype": "int64"},
                                         "y": {"dtype": "int64"}}})"),
            "");
  EXPECT_EQ(SpecErrorOf(R"({"features": []})"),
            R"(spec: expected {"features": {"NAME": {...}, ...}})");
  EXPECT_EQ(SpecErrorOf("[]"),
            R"(spec: expected {"features": {"NAME": {...}, ...}})");
  EXPECT_EQ(FeatureErrorOf("3"), "spec: feature 'x': expected an object");
  EXPECT_EQ(FeatureErrorOf(R"({"kind": "sparse", "dtype": "int64"})"),
            R"(spec: feature 'x': kind "sparse": expected "fixed" or "var")");
  EXPECT_EQ(FeatureErrorOf(R"({"kind": 5, "dtype": "int64"})"),
            R"(spec: feature 'x': kind 5: expected "fixed" or "var")");
  EXPECT_EQ(FeatureErrorOf(R"({"shape": [1]})"),
            "spec: feature 'x': needs a dtype (float32, int64 or bytes)");
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": 1})"),
            "spec: feature 'x': needs a dtype (float32, int64 or bytes)");
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "uint8"})"),
            "spec: feature 'x': dtype 'uint8': expected float32, int64 or "
            "bytes");
  EXPECT_EQ(
      FeatureErrorOf(R"({"kind": "var", "dtype": "int64", "shape": [2]})"),
      "spec: feature 'x': a var feature has no shape");
  EXPECT_EQ(
      FeatureErrorOf(R"({"kind": "var", "dtype": "int64", "default": 0})"),
      "spec: feature 'x': a var feature has no default");
  for (const char* shape : {"3", "[-1]", "[2.5]", R"(["2"])", "{}"}) {
    EXPECT_EQ(FeatureErrorOf(std::string(R"({"dtype": "int64", "shape": )") +
                             shape + "}"),
              std::string("spec: feature 'x': shape ") +
                  nlohmann::json::parse(shape).dump() +
                  ": expected a list of non-negative integers")
        << shape;
  }
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "int64", "shape": [65536, 32768]})"),
            "spec: feature 'x': shape [65536,32768] holds 2^31 values or more, "
            "which no Example can (protobuf's 2 GiB)");
  EXPECT_EQ(FeatureErrorOf(
                R"({"dtype": "int64", "shape": [18446744073709551615, 0]})"),
            "");  // no values at all
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "int64", "shape": [65535, 32768]})"),
            "");
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "float32", "default": "a"})"),
            R"(spec: feature 'x': default "a" is not a number)");
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "float32", "default": 1e300})"),
            "spec: feature 'x': default 1e+300 is beyond float32's range");
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "int64", "default": 1.5})"),
            "spec: feature 'x': default 1.5 is not an int64");
  EXPECT_EQ(
      FeatureErrorOf(R"({"dtype": "int64", "default": 9223372036854775808})"),
      "spec: feature 'x': default 9223372036854775808 is not an int64");
  EXPECT_EQ(
      FeatureErrorOf(R"({"dtype": "int64", "default": -9223372036854775808})"),
      "");
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "bytes", "default": 1})"),
            "spec: feature 'x': default 1 is not a string");
  EXPECT_EQ(FeatureErrorOf(
                R"({"dtype": "int64", "shape": [2], "default": [1, 2, 3]})"),
            "spec: feature 'x': default has 3 values; the shape needs 2 (or "
            "give one value)");
  // From a file, the file's name comes first.
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("s.json"), R"({"features": {"x": 3}})");
  try {
    FeatureSpec::FromFile(dir.File("s.json"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              dir.File("s.json") + ": spec: feature 'x': expected an object");
  }
}

// A value nested a million deep (a damaged or hostile file) is refused as
// any other, named by its first bytes, without being copied or written by
// a recursion as deep as it goes.
TEST(FeatureSpecTest, AValueNestedAMillionDeepIsRefusedByItsFirstBytes) {
  const std::string deep =
      std::string(1000000, '[') + std::string(1000000, ']');
  const std::string shown = std::string(80, '[') + "...";
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "float32", "default": )" + deep + "}"),
            "spec: feature 'x': default " + shown + " is not a number");
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "int64", "default": [)" + deep + "]}"),
            "spec: feature 'x': default " + shown + " is not an int64");
  EXPECT_EQ(
      FeatureErrorOf(R"({"dtype": "bytes", "kind": )" + deep + "}"),
      "spec: feature 'x': kind " + shown + R"(: expected "fixed" or "var")");
  EXPECT_EQ(FeatureErrorOf(R"({"dtype": "bytes", "shape": )" + deep + "}"),
            "spec: feature 'x': shape " + shown +
                ": expected a list of non-negative integers");
}

// What ToJson writes reads back as the same spec, defaults included.
TEST(FeatureSpecTest, ToJsonReadsBackAsTheSameSpec) {
  const FeatureSpec spec = FeatureSpec::FromJsonText(R"({"features": {
    "f": {"dtype": "float32", "shape": [2], "default": [0.5, -1]},
    "i": {"dtype": "int64", "default": -9223372036854775808},
    "b": {"dtype": "bytes", "shape": [], "default": "none"},
    "v": {"kind": "var", "dtype": "int64"},
    "m": {"dtype": "float32", "shape": [2, 3], "default": 0}}})");
  const nlohmann::json json = spec.ToJson();
  const FeatureSpec again = FeatureSpec::FromJson(json);
  EXPECT_EQ(again.ToJson(), json);
  const FeatureConfig* f = again.Find("f");
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(f->default_value);
  EXPECT_EQ(f->default_value->floats, (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(again.Find("i")->default_value->ints,
            (std::vector<int64_t>{INT64_MIN}));
  EXPECT_EQ(again.Find("b")->default_value->bytes,
            (std::vector<std::string>{"none"}));
  EXPECT_EQ(again.Find("m")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(again.Find("v")->kind, FeatureConfig::Kind::kVar);
}

}  // namespace
}  // namespace recflow::records
