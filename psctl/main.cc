// psctl: the operator's command line for a running job, over the scheduler's admin
// service. See docs/OPERATIONS.md.
//   psctl --scheduler HOST:PORT [--cluster-token-file F] [--json] [--token-file F]
//   status|nodes|shards|watch psctl --scheduler HOST:PORT --token-file F checkpoint|shutdown|drain
//   NODE|scale --servers N
// Exit status: 0 done; 1 the scheduler could not be reached or refused (one line on
// stderr says why); 2 a usage error.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/ops/plain_json.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/admin_token.h"
#include "common/security/peer_credentials.h"
#include "common/security/secrets.h"
#include "proto/admin.grpc.pb.h"
#include "psctl/status_format.h"

ABSL_FLAG(std::string, scheduler, "", "the scheduler's HOST:PORT (required)");
ABSL_FLAG(std::string, token_file, "", "the admin token file (default: $PSCTL_TOKEN_FILE)");
ABSL_FLAG(std::string, cluster_token_file, "",
          "the cluster token file (default: $PSCTL_CLUSTER_TOKEN_FILE)");
ABSL_FLAG(std::string, tls_ca, "", "mutual TLS: the CA certificate");
ABSL_FLAG(std::string, tls_cert, "", "mutual TLS: this client's certificate");
ABSL_FLAG(std::string, tls_key, "", "mutual TLS: this client's key");
ABSL_FLAG(std::string, tls_server_name, "", "mutual TLS: the name the scheduler's certificate has");
ABSL_FLAG(bool, json, false, "print JSON instead of text");
ABSL_FLAG(int, servers, -1, "scale: the number of live servers wanted");

namespace paramserver {
namespace {

constexpr char kUsage[] =
    "usage: psctl --scheduler HOST:PORT [--cluster-token-file F] [--json] [--token-file F]\n"
    "             [--tls-ca F --tls-cert F --tls-key F [--tls-server-name N]] COMMAND\n"
    "commands: status, nodes, shards, watch (read); checkpoint, drain NODE, scale --servers N,\n"
    "shutdown (need the admin token, from --token-file or PSCTL_TOKEN_FILE)\n"
    "A job with security.cluster_token_file needs that file too (--cluster-token-file or\n"
    "PSCTL_CLUSTER_TOKEN_FILE).\n";

struct Options {
  std::string scheduler;
  std::string token_file;
  std::string cluster_token_file;
  TlsFiles tls;
  bool json = false;
  std::string command;
  std::string node;  // drain
  int servers = -1;  // scale
};

std::atomic<bool> interrupted{false};

int Usage(const std::string& problem) {
  std::fprintf(stderr, "psctl: %s\n%s", problem.c_str(), kUsage);
  return 2;
}

// psctl's flags are spelled with dashes (--token-file); absl's names use underscores.
// Returns argv with each flag's name so spelled, or an exit status (2) and a usage line
// for a flag psctl does not have or a value that is missing.
absl::StatusOr<std::vector<std::string>> NormalizeFlags(int argc, char** argv) {
  std::vector<std::string> args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      args.push_back(arg);
      continue;
    }
    const size_t equals = arg.find('=');
    std::string name = arg.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
    std::replace(name.begin(), name.end(), '-', '_');
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || flag->Filename().find("psctl/main.cc") == std::string::npos) {
      return absl::InvalidArgumentError("unknown flag " + arg);
    }
    const bool boolean = flag->IsOfType<bool>();
    if (equals == std::string::npos && !boolean && i + 1 >= argc) {
      return absl::InvalidArgumentError("unknown flag " + arg);  // as before: no value
    }
    args.push_back("--" + name + (equals == std::string::npos ? "" : arg.substr(equals)));
  }
  return args;
}

// Parses argv; returns an exit status (2) on a usage error, -1 when it parsed.
int Parse(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    }
  }
  absl::StatusOr<std::vector<std::string>> normalized = NormalizeFlags(argc, argv);
  if (!normalized.ok()) return Usage(std::string(normalized.status().message()));
  std::vector<char*> pointers;
  for (std::string& arg : *normalized) pointers.push_back(arg.data());
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  const std::vector<std::string> positional(rest.begin() + 1, rest.end());
  options->scheduler = absl::GetFlag(FLAGS_scheduler);
  options->token_file = absl::GetFlag(FLAGS_token_file);
  options->cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file);
  options->tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  options->tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options->tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options->tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  options->json = absl::GetFlag(FLAGS_json);
  options->servers = absl::GetFlag(FLAGS_servers);
  if (options->scheduler.empty()) return Usage("--scheduler HOST:PORT is required");
  if (positional.empty()) return Usage("no command");
  options->command = positional[0];
  if (options->command == "scale" && options->servers < 1)
    return Usage("scale takes --servers N (N >= 1)");
  if (options->command != "scale" && options->servers != -1)
    return Usage("--servers goes with scale");
  if (options->command == "drain") {
    if (positional.size() != 2) return Usage("drain takes one node name, e.g. drain ps-1");
    options->node = positional[1];
  } else if (positional.size() != 1) {
    return Usage("unexpected argument " + positional[1]);
  }
  const int tls_files = !options->tls.ca_file.empty() + !options->tls.cert_file.empty() +
                        !options->tls.key_file.empty();
  if (tls_files != 0 && tls_files != 3)
    return Usage("--tls-ca, --tls-cert and --tls-key go together");
  if (options->token_file.empty()) {
    if (const char* from_env = std::getenv("PSCTL_TOKEN_FILE"); from_env != nullptr)
      options->token_file = from_env;
  }
  if (options->cluster_token_file.empty()) {
    if (const char* from_env = std::getenv("PSCTL_CLUSTER_TOKEN_FILE"); from_env != nullptr) {
      options->cluster_token_file = from_env;
    }
  }
  return -1;
}

