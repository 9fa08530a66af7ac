/* The executor's wide route and its DEP executor (decode/executor_cuda.h) against the stock forward on the
 * GPU, bitwise:
 *  - one rank, through the engine (tiny K3 and tiny Kimi Linear, synthesized checkpoints): uniform verify steps
 *    whose row count is no prepared batch (12, 80, 96, 128 and 256 rows: the engine's wide cap) planned
 *    K3C_ROUTE_WIDE and run by the executor (the stock layer loop with the KDA / MLA attention providers), their
 *    logits rows bitwise those of the same step on the engine's stock path (a second set of requests with the
 *    same tokens), the committed KDA state untouched by the verify, the state after commit(a) bitwise the stock
 *    one's, a second wide verify after the commit bitwise too, and afterwards a captured decode step still
 *    bitwise stock (the wide route hands the providers the stock forward's buffers for its calls only);
 *  - DEP 2 on one GPU (tests/tp_config.h's tiny K3 and tiny Kimi Linear, bf16; the ranks' collectives through
 *    the staged communicator, as tests/gpu/test_gpu_ppep.c runs its DEP cases): each rank's executor built over
 *    its stock DEP forward (k3c_decode_env.fwd, .ep) takes every decode and uniform verify step (planned
 *    K3C_ROUTE_WIDE on its own plan table) and, on the rank idle for the last steps, its dummy steps (n = 0
 *    through the executor: the stock dummy step); every logits row bitwise the stock DEP forward's over the
 *    same requests; and with both ranks given the same requests, the ranks' rows bitwise equal to each other;
 *  - the hybrid, TP 2 x DEP 2 on one GPU (EP 4 over every rank): the same, each DP group's executors over their
 *    own mailbox (their TP attention providers' sums) beside the stock forward's staged groups, and the TP
 *    ranks of a DP group bitwise equal.
 * Fresh weights and prompts per run (test_seed()). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "comm/comm.h"
#include "comm/mailbox_cuda.h"
#include "cuda/backend_cuda.h"
#include "decode/executor_cuda.h"
#include "decode/plan.h"
#include "decode/prepared.h"
#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/shard.h"
#include "model/synth.h"
#include "runtime/engine_internal.h"
#include "stock/forward.h"
#include "../test.h"
#include "../tp_config.h"
#include "util/error.h"
#include "util/rng.h"

/* ---- one rank, through the engine ---- */

typedef struct wenv {
    char dir[512];
    k3c_model *m;
    k3c_engine *e;
    int V, max_requests;
    int open[128], n_open;
} wenv;

static void wenv_close_requests(wenv *v) {
    for (int i = 0; i < v->n_open; i++) {
        k3c_request_close(v->e, v->open[i]);
        k3c_error_clear();
    }
    v->n_open = 0;
}

static void wenv_close(wenv *v) {
    if (v->e) wenv_close_requests(v);
    k3c_engine_free(v->e);
    if (v->m) k3c_free(v->m);
    memset(v, 0, sizeof *v);
}

/* The engine of test_gpu_executor.c (max_rows 512: the wide cap is K3C_WIDE_MAX), every prepared shape
 * captured by the warm-up, so that the captured graphs and the wide route live side by side. */
static int wenv_open(wenv *v, const char *preset, int max_requests) {
    memset(v, 0, sizeof *v);
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    snprintf(v->dir, sizeof v->dir, "%s/gpuwide-%s", test_tmpdir(), preset);
    int rc = k3c_synth_write(&c, preset, test_seed() ^ k3c_hash_str(preset) ^ 0x77, v->dir);
    k3c_config_free(&c);
    if (rc == K3C_OK) rc = k3c_load(v->dir, &v->m);
    K3C_TRY(rc);
    v->V = v->m->config.vocab_size;
    v->max_requests = max_requests;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.device = "cuda";
    o.max_requests = max_requests;
    o.max_rows = 512;
    o.max_context = 320;
    o.block_size = 16;
    o.q_max = 8;
    o.specialized = K3C_SPECIALIZED_ON;
    K3C_TRY(k3c_engine_create(v->m, &o, &v->e));
    return k3c_engine_warmup(v->e);
}

