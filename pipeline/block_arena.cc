#include "pipeline/block_arena.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <vector>

namespace recflow::pipeline {
namespace {

bool FromSlabs(size_t bytes) {
  return BlockSlabsUsed() && bytes >= kBlockAlignment &&
         bytes <= kBlockSlabBytes && kBlockSlabBytes % bytes == 0;
}

// A 2 MiB-aligned mapping of kBlockSlabBytes: twice that is mapped and the
// ends that are not aligned are unmapped again.
char* MapSlab() {
  void* p = ::mmap(nullptr, 2 * kBlockSlabBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t base =
      (start + kBlockSlabBytes - 1) & ~uintptr_t{kBlockSlabBytes - 1};
  if (base > start) ::munmap(p, base - start);
  const uintptr_t end = start + 2 * kBlockSlabBytes;
  if (end > base + kBlockSlabBytes) {
    ::munmap(reinterpret_cast<void*>(base + kBlockSlabBytes),
             end - (base + kBlockSlabBytes));
  }
  // Refused where transparent huge pages are off: ordinary pages then.
  ::madvise(reinterpret_cast<void*>(base), kBlockSlabBytes, MADV_HUGEPAGE);
  return reinterpret_cast<char*>(base);
}

class Arena {
 public:
  char* Allocate(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    // The fullest slab with a free block of this size, so that blocks in
    // use gather in few slabs and the others can be unmapped.
    Slab* best = nullptr;
    for (auto& [base, slab] : slabs_) {
      if (slab.block_bytes != bytes || slab.free.empty()) continue;
      if (best == nullptr || slab.free.size() < best->free.size()) {
        best = &slab;
      }
    }
    if (best == nullptr) {
      char* base = MapSlab();
      Slab slab;
      slab.block_bytes = bytes;
      for (size_t at = kBlockSlabBytes; at >= bytes; at -= bytes) {
        slab.free.push_back(base + at - bytes);
      }
      best = &slabs_.emplace(reinterpret_cast<uintptr_t>(base), std::move(slab))
                  .first->second;
    }
    char* block = best->free.back();
    best->free.pop_back();
    return block;
  }

  void Free(char* block, size_t bytes) {
    const uintptr_t base =
        reinterpret_cast<uintptr_t>(block) & ~uintptr_t{kBlockSlabBytes - 1};
    std::lock_guard<std::mutex> lock(mu_);
    Slab& slab = slabs_.at(base);
    slab.free.push_back(block);
    if (keepers_ > 0 || slab.free.size() < kBlockSlabBytes / bytes) return;
    ScheduleTrim();
  }

  void Keep() {
    std::lock_guard<std::mutex> lock(mu_);
    ++keepers_;
  }

  void Unkeep() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--keepers_ > 0) return;
    ScheduleTrim();
  }

  void SetGrace(std::chrono::milliseconds grace) {
    std::lock_guard<std::mutex> lock(mu_);
    grace_ = grace;
    if (trim_pending_ && grace_.count() <= 0) {
      trim_pending_ = false;
      if (keepers_ == 0) TrimAll();
    } else if (trim_pending_) {
      trim_at_ = std::chrono::steady_clock::now() + grace_;
      cv_.notify_one();
    }
  }

  // Fork: the child has no trimmer thread, and mu_ must not be held by a
  // thread that the child does not have.
  void BeforeFork() { mu_.lock(); }
  void AfterForkInParent() { mu_.unlock(); }
  // The child starts its own trimmer at its next trim (not here: a child
  // of a threaded process should only make async-signal-safe calls until
  // it returns from fork's handlers).
  void AfterForkInChild() {
    trimmer_started_ = false;
    mu_.unlock();
  }

  uint64_t Slabs(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes == 0) return slabs_.size();
    uint64_t n = 0;
    for (const auto& [base, slab] : slabs_) n += slab.block_bytes == bytes;
    return n;
  }

 private:
  struct Slab {
    size_t block_bytes = 0;
    std::vector<char*> free;
  };

