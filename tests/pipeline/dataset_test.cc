// What every pipeline shares (dataset.cc): errors in order, cancellation,
// statistics.
#include "pipeline/dataset.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pipeline_test_util.h"
#include "test_util.h"

namespace recflow::pipeline {
namespace {

using testing::Square;

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

// IteratorOptions::output_memory: each element the iterator delivers has
// its tensors there, copied off the consumer's thread when the last stage
// has threads of its own, on it otherwise; the same values, also after a
// restore; every block given back.
TEST(DatasetTest, OutputMemoryHoldsEveryElementDelivered) {
  MapOptions parallel;
  parallel.num_parallel_calls = 3;
  const auto with_bytes = [](Element e) {
    const int64_t v = e["value"].data<int64_t>()[0];
    e.Set("name", Tensor::BytesScalar(v % 2 == 0 ? "even" : "odd!"));
    return e;
  };
  const Dataset base = Dataset::Range(0, 40).Map(with_bytes).Batch(4);
  struct Case {
    std::string what;
    Dataset ds;
    bool off_the_consumer;
  };
  const Case cases[] = {
      {"batch", base, false},
      {"prefetch", base.Prefetch(2), true},
      {"parallel map", base.Map([](Element e) { return e; }, parallel), true},
  };
  const std::thread::id consumer = std::this_thread::get_id();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::vector<Element> want = testing::Collect(c.ds, {.threads = 3});
    ASSERT_EQ(want.size(), 10u);
    auto memory = std::make_shared<testing::RecordingMemory>();
    auto restored_memory = std::make_shared<testing::RecordingMemory>();
    {
      Iterator it = c.ds.MakeIterator({.threads = 3, .output_memory = memory});
      Element e;
      for (size_t i = 0; i < 4; ++i) {
        ASSERT_TRUE(it.Next(&e));
        EXPECT_EQ(e, want[i]);
        EXPECT_EQ(testing::OutsideMemory(e, *memory), "") << i;
        // Both the batch's numbers and its bytes of one length.
        EXPECT_TRUE(memory->Holds(e["name"].bytes(0).data(), 16)) << i;
      }
      const std::string state = it.Save();
      // Restored (a prefetch's buffered elements come from the state),
      // the rest are there too.
      Iterator restored =
          c.ds.MakeIterator({.threads = 3, .output_memory = restored_memory});
      restored.Restore(state);
      for (size_t i = 4; i < want.size(); ++i) {
        ASSERT_TRUE(restored.Next(&e));
        EXPECT_EQ(e, want[i]);
        EXPECT_EQ(testing::OutsideMemory(e, *restored_memory), "") << i;
      }
      EXPECT_FALSE(restored.Next(&e));
      EXPECT_EQ(memory->threads().count(consumer) == 0, c.off_the_consumer);
    }
    EXPECT_GE(memory->allocations(), 8u);
    EXPECT_GE(restored_memory->allocations(), 12u);
    for (const auto& m : {memory, restored_memory}) {
      EXPECT_EQ(m->live(), 0u);
      EXPECT_EQ(m->bad_frees(), 0u);
    }
  }
  auto device = std::make_shared<testing::RecordingMemory>(MemoryKind::kDevice);
  EXPECT_THROW(base.MakeIterator({.output_memory = device}), Error);
}

// The counters of `it`'s Prefetch (its one asynchronous stage), or a
// default StageStats if it has none.
StageStats PrefetchStats(const Iterator& it) {
  for (const StageStats& s : it.Stats()) {
    if (s.buffered >= 0) return s;
  }
  return StageStats{};
}

// Waits, at most 5 s, until `it`'s Prefetch holds `n` elements; whether it
// does is the caller's to check.
void AwaitBuffered(const Iterator& it, int64_t n) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (PrefetchStats(it).buffered < n &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// IteratorOptions::prepare: called once on every element delivered, in
// delivery order and before Next() returns it; on Prefetch's driver thread
// where the last stage is a prefetch (also for the elements a restore puts
// back in its buffer: there, on the thread that restores), in Next
// otherwise (a parallel map makes its results
// out of order); what it throws, the Next() of that element throws.
// IteratorOptions::prefetch_polls: a take from a full Prefetch buffer does
// not wake its driver (a system call on the consumer's thread); the driver
// looks for room on its own timer, at about half the consumer's interval
// between takes.  So after
// each take of a slow consumer the buffer is full again before the next,
// and every element still comes once, in order.
TEST(DatasetTest, PrefetchRefillsItsBufferBetweenTheTakesOfASlowConsumer) {
  constexpr int64_t kBuffer = 4;
  Iterator it = Dataset::Range(0, 40).Prefetch(kBuffer).MakeIterator(
      {.prefetch_polls = true});
  Element e;
  int64_t expected = 0;
  for (int take = 0; take < 12; ++take) {
    ASSERT_TRUE(it.Next(&e));
    EXPECT_EQ(e["value"].scalar<int64_t>(), expected++);
    // Full again well within a few of the consumer's 5 ms intervals
    // (a driver that waited to be woken would stay one short).
    AwaitBuffered(it, kBuffer);
    EXPECT_EQ(PrefetchStats(it).buffered, kBuffer) << "after take " << take;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  while (it.Next(&e)) EXPECT_EQ(e["value"].scalar<int64_t>(), expected++);
  EXPECT_EQ(expected, 40);
}

// StageStats::wakes: the takes that woke a prefetch's sleeping driver (a
// system call on the consumer's thread).  Once the buffer is full its
// driver sleeps (it holds the lock from the element's push to its wait),
// so without prefetch_polls every such take wakes it; with them a take
// that leaves elements buffered wakes it only where its timer looks too
// late, and one that empties the buffer (of one element) always.
TEST(DatasetTest, PrefetchCountsTheTakesThatWokeItsDriver) {
  for (const auto& [polls, buffer] :
       {std::pair{false, int64_t{3}}, std::pair{true, int64_t{1}}}) {
    SCOPED_TRACE(fmt::format("polls {}, buffer {}", polls, buffer));
    Iterator it = Dataset::Range(0, 20).Prefetch(buffer).MakeIterator(
        {.prefetch_polls = polls});
    Element e;
    ASSERT_TRUE(it.Next(&e));  // starts the driver
    constexpr uint64_t kTakes = 8;
    for (uint64_t take = 0; take < kTakes; ++take) {
      AwaitBuffered(it, buffer);
      ASSERT_EQ(PrefetchStats(it).buffered, buffer);
      const uint64_t before = PrefetchStats(it).wakes;
      ASSERT_TRUE(it.Next(&e));
      EXPECT_EQ(PrefetchStats(it).wakes, before + 1) << "take " << take;
    }
  }
  // A stage with no driver wakes nothing.
  Iterator plain = Dataset::Range(0, 3).MakeIterator();
  Element e;
  while (plain.Next(&e)) {
  }
  for (const StageStats& s : plain.Stats()) EXPECT_EQ(s.wakes, 0u) << s.name;
}

// A parallel map's driver that filled its buffer (64 slots for two calls)
// sleeps until half of it is taken: the 31 takes before wake nothing, the
// 32nd wakes it once, and it fills the buffer again.  (Woken by every take,
// as a prefetch's, it pulled one element per take: a system call on the
// consumer's thread and a hand-over to a task for each.)
TEST(DatasetTest, ParallelMapWakesItsDriverOncePerHalfBuffer) {
  MapOptions parallel;
  parallel.num_parallel_calls = 2;
  constexpr int64_t kBuffer = 64;
  Iterator it = Dataset::Range(0, 1000)
                    .Map([](Element e) { return e; }, parallel)
                    .MakeIterator({.threads = 2});
  Element e;
  int64_t expected = 0;
  const auto take = [&] {
    ASSERT_TRUE(it.Next(&e));
    EXPECT_EQ(e["value"].scalar<int64_t>(), expected++);
  };
  take();  // starts the driver
  // It fills the buffer and sleeps, before this take or after it: the
  // takes that leave more than half of it wake nothing.
  AwaitBuffered(it, kBuffer - 1);
  while (PrefetchStats(it).wakes == 0 && expected <= kBuffer) take();
  ASSERT_EQ(PrefetchStats(it).wakes, 1u);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    AwaitBuffered(it, kBuffer);
    ASSERT_EQ(PrefetchStats(it).buffered, kBuffer);
    const uint64_t before = PrefetchStats(it).wakes;
    for (int64_t k = 1; k <= kBuffer / 2; ++k) {
      take();
      EXPECT_EQ(PrefetchStats(it).wakes, before + (k == kBuffer / 2))
          << "take " << k;
    }
  }
  while (it.Next(&e)) EXPECT_EQ(e["value"].scalar<int64_t>(), expected++);
  EXPECT_EQ(expected, 1000);

  // Over a whole run, at full speed: a driver woken and not yet run is not
  // woken again by the takes after (each would be another system call),
  // and it sleeps again only once the buffer is full, so a wake takes 32
  // takes at least.
  constexpr int64_t kElements = 50000;
  Iterator run = Dataset::Range(0, kElements)
                     .Map([](Element e) { return e; }, parallel)
                     .MakeIterator({.threads = 2});
  int64_t n = 0;
  while (run.Next(&e)) ASSERT_EQ(e["value"].scalar<int64_t>(), n++);
  EXPECT_EQ(n, kElements);
  EXPECT_LE(PrefetchStats(run).wakes, uint64_t{kElements / (kBuffer / 2) + 1});
}

TEST(DatasetTest, PrepareSeesEveryElementDeliveredInOrderBeforeNext) {
  MapOptions parallel;
  parallel.num_parallel_calls = 3;
  const Dataset base = Dataset::Range(0, 30);
  struct Case {
    std::string what;
    Dataset ds;
    bool off_the_consumer;
  };
  const Case cases[] = {
      {"range", base, false},
      {"prefetch", base.Prefetch(3), true},
      {"parallel map", base.Map([](Element e) { return e; }, parallel), false},
  };
  const std::thread::id consumer = std::this_thread::get_id();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::mutex mu;
    std::vector<int64_t> seen;
    std::set<std::thread::id> threads;
    const auto record = [&](const Element& e) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(e["value"].scalar<int64_t>());
      threads.insert(std::this_thread::get_id());
    };
    std::string state;
    {
      Iterator it = c.ds.MakeIterator({.threads = 3, .prepare = record});
      Element e;
      for (int64_t i = 0; i < 10; ++i) {
        ASSERT_TRUE(it.Next(&e));
        ASSERT_EQ(e["value"].scalar<int64_t>(), i);
        std::lock_guard<std::mutex> lock(mu);
        ASSERT_GT(seen.size(), static_cast<size_t>(i));
        EXPECT_EQ(seen[i], i);
      }
      state = it.Save();
    }  // its driver joined: nothing more is prepared by it
    // Restored: the prefetch's buffered elements come from the state and
    // are prepared again (by the new iterator), then the rest.
    std::vector<int64_t> seen_before;
    {
      std::lock_guard<std::mutex> lock(mu);
      seen_before.swap(seen);
      EXPECT_EQ(threads.count(consumer) == 0, c.off_the_consumer);
    }
    Iterator restored = c.ds.MakeIterator({.threads = 3, .prepare = record});
    restored.Restore(state);
    Element e;
    for (int64_t i = 10; i < 30; ++i) {
      ASSERT_TRUE(restored.Next(&e));
      ASSERT_EQ(e["value"].scalar<int64_t>(), i);
      std::lock_guard<std::mutex> lock(mu);
      ASSERT_GT(seen.size(), static_cast<size_t>(i - 10));
      EXPECT_EQ(seen[i - 10], i);
    }
    EXPECT_FALSE(restored.Next(&e));
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(seen.size(), 20u);
    // Made ahead and never delivered: at most the prefetch's buffer and
    // the one in its driver's hands.
    EXPECT_GE(seen_before.size(), 10u);
    EXPECT_LE(seen_before.size(), c.off_the_consumer ? 14u : 10u);
  }
  // An error of prepare's reaches that element's Next, in its place.
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "range");
    const Dataset ds = prefetch ? base.Prefetch(2) : base;
    Iterator it = ds.MakeIterator({.prepare = [](const Element& e) {
      if (e["value"].scalar<int64_t>() == 4) throw Error("cannot stage 4");
    }});
    Element e;
    for (int64_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(it.Next(&e));
      EXPECT_EQ(e["value"].scalar<int64_t>(), i);
    }
    try {
      it.Next(&e);
      FAIL() << "no error";
    } catch (const Error& err) {
      EXPECT_STREQ(err.what(), "cannot stage 4");
    }
  }
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

