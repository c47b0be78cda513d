// Repeat, Take, Skip, Shard, Filter and IgnoreErrors (transforms.cc) against
// tf.data's documented behaviour.
#include <gtest/gtest.h>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;
using testing::Iota;

TEST(TransformsTest, RepeatCountsEpochsAndStopsOnEmptyInput) {
  EXPECT_EQ(Collect(Dataset::Range(0, 3).Repeat(3)).size(), 9u);
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 3).Repeat().Take(7))),
            (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_TRUE(Collect(Dataset::Range(0, 0).Repeat()).empty());
  EXPECT_TRUE(Collect(Dataset::Range(0, 3).Repeat(0)).empty());
}

TEST(TransformsTest, TakeSkipAndShard) {
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).Skip(7))), Iota(7, 10));
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).Take(3))), Iota(0, 3));
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).Take(-1))), Iota(0, 10));
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).Shard(3, 1))),
            (std::vector<int64_t>{1, 4, 7}));
  EXPECT_THROW(Dataset::Range(0, 10).Shard(3, 3), Error);
}

TEST(TransformsTest, FilterKeepsWhatThePredicateAccepts) {
  auto ds = Dataset::Range(0, 10).Filter(
      [](const Element& e) { return e["value"].scalar<int64_t>() % 2 == 0; });
  EXPECT_EQ(Ints(Collect(ds)), (std::vector<int64_t>{0, 2, 4, 6, 8}));
}

TEST(TransformsTest, IgnoreErrorsSkipsAndCountsFailedElements) {
  auto ds = Dataset::Range(0, 10)
                .Map([](Element e) {
                  if (e["value"].scalar<int64_t>() % 3 == 0) {
                    throw Error("multiple of three");
                  }
                  return e;
                })
                .IgnoreErrors();
  Iterator it = ds.MakeIterator();
  std::vector<int64_t> got;
  Element e;
  while (it.Next(&e)) got.push_back(e["value"].scalar<int64_t>());
  EXPECT_EQ(got, (std::vector<int64_t>{1, 2, 4, 5, 7, 8}));
  uint64_t ignored = 0;
  for (const auto& s : it.Stats()) ignored += s.errors_ignored;
  EXPECT_EQ(ignored, 4u);
}

}  // namespace
}  // namespace recflow::pipeline
