// A replica's whole state on the wire: as one message (ReplicaStateToProto), and as the
// stream of pieces FetchShardState sends a new backup (WriteReplicaStatePieces), which
// the backup puts together again (ReplicaStateAssembler), checking each piece first.
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"
#include "ps/shard_replicator.h"

namespace paramserver {

namespace {

// One bulk field of a replica's state as the primary holds it: float32, int64 or uint32
// values (one kind set), each sent little-endian.
struct BulkSource {
  absl::Span<const float> floats;
  absl::Span<const int64_t> ids;
  absl::Span<const uint32_t> links;

  size_t element_bytes() const {
    if (!ids.empty()) return sizeof(int64_t);
    if (!links.empty()) return sizeof(uint32_t);
    return sizeof(float);
  }
  size_t count() const { return floats.size() + ids.size() + links.size(); }
  int64_t bytes() const { return static_cast<int64_t>(count() * element_bytes()); }
  // Appends elements [begin, begin + n) to `out`.
  void Append(size_t begin, size_t n, std::string* out) const {
    if (!ids.empty()) {
      AppendIds(ids.subspan(begin, n), out);
    } else if (!links.empty()) {
      AppendUint32sLittleEndian(links.subspan(begin, n), out);
    } else {
      AppendFloatsLittleEndian(floats.subspan(begin, n), out);
    }
  }
};

// The bulk fields in the stream's order: values, each optimizer slot, then per table
// its ids, rows, state and recency links. BulkFields names the same fields of the
// message.
constexpr size_t kBulkFieldsPerTable = 4;
std::vector<BulkSource> BulkSources(const ReplicaState& replica) {
  std::vector<BulkSource> sources = {{replica.shard.values, {}, {}}};
  for (const std::vector<float>& slot : replica.shard.slots) sources.push_back({slot, {}, {}});
  for (const EmbeddingShardState& table : replica.shard.tables) {
    sources.push_back({{}, table.ids, {}});
    sources.push_back({table.rows, {}, {}});
    sources.push_back({table.state, {}, {}});
    sources.push_back({{}, {}, table.next_more_recent});
  }
  return sources;
}

std::vector<std::string*> BulkFields(ShardReplicaState* state) {
  std::vector<std::string*> fields = {state->mutable_values()};
  for (std::string& slot : *state->mutable_optimizer_slots()) fields.push_back(&slot);
  for (EmbeddingTableRows& table : *state->mutable_tables()) {
    fields.push_back(table.mutable_ids());
    fields.push_back(table.mutable_rows());
    fields.push_back(table.mutable_state());
    fields.push_back(table.mutable_recency_links());
  }
  return fields;
}

// Everything of `replica` but its bulk fields, which are left empty (one per slot and
// table, in place).
ShardReplicaState ReplicaStateHeader(const ReplicaState& replica) {
  ShardReplicaState proto;
  proto.set_shard_id(replica.shard.shard_id);
  proto.set_begin(replica.shard.range.begin);
  proto.set_end(replica.shard.range.end);
  proto.set_applied_updates(replica.shard.step);
  proto.set_skipped_steps(replica.shard.skipped_steps);
  for (bool skipped : replica.pending_skipped) proto.add_pending_skipped(skipped);
  proto.set_pending_clip_grad_norm(replica.pending_clip_grad_norm);
  proto.set_held(replica.held);
  if (replica.held) {
    AppendFloatsLittleEndian(replica.held_mean, proto.mutable_held_mean());
    proto.set_held_sum_squares(replica.held_sum_squares);
  }
  for (const ClippedStep& ended : replica.recent_steps) {
    EndedSyncStep* step = proto.add_recent_steps();
    step->set_step(ended.step);
    step->set_sum_squares(ended.sum_squares);
    step->set_coefficient(ended.coefficient);
  }
  proto.set_log_index(replica.log_index);
  proto.set_awaiting_initial_values(replica.awaiting_initial_values);
  proto.set_optimizer(replica.shard.optimizer);
  for (size_t k = 0; k < replica.shard.slots.size(); ++k) proto.add_optimizer_slots();
  for (bool a : replica.active) proto.add_active_workers(a);
  for (int64_t s : replica.pushed_steps) proto.add_pushed_steps(s);
  for (bool p : replica.pending_received) proto.add_pending_received(p);
  for (const std::vector<float>& gradient : replica.pending_gradients) {
    AppendFloatsLittleEndian(gradient, proto.add_pending_gradients());
  }
  for (size_t t = 0; t < replica.shard.tables.size(); ++t) {
    EmbeddingTableRows* rows = proto.add_tables();
    if (!replica.shard.tables[t].next_more_recent.empty()) {
      rows->set_least_recent(replica.shard.tables[t].least_recent);
    }
    if (t < replica.sightings.size()) {
      std::vector<int64_t> pending_ids;
      for (const auto& [id, count] : replica.sightings[t]) {
        pending_ids.push_back(id);
        rows->add_sightings(count);
      }
      *rows->mutable_pending_ids() = EncodeIds(pending_ids);
    }
  }
  for (const RowIds& pending : replica.pending_rows) {
    RowIdList* list = proto.add_pending_rows();
    *list->mutable_ids() = EncodeIds(pending.ids);
    list->mutable_id_counts()->Add(pending.counts.begin(), pending.counts.end());
  }
  if (!replica.pending_settings.empty()) {
    StepHyperparametersToProto(replica.pending_settings.front().options.type,
                               replica.pending_settings, proto.mutable_pending_optimizer());
  }
  return proto;
}

// What a backup may be asked to hold in all: this machine's memory.
int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pages) * page_bytes;
}

}  // namespace

