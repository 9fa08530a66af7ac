/* The executor's steps at TP through the engine's rank group (runtime/engine_ranks.c), on CPU ranks with a
 * fake executor on every rank (k3c_ranks_test_executor): it plans graphs like the CUDA one (uncaptured shapes
 * stock, captured by the engine's policy, the second time a shape is planned) and runs a step as the stock
 * forward over the rank's shard, so its logits are bitwise the stock TP forward's. What is checked is the
 * routing and the messages: rank 0's plan reaches every rank (every rank runs the same steps on its executor,
 * counted), every rank captures the same shapes at the same time (a capture message, the outcome agreed), a
 * rank that cannot capture leaves the shape stock on every rank without failing the group, warmup captures on
 * every rank, a KDA snapshot reserve (device memory on the followers) between executor steps is followed by
 * the ranks' barrier, and the logits stay bitwise those of the stock ranks, every rank equal to rank 0 every
 * step. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "decode/executor.h"
#include "decode/prepared.h"
#include "decode/plan.h"
#include "k3c.h"
#include "model/synth.h"
#include "runtime/engine_internal.h"
#include "runtime/engine_ranks.h"
#include "test.h"
#include "tp_config.h"
#include "util/error.h"
#include "util/rng.h"

enum { NP = 20, ND = 6, MAXR = 8 };

/* One rank's fake executor. */
typedef struct fake {
    k3c_decode_executor x;
    k3c_engine *e;
    int rank;
    unsigned char captured[K3C_PREPARED_MAX + 1][K3C_PREPARED_Q_MAX + 1];
    int captures, steps;
} fake;

typedef struct fakes {
    pthread_mutex_t mu;
    fake f[MAXR];
    int made;
    int refuse_rank; /* this rank's captures fail (-1: none) */
} fakes;

static const int batches[] = {1, 2, 4};

static int fake_captured(void *ctx, int rows, int q) {
    fake *f = ctx;
    return rows >= 0 && rows <= K3C_PREPARED_MAX && q >= 0 && q <= K3C_PREPARED_Q_MAX && f->captured[rows][q];
}

static fakes *the_fakes;

static int fake_capture(void *ctx, int rows, int q) {
    fake *f = ctx;
    if (f->rank == the_fakes->refuse_rank) return k3c_errorf("fake executor: rank %d refuses to capture", f->rank);
    if (rows < 1 || rows > K3C_PREPARED_MAX || q < 1 || q > K3C_PREPARED_Q_MAX)
        return k3c_errorf("fake executor: shape (%d, %d)", rows, q);
    if (!f->captured[rows][q]) f->captures++;
    f->captured[rows][q] = 1;
    return K3C_OK;
}

static int fake_step(void *ctx, const k3c_plan *p, const k3c_fwd_req *reqs, int n, float *logits, int32_t *ids,
                     float *aux) {
    fake *f = ctx;
    if (ids) return k3c_errorf("fake executor: rank %d asked for greedy ids at TP", f->rank);
    if (!f->captured[p->rows][p->q]) return k3c_errorf("fake executor: rank %d: shape (%d, %d) not captured", f->rank,
                                                       p->rows, p->q);
    f->steps++;
    k3c_engine_view v;
    k3c_engine_view_get(f->e, &v);
    return k3c_forward_step(v.fwd, v.kv, v.ks, reqs, n, logits, aux);
}

static const k3c_decode_executor *make_fake(k3c_engine *e, void *user) {
    fakes *fs = user;
    int r = k3c_engine_rank(e);
    if (r < 0 || r >= MAXR) return NULL;
    fake *f = &fs->f[r];
    memset(f, 0, sizeof *f);
    f->e = e;
    f->rank = r;
    f->x = (k3c_decode_executor){.plan_table = {.batches = batches, .num_batches = 3, .kv_prepared = 1,
                                                .needs_graphs = 1, .captured = fake_captured, .captured_ctx = f,
                                                .world_size = k3c_engine_world_size(e), .tp_prepared = 1},
                                 .ctx = f, .step = fake_step, .capture = fake_capture};
    pthread_mutex_lock(&fs->mu);
    fs->made++;
    pthread_mutex_unlock(&fs->mu);
    return &f->x;
}

