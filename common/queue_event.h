#ifndef HARRIER_COMMON_QUEUE_EVENT_H_
#define HARRIER_COMMON_QUEUE_EVENT_H_

// The tags handed to a gRPC completion queue by the code that polls its
// own queues (the shard's listener and the worker's gRPC transport): each
// tag is an object whose Run is the reaction to its operation. Both count
// a call's operations in flight with OperationCount.

#include <atomic>

#if defined(__SANITIZE_THREAD__)
#define HARRIER_QUEUE_EVENT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HARRIER_QUEUE_EVENT_TSAN 1
#endif
#endif
#ifdef HARRIER_QUEUE_EVENT_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace harrier {

// A completion-queue tag: Run is the reaction to the operation it was
// handed to (`ok` as the queue gives it).
class QueueEvent {
 public:
  virtual ~QueueEvent() = default;
  virtual void Run(bool ok) = 0;
};

// What a thread did before it started an operation happens before the
// reaction to the operation's event, on whichever thread takes it from the
// queue: gRPC's core orders the two. That core is not instrumented, so
// under ThreadSanitizer the order is stated here: Sent(event) where an
// operation starts, Received(tag) where its event is taken. Both do
// nothing in other builds.
inline QueueEvent* Sent(QueueEvent* event) {
#ifdef HARRIER_QUEUE_EVENT_TSAN
  __tsan_release(event);
#endif
  return event;
}
inline void Received(void* tag) {
#ifdef HARRIER_QUEUE_EVENT_TSAN
  __tsan_acquire(tag);
#else
  (void)tag;
#endif
}

// A QueueEvent that calls Owner::*Reaction.
template <class Owner, void (Owner::*Reaction)(bool)>
class MemberEvent final : public QueueEvent {
 public:
  explicit MemberEvent(Owner* owner) : owner_(owner) {}
  void Run(bool ok) override { (owner_->*Reaction)(ok); }

 private:
  Owner* const owner_;
};

// How many of a call's operations are in flight: Hold before one starts,
// Release when it is back. The call ends on the Release that brings the
// count to zero; the count starts at what the call holds besides its
// operations (its start, or its status still to be sent).
class OperationCount {
 public:
  explicit OperationCount(int initial) : count_(initial) {}
  void Hold() { count_.fetch_add(1, std::memory_order_relaxed); }
  // True for the Release that brought the count to zero: the caller ends
  // the call (everything the operations wrote is visible to it).
  [[nodiscard]] bool Release() { return count_.fetch_sub(1, std::memory_order_acq_rel) == 1; }

 private:
  std::atomic<int> count_;
};

}  // namespace harrier

#endif  // HARRIER_COMMON_QUEUE_EVENT_H_
