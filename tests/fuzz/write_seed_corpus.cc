// Writes the seed corpus of every fuzz target (tests/fuzz/corpus/<target>/): valid
// inputs made with the project's own encoders, so that fuzzing starts from messages and
// files the parsers accept. Usage: write_seed_corpus OUT_DIR
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/embedding_checkpoint.h"
#include "common/checkpoint/safetensors.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/files/file_system.h"
#include "common/testing/byte_buffers.h"
#include "common/testing/temp_dir.h"
#include "common/wire/shard_call_codec.h"
#include "common/wire/shard_layout.h"
#include "common/wire/tensor_codec.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/parameter_server.pb.h"
#include "ps/shard_replicator.h"

namespace paramserver {
namespace {

std::string out_dir;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = absl::StrCat(out_dir, "/", target);
  const absl::Status written = [&] {
    PS_RETURN_IF_ERROR(LocalFileSystem().CreateDir(dir));
    return WriteFileAtomically(LocalFileSystem(), absl::StrCat(dir, "/", name), bytes);
  }();
  if (!written.ok()) {
    std::fprintf(stderr, "write_seed_corpus: %s\n", written.ToString().c_str());
    std::exit(1);
  }
}

std::string ReadFile(const std::string& path) {
  return LocalFileSystem().ReadFile(path).value_or("");
}

// The data calls' requests and replies, and the tensor codec's encodings of `gradient`.
void WriteWireSeeds(const std::vector<float>& gradient) {
  // PushShards and PullShards requests (first byte: 1 push, 0 pull).
  PushRequest header;
  header.set_shard_id(4);
  header.set_epoch(5);
  header.set_worker_rank(1);
  header.set_step(7);
  header.set_pull_next(true);
  for (WireDtype dtype : {WireDtype::kFloat32, WireDtype::kBfloat16}) {
    Write("shard_call_parser_fuzzer", absl::StrCat("push_", WireDtypeName(dtype)),
          "\x01" + BytesOf(EncodePushShards({{header, gradient}, {header, gradient}}, dtype)));
  }
  PullShardsRequest pull;
  PullRequest* part = pull.add_shards();
  part->set_shard_id(4);
  part->set_epoch(5);
  part->set_step(7);
  Write("shard_call_parser_fuzzer", "pull",
        std::string("\x00", 1) + BytesOf(EncodePullShards(pull)));
  // Replies (first byte: 0 pull, 1 push; second: parts - 1).
  std::string values;
  AppendFloatsLittleEndian(gradient, &values);
  PullShardsResponse pulled;
  PullResponse* pulled_part = pulled.add_shards();
  pulled_part->set_shard_id(4);
  pulled_part->set_applied_updates(3);
  pulled_part->set_values(values);
  Write("shard_reply_codec_fuzzer", "pull",
        std::string("\x00\x00", 2) + pulled.SerializeAsString());
  PushShardsResponse pushed;
  PushResponse* pushed_part = pushed.add_shards();
  pushed_part->set_applied_updates(4);
  pushed_part->set_pulled(true);
  pushed_part->set_values(values);
  Write("shard_reply_codec_fuzzer", "push",
        std::string("\x01\x00", 2) + pushed.SerializeAsString());
  // Tensors.
  for (WireDtype dtype : {WireDtype::kFloat32, WireDtype::kBfloat16, WireDtype::kFloat16}) {
    std::string encoded;
    AppendEncoded(dtype, gradient, &encoded);
    Write("tensor_codec_fuzzer", std::string(WireDtypeName(dtype)), "\x01" + encoded);
  }
}

// The files the daemons read: safetensors, checkpoints, IDX, Criteo lines, the spec.
void WriteFileSeeds(const std::vector<float>& gradient) {
  // safetensors.
  absl::StatusOr<std::string> safetensors = EncodeSafetensors(
      {{"fc0.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"fc0.bias", {2}, {0.5f, -0.5f}}});
  if (safetensors.ok()) Write("safetensors_fuzzer", "mlp", *safetensors);
  // A checkpoint file.
  TempDir dir;
  ShardState state;
  state.shard_id = 2;
  state.range = {10, 13};
  state.step = 5;
  state.epoch = 1;
  state.values = gradient;
  state.optimizer = "adam(exp_avg,exp_avg_sq)";
  state.slots = {{0.1f, 0.2f, 0.3f}, {0.01f, 0.02f, 0.03f}};
  if (WriteShardCheckpoint(LocalFileSystem(), dir.path(), state).ok()) {
    Write("shard_checkpoint_fuzzer", "shard", ReadFile(ShardCheckpointPath(dir.path(), 2, 5)));
  }
  // IDX: 2 images of 2x2, and 2 labels.
  Write("idx_dataset_fuzzer", "images",
        std::string("\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00\x02"
                    "\x00\x80\xff\x10\x01\x02\x03\x04",
                    24));
  Write("idx_dataset_fuzzer", "labels",
        std::string("\x00\x00\x08\x01\x00\x00\x00\x02\x03\x07", 10));
  // Criteo lines: a full one (13 dense, 26 categorical, some missing) and a short one.
  std::string criteo = "1";
  for (int j = 0; j < 13; ++j) criteo += j % 5 == 4 ? "\t" : "\t" + std::to_string(j * 7 - 1);
  for (int k = 0; k < 26; ++k) criteo += k % 7 == 6 ? "\t" : "\t68fd1e6" + std::to_string(k % 10);
  Write("criteo_line_fuzzer", "full", criteo);
  Write("criteo_line_fuzzer", "short", "0\t3\t\tab\t");
  // An embedding checkpoint: 3 rows of dim 2 with Adam state, on shard 0 of 1 (the older
  // formats' seeds, rows and rows_v2, stay as they were written).
  EmbeddingShardState embedding;
  embedding.dim = 2;
  embedding.state_floats = 4;
  embedding.ids = {3, 17, 4000000000};
  embedding.rows = {1, 2, 3, 4, 5, 6};
  embedding.state.assign(12, 0.5f);
  embedding.optimizer = "adam";
  Write("embedding_checkpoint_fuzzer", "rows_v3", *EncodeEmbeddingCheckpoint(embedding));
  // The cluster spec: the default job's, and one with every section.
  // `bazel run` starts in the runfiles; the workspace is where the command was typed.
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  Write("cluster_spec_fuzzer", "fashion_mnist",
        ReadFile(absl::StrCat(workspace != nullptr ? workspace : ".",
                              "/deploy/local/fashion_mnist.yaml")));
  Write("cluster_spec_fuzzer", "sections",
        R"(cluster: {scheduler: 127.0.0.1:0, servers: 2, workers: 2, shards: 8}
model: {layers: [784, 128, 10], init_seed: 1}
training: {mode: ssp, staleness: 2, batch_size: 32, epochs: 1, wire_dtype: bfloat16}
checkpoint: {dir: ckpt, every_steps: 100, keep: 3}
security: {cluster_token_file: token, admin_token_file: admin, admin_reads_need_token: true}
)");
}

// A replica's state streamed, as the replication fuzzer takes it: the header piece, with
// every later piece's data in its data.
std::string StreamedSeed(const ReplicaState& replica) {
  ShardStatePiece streamed;
  (void)WriteReplicaStatePieces(replica, 16, 1 << 20, [&](const ShardStatePiece& piece) {
    if (piece.has_state()) {
      streamed = piece;
    } else {
      streamed.mutable_data()->append(piece.data());
    }
    return true;
  });
  return streamed.SerializeAsString();
}

// Replication (first byte: 0/1 a ReplicateRequest for a sync/async shard, 2/3 a state,
// 6/7 a state streamed; bit 3 an embedding shard; bits 4-7 the pieces' size less one).
void WriteReplicationSeeds() {
  for (bool sync : {true, false}) {
    ReplicateRequest request;
    ShardLogBatch* batch = request.add_shards();
    batch->set_shard_id(1);
    batch->set_primary_name("ps-0");
    batch->set_epoch(1);
    ShardMutation mutation;
    mutation.index = 1;
    mutation.kind = sync ? ShardMutation::Kind::kSyncStep : ShardMutation::Kind::kPush;
    mutation.step = 0;
    mutation.gradient = {0.1f, 0.2f, 0.3f, 0.4f};
    *batch->add_entries() = EntryFromMutation(mutation, 1);
    ShardMutation active;
    active.index = 2;
    active.kind = ShardMutation::Kind::kActiveWorkers;
    active.active = {true, false};
    *batch->add_entries() = EntryFromMutation(active, 1);
    Write("replication_fuzzer", sync ? "sync_log" : "async_log",
          std::string(1, sync ? '\x00' : '\x01') + request.SerializeAsString());
  }
  ReplicaState replica;
  replica.shard.shard_id = 1;
  replica.shard.range = {0, 4};
  replica.shard.values = {1, 2, 3, 4};
  replica.shard.optimizer = "adam(exp_avg,exp_avg_sq)";
  replica.shard.slots = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  replica.active = {true, true};
  replica.pushed_steps = {0, 0};
  replica.pending_received = {false, false};
  replica.pending_gradients = {{}, {}};
  Write("replication_fuzzer", "state", "\x03" + ReplicaStateToProto(replica).SerializeAsString());
  // The same state streamed (first byte 7: async, streamed; 0x50: pieces of 6 bytes).
  Write("replication_fuzzer", "streamed_state", "\x57" + StreamedSeed(replica));

  // An embedding shard's state streamed (first byte 0x5f: async, streamed, embedding,
  // pieces of 6 bytes): bucket 0 of 2 of tables of dims 2 and 3 with Adam, as the fuzzer
  // expects, three rows of C1 stored in another order than updated (their links).
  ReplicaState rows;
  rows.shard.shard_id = 1;
  rows.active = {true, true};
  rows.pushed_steps = {0, 0};
  rows.pending_received = {false, false};
  rows.pending_gradients = {{}, {}};
  rows.pending_rows = {{}, {}};
  rows.sightings.resize(2);
  for (int t = 0; t < 2; ++t) {
    EmbeddingShardState& table = rows.shard.tables.emplace_back();
    table.table_index = t;
    table.dim = 2 + t;
    table.state_floats = 2 * table.dim;
    table.shard_count = 2;
    for (int64_t id = 1; t == 0 && table.ids.size() < 3; ++id) {
      if (EmbeddingShardOf(0, id, 2) == 0) table.ids.push_back(id);
    }
    table.rows.assign(table.ids.size() * table.dim, 0.5f);
    table.state.assign(table.ids.size() * table.state_floats, 0.25f);
  }
  rows.shard.tables[0].least_recent = 2;
  rows.shard.tables[0].next_more_recent = {kNoMoreRecentRow, 0, 1};  // 2, then 1, then 0
  Write("replication_fuzzer", "streamed_rows", "\x5f" + StreamedSeed(rows));
}

void WriteAll() {
  const std::vector<float> gradient = {0.5f, -0.25f, 1.0f};
  WriteWireSeeds(gradient);
  WriteFileSeeds(gradient);
  WriteReplicationSeeds();
}

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_seed_corpus OUT_DIR\n");
    return 2;
  }
  paramserver::out_dir = argv[1];
  paramserver::CreateDirRecursively(paramserver::LocalFileSystem(), argv[1]).IgnoreError();
  paramserver::WriteAll();
  return 0;
}
