/* The mailbox communicator on CUDA devices (comm/mailbox_cuda.h): regions allocated and mapped once, the
 * kernels of comm/mailbox_dev.cu launched on the rank's stream, failures read from host-mapped memory.
 *
 * Why several ranks on one device cannot deadlock: a rank's kernels are ordered on its stream, so at most
 * one mailbox kernel per rank is in flight, `blocks` blocks each; creation checks that the device holds
 * ranks x blocks of them at once (blocks per multiprocessor from the occupancy calculator, times the
 * multiprocessors; 16 blocks of 512 threads per rank, so 8 ranks take 128 of an H200's 264), and that each
 * rank's stream has a hardware queue of its own (CUDA_DEVICE_MAX_CONNECTIONS), so no rank's kernel waits
 * behind another's spinning one. So every rank's blocks are resident together, co-resident by construction,
 * and one launch for all ranks (a cooperative grid) is not needed: each rank keeps its own stream and its
 * own graph, as a rank on its own GPU does. Should a rank's kernel still not start (the device busy with
 * work that never ends), the spins end at the timeout: a failure, not a hang.
 *
 * That argument needs every rank's host thread to reach its launch. Some driver calls wait for the
 * device's progress: a kernel's first launch under lazy module loading (hence EAGER, below), a download
 * into pageable memory (cuda/check.h), a kernel's shared memory limit raised (cuda/kernel_limits.h), and
 * whatever a library does on a shape's first use. Seen on the H200 (2026-12-02): with four TP ranks on one
 * GPU beside other processes, a rank did not make the third all-reduce of its first prompt step in 60 s
 * while its peers spun in theirs, in 2 of 5 runs; which call held it is not known (cuBLASLt's first use of
 * the step's product shapes is the likely one: the same test with those shapes used before passes). Such a
 * call waits for work queued behind a peer's spinning kernel, which waits for this rank's launch. So when
 * the ranks are threads of this process on a shared device (options.threads), an eager call meets every
 * rank's thread twice (the launch rendezvous, group_rendezvous): before its launch, so that every rank has
 * issued all its work before the call (no spinning kernel waits for work a blocked thread has yet to
 * issue), and after it, so that every rank's kernel is launched before any thread issues more (whatever
 * blocks after that waits for kernels that all end). A captured call is recorded, not run, and a graph's
 * replay issues no host calls between its kernels: neither meets. */
#include "comm/mailbox_cuda.h"

#include "util/error.h"

#ifdef K3C_HAVE_CUDA

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "comm/mailbox_dev.h"
#include "cuda/check.h"

#define MBX_DEFAULT_CAP ((size_t)1 << 20)
#define MBX_DEFAULT_TIMEOUT_MS 10000
#define MBX_DEFAULT_BLOCKS 16
#define MBX_MAGIC 0x6b33636du /* "k3cm" */

typedef struct mbx_group mbx_group;

typedef struct mbx_rank {
    k3c_comm comm; /* what the caller holds; comm.ctx points back here */
    k3c_mbx_args args;
    int device;
    cudaStream_t stream;
    k3c_mbx_status *status; /* host address of args.status */
    size_t cap;             /* floats */
    size_t two_shot_bytes;  /* SIZE_MAX: never */
    int timeout_ms;
    int aborted;
    mbx_group *group; /* several ranks of this process; NULL for a rank of its own process */
    int rendezvous;   /* eager calls meet the other ranks' threads (options.threads on a shared device) */
    char *own;        /* a process's own region and status (ipc), else the group's */
    k3c_mbx_status *own_status;
    char *opened[K3C_MBX_MAX_RANKS]; /* ipc: the peers' regions, opened */
} mbx_rank;

struct mbx_group {
    int ranks, refs;
    pthread_mutex_t mu;
    /* the launch rendezvous (the top): arrivals at the current meeting, meetings completed, and whether a
     * rank gave up (every meeting then fails at once) */
    pthread_cond_t met;
    int arrived, dead;
    unsigned long meetings;
    char *region[K3C_MBX_MAX_RANKS];
    k3c_mbx_status *status[K3C_MBX_MAX_RANKS];
    mbx_rank rank[K3C_MBX_MAX_RANKS];
};

/* ---- options and devices ---- */

typedef struct mbx_opts {
    size_t cap, two_shot_bytes;
    int timeout_ms, blocks, threads;
    uint32_t first_epoch;
} mbx_opts;

static int opts_resolve(const k3c_comm_mailbox_options *o, int ranks, mbx_opts *r) {
    k3c_comm_mailbox_options z = {0};
    if (!o) o = &z;
    r->cap = o->cap ? o->cap : MBX_DEFAULT_CAP;
    r->timeout_ms = o->timeout_ms ? o->timeout_ms : MBX_DEFAULT_TIMEOUT_MS;
    r->first_epoch = o->first_epoch ? o->first_epoch : 1;
    r->blocks = o->blocks;
    r->threads = o->threads != 0;
    /* vLLM's rule for a fully NVLink-connected host (parallel.md A1) until k3c's own x8 sweep replaces it */
    r->two_shot_bytes = o->two_shot_bytes ? o->two_shot_bytes
                        : ranks <= 2      ? SIZE_MAX
                        : ranks <= 4      ? (size_t)512 << 10
                                          : (size_t)256 << 10;
    if (ranks < 2 || ranks > K3C_MBX_MAX_RANKS)
        return k3c_errorf("mailbox: %d ranks (the device mailbox takes 2 .. %d; more ranks take NCCL)", ranks,
                          K3C_MBX_MAX_RANKS);
    if (r->cap > K3C_MBX_MAX_CAP)
        return k3c_errorf("mailbox: options.cap %zu floats (at most %zu)", r->cap, K3C_MBX_MAX_CAP);
    if (r->timeout_ms < 0) return k3c_errorf("mailbox: options.timeout_ms %d (0: the default; > 0)", r->timeout_ms);
    if (r->blocks < 0 || r->blocks > K3C_MBX_MAX_BLOCKS)
        return k3c_errorf("mailbox: options.blocks %d (0: the default; 1 .. %d)", r->blocks, K3C_MBX_MAX_BLOCKS);
    return K3C_OK;
}

