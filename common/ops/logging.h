// Logging setup: every line names the node that wrote it ("ps-1", "worker-0",
// "scheduler"), so the logs of a whole cluster can be read interleaved.
#ifndef PARAMSERVER_COMMON_OPS_LOGGING_H_
#define PARAMSERVER_COMMON_OPS_LOGGING_H_

#include <string>

namespace paramserver {

// Sets the process-wide spdlog pattern to include `node_name`. Call again once the
// name is known (servers and workers learn theirs when they register).
void SetLogNodeName(const std::string& node_name);

// What a server or worker is called until the scheduler gives it its name: its role,
// host and process id ("worker@ip-10-0-1-5:pid4711"), unique in a cluster and known from
// the first line. The line that reports the registration names both.
std::string ProvisionalNodeName(const std::string& role);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_OPS_LOGGING_H_
