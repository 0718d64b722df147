#include "scheduler/shard_records.h"

#include <algorithm>

namespace paramserver {
namespace {

// Shard `id`'s assignment in `map`, or null. Placement numbers shards 0..n-1 in order
// and every later map keeps that order: a heartbeat's look-up is O(1), not a scan.
const ShardAssignment* FindAssignment(const ShardMap& map, int id) {
  if (id >= 0 && id < map.shards_size() && map.shards(id).shard_id() == id) return &map.shards(id);
  for (const ShardAssignment& assignment : map.shards()) {
    if (assignment.shard_id() == id) return &assignment;
  }
  return nullptr;
}

}  // namespace

void ShardRecords::Record(const std::string& server, const HeartbeatRequest& request,
                          const ShardMap& map, absl::Time now) {
  for (const ShardStatus& status : request.shards()) {
    if (status.backup()) continue;  // the primary reports the shard
    const ShardAssignment* assignment = FindAssignment(map, status.shard_id());
    if (assignment == nullptr || assignment->server_name() != server) continue;
    ShardRecord& record = records_[status.shard_id()];
    record.applied_updates = status.applied_updates();
    record.checkpoint_step = status.checkpoint_step();
    record.skipped_steps = status.skipped_steps();
    record.late_pushes = status.late_pushes();
    record.embedding = status.embedding();
    if (async_tables_ && assignment->kind() == SHARD_KIND_EMBEDDING_ROWS) {
      counting_pushes_.insert(status.shard_id());  // not a step count: first_report_ is steps'
      continue;
    }
    if (!first_report_.has_value()) first_report_ = std::make_pair(now, status.applied_updates());
  }
}

int64_t ShardRecords::RetainFrom(const ShardMap& map) const {
  if (static_cast<int>(records_.size()) != map.shards_size()) return -1;
  int64_t retain_from = -1;
  for (const auto& [id, record] : records_) {
    if (record.checkpoint_step < 0) return -1;
    retain_from =
        retain_from < 0 ? record.checkpoint_step : std::min(retain_from, record.checkpoint_step);
  }
  return retain_from;
}

int64_t ShardRecords::StepAfter(absl::Time now, absl::Duration lead) const {
  int64_t newest = 0;
  for (const auto& [id, record] : records_) {
    if (counting_pushes_.count(id) == 0) newest = std::max(newest, record.applied_updates);
  }
  double rate = 0;  // updates per second
  if (first_report_.has_value() && now - first_report_->first > absl::Milliseconds(100)) {
    rate = (newest - first_report_->second) / absl::ToDoubleSeconds(now - first_report_->first);
  }
  return newest + static_cast<int64_t>(rate * absl::ToDoubleSeconds(lead)) + 10;
}

}  // namespace paramserver