/* How many of the mailbox's blocks device `device` holds at once. */
static int device_capacity(int device, int ranks, int *blocks) {
    int bps = 0, sms = 0;
    K3C_CUDA_TRY(cudaSetDevice(device));
    K3C_TRY(k3c_mbx_blocks_per_sm(ranks, &bps));
    K3C_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    *blocks = bps * sms;
    return K3C_OK;
}

/* The blocks per rank: options.blocks, or the default, no more than the fewest that fit; `fit` is the
 * fewest blocks per rank any device holds for all of its ranks at once. */
static int choose_blocks(int requested, int fit, int share, int *out) {
    if (requested && requested > fit)
        return k3c_errorf("mailbox: options.blocks %d, but a device shared by %d rank%s holds %d block%s per rank at "
                          "once (their spinning blocks must all be resident)",
                          requested, share, share == 1 ? "" : "s", fit, fit == 1 ? "" : "s");
    *out = requested ? requested : fit < MBX_DEFAULT_BLOCKS ? fit : MBX_DEFAULT_BLOCKS;
    if (*out < 1)
        return k3c_errorf("mailbox: a device shared by %d ranks cannot hold one mailbox block per rank at once", share);
    return K3C_OK;
}

static int dev_enter(int device, int *prev) {
    K3C_CUDA_TRY(cudaGetDevice(prev));
    if (*prev != device) K3C_CUDA_TRY(cudaSetDevice(device));
    return K3C_OK;
}

static void dev_leave(int device, int prev) {
    if (prev != device) cudaSetDevice(prev);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* ---- a rank's region ---- */

/* Allocates and initialises one region (zeros: no flag holds an epoch; every block's epoch = first) and
 * its mapped status, on the current device. */
static int region_alloc(const k3c_mbx_layout *lay, uint32_t first_epoch, char **region, k3c_mbx_status **status) {
    *region = NULL;
    *status = NULL;
    K3C_CUDA_MALLOC(region, lay->bytes);
    K3C_CUDA_TRY(cudaMemset(*region, 0, lay->bytes));
    k3c_mbx_state st;
    memset(&st, 0, sizeof st);
    for (int k = 0; k < lay->blocks; k++) st.epoch[k] = first_epoch;
    K3C_CUDA_TRY(cudaMemcpy(*region, &st, sizeof st, cudaMemcpyHostToDevice));
    cudaError_t e = cudaHostAlloc((void **)status, sizeof **status, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
        *status = NULL;
        return k3c_errorf_kind(K3C_ERROR_OOM, "mailbox: cudaHostAlloc of the status: %s", cudaGetErrorString(e));
    }
    memset(*status, 0, sizeof **status);
    K3C_CUDA_TRY(cudaDeviceSynchronize());
    return K3C_OK;
}

/* The fields every rank's communicator shares, from its rank, stream and the resolved options. */
static void rank_init(mbx_rank *r, int rank, int ranks, int device, cudaStream_t stream, const mbx_opts *o,
                      const k3c_mbx_layout *lay, k3c_mbx_status *status);

/* ---- failures ---- */

static const char *op_name(uint32_t op, char *buf, size_t n) {
    switch (op & 0xff) {
    case K3C_MBX_OP_ONE_SHOT: return "a one-shot all-reduce";
    case K3C_MBX_OP_TWO_SHOT: return "a two-shot all-reduce";
    case K3C_MBX_OP_GATHER: return "an all-gather";
    case K3C_MBX_OP_BROADCAST: snprintf(buf, n, "a broadcast from rank %u", op >> 8); return buf;
    case K3C_MBX_OP_REDUCE_NORM: snprintf(buf, n, "an all-reduce + rmsnorm of %u rows", op >> 8); return buf;
    default: snprintf(buf, n, "call kind %u", op); return buf;
    }
}

static const char *op_unit(uint32_t op) {
    return (op & 0xff) == K3C_MBX_OP_ONE_SHOT || (op & 0xff) == K3C_MBX_OP_TWO_SHOT ||
                   (op & 0xff) == K3C_MBX_OP_REDUCE_NORM
               ? "floats"
               : "bytes";
}

/* K3C_OK, or the rank's recorded failure as a message. */
static int mbx_check(const mbx_rank *r) {
    const volatile k3c_mbx_status *s = r->status;
    uint32_t code = __atomic_load_n(&r->status->code, __ATOMIC_ACQUIRE);
    const int me = r->comm.rank, R = r->comm.size;
    if (!code) {
        if (r->aborted)
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox rank %d of %d: this rank aborted the group", me, R);
        return K3C_OK;
    }
    char b1[48], b2[48];
    const char *what = op_name(s->op, b1, sizeof b1);
    switch (code) {
    case K3C_MBX_ERR_TIMEOUT:
        return k3c_errorf_kind(K3C_ERROR_DEVICE,
                               "mailbox rank %d of %d: %s of %u %s (epoch %u): waited %d ms for rank %u, whose flag "
                               "holds epoch %u (block %u): that rank did not make the call",
                               me, R, what, s->count, op_unit(s->op), s->epoch, r->timeout_ms, s->peer, s->seen,
                               s->block);
    case K3C_MBX_ERR_MISMATCH:
        return k3c_errorf_kind(K3C_ERROR_DEVICE,
                               "mailbox rank %d of %d: %s of %u %s (epoch %u), but rank %u made %s of %u %s: every "
                               "rank must make the same calls",
                               me, R, what, s->count, op_unit(s->op), s->epoch, s->peer,
                               op_name(s->peer_op, b2, sizeof b2), s->peer_count, op_unit(s->peer_op));
    case K3C_MBX_ERR_ABORTED:
        if ((int)s->peer == me)
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox rank %d of %d: %s of %u %s (epoch %u): this rank "
                                   "aborted the group", me, R, what, s->count, op_unit(s->op), s->epoch);
        return k3c_errorf_kind(K3C_ERROR_DEVICE,
                               "mailbox rank %d of %d: %s of %u %s (epoch %u): rank %u gave up on the group (its own "
                               "error says why), so this rank stopped waiting",
                               me, R, what, s->count, op_unit(s->op), s->epoch, s->peer);
    default:
        /* the report is being written (the code goes last): it is a failure either way */
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox rank %d of %d: failed (report code %u)", me, R, code);
    }
}

