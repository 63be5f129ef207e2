// Host memory on transparent huge pages, for the large arrays a step streams:
// the weight tensors (hundreds of MB a token for the paper's shape) and the
// CPU backend's KV cache. In 4 KiB pages, streaming them takes a TLB miss
// every 4 KiB. Allocations of 2 MiB or more start on a 2 MiB boundary and are
// advised as transparent huge pages (madvise(MADV_HUGEPAGE)) before anything
// touches them, so that where the kernel's THP mode is `madvise` (Debian's
// default) they are backed by 2 MiB pages. Smaller allocations come from the
// heap. Where the kernel has no THP, the advice is ignored and the memory is
// ordinary.
#ifndef SWITCHSERVE_ENGINE_MODEL_HUGE_PAGES_H_
#define SWITCHSERVE_ENGINE_MODEL_HUGE_PAGES_H_

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace switchserve {

// The size from which an allocation is huge-page aligned and advised.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` (>= kHugePageBytes) mapped on a 2 MiB boundary, in whole huge
// pages, advised as huge pages; throws std::bad_alloc when mapping fails.
void* AllocateHugePageBytes(size_t bytes);
// Unmaps what AllocateHugePageBytes(bytes) returned.
void FreeHugePageBytes(void* p, size_t bytes);

// resize() through this allocator default-initialises new elements (no
// zero-fill for arithmetic types): storage that is about to be overwritten is
// written once, not twice. Pass a value (assign(n, 0.0f)) where zeros matter.
template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  explicit HugePageAllocator(const HugePageAllocator<U>&) {}

  T* allocate(size_t n) {
    if (n * sizeof(T) >= kHugePageBytes)
      return static_cast<T*>(AllocateHugePageBytes(n * sizeof(T)));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) >= kHugePageBytes) {
      FreeHugePageBytes(p, n * sizeof(T));
    } else {
      std::allocator<T>().deallocate(p, n);
    }
  }
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  friend bool operator==(const HugePageAllocator&, const HugePageAllocator&) { return true; }
};

template <typename T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_HUGE_PAGES_H_
