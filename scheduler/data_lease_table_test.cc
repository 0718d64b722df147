// The lease table on its own: chunks in order, acknowledgement by the next request, a
// fenced worker's lease settled from the servers' reports, the saved state checked.
#include "scheduler/data_lease_table.h"

#include <set>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

LeaseDataRequest Ask(int64_t next_step, int64_t examples = 100, int batch = 10) {
  LeaseDataRequest request;
  request.set_node_name("worker");
  request.set_example_count(examples);
  request.set_batch_size(batch);
  request.set_next_step(next_step);
  return request;
}

DataLease Granted(DataLeaseTable& table, int rank, int64_t next_step) {
  const absl::StatusOr<LeaseDataResponse> response = table.Lease(rank, Ask(next_step));
  REQUIRE(response.ok());
  REQUIRE(response->outcome() == LEASE_GRANTED);
  return response->lease();
}

LeaseOutcome OutcomeOf(DataLeaseTable& table, int rank, int64_t next_step) {
  const absl::StatusOr<LeaseDataResponse> response = table.Lease(rank, Ask(next_step));
  REQUIRE(response.ok());
  return response->outcome();
}

TEST_CASE("leases hand out each epoch's whole batches in chunks, then done") {
  // 105 examples in batches of 10: 100 usable positions, chunks of 3 batches (30).
  DataLeaseTable table(/*epochs=*/2, /*chunk_batches=*/3, /*workers=*/2);
  std::multiset<std::pair<int, int64_t>> trained;  // (epoch, position)
  int64_t steps[2] = {0, 0};
  DataLease held[2];
  bool holding[2] = {false, false};
  for (int round = 0; round < 40; ++round) {
    const int rank = round % 2;
    if (holding[rank]) {
      for (int64_t p = held[rank].begin(); p < held[rank].end(); ++p)
        trained.insert({held[rank].epoch(), p});
      steps[rank] = held[rank].first_step() + (held[rank].end() - held[rank].begin()) / 10;
    }
    absl::StatusOr<LeaseDataResponse> response = table.Lease(rank, Ask(steps[rank], 105, 10));
    REQUIRE(response.ok());
    holding[rank] = response->outcome() == LEASE_GRANTED;
    if (holding[rank]) {
      held[rank] = response->lease();
      CHECK(held[rank].first_step() == steps[rank]);
      CHECK((held[rank].end() - held[rank].begin()) % 10 == 0);
      CHECK(held[rank].end() - held[rank].begin() <= 30);
    }
  }
  CHECK(table.done());
  REQUIRE(trained.size() == 200);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int64_t p = 0; p < 100; ++p) CHECK(trained.count({epoch, p}) == 1);
  }
  CHECK(table.Export().trained_examples(0) == 100);
  CHECK(table.Export().trained_examples(1) == 100);
}

