/* The stock forward on the CPU backend, through the engine API, against the float64 reference (tests/ref)
 * and against itself (chunked vs recurrent KDA, batched vs alone, verify + commit vs plain decode, reused
 * cache blocks), plus the transformers oracle (tests/fixtures/kimi_linear_hf).
 *
 * Tolerances: the engine stores activations in bf16 (stock/forward.c), the reference is exact float64 of
 * the same bf16 weights, so each logits row is compared by relative L2 error; measured on tiny and
 * tiny-grouped it is about 3e-3 .. 8e-3 per row, asserted < 2e-2. Top-1 must agree except where the
 * reference's own top-2 margin is below 1% of the row's logit scale (a near-tie bf16 noise may flip). */
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "ref/ref_forward.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

#define FIXTURE "tests/fixtures/kimi_linear_hf"

typedef struct fwd_env {
    char dir[512];
    k3c_model *m;
    ref_model *ref;
    int V;
} fwd_env;

/* Synthesizes `preset` with a fresh seed and loads it (engine model and, if want_ref, the reference). */
/* dense_routing: every expert selected (k = E, all groups kept), so no discrete routing decision exists
 * that bf16 noise could flip. */
static int env_open_cfg(fwd_env *e, const char *preset, int want_ref, int dense_routing) {
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "%s/fwd-%s%s", test_tmpdir(), preset, dense_routing ? "-dense" : "");
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    if (dense_routing) {
        c.num_experts_per_token = c.num_experts;
        c.topk_group = c.num_expert_group;
    }
    int rc = k3c_synth_write(&c, dense_routing ? NULL : preset, test_seed(), e->dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    K3C_TRY(k3c_load(e->dir, &e->m));
    e->V = e->m->config.vocab_size;
    if (want_ref) K3C_TRY(ref_model_open(e->dir, &e->ref));
    return K3C_OK;
}

static int env_open(fwd_env *e, const char *preset, int want_ref) { return env_open_cfg(e, preset, want_ref, 0); }

static void env_close(fwd_env *e) {
    if (e->ref) ref_model_free(e->ref);
    if (e->m) k3c_free(e->m);
}

static int make_engine_x(fwd_env *env, int chunk_min, int exact, int poison, k3c_engine **out) {
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 2;
    o.max_rows = 64;
    o.max_context = 128;
    o.block_size = 4; /* small blocks: every test crosses block boundaries */
    o.q_max = 6;
    o.chunk_min = chunk_min;
    o.exact_f32 = exact;
    o.poison_freed_blocks = poison;
    return k3c_engine_create(env->m, &o, out);
}

static int make_engine(fwd_env *env, int chunk_min, k3c_engine **out) { return make_engine_x(env, chunk_min, 0, 0, out); }

static void random_ids(uint64_t seed, int V, int n, int32_t *ids) {
    k3c_rng r;
    k3c_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
}

/* Compares rows [0, n) of logits with ref (float64); returns worst rel L2, counts top-1 disagreements that
 * are not near-ties. */
static double last_mean_err;
/* top-2 margin, relative to the row's logit rms, below which a top-1 flip counts as a near-tie */
static double near_tie = 0.01;
static double compare_ref(const float *lg, const double *ref, int n, int V, int *bad_top1, int *ties) {
    double worst = 0;
    last_mean_err = 0;
    *bad_top1 = 0;
    *ties = 0;
    for (int i = 0; i < n; i++) {
        const float *x = lg + (size_t)i * V;
        const double *r = ref + (size_t)i * V;
        double e = rel_l2_f32(x, r, (size_t)V);
        if (!(e <= worst)) worst = e;
        last_mean_err += e / n;
        int ax = 0, ar = 0, ar2 = -1;
        double scale = 0;
        for (int v = 0; v < V; v++) {
            if (x[v] > x[ax]) ax = v;
            if (r[v] > r[ar]) ar = v;
            scale += r[v] * r[v];
        }
        for (int v = 0; v < V; v++)
            if (v != ar && (ar2 < 0 || r[v] > r[ar2])) ar2 = v;
        scale = sqrt(scale / V);
        if (ax != ar) {
            if (r[ar] - r[ar2] < near_tie * scale) (*ties)++;
            else (*bad_top1)++;
        }
    }
    return worst;
}

