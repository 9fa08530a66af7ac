/* Stock tensor parallelism on the CUDA backend, several ranks on one GPU (one host thread, one backend and so
 * one stream per rank; NCCL refuses two ranks on one device, so the ranks' collectives go through the staged
 * communicator, comm/staged.c: device -> host on the rank's stream, the in-memory group's rank-order sum,
 * host -> device). Mirrors tests/test_tp.c (the CPU ranks) on the GPU:
 *  - the staged communicator against sums written out in rank order (bitwise), its gather and broadcast, its
 *    ordering on the rank's stream, a missing peer (bounded), a call inside a graph capture (refused);
 *  - the backend's TP ops: embed rows of -0.0 for another rank's tokens, round = bf16_round, moe_partial's
 *    parts against moe in the exact diagnostic (the same kernels: r + s is moe's output bitwise);
 *  - the stock forward of TP 2 and TP 4 rank shards (model/shard.h) on tiny K3 and tiny Kimi Linear configs
 *    whose heads split 4 (and 8) ways (test_tp.c's tp_config), a 70-token prompt (one whole chunked KDA block)
 *    and 8 greedy decode steps, against world size 1 on the same GPU within test_tp.c's tolerances (f32
 *    activations: every row within 1e-5 and greedy streams equal but at a near-tie; bf16: no farther from the
 *    f32 function than 2x world size 1's own bf16 logits), every rank's logits bitwise those of rank 0, and
 *    against the CPU ranks of the same shards within test_gpu_forward.c's CPU-vs-CUDA tolerances (f32 dense
 *    routing: every row 1e-4; f32 preset routing: median row 1e-4; bf16 dense routing: median row 5e-2);
 *  - a 4-layer full-width K3 slice (k3-slice's layer widths, 64 experts, a vocabulary of 32768; synthesized
 *    on disk: ~10 GB), TP 2 and 4 against world size 1 in bf16;
 *  - each TP rank's specialized executor over the staged communicator plans every step stock (decode/plan.h
 *    K3C_STOCK_TP_UNPREPARED); over the CUDA mailbox it is prepared (test_gpu_tp_exec.c).
 * Prints "METRIC <name> rel_l2 <threshold> <value>" lines (tools/gpu-check.sh tabulates them) and INFO lines. */
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "comm/mailbox_cuda.h"
#include "comm/comm.h"
#include "cuda/backend_cuda.h"
#include "decode/executor_cuda.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/shard.h"
#include "model/synth.h"
#include "stock/forward.h"
#include "../test.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/rng.h"
#include "../tp_config.h"

#define GROUP_MS 60000 /* the longest any rank waits for the others in one collective */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- METRIC lines ---- */

static struct { char name[64]; double thr, value; } metrics[64];
static int num_metrics;

static void metric(const char *name, double thr, double value) {
    if (num_metrics == 64) return;
    snprintf(metrics[num_metrics].name, sizeof metrics[0].name, "%s", name);
    metrics[num_metrics].thr = thr;
    metrics[num_metrics].value = value;
    num_metrics++;
}

__attribute__((destructor)) static void print_metrics(void) {
    for (int i = 0; i < num_metrics; i++)
        printf("METRIC %-28s rel_l2 %8.1e %10.3e\n", metrics[i].name, metrics[i].thr, metrics[i].value);
}

/* ---- the staged communicator ---- */

static float rand_value(k3c_rng *g) {
    uint64_t u = k3c_rng_next(g);
    switch (u % 8) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return (float)((double)(u >> 11) * 0x1p-53 * 1e30); /* large: the order decides what is lost */
    case 3: return -(float)((double)(u >> 11) * 0x1p-53 * 1e-30);
    default: return (float)((double)(u >> 11) * 0x1p-53 * 2.0 - 1.0);
    }
}

#define AR_ROUNDS 30
#define AR_MAX 5000

typedef struct comm_job {
    k3c_comm_group *grp;
    int rank, size;
    size_t sizes[AR_ROUNDS];
    float *in[AR_ROUNDS];  /* host inputs */
    float *out[AR_ROUNDS]; /* host results */
    unsigned char gather_in[8][64], gather_out[2][8 * 64], bcast[64];
    int rc;
    char err[512];
} comm_job;

/* Each call's input is uploaded right before the call and the result downloaded right after it, both queued
 * on the rank's stream without a wait: the collective must come after the upload and before the download in
 * stream order (comm/comm.h stream_ordered). */
