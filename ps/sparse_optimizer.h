// The embedding tables' optimizers, applied one row at a time, as PyTorch applies its
// optimizers to a sparse gradient (an nn.EmbeddingBag(sparse=True) weight's): only the
// rows present in a step's gradient change, parameters and optimizer state alike.
//
//   adam     torch.optim.SparseAdam, operation for operation (not Adam: its moments decay
//            as old += (1-b)*(new-old), and epsilon is added to sqrt(v) before the bias
//            correction is folded into the step size);
//   adagrad  torch.optim.Adagrad on a sparse gradient (lr_decay 0, no weight decay,
//            initial accumulator 0);
//   sgd      plain SGD: p -= lr * g;
//   rowwise_adagrad  FBGEMM's and TorchRec's row-wise Adagrad (EXACT_ROWWISE_ADAGRAD):
//            one accumulator per row, a += mean over the row of g^2, then
//            p -= lr / (sqrt(a) + eps) * g;
//   ftrl     FTRL-Proximal as tf.keras.optimizers.Ftrl (TensorFlow's ApplyFtrl, no L2
//            shrinkage), per element: n' = n + g^2; z += g - (n'^-p - n^-p) / lr * w;
//            w = |z| <= l1 ? 0 : (sign(z) l1 - z) / ((beta + n'^-p) / lr + 2 l2); n = n',
//            p the learning_rate_power (<= 0); x^-p is sqrt(x) where p is -0.5 (the
//            default), as ApplyFtrl computes it, else powf(x, -p).
//
// `step` is the job's step, counted from 1, for every step of the job whether or not the
// row was in it: SparseAdam counts the optimizer's steps, and a table's parameter takes
// part in every one (an EmbeddingBag's sparse gradient is never None, only empty).
#ifndef PARAMSERVER_PS_SPARSE_OPTIMIZER_H_
#define PARAMSERVER_PS_SPARSE_OPTIMIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/config/cluster_spec.h"

namespace paramserver {

// EmbeddingOptimizerType and EmbeddingOptimizerOptions are the spec's
// (training.embedding_optimizer, common/config/cluster_spec.h).

// Optimizer state floats of a row of `dim` elements: adam 2 dim (first and second
// moments), adagrad dim (the sums of squares), sgd 0, rowwise_adagrad 1 (the row's
// accumulator), ftrl 2 dim (the accumulators n, then the linear terms z).
int StateFloatsPerRow(EmbeddingOptimizerType type, int dim);

// Sets a new row's state as its optimizer starts it: initial_accumulator_value for the
// rowwise_adagrad and ftrl accumulators, zeros for the rest.
void InitializeRowState(const EmbeddingOptimizerOptions& options, int dim, absl::Span<float> state);

// Applies one update to `row` with `gradient` (this step's summed or averaged row
// gradient), at job step `step` >= 1. `state` holds StateFloatsPerRow floats: for adam the
// first moments then the second moments; for adagrad the sums; for rowwise_adagrad the
// accumulator; for ftrl the accumulators then the linear terms.
// Every operation rounds in float32 in PyTorch's order (build with
// -ffp-contract=off): the result is what torch computes on a CPU without FMA.
// REQUIRES: gradient.size() == row.size(); state.size() as above; step >= 1.
void ApplyRowUpdate(const EmbeddingOptimizerOptions& options, int64_t step,
                    absl::Span<const float> gradient, absl::Span<float> row,
                    absl::Span<float> state);

// The same, with the step's scalars (SparseAdam's bias-corrected step size) computed
// once for all of a step's rows: PrepareRowUpdate, then ApplyRowUpdate per row. The
// results are the same to the bit.
struct RowUpdate {
  EmbeddingOptimizerType type = EmbeddingOptimizerType::kAdam;
  float one_minus_beta1 = 0;       // adam
  float one_minus_beta2 = 0;       // adam
  float eps = 0;                   // adam, adagrad
  float minus_step_size = 0;       // -lr (adagrad, sgd), or SparseAdam's -step_size
  float learning_rate = 0;         // rowwise_adagrad, ftrl
  float power = 0;                 // ftrl: -learning_rate_power
  bool ftrl_square_root = false;   // ftrl: power is 0.5, n^power is sqrt(n)
  float l1 = 0, l2 = 0, beta = 0;  // ftrl
};
RowUpdate PrepareRowUpdate(const EmbeddingOptimizerOptions& options, int64_t step);
void ApplyRowUpdate(const RowUpdate& update, absl::Span<const float> gradient,
                    absl::Span<float> row, absl::Span<float> state);

// ApplyRowUpdate(update, ...) for many rows at once, with the same results to the bit:
// row r's `dim` floats, followed by its StateFloatsPerRow(update.type, dim) state floats,
// start at slots[r], and its gradient is gradients[r * dim, (r + 1) * dim). A null
// slots[r] is skipped (its gradient is ignored). For speed (not part of the contract):
// vectorised on CPUs with AVX2 or AVX-512 (UsableCpuFeatures), rows read ahead.
// REQUIRES: gradients.size() == slots.size() * dim; no slot given twice.
void ApplyRowUpdates(const RowUpdate& update, int dim, absl::Span<float* const> slots,
                     absl::Span<const float> gradients);

// The first element of `gradient` that ApplyRowUpdate(update, gradient, row, state),
// called now, would let take the row's state or the row out of the accepted range
// (ps/optimizer_state_limit.h), or gradient.size() if none would; computed in
// ApplyRowUpdate's float arithmetic against `row` and `state`. Changes nothing.
//   adam     g*g (the second moment averages it) and the new first and second moments;
//   adagrad  g*g and the new sum, sum + g*g: near FLT_MAX a sum can overflow with a
//            gradient whose square alone is in range;
//   sgd      the new row value, row + (-lr)*g: SGD squares nothing and keeps no state,
//            but a gradient near FLT_MAX with a learning rate of 1 or more would make
//            the parameter itself Inf, and a row holding Inf turns every output it
//            feeds into Inf or NaN for good.
// The adam and adagrad row values move by at most about the learning rate per step
// (a ratio of the gradient to its own root mean square), so they need no check.
// REQUIRES: as ApplyRowUpdate.
size_t FirstUnsafeElement(const RowUpdate& update, absl::Span<const float> gradient,
                          absl::Span<const float> row, absl::Span<const float> state);

// FirstUnsafeElement's rule for many rows, fast: a push's check before its update reads
// every row it names, so the check costs what the update costs. Accepted(gradient, slot)
// is true exactly when FirstUnsafeElement(update, gradient, row, state) == dim, with the
// row's dim floats followed by its StateFloatsPerRow state floats at `slot` (as
// ApplyRowUpdates' slots). It has no early exit inside a row, so that the row vectorises
// (AVX2 or AVX-512, picked once, at construction, by UsableCpuFeatures()); call
// FirstUnsafeElement to learn which element of a refused row is the first. Immutable
// after construction, so thread-safe: one check may serve concurrent pushes.
class RowUpdateCheck {
 public:
  RowUpdateCheck(const RowUpdate& update, int dim);

  // REQUIRES: gradient holds dim floats, slot dim + StateFloatsPerRow(update.type, dim).
  bool Accepted(const float* gradient, const float* slot) const {
    return kernel_(update_, gradient, slot, dim_) == 0;
  }

 private:
  // Nonzero where a value the update would write is out of range.
  using Kernel = unsigned (*)(const RowUpdate&, const float*, const float*, size_t);
  RowUpdate update_;
  size_t dim_;
  Kernel kernel_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SPARSE_OPTIMIZER_H_
