#include "scheduler/data_lease_table.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace paramserver {
namespace {

constexpr int64_t kMaxExamples = int64_t{1} << 40;
constexpr int32_t kMaxBatchSize = 1 << 24;
constexpr int64_t kMaxStep = int64_t{1} << 53;
constexpr int kRetryAfterMs = 100;

bool Leased(const DataPiece& piece) { return piece.lease_id() != 0; }

std::string Describe(const DataPiece& piece) {
  return absl::StrCat("lease ", piece.lease_id(), " (epoch ", piece.epoch(), ", positions [",
                      piece.begin(), ", ", piece.end(), "))");
}

}  // namespace

DataLeaseTable::DataLeaseTable(int epochs, int chunk_batches, int workers) {
  state_.set_epochs(epochs);
  state_.set_chunk_examples(chunk_batches);  // in batches until the batch size is known
  state_.set_next_lease_id(1);
  for (int r = 0; r < workers; ++r) {
    state_.add_rank_step_floor(0);
    state_.add_rank_fenced_at_epoch(0);
  }
}

int64_t DataLeaseTable::usable_examples() const {
  return state_.batch_size() == 0
             ? 0
             : state_.example_count() / state_.batch_size() * state_.batch_size();
}

bool DataLeaseTable::done() const {
  return state_.example_count() > 0 && state_.epoch() >= state_.epochs() && state_.pieces().empty();
}

bool DataLeaseTable::settling() const {
  return std::any_of(state_.rank_fenced_at_epoch().begin(), state_.rank_fenced_at_epoch().end(),
                     [](int64_t epoch) { return epoch > 0; });
}

void DataLeaseTable::Acknowledge(int index, int64_t trained_batches) {
  ++changes_;
  DataPiece& piece = *state_.mutable_pieces(index);
  const int64_t trained = trained_batches * state_.batch_size();
  state_.set_trained_examples(piece.epoch(), state_.trained_examples(piece.epoch()) + trained);
  if (piece.begin() + trained >= piece.end()) {
    state_.mutable_pieces()->erase(state_.mutable_pieces()->begin() + index);
    return;
  }
  piece.set_begin(piece.begin() + trained);
  piece.set_lease_id(0);
  piece.set_rank(0);
  piece.set_first_step(0);
  piece.set_fenced_at_epoch(0);
  state_.set_handed_back(state_.handed_back() + 1);
}

int DataLeaseTable::TakeWaitingPiece() {
  int lowest = -1;
  for (int i = 0; i < state_.pieces_size(); ++i) {
    const DataPiece& p = state_.pieces(i);
    if (Leased(p)) continue;
    if (lowest < 0 ||
        std::make_tuple(p.epoch(), p.begin()) <
            std::make_tuple(state_.pieces(lowest).epoch(), state_.pieces(lowest).begin())) {
      lowest = i;
    }
  }
  if (lowest >= 0) return lowest;
  if (state_.epoch() >= state_.epochs()) return -1;
  ++changes_;
  DataPiece* piece = state_.add_pieces();
  piece->set_epoch(state_.epoch());
  piece->set_begin(state_.frontier());
  piece->set_end(std::min(state_.frontier() + state_.chunk_examples(), usable_examples()));
  state_.set_frontier(piece->end());
  if (state_.frontier() >= usable_examples()) {
    state_.set_epoch(state_.epoch() + 1);
    state_.set_frontier(0);
  }
  return state_.pieces_size() - 1;
}