static int comm_rank(comm_job *j) {
    cudaStream_t st = NULL;
    k3c_comm *c = NULL;
    float *d = NULL, *pin = NULL;
    unsigned char *dg = NULL, *dsrc = NULL;
    int rc = K3C_OK;
    cudaError_t e = cudaSetDevice(0);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d, AR_MAX * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc((void **)&dg, 8 * 64);
    if (e == cudaSuccess) e = cudaMalloc((void **)&dsrc, 64);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&pin, 2 * AR_MAX * sizeof(float), cudaHostAllocDefault);
    if (e != cudaSuccess) rc = k3c_errorf("rank %d: %s", j->rank, cudaGetErrorString(e));
    if (rc == K3C_OK) rc = k3c_comm_staged_create(j->grp, j->rank, 0, st, 20000, &c);
    for (int r = 0; r < AR_ROUNDS && rc == K3C_OK; r++) {
        size_t n = j->sizes[r];
        memcpy(pin, j->in[r], n * sizeof(float));
        if (cudaMemcpyAsync(d, pin, n * sizeof(float), cudaMemcpyHostToDevice, st) != cudaSuccess)
            rc = k3c_errorf("upload");
        if (rc == K3C_OK) rc = c->all_reduce_f32(c, d, n);
        if (rc == K3C_OK && cudaMemcpyAsync(pin + AR_MAX, d, n * sizeof(float), cudaMemcpyDeviceToHost, st) != cudaSuccess)
            rc = k3c_errorf("download");
        if (rc == K3C_OK && cudaStreamSynchronize(st) != cudaSuccess) rc = k3c_errorf("stream");
        if (rc == K3C_OK) memcpy(j->out[r], pin + AR_MAX, n * sizeof(float));
    }
    /* gather from a buffer of its own, then in place (src = dst + rank * 64), the inputs queued on the
     * stream just before; then a broadcast from the last rank and a barrier */
    unsigned char *hp = (unsigned char *)pin; /* pinned: the async copies below read it after this returns */
    for (int inplace = 0; inplace < 2 && rc == K3C_OK; inplace++) {
        unsigned char *src = inplace ? dg + j->rank * 64 : dsrc;
        memcpy(hp, j->gather_in[j->rank], 64);
        if (cudaMemsetAsync(dg, 0xee, 8 * 64, st) != cudaSuccess ||
            cudaMemcpyAsync(src, hp, 64, cudaMemcpyHostToDevice, st) != cudaSuccess)
            rc = k3c_errorf("gather setup");
        if (rc == K3C_OK) rc = c->all_gather(c, src, dg, 64);
        if (rc == K3C_OK &&
            (cudaMemcpyAsync(hp + 64, dg, (size_t)j->size * 64, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
             cudaStreamSynchronize(st) != cudaSuccess))
            rc = k3c_errorf("gather download");
        if (rc == K3C_OK) memcpy(j->gather_out[inplace], hp + 64, (size_t)j->size * 64);
    }
    if (rc == K3C_OK) {
        for (int i = 0; i < 64; i++) hp[i] = (unsigned char)(j->rank * 64 + i);
        if (cudaMemcpyAsync(dg, hp, 64, cudaMemcpyHostToDevice, st) != cudaSuccess) rc = k3c_errorf("bcast setup");
        if (rc == K3C_OK) rc = c->broadcast(c, dg, 64, j->size - 1);
        if (rc == K3C_OK) rc = c->barrier(c);
        if (rc == K3C_OK && (cudaMemcpyAsync(hp + 64, dg, 64, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
                             cudaStreamSynchronize(st) != cudaSuccess))
            rc = k3c_errorf("bcast download");
        if (rc == K3C_OK) memcpy(j->bcast, hp + 64, 64);
    }
    if (rc != K3C_OK) {
        snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
        if (c) c->abort(c);
    }
    if (c) c->free(c);
    if (d) cudaFree(d);
    if (dg) cudaFree(dg);
    if (dsrc) cudaFree(dsrc);
    if (pin) cudaFreeHost(pin);
    if (st) cudaStreamDestroy(st);
    return rc;
}

static void *comm_thread(void *p) {
    comm_job *j = p;
    j->rc = comm_rank(j);
    return NULL;
}

TEST(gpu_tp_comm_staged) {
    k3c_rng g;
    k3c_rng_seed(&g, test_seed());
    static comm_job jobs[8];
    int sizes_to_test[] = {1, 2, 3, 4, 8};
    for (int si = 0; si < 5; si++) {
        int size = sizes_to_test[si];
        k3c_comm_group *grp;
        CHECK_OK(k3c_comm_group_create(size, GROUP_MS, &grp));
        size_t sizes[AR_ROUNDS];
        for (int r = 0; r < AR_ROUNDS; r++) sizes[r] = r == 3 ? 0 : 1 + k3c_rng_next(&g) % (r % 5 == 0 ? 7 : AR_MAX);
        for (int k = 0; k < size; k++) {
            comm_job *j = &jobs[k];
            memset(j, 0, sizeof *j);
            j->grp = grp, j->rank = k, j->size = size;
            memcpy(j->sizes, sizes, sizeof sizes);
            for (int r = 0; r < AR_ROUNDS; r++) {
                j->in[r] = malloc((sizes[r] + 1) * sizeof(float));
                j->out[r] = malloc((sizes[r] + 1) * sizeof(float));
                for (size_t i = 0; i < sizes[r]; i++) j->in[r][i] = rand_value(&g);
                poison_f32(j->out[r], sizes[r] + 1);
            }
            for (int i = 0; i < 64; i++) j->gather_in[k][i] = (unsigned char)k3c_rng_next(&g);
        }
        for (int k = 0; k < size; k++) /* every rank knows every rank's gather input */
            for (int q = 0; q < size; q++) memcpy(jobs[k].gather_in[q], jobs[q].gather_in[q], 64);
        pthread_t th[8];
        for (int k = 0; k < size; k++) pthread_create(&th[k], NULL, comm_thread, &jobs[k]);
        for (int k = 0; k < size; k++) pthread_join(th[k], NULL);
        int bad = 0;
        for (int k = 0; k < size && !bad; k++)
            if (jobs[k].rc != K3C_OK) {
                test_fail(__FILE__, __LINE__, "%d ranks: rank %d: %s", size, k, jobs[k].err);
                bad = 1;
            }
        long diff = 0;
        for (int r = 0; r < AR_ROUNDS && !bad; r++)
            for (size_t i = 0; i < sizes[r]; i++) {
                float want = jobs[0].in[r][i];
                for (int k = 1; k < size; k++) want += jobs[k].in[r][i];
                for (int k = 0; k < size; k++) diff += memcmp(&jobs[k].out[r][i], &want, sizeof want) != 0;
            }
        CHECKF(diff == 0, "%d ranks: %ld elements differ bitwise from the rank-order sum", size, diff);
        for (int k = 0; k < size && !bad; k++) {
            for (int inplace = 0; inplace < 2; inplace++)
                for (int q = 0; q < size; q++)
                    CHECKF(!memcmp(jobs[k].gather_out[inplace] + q * 64, jobs[q].gather_in[q], 64),
                           "%d ranks: rank %d's gather (%s) holds the wrong bytes of rank %d", size, k,
                           inplace ? "in place" : "separate", q);
            for (int i = 0; i < 64; i++) CHECK(jobs[k].bcast[i] == (unsigned char)((size - 1) * 64 + i));
        }
        for (int k = 0; k < size; k++)
            for (int r = 0; r < AR_ROUNDS; r++) free(jobs[k].in[r]), free(jobs[k].out[r]);
        printf("INFO staged comm, %d ranks: %d all-reduces (0 .. %d floats) bitwise the rank-order sums, gathers "
               "and a broadcast\n", size, AR_ROUNDS, AR_MAX);
    }
}

typedef struct fail_job {
    k3c_comm_group *grp;
    int rank, absent;
    double secs;
    int rc, called;
} fail_job;

static void *fail_thread(void *p) {
    fail_job *j = p;
    cudaStream_t st = NULL;
    float *d = NULL;
    k3c_comm *c = NULL;
    j->rc = K3C_ERR;
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&d, 64) != cudaSuccess || k3c_comm_staged_create(j->grp, j->rank, 0, st, 20000, &c) != K3C_OK)
        return NULL;
    double t0 = now_s();
    if (!j->absent) j->rc = c->all_reduce_f32(c, d, 16), j->called = 1;
    else usleep(1500 * 1000); /* joined but silent: stays in the group (its free would end the group early:
                               * the last rank's free frees it) until the others have timed out */
    j->secs = now_s() - t0;
    c->free(c);
    cudaFree(d);
    cudaStreamDestroy(st);
    return NULL;
}

