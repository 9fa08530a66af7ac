/* The whole stock forward on the CUDA backend against the CPU backend, through the engine API, on
 * synthesized checkpoints (tiny, mini, kimi-linear-tiny), fresh weights and ids per run (test_seed()).
 *
 * Two regimes, because bf16 rounding makes these models' outputs discontinuous:
 *  - f32 activations (the engine's exact_f32 diagnostic, on both backends; the GPU then keeps an f32 MLA
 *    cache and uses the streaming matmul for every T): the backends differ only by f32 summation order.
 *    Asserted: every row < 1e-4 rel L2 with dense routing (every expert selected, k = E: no discrete
 *    decision); with the preset's routing the median row < 1e-4 (a router near-tie may still pick another
 *    expert and move that request's later rows: counted and printed). Greedy streams (128 steps, batch 1
 *    and 4) identical, except a divergence where the CPU's top-2 logit margin is below 1e-2, counted as a
 *    tie (that stream is not compared further).
 *  - bf16 activations (the contract of stock/forward.c, the production path): the same rounding points on
 *    both, but a one-ulp rounding flip from a different summation order grows through the layers of these
 *    random models: on the CPU alone, the chunked vs the recurrent delta rule (same rounding points, other
 *    f32 order) differ by mean/worst rel L2 per row 1.3e-2/2.6e-2 (tiny), 2.9e-2/1.0e-1 (mini),
 *    6.9e-4/6.5e-3 (kimi-linear-tiny) with dense routing (measured 2026-11-29). So bf16 is asserted at that
 *    scale only (dense routing: median row < 5e-2), and bf16 greedy streams are reported (tokens identical
 *    before the first divergence), not asserted.
 * Each case prints "METRIC <name> rel_l2 <threshold> <value>" (tools/gpu-check.sh tabulates them) and INFO
 * lines with worst rows and counts. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "runtime/engine_internal.h"
#include "../logits_alloc_case.h"
#include "../synth_preset.h"
#include "../test.h"
#include "util/error.h"
#include "util/rng.h"

#define F32_THR 1e-4  /* f32 activations: rel L2 per row */
#define BF16_THR 5e-2 /* bf16 activations, dense routing: median row */
#define TIE_MARGIN 1e-2f
/* A routing near-tie: some MoE layer's top-k boundary on the CPU (k3c_route_margin) closer than this, where
 * f32 rounding differences between the backends (rows 2e-6 .. 1e-5 rel L2 apart) may pick another expert.
 * On 2026-11-30 (H200, docs/kernels.md) a stream diverged with a logits top-2 margin of 0.385 at a row whose routing
 * margin was 3.6e-7 on the CPU, the smallest of the test's 640 rows (4 were under 1e-5). */
#define ROUTE_TIE 1e-5f
#define MAX_ROWS 64

/* ---- METRIC lines ---- */

static struct { char name[64]; double thr, value; } metrics[64];
static int num_metrics;

static void metric(const char *name, double thr, double value) {
    if (num_metrics == 64) return;
    snprintf(metrics[num_metrics].name, sizeof metrics[0].name, "%s", name);
    metrics[num_metrics].thr = thr;
    metrics[num_metrics].value = value;
    num_metrics++;
}

__attribute__((destructor)) static void print_metrics(void) {
    for (int i = 0; i < num_metrics; i++)
        printf("METRIC %-28s rel_l2 %8.1e %10.3e\n", metrics[i].name, metrics[i].thr, metrics[i].value);
}

/* ---- row statistics ---- */

typedef struct stats {
    double err[4096];
    int n, over;
    double worst, thr; /* over: rows above thr */
} stats;

