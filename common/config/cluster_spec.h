// The cluster spec: the one YAML file every daemon of a job is started with.
// docs: README.md, "The cluster spec".
#ifndef PARAMSERVER_COMMON_CONFIG_CLUSTER_SPEC_H_
#define PARAMSERVER_COMMON_CONFIG_CLUSTER_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/wire/tensor_codec.h"

namespace paramserver {

enum class TrainingMode { kSync, kAsync, kSsp };

// "sync", "async" or "ssp".
absl::string_view TrainingModeName(TrainingMode mode);

// training.optimizer: the dense parameters' update rule on the servers, each exactly
// torch.optim's of the same name (ps/dense_update_rule.h).
enum class DenseOptimizerType { kSgd, kAdam, kAdamW, kAdagrad, kRmsprop };

// "sgd" | "adam" | "adamw" | "adagrad" | "rmsprop"; INVALID_ARGUMENT naming the others.
absl::StatusOr<DenseOptimizerType> ParseDenseOptimizerType(const std::string& name);
absl::string_view DenseOptimizerName(DenseOptimizerType type);
// "sgd, adam, adamw, adagrad, rmsprop".
std::string DenseOptimizerNames();

// training.optimizer.lr_schedule: the learning rate as a function of the update number,
// each phase the closed form of a torch.optim.lr_scheduler class (ps/learning_rate_schedule.h).
enum class LrDecay { kConstant, kStep, kMultiStep, kExponential, kCosine, kLinear, kPolynomial };

// "constant" | "step" | "multistep" | "exponential" | "cosine" | "linear" | "polynomial".
absl::StatusOr<LrDecay> ParseLrDecay(const std::string& name);
absl::string_view LrDecayName(LrDecay decay);

struct LrSchedule {
  // LinearLR(start_factor, end_factor=1, total_iters=warmup_steps) over the first
  // warmup_steps updates; 0: none.
  int64_t warmup_steps = 0;
  double warmup_start_factor = 1.0 / 3;  // torch's LinearLR default; in (0, 1]
  // Then, with e the updates since the warm-up ended:
  LrDecay decay = LrDecay::kConstant;
  int64_t step_size = 0;            // step: StepLR(step_size, gamma)
  std::vector<int64_t> milestones;  // multistep: MultiStepLR(milestones, gamma), ascending
  double gamma = 0.1;               // step, multistep, exponential (ExponentialLR(gamma))
  // cosine, linear, polynomial: the schedule's length, warm-up included; the decay runs
  // over total_steps - warmup_steps updates (T_max, total_iters) and stays at its end.
  int64_t total_steps = 0;
  double min_learning_rate = 0;  // cosine: CosineAnnealingLR's eta_min
  double end_factor = 0;         // linear: LinearLR(1, end_factor, total_iters)
  double power = 1;              // polynomial: PolynomialLR(total_iters, power)
};

struct DenseOptimizerGroup;

// The hyperparameters, named as the spec names them; torch's argument in brackets.
// Each type reads only its own (DenseOptimizerDefaults gives torch's defaults).
struct DenseOptimizerOptions {
  DenseOptimizerType type = DenseOptimizerType::kAdam;
  double learning_rate = 0.001;          // every type (lr)
  double weight_decay = 0;               // every type; adamw's is decoupled
  double beta1 = 0.9;                    // adam, adamw (betas[0])
  double beta2 = 0.999;                  // adam, adamw (betas[1])
  double epsilon = 1.0e-8;               // adam, adamw, adagrad, rmsprop (eps)
  bool amsgrad = false;                  // adam, adamw
  double momentum = 0;                   // sgd, rmsprop
  double dampening = 0;                  // sgd
  bool nesterov = false;                 // sgd
  double lr_decay = 0;                   // adagrad
  double initial_accumulator_value = 0;  // adagrad
  double alpha = 0.99;                   // rmsprop
  bool centered = false;                 // rmsprop
  LrSchedule lr_schedule;                // every type: learning_rate is its base rate
  // Parameter groups (torch's param_groups): tensors by name pattern, each group with
  // its own settings of this type (common/model/optimizer_groups.h). Tensors no group
  // names train with the settings above.
  std::vector<DenseOptimizerGroup> groups;
  // The whole model's, not a group's (training.optimizer.clip_grad_norm; 0: none): the
  // gradient's global 2-norm is clipped to it, as torch.nn.utils.clip_grad_norm_ over
  // every parameter. Sync: that of the step's mean gradient (after averaging, as DDP
  // users clip); async and ssp: that of each push.
  double clip_grad_norm = 0;
};

struct DenseOptimizerGroup {
  std::vector<std::string> params;  // shell patterns of tensor names ("*.bias", "fc1.*")
  DenseOptimizerOptions options;    // the optimizer's, overridden by the group's keys
};

// torch.optim's defaults for `type`. (torch requires sgd's lr: the spec does too.)
DenseOptimizerOptions DenseOptimizerDefaults(DenseOptimizerType type);

// training.embedding_optimizer: how a table's rows are updated (ps/sparse_optimizer.h).
enum class EmbeddingOptimizerType { kAdam, kAdagrad, kSgd, kRowwiseAdagrad, kFtrl };

struct EmbeddingOptimizerOptions {
  EmbeddingOptimizerType type = EmbeddingOptimizerType::kAdam;
  double learning_rate = 0.001;
  double beta1 = 0.9;     // adam
  double beta2 = 0.999;   // adam
  double epsilon = 1e-7;  // adam, adagrad, rowwise_adagrad
  // rowwise_adagrad: the row's accumulator at its creation (FBGEMM's 0); ftrl: each
  // element's (tf.keras.optimizers.Ftrl's 0.1).
  double initial_accumulator_value = 0;
  double learning_rate_power = -0.5;  // ftrl: <= 0
  double l1 = 0;                      // ftrl: l1_regularization_strength
  double l2 = 0;                      // ftrl: l2_regularization_strength
  double beta = 0;                    // ftrl
};

// "adam" | "adagrad" | "sgd" | "rowwise_adagrad" | "ftrl"; INVALID_ARGUMENT naming the
// others.
absl::StatusOr<EmbeddingOptimizerType> ParseEmbeddingOptimizerType(const std::string& name);
absl::string_view EmbeddingOptimizerName(EmbeddingOptimizerType type);

// An embedding table's own settings (a ctr model's model.tables.<name>, a torch script's
// paramserver.Embedding arguments); each one unset is the job's: model.max_rows,
// model.min_count, training.embedding_optimizer.
struct EmbeddingTableSettings {
  std::optional<int64_t> max_rows;  // over all servers, as model.max_rows
  std::optional<int> min_count;
  std::optional<EmbeddingOptimizerOptions> optimizer;
};

// The most rows a table's max_rows may name (each shard's rows are counted in 32 bits;
// 2^40 over any number of shards is past any server's memory).
inline constexpr int64_t kMaxTableRows = int64_t{1} << 40;

// A setting out of its range: its key ("learning_rate", "optimizer.l1") and why.
struct SettingProblem {
  std::string key;
  std::string problem;
};

// The first of `options`' values out of its range (the checks training.embedding_optimizer
// gets), or none.
std::optional<SettingProblem> FindEmbeddingOptimizerProblem(
    const EmbeddingOptimizerOptions& options);
// The same for every setting a table gives (keys "max_rows", "min_count",
// "optimizer.<key>").
std::optional<SettingProblem> FindTableSettingsProblem(const EmbeddingTableSettings& settings);

// A table's optimizer settings given as a YAML or JSON mapping's text (a script's
// optimizer={...}), read as model.tables.<name>.optimizer is read: `type` defaults to
// the job's; with the job's type every key left out is the job's (`job_optimizer`), with
// another, that type's default. INVALID_ARGUMENT "optimizer.<key>: <problem>" for an
// unknown key, a key of another type or a value out of range.
absl::StatusOr<EmbeddingOptimizerOptions> ParseTableOptimizer(
    absl::string_view text, const EmbeddingOptimizerOptions& job_optimizer);

// cluster.embedding_shards when a ctr model leaves it unset: enough buckets that rows
// spread over a few servers and move in small pieces when one fails.
inline constexpr int kDefaultEmbeddingShards = 8;

struct ClusterSection;
// The worker ranks a job may have: its range's max (the servers keep a record per rank).
int WorkerSlots(const ClusterSection& cluster);

struct ClusterSection {
  std::string scheduler_address;  // host:port; port 0 means "chosen by the launcher"
  // `servers: N`, or a range `servers: {min: N, max: M}`: the job starts with `servers`
  // (its min) and takes servers that join later up to `max_servers` (each takes a fair
  // share of the shards: docs/FAULT_TOLERANCE.md, "Elastic servers").
  int servers = 2;
  int max_servers = 2;
  // `workers: N`, or a range `workers: {min: N, max: M}`: the cluster forms with `workers`
  // (its min); workers that join later take new ranks up to `max_workers` (async and
  // ssp: they train at once; sync: each step's mean is over the workers present).
  int workers = 2;
  int max_workers = 2;
  int shards = 8;
  // model.type ctr: the shards the embedding tables' rows are hashed onto (each holds
  // one hash bucket of every table; docs/SPARSE.md). 0 for an mlp.
  int embedding_shards = 0;
  // Copies of every shard (a primary and replication - 1 backups on distinct servers).
  // Unset in the YAML: 2 when there are at least 2 servers, else 1.
  int replication = 0;
  int heartbeat_interval_ms = 500;
  int failure_timeout_ms = 3000;
  // How long a node rides out a lost peer before it gives up: a worker waiting for a
  // dead server to be replaced, and servers and workers whose scheduler does not
  // answer. 0: max(30 s, 10 x failure_timeout_ms). See RecoveryTimeout().
  int recovery_timeout_ms = 0;
  // How long the scheduler keeps a started job that has no live worker (every worker
  // lost or removed), waiting for one to join, before it ends the job unfinished.
  // 0: as long as it takes (an operator ends it with psctl shutdown). Its waiting lines
  // come every 5 s either way.
  int64_t no_worker_timeout_ms = 30 * 60 * 1000;
};

// cluster.recovery_timeout_ms, or its default when 0.
absl::Duration RecoveryTimeout(const ClusterSection& cluster);

enum class ModelType {
  kMlp,  // dense inputs -> MLP -> classes (the idx data)
  kCtr,  // dense features + one embedding table per categorical field -> MLP -> one logit
  // The user's own PyTorch model, trained by worker.command through the Python package
  // (docs/PYTHON.md): its tensors and embedding tables are declared by the first worker
  // at run time, not by the spec.
  kTorch,
};

// "mlp", "ctr", "torch".
const char* ModelTypeName(ModelType type);

// One table of a ctr model.
struct CtrTableSpec {
  std::string name;  // "C1", ...
  int dim = 16;
  EmbeddingTableSettings settings;
};

struct ModelSection {
  ModelType type = ModelType::kMlp;
  // The MLP: input, hidden..., classes (mlp), or its input (dense_features + the
  // tables' dims), hidden..., 1 (ctr).
  std::vector<int64_t> layers = {784, 128, 10};
  uint64_t init_seed = 1;
  std::string init_from;  // safetensors file, or empty
  // ctr only. Tables C1..C<categorical_features>, one per field, rows of embedding_dim
  // unless model.tables gives a table its own dim.
  int dense_features = 13;
  int categorical_features = 26;
  int embedding_dim = 16;
  // Capacity of every table: past max_rows rows (per table, over all servers; each
  // embedding shard keeps at most its share) the least recently updated are evicted
  // (0: no bound). An id gets a row at its min_count-th sighting; before that it reads
  // as an empty bag and its gradient is dropped.
  int64_t max_rows = 0;
  int min_count = 1;
  // ctr only: the tables C1..C<categorical_features>, in order, each with its dim
  // (model.tables.<name>.dim, else embedding_dim) and own settings (model.tables), as
  // ParseClusterSpec fills it. Read it through CtrTables().
  std::vector<CtrTableSpec> tables;
};

// A ctr model's tables: model.tables, or (a spec built without ParseClusterSpec) C1..
// C<categorical_features> of embedding_dim with the job's settings.
std::vector<CtrTableSpec> CtrTables(const ModelSection& model);
// Their dims, C1 first.
std::vector<int> CtrTableDims(const ModelSection& model);

struct TrainingSection {
  TrainingMode mode = TrainingMode::kSync;
  int staleness = 0;
  int batch_size = 32;
  int epochs = 5;
  int64_t max_steps = 0;  // 0: no limit
  bool shuffle = true;
  uint64_t seed = 1;
  DenseOptimizerOptions optimizer;
  // ctr: the embedding tables' optimizer (the MLP's is `optimizer`).
  EmbeddingOptimizerOptions embedding_optimizer;
  // How parameters and gradients travel between workers and servers (servers keep
  // float32): float32, or bfloat16 / float16 for half the bytes.
  WireDtype wire_dtype = WireDtype::kFloat32;
  // async only: compute step t+1's gradient while step t's push is in flight, on the
  // values step t used (one more step of staleness, the compute hidden behind the
  // round trip). sync and ssp ignore it: their rules need step t's result first. Off
  // by default: on a machine whose cores the servers share it gains little and the
  // staleness costs accuracy (docs/PERFORMANCE.md).
  bool overlap = false;
  // The gradient leaves in buckets as backpropagation finishes them, last layer first,
  // while the layers below are still computed: each bucket is a run of whole shards
  // holding at least this many KiB of float32 gradient (whatever is left goes when
  // backpropagation ends). It changes no result. 0: the whole gradient leaves after
  // backpropagation. Not used with async overlap, which pushes while it computes anyway.
  int64_t push_bucket_kb = 1024;
  // When > 0, every server refuses a push whose gradient for one of its shards has an
  // L2 norm above this (INVALID_ARGUMENT): a bound on each shard's part of a worker's
  // gradient (a dense shard's range, an embedding shard's rows of the pushed ids), not
  // on the whole gradient, which no server sees. 0 (unset): no bound.
  double max_gradient_norm = 0;
  // sync only (training.sync.backup_workers): a step completes on each shard with the
  // first max(1, A - backup_workers) pushes of its A active workers, averaged over them;
  // a later push of that step is late: dropped, counted (psctl, ps_pushes_total{outcome="late"})
  // and its worker goes on at the servers' step. Shards complete independently, so two
  // shards' step may average different workers. 0 (the default): every active worker's
  // push, bit-reproducible. Fewer than cluster.workers (its min); no clip_grad_norm.
  int backup_workers = 0;
  // training.embedding_mode async, with mode sync (PERSIA's hybrid): the embedding
  // tables' shards train asynchronously (every push one update as it arrives, pulls never
  // wait) while the dense shards keep sync steps. A worker's step-t pull sees the dense
  // values after exactly t steps, and rows holding every push of steps before t - 2 (its
  // own up to t - 1 too) and possibly some of the others' t - 2 and t - 1 pushes. Recovery:
  // ShardTrainingMode's modes each keep their own rule (docs/FAULT_TOLERANCE.md).
  bool async_tables = false;
};

// The mode a shard trains in: training.mode, but async for an embedding shard of a job
// with async_tables.
TrainingMode ShardTrainingMode(const TrainingSection& training, bool embedding_shard);
// "sync", "async", "ssp", or "sync (embedding tables async)" for a hybrid job.
std::string TrainingModesText(const TrainingSection& training);

enum class DataFormat {
  kIdx,     // the four idx files below (model.type mlp)
  kCriteo,  // Criteo's text format, `train` and `test` (model.type ctr)
};

// How a built-in model's training set is divided among the workers.
enum class DataSharding {
  // Worker r of W trains the r-th contiguous W-th of the examples every epoch: a sync run
  // is bit-reproducible. A dead worker's share is skipped until one takes its place.
  kFixed,
  // The scheduler leases each epoch's examples in chunks (LeaseDataRequest in
  // proto/scheduler.proto): a dead worker's untrained remainder goes to another, so
  // every example is trained once per epoch; a slow worker takes fewer chunks. Async
  // mode only, without training.max_steps.
  kDynamic,
};

inline constexpr int kMaxChunkBatches = 1 << 20;

struct DataSection {
  DataFormat format = DataFormat::kIdx;
  DataSharding sharding = DataSharding::kFixed;
  int chunk_batches = 16;  // dynamic: the batches of one lease
  // criteo: the files, .gz or plain, read in order.
  std::vector<std::string> train;
  std::vector<std::string> test;
  std::string train_images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  std::string train_labels = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz";
  std::string test_images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
  std::string test_labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
};

struct WorkerSection {
  // Where workers compute: "auto" (a usable GPU if any, else the CPU), "cpu", "gpu"
  // (GPU 0, or fail) or "gpu:N". ps_worker's --device overrides it.
  std::string device = "auto";
  // model.type torch: what each worker runs in place of ps_worker's own training loop
  // (argv, e.g. {"python3", "train.py"}), started in `command_dir`, the spec's folder,
  // so that relative paths in it resolve from there. Empty for the built-in models.
  std::vector<std::string> command;
  std::string command_dir;
};

struct CheckpointSection {
  // Folder for shard checkpoints, reachable by every server (a shared filesystem across
  // machines). Empty: no checkpoints, and a lost server cannot be recovered.
  std::string dir;
  int64_t every_steps = 0;   // 0: no step-based checkpoints
  double every_seconds = 0;  // 0: no time-based checkpoints
  int keep = 3;              // newest files kept per shard
  bool resume = false;       // start from the newest complete checkpoint in dir
  // Embedding shards: after each full checkpoint, this many delta checkpoints holding
  // only the rows changed (and the ids evicted) since the shard's previous one; then a
  // full one again. 0: every checkpoint is full. At most kMaxEmbeddingDeltas.
  int embedding_deltas = 4;
};
inline constexpr int kMaxEmbeddingDeltas = 1000;

struct SecuritySection {
  // A file holding the admin token: the scheduler's calls that change the job (psctl
  // checkpoint, drain, shutdown) need it. Empty: those calls are refused.
  std::string admin_token_file;
  bool admin_reads_need_token = false;  // status, nodes, shards need it too
  // A file holding the cluster token, the secret every member of the job holds: every
  // call between daemons carries it, and without it a call is refused
  // (docs/SECURITY.md). Empty: no membership check.
  std::string cluster_token_file;
  // Lets a daemon listen on a non-loopback address with neither TLS nor a cluster token
  // (refused otherwise: anyone who can reach the port could join the job).
  bool allow_insecure = false;
  // Mutual TLS on every channel (all three set, or none): PEM files of the cluster's CA,
  // this node's certificate and key; tls_server_name, if set, is the name in every
  // node's certificate (otherwise each address's host is checked).
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
};

struct OutputSection {
  std::string weights;  // safetensors path for the final weights, or empty
  // If set, each worker writes TensorBoard event files to <dir>/worker-<rank>.
  std::string tensorboard_dir;
  // If set, the scheduler writes the status page with the job's final status built in
  // (one self-contained HTML file) here when the job ends.
  std::string report;
};

struct ClusterSpec {
  ClusterSection cluster;
  ModelSection model;
  TrainingSection training;
  DataSection data;
  WorkerSection worker;
  CheckpointSection checkpoint;
  SecuritySection security;
  OutputSection output;
};

// Parses and validates a cluster spec. `source_name` (usually the file path) starts
// every error message, followed by the line, the dotted key and the problem:
//   "job.yaml:14: training.batch_size: must be >= 1, got 0".
// Unknown keys are errors. Relative paths in data/model/output are resolved against
// `base_dir` when it is not empty. Returns INVALID_ARGUMENT for any problem.
absl::StatusOr<ClusterSpec> ParseClusterSpec(absl::string_view yaml_text,
                                             absl::string_view source_name,
                                             absl::string_view base_dir = "");

// OK if `device` is auto, cpu, gpu or gpu:N (N a non-negative integer); otherwise
// INVALID_ARGUMENT saying what is accepted.
absl::Status CheckDeviceName(const std::string& device);

// Reads `path` and parses it as above; relative paths are taken relative to the file's
// folder. NOT_FOUND if the file cannot be read.
absl::StatusOr<ClusterSpec> LoadClusterSpec(const std::string& path);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CONFIG_CLUSTER_SPEC_H_
