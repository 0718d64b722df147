// Servers' embedding rows at 10^6 to 10^8 rows, through the real code: two gRPC servers
// on 127.0.0.1 (ParameterServerServiceImpl, as ps_server serves it, with tcmalloc), each
// the primary of --shards_per_server embedding shards of one table (async), filled and
// then trained by one generator client (the worker's GrpcPsClient, with a worker's
// credential and the cluster token), against the shards' own work on the same batches
// called in this process without gRPC.
//
//   bazel run -c opt //bench:embedding_server_bench -- [--rows=1000000,10000000]
//       [--dim=8] [--optimizer=rowwise_adagrad] [--shards_per_server=2] [--rounds=3]
//
// For each size in --rows (ascending: the tables grow from one size to the next), one
// line of key=value figures:
//   fill_m_rows_per_sec    rows made by the client's pushes of 65,536 new ids each
//   bytes_per_row          every shard's table together (EmbeddingCounters), against
//   minimum_bytes_per_row  the row and its optimizer state
//   rss_mib                this process's resident memory: both servers and the client
//   pull_m_rows_per_sec    batches of 4,096 distinct ids (ranks log-uniform over the rows
//                          made, as embedding_table_bench draws them), each pulled
//   push_m_rows_per_sec    the same batches pushed, each push an update of its rows
//   direct_pull_m_rows_per_sec, direct_push_m_rows_per_sec
//                          the same batches split by shard as the client splits them, and
//                          given to each shard's PullRowsInto / PushRows in this process,
//                          one thread a server (as the client calls both servers at once)
//   pull_vs_direct, push_vs_direct  the ratios (what the calls, the wire and the
//                          client's splitting and gathering leave of the shards' rate)
// Each rate is the median of --rounds rounds of 64 batches, gRPC and direct interleaved.
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_figures.h"
#include "common/security/peer_credentials.h"
#include "common/security/secrets.h"
#include "common/wire/shard_layout.h"
#include "common/wire/sparse_rows.h"
#include "ps/in_process_server.h"
#include "ps/parameter_server_service.h"
#include "ps/parameter_shard.h"
#include "worker/grpc_ps_client.h"

ABSL_FLAG(std::string, rows, "1000000,10000000", "table sizes, ascending, comma-separated");
ABSL_FLAG(int, dim, 8, "floats per row");
ABSL_FLAG(std::string, optimizer, "rowwise_adagrad", "the table's row optimizer");
ABSL_FLAG(int, shards_per_server, 2, "embedding shards each of the two servers holds");
ABSL_FLAG(int, rounds, 3, "timed rounds at each size (medians are printed)");