static void stats_add(stats *s, double e) {
    if (s->n < 4096) s->err[s->n++] = e;
    if (!(e <= s->worst)) s->worst = e; /* NaN sticks */
    if (!(e <= s->thr)) s->over++;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double stats_median(stats *s) {
    if (!s->n) return 0;
    double *v = malloc(sizeof(double) * s->n);
    memcpy(v, s->err, sizeof(double) * s->n);
    for (int i = 0; i < s->n; i++)
        if (v[i] != v[i]) v[i] = INFINITY;
    qsort(v, s->n, sizeof *v, cmp_double);
    double m = v[s->n / 2];
    free(v);
    return m;
}

/* ---- two engines over one model ---- */

typedef struct env {
    char dir[512];
    k3c_model *m;
    k3c_engine *cpu, *gpu;
    int V;
    float *lc, *lg; /* [MAX_ROWS, V] logits of the last step */
} env;

static void env_close(env *e) {
    k3c_engine_free(e->cpu);
    k3c_engine_free(e->gpu);
    if (e->m) k3c_free(e->m);
    free(e->lc);
    free(e->lg);
    memset(e, 0, sizeof *e);
}

/* 1: both engines keep an FP8 E4M3 MLA latent cache (engine option kv_fp8). */
static int env_kv_fp8;

/* dense: every expert selected (k = E, all groups kept); exact: f32 activations on both engines. */
static int env_open(env *e, const char *preset, int dense, int exact, const char *tag) {
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "%s/gpufwd-%s-%s%s%s", test_tmpdir(), preset, tag, dense ? "-dense" : "",
             exact ? "-f32" : "");
    K3C_TRY(test_synth_preset(preset, dense, test_seed() ^ k3c_hash_str(tag), e->dir));
    K3C_TRY(k3c_load(e->dir, &e->m));
    e->V = e->m->config.vocab_size;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 4;
    o.max_rows = MAX_ROWS;
    o.max_context = 256;
    o.block_size = 4; /* small blocks: every case crosses block boundaries */
    o.q_max = 6;
    o.poison_freed_blocks = 1;
    o.exact_f32 = exact;
    o.kv_fp8 = env_kv_fp8;
    o.device = "cpu";
    K3C_TRY(k3c_engine_create(e->m, &o, &e->cpu));
    o.device = "cuda";
    o.specialized = K3C_SPECIALIZED_OFF; /* the stock forward is what this file checks */
    K3C_TRY(k3c_engine_create(e->m, &o, &e->gpu));
    e->lc = malloc(sizeof(float) * (size_t)MAX_ROWS * e->V);
    e->lg = malloc(sizeof(float) * (size_t)MAX_ROWS * e->V);
    if (!e->lc || !e->lg) return k3c_errorf("out of memory for logits");
    return K3C_OK;
}

static int logit_rows(const k3c_step_item *it, int n) {
    int r = 0;
    for (int i = 0; i < n; i++) r += it[i].verify || it[i].all_logits ? it[i].n : 1;
    return r;
}

/* One step on both engines (items name the same request ids on both: they are opened in the same order),
 * every logit row compared. */
static int step_both(env *e, const k3c_step_item *it, int n, stats *s) {
    int rows = logit_rows(it, n);
    if (rows > MAX_ROWS) return k3c_errorf("test: %d logit rows > %d", rows, MAX_ROWS);
    poison_f32(e->lc, (size_t)rows * e->V);
    poison_f32(e->lg, (size_t)rows * e->V);
    if (k3c_engine_step(e->cpu, it, n, e->lc) != K3C_OK) return k3c_error_context("cpu step");
    if (k3c_engine_step(e->gpu, it, n, e->lg) != K3C_OK) return k3c_error_context("cuda step");
    for (int r = 0; r < rows; r++)
        stats_add(s, rel_l2_f32f32(e->lg + (size_t)r * e->V, e->lc + (size_t)r * e->V, (size_t)e->V));
    return K3C_OK;
}

static int open_both(env *e, int *id) {
    int a, b;
    K3C_TRY(k3c_request_open(e->cpu, &a));
    K3C_TRY(k3c_request_open(e->gpu, &b));
    if (a != b) return k3c_errorf("test: request ids differ (cpu %d, cuda %d)", a, b);
    *id = a;
    return K3C_OK;
}

static int close_both(env *e, int id) {
    K3C_TRY(k3c_request_close(e->cpu, id));
    return k3c_request_close(e->gpu, id);
}

