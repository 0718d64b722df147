// Channel and server creation with the project's gRPC settings: message-size limits
// chosen per server, and the standard health service on every daemon (no reflection:
// the schema is public in proto/, and reflection would name a daemon's services to
// anyone without the cluster token).
#ifndef PARAMSERVER_COMMON_RPC_RPC_ENDPOINTS_H_
#define PARAMSERVER_COMMON_RPC_RPC_ENDPOINTS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security/peer_credentials.h"
#include "grpcpp/channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "grpcpp/server.h"

namespace paramserver {

// Largest message any daemon sends, and the servers accept (a shard's values or
// gradient).
constexpr int kMaxMessageBytes = 512 << 20;
// Largest message the scheduler accepts (its own and the admin service, which share a
// port: gRPC's limit is per server). The largest legitimate request is a DeclareModel
// at common/model/model_declaration's caps, under 3.5 MiB (model_declaration_test checks).
constexpr int kMaxSchedulerMessageBytes = 4 << 20;
// The least memory quota of a server with small messages (StartRpcServer).
constexpr size_t kSmallServerMemoryQuota = 16 << 20;

// Mutual TLS for every channel and server of this process: PEM files of the cluster's
// CA, this node's certificate (chain) and its private key. `server_name`, if set, is the
// name every peer's certificate must carry (so that nodes may have any address);
// otherwise the host of the address dialled is checked.
struct TlsFiles {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string server_name;
};

// From now on CreateChannel and StartRpcServer use mutual TLS with these files: a server
// refuses a peer without a certificate signed by the CA, and a channel refuses a server
// without one. Call once, before any channel or server is made (the mains do, from
// security.tls). INVALID_ARGUMENT naming a file that cannot be read or is not PEM.
absl::Status UseMutualTls(const TlsFiles& files);

// How soon a channel tries again to connect to a peer it cannot reach: after
// kInitialReconnectBackoff, then at growing intervals of at most kMaxReconnectBackoff
// (each +-20%), so a peer back from an outage of any length is reached within about
// 0.6 s: well inside any failure timeout (cluster.failure_timeout_ms). That holds while
// the peer's host refuses connections; one attempt to a host that drops packets may
// take gRPC's minimum connect timeout (20 s).
inline constexpr absl::Duration kInitialReconnectBackoff = absl::Milliseconds(100);
inline constexpr absl::Duration kMaxReconnectBackoff = absl::Milliseconds(500);

// How long the owner of cancelled callback calls (reactors: a heartbeat stream, a
// replication link's calls) waits for them to end before leaving them to end on gRPC's
// thread: a cancelled call ends at once, but for a gRPC thread that is late. (The owner
// frees ended calls on its own thread: their contexts hold the channel, whose last
// reference must not go on gRPC's thread; docs/ARCHITECTURE.md.)
inline constexpr absl::Duration kCancelledCallEnd = absl::Seconds(1);

// A channel to host:port with the raised limits (TLS after UseMutualTls, else plain):
// messages of up to `max_message_bytes` each way. Every call on it carries
// `credentials`' metadata as they are at the call (none when null: psctl, and tests
// playing an outsider). Never fails: gRPC connects lazily, and the first call reports an
// unreachable peer as UNAVAILABLE.
std::shared_ptr<grpc::Channel> CreateChannel(
    const std::string& address, std::shared_ptr<const CallCredentials> credentials = nullptr,
    int max_message_bytes = kMaxMessageBytes);

struct RunningServer {
  // A server without services answers every method UNIMPLEMENTED through this (gRPC
  // builds no server without a service). Declared first: it outlives `server`.
  std::unique_ptr<grpc::CallbackGenericService> unknown_methods;
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (the OS's choice when the listen port was 0)
};

// Starts a gRPC server on `listen_address` (host:port, port 0 for any free port) with
// `services` (not owned; they must outlive the server) and health checking: the
// overall health ("") answers SERVING to anyone, a named service NOT_FOUND (none is
// registered, so the health service names no role). Requests larger than
// `max_receive_bytes` are refused with RESOURCE_EXHAUSTED; replies may be up to
// kMaxMessageBytes. A server with a smaller `max_receive_bytes` than kMaxMessageBytes
// also gets a gRPC memory quota (4 x max_receive_bytes, at least
// kSmallServerMemoryQuota) for its connections, so that calls too large to be served
// cannot fill its memory while gRPC reads them (it reads a message in full before it
// checks the limit); past the quota, calls are refused (RESOURCE_EXHAUSTED) or slowed.
// UNAVAILABLE naming the address when it cannot be bound.
absl::StatusOr<RunningServer> StartRpcServer(const std::string& listen_address,
                                             const std::vector<grpc::Service*>& services,
                                             int max_receive_bytes = kMaxMessageBytes);

// "host:port" with the port replaced by `port` when the address's port is 0.
std::string WithBoundPort(const std::string& address, int port);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_RPC_RPC_ENDPOINTS_H_