namespace paramserver {
namespace {

constexpr int kServers = 2;
constexpr int64_t kFillBatch = 65536;
constexpr int kBatches = 64;
constexpr int kBatchIds = 4096;

// Ids spread over the 32-bit space, one per rank (as embedding_table_bench makes them).
int64_t IdOf(int64_t rank) { return (rank * 2654435761LL) % 4294967291LL; }

long ResidentMib() {
  FILE* status = std::fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (status != nullptr) {
    if (std::fscanf(status, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(status);
  }
  return resident * 4096 / 1048576;
}

std::vector<int64_t> ParseSizes(const std::string& text) {
  std::vector<int64_t> sizes;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t size = 0;
    // At least 4 batches' ids: a batch's 4,096 distinct ids are drawn from the rows made.
    if (!absl::SimpleAtoi(part, &size) || size < 4 * kBatchIds ||
        (!sizes.empty() && size < sizes.back()) || size > (int64_t{1} << 31)) {
      std::fprintf(stderr, "embedding_server_bench: --rows: ascending sizes in [16384, 2^31]\n");
      std::exit(2);
    }
    sizes.push_back(size);
  }
  return sizes;
}

// The job's shards: kServers x shards_per_server embedding shards of one table, shard b
// holding hash bucket b and served by server b % kServers.
class Cluster {
 public:
  Cluster(int dim, EmbeddingOptimizerType optimizer, int shards_per_server)
      : dim_(dim), buckets_(kServers * shards_per_server) {
    const std::string worker_token = NewSecretToken();
    google::protobuf::RepeatedPtrField<NodeCredential> members;
    NodeCredential* worker = members.Add();
    worker->set_node_name("worker-0");
    worker->set_role(NODE_ROLE_WORKER);
    worker->set_token_sha256(Sha256(worker_token));
    known_nodes_.ReplaceNodes(members);
    callers_ = std::make_unique<CallerVerifier>(cluster_token_, known_nodes_.AsLookup());
    std::vector<InProcessServer*> servers;
    for (int s = 0; s < kServers; ++s) {
      InProcessServerOptions options;
      options.name = "ps-" + std::to_string(s);
      options.callers = callers_.get();
      absl::StatusOr<std::unique_ptr<InProcessServer>> server = InProcessServer::Start(options);
      CheckOrExit(server.status(), "a server");
      servers_.push_back(*std::move(server));
      servers.push_back(servers_.back().get());
    }
    for (int b = 0; b < buckets_; ++b) {
      auto embedding = std::make_shared<EmbeddingShardOptions>();
      embedding->shape = {{dim}, b, buckets_};
      EmbeddingTableOptions table;
      table.dim = dim;
      table.optimizer.type = optimizer;
      embedding->tables.push_back(table);
      ParameterShardOptions options;
      options.shard_id = b;
      options.mode = TrainingMode::kAsync;
      options.num_workers = 1;
      options.embedding = embedding;
      shards_.push_back(std::make_shared<ParameterShard>(options, std::vector<float>()));
    }
    map_ = ServeShards(servers, /*num_workers=*/1, shards_);
    GrpcPsClientOptions client_options;
    client_options.embedding_dims = {dim};
    auto credentials = std::make_shared<CallCredentials>(cluster_token_);
    credentials->SetIdentity("worker-0", worker_token);
    client_options.credentials = credentials;
    const ShardMap map = map_;
    absl::StatusOr<std::unique_ptr<GrpcPsClient>> client = GrpcPsClient::Create(
        client_options, map, [map]() -> absl::StatusOr<ShardMap> { return map; });
    CheckOrExit(client.status(), "the client");
    client_ = *std::move(client);
  }

  // Pushes `gradients` (ids.size() x dim) for `ids` (ascending) through the client.
  void Push(const std::vector<int64_t>& ids, const std::vector<float>& gradients) {
    const std::vector<int64_t>* id_tables = &ids;
    const std::vector<float>* gradient_tables = &gradients;
    StepPush push;
    push.step = step_++;
    push.ids = absl::MakeConstSpan(id_tables, 1);
    push.row_gradients = absl::MakeConstSpan(gradient_tables, 1);
    CheckOrExit(client_->Push(push).status(), "a push");
  }

  // Pulls the rows of `ids` (ascending) through the client into *rows.
  void Pull(const std::vector<int64_t>& ids, std::vector<float>* rows) {
    StepPull pull;
    pull.step = step_;
    pull.into.ids = absl::MakeConstSpan(&ids, 1);
    pull.into.rows = absl::MakeSpan(rows, 1);
    CheckOrExit(client_->Pull(pull), "a pull");
  }

  // `ids` and `gradients` split by shard, as the client splits them.
  struct Split {
    std::vector<RowIds> rows;                   // by bucket
    std::vector<std::vector<float>> gradients;  // by bucket
  };
  Split SplitByShard(const std::vector<int64_t>& ids, const std::vector<float>& gradients) const {
    Split split;
    split.rows.resize(buckets_);
    split.gradients.resize(buckets_);
    for (size_t i = 0; i < ids.size(); ++i) {
      const int b = EmbeddingShardOf(0, ids[i], buckets_);
      split.rows[b].ids.push_back(ids[i]);
      split.gradients[b].insert(split.gradients[b].end(), gradients.begin() + i * dim_,
                                gradients.begin() + (i + 1) * dim_);
    }
    for (RowIds& rows : split.rows) rows.counts = {static_cast<int32_t>(rows.ids.size())};
    return split;
  }

  // The same batches given to the shards directly, as the servers take them: one thread
  // a server (the client calls both at once), each going through every batch's parts
  // for its own shards in turn (as a server serves a call's parts), with no wait between
  // batches. Each push must be applied (not taken as a repeat).
  void PushDirect(const std::vector<Split>& splits) {
    const int64_t first_step = step_;
    step_ += static_cast<int64_t>(splits.size());
    OnEveryServer([&](int server) {
      for (size_t i = 0; i < splits.size(); ++i) {
        for (int b = server; b < buckets_; b += kServers) {
          absl::StatusOr<PushOutcome> outcome =
              shards_[b]->PushRows(0, first_step + static_cast<int64_t>(i),
                                   splits[i].rows[b].view(), splits[i].gradients[b]);
          CheckOrExit(outcome.status(), "a direct push");
          if (outcome->duplicate || outcome->late) {
            CheckOrExit(absl::InternalError("taken as a repeat"), "a direct push");
          }
        }
      }
    });
  }
  void PullDirect(const std::vector<Split>& splits) {
    OnEveryServer([&](int server) {
      std::string values;
      for (const Split& split : splits) {
        for (int b = server; b < buckets_; b += kServers) {
          PulledValues info;
          values.clear();
          CheckOrExit(
              shards_[b]->PullRowsInto(0, step_, absl::Now() + absl::Seconds(10),
                                       split.rows[b].view(), WireDtype::kFloat32, &values, &info),
              "a direct pull");
        }
      }
    });
  }

  EmbeddingCounters Counters() const {
    EmbeddingCounters all;
    for (const auto& shard : shards_) {
      const EmbeddingCounters counters = shard->embedding_counters();
      all.rows += counters.rows;
      all.bytes += counters.bytes;
      all.minimum_bytes += counters.minimum_bytes;
    }
    return all;
  }

 private:
  // Runs work(server) for each server on a thread of its own, and waits for them.
  template <typename Work>
  static void OnEveryServer(const Work& work) {
    std::vector<std::thread> threads;
    for (int server = 0; server < kServers; ++server) threads.emplace_back(work, server);
    for (std::thread& thread : threads) thread.join();
  }

  const int dim_;
  const int buckets_;
  const std::string cluster_token_ = NewSecretToken();
  KnownNodeTable known_nodes_;
  std::unique_ptr<CallerVerifier> callers_;
  std::vector<std::unique_ptr<InProcessServer>> servers_;
  std::vector<std::shared_ptr<ParameterShard>> shards_;
  ShardMap map_;
  std::unique_ptr<GrpcPsClient> client_;
  int64_t step_ = 0;
};

int Run() {
  const std::vector<int64_t> sizes = ParseSizes(absl::GetFlag(FLAGS_rows));
  const int dim = absl::GetFlag(FLAGS_dim);
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const absl::StatusOr<EmbeddingOptimizerType> optimizer =
      ParseEmbeddingOptimizerType(absl::GetFlag(FLAGS_optimizer));
  CheckOrExit(optimizer.status(), "--optimizer");
  if (dim <= 0 || absl::GetFlag(FLAGS_shards_per_server) <= 0) {
    std::fprintf(stderr, "embedding_server_bench: --dim and --shards_per_server must be > 0\n");
    return 2;
  }
  Cluster cluster(dim, *optimizer, absl::GetFlag(FLAGS_shards_per_server));
  int64_t made = 0;
  std::vector<int64_t> ids;
  std::vector<float> gradients, rows;
  std::mt19937_64 random(1);
  for (int64_t size : sizes) {
    // Fill: the ranks not made yet, in sorted pushes of kFillBatch new ids (zero
    // gradients: each row keeps its initial value).
    const int64_t before = made;
    const double fill = MillionsPerSecond(size - before, [&] {
      while (made < size) {
        ids.clear();
        for (int64_t r = made; r < std::min(size, made + kFillBatch); ++r) ids.push_back(IdOf(r));
        std::sort(ids.begin(), ids.end());
        gradients.assign(ids.size() * dim, 0.0f);
        cluster.Push(ids, gradients);
        made += static_cast<int64_t>(ids.size());
      }
    });
    const EmbeddingCounters counters = cluster.Counters();
    if (counters.rows != size) {
      std::fprintf(stderr, "embedding_server_bench: the shards hold %lld rows, not %lld\n",
                   static_cast<long long>(counters.rows), static_cast<long long>(size));
      return 1;
    }
    // The batches: 4,096 distinct ids, ranks log-uniform over the rows made, sorted.
    std::uniform_real_distribution<double> uniform(0, std::log(static_cast<double>(size)));
    std::vector<std::vector<int64_t>> batches(kBatches);
    std::vector<Cluster::Split> splits;
    int64_t batch_rows = 0;
    const std::vector<float> gradient(kBatchIds * dim, 0.01f);
    for (auto& batch : batches) {
      const size_t wanted = kBatchIds;
      while (batch.size() < wanted) {
        batch.push_back(IdOf(static_cast<int64_t>(std::exp(uniform(random))) % size));
        if (batch.size() == wanted) {
          std::sort(batch.begin(), batch.end());
          batch.erase(std::unique(batch.begin(), batch.end()), batch.end());
        }
      }
      batch_rows += static_cast<int64_t>(batch.size());
      splits.push_back(cluster.SplitByShard(
          batch, std::vector<float>(gradient.begin(), gradient.begin() + batch.size() * dim)));
    }
    std::vector<double> pulls, pushes, direct_pulls, direct_pushes;
    for (int round = 0; round < rounds; ++round) {
      pulls.push_back(MillionsPerSecond(batch_rows, [&] {
        for (const auto& batch : batches) cluster.Pull(batch, &rows);
      }));
      direct_pulls.push_back(MillionsPerSecond(batch_rows, [&] { cluster.PullDirect(splits); }));
      pushes.push_back(MillionsPerSecond(batch_rows, [&] {
        for (const auto& batch : batches) {
          cluster.Push(batch,
                       std::vector<float>(gradient.begin(), gradient.begin() + batch.size() * dim));
        }
      }));
      direct_pushes.push_back(MillionsPerSecond(batch_rows, [&] { cluster.PushDirect(splits); }));
    }
    std::printf(
        "rows=%lld dim=%d optimizer=%s shards=%d fill_m_rows_per_sec=%.2f bytes_per_row=%.1f "
        "minimum_bytes_per_row=%.0f rss_mib=%ld pull_m_rows_per_sec=%.2f "
        "push_m_rows_per_sec=%.2f direct_pull_m_rows_per_sec=%.2f "
        "direct_push_m_rows_per_sec=%.2f pull_vs_direct=%.2f push_vs_direct=%.2f\n",
        static_cast<long long>(size), dim, absl::GetFlag(FLAGS_optimizer).c_str(),
        kServers * absl::GetFlag(FLAGS_shards_per_server), fill,
        counters.bytes / static_cast<double>(counters.rows),
        static_cast<double>(counters.minimum_bytes) / static_cast<double>(counters.rows),
        ResidentMib(), Median(pulls), Median(pushes), Median(direct_pulls), Median(direct_pushes),
        Median(pulls) / Median(direct_pulls), Median(pushes) / Median(direct_pushes));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return paramserver::Run();
}
