/* The serving scheduler keeps batch invariance (include/k3c.h, k3c_engine_prompt_piece; docs/DESIGN.md):
 * with bf16 activations (the default path, not exact_f32) a request's greedy stream is, token for token,
 * k3c_generate's alone on the same model, whatever the scheduler did with it:
 *   - batched beside five other requests under a token budget that is no multiple of any block;
 *   - started from a prefix hit (cached_tokens > 0, at a multiple of the scheduler's grid);
 *   - preempted by recompute (a cache too small for the batch), FCFS and PRIORITY, and resumed: its
 *     generated tokens replayed in pieces that hold no whole block, as decoding held them (one request is
 *     preempted on purpose after 2 C + 8 tokens, so that its replay crosses whole blocks of every form);
 *   - verified with speculation (a repetitive model: drafts accepted), with preemptions and hits.
 * Two models: tiny with the engine's default blocks (KDA 64, MLA expanded 128, MLA cache blocks of 16:
 * prompts past two grids, outputs long enough that a replay crosses whole KDA blocks) and kimi-linear-tiny
 * with blocks of 16 / 32 and cache blocks of 12, which do not divide the grid (hits then sit at 96, the
 * least common multiple). Prompts and weights are fresh every run (test_seed). Each scenario counts the
 * streams that differ from the alone ones (printed) and asserts that none does. A stream is its tokens and
 * each token's logprob (sampling.logprobs = 1: the log-softmax of its logits row), so a row that is off by
 * one bit anywhere counts even where the greedy token survives it; the alone logprobs come from the same
 * requests through the scheduler one at a time without prefix caching (whose tokens must be
 * k3c_generate's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "damp_residual.h"
#include "k3c.h"
#include "runtime/engine_internal.h"
#include "synth_preset.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

#define SI_REQ 6
#define SI_MAXNEW 160
#define SI_MAXPROMPT 640

typedef struct si_case {
    const char *preset;
    int chunk_min, mla_expand_min, block_size; /* the engine's options (0: defaults) */
    int C, G, L;   /* the smallest block, k3c_engine_prompt_grid and the scheduler's grid: lcm(block_size, G) */
    int max_new;
} si_case;

static const si_case si_cases[] = {
    {"tiny", 0, 0, 16, 64, 128, 128, 80},
    {"kimi-linear-tiny", 16, 32, 12, 16, 32, 96, 40},
};

typedef struct si_job {
    int32_t prompt[SI_MAXPROMPT];
    int n_prompt, max_new, priority, hint;
    int32_t ref[SI_MAXNEW], out[SI_MAXNEW];
    float ref_lp[SI_MAXNEW], out_lp[SI_MAXNEW];
    int n_out, finished, cached, preemptions;
    k3c_finish_reason why;
    uint64_t id;
} si_job;

typedef struct si_env {
    const si_case *c;
    char dir[512];
    k3c_model *m;
    si_job jobs[SI_REQ];
    int V, S; /* vocabulary; the shared system prompt's length */
} si_env;

static int si_engine(si_env *env, int num_blocks, k3c_engine **e) {
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 2;
    o.max_requests = SI_REQ;
    o.max_rows = 256;
    o.max_context = SI_MAXPROMPT + SI_MAXNEW + 8;
    o.block_size = env->c->block_size;
    o.num_blocks = num_blocks;
    o.q_max = 4;
    o.chunk_min = env->c->chunk_min;
    o.mla_expand_min = env->c->mla_expand_min;
    return k3c_engine_create(env->m, &o, e);
}

/* The model (damp > 0: made repetitive, tests/damp_residual.h) and six prompts: three share a system prompt
 * of 2 L + 3 L / 8 tokens (not on the grid: the hits must snap down to it) and go on for 5, L and L / 2 + 7
 * tokens; a prompt of L + 13 random tokens, one of G / 2 + 1 (no whole grid block), one of 9. The tails of
 * the repetitive model's prompts repeat a short phrase, so that the drafter finds matches. */
