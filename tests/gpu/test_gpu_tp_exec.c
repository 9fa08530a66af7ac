/* The specialized executor prepared for tensor parallelism (decode/executor_cuda.h), several ranks on one GPU
 * (one host thread, one backend, one executor a rank) over the CUDA mailbox (comm/mailbox_cuda.h), the one
 * communicator its graphs can capture. Each rank runs two requests of the same prompt, A through the stock TP
 * forward and B through the executor's captured graphs, over the same mailbox communicator, fed the same
 * tokens:
 *  - every decode step (the (1, 1) graph replayed many steps in a row) and a q = 4 verify step: the executor's
 *    logits bitwise the stock forward's on the same rank (the same ops, the same rank-order sums); every fifth
 *    decode step takes the greedy ids path instead (the device arg-max), which must pick the stock logits' arg-max;
 *  - every rank's executor logits bitwise rank 0's;
 *  - against world size 1 (the stock forward fed the same tokens): within the bf16 tolerance of test_gpu_tp.c
 *    (no farther from the f32 function than 2x world size 1's own bf16 logits, nor from world size 1's bf16);
 *  - a staged-communicator executor stays unprepared (test_gpu_tp.c checks it; here the plan of a prepared one).
 * TP 2 and TP 4, on test_tp.c's tiny K3 (dense routing) and on a 4-layer full-width k3-slice (~10 GB
 * synthesized, as test_gpu_tp.c's k3slice_4layers_bf16).
 *
 * No hang: every wait ends. The mailbox kernels give up after their timeout (MBX_TIMEOUT_MS) and the rank's
 * step fails; a failed step aborts the group (the peers' waits end at once); the host barriers are reached by
 * every rank whatever happened before them, and after the setup barrier a rank runs steps only when every
 * rank's setup succeeded. The stock forward over the mailbox with several ranks on one device can stall
 * (docs/PARALLEL.md, "stall"): here that ends as an error naming the step, after the timeout. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "comm/comm.h"
#include "comm/mailbox_cuda.h"
#include "cuda/backend_cuda.h"
#include "decode/executor_cuda.h"
#include "decode/prepared.h"
#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/shard.h"
#include "model/synth.h"
#include "stock/forward.h"
#include "../test.h"
#include "util/error.h"
#include "util/rng.h"
#include "../tp_config.h"

/* Several ranks on one device (comm/mailbox_cuda.h): a hardware queue per stream and eager module loading,
 * set before the process first uses CUDA; a value the environment gives is kept. */
__attribute__((constructor)) static void tpx_env(void) {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

#define MBX_TIMEOUT_MS 10000
#define NP 70 /* the prompt: one whole chunked KDA block (64) and a tail */
#define ND 24 /* decode steps */
#define NQ 4  /* the verify step's q */
#define VER_AT (ND / 2) /* the verify runs before this decode step (and is not committed) */
#define BS 16

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* k3-slice's dims, the first `layers` layers, the vocabulary cut to 32768, dense routing (test_gpu_tp.c's
 * slice_config). */
static int slice_config(int layers, k3c_config *c) {
    K3C_TRY(k3c_preset_config("k3-slice", c));
    if (layers < c->num_layers) c->num_layers = layers;
    c->vocab_size = 32768;
    c->bos_token_id = c->eos_token_id = c->pad_token_id = -1;
    c->num_experts_per_token = c->num_experts;
    c->topk_group = c->num_expert_group;
    return k3c_config_validate(c);
}

typedef struct tpx_shared {
    int size;
    int setup_rc[8];
    pthread_barrier_t setup, done;
} tpx_shared;

typedef struct tpx_rank {
    const k3c_model *m; /* the rank's shard, or the whole model at world size 1 */
    k3c_backend *be;    /* made by the caller (the mailbox needs its stream) */
    k3c_comm *comm;     /* NULL at world size 1 */
    tpx_shared *sh;     /* NULL at world size 1 */
    int rank, size, exact;
    int exec_only, stock_only; /* TP: only request B (the executor), or only A (no executor) */
    const int32_t *prompt, *forced, *vtoks; /* forced: world size 1 is fed rank 0's tokens */
    int V;
    int32_t toks[ND];
    float *stock_dec, *exec_dec; /* [ND, V] */
    float *stock_ver, *exec_ver; /* [NQ, V] */
    int32_t ids[ND];             /* the ids path's token at every fifth step, -1 elsewhere */
    long replays;
    long fused_rowpar, fused_norm, fused_round; /* the executor's fused TP launches recorded (tp_fusions) */
    int rc;
    char err[512];
} tpx_rank;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int ids_step(int s) { return s % 5 == 4; }

