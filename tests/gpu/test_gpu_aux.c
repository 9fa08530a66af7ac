/* The aux hidden-state streams (k3c_engine_options.aux_layers, k3c_engine_aux) on CUDA:
 *  - the specialized decode executor's streams bitwise equal to the stock path's on the same engine, for
 *    decode and verify shapes, on tiny and mini (every layer 0 .. num_layers tapped, bf16 activations: the
 *    production contract; the executor refuses the exact diagnostic);
 *  - the CUDA stock path's streams against the CPU backend's, f32 activations (exact_f32 on both) with every
 *    expert selected (no routing choice to flip), every row < 1e-4 rel L2: the tolerance of
 *    test_gpu_forward.c for logits (the backends differ only by f32 summation order).
 * The streams' semantics against the float64 reference: tests/test_aux.c (CPU). Fresh weights and tokens per
 * run (test_seed()); host outputs poisoned before every read. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode/executor_cuda.h"
#include "decode/prepared.h"
#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "runtime/engine_internal.h"
#include "../synth_preset.h"
#include "../test.h"
#include "util/error.h"
#include "util/rng.h"

#define F32_THR 1e-4

typedef struct aenv {
    char dir[512];
    k3c_model *m;
    int L, D, V, na, aux[K3C_MAX_AUX];
} aenv;

static int aenv_open(aenv *a, const char *preset, int dense_routing) {
    memset(a, 0, sizeof *a);
    snprintf(a->dir, sizeof a->dir, "%s/gpuaux-%s%s", test_tmpdir(), preset, dense_routing ? "-dense" : "");
    K3C_TRY(test_synth_preset(preset, dense_routing, test_seed() ^ k3c_hash_str(preset), a->dir));
    K3C_TRY(k3c_load(a->dir, &a->m));
    a->L = a->m->config.num_layers;
    a->D = a->m->config.hidden_size;
    a->V = a->m->config.vocab_size;
    a->na = a->L + 1 <= K3C_MAX_AUX ? a->L + 1 : K3C_MAX_AUX;
    /* every layer when they fit, else the first ones and the output */
    for (int j = 0; j < a->na; j++) a->aux[j] = j;
    a->aux[a->na - 1] = a->L;
    return K3C_OK;
}

static int make_engine(aenv *a, const char *device, int exact, int max_requests, k3c_engine **out) {
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = device;
    o.threads = 2;
    o.max_requests = max_requests;
    o.max_rows = 64;
    o.max_context = 256;
    o.block_size = 16;
    o.q_max = 8;
    o.exact_f32 = exact;
    o.aux_layers = a->aux;
    o.num_aux = a->na;
    return k3c_engine_create(a->m, &o, out);
}

/* All streams of the engine's last step into out [na][rows][D]; checks the row count. */
static int read_streams(aenv *a, k3c_engine *e, int rows, float *out) {
    size_t n = (size_t)rows * a->D;
    poison_f32(out, (size_t)a->na * n);
    for (int j = 0; j < a->na; j++) {
        int r = -1;
        K3C_TRY(k3c_engine_aux(e, j, out + j * n, &r));
        if (r != rows) return k3c_errorf("aux stream %d: %d rows, expected %d", j, r, rows);
    }
    return K3C_OK;
}

static long executor_steps(const k3c_engine *e) {
    k3c_engine_stats st;
    k3c_engine_stats_get(e, &st);
    return st.executor_steps;
}

/* One step the engine must route to its executor (an error when it ran stock). */
static int exec_step(k3c_engine *e, k3c_step_item *items, int n, float *logits) {
    long before = executor_steps(e);
    K3C_TRY(k3c_engine_set_specialized(e, 1));
    K3C_TRY(k3c_engine_step(e, items, n, logits));
    if (executor_steps(e) != before + 1)
        return k3c_errorf("step of %d x %d ran stock (planned %s)", n, items[0].n,
                          k3c_route_name(k3c_engine_last_plan(e).route));
    return K3C_OK;
}

/* One step on the engine's stock forward. */
static int stock_step(k3c_engine *e, k3c_step_item *items, int n, float *logits) {
    K3C_TRY(k3c_engine_set_specialized(e, 0));
    return k3c_engine_step(e, items, n, logits);
}

