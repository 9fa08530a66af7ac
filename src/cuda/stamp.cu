/* Block stamps, the host side (cuda/stamp.h): the record buffers, switching every stamped translation unit on
 * and off, the download, the timer's tick, and the kernel-node counts the executor maps launches to ops with. */
#include "cuda/stamp.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/check.h"
#include "cuda/stamp.cuh"
#include "util/error.h"

struct k3c_cuda_stamps {
    k3c_stamp_ctl ctl;      /* device pointers; bound while on */
    k3c_stamp_ctl off;      /* all zero: bound while off */
    unsigned int *count_h;  /* [K3C_STAMP_REGIONS] */
    k3c_stamp_rec *rec_h;   /* [K3C_STAMP_REGIONS * cap]: the last download, regions packed */
    double tick_ns;
};

/* Every translation unit with stamped kernels (cuda/stamp.h): a file that adds K3C_STAMP_TU joins here. */
static int (*const binders[])(const k3c_stamp_ctl *, void *) = {
    k3c_stamp_bind_attnres, k3c_stamp_bind_decode_copy, k3c_stamp_bind_elementwise, k3c_stamp_bind_gemm,
    k3c_stamp_bind_kda,     k3c_stamp_bind_mla,         k3c_stamp_bind_moe,         k3c_stamp_bind_moe_pair,
    k3c_stamp_bind_router,  k3c_stamp_bind_sample,
};

void k3c_cuda_stamps_free(k3c_cuda_stamps *s) {
    if (!s) return;
    if (s->ctl.rec) cudaFree(s->ctl.rec);
    if (s->ctl.count) cudaFree(s->ctl.count);
    free(s->count_h);
    free(s->rec_h);
    free(s);
}

#if K3C_STAMPS /* the device side exists only in a build with the stamps (cuda/stamp.cuh) */
/* One thread: the smallest non-zero step of %globaltimer over 64 steps (the timer advances in ticks that
 * may be coarser than 1 ns: every time in the report is a multiple of it). */
__global__ void stamp_tick_kernel(unsigned long long *out) {
    unsigned long long prev, t, best = ~0ull;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(prev));
    for (int steps = 0, spins = 0; steps < 64 && spins < (1 << 24); spins++) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t != prev) {
            if (t > prev && t - prev < best) best = t - prev;
            prev = t;
            steps++;
        }
    }
    *out = best;
}

static int measure_tick(double *ns) {
    unsigned long long *d = NULL, h = 0;
    K3C_CUDA_MALLOC(&d, sizeof *d);
    stamp_tick_kernel<<<1, 1>>>(d);
    cudaError_t ce = cudaGetLastError();
    if (ce == cudaSuccess) ce = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (ce != cudaSuccess)
        return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(ce), "stamps: the globaltimer tick kernel: %s", cudaGetErrorString(ce));
    *ns = h == ~0ull ? 0 : (double)h;
    return K3C_OK;
}

/* The stamp's PTX checked on the device once: 6 blocks of 2 warps stamp BEGIN, WAIT and END. */
__global__ void stamp_selftest_kernel(void) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_NONE);
    K3C_STAMP_WAITED();
    K3C_STAMP_BLOCK_END(K3C_KID_NONE);
}

static int self_test(k3c_cuda_stamps *s) {
    K3C_CUDA_TRY(cudaMemset(s->ctl.count, 0, sizeof(unsigned int) * K3C_STAMP_REGIONS));
    K3C_CUDA_TRY(cudaMemcpyToSymbol(k3c_stamp_ctl_, &s->ctl, sizeof s->ctl));
    stamp_selftest_kernel<<<dim3(3, 2), 64>>>();
    K3C_CUDA_TRY(cudaGetLastError());
    K3C_CUDA_TRY(cudaDeviceSynchronize());
    K3C_CUDA_TRY(cudaMemcpyToSymbol(k3c_stamp_ctl_, &s->off, sizeof s->off));
    const k3c_stamp_rec *r;
    size_t n, dropped;
    K3C_TRY(k3c_cuda_stamps_download(s, &r, &n, &dropped));
    int seen[6][3] = {{0}};
    uint64_t t[6][3] = {{0}};
    int bad = n != 24 || dropped != 0;
    for (size_t i = 0; i < n && !bad; i++) {
        uint32_t b = K3C_STAMP_BLOCKID(r[i].info);
        int k = K3C_STAMP_KIND(r[i].info);
        bad = b >= 6 || k > K3C_STAMP_END || K3C_STAMP_KID(r[i].info) != K3C_KID_NONE || r[i].grid != r[0].grid;
        if (!bad) {
            seen[b][k]++;
            if (r[i].t > t[b][k]) t[b][k] = r[i].t;
        }
    }
    for (int b = 0; b < 6 && !bad; b++)
        bad = seen[b][0] != 1 || seen[b][1] != 1 || seen[b][2] != 2 || t[b][0] > t[b][1] || t[b][1] > t[b][2];
    if (bad)
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "stamps: self-test: %zu records (%zu dropped) where 6 blocks of 2 warps "
                               "should have written 24 (a BEGIN, a WAIT and an END a warp, in time order)", n, dropped);
    return K3C_OK;
}


static int alloc_device(k3c_cuda_stamps *s, size_t cap) {
    K3C_CUDA_MALLOC(&s->ctl.rec, sizeof(k3c_stamp_rec) * cap * K3C_STAMP_REGIONS);
    K3C_CUDA_MALLOC(&s->ctl.count, sizeof(unsigned int) * K3C_STAMP_REGIONS);
    return K3C_OK;
}

