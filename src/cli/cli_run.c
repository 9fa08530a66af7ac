/* Helpers shared by the commands that run the model (generate, logits, bench): option parsing, token-id
 * lists, loading a checkpoint or synthesizing a preset into a temporary directory. */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cli/commands.h"

static char cli_message[1024];

int cli_errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cli_message, sizeof cli_message, fmt, ap);
    va_end(ap);
    return K3C_ERR;
}

const char *cli_error(void) { return cli_message[0] ? cli_message : k3c_last_error(); }

const char cli_no_value[] = "";

const char *cli_option(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) return cli_no_value;
    return argv[++*i];
}

static int no_value(const char *name, const char *v) {
    if (v != cli_no_value) return 0;
    cli_errorf("%s needs a value", name);
    return 1;
}

int cli_int(const char *name, const char *v, long lo, long hi, long *out) {
    if (no_value(name, v)) return -1;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || !*v || *end || x < lo || x > hi)
        return cli_errorf("%s: '%s' is not an integer in %ld..%ld", name, v, lo, hi);
    *out = x;
    return 0;
}

int cli_u64(const char *name, const char *v, uint64_t *out) {
    if (no_value(name, v)) return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    /* strtoull negates "-1" into 2^64 - 1 */
    if (errno || !*v || *end || strchr(v, '-'))
        return cli_errorf("%s: '%s' is not an integer in 0..%llu", name, v, (unsigned long long)UINT64_MAX);
    *out = x;
    return 0;
}

int cli_float(const char *name, const char *v, double lo, double hi, int lo_open, double *out) {
    if (no_value(name, v)) return -1;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    /* strtod takes "nan" and "inf" (NaN fails both comparisons below) */
    if (errno || !*v || *end || !(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return cli_errorf("%s: '%s' is not a number in %s%g, %g]", name, v, lo_open ? "(" : "[", lo, hi);
    *out = x;
    return 0;
}

int cli_bytes(const char *name, const char *v, size_t *out) {
    if (no_value(name, v)) return -1;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    double unit = 1;
    const char *u = end;
    if (*u) {
        const char *units = "KMGTP";
        const char *at = strchr(units, *u >= 'a' ? *u - 32 : *u);
        if (at) {
            for (const char *k = units; k <= at; k++) unit *= 1024;
            u++;
            if (*u == 'i') u++;
            if (*u == 'B') u++;
        } else if (*u == 'B') {
            u++;
        }
    }
    double b = x * unit;
    if (errno || end == v || *u || !(b >= 1) || b > 0x1p62)
        return cli_errorf("%s: '%s' is not a size of at least one byte (bytes, or with K, M, G, T or P: powers of "
                          "1024, e.g. 8G)", name, v);
    *out = (size_t)b;
    return 0;
}

int cli_str(const char *name, const char *v) {
    if (no_value(name, v)) return -1;
    return *v ? 0 : cli_errorf("%s: an empty value", name);
}

int cli_flush_stdout(void) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    return cli_errorf("writing standard output: %s", errno ? strerror(errno) : "write error");
}

int cli_unexpected(const char *arg) { return cli_errorf("unexpected argument '%s'", arg); }

int cli_parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16, cnt = 0;
    int32_t *v = malloc(sizeof *v * cap);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            free(v);
            return -1;
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, sizeof *v * (cap *= 2));
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            free(v);
            return -1;
        }
    }
    if (cnt == 0) {
        free(v);
        return -1;
    }
    *ids = v;
    *n = cnt;
    return 0;
}

/* ---- the implicit model's temporary directory ----
 * Without --model the embedded default model is written (or, with --preset, a preset synthesized) into
 * $TMPDIR/k3c-<k3-fortune or preset>-XXXXXX (430 MB for bench's mini) and removed once loaded (the loader maps the files; the mapping outlives the unlink). A SIGINT / SIGTERM /
 * SIGHUP / SIGQUIT while the directory exists removes it in the handler, then ends the process by the same
 * signal. The directory is flat (synth writes no subdirectories), and the removal uses only async-signal-safe
 * calls (open, getdents64, unlinkat, rmdir), so it is the same code in the handler and on the normal path. */
