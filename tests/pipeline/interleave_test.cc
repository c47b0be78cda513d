// Interleave (interleave.cc) against tf.data's documented behaviour.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "pipeline/dataset.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Collect;
using testing::DrainWithErrors;
using testing::Ints;

// Twelve inputs with a bit of everything: input v opens v % 4 elements
// v * 100 + j (input 5 three more), element 502 is an error, input 7 is
// an error of the interleave's input and input 9 one of `fn`.
Dataset Mixed(int64_t cycle_length, InterleaveOptions options) {
  return Dataset::Range(0, 12)
      .Map([](Element e) {
        if (e["value"].scalar<int64_t>() == 7) throw Error("input 7 is bad");
        return e;
      })
      .Interleave(
          [](const Element& e) {
            const int64_t v = e["value"].scalar<int64_t>();
            if (v == 9) throw Error("no dataset for input 9");
            return Dataset::Range(v * 100, v * 100 + v % 4 + (v == 5 ? 3 : 0))
                .Map([](Element x) {
                  if (x["value"].scalar<int64_t>() == 502) {
                    throw Error("element 502 is bad");
                  }
                  return x;
                });
          },
          cycle_length, std::move(options));
}
std::vector<std::string> Drain(const Dataset& ds) {
  Iterator it = ds.MakeIterator({.threads = 2});
  return DrainWithErrors(it);
}

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

TEST(InterleaveTest, ParallelGivesTheSequentialElementsOrderAndErrors) {
  for (const int64_t cycle : {1, 2, 3, 5}) {
    for (const int64_t block : {1, 2}) {
      const auto sequential = Drain(Mixed(cycle, {.block_length = block}));
      ASSERT_EQ(sequential.size(), 20u);  // 16 elements, 3 errors, the end
      for (const int calls : {2, 3, kAutotune}) {
        for (const int64_t buffer : {int64_t{1}, int64_t{kAutotune}}) {
          SCOPED_TRACE(fmt::format("cycle {} block {} calls {} buffer {}",
                                   cycle, block, calls, buffer));
          EXPECT_EQ(Drain(Mixed(cycle, {.block_length = block,
                                        .num_parallel_calls = calls,
                                        .buffer_output_elements = buffer})),
                    sequential);
        }
      }
    }
  }
  const auto errors = Drain(Mixed(3, {}));
  for (const char* what :
       {"input 7 is bad", "no dataset for input 9", "element 502 is bad"}) {
    EXPECT_EQ(std::count_if(errors.begin(), errors.end(),
                            [&](const std::string& s) {
                              return s.find(what) != std::string::npos;
                            }),
              1)
        << what;
  }
}

TEST(InterleaveTest, ParallelRestoresAfterEveryElementAndError) {
  for (const int64_t block : {1, 2}) {
    const Dataset ds = Mixed(3, {.block_length = block,
                                 .num_parallel_calls = 2,
                                 .buffer_output_elements = 2});
    testing::ExpectRestoresAfterEveryElement(ds, Drain(ds));
  }
  // The state holds the read-ahead buffers, so the forms do not mix.
  Iterator sequential = Mixed(3, {}).MakeIterator();
  sequential.Next();
  Iterator parallel = Mixed(3, {.num_parallel_calls = 2}).MakeIterator();
  EXPECT_THROW(parallel.Restore(sequential.Save()), Error);
}

