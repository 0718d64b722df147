// The scheduler's long poll for a new shard map (GetClusterViewRequest's
// wait_for_epoch_above and wait_ms): its bound, which both ends of the call know.
#ifndef PARAMSERVER_COMMON_RPC_MAP_WAIT_H_
#define PARAMSERVER_COMMON_RPC_MAP_WAIT_H_

namespace paramserver {

// The longest one GetClusterView call may wait for a map change. Short enough that a
// scheduler shutting down (which gives its calls 1 s) is not held up by the waits;
// a node that wants to wait longer calls again.
inline constexpr int kMaxMapWaitMs = 1000;

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_RPC_MAP_WAIT_H_
