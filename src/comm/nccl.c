/* The NCCL communicator (comm/comm.h): one rank per process and GPU, collectives on the given stream.
 *
 * Built where the CUDA toolkit's nccl.h is found (it ships with the toolkit here); libnccl.so.2 is loaded at
 * the first call (dlopen, as cuda/cublaslt.c loads cuBLASLt), so the binary links and runs without it and a
 * CPU-only machine never needs it. Not run in CI (one GPU per rank): the CPU ranks' stand-in is
 * comm/threads.c behind the same interface.
 *
 * Sums are NCCL's (ring or tree order, every rank the same bits), not the fixed rank order of the in-memory
 * group. The collectives are asynchronous on the stream; barrier waits for them with a bounded poll
 * (cudaStreamQuery and ncclCommGetAsyncError), and on timeout or error aborts the communicator
 * (ncclCommAbort), so a rank whose peer is gone fails instead of hanging. Communicators are created
 * non-blocking and polled with the same bound (a rank that never starts fails the others' creation), and a
 * smaller group (a TP group of a larger world) is split from the world's (ncclCommSplit).
 *
 * send / recv and all_to_all are grouped ncclSend / ncclRecv calls (ncclGroupStart / End) and wait for
 * themselves with the same bounded poll. NCCL checks no sizes, so every message carries an 8-byte header,
 * its byte count, sent in the same group as the payload: after the wait the receiver compares the header
 * with the size it expected and fails (aborting the communicator, so its peers fail too) on a mismatch; a
 * mismatch that makes NCCL itself wait ends in the bounded poll instead. */
#include "comm/comm.h"

#include "util/error.h"

#if defined(K3C_HAVE_CUDA) && defined(__has_include)
#if __has_include(<nccl.h>)
#define K3C_HAVE_NCCL 1
#endif
#endif

#ifdef K3C_HAVE_NCCL

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

_Static_assert(K3C_COMM_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "the unique id's size");

#define NCCL_WAIT_MS 60000 /* the longest a barrier waits for its peers */

static struct {
    int tried, ok;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*split)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
    ncclResult_t (*count)(const ncclComm_t, int *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*user_rank)(const ncclComm_t, int *);
    ncclResult_t (*abort_comm)(ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    const char *(*error_string)(ncclResult_t);
} nc;

