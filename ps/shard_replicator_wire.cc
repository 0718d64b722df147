// The replication wire: log entries and a replica's whole state to and from their
// protobuf messages, every number a peer sends checked before it is used.
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/embedding_checkpoint.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"
#include "ps/shard_replicator.h"

namespace paramserver {

namespace {

// INVALID_ARGUMENT naming the first NaN/Inf of a replicated gradient: a primary never
// logs one (it refuses such pushes), so a peer sending one is not to be trusted.
absl::Status CheckFinite(absl::Span<const float> gradient, int64_t index) {
  if (const size_t i = FirstNonFinite(gradient); i < gradient.size()) {
    return absl::InvalidArgumentError(absl::StrCat("log entry ", index, ": gradient[", i, "] is ",
                                                   gradient[i],
                                                   "; only finite values are accepted"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The gradient of a log entry: `bytes` decoded, for a dense shard's range or for the
// rows of `ids`/`counts` on an embedding shard (which `rows` receives).
absl::Status DecodeEntryGradient(const ShardLogEntry& entry, const char* what,
                                 const std::string& bytes, const std::string& ids,
                                 const google::protobuf::RepeatedField<int32_t>& counts,
                                 const ParameterShardOptions& options, ShardMutation* mutation) {
  int64_t size = options.range.size();
  if (options.embedding != nullptr) {
    absl::StatusOr<RowIds> rows = RowIdsFromWire(
        ids, absl::MakeConstSpan(counts.data(), counts.size()), options.embedding->shape);
    if (!rows.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("log entry ", entry.index(), ": ", rows.status().message()));
    }
    mutation->rows = *std::move(rows);
    size = RowFloats(mutation->rows.view(), options.embedding->shape.dims);
  }
  mutation->gradient.resize(size);
  PS_RETURN_IF_ERROR(DecodeFloatsExactly(bytes, absl::MakeSpan(mutation->gradient),
                                         absl::StrCat("log entry ", entry.index(), " ", what)));
  return CheckFinite(mutation->gradient, entry.index());
}

// A skipped step's entry carries no gradient and no rows.
absl::Status CheckSkippedEntryEmpty(const ShardLogEntry& entry, const std::string& gradient,
                                    const std::string& ids,
                                    const google::protobuf::RepeatedField<int32_t>& counts) {
  if (gradient.empty() && ids.empty() && counts.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("log entry ", entry.index(), " skips its step but carries a gradient"));
}

// A log entry's or a replica's step settings (a script's), read against the spec's
// optimizer as a worker's are.
absl::StatusOr<StepHyperparameters> DecodeSettings(const std::string& described,
                                                   const StepOptimizer& settings,
                                                   const DenseOptimizerOptions* optimizer,
                                                   bool embedding, int64_t size) {
  if (embedding || optimizer == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(described, ": optimizer settings for a shard that takes none"));
  }
  absl::StatusOr<StepHyperparameters> read =
      StepHyperparametersFromProto(settings, *optimizer, size);
  if (!read.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(described, ": ", read.status().message()));
  }
  return read;
}

}  // namespace

absl::StatusOr<ShardMutation> MutationFromEntry(const ShardLogEntry& entry,
                                                const ParameterShardOptions& options) {
  ShardMutation mutation;
  mutation.index = entry.index();
  if (entry.has_push()) {
    mutation.kind = ShardMutation::Kind::kPush;
    mutation.worker_rank = entry.push().worker_rank();
    mutation.step = entry.push().step();
    mutation.skipped = entry.push().skip_step();
    if (mutation.skipped) {
      PS_RETURN_IF_ERROR(CheckSkippedEntryEmpty(entry, entry.push().gradient(), entry.push().ids(),
                                                entry.push().id_counts()));
      return mutation;
    }
    PS_RETURN_IF_ERROR(DecodeEntryGradient(entry, "gradient", entry.push().gradient(),
                                           entry.push().ids(), entry.push().id_counts(), options,
                                           &mutation));
    if (entry.push().has_optimizer()) {
      PS_ASSIGN_OR_RETURN(
          mutation.settings,
          DecodeSettings(absl::StrCat("log entry ", entry.index()), entry.push().optimizer(),
                         &options.optimizer, options.embedding != nullptr, options.range.size()));
    }
    return mutation;
  }
  if (entry.has_sync_step()) {
    mutation.kind = ShardMutation::Kind::kSyncStep;
    mutation.step = entry.sync_step().step();
    mutation.skipped = entry.sync_step().skipped();
    mutation.step_sum_squares = entry.sync_step().step_sum_squares();
    mutation.clip_coefficient = entry.sync_step().clip_coefficient();
    if (!(mutation.clip_coefficient >= 0 && mutation.clip_coefficient <= 1) ||
        !(mutation.step_sum_squares >= 0 && std::isfinite(mutation.step_sum_squares))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "log entry ", entry.index(), ": a clip coefficient of ", mutation.clip_coefficient,
          " and a sum of squares of ", mutation.step_sum_squares));
    }
    if (mutation.skipped) {
      PS_RETURN_IF_ERROR(CheckSkippedEntryEmpty(entry, entry.sync_step().mean_gradient(),
                                                entry.sync_step().ids(),
                                                entry.sync_step().id_counts()));
      return mutation;
    }
    PS_RETURN_IF_ERROR(DecodeEntryGradient(
        entry, "mean gradient", entry.sync_step().mean_gradient(), entry.sync_step().ids(),
        entry.sync_step().id_counts(), options, &mutation));
    if (entry.sync_step().has_optimizer()) {
      PS_ASSIGN_OR_RETURN(
          mutation.settings,
          DecodeSettings(absl::StrCat("log entry ", entry.index()), entry.sync_step().optimizer(),
                         &options.optimizer, options.embedding != nullptr, options.range.size()));
    }
    return mutation;
  }
  if (entry.has_initial_values()) {
    if (options.embedding != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("log entry ", entry.index(), ": initial values for an embedding shard"));
    }
    mutation.kind = ShardMutation::Kind::kInitialValues;
    PS_RETURN_IF_ERROR(DecodeEntryGradient(entry, "initial values", entry.initial_values().values(),
                                           {}, {}, options, &mutation));
    return mutation;
  }
  if (entry.has_active_workers()) {
    mutation.kind = ShardMutation::Kind::kActiveWorkers;
    mutation.active.assign(entry.active_workers().active().begin(),
                           entry.active_workers().active().end());
    return mutation;
  }
  return absl::InvalidArgumentError(absl::StrCat("log entry ", entry.index(), " has no mutation"));
}