static char synth_dir[4096];
static volatile sig_atomic_t synth_dir_live;
static const int cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define N_CLEANUP_SIGNALS (sizeof cleanup_signals / sizeof cleanup_signals[0])
static struct sigaction cleanup_saved[N_CLEANUP_SIGNALS];

struct dirent64_raw {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[];
};

static void remove_flat_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096] __attribute__((aligned(8)));
        /* passes until one removes nothing: unlinking while reading may move entries past the offset read */
        for (int removed = 1; removed;) {
            removed = 0;
            lseek(fd, 0, SEEK_SET);
            long n;
            while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
                for (long off = 0; off < n;) {
                    struct dirent64_raw *d = (struct dirent64_raw *)(buf + off);
                    off += d->reclen;
                    if (d->name[0] == '.' && (!d->name[1] || (d->name[1] == '.' && !d->name[2]))) continue;
                    if (unlinkat(fd, d->name, 0) == 0) removed = 1;
                }
        }
        close(fd);
    }
    rmdir(dir);
}

static void cleanup_on_signal(int sig) {
    if (synth_dir_live) remove_flat_dir(synth_dir);
    /* SA_RESETHAND made the action the default again: the raised signal ends the process on return */
    raise(sig);
}

static void cleanup_arm(const char *dir) {
    snprintf(synth_dir, sizeof synth_dir, "%s", dir);
    synth_dir_live = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = cleanup_on_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_CLEANUP_SIGNALS; i++) sigaddset(&sa.sa_mask, cleanup_signals[i]);
    for (size_t i = 0; i < N_CLEANUP_SIGNALS; i++) {
        sigaction(cleanup_signals[i], NULL, &cleanup_saved[i]);
        if (cleanup_saved[i].sa_handler != SIG_IGN) sigaction(cleanup_signals[i], &sa, NULL); /* nohup stays */
    }
}

static void cleanup_done(void) {
    remove_flat_dir(synth_dir);
    synth_dir_live = 0;
    for (size_t i = 0; i < N_CLEANUP_SIGNALS; i++) sigaction(cleanup_signals[i], &cleanup_saved[i], NULL);
}

/* A fresh temporary directory holding the model (preset NULL: the embedded default), armed for removal on a
 * signal until temp_model_done. */
static int temp_model_create(const char *preset, uint64_t seed, char *path, size_t cap) {
    const char *tmp = getenv("TMPDIR");
    snprintf(path, cap, "%s/k3c-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", preset ? preset : "k3-fortune");
    /* the cleanup signals wait while the directory exists unarmed: one between mkdtemp and the handlers would
     * leave it behind */
    sigset_t block, saved;
    sigemptyset(&block);
    for (size_t i = 0; i < N_CLEANUP_SIGNALS; i++) sigaddset(&block, cleanup_signals[i]);
    sigprocmask(SIG_BLOCK, &block, &saved);
    if (!mkdtemp(path)) {
        int e = errno;
        sigprocmask(SIG_SETMASK, &saved, NULL);
        return cli_errorf("cannot create a temporary directory %s: %s", path, strerror(e));
    }
    cleanup_arm(path);
    sigprocmask(SIG_SETMASK, &saved, NULL);
    /* synth refuses a non-empty dir without its marker; the fresh dir is empty */
    int rc = preset ? k3c_synthesize(preset, seed, path) : k3c_default_model_write(path);
    if (rc != K3C_OK) cleanup_done();
    return rc;
}

/* Hands a temporary model directory to load and removes it either way (the loaders map or read the files:
 * a mapping outlives the unlink). */
