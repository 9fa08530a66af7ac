/* Pipeline parallelism and DP attention + EP MoE (DEP) in the stock forward, on CPU ranks (one thread each,
 * the in-memory communicator), against world size 1 running the same requests: a prefill of every request
 * (one whole chunked KDA block among the rows) and greedy decode steps, on tiny K3 (MXFP4 experts, AttnRes)
 * and tiny Kimi Linear, with bf16 and with f32 activations.
 *
 * What the test holds them to (stock/forward.c, "Parallel ranks"): a PP stage computes exactly its layers'
 * function on bitwise copies of what the stage before computed, and a DEP rank's MoE sums its tokens' expert
 * outputs in the router's order whichever rank computed them, so both are bitwise world size 1, in bf16 as in
 * f32 (logits, every prompt and decode row; greedy streams). PP x TP is bitwise TP at the same tp, which is
 * itself within tolerance of world size 1 (tests/test_tp.c). And the failure contract: a rank that fails
 * mid-step (an abort, or a rank that silently stops) fails every other rank's step within the timeout. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "comm/comm.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/shard.h"
#include "model/synth.h"
#include "stock/forward.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"
#include "tp_config.h"


static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- a communicator that fails (tests only) ---- */

/* Forwards to inner until `left` calls have been made; the next one fails: it aborts the group first, or
 * (hang_ms > 0) it hangs that long without calling the peers, as a rank that is stuck or gone, and then fails
 * without telling anyone (its peers must time out on their own). */
typedef struct faulty {
    k3c_comm c;
    k3c_comm *inner;
    int left, hang_ms, dead;
} faulty;

