#include "common/ops/instance_metadata.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/rpc/rpc_endpoints.h"
#include "httplib.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

std::unique_ptr<httplib::Client> NewClient(const std::string& endpoint, absl::Duration timeout) {
  auto client = std::make_unique<httplib::Client>(endpoint);
  const auto microseconds = absl::ToInt64Microseconds(timeout);
  client->set_connection_timeout(microseconds / 1000000, microseconds % 1000000);
  client->set_read_timeout(microseconds / 1000000, microseconds % 1000000);
  return client;
}

}  // namespace

InstanceMetadataClient::InstanceMetadataClient(std::string endpoint, absl::Duration timeout)
    : endpoint_(std::move(endpoint)), timeout_(timeout) {}

absl::StatusOr<std::string> InstanceMetadataClient::Token() const {
  auto client = NewClient(endpoint_, timeout_);
  httplib::Result response = client->Put(
      "/latest/api/token", {{"X-aws-ec2-metadata-token-ttl-seconds", "300"}}, "", "text/plain");
  if (!response || response->status != 200) {
    return absl::UnavailableError(absl::StrCat(
        "the instance metadata service at ", endpoint_, " gave no token (",
        response ? absl::StrCat("HTTP ", response->status) : httplib::to_string(response.error()),
        ")"));
  }
  return response->body;
}

absl::StatusOr<std::optional<std::string>> InstanceMetadataClient::Get(
    const std::string& path) const {
  absl::StatusOr<std::string> token = Token();
  if (!token.ok()) return token.status();
  auto client = NewClient(endpoint_, timeout_);
  httplib::Result response = client->Get(path.c_str(), {{"X-aws-ec2-metadata-token", *token}});
  if (response && response->status == 404) return std::optional<std::string>();
  if (!response || response->status != 200) {
    return absl::UnavailableError(absl::StrCat(
        "the instance metadata service at ", endpoint_, " did not answer ", path, " (",
        response ? absl::StrCat("HTTP ", response->status) : httplib::to_string(response.error()),
        ")"));
  }
  return std::optional<std::string>(response->body);
}

absl::StatusOr<std::string> InstanceMetadataClient::PrivateIpv4() const {
  absl::StatusOr<std::optional<std::string>> address = Get("/latest/meta-data/local-ipv4");
  if (!address.ok()) return address.status();
  if (!address->has_value() || absl::StripAsciiWhitespace(**address).empty()) {
    return absl::UnavailableError(absl::StrCat("the instance metadata service at ", endpoint_,
                                               " has no local-ipv4 for this instance"));
  }
  return std::string(absl::StripAsciiWhitespace(**address));
}

absl::StatusOr<std::optional<std::string>> InstanceMetadataClient::SpotInstanceAction() const {
  return Get("/latest/meta-data/spot/instance-action");
}

absl::StatusOr<std::string> ResolveAdvertisedAddress(const std::string& advertise,
                                                     const std::string& listen_address,
                                                     int bound_port,
                                                     const std::string& imds_endpoint) {
  if (advertise.empty()) return WithBoundPort(listen_address, bound_port);
  if (advertise != "imds") return advertise;
  absl::StatusOr<std::string> address = InstanceMetadataClient(imds_endpoint).PrivateIpv4();
  if (!address.ok()) return address.status();
  spdlog::info("advertising this instance's private address {} (from the metadata service)",
               *address);
  return absl::StrCat(*address, ":", bound_port);
}

SpotInterruptionWatcher::SpotInterruptionWatcher(InstanceMetadataClient client,
                                                 absl::Duration interval,
                                                 std::function<void(const std::string&)> on_notice)
    : client_(std::move(client)),
      interval_(interval),
      on_notice_(std::move(on_notice)),
      thread_([this] { Loop(); }) {}

SpotInterruptionWatcher::~SpotInterruptionWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void SpotInterruptionWatcher::Loop() {
  bool reported_error = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_)) return;
    }
    absl::StatusOr<std::optional<std::string>> notice = client_.SpotInstanceAction();
    if (!notice.ok()) {
      if (!reported_error)
        spdlog::warn("spot interruption notices: {}; retrying", notice.status().ToString());
      reported_error = true;
      continue;
    }
    if (notice->has_value()) {
      spdlog::warn("spot interruption notice: {}", **notice);
      on_notice_(**notice);
      return;
    }
  }
}

}  // namespace paramserver
