/* Ranks at the engine level (runtime/engine_ranks.h, runtime/ranks.h, comm/rendezvous.h): an engine made
 * with k3c_engine_options.layout.tp = N runs every step on N CPU ranks in this process, rank 0 leading. The
 * engine's diagnostic (k3c_engine_check_ranks) has every rank hash its logits after every step and compares
 * the hashes, so every step of these tests also asserts that every rank holds bitwise rank 0's logits.
 *
 * Against world size 1: with f32 activations the logits within 1e-5 (the only difference is where the
 * row-parallel sums split, as tests/test_tp.c measures at the forward) and the greedy streams equal (they may
 * part only at a near-tie of world size 1's logits, which the tests tell apart); with bf16 activations the
 * logits within test_tp.c's bf16 tolerance: no farther from the f32 function than 2x world size 1's own bf16
 * logits are. Then the serving scheduler (several requests, chunked prefill, prefix hits, speculation) under
 * TP 2, the CLI (`k3c generate --tp 2` against `--tp 1`), a rank that fails or hangs mid-run, ranks started
 * differently, the refused layouts, and the rendezvous file protocol of a multi-process launch. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/rendezvous.h"
#include "damp_residual.h"
#include "k3c.h"
#include "model/presets.h"
#include "model/synth.h"
#include "runtime/engine_internal.h"
#include "runtime/ranks.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"
#include "tp_config.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}


/* Synthesizes the config into test_tmpdir()/name (damp > 0: made repetitive, damp_residual.h) and loads it
 * through the public API. */
static int ranks_model(int kimi_linear, int dense, float damp, uint64_t seed, const char *name, k3c_model **m) {
    k3c_config c;
    K3C_TRY(tp_config(kimi_linear, dense, &c));
    char dir[512]; /* damp_residual.h builds shard paths of 600 bytes from it */
    if (snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name) >= (int)sizeof dir) {
        k3c_config_free(&c);
        return k3c_errorf("the scratch directory's path is too long");
    }
    int rc = k3c_synth_write(&c, NULL, seed, dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    if (damp > 0) K3C_TRY(damp_residual_writes_in(dir, damp));
    return k3c_load(dir, m);
}

static void engine_opts(k3c_engine_options *o, int tp, int exact) {
    k3c_engine_options_default(o);
    o->threads = tp; /* one worker per rank: the ranks share the cores */
    o->exact_f32 = exact;
    o->layout.tp = tp;
    o->rank_timeout_ms = 30000;
}

/* ---- one request through the engine: every prompt row's logits, then greedy (or forced) decode steps ---- */

enum { NP = 70, NN = 8 }; /* a 70-token prompt: one whole chunked KDA block of 64 and recurrent rows */

typedef struct run {
    float *prompt_lg; /* [NP, V] */
    float *step_lg;   /* [NN, V]: the logits each decode token was taken from */
    int32_t stream[NN];
    long steps, checked;
} run;

static void run_free(run *r) {
    free(r->prompt_lg);
    free(r->step_lg);
}

/* forced: the decode inputs (NULL: the run's own greedy tokens). */
static int engine_run(k3c_model *m, int tp, int exact, const int32_t *prompt, const int32_t *forced, run *r) {
    memset(r, 0, sizeof *r);
    k3c_engine_options o;
    engine_opts(&o, tp, exact);
    o.max_requests = 1;
    o.max_rows = NP;
    o.max_context = NP + NN + 1;
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    k3c_engine_check_ranks(e, 1);
    int V = k3c_engine_vocab(e), id = -1, rc = K3C_OK;
    r->prompt_lg = malloc(sizeof(float) * (size_t)NP * V);
    r->step_lg = malloc(sizeof(float) * (size_t)NN * V);
    if (!r->prompt_lg || !r->step_lg) rc = k3c_errorf("out of memory");
    if (rc == K3C_OK) {
        poison_f32(r->prompt_lg, (size_t)NP * V);
        poison_f32(r->step_lg, (size_t)NN * V);
        rc = k3c_request_open(e, &id);
    }
    k3c_step_item it = {.request = id, .tokens = prompt, .n = NP, .all_logits = 1};
    if (rc == K3C_OK) rc = k3c_engine_step(e, &it, 1, r->prompt_lg);
    int32_t tok = rc == K3C_OK ? k3c_greedy_token(r->prompt_lg + (size_t)(NP - 1) * V, V) : 0;
    for (int s = 0; s < NN && rc == K3C_OK; s++) {
        r->stream[s] = tok;
        int32_t in = forced ? forced[s] : tok;
        k3c_step_item d = {.request = id, .tokens = &in, .n = 1};
        rc = k3c_engine_step(e, &d, 1, r->step_lg + (size_t)s * V);
        tok = k3c_greedy_token(r->step_lg + (size_t)s * V, V);
    }
    k3c_engine_stats st;
    k3c_engine_stats_get(e, &st);
    r->steps = st.steps;
    r->checked = k3c_engine_ranks_checked(e);
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    if (id >= 0) k3c_request_close(e, id);
    k3c_engine_free(e);
    return rc == K3C_OK ? K3C_OK : k3c_errorf("tp %d: %s", tp, msg);
}

