// Where tensor storage comes from: host memory, page-locked (pinned) host
// memory that a GPU can copy from asynchronously, or a GPU's own memory.
//
// Tensor::Allocate(dtype, shape, allocator) takes its storage from an
// Allocator and gives it back when the last Tensor sharing it goes; the
// Tensor keeps the allocator alive until then.  Without an allocator,
// Tensor::Allocate takes 64-byte aligned host memory (the pipeline's
// default).  The CUDA backend (train/) provides the pinned and device
// allocators; pipeline/ itself never touches a GPU.
//
// Thread safety: implementations must allow Allocate and Deallocate from
// any thread (a tensor may be freed on another thread than it was made).
#ifndef RECFLOW_PIPELINE_ALLOCATOR_H_
#define RECFLOW_PIPELINE_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace recflow::pipeline {

// Where a tensor's storage lives.  Host memory (pinned or not) is kCpu:
// the host reads it directly.  kCuda is a GPU's memory, which only that
// GPU's kernels and copies may touch.
enum class Device : uint8_t { kCpu, kCuda };
std::string_view DeviceName(Device d);  // "cpu", "cuda"

enum class MemoryKind : uint8_t { kHost, kPinnedHost, kDevice };

class Allocator {
 public:
  virtual ~Allocator() = default;
  // At least `bytes` bytes, aligned to 256 bytes; throws an Error (saying
  // how much was asked and what is in use) when the memory is not there.
  virtual void* Allocate(size_t bytes) = 0;
  // Gives back what Allocate(bytes) returned.  Never throws.
  virtual void Deallocate(void* p, size_t bytes) noexcept = 0;
  virtual MemoryKind kind() const = 0;
  Device device() const {
    return kind() == MemoryKind::kDevice ? Device::kCuda : Device::kCpu;
  }
  // kDevice: the GPU's ordinal; otherwise -1.
  virtual int device_index() const { return -1; }
  virtual std::string name() const = 0;  // "cuda:0 caching", "pinned host"
};

}  // namespace recflow::pipeline

#endif  // RECFLOW_PIPELINE_ALLOCATOR_H_
