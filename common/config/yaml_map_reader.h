// A reader of one YAML mapping that remembers which keys were read, so that the rest
// can be reported as unknown, and names every problem by file, line and dotted key.
#ifndef PARAMSERVER_COMMON_CONFIG_YAML_MAP_READER_H_
#define PARAMSERVER_COMMON_CONFIG_YAML_MAP_READER_H_

#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace paramserver {

// Walks one YAML mapping, converting its scalars and remembering which keys were read
// so that leftovers can be reported as unknown. Errors start "source:line: " (none
// with an empty source). yaml-cpp throws; this adapter is the
// only place its exceptions are caught and turned into statuses.
class YamlMapReader {
 public:
  YamlMapReader(const YAML::Node& node, std::string path, std::string source)
      : node_(node), path_(std::move(path)), source_(std::move(source)) {}

  absl::Status CheckIsMap() const {
    if (!node_.IsMap()) return Error(node_, path_, "must be a mapping of keys to values");
    return absl::OkStatus();
  }

  // Sub-mapping `key`; absent keys yield a reader over an empty map.
  absl::StatusOr<YamlMapReader> Section(const std::string& key) {
    YAML::Node child = Take(key);
    YamlMapReader reader(child ? child : YAML::Node(YAML::NodeType::Map), Join(key), source_);
    PS_RETURN_IF_ERROR(reader.CheckIsMap());
    return reader;
  }

  template <typename T>
  absl::Status Read(const std::string& key, T* value) {
    YAML::Node child = Take(key);
    if (!child || child.IsNull()) return absl::OkStatus();  // keep the default
    if (!child.IsScalar()) return Error(child, Join(key), "must be a single value");
    try {
      *value = child.as<T>();
    } catch (const YAML::Exception&) {
      return Error(child, Join(key),
                   absl::StrCat("must be ", TypeName<T>(), ", got '", child.Scalar(), "'"));
    }
    return absl::OkStatus();
  }

  absl::Status ReadList(const std::string& key, std::vector<int64_t>* values) {
    YAML::Node child = Take(key);
    if (!child || child.IsNull()) return absl::OkStatus();
    if (!child.IsSequence()) return Error(child, Join(key), "must be a list of integers");
    values->clear();
    for (const YAML::Node& item : child) {
      try {
        values->push_back(item.as<int64_t>());
      } catch (const YAML::Exception&) {
        return Error(item, Join(key),
                     absl::StrCat("must be a list of integers, got '",
                                  item.IsScalar() ? item.Scalar() : "?", "'"));
      }
    }
    return absl::OkStatus();
  }

  // The mappings of list `key`, each read by a reader named "key[i]"; none if absent.
  absl::StatusOr<std::vector<YamlMapReader>> SectionList(const std::string& key) {
    YAML::Node child = Take(key);
    std::vector<YamlMapReader> readers;
    if (!child || child.IsNull()) return readers;
    if (!child.IsSequence()) return Error(child, Join(key), "must be a list of mappings");
    for (size_t i = 0; i < child.size(); ++i) {
      YamlMapReader reader(child[i], absl::StrCat(Join(key), "[", i, "]"), source_);
      PS_RETURN_IF_ERROR(reader.CheckIsMap());
      readers.push_back(std::move(reader));
    }
    return readers;
  }

  // A scalar or a list of scalars, as strings (`what` names one in errors).
  absl::Status ReadStringList(const std::string& key, std::vector<std::string>* values,
                              const std::string& what = "file") {
    YAML::Node child = Take(key);
    if (!child || child.IsNull()) return absl::OkStatus();
    values->clear();
    if (child.IsScalar()) {
      values->push_back(child.Scalar());
      return absl::OkStatus();
    }
    if (!child.IsSequence())
      return Error(child, Join(key), absl::StrCat("must be a ", what, " or a list of them"));
    for (const YAML::Node& item : child) {
      if (!item.IsScalar())
        return Error(item, Join(key), absl::StrCat("must be a list of ", what, "s"));
      values->push_back(item.Scalar());
    }
    return absl::OkStatus();
  }

  // A count given as one integer (`key: 3`: min = max = 3) or a range
  // (`key: {min: 2, max: 6}`; a missing max is min). Leaves both unchanged when absent.
  absl::Status ReadCountRange(const std::string& key, int* min, int* max) {
    YAML::Node child = Take(key);
    if (!child || child.IsNull()) return absl::OkStatus();
    if (child.IsScalar()) {
      try {
        *min = *max = child.as<int>();
      } catch (const YAML::Exception&) {
        return Error(
            child, Join(key),
            absl::StrCat("must be an integer or {min: N, max: M}, got '", child.Scalar(), "'"));
      }
      return absl::OkStatus();
    }
    if (!child.IsMap()) return Error(child, Join(key), "must be an integer or {min: N, max: M}");
    YamlMapReader range(child, Join(key), source_);
    int low = *min;
    PS_RETURN_IF_ERROR(range.Read("min", &low));
    int high = low;
    PS_RETURN_IF_ERROR(range.Read("max", &high));
    PS_RETURN_IF_ERROR(range.CheckNoUnknownKeys());
    if (!range.Has("min")) return range.ErrorAt("min", "a range needs its min");
    *min = low;
    *max = high;
    return absl::OkStatus();
  }

  // Whether `key` is given (not null), without reading it.
  bool Has(const std::string& key) const {
    const YAML::Node& node = node_;
    return node.IsMap() && node[key] && !node[key].IsNull();
  }

  // The mapping's keys, in the file's order (reading none of them).
  std::vector<std::string> Keys() const {
    std::vector<std::string> keys;
    if (!node_.IsMap()) return keys;
    for (const auto& entry : node_) keys.push_back(entry.first.Scalar());
    return keys;
  }

  // OK when `ok`, else ErrorAt(key, problem).
  absl::Status Require(bool ok, const std::string& key, const std::string& problem) const {
    return ok ? absl::OkStatus() : ErrorAt(key, problem);
  }

  // An error about `key` (which must have been read) at its line.
  absl::Status ErrorAt(const std::string& key, const std::string& problem) const {
    YAML::Node child = node_[key];
    return Error(child ? child : node_, Join(key), problem);
  }

  absl::Status CheckNoUnknownKeys() const {
    for (const auto& entry : node_) {
      std::string key = entry.first.Scalar();
      if (read_keys_.count(key) == 0) {
        return Error(
            entry.first, Join(key),
            absl::StrCat("unknown key (known keys here: ", absl::StrJoin(read_keys_, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Error(const YAML::Node& at, const std::string& key,
                     const std::string& problem) const {
    const std::string where = key.empty() ? "(top level)" : key;
    // Without a source (a mapping that came from no file) the caller places the error.
    if (source_.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", problem));
    std::string line = at.Mark().line >= 0 ? absl::StrCat(at.Mark().line + 1) : "?";
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", line, ": ", where, ": ", problem));
  }

 private:
  template <typename T>
  static const char* TypeName() {
    if (std::is_same<T, bool>::value) return "true or false";
    if (std::is_integral<T>::value) return "an integer";
    if (std::is_floating_point<T>::value) return "a number";
    return "a string";
  }

  YAML::Node Take(const std::string& key) {
    read_keys_.insert(key);
    if (!node_.IsMap()) return YAML::Node();
    return node_[key];
  }

  std::string Join(const std::string& key) const {
    return path_.empty() ? key : absl::StrCat(path_, ".", key);
  }

  YAML::Node node_;
  std::string path_;
  std::string source_;
  std::set<std::string> read_keys_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CONFIG_YAML_MAP_READER_H_