/* A rank that never calls: the others fail after the group's timeout (300 ms), naming it, instead of
 * hanging. A call while the rank's stream is being captured: refused (a host wait cannot be captured). */
TEST(gpu_tp_comm_staged_failures) {
    k3c_comm_group *grp;
    CHECK_OK(k3c_comm_group_create(3, 300, &grp));
    fail_job j[3];
    pthread_t th[3];
    for (int k = 0; k < 3; k++) {
        j[k] = (fail_job){grp, k, k == 0, 0, K3C_OK, 0};
        pthread_create(&th[k], NULL, fail_thread, &j[k]);
    }
    for (int k = 0; k < 3; k++) pthread_join(th[k], NULL);
    for (int k = 1; k < 3; k++)
        CHECKF(j[k].called && j[k].rc == K3C_ERR && j[k].secs >= 0.25 && j[k].secs < 10,
               "rank %d: %s, rc %d after %.2f s (the group's timeout is 0.3 s)", k, j[k].called ? "called" : "never called",
               j[k].rc, j[k].secs);
    printf("INFO staged comm: with rank 0 absent ranks 1, 2 failed after %.2f / %.2f s\n", j[1].secs, j[2].secs);

    CHECK_OK(k3c_comm_group_create(1, 1000, &grp));
    cudaStream_t st;
    float *d;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMalloc((void **)&d, 64) == cudaSuccess);
    k3c_comm *c;
    CHECK_OK(k3c_comm_staged_create(grp, 0, 0, st, 1000, &c));
    CHECK(c->stream_ordered == 1 && c->size == 1 && c->rank == 0);
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    int rc = c->all_reduce_f32(c, d, 16);
    cudaGraph_t graph = NULL;
    cudaStreamEndCapture(st, &graph);
    if (graph) cudaGraphDestroy(graph);
    CHECK(rc == K3C_ERR && strstr(k3c_error_message(), "captured"));
    CHECK(c->all_reduce_f32(c, d, 16) == K3C_ERR); /* the failure aborted the group */
    c->free(c);
    cudaFree(d);
    cudaStreamDestroy(st);
}

/* ---- the models ---- */


/* k3-slice's dims (K3's layer widths, 64 experts), the first `layers` layers: 4 holds the dense layer 0, two
 * MoE KDA layers and the MoE MLA layer 3. The vocabulary cut to 32768 (a fifth of K3's): the embedding and the LM
 * head would be 4.7 of the 14 GB to synthesize, for no width the ranks split differently. ~10 GB. */
static int slice_config(int layers, int dense_routing, k3c_config *c) {
    K3C_TRY(k3c_preset_config("k3-slice", c));
    if (layers < c->num_layers) c->num_layers = layers;
    c->vocab_size = 32768;
    c->bos_token_id = c->eos_token_id = c->pad_token_id = -1;
    if (dense_routing) {
        c->num_experts_per_token = c->num_experts;
        c->topk_group = c->num_expert_group;
    }
    return k3c_config_validate(c);
}

/* ---- the backend's TP ops ---- */

