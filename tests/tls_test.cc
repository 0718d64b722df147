// Mutual TLS across a real local cluster: the test makes its own CA and certificates
// with openssl; the cluster trains over TLS, and clients without a certificate, or with
// one signed by another CA, are refused.
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "tests/cluster_config.h"
#include "tests/psctl_runner.h"

namespace paramserver {
namespace {

// Runs a shell command in `dir`; REQUIREs success.
void Shell(const TempDir& dir, const std::string& command) {
  const std::string full =
      absl::StrCat("cd '", dir.path(), "' && ", command, " > openssl.log 2>&1");
  INFO(command);
  REQUIRE(std::system(full.c_str()) == 0);
}

// A CA `name`-ca.pem and a certificate `name`-cert.pem / `name`-key.pem it signed, for
// the name "paramserver" and 127.0.0.1.
void MakeCaAndCertificate(const TempDir& dir, const std::string& name) {
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  Shell(dir, absl::StrCat("openssl req -x509 ", ec, " -keyout ", name, "-ca.key -out ", name,
                          "-ca.pem -days 2 -subj /CN=", name, "-ca"));
  Shell(dir, absl::StrCat("printf 'subjectAltName=DNS:paramserver,IP:127.0.0.1\\n' > ", name,
                          "-ext.cnf"));
  Shell(dir, absl::StrCat("openssl req ", ec, " -keyout ", name, "-key.pem -out ", name,
                          "-node.csr -subj /CN=paramserver"));
  Shell(dir, absl::StrCat("openssl x509 -req -in ", name, "-node.csr -CA ", name, "-ca.pem -CAkey ",
                          name, "-ca.key -CAcreateserial -out ", name,
                          "-cert.pem -days 2 -extfile ", name, "-ext.cnf"));
}

std::vector<std::string> TlsFlags(const TempDir& dir, const std::string& name) {
  return {
      "--tls-ca",  dir.File("good-ca.pem"),     "--tls-cert",        dir.File(name + "-cert.pem"),
      "--tls-key", dir.File(name + "-key.pem"), "--tls-server-name", "paramserver"};
}

TEST_CASE(
    "a cluster trains over mutual TLS, and clients without a certificate from its CA are refused") {
  TempDir dir;
  MakeCaAndCertificate(dir, "good");
  MakeCaAndCertificate(dir, "rogue");
  TestJob job;
  job.max_steps = 100000;  // trains until the test shuts it down
  job.epochs = 100;
  job.admin_token_file = dir.WriteSecretFile("admin.token", kTestAdminToken);
  job.tls_ca = dir.File("good-ca.pem");
  job.tls_cert = dir.File("good-cert.pem");
  job.tls_key = dir.File("good-key.pem");
  job.tls_server_name = "paramserver";
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2);
  REQUIRE(cluster.ok());
  const std::string scheduler = (*cluster)->scheduler_address();

  // A client with the cluster's CA and a certificate it signed sees the job train.
  std::vector<std::string> good = TlsFlags(dir, "good");
  good.push_back("status");
  Result status;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    status = Psctl(dir, scheduler, good);
  } while ((status.code != 0 ||
            status.output.find("workers: furthest at step 0,") != std::string::npos ||
            status.output.find("training") != 0) &&
           absl::Now() < deadline);
  INFO(status.output);
  REQUIRE(status.code == 0);
  CHECK(status.output.rfind("training\n", 0) == 0);

  // No certificate at all, or one from another CA: refused.
  Result plaintext = Psctl(dir, scheduler, {"status"});
  CHECK(plaintext.code == 1);
  CHECK(plaintext.output.find("UNAVAILABLE") != std::string::npos);
  std::vector<std::string> rogue = {
      "--tls-ca",  dir.File("rogue-ca.pem"),  "--tls-cert",        dir.File("rogue-cert.pem"),
      "--tls-key", dir.File("rogue-key.pem"), "--tls-server-name", "paramserver",
      "status"};
  Result impostor = Psctl(dir, scheduler, rogue);
  CHECK(impostor.code == 1);
  // Our CA, but a certificate the cluster's CA did not sign.
  std::vector<std::string> half = {
      "--tls-ca",  dir.File("good-ca.pem"),   "--tls-cert",        dir.File("rogue-cert.pem"),
      "--tls-key", dir.File("rogue-key.pem"), "--tls-server-name", "paramserver",
      "status"};
  Result unsigned_client = Psctl(dir, scheduler, half);
  CHECK(unsigned_client.code == 1);

  std::vector<std::string> shutdown = TlsFlags(dir, "good");
  shutdown.insert(shutdown.end(), {"--token-file", job.admin_token_file, "shutdown"});
  CHECK(Psctl(dir, scheduler, shutdown).code == 0);
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(60));
  INFO(finished.ToString());
  CHECK(finished.ok());
}

TEST_CASE("a TLS setting that is incomplete or unreadable is refused with the key or file named") {
  TempDir dir;
  TestJob job;
  job.tls_ca = dir.File("absent-ca.pem");
  job.tls_cert = dir.File("absent-cert.pem");
  job.tls_key = dir.File("absent-key.pem");
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<ChildProcess> server = ChildProcess::Start(
      {RunfilePath("ps/ps_server"), "--config", config}, dir.File("server.log"));
  REQUIRE(server.ok());
  absl::StatusOr<int> code = server->WaitForExit(absl::Now() + absl::Seconds(20));
  REQUIRE(code.ok());
  CHECK(*code == 2);
  CHECK(server->ReadLog() == "ps_server: cannot read the TLS CA file " + job.tls_ca + "\n");
  job.tls_key.clear();
  const std::string partial = dir.WriteFile("partial.yaml", TestJobYaml(job));
  absl::StatusOr<ChildProcess> again = ChildProcess::Start(
      {RunfilePath("ps/ps_server"), "--config", partial}, dir.File("again.log"));
  REQUIRE(again.ok());
  REQUIRE(again->WaitForExit(absl::Now() + absl::Seconds(20)).ok());
  CHECK(again->ReadLog().find("security.tls.key: is missing: ca, cert and key are set together") !=
        std::string::npos);
}

}  // namespace
}  // namespace paramserver
