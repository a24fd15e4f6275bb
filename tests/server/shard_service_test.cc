// ShardService with a real ShardStore and no process or socket: the rules
// every transport shares (deadline, chunk limit, push-then-pull, bounded
// pools, cancellation, latency metrics).
#include <catch2/catch.hpp>
#include <dirent.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/cancellation.h"
#include "common/crc32c.h"
#include "common/metrics/metrics.h"
#include "server/shard_service.h"
#include "server/shard_store.h"
#include "tests/server/store_fixtures.h"
#include "tests/slowdown.h"

namespace harrier {
namespace {

using Clock = ShardService::Clock;
using std::chrono::milliseconds;

using testing::MakeStore;

// What Register would hand rank `rank` (no job token, the default job).
proto::Session SessionOf(uint32_t rank) {
  proto::Session session;
  session.set_epoch(1);
  session.set_credential(MintCredential(DeriveSessionKey("", kDefaultJob), kDefaultJob, rank, 1));
  return session;
}

proto::InitRequest Init(const std::string& key, uint32_t chunk, size_t n) {
  proto::InitRequest request = testing::Init(key, n);
  request.set_chunk(chunk);
  return request;
}

// A pushed chunk: the header, and its payload kept apart as transports do.
struct Pushed {
  proto::TensorChunk header;
  std::vector<float> payload;
};

Pushed Gradient(const std::string& key, uint32_t chunk, uint32_t rank, int64_t clock,
                std::vector<float> values) {
  Pushed pushed;
  pushed.header.set_job(kDefaultJob);
  *pushed.header.mutable_session() = SessionOf(rank);
  pushed.header.set_key(key);
  pushed.header.set_chunk(chunk);
  pushed.header.set_rank(rank);
  pushed.header.set_clock(clock);
  pushed.header.set_num_elements(values.size());
  pushed.header.set_dtype(proto::DTYPE_FLOAT32);
  pushed.header.set_checksum(Crc32c(values.data(), values.size() * 4));
  pushed.payload = std::move(values);
  return pushed;
}

std::vector<ShardStore::PushChunkView> Views(const std::vector<Pushed>& chunks) {
  std::vector<ShardStore::PushChunkView> views;
  for (const Pushed& chunk : chunks) {
    views.push_back({&chunk.header,
                     absl::string_view(reinterpret_cast<const char*>(chunk.payload.data()),
                                       chunk.payload.size() * 4)});
  }
  return views;
}

proto::PullRequest PullOf(const std::string& key, uint32_t rank, int64_t clock, size_t n) {
  proto::PullRequest request;
  request.set_job(kDefaultJob);
  request.set_rank(rank);
  *request.mutable_session() = SessionOf(rank);
  request.set_clock(clock);
  proto::ChunkRef* ref = request.add_chunks();
  ref->set_key(key);
  ref->set_num_elements(n);
  return request;
}

// Collects reply chunks as a transport would send them.
class Sink : public ShardService::ReplySink {
 public:
  char* Allocate(size_t bytes) override {
    buffer_.assign(bytes, 0);
    return buffer_.data();
  }
  absl::Status Send(const proto::TensorChunk& header, uint32_t index, bool last) override {
    headers.push_back(header);
    indices.push_back(index);
    lasts.push_back(last);
    std::vector<float> values(buffer_.size() / 4);
    std::memcpy(values.data(), buffer_.data(), buffer_.size());
    payloads.push_back(std::move(values));
    return absl::OkStatus();
  }
  absl::Status AwaitSent(ShardService::Clock::time_point) override {
    awaited_before.push_back(static_cast<uint32_t>(indices.size()));
    return await_status;
  }

  absl::Status await_status;            // what AwaitSent answers
  std::vector<uint32_t> awaited_before;  // chunks sent when AwaitSent was called
  std::vector<proto::TensorChunk> headers;
  std::vector<uint32_t> indices;
  std::vector<bool> lasts;
  std::vector<std::vector<float>> payloads;

 private:
  std::vector<char> buffer_;
};

// A call's outcome, as `done` reports it.
struct Outcome {
  absl::Notification done;
  absl::Status status;
  Clock::time_point at;