static int fault_now(k3c_comm *c) {
    faulty *x = (faulty *)c;
    if (x->dead) return 1;
    if (x->left-- > 0) return 0;
    x->dead = 1;
    if (x->hang_ms > 0) {
        struct timespec t = {x->hang_ms / 1000, (long)(x->hang_ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
    } else {
        x->inner->abort(x->inner);
    }
    k3c_errorf("faulty comm: rank %d gives up (injected)", c->rank);
    return 1;
}
#define FWD(call) (fault_now(c) ? K3C_ERR : (call))
static int f_all_reduce(k3c_comm *c, float *b, size_t n) { return FWD(((faulty *)c)->inner->all_reduce_f32(((faulty *)c)->inner, b, n)); }
static int f_all_gather(k3c_comm *c, const void *s, void *d, size_t n) { return FWD(((faulty *)c)->inner->all_gather(((faulty *)c)->inner, s, d, n)); }
static int f_broadcast(k3c_comm *c, void *b, size_t n, int root) { return FWD(((faulty *)c)->inner->broadcast(((faulty *)c)->inner, b, n, root)); }
static int f_barrier(k3c_comm *c) { return FWD(((faulty *)c)->inner->barrier(((faulty *)c)->inner)); }
static int f_send(k3c_comm *c, const void *b, size_t n, int p) { return FWD(((faulty *)c)->inner->send(((faulty *)c)->inner, b, n, p)); }
static int f_recv(k3c_comm *c, void *b, size_t n, int p) { return FWD(((faulty *)c)->inner->recv(((faulty *)c)->inner, b, n, p)); }
static int f_all_to_all(k3c_comm *c, const void *s, const size_t *sb, void *r, const size_t *rb) {
    return FWD(((faulty *)c)->inner->all_to_all(((faulty *)c)->inner, s, sb, r, rb));
}
static int f_split(k3c_comm *c, int color, int key, k3c_comm **out) { *out = NULL; return k3c_errorf("faulty: no split"); }
static void f_abort(k3c_comm *c) {
    faulty *x = (faulty *)c;
    x->inner->abort(x->inner);
}
static void f_free(k3c_comm *c) {
    faulty *x = (faulty *)c;
    x->inner->free(x->inner);
    free(x);
}

static k3c_comm *faulty_wrap(k3c_comm *inner, int left, int hang_ms) {
    faulty *x = calloc(1, sizeof *x);
    x->c = (k3c_comm){.name = "threads", .rank = inner->rank, .size = inner->size, .ctx = NULL,
                      .all_reduce_f32 = f_all_reduce, .all_gather = f_all_gather, .broadcast = f_broadcast,
                      .barrier = f_barrier, .abort = f_abort, .free = f_free, .send = f_send, .recv = f_recv,
                      .all_to_all = f_all_to_all, .split = f_split};
    x->inner = inner;
    x->left = left;
    x->hang_ms = hang_ms;
    return &x->c;
}

/* ---- one rank's run ---- */

enum { MAXREQ = 3 };

typedef struct req_spec {
    const int32_t *prompt;
    int n_prompt, n_new;
} req_spec;

typedef struct prun {
    const k3c_model *m; /* the rank's shard (or the whole model) */
    k3c_comm *tp, *pp, *ep;
    int exact;
    int nreq;
    req_spec req[MAXREQ];
    int steps; /* decode steps after the prefill step: every rank of a world runs as many */
    int max_rows; /* the forward's (0: the rank's prompt rows); DEP ranks need the same */
    int bad_route; /* > 0: the backend's moe_route call of that number hands back -1s (a failed device route) */
    /* 1: every step runs with an attention override (stock/forward.h k3c_forward_step_attn) that writes A = 0
     * and counts its calls (zero_attn below); attn_fail_step >= 0: it fails at that step's second layer */
    int zero_attn, attn_fail_step;
    long attn_begins, attn_runs, attn_bad;
    int V;     /* the full vocabulary */
    /* out, per request: every prompt row's logits, the logits each greedy token was taken from, the tokens */
    float *prompt_logits[MAXREQ], *step_logits[MAXREQ];
    int32_t *stream[MAXREQ];
    int last;  /* this rank has the logits (the last stage) */
    int rc;
    int fail_step;  /* the step that failed, -1 none */
    double fail_s;  /* how long it took to fail */
    char err[512];
} prun;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* A backend's moe_route that fails at its bad_route_left-th call as the CUDA backend's does (every idx -1;
 * the forward must refuse it and fail its peers). One rank of a test at a time uses it. */
static int bad_route_left, bad_route_k;
static void (*route_inner)(k3c_backend *, const k3c_moe_weights *, const float *, int, int *, float *, float *);
static void bad_route(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, int *idx, float *wts,
                      float *z) {
    route_inner(be, w, y, T, idx, wts, z);
    if (--bad_route_left == 0)
        for (int i = 0; i < T * bad_route_k; i++) idx[i] = -1;
}

/* The attention override of the zero_attn runs: A = 0 (host memory on the cpu backend), the layers asked in
 * order [l0, l1) once per step with rows (begin first, with the step's row count), none on a dummy step. */
typedef struct zero_attn {
    prun *r;
    int D, l0, l1, next, T, step;
} zero_attn;

static int zero_begin(void *ctx, const k3c_fwd_req *reqs, int nreq, int T) {
    zero_attn *z = ctx;
    int rows = 0;
    for (int i = 0; i < nreq; i++) rows += reqs[i].n;
    z->r->attn_begins++;
    z->r->attn_bad += rows != T || T <= 0 || z->next != z->l1;
    z->next = z->l0;
    z->T = T;
    return K3C_OK;
}

static int zero_run(void *ctx, int layer, const float *x, float *A, int T) {
    zero_attn *z = ctx;
    z->r->attn_runs++;
    z->r->attn_bad += layer != z->next || T != z->T || !x || !A;
    z->next = layer + 1;
    if (z->step == z->r->attn_fail_step && layer == z->l0 + 1)
        return k3c_errorf("zero attention: rank gives up at layer %d (injected)", layer);
    memset(A, 0, sizeof(float) * (size_t)T * z->D);
    return K3C_OK;
}

static int run_rank(prun *r) {
    const k3c_config *c = &r->m->config;
    int V = r->V, bs = 16, rows = 0, ctx = 0;
    for (int i = 0; i < r->nreq; i++) {
        rows += r->req[i].n_prompt;
        if (r->req[i].n_prompt + r->req[i].n_new > ctx) ctx = r->req[i].n_prompt + r->req[i].n_new;
    }
    int per = (ctx + bs - 1) / bs;
    k3c_backend *be = k3c_backend_cpu_create(1);
    if (!be) return K3C_ERR;
    k3c_backend_cpu_set_exact(be, r->exact);
    if (r->bad_route > 0) {
        bad_route_left = r->bad_route;
        bad_route_k = c->num_experts_per_token;
        route_inner = be->moe_route;
        be->moe_route = bad_route;
    }
    k3c_forward_options o = {.max_rows = r->max_rows > 0 ? r->max_rows : rows > 0 ? rows : 1, .max_segs = MAXREQ, .max_context = ctx + 1,
                             .block_size = bs, .tp = r->tp, .pp = r->pp, .ep = r->ep};
    k3c_forward *f = NULL;
    k3c_kv_cache kv = {0};
    k3c_kda_slots ks = {0};
    int l0, l1;
    k3c_model_stage_layers(r->m, &l0, &l1);
    r->last = l1 == c->num_layers;
    int32_t table[MAXREQ][64], tok[MAXREQ];
    float *lg = malloc((size_t)(rows > 0 ? rows : 1) * V * sizeof(float));
    int rc = lg ? k3c_forward_create(be, r->m, &o, &f) : K3C_ERR;
    if (rc == K3C_OK) rc = k3c_kv_cache_init_layers(&kv, be, c, l0, l1, MAXREQ * per + 1, bs);
    if (rc == K3C_OK) rc = k3c_kda_slots_init_layers(&ks, be, c, l0, l1, MAXREQ, 1, MAXREQ);
    r->fail_step = -1;
    zero_attn za = {.r = r, .D = c->hidden_size, .l0 = l0, .l1 = l1, .next = l1};
    k3c_forward_attention attn = {.ctx = &za, .begin = zero_begin, .run = zero_run};
    for (int i = 0; i < r->nreq && rc == K3C_OK; i++) {
        k3c_kda_slots_reset(&ks, be, i);
        for (int b = 0; b < per; b++) table[i][b] = k3c_kv_cache_take(&kv);
    }
    for (int s = 0; s <= r->steps && rc == K3C_OK; s++) {
        k3c_fwd_req q[MAXREQ];
        int nq = 0, who[MAXREQ];
        for (int i = 0; i < r->nreq; i++) {
            const req_spec *p = &r->req[i];
            if (s == 0) q[nq] = (k3c_fwd_req){.ids = p->prompt, .n = p->n_prompt, .pos = 0, .block_table = table[i],
                                              .slot = i, .logits = K3C_LOGITS_ALL};
            else if (s <= p->n_new) q[nq] = (k3c_fwd_req){.ids = &tok[i], .n = 1, .pos = p->n_prompt + s - 1,
                                                           .block_table = table[i], .slot = i, .logits = K3C_LOGITS_LAST};
            else continue;
            if (s > 0) r->stream[i][s - 1] = tok[i];
            who[nq++] = i;
        }
        double t0 = now_s();
        za.step = s;
        /* nq = 0: a DEP rank's dummy step */
        rc = r->zero_attn ? k3c_forward_step_attn(f, &kv, &ks, q, nq, lg, NULL, &attn)
                          : k3c_forward_step(f, &kv, &ks, q, nq, lg, NULL);
        if (rc != K3C_OK) {
            r->fail_step = s;
            r->fail_s = now_s() - t0;
            break;
        }
        size_t at = 0;
        for (int k = 0; k < nq && r->last; k++) {
            int i = who[k], n = s == 0 ? r->req[i].n_prompt : 1;
            float *dst = s == 0 ? r->prompt_logits[i] : r->step_logits[i] + (size_t)(s - 1) * V;
            memcpy(dst, lg + at * V, (size_t)n * V * sizeof(float));
            tok[i] = argmax(lg + (at + n - 1) * V, V);
            at += n;
        }
        /* the sampled tokens reach every stage (the engine's part: rank 0 leads the step) */
        if (r->pp && r->nreq > 0) {
            t0 = now_s();
            rc = r->pp->broadcast(r->pp, tok, sizeof(int32_t) * r->nreq, r->pp->size - 1);
            if (rc != K3C_OK) {
                r->fail_step = s;
                r->fail_s = now_s() - t0;
            }
        }
    }
    if (rc != K3C_OK) snprintf(r->err, sizeof r->err, "%s", k3c_error_message());
    free(lg);
    k3c_kda_slots_release(&ks, be);
    k3c_kv_cache_release(&kv, be);
    k3c_forward_free(f);
    be->destroy(be);
    return rc;
}

static void *rank_thread(void *p) {
    prun *r = p;
    r->rc = run_rank(r);
    return NULL;
}

static int alloc_run(prun *r) {
    for (int i = 0; i < r->nreq; i++) {
        size_t np = (size_t)r->req[i].n_prompt * r->V, nn = (size_t)(r->req[i].n_new > 0 ? r->req[i].n_new : 1) * r->V;
        r->prompt_logits[i] = malloc(np * sizeof(float));
        r->step_logits[i] = malloc(nn * sizeof(float));
        r->stream[i] = calloc((size_t)(r->req[i].n_new > 0 ? r->req[i].n_new : 1), sizeof(int32_t));
        if (!r->prompt_logits[i] || !r->step_logits[i] || !r->stream[i]) return K3C_ERR;
        poison_f32(r->prompt_logits[i], np);
        poison_f32(r->step_logits[i], nn);
    }
    return K3C_OK;
}

static void free_run(prun *r) {
    for (int i = 0; i < r->nreq; i++) free(r->prompt_logits[i]), free(r->step_logits[i]), free(r->stream[i]);
}

/* Worst row's relative L2 between two runs' request i (prompt rows and decode rows); NaN: inf. */
static double worst(const prun *a, const prun *b, int i) {
    double w = 0;
    int V = a->V;
    for (int t = 0; t < a->req[i].n_prompt; t++) {
        double d = rel_l2_f32f32(a->prompt_logits[i] + (size_t)t * V, b->prompt_logits[i] + (size_t)t * V, V);
        if (!(d <= w)) w = d;
    }
    for (int t = 0; t < a->req[i].n_new; t++) {
        double d = rel_l2_f32f32(a->step_logits[i] + (size_t)t * V, b->step_logits[i] + (size_t)t * V, V);
        if (!(d <= w)) w = d;
    }
    return w;
}

static int same_bits(const prun *a, const prun *b, int i) {
    size_t V = a->V;
    return memcmp(a->prompt_logits[i], b->prompt_logits[i], a->req[i].n_prompt * V * 4) == 0 &&
           memcmp(a->step_logits[i], b->step_logits[i], a->req[i].n_new * V * 4) == 0 &&
           memcmp(a->stream[i], b->stream[i], a->req[i].n_new * 4) == 0;
}

/* ---- fixtures ---- */

typedef struct fixture {
    k3c_model *m;
    int V;
    int32_t prompts[MAXREQ + 1][80];
} fixture;

static int fixture_make(int kimi_linear, uint64_t seed, fixture *fx) {
    fx->m = NULL;
    k3c_config c;
    K3C_TRY(tp_config(kimi_linear, 0, &c));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/ppep_%s", test_tmpdir(), kimi_linear ? "kimi_linear" : "k3");
    int rc = k3c_synth_write(&c, NULL, seed, dir);
    fx->V = c.vocab_size;
    k3c_config_free(&c);
    K3C_TRY(rc);
    K3C_TRY(k3c_model_load(dir, &fx->m));
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x9e9);
    for (int i = 0; i <= MAXREQ; i++)
        for (int t = 0; t < 80; t++) fx->prompts[i][t] = (int32_t)(k3c_rng_next(&g) % (uint64_t)fx->V);
    return K3C_OK;
}

/* One fixture per model for every test of this file (synthesizing the checkpoint is most of a test's time),
 * from the run's fresh seed; kept until the process ends. */
static const fixture *fixture_get(int kimi_linear) {
    static fixture fx[2];
    static int made[2];
    if (!made[kimi_linear]) {
        if (fixture_make(kimi_linear, test_seed() + (uint64_t)kimi_linear, &fx[kimi_linear]) != K3C_OK) return NULL;
        made[kimi_linear] = 1;
    }
    return &fx[kimi_linear];
}

/* Runs n ranks in threads; rc of the first failing one (its message in its err). */
static void run_ranks(prun *r, int n) {
    pthread_t th[8];
    for (int k = 0; k < n; k++) pthread_create(&th[k], NULL, rank_thread, &r[k]);
    for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
}

/* The requests of a PP test: a 70-token prompt (a whole chunked KDA block of 64 and 6 recurrent rows) and a
 * 23-token one, 6 decode steps each. */
static void pp_requests(const fixture *fx, prun *r) {
    r->nreq = 2;
    r->req[0] = (req_spec){fx->prompts[0], 70, 6};
    r->req[1] = (req_spec){fx->prompts[1], 23, 6};
    r->steps = 6;
}

/* ---- pipeline parallel ---- */

/* A world rank's groups: the split is a collective, so one thread per rank. */
typedef struct split_job {
    k3c_comm *w;
    int tp, pp, dp, ep;
    k3c_comm_groups g;
    int rc;
    char err[300];
} split_job;

static void *split_thread(void *p) {
    split_job *j = p;
    j->rc = k3c_comm_groups_split(j->w, j->tp, j->pp, j->dp, j->ep, &j->g);
    if (j->rc != K3C_OK) snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
    return NULL;
}

/* A world of tp x pp x dp ranks split into its groups (timeout_ms for every wait). */
static int make_world(int tp, int pp, int dp, int ep, int timeout_ms, split_job *sj) {
    int n = tp * pp * dp;
    k3c_comm_group *grp;
    K3C_TRY(k3c_comm_group_create(n, timeout_ms, &grp));
    pthread_t th[8];
    for (int k = 0; k < n; k++) {
        sj[k] = (split_job){.tp = tp, .pp = pp, .dp = dp, .ep = ep};
        K3C_TRY(k3c_comm_group_join(grp, k, &sj[k].w));
    }
    for (int k = 0; k < n; k++) pthread_create(&th[k], NULL, split_thread, &sj[k]);
    for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < n; k++)
        if (sj[k].rc != K3C_OK) return k3c_errorf("split, world rank %d: %s", k, sj[k].err);
    return K3C_OK;
}

