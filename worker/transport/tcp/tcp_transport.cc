#include "worker/transport/tcp/tcp_transport.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/transport/stream.h"
#include "spdlog/spdlog.h"

namespace harrier {

using transport::Frame;
using transport::Op;

namespace {

// How long a write or a landing's read may go on once its call has ended
// (or its deadline passed) before the connection is shut down under it.
// On a live shard both end in milliseconds; this bounds the wait on one
// that stopped reading or sending mid-message.
constexpr absl::Duration kStreamGrace = absl::Seconds(2);
// How long a reconnect may take at most, so a shard that is still down
// fails the call quickly and the caller's retry loop backs off.
constexpr absl::Duration kReconnectBound = absl::Seconds(5);
// The largest reply payload a shard may announce: replies are chunks of at
// most a few MiB; anything larger is a broken or hostile peer, and would
// make the client allocate it.
constexpr uint64_t kMaxReplyPayloadBytes = uint64_t{64} << 20;
// The writer sends a call's messages in batches of at least this much
// payload (or one message), each taking its pending checksums just before
// it goes: the next batch's CRC runs while the kernel still sends the last.
constexpr size_t kWriteBatchBytes = size_t{256} << 10;

uint64_t RandomConnectionId() {
  static std::atomic<uint64_t> counter{0};
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device() ^ (++counter << 48);
}

int64_t TimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
}

absl::Time PlusGrace(absl::Time deadline) {
  return deadline == absl::InfiniteFuture() ? deadline : deadline + kStreamGrace;
}

const char* LaneName(bool pull) { return pull ? "pull" : "push"; }

}  // namespace

// One call, as fixed when it starts; read without a lock. Its progress is
// in its connection's CallState.
struct TcpCall {
  struct Message {
    std::string header;         // prefix, frame and body (EncodeStreamHeader)
    absl::string_view payload;  // the caller's bytes, sent without a copy
    // Set while the chunk's checksum is pending (OutgoingChunk::
    // checksum_pending): the writer takes the payload's CRC and encodes
    // `header` just before it sends the chunk.
    struct Pending {
      Frame frame;
      proto::TensorChunk chunk;
    };
    std::unique_ptr<Pending> pending;
  };
  uint64_t request_id = 0;
  absl::Time deadline = absl::InfiniteFuture();
  CallCanceller* canceller = nullptr;
  const ReplyLandingChooser* choose = nullptr;  // may be null
  const LandedChunkSink* sink = nullptr;        // null: a push
  std::vector<Message> messages;                // read by the writer thread
  CallDone done;                                // moved out by whoever completes the call
};