/* The executor's step for one request: planned first (the prepared rank's plan must take the specialized
 * route), then run as the engine runs it (decode/executor.h). */
static int exec_step(const k3c_decode_executor *ex, const k3c_fwd_req *q, float *logits, int32_t *id) {
    uint8_t no = 0;
    k3c_step_shape sh = {1, &q->n, &no, 0};
    k3c_plan p = k3c_plan_step(&ex->plan_table, &sh);
    k3c_route want = q->n == 1 ? K3C_ROUTE_DECODE : K3C_ROUTE_VERIFY;
    if (p.route != want)
        return k3c_errorf("a %d-token step planned route %d (%s), not the specialized one", q->n, (int)p.route,
                          k3c_stock_reason_name(p.reason));
    return ex->step(ex->ctx, &p, q, 1, id ? NULL : logits, id, NULL);
}

/* Request A through the stock forward (stock), request B through the executor (ex non-NULL), each prompt by
 * the stock forward (the executor prepares no prompt rows); batch invariance makes the two caches and states
 * the same bits, which the prompt's last logits show. The tokens fed: forced, or the greedy ones of A's
 * logits (of B's without A). */
static int rank_steps(tpx_rank *r, k3c_forward *f, k3c_kv_cache *kv, k3c_kda_slots *ks,
                      const k3c_decode_executor *ex, int32_t *ta, int32_t *tb, float *scratch) {
    int V = r->V, stock = !r->exec_only, exec = ex != NULL;
    k3c_fwd_req q = {.ids = r->prompt, .n = NP, .pos = 0, .block_table = ta, .slot = 0, .logits = K3C_LOGITS_LAST};
    if (stock) {
        k3c_kda_slots_reset(ks, r->be, 0);
        K3C_TRY(k3c_forward_step(f, kv, ks, &q, 1, scratch, NULL));
    }
    if (exec) {
        k3c_kda_slots_reset(ks, r->be, 1);
        q.block_table = tb;
        q.slot = 1;
        K3C_TRY(k3c_forward_step(f, kv, ks, &q, 1, scratch + V, NULL));
        if (stock && memcmp(scratch, scratch + V, (size_t)V * sizeof(float)))
            return k3c_errorf("the same prompt in two slots gave different logits (batch invariance)");
    }
    int32_t tok = (int32_t)argmax(scratch + (stock ? 0 : V), V);
    for (int s = 0; s < ND; s++) {
        int pos = NP + s;
        if (s == VER_AT) { /* q = 4 verify at pos: committed state untouched, nothing committed after it */
            k3c_fwd_req v = {.ids = r->vtoks, .n = NQ, .pos = pos, .block_table = ta, .slot = 0, .verify = 1,
                             .logits = K3C_LOGITS_ALL};
            if (stock) K3C_TRY(k3c_forward_step(f, kv, ks, &v, 1, r->stock_ver, NULL));
            v.block_table = tb;
            v.slot = 1;
            if (exec && exec_step(ex, &v, r->exec_ver, NULL) != K3C_OK)
                return k3c_error_context("the executor's verify step at position %d: ", pos);
        }
        if (r->forced) tok = r->forced[s];
        else if (s > 0 && stock) tok = (int32_t)argmax(r->stock_dec + (size_t)(s - 1) * V, V);
        else if (s > 0) tok = ids_step(s - 1) ? r->ids[s - 1] : (int32_t)argmax(r->exec_dec + (size_t)(s - 1) * V, V);
        r->toks[s] = tok;
        q = (k3c_fwd_req){.ids = &r->toks[s], .n = 1, .pos = pos, .block_table = ta, .slot = 0,
                          .logits = K3C_LOGITS_LAST};
        if (stock && k3c_forward_step(f, kv, ks, &q, 1, r->stock_dec + (size_t)s * V, NULL) != K3C_OK)
            return k3c_error_context("the stock decode step %d: ", s);
        r->ids[s] = -1;
        q.block_table = tb;
        q.slot = 1;
        if (exec && exec_step(ex, &q, r->exec_dec + (size_t)s * V, ids_step(s) ? &r->ids[s] : NULL) != K3C_OK)
            return k3c_error_context("the executor's decode step %d: ", s);
    }
    return K3C_OK;
}

