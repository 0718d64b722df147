#include "common/ops/termination_signal.h"

#include <pthread.h>
#include <signal.h>

#include <thread>

#include "spdlog/spdlog.h"

namespace paramserver {

void CallOnTerminationSignal(std::function<void()> on_signal) {
  // A process started in the background by a non-interactive shell begins with SIGINT
  // ignored, and an ignored signal never reaches sigwait: restore the default first.
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals, on_signal = std::move(on_signal)]() {
    int received = 0;
    if (sigwait(&signals, &received) == 0) {
      spdlog::info("received {}, shutting down", received == SIGTERM ? "SIGTERM" : "SIGINT");
      on_signal();
    }
  }).detach();
}

}  // namespace paramserver
