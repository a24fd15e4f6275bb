#include "server/grpc/async_call.h"

namespace harrier {

void QueuePollers::Start(const std::vector<grpc::ServerCompletionQueue*>& queues) {
  queues_ = queues;
  for (grpc::ServerCompletionQueue* queue : queues_) {
    threads_.emplace_back([queue] {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) static_cast<QueueEvent*>(tag)->Run(ok);
    });
  }
}

void QueuePollers::ShutdownAndJoin() {
  for (grpc::ServerCompletionQueue* queue : queues_) queue->Shutdown();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  queues_.clear();
}

void QueuePollers::Abandon() {
  for (std::thread& thread : threads_) thread.detach();
  threads_.clear();
  queues_.clear();
}

}  // namespace harrier