typedef struct xrun {
    float *lg; /* [NP + ND, V] the prompt's rows, then each decode step's */
    k3c_engine_stats st;
    long checked;
} xrun;

/* tp ranks (f32), the prompt then ND greedy decode steps; with the fakes on every rank when fs is given. */
static int xrun_do(k3c_model *m, int tp, fakes *fs, int warmup, const int32_t *prompt, int V, xrun *r) {
    memset(r, 0, sizeof *r);
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = tp;
    o.exact_f32 = 1;
    o.layout.tp = tp;
    o.max_requests = 1;
    o.max_rows = NP;
    o.max_context = NP + ND + 1;
    o.q_max = 2;
    o.rank_timeout_ms = 30000;
    the_fakes = fs;
    k3c_ranks_test_executor(fs ? make_fake : NULL, fs);
    k3c_engine *e = NULL;
    int rc = k3c_engine_create(m, &o, &e);
    k3c_ranks_test_executor(NULL, NULL);
    K3C_TRY(rc);
    k3c_engine_check_ranks(e, 1);
    int id = -1;
    r->lg = malloc(sizeof(float) * (size_t)(NP + ND) * V);
    if (!r->lg) rc = k3c_errorf("out of memory");
    if (rc == K3C_OK) poison_f32(r->lg, (size_t)(NP + ND) * V);
    if (rc == K3C_OK && warmup) rc = k3c_engine_warmup(e);
    if (rc == K3C_OK) rc = k3c_request_open(e, &id);
    k3c_step_item it = {.request = id, .tokens = prompt, .n = NP, .all_logits = 1};
    if (rc == K3C_OK) rc = k3c_engine_step(e, &it, 1, r->lg);
    for (int s = 0; s < ND && rc == K3C_OK; s++) {
        /* a follower's device allocation between executor steps: the step after it waits at a barrier */
        if (s == 3) rc = k3c_engine_snapshots_reserve(e, 2);
        if (rc != K3C_OK) break;
        const float *prev = r->lg + (size_t)(NP - 1 + s) * V;
        int32_t tok = k3c_greedy_token(prev, V);
        k3c_step_item d = {.request = id, .tokens = &tok, .n = 1};
        rc = k3c_engine_step(e, &d, 1, r->lg + (size_t)(NP + s) * V);
    }
    k3c_engine_stats_get(e, &r->st);
    r->checked = k3c_engine_ranks_checked(e);
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    if (id >= 0) k3c_request_close(e, id);
    k3c_engine_free(e); /* joins the followers: their fakes' counts are final after it */
    return rc == K3C_OK ? K3C_OK : k3c_errorf("tp %d: %s", tp, msg);
}

