// Turning SIGTERM / SIGINT into an orderly shutdown, for the daemons' mains.
#ifndef PARAMSERVER_COMMON_OPS_TERMINATION_SIGNAL_H_
#define PARAMSERVER_COMMON_OPS_TERMINATION_SIGNAL_H_

#include <functional>

namespace paramserver {

// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread it starts
// afterwards) and starts a detached thread that calls `on_signal` once, outside any
// signal handler, when either arrives. Call first thing in main, before other threads.
void CallOnTerminationSignal(std::function<void()> on_signal);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_OPS_TERMINATION_SIGNAL_H_
