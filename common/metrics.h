// Metrics in Prometheus' text exposition format: counters, histograms and gauges read
// when scraped, each with optional labels, and an HTTP endpoint (cpp-httplib) serving
// them at /metrics. Each daemon owns one registry and passes it to what it measures.
#ifndef PARAMSERVER_COMMON_METRICS_H_
#define PARAMSERVER_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace httplib {
class Server;
}

namespace paramserver {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Thread-safe, lock-free.
class Counter {
 public:
  void Increment(int64_t by = 1) { value_.fetch_add(by, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Thread-safe. Cumulative buckets with the given upper bounds (plus +Inf), a sum and a
// count, as Prometheus expects.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value) ABSL_LOCKS_EXCLUDED(mu_);
  // Observes the seconds from `start` to now.
  void ObserveSince(absl::Time start) { Observe(absl::ToDoubleSeconds(absl::Now() - start)); }
  // The sample lines of this histogram under `name` with `labels`.
  std::string Render(const std::string& name, const MetricLabels& labels) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::vector<double> upper_bounds_;
  mutable absl::Mutex mu_;
  std::vector<int64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative; last is +Inf
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// Latency buckets for RPCs, in seconds: 100 us to 10 s.
std::vector<double> RpcLatencyBuckets();

// Thread-safe. Metrics are registered once (usually at start-up) and live as long as the
// registry; the pointers it returns stay valid that long.
class MetricsRegistry {
 public:
  Counter* AddCounter(const std::string& name, const std::string& help, MetricLabels labels = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  Histogram* AddHistogram(const std::string& name, const std::string& help, MetricLabels labels,
                          std::vector<double> upper_bounds) ABSL_LOCKS_EXCLUDED(mu_);
  // A gauge family read when scraped: `read` returns the current (labels, value) samples
  // (called with no registry lock held; it must not call back into the registry).
  void AddGauge(const std::string& name, const std::string& help,
                std::function<std::vector<std::pair<MetricLabels, double>>()> read)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every metric in Prometheus' text format (version 0.0.4), one HELP and TYPE per name.
  std::string Render() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Family {
    std::string name;
    std::string help;
    std::string type;  // counter, histogram, gauge
    std::vector<std::pair<MetricLabels, std::unique_ptr<Counter>>> counters;
    std::vector<std::pair<MetricLabels, std::unique_ptr<Histogram>>> histograms;
    std::function<std::vector<std::pair<MetricLabels, double>>()> read;
  };
  Family* FamilyLocked(const std::string& name, const std::string& help, const std::string& type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
};

// A page served beside /metrics: GET `path` answers `body()` with `content_type`.
struct HttpRoute {
  std::string path;
  std::string content_type;
  std::function<std::string()> body;
  // If set, a request is answered only when this accepts its Authorization header
  // (else 401).
  std::function<bool(const std::string& authorization)> authorize;
};

// The node's certificate and key (PEM files): an endpoint given them serves HTTPS.
// Both empty: plain HTTP.
struct HttpsFiles {
  std::string cert_file;
  std::string key_file;
};

// Serves GET /metrics (the registry's Render), and any extra routes, over HTTP (HTTPS
// with `https`) on a thread of its own.
class MetricsHttpServer {
 public:
  // Listens on host:port (port 0: any free port). UNAVAILABLE naming the address if it
  // cannot be bound; INVALID_ARGUMENT naming the files if `https`'s cannot be used.
  // `registry` and whatever the routes use must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, const MetricsRegistry* registry,
      std::vector<HttpRoute> routes = {}, const HttpsFiles& https = {});
  // Stops serving and joins the thread.
  ~MetricsHttpServer();
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// For a daemon's --metrics_port: null when `port` < 0; otherwise serves `registry` on
// `host` (the daemons' --metrics_host, loopback unless told otherwise), over HTTPS with
// `https` (the node's security.tls certificate), and logs the URL.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MaybeServeMetrics(
    int port, const std::string& host, const MetricsRegistry* registry,
    std::vector<HttpRoute> routes = {}, const HttpsFiles& https = {});

// The host part of "host:port" ("127.0.0.1" for "127.0.0.1:7000").
std::string HostOf(const std::string& address);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_METRICS_H_
