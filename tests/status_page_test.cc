// The scheduler's status page in a real headless browser (Debian's chromium) while a
// local cluster trains: the page loads, lists the nodes, and its curves grow.
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
  const std::regex step(R"re("name":"worker-0"[^}]*"progress":\{"step":"(\d+)")re");
  return std::regex_search(response->body, match, step) ? std::stoll(match[1]) : 0;
}

TEST_CASE("the status page loads in a headless browser, lists the nodes, and its curves grow") {
  TempDir dir;
  TestJob job;
  job.max_steps = 100000;  // ended by the test
  job.epochs = 100;
  job.admin_token_file = dir.WriteFile("admin.token", kTestAdminToken);
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2, {}, {"--metrics_port=0"});
  REQUIRE(cluster.ok());
  const int port = StatusPagePort((*cluster)->scheduler());
  const std::string url = absl::StrCat("http://127.0.0.1:", port, "/");

  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (WorkerStep(port) < 100 && absl::Now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string first = RenderInBrowser(dir, url);
  INFO(first.substr(0, 3000));
  CHECK(first.find("<div id=\"verdict\">training</div>") != std::string::npos);
  for (const char* node : {"ps-0", "ps-1", "worker-0", "worker-1"}) {
    CHECK(first.find(absl::StrCat("<td>", node, "</td>")) != std::string::npos);
  }
  CHECK(first.find("<td class=\"alive\">alive</td>") != std::string::npos);
  const int first_points = PointsIn(first, "loss-chart");
  CHECK(first_points > 0);

  // Past the first epoch (937 steps), worker-0's evaluation joins the accuracy curve.
  while (WorkerStep(port) < 1100 && absl::Now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string later = RenderInBrowser(dir, url);
  INFO(later.substr(0, 3000));
  CHECK(PointsIn(later, "loss-chart") > first_points);
  CHECK(PointsIn(later, "accuracy-chart") > 0);
  CHECK(later.find("polyline") != std::string::npos);

  const std::vector<std::string> shutdown = {
      RunfilePath("psctl/psctl"), "--scheduler", (*cluster)->scheduler_address(), "--token-file",
      job.admin_token_file,       "shutdown"};
  absl::StatusOr<ChildProcess> psctl = ChildProcess::Start(shutdown, dir.File("psctl.log"));
  REQUIRE(psctl.ok());
  CHECK(psctl->WaitForExit(absl::Now() + absl::Seconds(30)).value_or(-1) == 0);
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(60));
  INFO(finished.ToString());
  CHECK(finished.ok());
}

}  // namespace
}  // namespace paramserver
