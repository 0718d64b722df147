// The scheduler's status page in a real headless browser (Debian's chromium) while a
// local cluster trains: the page loads, lists the nodes, and its curves grow.
#include "scheduler/status_page.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "httplib.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

// The page's DOM once its scripts ran (chromium --dump-dom).
std::string RenderInBrowser(const TempDir& dir, const std::string& url) {
  static int renders = 0;
  const std::string out = dir.File(absl::StrCat("dom-", ++renders, ".html"));
  const std::string command = absl::StrCat(
      "chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run ",
      "--user-data-dir='", dir.File(absl::StrCat("profile-", renders)), "' ",
      "--virtual-time-budget=3000 --dump-dom '", url, "' > '", out, "' 2> '", out, ".err'");
  INFO(command);
  REQUIRE(std::system(command.c_str()) == 0);
  std::ifstream in(out);
  std::stringstream dom;
  dom << in.rdbuf();
  return dom.str();
}

int PointsIn(const std::string& dom, const std::string& chart) {
  std::smatch match;
  const std::regex points("id=\"" + chart + "\"[^>]*data-points=\"(\\d+)\"");
  return std::regex_search(dom, match, points) ? std::stoi(match[1]) : 0;
}

// A PNG of the page as a person sees it (1400 x 1000), kept with the test's outputs
// (bazel-testlogs/tests/status_page_test/test.outputs) to be looked at.
void Screenshot(const TempDir& dir, const std::string& url, const std::string& name) {
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string png = outputs != nullptr ? absl::StrCat(outputs, "/", name) : dir.File(name);
  const std::string command = absl::StrCat(
      "chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run ",
      "--hide-scrollbars --user-data-dir='", dir.File("profile-" + name), "' ",
      "--virtual-time-budget=3000 --window-size=1400,1000 --screenshot='", png, "' '", url,
      "' > /dev/null 2>&1");
  CHECK(std::system(command.c_str()) == 0);
  std::ifstream in(png, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  CHECK(std::string(magic + 1, 3) == "PNG");
}

// The text of the element with id `id` (no nested elements), or "" if absent.
std::string TextOf(const std::string& dom, const std::string& id) {
  std::smatch match;
  const std::regex element("id=\"" + id + "\"[^>]*>([^<]*)<");
  return std::regex_search(dom, match, element) ? std::string(match[1]) : "";
}

int StatusPagePort(const ChildProcess& scheduler) {
  absl::StatusOr<int> port = WaitForLoggedNumber(
      scheduler, R"(status page on http://127\.0\.0\.1:(\d+)/)", absl::Seconds(30));
  INFO(port.status().ToString());
  REQUIRE(port.ok());
  return *port;
}

// Worker-0's step from /api/status.
int64_t WorkerStep(int port) {
  httplib::Client client("127.0.0.1", port);
  httplib::Result response = client.Get("/api/status");
  if (!response || response->status != 200) return -1;
  std::smatch match;
  const std::regex step(R"re("name":"worker-0"[^}]*"progress":\{"step":(\d+),)re");
  return std::regex_search(response->body, match, step) ? std::stoll(match[1]) : 0;
}

TEST_CASE(
    "the status page loads in a headless browser, shows progress and curves with axes, and a final "
    "report stays after the end") {
  TempDir dir;
  TestJob job;
  job.max_steps = 2500;  // past the first epoch (937 steps) and its evaluation
  job.epochs = 100;
  job.admin_token_file = dir.WriteSecretFile("admin.token", kTestAdminToken);
  job.report = dir.File("report.html");
  const std::string& report = job.report;
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2, {}, {"--metrics_port=0"});
  REQUIRE(cluster.ok());
  const int port = StatusPagePort((*cluster)->scheduler());
  const std::string url = absl::StrCat("http://127.0.0.1:", port, "/");

  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (WorkerStep(port) < 100 && absl::Now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string first = RenderInBrowser(dir, url);
  INFO(first.substr(0, 3000));
  CHECK(TextOf(first, "verdict") == "training");
  for (const char* node : {"ps-0", "ps-1", "worker-0", "worker-1"}) {
    CHECK(first.find(absl::StrCat("<td>", node, "</td>")) != std::string::npos);
  }
  CHECK(first.find("<td class=\"alive\">alive</td>") != std::string::npos);
  // Steps done of the total, the percentage, and a time left.
  CHECK(std::regex_match(TextOf(first, "fig-steps"), std::regex("[0-9]+ / 2500")));
  CHECK(std::regex_match(TextOf(first, "fig-steps-sub"), std::regex("[0-9]+% of the job's steps")));
  CHECK(std::regex_match(TextOf(first, "fig-eta"), std::regex("[0-9]+ (s|min [0-9]{2} s)")));
  CHECK(std::regex_match(TextOf(first, "fig-loss"), std::regex("[0-9]+\\.[0-9]{4}")));
  const int first_points = PointsIn(first, "loss-chart");
  CHECK(first_points > 0);
  // Axes with gridlines and labelled ticks; the smoothed loss over the faint raw one.
  CHECK(first.find("<g class=\"grid\">") != std::string::npos);
  CHECK(first.find(">step</text>") != std::string::npos);
  CHECK(first.find("class=\"raw\"") != std::string::npos);
  CHECK(first.find("class=\"smoothed\"") != std::string::npos);

  while (WorkerStep(port) < 1100 && absl::Now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Screenshot(dir, url, "status-page-mid-run.png");
  const std::string later = RenderInBrowser(dir, url);
  INFO(later.substr(0, 3000));
  CHECK(PointsIn(later, "loss-chart") > first_points);
  CHECK(PointsIn(later, "accuracy-chart") > 0);
  CHECK(std::regex_match(TextOf(later, "fig-accuracy"), std::regex("0\\.[0-9]{4}")));
  // The accuracy axis is the whole 0 to 1 scale, whatever the values.
  CHECK(later.find(">0.00</text>") != std::string::npos);
  CHECK(later.find(">1.00</text>") != std::string::npos);

  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(finished.ToString());
  CHECK(finished.ok());
  // The job is over and the scheduler gone; its final report remains, readable alone.
  const std::string report_url = "file://" + report;
  Screenshot(dir, report_url, "status-page-final-report.png");
  const std::string final_dom = RenderInBrowser(dir, report_url);
  INFO(final_dom.substr(0, 3000));
  CHECK(TextOf(final_dom, "verdict") == "finished");
  CHECK(TextOf(final_dom, "fig-steps") == "2500 / 2500");
  CHECK(TextOf(final_dom, "fig-eta-label") == "took");
  CHECK(TextOf(final_dom, "fig-accuracy-sub") == "final");
  CHECK(TextOf(final_dom, "notice") == "Final report, written when the job ended.");
  CHECK(PointsIn(final_dom, "loss-chart") > 0);
  CHECK(PointsIn(final_dom, "accuracy-chart") > 0);
}

TEST_CASE("an open page keeps the last status on screen when the scheduler stops answering") {
  TempDir dir;
  ClusterStatus status;
  status.set_verdict("training");
  status.set_map_version(2);
  status.set_mode("sync");
  status.set_total_steps(1000);
  status.set_slowest_step(400);
  status.set_fastest_step(410);
  status.set_slowest_worker("worker-1");
  status.set_eta_seconds(30);
  NodeStatus* worker = status.add_nodes();
  worker->set_name("worker-1");
  worker->set_role(NODE_ROLE_WORKER);
  worker->set_health(NODE_HEALTH_ALIVE);
  // A stand-in scheduler: the page, one status, then nothing but errors (as when the
  // scheduler has exited and a proxy answers for it).
  std::atomic<int> asked{0};
  httplib::Server server;
  server.Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(StatusPageHtml(), "text/html; charset=utf-8");
  });
  server.Get("/api/status", [&](const httplib::Request&, httplib::Response& response) {
    if (asked++ == 0) {
      response.set_content(StatusJson(status), "application/json");
    } else {
      response.status = 503;
    }
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  REQUIRE(port > 0);
  std::thread serving([&] { server.listen_after_bind(); });
  const std::string dom = RenderInBrowser(dir, absl::StrCat("http://127.0.0.1:", port, "/"));
  server.stop();
  serving.join();
  INFO(dom.substr(0, 3000));
  CHECK(asked.load() >= 2);  // it asked again, and was refused
  CHECK(TextOf(dom, "verdict") == "training");
  CHECK(TextOf(dom, "fig-steps") == "400 / 1000");
  CHECK(TextOf(dom, "notice").rfind("The scheduler stopped answering at about ", 0) == 0);
  CHECK(dom.find("<td>worker-1</td>") != std::string::npos);
}

}  // namespace
}  // namespace paramserver
