// The gRPC face of a parameter server: validates each request (epoch, shard, sizes)
// and hands it to the ParameterShard that holds the data. No training logic here.
#ifndef PARAMSERVER_PS_PARAMETER_SERVER_SERVICE_H_
#define PARAMSERVER_PS_PARAMETER_SERVER_SERVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/ops/metrics.h"
#include "common/security/peer_credentials.h"
#include "common/security/refusal_log.h"
#include "common/wire/shard_call_codec.h"
#include "common/wire/tensor_codec.h"
#include "proto/parameter_server.grpc.pb.h"
#include "ps/buffer_pool.h"
#include "ps/call_executor.h"
#include "ps/checkpoint_writer.h"
#include "ps/parameter_shard.h"
#include "ps/replica_applier.h"
#include "ps/shard_replicator.h"

namespace paramserver {

// A shard as this server serves it: as its primary (pulls and pushes, forwarding each
// mutation to the backups through `replicator`) or as a backup of `primary_name`
// (only that server's Replicate calls).
struct ServedShard {
  std::shared_ptr<ParameterShard> shard;
  bool primary = true;
  std::string primary_name;
  std::shared_ptr<ShardReplicator> replicator;  // primaries with backups; else null
  // A primary: the first epoch since which this server has served it as now (the same
  // shard object, primary here, with the same live workers). A worker's call routed
  // with any map from then on reaches it; one routed before is refused as stale. 0:
  // the epoch InstallShards serves.
  int64_t routed_since = 0;
};

// Called for InstallShardMap; returns the epoch now served, or why the map could not
// be installed.
using ShardMapInstaller = std::function<absl::StatusOr<int64_t>(const ShardMap&)>;

// The trailing metadata key under which FetchShardState's stale-epoch and
// not-the-primary refusals name the epoch the primary serves (decimal): a backup asking under an
// older map learns that a newer one exists, and leaves the copy to that map's install, instead of
// failing its own.
inline constexpr char kServingEpochMetadata[] = "ps-serving-epoch";

// The epoch a finished FetchShardState call's refusal named (kServingEpochMetadata); 0
// where it named none, or not a number.
int64_t ServingEpochNamed(const grpc::ClientContext& finished);

// Thread-safe. Until InstallShards is called every request gets UNAVAILABLE.
//
// Who may call what (docs/SECURITY.md), checked by `callers` before anything else of a
// request is trusted: every call needs the cluster token (UNAUTHENTICATED); pulls and
// pushes come from the worker whose rank each part names, InstallShardMap and
// CheckpointAt from the scheduler, Replicate from the primary each batch names and
// FetchShardState from a server (PERMISSION_DENIED otherwise). A credential this
// server cannot place, on a request for an epoch newer than it serves, may belong to
// a node registered since: that is answered as the newer epoch is (retry).
class ParameterServerServiceImpl final : public ParameterServer::Service {
 public:
  // `callers` (not owned, outlives this) checks every caller.
  // `max_pull_wait` caps how long a pull waits, whatever deadline the caller set.
  // `checkpoints` (may be null: no checkpoints) receives the snapshots pushes produce.
  // `installer` handles InstallShardMap (may be empty until set_installer).
  // `metrics` (may be null) receives the request counts, bytes and latencies.
  // At most `max_waiting_pulls` pulls are served at once (each holds a thread while it
  // waits for its step); more are refused with RESOURCE_EXHAUSTED.
  // `replica_apply_hold` (tests only; zero in production) holds each backup shard's
  // received entries that long before they apply (ReplicaApplier).
  ParameterServerServiceImpl(const CallerVerifier* callers, absl::Duration max_pull_wait,
                             CheckpointWriter* checkpoints, MetricsRegistry* metrics = nullptr,
                             int max_waiting_pulls = kDefaultMaxWaitingPulls,
                             absl::Duration replica_apply_hold = absl::ZeroDuration());
  static constexpr int kDefaultMaxWaitingPulls = 256;

  void set_installer(ShardMapInstaller installer) ABSL_LOCKS_EXCLUDED(mu_);

