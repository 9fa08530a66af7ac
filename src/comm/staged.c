/* The staged communicator (comm/comm.h k3c_comm_staged_create): device buffers, collectives through the
 * in-memory group of comm/threads.c on pinned host copies. The NCCL-free reference for ranks that share one
 * process (one thread each), one GPU or several.
 *
 * A call: the device bytes are copied into this rank's pinned staging on the rank's stream, the stream is
 * waited for (bounded: a poll of cudaStreamQuery, so a stuck GPU or a rank stopped on its own stream fails
 * the call instead of hanging), the group's collective runs on the host copies (its barriers are bounded by
 * the group's timeout, and a rank that fails aborts the group so the others fail at once), and the result is
 * copied back on the stream. The copy back is left queued: the stream's later work sees the result, and the
 * staging is not written again before it has been read, because the next call first waits for the stream
 * (its own copy in comes after the copy back), and a peer writes into this rank's staging (its slice of the
 * all-reduce) only after this rank has arrived at the group's first barrier of the next call, after that wait.
 *
 * Sums: the group's, element i as ((b_0[i] + b_1[i]) + b_2[i]) + ... in f32, every rank the same bits. */
#include "comm/comm.h"

#include <stdlib.h>

#include "util/error.h"

#ifdef K3C_HAVE_CUDA

#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

typedef struct staged_ctx {
    k3c_comm *host;      /* this rank's communicator of the in-memory group */
    int device;
    cudaStream_t stream;
    int timeout_ms;
    unsigned char *stage; /* pinned, cap bytes */
    size_t cap;
} staged_ctx;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* A failure of this rank: the group fails too (the peers' waits end), then the message. */
static int fail(k3c_comm *c, const char *what, cudaError_t e) {
    staged_ctx *x = c->ctx;
    x->host->abort(x->host);
    if (e != cudaSuccess)
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "comm staged: rank %d of %d: %s: %s", c->rank, c->size, what,
                               cudaGetErrorString(e));
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "comm staged: rank %d of %d: %s", c->rank, c->size, what);
}

/* Waits until the stream has run everything queued on it, at most timeout_ms. */
static int wait_stream(k3c_comm *c) {
    staged_ctx *x = c->ctx;
    double t0 = now_ms();
    for (;;) {
        cudaError_t q = cudaStreamQuery(x->stream);
        if (q == cudaSuccess) return K3C_OK;
        if (q != cudaErrorNotReady) return fail(c, "waiting for the stream", q);
        if (now_ms() - t0 > x->timeout_ms) {
            x->host->abort(x->host);
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "comm staged: rank %d of %d: its stream did not drain in %d ms",
                                   c->rank, c->size, x->timeout_ms);
        }
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
}

/* Room for `bytes` of staging, and the stream idle (the call's copy in may be queued next). A wait that
 * cannot be captured: refused while the stream is being captured. */
static int begin(k3c_comm *c, size_t bytes) {
    staged_ctx *x = c->ctx;
    cudaError_t e = cudaSetDevice(x->device);
    if (e != cudaSuccess) return fail(c, "cudaSetDevice", e);
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    e = cudaStreamIsCapturing(x->stream, &cs);
    if (e != cudaSuccess) return fail(c, "cudaStreamIsCapturing", e);
    if (cs != cudaStreamCaptureStatusNone)
        return fail(c, "called while its stream is being captured into a CUDA graph (a staged collective waits on "
                       "the host: a captured step needs a device-side communicator)", cudaSuccess);
    K3C_TRY(wait_stream(c)); /* the last call's copy back has read the staging */
    if (bytes <= x->cap) return K3C_OK;
    if (x->stage) cudaFreeHost(x->stage);
    x->stage = NULL;
    x->cap = 0;
    e = cudaHostAlloc((void **)&x->stage, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        x->stage = NULL;
        return fail(c, "pinned staging", e);
    }
    x->cap = bytes;
    return K3C_OK;
}

static int copy_in(k3c_comm *c, void *host, const void *dev, size_t bytes) {
    staged_ctx *x = c->ctx;
    if (!bytes) return K3C_OK;
    cudaError_t e = cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, x->stream);
    if (e != cudaSuccess) return fail(c, "device -> host copy", e);
    return wait_stream(c);
}

