// The ShardListener interface, one body over every listener the factory
// makes: start, where it listens, hello secrets, stop. What the listeners
// carry is tested over the wire in //tests/transport.

#include "server/shard_listener.h"

#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/shard_listener_factory.h"
#include "server/shard_service.h"
#include "tests/server/store_fixtures.h"

namespace harrier {
namespace {

using testing::MakeStore;

TEST_CASE("every listener starts, says where it listens, and stops") {
  for (const std::string name : {"grpc", "ucx", "tcp"}) {
    INFO(name);
    auto store = MakeStore("bsp", 1);
    ShardService service(store.get(), {});
    ShardListenerOptions options;
    options.host = "127.0.0.1";
    options.store = store.get();
    auto listener = CreateShardListener(name, options);
    REQUIRE(listener.ok());
    ShardListener& l = **listener;
    CHECK(l.name() == name);
    REQUIRE(l.Start(&service).ok());
    CHECK_FALSE(l.address().empty());
    if (name == "grpc" || name == "tcp") {
      CHECK(l.port() > 0);
      CHECK(l.address() == absl::StrCat("127.0.0.1:", l.port()));
    } else {
      CHECK(l.port() == -1);
    }
    // No secret asked for: none handed out.
    CHECK(l.IssueHelloSecret().empty());
    l.SetServing(true);
    l.SetServing(false);
    l.Stop(absl::Now() + absl::Seconds(1));
    service.Shutdown();
    l.Close();
    l.Close();  // idempotent
  }
}

TEST_CASE("a UCX or tcp listener that requires hello secrets issues a fresh one each time") {
  const std::string name = GENERATE("ucx", "tcp");
  INFO(name);
  auto store = MakeStore("bsp", 1);
  ShardService service(store.get(), {});
  ShardListenerOptions options;
  options.host = "127.0.0.1";
  options.require_hello_secret = true;
  auto listener = CreateShardListener(name, options);
  REQUIRE(listener.ok());
  REQUIRE((*listener)->Start(&service).ok());
  const std::string first = (*listener)->IssueHelloSecret();
  const std::string second = (*listener)->IssueHelloSecret();
  CHECK_FALSE(first.empty());
  CHECK(first != second);
  service.Shutdown();
  (*listener)->Close();
}

TEST_CASE("a gRPC listener on a port in use says so") {
  auto store = MakeStore("bsp", 1);
  ShardService service(store.get(), {});
  ShardListenerOptions options;
  options.host = "127.0.0.1";
  options.store = store.get();
  auto first = CreateShardListener("grpc", options);
  REQUIRE(first.ok());
  REQUIRE((*first)->Start(&service).ok());
  options.port = (*first)->port();
  auto second = CreateShardListener("grpc", options);
  REQUIRE(second.ok());
  const absl::Status status = (*second)->Start(&service);
  CHECK(absl::IsUnavailable(status));
  CHECK(status.message() == absl::StrCat("cannot listen on 127.0.0.1:", options.port,
                                         " (--port): in use, or not an address of this host"));
  (*first)->Stop(absl::Now());
  service.Shutdown();
}

TEST_CASE("the factory knows grpc, tcp and ucx only") {
  CHECK(CheckShardListenerName("grpc").ok());
  CHECK(CheckShardListenerName("ucx").ok());
  CHECK(CheckShardListenerName("tcp").ok());
  CHECK(absl::IsInvalidArgument(CheckShardListenerName("quic")));
  auto listener = CreateShardListener("quic", {});
  CHECK(absl::IsInvalidArgument(listener.status()));
}

TEST_CASE("the lookup tells an unknown name from a listener the shard runs without") {
  std::vector<std::unique_ptr<ShardListener>> listeners;
  auto grpc = CreateShardListener("grpc", {});
  REQUIRE(grpc.ok());
  listeners.push_back(std::move(*grpc));
  const ShardListenerLookup lookup = MakeShardListenerLookup(&listeners);

  auto found = lookup("grpc");
  REQUIRE(found.ok());
  CHECK(*found == listeners[0].get());
  auto missing = lookup("ucx");
  CHECK(absl::IsFailedPrecondition(missing.status()));
  CHECK(missing.status().message() == "shard was started without --ucx");
  auto missing_tcp = lookup("tcp");
  CHECK(missing_tcp.status().message() == "shard was started without --tcp");
  auto unknown = lookup("quic");
  CHECK(absl::IsInvalidArgument(unknown.status()));
  CHECK(unknown.status().message() == "unknown transport 'quic'");
}

}  // namespace
}  // namespace harrier