TEST(InterleaveTest, ParallelReadsInputsAtOnceAndHoldsTheLimit) {
  // Each element takes 2 ms inside its input's read: at most
  // num_parallel_calls reads at once, and that many do overlap.
  std::atomic<int> inside{0};
  std::atomic<int> most{0};
  const auto make = [&](int calls) {
    return Dataset::Range(0, 8).Interleave(
        [&](const Element& e) {
          const int64_t v = e["value"].scalar<int64_t>();
          return Dataset::Range(v * 10, v * 10 + 6).Map([&](Element x) {
            const int now = ++inside;
            int seen = most.load();
            while (now > seen && !most.compare_exchange_weak(seen, now)) {
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            --inside;
            return x;
          });
        },
        /*cycle_length=*/4, InterleaveOptions{.num_parallel_calls = calls});
  };
  const auto sequential = Ints(Collect(make(1)));
  EXPECT_EQ(most.load(), 1);
  for (const int calls : {2, 3}) {
    most = 0;
    EXPECT_EQ(Ints(Collect(make(calls))), sequential);
    EXPECT_EQ(most.load(), calls);
  }
}

TEST(InterleaveTest, NotDeterministicTakesWhatAnotherInputHasReady) {
  // Input 0's first element waits until the consumer has had all of
  // inputs 1 and 2 (or 10 s): in turn it would come first.
  std::atomic<int> others_taken{0};
  const auto ds = Dataset::Range(0, 3).Interleave(
      [&](const Element& e) {
        const int64_t v = e["value"].scalar<int64_t>();
        Dataset d = Dataset::Range(v * 10, v * 10 + 3);
        if (v != 0) return d;
        return d.Map([&](Element x) {
          const auto until =
              std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (others_taken.load() < 6 &&
                 std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          return x;
        });
      },
      /*cycle_length=*/3,
      InterleaveOptions{.num_parallel_calls = 3, .deterministic = false});
  Iterator it = ds.MakeIterator();
  std::vector<int64_t> got;
  while (auto e = it.Next()) {
    got.push_back((*e)["value"].scalar<int64_t>());
    if (got.back() >= 10) ++others_taken;
  }
  ASSERT_EQ(got.size(), 9u);
  EXPECT_EQ(std::vector<int64_t>(got.begin() + 6, got.end()),
            (std::vector<int64_t>{0, 1, 2}));
  // Each input's own elements keep their order.
  for (const int64_t input : {1, 2}) {
    std::vector<int64_t> own;
    for (const int64_t v : got) {
      if (v / 10 == input) own.push_back(v);
    }
    EXPECT_EQ(own, (std::vector<int64_t>{input * 10, input * 10 + 1,
                                         input * 10 + 2}));
  }
}

TEST(InterleaveTest, AParallelIteratorDestroyedMidwayStopsItsReaders) {
  // Readers blocked on the limit of calls, or with full buffers, end when
  // the iterator goes: this returns instead of hanging (ctest's timeout).
  const auto ds = Dataset::Range(0, 16).Interleave(
      [](const Element& e) {
        const int64_t v = e["value"].scalar<int64_t>();
        return Dataset::Range(v * 1000, v * 1000 + 1000).Map([](Element x) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          return x;
        });
      },
      /*cycle_length=*/8,
      InterleaveOptions{.num_parallel_calls = 2, .buffer_output_elements = 4});
  for (int taken : {0, 1, 7, 30}) {
    Iterator it = ds.MakeIterator();
    for (int i = 0; i < taken; ++i) ASSERT_TRUE(it.Next());
  }
}

TEST(InterleaveTest, ParallelOptionsAreChecked) {
  const auto fn = [](const Element&) { return Dataset::Range(0, 1); };
  const auto ds = Dataset::Range(0, 5);
  EXPECT_THROW(ds.Interleave(fn, 2, InterleaveOptions{.num_parallel_calls = 0}),
               Error);
  EXPECT_THROW(
      ds.Interleave(fn, 2, InterleaveOptions{.num_parallel_calls = -2}), Error);
  EXPECT_THROW(ds.Interleave(fn, 2,
                             InterleaveOptions{.num_parallel_calls = 2,
                                               .buffer_output_elements = 0}),
               Error);
  const auto tuned =
      ds.Interleave(fn, 3, InterleaveOptions{.num_parallel_calls = kAutotune});
  EXPECT_NE(tuned.Describe().find("cycle_length=3, block_length=1, "
                                  "num_parallel_calls=3"),
            std::string::npos)
      << tuned.Describe();
  EXPECT_EQ(Ints(Collect(tuned)), (std::vector<int64_t>(5, 0)));
}

// Statistics: the stages of the datasets made for the inputs are counted
// per name under the interleave, one row each for all the inputs (not a
// row per dataset made, and not under the name of another stage made
// earlier at the same address), also those made mid-way (Repeat's next
// epoch, on a Prefetch's driver for a third of them); on the consumer's
// thread (1) or on the readers' (2 at once); an interleave inside an
// input's dataset nests again.
TEST(InterleaveTest, StatsCountTheInputsStagesPerNameUnderTheInterleave) {
  for (int calls : {1, 2}) {
    SCOPED_TRACE(calls);
    InterleaveOptions outer;
    outer.name = "outer";
    outer.num_parallel_calls = calls;
    InterleaveOptions inner;
    inner.name = "inner";
    const auto ds = Dataset::Range(0, 300).Interleave(
        [&](const Element& e) {
          const int64_t v = e["value"].scalar<int64_t>();
          MapOptions m;
          m.name = "copy";
          // Repeat makes its input's iterator again mid-way.
          auto input = Dataset::Range(v, v + 1).Repeat(2).Map(
              [](Element x) { return x; }, m);
          if (v % 3 == 1) return input.Prefetch(1).Batch(2);
          if (v % 3 == 2) return input.Batch(2);
          return input.Interleave(
              [](const Element& x) {
                const int64_t w = x["value"].scalar<int64_t>();
                return Dataset::Range(w, w + 1);
              },
              /*cycle_length=*/1, inner);
        },
        /*cycle_length=*/4, outer);
    Iterator it = ds.MakeIterator({.threads = 2});
    Element e;
    while (it.Next(&e)) {
    }
    std::map<std::string, std::pair<uint64_t, int>> rows;
    for (const StageStats& s : it.Stats()) {
      EXPECT_TRUE(
          rows.emplace(s.name, std::pair{s.elements, s.parallelism}).second)
          << s.name << " twice";
    }
    // 300 inputs: 200 batch their 2 elements, 100 interleave theirs.
    const std::map<std::string, std::pair<uint64_t, int>> want = {
        {"range", {300, 1}},
        {"interleave:outer", {400, 1}},
        {"interleave:outer/range", {600, calls}},
        {"interleave:outer/repeat", {600, calls}},
        {"interleave:outer/map:copy", {600, calls}},
        {"interleave:outer/batch", {200, calls}},
        {"interleave:outer/prefetch", {200, calls}},
        {"interleave:outer/interleave:inner", {200, calls}},
        {"interleave:outer/interleave:inner/range", {200, calls}},
    };
    EXPECT_EQ(rows, want);
  }
}

}  // namespace
}  // namespace recflow::pipeline
