#include "common/ops/metrics.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"
#include "httplib.h"

namespace paramserver {
namespace {

TEST_CASE("metrics render in Prometheus' text format, one HELP and TYPE per name") {
  MetricsRegistry registry;
  Counter* accepted =
      registry.AddCounter("ps_pushes_total", "Pushes by outcome.", {{"outcome", "accepted"}});
  Counter* duplicate =
      registry.AddCounter("ps_pushes_total", "Pushes by outcome.", {{"outcome", "duplicate"}});
  Histogram* latency =
      registry.AddHistogram("ps_rpc_seconds", "RPC latency.", {{"method", "Push"}}, {0.001, 0.01});
  registry.AddGauge("heartbeat_age_seconds", "Since the last heartbeat.", [] {
    return std::vector<std::pair<MetricLabels, double>>{{{{"node", "ps-\"0\""}}, 0.25},
                                                        {{{"node", "worker-1"}}, 3}};
  });
  registry.AddScrapedCounter("applied_updates_total", "Updates applied.", [] {
    return std::vector<std::pair<MetricLabels, double>>{{{{"shard", "0"}}, 812}};
  });
  accepted->Increment(41);
  accepted->Increment();
  duplicate->Increment(2);
  latency->Observe(0.0005);
  latency->Observe(0.001);  // le is inclusive
  latency->Observe(0.5);
  // prometheus-cpp's TextSerializer: a family's samples in an order of its own, the sum
  // at full precision. The lines, in any order within their family:
  const std::vector<std::string> lines = absl::StrSplit(registry.Render(), '\n');
  const std::vector<std::string> expected = {
      "# HELP ps_pushes_total Pushes by outcome.",
      "# TYPE ps_pushes_total counter",
      "ps_pushes_total{outcome=\"accepted\"} 42",
      "ps_pushes_total{outcome=\"duplicate\"} 2",
      "# HELP ps_rpc_seconds RPC latency.",
      "# TYPE ps_rpc_seconds histogram",
      "ps_rpc_seconds_bucket{method=\"Push\",le=\"0.001\"} 2",
      "ps_rpc_seconds_bucket{method=\"Push\",le=\"0.01\"} 2",
      "ps_rpc_seconds_bucket{method=\"Push\",le=\"+Inf\"} 3",
      "ps_rpc_seconds_sum{method=\"Push\"} 0.5014999999999999",  // 0.0005 + 0.001 + 0.5
      "ps_rpc_seconds_count{method=\"Push\"} 3",
      "# HELP heartbeat_age_seconds Since the last heartbeat.",
      "# TYPE heartbeat_age_seconds gauge",
      "heartbeat_age_seconds{node=\"ps-\\\"0\\\"\"} 0.25",
      "heartbeat_age_seconds{node=\"worker-1\"} 3",
      "# HELP applied_updates_total Updates applied.",
      "# TYPE applied_updates_total counter",
      "applied_updates_total{shard=\"0\"} 812",
      ""};
  CHECK(std::multiset<std::string>(lines.begin(), lines.end()) ==
        std::multiset<std::string>(expected.begin(), expected.end()));
  // Each family's HELP and TYPE lines come once, before its samples.
  for (const std::string family : {"ps_pushes_total", "ps_rpc_seconds", "heartbeat_age_seconds"}) {
    INFO(family);
    std::vector<size_t> help, type, samples;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].rfind("# HELP " + family + " ", 0) == 0) help.push_back(i);
      if (lines[i].rfind("# TYPE " + family + " ", 0) == 0) type.push_back(i);
      if (lines[i].rfind(family, 0) == 0) samples.push_back(i);
    }
    REQUIRE(help.size() == 1);
    REQUIRE(type.size() == 1);
    CHECK(type[0] == help[0] + 1);
    CHECK(samples.front() == type[0] + 1);
    CHECK(samples.back() - samples.front() + 1 == samples.size());  // together
  }
}

TEST_CASE("the metrics endpoint serves the registry over HTTP on 127.0.0.1") {
  MetricsRegistry registry;
  registry.AddCounter("steps_total", "Steps.")->Increment(7);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  REQUIRE(server.ok());
  REQUIRE((*server)->port() > 0);
  httplib::Client client("127.0.0.1", (*server)->port());
  httplib::Result response = client.Get("/metrics");
  REQUIRE(response);
  CHECK(response->status == 200);
  CHECK(response->body == "# HELP steps_total Steps.\n# TYPE steps_total counter\nsteps_total 7\n");
  CHECK(response->get_header_value("Content-Type").find("text/plain; version=0.0.4") == 0);
  CHECK(client.Get("/other")->status == 404);
  CHECK(HostOf("127.0.0.1:7000") == "127.0.0.1");
}

TEST_CASE("with the node's certificate the endpoint serves HTTPS, and plain HTTP gets nothing") {
  TempDir dir;
  const std::string cert = dir.File("node.pem"), key = dir.File("node.key");
  const std::string make_cert =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -keyout '" + key +
      "' -out '" + cert + "' 2>/dev/null";
  REQUIRE(std::system(make_cert.c_str()) == 0);
  MetricsRegistry registry;
  registry.AddCounter("steps_total", "Steps.")->Increment(7);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &registry, {}, HttpsFiles{cert, key});
  REQUIRE(server.ok());
  httplib::SSLClient secure("127.0.0.1", (*server)->port());
  secure.set_ca_cert_path(cert.c_str());
  secure.enable_server_certificate_verification(true);
  httplib::Result response = secure.Get("/metrics");
  REQUIRE(response);
  CHECK(response->status == 200);
  CHECK(response->body.find("steps_total 7") != std::string::npos);
  httplib::Client plain("127.0.0.1", (*server)->port());
  plain.set_read_timeout(2, 0);
  httplib::Result refused = plain.Get("/metrics");
  CHECK((!refused || refused->status != 200));
  // Files that are not a certificate and key: said so, nothing served.
  const absl::Status bad = MetricsHttpServer::Start("127.0.0.1", 0, &registry, {},
                                                    HttpsFiles{dir.WriteFile("x", "x"), key})
                               .status();
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a route with an authorizer answers 401 to requests it does not accept") {
  MetricsRegistry registry;
  HttpRoute api{"/api/status", "application/json", [] { return std::string("{}"); }};
  api.authorize = [](const std::string& authorization) {
    return authorization == "Bearer right-token";
  };
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &registry, {api});
  REQUIRE(server.ok());
  httplib::Client client("127.0.0.1", (*server)->port());
  CHECK(client.Get("/api/status")->status == 401);
  CHECK(client.Get("/api/status", {{"Authorization", "Bearer wrong-token"}})->status == 401);
  httplib::Result allowed = client.Get("/api/status", {{"Authorization", "Bearer right-token"}});
  REQUIRE(allowed);
  CHECK(allowed->status == 200);
  CHECK(allowed->body == "{}");
}

}  // namespace
}  // namespace paramserver