static int backend_ops(int kimi_linear, k3c_rng *g) {
    k3c_config c;
    K3C_TRY(tp_config(kimi_linear, 0, &c));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/gtp_ops_%d", test_tmpdir(), kimi_linear);
    int rc = k3c_synth_write(&c, NULL, test_seed() ^ 0x6f7073, dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    k3c_model *m;
    K3C_TRY(k3c_model_load(dir, &m));
    const k3c_config *mc = &m->config;
    int D = mc->hidden_size, V = mc->vocab_size, T = 6, Rin = k3c_config_expert_in(mc);
    k3c_backend *be = k3c_backend_cuda_create(0);
    if (!be) {
        k3c_model_free(m);
        return K3C_ERR;
    }
    k3c_backend_cuda_set_exact(be, 1);
    k3c_backend_limits lim = {.max_rows = 8, .max_segs = 2, .max_context = 64, .block_size = 16};
    size_t nb = (size_t)T * (D > Rin ? D : Rin) * 4 * 4;
    float *h = malloc(nb), *h2 = malloc(nb), *dy = NULL, *dout = NULL, *dr = NULL, *ds = NULL;
    rc = be->init(be, m, &lim);
    if (rc == K3C_OK) {
        dy = be->alloc(be, (size_t)T * D * 4), dout = be->alloc(be, (size_t)T * D * 4);
        dr = be->alloc(be, (size_t)T * Rin * 4), ds = be->alloc(be, (size_t)T * D * 4);
        if (!dy || !dout || !dr || !ds || !h || !h2) rc = k3c_errorf("out of memory");
    }
    /* embed: valid ids their rows, -1 (another rank's token) a row of -0.0 */
    int32_t ids[6] = {0, -1, V - 1, -1, 7, -1};
    if (rc == K3C_OK) {
        be->embed(be, &m->weights.embed, ids, T, dout);
        be->download(be, h, dout, (size_t)T * D * 4);
        rc = be->sync(be);
    }
    for (int t = 0; t < T && rc == K3C_OK; t++)
        for (int i = 0; i < D; i++) {
            float want = ids[t] >= 0 ? bf16_to_f32(m->weights.embed.w[(size_t)ids[t] * D + i]) : -0.0f;
            if (memcmp(&h[(size_t)t * D + i], &want, 4)) {
                rc = k3c_errorf("embed row %d (id %d) element %d: %g, expected %g", t, ids[t], i,
                                (double)h[(size_t)t * D + i], (double)want);
                break;
            }
        }
    /* round: bf16_round bitwise, in the bf16 contract (the exact diagnostic rounds nothing) */
    k3c_backend_cuda_set_exact(be, 0);
    if (rc == K3C_OK) {
        for (int i = 0; i < T * D; i++) h2[i] = rand_value(g) * (i % 3 ? 1.0f : 3e-39f); /* subnormals too */
        be->upload(be, dout, h2, (size_t)T * D * 4);
        be->round(be, dout, (size_t)T * D);
        be->download(be, h, dout, (size_t)T * D * 4);
        rc = be->sync(be);
        for (int i = 0; i < T * D && rc == K3C_OK; i++) {
            float want = bf16_round(h2[i]);
            if (memcmp(&h[i], &want, 4)) rc = k3c_errorf("round of %a: %a, expected %a", h2[i], h[i], want);
        }
    }
    k3c_backend_cuda_set_exact(be, 1);
    /* moe_partial against moe in the exact diagnostic, every MoE layer of Kimi Linear (no latent, so moe's
     * output is r + s): nothing is rounded in either, and the same kernels must give moe's output bitwise. K3's
     * latent MoE is checked through the forward's parity tests below. */
    int layers = 0;
    for (int l = 0; l < mc->num_layers && rc == K3C_OK && kimi_linear; l++) {
        const k3c_layer_weights *lw = &m->weights.layers[l];
        if (!lw->is_moe) continue;
        layers++;
        for (int i = 0; i < T * D; i++) h2[i] = bf16_round((float)((double)(k3c_rng_next(g) >> 11) * 0x1p-53 * 2 - 1));
        be->upload(be, dy, h2, (size_t)T * D * 4);
        be->moe(be, &lw->moe, dy, T, dout);
        be->moe_partial(be, &lw->moe, dy, T, dr, ds);
        float *out = h, *r = h + (size_t)T * D, *s = h + 2 * (size_t)T * D;
        be->download(be, out, dout, (size_t)T * D * 4);
        be->download(be, r, dr, (size_t)T * Rin * 4);
        be->download(be, s, ds, (size_t)T * D * 4);
        rc = be->sync(be);
        int shared = lw->moe.shared.gate.w != NULL; /* without one, moe's output is the routed sum itself */
        for (int i = 0; i < T * D && rc == K3C_OK; i++) {
            float want = shared ? r[i] + s[i] : r[i];
            if (memcmp(&out[i], &want, 4))
                rc = k3c_errorf("layer %d: moe %a, moe_partial's r + s %a (element %d)", l, out[i], want, i);
        }
    }
    if (rc == K3C_OK && kimi_linear) printf("INFO moe_partial: r + s bitwise moe's output on %d layers\n", layers);
    free(h);
    free(h2);
    if (dy) be->free(be, dy);
    if (dout) be->free(be, dout);
    if (dr) be->free(be, dr);
    if (ds) be->free(be, ds);
    be->destroy(be);
    k3c_model_free(m);
    return rc;
}

TEST(gpu_tp_backend_ops) {
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x6270);
    CHECK_OK(backend_ops(0, &g));
    CHECK_OK(backend_ops(1, &g));
}

/* ---- the sharded forward ---- */

typedef struct rank_run {
    const k3c_model *m;   /* the rank's model (a shard, or the whole model at world size 1) */
    k3c_comm_group *grp;  /* NULL at world size 1 */
    int rank, cuda, exact;
    int check_executor;   /* CUDA TP rank: build its executor, which must plan every step stock */
    k3c_backend *be;      /* NULL: run_rank makes its own; else made (and destroyed here) with comm below */
    k3c_comm *comm;       /* with be: the rank's communicator over be's stream (the mailbox) */
    pthread_barrier_t *ready; /* with comm: every rank's setup done before any rank's first collective (setup
                               * allocates and frees pinned memory, which waits for the whole device) */
    const int32_t *prompt;
    int n_prompt, n_new;
    float *prompt_logits; /* [n_prompt, V]: every prompt row */
    float *step_logits;   /* [n_new, V]: the logits each greedy token was taken from */
    int32_t *stream;      /* [n_new] */
    int rc;
    char err[512];
} rank_run;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* A TP rank's executor (decode/executor_cuda.h) over the staged communicator: built over the rank's backend,
 * caches and communicator, it must route every step stock (the staged communicator's host wait cannot be
 * captured, so its providers are not prepared for TP), on every rank alike; capture refuses. The executor
 * over the CUDA mailbox, which is prepared: test_gpu_tp_exec.c. */