static double worst_row(const float *a, const float *b, int rows, int V) {
    double w = 0;
    for (int i = 0; i < rows; i++) {
        double d = rel_l2_f32f32(a + (size_t)i * V, b + (size_t)i * V, (size_t)V);
        if (!(d <= w)) w = d;
    }
    return w;
}

/* The greedy margin of a logits row: best minus second best. */
static double margin(const float *lg, int V) {
    int a = k3c_greedy_token(lg, V);
    float second = -INFINITY;
    for (int i = 0; i < V; i++)
        if (i != a && lg[i] > second) second = lg[i];
    return (double)lg[a] - second;
}

/* Tokens two streams share from the start; a part is allowed only where world size 1's logits (one) had
 * a near-tie (the f32 sums' last bits may decide it). */
static int same_prefix(const run *one, const int32_t *stream, int V, int *same) {
    int t = 0;
    while (t < NN && stream[t] == one->stream[t]) t++;
    *same = t;
    if (t == NN) return K3C_OK;
    const float *lg = t == 0 ? one->prompt_lg + (size_t)(NP - 1) * V : one->step_lg + (size_t)(t - 1) * V;
    double g = margin(lg, V);
    return g < 1e-4 ? K3C_OK : k3c_errorf("the greedy stream parts at token %d (world size 1's margin %g)", t, g);
}

static int collect_token(void *u, int32_t tok) {
    int32_t *c = u;
    c[1 + c[0]++] = tok;
    return 0;
}

static void check_f32(int kimi_linear) {
    uint64_t seed = test_seed();
    k3c_model *m;
    CHECK_OK(ranks_model(kimi_linear, 0, 0, seed, kimi_linear ? "ranks_kl_f32" : "ranks_k3_f32", &m));
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int V = info.vocab_size;
    int32_t prompt[NP];
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x7a11);
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    run one;
    if (engine_run(m, 1, 1, prompt, NULL, &one) != K3C_OK) {
        k3c_free(m);
        CHECKF(0, "world size 1: %s", k3c_error_message());
    }
    const char *name = kimi_linear ? "kimi-linear" : "k3";
    for (int tp = 2; tp <= 4; tp *= 2) {
        run r;
        int rc = engine_run(m, tp, 1, prompt, NULL, &r), same = 0;
        if (rc == K3C_OK) rc = same_prefix(&one, r.stream, V, &same);
        double wp = rc == K3C_OK ? worst_row(r.prompt_lg, one.prompt_lg, NP, V) : 0;
        double wd = rc == K3C_OK ? worst_row(r.step_lg, one.step_lg, same, V) : 0;
        if (rc == K3C_OK)
            printf("    %s f32 tp %d through the engine: worst row rel L2 vs world size 1: prompt %.3g, decode %.3g; "
                   "greedy %d/%d equal; %ld of %ld steps every rank bitwise rank 0\n", name, tp, wp, wd, same, NN,
                   r.checked, r.steps);
        if (rc == K3C_OK && !(wp <= 1e-5 && wd <= 1e-5))
            rc = k3c_errorf("tp %d: rel L2 %.3g / %.3g over 1e-5", tp, wp, wd);
        if (rc == K3C_OK && (r.checked != r.steps || r.steps != 1 + NN))
            rc = k3c_errorf("tp %d: %ld of %ld steps compared across the ranks", tp, r.checked, r.steps);
        /* k3c_generate on the ranks: the same greedy stream */
        int32_t got[1 + NN] = {0};
        k3c_engine *e = NULL;
        k3c_engine_options o;
        engine_opts(&o, tp, 1);
        o.max_requests = 1;
        o.max_context = NP + NN;
        if (rc == K3C_OK) rc = k3c_engine_create(m, &o, &e);
        if (rc == K3C_OK) {
            k3c_engine_check_ranks(e, 1);
            rc = k3c_generate(e, prompt, NP, NN, NULL, collect_token, got, NULL);
            k3c_engine_stats st;
            k3c_engine_stats_get(e, &st);
            if (rc == K3C_OK && k3c_engine_ranks_checked(e) != st.steps)
                rc = k3c_errorf("generate: %ld of %ld steps compared", k3c_engine_ranks_checked(e), st.steps);
            if (rc == K3C_OK && k3c_engine_world_size(e) != tp) rc = k3c_errorf("world size %d", k3c_engine_world_size(e));
        }
        int gsame = 0;
        if (rc == K3C_OK && got[0] != NN) rc = k3c_errorf("generate: %d tokens", got[0]);
        if (rc == K3C_OK) rc = same_prefix(&one, got + 1, V, &gsame);
        if (rc == K3C_OK) printf("    %s f32 tp %d k3c_generate: %d/%d tokens of world size 1's stream\n", name, tp, gsame, NN);
        k3c_engine_free(e);
        run_free(&r);
        if (rc != K3C_OK) {
            run_free(&one);
            k3c_free(m);
            CHECKF(0, "%s: %s", name, k3c_error_message());
        }
    }
    run_free(&one);
    k3c_free(m);
}

TEST(ranks_engine_k3_f32_matches_world_size_1) { check_f32(0); }
TEST(ranks_engine_kimi_linear_f32_matches_world_size_1) { check_f32(1); }

