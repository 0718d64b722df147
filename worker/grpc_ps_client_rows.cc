// GrpcPsClient's embedding rows: routing a batch's ids to their shards, pulling and
// pushing rows, the first values of a torch model, and exporting whole tables.
#include <algorithm>
#include <future>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/rpc/progress_watchdog.h"
#include "common/rpc/retry_policy.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/rpc/rpc_status.h"
#include "common/wire/shard_call_codec.h"
#include "common/wire/shard_layout.h"
#include "common/wire/tensor_codec.h"
#include "spdlog/spdlog.h"
#include "worker/grpc_ps_client.h"

namespace paramserver {

absl::StatusOr<GrpcPsClient::RowRouting> GrpcPsClient::RouteRows(
    absl::Span<const std::vector<int64_t>> ids) const {
  const std::vector<int>& dims = options_.embedding_dims;
  if (ids.size() > dims.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows of ", ids.size(), " tables; the model has ", dims.size()));
  }
  RowRouting routing;
  routing.buckets.resize(embedding_buckets_);
  routing.origin.resize(embedding_buckets_);
  routing.values.resize(embedding_buckets_);
  for (RowIds& bucket : routing.buckets) bucket.counts.assign(dims.size(), 0);
  std::vector<int64_t> floats(embedding_buckets_, 0);
  for (size_t t = 0; t < ids.size(); ++t) {
    // Ascending in, ascending out: each bucket's part of a table stays sorted.
    for (size_t i = 0; i < ids[t].size(); ++i) {
      const int b = EmbeddingShardOf(static_cast<int>(t), ids[t][i], embedding_buckets_);
      routing.buckets[b].ids.push_back(ids[t][i]);
      ++routing.buckets[b].counts[t];
      floats[b] += dims[t];
      routing.origin[b].emplace_back(static_cast<int32_t>(t), static_cast<int32_t>(i));
    }
  }
  for (int b = 0; b < embedding_buckets_; ++b) {
    routing.values[b].resize(floats[b]);
  }
  return routing;
}

absl::StatusOr<GrpcPsClient::RoutedPush> GrpcPsClient::RoutePush(const StepPush& push) const {
  const std::vector<int>& dims = options_.embedding_dims;
  if (push.row_gradients.size() != push.ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a push of ", push.ids.size(),
                                                   " tables' ids with ", push.row_gradients.size(),
                                                   " tables' row gradients"));
  }
  RoutedPush routed{&push, {}, {}};
  PS_ASSIGN_OR_RETURN(routed.rows, RouteRows(push.ids));
  for (size_t t = 0; t < push.ids.size(); ++t) {
    if (push.row_gradients[t].size() != push.ids[t].size() * dims[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("table C", t + 1, ": ", push.row_gradients[t].size(),
                       " row gradient values for ", push.ids[t].size(), " rows of ", dims[t]));
    }
  }
  GatherRowGradients(push.row_gradients, &routed.rows);
  if (push.next.has_value()) {
    if (push.next->rows.size() != push.next->ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a pull of ", push.next->ids.size(),
                                                     " tables' rows into ", push.next->rows.size(),
                                                     " tables"));
    }
    PS_ASSIGN_OR_RETURN(routed.next_rows, RouteRows(push.next->ids));
  } else {
    PS_ASSIGN_OR_RETURN(routed.next_rows, RouteRows({}));
  }
  return routed;
}

void GrpcPsClient::SetRowIds(const ShardAssignment& shard, const RowRouting& routing,
                             google::protobuf::RepeatedField<int32_t>* counts,
                             std::string* ids) const {
  if (shard.kind() != SHARD_KIND_EMBEDDING_ROWS) return;
  const RowIds& bucket = routing.buckets[shard.embedding_bucket()];
  counts->Add(bucket.counts.begin(), bucket.counts.end());
  *ids = EncodeIds(bucket.ids);
}

void GrpcPsClient::ScatterRows(const RowRouting& routing,
                               absl::Span<const std::vector<int64_t>> ids,
                               absl::Span<std::vector<float>> rows) const {
  const std::vector<int>& dims = options_.embedding_dims;
  for (size_t t = 0; t < ids.size(); ++t) rows[t].resize(ids[t].size() * dims[t]);
  for (int b = 0; b < embedding_buckets_; ++b) {
    size_t offset = 0;  // rows of several tables, each its own width, back to back
    for (const auto& [table, index] : routing.origin[b]) {
      const size_t dim = dims[table];
      std::copy(routing.values[b].begin() + offset, routing.values[b].begin() + offset + dim,
                rows[table].begin() + static_cast<size_t>(index) * dim);
      offset += dim;
    }
  }
}

void GrpcPsClient::GatherRowGradients(absl::Span<const std::vector<float>> row_gradients,
                                      RowRouting* routing) const {
  const std::vector<int>& dims = options_.embedding_dims;
  for (int b = 0; b < embedding_buckets_; ++b) {
    size_t offset = 0;
    for (const auto& [table, index] : routing->origin[b]) {
      const size_t dim = dims[table];
      const std::vector<float>& from = row_gradients[table];
      std::copy(from.begin() + static_cast<size_t>(index) * dim,
                from.begin() + static_cast<size_t>(index + 1) * dim,
                routing->values[b].begin() + offset);
      offset += dim;
    }
  }
}

