/* GPU kernel benchmark (not a test): achieved bandwidth of the big decode kernels next to a measured
 * device-to-device copy bandwidth (bytes read + written), in the same run. Weights are rotated among
 * enough copies that each launch streams from HBM, not from the 60 MB L2. Times are medians of CUDA-event
 * timed launches after warm-up. Prints one line per kernel:
 *   BENCH <name> <bytes> <median us> <GB/s> <fraction of copy bandwidth>
 * Usage: bench_gpu [gemm] [group] [moe] [kda] [mla] [mlacore] [small] (sections; none: all; mla includes
 * mlacore). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/elementwise.h"
#include "cuda/gemm.h"
#include "cuda/kda.h"
#include "cuda/mla.h"
#include "cuda/mla_expanded.h"
#include "cuda/moe.h"
#include "cuda/router.h"
#include "cuda/sample.h"
#include "format/mxfp4.h"
#include "gpu_util.h"
#include "util/error.h"

#define REPS 30
/* samples per timed row: REPS, or K3C_BENCH_REPS (1..REPS) for a profiler run that wants few launches of
 * each kernel (tools/gpu-profile.sh) */
static int reps = REPS;

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double copy_gbs;

static void report(const char *name, double bytes, float *ms, int n) {
    qsort(ms, n, sizeof *ms, cmp_f);
    double med = ms[n / 2] * 1e-3;
    double gbs = bytes / med / 1e9;
    printf("BENCH %-34s %12.0f %10.1f %8.0f %6.3f\n", name, bytes, med * 1e6, gbs, copy_gbs > 0 ? gbs / copy_gbs : 0);
    fflush(stdout);
}

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) DIE("%s: %s", #call, cudaGetErrorString(e_)); } while (0)
#define OK(call) do { if ((call) != 0) DIE("%s: %s", #call, k3c_error_message()); } while (0)

typedef int (*launch_fn)(void *ctx, int rep);

/* REPS samples of one measured call between two events on stream st (after it ran once), each divided by
 * per, the launches in the call: the median goes to report. */
static void time_samples(const char *name, double bytes, cudaStream_t st, launch_fn call, void *ctx, int per) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    OK(call(ctx, 0));
    CK(cudaStreamSynchronize(st));
    float ms[REPS];
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, st));
        OK(call(ctx, i));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&ms[i], a, b));
        ms[i] /= per;
    }
    CK(cudaGetLastError());
    report(name, bytes, ms, reps);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

static void time_it(const char *name, double bytes, launch_fn fn, void *ctx) {
    for (int i = 0; i < 2; i++) OK(fn(ctx, i));
    time_samples(name, bytes, 0, fn, ctx, 1);
}


/* BATCH_N launches back to back between two events (rotating inputs as above), time per launch: the
 * per-launch event gap is gone and launch latency overlaps the previous kernel, as in a decode step. */
#define BATCH_N 20
typedef struct { launch_fn fn; void *ctx; } batch_ctx;
static int run_batch(void *c, int rep) {
    batch_ctx *x = c;
    for (int j = 0; j < BATCH_N; j++)
        if (x->fn(x->ctx, rep * BATCH_N + j) != 0) return -1;
    return 0;
}
static void time_batch(const char *name, double bytes, launch_fn fn, void *ctx) {
    batch_ctx c = {fn, ctx};
    for (int i = 0; i < 2; i++) OK(fn(ctx, i));
    time_samples(name, bytes, 0, run_batch, &c, BATCH_N);
}

/* BATCH_N launches captured once as a CUDA graph, the graph replayed between two events: time per launch
 * as in a decode step's graph (launch cost included, host launch overhead not). For the small kernels of a
 * step, whose time is mostly launch and ramp. ctx's first member is the stream the launches go to. */
typedef struct { cudaGraphExec_t ge; cudaStream_t st; } graph_ctx;
static int run_graph(void *c, int rep) {
    graph_ctx *x = c;
    return cudaGraphLaunch(x->ge, x->st) == cudaSuccess ? 0 : -1;
}
static void time_graph(const char *name, double bytes, launch_fn fn, void *ctx) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaStream_t *sp = (cudaStream_t *)ctx, keep = *sp;
    *sp = st;
    for (int i = 0; i < 3; i++) OK(fn(ctx, i));
    CK(cudaStreamSynchronize(st));
    cudaGraph_t g;
    graph_ctx gc = {NULL, st};
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    for (int j = 0; j < BATCH_N; j++) OK(fn(ctx, j));
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&gc.ge, g, 0));
    time_samples(name, bytes, st, run_graph, &gc, BATCH_N);
    cudaGraphExecDestroy(gc.ge);
    cudaGraphDestroy(g);
    *sp = keep;
    cudaStreamDestroy(st);
}

/* ---- small per-layer kernels (router, norm, add, activation) ---- */
typedef struct {
    cudaStream_t st; /* first: time_graph swaps it */
    int kind, T, n;
    k3c_cuda_router r;
    float *a, *b, *w, *y;
    int *idx;
    float *gu, *o; /* kinds 4, 5: the shared expert's gate and up rows [T, 2n], the activation [T, n] */
} small_ctx;
static int run_small(void *c, int rep) {
    small_ctx *x = c;
    switch (x->kind) {
    case 0: return k3c_cuda_route(&x->r, x->a, x->w, x->T, x->idx, x->y, x->st);
    case 1: return k3c_cuda_rmsnorm(x->a, x->n, x->w, x->T, x->n, 1e-6f, 1, x->y, x->n, x->st);
    case 2: return k3c_cuda_add(x->a, x->b, (size_t)x->T * x->n, 1, x->y, x->st);
    case 4: /* the MoE's routing and shared activation as two launches, as the stock path */
        if (k3c_cuda_route(&x->r, x->a, x->w, x->T, x->idx, x->y, x->st)) return -1;
        return k3c_cuda_gated_act((k3c_cuda_act){1, 0, 0}, x->gu, 2 * x->n, x->gu + x->n, 2 * x->n, x->T, x->n, 1, x->o,
                                  x->st);
    case 5: /* the same in one launch, as the decode executor */
        return k3c_cuda_route_act(&x->r, x->a, x->w, x->T, x->idx, x->y, (k3c_cuda_act){1, 0, 0}, x->gu, 2 * x->n,
                                  x->gu + x->n, 2 * x->n, x->n, 1, x->o, x->st);
    case 6: /* the greedy arg-max, one block a row */
        return k3c_cuda_argmax_rows(x->a, x->T, x->n, x->idx, x->st);
    case 7: /* the same in parts, as the decode executor (the host's reduction of the keys not timed) */
        return k3c_cuda_argmax_keys(x->a, x->T, x->n, k3c_cuda_argmax_parts(x->T), (uint64_t *)x->y, x->st);
    default: {
        k3c_cuda_act act = {0};
        return k3c_cuda_gated_act(act, x->a, x->n, x->b, x->n, x->T, x->n, 1, x->y, x->st);
    }
    }
}

