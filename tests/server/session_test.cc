// Session credentials and the per-rank table every shard verifies against,
// without processes.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "server/session.h"

namespace harrier {
namespace {

proto::Session Minted(const std::string& key, const std::string& job, uint32_t rank,
                      uint64_t epoch) {
  proto::Session session;
  session.set_epoch(epoch);
  session.set_credential(MintCredential(key, job, rank, epoch));
  return session;
}

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST_CASE("session: the key depends on the job token and the job; credentials on rank and epoch") {
  const std::string none = DeriveSessionKey("", "job");
  REQUIRE(none.size() == 32);
  REQUIRE(none == DeriveSessionKey("", "job"));
  REQUIRE(none != DeriveSessionKey("", "other"));
  REQUIRE(none != DeriveSessionKey("token", "job"));
  REQUIRE(DeriveSessionKey("token", "job") != DeriveSessionKey("token2", "job"));
  const std::string credential = MintCredential(none, "job", 3, 7);
  REQUIRE(credential.size() == 32);
  REQUIRE(credential != MintCredential(none, "job", 4, 7));
  REQUIRE(credential != MintCredential(none, "job", 3, 8));
  REQUIRE(credential != MintCredential(none, "jo", 3, 7));
  // The fields are framed: "job"+"1|2" cannot pass for "job1"+"2".
  REQUIRE(MintCredential(none, "a1", 2, 3) != MintCredential(none, "a", 12, 3));
}

TEST_CASE("session: a table accepts its own credentials and refuses others, naming the rank") {
  const std::string key = DeriveSessionKey("token", "job");
  SessionTable table("job", key, 4);
  REQUIRE(table.Verify("job", 3, Minted(key, "job", 3, 5), "push").ok());
  REQUIRE(table.state(3).epoch == 5);
  REQUIRE(table.state(3).heard);
  // Again (the cached path), and once more for another rank.
  REQUIRE(table.Verify("job", 3, Minted(key, "job", 3, 5), "push").ok());
  REQUIRE(table.Verify("job", 1, Minted(key, "job", 1, 2), "push").ok());

  const absl::Status none = table.Verify("job", 2, proto::Session(), "push");
  REQUIRE(absl::IsPermissionDenied(none));
  REQUIRE(Contains(none, "rank 2: no session credential (register first)"));

  // Rank 3's credential presented for rank 2; one minted with another key;
  // a right credential with its epoch changed; a truncated one.
  for (const proto::Session& bad :
       {Minted(key, "job", 3, 5), Minted(DeriveSessionKey("", "job"), "job", 2, 5),
        [&] {
          proto::Session s = Minted(key, "job", 2, 5);
          s.set_epoch(6);
          return s;
        }(),
        [&] {
          proto::Session s = Minted(key, "job", 2, 5);
          s.mutable_credential()->pop_back();
          return s;
        }()}) {
    const absl::Status status = table.Verify("job", 2, bad, "push");
    INFO(status.ToString());
    REQUIRE(absl::IsPermissionDenied(status));
    REQUIRE(Contains(status, "rank 2: bad session credential"));
  }
  // Nothing refused was recorded.
  REQUIRE(table.state(2).epoch == 0);
  REQUIRE_FALSE(table.state(2).heard);

  // The same bytes as rank 3's cached credential, under another epoch.
  proto::Session replayed = Minted(key, "job", 3, 5);
  replayed.set_epoch(9);
  REQUIRE(absl::IsPermissionDenied(table.Verify("job", 3, replayed, "push")));
  REQUIRE(table.state(3).epoch == 5);

  const absl::Status range = table.Verify("job", 4, Minted(key, "job", 4, 1), "push");
  REQUIRE(absl::IsInvalidArgument(range));
  REQUIRE(Contains(range, "rank 4 out of range [0, 4)"));
}

TEST_CASE("session: a newer epoch replaces the older one, which is refused from then on") {
  const std::string key = DeriveSessionKey("", "job");
  SessionTable table("job", key, 2);
  REQUIRE(table.Verify("job", 0, Minted(key, "job", 0, 5), "push").ok());
  REQUIRE(table.Verify("job", 0, Minted(key, "job", 0, 6), "push").ok());
  const absl::Status old = table.Verify("job", 0, Minted(key, "job", 0, 5), "heartbeat");
  INFO(old.ToString());
  REQUIRE(absl::IsPermissionDenied(old));
  REQUIRE(Contains(old, "rank 0: session epoch 5 was replaced by epoch 6 (the worker re-registered)"));

  // Issued by the control plane: older epochs are refused at once, and the
  // rank counts as heard only once a call carries the new session.
  const proto::Session issued = table.Issue(0, 10);
  REQUIRE(issued.epoch() == 10);
  REQUIRE(issued.credential() == MintCredential(key, "job", 0, 10));
  REQUIRE_FALSE(table.state(0).heard);
  REQUIRE(table.state(0).issued);
  REQUIRE(absl::IsPermissionDenied(table.Verify("job", 0, Minted(key, "job", 0, 6), "push")));
  REQUIRE(table.Verify("job", 0, issued, "push").ok());
  REQUIRE(table.state(0).heard);
  REQUIRE(table.max_epoch() == 10);

  REQUIRE_FALSE(table.Release(0, 9));
  REQUIRE(table.Release(0, 10));
  REQUIRE(table.state(0).released);
}

TEST_CASE("session: a Leave with a newer epoch ends a live session only when it has gone silent") {
  using namespace std::chrono_literals;
  const std::string key = DeriveSessionKey("", "job");
  SessionTable table("job", key, 2);
  REQUIRE(table.Verify("job", 0, Minted(key, "job", 0, 5), "push").ok());
  const absl::Status refused = table.VerifyHolder("job", 0, Minted(key, "job", 0, 6), "leave", 1h);
  REQUIRE(absl::IsPermissionDenied(refused));
  REQUIRE(Contains(refused, "leave: rank 0: session epoch 6 would replace the rank's live "
                            "session (epoch 5)"));
  REQUIRE(table.state(0).epoch == 5);  // nothing changed
  // The holder may; so may a newer session once the live one is silent
  // past the window, or given back, or for a rank no session holds.
  REQUIRE(table.VerifyHolder("job", 0, Minted(key, "job", 0, 5), "leave", 1h).ok());
  std::this_thread::sleep_for(5ms);
  REQUIRE(table.VerifyHolder("job", 0, Minted(key, "job", 0, 6), "leave", 1ms).ok());
  REQUIRE(table.state(0).epoch == 6);
  REQUIRE(table.Release(0, 6));
  REQUIRE(table.VerifyHolder("job", 0, Minted(key, "job", 0, 7), "release", 1h).ok());
  REQUIRE(table.VerifyHolder("job", 1, Minted(key, "job", 1, 3), "leave", 1h).ok());
  // Any other call with a newer epoch still replaces the session (a
  // re-registered worker's first call).
  REQUIRE(table.Verify("job", 1, Minted(key, "job", 1, 4), "heartbeat").ok());
  REQUIRE(table.state(1).epoch == 4);
}

TEST_CASE("session: a message of another job is refused naming both jobs") {
  const std::string key = DeriveSessionKey("", "job");
  SessionTable table("job", key, 1);
  const absl::Status status = table.Verify("other", 0, Minted(key, "other", 0, 1), "pull");
  INFO(status.ToString());
  REQUIRE(absl::IsFailedPrecondition(status));
  REQUIRE(Contains(status, "'other'"));
  REQUIRE(Contains(status, "'job'"));
  REQUIRE(table.state(0).epoch == 0);
}

TEST_CASE("session: a restored table refuses the epochs its checkpoint had replaced") {
  const std::string key = DeriveSessionKey("", "job");
  SessionTable table("job", key, 3);
  table.RaiseEpochFloor(40);
  table.Restore(0, 50, /*released=*/false, /*heard=*/true);
  table.Restore(1, 60, /*released=*/true, /*heard=*/true);
  table.Restore(2, 70, /*released=*/false, /*heard=*/false);
  table.Restore(7, 80, false, true);  // out of range: ignored
  REQUIRE(table.max_epoch() == 70);
  REQUIRE(table.epoch_floor() == 40);
  table.RaiseEpochFloor(30);  // never lowered
  REQUIRE(table.epoch_floor() == 40);

  const absl::Status stale = table.Verify("job", 0, Minted(key, "job", 0, 49), "push");
  REQUIRE(absl::IsPermissionDenied(stale));
  REQUIRE(Contains(stale, "rank 0: session epoch 49 was replaced by epoch 50"));
  // The restored epoch's credential is checked, then cached.
  REQUIRE(absl::IsPermissionDenied(
      table.Verify("job", 0, Minted(DeriveSessionKey("t", "job"), "job", 0, 50), "push")));
  REQUIRE(table.Verify("job", 0, Minted(key, "job", 0, 50), "push").ok());
  REQUIRE(table.Verify("job", 0, Minted(key, "job", 0, 50), "push").ok());

  const SessionTable::RankState released = table.state(1);
  REQUIRE(released.epoch == 60);
  REQUIRE(released.released);
  REQUIRE(released.heard);
  const SessionTable::RankState handed_out = table.state(2);
  REQUIRE(handed_out.epoch == 70);
  REQUIRE_FALSE(handed_out.heard);
  REQUIRE(handed_out.issued);
  // A live restored session is ended by its holder only.
  const absl::Status takeover = table.VerifyHolder("job", 0, Minted(key, "job", 0, 51), "leave",
                                                   std::chrono::milliseconds(60000));
  REQUIRE(absl::IsPermissionDenied(takeover));
  REQUIRE(Contains(takeover, "only the worker holding that session may end it"));
}

}  // namespace
}  // namespace harrier
