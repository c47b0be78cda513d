// Shuffle (shuffle.cc) against tf.data's documented behaviour.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

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

// Shuffle then Repeat (stage by stage here: a Range is never fused): while
// an epoch's buffer drains, the next epoch's fills, an element for each
// one handed out, so that the next epoch does not begin by reading a whole
// buffer while the consumer waits.  The order is unchanged: without
// reshuffling, every epoch is the one-epoch shuffle.
TEST(ShuffleTest, ShuffleThenRepeatFillsTheNextEpochWhileDraining) {
  auto reads = std::make_shared<int64_t>(0);
  const auto counted = [reads](Element e) {
    ++*reads;
    return e;
  };
  const int64_t n = 40, buffer = 16;
  const Dataset ds = Dataset::Range(0, n)
                         .Map(counted)
                         .Shuffle(buffer, 7, /*reshuffle_each_iteration=*/false)
                         .Repeat(3);
  Iterator it = ds.MakeIterator({.threads = 1});
  std::vector<Element> got;
  Element e;
  while (static_cast<int64_t>(got.size()) < n && it.Next(&e)) {
    got.push_back(e);
  }
  // The first epoch read, and the next epoch's buffer with it: the drain
  // began with the read that found the input's end, after which the
  // buffer's other `buffer - 1` elements were handed out, each making room
  // for one of the next epoch's.
  EXPECT_EQ(*reads, n + buffer - 1);
  while (it.Next(&e)) got.push_back(e);
  const auto one =
      Ints(Collect(Dataset::Range(0, n).Shuffle(buffer, 7, false)));
  const auto all = Ints(got);
  ASSERT_EQ(all.size(), 3 * one.size());
  for (size_t epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(std::vector<int64_t>(all.begin() + epoch * n,
                                   all.begin() + (epoch + 1) * n),
              one)
        << "epoch " << epoch;
  }
  // A state saved at every element, also while the next epoch's buffer
  // fills (it is not saved: a restore refills it), continues the stream.
  const Dataset reshuffled = Dataset::Range(0, n).Shuffle(buffer, 7).Repeat(2);
  const auto want = Ints(Collect(reshuffled));
  for (size_t k = 0; k <= want.size(); ++k) {
    Iterator saver = reshuffled.MakeIterator({.threads = 1});
    for (size_t i = 0; i < k; ++i) ASSERT_TRUE(saver.Next(&e));
    Iterator restored = reshuffled.MakeIterator({.threads = 1});
    restored.Restore(saver.Save());
    std::vector<Element> rest;
    while (restored.Next(&e)) rest.push_back(e);
    EXPECT_EQ(Ints(rest), std::vector<int64_t>(want.begin() + k, want.end()))
        << "saved after " << k;
  }
}

// An error in the first `buffer` elements of an epoch is met, for the next
// epoch, while the one before drains: it is thrown where reading the epoch
// at its start throws it, as the epoch's first element, in every epoch;
// the other elements follow.
TEST(ShuffleTest, AnErrorInTheNextEpochsBufferIsThrownAtItsStart) {
  const int64_t n = 40, buffer = 16, bad = 5;
  const Dataset ds = Dataset::Range(0, n)
                         .Map([](Element e) {
                           if (e["value"].scalar<int64_t>() == bad) {
                             throw Error("element 5 is bad");
                           }
                           return e;
                         })
                         .Shuffle(buffer, 3)
                         .Repeat(3);
  Iterator it = ds.MakeIterator({.threads = 1});
  std::vector<std::string> outcomes;
  Element e;
  while (true) {
    try {
      if (!it.Next(&e)) break;
      outcomes.push_back(std::to_string(e["value"].scalar<int64_t>()));
    } catch (const Error& err) {
      outcomes.push_back(std::string("error: ") + err.what());
    }
  }
  ASSERT_EQ(static_cast<int64_t>(outcomes.size()), 3 * n);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(outcomes[static_cast<size_t>(epoch * n)],
              "error: element 5 is bad")
        << "epoch " << epoch;
    std::vector<int64_t> values;
    for (int64_t i = epoch * n + 1; i < (epoch + 1) * n; ++i) {
      values.push_back(std::stoll(outcomes[static_cast<size_t>(i)]));
    }
    std::sort(values.begin(), values.end());
    auto expected = Iota(0, n);
    expected.erase(expected.begin() + bad);
    EXPECT_EQ(values, expected) << "epoch " << epoch;
  }
}

}  // namespace
}  // namespace recflow::pipeline