static int wstock_step(wenv *v, k3c_step_item *items, int n, float *logits) {
    K3C_TRY(k3c_engine_set_specialized(v->e, 0));
    int rc = k3c_engine_step(v->e, items, n, logits);
    k3c_engine_set_specialized(v->e, 1);
    return rc;
}

static long wexec_steps(wenv *v) {
    k3c_engine_stats st;
    k3c_engine_stats_get(v->e, &st);
    return st.executor_steps;
}

static long wide_steps(wenv *v) {
    k3c_engine_view w;
    k3c_engine_view_get(v->e, &w);
    return w.xc ? k3c_decode_cuda_wide_steps(w.xc) : -1;
}

/* A step the engine must plan `route` and run on its executor. */
static int wexec_step(wenv *v, k3c_step_item *items, int n, float *logits, k3c_route route) {
    long before = wexec_steps(v);
    K3C_TRY(k3c_engine_step(v->e, items, n, logits));
    k3c_plan p = k3c_engine_last_plan(v->e);
    if (p.route != route || wexec_steps(v) != before + 1)
        return k3c_errorf("step of %d x %d: planned %s (reason %s), %ld executor steps (expected route %s on the "
                          "executor)", n, items[0].n, k3c_route_name(p.route), k3c_stock_reason_name(p.reason),
                          wexec_steps(v) - before, k3c_route_name(route));
    return K3C_OK;
}

static int wslot_state(wenv *v, int slot, float *out) {
    k3c_engine_view w;
    k3c_engine_view_get(v->e, &w);
    size_t sf = w.ks->state_floats, k = 0;
    for (int l = 0; l < w.m->config.num_layers; l++) {
        if (!w.ks->state[l]) continue;
        w.be->download(w.be, out + k * sf, w.ks->state[l] + (size_t)slot * sf, sf * sizeof(float));
        k++;
    }
    return w.be->sync(w.be);
}

static size_t wstate_total(wenv *v) {
    k3c_engine_view w;
    k3c_engine_view_get(v->e, &w);
    size_t k = 0;
    for (int l = 0; l < w.m->config.num_layers; l++) k += w.ks->state[l] != NULL;
    return k * w.ks->state_floats;
}

/* Rows bitwise equal between a (stock) and b (executor), T rows of V; a NaN row never counts. */
static size_t rows_bitwise(const float *a, const float *b, size_t T, size_t V) {
    size_t n = 0;
    for (size_t t = 0; t < T; t++) {
        int nan = 0;
        for (size_t i = 0; i < V && !nan; i++) nan = a[t * V + i] != a[t * V + i];
        n += !nan && !memcmp(a + t * V, b + t * V, sizeof(float) * V);
    }
    return n;
}

/* b requests verifying q tokens (b * q rows, no prepared batch): sets A (stock) and B (executor) opened with
 * the same prompt, then a wide verify on each, commit(a), a second wide verify, and a captured decode step. */
