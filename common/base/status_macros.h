// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status, which Debian's Abseil
// (20220623) does not ship.
#ifndef PARAMSERVER_COMMON_BASE_STATUS_MACROS_H_
#define PARAMSERVER_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define PS_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status ps_status_internal_ = (expr); \
    if (!ps_status_internal_.ok()) {             \
      return ps_status_internal_;                \
    }                                            \
  } while (false)

#define PS_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define PS_STATUS_MACROS_CONCAT_(a, b) PS_STATUS_MACROS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, otherwise
// moves the value into `lhs` (a declaration such as `auto x` or an existing variable).
#define PS_ASSIGN_OR_RETURN(lhs, rexpr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_STATUS_MACROS_CONCAT_(ps_statusor_, __LINE__), lhs, rexpr)

#define PS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) {                                 \
    return std::move(statusor).status();                \
  }                                                     \
  lhs = std::move(statusor).value()

#endif  // PARAMSERVER_COMMON_BASE_STATUS_MACROS_H_