static void free_world(split_job *sj, int n) {
    for (int k = 0; k < n; k++) {
        k3c_comm_groups_free(&sj[k].g);
        sj[k].w->free(sj[k].w);
    }
}

/* pp stages (x tp ranks each, world rank = stage tp + tp rank) against the reference ref (world size 1 at
 * tp = 1, else TP at the same tp): bitwise, on the last stage's every TP rank. */
static void check_pp(const fixture *fx, int exact, int pp, int tp, const prun *ref, const char *name) {
    int n = pp * tp;
    split_job sj[8];
    CHECK_OK(make_world(tp, pp, 1, 1, 60000, sj));
    k3c_model *sh[8] = {0};
    prun r[8];
    for (int k = 0; k < n; k++) {
        k3c_model_part part = {.tp_rank = k % tp, .tp = tp, .pp_stage = k / tp, .pp = pp};
        CHECK_OK(k3c_model_shard(fx->m, &part, &sh[k]));
        r[k] = (prun){.m = sh[k], .tp = sj[k].g.tp, .pp = sj[k].g.pp, .exact = exact, .V = fx->V};
        pp_requests(fx, &r[k]);
        CHECK(alloc_run(&r[k]) == K3C_OK);
    }
    run_ranks(r, n);
    int failed = 0;
    for (int k = 0; k < n && !failed; k++)
        if (r[k].rc != K3C_OK) {
            test_fail(__FILE__, __LINE__, "%s pp %d tp %d rank %d: %s", name, pp, tp, k, r[k].err);
            failed = 1;
        }
    for (int k = (pp - 1) * tp; k < n && !failed; k++) {
        CHECKF(r[k].last, "rank %d is not the last stage", k);
        for (int i = 0; i < r[k].nreq && !failed; i++) {
            double w = worst(&r[k], ref, i);
            int same = same_bits(&r[k], ref, i);
            if (k == (pp - 1) * tp)
                printf("    %s %s pp %d x tp %d, request %d: %s %s; worst row rel L2 %.3g\n", name,
                       exact ? "f32" : "bf16", pp, tp, i, same ? "bitwise" : "NOT bitwise", tp > 1 ? "TP" : "world size 1",
                       w);
            if (!same) {
                test_fail(__FILE__, __LINE__, "%s pp %d tp %d rank %d request %d: not bitwise the reference (rel L2 "
                          "%.3g)", name, pp, tp, k, i, w);
                failed = 1;
            }
        }
    }
    for (int k = 0; k < n; k++) {
        free_run(&r[k]);
        k3c_model_shard_free(sh[k]);
    }
    free_world(sj, n);
}

