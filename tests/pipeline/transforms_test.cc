// Repeat, Take, Skip, AssertCardinality, RejectionResample, Shard, Filter,
// TakeWhile, Scan, Unique and IgnoreErrors (transforms.cc) against
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

// What an iterator over `ds` throws, or "" when it runs to the end;
// `delivered` counts the elements before.
std::string RunError(const Dataset& ds, size_t* delivered) {
  Iterator it = ds.MakeIterator();
  Element e;
  *delivered = 0;
  try {
    while (it.Next(&e)) ++*delivered;
  } catch (const Error& err) {
    return err.what();
  }
  return "";
}

TEST(TransformsTest, AssertCardinalityChecksTheCountAsItGoes) {
  const auto odd = [](const Element& e) {
    return e["value"].scalar<int64_t>() % 2 == 1;
  };
  const Dataset ten = Dataset::Range(0, 20).Filter(odd);
  ASSERT_EQ(ten.Cardinality(), kUnknownCardinality);
  EXPECT_EQ(ten.AssertCardinality(10).Cardinality(), 10);
  EXPECT_EQ(ten.AssertCardinality(10).Batch(3).Cardinality(), 4);
  size_t delivered = 0;
  EXPECT_EQ(RunError(ten.AssertCardinality(10), &delivered), "");
  EXPECT_EQ(delivered, 10u);
  // More: an error on the first too many, which is not delivered.
  EXPECT_EQ(RunError(ten.AssertCardinality(7), &delivered),
            "AssertCardinality(7): the input was expected to contain 7 "
            "elements but contained at least 8");
  EXPECT_EQ(delivered, 7u);
  // Fewer: every element, then an error at the end.
  EXPECT_EQ(RunError(ten.AssertCardinality(12), &delivered),
            "AssertCardinality(12): the input was expected to contain 12 "
            "elements but contained only 10");
  EXPECT_EQ(delivered, 10u);
  EXPECT_EQ(RunError(Dataset::Range(0, 0).AssertCardinality(1), &delivered),
            "AssertCardinality(1): the input was expected to contain 1 "
            "element but contained only 0");
  EXPECT_EQ(RunError(Dataset::Range(0, 0).AssertCardinality(0), &delivered),
            "");
  // Infinite: a finite input is an error at its end; an endless one runs.
  EXPECT_EQ(RunError(ten.AssertCardinality(kInfiniteCardinality), &delivered),
            "AssertCardinality(infinite): the input was expected to contain "
            "an infinite number of elements but contained only 10");
  EXPECT_EQ(
      Collect(ten.Repeat().AssertCardinality(kInfiniteCardinality), {}, 25)
          .size(),
      25u);
  // Each epoch is counted afresh.
  EXPECT_EQ(RunError(ten.AssertCardinality(10).Repeat(3), &delivered), "");
  EXPECT_EQ(delivered, 30u);
  EXPECT_THROW(ten.AssertCardinality(-5), Error);
}

TEST(TransformsTest, AssertCardinalityNamesTheFirstRecordTooMany) {
  testing::TempDir dir;
  const std::string path = dir.File("five.tfrecord");
  testing::WriteRecords(path, {"a", "bb", "ccc", "dddd", "eeeee"});
  size_t delivered = 0;
  // Record 4 starts after four frames of 16 bytes and 1 to 4 bytes.
  EXPECT_EQ(
      RunError(Dataset::FromTFRecords({path}).AssertCardinality(4), &delivered),
      fmt::format("AssertCardinality(4): the input was expected to "
                  "contain 4 elements but contained at least 5 (the "
                  "first past them: {}: record 4 at offset 74)",
                  path));
  EXPECT_EQ(delivered, 4u);
}

// Classes 0, 1 and 2 of Range(n)'s values: 70%, 20% and 10% of them.
int64_t SkewedClass(const Element& e) {
  const int64_t d = e["value"].scalar<int64_t>() % 10;
  return d < 7 ? 0 : d < 9 ? 1 : 2;
}