  ShardService::Done Callback() {
    return [this](const absl::Status& s) {
      status = s;
      at = Clock::now();
      done.Notify();
    };
  }
  bool Wait(milliseconds timeout = milliseconds(5000)) {
    return done.WaitForNotificationWithTimeout(absl::FromChrono(timeout));
  }
};

uint64_t Count(const Histogram& histogram) {
  const auto counts = histogram.BucketCounts();
  return std::accumulate(counts.begin(), counts.end(), uint64_t{0});
}

// Until the store counts `n` pulls waiting for the consistency model.
bool AwaitBlocked(const ShardStore& store, int n) {
  const auto until = Clock::now() + milliseconds(5000);
  while (store.blocked_pulls() < n) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST_CASE("shard service: the server gives up a little before the client, and within an hour") {
  const Clock::time_point now = Clock::now();
  // 1/5 of the remaining time, at most 200 ms.
  REQUIRE(ShardService::ServerDeadline(now + milliseconds(10000), now) ==
          now + milliseconds(9800));
  REQUIRE(ShardService::ServerDeadline(now + milliseconds(500), now) == now + milliseconds(400));
  REQUIRE(ShardService::ServerDeadline(Clock::time_point::max(), now) ==
          now + std::chrono::hours(1));
  REQUIRE(ShardService::ServerDeadline(now + std::chrono::hours(5), now) ==
          now + std::chrono::hours(1));
  REQUIRE(ShardService::ServerDeadline(now - milliseconds(10), now) <= now);

  // A blocked pull ends at the server's deadline with the store's status,
  // which names the slowest worker, before the client's own deadline.
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  ShardService service(store.get(), {});
  ShardService::Call call;
  call.client_deadline = Clock::now() + milliseconds(1000);
  Sink sink;
  Outcome outcome;
  const auto start = Clock::now();
  service.Pull(call, PullOf("w", 0, 1, 2), &sink, outcome.Callback());
  REQUIRE(outcome.Wait());
  INFO(outcome.status.ToString());
  REQUIRE(absl::IsDeadlineExceeded(outcome.status));
  // Not before the shard's 800 ms. How soon after it the timer's callback
  // runs is the scheduler's business on a busy machine; the bound only
  // says it ran (ServerDeadline's arithmetic is checked above).
  const auto waited = outcome.at - start;
  REQUIRE(waited >= milliseconds(750));
  REQUIRE(waited < milliseconds(5000));
}

TEST_CASE("shard service: a call of more than 256 chunks is refused whole") {
  REQUIRE(ShardService::CheckChunkCount(256).ok());
  REQUIRE(absl::IsResourceExhausted(ShardService::CheckChunkCount(257)));

  auto store = MakeStore("asp", 1);
  std::vector<Pushed> chunks;
  for (uint32_t c = 0; c < 257; ++c) {
    REQUIRE(store->Init(Init("w", c, 1)).ok());
    chunks.push_back(Gradient("w", c, 0, 0, {1.0f}));
  }
  ShardService service(store.get(), {});
  Outcome refused;
  service.Push({}, Views(chunks), refused.Callback());
  REQUIRE(refused.Wait());
  INFO(refused.status.ToString());
  REQUIRE(absl::IsResourceExhausted(refused.status));
  REQUIRE(refused.status.message().find("256") != absl::string_view::npos);
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{0.0f});
  // The same refusal for a push-pull; 256 chunks are fine.
  Sink sink;
  Outcome refused_too;
  service.PushPull({}, Views(chunks), &sink, refused_too.Callback());
  REQUIRE(refused_too.Wait());
  REQUIRE(absl::IsResourceExhausted(refused_too.status));
  chunks.pop_back();
  Outcome accepted;
  service.Push({}, Views(chunks), accepted.Callback());
  REQUIRE(accepted.Wait());
  INFO(accepted.status.ToString());
  REQUIRE(accepted.status.ok());
  REQUIRE(*store->Snapshot("w", 255) == std::vector<float>{-1.0f});
}

TEST_CASE("shard service: a push-pull with a bad pull codec is refused before its push") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  ShardService service(store.get(), {});
  std::vector<Pushed> chunks = {Gradient("w", 0, 0, 0, {1, 2})};
  chunks[0].header.set_pull_codec_params("zip");
  Sink sink;
  Outcome outcome;
  service.PushPull({}, Views(chunks), &sink, outcome.Callback());
  REQUIRE(outcome.Wait());
  REQUIRE(absl::IsInvalidArgument(outcome.status));
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{0, 0});  // the push was not applied
  chunks[0].header.set_pull_codec_params("");
  Outcome retried;
  service.PushPull({}, Views(chunks), &sink, retried.Callback());
  REQUIRE(retried.Wait());
  REQUIRE(retried.status.ok());  // the clock is still free
}

