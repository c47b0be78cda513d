// AsyncIterator, the engine of Prefetch and parallel Map: how far it reads
// ahead, errors at their place in the order, and a saved state holding its
// buffered results (errors keep their class).
#include "pipeline/async_iterator.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "pipeline/stages.h"
#include "pipeline_test_util.h"
#include "records/errors.h"

namespace recflow::pipeline {
namespace {

using testing::Ints;

// The driver pulls at most max_elements ahead of the consumer.
TEST(AsyncIteratorTest, ReadsAheadNoFurtherThanItsBound) {
  std::atomic<int64_t> pulled{0};
  DatasetPtr counting = stages::Generator(
      [&pulled]() -> std::function<std::optional<Element>()> {
        return [&pulled, i = int64_t{0}]() mutable -> std::optional<Element> {
          if (i == 1000) return std::nullopt;
          pulled.fetch_add(1);
          return testing::Int(i++);
        };
      },
      "counting");
  IteratorContext ctx(IteratorOptions{.threads = 2});
  AsyncIterator::Config config;
  config.stage = "prefetch";
  config.max_elements = 4;
  AsyncIterator it(&ctx, counting->MakeIterator(&ctx, 0),
                   ctx.Counter(&config, "prefetch"), config);
  Element e;
  ASSERT_TRUE(it.GetNext(&e));
  // Give the driver time to run as far ahead as it may.
  for (int i = 0; i < 500 && pulled.load() < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_LE(pulled.load(), 1 + 4);  // the one taken and four buffered
  EXPECT_GE(pulled.load(), 2);      // it did read ahead
  int64_t n = 1;
  while (it.GetNext(&e)) ++n;
  EXPECT_EQ(n, 1000);
}

// How deep an autotuned prefetch buffer has grown after `n` elements of a
// producer that takes `slow` to make every `period`th element (the others
// at once), taken by a consumer that spends 0.5 ms on each (a training
// step's time): the consumer then stops, and what the driver pulls ahead
// is the buffer's limit.  A consumer that spent nothing would, with one
// core to share with the driver, run after each element the driver
// made (a woken thread runs first), and the buffer would never fill (CI
// once measured a limit of 2 that way).
int64_t AutotunedDepth(int64_t n, int64_t period,
                       std::chrono::milliseconds slow) {
  std::atomic<int64_t> pulled{0};
  DatasetPtr bursty = stages::Generator(
      [&]() -> std::function<std::optional<Element>()> {
        return [&, i = int64_t{0}]() mutable -> std::optional<Element> {
          if (i % period == 0) std::this_thread::sleep_for(slow);
          pulled.fetch_add(1);
          return testing::Int(i++);
        };
      },
      "bursty");
  IteratorContext ctx(IteratorOptions{.threads = 2});
  AsyncIterator::Config config;
  config.stage = "prefetch";
  config.max_elements = 64;
  config.autotune = true;
  AsyncIterator it(&ctx, bursty->MakeIterator(&ctx, 0),
                   ctx.Counter(&config, "prefetch"), config);
  Element e;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(it.GetNext(&e));
    EXPECT_EQ(e["value"].scalar<int64_t>(), i);
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  // The driver fills the buffer to its limit, and stops there: done once
  // three looks in a row see nothing more pulled (a loaded machine may
  // leave the driver waiting for a core a while).
  int64_t before = -1;
  for (int i = 0, quiet = 0; i < 300 && quiet < 3; ++i) {
    const int64_t now = pulled.load();
    quiet = now == before ? quiet + 1 : 0;
    before = now;
    std::this_thread::sleep_for(slow * 3);
  }
  return pulled.load() - n;
}

TEST(AsyncIteratorTest, AnAutotunedBufferDeepensForABurstyProducerOnly) {
  // Bursts of 16 elements every 30 ms: each time the consumer runs dry
  // after a burst filled the buffer, it doubles; it stops once a burst no
  // longer fills it (32 here), short of the cap.
  const int64_t bursty =
      AutotunedDepth(16 * 12, 16, std::chrono::milliseconds(30));
  EXPECT_GE(bursty, 8);
  EXPECT_LE(bursty, 64);
  // A steady producer slower than the consumer never gets ahead: one
  // element buffered, two after the first wait (slack for a loaded
  // machine's scheduling).
  const int64_t steady = AutotunedDepth(40, 1, std::chrono::milliseconds(5));
  EXPECT_LE(steady, 8);
  EXPECT_LT(steady, bursty);
}

// An input of Int(0..n) that says whether it delivers in the memory it
// is asked for (DeliverIn) without ever copying: whatever copies into the
// memory is the prefetch's own driver.
class IntsInput final : public IteratorBase {
 public:
  IntsInput(int64_t n, bool delivers, bool* asked)
      : n_(n), delivers_(delivers), asked_(asked) {}
  bool GetNext(Element* out) override {
    if (i_ == n_) return false;
    *out = testing::Int(i_++);
    return true;
  }
  void Save(StateWriter*) override {}
  void Restore(StateReader*) override {}
  bool DeliverIn(std::shared_ptr<Allocator>) override {
    *asked_ = true;
    return delivers_;
  }

 private:
  const int64_t n_;
  const bool delivers_;
  bool* asked_;
  int64_t i_ = 0;
};

// The prefetch driver's timer (IteratorOptions::prefetch_polls) against
// a consumer that takes every `interval` (a GPU step's host time),
// simulated: once the takes have set the interval (and a look begun
// before it is known has ended), every take finds the driver's current
// look ending at most half an interval later, so that it need not wake
// the driver (AsyncIterator::GetNext); and once the takes stop, the looks
// back off to their longest.
TEST(AsyncIteratorTest, ADriversLooksKeepPaceWithASteadyConsumer) {
  using std::chrono::microseconds;
  using std::chrono::milliseconds;
  using std::chrono::nanoseconds;
  for (int64_t us : {20, 50, 130, 200, 400, 900}) {
    SCOPED_TRACE(fmt::format("a take every {} us", us));
    const nanoseconds interval = microseconds(us);
    nanoseconds now{0}, last_take{0}, next_take = interval;
    uint64_t takes = 0;
    int idle_looks = 0;
    int late = 0;
    for (int look = 0; look < 2000; ++look) {
      const int64_t known = takes >= 2 ? interval.count() : 0;
      const nanoseconds until = now + PrefetchLookWait(known, idle_looks);
      // Takes while this look waits (the last 500 looks: none, idle).
      while (look < 1500 && next_take <= until) {
        if (takes >= 20 && until - next_take > interval / 2) ++late;
        last_take = next_take;
        ++takes;
        next_take += interval;
      }
      now = until;
      idle_looks = PrefetchConsumerIdle(takes, known, now - last_take)
                       ? idle_looks + 1
                       : 0;
    }
    EXPECT_GT(takes, 100u);
    EXPECT_EQ(late, 0) << "takes that had to wake the driver";
    EXPECT_EQ(PrefetchLookWait(interval.count(), idle_looks),
              std::min<nanoseconds>(
                  128 * std::max<nanoseconds>(interval / 2, microseconds(10)),
                  milliseconds(100)))
        << "an idle consumer's driver looks at its slowest";
  }
}

// A prefetch asks its input to deliver in the output memory and copies
// only when the input does not (then on its driver thread); a map copies
// its function's results itself, without asking its input.
TEST(AsyncIteratorTest, DeliversInTheOutputMemoryByItsInputOrItself) {
  IteratorContext ctx(IteratorOptions{.threads = 2});
  for (bool map : {false, true}) {
    for (bool input_delivers : {false, true}) {
      SCOPED_TRACE(
          fmt::format("map {}, input delivers {}", map, input_delivers));
      auto memory = std::make_shared<testing::RecordingMemory>();
      AsyncIterator::Config config;
      config.stage = map ? "map" : "prefetch";
      config.max_elements = 3;
      if (map) {
        config.fn = [](Element e) { return e; };
        config.parallel_calls = 2;
      }
      bool asked = false;
      AsyncIterator it(&ctx,
                       std::make_unique<IntsInput>(50, input_delivers, &asked),
                       ctx.Counter(&config, config.stage), config);
      EXPECT_TRUE(it.DeliverIn(memory));
      EXPECT_EQ(asked, !map);
      Element e;
      int64_t n = 0;
      while (it.GetNext(&e)) {
        EXPECT_EQ(e["value"].scalar<int64_t>(), n);
        const bool copied = memory->Holds(e["value"].raw_data(), 8);
        EXPECT_EQ(copied, map || !input_delivers) << n;
        ++n;
      }
      EXPECT_EQ(n, 50);
      EXPECT_EQ(memory->threads().count(std::this_thread::get_id()), 0u);
    }
  }
}

// The element a take replaces in the consumer's *out (the batch before,
// in a training loop that keeps one element) goes back to the driver,
// which destroys it on its own thread, so that the take pays none of
// those frees; once the driver runs no more (its input ended), the take
// destroys it itself.  Every element still comes once, in order.
TEST(AsyncIteratorTest, TheElementATakeReplacesIsDestroyedByTheDriver) {
  struct Tracked {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<std::thread::id> freed_on;
  };
  // An element whose one tensor's owner records where it went.
  const auto tracked_element = [](Tracked* t) {
    static const int64_t value = 7;
    std::shared_ptr<const void> owner(&value, [t](const void*) {
      std::lock_guard<std::mutex> lock(t->mu);
      t->freed_on = std::this_thread::get_id();
      t->cv.notify_all();
    });
    Element e;
    e.Set("value", Tensor::View(DType::kInt64, Shape{}, &value, owner));
    return e;
  };
  for (bool ended : {false, true}) {
    SCOPED_TRACE(ended ? "input ended" : "input running");
    constexpr int64_t kN = 5;
    IteratorContext ctx(IteratorOptions{.threads = 2});
    AsyncIterator::Config config;
    config.stage = "prefetch";
    config.max_elements = ended ? kN + 1 : 2;
    bool asked = false;
    AsyncIterator it(&ctx, std::make_unique<IntsInput>(kN, false, &asked),
                     ctx.Counter(&config, config.stage), config);
    Element e;
    ASSERT_TRUE(it.GetNext(&e));
    EXPECT_EQ(e["value"].scalar<int64_t>(), 0);
    if (ended) {
      // Every element and the end buffered: the driver has stopped.
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (ctx.Stats().front().buffered < kN &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_EQ(ctx.Stats().front().buffered, kN);  // kN - 1 and the end
    }
    Tracked tracked;
    e = tracked_element(&tracked);
    ASSERT_TRUE(it.GetNext(&e));
    EXPECT_EQ(e["value"].scalar<int64_t>(), 1);
    {
      std::unique_lock<std::mutex> lock(tracked.mu);
      if (ended) {
        ASSERT_TRUE(tracked.freed_on.has_value()) << "freed by the take";
      } else {
        tracked.cv.wait_for(lock, std::chrono::seconds(10),
                            [&] { return tracked.freed_on.has_value(); });
        ASSERT_TRUE(tracked.freed_on.has_value()) << "never freed";
      }
      EXPECT_EQ(*tracked.freed_on == std::this_thread::get_id(), ended);
    }
    for (int64_t n = 2; n < kN; ++n) {
      ASSERT_TRUE(it.GetNext(&e));
      EXPECT_EQ(e["value"].scalar<int64_t>(), n);
    }
    EXPECT_FALSE(it.GetNext(&e));
  }
}

// A result buffered when the state is saved, an error among them, comes
// back from the state in its place and as its own class.
TEST(AsyncIteratorTest, SavedBufferHoldsResultsAndTypedErrorsInOrder) {
  MapOptions o;
  o.num_parallel_calls = 2;
  auto ds = Dataset::Range(0, 8)
                .Map(
                    [](Element e) {
                      if (e["value"].scalar<int64_t>() == 3) {
                        throw records::RecordError(
                            "f.tfrecord", 120, 3,
                            records::DamageKind::kDataCrcMismatch, "detail");
                      }
                      return e;
                    },
                    o)
                .Prefetch(4);
  Iterator a = ds.MakeIterator({.threads = 2});
  Element e;
  ASSERT_TRUE(a.Next(&e));
  // Let the prefetch buffer fill past the error.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string state = a.Save();
  Iterator b = ds.MakeIterator({.threads = 2});
  b.Restore(state);
  std::vector<int64_t> got;
  while (true) {
    try {
      if (!b.Next(&e)) break;
      got.push_back(e["value"].scalar<int64_t>());
    } catch (const records::RecordError& err) {
      EXPECT_EQ(err.offset(), 120u);
      EXPECT_EQ(err.kind(), records::DamageKind::kDataCrcMismatch);
      got.push_back(-1);
    }
  }
  EXPECT_EQ(got, (std::vector<int64_t>{1, 2, -1, 4, 5, 6, 7}));
}

}  // namespace
}  // namespace recflow::pipeline
