/* The aux hidden-state streams (k3c_engine_options.aux_layers, k3c_engine_aux) on the CPU backend, against
 * the float64 reference's own taps (tests/ref ref_hidden, written from spec §4.3 / §6: the block-partial
 * prefix P after a layer's FFN add, the residual stream without AttnRes, the embedding for "before layer 0").
 * Engine index L (the hidden state entering layer L) is the reference's tap after layer L - 1.
 *
 * Every stream of every layer 0 .. num_layers is requested, on a K3-like AttnRes model (tiny: 9 layers,
 * blocks of 4, so taps inside a block, at a boundary and at the output) and a Kimi-Linear-like one
 * (kimi-linear-tiny: plain residual), over step plans that return different logits rows: one prefill with
 * every row, chunks returning their last row, decode steps, a verify, and two requests in one step.
 * Tolerances as test_forward.c: f32 activations (exact_f32) against float64 rel L2 per row < 1e-4; bf16
 * activations (the stock contract) with every expert selected (no routing choice to flip): measured worst
 * row 0.038 .. 0.073 on tiny (8 seeds), ~0.01 on kimi-linear-tiny; asserted < 0.15 and < 0.05.
 * Outputs are poisoned before each read; NaN fails every comparison. Also: the option's validation and
 * k3c_engine_aux's errors.
 * With f32 activations and the presets' own routing, a comparison made after its plan met a routing
 * near-tie (route_ties.h) is counted and printed, not compared. */
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "ref/ref_forward.h"
#include "route_ties.h"
#include "synth_preset.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

#define NTOK 20

typedef struct aux_env {
    char dir[512];
    k3c_model *m;
    ref_model *ref;
    int L, D, V;
} aux_env;

static int env_open(aux_env *e, const char *preset, int dense_routing, int want_ref) {
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "%s/aux-%s%s", test_tmpdir(), preset, dense_routing ? "-dense" : "");
    K3C_TRY(test_synth_preset(preset, dense_routing, test_seed() ^ 0xa0c5, e->dir));
    K3C_TRY(k3c_load(e->dir, &e->m));
    e->L = e->m->config.num_layers;
    e->D = e->m->config.hidden_size;
    e->V = e->m->config.vocab_size;
    if (want_ref) K3C_TRY(ref_model_open(e->dir, &e->ref));
    return K3C_OK;
}

static void env_close(aux_env *e) {
    if (e->ref) ref_model_free(e->ref);
    if (e->m) k3c_free(e->m);
}

static int make_engine(aux_env *env, int exact, const int *aux, int num_aux, k3c_engine **out) {
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 2;
    o.max_rows = 64;
    o.max_context = 128;
    o.block_size = 4;
    o.q_max = 6;
    o.exact_f32 = exact;
    o.aux_layers = aux;
    o.num_aux = num_aux;
    return k3c_engine_create(env->m, &o, out);
}

/* After a step whose logits rows are the tokens pos[0..nrows) of the reference sequence: every stream
 * against the reference taps ref [num_aux][NTOK][D]; returns the worst row rel L2 (inf on NaN or a wrong
 * row count). */
static double check_streams(aux_env *env, k3c_engine *eng, int num_aux, const double *ref, const int *pos,
                            int nrows, float *buf) {
    size_t D = env->D;
    double worst = 0;
    for (int j = 0; j < num_aux; j++) {
        int rows = -1;
        poison_f32(buf, (size_t)NTOK * D);
        if (k3c_engine_aux(eng, j, buf, &rows) != K3C_OK || rows != nrows) return INFINITY;
        for (int i = 0; i < nrows; i++) {
            double e = rel_l2_f32(buf + i * D, ref + ((size_t)j * NTOK + pos[i]) * D, D);
            if (!(e <= worst)) worst = e;
        }
    }
    return worst;
}

