#ifndef HARRIER_TESTS_WORKER_FAKE_CLUSTER_H_
#define HARRIER_TESTS_WORKER_FAKE_CLUSTER_H_

// A Client over FakeControlClient and one FakeShardTransport per shard: the
// client's tests and the comm scheduler's run it without any process.

#include <catch2/catch.hpp>

#include <memory>
#include <utility>
#include <vector>

#include "worker/client.h"
#include "worker/fake_control_client.h"
#include "worker/transport/fake/fake_transport.h"
#include "worker/transport/timer_thread.h"
#include "worker/transport/transport.h"

namespace harrier {

struct FakeCluster {
  FakeControlClient* control = nullptr;  // owned by the client
  std::vector<FakeShardTransport*> shards;  // owned by the client
  std::unique_ptr<Client> client;
};

// One fake shard per options.servers entry; the control plane says
// `num_workers` workers.
inline FakeCluster MakeFakeCluster(const ClientOptions& options, int num_workers = 1) {
  FakeCluster cluster;
  const int num_shards = static_cast<int>(options.servers.size());
  auto control = std::make_unique<FakeControlClient>(num_shards, num_workers);
  cluster.control = control.get();
  std::vector<std::unique_ptr<ShardTransport>> transports;
  // One timer for every shard, as a client's real transports share theirs.
  auto timer = std::make_shared<TimerThread>("fake-shards");
  for (int i = 0; i < num_shards; ++i) {
    auto shard = std::make_unique<FakeShardTransport>(TransportTraits{}, timer);
    cluster.shards.push_back(shard.get());
    transports.push_back(std::move(shard));
  }
  auto client = Client::Create(options, std::move(control), std::move(transports));
  REQUIRE(client.ok());
  cluster.client = std::move(*client);
  return cluster;
}

}  // namespace harrier

#endif  // HARRIER_TESTS_WORKER_FAKE_CLUSTER_H_