static int si_open(si_env *env, const si_case *c, float damp, uint64_t seed) {
    memset(env, 0, sizeof *env);
    env->c = c;
    snprintf(env->dir, sizeof env->dir, "%s/sched-inv-%s%s", test_tmpdir(), c->preset, damp > 0 ? "-damped" : "");
    K3C_TRY(test_synth_preset(c->preset, 0, seed, env->dir));
    if (damp > 0) K3C_TRY(damp_residual_writes_in(env->dir, damp));
    K3C_TRY(k3c_load(env->dir, &env->m));
    k3c_model_info info;
    K3C_TRY(k3c_model_info_get(env->m, &info));
    env->V = info.vocab_size;
    env->S = 2 * c->L + 3 * c->L / 8;
    k3c_rng r;
    k3c_rng_seed(&r, seed ^ 0x5c4ed);
    int32_t sys[SI_MAXPROMPT];
    for (int t = 0; t < env->S; t++) sys[t] = (int32_t)(k3c_rng_next(&r) % (uint64_t)env->V);
    const int lens[SI_REQ] = {env->S + 5, env->S + c->L, c->L + 13, env->S + c->L / 2 + 7, c->G / 2 + 1, 9};
    for (int i = 0; i < SI_REQ; i++) {
        si_job *j = &env->jobs[i];
        j->n_prompt = lens[i];
        j->max_new = i == 5 ? c->max_new / 2 : c->max_new;
        int shared = i == 0 || i == 1 || i == 3 ? env->S : 0, period = 3 + i;
        for (int t = 0; t < j->n_prompt; t++)
            j->prompt[t] = t < shared ? sys[t]
                         : damp > 0 && t >= shared + period ? j->prompt[t - period]
                                                           : (int32_t)(k3c_rng_next(&r) % (uint64_t)env->V);
    }
    return K3C_OK;
}

typedef struct si_collect {
    int32_t *t;
    int n;
} si_collect;
static int si_collect_token(void *u, int32_t tok) {
    si_collect *c = u;
    c->t[c->n++] = tok;
    return 0;
}

static int si_submit(k3c_scheduler *s, si_job *j);
static int si_drain(k3c_scheduler *s);

/* The references of jobs[which]: greedy tokens from k3c_generate alone, and their logprobs from the
 * scheduler one request at a time without prefix caching (its tokens checked against k3c_generate's). */
static int si_reference(si_env *env, k3c_engine *e, unsigned which) {
    k3c_scheduler_options o;
    k3c_scheduler_options_default(&o);
    o.max_seqs = 1;
    o.prefix_caching = 0;
    k3c_scheduler *s;
    K3C_TRY(k3c_scheduler_create(e, &o, &s));
    int rc = K3C_OK;
    for (int i = 0; i < SI_REQ && rc == K3C_OK; i++) {
        si_job *j = &env->jobs[i];
        if (!(which >> i & 1)) continue;
        si_collect col = {j->ref, 0};
        j->priority = j->hint = 0;
        rc = k3c_generate(e, j->prompt, j->n_prompt, j->max_new, NULL, si_collect_token, &col, NULL);
        if (rc == K3C_OK && col.n != j->max_new)
            rc = k3c_errorf("request %d alone: %d tokens of %d", i, col.n, j->max_new);
        if (rc == K3C_OK) rc = si_submit(s, j);
        if (rc == K3C_OK) rc = si_drain(s);
        if (rc == K3C_OK && (j->n_out != j->max_new || memcmp(j->out, j->ref, sizeof(int32_t) * (size_t)j->n_out)))
            rc = k3c_errorf("request %d alone through the scheduler: not k3c_generate's tokens", i);
        memcpy(j->ref_lp, j->out_lp, sizeof(float) * (size_t)j->n_out);
    }
    k3c_scheduler_free(s);
    return rc;
}

static int si_submit(k3c_scheduler *s, si_job *j) {
    k3c_sched_request q = {.prompt = j->prompt, .n_prompt = j->n_prompt, .max_new = j->max_new, .ignore_eos = 1,
                           .priority = j->priority, .prefix_hint = j->hint, .user = j};
    q.sampling.logprobs = 1;
    j->n_out = j->finished = j->cached = j->preemptions = 0;
    int rc = k3c_scheduler_submit(s, &q, &j->id);
    return rc == 0 ? K3C_OK : k3c_errorf("submit: %d (%s)", rc, k3c_error_message());
}

