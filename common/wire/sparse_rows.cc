#include "common/wire/sparse_rows.h"

#include <cstring>

#include "absl/base/config.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/wire/shard_layout.h"

namespace paramserver {

absl::Status CheckRowIds(RowIdsView rows, const EmbeddingShardShape& shape) {
  if (rows.counts.size() != shape.dims.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids for ", rows.counts.size(), " tables; the model has ", shape.dims.size()));
  }
  if (static_cast<int64_t>(rows.ids.size()) > kMaxIdsPerShardCall) {
    return absl::InvalidArgumentError(absl::StrCat(rows.ids.size(), " ids for one shard; at most ",
                                                   kMaxIdsPerShardCall, " are accepted"));
  }
  size_t at = 0;
  for (size_t t = 0; t < rows.counts.size(); ++t) {
    const int64_t count = rows.counts[t];
    if (count < 0 || static_cast<size_t>(count) > rows.ids.size() - at) {
      return absl::InvalidArgumentError(absl::StrCat("table C", t + 1, ": a count of ", count,
                                                     " ids, but ", rows.ids.size() - at,
                                                     " ids are left"));
    }
    for (size_t i = at; i < at + count; ++i) {
      if (i > at && rows.ids[i] <= rows.ids[i - 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat("table C", t + 1,
                         ": ids must be strictly increasing (sorted, no "
                         "repeats); id ",
                         rows.ids[i], " follows ", rows.ids[i - 1]));
      }
      const int owner = EmbeddingShardOf(static_cast<int>(t), rows.ids[i], shape.bucket_count);
      if (owner != shape.bucket) {
        return absl::InvalidArgumentError(
            absl::StrCat("table C", t + 1, ": id ", rows.ids[i], " belongs to embedding shard ",
                         owner, " of ", shape.bucket_count, ", not ", shape.bucket));
      }
    }
    at += count;
  }
  if (at != rows.ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the counts add up to ", at, " ids, but ", rows.ids.size(), " were sent"));
  }
  return absl::OkStatus();
}

int64_t RowFloats(RowIdsView rows, absl::Span<const int> dims) {
  int64_t floats = 0;
  for (size_t t = 0; t < rows.counts.size(); ++t) floats += int64_t{rows.counts[t]} * dims[t];
  return floats;
}

namespace {

// MeanSparseGradients, over the workers' ids and gradients as `ids_of(w)` and
// `gradient_of(w)` give them. Each table's ids are a merge of the workers' ascending
// lists: one pass over them, the smallest head next, and each row summed from the
// workers holding its id in the order given. Linear in the ids for a fixed number of
// workers; nothing is allocated but the outputs (once each, at their largest size) for
// up to kInlineWorkers workers.
template <typename IdsOf, typename GradientOf>
void MeanOfSparse(size_t workers, const IdsOf& ids_of, const GradientOf& gradient_of,
                  absl::Span<const int> dims, int divisor, RowIds* mean_ids,
                  std::vector<float>* mean) {
  constexpr size_t kInlineWorkers = 16;
  const size_t tables = dims.size();
  size_t most_ids = 0, most_floats = 0;
  for (size_t w = 0; w < workers; ++w) {
    most_ids += ids_of(w).ids.size();
    most_floats += gradient_of(w).size();
  }
  mean_ids->counts.assign(tables, 0);
  mean_ids->ids.resize(most_ids);
  mean->assign(most_floats, 0.0f);
  // Each worker's next id and the first float of its row, and where its table ends.
  absl::InlinedVector<size_t, kInlineWorkers> next(workers, 0), table_end(workers, 0),
      float_at(workers, 0);
  size_t merged = 0;
  float* sum = mean->data();
  for (size_t t = 0; t < tables; ++t) {
    const size_t dim = static_cast<size_t>(dims[t]);
    for (size_t w = 0; w < workers; ++w) table_end[w] = next[w] + ids_of(w).counts[t];
    const size_t table_start = merged;
    while (true) {
      bool any = false;
      int64_t smallest = 0;
      for (size_t w = 0; w < workers; ++w) {
        if (next[w] == table_end[w]) continue;
        const int64_t id = ids_of(w).ids[next[w]];
        if (!any || id < smallest) smallest = id;
        any = true;
      }
      if (!any) break;
      mean_ids->ids[merged++] = smallest;
      for (size_t w = 0; w < workers; ++w) {
        if (next[w] == table_end[w] || ids_of(w).ids[next[w]] != smallest) continue;
        const float* row = gradient_of(w).data() + float_at[w];
        for (size_t e = 0; e < dim; ++e) sum[e] += row[e];
        ++next[w];
        float_at[w] += dim;
      }
      sum += dim;
    }
    mean_ids->counts[t] = static_cast<int32_t>(merged - table_start);
  }
  mean_ids->ids.resize(merged);
  mean->resize(static_cast<size_t>(sum - mean->data()));
  const float scale = 1.0f / static_cast<float>(divisor);
  for (float& x : *mean) x *= scale;
}

}  // namespace

void MeanSparseGradients(const std::vector<const RowIds*>& ids,
                         const std::vector<const std::vector<float>*>& gradients,
                         absl::Span<const int> dims, int divisor, RowIds* mean_ids,
                         std::vector<float>* mean) {
  MeanOfSparse(
      ids.size(), [&](size_t w) -> const RowIds& { return *ids[w]; },
      [&](size_t w) { return absl::MakeConstSpan(*gradients[w]); }, dims, divisor, mean_ids, mean);
}

void MeanSparseGradients(const std::vector<const CheckedRowIds*>& ids,
                         const std::vector<absl::Span<const float>>& gradients,
                         const EmbeddingShardShape& shape, int divisor, CheckedRowIds* mean_ids,
                         std::vector<float>* mean) {
  MeanOfSparse(
      ids.size(), [&](size_t w) -> const RowIds& { return ids[w]->rows(); },
      [&](size_t w) { return gradients[w]; }, shape.dims, divisor, &mean_ids->rows_, mean);
  mean_ids->MarkCheckedFor(shape);
}

absl::StatusOr<CheckedRowIds> CheckedRowIds::Check(RowIds rows, const EmbeddingShardShape& shape) {
  if (absl::Status fits = CheckRowIds(rows.view(), shape); !fits.ok()) return fits;
  CheckedRowIds checked;
  checked.rows_ = std::move(rows);
  checked.MarkCheckedFor(shape);
  return checked;
}

void CheckedRowIds::MarkCheckedFor(const EmbeddingShardShape& shape) {
  tables_ = shape.dims.size();
  bucket_ = shape.bucket;
  bucket_count_ = shape.bucket_count;
}

std::string EncodeIds(absl::Span<const int64_t> ids) {
  std::string bytes;
  AppendIds(ids, &bytes);
  return bytes;
}

void AppendIds(absl::Span<const int64_t> ids, std::string* out) {
  const size_t start = out->size();
  out->resize(start + ids.size() * sizeof(int64_t));
  char* bytes = out->data() + start;
#ifdef ABSL_IS_LITTLE_ENDIAN
  if (!ids.empty()) std::memcpy(bytes, ids.data(), ids.size() * sizeof(int64_t));
#else
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t v = static_cast<uint64_t>(ids[i]);
    for (int b = 0; b < 8; ++b) bytes[i * 8 + b] = static_cast<char>(v >> (8 * b));
  }
#endif
}