// One stream socket to the shard, its writer and reader threads and the
// calls on it. The threads hold a reference, so the connection outlives
// them wherever its last owner lets go.
class TcpConnection : public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(int fd, uint64_t id, std::string peer_name, bool pull, TimerThread* timer)
      : fd_(fd), id_(id), peer_name_(std::move(peer_name)), pull_(pull), timer_(timer) {}
  ~TcpConnection();
  TcpConnection(const TcpConnection&) = delete;
  TcpConnection& operator=(const TcpConnection&) = delete;

  void StartThreads();
  uint64_t id() const { return id_; }
  bool dead() const {
    absl::MutexLock lock(&mutex_);
    return dead_;
  }

  // Queues `call` for the writer and arms its cancel and deadline; or
  // completes it at once (cancelled canceller, dead connection).
  void Submit(std::shared_ptr<TcpCall> call);
  // Ends a call with `result` (cancel) or DEADLINE_EXCEEDED: timer thread.
  void End(uint64_t request_id, const absl::Status& result);
  void Expire(uint64_t request_id);
  // Stops the connection, fails its calls with `status` and joins the
  // threads (unless called on one of them). Every call is complete when it
  // returns. Idempotent; not concurrently with itself.
  void Shutdown(const absl::Status& status);

 private:
  struct Reply {
    proto::TensorChunk header;
    transport::PayloadBuffer payload;
    const char* landed = nullptr;  // set: the payload is in the caller's landing
    size_t landed_bytes = 0;
    uint32_t crc = 0;  // of the payload, taken as it was read
  };
  // A call's progress on this connection.
  struct CallState {
    std::shared_ptr<TcpCall> call;
    // Holds: while any is set the call does not complete (its Start is
    // still registering it; the writer reads its payloads; the reader
    // writes into one of its landings).
    bool starting = true;
    bool writing = false;
    bool landing = false;
    bool queued = false;   // in queue_, not yet taken by the writer
    bool written = false;  // the shard has (some of) its bytes
    bool registered = false;
    bool ended = false;
    absl::Status result;         // once ended
    std::vector<Reply> replies;  // by index
  };
  // What completing a call needs, taken out of calls_ under the lock.
  struct Finished {
    std::shared_ptr<TcpCall> call;
    absl::Status result;
    std::vector<Reply> replies;
    bool registered = false;
  };
  using CallMap = std::map<uint64_t, CallState>;
  // The writer's work: a call's messages, or (request_id 0) `control`.
  struct Outgoing {
    uint64_t request_id = 0;
    std::string control;
  };

  void WriterLoop();
  void ReaderLoop();
  // Handles one reply message whose header was read; not OK: the stream
  // can no longer be trusted.
  absl::Status HandleReply(const Frame& frame, absl::string_view body);
  // Reads and drops `bytes` payload bytes (a reply for a call that ended).
  absl::Status Discard(uint64_t bytes);
  bool WriterHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return dead_ || !queue_.empty();
  }

  // Ends the call (if it has not ended) and completes it unless a hold
  // keeps it. `send_cancel`: tell the shard, if it has heard of the call.
  void EndLocked(CallMap::iterator it, const absl::Status& result, bool send_cancel,
                 std::vector<Finished>* finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Moves an ended call without holds to `finished`, erasing it.
  void FinishIfFreeLocked(CallMap::iterator it, std::vector<Finished>* finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Marks the connection dead, shuts the socket down (waking both threads)
  // and ends every call with `failure`.
  void FailLocked(const absl::Status& failure, std::vector<Finished>* finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The grace of an ended call's write or landing passed.
  void HoldOverdue(uint64_t request_id);
  // Hands replies to the sink and runs done; no lock held.
  static void Complete(std::vector<Finished>& finished);
  absl::Status Unavailable(absl::string_view what) const {
    return absl::UnavailableError(
        absl::StrCat("tcp ", LaneName(pull_), " connection to ", peer_name_, ": ", what));
  }

  const int fd_;
  const uint64_t id_;
  const std::string peer_name_;
  const bool pull_;
  TimerThread* const timer_;  // the transport's, which outlives its calls
  std::thread writer_;
  std::thread reader_;
  std::vector<char> discard_;  // reader thread

  mutable absl::Mutex mutex_;
  bool dead_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mutex_);
  CallMap calls_ ABSL_GUARDED_BY(mutex_);
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mutex_);
};

TcpConnection::~TcpConnection() {
  for (std::thread* thread : {&writer_, &reader_}) {
    if (!thread->joinable()) continue;
    // The last reference may go on the connection's own thread as it ends.
    if (thread->get_id() == std::this_thread::get_id()) {
      thread->detach();
    } else {
      thread->join();
    }
  }
  close(fd_);
}

void TcpConnection::StartThreads() {
  std::shared_ptr<TcpConnection> self = shared_from_this();
  writer_ = std::thread([self] { self->WriterLoop(); });
  reader_ = std::thread([self] { self->ReaderLoop(); });
}

