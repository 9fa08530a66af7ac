/* k3c run: several prompts through the continuous-batching runner (include/k3c.h, runner section), with
 * optional prompt-lookup speculation. Prints each request's tokens (stdout) and a summary (stderr): steps per
 * planned route with the stock reasons, drafts accepted / proposed, tokens/s. Without --model the embedded
 * default model runs (--preset: a synthesized one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: k3c run [--model DIR | --preset NAME] --prompts \"1,2,3;4,5;...\" [-n 32] [--spec D]\n"
            "               [--max-requests M] [--prefill-budget B] [--stop ID]\n"
            "               [--temperature T --top-k K --top-p P --seed S] [--device cpu|cuda] [--threads N]\n"
            "               [--kv-cache bf16|fp8] [--max-context N] [--memory-limit BYTES] [--stock] [--tp N]\n"
            "               [--rank R --world-size W --rendezvous PATH] [--rank-timeout S]\n"
            "runs every prompt (';'-separated token-id lists, segment k = request k) for -n tokens, at most M at\n"
            "once (default 4; never more than there are prompts);\n"
            "--max-context: tokens one request may hold (default: the longest prompt and -n); --memory-limit\n"
            "(e.g. 8G): most bytes the caches may take (default: what the device has free); past either: refused\n"
            "--spec D verifies D prompt-lookup drafts per step (greedy requests only)\n"
            "with --device cuda the decode and verify steps take the specialized decode executor unless --stock\n"
            CLI_PARALLEL_HELP CLI_MODEL_HELP);
}

/* "1,2;3,4,5" -> prompts (each malloc'd); 0 or -1 with a message. Segment k is request k: an empty segment
 * ("1;;2", a trailing ';') is refused rather than dropped, which would shift every request number after it. */
static int parse_prompts(const char *s, int32_t ***prompts, int **lens, int *n) {
    int cnt = 1;
    for (const char *c = s; *c; c++) cnt += *c == ';';
    int32_t **p = calloc((size_t)cnt, sizeof *p);
    int *l = calloc((size_t)cnt, sizeof *l);
    char *copy = strdup(s);
    int rc = 0, k = 0;
    if (!p || !l || !copy) rc = cli_errorf("out of memory for %d prompts", cnt);
    for (char *seg = copy; rc == 0 && k < cnt; k++) {
        char *end = strchr(seg, ';');
        if (end) *end = '\0';
        if (!*seg)
            rc = cli_errorf("segment %d (request %d) is empty: each ';'-separated segment is one prompt", k + 1, k);
        else if (cli_parse_ids(seg, &p[k], &l[k]))
            rc = cli_errorf("segment %d (request %d) '%s' is not a comma-separated list of token ids", k + 1, k, seg);
        seg = end ? end + 1 : seg + strlen(seg);
    }
    free(copy);
    if (rc) {
        for (int i = 0; p && i < cnt; i++) free(p[i]);
        free(p);
        free(l);
        return -1;
    }
    *prompts = p;
    *lens = l;
    *n = cnt;
    return 0;
}

static void print_summary(const k3c_runner_stats *st, const char *device, int with_executor, int spec) {
    fprintf(stderr, "steps: %ld (", st->steps);
    for (int r = 0; r < K3C_RUNNER_ROUTES; r++) {
        fprintf(stderr, "%s%s %ld", r ? "; " : "", k3c_runner_route_name(r), st->route_steps[r]);
        if (r == 0 && st->route_steps[0] > 0) {
            fprintf(stderr, ":");
            int first = 1;
            for (int k = 1; k < K3C_RUNNER_REASONS; k++) {
                if (!st->stock_reason_steps[k]) continue;
                fprintf(stderr, "%s %s %ld", first ? "" : ",", k3c_runner_reason_name(k), st->stock_reason_steps[k]);
                first = 0;
            }
        }
    }
    if (with_executor) fprintf(stderr, "), %ld on the specialized executor\n", st->executor_steps);
    else fprintf(stderr, ")\n       routes as planned; no specialized executor here, so every step ran stock\n");
    if (st->drafts_proposed > 0)
        fprintf(stderr, "drafts: accepted %ld / proposed %ld (%.1f%%; %ld of the proposed were padding), %ld verifies, "
                        "%.2f tokens per verify\n",
                st->drafts_accepted, st->drafts_proposed, 100.0 * st->drafts_accepted / st->drafts_proposed,
                st->drafts_padded, st->verify_items,
                st->verify_items ? (double)(st->drafts_accepted + st->verify_items) / st->verify_items : 0.0);
    else if (spec > 0)
        fprintf(stderr, "drafts: accepted 0 / proposed 0 (the drafter found no earlier match of the context's end: "
                        "every step decoded one token)\n");
    fprintf(stderr, "tokens: %ld prompt, %ld generated in %.3f s (%.1f generated tok/s, %.1f all tok/s) [%s]\n",
            st->prompt_tokens, st->generated, st->seconds, st->seconds > 0 ? st->generated / st->seconds : 0,
            st->seconds > 0 ? (st->generated + st->prompt_tokens) / st->seconds : 0, device);
}

