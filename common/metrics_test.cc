#include "common/metrics.h"

#include "catch2/catch.hpp"
#include "httplib.h"

namespace paramserver {
namespace {

TEST_CASE("metrics render in Prometheus' text format, one HELP and TYPE per name") {
  MetricsRegistry registry;
  Counter* accepted = registry.AddCounter("ps_pushes_total", "Pushes by outcome.", {{"outcome", "accepted"}});
  Counter* duplicate = registry.AddCounter("ps_pushes_total", "Pushes by outcome.", {{"outcome", "duplicate"}});
  Histogram* latency = registry.AddHistogram("ps_rpc_seconds", "RPC latency.", {{"method", "Push"}}, {0.001, 0.01});
  registry.AddGauge("heartbeat_age_seconds", "Since the last heartbeat.", [] {
    return std::vector<std::pair<MetricLabels, double>>{{{{"node", "ps-\"0\""}}, 0.25}, {{{"node", "worker-1"}}, 3}};
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
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start("127.0.0.1", 0, &registry);
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

}  // namespace
}  // namespace paramserver
