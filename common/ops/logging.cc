#include "common/ops/logging.h"

#include <unistd.h>

#include <string>

#include "spdlog/spdlog.h"

namespace paramserver {

void SetLogNodeName(const std::string& node_name) {
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e [" + node_name + "] %^%l%$: %v");
  spdlog::flush_on(spdlog::level::info);
}

std::string ProvisionalNodeName(const std::string& role) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return role + "@" + (host[0] != '\0' ? host : "localhost") + ":pid" + std::to_string(getpid());
}

}  // namespace paramserver