/* The reference of a PP test: world size 1 (tp = 1) or the TP ranks' run (rank 0's logits). */
static int pp_reference(const fixture *fx, int exact, int tp, prun *ref) {
    *ref = (prun){.m = fx->m, .exact = exact, .V = fx->V};
    pp_requests(fx, ref);
    K3C_TRY(alloc_run(ref));
    if (tp == 1) return run_rank(ref);
    k3c_comm_group *grp;
    K3C_TRY(k3c_comm_group_create(tp, 60000, &grp));
    k3c_model *sh[8] = {0};
    prun r[8];
    for (int k = 0; k < tp; k++) { /* rank 0 writes into the reference's buffers, the others into their own */
        K3C_TRY(k3c_model_shard_tp(fx->m, k, tp, &sh[k]));
        if (k == 0) {
            r[0] = *ref;
        } else {
            r[k] = (prun){.exact = exact, .V = fx->V};
            pp_requests(fx, &r[k]);
            K3C_TRY(alloc_run(&r[k]));
        }
        r[k].m = sh[k];
        K3C_TRY(k3c_comm_group_join(grp, k, &r[k].tp));
    }
    run_ranks(r, tp);
    int rc = K3C_OK;
    for (int k = 0; k < tp; k++) {
        if (r[k].rc != K3C_OK && rc == K3C_OK) rc = k3c_errorf("tp reference rank %d: %s", k, r[k].err);
        if (k > 0) free_run(&r[k]);
        r[k].tp->free(r[k].tp);
        k3c_model_shard_free(sh[k]);
    }
    return rc;
}

static void pp_case(int kimi_linear, int exact, int with_tp) {
    const fixture *fx = fixture_get(kimi_linear);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    const char *name = kimi_linear ? "kimi-linear" : "k3";
    prun ref;
    CHECK_OK(pp_reference(fx, exact, 1, &ref));
    check_pp(fx, exact, 2, 1, &ref, name);
    check_pp(fx, exact, 3, 1, &ref, name); /* K3: a boundary inside an AttnRes block (layers 0-2, 3-5, 6-8) */
    if (with_tp) {
        prun tpref;
        CHECK_OK(pp_reference(fx, exact, 2, &tpref));
        /* TP is not bitwise world size 1 (its sums split, tests/test_tp.c): prompt rows (decode rows follow
         * streams that may part in bf16) within 1e-5 in f32 */
        double w = 0;
        for (int i = 0; i < tpref.nreq; i++)
            for (int t = 0; t < tpref.req[i].n_prompt; t++) {
                double d = rel_l2_f32f32(tpref.prompt_logits[i] + (size_t)t * fx->V, ref.prompt_logits[i] + (size_t)t * fx->V,
                                         fx->V);
                if (!(d <= w)) w = d;
            }
        /* (in bf16 top-k routing near-ties flip between the two: tests/test_tp.c holds TP to bf16 noise with
         * dense routing) */
        if (exact) {
            printf("    %s f32 tp 2 vs world size 1: worst prompt row rel L2 %.3g\n", name, w);
            CHECKF(w <= 1e-5, "tp 2 f32: %.3g from world size 1", w);
        }
        check_pp(fx, exact, 2, 2, &tpref, name);
        free_run(&tpref);
    }
    free_run(&ref);
}

TEST(pp_cpu_k3_f32_bitwise_world_size_1) { pp_case(0, 1, 1); }
TEST(pp_cpu_k3_bf16_bitwise_world_size_1) { pp_case(0, 0, 1); }
TEST(pp_cpu_kimi_linear_f32_bitwise_world_size_1) { pp_case(1, 1, 0); }
TEST(pp_cpu_kimi_linear_bf16_bitwise_world_size_1) { pp_case(1, 0, 0); }

/* ---- DP attention + EP MoE ---- */

/* DP rank k's requests in a DEP test of ep ranks: rows and decode lengths differ between ranks (so the
 * routing tables are padded), rank 3 of 4 is idle throughout (dummy steps only), and every rank runs the
 * step count of the longest. */
static void dep_requests(const fixture *fx, int ep, int k, int idle_rank, prun *r) {
    r->nreq = 0;
    r->steps = 8;
    r->max_rows = 93; /* rank 0's prompts, the most of any rank */
    if (k == idle_rank || (ep == 4 && k == 3)) return;
    if (k == 0) {
        r->nreq = 2;
        r->req[0] = (req_spec){fx->prompts[0], 70, 6};
        r->req[1] = (req_spec){fx->prompts[1], 23, 3};
    } else if (k == 1) {
        r->nreq = 1;
        r->req[0] = (req_spec){fx->prompts[2], 41, 8};
    } else {
        r->nreq = 1;
        r->req[0] = (req_spec){fx->prompts[3], 5, 2};
    }
}

/* ep DEP ranks on each of pp stages (idle_rank: one more DP rank with no requests, -1 none) against world
 * size 1 running each DP rank's requests alone: bitwise, on the last stage. World rank w = stage ep + DP
 * rank (comm/comm.h). */
static void check_dep(const fixture *fx, int exact, int ep, int pp, int idle_rank, const char *name) {
    split_job sj[8];
    int n = ep * pp;
    CHECK_OK(make_world(1, pp, ep, ep, 60000, sj));
    k3c_model *sh[8] = {0};
    prun r[8], ref[8];
    for (int k = 0; k < ep; k++) {
        ref[k] = (prun){.m = fx->m, .exact = exact, .V = fx->V};
        dep_requests(fx, ep, k, idle_rank, &ref[k]);
        CHECK(alloc_run(&ref[k]) == K3C_OK);
        CHECKF(run_rank(&ref[k]) == K3C_OK, "world size 1, rank %d's requests: %s", k, ref[k].err);
    }
    for (int w = 0; w < n; w++) {
        k3c_model_part part = {.pp_stage = w / ep, .pp = pp, .ep_rank = w % ep, .ep = ep};
        CHECK_OK(k3c_model_shard(fx->m, &part, &sh[w]));
        r[w] = (prun){.m = sh[w], .pp = sj[w].g.pp, .ep = sj[w].g.ep, .exact = exact, .V = fx->V};
        dep_requests(fx, ep, w % ep, idle_rank, &r[w]);
        CHECK(alloc_run(&r[w]) == K3C_OK);
    }
    run_ranks(r, n);
    int failed = 0;
    for (int w = 0; w < n && !failed; w++)
        if (r[w].rc != K3C_OK) {
            test_fail(__FILE__, __LINE__, "%s dep %d pp %d world rank %d: %s", name, ep, pp, w, r[w].err);
            failed = 1;
        }
    for (int w = (pp - 1) * ep; w < n && !failed; w++) {
        int k = w % ep;
        if (r[w].nreq == 0)
            printf("    %s %s dep %d x pp %d, DP rank %d: idle (dummy steps)\n", name, exact ? "f32" : "bf16", ep, pp, k);
        for (int i = 0; i < r[w].nreq && !failed; i++) {
            double d = worst(&r[w], &ref[k], i);
            int same = same_bits(&r[w], &ref[k], i);
            printf("    %s %s dep %d x pp %d, DP rank %d request %d (%d rows, %d new): %s world size 1; worst row rel "
                   "L2 %.3g\n", name, exact ? "f32" : "bf16", ep, pp, k, i, r[w].req[i].n_prompt, r[w].req[i].n_new,
                   same ? "bitwise" : "NOT bitwise", d);
            if (!same) {
                test_fail(__FILE__, __LINE__, "%s dep %d pp %d DP rank %d request %d: not bitwise world size 1 (rel "
                          "L2 %.3g)", name, ep, pp, k, i, d);
                failed = 1;
            }
        }
    }
    for (int w = 0; w < n; w++) {
        free_run(&r[w]);
        k3c_model_shard_free(sh[w]);
    }
    for (int k = 0; k < ep; k++) free_run(&ref[k]);
    free_world(sj, n);
}

