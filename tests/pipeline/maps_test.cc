// The built-in maps (maps.cc): decode_raw, cast, scale, select and rename
// on single elements and batches, and the errors they raise.
#include "pipeline/maps.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace recflow::pipeline {
namespace {

template <typename T>
Element One(std::string name, std::vector<T> values) {
  Element e;
  const auto n = static_cast<int64_t>(values.size());
  e.Set(std::move(name), Tensor::FromValues<T>(values, Shape{n}));
  return e;
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.num_elements());
}

// The message of the Error `f` throws; empty when it throws none.
template <typename F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MapsTest, CastConvertsAsStaticCastWithinTheRange) {
  const Element f = One<float>("x", {-0.75f, 0.5f, 2.9f, 255.99f});
  const Element u8 = maps::Cast("x", DType::kUInt8)(f);
  EXPECT_EQ(Values<uint8_t>(u8["x"]), (std::vector<uint8_t>{0, 0, 2, 255}))
      << "the fraction is dropped before the range counts";
}

TEST(MapsTest, CastRefusesValuesOutsideTheTargetRange) {
  // A float past an integer type's range (or NaN) is undefined behaviour
  // in static_cast; between integers it wraps.  Each is an error naming
  // the value and where it is.
  const auto cast = [](Element e, DType to) {
    return ErrorOf([&] { maps::Cast("x", to)(std::move(e)); });
  };
  EXPECT_EQ(cast(One<float>("x", {1, 300}), DType::kUInt8),
            "cast('x'): value 300 (number 1 of the component) is outside "
            "uint8's range");
  EXPECT_NE(cast(One<float>("x", {-1}), DType::kUInt8), "");
  EXPECT_EQ(cast(One<float>("x", {-0.99f}), DType::kUInt8), "");
  EXPECT_NE(cast(One<float>("x", {NAN}), DType::kInt32), "");
  EXPECT_NE(cast(One<double>("x", {2147483648.0}), DType::kInt32), "");
  EXPECT_EQ(
      cast(One<double>("x", {2147483647.9, -2147483648.9}), DType::kInt32), "");
  EXPECT_NE(cast(One<float>("x", {9.3e18f}), DType::kInt64), "");
  EXPECT_EQ(cast(One<double>("x", {-9223372036854775808.0}), DType::kInt64),
            "");
  EXPECT_NE(cast(One<double>("x", {9223372036854775808.0}), DType::kInt64), "");
  EXPECT_EQ(cast(One<int64_t>("x", {int64_t{1} << 40}), DType::kInt32),
            "cast('x'): value 1099511627776 (number 0 of the component) is "
            "outside int32's range");
  EXPECT_NE(cast(One<int32_t>("x", {-1}), DType::kUInt8), "");
  EXPECT_EQ(cast(One<int32_t>("x", {255}), DType::kUInt8), "");
  // To a float every value converts; past float32's range it is inf.
  const Element big =
      maps::Cast("x", DType::kFloat32)(One<double>("x", {1e300}));
  EXPECT_EQ(Values<float>(big["x"]),
            std::vector<float>{std::numeric_limits<float>::infinity()});
  // Bytes are refused in both directions.
  EXPECT_THROW(maps::Cast("x", DType::kBytes), Error);
}

TEST(MapsTest, DecodeRawScaleSelectAndRename) {
  Element e;
  const std::vector<std::string> raw = {std::string("\x01\x00\x02\x00", 4),
                                        std::string("\x03\x00\x04\x00", 4)};
  e.Set("raw", Tensor::FromStrings(raw, Shape{2}));
  e.Set("x", Tensor::FromValues<float>(std::vector<float>{1, 2}, Shape{2}));
  Element d = maps::DecodeRaw("raw", DType::kInt32)(e);
  EXPECT_EQ(d["raw"].shape(), (Shape{2, 1}));
  EXPECT_EQ(Values<int32_t>(d["raw"]),
            (std::vector<int32_t>{0x20001, 0x40003}));
  Element u = maps::DecodeRaw("raw", DType::kUInt8, {2, -1})(e);
  EXPECT_EQ(u["raw"].shape(), (Shape{2, 2, 2}));
  EXPECT_NE(ErrorOf([&] { maps::DecodeRaw("raw", DType::kFloat64)(e); }), "");
  EXPECT_NE(ErrorOf([&] { maps::DecodeRaw("x", DType::kUInt8)(e); }), "");

  Element s = maps::Scale("x", 0.5, 1)(e);
  EXPECT_EQ(Values<float>(s["x"]), (std::vector<float>{1.5f, 2}));
  EXPECT_NE(ErrorOf([&] { maps::Scale("raw", 2)(e); }), "");

  Element sel = maps::Select({"x"})(e);
  ASSERT_EQ(sel.components.size(), 1u);
  EXPECT_EQ(sel.components[0].name, "x");
  EXPECT_EQ(ErrorOf([&] {
              maps::Select({"x", "y"})(e);
            }),
            "select: the element has no component 'y' (it has: raw, x)");

  Element r = maps::Rename("x", "y")(e);
  EXPECT_EQ(r.components[1].name, "y");
  EXPECT_NE(ErrorOf([&] { maps::Rename("x", "raw")(e); }), "");
  EXPECT_EQ(ErrorOf([] { maps::Rename("x", ""); }),
            "rename('x'): the new name is empty");
}

}  // namespace
}  // namespace recflow::pipeline
