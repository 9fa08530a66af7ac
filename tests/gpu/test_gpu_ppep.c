/* Pipeline parallelism and DP attention + EP MoE (DEP) in the stock forward on the CUDA backend, several ranks
 * on one GPU (one host thread, one backend and so one stream per rank; the ranks' collectives through the
 * staged communicator, comm/staged.c: NCCL refuses two ranks on one device). Mirrors tests/test_ppep.c (the
 * CPU ranks) on the GPU:
 *  - the staged communicator's send / recv (a chain of stages), all-to-all with counts per peer (0 too) and
 *    split over device buffers, against bytes written out per (sender, receiver, call); poisoned receive
 *    buffers; a size mismatch fails both ends;
 *  - the backend's expert-parallel ops (moe_route, moe_experts, moe_combine) against its moe on every MoE
 *    layer of tiny K3 and tiny Kimi Linear, the pairs handed to moe_experts in a scrambled order, and an EP
 *    shard's moe_experts refusing an expert another rank holds;
 *  - the stock forward of PP 2, DEP 2 (a rank idle for its last steps: dummy steps), PP 2 x TP 2 and PP 2 x
 *    DEP 2 on tiny K3 and tiny Kimi Linear (tests/tp_config.h), and PP 2 and DEP 2 on a 4-layer full-width
 *    k3-slice in bf16, against world size 1 on the same GPU running the same requests (a DEP rank: its own):
 *    f32 activations within 1e-5 on every prompt and decode row (decode rows while the greedy streams agree;
 *    a stream may part only at a near-tie), bf16 no farther from the f32 function than 2x world size 1's own
 *    bf16 logits (test_gpu_tp.c's bound, with dense routing); the last stage's TP ranks bitwise equal; and
 *    against the CPU ranks of the same layout within test_gpu_forward.c's CPU-vs-CUDA bounds.
 * Whether PP is bitwise world size 1 on the GPU (it is on the CPU: same ops, same shapes) and DEP too (the
 * experts' launcher picks its kernel by pair count, which differs between a rank's exchange and world size 1)
 * is printed, not asserted. Prints "METRIC <name> rel_l2 <threshold> <value>" lines and INFO lines. */
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
#include "cuda/backend_cuda.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/shard.h"
#include "model/synth.h"
#include "stock/forward.h"
#include "../test.h"
#include "util/error.h"
#include "util/rng.h"
#include "../tp_config.h"

#define GROUP_MS 60000 /* the longest any rank waits for the others in one collective */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static struct { char name[64]; double thr, value; } metrics[256];
static int num_metrics;

static void metric(const char *name, double thr, double value) {
    if (num_metrics == 256) return;
    snprintf(metrics[num_metrics].name, sizeof metrics[0].name, "%s", name);
    metrics[num_metrics].thr = thr;
    metrics[num_metrics].value = value;
    num_metrics++;
}

__attribute__((destructor)) static void print_metrics(void) {
    for (int i = 0; i < num_metrics; i++)
        printf("METRIC %-28s rel_l2 %8.1e %10.3e\n", metrics[i].name, metrics[i].thr, metrics[i].value);
}

/* ---- the staged communicator: point to point, all-to-all, split ---- */

/* The byte that sender s puts at offset i of its part for receiver d in call k. */
static unsigned char pattern(int s, int d, int k, size_t i) { return (unsigned char)(s * 131 + d * 31 + k * 7 + i * 13 + 1); }

#define P2P_CALLS 12
#define P2P_MAX 6000

typedef struct p2p_job {
    k3c_comm_group *grp;
    int rank, size;
    size_t (*counts)[8][8]; /* [call][sender][receiver] bytes */
    long bad;               /* bytes that differ from the pattern, or poisoned bytes written */
    int rc;
    char err[512];
} p2p_job;

static int dev_check(p2p_job *j, cudaStream_t st, const unsigned char *dev, unsigned char *host, size_t bytes,
                     size_t cap, int s, int d, int k) {
    if (cudaMemcpyAsync(host, dev, cap, cudaMemcpyDeviceToHost, st) != cudaSuccess || cudaStreamSynchronize(st) != cudaSuccess)
        return k3c_errorf("download");
    for (size_t i = 0; i < bytes; i++) j->bad += host[i] != pattern(s, d, k, i);
    for (size_t i = bytes; i < cap; i++) j->bad += host[i] != 0xa5; /* poison past the message stays */
    return K3C_OK;
}

/* Each call: a chain rank 0 -> 1 -> ... -> n - 1 (recv from the one before, then send to the next), then an
 * all-to-all of the call's counts; the receive buffers poisoned with 0xa5 first, the send buffers uploaded
 * right before, both on the rank's stream without a host wait (the calls are stream-ordered). Then a split
 * into even and odd ranks, and one all-reduce and one chain over the sub-group. */