void TcpConnection::Submit(std::shared_ptr<TcpCall> call) {
  const uint64_t request_id = call->request_id;
  CallCanceller& canceller = *call->canceller;
  absl::Status failure;
  {
    absl::MutexLock lock(&mutex_);
    if (dead_) {
      failure = failure_;
    } else {
      // In the table before the canceller knows it, so an abort that comes
      // at once finds it; `starting` keeps it from completing until the
      // registration is settled (the canceller is the caller's).
      CallState state;
      state.call = call;
      calls_.emplace(request_id, std::move(state));
    }
  }
  if (!failure.ok()) return call->done(std::move(failure));
  const std::weak_ptr<TcpConnection> weak = weak_from_this();
  TimerThread* timer = timer_;
  // The abort runs under the canceller's lock: it only schedules the end.
  const bool registered = canceller.Register(call.get(), [weak, timer, request_id] {
    timer->At(absl::InfinitePast(), [weak, request_id] {
      if (auto connection = weak.lock()) {
        connection->End(request_id, absl::CancelledError("operation cancelled"));
      }
    });
  });
  std::vector<Finished> finished;
  bool running = false;
  {
    absl::MutexLock lock(&mutex_);
    auto it = calls_.find(request_id);
    CallState& state = it->second;
    state.starting = false;
    state.registered = registered;
    if (!registered) {
      EndLocked(it, absl::CancelledError("operation cancelled"), false, &finished);
    } else if (state.ended) {
      FinishIfFreeLocked(it, &finished);  // its connection failed meanwhile
    } else {
      state.queued = true;
      queue_.push_back({request_id, {}});
      running = true;
    }
  }
  if (running && call->deadline != absl::InfiniteFuture()) {
    // The timer cannot unschedule: this stays until the deadline even when
    // the call completes first, so it holds no more than two words.
    timer_->At(call->deadline, [weak, request_id] {
      if (auto connection = weak.lock()) connection->Expire(request_id);
    });
  }
  Complete(finished);
}

void TcpConnection::Expire(uint64_t request_id) {
  {
    absl::MutexLock lock(&mutex_);
    if (calls_.find(request_id) == calls_.end()) return;  // completed: the usual case
  }
  End(request_id, absl::DeadlineExceededError(
                      absl::StrCat("no tcp reply from ", peer_name_, " before the deadline")));
}

void TcpConnection::End(uint64_t request_id, const absl::Status& result) {
  std::vector<Finished> finished;
  {
    absl::MutexLock lock(&mutex_);
    auto it = calls_.find(request_id);
    if (it != calls_.end()) EndLocked(it, result, true, &finished);
  }
  Complete(finished);
}

void TcpConnection::EndLocked(CallMap::iterator it, const absl::Status& result, bool send_cancel,
                              std::vector<Finished>* finished) {
  CallState& state = it->second;
  if (state.ended) return;
  state.ended = true;
  state.result = result;
  const uint64_t request_id = it->first;
  if (state.queued) {
    // Never taken by the writer: the shard has not heard of it.
    state.queued = false;
    queue_.erase(std::find_if(queue_.begin(), queue_.end(), [request_id](const Outgoing& o) {
      return o.request_id == request_id;
    }));
  } else if (send_cancel && !dead_ && (state.writing || state.written)) {
    // Best effort: lets the shard stop working on it.
    Frame frame;
    frame.op = Op::kCancel;
    frame.connection_id = id_;
    frame.request_id = request_id;
    queue_.push_back({0, transport::EncodeStreamHeader(frame, {})});
  }
  if ((state.writing || state.landing) && !dead_) {
    std::weak_ptr<TcpConnection> weak = weak_from_this();
    timer_->After(kStreamGrace, [weak, request_id] {
      if (auto connection = weak.lock()) connection->HoldOverdue(request_id);
    });
  }
  FinishIfFreeLocked(it, finished);
}

void TcpConnection::FinishIfFreeLocked(CallMap::iterator it, std::vector<Finished>* finished) {
  CallState& state = it->second;
  if (!state.ended || state.starting || state.writing || state.landing) return;
  finished->push_back(
      {std::move(state.call), std::move(state.result), std::move(state.replies), state.registered});
  calls_.erase(it);
}

