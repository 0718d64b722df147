// The scheduler's live status page: one self-contained HTML page (no external files;
// edited as scheduler/status_page/status_page.{html,css,js}, inlined at build time)
// that polls /api/status every second and shows the job's figures (steps of the total,
// ETA, smoothed loss, test accuracy, samples/s), the node table, and each worker's loss
// and test-accuracy curves as SVG charts with axes and gridlines. When the scheduler
// stops answering, the last status stays on screen with a note saying so.
#ifndef PARAMSERVER_SCHEDULER_STATUS_PAGE_H_
#define PARAMSERVER_SCHEDULER_STATUS_PAGE_H_

#include <string>

#include "proto/admin.pb.h"

namespace paramserver {

// The page's HTML.
const std::string& StatusPageHtml();

// /api/status: the status (with history) as JSON, every field present, as PlainJson
// writes it (numbers as numbers, health and role as the tables' words).
std::string StatusJson(const ClusterStatus& status);

// The same page with `status` built in and no polling: the final report the scheduler
// leaves behind when the job ends (output.report), readable without any server.
std::string FinalReportHtml(const ClusterStatus& status);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_STATUS_PAGE_H_
