#include "ps/shard_log.h"

#include <utility>

namespace paramserver {

void ShardLog::Record(ShardMutation mutation, std::vector<ShardMutation>* handed_back) {
  mutation.index = ++index_;
  if (handed_back == nullptr) return;
  if (sink_ != nullptr) {
    sink_->Append(std::move(mutation));
  } else if (hand_back_) {
    handed_back->push_back(std::move(mutation));
  }
}

}  // namespace paramserver