static int check_rank_executor(rank_run *r, k3c_backend *be, k3c_kv_cache *kv, k3c_kda_slots *ks, int ctx, int bs,
                               k3c_comm *comm) {
    int size = r->m->tp_size;
    k3c_decode_env env = {.m = r->m, .be = be, .kv = kv, .ks = ks, .max_requests = 1, .max_rows = r->n_prompt,
                          .max_context = ctx, .block_size = bs, .q_max = 1, .max_blocks_per_request = (ctx + bs - 1) / bs,
                          .tp = comm};
    k3c_decode_cuda *x = NULL;
    if (k3c_decode_cuda_build(&env, r->rank, 1, &x) == K3C_OK) { /* a shard at world size 1: refused */
        k3c_decode_cuda_free(x);
        return k3c_errorf("rank %d: the executor was built for world size 1 over a shard", r->rank);
    }
    K3C_TRY(k3c_decode_cuda_build(&env, r->rank, size, &x));
    int rc = k3c_decode_cuda_prepare_kv(x, 1);
    const k3c_decode_executor *ex = k3c_decode_cuda_executor(x);
    int one = 1;
    uint8_t no = 0;
    k3c_step_shape sh = {1, &one, &no, 0};
    k3c_plan p = k3c_plan_step(&ex->plan_table, &sh);
    if (rc == K3C_OK && (p.route != K3C_ROUTE_STOCK || p.reason != K3C_STOCK_TP_UNPREPARED))
        rc = k3c_errorf("rank %d of %d: a decode step planned route %d (%s), not stock for want of TP providers",
                        r->rank, size, p.route, k3c_stock_reason_name(p.reason));
    if (rc == K3C_OK && k3c_decode_cuda_capture(x, 1, 1) == K3C_OK)
        rc = k3c_errorf("rank %d: the executor captured a shape without TP providers", r->rank);
    if (rc == K3C_OK) k3c_error_clear();
    k3c_decode_cuda_free(x);
    return rc;
}

static int run_rank(rank_run *r) {
    const k3c_config *c = &r->m->config;
    int V = c->vocab_size * (r->m->tp_size > 1 ? r->m->tp_size : 1), bs = 16, ctx = r->n_prompt + r->n_new;
    k3c_backend *be = r->be ? r->be : r->cuda ? k3c_backend_cuda_create(0) : k3c_backend_cpu_create(1);
    if (!be) return K3C_ERR;
    if (r->cuda) k3c_backend_cuda_set_exact(be, r->exact);
    else k3c_backend_cpu_set_exact(be, r->exact);
    k3c_comm *comm = r->comm;
    int rc = K3C_OK;
    if (!comm && r->grp)
        rc = r->cuda ? k3c_comm_staged_create(r->grp, r->rank, 0, k3c_backend_cuda_stream(be), GROUP_MS, &comm)
                     : k3c_comm_group_join(r->grp, r->rank, &comm);
    k3c_forward_options o = {.max_rows = r->n_prompt, .max_segs = 2, .max_context = ctx + 1, .block_size = bs,
                             .tp = comm};
    k3c_forward *f = NULL;
    k3c_kv_cache kv = {0};
    k3c_kda_slots ks = {0};
    int32_t table[64];
    if (rc == K3C_OK) rc = k3c_forward_create(be, r->m, &o, &f);
    if (rc == K3C_OK) rc = k3c_kv_cache_init(&kv, be, c, (ctx + bs - 1) / bs + 1, bs);
    if (rc == K3C_OK) rc = k3c_kda_slots_init(&ks, be, c, 1, 1, 2);
    if (rc == K3C_OK && r->check_executor) rc = check_rank_executor(r, be, &kv, &ks, ctx + 1, bs, comm);
    if (r->ready) pthread_barrier_wait(r->ready); /* reached by every rank: setup makes no collective call */
    if (rc == K3C_OK) {
        k3c_kda_slots_reset(&ks, be, 0);
        for (int i = 0; i < (ctx + bs - 1) / bs; i++) table[i] = k3c_kv_cache_take(&kv);
        k3c_fwd_req q = {.ids = r->prompt, .n = r->n_prompt, .pos = 0, .block_table = table, .slot = 0,
                         .logits = K3C_LOGITS_ALL};
        rc = k3c_forward_step(f, &kv, &ks, &q, 1, r->prompt_logits, NULL);
        int32_t tok = rc == K3C_OK ? argmax(r->prompt_logits + (size_t)(r->n_prompt - 1) * V, V) : 0;
        for (int s = 0; s < r->n_new && rc == K3C_OK; s++) {
            r->stream[s] = tok;
            q = (k3c_fwd_req){.ids = &tok, .n = 1, .pos = r->n_prompt + s, .block_table = table, .slot = 0,
                              .logits = K3C_LOGITS_LAST};
            rc = k3c_forward_step(f, &kv, &ks, &q, 1, r->step_logits + (size_t)s * V, NULL);
            tok = argmax(r->step_logits + (size_t)s * V, V);
        }
    }
    if (rc != K3C_OK) {
        snprintf(r->err, sizeof r->err, "%s", k3c_error_message());
        if (comm) comm->abort(comm); /* the other ranks fail at once instead of waiting */
    }
    k3c_kda_slots_release(&ks, be);
    k3c_kv_cache_release(&kv, be);
    k3c_forward_free(f);
    if (comm) comm->free(comm); /* before the backend's stream goes */
    be->destroy(be);
    return rc;
}

