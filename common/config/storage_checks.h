// The spec's files checked when a daemon starts, not when it first needs them: a data
// file that cannot be read, or an output that cannot be written (a read-only folder
// under a sandboxed unit, a bucket the instance role may not write), is an error naming
// the spec key before any training, rather than a lost result at the end.
#ifndef PARAMSERVER_COMMON_CONFIG_STORAGE_CHECKS_H_
#define PARAMSERVER_COMMON_CONFIG_STORAGE_CHECKS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/cluster_spec.h"

namespace paramserver {

// OK if `path` (local, or an s3:// URI) can be opened for reading; otherwise
// FAILED_PRECONDITION "KEY: PATH cannot be read: WHY".
absl::Status CheckReadable(const std::string& key, const std::string& path);

// What a writable key names.
enum class OutputKind { kFile, kFolder };

// OK if a file can be written where `path` says: in the folder of a kFile, in the
// kFolder itself (made, with the folders above it, if missing). A probe file is written
// there and deleted. A full disk (or quota) is RESOURCE_EXHAUSTED: a passing state that
// the job may outlive (space freed), unlike the rest, FAILED_PRECONDITION "KEY: PATH
// cannot be written (checked at start, so that nothing is lost at the end): WHY" (a
// read-only folder, no permission, no such bucket).
absl::Status CheckWritable(const std::string& key, const std::string& path, OutputKind kind);

// Which of the spec's files a process uses.
enum class StorageUser {
  kScheduler,   // output.report
  kServer,      // checkpoint.dir
  kWorker,      // data.* and model.init_from
  kFinisher,    // a worker that may write output.weights (every worker: any may finish)
  kEverything,  // all of them, for `ps_scheduler --describe` (a launcher's first check)
};

// The checks above on every non-empty key `user` reads or writes: the first failure; a
// full disk is not one: its message goes to `warnings` if given, else to the log as a
// warning.
absl::Status CheckSpecStorage(const ClusterSpec& spec, StorageUser user,
                              std::vector<std::string>* warnings = nullptr);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CONFIG_STORAGE_CHECKS_H_
