// Metrics in Prometheus' text exposition format, on Debian's prometheus-cpp (its core
// registry, counters, histograms, and its TextSerializer): counters, histograms and
// gauges read when scraped, each with optional labels, and an HTTP endpoint
// (cpp-httplib, which also serves the status page) serving them at /metrics. Each daemon
// owns one registry and passes it to what it measures.
#ifndef PARAMSERVER_COMMON_OPS_METRICS_H_
#define PARAMSERVER_COMMON_OPS_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace httplib {
class Server;
}

namespace paramserver {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Thread-safe, lock-free: a prometheus-cpp counter.
class Counter {
 public:
  explicit Counter(prometheus::Counter* counter) : counter_(counter) {}
  void Increment(int64_t by = 1) { counter_->Increment(static_cast<double>(by)); }
  int64_t value() const { return static_cast<int64_t>(counter_->Value()); }

 private:
  prometheus::Counter* const counter_;  // owned by the registry
};

// Thread-safe: a prometheus-cpp histogram (cumulative buckets with the given upper
// bounds, plus +Inf; a sum and a count).
class Histogram {
 public:
  explicit Histogram(prometheus::Histogram* histogram) : histogram_(histogram) {}
  void Observe(double value) { histogram_->Observe(value); }
  // Observes the seconds from `start` to now.
  void ObserveSince(absl::Time start) { Observe(absl::ToDoubleSeconds(absl::Now() - start)); }

 private:
  prometheus::Histogram* const histogram_;  // owned by the registry
};

// Latency buckets for RPCs, in seconds: 100 us to 10 s.
std::vector<double> RpcLatencyBuckets();

// One family of samples read at scrape time: a gauge, or a count kept elsewhere that
// only grows (`counter`: TYPE counter).
struct ScrapedFamily {
  std::string name;
  std::string help;
  bool counter = false;
  std::vector<std::pair<MetricLabels, double>> samples;
};

// Thread-safe. A prometheus-cpp registry (Debian's prometheus-cpp-dev) behind the few
// calls the daemons make. Metrics are registered once (usually at start-up) and live as
// long as the registry; the pointers it returns stay valid that long. Registering the
// same name again adds a labelled series to that family (keeping its first help text).
class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();

  Counter* AddCounter(const std::string& name, const std::string& help, MetricLabels labels = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  Histogram* AddHistogram(const std::string& name, const std::string& help, MetricLabels labels,
                          std::vector<double> upper_bounds) ABSL_LOCKS_EXCLUDED(mu_);
  // A gauge family read when scraped: `read` returns the current (labels, value) samples
  // (called with no registry lock held; it must not call back into the registry).
  void AddGauge(const std::string& name, const std::string& help,
                std::function<std::vector<std::pair<MetricLabels, double>>()> read)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same for a count kept elsewhere that only grows (a shard's applied updates):
  // exposed as a counter (TYPE counter), so rate() and increase() apply. The name should
  // end in _total.
  void AddScrapedCounter(const std::string& name, const std::string& help,
                         std::function<std::vector<std::pair<MetricLabels, double>>()> read)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Families read together at each scrape by one call of `read`: what they show comes
  // from one look at their source (one snapshot for all of them, not one each). Called
  // with no registry lock held; it must not call back into the registry.
  void AddScrapedFamilies(std::function<std::vector<ScrapedFamily>()> read)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every metric in Prometheus' text format (version 0.0.4), by prometheus-cpp's
  // TextSerializer: one HELP and TYPE per name.
  std::string Render() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class ScrapedGauges;
  const std::shared_ptr<prometheus::Registry> registry_;
  const std::shared_ptr<ScrapedGauges> gauges_;  // collected after the registry's families
  mutable absl::Mutex mu_;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Family<prometheus::Histogram>*> histograms_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Counter>> counter_handles_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Histogram>> histogram_handles_ ABSL_GUARDED_BY(mu_);
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

#endif  // PARAMSERVER_COMMON_OPS_METRICS_H_