/* This rank gives up: every region's abort word is set (its own too), so every waiting block ends. The
 * abort kernel goes on a stream of its own: the rank's stream may hold a spinning kernel. */
static void mbx_abort_rank(mbx_rank *r) {
    if (r->aborted) return;
    r->aborted = 1;
    if (r->group) {
        pthread_mutex_lock(&r->group->mu);
        r->group->dead = 1;
        pthread_cond_broadcast(&r->group->met);
        pthread_mutex_unlock(&r->group->mu);
    }
    int prev;
    if (dev_enter(r->device, &prev) != K3C_OK) return;
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
        (void)k3c_mbx_abort(&r->args, s);
        cudaStreamDestroy(s);
    }
    dev_leave(r->device, prev);
}

/* ---- the launch rendezvous (the top) ---- */

/* Every rank's thread at the same meeting, or an error: within the timeout, and at once when a rank gave
 * up. Meetings pair by count: every rank makes the same eager calls in the same order. */
static int group_rendezvous(mbx_rank *r, const char *what, const char *when) {
    mbx_group *g = r->group;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    long long ns = deadline.tv_nsec + (long long)r->timeout_ms * 1000000ll;
    deadline.tv_sec += (time_t)(ns / 1000000000ll);
    deadline.tv_nsec = (long)(ns % 1000000000ll);
    pthread_mutex_lock(&g->mu);
    unsigned long mine = g->meetings;
    int arrived = 0, timed_out = 0;
    if (!g->dead && ++g->arrived == g->ranks) {
        g->arrived = 0;
        g->meetings++;
        pthread_cond_broadcast(&g->met);
    } else {
        while (!g->dead && g->meetings == mine && !timed_out)
            timed_out = pthread_cond_timedwait(&g->met, &g->mu, &deadline) == ETIMEDOUT;
        arrived = g->arrived;
    }
    int met = g->meetings != mine, dead = g->dead;
    pthread_mutex_unlock(&g->mu);
    if (met) return K3C_OK;
    mbx_abort_rank(r);
    if (dead && !timed_out)
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox rank %d of %d: %s: a rank gave up on the group (its own "
                               "error says why) before every rank's thread met %s the launch", r->comm.rank,
                               r->comm.size, what, when);
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox rank %d of %d: %s: waited %d ms for the other ranks' threads "
                           "to meet %s the launch (%d of %d there): a rank did not make the call",
                           r->comm.rank, r->comm.size, what, r->timeout_ms, when, arrived, r->comm.size);
}

/* Whether this call meets the other ranks' threads: a rank that rendezvous and a stream not capturing. */
static int meets(const mbx_rank *r, cudaStream_t stream) {
    if (!r->rendezvous) return 0;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return cs == cudaStreamCaptureStatusNone;
}

/* A mailbox kernel's launch between the two meetings, where the call meets (meets): launch_begin meets
 * before it and enters the rank's device; launch_end takes the launcher's result, leaves the device and meets
 * after it. A failed launch aborts the group, so the peers' second meeting fails at once. */
typedef struct mbx_launch {
    int meet, prev;
} mbx_launch;

static int launch_begin(mbx_rank *r, cudaStream_t stream, const char *what, mbx_launch *l) {
    l->meet = meets(r, stream);
    if (l->meet) K3C_TRY(group_rendezvous(r, what, "before"));
    int rc = dev_enter(r->device, &l->prev);
    if (rc != K3C_OK && l->meet) mbx_abort_rank(r);
    return rc;
}

static int launch_end(mbx_rank *r, const char *what, const mbx_launch *l, int launched) {
    dev_leave(r->device, l->prev);
    if (launched != K3C_OK) {
        if (l->meet) mbx_abort_rank(r);
        return K3C_ERR;
    }
    return l->meet ? group_rendezvous(r, what, "after") : K3C_OK;
}

/* ---- the collectives ---- */

static int mbx_reduce(mbx_rank *r, float *buf, size_t n, k3c_mailbox_algo algo, cudaStream_t stream) {
    K3C_TRY(mbx_check(r));
    if (n > r->cap || (n && !buf)) {
        mbx_abort_rank(r);
        if (!buf)
            return k3c_errorf("mailbox rank %d of %d: all_reduce of %zu floats at NULL", r->comm.rank, r->comm.size,
                              n);
        return k3c_errorf("mailbox rank %d of %d: all_reduce of %zu floats, but the mailbox holds %zu (options.cap)",
                          r->comm.rank, r->comm.size, n, r->cap);
    }
    int two = algo == K3C_MAILBOX_TWO_SHOT || (algo == K3C_MAILBOX_AUTO && n * sizeof(float) >= r->two_shot_bytes);
    mbx_launch l;
    K3C_TRY(launch_begin(r, stream, "all_reduce", &l));
    return launch_end(r, "all_reduce", &l, k3c_mbx_all_reduce(&r->args, buf, n, two, stream));
}

static int mbx_all_reduce_f32(k3c_comm *c, float *buf, size_t n) {
    mbx_rank *r = c->ctx;
    return mbx_reduce(r, buf, n, K3C_MAILBOX_AUTO, r->stream);
}

static int mbx_exchange(mbx_rank *r, const void *src, void *dst, size_t bytes, int root, const char *what,
                        cudaStream_t stream) {
    K3C_TRY(mbx_check(r));
    if (bytes > r->cap * sizeof(float) || root >= r->comm.size || (bytes && (!src || !dst))) {
        mbx_abort_rank(r);
        if (root >= r->comm.size)
            return k3c_errorf("mailbox rank %d of %d: %s from rank %d", r->comm.rank, r->comm.size, what, root);
        if (bytes && (!src || !dst))
            return k3c_errorf("mailbox rank %d of %d: %s of %zu bytes at NULL", r->comm.rank, r->comm.size, what,
                              bytes);
        return k3c_errorf("mailbox rank %d of %d: %s of %zu bytes, but the mailbox holds %zu (options.cap x 4)",
                          r->comm.rank, r->comm.size, what, bytes, r->cap * sizeof(float));
    }
    mbx_launch l;
    K3C_TRY(launch_begin(r, stream, what, &l));
    return launch_end(r, what, &l, k3c_mbx_exchange(&r->args, src, dst, bytes, root, stream));
}