TEST_CASE("shard service: push-pull applies the push, then answers with the parameters after it") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  REQUIRE(store->Init(Init("w", 1, 3)).ok());
  ShardService service(store.get(), {});
  const std::vector<Pushed> chunks = {Gradient("w", 0, 0, 0, {1, 2}),
                                      Gradient("w", 1, 0, 0, {3, 4, 5})};
  Sink sink;
  Outcome outcome;
  service.PushPull({}, Views(chunks), &sink, outcome.Callback());
  REQUIRE(outcome.Wait());
  INFO(outcome.status.ToString());
  REQUIRE(outcome.status.ok());
  REQUIRE(sink.indices == std::vector<uint32_t>{0, 1});
  REQUIRE(sink.lasts == std::vector<bool>{false, true});
  REQUIRE(sink.payloads == std::vector<std::vector<float>>{{-1, -2}, {-3, -4, -5}});
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(sink.headers[i].job() == kDefaultJob);
    REQUIRE(sink.headers[i].key() == "w");
    REQUIRE(sink.headers[i].chunk() == i);
    REQUIRE(sink.headers[i].clock() == 1);  // answered at the clock after the push
  }
  // A plain pull of the same chunk answers the same values.
  Sink pulled;
  Outcome pull;
  service.Pull({}, PullOf("w", 0, 1, 2), &pulled, pull.Callback());
  REQUIRE(pull.Wait());
  REQUIRE(pull.status.ok());
  REQUIRE(pulled.payloads == std::vector<std::vector<float>>{{-1, -2}});
}

TEST_CASE("shard service: a retried push or push-pull is a duplicate on either transport's path") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  ShardService service(store.get(), {});
  const std::vector<Pushed> chunks = {Gradient("w", 0, 0, 0, {1, 2})};
  // gRPC runs the push on its reaction thread, UCX on the push pool.
  for (const bool on_caller_thread : {true, false}) {
    INFO("work_on_caller_thread " << on_caller_thread);
    for (int attempt = 0; attempt < 2; ++attempt) {
      PushResult result;
      ShardService::Call call;
      call.work_on_caller_thread = on_caller_thread;
      call.push_result = &result;
      Outcome outcome;
      service.Push(call, Views(chunks), outcome.Callback());
      REQUIRE(outcome.Wait());
      REQUIRE(outcome.status.ok());
      const bool first = on_caller_thread && attempt == 0;
      REQUIRE(result.applied == (first ? 1u : 0u));
      REQUIRE(result.duplicate == (first ? 0u : 1u));
    }
    // A retried push-pull: the push half is a duplicate, the pull half answers.
    PushResult result;
    ShardService::Call call;
    call.work_on_caller_thread = on_caller_thread;
    call.push_result = &result;
    Sink sink;
    Outcome outcome;
    service.PushPull(call, Views(chunks), &sink, outcome.Callback());
    REQUIRE(outcome.Wait());
    REQUIRE(outcome.status.ok());
    REQUIRE(result.duplicate == 1);
    REQUIRE(sink.payloads == std::vector<std::vector<float>>{{-1, -2}});
  }
  REQUIRE(store->counters().duplicate_pushes == 5);
}

