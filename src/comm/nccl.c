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
 * smaller group (a TP group of a larger world) is split from the world's (ncclCommSplit). */
#include "comm/comm.h"

#include "util/error.h"

#if defined(K3C_HAVE_CUDA) && defined(__has_include)
#if __has_include(<nccl.h>)
#define K3C_HAVE_NCCL 1
#endif
#endif

#ifdef K3C_HAVE_NCCL

#include <dlfcn.h>
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

/* A one-float all-reduce, then the stream drained with a bounded poll: every queued collective done. */
static int nc_barrier(k3c_comm *c) {
    nccl_ctx *x = c->ctx;
    if (x->aborted) return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: aborted", c->rank, c->size);
    K3C_TRY(check(c, nc.all_reduce(x->one, x->one, 1, ncclFloat32, ncclSum, x->comm, x->stream), "barrier"));
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        cudaError_t q = cudaStreamQuery(x->stream);
        if (q == cudaSuccess) return K3C_OK;
        if (q != cudaErrorNotReady) {
            nc_abort(c);
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: barrier: %s", c->rank, c->size,
                                   cudaGetErrorString(q));
        }
        ncclResult_t a = ncclSuccess;
        if (nc.async_error(x->comm, &a) != ncclSuccess || (a != ncclSuccess && a != ncclInProgress)) {
            nc_abort(c);
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: barrier: %s (a peer failed)", c->rank,
                                   c->size, nc.error_string(a));
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > NCCL_WAIT_MS) {
            nc_abort(c);
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: barrier: no peer answered in %d ms", c->rank,
                                   c->size, NCCL_WAIT_MS);
        }
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
}

static void nc_free(k3c_comm *c) {
    if (!c) return;
    nccl_ctx *x = c->ctx;
    if (!x->aborted) nc.destroy(x->comm);
    if (x->one) cudaFree(x->one);
    free(x);
    free(c);
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
static int wrap(ncclComm_t comm, int rank, int size, cudaStream_t stream, k3c_comm **out) {
    k3c_comm *c = calloc(1, sizeof *c);
    nccl_ctx *x = calloc(1, sizeof *x);
    cudaError_t ce = c && x ? cudaMalloc((void **)&x->one, sizeof(float)) : cudaErrorMemoryAllocation;
    if (ce != cudaSuccess) {
        free(c), free(x);
        nc.destroy(comm);
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d: %s", rank, cudaGetErrorString(ce));
    }
    x->comm = comm;
    x->stream = stream;
    *c = (k3c_comm){"nccl", rank, size, x, nc_all_reduce, nc_all_gather, nc_broadcast, nc_barrier, nc_abort, nc_free};
    *out = c;
    return K3C_OK;
}

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
    return wrap(comm, rank, size, (cudaStream_t)stream, out);
}

int k3c_comm_nccl_split(k3c_comm *parent, int color, int key, k3c_comm **out) {
    *out = NULL;
    if (!parent || strcmp(parent->name, "nccl") != 0) return k3c_errorf("nccl split: not an nccl communicator");
    nccl_ctx *px = parent->ctx;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = nc.split(px->comm, color, key, &comm, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: ncclCommSplit (color %d): %s", parent->rank,
                               parent->size, color, nc.error_string(r));
    /* a rank's place in the new group is its key's order among the ranks of its color; the caller passes
     * keys 0 .. n - 1, so the key is the rank */
    if (wait_ready(comm, parent->rank, parent->size, "ncclCommSplit") != K3C_OK) {
        nc.abort_comm(comm);
        return K3C_ERR;
    }
    int n = 0;
    if (nc.count(comm, &n) != ncclSuccess || n < 1 || key >= n) {
        nc.destroy(comm);
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d: ncclCommCount of the split group failed", parent->rank);
    }
    return wrap(comm, key, n, px->stream, out);
}

#else /* no CUDA, or a toolkit without nccl.h */

int k3c_comm_nccl_check(void) {
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