static int mbx_all_gather(k3c_comm *c, const void *src, void *dst, size_t bytes) {
    mbx_rank *r = c->ctx;
    return mbx_exchange(r, src, dst, bytes, -1, "all_gather", r->stream);
}

static int mbx_broadcast(k3c_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0) {
        mbx_abort_rank(c->ctx);
        return k3c_errorf("mailbox rank %d of %d: broadcast from rank %d", c->rank, c->size, root);
    }
    mbx_rank *r = c->ctx;
    return mbx_exchange(r, buf, buf, bytes, root, "broadcast", r->stream);
}

/* An empty exchange (every rank's kernel has run once it returns), then the stream drained with a bounded
 * poll that also watches the status (a failed wait ends in the kernel; the poll ends with it). */
static int mbx_barrier(k3c_comm *c) {
    mbx_rank *r = c->ctx;
    K3C_TRY(mbx_exchange(r, NULL, NULL, 0, -1, "barrier", r->stream));
    int prev;
    K3C_TRY(dev_enter(r->device, &prev));
    double deadline = now_ms() + r->timeout_ms + 10000.0;
    int rc = K3C_OK;
    for (;;) {
        cudaError_t q = cudaStreamQuery(r->stream);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
            rc = k3c_errorf_kind(K3C_CUDA_ERROR_KIND(q), "mailbox rank %d of %d: barrier: %s", c->rank, c->size,
                                 cudaGetErrorString(q));
            break;
        }
        if (__atomic_load_n(&r->status->code, __ATOMIC_ACQUIRE)) break;
        if (now_ms() > deadline) {
            mbx_abort_rank(r);
            rc = k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox rank %d of %d: barrier: the stream did not drain in %d ms",
                                 c->rank, c->size, r->timeout_ms + 10000);
            break;
        }
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
    dev_leave(r->device, prev);
    K3C_TRY(rc);
    return mbx_check(r);
}

static void mbx_abort(k3c_comm *c) { mbx_abort_rank(c->ctx); }

static void group_destroy(mbx_group *g) {
    int prev = 0;
    cudaGetDevice(&prev);
    for (int r = 0; r < g->ranks; r++) {
        cudaSetDevice(g->rank[r].device);
        if (g->region[r]) cudaFree(g->region[r]);
        if (g->status[r]) cudaFreeHost(g->status[r]);
    }
    cudaSetDevice(prev);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->met);
    free(g);
}

static void ipc_destroy(mbx_rank *r) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(r->device);
    for (int p = 0; p < K3C_MBX_MAX_RANKS; p++)
        if (r->opened[p]) cudaIpcCloseMemHandle(r->opened[p]);
    if (r->own) cudaFree(r->own);
    if (r->own_status) cudaFreeHost(r->own_status);
    cudaSetDevice(prev);
    free(r);
}

static void mbx_free(k3c_comm *c) {
    if (!c) return;
    mbx_rank *r = c->ctx;
    if (!r->group) {
        ipc_destroy(r);
        return;
    }
    mbx_group *g = r->group;
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) group_destroy(g);
}

static void rank_init(mbx_rank *r, int rank, int ranks, int device, cudaStream_t stream, const mbx_opts *o,
                      const k3c_mbx_layout *lay, k3c_mbx_status *status) {
    r->comm = (k3c_comm){.name = "mailbox", .rank = rank, .size = ranks, .ctx = r, .all_reduce_f32 = mbx_all_reduce_f32,
                         .all_gather = mbx_all_gather, .broadcast = mbx_broadcast, .barrier = mbx_barrier,
                         .abort = mbx_abort, .free = mbx_free,
                         .stream_ordered = 1}; /* device buffers on the rank's stream */
    r->device = device;
    r->stream = stream;
    r->status = status;
    r->cap = o->cap;
    r->two_shot_bytes = o->two_shot_bytes;
    r->timeout_ms = o->timeout_ms;
    r->args.lay = *lay;
    r->args.rank = rank;
    r->args.timeout_ns = (unsigned long long)o->timeout_ms * 1000000ull;
}

/* ---- several ranks in this process ---- */

/* The hardware queues streams are spread over (CUDA_DEVICE_MAX_CONNECTIONS, default 8). */
static int max_connections(void) {
    const char *s = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    int v = s ? atoi(s) : 0;
    return v > 0 ? v : 8;
}

