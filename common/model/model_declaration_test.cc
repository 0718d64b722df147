#include "common/model/model_declaration.h"

#include <string>

#include "catch2/catch.hpp"
#include "common/rpc/rpc_endpoints.h"

namespace paramserver {
namespace {

ModelDeclaration Cnn() {
  ModelDeclaration model;
  TensorDeclaration* conv = model.add_tensors();
  conv->set_name("conv.weight");
  for (int64_t d : {8, 1, 3, 3}) conv->add_shape(d);
  TensorDeclaration* bias = model.add_tensors();
  bias->set_name("conv.bias");
  bias->add_shape(8);
  TableDeclaration* table = model.add_tables();
  table->set_name("items");
  table->set_dim(16);
  return model;
}

std::string ErrorOf(const ModelDeclaration& model) {
  return std::string(LayoutOfDeclaration(model).status().message());
}

TEST_CASE("a declaration at every cap is valid and fits the scheduler's message limit") {
  DeclareModelRequest request;
  request.set_node_name("worker-123456");
  ModelDeclaration* model = request.mutable_model();
  for (int i = 0; i < kMaxDeclaredTensors; ++i) {
    TensorDeclaration* tensor = model->add_tensors();
    std::string name = "t" + std::to_string(i);
    tensor->set_name(name + std::string(kMaxDeclaredNameBytes - name.size(), 'x'));
    // 8 dimensions whose product stays within the parameter cap, each a long varint.
    for (int d = 0; d < kMaxDeclaredRank - 1; ++d) tensor->add_shape(1);
    tensor->add_shape(kMaxDeclaredParameters / kMaxDeclaredTensors);
  }
  for (int i = 0; i < kMaxDeclaredTables; ++i) {
    TableDeclaration* table = model->add_tables();
    std::string name = "e" + std::to_string(i);
    table->set_name(name + std::string(kMaxDeclaredNameBytes - name.size(), 'x'));
    table->set_dim(kMaxDeclaredTableDim);
  }
  REQUIRE(LayoutOfDeclaration(*model).ok());
  INFO(request.ByteSizeLong() << " bytes");
  CHECK(request.ByteSizeLong() < size_t{kMaxSchedulerMessageBytes} * 7 / 8);
  model->add_tensors()->set_name("one too many");
  model->mutable_tensors(kMaxDeclaredTensors)->add_shape(1);
  CHECK(ErrorOf(*model) == "the model declares 8193 tensors; at most 8192");
}

TEST_CASE("a declaration becomes a layout, tensors back to back in order, and back") {
  absl::StatusOr<ModelLayout> layout = LayoutOfDeclaration(Cnn());
  REQUIRE(layout.ok());
  REQUIRE(layout->dense_tensors().size() == 2);
  CHECK(layout->dense_tensors()[1].offset == 72);
  CHECK(layout->dense_parameters() == 80);
  REQUIRE(layout->embedding_tables().size() == 1);
  CHECK(layout->embedding_tables()[0].dim == 16);
  CHECK(DeclarationOf(*layout).SerializeAsString() == Cnn().SerializeAsString());
}

TEST_CASE("a malformed declaration is refused, naming the tensor") {
  ModelDeclaration zero = Cnn();
  zero.mutable_tensors(1)->set_shape(0, 0);
  CHECK(ErrorOf(zero) ==
        "tensor 'conv.bias' has shape [0]: every dimension must be >= 1 and the size at most 2^36");
  ModelDeclaration huge = Cnn();
  huge.mutable_tensors(0)->set_shape(0, int64_t{1} << 40);
  CHECK(ErrorOf(huge).find("tensor 'conv.weight' has shape [1099511627776, 1, 3, 3]") == 0);
  ModelDeclaration repeated = Cnn();
  repeated.mutable_tensors(1)->set_name("conv.weight");
  CHECK(ErrorOf(repeated) == "the model's tensor name 'conv.weight' is empty or repeated");
  ModelDeclaration deep = Cnn();
  for (int i = 0; i < 8; ++i) deep.mutable_tensors(1)->add_shape(1);
  CHECK(ErrorOf(deep) == "tensor 'conv.bias' has 9 dimensions; at most 8");
  ModelDeclaration table = Cnn();
  table.mutable_tables(0)->set_dim(0);
  CHECK(ErrorOf(table) == "embedding table 'items' has dim 0; it must be in [1, 65536]");
  CHECK(ErrorOf(ModelDeclaration()) == "the model declares no tensors and no embedding tables");
  ModelDeclaration long_name = Cnn();
  long_name.mutable_tensors(0)->set_name(std::string(300, 'x'));
  CHECK(ErrorOf(long_name).find("names are at most 256 bytes") != std::string::npos);
}

TEST_CASE("CheckSameModel names the first tensor or table that differs") {
  const ModelDeclaration job = Cnn();
  CHECK(CheckSameModel(job, Cnn(), "worker-0").ok());
  ModelDeclaration shape = Cnn();
  shape.mutable_tensors(0)->set_shape(0, 16);
  const absl::Status differs = CheckSameModel(job, shape, "worker-0");
  CHECK(differs.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(differs.message() ==
        "tensor 'conv.weight' has shape [16, 1, 3, 3] here but [8, 1, 3, 3] in the job's model "
        "(declared by worker-0)");
  ModelDeclaration renamed = Cnn();
  renamed.mutable_tensors(1)->set_name("conv.b");
  CHECK(CheckSameModel(job, renamed, "worker-1").message() ==
        "parameter 1 is tensor 'conv.b' here but 'conv.bias' in the job's model (declared by "
        "worker-1)");
  ModelDeclaration fewer = Cnn();
  fewer.mutable_tensors()->RemoveLast();
  CHECK(CheckSameModel(job, fewer, "worker-0").message() ==
        "tensor 'conv.bias' of the job's model (declared by worker-0) is missing here (1 "
        "tensors)");
  ModelDeclaration more = Cnn();
  more.add_tensors()->set_name("extra");
  CHECK(CheckSameModel(job, more, "worker-0").message() ==
        "tensor 'extra' (parameter 2 here) is not in the job's model (declared by worker-0), "
        "which has 2 tensors");
  ModelDeclaration dim = Cnn();
  dim.mutable_tables(0)->set_dim(8);
  CHECK(CheckSameModel(job, dim, "worker-0").message() ==
        "embedding table 0 is 'items' of dim 8 here but 'items' of dim 16 in the job's model "
        "(declared by worker-0)");
}

}  // namespace
TEST_CASE("a table's own settings travel in the declaration, checked, and must match") {
  ModelDeclaration model = Cnn();
  TableDeclaration* table = model.mutable_tables(0);
  table->set_max_rows(5000);
  table->set_min_count(2);
  EmbeddingOptimizerSettings* optimizer = table->mutable_optimizer();
  optimizer->set_type("ftrl");
  optimizer->set_learning_rate(0.1);
  optimizer->set_learning_rate_power(-0.5);
  optimizer->set_l1(0.01);
  optimizer->set_epsilon(1e-7);
  absl::StatusOr<ModelLayout> layout = LayoutOfDeclaration(model);
  REQUIRE(layout.ok());
  const EmbeddingTableSettings& settings = layout->embedding_tables()[0].settings;
  CHECK(*settings.max_rows == 5000);
  CHECK(*settings.min_count == 2);
  REQUIRE(settings.optimizer.has_value());
  CHECK(settings.optimizer->type == EmbeddingOptimizerType::kFtrl);
  CHECK(settings.optimizer->l1 == 0.01);
  // Back to the same declaration; a table without settings keeps none.
  CHECK(DeclarationOf(*layout).SerializeAsString() == model.SerializeAsString());
  CHECK_FALSE(DeclarationOf(*LayoutOfDeclaration(Cnn())).tables(0).has_optimizer());

  // A peer's settings are checked before anything trusts them, naming table and key.
  ModelDeclaration bad = model;
  bad.mutable_tables(0)->mutable_optimizer()->set_type("lion");
  CHECK(ErrorOf(bad) ==
        "embedding table 'items': optimizer.type: embedding optimizer 'lion': one of adam, "
        "adagrad, sgd, rowwise_adagrad, ftrl");
  bad = model;
  bad.mutable_tables(0)->mutable_optimizer()->set_learning_rate(0);
  CHECK(ErrorOf(bad) ==
        "embedding table 'items': optimizer.learning_rate: must be a positive number (in "
        "float32's range)");
  bad = model;
  bad.mutable_tables(0)->set_min_count(0);
  CHECK(ErrorOf(bad) ==
        "embedding table 'items': min_count: must be in [1, 10^6] (1: a row at "
        "the first sighting)");
  bad = model;
  bad.mutable_tables(0)->set_max_rows(-3);
  CHECK(ErrorOf(bad) == "embedding table 'items': max_rows: must be in [0, 2^40] (0: no bound)");

  // A second worker's table must have the job's settings.
  ModelDeclaration other = model;
  other.mutable_tables(0)->mutable_optimizer()->set_l1(0.02);
  const absl::Status differs = CheckSameModel(model, other, "worker-0");
  CHECK(differs.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(differs.message()).find("embedding table 'items' has settings") == 0);
  CHECK(std::string(differs.message()).find("l1: 0.02") != std::string::npos);
  CHECK(std::string(differs.message()).find("in the job's model (declared by worker-0)") !=
        std::string::npos);
  CHECK(std::string(CheckSameModel(model, Cnn(), "worker-0").message())
            .find("here but max_rows: 5000") != std::string::npos);
  CHECK(std::string(CheckSameModel(Cnn(), model, "worker-0").message()).find("none (the spec's)") !=
        std::string::npos);
  CHECK(CheckSameModel(model, model, "worker-0").ok());
}

namespace {

TEST_CASE("a tensor's kind travels in the declaration and must match") {
  ModelDeclaration job;
  TensorDeclaration* weight = job.add_tensors();
  weight->set_name("fc.weight");
  weight->add_shape(4);
  TensorDeclaration* tracked = job.add_tensors();
  tracked->set_name("bn.num_batches_tracked");
  tracked->add_shape(1);
  tracked->set_kind(TENSOR_KIND_INTEGER_BUFFER);
  absl::StatusOr<ModelLayout> layout = LayoutOfDeclaration(job);
  REQUIRE(layout.ok());
  CHECK(layout->dense_tensors()[1].kind == DenseTensorKind::kIntegerBuffer);
  CHECK(layout->trained_parameters() == 4);
  CHECK(DeclarationOf(*layout).SerializeAsString() == job.SerializeAsString());

  ModelDeclaration mine = job;
  mine.mutable_tensors(1)->set_kind(TENSOR_KIND_FLOAT_BUFFER);
  const absl::Status differs = CheckSameModel(job, mine, "worker-0");
  CHECK(differs.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(differs.message()),
             Catch::Contains("tensor 'bn.num_batches_tracked' is a float32 buffer here but an "
                             "int64 buffer in the job's model (declared by worker-0)"));

  mine.mutable_tensors(1)->set_kind(static_cast<TensorKind>(7));
  CHECK_THAT(ErrorOf(mine), Catch::Contains("tensor 'bn.num_batches_tracked' has kind 7"));
  mine.mutable_tensors()->SwapElements(0, 1);
  mine.mutable_tensors(0)->set_kind(TENSOR_KIND_FLOAT_BUFFER);
  CHECK_THAT(ErrorOf(mine), Catch::Contains("parameter 'fc.weight' follows a buffer"));
}

}  // namespace
}  // namespace paramserver
