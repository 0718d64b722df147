// EC2 behaviour against a fake instance metadata service on 127.0.0.1 (IMDSv2: a token,
// then GETs with it): servers advertise the private address it gives, and a spot
// interruption notice drains the server that sees it while training goes on.
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "httplib.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

// A fake IMDSv2. Once Interrupt() is called, the first instance to ask gets the spot
// notice (every instance polls the same fake here), the others none.
class FakeMetadataService {
 public:
  FakeMetadataService() {
    server_.Put("/latest/api/token",
                [this](const httplib::Request& request, httplib::Response& response) {
                  if (request.get_header_value("X-aws-ec2-metadata-token-ttl-seconds").empty()) {
                    response.status = 400;
                    return;
                  }
                  absl::MutexLock lock(&mu_);
                  response.set_content(absl::StrCat("token-", ++tokens_), "text/plain");
                });
    server_.Get("/latest/meta-data/local-ipv4",
                [this](const httplib::Request& request, httplib::Response& response) {
                  if (!Authorized(request)) {
                    response.status = 401;
                    return;
                  }
                  response.set_content("127.0.0.1", "text/plain");
                });
    server_.Get("/latest/meta-data/spot/instance-action",
                [this](const httplib::Request& request, httplib::Response& response) {
                  absl::MutexLock lock(&mu_);
                  const std::string token = request.get_header_value("X-aws-ec2-metadata-token");
                  if (!interrupted_ || (!noticed_by_.empty() && noticed_by_ != token)) {
                    response.status = 404;
                    return;
                  }
                  noticed_by_ = token;
                  response.set_content(R"({"action": "terminate", "time": "2026-11-30T02:12:00Z"})",
                                       "application/json");
                });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeMetadataService() {
    server_.stop();
    thread_.join();
  }
  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }
  void Interrupt() {
    absl::MutexLock lock(&mu_);
    interrupted_ = true;
  }

 private:
  bool Authorized(const httplib::Request& request) {
    return request.get_header_value("X-aws-ec2-metadata-token").rfind("token-", 0) == 0;
  }

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  absl::Mutex mu_;
  int tokens_ ABSL_GUARDED_BY(mu_) = 0;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  std::string noticed_by_ ABSL_GUARDED_BY(mu_);
};

// Waits (60 s at most) until the first worker logs a step, then a second more, and
// posts the spot notice.
void InterruptOnceTrainingGoes(LocalCluster& cluster, FakeMetadataService& imds) {
  // Let training get going, then post the notice.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (cluster.processes()[3].ReadLog().find("step") == std::string::npos &&
         absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  imds.Interrupt();
}

// Checks the two servers' logs: both advertised the metadata service's address, and
// exactly one was drained.
void CheckServersAdvertisedAndOneDrained(LocalCluster& cluster) {
  int advertised = 0, drained = 0;
  for (int i = 1; i <= 2; ++i) {
    const std::string log = cluster.processes()[i].ReadLog();
    advertised +=
        log.find("advertising this instance's private address 127.0.0.1") != std::string::npos;
    drained += log.find("drained: every shard was handed off; shutting down") != std::string::npos;
  }
  CHECK(advertised == 2);
  CHECK(drained == 1);
}

TEST_CASE(
    "servers advertise the metadata service's address; a spot notice drains one and training goes "
    "on") {
  FakeMetadataService imds;
  TempDir dir;
  TestJob job;
  job.max_steps = 1500;
  job.heartbeat_interval_ms = 200;
  job.weights = dir.File("weights.safetensors");
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  const std::vector<std::string> server_args = {
      "--advertise",    "imds", "--imds_endpoint", imds.endpoint(), "--watch_spot_interruptions",
      "--spot_poll_ms", "100"};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2, {}, {}, server_args);
  REQUIRE(cluster.ok());
  InterruptOnceTrainingGoes(**cluster, imds);
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(finished.ToString());
  REQUIRE(finished.ok());  // the drained server exited 0, and the job finished
  const std::string scheduler_log = (*cluster)->scheduler().ReadLog();
  INFO(scheduler_log.substr(scheduler_log.size() > 4000 ? scheduler_log.size() - 4000 : 0));
  CHECK(scheduler_log.find("leaves the job: spot interruption: {\"action\": \"terminate\"") !=
        std::string::npos);
  CHECK(scheduler_log.find(" drained; shards move with their state") != std::string::npos);
  CHECK(scheduler_log.find("final test_accuracy=") != std::string::npos);
  CheckServersAdvertisedAndOneDrained(**cluster);
  CHECK((*cluster)->FinalValue("test_accuracy") > 0.7);
}

TEST_CASE("a worker given a spot notice leaves the job cleanly, and the others finish without it") {
  FakeMetadataService imds;
  TempDir dir;
  TestJob job;
  job.max_steps = 1500;
  job.heartbeat_interval_ms = 200;
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  // worker-0 (which reports the result) starts first; only the second worker watches.
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 1);
  REQUIRE(cluster.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while ((*cluster)->scheduler().ReadLog().find("registered worker-0") == std::string::npos &&
         absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE((*cluster)
              ->StartWorker(dir.File("spot-worker.log"),
                            {"--imds_endpoint", imds.endpoint(), "--watch_spot_interruptions",
                             "--spot_poll_ms", "100"})
              .ok());
  ChildProcess& spot_worker = (*cluster)->processes().back();
  while (spot_worker.ReadLog().find("training steps") == std::string::npos &&
         absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  imds.Interrupt();
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(finished.ToString());
  REQUIRE(finished.ok());  // the worker that left exited 0 too
  INFO(spot_worker.ReadLog());
  CHECK(spot_worker.ReadLog().find("left the job on a spot interruption notice") !=
        std::string::npos);
  const std::string scheduler_log = (*cluster)->scheduler().ReadLog();
  CHECK(scheduler_log.find("worker-1 leaves the job: spot interruption") != std::string::npos);
  CHECK(scheduler_log.find("worker-1 lost; sync steps complete without it") != std::string::npos);
  CHECK(scheduler_log.find("final test_accuracy=") != std::string::npos);
}

}  // namespace
}  // namespace paramserver