static int group_build(mbx_group *g, int ranks, const int *devices, void *const *streams, const mbx_opts *o) {
    /* streams: non-blocking and distinct */
    for (int r = 0; r < ranks; r++) {
        unsigned flags = 0;
        if (!streams[r])
            return k3c_errorf("mailbox: rank %d's stream is the legacy stream (NULL): each rank needs its own stream "
                              "created with cudaStreamNonBlocking", r);
        K3C_CUDA_TRY(cudaStreamGetFlags((cudaStream_t)streams[r], &flags));
        if (!(flags & cudaStreamNonBlocking))
            return k3c_errorf("mailbox: rank %d's stream is a blocking stream: it would wait for the legacy stream, "
                              "which waits for every blocking stream's kernels, a spinning rank's too (create it "
                              "with cudaStreamNonBlocking)", r);
        for (int q = 0; q < r; q++)
            if (streams[q] == streams[r]) return k3c_errorf("mailbox: ranks %d and %d share a stream", q, r);
    }
    /* devices: how many ranks share each, what each holds at once */
    int ndev = 0;
    K3C_CUDA_TRY(cudaGetDeviceCount(&ndev));
    int share[K3C_MBX_MAX_RANKS] = {0}, max_share = 0, fit = K3C_MBX_MAX_BLOCKS;
    for (int r = 0; r < ranks; r++) {
        if (devices[r] < 0 || devices[r] >= ndev)
            return k3c_errorf("mailbox: rank %d on device %d (%d device%s visible)", r, devices[r], ndev,
                              ndev == 1 ? "" : "s");
        for (int q = 0; q < ranks; q++) share[r] += devices[q] == devices[r];
        if (share[r] > max_share) max_share = share[r];
    }
    if (max_share > 1 && max_connections() < max_share)
        return k3c_errorf("mailbox: %d ranks share a device, but CUDA_DEVICE_MAX_CONNECTIONS gives its streams %d "
                          "hardware queues: a rank's kernel would wait behind another's spinning one (set "
                          "CUDA_DEVICE_MAX_CONNECTIONS=32 before the process first uses CUDA)",
                          max_share, max_connections());
    /* CUDA 12 loads a kernel's module at its first launch (CUDA_MODULE_LOADING=LAZY, the default), and that
     * load waits for the device: behind one rank's spinning all-reduce, another rank's first launch of a
     * kernel would never return (measured on the H200, 2026-12-02: TP ranks of the stock forward on one
     * device stalled at their first all-reduce until the timeout). Eager loading takes that wait out. */
    const char *ml = getenv("CUDA_MODULE_LOADING");
    if (max_share > 1 && !(ml && strcmp(ml, "EAGER") == 0))
        return k3c_errorf("mailbox: %d ranks share a device, but CUDA_MODULE_LOADING is %s: a kernel's first "
                          "launch would wait for the device behind another rank's spinning all-reduce (set "
                          "CUDA_MODULE_LOADING=EAGER before the process first uses CUDA)", max_share,
                          ml ? ml : "unset (lazy)");
    for (int r = 0; r < ranks; r++) {
        int cap;
        K3C_TRY(device_capacity(devices[r], ranks, &cap));
        if (cap / share[r] < fit) fit = cap / share[r];
    }
    int blocks;
    K3C_TRY(choose_blocks(o->blocks, fit, max_share, &blocks));
    k3c_mbx_layout lay;
    if (k3c_mbx_layout_make(ranks, blocks, o->cap, &lay) != 0)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "mailbox: layout of %d ranks x %d blocks x %zu floats", ranks,
                               blocks, o->cap);
    for (int r = 0; r < ranks; r++) {
        K3C_CUDA_TRY(cudaSetDevice(devices[r]));
        K3C_TRY(region_alloc(&lay, o->first_epoch, &g->region[r], &g->status[r]));
    }
    /* peer access between distinct devices (UVA: a region's address is then valid on every device) */
    for (int r = 0; r < ranks; r++)
        for (int p = 0; p < ranks; p++) {
            if (devices[p] == devices[r]) continue;
            int can = 0;
            K3C_CUDA_TRY(cudaDeviceCanAccessPeer(&can, devices[r], devices[p]));
            if (!can)
                return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox: device %d (rank %d) cannot access device %d (rank "
                                       "%d) as a peer", devices[r], r, devices[p], p);
            K3C_CUDA_TRY(cudaSetDevice(devices[r]));
            cudaError_t e = cudaDeviceEnablePeerAccess(devices[p], 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled)
                (void)cudaGetLastError();
            else if (e != cudaSuccess)
                return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox: peer access from device %d to %d: %s", devices[r],
                                       devices[p], cudaGetErrorString(e));
        }
    for (int r = 0; r < ranks; r++) {
        mbx_rank *x = &g->rank[r];
        k3c_mbx_status *dstatus = NULL;
        K3C_CUDA_TRY(cudaSetDevice(devices[r]));
        K3C_CUDA_TRY(cudaHostGetDevicePointer((void **)&dstatus, g->status[r], 0));
        rank_init(x, r, ranks, devices[r], (cudaStream_t)streams[r], o, &lay, g->status[r]);
        x->args.status = dstatus;
        x->group = g;
        x->rendezvous = o->threads && max_share > 1; /* every rank of the group meets, or none */
        for (int p = 0; p < ranks; p++) x->args.region[p] = g->region[p];
    }
    return K3C_OK;
}

int k3c_comm_mailbox_create(int ranks, const int *devices, void *const *streams, const k3c_comm_mailbox_options *o,
                            k3c_comm **out) {
    if (!out) return k3c_errorf("mailbox: NULL out");
    for (int r = 0; r < ranks && r < K3C_MBX_MAX_RANKS; r++) out[r] = NULL;
    mbx_opts opt;
    K3C_TRY(opts_resolve(o, ranks, &opt));
    if (!devices || !streams) return k3c_errorf("mailbox: NULL %s", devices ? "streams" : "devices");
    mbx_group *g = calloc(1, sizeof *g);
    if (!g) return k3c_errorf_kind(K3C_ERROR_OOM, "mailbox: out of memory");
    g->ranks = ranks;
    for (int r = 0; r < ranks; r++) g->rank[r].device = devices[r];
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->met, NULL);
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    int rc = e == cudaSuccess ? group_build(g, ranks, devices, streams, &opt)
                              : k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox: %s", cudaGetErrorString(e));
    if (e == cudaSuccess) cudaSetDevice(prev);
    if (rc != K3C_OK) {
        group_destroy(g);
        return K3C_ERR;
    }
    g->refs = ranks;
    for (int r = 0; r < ranks; r++) out[r] = &g->rank[r].comm;
    return K3C_OK;
}

/* ---- one process per rank ---- */

/* What every rank tells the others before the regions exist: its options (which must agree) and what its
 * device holds. */
typedef struct mbx_boot_rec {
    uint32_t magic, first_epoch;
    int32_t ranks, blocks, capacity, pad;
    uint64_t cap, two_shot_bytes;
    char bus[32]; /* the device's PCI bus id: ranks sharing a device share its capacity */
} mbx_boot_rec;

typedef struct mbx_boot_handle {
    cudaIpcMemHandle_t handle;
    int32_t ok;
    int32_t pad[3];
} mbx_boot_handle;

