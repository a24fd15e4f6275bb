// ThreadSanitizer support for Debian's Abseil, linked into every binary of
// --config=tsan (.bazelrc, --custom_malloc).
//
// Debian builds libabsl_synchronization without TSan, so TSan sees neither
// the atomics inside absl::Mutex nor the annotations Abseil adds when it is
// itself built with TSan: every access guarded by an absl::Mutex would be
// reported as a race. This file interposes the Mutex, CondVar and
// Notification entry points that Harrier's code calls (an executable's
// definition wins over the shared library's; the binary is linked
// statically, --dynamic_mode=off, so these definitions are in it), forwards
// each call to Abseil's own (dlsym RTLD_NEXT) and tells TSan the
// happens-before edge it creates: a lock acquires, an unlock releases, a
// wait releases before it blocks and acquires when it returns.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

template <typename Fn>
Fn Real(const char* symbol) {
  void* address = dlsym(RTLD_NEXT, symbol);
  if (address == nullptr) {
    std::fprintf(stderr, "tsan_absl: %s not found in libabsl: %s\n", symbol, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(address);
}

// Abseil evaluates a Condition with the mutex held, but inside its own
// code, on the waiting thread or on whichever thread unlocks: the
// predicate's reads need the mutex's edges too, so the wrapper acquires
// before and releases after each evaluation. Lives on the waiter's stack
// for the duration of the call.
struct GuardedCondition {
  const absl::Condition* condition;
  absl::Mutex* mutex;

  static bool Eval(GuardedCondition* self) {
    __tsan_acquire(self->mutex);
    const bool met = self->condition->Eval();
    __tsan_release(self->mutex);
    return met;
  }
};

}  // namespace

// The names are Abseil's own, so a new Abseil ABI (another inline
// namespace) fails loudly in Real() rather than silently losing the edges.
#define HARRIER_ABSL "_ZN4absl7debian3"
#define HARRIER_ABSL_CONST "_ZNK4absl7debian3"  // const member functions

namespace absl {

void Mutex::Lock() {
  static const auto real = Real<void (*)(Mutex*)>(HARRIER_ABSL "5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::Unlock() {
  static const auto real = Real<void (*)(Mutex*)>(HARRIER_ABSL "5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

bool Mutex::TryLock() {
  static const auto real = Real<bool (*)(Mutex*)>(HARRIER_ABSL "5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::ReaderLock() {
  static const auto real = Real<void (*)(Mutex*)>(HARRIER_ABSL "5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderUnlock() {
  static const auto real = Real<void (*)(Mutex*)>(HARRIER_ABSL "5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>(HARRIER_ABSL "5Mutex8LockWhenERKNS0_9ConditionE");
  GuardedCondition guarded{&cond, this};
  real(this, Condition(&GuardedCondition::Eval, &guarded));
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      HARRIER_ABSL "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  GuardedCondition guarded{&cond, this};
  const bool met = real(this, Condition(&GuardedCondition::Eval, &guarded), deadline);
  __tsan_acquire(this);  // held either way
  return met;
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      HARRIER_ABSL "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  GuardedCondition guarded{&cond, this};
  const bool met = real(this, Condition(&GuardedCondition::Eval, &guarded), timeout);
  __tsan_acquire(this);
  return met;
}

// Await releases the held lock while it waits and holds it again on return.
void Mutex::Await(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>(HARRIER_ABSL "5Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  GuardedCondition guarded{&cond, this};
  real(this, Condition(&GuardedCondition::Eval, &guarded));
  __tsan_acquire(this);
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      HARRIER_ABSL "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  GuardedCondition guarded{&cond, this};
  const bool met = real(this, Condition(&GuardedCondition::Eval, &guarded), deadline);
  __tsan_acquire(this);
  return met;
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      HARRIER_ABSL "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  GuardedCondition guarded{&cond, this};
  const bool met = real(this, Condition(&GuardedCondition::Eval, &guarded), timeout);
  __tsan_acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  static const auto real =
      Real<void (*)(CondVar*, Mutex*)>(HARRIER_ABSL "7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      HARRIER_ABSL "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, deadline);
  __tsan_acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      HARRIER_ABSL "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, timeout);
  __tsan_acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>(HARRIER_ABSL "12Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real =
      Real<void (*)(const Notification*)>(HARRIER_ABSL_CONST "12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      HARRIER_ABSL_CONST "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Time)>(
      HARRIER_ABSL_CONST "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

}  // namespace absl

// Suppressions, compiled in so every test finds them wherever Bazel runs it.
// Third-party internals only; each line says why.
extern "C" const char* __tsan_default_suppressions() {
  return
      // Abseil's Mutex deadlock detector keeps its graph (GraphCycles) under
      // Abseil's own SpinLock, which is not instrumented either: seen as
      // memmove races inside InsertEdge when gRPC locks its mutexes.
      "race:synchronization_internal::GraphCycles\n"
      // gRPC hands our request and reply objects between its threads through
      // its own (uninstrumented) queues; TSan then sees gRPC's free() of a
      // buffer Harrier's thread allocated with no ordering between them.
      "race:libgrpc.so\n"
      // The same hand-off for absl::Status: its payload is copied, compared
      // and freed inside libabsl_status (uninstrumented) on gRPC's threads.
      "race:libabsl_status.so\n"
      // The worker's gRPC client (worker/transport/grpc): grpcpp's inline
      // CallOpSet code fills an operation's set on the thread that starts
      // it (FillOps) and finalizes it (FinalizeResult) on the thread that
      // takes its event from the completion queue; gRPC's core, which is
      // not instrumented, orders the two.
      "race:grpc::internal::CallOpSet\n";
}
