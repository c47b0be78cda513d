// AlignedVector<T>: a std::vector whose storage is 64-byte aligned (a cache
// line; what SIMD loads and the pipeline's tensors want) and whose resize()
// leaves new elements of trivial types uninitialised, because the parser
// overwrites them at once and zeroing them first would cost as much as
// writing them.  Use resize(n, value) where values must be set.
#ifndef RECFLOW_RECORDS_ALIGNED_BUFFER_H_
#define RECFLOW_RECORDS_ALIGNED_BUFFER_H_

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace recflow::records {

inline constexpr std::size_t kBufferAlignment = 64;

template <typename T>
class AlignedAllocator {
 public:
  using value_type = T;
  AlignedAllocator() noexcept = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    return static_cast<T*>(
        ::operator new (n * sizeof(T), std::align_val_t{kBufferAlignment}));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete (p, std::align_val_t{kBufferAlignment});
  }
  // Default-initialise (no zeroing for trivial types) when no value is
  // given.
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_ALIGNED_BUFFER_H_