TEST_CASE("shard service: the pull pool waits for each reply chunk to leave before the next") {
  auto store = MakeStore("asp", 1);
  for (uint32_t chunk = 0; chunk < 3; ++chunk) REQUIRE(store->Init(Init("w", chunk, 2)).ok());
  ShardService service(store.get(), {});
  proto::PullRequest request = PullOf("w", 0, 0, 2);
  for (uint32_t chunk = 1; chunk < 3; ++chunk) {
    proto::ChunkRef* ref = request.add_chunks();
    ref->set_key("w");
    ref->set_chunk(chunk);
    ref->set_num_elements(2);
  }
  Sink sink;
  Outcome outcome;
  service.Pull({}, request, &sink, outcome.Callback());
  REQUIRE(outcome.Wait());
  REQUIRE(outcome.status.ok());
  REQUIRE(sink.indices == std::vector<uint32_t>{0, 1, 2});
  // One chunk in memory at a time: before chunk i, the i chunks sent are out.
  REQUIRE(sink.awaited_before == std::vector<uint32_t>{1, 2});

  // The client went away while chunk 0 was leaving: nothing more is pulled.
  Sink gone;
  gone.await_status = absl::CancelledError("client went away");
  Outcome cut;
  service.Pull({}, request, &gone, cut.Callback());
  REQUIRE(cut.Wait());
  REQUIRE(absl::IsCancelled(cut.status));
  REQUIRE(gone.indices == std::vector<uint32_t>{0});
}

TEST_CASE("shard service: a cancelled blocked pull returns CANCELLED at once") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  ShardService service(store.get(), {});
  Cancellation cancellation;
  ShardService::Call call;
  call.client_deadline = Clock::now() + milliseconds(10000);
  call.cancellation = &cancellation;
  Sink sink;
  Outcome outcome;
  service.Pull(call, PullOf("w", 0, 1, 2), &sink, outcome.Callback());
  REQUIRE(AwaitBlocked(*store, 1));
  const auto cancelled_at = Clock::now();
  cancellation.Cancel();
  REQUIRE(outcome.Wait());
  INFO(outcome.status.ToString());
  REQUIRE(absl::IsCancelled(outcome.status));
  // Woken by the cancel, not ended by the 10 s deadline. (Telling a wake-up
  // from a short poll takes a quiet machine: a busy one delays either.)
  REQUIRE(outcome.at - cancelled_at < testing::AtOnce(2000));
  REQUIRE(sink.headers.empty());
}

TEST_CASE("shard service: on the caller's thread, what is ready is answered there, the rest waits "
          "in the pull pool") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 0, 1)).ok());
  REQUIRE(store->Init(Init("w", 1, 1)).ok());
  ShardService service(store.get(), {});
  // Both ranks pushed chunk 0 for clock 0; only rank 0 pushed chunk 1.
  const std::vector<Pushed> both = {Gradient("w", 0, 0, 0, {2})};
  const std::vector<Pushed> other = {Gradient("w", 0, 1, 0, {4})};
  const std::vector<Pushed> half = {Gradient("w", 1, 0, 0, {2})};
  for (const auto* chunks : {&both, &other, &half}) {
    Outcome pushed;
    ShardService::Call call;
    call.work_on_caller_thread = true;
    service.Push(call, Views(*chunks), pushed.Callback());
    REQUIRE(pushed.done.HasBeenNotified());  // applied on this thread
    REQUIRE(pushed.status.ok());
  }

  Cancellation cancellation;
  ShardService::Call call;
  call.work_on_caller_thread = true;
  call.client_deadline = Clock::now() + milliseconds(10000);
  call.cancellation = &cancellation;
  proto::PullRequest request = PullOf("w", 0, 1, 1);
  *request.add_chunks() = request.chunks(0);
  request.mutable_chunks(1)->set_chunk(1);
  Sink sink;
  Outcome outcome;
  service.Pull(call, request, &sink, outcome.Callback());
  // Chunk 0 was ready: answered before Pull returned. Chunk 1 waits for
  // rank 1, in the pool.
  REQUIRE(sink.payloads == std::vector<std::vector<float>>{{-3}});
  REQUIRE(sink.lasts == std::vector<bool>{false});
  REQUIRE_FALSE(outcome.done.HasBeenNotified());
  REQUIRE(AwaitBlocked(*store, 1));
  const std::vector<Pushed> rest = {Gradient("w", 1, 1, 0, {4})};
  Outcome pushed;
  service.Push({}, Views(rest), pushed.Callback());
  REQUIRE(pushed.Wait());
  REQUIRE(outcome.Wait());
  INFO(outcome.status.ToString());
  REQUIRE(outcome.status.ok());
  REQUIRE(sink.indices == std::vector<uint32_t>{0, 1});
  REQUIRE(sink.lasts == std::vector<bool>{false, true});
  REQUIRE(sink.payloads == std::vector<std::vector<float>>{{-3}, {-3}});

  // A pull that has to wait still wakes at once on cancel.
  Sink blocked_sink;
  Outcome blocked;
  service.Pull(call, PullOf("w", 0, 2, 1), &blocked_sink, blocked.Callback());
  REQUIRE_FALSE(blocked.done.HasBeenNotified());
  REQUIRE(AwaitBlocked(*store, 1));
  const auto cancelled_at = Clock::now();
  cancellation.Cancel();
  REQUIRE(blocked.Wait());
  REQUIRE(absl::IsCancelled(blocked.status));
  REQUIRE(blocked.at - cancelled_at < testing::AtOnce(2000));  // not the 10 s deadline
}

