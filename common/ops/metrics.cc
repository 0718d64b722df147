#include "common/ops/metrics.h"

#include <algorithm>
#include <cstdlib>
#include <exception>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

prometheus::Labels ToLabels(const MetricLabels& labels) {
  return prometheus::Labels(labels.begin(), labels.end());
}

// A metric name or label prometheus-cpp refuses (it throws) is a broken invariant of this
// code base: every name is a constant of ours.
[[noreturn]] void BadMetric(const std::string& name, const std::exception& error) {
  spdlog::critical("metric {}: {}", name, error.what());
  std::abort();
}

}  // namespace

// The gauges read at scrape time, as one prometheus-cpp Collectable: groups of families,
// each group read by one call.
class MetricsRegistry::ScrapedGauges : public prometheus::Collectable {
 public:
  using ReadGroup = std::function<std::vector<ScrapedFamily>()>;
  void Add(ReadGroup read) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    groups_.push_back(std::move(read));
  }
  std::vector<prometheus::MetricFamily> Collect() const override ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<ReadGroup> groups;
    {
      absl::MutexLock lock(&mu_);
      groups = groups_;
    }
    std::vector<prometheus::MetricFamily> families;
    for (const ReadGroup& read : groups) {
      for (const ScrapedFamily& scraped : read()) {
        prometheus::MetricFamily& family = families.emplace_back();
        family.name = scraped.name;
        family.help = scraped.help;
        family.type =
            scraped.counter ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge;
        for (const auto& [labels, value] : scraped.samples) {
          prometheus::ClientMetric metric;
          for (const auto& [key, label_value] : labels) metric.label.push_back({key, label_value});
          if (scraped.counter) {
            metric.counter.value = value;
          } else {
            metric.gauge.value = value;
          }
          family.metric.push_back(std::move(metric));
        }
      }
    }
    return families;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<ReadGroup> groups_ ABSL_GUARDED_BY(mu_);
};

MetricsRegistry::MetricsRegistry()
    : registry_(std::make_shared<prometheus::Registry>()),
      gauges_(std::make_shared<ScrapedGauges>()) {}

MetricsRegistry::~MetricsRegistry() = default;

std::vector<double> RpcLatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   10};
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                     MetricLabels labels) {
  absl::MutexLock lock(&mu_);
  try {
    prometheus::Family<prometheus::Counter>*& family = counters_[name];
    if (family == nullptr) {
      family = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
    }
    counter_handles_.push_back(std::make_unique<Counter>(&family->Add(ToLabels(labels))));
  } catch (const std::exception& error) {
    BadMetric(name, error);
  }
  return counter_handles_.back().get();
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         MetricLabels labels, std::vector<double> upper_bounds) {
  absl::MutexLock lock(&mu_);
  try {
    prometheus::Family<prometheus::Histogram>*& family = histograms_[name];
    if (family == nullptr) {
      family = &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
    }
    histogram_handles_.push_back(std::make_unique<Histogram>(
        &family->Add(ToLabels(labels), prometheus::Histogram::BucketBoundaries(upper_bounds))));
  } catch (const std::exception& error) {
    BadMetric(name, error);
  }
  return histogram_handles_.back().get();
}

void MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                               std::function<std::vector<std::pair<MetricLabels, double>>()> read) {
  gauges_->Add([name, help, read = std::move(read)] {
    return std::vector<ScrapedFamily>{{name, help, /*counter=*/false, read()}};
  });
}

void MetricsRegistry::AddScrapedCounter(
    const std::string& name, const std::string& help,
    std::function<std::vector<std::pair<MetricLabels, double>>()> read) {
  gauges_->Add([name, help, read = std::move(read)] {
    return std::vector<ScrapedFamily>{{name, help, /*counter=*/true, read()}};
  });
}

void MetricsRegistry::AddScrapedFamilies(std::function<std::vector<ScrapedFamily>()> read) {
  gauges_->Add(std::move(read));
}

std::string MetricsRegistry::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& family : gauges_->Collect()) families.push_back(std::move(family));
  return prometheus::TextSerializer().Serialize(families);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const MetricsRegistry* registry,
    std::vector<HttpRoute> routes, const HttpsFiles& https) {
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  if (https.cert_file.empty()) {
    server->server_ = std::make_unique<httplib::Server>();
  } else {
    server->server_ =
        std::make_unique<httplib::SSLServer>(https.cert_file.c_str(), https.key_file.c_str());
    if (!server->server_->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot serve HTTPS with the certificate ",
                                                     https.cert_file, " and key ", https.key_file));
    }
  }
  server->server_->Get(
      "/metrics", [registry](const httplib::Request&, httplib::Response& response) {
        response.set_content(registry->Render(), "text/plain; version=0.0.4; charset=utf-8");
      });
  for (HttpRoute& route : routes) {
    server->server_->Get(
        route.path, [route](const httplib::Request& request, httplib::Response& response) {
          if (route.authorize && !route.authorize(request.get_header_value("Authorization"))) {
            response.status = 401;
            response.set_header("WWW-Authenticate", "Bearer");
            response.set_content("this needs the admin token: Authorization: Bearer <token>\n",
                                 "text/plain");
            return;
          }
          response.set_content(route.body(), route.content_type.c_str());
        });
  }
  server->port_ = port == 0 ? server->server_->bind_to_any_port(host) : port;
  if (server->port_ <= 0 || (port != 0 && !server->server_->bind_to_port(host, port))) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", host, ":", port));
  }
  httplib::Server* raw = server->server_.get();
  server->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MaybeServeMetrics(
    int port, const std::string& host, const MetricsRegistry* registry,
    std::vector<HttpRoute> routes, const HttpsFiles& https) {
  if (port < 0) return std::unique_ptr<MetricsHttpServer>();
  const bool with_page =
      std::any_of(routes.begin(), routes.end(), [](const HttpRoute& r) { return r.path == "/"; });
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(host, port, registry, std::move(routes), https);
  const char* scheme = https.cert_file.empty() ? "http" : "https";
  if (server.ok()) spdlog::info("metrics on {}://{}:{}/metrics", scheme, host, (*server)->port());
  if (server.ok() && with_page)
    spdlog::info("status page on {}://{}:{}/", scheme, host, (*server)->port());
  return server;
}

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace paramserver
