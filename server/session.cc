#include "server/session.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace harrier {
namespace {

std::string HmacSha256(absl::string_view key, absl::string_view message) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  // HMAC() with these arguments fails only if OpenSSL cannot allocate.
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest,
           &length) == nullptr) {
    return std::string();
  }
  return std::string(reinterpret_cast<const char*>(digest), length);
}

// Without a token the key is a function of public data; this constant only
// keeps it apart from any token-derived key.
constexpr absl::string_view kNoTokenKey = "harrier: no job token";

}  // namespace

std::string DeriveSessionKey(absl::string_view job_token, absl::string_view job) {
  return HmacSha256(job_token.empty() ? kNoTokenKey : job_token,
                    absl::StrCat("harrier session key v1|", job.size(), ":", job));
}

std::string MintCredential(absl::string_view key, absl::string_view job, uint32_t rank,
                           uint64_t epoch, uint64_t job_id) {
  // Digits end at '|': "epoch|job_id" never reads as another epoch.
  return HmacSha256(key, absl::StrCat("harrier session v1|", job.size(), ":", job, "|", rank, "|",
                                      epoch, job_id == 0 ? "" : absl::StrCat("|", job_id)));
}

void SessionTable::StartRun(uint64_t job_id) {
  epoch_floor_ = std::max(epoch_floor_.load(), max_epoch());
  for (int r = 0; r < num_workers_; ++r) {
    Rank& entry = ranks_[r];
    absl::MutexLock lock(&entry.mutex);
    entry.state = RankState();
    entry.credential.clear();
  }
  job_id_ = job_id;
}

bool SessionTable::CredentialValid(uint32_t rank, const proto::Session& session) const {
  const std::string expected = MintCredential(key_, job_, rank, session.epoch(), session.job_id());
  return !expected.empty() && expected.size() == session.credential().size() &&
         CRYPTO_memcmp(expected.data(), session.credential().data(), expected.size()) == 0;
}

SessionTable::SessionTable(std::string job, std::string key, int num_workers)
    : job_(std::move(job)),
      key_(std::move(key)),
      num_workers_(num_workers),
      ranks_(new Rank[static_cast<size_t>(std::max(num_workers, 0))]) {}

absl::Status SessionTable::CheckJob(absl::string_view job, absl::string_view what) const {
  if (job == job_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, ": message of job '", job,
                                                    "' sent to a shard of job '", job_,
                                                    "' (--job on the server and the worker)"));
}

absl::Status SessionTable::Verify(absl::string_view job, uint32_t rank,
                                  const proto::Session& session, absl::string_view what) {
  return VerifyImpl(job, rank, session, what, nullptr);
}

absl::Status SessionTable::VerifyHolder(absl::string_view job, uint32_t rank,
                                        const proto::Session& session, absl::string_view what,
                                        std::chrono::milliseconds live_window) {
  return VerifyImpl(job, rank, session, what, &live_window);
}