static int run_rank(tpx_rank *r) {
    const k3c_config *c = &r->m->config;
    k3c_backend *be = r->be;
    int ctx = NP + ND + NQ, nbr = (ctx + BS - 1) / BS;
    k3c_backend_cuda_set_exact(be, r->exact);
    k3c_forward_options o = {.max_rows = NP, .max_segs = 2, .max_context = ctx + 1, .block_size = BS, .tp = r->comm};
    k3c_forward *f = NULL;
    k3c_kv_cache kv = {0};
    k3c_kda_slots ks = {0};
    k3c_decode_cuda *x = NULL;
    const k3c_decode_executor *ex = NULL;
    int32_t ta[64], tb[64];
    float *scratch = malloc(2 * (size_t)r->V * sizeof(float));
    int rc = scratch ? K3C_OK : k3c_errorf("out of memory");
    if (rc == K3C_OK) rc = k3c_forward_create(be, r->m, &o, &f);
    if (rc == K3C_OK) rc = k3c_kv_cache_init(&kv, be, c, 2 * nbr + 1, BS);
    if (rc == K3C_OK) rc = k3c_kda_slots_init(&ks, be, c, 2, NQ, 2);
    if (rc == K3C_OK)
        for (int i = 0; i < nbr; i++) ta[i] = k3c_kv_cache_take(&kv), tb[i] = k3c_kv_cache_take(&kv);
    if (rc == K3C_OK && r->size > 1 && !r->stock_only) {
        /* the executor over the same communicator; the two shapes of the test captured now, before any
         * collective (capture and its instantiation run nothing on the device) */
        k3c_decode_env env = {.m = r->m, .be = be, .kv = &kv, .ks = &ks, .max_requests = 1, .max_rows = NP,
                              .max_context = ctx + 1, .block_size = BS, .q_max = NQ,
                              .max_blocks_per_request = (ctx + 1 + BS - 1) / BS, .tp = r->comm};
        rc = k3c_decode_cuda_build(&env, r->rank, r->size, &x);
        if (rc == K3C_OK) {
            ex = k3c_decode_cuda_executor(x);
            if (!ex->plan_table.tp_prepared || ex->plan_table.world_size != r->size)
                rc = k3c_errorf("the executor over the mailbox is not prepared for TP (tp_prepared %d, world size %d)",
                                ex->plan_table.tp_prepared, ex->plan_table.world_size);
        }
        if (rc == K3C_OK) rc = k3c_decode_cuda_prepare_kv(x, 0);
        if (rc == K3C_OK) rc = k3c_decode_cuda_capture(x, 1, 1);
        if (rc == K3C_OK) rc = k3c_decode_cuda_capture(x, NQ, NQ);
    }
    if (r->sh) { /* every rank gets here; steps only when every rank's setup succeeded */
        r->sh->setup_rc[r->rank] = rc;
        pthread_barrier_wait(&r->sh->setup);
        for (int k = 0; k < r->sh->size && rc == K3C_OK; k++)
            if (r->sh->setup_rc[k] != K3C_OK) rc = k3c_errorf("rank %d's setup failed", k);
    }
    if (rc == K3C_OK) rc = rank_steps(r, f, &kv, &ks, ex, ta, tb, scratch);
    if (x) k3c_decode_cuda_counts(x, &r->replays);
    if (x) k3c_decode_cuda_tp_fusions(x, &r->fused_rowpar, &r->fused_norm, &r->fused_round);
    if (rc != K3C_OK) {
        snprintf(r->err, sizeof r->err, "rank %d of %d: %s", r->rank, r->size, k3c_error_message());
        if (r->comm) r->comm->abort(r->comm); /* the other ranks fail at once instead of waiting */
    }
    if (r->sh) pthread_barrier_wait(&r->sh->done); /* no rank frees (a device-wide wait) while a peer still calls */
    k3c_decode_cuda_free(x);
    k3c_kda_slots_release(&ks, be);
    k3c_kv_cache_release(&kv, be);
    k3c_forward_free(f);
    free(scratch);
    return rc;
}

