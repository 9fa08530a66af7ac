/* The k3c command as a hostile user meets it: failed cache allocations, write errors, bad option values,
 * signals during the implicit synthesis, leftovers. Each case runs build/k3c (or a tool) as a child and checks
 * its exit status, its message and what it left behind. The crash cases also run under ASan + UBSan
 * (`make asan-test`). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs `k3c ARGS` through the shell with stdout to `out` (a redirection, e.g. ">/dev/null") and stderr into
 * *err (malloc'd, NUL-terminated): the exit status, -1 when killed by a signal. */
static int run_k3c(const char *args, const char *out, char **err) {
    char bin[PATH_MAX], errf[PATH_MAX], cmd[3 * PATH_MAX + 8192];
    *err = NULL;
    if (!test_k3c_binary(bin, sizeof bin)) return -2;
    snprintf(errf, sizeof errf, "%s/cli_stderr.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' %s 2>'%s' %s", bin, args, errf, out);
    int st = test_run_status(cmd);
    FILE *f = fopen(errf, "rb");
    size_t cap = 1 << 16, n = 0;
    char *buf = calloc(cap + 1, 1);
    if (f && buf) n = fread(buf, 1, cap, f);
    if (buf) buf[n] = 0;
    if (f) fclose(f);
    *err = buf;
    return st;
}

/* Entries of a directory other than . and .. (-1: cannot open). */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* A tiny checkpoint synthesized once by the CLI into the scratch directory. */
static const char *tiny_dir(void) {
    static char dir[PATH_MAX];
    if (dir[0]) return dir;
    char bin[PATH_MAX], cmd[3 * PATH_MAX];
    snprintf(dir, sizeof dir, "%s/cli_tiny", test_tmpdir());
    if (!test_k3c_binary(bin, sizeof bin)) return NULL;
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --out '%s' --seed %llu >/dev/null 2>&1", bin, dir,
             (unsigned long long)(test_seed() % 1000));
    if (test_run_status(cmd) != 0) {
        dir[0] = 0;
        return NULL;
    }
    return dir;
}

/* The crash commands (a failed cache allocation: double free, exit 134, or a segfault) now end with a
 * message: generate past the model's context is refused before anything is reserved; runs whose caches
 * exceed the memory limit are refused by the memory plan, naming the options. */
TEST(hardening_cli_cache_allocation_crash_cases) {
    char *err;
    double t = now_s();
    int st = run_k3c("generate -n 20000000", ">/dev/null", &err);
    t = now_s() - t;
    CHECKF(st == 1 && strstr(err, "context length of 1048576") && strstr(err, "-n 20000000"),
           "generate -n 20000000: exit %d: %s", st, err);
    CHECKF(t < 20, "generate -n 20000000 took %.1f s to refuse", t);
    free(err);
    /* 64 prompts keep 64 requests: 64 x 1M tokens of cache against a 1 GiB limit */
    char args[1024] = "run --max-requests 64 -n 1000000 --memory-limit 1G --prompts '1";
    for (int i = 1; i < 64; i++) strcat(args, ";1");
    strcat(args, "'");
    st = run_k3c(args, ">/dev/null", &err);
    CHECKF(st == 1 && strstr(err, "max_requests 64 x max_context 1000000") && strstr(err, "--memory-limit") &&
               strstr(err, "1.00 GiB"),
           "run 64 x 1M: exit %d: %s", st, err);
    free(err);
    st = run_k3c("run --prompts 1,2 --max-requests 4096 -n 100000 --memory-limit 64M", ">/dev/null", &err);
    CHECKF(st == 1 && strstr(err, "memory limit of 64.00 MiB") && strstr(err, "--max-requests"),
           "run --max-requests 4096: exit %d: %s", st, err);
    free(err);
    st = run_k3c("run --prompts 1,2 --max-requests 4096 -n 1073741824", ">/dev/null", &err);
    CHECKF(st == 1 && strstr(err, "context length"), "run -n 2^30: exit %d: %s", st, err);
    free(err);
}

/* The memory plan says what it reserved, for how many requests and tokens, on stderr at start. */
TEST(hardening_cli_memory_plan_line) {
    char *err;
    int st = run_k3c("generate -n 3 --prompt-ids 1,2", ">/dev/null", &err);
    CHECKF(st == 0 && strstr(err, "k3c generate: reserved ") && strstr(err, "1 request x 4 tokens"),
           "exit %d: %s", st, err);
    free(err);
    st = run_k3c("run --prompts '1;2,3' -n 2 --max-requests 8 --max-context 40", ">/dev/null", &err);
    CHECKF(st == 0 && strstr(err, "k3c run: reserved ") && strstr(err, "2 requests x 40 tokens"), "exit %d: %s",
           st, err);
    free(err);
    st = run_k3c("generate -n 8 --max-context 4", ">/dev/null", &err);
    CHECKF(st == 2 && strstr(err, "-n 8 with a 1-token prompt needs a context of 8 tokens, more than --max-context 4"),
           "exit %d: %s", st, err);
    free(err);
}