static int si_drain(k3c_scheduler *s) {
    int busy = 1;
    for (int k = 0; busy; k++) {
        const k3c_sched_event *ev;
        int n;
        K3C_TRY(k3c_scheduler_step(s, &ev, &n, &busy));
        for (int i = 0; i < n; i++) {
            si_job *j = ev[i].user;
            if (j->finished) return k3c_errorf("an event after FINISHED");
            if (ev[i].kind == K3C_SCHED_TOKEN) {
                if (j->n_out >= j->max_new) return k3c_errorf("more than %d tokens", j->max_new);
                j->out_lp[j->n_out] = ev[i].logprob;
                j->out[j->n_out++] = ev[i].token;
            } else {
                j->finished = 1;
                j->why = ev[i].finish;
                j->cached = ev[i].cached_tokens;
                j->preemptions = ev[i].preemptions;
            }
        }
        if (k > 50000) return k3c_errorf("still busy after %d steps", k);
    }
    return K3C_OK;
}

/* Streams of jobs[which] that are not their reference (every one must have finished by its length). */
static int si_differ(const si_env *env, unsigned which, int *differ) {
    *differ = 0;
    for (int i = 0; i < SI_REQ; i++) {
        const si_job *j = &env->jobs[i];
        if (!(which >> i & 1)) continue;
        if (!j->finished || j->why != K3C_FINISH_LENGTH || j->n_out != j->max_new)
            return k3c_errorf("request %d: finished %d, reason %d, %d tokens of %d", i, j->finished, j->why, j->n_out,
                              j->max_new);
        int t = 0;
        while (t < j->n_out && j->out[t] == j->ref[t] && !memcmp(&j->out_lp[t], &j->ref_lp[t], sizeof(float))) t++;
        if (t < j->n_out) {
            printf("  [request %d (%d prompt tokens, %d cached, %d preemptions) parts from k3c_generate at token %d]\n",
                   i, j->n_prompt, j->cached, j->preemptions, t);
            (*differ)++;
        }
    }
    return K3C_OK;
}

static int si_idle(k3c_scheduler *s, k3c_engine *e) {
    k3c_scheduler_stats st;
    k3c_scheduler_stats_get(s, &st);
    if (st.running || st.waiting || st.blocks_used || st.kda_slots_used ||
        k3c_engine_slots_free(e) != k3c_engine_max_requests(e))
        return k3c_errorf("not idle: running %d, waiting %d, blocks used %d, slots used %d", st.running, st.waiting,
                          st.blocks_used, st.kda_slots_used);
    return K3C_OK;
}

typedef struct si_run {
    const char *what;
    int max_seqs, budget, spec, policy, prefix_caching;
} si_run;

/* All jobs at once under run's options; the differing streams are counted, the stats returned. */
static int si_batch(si_env *env, k3c_engine *e, const si_run *run, k3c_scheduler_stats *st, int *differ) {
    k3c_scheduler_options o;
    k3c_scheduler_options_default(&o);
    o.max_seqs = run->max_seqs;
    o.max_batched_tokens = run->budget;
    o.spec_tokens = run->spec;
    o.policy = run->policy;
    o.prefix_caching = run->prefix_caching;
    k3c_scheduler *s;
    K3C_TRY(k3c_scheduler_create(e, &o, &s));
    int rc = K3C_OK;
    for (int i = 0; i < SI_REQ && rc == K3C_OK; i++) {
        env->jobs[i].priority = run->policy == K3C_SCHED_PRIORITY ? (i * 2) % 3 : 0;
        env->jobs[i].hint = 0;
        rc = si_submit(s, &env->jobs[i]);
    }
    if (rc == K3C_OK) rc = si_drain(s);
    if (rc == K3C_OK) rc = si_idle(s, e);
    k3c_scheduler_stats_get(s, st);
    k3c_scheduler_free(s);
    K3C_TRY(rc);
    K3C_TRY(si_differ(env, (1u << SI_REQ) - 1, differ));
    printf("  [%s: %d of %d streams differ; %ld preemptions, %ld prefix-hit tokens, %ld of %ld drafts accepted]\n",
           run->what, *differ, SI_REQ, st->preemptions, st->prefix_hits_tokens, st->spec_accepted_tokens,
           st->spec_draft_tokens);
    return K3C_OK;
}

