// Map and Prefetch (map.cc) against tf.data's documented behaviour.
#include <gtest/gtest.h>

#include <algorithm>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;
using testing::Square;

TEST(MapTest, ParallelMapKeepsOrderWhateverTheThreadCount) {
  std::vector<int64_t> want;
  for (int64_t i = 0; i < 500; ++i) want.push_back(i * i);
  for (int threads : {1, 2, 8}) {
    for (int calls : {1, 3, kAutotune}) {
      MapOptions o;
      o.num_parallel_calls = calls;
      auto ds = Dataset::Range(0, 500).Map(Square, o);
      EXPECT_EQ(Ints(Collect(ds, {.threads = threads})), want)
          << threads << " threads, " << calls << " calls";
    }
  }
}

TEST(MapTest, NondeterministicMapDeliversEveryResultOnce) {
  MapOptions o;
  o.num_parallel_calls = 4;
  o.deterministic = false;
  auto got =
      Ints(Collect(Dataset::Range(0, 300).Map(Square, o), {.threads = 4}));
  std::sort(got.begin(), got.end());
  std::vector<int64_t> want;
  for (int64_t i = 0; i < 300; ++i) want.push_back(i * i);
  EXPECT_EQ(got, want);
}

TEST(MapTest, PrefetchDeliversTheSameStream) {
  auto ds = Dataset::Range(0, 1000).Shuffle(64, 3).Batch(7);
  EXPECT_EQ(Ints(Collect(ds.Prefetch(3))), Ints(Collect(ds)));
  EXPECT_EQ(Ints(Collect(ds.Prefetch(kAutotune))), Ints(Collect(ds)));
  EXPECT_EQ(Ints(Collect(ds.Prefetch(kAutotune, /*max_bytes=*/1))),
            Ints(Collect(ds)));
  // Other negative sizes are mistakes, as tf.data's.
  EXPECT_THROW(ds.Prefetch(-2), Error);
  EXPECT_THROW(ds.Prefetch(0), Error);
}

}  // namespace
}  // namespace recflow::pipeline
