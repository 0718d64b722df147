#include "common/config/cluster_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/config/cluster_spec_optimizer.h"
#include "common/config/cluster_spec_tables.h"
#include "common/config/yaml_map_reader.h"
#include "common/files/file_system.h"
#include "common/files/s3_file_system.h"
#include "yaml-cpp/yaml.h"

namespace paramserver {
namespace {

std::string ResolvePath(const std::string& path, absl::string_view base_dir) {
  // "~/..." is the home folder's, as a shell would have it.
  if (path.rfind("~/", 0) == 0) {
    const char* home = std::getenv("HOME");
    if (home != nullptr && home[0] != '\0') return absl::StrCat(home, path.substr(1));
  }
  if (path.empty() || path[0] == '/' || base_dir.empty() || IsS3Uri(path)) return path;
  return absl::StrCat(base_dir, "/", path);
}

absl::Status Require(bool ok, YamlMapReader& reader, const std::string& key,
                     const std::string& problem) {
  return ok ? absl::OkStatus() : reader.ErrorAt(key, problem);
}

// A key that may name a local path or an s3:// URI: a URI must be a well-formed one.
absl::Status CheckStorageUri(YamlMapReader& reader, const std::string& key,
                             const std::string& path) {
  if (!IsS3Uri(path)) return absl::OkStatus();
  const absl::Status valid = ValidateS3Uri(path);
  return valid.ok() ? valid : reader.ErrorAt(key, std::string(valid.message()));
}

}  // namespace

int WorkerSlots(const ClusterSection& cluster) {
  return std::max(cluster.workers, cluster.max_workers);
}

namespace {

absl::Status ParseCluster(YamlMapReader& r, ClusterSection* c) {
  PS_RETURN_IF_ERROR(r.Read("scheduler", &c->scheduler_address));
  c->max_servers = c->servers;
  PS_RETURN_IF_ERROR(r.ReadCountRange("servers", &c->servers, &c->max_servers));
  c->max_workers = c->workers;
  PS_RETURN_IF_ERROR(r.ReadCountRange("workers", &c->workers, &c->max_workers));
  PS_RETURN_IF_ERROR(r.Read("shards", &c->shards));
  PS_RETURN_IF_ERROR(r.Read("embedding_shards", &c->embedding_shards));
  PS_RETURN_IF_ERROR(r.Read("replication", &c->replication));
  PS_RETURN_IF_ERROR(r.Read("heartbeat_interval_ms", &c->heartbeat_interval_ms));
  PS_RETURN_IF_ERROR(r.Read("failure_timeout_ms", &c->failure_timeout_ms));
  PS_RETURN_IF_ERROR(r.Read("recovery_timeout_ms", &c->recovery_timeout_ms));
  PS_RETURN_IF_ERROR(r.Read("no_worker_timeout_ms", &c->no_worker_timeout_ms));
  PS_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  PS_RETURN_IF_ERROR(Require(c->scheduler_address.find(':') != std::string::npos, r, "scheduler",
                             "must be host:port, got '" + c->scheduler_address + "'"));
  PS_RETURN_IF_ERROR(Require(c->servers >= 1, r, "servers", "must be >= 1"));
  PS_RETURN_IF_ERROR(Require(
      c->max_servers >= c->servers && c->max_servers <= 1024, r, "servers",
      absl::StrCat("max must be between min (", c->servers, ") and 1024, got ", c->max_servers)));
  PS_RETURN_IF_ERROR(Require(c->workers >= 1, r, "workers", "must be >= 1"));
  PS_RETURN_IF_ERROR(Require(
      c->max_workers >= c->workers && c->max_workers <= 4096, r, "workers",
      absl::StrCat("max must be between min (", c->workers, ") and 4096, got ", c->max_workers)));
  PS_RETURN_IF_ERROR(Require(c->shards >= 1, r, "shards", "must be >= 1"));
  PS_RETURN_IF_ERROR(Require(c->embedding_shards >= 0 && c->embedding_shards <= 4096, r,
                             "embedding_shards", "must be in [1, 4096] (0: the default)"));
  if (c->replication == 0) c->replication = c->servers >= 2 ? 2 : 1;
  PS_RETURN_IF_ERROR(Require(
      c->replication >= 1 && c->replication <= c->servers, r, "replication",
      absl::StrCat("must be between 1 and servers (", c->servers, "), got ", c->replication)));
  PS_RETURN_IF_ERROR(
      Require(c->heartbeat_interval_ms >= 1, r, "heartbeat_interval_ms", "must be >= 1"));
  PS_RETURN_IF_ERROR(Require(c->failure_timeout_ms > c->heartbeat_interval_ms, r,
                             "failure_timeout_ms", "must be greater than heartbeat_interval_ms"));
  PS_RETURN_IF_ERROR(
      Require(c->recovery_timeout_ms == 0 || c->recovery_timeout_ms > c->failure_timeout_ms, r,
              "recovery_timeout_ms", "must be 0 (the default) or greater than failure_timeout_ms"));
  return Require(c->no_worker_timeout_ms == 0 || c->no_worker_timeout_ms > c->failure_timeout_ms, r,
                 "no_worker_timeout_ms", "must be 0 (no limit) or greater than failure_timeout_ms");
}

// The keys only a ctr model has; the capacity keys a torch model's tables share.
constexpr const char* kCtrModelKeys[] = {"dense_features", "categorical_features", "embedding_dim"};
constexpr const char* kTableCapacityKeys[] = {"max_rows", "min_count"};

// Reads model's keys but for a ctr model's model.tables, which ParseCtrTables reads once
// training.embedding_optimizer is known: *tables and *layers_given are for it.
absl::Status ParseModel(YamlMapReader& r, ModelSection* m, absl::string_view base_dir,
                        std::optional<YamlMapReader>* tables, bool* layers_given) {
  std::string type = "mlp";
  PS_RETURN_IF_ERROR(r.Read("type", &type));
  if (type == "ctr") {
    m->type = ModelType::kCtr;
  } else if (type == "torch") {
    m->type = ModelType::kTorch;
  } else if (type != "mlp") {
    return r.ErrorAt("type", "must be mlp, ctr or torch, got '" + type + "'");
  }
  const bool ctr = m->type == ModelType::kCtr;
  const bool torch = m->type == ModelType::kTorch;
  const auto refuse = [&](const char* key, const std::string& why) -> absl::Status {
    std::string ignored;
    PS_RETURN_IF_ERROR(r.Read(key, &ignored));  // marks it read, for the error's line
    return r.ErrorAt(key, why);
  };
  for (const char* key : kCtrModelKeys) {
    if (!ctr && r.Has(key)) {
      return refuse(key, absl::StrCat("is for model.type ctr; this model is ",
                                      torch ? "a torch model" : "an mlp"));
    }
  }
  for (const char* key : kTableCapacityKeys) {
    if (!ctr && !torch && r.Has(key)) {
      return refuse(key, "is for models with embedding tables (ctr, torch); this model is an mlp");
    }
  }
  if (torch && r.Has("layers")) {
    PS_RETURN_IF_ERROR(r.ReadList("layers", &m->layers));  // marks it read
    return r.ErrorAt("layers",
                     "is for the built-in models; a torch model's tensors are its script's (the "
                     "first worker's job.register declares them)");
  }
  if (!ctr && r.Has("tables")) {
    PS_RETURN_IF_ERROR(r.Section("tables").status());  // marks it read
    return r.ErrorAt("tables", torch ? "is for a ctr model's tables; a torch script gives a "
                                       "table its own settings as paramserver.Embedding's "
                                       "arguments (optimizer=, max_rows=, min_count=)"
                                     : "is for a ctr model's tables; an mlp has none");
  }
  PS_ASSIGN_OR_RETURN(YamlMapReader tables_reader, r.Section("tables"));
  tables->emplace(std::move(tables_reader));
  *layers_given = r.Has("layers");
  PS_RETURN_IF_ERROR(r.ReadList("layers", &m->layers));
  PS_RETURN_IF_ERROR(r.Read("init_seed", &m->init_seed));
  PS_RETURN_IF_ERROR(r.Read("init_from", &m->init_from));
  PS_RETURN_IF_ERROR(r.Read("dense_features", &m->dense_features));
  PS_RETURN_IF_ERROR(r.Read("categorical_features", &m->categorical_features));
  PS_RETURN_IF_ERROR(r.Read("embedding_dim", &m->embedding_dim));
  PS_RETURN_IF_ERROR(r.Read("max_rows", &m->max_rows));
  PS_RETURN_IF_ERROR(r.Read("min_count", &m->min_count));
  PS_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  if (ctr || torch) {
    PS_RETURN_IF_ERROR(Require(m->max_rows >= 0 && m->max_rows <= kMaxTableRows, r, "max_rows",
                               "must be in [0, 2^40] (0: no bound)"));
    PS_RETURN_IF_ERROR(Require(m->min_count >= 1 && m->min_count <= 1000000, r, "min_count",
                               "must be in [1, 10^6] (1: a row at the first sighting)"));
  }
  if (ctr) {
    PS_RETURN_IF_ERROR(Require(m->dense_features >= 0 && m->dense_features <= 4096, r,
                               "dense_features", "must be in [0, 4096]"));
    PS_RETURN_IF_ERROR(Require(m->categorical_features >= 1 && m->categorical_features <= 1024, r,
                               "categorical_features", "must be in [1, 1024]"));
    PS_RETURN_IF_ERROR(Require(m->embedding_dim >= 1 && m->embedding_dim <= 1024, r,
                               "embedding_dim", "must be in [1, 1024]"));
    // ParseCtrTables checks layers, or sets them from the tables' dims.
  }
  PS_RETURN_IF_ERROR(
      Require(m->layers.size() >= 2, r, "layers", "needs at least an input and an output size"));
  for (int64_t width : m->layers) {
    PS_RETURN_IF_ERROR(Require(width >= 1 && width <= (int64_t{1} << 24), r, "layers",
                               absl::StrCat("every size must be in [1, 2^24], got ", width)));
  }
  PS_RETURN_IF_ERROR(CheckStorageUri(r, "init_from", m->init_from));
  m->init_from = ResolvePath(m->init_from, base_dir);
  return absl::OkStatus();
}

absl::Status ParseTraining(YamlMapReader& r, TrainingSection* t, ModelType model, int min_workers) {
  std::string mode = "sync";
  PS_RETURN_IF_ERROR(r.Read("mode", &mode));
  PS_RETURN_IF_ERROR(r.Read("staleness", &t->staleness));
  PS_RETURN_IF_ERROR(r.Read("batch_size", &t->batch_size));
  PS_RETURN_IF_ERROR(r.Read("epochs", &t->epochs));
  PS_RETURN_IF_ERROR(r.Read("max_steps", &t->max_steps));
  PS_RETURN_IF_ERROR(r.Read("shuffle", &t->shuffle));
  PS_RETURN_IF_ERROR(r.Read("seed", &t->seed));
  PS_RETURN_IF_ERROR(r.Read("overlap", &t->overlap));
  PS_RETURN_IF_ERROR(r.Read("push_bucket_kb", &t->push_bucket_kb));
  const bool embedding_mode_given = r.Has("embedding_mode");
  std::string embedding_mode = mode;
  PS_RETURN_IF_ERROR(r.Read("embedding_mode", &embedding_mode));
  const bool max_gradient_norm_given = r.Has("max_gradient_norm");
  PS_RETURN_IF_ERROR(r.Read("max_gradient_norm", &t->max_gradient_norm));
  std::string wire_dtype(WireDtypeName(t->wire_dtype));
  PS_RETURN_IF_ERROR(r.Read("wire_dtype", &wire_dtype));
  absl::StatusOr<WireDtype> parsed_wire_dtype = ParseWireDtype(wire_dtype);
  if (!parsed_wire_dtype.ok())
    return r.ErrorAt("wire_dtype",
                     "must be float32, bfloat16 or float16, got '" + wire_dtype + "'");
  t->wire_dtype = *parsed_wire_dtype;
  PS_ASSIGN_OR_RETURN(YamlMapReader sync, r.Section("sync"));
  PS_RETURN_IF_ERROR(sync.Read("backup_workers", &t->backup_workers));
  PS_RETURN_IF_ERROR(sync.CheckNoUnknownKeys());
  PS_RETURN_IF_ERROR(Require(t->backup_workers >= 0, sync, "backup_workers",
                             absl::StrCat("must be >= 0, got ", t->backup_workers)));
  PS_RETURN_IF_ERROR(Require(t->backup_workers == 0 || mode == "sync", sync, "backup_workers",
                             "is for training.mode sync (async and ssp steps wait for no "
                             "worker's push)"));
  PS_RETURN_IF_ERROR(
      Require(t->backup_workers < min_workers, sync, "backup_workers",
              absl::StrCat("must be below cluster.workers (its min, ", min_workers,
                           "): a step needs one worker's push, got ", t->backup_workers)));
  PS_ASSIGN_OR_RETURN(YamlMapReader optimizer, r.Section("optimizer"));
  PS_RETURN_IF_ERROR(ParseOptimizer(optimizer, &t->optimizer, t->max_steps));
  PS_RETURN_IF_ERROR(Require(t->backup_workers == 0 || t->optimizer.clip_grad_norm == 0, optimizer,
                             "clip_grad_norm",
                             "cannot be used with training.sync.backup_workers: every shard "
                             "clips with one global norm, which needs the same workers' "
                             "pushes on every shard"));
  if (model == ModelType::kCtr && t->optimizer.clip_grad_norm > 0) {
    // torch's clip_grad_norm_ would take the embedding rows' gradients too, which no
    // dense shard sees.
    return optimizer.ErrorAt("clip_grad_norm",
                             "is not offered for a ctr model (its norm would span the "
                             "embedding rows' gradients, held on other shards); clip in a "
                             "torch model's script, or leave it out");
  }
  if (model == ModelType::kMlp && r.Has("embedding_optimizer")) {
    PS_RETURN_IF_ERROR(r.Section("embedding_optimizer").status());
    return r.ErrorAt("embedding_optimizer",
                     "is for models with embedding tables (ctr, torch); this model is an mlp");
  }
  PS_ASSIGN_OR_RETURN(YamlMapReader embedding_optimizer, r.Section("embedding_optimizer"));
  PS_RETURN_IF_ERROR(
      ParseEmbeddingOptimizer(embedding_optimizer, nullptr, &t->embedding_optimizer));
  PS_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  if (mode == "sync") {
    t->mode = TrainingMode::kSync;
  } else if (mode == "async") {
    t->mode = TrainingMode::kAsync;
  } else if (mode == "ssp") {
    t->mode = TrainingMode::kSsp;
  } else {
    return r.ErrorAt("mode", "must be sync, async or ssp, got '" + mode + "'");
  }
  if (embedding_mode_given) {
    PS_RETURN_IF_ERROR(Require(embedding_mode == "sync" || embedding_mode == "async", r,
                               "embedding_mode",
                               absl::StrCat("must be sync or async, got '", embedding_mode, "'")));
    PS_RETURN_IF_ERROR(Require(model != ModelType::kMlp, r, "embedding_mode",
                               "is for models with embedding tables (ctr, torch); this model "
                               "is an mlp"));
    PS_RETURN_IF_ERROR(Require(
        t->mode == TrainingMode::kSync || embedding_mode == mode, r, "embedding_mode",
        absl::StrCat("is for training.mode sync (a sync dense part with async tables); with "
                     "training.mode ",
                     mode, " the tables train ", mode, " as well")));
    // With mode async every shard is async already: nothing to set.
    t->async_tables = t->mode == TrainingMode::kSync && embedding_mode == "async";
  }
  PS_RETURN_IF_ERROR(Require(t->staleness >= 0, r, "staleness", "must be >= 0"));
  PS_RETURN_IF_ERROR(Require(t->batch_size >= 1, r, "batch_size",
                             absl::StrCat("must be >= 1, got ", t->batch_size)));
  PS_RETURN_IF_ERROR(
      Require(t->epochs >= 1, r, "epochs", absl::StrCat("must be >= 1, got ", t->epochs)));
  PS_RETURN_IF_ERROR(Require(
      t->push_bucket_kb >= 0 && t->push_bucket_kb <= (int64_t{1} << 30), r, "push_bucket_kb",
      absl::StrCat("must be in [0, 2^30] (0: off), got ", t->push_bucket_kb)));
  if (max_gradient_norm_given) {
    PS_RETURN_IF_ERROR(Require(t->max_gradient_norm > 0 && std::isfinite(t->max_gradient_norm), r,
                               "max_gradient_norm",
                               absl::StrCat("must be a positive finite number (leave it out for "
                                            "no bound), got ",
                                            t->max_gradient_norm)));
  }
  return Require(t->max_steps >= 0, r, "max_steps", "must be >= 0 (0: no limit)");
}

absl::Status ReadChunkBatches(YamlMapReader& r, DataSection* d) {
  PS_RETURN_IF_ERROR(r.Read("chunk_batches", &d->chunk_batches));
  return Require(d->chunk_batches >= 1 && d->chunk_batches <= kMaxChunkBatches, r, "chunk_batches",
                 absl::StrCat("must be 1 to ", kMaxChunkBatches, ", got ", d->chunk_batches));
}

absl::Status ParseData(YamlMapReader& r, DataSection* d, ModelType model,
                       absl::string_view base_dir) {
  // A torch model's script reads its own data: the section is its to use (job.config),
  // any keys, not read here.
  if (model == ModelType::kTorch) {
    // But for the size of job.batches()' leases.
    PS_RETURN_IF_ERROR(ReadChunkBatches(r, d));
    d->train_images.clear();
    d->train_labels.clear();
    d->test_images.clear();
    d->test_labels.clear();
    return absl::OkStatus();
  }
  std::string format = model == ModelType::kCtr ? "criteo" : "idx";
  PS_RETURN_IF_ERROR(r.Read("format", &format));
  if (format == "criteo") {
    d->format = DataFormat::kCriteo;
  } else if (format != "idx") {
    return r.ErrorAt("format", "must be idx or criteo, got '" + format + "'");
  }
  const bool criteo = d->format == DataFormat::kCriteo;
  std::string sharding = "fixed";
  PS_RETURN_IF_ERROR(r.Read("sharding", &sharding));
  if (sharding == "dynamic") {
    d->sharding = DataSharding::kDynamic;
  } else if (sharding != "fixed") {
    return r.ErrorAt("sharding", "must be fixed or dynamic, got '" + sharding + "'");
  }
  PS_RETURN_IF_ERROR(ReadChunkBatches(r, d));
  PS_RETURN_IF_ERROR(
      Require(criteo == (model == ModelType::kCtr), r, "format",
              criteo ? "criteo data is for model.type ctr" : "model.type ctr reads criteo data"));
  const std::pair<const char*, std::string*> idx_files[] = {{"train_images", &d->train_images},
                                                            {"train_labels", &d->train_labels},
                                                            {"test_images", &d->test_images},
                                                            {"test_labels", &d->test_labels}};
  for (auto [key, field] : idx_files) {
    if (criteo && r.Has(key)) {
      PS_RETURN_IF_ERROR(r.Read(key, field));
      return r.ErrorAt(key, "is an idx file; criteo data is given as train and test");
    }
    if (criteo) continue;
    PS_RETURN_IF_ERROR(r.Read(key, field));
    PS_RETURN_IF_ERROR(Require(!field->empty(), r, key, "must name a file"));
    PS_RETURN_IF_ERROR(CheckStorageUri(r, key, *field));
    *field = ResolvePath(*field, base_dir);
  }
  for (auto [key, files] : {std::pair<const char*, std::vector<std::string>*>{"train", &d->train},
                            {"test", &d->test}}) {
    if (!criteo && r.Has(key)) {
      PS_RETURN_IF_ERROR(r.ReadStringList(key, files));
      return r.ErrorAt(key, "is for criteo data; idx data is given as train_images, ...");
    }
    PS_RETURN_IF_ERROR(r.ReadStringList(key, files));
    if (!criteo) continue;
    PS_RETURN_IF_ERROR(Require(!files->empty(), r, key, "must name at least one file"));
    for (std::string& file : *files) {
      PS_RETURN_IF_ERROR(Require(!file.empty(), r, key, "must name files, not empty strings"));
      PS_RETURN_IF_ERROR(CheckStorageUri(r, key, file));
      file = ResolvePath(file, base_dir);
    }
  }
  return r.CheckNoUnknownKeys();
}

absl::Status ParseCheckpoint(YamlMapReader& r, CheckpointSection* c, absl::string_view base_dir) {
  PS_RETURN_IF_ERROR(r.Read("dir", &c->dir));
  PS_RETURN_IF_ERROR(r.Read("every_steps", &c->every_steps));
  PS_RETURN_IF_ERROR(r.Read("every_seconds", &c->every_seconds));
  PS_RETURN_IF_ERROR(r.Read("keep", &c->keep));
  PS_RETURN_IF_ERROR(r.Read("resume", &c->resume));
  PS_RETURN_IF_ERROR(r.Read("embedding_deltas", &c->embedding_deltas));
  PS_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  PS_RETURN_IF_ERROR(Require(c->embedding_deltas >= 0 && c->embedding_deltas <= kMaxEmbeddingDeltas,
                             r, "embedding_deltas",
                             absl::StrCat("must be in [0, ", kMaxEmbeddingDeltas,
                                          "] (delta checkpoints between full ones; 0: none)")));
  PS_RETURN_IF_ERROR(CheckStorageUri(r, "dir", c->dir));
  PS_RETURN_IF_ERROR(
      Require(c->every_steps >= 0, r, "every_steps", "must be >= 0 (0: no periodic checkpoints)"));
  PS_RETURN_IF_ERROR(Require(c->keep >= 2, r, "keep",
                             "must be >= 2, so a rollback target survives the next write"));
  PS_RETURN_IF_ERROR(Require(!c->resume || !c->dir.empty(), r, "resume", "needs checkpoint.dir"));
  PS_RETURN_IF_ERROR(
      Require(c->every_steps == 0 || !c->dir.empty(), r, "every_steps", "needs checkpoint.dir"));
  PS_RETURN_IF_ERROR(Require(c->every_seconds >= 0 && std::isfinite(c->every_seconds), r,
                             "every_seconds", "must be >= 0 (0: no time-based checkpoints)"));
  PS_RETURN_IF_ERROR(Require(c->every_seconds == 0 || !c->dir.empty(), r, "every_seconds",
                             "needs checkpoint.dir"));
  c->dir = ResolvePath(c->dir, base_dir);
  return absl::OkStatus();
}

absl::Status ParseWorker(YamlMapReader& worker, ModelType model, const std::string& source,
                         absl::string_view base_dir, WorkerSection* w) {
  PS_RETURN_IF_ERROR(worker.Read("device", &w->device));
  const bool torch = model == ModelType::kTorch;
  if (!torch && worker.Has("command")) {
    PS_RETURN_IF_ERROR(worker.ReadStringList("command", &w->command));
    return worker.ErrorAt("command",
                          absl::StrCat("is for model.type torch (a script that trains its own "
                                       "model); this model is model.type ",
                                       ModelTypeName(model), ", which ps_worker trains"));
  }
  PS_RETURN_IF_ERROR(worker.ReadStringList("command", &w->command));
  PS_RETURN_IF_ERROR(worker.CheckNoUnknownKeys());
  if (absl::Status s = CheckDeviceName(w->device); !s.ok()) {
    return worker.ErrorAt("device", std::string(s.message()));
  }
  if (torch) {
    if (w->command.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source,
          ": worker.command: model.type torch needs the command each worker runs, e.g. "
          "[python3, train.py] (relative paths resolve from the spec's folder)"));
    }
    for (const std::string& arg : w->command) {
      PS_RETURN_IF_ERROR(
          Require(!arg.empty(), worker, "command",
                  "must be a list of non-empty arguments, e.g. [python3, train.py]"));
    }
    w->command_dir = base_dir.empty() ? "." : std::string(base_dir);
  }
  return absl::OkStatus();
}

