/* Batch invariance on the CUDA backend (docs/DESIGN.md, "Batch invariance"), the GPU side of
 * tests/test_invariance.c: a request's greedy stream alone (runner, one request at a time, stock) against
 *   - the runner with every request at once, without and with speculation (spec 3), and two at a time with
 *     spec 2 and a prefill budget of 1.5 grids, each on the stock path and with the specialized executor;
 *   - k3c_engine_step directly, the prompt cut into random pieces where k3c_engine_prompt_piece allows,
 *     then decoded one token a step.
 * The shared policy (stock/forward.c: KDA and MLA forms chosen per row on the aligned grid; runtime: cuts on
 * the grid) holds on CUDA too, but several CUDA kernels compute a row differently with the step's shape
 * (DESIGN.md lists them: the GEMV / tensor-core / cuBLASLt split by row count, the MoE kernel choice by pair
 * count, the MLA head-group form, the expanded form's decompression through cuBLASLt). So:
 *   - bf16 (the release path, stock and executor): every comparison's count of differing streams is printed
 *     (INFO), not asserted; K3C_GPU_INVARIANCE_STRICT=1 asserts 0, for when those kernels are made invariant;
 *   - f32 (exact_f32, stock only: the executor refuses the diagnostic): asserted: every stream equals the
 *     alone one, or parts from it at a greedy near-tie (the two tokens' logits within NEAR_TIE, recomputed
 *     by one prefill of prompt + common prefix), which is what f32 summation-order noise can do.
 * Fresh weights and prompts per run (test_seed()). Run: build/test_gpu gpu_invariance */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "runtime/runner.h"
#include "../synth_preset.h"
#include "../test.h"
#include "util/error.h"
#include "util/rng.h"

#define GI_NREQ 4
#define GI_MAXNEW 16
#define NEAR_TIE 1e-3f

typedef struct genv {
    char dir[512];
    k3c_model *m;
    k3c_engine *e;
    int V, exact;
    int lens[GI_NREQ];
    int32_t *prompt[GI_NREQ];
    int32_t alone[GI_NREQ][GI_MAXNEW];
} genv;

static void genv_close(genv *g) {
    k3c_engine_free(g->e);
    if (g->m) k3c_free(g->m);
    for (int i = 0; i < GI_NREQ; i++) free(g->prompt[i]);
    memset(g, 0, sizeof *g);
}

/* layers > 0: the preset's first `layers` layers, device-synthetic weights (no checkpoint). */
static int genv_open(genv *g, const char *preset, int layers, int exact, uint64_t seed) {
    memset(g, 0, sizeof *g);
    g->exact = exact;
    if (layers > 0) {
        k3c_config c;
        K3C_TRY(k3c_preset_config(preset, &c));
        if (layers < c.num_layers) c.num_layers = layers;
        int rc = k3c_model_synthetic(&c, seed, &g->m);
        k3c_config_free(&c);
        K3C_TRY(rc);
    } else {
        snprintf(g->dir, sizeof g->dir, "%s/gpuinv-%s", test_tmpdir(), preset);
        K3C_TRY(test_synth_preset(preset, 0, seed, g->dir));
        K3C_TRY(k3c_load(g->dir, &g->m));
    }
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = "cuda";
    o.max_requests = GI_NREQ + 1;
    o.max_rows = 256;
    o.max_context = 512;
    o.block_size = 16;
    o.q_max = 4;
    o.exact_f32 = exact;
    /* the engine owns the executor (bf16 only: it refuses the f32 diagnostic); runs switch it on and off */
    o.specialized = exact ? K3C_SPECIALIZED_OFF : K3C_SPECIALIZED_AUTO;
    K3C_TRY(k3c_engine_create(g->m, &o, &g->e));
    g->V = k3c_engine_vocab(g->e);
    /* on the default grid (C = 64, E = 128): two whole blocks and a ragged tail, one block and 3 rows, no
     * whole block, a few tokens */
    static const int lens[GI_NREQ] = {200, 131, 40, 9};
    k3c_rng r;
    k3c_rng_seed(&r, seed ^ 0x9a1);
    for (int i = 0; i < GI_NREQ; i++) {
        g->lens[i] = lens[i];
        g->prompt[i] = malloc(sizeof(int32_t) * (size_t)lens[i]);
        if (!g->prompt[i]) return k3c_errorf("out of memory");
        for (int t = 0; t < lens[i]; t++) g->prompt[i][t] = (int32_t)(k3c_rng_next(&r) % (uint64_t)g->V);
    }
    return K3C_OK;
}