static void dep_case(int kimi_linear, int exact) {
    const fixture *fx = fixture_get(kimi_linear);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    const char *name = kimi_linear ? "kimi-linear" : "k3";
    check_dep(fx, exact, 2, 1, -1, name);
    check_dep(fx, exact, 4, 1, -1, name);
    check_dep(fx, exact, 2, 2, -1, name); /* PP 2 x DEP 2 */
}

TEST(dep_cpu_k3_f32_bitwise_world_size_1) { dep_case(0, 1); }
TEST(dep_cpu_k3_bf16_bitwise_world_size_1) { dep_case(0, 0); }
TEST(dep_cpu_kimi_linear_f32_bitwise_world_size_1) { dep_case(1, 1); }
TEST(dep_cpu_kimi_linear_bf16_bitwise_world_size_1) { dep_case(1, 0); }

/* An idle DP rank (no requests in any step) does not disturb the other's results. */
TEST(dep_cpu_idle_rank_leaves_the_other_bitwise) {
    const fixture *fx = fixture_get(0);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    check_dep(fx, 0, 2, 1, 1, "k3");
}

/* ---- failures mid-step ---- */

/* Short requests (a few rows, 4 decode steps), so that no wait of normal operation comes near the silent
 * cases' timeout even on a slow machine: set k of them, k = a DEP rank (or 0 for every PP rank). */
static void short_requests(const fixture *fx, int k, prun *r) {
    r->nreq = 2;
    r->req[0] = (req_spec){fx->prompts[k], 9, 4};
    r->req[1] = (req_spec){fx->prompts[k + 2], 5, 4};
    r->steps = 4;
    r->max_rows = 14;
}

/* DEP 2 on tiny K3: rank 1's EP group gives up at its call `left` (a step and a bit in: one gather per step
 * and three calls per MoE layer), aborting, or hanging past the timeout (silent); rank 0's step fails too,
 * at once or when the timeout ends its wait. */
static void dep_failure(int silent) {
    const fixture *fx = fixture_get(0);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    /* the silent case's timeout must outlast every wait of normal operation (a peer's prefill, on a loaded
     * machine) */
    int timeout = silent ? 1000 : 60000, moe = 0;
    for (int l = 0; l < fx->m->config.num_layers; l++) moe += fx->m->config.layer_is_moe[l] != 0;
    int per_step = 1 + 3 * moe, left = 2 * per_step + 1 + 3 * 2 + 1; /* step 2, the third MoE layer's dispatch */
    split_job sj[2];
    CHECK_OK(make_world(1, 1, 2, 2, timeout, sj));
    k3c_model *sh[2];
    prun r[2];
    for (int k = 0; k < 2; k++) {
        k3c_model_part part = {.ep_rank = k, .ep = 2};
        CHECK_OK(k3c_model_shard(fx->m, &part, &sh[k]));
        r[k] = (prun){.m = sh[k], .ep = sj[k].g.ep, .V = fx->V};
        short_requests(fx, k, &r[k]);
        CHECK(alloc_run(&r[k]) == K3C_OK);
    }
    r[1].ep = faulty_wrap(sj[1].g.ep, left, silent ? 3 * timeout / 2 : 0);
    sj[1].g.ep = NULL; /* the wrapper owns it */
    run_ranks(r, 2);
    for (int k = 0; k < 2; k++)
        printf("    dep 2, rank 1 %s at call %d: rank %d failed in step %d after %.3f s: %.120s\n",
               silent ? "stops silently" : "aborts", left, k, r[k].fail_step, r[k].fail_s, r[k].err);
    CHECKF(r[0].rc == K3C_ERR && r[1].rc == K3C_ERR, "rc %d %d", r[0].rc, r[1].rc);
    CHECKF(r[0].fail_step == 2 && r[1].fail_step == 2, "failed in steps %d, %d", r[0].fail_step, r[1].fail_step);
    if (silent) CHECKF(r[0].fail_s >= 0.9 && r[0].fail_s < 4, "rank 0 failed after %.3f s (timeout 1 s)", r[0].fail_s);
    else CHECKF(r[0].fail_s < 5, "rank 0 failed after %.3f s (the abort should end its wait at once)", r[0].fail_s);
    for (int k = 0; k < 2; k++) {
        free_run(&r[k]);
        k3c_model_shard_free(sh[k]);
    }
    r[1].ep->free(r[1].ep);
    free_world(sj, 2);
}

TEST(dep_cpu_rank_failure_aborts_every_rank) { dep_failure(0); }

/* A route that comes back unusable (the CUDA backend's moe_route after a device error: every expert -1) on
 * rank 1 in the third MoE layer of the prefill: the forward refuses it naming moe_route, and rank 0's step
 * fails at once (the abort), not at the timeout. */
TEST(dep_cpu_failed_route_fails_every_rank) {
    const fixture *fx = fixture_get(0);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    split_job sj[2];
    CHECK_OK(make_world(1, 1, 2, 2, 60000, sj));
    k3c_model *sh[2];
    prun r[2];
    for (int k = 0; k < 2; k++) {
        k3c_model_part part = {.ep_rank = k, .ep = 2};
        CHECK_OK(k3c_model_shard(fx->m, &part, &sh[k]));
        r[k] = (prun){.m = sh[k], .ep = sj[k].g.ep, .V = fx->V, .bad_route = k == 1 ? 3 : 0};
        short_requests(fx, k, &r[k]);
        CHECK(alloc_run(&r[k]) == K3C_OK);
    }
    run_ranks(r, 2);
    for (int k = 0; k < 2; k++)
        printf("    dep 2, rank 1's third route unusable: rank %d failed in step %d after %.3f s: %.120s\n", k,
               r[k].fail_step, r[k].fail_s, r[k].err);
    CHECKF(r[0].rc == K3C_ERR && r[1].rc == K3C_ERR, "rc %d %d", r[0].rc, r[1].rc);
    CHECKF(r[0].fail_step == 0 && r[1].fail_step == 0, "failed in steps %d, %d", r[0].fail_step, r[1].fail_step);
    CHECKF(strstr(r[1].err, "moe_route"), "rank 1: %s", r[1].err);
    CHECKF(r[0].fail_s < 5, "rank 0 failed after %.3f s (the abort should end its wait at once)", r[0].fail_s);
    for (int k = 0; k < 2; k++) {
        free_run(&r[k]);
        k3c_model_shard_free(sh[k]);
    }
    free_world(sj, 2);
}
TEST(dep_cpu_silent_rank_times_out_every_rank) { dep_failure(1); }