/* Every numeric option's error names the option and its range, at parse time (before any model loads: the
 * memory plan's line never appears); --top-k / --top-p without a temperature are refused. */
TEST(hardening_cli_option_errors_name_the_option) {
    static const struct {
        const char *args, *expect;
    } cases[] = {
        {"generate -n -1", "-n: '-1' is not an integer in 0..1073741824"},
        {"generate -n", "-n needs a value"},
        {"generate -n 12x", "-n: '12x' is not an integer"},
        {"generate --temperature 1e39", "--temperature: '1e39' is not a number in [0, "},
        {"generate --temperature -0.5", "--temperature: '-0.5'"},
        {"generate --temperature nan", "--temperature: 'nan'"},
        {"generate --top-k 5", "--top-k 5 filters sampled tokens: it needs --temperature T > 0"},
        {"generate --top-p 0.9 --temperature 0", "--top-p 0.9 filters sampled tokens"},
        {"generate --temperature 1 --top-p 1.5", "--top-p: '1.5' is not a number in (0, 1]"},
        {"generate --temperature 1 --top-k -2", "--top-k: '-2' is not an integer in 0.."},
        {"generate --seed -1", "--seed: '-1' is not an integer in 0..18446744073709551615"},
        {"generate --threads 99999", "--threads: '99999' is not an integer in 0..4096"},
        {"generate --max-context 0", "--max-context: '0' is not an integer in 1.."},
        {"generate --memory-limit 12Q", "--memory-limit: '12Q' is not a size"},
        {"generate --device gpu", "--device: 'gpu' is not cpu or cuda"},
        {"generate --kv-cache fp4", "--kv-cache: 'fp4' is not bf16 or fp8"},
        {"generate --model ''", "--model: an empty value"},
        {"generate --bogus", "unexpected argument '--bogus'"},
        {"run --prompts 1 -n 0", "-n: '0' is not an integer in 1..1073741824"},
        {"run --prompts 1 --max-requests 0", "--max-requests: '0' is not an integer in 1..4096"},
        {"run --prompts 1 --spec 65", "--spec: '65' is not an integer in 0..64"},
        {"run --prompts 1 --stop -3", "--stop: '-3' is not an integer in 0.."},
        {"run --prompts 1 --top-k 3", "--top-k 3 filters sampled tokens"},
        {"logits --model x --prompt-ids 1 --prefill 0 --out y", "--prefill: '0' is not an integer in 1.."},
        {"synth --preset tiny --out x --seed -4", "--seed: '-4' is not an integer in 0.."},
        {"bench --steps 0", "--steps: '0' is not an integer in 1..100000"},
        {"bench --threads x", "--threads: 'x' is not an integer in 0..4096"},
        {"bench --runs 0", "--runs: '0' is not an integer in 1..1000"},
        {"bench --model x --device cuda", "--model x: only the cpu rows (decode and prefill) measure a checkpoint folder"},
        {"bench --model x --preset tiny", "--model x and --preset tiny: give one of them"},
        {"bench --model ''", "--model: an empty value"},
        {"bench --prefix 16 --tp 2", "not with --prefix"},
        {"bench --preset tiny --tp 2 --world-size 2 --rendezvous x", "not with --prefix"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *err;
        int st = run_k3c(cases[i].args, ">/dev/null", &err);
        CHECKF(st == 2 && strstr(err, cases[i].expect) && !strstr(err, "reserved"),
               "k3c %s: exit %d, stderr \"%s\" lacks \"%s\"", cases[i].args, st, err, cases[i].expect);
        free(err);
    }
}

/* Segment k of --prompts is request k: an empty segment is refused with its number, never dropped. */
TEST(hardening_cli_empty_prompt_segments) {
    static const struct {
        const char *prompts, *expect;
    } cases[] = {
        {"1;;2", "segment 2 (request 1) is empty"},
        {"1;2;", "segment 3 (request 2) is empty"},
        {";1", "segment 1 (request 0) is empty"},
        {"", "--prompts: an empty value"},
        {"1;x", "segment 2 (request 1) 'x' is not a comma-separated list"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[256], *err;
        snprintf(args, sizeof args, "run -n 1 --prompts '%s'", cases[i].prompts);
        int st = run_k3c(args, ">/dev/null", &err);
        CHECKF(st == 2 && strstr(err, cases[i].expect), "k3c %s: exit %d: %s", args, st, err);
        free(err);
    }
    /* the numbering holds: three segments, three requests in order */
    char bin[PATH_MAX], out[PATH_MAX], cmd[3 * PATH_MAX];
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(out, sizeof out, "%s/cli_prompts.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' run -n 1 --prompts '5;6,7;8' >'%s' 2>/dev/null", bin, out);
    CHECK(test_run_status(cmd) == 0);
    FILE *f = fopen(out, "r");
    CHECK(f);
    char line[256];
    int k = 0, lens[3] = {1, 2, 1};
    while (fgets(line, sizeof line, f)) {
        char want[64];
        snprintf(want, sizeof want, "request %d (%d prompt tokens):", k, k < 3 ? lens[k] : -1);
        CHECKF(k < 3 && !strncmp(line, want, strlen(want)), "line %d: %s", k, line);
        k++;
    }
    fclose(f);
    CHECK(k == 3);
}

/* Output that cannot be written fails the run: a full device and a closed stdout, for generate, run and
 * inspect (exit 0 before, with the output lost). */
TEST(hardening_cli_write_failures_fail) {
    const char *dir = tiny_dir();
    CHECK(dir);
    char inspect[PATH_MAX + 16];
    snprintf(inspect, sizeof inspect, "inspect '%s'", dir);
    const char *cmds[] = {"generate -n 4", "run --prompts '1;2' -n 3", inspect};
    const char *outs[] = {">/dev/full", ">&-"};
    for (int c = 0; c < 3; c++)
        for (int o = 0; o < 2; o++) {
            char *err;
            int st = run_k3c(cmds[c], outs[o], &err);
            CHECKF(st == 1 && strstr(err, "standard output") &&
                       strstr(err, o == 0 ? "No space left on device" : "Bad file descriptor"),
                   "k3c %s %s: exit %d: %s", cmds[c], outs[o], st, err);
            free(err);
        }
    /* and the same commands into a pipe that reads everything still succeed */
    char *err;
    int st = run_k3c("generate -n 4", "| cat >/dev/null", &err);
    CHECKF(st == 0, "generate | cat: exit %d: %s", st, err);
    free(err);
}

/* k3c logits: both outputs are opened before the compute (an unwritable --out fails at once and --aux-out is
 * not created); a failure while writing leaves neither file nor a temporary one; an old file of the same
 * name is left as it was. */
TEST(hardening_cli_logits_outputs_whole_or_nothing) {
    const char *dir = tiny_dir();
    CHECK(dir);
    char out[PATH_MAX], args[4 * PATH_MAX], *err;
    snprintf(out, sizeof out, "%s/logits_out", test_tmpdir());
    CHECK(mkdir(out, 0755) == 0);
    /* an --out that cannot be created: refused before the model loads */
    snprintf(args, sizeof args, "logits --model '%s' --prompt-ids 1,2,3 --prefill 2 --out '%s/no/such/l.bin' "
             "--aux 1 --aux-out '%s/aux.bin'", dir, out, out);
    double t = now_s();
    int st = run_k3c(args, ">/dev/null", &err);
    t = now_s() - t;
    CHECKF(st == 1 && strstr(err, "no/such/l.bin") && !strstr(err, "reserved"), "exit %d: %s", st, err);
    free(err);
    CHECK(count_entries(out) == 0);
    /* --out on a full device: the aux stream is not left behind */
    snprintf(args, sizeof args, "logits --model '%s' --prompt-ids 1,2,3 --prefill 2 --out /dev/full "
             "--aux 1 --aux-out '%s/aux.bin'", dir, out);
    st = run_k3c(args, ">/dev/null", &err);
    CHECKF(st == 1 && strstr(err, "/dev/full") && strstr(err, "No space left on device"), "exit %d: %s", st, err);
    free(err);
    CHECKF(count_entries(out) == 0, "%d files left in %s", count_entries(out), out);
    /* an old --out survives a failed run untouched */
    char old[PATH_MAX + 16];
    snprintf(old, sizeof old, "%s/l.bin", out);
    FILE *f = fopen(old, "wb");
    CHECK(f && fputs("old", f) >= 0 && fclose(f) == 0);
    snprintf(args, sizeof args, "logits --model '%s' --prompt-ids 1,2,3 --prefill 2 --out '%s' --aux 99 "
             "--aux-out '%s/aux.bin'", dir, old, out);
    st = run_k3c(args, ">/dev/null", &err);
    CHECKF(st == 1 && strstr(err, "aux_layers"), "exit %d: %s", st, err);
    free(err);
    struct stat sb;
    CHECK(stat(old, &sb) == 0 && sb.st_size == 3);
    CHECKF(count_entries(out) == 1, "%d files in %s", count_entries(out), out);
    /* a good run writes both, whole */
    snprintf(args, sizeof args, "logits --model '%s' --prompt-ids 1,2,3 --prefill 2 --out '%s' --aux 1 "
             "--aux-out '%s/aux.bin'", dir, old, out);
    st = run_k3c(args, ">/dev/null", &err);
    CHECKF(st == 0, "exit %d: %s", st, err);
    free(err);
    CHECK(stat(old, &sb) == 0 && sb.st_size > 3 && sb.st_size % (3 * 4) == 0);
    CHECK(count_entries(out) == 2);
    (void)t;
}

/* Ctrl-C (or SIGTERM) while the implicit synthesis writes its temporary checkpoint removes it: bench
 * synthesizes mini (hundreds of MB) into $TMPDIR/k3c-mini-*; the signal comes once shards are being written. */
static int signal_during_synthesis(int sig, char *msg, size_t msg_n) {
    char bin[PATH_MAX], tmp[PATH_MAX];
    if (!test_k3c_binary(bin, sizeof bin)) return snprintf(msg, msg_n, "no k3c binary"), -1;
    snprintf(tmp, sizeof tmp, "%s/sig_%d", test_tmpdir(), sig);
    if (mkdir(tmp, 0755) != 0) return snprintf(msg, msg_n, "mkdir %s", tmp), -1;
    pid_t pid = fork();
    if (pid < 0) return snprintf(msg, msg_n, "fork"), -1;
    if (pid == 0) {
        setenv("TMPDIR", tmp, 1);
        signal(sig, SIG_DFL); /* a runner started in the background may have SIGINT ignored */
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execl(bin, bin, "bench", "--preset", "mini", "--steps", "1", (char *)NULL);
        _exit(127);
    }
    /* wait for the synthesis directory to hold a shard (config.json, the marker, then shards) */
    char sub[PATH_MAX + 300] = "";
    double t0 = now_s();
    int seen = 0;
    while (now_s() - t0 < 60 && !seen) {
        DIR *d = opendir(tmp);
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (!strncmp(e->d_name, "k3c-mini-", 9)) snprintf(sub, sizeof sub, "%s/%s", tmp, e->d_name);
        if (d) closedir(d);
        seen = sub[0] && count_entries(sub) >= 3;
        if (!seen) usleep(5000);
    }
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    int left = count_entries(tmp);
    if (!seen) return snprintf(msg, msg_n, "no synthesis directory appeared in %s", tmp), -1;
    if (!WIFSIGNALED(status) || WTERMSIG(status) != sig)
        return snprintf(msg, msg_n, "k3c did not end by signal %d (status 0x%x)", sig, status), -1;
    if (left != 0) return snprintf(msg, msg_n, "%d entries left in %s (%s)", left, tmp, sub), -1;
    return 0;
}

TEST(hardening_cli_signal_removes_synthesis_dir) {
    char msg[PATH_MAX + 128];
    CHECKF(signal_during_synthesis(SIGINT, msg, sizeof msg) == 0, "SIGINT: %s", msg);
    CHECKF(signal_during_synthesis(SIGTERM, msg, sizeof msg) == 0, "SIGTERM: %s", msg);
}

/* tools/fuzz_load.py removes its scratch folder when it finds nothing (`make fuzz-load` left it behind). */
TEST(hardening_fuzz_load_leaves_nothing) {
    if (test_run_status("python3 -c 1 >/dev/null 2>&1") != 0) {
        printf("[python3 not found: not run] ");
        return;
    }
    char bin[PATH_MAX], tmp[PATH_MAX], cmd[4 * PATH_MAX];
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(tmp, sizeof tmp, "%s/fuzz_tmp", test_tmpdir());
    CHECK(mkdir(tmp, 0755) == 0);
    snprintf(cmd, sizeof cmd, "TMPDIR='%s' python3 '%s/../tools/fuzz_load.py' --k3c '%s' --iterations 2 "
             ">/dev/null 2>&1", tmp, test_exe_dir(), bin);
    CHECK(test_run_status(cmd) == 0);
    CHECKF(count_entries(tmp) == 0, "%d entries left in %s", count_entries(tmp), tmp);
}

/* The test runner: a filter that selects no test is an error, not "0 passed, 0 failed" and exit 0. */
TEST(hardening_test_filter_matching_nothing_fails) {
    char cmd[PATH_MAX + 128], out[PATH_MAX];
    snprintf(out, sizeof out, "%s/filter.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s/%s' no_test_is_named_this >'%s' 2>&1", test_exe_dir(), "test_k3c", out);
    int st = test_run_status(cmd);
    FILE *f = fopen(out, "r");
    char buf[4096] = "";
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
    CHECKF(st == 1 && strstr(buf, "no test matches 'no_test_is_named_this'"), "exit %d: %s", st, buf);
}
