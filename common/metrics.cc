#include "common/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "httplib.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

std::string FormatValue(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  if (value == std::floor(value) && std::fabs(value) < 1e15)
    return absl::StrCat(static_cast<int64_t>(value));
  return absl::StrFormat("%.9g", value);
}

// {a="1",b="2"}, or "" without labels; label values escaped as the format requires.
std::string FormatLabels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string value =
        absl::StrReplaceAll(labels[i].second, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
    absl::StrAppend(&out, i > 0 ? "," : "", labels[i].first, "=\"", value, "\"");
  }
  return out + "}";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
}

std::string Histogram::Render(const std::string& name, const MetricLabels& labels) const {
  absl::MutexLock lock(&mu_);
  std::string out;
  int64_t cumulative = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    cumulative += counts_[i];
    MetricLabels with_le = labels;
    with_le.emplace_back("le", i < upper_bounds_.size() ? FormatValue(upper_bounds_[i]) : "+Inf");
    absl::StrAppend(&out, name, "_bucket", FormatLabels(with_le), " ", cumulative, "\n");
  }
  absl::StrAppend(&out, name, "_sum", FormatLabels(labels), " ", FormatValue(sum_), "\n");
  absl::StrAppend(&out, name, "_count", FormatLabels(labels), " ", cumulative, "\n");
  return out;
}

std::vector<double> RpcLatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   10};
}

MetricsRegistry::Family* MetricsRegistry::FamilyLocked(const std::string& name,
                                                       const std::string& help,
                                                       const std::string& type) {
  for (const std::unique_ptr<Family>& family : families_) {
    if (family->name == name) return family.get();
  }
  auto family = std::make_unique<Family>();
  family->name = name;
  family->help = help;
  family->type = type;
  families_.push_back(std::move(family));
  return families_.back().get();
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                     MetricLabels labels) {
  absl::MutexLock lock(&mu_);
  Family* family = FamilyLocked(name, help, "counter");
  family->counters.emplace_back(std::move(labels), std::make_unique<Counter>());
  return family->counters.back().second.get();
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         MetricLabels labels, std::vector<double> upper_bounds) {
  absl::MutexLock lock(&mu_);
  Family* family = FamilyLocked(name, help, "histogram");
  family->histograms.emplace_back(std::move(labels),
                                  std::make_unique<Histogram>(std::move(upper_bounds)));
  return family->histograms.back().second.get();
}

void MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                               std::function<std::vector<std::pair<MetricLabels, double>>()> read) {
  absl::MutexLock lock(&mu_);
  FamilyLocked(name, help, "gauge")->read = std::move(read);
}

std::string MetricsRegistry::Render() const {
  std::vector<const Family*> families;
  {
    absl::MutexLock lock(&mu_);
    for (const std::unique_ptr<Family>& family : families_) families.push_back(family.get());
  }
  // Families are never removed, and their metrics are only appended at start-up.
  std::string out;
  for (const Family* family : families) {
    absl::StrAppend(&out, "# HELP ", family->name, " ", family->help, "\n# TYPE ", family->name,
                    " ", family->type, "\n");
    for (const auto& [labels, counter] : family->counters) {
      absl::StrAppend(&out, family->name, FormatLabels(labels), " ", counter->value(), "\n");
    }
    for (const auto& [labels, histogram] : family->histograms) {
      absl::StrAppend(&out, histogram->Render(family->name, labels));
    }
    if (family->read) {
      for (const auto& [labels, value] : family->read()) {
        absl::StrAppend(&out, family->name, FormatLabels(labels), " ", FormatValue(value), "\n");
      }
    }
  }
  return out;
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
