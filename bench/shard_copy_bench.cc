// An embedding shard's whole content leaving its server, through the real code: a new
// backup's copy from its primary (ParameterServerServiceImpl's FetchShardState behind
// gRPC on 127.0.0.1, streamed in pieces, put together by ReplicaStateAssembler,
// installed by ParameterShard::FromReplica), and a worker's export of the table
// (GrpcPsClient::ExportTables over ExportRows, as the finisher writes output.weights);
// each against raw TCP over loopback moving the same bytes one way, measured in the
// same run, interleaved, medians.
//
//   bazel run -c opt //bench:shard_copy_bench -- [--rows=4000000] [--dim=8] [--rounds=3]
//
// The shard has one table of `rows` rows of `dim` floats with Adagrad's state (dim
// floats a row), each row updated once in an order unrelated to where it is stored, as
// in a table that has trained. Its bulk bytes (ids, rows, state) are what moves. Figures:
//   export_s      the primary's copy of its state (ExportReplicaAsStored, as FetchShardState
//                 takes it: the rows as stored and their recency links), into memory reused
//                 (export_cold_s: into memory the kernel must map)
//   push_wait_max_s  the longest a push (one row, every millisecond) waited meanwhile:
//                 the time the copy held the shard's lock
//   stream_s      the call, from its start to its last piece put in place (export
//                 included)
//   decode_s      the pieces decoded into the state and its rows put in order of recency
//                 (ReplicaStateFromProto)
//   install_s     the shard built from it (FromReplica)
//   copy_s        all of it: the backup can serve from then on
//   raw_tcp_s     the bulk bytes through one plain socket
//   table_export_s  a worker's export of the whole table (ids and rows, sorted by id)
//   export_push_wait_max_s  the longest a push waited meanwhile
//   export_raw_tcp_s  the export's bytes (ids and rows) through one plain socket
// and `ratio copy/raw_tcp`, `ratio table_export/raw_tcp` (time ratios: how many times
// raw TCP's time each takes).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "bench/bench_figures.h"
#include "bench/raw_tcp_loopback.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/peer_credentials.h"
#include "common/security/secrets.h"
#include "ps/in_process_server.h"
#include "ps/parameter_server_service.h"
#include "ps/shard_replicator.h"
#include "worker/grpc_ps_client.h"

ABSL_FLAG(int64_t, rows, 4'000'000, "rows in the shard's one table");
ABSL_FLAG(int, dim, 8, "floats per row");
ABSL_FLAG(int, rounds, 3, "timed rounds (medians are printed)");

