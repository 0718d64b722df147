#include "common/rpc/rpc_endpoints.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/files/file_system.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/client_interceptor.h"

namespace paramserver {
namespace {

struct TlsMaterial {
  std::string ca;
  std::string cert;
  std::string key;
  std::string server_name;
};

// Set once by UseMutualTls, before the process makes channels or servers; read after.
const TlsMaterial* tls_material = nullptr;

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  absl::StatusOr<std::string> contents = LocalFileSystem().ReadFile(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the TLS ", what, " file ", path));
  }
  if (contents->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TLS ", what, " file ", path, " is not PEM"));
  }
  return *std::move(contents);
}

// Adds a node's credentials to the metadata of every call on a channel.
class CredentialsInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit CredentialsInterceptor(const CallCredentials* credentials) : credentials_(credentials) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      std::multimap<std::string, std::string>* metadata = methods->GetSendInitialMetadata();
      for (auto& [key, value] : credentials_->Metadata())
        metadata->emplace(std::move(key), std::move(value));
    }
    methods->Proceed();
  }

 private:
  const CallCredentials* const credentials_;
};

class CredentialsInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit CredentialsInterceptorFactory(std::shared_ptr<const CallCredentials> credentials)
      : credentials_(std::move(credentials)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new CredentialsInterceptor(credentials_.get());
  }

 private:
  const std::shared_ptr<const CallCredentials> credentials_;  // as long as the channel
};

}  // namespace

absl::Status UseMutualTls(const TlsFiles& files) {
  auto material = std::make_unique<TlsMaterial>();
  absl::StatusOr<std::string> ca = ReadPem(files.ca_file, "CA");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadPem(files.cert_file, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(files.key_file, "key");
  if (!key.ok()) return key.status();
  material->ca = *std::move(ca);
  material->cert = *std::move(cert);
  material->key = *std::move(key);
  material->server_name = files.server_name;
  tls_material = material.release();  // lives as long as the process
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                             std::shared_ptr<const CallCredentials> credentials,
                                             int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  // Each channel gets its own TCP connection, so pulls from different shards on the same
  // server do not queue behind each other on one connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A peer that comes back is reached again within kMaxReconnectBackoff (+20% jitter).
  // gRPC's own backoff grows to 120 s: after an outage of a few seconds, a node's next
  // connection attempt could come after the restarted scheduler's failure timeout, and a
  // live node be declared dead.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kInitialReconnectBackoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kMaxReconnectBackoff)));
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials =
      grpc::InsecureChannelCredentials();
  if (tls_material != nullptr) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = tls_material->ca;
    options.pem_cert_chain = tls_material->cert;
    options.pem_private_key = tls_material->key;
    if (!tls_material->server_name.empty())
      args.SetSslTargetNameOverride(tls_material->server_name);
    channel_credentials = grpc::SslCredentials(options);
  }
  if (credentials == nullptr) return grpc::CreateCustomChannel(address, channel_credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<CredentialsInterceptorFactory>(std::move(credentials)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, channel_credentials, args,
                                                                 std::move(interceptors));
}

absl::StatusOr<RunningServer> StartRpcServer(const std::string& listen_address,
                                             const std::vector<grpc::Service*>& services,
                                             int max_receive_bytes) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  RunningServer running;
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (tls_material != nullptr) {
    grpc::SslServerCredentialsOptions options(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    options.pem_root_certs = tls_material->ca;
    options.pem_key_cert_pairs.push_back({tls_material->key, tls_material->cert});
    credentials = grpc::SslServerCredentials(options);
  }
  builder.AddListeningPort(listen_address, credentials, &running.port);
  builder.SetMaxReceiveMessageSize(max_receive_bytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  if (max_receive_bytes < kMaxMessageBytes) {
    // gRPC reads a message in full before it checks its size: without a quota, ten
    // concurrent 64 MiB calls took a scheduler limited to 4 MiB from 25 MB to 508 MB.
    grpc::ResourceQuota quota("small-messages");
    quota.Resize(std::max<size_t>(size_t{4} * max_receive_bytes, kSmallServerMemoryQuota));
    builder.SetResourceQuota(quota);
  }
  for (grpc::Service* service : services) builder.RegisterService(service);
  if (services.empty()) {
    // Only the health service, which gRPC adds once the server has another.
    running.unknown_methods = std::make_unique<grpc::CallbackGenericService>();
    builder.RegisterCallbackGenericService(running.unknown_methods.get());
  }
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen_address,
                                               " (address in use, or not a local address?)"));
  }
  return running;
}

std::string WithBoundPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return absl::StrCat(address, ":", port);
  if (address.substr(colon + 1) != "0") return address;
  return absl::StrCat(address.substr(0, colon), ":", port);
}

}  // namespace paramserver
