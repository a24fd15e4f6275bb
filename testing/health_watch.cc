#include "testing/health_watch.h"

#include <string>
#include <vector>

#include "absl/time/clock.h"

namespace harrier::testing {
namespace {

constexpr intptr_t kStart = 1, kWrite = 2, kRead = 3, kFinish = 4;

std::chrono::system_clock::time_point Chrono(absl::Time deadline) {
  return absl::ToChronoTime(deadline);
}

}  // namespace

HealthWatch::HealthWatch(std::shared_ptr<grpc::Channel> channel) : stub_(std::move(channel)) {}

HealthWatch::~HealthWatch() { Close(); }

bool HealthWatch::Next(intptr_t tag, absl::Time deadline) {
  for (;;) {
    void* got = nullptr;
    bool ok = false;
    switch (queue_.AsyncNext(&got, &ok, Chrono(deadline))) {
      case grpc::CompletionQueue::GOT_EVENT:
        --outstanding_;
        if (reinterpret_cast<intptr_t>(got) == tag) return ok;
        continue;  // an operation an earlier wait gave up on
      case grpc::CompletionQueue::TIMEOUT:
      case grpc::CompletionQueue::SHUTDOWN:
        return false;
    }
  }
}

grpc::Status HealthWatch::Finish(absl::Time deadline) {
  grpc::Status status;
  call_->Finish(&status, reinterpret_cast<void*>(kFinish));
  ++outstanding_;
  finished_ = true;
  if (!Next(kFinish, deadline)) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the watch did not end in time");
  }
  return status;
}

grpc::Status HealthWatch::Open(absl::Time deadline, uint32_t* serving_status) {
  call_ = stub_.PrepareCall(&context_, "/grpc.health.v1.Health/Watch", &queue_);
  started_ = true;
  call_->StartCall(reinterpret_cast<void*>(kStart));
  ++outstanding_;
  if (!Next(kStart, deadline)) return Finish(deadline);
  // HealthCheckRequest{service: ""} is the empty message.
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  call_->WriteLast(request, grpc::WriteOptions(), reinterpret_cast<void*>(kWrite));
  ++outstanding_;
  if (!Next(kWrite, deadline)) return Finish(deadline);
  grpc::ByteBuffer message;
  call_->Read(&message, reinterpret_cast<void*>(kRead));
  ++outstanding_;
  if (!Next(kRead, deadline)) {
    if (absl::Now() >= deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no status came in time");
    }
    return Finish(deadline);
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (message.Dump(&slices).ok()) {
    for (const auto& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  // HealthCheckResponse{status: s} is the two bytes 08 s.
  if (bytes.size() != 2 || bytes[0] != '\x08') {
    return grpc::Status(grpc::StatusCode::INTERNAL, "not a HealthCheckResponse");
  }
  *serving_status = static_cast<uint8_t>(bytes[1]);
  return grpc::Status::OK;
}

void HealthWatch::Close() {
  if (!started_) return;
  started_ = false;
  context_.TryCancel();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  // A start or read given up on ends once cancelled.
  while (outstanding_ > 0) {
    void* got;
    bool ok;
    if (queue_.AsyncNext(&got, &ok, Chrono(deadline)) != grpc::CompletionQueue::GOT_EVENT) break;
    --outstanding_;
  }
  if (!finished_) Finish(deadline);
  queue_.Shutdown();
  void* got;
  bool ok;
  while (queue_.Next(&got, &ok)) {
  }
}

std::unique_ptr<HealthWatch> OpenAdmittedWatch(const std::shared_ptr<grpc::Channel>& channel,
                                               absl::Duration within) {
  const absl::Time deadline = absl::Now() + within;
  for (;;) {
    auto watch = std::make_unique<HealthWatch>(channel);
    uint32_t serving = 0;
    const grpc::Status status = watch->Open(deadline, &serving);
    if (status.ok()) return watch;
    if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED || absl::Now() >= deadline) {
      return nullptr;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace harrier::testing