static int commit_both(env *e, int id, int accepted) {
    K3C_TRY(k3c_request_commit(e->cpu, id, accepted));
    return k3c_request_commit(e->gpu, id, accepted);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static float top2_margin(const float *x, int n) {
    int b = argmax(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    return x[b] - second;
}

static void random_ids(k3c_rng *r, int V, int n, int32_t *ids) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(k3c_rng_next(r) % (uint64_t)V);
}

/* The forward cases: prefill (all rows) + token-by-token decode; the same prompt as a chunked prefill
 * (16 + 16 + 8: chunked, chunked, recurrent KDA); a mixed batch of prompt chunks, decodes and a verify of 4
 * tokens, committed with 2 accepted, then decodes of all three. */
static int forward_cases(env *e, k3c_rng *r, stats *s) {
    int32_t prompt[40], tok;
    random_ids(r, e->V, 40, prompt);
    int a, b;
    K3C_TRY(open_both(e, &a));
    k3c_step_item it = {.request = a, .tokens = prompt, .n = 40, .all_logits = 1};
    K3C_TRY(step_both(e, &it, 1, s));
    tok = argmax(e->lc + (size_t)39 * e->V, e->V);
    for (int i = 0; i < 24; i++) {
        k3c_step_item d = {.request = a, .tokens = &tok, .n = 1};
        K3C_TRY(step_both(e, &d, 1, s));
        tok = argmax(e->lc, e->V);
    }
    K3C_TRY(close_both(e, a));

    K3C_TRY(open_both(e, &b));
    static const int chunks[] = {16, 16, 8};
    for (int i = 0, off = 0; i < 3; off += chunks[i++]) {
        k3c_step_item c = {.request = b, .tokens = prompt + off, .n = chunks[i], .all_logits = 1};
        K3C_TRY(step_both(e, &c, 1, s));
    }
    K3C_TRY(close_both(e, b));

    /* mixed batch */
    int q[3];
    int32_t pa[12], pb[16], pc[20], ver[4], d1[3];
    random_ids(r, e->V, 12, pa);
    random_ids(r, e->V, 16, pb);
    random_ids(r, e->V, 20, pc);
    random_ids(r, e->V, 4, ver);
    for (int i = 0; i < 3; i++) K3C_TRY(open_both(e, &q[i]));
    k3c_step_item s1[2] = {{.request = q[0], .tokens = pa, .n = 12}, {.request = q[1], .tokens = pb, .n = 7}};
    K3C_TRY(step_both(e, s1, 2, s));
    random_ids(r, e->V, 3, d1);
    k3c_step_item s2[3] = {{.request = q[0], .tokens = &d1[0], .n = 1},
                           {.request = q[1], .tokens = pb + 7, .n = 9, .all_logits = 1},
                           {.request = q[2], .tokens = pc, .n = 20}};
    K3C_TRY(step_both(e, s2, 3, s));
    k3c_step_item s3[3] = {{.request = q[0], .tokens = ver, .n = 4, .verify = 1},
                           {.request = q[1], .tokens = &d1[1], .n = 1},
                           {.request = q[2], .tokens = &d1[2], .n = 1}};
    K3C_TRY(step_both(e, s3, 3, s));
    K3C_TRY(commit_both(e, q[0], 2));
    for (int rep = 0; rep < 4; rep++) {
        random_ids(r, e->V, 3, d1);
        k3c_step_item s4[3] = {{.request = q[0], .tokens = &d1[0], .n = 1},
                               {.request = q[1], .tokens = &d1[1], .n = 1},
                               {.request = q[2], .tokens = &d1[2], .n = 1}};
        K3C_TRY(step_both(e, s4, 3, s));
    }
    for (int i = 0; i < 3; i++) K3C_TRY(close_both(e, q[i]));
    return K3C_OK;
}

static stats st; /* large: static */

/* One regime of the forward cases; returns the stats in st. */
static int forward_regime(const char *preset, int dense, int exact, double thr) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(preset) ^ (uint64_t)(2 * dense + exact));
    memset(&st, 0, sizeof st);
    st.thr = thr;
    env e;
    int rc = env_open(&e, preset, dense, exact, "fwd");
    if (rc == K3C_OK) rc = forward_cases(&e, &r, &st);
    env_close(&e);
    return rc;
}

