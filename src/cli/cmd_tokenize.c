/* k3c tokenize / detokenize: text to ids and back through a model directory's tokenizer, without --model the
 * embedded default model's, or with --preset the tokenizer `k3c synth` gives the preset (embedded, nothing
 * written).
 * `tokenize --bench FILE` times encode and decode of a file (the tokenizer benchmark). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "k3c.h"
#include "util/file.h"

#define MAX_INPUT ((size_t)1 << 32) /* 4 GiB: a guard against an absurd input, not a format limit */

static int load(const char *cmd, const char *dir, const char *preset, k3c_tokenizer **t) {
    if (dir && !k3c_tokenizer_present(dir)) {
        fprintf(stderr, "k3c %s: %s has no tokenizer (no tiktoken.model beside its config): the model runs on "
                        "token ids only (--prompt-ids)\n", cmd, dir);
        return 1;
    }
    if (cli_load_tokenizer(dir, preset, t) != 0) {
        fprintf(stderr, "k3c %s: %s\n", cmd, cli_error());
        return 1;
    }
    return 0;
}

/* The whole of stdin into a malloc'd buffer. */
static int read_stdin(char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return -1;
    for (;;) {
        if (n == cap) {
            char *p = cap < MAX_INPUT ? realloc(buf, cap *= 2) : NULL;
            if (!p) {
                free(buf);
                return -1;
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }
static double cpu_s(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

/* Encode (specials allowed, Kimi's default) and decode of the whole text, repeated for at least a second
 * and three times; the best time of each, wall clock and this thread's CPU time (the CPU time is what
 * to compare on a shared machine, where the wall clock also counts waiting for a core). */
static int bench(const k3c_tokenizer *t, const char *path, const char *text, size_t len) {
    double best_enc = 1e30, best_dec = 1e30, best_cpu = 1e30, start = now_s();
    size_t ids = 0;
    for (int rep = 0; rep < 3 || now_s() - start < 1.0; rep++) {
        k3c_tokens v = {0};
        double c0 = cpu_s();
        double t0 = now_s();
        if (k3c_tokenizer_encode(t, text, len, 1, &v) != 0) {
            fprintf(stderr, "k3c tokenize: %s\n", k3c_last_error());
            k3c_tokens_free(&v);
            return 1;
        }
        double t1 = now_s();
        double c1 = cpu_s();
        char *out;
        size_t olen;
        if (k3c_tokenizer_decode(t, v.ids, v.n, &out, &olen) != 0) {
            fprintf(stderr, "k3c tokenize: %s\n", k3c_last_error());
            k3c_tokens_free(&v);
            return 1;
        }
        double t2 = now_s();
        free(out);
        ids = v.n;
        k3c_tokens_free(&v);
        if (t1 - t0 < best_enc) best_enc = t1 - t0;
        if (c1 - c0 < best_cpu) best_cpu = c1 - c0;
        if (t2 - t1 < best_dec) best_dec = t2 - t1;
    }
    double mb = (double)len / 1e6;
    printf("tokenize bench %s: %zu bytes, %zu ids (%.2f bytes/id), vocab %d\n", path, len, ids,
           ids ? (double)len / (double)ids : 0.0, k3c_tokenizer_vocab(t));
    printf("encode: %.4f s = %.2f MB/s (one thread, best of repeats); CPU time %.4f s = %.2f MB/s\n", best_enc,
           mb / best_enc, best_cpu, mb / best_cpu);
    printf("decode: %.4f s = %.2f MB/s\n", best_dec, mb / best_dec);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *text = NULL, *preset = NULL, *bench_file = NULL;
    int allow_special = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: k3c tokenize [--model DIR | --preset NAME] [--no-special] [--file F | TEXT]\n"
                   "       k3c tokenize [--model DIR | --preset NAME] --bench FILE\n"
                   "Prints the ids of TEXT (or of file F; - reads stdin) on one line. Special-token text becomes\n"
                   "its id unless --no-special. Without --model: the embedded default model's tokenizer\n"
                   "(k3-fortune, 4096 ids); --preset NAME: the tokenizer k3c synth writes beside a preset.\n");
            return 0;
        } else if (cli_model_option(argc, argv, &i, &dir, &preset, &bad)) {
            if (bad) {
                fprintf(stderr, "k3c tokenize: %s\n", cli_error());
                return 2;
            }
        } else if ((v = cli_option(argc, argv, &i, "--file"))) {
            file = v;
        } else if ((v = cli_option(argc, argv, &i, "--bench"))) {
            bench_file = v;
        } else if (!strcmp(argv[i], "--no-special")) {
            allow_special = 0;
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            fprintf(stderr, "k3c tokenize: unknown option '%s' (or missing value)\n", argv[i]);
            return 2;
        } else if (!text) {
            text = argv[i];
        } else {
            fprintf(stderr, "k3c tokenize: one TEXT argument expected, got another: '%s' (quote the text)\n", argv[i]);
            return 2;
        }
    }
    if (!!text + !!file + !!bench_file != 1) {
        fprintf(stderr, "k3c tokenize: give exactly one of TEXT, --file F or --bench FILE\n");
        return 2;
    }
    char *buf = NULL;
    size_t len = 0;
    const char *src = bench_file ? bench_file : file;
    if (src) {
        int from_stdin = !strcmp(src, "-");
        if (from_stdin ? read_stdin(&buf, &len) != 0 : k3c_read_file(src, MAX_INPUT, &buf, &len) != 0) {
            fprintf(stderr, "k3c tokenize: %s\n", from_stdin ? "cannot read stdin" : k3c_last_error());
            return 1;
        }
    }
    k3c_tokenizer *t;
    if (load("tokenize", dir, preset, &t)) {
        free(buf);
        return 1;
    }
    int rc = 0;
    if (bench_file) {
        rc = bench(t, bench_file, buf, len);
    } else {
        k3c_tokens v = {0};
        if (k3c_tokenizer_encode(t, src ? buf : text, src ? len : strlen(text), allow_special, &v) != 0) {
            fprintf(stderr, "k3c tokenize: %s\n", k3c_last_error());
            rc = 1;
        } else {
            for (size_t i = 0; i < v.n; i++) printf(i ? " %d" : "%d", v.ids[i]);
            printf("\n");
            if (fflush(stdout) != 0 || ferror(stdout)) {
                fprintf(stderr, "k3c tokenize: writing the ids failed: %s\n", strerror(errno));
                rc = 1;
            }
        }
        k3c_tokens_free(&v);
    }
    k3c_tokenizer_free(t);
    free(buf);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *preset = NULL, *ids_arg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: k3c detokenize [--model DIR | --preset NAME] --ids 1,2,3\n"
                   "Prints the text of the ids and a newline (ill-formed UTF-8 as U+FFFD). Without --model: the\n"
                   "embedded default model's tokenizer; --preset NAME: the one k3c synth writes beside a preset.\n");
            return 0;
        } else if (cli_model_option(argc, argv, &i, &dir, &preset, &bad)) {
            if (bad) {
                fprintf(stderr, "k3c detokenize: %s\n", cli_error());
                return 2;
            }
        } else if ((v = cli_option(argc, argv, &i, "--ids"))) {
            ids_arg = v;
        } else {
            fprintf(stderr, "k3c detokenize: unexpected argument '%s' (or missing value)\n", argv[i]);
            return 2;
        }
    }
    int32_t *ids = NULL;
    int n = 0;
    if (!ids_arg || cli_parse_ids(ids_arg, &ids, &n) != 0) {
        fprintf(stderr, "k3c detokenize: --ids: expected a comma-separated list of non-negative ids, like 1,2,3\n");
        return 2;
    }
    k3c_tokenizer *t;
    if (load("detokenize", dir, preset, &t)) {
        free(ids);
        return 1;
    }
    char *out;
    size_t len;
    int rc = 0;
    if (k3c_tokenizer_decode(t, ids, (size_t)n, &out, &len) != 0) {
        fprintf(stderr, "k3c detokenize: %s\n", k3c_last_error());
        rc = 1;
    } else {
        fwrite(out, 1, len, stdout);
        printf("\n");
        free(out);
        if (fflush(stdout) != 0 || ferror(stdout)) {
            fprintf(stderr, "k3c detokenize: writing the text failed: %s\n", strerror(errno));
            rc = 1;
        }
    }
    k3c_tokenizer_free(t);
    free(ids);
    return rc;
}