static void check_wide(wenv *v, const char *name, int b, int q) {
    wenv_close_requests(v);
    if (2 * b > v->max_requests || b * q > K3C_WIDE_MAX || k3c_prepared_shape(b * q, q, 8, v->max_requests)) {
        test_fail(__FILE__, __LINE__, "%s: (%d x %d) is not a wide shape of this engine", name, b, q);
        return;
    }
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(name) ^ (uint64_t)(b * 16 + q));
    size_t V = v->V, T = (size_t)b * q, SF = wstate_total(v);
    int ids[128];
    int32_t prompt[24];
    int np = 5 + (int)(k3c_rng_next(&r) % 16);
    float *lg = malloc(sizeof(float) * V);
    for (int i = 0; i < b; i++) {
        for (int j = 0; j < np; j++) prompt[j] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
        for (int s = 0; s < 2; s++) {
            CHECK_OK(k3c_request_open(v->e, &ids[s * b + i]));
            v->open[v->n_open++] = ids[s * b + i];
            k3c_step_item it = {.request = ids[s * b + i], .tokens = prompt, .n = np};
            CHECK_OK(wstock_step(v, &it, 1, lg));
        }
    }
    float *la = malloc(sizeof(float) * T * V), *lb = malloc(sizeof(float) * T * V);
    float *s0 = malloc(sizeof(float) * (SF ? SF : 1)), *s1 = malloc(sizeof(float) * (SF ? SF : 1));
    int32_t *tok = malloc(sizeof(int32_t) * T);
    k3c_step_item ia[64], ib[64];
    long wide0 = wide_steps(v);
    for (int round = 0; round < 2; round++) {
        for (size_t t = 0; t < T; t++) tok[t] = (int32_t)(k3c_rng_next(&r) % V);
        for (int i = 0; i < b; i++) {
            ia[i] = (k3c_step_item){.request = ids[i], .tokens = tok + i * q, .n = q, .verify = 1};
            ib[i] = (k3c_step_item){.request = ids[b + i], .tokens = tok + i * q, .n = q, .verify = 1};
        }
        poison_f32(la, T * V);
        poison_f32(lb, T * V);
        if (SF) CHECK_OK(wslot_state(v, ids[b], s0));
        CHECK_OK(wstock_step(v, ia, b, la));
        CHECK_OK(wexec_step(v, ib, b, lb, K3C_ROUTE_WIDE));
        size_t same = rows_bitwise(la, lb, T, V);
        printf("INFO wide %s b=%d q=%d (%zu rows) round %d: %zu of %zu logits rows bitwise equal to stock\n", name, b,
               q, T, round, same, T);
        CHECKF(same == T, "%s b=%d q=%d round %d: %zu of %zu wide logits rows bitwise stock", name, b, q, round, same,
               T);
        if (SF) { /* the verify left the committed state as it was */
            CHECK_OK(wslot_state(v, ids[b], s1));
            CHECKF(!memcmp(s0, s1, sizeof(float) * SF), "%s b=%d q=%d: the wide verify changed the committed KDA "
                   "state", name, b, q);
        }
        int a = 1 + (int)(k3c_rng_next(&r) % (uint64_t)q);
        for (int i = 0; i < b; i++) {
            CHECK_OK(k3c_request_commit(v->e, ids[i], a));
            CHECK_OK(k3c_request_commit(v->e, ids[b + i], a));
        }
        int eq = 1;
        for (int i = 0; i < b && eq && SF; i++) {
            CHECK_OK(wslot_state(v, ids[i], s0));
            CHECK_OK(wslot_state(v, ids[b + i], s1));
            eq = !memcmp(s0, s1, sizeof(float) * SF);
        }
        CHECKF(eq, "%s b=%d q=%d round %d: the state after the wide verify + commit(%d) differs from stock's", name, b,
               q, round, a);
    }
    CHECKF(wide_steps(v) == wide0 + 2, "%s b=%d q=%d: %ld wide steps counted by the executor, expected 2", name, b, q,
           wide_steps(v) - wide0);
    /* a captured decode step of 4 requests after the wide ones: the graphs' buffers are the executor's again */
    if (b >= 4) {
        for (int i = 0; i < 4; i++) {
            tok[i] = (int32_t)(k3c_rng_next(&r) % V);
            ia[i] = (k3c_step_item){.request = ids[i], .tokens = tok + i, .n = 1};
            ib[i] = (k3c_step_item){.request = ids[b + i], .tokens = tok + i, .n = 1};
        }
        poison_f32(la, 4 * V);
        poison_f32(lb, 4 * V);
        CHECK_OK(wstock_step(v, ia, 4, la));
        CHECK_OK(wexec_step(v, ib, 4, lb, K3C_ROUTE_DECODE));
        size_t same = rows_bitwise(la, lb, 4, V);
        CHECKF(same == 4, "%s: a captured decode step after wide steps: %zu of 4 rows bitwise stock", name, same);
    }
    wenv_close_requests(v);
    free(lg), free(la), free(lb), free(s0), free(s1), free(tok);
}

static void run_wide_model(const char *preset) {
    wenv v;
    int rc = wenv_open(&v, preset, 64);
    CHECKF(rc == K3C_OK, "%s: %s", preset, k3c_error_message());
    if (rc == K3C_OK) {
        static const int shapes[][2] = {{3, 4}, {20, 4}, {12, 8}, {24, 4}, {16, 8}, {32, 8}};
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_wide(&v, preset, shapes[i][0], shapes[i][1]);
    }
    wenv_close(&v);
}

