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

// The node table: name, role, address, health, seconds since the last heartbeat, and
// for workers step, epoch, last loss and samples/s.
std::string FormatNodes(const ClusterStatus& status);
// The shard table: id, primary, backups, parameters, applied updates, newest checkpoint.
std::string FormatShards(const ClusterStatus& status);
// The verdict line, the epoch/mode/replication, the workers' progress and lag, the
// result once in, then the node table.
std::string FormatStatus(const ClusterStatus& status);

}  // namespace paramserver

#endif  // PARAMSERVER_PSCTL_STATUS_FORMAT_H_
