/* The continuous-batching runner (runtime/runner.c) and the prompt-lookup drafter (runtime/drafter.c), on the
 * synthesized tiny model, with requests that wait for slots, join and finish at different times:
 *  - greedy with speculation (d = 1..4) emits exactly the streams greedy without it emits, and each stream
 *    equals k3c_generate run alone for that request;
 *  - a sampled request beside speculating ones, and stop tokens, keep those streams;
 *  - a repetitive prompt gets drafts accepted and uniform verify steps planned;
 *  - an executor takes the steps the plan routes to it;
 *  - the drafter's lookup on hand-made histories.
 * These tests run with f32 activations (the engine's exact_f32 diagnostic) on a model that routes to every
 * expert (k = E), and accept two streams parting only at a greedy near-tie (streams_agree recomputes the
 * logits of that step: the two tokens within 1e-4, printed). They date from before the engine was batch
 * invariant (docs/DESIGN.md), when a batched stream carried ~1e-6 relative f32 noise; the engine now cuts
 * and computes prompts the same way whatever the batch, so the streams are bitwise equal and the tolerance
 * is never used. The bf16 test asserts the same bitwise, and tests/test_invariance.c checks it on every
 * preset. */
#include <stdlib.h>
#include <string.h>

#include "damp_residual.h"
#include "k3c.h"
#include "model/presets.h"
#include "model/synth.h"
#include "format/safetensors.h"
#include "runtime/drafter.h"
#include "runtime/engine_internal.h"
#include "runtime/runner.h"
#include "test.h"
#include "util/error.h"
#include "util/bf16.h"
#include "util/rng.h"

typedef struct run_env {
    char dir[512];
    k3c_model *m;
    k3c_engine *e;
    int V;
} run_env;

/* tiny with a fresh seed (damp > 0: residual writes scaled by it, tests/damp_residual.h); an engine with fewer slots than the
 * tests' requests, so requests wait and join. exact: f32 activations (see below). */
static int env_open(run_env *env, int max_requests, int exact, float damp) {
    memset(env, 0, sizeof *env);
    snprintf(env->dir, sizeof env->dir, "%s/runner-tiny%s", test_tmpdir(), damp > 0 ? "-damped" : "");
    K3C_TRY(damp_tiny_checkpoint(env->dir, test_seed(), exact, damp)); /* exact: dense routing (see top) */
    K3C_TRY(k3c_load(env->dir, &env->m));
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 2;
    o.max_requests = max_requests;
    o.max_rows = 128;
    o.max_context = 160;
    o.block_size = 8;
    o.q_max = 6;
    o.chunk_min = 8; /* blocks of the invariance grid (8, 16) smaller than the prompts */
    o.mla_expand_min = 16;
    o.exact_f32 = exact;
    K3C_TRY(k3c_engine_create(env->m, &o, &env->e));
    env->V = k3c_engine_vocab(env->e);
    return K3C_OK;
}

static void env_close(run_env *env) {
    k3c_engine_free(env->e);
    k3c_free(env->m);
}

/* The absolute logit gap under which two greedy streams may part: f32 noise between prompt splits is ~1e-6
 * relative on logits of magnitude ~3; 1e-4 leaves a 30x margin and is far below typical top-2 gaps (~0.3). */
#define NEAR_TIE 1e-4f

/* Streams `want` and `got` of one request (n tokens each) are equal, or part at a step where the two tokens
 * are a greedy near-tie: the logits of that step come from one f32 prefill of prompt + common prefix. */
static int streams_agree_at(run_env *env, const int32_t *prompt, int n_prompt, const int32_t *want,
                            const int32_t *got, int n, const char *what, int *part_at) {
    int t = 0;
    while (t < n && want[t] == got[t]) t++;
    if (part_at) *part_at = t;
    if (t == n) return K3C_OK;
    int len = n_prompt + t, id, rc;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)len);
    float *lg = malloc(sizeof(float) * (size_t)len * (size_t)env->V);
    if (!ids || !lg) {
        free(ids), free(lg);
        return k3c_errorf("%s: out of memory", what);
    }
    memcpy(ids, prompt, sizeof(int32_t) * (size_t)n_prompt);
    memcpy(ids + n_prompt, want, sizeof(int32_t) * (size_t)t);
    rc = k3c_request_open(env->e, &id);
    if (rc == K3C_OK) {
        k3c_step_item it = {.request = id, .tokens = ids, .n = len, .all_logits = 1};
        rc = k3c_engine_step(env->e, &it, 1, lg);
        k3c_request_close(env->e, id);
    }
    if (rc == K3C_OK) {
        const float *row = lg + (size_t)(len - 1) * env->V;
        float gap = row[want[t]] - row[got[t]];
        if (fabsf(gap) < NEAR_TIE)
            printf("  [%s: streams part at token %d (%d vs %d), a near-tie: logit gap %.3g]\n", what, t, want[t],
                   got[t], gap);
        else
            rc = k3c_errorf("%s: streams part at token %d (%d vs %d), logit gap %.3g is no near-tie", what, t,
                            want[t], got[t], gap);
    }
    free(ids), free(lg);
    return rc;
}
static int streams_agree(run_env *env, const int32_t *prompt, int n_prompt, const int32_t *want,
                         const int32_t *got, int n, const char *what) {
    return streams_agree_at(env, prompt, n_prompt, want, got, n, what, NULL);
}