static int nccl_load(void) {
    if (nc.tried) return nc.ok ? K3C_OK : k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl: libnccl.so.2 did not load");
    nc.tried = 1;
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl: cannot load libnccl.so.2: %s", dlerror());
#define SYM(field, name)                                                                                           \
    do {                                                                                                           \
        *(void **)&nc.field = dlsym(h, name);                                                                      \
        if (!nc.field) return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl: libnccl.so.2 has no %s", name);            \
    } while (0)
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(init_rank_config, "ncclCommInitRankConfig");
    SYM(split, "ncclCommSplit");
    SYM(count, "ncclCommCount");
    SYM(all_reduce, "ncclAllReduce");
    SYM(all_gather, "ncclAllGather");
    SYM(broadcast, "ncclBroadcast");
    SYM(send, "ncclSend");
    SYM(recv, "ncclRecv");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(user_rank, "ncclCommUserRank");
    SYM(abort_comm, "ncclCommAbort");
    SYM(destroy, "ncclCommDestroy");
    SYM(async_error, "ncclCommGetAsyncError");
    SYM(error_string, "ncclGetErrorString");
#undef SYM
    nc.ok = 1;
    return K3C_OK;
}

typedef struct nccl_ctx {
    ncclComm_t comm;
    cudaStream_t stream;
    float *one; /* [1] device scratch of the barrier's all-reduce */
    uint64_t *hdr;      /* [2 size] device: the headers sent to each peer, then those received from each */
    uint64_t *hdr_host; /* [2 size] host copies (kept until the wait: the uploads read them) */
    int aborted;
} nccl_ctx;

static int wait_ready(ncclComm_t comm, int rank, int size, const char *what);
static void nc_abort(k3c_comm *c);

/* The communicators are non-blocking (below): a call may return ncclInProgress while NCCL still enqueues
 * it, and the next call on the communicator must wait until it has (bounded, as creation). */
static int check(k3c_comm *c, ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return K3C_OK;
    if (r == ncclInProgress && wait_ready(((nccl_ctx *)c->ctx)->comm, c->rank, c->size, what) == K3C_OK) return K3C_OK;
    nc_abort(c);
    if (r == ncclInProgress) return K3C_ERR;
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: %s: %s", c->rank, c->size, what, nc.error_string(r));
}

static int nc_all_reduce(k3c_comm *c, float *buf, size_t n) {
    nccl_ctx *x = c->ctx;
    return check(c, nc.all_reduce(buf, buf, n, ncclFloat32, ncclSum, x->comm, x->stream), "all_reduce");
}

static int nc_all_gather(k3c_comm *c, const void *src, void *dst, size_t bytes) {
    nccl_ctx *x = c->ctx;
    return check(c, nc.all_gather(src, dst, bytes, ncclUint8, x->comm, x->stream), "all_gather");
}

static int nc_broadcast(k3c_comm *c, void *buf, size_t bytes, int root) {
    nccl_ctx *x = c->ctx;
    return check(c, nc.broadcast(buf, buf, bytes, ncclUint8, root, x->comm, x->stream), "broadcast");
}

static void nc_abort(k3c_comm *c) {
    nccl_ctx *x = c->ctx;
    if (!x->aborted) nc.abort_comm(x->comm);
    x->aborted = 1;
}

/* The stream drained with a bounded poll: every queued collective done, or the communicator aborted. */
static int nc_wait(k3c_comm *c, const char *what) {
    nccl_ctx *x = c->ctx;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        cudaError_t q = cudaStreamQuery(x->stream);
        if (q == cudaSuccess) return K3C_OK;
        if (q != cudaErrorNotReady) {
            nc_abort(c);
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: %s: %s", c->rank, c->size, what,
                                   cudaGetErrorString(q));
        }
        ncclResult_t a = ncclSuccess;
        if (nc.async_error(x->comm, &a) != ncclSuccess || (a != ncclSuccess && a != ncclInProgress)) {
            nc_abort(c);
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: %s: %s (a peer failed)", c->rank, c->size,
                                   what, nc.error_string(a));
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > NCCL_WAIT_MS) {
            nc_abort(c);
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: %s: no peer answered in %d ms", c->rank,
                                   c->size, what, NCCL_WAIT_MS);
        }
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
}

static int aborted(k3c_comm *c) {
    nccl_ctx *x = c->ctx;
    return x->aborted ? k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: aborted", c->rank, c->size) : K3C_OK;
}

/* A one-float all-reduce, then the stream drained: every queued collective done. */
static int nc_barrier(k3c_comm *c) {
    nccl_ctx *x = c->ctx;
    K3C_TRY(aborted(c));
    K3C_TRY(check(c, nc.all_reduce(x->one, x->one, 1, ncclFloat32, ncclSum, x->comm, x->stream), "barrier"));
    return nc_wait(c, "barrier");
}

/* ---- point to point and all-to-all (headers: see the top of the file) ---- */

/* Ends a group; on failure aborts (a half-issued group leaves the peers waiting). */
static int group_end(k3c_comm *c, ncclResult_t r, const char *what) {
    ncclResult_t e = nc.group_end();
    if (r == ncclSuccess) r = e;
    if (r == ncclSuccess) return K3C_OK;
    nc_abort(c);
    return check(c, r, what);
}

static int upload_header(k3c_comm *c, int peer, size_t bytes) {
    nccl_ctx *x = c->ctx;
    x->hdr_host[peer] = bytes;
    cudaError_t e = cudaMemcpyAsync(x->hdr + peer, x->hdr_host + peer, sizeof(uint64_t), cudaMemcpyHostToDevice,
                                    x->stream);
    return e == cudaSuccess ? K3C_OK
                            : k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: header: %s", c->rank, c->size,
                                              cudaGetErrorString(e));
}

