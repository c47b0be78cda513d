// Internal to the CUDA backend (not installed): caching allocators for
// device memory and pinned host memory (pipeline/allocator.h).
//
// Device memory: cudaMalloc is slow and synchronises the device, so blocks
// are never given back to CUDA in steady state.  A freed block goes to a
// free list of its size class (512-byte steps up to 1 MiB, 2 MiB steps
// above) and the next request of that class takes it.  All work that uses
// device tensors runs on the backend's one compute stream, so a block
// freed on the host while kernels that read it are still queued can be
// handed out again at once: whatever uses it next is queued after them
// (PyTorch's caching allocator makes the same argument per stream).  When
// cudaMalloc fails, the cached blocks are released (after the device is
// idle) and the request is tried once more; then an Error says how much
// was asked for and how much is in use and cached.
//
// Thread safety: Allocate/Deallocate from any thread (a mutex).
#ifndef RECFLOW_TRAIN_CUDA_ALLOCATOR_H_
#define RECFLOW_TRAIN_CUDA_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "pipeline/allocator.h"

namespace recflow::train::cuda {

struct AllocatorStats {
  uint64_t allocations = 0;   // Allocate calls
  uint64_t cuda_mallocs = 0;  // of them, the ones the cache could not serve
  size_t in_use_bytes = 0;
  size_t cached_bytes = 0;  // free blocks kept for reuse
  size_t peak_in_use_bytes = 0;
};

class CachingAllocator final : public pipeline::Allocator {
 public:
  // kind: kDevice (cudaMalloc on GPU `device`) or kPinnedHost
  // (cudaHostAlloc, portable).  Either way the calling thread's current
  // device is set to `device` first, so that a thread that never chose one
  // (the pipeline's) does not make a context on GPU 0.
  CachingAllocator(pipeline::MemoryKind kind, int device);
  ~CachingAllocator() override;

  void* Allocate(size_t bytes) override;
  void Deallocate(void* p, size_t bytes) noexcept override;
  pipeline::MemoryKind kind() const override { return kind_; }
  int device_index() const override {
    return kind_ == pipeline::MemoryKind::kDevice ? device_ : -1;
  }
  std::string name() const override;

  AllocatorStats stats() const;
  // Whether `p` points into a block this allocator got from CUDA (handed
  // out or cached): a lookup under the mutex, so that the input path can
  // tell its own pinned memory without asking the driver
  // (cudaPointerGetAttributes) for every tensor of every batch.
  bool Owns(const void* p) const;
  // Gives every cached block back to CUDA (waits for the device first).
  void ReleaseCached();
  // The size class of a request.
  static size_t RoundUp(size_t bytes);

 private:
  void* Raw(size_t bytes);
  void FreeRaw(void* p);

  const pipeline::MemoryKind kind_;
  const int device_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> blocks
  std::map<const char*, size_t> blocks_;  // every block from CUDA: its size
  AllocatorStats stats_;
};

}  // namespace recflow::train::cuda

#endif  // RECFLOW_TRAIN_CUDA_ALLOCATOR_H_
