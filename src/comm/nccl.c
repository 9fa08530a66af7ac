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
 * (ncclCommAbort), so a rank whose peer is gone fails instead of hanging. */
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
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
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
    SYM(init_rank, "ncclCommInitRank");
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

static int check(k3c_comm *c, ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return K3C_OK;
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

int k3c_comm_nccl_create(const unsigned char id[K3C_COMM_NCCL_ID_BYTES], int rank, int size, int device,
                         void *stream, k3c_comm **out) {
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size) return k3c_errorf("nccl: rank %d of %d", rank, size);
    K3C_TRY(nccl_load());
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d: device %d: %s", rank, device, cudaGetErrorString(ce));
    k3c_comm *c = calloc(1, sizeof *c);
    nccl_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c), free(x);
        return k3c_errorf_kind(K3C_ERROR_OOM, "nccl: out of memory");
    }
    *c = (k3c_comm){"nccl", rank, size, x, nc_all_reduce, nc_all_gather, nc_broadcast, nc_barrier, nc_abort, nc_free,
                    .stream_ordered = 1};
    x->stream = (cudaStream_t)stream;
    ce = cudaMalloc((void **)&x->one, sizeof(float));
    if (ce != cudaSuccess) {
        free(c), free(x);
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d: %s", rank, cudaGetErrorString(ce));
    }
    ncclUniqueId u;
    memcpy(u.internal, id, sizeof u.internal);
    ncclResult_t r = nc.init_rank(&x->comm, size, u, rank);
    if (r != ncclSuccess) {
        cudaFree(x->one);
        free(c), free(x);
        return k3c_errorf_kind(K3C_ERROR_DEVICE, "nccl rank %d of %d: ncclCommInitRank: %s", rank, size,
                               nc.error_string(r));
    }
    *out = c;
    return K3C_OK;
}

#else /* no CUDA, or a toolkit without nccl.h */

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
