/* CPU seconds of prefill and decode on one CPU thread (process CPU time, so a loaded machine distorts it far
 * less than wall time), through the public API only, so that the same file builds against any revision's
 * library to compare two of them:
 *   cc -O2 -std=gnu11 -Iinclude tools/cpu_step_cost.c build/libk3c.a -lcjson -lm -pthread -o build/cpu_step_cost
 *   build/cpu_step_cost MODEL_DIR PROMPT_TOKENS [DECODE_TOKENS=64] [REPS=5]
 * (a CUDA-enabled libk3c.a also needs the CUDA link flags of the Makefile's LDLIBS). Prints the best of REPS
 * for prefill (k3c_generate with max_new 1: the prompt in k3c_generate's own chunks) and decode
 * (DECODE_TOKENS greedy decode steps after the prompt), as tokens per CPU second. Prompt ids: a fixed pseudo-random
 * sequence. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "k3c.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR PROMPT_TOKENS [DECODE_TOKENS=64] [REPS=5]\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[2]), dec = argc > 3 ? atoi(argv[3]) : 64, reps = argc > 4 ? atoi(argv[4]) : 5;
    if (n < 1 || dec < 1 || reps < 1) {
        fprintf(stderr, "bad PROMPT_TOKENS %d, DECODE_TOKENS %d or REPS %d\n", n, dec, reps);
        return 2;
    }
    k3c_model *m;
    k3c_engine *e;
    if (k3c_load(argv[1], &m)) {
        fprintf(stderr, "%s\n", k3c_last_error());
        return 1;
    }
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 1;
    o.max_requests = 1;
    o.max_context = n + dec + 8;
    if (k3c_engine_create(m, &o, &e)) {
        fprintf(stderr, "%s\n", k3c_last_error());
        return 1;
    }
    int V = k3c_engine_vocab(e);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)V);
    }
    k3c_sampling g = {.top_p = 1};
    float *lg = malloc(sizeof(float) * (size_t)V);
    double best_p = 1e30, best_d = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_s();
        if (k3c_generate(e, ids, n, 1, &g, NULL, NULL, NULL)) break;
        double p = cpu_s() - t0;
        if (p < best_p) best_p = p;
        /* decode alone: the prompt fed untimed (whole max_rows chunks), then dec greedy steps */
        int id;
        if (k3c_request_open(e, &id)) break;
        for (int done = 0; done < n;) {
            int c = n - done < k3c_engine_max_rows(e) ? n - done : k3c_engine_max_rows(e);
            k3c_step_item it = {.request = id, .tokens = ids + done, .n = c};
            if (k3c_engine_step(e, &it, 1, lg)) return 1;
            done += c;
        }
        double t1 = cpu_s();
        for (int i = 0; i < dec; i++) {
            int32_t tok = k3c_greedy_token(lg, V);
            k3c_step_item it = {.request = id, .tokens = &tok, .n = 1};
            if (k3c_engine_step(e, &it, 1, lg)) return 1;
        }
        double d = cpu_s() - t1;
        if (d < best_d) best_d = d;
        k3c_request_close(e, id);
    }
    free(lg);
    printf("prompt %d: prefill %.1f tokens/CPU-s, decode %.1f tokens/CPU-s (best of %d, 1 thread)\n", n,
           n / best_p, dec / best_d, reps);
    free(ids);
    k3c_engine_free(e);
    k3c_free(m);
    return 0;
}