void TcpConnection::FailLocked(const absl::Status& failure, std::vector<Finished>* finished) {
  if (!dead_) {
    dead_ = true;
    failure_ = failure;
    queue_.clear();
    ::shutdown(fd_, SHUT_RDWR);
    if (!absl::IsCancelled(failure)) {
      spdlog::warn("tcp connection lost: {}", std::string(failure.message()));
    }
  }
  for (auto it = calls_.begin(); it != calls_.end();) {
    auto next = std::next(it);
    it->second.queued = false;
    if (it->second.ended) {
      FinishIfFreeLocked(it, finished);
    } else {
      EndLocked(it, failure, false, finished);  // erases it when free
    }
    it = next;
  }
}

void TcpConnection::HoldOverdue(uint64_t request_id) {
  std::vector<Finished> finished;
  {
    absl::MutexLock lock(&mutex_);
    auto it = calls_.find(request_id);
    if (it == calls_.end() || !(it->second.writing || it->second.landing)) return;
    // The write or read cannot be abandoned mid-message and resumed: cut
    // the stream, which makes it return (and fails the other calls).
    FailLocked(Unavailable(absl::StrCat("a call's ", it->second.writing ? "request" : "reply",
                                        " was still moving ", absl::FormatDuration(kStreamGrace),
                                        " after it ended; connection closed")),
               &finished);
  }
  Complete(finished);
}

void TcpConnection::Shutdown(const absl::Status& status) {
  std::vector<Finished> finished;
  {
    absl::MutexLock lock(&mutex_);
    FailLocked(status, &finished);
  }
  Complete(finished);
  // Calls held by a write or a landing complete on their thread as the
  // shut-down socket makes it return.
  for (std::thread* thread : {&writer_, &reader_}) {
    if (!thread->joinable()) continue;
    if (thread->get_id() == std::this_thread::get_id()) {
      thread->detach();
    } else {
      thread->join();
    }
  }
}

void TcpConnection::Complete(std::vector<Finished>& finished) {
  for (Finished& call : finished) {
    if (call.registered) call.call->canceller->Unregister(call.call.get());
    absl::Status result = std::move(call.result);
    if (result.ok() && call.call->sink != nullptr) {
      for (const Reply& reply : call.replies) {
        const bool landed = reply.landed != nullptr;
        PayloadView view(landed ? absl::string_view(reply.landed, reply.landed_bytes)
                                : reply.payload.view());
        view.set_crc32c(reply.crc);
        result = (*call.call->sink)(reply.header, view, MemoryKind::kHost);
        if (!result.ok()) break;
      }
    }
    call.replies.clear();  // the transport's buffers go before the caller hears
    CallDone done = std::move(call.call->done);
    done(std::move(result));
  }
  finished.clear();
}

void TcpConnection::WriterLoop() {
  std::vector<struct iovec> parts;
  for (;;) {
    std::shared_ptr<TcpCall> call;
    std::string control;
    {
      absl::MutexLock lock(&mutex_);
      mutex_.Await(absl::Condition(this, &TcpConnection::WriterHasWork));
      if (dead_) return;
      Outgoing next = std::move(queue_.front());
      queue_.pop_front();
      if (next.request_id == 0) {
        control = std::move(next.control);
      } else {
        // Only calls that have not ended are in the queue.
        CallState& state = calls_.at(next.request_id);
        state.queued = false;
        state.writing = true;
        call = state.call;
      }
    }
    absl::Status written;
    if (call != nullptr) {
      // The whole call is written even if it ends meanwhile: a stream
      // stopped mid-message would be unusable.
      const absl::Time deadline = PlusGrace(call->deadline);
      std::vector<TcpCall::Message>& messages = call->messages;
      for (size_t next = 0; next < messages.size() && written.ok();) {
        parts.clear();
        size_t batch_bytes = 0;
        while (next < messages.size() && (parts.empty() || batch_bytes < kWriteBatchBytes)) {
          TcpCall::Message& message = messages[next++];
          if (message.pending != nullptr) {
            message.pending->chunk.set_checksum(
                Crc32c(message.payload.data(), message.payload.size()));
            message.header = transport::EncodeStreamHeader(
                message.pending->frame, transport::EncodeChunkHeader(message.pending->chunk));
            message.pending.reset();
          }
          parts.push_back({const_cast<char*>(message.header.data()), message.header.size()});
          if (!message.payload.empty()) {
            parts.push_back({const_cast<char*>(message.payload.data()), message.payload.size()});
          }
          batch_bytes += message.payload.size();
        }
        written = transport::WriteFully(fd_, parts.data(), parts.size(), deadline);
      }
    } else {
      parts.clear();
      parts.push_back({control.data(), control.size()});
      written = transport::WriteFully(fd_, parts.data(), parts.size(), absl::Now() + kStreamGrace);
    }
    std::vector<Finished> finished;
    {
      absl::MutexLock lock(&mutex_);
      if (call != nullptr) {
        auto it = calls_.find(call->request_id);
        it->second.writing = false;
        it->second.written = true;
        FinishIfFreeLocked(it, &finished);  // it ended while being written
      }
      // Stopped mid-message (or not), the stream is unusable either way.
      if (!written.ok()) {
        FailLocked(Unavailable(absl::StrCat("write failed: ", written.message())), &finished);
      }
    }
    call.reset();
    Complete(finished);
    if (!written.ok()) return;
  }
}

