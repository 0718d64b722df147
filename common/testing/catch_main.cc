// The main() of every Catch2 (v2, Debian's catch2 package) test binary.
//
// Under a sanitizer, Catch2 installs no signal handlers: its handler allocates, which
// ThreadSanitizer reports (and halts on) in place of the crash itself, so a test that
// crashes would say neither its signal nor where. The sanitizer's own handler prints both.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define CATCH_CONFIG_NO_POSIX_SIGNALS
#endif
#endif
#define CATCH_CONFIG_MAIN
#include "catch2/catch.hpp"