#define NREQ 5
#define MAXNEW 48
#define MAXPROMPT 64

typedef struct workload {
    int32_t prompt[NREQ][MAXPROMPT];
    int n_prompt[NREQ];
    int max_new[NREQ];
    k3c_sampling sampling[NREQ];
} workload;

/* Prompts of different lengths (two with whole blocks of the engine's grid, so the chunked KDA and expanded
 * MLA forms run), partly repetitive so the
 * drafter finds matches, different max_new so requests finish at different times. */
static void make_workload(workload *w, int V, uint64_t seed) {
    static const int lens[NREQ] = {3, 11, 24, 6, 40};
    static const int news[NREQ] = {MAXNEW, 30, MAXNEW, 17, 41};
    k3c_rng rng;
    k3c_rng_seed(&rng, seed);
    memset(w, 0, sizeof *w);
    for (int i = 0; i < NREQ; i++) {
        w->n_prompt[i] = lens[i];
        w->max_new[i] = news[i];
        int period = 2 + i; /* request i repeats a random phrase of period 2 + i after its first half */
        for (int t = 0; t < lens[i]; t++)
            w->prompt[i][t] = t < lens[i] / 2 || t < period ? (int32_t)(k3c_rng_next(&rng) % (uint64_t)V)
                                                            : w->prompt[i][t - period];
    }
}

/* Runs the workload through a runner with d drafts; copies each stream to out[i] (lengths to n_out). */
static int run_workload(run_env *env, const workload *w, int d, int32_t out[NREQ][MAXNEW], int n_out[NREQ],
                        k3c_runner_stats *st) {
    k3c_runner_options o;
    k3c_runner_options_default(&o);
    o.spec_tokens = d;
    o.prefill_budget = 32; /* the 40-token prompt is prefilled in two chunks, beside other requests */
    k3c_runner *r;
    K3C_TRY(k3c_runner_create(env->e, &o, &r));
    int h[NREQ], rc = K3C_OK;
    for (int i = 0; i < NREQ && rc == K3C_OK; i++) {
        k3c_runner_request q = {.prompt = w->prompt[i], .n_prompt = w->n_prompt[i], .max_new = w->max_new[i],
                                .sampling = w->sampling[i], .stop_token = -1};
        rc = k3c_runner_submit(r, &q, &h[i]);
    }
    if (rc == K3C_OK) rc = k3c_runner_run(r);
    for (int i = 0; i < NREQ && rc == K3C_OK; i++) {
        const int32_t *t;
        int fin;
        rc = k3c_runner_output(r, h[i], &t, &n_out[i], &fin);
        if (rc == K3C_OK && (!fin || n_out[i] > MAXNEW)) rc = k3c_errorf("request %d: finished %d, %d tokens", i, fin, n_out[i]);
        if (rc == K3C_OK) memcpy(out[i], t, sizeof(int32_t) * (size_t)n_out[i]);
    }
    if (st) k3c_runner_stats_get(r, st);
    k3c_runner_free(r);
    return rc;
}

typedef struct collect {
    int32_t *t;
    int n;
} collect;
static int collect_token(void *u, int32_t tok) {
    collect *c = u;
    c->t[c->n++] = tok;
    return 0;
}

/* The plan counts add up: every step has one route, every stock step one reason. */
static int stats_consistent(const k3c_runner_stats *st) {
    long routes = 0, reasons = 0;
    for (int i = 0; i < K3C_RUNNER_ROUTES; i++) routes += st->route_steps[i];
    for (int i = 0; i < K3C_RUNNER_REASONS; i++) reasons += st->stock_reason_steps[i];
    return routes == st->steps && reasons == st->route_steps[0] && st->stock_reason_steps[0] == 0 &&
           st->executor_steps == 0 && st->drafts_accepted <= st->drafts_proposed;
}

/* Positions of the streams where the prompt-lookup drafter proposes a token and the request has at least two
 * tokens left (with one left, the runner verifies nothing for it). */