/* e against tol unless the plan met a routing near-tie (then counted); worst keeps the compared ones */
#define CHECK_AUX(e, ...)                                                                                      \
    do {                                                                                                       \
        if (route_ties_met(&tw)) {                                                                             \
            tw.skipped++;                                                                                      \
        } else {                                                                                               \
            CHECKF((e) < tol, __VA_ARGS__);                                                                    \
            worst = fmax(worst, (e));                                                                          \
        }                                                                                                      \
    } while (0)

/* Every layer tapped, every plan; tol: worst row rel L2. */
static void check_vs_ref(const char *preset, int exact, int dense_routing, double tol) {
    aux_env env;
    CHECKF(env_open(&env, preset, dense_routing, 1) == K3C_OK, "%s: %s", preset, k3c_error_message());
    int L = env.L, D = env.D, V = env.V, na = L + 1;
    CHECK(na <= K3C_MAX_AUX);
    int aux[K3C_MAX_AUX], rl[K3C_MAX_AUX], ids[NTOK];
    int32_t tok[NTOK];
    for (int j = 0; j < na; j++) aux[j] = j, rl[j] = j - 1; /* entering layer j = after layer j - 1 */
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(preset));
    for (int i = 0; i < NTOK; i++) tok[i] = (int32_t)(ids[i] = (int)(k3c_rng_next(&r) % (uint64_t)V));
    double *ref = malloc(sizeof(double) * na * NTOK * D);
    float *lg = malloc(sizeof(float) * NTOK * V), *buf = malloc(sizeof(float) * NTOK * D);
    CHECK(ref && lg && buf);
    CHECK_OK(ref_hidden(env.ref, ids, NTOK, rl, na, ref));
    k3c_engine *eng;
    CHECK_OK(make_engine(&env, exact, aux, na, &eng));
    int pos[NTOK], id, id2;
    double e, worst = 0;
    route_ties tw = {0};

    /* one prefill, every row */
    route_ties_begin(&tw, eng);
    CHECK_OK(k3c_request_open(eng, &id));
    k3c_step_item all = {.request = id, .tokens = tok, .n = NTOK, .all_logits = 1};
    CHECK_OK(k3c_engine_step(eng, &all, 1, lg));
    for (int i = 0; i < NTOK; i++) pos[i] = i;
    e = check_streams(&env, eng, na, ref, pos, NTOK, buf);
    CHECK_AUX(e, "%s prefill: worst aux row rel L2 %.3g", preset, e);
    CHECK_OK(k3c_request_close(eng, id));

    /* chunks 7 + 9 + 4, each returning its last row; then the same prompt's prefill of 12 + decodes */
    route_ties_begin(&tw, eng);
    CHECK_OK(k3c_request_open(eng, &id));
    int chunks[3] = {7, 9, 4}, done = 0;
    for (int c = 0; c < 3; c++) {
        k3c_step_item it = {.request = id, .tokens = tok + done, .n = chunks[c]};
        CHECK_OK(k3c_engine_step(eng, &it, 1, lg));
        done += chunks[c];
        pos[0] = done - 1;
        e = check_streams(&env, eng, na, ref, pos, 1, buf);
        CHECK_AUX(e, "%s chunk %d: worst aux row rel L2 %.3g", preset, c, e);
    }
    CHECK_OK(k3c_request_close(eng, id));
    route_ties_begin(&tw, eng);
    CHECK_OK(k3c_request_open(eng, &id));
    k3c_step_item pre = {.request = id, .tokens = tok, .n = 12};
    CHECK_OK(k3c_engine_step(eng, &pre, 1, lg));
    for (int t = 12; t < 16; t++) {
        k3c_step_item it = {.request = id, .tokens = tok + t, .n = 1};
        CHECK_OK(k3c_engine_step(eng, &it, 1, lg));
        pos[0] = t;
        e = check_streams(&env, eng, na, ref, pos, 1, buf);
        CHECK_AUX(e, "%s decode at %d: worst aux row rel L2 %.3g", preset, t, e);
    }
    /* a verify of tokens 16..19: every row */
    k3c_step_item vf = {.request = id, .tokens = tok + 16, .n = 4, .verify = 1};
    CHECK_OK(k3c_engine_step(eng, &vf, 1, lg));
    for (int i = 0; i < 4; i++) pos[i] = 16 + i;
    e = check_streams(&env, eng, na, ref, pos, 4, buf);
    CHECK_AUX(e, "%s verify: worst aux row rel L2 %.3g", preset, e);
    CHECK_OK(k3c_request_commit(eng, id, 2));
    CHECK_OK(k3c_request_close(eng, id));

    /* two requests in one step: A's prefill of 10 returning its last row, then B's 6 rows all returned */
    route_ties_begin(&tw, eng);
    CHECK_OK(k3c_request_open(eng, &id));
    CHECK_OK(k3c_request_open(eng, &id2));
    k3c_step_item two[2] = {{.request = id, .tokens = tok, .n = 10}, {.request = id2, .tokens = tok, .n = 6, .all_logits = 1}};
    CHECK_OK(k3c_engine_step(eng, two, 2, lg));
    pos[0] = 9;
    for (int i = 0; i < 6; i++) pos[1 + i] = i;
    e = check_streams(&env, eng, na, ref, pos, 7, buf);
    CHECK_AUX(e, "%s two requests: worst aux row rel L2 %.3g", preset, e);
    CHECK_OK(k3c_request_close(eng, id));
    CHECK_OK(k3c_request_close(eng, id2));
    route_ties_end(&tw);
    printf("    %s %s%s: %d aux streams (layers 0..%d), worst row rel L2 %.3g over 5 plans (%d comparisons left out:"
           " a routing margin below %.0e)\n",
           preset, exact ? "f32" : "bf16", dense_routing ? " (k = E)" : "", na, L, worst, tw.skipped,
           (double)ROUTE_NEAR_TIE);

    k3c_engine_free(eng);
    free(ref), free(lg), free(buf);
    env_close(&env);
}