ShardReplicaState ReplicaStateToProto(const ReplicaState& replica) {
  ShardReplicaState proto = ReplicaStateHeader(replica);
  const std::vector<BulkSource> sources = BulkSources(replica);
  const std::vector<std::string*> fields = BulkFields(&proto);
  for (size_t i = 0; i < sources.size(); ++i) {
    fields[i]->reserve(sources[i].bytes());
    sources[i].Append(0, sources[i].count(), fields[i]);
  }
  return proto;
}

absl::Status WriteReplicaStatePieces(const ReplicaState& replica, size_t piece_bytes,
                                     size_t max_header_bytes,
                                     const std::function<bool(const ShardStatePiece&)>& write) {
  const int shard_id = replica.shard.shard_id;
  const std::vector<BulkSource> sources = BulkSources(replica);
  int64_t total = 0;
  ShardStatePiece piece;
  *piece.mutable_state() = ReplicaStateHeader(replica);
  for (const BulkSource& source : sources) {
    piece.add_bulk_bytes(source.bytes());
    total += source.bytes();
  }
  if (const size_t header_bytes = piece.ByteSizeLong(); header_bytes > max_header_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "shard ", shard_id, "'s state besides its values and rows is ", header_bytes >> 20,
        " MiB (the pending gradients of a sync step), past the ", max_header_bytes >> 20,
        " MiB one message carries, so no backup can copy it: raise cluster.shards or "
        "cluster.embedding_shards so that each shard holds less"));
  }
  int64_t sent = 0;
  const auto send = [&](const ShardStatePiece& next) -> absl::Status {
    if (write(next)) return absl::OkStatus();
    return absl::CancelledError(absl::StrCat("the backup stopped reading shard ", shard_id,
                                             "'s state after ", sent, " of ", total, " bytes"));
  };
  PS_RETURN_IF_ERROR(send(piece));
  piece.Clear();
  std::string& data = *piece.mutable_data();
  piece_bytes = std::max(piece_bytes, sizeof(int64_t));
  data.reserve(piece_bytes);
  for (const BulkSource& source : sources) {
    const size_t count = source.count();
    for (size_t done = 0; done < count;) {
      const size_t room = (piece_bytes - data.size()) / source.element_bytes();
      const size_t n = std::min(room, count - done);
      source.Append(done, n, &data);
      done += n;
      if (data.size() + source.element_bytes() > piece_bytes) {
        PS_RETURN_IF_ERROR(send(piece));
        sent += static_cast<int64_t>(data.size());
        data.clear();
      }
    }
  }
  if (!data.empty()) PS_RETURN_IF_ERROR(send(piece));
  return absl::OkStatus();
}

ReplicaStateAssembler::ReplicaStateAssembler(ReplicaExpectation expected)
    : expected_(std::move(expected)) {}

absl::Status ReplicaStateAssembler::Add(ShardStatePiece&& piece) {
  if (!broken_.ok()) return broken_;
  absl::Status status;
  if (!has_header_) {
    status = AddHeader(std::move(piece));
  } else if (piece.has_state() || piece.bulk_bytes_size() > 0) {
    status = absl::InvalidArgumentError(
        absl::StrCat("a second header in shard ", state_.shard_id(), "'s state"));
  } else if (static_cast<int64_t>(piece.data().size()) > expected_bytes_ - received_) {
    status = absl::InvalidArgumentError(
        absl::StrCat("shard ", state_.shard_id(), "'s state: a piece of ", piece.data().size(),
                     " bytes after ", received_, " of the ", expected_bytes_, " declared"));
  } else {
    absl::string_view data = piece.data();
    while (!data.empty()) {
      while (static_cast<int64_t>(fields_[field_]->size()) == lengths_[field_]) ++field_;
      const size_t take = std::min<size_t>(data.size(), lengths_[field_] - fields_[field_]->size());
      fields_[field_]->append(data.data(), take);
      data.remove_prefix(take);
    }
    received_ += static_cast<int64_t>(piece.data().size());
  }
  if (!status.ok()) broken_ = status;
  return status;
}

