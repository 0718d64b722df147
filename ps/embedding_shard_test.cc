// A ParameterShard holding embedding rows: the consistency rules, the log and the
// replica state work for rows as they do for a dense range.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/base/status_macros.h"
#include "common/checkpoint/embedding_checkpoint.h"
#include "common/wire/shard_layout.h"
#include "ps/embedding_storage.h"
#include "ps/parameter_shard.h"
#include "ps/shard_replicator.h"
#include "ps/shard_testing.h"

namespace paramserver {
namespace {

constexpr int kBucket = 1, kBuckets = 2;
constexpr size_t kMaxHeaderBytes = 1 << 20;

ParameterShardOptions Options(TrainingMode mode, int workers, int min_count = 1) {
  auto embedding = std::make_shared<EmbeddingShardOptions>();
  embedding->shape = {{2, 3}, kBucket, kBuckets};
  for (int t = 0; t < 2; ++t) {
    EmbeddingTableOptions table;
    table.dim = embedding->shape.dims[t];
    table.optimizer.type = EmbeddingOptimizerType::kAdam;
    table.optimizer.learning_rate = 0.05;
    table.init_seed = 11;
    table.table_index = t;
    table.min_count = min_count;
    embedding->tables.push_back(table);
  }
  ParameterShardOptions options;
  options.hand_back_log = true;
  options.shard_id = 9;
  options.mode = mode;
  options.num_workers = workers;
  options.embedding = embedding;
  return options;
}

// Options(...) with every table bounded (max_rows far above what the tests make): a
// bound keeps the rows' recency order, which a table without one does not keep.
ParameterShardOptions BoundedOptions(TrainingMode mode, int workers, int min_count = 1) {
  ParameterShardOptions options = Options(mode, workers, min_count);
  auto bounded = std::make_shared<EmbeddingShardOptions>(*options.embedding);
  for (EmbeddingTableOptions& table : bounded->tables) table.max_rows = int64_t{1} << 40;
  options.embedding = bounded;
  return options;
}

// The first ids of `table` on this shard's bucket, ascending.
std::vector<int64_t> OurIds(int table, int n) {
  std::vector<int64_t> ids;
  for (int64_t id = 100; static_cast<int>(ids.size()) < n; ++id) {
    if (EmbeddingShardOf(table, id, kBuckets) == kBucket) ids.push_back(id);
  }
  return ids;
}

RowIds Rows(std::vector<int64_t> table0, std::vector<int64_t> table1) {
  RowIds rows;
  rows.counts = {static_cast<int32_t>(table0.size()), static_cast<int32_t>(table1.size())};
  rows.ids = table0;
  rows.ids.insert(rows.ids.end(), table1.begin(), table1.end());
  return rows;
}

std::vector<float> PullRows(ParameterShard& shard, int worker, int64_t step, const RowIds& rows) {
  std::string bytes;
  REQUIRE(shard
              .PullRowsInto(worker, step, absl::Now() + absl::Milliseconds(50), rows.view(),
                            WireDtype::kFloat32, &bytes, nullptr)
              .ok());
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

TEST_CASE("sync rows: the step applies the workers' mean per id, with SparseAdam at the job step") {
  ParameterShard shard(Options(TrainingMode::kSync, 2), std::vector<float>{});
  const std::vector<int64_t> a = OurIds(0, 3), b = OurIds(1, 1);
  // Worker 0 touches a0, a1 and b0; worker 1 touches a1, a2.
  const RowIds w0 = Rows({a[0], a[1]}, {b[0]}), w1 = Rows({a[1], a[2]}, {});
  const RowIds all = Rows(a, b);
  const std::vector<float> before = PullRows(shard, 0, 0, all);
  for (int e = 0; e < 2; ++e) CHECK(before[e] == InitialEmbeddingValue(11, 0, a[0], e));
  CHECK(before[6] == InitialEmbeddingValue(11, 1, b[0], 0));

  const std::vector<float> g0 = {1, 2, 3, 4, 5, 6, 7}, g1 = {-1, -2, 8, 8};
  REQUIRE(shard.PushRows(0, 0, w0.view(), g0).ok());
  CHECK(shard.embedding_counters().rows == 0);  // nothing applied before worker 1's push
  absl::StatusOr<PushOutcome> second = shard.PushRows(1, 0, w1.view(), g1);
  REQUIRE(second.ok());
  CHECK(second->applied_updates == 1);
  REQUIRE(second->log.size() == 1);
  CHECK(second->log[0].rows.ids == all.ids);

  // By hand: each row's mean gradient, one SparseAdam step from its initial value.
  const std::vector<std::vector<float>> mean = {
      {0.5f, 1}, {(3 - 1) / 2.0f, (4 - 2) / 2.0f}, {4, 4}, {2.5f, 3, 3.5f}};
  std::vector<float> expected;
  for (size_t r = 0; r < 4; ++r) {
    const int table = r < 3 ? 0 : 1;
    const int64_t id = r < 3 ? a[r] : b[0];
    std::vector<float> row;
    for (size_t e = 0; e < mean[r].size(); ++e)
      row.push_back(InitialEmbeddingValue(11, table, id, e));
    std::vector<float> state(2 * row.size(), 0.0f);
    ApplyRowUpdate(Options(TrainingMode::kSync, 2).embedding->tables[table].optimizer, 1, mean[r],
                   absl::MakeSpan(row), absl::MakeSpan(state));
    expected.insert(expected.end(), row.begin(), row.end());
  }
  CHECK(PullRows(shard, 1, 1, all) == expected);
  CHECK(shard.embedding_counters().rows == 4);
  // A retried push is a duplicate, as for dense shards.
  absl::StatusOr<PushOutcome> again = shard.PushRows(0, 0, w0.view(), g0);
  REQUIRE(again.ok());
  CHECK(again->duplicate);
}

TEST_CASE("bad row pushes and pulls are refused, naming what is wrong, and change nothing") {
  ParameterShard shard(Options(TrainingMode::kAsync, 1), std::vector<float>{});
  const std::vector<int64_t> a = OurIds(0, 2);
  int64_t foreign = 0;
  while (EmbeddingShardOf(0, foreign, kBuckets) == kBucket) ++foreign;
  struct Case {
    RowIds rows;
    std::vector<float> gradient;
    std::string error;
  };
  const std::vector<Case> cases = {
      {Rows({a[1], a[0]}, {}), std::vector<float>(4, 1.0f), "ids must be strictly increasing"},
      {Rows({a[0], a[0]}, {}), std::vector<float>(4, 1.0f), "ids must be strictly increasing"},
      {Rows({foreign}, {}), std::vector<float>(2, 1.0f), "belongs to embedding shard 0 of 2"},
      {Rows({a[0]}, {}), std::vector<float>(3, 1.0f),
       "the gradient has 3 floats; the rows of the 1 ids sent have 2"},
      {RowIds{{1}, {a[0]}}, std::vector<float>(2, 1.0f), "ids for 1 tables; the model has 2"},
      {Rows({a[0]}, {}), {std::nanf(""), 1.0f}, "only finite values are accepted"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PushOutcome> refused = shard.PushRows(0, 0, c.rows.view(), c.gradient);
    INFO(c.error);
    REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(refused.status().message(), c.error));
  }
  CHECK(shard.Push(0, 0, std::vector<float>{}).status().message() ==
        "shard 9 is an embedding shard: a push names its rows' ids");
  std::string bytes;
  CHECK(shard
            .PullRowsInto(0, 0, absl::Now(), Rows({foreign}, {}).view(), WireDtype::kFloat32,
                          &bytes, nullptr)
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(bytes.empty());
  CHECK(shard.counters().applied_updates == 0);
  CHECK(shard.counters().rejected_pushes == static_cast<int64_t>(cases.size()) + 1);
  // And it keeps serving.
  REQUIRE(shard.PushRows(0, 0, Rows({a[0]}, {}).view(), {1.0f, 1.0f}).ok());
  CHECK(shard.embedding_counters().rows == 1);
}

TEST_CASE("a backup fed the log, and a replica copied mid-step, stay identical to the primary") {
  for (TrainingMode mode : {TrainingMode::kSync, TrainingMode::kAsync}) {
    ParameterShardOptions options = Options(mode, 2, /*min_count=*/2);
    ParameterShard primary(options, std::vector<float>{});
    ParameterShard backup(options, std::vector<float>{});
    std::unique_ptr<ParameterShard> late;
    const std::vector<int64_t> a = OurIds(0, 4), b = OurIds(1, 3);
    int64_t next_index = 1;
    for (int64_t step = 0; step < 6; ++step) {
      for (int w = 0; w < 2; ++w) {
        const RowIds rows = Rows({a[(step + w) % 3], a[3]}, {b[step % 3]});
        std::vector<float> gradient(7);
        for (size_t i = 0; i < gradient.size(); ++i) gradient[i] = 0.1f * (i + 1) - 0.2f * w;
        absl::StatusOr<PushOutcome> pushed = primary.PushRows(w, step, rows.view(), gradient);
        INFO(pushed.status());
        REQUIRE(pushed.ok());
        for (const ShardMutation& entry : pushed->log) {
          CHECK(entry.index == next_index++);
          REQUIRE(backup.ApplyLogEntry(entry).ok());
          if (late != nullptr) REQUIRE(late->ApplyLogEntry(entry).ok());
        }
        if (step == 2 && w == 0) {  // a sync step is half collected: the copy holds it
          absl::StatusOr<std::unique_ptr<ParameterShard>> copy =
              ParameterShard::FromReplica(options, primary.ExportReplica());
          REQUIRE(copy.ok());
          late = std::move(*copy);
        }
      }
    }
    INFO(TrainingModeName(mode));
    CHECK(primary.embedding_counters().rows > 0);
    CHECK(primary.embedding_counters().dropped_gradients > 0);  // min_count 2
    ExpectSameState(primary, backup);
    REQUIRE(late != nullptr);
    ExpectSameState(primary, *late);
    CHECK(late->embedding_counters().pending_ids == primary.embedding_counters().pending_ids);
  }
}

TEST_CASE("a snapshot holds every row ascending with its state, and resumes to the same shard") {
  ParameterShard shard(Options(TrainingMode::kSync, 1), std::vector<float>{});
  const std::vector<int64_t> a = OurIds(0, 3), b = OurIds(1, 2);
  REQUIRE(shard.PushRows(0, 0, Rows({a[2]}, {b[0], b[1]}).view(), std::vector<float>(8, 1)).ok());
  REQUIRE(shard.PushRows(0, 1, Rows({a[0], a[1]}, {}).view(), std::vector<float>(4, -1)).ok());
  const ShardState state = shard.Snapshot();
  REQUIRE(state.tables.size() == 2);
  CHECK(state.step == 2);
  CHECK(state.tables[0].ids == a);
  CHECK(state.tables[1].ids == b);
  CHECK(state.tables[0].state.size() == 3 * 2 * 2);  // adam: two moments per element
  CHECK(state.tables[1].shard_id == kBucket);
  CHECK(EncodeEmbeddingCheckpoint(state.tables[0]).ok());  // a valid checkpoint
  CHECK(state.tables[0].optimizer == "adam");              // whose state it holds
  // FTRL keeps as many floats per row as Adam: the name keeps one from reading the other's.
  ParameterShardOptions ftrl = Options(TrainingMode::kSync, 1);
  auto ftrl_tables = std::make_shared<EmbeddingShardOptions>(*ftrl.embedding);
  ftrl_tables->tables[0].optimizer.type = EmbeddingOptimizerType::kFtrl;
  const absl::Status refused = EmbeddingStorage::CheckTablesFit(9, *ftrl_tables, state.tables);
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.message() ==
        "embedding shard 9: table C1's rows hold adam state; the table's optimizer is ftrl");
  ParameterShard resumed(Options(TrainingMode::kSync, 1), state);
  const ShardState again = resumed.Snapshot();
  CHECK(again.step == 2);
  for (int t = 0; t < 2; ++t) {
    CHECK(again.tables[t].ids == state.tables[t].ids);
    CHECK(again.tables[t].rows == state.tables[t].rows);
    CHECK(again.tables[t].state == state.tables[t].state);
  }
  const RowIds next = Rows({a[1]}, {b[1]});
  REQUIRE(shard.PushRows(0, 2, next.view(), std::vector<float>(5, 0.5f)).ok());
  REQUIRE(resumed.PushRows(0, 2, next.view(), std::vector<float>(5, 0.5f)).ok());
  CHECK(PullRows(shard, 0, 3, Rows(a, b)) == PullRows(resumed, 0, 3, Rows(a, b)));
}

TEST_CASE(
    "with embedding_deltas a shard's checkpoints are full, then deltas of what changed "
    "since, each against a base the writer holds") {
  ParameterShardOptions options = Options(TrainingMode::kSync, 1);
  auto tables = std::make_shared<EmbeddingShardOptions>(*options.embedding);
  tables->tables[0].max_rows = 3;  // evictions: a delta removes ids
  for (EmbeddingTableOptions& table : tables->tables) table.track_removals = true;
  options.embedding = tables;
  options.checkpoint_every_steps = 1;
  options.embedding_deltas = 2;
  std::set<int64_t> lost;  // bases the writer does not hold (dropped, or failed)
  options.checkpoint_held = [&](int64_t step) { return lost.count(step) == 0; };
  ParameterShard shard(options, std::vector<float>{});
  const std::vector<int64_t> a = OurIds(0, 5), b = OurIds(1, 2);
  // Step by step: the rows each step updates (table 0 holds at most 3).
  const std::vector<RowIds> steps = {Rows({a[0], a[1], a[2]}, {b[0]}),
                                     Rows({a[1]}, {}),
                                     Rows({a[3], a[4]}, {b[1]}),
                                     Rows({a[0]}, {}),
                                     Rows({a[2]}, {b[0]}),
                                     Rows({a[1]}, {}),
                                     Rows({a[3]}, {})};
  // Full at step 1, deltas of it at 2 and 3, full at 4, delta at 5; step 4's file is
  // lost, so 6 is full again, 7 a delta of 6.
  const std::vector<int64_t> base_of = {-1, 1, 1, -1, 4, -1, 6};
  std::vector<EmbeddingShardState> base;  // the last full checkpoint's tables
  for (size_t k = 0; k < steps.size(); ++k) {
    if (k == 5) lost.insert(4);
    const size_t floats = 2 * steps[k].counts[0] + 3 * steps[k].counts[1];
    absl::StatusOr<PushOutcome> pushed = shard.PushRows(
        0, static_cast<int64_t>(k), steps[k].view(), std::vector<float>(floats, 0.25f * (k + 1)));
    REQUIRE(pushed.ok());
    REQUIRE(pushed->checkpoint.has_value());
    ShardState checkpoint = *pushed->checkpoint;
    SortRowsById(&checkpoint);  // as the writer does before encoding
    const std::vector<EmbeddingShardState>& written = checkpoint.tables;
    INFO("step " << k + 1);
    CHECK(written[0].previous_step == base_of[k]);
    std::vector<EmbeddingShardState> resolved = written;
    if (k == 2) {
      // Step 3's delta holds what changed since step 1: a[1] (step 2), a[3] and a[4], made
      // by evicting a[0] and a[2] (least recently updated); b[1]. Not b[0].
      CHECK(written[0].ids == std::vector<int64_t>{a[1], a[3], a[4]});
      CHECK(written[0].removed_ids == std::vector<int64_t>{a[0], a[2]});
      CHECK(written[1].ids == std::vector<int64_t>{b[1]});
    }
    if (written[0].is_delta()) {
      for (size_t t = 0; t < 2; ++t) {
        CHECK(EncodeEmbeddingCheckpoint(written[t]).ok());
        absl::StatusOr<EmbeddingShardState> next =
            ApplyEmbeddingDelta(base[t], written[t], "delta");
        REQUIRE(next.ok());
        resolved[t] = *next;
      }
    } else {
      base = written;
    }
    // Base + delta is the shard's own rows at this step, bit for bit.
    const ShardState full = shard.Snapshot();
    for (size_t t = 0; t < 2; ++t) {
      CHECK(resolved[t].ids == full.tables[t].ids);
      CHECK(resolved[t].rows == full.tables[t].rows);
      CHECK(resolved[t].state == full.tables[t].state);
    }
  }
  CHECK(shard.Snapshot().tables[0].ids.size() == 3);  // evictions happened, and were carried
}

TEST_CASE("an embedding shard's log entries and replica state survive the wire, checked") {
  ParameterShardOptions options = Options(TrainingMode::kSync, 2, /*min_count=*/2);
  ParameterShard primary(options, std::vector<float>{});
  ParameterShard backup(options, std::vector<float>{});
  const std::vector<int64_t> a = OurIds(0, 3), b = OurIds(1, 2);
  for (int64_t step = 0; step < 3; ++step) {
    for (int w = 0; w < 2; ++w) {
      const RowIds rows = Rows({a[w], a[2]}, {b[step % 2]});
      absl::StatusOr<PushOutcome> pushed =
          primary.PushRows(w, step, rows.view(), std::vector<float>(7, 0.25f * (w + 1)));
      REQUIRE(pushed.ok());
      for (const ShardMutation& mutation : pushed->log) {
        absl::StatusOr<ShardMutation> received =
            MutationFromEntry(EntryFromMutation(mutation, 9), options);
        REQUIRE(received.ok());
        CHECK(received->rows.ids == mutation.rows.ids);
        REQUIRE(backup.ApplyLogEntry(*received).ok());
      }
    }
  }
  REQUIRE(primary.PushRows(0, 3, Rows({a[1]}, {}).view(), {1, 1}).ok());  // pending
  ExpectSameState(primary, backup);

  const ShardReplicaState proto = ReplicaStateToProto(primary.ExportReplica());
  absl::StatusOr<ReplicaState> replica =
      ReplicaStateFromProto(proto, {options.range, 2, options.embedding.get()});
  REQUIRE(replica.ok());
  absl::StatusOr<std::unique_ptr<ParameterShard>> copy =
      ParameterShard::FromReplica(options, *std::move(replica));
  REQUIRE(copy.ok());
  REQUIRE(primary.PushRows(1, 3, Rows({a[0]}, {b[1]}).view(), std::vector<float>(5, 2)).ok());
  REQUIRE((*copy)->PushRows(1, 3, Rows({a[0]}, {b[1]}).view(), std::vector<float>(5, 2)).ok());
  const ShardState x = primary.Snapshot(), y = (*copy)->Snapshot();
  for (int t = 0; t < 2; ++t) {
    CHECK(x.tables[t].ids == y.tables[t].ids);
    CHECK(x.tables[t].rows == y.tables[t].rows);
  }

  // A peer's entry with ids off this shard, or rows of the wrong size, is refused.
  ShardLogEntry bad;
  bad.set_index(40);
  SyncStep* sync_step = bad.mutable_sync_step();
  sync_step->set_step(4);
  sync_step->set_ids(EncodeIds({a[0]}));
  sync_step->add_id_counts(1);
  sync_step->add_id_counts(0);
  sync_step->set_mean_gradient(std::string(12, '\0'));
  CHECK(MutationFromEntry(bad, options).status().message() ==
        "log entry 40 mean gradient: expected 2 float32 values (8 bytes), got 12 bytes");
  sync_step->set_ids(EncodeIds({a[1], a[0]}));
  sync_step->set_id_counts(0, 2);
  CHECK(absl::StrContains(MutationFromEntry(bad, options).status().message(),
                          "log entry 40: table C1: ids must be strictly increasing"));
  ShardReplicaState short_rows = proto;
  short_rows.mutable_tables(0)->mutable_rows()->pop_back();
  CHECK(absl::StrContains(
      ReplicaStateFromProto(short_rows, {options.range, 2, options.embedding.get()})
          .status()
          .message(),
      "table C1 has"));
}

// A primary's state as FetchShardState streams it, in pieces of `piece_bytes`.
std::vector<ShardStatePiece> Pieces(const ReplicaState& replica, size_t piece_bytes) {
  std::vector<ShardStatePiece> pieces;
  const absl::Status written =
      WriteReplicaStatePieces(replica, piece_bytes, kMaxHeaderBytes, [&](const ShardStatePiece& p) {
        pieces.push_back(p);
        return true;
      });
  REQUIRE(written.ok());
  return pieces;
}

// What a backup puts together from `pieces`: the state, or the first refusal.
absl::StatusOr<ReplicaState> Assemble(std::vector<ShardStatePiece> pieces,
                                      const ParameterShardOptions& options) {
  ReplicaStateAssembler assembler({options.range, options.num_workers, options.embedding.get()});
  for (ShardStatePiece& piece : pieces) PS_RETURN_IF_ERROR(assembler.Add(std::move(piece)));
  return assembler.Finish();
}

TEST_CASE("a shard's state streamed in pieces of any size is put together exactly, and only then") {
  const ParameterShardOptions options = BoundedOptions(TrainingMode::kSync, 2, /*min_count=*/2);
  ParameterShard primary(options, std::vector<float>{});
  const std::vector<int64_t> a = OurIds(0, 40), b = OurIds(1, 30);
  for (int64_t step = 0; step < 4; ++step) {
    for (int w = 0; w < 2; ++w) {
      const RowIds rows = Rows(a, b);
      REQUIRE(
          primary
              .PushRows(w, step, rows.view(), std::vector<float>(40 * 2 + 30 * 3, 0.5f * w + step))
              .ok());
    }
  }
  // Then the first ten rows of C1 alone: they become the most recently updated, so the
  // rows' update order is no longer the order they are stored in.
  const std::vector<int64_t> first_ten(a.begin(), a.begin() + 10);
  for (int w = 0; w < 2; ++w) {
    REQUIRE(primary.PushRows(w, 4, Rows(first_ten, {}).view(), std::vector<float>(20, 1.5f)).ok());
  }
  REQUIRE(primary.PushRows(0, 5, Rows({a[1]}, {}).view(), {1, 1}).ok());  // pending
  // What a primary streams: its rows as stored, with the links that order them.
  const ReplicaState replica = primary.ExportReplicaAsStored();
  const std::string whole = ReplicaStateToProto(primary.ExportReplica()).SerializeAsString();
  // Rows of 2 and 3 floats with Adam's two moments each, 8-byte ids, 4-byte links.
  REQUIRE(replica.shard.tables[0].ids.size() == 40);
  REQUIRE(replica.shard.tables[1].ids.size() == 30);
  REQUIRE(replica.shard.tables[0].next_more_recent.size() == 40);
  REQUIRE(replica.shard.tables[0].ids != primary.ExportReplica().shard.tables[0].ids);
  const size_t bulk = 40 * (8 + 3 * 2 * 4 + 4) + 30 * (8 + 3 * 3 * 4 + 4);
  for (size_t piece_bytes :
       {size_t{1}, size_t{12}, size_t{100}, size_t{4096}, kShardStatePieceBytes}) {
    CAPTURE(piece_bytes);
    const std::vector<ShardStatePiece> pieces = Pieces(replica, piece_bytes);
    size_t data = 0;
    for (size_t i = 1; i < pieces.size(); ++i) {
      CHECK(pieces[i].data().size() <= std::max<size_t>(piece_bytes, 8));
      CHECK_FALSE(pieces[i].has_state());
      data += pieces[i].data().size();
    }
    CHECK(data == bulk);
    CHECK(pieces[0].data().empty());
    absl::StatusOr<ReplicaState> copy = Assemble(pieces, options);
    REQUIRE(copy.ok());
    // The backup ordered the rows as the primary holds them: the same state as the one
    // message of ExportReplica carries (which every other test checks).
    CHECK(ReplicaStateToProto(*copy).SerializeAsString() == whole);
    // Every piece is needed: the stream cut short is refused by what it lacks.
    std::vector<ShardStatePiece> cut(pieces.begin(), pieces.end() - 1);
    CHECK_THAT(std::string(Assemble(cut, options).status().message()),
               Catch::Contains(absl::StrCat("ended after ", bulk - pieces.back().data().size(),
                                            " of the ", bulk, " bytes declared")));
  }
  absl::StatusOr<std::unique_ptr<ParameterShard>> copy =
      ParameterShard::FromReplica(options, *Assemble(Pieces(replica, 100), options));
  REQUIRE(copy.ok());
  ExpectSameState(primary, **copy);
  // The copy holds its rows in the primary's update order (Snapshot sorts by id): it
  // evicts as the primary would.
  CHECK(ReplicaStateToProto((*copy)->ExportReplica()).SerializeAsString() == whole);

  // A backup gone away ends the stream at the next piece.
  int written = 0;
  const absl::Status cancelled = WriteReplicaStatePieces(
      replica, 100, kMaxHeaderBytes, [&](const ShardStatePiece&) { return ++written < 3; });
  CHECK(cancelled.code() == absl::StatusCode::kCancelled);
  CHECK(written == 3);
  CHECK_THAT(std::string(cancelled.message()),
             Catch::Contains("the backup stopped reading shard 9's state after"));
  // A header past one message (the pending gradients of a sync step) is refused by name,
  // with nothing written.
  written = 0;
  const absl::Status too_big =
      WriteReplicaStatePieces(replica, 100, 64, [&](const ShardStatePiece&) { return ++written; });
  CHECK(too_big.code() == absl::StatusCode::kResourceExhausted);
  CHECK(written == 0);
  CHECK_THAT(std::string(too_big.message()),
             Catch::Contains("shard 9's state besides its values and rows") &&
                 Catch::Contains("raise cluster.shards or cluster.embedding_shards"));
}

TEST_CASE(
    "a backup refuses a streamed state that does not fit its shard, before reserving for it") {
  const ParameterShardOptions options = BoundedOptions(TrainingMode::kAsync, 1);  // with links
  ParameterShard primary(options, std::vector<float>{});
  REQUIRE(primary.PushRows(0, 0, Rows(OurIds(0, 5), OurIds(1, 4)).view(), std::vector<float>(22, 1))
              .ok());
  const std::vector<ShardStatePiece> pieces = Pieces(primary.ExportReplicaAsStored(), 64);
  REQUIRE(pieces.size() > 3);
  REQUIRE(pieces[0].bulk_bytes_size() == 9);  // values, then ids, rows, state, links of 2 tables
  const auto refusal = [&](const std::function<void(std::vector<ShardStatePiece>&)>& spoil) {
    std::vector<ShardStatePiece> spoiled = pieces;
    spoil(spoiled);
    const absl::Status status = Assemble(spoiled, options).status();
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  CHECK_THAT(refusal([](auto& p) { p.erase(p.begin()); }),
             Catch::Contains("began with a piece of data rather than its header"));
  CHECK_THAT(refusal([](auto& p) { p.push_back(p[0]); }), Catch::Contains("a second header"));
  CHECK_THAT(refusal([](auto& p) { p[0].mutable_bulk_bytes()->RemoveLast(); }),
             Catch::Contains("8 bulk lengths for 9 bulk fields"));
  CHECK_THAT(refusal([](auto& p) { p[0].set_bulk_bytes(0, 4); }),
             Catch::Contains("4 bytes of values or optimizer state"));
  CHECK_THAT(refusal([](auto& p) { p[0].set_bulk_bytes(2, p[0].bulk_bytes(2) + 8); }),
             Catch::Contains("table C1 declares 40 bytes of ids, 48 bytes of rows"));
  CHECK_THAT(refusal([](auto& p) { p[0].set_bulk_bytes(4, 4); }),
             Catch::Contains("and 4 bytes of recency links"));
  // Links that do not lead through every row: refused as the backup orders the rows.
  CHECK_THAT(
      refusal([](auto& p) { p[0].mutable_state()->mutable_tables(1)->set_least_recent(99); }),
      Catch::Contains("the recency links of table C2"));
  // Rows and ids of one count, but more than this machine could hold: refused before
  // anything is reserved for them.
  CHECK_THAT(refusal([](auto& p) {
               const int64_t n = int64_t{1} << 56;
               p[0].set_bulk_bytes(1, n * 8);
               p[0].set_bulk_bytes(2, n * 8);
               p[0].set_bulk_bytes(3, n * 2 * 8);
             }),
             Catch::Contains("(this machine has"));
  // Each field within this machine's memory, all of them together not.
  const int64_t memory = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  CHECK_THAT(refusal([memory](auto& p) {
               const int64_t n = memory / 20;  // 36 bytes a row in all, 16 the most in one field
               p[0].set_bulk_bytes(1, n * 8);
               p[0].set_bulk_bytes(2, n * 8);
               p[0].set_bulk_bytes(3, n * 2 * 8);
               p[0].set_bulk_bytes(4, n * 4);
             }),
             Catch::Contains("more than this machine's"));
  CHECK_THAT(refusal([](auto& p) { p[0].set_bulk_bytes(1, -8); }),
             Catch::Contains("a field of -8"));
  {  // A table with a capacity: no more rows than it holds.
    EmbeddingShardOptions capped = *options.embedding;
    capped.tables[0].max_rows = 3;
    ReplicaStateAssembler assembler({options.range, 1, &capped});
    ShardStatePiece header = pieces[0];
    CHECK_THAT(std::string(assembler.Add(std::move(header)).message()),
               Catch::Contains("table C1 declares 5 rows; it holds at most 3"));
  }
  CHECK_THAT(refusal([](auto& p) { p[0].mutable_state()->mutable_tables(0)->set_ids("x"); }),
             Catch::Contains("its header carries values or rows"));
  CHECK_THAT(refusal([](auto& p) { p.back().mutable_data()->push_back('x'); }),
             Catch::Contains("bytes after"));
  CHECK_THAT(refusal([](auto& p) { p[0].mutable_state()->add_tables(); }),
             Catch::Contains("3 tables and 0 optimizer slots; expected 2 tables"));
  // Whole but wrong (state for another worker count): ReplicaStateFromProto's checks hold.
  CHECK_THAT(refusal([](auto& p) { p[0].mutable_state()->add_active_workers(true); }),
             Catch::Contains("per-worker state for 2/1/1/1 workers"));
  // After a refusal, nothing more is taken.
  ReplicaStateAssembler assembler({options.range, 1, options.embedding.get()});
  std::vector<ShardStatePiece> copy = pieces;
  CHECK_FALSE(assembler.Add(std::move(copy[1])).ok());
  CHECK_FALSE(assembler.Add(std::move(copy[0])).ok());
  CHECK_FALSE(assembler.Finish().ok());
}

TEST_CASE("a step skipped on rows goes through the log's wire form to a backup, sync and async") {
  for (TrainingMode mode : {TrainingMode::kSync, TrainingMode::kAsync}) {
    ParameterShard primary(Options(mode, 1), std::vector<float>{});
    ParameterShard backup(Options(mode, 1), std::vector<float>{});
    // As the service makes a skipping push's rows: none of either table.
    absl::StatusOr<CheckedRowIds> none =
        CheckedRowIds::Check(RowIds{{0, 0}, {}}, primary.options().embedding->shape);
    REQUIRE(none.ok());
    ShardPush skip{0, 0, UninitializedFloats(), *std::move(none), {}, /*skip=*/true};
    absl::StatusOr<PushOutcome> skipped = primary.Push(&skip);
    REQUIRE(skipped.ok());
    REQUIRE(skipped->log.size() == 1);
    absl::StatusOr<ShardMutation> sent =
        MutationFromEntry(EntryFromMutation(skipped->log[0], 9), Options(mode, 1));
    REQUIRE(sent.ok());
    REQUIRE(backup.ApplyLogEntry(*sent).ok());
    ExpectSameState(primary, backup);
    CHECK(backup.counters().skipped_steps == 1);
  }
}

}  // namespace
}  // namespace paramserver
