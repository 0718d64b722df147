// A daemon's crash report. On SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT the signal, the
// faulting address and the crashing thread's stack go to stderr (which every launcher
// keeps in the node's log), then the process dies of the signal as it would have, so
// exit statuses, core dumps and supervisors see what they always did.
//
// The stack comes from glibc's backtrace(), which unwinds by the DWARF tables and so
// needs no frame pointers (Abseil's failure handler, which walks frame pointers, finds
// one frame in these builds). A frame of the daemon itself prints as
// "/path/ps_server(+0x1a2b3c) [0x...]": `addr2line -Cfie /path/ps_server 0x1a2b3c` names
// the function and line. Not covered: a thread that overflowed its own stack (no
// alternate stack is set up for every thread gRPC starts).
#ifndef PARAMSERVER_COMMON_OPS_CRASH_REPORT_H_
#define PARAMSERVER_COMMON_OPS_CRASH_REPORT_H_

namespace paramserver {

// Installs the report's handler for the signals above. Call once, early in main() and
// before any thread starts; later calls change nothing.
void InstallCrashReport();

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_OPS_CRASH_REPORT_H_