TEST_CASE("a retried request gets the same lease; a changed data set is refused") {
  DataLeaseTable table(1, 2, 2);
  const DataLease first = Granted(table, 0, 5);
  const DataLease again = Granted(table, 0, 5);
  CHECK(again.lease_id() == first.lease_id());
  CHECK(again.begin() == first.begin());
  const absl::StatusOr<LeaseDataResponse> other = table.Lease(1, Ask(0, 200, 10));
  REQUIRE(other.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(other.status().message(), "every worker must train the same data"));
  CHECK(table.Lease(2, Ask(0)).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(table.Lease(0, Ask(-1)).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(table.Lease(1, Ask(0, 5, 10)).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a fenced worker's lease is settled from the servers' reports, the rest re-leased") {
  DataLeaseTable table(/*epochs=*/1, /*chunk_batches=*/4, /*workers=*/2);
  const DataLease dying = Granted(table, 0, 10);  // positions [0, 40) at steps 10..13
  CHECK(dying.begin() == 0);
  CHECK(dying.end() == 40);
  table.Fence(0, /*fence_epoch=*/7);
  CHECK(table.settling());
  // Not before every live server serves map 7.
  CHECK(table.Settle({{"ps-0", 7, {12, 0}}, {"ps-1", 6, {13, 0}}}).empty());
  CHECK(table.settling());
  // Its own rank waits meanwhile (a new process must not push steps the report counts).
  CHECK(OutcomeOf(table, 0, 0) == LEASE_WAIT);
  // Shard pushes went through step 11 on one server and step 12 on another: the
  // highest counts (the batch at step 12 was applied somewhere; it is not re-trained).
  const std::vector<std::string> lines = table.Settle({{"ps-0", 7, {12, 0}}, {"ps-1", 8, {13, 0}}});
  REQUIRE(lines.size() == 1);
  CHECK(absl::StrContains(lines[0], "3 of its 4 batches are trained"));
  CHECK_FALSE(table.settling());
  // The rest, positions [30, 40), goes to whoever asks first.
  const DataLease rest = Granted(table, 1, 0);
  CHECK(rest.begin() == 30);
  CHECK(rest.end() == 40);
  // Rank 0 again (the process that took the slot) starts past its predecessor's pushes.
  const DataLease next = Granted(table, 0, 2);
  CHECK(next.first_step() == 13);
  CHECK(next.begin() == 40);
  CHECK(table.Export().trained_examples(0) == 30);
  CHECK(table.Export().handed_back() == 1);
}

TEST_CASE("a fenced lease nothing of which was applied goes back whole") {
  DataLeaseTable table(1, 2, 1);
  const DataLease lease = Granted(table, 0, 4);
  table.Fence(0, 3);
  REQUIRE(table.Settle({{"ps-0", 3, {4}}}).size() == 1);
  const DataLease again = Granted(table, 0, 0);
  CHECK(again.begin() == lease.begin());
  CHECK(again.end() == lease.end());
  CHECK(again.first_step() == 4);
}

TEST_CASE("a rank fenced while holding no lease waits for the reports, then starts past them") {
  DataLeaseTable table(1, 2, 2);
  Granted(table, 1, 0);  // the other rank's lease
  table.Fence(0, 5);     // rank 0 dies between leases
  CHECK(OutcomeOf(table, 0, 0) == LEASE_WAIT);
  CHECK(table.Settle({{"ps-0", 5, {30, 0}}}).empty());  // no lease to settle, but...
  CHECK_FALSE(table.settling());
  CHECK(Granted(table, 0, 0).first_step() == 30);  // ...its replacement starts past step 29
}

TEST_CASE("a stale request naming an older lease acknowledges nothing") {
  DataLeaseTable table(1, 2, 1);
  const DataLease first = Granted(table, 0, 0);
  LeaseDataRequest next = Ask(2);
  next.set_acknowledged_lease_id(first.lease_id());
  const absl::StatusOr<LeaseDataResponse> second = table.Lease(0, next);
  REQUIRE(second.ok());
  REQUIRE(second->outcome() == LEASE_GRANTED);
  CHECK(second->lease().begin() == 20);
  // The first request's attempt arriving late (step 0, lease 0 acknowledged): the lease
  // held comes back, untouched.
  LeaseDataRequest stale = Ask(1);
  stale.set_acknowledged_lease_id(first.lease_id());
  const absl::StatusOr<LeaseDataResponse> again = table.Lease(0, stale);
  REQUIRE(again.ok());
  CHECK(again->lease().lease_id() == second->lease().lease_id());
  CHECK(table.Export().trained_examples(0) == 20);
  CHECK(table.Export().handed_back() == 0);
}

TEST_CASE("while every piece is leased the others wait; done only when all are trained") {
  DataLeaseTable table(1, 10, 2);  // one chunk holds the whole epoch
  const DataLease all = Granted(table, 0, 0);
  CHECK(all.end() == 100);
  CHECK(OutcomeOf(table, 1, 0) == LEASE_WAIT);
  CHECK_FALSE(table.done());
  CHECK(OutcomeOf(table, 0, 10) == LEASE_DONE);
  CHECK(OutcomeOf(table, 1, 0) == LEASE_DONE);
}

TEST_CASE("the saved table comes back; a damaged one is refused whole") {
  DataLeaseTable table(2, 3, 2);
  Granted(table, 0, 0);
  Granted(table, 1, 0);
  table.Fence(1, 4);
  DataLeaseTable restored(2, 3, 2);
  REQUIRE(restored.Import(table.Export()).ok());
  CHECK(restored.settling());
  CHECK(restored.Export().SerializeAsString() == table.Export().SerializeAsString());

  DataLeaseTableState overlapping = table.Export();
  overlapping.mutable_pieces(1)->set_begin(0);
  DataLeaseTable refused(2, 3, 2);
  CHECK(refused.Import(overlapping).code() == absl::StatusCode::kDataLoss);
  DataLeaseTableState past_frontier = table.Export();
  past_frontier.set_frontier(30);
  CHECK(refused.Import(past_frontier).code() == absl::StatusCode::kDataLoss);
  DataLeaseTable other_epochs(3, 3, 2);
  CHECK(other_epochs.Import(table.Export()).code() == absl::StatusCode::kDataLoss);
  CHECK(refused.Export().example_count() == 0);  // nothing taken over
}

}  // namespace
}  // namespace paramserver