absl::Status ReplicaStateAssembler::AddHeader(ShardStatePiece&& piece) {
  if (!piece.has_state() || !piece.data().empty()) {
    return absl::InvalidArgumentError(
        "a shard's state began with a piece of data rather than its header");
  }
  state_ = std::move(*piece.mutable_state());
  const std::string described = absl::StrCat("shard ", state_.shard_id(), "'s state");
  const size_t tables = expected_.embedding == nullptr ? 0 : expected_.embedding->tables.size();
  if (static_cast<size_t>(state_.tables_size()) != tables ||
      static_cast<size_t>(state_.optimizer_slots_size()) > kMaxOptimizerSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat(described, ": ", state_.tables_size(), " tables and ",
                     state_.optimizer_slots_size(), " optimizer slots; expected ", tables,
                     " tables and at most ", kMaxOptimizerSlots, " slots"));
  }
  fields_ = BulkFields(&state_);
  if (static_cast<size_t>(piece.bulk_bytes_size()) != fields_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(described, ": ", piece.bulk_bytes_size(),
                                                   " bulk lengths for ", fields_.size(),
                                                   " bulk fields"));
  }
  for (const std::string* field : fields_) {
    if (!field->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(described, ": its header carries values or rows"));
    }
  }
  lengths_.assign(piece.bulk_bytes().begin(), piece.bulk_bytes().end());
  // Every length is checked before any is reserved: a dense range's fields hold its
  // floats exactly; a table's ids, rows, state and links (or none) are of one row count,
  // within the table's max_rows when it has one.
  const int64_t range_bytes =
      std::max<int64_t>(0, expected_.range.size()) * static_cast<int64_t>(sizeof(float));
  const size_t dense_fields = 1 + static_cast<size_t>(state_.optimizer_slots_size());
  const int64_t memory = PhysicalMemoryBytes();
  for (size_t i = 0; i < lengths_.size(); ++i) {
    if (lengths_[i] < 0 || lengths_[i] > memory) {
      return absl::InvalidArgumentError(absl::StrCat(described, ": a field of ", lengths_[i],
                                                     " bytes (this machine has ", memory, ")"));
    }
    if (i < dense_fields && lengths_[i] != range_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(described, ": ", lengths_[i],
                                                     " bytes of values or optimizer state; its "
                                                     "range [",
                                                     expected_.range.begin, ", ",
                                                     expected_.range.end, ") has ", range_bytes));
    }
  }
  for (size_t t = 0; t < tables; ++t) {
    const EmbeddingTableOptions& options = expected_.embedding->tables[t];
    const int64_t row_bytes = int64_t{options.dim} * static_cast<int64_t>(sizeof(float));
    const int64_t state_bytes =
        int64_t{StateFloatsPerRow(options.optimizer.type, options.dim)} * sizeof(float);
    const size_t first = dense_fields + kBulkFieldsPerTable * t;
    const int64_t ids = lengths_[first];
    const int64_t rows = lengths_[first + 1];
    const int64_t state = lengths_[first + 2];
    const int64_t links = lengths_[first + 3];
    const int64_t n = ids / static_cast<int64_t>(sizeof(int64_t));
    // rows == n * row_bytes, state == n * state_bytes and links 0 or n * 4, checked
    // without overflow.
    const bool fits =
        ids % static_cast<int64_t>(sizeof(int64_t)) == 0 && row_bytes > 0 &&
        rows % row_bytes == 0 && rows / row_bytes == n &&
        (state_bytes == 0 ? state == 0 : state % state_bytes == 0 && state / state_bytes == n) &&
        (links == 0 || links == n * static_cast<int64_t>(sizeof(uint32_t)));
    if (!fits) {
      return absl::InvalidArgumentError(
          absl::StrCat(described, ": table C", t + 1, " declares ", ids, " bytes of ids, ", rows,
                       " bytes of rows, ", state, " bytes of state and ", links,
                       " bytes of recency links; rows of dim ", options.dim, " take ", row_bytes,
                       " and ", state_bytes, " bytes each"));
    }
    if (options.max_rows > 0 && n > options.max_rows) {
      return absl::InvalidArgumentError(absl::StrCat(described, ": table C", t + 1, " declares ", n,
                                                     " rows; it holds at most ", options.max_rows));
    }
  }
  int64_t total = 0;
  for (int64_t length : lengths_) {
    total += length;  // each at most `memory`, so no overflow before the check below
    if (total > memory) {
      return absl::InvalidArgumentError(
          absl::StrCat(described, ": more than this machine's ", memory, " bytes of memory"));
    }
  }
  for (size_t i = 0; i < fields_.size(); ++i) fields_[i]->reserve(lengths_[i]);
  expected_bytes_ = total;
  has_header_ = true;
  return absl::OkStatus();
}

absl::StatusOr<ReplicaState> ReplicaStateAssembler::Finish() {
  if (!broken_.ok()) return broken_;
  if (!has_header_) return absl::InvalidArgumentError("a shard's state ended before its header");
  if (received_ != expected_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", state_.shard_id(),
                                                   "'s state ended after ", received_, " of the ",
                                                   expected_bytes_, " bytes declared"));
  }
  // The message's bytes are let go of as this returns, leaving the decoded state.
  const ShardReplicaState state = std::move(state_);
  fields_.clear();
  has_header_ = false;
  broken_ = absl::FailedPreconditionError("the assembled state was taken already");
  return ReplicaStateFromProto(state, expected_);
}

}  // namespace paramserver
