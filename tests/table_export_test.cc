// The export of whole embedding tables (the finisher writing output.weights) against real
// parameter servers over gRPC on 127.0.0.1: every row once, by id, in pages a stream
// carries, with the values training gave them; and the stream's refusals.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/model/embedding_init.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/testing/test_credentials.h"
#include "common/wire/shard_layout.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"
#include "ps/in_process_server.h"
#include "ps/parameter_server_service.h"
#include "ps/parameter_shard.h"
#include "worker/grpc_ps_client.h"

namespace paramserver {
namespace {

constexpr int kServers = 2;  // shard b holds bucket b of 2, on server b
constexpr int64_t kEpoch = 1;
constexpr uint64_t kSeed = 17;
// Table C1 is wide, so that its rows fill several of a stream's pages (about
// kExportPageBytes each); C2 is narrow and fits in one.
const std::vector<int> kDims = {256, 2};
constexpr int64_t kWideIds = 20000;  // C1's ids made: [0, kWideIds)
constexpr int64_t kNarrowIds = 50;

float Gradient(int64_t id, int element) {
  return static_cast<float>((id * 7 + element) % 13 - 6) * 0.25f;
}

// A row's value after one SGD step at learning rate 0.5 with Gradient (exact: 0.5 * g is).
float Trained(int table, int64_t id, int element) {
  return InitialEmbeddingValue(kSeed, table, id, element) - 0.5f * Gradient(id, element);
}

// Two servers holding the two embedding shards of a one-worker sync job whose step 0
// made rows [0, kWideIds) of C1 and [0, kNarrowIds) of C2.
class TrainedTables {
 public:
  TrainedTables() {
    std::vector<InProcessServer*> servers;
    for (int b = 0; b < kServers; ++b) {
      InProcessServerOptions server_options;
      server_options.name = absl::StrCat("ps-", b);
      server_options.callers = credentials_.verifier();
      absl::StatusOr<std::unique_ptr<InProcessServer>> server =
          InProcessServer::Start(server_options);
      REQUIRE(server.ok());
      servers_.push_back(*std::move(server));
      servers.push_back(servers_.back().get());
      shards_.push_back(Shard(b));
    }
    map_ = ServeShards(servers, /*num_workers=*/1, shards_);
    REQUIRE(map_.epoch() == kEpoch);
  }

  const ShardMap& map() const { return map_; }
  InProcessServer& server(int b) { return *servers_[b]; }
  ParameterShard& shard(int b) { return *shards_[b]; }

  // A stub to server `b` calling as `node` (no credentials with an empty name).
  std::unique_ptr<ParameterServer::Stub> Stub(int b, const std::string& node) {
    return ParameterServer::NewStub(
        CreateChannel(servers_[b]->address(), node.empty() ? nullptr : TestCredentials::As(node)));
  }

 private:
  // Bucket `bucket`'s shard, trained one step: every id of the bucket below the tables'
  // bounds pushed once with Gradient.
  static std::shared_ptr<ParameterShard> Shard(int bucket) {
    auto embedding = std::make_shared<EmbeddingShardOptions>();
    embedding->shape = {kDims, bucket, kServers};
    for (size_t t = 0; t < kDims.size(); ++t) {
      EmbeddingTableOptions table;
      table.dim = kDims[t];
      table.optimizer.type = EmbeddingOptimizerType::kSgd;
      table.optimizer.learning_rate = 0.5;
      table.init_seed = kSeed;
      table.table_index = static_cast<int>(t);
      embedding->tables.push_back(table);
    }
    ParameterShardOptions options;
    options.shard_id = bucket;
    options.mode = TrainingMode::kSync;
    options.num_workers = 1;
    options.embedding = embedding;
    auto shard = std::make_shared<ParameterShard>(options, std::vector<float>());
    RowIds rows;
    std::vector<float> gradient;
    for (size_t t = 0; t < kDims.size(); ++t) {
      int32_t count = 0;
      for (int64_t id = 0; id < (t == 0 ? kWideIds : kNarrowIds); ++id) {
        if (EmbeddingShardOf(static_cast<int>(t), id, kServers) != bucket) continue;
        rows.ids.push_back(id);
        for (int e = 0; e < kDims[t]; ++e) gradient.push_back(Gradient(id, e));
        ++count;
      }
      rows.counts.push_back(count);
    }
    REQUIRE(shard->PushRows(0, 0, rows.view(), gradient).ok());
    return shard;
  }