static int p2p_rank(p2p_job *j) {
    cudaStream_t st = NULL;
    k3c_comm *c = NULL, *sub = NULL;
    unsigned char *ds = NULL, *dr = NULL, *hs = NULL, *hr = NULL;
    size_t cap = (size_t)P2P_MAX * 8;
    int n = j->size, me = j->rank, rc = K3C_OK;
    cudaError_t e = cudaSetDevice(0);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ds, cap);
    if (e == cudaSuccess) e = cudaMalloc((void **)&dr, cap);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&hs, cap, cudaHostAllocDefault);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&hr, cap, cudaHostAllocDefault);
    if (e != cudaSuccess) rc = k3c_errorf("rank %d: %s", me, cudaGetErrorString(e));
    if (rc == K3C_OK) rc = k3c_comm_staged_create(j->grp, me, 0, st, 20000, &c);
    if (rc == K3C_OK && (!c->send || !c->recv || !c->all_to_all || !c->split)) rc = k3c_errorf("missing calls");
    for (int k = 0; k < P2P_CALLS && rc == K3C_OK; k++) {
        size_t (*cnt)[8] = j->counts[k];
        if (me > 0) { /* from the stage before */
            size_t b = cnt[me - 1][me];
            if (cudaMemsetAsync(dr, 0xa5, cap, st) != cudaSuccess) rc = k3c_errorf("poison");
            if (rc == K3C_OK) rc = c->recv(c, dr, b, me - 1);
            if (rc == K3C_OK) rc = dev_check(j, st, dr, hr, b, cap, me - 1, me, k);
        }
        if (rc == K3C_OK && me < n - 1) {
            size_t b = cnt[me][me + 1];
            for (size_t i = 0; i < b; i++) hs[i] = pattern(me, me + 1, k, i);
            if (cudaMemcpyAsync(ds, hs, b, cudaMemcpyHostToDevice, st) != cudaSuccess) rc = k3c_errorf("upload");
            if (rc == K3C_OK) rc = c->send(c, ds, b, me + 1);
            if (rc == K3C_OK && cudaStreamSynchronize(st) != cudaSuccess) rc = k3c_errorf("stream"); /* hs reused */
        }
        /* all-to-all: every pair's count, the parts packed in rank order */
        size_t sb[8], rb[8], so = 0, ro = 0;
        for (int p = 0; p < n; p++) sb[p] = cnt[me][p], rb[p] = cnt[p][me];
        for (int p = 0; p < n && rc == K3C_OK; p++) {
            for (size_t i = 0; i < sb[p]; i++) hs[so + i] = pattern(me, p, k, i);
            so += sb[p];
        }
        if (rc == K3C_OK && (cudaMemsetAsync(dr, 0xa5, cap, st) != cudaSuccess ||
                             cudaMemcpyAsync(ds, hs, so, cudaMemcpyHostToDevice, st) != cudaSuccess))
            rc = k3c_errorf("all_to_all setup");
        if (rc == K3C_OK) rc = c->all_to_all(c, ds, sb, dr, rb);
        if (rc == K3C_OK && (cudaMemcpyAsync(hr, dr, cap, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
                             cudaStreamSynchronize(st) != cudaSuccess))
            rc = k3c_errorf("all_to_all download");
        for (int p = 0; p < n && rc == K3C_OK; p++) {
            for (size_t i = 0; i < rb[p]; i++) j->bad += hr[ro + i] != pattern(p, me, k, i);
            ro += rb[p];
        }
        for (size_t i = ro; i < cap && rc == K3C_OK; i++) j->bad += hr[i] != 0xa5;
    }
    /* the sub-groups: even and odd ranks, ranked by world rank */
    if (rc == K3C_OK) rc = c->split(c, me % 2, me, &sub);
    if (rc == K3C_OK && (!sub || sub->size != (n + 1 - me % 2) / 2 || sub->rank != me / 2 || !sub->stream_ordered))
        rc = k3c_errorf("rank %d: split gave rank %d of %d", me, sub ? sub->rank : -1, sub ? sub->size : -1);
    if (rc == K3C_OK && sub->size > 1) {
        float v[4] = {(float)me, 1.0f, -0.0f, (float)(me * me)}, *dv = (float *)ds;
        memcpy(hs, v, sizeof v);
        if (cudaMemcpyAsync(dv, hs, sizeof v, cudaMemcpyHostToDevice, st) != cudaSuccess) rc = k3c_errorf("upload");
        if (rc == K3C_OK) rc = sub->all_reduce_f32(sub, dv, 4);
        if (rc == K3C_OK && (cudaMemcpyAsync(hr, dv, sizeof v, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
                             cudaStreamSynchronize(st) != cudaSuccess))
            rc = k3c_errorf("download");
        float want[4] = {0, 0, -0.0f, 0};
        for (int r = me % 2; r < n; r += 2) want[0] += (float)r, want[1] += 1.0f, want[3] += (float)(r * r);
        if (rc == K3C_OK && memcmp(hr, want, sizeof want)) rc = k3c_errorf("rank %d: the sub-group's sum differs", me);
        if (rc == K3C_OK && sub->rank == 0) rc = sub->send(sub, dv, sizeof v, 1);
        if (rc == K3C_OK && sub->rank == 1) rc = sub->recv(sub, dv, sizeof v, 0);
    }
    if (rc != K3C_OK) {
        snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
        if (c) c->abort(c);
    }
    if (sub) sub->free(sub);
    if (c) c->free(c);
    if (ds) cudaFree(ds);
    if (dr) cudaFree(dr);
    if (hs) cudaFreeHost(hs);
    if (hr) cudaFreeHost(hr);
    if (st) cudaStreamDestroy(st);
    return rc;
}

static void *p2p_thread(void *p) {
    p2p_job *j = p;
    j->rc = p2p_rank(j);
    return NULL;
}

TEST(gpu_ppep_comm_staged_p2p) {
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x7032);
    static size_t counts[P2P_CALLS][8][8];
    int sizes[] = {2, 3, 4};
    for (int si = 0; si < 3; si++) {
        int n = sizes[si];
        for (int k = 0; k < P2P_CALLS; k++)
            for (int s = 0; s < n; s++)
                for (int d = 0; d < n; d++) /* a third of them empty; sizes not multiples of 4 */
                    counts[k][s][d] = k3c_rng_next(&g) % 3 == 0 ? 0 : 1 + k3c_rng_next(&g) % P2P_MAX;
        k3c_comm_group *grp;
        CHECK_OK(k3c_comm_group_create(n, GROUP_MS, &grp));
        p2p_job jobs[8];
        pthread_t th[8];
        for (int k = 0; k < n; k++) {
            jobs[k] = (p2p_job){.grp = grp, .rank = k, .size = n, .counts = counts};
            pthread_create(&th[k], NULL, p2p_thread, &jobs[k]);
        }
        for (int k = 0; k < n; k++) pthread_join(th[k], NULL);
        long bad = 0;
        for (int k = 0; k < n; k++) {
            CHECKF(jobs[k].rc == K3C_OK, "%d ranks: rank %d: %s", n, k, jobs[k].err);
            bad += jobs[k].bad;
        }
        CHECKF(bad == 0, "%d ranks: %ld bytes differ from what was sent (or overwrote the poison)", n, bad);
        printf("INFO staged comm, %d ranks: %d chains of send / recv and %d all-to-alls (0 .. %d bytes a pair), a "
               "split: every byte as sent\n", n, P2P_CALLS, P2P_CALLS, P2P_MAX);
    }
}

