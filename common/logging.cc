#include "common/logging.h"

#include "spdlog/spdlog.h"

namespace paramserver {

void SetLogNodeName(const std::string& node_name) {
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e [" + node_name + "] %^%l%$: %v");
  spdlog::flush_on(spdlog::level::info);
}

}  // namespace paramserver
