// The EC2 instance metadata service (IMDSv2: a session token, then GETs with it): the
// instance's private address, and spot interruption notices, polled on a thread of its
// own. The endpoint is a parameter, so tests serve a fake one on 127.0.0.1.
#ifndef PARAMSERVER_COMMON_OPS_INSTANCE_METADATA_H_
#define PARAMSERVER_COMMON_OPS_INSTANCE_METADATA_H_

#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace paramserver {

inline constexpr char kDefaultImdsEndpoint[] = "http://169.254.169.254";

// Thread-compatible. Each call fetches a fresh token (PUT /latest/api/token) first.
class InstanceMetadataClient {
 public:
  // `endpoint`: "http://host[:port]". Calls time out after `timeout`.
  explicit InstanceMetadataClient(std::string endpoint, absl::Duration timeout = absl::Seconds(2));

  // The instance's private IPv4 address (/latest/meta-data/local-ipv4). UNAVAILABLE
  // naming the endpoint when it cannot be reached or answers otherwise.
  absl::StatusOr<std::string> PrivateIpv4() const;

  // The spot instance-action notice (/latest/meta-data/spot/instance-action): its JSON
  // body, or nullopt when there is none (404). UNAVAILABLE as above.
  absl::StatusOr<std::optional<std::string>> SpotInstanceAction() const;

 private:
  absl::StatusOr<std::string> Token() const;
  // The body of GET `path`, nullopt on 404.
  absl::StatusOr<std::optional<std::string>> Get(const std::string& path) const;

  const std::string endpoint_;
  const absl::Duration timeout_;
};

// The address a daemon registers under: `advertise` as given; when empty, the listen
// address with the bound port; when "imds", the instance's private address (from the
// metadata service at `imds_endpoint`) with the bound port. Errors name the endpoint.
absl::StatusOr<std::string> ResolveAdvertisedAddress(const std::string& advertise,
                                                     const std::string& listen_address,
                                                     int bound_port,
                                                     const std::string& imds_endpoint);

// Polls for a spot interruption notice every `interval` on its own thread and calls
// `on_notice(notice)` once, the first time one appears. Polling errors are logged once
// and retried. Thread-safe; the destructor stops polling (waits at most one interval).
class SpotInterruptionWatcher {
 public:
  SpotInterruptionWatcher(InstanceMetadataClient client, absl::Duration interval,
                          std::function<void(const std::string&)> on_notice);
  ~SpotInterruptionWatcher();

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const InstanceMetadataClient client_;
  const absl::Duration interval_;
  const std::function<void(const std::string&)> on_notice_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_OPS_INSTANCE_METADATA_H_
