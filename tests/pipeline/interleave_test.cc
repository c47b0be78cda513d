// Interleave (interleave.cc) against tf.data's documented behaviour.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

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

TEST(InterleaveTest, FlatMapFollowsTensorFlowsExample) {
  // tf.data's flat_map: each element's dataset in turn.
  const auto ds = Dataset::Range(1, 4).FlatMap([](const Element& e) {
    return Dataset::Range(0, e["value"].scalar<int64_t>());
  });
  EXPECT_EQ(Ints(Collect(ds)), (std::vector<int64_t>{0, 0, 1, 0, 1, 2}));
  EXPECT_NE(ds.Describe().find("Interleave(flat_map, cycle_length=1"),
            std::string::npos)
      << ds.Describe();
}

TEST(InterleaveTest, AnAutotunedCycleIsOneInputPerCore) {
  // tf.data's default cycle_length: the machine's cores.
  auto fn = [](const Element& e) {
    return Dataset::Range(0, 3).Map(
        [v = e["value"].scalar<int64_t>()](Element x) {
          x.Set("value",
                Tensor::Scalar<int64_t>(v * 10 + x["value"].scalar<int64_t>()));
          return x;
        });
  };
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const auto tuned = Dataset::Range(0, 5).Interleave(fn, kAutotune);
  EXPECT_EQ(Ints(Collect(tuned)),
            Ints(Collect(Dataset::Range(0, 5).Interleave(fn, cores))));
  EXPECT_NE(tuned.Describe().find(fmt::format("cycle_length={}", cores)),
            std::string::npos)
      << tuned.Describe();
  EXPECT_THROW(Dataset::Range(0, 5).Interleave(fn, -2), Error);
  EXPECT_THROW(Dataset::Range(0, 5).Interleave(fn, 0), Error);
}

}  // namespace
}  // namespace recflow::pipeline
