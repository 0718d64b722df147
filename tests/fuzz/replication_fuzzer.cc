// libFuzzer target: what a backup takes from a primary (Replicate's log entries) and a
// new backup from its primary (FetchShardState's state, whole or as its streamed
// pieces), down to the shard that applies them.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/parameter_server.pb.h"
#include "ps/parameter_shard.h"
#include "ps/shard_replicator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  paramserver::ParameterShardOptions options;
  options.shard_id = 1;
  options.range = {0, 4};
  options.num_workers = 2;
  options.mode =
      data[0] % 2 == 0 ? paramserver::TrainingMode::kSync : paramserver::TrainingMode::kAsync;
  if (data[0] & 8) {  // an embedding shard: bucket 0 of 2 of tables of dims 2 and 3
    auto embedding = std::make_shared<paramserver::EmbeddingShardOptions>();
    embedding->shape = {{2, 3}, 0, 2};
    for (int t = 0; t < 2; ++t) {
      paramserver::EmbeddingTableOptions table;
      table.dim = embedding->shape.dims[t];
      table.table_index = t;
      table.min_count = 2;
      table.max_rows = 8;
      embedding->tables.push_back(table);
    }
    options.range = {};
    options.embedding = embedding;
  }
  if (data[0] % 4 < 2) {
    paramserver::ReplicateRequest request;
    if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
    paramserver::ParameterShard shard(
        options, options.embedding ? std::vector<float>{} : std::vector<float>{1, 2, 3, 4});
    for (const paramserver::ShardLogBatch& batch : request.shards()) {
      for (const paramserver::ShardLogEntry& entry : batch.entries()) {
        absl::StatusOr<paramserver::ShardMutation> mutation =
            paramserver::MutationFromEntry(entry, options);
        if (mutation.ok()) (void)shard.ApplyLogEntry(*mutation);
      }
    }
    return 0;
  }
  const paramserver::ReplicaExpectation expected{options.range, options.num_workers,
                                                 options.embedding.get()};
  absl::StatusOr<paramserver::ReplicaState> replica;
  if (data[0] & 4) {
    // The stream FetchShardState sends: a header (the piece parsed, without its data),
    // then its data in pieces of 1 to 16 bytes.
    paramserver::ShardStatePiece header;
    if (!header.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
    const std::string stream = header.data();
    header.clear_data();
    paramserver::ReplicaStateAssembler assembler(expected);
    (void)assembler.Add(std::move(header));
    const size_t piece_bytes = (data[0] >> 4) + 1;
    for (size_t at = 0; at < stream.size(); at += piece_bytes) {
      paramserver::ShardStatePiece piece;
      piece.set_data(stream.substr(at, piece_bytes));
      (void)assembler.Add(std::move(piece));
    }
    replica = assembler.Finish();
  } else {
    paramserver::ShardReplicaState state;
    if (!state.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
    replica = paramserver::ReplicaStateFromProto(state, expected);
  }
  if (replica.ok()) (void)paramserver::ParameterShard::FromReplica(options, *std::move(replica));
  return 0;
}