/* bf16: also the bf16 dense regime (skipped for mini, whose CPU side is the slow part of the suite). */
static void run_forward(const char *preset, int bf16) {
    char name[64];
    /* f32, dense routing: every row */
    CHECK_OK(forward_regime(preset, 1, 1, F32_THR));
    snprintf(name, sizeof name, "fwd_%s_f32_dense_worst", preset);
    metric(name, F32_THR, st.worst);
    printf("INFO %s f32 dense routing: %d rows, worst rel L2 %.3e, median %.3e\n", preset, st.n, st.worst,
           stats_median(&st));
    CHECKF(st.worst <= F32_THR, "%s f32 dense routing: worst row rel L2 %.3e > %.0e", preset, st.worst, F32_THR);

    /* f32, the preset's routing: median; rows above the threshold are probable routing flips */
    CHECK_OK(forward_regime(preset, 0, 1, F32_THR));
    double med = stats_median(&st);
    snprintf(name, sizeof name, "fwd_%s_f32_median", preset);
    metric(name, F32_THR, med);
    printf("INFO %s f32 preset routing: %d rows, median rel L2 %.3e, worst %.3e, %d rows above %.0e (probable "
           "routing flips)\n", preset, st.n, med, st.worst, st.over, F32_THR);
    CHECKF(med <= F32_THR, "%s f32: median row rel L2 %.3e > %.0e", preset, med, F32_THR);

    if (!bf16) return;
    /* bf16 (the contract), dense routing: at the scale of the CPU's own order sensitivity */
    CHECK_OK(forward_regime(preset, 1, 0, BF16_THR));
    med = stats_median(&st);
    snprintf(name, sizeof name, "fwd_%s_bf16_dense_median", preset);
    metric(name, BF16_THR, med);
    printf("INFO %s bf16 dense routing: %d rows, median rel L2 %.3e, worst %.3e\n", preset, st.n, med, st.worst);
    CHECKF(med <= BF16_THR, "%s bf16 dense routing: median row rel L2 %.3e > %.0e", preset, med, BF16_THR);
}

TEST(gpu_forward_tiny) { run_forward("tiny", 1); }

/* The fp8 latent cache: CUDA (E4M3 bytes, hardware conversion) against the CPU (E4M3 values in f32 slots,
 * util/fp8.h), f32 activations, dense routing. Both round the same latents to nearest even, but a latent
 * within f32 noise of an E4M3 midpoint can round differently on the two (one E4M3 step of one element), and
 * every later row of that request that attends to the element moves with it:
 *  - seed 8230953371816 (H200, 2026-11-30): median 2.28e-4, worst 1.52e-3, under both tensor-core GEMV plans
 *    and both MLA attend paths, where other seeds give medians of 1e-6..5e-6;
 *  - H200, 2026-11-30 (seed not recorded): worst 3.90e-3 at median 8.3e-6, one flip's trail.
 * A cache that rounds latents differently in general moves every row, the first ones of each request too:
 * the median (FP8_MEDIAN_THR) is what tells it. Rows past 2e-3 (the CPU's own fp8-vs-float64-E4M3 bound,
 * test_forward.c) are counted: at most FP8_TRAIL_FRAC of the rows, none past FP8_WORST_THR (a flip moves a
 * row by a few 1e-3). */
#define FP8_MEDIAN_THR 1e-3
#define FP8_ROW_THR 2e-3
#define FP8_TRAIL_FRAC 0.1
#define FP8_WORST_THR 2e-2
TEST(gpu_forward_tiny_kv_fp8) {
    env_kv_fp8 = 1;
    int rc = forward_regime("tiny", 1, 1, FP8_ROW_THR);
    env_kv_fp8 = 0;
    CHECK_OK(rc);
    double med = stats_median(&st);
    metric("fwd_tiny_kv_fp8_f32_median", FP8_MEDIAN_THR, med);
    metric("fwd_tiny_kv_fp8_f32_worst", FP8_WORST_THR, st.worst);
    printf("INFO tiny kv_fp8 f32 dense routing: %d rows, worst rel L2 %.3e, median %.3e, %d rows above %.0e\n",
           st.n, st.worst, med, st.over, FP8_ROW_THR);
    CHECKF(st.worst <= FP8_WORST_THR && med <= FP8_MEDIAN_THR && st.over <= FP8_TRAIL_FRAC * st.n,
           "tiny kv_fp8: worst %.3e, median %.3e, %d of %d rows above %.0e", st.worst, med, st.over, st.n,
           FP8_ROW_THR);
}
TEST(gpu_forward_mini) { run_forward("mini", 0); }
TEST(gpu_forward_kimi_linear_tiny) { run_forward("kimi-linear-tiny", 1); }

/* ---- greedy streams ---- */

static stats st_greedy;

/* Greedy streams of `batch` requests (8-token prompts) for `steps` tokens, each engine feeding back its own
 * argmax. strict: a divergence with the CPU's top-2 margin >= TIE_MARGIN fails; otherwise (bf16) every
 * divergence only ends the comparison of that stream. */