  // Empty slabs are unmapped `grace_` after the last keeper goes (or the
  // last block is freed with no keeper), unless a keeper comes first: a
  // program that makes a new iterator per epoch (as a Python `for` loop
  // over a dataset does) or runs an evaluation between training passes
  // reuses the slabs instead of faulting them in again.  Unmapped at
  // once (grace 0), BM_Epochs spent a fifth of its time in the kernel
  // clearing those pages again: 224 against 165 ms for four epochs
  // (docs/PERFORMANCE.md).  A thread started with the first trim unmaps
  // them.  Called with mu_ held.
  void ScheduleTrim() {
    if (grace_.count() <= 0) {
      TrimAll();
      return;
    }
    trim_pending_ = true;
    trim_at_ = std::chrono::steady_clock::now() + grace_;
    if (!trimmer_started_) StartTrimmer();
    cv_.notify_one();
  }
  void StartTrimmer() {
    trimmer_started_ = true;
    std::thread([this] { TrimmerLoop(); }).detach();
  }
  void TrimmerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return trim_pending_; });
      if (std::chrono::steady_clock::now() < trim_at_) {
        cv_.wait_until(lock, trim_at_);
        continue;  // woken early, or the deadline moved: look again
      }
      trim_pending_ = false;
      if (keepers_ == 0) TrimAll();  // else a keeper came back: it keeps them
    }
  }
  void TrimAll() {
    std::vector<size_t> sizes;
    for (const auto& [base, slab] : slabs_) {
      if (std::find(sizes.begin(), sizes.end(), slab.block_bytes) ==
          sizes.end()) {
        sizes.push_back(slab.block_bytes);
      }
    }
    for (size_t bytes : sizes) Trim(bytes);
  }

  // Unmaps all but one slab of blocks of `bytes` if all of them are empty.
  // Kept while any slab of the size is in use: files open and close all
  // the time and shuffle buffers let go of blocks in random order, and a
  // slab unmapped and mapped again pays its page faults again (a huge
  // page's are a 2 MiB clear: 4% of a shuffled pipeline's time when empty
  // slabs were unmapped as soon as they outnumbered the slabs in use).
  // Called with mu_ held.
  void Trim(size_t bytes) {
    const size_t per_slab = kBlockSlabBytes / bytes;
    std::vector<uintptr_t> empty;
    for (const auto& [base, slab] : slabs_) {
      if (slab.block_bytes != bytes) continue;
      if (slab.free.size() != per_slab) return;  // one in use: keep all
      empty.push_back(base);
    }
    for (size_t i = 1; i < empty.size(); ++i) {
      slabs_.erase(empty[i]);
      ::munmap(reinterpret_cast<void*>(empty[i]), kBlockSlabBytes);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t keepers_ = 0;
  std::unordered_map<uintptr_t, Slab> slabs_;  // by base address
  std::chrono::milliseconds grace_{kDefaultBlockSlabGrace};
  bool trim_pending_ = false;
  std::chrono::steady_clock::time_point trim_at_;
  bool trimmer_started_ = false;
};

// Never destroyed: blocks may be freed by threads still running at exit,
// and the trimmer thread waits on it until the process ends.
Arena& TheArena() {
  static Arena* arena = [] {
    auto* a = new Arena;
    ::pthread_atfork([] { TheArena().BeforeFork(); },
                     [] { TheArena().AfterForkInParent(); },
                     [] { TheArena().AfterForkInChild(); });
    return a;
  }();
  return *arena;
}

// BlockBytesInUse's count: a relaxed add a block (128 KiB by default).
std::atomic<uint64_t> block_bytes_in_use{0};

}  // namespace

char* AllocateBlock(size_t bytes) {
  char* block = FromSlabs(bytes)
                    ? TheArena().Allocate(bytes)
                    : static_cast<char*>(::operator new (
                          bytes, std::align_val_t{kBlockAlignment}));
  block_bytes_in_use.fetch_add(bytes, std::memory_order_relaxed);
  return block;
}

void FreeBlock(char* block, size_t bytes) {
  block_bytes_in_use.fetch_sub(bytes, std::memory_order_relaxed);
  if (!FromSlabs(bytes)) {
    ::operator delete (block, std::align_val_t{kBlockAlignment});
    return;
  }
  TheArena().Free(block, bytes);
}

BlockSlabKeeper::BlockSlabKeeper() {
  if (BlockSlabsUsed()) TheArena().Keep();
}

BlockSlabKeeper::~BlockSlabKeeper() {
  if (BlockSlabsUsed()) TheArena().Unkeep();
}

void SetBlockSlabGrace(std::chrono::milliseconds grace) {
  TheArena().SetGrace(grace);
}

uint64_t BlockBytesInUse() {
  return block_bytes_in_use.load(std::memory_order_relaxed);
}

uint64_t BlockSlabsMapped() { return TheArena().Slabs(0); }

uint64_t BlockSlabsMapped(size_t block_bytes) {
  return TheArena().Slabs(block_bytes);
}

}  // namespace recflow::pipeline