static void *rank_thread(void *p) {
    tpx_rank *r = p;
    r->rc = run_rank(r);
    return NULL;
}

static void free_rank(tpx_rank *r) {
    free(r->stock_dec), free(r->exec_dec), free(r->stock_ver), free(r->exec_ver);
    r->stock_dec = r->exec_dec = r->stock_ver = r->exec_ver = NULL;
}

static int alloc_rank(tpx_rank *r) {
    size_t V = (size_t)r->V;
    r->stock_dec = malloc(ND * V * 4), r->exec_dec = malloc(ND * V * 4);
    r->stock_ver = malloc(NQ * V * 4), r->exec_ver = malloc(NQ * V * 4);
    if (!r->stock_dec || !r->exec_dec || !r->stock_ver || !r->exec_ver) return k3c_errorf("out of memory");
    poison_f32(r->stock_dec, ND * V), poison_f32(r->exec_dec, ND * V);
    poison_f32(r->stock_ver, NQ * V), poison_f32(r->exec_ver, NQ * V);
    return K3C_OK;
}

/* World size 1, the stock forward fed `forced` (bf16, or the f32 function with exact). */
static int run_ws1(const k3c_model *m, int exact, const int32_t *prompt, const int32_t *vtoks,
                   const int32_t *forced, int V, tpx_rank *r) {
    *r = (tpx_rank){.m = m, .rank = 0, .size = 1, .exact = exact, .prompt = prompt, .forced = forced,
                    .vtoks = vtoks, .V = V};
    K3C_TRY(alloc_rank(r));
    if (!(r->be = k3c_backend_cuda_create(0))) return K3C_ERR;
    int rc = run_rank(r);
    r->be->destroy(r->be);
    if (rc != K3C_OK) return k3c_errorf("world size 1%s: %s", exact ? " (f32)" : "", r->err);
    return K3C_OK;
}

/* How a TP run goes: both requests over one mailbox (the default); or, for a diagnosis of the stock forward's
 * stall over the mailbox (K3C_TEST_TP_EXEC_REF=staged), the executor's request alone over the mailbox and the
 * stock forward's alone over the staged communicator (comm/staged.c: the same rank-order f32 sums, so the
 * same bits; docs/PARALLEL.md), fed the executor run's tokens. */
enum { RUN_BOTH, RUN_EXEC_ONLY, RUN_STOCK_STAGED };