TEST(gpu_wide_verify_tiny) { run_wide_model("tiny"); }
TEST(gpu_wide_verify_kimi_linear_tiny) { run_wide_model("kimi-linear-tiny"); }

/* ---- DEP 2 on one GPU ---- */

#define GROUP_MS 60000
enum { DMAXREQ = 3, DMAX_ROWS = 93, DQ = 3 };

typedef struct dreq {
    const int32_t *prompt;
    int n_prompt, n_new;
} dreq;

/* The hybrid's TP ranks of one process: their streams, handed to the DP group's first TP rank, which makes
 * the group's executor mailbox (comm/mailbox_cuda.h, a thread a rank) and hands it back. */
typedef struct dhyb {
    pthread_barrier_t met;
    void *stream[4];
    k3c_comm *mbx[4];
} dhyb;

/* One rank of DEP 2 (tp 1: world rank = DP rank) or of the hybrid (tp 2: TP 2 attention inside DEP 2, EP 4
 * over every rank; world rank = DP rank x 2 + TP rank). exec: the executor takes every step it plans wide,
 * and the dummy steps. After the decode steps every rank's requests (if any) verify DQ tokens. */
typedef struct drun {
    const k3c_model *m;
    k3c_comm_group *world;
    dhyb *hy;
    int wrank, tp, exec, V, nreq, steps;
    dreq req[DMAXREQ];
    float *prompt_logits[DMAXREQ], *step_logits[DMAXREQ], *verify_logits[DMAXREQ];
    int32_t *stream[DMAXREQ];
    long wide, dummies, planned_wide, planned_other;
    int rc;
    char err[512];
} drun;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* A step with rows: planned on the executor's table (it must be wide) and run there; without rows (a dummy
 * step) through the executor's step with n = 0. exec 0: the stock forward for both. */
static int drun_step(drun *r, k3c_decode_cuda *xc, k3c_forward *f, k3c_kv_cache *kv, k3c_kda_slots *ks,
                     const k3c_fwd_req *q, int nq, float *lg) {
    if (!r->exec) return k3c_forward_step(f, kv, ks, q, nq, lg, NULL);
    const k3c_decode_executor *ex = k3c_decode_cuda_executor(xc);
    if (nq == 0) {
        k3c_plan dummy = {.route = K3C_ROUTE_WIDE, .reason = K3C_STOCK_NONE, .rows = 0, .q = 1};
        r->dummies++;
        return ex->step(ex->ctx, &dummy, q, 0, lg, NULL, NULL);
    }
    int ql[DMAXREQ];
    uint8_t hp[DMAXREQ] = {0};
    for (int i = 0; i < nq; i++) ql[i] = q[i].n;
    k3c_step_shape sh = {.num_requests = nq, .query_lens = ql, .has_prompt = hp};
    k3c_plan p = k3c_plan_step(&ex->plan_table, &sh);
    if (p.route != K3C_ROUTE_WIDE) {
        r->planned_other++;
        return k3c_errorf("DEP rank %d: a step of %d requests planned %s (%s), not wide", r->wrank, nq,
                          k3c_route_name(p.route), k3c_stock_reason_name(p.reason));
    }
    r->planned_wide++;
    return ex->step(ex->ctx, &p, q, nq, lg, NULL, NULL);
}