/* Prefill of ids[0..n) in the given chunk sizes (summing to n), all logits, on a fresh request. */
static int run_chunks(k3c_engine *eng, const int32_t *ids, const int *chunks, int nchunks, int V, float *lg) {
    int id, done = 0;
    K3C_TRY(k3c_request_open(eng, &id));
    for (int c = 0; c < nchunks; c++) {
        k3c_step_item it = {.request = id, .tokens = ids + done, .n = chunks[c], .all_logits = 1};
        K3C_TRY(k3c_engine_step(eng, &it, 1, lg + (size_t)done * V));
        done += chunks[c];
    }
    return k3c_request_close(eng, id);
}

/* Every plan (one prefill, chunked prefill, token by token, prefill + decode) against the reference.
 * exact: f32 activations, tolerance tol; else bf16 activations. */
static void check_vs_ref(const char *preset, int dense_routing, int exact, double tol) {
    fwd_env env;
    CHECKF(env_open_cfg(&env, preset, 1, dense_routing) == K3C_OK, "%s: %s", preset, k3c_error_message());
    int V = env.V, n = 20;
    int32_t ids[20];
    int iids[20];
    random_ids(test_seed() ^ 0x51, V, n, ids);
    for (int i = 0; i < n; i++) iids[i] = ids[i];
    double *ref = malloc(sizeof(double) * n * V);
    float *lg = malloc(sizeof(float) * n * V);
    CHECK(ref && lg);
    CHECK_OK(ref_logits(env.ref, iids, n, ref));
    k3c_engine *eng;
    CHECK_OK(make_engine_x(&env, 0, exact, 0, &eng));
    near_tie = exact ? 1e-4 : 0.1;

    struct { const char *name; int chunks[20]; int nchunks; } plans[] = {
        {"prefill", {20}, 1},
        {"chunked prefill 7+9+4", {7, 9, 4}, 3},
        {"token by token", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 20},
        {"prefill 12 + decode", {12, 1, 1, 1, 1, 1, 1, 1, 1}, 9},
    };
    for (size_t p = 0; p < sizeof plans / sizeof plans[0]; p++) {
        poison_f32(lg, (size_t)n * V);
        CHECK_OK(run_chunks(eng, ids, plans[p].chunks, plans[p].nchunks, V, lg));
        int bad, ties;
        double worst = compare_ref(lg, ref, n, V, &bad, &ties);
        printf("    %s%s %s %s: row rel L2 mean %.3g worst %.3g, top-1 mismatches %d (+%d near-ties)\n", preset,
               dense_routing ? " (k = E)" : "", exact ? "f32" : "bf16", plans[p].name, last_mean_err, worst, bad,
               ties);
        CHECKF(worst < tol, "%s %s: rel L2 %.3g >= %.3g", preset, plans[p].name, worst, tol);
        CHECKF(last_mean_err < tol / 2, "%s %s: mean rel L2 %.3g >= %.3g", preset, plans[p].name, last_mean_err,
               tol / 2);
        CHECKF(bad == 0, "%s %s: %d top-1 mismatches", preset, plans[p].name, bad);
    }
    k3c_engine_free(eng);
    free(ref), free(lg);
    env_close(&env);
}

/* The math, far below bf16 noise: f32 activations against float64. */
TEST(forward_tiny_f32_vs_ref) { check_vs_ref("tiny", 0, 1, 1e-4); }
TEST(forward_tiny_grouped_f32_vs_ref) { check_vs_ref("tiny-grouped", 0, 1, 1e-4); }
TEST(forward_kimi_linear_tiny_f32_vs_ref) { check_vs_ref("kimi-linear-tiny", 0, 1, 1e-4); }
/* The bf16 contract: with every expert selected no expert choice can flip, so the error is bf16 noise. */
TEST(forward_tiny_bf16_vs_ref) { check_vs_ref("tiny", 1, 0, 8e-2); }
TEST(forward_tiny_grouped_bf16_vs_ref) { check_vs_ref("tiny-grouped", 1, 0, 8e-2); }
TEST(forward_kimi_linear_tiny_bf16_vs_ref) { check_vs_ref("kimi-linear-tiny", 1, 0, 8e-2); }
