// WorkerDaemon's data: the files fetched to this machine, the training set and the
// compute of a built-in model, and rank 0's test set.
#include <algorithm>
#include <functional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/embedding_init.h"
#include "common/logging.h"
#include "common/mlp_parameters.h"
#include "common/model_declaration.h"
#include "common/retry_policy.h"
#include "common/s3_file_system.h"
#include "common/safetensors.h"
#include "common/security_policy.h"
#include "common/status_macros.h"
#include "common/storage_checks.h"
#include "spdlog/spdlog.h"
#include "worker/device_selection.h"
#include "worker/recovery.h"
#include "worker/rpc_fault_injector.h"
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

absl::Status WorkerDaemon::LoadTestSet() {
  const ModelSection& model = options_.spec.model;
  if (model.type == ModelType::kTorch) return absl::OkStatus();  // the script evaluates
  if (model.type == ModelType::kCtr) {
    PS_ASSIGN_OR_RETURN(
        ctr_test_, LoadCriteoFiles(data_.test, model.dense_features, model.categorical_features));
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(test_,
                      LoadIdxDataset(data_.test_images, data_.test_labels, model.layers.front(),
                                     static_cast<int>(model.layers.back())));
  return absl::OkStatus();
}

absl::Status WorkerDaemon::LoadTrainingData() {
  const ClusterSpec& spec = options_.spec;
  const std::string device = options_.device.empty() ? spec.worker.device : options_.device;
  if (spec.model.type == ModelType::kCtr) {
    PS_ASSIGN_OR_RETURN(ctr_train_, LoadCriteoFiles(data_.train, spec.model.dense_features,
                                                    spec.model.categorical_features));
    spdlog::info("loaded {} training examples from {} file(s)", ctr_train_.example_count,
                 data_.train.size());
    PS_ASSIGN_OR_RETURN(
        ctr_compute_, CreateCtrCompute(device,
                                       {spec.model.dense_features, spec.model.categorical_features,
                                        spec.model.embedding_dim, spec.model.layers},
                                       SystemGpus()));
  } else {
    PS_ASSIGN_OR_RETURN(
        train_, LoadIdxDataset(data_.train_images, data_.train_labels, spec.model.layers.front(),
                               static_cast<int>(spec.model.layers.back())));
    // And the device: a worker told to use a GPU it cannot have says so before joining.
    PS_ASSIGN_OR_RETURN(backend_,
                        CreateComputeBackend(device, MlpLayout(spec.model.layers), SystemGpus()));
  }
  return absl::OkStatus();
}

}  // namespace paramserver
