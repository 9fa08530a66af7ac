/* The serving scheduler on CUDA (runtime/scheduler.c; its CPU tests are tests/test_scheduler.c):
 *  - shared prefix blocks and the KDA snapshot save / restore (device-to-device copies on the backend's
 *    stream) give bitwise the logits of the request that prefilled (tests/snapshot_case.h);
 *  - one request at a time with whole prompts and no prefix caching takes k3c_generate's steps: the same
 *    greedy tokens, decode steps on the specialized executor;
 *  - a batch with chunked prefill, prefix hits, speculation and a cache small enough to preempt finishes
 *    every request to its length, runs decode / verify steps on the executor and ends with every block and
 *    slot free. (bf16 streams batched are not compared with k3c_generate: the stock forward is not batch
 *    invariant yet; the divergences are printed.) */
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "runtime/engine_internal.h"
#include "../snapshot_case.h"
#include "../synth_preset.h"
#include "../test.h"
#include "util/error.h"
#include "util/rng.h"

TEST(gpu_sched_snapshot_restore_bitwise) { snapshot_case("cuda"); }

#define NJ 6
#define NEW 24

typedef struct gjob {
    int32_t prompt[96], out[NEW], ref[NEW];
    int n_prompt, n_out, done;
    k3c_finish_reason why;
    uint64_t id;
} gjob;

static int run_sched(k3c_engine *e, const k3c_scheduler_options *o, gjob *jobs, int n, k3c_scheduler_stats *st) {
    k3c_scheduler *s;
    K3C_TRY(k3c_scheduler_create(e, o, &s));
    int rc = K3C_OK;
    for (int i = 0; i < n && rc == K3C_OK; i++) {
        k3c_sched_request q = {.prompt = jobs[i].prompt, .n_prompt = jobs[i].n_prompt, .max_new = NEW,
                               .ignore_eos = 1, .prefix_hint = 32, .user = &jobs[i]};
        jobs[i].n_out = jobs[i].done = 0;
        if (k3c_scheduler_submit(s, &q, &jobs[i].id) != 0) rc = k3c_errorf("submit %d: %s", i, k3c_last_error());
    }
    int busy = 1, steps = 0;
    while (rc == K3C_OK && busy && steps++ < 10000) {
        const k3c_sched_event *ev;
        int ne;
        rc = k3c_scheduler_step(s, &ev, &ne, &busy);
        for (int i = 0; rc == K3C_OK && i < ne; i++) {
            gjob *j = ev[i].user;
            if (ev[i].kind == K3C_SCHED_TOKEN && j->n_out < NEW) j->out[j->n_out++] = ev[i].token;
            if (ev[i].kind == K3C_SCHED_FINISHED) j->done = 1, j->why = ev[i].finish;
        }
    }
    k3c_scheduler_stats_get(s, st);
    k3c_scheduler_free(s);
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

TEST(gpu_sched_tiny) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gpu-sched-tiny", test_tmpdir());
    CHECK_OK(test_synth_preset("tiny", 0, test_seed() ^ 0x5c, dir));
    k3c_model *m;
    CHECK_OK(k3c_load(dir, &m));
    k3c_engine_options eo;
    k3c_engine_options_default(&eo);
    eo.device = "cuda";
    eo.max_requests = 4;
    eo.max_context = 128;
    eo.num_blocks = 14; /* 224 tokens for 4 requests of up to 109: preemptions */
    /* blocks of 16 / 32 tokens (instead of 64 / 128): the scheduler's prefix grid is then 32, so the shared
     * 32-token system prompt can hit and a budget of 64 tokens cuts prompt chunks */
    eo.chunk_min = 16;
    eo.mla_expand_min = 32;
    k3c_engine *e;
    CHECK_OK(k3c_engine_create(m, &eo, &e));
    int V = k3c_engine_vocab(e);
    static gjob jobs[NJ];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x5d);
    int32_t sys[32];
    for (int t = 0; t < 32; t++) sys[t] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
    for (int i = 0; i < NJ; i++) {
        jobs[i].n_prompt = 40 + 9 * i;
        memcpy(jobs[i].prompt, sys, sizeof sys); /* a shared 32-token system prompt */
        for (int t = 32; t < jobs[i].n_prompt; t++)
            jobs[i].prompt[t] = t % 5 == 0 ? jobs[i].prompt[t - 4] : (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
        collect c = {jobs[i].ref, 0};
        CHECK_OK(k3c_generate(e, jobs[i].prompt, jobs[i].n_prompt, NEW, NULL, collect_token, &c, NULL));
    }
    k3c_scheduler_stats st;
    k3c_scheduler_options o;
    k3c_scheduler_options_default(&o);
    o.max_seqs = 1;
    o.prefix_caching = 0;
    CHECK_OK(run_sched(e, &o, jobs, NJ, &st));
    for (int i = 0; i < NJ; i++) {
        CHECK(jobs[i].done && jobs[i].why == K3C_FINISH_LENGTH && jobs[i].n_out == NEW);
        for (int t = 0; t < NEW; t++)
            CHECKF(jobs[i].out[t] == jobs[i].ref[t], "alone: request %d token %d: %d scheduled, %d generated", i, t,
                   jobs[i].out[t], jobs[i].ref[t]);
    }
    k3c_engine_stats es;
    k3c_engine_stats_get(e, &es);
    CHECK(!es.specialized || st.executor_steps > 0);
    k3c_scheduler_options_default(&o);
    o.max_batched_tokens = 64;
    o.spec_tokens = 3;
    CHECK_OK(run_sched(e, &o, jobs, NJ, &st));
    int parted = 0;
    for (int i = 0; i < NJ; i++) {
        CHECK(jobs[i].done && jobs[i].why == K3C_FINISH_LENGTH && jobs[i].n_out == NEW);
        parted += memcmp(jobs[i].out, jobs[i].ref, sizeof jobs[i].out) != 0;
    }
    printf("  [batched: %ld steps, %ld on the executor, %ld verify; %ld preemptions, %ld prefix-hit tokens; %d of %d "
           "streams part from k3c_generate (bf16, not batch-invariant)]\n", st.steps, st.executor_steps,
           st.route_steps[K3C_ROUTE_VERIFY], st.preemptions, st.prefix_hits_tokens, parted, NJ);
    CHECK(st.preemptions > 0 && st.prefix_hits_tokens > 0);
    CHECK(!es.specialized || st.executor_steps > 0);
    CHECK(st.running == 0 && st.waiting == 0 && st.blocks_used == 0 && st.kda_slots_used == 0);
    CHECK(k3c_engine_blocks_free(e) == 14);
    k3c_engine_free(e);
    k3c_free(m);
}