/* all[p] = rank p's `mine` (bytes each), through boot. */
static int boot_gather(k3c_comm *boot, int on_device, const void *mine, void *all, size_t bytes) {
    char *at = (char *)all + (size_t)boot->rank * bytes;
    if (!on_device) {
        memcpy(at, mine, bytes);
        return boot->all_gather(boot, at, all, bytes);
    }
    char *d = NULL;
    K3C_CUDA_MALLOC(&d, bytes * (size_t)boot->size);
    int rc = K3C_OK;
    cudaError_t e = cudaMemcpy(d + (size_t)boot->rank * bytes, mine, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) rc = k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox: staging: %s", cudaGetErrorString(e));
    if (rc == K3C_OK) rc = boot->all_gather(boot, d + (size_t)boot->rank * bytes, d, bytes);
    if (rc == K3C_OK) rc = boot->barrier(boot); /* the gather is ordered on boot's stream */
    if (rc == K3C_OK && (e = cudaMemcpy(all, d, bytes * (size_t)boot->size, cudaMemcpyDeviceToHost)) != cudaSuccess)
        rc = k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox: staging: %s", cudaGetErrorString(e));
    cudaFree(d);
    return rc;
}

/* Every rank learns whether every rank's step succeeded (ok); K3C_ERR on all of them if one did not. */
static int boot_all_ok(k3c_comm *boot, int on_device, int ok, const char *step, const char *why) {
    int32_t mine = ok, all[K3C_MBX_MAX_RANKS];
    K3C_TRY(boot_gather(boot, on_device, &mine, all, sizeof mine));
    for (int p = 0; p < boot->size; p++)
        if (!all[p])
            return p == boot->rank ? k3c_error_context("mailbox rank %d of %d: %s", boot->rank, boot->size, step)
                                   : k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox rank %d of %d: rank %d failed to %s%s",
                                                     boot->rank, boot->size, p, step, why);
    return K3C_OK;
}

static int ipc_build(mbx_rank *r, k3c_comm *boot, int on_device, int device, cudaStream_t stream, const mbx_opts *o) {
    const int me = boot->rank, R = boot->size;
    mbx_boot_rec rec, all[K3C_MBX_MAX_RANKS];
    memset(&rec, 0, sizeof rec);
    rec.magic = MBX_MAGIC;
    rec.first_epoch = o->first_epoch;
    rec.ranks = R;
    rec.blocks = o->blocks;
    rec.cap = o->cap;
    rec.two_shot_bytes = o->two_shot_bytes;
    int ok = device_capacity(device, R, &rec.capacity) == K3C_OK &&
             cudaDeviceGetPCIBusId(rec.bus, sizeof rec.bus, device) == cudaSuccess;
    if (!ok) rec.magic = 0; /* the others refuse it below */
    K3C_TRY(boot_gather(boot, on_device, &rec, all, sizeof rec));
    int fit = K3C_MBX_MAX_BLOCKS, max_share = 1;
    for (int p = 0; p < R; p++) {
        const mbx_boot_rec *q = &all[p];
        if (q->magic != MBX_MAGIC)
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox rank %d of %d: rank %d could not read its device", me, R,
                                   p);
        if (q->ranks != R || q->cap != rec.cap || q->first_epoch != rec.first_epoch || q->blocks != rec.blocks ||
            q->two_shot_bytes != rec.two_shot_bytes)
            return k3c_errorf("mailbox rank %d of %d: rank %d's options differ (ranks %d, cap %llu, first epoch %u, "
                              "blocks %d, two-shot from %llu bytes; here %d, %llu, %u, %d, %llu): every rank must "
                              "pass the same",
                              me, R, p, q->ranks, (unsigned long long)q->cap, q->first_epoch, q->blocks,
                              (unsigned long long)q->two_shot_bytes, R, (unsigned long long)rec.cap, rec.first_epoch,
                              rec.blocks, (unsigned long long)rec.two_shot_bytes);
        int share = 0;
        for (int s = 0; s < R; s++) share += strncmp(all[s].bus, q->bus, sizeof q->bus) == 0;
        if (share > max_share) max_share = share;
        if (q->capacity / share < fit) fit = q->capacity / share;
    }
    int blocks;
    K3C_TRY(choose_blocks(o->blocks, fit, max_share, &blocks));
    k3c_mbx_layout lay;
    if (k3c_mbx_layout_make(R, blocks, o->cap, &lay) != 0)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "mailbox: layout of %d ranks x %d blocks", R, blocks);
    /* this rank's region, its handle to every peer; every rank goes through each gather, failed or not */
    mbx_boot_handle h, hs[K3C_MBX_MAX_RANKS];
    memset(&h, 0, sizeof h);
    ok = region_alloc(&lay, o->first_epoch, &r->own, &r->own_status) == K3C_OK &&
         cudaIpcGetMemHandle(&h.handle, r->own) == cudaSuccess;
    h.ok = ok;
    K3C_TRY(boot_gather(boot, on_device, &h, hs, sizeof h));
    for (int p = 0; p < R; p++)
        if (!hs[p].ok) return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox rank %d of %d: rank %d could not allocate "
                                              "and export its region", me, R, p);
    ok = 1;
    for (int p = 0; p < R && ok; p++) {
        if (p == me) continue;
        void *ptr = NULL;
        cudaError_t e = cudaIpcOpenMemHandle(&ptr, hs[p].handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            ok = 0;
            k3c_errorf_kind(K3C_ERROR_DEVICE, "opening rank %d's region (cudaIpcOpenMemHandle): %s", p,
                            cudaGetErrorString(e));
        }
        r->opened[p] = ptr;
    }
    K3C_TRY(boot_all_ok(boot, on_device, ok, "open its peers' regions", ""));
    k3c_mbx_status *dstatus = NULL;
    K3C_CUDA_TRY(cudaHostGetDevicePointer((void **)&dstatus, r->own_status, 0));
    rank_init(r, me, R, device, stream, o, &lay, r->own_status);
    r->args.status = dstatus;
    for (int p = 0; p < R; p++) r->args.region[p] = p == me ? r->own : r->opened[p];
    return K3C_OK;
}

