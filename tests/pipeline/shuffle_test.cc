// Shuffle (shuffle.cc) against tf.data's documented behaviour.
#include <gtest/gtest.h>

#include <algorithm>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;
using testing::Iota;

TEST(ShuffleTest, ShuffleIsASeededPermutationWithBufferLocality) {
  const int64_t n = 2000, buffer = 100;
  auto ds = Dataset::Range(0, n).Shuffle(buffer, 42);
  const auto a = Ints(Collect(ds));
  const auto b = Ints(Collect(ds));
  EXPECT_EQ(a, b);  // same seed, same order
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, Iota(0, n));
  EXPECT_NE(a, Iota(0, n));
  // Output position p can only hold one of the first p + buffer inputs.
  for (size_t p = 0; p < a.size(); ++p) {
    ASSERT_LT(a[p], static_cast<int64_t>(p) + buffer) << "position " << p;
  }
  EXPECT_NE(Ints(Collect(Dataset::Range(0, n).Shuffle(buffer, 43))), a);
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, n).Shuffle(1, 42))), Iota(0, n));
}

TEST(ShuffleTest, ShuffleReshufflesEachEpochUnlessToldNot) {
  auto epochs = [](bool reshuffle) {
    auto v = Ints(
        Collect(Dataset::Range(0, 50).Shuffle(50, 7, reshuffle).Repeat(2)));
    return std::make_pair(std::vector<int64_t>(v.begin(), v.begin() + 50),
                          std::vector<int64_t>(v.begin() + 50, v.end()));
  };
  auto [a1, a2] = epochs(true);
  EXPECT_NE(a1, a2);
  auto [b1, b2] = epochs(false);
  EXPECT_EQ(b1, b2);
}

TEST(ShuffleTest, UnseededShuffleDiffersBetweenIterators) {
  auto ds = Dataset::Range(0, 100).Shuffle(100);
  EXPECT_NE(Ints(Collect(ds)), Ints(Collect(ds)));
}

}  // namespace
}  // namespace recflow::pipeline
