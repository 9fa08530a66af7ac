#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "util/error.h"

typedef struct {
    const char *name;
    test_fn fn;
} test_case;

static test_case *cases;
static size_t num_cases, cap_cases;
static int current_failed;
static uint64_t run_seed;
static char tmpdir[256];

void test_register(const char *name, test_fn fn) {
    if (num_cases == cap_cases) {
        cap_cases = cap_cases ? 2 * cap_cases : 64;
        cases = realloc(cases, cap_cases * sizeof *cases);
        if (!cases) abort();
    }
    cases[num_cases++] = (test_case){name, fn};
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    current_failed = 1;
}

int test_read_f32(const char *path, float *out, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t got = fread(out, sizeof *out, n, f);
    int extra = fgetc(f);
    fclose(f);
    return got == n && extra == EOF ? 0 : -1;
}

int test_run_status(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

uint64_t test_seed(void) { return run_seed; }

const char *test_exe_dir(void) {
    static char dir[PATH_MAX];
    if (!dir[0]) {
        ssize_t len = readlink("/proc/self/exe", dir, sizeof dir - 1);
        if (len <= 0) return ".";
        dir[len] = '\0';
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
    }
    return dir;
}

int test_k3c_binary(char *out, size_t n) {
    if ((size_t)snprintf(out, n, "%s/k3c", test_exe_dir()) >= n) return 0;
    return access(out, X_OK) == 0;
}
const char *test_tmpdir(void) { return tmpdir; }

double rel_l2_f32(const float *x, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isnan(ref[i])) return INFINITY;
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double rel_l2_f32f32(const float *x, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isnan(ref[i])) return INFINITY;
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

void poison_f32(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const test_case *)a)->name, ((const test_case *)b)->name);
}

/* Whether a test runs: no filters, or any filter matches. A filter is a substring of the name, or with a
 * leading '=' the whole name (tools/gpu-check.sh shards the GPU suite by exact names). */
static int selected(const char *name, char **filters, int nf) {
    if (nf == 0) return 1;
    for (int i = 0; i < nf; i++)
        if (filters[i][0] == '=' ? strcmp(name, filters[i] + 1) == 0 : strstr(name, filters[i]) != NULL) return 1;
    return 0;
}

int main(int argc, char **argv) {
    /* usage: [--list] [FILTER ...]; --list prints the selected tests' names, one a line, and runs none */
    int list = argc > 1 && strcmp(argv[1], "--list") == 0;
    char **filters = argv + 1 + list;
    int nf = argc - 1 - list;
    if (list) {
        qsort(cases, num_cases, sizeof *cases, by_name);
        for (size_t i = 0; i < num_cases; i++)
            if (selected(cases[i].name, filters, nf)) printf("%s\n", cases[i].name);
        return 0;
    }
    const char *seed_env = getenv("K3C_TEST_SEED");
    run_seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/k3c-test-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    printf("k3c tests, seed %llu (K3C_TEST_SEED to replay), scratch %s\n", (unsigned long long)run_seed, tmpdir);
    qsort(cases, num_cases, sizeof *cases, by_name);
    int passed = 0, failed = 0;
    for (size_t i = 0; i < num_cases; i++) {
        if (!selected(cases[i].name, filters, nf)) continue;
        current_failed = 0;
        k3c_error_clear();
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        printf("%-60s ", cases[i].name);
        fflush(stdout);
        cases[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
        printf("%s (%.2fs)\n", current_failed ? "FAIL" : "ok", secs);
        fflush(stdout);
        if (current_failed) failed++;
        else passed++;
    }
    if (!getenv("K3C_TEST_KEEP")) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    if (failed) printf("failed with seed %llu\n", (unsigned long long)run_seed);
    printf("%d passed, %d failed\n", passed, failed);
    /* a filter that selects nothing (a typo, a renamed test) must not read as a green run */
    if (passed + failed == 0) {
        fprintf(stderr, "no test matches");
        for (int i = 0; i < nf; i++) fprintf(stderr, " '%s'", filters[i]);
        fprintf(stderr, " (--list shows the names)\n");
        return 1;
    }
    return failed ? 1 : 0;
}
