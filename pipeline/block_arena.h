// Memory for the readers' blocks: 2 MiB slabs, each asked of the kernel as
// a transparent huge page (madvise(MADV_HUGEPAGE)), carved into blocks of
// one size.
//
// Why: a shuffle buffer's records are views into the read blocks that hold
// them, so a shuffled pipeline reads its records from anywhere in ~30 MB
// of blocks.  With 4 KiB pages nearly every record is a TLB miss and a
// page walk on top of its cache misses; 2 MiB pages cover those 30 MB with
// 15 TLB entries.  Measured: Fashion-MNIST shuffled (10,000), one thread,
// 1.5x the records/s of blocks from operator new, and 2x on two threads
// (docs/PERFORMANCE.md).
// Where the kernel has transparent huge pages off ("never") the slabs are
// ordinary pages, as before.
//
// Block sizes that do not divide 2 MiB (or are under 4 KiB) come from
// operator new instead, 4 KiB-aligned as well.  Slabs whose blocks are all
// free are kept while any slab of their block size is in use, and while
// any BlockSlabKeeper lives (every pipeline Iterator holds one): the
// memory held is the peak the reads in progress held.  When neither has
// been the case for a grace period (2 s; SetBlockSlabGrace), all but one
// slab of each size are unmapped, by a thread the arena starts for it.
//
// Thread safety: every function may be called from any thread.
#ifndef RECFLOW_PIPELINE_BLOCK_ARENA_H_
#define RECFLOW_PIPELINE_BLOCK_ARENA_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace recflow::pipeline {

inline constexpr size_t kBlockSlabBytes = size_t{2} << 20;
inline constexpr size_t kBlockAlignment = 4096;

// A block of `bytes`, aligned to kBlockAlignment.  Throws std::bad_alloc.
char* AllocateBlock(size_t bytes);
// Returns a block from AllocateBlock(bytes), with the same `bytes`.
void FreeBlock(char* block, size_t bytes);

// Keeps empty slabs mapped while it lives; the grace period after the
// last keeper goes, the empty slabs of each size no block of which is in
// use are unmapped (all but one), unless a keeper came back meanwhile.
// Why: a shuffle buffer under a Repeat drains at the end of each epoch,
// which frees every block; unmapped then, the next epoch mapped the same
// slabs again and paid a 2 MiB clear for each (4% of a shuffled
// pipeline's time on one thread).  The grace does the same for programs
// that make a new Iterator per epoch.
class BlockSlabKeeper {
 public:
  BlockSlabKeeper();
  ~BlockSlabKeeper();
  BlockSlabKeeper(const BlockSlabKeeper&) = delete;
  BlockSlabKeeper& operator=(const BlockSlabKeeper&) = delete;
};

// How long empty slabs stay mapped after the last keeper goes (default
// kDefaultBlockSlabGrace; zero: unmapped at once, by the call that let
// the last one go).  Tests, and
// programs that want memory back sooner.
inline constexpr std::chrono::milliseconds kDefaultBlockSlabGrace{2000};
void SetBlockSlabGrace(std::chrono::milliseconds grace);

// Bytes of the blocks AllocateBlock gave that FreeBlock has not taken
// back, in every build (with slabs or not; for tests and memory
// accounting).
uint64_t BlockBytesInUse();

// Slabs mapped now, of every block size or of one (for tests and memory
// accounting).
uint64_t BlockSlabsMapped();
uint64_t BlockSlabsMapped(size_t block_bytes);

// False under AddressSanitizer: there every block comes from operator new,
// so that a read past a block's end hits a redzone instead of the next
// block of its slab.
// (GCC defines __SANITIZE_ADDRESS__; clang 14 has only __has_feature.)
constexpr bool BlockSlabsUsed() {
#if defined(__SANITIZE_ADDRESS__)
  return false;
#elif defined(__has_feature)
  return !__has_feature(address_sanitizer);
#else
  return true;
#endif
}

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_BLOCK_ARENA_H_