static int draftable_positions(const workload *w, int32_t streams[NREQ][MAXNEW], const int *n) {
    static int32_t hist[MAXPROMPT + MAXNEW];
    int count = 0;
    for (int i = 0; i < NREQ; i++) {
        memcpy(hist, w->prompt[i], sizeof(int32_t) * (size_t)w->n_prompt[i]);
        for (int t = 0; t + 2 < n[i]; t++) { /* after token t is emitted, w->max_new - t - 1 remain */
            hist[w->n_prompt[i] + t] = streams[i][t];
            int32_t draft;
            count += k3c_draft_ngram(hist, w->n_prompt[i] + t + 1, 1, &draft) > 0;
        }
    }
    return count;
}

TEST(runner_spec_greedy_same_streams_and_alone) {
    run_env env;
    CHECK_OK(env_open(&env, 3, 1, 0));
    workload w;
    make_workload(&w, env.V, test_seed() ^ 0x5eed);
    static int32_t base[NREQ][MAXNEW], got[NREQ][MAXNEW], alone[MAXNEW];
    int nb[NREQ], ng[NREQ];
    k3c_runner_stats st;
    for (int i = 0; i < NREQ; i++)
        for (int t = 0; t < MAXNEW; t++) base[i][t] = got[i][t] = -7;
    CHECK_OK(run_workload(&env, &w, 0, base, nb, &st));
    CHECK(stats_consistent(&st));
    CHECK(st.verify_items == 0 && st.drafts_proposed == 0);
    CHECK(st.generated == 48 + 30 + 48 + 17 + 41);
    CHECK(st.stock_reason_steps[K3C_STOCK_PROMPT_ROWS] > 0); /* prefills (and decodes beside them) */
    CHECK(st.route_steps[K3C_ROUTE_DECODE] > 0);
    for (int i = 0; i < NREQ; i++) CHECKF(nb[i] == w.max_new[i], "request %d: %d tokens, want %d", i, nb[i], w.max_new[i]);

    /* (b) batching does not change results: each stream equals the request generated alone */
    for (int i = 0; i < NREQ; i++) {
        collect c = {alone, 0};
        CHECK_OK(k3c_generate(env.e, w.prompt[i], w.n_prompt[i], w.max_new[i], &w.sampling[i], collect_token, &c,
                              NULL));
        CHECK(c.n == nb[i]);
        char what[64];
        snprintf(what, sizeof what, "request %d alone vs batched", i);
        CHECK_OK(streams_agree(&env, w.prompt[i], w.n_prompt[i], alone, base[i], c.n, what));
    }

    /* (a) speculation changes nothing in greedy streams */
    long verify_items = 0;
    for (int d = 1; d <= 4; d++) {
        CHECK_OK(run_workload(&env, &w, d, got, ng, &st));
        CHECK(stats_consistent(&st));
        CHECK(st.generated == 48 + 30 + 48 + 17 + 41);
        CHECK(st.drafts_proposed <= st.verify_items * d && st.drafts_padded <= st.drafts_proposed);
        for (int i = 0; i < NREQ; i++) {
            CHECKF(ng[i] == nb[i], "d=%d request %d: %d tokens, want %d", d, i, ng[i], nb[i]);
            char what[64];
            snprintf(what, sizeof what, "d=%d request %d without vs with speculation", d, i);
            CHECK_OK(streams_agree(&env, w.prompt[i], w.n_prompt[i], base[i], got[i], nb[i], what));
        }
        verify_items += st.verify_items;
    }
    /* Verify steps occur whenever the drafter has something to propose. It proposes nothing when a greedy
     * stream never repeats a token of its history (seed 119414771742068: 0 positions), so the check counts
     * the positions where it finds a draft in the streams themselves. */
    int draftable = draftable_positions(&w, base, nb);
    CHECKF(verify_items > 0 || draftable == 0, "no verify step in 4 runs, though the drafter finds drafts at %d positions",
           draftable);
    env_close(&env);
}

/* The same comparisons with bf16 activations (the release path), asserted bitwise: the engine is batch
 * invariant (docs/DESIGN.md), so a runner that takes exactly k3c_generate's steps (one request at a time,
 * whole prompts, no speculation) matches it, and so do batched runs (3 slots, prefill budget 32) with and
 * without speculation. */