// Busy time is in seconds (the stage clock counts ticks of its own rate)
// and each stage's own: a map that spins 25 ms an element, 4 elements,
// shows 0.1 s of work whether it runs on the consumer's thread or in
// tasks; the batch stage above it does not count the map's time.  A rate
// off by the ratio of ticks to nanoseconds (2-4 here) would fail.
TEST(DatasetTest, StatsGiveEachStageItsOwnBusySeconds) {
  using SteadyClock = std::chrono::steady_clock;
  const auto spin = [](Element e) {
    const auto until = SteadyClock::now() + std::chrono::milliseconds(25);
    while (SteadyClock::now() < until) {
    }
    return e;
  };
  for (int calls : {1, 2}) {
    SCOPED_TRACE(calls);
    MapOptions o;
    o.num_parallel_calls = calls;
    auto ds = Dataset::Range(0, 4).Map(spin, o).Batch(2);
    Iterator it = ds.MakeIterator({.threads = 2});
    Element e;
    while (it.Next(&e)) {
    }
    std::map<std::string, double> busy;
    for (const auto& s : it.Stats()) busy[s.name] = s.busy_seconds;
    EXPECT_GE(busy["map:map"], 0.099);
    EXPECT_LT(busy["map:map"], 0.17);
    EXPECT_LT(busy["batch"], 0.05);
  }
}