static int run_runner(genv *g, int spec, int budget, int max_active, int executor, int32_t out[GI_NREQ][GI_MAXNEW]) {
    k3c_runner_options o;
    k3c_runner_options_default(&o);
    o.spec_tokens = spec;
    o.prefill_budget = budget;
    o.max_active = max_active;
    k3c_runner *r;
    if (!g->exact) K3C_TRY(k3c_engine_set_specialized(g->e, executor));
    K3C_TRY(k3c_runner_create(g->e, &o, &r));
    int rc = K3C_OK, h[GI_NREQ];
    for (int i = 0; i < GI_NREQ && rc == K3C_OK; i++) {
        k3c_runner_request q = {.prompt = g->prompt[i], .n_prompt = g->lens[i], .max_new = GI_MAXNEW,
                                .sampling = {.top_p = 1}, .stop_token = -1};
        rc = k3c_runner_submit(r, &q, &h[i]);
    }
    if (rc == K3C_OK) rc = k3c_runner_run(r);
    for (int i = 0; i < GI_NREQ && rc == K3C_OK; i++) {
        const int32_t *t;
        int n, fin;
        rc = k3c_runner_output(r, h[i], &t, &n, &fin);
        if (rc == K3C_OK && (n != GI_MAXNEW || !fin)) rc = k3c_errorf("request %d: %d tokens, finished %d", i, n, fin);
        if (rc == K3C_OK) memcpy(out[i], t, sizeof(int32_t) * GI_MAXNEW);
    }
    k3c_runner_free(r);
    return rc;
}

/* Each request alone through k3c_engine_step: the prompt in random pieces k3c_engine_prompt_piece allows
 * (budgets of one grid .. max_rows), then one decode step per token. */
static int run_splits(genv *g, uint64_t seed, int32_t out[GI_NREQ][GI_MAXNEW]) {
    k3c_rng r;
    k3c_rng_seed(&r, seed);
    int grid = k3c_engine_prompt_grid(g->e), max_rows = k3c_engine_max_rows(g->e), rc = K3C_OK;
    float *lg = malloc(sizeof(float) * (size_t)g->V);
    if (!lg) return k3c_errorf("out of memory");
    for (int i = 0; i < GI_NREQ && rc == K3C_OK; i++) {
        int id;
        rc = k3c_request_open(g->e, &id);
        for (int done = 0; rc == K3C_OK && done < g->lens[i];) {
            int budget = grid + (int)(k3c_rng_next(&r) % (uint64_t)(max_rows - grid + 1));
            int n = k3c_engine_prompt_piece(g->e, done, g->lens[i], budget);
            k3c_step_item it = {.request = id, .tokens = g->prompt[i] + done, .n = n};
            rc = n > 0 ? k3c_engine_step(g->e, &it, 1, lg) : k3c_errorf("no prompt piece at %d", done);
            done += n;
        }
        for (int t = 0; rc == K3C_OK && t < GI_MAXNEW; t++) {
            out[i][t] = k3c_greedy_token(lg, g->V);
            k3c_step_item it = {.request = id, .tokens = &out[i][t], .n = 1};
            if (t + 1 < GI_MAXNEW) rc = k3c_engine_step(g->e, &it, 1, lg);
        }
        k3c_request_close(g->e, id);
    }
    free(lg);
    return rc;
}

/* 0 when stream `got` of request i equals the alone one; 1 when it parts at a near-tie (f32 noise); 2 when it
 * parts elsewhere. The near-tie check recomputes the parting step's logits from one prefill. */
static int compare(genv *g, int i, const int32_t *got, float *gap_out) {
    int t = 0;
    while (t < GI_MAXNEW && got[t] == g->alone[i][t]) t++;
    if (t == GI_MAXNEW) return 0;
    int len = g->lens[i] + t, id, verdict = 2;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)len);
    float *lg = malloc(sizeof(float) * (size_t)g->V);
    if (ids && lg && k3c_request_open(g->e, &id) == K3C_OK) {
        memcpy(ids, g->prompt[i], sizeof(int32_t) * (size_t)g->lens[i]);
        memcpy(ids + g->lens[i], g->alone[i], sizeof(int32_t) * (size_t)t);
        int rc = K3C_OK;
        for (int done = 0; rc == K3C_OK && done < len;) {
            int n = k3c_engine_prompt_piece(g->e, done, len, k3c_engine_max_rows(g->e));
            k3c_step_item it = {.request = id, .tokens = ids + done, .n = n};
            rc = k3c_engine_step(g->e, &it, 1, lg);
            done += n;
        }
        k3c_request_close(g->e, id);
        if (rc == K3C_OK) {
            float gap = lg[g->alone[i][t]] - lg[got[t]];
            *gap_out = gap;
            verdict = fabsf(gap) < NEAR_TIE ? 1 : 2;
        }
    }
    k3c_error_clear();
    free(ids), free(lg);
    return verdict;
}