// The share of each of 3 classes in `elements`.
std::vector<double> ClassShares(const std::vector<Element>& elements) {
  std::vector<double> shares(3, 0.0);
  for (const Element& e : elements) shares[SkewedClass(e)] += 1;
  for (double& s : shares) s /= static_cast<double>(elements.size());
  return shares;
}

TEST(TransformsTest, RejectionResampleGivesTheTargetDistribution) {
  const Dataset skewed = Dataset::Range(0, 60000).Shuffle(1000, 1);
  const std::vector<double> even = {1.0 / 3, 1.0 / 3, 1.0 / 3};
  // The input's distribution given, and estimated as elements come.
  for (bool known : {true, false}) {
    SCOPED_TRACE(known ? "initial_dist given" : "initial_dist estimated");
    const Dataset resampled = skewed.RejectionResample(
        SkewedClass, {.target_dist = even,
                      .initial_dist = known ? std::vector<double>{0.7, 0.2, 0.1}
                                            : std::vector<double>{},
                      .seed = 5});
    const std::vector<Element> out = Collect(resampled);
    // The rarest class bounds what can come out: about 6000 / (1/3).
    EXPECT_GT(out.size(), 12000u);
    EXPECT_LT(out.size(), 24000u);
    for (double share : ClassShares(out)) EXPECT_NEAR(share, 1.0 / 3, 0.02);
    // Each element at most once, in the input's order (a subsequence).
    for (size_t i = 1; i < out.size(); ++i) {
      ASSERT_NE(Ints({out[i]}), Ints({out[i - 1]}));
    }
    // Seeded: the same stream again.
    EXPECT_EQ(Ints(Collect(resampled)), Ints(out));
  }
  // Skewed another way: 10% / 30% / 60%.
  const auto shares = ClassShares(Collect(skewed.RejectionResample(
      SkewedClass, {.target_dist = {0.1, 0.3, 0.6}, .seed = 2})));
  EXPECT_NEAR(shares[0], 0.1, 0.02);
  EXPECT_NEAR(shares[1], 0.3, 0.02);
  EXPECT_NEAR(shares[2], 0.6, 0.02);
  // A class the target leaves out never comes.
  const auto none_of_2 = Collect(skewed.Take(3000).RejectionResample(
      SkewedClass, {.target_dist = {0.5, 0.5, 0}, .seed = 3}));
  EXPECT_FALSE(none_of_2.empty());
  EXPECT_EQ(ClassShares(none_of_2)[2], 0.0);
  // The target the input already has: every element passes.
  EXPECT_EQ(Collect(skewed.Take(5000).RejectionResample(
                        SkewedClass, {.target_dist = {0.7, 0.2, 0.1},
                                      .initial_dist = {0.7, 0.2, 0.1}}))
                .size(),
            5000u);
  EXPECT_EQ(skewed.RejectionResample(SkewedClass, {.target_dist = even})
                .Cardinality(),
            kUnknownCardinality);
}

