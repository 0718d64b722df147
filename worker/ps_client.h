// How a worker reads and updates the model: the whole flat parameter vector, spread
// over the shards of the shard map.
#ifndef PARAMSERVER_WORKER_PS_CLIENT_H_
#define PARAMSERVER_WORKER_PS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace paramserver {

// What a refresh of the shard map found.
struct ShardMapUpdate {
  bool epoch_changed = false;
  int64_t epoch = 0;
  // Set when the servers rolled every shard back (sync): the step to continue from.
  std::optional<int64_t> rewind_to;
  // False when the scheduler has declared this worker dead.
  bool self_active = true;
};

// One step's push whose gradient is handed over in parts as backpropagation finishes
// them (training.push_bucket_kb), so that the last layers' gradients travel while the
// first layers' are computed. Used from one thread.
class StreamedPush {
 public:
  // Sends nothing more and waits for whatever is in flight (Finish says how it went):
  // dropping an unfinished push is how a failed step abandons it.
  virtual ~StreamedPush() = default;

  // gradient[from, end) is final and stays unchanged until Finish returns. Sends the
  // shards inside it that are not sent yet, if there is enough of them to be worth a
  // call, without waiting for the network. `from` only decreases.
  virtual void Ready(int64_t from) = 0;

  // Sends whatever is left and waits for every shard: PushAllAndPullNext's result (with
  // no next_params, false and PushAll's errors).
  virtual absl::StatusOr<bool> Finish() = 0;

  // The buckets sent by Ready so far (those that left while the gradient was still
  // being computed); Finish sends at most one more.
  virtual int64_t early_buckets() const = 0;
};

// Thread-compatible: one caller at a time; an implementation that is more says so.
class PsClient {
 public:
  virtual ~PsClient() = default;

  // Fills `params` (the whole flat vector) with every shard's values once the servers'
  // consistency rule lets this worker compute `step`. Blocks until then or the pull
  // deadline; the error names the shard and server that did not answer. UNAVAILABLE,
  // FAILED_PRECONDITION and DEADLINE_EXCEEDED may mean the map changed: refresh it.
  virtual absl::Status PullAll(int64_t step, absl::Span<float> params) = 0;

  // Sends each shard its slice of `gradient` for `step` and returns once every shard
  // acknowledged (retrying a lost push is safe: the servers apply it once).
  virtual absl::Status PushAll(int64_t step, absl::Span<const float> gradient) = 0;

  // PushAll, and in the same round trip the values for step + 1 into `next_params`
  // (the whole flat vector). True when every shard sent them: `next_params` then holds
  // exactly what PullAll(step + 1) would have returned. False when some shard did not
  // (not ready in time): `next_params` is partly overwritten and the caller pulls as
  // usual. Errors are PushAll's. This default pushes and pulls nothing.
  virtual absl::StatusOr<bool> PushAllAndPullNext(int64_t step, absl::Span<const float> gradient,
                                                  absl::Span<float> next_params) {
    absl::Status pushed = PushAll(step, gradient);
    if (!pushed.ok()) return pushed;
    return false;
  }

  // Starts pushing `step`'s gradient part by part (StreamedPush). With `next_params`
  // not empty the replies bring step + 1's values, as in PushAllAndPullNext. Both
  // spans must outlive the StreamedPush; nothing else may use this client until it is
  // finished or destroyed. This default sends everything at Finish.
  virtual std::unique_ptr<StreamedPush> StartStreamedPush(int64_t step,
                                                          absl::Span<const float> gradient,
                                                          absl::Span<float> next_params);

  // A model with embedding tables (ctr). PullAll, and in the same calls (one per server,
  // dense and embedding shards together) the rows of `ids` (per table, its unique ids
  // ascending) into rows[t] (ids[t].size() x dim). A row reads as the servers hold it
  // (its initial value if never updated; zeros for an id short of model.min_count).
  // Errors are PullAll's. This default refuses: the client has no tables.
  virtual absl::Status PullWithRows(int64_t step, absl::Span<float> params,
                                    const std::vector<std::vector<int64_t>>& ids,
                                    std::vector<std::vector<float>>* rows);

  // PushAll, and the row gradients row_gradients[t] (ids[t].size() x dim) of the rows of
  // `ids`, each to the embedding shard its (table, id) hashes to. Every embedding shard
  // gets a push, an empty one when the batch holds none of its rows, so that sync
  // steps complete. Retrying is safe, as for PushAll. This default refuses.
  virtual absl::Status PushWithRows(int64_t step, absl::Span<const float> gradient,
                                    const std::vector<std::vector<int64_t>>& ids,
                                    const std::vector<std::vector<float>>& row_gradients);

  // PushWithRows, and in the same round trip (as PushAllAndPullNext) the MLP for step + 1
  // into `next_params` and the rows of `next_ids` (the next batch's) into next_rows.
  // True when every shard sent them: they are then what PullWithRows(step + 1, next_ids)
  // would have returned. False when some did not (not ready in time): `next_params` is
  // partly overwritten and the caller pulls as usual. This default pushes and pulls
  // nothing more.
  virtual absl::StatusOr<bool> PushWithRowsAndPullNext(
      int64_t step, absl::Span<const float> gradient, const std::vector<std::vector<int64_t>>& ids,
      const std::vector<std::vector<float>>& row_gradients,
      const std::vector<std::vector<int64_t>>& /*next_ids*/, absl::Span<float> /*next_params*/,
      std::vector<std::vector<float>>* /*next_rows*/) {
    absl::Status pushed = PushWithRows(step, gradient, ids, row_gradients);
    if (!pushed.ok()) return pushed;
    return false;
  }

  // Asks the scheduler for the current shard map and routes by it from now on.
  virtual absl::StatusOr<ShardMapUpdate> RefreshShardMap() = 0;

  // Where this worker starts: 0 in a fresh job, the restored step after a resume, the
  // cluster's present step for a worker joining a running job.
  virtual absl::StatusOr<int64_t> StartStep() = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_PS_CLIENT_H_