int k3c_comm_mailbox_create_ipc(k3c_comm *boot, int boot_on_device, int device, void *stream,
                                const k3c_comm_mailbox_options *o, k3c_comm **out) {
    if (!out) return k3c_errorf("mailbox: NULL out");
    *out = NULL;
    if (!boot) return k3c_errorf("mailbox: NULL bootstrap communicator");
    mbx_opts opt;
    K3C_TRY(opts_resolve(o, boot->size, &opt));
    mbx_rank *r = calloc(1, sizeof *r);
    if (!r) return k3c_errorf_kind(K3C_ERROR_OOM, "mailbox: out of memory");
    r->device = device;
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    int rc = e == cudaSuccess ? ipc_build(r, boot, boot_on_device, device, (cudaStream_t)stream, &opt)
                              : k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox: %s", cudaGetErrorString(e));
    if (e == cudaSuccess) cudaSetDevice(prev);
    if (rc != K3C_OK) {
        ipc_destroy(r);
        return K3C_ERR;
    }
    *out = &r->comm;
    return K3C_OK;
}

/* ---- the mailbox's own calls ---- */

static mbx_rank *as_mailbox(k3c_comm *c) { return c && c->all_reduce_f32 == mbx_all_reduce_f32 ? c->ctx : NULL; }

int k3c_comm_mailbox_all_reduce(k3c_comm *c, float *buf, size_t n, k3c_mailbox_algo algo) {
    mbx_rank *r = as_mailbox(c);
    if (!r) return k3c_errorf("mailbox all_reduce: not a mailbox communicator");
    if (algo != K3C_MAILBOX_AUTO && algo != K3C_MAILBOX_ONE_SHOT && algo != K3C_MAILBOX_TWO_SHOT)
        return k3c_errorf("mailbox all_reduce: algorithm %d", (int)algo);
    return mbx_reduce(r, buf, n, algo, r->stream);
}

int k3c_comm_mailbox_all_reduce_on(k3c_comm *c, float *buf, size_t n, void *stream) {
    mbx_rank *r = as_mailbox(c);
    if (!r) return k3c_errorf("mailbox all_reduce_on: not a mailbox communicator");
    return mbx_reduce(r, buf, n, K3C_MAILBOX_AUTO, stream ? (cudaStream_t)stream : r->stream);
}

int k3c_comm_mailbox_all_gather_on(k3c_comm *c, const void *src, void *dst, size_t bytes, void *stream) {
    mbx_rank *r = as_mailbox(c);
    if (!r) return k3c_errorf("mailbox all_gather_on: not a mailbox communicator");
    return mbx_exchange(r, src, dst, bytes, -1, "all_gather", stream ? (cudaStream_t)stream : r->stream);
}

int k3c_comm_mailbox_push_targets(k3c_comm *c, k3c_comm_mailbox_push *out) {
    mbx_rank *r = as_mailbox(c);
    if (!r || !out) return k3c_errorf("mailbox push targets: %s", r ? "NULL out" : "not a mailbox communicator");
    memset(out, 0, sizeof *out);
    const k3c_mbx_args *a = &r->args;
    out->ranks = a->lay.ranks;
    out->rank = a->rank;
    for (int p = 0; p < a->lay.ranks; p++)
        out->slot[p] = p == a->rank ? NULL : k3c_mbx_slot_at(a->region[p], a->lay.slots, &a->lay, 0, a->rank);
    /* parity 1 of writer w is ranks slots past parity 0 (k3c_mbx_slot_at) */
    out->parity_floats = (size_t)a->lay.ranks * a->lay.slot_floats;
    out->cap = r->cap;
    k3c_mbx_state *st = (k3c_mbx_state *)a->region[a->rank];
    out->epoch = &st->epoch[0]; /* every block's epoch is the same between calls */
    out->failed = &st->failed;
    return K3C_OK;
}

int k3c_comm_mailbox_one_shot(k3c_comm *c, size_t n) {
    mbx_rank *r = as_mailbox(c);
    return r && n <= r->cap && n * sizeof(float) < r->two_shot_bytes;
}

int k3c_comm_mailbox_all_reduce_round_on(k3c_comm *c, float *buf, size_t n, void *stream) {
    mbx_rank *r = as_mailbox(c);
    if (!r) return k3c_errorf("mailbox all_reduce_round_on: not a mailbox communicator");
    K3C_TRY(mbx_check(r));
    if (!k3c_comm_mailbox_one_shot(c, n) || (n && !buf)) {
        mbx_abort_rank(r);
        return k3c_errorf("mailbox rank %d of %d: rounded all-reduce of %zu floats %s (a one-shot: below %zu bytes, "
                          "at most options.cap %zu floats)", c->rank, c->size, n, buf ? "" : "at NULL",
                          r->two_shot_bytes, r->cap);
    }
    cudaStream_t st = stream ? (cudaStream_t)stream : r->stream;
    mbx_launch l;
    K3C_TRY(launch_begin(r, st, "rounded all-reduce", &l));
    return launch_end(r, "rounded all-reduce", &l, k3c_mbx_one_shot_round(&r->args, buf, n, st));
}

int k3c_comm_mailbox_finish_on(k3c_comm *c, float *buf, size_t n, int round, void *stream) {
    mbx_rank *r = as_mailbox(c);
    if (!r) return k3c_errorf("mailbox finish_on: not a mailbox communicator");
    K3C_TRY(mbx_check(r));
    if (n > r->cap || (n && !buf)) {
        mbx_abort_rank(r);
        return k3c_errorf("mailbox rank %d of %d: finish of %zu floats %s (options.cap %zu)", c->rank, c->size, n,
                          buf ? "past the mailbox" : "at NULL", r->cap);
    }
    cudaStream_t st = stream ? (cudaStream_t)stream : r->stream;
    mbx_launch l;
    K3C_TRY(launch_begin(r, st, "finish", &l));
    return launch_end(r, "finish", &l, k3c_mbx_finish(&r->args, buf, n, round, st));
}