/* tp ranks of the shards, a thread each. */
static int run_tp(k3c_model **sh, int tp, int mode, const int32_t *prompt, const int32_t *vtoks,
                  const int32_t *forced, int V, tpx_rank *runs) {
    k3c_backend *bes[8] = {0};
    k3c_comm *mbx[8] = {0};
    void *streams[8] = {0};
    int devices[8] = {0};
    for (int k = 0; k < tp; k++) {
        if (!(bes[k] = k3c_backend_cuda_create(0))) {
            for (int j = 0; j < k; j++) bes[j]->destroy(bes[j]);
            return K3C_ERR;
        }
        streams[k] = k3c_backend_cuda_stream(bes[k]);
    }
    /* slots for the largest call of either path: the prompt's NP rows of hidden or routed-latent sums and of
     * the LM head's parts (the executor's PREPARED_MAX rows are fewer) */
    const k3c_config *c = &sh[0]->config;
    size_t w = (size_t)c->hidden_size, Rin = (size_t)k3c_config_expert_in(c), Vl = (size_t)c->vocab_size;
    if (Rin > w) w = Rin;
    if (Vl > w) w = Vl;
    size_t rows = NP > K3C_PREPARED_MAX ? NP : K3C_PREPARED_MAX;
    k3c_comm_mailbox_options mo = {.cap = rows * w, .timeout_ms = MBX_TIMEOUT_MS, .threads = 1};
    k3c_comm_group *grp = NULL;
    int made = mode == RUN_STOCK_STAGED ? k3c_comm_group_create(tp, MBX_TIMEOUT_MS, &grp)
                                        : k3c_comm_mailbox_create(tp, devices, streams, &mo, mbx);
    for (int k = 0; k < tp && made == K3C_OK && grp; k++)
        made = k3c_comm_staged_create(grp, k, 0, streams[k], MBX_TIMEOUT_MS, &mbx[k]);
    if (made != K3C_OK) {
        for (int k = 0; k < tp; k++)
            if (mbx[k]) mbx[k]->free(mbx[k]);
        if (grp) k3c_comm_group_free(grp);
        for (int k = 0; k < tp; k++) bes[k]->destroy(bes[k]);
        return K3C_ERR;
    }
    tpx_shared shared = {.size = tp};
    pthread_barrier_init(&shared.setup, NULL, (unsigned)tp);
    pthread_barrier_init(&shared.done, NULL, (unsigned)tp);
    int rc = K3C_OK;
    for (int k = 0; k < tp; k++) {
        runs[k] = (tpx_rank){.m = sh[k], .be = bes[k], .comm = mbx[k], .sh = &shared, .rank = k, .size = tp,
                             .exact = 0, .exec_only = mode == RUN_EXEC_ONLY, .stock_only = mode == RUN_STOCK_STAGED,
                             .prompt = prompt, .forced = forced, .vtoks = vtoks, .V = V};
        if (alloc_rank(&runs[k]) != K3C_OK) rc = K3C_ERR;
    }
    if (rc == K3C_OK) {
        pthread_t th[8];
        for (int k = 0; k < tp; k++) pthread_create(&th[k], NULL, rank_thread, &runs[k]);
        for (int k = 0; k < tp; k++) pthread_join(th[k], NULL);
    }
    pthread_barrier_destroy(&shared.setup);
    pthread_barrier_destroy(&shared.done);
    for (int k = 0; k < tp; k++) mbx[k]->free(mbx[k]); /* before the backends' streams go */
    for (int k = 0; k < tp; k++) bes[k]->destroy(bes[k]);
    K3C_TRY(rc);
    int first = -1;
    for (int k = 0; k < tp; k++)
        if (runs[k].rc != K3C_OK) {
            if (first < 0) first = k;
            else printf("INFO tp %d: also failed: %s\n", tp, runs[k].err); /* a peer's own reason, beside the first */
        }
    if (first >= 0) return k3c_errorf("tp %d: %s", tp, runs[first].err);
    return K3C_OK;
}

/* The worst row's rel L2 (NaN counts as inf). */
static double worst_row(const float *a, const float *b, int rows, int V) {
    double w = 0;
    for (int i = 0; i < rows; i++) {
        double e = rel_l2_f32f32(a + (size_t)i * V, b + (size_t)i * V, (size_t)V);
        if (!(e <= w)) w = e == e ? e : INFINITY;
    }
    return w;
}

/* The checks of one TP run: the executor's rows (xr) against the stock TP forward's (sr: the same ranks in
 * the default run; the staged run in the diagnosis), every rank against rank 0, and world size 1. */