TEST(runner_bf16_alone_and_batched_exact) {
    run_env env;
    CHECK_OK(env_open(&env, 3, 0, 0));
    workload w;
    make_workload(&w, env.V, test_seed() ^ 0xbf16);
    static int32_t alone[NREQ][MAXNEW], got[NREQ][MAXNEW];
    int ng[NREQ];
    for (int i = 0; i < NREQ; i++) {
        collect c = {alone[i], 0};
        CHECK_OK(k3c_generate(env.e, w.prompt[i], w.n_prompt[i], w.max_new[i], &w.sampling[i], collect_token, &c,
                              NULL));
    }
    /* one at a time, whole prompts: the same steps as k3c_generate */
    k3c_runner_options o;
    k3c_runner_options_default(&o);
    o.max_active = 1;
    k3c_runner *r;
    CHECK_OK(k3c_runner_create(env.e, &o, &r));
    int h[NREQ];
    for (int i = 0; i < NREQ; i++) {
        k3c_runner_request q = {.prompt = w.prompt[i], .n_prompt = w.n_prompt[i], .max_new = w.max_new[i],
                                .stop_token = -1};
        CHECK_OK(k3c_runner_submit(r, &q, &h[i]));
    }
    CHECK_OK(k3c_runner_run(r));
    for (int i = 0; i < NREQ; i++) {
        const int32_t *t;
        int n, fin;
        CHECK_OK(k3c_runner_output(r, h[i], &t, &n, &fin));
        CHECK(fin && n == w.max_new[i]);
        for (int k = 0; k < n; k++)
            CHECKF(t[k] == alone[i][k], "request %d token %d: %d in the runner, %d from k3c_generate", i, k, t[k],
                   alone[i][k]);
    }
    k3c_runner_free(r);
    /* batched (3 slots, prefill budget 32), with and without speculation */
    static int32_t nospec[NREQ][MAXNEW];
    for (int d = 0; d <= 4; d += 2) {
        CHECK_OK(run_workload(&env, &w, d, got, ng, NULL));
        int diverged = 0, sum_first = 0, tokens = 0, vs_nospec = 0;
        for (int i = 0; i < NREQ; i++) {
            CHECK(ng[i] == w.max_new[i]);
            for (int k = 0; k < ng[i]; k++) CHECK(got[i][k] >= 0 && got[i][k] < env.V);
            int t = 0;
            while (t < ng[i] && got[i][t] == alone[i][t]) t++;
            diverged += t < ng[i];
            sum_first += t;
            tokens += ng[i];
            if (d == 0) memcpy(nospec[i], got[i], sizeof(int32_t) * (size_t)ng[i]);
            else vs_nospec += memcmp(nospec[i], got[i], sizeof(int32_t) * (size_t)ng[i]) != 0;
        }
        printf("  [bf16, batched d=%d: %d of %d streams part from k3c_generate alone (%d of %d tokens before the "
               "first difference); %d differ from the batched run without speculation]\n",
               d, diverged, NREQ, sum_first, tokens, vs_nospec);
        CHECKF(diverged == 0 && vs_nospec == 0, "bf16 d=%d: %d streams part from alone, %d from d=0", d, diverged,
               vs_nospec);
    }
    env_close(&env);
}

/* A sampled request (temperature > 0) never speculates; beside greedy verifies it makes steps mixed, and its
 * stream still equals k3c_generate alone with the same seed (one sampler draw per token either way). */
TEST(runner_sampled_request_beside_speculation) {
    run_env env;
    CHECK_OK(env_open(&env, 3, 1, 0));
    workload w;
    make_workload(&w, env.V, test_seed() ^ 0xa11);
    w.sampling[1] = (k3c_sampling){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = test_seed()};
    w.sampling[3] = (k3c_sampling){.temperature = 1.2f, .seed = test_seed() + 1};
    static int32_t got[NREQ][MAXNEW], alone[MAXNEW];
    int ng[NREQ];
    k3c_runner_stats st;
    CHECK_OK(run_workload(&env, &w, 3, got, ng, &st));
    CHECK(stats_consistent(&st));
    for (int i = 0; i < NREQ; i++) {
        collect c = {alone, 0};
        CHECK_OK(k3c_generate(env.e, w.prompt[i], w.n_prompt[i], w.max_new[i], &w.sampling[i], collect_token, &c,
                              NULL));
        CHECK(c.n == ng[i]);
        if (w.sampling[i].temperature == 0) {
            char what[64];
            snprintf(what, sizeof what, "greedy request %d alone vs beside sampling", i);
            CHECK_OK(streams_agree(&env, w.prompt[i], w.n_prompt[i], alone, got[i], c.n, what));
        } else {
            /* one draw per token either way; a draw within ~1e-6 of a CDF boundary is ~1e-6 per token */
            for (int t = 0; t < c.n; t++)
                CHECKF(alone[t] == got[i][t], "sampled request %d token %d: %d in the runner, %d alone", i, t,
                       got[i][t], alone[t]);
        }
    }
    env_close(&env);
}

