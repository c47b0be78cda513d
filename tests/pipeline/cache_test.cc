// Cache (cache.cc) against tf.data's documented behaviour.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;
using testing::Iota;

TEST(CacheTest, MemoryCacheRunsTheInputOnce) {
  std::atomic<int> calls{0};
  auto ds = Dataset::Range(0, 20)
                .Map([&](Element e) {
                  ++calls;
                  return e;
                })
                .Cache()
                .Repeat(3);
  EXPECT_EQ(Ints(Collect(ds)).size(), 60u);
  EXPECT_EQ(calls.load(), 20);
}

TEST(CacheTest, FileCacheServesLaterIteratorsAndOtherPipelinesAreRefused) {
  testing::TempDir dir;
  const std::string cache = dir.File("cache.tfrecord");
  std::atomic<int> calls{0};
  auto ds = Dataset::Range(0, 30)
                .Map([&](Element e) {
                  ++calls;
                  return e;
                })
                .Cache(cache);
  // A pass that stops early leaves no cache file.
  EXPECT_EQ(Collect(ds, {}, 5).size(), 5u);
  EXPECT_FALSE(std::filesystem::exists(cache));
  EXPECT_EQ(Ints(Collect(ds)), Iota(0, 30));
  EXPECT_TRUE(std::filesystem::exists(cache));
  const int after_first = calls.load();
  EXPECT_EQ(Ints(Collect(ds)), Iota(0, 30));
  EXPECT_EQ(calls.load(), after_first);
  auto other = Dataset::Range(0, 31).Cache(cache);
  EXPECT_THROW(Collect(other), Error);
}

// A memory cache belongs to its dataset.  Interleave makes a dataset for
// each input and frees it when the input ends, so the next input's cache
// is often made at the same address: it must start empty, not replay the
// earlier input's elements (it did, keyed by address: 0, 1, 2, 0, 1, 2...).
// One input at a time, and two.
TEST(CacheTest, EachInterleaveInputCachesItsOwnElements) {
  std::vector<int64_t> want;
  for (int64_t v = 0; v < 40; ++v) {
    for (int64_t j = 0; j < 3; ++j) want.push_back(v * 10 + j);
  }
  const InterleaveFn fn = [](const Element& e) {
    const int64_t v = e["value"].scalar<int64_t>();
    return Dataset::Range(v * 10, v * 10 + 3).Cache();
  };
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 40).FlatMap(fn))), want);
  std::vector<int64_t> two_at_once =
      Ints(Collect(Dataset::Range(0, 40).Interleave(fn, /*cycle_length=*/2)));
  std::sort(two_at_once.begin(), two_at_once.end());
  EXPECT_EQ(two_at_once, want);
}

}  // namespace
}  // namespace recflow::pipeline