static void run_case(const char *preset, int layers, int exact) {
    genv g;
    uint64_t seed = test_seed() ^ k3c_hash_str(preset) ^ (uint64_t)exact;
    int rc = genv_open(&g, preset, layers, exact, seed);
    CHECKF(rc == K3C_OK, "%s: %s", preset, k3c_error_message());
    const char *mode = exact ? "f32" : "bf16";
    int strict = !exact && getenv("K3C_GPU_INVARIANCE_STRICT") && atoi(getenv("K3C_GPU_INVARIANCE_STRICT"));
    int grid = k3c_engine_prompt_grid(g.e);
    printf("INFO gpu_invariance %s %s: prompt grid %d\n", preset, mode, grid);
    CHECK_OK(run_runner(&g, 0, 0, 1, 0, g.alone));
    struct {
        const char *what;
        int spec, budget, max_active, executor;
    } runs[] = {
        {"stock, every request at once", 0, 0, 0, 0},
        {"stock, every request at once, spec 3", 3, 0, 0, 0},
        {"stock, 2 at a time, spec 2, budget 1.5 grids", 2, grid + grid / 2, 2, 0},
        {"executor, every request at once", 0, 0, 0, 1},
        {"executor, every request at once, spec 3", 3, 0, 0, 1},
        {"executor, 2 at a time, spec 2, budget 1.5 grids", 2, grid + grid / 2, 2, 1},
        {"stock, engine steps, random allowed prompt pieces", -1, 0, 0, 0},
    };
    int bad = 0, differ_total = 0;
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        if (runs[k].executor && exact) continue;
        int32_t got[GI_NREQ][GI_MAXNEW];
        if (runs[k].spec < 0) CHECK_OK(run_splits(&g, seed + 5, got));
        else CHECK_OK(run_runner(&g, runs[k].spec, runs[k].budget, runs[k].max_active, runs[k].executor, got));
        int differ = 0, ties = 0;
        for (int i = 0; i < GI_NREQ; i++) {
            float gap = 0;
            int v = compare(&g, i, got[i], &gap);
            differ += v > 0;
            ties += v == 1;
            if (v == 2 && exact) {
                printf("INFO   request %d parts from alone with logit gap %.3g (no near-tie)\n", i, gap);
                bad++;
            }
        }
        printf("INFO gpu_invariance %s %s, %s: %d of %d streams differ from alone (%d at a near-tie)\n", preset,
               mode, runs[k].what, differ, GI_NREQ, ties);
        differ_total += differ;
    }
    if (exact) CHECKF(bad == 0, "%s f32: %d streams part from alone away from a near-tie", preset, bad);
    else if (strict) CHECKF(differ_total == 0, "%s bf16: %d streams differ (K3C_GPU_INVARIANCE_STRICT)", preset,
                            differ_total);
    genv_close(&g);
}

TEST(gpu_invariance_tiny_bf16) { run_case("tiny", 0, 0); }
TEST(gpu_invariance_tiny_f32) { run_case("tiny", 0, 1); }
TEST(gpu_invariance_tiny_grouped_bf16) { run_case("tiny-grouped", 0, 0); }
TEST(gpu_invariance_mini_bf16) { run_case("mini", 0, 0); }
TEST(gpu_invariance_mini_f32) { run_case("mini", 0, 1); }
TEST(gpu_invariance_kimi_linear_tiny_bf16) { run_case("kimi-linear-tiny", 0, 0); }
TEST(gpu_invariance_kimi_linear_tiny_f32) { run_case("kimi-linear-tiny", 0, 1); }
/* K3's layer dims (MXFP4 experts, 96 MLA heads), device-synthetic: bf16 only */
TEST(gpu_invariance_k3slice_4layers_bf16) { run_case("k3-slice", 4, 0); }
