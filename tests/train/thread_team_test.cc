#include "train/thread_team.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace recflow::train {
namespace {

TEST(ThreadTeamTest, RunsEveryTaskOnceOnEveryTeamSize) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadTeam team(threads);
    EXPECT_EQ(team.size(), threads);
    for (int64_t tasks : {0, 1, 2, 5, 64}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
      team.Run(tasks, [&](int64_t t) { runs[static_cast<size_t>(t)]++; });
      for (int64_t t = 0; t < tasks; ++t) {
        EXPECT_EQ(runs[static_cast<size_t>(t)].load(), 1)
            << threads << " threads, task " << t << " of " << tasks;
      }
    }
  }
}

TEST(ThreadTeamTest, ForCoversTheRangeInAtMostTeamSizePieces) {
  ThreadTeam team(3);
  for (int64_t n : {0, 1, 7, 100, 1000}) {
    for (int64_t grain : {1, 10, 400}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      std::atomic<int> pieces{0};
      team.For(n, grain, [&](int64_t lo, int64_t hi) {
        ASSERT_LT(lo, hi);
        pieces++;
        for (int64_t i = lo; i < hi; ++i) seen[static_cast<size_t>(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << n << " " << i;
      }
      EXPECT_EQ(pieces.load(), team.Tasks(n, grain)) << n << " " << grain;
      EXPECT_LE(pieces.load(), 3);
      if (n > 0 && n < grain) {
        EXPECT_EQ(pieces.load(), 1);
      }
    }
  }
}

// Thousands of short loops back to back, with workers that sleep at once
// (no spin) and with spinning ones: no loop may lose or repeat a task,
// whether a worker is awake, asleep or waking late.
TEST(ThreadTeamTest, ManyShortLoopsWithSleepingAndSpinningWorkers) {
  for (auto spin :
       {std::chrono::microseconds(0), std::chrono::microseconds(100)}) {
    ThreadTeam team(4, spin);
    std::vector<int64_t> sums(8);
    int64_t expected = 0;
    for (int loop = 0; loop < 3000; ++loop) {
      const int64_t tasks = 1 + loop % 8;
      std::fill(sums.begin(), sums.end(), 0);
      team.Run(tasks, [&](int64_t t) { sums[static_cast<size_t>(t)] += loop; });
      for (int64_t t = 0; t < tasks; ++t) {
        ASSERT_EQ(sums[static_cast<size_t>(t)], loop) << "loop " << loop;
      }
      expected += loop;
    }
    EXPECT_GT(expected, 0);
  }
}

TEST(ThreadTeamTest, AnExceptionReachesTheCallerAfterEveryTaskRan) {
  ThreadTeam team(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(team.Run(6,
                        [&](int64_t t) {
                          ran++;
                          if (t == 2) throw std::runtime_error("task 2");
                        }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 6);
  // The team goes on working.
  std::atomic<int> after{0};
  team.Run(4, [&](int64_t) { after++; });
  EXPECT_EQ(after.load(), 4);
}

}  // namespace
}  // namespace recflow::train