absl::Status ParseSecurity(YamlMapReader& security, absl::string_view base_dir,
                           SecuritySection* sec) {
  PS_RETURN_IF_ERROR(security.Read("admin_token_file", &sec->admin_token_file));
  PS_RETURN_IF_ERROR(security.Read("admin_reads_need_token", &sec->admin_reads_need_token));
  PS_RETURN_IF_ERROR(security.Read("cluster_token_file", &sec->cluster_token_file));
  sec->cluster_token_file = ResolvePath(sec->cluster_token_file, base_dir);
  PS_RETURN_IF_ERROR(security.Read("allow_insecure", &sec->allow_insecure));
  PS_ASSIGN_OR_RETURN(YamlMapReader tls, security.Section("tls"));
  PS_RETURN_IF_ERROR(tls.Read("ca", &sec->tls_ca));
  PS_RETURN_IF_ERROR(tls.Read("cert", &sec->tls_cert));
  PS_RETURN_IF_ERROR(tls.Read("key", &sec->tls_key));
  PS_RETURN_IF_ERROR(tls.Read("server_name", &sec->tls_server_name));
  PS_RETURN_IF_ERROR(tls.CheckNoUnknownKeys());
  const int tls_files = !sec->tls_ca.empty() + !sec->tls_cert.empty() + !sec->tls_key.empty();
  PS_RETURN_IF_ERROR(Require(tls_files == 0 || tls_files == 3, tls,
                             sec->tls_ca.empty()     ? "ca"
                             : sec->tls_cert.empty() ? "cert"
                                                     : "key",
                             "is missing: ca, cert and key are set together"));
  for (std::string* path : {&sec->tls_ca, &sec->tls_cert, &sec->tls_key})
    *path = ResolvePath(*path, base_dir);
  PS_RETURN_IF_ERROR(security.CheckNoUnknownKeys());
  PS_RETURN_IF_ERROR(Require(!sec->admin_reads_need_token || !sec->admin_token_file.empty(),
                             security, "admin_reads_need_token",
                             "needs security.admin_token_file"));
  sec->admin_token_file = ResolvePath(sec->admin_token_file, base_dir);
  return absl::OkStatus();
}