#endif

int k3c_cuda_stamps_create(size_t records, k3c_cuda_stamps **out) {
    *out = NULL;
#if !K3C_STAMPS
    (void)records;
    return k3c_errorf("K3C_CUDA_PROFILE=3: this build has no block stamps (build with make STAMPS=1, as "
                      "tools/gpu-measure.sh does)");
#else
    if (records == 0) records = (size_t)24 << 20;
    size_t cap = records / K3C_STAMP_REGIONS;
    if (cap < 16 || cap > 0xffffffffu)
        return k3c_errorf("stamps: %zu records (%d regions of 16 .. 2^32 - 1)", records, K3C_STAMP_REGIONS);
    k3c_cuda_stamps *s = (k3c_cuda_stamps *)calloc(1, sizeof *s);
    if (!s) return k3c_errorf_kind(K3C_ERROR_OOM, "stamps: out of host memory");
    s->ctl.cap = (unsigned int)cap;
    s->count_h = (unsigned int *)calloc(K3C_STAMP_REGIONS, sizeof *s->count_h);
    s->rec_h = (k3c_stamp_rec *)malloc(sizeof *s->rec_h * cap * K3C_STAMP_REGIONS);
    int rc = s->count_h && s->rec_h ? K3C_OK : k3c_errorf_kind(K3C_ERROR_OOM, "stamps: out of host memory");
    if (rc == K3C_OK) rc = alloc_device(s, cap);
    if (rc == K3C_OK) rc = measure_tick(&s->tick_ns);
    if (rc == K3C_OK) rc = self_test(s);
    if (rc != K3C_OK) {
        k3c_cuda_stamps_free(s);
        return rc;
    }
    *out = s;
    return K3C_OK;
#endif
}

static int bind_all(const k3c_stamp_ctl *c, void *stream) {
    for (size_t i = 0; i < sizeof binders / sizeof binders[0]; i++)
        if (binders[i](c, stream) != 0)
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "stamps: binding translation unit %zu failed", i);
    return K3C_OK;
}

int k3c_cuda_stamps_on(k3c_cuda_stamps *s, void *stream) {
    K3C_CUDA_TRY(cudaMemsetAsync(s->ctl.count, 0, sizeof(unsigned int) * K3C_STAMP_REGIONS, (cudaStream_t)stream));
    return bind_all(&s->ctl, stream);
}

int k3c_cuda_stamps_off(k3c_cuda_stamps *s, void *stream) { return bind_all(&s->off, stream); }

int k3c_cuda_stamps_download(k3c_cuda_stamps *s, const k3c_stamp_rec **rec, size_t *n, size_t *dropped) {
    K3C_CUDA_TRY(cudaMemcpy(s->count_h, s->ctl.count, sizeof(unsigned int) * K3C_STAMP_REGIONS, cudaMemcpyDeviceToHost));
    size_t used = 0, lost = 0;
    for (int r = 0; r < K3C_STAMP_REGIONS; r++) {
        size_t c = s->count_h[r], keep = c < s->ctl.cap ? c : s->ctl.cap;
        lost += c - keep;
        if (keep)
            K3C_CUDA_TRY(cudaMemcpy(s->rec_h + used, s->ctl.rec + (size_t)r * s->ctl.cap, keep * sizeof(k3c_stamp_rec),
                                    cudaMemcpyDeviceToHost));
        used += keep;
    }
    *rec = s->rec_h;
    *n = used;
    *dropped = lost;
    return K3C_OK;
}

double k3c_cuda_stamps_tick_ns(const k3c_cuda_stamps *s) { return s->tick_ns; }

long k3c_cuda_capture_kernel_nodes(void *stream) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaGraph_t g = NULL;
#if CUDART_VERSION >= 13000
    cudaError_t ce = cudaStreamGetCaptureInfo((cudaStream_t)stream, &st, NULL, &g, NULL, NULL, NULL);
#else
    cudaError_t ce = cudaStreamGetCaptureInfo((cudaStream_t)stream, &st, NULL, &g, NULL, NULL);
#endif
    if (ce != cudaSuccess || st != cudaStreamCaptureStatusActive || !g) return -1;
    size_t n = 0;
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess) return -1;
    if (n == 0) return 0;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(n * sizeof *nodes);
    if (!nodes || cudaGraphGetNodes(g, nodes, &n) != cudaSuccess) {
        free(nodes);
        return -1;
    }
    long kernels = 0;
    for (size_t i = 0; i < n; i++) {
        enum cudaGraphNodeType t;
        if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeKernel) kernels++;
    }
    free(nodes);
    return kernels;
}

/* One capture at a time counts (the executor's, while it records a stamped plan): a diagnostic's state, not
 * a lock. */
static int counting;
static long foreign_nodes;

void k3c_cuda_stamp_counting(int on) { counting = on; }

long k3c_cuda_stamp_foreign_begin(void *stream) { return counting ? k3c_cuda_capture_kernel_nodes(stream) : -1; }

void k3c_cuda_stamp_foreign_end(void *stream, long begin) {
    if (begin < 0) return;
    long now = k3c_cuda_capture_kernel_nodes(stream);
    if (now >= begin) foreign_nodes += now - begin;
}

long k3c_cuda_stamp_foreign_nodes(void) { return foreign_nodes; }
