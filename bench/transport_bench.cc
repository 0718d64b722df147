// Transport: push+pull throughput of a large dense model through the real parameter
// server code (ParameterServerServiceImpl behind gRPC on 127.0.0.1, driven by the
// worker's GrpcPsClient) against the raw TCP loopback throughput of the same bytes over
// plain sockets, measured in the same run, interleaved, medians.
//
//   bazel run -c opt //bench:transport_bench -- [--parameters=N] [--shards=4]
//       [--servers=2] [--rounds=5] [--wire_dtype=float32]
//
// Layout: `shards` shards over `servers` gRPC servers (round robin), one worker. A
// round is one Pull and one Push of the whole model; its bytes are 2 * 4 * N
// (float32 tensor bytes, whatever --wire_dtype puts on the wire). Figures are GB/s of
// those bytes:
//   raw_tcp       one connection per shard; each sends its shard's bytes and gets the
//                 same number back (a push and a pull), all shards at once.
//   transport     pull + a retried push: the servers acknowledge a duplicate push
//                 without applying it, so this is the wire, (de)serialisation and
//                 copies, and no optimizer.
//   fused         the same bytes in one round trip: a retried push whose reply carries
//                 the next step's values (a Push with `next`, as workers train).
//   with_adam     pull + a fresh push, which the servers apply with Adam.
// Prints one line per figure and a final `ratio transport/raw_tcp=...` line.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_figures.h"
#include "bench/raw_tcp_loopback.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/peer_credentials.h"
#include "common/security/secrets.h"
#include "common/wire/tensor_codec.h"
#include "ps/in_process_server.h"
#include "ps/parameter_server_service.h"
#include "worker/grpc_ps_client.h"

ABSL_FLAG(int64_t, parameters, 64 << 20, "float32 parameters in the model");
ABSL_FLAG(int, shards, 4, "shards");
ABSL_FLAG(int, servers, 2, "gRPC servers (in this process, on 127.0.0.1)");
ABSL_FLAG(int, rounds, 5, "timed rounds of each kind (medians are printed)");
ABSL_FLAG(std::string, wire_dtype, "float32", "float32, bfloat16 or float16: how tensors travel");
ABSL_FLAG(bool, cluster_token, true,
          "calls carry a cluster token (as every secured job's do), checked by the servers; false: "
          "none (node credentials are checked either way)");

