// Every daemon's /metrics on a real local cluster: the text parses as Prometheus'
// exposition format, and the counters move as the job trains.
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "httplib.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

int MetricsPort(const ChildProcess& process) {
  absl::StatusOr<int> port = WaitForLoggedNumber(
      process, R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)", absl::Seconds(60));
  INFO(port.status().ToString());
  REQUIRE(port.ok());
  return *port;
}

// Checks every line against the text format; returns each sample's value by its full
// name with labels, e.g. ps_pushes_total{outcome="accepted"}.
std::map<std::string, double> ParsePrometheusText(const std::string& text) {
  const std::regex help(R"(# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .*)");
  const std::regex type(
      R"(# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge|histogram|summary|untyped))");
  const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*\})?) ([-+]?([0-9.]+([eE][-+]?[0-9]+)?|Inf)|NaN))");
  std::map<std::string, double> samples;
  const std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  for (const std::string& line : lines) {
    INFO(line);
    std::smatch match;
    if (std::regex_match(line, help) || std::regex_match(line, type)) continue;
    REQUIRE(std::regex_match(line, match, sample));
    samples[match[1]] = match[6] == "+Inf" ? 1e300 : std::stod(match[6]);
  }
  return samples;
}

std::string ScrapeText(int port) {
  httplib::Client client("127.0.0.1", port);
  httplib::Result response = client.Get("/metrics");
  INFO("port " << port << ": " << httplib::to_string(response.error()));
  REQUIRE(response);
  REQUIRE(response->status == 200);
  return response->body;
}

std::map<std::string, double> Scrape(int port) { return ParsePrometheusText(ScrapeText(port)); }

TEST_CASE(
    "every daemon serves /metrics in Prometheus' text format, and the counts move with training") {
  TempDir dir;
  TestJob job;
  job.max_steps = 6000;  // long enough to scrape every daemon while it trains
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  const std::vector<std::string> metrics = {"--metrics_port=0"};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2, metrics, metrics, metrics);
  REQUIRE(cluster.ok());
  const int scheduler_port = MetricsPort((*cluster)->scheduler());
  const int server_port = MetricsPort((*cluster)->processes()[1]);
  const int worker_port = MetricsPort((*cluster)->processes()[3]);

  // Wait until the worker has made some steps, then read everything.
  std::map<std::string, double> worker;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    worker = Scrape(worker_port);
  } while (worker["worker_step"] < 50 && absl::Now() < deadline);
  CHECK(worker["worker_step"] >= 50);
  CHECK(worker["worker_samples_per_second"] > 0);
  CHECK(worker["worker_total_steps"] == 937);  // one epoch, below max_steps
  CHECK(worker.count("worker_loss") == 1);
  CHECK(worker.count("worker_epoch") == 1);
  CHECK(worker.count("worker_progress{what=\"step\"}") == 0);  // the old mixed-unit name

  std::map<std::string, double> server = Scrape(server_port);
  CHECK(server["ps_pushes_total{outcome=\"accepted\"}"] > 0);
  CHECK(server["ps_pulls_total"] > 0);
  CHECK(server["ps_received_bytes_total"] > 0);
  CHECK(server["ps_replicated_entries_total"] > 0);  // it backs up the other server's shards
  CHECK(server["ps_rpc_seconds_count{method=\"Push\"}"] ==
        server["ps_rpc_seconds_bucket{method=\"Push\",le=\"+Inf\"}"]);
  CHECK(server["ps_rpc_seconds_count{method=\"Push\"}"] > 0);
  CHECK(server.count("ps_rejected_requests_total{reason=\"FAILED_PRECONDITION\"}") == 1);
  CHECK(server["ps_shard_applied_updates_total{shard=\"0\",role=\"primary\"}"] +
            server["ps_shard_applied_updates_total{shard=\"0\",role=\"backup\"}"] >
        0);
  CHECK(server.count("ps_serving_map_version") == 1);
  // What only grows is a counter (rate() applies).
  CHECK(ScrapeText(server_port).find("# TYPE ps_shard_applied_updates_total counter") !=
        std::string::npos);

  // The scheduler learns of progress from heartbeats: wait for one that carried it.
  std::map<std::string, double> scheduler;
  do {
    scheduler = Scrape(scheduler_port);
    if (scheduler["scheduler_worker_step{node=\"worker-0\"}"] > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (absl::Now() < deadline);
  CHECK(scheduler["scheduler_map_version"] >= 1);
  CHECK(scheduler.count("scheduler_heartbeat_age_seconds{node=\"ps-0\"}") == 1);
  // Health is a state set: every state has its series, the present one is 1.
  CHECK(scheduler["scheduler_node_health{node=\"ps-0\",health=\"alive\"}"] == 1);
  CHECK(scheduler.count("scheduler_node_health{node=\"ps-0\",health=\"dead\"}") == 1);
  CHECK(scheduler["scheduler_node_health{node=\"ps-0\",health=\"dead\"}"] == 0);
  CHECK(scheduler["scheduler_total_steps"] == 937);
  CHECK(scheduler["scheduler_worker_step{node=\"worker-0\"}"] > 0);

  // Every daemon's memory, and how much of its heap the program holds: the daemons link
  // tcmalloc.
  for (const auto* page : {&worker, &server, &scheduler}) {
    CHECK(page->count("process_resident_memory_bytes") == 1);
    const auto allocated =
        page->find("process_heap_bytes{allocator=\"tcmalloc\",state=\"allocated\"}");
    REQUIRE(allocated != page->end());
    CHECK(allocated->second > 0);
    CHECK(allocated->second < page->at("process_resident_memory_bytes") * 2);
    CHECK(page->count("process_heap_bytes{allocator=\"tcmalloc\",state=\"thread_caches\"}") == 1);
  }

  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(finished.ToString());
  CHECK(finished.ok());
}

}  // namespace
}  // namespace paramserver
