#include "common/metrics.h"

#include <cstdlib>

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
  accepted->Increment(41);
  accepted->Increment();
  duplicate->Increment(2);
  latency->Observe(0.0005);
  latency->Observe(0.001);  // le is inclusive
  latency->Observe(0.5);
  CHECK(registry.Render() ==
        "# HELP ps_pushes_total Pushes by outcome.\n"
        "# TYPE ps_pushes_total counter\n"
        "ps_pushes_total{outcome=\"accepted\"} 42\n"
        "ps_pushes_total{outcome=\"duplicate\"} 2\n"
        "# HELP ps_rpc_seconds RPC latency.\n"
        "# TYPE ps_rpc_seconds histogram\n"
        "ps_rpc_seconds_bucket{method=\"Push\",le=\"0.001\"} 2\n"
        "ps_rpc_seconds_bucket{method=\"Push\",le=\"0.01\"} 2\n"
        "ps_rpc_seconds_bucket{method=\"Push\",le=\"+Inf\"} 3\n"
        "ps_rpc_seconds_sum{method=\"Push\"} 0.5015\n"
        "ps_rpc_seconds_count{method=\"Push\"} 3\n"
        "# HELP heartbeat_age_seconds Since the last heartbeat.\n"
        "# TYPE heartbeat_age_seconds gauge\n"
        "heartbeat_age_seconds{node=\"ps-\\\"0\\\"\"} 0.25\n"
        "heartbeat_age_seconds{node=\"worker-1\"} 3\n");
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
