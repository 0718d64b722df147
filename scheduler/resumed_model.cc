#include "scheduler/resumed_model.h"

#include "absl/strings/str_cat.h"
#include "common/files/file_system.h"
#include "common/files/s3_file_system.h"
#include "common/model/model_declaration.h"

namespace paramserver {
namespace {

std::string DeclarationPath(const std::string& dir) {
  return absl::StrCat(dir, "/", kModelDeclarationFile);
}

}  // namespace

absl::Status SaveModelDeclaration(const std::string& dir, const ModelDeclaration& model) {
  const std::string path = DeclarationPath(dir);
  std::string bytes;
  if (!model.SerializeToString(&bytes))
    return absl::InternalError(absl::StrCat("cannot encode the model for ", path));
  return WriteFileAtomically(FileSystemFor(path), path, bytes);
}

absl::StatusOr<ModelDeclaration> LoadModelDeclaration(const std::string& dir) {
  const std::string path = DeclarationPath(dir);
  FileSystem& fs = FileSystemFor(path);
  absl::StatusOr<std::string> bytes = fs.ReadFile(path);
  if (!bytes.ok()) {
    if (absl::IsNotFound(bytes.status()) || !fs.FileExists(path)) {
      return absl::NotFoundError(
          absl::StrCat(path,
                       " is missing: a torch job records its model there when its first worker "
                       "declares it, and these checkpoints came without it"));
    }
    return absl::Status(bytes.status().code(),
                        absl::StrCat("cannot read ", path, ": ", bytes.status().message()));
  }
  ModelDeclaration model;
  if (!model.ParseFromString(*bytes)) {
    return absl::DataLossError(absl::StrCat(path, " is not a model declaration (", bytes->size(),
                                            " bytes that do not parse)"));
  }
  if (absl::Status valid = LayoutOfDeclaration(model).status(); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", valid.message()));
  }
  return model;
}

}  // namespace paramserver
