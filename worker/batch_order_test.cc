#include "worker/batch_order.h"

#include <algorithm>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("without shuffle, batches follow file order") {
  CHECK(EpochExampleOrder({10, 14}, 3, 1, false) == std::vector<int64_t>{10, 11, 12, 13});
}

TEST_CASE("with shuffle, each epoch is a reproducible permutation of the range") {
  const ParameterRange range{100, 200};
  std::vector<int64_t> epoch0 = EpochExampleOrder(range, 0, 5, true);
  CHECK(epoch0 == EpochExampleOrder(range, 0, 5, true));
  CHECK(epoch0 != EpochExampleOrder(range, 1, 5, true));
  CHECK(epoch0 != EpochExampleOrder(range, 0, 6, true));
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == EpochExampleOrder(range, 0, 5, false));
}

TEST_CASE("steps per epoch is the fewest full batches of any worker's range") {
  CHECK(StepsPerEpoch(60000, 2, 32) == 937);  // 30000 / 32
  CHECK(StepsPerEpoch(10, 3, 3) == 1);        // ranges of 3, 3, 4
  CHECK(StepsPerEpoch(10, 3, 4) == 0);
}

}  // namespace
}  // namespace paramserver