/* PP 2 x TP 2 on tiny K3, one world split into groups: world rank 3 (stage 1, TP rank 1) gives up in step 1's
 * second TP all-reduce; every rank's step fails (the abort reaches the other groups of the world at once; a
 * silent rank's TP peer times out, and its abort reaches the rest). */
static void pp_failure(int silent) {
    const fixture *fx = fixture_get(0);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    int timeout = silent ? 1000 : 60000; /* as in dep_failure */
    split_job sj[4];
    CHECK_OK(make_world(2, 2, 1, 1, timeout, sj));
    k3c_model *sh[4];
    prun r[4];
    for (int k = 0; k < 4; k++) {
        k3c_model_part part = {.tp_rank = k % 2, .tp = 2, .pp_stage = k / 2, .pp = 2};
        CHECK_OK(k3c_model_shard(fx->m, &part, &sh[k]));
        r[k] = (prun){.m = sh[k], .tp = sj[k].g.tp, .pp = sj[k].g.pp, .V = fx->V};
        short_requests(fx, 0, &r[k]);
        CHECK(alloc_run(&r[k]) == K3C_OK);
    }
    /* a stage-1 step: per layer one all-reduce for attention and one or two for the FFN, then the logits gather;
     * give up in the first all-reduce of step 1 */
    int calls = 0;
    for (int l = sh[3]->layer_first; l < sh[3]->layer_end; l++) calls += 1 + (fx->m->config.layer_is_moe[l] ? 2 : 1);
    r[3].tp = faulty_wrap(sj[3].g.tp, calls + 1, silent ? 3 * timeout / 2 : 0);
    sj[3].g.tp = NULL;
    run_ranks(r, 4);
    for (int k = 0; k < 4; k++) {
        printf("    pp 2 x tp 2, world rank 3 %s: rank %d failed in step %d after %.3f s: %.100s\n",
               silent ? "stops silently" : "aborts", k, r[k].fail_step, r[k].fail_s, r[k].err);
        CHECKF(r[k].rc == K3C_ERR && r[k].fail_step == 1, "rank %d: rc %d, step %d", k, r[k].rc, r[k].fail_step);
        if (k == 3) continue; /* the one that gave up */
        CHECKF(r[k].fail_s < (silent ? 4 : 5), "rank %d failed after %.3f s", k, r[k].fail_s);
        if (silent) CHECKF(r[k].fail_s >= 0.9, "rank %d failed after %.3f s, before the 1 s timeout", k, r[k].fail_s);
    }
    for (int k = 0; k < 4; k++) {
        free_run(&r[k]);
        k3c_model_shard_free(sh[k]);
    }
    r[3].tp->free(r[3].tp);
    free_world(sj, 4);
}

TEST(pp_cpu_rank_failure_aborts_every_rank) { pp_failure(0); }
TEST(pp_cpu_silent_rank_times_out_every_rank) { pp_failure(1); }

/* ---- what the forward and the shards refuse ---- */