static int copy_out(k3c_comm *c, void *dev, const void *host, size_t bytes) {
    staged_ctx *x = c->ctx;
    if (!bytes) return K3C_OK;
    cudaError_t e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, x->stream);
    return e == cudaSuccess ? K3C_OK : fail(c, "host -> device copy", e);
}

/* The group's call failed (its message is set, and it failed the group when it was a timeout or a
 * mismatch); this rank gives up too. */
static int group_failed(k3c_comm *c) {
    staged_ctx *x = c->ctx;
    x->host->abort(x->host);
    return k3c_error_context("comm staged: ");
}

static int st_all_reduce(k3c_comm *c, float *buf, size_t n) {
    staged_ctx *x = c->ctx;
    size_t bytes = n * sizeof(float);
    K3C_TRY(begin(c, bytes));
    K3C_TRY(copy_in(c, x->stage, buf, bytes));
    if (x->host->all_reduce_f32(x->host, (float *)x->stage, n) != K3C_OK) return group_failed(c);
    return copy_out(c, buf, x->stage, bytes);
}

/* The staging holds src at [size * bytes, (size + 1) * bytes) and the gathered parts below it, so that src
 * may be dst + rank * bytes. */
static int st_all_gather(k3c_comm *c, const void *src, void *dst, size_t bytes) {
    staged_ctx *x = c->ctx;
    size_t all = (size_t)c->size * bytes;
    K3C_TRY(begin(c, all + bytes));
    K3C_TRY(copy_in(c, x->stage + all, src, bytes));
    if (x->host->all_gather(x->host, x->stage + all, x->stage, bytes) != K3C_OK) return group_failed(c);
    return copy_out(c, dst, x->stage, all);
}

static int st_broadcast(k3c_comm *c, void *buf, size_t bytes, int root) {
    staged_ctx *x = c->ctx;
    K3C_TRY(begin(c, bytes));
    if (c->rank == root) K3C_TRY(copy_in(c, x->stage, buf, bytes));
    if (x->host->broadcast(x->host, x->stage, bytes, root) != K3C_OK) return group_failed(c);
    return c->rank == root ? K3C_OK : copy_out(c, buf, x->stage, bytes);
}

/* Every rank's queued work done, then the group's barrier. */
static int st_barrier(k3c_comm *c) {
    staged_ctx *x = c->ctx;
    K3C_TRY(begin(c, 0));
    if (x->host->barrier(x->host) != K3C_OK) return group_failed(c);
    return K3C_OK;
}

/* ---- point to point and all-to-all (pipeline stages, expert parallelism) ----
 * The same staging: a send waits for the stream, copies buf out and hands the host copy to the in-memory
 * group's send (which returns once the peer's recv has copied it: the staging is free again); a recv takes
 * the peer's bytes into the staging and queues the copy onto buf. */

static int st_send(k3c_comm *c, const void *buf, size_t bytes, int peer) {
    staged_ctx *x = c->ctx;
    K3C_TRY(begin(c, bytes));
    K3C_TRY(copy_in(c, x->stage, buf, bytes));
    if (x->host->send(x->host, x->stage, bytes, peer) != K3C_OK) return group_failed(c);
    return K3C_OK;
}

static int st_recv(k3c_comm *c, void *buf, size_t bytes, int peer) {
    staged_ctx *x = c->ctx;
    K3C_TRY(begin(c, bytes));
    if (x->host->recv(x->host, x->stage, bytes, peer) != K3C_OK) return group_failed(c);
    return copy_out(c, buf, x->stage, bytes);
}

/* The staging holds the packed send parts, then the packed receive parts. */
static int st_all_to_all(k3c_comm *c, const void *send, const size_t *send_bytes, void *recv,
                         const size_t *recv_bytes) {
    staged_ctx *x = c->ctx;
    size_t sn = 0, rn = 0;
    for (int p = 0; p < c->size; p++) sn += send_bytes[p], rn += recv_bytes[p];
    K3C_TRY(begin(c, sn + rn));
    K3C_TRY(copy_in(c, x->stage, send, sn));
    if (x->host->all_to_all(x->host, x->stage, send_bytes, x->stage + sn, recv_bytes) != K3C_OK)
        return group_failed(c);
    return copy_out(c, recv, x->stage + sn, rn);
}

