// Every binary's command line: Abseil's flags, with a `--help` that answers the user.
// Abseil's own `--help` lists only flags defined in a file named like the program's main,
// so for our binaries (whose flags live in common/ and the mains) it prints "No flags
// matched" and exits 1; this prints the program's usage and its own flags, and exits 0.
#ifndef PARAMSERVER_COMMON_CONFIG_COMMAND_LINE_H_
#define PARAMSERVER_COMMON_CONFIG_COMMAND_LINE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace paramserver {

// Parses the command line as absl::ParseCommandLine does (an unknown flag or a bad value:
// a message naming it on stderr, exit 1), after two things of its own:
//  - `usage` becomes the program's usage message: what the program is, without its name
//    (Abseil's --helpfull and this --help put "NAME: " before it), then "usage: ..." lines;
//  - `--help`, `-help` or `-h` anywhere on the line prints HelpText(NAME, usage), NAME
//    being argv[0]'s last component, to stdout and exits 0, reading no other argument.
// Abseil's other help flags (--helpfull, --helpon=..., --version) work as Abseil has them.
// Call once, first thing in main().
void ParseCommandLineWithHelp(int argc, char** argv, absl::string_view usage);

// "PROGRAM: " and `usage`, a blank line, then "flags:" and every flag defined in this repository's
// files (not Abseil's own), sorted by name, each as "  --NAME (default: VALUE)" and its help text
// on the next line, indented. Pure but for reading the registered flags.
std::string HelpText(absl::string_view program, absl::string_view usage);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CONFIG_COMMAND_LINE_H_
