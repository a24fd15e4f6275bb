// The table kinds a shard knows: one line per kind.

#include "absl/container/flat_hash_map.h"
#include "server/dense_table.h"
#include "server/sparse_table.h"
#include "server/table.h"

namespace harrier {

const TableFactory* FindTableKind(proto::TableKind kind) {
  static const auto* const kinds = new absl::flat_hash_map<int, TableFactory>{
      {proto::TABLE_DENSE, MakeDenseTable},
      {proto::TABLE_AVERAGE, MakeAverageTable},
      {proto::TABLE_SPARSE, MakeSparseTable},
  };
  auto it = kinds->find(static_cast<int>(kind));
  return it == kinds->end() ? nullptr : &it->second;
}

}  // namespace harrier