TEST(aux_tiny_f32_vs_ref) { check_vs_ref("tiny", 1, 0, 1e-4); }
TEST(aux_kimi_linear_tiny_f32_vs_ref) { check_vs_ref("kimi-linear-tiny", 1, 0, 1e-4); }
TEST(aux_tiny_bf16_vs_ref) { check_vs_ref("tiny", 0, 1, 0.15); }
TEST(aux_kimi_linear_tiny_bf16_vs_ref) { check_vs_ref("kimi-linear-tiny", 0, 1, 0.05); }

/* A subset of layers, out of the full set's order: stream j is aux_layers[j]'s, bitwise the same values as
 * in an engine tapping every layer (the taps do not change the forward). */
TEST(aux_subset_equals_full) {
    aux_env env;
    CHECK_OK(env_open(&env, "tiny", 0, 0));
    int L = env.L, D = env.D, V = env.V;
    int full[K3C_MAX_AUX], sub[3] = {0, 4, L};
    for (int j = 0; j <= L; j++) full[j] = j;
    int32_t tok[NTOK];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x5ab);
    for (int i = 0; i < NTOK; i++) tok[i] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
    float *la = malloc(sizeof(float) * NTOK * V), *lb = malloc(sizeof(float) * NTOK * V);
    float *a = malloc(sizeof(float) * NTOK * D), *b = malloc(sizeof(float) * NTOK * D);
    CHECK(la && lb && a && b);
    k3c_engine *ef, *es;
    CHECK_OK(make_engine(&env, 0, full, L + 1, &ef));
    CHECK_OK(make_engine(&env, 0, sub, 3, &es));
    int ia, ib;
    CHECK_OK(k3c_request_open(ef, &ia));
    CHECK_OK(k3c_request_open(es, &ib));
    k3c_step_item it = {.request = ia, .tokens = tok, .n = 13, .all_logits = 1};
    CHECK_OK(k3c_engine_step(ef, &it, 1, la));
    it.request = ib;
    CHECK_OK(k3c_engine_step(es, &it, 1, lb));
    CHECK(!memcmp(la, lb, sizeof(float) * 13 * V)); /* logits untouched by the taps */
    for (int j = 0; j < 3; j++) {
        int ra = -1, rb = -1;
        poison_f32(a, (size_t)NTOK * D);
        poison_f32(b, (size_t)NTOK * D);
        CHECK_OK(k3c_engine_aux(ef, sub[j], a, &ra));
        CHECK_OK(k3c_engine_aux(es, j, b, &rb));
        CHECK(ra == 13 && rb == 13);
        CHECKF(rel_l2_f32f32(b, a, (size_t)13 * D) == 0, "stream %d (layer %d) differs", j, sub[j]);
        CHECKF(!memcmp(a, b, sizeof(float) * 13 * D), "stream %d (layer %d) not bitwise equal", j, sub[j]);
    }
    k3c_engine_free(ef);
    k3c_engine_free(es);
    free(la), free(lb), free(a), free(b);
    env_close(&env);
}

