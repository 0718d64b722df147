// Linked into every test only in ThreadSanitizer builds (--config=tsan; see
// common/testing/BUILD). Debian's Abseil is not built with ThreadSanitizer, so TSan
// cannot see that absl::Mutex orders the accesses it guards and would report every one
// as a race. These definitions take the place of absl::Mutex's locking calls in the
// test binary (a definition in the executable wins over the shared library's), call the
// real ones, and tell TSan what they did: a release before the lock is given up, an
// acquire once it is held again.
//
// One blind spot remains: a Condition that absl evaluates inside Await, on the waiting
// thread before it returns, reads under the mutex but before the acquire below. Those
// reports are suppressed (tests/tsan_suppressions.txt: Condition::Eval); clang's
// -Werror=thread-safety build checks statically that such reads are of guarded data.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"

namespace absl {
ABSL_NAMESPACE_BEGIN
namespace {

// The shared library's definition of the function mangled as `name`.
template <typename Function>
Function Real(const char* name) {
  void* found = dlsym(RTLD_NEXT, name);
  if (found == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s is not in the Abseil library\n", name);
    std::abort();
  }
  return reinterpret_cast<Function>(found);
}

}  // namespace

void Mutex::Lock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::Unlock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

bool Mutex::TryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::ReaderLock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderUnlock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

bool Mutex::ReaderTryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Await(const Condition& condition) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  real(this, condition);
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& condition, Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  const bool met = real(this, condition, timeout);
  __tsan_acquire(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& condition, Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  const bool met = real(this, condition, deadline);
  __tsan_acquire(this);
  return met;
}

void Mutex::LockWhen(const Condition& condition) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  real(this, condition);
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& condition, Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool met = real(this, condition, timeout);
  __tsan_acquire(this);
  return met;
}

bool Mutex::LockWhenWithDeadline(const Condition& condition, Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool met = real(this, condition, deadline);
  __tsan_acquire(this);
  return met;
}

ABSL_NAMESPACE_END
}  // namespace absl
