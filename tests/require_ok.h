#ifndef HARRIER_TESTS_REQUIRE_OK_H_
#define HARRIER_TESTS_REQUIRE_OK_H_

#include <catch2/catch.hpp>

#include "absl/status/status.h"

// REQUIRE that an absl::Status is OK, showing the status when it is not.
#define REQUIRE_OK(expr)                 \
  do {                                   \
    const absl::Status status_ = (expr); \
    INFO(status_.ToString());            \
    REQUIRE(status_.ok());               \
  } while (false)

#endif  // HARRIER_TESTS_REQUIRE_OK_H_
