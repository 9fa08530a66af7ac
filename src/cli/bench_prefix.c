/* k3c bench --prefix N: time to first token through the serving scheduler of requests whose prompts start
 * with the same N-token system prompt (then a different 16-token user turn each), with prefix caching off,
 * on the first request (a miss: it leaves the MLA blocks and, at its prefix_hint, the KDA snapshot), and on
 * the requests after it (hits: the snapshot restored, the shared blocks referenced, only the user turn
 * prefilled). TTFT = from submit to the step that emits the request's first token, one request at a time,
 * after one warm-up request; medians over the rounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"

#define USER_TOKENS 16
#define NEW_TOKENS 4

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct one_run {
    double ttft;
    int cached;
    long prefill;
} one_run;

/* Runs one request to its end; its TTFT, cached_tokens and the prompt rows the scheduler computed for it. */
static int run_one(k3c_scheduler *s, const int32_t *prompt, int n, int hint, one_run *out) {
    k3c_scheduler_stats before, after;
    k3c_scheduler_stats_get(s, &before);
    k3c_sched_request q = {.prompt = prompt, .n_prompt = n, .max_new = NEW_TOKENS, .ignore_eos = 1,
                           .prefix_hint = hint};
    uint64_t id;
    double t0 = now_s();
    int rc = k3c_scheduler_submit(s, &q, &id);
    if (rc != 0) return rc > 0 ? cli_errorf("the scheduler's queue is full") : K3C_ERR;
    int busy = 1, first = 0, done = 0;
    while (busy) {
        const k3c_sched_event *ev;
        int n_ev;
        if (k3c_scheduler_step(s, &ev, &n_ev, &busy) != K3C_OK) return K3C_ERR;
        for (int i = 0; i < n_ev; i++) {
            if (ev[i].id != id) continue;
            if (ev[i].kind == K3C_SCHED_TOKEN && !first) {
                out->ttft = now_s() - t0;
                first = 1;
            }
            if (ev[i].kind == K3C_SCHED_FINISHED) {
                if (ev[i].finish != K3C_FINISH_LENGTH)
                    return cli_errorf("the request finished with reason %d: %s", ev[i].finish,
                                      ev[i].message ? ev[i].message : "");
                out->cached = ev[i].cached_tokens;
                done = 1;
            }
        }
    }
    if (!first || !done) return cli_errorf("the request ended without a token");
    k3c_scheduler_stats_get(s, &after);
    out->prefill = after.prefill_tokens - before.prefill_tokens;
    return K3C_OK;
}

static void report(const char *what, one_run *r, int n) {
    double t[64];
    long prefill = 0;
    int cached = 0;
    for (int i = 0; i < n; i++) t[i] = r[i].ttft, prefill += r[i].prefill, cached += r[i].cached;
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    printf("  %-30s TTFT %9.2f ms (median of %d; %.2f .. %.2f)  prefill %5ld tokens  cached %5d tokens\n", what,
           1e3 * t[n / 2], n, 1e3 * t[0], 1e3 * t[n - 1], prefill / n, cached / n);
}

int bench_prefix(const char *preset, const char *device, int threads, int prefix, int rounds) {
    if (rounds > 63) rounds = 63;
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    k3c_scheduler *s = NULL;
    int rc = K3C_ERR, n = prefix + USER_TOKENS;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
    one_run *runs = calloc((size_t)rounds + 1, sizeof *runs);
    if (!prompt || !runs) {
        cli_errorf("out of memory");
        goto done;
    }
    if (k3c_preset_has_weights(preset) ? cli_load_model(NULL, preset, 1, &m) != K3C_OK
                                       : k3c_model_synthesize_device(preset, 1, &m) != K3C_OK)
        goto done;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = device;
    o.threads = threads;
    o.max_requests = 2;
    o.max_rows = n < 2048 ? (n + 15) / 16 * 16 : 2048; /* a miss prefills in one or two chunks */
    o.max_context = n + NEW_TOKENS + 16;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) goto done;
    int V = k3c_engine_vocab(e);
    for (int i = 0; i < prefix; i++) prompt[i] = (int32_t)((i * 7919 + 13) % V);
    printf("prefix bench: %s on %s, system prompt %d tokens + user turn %d, %d new tokens, one request at a "
           "time\n", preset, device, prefix, USER_TOKENS, NEW_TOKENS);
    for (int pass = 0; pass < 2; pass++) {
        k3c_scheduler_options so;
        k3c_scheduler_options_default(&so);
        so.prefix_caching = pass;
        if (k3c_scheduler_create(e, &so, &s) != K3C_OK) goto done;
        for (int r = -1; r <= rounds; r++) { /* r = -1: warm-up on another system prompt */
            for (int i = 0; i < n; i++)
                if (r < 0 || i >= prefix) prompt[i] = (int32_t)(((i + 1) * 104729 + (r + 2) * 7) % V);
            if (r == 0)
                for (int i = 0; i < prefix; i++) prompt[i] = (int32_t)((i * 7919 + 13) % V);
            if ((r < 0 ? run_one(s, prompt, n, 0, &runs[0]) : run_one(s, prompt, n, prefix, &runs[r])) != K3C_OK)
                goto done;
        }
        if (!pass) {
            report("prefix caching off", runs + 1, rounds);
        } else {
            report("first request (a miss)", runs, 1);
            report("later requests (hits)", runs + 1, rounds);
        }
        k3c_scheduler_free(s);
        s = NULL;
    }
    rc = K3C_OK;
done:
    k3c_scheduler_free(s);
    k3c_engine_free(e);
    k3c_free(m);
    free(prompt);
    free(runs);
    return rc;
}