/* Blocks that hold the longest job alone with room to spare, but not the batch: the scheduler preempts. */
static int si_tight_blocks(const si_env *env) {
    int need = 0, bs = env->c->block_size;
    for (int i = 0; i < SI_REQ; i++) {
        int b = (env->jobs[i].n_prompt + env->jobs[i].max_new + bs - 1) / bs;
        need = b > need ? b : need;
    }
    return need + need / 2;
}

static void si_case_run(const si_case *c) {
    static si_env env;
    CHECK_OK(si_open(&env, c, 0, test_seed() ^ 0x51));
    k3c_engine *e, *tight;
    CHECK_OK(si_engine(&env, 0, &e));
    CHECKF(k3c_engine_prompt_grid(e) == c->G, "%s: prompt grid %d, want %d", c->preset, k3c_engine_prompt_grid(e), c->G);
    CHECK_OK(si_reference(&env, e, (1u << SI_REQ) - 1));
    k3c_scheduler_stats st;
    int differ;

    /* batched: every request at once, 1.5 grids + 5 tokens a step (prompts in several chunks beside decodes) */
    si_run batch = {"batch", SI_REQ, c->G + c->G / 2 + 5, 0, K3C_SCHED_FCFS, 1};
    CHECK_OK(si_batch(&env, e, &batch, &st, &differ));
    CHECK(differ == 0 && st.preemptions == 0);
    batch.what = "batch, no prefix caching", batch.prefix_caching = 0, batch.budget = c->G + 3;
    CHECK_OK(si_batch(&env, e, &batch, &st, &differ));
    CHECK(differ == 0);

    /* prefix hits: the sharing requests one after another (0 names its system prompt as a hint); each later
     * one starts at the grid boundary below the system prompt, 2 L, where the first left its snapshot */
    {
        k3c_scheduler_options o;
        k3c_scheduler_options_default(&o);
        o.max_batched_tokens = 2 * c->G + 7;
        k3c_scheduler *s;
        CHECK_OK(k3c_scheduler_create(e, &o, &s));
        static const int order[5] = {0, 1, 3, 0, 1}; /* and 0 and 1 again: the whole canonical prefix */
        int rc = K3C_OK, hits = 0;
        for (int k = 0; k < 5 && rc == K3C_OK; k++) {
            si_job *j = &env.jobs[order[k]];
            j->priority = 0;
            j->hint = k == 0 ? env.S : 0;
            rc = si_submit(s, j);
            if (rc == K3C_OK) rc = si_drain(s);
            if (rc == K3C_OK) rc = si_differ(&env, 1u << order[k], &differ);
            /* independent of the code: the grid boundaries below both the shared tokens and the last whole
             * prompt grid block of the request (rows past it are not computed in block form) */
            int shared = k == 0 ? 0 : k < 3 ? env.S : j->n_prompt - 1;
            int canon = j->n_prompt / c->G * c->G, want = (shared < canon ? shared : canon) / c->L * c->L;
            if (rc == K3C_OK && (j->cached != want || differ))
                rc = k3c_errorf("%s, hit %d (request %d): cached_tokens %d, want %d; %d streams differ", c->preset, k,
                                order[k], j->cached, want, differ);
            hits += j->cached > 0;
        }
        if (rc == K3C_OK) rc = si_idle(s, e);
        k3c_scheduler_stats_get(s, &st);
        k3c_scheduler_free(s);
        CHECK_OK(rc);
        printf("  [prefix hits: %d of 4 later requests hit, %ld tokens]\n", hits, st.prefix_hits_tokens);
        CHECK(hits == 4 && st.prefix_hits_tokens > 0);
        CHECKF(st.prefix_grid == c->L && st.block_size == c->block_size, "prefix grid %d, block %d", st.prefix_grid,
               st.block_size);
    }
    k3c_engine_free(e);

    /* preemption by recompute: a cache that holds the longest request alone, not the batch */
    CHECK_OK(si_engine(&env, si_tight_blocks(&env), &tight));
    si_run pre = {"preemption, fcfs", SI_REQ, c->G + c->G / 2 + 5, 0, K3C_SCHED_FCFS, 1};
    CHECK_OK(si_batch(&env, tight, &pre, &st, &differ));
    CHECK(differ == 0 && st.preemptions > 0);
    pre.what = "preemption, priority", pre.policy = K3C_SCHED_PRIORITY, pre.budget = 2 * c->G;
    CHECK_OK(si_batch(&env, tight, &pre, &st, &differ));
    CHECK(differ == 0 && st.preemptions > 0);
    k3c_engine_free(tight);

    /* a late preemption: request 5 (9 prompt tokens, priority 1) alone until it has generated 2 C + 8 tokens,
     * then request 1 (priority 0, a long prompt and 8 new tokens) in a cache that holds request 1 alone: 5 is
     * the victim, and its replay of 2 C + 8 generated tokens crosses whole blocks */
    {
        si_job *a = &env.jobs[1], *b = &env.jobs[5];
        int t0 = 2 * c->C + 8, bs = c->block_size;
        a->max_new = 8;
        b->max_new = t0 + 16;
        CHECK(b->max_new <= SI_MAXNEW);
        CHECK_OK(si_engine(&env, (a->n_prompt + a->max_new + bs - 1) / bs, &tight));
        CHECK_OK(si_reference(&env, tight, 1u << 5));
        k3c_scheduler_options o;
        k3c_scheduler_options_default(&o);
        o.policy = K3C_SCHED_PRIORITY;
        o.max_batched_tokens = c->G + c->G / 2 + 5;
        k3c_scheduler *s;
        CHECK_OK(k3c_scheduler_create(tight, &o, &s));
        b->priority = 1, b->hint = 0, a->priority = 0, a->hint = 0;
        int rc = si_submit(s, b), busy = 1;
        while (rc == K3C_OK && b->n_out < t0) {
            const k3c_sched_event *ev;
            int n;
            rc = k3c_scheduler_step(s, &ev, &n, &busy);
            for (int i = 0; i < n && rc == K3C_OK; i++)
                if (ev[i].kind == K3C_SCHED_TOKEN) b->out[b->n_out++] = ev[i].token;
                else rc = k3c_errorf("request 5 finished after %d tokens", b->n_out);
        }
        if (rc == K3C_OK) rc = si_submit(s, a);
        if (rc == K3C_OK) rc = si_drain(s);
        if (rc == K3C_OK) rc = si_idle(s, tight);
        k3c_scheduler_free(s);
        k3c_engine_free(tight);
        CHECK_OK(rc);
        CHECK_OK(si_differ(&env, 1u << 1 | 1u << 5, &differ));
        printf("  [late preemption: request 5 preempted %d times after %d tokens; %d of 2 streams differ]\n",
               b->preemptions, t0, differ);
        CHECK(differ == 0 && b->preemptions > 0);
    }
    k3c_free(env.m);

    /* speculation (3 drafts) on the repetitive model, with preemptions and prefix caching */
    CHECK_OK(si_open(&env, c, 0.05f, test_seed() ^ 0x52));
    for (int i = 0; i < SI_REQ; i++) env.jobs[i].max_new = i == 5 ? SI_MAXNEW / 4 : SI_MAXNEW / 2; /* loops form */
    CHECK_OK(si_engine(&env, si_tight_blocks(&env), &tight));
    CHECK_OK(si_reference(&env, tight, (1u << SI_REQ) - 1));
    si_run spec = {"speculation", SI_REQ, c->G + c->G / 2 + 5, 3, K3C_SCHED_FCFS, 1};
    CHECK_OK(si_batch(&env, tight, &spec, &st, &differ));
    CHECK(differ == 0 && st.spec_accepted_tokens > 0 && st.route_steps[K3C_ROUTE_VERIFY] > 0);
    k3c_engine_free(tight);
    k3c_free(env.m);
}

TEST(sched_invariance_tiny) { si_case_run(&si_cases[0]); }
TEST(sched_invariance_kimi_linear) { si_case_run(&si_cases[1]); }