/* The stop token ends a request right after it is emitted, also from inside an accepted draft run. */
TEST(runner_stop_token) {
    run_env env;
    CHECK_OK(env_open(&env, 2, 1, 0));
    workload w;
    make_workload(&w, env.V, test_seed() ^ 0x570);
    static int32_t base[NREQ][MAXNEW];
    int nb[NREQ];
    CHECK_OK(run_workload(&env, &w, 0, base, nb, NULL));
    for (int d = 0; d <= 3; d += 3) {
        k3c_runner_options o;
        k3c_runner_options_default(&o);
        o.spec_tokens = d;
        k3c_runner *r;
        CHECK_OK(k3c_runner_create(env.e, &o, &r));
        int h[NREQ], want[NREQ];
        for (int i = 0; i < NREQ; i++) {
            int32_t stop = base[i][nb[i] / 2];
            want[i] = 0;
            while (base[i][want[i]] != stop) want[i]++;
            want[i]++;
            k3c_runner_request q = {.prompt = w.prompt[i], .n_prompt = w.n_prompt[i], .max_new = w.max_new[i],
                                    .stop_token = stop};
            CHECK_OK(k3c_runner_submit(r, &q, &h[i]));
        }
        CHECK_OK(k3c_runner_run(r));
        for (int i = 0; i < NREQ; i++) {
            const int32_t *t;
            int n, fin;
            CHECK_OK(k3c_runner_output(r, h[i], &t, &n, &fin));
            /* other join times split prompts differently: the streams may part at a near-tie, and then the
             * stop token comes elsewhere */
            char what[64];
            int part;
            snprintf(what, sizeof what, "d=%d request %d with a stop token", d, i);
            CHECK_OK(streams_agree_at(&env, w.prompt[i], w.n_prompt[i], base[i], t, n < want[i] ? n : want[i],
                                      what, &part));
            if (part < (n < want[i] ? n : want[i])) continue;
            CHECKF(fin && n == want[i], "d=%d request %d: %d tokens (finished %d), want %d", d, i, n, fin, want[i]);
        }
        k3c_runner_free(r);
    }
    env_close(&env);
}

/* (c) A repetitive prompt on the damped (near-bigram) tiny model, whose greedy stream falls into a loop: the
 * drafter's proposals get accepted, the decode steps are planned as uniform verify steps (never mixed: the
 * padding policy), and the streams equal greedy without speculation. The random tiny model itself never
 * repeats (its streams look uniform over the vocab), so there the drafter finds almost nothing to accept;
 * residual writes x0.05 keep every layer in the computation (and its state in the verify/commit path). */
static void repetitive_prompts(int V, int32_t prompt[4][40]) {
    k3c_rng rng;
    k3c_rng_seed(&rng, test_seed() ^ 0x4e9);
    int32_t phrase[5];
    for (int i = 0; i < 5; i++) phrase[i] = (int32_t)(k3c_rng_next(&rng) % (uint64_t)V);
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < 40; t++) prompt[j][t] = phrase[(t + j) % 5];
}

static int run_repetitive(run_env *env, int d, int32_t out[4][96], k3c_runner_stats *st) {
    int32_t prompt[4][40];
    repetitive_prompts(env->V, prompt);
    k3c_runner_options o;
    k3c_runner_options_default(&o);
    o.spec_tokens = d;
    k3c_runner *r;
    K3C_TRY(k3c_runner_create(env->e, &o, &r));
    int rc = K3C_OK, h[4];
    for (int j = 0; j < 4 && rc == K3C_OK; j++) {
        k3c_runner_request q = {.prompt = prompt[j], .n_prompt = 40, .max_new = 96, .stop_token = -1};
        rc = k3c_runner_submit(r, &q, &h[j]);
    }
    if (rc == K3C_OK) rc = k3c_runner_run(r);
    for (int j = 0; j < 4 && rc == K3C_OK; j++) {
        const int32_t *t;
        int n, fin;
        rc = k3c_runner_output(r, h[j], &t, &n, &fin);
        if (rc == K3C_OK && (n != 96 || !fin)) rc = k3c_errorf("request %d: %d tokens, finished %d", j, n, fin);
        if (rc == K3C_OK) memcpy(out[j], t, sizeof(int32_t) * 96);
    }
    k3c_runner_stats_get(r, st);
    k3c_runner_free(r);
    return rc;
}