TEST(ranks_executor_steps_on_every_rank) {
    k3c_config c;
    CHECK_OK(tp_config(0, 0, &c));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ranks_exec_k3", test_tmpdir());
    int rc = k3c_synth_write(&c, NULL, test_seed(), dir);
    k3c_config_free(&c);
    CHECK_OK(rc);
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int V = info.vocab_size;
    int32_t prompt[NP];
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xe8ec);
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    static fakes fs;
    pthread_mutex_init(&fs.mu, NULL);
    for (int tp = 2; tp <= 4; tp *= 2) {
        xrun stock, ex;
        CHECK_OK(xrun_do(m, tp, NULL, 0, prompt, V, &stock));
        /* the policy: decode step 1 plans stock, step 2 captures (1, 1) on every rank, then every step runs on
         * every rank's executor */
        fs.made = 0;
        fs.refuse_rank = -1;
        rc = xrun_do(m, tp, &fs, 0, prompt, V, &ex);
        CHECKF(rc == K3C_OK, "tp %d with the executor: %s", tp, k3c_error_message());
        int bitwise = !memcmp(ex.lg, stock.lg, sizeof(float) * (size_t)(NP + ND) * V);
        int counts_ok = fs.made == tp;
        for (int k = 0; k < tp && counts_ok; k++) counts_ok = fs.f[k].steps == ND - 1 && fs.f[k].captures == 1;
        printf("    tp %d: %ld of %ld steps on the executor; every rank's fake ran %d steps and captured %d shape(s); "
               "logits %s the stock ranks'; %ld steps compared across the ranks\n", tp, ex.st.executor_steps,
               ex.st.steps, fs.f[tp - 1].steps, fs.f[tp - 1].captures, bitwise ? "bitwise" : "NOT bitwise",
               ex.checked);
        CHECKF(ex.st.executor_steps == ND - 1 && counts_ok, "tp %d: rank 0 counted %ld executor steps, the fakes "
               "(made %d) ran / captured rank by rank differently from %d / 1", tp, ex.st.executor_steps, fs.made,
               ND - 1);
        CHECKF(bitwise && ex.checked == ex.st.steps, "tp %d: logits bitwise %d, %ld of %ld steps checked", tp, bitwise,
               ex.checked, ex.st.steps);
        free(ex.lg);
        /* a rank that cannot capture: the shape stays stock on every rank, the group goes on */
        fs.made = 0;
        fs.refuse_rank = tp - 1;
        rc = xrun_do(m, tp, &fs, 0, prompt, V, &ex);
        CHECKF(rc == K3C_OK, "tp %d, rank %d refusing captures: %s", tp, tp - 1, k3c_error_message());
        int none = 1;
        for (int k = 0; k < tp; k++) none = none && fs.f[k].steps == 0;
        bitwise = !memcmp(ex.lg, stock.lg, sizeof(float) * (size_t)(NP + ND) * V);
        CHECKF(ex.st.executor_steps == 0 && none && bitwise, "tp %d, a rank refusing captures: %ld executor steps, "
               "fakes idle %d, bitwise %d", tp, ex.st.executor_steps, none, bitwise);
        free(ex.lg);
        /* warmup: every prepared shape captured on every rank before the first step, then every decode step on
         * the executor */
        fs.made = 0;
        fs.refuse_rank = -1;
        rc = xrun_do(m, tp, &fs, 1, prompt, V, &ex);
        CHECKF(rc == K3C_OK, "tp %d warmed up: %s", tp, k3c_error_message());
        int same = 1;
        for (int k = 1; k < tp; k++)
            same = same && !memcmp(fs.f[k].captured, fs.f[0].captured, sizeof fs.f[0].captured);
        bitwise = !memcmp(ex.lg, stock.lg, sizeof(float) * (size_t)(NP + ND) * V);
        printf("    tp %d warmed up: %d shapes captured on every rank, %ld of %ld steps on the executor\n", tp,
               fs.f[0].captures, ex.st.executor_steps, ex.st.steps);
        CHECKF(same && fs.f[0].captures >= 1 && fs.f[tp - 1].steps == ND && ex.st.executor_steps == ND && bitwise,
               "tp %d warmed up: captures alike %d (%d), follower steps %d, executor steps %ld, bitwise %d", tp, same,
               fs.f[0].captures, fs.f[tp - 1].steps, ex.st.executor_steps, bitwise);
        free(ex.lg);
        free(stock.lg);
    }
    k3c_free(m);
}

/* ---- DEP: each DP rank's own part on its executor (runtime/engine.c k3c_engine_dp_part) ----
 * A CPU engine of DP 2 + EP 2 (one thread a rank) with a fake DEP executor on every rank: no batches,
 * wide_decode, wide_max 64 (the CUDA one's table at DEP, decode/executor_cuda.h), whose step checks that it is
 * given a wide step of the rank's own decode or verify requests, with logits and no ids, and runs it as the
 * stock forward over the rank's shard. Three requests (placed over the DP ranks by the engine), a prompt step,
 * then ND decode steps of every request and ND more of only the requests on DP rank 0 (DP rank 1's dummy steps:
 * the stock forward's, never the executor's); then one verify step of every request. Every logits row bitwise
 * the stock engine's (no fakes), every rank's fake ran exactly its own decode and verify parts. */
typedef struct dep_fake {
    k3c_decode_executor x;
    k3c_engine *e;
    int rank, steps, bad;
} dep_fake;

typedef struct dep_fakes {
    dep_fake f[MAXR];
    int made;
    pthread_mutex_t mu;
} dep_fakes;

