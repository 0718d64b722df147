#include "common/testing/temp_dir.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "common/files/file_system.h"

namespace paramserver {

TempDir::TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/ps_test_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + pattern);
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::File(const std::string& name) const { return path_ + "/" + name; }

std::string TempDir::WriteFile(const std::string& name, const std::string& contents) const {
  const std::string path = File(name);
  // Tests that write a file expect it there: a failure is a broken test machine.
  if (!WriteFileAtomically(LocalFileSystem(), path, contents).ok()) std::abort();
  return path;
}

std::string TempDir::WriteSecretFile(const std::string& name, const std::string& contents) const {
  const std::string path = File(name);
  if (!WriteFileAtomically(LocalFileSystem(), path, contents, FileAccess::kOwnerOnly).ok())
    std::abort();
  return path;
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace paramserver
