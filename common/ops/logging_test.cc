#include "common/ops/logging.h"

#include <unistd.h>

#include <regex>
#include <string>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("before it has a name, a node is called by its role, host and process id") {
  const std::string name = ProvisionalNodeName("worker");
  INFO(name);
  CHECK(std::regex_match(name, std::regex("worker@[^:]+:pid" + std::to_string(getpid()))));
  CHECK(name != ProvisionalNodeName("ps"));
}

}  // namespace
}  // namespace paramserver
