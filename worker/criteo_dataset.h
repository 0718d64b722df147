// Reading click-through-rate data in Criteo's text format (the Kaggle/Terabyte `day_N`
// files), gzip'd or not: one example per line, tab-separated,
//   label \t I1 .. I<dense> \t C1 .. C<categorical>
// with label 0 or 1, each I an integer (or empty: missing) and each C Criteo's 8 hex
// digits (or empty: missing).
//
// What the model sees: dense feature j is log(1 + max(x, 0)), 0 when missing; categorical
// field k is the unsigned value of its hex digits, the row id in table C<k+1>, or no row
// (an empty bag) when missing. A malformed line is an error naming the file, the line
// and the field; nothing is skipped.
#ifndef PARAMSERVER_WORKER_CRITEO_DATASET_H_
#define PARAMSERVER_WORKER_CRITEO_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace paramserver {

// The id of a missing categorical value: no row (ids are 32-bit, so this is never one).
inline constexpr int64_t kMissingId = -1;

// Examples stored row-major: example i's dense features are
// dense[i * dense_features, (i + 1) * dense_features), its ids
// ids[i * categorical_features, (i + 1) * categorical_features).
struct CtrDataset {
  int dense_features = 0;
  int categorical_features = 0;
  int64_t example_count = 0;
  std::vector<float> labels;  // 0 or 1
  std::vector<float> dense;
  std::vector<int64_t> ids;  // in [0, 2^32), or kMissingId
};

// Appends one line's example (without its newline) to `dataset`. INVALID_ARGUMENT
// "FIELD: WHAT" (the field as Criteo names it: label, I3, C17) on a malformed line: the
// wrong number of fields, a label other than 0 or 1, a dense value that is not an
// integer, a categorical value that is not 1 to 8 hex digits. `dataset` is unchanged then.
absl::Status ParseCriteoLine(absl::string_view line, CtrDataset* dataset);

// Reads every line of every file in `paths` (each gzip'd or plain), in order, with
// `dense_features` and `categorical_features` per line. Errors name the file and line:
// "train.tsv.gz:1042: C7: 'xyz' is not 1 to 8 hex digits"; NOT_FOUND for a file that
// cannot be opened; INVALID_ARGUMENT for a corrupt gzip stream or an empty file.
absl::StatusOr<CtrDataset> LoadCriteoFiles(const std::vector<std::string>& paths,
                                           int dense_features, int categorical_features);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CRITEO_DATASET_H_