absl::StatusOr<std::vector<int64_t>> DecodeIds(absl::string_view bytes, int64_t max_ids) {
  if (bytes.size() % sizeof(int64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ids: ", bytes.size(), " bytes is not a whole number of int64 ids (8 bytes each)"));
  }
  const size_t count = bytes.size() / sizeof(int64_t);
  if (static_cast<int64_t>(count) > max_ids) {
    return absl::InvalidArgumentError(
        absl::StrCat(count, " ids; at most ", max_ids, " are accepted here"));
  }
  std::vector<int64_t> ids(count);
#ifdef ABSL_IS_LITTLE_ENDIAN
  if (count > 0) std::memcpy(ids.data(), bytes.data(), bytes.size());
#else
  for (size_t i = 0; i < count; ++i) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; --b) v = (v << 8) | static_cast<uint8_t>(bytes[i * 8 + b]);
    ids[i] = static_cast<int64_t>(v);
  }
#endif
  return ids;
}

absl::StatusOr<RowIds> RowIdsFromWire(absl::string_view ids, absl::Span<const int32_t> counts,
                                      const EmbeddingShardShape& shape) {
  RowIds rows;
  absl::StatusOr<std::vector<int64_t>> decoded = DecodeIds(ids);
  if (!decoded.ok()) return decoded.status();
  rows.ids = *std::move(decoded);
  rows.counts.assign(counts.begin(), counts.end());
  absl::Status fits = CheckRowIds(rows.view(), shape);
  if (!fits.ok()) return fits;
  return rows;
}

}  // namespace paramserver
