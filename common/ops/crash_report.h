// A daemon's crash report. On SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT the signal,
// the faulting address (or the sending process), and the stack of the thread it reached
// go to stderr (which every launcher keeps in the node's log); then the process dies of
// the signal (raised again) as it would have, and supervisors see the exit they always
// did. A report that cannot
// finish in 10 s (a stderr pipe nobody reads) ends in SIGALRM; a second crash inside a
// report ends the process at once.
//
// The stack comes from glibc's backtrace(), which unwinds by the DWARF tables and so
// needs no frame pointers (Abseil's failure handler, which walks frame pointers, finds
// one frame in these builds). A frame of the daemon itself prints as
// "/path/ps_server(+0x1a2b3c) [0x...]": `addr2line -Cfe /path/ps_server 0x1a2b3c` names
// its function (and its line, in a build with -g). Not covered: a thread that overflowed
// its own stack (no alternate stack is set up for every thread gRPC starts).
#ifndef PARAMSERVER_COMMON_OPS_CRASH_REPORT_H_
#define PARAMSERVER_COMMON_OPS_CRASH_REPORT_H_

namespace paramserver {

// Installs the report's handler for the signals above. Call once, early in main() and
// before any thread starts; later calls change nothing.
void InstallCrashReport();

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_OPS_CRASH_REPORT_H_
