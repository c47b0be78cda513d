// Interleave (interleave.cc) against tf.data's documented behaviour.
#include <gtest/gtest.h>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;

TEST(InterleaveTest, InterleaveFollowsTensorFlowsExample) {
  // tf.data.Dataset.interleave's documented example.
  auto ds = Dataset::Range(1, 6).Interleave(
      [](const Element& e) {
        return Dataset::FromTensorSlices([&] {
          Element x;
          const int64_t v = e["value"].scalar<int64_t>();
          x.Set("value", Tensor::FromValues<int64_t>(std::vector<int64_t>(6, v),
                                                     Shape{6}));
          return x;
        }());
      },
      /*cycle_length=*/2, /*block_length=*/4);
  EXPECT_EQ(
      Ints(Collect(ds)),
      (std::vector<int64_t>{1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3,
                            3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5}));
}

}  // namespace
}  // namespace recflow::pipeline