/* bf16: world size 1's own greedy tokens fed to every run, so the decode rows compare the same inputs. */
static void check_bf16(int kimi_linear) {
    uint64_t seed = test_seed();
    k3c_model *m;
    CHECK_OK(ranks_model(kimi_linear, 1, 0, seed, kimi_linear ? "ranks_kl_bf16" : "ranks_k3_bf16", &m));
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int V = info.vocab_size;
    int32_t prompt[NP];
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0xb16);
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    run one, fn;
    int rc = engine_run(m, 1, 0, prompt, NULL, &one);
    if (rc == K3C_OK) rc = engine_run(m, 1, 1, prompt, one.stream, &fn);
    if (rc != K3C_OK) {
        k3c_free(m);
        CHECKF(0, "world size 1: %s", k3c_error_message());
    }
    const char *name = kimi_linear ? "kimi-linear" : "k3";
    double noise = worst_row(one.prompt_lg, fn.prompt_lg, NP, V), dn = worst_row(one.step_lg, fn.step_lg, NN, V);
    if (dn > noise) noise = dn;
    for (int tp = 2; tp <= 4 && rc == K3C_OK; tp *= 2) {
        run r;
        rc = engine_run(m, tp, 0, prompt, one.stream, &r);
        if (rc != K3C_OK) break;
        double wp = worst_row(r.prompt_lg, one.prompt_lg, NP, V), wd = worst_row(r.step_lg, one.step_lg, NN, V);
        double fp = worst_row(r.prompt_lg, fn.prompt_lg, NP, V), fd = worst_row(r.step_lg, fn.step_lg, NN, V);
        double w = wp > wd ? wp : wd, f = fp > fd ? fp : fd;
        printf("    %s bf16 tp %d through the engine: worst row rel L2 vs world size 1's bf16 %.3g, vs the f32 function "
               "%.3g (world size 1's own %.3g); %ld of %ld steps every rank bitwise rank 0\n", name, tp, w, f, noise,
               r.checked, r.steps);
        if (!(w <= 2.0 * noise && f <= 2.0 * noise))
            rc = k3c_errorf("tp %d bf16: %.3g from world size 1, %.3g from the f32 function, against world size 1's "
                            "own %.3g (x 2 allowed)", tp, w, f, noise);
        else if (r.checked != r.steps || r.steps != 1 + NN)
            rc = k3c_errorf("tp %d: %ld of %ld steps compared across the ranks", tp, r.checked, r.steps);
        run_free(&r);
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", k3c_error_message());
    run_free(&one);
    run_free(&fn);
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s: %s", name, msg);
}

TEST(ranks_engine_k3_bf16_within_tolerance) { check_bf16(0); }
TEST(ranks_engine_kimi_linear_bf16_within_tolerance) { check_bf16(1); }

/* ---- the serving scheduler on TP 2 ---- */

enum { NJOBS = 5, SNEW = 24, PREFIX = 64, OWN = 32, CONT = 12 };

typedef struct sjob {
    int32_t prompt[PREFIX + OWN + CONT + 1];
    int n_prompt;
    int32_t out[SNEW];
    float gap[SNEW]; /* the greedy margin of each token (logprobs of the two best) */
    int n_out, finished, cached;
    uint64_t id;
} sjob;

/* Every job through one scheduler over an engine of tp ranks: chunked prefill (48 tokens a step, the prompt
 * grid 32), prefix hits (the jobs share a 64-token prefix, hinted), three prompt-lookup drafts a verify, three
 * requests at once on too few cache blocks (preemption), freed blocks poisoned on every rank. */
static int sched_run(k3c_model *m, int tp, sjob *jobs, k3c_scheduler_stats *out, long *checked, long *steps) {
    k3c_engine_options o;
    engine_opts(&o, tp, 1);
    o.max_requests = 3;
    o.max_rows = 64;
    o.max_context = PREFIX + OWN + CONT + 1 + SNEW;
    o.chunk_min = 16;
    o.mla_expand_min = 32;
    o.q_max = 4;
    o.poison_freed_blocks = 1;
    o.num_blocks = 11; /* fewer than three requests' full contexts and the cached prefix: preemptions */
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    k3c_engine_check_ranks(e, 1);
    k3c_scheduler_options so;
    k3c_scheduler_options_default(&so);
    so.max_seqs = 3;
    so.max_batched_tokens = 48;
    so.spec_tokens = 3;
    k3c_scheduler *s = NULL;
    int rc = k3c_scheduler_create(e, &so, &s);
    for (int j = 0; j < NJOBS && rc == K3C_OK; j++) {
        jobs[j].n_out = jobs[j].finished = 0;
        k3c_sched_request q = {.prompt = jobs[j].prompt, .n_prompt = jobs[j].n_prompt, .max_new = SNEW,
                               .ignore_eos = 1, .prefix_hint = PREFIX, .user = &jobs[j]};
        q.sampling.logprobs = 3;
        if (k3c_scheduler_submit(s, &q, &jobs[j].id) != 0) rc = k3c_errorf("submit: %s", k3c_error_message());
    }
    int busy = 1, k = 0;
    while (rc == K3C_OK && busy) {
        const k3c_sched_event *ev;
        int n;
        rc = k3c_scheduler_step(s, &ev, &n, &busy);
        for (int i = 0; i < n && rc == K3C_OK; i++) {
            sjob *j = ev[i].user;
            if (ev[i].kind == K3C_SCHED_TOKEN && j->n_out < SNEW) {
                j->gap[j->n_out] = ev[i].n_top >= 2 ? ev[i].top_logprobs[0] - ev[i].top_logprobs[1] : 0;
                j->out[j->n_out++] = ev[i].token;
            } else if (ev[i].kind == K3C_SCHED_FINISHED) {
                j->finished = 1;
                j->cached = ev[i].cached_tokens;
                if (ev[i].finish == K3C_FINISH_ERROR) rc = k3c_errorf("job failed: %s", ev[i].message);
            }
        }
        if (++k > 5000) rc = k3c_errorf("still busy after %d steps", k);
    }
    k3c_scheduler_stats_get(s, out);
    *checked = k3c_engine_ranks_checked(e);
    k3c_engine_stats est;
    k3c_engine_stats_get(e, &est);
    *steps = est.steps;
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    k3c_scheduler_free(s);
    k3c_engine_free(e);
    return rc == K3C_OK ? K3C_OK : k3c_errorf("tp %d: %s", tp, msg);
}

