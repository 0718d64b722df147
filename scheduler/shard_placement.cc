#include "scheduler/shard_placement.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/wire/shard_layout.h"

namespace paramserver {

ShardMap PlaceShards(const ModelLayout& layout, int shards, int embedding_shards,
                     const std::vector<ServerEndpoint>& servers, int64_t epoch) {
  ShardMap map;
  map.set_epoch(epoch);
  const std::vector<ParameterRange> ranges = SplitIntoShards(layout.dense_parameters(), shards);
  const int buckets = layout.embedding_tables().empty() ? 0 : embedding_shards;
  for (int i = 0; i < shards + buckets; ++i) {
    const ServerEndpoint& server = servers[i % servers.size()];
    ShardAssignment* assignment = map.add_shards();
    assignment->set_shard_id(i);
    if (i < shards) {
      assignment->set_begin(ranges[i].begin);
      assignment->set_end(ranges[i].end);
    } else {
      assignment->set_kind(SHARD_KIND_EMBEDDING_ROWS);
      assignment->set_embedding_bucket(i - shards);
      assignment->set_embedding_buckets(buckets);
    }
    assignment->set_server_name(server.name);
    assignment->set_server_address(server.address);
  }
  return map;
}

namespace {

bool Holds(const ShardAssignment& assignment, const std::string& server) {
  if (assignment.server_name() == server) return true;
  return std::any_of(assignment.backups().begin(), assignment.backups().end(),
                     [&](const ShardReplica& backup) { return backup.server_name() == server; });
}

// Copies (primary or backup) each live server holds.
// Copies (primary and backup roles) each live server holds: of every shard, or with
// `kind` of that kind only.
std::map<std::string, int> CopiesPerServer(const ShardMap& map,
                                           const std::vector<ServerEndpoint>& live,
                                           std::optional<ShardKind> kind = std::nullopt) {
  std::map<std::string, int> copies;
  for (const ServerEndpoint& server : live) copies[server.name] = 0;
  for (const ShardAssignment& assignment : map.shards()) {
    if (kind.has_value() && assignment.kind() != *kind) continue;
    if (copies.count(assignment.server_name()) > 0) ++copies[assignment.server_name()];
    for (const ShardReplica& backup : assignment.backups()) {
      if (copies.count(backup.server_name()) > 0) ++copies[backup.server_name()];
    }
  }
  return copies;
}

}  // namespace

void AssignBackups(ShardMap* map, const std::vector<ServerEndpoint>& servers, int replication) {
  const int backups = std::min<int>(replication, servers.size()) - 1;
  for (ShardAssignment& assignment : *map->mutable_shards()) {
    assignment.clear_backups();
    const auto primary = std::find_if(servers.begin(), servers.end(), [&](const ServerEndpoint& s) {
      return s.name == assignment.server_name();
    });
    const size_t p = primary - servers.begin();
    for (int k = 1; k <= backups; ++k) {
      const ServerEndpoint& server = servers[(p + k) % servers.size()];
      ShardReplica* backup = assignment.add_backups();
      backup->set_server_name(server.name);
      backup->set_server_address(server.address);
    }
  }
}

std::vector<int> TopUpBackups(ShardMap* map, const std::vector<ServerEndpoint>& live,
                              int replication, const std::set<std::string>& failing) {
  const int wanted = std::min<int>(replication, live.size()) - 1;
  std::map<std::string, int> copies = CopiesPerServer(*map, live);
  // The fewest copies, among the servers heard from lately if any can take it.
  const auto rank = [&](const ServerEndpoint& server) {
    return std::make_pair(failing.count(server.name), copies[server.name]);
  };
  std::vector<int> changed;
  for (ShardAssignment& assignment : *map->mutable_shards()) {
    while (assignment.backups_size() < wanted) {
      const ServerEndpoint* target = nullptr;
      for (const ServerEndpoint& server : live) {
        if (Holds(assignment, server.name)) continue;
        if (target == nullptr || rank(server) < rank(*target)) target = &server;
      }
      if (target == nullptr) break;
      ShardReplica* backup = assignment.add_backups();
      backup->set_server_name(target->name);
      backup->set_server_address(target->address);
      ++copies[target->name];
      changed.push_back(assignment.shard_id());
    }
  }
  return changed;
}

ServerRemoval RemoveServer(ShardMap* map, const std::string& removed,
                           const std::vector<ServerEndpoint>& live, int replication,
                           const std::set<std::pair<std::string, int>>& copying,
                           const std::set<std::string>& failing) {
  ServerRemoval removal;
  std::vector<std::string> notes;
  // The servers that may take orphaned shards: those heard from lately, unless none is.
  std::map<std::string, int> primaries;
  for (const ServerEndpoint& server : live) {
    if (failing.count(server.name) == 0) primaries[server.name] = 0;
  }
  if (primaries.empty()) {
    for (const ServerEndpoint& server : live) primaries[server.name] = 0;
  }
  for (const ShardAssignment& assignment : map->shards()) {
    if (auto it = primaries.find(assignment.server_name()); it != primaries.end()) ++it->second;
  }
  for (ShardAssignment& assignment : *map->mutable_shards()) {
    auto* backups = assignment.mutable_backups();
    backups->erase(
        std::remove_if(backups->begin(), backups->end(),
                       [&](const ShardReplica& backup) { return backup.server_name() == removed; }),
        backups->end());
    if (assignment.server_name() != removed) continue;
    // The first backup that holds the shard (one still copying it holds nothing yet),
    // on a server heard from lately if any is.
    const auto holds = [&](const ShardReplica& backup) {
      return copying.count({backup.server_name(), assignment.shard_id()}) == 0;
    };
    auto holder = std::find_if(backups->begin(), backups->end(), [&](const ShardReplica& backup) {
      return holds(backup) && failing.count(backup.server_name()) == 0;
    });
    std::string passed_over;
    if (holder == backups->end()) {
      holder = std::find_if(backups->begin(), backups->end(), holds);
    } else if (auto first = std::find_if(backups->begin(), holder, holds); first != holder) {
      passed_over =
          absl::StrCat(" (", first->server_name(), ", not heard from lately, passed over)");
    }
    if (holder != backups->end()) {
      assignment.set_server_name(holder->server_name());
      assignment.set_server_address(holder->server_address());
      backups->erase(holder);
      if (auto it = primaries.find(assignment.server_name()); it != primaries.end()) ++it->second;
      removal.promoted.push_back(assignment.shard_id());
      notes.push_back(absl::StrCat("shard ", assignment.shard_id(), ": backup ",
                                   assignment.server_name(), " promoted", passed_over));
      continue;
    }
    auto target =
        std::min_element(primaries.begin(), primaries.end(), [](const auto& a, const auto& b) {
          return a.second < b.second || (a.second == b.second && a.first < b.first);
        });
    assignment.set_server_name(target->first);
    for (const ServerEndpoint& server : live) {
      if (server.name == target->first) assignment.set_server_address(server.address);
    }
    // A backup that was still copying the shard may be on the server that now restores
    // it: a server holds one copy of a shard.
    backups->erase(std::remove_if(backups->begin(), backups->end(),
                                  [&](const ShardReplica& backup) {
                                    return backup.server_name() == target->first;
                                  }),
                   backups->end());
    ++target->second;
    removal.orphaned.push_back(assignment.shard_id());
    notes.push_back(
        absl::StrCat("shard ", assignment.shard_id(), ": no copy left, moves to ", target->first));
  }
  removal.new_backups = TopUpBackups(map, live, replication, failing);
  if (!removal.new_backups.empty()) {
    notes.push_back(
        absl::StrCat("new backups copy shards [", absl::StrJoin(removal.new_backups, ", "), "]"));
  }
  removal.summary = absl::StrJoin(notes, "; ");
  return removal;
}

std::vector<int> GiveBackupsTo(ShardMap* map, const std::string& joined,
                               const std::vector<ServerEndpoint>& live) {
  std::vector<int> moved;
  std::set<ShardKind> kinds;
  for (const ShardAssignment& assignment : map->shards()) kinds.insert(assignment.kind());
  // Kind by kind (dense ranges, embedding buckets): the joined server can later take a
  // fair share of each kind's primaries only from the backups it holds.
  for (const ShardKind kind : kinds) {
    std::map<std::string, int> copies = CopiesPerServer(*map, live, kind);
    int total = 0;
    for (const auto& [name, count] : copies) total += count;
    const int fair = total / static_cast<int>(live.size());
    while (copies[joined] < fair) {
      // The busiest server's backup role of a shard `joined` does not hold yet.
      ShardReplica* chosen = nullptr;
      int chosen_shard = -1;
      for (ShardAssignment& assignment : *map->mutable_shards()) {
        if (assignment.kind() != kind || Holds(assignment, joined)) continue;
        for (ShardReplica& backup : *assignment.mutable_backups()) {
          if (copies.count(backup.server_name()) == 0) continue;
          if (chosen == nullptr || copies[backup.server_name()] > copies[chosen->server_name()]) {
            chosen = &backup;
            chosen_shard = assignment.shard_id();
          }
        }
      }
      if (chosen == nullptr || copies[chosen->server_name()] <= copies[joined] + 1) break;
      --copies[chosen->server_name()];
      ++copies[joined];
      chosen->set_server_name(joined);
      for (const ServerEndpoint& server : live) {
        if (server.name == joined) chosen->set_server_address(server.address);
      }
      moved.push_back(chosen_shard);
    }
  }
  return moved;
}

}  // namespace paramserver