/* ---- copy ---- */
typedef struct { void *src, *dst; size_t n; } copy_ctx;
static int run_copy(void *c, int rep) {
    copy_ctx *x = c;
    return cudaMemcpyAsync(x->dst, x->src, x->n, cudaMemcpyDeviceToDevice, 0) == cudaSuccess ? 0 : -1;
}

/* ---- gemv ---- */
typedef struct { uint16_t **W; int copies, rows, cols, T; float *x, *y; k3c_cuda_gemm *g; } gemv_ctx;
static int run_gemv(void *c, int rep) {
    gemv_ctx *x = c;
    return k3c_cuda_matmul_bf16(x->g, x->W[rep % x->copies], x->rows, x->cols, x->x, x->T, x->y, 0);
}

/* ---- grouped products (the executor's packed projections) ---- */
#define GROUP_N K3C_CUDA_GEMV_GROUP_MAX
/* copies of the weights, rotated per launch so that they are not read from L2 (as in the gemm section) */
typedef struct {
    k3c_cuda_gemv_seg seg[GROUP_N];
    uint16_t *Wc[16][GROUP_N];
    int n, T, separate, copies;
    k3c_cuda_gemm *g;
} group_ctx;
static int run_group(void *c, int rep) {
    group_ctx *x = c;
    for (int i = 0; i < x->n; i++) x->seg[i].W = x->Wc[rep % x->copies][i];
    if (!x->separate) return k3c_cuda_gemv_group(x->g, x->seg, x->n, x->T, 0);
    for (int i = 0; i < x->n; i++) /* one launch per product, as the stock path runs them */
        if (k3c_cuda_matmul_bf16_round(x->g, x->seg[i].W, x->seg[i].rows, x->seg[i].cols, x->seg[i].x, x->T,
                                       x->seg[i].y, x->seg[i].round, 0) != 0)
            return -1;
    return 0;
}

/* ---- moe ---- */
typedef struct {
    k3c_cuda_expert *tab;
    int E, In, F, Out, T, k, mode; /* mode 0: all, 1: gate_up, 2: down */
    int mx;                        /* 1: MXFP4 experts, 0: bf16 */
    int *idx[4];
    float *w, *x, *h, *part, *out;
} moe_ctx;
static int run_moe(void *c, int rep) {
    moe_ctx *m = c;
    k3c_cuda_act act = {2, 4.0f, 25.0f};
    int *idx = m->idx[rep % 4];
    if (m->mode == 1) return k3c_cuda_moe_gate_up(m->tab, m->E, m->mx, m->In, m->F, m->x, m->T, idx, m->k, act, 1, m->h, 0);
    if (m->mode == 2)
        return k3c_cuda_moe_down(m->tab, m->E, m->mx, m->F, m->Out, m->h, m->T * m->k, m->k, idx, 1, m->part, 0);
    return k3c_cuda_moe_experts(m->tab, m->E, m->mx, m->In, m->F, m->Out, m->x, m->T, idx, m->w, m->k, act, 1, m->h,
                                m->part, m->out, 0);
}

/* ---- kda ---- */
typedef struct { float *S[4], *q, *k, *v, *g, *beta, *o; int H, dk, T; } kda_ctx;
static int run_kda(void *c, int rep) {
    kda_ctx *x = c;
    return k3c_cuda_kda_recurrent(x->S[rep % 4], x->q, x->k, x->v, x->g, x->beta, x->T, x->H, x->dk, x->dk, 1, x->o,
                                  NULL, 0);
}

/* ---- mla ---- */
typedef struct {
    float *qabs, *olat, *part;
    size_t npart;
    int *toff, *lens, *tables;
    void *cache;
    int Hm, T, bs;
} mla_ctx;
static int run_mla(void *c, int rep) {
    mla_ctx *x = c;
    return k3c_cuda_mla_attend(x->qabs, x->toff, x->lens, x->tables, x->bs, x->cache, 2, x->T, x->Hm, 512, 64,
                               1.0f / sqrtf(192.0f), x->olat, x->part, x->npart, 0);
}

/* ---- mla decode core (absorbed form): absorb_q, attend, absorb_o as the decode step calls them ---- */
#define CORE_COPIES 8
typedef struct {
    uint16_t *kvb[CORE_COPIES];
    void *cache[CORE_COPIES];
    int ccopies;
    float *q, *qabs, *olat, *o, *part;
    size_t npart;
    int *toff, *lens, *tables;
    int Hm, T, bs, nope, rope, vh, kvl;
} core_ctx;
static int run_absq(void *c, int rep) {
    core_ctx *x = c;
    return k3c_cuda_mla_absorb_q(x->kvb[rep % CORE_COPIES], x->q, x->T, x->Hm, x->nope, x->rope, x->vh, x->kvl,
                                 x->qabs, 0);
}
static int run_abso(void *c, int rep) {
    core_ctx *x = c;
    return k3c_cuda_mla_absorb_o(x->kvb[rep % CORE_COPIES], x->olat, x->T, x->Hm, x->nope, x->vh, x->kvl, 1, x->o, 0);
}
static int run_core_attend(void *c, int rep) {
    core_ctx *x = c;
    return k3c_cuda_mla_attend(x->qabs, x->toff, x->lens, x->tables, x->bs, x->cache[rep % x->ccopies], 2, x->T,
                               x->Hm, x->kvl, x->rope, 1.0f / sqrtf((float)(x->nope + x->rope)), x->olat, x->part,
                               x->npart, 0);
}