int Fail(const std::string& what, const grpc::Status& status) {
  std::fprintf(stderr, "psctl: %s: %s: %s\n", what.c_str(),
               absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())).c_str(),
               status.error_message().c_str());
  return 1;
}

std::string Json(const google::protobuf::Message& message) {
  return PlainJson(message, /*indent=*/true);
}

// The messages as one JSON array, one element per message.
template <typename Messages>
std::string JsonArray(const Messages& messages) {
  std::string out = "[\n";
  for (int i = 0; i < messages.size(); ++i) {
    std::string element = Json(messages.Get(i));
    while (!element.empty() && element.back() == '\n') element.pop_back();
    absl::StrAppend(&out, element, i + 1 < messages.size() ? ",\n" : "\n");
  }
  return out + "]\n";
}

class Cli {
 public:
  Cli(Options options, const std::string& cluster_token)
      : options_(std::move(options)),
        stub_(Admin::NewStub(
            CreateChannel(options_.scheduler, std::make_shared<CallCredentials>(cluster_token)))) {}

  int Run() {
    if (!options_.token_file.empty()) {
      absl::StatusOr<std::string> token = ReadAdminToken(options_.token_file);
      if (!token.ok()) {
        std::fprintf(stderr, "psctl: %s\n", std::string(token.status().message()).c_str());
        return 1;
      }
      token_ = *token;
    }
    const std::string& command = options_.command;
    if (command == "status" || command == "nodes" || command == "shards") return Show(command);
    if (command == "watch") return Watch();
    if (command == "checkpoint") return Checkpoint();
    if (command == "drain") return Drain();
    if (command == "scale") return Scale();
    if (command == "shutdown") return Shutdown();
    return Usage("unknown command " + command);
  }

 private:
  void Prepare(grpc::ClientContext* context) const {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (!token_.empty()) context->AddMetadata(kAuthorizationMetadata, BearerValue(token_));
  }

  grpc::Status Fetch(ClusterStatus* status) const {
    grpc::ClientContext context;
    Prepare(&context);
    return stub_->GetStatus(&context, GetStatusRequest(), status);
  }

  std::string Where() const { return absl::StrCat("scheduler at ", options_.scheduler); }

  int Show(const std::string& what) const {
    ClusterStatus status;
    if (grpc::Status got = Fetch(&status); !got.ok()) return Fail(Where(), got);
    if (options_.json) {
      if (what == "nodes") {
        std::printf("%s", JsonArray(status.nodes()).c_str());
      } else if (what == "shards") {
        std::printf("%s", JsonArray(status.shards()).c_str());
      } else {
        std::printf("%s\n", Json(status).c_str());
      }
    } else {
      const std::string text = what == "nodes"    ? FormatNodes(status)
                               : what == "shards" ? FormatShards(status)
                                                  : FormatStatus(status);
      std::printf("%s", text.c_str());
    }
    return 0;
  }