void TcpConnection::ReaderLoop() {
  std::string header;
  for (;;) {
    Frame frame;
    absl::Status status = transport::ReadHeader(fd_, transport::kMaxStreamHeaderBytes,
                                                absl::InfiniteFuture(), &frame, &header);
    if (status.ok()) {
      status = HandleReply(frame, absl::string_view(header).substr(transport::kFrameBytes));
    }
    if (!status.ok()) {
      std::vector<Finished> finished;
      {
        absl::MutexLock lock(&mutex_);
        FailLocked(Unavailable(status.message()), &finished);
      }
      Complete(finished);
      return;
    }
  }
}

absl::Status TcpConnection::HandleReply(const Frame& frame, absl::string_view body) {
  if (frame.payload_bytes > kMaxReplyPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("malformed reply: a payload of ",
                                                   frame.payload_bytes, " bytes, over ",
                                                   kMaxReplyPayloadBytes));
  }
  std::vector<Finished> finished;
  if (frame.op == Op::kStatus) {
    if (frame.payload_bytes != 0) {
      return absl::InvalidArgumentError("malformed reply: a status with a payload");
    }
    {
      absl::MutexLock lock(&mutex_);
      auto it = calls_.find(frame.request_id);
      if (it != calls_.end() && !it->second.ended) {
        absl::Status result = transport::DecodeStatus(frame, body);
        const size_t received = it->second.replies.size();
        if (result.ok() && frame.count != received) {
          result = absl::InternalError(absl::StrCat(peer_name_, " announced ", frame.count,
                                                    " reply chunks over tcp but sent ", received));
        }
        EndLocked(it, result, false, &finished);
      }
    }
    Complete(finished);
    return absl::OkStatus();
  }
  if (frame.op != Op::kReplyChunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed reply: op ", static_cast<int>(frame.op)));
  }
  proto::TensorChunk chunk;
  if (!chunk.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::InvalidArgumentError("malformed reply: a chunk header that does not parse");
  }
  const size_t bytes = static_cast<size_t>(frame.payload_bytes);
  std::shared_ptr<TcpCall> call;
  ReplyLanding landing;
  bool landed = false;
  {
    absl::MutexLock lock(&mutex_);
    auto it = calls_.find(frame.request_id);
    if (it != calls_.end() && !it->second.ended) {
      CallState& state = it->second;
      if (frame.index != state.replies.size() ||
          state.replies.size() >= transport::kMaxChunksPerCall) {
        EndLocked(it,
                  absl::InternalError(absl::StrCat("reply chunk ", frame.index, " from ",
                                                   peer_name_, " out of order (expected ",
                                                   state.replies.size(), ")")),
                  true, &finished);
      } else {
        call = state.call;
        // Chosen under the lock, so the call cannot end and release its
        // landings before `landing` holds it.
        if (call->choose != nullptr) landing = (*call->choose)(chunk, bytes);
        landed = landing.data != nullptr && landing.capacity >= bytes &&
                 landing.memory == MemoryKind::kHost;
        state.landing = landed;
      }
    }
  }
  Complete(finished);
  if (call == nullptr) return Discard(bytes);  // ended (expired, cancelled): dropped

  Reply reply;
  reply.header = std::move(chunk);
  char* target;
  absl::Time read_deadline = absl::InfiniteFuture();
  if (landed) {
    target = static_cast<char*>(landing.data);
    reply.landed = target;
    reply.landed_bytes = bytes;
    // The caller's memory: bounded like the writer's writes (the grace
    // after the call ends also shuts the socket down under this read).
    read_deadline = PlusGrace(call->deadline);
  } else {
    reply.payload = transport::PayloadBuffer::Allocate(bytes);
    target = reply.payload.data();
  }
  const absl::Status read =
      transport::ReadFullyWithCrc32c(fd_, target, bytes, read_deadline, &reply.crc);
  {
    absl::MutexLock lock(&mutex_);
    auto it = calls_.find(call->request_id);
    // Gone only when no landing held it: it ended and completed meanwhile.
    if (it != calls_.end()) {
      if (landed) it->second.landing = false;
      if (read.ok() && !it->second.ended) it->second.replies.push_back(std::move(reply));
      FinishIfFreeLocked(it, &finished);
    }
  }
  Complete(finished);
  return read;
}