TEST(ranks_scheduler_tp2_matches_world_size_1) {
    uint64_t seed = test_seed();
    k3c_model *m;
    CHECK_OK(ranks_model(0, 0, 0.05f, seed, "ranks_sched", &m)); /* damped: drafts get accepted */
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    static sjob a[NJOBS], b[NJOBS];
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x5c4ed);
    int32_t prefix[PREFIX];
    for (int i = 0; i < PREFIX; i++) prefix[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)info.vocab_size);
    /* Each prompt: the shared prefix, 8 .. 32 tokens of its own ending in t, world size 1's greedy continuation
     * of that, and t again: the damped model (nearly a function of its last token) then continues as it did
     * after the first t, which the prompt-lookup drafter proposes, so drafts get accepted. */
    k3c_engine_options go;
    engine_opts(&go, 1, 1);
    go.max_requests = 1;
    go.max_context = PREFIX + OWN + CONT;
    k3c_engine *ge = NULL;
    CHECK_OK(k3c_engine_create(m, &go, &ge));
    for (int j = 0; j < NJOBS; j++) {
        int own = 8 + 6 * j;
        memcpy(a[j].prompt, prefix, sizeof prefix);
        for (int i = 0; i < own; i++) a[j].prompt[PREFIX + i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)info.vocab_size);
        int32_t cont[1 + CONT] = {0};
        int rc = k3c_generate(ge, a[j].prompt, PREFIX + own, CONT, NULL, collect_token, cont, NULL);
        if (rc != K3C_OK) k3c_engine_free(ge);
        CHECK_OK(rc);
        memcpy(a[j].prompt + PREFIX + own, cont + 1, sizeof(int32_t) * CONT);
        a[j].prompt[PREFIX + own + CONT] = a[j].prompt[PREFIX + own - 1];
        a[j].n_prompt = PREFIX + own + CONT + 1;
        b[j] = a[j];
    }
    k3c_engine_free(ge);
    k3c_scheduler_stats sa, sb;
    long ca, cb, stepa, stepb;
    int rc = sched_run(m, 1, a, &sa, &ca, &stepa);
    if (rc == K3C_OK) rc = sched_run(m, 2, b, &sb, &cb, &stepb);
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s", k3c_error_message());
    int equal = 0, ties = 0;
    for (int j = 0; j < NJOBS; j++) {
        CHECKF(a[j].finished && b[j].finished && a[j].n_out == SNEW && b[j].n_out == SNEW, "job %d unfinished", j);
        int t = 0;
        while (t < SNEW && a[j].out[t] == b[j].out[t]) t++;
        equal += t;
        if (t < SNEW) { /* only at a near-tie of world size 1's logits */
            CHECKF(a[j].gap[t] < 1e-4f, "job %d: the tp 2 stream parts at token %d (margin %g)", j, t, (double)a[j].gap[t]);
            ties++;
        }
    }
    printf("    scheduler tp 2 (f32): %d of %d tokens as world size 1 (%d streams parted at a near-tie); %ld steps "
           "(%ld world size 1), all %ld compared across the ranks; drafts accepted %ld / %ld; prefix hits %ld "
           "tokens; preemptions %ld\n", equal, NJOBS * SNEW, ties, stepb, stepa, cb, sb.spec_accepted_tokens,
           sb.spec_draft_tokens, sb.prefix_hits_tokens, sb.preemptions);
    CHECKF(cb == stepb, "%ld of %ld steps compared across the ranks", cb, stepb);
    /* the paths this test is for were taken */
    CHECKF(sb.spec_accepted_tokens > 0 && sb.prefix_hits_tokens > 0 && sb.preemptions > 0,
           "accepted drafts %ld, prefix hits %ld, preemptions %ld", sb.spec_accepted_tokens, sb.prefix_hits_tokens,
           sb.preemptions);
    /* one schedule: the same steps, hits and preemptions (unless a near-tie parted a stream) */
    if (!ties) CHECK(sa.prefix_hits_tokens == sb.prefix_hits_tokens && sa.preemptions == sb.preemptions && stepa == stepb);
}

/* ---- the CLI: k3c generate --tp 2 against --tp 1, f32 ---- */