TEST(TransformsTest, RejectionResampleRefusesBadDistributionsAndClasses) {
  const Dataset ds = Dataset::Range(0, 10);
  const auto error = [&](ResampleOptions o) -> std::string {
    try {
      Collect(ds.RejectionResample(SkewedClass, std::move(o)));
    } catch (const Error& err) {
      return err.what();
    }
    return "";
  };
  EXPECT_EQ(error({.target_dist = {0.5, 0.6, 0}}),
            "RejectionResample: target_dist sums to 1.1, not 1");
  EXPECT_EQ(error({.target_dist = {1.5, -0.5, 0}}),
            "RejectionResample: target_dist[1] is -0.5; a probability is >= 0");
  EXPECT_EQ(error({.target_dist = {0.5, 0.5, 0}, .initial_dist = {1, 0}}),
            "RejectionResample: initial_dist has 2 classes, target_dist 3");
  EXPECT_EQ(error({.target_dist = {}}),
            "RejectionResample: target_dist is empty");
  // Element 9 is the first of class 2, past two classes.
  EXPECT_EQ(error({.target_dist = {0.5, 0.5}, .seed = 1, .class_name = "cls"}),
            "RejectionResample(cls, target_dist=[0.5, 0.5], "
            "initial_dist=estimated, seed=1): element 9: class 2 is not in "
            "[0, 2)");
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

TEST(TransformsTest, TakeWhileEndsAtTheFirstRejectedElement) {
  const auto below = [](int64_t limit) {
    return [limit](const Element& e) {
      return e["value"].scalar<int64_t>() < limit;
    };
  };
  // tf.data's example: range(10).take_while(lambda x: x < 5).
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).TakeWhile(below(5)))),
            Iota(0, 5));
  // Unlike Filter, nothing after the first rejected element comes through.
  const auto dip = Dataset::Range(0, 10).Map([](Element e) {
    const int64_t v = e["value"].scalar<int64_t>();
    return testing::Int(v == 3 ? 100 : v);
  });
  EXPECT_EQ(Ints(Collect(dip.TakeWhile(below(5)))),
            (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 3).TakeWhile(below(50)))),
            Iota(0, 3));
  // The element that ends it is the last one read.
  int64_t read = 0;
  const auto counted = Dataset::Range(0, 100).Map([&read](Element e) {
    ++read;
    return e;
  });
  EXPECT_EQ(Collect(counted.TakeWhile(below(7))).size(), 7u);
  EXPECT_EQ(read, 8);
  // Each epoch takes afresh.
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).TakeWhile(below(2)).Repeat(2))),
            (std::vector<int64_t>{0, 1, 0, 1}));
  // A predicate that throws uses up its element only.
  auto throwing = Dataset::Range(0, 10)
                      .TakeWhile([](const Element& e) {
                        const int64_t v = e["value"].scalar<int64_t>();
                        if (v == 2) throw Error("cannot judge 2");
                        return v < 5;
                      })
                      .IgnoreErrors();
  EXPECT_EQ(Ints(Collect(throwing)), (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_NE(Dataset::Range(0, 3)
                .TakeWhile(below(1), "small")
                .Describe()
                .find("TakeWhile(small)"),
            std::string::npos);
}

// {"sum": state + value}, and the state advanced by it: a running sum.
std::pair<Element, Element> RunningSum(const Element& state, Element e) {
  const int64_t sum =
      state["sum"].scalar<int64_t>() + e["value"].scalar<int64_t>();
  Element next;
  next.Set("sum", Tensor::Scalar<int64_t>(sum));
  return {next, testing::Int(sum)};
}

Element SumState(int64_t v) {
  Element s;
  s.Set("sum", Tensor::Scalar<int64_t>(v));
  return s;
}

TEST(TransformsTest, ScanCarriesItsStateFromElementToElement) {
  // tf.data's example: range(10).scan(0, lambda s, i: (s + i, s + i)).
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).Scan(SumState(0), RunningSum))),
            (std::vector<int64_t>{0, 1, 3, 6, 10, 15, 21, 28, 36, 45}));
  // Each epoch starts from the initial state.
  EXPECT_EQ(Ints(Collect(
                Dataset::Range(1, 4).Scan(SumState(10), RunningSum).Repeat(2))),
            (std::vector<int64_t>{11, 13, 16, 11, 13, 16}));
  EXPECT_EQ(Dataset::Range(0, 7).Scan(SumState(0), RunningSum).Cardinality(),
            7);
  // The state's shape may change: a growing history of the elements.
  Element empty;
  empty.Set("seen",
            Tensor::FromValues<int64_t>(std::vector<int64_t>{}, Shape{0}));
  auto history =
      Dataset::Range(5, 8).Scan(empty, [](const Element& state, Element e) {
        const auto seen = state["seen"].values<int64_t>();
        std::vector<int64_t> v(seen.begin(), seen.end());
        v.push_back(e["value"].scalar<int64_t>());
        Element next;
        next.Set("seen", Tensor::FromValues<int64_t>(
                             v, Shape{static_cast<int64_t>(v.size())}));
        return std::pair<Element, Element>{next, next};
      });
  const auto out = Collect(history);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(Ints({out[2]}, "seen"), (std::vector<int64_t>{5, 6, 7}));
}