int cmd_run(int argc, char **argv) {
    const char *model = NULL, *preset = NULL, *prompts_s = NULL;
    long n = 32, spec = 0, max_req = 4, budget = 0, stop = -1;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    k3c_sampling s = {.top_p = 1}; /* greedy unless --temperature */
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            run_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--stock")) o.specialized = K3C_SPECIALIZED_OFF;
        else if (cli_model_option(argc, argv, &i, &model, &preset, &bad)) { /* bad on a bad value */ }
        else if ((v = cli_option(argc, argv, &i, "--prompts"))) bad = cli_str("--prompts", prompts_s = v);
        else if ((v = cli_option(argc, argv, &i, "-n"))) bad = cli_int("-n", v, 1, 1 << 30, &n);
        else if ((v = cli_option(argc, argv, &i, "--spec"))) bad = cli_int("--spec", v, 0, 64, &spec);
        else if ((v = cli_option(argc, argv, &i, "--max-requests")))
            bad = cli_int("--max-requests", v, 1, 4096, &max_req);
        else if ((v = cli_option(argc, argv, &i, "--prefill-budget")))
            bad = cli_int("--prefill-budget", v, 0, 1 << 20, &budget);
        else if ((v = cli_option(argc, argv, &i, "--stop"))) bad = cli_int("--stop", v, 0, 0x7fffffffL, &stop);
        else if (cli_sampling_option(argc, argv, &i, &s, &bad)) { /* into s; bad on a bad value */ }
        else if (cli_engine_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else if (cli_parallel_option(argc, argv, &i, &o, &bad)) { /* into o; bad on a bad value */ }
        else bad = cli_unexpected(argv[i]);
        if (bad) {
            fprintf(stderr, "k3c run: %s\n", cli_error());
            run_usage(stderr);
            return 2;
        }
    }
    if (cli_sampling_check(&s) || cli_parallel_finish(&o)) {
        fprintf(stderr, "k3c run: %s\n", cli_error());
        return 2;
    }
    int32_t **prompts = NULL;
    int *lens = NULL, n_prompts = 0;
    if (!prompts_s) {
        fprintf(stderr, "k3c run: --prompts is required\n");
        run_usage(stderr);
        return 2;
    }
    if (parse_prompts(prompts_s, &prompts, &lens, &n_prompts)) {
        fprintf(stderr, "k3c run: --prompts: %s\n", cli_error());
        run_usage(stderr);
        return 2;
    }
    int max_prompt = 0;
    for (int i = 0; i < n_prompts; i++)
        if (lens[i] > max_prompt) max_prompt = lens[i];
    int ctx = 0;
    if (cli_context(&o, max_prompt, n, "-n", &ctx)) {
        fprintf(stderr, "k3c run: %s\n", cli_error());
        for (int i = 0; i < n_prompts; i++) free(prompts[i]);
        free(prompts);
        free(lens);
        return 2;
    }

    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    k3c_runner *r = NULL;
    int rc = 1;
    if (cli_load_model(model, preset, 0, &m) != K3C_OK) goto fail;
    /* slots past the number of prompts would never be used: the memory plan reserves only those that can be */
    o.max_requests = (int)max_req < n_prompts ? (int)max_req : n_prompts;
    /* the runner never lets a verify write past where plain decoding would end: prompt + n - 1 tokens */
    o.max_context = ctx;
    o.q_max = (int)spec + 1 > o.q_max ? (int)spec + 1 : o.q_max;
    if (o.max_rows < (int)max_req * ((int)spec + 1)) o.max_rows = (int)max_req * ((int)spec + 1);
    if (k3c_engine_create(m, &o, &e) != K3C_OK) {
        cli_errorf("%d request%s, prompts of up to %d tokens, -n %ld: %s", o.max_requests,
                   o.max_requests == 1 ? "" : "s", max_prompt, n, k3c_last_error());
        goto fail;
    }
    if ((rc = cli_follow("run", e)) >= 0) goto done; /* a rank other than 0: rank 0 prints */
    rc = 1;
    cli_report_memory("run", e, o.device);
    k3c_runner_options ro;
    k3c_runner_options_default(&ro);
    ro.spec_tokens = (int)spec;
    ro.prefill_budget = (int)budget;
    if (k3c_runner_create(e, &ro, &r) != K3C_OK) goto fail;
    for (int i = 0; i < n_prompts; i++) {
        int h;
        k3c_runner_request q = {.prompt = prompts[i], .n_prompt = lens[i], .max_new = (int)n, .sampling = s,
                                .stop_token = (int32_t)stop};
        q.sampling.seed = s.seed + (uint64_t)i; /* independent draws per request, reproducible */
        if (k3c_runner_submit(r, &q, &h) != K3C_OK) goto fail;
    }
    if (k3c_runner_run(r) != K3C_OK) goto fail;
    for (int i = 0; i < n_prompts; i++) {
        const int32_t *t;
        int nt, fin;
        if (k3c_runner_output(r, i, &t, &nt, &fin) != K3C_OK) goto fail;
        printf("request %d (%d prompt tokens):", i, lens[i]);
        for (int k = 0; k < nt; k++) printf(" %d", t[k]);
        printf("\n");
    }
    if (cli_flush_stdout() != 0) goto fail;
    k3c_runner_stats st;
    k3c_runner_stats_get(r, &st);
    k3c_engine_stats es;
    k3c_engine_stats_get(e, &es);
    print_summary(&st, o.device, es.specialized, (int)spec);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "k3c run: %s\n", cli_error());
done:
    k3c_runner_free(r);
    k3c_engine_free(e);
    if (m) k3c_free(m);
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(lens);
    return rc;
}