TEST(ppep_cpu_refusals) {
    const fixture *fx = fixture_get(0);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    k3c_model *s = NULL;
    k3c_model_part bad[] = {{.ep_rank = 0, .ep = 3},            /* 3 does not divide 16 experts */
                            {.ep_rank = 0, .ep = 2, .tp = 4},   /* an EP group narrower than a TP group */
                            {.pp_stage = 0, .pp = 10},          /* 10 stages for 9 layers */
                            {.pp_stage = 2, .pp = 2}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECKF(k3c_model_shard(fx->m, &bad[i], &s) == K3C_ERR && !s, "part %zu", i);
    split_job sj[2];
    CHECK_OK(make_world(1, 2, 1, 1, 1000, sj)); /* a pp group of 2 */
    k3c_model *st;
    k3c_model_part p1 = {.pp_stage = 1, .pp = 2}, e0 = {.ep_rank = 0, .ep = 2};
    CHECK_OK(k3c_model_shard(fx->m, &p1, &st));
    k3c_backend *be = k3c_backend_cpu_create(1);
    k3c_forward *f = NULL;
    k3c_forward_options o = {.max_rows = 8, .max_segs = 1, .max_context = 16, .block_size = 16, .pp = sj[0].g.pp};
    CHECK(k3c_forward_create(be, fx->m, &o, &f) == K3C_ERR && !f); /* the whole model on a stage */
    CHECK(k3c_forward_create(be, st, &o, &f) == K3C_ERR && !f);    /* stage 1's shard on stage 0 */
    o.pp = NULL;
    CHECK(k3c_forward_create(be, st, &o, &f) == K3C_ERR && !f); /* a stage without its group */
    CHECK(strstr(k3c_error_message(), "pipeline"));
    o.pp = sj[1].g.pp;
    int aux = 3;
    o.aux_layers = &aux, o.num_aux = 1;
    CHECK(k3c_forward_create(be, st, &o, &f) == K3C_ERR && !f); /* aux streams with PP */
    CHECK(strstr(k3c_error_message(), "aux"));
    o.aux_layers = NULL, o.num_aux = 0;
    const char *name = be->name; /* a device backend: refused on host-memory groups */
    be->name = "cuda";
    CHECK(k3c_forward_create(be, st, &o, &f) == K3C_ERR && !f);
    CHECK(strstr(k3c_error_message(), "host memory"));
    be->name = name;
    k3c_comm nosend = *sj[1].g.pp; /* a group without point to point (the mailbox communicator's case) */
    nosend.send = NULL, nosend.recv = NULL;
    o.pp = &nosend;
    CHECK(k3c_forward_create(be, st, &o, &f) == K3C_ERR && !f);
    CHECK(strstr(k3c_error_message(), "no send / recv"));
    o.pp = sj[1].g.pp;
    k3c_model *es;
    CHECK_OK(k3c_model_shard(fx->m, &e0, &es));
    o.pp = NULL;
    o.ep = sj[0].g.pp; /* a group of 2 as the EP group of rank 0 */
    o.tp = sj[1].g.pp;
    CHECK(k3c_forward_create(be, es, &o, &f) == K3C_ERR && !f); /* EP with TP on a shard not made for the hybrid */
    o.tp = NULL;
    be->name = "cuda";
    CHECK(k3c_forward_create(be, es, &o, &f) == K3C_ERR && !f);
    CHECK(strstr(k3c_error_message(), "host memory"));
    be->name = name;
    k3c_comm noa2a = *sj[0].g.pp;
    noa2a.all_to_all = NULL;
    o.ep = &noa2a;
    CHECK(k3c_forward_create(be, es, &o, &f) == K3C_ERR && !f);
    CHECK(strstr(k3c_error_message(), "no all_to_all"));
    o.ep = sj[0].g.pp;
    __typeof__(be->moe_route) route = be->moe_route; /* a backend without the EP ops */
    be->moe_route = NULL;
    CHECK(k3c_forward_create(be, es, &o, &f) == K3C_ERR && !f);
    CHECK(strstr(k3c_error_message(), "no expert-parallel ops"));
    be->moe_route = route;
    o.ep = NULL;
    CHECK(k3c_forward_create(be, es, &o, &f) == K3C_ERR && !f); /* an EP shard without its group */
    be->destroy(be);
    k3c_model_shard_free(st);
    k3c_model_shard_free(es);
    free_world(sj, 2);
}

/* A stage's caches hold its layers only, and the stages' bytes add up to the whole model's. */
TEST(pp_cpu_stage_caches_hold_their_layers) {
    const fixture *fx = fixture_get(0);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    const k3c_config *c = &fx->m->config;
    k3c_backend *be = k3c_backend_cpu_create(1);
    double kv_all = k3c_kv_cache_bytes(c, 4, 1000), kda_all = k3c_kda_slots_bytes(c, 2, 1, 2), kv_sum = 0, kda_sum = 0;
    for (int s = 0; s < 3; s++) {
        k3c_model *st;
        k3c_model_part p = {.pp_stage = s, .pp = 3};
        CHECK_OK(k3c_model_shard(fx->m, &p, &st));
        int l0, l1;
        k3c_model_stage_layers(st, &l0, &l1);
        CHECK(l0 == s * 3 && l1 == s * 3 + 3); /* 9 layers: 0-2, 3-5, 6-8 */
        CHECK((st->weights.embed.w != NULL) == (s == 0) && (st->weights.lm_head.w != NULL) == (s == 2));
        CHECK((st->weights.final_norm != NULL) == (s == 2));
        k3c_kv_cache kv;
        k3c_kda_slots ks;
        CHECK_OK(k3c_kv_cache_init_layers(&kv, be, c, l0, l1, 4, 16));
        CHECK_OK(k3c_kda_slots_init_layers(&ks, be, c, l0, l1, 2, 1, 2));
        for (int l = 0; l < c->num_layers; l++) {
            int mine = l >= l0 && l < l1;
            CHECKF((kv.layer[l] != NULL) == (mine && c->layer_attn[l] == K3C_ATTN_MLA), "stage %d layer %d kv", s, l);
            CHECKF((ks.state[l] != NULL) == (mine && c->layer_attn[l] == K3C_ATTN_KDA), "stage %d layer %d kda", s, l);
            CHECKF(mine || !st->weights.layers[l].input_norm, "stage %d holds layer %d's weights", s, l);
        }
        kv_sum += k3c_kv_cache_bytes_layers(c, l0, l1, 4, 1000);
        kda_sum += k3c_kda_slots_bytes_layers(c, l0, l1, 2, 1, 2);
        k3c_kv_cache_release(&kv, be);
        k3c_kda_slots_release(&ks, be);
        k3c_model_shard_free(st);
    }
    CHECK(kv_sum == kv_all);
    /* each stage's slots carry their own verify scratch (max_segs states and windows, a commit row) */
    CHECK(kda_sum >= kda_all);
    CHECK(k3c_kv_cache_init_layers(&(k3c_kv_cache){0}, be, c, 5, 5, 4, 16) == K3C_ERR);
    be->destroy(be);
}

/* ---- the attention override (stock/forward.h k3c_forward_step_attn: the executor's wide route) ----
 * The override here writes A = 0; its reference is the stock forward on the same model with every
 * attention's o_proj pointed at a zero matrix, whose attention output is then +0.0 too, so both runs must be
 * bitwise equal: the override's output lands where the stock attention's would, and everything else (AttnRes,
 * norms, the MoE and its EP exchange, the final norm, the LM head) stays stock. */

/* Points every attention o_proj of m at one zero matrix (kept in *zeros), the old ones saved in saved[2 L]. */
static int zero_o_proj(k3c_model *m, k3c_mat *saved, uint16_t **zeros) {
    size_t most = 1;
    int L = m->config.num_layers;
    for (int l = 0; l < L; l++) {
        k3c_layer_weights *lw = &m->weights.layers[l];
        const k3c_mat *o[2] = {&lw->kda.o_proj, &lw->mla.o_proj};
        for (int k = 0; k < 2; k++)
            if ((size_t)o[k]->rows * o[k]->cols > most) most = (size_t)o[k]->rows * o[k]->cols;
    }
    *zeros = calloc(most, sizeof(uint16_t));
    if (!*zeros) return k3c_errorf("out of memory");
    for (int l = 0; l < L; l++) {
        k3c_layer_weights *lw = &m->weights.layers[l];
        saved[2 * l] = lw->kda.o_proj;
        saved[2 * l + 1] = lw->mla.o_proj;
        if (lw->kda.o_proj.w) lw->kda.o_proj.w = *zeros;
        if (lw->mla.o_proj.w) lw->mla.o_proj.w = *zeros;
    }
    return K3C_OK;
}

static void restore_o_proj(k3c_model *m, const k3c_mat *saved, uint16_t *zeros) {
    for (int l = 0; l < m->config.num_layers; l++) {
        m->weights.layers[l].kda.o_proj = saved[2 * l];
        m->weights.layers[l].mla.o_proj = saved[2 * l + 1];
    }
    free(zeros);
}

/* Steps with rows of a run: the prefill and every decode step with a request. */
static long steps_with_rows(const prun *r) {
    long n = r->nreq > 0;
    for (int s = 1; s <= r->steps; s++) {
        int any = 0;
        for (int i = 0; i < r->nreq; i++) any |= s <= r->req[i].n_new;
        n += any;
    }
    return n;
}

/* World size 1 (bf16): the override's run bitwise the stock one's; begin once per step, run once per layer
 * of every step, in layer order. */
static void attn_override_one(int kimi_linear) {
    const fixture *fx = fixture_get(kimi_linear);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    if (!fx) return;
    k3c_model *m = (k3c_model *)fx->m; /* the shared fixture: o_proj swapped for this test, restored below */
    int L = m->config.num_layers;
    k3c_mat saved[2 * 64];
    uint16_t *zeros = NULL;
    CHECK(L <= 64);
    CHECK_OK(zero_o_proj(m, saved, &zeros));
    prun ref = {.m = m, .V = fx->V}, ovr = {.m = m, .V = fx->V, .zero_attn = 1, .attn_fail_step = -1};
    dep_requests(fx, 2, 0, -1, &ref);
    dep_requests(fx, 2, 0, -1, &ovr);
    CHECK(alloc_run(&ref) == K3C_OK && alloc_run(&ovr) == K3C_OK);
    CHECKF(run_rank(&ref) == K3C_OK, "stock: %s", ref.err);
    CHECKF(run_rank(&ovr) == K3C_OK, "override: %s", ovr.err);
    for (int i = 0; i < ref.nreq; i++)
        CHECKF(same_bits(&ovr, &ref, i), "%s request %d: the override's logits differ from the stock forward's with "
               "zero o_proj (rel L2 %.3g)", kimi_linear ? "kimi-linear" : "k3", i, worst(&ovr, &ref, i));
    long steps = steps_with_rows(&ovr);
    printf("    %s: %ld steps through the override, %ld layer calls, %ld out of order\n",
           kimi_linear ? "kimi-linear" : "k3", ovr.attn_begins, ovr.attn_runs, ovr.attn_bad);
    CHECKF(ovr.attn_begins == steps && ovr.attn_runs == steps * L && ovr.attn_bad == 0,
           "begin %ld (expected %ld), run %ld (expected %ld), %ld bad calls", ovr.attn_begins, steps, ovr.attn_runs,
           steps * L, ovr.attn_bad);
    free_run(&ref);
    free_run(&ovr);
    restore_o_proj(m, saved, zeros);
}

TEST(forward_attention_override_k3_bitwise) { attn_override_one(0); }
TEST(forward_attention_override_kimi_linear_bitwise) { attn_override_one(1); }

/* DEP 2 (DP rank 0 idle for the last steps: dummy steps), at tp 1 or, the hybrid, with TP 2 attention groups
 * inside it (EP over every rank; world rank w = DP rank x tp + TP rank, comm/comm.h): every rank's run through
 * the override bitwise the stock run's on the same zero-o_proj shards; a dummy step calls neither begin nor run
 * (its collectives are the stock dummy step's: the steps line up, or the ranks would fail or wait). On a TP
 * rank the override leaves in A what the stock layer leaves there, the group's sum (here +0.0: the zero
 * o_proj's parts are +0.0 on every rank), both TP ranks of a DP group alike. */
static void attn_override_dep(int kimi_linear, int tp) {
    const fixture *fx = fixture_get(kimi_linear);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    if (!fx) return;
    k3c_model *m = (k3c_model *)fx->m;
    const int L = m->config.num_layers, n = 2 * tp;
    const char *name = kimi_linear ? "kimi-linear" : "k3", *lay = tp > 1 ? "hybrid tp 2 x dep 2" : "dep 2";
    k3c_mat saved[2 * 64];
    uint16_t *zeros = NULL;
    CHECK(L <= 64);
    CHECK_OK(zero_o_proj(m, saved, &zeros));
    prun r[2][4];
    k3c_model *sh[4] = {0};
    for (int w = 0; w < n; w++) {
        k3c_model_part part = {.tp_rank = tp > 1 ? w % tp : 0, .tp = tp > 1 ? tp : 0, .ep_rank = w, .ep = n};
        CHECK_OK(k3c_model_shard(m, &part, &sh[w]));
    }
    for (int run = 0; run < 2; run++) {
        split_job sj[4];
        CHECK_OK(make_world(tp, 1, 2, n, 60000, sj));
        for (int w = 0; w < n; w++) {
            r[run][w] = (prun){.m = sh[w], .tp = tp > 1 ? sj[w].g.tp : NULL, .ep = sj[w].g.ep, .V = fx->V,
                               .zero_attn = run, .attn_fail_step = -1};
            dep_requests(fx, 2, w / tp, -1, &r[run][w]);
            CHECK(alloc_run(&r[run][w]) == K3C_OK);
        }
        run_ranks(r[run], n);
        for (int w = 0; w < n; w++) CHECKF(r[run][w].rc == K3C_OK, "%s %s rank %d: %s", lay,
                                           run ? "override" : "stock", w, r[run][w].err);
        free_world(sj, n);
    }
    for (int w = 0; w < n; w++) {
        const prun *o = &r[1][w];
        for (int i = 0; i < o->nreq; i++) {
            CHECKF(same_bits(o, &r[0][w], i), "%s rank %d request %d: the override's logits differ from the stock "
                   "forward's (rel L2 %.3g)", lay, w, i, worst(o, &r[0][w], i));
            if (w % tp) CHECKF(same_bits(o, &r[1][w - 1], i), "%s rank %d request %d: TP rank 1's logits differ "
                               "from TP rank 0's", lay, w, i);
        }
        long steps = steps_with_rows(o);
        printf("    %s %s rank %d: %ld of %d steps through the override (the rest dummy steps), %ld layer calls\n",
               name, lay, w, o->attn_begins, o->steps + 1, o->attn_runs);
        CHECKF(o->attn_begins == steps && o->attn_runs == steps * L && o->attn_bad == 0,
               "rank %d: begin %ld (expected %ld), run %ld (expected %ld), %ld bad calls", w, o->attn_begins, steps,
               o->attn_runs, steps * L, o->attn_bad);
    }
    CHECK(steps_with_rows(&r[1][0]) < r[1][0].steps + 1); /* DP rank 0 did run dummy steps */
    for (int run = 0; run < 2; run++)
        for (int w = 0; w < n; w++) free_run(&r[run][w]);
    for (int w = 0; w < n; w++) k3c_model_shard_free(sh[w]);
    restore_o_proj(m, saved, zeros);
}

TEST(dep_cpu_attention_override_k3_bitwise) { attn_override_dep(0, 1); }
TEST(dep_cpu_attention_override_kimi_linear_bitwise) { attn_override_dep(1, 1); }
TEST(hybrid_cpu_attention_override_k3_bitwise) { attn_override_dep(0, 2); }
TEST(hybrid_cpu_attention_override_kimi_linear_bitwise) { attn_override_dep(1, 2); }

/* DEP 2: rank 1's override fails in step 2 (its second layer): its step fails, and rank 0's too, at once (the
 * failed step aborted the EP group) rather than after the group's timeout. */
TEST(dep_cpu_attention_override_failure_fails_the_peer) {
    const fixture *fx = fixture_get(0);
    CHECKF(fx, "fixture: %s", k3c_error_message());
    if (!fx) return;
    split_job sj[2];
    CHECK_OK(make_world(1, 1, 2, 2, 60000, sj));
    k3c_model *sh[2];
    prun r[2];
    for (int k = 0; k < 2; k++) {
        k3c_model_part part = {.ep_rank = k, .ep = 2};
        CHECK_OK(k3c_model_shard(fx->m, &part, &sh[k]));
        r[k] = (prun){.m = sh[k], .ep = sj[k].g.ep, .V = fx->V, .zero_attn = 1, .attn_fail_step = k == 1 ? 2 : -1};
        short_requests(fx, k, &r[k]);
        CHECK(alloc_run(&r[k]) == K3C_OK);
    }
    run_ranks(r, 2);
    for (int k = 0; k < 2; k++)
        printf("    dep 2, rank 1's override fails in step 2: rank %d failed in step %d after %.3f s: %.120s\n", k,
               r[k].fail_step, r[k].fail_s, r[k].err);
    CHECKF(r[0].rc == K3C_ERR && r[1].rc == K3C_ERR, "rc %d %d", r[0].rc, r[1].rc);
    CHECKF(r[0].fail_step == 2 && r[1].fail_step == 2, "failed in steps %d, %d", r[0].fail_step, r[1].fail_step);
    CHECKF(r[0].fail_s < 5, "rank 0 failed after %.3f s (the abort should end its wait at once)", r[0].fail_s);
    CHECKF(strstr(r[1].err, "attention override") != NULL, "rank 1's error: %s", r[1].err);
    for (int k = 0; k < 2; k++) {
        free_run(&r[k]);
        k3c_model_shard_free(sh[k]);
    }
    free_world(sj, 2);
}