TEST(runner_repetitive_prompt_accepts_drafts) {
    run_env env;
    CHECK_OK(env_open(&env, 4, 1, 0.05f));
    static int32_t base[4][96], got[4][96];
    k3c_runner_stats st;
    CHECK_OK(run_repetitive(&env, 0, base, &st));
    CHECK_OK(run_repetitive(&env, 3, got, &st));
    CHECK(stats_consistent(&st));
    printf("  [repetitive, d=3: %ld steps: stock %ld (prompt %ld, mixed %ld), decode %ld, verify %ld, wide %ld; "
           "drafts accepted %ld / proposed %ld (padded %ld)]\n",
           st.steps, st.route_steps[K3C_ROUTE_STOCK], st.stock_reason_steps[K3C_STOCK_PROMPT_ROWS],
           st.stock_reason_steps[K3C_STOCK_MIXED_VERIFY], st.route_steps[K3C_ROUTE_DECODE],
           st.route_steps[K3C_ROUTE_VERIFY], st.route_steps[K3C_ROUTE_WIDE], st.drafts_accepted,
           st.drafts_proposed, st.drafts_padded);
    int32_t prompt[4][40];
    repetitive_prompts(env.V, prompt);
    for (int j = 0; j < 4; j++) {
        char what[64];
        snprintf(what, sizeof what, "repetitive request %d without vs with speculation", j);
        CHECK_OK(streams_agree(&env, prompt[j], 40, base[j], got[j], 96, what));
    }
    CHECK(st.generated == 4 * 96);
    CHECK(st.route_steps[K3C_ROUTE_VERIFY] > 0);
    CHECK(st.stock_reason_steps[K3C_STOCK_MIXED_VERIFY] == 0); /* the padding policy keeps verifies uniform */
    CHECK(st.drafts_accepted > 0);
    env_close(&env);
}

/* The executor interface: a fake executor that prepared only the row counts 2, 4, 6, 8 runs the steps the
 * engine's plan routes to it (through the stock forward on the engine's caches, counting them, the greedy
 * ids taken from its own logits); everything else stays stock. */
typedef struct fake_exec {
    k3c_engine *e;
    int ran[K3C_RUNNER_ROUTES];
    long id_steps;
    float *lg; /* [64, V] */
} fake_exec;
static int fake_step(void *ctx, const k3c_plan *p, const k3c_fwd_req *reqs, int n, float *logits, int32_t *ids,
                     float *aux) {
    fake_exec *f = ctx;
    f->ran[p->route]++;
    if (p->route != K3C_ROUTE_DECODE && p->route != K3C_ROUTE_VERIFY)
        return k3c_errorf("fake executor: got a %s step (%d items)", k3c_route_name(p->route), n);
    for (int i = 0; i < n; i++)
        if (reqs[i].n != p->q || (reqs[i].verify != 0) != (p->q > 1))
            return k3c_errorf("fake executor: request %d runs %d tokens (verify %d) in a q = %d step", i, reqs[i].n,
                              reqs[i].verify, p->q);
    k3c_engine_view v;
    k3c_engine_view_get(f->e, &v);
    int V = v.m->config.vocab_size;
    K3C_TRY(k3c_forward_step(v.fwd, v.kv, v.ks, reqs, n, ids ? f->lg : logits, aux));
    if (ids) {
        f->id_steps++;
        for (int r = 0; r < p->rows; r++) ids[r] = k3c_greedy_token(f->lg + (size_t)r * V, V);
    }
    return K3C_OK;
}

TEST(runner_executor_takes_planned_steps) {
    run_env env;
    CHECK_OK(env_open(&env, 2, 1, 0));
    static const int batches[] = {2, 4, 6, 8};
    fake_exec f = {.e = env.e, .lg = malloc(sizeof(float) * 64 * (size_t)env.V)};
    CHECK(f.lg != NULL);
    k3c_decode_executor x = {.plan_table = {.batches = batches, .num_batches = 4, .kv_prepared = 1},
                             .ctx = &f, .step = fake_step};
    workload w;
    make_workload(&w, env.V, test_seed() ^ 0xe7ec);
    static int32_t base[NREQ][MAXNEW];
    int nb[NREQ];
    CHECK_OK(run_workload(&env, &w, 0, base, nb, NULL));
    k3c_runner_options o;
    k3c_runner_options_default(&o);
    o.spec_tokens = 1;
    k3c_runner *r;
    CHECK_OK(k3c_runner_create(env.e, &o, &r));
    k3c_engine_set_executor(env.e, &x);
    int h[NREQ];
    for (int i = 0; i < NREQ; i++) {
        k3c_runner_request q = {.prompt = w.prompt[i], .n_prompt = w.n_prompt[i], .max_new = w.max_new[i],
                                .stop_token = -1};
        CHECK_OK(k3c_runner_submit(r, &q, &h[i]));
    }
    CHECK_OK(k3c_runner_run(r));
    k3c_runner_stats st;
    k3c_runner_stats_get(r, &st);
    for (int i = 0; i < NREQ; i++) {
        const int32_t *t;
        int n, fin;
        CHECK_OK(k3c_runner_output(r, h[i], &t, &n, &fin));
        CHECK(fin && n == nb[i]);
        char what[64];
        snprintf(what, sizeof what, "request %d stock vs executor steps", i);
        CHECK_OK(streams_agree(&env, w.prompt[i], w.n_prompt[i], base[i], t, n, what));
    }
    k3c_runner_free(r);
    k3c_engine_stats es;
    k3c_engine_stats_get(env.e, &es);
    k3c_engine_set_executor(env.e, NULL);
    CHECK(st.executor_steps == f.ran[K3C_ROUTE_DECODE] + f.ran[K3C_ROUTE_VERIFY]);
    CHECK(st.executor_steps == st.route_steps[K3C_ROUTE_DECODE] + st.route_steps[K3C_ROUTE_VERIFY]);
    CHECK(st.executor_steps > 0);
    CHECK(f.ran[K3C_ROUTE_STOCK] == 0 && f.ran[K3C_ROUTE_WIDE] == 0);
    /* the runner's requests are all greedy: every executor step returned ids only */
    CHECK(f.id_steps == st.executor_steps);
    /* the engine saw the same steps (the reference workload ran first on it, all stock) */
    CHECK(es.specialized == 1 && es.executor_steps == st.executor_steps && es.greedy_id_steps == f.id_steps);
    free(f.lg);
    env_close(&env);
}

