#include "pipeline/block_arena.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace recflow::pipeline {
namespace {

constexpr size_t kBlock = size_t{128} << 10;  // the readers' default
constexpr size_t kPerSlab = kBlockSlabBytes / kBlock;

#define REQUIRE_SLABS()                                                 \
  if (!BlockSlabsUsed()) {                                              \
    GTEST_SKIP() << "under AddressSanitizer blocks come from operator " \
                    "new, with redzones, not from slabs";               \
  }

uintptr_t SlabOf(const char* p) {
  return reinterpret_cast<uintptr_t>(p) & ~uintptr_t{kBlockSlabBytes - 1};
}

// Empty slabs are unmapped by the arena's thread, a grace period after the
// last keeper goes: the tests set the grace, and wait for the thread.
class BlockArenaTest : public testing::Test {
 protected:
  void SetUp() override { SetBlockSlabGrace(std::chrono::milliseconds(0)); }
  void TearDown() override { SetBlockSlabGrace(kDefaultBlockSlabGrace); }
  // Whether the slabs of kBlock mapped come down to `n` within 30 s.
  static bool SlabsComeDownTo(uint64_t n) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (BlockSlabsMapped(kBlock) != n) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
};

// Blocks are distinct, aligned, usable, and packed into 2 MiB slabs: 17
// blocks of 128 KiB take two slabs (one of them may be an empty slab kept
// from before).
TEST_F(BlockArenaTest, BlocksFillSlabsOfTwoMebibytes) {
  REQUIRE_SLABS();
  std::vector<char*> blocks;
  for (size_t i = 0; i < kPerSlab + 1; ++i) {
    blocks.push_back(AllocateBlock(kBlock));
    std::memset(blocks.back(), static_cast<int>(i), kBlock);
  }
  EXPECT_EQ(BlockSlabsMapped(kBlock), 2u);
  std::set<uintptr_t> slabs;
  std::set<char*> distinct(blocks.begin(), blocks.end());
  EXPECT_EQ(distinct.size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(blocks[i]) % kBlockAlignment, 0u);
    EXPECT_EQ(blocks[i][kBlock - 1], static_cast<char>(i)) << "overlap";
    slabs.insert(SlabOf(blocks[i]));
  }
  EXPECT_EQ(slabs.size(), 2u);
  for (char* b : blocks) FreeBlock(b, kBlock);
}

// Freed blocks are reused, and empty slabs are kept while any block is in
// use (so that reopening files does not map and fault new memory each
// time); when none is, all but one are unmapped (after the grace: none
// here).
TEST_F(BlockArenaTest, EmptySlabsAreKeptUntilNoBlockIsInUse) {
  REQUIRE_SLABS();
  std::vector<char*> blocks;
  for (size_t i = 0; i < 4 * kPerSlab; ++i) {
    blocks.push_back(AllocateBlock(kBlock));
  }
  EXPECT_EQ(BlockSlabsMapped(kBlock), 4u);
  // Free all but one block: all four slabs kept.
  char* kept = blocks[0];
  for (size_t i = 1; i < blocks.size(); ++i) FreeBlock(blocks[i], kBlock);
  EXPECT_EQ(BlockSlabsMapped(kBlock), 4u);
  // Allocating again takes the fuller slab's free blocks first.
  char* again = AllocateBlock(kBlock);
  EXPECT_EQ(SlabOf(again), SlabOf(kept));
  FreeBlock(again, kBlock);
  FreeBlock(kept, kBlock);
  EXPECT_TRUE(SlabsComeDownTo(1)) << BlockSlabsMapped(kBlock);
}

// While a keeper lives (a pipeline Iterator holds one) empty slabs stay
// mapped even when no block is in use: a shuffle buffer that drains at
// the end of an epoch would otherwise unmap them and the next epoch fault
// them in again.  The last keeper's going unmaps them (all but one), after
// the grace (none here).
TEST_F(BlockArenaTest, AKeeperKeepsEmptySlabsMappedUntilItGoes) {
  REQUIRE_SLABS();
  std::vector<char*> blocks;
  {
    BlockSlabKeeper outer;
    {
      BlockSlabKeeper inner;
      for (size_t i = 0; i < 3 * kPerSlab; ++i) {
        blocks.push_back(AllocateBlock(kBlock));
      }
      for (char* b : blocks) FreeBlock(b, kBlock);
      EXPECT_EQ(BlockSlabsMapped(kBlock), 3u);
    }
    EXPECT_EQ(BlockSlabsMapped(kBlock), 3u) << "another keeper still lives";
    // The kept slabs serve the next allocations: no new mapping.
    blocks.clear();
    for (size_t i = 0; i < 3 * kPerSlab; ++i) {
      blocks.push_back(AllocateBlock(kBlock));
    }
    EXPECT_EQ(BlockSlabsMapped(kBlock), 3u);
    for (size_t i = 1; i < blocks.size(); ++i) FreeBlock(blocks[i], kBlock);
  }
  // No keeper, one block still in use: all kept until it is freed.
  EXPECT_EQ(BlockSlabsMapped(kBlock), 3u);
  FreeBlock(blocks[0], kBlock);
  EXPECT_TRUE(SlabsComeDownTo(1)) << BlockSlabsMapped(kBlock);
  // No keeper and nothing in use: trimmed as soon as the last goes.
  {
    BlockSlabKeeper keeper;
    blocks.clear();
    for (size_t i = 0; i < 2 * kPerSlab; ++i) {
      blocks.push_back(AllocateBlock(kBlock));
    }
    for (char* b : blocks) FreeBlock(b, kBlock);
    EXPECT_EQ(BlockSlabsMapped(kBlock), 2u);
  }
  EXPECT_TRUE(SlabsComeDownTo(1)) << BlockSlabsMapped(kBlock);
}

