/* k3c logits: the first N prompt tokens as one prefill, then the rest one cached decode step at a time;
 * writes the logits of every position as float32 [len, vocab], row-major, to FILE. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "util/error.h"

static void logits_usage(FILE *f) {
    fprintf(f, "usage: k3c logits --model DIR --prompt-ids IDS --prefill N --out FILE [--device cpu|cuda] "
               "[--threads N] [--f32] [--kv-cache bf16|fp8]\n"
               "--f32 (diagnostic): f32 activations, no bf16 rounding\n"
               "--kv-cache fp8: MLA latent cache in FP8 E4M3 (default bf16)\n");
}

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *out = NULL;
    long prefill = -1;
    int f32 = 0;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            logits_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--f32")) {
            f32 = 1;
        } else if ((v = cli_option(argc, argv, &i, "--model"))) model = v;
        else if ((v = cli_option(argc, argv, &i, "--prompt-ids"))) ids_s = v;
        else if ((v = cli_option(argc, argv, &i, "--prefill"))) bad = cli_parse_int(v, 1, 1 << 30, &prefill);
        else if ((v = cli_option(argc, argv, &i, "--out"))) out = v;
        else if (cli_engine_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else bad = 1;
        if (bad) {
            fprintf(stderr, "k3c logits: bad or unexpected argument '%s'\n", argv[i]);
            logits_usage(stderr);
            return 2;
        }
    }
    int32_t *ids = NULL;
    int n = 0;
    if (!model || !out || prefill < 1 || !ids_s || cli_parse_ids(ids_s, &ids, &n)) {
        fprintf(stderr, "k3c logits: --model, --prompt-ids (comma-separated ids), --prefill N >= 1 and --out are "
                        "required\n");
        logits_usage(stderr);
        free(ids);
        return 2;
    }
    if (prefill > n) {
        fprintf(stderr, "k3c logits: --prefill %ld exceeds the %d prompt tokens\n", prefill, n);
        free(ids);
        return 2;
    }
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    float *lg = NULL;
    int rc = 1, id;
    if (k3c_load(model, &m) != K3C_OK) goto fail;
    o.max_requests = 1;
    o.max_rows = (int)prefill;
    o.q_max = 1;
    o.exact_f32 = f32;
    o.max_context = n;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) goto fail;
    int V = k3c_engine_vocab(e);
    lg = malloc(sizeof(float) * (size_t)n * V);
    if (!lg) {
        k3c_errorf("out of memory for %d x %d logits", n, V);
        goto fail;
    }
    if (k3c_request_open(e, &id) != K3C_OK) goto fail;
    k3c_step_item it = {.request = id, .tokens = ids, .n = (int)prefill, .all_logits = 1};
    if (k3c_engine_step(e, &it, 1, lg) != K3C_OK) goto fail;
    for (int i = (int)prefill; i < n; i++) {
        k3c_step_item d = {.request = id, .tokens = ids + i, .n = 1};
        if (k3c_engine_step(e, &d, 1, lg + (size_t)i * V) != K3C_OK) goto fail;
    }
    FILE *f = fopen(out, "wb");
    if (!f) {
        k3c_errorf("cannot open %s for writing: %s", out, strerror(errno));
        goto fail;
    }
    struct stat st;
    int regular = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
    size_t wrote = fwrite(lg, sizeof(float), (size_t)n * V, f);
    int close_rc = fclose(f);
    if (wrote != (size_t)n * V || close_rc != 0) {
        k3c_errorf("writing %s: %s", out, strerror(errno));
        /* a short logits file would read as valid rows; a device (/dev/full) is never unlinked */
        if (regular) remove(out);
        goto fail;
    }
    fprintf(stderr, "wrote %d x %d float32 logits to %s\n", n, V, out);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "k3c logits: %s\n", k3c_last_error());
done:
    free(lg);
    k3c_engine_free(e);
    if (m) k3c_free(m);
    free(ids);
    return rc;
}
