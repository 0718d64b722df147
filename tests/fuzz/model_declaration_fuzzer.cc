// libFuzzer target: a worker's DeclareModel request (a user's model, model.type torch),
// which the scheduler validates and compares with the job's before it places anything.
#include <cstddef>
#include <cstdint>

#include "common/model/model_declaration.h"
#include "proto/scheduler.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  paramserver::DeclareModelRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const absl::StatusOr<paramserver::ModelLayout> layout =
      paramserver::LayoutOfDeclaration(request.model());
  if (layout.ok()) {
    // A valid declaration round-trips, and compares equal to itself.
    const paramserver::ModelDeclaration again = paramserver::DeclarationOf(*layout);
    if (!paramserver::CheckSameModel(again, request.model(), "worker-0").ok()) __builtin_trap();
  }
  (void)paramserver::CheckSameModel(paramserver::ModelDeclaration(), request.model(), "worker-0");
  return 0;
}