absl::Status ParseOutput(YamlMapReader& output, absl::string_view base_dir, OutputSection* o) {
  PS_RETURN_IF_ERROR(output.Read("weights", &o->weights));
  PS_RETURN_IF_ERROR(output.Read("tensorboard_dir", &o->tensorboard_dir));
  PS_RETURN_IF_ERROR(output.Read("report", &o->report));
  PS_RETURN_IF_ERROR(CheckStorageUri(output, "weights", o->weights));
  PS_RETURN_IF_ERROR(CheckStorageUri(output, "report", o->report));
  PS_RETURN_IF_ERROR(Require(!IsS3Uri(o->tensorboard_dir), output, "tensorboard_dir",
                             "cannot be an s3:// URI (event files are appended to, which S3 "
                             "objects cannot be); use a local folder"));
  o->tensorboard_dir = ResolvePath(o->tensorboard_dir, base_dir);
  o->report = ResolvePath(o->report, base_dir);
  PS_RETURN_IF_ERROR(output.CheckNoUnknownKeys());
  o->weights = ResolvePath(o->weights, base_dir);
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> ParseNode(const YAML::Node& root, const std::string& source,
                                      absl::string_view base_dir) {
  YamlMapReader top(root, "", source);
  PS_RETURN_IF_ERROR(top.CheckIsMap());
  ClusterSpec spec;
  PS_ASSIGN_OR_RETURN(YamlMapReader cluster, top.Section("cluster"));
  PS_RETURN_IF_ERROR(ParseCluster(cluster, &spec.cluster));
  PS_ASSIGN_OR_RETURN(YamlMapReader model, top.Section("model"));
  std::optional<YamlMapReader> tables;
  bool layers_given = false;
  PS_RETURN_IF_ERROR(ParseModel(model, &spec.model, base_dir, &tables, &layers_given));
  PS_ASSIGN_OR_RETURN(YamlMapReader training, top.Section("training"));
  PS_RETURN_IF_ERROR(
      ParseTraining(training, &spec.training, spec.model.type, spec.cluster.workers));
  if (spec.model.type == ModelType::kCtr) {
    PS_RETURN_IF_ERROR(ParseCtrTables(*tables, model, layers_given,
                                      spec.training.embedding_optimizer, &spec.model));
  }
  PS_ASSIGN_OR_RETURN(YamlMapReader data, top.Section("data"));
  PS_RETURN_IF_ERROR(ParseData(data, &spec.data, spec.model.type, base_dir));
  if (spec.data.sharding == DataSharding::kDynamic) {
    // Leases are acknowledged by the servers' count of each worker's pushes, which
    // async mode keeps; sync and ssp steps pace the workers together, which a worker
    // waiting for a lease would stall.
    PS_RETURN_IF_ERROR(Require(spec.training.mode == TrainingMode::kAsync, data, "sharding",
                               "dynamic needs training.mode async"));
    PS_RETURN_IF_ERROR(Require(spec.training.max_steps == 0, data, "sharding",
                               "dynamic trains every epoch's examples once: remove "
                               "training.max_steps (a cap on each worker's steps)"));
  }
  if (spec.model.type != ModelType::kMlp && spec.cluster.embedding_shards == 0) {
    spec.cluster.embedding_shards = kDefaultEmbeddingShards;
  }
  PS_RETURN_IF_ERROR(
      Require(spec.model.type != ModelType::kMlp || spec.cluster.embedding_shards == 0, cluster,
              "embedding_shards", "is for models with embedding tables (an mlp has none)"));
  PS_ASSIGN_OR_RETURN(YamlMapReader worker, top.Section("worker"));
  PS_RETURN_IF_ERROR(ParseWorker(worker, spec.model.type, source, base_dir, &spec.worker));
  PS_ASSIGN_OR_RETURN(YamlMapReader checkpoint, top.Section("checkpoint"));
  PS_RETURN_IF_ERROR(ParseCheckpoint(checkpoint, &spec.checkpoint, base_dir));
  // A server joining past min takes shards from the others: as a backup that copies them
  // (replication >= 2), or through handoff checkpoints.
  PS_RETURN_IF_ERROR(Require(spec.cluster.max_servers == spec.cluster.servers ||
                                 spec.cluster.replication >= 2 || !spec.checkpoint.dir.empty(),
                             cluster, "servers",
                             "a range needs replication >= 2 or checkpoint.dir: a server that "
                             "joins takes shards from the others by copying them as a backup, or "
                             "through handoff checkpoints"));
  PS_ASSIGN_OR_RETURN(YamlMapReader security, top.Section("security"));
  PS_RETURN_IF_ERROR(ParseSecurity(security, base_dir, &spec.security));
  PS_ASSIGN_OR_RETURN(YamlMapReader output, top.Section("output"));
  PS_RETURN_IF_ERROR(ParseOutput(output, base_dir, &spec.output));
  PS_RETURN_IF_ERROR(top.CheckNoUnknownKeys());
  return spec;
}

}  // namespace

absl::StatusOr<ClusterSpec> ParseClusterSpec(absl::string_view yaml_text,
                                             absl::string_view source_name,
                                             absl::string_view base_dir) {
  std::string source(source_name);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ": not valid YAML: ", e.msg));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid YAML: ", e.what()));
  }
  if (!root || root.IsNull()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": empty file; expected a cluster spec"));
  }
  try {
    return ParseNode(root, source, base_dir);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
}

absl::StatusOr<ClusterSpec> LoadClusterSpec(const std::string& path) {
  absl::StatusOr<std::string> text = LocalFileSystem().ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read the cluster spec"));
  }
  return ParseClusterSpec(*text, path, DirectoryOf(path));
}

}  // namespace paramserver
