/* k3c bench --device cpu's decode and prefill rows for any checkpoint folder (bench itself synthesizes the
 * tiny and mini presets only), through the public API, for tools/llama-cpu-compare.sh:
 *   cc -O2 -std=gnu11 -Iinclude tools/cpu_bench_model.c build/libk3c.a -lcjson -lpcre2-8 -lm -pthread \
 *      -o build/cpu_bench_model
 *   build/cpu_bench_model MODEL_DIR THREADS [PREFILL=256,1024] [REPS=2] [STEPS=32]
 * (a CUDA-enabled libk3c.a also needs the CUDA link flags of the Makefile's LDLIBS). Measured as
 * src/cli/cmd_bench.c measures: decode is STEPS greedy steps (after a 16-token prompt and one warm-up step),
 * wall time; a prefill row is a prompt of N tokens into a fresh request in steps of at most
 * k3c_engine_max_rows tokens, logits of the last row, best of REPS; the prompt ids are bench's
 * ((i * 7919 + 13) mod vocab). MFLOP/token is bench's count: 2 flops per matrix weight a prompt token
 * multiplies (params_active less the LM head; routed experts at k/E; attention, the delta rule and the
 * elementwise ops not counted). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k3c.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(const char *what) {
    fprintf(stderr, "cpu_bench_model: %s: %s\n", what, k3c_last_error());
    return 1;
}

/* Seconds of one prompt of n tokens into a fresh request, < 0 on error; *cpu: process CPU seconds. */
static double prefill_once(k3c_engine *e, const int32_t *ids, int n, float *lg, double *cpu) {
    int id = -1, chunk = k3c_engine_max_rows(e);
    if (k3c_request_open(e, &id) != K3C_OK) return -1;
    double t = now_s(), c = cpu_s();
    for (int p = 0; p < n; p += chunk) {
        k3c_step_item it = {.request = id, .tokens = ids + p, .n = n - p < chunk ? n - p : chunk};
        if (k3c_engine_step(e, &it, 1, lg) != K3C_OK) {
            k3c_request_close(e, id);
            return -1;
        }
    }
    t = now_s() - t;
    *cpu = cpu_s() - c;
    k3c_request_close(e, id);
    return t;
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 6) {
        fprintf(stderr, "usage: %s MODEL_DIR THREADS [PREFILL=256,1024] [REPS=2] [STEPS=32]\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[2]), reps = argc > 4 ? atoi(argv[4]) : 2, steps = argc > 5 ? atoi(argv[5]) : 32;
    int lens[16], nlens = 0, longest = 16;
    char list[256];
    snprintf(list, sizeof list, "%s", argc > 3 ? argv[3] : "256,1024");
    for (char *s = strtok(list, ","); s; s = strtok(NULL, ",")) {
        int n = atoi(s);
        if (n < 1 || n > (1 << 20) || nlens == 16) {
            fprintf(stderr, "cpu_bench_model: PREFILL '%s': up to 16 lengths of 1 to %d tokens\n", argv[3], 1 << 20);
            return 2;
        }
        lens[nlens++] = n;
        if (n > longest) longest = n;
    }
    if (threads < 1 || reps < 1 || steps < 1) {
        fprintf(stderr, "cpu_bench_model: THREADS %d, REPS %d and STEPS %d must be at least 1\n", threads, reps, steps);
        return 2;
    }
    k3c_model *m;
    if (k3c_load(argv[1], &m) != K3C_OK) return fail(argv[1]);
    k3c_model_info f;
    if (k3c_model_info_get(m, &f) != K3C_OK) return fail("model info");
    double flops_tok = 2.0 * (f.params_active - (double)f.vocab_size * f.hidden_size);
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = "cpu";
    o.threads = threads;
    o.max_requests = 1;
    o.max_context = longest + steps + 1;
    k3c_engine *e;
    if (k3c_engine_create(m, &o, &e) != K3C_OK) return fail("engine");
    int V = k3c_engine_vocab(e);
    float *lg = malloc(sizeof(float) * V);
    int32_t *ids = malloc(sizeof(int32_t) * longest);
    if (!lg || !ids) {
        fprintf(stderr, "cpu_bench_model: out of memory\n");
        return 1;
    }
    for (int i = 0; i < longest; i++) ids[i] = (int32_t)((i * 7919 + 13) % V);
    printf("model %s: %s, %.1f M parameters, %.1f M active per token, %.1f MFLOP/token (bench's count), "
           "%d threads\n",
           argv[1], f.family, f.params_total / 1e6, f.params_active / 1e6, flops_tok / 1e6, threads);
    int id;
    if (k3c_request_open(e, &id) != K3C_OK) return fail("request");
    k3c_step_item it = {.request = id, .tokens = ids, .n = 16};
    if (k3c_engine_step(e, &it, 1, lg) != K3C_OK) return fail("prompt");
    double t = 0;
    for (int s = 0; s <= steps; s++) {
        int32_t tok = argmax(lg, V);
        k3c_step_item d = {.request = id, .tokens = &tok, .n = 1};
        double t0 = now_s();
        if (k3c_engine_step(e, &d, 1, lg) != K3C_OK) return fail("decode");
        if (s > 0) t += now_s() - t0;
    }
    k3c_request_close(e, id);
    printf("decode  %5d steps  %8.3f ms/token (%7.1f tok/s)\n", steps, 1e3 * t / steps, steps / t);
    fflush(stdout);
    for (int i = 0; i < nlens; i++) {
        double best = -1, best_cpu = 0;
        for (int r = 0; r < reps; r++) {
            double cpu, s = prefill_once(e, ids, lens[i], lg, &cpu);
            if (s < 0) return fail("prefill");
            if (best < 0 || s < best) best = s, best_cpu = cpu;
        }
        double tps = lens[i] / best;
        printf("prefill %5d tokens %8.1f ms (%7.1f tok/s)  %7.1f MFLOP/tok -> %6.1f GFLOP/s   [process cpu %.2f s]\n",
               lens[i], 1e3 * best, tps, flops_tok / 1e6, tps * flops_tok / 1e9, best_cpu);
        fflush(stdout);
    }
    free(lg);
    free(ids);
    k3c_engine_free(e);
    k3c_free(m);
    return 0;
}