/* A step the engine plans K3C_ROUTE_WIDE goes to its executor on a single rank, with logits and without ids
 * (a wide step's logits come from the stock LM head: the engine takes greedy ids from them), exactly the
 * requests k3c_forward_step would get; its logits are what the executor returned. A fake executor (wide_max
 * 64, batches 2 4 6 8) runs such a step through the engine's stock forward; the same step on another set of
 * requests with the executor switched off is the reference. */
typedef struct wide_fake {
    k3c_engine *e;
    int wide, other, with_ids;
} wide_fake;
static int wide_fake_step(void *ctx, const k3c_plan *p, const k3c_fwd_req *reqs, int n, float *logits, int32_t *ids,
                          float *aux) {
    wide_fake *f = ctx;
    if (p->route != K3C_ROUTE_WIDE) {
        f->other++;
        return k3c_errorf("fake executor: a %s step", k3c_route_name(p->route));
    }
    f->wide++;
    f->with_ids += ids != NULL || logits == NULL;
    for (int i = 0; i < n; i++)
        if (reqs[i].n != p->q || !reqs[i].verify) return k3c_errorf("fake executor: request %d is no q-verify", i);
    k3c_engine_view v;
    k3c_engine_view_get(f->e, &v);
    return k3c_forward_step(v.fwd, v.kv, v.ks, reqs, n, logits, aux);
}

TEST(engine_wide_steps_go_to_the_executor_with_logits) {
    run_env env;
    CHECK_OK(env_open(&env, 6, 0, 0));
    static const int batches[] = {2, 4, 6, 8};
    wide_fake f = {.e = env.e};
    k3c_decode_executor x = {.plan_table = {.batches = batches, .num_batches = 4, .wide_max = 64, .kv_prepared = 1},
                             .ctx = &f, .step = wide_fake_step};
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x31de);
    int V = env.V, ids[6];
    int32_t prompt[3][9], tok[12], got[12];
    float *lg = malloc(sizeof(float) * 12 * V), *la = malloc(sizeof(float) * 12 * V), *lb = malloc(sizeof(float) * 12 * V);
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 9; t++) prompt[i][t] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 3; i++) {
            CHECK_OK(k3c_request_open(env.e, &ids[s * 3 + i]));
            k3c_step_item it = {.request = ids[s * 3 + i], .tokens = prompt[i], .n = 9};
            CHECK_OK(k3c_engine_step(env.e, &it, 1, lg));
        }
    for (int t = 0; t < 12; t++) tok[t] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
    k3c_step_item ia[3], ib[3];
    for (int i = 0; i < 3; i++) { /* 3 requests x 4 tokens = 12 rows: no batch, within wide_max */
        ia[i] = (k3c_step_item){.request = ids[i], .tokens = tok + 4 * i, .n = 4, .verify = 1};
        ib[i] = (k3c_step_item){.request = ids[3 + i], .tokens = tok + 4 * i, .n = 4, .verify = 1};
    }
    poison_f32(la, (size_t)12 * V);
    poison_f32(lb, (size_t)12 * V);
    CHECK_OK(k3c_engine_step(env.e, ia, 3, la)); /* no executor yet: the stock path */
    k3c_engine_set_executor(env.e, &x);
    CHECK_OK(k3c_engine_step_greedy(env.e, ib, 3, got, lb));
    k3c_plan p = k3c_engine_last_plan(env.e);
    k3c_engine_stats es;
    k3c_engine_stats_get(env.e, &es);
    k3c_engine_set_executor(env.e, NULL);
    CHECKF(p.route == K3C_ROUTE_WIDE && p.rows == 12 && p.q == 4, "planned %s rows %d q %d", k3c_route_name(p.route),
           p.rows, p.q);
    CHECKF(f.wide == 1 && f.other == 0 && f.with_ids == 0 && k3c_engine_last_step_executor(env.e) == 1,
           "the executor ran %d wide and %d other steps, %d with ids or without logits", f.wide, f.other, f.with_ids);
    CHECK(es.executor_steps == 1 && es.greedy_id_steps == 0 && es.route_steps[K3C_ROUTE_WIDE] == 1);
    CHECKF(!memcmp(la, lb, sizeof(float) * 12 * V), "the wide step's logits differ from the stock step's");
    for (int t = 0; t < 12; t++) CHECK(got[t] == k3c_greedy_token(lb + (size_t)t * V, V));
    for (int i = 0; i < 6; i++) k3c_request_close(env.e, ids[i]);
    free(lg), free(la), free(lb);
    env_close(&env);
}