static int with_temp_model(const char *preset, uint64_t seed, int (*load)(const char *dir, void *out), void *out) {
    char path[4096];
    int rc = temp_model_create(preset, seed, path, sizeof path);
    if (rc != K3C_OK) return rc;
    rc = load(path, out);
    cleanup_done();
    return rc;
}

int cli_default_model_dir(char *path, size_t cap) { return temp_model_create(NULL, 0, path, cap); }
void cli_default_model_dir_done(void) { cleanup_done(); }

static int load_model(const char *dir, void *m) { return k3c_load(dir, m); }
static int load_tokenizer(const char *dir, void *t) { return k3c_tokenizer_load(dir, t); }

int cli_load_model(const char *dir, const char *preset, uint64_t seed, k3c_model **m) {
    return dir ? k3c_load(dir, m) : with_temp_model(preset, seed, load_model, m);
}

int cli_model_option(int argc, char **argv, int *i, const char **dir, const char **preset, int *bad) {
    const char *v;
    if ((v = cli_option(argc, argv, i, "--model"))) *bad = cli_str("--model", *dir = v);
    else if ((v = cli_option(argc, argv, i, "--preset"))) *bad = cli_str("--preset", *preset = v);
    else return 0;
    if (!*bad && *dir && *preset) *bad = cli_errorf("--model %s and --preset %s: give one of them", *dir, *preset);
    return 1;
}

const char *cli_model_name(const char *dir, const char *preset) {
    static char name[4200];
    if (dir) snprintf(name, sizeof name, "%s", dir);
    else if (preset) snprintf(name, sizeof name, "the synthesized %s preset (a random model)", preset);
    else snprintf(name, sizeof name, "the embedded k3-fortune model");
    return name;
}

int cli_check_device(const char *device) {
    if (no_value("--device", device)) return -1;
    if (!strcmp(device, "cpu") || !strcmp(device, "cuda")) return 0;
    return cli_errorf("--device: '%s' is not cpu or cuda", device);
}

