// Protocol buffer messages as the JSON an operator's script wants: every field present,
// under its proto name (`seconds_since_heartbeat`), 64-bit integers as JSON numbers (not
// the strings of protobuf's canonical mapping), and enum values as the words the tables
// print (`NODE_HEALTH_ALIVE` -> "alive", `NODE_ROLE_WORKER` -> "worker"). Used by psctl's
// --json and the scheduler's /api/status, so both say what the tables say.
#ifndef PARAMSERVER_COMMON_OPS_PLAIN_JSON_H_
#define PARAMSERVER_COMMON_OPS_PLAIN_JSON_H_

#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace paramserver {

// The enum value's name without its type's prefix, in lower case: NodeHealth's
// NODE_HEALTH_SUSPECT -> "suspect". A value whose name lacks the prefix is lowered whole.
std::string EnumWord(const google::protobuf::EnumValueDescriptor& value);

// `message` as JSON. `indent`: two spaces per level and one field per line; otherwise
// one line. Integers of up to 2^53 in magnitude keep every digit in a JavaScript
// reader; the counters we print stay far below that. Non-finite doubles become null.
std::string PlainJson(const google::protobuf::Message& message, bool indent);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_OPS_PLAIN_JSON_H_
