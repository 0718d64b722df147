// ps_ctr_generate: writes Criteo-format train and test files from a planted model
// (tools/ctr_data.h) and prints the best AUC any model can expect on the test file.
//   ps_ctr_generate --out DIR [--seed N] [--train_examples N] [--test_examples N]
//                   [--vocabulary N] [--missing_rate R] [--zipf_exponent S]
// Writes DIR/train.tsv.gz and DIR/test.tsv.gz; prints one line:
//   train_examples=N test_examples=N test_positive_rate=0.xxxx best_test_auc=0.xxxx
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "common/config/command_line.h"
#include "tools/ctr_data.h"

ABSL_FLAG(std::string, out, "", "the folder to write train.tsv.gz and test.tsv.gz into");
ABSL_FLAG(uint64_t, seed, 1, "the same seed gives the same files");
ABSL_FLAG(int64_t, train_examples, 200000, "training examples");
ABSL_FLAG(int64_t, test_examples, 20000, "test examples");
ABSL_FLAG(int64_t, vocabulary, 100000, "distinct values per categorical field");
ABSL_FLAG(double, missing_rate, 0.05, "the share of values left empty, in both kinds of field");
ABSL_FLAG(double, zipf_exponent, 1.1,
          "how skewed the ids' frequencies are (smaller: flatter, more distinct ids)");

constexpr char kUsage[] =
    "writes click-through-rate data in Criteo's format (DIR/train.tsv.gz, "
    "DIR/test.tsv.gz) from a planted model and prints the best test AUC a model can expect."
    "\nusage: ps_ctr_generate --out DIR [--seed N] [--train_examples N] [flags]";

int main(int argc, char** argv) {
  paramserver::ParseCommandLineWithHelp(argc, argv, kUsage);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "ps_ctr_generate: --out DIR is required\n");
    return 2;
  }
  paramserver::CtrDataOptions options;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.train_examples = absl::GetFlag(FLAGS_train_examples);
  options.test_examples = absl::GetFlag(FLAGS_test_examples);
  options.vocabulary = absl::GetFlag(FLAGS_vocabulary);
  options.missing_rate = absl::GetFlag(FLAGS_missing_rate);
  options.zipf_exponent = absl::GetFlag(FLAGS_zipf_exponent);
  absl::StatusOr<paramserver::CtrDataSummary> summary =
      paramserver::WriteCtrData(options, out + "/train.tsv.gz", out + "/test.tsv.gz");
  if (!summary.ok()) {
    std::fprintf(stderr, "ps_ctr_generate: %s\n", std::string(summary.status().message()).c_str());
    return 1;
  }
  std::printf("train_examples=%lld test_examples=%lld test_positive_rate=%.4f best_test_auc=%.4f\n",
              static_cast<long long>(summary->train_examples),
              static_cast<long long>(summary->test_examples), summary->test_positive_rate,
              summary->best_test_auc);
  return 0;
}