TEST_CASE("shard service: a push cancelled before it is applied changes nothing") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("w", 0, 1)).ok());
  ShardService service(store.get(), {});
  Cancellation cancellation;
  cancellation.Cancel();
  ShardService::Call call;
  call.cancellation = &cancellation;
  const std::vector<Pushed> chunks = {Gradient("w", 0, 0, 0, {1})};
  Outcome outcome;
  service.Push(call, Views(chunks), outcome.Callback());
  REQUIRE(outcome.Wait());
  REQUIRE(absl::IsCancelled(outcome.status));
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{0.0f});
}

// Holds the pull thread that answers it in AwaitSent until `release`.
class HoldingSink : public Sink {
 public:
  absl::Status AwaitSent(ShardService::Clock::time_point deadline) override {
    entered.Notify();
    release.WaitForNotificationWithTimeout(absl::FromChrono(deadline - ShardService::Clock::now()));
    return absl::OkStatus();
  }
  absl::Notification entered;
  absl::Notification release;
};

TEST_CASE("shard service: a full pull pool refuses with RESOURCE_EXHAUSTED") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  REQUIRE(store->Init(Init("w", 1, 2)).ok());
  ShardServiceOptions options;
  options.pull_threads = 1;
  options.max_queued_calls = 1;
  ShardService service(store.get(), options);
  ShardService::Call call;
  call.client_deadline = Clock::now() + milliseconds(10000);
  // Blocked pulls no longer hold the thread: a reply that cannot leave does.
  proto::PullRequest two = PullOf("w", 0, 0, 2);
  *two.add_chunks() = two.chunks(0);
  two.mutable_chunks(1)->set_chunk(1);
  HoldingSink holding;
  Sink sinks[2];
  Outcome running, queued, refused;
  service.Pull(call, two, &holding, running.Callback());
  REQUIRE(holding.entered.WaitForNotificationWithTimeout(absl::Seconds(5)));
  service.Pull(call, PullOf("w", 0, 0, 2), &sinks[0], queued.Callback());
  service.Pull(call, PullOf("w", 0, 0, 2), &sinks[1], refused.Callback());
  // Refused on the caller's thread, before returning.
  REQUIRE(refused.done.HasBeenNotified());
  INFO(refused.status.ToString());
  REQUIRE(absl::IsResourceExhausted(refused.status));
  REQUIRE(refused.status.message().find("pull pool is full") != absl::string_view::npos);
  REQUIRE_FALSE(queued.done.HasBeenNotified());
  // A push-pull whose pull half finds the pool full says its push counted.
  const std::vector<Pushed> chunks = {Gradient("w", 0, 1, 0, {1, 1})};
  Outcome half;
  service.PushPull(call, Views(chunks), &sinks[1], half.Callback());
  REQUIRE(half.Wait());
  INFO(half.status.ToString());
  REQUIRE(absl::IsResourceExhausted(half.status));
  REQUIRE(half.status.message().find("push was applied") != absl::string_view::npos);
  holding.release.Notify();
  REQUIRE(running.Wait());
  REQUIRE(queued.Wait());
  REQUIRE(running.status.ok());
  REQUIRE(queued.status.ok());
}

