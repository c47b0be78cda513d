#include "train/cuda_allocator.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>

#include "train/error.h"

namespace recflow::train::cuda {

CachingAllocator::CachingAllocator(pipeline::MemoryKind kind, int device)
    : kind_(kind), device_(device) {}

CachingAllocator::~CachingAllocator() {
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) FreeRaw(p);
  }
}

std::string CachingAllocator::name() const {
  return kind_ == pipeline::MemoryKind::kDevice
             ? fmt::format("cuda:{} caching", device_)
             : "pinned host caching";
}

size_t CachingAllocator::RoundUp(size_t bytes) {
  constexpr size_t kSmall = size_t{1} << 20;
  constexpr size_t kSmallStep = 512;
  constexpr size_t kLargeStep = size_t{2} << 20;
  if (bytes <= kSmall) {
    return std::max(kSmallStep,
                    (bytes + kSmallStep - 1) / kSmallStep * kSmallStep);
  }
  return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
}

void* CachingAllocator::Raw(size_t bytes) {
  void* p = nullptr;
  cudaError_t e;
  // Pinned memory too: it is asked for on the pipeline's threads, where no
  // device was chosen, and CUDA would make a context on GPU 0 for it (half
  // a GiB there for every rank of a job whose rank uses another GPU).
  cudaSetDevice(device_);
  if (kind_ == pipeline::MemoryKind::kDevice) {
    e = cudaMalloc(&p, bytes);
  } else {
    e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    return nullptr;
  }
  try {
    blocks_.emplace(static_cast<const char*>(p), bytes);
  } catch (...) {
    FreeRaw(p);
    return nullptr;
  }
  return p;
}

void CachingAllocator::FreeRaw(void* p) {
  blocks_.erase(static_cast<const char*>(p));
  cudaSetDevice(device_);
  if (kind_ == pipeline::MemoryKind::kDevice) {
    cudaFree(p);
  } else {
    cudaFreeHost(p);
  }
}

void* CachingAllocator::Allocate(size_t bytes) {
  const size_t size = RoundUp(bytes);
  std::unique_lock lock(mu_);
  ++stats_.allocations;
  auto it = free_.find(size);
  void* p = nullptr;
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
  } else {
    ++stats_.cuda_mallocs;
    p = Raw(size);
    if (p == nullptr) {
      // Out of memory: give the cache back and try once more.
      lock.unlock();
      ReleaseCached();
      lock.lock();
      p = Raw(size);
    }
    if (p == nullptr) {
      throw Error(fmt::format(
          "{}: out of memory allocating {} bytes ({} in use by tensors, "
          "peak {})",
          name(), size, stats_.in_use_bytes, stats_.peak_in_use_bytes));
    }
  }
  stats_.in_use_bytes += size;
  stats_.peak_in_use_bytes =
      std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return p;
}

void CachingAllocator::Deallocate(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  const size_t size = RoundUp(bytes);
  std::lock_guard lock(mu_);
  try {
    free_[size].push_back(p);
    stats_.cached_bytes += size;
  } catch (...) {
    FreeRaw(p);  // no memory for the list: give the block back instead
  }
  stats_.in_use_bytes -= size;
}

void CachingAllocator::ReleaseCached() {
  cudaSetDevice(device_);
  if (kind_ == pipeline::MemoryKind::kDevice) cudaDeviceSynchronize();
  std::lock_guard lock(mu_);
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) FreeRaw(p);
    blocks.clear();
  }
  free_.clear();
  stats_.cached_bytes = 0;
}

bool CachingAllocator::Owns(const void* p) const {
  const auto* c = static_cast<const char*>(p);
  std::lock_guard lock(mu_);
  auto it = blocks_.upper_bound(c);
  if (it == blocks_.begin()) return false;
  --it;
  return c < it->first + it->second;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace recflow::train::cuda
