#include "common/checkpoint/shard_checkpoint.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/embedding_checkpoint_files.h"
#include "common/checkpoint/file_bytes.h"
#include "common/wire/tensor_codec.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// PSCKPT03 adds skipped_steps after the epoch; PSCKPT02 (none skipped) and PSCKPT01
// (Adam's two slots, no optimizer name) are still read.
constexpr char kMagic[] = "PSCKPT03";
constexpr char kUnskippedMagic[] = "PSCKPT02";
constexpr char kAdamOnlyMagic[] = "PSCKPT01";
constexpr size_t kMagicSize = 8;
constexpr size_t kFixedHeaderSize = kMagicSize + 4 + 8 * 4;  // PSCKPT01's and 02's

absl::Status Corrupt(const std::string& path, const std::string& problem) {
  return absl::DataLossError(absl::StrCat(path, ": corrupt shard checkpoint: ", problem));
}

}  // namespace

std::string ShardCheckpointPath(const std::string& dir, int shard_id, int64_t step) {
  return absl::StrCat(dir, "/shard-", shard_id, "-step-", step, ".ckpt");
}

void SortRowsById(ShardState* state) {
  for (EmbeddingShardState& table : state->tables) SortRowsById(&table);
}

absl::Status WriteShardCheckpoint(FileSystem& fs, const std::string& dir, const ShardState& state) {
  const size_t n = static_cast<size_t>(state.range.size());
  bool sizes_match = state.values.size() == n;
  for (const std::vector<float>& slot : state.slots) sizes_match &= slot.size() == n;
  if (!sizes_match || state.optimizer.size() > kMaxOptimizerNameBytes ||
      state.slots.size() > kMaxOptimizerSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", state.shard_id, " state does not match its range"));
  }
  std::string bytes(kMagic, kMagicSize);
  AppendLittleEndian<int32_t>(state.shard_id, &bytes);
  AppendLittleEndian<int64_t>(state.range.begin, &bytes);
  AppendLittleEndian<int64_t>(state.range.end, &bytes);
  AppendLittleEndian<int64_t>(state.step, &bytes);
  AppendLittleEndian<int64_t>(state.epoch, &bytes);
  AppendLittleEndian<int64_t>(state.skipped_steps, &bytes);
  AppendLittleEndian<uint8_t>(static_cast<uint8_t>(state.optimizer.size()), &bytes);
  bytes += state.optimizer;
  AppendLittleEndian<uint8_t>(static_cast<uint8_t>(state.slots.size()), &bytes);
  bytes.reserve(bytes.size() + (1 + state.slots.size()) * n * sizeof(float) + 4);
  AppendFloatsLittleEndian(state.values, &bytes);
  for (const std::vector<float>& slot : state.slots) AppendFloatsLittleEndian(slot, &bytes);
  const uint32_t crc = Crc32Of(bytes.data(), bytes.size());
  AppendLittleEndian<uint32_t>(crc, &bytes);

  PS_RETURN_IF_ERROR(fs.CreateDir(dir));
  return WriteFileAtomically(fs, ShardCheckpointPath(dir, state.shard_id, state.step), bytes);
}

absl::StatusOr<ShardState> ReadShardCheckpoint(FileSystem& fs, const std::string& path) {
  PS_ASSIGN_OR_RETURN(const std::string bytes, fs.ReadFile(path));
  return ParseShardCheckpoint(bytes, path);
}

