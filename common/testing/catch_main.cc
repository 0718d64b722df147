// The main() of every Catch2 (v2, Debian's catch2 package) test binary.
#define CATCH_CONFIG_MAIN
#include "catch2/catch.hpp"
