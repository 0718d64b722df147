// paramserver._native: the C++ worker (worker/worker_daemon.h, ScriptTrainingLoop) as the
// Python package's one worker object. Tensors cross as NumPy arrays of float32 (values,
// gradients, rows) and int64 (row ids), C-contiguous, read and written in place; every
// call that may wait (joining, declaring, a step, finishing) releases the GIL. Errors
// become paramserver.Error (a RuntimeError) carrying the status's message, and its code
// name as `code`. See docs/PYTHON.md.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/model_layout.h"
#include "common/model/step_optimizer.h"
#include "common/ops/daemon_main.h"
#include "common/ops/logging.h"
#include "worker/script_launch.h"
#include "worker/worker_daemon.h"
#include "worker/worker_flags.h"
#include "yaml-cpp/yaml.h"

namespace py = pybind11;

namespace paramserver {
namespace {

PyObject* g_error_type = nullptr;  // paramserver._native.Error

// Raises paramserver.Error for `status`. REQUIRES: the GIL is held.
[[noreturn]] void Raise(const absl::Status& status) {
  py::object type = py::reinterpret_borrow<py::object>(g_error_type);
  py::object error = type(std::string(status.message()));
  error.attr("code") = absl::StatusCodeToString(status.code());
  PyErr_SetObject(g_error_type, error.ptr());
  throw py::error_already_set();
}

void RaiseIfError(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

// A C-contiguous array of `T`; ValueError naming `what` otherwise.
template <typename T>
absl::Span<T> SpanOf(py::array& array, const char* what, bool writable) {
  if (!array.dtype().is(py::dtype::of<T>())) {
    throw py::value_error(absl::StrCat(what, " must be ",
                                       py::str(py::dtype::of<T>()).cast<std::string>(), ", got ",
                                       py::str(array.dtype()).cast<std::string>()));
  }
  if ((array.flags() & py::array::c_style) == 0) {
    throw py::value_error(absl::StrCat(what, " must be C-contiguous"));
  }
  if (writable && !array.writeable()) throw py::value_error(absl::StrCat(what, " is read-only"));
  return absl::Span<T>(static_cast<T*>(array.mutable_data()), static_cast<size_t>(array.size()));
}

// A YAML node as Python values: mappings as dicts, sequences as lists, scalars as int,
// float, bool, None or str, whichever they read as.
py::object PythonValueOf(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      py::dict dict;
      for (const auto& entry : node)
        dict[py::str(entry.first.Scalar())] = PythonValueOf(entry.second);
      return std::move(dict);
    }
    case YAML::NodeType::Sequence: {
      py::list list;
      for (const YAML::Node& item : node) list.append(PythonValueOf(item));
      return std::move(list);
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return py::str(text);  // quoted: a string whatever it reads as
      int64_t integer;
      double real;
      bool flag;
      if (YAML::convert<int64_t>::decode(node, integer)) return py::int_(integer);
      if (YAML::convert<double>::decode(node, real)) return py::float_(real);
      if (YAML::convert<bool>::decode(node, flag)) return py::bool_(flag);
      return py::str(text);
    }
    default:
      return py::none();
  }
}

// The ps_worker flags a launcher passed (kWorkerArgsEnv), parsed as ps_worker parsed
// them. INVALID_ARGUMENT for one ps_worker does not take (set by hand).
absl::Status ParseWorkerFlags() {
  std::vector<std::string> args = {"paramserver"};
  if (const char* given = std::getenv(kWorkerArgsEnv); given != nullptr && *given != '\0') {
    for (absl::string_view arg : absl::StrSplit(given, kWorkerArgsSeparator)) {
      const absl::string_view name = arg.substr(0, arg.find('='));
      if (name.size() < 3 || name.substr(0, 2) != "--" ||
          absl::FindCommandLineFlag(name.substr(2)) == nullptr) {
        // A flag's value after a space is its own argument: accepted if it follows a flag.
        if (args.size() > 1 && args.back().find('=') == std::string::npos &&
            args.back().rfind("--", 0) == 0) {
          args.emplace_back(arg);
          continue;
        }
        return absl::InvalidArgumentError(
            absl::StrCat(kWorkerArgsEnv, ": '", arg, "' is not a ps_worker flag"));
      }
      args.emplace_back(arg);
    }
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  return absl::OkStatus();
}

class NativeWorker {
 public:
  // Joins the job this process was started for (kConfigEnv, kWorkerArgsEnv).
  static std::unique_ptr<NativeWorker> Join() {
    static bool joined = false;
    if (joined) {
      Raise(absl::FailedPreconditionError(
          "paramserver.init() was called already: one process is one worker of one job"));
    }
    const char* config = std::getenv(kConfigEnv);
    if (config == nullptr || *config == '\0') {
      Raise(absl::FailedPreconditionError(
          absl::StrCat("this script was not started for a job: ", kConfigEnv,
                       " is not set. Run it through ps_worker (deploy/local/run.sh job.yaml, with "
                       "model.type: torch and worker.command in the spec), or set ",
                       kConfigEnv, "=job.yaml to join a running job by hand (docs/PYTHON.md)")));
    }
    RaiseIfError(ParseWorkerFlags());
    absl::StatusOr<ClusterSpec> spec = LoadDaemonSpec(config);
    RaiseIfError(spec.status());
    if (spec->model.type != ModelType::kTorch) {
      Raise(absl::FailedPreconditionError(absl::StrCat(
          config, ": model.type is ", ModelTypeName(spec->model.type),
          ": ps_worker trains that model itself; a script joins a job of model.type torch")));
    }
    joined = true;
    const DenseOptimizerOptions spec_optimizer = spec->training.optimizer;
    const EmbeddingOptimizerOptions spec_table_optimizer = spec->training.embedding_optimizer;
    SetLogNodeName(ProvisionalNodeName("worker"));
    absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon;
    {
      py::gil_scoped_release release;
      daemon = WorkerDaemon::Create(WorkerOptionsFromFlags(*std::move(spec)));
    }
    RaiseIfError(daemon.status());
    return std::unique_ptr<NativeWorker>(
        new NativeWorker(config, *std::move(daemon), spec_optimizer, spec_table_optimizer));
  }

  int rank() const { return daemon_->rank(); }
  int num_workers() const { return daemon_->num_workers(); }
  const std::string& node_name() const { return daemon_->node_name(); }
  const std::string& config_path() const { return config_path_; }

  py::object Config() const {
    try {
      return PythonValueOf(YAML::LoadFile(config_path_));
    } catch (const YAML::Exception& e) {
      Raise(absl::InvalidArgumentError(absl::StrCat(config_path_, ": ", e.what())));
    }
  }

  // A paramserver.Embedding's own settings (None: the spec's): `optimizer` a mapping's
  // YAML or JSON text, read over training.embedding_optimizer as model.tables reads it.
  // ValueError naming the table and the key for one out of range.
  EmbeddingTableSettings TableSettings(const std::string& name,
                                       const std::optional<std::string>& optimizer,
                                       std::optional<int64_t> max_rows,
                                       std::optional<int64_t> min_count) const {
    const auto refuse = [&](absl::string_view problem) {
      throw py::value_error(absl::StrCat("paramserver.Embedding '", name, "': ", problem));
    };
    EmbeddingTableSettings settings;
    settings.max_rows = max_rows;
    if (min_count.has_value()) {
      // Past int's range: out of [1, 10^6] all the same, as the check below says.
      settings.min_count =
          *min_count >= 0 && *min_count <= (int64_t{1} << 30) ? static_cast<int>(*min_count) : 0;
    }
    if (optimizer.has_value()) {
      absl::StatusOr<EmbeddingOptimizerOptions> parsed =
          ParseTableOptimizer(*optimizer, spec_table_optimizer_);
      if (!parsed.ok()) refuse(parsed.status().message());
      settings.optimizer = *std::move(parsed);
    }
    const std::optional<SettingProblem> problem = FindTableSettingsProblem(settings);
    if (problem.has_value()) refuse(absl::StrCat(problem->key, ": ", problem->problem));
    return settings;
  }

  void CheckTableSettings(const std::string& name, const std::optional<std::string>& optimizer,
                          std::optional<int64_t> max_rows, std::optional<int64_t> min_count) const {
    TableSettings(name, optimizer, max_rows, min_count);
  }

  // names[i] has shapes[i] and kinds[i] ("parameter", "float_buffer", "integer_buffer";
  // buffers after every parameter); tables are (name, dim, optimizer, max_rows,
  // min_count), the last three as TableSettings takes them.
  using DeclaredTable = std::tuple<std::string, int64_t, std::optional<std::string>,
                                   std::optional<int64_t>, std::optional<int64_t>>;
  void Declare(const std::vector<std::string>& names,
               const std::vector<std::vector<int64_t>>& shapes,
               const std::vector<std::string>& kinds, const std::vector<DeclaredTable>& tables,
               py::array initial) {
    if (names.size() != shapes.size() || names.size() != kinds.size())
      throw py::value_error("one shape and one kind per tensor name");
    std::vector<ModelLayout::DenseTensorSpec> dense;
    for (size_t i = 0; i < names.size(); ++i) {
      DenseTensorKind kind = DenseTensorKind::kParameter;
      if (kinds[i] == "float_buffer") {
        kind = DenseTensorKind::kFloatBuffer;
      } else if (kinds[i] == "integer_buffer") {
        kind = DenseTensorKind::kIntegerBuffer;
      } else if (kinds[i] != "parameter") {
        throw py::value_error(absl::StrCat("tensor '", names[i], "' has kind '", kinds[i], "'"));
      }
      dense.push_back({names[i], shapes[i], kind});
    }
    std::vector<EmbeddingTableSlot> slots;
    for (const auto& [name, dim, optimizer, max_rows, min_count] : tables) {
      slots.push_back({name, dim, TableSettings(name, optimizer, max_rows, min_count)});
    }
    absl::StatusOr<ModelLayout> layout = ModelLayout::Create(dense, std::move(slots));
    RaiseIfError(layout.status());
    const absl::Span<const float> values = SpanOf<float>(initial, "the initial values", false);
    absl::Status declared;
    {
      py::gil_scoped_release release;
      declared = daemon_->DeclareModel(*layout, values);
    }
    RaiseIfError(declared);
    for (const EmbeddingTableSlot& table : layout->embedding_tables())
      table_dims_.push_back(table.dim);
    layout_ = *std::move(layout);
  }

  void PullCurrent(py::array out) {
    const absl::Span<float> params = SpanOf<float>(out, "the parameter buffer", true);
    absl::Status pulled;
    ScriptTrainingLoop* const driven = loop();  // raises, with the GIL, if none
    {
      py::gil_scoped_release release;
      pulled = driven->PullCurrent(params);
    }
    RaiseIfError(pulled);
  }

  // The rows of table `table` for `ids` (int64, strictly increasing), as a new
  // (len(ids), dim) float32 array.
  py::array_t<float> PullRows(int table, py::array ids_array) {
    CheckTable(table);
    const absl::Span<int64_t> ids = SpanOf<int64_t>(ids_array, "the row ids", false);
    CheckIncreasing(ids);
    std::vector<std::vector<int64_t>> wanted(table_dims_.size());
    wanted[table].assign(ids.begin(), ids.end());
    std::vector<std::vector<float>> rows;
    absl::Status pulled;
    ScriptTrainingLoop* const driven = loop();  // raises, with the GIL, if none
    {
      py::gil_scoped_release release;
      pulled = driven->PullRows(wanted, &rows);
    }
    RaiseIfError(pulled);
    const int64_t dim = table_dims_[table];
    py::array_t<float> out({static_cast<int64_t>(ids.size()), dim});
    std::copy(rows[table].begin(), rows[table].end(), out.mutable_data());
    return out;
  }

  // tables: one (ids, row gradients) per table, or None for a table the step did not read.
  // optimizer: None (the spec's settings) or a step's settings, as SettingsOf reads them.
  // clip_grad_norm (> 0, sync): the servers clip the step's mean gradient to it.
  // skip: this worker skips the step (its loss scaler found the gradient not finite):
  // nothing of it is sent, every server skips it in sync mode, and `params` gets the next
  // step's values.
  void Step(py::array gradient_array, const py::list& tables, py::array params_array, double loss,
            int64_t samples, const py::object& optimizer, bool skip, double clip_grad_norm) {
    const absl::Span<float> gradient = SpanOf<float>(gradient_array, "the gradient buffer", false);
    const absl::Span<float> params = SpanOf<float>(params_array, "the parameter buffer", true);
    std::vector<TableStep> steps(table_dims_.size());
    if (!tables.empty() && tables.size() != table_dims_.size()) {
      throw py::value_error(absl::StrCat(tables.size(), " tables' rows for a model of ",
                                         table_dims_.size(), " tables"));
    }
    for (size_t t = 0; t < tables.size(); ++t) {
      if (tables[t].is_none()) continue;
      auto pair = tables[t].cast<std::pair<py::array, py::array>>();
      const absl::Span<int64_t> ids = SpanOf<int64_t>(pair.first, "the row ids", false);
      const absl::Span<float> grads = SpanOf<float>(pair.second, "the row gradients", false);
      CheckIncreasing(ids);
      if (grads.size() != ids.size() * static_cast<size_t>(table_dims_[t])) {
        throw py::value_error(absl::StrCat("table ", t, ": ", grads.size(), " gradient values for ",
                                           ids.size(), " rows of dim ", table_dims_[t]));
      }
      steps[t].ids.assign(ids.begin(), ids.end());
      steps[t].row_gradients.assign(grads.begin(), grads.end());
    }
    std::optional<StepHyperparameters> settings;
    if (!optimizer.is_none()) {
      settings = SettingsOf(optimizer.cast<py::tuple>(), static_cast<int64_t>(gradient.size()));
    }
    absl::Status stepped;
    ScriptTrainingLoop* const driven = loop();  // raises, with the GIL, if none
    {
      py::gil_scoped_release release;
      stepped = driven->Step(gradient, std::move(steps), params, loss, samples,
                             settings.has_value() ? &*settings : nullptr, skip, clip_grad_norm);
    }
    RaiseIfError(stepped);
  }

  // Ends training and finishes the job (report, and as the finisher the result and
  // output.weights). `test_accuracy`: this worker's evaluation, if any.
  void Finish(std::optional<double> test_accuracy) {
    loop()->EndTraining(test_accuracy);
    absl::Status finished;
    {
      py::gil_scoped_release release;
      finished = daemon_->Run();
    }
    RaiseIfError(finished);
  }

  int64_t step() { return loop()->step(); }

  // job.batches(): the next batch's example indices as an int64 array, or None once
  // every epoch is trained (ScriptTrainingLoop::NextLeasedBatch).
  py::object NextLeasedBatch(int64_t example_count, int batch_size) {
    ScriptTrainingLoop* const driven = loop();  // raises, with the GIL, if none
    absl::StatusOr<std::optional<std::vector<int64_t>>> batch;
    {
      py::gil_scoped_release release;
      batch = driven->NextLeasedBatch(example_count, batch_size);
    }
    RaiseIfError(batch.status());
    if (!batch->has_value()) return py::none();
    py::array_t<int64_t> out(static_cast<py::ssize_t>((*batch)->size()));
    std::copy((*batch)->begin(), (*batch)->end(), out.mutable_data());
    return std::move(out);
  }

  // Raises ValueError as step() would for `optimizer`'s settings; sends nothing.
  void CheckOptimizer(const py::tuple& optimizer) const {
    SettingsOf(optimizer, layout_.has_value() ? layout_->dense_parameters() : 0);
  }

 private:
  NativeWorker(std::string config_path, std::unique_ptr<WorkerDaemon> daemon,
               DenseOptimizerOptions spec_optimizer, EmbeddingOptimizerOptions spec_table_optimizer)
      : config_path_(std::move(config_path)),
        daemon_(std::move(daemon)),
        spec_optimizer_(std::move(spec_optimizer)),
        spec_table_optimizer_(std::move(spec_table_optimizer)) {}

  // A step's settings from DistributedOptimizer: (type, [(begin, end, group, (lr,
  // weight_decay, momentum, dampening, nesterov, beta1, beta2, eps, amsgrad, lr_decay,
  // alpha, centered, initial_accumulator_value))]) over the flat vector of `size`,
  // checked as the servers check them and against the state they keep (ValueError
  // naming the group, the field and the tensor).
  StepHyperparameters SettingsOf(const py::tuple& given, int64_t size) const {
    if (!layout_.has_value()) throw py::value_error("optimizer settings before declare");
    if (given.size() != 2) throw py::value_error("optimizer settings are (type, runs)");
    std::vector<double> initial_accumulators;
    StepOptimizer proto;
    proto.set_type(given[0].cast<std::string>());
    for (const py::handle& item : given[1].cast<py::list>()) {
      const auto run = item.cast<py::tuple>();
      const auto values = run[3].cast<py::tuple>();
      if (values.size() != 13) throw py::value_error("a run's settings are 13 values");
      initial_accumulators.push_back(values[12].cast<double>());
      StepOptimizerRun* out = proto.add_runs();
      out->set_begin(run[0].cast<int64_t>());
      out->set_end(run[1].cast<int64_t>());
      out->set_group(run[2].cast<int>());
      out->set_lr(values[0].cast<double>());
      out->set_weight_decay(values[1].cast<double>());
      out->set_momentum(values[2].cast<double>());
      out->set_dampening(values[3].cast<double>());
      out->set_nesterov(values[4].cast<bool>());
      out->set_beta1(values[5].cast<double>());
      out->set_beta2(values[6].cast<double>());
      out->set_eps(values[7].cast<double>());
      out->set_amsgrad(values[8].cast<bool>());
      out->set_lr_decay(values[9].cast<double>());
      out->set_alpha(values[10].cast<double>());
      out->set_centered(values[11].cast<bool>());
    }
    // The runs cover the parameters; the buffers after them keep no optimizer: they take
    // the last run's settings, which the servers do not use there.
    const int64_t trained = layout_->trained_parameters();
    if (proto.runs_size() > 0 && proto.runs(proto.runs_size() - 1).end() == trained &&
        trained < size) {
      StepOptimizerRun buffers = proto.runs(proto.runs_size() - 1);
      buffers.set_begin(trained);
      buffers.set_end(size);
      *proto.add_runs() = buffers;
      initial_accumulators.push_back(initial_accumulators.back());
    }
    absl::StatusOr<StepHyperparameters> settings =
        StepHyperparametersFromProto(proto, spec_optimizer_, size);
    if (!settings.ok()) throw py::value_error(std::string(settings.status().message()));
    for (size_t k = 0; k < settings->size(); ++k) {
      (*settings)[k].options.initial_accumulator_value = initial_accumulators[k];
    }
    const absl::Status kept = CheckStepKeepsSpecState(*settings, spec_optimizer_, *layout_);
    if (!kept.ok()) throw py::value_error(std::string(kept.message()));
    return *std::move(settings);
  }

  // The script's loop; raises paramserver.Error before register. REQUIRES: the GIL.
  ScriptTrainingLoop* loop() {
    ScriptTrainingLoop* loop = daemon_->script();
    if (loop == nullptr) {
      Raise(absl::FailedPreconditionError(
          "the model is not registered: call job.register(model) first"));
    }
    return loop;
  }

  void CheckTable(int table) const {
    if (table < 0 || table >= static_cast<int>(table_dims_.size())) {
      throw py::value_error(
          absl::StrCat("no embedding table ", table, " (the model has ", table_dims_.size(), ")"));
    }
  }

  static void CheckIncreasing(absl::Span<const int64_t> ids) {
    for (size_t i = 1; i < ids.size(); ++i) {
      if (ids[i] <= ids[i - 1]) {
        throw py::value_error(absl::StrCat("row ids must be strictly increasing: ", ids[i - 1],
                                           " then ", ids[i], " at position ", i));
      }
    }
  }

  const std::string config_path_;
  std::unique_ptr<WorkerDaemon> daemon_;
  const DenseOptimizerOptions
      spec_optimizer_;  // training.optimizer: what settings are read against
  const EmbeddingOptimizerOptions
      spec_table_optimizer_;           // training.embedding_optimizer: what tables inherit
  std::optional<ModelLayout> layout_;  // once declared
  std::vector<int64_t> table_dims_;
};

}  // namespace
}  // namespace paramserver

