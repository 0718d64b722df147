// How a worker reads and updates the model: the whole flat parameter vector, spread
// over the shards of the shard map.
#ifndef PARAMSERVER_WORKER_PS_CLIENT_H_
#define PARAMSERVER_WORKER_PS_CLIENT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace paramserver {

class PsClient {
 public:
  virtual ~PsClient() = default;

  // Fills `params` (the whole flat vector) with every shard's values once the servers'
  // consistency rule lets this worker compute `step`. Blocks until then or the pull
  // deadline; the error names the shard and server that did not answer.
  virtual absl::Status PullAll(int64_t step, absl::Span<float> params) = 0;

  // Sends each shard its slice of `gradient` for `step` and returns once every shard
  // acknowledged (retrying a lost push is safe: the servers apply it once).
  virtual absl::Status PushAll(int64_t step, absl::Span<const float> gradient) = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_PS_CLIENT_H_