/* After the wait: the headers received from peers [0, size) where want[p] >= 0 equal want[p]. */
static int check_headers(k3c_comm *c, const long long *want, const char *what) {
    nccl_ctx *x = c->ctx;
    cudaError_t e = cudaMemcpy(x->hdr_host + c->size, x->hdr + c->size, (size_t)c->size * sizeof(uint64_t),
                               cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: %s: %s", c->rank, c->size, what,
                               cudaGetErrorString(e));
    for (int p = 0; p < c->size; p++)
        if (want[p] >= 0 && x->hdr_host[c->size + p] != (uint64_t)want[p]) {
            nc_abort(c);
            return k3c_errorf("nccl rank %d of %d: %s: rank %d sent %llu bytes, %lld expected", c->rank, c->size, what,
                              p, (unsigned long long)x->hdr_host[c->size + p], want[p]);
        }
    return K3C_OK;
}

/* A call this rank cannot make fails the communicator, as the in-memory group does, so its peers do not wait. */
static int peer_ok(k3c_comm *c, int peer, const char *what) {
    if (peer >= 0 && peer < c->size && peer != c->rank) return K3C_OK;
    nc_abort(c);
    return k3c_errorf("nccl rank %d of %d: %s with rank %d (another rank of the group)", c->rank, c->size, what, peer);
}

static int nc_send(k3c_comm *c, const void *buf, size_t bytes, int peer) {
    nccl_ctx *x = c->ctx;
    K3C_TRY(aborted(c));
    K3C_TRY(peer_ok(c, peer, "send"));
    K3C_TRY(upload_header(c, peer, bytes));
    ncclResult_t r = nc.group_start();
    if (r == ncclSuccess) r = nc.send(x->hdr + peer, sizeof(uint64_t), ncclUint8, peer, x->comm, x->stream);
    if (r == ncclSuccess && bytes) r = nc.send(buf, bytes, ncclUint8, peer, x->comm, x->stream);
    K3C_TRY(group_end(c, r, "send"));
    return nc_wait(c, "send");
}

static int nc_recv(k3c_comm *c, void *buf, size_t bytes, int peer) {
    nccl_ctx *x = c->ctx;
    K3C_TRY(aborted(c));
    K3C_TRY(peer_ok(c, peer, "recv"));
    ncclResult_t r = nc.group_start();
    if (r == ncclSuccess) r = nc.recv(x->hdr + c->size + peer, sizeof(uint64_t), ncclUint8, peer, x->comm, x->stream);
    if (r == ncclSuccess && bytes) r = nc.recv(buf, bytes, ncclUint8, peer, x->comm, x->stream);
    K3C_TRY(group_end(c, r, "recv"));
    K3C_TRY(nc_wait(c, "recv"));
    long long want[c->size];
    for (int p = 0; p < c->size; p++) want[p] = p == peer ? (long long)bytes : -1;
    return check_headers(c, want, "recv");
}

/* Every peer gets a header (its count, maybe 0) so every count is checked; the rank's own part is a device
 * copy. */
static int nc_all_to_all(k3c_comm *c, const void *send, const size_t *send_bytes, void *recv,
                         const size_t *recv_bytes) {
    nccl_ctx *x = c->ctx;
    int n = c->size, me = c->rank;
    K3C_TRY(aborted(c));
    if (send_bytes[me] != recv_bytes[me]) {
        nc_abort(c);
        return k3c_errorf("nccl rank %d of %d: all_to_all sends %zu bytes to itself, expects %zu", me, n,
                          send_bytes[me], recv_bytes[me]);
    }
    for (int p = 0; p < n; p++)
        if (p != me) K3C_TRY(upload_header(c, p, send_bytes[p]));
    size_t so = 0, ro = 0;
    ncclResult_t r = nc.group_start();
    for (int p = 0; p < n && r == ncclSuccess; p++) {
        if (p == me) {
            if (send_bytes[p] &&
                cudaMemcpyAsync((char *)recv + ro, (const char *)send + so, send_bytes[p], cudaMemcpyDeviceToDevice,
                                x->stream) != cudaSuccess)
                r = ncclUnhandledCudaError;
        } else {
            r = nc.send(x->hdr + p, sizeof(uint64_t), ncclUint8, p, x->comm, x->stream);
            if (r == ncclSuccess) r = nc.recv(x->hdr + n + p, sizeof(uint64_t), ncclUint8, p, x->comm, x->stream);
            if (r == ncclSuccess && send_bytes[p])
                r = nc.send((const char *)send + so, send_bytes[p], ncclUint8, p, x->comm, x->stream);
            if (r == ncclSuccess && recv_bytes[p])
                r = nc.recv((char *)recv + ro, recv_bytes[p], ncclUint8, p, x->comm, x->stream);
        }
        so += send_bytes[p];
        ro += recv_bytes[p];
    }
    K3C_TRY(group_end(c, r, "all_to_all"));
    K3C_TRY(nc_wait(c, "all_to_all"));
    long long want[n];
    for (int p = 0; p < n; p++) want[p] = p == me ? -1 : (long long)recv_bytes[p];
    return check_headers(c, want, "all_to_all");
}

