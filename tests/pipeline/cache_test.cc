// Cache (cache.cc) against tf.data's documented behaviour.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace recflow::pipeline
