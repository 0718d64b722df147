// PsClient over gRPC: one call per server (every shard it holds, batched), all servers in
// parallel.
#ifndef PARAMSERVER_WORKER_GRPC_PS_CLIENT_H_
#define PARAMSERVER_WORKER_GRPC_PS_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/embedding_init.h"
#include "common/security/peer_credentials.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/parameter_server.grpc.pb.h"
#include "proto/scheduler.pb.h"
#include "worker/ps_client.h"
#include "worker/rpc_fault_injector.h"

namespace paramserver {

struct GrpcPsClientOptions {
  int worker_rank = 0;
  int64_t total_parameters = 0;
  // The model's embedding tables: each one's rows' width, in table order (empty: no
  // tables).
  std::vector<int> embedding_dims;
  // The longest one pull RPC may wait (for the other workers, in sync and ssp); a
  // stopped server is noticed no later than this.
  absl::Duration pull_timeout = absl::Seconds(6);
  // Per-attempt timeout of a push.
  absl::Duration push_timeout = absl::Seconds(3);
  // How tensors travel (training.wire_dtype).
  WireDtype wire_dtype = WireDtype::kFloat32;
  // training.embedding_mode async: the embedding shards count pushes, not the job's
  // steps, so StartStep and last_push() read the dense shards alone.
  bool async_tables = false;
  // UNAVAILABLE calls are retried with backoff (20 ms, then 40) for this long before
  // the error returns; the caller then waits on the scheduler for a new map
  // (WaitForRecovery), which is where a worker whose server died should spend its time.
  absl::Duration retry_deadline = absl::Milliseconds(100);
  // A streamed push sends the shards that backpropagation finished once they hold at
  // least this many values (training.push_bucket_kb); whatever is left goes when the
  // gradient is complete.
  int64_t push_bucket_values = 256 * 1024;
  // The scheduler's map once its epoch is above the first argument, or after the
  // wait (SchedulerClient::AwaitMapChange). Null: AwaitShardMapChange polls.
  std::function<absl::StatusOr<ShardMap>(int64_t epoch, absl::Duration wait)> await_map;
  // Test only: faults injected into every pull and push (null: none).
  std::shared_ptr<RpcFaultInjector> faults;
  // What every call carries: the cluster token and this worker's credential (null:
  // nothing, and servers refuse the calls).
  std::shared_ptr<const CallCredentials> credentials;
  // Set (by the worker's heartbeat thread) when the scheduler re-admitted this worker
  // after declaring it dead: the next refresh that finds it active again continues at
  // its slot's present step (StartStep), not at the stale step it was stopped at. Null:
  // never.
  std::shared_ptr<std::atomic<bool>> rejoin_pending;
};

// The shards one server holds, reached with one call per pull or push.
struct ServerGroup {
  grpc::GenericStub* stub;  // PullShards and PushShards in their hand-made wire forms
  std::string server_name;
  std::string server_address;
  std::vector<size_t> shard_indices;  // into the shard map's shards, in map order
  std::vector<int> shard_ids;
};

// Thread-compatible: one caller at a time (a streamed push's own threads are its own).
class GrpcPsClient final : public PsClient {
 public:
  // `fetch_map` returns the scheduler's current shard map. INVALID_ARGUMENT if
  // `shard_map`'s dense-range shards do not cover [0, total_parameters) exactly, or its
  // embedding shards are not each bucket of one cut once (or there are any, for a model
  // without tables).
  static absl::StatusOr<std::unique_ptr<GrpcPsClient>> Create(
      GrpcPsClientOptions options, const ShardMap& shard_map,
      std::function<absl::StatusOr<ShardMap>()> fetch_map);

  absl::Status Pull(const StepPull& pull) override;
  absl::StatusOr<bool> Push(const StepPush& push) override;
  // Each bucket of finished shards that Ready sends leaves on a thread of its own (one
  // call per server holding some of them, retried like Push's); Finish sends the rest
  // on the caller's thread and waits for them all. INVALID_ARGUMENT at Finish when
  // `push` carries rows or asks for the next step's.
  std::unique_ptr<StreamedPush> StartStreamedPush(const StepPush& push) override;
  absl::StatusOr<ShardMapUpdate> RefreshShardMap() override;
  // With options.await_map: a long poll on the scheduler for a map newer than this
  // client's. Without: PsClient's.
  absl::StatusOr<ShardMapUpdate> AwaitShardMapChange(absl::Duration wait) override;
  absl::StatusOr<int64_t> StartStep() override;
  int64_t rejoins() const override { return rejoins_; }
  PushAcknowledgement last_push() const override { return last_push_; }

  // Every row of every table as of step `step` (waiting as a pull would), streamed from
  // each embedding shard a page at a time (ExportRows), sorted by id: for
  // output.weights. The whole tables are in memory then. Each page with rows (or the
  // last) must follow the one before within pull_timeout + kExportPageStall; a page
  // that breaks the stream's promises (ids ascending and of the shard's bucket, rows of
  // the table's dim, a last page) ends it. Errors name the shard and server.
  absl::StatusOr<std::vector<TableRows>> ExportTables(int64_t step);
  // An export's pages: at most this many rows each (the server caps them by bytes too).
  static constexpr int kExportPageRows = 1 << 18;
  // The wait for each page (one with rows, or the last) beyond a pull's, and the
  // backstop of each stream (one a shard and table).
  static constexpr absl::Duration kExportPageStall = absl::Seconds(30);
  static constexpr absl::Duration kExportBound = absl::Hours(1);