static int error_has(const char *what) { return strstr(k3c_last_error(), what) != NULL; }

TEST(aux_bad_options_and_calls) {
    aux_env env;
    CHECK_OK(env_open(&env, "tiny", 0, 0));
    int L = env.L, V = env.V, D = env.D;
    k3c_engine *eng = NULL;
    struct { int list[K3C_MAX_AUX + 1]; int n; const char *msg; } bad[] = {
        {{-1}, 1, "outside 0..9"},
        {{0, L + 1}, 2, "aux_layers[1] = 10 outside"},
        {{3, 2}, 2, "strictly increasing"},
        {{2, 2}, 2, "strictly increasing"},
        {{0}, K3C_MAX_AUX + 1, "K3C_MAX_AUX"},
        {{0}, -1, "num_aux -1"},
    };
    CHECK(L == 9);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i].n == K3C_MAX_AUX + 1)
            for (int j = 0; j <= K3C_MAX_AUX; j++) bad[i].list[j] = j;
        eng = NULL;
        CHECKF(make_engine(&env, 0, bad[i].list, bad[i].n, &eng) == K3C_ERR && !eng, "case %zu accepted", i);
        CHECKF(error_has(bad[i].msg), "case %zu: message '%s' lacks '%s'", i, k3c_last_error(), bad[i].msg);
    }
    CHECK(make_engine(&env, 0, NULL, 2, &eng) == K3C_ERR && error_has("aux_layers is NULL"));

    float *buf = malloc(sizeof(float) * NTOK * D), *lg = malloc(sizeof(float) * NTOK * V);
    CHECK(buf && lg);
    /* an engine without aux layers */
    CHECK_OK(make_engine(&env, 0, NULL, 0, &eng));
    CHECK(k3c_engine_hidden_size(eng) == D);
    CHECK(k3c_engine_aux(eng, 0, buf, NULL) == K3C_ERR && error_has("no aux layers"));
    k3c_engine_free(eng);

    int aux[2] = {0, L};
    CHECK_OK(make_engine(&env, 0, aux, 2, &eng));
    int rows = 77;
    CHECK(k3c_engine_aux(eng, 0, buf, &rows) == K3C_ERR && error_has("no step") && rows == 77);
    int id;
    CHECK_OK(k3c_request_open(eng, &id));
    int32_t tok[3] = {1, 2, 3};
    k3c_step_item it = {.request = id, .tokens = tok, .n = 3};
    CHECK(k3c_engine_aux(eng, 0, buf, &rows) == K3C_ERR && error_has("no step"));
    CHECK_OK(k3c_engine_step(eng, &it, 1, lg));
    poison_f32(buf, (size_t)NTOK * D);
    CHECK_OK(k3c_engine_aux(eng, 1, buf, &rows));
    CHECK(rows == 1 && !isnan(buf[0]) && isnan(buf[D])); /* one row written, nothing past it */
    CHECK(k3c_engine_aux(eng, 2, buf, &rows) == K3C_ERR && error_has("stream 2 outside 0..1"));
    CHECK(k3c_engine_aux(eng, -1, buf, &rows) == K3C_ERR && error_has("outside"));
    /* a failed step leaves no streams */
    int32_t badtok[1] = {V + 5};
    k3c_step_item bi = {.request = id, .tokens = badtok, .n = 1};
    CHECK(k3c_engine_step(eng, &bi, 1, lg) == K3C_ERR);
    CHECK(k3c_engine_aux(eng, 0, buf, &rows) == K3C_ERR && error_has("failed"));
    it.tokens = tok + 2, it.n = 1;
    CHECK_OK(k3c_engine_step(eng, &it, 1, lg));
    CHECK_OK(k3c_engine_aux(eng, 0, buf, &rows));
    CHECK(rows == 1);
    k3c_engine_free(eng);
    free(buf), free(lg);
    env_close(&env);
}