TEST(ranks_cli_generate_tp2_equals_tp1) {
    char k3c[4096], cmd[16384], out1[4300], out2[4300];
    CHECK(test_k3c_binary(k3c, sizeof k3c));
    snprintf(out1, sizeof out1, "%s/ranks_cli_1.txt", test_tmpdir());
    snprintf(out2, sizeof out2, "%s/ranks_cli_2.txt", test_tmpdir());
    /* the embedded default model (2 KDA and 2 MLA heads: TP 2 splits them); a text prompt, 24 tokens */
    const char *args = "generate --prompt 'A penny saved is' -n 24 --ignore-eos --exact-f32";
    snprintf(cmd, sizeof cmd, "%s %s --tp 1 > %s 2>/dev/null", k3c, args, out1);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s %s --tp 2 > %s 2>/dev/null", k3c, args, out2);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", out1, out2);
    CHECKF(test_run_status(cmd) == 0, "k3c generate --tp 2 printed other text than --tp 1 (%s, %s)", out1, out2);
    FILE *f = fopen(out1, "r");
    char text[256] = "";
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
    }
    CHECK(strlen(text) > 8);
    /* a refused layout exits non-zero with its message */
    snprintf(cmd, sizeof cmd, "%s generate --prompt-ids 1,2 -n 2 --tp 2 --ep 2>&1 | grep -q 'without data parallelism'", k3c);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s generate --prompt-ids 1,2 -n 2 --tp 3 >/dev/null 2>&1", k3c);
    CHECK(test_run_status(cmd) == 1);
}

/* ---- K3C_CHECK_RANKS: the step check for the commands (tools/gpu-multi.sh sets it) ---- */

static int env_checked(k3c_model *m, long *checked, long *steps) {
    k3c_engine_options o;
    engine_opts(&o, 2, 1);
    o.max_requests = 1;
    o.max_context = 32;
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    int32_t prompt[5] = {3, 1, 4, 1, 5}, got[1 + 8] = {0};
    int rc = k3c_generate(e, prompt, 5, 8, NULL, collect_token, got, NULL);
    k3c_engine_stats st;
    k3c_engine_stats_get(e, &st);
    *checked = k3c_engine_ranks_checked(e);
    *steps = st.steps;
    k3c_engine_free(e);
    return rc;
}

TEST(ranks_check_env_compares_every_step) {
    k3c_model *m;
    CHECK_OK(ranks_model(0, 0, 0, test_seed(), "ranks_env", &m));
    long on = -1, on_steps = -1, off = -1, off_steps = -1;
    setenv("K3C_CHECK_RANKS", "1", 1);
    int rc = env_checked(m, &on, &on_steps);
    unsetenv("K3C_CHECK_RANKS");
    if (rc == K3C_OK) rc = env_checked(m, &off, &off_steps);
    k3c_free(m);
    CHECK_OK(rc);
    CHECKF(on_steps > 1 && on == on_steps, "K3C_CHECK_RANKS=1: %ld of %ld steps compared", on, on_steps);
    CHECKF(off == 0, "without it: %ld steps compared", off);
}

/* ---- a rank that fails or hangs mid-run ---- */

/* generate on tp ranks with the test fault of rank `rank` at step `step`; the message and the seconds the
 * failing call took. */
static int faulty_generate(k3c_model *m, int tp, int rank, long step, int stall, int timeout_ms, char *msg,
                           size_t cap, double *seconds, int *failed_after) {
    k3c_engine_options o;
    engine_opts(&o, tp, 0);
    o.max_requests = 1;
    o.max_context = 64;
    o.rank_timeout_ms = timeout_ms;
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    int32_t prompt[6] = {1, 2, 3, 4, 5, 6}, got[1 + 32] = {0};
    k3c_ranks_test_fault(rank, step, stall);
    double t0 = now_s();
    int rc = k3c_generate(e, prompt, 6, 16, NULL, collect_token, got, NULL);
    *seconds = now_s() - t0;
    k3c_ranks_test_fault(-1, 0, 0);
    snprintf(msg, cap, "%s", k3c_error_message());
    /* the group stays failed: the next call fails at once, with the same message */
    int id = -1;
    int again = k3c_request_open(e, &id);
    *failed_after = k3c_engine_failed(e) && again == K3C_ERR && strstr(k3c_error_message(), "failed at step");
    double t1 = now_s();
    k3c_engine_free(e); /* joins the ranks' threads: no hang */
    if (now_s() - t1 > 2.0 * timeout_ms / 1000 + 1) return k3c_errorf("freeing the failed engine took %.1f s", now_s() - t1);
    return rc == K3C_ERR ? K3C_OK : k3c_errorf("generate succeeded despite the fault");
}

