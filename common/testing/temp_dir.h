// A fresh temporary folder for one test, removed with everything in it on destruction.
#ifndef PARAMSERVER_COMMON_TESTING_TEMP_DIR_H_
#define PARAMSERVER_COMMON_TESTING_TEMP_DIR_H_

#include <string>

namespace paramserver {

// Not thread-safe; one per test. Created under $TEST_TMPDIR (Bazel) or /tmp.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(const std::string& name) const;
  // Writes `contents` to File(name) and returns its path.
  std::string WriteFile(const std::string& name, const std::string& contents) const;
  // As WriteFile, readable by this user only (0600), as a secret must be.
  std::string WriteSecretFile(const std::string& name, const std::string& contents) const;

 private:
  std::string path_;
};

// The whole of file `path`, or "" if it cannot be read (a test then fails on what it
// expected to find in it).
std::string ReadFileOrEmpty(const std::string& path);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_TESTING_TEMP_DIR_H_
