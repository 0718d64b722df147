// Threads of the server's own for handlers that block, so that gRPC's callback threads
// never do: the data calls are registered through gRPC's callback API (the generated
// raw callback mixins), and a pull may wait for the other workers' pushes, bounded by its
// deadline. Each call is handed to a thread here, which finishes the call's reactor.
#ifndef PARAMSERVER_PS_CALL_EXECUTOR_H_
#define PARAMSERVER_PS_CALL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace paramserver {

// Thread-safe. Threads are started as tasks arrive and none is idle, up to
// `max_threads`, and kept for the next tasks; past that, tasks wait in order for a thread.
class CallExecutor {
 public:
  explicit CallExecutor(int max_threads);
  // Runs every task already given, then joins the threads. Tasks must not be given
  // after destruction began.
  ~CallExecutor();
  CallExecutor(const CallExecutor&) = delete;
  CallExecutor& operator=(const CallExecutor&) = delete;

  // Runs `task` on one of the executor's threads; returns at once.
  void Run(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

  int threads() const ABSL_LOCKS_EXCLUDED(mu_);
  // Of threads(), those waiting for a task.
  int idle_threads() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_threads_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_CALL_EXECUTOR_H_