// Threads of this process now.
int ThreadCount() {
  int threads = 0;
  if (auto* dir = opendir("/proc/self/task")) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') ++threads;
    }
    closedir(dir);
  }
  return threads;
}

TEST_CASE("shard service: blocked pulls hold no thread; a ready pull passes them; all are "
          "answered when the round completes") {
  constexpr int kBlocked = 200;
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  REQUIRE(store->Init(Init("v", 0, 2)).ok());
  ShardServiceOptions options;
  options.pull_threads = 4;
  ShardService service(store.get(), options);
  const int threads_before = ThreadCount();
  ShardService::Call call;
  call.client_deadline = Clock::now() + milliseconds(20000);
  std::vector<Sink> sinks(kBlocked);
  std::vector<Outcome> outcomes(kBlocked);
  for (int i = 0; i < kBlocked; ++i) {
    // Both transports' ways in: the pool (UCX) and the caller's thread (gRPC).
    ShardService::Call each = call;
    each.work_on_caller_thread = i % 2 == 1;
    service.Pull(each, PullOf("w", i % 2, 1, 2), &sinks[i], outcomes[i].Callback());
  }
  REQUIRE(AwaitBlocked(*store, kBlocked));
  // Four pool threads, 200 waiting pulls: one that may be answered is.
  Sink ready_sink;
  Outcome ready;
  service.Pull(call, PullOf("v", 0, 0, 2), &ready_sink, ready.Callback());
  REQUIRE(ready.Wait());
  REQUIRE(ready.status.ok());
  INFO("threads before " << threads_before << ", with " << kBlocked << " blocked "
                         << ThreadCount());
  REQUIRE(ThreadCount() <= threads_before + 1);
  for (const auto& outcome : outcomes) REQUIRE_FALSE(outcome.done.HasBeenNotified());

  const std::vector<Pushed> first = {Gradient("w", 0, 0, 0, {2, 2})};
  const std::vector<Pushed> second = {Gradient("w", 0, 1, 0, {4, 4})};
  for (const auto* chunks : {&first, &second}) {
    Outcome pushed;
    service.Push({}, Views(*chunks), pushed.Callback());
    REQUIRE(pushed.Wait());
    REQUIRE(pushed.status.ok());
  }
  for (int i = 0; i < kBlocked; ++i) {
    REQUIRE(outcomes[i].Wait());
    INFO(outcomes[i].status.ToString());
    REQUIRE(outcomes[i].status.ok());
    REQUIRE(sinks[i].payloads == std::vector<std::vector<float>>{{-3, -3}});
  }
  REQUIRE(store->blocked_pulls() == 0);
}

TEST_CASE("shard service: parked pulls are bounded: one more is refused RESOURCE_EXHAUSTED") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  ShardServiceOptions options;
  options.max_parked_pulls = 2;
  ShardService service(store.get(), options);
  ShardService::Call call;
  call.client_deadline = Clock::now() + milliseconds(10000);
  Sink sinks[3];
  Outcome outcomes[3];
  for (int i = 0; i < 2; ++i) {
    service.Pull(call, PullOf("w", 0, 1, 2), &sinks[i], outcomes[i].Callback());
  }
  REQUIRE(AwaitBlocked(*store, 2));
  service.Pull(call, PullOf("w", 0, 1, 2), &sinks[2], outcomes[2].Callback());
  REQUIRE(outcomes[2].Wait());
  INFO(outcomes[2].status.ToString());
  REQUIRE(absl::IsResourceExhausted(outcomes[2].status));
  store->Close();
  for (int i = 0; i < 2; ++i) REQUIRE(outcomes[i].Wait());
}

