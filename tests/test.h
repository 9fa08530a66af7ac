/* A small test framework: TEST(name) { ... } registers a test at load time (constructor), the runner
 * (tests/test_main.c) runs them all, or those whose name contains argv[1], and ends with
 * "N passed, N failed". Assertions record the failure with file:line and return from the test. */
#ifndef K3C_TESTS_TEST_H
#define K3C_TESTS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A fresh per-run seed (time-based unless K3C_TEST_SEED is set); printed on failure so a run can be replayed. */
uint64_t test_seed(void);
/* The directory holding the test binary (BUILD-dependent), for files built beside it. */
const char *test_exe_dir(void);
/* Writes the path of the k3c CLI built next to the test binary; 0 when it is not there (or does not fit). */
int test_k3c_binary(char *out, size_t n);
/* Reads exactly n floats from a file of exactly that size: 0, or -1 (missing, short or longer file). */
int test_read_f32(const char *path, float *out, size_t n);
/* Runs a shell command; its exit status, or -1 when it did not exit normally. */
int test_run_status(const char *cmd);
/* A scratch directory for this test run (removed at the end unless K3C_TEST_KEEP is set). */
const char *test_tmpdir(void);

#define TEST(name)                                                                                                 \
    static void test_##name(void);                                                                                 \
    __attribute__((constructor)) static void register_##name(void) { test_register(#name, test_##name); }          \
    static void test_##name(void)

#define CHECK(cond)                                                                                                \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);                                                     \
            return;                                                                                                \
        }                                                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                                                          \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            test_fail(__FILE__, __LINE__, __VA_ARGS__);                                                            \
            return;                                                                                                \
        }                                                                                                          \
    } while (0)

/* A library call that must succeed (K3C_OK); the failure prints the library's error message. */
#define CHECK_OK(expr)                                                                                             \
    do {                                                                                                           \
        if ((expr) != 0) {                                                                                         \
            test_fail(__FILE__, __LINE__, "%s failed: %s", #expr, k3c_error_message());                            \
            return;                                                                                                \
        }                                                                                                          \
    } while (0)

/* |a - b| <= atol + rtol * |b|, and never NaN. */
#define CHECK_CLOSE(a, b, atol, rtol)                                                                              \
    do {                                                                                                           \
        double a_ = (a), b_ = (b);                                                                                 \
        if (!(fabs(a_ - b_) <= (atol) + (rtol) * fabs(b_))) {                                                      \
            test_fail(__FILE__, __LINE__, "%s = %.9g, %s = %.9g", #a, a_, #b, b_);                                 \
            return;                                                                                                \
        }                                                                                                          \
    } while (0)

/* Relative L2 error ||x - ref|| / ||ref|| over n floats/doubles; NaN anywhere gives +inf. */
double rel_l2_f32(const float *x, const double *ref, size_t n);
double rel_l2_f32f32(const float *x, const float *ref, size_t n);
/* Fills with a NaN pattern so unwritten outputs are caught. */
void poison_f32(float *x, size_t n);

#endif