absl::Status TcpConnection::Discard(uint64_t bytes) {
  if (discard_.empty()) discard_.resize(size_t{64} << 10);
  while (bytes > 0) {
    const size_t part = static_cast<size_t>(std::min<uint64_t>(bytes, discard_.size()));
    if (auto status = transport::ReadFully(fd_, discard_.data(), part, absl::InfiniteFuture());
        !status.ok()) {
      return status;
    }
    bytes -= part;
  }
  return absl::OkStatus();
}

TcpShardTransport::TcpShardTransport(std::string peer_name, TcpAddressProvider address_provider,
                                     std::shared_ptr<TimerThread> timer,
                                     std::string congestion_control)
    : ShardTransport(TransportTraits{"tcp", /*sends_from_device_memory=*/false,
                                     /*receives_into_device_memory=*/false}),
      timer_(std::move(timer)),
      peer_name_(std::move(peer_name)),
      address_provider_(std::move(address_provider)),
      congestion_control_(std::move(congestion_control)) {}

absl::StatusOr<std::unique_ptr<TcpShardTransport>> TcpShardTransport::Connect(
    const std::string& peer_name, TcpAddressProvider address_provider,
    std::shared_ptr<TimerThread> timer, absl::Time deadline, std::string congestion_control) {
  if (timer == nullptr || !address_provider) {
    return absl::InvalidArgumentError("a tcp transport needs a timer and an address provider");
  }
  std::unique_ptr<TcpShardTransport> transport(new TcpShardTransport(
      peer_name, std::move(address_provider), std::move(timer), std::move(congestion_control)));
  for (Lane lane : {kPushLane, kPullLane}) {
    auto connection = transport->Open(lane, deadline);
    if (!connection.ok()) return connection.status();  // the destructor closes the other
    Slot& slot = transport->slots_[lane];
    absl::MutexLock lock(&slot.mutex);
    slot.connection = std::move(*connection);
  }
  return transport;
}

TcpShardTransport::~TcpShardTransport() {
  for (Slot& slot : slots_) {
    std::shared_ptr<TcpConnection> connection;
    {
      absl::MutexLock lock(&slot.mutex);
      connection = std::move(slot.connection);
    }
    if (connection != nullptr) {
      connection->Shutdown(
          absl::CancelledError(absl::StrCat("the tcp transport to ", peer_name_, " was closed")));
    }
  }
}