static void *rank_thread(void *p) {
    rank_run *r = p;
    r->rc = run_rank(r);
    return NULL;
}

static void free_run(rank_run *r) {
    free(r->prompt_logits);
    free(r->step_logits);
    free(r->stream);
    r->prompt_logits = r->step_logits = NULL;
    r->stream = NULL;
}

static int alloc_run(rank_run *r, int V) {
    r->prompt_logits = malloc((size_t)r->n_prompt * V * sizeof(float));
    r->step_logits = malloc((size_t)r->n_new * V * sizeof(float));
    r->stream = malloc((size_t)r->n_new * sizeof(int32_t));
    if (!r->prompt_logits || !r->step_logits || !r->stream) return k3c_errorf("out of memory for logits");
    poison_f32(r->prompt_logits, (size_t)r->n_prompt * V);
    poison_f32(r->step_logits, (size_t)r->n_new * V);
    return K3C_OK;
}

/* Row distances: worst and median rel L2 over rows (NaN counts as inf). */
typedef struct rows_cmp {
    double worst, median;
    int n, over;
} rows_cmp;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static rows_cmp compare_rows(const float *a, const float *b, int rows, int V, double thr) {
    rows_cmp r = {0, 0, rows, 0};
    if (rows <= 0) return r;
    double *d = malloc(sizeof(double) * rows);
    for (int i = 0; i < rows; i++) {
        double e = rel_l2_f32f32(a + (size_t)i * V, b + (size_t)i * V, (size_t)V);
        d[i] = e == e ? e : INFINITY;
        if (!(d[i] <= r.worst)) r.worst = d[i];
        if (!(d[i] <= thr)) r.over++;
    }
    qsort(d, rows, sizeof *d, cmp_double);
    r.median = d[rows / 2];
    free(d);
    return r;
}

/* The tokens two streams share from the start. */
static int same_prefix(const int32_t *a, const int32_t *b, int n) {
    int s = 0;
    while (s < n && a[s] == b[s]) s++;
    return s;
}

/* tp ranks of m's shards, cuda or CPU, one thread each; runs[k] filled (the caller frees their logits).
 * cuda: the staged communicator (the NCCL-free reference), or with `mailbox` the CUDA mailbox one
 * (comm/mailbox_cuda.h), whose ranks are made together over the backends' streams before the threads start. */
static int run_tp_comm(const k3c_model *m, int tp, int cuda, int mailbox, int exact, int check_executor,
                       const int32_t *prompt, int np, int nn, int V, k3c_model **sh, rank_run *runs) {
    k3c_comm_group *grp = NULL;
    k3c_backend *bes[8] = {0};
    k3c_comm *mbx[8] = {0};
    if (mailbox) {
        void *streams[8] = {0};
        int devices[8] = {0};
        for (int k = 0; k < tp; k++) {
            if (!(bes[k] = k3c_backend_cuda_create(0))) {
                for (int j = 0; j < k; j++) bes[j]->destroy(bes[j]);
                return K3C_ERR;
            }
            streams[k] = k3c_backend_cuda_stream(bes[k]);
        }
        /* slots for the logits gather (a rank's np x V / tp floats) and the hidden rows' sums */
        k3c_comm_mailbox_options mo = {.cap = (size_t)np * V > ((size_t)1 << 20) ? (size_t)np * V : (size_t)1 << 20,
                                       .threads = 1};
        if (k3c_comm_mailbox_create(tp, devices, streams, &mo, mbx) != K3C_OK) {
            for (int k = 0; k < tp; k++) bes[k]->destroy(bes[k]);
            return K3C_ERR;
        }
    } else {
        K3C_TRY(k3c_comm_group_create(tp, GROUP_MS, &grp));
    }
    pthread_barrier_t ready;
    if (mailbox) pthread_barrier_init(&ready, NULL, (unsigned)tp);
    for (int k = 0; k < tp; k++) {
        runs[k] = (rank_run){.m = sh[k], .grp = grp, .rank = k, .cuda = cuda, .exact = exact,
                             .check_executor = check_executor, .be = bes[k], .comm = mbx[k],
                             .ready = mailbox ? &ready : NULL, .prompt = prompt, .n_prompt = np, .n_new = nn};
        if (alloc_run(&runs[k], V) != K3C_OK) return K3C_ERR; /* leaks the group: the test fails anyway */
    }
    pthread_t th[8];
    for (int k = 0; k < tp; k++) pthread_create(&th[k], NULL, rank_thread, &runs[k]);
    for (int k = 0; k < tp; k++) pthread_join(th[k], NULL);
    if (mailbox) pthread_barrier_destroy(&ready);
    for (int k = 0; k < tp; k++)
        if (runs[k].rc != K3C_OK) return k3c_errorf("%s tp %d rank %d: %s", cuda ? "cuda" : "cpu", tp, k, runs[k].err);
    for (int k = 1; k < tp; k++)
        if (memcmp(runs[k].prompt_logits, runs[0].prompt_logits, (size_t)np * V * 4) ||
            memcmp(runs[k].step_logits, runs[0].step_logits, (size_t)nn * V * 4) ||
            memcmp(runs[k].stream, runs[0].stream, (size_t)nn * 4))
            return k3c_errorf("%s tp %d: rank %d's logits differ from rank 0's", cuda ? "cuda" : "cpu", tp, k);
    return K3C_OK;
}

