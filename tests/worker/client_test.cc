// The client over a fake control plane and fake transports: routing,
// chunking, retries, cancellation, deadlines, handle lifetime, bounded
// pools and DGC momentum, without a server process.
#include "worker/client.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/codec/codec.h"
#include "common/codec/error_feedback.h"
#include "common/partitioner.h"
#include "tests/worker/fake_cluster.h"
#include "worker/fake_control_client.h"
#include "worker/transport/fake/fake_transport.h"

namespace harrier {
namespace {


ClientOptions TestOptions(int num_shards) {
  ClientOptions options;
  for (int i = 0; i < num_shards; ++i) options.servers.push_back(absl::StrCat("fake:", i));
  options.heartbeat_interval = absl::ZeroDuration();
  options.rpc_timeout = absl::Seconds(30);
  return options;
}


// A cluster with a 4-element tensor "w" registered.
FakeCluster MakeClusterWithW(const ClientOptions& options) {
  FakeCluster cluster = MakeFakeCluster(options);
  REQUIRE(cluster.client->RegisterTensor("w", {4}).ok());
  return cluster;
}

std::vector<float> Iota(size_t n, float start = 0.0f) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = start + static_cast<float>(i);
  return values;
}

std::string Bytes(const float* values, size_t n) {
  return std::string(reinterpret_cast<const char*>(values), n * sizeof(float));
}

// A shard restored from a checkpoint re-bases a rank from these (its pushes
// after the checkpoint were acknowledged and will not come again).
TEST_CASE("a shard's heartbeat carries the next clock of each chunk that shard acknowledged") {
  ClientOptions options = TestOptions(3);
  options.chunk_bytes = 4 * sizeof(float);  // 10 elements: chunks 0, 1, 2 over the shards
  FakeCluster cluster = MakeFakeCluster(options);
  REQUIRE(cluster.client->RegisterTensor("w", {10}, Iota(10)).ok());
  std::vector<float> gradient(10, 1.0f), out(10);
  REQUIRE(cluster.client->Push("w", gradient).ok());
  cluster.client->Clock();
  REQUIRE(cluster.client->PushPull("w", gradient, absl::MakeSpan(out)).ok());
  REQUIRE(cluster.client->Heartbeat().ok());
  const FakeControlClient::Requests requests = cluster.control->requests();
  REQUIRE(requests.shard_heartbeats.size() == 3);
  int chunks = 0;
  for (int shard = 0; shard < 3; ++shard) {
    // What this shard acknowledged, from its calls.
    std::map<uint32_t, int64_t> expected;
    for (const FakeShardTransport::Call& call : cluster.shards[shard]->calls()) {
      for (const proto::TensorChunk& chunk : call.chunks) {
        expected[chunk.chunk()] = std::max(expected[chunk.chunk()], chunk.clock() + 1);
      }
    }
    std::map<uint32_t, int64_t> sent;
    const proto::HeartbeatRequest& heartbeat = requests.shard_heartbeats[shard].second;
    REQUIRE(requests.shard_heartbeats[shard].first == shard);
    for (const proto::ChunkClock& clock : heartbeat.pushed()) {
      REQUIRE(clock.key() == "w");
      sent[clock.chunk()] = clock.next_clock();
    }
    REQUIRE(sent == expected);
    chunks += static_cast<int>(sent.size());
  }
  REQUIRE(chunks == 3);
  REQUIRE(requests.heartbeats.at(0).pushed().empty());  // the control plane gets none
}

TEST_CASE("every call naming the rank carries Register's session; Heartbeat reaches every shard") {
  ClientOptions options = TestOptions(3);
  options.rank = 2;
  options.chunk_bytes = 4 * sizeof(float);
  FakeCluster cluster = MakeFakeCluster(options);
  const proto::Session expected = FakeControlClient::SessionFor(2);
  REQUIRE(cluster.client->session_epoch() == expected.epoch());
  auto same = [&](const proto::Session& session) {
    return session.epoch() == expected.epoch() && session.credential() == expected.credential();
  };
  REQUIRE(cluster.client->RegisterTensor("w", {10}, Iota(10)).ok());
  std::vector<float> gradient(10, 1.0f), out(10);
  REQUIRE(cluster.client->Push("w", gradient).ok());
  REQUIRE(cluster.client->Pull("w", absl::MakeSpan(out)).ok());
  REQUIRE(cluster.client->PushPull("w", gradient, absl::MakeSpan(out)).ok());
  int calls = 0;
  for (FakeShardTransport* shard : cluster.shards) {
    for (const FakeShardTransport::Call& call : shard->calls()) {
      ++calls;
      if (call.kind == FakeShardTransport::CallKind::kPull) {
        REQUIRE(same(call.pull.session()));
      }
      for (const proto::TensorChunk& chunk : call.chunks) {
        REQUIRE(chunk.rank() == 2);
        REQUIRE(same(chunk.session()));
      }
    }
  }
  REQUIRE(calls > 0);

  REQUIRE(cluster.client->Heartbeat().ok());
  REQUIRE(cluster.client->Barrier("b").ok());
  REQUIRE(cluster.client->Leave().ok());
  const FakeControlClient::Requests requests = cluster.control->requests();
  REQUIRE(requests.heartbeats.size() == 1);
  REQUIRE(same(requests.heartbeats[0].session()));
  REQUIRE(requests.shard_heartbeats.size() == 3);  // every shard, not only the control plane
  for (int shard = 0; shard < 3; ++shard) {
    REQUIRE(requests.shard_heartbeats[shard].first == shard);
    REQUIRE(same(requests.shard_heartbeats[shard].second.session()));
  }
  REQUIRE(same(requests.barriers.at(0).session()));
  REQUIRE(requests.leaves.size() == 3);
  for (const auto& [shard, leave] : requests.leaves) REQUIRE(same(leave.session()));
}

TEST_CASE("chunks are cut at chunk_bytes and go to the shard the partitioner names") {
  ClientOptions options = TestOptions(3);
  options.chunk_bytes = 4 * sizeof(float);
  FakeCluster cluster = MakeFakeCluster(options);
  const std::vector<float> initial = Iota(10, 100.0f);
  REQUIRE(cluster.client->RegisterTensor("w", {10}, initial).ok());
  const std::vector<ChunkSpan> expected = SplitIntoChunks("w", 10, 4, HashPartitioner(3));
  REQUIRE(expected.size() == 3);

  // Init: one request per chunk, on its shard, with its slice of the values.
  const auto inits = cluster.control->requests().inits;
  REQUIRE(inits.size() == expected.size());
  for (size_t i = 0; i < inits.size(); ++i) {
    const ChunkSpan& span = expected[i];
    CHECK(inits[i].first == span.shard);
    CHECK(inits[i].second.chunk() == span.chunk);
    CHECK(inits[i].second.num_elements() == span.num_elements);
    CHECK(inits[i].second.initial_values() ==
          Bytes(initial.data() + span.offset, span.num_elements));
  }

  const std::vector<float> gradient = Iota(10);
  REQUIRE(cluster.client->Push("w", gradient).ok());
  for (int shard = 0; shard < 3; ++shard) {
    std::vector<uint32_t> want;
    for (const ChunkSpan& span : expected) {
      if (span.shard == shard) want.push_back(span.chunk);
    }
    const auto calls = cluster.shards[shard]->calls();
    INFO("shard " << shard);
    REQUIRE(calls.size() == (want.empty() ? 0u : 1u));
    if (want.empty()) continue;
    std::vector<uint32_t> got;
    for (size_t i = 0; i < calls[0].chunks.size(); ++i) {
      const proto::TensorChunk& header = calls[0].chunks[i];
      const ChunkSpan& span = expected[header.chunk()];
      got.push_back(header.chunk());
      CHECK(header.key() == "w");
      CHECK(header.num_elements() == span.num_elements);
      CHECK(header.num_elements() * sizeof(float) <= options.chunk_bytes);
      CHECK(calls[0].payloads[i] == Bytes(gradient.data() + span.offset, span.num_elements));
    }
    CHECK(got == want);
  }

  // A pull puts each reply chunk at its offset (the fake answers element i
  // of chunk c with c * 1000 + i).
  std::vector<float> out(10, -1.0f);
  REQUIRE(cluster.client->Pull("w", absl::MakeSpan(out)).ok());
  for (const ChunkSpan& span : expected) {
    for (size_t i = 0; i < span.num_elements; ++i) {
      CHECK(out[span.offset + i] == static_cast<float>(span.chunk * 1000 + i));
    }
  }
}

// The comm scheduler's calls: one piece of a tensor, at an explicit clock.
TEST_CASE("a scoped push sends only its chunks, at the scope's clock") {
  ClientOptions options = TestOptions(3);
  options.chunk_bytes = 4 * sizeof(float);  // 10 elements: chunks 0..2 (4, 4, 2)
  FakeCluster cluster = MakeFakeCluster(options);
  REQUIRE(cluster.client->chunk_bytes() == 4 * sizeof(float));
  REQUIRE(cluster.client->RegisterTensor("w", {10}, Iota(10)).ok());
  const std::vector<float> gradient = Iota(10, 100.0f);
  CallScope scope;
  scope.clock = 7;
  scope.first_chunk = 1;
  scope.num_chunks = 2;
  REQUIRE(cluster.client->Wait(cluster.client->PushAsync("w", gradient, scope)).ok());
  HashPartitioner partitioner(3);
  std::map<uint32_t, std::string> sent;
  for (int shard = 0; shard < 3; ++shard) {
    for (const FakeShardTransport::Call& call : cluster.shards[shard]->calls()) {
      REQUIRE(call.kind == FakeShardTransport::CallKind::kPush);
      for (size_t i = 0; i < call.chunks.size(); ++i) {
        CHECK(call.chunks[i].clock() == 7);
        CHECK(partitioner.ShardFor("w", call.chunks[i].chunk()) == shard);
        sent[call.chunks[i].chunk()] = call.payloads[i];
      }
    }
  }
  REQUIRE(sent.size() == 2);
  CHECK(sent.at(1) == Bytes(gradient.data() + 4, 4));
  CHECK(sent.at(2) == Bytes(gradient.data() + 8, 2));
  CHECK(cluster.client->clock() == 0);  // the client's own clock did not move

  // num_chunks 0: every chunk from first_chunk; clock -1: the current one.
  const int before = cluster.shards[0]->num_calls() + cluster.shards[1]->num_calls() +
                     cluster.shards[2]->num_calls();
  cluster.client->Clock();
  CallScope rest;
  rest.first_chunk = 2;
  REQUIRE(cluster.client->Wait(cluster.client->PushAsync("w", gradient, rest)).ok());
  int after = 0;
  for (FakeShardTransport* shard : cluster.shards) {
    const auto calls = shard->calls();
    after += static_cast<int>(calls.size());
    for (size_t c = 0; c < calls.size(); ++c) {
      for (const auto& chunk : calls[c].chunks) {
        if (chunk.clock() == 1) CHECK(chunk.chunk() == 2);
      }
    }
  }
  CHECK(after == before + 1);
}

TEST_CASE("a scoped pull writes only its chunks' elements, at the scope's clock") {
  ClientOptions options = TestOptions(2);
  options.chunk_bytes = 4 * sizeof(float);
  FakeCluster cluster = MakeFakeCluster(options);
  REQUIRE(cluster.client->RegisterTensor("w", {10}, Iota(10)).ok());
  std::vector<float> out(10, -1.0f);
  CallScope scope;
  scope.clock = 3;
  scope.first_chunk = 1;
  scope.num_chunks = 1;
  REQUIRE(cluster.client->Wait(cluster.client->PullAsync("w", absl::MakeSpan(out), scope)).ok());
  for (size_t i = 0; i < 10; ++i) {
    INFO("element " << i);
    // The fake answers element i of chunk c with c * 1000 + i.
    CHECK(out[i] == (i >= 4 && i < 8 ? 1000.0f + (i - 4) : -1.0f));
  }
  int pulls = 0;
  for (FakeShardTransport* shard : cluster.shards) {
    for (const FakeShardTransport::Call& call : shard->calls()) {
      ++pulls;
      CHECK(call.pull.clock() == 3);
      REQUIRE(call.pull.chunks_size() == 1);
      CHECK(call.pull.chunks(0).chunk() == 1);
    }
  }
  CHECK(pulls == 1);
}

TEST_CASE("a scope outside the tensor's chunks is INVALID_ARGUMENT and sends nothing") {
  ClientOptions options = TestOptions(2);
  options.chunk_bytes = 4 * sizeof(float);
  FakeCluster cluster = MakeFakeCluster(options);
  REQUIRE(cluster.client->RegisterTensor("w", {10}, Iota(10)).ok());
  std::vector<float> buffer(10, 0.0f);
  std::vector<CallScope> bad(3);
  bad[0].first_chunk = 3;                       // only 0..2
  bad[1].first_chunk = 2, bad[1].num_chunks = 2;  // 2..3
  bad[2].clock = -2;
  for (const CallScope& scope : bad) {
    absl::Status push = cluster.client->Wait(cluster.client->PushAsync("w", buffer, scope));
    CHECK(absl::IsInvalidArgument(push));
    CHECK(push.message().find("'w'") != std::string::npos);
    absl::Status pull =
        cluster.client->Wait(cluster.client->PullAsync("w", absl::MakeSpan(buffer), scope));
    CHECK(absl::IsInvalidArgument(pull));
  }
  for (FakeShardTransport* shard : cluster.shards) CHECK(shard->num_calls() == 0);
}

TEST_CASE("small tensors spread over shards by name") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(4));
  HashPartitioner partitioner(4);
  const std::vector<std::string> names = {"a", "b", "layer1.weight", "layer1.bias", "fc", "out"};
  for (const std::string& name : names) {
    REQUIRE(cluster.client->RegisterTensor(name, {3}).ok());
    REQUIRE(cluster.client->Push(name, Iota(3)).ok());
  }
  for (int shard = 0; shard < 4; ++shard) {
    std::vector<std::string> got, want;
    for (const auto& call : cluster.shards[shard]->calls()) got.push_back(call.chunks[0].key());
    for (const std::string& name : names) {
      if (partitioner.ShardFor(name, 0) == shard) want.push_back(name);
    }
    CHECK(got == want);
  }
}