static int drun_rank(drun *r) {
    const k3c_config *c = &r->m->config;
    int V = r->V, bs = 16, ctx = 0, rc = K3C_OK;
    for (int i = 0; i < r->nreq; i++)
        if (r->req[i].n_prompt + r->req[i].n_new + DQ > ctx) ctx = r->req[i].n_prompt + r->req[i].n_new + DQ;
    ctx = ctx > 0 ? ctx : 1;
    int per = (ctx + bs - 1) / bs;
    k3c_backend *be = k3c_backend_cuda_create(0);
    if (!be) return K3C_ERR;
    k3c_comm *world = NULL, *mbx = NULL;
    k3c_comm_groups gr = {0};
    const int tp = r->tp, tp_rank = r->wrank % tp;
    rc = k3c_comm_staged_create(r->world, r->wrank, 0, k3c_backend_cuda_stream(be), GROUP_MS, &world);
    if (rc == K3C_OK) rc = k3c_comm_groups_split(world, tp, 1, 2, 2 * tp, &gr);
    if (tp > 1 && r->exec) { /* the DP group's executor mailbox, made by its first TP rank for both */
        r->hy->stream[r->wrank] = k3c_backend_cuda_stream(be);
        pthread_barrier_wait(&r->hy->met);
        if (tp_rank == 0) {
            int devs[2] = {0, 0};
            k3c_comm_mailbox_options mo = {.timeout_ms = 10000, .threads = 1};
            if (k3c_comm_mailbox_create(2, devs, &r->hy->stream[r->wrank], &mo, &r->hy->mbx[r->wrank]) != K3C_OK)
                fprintf(stderr, "    hybrid rank %d: mailbox: %s\n", r->wrank, k3c_error_message());
        }
        pthread_barrier_wait(&r->hy->met);
        mbx = r->hy->mbx[r->wrank];
        if (rc == K3C_OK && !mbx) rc = k3c_errorf("hybrid rank %d: no executor mailbox (stderr says why)", r->wrank);
    }
    k3c_forward_options o = {.max_rows = DMAX_ROWS, .max_segs = DMAXREQ, .max_context = ctx + 1, .block_size = bs,
                             .tp = tp > 1 ? gr.tp : NULL, .ep = gr.ep};
    k3c_forward *f = NULL;
    k3c_kv_cache kv = {0};
    k3c_kda_slots ks = {0};
    k3c_decode_cuda *xc = NULL;
    int32_t table[DMAXREQ][64], tok[DMAXREQ] = {0}, vtok[DMAXREQ * DQ];
    float *lg = malloc((size_t)DMAX_ROWS * V * sizeof(float));
    if (rc == K3C_OK && !lg) rc = k3c_errorf("out of memory");
    if (rc == K3C_OK) rc = k3c_forward_create(be, r->m, &o, &f);
    if (rc == K3C_OK) rc = k3c_kv_cache_init_layers(&kv, be, c, 0, c->num_layers, DMAXREQ * per + 1, bs);
    if (rc == K3C_OK) rc = k3c_kda_slots_init_layers(&ks, be, c, 0, c->num_layers, DMAXREQ, DQ, DMAXREQ);
    for (int i = 0; i < r->nreq && rc == K3C_OK; i++) {
        k3c_kda_slots_reset(&ks, be, i);
        for (int b = 0; b < per; b++) table[i][b] = k3c_kv_cache_take(&kv);
    }
    if (rc == K3C_OK && r->exec) {
        k3c_decode_env env = {.m = r->m, .be = be, .kv = &kv, .ks = &ks, .max_requests = DMAXREQ,
                              .max_rows = DMAX_ROWS, .max_context = ctx + 1, .block_size = bs, .q_max = DQ,
                              .max_blocks_per_request = per, .fwd = f, .ep = gr.ep, .tp = mbx};
        rc = k3c_decode_cuda_build(&env, tp_rank, tp, &xc);
        if (rc == K3C_OK) rc = k3c_decode_cuda_prepare_kv(xc, 1); /* eager: a DEP rank has nothing to capture */
        if (rc == K3C_OK) {
            const k3c_plan_table *t = &k3c_decode_cuda_executor(xc)->plan_table;
            if (t->num_batches != 0 || !t->wide_decode || t->wide_max != DMAX_ROWS || t->needs_graphs ||
                k3c_decode_cuda_executor(xc)->capture || k3c_decode_cuda_num_captured(xc) != 0)
                rc = k3c_errorf("DEP rank %d: plan table batches %d wide_decode %d wide_max %d needs_graphs %d, "
                                "capture %s, %d captured", r->wrank, t->num_batches, t->wide_decode, t->wide_max,
                                t->needs_graphs, k3c_decode_cuda_executor(xc)->capture ? "set" : "NULL",
                                k3c_decode_cuda_num_captured(xc));
        }
    }
    /* step 0: the prompts (stock on either run: prompt rows); 1 .. steps: decode; steps + 1: verify DQ */
    for (int s = 0; s <= r->steps + 1 && rc == K3C_OK; s++) {
        k3c_fwd_req q[DMAXREQ];
        int nq = 0, who[DMAXREQ];
        for (int i = 0; i < r->nreq; i++) {
            const dreq *p = &r->req[i];
            if (s == 0) {
                q[nq] = (k3c_fwd_req){.ids = p->prompt, .n = p->n_prompt, .pos = 0, .block_table = table[i], .slot = i,
                                      .logits = K3C_LOGITS_ALL};
            } else if (s <= r->steps && s <= p->n_new) {
                q[nq] = (k3c_fwd_req){.ids = &tok[i], .n = 1, .pos = p->n_prompt + s - 1, .block_table = table[i],
                                      .slot = i, .logits = K3C_LOGITS_LAST};
                r->stream[i][s - 1] = tok[i];
            } else if (s == r->steps + 1) { /* every request verifies its next token and two more */
                for (int j = 0; j < DQ; j++) vtok[i * DQ + j] = j == 0 ? tok[i] : (int32_t)((tok[i] + 7 * j) % V);
                q[nq] = (k3c_fwd_req){.ids = vtok + i * DQ, .n = DQ, .pos = p->n_prompt + p->n_new,
                                      .block_table = table[i], .slot = i, .verify = 1};
            } else {
                continue;
            }
            who[nq++] = i;
        }
        int rows = 0;
        for (int k = 0; k < nq; k++) rows += q[k].n;
        poison_f32(lg, (size_t)(rows > 0 ? rows : 1) * V);
        rc = s == 0 ? k3c_forward_step(f, &kv, &ks, q, nq, lg, NULL) : drun_step(r, xc, f, &kv, &ks, q, nq, lg);
        size_t at = 0;
        for (int k = 0; k < nq && rc == K3C_OK; k++) {
            int i = who[k], n = s == 0 ? r->req[i].n_prompt : s <= r->steps ? 1 : DQ;
            float *dst = s == 0 ? r->prompt_logits[i] : s <= r->steps ? r->step_logits[i] + (size_t)(s - 1) * V
                                                                       : r->verify_logits[i];
            memcpy(dst, lg + at * V, (size_t)n * V * sizeof(float));
            if (s <= r->steps) tok[i] = argmax(lg + (at + n - 1) * V, V);
            at += n;
        }
    }
    if (rc == K3C_OK && xc) r->wide = k3c_decode_cuda_wide_steps(xc);
    if (rc != K3C_OK) {
        snprintf(r->err, sizeof r->err, "%s", k3c_error_message());
        if (world) world->abort(world);
    }
    if (rc != K3C_OK && mbx) mbx->abort(mbx);
    k3c_decode_cuda_free(xc);
    if (mbx) mbx->free(mbx);
    free(lg);
    k3c_kda_slots_release(&ks, be);
    k3c_kv_cache_release(&kv, be);
    k3c_forward_free(f);
    k3c_comm_groups_free(&gr);
    if (world) world->free(world);
    be->destroy(be);
    return rc;
}