/* Executor vs stock on one engine: b requests of q rows each, two sets with the same prompts. */
static void check_exec(const char *preset) {
    aenv a;
    CHECKF(aenv_open(&a, preset, 0) == K3C_OK, "%s: %s", preset, k3c_error_message());
    k3c_engine *e = NULL;
    CHECK_OK(make_engine(&a, "cuda", 0, 8, &e));
    CHECK_OK(k3c_engine_warmup(e)); /* every prepared shape captured now */
    static const int shapes[][2] = {{1, 1}, {4, 1}, {2, 2}, {1, 4}, {2, 4}}; /* (b, q) */
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(preset) ^ 0xa11);
    size_t V = a.V, D = a.D, na = a.na;
    float *lg = malloc(sizeof(float) * 64 * V), *sa = malloc(sizeof(float) * na * 64 * D);
    float *sb = malloc(sizeof(float) * na * 64 * D);
    CHECK(lg && sa && sb);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int b = shapes[si][0], q = shapes[si][1], T = b * q;
        CHECK(k3c_prepared_shape(T, q, 8, 8));
        int ids[8];
        int32_t prompt[24], tok[64];
        int n = 5 + (int)(k3c_rng_next(&r) % 16);
        for (int i = 0; i < b; i++) {
            for (int j = 0; j < n; j++) prompt[j] = (int32_t)(k3c_rng_next(&r) % V);
            for (int s = 0; s < 2; s++) {
                CHECK_OK(k3c_request_open(e, &ids[s * b + i]));
                k3c_step_item it = {.request = ids[s * b + i], .tokens = prompt, .n = n};
                CHECK_OK(stock_step(e, &it, 1, lg));
            }
        }
        for (int t = 0; t < T; t++) tok[t] = (int32_t)(k3c_rng_next(&r) % V);
        k3c_step_item ia[8], ib[8];
        for (int i = 0; i < b; i++) {
            ia[i] = (k3c_step_item){.request = ids[i], .tokens = tok + i * q, .n = q, .verify = q > 1};
            ib[i] = (k3c_step_item){.request = ids[b + i], .tokens = tok + i * q, .n = q, .verify = q > 1};
        }
        CHECK_OK(stock_step(e, ia, b, lg));
        CHECK_OK(read_streams(&a, e, T, sa));
        CHECK_OK(exec_step(e, ib, b, lg));
        CHECK_OK(read_streams(&a, e, T, sb));
        int equal = 0;
        for (size_t j = 0; j < na; j++) equal += !memcmp(sa + j * T * D, sb + j * T * D, sizeof(float) * T * D);
        double worst = 0;
        for (size_t j = 0; j < na; j++)
            worst = fmax(worst, rel_l2_f32f32(sb + j * T * D, sa + j * T * D, (size_t)T * D));
        printf("INFO aux %s b=%d q=%d: %d of %zu streams bitwise equal to stock (worst rel L2 %.3g)\n", preset, b, q,
               equal, na, worst);
        CHECKF(equal == (int)na, "%s b=%d q=%d: %zu of %zu aux streams differ from stock", preset, b, q,
               na - (size_t)equal, na);
        for (int i = 0; i < 2 * b; i++) CHECK_OK(k3c_request_close(e, ids[i])); /* a pending verify too */
    }
    free(lg), free(sa), free(sb);
    k3c_engine_free(e);
    k3c_free(a.m);
}

TEST(gpu_aux_executor_tiny) { check_exec("tiny"); }
TEST(gpu_aux_executor_mini) { check_exec("mini"); }

/* CUDA stock vs CPU stock, f32 activations, dense routing: a prefill returning every row, then decodes. */
static void check_vs_cpu(const char *preset) {
    aenv a;
    CHECKF(aenv_open(&a, preset, 1) == K3C_OK, "%s: %s", preset, k3c_error_message());
    k3c_engine *eg = NULL, *ec = NULL;
    CHECK_OK(make_engine(&a, "cuda", 1, 2, &eg));
    CHECK_OK(make_engine(&a, "cpu", 1, 2, &ec));
    size_t V = a.V, D = a.D, na = a.na;
    int n = 24;
    float *lg = malloc(sizeof(float) * n * V), *sg = malloc(sizeof(float) * na * n * D);
    float *sc = malloc(sizeof(float) * na * n * D);
    CHECK(lg && sg && sc);
    int32_t tok[32];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(preset) ^ 0xc9);
    for (int i = 0; i < 32; i++) tok[i] = (int32_t)(k3c_rng_next(&r) % V);
    int ig, ic;
    CHECK_OK(k3c_request_open(eg, &ig));
    CHECK_OK(k3c_request_open(ec, &ic));
    double worst = 0;
    for (int step = 0; step < 5; step++) {
        int pos = step == 0 ? 0 : n + step - 1, cnt = step == 0 ? n : 1;
        k3c_step_item it = {.request = ig, .tokens = tok + pos, .n = cnt, .all_logits = 1};
        CHECK_OK(k3c_engine_step(eg, &it, 1, lg));
        it.request = ic;
        CHECK_OK(k3c_engine_step(ec, &it, 1, lg));
        CHECK_OK(read_streams(&a, eg, cnt, sg));
        CHECK_OK(read_streams(&a, ec, cnt, sc));
        for (size_t j = 0; j < na; j++)
            for (int i = 0; i < cnt; i++) {
                size_t o = (j * cnt + i) * D;
                double e = rel_l2_f32f32(sg + o, sc + o, D);
                CHECKF(e < F32_THR, "%s step %d stream %zu (layer %d) row %d: rel L2 %.3g vs the CPU", preset, step,
                       j, a.aux[j], i, e);
                if (!(e <= worst)) worst = e;
            }
    }
    printf("INFO aux %s cuda vs cpu (f32, k = E): %zu streams, worst row rel L2 %.3g\n", preset, na, worst);
    printf("METRIC aux_%-24s rel_l2 %8.1e %10.3e\n", preset, F32_THR, worst);
    free(lg), free(sg), free(sc);
    k3c_engine_free(eg);
    k3c_engine_free(ec);
    k3c_free(a.m);
}

TEST(gpu_aux_vs_cpu_tiny) { check_vs_cpu("tiny"); }
TEST(gpu_aux_vs_cpu_mini) { check_vs_cpu("mini"); }
TEST(gpu_aux_vs_cpu_kimi_linear_tiny) { check_vs_cpu("kimi-linear-tiny"); }
