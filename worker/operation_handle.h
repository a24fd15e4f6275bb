#ifndef HARRIER_WORKER_OPERATION_HANDLE_H_
#define HARRIER_WORKER_OPERATION_HANDLE_H_

#include <cstdint>
#include <memory>

namespace harrier {

class Operation;

// Names one async push, pull or push-pull and shares ownership of it, so an
// operation lives exactly as long as its handles and its running tasks: a
// handle that is dropped without Wait() leaks nothing. Cheap to copy; every
// copy names the same operation, and the first Wait() on any copy consumes
// it (later ones return NOT_FOUND, as does a default-constructed handle).
class OperationHandle {
 public:
  OperationHandle() = default;

  // Unique among one Client's operations; 0 for a default handle.
  uint64_t id() const;
  bool valid() const { return op_ != nullptr; }

 private:
  friend class OperationEngine;
  explicit OperationHandle(std::shared_ptr<Operation> op) : op_(std::move(op)) {}

  std::shared_ptr<Operation> op_;
};

}  // namespace harrier

#endif  // HARRIER_WORKER_OPERATION_HANDLE_H_
