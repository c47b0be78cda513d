// convert/ring.h: RunRing's order, its bound on items in flight, slot
// reuse, and errors from each stage.
#include "convert/ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace recflow::convert {
namespace {

struct Item {
  int64_t index = -1;  // of the last item filled into this slot
  bool worked = false;
  bool drained = false;
  uint64_t fills = 0;  // of this slot
};

// Work that takes a different time per item, so that items finish work
// out of order when workers run at once.
void Spin(int64_t index) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::microseconds((index * 7919) % 50);
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(RunRingTest, DrainsEveryItemInFillOrderWithAtMostSlotsInFlight) {
  constexpr int64_t kItems = 5000;
  constexpr size_t kSlots = 4;
  int64_t next = 0;
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> most_in_flight{0};
  std::vector<int64_t> drained;
  RunRing<Item>(
      kSlots,
      [&](Item& item) {
        if (next == kItems) return false;
        // The slot's last item, if any, was drained before it is filled
        // again, and its fill left what it had.
        if (item.fills > 0) {
          EXPECT_TRUE(item.drained) << "slot refilled before its drain";
          EXPECT_EQ(item.index, next - static_cast<int64_t>(kSlots));
        }
        ++item.fills;
        item.index = next++;
        item.worked = item.drained = false;
        const int64_t now = ++in_flight;
        int64_t most = most_in_flight.load();
        while (now > most && !most_in_flight.compare_exchange_weak(most, now)) {
        }
        return true;
      },
      [&](Item& item) {
        Spin(item.index);
        item.worked = true;
      },
      [&](Item& item) {
        EXPECT_TRUE(item.worked);
        drained.push_back(item.index);
        item.drained = true;
        --in_flight;
      });
  ASSERT_EQ(drained.size(), static_cast<size_t>(kItems));
  for (int64_t i = 0; i < kItems; ++i) ASSERT_EQ(drained[i], i);
  EXPECT_LE(most_in_flight.load(), static_cast<int64_t>(kSlots));
  EXPECT_EQ(in_flight.load(), 0);
}

TEST(RunRingTest, NothingFilledRunsNoOtherStage) {
  int fills = 0, works = 0, drains = 0;
  RunRing<Item>(
      8,
      [&](Item&) {
        ++fills;
        return false;
      },
      [&](Item&) { ++works; }, [&](Item&) { ++drains; });
  EXPECT_EQ(fills, 1);
  EXPECT_EQ(works, 0);
  EXPECT_EQ(drains, 0);
}

// Which stage throws, at which item; RunRing must rethrow it only once no
// call runs, having drained no item at or after it and none out of order.
struct Failure {
  const char* stage;
  int64_t at;
};

void PrintTo(const Failure& f, std::ostream* os) {
  *os << f.stage << " at item " << f.at;
}

class RunRingErrorTest : public ::testing::TestWithParam<Failure> {};

TEST_P(RunRingErrorTest, RethrowsTheErrorOnceEveryCallHasEnded) {
  const Failure failure = GetParam();
  const std::string stage = failure.stage;
  int64_t next = 0;
  std::atomic<int> running{0};
  std::vector<int64_t> drained;
  auto call = [&](const char* name, int64_t index) {
    if (stage == name && index == failure.at) {
      // Let other calls start and run on before this one fails.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      --running;
      throw std::runtime_error(std::string(name) + " failed");
    }
    Spin(index);
  };
  try {
    RunRing<Item>(
        4,
        [&](Item& item) {
          ++running;
          item.index = next++;
          call("fill", item.index);
          --running;
          return true;  // without the error, it would never end
        },
        [&](Item& item) {
          ++running;
          call("work", item.index);
          --running;
        },
        [&](Item& item) {
          ++running;
          call("drain", item.index);
          drained.push_back(item.index);
          --running;
        });
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(e.what(), stage + " failed");
  }
  EXPECT_EQ(running.load(), 0) << "a stage call outlived RunRing";
  for (size_t i = 0; i < drained.size(); ++i) {
    ASSERT_EQ(drained[i], static_cast<int64_t>(i));
  }
  EXPECT_LE(drained.size(), static_cast<size_t>(failure.at));
}

INSTANTIATE_TEST_SUITE_P(
    EachStage, RunRingErrorTest,
    ::testing::Values(Failure{"fill", 0}, Failure{"fill", 300},
                      Failure{"work", 0}, Failure{"work", 300},
                      Failure{"drain", 0}, Failure{"drain", 300}),
    [](const ::testing::TestParamInfo<Failure>& info) {
      return std::string(info.param.stage) + "At" +
             std::to_string(info.param.at);
    });

}  // namespace
}  // namespace recflow::convert