TEST_CASE("UNAVAILABLE is retried with a growing backoff until the shard answers") {
  ClientOptions options = TestOptions(1);
  options.retry_timeout = absl::Seconds(10);
  FakeCluster cluster = MakeClusterWithW(options);
  cluster.shards[0]->FailNext(3);
  REQUIRE(cluster.client->Push("w", Iota(4)).ok());
  const auto calls = cluster.shards[0]->calls();
  REQUIRE(calls.size() == 4);
  const absl::Duration first = calls[1].started - calls[0].started;
  const absl::Duration second = calls[2].started - calls[1].started;
  const absl::Duration third = calls[3].started - calls[2].started;
  INFO(absl::FormatDuration(first)
       << " " << absl::FormatDuration(second) << " " << absl::FormatDuration(third));
  CHECK(first >= absl::Milliseconds(45));
  CHECK(second >= absl::Milliseconds(95));
  CHECK(third >= absl::Milliseconds(195));
}

TEST_CASE("retries stop at retry_timeout and the error names the shard") {
  ClientOptions options = TestOptions(1);
  options.retry_timeout = absl::Milliseconds(300);
  FakeCluster cluster = MakeClusterWithW(options);
  cluster.shards[0]->FailNext(1000);
  const absl::Time start = absl::Now();
  const absl::Status status = cluster.client->Push("w", Iota(4));
  CHECK(absl::Now() - start < absl::Seconds(2));
  CHECK(absl::IsUnavailable(status));
  CHECK(status.message().find("shard 0 (fake:0)") != absl::string_view::npos);
  // 50 ms then 100 ms of backoff fit in 300 ms; the next 200 ms do not. (A
  // busy machine that oversleeps the first two by 150 ms leaves 2 calls.)
  CHECK(cluster.shards[0]->num_calls() >= 2);
  CHECK(cluster.shards[0]->num_calls() <= 3);
}