static void check_run(const char *name, int tp, const tpx_rank *xr, const tpx_rank *sr, const tpx_rank *one,
                      const tpx_rank *fn, int V, double tol) {
    size_t DV = (size_t)ND * V, QV = (size_t)NQ * V;
    long rows_bad = 0, ids_bad = 0, ids_n = 0;
    for (int k = 0; k < tp; k++) {
        for (int s = 0; s < ND; s++) {
            const float *st = sr[k].stock_dec + (size_t)s * V;
            if (ids_step(s)) {
                ids_n++;
                ids_bad += xr[k].ids[s] != k3c_greedy_token(st, V); /* the order the ids path follows */
            } else {
                rows_bad += memcmp(st, xr[k].exec_dec + (size_t)s * V, (size_t)V * 4) != 0;
            }
        }
        rows_bad += memcmp(sr[k].stock_ver, xr[k].exec_ver, QV * 4) != 0 ? NQ : 0;
        CHECKF(xr[k].replays >= ND + 1, "%s tp %d rank %d: %ld graph replays for %d steps", name, tp, k, xr[k].replays,
               ND + 1);
        /* the fused TP launches are the ones taken (both captured shapes have T <= 8 rows: every layer's
         * attention o_proj, and a dense MLP's down, is a GEMV whose epilogue pushes into the peers' slots;
         * every latent-normed MoE tail reduces, rounds and norms in one mailbox launch; every other rounded
         * sum is rounded in its one-shot's launch) */
        const k3c_config *c = &xr[k].m->config;
        long moe = 0, dense = 0;
        for (int l = 0; l < c->num_layers; l++) moe += c->layer_is_moe[l], dense += !c->layer_is_moe[l];
        long want_rowpar = 2 * (c->num_layers + dense);
        int latent_norm = c->routed_expert_hidden_size > 0 && c->latent_moe_use_norm;
        long want_norm = latent_norm ? 2 * moe : 0;
        /* rounded one-shots: the shared expert's sum, and the routed one where no latent norm takes it */
        long want_round = 2 * moe * ((c->num_shared_experts > 0) + !latent_norm);
        CHECKF(xr[k].fused_rowpar == want_rowpar && xr[k].fused_norm == want_norm && xr[k].fused_round == want_round,
               "%s tp %d rank %d: %ld fused row-parallel products, %ld fused MoE reduce + norms, %ld rounded one-shots "
               "recorded, want %ld, %ld and %ld (2 captured shapes)", name, tp, k, xr[k].fused_rowpar,
               xr[k].fused_norm, xr[k].fused_round, want_rowpar, want_norm, want_round);
    }
    CHECKF(rows_bad == 0, "%s tp %d: %ld executor rows differ bitwise from the stock TP forward's", name, tp, rows_bad);
    CHECKF(ids_bad == 0, "%s tp %d: %ld of %ld greedy ids differ from the stock logits' arg-max", name, tp, ids_bad,
           ids_n);
    for (int k = 1; k < tp; k++) {
        int same = !memcmp(sr[k].stock_dec, sr[0].stock_dec, DV * 4) && !memcmp(sr[k].stock_ver, sr[0].stock_ver, QV * 4) &&
                   !memcmp(xr[k].ids, xr[0].ids, sizeof xr[0].ids) && !memcmp(xr[k].exec_ver, xr[0].exec_ver, QV * 4);
        for (int s = 0; s < ND && same; s++)
            same = ids_step(s) || !memcmp(xr[k].exec_dec + (size_t)s * V, xr[0].exec_dec + (size_t)s * V, (size_t)V * 4);
        CHECKF(same, "%s tp %d: rank %d's logits differ from rank 0's", name, tp, k);
    }
    /* world size 1, fed the same tokens: the executor's rows (its ids-path steps: the stock rows, bitwise the
     * same function) and the verify rows */
    float *ex = malloc(DV * 4);
    if (!ex) return;
    for (int s = 0; s < ND; s++)
        memcpy(ex + (size_t)s * V, (ids_step(s) ? sr[0].stock_dec : xr[0].exec_dec) + (size_t)s * V, (size_t)V * 4);
    double noise = fmax(worst_row(one->stock_dec, fn->stock_dec, ND, V), worst_row(one->stock_ver, fn->stock_ver, NQ, V));
    double vs1 = fmax(worst_row(ex, one->stock_dec, ND, V), worst_row(xr[0].exec_ver, one->stock_ver, NQ, V));
    double vsf = fmax(worst_row(ex, fn->stock_dec, ND, V), worst_row(xr[0].exec_ver, fn->stock_ver, NQ, V));
    free(ex);
    printf("INFO tp_exec %s tp %d: executor rows bitwise the stock TP forward's%s (%d decode, %d verify, %ld ids; "
           "%ld fused row-parallel products, %ld fused MoE reduce + norms, %ld rounded one-shots recorded), ranks "
           "bitwise; vs world size 1 worst row rel L2 %.3g, vs the f32 function %.3g (world size 1's own %.3g)\n",
           name, tp, xr == sr ? "" : " over the staged communicator", ND - (int)(ids_n / tp), NQ, ids_n / tp,
           xr[0].fused_rowpar, xr[0].fused_norm, xr[0].fused_round, vs1, vsf, noise);
    printf("METRIC tp%d_exec_%-19s rel_l2 %8.1e %10.3e\n", tp, name, tol * noise, fmax(vs1, vsf));
    CHECKF(vs1 <= tol * noise && vsf <= tol * noise,
           "%s tp %d: executor %.3g from world size 1's bf16 and %.3g from the f32 function, world size 1's own %.3g "
           "(x %.1f allowed)", name, tp, vs1, vsf, noise, tol);
}