absl::StatusOr<std::shared_ptr<TcpConnection>> TcpShardTransport::Open(Lane lane,
                                                                       absl::Time deadline) {
  const bool pull = lane == kPullLane;
  auto fail = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat("tcp connect to ", peer_name_, " (",
                                                    LaneName(pull), "): ", status.message()));
  };
  absl::StatusOr<transport::PeerAddress> address = address_provider_(deadline);
  if (!address.ok()) return fail(address.status());
  absl::StatusOr<int> fd = transport::ConnectStream(address->address, deadline);
  if (!fd.ok()) return fail(fd.status());
  transport::SetCongestionControl(*fd, congestion_control_);

  const uint64_t connection_id = RandomConnectionId();
  Frame hello;
  hello.op = Op::kHello;
  hello.connection_id = connection_id;
  hello.request_id = next_request_id_++;
  hello.arg = TimeoutMs(deadline);
  std::string message = transport::EncodeStreamHeader(hello, address->hello_secret);
  struct iovec part = {message.data(), message.size()};
  absl::Status status = transport::WriteFully(*fd, &part, 1, deadline);
  Frame reply;
  std::string header;
  if (status.ok()) {
    status =
        transport::ReadHeader(*fd, transport::kMaxStreamHeaderBytes, deadline, &reply, &header);
  }
  if (status.ok()) {
    if (reply.op != Op::kStatus || reply.request_id != hello.request_id ||
        reply.payload_bytes != 0) {
      status = absl::UnavailableError("the shard did not answer the hello with its status");
    } else {
      status =
          transport::DecodeStatus(reply, absl::string_view(header).substr(transport::kFrameBytes));
    }
  } else if (absl::IsInvalidArgument(status)) {
    status = absl::UnavailableError(status.message());  // a malformed answer
  }
  if (!status.ok()) {
    close(*fd);
    return fail(status);
  }
  auto connection =
      std::make_shared<TcpConnection>(*fd, connection_id, peer_name_, pull, timer_.get());
  connection->StartThreads();
  return connection;
}

absl::StatusOr<std::shared_ptr<TcpConnection>> TcpShardTransport::CurrentConnection(
    Lane lane, absl::Time deadline) {
  Slot& slot = slots_[lane];
  std::shared_ptr<TcpConnection> failed;
  {
    absl::MutexLock lock(&slot.mutex);
    if (slot.reconnecting) {
      // Another call is reconnecting: use its connection, or fail as it did.
      const absl::Condition reconnected(
          +[](Slot* slot)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot->mutex) { return !slot->reconnecting; },
          &slot);
      if (!slot.mutex.AwaitWithDeadline(reconnected, deadline)) {
        return absl::UnavailableError(
            absl::StrCat("still reconnecting to ", peer_name_, " over tcp"));
      }
      if (slot.connection != nullptr && !slot.connection->dead()) return slot.connection;
      if (!slot.last_reconnect_failure.ok()) return slot.last_reconnect_failure;
    }
    if (slot.connection != nullptr && !slot.connection->dead()) return slot.connection;
    slot.reconnecting = true;
    failed = std::move(slot.connection);
  }
  // Its calls have failed already; this joins its threads, which end as
  // the socket was shut down.
  if (failed != nullptr) failed->Shutdown(absl::UnavailableError("connection replaced"));
  failed.reset();
  absl::StatusOr<std::shared_ptr<TcpConnection>> fresh =
      Open(lane, std::min(deadline, absl::Now() + kReconnectBound));
  absl::MutexLock lock(&slot.mutex);
  slot.reconnecting = false;
  if (!fresh.ok()) {
    slot.last_reconnect_failure = absl::UnavailableError(
        absl::StrCat("tcp connection to ", peer_name_,
                     " lost; reconnecting failed: ", fresh.status().message()));
    return slot.last_reconnect_failure;
  }
  spdlog::info("tcp reconnected to {} ({})", peer_name_, LaneName(lane == kPullLane));
  slot.connection = *fresh;
  slot.last_reconnect_failure = absl::OkStatus();
  return std::move(*fresh);
}

