#include "common/model/optimizer_groups.h"

#include "catch2/catch.hpp"
#include "common/model/mlp_parameters.h"

namespace paramserver {
namespace {

// fc1.weight [4, 3] at 0, fc1.bias [4] at 12, fc2.weight [2, 4] at 16, fc2.bias [2] at 24.
const MlpLayout kLayout({3, 4, 2});

DenseOptimizerOptions WithGroups(const std::string& groups) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\nmodel: {layers: [3, 4, 2]}\ntraining:\n  optimizer: "
      "{type: sgd, learning_rate: 0.1, momentum: 0.9, weight_decay: 0.01, groups: " +
          groups + "}\n",
      "job.yaml");
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return spec->training.optimizer;
}

TEST_CASE("groups take their tensors by pattern; the rest keep the optimizer's settings") {
  const DenseOptimizerOptions options = WithGroups(
      "[{params: ['*.bias'], weight_decay: 0.0}, {params: [fc2.weight], "
      "learning_rate: 0.01, momentum: 0}]");
  REQUIRE(options.groups.size() == 2);
  CHECK(options.groups[0].options.learning_rate == 0.1);  // inherited
  CHECK(options.groups[0].options.weight_decay == 0.0);
  CHECK(options.groups[1].options.momentum == 0);
  absl::StatusOr<std::vector<OptimizerSegment>> segments =
      OptimizerSegments(options, kLayout.model());
  REQUIRE(segments.ok());
  // fc1.weight (own), fc1.bias (0), fc2.weight (1), fc2.bias (0): no two adjacent alike.
  REQUIRE(segments->size() == 4);
  CHECK((*segments)[0].group == -1);
  CHECK((*segments)[0].end == 12);
  CHECK((*segments)[0].options.weight_decay == 0.01);
  CHECK((*segments)[1].group == 0);
  CHECK((*segments)[1].begin == 12);
  CHECK((*segments)[2].group == 1);
  CHECK((*segments)[2].options.learning_rate == 0.01);
  CHECK((*segments)[3].group == 0);
  CHECK((*segments)[3].end == 26);
  // A shard's part: [10, 20) sees fc1.weight's last 2, fc1.bias, fc2.weight's first 4.
  const std::vector<OptimizerSegment> within = SegmentsWithin(*segments, {10, 20});
  REQUIRE(within.size() == 3);
  CHECK(within[0].begin == 0);
  CHECK(within[0].end == 2);
  CHECK(within[1].end == 6);
  CHECK(within[2].begin == 6);
  CHECK(within[2].end == 10);
}

TEST_CASE("adjacent tensors of one group are one run") {
  const DenseOptimizerOptions options = WithGroups("[{params: ['fc1.*'], weight_decay: 0.0}]");
  absl::StatusOr<std::vector<OptimizerSegment>> segments =
      OptimizerSegments(options, kLayout.model());
  REQUIRE(segments.ok());
  REQUIRE(segments->size() == 2);
  CHECK((*segments)[0].end == 16);
  CHECK((*segments)[1].group == -1);
}

TEST_CASE("a pattern that matches nothing, or a tensor two groups claim, is refused naming both") {
  absl::Status nothing =
      OptimizerSegments(WithGroups("[{params: ['*.bias', '*norm*'], weight_decay: 0.0}]"),
                        kLayout.model())
          .status();
  CHECK(nothing.message() ==
        "training.optimizer.groups: group 0's pattern '*norm*' matches no tensor of the model "
        "(its tensors: fc1.weight, fc1.bias, fc2.weight, fc2.bias)");
  absl::Status twice = OptimizerSegments(WithGroups("[{params: ['*.bias']}, {params: ['fc2.*'], "
                                                    "learning_rate: 0.5}]"),
                                         kLayout.model())
                           .status();
  CHECK(twice.message() ==
        "training.optimizer.groups: tensor 'fc2.bias' is claimed by group 0 ('*.bias') and group "
        "1 ('fc2.*'): a tensor may be in one group only");
}