  int Watch() const {
    signal(SIGINT, [](int) { interrupted = true; });
    while (!interrupted.load()) {
      ClusterStatus status;
      if (grpc::Status got = Fetch(&status); !got.ok()) return Fail(Where(), got);
      std::printf("\033[H\033[2J%s  (%s; every 1 s, Ctrl-C to stop)\n\n%s",
                  options_.scheduler.c_str(),
                  absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()).c_str(),
                  FormatStatus(status).c_str());
      std::fflush(stdout);
      for (int i = 0; i < 10 && !interrupted.load(); ++i) absl::SleepFor(absl::Milliseconds(100));
    }
    return 0;
  }

  int Checkpoint() const {
    grpc::ClientContext context;
    Prepare(&context);
    RequestCheckpointResponse response;
    if (grpc::Status done =
            stub_->RequestCheckpoint(&context, RequestCheckpointRequest(), &response);
        !done.ok()) {
      return Fail("checkpoint", done);
    }
    std::printf("checkpoint: every shard writes one at step %lld\n",
                static_cast<long long>(response.step()));
    return 0;
  }

  int Drain() const {
    grpc::ClientContext context;
    Prepare(&context);
    DrainServerRequest request;
    request.set_node_name(options_.node);
    DrainServerResponse response;
    if (grpc::Status done = stub_->DrainServer(&context, request, &response); !done.ok()) {
      return Fail("drain " + options_.node, done);
    }
    std::printf("draining %s: its shards move at epoch %lld; it exits once they have\n",
                options_.node.c_str(), static_cast<long long>(response.epoch()));
    return 0;
  }

  // The live servers (alive or suspect), in rank order.
  static std::vector<std::string> LiveServers(const ClusterStatus& status) {
    std::vector<std::string> live;
    for (const NodeStatus& node : status.nodes()) {
      if (node.role() == NODE_ROLE_SERVER &&
          (node.health() == NODE_HEALTH_ALIVE || node.health() == NODE_HEALTH_SUSPECT)) {
        live.push_back(node.name());
      }
    }
    std::sort(live.begin(), live.end(), [](const std::string& a, const std::string& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
    return live;
  }

  // Scale-in drains the highest-ranked live servers one after the other, each once the
  // one before has left (its heartbeats stopped for 2 s: its shards moved, with their
  // state); scale-out cannot start processes and says what to start.
  int Scale() const {
    const absl::Time give_up = absl::Now() + absl::Minutes(10);
    std::string draining;
    while (true) {
      ClusterStatus status;
      if (grpc::Status got = Fetch(&status); !got.ok()) return Fail(Where(), got);
      const std::vector<std::string> live = LiveServers(status);
      // The drained server leaves once it serves the map that moved its shards (it
      // hands off what has no backup first): its heartbeats stop.
      bool drain_pending = false;
      for (const NodeStatus& node : status.nodes()) {
        if (node.name() == draining && node.seconds_since_heartbeat() < 2.0) drain_pending = true;
      }
      if (!drain_pending && static_cast<int>(live.size()) <= options_.servers) {
        if (static_cast<int>(live.size()) < options_.servers) {
          std::printf(
              "scale: %zu live servers; start %d more with this job's config and token (ps_server "
              "--config F, as the README's by-hand section shows; on EC2: launch.py scale "
              "--servers %d). Each takes a fair share of the shards, up to cluster.servers' max\n",
              live.size(), options_.servers - static_cast<int>(live.size()), options_.servers);
        } else {
          std::printf("scale: %zu live servers\n", live.size());
        }
        return 0;
      }
      if (absl::Now() > give_up) {
        std::fprintf(stderr, "psctl: scale: %s has not left after 10 minutes\n", draining.c_str());
        return 1;
      }
      if (drain_pending) {
        absl::SleepFor(absl::Milliseconds(500));
        continue;
      }
      draining = live.back();
      grpc::ClientContext context;
      Prepare(&context);
      DrainServerRequest request;
      request.set_node_name(draining);
      DrainServerResponse response;
      if (grpc::Status done = stub_->DrainServer(&context, request, &response); !done.ok()) {
        return Fail("scale: drain " + draining, done);
      }
      std::printf("scale: draining %s (its shards move at epoch %lld)\n", draining.c_str(),
                  static_cast<long long>(response.epoch()));
      std::fflush(stdout);
    }
  }

  int Shutdown() const {
    grpc::ClientContext context;
    Prepare(&context);
    ShutdownResponse response;
    if (grpc::Status done = stub_->Shutdown(&context, ShutdownRequest(), &response); !done.ok()) {
      return Fail("shutdown", done);
    }
    std::printf("shutdown: every node stops at its next heartbeat\n");
    return 0;
  }

  const Options options_;
  std::string token_;
  std::unique_ptr<Admin::Stub> stub_;
};

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) {
  paramserver::Options options;
  if (int usage = paramserver::Parse(argc, argv, &options); usage >= 0) return usage;
  if (!options.tls.ca_file.empty()) {
    if (absl::Status tls = paramserver::UseMutualTls(options.tls); !tls.ok()) {
      std::fprintf(stderr, "psctl: %s\n", std::string(tls.message()).c_str());
      return 2;
    }
  }
  std::string cluster_token;
  if (!options.cluster_token_file.empty()) {
    absl::StatusOr<std::string> token =
        paramserver::ReadSecretFile(options.cluster_token_file, "cluster token");
    if (!token.ok()) {
      std::fprintf(stderr, "psctl: %s\n", std::string(token.status().message()).c_str());
      return 1;
    }
    cluster_token = *token;
  }
  return paramserver::Cli(std::move(options), cluster_token).Run();
}