absl::StatusOr<ShardState> ParseShardCheckpoint(const std::string& bytes, const std::string& path) {
  const bool adam_only = bytes.compare(0, kMagicSize, kAdamOnlyMagic, kMagicSize) == 0;
  const bool with_skips = bytes.compare(0, kMagicSize, kMagic, kMagicSize) == 0;
  const size_t fixed_header = kFixedHeaderSize + (with_skips ? 8 : 0);
  if (bytes.size() < fixed_header + 4 ||
      !(adam_only || with_skips ||
        bytes.compare(0, kMagicSize, kUnskippedMagic, kMagicSize) == 0)) {
    return Corrupt(path, "bad magic number or shorter than a header");
  }
  ShardState state;
  state.shard_id = ReadLittleEndian<int32_t>(bytes, kMagicSize);
  state.range.begin = ReadLittleEndian<int64_t>(bytes, kMagicSize + 4);
  state.range.end = ReadLittleEndian<int64_t>(bytes, kMagicSize + 12);
  state.step = ReadLittleEndian<int64_t>(bytes, kMagicSize + 20);
  state.epoch = ReadLittleEndian<int64_t>(bytes, kMagicSize + 28);
  if (with_skips) state.skipped_steps = ReadLittleEndian<int64_t>(bytes, kMagicSize + 36);
  if (state.range.begin < 0 || state.range.end < state.range.begin) {
    return Corrupt(path, absl::StrCat("the range [", state.range.begin, ", ", state.range.end,
                                      ") is not one"));
  }
  if (state.skipped_steps < 0 || state.skipped_steps > state.step) {
    return Corrupt(path, absl::StrCat(state.skipped_steps, " skipped of ", state.step, " steps"));
  }
  size_t header = fixed_header;
  size_t slots = 2;
  state.optimizer = "adam(exp_avg,exp_avg_sq)";  // a PSCKPT01 file's
  if (!adam_only) {
    const size_t name_size = static_cast<uint8_t>(bytes[header]);
    if (name_size > kMaxOptimizerNameBytes || bytes.size() < header + name_size + 2 + 4) {
      return Corrupt(path, absl::StrCat("an optimizer name of ", name_size, " bytes"));
    }
    state.optimizer = bytes.substr(header + 1, name_size);
    slots = static_cast<uint8_t>(bytes[header + 1 + name_size]);
    header += name_size + 2;
    if (slots > kMaxOptimizerSlots) {
      return Corrupt(path,
                     absl::StrCat(slots, " optimizer slots (at most ", kMaxOptimizerSlots, ")"));
    }
  }
  const int64_t n = state.range.size();
  const size_t arrays = 1 + slots;
  if (n < 0 || static_cast<uint64_t>(n) > bytes.size() / (arrays * sizeof(float)) ||
      bytes.size() != header + arrays * static_cast<size_t>(n) * sizeof(float) + 4) {
    return Corrupt(
        path, absl::StrCat("size ", bytes.size(), " does not match the range [", state.range.begin,
                           ", ", state.range.end, ") and ", slots, " optimizer slots"));
  }
  const uint32_t stored = ReadLittleEndian<uint32_t>(bytes, bytes.size() - 4);
  const uint32_t actual = Crc32Of(bytes.data(), bytes.size() - 4);
  if (stored != actual) return Corrupt(path, "checksum mismatch");
  const size_t array_bytes = static_cast<size_t>(n) * sizeof(float);
  const absl::string_view body(bytes.data() + header, arrays * array_bytes);
  state.values.resize(n);
  DecodeFloatsLittleEndian(body.substr(0, array_bytes), state.values.data());
  state.slots.assign(slots, std::vector<float>(n));
  for (size_t k = 0; k < slots; ++k) {
    DecodeFloatsLittleEndian(body.substr((1 + k) * array_bytes, array_bytes),
                             state.slots[k].data());
  }
  return state;
}

std::vector<CheckpointFileName> ListShardCheckpoints(FileSystem& fs, const std::string& dir) {
  std::vector<CheckpointFileName> files;
  absl::StatusOr<std::vector<std::string>> names = fs.ListDir(dir);
  if (!names.ok()) return files;
  for (const std::string& name : *names) {
    // shard-<id>-step-<step>.ckpt
    if (name.rfind("shard-", 0) != 0 || name.size() < 5 || name.substr(name.size() - 5) != ".ckpt")
      continue;
    const size_t step_at = name.find("-step-");
    if (step_at == std::string::npos) continue;
    CheckpointFileName file;
    file.path = dir + "/" + name;
    if (!absl::SimpleAtoi(name.substr(6, step_at - 6), &file.shard_id) ||
        !absl::SimpleAtoi(name.substr(step_at + 6, name.size() - 5 - step_at - 6), &file.step)) {
      continue;
    }
    files.push_back(file);
  }
  std::sort(files.begin(), files.end(),
            [](const CheckpointFileName& a, const CheckpointFileName& b) {
              return a.step != b.step ? a.step > b.step : a.shard_id < b.shard_id;
            });
  return files;
}

absl::StatusOr<ShardState> LoadRangeAtStep(FileSystem& fs, const std::string& dir,
                                           ParameterRange range, int64_t step,
                                           int64_t model_parameters) {
  ShardState assembled;
  assembled.range = range;
  assembled.step = step;
  const size_t n = static_cast<size_t>(range.size());
  assembled.values.resize(n);
  bool first_file = true;
  std::vector<bool> covered(n, false);
  for (const CheckpointFileName& file : ListShardCheckpoints(fs, dir)) {
    if (file.step != step) continue;
    absl::StatusOr<ShardState> state = ReadShardCheckpoint(fs, file.path);
    if (!state.ok()) return state.status();
    if (model_parameters >= 0 && state->range.end > model_parameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path, " holds parameters [", state->range.begin, ", ", state->range.end,
          ") but this model has ", model_parameters, ": a checkpoint of another model"));
    }
    if (first_file) {
      assembled.optimizer = state->optimizer;
      assembled.slots.assign(state->slots.size(), std::vector<float>(n));
      first_file = false;
    } else if (state->optimizer != assembled.optimizer ||
               state->slots.size() != assembled.slots.size()) {
      return absl::DataLossError(absl::StrCat(file.path, " holds ", state->optimizer, " state in ",
                                              state->slots.size(), " slots; other files of step ",
                                              step, " hold ", assembled.optimizer, " in ",
                                              assembled.slots.size()));
    }
    const int64_t begin = std::max(range.begin, state->range.begin);
    const int64_t end = std::min(range.end, state->range.end);
    for (int64_t i = begin; i < end; ++i) {
      const size_t to = static_cast<size_t>(i - range.begin);
      const size_t from = static_cast<size_t>(i - state->range.begin);
      assembled.values[to] = state->values[from];
      for (size_t k = 0; k < assembled.slots.size(); ++k)
        assembled.slots[k][to] = state->slots[k][from];
      covered[to] = true;
    }
    assembled.epoch = std::max(assembled.epoch, state->epoch);
  }
  const auto gap = std::find(covered.begin(), covered.end(), false);
  if (gap != covered.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir, " at step ", step,
                                            " covers parameter ",
                                            range.begin + (gap - covered.begin())));
  }
  return assembled;
}