static void *dmalloc_rand_mask(size_t bytes, unsigned seed, uint64_t mask);
static void *dmalloc_rand(size_t bytes, unsigned seed) { return dmalloc_rand_mask(bytes, seed, 0xbfffbfffbfffbfffull); }
/* f32 activations that are bf16 values (low 16 bits zero), as the model's bf16 path produces: the tensor-core
 * kernels then need one mma term instead of three. */
static void *dmalloc_rand_bf16x(size_t bytes, unsigned seed) {
    return dmalloc_rand_mask(bytes, seed, 0xbfff0000bfff0000ull);
}
static void *dmalloc_rand_mask(size_t bytes, unsigned seed, uint64_t mask) {
    void *d;
    CK(cudaMalloc(&d, bytes));
    /* random bytes from the host in pieces of up to 64 MiB (never zeros: they can run faster than real data),
     * only as many as the buffer needs. A whole 64 MiB piece for each buffer cost ~9 ms of host work
     * (measured on the 2-core development machine) plus a fresh 64 MiB allocation, times the 960 expert
     * matrices of the moe section, which took ~50 s a run (2026-11-30) */
    size_t piece = bytes < (64u << 20) ? (bytes + 7) & ~(size_t)7 : 64u << 20;
    unsigned char *h = malloc(piece);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < piece; i += 8) {
        uint64_t v = k3c_splitmix64(&s);
        /* keep bf16 / f32 values finite and moderate: clear the top exponent bits of each 16-bit half */
        v &= mask;
        memcpy(h + i, &v, 8);
    }
    for (size_t off = 0; off < bytes; off += piece)
        CK(cudaMemcpy((char *)d + off, h, bytes - off < piece ? bytes - off : piece, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* The device buffers of one moe_ctx beyond the selections: uniform 1/k weights, bf16-valued activations
 * (seed), h, part and out. */
static void moe_ctx_buffers(moe_ctx *m, unsigned seed) {
    int T = m->T, k = m->k;
    float *hw = malloc(sizeof(float) * T * k);
    for (int i = 0; i < T * k; i++) hw[i] = 1.0f / k;
    CK(cudaMalloc((void **)&m->w, sizeof(float) * T * k));
    CK(cudaMemcpy(m->w, hw, sizeof(float) * T * k, cudaMemcpyHostToDevice));
    free(hw);
    m->x = dmalloc_rand_bf16x((size_t)T * m->In * 4, seed);
    CK(cudaMalloc((void **)&m->h, (size_t)T * k * m->F * 4));
    CK(cudaMalloc((void **)&m->part, (size_t)T * k * m->Out * 4));
    CK(cudaMalloc((void **)&m->out, (size_t)T * m->Out * 4));
}

/* Sections named on the command line run (after the copy bandwidth, always measured); none: all. */
static int bench_argc;
static char **bench_argv;
static int want(const char *section) {
    if (bench_argc < 2) return 1;
    for (int i = 1; i < bench_argc; i++)
        if (strcmp(bench_argv[i], section) == 0) return 1;
    return 0;
}

int main(int argc, char **argv) {
    bench_argc = argc;
    bench_argv = argv;
    const char *reps_env = getenv("K3C_BENCH_REPS");
    if (reps_env) {
        reps = atoi(reps_env);
        if (reps < 1 || reps > REPS) DIE("K3C_BENCH_REPS=%s: want 1..%d", reps_env, REPS);
    }
    int dev = 0;
    CK(cudaSetDevice(dev));
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

    { /* copy bandwidth: 1 GiB, bytes read + written */
        copy_ctx c = {dmalloc_rand(1u << 30, 1), NULL, 1u << 30};
        CK(cudaMalloc(&c.dst, c.n));
        copy_gbs = 0;
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
        float ms[REPS];
        for (int i = 0; i < 3; i++) run_copy(&c, i);
        for (int i = 0; i < REPS; i++) {
            CK(cudaEventRecord(a, 0)); run_copy(&c, i); CK(cudaEventRecord(b, 0)); CK(cudaEventSynchronize(b));
            CK(cudaEventElapsedTime(&ms[i], a, b));
        }
        qsort(ms, REPS, sizeof *ms, cmp_f);
        copy_gbs = 2.0 * c.n / (ms[REPS / 2] * 1e-3) / 1e9;
        report("d2d_copy_1GiB(read+write)", 2.0 * c.n, ms, REPS);
        cudaFree(c.src); cudaFree(c.dst);
    }

    if (want("gemm")) { /* bf16 gemv / gemm at decode widths */
        static const int shapes[][2] = {{12288, 7168}, {7168, 12288}, {4096, 4096}, {2048, 4096}, {576, 7168}, {896, 7168},
                                        {163840, 7168}};
        void *ws;
        CK(cudaMalloc(&ws, 32u << 20));
        uint16_t *xbf;
        CK(cudaMalloc((void **)&xbf, 64 * 12288 * 2));
        k3c_cuda_gemm g;
        OK(k3c_cuda_gemm_init(&g, ws, 32u << 20, xbf, 64 * 12288));
        float *x = dmalloc_rand_bf16x(64 * 12288 * 4, 7), *xf = dmalloc_rand(64 * 12288 * 4, 8), *y;
        CK(cudaMalloc((void **)&y, (size_t)64 * 163840 * 4));
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t bytes = (size_t)rows * cols * 2;
            int copies = (int)((512u << 20) / bytes) + 1;
            if (copies > 16) copies = 16;
            if (bytes > (512u << 20)) copies = 1; /* lm_head-sized: far larger than L2 already */
            uint16_t *W[16];
            for (int i = 0; i < copies; i++) W[i] = dmalloc_rand(bytes, 100 + i);
            static const int Ts[] = {1, 2, 4, 8, 16, 64};
            for (int ti = 0; ti < 6; ti++) {
                int T = Ts[ti];
                if (rows == 163840 && T > 1) continue;
                gemv_ctx c = {W, copies, rows, cols, T, x, y, &g};
                char name[64];
                snprintf(name, sizeof name, "gemm_bf16_%dx%d_T%d", rows, cols, T);
                time_it(name, (double)bytes + (double)T * cols * 4 + (double)T * rows * 4, run_gemv, &c);
                if (T == 1 || T == 8) {
                    snprintf(name, sizeof name, "gemm_bf16_%dx%d_T%d_b2b", rows, cols, T);
                    time_batch(name, (double)bytes + (double)T * cols * 4 + (double)T * rows * 4, run_gemv, &c);
                }
                if (T == 8 && rows == 12288) { /* f32 activations: three mma terms */
                    gemv_ctx cf = c;
                    cf.x = xf;
                    snprintf(name, sizeof name, "gemm_bf16_%dx%d_T%d_f32x", rows, cols, T);
                    time_it(name, (double)bytes + (double)T * cols * 4 + (double)T * rows * 4, run_gemv, &cf);
                }
            }
            for (int i = 0; i < copies; i++) cudaFree(W[i]);
        }
        k3c_cuda_gemm_free(&g);
        cudaFree(ws); cudaFree(xbf); cudaFree(x); cudaFree(xf); cudaFree(y);
    }

    if (want("group")) { /* grouped products vs one launch per product, back to back as in a step */
        static const struct { const char *name; int cols, n, rows[GROUP_N]; } sets[] = {
            {"kl48_kda_in", 2304, 6, {4096, 4096, 4096, 128, 32, 128}}, /* q, k, v, f_a, b, g_a */
            {"kl48_moe_front", 2304, 3, {256, 1024, 1024}},             /* router, shared gate, up */
            {"k3_mla_in", 7168, 2, {1536, 576}},                        /* q_a, kv_a */
            {"k3_moe_front", 7168, 4, {896, 3584, 6144, 6144}},         /* router, latent down, shared gate, up */
            {"k3_kda_in", 7168, 6, {12288, 12288, 12288, 128, 96, 12288}}, /* q, k, v, f_a, b, g (K3: 96 x 128;
                                                                              * its output gate is full rank) */
        };
        void *ws;
        CK(cudaMalloc(&ws, 32u << 20));
        uint16_t *xbf;
        CK(cudaMalloc((void **)&xbf, 64 * 7168 * 2));
        k3c_cuda_gemm g;
        OK(k3c_cuda_gemm_init(&g, ws, 32u << 20, xbf, 64 * 7168));
        float *x = dmalloc_rand_bf16x(8 * 7168 * 4, 9);
        for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
            group_ctx c = {.n = sets[k].n, .g = &g};
            double bytes = 0;
            for (int i = 0; i < c.n; i++) bytes += (double)sets[k].rows[i] * sets[k].cols * 2;
            c.copies = (int)((512u << 20) / bytes) + 1;
            if (c.copies > 16) c.copies = 16;
            for (int i = 0; i < c.n; i++) {
                size_t wb = (size_t)sets[k].rows[i] * sets[k].cols * 2;
                float *y;
                CK(cudaMalloc((void **)&y, (size_t)8 * sets[k].rows[i] * 4));
                for (int j = 0; j < c.copies; j++) c.Wc[j][i] = dmalloc_rand(wb, 200 + 16 * i + j);
                c.seg[i] = (k3c_cuda_gemv_seg){c.Wc[0][i], sets[k].rows[i], sets[k].cols, x, y, i > 0};
            }
            static const int Ts[] = {1, 8};
            for (int ti = 0; ti < 2; ti++)
                for (int sep = 0; sep < 2; sep++) {
                    c.T = Ts[ti];
                    c.separate = sep;
                    char name[64];
                    snprintf(name, sizeof name, "group_%s_T%d%s_b2b", sets[k].name, c.T, sep ? "_separate" : "");
                    time_batch(name, bytes, run_group, &c);
                }
            for (int i = 0; i < c.n; i++) {
                for (int j = 0; j < c.copies; j++) cudaFree(c.Wc[j][i]);
                cudaFree(c.seg[i].y);
            }
        }
        cudaFree(x);
        k3c_cuda_gemm_free(&g);
        cudaFree(ws);
        cudaFree(xbf);
    }

    if (want("moe")) { /* MXFP4 experts, K3 shape (In 3584, F 3072), 64 experts, top-16, T = 1, 4, 8, 16, 32, 64 */
        int E = 64, In = 3584, F = 3072, Out = 3584, k = 16;
        /* scales 2^-8 .. 2^1 (E8M0 119 .. 128), as real weights have them (|w| <= 12; the device-synthetic
         * presets use 2^-7); K3C_BENCH_MX_BIG=1: 2^-8 .. 2^7, the only distribution before 2026-11-30: every
         * warp step then has a scale above 2^1 and takes the kernels' second multiply (cuda/mxfp4.cuh),
         * which real weights never need */
        int span = getenv("K3C_BENCH_MX_BIG") ? 16 : 10;
        k3c_cuda_expert *tab = calloc(E, sizeof *tab);
        size_t pgu = (size_t)F * In / 2, sgu = (size_t)F * In / 32, pd = (size_t)Out * F / 2, sd = (size_t)Out * F / 32;
        for (int e = 0; e < E; e++) {
            tab[e].gate_packed = dmalloc_rand(pgu, 1000 + 6 * e);
            tab[e].up_packed = dmalloc_rand(pgu, 1001 + 6 * e);
            tab[e].down_packed = dmalloc_rand(pd, 1002 + 6 * e);
            uint8_t *hs = malloc(sgu > sd ? sgu : sd);
            for (size_t i = 0; i < (sgu > sd ? sgu : sd); i++) hs[i] = (uint8_t)(119 + (i * 7 + e) % span);
            void *a, *b, *c;
            CK(cudaMalloc(&a, sgu)); CK(cudaMalloc(&b, sgu)); CK(cudaMalloc(&c, sd));
            CK(cudaMemcpy(a, hs, sgu, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(b, hs, sgu, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(c, hs, sd, cudaMemcpyHostToDevice));
            tab[e].gate_scale = a; tab[e].up_scale = b; tab[e].down_scale = c;
            free(hs);
        }
        k3c_cuda_expert *dtab;
        CK(cudaMalloc((void **)&dtab, sizeof *tab * E));
        CK(cudaMemcpy(dtab, tab, sizeof *tab * E, cudaMemcpyHostToDevice));
        static const int T_mx[] = {1, 4, 8, 16, 32, 64};
        for (int ti = 0; ti < 6; ti++) {
            int T = T_mx[ti];
            moe_ctx m;
            memset(&m, 0, sizeof m);
            m.tab = dtab; m.E = E; m.In = In; m.F = F; m.Out = Out; m.T = T; m.k = k; m.mx = 1;
            /* 4 rotating selections of 16 distinct experts per token. T <= 8: windows of 16 (quarters of the
             * 64, a token 5 further on); T >= 16: a router's top-k without a favourite, each token's 16 drawn
             * at random (seeded), as k3c bench's device-synthetic routing spreads them (~T / 4 pairs an
             * expert, binomially: at T = 64 about 40% of the experts have more than 16, which tiles of 16
             * stream twice). The bytes counted are those of the distinct experts of selection 0. */
            int distinct = 0;
            unsigned char seen[64] = {0};
            uint64_t rs = 0x5eedull + (uint64_t)T;
            for (int r = 0; r < 4; r++) {
                int *hi = malloc(sizeof(int) * T * k);
                for (int t = 0; t < T; t++) {
                    int pool[64];
                    for (int e = 0; e < E; e++) pool[e] = e;
                    for (int j = 0; j < k; j++) {
                        int e = (r * 16 + j + t * 5) % E;
                        if (T >= 16) { /* a partial shuffle: 16 distinct of 64 */
                            int sj = j + (int)(k3c_splitmix64(&rs) % (uint64_t)(E - j)), tmp = pool[j];
                            pool[j] = pool[sj], pool[sj] = tmp;
                            e = pool[j];
                        }
                        hi[t * k + j] = e;
                        if (r == 0 && !seen[e]) seen[e] = 1, distinct++;
                    }
                }
                CK(cudaMalloc((void **)&m.idx[r], sizeof(int) * T * k));
                CK(cudaMemcpy(m.idx[r], hi, sizeof(int) * T * k, cudaMemcpyHostToDevice));
                free(hi);
            }
            moe_ctx_buffers(&m, 9);
            double gu = (double)distinct * 2 * (pgu + sgu), dn = (double)distinct * (pd + sd);
            char name[64];
            m.mode = 1;
            snprintf(name, sizeof name, "moe_mxfp4_gate_up_T%d_k16", T);
            time_it(name, gu, run_moe, &m);
            m.mode = 2; /* h as gate/up left it: bf16 values (round_bf16), not zeros */
            snprintf(name, sizeof name, "moe_mxfp4_down_T%d_k16", T);
            time_it(name, dn, run_moe, &m);
            m.mode = 0;
            snprintf(name, sizeof name, "moe_mxfp4_all_T%d_k16", T);
            time_it(name, gu + dn, run_moe, &m);
            snprintf(name, sizeof name, "moe_mxfp4_all_T%d_k16_b2b", T);
            time_batch(name, gu + dn, run_moe, &m);
            if (T == 1) { /* f32 activations (three mma terms); h of the down half stays as gate/up left it */
                float *xb = m.x;
                m.x = dmalloc_rand((size_t)T * In * 4, 10);
                m.mode = 1;
                time_it("moe_mxfp4_gate_up_T1_k16_f32x", gu, run_moe, &m);
                cudaFree(m.x);
                m.x = xb;
            }
            for (int r = 0; r < 4; r++) cudaFree(m.idx[r]);
            cudaFree(m.w); cudaFree(m.x); cudaFree(m.h); cudaFree(m.part); cudaFree(m.out);
        }
    }

    if (want("moe")) { /* bf16 experts, Kimi Linear 48B shape (In 2304, F 1024), 256 experts, top-8, T = 1, 8, 32,
                        * 64 (512 pairs: past the per-pair path, the band kernels or the grouped one) */
        int E = 256, In = 2304, F = 1024, Out = 2304, k = 8;
        k3c_cuda_expert *tab = calloc(E, sizeof *tab);
        size_t bgu = (size_t)F * In * 2, bd = (size_t)Out * F * 2;
        for (int e = 0; e < E; e++) {
            tab[e].gate_w = dmalloc_rand(bgu, 3000 + 3 * e);
            tab[e].up_w = dmalloc_rand(bgu, 3001 + 3 * e);
            tab[e].down_w = dmalloc_rand(bd, 3002 + 3 * e);
        }
        k3c_cuda_expert *dtab;
        CK(cudaMalloc((void **)&dtab, sizeof *tab * E));
        CK(cudaMemcpy(dtab, tab, sizeof *tab * E, cudaMemcpyHostToDevice));
        static const int T_l[] = {1, 8, 32, 64};
        for (int ti = 0; ti < 4; ti++) {
            int T = T_l[ti];
            moe_ctx m;
            memset(&m, 0, sizeof m);
            m.tab = dtab; m.E = E; m.In = In; m.F = F; m.Out = Out; m.T = T; m.k = k; m.mx = 0;
            /* 4 rotating selections, k distinct experts per token (j * 29 mod 256 differ for j < 8); the bytes
             * counted are those of the distinct experts of selection 0 (the others have the same count) */
            int distinct = 0;
            unsigned char seen[256] = {0};
            for (int r = 0; r < 4; r++) {
                int *hi = malloc(sizeof(int) * T * k);
                for (int t = 0; t < T; t++)
                    for (int j = 0; j < k; j++) {
                        int e = (r * 64 + t * 11 + j * 29) % E;
                        hi[t * k + j] = e;
                        if (r == 0 && !seen[e]) seen[e] = 1, distinct++;
                    }
                CK(cudaMalloc((void **)&m.idx[r], sizeof(int) * T * k));
                CK(cudaMemcpy(m.idx[r], hi, sizeof(int) * T * k, cudaMemcpyHostToDevice));
                free(hi);
            }
            moe_ctx_buffers(&m, 11);
            double gu = (double)distinct * 2 * bgu, dn = (double)distinct * bd;
            char name[64];
            m.mode = 1;
            snprintf(name, sizeof name, "moe_bf16_gate_up_T%d_k8", T);
            time_it(name, gu, run_moe, &m);
            m.mode = 2;
            snprintf(name, sizeof name, "moe_bf16_down_T%d_k8", T);
            time_it(name, dn, run_moe, &m);
            m.mode = 0;
            snprintf(name, sizeof name, "moe_bf16_all_T%d_k8", T);
            time_it(name, gu + dn, run_moe, &m);
            for (int r = 0; r < 4; r++) cudaFree(m.idx[r]);
            cudaFree(m.w); cudaFree(m.x); cudaFree(m.h); cudaFree(m.part); cudaFree(m.out);
        }
        for (int e = 0; e < E; e++) {
            cudaFree((void *)tab[e].gate_w); cudaFree((void *)tab[e].up_w); cudaFree((void *)tab[e].down_w);
        }
        cudaFree(dtab);
        free(tab);
    }

    if (want("kda")) { /* KDA recurrent decode step, K3 heads: state read + written once */
        kda_ctx c;
        memset(&c, 0, sizeof c);
        c.H = 96; c.dk = 128; c.T = 1;
        size_t ns = (size_t)c.H * c.dk * c.dk;
        for (int i = 0; i < 4; i++) {
            c.S[i] = dmalloc_rand(ns * 4, 20 + i);
            CK(cudaMemset(c.S[i], 0, ns * 4)); /* a fresh state; decays keep it bounded */
        }
        size_t n = (size_t)c.T * c.H * c.dk;
        c.q = dmalloc_rand(n * 4, 30); c.k = dmalloc_rand(n * 4, 31); c.v = dmalloc_rand(n * 4, 32);
        CK(cudaMalloc((void **)&c.g, n * 4)); CK(cudaMemset(c.g, 0, n * 4));
        CK(cudaMalloc((void **)&c.beta, (size_t)c.T * c.H * 4)); CK(cudaMemset(c.beta, 0, (size_t)c.T * c.H * 4));
        CK(cudaMalloc((void **)&c.o, n * 4));
        time_it("kda_recurrent_H96_128x128_T1", 2.0 * ns * 4, run_kda, &c);
        time_batch("kda_recurrent_H96_128x128_T1_b2b", 2.0 * ns * 4, run_kda, &c);
        for (int i = 0; i < 4; i++) cudaFree(c.S[i]);
        cudaFree(c.q); cudaFree(c.k); cudaFree(c.v); cudaFree(c.g); cudaFree(c.beta); cudaFree(c.o);
    }

    if (want("kda")) { /* KDA prefill, Kimi-Linear-48B heads (H 32, dk = dv = 128), one 4096-token prompt: the chunked kernel
       * vs the recurrent one over the same tokens (fresh state each launch; medians of 5 after a warm-up) */
        int T = 4096, H = 32, dk = 128;
        size_t ns = (size_t)H * dk * dk, n = (size_t)T * H * dk;
        float *q = dmalloc_rand(n * 4, 60), *k = dmalloc_rand(n * 4, 61), *v = dmalloc_rand(n * 4, 62);
        float *S, *g, *beta, *o;
        CK(cudaMalloc((void **)&S, ns * 4));
        CK(cudaMalloc((void **)&g, n * 4)); CK(cudaMemset(g, 0, n * 4));
        CK(cudaMalloc((void **)&beta, (size_t)T * H * 4)); CK(cudaMemset(beta, 0, (size_t)T * H * 4));
        CK(cudaMalloc((void **)&o, n * 4));
        double med[2];
        for (int chunked = 0; chunked < 2; chunked++) {
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
            float ms[5];
            for (int i = -1; i < 5; i++) {
                CK(cudaMemset(S, 0, ns * 4));
                CK(cudaEventRecord(a, 0));
                if (chunked) OK(k3c_cuda_kda_chunked(S, q, k, v, g, beta, T, H, dk, dk, 64, 1, o, 0));
                else OK(k3c_cuda_kda_recurrent(S, q, k, v, g, beta, T, H, dk, dk, 1, o, NULL, 0));
                CK(cudaEventRecord(b, 0));
                CK(cudaEventSynchronize(b));
                if (i >= 0) CK(cudaEventElapsedTime(&ms[i], a, b));
            }
            qsort(ms, 5, sizeof *ms, cmp_f);
            med[chunked] = ms[2] * 1e-3;
            printf("BENCH kda_%s_H32_128x128_T4096 %10.1f us %12.0f tokens/s\n", chunked ? "chunked  " : "recurrent",
                   med[chunked] * 1e6, T / med[chunked]);
            cudaEventDestroy(a); cudaEventDestroy(b);
        }
        printf("BENCH kda_chunked_vs_recurrent_T4096 speedup %.2fx\n", med[0] / med[1]);
        fflush(stdout);
        cudaFree(S); cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(g); cudaFree(beta); cudaFree(o);
    }

    if (want("mla")) { /* MLA paged decode attention, bf16 cache, 96 heads, 1 row at 8192 positions */
        mla_ctx c;
        memset(&c, 0, sizeof c);
        c.Hm = 96; c.T = 1; c.bs = 64;
        int len = 8192, nb = len / c.bs;
        c.cache = dmalloc_rand((size_t)nb * c.bs * 576 * 2, 40);
        int *tab = malloc(sizeof(int) * nb);
        for (int i = 0; i < nb; i++) tab[i] = (i * 37) % nb;
        CK(cudaMalloc((void **)&c.tables, sizeof(int) * nb));
        CK(cudaMemcpy(c.tables, tab, sizeof(int) * nb, cudaMemcpyHostToDevice));
        free(tab);
        int zero = 0;
        CK(cudaMalloc((void **)&c.toff, sizeof(int))); CK(cudaMemcpy(c.toff, &zero, sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMalloc((void **)&c.lens, sizeof(int))); CK(cudaMemcpy(c.lens, &len, sizeof(int), cudaMemcpyHostToDevice));
        c.qabs = dmalloc_rand((size_t)c.Hm * 576 * 4, 41);
        CK(cudaMalloc((void **)&c.olat, (size_t)c.Hm * 512 * 4));
        /* one block per (row, head) walking all positions, then split over positions as the backend runs it
         * (the 16-byte-load kernel; K3C_MLA_GENERIC=1 in the environment: the 2-byte-load one for both) */
        time_it("mla_attend_H96_len8192_bf16_nosplit", (double)len * 576 * 2, run_mla, &c);
        c.npart = k3c_cuda_mla_attend_split_floats(512);
        CK(cudaMalloc((void **)&c.part, c.npart * 4));
        time_it("mla_attend_H96_len8192_bf16", (double)len * 576 * 2, run_mla, &c);
        time_batch("mla_attend_H96_len8192_bf16_b2b", (double)len * 576 * 2, run_mla, &c);
        cudaFree(c.cache); cudaFree(c.tables); cudaFree(c.toff); cudaFree(c.lens); cudaFree(c.qabs); cudaFree(c.olat);
        cudaFree(c.part);
    }

    if (want("mla") || want("mlacore")) {
        /* The absorbed decode core at Kimi Linear 48B (32 heads) and K3 (96 heads) dims: nope 128, rope 64, v 128,
         * kv_lora 512, bf16 kv_b (8 copies rotated: 8.4 / 25 MB each), T rows each its own request of len
         * positions (bf16 cache, blocks of 64; rotated copies when small), split scratch as the backend gives it.
         * Bytes: absorb_q W_UK + q + q_abs; absorb_o W_UV + o_lat + o; attend the rows' cache + q_abs + o_lat. */
        static const int heads[] = {32, 96}, Ts[] = {1, 8, 64}, lens[] = {64, 4096};
        for (int hi = 0; hi < 2; hi++)
            for (int ti = 0; ti < 3; ti++) {
                core_ctx c;
                memset(&c, 0, sizeof c);
                c.Hm = heads[hi]; c.T = Ts[ti]; c.bs = 64; c.nope = 128; c.rope = 64; c.vh = 128; c.kvl = 512;
                int Hm = c.Hm, T = c.T, Lat = c.kvl + c.rope;
                size_t wbytes = (size_t)Hm * (c.nope + c.vh) * c.kvl * 2;
                for (int k = 0; k < CORE_COPIES; k++) c.kvb[k] = dmalloc_rand(wbytes, 60 + k);
                c.q = dmalloc_rand_bf16x((size_t)T * Hm * (c.nope + c.rope) * 4, 70);
                c.olat = dmalloc_rand_bf16x((size_t)T * Hm * c.kvl * 4, 71);
                CK(cudaMalloc((void **)&c.qabs, (size_t)T * Hm * Lat * 4));
                CK(cudaMalloc((void **)&c.o, (size_t)T * Hm * c.vh * 4));
                char name[64];
                double half = (double)Hm * 128 * c.kvl * 2;
                snprintf(name, sizeof name, "mla_absorb_q_H%d_T%d", Hm, T);
                time_it(name, half + (double)T * Hm * (192 + Lat) * 4, run_absq, &c);
                if (T == 1) {
                    snprintf(name, sizeof name, "mla_absorb_q_H%d_T%d_b2b", Hm, T);
                    time_batch(name, half + (double)T * Hm * (192 + Lat) * 4, run_absq, &c);
                }
                snprintf(name, sizeof name, "mla_absorb_o_H%d_T%d", Hm, T);
                time_it(name, half + (double)T * Hm * (c.kvl + c.vh) * 4, run_abso, &c);
                if (T == 1) {
                    snprintf(name, sizeof name, "mla_absorb_o_H%d_T%d_b2b", Hm, T);
                    time_batch(name, half + (double)T * Hm * (c.kvl + c.vh) * 4, run_abso, &c);
                }
                c.npart = k3c_cuda_mla_attend_split_floats(c.kvl);
                CK(cudaMalloc((void **)&c.part, c.npart * 4));
                for (int li = 0; li < 2; li++) {
                    int len = lens[li], nb = len / c.bs;
                    size_t cbytes = (size_t)T * nb * c.bs * Lat * 2;
                    c.ccopies = cbytes < (32u << 20) ? CORE_COPIES : 1;
                    for (int k = 0; k < c.ccopies; k++) c.cache[k] = dmalloc_rand(cbytes, 80 + k);
                    int *tab = malloc(sizeof(int) * T * nb), *toff = malloc(sizeof(int) * T), *ln = malloc(sizeof(int) * T);
                    for (int t = 0; t < T; t++) {
                        toff[t] = t * nb;
                        ln[t] = len;
                        for (int i = 0; i < nb; i++) tab[t * nb + i] = t * nb + (i * 37) % nb;
                    }
                    CK(cudaMalloc((void **)&c.tables, sizeof(int) * T * nb));
                    CK(cudaMalloc((void **)&c.toff, sizeof(int) * T));
                    CK(cudaMalloc((void **)&c.lens, sizeof(int) * T));
                    CK(cudaMemcpy(c.tables, tab, sizeof(int) * T * nb, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(c.toff, toff, sizeof(int) * T, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(c.lens, ln, sizeof(int) * T, cudaMemcpyHostToDevice));
                    free(tab); free(toff); free(ln);
                    snprintf(name, sizeof name, "mla_attend_H%d_T%d_len%d", Hm, T, len);
                    double ab = (double)cbytes + (double)T * Hm * (Lat + c.kvl) * 4;
                    time_it(name, ab, run_core_attend, &c);
                    if (T == 1) {
                        snprintf(name, sizeof name, "mla_attend_H%d_T%d_len%d_b2b", Hm, T, len);
                        time_batch(name, ab, run_core_attend, &c);
                    }
                    for (int k = 0; k < c.ccopies; k++) cudaFree(c.cache[k]);
                    cudaFree(c.tables); cudaFree(c.toff); cudaFree(c.lens);
                }
                for (int k = 0; k < CORE_COPIES; k++) cudaFree(c.kvb[k]);
                cudaFree(c.q); cudaFree(c.olat); cudaFree(c.qabs); cudaFree(c.o); cudaFree(c.part);
            }
    }

    if (want("mla")) { /* MLA expanded form (prompt), Kimi Linear 48B dims: 32 heads, nope 128, rope 64, v 128, kv_lora 512; one
       * 4096-token prompt from position 0, bf16 cache in blocks of 64, bf16 rounding, cuBLASLt decompression.
       * FLOPs: decompression 2 N kvl Hm (nope + v) + causal attention 2 Hm (qh + v) N (N + 1) / 2. Passes of
       * K3C_CUDA_MLA_EXP_CHUNK positions (the backend's) and one pass over all 4096. */
        int Hm = 32, nope = 128, rope = 64, vh = 128, kvl = 512, N = 4096, bs = 64, nb = N / bs, Lat = kvl + rope;
        void *cache = dmalloc_rand((size_t)nb * bs * Lat * 2, 50); /* bf16 values, |v| < 2 */
        float *q = dmalloc_rand_bf16x((size_t)N * Hm * (nope + rope) * 4, 51), *o;
        uint16_t *kvb = dmalloc_rand((size_t)Hm * (nope + vh) * kvl * 2, 52), *xbf;
        int *tab = malloc(sizeof(int) * nb), *dtab;
        for (int i = 0; i < nb; i++) tab[i] = (i * 37) % nb;
        CK(cudaMalloc((void **)&dtab, sizeof(int) * nb));
        CK(cudaMemcpy(dtab, tab, sizeof(int) * nb, cudaMemcpyHostToDevice));
        free(tab);
        CK(cudaMalloc((void **)&o, (size_t)N * Hm * vh * 4));
        void *ws;
        CK(cudaMalloc(&ws, 32u << 20));
        CK(cudaMalloc((void **)&xbf, (size_t)N * kvl * 2));
        k3c_cuda_gemm g;
        OK(k3c_cuda_gemm_init(&g, ws, 32u << 20, xbf, (size_t)N * kvl));
        double fl_dec = 2.0 * N * kvl * Hm * (nope + vh), fl_att = 2.0 * Hm * (nope + rope + vh) * N * (N + 1.0) / 2;
        static const int chunks[] = {K3C_CUDA_MLA_EXP_CHUNK, 4096};
        for (int ci = 0; ci < 2; ci++) {
            void *scr;
            CK(cudaMalloc(&scr, k3c_cuda_mla_expanded_scratch_bytes(chunks[ci], N, Hm, nope, rope, vh, kvl)));
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
            float ms[5];
            for (int i = -1; i < 5; i++) { /* one warm-up */
                CK(cudaEventRecord(a, 0));
                OK(k3c_cuda_mla_expanded(&g, kvb, q, N, 0, dtab, bs, cache, 2, Hm, nope, rope, vh, kvl,
                                         1.0f / sqrtf(192.0f), 1, scr, chunks[ci], N, o, 0));
                CK(cudaEventRecord(b, 0));
                CK(cudaEventSynchronize(b));
                if (i >= 0) CK(cudaEventElapsedTime(&ms[i], a, b));
            }
            qsort(ms, 5, sizeof *ms, cmp_f);
            double sec = ms[2] * 1e-3;
            printf("BENCH mla_expanded_H32_n4096_chunk%-5d %10.1f us %7.2f TFLOP/s (%.1f GFLOP: decompression %.1f, "
                   "attention %.1f)\n", chunks[ci], sec * 1e6, (fl_dec + fl_att) / sec / 1e12, (fl_dec + fl_att) / 1e9,
                   fl_dec / 1e9, fl_att / 1e9);
            fflush(stdout);
            cudaEventDestroy(a); cudaEventDestroy(b);
            cudaFree(scr);
        }
        k3c_cuda_gemm_free(&g);
        cudaFree(cache); cudaFree(q); cudaFree(o); cudaFree(kvb); cudaFree(xbf); cudaFree(ws); cudaFree(dtab);
    }
    if (want("small")) { /* the step's small kernels, in a graph: us per launch (bytes: inputs + outputs) */
        static const struct { const char *name; int kind, E, k, n; } cases[] = {
            {"route_E256_k8", 0, 256, 8, 0},   {"route_E896_k16", 0, 896, 16, 0},
            {"rmsnorm_2304", 1, 0, 0, 2304},   {"rmsnorm_7168", 1, 0, 0, 7168},
            {"add_2304", 2, 0, 0, 2304},       {"add_7168", 2, 0, 0, 7168},
            {"gated_act_1024", 3, 0, 0, 1024}, {"gated_act_3072", 3, 0, 0, 3072},
            /* route then the shared activation (Kimi Linear's 256 experts and width 1024, K3's 896 and 6144):
             * two launches against k3c_cuda_route_act's one */
            {"route_then_act_E256_1024", 4, 256, 8, 1024}, {"route_act_E256_1024", 5, 256, 8, 1024},
            {"route_then_act_E896_6144", 4, 896, 16, 6144}, {"route_act_E896_6144", 5, 896, 16, 6144},
            /* the greedy arg-max of a K3 / Kimi Linear logits row: one block a row against parts */
            {"argmax_rows_163840", 6, 0, 0, 163840}, {"argmax_keys_163840", 7, 0, 0, 163840},
        };
        static const int Ts[] = {1, 64};
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
            for (int ti = 0; ti < 2; ti++) {
                small_ctx c = {.kind = cases[ci].kind, .T = Ts[ti], .n = cases[ci].n};
                int routed = c.kind == 0 || c.kind == 4 || c.kind == 5, width = routed ? cases[ci].E : c.n;
                c.a = dmalloc_rand((size_t)c.T * width * 4, 300 + (unsigned)ci);
                c.b = dmalloc_rand((size_t)c.T * width * 4, 400 + (unsigned)ci);
                c.w = dmalloc_rand((size_t)width * 4, 500 + (unsigned)ci);
                CK(cudaMalloc((void **)&c.y, (size_t)c.T * width * 4));
                CK(cudaMalloc((void **)&c.idx, (size_t)c.T * 64 * 4));
                if (c.kind == 4 || c.kind == 5) {
                    c.gu = dmalloc_rand((size_t)c.T * 2 * c.n * 4, 600 + (unsigned)ci);
                    CK(cudaMalloc((void **)&c.o, (size_t)c.T * c.n * 4));
                }
                c.r = (k3c_cuda_router){.num_experts = cases[ci].E, .k = cases[ci].k, .sigmoid = 1, .use_bias = 1,
                                        .num_groups = 1, .topk_group = 1, .renormalize = 1, .scale = 2.5f};
                double bytes = c.kind == 0 || c.kind >= 6 ? (double)c.T * width * 4
                               : c.kind >= 4             ? (double)c.T * (width + 3.0 * c.n) * 4
                                             : (double)c.T * width * 4 * (c.kind == 1 ? 2 : 3);
                char name[64];
                snprintf(name, sizeof name, "small_%s_T%d_graph", cases[ci].name, c.T);
                time_graph(name, bytes, run_small, &c);
                cudaFree(c.a); cudaFree(c.b); cudaFree(c.w); cudaFree(c.y); cudaFree(c.idx);
                if (c.kind == 4 || c.kind == 5) { cudaFree(c.gu); cudaFree(c.o); }
            }
    }
    return 0;
}