static int nc_make(int rank, int size, ncclComm_t comm, cudaStream_t stream, k3c_comm **out);

static int nc_split(k3c_comm *c, int color, int key, k3c_comm **out) {
    nccl_ctx *x = c->ctx;
    *out = NULL;
    K3C_TRY(aborted(c));
    ncclComm_t sub = NULL;
    K3C_TRY(check(c, nc.split(x->comm, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, &sub, NULL), "split"));
    if (color < 0) return K3C_OK;
    int rank = 0, size = 0;
    /* the sub-communicator's rank and size, as ncclCommSplit ordered them */
    ncclResult_t r = nc.user_rank(sub, &rank);
    if (r == ncclSuccess) r = nc.count(sub, &size);
    if (r != ncclSuccess) {
        nc.destroy(sub);
        return check(c, r, "split");
    }
    if (nc_make(rank, size, sub, x->stream, out) != K3C_OK) {
        nc.destroy(sub);
        return K3C_ERR;
    }
    return K3C_OK;
}

static void ctx_free(nccl_ctx *x) {
    if (x->one) cudaFree(x->one);
    if (x->hdr) cudaFree(x->hdr);
    free(x->hdr_host);
    free(x);
}

static void nc_free(k3c_comm *c) {
    if (!c) return;
    nccl_ctx *x = c->ctx;
    if (!x->aborted) nc.destroy(x->comm);
    ctx_free(x);
    free(c);
}

/* The k3c_comm of an initialized NCCL communicator (its scratch allocated here); comm stays the caller's on
 * failure. */
static int nc_make(int rank, int size, ncclComm_t comm, cudaStream_t stream, k3c_comm **out) {
    *out = NULL;
    k3c_comm *c = calloc(1, sizeof *c);
    nccl_ctx *x = calloc(1, sizeof *x);
    if (x) x->hdr_host = calloc(2 * (size_t)size, sizeof(uint64_t));
    if (!c || !x || !x->hdr_host) {
        free(c);
        if (x) free(x->hdr_host);
        free(x);
        return k3c_errorf_kind(K3C_ERROR_OOM, "nccl: out of memory");
    }
    cudaError_t ce = cudaMalloc((void **)&x->one, sizeof(float));
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&x->hdr, 2 * (size_t)size * sizeof(uint64_t));
    if (ce != cudaSuccess) {
        ctx_free(x);
        free(c);
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d: %s", rank, cudaGetErrorString(ce));
    }
    x->comm = comm;
    x->stream = stream;
    *c = (k3c_comm){.name = "nccl", .rank = rank, .size = size, .ctx = x, .all_reduce_f32 = nc_all_reduce,
                    .all_gather = nc_all_gather, .broadcast = nc_broadcast, .barrier = nc_barrier, .abort = nc_abort,
                    .free = nc_free, .stream_ordered = 1, .send = nc_send, .recv = nc_recv,
                    .all_to_all = nc_all_to_all, .split = nc_split};
    *out = c;
    return K3C_OK;
}