static void *drun_thread(void *p) {
    drun *r = p;
    r->rc = drun_rank(r);
    return NULL;
}

static int dalloc(drun *r) {
    for (int i = 0; i < r->nreq; i++) {
        size_t np = (size_t)r->req[i].n_prompt * r->V, nn = (size_t)(r->req[i].n_new > 0 ? r->req[i].n_new : 1) * r->V;
        r->prompt_logits[i] = malloc(np * sizeof(float));
        r->step_logits[i] = malloc(nn * sizeof(float));
        r->verify_logits[i] = malloc((size_t)DQ * r->V * sizeof(float));
        r->stream[i] = calloc((size_t)(r->req[i].n_new > 0 ? r->req[i].n_new : 1), sizeof(int32_t));
        if (!r->prompt_logits[i] || !r->step_logits[i] || !r->verify_logits[i] || !r->stream[i])
            return k3c_errorf("out of memory");
        poison_f32(r->prompt_logits[i], np);
        poison_f32(r->step_logits[i], nn);
        poison_f32(r->verify_logits[i], (size_t)DQ * r->V);
    }
    return K3C_OK;
}

static void dfree(drun *r) {
    for (int i = 0; i < r->nreq; i++) {
        free(r->prompt_logits[i]), free(r->step_logits[i]), free(r->verify_logits[i]), free(r->stream[i]);
        r->prompt_logits[i] = r->step_logits[i] = r->verify_logits[i] = NULL;
        r->stream[i] = NULL;
    }
}