TEST(TransformsTest, ScanRefusesAStateOfOtherComponentsAndKeepsItsOwn) {
  // Element 2's call returns a float state, element 4's throws: each uses
  // up its element and the sum goes on from the state before it.
  auto ds = Dataset::Range(0, 6)
                .Scan(SumState(0),
                      [](const Element& state, Element e) {
                        const int64_t v = e["value"].scalar<int64_t>();
                        if (v == 4) throw Error("no 4");
                        auto [next, out] = RunningSum(state, std::move(e));
                        if (v == 2) next.Set("sum", Tensor::Scalar<float>(1));
                        return std::pair<Element, Element>{next, out};
                      })
                .IgnoreErrors();
  EXPECT_EQ(Ints(Collect(ds)), (std::vector<int64_t>{0, 1, 4, 9}));
  Iterator it = Dataset::Range(0, 6)
                    .Scan(SumState(0),
                          [](const Element&, Element e) {
                            Element bad;
                            bad.Set("total", e["value"]);
                            return std::pair<Element, Element>{bad, e};
                          })
                    .MakeIterator();
  Element e;
  try {
    it.Next(&e);
    FAIL() << "a state renamed accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what())
                  .find("the state returned for element 0 has components "
                        "{total:int64}, the initial state {sum:int64}"),
              std::string::npos)
        << err.what();
  }
}

TEST(TransformsTest, UniqueKeepsEachDistinctElementWhereItFirstComes) {
  // tf.data's example: [1, 37, 2, 37, 2, 1] -> [1, 37, 2].
  Element arrays;
  arrays.Set("value", Tensor::FromValues<int64_t>(
                          std::vector<int64_t>{1, 37, 2, 37, 2, 1}, Shape{6}));
  const Dataset ints = Dataset::FromTensorSlices(arrays);
  EXPECT_EQ(Ints(Collect(ints.Unique())), (std::vector<int64_t>{1, 37, 2}));
  // Each epoch starts afresh.
  EXPECT_EQ(Ints(Collect(ints.Unique().Repeat(2))),
            (std::vector<int64_t>{1, 37, 2, 1, 37, 2}));
  EXPECT_EQ(ints.Unique().Cardinality(), kUnknownCardinality);
  // Bytes, and whole elements: equal only in every component, shape and
  // value ("ab" + "c" is not "a" + "bc"; [1] is not [1, 1]).
  const auto element = [](std::vector<std::string> words,
                          std::vector<int64_t> ids) {
    Element e;
    e.Set("w", Tensor::FromStrings(words,
                                   Shape{static_cast<int64_t>(words.size())}));
    e.Set("id", Tensor::FromValues<int64_t>(
                    ids, Shape{static_cast<int64_t>(ids.size())}));
    return e;
  };
  const std::vector<Element> elements = {
      element({"ab", "c"}, {1}), element({"a", "bc"}, {1}),
      element({"ab", "c"}, {1}), element({"ab", "c"}, {1, 1}),
      element({"ab", "c"}, {2}), element({"a", "bc"}, {1}),
      element({"ab"}, {1}),
  };
  auto gen = Dataset::FromGenerator([elements] {
    return [elements, i = size_t{0}]() mutable -> std::optional<Element> {
      if (i == elements.size()) return std::nullopt;
      return elements[i++];
    };
  });
  const auto out = Collect(gen.Unique());
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[1]["w"].bytes(0), "a");
  EXPECT_EQ(out[2]["id"].shape(), (Shape{2}));
  EXPECT_EQ(Ints({out[3]}, "id"), (std::vector<int64_t>{2}));
  EXPECT_EQ(out[4]["w"].shape(), (Shape{1}));
  // Floats are refused, as tf.data refuses them, naming the component.
  Element floats;
  floats.Set("f", Tensor::FromValues<float>(std::vector<float>{0.5f, -0.0f},
                                            Shape{2}));
  try {
    Collect(Dataset::FromTensorSlices(floats).Unique());
    FAIL() << "floats accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("component 'f' is float32"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace recflow::pipeline