TEST_CASE("a group without momentum under a nesterov optimizer is torch's: no buffer, no error") {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\ntraining:\n  optimizer: {type: sgd, learning_rate: 0.1, "
      "momentum: 0.9, nesterov: true, groups: [{params: ['*.bias'], momentum: 0}]}\n",
      "job.yaml");
  REQUIRE(spec.ok());
  CHECK_FALSE(spec->training.optimizer.groups[0].options.nesterov);
  CHECK(spec->training.optimizer.nesterov);
}

TEST_CASE("a group's keys are its optimizer type's, checked as the optimizer's are") {
  auto error = [](const std::string& groups) {
    absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
        "cluster: {scheduler: 'h:1'}\ntraining:\n  optimizer: {type: adam, groups: " + groups +
            "}\n",
        "job.yaml");
    REQUIRE_FALSE(spec.ok());
    return std::string(spec.status().message());
  };
  CHECK(error("[{params: ['*.bias'], momentum: 0.9}]") ==
        "job.yaml:3: training.optimizer.groups[0].momentum: is not a setting of adam (it is one "
        "of sgd, rmsprop)");
  CHECK(error("[{weight_decay: 0.0}]").find("training.optimizer.groups[0].params: must list") !=
        std::string::npos);
  CHECK(error("[{params: ['*.bias'], beta1: 2}]")
            .find("training.optimizer.groups[0].beta1: must be in [0, 1)") != std::string::npos);
  CHECK(error("[{params: ['*.bias'], type: sgd}]")
            .find("training.optimizer.groups[0].type: unknown key") != std::string::npos);
  CHECK(error("{params: ['*.bias']}").find("training.optimizer.groups: must be a list") !=
        std::string::npos);
  CHECK(error("[{params: ['*.bias'], learning_rate: 0.0001}], lr_schedule: {decay: cosine, "
              "total_steps: 10, min_learning_rate: 0.0005}") ==
        "job.yaml:3: training.optimizer.groups[0].learning_rate: is below "
        "lr_schedule.min_learning_rate (0.0005): the cosine decay would raise this group's rate");
}

TEST_CASE("buffers are runs of their own, by kind, and no pattern claims them") {
  absl::StatusOr<ModelLayout> layout =
      ModelLayout::Create({{"fc.weight", {2, 3}},
                           {"fc.bias", {2}},
                           {"bn.running_mean", {2}, DenseTensorKind::kFloatBuffer},
                           {"bn.running_var", {2}, DenseTensorKind::kFloatBuffer},
                           {"bn.num_batches_tracked", {1}, DenseTensorKind::kIntegerBuffer}});
  REQUIRE(layout.ok());
  CHECK(layout->trained_parameters() == 8);
  CHECK(layout->dense_parameters() == 13);
  DenseOptimizerOptions options = WithGroups("[{params: ['*'], learning_rate: 0.5}]");
  absl::StatusOr<std::vector<OptimizerSegment>> segments = OptimizerSegments(options, *layout);
  REQUIRE(segments.ok());
  REQUIRE(segments->size() == 3);
  CHECK((*segments)[0].group == 0);  // '*' takes every parameter, no buffer
  CHECK((*segments)[0].end == 8);
  CHECK((*segments)[1].kind == DenseTensorKind::kFloatBuffer);
  CHECK((*segments)[1].begin == 8);
  CHECK((*segments)[1].end == 12);
  CHECK((*segments)[2].kind == DenseTensorKind::kIntegerBuffer);
  CHECK(DenseOptimizerSlotNames((*segments)[1].options).empty());
  // A pattern that only a buffer's name matches matches no parameter.
  options = WithGroups("[{params: ['bn.*'], learning_rate: 0.5}]");
  segments = OptimizerSegments(options, *layout);
  REQUIRE_FALSE(segments.ok());
  CHECK_THAT(std::string(segments.status().message()),
             Catch::Contains("pattern 'bn.*' matches no tensor of the model (its tensors: "
                             "fc.weight, fc.bias)"));
}

}  // namespace
}  // namespace paramserver