void TcpShardTransport::SendChunks(const std::vector<OutgoingChunk>& chunks, bool then_pull,
                                   const ReplyLandingChooser* choose, const LandedChunkSink* sink,
                                   absl::Time deadline, CallCanceller& canceller, CallDone done) {
  // Before connecting: a refused or cancelled call must not even reconnect.
  if (absl::Status refused = RefuseDeviceChunks(name(), chunks); !refused.ok()) {
    return done(refused);
  }
  if (canceller.cancelled()) return done(absl::CancelledError("operation cancelled"));
  auto connection = CurrentConnection(then_pull ? kPullLane : kPushLane, deadline);
  if (!connection.ok()) return done(connection.status());
  auto call = std::make_shared<TcpCall>();
  call->request_id = next_request_id_++;
  call->deadline = deadline;
  call->canceller = &canceller;
  call->choose = choose;
  call->sink = sink;
  call->done = std::move(done);
  Frame frame;
  frame.op = then_pull ? Op::kPushPull : Op::kPush;
  frame.connection_id = (*connection)->id();
  frame.request_id = call->request_id;
  frame.count = static_cast<uint32_t>(chunks.size());
  frame.arg = TimeoutMs(deadline);
  if (chunks.empty()) call->messages.push_back({transport::EncodeStreamHeader(frame, {}), {}});
  for (size_t i = 0; i < chunks.size(); ++i) {
    const absl::string_view payload = chunks[i].payload();
    frame.index = static_cast<uint32_t>(i);
    frame.payload_bytes = payload.size();
    TcpCall::Message message;
    message.payload = payload;
    if (chunks[i].checksum_pending) {
      // Taken by the writer just before the chunk goes, reading the payload
      // once (the socket sends from the caller's memory without a copy of
      // its own), while the chunk before it is still being sent.
      message.pending = std::make_unique<TcpCall::Message::Pending>(
          TcpCall::Message::Pending{frame, chunks[i].header});
    } else {
      message.header =
          transport::EncodeStreamHeader(frame, transport::EncodeChunkHeader(chunks[i].header));
    }
    call->messages.push_back(std::move(message));
  }
  (*connection)->Submit(std::move(call));
}

void TcpShardTransport::StartPush(const std::vector<OutgoingChunk>& chunks, absl::Time deadline,
                                  CallCanceller& canceller, CallDone done) {
  SendChunks(chunks, false, nullptr, nullptr, deadline, canceller, std::move(done));
}

void TcpShardTransport::StartPushPull(const std::vector<OutgoingChunk>& chunks,
                                      const ReplyLandingChooser* choose,
                                      const LandedChunkSink& sink, absl::Time deadline,
                                      CallCanceller& canceller, CallDone done) {
  SendChunks(chunks, true, choose, &sink, deadline, canceller, std::move(done));
}

void TcpShardTransport::StartPull(const proto::PullRequest& request,
                                  const ReplyLandingChooser* choose, const LandedChunkSink& sink,
                                  absl::Time deadline, CallCanceller& canceller, CallDone done) {
  if (canceller.cancelled()) return done(absl::CancelledError("operation cancelled"));
  auto connection = CurrentConnection(kPullLane, deadline);
  if (!connection.ok()) return done(connection.status());
  auto call = std::make_shared<TcpCall>();
  call->request_id = next_request_id_++;
  call->deadline = deadline;
  call->canceller = &canceller;
  call->choose = choose;
  call->sink = &sink;
  call->done = std::move(done);
  Frame frame;
  frame.op = Op::kPull;
  frame.connection_id = (*connection)->id();
  frame.request_id = call->request_id;
  frame.arg = TimeoutMs(deadline);
  call->messages.push_back({transport::EncodeStreamHeader(frame, request.SerializeAsString()), {}});
  (*connection)->Submit(std::move(call));
}

}  // namespace harrier
