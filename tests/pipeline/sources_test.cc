// Range and TensorSlices (sources.cc) against tf.data's documented behaviour.
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

}  // namespace
}  // namespace recflow::pipeline