absl::StatusOr<LeaseDataResponse> DataLeaseTable::Lease(int rank, const LeaseDataRequest& request) {
  if (rank < 0 || rank >= state_.rank_step_floor_size()) {
    return absl::InvalidArgumentError(absl::StrCat("lease: worker rank ", rank,
                                                   " is outside the job's ",
                                                   state_.rank_step_floor_size(), " workers"));
  }
  if (request.example_count() < 1 || request.example_count() > kMaxExamples ||
      request.batch_size() < 1 || request.batch_size() > kMaxBatchSize || request.next_step() < 0 ||
      request.next_step() > kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease: example_count must be 1 to 2^40, batch_size 1 to 2^24 and next_step 0 to 2^53; "
        "got ",
        request.example_count(), ", ", request.batch_size(), " and ", request.next_step()));
  }
  if (request.example_count() < request.batch_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease: ", request.example_count(), " examples hold no batch of ", request.batch_size()));
  }
  if (state_.example_count() == 0) {
    ++changes_;
    state_.set_example_count(request.example_count());
    state_.set_batch_size(request.batch_size());
    state_.set_chunk_examples(state_.chunk_examples() * request.batch_size());
    for (int e = 0; e < state_.epochs(); ++e) state_.add_trained_examples(0);
  } else if (request.example_count() != state_.example_count() ||
             request.batch_size() != state_.batch_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lease: this worker has ", request.example_count(), " examples in batches of ",
        request.batch_size(), ", but the job's lease table was made for ", state_.example_count(),
        " in batches of ", state_.batch_size(), ": every worker must train the same data"));
  }
  LeaseDataResponse response;
  if (state_.rank_fenced_at_epoch(rank) > 0) {
    // A new process of the rank (or the same one, admitted again) must start past every
    // push its fenced predecessor made: the servers' reports say where.
    response.set_outcome(LEASE_WAIT);
    response.set_retry_after_ms(kRetryAfterMs);
    response.set_waiting_for(absl::StrCat(
        "the servers' reports of this rank's pushes before its process was fenced at map ",
        state_.rank_fenced_at_epoch(rank)));
    return response;
  }
  const auto answer = [](const DataPiece& piece) {
    LeaseDataResponse granted;
    granted.set_outcome(LEASE_GRANTED);
    DataLease* lease = granted.mutable_lease();
    lease->set_lease_id(piece.lease_id());
    lease->set_epoch(piece.epoch());
    lease->set_begin(piece.begin());
    lease->set_end(piece.end());
    lease->set_first_step(piece.first_step());
    return granted;
  };
  // The lease this worker holds is acknowledged through next_step.
  for (int i = 0; i < state_.pieces_size(); ++i) {
    const DataPiece& held = state_.pieces(i);
    if (!Leased(held) || held.rank() != rank) continue;
    // A retried call (nothing trained since), or a stale one naming an older lease: the
    // lease held, unchanged.
    if (request.next_step() == held.first_step() ||
        (request.acknowledged_lease_id() != 0 &&
         request.acknowledged_lease_id() < held.lease_id())) {
      return answer(held);
    }
    const int64_t batches = (held.end() - held.begin()) / state_.batch_size();
    Acknowledge(i, std::clamp<int64_t>(request.next_step() - held.first_step(), 0, batches));
    break;  // a worker holds one lease at a time
  }
  // Its next lease starts past every step it has acknowledged.
  if (request.next_step() > state_.rank_step_floor(rank)) {
    ++changes_;
    state_.set_rank_step_floor(rank, request.next_step());
  }
  const int index = TakeWaitingPiece();
  if (index >= 0) {
    ++changes_;
    DataPiece& piece = *state_.mutable_pieces(index);
    piece.set_lease_id(state_.next_lease_id());
    state_.set_next_lease_id(state_.next_lease_id() + 1);
    piece.set_rank(rank);
    piece.set_first_step(std::max(request.next_step(), state_.rank_step_floor(rank)));
    piece.set_fenced_at_epoch(0);
    return answer(piece);
  }
  if (done()) {
    response.set_outcome(LEASE_DONE);
    return response;
  }
  response.set_outcome(LEASE_WAIT);
  response.set_retry_after_ms(kRetryAfterMs);
  response.set_waiting_for(
      absl::StrCat("every piece is leased; ", state_.pieces_size(),
                   " still training on other workers may be handed back if their worker dies"));
  return response;
}

void DataLeaseTable::Fence(int rank, int64_t fence_epoch) {
  if (rank < 0 || rank >= state_.rank_fenced_at_epoch_size()) return;
  ++changes_;
  if (state_.rank_fenced_at_epoch(rank) == 0) state_.set_rank_fenced_at_epoch(rank, fence_epoch);
  for (DataPiece& p : *state_.mutable_pieces()) {
    if (Leased(p) && p.rank() == rank && p.fenced_at_epoch() == 0)
      p.set_fenced_at_epoch(fence_epoch);
  }
}

