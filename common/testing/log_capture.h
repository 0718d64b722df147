// Captures what the default spdlog logger writes, for tests that check a log line.
#ifndef PARAMSERVER_COMMON_TESTING_LOG_CAPTURE_H_
#define PARAMSERVER_COMMON_TESTING_LOG_CAPTURE_H_

#include <memory>
#include <sstream>
#include <string>

#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace paramserver {

// While alive, every line the default logger writes is also kept here (its other sinks
// still get it). Not thread-safe against a concurrent second LogCapture.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_)) {
    sink_->set_pattern("[%l] %v");
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    for (auto it = sinks.begin(); it != sinks.end(); ++it) {
      if (*it == sink_) {
        sinks.erase(it);
        break;
      }
    }
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Everything captured so far, one "[level] message" line each.
  std::string text() {
    sink_->flush();
    return stream_.str();
  }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_TESTING_LOG_CAPTURE_H_
