#include "common/ops/plain_json.h"

#include <cmath>
#include <limits>

#include "catch2/catch.hpp"
#include "proto/admin.pb.h"

namespace paramserver {
namespace {

TEST_CASE("enum values print as the tables' words") {
  CHECK(EnumWord(*NodeHealth_descriptor()->FindValueByNumber(NODE_HEALTH_ALIVE)) == "alive");
  CHECK(EnumWord(*NodeHealth_descriptor()->FindValueByNumber(NODE_HEALTH_FINISHED)) == "finished");
  CHECK(EnumWord(*NodeRole_descriptor()->FindValueByNumber(NODE_ROLE_WORKER)) == "worker");
}

TEST_CASE("every field under its proto name; 64-bit integers as numbers; enums as words") {
  NodeStatus node;
  node.set_name("worker-\"1\"\n");
  node.set_role(NODE_ROLE_WORKER);
  node.set_health(NODE_HEALTH_SUSPECT);
  node.set_seconds_since_heartbeat(0.25);
  node.mutable_progress()->set_step(int64_t{1} << 40);
  node.mutable_progress()->set_loss(std::numeric_limits<double>::quiet_NaN());
  const std::string json = PlainJson(node, /*indent=*/false);
  CHECK(json.find(R"("name":"worker-\"1\"\n")") != std::string::npos);
  CHECK(json.find(R"("role":"worker")") != std::string::npos);
  CHECK(json.find(R"("health":"suspect")") != std::string::npos);
  CHECK(json.find(R"("seconds_since_heartbeat":0.25)") != std::string::npos);
  CHECK(json.find(R"("step":1099511627776)") != std::string::npos);
  CHECK(json.find(R"("loss":null)") != std::string::npos);
  CHECK(json.find(R"("address":"")") != std::string::npos);  // defaults are present
  CHECK(json.find(R"("checkpoint_trouble":{"failing_since_step":0,)") != std::string::npos);
  CHECK(json.find('\n') == std::string::npos);
}

TEST_CASE("repeated fields are arrays; indent puts one field per line") {
  ClusterStatus status;
  status.set_verdict("training");
  status.add_nodes()->set_name("ps-0");
  status.add_nodes()->set_name("ps-1");
  ShardStatusView* shard = status.add_shards();
  shard->add_backups("ps-1");
  shard->add_backups("ps-2");
  const std::string flat = PlainJson(status, false);
  CHECK(flat.find(R"("backups":["ps-1","ps-2"])") != std::string::npos);
  CHECK(flat.find(R"("history":[])") != std::string::npos);
  const std::string indented = PlainJson(status, true);
  CHECK(indented.rfind("{\n  \"verdict\": \"training\",\n", 0) == 0);
  CHECK(indented.find("\n      \"name\": \"ps-1\",") != std::string::npos);
  CHECK(indented.back() == '}');
}

TEST_CASE("doubles print the shortest text that reads back to the same value") {
  ProgressPoint point;
  for (double value : {0.1, 1.0 / 3.0, 1e-300, 12345678.9, -2.5}) {
    point.set_loss(value);
    const std::string json = PlainJson(point, false);
    const size_t at = json.find("\"loss\":") + 7;
    const std::string text = json.substr(at, json.find(',', at) - at);
    CHECK(std::stod(text) == value);
  }
  point.set_loss(0.1);
  CHECK(PlainJson(point, false).find("\"loss\":0.1,") != std::string::npos);
}

}  // namespace
}  // namespace paramserver