namespace paramserver {
namespace {

// Seconds `work` takes.
template <typename Work>
double SecondsFor(Work work) {
  const absl::Time start = absl::Now();
  work();
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// Exits the benchmark with `status`'s message when it is not OK.
void CheckOrExit(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "transport_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
}

// Makes worker-0's credential as a real job has it (with `cluster_token`, or none when it
// is empty), known to `known_nodes`.
std::shared_ptr<CallCredentials> WorkerCredentials(const std::string& cluster_token,
                                                   KnownNodeTable* known_nodes) {
  const std::string worker_token = NewSecretToken();
  google::protobuf::RepeatedPtrField<NodeCredential> members;
  NodeCredential* worker = members.Add();
  worker->set_node_name("worker-0");
  worker->set_role(NODE_ROLE_WORKER);
  worker->set_rank(0);
  worker->set_token_sha256(Sha256(worker_token));
  known_nodes->ReplaceNodes(members);
  auto credentials = std::make_shared<CallCredentials>(cluster_token);
  credentials->SetIdentity("worker-0", worker_token);
  return credentials;
}

// Each measurement's seconds, one per round.
struct RoundSeconds {
  std::vector<double> raw, transport, fused, adam;
};

// `rounds` interleaved rounds of each: raw TCP, a pull and a (duplicate) push, the fused
// push whose reply brings the next pull, and a pull and a push the servers apply Adam to.
RoundSeconds TimeRounds(GrpcPsClient* client, RawTcpLoopback* raw, int rounds, int64_t parameters) {
  std::vector<float> params(parameters), gradient(parameters, 1e-3f);
  int64_t step = 0;
  // Warm up: connections, allocator, page faults.
  raw->TimeOneRound();
  CheckOrExit(client->Pull({step, {absl::MakeSpan(params)}}));
  CheckOrExit(client->Push({step, gradient}).status());
  RoundSeconds seconds;
  for (int round = 0; round < rounds; ++round) {
    seconds.raw.push_back(raw->TimeOneRound());
    seconds.transport.push_back(SecondsFor([&] {
      CheckOrExit(client->Pull({step + 1, {absl::MakeSpan(params)}}));
      CheckOrExit(client->Push({step, gradient}).status());  // already applied: a duplicate
    }));
    seconds.fused.push_back(SecondsFor([&] {
      absl::StatusOr<bool> pulled =
          client->Push({step, gradient, {}, {}, StepValues{absl::MakeSpan(params)}});
      CheckOrExit(pulled.status());
      if (!*pulled) CheckOrExit(absl::InternalError("a fused push did not bring the values back"));
    }));
    ++step;
    seconds.adam.push_back(SecondsFor([&] {
      CheckOrExit(client->Pull({step, {absl::MakeSpan(params)}}));
      CheckOrExit(client->Push({step, gradient}).status());
    }));
  }
  return seconds;
}

int Main() {
  const int64_t parameters = absl::GetFlag(FLAGS_parameters);
  const int num_shards = absl::GetFlag(FLAGS_shards);
  const int num_servers = absl::GetFlag(FLAGS_servers);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (parameters <= 0 || num_shards <= 0 || num_servers <= 0 || rounds <= 0 ||
      num_shards > parameters) {
    std::fprintf(
        stderr,
        "transport_bench: --parameters, --shards, --servers and --rounds must be positive\n");
    return 2;
  }
  absl::StatusOr<WireDtype> wire_dtype = ParseWireDtype(absl::GetFlag(FLAGS_wire_dtype));
  if (!wire_dtype.ok()) {
    std::fprintf(stderr, "transport_bench: --wire_dtype: %s\n",
                 wire_dtype.status().ToString().c_str());
    return 2;
  }

  const std::string cluster_token = absl::GetFlag(FLAGS_cluster_token) ? NewSecretToken() : "";
  KnownNodeTable known_nodes;
  std::shared_ptr<CallCredentials> worker_credentials =
      WorkerCredentials(cluster_token, &known_nodes);
  const CallerVerifier callers(cluster_token, known_nodes.AsLookup());
  std::vector<std::unique_ptr<InProcessServer>> servers;
  std::vector<InProcessServer*> server_pointers;
  for (int s = 0; s < num_servers; ++s) {
    InProcessServerOptions server_options;
    server_options.name = absl::StrCat("ps-", s);
    server_options.callers = &callers;
    server_options.max_pull_wait = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<InProcessServer>> server =
        InProcessServer::Start(server_options);
    if (!server.ok()) {  // returned, not exited: the servers started stop in order
      std::fprintf(stderr, "transport_bench: %s\n", server.status().ToString().c_str());
      return 1;
    }
    servers.push_back(*std::move(server));
    server_pointers.push_back(servers.back().get());
  }
  const ShardMap map = ServeEvenShards(server_pointers, parameters, num_shards,
                                       TrainingMode::kAsync, /*num_workers=*/1, 0.5f);
  std::vector<size_t> shard_bytes;
  for (const ShardAssignment& shard : map.shards())
    shard_bytes.push_back((shard.end() - shard.begin()) * sizeof(float));
  GrpcPsClientOptions options;
  options.total_parameters = parameters;
  options.wire_dtype = *wire_dtype;
  options.pull_timeout = options.push_timeout = absl::Seconds(120);
  options.credentials = worker_credentials;
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Create(options, map, [map]() -> absl::StatusOr<ShardMap> { return map; });
  if (!client.ok()) {
    std::fprintf(stderr, "transport_bench: %s\n", client.status().ToString().c_str());
    return 1;
  }
  RawTcpLoopback raw(shard_bytes);
  const RoundSeconds seconds = TimeRounds(client->get(), &raw, rounds, parameters);

  const double round_bytes = 2.0 * sizeof(float) * parameters;
  const double raw_rate = round_bytes / Median(seconds.raw) / 1e9;
  const double transport_rate = round_bytes / Median(seconds.transport) / 1e9;
  std::printf(
      "transport parameters=%lld shards=%d servers=%d rounds=%d wire_dtype=%s (medians; GB/s of "
      "float32 tensor bytes, push+pull)\n",
      static_cast<long long>(parameters), num_shards, num_servers, rounds,
      std::string(WireDtypeName(*wire_dtype)).c_str());
  std::printf("raw_tcp_gbps=%.3f\n", raw_rate);
  std::printf("transport_gbps=%.3f\n", transport_rate);
  std::printf("fused_gbps=%.3f\n", round_bytes / Median(seconds.fused) / 1e9);
  std::printf("with_adam_gbps=%.3f\n", round_bytes / Median(seconds.adam) / 1e9);
  std::printf("ratio transport/raw_tcp=%.2f\n", transport_rate / raw_rate);
  client->reset();  // before the servers stop
  return 0;
}

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return paramserver::Main();
}