TEST_CASE("shard service: a parked pull ends at its deadline, not before, naming the slowest "
          "worker") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  ShardService service(store.get(), {});
  ShardService::Call call;
  const auto start = Clock::now();
  call.client_deadline = start + milliseconds(500);  // the shard gives up 100 ms sooner
  Sink sink;
  Outcome outcome;
  service.Pull(call, PullOf("w", 0, 1, 2), &sink, outcome.Callback());
  REQUIRE(AwaitBlocked(*store, 1));
  REQUIRE(outcome.Wait());
  INFO(outcome.status.ToString());
  REQUIRE(absl::IsDeadlineExceeded(outcome.status));
  REQUIRE(outcome.status.message().find("slowest worker") != absl::string_view::npos);
  REQUIRE(outcome.at - start >= milliseconds(390));
  REQUIRE(outcome.at - start < milliseconds(5000));  // the timer ran (late, on a busy machine)
  REQUIRE(store->blocked_pulls() == 0);
}

TEST_CASE("shard service: closing the store or shutting down ends parked pulls at once") {
  auto store = MakeStore("bsp", 2);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  auto service = std::make_unique<ShardService>(store.get(), ShardServiceOptions{});
  ShardService::Call call;
  call.client_deadline = Clock::now() + milliseconds(20000);
  Sink sinks[2];
  Outcome closed, shut;
  service->Pull(call, PullOf("w", 0, 1, 2), &sinks[0], closed.Callback());
  REQUIRE(AwaitBlocked(*store, 1));
  SECTION("close") {
    store->Close();
    REQUIRE(closed.Wait());
    INFO(closed.status.ToString());
    REQUIRE(absl::IsUnavailable(closed.status));
  }
  SECTION("shutdown without closing the store") {
    service->Shutdown();
    REQUIRE(closed.Wait());
    INFO(closed.status.ToString());
    REQUIRE(absl::IsUnavailable(closed.status));
    // Later pulls are refused, and nothing is left parked on the slot.
    service->Pull(call, PullOf("w", 0, 1, 2), &sinks[1], shut.Callback());
    REQUIRE(shut.Wait());
    REQUIRE(absl::IsUnavailable(shut.status));
    REQUIRE(store->blocked_pulls() == 0);
  }
}

TEST_CASE("shard service: every call is observed into the latency histograms it was built with") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("w", 0, 1)).ok());
  Histogram push_seconds(ExponentialBuckets(1e-5, 4, 10));
  Histogram pull_seconds(ExponentialBuckets(1e-5, 4, 10));
  ShardServiceOptions options;
  options.push_seconds = &push_seconds;
  options.pull_seconds = &pull_seconds;
  ShardService service(store.get(), options);
  const std::vector<Pushed> first = {Gradient("w", 0, 0, 0, {1})};
  Outcome push;
  service.Push({}, Views(first), push.Callback());
  REQUIRE(push.Wait());
  REQUIRE(push.status.ok());
  REQUIRE(Count(push_seconds) == 1);
  REQUIRE(Count(pull_seconds) == 0);
  Sink sink;
  Outcome pull;
  service.Pull({}, PullOf("w", 0, 1, 1), &sink, pull.Callback());
  REQUIRE(pull.Wait());
  REQUIRE(Count(pull_seconds) == 1);
  const std::vector<Pushed> second = {Gradient("w", 0, 0, 1, {1})};
  Outcome pushpull;
  service.PushPull({}, Views(second), &sink, pushpull.Callback());
  REQUIRE(pushpull.Wait());
  REQUIRE(pushpull.status.ok());
  REQUIRE(Count(pull_seconds) == 2);
  // The push half of a PushPull is a push too (trainers only PushPull).
  REQUIRE(Count(push_seconds) == 2);
  // Refused calls are calls too.
  std::vector<Pushed> too_many(257, Gradient("w", 0, 0, 2, {1}));
  Outcome refused;
  service.Push({}, Views(too_many), refused.Callback());
  REQUIRE(refused.Wait());
  REQUIRE(Count(push_seconds) == 3);
}