TEST_CASE("errors other than UNAVAILABLE are not retried") {
  FakeCluster cluster = MakeClusterWithW(TestOptions(1));
  cluster.shards[0]->FailNext(1, absl::InvalidArgumentError("refused"));
  CHECK(absl::IsInvalidArgument(cluster.client->Push("w", Iota(4))));
  CHECK(cluster.shards[0]->num_calls() == 1);
}

TEST_CASE("Wait's deadline cancels the call in flight through its canceller") {
  FakeCluster cluster = MakeFakeCluster(TestOptions(1));  // rpc_timeout 30 s
  REQUIRE(cluster.client->RegisterTensor("w", {4}).ok());
  cluster.shards[0]->Block();
  std::vector<float> out(4, -1.0f);
  Client::Handle handle = cluster.client->PullAsync("w", absl::MakeSpan(out));
  REQUIRE(cluster.shards[0]->AwaitHeld(1, absl::Seconds(5)));
  const absl::Time start = absl::Now();
  const absl::Status status = cluster.client->Wait(handle, absl::Now() + absl::Milliseconds(100));
  CHECK(absl::IsDeadlineExceeded(status));
  CHECK(status.message().find("pull of 'w'") != absl::string_view::npos);
  // Promptly: the fake call ended on its cancel, not at its 30 s deadline.
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(cluster.shards[0]->cancelled_calls() == 1);
  CHECK(cluster.shards[0]->held_calls() == 0);
  CHECK(out == std::vector<float>(4, -1.0f));
  cluster.shards[0]->Release();
}