static int greedy(env *e, k3c_rng *r, int batch, int steps, int strict, int *identical, int *ties, int *compared,
                  int *first_div) {
    int id[4];
    int32_t prompts[4][8], tc[4], tg[4];
    int alive[4];
    for (int i = 0; i < batch; i++) {
        K3C_TRY(open_both(e, &id[i]));
        random_ids(r, e->V, 8, prompts[i]);
        alive[i] = 1;
        first_div[i] = -1;
    }
    k3c_step_item it[4];
    for (int i = 0; i < batch; i++) it[i] = (k3c_step_item){.request = id[i], .tokens = prompts[i], .n = 8};
    /* the CPU's routing margins of the step's rows (8 prompt rows per stream at step 0, then 1) */
    float margin_rows[4 * 8];
    k3c_engine_view v;
    k3c_engine_view_get(e->cpu, &v);
    k3c_backend_cpu_track_route_margins(v.be, margin_rows, 4 * 8);
    for (int s = 0; s < steps; s++) {
        if (s > 0) /* each engine continues its own stream */
            for (int i = 0; i < batch; i++) it[i] = (k3c_step_item){.request = id[i], .tokens = &tc[i], .n = 1};
        for (int i = 0; i < 4 * 8; i++) margin_rows[i] = INFINITY;
        int rc = k3c_engine_step(e->cpu, it, batch, e->lc);
        if (rc != K3C_OK) k3c_backend_cpu_track_route_margins(v.be, NULL, 0);
        if (rc != K3C_OK) return k3c_error_context("cpu step %d", s);
        if (s > 0)
            for (int i = 0; i < batch; i++) it[i].tokens = &tg[i];
        if (k3c_engine_step(e->gpu, it, batch, e->lg) != K3C_OK) {
            k3c_backend_cpu_track_route_margins(v.be, NULL, 0);
            return k3c_error_context("cuda step %d", s);
        }
        for (int i = 0; i < batch; i++) {
            const float *lc = e->lc + (size_t)i * e->V, *lg = e->lg + (size_t)i * e->V;
            tc[i] = argmax(lc, e->V);
            tg[i] = argmax(lg, e->V);
            if (!alive[i]) continue;
            stats_add(&st_greedy, rel_l2_f32f32(lg, lc, (size_t)e->V));
            (*compared)++;
            if (tc[i] == tg[i]) {
                (*identical)++;
                continue;
            }
            float margin = top2_margin(lc, e->V), route = INFINITY;
            for (int rr = s == 0 ? 8 * i : i; rr < (s == 0 ? 8 * i + 8 : i + 1); rr++)
                route = margin_rows[rr] < route ? margin_rows[rr] : route;
            alive[i] = 0;
            first_div[i] = s;
            if (margin < TIE_MARGIN || route < ROUTE_TIE) {
                printf("INFO greedy batch %d stream %d: near-tie at token %d (cpu %d, cuda %d, cpu top-2 margin "
                       "%.2e, cpu routing margin %.2e): not compared further\n", batch, i, s, tc[i], tg[i], margin,
                       route);
                (*ties)++;
                continue;
            }
            if (strict) {
                k3c_backend_cpu_track_route_margins(v.be, NULL, 0);
                return k3c_errorf("greedy batch %d stream %d token %d: cpu %d, cuda %d with cpu top-2 margin %.3e "
                                  "and routing margin %.3e (row rel L2 %.3e)", batch, i, s, tc[i], tg[i], margin,
                                  route, rel_l2_f32f32(lg, lc, (size_t)e->V));
            }
        }
    }
    k3c_backend_cpu_track_route_margins(v.be, NULL, 0);
    for (int i = 0; i < batch; i++) K3C_TRY(close_both(e, id[i]));
    return K3C_OK;
}