int cli_read_input(const char *path, size_t max, char **buf, size_t *len) {
    int from_stdin = !strcmp(path, "-");
    const char *what = from_stdin ? "standard input" : path;
    FILE *f = from_stdin ? stdin : fopen(path, "rb");
    if (!f) return cli_errorf("cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 12, n = 0;
    char *b = malloc(cap + 1);
    int rc = b ? 0 : cli_errorf("reading %s: out of memory", what);
    for (size_t got = 1; rc == 0 && got > 0;) {
        if (n == cap) {
            char *nb = realloc(b, 2 * cap + 1);
            if (!nb) {
                rc = cli_errorf("reading %s: out of memory", what);
                break;
            }
            b = nb;
            cap *= 2;
        }
        got = fread(b + n, 1, cap - n, f);
        n += got;
        if (n > max) rc = cli_errorf("%s is larger than %zu bytes", what, max);
    }
    if (rc == 0 && ferror(f)) rc = cli_errorf("reading %s failed", what);
    if (!from_stdin) fclose(f);
    if (rc != 0) {
        free(b);
        return rc;
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

int cli_load_tokenizer(const char *dir, const char *preset, k3c_tokenizer **t) {
    *t = NULL;
    if (dir) return k3c_tokenizer_present(dir) ? k3c_tokenizer_load(dir, t) : 0;
    /* a preset's tokenizer is embedded as such; the default model's comes with its files */
    return preset ? k3c_tokenizer_load_preset(preset, t) : with_temp_model(NULL, 0, load_tokenizer, t);
}

int cli_no_tokenizer(const char *dir) {
    return cli_errorf("%s has no tokenizer files (no tiktoken.model beside its config.json), so it takes and gives "
                      "token ids only: use --prompt-ids (and no --text)", dir);
}

static void add_stop(int32_t *ids, int *n, int cap, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < *n; i++)
        if (ids[i] == id) return;
    if (*n < cap) ids[(*n)++] = id;
}

int cli_stop_ids(const k3c_model *m, const k3c_tokenizer *t, const char *template_dir, int32_t *ids, int cap) {
    int n = 0;
    k3c_model_info info;
    if (k3c_model_info_get(m, &info) == K3C_OK) add_stop(ids, &n, cap, info.eos_token_id);
    if (!t) return n;
    add_stop(ids, &n, cap, k3c_tokenizer_eos(t));
    /* a template k3c does not know leaves the config's and the tokenizer's eos: plain generation needs no
     * template */
    k3c_chat_template *ct;
    if (k3c_chat_template_load(template_dir, info.family, &ct) == K3C_OK) {
        int32_t turn[8];
        int k = k3c_chat_stop_ids(ct, t, turn, 8);
        for (int i = 0; i < k && i < 8; i++) add_stop(ids, &n, cap, turn[i]);
        k3c_chat_template_free(ct);
    }
    return n;
}

int cli_engine_option(int argc, char **argv, int *i, k3c_engine_options *o, int *bad) {
    const char *v;
    long l = 0;
    if ((v = cli_option(argc, argv, i, "--device"))) {
        *bad = cli_check_device(v);
        o->device = v;
    } else if ((v = cli_option(argc, argv, i, "--threads"))) {
        *bad = cli_int("--threads", v, 0, 4096, &l);
        o->threads = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--kv-cache"))) {
        *bad = no_value("--kv-cache", v) ? -1
               : strcmp(v, "bf16") && strcmp(v, "fp8") ? cli_errorf("--kv-cache: '%s' is not bf16 or fp8", v)
                                                        : 0;
        o->kv_fp8 = !strcmp(v, "fp8");
    } else if ((v = cli_option(argc, argv, i, "--max-context"))) {
        *bad = cli_int("--max-context", v, 1, INT32_MAX, &l);
        o->max_context = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--memory-limit"))) {
        *bad = cli_bytes("--memory-limit", v, &o->memory_limit);
    } else {
        return 0;
    }
    return 1;
}

int cli_parallel_option(int argc, char **argv, int *i, k3c_engine_options *o, int *bad) {
    const char *v;
    long l = 0;
    double d = 0;
    if (!strcmp(argv[*i], "--ep")) {
        o->layout.ep = -1; /* tp x dp, once both are known (cli_parallel_finish) */
        return 1;
    }
    if ((v = cli_option(argc, argv, i, "--tp"))) {
        *bad = cli_int("--tp", v, 1, 4096, &l);
        o->layout.tp = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--pp"))) {
        *bad = cli_int("--pp", v, 1, 4096, &l);
        o->layout.pp = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--dp"))) {
        *bad = cli_int("--dp", v, 1, 4096, &l);
        o->layout.dp = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--dcp"))) {
        *bad = cli_int("--dcp", v, 1, 4096, &l);
        o->layout.dcp = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--world-size"))) {
        *bad = cli_int("--world-size", v, 1, 4096, &l);
        o->world_size = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--rank"))) {
        *bad = cli_int("--rank", v, 0, 4095, &l);
        o->rank = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--rendezvous"))) {
        *bad = cli_str("--rendezvous", o->rendezvous = v);
    } else if ((v = cli_option(argc, argv, i, "--rank-timeout"))) {
        *bad = cli_float("--rank-timeout", v, 0, 86400, 1, &d);
        o->rank_timeout_ms = d * 1000 < 1 ? 1 : (int)(d * 1000);
    } else {
        return 0;
    }
    return 1;
}

int cli_parallel_finish(k3c_engine_options *o) {
    k3c_layout *l = &o->layout;
    int tp = l->tp > 0 ? l->tp : 1, dp = l->dp > 0 ? l->dp : 1;
    if (l->ep == -1) {
        if (tp * dp == 1) return cli_errorf("--ep: expert parallelism spans the tp x dp ranks, and there is one");
        l->ep = tp * dp;
    }
    if (o->world_size > 1 && !o->rendezvous)
        return cli_errorf("--world-size %d: one process per rank needs --rendezvous PATH (a file every rank sees)",
                          o->world_size);
    if (o->rank > 0 && o->world_size < 1) return cli_errorf("--rank %d needs --world-size", o->rank);
    return 0;
}

int cli_follow(const char *cmd, k3c_engine *e) {
    int rank = k3c_engine_rank(e);
    if (rank <= 0) return -1;
    fprintf(stderr, "k3c %s: rank %d of %d: following rank 0's steps\n", cmd, rank, k3c_engine_world_size(e));
    if (k3c_engine_follow(e) == K3C_OK) return 0;
    fprintf(stderr, "k3c %s: %s\n", cmd, k3c_last_error());
    return 1;
}

int cli_sampling_option(int argc, char **argv, int *i, k3c_sampling *s, int *bad) {
    const char *v;
    double d = 0;
    long l = 0;
    if ((v = cli_option(argc, argv, i, "--temperature"))) {
        /* FLT_MAX: the sampler's float must hold it (1e39 would become inf) */
        *bad = cli_float("--temperature", v, 0, FLT_MAX, 0, &d);
        s->temperature = (float)d;
    } else if ((v = cli_option(argc, argv, i, "--top-k"))) {
        *bad = cli_int("--top-k", v, 0, 1 << 30, &l);
        s->top_k = (int)l;
    } else if ((v = cli_option(argc, argv, i, "--top-p"))) {
        *bad = cli_float("--top-p", v, 0, 1, 1, &d);
        s->top_p = (float)d;
    } else if ((v = cli_option(argc, argv, i, "--seed"))) {
        *bad = cli_u64("--seed", v, &s->seed);
    } else {
        return 0;
    }
    return 1;
}

int cli_sampling_check(const k3c_sampling *s) {
    if (s->temperature > 0) return 0;
    if (s->top_k > 0)
        return cli_errorf("--top-k %d filters sampled tokens: it needs --temperature T > 0 (without it decoding is "
                          "greedy)", s->top_k);
    if (s->top_p < 1)
        return cli_errorf("--top-p %g filters sampled tokens: it needs --temperature T > 0 (without it decoding is "
                          "greedy)", (double)s->top_p);
    return 0;
}

int cli_context(const k3c_engine_options *o, int n_prompt, long n_new, const char *n_name, int *ctx) {
    /* the last sampled token is never fed back: a request holds the prompt and n_new - 1 generated tokens */
    long need = (long)n_prompt + (n_new > 0 ? n_new - 1 : 0);
    if (o->max_context > 0) {
        if (need > o->max_context)
            return cli_errorf("%s %ld with a %d-token prompt needs a context of %ld tokens, more than --max-context %d",
                              n_name, n_new, n_prompt, need, o->max_context);
        *ctx = o->max_context;
        return 0;
    }
    if (need > INT32_MAX) return cli_errorf("%s %ld with a %d-token prompt: %ld tokens", n_name, n_new, n_prompt, need);
    *ctx = (int)need;
    return 0;
}

void cli_report_memory(const char *cmd, const k3c_engine *e, const char *device) {
    k3c_engine_memory mm;
    if (k3c_engine_memory_get(e, &mm) != K3C_OK) return;
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double b = (double)mm.cache_bytes, l = (double)mm.limit;
    int i = 0, j = 0;
    while (b >= 1024 && i < 5) b /= 1024, i++;
    while (l >= 1024 && j < 5) l /= 1024, j++;
    char lim[128];
    if (mm.limit) snprintf(lim, sizeof lim, "limit %.2f %s, %s", l, u[j], mm.limit_source);
    else snprintf(lim, sizeof lim, "no limit could be told");
    fprintf(stderr, "k3c %s: reserved %.2f %s of caches on %s for %d request%s x %d tokens (%ld cache positions; %s)\n",
            cmd, b, u[i], device, mm.max_requests, mm.max_requests == 1 ? "" : "s", mm.max_context, mm.cache_tokens,
            lim);
}