int k3c_comm_nccl_unique_id(unsigned char id[K3C_COMM_NCCL_ID_BYTES]) {
    K3C_TRY(nccl_load());
    ncclUniqueId u;
    ncclResult_t r = nc.get_unique_id(&u);
    if (r != ncclSuccess) return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl: ncclGetUniqueId: %s", nc.error_string(r));
    memcpy(id, u.internal, sizeof u.internal);
    return K3C_OK;
}

/* Communicator creation is non-blocking (config.blocking = 0) and polled here with a bound: a blocking
 * ncclCommInitRank waits for every rank forever, so one rank that never starts would hang the others. */
static int wait_ready(ncclComm_t comm, int rank, int size, const char *what) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = nc.async_error(comm, &a);
        if (q == ncclSuccess && a == ncclSuccess) return K3C_OK;
        if (q != ncclSuccess || a != ncclInProgress)
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: %s: %s", rank, size, what,
                                   nc.error_string(q != ncclSuccess ? q : a));
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > NCCL_WAIT_MS)
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: %s: not done in %d ms (a rank missing?)",
                                   rank, size, what, NCCL_WAIT_MS);
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
}

/* A communicator struct around comm (its barrier scratch allocated on the current device). */
int k3c_comm_nccl_check(void) { return nccl_load(); }

int k3c_comm_nccl_create(const unsigned char id[K3C_COMM_NCCL_ID_BYTES], int rank, int size, int device,
                         void *stream, k3c_comm **out) {
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size) return k3c_errorf("nccl: rank %d of %d", rank, size);
    K3C_TRY(nccl_load());
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d: device %d: %s", rank, device, cudaGetErrorString(ce));
    ncclUniqueId u;
    memcpy(u.internal, id, sizeof u.internal);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = nc.init_rank_config(&comm, size, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: ncclCommInitRankConfig: %s", rank, size,
                               nc.error_string(r));
    if (wait_ready(comm, rank, size, "ncclCommInitRankConfig") != K3C_OK) {
        nc.abort_comm(comm);
        return K3C_ERR;
    }
    if (nc_make(rank, size, comm, (cudaStream_t)stream, out) != K3C_OK) {
        nc.destroy(comm);
        return K3C_ERR;
    }
    return K3C_OK;
}

int k3c_comm_nccl_split(k3c_comm *parent, int color, int key, k3c_comm **out) {
    *out = NULL;
    if (!parent || strcmp(parent->name, "nccl") != 0) return k3c_errorf("nccl split: not an nccl communicator");
    /* the communicator's own split (nc_split): the child inherits the parent's non-blocking configuration
     * and check() polls it to completion within the bound */
    return parent->split(parent, color, key, out);
}

int k3c_comm_nccl_set_stream(k3c_comm *c, void *stream) {
    if (!c || strcmp(c->name, "nccl") != 0) return k3c_errorf("nccl set_stream: not an nccl communicator");
    K3C_TRY(c->barrier(c)); /* nothing of the old stream's left in flight */
    ((nccl_ctx *)c->ctx)->stream = (cudaStream_t)stream;
    return K3C_OK;
}

#else /* no CUDA, or a toolkit without nccl.h */

int k3c_comm_nccl_check(void) {
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl: this build has no NCCL (no CUDA toolkit with nccl.h)");
}

int k3c_comm_nccl_set_stream(k3c_comm *c, void *stream) {
    (void)c, (void)stream;
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl: this build has no NCCL (no CUDA toolkit with nccl.h)");
}

int k3c_comm_nccl_split(k3c_comm *parent, int color, int key, k3c_comm **out) {
    (void)parent, (void)color, (void)key;
    *out = NULL;
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl: this build has no NCCL (no CUDA toolkit with nccl.h)");
}

int k3c_comm_nccl_unique_id(unsigned char id[K3C_COMM_NCCL_ID_BYTES]) {
    (void)id;
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl: this build has no NCCL (no CUDA toolkit with nccl.h)");
}

int k3c_comm_nccl_create(const unsigned char id[K3C_COMM_NCCL_ID_BYTES], int rank, int size, int device,
                         void *stream, k3c_comm **out) {
    (void)id, (void)rank, (void)size, (void)device, (void)stream;
    *out = NULL;
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl: this build has no NCCL (no CUDA toolkit with nccl.h)");
}

#endif
