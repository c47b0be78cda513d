// Repeat, Take, Skip, Shard, Filter and IgnoreErrors (transforms.cc) against
// tf.data's documented behaviour.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline/dataset.h"
#include "pipeline/stages.h"
#include "pipeline/state.h"
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

// RepeatEpochs (stages.h) asked to prepare epochs ahead: as an epoch
// opens, the inputs of the next epoch exist, and of the next
// `epochs_ahead` where the epoch before handed out at most `short_epoch`
// elements (not known at the first epoch); each made once with its
// epoch's salt and prepared once, never one past the count; the open
// input is the one prepared for its epoch.
TEST(TransformsTest, RepeatEpochsPreparesTheEpochsAheadOnceEach) {
  struct Input {
    uint64_t salt = 0;
    int prepared = 0;
    bool Draining() const { return false; }
    void FillAhead(size_t) {}
    void Save(StateWriter* w) const { w->U64(salt); }
    void Restore(StateReader* r) { EXPECT_EQ(r->U64(), salt); }
  };
  const uint64_t salt = 77;
  auto epoch_of = [&](uint64_t s) -> int64_t {
    for (int64_t e = 0; e < 10; ++e) {
      if (stages::RepeatSalt(salt, e) == s) return e;
    }
    return -1;
  };
  // The epochs whose inputs were made, in order.
  std::vector<int64_t> made;
  auto make = [&](uint64_t s) {
    made.push_back(epoch_of(s));
    auto in = std::make_unique<Input>();
    in->salt = s;
    return in;
  };
  auto prepare = [](Input& in) { ++in.prepared; };
  constexpr uint64_t kShort = 30;
  for (int ahead : {1, 2, 3}) {
    for (uint64_t elements : {kShort, kShort + 1}) {
      made.clear();
      stages::RepeatEpochs<Input> epochs(5, salt, make, prepare, ahead, kShort);
      for (int64_t e = 0; e < 5; ++e) {
        SCOPED_TRACE(fmt::format("epochs ahead {}, {} elements, epoch {}",
                                 ahead, elements, e));
        Input* open = epochs.Begin();
        ASSERT_NE(open, nullptr);
        EXPECT_EQ(epoch_of(open->salt), e);
        // Made so far: every epoch up to e + 1, or e + ahead after a short
        // one (below the count), once, in order.
        const int64_t upto = e > 0 && elements <= kShort ? e + ahead : e + 1;
        std::vector<int64_t> want;
        for (int64_t k = 0; k <= std::min<int64_t>(upto, 4); ++k) {
          want.push_back(k);
        }
        EXPECT_EQ(made, want);
        std::vector<int64_t> prepared;
        epochs.ForEachAhead([&](Input& in) {
          EXPECT_EQ(in.prepared, 1);
          prepared.push_back(epoch_of(in.salt));
        });
        want.erase(want.begin(), want.begin() + e + 1);
        EXPECT_EQ(prepared, want);
        // The epoch's elements, in two hand-outs.
        epochs.Handed(1);
        epochs.Handed(elements - 1);
        ASSERT_TRUE(epochs.EndEpoch());  // it produced: on to the next
      }
      EXPECT_EQ(epochs.Begin(), nullptr);
    }
  }

  // A state saved inside an epoch after short ones: restored, the epochs
  // make one ahead until an epoch has ended whole after the restore (what
  // the open epoch handed out before the save is not in the state).
  made.clear();
  stages::RepeatEpochs<Input> saver(8, salt, make, prepare, 2, kShort);
  for (int e = 0; e < 2; ++e) {
    ASSERT_NE(saver.Begin(), nullptr);
    saver.Handed(kShort);
    ASSERT_TRUE(saver.EndEpoch());
  }
  ASSERT_NE(saver.Begin(), nullptr);
  saver.Handed(kShort - 1);  // inside epoch 2
  EXPECT_EQ(made, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  StateWriter w("repeat epochs");
  saver.Save(&w);
  const std::string state = std::move(w).Finish();
  made.clear();
  stages::RepeatEpochs<Input> restored(8, salt, make, prepare, 2, kShort);
  StateReader r(state, "repeat epochs");
  restored.Restore(&r);
  r.Finish();
  EXPECT_EQ(made, (std::vector<int64_t>{2, 3}));
  restored.Handed(1);  // epoch 2's last: a short epoch, but not known so
  ASSERT_TRUE(restored.EndEpoch());
  ASSERT_NE(restored.Begin(), nullptr);  // epoch 3
  EXPECT_EQ(made, (std::vector<int64_t>{2, 3, 4}));
  restored.Handed(kShort);
  ASSERT_TRUE(restored.EndEpoch());
  ASSERT_NE(restored.Begin(), nullptr);  // epoch 4, after a short one
  EXPECT_EQ(made, (std::vector<int64_t>{2, 3, 4, 5, 6}));
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
