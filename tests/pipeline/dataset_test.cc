// Each transformation against tf.data's documented behaviour.
#include "pipeline/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <set>

#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::Ints;

std::vector<int64_t> Iota(int64_t a, int64_t b) {
  std::vector<int64_t> v(static_cast<size_t>(b - a));
  std::iota(v.begin(), v.end(), a);
  return v;
}

TEST(DatasetTest, RangeCountsLikePython) {
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 5))), Iota(0, 5));
  EXPECT_EQ(Ints(Collect(Dataset::Range(5, 0, -2))),
            (std::vector<int64_t>{5, 3, 1}));
  EXPECT_TRUE(Collect(Dataset::Range(3, 3)).empty());
}

TEST(DatasetTest, BatchKeepsOrDropsTheRemainder) {
  auto batches = Collect(Dataset::Range(0, 10).Batch(4));
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0]["value"].shape(), (Shape{4}));
  EXPECT_EQ(batches[2]["value"].shape(), (Shape{2}));
  EXPECT_EQ(Ints(batches), Iota(0, 10));
  auto dropped = Collect(Dataset::Range(0, 10).Batch(4, true));
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(Ints(dropped), Iota(0, 8));
}

TEST(DatasetTest, BatchStacksTensorsAndRefusesShapeMismatches) {
  Element a, b;
  a.Set("x", Tensor::FromValues<float>(std::vector<float>{1, 2}, Shape{2}));
  a.Set("s", Tensor::BytesScalar("one"));
  b.Set("x", Tensor::FromValues<float>(std::vector<float>{3, 4}, Shape{2}));
  b.Set("s", Tensor::BytesScalar("two"));
  int calls = 0;
  auto gen = [&] {
    return [&, i = 0]() mutable -> std::optional<Element> {
      ++calls;
      if (i == 2) return std::nullopt;
      return i++ == 0 ? a : b;
    };
  };
  auto out = Collect(Dataset::FromGenerator(gen).Batch(2));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["x"].shape(), (Shape{2, 2}));
  EXPECT_EQ(std::vector<float>(out[0]["x"].values<float>().begin(),
                               out[0]["x"].values<float>().end()),
            (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(out[0]["s"].bytes(1), "two");

  Element c;
  c.Set("x", Tensor::FromValues<float>(std::vector<float>{5, 6, 7}, Shape{3}));
  c.Set("s", Tensor::BytesScalar("three"));
  auto gen2 = [&] {
    return [&, i = 0]() mutable -> std::optional<Element> {
      if (i == 2) return std::nullopt;
      return i++ == 0 ? a : c;
    };
  };
  try {
    Collect(Dataset::FromGenerator(gen2).Batch(2));
    FAIL() << "batched different shapes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("component 'x'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("[3]"), std::string::npos);
  }
}

TEST(DatasetTest, PaddedBatchPadsToTheLongestOrTheGivenShape) {
  // Element i: i values of i.
  auto ds = Dataset::Range(1, 4).Map([](Element e) {
    const int64_t n = e["value"].scalar<int64_t>();
    std::vector<int64_t> v(static_cast<size_t>(n), n);
    Element out;
    out.Set("v", Tensor::FromValues<int64_t>(v, Shape{n}));
    return out;
  });
  auto out = Collect(ds.PaddedBatch(3));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["v"].shape(), (Shape{3, 3}));
  EXPECT_EQ(Ints(out, "v"), (std::vector<int64_t>{1, 0, 0, 2, 2, 0, 3, 3, 3}));

  PaddedBatchOptions o;
  o.padded_shapes = {{"v", {5}}};
  o.padding_values = {{"v", -1}};
  out = Collect(ds.PaddedBatch(2, o));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["v"].shape(), (Shape{2, 5}));
  EXPECT_EQ(Ints({out[1]}, "v"), (std::vector<int64_t>{3, 3, 3, -1, -1}));

  o.padded_shapes = {{"v", {2}}};
  EXPECT_THROW(Collect(ds.PaddedBatch(3, o)), Error);
}

TEST(DatasetTest, UnbatchUndoesBatch) {
  auto ds = Dataset::Range(0, 11).Batch(4).Unbatch();
  EXPECT_EQ(Ints(Collect(ds)), Iota(0, 11));
}

TEST(DatasetTest, RepeatCountsEpochsAndStopsOnEmptyInput) {
  EXPECT_EQ(Collect(Dataset::Range(0, 3).Repeat(3)).size(), 9u);
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 3).Repeat().Take(7))),
            (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_TRUE(Collect(Dataset::Range(0, 0).Repeat()).empty());
  EXPECT_TRUE(Collect(Dataset::Range(0, 3).Repeat(0)).empty());
}

TEST(DatasetTest, TakeSkipAndShard) {
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).Skip(7))), Iota(7, 10));
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).Take(3))), Iota(0, 3));
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).Take(-1))), Iota(0, 10));
  EXPECT_EQ(Ints(Collect(Dataset::Range(0, 10).Shard(3, 1))),
            (std::vector<int64_t>{1, 4, 7}));
  EXPECT_THROW(Dataset::Range(0, 10).Shard(3, 3), Error);
}