static int dep_fake_step(void *ctx, const k3c_plan *p, const k3c_fwd_req *reqs, int n, float *logits, int32_t *ids,
                         float *aux) {
    dep_fake *f = ctx;
    int rows = 0;
    for (int i = 0; i < n; i++) {
        rows += reqs[i].n;
        if (reqs[i].n != p->q || (reqs[i].verify != 0) != (p->q > 1)) f->bad++;
    }
    if (p->route != K3C_ROUTE_WIDE || ids || !logits || n < 1 || rows != p->rows) f->bad++;
    f->steps++;
    k3c_engine_view v;
    k3c_engine_view_get(f->e, &v);
    return k3c_forward_step(v.fwd, v.kv, v.ks, reqs, n, logits, aux);
}

static const k3c_decode_executor *make_dep_fake(k3c_engine *e, void *user) {
    dep_fakes *fs = user;
    int r = k3c_engine_rank(e);
    if (r < 0 || r >= MAXR) return NULL;
    dep_fake *f = &fs->f[r];
    memset(f, 0, sizeof *f);
    f->e = e;
    f->rank = r;
    f->x = (k3c_decode_executor){.plan_table = {.batches = batches, .num_batches = 0, .wide_max = 64,
                                                .kv_prepared = 1, .world_size = 1, .tp_prepared = 1,
                                                .wide_decode = 1},
                                 .ctx = f, .step = dep_fake_step};
    pthread_mutex_lock(&fs->mu);
    fs->made++;
    pthread_mutex_unlock(&fs->mu);
    return &f->x;
}

enum { DEP_REQ = 3, DEP_Q = 2 };
#define DEP_ROWS (DEP_REQ * NP + (2 * ND + 1) * DEP_REQ * DEP_Q)

/* The run: logits rows of every step in order into lg; dp_of[i] the DP rank of request i. */
static int dep_run(k3c_model *m, dep_fakes *fs, const int32_t (*prompt)[NP], int V, float *lg, int *dp_of,
                   k3c_engine_stats *st) {
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 2;
    o.exact_f32 = 1;
    o.layout.dp = 2;
    o.layout.ep = 2;
    o.max_requests = DEP_REQ;
    o.max_rows = DEP_REQ * NP;
    o.max_context = NP + 2 * ND + DEP_Q + 1;
    o.q_max = DEP_Q;
    o.rank_timeout_ms = 30000;
    k3c_ranks_test_executor(fs ? make_dep_fake : NULL, fs);
    k3c_engine *e = NULL;
    int rc = k3c_engine_create(m, &o, &e);
    k3c_ranks_test_executor(NULL, NULL);
    K3C_TRY(rc);
    int id[DEP_REQ];
    size_t at = 0;
    for (int i = 0; i < DEP_REQ && rc == K3C_OK; i++) rc = k3c_request_open(e, &id[i]);
    k3c_step_item it[DEP_REQ];
    for (int i = 0; i < DEP_REQ; i++) it[i] = (k3c_step_item){.request = id[i], .tokens = prompt[i], .n = NP, .all_logits = 1};
    if (rc == K3C_OK) rc = k3c_engine_step(e, it, DEP_REQ, lg);
    at += (size_t)DEP_REQ * NP;
    for (int i = 0; i < DEP_REQ && rc == K3C_OK; i++) dp_of[i] = k3c_engine_request_dp(e, id[i]);
    int32_t tok[DEP_REQ][DEP_Q];
    for (int i = 0; i < DEP_REQ; i++) tok[i][0] = k3c_greedy_token(lg + (size_t)(i * NP + NP - 1) * V, V);
    for (int s = 0; s < 2 * ND && rc == K3C_OK; s++) {
        int n = 0, who[DEP_REQ];
        for (int i = 0; i < DEP_REQ; i++) {
            if (s >= ND && dp_of[i] != 0) continue; /* DP rank 1 idle: its dummy steps */
            it[n] = (k3c_step_item){.request = id[i], .tokens = tok[i], .n = 1};
            who[n++] = i;
        }
        rc = k3c_engine_step(e, it, n, lg + at * V);
        for (int k = 0; k < n && rc == K3C_OK; k++) tok[who[k]][0] = k3c_greedy_token(lg + (at + k) * V, V);
        at += n;
    }
    for (int i = 0; i < DEP_REQ; i++) { /* a verify of DEP_Q tokens each */
        tok[i][1] = (tok[i][0] + 5) % V;
        it[i] = (k3c_step_item){.request = id[i], .tokens = tok[i], .n = DEP_Q, .verify = 1};
    }
    if (rc == K3C_OK) rc = k3c_engine_step(e, it, DEP_REQ, lg + at * V);
    k3c_engine_stats_get(e, st);
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    for (int i = 0; i < DEP_REQ; i++) k3c_request_close(e, id[i]);
    k3c_engine_free(e);
    return rc == K3C_OK ? K3C_OK : k3c_errorf("dep 2: %s", msg);
}

