// psctl's human output: the cluster status, its nodes and its shards as aligned tables.
#ifndef PARAMSERVER_PSCTL_STATUS_FORMAT_H_
#define PARAMSERVER_PSCTL_STATUS_FORMAT_H_

#include <string>
#include <vector>

#include "proto/admin.pb.h"

namespace paramserver {

// Rows of cells as text, each column as wide as its widest cell, two spaces apart;
// the first row is the header. Trailing spaces are trimmed.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);

// "alive", "suspect", "dead", "finished", "drained".
std::string HealthName(NodeHealth health);

// "45 s", "2 min 05 s", "3 h 07 min".
std::string FormatDuration(double seconds);

// The job's progress against its goal: "step 798 of 3750 (21%), ETA 2 min 10 s" (the
// slowest live worker's step), "..., done in 5 min 03 s" once the result is in; empty
// before any worker has said how many steps it runs.
std::string FormatProgress(const ClusterStatus& status);

// The node table: name, role, address, health, seconds since the last heartbeat, and
// for workers step, epoch, last loss and samples/s.
std::string FormatNodes(const ClusterStatus& status);
// The shard table: id, primary, backups, parameters, applied updates, newest checkpoint.
std::string FormatShards(const ClusterStatus& status);
// data.sharding: dynamic: the lease table's progress, then each piece not yet trained
// (at most 12): leased to which worker from which step, settling, or waiting.
std::string FormatLeases(const DataLeaseTableState& leases);
// The verdict line, the map version/mode/replication, the progress against the total
// with its ETA, the workers' lag, the result once in, the lease table (dynamic data),
// then the node table.
std::string FormatStatus(const ClusterStatus& status);

}  // namespace paramserver

#endif  // PARAMSERVER_PSCTL_STATUS_FORMAT_H_