/* k3c logits --aux: the streams written to --aux-out [num_aux, len, hidden] are the engine's (an in-process
 * engine running the same prefill + decode steps), and stream 0 (layer 0) is the bf16 embedding row exactly. */
TEST(aux_cli_logits) {
    aux_env env;
    CHECK_OK(env_open(&env, "tiny", 0, 0));
    int D = env.D, n = 6, prefill = 4, aux[3] = {0, 5, env.L};
    char bin[1024], cmd[4096], lf[1024], af[1024];
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(lf, sizeof lf, "%s/aux_cli_logits.f32", test_tmpdir());
    snprintf(af, sizeof af, "%s/aux_cli_aux.f32", test_tmpdir());
    int32_t tok[6];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xc11);
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(k3c_rng_next(&r) % (uint64_t)env.V);
    snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --prompt-ids %d,%d,%d,%d,%d,%d --prefill %d --out '%s' "
             "--threads 2 --aux %d,%d,%d --aux-out '%s' >/dev/null 2>&1", bin, env.dir, tok[0], tok[1], tok[2],
             tok[3], tok[4], tok[5], prefill, lf, aux[0], aux[1], aux[2], af);
    CHECK(test_run_status(cmd) == 0);
    size_t nf = (size_t)3 * n * D;
    float *file = malloc(sizeof(float) * nf), *mine = malloc(sizeof(float) * nf), *lg = malloc(sizeof(float) * n * env.V);
    CHECK(file && mine && lg);
    CHECK(test_read_f32(af, file, nf) == 0);
    k3c_engine *eng;
    CHECK_OK(make_engine(&env, 0, aux, 3, &eng));
    int id;
    CHECK_OK(k3c_request_open(eng, &id));
    poison_f32(mine, nf);
    k3c_step_item it = {.request = id, .tokens = tok, .n = prefill, .all_logits = 1};
    CHECK_OK(k3c_engine_step(eng, &it, 1, lg));
    for (int j = 0; j < 3; j++) CHECK_OK(k3c_engine_aux(eng, j, mine + (size_t)j * n * D, NULL));
    for (int i = prefill; i < n; i++) {
        k3c_step_item d = {.request = id, .tokens = tok + i, .n = 1};
        CHECK_OK(k3c_engine_step(eng, &d, 1, lg));
        for (int j = 0; j < 3; j++) CHECK_OK(k3c_engine_aux(eng, j, mine + ((size_t)j * n + i) * D, NULL));
    }
    double e = rel_l2_f32f32(file, mine, nf);
    CHECKF(e < 1e-6, "CLI aux streams %.3g from the engine's", e);
    const k3c_mat *E = &env.m->weights.embed;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++) {
            uint32_t b = (uint32_t)E->w[(size_t)tok[i] * E->cols + d] << 16;
            float w;
            memcpy(&w, &b, 4);
            CHECKF(file[(size_t)i * D + d] == w, "row %d col %d: %g, embedding %g", i, d, file[(size_t)i * D + d], w);
        }
    k3c_engine_free(eng);
    free(file), free(mine), free(lg);
    env_close(&env);
}