typedef struct mismatch_job {
    k3c_comm_group *grp;
    int rank;
    double secs;
    int rc;
} mismatch_job;

static void *mismatch_thread(void *p) {
    mismatch_job *j = p;
    cudaStream_t st = NULL;
    void *d = NULL;
    k3c_comm *c = NULL;
    j->rc = K3C_OK;
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&d, 256) != cudaSuccess || k3c_comm_staged_create(j->grp, j->rank, 0, st, 20000, &c) != K3C_OK)
        return NULL;
    double t0 = now_s();
    /* rank 0 sends 64 bytes, rank 1 expects 128: both fail (the group's mismatch), neither waits it out */
    j->rc = j->rank == 0 ? c->send(c, d, 64, 1) : c->recv(c, d, 128, 0);
    j->secs = now_s() - t0;
    c->free(c);
    cudaFree(d);
    cudaStreamDestroy(st);
    return NULL;
}

TEST(gpu_ppep_comm_staged_mismatch) {
    k3c_comm_group *grp;
    CHECK_OK(k3c_comm_group_create(2, 5000, &grp));
    mismatch_job j[2] = {{grp, 0, 0, K3C_OK}, {grp, 1, 0, K3C_OK}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, mismatch_thread, &j[k]);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++)
        CHECKF(j[k].rc == K3C_ERR && j[k].secs < 4, "rank %d: rc %d after %.2f s (a mismatch must fail at once)", k,
               j[k].rc, j[k].secs);
    printf("INFO staged comm: a send of 64 bytes against a recv of 128 failed both ranks in %.3f / %.3f s\n",
           j[0].secs, j[1].secs);
}

/* ---- the backend's expert-parallel ops ---- */

