// Range, Tensors and TensorSlices (sources.cc) against tf.data's documented
// behaviour.
#include <gtest/gtest.h>

#include <numeric>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;
using testing::Iota;

TEST(SourcesTest, RangeCountsLikePython) {
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 5))), Iota(0, 5));
  EXPECT_EQ(Ints(Collect(Dataset::Range(5, 0, -2))),
            (std::vector<int64_t>{5, 3, 1}));
  EXPECT_TRUE(Collect(Dataset::Range(3, 3)).empty());
}

TEST(SourcesTest, TensorSlicesAreViewsOfTheArrays) {
  std::vector<float> data(12);
  std::iota(data.begin(), data.end(), 0.0f);
  Element arrays;
  arrays.Set("x",
             Tensor::View(DType::kFloat32, Shape{4, 3}, data.data(), nullptr));
  auto out = Collect(Dataset::FromTensorSlices(arrays));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2]["x"].shape(), (Shape{3}));
  EXPECT_EQ(out[2]["x"].data<float>(), data.data() + 6);  // no copy
}

std::vector<Element> Rest(Iterator& it) {
  std::vector<Element> out;
  while (auto e = it.Next()) out.push_back(std::move(*e));
  return out;
}

TEST(SourcesTest, TensorSlicesNeedArraysOfOneFirstDimension) {
  const auto error = [](Element arrays) {
    try {
      Dataset::FromTensorSlices(std::move(arrays));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error({}), "FromTensorSlices: no arrays given");
  Element scalar;
  scalar.Set("s", Tensor::Scalar<int64_t>(1));
  EXPECT_EQ(error(scalar),
            "FromTensorSlices: 's' is a scalar; arrays need a first dimension "
            "to slice");
  Element uneven;
  uneven.Set("a", Tensor::Allocate(DType::kFloat32, Shape{3}));
  uneven.Set("b", Tensor::Allocate(DType::kInt64, Shape{2, 5}));
  EXPECT_EQ(error(uneven),
            "FromTensorSlices: 'b' has 2 rows, 'a' has 3; all arrays need the "
            "same first dimension");
  Element slices;
  slices.Set("a", Tensor::Allocate(DType::kFloat32, Shape{3}));
  const Dataset ds = Dataset::FromTensorSlices(slices);
  EXPECT_EQ(ds.Describe(), "TensorSlices(a:float32[3])");
  Iterator it = ds.MakeIterator();
  it.Next();
  Iterator restored = ds.MakeIterator();
  restored.Restore(it.Save());
  EXPECT_EQ(Rest(restored).size(), 2u);
}

TEST(SourcesTest, TensorsAreOneElementViewingTheArrays) {
  std::vector<float> data(6, 1.5f);
  Element arrays;
  arrays.Set("x",
             Tensor::View(DType::kFloat32, Shape{2, 3}, data.data(), nullptr));
  arrays.Set("s", Tensor::Scalar<int64_t>(7));  // scalars are whole too
  const Dataset ds = Dataset::FromTensors(arrays);
  EXPECT_EQ(ds.Describe(), "Tensors(x:float32[2, 3], s:int64[])");
  EXPECT_EQ(ds.Cardinality(), 1);
  auto out = Collect(ds.Repeat(3));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2]["x"].shape(), (Shape{2, 3}));
  EXPECT_EQ(out[2]["x"].data<float>(), data.data());  // no copy
  EXPECT_EQ(out[2]["s"].scalar<int64_t>(), 7);
  Iterator it = ds.MakeIterator();
  ASSERT_TRUE(it.Next());
  Iterator restored = ds.MakeIterator();
  restored.Restore(it.Save());
  EXPECT_TRUE(Rest(restored).empty());
  try {
    Dataset::FromTensors({});
    FAIL() << "no arrays accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "FromTensors: no arrays given");
  }
}

// A generator's state is how many elements it gave: a restore makes it
// afresh and skips as many, so a deterministic generator continues exactly;
// one that gives fewer the second time is told so.
TEST(SourcesTest, AGeneratorRestoresByReplayingItsElements) {
  const auto count_to = [](int64_t n) {
    return [n]() -> std::function<std::optional<Element>()> {
      return [i = int64_t{0}, n]() mutable -> std::optional<Element> {
        if (i == n) return std::nullopt;
        return testing::Int(i++);
      };
    };
  };
  const Dataset ds = Dataset::FromGenerator(count_to(5), "five");
  EXPECT_EQ(ds.Describe(), "Generator(five)");
  for (size_t k = 0; k <= 6; ++k) {
    Iterator it = ds.MakeIterator();
    for (size_t i = 0; i < k; ++i) it.Next();
    Iterator restored = ds.MakeIterator();
    restored.Restore(it.Save());
    EXPECT_EQ(Ints(Rest(restored)), Iota(std::min<int64_t>(k, 5), 5))
        << "saved after " << k;
  }
  // Saved at element 4 of one generator, restored with one of 3.
  Iterator it = ds.MakeIterator();
  for (int i = 0; i < 4; ++i) it.Next();
  Iterator shorter = Dataset::FromGenerator(count_to(3), "five").MakeIterator();
  try {
    shorter.Restore(it.Save());
    FAIL() << "restored past the generator's end";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "generator 'five' ended after 3 elements while restoring a "
                  "state at element 4; is it deterministic?"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace recflow::pipeline