// State shared across an iterator's epochs is one object per dataset and
// type: asking again gives the same one, another type or dataset another
// one.  A destroyed dataset's state is dropped when the next is made.
TEST(DatasetTest, SharedStateIsOnePerDatasetAndType) {
  struct A {
    int value = 1;
  };
  struct B {
    double value = 2;
  };
  IteratorContext ctx(IteratorOptions{});
  const Dataset d1 = Dataset::Range(0, 1), d2 = Dataset::Range(0, 2);
  const DatasetBase* key1 = d1.base().get();
  std::shared_ptr<A> a = ctx.Shared<A>(key1);
  a->value = 7;
  EXPECT_EQ(ctx.Shared<A>(key1), a);
  EXPECT_EQ(ctx.Shared<A>(key1)->value, 7);
  EXPECT_EQ(ctx.Shared<B>(key1)->value, 2.0);
  EXPECT_NE(ctx.Shared<A>(d2.base().get()), a);
  std::weak_ptr<A> gone;
  {
    const Dataset d3 = Dataset::Range(0, 3);
    gone = ctx.Shared<A>(d3.base().get());
    EXPECT_FALSE(gone.expired());
  }
  EXPECT_FALSE(gone.expired());  // until the next state is made
  ctx.Shared<B>(d2.base().get());
  EXPECT_TRUE(gone.expired());
  EXPECT_EQ(ctx.Shared<A>(key1), a);
}

}  // namespace
}  // namespace recflow::pipeline
