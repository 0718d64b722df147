#include "scheduler/map_wait_list.h"

#include <utility>
#include <vector>

namespace paramserver {
namespace {

// The longest the answering thread sleeps with nothing held (it wakes sooner for any
// Hold, Published or Close that concerns it).
constexpr absl::Duration kIdleWake = absl::Seconds(1);

}  // namespace

MapWaitList::MapWaitList(int max_held, int64_t published_epoch)
    : max_held_(max_held), published_epoch_(published_epoch), answerer_([this] { AnswerLoop(); }) {}

MapWaitList::~MapWaitList() {
  Close();
  answerer_.join();
}

bool MapWaitList::Hold(int64_t epoch_above, absl::Time deadline, Answer answer) {
  absl::MutexLock lock(&mu_);
  if (closed_ || epoch_above < published_epoch_ || deadline <= absl::Now() ||
      static_cast<int>(held_.size()) >= max_held_) {
    return false;
  }
  auto held = held_.emplace(deadline, Waiting{epoch_above, std::move(answer)});
  // The thread sleeps until the earliest deadline: a new earliest one wakes it.
  if (held == held_.begin()) woken_ = true;
  return true;
}

void MapWaitList::Published(int64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (epoch <= published_epoch_) return;
  published_epoch_ = epoch;
  if (!held_.empty()) woken_ = true;
}

void MapWaitList::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  woken_ = true;
  // Answers finish a call each (no wait of their own): a few milliseconds for thousands.
  auto all_answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return held_.empty() && answering_ == 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&all_answered), absl::Now() + absl::Seconds(30));
}

int MapWaitList::held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(held_.size());
}

void MapWaitList::AnswerLoop() {
  while (true) {
    std::vector<std::pair<Answer, Outcome>> due;
    {
      absl::MutexLock lock(&mu_);
      while (due.empty()) {
        // A publication or Close may have made any held answer due: look at all of
        // them. Otherwise only deadlines have passed, and those are at the front.
        if (woken_) {
          woken_ = false;
          for (auto it = held_.begin(); it != held_.end();) {
            if (closed_ || it->second.epoch_above < published_epoch_) {
              due.emplace_back(std::move(it->second.answer),
                               closed_ ? Outcome::kClosed : Outcome::kNewMap);
              it = held_.erase(it);
            } else {
              ++it;
            }
          }
        }
        const absl::Time now = absl::Now();
        while (!held_.empty() && held_.begin()->first <= now) {
          due.emplace_back(std::move(held_.begin()->second.answer), Outcome::kDeadline);
          held_.erase(held_.begin());
        }
        if (!due.empty()) break;
        if (closed_) return;  // and nothing held: Hold refuses once closed
        const absl::Time wake = held_.empty() ? now + kIdleWake : held_.begin()->first;
        mu_.AwaitWithDeadline(absl::Condition(&woken_), wake);
      }
      answering_ = static_cast<int>(due.size());
    }
    for (auto& [answer, outcome] : due) answer(outcome);  // no lock held
    absl::MutexLock lock(&mu_);
    answering_ = 0;
  }
}

}  // namespace paramserver