static int wrap(k3c_comm *host, int device, cudaStream_t stream, int timeout_ms, k3c_comm **out);

/* The in-memory group's split, the sub-group staged on the same device and stream. */
static int st_split(k3c_comm *c, int color, int key, k3c_comm **out) {
    staged_ctx *x = c->ctx;
    *out = NULL;
    K3C_TRY(begin(c, 0));
    k3c_comm *sub = NULL;
    if (x->host->split(x->host, color, key, &sub) != K3C_OK) return group_failed(c);
    if (!sub) return K3C_OK;
    if (wrap(sub, x->device, x->stream, x->timeout_ms, out) != K3C_OK) {
        sub->free(sub);
        return fail(c, "split: out of memory", cudaSuccess);
    }
    return K3C_OK;
}

static void st_abort(k3c_comm *c) {
    staged_ctx *x = c->ctx;
    x->host->abort(x->host);
}

static void st_free(k3c_comm *c) {
    if (!c) return;
    staged_ctx *x = c->ctx;
    /* a copy back may still read the staging: bounded, and on a timeout the pinned memory is left (leaked)
     * rather than freed under a copy */
    if (x->stage) {
        cudaSetDevice(x->device);
        double t0 = now_ms();
        cudaError_t q;
        while ((q = cudaStreamQuery(x->stream)) == cudaErrorNotReady && now_ms() - t0 <= x->timeout_ms) {
            struct timespec nap = {0, 20000};
            nanosleep(&nap, NULL);
        }
        if (q != cudaErrorNotReady) cudaFreeHost(x->stage);
    }
    x->host->free(x->host);
    free(x);
    free(c);
}

/* The staged communicator over host, this rank's communicator of an in-memory group (its free leaves it). */
static int wrap(k3c_comm *host, int device, cudaStream_t stream, int timeout_ms, k3c_comm **out) {
    k3c_comm *c = calloc(1, sizeof *c);
    staged_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c), free(x);
        return k3c_errorf_kind(K3C_ERROR_OOM, "comm staged: out of memory");
    }
    x->host = host;
    x->device = device;
    x->stream = stream;
    x->timeout_ms = timeout_ms;
    *c = (k3c_comm){.name = "staged", .rank = host->rank, .size = host->size, .ctx = x,
                    .all_reduce_f32 = st_all_reduce, .all_gather = st_all_gather, .broadcast = st_broadcast,
                    .barrier = st_barrier, .abort = st_abort, .free = st_free, .stream_ordered = 1, .send = st_send,
                    .recv = st_recv, .all_to_all = st_all_to_all, .split = st_split};
    *out = c;
    return K3C_OK;
}

int k3c_comm_staged_create(k3c_comm_group *g, int rank, int device, void *stream, int timeout_ms, k3c_comm **out) {
    *out = NULL;
    if (!g) return k3c_errorf("comm staged: no group");
    if (timeout_ms < 0) return k3c_errorf("comm staged: timeout %d ms", timeout_ms);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0)
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "comm staged: no usable GPU (%s)",
                               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (device < 0 || device >= count) return k3c_errorf("comm staged: device %d outside 0..%d", device, count - 1);
    k3c_comm *host = NULL;
    if (k3c_comm_group_join(g, rank, &host) != K3C_OK) return k3c_error_context("comm staged: ");
    if (wrap(host, device, (cudaStream_t)stream, timeout_ms ? timeout_ms : 60000, out) != K3C_OK) {
        host->free(host);
        return K3C_ERR;
    }
    return K3C_OK;
}

#else /* no CUDA in this build */

int k3c_comm_staged_create(k3c_comm_group *g, int rank, int device, void *stream, int timeout_ms, k3c_comm **out) {
    (void)g, (void)rank, (void)device, (void)stream, (void)timeout_ms;
    *out = NULL;
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "comm staged: this build has no CUDA");
}

#endif
