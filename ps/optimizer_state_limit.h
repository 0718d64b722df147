// The range an optimizer's state must stay in for a push to be accepted: the rule every
// update rule (ps/adam_optimizer.h, ps/sparse_optimizer.h) applies to what a gradient
// would make of its state before the shard takes the gradient.
//
// Finite is not enough: a finite gradient of 1e20 has a square of 1e40, past float32's
// largest value (FLT_MAX, about 3.4e38), and a second moment or sum of squares holding
// +Inf turns every later update into 0 for good. So each optimizer computes, with its
// own float arithmetic and against its present state, every value the update would
// write (and the gradient's square, where it keeps an average or a sum of squares), and
// the push is refused unless each one is at most kLargestAcceptedStateValue in size.
//
// The limit sits 2^-10 below FLT_MAX, not at it, for sync mode: there a step applies
// the mean of the workers' pushes, each of which passed this rule on its own against
// the same state (nothing changes the state between a sync push and its step). The
// mean, summed in float in rank order and scaled by float(1/N), is at most the largest
// push times (1 + (N+1) 2^-24) in size, so its square and what it adds to a sum or an
// average exceed the largest accepted push's by at most (2N+4) 2^-24: within the
// headroom for any N up to 8190 workers. Checking each push therefore suffices; the
// mean needs no check of its own. (The same headroom covers Adam's average creeping
// past the largest accepted square by its own roundings.)
#ifndef PARAMSERVER_PS_OPTIMIZER_STATE_LIMIT_H_
#define PARAMSERVER_PS_OPTIMIZER_STATE_LIMIT_H_

#include <cfloat>
#include <cmath>

namespace paramserver {

inline constexpr float kLargestAcceptedStateValue = FLT_MAX - FLT_MAX / 1024;

// Whether `value` may be written into an optimizer's state or a parameter: finite, and
// at most kLargestAcceptedStateValue in size. False for NaN.
inline bool StateValueAccepted(float value) {
  return std::fabs(value) <= kLargestAcceptedStateValue;
}

// 1 where StateValueAccepted(value) is false, else 0: or-ed over a loop without a branch,
// so that the loop vectorises.
inline unsigned StateValueRejected(float value) { return StateValueAccepted(value) ? 0u : 1u; }

}  // namespace paramserver

#endif  // PARAMSERVER_PS_OPTIMIZER_STATE_LIMIT_H_