absl::Status GrpcPsClient::SetInitialValues(absl::Span<const float> values) {
  if (values.size() != static_cast<size_t>(options_.total_parameters)) {
    return absl::InvalidArgumentError(absl::StrCat(values.size(), " initial values for ",
                                                   options_.total_parameters, " parameters"));
  }
  for (const ShardAssignment& shard : shards_) {
    if (shard.kind() != SHARD_KIND_DENSE_RANGE) continue;
    auto server =
        ParameterServer::NewStub(CreateChannel(shard.server_address(), options_.credentials));
    SetInitialValuesRequest request;
    request.set_shard_id(shard.shard_id());
    request.set_epoch(epoch_);
    request.set_worker_rank(options_.worker_rank);
    AppendFloatsLittleEndian(values.subspan(shard.begin(), shard.end() - shard.begin()),
                             request.mutable_values());
    grpc::ClientContext context;
    // The server acknowledges once its backups hold the values too.
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + options_.push_timeout + absl::Seconds(10)));
    SetInitialValuesResponse response;
    const grpc::Status status = server->SetInitialValues(&context, request, &response);
    if (!status.ok()) {
      return RpcError(status,
                      absl::StrCat("set the initial values of shard ", shard.shard_id(), " on ",
                                   shard.server_name(), " (", shard.server_address(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status GrpcPsClient::ReadExportedRows(ParameterServer::Stub& server,
                                            const ShardAssignment& shard,
                                            const ExportRowsRequest& request, int dim,
                                            TableRows* table) const {
  const std::string what =
      absl::StrCat("export of table C", request.table() + 1, " from shard ", shard.shard_id(),
                   " on ", shard.server_name(), " (", shard.server_address(), ")");
  absl::Status refused;  // a page that breaks the stream's promises
  bool done = false;
  // The last id taken (the request's after_id, unless from the start): the next must exceed it.
  std::optional<int64_t> last_id;
  if (!request.from_start()) last_id = request.after_id();
  grpc::ClientContext context;
  // The export's length depends on the table's size: what bounds it is the wait for
  // each page (a pull's, and the table's listing before the first); the call's own
  // deadline is a backstop.
  context.set_deadline(absl::ToChronoTime(absl::Now() + kExportBound));
  ProgressWatchdog watchdog(options_.pull_timeout + kExportPageStall,
                            [&context] { context.TryCancel(); });
  std::unique_ptr<grpc::ClientReader<ExportRowsResponse>> reader =
      server.ExportRows(&context, request);
  ExportRowsResponse page;
  while (reader->Read(&page)) {
    // Progress is rows, or the last page; not empty pages.
    if (!page.ids().empty() || page.done()) watchdog.Progress();
    if (!refused.ok()) continue;
    absl::StatusOr<std::vector<int64_t>> ids = DecodeIds(page.ids(), request.max_rows());
    if (!ids.ok()) {
      refused = ids.status();
    } else if (done) {
      refused = absl::InvalidArgumentError("a page after the one that said it was the last");
    } else {
      for (const int64_t id : *ids) {
        if (last_id.has_value() && id <= *last_id) {
          refused = absl::InvalidArgumentError(
              absl::StrCat("id ", id, " after ", *last_id, ": the pages' ids must ascend"));
          break;
        }
        if (EmbeddingShardOf(request.table(), id, shard.embedding_buckets()) !=
            shard.embedding_bucket()) {
          refused = absl::InvalidArgumentError(
              absl::StrCat("id ", id, " is not of the shard's bucket ", shard.embedding_bucket(),
                           " of ", shard.embedding_buckets()));
          break;
        }
        last_id = id;
      }
    }
    if (refused.ok() && page.rows().size() != ids->size() * dim * sizeof(float)) {
      // Checked before anything is allocated for them.
      refused = absl::InvalidArgumentError(absl::StrCat(
          "a page's rows: ", page.rows().size(), " bytes for ", ids->size(), " rows of dim ", dim));
    }
    if (refused.ok()) {
      const size_t at = table->rows.size();
      table->rows.resize(at + ids->size() * dim);
      DecodeFloatsLittleEndian(page.rows(), table->rows.data() + at);
      table->ids.insert(table->ids.end(), ids->begin(), ids->end());
      done = page.done();
    }
    if (!refused.ok()) context.TryCancel();
  }
  watchdog.Stop();
  const bool stalled = watchdog.fired();
  const grpc::Status status = reader->Finish();
  if (!refused.ok())
    return absl::Status(refused.code(), absl::StrCat(what, ": ", refused.message()));
  if (status.ok() && done) return absl::OkStatus();
  if (stalled) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": no page for ", absl::FormatDuration(options_.pull_timeout + kExportPageStall)));
  }
  if (!status.ok()) return RpcError(status, what);
  return absl::InvalidArgumentError(absl::StrCat(what, ": the stream ended before its last page"));
}

absl::StatusOr<std::vector<TableRows>> GrpcPsClient::ExportTables(int64_t step) {
  const std::vector<int>& dims = options_.embedding_dims;
  const int table_count = static_cast<int>(dims.size());
  std::vector<TableRows> tables(table_count);
  for (const ShardAssignment& shard : shards_) {
    if (shard.kind() != SHARD_KIND_EMBEDDING_ROWS) continue;
    auto server =
        ParameterServer::NewStub(CreateChannel(shard.server_address(), options_.credentials));
    for (int t = 0; t < table_count; ++t) {
      ExportRowsRequest request;
      request.set_shard_id(shard.shard_id());
      request.set_epoch(epoch_);
      request.set_worker_rank(options_.worker_rank);
      request.set_step(step);
      request.set_table(t);
      request.set_from_start(true);
      request.set_max_rows(kExportPageRows);
      PS_RETURN_IF_ERROR(ReadExportedRows(*server, shard, request, dims[t], &tables[t]));
    }
  }
  for (int t = 0; t < table_count; ++t) SortTableRows(dims[t], &tables[t]);
  return tables;
}

}  // namespace paramserver