  // Serves `shards` (keyed by shard id) at shard-map epoch `epoch` from now on, as
  // `node_name` (used in error messages). Shards no longer served are not closed here.
  // Shards in `copying` are backups still copying their state: Replicate calls for
  // them get UNAVAILABLE until FinishCopy.
  void InstallShards(const std::string& node_name, int64_t epoch, std::map<int, ServedShard> shards,
                     std::set<int> copying = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // A map of `epoch` is being installed: a call of an older epoch whose shard closed
  // meanwhile (handed over, moved) is answered stale-epoch already (StaleIfRemapped).
  void BeginInstall(int64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // Serves backup `shard` (copied from its primary) at `epoch`, if that is still the
  // epoch served; false otherwise (a newer map came in meanwhile).
  bool FinishCopy(int64_t epoch, int shard_id, ServedShard shard) ABSL_LOCKS_EXCLUDED(mu_);
  // The only worker whose SetInitialValues calls are taken (ShardMap.initial_values_from;
  // empty: none).
  void set_initial_values_from(const std::string& node_name) ABSL_LOCKS_EXCLUDED(mu_);

  // Closes every shard: waiting pulls return UNAVAILABLE at once.
  void CloseShards() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t epoch() const ABSL_LOCKS_EXCLUDED(mu_);
  std::map<int, ServedShard> shards() const ABSL_LOCKS_EXCLUDED(mu_);

  // Requests refused before reaching a shard (stale epoch, unknown shard, bad bytes).
  int64_t rejected_requests() const ABSL_LOCKS_EXCLUDED(mu_);
  // Data calls that their callers ended (cancelled, or past their deadline) before they
  // were served: not refusals, and not counted in rejected_requests().
  int64_t cancelled_calls() const {
    return cancellations_.count("PullShards") + cancellations_.count("PushShards");
  }

  // An embedding shard's rows of one table after the request's id, ascending, streamed a
  // page at a time, for the worker whose rank the request names (the finisher writing
  // output.weights). Waits once as a pull for the request's step does; the ids are
  // listed and sorted once (ParameterShard::ExportRowIds), then each page's rows are
  // read under the shard's lock for that page alone (ExportRowsOf), from the shard this
  // server still serves as primary at the request's epoch. A page holds at most the
  // request's max_rows (when positive), kMaxExportRows and about kExportPageBytes; a
  // row evicted meanwhile is left out. The last page says done. At most
  // kMaxExportsAtOnce run at once (RESOURCE_EXHAUSTED past them); the pull slot the
  // wait takes is given back once the ids are listed. Stops when the worker goes away,
  // or has not taken a page for kExportWriteStall (CANCELLED).
  grpc::Status ExportRows(grpc::ServerContext* context, const ExportRowsRequest* request,
                          grpc::ServerWriter<ExportRowsResponse>* writer) override;
  grpc::Status SetInitialValues(grpc::ServerContext* context,
                                const SetInitialValuesRequest* request,
                                SetInitialValuesResponse* response) override;
  static constexpr int64_t kMaxExportRows = 1 << 18;
  static constexpr int64_t kExportPageBytes = 4 << 20;
  static constexpr int kMaxExportsAtOnce = 4;
  static constexpr absl::Duration kExportWriteStall = absl::Seconds(60);
  // ParameterServerData's calls, many shards of this server in one call, as bytes
  // (common/wire/shard_call_codec.h): each part (a PullRequest or a PushRequest) is served on its
  // own, and the first part that fails fails the call (parts before it stand: a retried push is a
  // duplicate). Push parts are all accepted before any is acknowledged. A gradient
  // goes from gRPC's slices into the shard's buffer in one copy; values go out in the
  // buffer the shard wrote them to.
  grpc::Status PullShards(grpc::ServerContextBase* context, const grpc::ByteBuffer* request,
                          grpc::ByteBuffer* response);
  grpc::Status PushShards(grpc::ServerContextBase* context, const grpc::ByteBuffer* request,
                          grpc::ByteBuffer* response);
  // What a gRPC server must register to serve this: this (ParameterServer) and the
  // ParameterServerData calls above.
  std::vector<grpc::Service*> rpc_services() { return {this, data_service_.get()}; }
  grpc::Status InstallShardMap(grpc::ServerContext* context, const InstallShardMapRequest* request,
                               InstallShardMapResponse* response) override;
  grpc::Status CheckpointAt(grpc::ServerContext* context, const CheckpointAtRequest* request,
                            CheckpointAtResponse* response) override;
  // Backups: takes each shard's log entries in order into memory (see ShardLogBatch) and
  // answers once they are there, each result naming the newest index received; the
  // entries apply on the replica appliers' threads meanwhile, and before the shard is
  // promoted. One result per batch, in order. The call itself always succeeds.
  grpc::Status Replicate(grpc::ServerContext* context, const ReplicateRequest* request,
                         ReplicateResponse* response) override;
  // Primaries: the shard's whole state for a new backup, at the epoch served.
  // Streams the shard's state to a new backup in pieces (WriteReplicaStatePieces), so a
  // shard of any size can be copied: one copy of it, taken under the shard's lock with
  // its rows as stored and their recency links (ExportReplicaAsStored), sent as it is;
  // the backup orders the rows. Stops when the backup goes away. Its stale-epoch and
  // not-the-primary refusals carry the epoch served under kServingEpochMetadata.
  grpc::Status FetchShardState(grpc::ServerContext* context, const FetchShardStateRequest* request,
                               grpc::ServerWriter<ShardStatePiece>* writer) override;

 private:
  // The primary shard for a request routed with `epoch`, or FAILED_PRECONDITION (stale
  // epoch, not held, held as a backup) / UNAVAILABLE (no shards yet).
  absl::StatusOr<ServedShard> FindPrimary(int shard_id, int64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // FindPrimary's answer to a call for shard `shard_id` routed with `epoch`, an epoch
  // it is not served at: UNAVAILABLE before the first map, else FAILED_PRECONDITION
  // (stale or future epoch; refresh the map). Never OK.
  absl::Status EpochRefusalLocked(int shard_id, int64_t epoch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A call routed with `epoch` that failed UNAVAILABLE (its shard closed while it waited)
  // after a newer map came in (or began installing): the stale-epoch FAILED_PRECONDITION
  // FindPrimary gives, so that the worker refreshes its map at once rather than retrying
  // after a pause.
  absl::Status StaleIfRemapped(absl::Status status, int shard_id, int64_t epoch) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A data call, checked before any part is served: the caller is a worker acting as
  // the rank of every part (the refusal otherwise: see the class comment), and the
  // parts name distinct shards, no more than this server holds at the epoch they were
  // routed with (INVALID_ARGUMENT; parts of another epoch are refused as such later).
  // Refusals are counted and logged.
  struct DataPart {
    int shard_id;
    int worker_rank;
    int64_t epoch;
  };
  // EpochRefusalLocked's answer for the first of `parts` routed with a map newer than
  // the one served (found under one lock); OK if none is.
  absl::Status RefuseRoutedAhead(const std::vector<DataPart>& parts) const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits (until `deadline`, kNewerMapWait at most) while some part is routed with a map
  // newer than the one served; returns whether any was. Not before the first map.
  bool AwaitMapOf(const std::vector<DataPart>& parts, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // OK unless the data call `method` was cancelled by its caller (or ended before its
  // request arrived): then CANCELLED, counted in ps_cancelled_calls_total{kind=method}
  // and logged at info (rate-limited), never as a refusal.
  absl::Status CheckNotCancelled(const grpc::ServerContextBase& context,
                                 const grpc::ByteBuffer& request, const char* method);
  absl::Status CheckDataCall(const grpc::ServerContextBase& context,
                             const std::vector<DataPart>& parts, const char* what)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The caller of a call between servers (Replicate, FetchShardState) or from the
  // scheduler (`role` UNSPECIFIED). An unplaceable credential on a request for an epoch
  // newer than served is UNAVAILABLE.
  absl::StatusOr<VerifiedCaller> CheckPeerCall(const grpc::ServerContext& context, NodeRole role,
                                               int64_t epoch, const char* what)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a refusal and logs it (rate-limited, RefusalLog) for the caller of `context`,
  // or for address `peer`; returns it as the call's status.
  grpc::Status Reject(const absl::Status& status, const grpc::ServerContextBase& context)
      ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Reject(const absl::Status& status, const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status RejectFrom(const absl::Status& status, const std::string& caller)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The deadline of a pull served in this call: the caller's, capped by max_pull_wait.
  absl::Time PullDeadline(const grpc::ServerContextBase& context) const;
  // A reply's values: shared with the shard when `shared` is set and they travel as
  // float32 on a little-endian host (no copy), else encoded into `bytes`.
  struct OutgoingValues {
    std::string* bytes;
    std::shared_ptr<const std::vector<float>>* shared = nullptr;
    size_t size() const {
      return shared != nullptr && *shared != nullptr ? (*shared)->size() * sizeof(float)
                                                     : bytes->size();
    }
  };
  // A pull's clip_coefficient: applies the shard's held step (request.step - 1) with it,
  // writes its checkpoint if due, and waits until the backups hold it.
  absl::Status ApplyClippedStep(const ServedShard& served, const PullRequest& request,
                                absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Fills `response` but its values, which go to `values`.
  grpc::Status ServePull(const PullRequest& request, absl::Time deadline, const std::string& peer,
                         PullResponse* response, OutgoingValues values) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes one of the max_waiting_pulls slots for a pull about to be served (and maybe
  // wait); RESOURCE_EXHAUSTED when all are taken. ReturnPullSlot gives it back.
  absl::Status TakePullSlot();
  void ReturnPullSlot() { waiting_pulls_.fetch_sub(1, std::memory_order_relaxed); }
  // ParameterShard::PullShared or PullInto, as `values` asks; for an embedding shard,
  // PullRowsInto the rows of `rows`.
  static absl::Status PullValues(ParameterShard& shard, int worker_rank, int64_t step,
                                 absl::Time deadline, WireDtype encoding, OutgoingValues values,
                                 PulledValues* info, const CheckedRowIds& rows);
  // The rows a pull or push names (its ids and id_counts fields), decoded and checked
  // for the shard, once: what the shard takes them as. INVALID_ARGUMENT for ids sent to
  // a dense shard, bytes that are not int64 ids, or ids that do not suit the shard
  // (CheckRowIds), as "embedding shard N: <what>" (`what` before it, e.g. "next rows: ").
  static absl::StatusOr<CheckedRowIds> RequestedRows(
      const ParameterShard& shard, const std::string& ids,
      const google::protobuf::RepeatedField<int32_t>& counts, absl::string_view what = "");
  // The slice a part of a reply carries its values in.
  grpc::Slice ValuesSlice(std::string bytes, std::shared_ptr<const std::vector<float>> shared);
  // A push its shard has taken (applied, or held for its sync step), not yet acknowledged.
  struct AcceptedPush {
    ServedShard served;
    PushOutcome outcome;
    WireDtype encoding;  // of the gradient, and of the values a pull_next sends back
    // An embedding shard's pull_next: the rows it sends back (next_ids, else the pushed
    // ones; copied only then, as the shard may keep the push's).
    CheckedRowIds next_rows;
  };
  // Writes a push's gradient, in the given encoding, into a buffer of the shard's size
  // (CheckWireSize's error if the sizes differ).
  using GradientReader = std::function<absl::Status(WireDtype encoding, absl::Span<float> out)>;
  // Finds the shard of `request` (its gradient field unused), decodes the gradient of
  // `gradient_bytes` bytes with `read_gradient` and hands it over; an error is a
  // refusal (counted and logged as one).
  absl::StatusOr<AcceptedPush> AcceptPush(const PushRequest& request, size_t gradient_bytes,
                                          const GradientReader& read_gradient,
                                          const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the push may be acknowledged (replicated; in sync mode its step
  // applied), queues its checkpoint, fills `response`, and pulls step + 1 into *values
  // if asked.
  absl::Status FinishPush(const PushRequest& request, AcceptedPush& accepted,
                          absl::Time call_deadline, PushResponse* response, OutgoingValues values);
  // One shard's part of a Replicate call; sets result->received_index when OK. Waits
  // for room for its entries (ParameterShard::ReceiveLogEntries) until `room_by`.
  absl::Status ReceiveReplicatedBatch(const ShardLogBatch& batch, const std::string& peer,
                                      absl::Time room_by, ShardReplicationResult* result)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Null when there is no registry.
  struct Metrics {
    explicit Metrics(MetricsRegistry* registry);
    Counter* pulls;
    Counter* pushes_accepted;
    Counter* pushes_duplicate;
    Counter* pushes_late;
    Counter* pushes_refused;
    Counter* bytes_received;
    Counter* bytes_sent;
    Counter* replicated_entries;
    Histogram* pull_seconds;
    Histogram* push_seconds;
    Histogram* replicate_seconds;
    std::map<absl::StatusCode, Counter*> rejected;  // by reason
  };
  void CountRejection(absl::StatusCode code);

  const CallerVerifier* const callers_;
  // Runs the data calls' handlers (they may block): as many threads as pulls may wait,
  // and some for pushes. Outlives data_service_.
  static constexpr int kExtraCallThreads = 64;
  std::unique_ptr<CallExecutor> call_executor_;
  std::unique_ptr<grpc::Service> data_service_;  // ParameterServerData, served by this
  const std::shared_ptr<ReplyBufferPool> reply_buffers_ = ReplyBufferPool::Create();
  // Pushes' gradients, decoded here before their shard takes them.
  const std::shared_ptr<BufferPool<UninitializedFloats>> gradient_buffers_ =
      BufferPool<UninitializedFloats>::Create();
  const absl::Duration max_pull_wait_;
  const int max_waiting_pulls_;
  std::atomic<int> waiting_pulls_{0};
  std::atomic<int> exports_in_flight_{0};
  const std::unique_ptr<Metrics> metrics_;
  RefusalLog refusals_;
  RefusalLog cancellations_;  // calls their callers ended: no attack
  CheckpointWriter* const checkpoints_;
  mutable absl::Mutex mu_;
  std::string node_name_ ABSL_GUARDED_BY(mu_) = "this server";
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t installing_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // the newest BeginInstall's
  std::string initial_values_from_ ABSL_GUARDED_BY(mu_);
  std::map<int, ServedShard> shards_ ABSL_GUARDED_BY(mu_);
  std::set<int> copying_ ABSL_GUARDED_BY(mu_);
  int64_t rejected_requests_ ABSL_GUARDED_BY(mu_) = 0;
  ShardMapInstaller installer_ ABSL_GUARDED_BY(mu_);
  // Applies backup shards' received entries; declared last, so stopped first.
  ReplicaApplier replica_applier_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_PARAMETER_SERVER_SERVICE_H_
