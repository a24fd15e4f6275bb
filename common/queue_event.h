#ifndef HARRIER_COMMON_QUEUE_EVENT_H_
#define HARRIER_COMMON_QUEUE_EVENT_H_

// The tags handed to a gRPC completion queue by the code that polls its
// own queues (the shard's listener and the worker's gRPC transport): each
// tag is an object whose Run is the reaction to its operation.

namespace harrier {

// A completion-queue tag: Run is the reaction to the operation it was
// handed to (`ok` as the queue gives it).
class QueueEvent {
 public:
  virtual ~QueueEvent() = default;
  virtual void Run(bool ok) = 0;
};

// A QueueEvent that calls Owner::*Reaction.
template <class Owner, void (Owner::*Reaction)(bool)>
class MemberEvent final : public QueueEvent {
 public:
  explicit MemberEvent(Owner* owner) : owner_(owner) {}
  void Run(bool ok) override { (owner_->*Reaction)(ok); }

 private:
  Owner* const owner_;
};

}  // namespace harrier

#endif  // HARRIER_COMMON_QUEUE_EVENT_H_