TEST(ranks_failed_rank_fails_the_group) {
    k3c_model *m;
    CHECK_OK(ranks_model(0, 0, 0, 11, "ranks_fault", &m));
    char msg[2048];
    double s;
    int after;
    /* a follower's error: every rank's wait ends at once (abort), far inside the 20 s timeout */
    int rc = faulty_generate(m, 4, 2, 3, 0, 20000, msg, sizeof msg, &s, &after);
    if (rc == K3C_OK) printf("    tp 4, rank 2 fails at step 3: generate failed in %.3f s: %s\n", s, msg);
    if (rc == K3C_OK && !(strstr(msg, "rank 2 failed at step 3") && strstr(msg, "test fault") && s < 5 && after))
        rc = k3c_errorf("rank 2's failure: %.1f s, message '%s', failed after: %d", s, msg, after);
    /* rank 0's own error */
    if (rc == K3C_OK) rc = faulty_generate(m, 2, 0, 2, 0, 20000, msg, sizeof msg, &s, &after);
    if (rc == K3C_OK && !(strstr(msg, "rank 0 failed at step 2") && s < 5 && after))
        rc = k3c_errorf("rank 0's failure: %.1f s, message '%s'", s, msg);
    /* a follower that hangs: the others give up at the timeout (400 ms), not later */
    if (rc == K3C_OK) rc = faulty_generate(m, 2, 1, 2, 1, 400, msg, sizeof msg, &s, &after);
    if (rc == K3C_OK) printf("    tp 2, rank 1 hangs at step 2 (timeout 0.4 s): generate failed in %.3f s: %s\n", s, msg);
    if (rc == K3C_OK && !(strstr(msg, "failed at step 2") && strstr(msg, "timed out") && s >= 0.35 && s < 3 && after))
        rc = k3c_errorf("rank 1's hang: %.2f s, message '%s'", s, msg);
    char why[2048];
    snprintf(why, sizeof why, "%s", k3c_error_message());
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s", why);
}

/* An idle rank 0 (a server between requests) keeps its followers: 1.2 s without a step, three times the
 * 0.4 s timeout that each of their waits has, and the next step runs. */
TEST(ranks_idle_leader_keeps_the_group) {
    k3c_model *m;
    CHECK_OK(ranks_model(1, 0, 0, 14, "ranks_idle", &m));
    k3c_engine_options o;
    engine_opts(&o, 2, 0);
    o.max_requests = 1;
    o.max_context = 16;
    o.rank_timeout_ms = 400;
    k3c_engine *e = NULL;
    int rc = k3c_engine_create(m, &o, &e);
    int32_t prompt[4] = {3, 1, 4, 1}, got[1 + 4] = {0};
    if (rc == K3C_OK) {
        CHECK(k3c_engine_rank(e) == 0 && k3c_engine_world_size(e) == 2 && !k3c_engine_failed(e));
        CHECK(k3c_engine_follow(e) == K3C_ERR && strstr(k3c_error_message(), "leads"));
        struct timespec nap = {1, 200 * 1000000L};
        nanosleep(&nap, NULL);
        rc = k3c_generate(e, prompt, 4, 4, NULL, collect_token, got, NULL);
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", k3c_error_message());
    int failed = k3c_engine_failed(e);
    k3c_engine_free(e);
    k3c_free(m);
    CHECKF(rc == K3C_OK && got[0] == 4 && !failed, "after 1.2 s idle: %s", msg);
}

/* ---- ranks started differently ---- */

typedef struct fp_job {
    k3c_rank rank;
    k3c_engine_options o;
    const k3c_config *c;
    int rc;
    char msg[1024];
} fp_job;

static void *fp_thread(void *p) {
    fp_job *j = p;
    k3c_rank_fingerprint f;
    k3c_rank_fingerprint_fill(&f, j->c, 1234, &j->o, &j->rank);
    int differ = 0;
    j->rc = k3c_rank_fingerprint_check(&j->rank, &f, &differ);
    if (j->rc && !differ) snprintf(j->msg, sizeof j->msg, "not a difference");
    else snprintf(j->msg, sizeof j->msg, "%s", j->rc ? k3c_error_message() : "");
    k3c_rank_release(&j->rank);
    return NULL;
}

TEST(ranks_startup_check_refuses_differences) {
    k3c_config c;
    CHECK_OK(tp_config(0, 0, &c));
    k3c_layout l = {.tp = 3, .pp = 1, .dp = 1, .ep = 1};
    /* the same options on every rank pass; rank 2 with another max_context: all three refuse, naming it */
    for (int round = 0; round < 2; round++) {
        k3c_rank ranks[3];
        fp_job jobs[3];
        pthread_t th[3];
        CHECK_OK(k3c_ranks_threads(&l, 5000, ranks));
        for (int r = 0; r < 3; r++) {
            jobs[r] = (fp_job){.rank = ranks[r], .c = &c};
            engine_opts(&jobs[r].o, 3, 0);
            jobs[r].o.max_context = round && r == 2 ? 512 : 256;
            pthread_create(&th[r], NULL, fp_thread, &jobs[r]);
        }
        for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < 3; r++) {
            if (!round) CHECKF(jobs[r].rc == K3C_OK, "rank %d: %s", r, jobs[r].msg);
            else CHECKF(jobs[r].rc == K3C_ERR && strstr(jobs[r].msg, "rank 2's max_context is 512, rank 0's 256"),
                        "rank %d: %s", r, jobs[r].msg);
        }
    }
    k3c_config_free(&c);
    /* through the engine: rank 1 with another model config, or claiming another rank */
    k3c_model *m;
    CHECK_OK(ranks_model(0, 0, 0, 12, "ranks_fp", &m));
    const int fields[2] = {K3C_FP_CONFIG, K3C_FP_RANK};
    const char *want[2] = {"rank 1's model config (hash)", "the same --rank"};
    for (int i = 0; i < 2; i++) {
        k3c_engine_options o;
        engine_opts(&o, 2, 0);
        k3c_engine *e = NULL;
        k3c_ranks_test_skew(1, fields[i]);
        double t0 = now_s();
        int rc = k3c_engine_create(m, &o, &e);
        k3c_ranks_test_skew(-1, 0);
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", k3c_error_message());
        k3c_engine_free(e);
        if (rc != K3C_ERR || !strstr(msg, want[i]) || now_s() - t0 > 10) {
            k3c_free(m);
            CHECKF(0, "skewed %s: rc %d, message '%s'", k3c_rank_fingerprint_field(fields[i]), rc, msg);
        }
        if (i == 0) printf("    tp 2, rank 1 started with another config: %s\n", msg);
    }
    k3c_free(m);
}