ShardLogEntry EntryFromMutation(const ShardMutation& mutation, int shard_id) {
  ShardLogEntry entry;
  entry.set_index(mutation.index);
  switch (mutation.kind) {
    case ShardMutation::Kind::kPush: {
      PushRequest* push = entry.mutable_push();
      push->set_shard_id(shard_id);
      push->set_worker_rank(mutation.worker_rank);
      push->set_step(mutation.step);
      push->set_skip_step(mutation.skipped);
      AppendFloatsLittleEndian(mutation.gradient, push->mutable_gradient());
      if (!mutation.rows.counts.empty()) {
        *push->mutable_ids() = EncodeIds(mutation.rows.ids);
        push->mutable_id_counts()->Add(mutation.rows.counts.begin(), mutation.rows.counts.end());
      }
      if (!mutation.settings.empty()) {
        StepHyperparametersToProto(mutation.settings.front().options.type, mutation.settings,
                                   push->mutable_optimizer());
      }
      break;
    }
    case ShardMutation::Kind::kSyncStep: {
      SyncStep* sync_step = entry.mutable_sync_step();
      sync_step->set_step(mutation.step);
      sync_step->set_skipped(mutation.skipped);
      sync_step->set_step_sum_squares(mutation.step_sum_squares);
      sync_step->set_clip_coefficient(mutation.clip_coefficient);
      AppendFloatsLittleEndian(mutation.gradient, sync_step->mutable_mean_gradient());
      if (!mutation.rows.counts.empty()) {
        *sync_step->mutable_ids() = EncodeIds(mutation.rows.ids);
        sync_step->mutable_id_counts()->Add(mutation.rows.counts.begin(),
                                            mutation.rows.counts.end());
      }
      if (!mutation.settings.empty()) {
        StepHyperparametersToProto(mutation.settings.front().options.type, mutation.settings,
                                   sync_step->mutable_optimizer());
      }
      break;
    }
    case ShardMutation::Kind::kActiveWorkers:
      for (bool a : mutation.active) entry.mutable_active_workers()->add_active(a);
      break;
    case ShardMutation::Kind::kInitialValues:
      AppendFloatsLittleEndian(mutation.gradient, entry.mutable_initial_values()->mutable_values());
      break;
  }
  return entry;
}