TEST_CASE("every call carries the rpc_timeout deadline; an expired one names its shard") {
  ClientOptions options = TestOptions(2);
  options.rpc_timeout = absl::Milliseconds(300);
  FakeCluster cluster = MakeClusterWithW(options);
  const int shard = HashPartitioner(2).ShardFor("w", 0);
  cluster.shards[shard]->Block();
  std::vector<float> out(4);
  const absl::Status status = cluster.client->Pull("w", absl::MakeSpan(out));
  CHECK(absl::IsDeadlineExceeded(status));
  CHECK(status.message().find(absl::StrCat("shard ", shard, " (fake:", shard, ")")) !=
        absl::string_view::npos);
  const auto calls = cluster.shards[shard]->calls();
  REQUIRE(calls.size() == 1);  // DEADLINE_EXCEEDED is not retried
  // The whole rpc_timeout, less what passed between setting the deadline and
  // the call's start (a busy machine may take tens of milliseconds there).
  const absl::Duration budget = calls[0].deadline - calls[0].started;
  CHECK(budget <= absl::Milliseconds(300));
  CHECK(budget >= absl::Milliseconds(150));
  cluster.shards[shard]->Release();
}

TEST_CASE("Wait after a cancel is bounded even if the transport ignores the cancel") {
  ClientOptions options = TestOptions(1);
  options.rpc_timeout = absl::Milliseconds(300);  // also the grace after a cancel
  FakeCluster cluster = MakeClusterWithW(options);
  cluster.shards[0]->set_honour_cancel(false);
  cluster.shards[0]->Block();
  const std::vector<float> gradient = Iota(4);
  Client::Handle handle = cluster.client->PushAsync("w", gradient);
  REQUIRE(cluster.shards[0]->AwaitHeld(1, absl::Seconds(5)));
  const absl::Time start = absl::Now();
  const absl::Status status = cluster.client->Wait(handle, absl::Now() + absl::Milliseconds(50));
  CHECK(absl::Now() - start < absl::Seconds(3));
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK(status.message().find("push of 'w'") != absl::string_view::npos);
  CHECK(status.message().find("still running") != absl::string_view::npos);
  cluster.shards[0]->Release();
}