  TestCredentials credentials_;
  std::vector<std::unique_ptr<InProcessServer>> servers_;
  std::vector<std::shared_ptr<ParameterShard>> shards_;
  ShardMap map_;
};

ExportRowsRequest Request(int shard, int table, int max_rows) {
  ExportRowsRequest request;
  request.set_shard_id(shard);
  request.set_epoch(kEpoch);
  request.set_worker_rank(0);
  request.set_step(1);
  request.set_table(table);
  request.set_from_start(true);
  request.set_max_rows(max_rows);
  return request;
}

// The stream's pages, and its status.
grpc::Status ReadPages(ParameterServer::Stub& stub, const ExportRowsRequest& request,
                       std::vector<ExportRowsResponse>* pages) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::unique_ptr<grpc::ClientReader<ExportRowsResponse>> reader =
      stub.ExportRows(&context, request);
  ExportRowsResponse page;
  while (reader->Read(&page)) pages->push_back(page);
  return reader->Finish();
}

bool Says(const grpc::Status& status, grpc::StatusCode code, const std::string& text) {
  INFO(status.error_code() << ": " << status.error_message());
  return status.error_code() == code && absl::StrContains(status.error_message(), text);
}

TEST_CASE("a worker exports whole tables: every row once, by id, with its trained values") {
  TrainedTables tables;
  GrpcPsClientOptions options;
  options.total_parameters = 0;
  options.embedding_dims = kDims;
  options.credentials = TestCredentials::As("worker-0");
  const ShardMap map = tables.map();
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Create(options, map, [map]() -> absl::StatusOr<ShardMap> { return map; });
  REQUIRE(client.ok());
  absl::StatusOr<std::vector<TableRows>> exported = (*client)->ExportTables(1);
  REQUIRE(exported.ok());
  REQUIRE(exported->size() == kDims.size());
  for (size_t t = 0; t < kDims.size(); ++t) {
    const TableRows& table = (*exported)[t];
    const int64_t made = t == 0 ? kWideIds : kNarrowIds;
    REQUIRE(static_cast<int64_t>(table.ids.size()) == made);
    REQUIRE(static_cast<int64_t>(table.rows.size()) == made * kDims[t]);
    int64_t wrong = 0;
    for (int64_t i = 0; i < made; ++i) {
      REQUIRE(table.ids[i] == i);
      for (int e = 0; e < kDims[t]; ++e) {
        if (table.rows[i * kDims[t] + e] != Trained(static_cast<int>(t), i, e)) ++wrong;
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("an export streams pages of bounded size, ascending, from any id, the last saying so") {
  TrainedTables tables;
  std::unique_ptr<ParameterServer::Stub> stub = tables.Stub(1, "worker-0");
  // C1's rows of bucket 1, as the server holds them.
  std::vector<int64_t> ours;
  for (int64_t id = 0; id < kWideIds; ++id) {
    if (EmbeddingShardOf(0, id, kServers) == 1) ours.push_back(id);
  }
  const int64_t page_bound =
      ParameterServerServiceImpl::kExportPageBytes / (8 + 4 * static_cast<int64_t>(kDims[0]));
  REQUIRE(static_cast<int64_t>(ours.size()) > 2 * page_bound);  // three pages at least

  const auto check_stream = [&](const ExportRowsRequest& request, int64_t rows_a_page,
                                const std::vector<int64_t>& expected) {
    std::vector<ExportRowsResponse> pages;
    REQUIRE(ReadPages(*stub, request, &pages).ok());
    const size_t page_count =
        std::max<size_t>(1, (expected.size() + static_cast<size_t>(rows_a_page) - 1) / rows_a_page);
    REQUIRE(pages.size() == page_count);
    std::vector<int64_t> ids;
    for (size_t p = 0; p < pages.size(); ++p) {
      absl::StatusOr<std::vector<int64_t>> page_ids = DecodeIds(pages[p].ids());
      REQUIRE(page_ids.ok());
      CHECK(static_cast<int64_t>(page_ids->size()) <= rows_a_page);
      CHECK(pages[p].done() == (p + 1 == pages.size()));
      std::vector<float> rows(page_ids->size() * kDims[0]);
      REQUIRE(DecodeFloatsExactly(pages[p].rows(), absl::MakeSpan(rows), "page").ok());
      for (size_t i = 0; i < page_ids->size(); ++i) {
        CHECK(rows[i * kDims[0]] == Trained(0, (*page_ids)[i], 0));
        CHECK(rows[i * kDims[0] + 255] == Trained(0, (*page_ids)[i], 255));
      }
      ids.insert(ids.end(), page_ids->begin(), page_ids->end());
    }
    CHECK(ids == expected);
  };
  SECTION("the server's page bound, from the start") {
    check_stream(Request(1, 0, 1 << 20), page_bound, ours);
  }
  SECTION("a smaller max_rows, after an id") {
    ExportRowsRequest request = Request(1, 0, 7);
    request.set_from_start(false);
    request.set_after_id(ours[ours.size() - 30]);  // an id held: the 29 after it
    check_stream(request, 7, std::vector<int64_t>(ours.end() - 29, ours.end()));
    request.set_after_id(ours.back() + 1000);  // nothing after: one empty last page
    check_stream(request, 7, {});
  }
}

TEST_CASE("an export is refused for a caller not the worker it names, a stale map or no table") {
  TrainedTables tables;
  std::vector<ExportRowsResponse> pages;
  CHECK(Says(ReadPages(*tables.Stub(0, ""), Request(0, 0, 10), &pages),
             grpc::StatusCode::UNAUTHENTICATED, ""));
  CHECK(Says(ReadPages(*tables.Stub(0, "worker-1"), Request(0, 0, 10), &pages),
             grpc::StatusCode::PERMISSION_DENIED, "worker-1"));
  CHECK(Says(ReadPages(*tables.Stub(0, "ps-1"), Request(0, 0, 10), &pages),
             grpc::StatusCode::PERMISSION_DENIED, ""));
  std::unique_ptr<ParameterServer::Stub> worker = tables.Stub(0, "worker-0");
  ExportRowsRequest stale = Request(0, 0, 10);
  stale.set_epoch(kEpoch - 1);
  CHECK(Says(ReadPages(*worker, stale, &pages), grpc::StatusCode::FAILED_PRECONDITION,
             "stale epoch"));
  CHECK(Says(ReadPages(*worker, Request(1, 0, 10), &pages), grpc::StatusCode::FAILED_PRECONDITION,
             "shard 1"));  // held on the other server
  CHECK(Says(ReadPages(*worker, Request(0, 2, 10), &pages), grpc::StatusCode::INVALID_ARGUMENT,
             "table index 2"));
  CHECK(Says(ReadPages(*worker, Request(0, -1, 10), &pages), grpc::StatusCode::INVALID_ARGUMENT,
             "table index -1"));
  CHECK(pages.empty());
  // The server keeps serving.
  REQUIRE(ReadPages(*worker, Request(0, 1, 10), &pages).ok());
  CHECK(pages.back().done());
}

TEST_CASE("a server streams a few exports at once, and the next once one ends") {
  TrainedTables tables;
  std::unique_ptr<ParameterServer::Stub> worker = tables.Stub(0, "worker-0");
  // Exports of step 5, which the shard has not reached: each waits as a pull would, for
  // 2 s (its deadline).
  struct OpenExport {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<ExportRowsResponse>> reader;
  };
  std::vector<std::unique_ptr<OpenExport>> open;
  ExportRowsRequest ahead = Request(0, 0, 1 << 20);
  ahead.set_step(5);
  for (int i = 0; i < ParameterServerServiceImpl::kMaxExportsAtOnce; ++i) {
    open.push_back(std::make_unique<OpenExport>());
    open.back()->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    open.back()->reader = worker->ExportRows(&open.back()->context, ahead);
  }
  // Once the server has taken them all, one more is refused.
  std::vector<ExportRowsResponse> pages;
  grpc::Status one_more;
  const absl::Time taken_by = absl::Now() + absl::Seconds(2);
  do {
    pages.clear();
    one_more = ReadPages(*worker, Request(0, 1, 10), &pages);
  } while (one_more.ok() && absl::Now() < taken_by);
  CHECK(Says(one_more, grpc::StatusCode::RESOURCE_EXHAUSTED, "already streams 4 exports"));
  for (std::unique_ptr<OpenExport>& waiting : open) {
    CHECK(waiting->reader->Finish().error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // They ended: the next export is served (their handlers may take a moment to return).
  grpc::Status next;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    pages.clear();
    next = ReadPages(*worker, Request(0, 1, 10), &pages);
  } while (next.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && absl::Now() < give_up);
  REQUIRE(next.ok());
  CHECK(pages.back().done());
}

// A server that answers every export with the pages it is given, whatever was asked: a
// peer that breaks the stream's promises.
class ScriptedExports final : public ParameterServer::Service {
 public:
  explicit ScriptedExports(std::vector<ExportRowsResponse> pages) : pages_(std::move(pages)) {}
  grpc::Status ExportRows(grpc::ServerContext*, const ExportRowsRequest*,
                          grpc::ServerWriter<ExportRowsResponse>* writer) override {
    for (const ExportRowsResponse& page : pages_) {
      if (!writer->Write(page)) break;
    }
    return grpc::Status::OK;
  }

 private:
  const std::vector<ExportRowsResponse> pages_;
};

ExportRowsResponse Page(const std::vector<int64_t>& ids, int dim, bool done) {
  ExportRowsResponse page;
  page.set_ids(EncodeIds(ids));
  AppendFloatsLittleEndian(std::vector<float>(ids.size() * dim, 0.5f), page.mutable_rows());
  page.set_done(done);
  return page;
}

// What a worker's export of one table of dim 2 from a server answering with `pages` gives,
// the server holding the table's only shard, or (with two_buckets) both of its shards.
absl::StatusOr<std::vector<TableRows>> ExportFrom(std::vector<ExportRowsResponse> pages,
                                                  bool two_buckets = false) {
  ScriptedExports service(std::move(pages));
  absl::StatusOr<RunningServer> server = StartRpcServer("127.0.0.1:0", {&service});
  REQUIRE(server.ok());
  ShardMap map;
  map.set_epoch(kEpoch);
  map.add_active_workers(true);
  const int buckets = two_buckets ? 2 : 1;
  for (int b = 0; b < buckets; ++b) {
    ShardAssignment* assignment = map.add_shards();
    assignment->set_shard_id(b);
    assignment->set_kind(SHARD_KIND_EMBEDDING_ROWS);
    assignment->set_embedding_bucket(b);
    assignment->set_embedding_buckets(buckets);
    assignment->set_server_name("ps-0");
    assignment->set_server_address(absl::StrCat("127.0.0.1:", server->port));
  }
  GrpcPsClientOptions options;
  options.embedding_dims = {2};
  options.credentials = TestCredentials::As("worker-0");
  absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
      GrpcPsClient::Create(options, map, [map]() -> absl::StatusOr<ShardMap> { return map; });
  REQUIRE(client.ok());
  absl::StatusOr<std::vector<TableRows>> exported = (*client)->ExportTables(1);
  client->reset();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return exported;
}

bool Refused(const absl::StatusOr<std::vector<TableRows>>& exported, const std::string& text) {
  INFO(exported.status());
  return !exported.ok() &&
         absl::StrContains(exported.status().message(),
                           "export of table C1 from shard 0 on ps-0") &&
         absl::StrContains(exported.status().message(), text);
}

TEST_CASE("a worker refuses an export stream that breaks its promises, naming what broke") {
  // Kept whole: ascending pages, the last saying so.
  absl::StatusOr<std::vector<TableRows>> kept =
      ExportFrom({Page({1, 4}, 2, false), Page({}, 2, false), Page({9}, 2, true)});
  REQUIRE(kept.ok());
  CHECK((*kept)[0].ids == std::vector<int64_t>{1, 4, 9});
  CHECK((*kept)[0].rows == std::vector<float>(6, 0.5f));
  CHECK(Refused(ExportFrom({Page({1, 4}, 2, false), Page({4, 5}, 2, true)}),
                "id 4 after 4: the pages' ids must ascend"));
  CHECK(Refused(ExportFrom({Page({3, 2}, 2, true)}), "id 2 after 3"));
  CHECK(Refused(ExportFrom({Page({1}, 2, false)}), "the stream ended before its last page"));
  int64_t of_bucket_1 = 0;
  while (EmbeddingShardOf(0, of_bucket_1, 2) != 1) ++of_bucket_1;
  CHECK(Refused(ExportFrom({Page({of_bucket_1}, 2, true)}, /*two_buckets=*/true),
                absl::StrCat("id ", of_bucket_1, " is not of the shard's bucket 0 of 2")));
  CHECK(Refused(ExportFrom({Page({1}, 2, true), Page({2}, 2, true)}),
                "a page after the one that said it was the last"));
  CHECK(Refused(ExportFrom({Page({1}, 3, true)}), "12 bytes for 1 rows of dim 2"));
  std::vector<int64_t> too_many(GrpcPsClient::kExportPageRows + 1);
  for (size_t i = 0; i < too_many.size(); ++i) too_many[i] = static_cast<int64_t>(i);
  CHECK(Refused(ExportFrom({Page(too_many, 2, true)}), "ids; at most"));
}

}  // namespace
}  // namespace paramserver