// After the last keeper goes, empty slabs stay mapped for the grace period,
// and a keeper that comes within it (the next epoch's iterator) reuses them
// instead of mapping and clearing new ones; they are unmapped when the
// grace has passed with no keeper.
TEST_F(BlockArenaTest, EmptySlabsOutliveTheLastKeeperForTheGrace) {
  REQUIRE_SLABS();
  SetBlockSlabGrace(std::chrono::hours(1));
  std::vector<char*> blocks;
  std::set<uintptr_t> first;
  {
    BlockSlabKeeper epoch1;
    for (size_t i = 0; i < 3 * kPerSlab; ++i) {
      blocks.push_back(AllocateBlock(kBlock));
      first.insert(SlabOf(blocks.back()));
    }
    for (char* b : blocks) FreeBlock(b, kBlock);
  }
  EXPECT_EQ(BlockSlabsMapped(kBlock), 3u) << "unmapped within the grace";
  {
    BlockSlabKeeper epoch2;
    blocks.clear();
    for (size_t i = 0; i < 3 * kPerSlab; ++i) {
      blocks.push_back(AllocateBlock(kBlock));
      EXPECT_EQ(first.count(SlabOf(blocks.back())), 1u) << "a new slab";
    }
    EXPECT_EQ(BlockSlabsMapped(kBlock), 3u);
    for (char* b : blocks) FreeBlock(b, kBlock);
  }
  EXPECT_EQ(BlockSlabsMapped(kBlock), 3u);
  // The grace shortened to nothing: the pending trim runs now.
  SetBlockSlabGrace(std::chrono::milliseconds(0));
  EXPECT_TRUE(SlabsComeDownTo(1)) << BlockSlabsMapped(kBlock);
}

// A forked child (Python's multiprocessing workers are) has no trimmer
// thread, even when its parent started one: the arena starts its own for
// the child's first trim, and the arena's lock is free in the child.
TEST_F(BlockArenaTest, AForkedChildTrimsWithItsOwnThread) {
  REQUIRE_SLABS();
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support threads started after "
                  "a fork of a threaded process";
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  GTEST_SKIP() << "ThreadSanitizer does not support threads started after "
                  "a fork of a threaded process";
#endif
#endif
  // The parent's trimmer thread is started and waiting.
  SetBlockSlabGrace(std::chrono::hours(1));
  {
    BlockSlabKeeper keeper;
    std::vector<char*> blocks;
    for (size_t i = 0; i < 3 * kPerSlab; ++i) {
      blocks.push_back(AllocateBlock(kBlock));
    }
    for (char* b : blocks) FreeBlock(b, kBlock);
  }
  ASSERT_EQ(BlockSlabsMapped(kBlock), 3u);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    SetBlockSlabGrace(std::chrono::milliseconds(10));
    {
      BlockSlabKeeper keeper;
      FreeBlock(AllocateBlock(kBlock), kBlock);
    }
    ::_exit(SlabsComeDownTo(1) ? 0 : 1);
  }
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 3000 && done == 0; ++i) {
    done = ::waitpid(child, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL() << "the child hung for 30 s";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's slabs were not trimmed";
  // The parent's slabs are its own: still pending its (hour-long) grace.
  EXPECT_EQ(BlockSlabsMapped(kBlock), 3u);
  SetBlockSlabGrace(std::chrono::milliseconds(0));
  EXPECT_TRUE(SlabsComeDownTo(1)) << BlockSlabsMapped(kBlock);
}

// A size that does not divide 2 MiB comes from operator new, aligned.
TEST_F(BlockArenaTest, OtherSizesComeFromTheHeap) {
  const uint64_t before = BlockSlabsMapped();
  const size_t odd = 3 * 4096 * 10;  // 120 KiB
  char* b = AllocateBlock(odd);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % kBlockAlignment, 0u);
  std::memset(b, 1, odd);
  EXPECT_EQ(BlockSlabsMapped(), before);
  FreeBlock(b, odd);
}

}  // namespace
}  // namespace recflow::pipeline