TEST_CASE("a handle nobody waits on frees its operation") {
  FakeCluster cluster = MakeClusterWithW(TestOptions(1));
  const std::vector<float> gradient = Iota(4);
  cluster.shards[0]->Block();
  { cluster.client->PushAsync("w", gradient); }  // handle dropped at once
  REQUIRE(cluster.shards[0]->AwaitHeld(1, absl::Seconds(5)));
  CHECK(cluster.client->live_operations_for_testing() == 1);  // its task holds it
  cluster.shards[0]->Release();
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (cluster.client->live_operations_for_testing() != 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  CHECK(cluster.client->live_operations_for_testing() == 0);
  CHECK(cluster.shards[0]->num_calls() == 1);
}

TEST_CASE("Wait on a default or an already-waited handle is NOT_FOUND") {
  FakeCluster cluster = MakeClusterWithW(TestOptions(1));
  CHECK(absl::IsNotFound(cluster.client->Wait(Client::Handle())));
  const std::vector<float> gradient = Iota(4);
  Client::Handle handle = cluster.client->PushAsync("w", gradient);
  Client::Handle copy = handle;
  CHECK(cluster.client->Wait(handle).ok());
  CHECK(absl::IsNotFound(cluster.client->Wait(handle)));
  CHECK(absl::IsNotFound(cluster.client->Wait(copy)));
  // An operation that failed before it started is waited on like any other.
  Client::Handle bad = cluster.client->PushAsync("nope", gradient);
  CHECK(absl::IsNotFound(cluster.client->Wait(bad)));
  CHECK(cluster.client->Wait(bad).message().find("already waited") != absl::string_view::npos);
}

TEST_CASE("a full pool refuses an operation with RESOURCE_EXHAUSTED") {
  ClientOptions options = TestOptions(1);
  options.max_queued_calls = 1;
  options.max_calls_in_flight = 2 * 1 + 2;
  FakeCluster cluster = MakeClusterWithW(options);
  cluster.shards[0]->Block();
  const std::vector<float> gradient = Iota(4);
  const int threads = 2 * 1 + 2;  // the client's push pool for one shard
  std::vector<Client::Handle> accepted;
  for (int i = 0; i < threads; ++i) {
    // One at a time: the queue holds a single call until a thread takes it.
    accepted.push_back(cluster.client->PushAsync("w", gradient));
    REQUIRE(cluster.shards[0]->AwaitHeld(i + 1, absl::Seconds(5)));
  }
  accepted.push_back(cluster.client->PushAsync("w", gradient));  // queued
  Client::Handle refused = cluster.client->PushAsync("w", gradient);
  const absl::Status status = cluster.client->Wait(refused, absl::Now() + absl::Seconds(1));
  CHECK(absl::IsResourceExhausted(status));
  CHECK(status.message().find("push of 'w'") != absl::string_view::npos);
  CHECK(status.message().find("not started") != absl::string_view::npos);
  cluster.shards[0]->Release();
  for (const Client::Handle& handle : accepted) CHECK(cluster.client->Wait(handle).ok());
  CHECK(cluster.shards[0]->num_calls() == threads + 1);
}

TEST_CASE("threshold with momentum pushes DGC's momentum-corrected payloads") {
  const std::string spec_text = "threshold:sample=1,ratio=0.25,momentum=0.9";
  ClientOptions options = TestOptions(1);
  options.codec = spec_text;
  options.compress_min_bytes = 0;
  FakeCluster cluster = MakeFakeCluster(options);
  constexpr size_t kElements = 64;
  REQUIRE(cluster.client->RegisterTensor("w", {kElements}).ok());
  std::vector<std::vector<float>> gradients;
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g(kElements);
    for (size_t i = 0; i < kElements; ++i) {
      g[i] = static_cast<float>((i * 37 + step * 11) % 23) - 11.0f + 0.1f * step;
    }
    gradients.push_back(g);
    REQUIRE(cluster.client->Push("w", g).ok());
    cluster.client->Clock();
  }
  const auto calls = cluster.shards[0]->calls();
  REQUIRE(calls.size() == gradients.size());

  const CodecSpec spec = *CodecSpec::Parse(spec_text);
  auto dgc_codec = *CreateCodec(spec);
  auto ef_codec = *CreateCodec(spec);
  DgcMomentumCorrection dgc(kElements, 0.9f);
  ErrorFeedback ef(kElements);
  bool differs_from_plain_error_feedback = false;
  for (size_t step = 0; step < gradients.size(); ++step) {
    CodecContext context;
    context.seed = DeriveSeed("w", 0, static_cast<int64_t>(step), 0, spec.seed);
    std::string want, plain;
    REQUIRE(dgc.Compress(*dgc_codec, gradients[step], context, &want).ok());
    REQUIRE(ef.Compress(*ef_codec, gradients[step], context, &plain).ok());
    INFO("step " << step);
    CHECK(calls[step].payloads[0] == want);
    CHECK(calls[step].chunks[0].codec_params() == "threshold:sample=1,ratio=0.25");
    differs_from_plain_error_feedback |= want != plain;
  }
  // Otherwise the check above could not tell momentum correction from EF.
  CHECK(differs_from_plain_error_feedback);
}

}  // namespace
}  // namespace harrier
