// WorkerDaemon's data: every data.* file brought to this machine (the job loads them).
#include <algorithm>
#include <tuple>

#include "common/base/status_macros.h"
#include "common/files/s3_file_system.h"
#include "spdlog/spdlog.h"
#include "worker/worker_daemon.h"

namespace paramserver {

absl::Status WorkerDaemon::FetchData() {
  const DataSection& data = options_.spec.data;
  const std::string cache = DefaultDownloadFolder();
  if (data.format == DataFormat::kCriteo) {
    for (const auto& [key, from, to] :
         {std::tuple<const char*, const std::vector<std::string>&, std::vector<std::string>*>{
              "data.train", data.train, &data_.train},
          {"data.test", data.test, &data_.test}}) {
      to->clear();
      for (const std::string& file : from) {
        if (IsS3Uri(file)) spdlog::info("{}: downloading {} into {}", key, file, cache);
        PS_ASSIGN_OR_RETURN(std::string local, LocalCopyOf(key, file, cache));
        to->push_back(std::move(local));
      }
    }
    return absl::OkStatus();
  }
  for (const auto& [key, from, to] :
       {std::tuple<const char*, const std::string&, std::string*>{
            "data.train_images", data.train_images, &data_.train_images},
        {"data.train_labels", data.train_labels, &data_.train_labels},
        {"data.test_images", data.test_images, &data_.test_images},
        {"data.test_labels", data.test_labels, &data_.test_labels}}) {
    if (IsS3Uri(from)) spdlog::info("{}: downloading {} into {}", key, from, cache);
    PS_ASSIGN_OR_RETURN(*to, LocalCopyOf(key, from, cache));
  }
  return absl::OkStatus();
}

}  // namespace paramserver