namespace {

// An embedding shard's part of a replica: its tables' rows, sightings and pending rows,
// each size checked against the tables before anything is allocated for it.
absl::Status EmbeddingReplicaFromProto(const ShardReplicaState& proto,
                                       const EmbeddingShardOptions& embedding,
                                       const std::string& described, ReplicaState* replica) {
  const size_t tables = embedding.tables.size();
  if (static_cast<size_t>(proto.tables_size()) != tables ||
      proto.pending_rows_size() != proto.pending_gradients_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        described, ": ", proto.tables_size(), " tables and ", proto.pending_rows_size(),
        " pending row lists; expected ", tables, " and ", proto.pending_gradients_size()));
  }
  // A table's rows are bounded by the message (already received), not by a call's ids.
  constexpr int64_t kNoBound = std::numeric_limits<int64_t>::max();
  replica->sightings.resize(tables);
  for (size_t t = 0; t < tables; ++t) {
    const EmbeddingTableRows& rows = proto.tables(t);
    const EmbeddingTableOptions& options = embedding.tables[t];
    const int state_floats = StateFloatsPerRow(options.optimizer.type, options.dim);
    EmbeddingShardState& table = replica->shard.tables.emplace_back();
    table.table_index = static_cast<int>(t);
    table.dim = options.dim;
    table.state_floats = state_floats;
    table.shard_id = embedding.shape.bucket;
    table.shard_count = embedding.shape.bucket_count;
    table.step = proto.applied_updates();
    table.skipped_steps = proto.skipped_steps();
    PS_ASSIGN_OR_RETURN(table.ids, DecodeIds(rows.ids(), kNoBound));
    const size_t n = table.ids.size();
    if (rows.rows().size() != n * options.dim * sizeof(float) ||
        rows.state().size() != n * state_floats * sizeof(float)) {
      return absl::InvalidArgumentError(
          absl::StrCat(described, ": table C", t + 1, " has ", n, " ids but ", rows.rows().size(),
                       " bytes of rows and ", rows.state().size(), " bytes of state"));
    }
    table.rows.resize(n * options.dim);
    DecodeFloatsLittleEndian(rows.rows(), table.rows.data());
    table.state.resize(n * state_floats);
    DecodeFloatsLittleEndian(rows.state(), table.state.data());
    // Rows as the primary stores them come with the links to their order, which is
    // followed here (each link checked), off the primary and its lock.
    const std::string& links = rows.recency_links();
    if (!links.empty()) {
      if (links.size() != n * sizeof(uint32_t)) {
        return absl::InvalidArgumentError(absl::StrCat(described, ": table C", t + 1, " has ", n,
                                                       " ids but ", links.size(),
                                                       " bytes of recency links"));
      }
      table.next_more_recent.resize(n);
      PS_RETURN_IF_ERROR(DecodeUint32sExactly(links, absl::MakeSpan(table.next_more_recent),
                                              absl::StrCat(described, " recency links")));
      table.least_recent = rows.least_recent();
      if (absl::Status ordered = OrderRowsByRecency(&table); !ordered.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(described, ": ", ordered.message()));
      }
    }
    PS_ASSIGN_OR_RETURN(std::vector<int64_t> pending, DecodeIds(rows.pending_ids(), kNoBound));
    if (pending.size() != static_cast<size_t>(rows.sightings_size())) {
      return absl::InvalidArgumentError(absl::StrCat(described, ": table C", t + 1, " has ",
                                                     pending.size(), " pending ids and ",
                                                     rows.sightings_size(), " sightings"));
    }
    for (size_t i = 0; i < pending.size(); ++i)
      replica->sightings[t].emplace_back(pending[i], rows.sightings(i));
  }
  for (const RowIdList& list : proto.pending_rows()) {
    if (list.ids().empty() && list.id_counts().empty()) {
      replica->pending_rows.emplace_back();
      continue;
    }
    absl::StatusOr<RowIds> rows = RowIdsFromWire(
        list.ids(), absl::MakeConstSpan(list.id_counts().data(), list.id_counts_size()),
        embedding.shape);
    if (!rows.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(described, ": a pending gradient's ids: ", rows.status().message()));
    }
    replica->pending_rows.push_back(*std::move(rows));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReplicaState> ReplicaStateFromProto(const ShardReplicaState& proto,
                                                   const ReplicaExpectation& expected) {
  const std::string described = absl::StrCat("replica of shard ", proto.shard_id(), " [",
                                             proto.begin(), ", ", proto.end(), ")");
  // Every number the peer sent is checked against what we expect before anything is
  // allocated for it.
  if (proto.begin() != expected.range.begin || proto.end() != expected.range.end ||
      (expected.range.size() <= 0) != (expected.embedding != nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(described, ": the shard map assigns [",
                                                   expected.range.begin, ", ", expected.range.end,
                                                   ")"));
  }
  const int64_t size = expected.range.size();
  const size_t workers = static_cast<size_t>(std::max(0, expected.num_workers));
  if (static_cast<size_t>(proto.active_workers_size()) != workers ||
      static_cast<size_t>(proto.pushed_steps_size()) != workers ||
      static_cast<size_t>(proto.pending_received_size()) != workers ||
      static_cast<size_t>(proto.pending_gradients_size()) != workers) {
    return absl::InvalidArgumentError(
        absl::StrCat(described, ": per-worker state for ", proto.active_workers_size(), "/",
                     proto.pushed_steps_size(), "/", proto.pending_received_size(), "/",
                     proto.pending_gradients_size(), " workers; this cluster has ", workers));
  }
  if (proto.optimizer().size() > kMaxOptimizerNameBytes ||
      static_cast<size_t>(proto.optimizer_slots_size()) > kMaxOptimizerSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat(described, ": an optimizer name of ", proto.optimizer().size(), " bytes and ",
                     proto.optimizer_slots_size(), " slots (at most ", kMaxOptimizerNameBytes,
                     " and ", kMaxOptimizerSlots, ")"));
  }
  std::vector<const std::string*> arrays = {&proto.values()};
  for (const std::string& slot : proto.optimizer_slots()) arrays.push_back(&slot);
  for (const std::string* bytes : arrays) {
    if (bytes->size() % sizeof(float) != 0 ||
        static_cast<int64_t>(bytes->size() / sizeof(float)) != size) {
      return absl::InvalidArgumentError(
          absl::StrCat(described, ": ", bytes->size(), " bytes of state, not ", size, " floats"));
    }
  }
  for (const std::string& bytes : proto.pending_gradients()) {
    // Empty (nothing pending) or one value per parameter of the range (an embedding
    // shard's are checked against their rows below).
    if (!bytes.empty() && expected.embedding == nullptr &&
        (bytes.size() % sizeof(float) != 0 ||
         static_cast<int64_t>(bytes.size() / sizeof(float)) != size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          described, ": a pending gradient of ", bytes.size(), " bytes, not ", size, " floats"));
    }
  }
  ReplicaState replica;
  replica.shard.shard_id = proto.shard_id();
  replica.shard.range = expected.range;
  replica.shard.step = proto.applied_updates();
  replica.shard.skipped_steps = proto.skipped_steps();
  if (replica.shard.skipped_steps < 0 || replica.shard.skipped_steps > replica.shard.step ||
      (proto.pending_skipped_size() != 0 &&
       static_cast<size_t>(proto.pending_skipped_size()) != workers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        described, ": ", replica.shard.skipped_steps, " skipped of ", replica.shard.step,
        " steps, ", proto.pending_skipped_size(), " pending skips for ", workers, " workers"));
  }
  replica.pending_skipped.assign(proto.pending_skipped().begin(), proto.pending_skipped().end());
  replica.pending_clip_grad_norm = proto.pending_clip_grad_norm();
  replica.held = proto.held();
  replica.held_sum_squares = proto.held_sum_squares();
  if (replica.held) {
    if (expected.embedding != nullptr ||
        proto.held_mean().size() != static_cast<size_t>(size) * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(described, ": a held mean of ",
                                                     proto.held_mean().size(), " bytes, not ", size,
                                                     " floats"));
    }
    replica.held_mean.resize(size);
    PS_RETURN_IF_ERROR(DecodeFloatsExactly(proto.held_mean(), absl::MakeSpan(replica.held_mean),
                                           described + " held mean"));
  }
  // Oldest first, each before the shard's next step: clipped by a coefficient in (0, 1]
  // with its sum of squares, or skipped (0 and 0).
  bool clip_ok = std::isfinite(replica.pending_clip_grad_norm) &&
                 replica.pending_clip_grad_norm >= 0 &&
                 proto.recent_steps_size() <= kRememberedSyncSteps;
  int64_t after = -1;
  for (const EndedSyncStep& ended : proto.recent_steps()) {
    const bool skipped = ended.coefficient() == 0 && ended.sum_squares() == 0;
    const bool clipped = ended.coefficient() > 0 && ended.coefficient() <= 1 &&
                         std::isfinite(ended.sum_squares()) && ended.sum_squares() >= 0;
    clip_ok = clip_ok && ended.step() > after && ended.step() < replica.shard.step &&
              (skipped || clipped);
    after = ended.step();
    replica.recent_steps.push_back(
        ClippedStep{ended.step(), ended.sum_squares(), ended.coefficient()});
  }
  if (!clip_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(described, ": a clip_grad_norm or one of its ", proto.recent_steps_size(),
                     " recent clipped steps out of range (at most ", kRememberedSyncSteps,
                     ", oldest first, each before step ", replica.shard.step, ")"));
  }
  replica.log_index = proto.log_index();
  replica.awaiting_initial_values = proto.awaiting_initial_values();
  replica.shard.optimizer = proto.optimizer();
  replica.shard.slots.resize(proto.optimizer_slots_size());
  for (size_t k = 0; k < arrays.size(); ++k) {
    std::vector<float>& out = k == 0 ? replica.shard.values : replica.shard.slots[k - 1];
    out.resize(size);
    absl::Status decoded = DecodeFloatsExactly(
        *arrays[k], absl::MakeSpan(out),
        absl::StrCat("replica of shard ", proto.shard_id(), " ",
                     k == 0 ? std::string("values") : absl::StrCat("optimizer slot ", k - 1)));
    if (!decoded.ok()) return decoded;
  }
  replica.active.assign(proto.active_workers().begin(), proto.active_workers().end());
  replica.pushed_steps.assign(proto.pushed_steps().begin(), proto.pushed_steps().end());
  replica.pending_received.assign(proto.pending_received().begin(), proto.pending_received().end());
  for (const std::string& bytes : proto.pending_gradients()) {
    if (bytes.size() % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(described, ": a pending gradient of ", bytes.size(), " bytes"));
    }
    std::vector<float>& gradient =
        replica.pending_gradients.emplace_back(bytes.size() / sizeof(float));
    DecodeFloatsLittleEndian(bytes, gradient.data());
  }
  if (expected.embedding != nullptr) {
    PS_RETURN_IF_ERROR(EmbeddingReplicaFromProto(proto, *expected.embedding, described, &replica));
  }
  if (proto.has_pending_optimizer()) {
    PS_ASSIGN_OR_RETURN(replica.pending_settings,
                        DecodeSettings(described, proto.pending_optimizer(), expected.optimizer,
                                       expected.embedding != nullptr, size));
  }
  return replica;
}

}  // namespace paramserver
