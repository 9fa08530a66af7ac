/* Staged upload into device memory; see upload.h. */
#ifdef K3C_HAVE_CUDA /* the whole file */
#include "cuda/upload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"
#include "util/log.h"

/* Extents closer than this share one copy (the weight arena aligns tensors to 256 bytes). */
#define UPLOAD_MERGE_GAP 256

typedef struct upload_ctx {
    uint8_t *dst;
    cudaStream_t stream;
    cudaEvent_t *ev; /* [buffers] */
    const k3c_cuda_upload_hooks *hooks;
} upload_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cuda_fail(const char *what, cudaError_t e) {
    return k3c_errorf("cuda upload: %s: CUDA error %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

static int op_copy(void *ctx, int buf, const uint8_t *src, uint64_t dst, size_t bytes) {
    upload_ctx *u = ctx;
    cudaError_t e = cudaMemcpyAsync(u->dst + dst, src, bytes, cudaMemcpyHostToDevice, u->stream);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "copy of %zu bytes to offset %llu", bytes, (unsigned long long)dst);
        return cuda_fail(what, e);
    }
    return K3C_OK;
}

static int op_mark(void *ctx, int buf) {
    upload_ctx *u = ctx;
    cudaError_t e = cudaEventRecord(u->ev[buf], u->stream);
    return e == cudaSuccess ? K3C_OK : cuda_fail("event record", e);
}

static int op_wait(void *ctx, int buf) {
    upload_ctx *u = ctx;
    cudaError_t e = cudaEventSynchronize(u->ev[buf]);
    return e == cudaSuccess ? K3C_OK : cuda_fail("waiting for a staging buffer's copies", e);
}

static int op_extent_done(void *ctx, size_t extent) {
    upload_ctx *u = ctx;
    return u->hooks->extent_done(u->hooks->ctx, extent, u->stream);
}

static void op_queued(void *ctx, uint64_t bytes) {
    upload_ctx *u = ctx;
    u->hooks->queued(u->hooks->ctx, bytes);
}

int k3c_cuda_upload(uint8_t *dst_base, const k3c_stage_extent *ex, size_t n, cudaStream_t stream,
                    const k3c_cuda_upload_opts *opts, const k3c_cuda_upload_hooks *hooks,
                    k3c_cuda_upload_stats *stats) {
    double t0 = now_s(), ta = 0;
    k3c_cuda_upload_opts o = opts ? *opts : (k3c_cuda_upload_opts){0};
    if (o.readers == 0) o.readers = k3c_stage_default_readers();
    if (o.readers < 0) o.readers = 0;
    if (o.buffers <= 0) o.buffers = 4;
    if (o.buffer_bytes == 0) o.buffer_bytes = (size_t)64 << 20;
    k3c_cuda_upload_stats st = {0};
    uint8_t **bufs = NULL;
    cudaEvent_t *ev = NULL;
    upload_ctx u = {.dst = dst_base, .stream = stream, .hooks = hooks};
    k3c_stage_ops ops = {.ctx = &u, .copy = op_copy, .mark = op_mark, .wait = op_wait,
                         .extent_done = hooks && hooks->extent_done ? op_extent_done : NULL,
                         .queued = hooks && hooks->queued ? op_queued : NULL};
    cudaError_t e;
    int rc = K3C_ERR;

    k3c_stage_plan plan;
    K3C_TRY(k3c_stage_plan_build(ex, n, o.buffer_bytes, UPLOAD_MERGE_GAP, &plan));
    /* a model smaller than one buffer pins only what it needs, and never more buffers than slots */
    if (plan.nslots == 1 && plan.slots[0].fill < o.buffer_bytes) {
        o.buffer_bytes = plan.slots[0].fill;
        k3c_stage_plan_free(&plan);
        K3C_TRY(k3c_stage_plan_build(ex, n, o.buffer_bytes, UPLOAD_MERGE_GAP, &plan));
    }
    if ((size_t)o.buffers > plan.nslots) o.buffers = (int)plan.nslots;
    st.buffers = o.buffers;
    st.buffer_bytes = o.buffer_bytes;
    if (plan.nslots == 0) { /* nothing to copy */
        rc = K3C_OK;
        goto done;
    }

    bufs = calloc((size_t)o.buffers, sizeof *bufs);
    ev = calloc((size_t)o.buffers, sizeof *ev);
    if (!bufs || !ev) {
        k3c_errorf("cuda upload: out of host memory for %d staging buffers", o.buffers);
        goto done;
    }
    ta = now_s();
    st.pinned = !o.pageable;
    for (int b = 0; st.pinned && b < o.buffers; b++) {
        if (cudaHostAlloc((void **)&bufs[b], o.buffer_bytes, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError(); /* the refusal is handled here: not left for the next checked call */
            bufs[b] = NULL;
            for (int i = 0; i < b; i++) cudaFreeHost(bufs[i]), bufs[i] = NULL;
            k3c_log(K3C_LOG_WARN, "cuda: cudaHostAlloc refused %d x %zu MiB of pinned staging; uploading through "
                                  "pageable buffers (slower)", o.buffers, o.buffer_bytes >> 20);
            st.pinned = 0;
        }
    }
    for (int b = 0; !st.pinned && b < o.buffers; b++)
        if (!(bufs[b] = malloc(o.buffer_bytes))) {
            k3c_errorf("cuda upload: out of host memory for %d staging buffers of %zu MiB", o.buffers,
                       o.buffer_bytes >> 20);
            goto done;
        }
    st.alloc_s = now_s() - ta;
    for (int b = 0; b < o.buffers; b++) {
        /* blocking sync: the waiting thread sleeps instead of spinning on a core the readers need */
        e = cudaEventCreateWithFlags(&ev[b], cudaEventDisableTiming | cudaEventBlockingSync);
        if (e != cudaSuccess) {
            ev[b] = NULL;
            cuda_fail("creating a staging event", e);
            goto done;
        }
    }
    u.ev = ev;
    rc = k3c_stage_run(&plan, bufs, o.buffers, o.readers, 0, &ops, &st.run);
    /* drained also after an error: copies queued after the last event must not outlive the buffers */
    e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess && rc == K3C_OK) rc = cuda_fail("draining the upload stream", e);

done:
    ta = now_s();
    for (int b = 0; ev && b < o.buffers; b++)
        if (ev[b]) cudaEventDestroy(ev[b]);
    for (int b = 0; bufs && b < o.buffers; b++) {
        if (!bufs[b]) continue;
        if (st.pinned) cudaFreeHost(bufs[b]);
        else free(bufs[b]);
    }
    st.alloc_s += now_s() - ta;
    free(bufs);
    free(ev);
    k3c_stage_plan_free(&plan);
    st.seconds = now_s() - t0;
    if (stats) *stats = st;
    return rc;
}

#endif
