// The scheduler's live status page: one self-contained HTML page (no external files)
// that polls /api/status every second and draws the cluster table and each worker's
// loss and test-accuracy curves as SVG.
#ifndef PARAMSERVER_SCHEDULER_STATUS_PAGE_H_
#define PARAMSERVER_SCHEDULER_STATUS_PAGE_H_

#include <string>

#include "proto/admin.pb.h"

namespace paramserver {

// The page's HTML.
const std::string& StatusPageHtml();

// /api/status: the status (with history) as JSON, every field present.
std::string StatusJson(const ClusterStatus& status);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_STATUS_PAGE_H_
