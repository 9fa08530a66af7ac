/* k3c logits: the first N prompt tokens as one prefill, then the rest one cached decode step at a time;
 * writes the logits of every position as float32 [len, vocab], row-major, to FILE; with --aux, the aux
 * hidden-state streams of the listed layers (k3c_engine_options.aux_layers) as float32 [num_aux, len, hidden]
 * to the --aux-out file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"

static void logits_usage(FILE *f) {
    fprintf(f, "usage: k3c logits [--model DIR | --preset NAME] --prompt-ids IDS --prefill N --out FILE\n"
               "                  [--device cpu|cuda] [--threads N] [--f32] [--kv-cache bf16|fp8]\n"
               "                  [--aux L1,L2,... --aux-out FILE] [--tp N]\n"
               "                  [--rank R --world-size W --rendezvous PATH] [--rank-timeout S]\n"
               "--f32 (diagnostic): f32 activations, no bf16 rounding\n"
               "--aux: the hidden state entering each listed layer (0..num_layers, increasing; num_layers = the\n"
               "       final norm's input), written as float32 [num_aux, len, hidden] to --aux-out\n"
               "--kv-cache fp8: MLA latent cache in FP8 E4M3 (default bf16); --max-context N, --memory-limit BYTES: the\n"
               "       memory plan (as generate)\n"
               "both files are opened before the model loads and appear, whole, only once everything is written\n"
               "  (by rank 0; the other ranks of a multi-process launch write nothing)\n"
               CLI_PARALLEL_HELP CLI_MODEL_HELP);
}

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *preset = NULL, *ids_s = NULL, *out = NULL, *aux_s = NULL, *aux_out = NULL;
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
        } else if (cli_model_option(argc, argv, &i, &model, &preset, &bad)) { /* bad on a bad value */ }
        else if ((v = cli_option(argc, argv, &i, "--prompt-ids"))) bad = cli_str("--prompt-ids", ids_s = v);
        else if ((v = cli_option(argc, argv, &i, "--prefill"))) bad = cli_int("--prefill", v, 1, 1 << 30, &prefill);
        else if ((v = cli_option(argc, argv, &i, "--out"))) bad = cli_str("--out", out = v);
        else if ((v = cli_option(argc, argv, &i, "--aux"))) bad = cli_str("--aux", aux_s = v);
        else if ((v = cli_option(argc, argv, &i, "--aux-out"))) bad = cli_str("--aux-out", aux_out = v);
        else if (cli_engine_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else if (cli_parallel_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else bad = cli_unexpected(argv[i]);
        if (bad) {
            fprintf(stderr, "k3c logits: %s\n", cli_error());
            logits_usage(stderr);
            return 2;
        }
    }
    if (cli_parallel_finish(&o)) {
        fprintf(stderr, "k3c logits: %s\n", cli_error());
        return 2;
    }

    int32_t *ids = NULL;
    int n = 0;
    if (!out || prefill < 1 || !ids_s || cli_parse_ids(ids_s, &ids, &n)) {
        fprintf(stderr, "k3c logits: --prompt-ids (comma-separated ids), --prefill N >= 1 and --out are "
                        "required\n");
        logits_usage(stderr);
        free(ids);
        return 2;
    }
    int32_t *aux32 = NULL;
    int na = 0;
    if (!aux_s != !aux_out || (aux_s && cli_parse_ids(aux_s, &aux32, &na))) {
        fprintf(stderr, "k3c logits: --aux (comma-separated layer indices) and --aux-out go together\n");
        free(ids);
        free(aux32);
        return 2;
    }
    if (prefill > n) {
        fprintf(stderr, "k3c logits: --prefill %ld exceeds the %d prompt tokens\n", prefill, n);
        free(ids);
        free(aux32);
        return 2;
    }
    if (aux_out && !strcmp(aux_out, out)) {
        fprintf(stderr, "k3c logits: --out and --aux-out are the same file %s\n", out);
        free(ids);
        free(aux32);
        return 2;
    }
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    float *lg = NULL, *aux = NULL;
    int rc = 1, id, *aux_layers = NULL, D = 0;
    /* both outputs exist (as temporary files) before the model loads: an unwritable path fails now */
    cli_out fo, fa;
    int have_fo = 0, have_fa = 0;
    /* a rank other than 0 of a multi-process launch writes nothing: it follows rank 0's steps */
    if (o.rank == 0) {
        if (cli_out_open(&fo, out) != K3C_OK) goto fail;
        have_fo = 1;
        if (na && cli_out_open(&fa, aux_out) != K3C_OK) goto fail;
        have_fa = na > 0;
    }
    if (cli_load_model(model, preset, 0, &m) != K3C_OK) goto fail;
    o.max_requests = 1;
    o.max_rows = (int)prefill;
    o.q_max = 1;
    o.exact_f32 = f32;
    if (o.max_context > 0 && o.max_context < n) {
        cli_errorf("--prompt-ids holds %d tokens, more than --max-context %d", n, o.max_context);
        goto fail;
    }
    if (o.max_context <= 0) o.max_context = n;
    if (na > 0) {
        aux_layers = malloc(sizeof(int) * (size_t)na);
        if (!aux_layers) {
            cli_errorf("out of memory");
            goto fail;
        }
        for (int j = 0; j < na; j++) aux_layers[j] = aux32[j];
        o.aux_layers = aux_layers;
        o.num_aux = na;
    }
    if (k3c_engine_create(m, &o, &e) != K3C_OK) goto fail;
    if ((rc = cli_follow("logits", e)) >= 0) goto done;
    rc = 1;
    cli_report_memory("logits", e, o.device);
    int V = k3c_engine_vocab(e);
    D = k3c_engine_hidden_size(e);
    lg = k3c_engine_logits_alloc(e, n); /* page-locked where it can be (k3c.h) */
    aux = na ? malloc(sizeof(float) * (size_t)na * n * D) : NULL;
    if (!lg || (na && !aux)) {
        cli_errorf("out of memory for %d x %d logits and %d aux streams", n, V, na);
        goto fail;
    }
    if (k3c_request_open(e, &id) != K3C_OK) goto fail;
    k3c_step_item it = {.request = id, .tokens = ids, .n = (int)prefill, .all_logits = 1};
    if (k3c_engine_step(e, &it, 1, lg) != K3C_OK) goto fail;
    for (int j = 0; j < na; j++) /* stream j's rows 0 .. prefill - 1 */
        if (k3c_engine_aux(e, j, aux + (size_t)j * n * D, NULL) != K3C_OK) goto fail;
    for (int i = (int)prefill; i < n; i++) {
        k3c_step_item d = {.request = id, .tokens = ids + i, .n = 1};
        if (k3c_engine_step(e, &d, 1, lg + (size_t)i * V) != K3C_OK) goto fail;
        for (int j = 0; j < na; j++)
            if (k3c_engine_aux(e, j, aux + ((size_t)j * n + i) * D, NULL) != K3C_OK) goto fail;
    }
    /* everything written and closed before either file takes its name */
    if (cli_out_write(&fo, lg, sizeof(float) * (size_t)n * V) != K3C_OK ||
        (na && cli_out_write(&fa, aux, sizeof(float) * (size_t)na * n * D) != K3C_OK) ||
        cli_out_close(&fo) != K3C_OK || (na && cli_out_close(&fa) != K3C_OK) ||
        (na && cli_out_commit(&fa) != K3C_OK) || cli_out_commit(&fo) != K3C_OK)
        goto fail;
    cli_out_free(&fo);
    if (na) cli_out_free(&fa);
    have_fo = have_fa = 0;
    fprintf(stderr, "wrote %d x %d float32 logits to %s\n", n, V, out);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "k3c logits: %s\n", cli_error());
    if (have_fo) cli_out_abort(&fo);
    if (have_fa) cli_out_abort(&fa);
done:
    k3c_engine_logits_free(e, lg);
    free(aux);
    free(aux_layers);
    free(aux32);
    k3c_engine_free(e);
    if (m) k3c_free(m);
    free(ids);
    return rc;
}