/* (d) The drafter's lookup, expected drafts worked out by hand from the rule in runtime/drafter.h. */
TEST(drafter_ngram_lookup) {
    int32_t out[8];
    struct {
        int32_t h[12];
        int n, d, want_n;
        int32_t want[8];
    } cases[] = {
        /* suffix 1 2 3 occurs at 0: the tokens after it */
        {{1, 2, 3, 4, 1, 2, 3}, 7, 3, 3, {4, 1, 2}},
        /* the most recent occurrence of 5 6 (at 3, not at 0) */
        {{5, 6, 7, 5, 6, 8, 5, 6}, 8, 2, 2, {8, 5}},
        /* no earlier occurrence of any suffix */
        {{1, 2, 3}, 3, 4, 0, {0}},
        /* only the 1-gram 4 matches; the copy runs into the drafts it made: 7 4 7 */
        {{9, 4, 7, 4}, 4, 3, 3, {7, 4, 7}},
        /* a period-2 loop continues past the end of the history */
        {{1, 2, 1, 2}, 4, 5, 5, {1, 2, 1, 2, 1}},
        /* the 3-gram match (3 1 2 at 0) wins over a more recent 1-gram (2 at 5) */
        {{3, 1, 2, 9, 7, 2, 5, 3, 1, 2}, 10, 2, 2, {9, 7}},
        /* the 2-gram 1 2 at 0 wins over the 1-gram 2 at 3 */
        {{1, 2, 8, 2, 6, 1, 2}, 7, 1, 1, {8}},
        /* a single token has no earlier history */
        {{4}, 1, 3, 0, {0}},
        /* d = 0 proposes nothing */
        {{1, 1, 1}, 3, 0, 0, {0}},
        /* all-equal history: 1-gram... 3-gram 1 1 1 at 1 (most recent with i < n - 3 = 2) */
        {{1, 1, 1, 1, 1}, 5, 4, 4, {1, 1, 1, 1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int k = 0; k < 8; k++) out[k] = -1;
        int n = k3c_draft_ngram(cases[c].h, cases[c].n, cases[c].d, out);
        CHECKF(n == cases[c].want_n, "case %zu: %d drafts, want %d", c, n, cases[c].want_n);
        for (int k = 0; k < n; k++)
            CHECKF(out[k] == cases[c].want[k], "case %zu draft %d: %d, want %d", c, k, out[k], cases[c].want[k]);
        for (int k = n; k < 8; k++) CHECKF(out[k] == -1, "case %zu: wrote past %d drafts", c, n);
    }
    CHECK(k3c_draft_ngram(NULL, 0, 3, out) == 0);
}

/* Bad requests are refused with a message and leave the runner usable. */
TEST(runner_rejects_bad_requests) {
    run_env env;
    CHECK_OK(env_open(&env, 2, 1, 0));
    k3c_runner *r;
    k3c_runner_options o;
    k3c_runner_options_default(&o);
    o.spec_tokens = -1;
    CHECK(k3c_runner_create(env.e, &o, &r) != 0);
    o.spec_tokens = 2;
    CHECK_OK(k3c_runner_create(env.e, &o, &r));
    int32_t p[3] = {1, 2, env.V};
    int h;
    k3c_runner_request q = {.prompt = p, .n_prompt = 3, .max_new = 4, .stop_token = -1};
    CHECK(k3c_runner_submit(r, &q, &h) != 0);
    CHECK(strstr(k3c_error_message(), "outside") != NULL);
    p[2] = 3;
    q.max_new = 0;
    CHECK(k3c_runner_submit(r, &q, &h) != 0);
    q.max_new = 4;
    q.n_prompt = 0;
    CHECK(k3c_runner_submit(r, &q, &h) != 0);
    q.n_prompt = 3;
    CHECK_OK(k3c_runner_submit(r, &q, &h));
    CHECK(h == 0);
    CHECK_OK(k3c_runner_run(r));
    const int32_t *t;
    int n, fin;
    CHECK_OK(k3c_runner_output(r, 0, &t, &n, &fin));
    CHECK(n == 4 && fin);
    CHECK(k3c_runner_output(r, 1, &t, &n, &fin) != 0);
    k3c_runner_free(r);
    env_close(&env);
}