/* ---- what the engine refuses ---- */

TEST(ranks_refused_layouts) {
    k3c_model *m;
    CHECK_OK(ranks_model(0, 0, 0, 13, "ranks_refuse", &m));
    struct {
        int tp, pp, dp, ep, world, rank, spec;
        const char *device, *rdv, *want;
    } cases[] = {
        {1, 64, 1, 1, 0, 0, 0, "cpu", NULL, "more pipeline stages than the model's"},
        {1, 1, 1, 2, 0, 0, 0, "cpu", NULL, "spans the tp x dp = 1 ranks"},
        {1, 1, 2, 3, 0, 0, 0, "cpu", NULL, "spans the tp x dp = 2 ranks"},
        {2, 1, 1, 2, 0, 0, 0, "cpu", NULL, "expert parallelism without data parallelism"},
        {2, 1, 2, 2, 0, 0, 0, "cpu", NULL, "spans the tp x dp = 4 ranks"},
        {3, 1, 1, 1, 0, 0, 0, "cpu", NULL, "does not divide"},
        {2, 1, 1, 1, 4, 0, 0, "cpu", NULL, "world_size 4"},
        {2, 1, 1, 1, 0, 1, 0, "cpu", NULL, "needs world_size"},
        /* threads on cuda are built (runtime/ranks_device.c): here without a GPU (or CUDA) each rank's start fails */
        {2, 1, 1, 1, 0, 0, 0, "cuda", NULL, "failed at start-up"},
        /* and PP, DEP and the hybrid as threads on cuda: a rank that fails before its backend joined the staged
         * world fails that group too, so the others' split of it ends at once */
        {1, 2, 1, 1, 0, 0, 0, "cuda", NULL, "failed at start-up"},
        {1, 1, 2, 2, 0, 0, 0, "cuda", NULL, "failed at start-up"},
        {2, 1, 2, 4, 0, 0, 0, "cuda", NULL, "failed at start-up"},
        {2, 1, 1, 1, 2, 0, 0, "cpu", "/nonexistent/rdv", "device cuda"},
        {2, 1, 1, 1, 0, 0, K3C_SPECIALIZED_ON, "cpu", NULL, "needs device cuda"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        k3c_engine_options o;
        engine_opts(&o, cases[i].tp, 0);
        o.layout.pp = cases[i].pp;
        o.layout.dp = cases[i].dp;
        o.layout.ep = cases[i].ep;
        o.world_size = cases[i].world;
        o.rank = cases[i].rank;
        o.device = cases[i].device;
        o.rendezvous = cases[i].rdv;
        o.specialized = cases[i].spec;
        k3c_engine *e = NULL;
        int rc = k3c_engine_create(m, &o, &e);
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", k3c_error_message());
        k3c_engine_free(e);
        if (rc != K3C_ERR || e || !strstr(msg, cases[i].want)) {
            k3c_free(m);
            CHECKF(0, "case %zu: rc %d, message '%s' (want '%s')", i, rc, msg, cases[i].want);
        }
    }
    /* one process per rank, on device cuda: without NCCL (a CPU build), or on this host without a GPU, it
     * fails at once on every rank, naming what is missing */
    k3c_engine_options o;
    engine_opts(&o, 2, 0);
    o.device = "cuda";
    o.world_size = 2;
    o.rank = 1;
    o.rendezvous = "/nonexistent/rdv";
    o.rank_timeout_ms = 200;
    k3c_engine *e = NULL;
    double t0 = now_s();
    int rc = k3c_engine_create(m, &o, &e);
    double took = now_s() - t0;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", k3c_error_message());
    k3c_free(m);
    CHECKF(rc == K3C_ERR && !e && took < 5 && strstr(msg, "rank 1 of 2"), "multi-process rank 1: %s", msg);
    printf("    --world-size 2 --rank 1 --device cuda here: %s\n", msg);
}

/* ---- the rendezvous file ---- */

static void fill_id(unsigned char id[K3C_RENDEZVOUS_ID_BYTES], uint64_t seed) {
    k3c_rng g;
    k3c_rng_seed(&g, seed);
    for (int i = 0; i < K3C_RENDEZVOUS_ID_BYTES; i++) id[i] = (unsigned char)k3c_rng_next(&g);
}

static int write_raw(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return K3C_ERR;
    int ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok ? K3C_OK : K3C_ERR;
}

static uint64_t wall_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

TEST(ranks_rendezvous_two_processes) {
    char path[4200];
    snprintf(path, sizeof path, "%s/rdv_two", test_tmpdir());
    unlink(path);
    unsigned char id[K3C_RENDEZVOUS_ID_BYTES], got[K3C_RENDEZVOUS_ID_BYTES];
    fill_id(id, test_seed());
    /* rank 0 in another process, 150 ms late; a stale record of an earlier launch there meanwhile */
    k3c_rendezvous_record old;
    unsigned char other[K3C_RENDEZVOUS_ID_BYTES];
    fill_id(other, 99);
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    k3c_rendezvous_record_fill(&old, other, 4, (uint32_t)getpid(), wall_ns() - 30ull * 1000000000ull, host);
    CHECK_OK(write_raw(path, &old, sizeof old));
    fflush(stdout);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        struct timespec nap = {0, 150 * 1000000L};
        nanosleep(&nap, NULL);
        _exit(k3c_rendezvous_publish(path, id, 4) == K3C_OK ? 0 : 1);
    }
    double t0 = now_s();
    int rc = k3c_rendezvous_wait(path, 4, 5000, got);
    double took = now_s() - t0;
    int status = 0;
    waitpid(child, &status, 0);
    CHECKF(rc == K3C_OK, "%s", k3c_error_message());
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(memcmp(id, got, sizeof id) == 0);
    CHECKF(took >= 0.1 && took < 3, "took %.3f s", took);
    /* no temporary file left beside it */
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)child);
    CHECK(access(tmp, F_OK) != 0);
    k3c_rendezvous_remove(path);
    CHECK(access(path, F_OK) != 0);
}