namespace paramserver {
namespace {

ParameterShardOptions ShardOptions(int dim) {
  auto embedding = std::make_shared<EmbeddingShardOptions>();
  embedding->shape = {{dim}, 0, 1};
  EmbeddingTableOptions table;
  table.dim = dim;
  table.optimizer.type = EmbeddingOptimizerType::kAdagrad;
  embedding->tables.push_back(table);
  ParameterShardOptions options;
  options.shard_id = 0;
  options.mode = TrainingMode::kAsync;
  options.num_workers = 1;
  options.embedding = embedding;
  return options;
}

// A shard holding `rows` rows, as a restored one would.
// *next_step: worker 0's next step.
std::shared_ptr<ParameterShard> FilledShard(const ParameterShardOptions& options, int64_t rows,
                                            int64_t* next_step) {
  const EmbeddingTableOptions& table_options = options.embedding->tables[0];
  ShardState state;
  EmbeddingShardState& table = state.tables.emplace_back();
  table.dim = table_options.dim;
  table.state_floats = StateFloatsPerRow(table_options.optimizer.type, table_options.dim);
  table.ids.resize(rows);
  table.rows.resize(rows * table.dim);
  table.state.resize(rows * table.state_floats);
  for (int64_t i = 0; i < rows; ++i) table.ids[i] = i * 7 + 3;
  for (size_t i = 0; i < table.rows.size(); ++i) table.rows[i] = static_cast<float>(i % 977) / 977;
  std::fill(table.state.begin(), table.state.end(), 0.5f);
  auto shard = std::make_shared<ParameterShard>(options, std::move(state));
  // Then every row updated once (a zero gradient: no value changes), in another order, a
  // few thousand at a time: the rows' update order (which a replica continues from) no
  // longer follows where they are stored, as in a table that has trained.
  std::vector<int64_t> order(rows);
  for (int64_t i = 0; i < rows; ++i) order[i] = i * 7 + 3;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(13));
  constexpr int64_t kBatch = 4096;
  int64_t step = 0;
  for (int64_t from = 0; from < rows; from += kBatch, ++step) {
    RowIds batch;
    batch.ids.assign(order.begin() + from, order.begin() + std::min(rows, from + kBatch));
    std::sort(batch.ids.begin(), batch.ids.end());
    batch.counts = {static_cast<int32_t>(batch.ids.size())};
    const std::vector<float> zero(batch.ids.size() * table_options.dim, 0.0f);
    CheckOrExit(shard->PushRows(0, step, batch.view(), zero).status(), "an update");
  }
  *next_step = step;
  return shard;
}

// The longest a worker's push (one row, every millisecond, at *next_step on) waits
// while `work` runs: how long `work` holds the shard's lock at a time.
double LongestPushWait(ParameterShard& shard, int64_t* next_step,
                       const std::function<void()>& work) {
  std::atomic<bool> working{true};
  double longest_push = 0;
  std::thread pusher([&] {
    RowIds one;
    one.ids = {3};
    one.counts = {1};
    const std::vector<float> gradient(shard.options().embedding->tables[0].dim, 0.0f);
    while (working.load()) {
      const absl::Time start = absl::Now();
      CheckOrExit(shard.PushRows(0, (*next_step)++, one.view(), gradient).status(), "a push");
      longest_push = std::max(longest_push, absl::ToDoubleSeconds(absl::Now() - start));
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  absl::SleepFor(absl::Milliseconds(20));
  work();
  working = false;
  pusher.join();
  return longest_push;
}

struct CopySeconds {
  double stream = 0, decode = 0, install = 0;
  int64_t bytes = 0;
};

CopySeconds CopyOnce(ParameterServer::Stub& primary, const ParameterShardOptions& options) {
  CopySeconds seconds;
  const absl::Time start = absl::Now();
  ReplicaStateAssembler assembler({options.range, options.num_workers, options.embedding.get()});
  grpc::ClientContext context;
  FetchShardStateRequest request;
  request.set_shard_id(0);
  request.set_epoch(1);
  std::unique_ptr<grpc::ClientReader<ShardStatePiece>> reader =
      primary.FetchShardState(&context, request);
  ShardStatePiece piece;
  while (reader->Read(&piece)) CheckOrExit(assembler.Add(std::move(piece)), "a piece");
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    std::fprintf(stderr, "shard_copy_bench: FetchShardState: %s\n", status.error_message().c_str());
    std::exit(1);
  }
  const absl::Time streamed = absl::Now();
  absl::StatusOr<ReplicaState> replica = assembler.Finish();
  CheckOrExit(replica.status(), "the state");
  const absl::Time decoded = absl::Now();
  absl::StatusOr<std::unique_ptr<ParameterShard>> copy =
      ParameterShard::FromReplica(options, *std::move(replica));
  CheckOrExit(copy.status(), "the copy");
  seconds.install = absl::ToDoubleSeconds(absl::Now() - decoded);
  seconds.stream = absl::ToDoubleSeconds(streamed - start);
  seconds.decode = absl::ToDoubleSeconds(decoded - streamed);
  seconds.bytes = assembler.bulk_bytes_received();
  return seconds;
}

int Run() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const ParameterShardOptions options = ShardOptions(absl::GetFlag(FLAGS_dim));
  int64_t next_step = 0;
  std::shared_ptr<ParameterShard> shard = FilledShard(options, rows, &next_step);

  // The backup calls as a server of the job, with a cluster token, as in a secured job.
  const std::string cluster_token = NewSecretToken();
  const std::string backup_token = NewSecretToken();
  KnownNodeTable known_nodes;
  google::protobuf::RepeatedPtrField<NodeCredential> members;
  NodeCredential* backup = members.Add();
  backup->set_node_name("ps-1");
  backup->set_role(NODE_ROLE_SERVER);
  backup->set_token_sha256(Sha256(backup_token));
  // And a worker exports the table, as the job's finisher does.
  const std::string worker_token = NewSecretToken();
  NodeCredential* worker = members.Add();
  worker->set_node_name("worker-0");
  worker->set_role(NODE_ROLE_WORKER);
  worker->set_token_sha256(Sha256(worker_token));
  known_nodes.ReplaceNodes(members);
  const CallerVerifier callers(cluster_token, known_nodes.AsLookup());
  InProcessServerOptions server_options;
  server_options.name = "ps-0";
  server_options.callers = &callers;
  absl::StatusOr<std::unique_ptr<InProcessServer>> server = InProcessServer::Start(server_options);
  CheckOrExit(server.status(), "the server");
  const ShardMap map = ServeShards({server->get()}, /*num_workers=*/1, {shard});
  auto credentials = std::make_shared<CallCredentials>(cluster_token);
  credentials->SetIdentity("ps-1", backup_token);
  std::unique_ptr<ParameterServer::Stub> primary =
      ParameterServer::NewStub(CreateChannel((*server)->address(), credentials));

  GrpcPsClientOptions client_options;
  client_options.embedding_dims = {absl::GetFlag(FLAGS_dim)};
  auto worker_credentials = std::make_shared<CallCredentials>(cluster_token);
  worker_credentials->SetIdentity("worker-0", worker_token);
  client_options.credentials = worker_credentials;
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Create(
      client_options, map, [map]() -> absl::StatusOr<ShardMap> { return map; });
  CheckOrExit(client.status(), "the worker's client");
  // A worker's export of the whole table: its seconds, and the longest a push waited.
  const auto export_table = [&](double* push_wait) {
    double seconds = 0;
    const int64_t step = next_step;  // read before the pusher starts counting
    *push_wait = LongestPushWait(*shard, &next_step, [&] {
      const absl::Time start = absl::Now();
      absl::StatusOr<std::vector<TableRows>> tables = (*client)->ExportTables(step);
      seconds = absl::ToDoubleSeconds(absl::Now() - start);
      CheckOrExit(tables.status(), "the export");
      if (static_cast<int64_t>((*tables)[0].ids.size()) != rows) {
        std::fprintf(stderr, "shard_copy_bench: the export has %zu rows, not %lld\n",
                     (*tables)[0].ids.size(), static_cast<long long>(rows));
        std::exit(1);
      }
    });
    return seconds;
  };

  CopyOnce(*primary, options);  // warm-up: connections, allocator
  std::vector<double> exported_cold, exported, push_waits, stream, decode, install, copy, raw;
  std::vector<double> table_export, export_push_waits, export_raw;
  const int64_t export_bytes = rows * (8 + 4 * int64_t{absl::GetFlag(FLAGS_dim)});
  int64_t bytes = 0;
  for (int round = 0; round < rounds; ++round) {
    // Twice: the first into memory the process may have handed back to the kernel
    // (page faults), the second into the memory the first let go of.
    for (std::vector<double>* times : {&exported_cold, &exported}) {
      double seconds = 0;
      const double longest_push = LongestPushWait(*shard, &next_step, [&] {
        const absl::Time start = absl::Now();
        { const ReplicaState replica = shard->ExportReplicaAsStored(); }
        seconds = absl::ToDoubleSeconds(absl::Now() - start);
      });
      times->push_back(seconds);
      if (times == &exported) push_waits.push_back(longest_push);
    }
    const CopySeconds seconds = CopyOnce(*primary, options);
    bytes = seconds.bytes;
    stream.push_back(seconds.stream);
    decode.push_back(seconds.decode);
    install.push_back(seconds.install);
    copy.push_back(seconds.stream + seconds.decode + seconds.install);
    RawTcpLoopback loopback({static_cast<size_t>(bytes)}, /*echo=*/false);
    raw.push_back(loopback.TimeOneRound());
    double push_wait = 0;
    table_export.push_back(export_table(&push_wait));
    export_push_waits.push_back(push_wait);
    RawTcpLoopback export_loopback({static_cast<size_t>(export_bytes)}, /*echo=*/false);
    export_raw.push_back(export_loopback.TimeOneRound());
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("rows=%lld dim=%d bulk_mib=%.1f rounds=%d\n", static_cast<long long>(rows),
              absl::GetFlag(FLAGS_dim), bytes / 1048576.0, rounds);
  std::printf("export_s=%.3f export_cold_s=%.3f\n", Median(exported), Median(exported_cold));
  std::printf("push_wait_max_s=%.3f\n", Median(push_waits));
  std::printf("stream_s=%.3f\n", Median(stream));
  std::printf("decode_s=%.3f\n", Median(decode));
  std::printf("install_s=%.3f\n", Median(install));
  std::printf("copy_s=%.3f\n", Median(copy));
  std::printf("raw_tcp_s=%.3f\n", Median(raw));
  std::printf("copy_gbps=%.3f raw_tcp_gbps=%.3f\n", bytes / Median(copy) / 1e9,
              bytes / Median(raw) / 1e9);
  std::printf("table_export_s=%.3f export_mib=%.1f\n", Median(table_export),
              export_bytes / 1048576.0);
  std::printf("export_push_wait_max_s=%.3f\n", Median(export_push_waits));
  std::printf("export_raw_tcp_s=%.3f\n", Median(export_raw));
  std::printf("peak_rss_mib=%ld\n", usage.ru_maxrss / 1024);
  std::printf("ratio copy/raw_tcp=%.2f\n", Median(copy) / Median(raw));
  std::printf("ratio table_export/raw_tcp=%.2f\n", Median(table_export) / Median(export_raw));
  return 0;
}

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return paramserver::Run();
}