static int run_tp(const k3c_model *m, int tp, int cuda, int exact, int check_executor, const int32_t *prompt, int np,
                  int nn, int V, k3c_model **sh, rank_run *runs) {
    return run_tp_comm(m, tp, cuda, 0, exact, check_executor, prompt, np, nn, V, sh, runs);
}

/* The CPU-vs-CUDA bounds of test_gpu_forward.c. */
#define VS_CPU_F32 1e-4  /* f32: every row with dense routing, the median row with the preset's */
#define VS_CPU_BF16 5e-2 /* bf16, dense routing: median row */

typedef struct tp_case {
    const char *name;
    int kimi_linear, slice_layers; /* slice_layers > 0: the full-width k3-slice instead of the tiny configs */
    int exact, dense;
    double tol;     /* f32: rel L2 to world size 1; bf16: x world size 1's own noise */
    int vs_cpu;     /* also the CPU ranks of the same shards */
} tp_case;

/* World size 1 on the GPU against TP 2 and 4 on the GPU (and the CPU) of the same model's shards. */
static void check_gpu_tp(const tp_case *tc) {
    k3c_config c;
    int rc = tc->slice_layers ? slice_config(tc->slice_layers, tc->dense, &c) : tp_config(tc->kimi_linear, tc->dense, &c);
    CHECK_OK(rc);
    if (rc != K3C_OK) return;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/gtp_%s", test_tmpdir(), tc->name);
    uint64_t seed = test_seed() ^ k3c_hash_str(tc->name);
    double t0 = now_s();
    rc = k3c_synth_write(&c, NULL, seed, dir);
    int V = c.vocab_size;
    k3c_config_free(&c);
    CHECK_OK(rc);
    if (rc != K3C_OK) return;
    k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    if (tc->slice_layers) printf("INFO %s: %.2f GB synthesized and mapped in %.1f s\n", tc->name, m->weight_bytes / 1e9,
                                 now_s() - t0);
    enum { NP = 70, NN = 8 };
    int32_t prompt[NP];
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ 0x7a11);
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    rank_run one = {.m = m, .cuda = 1, .exact = tc->exact, .prompt = prompt, .n_prompt = NP, .n_new = NN};
    rank_run fn = {.m = m, .cuda = 1, .exact = 1, .prompt = prompt, .n_prompt = NP, .n_new = NN};
    int failed = alloc_run(&one, V) != K3C_OK || run_rank(&one) != K3C_OK;
    CHECKF(!failed, "%s world size 1: %s", tc->name, one.err);
    double noise = 0;
    if (!failed && !tc->exact) { /* bf16: the f32 function on the GPU */
        failed = alloc_run(&fn, V) != K3C_OK || run_rank(&fn) != K3C_OK;
        CHECKF(!failed, "%s world size 1, f32: %s", tc->name, fn.err);
        if (!failed) {
            noise = compare_rows(one.prompt_logits, fn.prompt_logits, NP, V, 0).worst;
            printf("INFO %s bf16 world size 1 vs f32: worst row rel L2 %.3g (prompt)\n", tc->name, noise);
        }
    }
    for (int tp = 2; tp <= 4 && !failed; tp *= 2) {
        k3c_model *sh[8] = {0};
        rank_run gpu[8], cpu[8];
        memset(gpu, 0, sizeof gpu);
        memset(cpu, 0, sizeof cpu);
        for (int k = 0; k < tp && !failed; k++) {
            rc = k3c_model_shard_tp(m, k, tp, &sh[k]);
            CHECK_OK(rc);
            failed = rc != K3C_OK;
        }
        double t1 = now_s();
        if (!failed) {
            rc = run_tp(m, tp, 1, tc->exact, 1, prompt, NP, NN, V, sh, gpu);
            CHECKF(rc == K3C_OK, "%s: %s", tc->name, k3c_error_message());
            failed = rc != K3C_OK;
        }
        double t_gpu = now_s() - t1;
        if (!failed) {
            rows_cmp pr = compare_rows(gpu[0].prompt_logits, one.prompt_logits, NP, V, tc->tol);
            int same = same_prefix(gpu[0].stream, one.stream, NN);
            rows_cmp dr = compare_rows(gpu[0].step_logits, one.step_logits, same, V, tc->tol);
            double wf = tc->exact ? 0 : compare_rows(gpu[0].prompt_logits, fn.prompt_logits, NP, V, 0).worst;
            printf("INFO %s tp %d: worst row rel L2 vs world size 1: prompt %.3g, decode %.3g; greedy %d/%d tokens "
                   "equal", tc->name, tp, pr.worst, dr.worst, same, NN);
            if (!tc->exact) printf("; prompt vs the f32 function %.3g (world size 1's %.3g)", wf, noise);
            printf("; ranks bitwise equal; %.2f s\n", t_gpu);
            char name[64];
            snprintf(name, sizeof name, "tp%d_%s_vs_ws1", tp, tc->name);
            if (tc->exact) {
                metric(name, tc->tol, fmax(pr.worst, dr.worst));
                CHECKF(pr.worst <= tc->tol && dr.worst <= tc->tol, "%s tp %d: rel L2 %.3g / %.3g over %.3g", tc->name,
                       tp, pr.worst, dr.worst, tc->tol);
                if (same < NN) { /* f32: the stream may part only at a greedy near-tie of world size 1's logits */
                    const float *lg = same == 0 ? one.prompt_logits + (size_t)(NP - 1) * V
                                                : one.step_logits + (size_t)(same - 1) * V;
                    int a = argmax(lg, V);
                    float second = -INFINITY;
                    for (int i = 0; i < V; i++)
                        if (i != a && lg[i] > second) second = lg[i];
                    CHECKF(lg[a] - second < 1e-4f, "%s tp %d f32: greedy stream parts at token %d (margin %g)",
                           tc->name, tp, same, (double)(lg[a] - second));
                }
            } else {
                metric(name, tc->tol * noise, fmax(wf, pr.worst));
                CHECKF(wf <= tc->tol * noise && pr.worst <= tc->tol * noise,
                       "%s tp %d bf16: %.3g from the f32 function and %.3g from world size 1's bf16, against world "
                       "size 1's own %.3g (x %.1f allowed)", tc->name, tp, wf, pr.worst, noise, tc->tol);
            }
        }
        /* The same ranks over the CUDA mailbox: both sum in rank order in f32, so bitwise equal. (These once
         * stalled until the mailbox timeout: a rank's pageable logits download held the driver's lock that the
         * peer's next launch needed, cuda/backend_cuda.c host_pageable.) */
        if (!failed) {
            rank_run mb[8];
            memset(mb, 0, sizeof mb);
            double t2 = now_s();
            rc = run_tp_comm(m, tp, 1, 1, tc->exact, 0, prompt, NP, NN, V, sh, mb);
            CHECKF(rc == K3C_OK, "%s mailbox: %s", tc->name, k3c_error_message());
            if (rc == K3C_OK) {
                int same = !memcmp(mb[0].prompt_logits, gpu[0].prompt_logits, (size_t)NP * V * 4) &&
                           !memcmp(mb[0].step_logits, gpu[0].step_logits, (size_t)NN * V * 4) &&
                           !memcmp(mb[0].stream, gpu[0].stream, (size_t)NN * 4);
                printf("INFO %s tp %d over the CUDA mailbox: logits and stream %s the staged communicator's; "
                       "%.2f s\n", tc->name, tp, same ? "bitwise equal to" : "DIFFER from", now_s() - t2);
                CHECKF(same, "%s tp %d: the mailbox communicator's logits differ from the staged one's", tc->name, tp);
            }
            for (int k = 0; k < tp; k++) free_run(&mb[k]);
        }
        if (!failed && tc->vs_cpu) {
            rc = run_tp(m, tp, 0, tc->exact, 0, prompt, NP, NN, V, sh, cpu);
            CHECKF(rc == K3C_OK, "%s: %s", tc->name, k3c_error_message());
            if (rc == K3C_OK) {
                /* the prompt rows, and the decode rows while both streams fed the same tokens */
                double thr = tc->exact ? VS_CPU_F32 : VS_CPU_BF16;
                rows_cmp pr = compare_rows(gpu[0].prompt_logits, cpu[0].prompt_logits, NP, V, thr);
                int same = same_prefix(gpu[0].stream, cpu[0].stream, NN);
                rows_cmp dr = compare_rows(gpu[0].step_logits, cpu[0].step_logits, same, V, thr);
                int every = tc->exact && tc->dense;
                double med = pr.median, worst = fmax(pr.worst, dr.worst);
                printf("INFO %s tp %d cuda vs cpu ranks: prompt median %.3g worst %.3g, decode worst %.3g (%d/%d "
                       "tokens equal), %d rows over %.0e\n", tc->name, tp, pr.median, pr.worst, dr.worst, same, NN,
                       pr.over + dr.over, thr);
                char name[64];
                snprintf(name, sizeof name, "tp%d_%s_vs_cpu_%s", tp, tc->name, every ? "worst" : "median");
                metric(name, thr, every ? worst : med);
                if (every)
                    CHECKF(worst <= thr, "%s tp %d: cuda vs cpu ranks worst row %.3g over %.0e", tc->name, tp, worst, thr);
                else
                    CHECKF(med <= thr, "%s tp %d: cuda vs cpu ranks median row %.3g over %.0e", tc->name, tp, med, thr);
            }
        }
        for (int k = 0; k < tp; k++) {
            free_run(&gpu[k]);
            free_run(&cpu[k]);
            k3c_model_shard_free(sh[k]);
        }
    }
    free_run(&one);
    free_run(&fn);
    k3c_model_free(m);
}