std::vector<std::string> DataLeaseTable::Settle(const std::vector<ServerPushReport>& live_servers) {
  std::vector<std::string> lines;
  if (live_servers.empty()) return lines;
  for (int rank = 0; rank < state_.rank_fenced_at_epoch_size(); ++rank) {
    const int64_t fence = state_.rank_fenced_at_epoch(rank);
    const bool reported = fence > 0 && std::all_of(live_servers.begin(), live_servers.end(),
                                                   [&](const ServerPushReport& s) {
                                                     return s.serving_epoch >= fence;
                                                   });
    if (!reported) continue;
    int64_t highest = 0;
    for (const ServerPushReport& server : live_servers) {
      if (rank < static_cast<int>(server.worker_next_steps.size()))
        highest = std::max(highest, server.worker_next_steps[rank]);
    }
    ++changes_;
    state_.set_rank_fenced_at_epoch(rank, 0);
    state_.set_rank_step_floor(rank, std::max(state_.rank_step_floor(rank), highest));
    for (int i = 0; i < state_.pieces_size(); ++i) {
      const DataPiece piece = state_.pieces(i);
      if (!Leased(piece) || piece.rank() != rank) continue;
      const int64_t batches = (piece.end() - piece.begin()) / state_.batch_size();
      const int64_t trained = std::clamp<int64_t>(highest - piece.first_step(), 0, batches);
      lines.push_back(absl::StrCat(
          "rank ", rank, "'s ", Describe(piece), ": the servers applied its pushes through step ",
          highest - 1, ", so ", trained, " of its ", batches, " batches are trained",
          trained < batches ? "; the rest goes to the next worker to ask" : ""));
      Acknowledge(i, trained);
      break;  // a rank holds one lease at a time
    }
  }
  return lines;
}

absl::Status DataLeaseTable::Import(const DataLeaseTableState& saved) {
  const auto bad = [](const std::string& what) {
    return absl::DataLossError(absl::StrCat("the saved data lease table ", what));
  };
  if (saved.epochs() != state_.epochs()) {
    return bad(
        absl::StrCat("is for ", saved.epochs(), " epochs; training.epochs is ", state_.epochs()));
  }
  if (saved.rank_step_floor_size() != state_.rank_step_floor_size() ||
      saved.rank_fenced_at_epoch_size() != state_.rank_fenced_at_epoch_size()) {
    return bad(absl::StrCat("has ", saved.rank_step_floor_size(), " worker ranks; the job has ",
                            state_.rank_step_floor_size()));
  }
  if (saved.example_count() == 0) {
    if (!saved.pieces().empty()) return bad("has pieces but no example count");
    return absl::OkStatus();
  }
  if (saved.example_count() < 0 || saved.example_count() > kMaxExamples || saved.batch_size() < 1 ||
      saved.batch_size() > kMaxBatchSize || saved.example_count() < saved.batch_size() ||
      saved.chunk_examples() < saved.batch_size() ||
      saved.chunk_examples() % saved.batch_size() != 0 ||
      saved.trained_examples_size() != saved.epochs() || saved.epoch() < 0 ||
      saved.epoch() > saved.epochs() || saved.next_lease_id() < 1) {
    return bad("has figures out of range");
  }
  const int64_t usable = saved.example_count() / saved.batch_size() * saved.batch_size();
  if (saved.frontier() < 0 || saved.frontier() >= usable ||
      saved.frontier() % saved.batch_size() != 0) {
    return bad(absl::StrCat("has its frontier at ", saved.frontier(), " of ", usable));
  }
  std::vector<std::tuple<int, int64_t, int64_t>> spans;  // (epoch, begin, end)
  for (const DataPiece& p : saved.pieces()) {
    const bool leased_past_frontier =
        p.epoch() > saved.epoch() || (p.epoch() == saved.epoch() && p.end() > saved.frontier());
    if (p.epoch() < 0 || p.epoch() >= saved.epochs() || p.begin() < 0 || p.end() > usable ||
        p.begin() >= p.end() || p.begin() % saved.batch_size() != 0 ||
        p.end() % saved.batch_size() != 0 || leased_past_frontier || p.first_step() < 0 ||
        p.lease_id() >= saved.next_lease_id() || p.rank() < 0 ||
        p.rank() >= saved.rank_step_floor_size() || p.fenced_at_epoch() < 0) {
      return bad(absl::StrCat("has a piece it cannot hold: ", Describe(p)));
    }
    spans.emplace_back(p.epoch(), p.begin(), p.end());
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    const auto& [epoch, begin, end] = spans[i];
    if (epoch == std::get<0>(spans[i - 1]) && begin < std::get<2>(spans[i - 1]))
      return bad(absl::StrCat("has overlapping pieces in epoch ", epoch));
  }
  state_ = saved;
  ++changes_;
  return absl::OkStatus();
}

}  // namespace paramserver