TEST(DatasetTest, FilterKeepsWhatThePredicateAccepts) {
  auto ds = Dataset::Range(0, 10).Filter(
      [](const Element& e) { return e["value"].scalar<int64_t>() % 2 == 0; });
  EXPECT_EQ(Ints(Collect(ds)), (std::vector<int64_t>{0, 2, 4, 6, 8}));
}

Element Square(Element e) {
  const int64_t v = e["value"].scalar<int64_t>();
  return testing::Int(v * v);
}

TEST(DatasetTest, ParallelMapKeepsOrderWhateverTheThreadCount) {
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

TEST(DatasetTest, NondeterministicMapDeliversEveryResultOnce) {
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

TEST(DatasetTest, ShuffleIsASeededPermutationWithBufferLocality) {
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

TEST(DatasetTest, ShuffleReshufflesEachEpochUnlessToldNot) {
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

TEST(DatasetTest, UnseededShuffleDiffersBetweenIterators) {
  auto ds = Dataset::Range(0, 100).Shuffle(100);
  EXPECT_NE(Ints(Collect(ds)), Ints(Collect(ds)));
}

TEST(DatasetTest, InterleaveFollowsTensorFlowsExample) {
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

TEST(DatasetTest, TensorSlicesAreViewsOfTheArrays) {
  std::vector<float> data(12);
  std::iota(data.begin(), data.end(), 0.0f);
  Element arrays;
  arrays.Set("x",
             Tensor::View(DType::kFloat32, Shape{4, 3}, data.data(), nullptr));
  auto out = Collect(Dataset::FromTensorSlices(arrays));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2]["x"].shape(), (Shape{3}));
  EXPECT_EQ(out[2]["x"].data<float>(), data.data() + 6);  // no copy
}

TEST(DatasetTest, MemoryCacheRunsTheInputOnce) {
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

TEST(DatasetTest, FileCacheServesLaterIteratorsAndOtherPipelinesAreRefused) {
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

TEST(DatasetTest, IgnoreErrorsSkipsAndCountsFailedElements) {
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

TEST(DatasetTest, ErrorsReachNextInOrderAndIterationGoesOn) {
  for (int calls : {1, 4}) {
    MapOptions o;
    o.num_parallel_calls = calls;
    auto ds = Dataset::Range(0, 6).Map(
        [](Element e) {
          if (e["value"].scalar<int64_t>() == 3) throw Error("bad element 3");
          return e;
        },
        o);
    Iterator it = ds.MakeIterator({.threads = 4});
    Element e;
    for (int64_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(it.Next(&e));
      EXPECT_EQ(e["value"].scalar<int64_t>(), i);
    }
    try {
      it.Next(&e);
      FAIL() << "no error";
    } catch (const Error& err) {
      EXPECT_STREQ(err.what(), "bad element 3");
    }
    ASSERT_TRUE(it.Next(&e));
    EXPECT_EQ(e["value"].scalar<int64_t>(), 4);
  }
}

TEST(DatasetTest, PrefetchDeliversTheSameStream) {
  auto ds = Dataset::Range(0, 1000).Shuffle(64, 3).Batch(7);
  EXPECT_EQ(Ints(Collect(ds.Prefetch(3))), Ints(Collect(ds)));
}

TEST(DatasetTest, DestroyingAnIteratorStopsItsWork) {
  // Forever, with a prefetch thread and parallel calls running ahead.
  MapOptions o;
  o.num_parallel_calls = 4;
  auto ds = Dataset::Range(0, 10).Repeat().Map(Square, o).Prefetch(8);
  for (int i = 0; i < 20; ++i) {
    Iterator it = ds.MakeIterator({.threads = 4});
    Element e;
    for (int k = 0; k < i; ++k) ASSERT_TRUE(it.Next(&e));
  }  // each destructor returns: the test would hang otherwise
}

TEST(DatasetTest, StatsCountEachStage) {
  auto ds = Dataset::Range(0, 100).Map(Square).Batch(10).Prefetch(2);
  Iterator it = ds.MakeIterator();
  Element e;
  while (it.Next(&e)) {
  }
  std::map<std::string, uint64_t> elements;
  for (const auto& s : it.Stats()) elements[s.name] = s.elements;
  EXPECT_EQ(elements["range"], 100u);
  EXPECT_EQ(elements["map:map"], 100u);
  EXPECT_EQ(elements["batch"], 10u);
  EXPECT_EQ(elements["prefetch"], 10u);
}

TEST(DatasetTest, CsvRowsBecomeTypedScalars) {
  testing::TempDir dir;
  testing::WriteFileBytes(dir.File("a.csv"),
                          "id,score,name\n1,0.5,\"x, y\"\n2,1.5,z\n");
  auto out = Collect(Dataset::FromCsv({dir.File("a.csv")}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["id"].dtype(), DType::kInt64);
  EXPECT_EQ(out[1]["id"].scalar<int64_t>(), 2);
  EXPECT_FLOAT_EQ(out[1]["score"].scalar<float>(), 1.5f);
  EXPECT_EQ(out[0]["name"].bytes(0), "x, y");
  testing::WriteFileBytes(dir.File("b.csv"), "id,score,name\n3,oops,w\n");
  CsvOptions o;
  try {
    Collect(Dataset::FromCsv({dir.File("a.csv"), dir.File("b.csv")}, o));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b.csv:2: column 'score'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace recflow::pipeline