static int load_tiny(int kimi_linear, int dense, const char *tag, k3c_model **m) {
    k3c_config c;
    K3C_TRY(tp_config(kimi_linear, dense, &c));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/gppep_%s_%d_%d", test_tmpdir(), tag, kimi_linear, dense);
    int rc = k3c_synth_write(&c, NULL, test_seed() ^ k3c_hash_str(tag) ^ (uint64_t)(2 * kimi_linear + dense), dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    return k3c_model_load(dir, m);
}

/* Every MoE layer: moe(y) against moe_route, then moe_experts on the step's pairs handed over in a scrambled
 * order (the rows of expert-rank 1 first, then rank 0's, reversed inside: an exchange's order), then
 * moe_combine through the pairs' rows. Rows within 1e-6 (f32) or 1e-2 (bf16) of moe's, the count of bitwise
 * rows printed (the experts' launcher takes its path by pair count, which is the same here). */
static int ep_ops(int kimi_linear, int exact, k3c_rng *g) {
    k3c_model *m;
    K3C_TRY(load_tiny(kimi_linear, 0, "ops", &m));
    const k3c_config *c = &m->config;
    int D = c->hidden_size, K = c->num_experts_per_token, E = c->num_experts, T = 7, Rin = k3c_config_expert_in(c);
    int TK = T * K;
    k3c_backend *be = k3c_backend_cuda_create(0);
    if (!be) {
        k3c_model_free(m);
        return K3C_ERR;
    }
    k3c_backend_cuda_set_exact(be, exact);
    k3c_backend_limits lim = {.max_rows = 8, .max_segs = 2, .max_context = 64, .block_size = 16,
                              .max_expert_rows = 2 * 8 * K};
    int rc = be->init(be, m, &lim);
    float *dy = NULL, *dout = NULL, *dw = NULL, *dz = NULL, *dd = NULL, *dsend = NULL, *dep = NULL;
    float *hy = malloc(sizeof(float) * T * D), *ha = malloc(sizeof(float) * T * D), *hb = malloc(sizeof(float) * T * D);
    int *idx = malloc(sizeof(int) * TK), *order = malloc(sizeof(int) * TK), *expert = malloc(sizeof(int) * TK);
    int *pair_row = malloc(sizeof(int) * TK), *src_row = malloc(sizeof(int) * TK);
    if (rc == K3C_OK) {
        dy = be->alloc(be, sizeof(float) * T * D), dout = be->alloc(be, sizeof(float) * T * D);
        dw = be->alloc(be, sizeof(float) * TK), dz = be->alloc(be, sizeof(float) * T * Rin);
        dd = be->alloc(be, sizeof(float) * TK * Rin), dsend = be->alloc(be, sizeof(float) * TK * Rin);
        dep = be->alloc(be, sizeof(float) * T * D);
        if (!dy || !dout || !dw || !dz || !dd || !dsend || !dep || !hy || !ha || !hb || !idx || !order || !expert ||
            !pair_row || !src_row)
            rc = k3c_errorf("out of memory");
    }
    int layers = 0, rows_bitwise = 0, rows = 0;
    double worst = 0;
    for (int l = 0; l < c->num_layers && rc == K3C_OK; l++) {
        const k3c_layer_weights *lw = &m->weights.layers[l];
        if (!lw->is_moe) continue;
        layers++;
        for (int i = 0; i < T * D; i++) hy[i] = (float)((double)(k3c_rng_next(g) >> 11) * 0x1p-53 * 2 - 1);
        be->upload(be, dy, hy, sizeof(float) * T * D);
        be->round(be, dy, (size_t)T * D); /* y rounded, as the forward hands it over */
        be->moe(be, &lw->moe, dy, T, dout);
        be->fill_bytes(be, dep, 0xff, sizeof(float) * T * D);
        be->moe_route(be, &lw->moe, dy, T, idx, dw, dz);
        for (int i = 0; i < TK && rc == K3C_OK; i++)
            if (idx[i] < 0 || idx[i] >= E) rc = k3c_errorf("layer %d: moe_route gave expert %d", l, idx[i]);
        if (rc != K3C_OK) break;
        /* the exchange's order: pairs whose expert is in the upper half first, each half reversed */
        int ns = 0;
        for (int half = 1; half >= 0; half--)
            for (int i = TK - 1; i >= 0; i--)
                if ((idx[i] >= E / 2) == half) order[ns++] = i;
        for (int s = 0; s < TK; s++) {
            src_row[s] = order[s] / K; /* z's row of the pair sent at s */
            expert[s] = idx[order[s]];
            pair_row[order[s]] = s;
        }
        be->fill_bytes(be, dd, 0xff, sizeof(float) * TK * Rin);
        be->gather_rows(be, dz, src_row, TK, Rin, dsend);
        be->moe_experts(be, &lw->moe, dsend, expert, TK, dd);
        be->moe_combine(be, &lw->moe, dy, T, dw, dd, pair_row, dep);
        be->download(be, ha, dout, sizeof(float) * T * D);
        be->download(be, hb, dep, sizeof(float) * T * D);
        rc = be->sync(be);
        for (int t = 0; t < T && rc == K3C_OK; t++) {
            double d = rel_l2_f32f32(hb + (size_t)t * D, ha + (size_t)t * D, D);
            if (!(d <= worst)) worst = d;
            rows++;
            rows_bitwise += !memcmp(hb + (size_t)t * D, ha + (size_t)t * D, sizeof(float) * D);
        }
    }
    double tol = exact ? 1e-6 : 1e-2;
    if (rc == K3C_OK && !(worst <= tol))
        rc = k3c_errorf("the EP ops' output is %.3g from moe's (rel L2, worst row; bound %.0e)", worst, tol);
    if (rc == K3C_OK)
        printf("INFO %s %s: moe_route + moe_experts (scrambled pairs) + moe_combine against moe on %d layers: worst "
               "row %.3g, %d of %d rows bitwise\n", kimi_linear ? "kimi-linear" : "k3", exact ? "f32" : "bf16",
               layers, worst, rows_bitwise, rows);
    free(hy), free(ha), free(hb), free(idx), free(order), free(expert), free(pair_row), free(src_row);
    float *bufs[] = {dy, dout, dw, dz, dd, dsend, dep};
    for (int i = 0; i < 7; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    be->destroy(be);
    k3c_model_free(m);
    return rc;
}

/* An EP shard's backend refuses moe_experts on an expert of the other rank (its table entry is empty). */
static int ep_refusal(void) {
    k3c_model *m, *sh;
    K3C_TRY(load_tiny(0, 0, "ops", &m));
    k3c_model_part part = {.ep_rank = 1, .ep = 2};
    if (k3c_model_shard(m, &part, &sh) != K3C_OK) {
        k3c_model_free(m);
        return K3C_ERR;
    }
    const k3c_config *c = &m->config;
    int l = 0;
    while (l < c->num_layers && !m->weights.layers[l].is_moe) l++;
    k3c_backend *be = k3c_backend_cuda_create(0);
    int rc = be ? K3C_OK : K3C_ERR;
    k3c_backend_limits lim = {.max_rows = 4, .max_segs = 1, .max_context = 16, .block_size = 16, .max_expert_rows = 16};
    if (rc == K3C_OK) rc = be->init(be, sh, &lim);
    float *dx = rc == K3C_OK ? be->alloc(be, sizeof(float) * 16 * k3c_config_expert_in(c)) : NULL;
    if (rc == K3C_OK && !dx) rc = K3C_ERR;
    if (rc == K3C_OK) {
        be->fill_bytes(be, dx, 0, sizeof(float) * 16 * k3c_config_expert_in(c));
        int mine = c->num_experts - 1, other = 0;
        be->moe_experts(be, &sh->weights.layers[l].moe, dx, &mine, 1, dx + k3c_config_expert_in(c));
        rc = be->sync(be);
        if (rc == K3C_OK) {
            be->moe_experts(be, &sh->weights.layers[l].moe, dx, &other, 1, dx + k3c_config_expert_in(c));
            if (be->sync(be) == K3C_OK) rc = k3c_errorf("moe_experts ran expert 0 on EP rank 1 of 2");
            else if (!strstr(k3c_error_message(), "not held")) rc = k3c_errorf("refused with: %s", k3c_error_message());
        }
    }
    if (dx) be->free(be, dx);
    if (be) be->destroy(be);
    k3c_model_shard_free(sh);
    k3c_model_free(m);
    return rc;
}

TEST(gpu_ppep_backend_ep_ops) {
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x6570);
    for (int kl = 0; kl < 2; kl++)
        for (int exact = 1; exact >= 0; exact--) CHECK_OK(ep_ops(kl, exact, &g));
    CHECK_OK(ep_refusal());
}

/* ---- the forward's ranks ---- */

enum { MAXREQ = 3, MAX_ROWS = 93 };

typedef struct req_spec {
    const int32_t *prompt;
    int n_prompt, n_new;
} req_spec;

/* One rank of a (tp, pp, dp, ep) layout (world NULL: world size 1), CUDA or CPU; everything a rank makes is
 * made in its own thread: its backend, its staged (or in-memory) world communicator over the backend's stream,
 * the world's split into its groups (a collective), its forward and caches. */
typedef struct rrun {
    const k3c_model *m;
    k3c_comm_group *world;
    int wrank, tp, pp, dp, ep;
    const unsigned char *nccl_id; /* not NULL: the world is NCCL's (comm/nccl.c), not the staged one */
    int cuda, exact;
    int nreq, steps;
    req_spec req[MAXREQ];
    int V;
    float *prompt_logits[MAXREQ], *step_logits[MAXREQ];
    int32_t *stream[MAXREQ];
    int last, rc;
    char err[512];
} rrun;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The sampled tokens to every stage from the last (the engine's part); a device communicator moves device
 * memory, so through a backend buffer. */
static int bcast_tokens(k3c_backend *be, k3c_comm *pp, int32_t *tok, int n, int32_t *dev) {
    if (!pp->stream_ordered) return pp->broadcast(pp, tok, sizeof(int32_t) * n, pp->size - 1);
    be->upload(be, dev, tok, sizeof(int32_t) * n);
    K3C_TRY(pp->broadcast(pp, dev, sizeof(int32_t) * n, pp->size - 1));
    be->download(be, tok, dev, sizeof(int32_t) * n);
    return be->sync(be);
}

static int run_rank(rrun *r) {
    const k3c_config *c = &r->m->config;
    int V = r->V, bs = 16, ctx = 0, rc = K3C_OK;
    for (int i = 0; i < r->nreq; i++)
        if (r->req[i].n_prompt + r->req[i].n_new > ctx) ctx = r->req[i].n_prompt + r->req[i].n_new;
    ctx = ctx > 0 ? ctx : 1;
    int per = (ctx + bs - 1) / bs;
    k3c_backend *be = r->cuda ? k3c_backend_cuda_create(0) : k3c_backend_cpu_create(1);
    if (!be) return K3C_ERR;
    if (r->cuda) k3c_backend_cuda_set_exact(be, r->exact);
    else k3c_backend_cpu_set_exact(be, r->exact);
    k3c_comm *world = NULL;
    k3c_comm_groups gr = {0};
    if (r->nccl_id) {
        rc = k3c_comm_nccl_create(r->nccl_id, r->wrank, r->tp * r->pp * r->dp, 0, k3c_backend_cuda_stream(be), &world);
        if (rc == K3C_OK) rc = k3c_comm_groups_split(world, r->tp, r->pp, r->dp, r->ep, &gr);
    } else if (r->world) {
        rc = r->cuda ? k3c_comm_staged_create(r->world, r->wrank, 0, k3c_backend_cuda_stream(be), GROUP_MS, &world)
                     : k3c_comm_group_join(r->world, r->wrank, &world);
        if (rc == K3C_OK) rc = k3c_comm_groups_split(world, r->tp, r->pp, r->dp, r->ep, &gr);
    }
    k3c_forward_options o = {.max_rows = MAX_ROWS, .max_segs = MAXREQ, .max_context = ctx + 1, .block_size = bs,
                             .tp = gr.tp, .pp = gr.pp, .ep = gr.ep};
    k3c_forward *f = NULL;
    k3c_kv_cache kv = {0};
    k3c_kda_slots ks = {0};
    int l0, l1;
    k3c_model_stage_layers(r->m, &l0, &l1);
    r->last = l1 == c->num_layers;
    int32_t table[MAXREQ][64], tok[MAXREQ] = {0}, *dtok = NULL;
    float *lg = malloc((size_t)MAX_ROWS * V * sizeof(float));
    if (rc == K3C_OK && !lg) rc = k3c_errorf("out of memory");
    if (rc == K3C_OK) rc = k3c_forward_create(be, r->m, &o, &f);
    if (rc == K3C_OK) rc = k3c_kv_cache_init_layers(&kv, be, c, l0, l1, MAXREQ * per + 1, bs);
    if (rc == K3C_OK) rc = k3c_kda_slots_init_layers(&ks, be, c, l0, l1, MAXREQ, 1, MAXREQ);
    if (rc == K3C_OK && gr.pp && !(dtok = be->alloc(be, sizeof tok))) rc = K3C_ERR;
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
        rc = k3c_forward_step(f, &kv, &ks, q, nq, lg, NULL); /* nq = 0: a DEP rank's dummy step */
        size_t at = 0;
        for (int k = 0; k < nq && r->last && rc == K3C_OK; k++) {
            int i = who[k], n = s == 0 ? r->req[i].n_prompt : 1;
            float *dst = s == 0 ? r->prompt_logits[i] : r->step_logits[i] + (size_t)(s - 1) * V;
            memcpy(dst, lg + at * V, (size_t)n * V * sizeof(float));
            tok[i] = argmax(lg + (at + n - 1) * V, V);
            at += n;
        }
        if (rc == K3C_OK && gr.pp && r->nreq > 0) rc = bcast_tokens(be, gr.pp, tok, r->nreq, dtok);
    }
    if (rc != K3C_OK) {
        snprintf(r->err, sizeof r->err, "%s", k3c_error_message());
        if (world) world->abort(world); /* the other ranks fail at once instead of waiting */
    }
    free(lg);
    if (dtok) be->free(be, dtok);
    k3c_kda_slots_release(&ks, be);
    k3c_kv_cache_release(&kv, be);
    k3c_forward_free(f);
    k3c_comm_groups_free(&gr); /* before the backend's stream goes */
    if (world) world->free(world);
    be->destroy(be);
    return rc;
}

static void *rank_thread(void *p) {
    rrun *r = p;
    r->rc = run_rank(r);
    return NULL;
}

static int alloc_run(rrun *r) {
    for (int i = 0; i < r->nreq; i++) {
        size_t np = (size_t)r->req[i].n_prompt * r->V, nn = (size_t)(r->req[i].n_new > 0 ? r->req[i].n_new : 1) * r->V;
        r->prompt_logits[i] = malloc(np * sizeof(float));
        r->step_logits[i] = malloc(nn * sizeof(float));
        r->stream[i] = calloc((size_t)(r->req[i].n_new > 0 ? r->req[i].n_new : 1), sizeof(int32_t));
        if (!r->prompt_logits[i] || !r->step_logits[i] || !r->stream[i]) return k3c_errorf("out of memory");
        poison_f32(r->prompt_logits[i], np);
        poison_f32(r->step_logits[i], nn);
    }
    return K3C_OK;
}

static void free_run(rrun *r) {
    for (int i = 0; i < r->nreq; i++) {
        free(r->prompt_logits[i]), free(r->step_logits[i]), free(r->stream[i]);
        r->prompt_logits[i] = r->step_logits[i] = NULL;
        r->stream[i] = NULL;
    }
}

/* ---- layouts and their requests ---- */

typedef struct fixture {
    k3c_model *m;
    int V;
    int32_t prompts[MAXREQ + 1][80];
} fixture;

/* PP ranks: every rank the same two requests (a 70-token prompt: a whole chunked KDA block and 6 recurrent
 * rows; a 23-token one), 6 decode steps. DEP rank k (of 2): rank 0 the prompts of 70 (6 new) and 23 (3 new),
 * rank 1 one of 41 (8 new); every rank runs 8 steps, so rank 0 is idle (dummy steps) for the last 2 and the
 * step's rows differ between the ranks throughout (padded routing tables). */
static void requests(const fixture *fx, int dep, int dp_rank, rrun *r) {
    r->steps = dep ? 8 : 6;
    if (!dep || dp_rank == 0) {
        r->nreq = 2;
        r->req[0] = (req_spec){fx->prompts[0], 70, 6};
        r->req[1] = (req_spec){fx->prompts[1], 23, dep ? 3 : 6};
    } else {
        r->nreq = 1;
        r->req[0] = (req_spec){fx->prompts[2], 41, 8};
    }
}

typedef struct layout {
    const char *name;
    int tp, pp, dp; /* ep = dp when dp > 1 (DEP) */
    int same;       /* DEP: every DP rank the PP requests (so the DP ranks' logits must be bitwise equal) */
} layout;

/* Runs a layout's tp x pp x dp ranks (one thread each), CUDA or CPU; r[w] for world rank w. nccl: the CUDA
 * ranks' world over NCCL (several ranks on one device: NCCL_MULTI_RANK_GPU_ENABLE, NCCL 2.30 and later). */
static int run_layout_comm(const fixture *fx, const layout *L, int cuda, int nccl, int exact, k3c_model **sh,
                           rrun *r) {
    int n = L->tp * L->pp * L->dp, ep = L->dp > 1 ? L->dp : 1;
    k3c_comm_group *grp = NULL;
    static unsigned char id[K3C_COMM_NCCL_ID_BYTES];
    if (nccl) K3C_TRY(k3c_comm_nccl_unique_id(id));
    else K3C_TRY(k3c_comm_group_create(n, GROUP_MS, &grp));
    for (int w = 0; w < n; w++) {
        int tpr = w % L->tp, dpr = (w / L->tp) % L->dp, stage = w / (L->tp * L->dp);
        k3c_model_part part = {.tp_rank = tpr, .tp = L->tp, .pp_stage = stage, .pp = L->pp, .ep_rank = dpr, .ep = ep};
        if (k3c_model_shard(fx->m, &part, &sh[w]) != K3C_OK) return K3C_ERR; /* leaks the group: the test fails */
        r[w] = (rrun){.m = sh[w], .world = grp, .wrank = w, .tp = L->tp, .pp = L->pp, .dp = L->dp, .ep = ep,
                      .nccl_id = nccl ? id : NULL, .cuda = cuda, .exact = exact, .V = fx->V};
        requests(fx, L->dp > 1 && !L->same, dpr, &r[w]);
        K3C_TRY(alloc_run(&r[w]));
    }
    pthread_t th[8];
    for (int w = 0; w < n; w++) pthread_create(&th[w], NULL, rank_thread, &r[w]);
    for (int w = 0; w < n; w++) pthread_join(th[w], NULL);
    for (int w = 0; w < n; w++)
        if (r[w].rc != K3C_OK)
            return k3c_errorf("%s %s world rank %d: %s", nccl ? "nccl" : cuda ? "cuda" : "cpu", L->name, w, r[w].err);
    return K3C_OK;
}

static int run_layout(const fixture *fx, const layout *L, int cuda, int exact, k3c_model **sh, rrun *r) {
    return run_layout_comm(fx, L, cuda, 0, exact, sh, r);
}

/* ---- comparisons ---- */

typedef struct rows_cmp {
    double worst, median;
} rows_cmp;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Request i of two runs: the prompt rows, and the decode rows while both streams fed the same tokens (*same
 * of them); worst and median row rel L2 (NaN counts as inf). */
static rows_cmp compare_req(const rrun *a, const rrun *b, int i, int *same) {
    int V = a->V, np = a->req[i].n_prompt, nn = a->req[i].n_new, s = 0;
    while (s < nn && a->stream[i][s] == b->stream[i][s]) s++;
    *same = s;
    /* step_logits[t] feeds token t + 1: rows 0 .. s - 1 were computed from the same tokens */
    int rows = np + s;
    double *d = malloc(sizeof(double) * (size_t)rows);
    rows_cmp r = {0, 0};
    for (int t = 0; t < rows; t++) {
        const float *x = t < np ? a->prompt_logits[i] + (size_t)t * V : a->step_logits[i] + (size_t)(t - np) * V;
        const float *y = t < np ? b->prompt_logits[i] + (size_t)t * V : b->step_logits[i] + (size_t)(t - np) * V;
        double e = rel_l2_f32f32(x, y, (size_t)V);
        d[t] = e == e ? e : INFINITY;
        if (!(d[t] <= r.worst)) r.worst = d[t];
    }
    qsort(d, (size_t)rows, sizeof *d, cmp_double);
    r.median = d[rows / 2];
    free(d);
    return r;
}

static int same_bits(const rrun *a, const rrun *b, int i) {
    size_t V = a->V;
    return !memcmp(a->prompt_logits[i], b->prompt_logits[i], a->req[i].n_prompt * V * 4) &&
           !memcmp(a->step_logits[i], b->step_logits[i], a->req[i].n_new * V * 4) &&
           !memcmp(a->stream[i], b->stream[i], a->req[i].n_new * 4);
}

/* f32: where the streams part, world size 1's logits there must be a greedy near-tie. */
static int near_tie(const rrun *ref, int i, int same) {
    int V = ref->V;
    const float *lg = same == 0 ? ref->prompt_logits[i] + (size_t)(ref->req[i].n_prompt - 1) * V
                                : ref->step_logits[i] + (size_t)(same - 1) * V;
    int a = argmax(lg, V);
    float second = -INFINITY;
    for (int k = 0; k < V; k++)
        if (k != a && lg[k] > second) second = lg[k];
    return lg[a] - second < 1e-4f;
}

#define VS_CPU_F32 1e-4  /* test_gpu_forward.c: f32, every row with dense routing, the median row with the preset's */
#define VS_CPU_BF16 5e-2 /* bf16, dense routing: median row */

typedef struct ppep_case {
    const char *name;
    int kimi_linear, slice_layers; /* slice_layers > 0: the full-width k3-slice */
    int exact, dense;
    double tol; /* f32: rel L2 to world size 1; bf16: x world size 1's own distance from the f32 function */
    int vs_cpu;
    int all_layouts; /* also PP 2 x TP 2 and PP 2 x DEP 2 */
} ppep_case;

static const layout layouts[] = {
    {"pp2", 1, 2, 1, 0}, {"dep2", 1, 1, 2, 0}, {"pp2xtp2", 2, 2, 1, 0}, {"pp2xdep2", 1, 2, 2, 0},
    {"dep2same", 1, 1, 2, 1},
};

/* k3-slice's layer widths, the first `layers` layers (the dense layer 0, two MoE KDA layers and the MoE MLA
 * layer 3), a vocabulary of 32768 and 8 experts (K3's 896 are 64 in k3-slice; 8 keep the synthesis short:
 * ~2.2 G weights, ~5 GB; every one selected, dense routing). */
static int slice_config(int layers, k3c_config *c) {
    K3C_TRY(k3c_preset_config("k3-slice", c));
    if (layers < c->num_layers) c->num_layers = layers;
    c->vocab_size = 32768;
    c->bos_token_id = c->eos_token_id = c->pad_token_id = -1;
    c->num_experts = 8;
    c->num_experts_per_token = 8;
    c->num_expert_group = 1;
    c->topk_group = 1;
    return k3c_config_validate(c);
}

static void check_case(const ppep_case *pc) {
    k3c_config c;
    int rc = pc->slice_layers ? slice_config(pc->slice_layers, &c) : tp_config(pc->kimi_linear, pc->dense, &c);
    CHECK_OK(rc);
    if (rc != K3C_OK) return;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/gppep_%s", test_tmpdir(), pc->name);
    uint64_t seed = test_seed() ^ k3c_hash_str(pc->name);
    double t0 = now_s();
    rc = k3c_synth_write(&c, NULL, seed, dir);
    fixture fx = {.V = c.vocab_size};
    k3c_config_free(&c);
    CHECK_OK(rc);
    if (rc != K3C_OK) return;
    CHECK_OK(k3c_model_load(dir, &fx.m));
    if (pc->slice_layers) printf("INFO %s: %.2f GB synthesized and mapped in %.1f s\n", pc->name, fx.m->weight_bytes / 1e9,
                                 now_s() - t0);
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x7a11);
    for (int i = 0; i <= MAXREQ; i++)
        for (int t = 0; t < 80; t++) fx.prompts[i][t] = (int32_t)(k3c_rng_next(&g) % (uint64_t)fx.V);

    /* world size 1 on the GPU: the PP requests (index 0) and each DP rank's (1, 2); bf16 also the f32 function */
    rrun one[3], fn[3];
    memset(one, 0, sizeof one);
    memset(fn, 0, sizeof fn);
    int failed = 0;
    double noise = 0;
    for (int k = 0; k < 3 && !failed; k++) {
        for (int f32 = 0; f32 < (pc->exact ? 1 : 2) && !failed; f32++) {
            rrun *r = f32 ? &fn[k] : &one[k];
            *r = (rrun){.m = fx.m, .cuda = 1, .exact = f32 ? 1 : pc->exact, .V = fx.V, .tp = 1, .pp = 1, .dp = 1};
            requests(&fx, k > 0, k > 0 ? k - 1 : 0, r);
            failed = alloc_run(r) != K3C_OK || run_rank(r) != K3C_OK;
            CHECKF(!failed, "%s world size 1 (%d, %s): %s", pc->name, k, f32 ? "f32" : "case", r->err);
        }
        for (int i = 0; i < one[k].nreq && !failed && !pc->exact; i++) {
            int same;
            rows_cmp d = compare_req(&one[k], &fn[k], i, &same);
            if (d.worst > noise) noise = d.worst;
        }
    }
    if (!failed && !pc->exact) printf("INFO %s bf16 world size 1 vs f32: worst row rel L2 %.3g\n", pc->name, noise);

    int nl = pc->all_layouts ? 5 : 2;
    for (int li = 0; li < nl && !failed; li++) {
        const layout *L = &layouts[li];
        int n = L->tp * L->pp * L->dp, dep = L->dp > 1 && !L->same;
        k3c_model *sh[8] = {0}, *shc[8] = {0};
        rrun gpu[8], cpu[8];
        memset(gpu, 0, sizeof gpu);
        memset(cpu, 0, sizeof cpu);
        double t1 = now_s();
        rc = run_layout(&fx, L, 1, pc->exact, sh, gpu);
        CHECKF(rc == K3C_OK, "%s: %s", pc->name, k3c_error_message());
        double t_gpu = now_s() - t1;
        int first_last = (L->pp - 1) * L->tp * L->dp; /* world rank of the last stage's first rank */
        for (int w = first_last; w < n && rc == K3C_OK; w++) {
            if (!gpu[w].last) {
                test_fail(__FILE__, __LINE__, "%s %s: world rank %d is not on the last stage", pc->name, L->name, w);
                break;
            }
            int dpr = (w / L->tp) % L->dp, tpr = w % L->tp;
            const rrun *ref = &one[dep ? 1 + dpr : 0];
            if (tpr > 0) { /* the last stage's TP ranks: bitwise equal */
                int eq = 1;
                for (int i = 0; i < gpu[w].nreq; i++) eq &= same_bits(&gpu[w], &gpu[w - tpr], i);
                CHECKF(eq, "%s %s: world rank %d's logits differ from its TP rank 0's", pc->name, L->name, w);
                continue;
            }
            if (L->same && dpr > 0) { /* DP ranks with the same requests: bitwise equal (their d_j are the same
                                       * products in the same expert calls, their sums the same arithmetic) */
                int eq = 1;
                for (int i = 0; i < gpu[w].nreq; i++) eq &= same_bits(&gpu[w], &gpu[w - dpr], i);
                printf("INFO %s %s: DP rank %d %s DP rank 0\n", pc->name, L->name, dpr,
                       eq ? "bitwise equal to" : "DIFFERS from");
                CHECKF(eq, "%s %s: DP rank %d's logits differ from DP rank 0's (the same requests)", pc->name,
                       L->name, dpr);
                continue;
            }
            for (int i = 0; i < gpu[w].nreq; i++) {
                int same;
                rows_cmp d = compare_req(&gpu[w], ref, i, &same);
                int bitwise = same_bits(&gpu[w], ref, i);
                printf("INFO %s %s, %s%d request %d (%d rows, %d new): worst row rel L2 vs world size 1 %.3g, "
                       "greedy %d/%d equal, %s; %.2f s\n", pc->name, L->name, dep ? "DP rank " : "rank ",
                       dep ? dpr : w, i, gpu[w].req[i].n_prompt, gpu[w].req[i].n_new, d.worst, same,
                       gpu[w].req[i].n_new, bitwise ? "bitwise world size 1" : "not bitwise", t_gpu);
                char name[64];
                snprintf(name, sizeof name, "%s_%s_r%d_q%d", L->name, pc->name, dep ? dpr : 0, i);
                if (pc->exact) {
                    metric(name, pc->tol, d.worst);
                    CHECKF(d.worst <= pc->tol, "%s %s request %d: rel L2 %.3g over %.3g", pc->name, L->name, i,
                           d.worst, pc->tol);
                    CHECKF(same == gpu[w].req[i].n_new || near_tie(ref, i, same),
                           "%s %s request %d f32: the greedy stream parts at token %d, no near-tie", pc->name,
                           L->name, i, same);
                } else {
                    int sf;
                    rows_cmp df = compare_req(&gpu[w], &fn[dep ? 1 + dpr : 0], i, &sf);
                    metric(name, pc->tol * noise, fmax(d.worst, df.worst));
                    CHECKF(d.worst <= pc->tol * noise && df.worst <= pc->tol * noise,
                           "%s %s request %d bf16: %.3g from world size 1's bf16, %.3g from the f32 function, "
                           "against world size 1's own %.3g (x %.1f allowed)", pc->name, L->name, i, d.worst,
                           df.worst, noise, pc->tol);
                }
            }
        }
        if (rc == K3C_OK && pc->vs_cpu) {
            rc = run_layout(&fx, L, 0, pc->exact, shc, cpu);
            CHECKF(rc == K3C_OK, "%s: %s", pc->name, k3c_error_message());
            for (int w = first_last; w < n && rc == K3C_OK; w += L->tp) {
                double thr = pc->exact ? VS_CPU_F32 : VS_CPU_BF16;
                int every = pc->exact && pc->dense;
                for (int i = 0; i < gpu[w].nreq; i++) {
                    int same;
                    rows_cmp d = compare_req(&gpu[w], &cpu[w], i, &same);
                    printf("INFO %s %s world rank %d request %d, cuda vs cpu ranks: median %.3g worst %.3g (%d/%d "
                           "tokens equal)\n", pc->name, L->name, w, i, d.median, d.worst, same, gpu[w].req[i].n_new);
                    char name[64];
                    snprintf(name, sizeof name, "%s_%s_w%d_q%d_vs_cpu", L->name, pc->name, w, i);
                    metric(name, thr, every ? d.worst : d.median);
                    CHECKF(every ? d.worst <= thr : d.median <= thr, "%s %s world rank %d request %d: cuda vs cpu "
                           "ranks %s row %.3g over %.0e", pc->name, L->name, w, i, every ? "worst" : "median",
                           every ? d.worst : d.median, thr);
                }
            }
        }
        /* Opt-in (K3C_TEST_NCCL_PPEP=1, NCCL 2.30 or later for several ranks on one device): the same ranks over
         * NCCL (comm/nccl.c: grouped ncclSend / ncclRecv, ncclCommSplit), whose logits must be bitwise the
         * staged communicator's: PP and DEP move bytes, and a sum of two TP ranks is the same in either order. */
        const char *nv = getenv("K3C_TEST_NCCL_PPEP");
        if (rc == K3C_OK && nv && atoi(nv)) {
            setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 0);
            setenv("NCCL_NVLS_ENABLE", "0", 0);
            k3c_model *shn[8] = {0};
            rrun nc[8];
            memset(nc, 0, sizeof nc);
            int rn = run_layout_comm(&fx, L, 1, 1, pc->exact, shn, nc);
            CHECKF(rn == K3C_OK, "%s: %s", pc->name, k3c_error_message());
            for (int w = first_last; w < n && rn == K3C_OK; w++) {
                int eq = 1;
                for (int i = 0; i < gpu[w].nreq; i++) eq &= same_bits(&nc[w], &gpu[w], i);
                printf("INFO %s %s world rank %d over NCCL: %s the staged communicator's\n", pc->name, L->name, w,
                       eq ? "bitwise equal to" : "DIFFERS from");
                CHECKF(eq, "%s %s world rank %d: NCCL's logits differ from the staged communicator's", pc->name,
                       L->name, w);
            }
            for (int w = 0; w < n; w++) {
                free_run(&nc[w]);
                k3c_model_shard_free(shn[w]);
            }
        } else if (rc == K3C_OK && li == 0) {
            printf("INFO %s: the layouts over NCCL not run (K3C_TEST_NCCL_PPEP=1 runs them, NCCL 2.30+)\n", pc->name);
        }
        if (rc != K3C_OK) failed = 1;
        for (int w = 0; w < n; w++) {
            free_run(&gpu[w]);
            free_run(&cpu[w]);
            k3c_model_shard_free(sh[w]);
            k3c_model_shard_free(shc[w]);
        }
    }
    for (int k = 0; k < 3; k++) free_run(&one[k]), free_run(&fn[k]);
    k3c_model_free(fx.m);
}

static const ppep_case cases[] = {
    {"k3_f32", 0, 0, 1, 0, 1e-5, 1, 1},
    {"k3_f32_dense", 0, 0, 1, 1, 1e-5, 1, 0},
    {"k3_bf16", 0, 0, 0, 1, 2.0, 1, 1},
    {"kimi_linear_f32", 1, 0, 1, 0, 1e-5, 1, 1},
    {"kimi_linear_bf16", 1, 0, 0, 1, 2.0, 1, 0},
    {"k3slice_4layers_bf16", 0, 4, 0, 1, 2.0, 0, 0},
};

TEST(gpu_ppep_k3_f32) { check_case(&cases[0]); }
TEST(gpu_ppep_k3_f32_dense) { check_case(&cases[1]); }
TEST(gpu_ppep_k3_bf16) { check_case(&cases[2]); }
TEST(gpu_ppep_kimi_linear_f32) { check_case(&cases[3]); }
TEST(gpu_ppep_kimi_linear_bf16) { check_case(&cases[4]); }
/* a few GB synthesized into the test's scratch folder (TMPDIR) */
TEST(gpu_ppep_k3slice_4layers) { check_case(&cases[5]); }