namespace {

// The steps of `dir`'s dense checkpoint files, newest first.
std::vector<int64_t> CheckpointSteps(FileSystem& fs, const std::string& dir) {
  std::vector<int64_t> steps;
  for (const CheckpointFileName& file : ListShardCheckpoints(fs, dir)) {
    if (steps.empty() || steps.back() != file.step) steps.push_back(file.step);
  }
  return steps;
}

// OK when the files at `step` hold the whole model: every parameter, every table's rows.
absl::Status CheckCompleteAtStep(FileSystem& fs, const std::string& dir, int64_t total_parameters,
                                 int embedding_tables, int64_t step) {
  PS_RETURN_IF_ERROR(
      LoadRangeAtStep(fs, dir, {0, total_parameters}, step, total_parameters).status());
  return CheckEmbeddingCheckpointAtStep(fs, dir, embedding_tables, step);
}

}  // namespace

std::string DescribeWhyNoCompleteCheckpoint(FileSystem& fs, const std::string& dir,
                                            int64_t total_parameters, int embedding_tables,
                                            int steps) {
  const std::vector<int64_t> found = CheckpointSteps(fs, dir);
  if (found.empty()) return "it holds no checkpoint files (shard-<id>-step-<step>.ckpt)";
  std::string why;
  for (size_t k = 0; k < found.size() && k < static_cast<size_t>(steps); ++k) {
    const absl::Status usable =
        CheckCompleteAtStep(fs, dir, total_parameters, embedding_tables, found[k]);
    absl::StrAppend(&why, why.empty() ? "" : "; ", "step ", found[k], ": ", usable.message());
  }
  if (found.size() > static_cast<size_t>(steps))
    absl::StrAppend(&why, "; and ", found.size() - steps, " older steps");
  return why;
}

int64_t NewestCompleteCheckpointStep(FileSystem& fs, const std::string& dir,
                                     int64_t total_parameters, int embedding_tables) {
  const std::vector<int64_t> steps = CheckpointSteps(fs, dir);
  for (int64_t step : steps) {  // newest first
    const absl::Status usable =
        CheckCompleteAtStep(fs, dir, total_parameters, embedding_tables, step);
    if (usable.ok()) return step;
    spdlog::warn("skipping the checkpoint at step {} as a rollback or resume target: {}", step,
                 std::string(usable.message()));
  }
  return -1;
}

absl::StatusOr<ShardState> LoadNewestShardCheckpoint(FileSystem& fs, const std::string& dir,
                                                     int shard_id, ParameterRange range) {
  // Newest by (epoch, step): a file written at a later epoch wins over one with a higher
  // step from before a rollback, or from a server that was replaced while it was stopped.
  std::optional<ShardState> newest;
  for (const CheckpointFileName& file : ListShardCheckpoints(fs, dir)) {
    if (file.shard_id != shard_id) continue;
    absl::StatusOr<ShardState> state = ReadShardCheckpoint(fs, file.path);
    if (!state.ok()) {
      spdlog::warn("skipping a checkpoint of shard {}: {}", shard_id,
                   std::string(state.status().message()));
      continue;
    }
    if (!(state->range == range)) {
      spdlog::warn("skipping {}: it holds [{}, {}), shard {} is now [{}, {})", file.path,
                   state->range.begin, state->range.end, shard_id, range.begin, range.end);
      continue;
    }
    if (!newest.has_value() ||
        std::make_pair(state->epoch, state->step) > std::make_pair(newest->epoch, newest->step)) {
      newest = *std::move(state);
    }
  }
  if (!newest.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("no usable checkpoint of shard ", shard_id, " in ", dir));
  }
  return *std::move(newest);
}

int RemoveOldShardCheckpoints(FileSystem& fs, const std::string& dir, int shard_id, int keep,
                              int64_t retain_from) {
  if (retain_from < 0) return 0;
  int kept = 0, removed = 0;
  for (const CheckpointFileName& file : ListShardCheckpoints(fs, dir)) {  // newest first
    if (file.shard_id != shard_id) continue;
    if (kept++ >= keep && file.step < retain_from && fs.DeleteFile(file.path).ok()) ++removed;
  }
  return removed;
}

}  // namespace paramserver