/* Every row (prompt, decode, verify) and the stream of request i bitwise equal between two runs; no NaN. */
static int dsame(const drun *a, const drun *b, int i) {
    size_t V = a->V, np = a->req[i].n_prompt * V, nn = a->req[i].n_new * V, nv = (size_t)DQ * V;
    for (size_t k = 0; k < nn; k++)
        if (a->step_logits[i][k] != a->step_logits[i][k]) return 0;
    for (size_t k = 0; k < nv; k++)
        if (a->verify_logits[i][k] != a->verify_logits[i][k]) return 0;
    return !memcmp(a->prompt_logits[i], b->prompt_logits[i], np * 4) &&
           !memcmp(a->step_logits[i], b->step_logits[i], nn * 4) &&
           !memcmp(a->verify_logits[i], b->verify_logits[i], nv * 4) &&
           !memcmp(a->stream[i], b->stream[i], a->req[i].n_new * 4);
}

typedef struct dfix {
    k3c_model *m;
    int V;
    int32_t prompts[DMAXREQ + 1][80];
} dfix;

/* DP rank k's requests (test_gpu_ppep.c's DEP requests): rank 0 the prompts of 70 (6 new) and 23 (3 new),
 * rank 1 one of 41 (8 new); 8 decode steps, so rank 0 runs dummy steps in the last 2 (then both verify).
 * same: both ranks rank 0's requests. */
static void drequests(const dfix *fx, int k, int same, drun *r) {
    r->steps = 8;
    if (same || k == 0) {
        r->nreq = 2;
        r->req[0] = (dreq){fx->prompts[0], 70, 6};
        r->req[1] = (dreq){fx->prompts[1], 23, 3};
    } else {
        r->nreq = 1;
        r->req[0] = (dreq){fx->prompts[2], 41, 8};
    }
}

/* The 2 x tp ranks (one thread each; DP rank = world rank / tp), exec or stock, on the shards sh. */
static int drun_layout(const dfix *fx, k3c_model **sh, int tp, int exec, int same, drun *r) {
    const int n = 2 * tp;
    k3c_comm_group *grp = NULL;
    dhyb hy = {0};
    K3C_TRY(k3c_comm_group_create(n, GROUP_MS, &grp));
    pthread_barrier_init(&hy.met, NULL, (unsigned)n);
    for (int k = 0; k < n; k++) {
        r[k] = (drun){.m = sh[k], .world = grp, .hy = &hy, .wrank = k, .tp = tp, .exec = exec, .V = fx->V};
        drequests(fx, k / tp, same, &r[k]);
        K3C_TRY(dalloc(&r[k]));
    }
    pthread_t th[4];
    for (int k = 0; k < n; k++) pthread_create(&th[k], NULL, drun_thread, &r[k]);
    for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&hy.met);
    /* no k3c_comm_group_free: every rank joined, and the last to leave freed the group (comm/comm.h) */
    for (int k = 0; k < n; k++)
        if (r[k].rc != K3C_OK)
            return k3c_errorf("%s %s rank %d: %s", exec ? "executor" : "stock", tp > 1 ? "hybrid" : "DEP", k, r[k].err);
    return K3C_OK;
}

/* tp 1: DEP 2; tp 2: the hybrid (TP 2 attention groups inside DEP 2, EP 4; the executor's attention sums over
 * each DP group's own mailbox, the stock forward's over the staged groups). */
