#ifndef HARRIER_SERVER_SESSION_H_
#define HARRIER_SERVER_SESSION_H_

// Sessions: who may speak for a rank. ControlService.Register (shard 0)
// hands each worker a session for its rank, an epoch and a credential
//
//   credential = HMAC-SHA256(session key, job | rank | epoch),
//
// and every call that names a rank (push, pull, push-pull, heartbeat, leave,
// barrier) carries it. The session key is derived from the job token
// (--auth_token_file), so every shard verifies credentials on its own,
// without asking shard 0. Without a token the key is derived from the job
// name alone: anyone who knows the job can then mint credentials, so
// sessions guard against mistakes (a wrong rank, a stale process of a
// restarted worker, a worker of another job) but not against a hostile
// client.

#include <chrono>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/harrier.pb.h"

namespace harrier {

// The job the server and the worker use unless told otherwise (--job).
inline constexpr char kDefaultJob[] = "harrier";

// The key credentials of `job` are minted with: from `job_token` when one is
// configured (non-empty), else from the job name alone. 32 bytes.
std::string DeriveSessionKey(absl::string_view job_token, absl::string_view job);

// HMAC-SHA256(key, job | rank | epoch [| job_id]), 32 bytes. The fields are
// framed (the job's length first; job_id only when not 0), so no two (job,
// rank, epoch, job_id) share a message.
std::string MintCredential(absl::string_view key, absl::string_view job, uint32_t rank,
                           uint64_t epoch, uint64_t job_id = 0);

// One shard's view of every rank's session: the highest epoch it has seen
// for the rank, the credential it verified for that epoch (so the hot path
// compares 32 bytes instead of recomputing the HMAC for every chunk), and
// when the rank was last heard from with it. Shard 0's control plane also
// issues sessions through it, so its data path refuses an old epoch the
// moment a worker re-registers. Thread-safe: one lock per rank.
class SessionTable {
 public:
  using Clock = std::chrono::steady_clock;

  SessionTable(std::string job, std::string key, int num_workers);

  const std::string& job() const { return job_; }
  int num_workers() const { return num_workers_; }

  // The run sessions belong to (server/README.md, "Job lifecycle"); 0: none
  // yet. Issue() stamps it into every session; Verify() refuses a session
  // of an earlier run, and one of a later run unless a newer-run handler
  // adopts it.
  uint64_t job_id() const { return job_id_.load(); }
  // Starts run `job_id`: every rank's session is forgotten (epochs keep
  // growing: max_epoch() remembers the highest seen before).
  void StartRun(uint64_t job_id);
  // Shards other than 0 learn each run from the first verified call that
  // carries it: `handler` is called (outside every lock here) with a newer
  // job id than job_id(), after the credential verified, and either
  // StartRuns it (OK) or says why the shard keeps its run (the call is
  // refused with that status). Unset (shard 0, which issues the runs): a
  // newer job id is refused. Set before serving.
  void SetNewerRunHandler(std::function<absl::Status(uint64_t job_id)> handler) {
    newer_run_handler_ = std::move(handler);
  }

  // OK when `job` is this shard's job, else FAILED_PRECONDITION naming both.
  // `what` names the call in the message ("push 'w' chunk 0").
  absl::Status CheckJob(absl::string_view job, absl::string_view what) const;

  // OK when `session` speaks for `rank` of `job` (CheckJob first), and then
  // the rank counts as heard from now. Else, naming `what` and the rank:
  // INVALID_ARGUMENT for a rank out of range; FAILED_PRECONDITION for a
  // session of another run (an earlier one, or, without a newer-run
  // handler, a later one); PERMISSION_DENIED for no
  // credential ("register first"), an epoch below the highest seen ("was
  // replaced by epoch N (the worker re-registered)") or a credential that
  // does not verify ("bad session credential"). A refused call records
  // nothing.
  absl::Status Verify(absl::string_view job, uint32_t rank, const proto::Session& session,
                      absl::string_view what);

  // Verify, for a call that ends the rank's part in the job (Leave, a
  // release): a session above the rank's current one is refused with
  // PERMISSION_DENIED while the current one is live (heard from, or issued,
  // within `live_window`, and not released). Only the holder of a live
  // session may end it; a newer epoch alone does not say the worker
  // re-registered (without a job token anyone can mint one).
  absl::Status VerifyHolder(absl::string_view job, uint32_t rank, const proto::Session& session,
                            absl::string_view what, std::chrono::milliseconds live_window);

  // A new session for `rank` at `epoch` (which must be above the rank's
  // current one): from now on lower epochs are refused here. The rank is
  // not heard from until a call carries the new session.
  proto::Session Issue(uint32_t rank, uint64_t epoch);

  // The worker gave session `epoch` of `rank` back (it exits): the rank is
  // free for a new session. False if `epoch` is not the rank's current one.
  bool Release(uint32_t rank, uint64_t epoch);

  // A restarted shard takes back what its checkpoint kept of `rank`'s
  // session: `epoch` is the rank's current one again (lower ones are
  // refused as before the restart), released or not as it was. The
  // restore counts as the moment the session was last heard from (`heard`:
  // a call had carried it) or handed out (not yet), so a worker that lost
  // its session rejoins by the same rules as without a restart, the time
  // counted from the restore. Call before serving; out-of-range ranks and
  // epoch 0 are ignored.
  void Restore(uint32_t rank, uint64_t epoch, bool released, bool heard);
  // The highest epoch seen before the last StartRun (max_epoch() counts
  // it); RaiseEpochFloor restores a checkpoint's.
  uint64_t epoch_floor() const { return epoch_floor_.load(); }
  void RaiseEpochFloor(uint64_t floor);

  struct RankState {
    uint64_t epoch = 0;          // 0: no session known
    bool issued = false;         // issued here (else learned from a call, or none)
    Clock::time_point issued_at;
    bool heard = false;          // a call carried this epoch
    Clock::time_point last_heard;
    bool released = false;       // given back by its worker (Release)
  };
  RankState state(uint32_t rank) const;

  // The highest epoch issued or verified for any rank (0: none).
  uint64_t max_epoch() const;

 private:
  struct Rank {
    mutable absl::Mutex mutex;
    RankState state ABSL_GUARDED_BY(mutex);
    std::string credential ABSL_GUARDED_BY(mutex);  // verified (or issued) for state.epoch
  };

  // Verify; with `live_window`, VerifyHolder.
  absl::Status VerifyImpl(absl::string_view job, uint32_t rank, const proto::Session& session,
                          absl::string_view what,
                          const std::chrono::milliseconds* live_window);

  // Whether `credential` is the credential of (rank, epoch, job_id).
  bool CredentialValid(uint32_t rank, const proto::Session& session) const;

  const std::string job_;
  const std::string key_;
  const int num_workers_;
  const std::unique_ptr<Rank[]> ranks_;
  std::atomic<uint64_t> job_id_{0};
  std::atomic<uint64_t> epoch_floor_{0};  // the highest epoch before the last StartRun
  std::function<absl::Status(uint64_t)> newer_run_handler_;
};

}  // namespace harrier

#endif  // HARRIER_SERVER_SESSION_H_
