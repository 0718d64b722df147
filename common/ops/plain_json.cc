#include "common/ops/plain_json.h"

#include <cctype>
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace paramserver {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// "NodeHealth" -> "NODE_HEALTH_".
std::string EnumPrefix(const std::string& type_name) {
  std::string prefix;
  for (size_t i = 0; i < type_name.size(); ++i) {
    const char c = type_name[i];
    if (i > 0 && std::isupper(static_cast<unsigned char>(c))) prefix += '_';
    prefix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return prefix + "_";
}

void AppendString(const std::string& text, std::string* out) {
  *out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          *out += c;
        }
    }
  }
  *out += '"';
}

void AppendDouble(double value, std::string* out) {
  if (!std::isfinite(value)) {
    *out += "null";
    return;
  }
  // %.17g round-trips a double; trim to the shortest that still does.
  for (int digits = 6; digits <= 17; ++digits) {
    const std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::stod(text) == value || digits == 17) {
      *out += text;
      return;
    }
  }
}

class Writer {
 public:
  explicit Writer(bool indent) : indent_(indent) {}

  void Message(const google::protobuf::Message& message, int depth) {
    const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
    const Reflection* reflection = message.GetReflection();
    out_ += '{';
    for (int i = 0; i < descriptor->field_count(); ++i) {
      const FieldDescriptor* field = descriptor->field(i);
      if (i > 0) out_ += ',';
      NewLine(depth + 1);
      AppendString(field->name(), &out_);
      out_ += indent_ ? ": " : ":";
      if (field->is_repeated()) {
        const int size = reflection->FieldSize(message, field);
        out_ += '[';
        for (int k = 0; k < size; ++k) {
          if (k > 0) out_ += ',';
          NewLine(depth + 2);
          Value(message, field, k, depth + 2);
        }
        if (size > 0) NewLine(depth + 1);
        out_ += ']';
      } else {
        Value(message, field, -1, depth + 1);
      }
    }
    if (descriptor->field_count() > 0) NewLine(depth);
    out_ += '}';
  }

  std::string Take() { return std::move(out_); }

 private:
  void NewLine(int depth) {
    if (!indent_) return;
    out_ += '\n';
    out_.append(2 * depth, ' ');
  }

  // One value of `field`: element `index` of a repeated field, or the field (-1).
  void Value(const google::protobuf::Message& message, const FieldDescriptor* field, int index,
             int depth) {
    const Reflection* r = message.GetReflection();
    const bool repeated = index >= 0;
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        absl::StrAppend(&out_, repeated ? r->GetRepeatedInt32(message, field, index)
                                        : r->GetInt32(message, field));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        absl::StrAppend(&out_, repeated ? r->GetRepeatedInt64(message, field, index)
                                        : r->GetInt64(message, field));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        absl::StrAppend(&out_, repeated ? r->GetRepeatedUInt32(message, field, index)
                                        : r->GetUInt32(message, field));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        absl::StrAppend(&out_, repeated ? r->GetRepeatedUInt64(message, field, index)
                                        : r->GetUInt64(message, field));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        AppendDouble(
            repeated ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field),
            &out_);
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        AppendDouble(
            repeated ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field),
            &out_);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        out_ += (repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field))
                    ? "true"
                    : "false";
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        AppendString(EnumWord(repeated ? *r->GetRepeatedEnum(message, field, index)
                                       : *r->GetEnum(message, field)),
                     &out_);
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        // Bytes fields are not part of any status message; they print as text too.
        AppendString(
            repeated ? r->GetRepeatedString(message, field, index) : r->GetString(message, field),
            &out_);
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        Message(
            repeated ? r->GetRepeatedMessage(message, field, index) : r->GetMessage(message, field),
            depth);
        break;
    }
  }

  const bool indent_;
  std::string out_;
};

}  // namespace

std::string EnumWord(const google::protobuf::EnumValueDescriptor& value) {
  return absl::AsciiStrToLower(absl::StripPrefix(value.name(), EnumPrefix(value.type()->name())));
}

std::string PlainJson(const google::protobuf::Message& message, bool indent) {
  Writer writer(indent);
  writer.Message(message, 0);
  return writer.Take();
}

}  // namespace paramserver