static void check_tp_exec(const char *name, int slice_layers) {
    k3c_config c;
    int rc = slice_layers ? slice_config(slice_layers, &c) : tp_config(0, 1, &c);
    CHECK_OK(rc);
    if (rc != K3C_OK) return;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/gtpx_%s", test_tmpdir(), name);
    uint64_t seed = test_seed() ^ k3c_hash_str(name);
    double t0 = now_s();
    rc = k3c_synth_write(&c, NULL, seed, dir);
    int V = c.vocab_size;
    k3c_config_free(&c);
    CHECK_OK(rc);
    if (rc != K3C_OK) return;
    k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    printf("INFO tp_exec %s: %.2f GB synthesized and mapped in %.1f s\n", name, m->weight_bytes / 1e9, now_s() - t0);
    int32_t prompt[NP], vtoks[NQ];
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x7a11);
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    for (int i = 0; i < NQ; i++) vtoks[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    const char *ref_env = getenv("K3C_TEST_TP_EXEC_REF");
    int staged_ref = ref_env && strcmp(ref_env, "staged") == 0;
    if (staged_ref) printf("INFO tp_exec %s: the stock reference over the staged communicator (K3C_TEST_TP_EXEC_REF)\n", name);
    for (int tp = 2; tp <= 4; tp *= 2) {
        k3c_model *sh[8] = {0};
        tpx_rank runs[8], ref[8], one, fn;
        memset(runs, 0, sizeof runs);
        memset(ref, 0, sizeof ref);
        memset(&one, 0, sizeof one);
        memset(&fn, 0, sizeof fn);
        int failed = 0;
        for (int k = 0; k < tp && !failed; k++) {
            rc = k3c_model_shard_tp(m, k, tp, &sh[k]);
            CHECK_OK(rc);
            failed = rc != K3C_OK;
        }
        double t1 = now_s();
        if (!failed) {
            rc = run_tp(sh, tp, staged_ref ? RUN_EXEC_ONLY : RUN_BOTH, prompt, vtoks, NULL, V, runs);
            if (rc == K3C_OK && staged_ref) rc = run_tp(sh, tp, RUN_STOCK_STAGED, prompt, vtoks, runs[0].toks, V, ref);
            CHECKF(rc == K3C_OK, "%s: %s", name, k3c_error_message());
            failed = rc != K3C_OK;
        }
        double t_tp = now_s() - t1;
        if (!failed) { /* world size 1, bf16 and the f32 function, fed rank 0's tokens */
            rc = run_ws1(m, 0, prompt, vtoks, runs[0].toks, V, &one);
            if (rc == K3C_OK) rc = run_ws1(m, 1, prompt, vtoks, runs[0].toks, V, &fn);
            CHECKF(rc == K3C_OK, "%s: %s", name, k3c_error_message());
            failed = rc != K3C_OK;
        }
        if (!failed) {
            check_run(name, tp, runs, staged_ref ? ref : runs, &one, &fn, V, 2.0);
            printf("INFO tp_exec %s tp %d: %.2f s for the ranks' %d steps each\n", name, tp, t_tp, 2 * (ND + 1) + 2);
        }
        for (int k = 0; k < tp; k++) {
            free_rank(&runs[k]);
            free_rank(&ref[k]);
            k3c_model_shard_free(sh[k]);
        }
        free_rank(&one);
        free_rank(&fn);
        if (failed) break;
    }
    k3c_model_free(m);
    /* the k3-slice's ~10 GB off the scratch disk now (test_gpu_tp.c synthesizes its own in the same process) */
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (slice_layers && system(cmd) != 0) printf("INFO tp_exec %s: could not remove %s\n", name, dir);
}

TEST(gpu_tp_exec_k3_bf16) { check_tp_exec("k3_bf16", 0); }
/* ~10 GB synthesized into the test's scratch folder (TMPDIR), as much GPU memory at world size 1 */
TEST(gpu_tp_exec_k3slice_4layers) { check_tp_exec("k3slice_4layers_bf16", 4); }