PYBIND11_MODULE(_native, module) {
  using paramserver::NativeWorker;
  module.doc() = "The C++ worker behind the paramserver package (docs/PYTHON.md).";
  paramserver::g_error_type =
      PyErr_NewException("paramserver._native.Error", PyExc_RuntimeError, nullptr);
  module.attr("Error") = py::handle(paramserver::g_error_type);
  py::class_<NativeWorker>(module, "Worker")
      .def_static("join", &NativeWorker::Join)
      .def_property_readonly("rank", &NativeWorker::rank)
      .def_property_readonly("num_workers", &NativeWorker::num_workers)
      .def_property_readonly("node_name", &NativeWorker::node_name)
      .def_property_readonly("config_path", &NativeWorker::config_path)
      .def("config", &NativeWorker::Config)
      .def("declare", &NativeWorker::Declare)
      .def("pull_current", &NativeWorker::PullCurrent)
      .def("pull_rows", &NativeWorker::PullRows)
      .def("step", &NativeWorker::Step, py::arg("gradient"), py::arg("tables"), py::arg("params"),
           py::arg("loss"), py::arg("samples"), py::arg("optimizer") = py::none(),
           py::arg("skip") = false, py::arg("clip_grad_norm") = 0.0)
      .def("check_optimizer", &NativeWorker::CheckOptimizer)
      .def("check_table_settings", &NativeWorker::CheckTableSettings)
      .def("finish", &NativeWorker::Finish)
      .def("next_leased_batch", &NativeWorker::NextLeasedBatch)
      .def_property_readonly("step_number", &NativeWorker::step);
}
