#ifndef HARRIER_WORKER_SPARSE_TABLES_H_
#define HARRIER_WORKER_SPARSE_TABLES_H_

// The worker's side of sparse tables (Client::RegisterSparseTable,
// PullRows, PushRows): ids deduplicated before the wire (a repeated id's
// gradients summed), grouped by the shard that holds them (SparseRowShard),
// one call per shard (for all the tables of a call) through the same transports, retries and deadlines as
// dense tensors, and the hot-row cache. Thread-safe.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/harrier.pb.h"
#include "worker/client.h"
#include "worker/operation_engine.h"
#include "worker/row_cache.h"
#include "worker/transport/transport.h"

namespace harrier {

class ControlClient;
class Partitioner;

struct SparseTablesConfig {
  std::string job;
  uint32_t rank = 0;
  proto::Session session;
  absl::Duration rpc_timeout = absl::Seconds(60);
  std::function<std::string(int shard)> shard_name;
};

class SparseTables {
 public:
  SparseTables(SparseTablesConfig config, std::vector<ShardTransport*> transports,
               ControlClient& control, OperationEngine& engine, const Partitioner& partitioner);
  ~SparseTables();

  absl::Status Register(const std::string& name, const SparseTableOptions& options);
  OperationHandle PullRows(const std::string& name, absl::Span<const int64_t> ids,
                           absl::Span<float> out);
  OperationHandle PushRows(const std::string& name, absl::Span<const int64_t> ids,
                           absl::Span<const float> gradients);
  // Several tables at once: one call per shard for all of them (pulls: per
  // clock, when the tables' clocks differ).
  OperationHandle PullRows(absl::Span<const SparseRowsPull> pulls);
  OperationHandle PushRows(absl::Span<const SparseRowsPush> pushes);
  // The clock the table's next push is for; NOT_FOUND if not registered.
  absl::StatusOr<int64_t> Clock(const std::string& name) const;
  absl::StatusOr<SparseTableStats> Stats(const std::string& name) const;
  bool Has(const std::string& name) const;
  // One past the last clock `shard` acknowledged of each table, for that
  // shard's heartbeats (a shard restored from a checkpoint re-bases the
  // rank from it, as for dense chunks).
  void AddAcknowledgedClocks(int shard, proto::HeartbeatRequest* request) const;

 private:
  struct Table;
  std::shared_ptr<Table> Find(const std::string& name) const;
  absl::Time Deadline() const { return absl::Now() + config_.rpc_timeout; }
  void OnShard(Operation& op, int shard, OperationEngine::Attempt attempt,
               OperationEngine::TaskDone done);

  const SparseTablesConfig config_;
  const std::vector<ShardTransport*> transports_;
  ControlClient& control_;
  OperationEngine& engine_;
  const Partitioner& partitioner_;

  mutable absl::Mutex mutex_;
  absl::flat_hash_map<std::string, std::shared_ptr<Table>> tables_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace harrier

#endif  // HARRIER_WORKER_SPARSE_TABLES_H_