absl::Status SessionTable::VerifyImpl(absl::string_view job, uint32_t rank,
                                      const proto::Session& session, absl::string_view what,
                                      const std::chrono::milliseconds* live_window) {
  if (auto status = CheckJob(job, what); !status.ok()) return status;
  if (rank >= static_cast<uint32_t>(num_workers_)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", rank, " out of range [0, ", num_workers_, ")"));
  }
  if (session.credential().empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": rank ", rank, ": no session credential (register first)"));
  }
  if (const uint64_t current = job_id_; session.job_id() != current) {
    // A forged session learns nothing of the runs.
    if (!CredentialValid(rank, session)) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, ": rank ", rank, ": bad session credential"));
    }
    if (session.job_id() < current) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": rank ", rank, ": session of job id ", session.job_id(),
          ", a run that has ended: the shards now run job id ", current,
          " (start the worker again to join it)"));
    }
    if (!newer_run_handler_) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": rank ", rank, ": session of job id ", session.job_id(),
                       ", which this shard did not start (it runs job id ", current, ")"));
    }
    if (auto status = newer_run_handler_(session.job_id()); !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat(what, ": rank ", rank, ": session of job id ",
                                       session.job_id(), " refused: ", status.message()));
    }
    if (job_id_ != session.job_id()) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": rank ", rank, ": session of job id ", session.job_id(),
          " not adopted: the shard runs job id ", job_id_.load()));
    }
  }
  Rank& entry = ranks_[rank];
  absl::MutexLock lock(&entry.mutex);
  RankState& state = entry.state;
  if (session.epoch() < state.epoch) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, ": rank ", rank, ": session epoch ", session.epoch(), " was replaced by epoch ",
        state.epoch, " (the worker re-registered)"));
  }
  // The hot path: the session this rank's calls carried before. A plain
  // comparison is enough here: `entry.credential` was verified (or issued).
  // Constant time as well: `entry.credential` is a valid credential.
  const bool known = session.epoch() == state.epoch && !entry.credential.empty() &&
                     session.credential().size() == entry.credential.size() &&
                     CRYPTO_memcmp(session.credential().data(), entry.credential.data(),
                                   entry.credential.size()) == 0;
  if (!known) {
    if (!CredentialValid(rank, session)) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, ": rank ", rank, ": bad session credential"));
    }
    if (live_window != nullptr && session.epoch() > state.epoch && state.epoch != 0 &&
        !state.released) {
      const auto now = Clock::now();
      const bool live = (state.heard && now - state.last_heard <= *live_window) ||
                        (!state.heard && state.issued && now - state.issued_at <= *live_window);
      if (live) {
        return absl::PermissionDeniedError(absl::StrCat(
            what, ": rank ", rank, ": session epoch ", session.epoch(),
            " would replace the rank's live session (epoch ", state.epoch,
            "): only the worker holding that session may end it"));
      }
    }
    if (session.epoch() > state.epoch) {
      // A newer session than this shard knew of (the worker re-registered,
      // or this shard restarted): older ones are refused from now on.
      state.epoch = session.epoch();
      state.issued = false;
      state.heard = false;
      state.released = false;
    }
    entry.credential = session.credential();
  }
  state.heard = true;
  state.last_heard = Clock::now();
  return absl::OkStatus();
}

proto::Session SessionTable::Issue(uint32_t rank, uint64_t epoch) {
  proto::Session session;
  session.set_epoch(epoch);
  session.set_job_id(job_id_);
  session.set_credential(MintCredential(key_, job_, rank, epoch, job_id_));
  Rank& entry = ranks_[rank];
  absl::MutexLock lock(&entry.mutex);
  entry.state.epoch = epoch;
  entry.state.issued = true;
  entry.state.issued_at = Clock::now();
  entry.state.heard = false;
  entry.state.released = false;
  entry.credential = session.credential();
  return session;
}

void SessionTable::Restore(uint32_t rank, uint64_t epoch, bool released, bool heard) {
  if (rank >= static_cast<uint32_t>(num_workers_) || epoch == 0) return;
  Rank& entry = ranks_[rank];
  absl::MutexLock lock(&entry.mutex);
  const auto now = Clock::now();
  entry.state = RankState();
  entry.state.epoch = epoch;
  entry.state.released = released;
  // Its credential is verified by the first call that carries it.
  entry.credential.clear();
  if (heard) {
    entry.state.heard = true;
    entry.state.last_heard = now;
  } else {
    entry.state.issued = true;
    entry.state.issued_at = now;
  }
}

void SessionTable::RaiseEpochFloor(uint64_t floor) {
  uint64_t current = epoch_floor_.load();
  while (floor > current && !epoch_floor_.compare_exchange_weak(current, floor)) {
  }
}

bool SessionTable::Release(uint32_t rank, uint64_t epoch) {
  Rank& entry = ranks_[rank];
  absl::MutexLock lock(&entry.mutex);
  if (entry.state.epoch != epoch) return false;
  entry.state.released = true;
  return true;
}

SessionTable::RankState SessionTable::state(uint32_t rank) const {
  const Rank& entry = ranks_[rank];
  absl::MutexLock lock(&entry.mutex);
  return entry.state;
}

uint64_t SessionTable::max_epoch() const {
  uint64_t highest = epoch_floor_;
  for (int r = 0; r < num_workers_; ++r) highest = std::max(highest, state(r).epoch);
  return highest;
}

}  // namespace harrier