static const tp_case cases[] = {
    {"k3_f32", 0, 0, 1, 0, 1e-5, 1},
    {"k3_f32_dense", 0, 0, 1, 1, 1e-5, 1},
    {"k3_bf16", 0, 0, 0, 1, 2.0, 1},
    {"kimi_linear_f32", 1, 0, 1, 0, 1e-5, 1},
    {"kimi_linear_f32_dense", 1, 0, 1, 1, 1e-5, 1},
    {"kimi_linear_bf16", 1, 0, 0, 1, 2.0, 1},
    {"k3slice_4layers_bf16", 0, 4, 0, 1, 2.0, 0},
};

TEST(gpu_tp_k3_f32) { check_gpu_tp(&cases[0]); }
TEST(gpu_tp_k3_f32_dense) { check_gpu_tp(&cases[1]); }
TEST(gpu_tp_k3_bf16) { check_gpu_tp(&cases[2]); }
TEST(gpu_tp_kimi_linear_f32) { check_gpu_tp(&cases[3]); }
TEST(gpu_tp_kimi_linear_f32_dense) { check_gpu_tp(&cases[4]); }
TEST(gpu_tp_kimi_linear_bf16) { check_gpu_tp(&cases[5]); }
/* ~10 GB synthesized into the test's scratch folder (TMPDIR), as much GPU memory at world size 1 */
TEST(gpu_tp_k3slice_4layers) { check_gpu_tp(&cases[6]); }
