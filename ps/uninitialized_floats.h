// A float buffer whose resize() writes nothing: for floats about to be overwritten
// (a gradient being decoded), which need no zero-filling first.
#ifndef PARAMSERVER_PS_UNINITIALIZED_FLOATS_H_
#define PARAMSERVER_PS_UNINITIALIZED_FLOATS_H_

#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace paramserver {

// std::allocator, except that resize() leaves new elements default-initialised: floats
// about to be overwritten are not zero-filled first.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// A float buffer whose resize() writes nothing.
using UninitializedFloats = std::vector<float, DefaultInitAllocator<float>>;

}  // namespace paramserver

#endif  // PARAMSERVER_PS_UNINITIALIZED_FLOATS_H_