TEST_CASE("shard service: after shutdown every call is refused UNAVAILABLE") {
  auto store = MakeStore("asp", 1);
  REQUIRE(store->Init(Init("w", 0, 1)).ok());
  ShardService service(store.get(), {});
  service.Shutdown();
  const std::vector<Pushed> chunks = {Gradient("w", 0, 0, 0, {1})};
  Outcome outcome;
  service.Push({}, Views(chunks), outcome.Callback());
  REQUIRE(outcome.done.HasBeenNotified());
  REQUIRE(absl::IsUnavailable(outcome.status));
  REQUIRE(*store->Snapshot("w", 0) == std::vector<float>{0.0f});
}

TEST_CASE("shard service: a call without a valid session, or of another job, changes nothing") {
  auto store = MakeStore("asp", 2);
  REQUIRE(store->Init(Init("w", 0, 2)).ok());
  ShardService service(store.get(), {});
  ShardService::Call call;

  auto push = [&](const Pushed& pushed) {
    std::vector<Pushed> chunks{pushed};
    Outcome outcome;
    service.Push(call, Views(chunks), outcome.Callback());
    REQUIRE(outcome.Wait());
    return outcome.status;
  };
  auto message = [](const absl::Status& status) { return std::string(status.message()); };

  Pushed none = Gradient("w", 0, 1, 0, {1, 1});
  none.header.clear_session();
  absl::Status status = push(none);
  INFO(status.ToString());
  REQUIRE(absl::IsPermissionDenied(status));
  REQUIRE(message(status).find("rank 1: no session credential (register first)") !=
          std::string::npos);

  Pushed stolen = Gradient("w", 0, 1, 0, {1, 1});
  *stolen.header.mutable_session() = SessionOf(0);  // rank 0's credential
  status = push(stolen);
  REQUIRE(absl::IsPermissionDenied(status));
  REQUIRE(message(status).find("rank 1: bad session credential") != std::string::npos);

  Pushed other_job = Gradient("w", 0, 1, 0, {1, 1});
  other_job.header.set_job("other");
  status = push(other_job);
  REQUIRE(absl::IsFailedPrecondition(status));
  REQUIRE(message(status).find("'other'") != std::string::npos);
  REQUIRE(message(status).find("'harrier'") != std::string::npos);

  // A call whose second chunk is refused applies neither.
  {
    REQUIRE(store->Init(Init("w", 1, 2)).ok());
    std::vector<Pushed> chunks{Gradient("w", 0, 1, 0, {1, 1}), Gradient("w", 1, 1, 0, {1, 1})};
    chunks[1].header.clear_session();
    Outcome outcome;
    service.Push(call, Views(chunks), outcome.Callback());
    REQUIRE(outcome.Wait());
    REQUIRE(absl::IsPermissionDenied(outcome.status));
  }

  // Heartbeat and Leave alike; nothing changed: rank 1 has not left, has
  // pushed nothing, and may push clock 0.
  proto::HeartbeatRequest heartbeat;
  heartbeat.set_job(kDefaultJob);
  heartbeat.set_rank(1);
  REQUIRE(absl::IsPermissionDenied(service.Heartbeat(heartbeat)));
  proto::LeaveRequest leave;
  leave.set_job(kDefaultJob);
  leave.set_rank(1);
  REQUIRE(absl::IsPermissionDenied(service.Leave(leave)));
  REQUIRE(store->active_workers() == 2);
  Sink sink;
  Outcome pulled;
  service.Pull(call, PullOf("w", 0, 0, 2), &sink, pulled.Callback());
  REQUIRE(pulled.Wait());
  REQUIRE(pulled.status.ok());
  REQUIRE(sink.payloads.at(0) == std::vector<float>{0, 0});
  REQUIRE(push(Gradient("w", 0, 1, 0, {1, 1})).ok());
  *leave.mutable_session() = SessionOf(1);
  REQUIRE(service.Leave(leave).ok());
  REQUIRE(store->active_workers() == 1);

  // A pull without a session is refused before it is planned.
  proto::PullRequest anonymous = PullOf("w", 0, 0, 2);
  anonymous.clear_session();
  Outcome refused;
  Sink nothing;
  service.Pull(call, anonymous, &nothing, refused.Callback());
  REQUIRE(refused.Wait());
  REQUIRE(absl::IsPermissionDenied(refused.status));
  REQUIRE(nothing.headers.empty());
}

}  // namespace
}  // namespace harrier