TEST(ranks_dep_parts_on_each_ranks_executor) {
    k3c_config c;
    CHECK_OK(tp_config(0, 0, &c));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ranks_exec_dep_k3", test_tmpdir());
    int rc = k3c_synth_write(&c, NULL, test_seed() ^ 0xdeb2, dir);
    k3c_config_free(&c);
    CHECK_OK(rc);
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    if (!m) return;
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int V = info.vocab_size;
    int32_t prompt[DEP_REQ][NP];
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xde9);
    for (int i = 0; i < DEP_REQ; i++)
        for (int t = 0; t < NP; t++) prompt[i][t] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    size_t n = (size_t)DEP_ROWS * V;
    float *ls = malloc(sizeof(float) * n), *lx = malloc(sizeof(float) * n);
    int dps[DEP_REQ], dpx[DEP_REQ];
    k3c_engine_stats sts, stx;
    poison_f32(ls, n);
    poison_f32(lx, n);
    static dep_fakes fs;
    pthread_mutex_init(&fs.mu, NULL);
    fs.made = 0;
    CHECK_OK(dep_run(m, NULL, (const int32_t(*)[NP])prompt, V, ls, dps, &sts));
    rc = dep_run(m, &fs, (const int32_t(*)[NP])prompt, V, lx, dpx, &stx);
    CHECKF(rc == K3C_OK, "dep 2 with the fakes: %s", k3c_error_message());
    /* the rows written: the prompts, the decode steps' and the verify's (the rest stays poisoned in both) */
    int on[2] = {0, 0};
    for (int i = 0; i < DEP_REQ; i++) on[dps[i] == 1]++;
    size_t rows = (size_t)DEP_REQ * NP + (size_t)ND * DEP_REQ + (size_t)ND * on[0] + (size_t)DEP_REQ * DEP_Q;
    int nan = 0;
    for (size_t i = 0; i < rows * V && !nan; i++) nan = lx[i] != lx[i];
    int bitwise = !memcmp(ls, lx, sizeof(float) * rows * V) && !memcmp(dps, dpx, sizeof dps);
    /* DP rank 0's part: 2 ND decode steps and the verify; DP rank 1's: ND and the verify (if it has requests) */
    int want[2] = {on[0] ? 2 * ND + 1 : 0, on[1] ? ND + 1 : 0};
    printf("    dep 2: requests on DP ranks %d/%d; the fakes ran %d and %d parts (expected %d and %d), %d and %d "
           "malformed; rank 0 counted %ld executor parts; logits %s the stock engine's\n", on[0], on[1], fs.f[0].steps,
           fs.f[1].steps, want[0], want[1], fs.f[0].bad, fs.f[1].bad, stx.executor_steps,
           bitwise ? "bitwise" : "NOT bitwise");
    CHECKF(fs.made == 2 && fs.f[0].steps == want[0] && fs.f[1].steps == want[1] && !fs.f[0].bad && !fs.f[1].bad,
           "the fakes (made %d) ran %d / %d parts, expected %d / %d (%d / %d malformed)", fs.made, fs.f[0].steps,
           fs.f[1].steps, want[0], want[1], fs.f[0].bad, fs.f[1].bad);
    CHECKF(on[0] > 0 && on[1] > 0, "the engine placed every request on one DP rank (%d / %d)", on[0], on[1]);
    CHECKF(bitwise && !nan, "the DEP parts through the executor: logits bitwise %d, NaN %d", bitwise, nan);
    CHECK(stx.executor_steps == want[0] && sts.executor_steps == 0);
    free(ls), free(lx);
    k3c_free(m);
}
