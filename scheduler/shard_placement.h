// Where each shard lives: an even spread of shards over servers, each shard with a
// primary and its backups on distinct servers, and how that changes when a server goes.
#ifndef PARAMSERVER_SCHEDULER_SHARD_PLACEMENT_H_
#define PARAMSERVER_SCHEDULER_SHARD_PLACEMENT_H_

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/model/model_layout.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

struct ServerEndpoint {
  std::string name;
  std::string address;
};

// Cuts the layout's flat dense vector [0, dense_parameters) into `shards` near-equal
// ranges (shard ids 0..shards-1), adds `embedding_shards` embedding shards when the
// layout has tables (ids shards.., shard shards + b holding hash bucket b of every
// table), and deals them all to `servers` round-robin (shard i -> servers[i % S]), so
// shard counts per server differ by at most one.
// REQUIRES: servers non-empty, 1 <= shards <= layout.dense_parameters().
ShardMap PlaceShards(const ModelLayout& layout, int shards, int embedding_shards,
                     const std::vector<ServerEndpoint>& servers, int64_t epoch);

// Gives every shard min(replication, servers) - 1 backups: the servers after its
// primary in `servers`, round-robin, so each server backs up about as many shards as
// any other. REQUIRES: every primary of `map` is in `servers`.
void AssignBackups(ShardMap* map, const std::vector<ServerEndpoint>& servers, int replication);

// Adds backups where a shard has fewer than min(replication, live servers) - 1, on the
// live servers holding the fewest copies (primary or backup) that do not hold it yet,
// those `failing` (RemoveServer's) only where no other can take it. Returns the shards
// that gained one.
std::vector<int> TopUpBackups(ShardMap* map, const std::vector<ServerEndpoint>& live,
                              int replication, const std::set<std::string>& failing = {});

struct ServerRemoval {
  std::vector<int> promoted;  // shards whose backup (see `failing`) became their primary
  // Shards that had no other copy: their primary is now the live server with the
  // fewest primaries; the caller decides where their state comes from.
  std::vector<int> orphaned;
  std::vector<int> new_backups;  // shards given a backup to keep `replication` copies
  std::string summary;           // "shard 1: ps-2 promoted; shard 3: ps-1 -> ps-0; ..."
};

// Takes server `removed` out of `map` (its address lists untouched): drops it as a
// backup, promotes a backup where it was the primary, moves shards with no backup
// to other servers (orphaned), then tops up backups from `live`.
// REQUIRES: `live` is non-empty and does not contain `removed`.
// `copying`: (server, shard) backups known to be still copying the shard from its
// primary: never promoted (they hold nothing yet); a shard whose every backup is
// copying is orphaned.
// `failing`: servers of `live` not heard from lately, likely gone as well (two servers
// killed together are found dead one after the other). A backup on one is promoted
// only where no other backup holds the shard, no orphaned shard moves to one, and
// backups are added on them only where the other live servers cannot make up the
// copies. Promoting a server that is gone would leave the shard's other backups to
// copy it again from that server, holding nothing meanwhile: its loss, found a moment
// later, would then find no copy of the shard.
ServerRemoval RemoveServer(ShardMap* map, const std::string& removed,
                           const std::vector<ServerEndpoint>& live, int replication,
                           const std::set<std::pair<std::string, int>>& copying = {},
                           const std::set<std::string>& failing = {});

// Moves backup roles from the servers holding the most copies to `joined` until it
// holds its fair share of them, of each kind of shard (dense ranges, embedding buckets). Returns
// the shards whose backup moved to `joined`.
std::vector<int> GiveBackupsTo(ShardMap* map, const std::string& joined,
                               const std::vector<ServerEndpoint>& live);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_SHARD_PLACEMENT_H_
