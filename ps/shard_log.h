// A shard's mutation log: the numbered entries a backup applies to stay identical to its
// primary, and where they go as they are made (a sink, the caller, or nowhere).
#ifndef PARAMSERVER_PS_SHARD_LOG_H_
#define PARAMSERVER_PS_SHARD_LOG_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/model/step_optimizer.h"
#include "common/wire/sparse_rows.h"

namespace paramserver {

// One entry of a shard's mutation log: what a backup applies to stay identical to its
// primary. Indices run 1, 2, 3, ... with no gaps.
struct ShardMutation {
  int64_t index = 0;
  enum class Kind {
    kPush,           // async/ssp: one worker's push, applied as one update
    kSyncStep,       // sync: a completed step, applied with the mean gradient
    kActiveWorkers,  // the set of workers whose pushes count changed
    kInitialValues,  // model.type torch: the first worker's values, `gradient` holds them
  } kind = Kind::kPush;
  int worker_rank = 0;          // kPush
  int64_t step = 0;             // kPush, kSyncStep
  std::vector<float> gradient;  // kPush: the push; kSyncStep: the mean applied
  std::vector<bool> active;     // kActiveWorkers
  RowIds rows;  // an embedding shard's kPush, kSyncStep: whose rows `gradient` holds
  StepHyperparameters settings;  // kPush, kSyncStep: a script's hyperparameters, if any
  // kPush, kSyncStep: a worker skipped the step (ShardPush::skip): nothing was applied,
  // and `gradient` and `rows` are empty.
  bool skipped = false;
  // kSyncStep, a clipped step (clip_coefficient > 0): `gradient` is the mean already
  // scaled by it; step_sum_squares is the unscaled mean's.
  double step_sum_squares = 0;
  float clip_coefficient = 0;
};

// Receives a primary shard's log entries as they are made, in index order, while the
// shard's lock is held: it must be quick and must not call back into the shard.
class ShardLogSink {
 public:
  virtual ~ShardLogSink() = default;
  virtual void Append(ShardMutation mutation) = 0;
};

// The numbering of a shard's log and the sink its entries go to. Thread-compatible: the
// shard's lock guards it, and a sink is called under that lock.
class ShardLog {
 public:
  // `hand_back`: without a sink, Record hands entries back to its caller (tests); else
  // they are only numbered.
  explicit ShardLog(bool hand_back) : hand_back_(hand_back) {}

  // The index of the newest entry (0: none yet).
  int64_t index() const { return index_; }
  // A replica continuing its primary's log from `index`.
  void ContinueFrom(int64_t index) { index_ = index; }
  // Whether Record keeps entries (for a sink, or handed back), so that what an entry
  // would carry is worth copying into it.
  bool KeepsEntries() const { return sink_ != nullptr || hand_back_; }
  // Whether its entries go to a sink (it is a primary that replicates).
  bool HasSink() const { return sink_ != nullptr; }
  // Sends every later entry to `sink` (null: none).
  void SetSink(std::shared_ptr<ShardLogSink> sink) { sink_ = std::move(sink); }

  // Gives `mutation` the next index and passes it to the sink, else (hand_back) appends
  // it to *handed_back. `handed_back` null: the entry is only numbered (a backup
  // replaying its primary's entry, which it must not pass on).
  void Record(ShardMutation mutation, std::vector<ShardMutation>* handed_back);
  // A backup applied its primary's next entry (which it does not pass on).
  void CountReplayed() { ++index_; }

 private:
  const bool hand_back_;
  int64_t index_ = 0;
  std::shared_ptr<ShardLogSink> sink_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SHARD_LOG_H_