TEST(ranks_rendezvous_refusals) {
    char path[4200];
    snprintf(path, sizeof path, "%s/rdv_bad", test_tmpdir());
    unsigned char id[K3C_RENDEZVOUS_ID_BYTES], got[K3C_RENDEZVOUS_ID_BYTES];
    fill_id(id, 7);
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    /* a child that has exited: its pid names a process that no longer runs */
    pid_t gone = fork();
    CHECK(gone >= 0);
    if (gone == 0) _exit(0);
    waitpid(gone, NULL, 0);
    k3c_rendezvous_record good, r;
    k3c_rendezvous_record_fill(&good, id, 2, (uint32_t)getpid(), wall_ns(), host);
    struct {
        const char *what, *want;
        size_t bytes;
        int world;
    } cases[] = {
        {"none", "no file", 0, 2},
        {"truncated", "truncated: 100 bytes", 100, 2},
        {"corrupt", "checksum", sizeof r, 2},
        {"world", "for a world size of 2, this rank's is 3", sizeof r, 3},
        {"stale by time", "stale: written", sizeof r, 2},
        {"stale by pid", "no longer runs", sizeof r, 2},
        {"not a record", "magic", sizeof r, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unlink(path);
        r = good;
        if (i == 2) r.id[5] ^= 1;
        if (i == 4) k3c_rendezvous_record_fill(&r, id, 2, (uint32_t)getpid(), wall_ns() - 5000000000ull, host);
        if (i == 5) k3c_rendezvous_record_fill(&r, id, 2, (uint32_t)gone, wall_ns(), host);
        if (i == 6) memcpy(r.magic, "NOTK3C!!", 8);
        if (cases[i].bytes) CHECK_OK(write_raw(path, &r, cases[i].bytes));
        double t0 = now_s();
        int rc = k3c_rendezvous_wait(path, cases[i].world, 250, got);
        double took = now_s() - t0;
        CHECKF(rc == K3C_ERR && strstr(k3c_error_message(), cases[i].want) && took >= 0.24 && took < 2,
               "%s: rc %d after %.2f s: %s", cases[i].what, rc, took, k3c_error_message());
        if (i == 1) printf("    a truncated rendezvous file: %s\n", k3c_error_message());
    }
    /* a good record is taken at once */
    k3c_rendezvous_record_fill(&good, id, 2, (uint32_t)getpid(), wall_ns(), host);
    CHECK_OK(write_raw(path, &good, sizeof good));
    CHECK_OK(k3c_rendezvous_wait(path, 2, 250, got));
    CHECK(memcmp(got, id, sizeof id) == 0);
    unlink(path);
    /* failure notes: the earliest names the rank that failed first; publish clears them */
    CHECK_OK(k3c_rendezvous_note_failure(path, 3, 7, "rank 3: out of memory"));
    struct timespec nap = {0, 5 * 1000000L};
    nanosleep(&nap, NULL);
    CHECK_OK(k3c_rendezvous_note_failure(path, 1, 7, "rank 1: the group has failed"));
    int fr = -1;
    long fs = -1;
    char fm[256];
    CHECK(k3c_rendezvous_find_failure(path, 4, &fr, &fs, fm, sizeof fm) == 1);
    CHECKF(fr == 3 && fs == 7 && !strcmp(fm, "rank 3: out of memory"), "rank %d step %ld '%s'", fr, fs, fm);
    CHECK_OK(k3c_rendezvous_publish(path, id, 4));
    CHECK(k3c_rendezvous_find_failure(path, 4, &fr, &fs, fm, sizeof fm) == 0);
    k3c_rendezvous_remove(path);
}