int k3c_comm_mailbox_reduce_rmsnorm_on(k3c_comm *c, float *buf, int rows, int n, const float *w, float eps,
                                       void *stream) {
    mbx_rank *r = as_mailbox(c);
    if (!r) return k3c_errorf("mailbox reduce_rmsnorm_on: not a mailbox communicator");
    K3C_TRY(mbx_check(r));
    if (rows < 1 || n < 4 || n % 4 || (size_t)rows * (size_t)n > r->cap || !buf || !w) {
        mbx_abort_rank(r);
        return k3c_errorf("mailbox rank %d of %d: all-reduce + rmsnorm of %d rows of %d floats (rows of a multiple "
                          "of 4 floats, at most options.cap %zu in all, buffers not NULL)",
                          c->rank, c->size, rows, n, r->cap);
    }
    cudaStream_t st = stream ? (cudaStream_t)stream : r->stream;
    mbx_launch l;
    K3C_TRY(launch_begin(r, st, "all-reduce + rmsnorm", &l));
    return launch_end(r, "all-reduce + rmsnorm", &l, k3c_mbx_reduce_rmsnorm(&r->args, buf, rows, n, w, eps, st));
}

int k3c_comm_is_mailbox(const k3c_comm *c) { return as_mailbox((k3c_comm *)c) != NULL; }

int k3c_comm_mailbox_check(k3c_comm *c) {
    mbx_rank *r = as_mailbox(c);
    return r ? mbx_check(r) : k3c_errorf("mailbox check: not a mailbox communicator");
}

int k3c_comm_mailbox_get_info(k3c_comm *c, k3c_comm_mailbox_info *info) {
    mbx_rank *r = as_mailbox(c);
    if (!r || !info) return k3c_errorf("mailbox info: %s", r ? "NULL info" : "not a mailbox communicator");
    *info = (k3c_comm_mailbox_info){c->size, r->args.lay.blocks, r->cap, r->two_shot_bytes, r->args.lay.bytes};
    return K3C_OK;
}

int k3c_comm_mailbox_epoch(k3c_comm *c, uint32_t *epoch) {
    mbx_rank *r = as_mailbox(c);
    if (!r || !epoch) return k3c_errorf("mailbox epoch: %s", r ? "NULL epoch" : "not a mailbox communicator");
    int prev;
    K3C_TRY(dev_enter(r->device, &prev));
    k3c_mbx_state st;
    cudaError_t e = cudaMemcpyAsync(&st, r->args.region[r->comm.rank], sizeof st, cudaMemcpyDeviceToHost, r->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(r->stream);
    dev_leave(r->device, prev);
    if (e != cudaSuccess)
        return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "mailbox rank %d: reading the epochs: %s", r->comm.rank,
                               cudaGetErrorString(e));
    for (int k = 1; k < r->args.lay.blocks; k++)
        if (st.epoch[k] != st.epoch[0])
            return k3c_errorf_kind(K3C_ERROR_INTERNAL, "mailbox rank %d: block %d's epoch %u, block 0's %u",
                                   r->comm.rank, k, st.epoch[k], st.epoch[0]);
    *epoch = st.epoch[0];
    return K3C_OK;
}

#else /* no CUDA */

static int no_cuda(void) {
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "mailbox: this build has no CUDA (the device mailbox needs it)");
}

int k3c_comm_mailbox_create(int ranks, const int *devices, void *const *streams, const k3c_comm_mailbox_options *o,
                            k3c_comm **out) {
    (void)devices, (void)streams, (void)o;
    for (int r = 0; out && r < ranks && r < 8; r++) out[r] = NULL;
    return no_cuda();
}

int k3c_comm_mailbox_create_ipc(k3c_comm *boot, int boot_on_device, int device, void *stream,
                                const k3c_comm_mailbox_options *o, k3c_comm **out) {
    (void)boot, (void)boot_on_device, (void)device, (void)stream, (void)o;
    if (out) *out = NULL;
    return no_cuda();
}

int k3c_comm_mailbox_all_reduce(k3c_comm *c, float *buf, size_t n, k3c_mailbox_algo algo) {
    (void)c, (void)buf, (void)n, (void)algo;
    return no_cuda();
}

int k3c_comm_mailbox_check(k3c_comm *c) {
    (void)c;
    return no_cuda();
}

int k3c_comm_mailbox_all_reduce_on(k3c_comm *c, float *buf, size_t n, void *stream) {
    (void)c, (void)buf, (void)n, (void)stream;
    return no_cuda();
}

int k3c_comm_mailbox_all_gather_on(k3c_comm *c, const void *src, void *dst, size_t bytes, void *stream) {
    (void)c, (void)src, (void)dst, (void)bytes, (void)stream;
    return no_cuda();
}

int k3c_comm_is_mailbox(const k3c_comm *c) {
    (void)c;
    return 0;
}

int k3c_comm_mailbox_push_targets(k3c_comm *c, k3c_comm_mailbox_push *out) {
    (void)c, (void)out;
    return no_cuda();
}

int k3c_comm_mailbox_one_shot(k3c_comm *c, size_t n) {
    (void)c, (void)n;
    return 0;
}

int k3c_comm_mailbox_finish_on(k3c_comm *c, float *buf, size_t n, int round, void *stream) {
    (void)c, (void)buf, (void)n, (void)round, (void)stream;
    return no_cuda();
}

int k3c_comm_mailbox_all_reduce_round_on(k3c_comm *c, float *buf, size_t n, void *stream) {
    (void)c, (void)buf, (void)n, (void)stream;
    return no_cuda();
}

int k3c_comm_mailbox_reduce_rmsnorm_on(k3c_comm *c, float *buf, int rows, int n, const float *w, float eps,
                                       void *stream) {
    (void)c, (void)buf, (void)rows, (void)n, (void)w, (void)eps, (void)stream;
    return no_cuda();
}

int k3c_comm_mailbox_get_info(k3c_comm *c, k3c_comm_mailbox_info *info) {
    (void)c, (void)info;
    return no_cuda();
}

int k3c_comm_mailbox_epoch(k3c_comm *c, uint32_t *epoch) {
    (void)c, (void)epoch;
    return no_cuda();
}

#endif
