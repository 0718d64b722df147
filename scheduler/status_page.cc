#include "scheduler/status_page.h"

#include "absl/strings/str_cat.h"
#include "common/ops/plain_json.h"

namespace paramserver {

std::string StatusJson(const ClusterStatus& status) { return PlainJson(status, /*indent=*/false); }

std::string FinalReportHtml(const ClusterStatus& status) {
  // The JSON goes inside a <script>: "</" would end it early, so it is written "<\/".
  std::string json = StatusJson(status);
  for (size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3))
    json.replace(at, 2, "<\\/");
  std::string html = StatusPageHtml();
  const std::string marker = "<script>\n";
  html.insert(html.find(marker),
              absl::StrCat("<script>window.FINAL_STATUS = ", json, ";</script>\n"));
  return html;
}

}  // namespace paramserver
