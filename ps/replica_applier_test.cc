// A backup that acknowledges on receipt: entries taken in order into memory
// (ParameterShard::ReceiveLogEntries), applied later on the appliers' threads
// (ReplicaApplier) or at once when the shard is promoted (SetLogSink), always ending
// bit-identical to its primary.
#include "ps/replica_applier.h"

#include <memory>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "ps/dense_shard_testing.h"
#include "ps/parameter_shard.h"
#include "ps/shard_testing.h"

namespace paramserver {
namespace {

using namespace dense_shard_testing;  // NOLINT: the shared helpers of the shard tests

// A sink standing in for a replicator: keeps what a promoted shard logs.
class KeptLog final : public ShardLogSink {
 public:
  void Append(ShardMutation mutation) override { entries.push_back(std::move(mutation)); }
  std::vector<ShardMutation> entries;
};

// `pushes` async pushes of worker 0 on `primary`, each a different gradient; their log.
std::vector<ShardMutation> Train(ParameterShard& primary, int first_step, int pushes) {
  std::vector<ShardMutation> log;
  for (int step = first_step; step < first_step + pushes; ++step) {
    const float g = 0.1f * static_cast<float>(step + 1);
    absl::StatusOr<PushOutcome> pushed = primary.Push(0, step, std::vector<float>{g, -g, 2 * g});
    REQUIRE(pushed.ok());
    for (ShardMutation& entry : pushed->log) log.push_back(std::move(entry));
  }
  return log;
}

TEST_CASE("received entries are held in order and applied later, ending bit-identical") {
  ParameterShard primary(Options(TrainingMode::kAsync, 1), kInitial);
  ParameterShard backup(Options(TrainingMode::kAsync, 1), kInitial);
  std::vector<ShardMutation> log = Train(primary, 0, 5);
  REQUIRE(log.size() == 5);

  absl::StatusOr<int64_t> received = backup.ReceiveLogEntries({log[0], log[1], log[2]}, Soon());
  REQUIRE(received.ok());
  CHECK(*received == 3);
  CHECK(backup.received_index() == 3);
  CHECK(backup.log_index() == 0);  // in memory, not applied
  CHECK(backup.has_unapplied());
  CHECK(PullValues(backup, 0, 0) == kInitial);

  // Repeats are dropped, an overlap takes only what is new, a gap takes nothing.
  CHECK(*backup.ReceiveLogEntries({log[1], log[2]}, Soon()) == 3);
  CHECK(*backup.ReceiveLogEntries({log[2], log[3]}, Soon()) == 4);
  CHECK(backup.ReceiveLogEntries({log[4]}, Soon()).ok());
  ShardMutation ahead = log[4];
  ahead.index = 7;
  CHECK(backup.ReceiveLogEntries({ahead}, Soon()).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(backup.received_index() == 5);

  REQUIRE(backup.ApplyReceived().ok());
  CHECK_FALSE(backup.has_unapplied());
  CHECK(backup.received_index() == 5);
  ExpectSameState(primary, backup);
}

TEST_CASE(
    "a backup promoted with entries waiting applies them before it serves, then refuses its old "
    "primary") {
  ParameterShard primary(Options(TrainingMode::kAsync, 1), kInitial);
  ParameterShard backup(Options(TrainingMode::kAsync, 1), kInitial);
  std::vector<ShardMutation> log = Train(primary, 0, 4);
  REQUIRE(backup.ReceiveLogEntries(log, Soon()).ok());
  REQUIRE(backup.log_index() == 0);

  // The primary dies here; the backup is promoted with all 4 entries unapplied.
  auto kept = std::make_shared<KeptLog>();
  int64_t starts_at = -1;
  backup.SetLogSink(kept, [&](int64_t index) { starts_at = index; });
  CHECK(starts_at == 4);  // its replicator starts after every acknowledged entry
  ExpectSameState(primary, backup);
  CHECK(backup.ReceiveLogEntries({log[3]}, Soon()).ok());  // a repeat stays harmless
  ShardMutation late = Train(primary, 4, 1)[0];
  CHECK(backup.ReceiveLogEntries({late}, Soon()).status().code() == absl::StatusCode::kAborted);

  // It trains on from exactly where its primary was.
  REQUIRE(backup.Push(0, 4, std::vector<float>{0.5f, -0.5f, 1.0f}).ok());
  REQUIRE(kept->entries.size() == 1);
  CHECK(kept->entries[0].index == 5);
  CHECK(late.index == 5);
}

TEST_CASE("a backup promoted with no backup of its own also refuses its old primary") {
  ParameterShard primary(Options(TrainingMode::kAsync, 1), kInitial);
  ParameterShard backup(Options(TrainingMode::kAsync, 1), kInitial);
  std::vector<ShardMutation> log = Train(primary, 0, 3);
  REQUIRE(backup.ReceiveLogEntries({log[0], log[1]}, Soon()).ok());
  backup.ServeAlone();             // its primary died, and no server is left to back it up
  CHECK(backup.log_index() == 2);  // what it received is applied before it serves
  CHECK(backup.ReceiveLogEntries({log[2]}, Soon()).status().code() == absl::StatusCode::kAborted);
  CHECK(backup.log_index() == 2);
}

TEST_CASE("a demoted primary, closed by its handover, follows its successor's log") {
  ParameterShard first(Options(TrainingMode::kAsync, 1), kInitial);
  ParameterShard second(Options(TrainingMode::kAsync, 1), kInitial);
  auto kept = std::make_shared<KeptLog>();
  first.SetLogSink(kept, {});
  Train(first, 0, 3);
  REQUIRE(second.ApplyLogEntry(kept->entries[0]).ok());
  REQUIRE(second.ApplyLogEntry(kept->entries[1]).ok());
  REQUIRE(second.ApplyLogEntry(kept->entries[2]).ok());
  // Handed over (as ShardHost::HandOver does it: closed to workers first): `second` is
  // the primary now, `first` its backup, which applies async pushes although closed.
  first.Close("handed over to second at epoch 2");
  first.SetLogSink(nullptr, {});
  auto second_log = std::make_shared<KeptLog>();
  second.SetLogSink(second_log, {});
  Train(second, 3, 2);
  REQUIRE(second_log->entries.size() == 2);
  CHECK(*first.ReceiveLogEntries(second_log->entries, Soon()) == 5);
  REQUIRE(first.ApplyReceived().ok());
  ExpectSameState(second, first);
}

TEST_CASE("past its byte limit a backup waits for room, takes nothing at the deadline") {
  ParameterShardOptions options = Options(TrainingMode::kAsync, 1);
  options.max_received_bytes = 2 * 3 * sizeof(float);  // two entries' gradients
  ParameterShard primary(Options(TrainingMode::kAsync, 1), kInitial);
  ParameterShard backup(options, kInitial);
  std::vector<ShardMutation> log = Train(primary, 0, 4);
  CHECK(*backup.ReceiveLogEntries({log[0]}, Soon()) == 1);
  CHECK(*backup.ReceiveLogEntries({log[1]}, Soon()) == 2);
  const absl::Time before = absl::Now();
  CHECK(*backup.ReceiveLogEntries({log[2], log[3]}, absl::Now() + absl::Milliseconds(100)) == 2);
  CHECK(absl::Now() - before >= absl::Milliseconds(100));
  REQUIRE(backup.ApplyReceived().ok());
  CHECK(*backup.ReceiveLogEntries({log[2], log[3]}, Soon()) == 4);  // room again
  REQUIRE(backup.ApplyReceived().ok());
  ExpectSameState(primary, backup);
}

TEST_CASE("a call that waited for room takes what an overlapping call left of its entries") {
  ParameterShardOptions options = Options(TrainingMode::kAsync, 1);
  options.max_received_bytes = 2 * 3 * sizeof(float);  // two entries' gradients
  ParameterShard primary(Options(TrainingMode::kAsync, 1), kInitial);
  ParameterShard backup(options, kInitial);
  std::vector<ShardMutation> log = Train(primary, 0, 4);
  REQUIRE(*backup.ReceiveLogEntries({log[0], log[1]}, Soon()) == 2);  // full
  // A resend of entries 3 and 4 waits for room; meanwhile room is made and another call
  // (the primary's next batch, overlapping) takes entry 3 first, most likely, since the
  // waiting call must be woken: the waiting one then takes entry 4 all the same.
  absl::StatusOr<int64_t> waited;
  std::thread resend([&] {
    waited = backup.ReceiveLogEntries({log[2], log[3]}, absl::Now() + absl::Seconds(30));
  });
  absl::SleepFor(absl::Milliseconds(100));  // the likely order; the other passes too
  const absl::Status made_room = backup.ApplyReceived();
  const absl::StatusOr<int64_t> overlapping = backup.ReceiveLogEntries({log[2]}, Soon());
  resend.join();  // before any REQUIRE: a check that throws must not leave it joinable
  REQUIRE(made_room.ok());
  REQUIRE(overlapping.ok());
  REQUIRE(waited.ok());
  CHECK(*waited == 4);
  REQUIRE(backup.ApplyReceived().ok());
  ExpectSameState(primary, backup);
}

TEST_CASE("a received entry that fails to apply closes the replica, which takes no more") {
  ParameterShard primary(Options(TrainingMode::kAsync, 1), kInitial);
  ParameterShard backup(Options(TrainingMode::kAsync, 1), kInitial);
  std::vector<ShardMutation> log = Train(primary, 0, 2);
  ShardMutation twice = log[0];  // worker 0's step 0 again: a duplicate here, diverged
  twice.index = 2;
  REQUIRE(backup.ReceiveLogEntries({log[0], twice}, Soon()).ok());
  const absl::Status applied = backup.ApplyReceived();
  CHECK(applied.code() == absl::StatusCode::kInternal);
  CHECK(backup.ReceiveLogEntries({log[1]}, Soon()).status().code() == absl::StatusCode::kInternal);
  CHECK(backup.Pull(0, 0, Soon()).status().code() == absl::StatusCode::kUnavailable);
  backup.Reopen();  // promoted back: still refuses, naming the failure
  absl::StatusOr<PulledValues> pulled = backup.Pull(0, 0, Soon());
  CHECK(pulled.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(pulled.status().message()).find("failed to apply") != std::string::npos);
}

TEST_CASE("the appliers apply scheduled shards in the background, after the hold") {
  ParameterShard primary(Options(TrainingMode::kAsync, 1), kInitial);
  auto backup = std::make_shared<ParameterShard>(Options(TrainingMode::kAsync, 1), kInitial);
  std::vector<ShardMutation> log = Train(primary, 0, 6);
  const absl::Duration hold = absl::Milliseconds(200);
  ReplicaApplier applier(2, hold);
  const absl::Time scheduled = absl::Now();
  REQUIRE(backup->ReceiveLogEntries({log[0], log[1], log[2]}, Soon()).ok());
  applier.Schedule(backup);
  applier.Schedule(backup);  // queued once
  REQUIRE(backup->ReceiveLogEntries({log[3], log[4], log[5]}, Soon()).ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (backup->log_index() < 6 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  CHECK(absl::Now() - scheduled >= hold);
  CHECK_FALSE(backup->has_unapplied());
  ExpectSameState(primary, *backup);

  // A shard dropped before its turn is skipped.
  auto dropped = std::make_shared<ParameterShard>(Options(TrainingMode::kAsync, 1), kInitial);
  REQUIRE(dropped->ReceiveLogEntries({log[0]}, Soon()).ok());
  applier.Schedule(dropped);
  dropped.reset();
}

}  // namespace
}  // namespace paramserver