/* f32: streams asserted; bf16 (when bf16): reported. */
static void run_greedy(const char *preset, int bf16) {
    for (int exact = 1; exact >= (bf16 ? 0 : 1); exact--) {
        k3c_rng r;
        k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(preset) ^ 0x6772656564ull);
        env e;
        int rc = env_open(&e, preset, 0, exact, "greedy");
        if (rc != K3C_OK) env_close(&e);
        CHECK_OK(rc);
        static const int batches[] = {1, 4};
        for (int b = 0; b < 2; b++) {
            memset(&st_greedy, 0, sizeof st_greedy);
            st_greedy.thr = F32_THR;
            int identical = 0, ties = 0, compared = 0, first_div[4];
            rc = greedy(&e, &r, batches[b], 128, exact, &identical, &ties, &compared, first_div);
            if (rc != K3C_OK) env_close(&e);
            CHECK_OK(rc);
            char name[64], divs[64] = "";
            for (int i = 0, n = 0; i < batches[b]; i++)
                n += snprintf(divs + n, sizeof divs - (size_t)n, "%s%d", i ? "," : "", first_div[i]);
            if (exact) {
                snprintf(name, sizeof name, "greedy_%s_b%d_f32_median", preset, batches[b]);
                metric(name, F32_THR, stats_median(&st_greedy));
            }
            printf("INFO greedy %s %s batch %d: %d of %d compared tokens identical, %d near-ties, first divergence "
                   "per stream [%s] (-1: none in 128), row rel L2 median %.3e worst %.3e\n",
                   preset, exact ? "f32" : "bf16", batches[b], identical, compared, ties, divs,
                   stats_median(&st_greedy), st_greedy.worst);
        }
        env_close(&e);
    }
}

TEST(gpu_greedy_tiny) { run_greedy("tiny", 1); }
TEST(gpu_greedy_mini) { run_greedy("mini", 1); }

/* ---- device-synthetic models ---- */

/* tiny as a device-synthetic model: the CPU engine refuses it; two CUDA engines generate the same weights
 * and give bit-identical, finite, non-constant logits. */
TEST(gpu_synthetic_tiny) {
    k3c_config c;
    CHECK_OK(k3c_preset_config("tiny", &c));
    k3c_model *m = NULL;
    int rc = k3c_model_synthetic(&c, test_seed(), &m);
    k3c_config_free(&c);
    CHECK_OK(rc);
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 2;
    o.max_rows = 32;
    o.max_context = 64;
    k3c_engine *cpu = NULL, *g1 = NULL, *g2 = NULL;
    CHECK(k3c_engine_create(m, &o, &cpu) != K3C_OK);
    CHECK(strstr(k3c_last_error(), "device-synthetic") != NULL);
    o.device = "cuda";
    int V = m->config.vocab_size;
    float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    rc = k3c_engine_create(m, &o, &g1);
    if (rc == K3C_OK) rc = k3c_engine_create(m, &o, &g2);
    int32_t ids[12];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    random_ids(&r, V, 12, ids);
    int a = -1, b = -1, same = 1, finite = 1;
    if (rc == K3C_OK) rc = k3c_request_open(g1, &a);
    if (rc == K3C_OK) rc = k3c_request_open(g2, &b);
    double spread = 0;
    for (int s = 0; rc == K3C_OK && s < 4; s++) {
        k3c_step_item i1 = {.request = a, .tokens = s ? &ids[s + 7] : ids, .n = s ? 1 : 8};
        k3c_step_item i2 = i1;
        i2.request = b;
        poison_f32(l1, V);
        poison_f32(l2, V);
        rc = k3c_engine_step(g1, &i1, 1, l1);
        if (rc == K3C_OK) rc = k3c_engine_step(g2, &i2, 1, l2);
        if (rc != K3C_OK) break;
        same &= memcmp(l1, l2, sizeof(float) * V) == 0;
        for (int v = 0; v < V; v++) {
            finite &= isfinite(l1[v]);
            spread = fmax(spread, fabs(l1[v] - l1[0]));
        }
    }
    k3c_engine_free(g1);
    k3c_engine_free(g2);
    k3c_free(m);
    free(l1);
    free(l2);
    CHECK_OK(rc);
    CHECK(finite);
    CHECK(same);
    CHECK(spread > 1e-3);
}

/* k3c_engine_logits_alloc on the CUDA engine: page-locked, so the logits download is asynchronous to the host
 * and the step must not return before it lands (tests/logits_alloc_case.h) */
TEST(gpu_engine_logits_alloc) { logits_alloc_case("cuda"); }

/* k3c_engine_logits_alloc on the CUDA engine when cudaHostAlloc is refused (a stub host_alloc): the malloc'ed
 * fallback, its warning, its steps (pageable downloads through the driver's staging) bitwise as into any
 * malloc'ed buffer, each buffer freed the way it was allocated (tests/logits_alloc_case.h) */
TEST(gpu_engine_logits_fallback) { logits_fallback_case("cuda"); }