  // model.type torch, from the worker that declared the model: gives every dense shard
  // its slice of `values` (total_parameters of them), which its servers' pulls wait
  // for. A shard that has values already keeps them. Errors name the shard and server;
  // a map change may cure UNAVAILABLE and FAILED_PRECONDITION (refresh and call again).
  absl::Status SetInitialValues(absl::Span<const float> values);

 private:
  // One step's rows, cut by embedding shard: each bucket's ids (table by table) and
  // where each came from, with the bucket's pulled rows or pushed gradients. A client
  // without tables has no buckets.
  struct RowRouting {
    std::vector<RowIds> buckets;
    std::vector<std::vector<std::pair<int32_t, int32_t>>> origin;  // (table, index in ids[t])
    std::vector<std::vector<float>> values;
  };
  // What the replies to a push's calls said: how many shards sent step + 1's values, and
  // the acknowledgement.
  struct PushReplies {
    size_t shards_pulled = 0;
    PushAcknowledgement acknowledgement;
    void Add(const PushReplies& other);
  };
  // A push cut by embedding shard: its rows' gradients, and the rows its reply brings.
  struct RoutedPush {
    const StepPush* push;
    RowRouting rows;
    RowRouting next_rows;
  };
  // One table's export from one shard (ExportTables): its pages appended to *table.
  absl::Status ReadExportedRows(ParameterServer::Stub& server, const ShardAssignment& shard,
                                const ExportRowsRequest& request, int dim, TableRows* table) const;
  // INVALID_ARGUMENT when `ids` names more tables than the model has.
  absl::StatusOr<RowRouting> RouteRows(absl::Span<const std::vector<int64_t>> ids) const;
  // Whether `shard` applies the job's steps (not a hybrid job's async table).
  bool CountsSteps(const ShardAssignment& shard) const;
  // RouteRows of the push's ids with their gradients gathered (INVALID_ARGUMENT when a
  // table's gradients are not ids[t].size() x dim), and of the next step's ids.
  absl::StatusOr<RoutedPush> RoutePush(const StepPush& push) const;
  // Sets an embedding shard's ids on a request part: the routed ones.
  void SetRowIds(const ShardAssignment& shard, const RowRouting& routing,
                 google::protobuf::RepeatedField<int32_t>* counts, std::string* ids) const;
  friend class GrpcStreamedPush;
  GrpcPsClient(GrpcPsClientOptions options, std::function<absl::StatusOr<ShardMap>()> fetch_map);
  absl::Status Route(const ShardMap& shard_map);
  // Routes by `map` when it is not the one routed by already, and says what changed
  // (RefreshShardMap's answer).
  absl::StatusOr<ShardMapUpdate> FollowMap(const ShardMap& map);
  // When FollowMap last moved to a new map.
  absl::Time followed_map_at_ = absl::InfinitePast();
  // Pulls every shard for `step`, the dense values into `params` and the embedding
  // shards' into routing->values; collects the shards' start steps when asked.
  // `clip_coefficient` (0: none): the dense shards first apply their held step - 1
  // with it (StepPull's).
  absl::Status PullShards(int64_t step, absl::Span<float> params, RowRouting* routing,
                          std::vector<int64_t>* start_steps, float clip_coefficient = 0);
  // The destinations of `group`'s shards within `flat` (empty spans when `flat` is
  // empty: no values expected); an embedding shard's, routing->values.
  std::vector<absl::Span<float>> ShardSpans(const ServerGroup& group, absl::Span<float> flat,
                                            RowRouting* routing) const;
  // groups_ cut down to the shards shards_[first, last).
  std::vector<ServerGroup> GroupsOfShards(size_t first, size_t last) const;
  // Pushes the shards of `groups`, each with its part of `routed`; with push->next,
  // asks each for step + 1's values too (the dense ones into push->next->params, the
  // rows into routed->next_rows); returns how many shards sent them (else 0) and their
  // lowest update count. With
  // push->clip_grad_norm, *push->step_sum_squares gets the dense shards' sums.
  // Thread-safe for disjoint `groups` as long as the shard map does not change.
  absl::StatusOr<PushReplies> PushShards(const std::vector<ServerGroup>& groups,
                                         RoutedPush* routed) const;
  // A routing's rows into rows[t] (ids[t].size() x dim each), and row gradients into a
  // routing's buckets.
  void ScatterRows(const RowRouting& routing, absl::Span<const std::vector<int64_t>> ids,
                   absl::Span<std::vector<float>> rows) const;
  void GatherRowGradients(absl::Span<const std::vector<float>> row_gradients,
                          RowRouting* routing) const;

  const GrpcPsClientOptions options_;
  const std::function<absl::StatusOr<ShardMap>()> fetch_map_;
  int64_t epoch_ = 0;
  int64_t rewind_epoch_seen_ = 0;
  int64_t rejoins_ = 0;
  PushAcknowledgement last_push_;
  std::vector<ShardAssignment> shards_;
  int embedding_buckets_ = 0;        // of the map's cut of the key space (0: no embedding shards)
  std::vector<ServerGroup> groups_;  // shards_ by server: one call each
  std::map<std::string, std::unique_ptr<grpc::GenericStub>> stubs_;  // by server address
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_GRPC_PS_CLIENT_H_
