// Shared by the C tests that count failed checks: CHECK(cond, printf-args) prints
// "FAIL file:line: message" and counts it in `failures` (every check in `checks`); the test
// returns non-zero when failures > 0. (Included once per test program.)
#ifndef CLLA_TESTS_LIB_CHECK_H
#define CLLA_TESTS_LIB_CHECK_H

#include <stdio.h>

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        checks++;                                                 \
        if (!(cond)) {                                            \
            failures++;                                           \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);           \
            printf(__VA_ARGS__);                                  \
            printf("\n");                                         \
        }                                                         \
    } while (0)

#endif
