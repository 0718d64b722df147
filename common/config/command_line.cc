#include "common/config/command_line.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace paramserver {
namespace {

// Abseil's flags, and those of any other library, are defined in files under absl/ (or
// wherever that library's sources lay); ours in the packages of this repository.
bool DefinedHere(absl::string_view filename) {
  for (absl::string_view package :
       {"common/", "ps/", "worker/", "scheduler/", "psctl/", "tools/", "bench/", "python/"}) {
    if (absl::StartsWith(filename, package)) return true;
  }
  return false;
}

bool AsksForHelp(absl::string_view argument) {
  return argument == "--help" || argument == "-help" || argument == "-h";
}

}  // namespace

std::string HelpText(absl::string_view program, absl::string_view usage) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (DefinedHere(flag->Filename())) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  std::string text = absl::StrCat(program, ": ", usage, "\n\nflags:\n");
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string default_value = flag->DefaultValue();
    absl::StrAppend(&text, "  --", flag->Name(),
                    " (default: ", default_value.empty() ? "\"\"" : default_value, ")\n      ",
                    flag->Help(), "\n");
  }
  return text;
}

void ParseCommandLineWithHelp(int argc, char** argv, absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  for (int i = 1; i < argc; ++i) {
    if (absl::string_view(argv[i]) == "--") break;  // the rest are positional
    if (AsksForHelp(argv[i])) {
      absl::string_view program = argv[0];
      if (const size_t slash = program.rfind('/'); slash != absl::string_view::npos)
        program.remove_prefix(slash + 1);
      std::fputs(HelpText(program, usage).c_str(), stdout);
      std::fflush(stdout);
      std::exit(0);
    }
  }
  absl::ParseCommandLine(argc, argv);
}

}  // namespace paramserver