static void check_dep_exec(int kimi_linear, int tp) {
    const char *name = kimi_linear ? "kimi-linear" : "k3", *lay = tp > 1 ? "hybrid tp2 x dep2" : "dep2";
    const int n = 2 * tp;
    k3c_config c;
    int rc = tp_config(kimi_linear, 0, &c);
    CHECK_OK(rc);
    if (rc != K3C_OK) return;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/gpuwide_dep%d_%s", test_tmpdir(), tp, name);
    uint64_t seed = test_seed() ^ k3c_hash_str(name) ^ 0xdeb ^ (uint64_t)tp;
    rc = k3c_synth_write(&c, NULL, seed, dir);
    dfix fx = {.V = c.vocab_size};
    k3c_config_free(&c);
    CHECK_OK(rc);
    if (rc != K3C_OK) return;
    CHECK_OK(k3c_model_load(dir, &fx.m));
    if (!fx.m) return;
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x7a11);
    for (int i = 0; i <= DMAXREQ; i++)
        for (int t = 0; t < 80; t++) fx.prompts[i][t] = (int32_t)(k3c_rng_next(&g) % (uint64_t)fx.V);
    k3c_model *sh[4] = {0};
    int made = 1;
    for (int k = 0; k < n; k++) {
        k3c_model_part part = {.tp_rank = tp > 1 ? k % tp : 0, .tp = tp > 1 ? tp : 0, .ep_rank = k, .ep = n};
        CHECK_OK(k3c_model_shard(fx.m, &part, &sh[k]));
        made = made && sh[k];
    }
    for (int same = 0; same < 2 && made; same++) {
        drun st[4], ex[4];
        memset(st, 0, sizeof st);
        memset(ex, 0, sizeof ex);
        int ok = drun_layout(&fx, sh, tp, 0, same, st) == K3C_OK;
        CHECKF(ok, "%s %s%s stock: %s", name, lay, same ? " same" : "", k3c_error_message());
        if (ok) {
            ok = drun_layout(&fx, sh, tp, 1, same, ex) == K3C_OK;
            CHECKF(ok, "%s %s%s executor: %s", name, lay, same ? " same" : "", k3c_error_message());
        }
        for (int k = 0; k < n && ok; k++) {
            /* steps with rows after the prompt: decode steps with a request, and the verify step */
            long rows_steps = 1, dummy = 0;
            for (int s = 1; s <= ex[k].steps; s++) {
                int any = 0;
                for (int i = 0; i < ex[k].nreq; i++) any |= s <= ex[k].req[i].n_new;
                rows_steps += any;
                dummy += !any;
            }
            printf("INFO %s %s%s rank %d: %ld steps planned wide, %ld dummy steps through the executor, %ld wide "
                   "steps counted by it\n", name, lay, same ? " same" : "", k, ex[k].planned_wide, ex[k].dummies,
                   ex[k].wide);
            CHECKF(ex[k].planned_wide == rows_steps && ex[k].dummies == dummy && ex[k].wide == rows_steps + dummy,
                   "%s rank %d: %ld wide, %ld dummy, %ld counted; expected %ld and %ld", name, k, ex[k].planned_wide,
                   ex[k].dummies, ex[k].wide, rows_steps, dummy);
            for (int i = 0; i < ex[k].nreq; i++) {
                int eq = dsame(&ex[k], &st[k], i);
                printf("INFO %s %s%s rank %d request %d (%d prompt rows, %d decode, %d verify): executor %s the "
                       "stock forward\n", name, lay, same ? " same" : "", k, i, ex[k].req[i].n_prompt,
                       ex[k].req[i].n_new, DQ, eq ? "bitwise equal to" : "DIFFERS from");
                CHECKF(eq, "%s %s%s rank %d request %d: the executor's logits differ from the stock forward's", name,
                       lay, same ? " same" : "", k, i);
                if (k % tp) CHECKF(dsame(&ex[k], &ex[k - 1], i), "%s %s rank %d request %d: TP rank 1's executor "
                                   "rows differ from TP rank 0's", name, lay, k, i);
                if (same && k >= tp) {
                    int shared = dsame(&ex[k], &ex[k % tp], i);
                    CHECKF(shared, "%s %s same, rank %d request %d: DP rank 1's executor rows differ from DP rank "
                           "0's", name, lay, k, i);
                }
            }
        }
        if (!same && ok) CHECK(ex[0].dummies > 0); /* DP rank 0 was idle for the last decode steps */
        for (int k = 0; k < n; k++) dfree(&st[k]), dfree(&ex[k]);
    }
    for (int k = 0; k < n; k++) k3c_model_shard_free(sh[k]);
    k3c_model_free(fx.m);
}

TEST(gpu_wide_dep_k3) { check_dep_exec(0, 1); }
TEST(gpu_wide_dep_kimi_linear) { check_dep_exec(1, 1); }
TEST(gpu_wide_hybrid_k3) { check_dep_exec(0, 2); }
TEST(gpu_wide_hybrid_kimi_linear) { check_dep_exec(1, 2); }
