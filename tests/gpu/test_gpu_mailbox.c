/* The mailbox communicator (comm/mailbox_cuda.h) on the GPU: 2, 4 and 8 ranks in this process on one device,
 * each rank its own stream, through the hard cases of the protocol (comm/mailbox.h): fresh random data with
 * signed zeros, subnormals, infinities and mixed magnitudes; sizes changing between calls from 1 float to the
 * capacity, odd and misaligned; thousands of calls in a row with no host synchronisation between them; the
 * one-shot and the two-shot mixed call by call; epochs started just before 2^32; a captured sequence of calls
 * replayed hundreds of times, eager calls between the replays; a rank that never calls (the others fail within
 * the timeout); a call of another size or kind (refused on every rank, at once); gathers and broadcasts; one
 * host thread per rank with barriers; one rank per device where several devices are visible; one process per
 * rank on the one device, through CUDA IPC (the path of one process per GPU).
 *
 * The reference is the sum in rank order written here from the contract (rank 0's value first, then += each
 * next rank's in f32), compared bitwise with every rank's result (so -0 + -0 = -0 is checked, and every rank
 * holding the same bits); the memory around every call's region is poisoned and must come back unchanged. */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "comm/mailbox_cuda.h"
#ifndef K3C_MBT_EMU /* tools/mailbox_emu has no backend kernels: the GPU's reference norm and its GEMVs */
#include "cuda/elementwise.h"
#include "cuda/gemm.h"
#endif
#include "gpu_util.h"
#include "../test.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/rng.h"

#define MBT_MAX 8
#define MBT_POISON 0x7fa5a5a5u /* a NaN: a result is never NaN, so a poisoned word that leaks shows */

/* Several ranks on one device need a hardware queue per stream (comm/mailbox_cuda.h): set before this process
 * first uses CUDA (a constructor runs before main); a value the environment gives is kept. */
__attribute__((constructor)) static void mbt_connections(void) {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("CUDA_MODULE_LOADING", "EAGER", 0); /* comm/mailbox_cuda.c: a lazy first launch waits for the device */
}

/* K3C_MBT_SCALE (0 < s <= 1): fewer calls, for a run on a CPU emulation of the device (tools/mailbox_emu). */
static int mbt_scaled(int n) {
    const char *s = getenv("K3C_MBT_SCALE");
    double f = s ? atof(s) : 1.0;
    if (!(f > 0 && f <= 1)) f = 1.0;
    int v = (int)(n * f);
    return v < 2 ? 2 : v;
}

static double mbt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CK(call)                                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        CHECKF(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                                        \
    } while (0)
/* in helpers that return int: record the failure and return -1 */
#define MT(cond, ...)                                                                                              \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            test_fail(__FILE__, __LINE__, __VA_ARGS__);                                                            \
            return -1;                                                                                             \
        }                                                                                                          \
    } while (0)
#define MT_CUDA(call)                                                                                              \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        MT(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                                            \
    } while (0)

/* R ranks on devices dev[r], their streams, communicators and buffers of `buf` floats (device, and pinned
 * host in / out). */
typedef struct mbt {
    int R;
    int dev[MBT_MAX];
    cudaStream_t st[MBT_MAX];
    k3c_comm *c[MBT_MAX];
    float *d[MBT_MAX];
    float *in[MBT_MAX], *out[MBT_MAX];
    size_t buf;
} mbt;

static void mbt_close(mbt *t) {
    for (int r = 0; r < t->R; r++) {
        if (t->st[r]) {
            cudaSetDevice(t->dev[r]);
            cudaStreamSynchronize(t->st[r]);
        }
    }
    for (int r = 0; r < t->R; r++) {
        if (t->c[r]) t->c[r]->free(t->c[r]);
        cudaSetDevice(t->dev[r]);
        if (t->d[r]) cudaFree(t->d[r]);
        if (t->in[r]) cudaFreeHost(t->in[r]);
        if (t->out[r]) cudaFreeHost(t->out[r]);
        if (t->st[r]) cudaStreamDestroy(t->st[r]);
    }
    cudaSetDevice(0);
    memset(t, 0, sizeof *t);
}

/* devs NULL: every rank on device 0. */
static int mbt_open(mbt *t, int R, const int *devs, size_t buf, const k3c_comm_mailbox_options *o) {
    memset(t, 0, sizeof *t);
    t->R = R;
    t->buf = buf;
    for (int r = 0; r < R; r++) {
        t->dev[r] = devs ? devs[r] : 0;
        MT_CUDA(cudaSetDevice(t->dev[r]));
        MT_CUDA(cudaStreamCreateWithFlags(&t->st[r], cudaStreamNonBlocking));
    }
    for (int r = 0; r < R; r++) {
        MT_CUDA(cudaSetDevice(t->dev[r]));
        if (buf) {
            MT_CUDA(cudaMalloc((void **)&t->d[r], buf * sizeof(float)));
            MT_CUDA(cudaMallocHost((void **)&t->in[r], buf * sizeof(float)));
            MT_CUDA(cudaMallocHost((void **)&t->out[r], buf * sizeof(float)));
        }
    }
    MT_CUDA(cudaSetDevice(0));
    MT(k3c_comm_mailbox_create(R, t->dev, (void *const *)t->st, o, t->c) == K3C_OK, "mailbox create (%d ranks): %s",
       R, k3c_error_message());
    return 0;
}

static int mbt_sync(mbt *t) {
    for (int r = 0; r < t->R; r++) {
        MT_CUDA(cudaSetDevice(t->dev[r]));
        MT_CUDA(cudaStreamSynchronize(t->st[r]));
    }
    MT_CUDA(cudaSetDevice(0));
    return 0;
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One input value: signed zeros, subnormals, +inf (only at odd elements, never -inf: no inf - inf = NaN),
 * large and small magnitudes mixed so that the order of the additions shows in the rounding. */
static float mbt_value(k3c_rng *g, size_t i) {
    uint64_t u = k3c_rng_next(g);
    float sign = (u >> 8) & 1 ? -1.0f : 1.0f;
    switch (u % 16) {
    case 0: return -0.0f;
    case 1: return 0.0f;
    case 2: return sign * 1e-40f * (float)(1 + ((u >> 9) & 7)); /* subnormal */
    case 3: return (i & 1) ? INFINITY : sign;
    case 4: return sign * ldexpf((float)((u >> 12) & 0xffffff), (int)((u >> 40) % 24)); /* up to ~2^47 */
    default: return (float)((double)(u >> 11) / 9007199254740992.0 - 0.5) * ldexpf(1.0f, (int)((u >> 3) % 40) - 20);
    }
}

/* Fills rank r's n inputs of one call. zeros: element i % 3 == 0 is -0 on every rank (the sum must stay -0),
 * i % 3 == 1 is -0 except on the last rank (+0), so the sums' signs of zero are checked on every call. */
static void mbt_fill(float *x, size_t n, uint64_t seed, int call, int r, int R, int zeros) {
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ ((uint64_t)call << 24) ^ ((uint64_t)r << 52) ^ 0x6d62ull);
    for (size_t i = 0; i < n; i++) {
        x[i] = mbt_value(&g, i);
        if (zeros && i % 3 == 0) x[i] = -0.0f;
        if (zeros && i % 3 == 1) x[i] = r == R - 1 ? 0.0f : -0.0f;
    }
}

/* One call of a batch: its size, algorithm and region in each rank's buffer. */
typedef struct mbt_call {
    size_t n;
    k3c_mailbox_algo algo;
    int zeros;
    size_t off[MBT_MAX];
} mbt_call;

/* Lays the calls out in the ranks' buffers, each rank its own gaps (mostly 16-byte aligned starts, a quarter
 * not, so both the vector and the scalar paths run, and different ranks take different ones); 0, or -1 when
 * they do not fit in buf floats. */
static int mbt_layout(mbt_call *calls, int ncalls, int R, size_t buf, k3c_rng *g) {
    for (int r = 0; r < R; r++) {
        size_t pos = 4;
        for (int k = 0; k < ncalls; k++) {
            uint64_t u = k3c_rng_next(g);
            pos = u % 4 ? (pos + 4 + 3) / 4 * 4 : pos + 1 + (u >> 8) % 3;
            calls[k].off[r] = pos;
            pos += calls[k].n;
        }
        if (pos + 4 > buf) return -1;
    }
    return 0;
}

/* Runs the calls on every rank back to back (rank 0's call k, rank 1's call k, ..., then call k + 1; no host
 * synchronisation between calls), then compares every result bitwise with the rank-order sum, and every
 * float outside the calls' regions with the poison it held. *bad: the differing results. */
static int mbt_batch(mbt *t, const mbt_call *calls, int ncalls, uint64_t seed, long *bad) {
    const int R = t->R;
    *bad = 0;
    for (int r = 0; r < R; r++) {
        for (size_t i = 0; i < t->buf; i++) t->in[r][i] = u2f(MBT_POISON);
        for (int k = 0; k < ncalls; k++)
            mbt_fill(t->in[r] + calls[k].off[r], calls[k].n, seed, k, r, R, calls[k].zeros);
        MT_CUDA(cudaSetDevice(t->dev[r]));
        MT_CUDA(cudaMemcpyAsync(t->d[r], t->in[r], t->buf * sizeof(float), cudaMemcpyHostToDevice, t->st[r]));
    }
    if (mbt_sync(t)) return -1;
    for (int k = 0; k < ncalls; k++)
        for (int r = 0; r < R; r++)
            MT(k3c_comm_mailbox_all_reduce(t->c[r], t->d[r] + calls[k].off[r], calls[k].n, calls[k].algo) == K3C_OK,
               "rank %d, call %d (%zu floats): %s", r, k, calls[k].n, k3c_error_message());
    for (int r = 0; r < R; r++) {
        MT_CUDA(cudaSetDevice(t->dev[r]));
        MT_CUDA(cudaMemcpyAsync(t->out[r], t->d[r], t->buf * sizeof(float), cudaMemcpyDeviceToHost, t->st[r]));
    }
    if (mbt_sync(t)) return -1;
    for (int r = 0; r < R; r++)
        MT(k3c_comm_mailbox_check(t->c[r]) == K3C_OK, "rank %d: %s", r, k3c_error_message());
    long first = -1;
    for (int k = 0; k < ncalls; k++)
        for (size_t i = 0; i < calls[k].n; i++) {
            float want = t->in[0][calls[k].off[0] + i];
            for (int q = 1; q < R; q++) want += t->in[q][calls[k].off[q] + i];
            for (int r = 0; r < R; r++)
                if (f2u(t->out[r][calls[k].off[r] + i]) != f2u(want)) {
                    if (first < 0) {
                        first = k;
                        fprintf(stderr, "    call %d (%zu floats, algo %d) rank %d element %zu: %a (0x%08x), want %a "
                                "(0x%08x)\n", k, calls[k].n, (int)calls[k].algo, r, i, t->out[r][calls[k].off[r] + i],
                                f2u(t->out[r][calls[k].off[r] + i]), want, f2u(want));
                    }
                    (*bad)++;
                }
        }
    /* outside the regions: untouched */
    for (int r = 0; r < R; r++) {
        size_t pos = 0;
        for (int k = 0; k <= ncalls; k++) {
            size_t end = k < ncalls ? calls[k].off[r] : t->buf;
            for (; pos < end; pos++)
                MT(f2u(t->out[r][pos]) == MBT_POISON, "rank %d: float %zu (before call %d's region) was written", r,
                   pos, k);
            if (k < ncalls) pos = calls[k].off[r] + calls[k].n;
        }
    }
    return 0;
}

static size_t mbt_size(k3c_rng *g, size_t cap, size_t small) {
    uint64_t u = k3c_rng_next(g);
    switch (u % 10) {
    case 0: return 1 + (u >> 8) % 8; /* 1 .. 8: fewer floats than ranks and blocks */
    case 1: return cap - (u >> 8) % 2;
    case 2: return 1 + (u >> 8) % 64;
    default: return 1 + (u >> 8) % small;
    }
}

static k3c_mailbox_algo mbt_algo(k3c_rng *g) { return (k3c_mailbox_algo)(k3c_rng_next(g) % 3); }

static const int mbt_ranks[] = {2, 4, 8};

/* ---- the fused calls (comm/mailbox_cuda.h: the pushed one-shot's finish, the all-reduce + rmsnorm) ---- */

/* f32 -> the nearest bf16 value (ties to even, NaN quiet), from the contract (util/bf16.h's rounding). */
static float mbt_bf16(float v) {
    uint32_t u = f2u(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return u2f((u | 0x400000u) & 0xffff0000u);
    return u2f((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

/* The backend rmsnorm's order on the host (cuda/elementwise.cu rmsnorm_kernel, written from its comment):
 * B = min(1024, n rounded up to 32) partials, partial t = fmaf over v[t], v[t + B], ... in index order; each
 * warp's 32 by the xor butterfly (16, 8, 4, 2, 1); the warp sums the same way (0 past the warps); rsqrt as
 * 1 / sqrtf (the emulator's: the GPU's rsqrtf is not IEEE, so on the GPU the backend kernel is the
 * reference instead, run on the host's rounded sums); y = bf16(v * r * w). */
#ifdef K3C_MBT_EMU
static void mbt_butterfly(float *v) {
    for (int o = 16; o > 0; o >>= 1) {
        float nv[32];
        for (int l = 0; l < 32; l++) nv[l] = v[l] + v[l ^ o];
        memcpy(v, nv, sizeof nv);
    }
}
static void mbt_norm_host(const float *v, int n, const float *w, float eps, float *y) {
    int B = n >= 1024 ? 1024 : (n + 31) / 32 * 32, nw = B / 32;
    float part[1024], red[32];
    for (int t = 0; t < B; t++) {
        float ss = 0.0f;
        for (int i = t; i < n; i += B) ss = fmaf(v[i], v[i], ss);
        part[t] = ss;
    }
    for (int k = 0; k < nw; k++) {
        mbt_butterfly(part + 32 * k);
        red[k] = part[32 * k];
    }
    float tot[32];
    for (int l = 0; l < 32; l++) tot[l] = l < nw ? red[l] : 0.0f;
    mbt_butterfly(tot);
    const float r = 1.0f / sqrtf(tot[0] / n + eps);
    for (int i = 0; i < n; i++) y[i] = mbt_bf16(v[i] * r * w[i]);
}
#endif

/* A norm call's inputs: moderate magnitudes (no infinities: the norm of a row with one is NaN), signed zeros
 * and subnormals among them. */
static void mbt_fill_norm(float *x, size_t n, uint64_t seed, int call, int r) {
    k3c_rng g;
    k3c_rng_seed(&g, seed ^ ((uint64_t)call << 24) ^ ((uint64_t)r << 52) ^ 0x6e6dull);
    for (size_t i = 0; i < n; i++) {
        uint64_t u = k3c_rng_next(&g);
        float mag = ldexpf(1.0f, (int)((u >> 4) % 12) - 6);
        x[i] = u % 16 == 0   ? ((u >> 8) & 1 ? -0.0f : 0.0f)
               : u % 16 == 1 ? 1e-40f
                             : (float)((double)(u >> 11) / 9007199254740992.0 - 0.5) * mag;
    }
}

enum { MBT_PLAIN, MBT_PUSHED, MBT_NORM, MBT_ROUND };

/* The fused calls among plain ones, back to back on every rank with no host synchronisation (mbt_batch's
 * pattern): kind[k] MBT_PLAIN (the automatic all-reduce), MBT_PUSHED (the test pushes the rank's input into
 * every peer's slot of the call's parity, the epoch known here from the first and the calls before, by a copy
 * on the rank's stream, then the finish, rounding when round[k]: the pushed one-shot with the copy in place
 * of a product's epilogue; in every call k with k & 4 the last rank makes the plain one-shot instead, which
 * must pair with the others' finishes), MBT_NORM (rows[k] rows of calls[k].n / rows[k] floats, weights
 * w + woff[k]),
 * MBT_ROUND (the one-shot rounding its sums in its own launch).
 * References: the rank-order sum (rounded for a rounding finish); for a norm, the host's rounded sums
 * normed by the host reference (emulator) or by the backend's rmsnorm (GPU). Every rank bitwise; the floats
 * around every call's region untouched. */
static int mbt_fused_batch(mbt *t, const mbt_call *calls, const int *kind, const int *round, const int *rows,
                           const size_t *woff, const float *w, const float *dw, int ncalls, uint32_t first,
                           uint64_t seed, long *bad) {
    const int R = t->R;
    *bad = 0;
    k3c_comm_mailbox_push push[MBT_MAX];
    for (int r = 0; r < R; r++) {
        MT(k3c_comm_mailbox_push_targets(t->c[r], &push[r]) == K3C_OK, "push targets: %s", k3c_error_message());
        MT(push[r].ranks == R && push[r].rank == r && !push[r].slot[r], "rank %d's push targets", r);
        for (size_t i = 0; i < t->buf; i++) t->in[r][i] = u2f(MBT_POISON);
        for (int k = 0; k < ncalls; k++) {
            if (kind[k] == MBT_NORM) mbt_fill_norm(t->in[r] + calls[k].off[r], calls[k].n, seed, k, r);
            else mbt_fill(t->in[r] + calls[k].off[r], calls[k].n, seed, k, r, R, calls[k].zeros);
        }
        MT_CUDA(cudaSetDevice(t->dev[r]));
        MT_CUDA(cudaMemcpyAsync(t->d[r], t->in[r], t->buf * sizeof(float), cudaMemcpyHostToDevice, t->st[r]));
    }
    if (mbt_sync(t)) return -1;
    uint32_t e = first;
    for (int k = 0; k < ncalls; k++, e = e + 1 ? e + 1 : 2)
        for (int r = 0; r < R; r++) {
            float *x = t->d[r] + calls[k].off[r];
            size_t n = calls[k].n;
            int rc;
            if (kind[k] == MBT_PUSHED && r == R - 1 && (k & 4)) {
                /* the last rank makes the plain one-shot of the call instead (rounded where the finish rounds):
                 * the two pair call for call (comm/mailbox.h) */
                rc = round[k] ? k3c_comm_mailbox_all_reduce_round_on(t->c[r], x, n, NULL)
                              : k3c_comm_mailbox_all_reduce(t->c[r], x, n, K3C_MAILBOX_ONE_SHOT);
            } else if (kind[k] == MBT_PUSHED) {
                for (int p = 0; p < R; p++)
                    if (p != r)
                        MT_CUDA(cudaMemcpyAsync(push[r].slot[p] + (e & 1) * push[r].parity_floats, x, n * sizeof(float),
                                                cudaMemcpyDeviceToDevice, t->st[r]));
                rc = k3c_comm_mailbox_finish_on(t->c[r], x, n, round[k], NULL);
            } else if (kind[k] == MBT_ROUND) {
                rc = k3c_comm_mailbox_all_reduce_round_on(t->c[r], x, n, NULL);
            } else if (kind[k] == MBT_NORM) {
                rc = k3c_comm_mailbox_reduce_rmsnorm_on(t->c[r], x, rows[k], (int)(n / rows[k]), dw + woff[k], 1e-5f,
                                                        NULL);
            } else {
                rc = k3c_comm_mailbox_all_reduce(t->c[r], x, n, K3C_MAILBOX_AUTO);
            }
            MT(rc == K3C_OK, "rank %d, call %d (kind %d, %zu floats): %s", r, k, kind[k], n, k3c_error_message());
        }
    for (int r = 0; r < R; r++) {
        MT_CUDA(cudaSetDevice(t->dev[r]));
        MT_CUDA(cudaMemcpyAsync(t->out[r], t->d[r], t->buf * sizeof(float), cudaMemcpyDeviceToHost, t->st[r]));
    }
    if (mbt_sync(t)) return -1;
    for (int r = 0; r < R; r++)
        MT(k3c_comm_mailbox_check(t->c[r]) == K3C_OK, "rank %d: %s", r, k3c_error_message());
    uint32_t e_end = 0;
    MT(k3c_comm_mailbox_epoch(t->c[R - 1], &e_end) == K3C_OK && e_end == e, "epoch after the calls: %u, want %u",
       e_end, e);
    long first_bad = -1;
    for (int k = 0; k < ncalls; k++) {
        size_t n = calls[k].n;
        float *want = malloc(n * sizeof(float));
        MT(want, "out of memory");
        for (size_t i = 0; i < n; i++) {
            float v = t->in[0][calls[k].off[0] + i];
            for (int q = 1; q < R; q++) v += t->in[q][calls[k].off[q] + i];
            int rounded = kind[k] == MBT_NORM || kind[k] == MBT_ROUND || (kind[k] == MBT_PUSHED && round[k]);
            want[i] = rounded ? mbt_bf16(v) : v;
        }
        if (kind[k] == MBT_NORM) {
            int cols = (int)(n / rows[k]);
#ifdef K3C_MBT_EMU
            float *row = malloc((size_t)cols * sizeof(float));
            MT(row, "out of memory");
            for (int j = 0; j < rows[k]; j++) {
                mbt_norm_host(want + (size_t)j * cols, cols, w + woff[k], 1e-5f, row);
                memcpy(want + (size_t)j * cols, row, (size_t)cols * sizeof(float));
            }
            free(row);
            (void)dw;
#else
            (void)w;
            float *dv = NULL;
            MT_CUDA(cudaMalloc((void **)&dv, n * sizeof(float)));
            MT_CUDA(cudaMemcpy(dv, want, n * sizeof(float), cudaMemcpyHostToDevice));
            MT(k3c_cuda_rmsnorm(dv, cols, dw + woff[k], rows[k], cols, 1e-5f, 1, dv, cols, 0) == K3C_OK,
               "reference rmsnorm: %s", k3c_error_message());
            MT_CUDA(cudaMemcpy(want, dv, n * sizeof(float), cudaMemcpyDeviceToHost));
            cudaFree(dv);
#endif
        }
        for (size_t i = 0; i < n; i++)
            for (int r = 0; r < R; r++) {
                float got = t->out[r][calls[k].off[r] + i];
                if (f2u(got) != f2u(want[i]) || got != got) {
                    if (first_bad < 0) {
                        first_bad = k;
                        fprintf(stderr, "    call %d (kind %d, %zu floats, rows %d, round %d) rank %d element %zu: %a "
                                "(0x%08x), want %a (0x%08x)\n", k, kind[k], n, rows[k], round[k], r, i, got, f2u(got),
                                want[i], f2u(want[i]));
                    }
                    (*bad)++;
                }
            }
        free(want);
    }
    for (int r = 0; r < R; r++) {
        size_t pos = 0;
        for (int k = 0; k <= ncalls; k++) {
            size_t end = k < ncalls ? calls[k].off[r] : t->buf;
            for (; pos < end; pos++)
                MT(f2u(t->out[r][pos]) == MBT_POISON, "rank %d: float %zu (before call %d's region) was written", r,
                   pos, k);
            if (k < ncalls) pos = calls[k].off[r] + calls[k].n;
        }
    }
    return 0;
}

/* The fused calls among plain ones (pushed one-shots, all-reduce + rmsnorm, rounded one-shots): sizes and
 * row shapes changing call by call (norm rows from 4 to 2052
 * floats: fewer than a warp, past the norm's 1024 threads, not a multiple of 32), rows fewer and more than
 * the blocks, rounding and not, the parities alternating through every kind, epochs across the wrap (4
 * ranks), +-0 sums; then a rank splitting its norm call's floats into other rows: a mismatch on every rank. */
TEST(gpu_mailbox_fused_calls) {
    static const uint32_t firsts[] = {1, UINT32_MAX - 9, 7};
    const size_t cap = 16384, buf = (size_t)4 << 20;
    for (int s = 0; s < 3; s++) {
        const int R = mbt_ranks[s];
        k3c_rng g;
        k3c_rng_seed(&g, test_seed() ^ 0xf05ed ^ (uint64_t)R);
        int ncalls = mbt_scaled(600);
        mbt_call *calls = calloc((size_t)ncalls, sizeof *calls);
        int *kind = calloc((size_t)ncalls, sizeof *kind), *round = calloc((size_t)ncalls, sizeof *round),
            *rows = calloc((size_t)ncalls, sizeof *rows);
        size_t *woff = calloc((size_t)ncalls, sizeof *woff);
        const size_t wn = 8192;
        float *w = malloc(wn * sizeof *w), *dw = NULL;
        CHECK(calls && kind && round && rows && woff && w);
        for (size_t i = 0; i < wn; i++) w[i] = mbt_bf16(0.5f + (float)(k3c_rng_next(&g) % 1000) / 1000.0f);
        size_t used = 0;
        for (int k = 0; k < ncalls; k++) {
            uint64_t u = k3c_rng_next(&g);
            kind[k] = k < 4 ? k : (int)(u % 4);
            round[k] = (u >> 8) & 1;
            rows[k] = 1;
            calls[k].zeros = k % 5 == 0;
            if (kind[k] == MBT_NORM) {
                static const int widths[] = {4, 28, 32, 36, 508, 1024, 1028, 2048, 2052, 3584};
                int cols = widths[(u >> 12) % 10];
                int most = (int)(cap / (size_t)cols) < 24 ? (int)(cap / (size_t)cols) : 24;
                rows[k] = 1 + (int)((u >> 20) % (uint64_t)most);
                calls[k].n = (size_t)rows[k] * cols;
                woff[k] = (size_t)((u >> 32) % (wn - (size_t)cols + 1));
            } else {
                calls[k].n = mbt_size(&g, cap, 3000);
            }
            if (used + calls[k].n + 16 > buf - 64) kind[k] = MBT_PLAIN, rows[k] = 1, calls[k].n = 1 + k % 7;
            used += calls[k].n + 16;
        }
        mbt t;
        k3c_comm_mailbox_options o = {.cap = cap, .timeout_ms = 5000, .first_epoch = firsts[s]};
        int ok = mbt_open(&t, R, NULL, buf, &o) == 0 && mbt_layout(calls, ncalls, R, buf, &g) == 0;
        if (ok) ok = cudaMalloc((void **)&dw, wn * sizeof *w) == cudaSuccess &&
                     cudaMemcpy(dw, w, wn * sizeof *w, cudaMemcpyHostToDevice) == cudaSuccess;
        long bad = -1;
        if (ok) ok = mbt_fused_batch(&t, calls, kind, round, rows, woff, w, dw, ncalls, firsts[s],
                                     test_seed() ^ 0xf5 ^ (uint64_t)R, &bad) == 0;
        int counts[4] = {0, 0, 0, 0};
        for (int k = 0; k < ncalls; k++) counts[kind[k]]++;
        printf("  [%d ranks: %d calls (%d plain, %d pushed one-shots, %d all-reduce + rmsnorm, %d rounded one-shots) "
               "from epoch %u, %ld results differ]\n", R, ncalls, counts[0], counts[1], counts[2], counts[3], firsts[s],
               bad);
        /* a mismatch: rank 0 splits 256 floats into 2 rows, the others into 4 */
        int refused = 0;
        if (ok && R == 2) {
            for (int r = 0; r < R; r++)
                if (k3c_comm_mailbox_reduce_rmsnorm_on(t.c[r], t.d[r], r == 0 ? 2 : 4, r == 0 ? 128 : 64, dw, 1e-5f,
                                                       NULL) != K3C_OK)
                    ok = 0;
            mbt_sync(&t);
            for (int r = 0; r < R; r++) {
                int rc = k3c_comm_mailbox_check(t.c[r]);
                if (rc != K3C_OK && strstr(k3c_error_message(), "rmsnorm")) refused++;
                else printf("  rank %d: %s\n", r, rc == K3C_OK ? "no error" : k3c_error_message());
            }
        }
        if (dw) cudaFree(dw);
        mbt_close(&t);
        free(calls), free(kind), free(round), free(rows), free(woff), free(w);
        CHECK(ok);
        CHECK(bad == 0);
        if (R == 2) CHECKF(refused == R, "%d of %d ranks reported the mismatched rows", refused, R);
    }
}

#ifndef K3C_MBT_EMU
/* The pushed one-shot with a real product as the push: cuda/gemm.h's fanout GEMV writes each rank's
 * unrounded outputs into every peer's slot (the parity from the device's epoch), the finish sums and rounds.
 * Per call its own shape (rows 64 .. 2048: the T = 1 kernel token by token below 256 rows, the tensor-core
 * kernel from there; T 1 .. 8; bf16-exact and inexact activations), plain all-reduces between the products
 * (the parities and epochs move on, across the wrap at 4 ranks); then one product + finish captured per rank
 * and replayed with fresh activations each time (the parity read in the kernel, replay after replay).
 * Reference: each rank's product by the unfused launcher (k3c_cuda_matmul_bf16_round, round 0), summed in
 * rank order here and rounded; every rank bitwise. */
typedef struct mbt_gemv {
    int rows, cols, T;
    size_t xoff, yoff; /* floats into each rank's activations and outputs */
} mbt_gemv;

static int mbt_gemv_rank_ref(const uint16_t *dW, const mbt_gemv *q, const float *dx, float *dref, float *href) {
    MT(k3c_cuda_matmul_bf16_round(NULL, dW, q->rows, q->cols, dx + q->xoff, q->T, dref, 0, 0) == K3C_OK,
       "reference product: %s", k3c_error_message());
    MT_CUDA(cudaMemcpy(href, dref, (size_t)q->T * q->rows * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

static uint32_t mbt_epoch_after(uint32_t first, int calls);

static long mbt_gemv_compare(mbt *t, float *const *ref, const mbt_gemv *q, int call) {
    long bad = 0;
    size_t n = (size_t)q->T * q->rows;
    for (size_t i = 0; i < n; i++) {
        float want = ref[0][i];
        for (int p = 1; p < t->R; p++) want += ref[p][i];
        want = mbt_bf16(want);
        for (int r = 0; r < t->R; r++) {
            float got = t->out[r][q->yoff + i];
            if (f2u(got) != f2u(want) || got != got) {
                if (!bad)
                    fprintf(stderr, "    product %d (%d x %d, T %d) rank %d output %zu: %a, want %a\n", call, q->rows,
                            q->cols, q->T, r, i, got, want);
                bad++;
            }
        }
    }
    return bad;
}

TEST(gpu_mailbox_gemv_push) {
    static const int rows_l[] = {64, 300, 1024, 2048}, cols_l[] = {256, 1032};
    const int maxc = 1032, maxr = 2048;
    const size_t cap = 16384;
    for (int s = 0; s < 3; s++) {
        const int R = mbt_ranks[s];
        k3c_rng g;
        k3c_rng_seed(&g, test_seed() ^ 0x6e3f ^ (uint64_t)R);
        const int ncalls = mbt_scaled(120), nrep = mbt_scaled(24);
        mbt_gemv *q = calloc((size_t)ncalls, sizeof *q);
        int *plain_n = calloc((size_t)ncalls, sizeof *plain_n);
        CHECK(q && plain_n);
        size_t xoff = 0, yoff = 0;
        for (int k = 0; k < ncalls; k++) {
            uint64_t u = k3c_rng_next(&g);
            q[k].rows = rows_l[u % 4];
            q[k].cols = cols_l[(u >> 4) % 2];
            q[k].T = 1 + (int)((u >> 8) % 8);
            q[k].xoff = xoff;
            xoff += (size_t)q[k].T * q[k].cols;
            q[k].yoff = yoff;
            yoff += (size_t)q[k].T * q[k].rows + (u >> 12) % 4; /* some outputs off 16-byte alignment */
            plain_n[k] = (u >> 16) % 3 ? 0 : 1 + (int)((u >> 20) % 3000);
        }
        size_t plain_at = yoff + 64, buf = plain_at + 4096 + 64;
        mbt t;
        k3c_comm_mailbox_options o = {.cap = cap, .timeout_ms = 5000, .first_epoch = R == 4 ? UINT32_MAX - 5 : 1};
        int ok = mbt_open(&t, R, NULL, buf, &o) == 0;
        uint16_t *dW[MBT_MAX] = {0};
        float *dx[MBT_MAX] = {0}, *hx = malloc(xoff * sizeof(float)), *ref[MBT_MAX] = {0}, *dref = NULL;
        uint16_t *hW = malloc((size_t)maxr * maxc * 2);
        k3c_comm_mailbox_push push[MBT_MAX];
        k3c_cuda_fanout fo[MBT_MAX];
        memset(fo, 0, sizeof fo);
        ok = ok && hx && hW && cudaMalloc((void **)&dref, (size_t)8 * maxr * sizeof(float)) == cudaSuccess;
        for (int r = 0; r < R && ok; r++) {
            for (size_t i = 0; i < (size_t)maxr * maxc; i++) hW[i] = f32_to_bf16((float)k3c_rng_normal(&g) * 0.05f);
            for (int k = 0; k < ncalls; k++) { /* every third product's activations bf16 values */
                float *xk = hx + q[k].xoff;
                for (int i = 0; i < q[k].T * q[k].cols; i++) {
                    float v = (float)k3c_rng_normal(&g);
                    xk[i] = k % 3 == 0 ? bf16_round(v) : v;
                    if (i % 17 == 0) xk[i] = -0.0f;
                }
            }
            dW[r] = dev_upload(hW, (size_t)maxr * maxc * 2);
            dx[r] = dev_upload(hx, xoff * sizeof(float));
            ref[r] = malloc(yoff * sizeof(float));
            ok = dW[r] && dx[r] && ref[r] && k3c_comm_mailbox_push_targets(t.c[r], &push[r]) == K3C_OK;
            if (!ok) break;
            fo[r].parity_floats = push[r].parity_floats;
            fo[r].parity_word = push[r].epoch;
            fo[r].skip = push[r].failed;
            for (int p = 0; p < R; p++)
                if (push[r].slot[p]) fo[r].dst[fo[r].n++] = push[r].slot[p];
            for (int k = 0; k < ncalls && ok; k++)
                ok = mbt_gemv_rank_ref(dW[r], &q[k], dx[r], dref, ref[r] + q[k].yoff) == 0;
            for (size_t i = 0; i < buf; i++) t.in[r][i] = u2f(MBT_POISON);
            for (int k = 0; k < ncalls; k++)
                if (plain_n[k]) mbt_fill(t.in[r] + plain_at, (size_t)plain_n[k], test_seed(), k, r, R, k % 2);
            ok = ok && cudaMemcpy(t.d[r], t.in[r], buf * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
        }
        /* the products back to back on every rank, a plain all-reduce after some (on its own region, refilled
         * per call: checked at once) */
        long bad = 0;
        for (int k = 0; k < ncalls && ok; k++) {
            for (int r = 0; r < R && ok; r++) {
                float *y = t.d[r] + q[k].yoff;
                ok = k3c_cuda_fanout_ok(dW[r], q[k].rows, q[k].cols, dx[r] + q[k].xoff, q[k].T) &&
                     k3c_cuda_matmul_bf16_fanout(dW[r], q[k].rows, q[k].cols, dx[r] + q[k].xoff, q[k].T, y, &fo[r],
                                                 t.st[r]) == K3C_OK &&
                     k3c_comm_mailbox_finish_on(t.c[r], y, (size_t)q[k].T * q[k].rows, 1, NULL) == K3C_OK;
                if (ok && plain_n[k]) {
                    mbt_fill(t.in[r] + plain_at, (size_t)plain_n[k], test_seed(), k, r, R, k % 2);
                    ok = cudaMemcpyAsync(t.d[r] + plain_at, t.in[r] + plain_at, (size_t)plain_n[k] * sizeof(float),
                                         cudaMemcpyHostToDevice, t.st[r]) == cudaSuccess &&
                         k3c_comm_mailbox_all_reduce(t.c[r], t.d[r] + plain_at, (size_t)plain_n[k], K3C_MAILBOX_AUTO) ==
                             K3C_OK;
                }
            }
            if (ok && plain_n[k]) { /* the pinned inputs are refilled by the next call: check this one now */
                ok = mbt_sync(&t) == 0;
                for (int r = 0; r < R && ok; r++)
                    ok = cudaMemcpy(t.out[r] + plain_at, t.d[r] + plain_at, (size_t)plain_n[k] * sizeof(float),
                                    cudaMemcpyDeviceToHost) == cudaSuccess;
                for (int i = 0; i < plain_n[k] && ok; i++) {
                    float want = t.in[0][plain_at + i];
                    for (int p = 1; p < R; p++) want += t.in[p][plain_at + i];
                    for (int r = 0; r < R; r++) bad += f2u(t.out[r][plain_at + i]) != f2u(want);
                }
            }
        }
        if (ok) ok = mbt_sync(&t) == 0;
        for (int r = 0; r < R && ok; r++)
            ok = k3c_comm_mailbox_check(t.c[r]) == K3C_OK &&
                 cudaMemcpy(t.out[r], t.d[r], buf * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess;
        for (int k = 0; k < ncalls && ok; k++) {
            float *rr[MBT_MAX];
            for (int r = 0; r < R; r++) rr[r] = ref[r] + q[k].yoff;
            bad += mbt_gemv_compare(&t, rr, &q[k], k);
        }
        /* around the outputs: untouched */
        for (int r = 0; r < R && ok; r++) {
            size_t pos = 0;
            for (int k = 0; k <= ncalls; k++) {
                size_t end = k < ncalls ? q[k].yoff : plain_at;
                for (; pos < end; pos++) bad += f2u(t.out[r][pos]) != MBT_POISON;
                if (k < ncalls) pos = q[k].yoff + (size_t)q[k].T * q[k].rows;
            }
        }
        /* a captured product + finish per rank (call 0's shape), replayed with fresh activations */
        cudaGraphExec_t ge[MBT_MAX] = {0};
        long rep_bad = 0;
        for (int r = 0; r < R && ok; r++) {
            cudaGraph_t gr = NULL;
            float *y = t.d[r] + q[0].yoff;
            ok = cudaStreamBeginCapture(t.st[r], cudaStreamCaptureModeThreadLocal) == cudaSuccess;
            int rc = ok ? k3c_cuda_matmul_bf16_fanout(dW[r], q[0].rows, q[0].cols, dx[r] + q[0].xoff, q[0].T, y, &fo[r],
                                                      t.st[r])
                        : K3C_ERR;
            if (rc == K3C_OK) rc = k3c_comm_mailbox_finish_on(t.c[r], y, (size_t)q[0].T * q[0].rows, 1, NULL);
            ok = cudaStreamEndCapture(t.st[r], &gr) == cudaSuccess && rc == K3C_OK &&
                 cudaGraphInstantiate(&ge[r], gr, 0) == cudaSuccess;
            if (gr) cudaGraphDestroy(gr);
        }
        size_t xn = (size_t)q[0].T * q[0].cols;
        for (int rep = 0; rep < nrep && ok; rep++) {
            for (int r = 0; r < R && ok; r++) {
                for (size_t i = 0; i < xn; i++) hx[i] = (float)k3c_rng_normal(&g);
                ok = cudaMemcpy(dx[r] + q[0].xoff, hx, xn * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess &&
                     mbt_gemv_rank_ref(dW[r], &q[0], dx[r], dref, ref[r]) == 0;
            }
            for (int r = 0; r < R && ok; r++) ok = cudaGraphLaunch(ge[r], t.st[r]) == cudaSuccess;
            if (ok) ok = mbt_sync(&t) == 0;
            for (int r = 0; r < R && ok; r++)
                ok = cudaMemcpy(t.out[r] + q[0].yoff, t.d[r] + q[0].yoff, (size_t)q[0].T * q[0].rows * sizeof(float),
                                cudaMemcpyDeviceToHost) == cudaSuccess;
            if (ok) rep_bad += mbt_gemv_compare(&t, ref, &q[0], -1 - rep);
        }
        uint32_t e_end = 0;
        int calls_made = 0;
        for (int k = 0; k < ncalls; k++) calls_made += 1 + (plain_n[k] != 0);
        if (ok) ok = k3c_comm_mailbox_epoch(t.c[0], &e_end) == K3C_OK;
        uint32_t want_e = mbt_epoch_after(o.first_epoch, calls_made + nrep);
        printf("  [%d ranks: %d pushed products + finishes (%d plain all-reduces between), %d graph replays; epochs "
               "%u .. %u; %ld + %ld results differ]\n", R, ncalls, calls_made - ncalls, nrep, o.first_epoch, e_end, bad,
               rep_bad);
        if (!ok) printf("  failed: %s\n", k3c_error_message());
        for (int r = 0; r < R; r++) {
            if (ge[r]) cudaGraphExecDestroy(ge[r]);
            cudaFree(dW[r]), cudaFree(dx[r]), free(ref[r]);
        }
        cudaFree(dref);
        mbt_close(&t);
        free(q), free(plain_n), free(hx), free(hW);
        CHECK(ok);
        CHECK(bad == 0 && rep_bad == 0);
        CHECK(e_end == want_e);
    }
}
#endif

/* Sizes from 1 float to the capacity, changing every call; both algorithms and the automatic choice. */
TEST(gpu_mailbox_sizes_bitwise) {
    const size_t cap = (size_t)1 << 18, buf = (size_t)3 << 20;
    for (int s = 0; s < 3; s++) {
        const int R = mbt_ranks[s];
        k3c_rng g;
        k3c_rng_seed(&g, test_seed() ^ 0x512e5 ^ (uint64_t)R);
        int ncalls = mbt_scaled(120);
        mbt_call *calls = calloc((size_t)ncalls, sizeof *calls);
        CHECK(calls);
        size_t used = 0;
        int k = 0;
        for (; k < ncalls; k++) {
            calls[k].n = k == 0 ? 1 : k == 1 ? cap : mbt_size(&g, cap, 4096);
            if (used + calls[k].n + 16 > buf - 64) calls[k].n = 1 + k % 7;
            used += calls[k].n + 16;
            calls[k].algo = mbt_algo(&g);
            calls[k].zeros = k % 5 == 0;
        }
        mbt t;
        k3c_comm_mailbox_options o = {.cap = cap, .timeout_ms = 5000};
        int ok = mbt_open(&t, R, NULL, buf, &o) == 0 && mbt_layout(calls, ncalls, R, buf, &g) == 0;
        long bad = -1;
        if (ok) ok = mbt_batch(&t, calls, ncalls, test_seed() ^ (uint64_t)R, &bad) == 0;
        k3c_comm_mailbox_info info = {0};
        if (ok) k3c_comm_mailbox_get_info(t.c[0], &info);
        printf("  [%d ranks, %d blocks each: %d calls of 1 .. %zu floats, %ld results differ from the rank-order sum]\n",
               R, info.blocks, ncalls, cap, bad);
        mbt_close(&t);
        free(calls);
        CHECK(ok);
        CHECK(bad == 0);
    }
}

/* Thousands of calls in a row, decode-sized (1 .. 2048 floats, now and then 7168 and 14336 bytes' worth),
 * launched back to back with no host synchronisation: every parity of every slot reused hundreds of times
 * while peers run ahead by a call. */
TEST(gpu_mailbox_many_calls) {
    for (int s = 0; s < 3; s++) {
        const int R = mbt_ranks[s];
        const size_t cap = 8192, buf = (size_t)4 << 20;
        k3c_rng g;
        k3c_rng_seed(&g, test_seed() ^ 0x3a77 ^ (uint64_t)R);
        int ncalls = mbt_scaled(3000);
        mbt_call *calls = calloc((size_t)ncalls, sizeof *calls);
        CHECK(calls);
        for (int k = 0; k < ncalls; k++) {
            uint64_t u = k3c_rng_next(&g);
            calls[k].n = u % 16 == 0 ? 1792 : u % 16 == 1 ? 3584 : u % 16 == 2 ? cap : mbt_size(&g, 2048, 512);
            calls[k].algo = mbt_algo(&g);
            calls[k].zeros = k % 7 == 0;
        }
        mbt t;
        k3c_comm_mailbox_options o = {.cap = cap, .timeout_ms = 5000};
        int ok = mbt_open(&t, R, NULL, buf, &o) == 0 && mbt_layout(calls, ncalls, R, buf, &g) == 0;
        long bad = -1;
        double t0 = mbt_now();
        if (ok) ok = mbt_batch(&t, calls, ncalls, test_seed() ^ 0x77 ^ (uint64_t)R, &bad) == 0;
        uint32_t epoch = 0;
        if (ok) ok = k3c_comm_mailbox_epoch(t.c[R - 1], &epoch) == K3C_OK;
        printf("  [%d ranks: %d calls in a row in %.2f s (with the checks), %ld results differ; next epoch %u]\n", R,
               ncalls, mbt_now() - t0, bad, epoch);
        mbt_close(&t);
        free(calls);
        CHECK(ok);
        CHECK(bad == 0);
        CHECK(epoch == (uint32_t)ncalls + 1);
    }
}

/* The epoch the host model reaches after `calls` calls from first (0 skipped at the wrap). */
static uint32_t mbt_epoch_after(uint32_t first, int calls) {
    uint32_t e = first;
    for (int k = 0; k < calls; k++) e = e + 1 ? e + 1 : 2;
    return e;
}

/* Epochs started just before 2^32: the calls cross the wrap (0 skipped, the parity alternating on). */
TEST(gpu_mailbox_epoch_wrap) {
    static const uint32_t firsts[] = {UINT32_MAX - 6, UINT32_MAX - 5, UINT32_MAX};
    for (int s = 0; s < 3; s++) {
        const int R = mbt_ranks[s];
        const uint32_t first = firsts[s];
        k3c_rng g;
        k3c_rng_seed(&g, test_seed() ^ 0x3a9 ^ (uint64_t)R);
        mbt_call calls[40];
        memset(calls, 0, sizeof calls);
        for (int k = 0; k < 40; k++) {
            calls[k].n = mbt_size(&g, 4096, 1000);
            calls[k].algo = mbt_algo(&g);
            calls[k].zeros = k % 4 == 0;
        }
        mbt t;
        k3c_comm_mailbox_options o = {.cap = 4096, .timeout_ms = 5000, .first_epoch = first};
        int ok = mbt_open(&t, R, NULL, (size_t)1 << 20, &o) == 0 && mbt_layout(calls, 40, R, (size_t)1 << 20, &g) == 0;
        uint32_t e0 = 0, e1 = 0;
        if (ok) ok = k3c_comm_mailbox_epoch(t.c[0], &e0) == K3C_OK;
        long bad = -1;
        if (ok) ok = mbt_batch(&t, calls, 40, test_seed() ^ 0xe9 ^ (uint64_t)R, &bad) == 0;
        if (ok) ok = k3c_comm_mailbox_epoch(t.c[0], &e1) == K3C_OK;
        printf("  [%d ranks: epochs %u .. %u over 40 calls, %ld results differ]\n", R, e0, e1, bad);
        mbt_close(&t);
        CHECK(ok);
        CHECK(bad == 0);
        CHECK(e0 == first);
        CHECK(e1 == mbt_epoch_after(first, 40));
    }
}

/* A sequence of calls captured once per rank (its own stream, its own graph), replayed many times with fresh
 * inputs each time, eager calls between replays: the epochs advance in the kernels, replay after replay. */
TEST(gpu_mailbox_graph_replay) {
    enum { SEQ = 12 };
    for (int s = 0; s < 3; s++) {
        const int R = mbt_ranks[s];
        const size_t cap = (size_t)1 << 16, buf = (size_t)1 << 20;
        k3c_rng g;
        k3c_rng_seed(&g, test_seed() ^ 0x9a4 ^ (uint64_t)R);
        mbt_call calls[SEQ];
        memset(calls, 0, sizeof calls);
        for (int k = 0; k < SEQ; k++) {
            calls[k].n = k == 0 ? cap : mbt_size(&g, cap, 5000);
            calls[k].algo = (k3c_mailbox_algo)(k % 3);
            calls[k].zeros = k == 1;
        }
        mbt t;
        k3c_comm_mailbox_options o = {.cap = cap, .timeout_ms = 5000};
        if (mbt_open(&t, R, NULL, buf, &o) != 0 || mbt_layout(calls, SEQ, R, buf, &g) != 0) {
            mbt_close(&t);
            CHECK(0);
        }
        cudaGraphExec_t ge[MBT_MAX] = {0};
        cudaGraph_t gr[MBT_MAX] = {0};
        int ok = 1, replays = mbt_scaled(300), eager = 0;
        for (int r = 0; r < R && ok; r++) {
            ok = cudaStreamBeginCapture(t.st[r], cudaStreamCaptureModeThreadLocal) == cudaSuccess;
            for (int k = 0; k < SEQ && ok; k++)
                ok = k3c_comm_mailbox_all_reduce(t.c[r], t.d[r] + calls[k].off[r], calls[k].n, calls[k].algo) ==
                     K3C_OK;
            ok = cudaStreamEndCapture(t.st[r], &gr[r]) == cudaSuccess && ok;
            ok = ok && cudaGraphInstantiate(&ge[r], gr[r], 0) == cudaSuccess;
        }
        long bad = 0;
        for (int rep = 0; rep < replays && ok; rep++) {
            uint64_t seed = test_seed() ^ ((uint64_t)rep << 8) ^ (uint64_t)R;
            for (int r = 0; r < R && ok; r++) {
                for (size_t i = 0; i < buf; i++) t.in[r][i] = u2f(MBT_POISON);
                for (int k = 0; k < SEQ; k++) mbt_fill(t.in[r] + calls[k].off[r], calls[k].n, seed, k, r, R, calls[k].zeros);
                ok = cudaMemcpyAsync(t.d[r], t.in[r], buf * sizeof(float), cudaMemcpyHostToDevice, t.st[r]) == cudaSuccess;
            }
            for (int r = 0; r < R && ok; r++) ok = cudaGraphLaunch(ge[r], t.st[r]) == cudaSuccess;
            if (ok && rep % 50 == 25) { /* an eager call between replays, on a region of its own */
                for (int r = 0; r < R && ok; r++)
                    ok = k3c_comm_mailbox_all_reduce(t.c[r], t.d[r] + buf - 1000, 999, K3C_MAILBOX_AUTO) == K3C_OK;
                eager++;
            }
            for (int r = 0; r < R && ok; r++)
                ok = cudaMemcpyAsync(t.out[r], t.d[r], buf * sizeof(float), cudaMemcpyDeviceToHost, t.st[r]) == cudaSuccess;
            ok = ok && mbt_sync(&t) == 0;
            for (int r = 0; r < R && ok; r++) ok = k3c_comm_mailbox_check(t.c[r]) == K3C_OK;
            for (int k = 0; k < SEQ && ok; k++)
                for (size_t i = 0; i < calls[k].n; i++) {
                    float want = t.in[0][calls[k].off[0] + i];
                    for (int q = 1; q < R; q++) want += t.in[q][calls[k].off[q] + i];
                    for (int r = 0; r < R; r++) bad += f2u(t.out[r][calls[k].off[r] + i]) != f2u(want);
                }
        }
        if (!ok) fprintf(stderr, "    %d ranks: %s\n", R, k3c_error_message());
        uint32_t epoch = 0;
        if (ok) ok = k3c_comm_mailbox_epoch(t.c[0], &epoch) == K3C_OK;
        printf("  [%d ranks: %d calls captured, %d replays, %d eager calls between them: %ld results differ, next "
               "epoch %u]\n", R, SEQ, replays, eager, bad, epoch);
        for (int r = 0; r < R; r++) {
            if (ge[r]) cudaGraphExecDestroy(ge[r]);
            if (gr[r]) cudaGraphDestroy(gr[r]);
        }
        mbt_close(&t);
        CHECK(ok);
        CHECK(bad == 0);
        CHECK(epoch == (uint32_t)(replays * SEQ + eager) + 1);
    }
}

/* The executor's use (decode/executor_cuda.h at TP): every rank's calls captured on a second stream of its
 * own (k3c_comm_mailbox_all_reduce_on / _all_gather_on), the graph replayed many times, and calls on the
 * rank's own stream between replays (never both streams in flight, as the executor and the stock forward
 * take turns): the sums bitwise the rank-order sums, the gathers every rank's bytes, the epochs advancing
 * over both streams' calls. */
TEST(gpu_mailbox_graph_other_stream) {
    enum { SEQ = 8, GATHER = 777 }; /* floats each rank gathers, after the sums */
    for (int s = 0; s < 2; s++) {
        const int R = mbt_ranks[s];
        const size_t cap = (size_t)1 << 15, buf = (size_t)1 << 19;
        k3c_rng g;
        k3c_rng_seed(&g, test_seed() ^ 0x0257 ^ (uint64_t)R);
        mbt_call calls[SEQ];
        memset(calls, 0, sizeof calls);
        for (int k = 0; k < SEQ; k++) {
            calls[k].n = k == 0 ? cap : mbt_size(&g, cap, 3000);
            calls[k].algo = K3C_MAILBOX_AUTO;
            calls[k].zeros = k == 1;
        }
        mbt t;
        k3c_comm_mailbox_options o = {.cap = cap, .timeout_ms = 5000, .two_shot_bytes = 16 << 10};
        /* the sums in the buffer's first half, the gather's source and destination in the second */
        size_t gsrc = buf / 2, gdst = gsrc + GATHER + 64;
        if (mbt_open(&t, R, NULL, buf, &o) != 0 || mbt_layout(calls, SEQ, R, buf / 2, &g) != 0) {
            mbt_close(&t);
            CHECK(0);
            continue;
        }
        cudaStream_t st2[MBT_MAX] = {0};
        cudaGraphExec_t ge[MBT_MAX] = {0};
        cudaGraph_t gr[MBT_MAX] = {0};
        int ok = 1, replays = mbt_scaled(200), eager = 0;
        for (int r = 0; r < R && ok; r++) {
            ok = cudaStreamCreateWithFlags(&st2[r], cudaStreamNonBlocking) == cudaSuccess &&
                 cudaStreamBeginCapture(st2[r], cudaStreamCaptureModeThreadLocal) == cudaSuccess;
            for (int k = 0; k < SEQ && ok; k++)
                ok = k3c_comm_mailbox_all_reduce_on(t.c[r], t.d[r] + calls[k].off[r], calls[k].n, st2[r]) == K3C_OK;
            ok = ok && k3c_comm_mailbox_all_gather_on(t.c[r], t.d[r] + gsrc, t.d[r] + gdst, GATHER * sizeof(float),
                                                      st2[r]) == K3C_OK;
            ok = cudaStreamEndCapture(st2[r], &gr[r]) == cudaSuccess && ok;
            ok = ok && cudaGraphInstantiate(&ge[r], gr[r], 0) == cudaSuccess;
        }
        long bad = 0, gbad = 0;
        for (int rep = 0; rep < replays && ok; rep++) {
            uint64_t seed = test_seed() ^ ((uint64_t)rep << 8) ^ (uint64_t)R ^ 0x57;
            for (int r = 0; r < R && ok; r++) {
                for (size_t i = 0; i < buf; i++) t.in[r][i] = u2f(MBT_POISON);
                for (int k = 0; k < SEQ; k++) mbt_fill(t.in[r] + calls[k].off[r], calls[k].n, seed, k, r, R, calls[k].zeros);
                mbt_fill(t.in[r] + gsrc, GATHER, seed, SEQ, r, R, 0);
                ok = cudaMemcpyAsync(t.d[r], t.in[r], buf * sizeof(float), cudaMemcpyHostToDevice, st2[r]) == cudaSuccess &&
                     cudaGraphLaunch(ge[r], st2[r]) == cudaSuccess &&
                     cudaMemcpyAsync(t.out[r], t.d[r], buf * sizeof(float), cudaMemcpyDeviceToHost, st2[r]) == cudaSuccess;
            }
            for (int r = 0; r < R && ok; r++) ok = cudaStreamSynchronize(st2[r]) == cudaSuccess;
            if (ok && rep % 7 == 3) { /* a call on the ranks' own streams, on a region the graph does not read */
                for (int r = 0; r < R && ok; r++)
                    ok = k3c_comm_mailbox_all_reduce(t.c[r], t.d[r] + buf - 1000, 999, K3C_MAILBOX_AUTO) == K3C_OK;
                ok = ok && mbt_sync(&t) == 0;
                eager++;
            }
            for (int r = 0; r < R && ok; r++) ok = k3c_comm_mailbox_check(t.c[r]) == K3C_OK;
            for (int k = 0; k < SEQ && ok; k++)
                for (size_t i = 0; i < calls[k].n; i++) {
                    float want = t.in[0][calls[k].off[0] + i];
                    for (int q = 1; q < R; q++) want += t.in[q][calls[k].off[q] + i];
                    for (int r = 0; r < R; r++) bad += f2u(t.out[r][calls[k].off[r] + i]) != f2u(want);
                }
            for (int r = 0; r < R && ok; r++)
                for (int q = 0; q < R; q++)
                    gbad += memcmp(t.out[r] + gdst + (size_t)q * GATHER, t.in[q] + gsrc, GATHER * sizeof(float)) != 0;
        }
        if (!ok) fprintf(stderr, "    %d ranks: %s\n", R, k3c_error_message());
        uint32_t epoch = 0;
        if (ok) ok = k3c_comm_mailbox_epoch(t.c[0], &epoch) == K3C_OK;
        printf("  [%d ranks: %d sums and a gather captured on a second stream, %d replays, %d calls on the own stream "
               "between them: %ld sums and %ld gathers differ, next epoch %u]\n", R, SEQ, replays, eager, bad, gbad,
               epoch);
        for (int r = 0; r < R; r++) {
            if (ge[r]) cudaGraphExecDestroy(ge[r]);
            if (gr[r]) cudaGraphDestroy(gr[r]);
            if (st2[r]) cudaStreamDestroy(st2[r]);
        }
        mbt_close(&t);
        CHECK(ok);
        CHECK(bad == 0 && gbad == 0);
        CHECK(epoch == (uint32_t)(replays * (SEQ + 1) + eager) + 1);
    }
}

/* Rank R - 1 never calls: the others fail within the timeout (the first to time out tells the rest), name the
 * missing rank, and refuse their later calls at once; nothing hangs. */
TEST(gpu_mailbox_missing_rank) {
    for (int s = 0; s < 3; s++)
        for (int algo = K3C_MAILBOX_ONE_SHOT; algo <= K3C_MAILBOX_TWO_SHOT; algo++) {
            const int R = mbt_ranks[s], timeout_ms = 300;
            mbt t;
            k3c_comm_mailbox_options o = {.cap = 4096, .timeout_ms = timeout_ms};
            if (mbt_open(&t, R, NULL, 8192, &o) != 0) {
                mbt_close(&t);
                CHECK(0);
            }
            double t0 = mbt_now();
            int ok = 1;
            for (int r = 0; r < R - 1; r++)
                ok = ok && k3c_comm_mailbox_all_reduce(t.c[r], t.d[r], 3000, (k3c_mailbox_algo)algo) == K3C_OK;
            ok = ok && mbt_sync(&t) == 0;
            double secs = mbt_now() - t0;
            int failed = 0, named = 0;
            char msg[512] = "";
            for (int r = 0; r < R - 1; r++)
                if (k3c_comm_mailbox_check(t.c[r]) != K3C_OK) {
                    failed++;
                    char want[32];
                    snprintf(want, sizeof want, "for rank %d", R - 1);
                    if (strstr(k3c_error_message(), want)) named++, snprintf(msg, sizeof msg, "%s", k3c_error_message());
                }
            /* a later call fails at once, on the host; so does the barrier */
            int later = k3c_comm_mailbox_all_reduce(t.c[0], t.d[0], 10, K3C_MAILBOX_ONE_SHOT) != K3C_OK;
            int barrier = t.c[0]->barrier(t.c[0]) != K3C_OK;
            printf("  [%d ranks, algo %d, rank %d never calls: %d of %d failed in %.3f s, %d naming it: %s]\n", R, algo,
                   R - 1, failed, R - 1, secs, named, msg);
            mbt_close(&t);
            CHECK(ok);
            CHECK(failed == R - 1);
            CHECK(named >= 1);
            CHECK(later && barrier);
            CHECK(secs < timeout_ms / 1000.0 + 3.0);
        }
}

/* A rank making another call than its peers (one float more; the two-shot against the one-shot; a gather
 * against an all-reduce): every rank fails, at once (not at the timeout), naming the mismatch. */
TEST(gpu_mailbox_mismatch) {
    for (int s = 0; s < 3; s++)
        for (int kind = 0; kind < 3; kind++) {
            const int R = mbt_ranks[s], timeout_ms = 20000;
            mbt t;
            k3c_comm_mailbox_options o = {.cap = 4096, .timeout_ms = timeout_ms};
            if (mbt_open(&t, R, NULL, 8192, &o) != 0) {
                mbt_close(&t);
                CHECK(0);
            }
            double t0 = mbt_now();
            int ok = 1;
            for (int r = 0; r < R; r++) {
                int odd = r == 1;
                if (kind == 0)
                    ok = ok && k3c_comm_mailbox_all_reduce(t.c[r], t.d[r], 1000 + odd, K3C_MAILBOX_ONE_SHOT) == K3C_OK;
                else if (kind == 1)
                    ok = ok && k3c_comm_mailbox_all_reduce(t.c[r], t.d[r], 1000,
                                                           odd ? K3C_MAILBOX_TWO_SHOT : K3C_MAILBOX_ONE_SHOT) == K3C_OK;
                else if (odd)
                    ok = ok && t.c[r]->all_gather(t.c[r], t.d[r], t.d[r] + 4096, 1000) == K3C_OK;
                else
                    ok = ok && k3c_comm_mailbox_all_reduce(t.c[r], t.d[r], 250, K3C_MAILBOX_ONE_SHOT) == K3C_OK;
            }
            ok = ok && mbt_sync(&t) == 0;
            double secs = mbt_now() - t0;
            int failed = 0, named = 0;
            char msg[512] = "";
            for (int r = 0; r < R; r++)
                if (k3c_comm_mailbox_check(t.c[r]) != K3C_OK) {
                    failed++;
                    if (strstr(k3c_error_message(), "made")) named++, snprintf(msg, sizeof msg, "%s", k3c_error_message());
                }
            printf("  [%d ranks, mismatch %d: %d of %d failed in %.3f s: %s]\n", R, kind, failed, R, secs, msg);
            mbt_close(&t);
            CHECK(ok);
            CHECK(failed == R);
            CHECK(named >= 1);
            CHECK(secs < 5.0);
        }
}

/* What the host refuses before launching: a call past the capacity (the group is aborted: the peers fail
 * instead of waiting), a blocking stream, the legacy stream, 1 or 9 ranks. */
TEST(gpu_mailbox_refusals) {
    mbt t;
    k3c_comm_mailbox_options o = {.cap = 1000, .timeout_ms = 20000};
    if (mbt_open(&t, 4, NULL, 4096, &o) != 0) {
        mbt_close(&t);
        CHECK(0);
    }
    double t0 = mbt_now();
    int over = k3c_comm_mailbox_all_reduce(t.c[2], t.d[2], 1001, K3C_MAILBOX_AUTO) != K3C_OK;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", k3c_error_message());
    int ok = 1;
    for (int r = 0; r < 4; r++)
        if (r != 2) ok = ok && k3c_comm_mailbox_all_reduce(t.c[r], t.d[r], 1000, K3C_MAILBOX_AUTO) == K3C_OK;
    ok = ok && mbt_sync(&t) == 0;
    int failed = 0;
    for (int r = 0; r < 4; r++) failed += k3c_comm_mailbox_check(t.c[r]) != K3C_OK;
    double secs = mbt_now() - t0;
    printf("  [a call past the capacity: %s; then %d of 4 ranks failed in %.3f s]\n", msg, failed, secs);
    mbt_close(&t);
    CHECK(ok && over && strstr(msg, "holds 1000"));
    CHECK(failed == 4 && secs < 5.0);

    cudaStream_t st[9];
    int devs[9] = {0};
    k3c_comm *c[9];
    for (int r = 0; r < 9; r++) CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    cudaStream_t blocking;
    CK(cudaStreamCreate(&blocking));
    cudaStream_t keep = st[1];
    st[1] = blocking;
    int r1 = k3c_comm_mailbox_create(2, devs, (void *const *)st, NULL, c);
    CHECKF(r1 != K3C_OK && strstr(k3c_error_message(), "blocking"), "%s", k3c_error_message());
    st[1] = NULL;
    CHECK(k3c_comm_mailbox_create(2, devs, (void *const *)st, NULL, c) != K3C_OK);
    st[1] = keep;
    CHECK(k3c_comm_mailbox_create(1, devs, (void *const *)st, NULL, c) != K3C_OK);
    CHECK(k3c_comm_mailbox_create(9, devs, (void *const *)st, NULL, c) != K3C_OK);
    for (int r = 0; r < 9; r++) cudaStreamDestroy(st[r]);
    cudaStreamDestroy(blocking);
}

/* 8 ranks on one device with as many blocks each as the device holds at once (32 where 256 blocks fit: an
 * H200 holds 2 of these 512-thread blocks on each of its 132 multiprocessors): every block resident and
 * spinning together. Where fewer fit, creation refuses 32 (checked) and the largest that fits runs. */
TEST(gpu_mailbox_full_device) {
    const int R = 8;
    int blocks = 32;
    mbt t;
    k3c_comm_mailbox_options o = {.cap = (size_t)1 << 16, .timeout_ms = 5000, .blocks = blocks};
    cudaStream_t st[MBT_MAX];
    int devs[MBT_MAX] = {0};
    k3c_comm *c[MBT_MAX];
    for (int r = 0; r < R; r++) CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    int rc = k3c_comm_mailbox_create(R, devs, (void *const *)st, &o, c);
    if (rc != K3C_OK) {
        printf("  [%d ranks x 32 blocks refused: %s]\n", R, k3c_error_message());
        CHECK(strstr(k3c_error_message(), "resident") != NULL);
        k3c_comm_mailbox_options d = {.cap = 16};
        CHECK_OK(k3c_comm_mailbox_create(R, devs, (void *const *)st, &d, c)); /* the default fits */
        k3c_comm_mailbox_info info;
        CHECK_OK(k3c_comm_mailbox_get_info(c[0], &info));
        blocks = info.blocks;
    }
    for (int r = 0; r < R; r++) c[r]->free(c[r]);
    for (int r = 0; r < R; r++) cudaStreamDestroy(st[r]);
    o.blocks = blocks;
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xf011);
    mbt_call calls[300];
    memset(calls, 0, sizeof calls);
    int ncalls = mbt_scaled(300);
    for (int k = 0; k < ncalls; k++) {
        calls[k].n = mbt_size(&g, o.cap, 3000);
        calls[k].algo = mbt_algo(&g);
        calls[k].zeros = k % 6 == 0;
    }
    const size_t buf = (size_t)8 << 20; /* R ranks' calls of up to cap floats side by side */
    int ok = mbt_open(&t, R, NULL, buf, &o) == 0 && mbt_layout(calls, ncalls, R, buf, &g) == 0;
    long bad = -1;
    if (ok) ok = mbt_batch(&t, calls, ncalls, test_seed() ^ 0xf0, &bad) == 0;
    printf("  [%d ranks x %d blocks on one device: %d calls, %ld results differ]\n", R, blocks, ncalls, bad);
    mbt_close(&t);
    CHECK(ok);
    CHECK(bad == 0);
}

/* Gathers (in place and not) and broadcasts of odd byte counts up to the capacity, from every root. */
TEST(gpu_mailbox_gather_broadcast) {
    for (int s = 0; s < 3; s++) {
        const int R = mbt_ranks[s];
        const size_t cap = 4096, seg = cap * sizeof(float);
        mbt t;
        k3c_comm_mailbox_options o = {.cap = cap, .timeout_ms = 5000};
        /* buffer: [0, seg) source, [seg, seg + R seg) the gather's destination */
        if (mbt_open(&t, R, NULL, cap * (size_t)(R + 1) + 64, &o) != 0) {
            mbt_close(&t);
            CHECK(0);
        }
        static const size_t sizes[] = {1, 3, 16, 17, 1000, 4095, 4096, 12345, 16384};
        k3c_rng g;
        k3c_rng_seed(&g, test_seed() ^ 0x6a7 ^ (uint64_t)R);
        long bad = 0;
        int ok = 1, calls = 0;
        size_t total = t.buf * sizeof(float);
        unsigned char *hin[MBT_MAX], *hout[MBT_MAX];
        for (int r = 0; r < R; r++) hin[r] = (unsigned char *)t.in[r], hout[r] = (unsigned char *)t.out[r];
        for (size_t z = 0; z < sizeof sizes / sizeof *sizes && ok; z++)
            for (int mode = 0; mode < 2 + R && ok; mode++) { /* 0: gather, 1: gather in place, 2..: broadcast */
                const size_t bytes = sizes[z];
                const int root = mode - 2;
                for (int r = 0; r < R; r++) {
                    for (size_t i = 0; i < total; i++) hin[r][i] = (unsigned char)k3c_rng_next(&g);
                    ok = ok && cudaMemcpyAsync(t.d[r], hin[r], total, cudaMemcpyHostToDevice, t.st[r]) == cudaSuccess;
                }
                ok = ok && mbt_sync(&t) == 0;
                for (int r = 0; r < R && ok; r++) {
                    unsigned char *d = (unsigned char *)t.d[r];
                    if (mode == 0)
                        ok = t.c[r]->all_gather(t.c[r], d, d + seg, bytes) == K3C_OK;
                    else if (mode == 1)
                        ok = t.c[r]->all_gather(t.c[r], d + seg + (size_t)r * bytes, d + seg, bytes) == K3C_OK;
                    else
                        ok = t.c[r]->broadcast(t.c[r], d + 1, bytes, root) == K3C_OK; /* odd address */
                }
                for (int r = 0; r < R && ok; r++)
                    ok = cudaMemcpyAsync(hout[r], t.d[r], total, cudaMemcpyDeviceToHost, t.st[r]) == cudaSuccess;
                ok = ok && mbt_sync(&t) == 0;
                for (int r = 0; r < R && ok; r++) ok = k3c_comm_mailbox_check(t.c[r]) == K3C_OK;
                calls++;
                for (int r = 0; r < R && ok; r++)
                    for (size_t i = 0; i < total; i++) {
                        unsigned char want = hin[r][i];
                        if (mode < 2 && i >= seg && i < seg + (size_t)R * bytes) {
                            int p = (int)((i - seg) / bytes);
                            size_t j = (i - seg) % bytes;
                            want = mode == 0 ? hin[p][j] : hin[p][seg + (size_t)p * bytes + j];
                        } else if (mode >= 2 && i >= 1 && i < 1 + bytes) {
                            want = hin[root][i];
                        }
                        bad += hout[r][i] != want;
                    }
            }
        if (!ok) fprintf(stderr, "    %d ranks: %s\n", R, k3c_error_message());
        printf("  [%d ranks: %d gathers and broadcasts of 1 .. %zu bytes: %ld bytes differ]\n", R, calls, seg, bad);
        mbt_close(&t);
        CHECK(ok);
        CHECK(bad == 0);
    }
}

/* One host thread per rank, as the executor's ranks would run: each uploads its input, calls, downloads and
 * checks on its own stream, a barrier now and then; the ranks drift apart by up to a call. */
typedef struct mbt_thread {
    mbt *t;
    int rank, calls;
    uint64_t seed;
    long bad;
    int rc;
    char err[300];
} mbt_thread;

static void *mbt_thread_main(void *p) {
    mbt_thread *j = p;
    mbt *t = j->t;
    const int R = t->R, r = j->rank;
    float *ref = malloc(4096 * sizeof(float)), *other = malloc(4096 * sizeof(float));
    if (!ref || !other) j->rc = -1;
    for (int k = 0; k < j->calls && j->rc == 0; k++) {
        size_t n = 1 + (size_t)((j->seed >> 3) + (uint64_t)k * 977) % 4096;
        mbt_fill(t->in[r], n, j->seed, k, r, R, k % 3 == 0);
        k3c_mailbox_algo algo = (k3c_mailbox_algo)(k % 3);
        if (cudaMemcpyAsync(t->d[r], t->in[r], n * sizeof(float), cudaMemcpyHostToDevice, t->st[r]) != cudaSuccess ||
            k3c_comm_mailbox_all_reduce(t->c[r], t->d[r], n, algo) != K3C_OK ||
            cudaMemcpyAsync(t->out[r], t->d[r], n * sizeof(float), cudaMemcpyDeviceToHost, t->st[r]) != cudaSuccess ||
            cudaStreamSynchronize(t->st[r]) != cudaSuccess || k3c_comm_mailbox_check(t->c[r]) != K3C_OK ||
            (k % 50 == 49 && t->c[r]->barrier(t->c[r]) != K3C_OK)) {
            j->rc = -1;
            snprintf(j->err, sizeof j->err, "call %d: %s", k, k3c_error_message());
            break;
        }
        mbt_fill(ref, n, j->seed, k, 0, R, k % 3 == 0);
        for (int q = 1; q < R; q++) {
            mbt_fill(other, n, j->seed, k, q, R, k % 3 == 0);
            for (size_t i = 0; i < n; i++) ref[i] += other[i];
        }
        for (size_t i = 0; i < n; i++) j->bad += f2u(t->out[r][i]) != f2u(ref[i]);
    }
    if (j->rc == 0 && t->c[r]->barrier(t->c[r]) != K3C_OK) {
        j->rc = -1;
        snprintf(j->err, sizeof j->err, "last barrier: %s", k3c_error_message());
    }
    free(ref);
    free(other);
    return NULL;
}

/* rv 1: the ranks' threads declared (options.threads), so every eager call meets them all before and
 * after its launch (the launch rendezvous, comm/mailbox_cuda.c); the results must be the same bits. */
TEST(gpu_mailbox_threads) {
    for (int rv = 0; rv < 2; rv++)
    for (int s = 1; s < 3; s++) {
        const int R = mbt_ranks[s];
        mbt t;
        k3c_comm_mailbox_options o = {.cap = 4096, .timeout_ms = 5000, .threads = rv};
        if (mbt_open(&t, R, NULL, 4096, &o) != 0) {
            mbt_close(&t);
            CHECK(0);
        }
        mbt_thread j[MBT_MAX];
        pthread_t th[MBT_MAX];
        for (int r = 0; r < R; r++) {
            j[r] = (mbt_thread){&t, r, mbt_scaled(200), test_seed() ^ 0x7e ^ (uint64_t)R, 0, 0, ""};
            pthread_create(&th[r], NULL, mbt_thread_main, &j[r]);
        }
        long bad = 0;
        int failed = 0;
        const char *err = "";
        for (int r = 0; r < R; r++) {
            pthread_join(th[r], NULL);
            bad += j[r].bad;
            if (j[r].rc) failed++, err = j[r].err;
        }
        printf("  [%d ranks on %d threads%s, %d calls each with barriers: %d failed, %ld results differ]\n", R, R,
               rv ? " (launch rendezvous)" : "", j[0].calls, failed, bad);
        mbt_close(&t);
        CHECKF(failed == 0, "%s", err);
        CHECK(bad == 0);
    }
}

/* The launch rendezvous with a rank whose thread never makes the call: the other ranks' threads fail at
 * the meeting before their launch, within the timeout, naming it; no kernel was launched, so their streams
 * are idle; a later call fails at once. */
typedef struct mbt_rv_job {
    k3c_comm *c;
    float *d;
    int call, rc;
    double secs;
    char err[300];
} mbt_rv_job;

static void *mbt_rv_main(void *p) {
    mbt_rv_job *j = p;
    double t0 = mbt_now();
    if (j->call) {
        j->rc = k3c_comm_mailbox_all_reduce(j->c, j->d, 100, K3C_MAILBOX_ONE_SHOT);
        snprintf(j->err, sizeof j->err, "%s", j->rc ? k3c_error_message() : "");
    }
    j->secs = mbt_now() - t0;
    return NULL;
}

TEST(gpu_mailbox_rendezvous_missing) {
    for (int s = 0; s < 3; s++) {
        const int R = mbt_ranks[s], timeout_ms = 300;
        mbt t;
        k3c_comm_mailbox_options o = {.cap = 4096, .timeout_ms = timeout_ms, .threads = 1};
        if (mbt_open(&t, R, NULL, 4096, &o) != 0) {
            mbt_close(&t);
            CHECK(0);
        }
        mbt_rv_job j[MBT_MAX];
        pthread_t th[MBT_MAX];
        for (int r = 0; r < R; r++) {
            j[r] = (mbt_rv_job){t.c[r], t.d[r], r < R - 1, 0, 0, ""};
            pthread_create(&th[r], NULL, mbt_rv_main, &j[r]);
        }
        int failed = 0, named = 0;
        double worst = 0;
        for (int r = 0; r < R; r++) {
            pthread_join(th[r], NULL);
            if (r == R - 1) continue;
            failed += j[r].rc != K3C_OK;
            named += strstr(j[r].err, "did not make the call") != NULL || strstr(j[r].err, "gave up") != NULL;
            if (j[r].secs > worst) worst = j[r].secs;
        }
        int idle = mbt_sync(&t) == 0, launched = 0;
        for (int r = 0; r < R - 1; r++) {
            uint32_t e = 0;
            if (k3c_comm_mailbox_epoch(t.c[r], &e) == K3C_OK && e != 1) launched++;
        }
        int later = k3c_comm_mailbox_all_reduce(t.c[0], t.d[0], 10, K3C_MAILBOX_ONE_SHOT) != K3C_OK;
        printf("  [%d ranks, rank %d's thread never calls: %d of %d failed in at most %.3f s, %d naming why: %s]\n",
               R, R - 1, failed, R - 1, worst, named, j[0].err);
        mbt_close(&t);
        CHECK(failed == R - 1);
        CHECK(named == R - 1);
        CHECK(idle);
        CHECK(launched == 0);
        CHECK(later);
        CHECK(worst < timeout_ms / 1000.0 + 3.0);
    }
}

/* One rank per device, peer access between them, where more than one device is visible. */
TEST(gpu_mailbox_devices) {
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    if (n < 2) {
        printf("  [1 device visible: the peer-access path (one rank per device) needs 2 or more; not run]\n");
        return;
    }
    const int R = n < MBT_MAX ? n : MBT_MAX;
    int devs[MBT_MAX];
    for (int r = 0; r < R; r++) devs[r] = r;
    const size_t cap = (size_t)1 << 18, buf = (size_t)3 << 20;
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xde5);
    mbt_call calls[200];
    memset(calls, 0, sizeof calls);
    size_t used = 0;
    for (int k = 0; k < 200; k++) {
        calls[k].n = mbt_size(&g, cap, 8192);
        if (used + calls[k].n + 16 > buf - 64) calls[k].n = 1 + k % 5;
        used += calls[k].n + 16;
        calls[k].algo = mbt_algo(&g);
        calls[k].zeros = k % 5 == 0;
    }
    mbt t;
    k3c_comm_mailbox_options o = {.cap = cap, .timeout_ms = 5000};
    int ok = mbt_open(&t, R, devs, buf, &o) == 0 && mbt_layout(calls, 200, R, buf, &g) == 0;
    long bad = -1;
    if (ok) ok = mbt_batch(&t, calls, 200, test_seed() ^ 0xde, &bad) == 0;
    printf("  [%d ranks on %d devices: 200 calls, %ld results differ]\n", R, R, bad);
    mbt_close(&t);
    CHECK(ok);
    CHECK(bad == 0);
}

/* ---- one process per rank: the CUDA IPC path (k3c_comm_mailbox_create_ipc) on one device ----
 *
 * gpu_mailbox_ipc_processes starts R processes of this binary, each running only gpu_mailbox_ipc_rank with
 * K3C_MBT_IPC="rank ranks dir seed mode" in its environment; they bootstrap through files in dir (a host
 * communicator written below, standing in for the launcher's), create the mailbox through cudaIpc handles,
 * and check all-reduces, a gather and a broadcast bitwise against the rank-order sums of every rank's
 * inputs, which each process computes itself. Processes on one device share it by time slices, so every
 * call waits for the others' slices: slow, and few calls. mode "badcap": rank 1 passes another capacity,
 * and every rank must refuse at creation. */

typedef struct fboot {
    char dir[200];
    int seq, timeout_ms;
} fboot;

/* dst[p * bytes ..) = rank p's src: each rank writes its file (renamed into place whole), then reads every
 * rank's as it appears (bounded wait). */
static int fboot_all_gather(k3c_comm *c, const void *src, void *dst, size_t bytes) {
    fboot *f = c->ctx;
    const int seq = f->seq++;
    char tmp[256], path[256];
    snprintf(tmp, sizeof tmp, "%s/g%d.%d.tmp", f->dir, seq, c->rank);
    snprintf(path, sizeof path, "%s/g%d.%d", f->dir, seq, c->rank);
    FILE *w = fopen(tmp, "wb");
    if (!w || (bytes && fwrite(src, 1, bytes, w) != bytes) || fclose(w) != 0 || rename(tmp, path) != 0)
        return k3c_errorf("fboot: writing %s", path);
    double deadline = mbt_now() + f->timeout_ms / 1000.0;
    for (int p = 0; p < c->size; p++) {
        snprintf(path, sizeof path, "%s/g%d.%d", f->dir, seq, p);
        FILE *r;
        while (!(r = fopen(path, "rb"))) {
            if (mbt_now() > deadline) return k3c_errorf("fboot rank %d: no %s within %d ms", c->rank, path, f->timeout_ms);
            struct timespec nap = {0, 2000000};
            nanosleep(&nap, NULL);
        }
        size_t got = bytes ? fread((char *)dst + (size_t)p * bytes, 1, bytes, r) : 0;
        fclose(r);
        if (got != bytes) return k3c_errorf("fboot: %s holds %zu bytes, not %zu", path, got, bytes);
    }
    return K3C_OK;
}

static int fboot_barrier(k3c_comm *c) {
    char one = 1, all[MBT_MAX];
    return fboot_all_gather(c, &one, all, 1);
}
static int fboot_none(k3c_comm *c, float *buf, size_t n) {
    (void)c, (void)buf, (void)n;
    return k3c_errorf("fboot: no all_reduce");
}
static int fboot_no_broadcast(k3c_comm *c, void *buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes, (void)root;
    return k3c_errorf("fboot: no broadcast");
}
static void fboot_abort(k3c_comm *c) { (void)c; }
static void fboot_free(k3c_comm *c) { (void)c; }

/* The child: one rank of the group (run by gpu_mailbox_ipc_processes; alone it has nothing to do). */
TEST(gpu_mailbox_ipc_rank) {
    const char *spec = getenv("K3C_MBT_IPC");
    if (!spec) {
        printf("  [the child of gpu_mailbox_ipc_processes: nothing to do alone]\n");
        return;
    }
    int rank = -1, R = 0;
    unsigned long long seed = 0;
    char dir[200] = "", mode[16] = "";
    CHECKF(sscanf(spec, "%d %d %199s %llu %15s", &rank, &R, dir, &seed, mode) == 5 && rank >= 0 && rank < R &&
               R <= MBT_MAX, "K3C_MBT_IPC=%s", spec);
    fboot fb = {.seq = 0, .timeout_ms = 60000};
    snprintf(fb.dir, sizeof fb.dir, "%s", dir);
    k3c_comm boot = {.name = "fboot", .rank = rank, .size = R, .ctx = &fb, .all_reduce_f32 = fboot_none,
                     .all_gather = fboot_all_gather, .broadcast = fboot_no_broadcast, .barrier = fboot_barrier,
                     .abort = fboot_abort, .free = fboot_free}; /* host memory */
    const size_t cap = 8192;
    k3c_comm_mailbox_options o = {.cap = cap, .timeout_ms = 30000};
    if (!strcmp(mode, "badcap") && rank == 1) o.cap = cap + 1;
    cudaStream_t st;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    k3c_comm *c = NULL;
    int rc = k3c_comm_mailbox_create_ipc(&boot, 0, 0, st, &o, &c);
    if (!strcmp(mode, "badcap")) {
        printf("  [ipc rank %d of %d, options differ on rank 1: %s]\n", rank, R,
               rc == K3C_OK ? "accepted" : k3c_error_message());
        if (c) c->free(c);
        cudaStreamDestroy(st);
        CHECK(rc != K3C_OK && strstr(k3c_error_message(), "differ") != NULL);
        printf("ipc rank %d: ok\n", rank);
        return;
    }
    CHECKF(rc == K3C_OK, "ipc rank %d: %s", rank, k3c_error_message());
    float *d = NULL, *h = NULL, *ref = NULL, *other = NULL;
    CK(cudaMalloc((void **)&d, cap * (size_t)(R + 1) * sizeof(float)));
    CK(cudaMallocHost((void **)&h, cap * (size_t)(R + 1) * sizeof(float)));
    ref = malloc(cap * sizeof(float));
    other = malloc(cap * sizeof(float));
    CHECK(ref && other);
    long bad = 0;
    int calls = 24, ok = 1;
    for (int k = 0; k < calls && ok; k++) {
        size_t n = k == 0 ? cap : 1 + (size_t)((seed >> 5) + (uint64_t)k * 2749) % cap;
        k3c_mailbox_algo algo = (k3c_mailbox_algo)(k % 3);
        mbt_fill(h, n, seed, k, rank, R, k % 4 == 0);
        ok = cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, st) == cudaSuccess &&
             k3c_comm_mailbox_all_reduce(c, d, n, algo) == K3C_OK &&
             cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, st) == cudaSuccess &&
             cudaStreamSynchronize(st) == cudaSuccess && k3c_comm_mailbox_check(c) == K3C_OK;
        mbt_fill(ref, n, seed, k, 0, R, k % 4 == 0);
        for (int q = 1; q < R; q++) {
            mbt_fill(other, n, seed, k, q, R, k % 4 == 0);
            for (size_t i = 0; i < n; i++) ref[i] += other[i];
        }
        for (size_t i = 0; ok && i < n; i++) bad += f2u(h[i]) != f2u(ref[i]);
    }
    /* a gather of every rank's first 1000 inputs of call 0 into [cap, cap + R x 1000), then a broadcast from
     * the last rank */
    if (ok) {
        mbt_fill(h, 1000, seed, 0, rank, R, 0);
        ok = cudaMemcpyAsync(d, h, 1000 * sizeof(float), cudaMemcpyHostToDevice, st) == cudaSuccess &&
             c->all_gather(c, d, d + cap, 1000 * sizeof(float)) == K3C_OK &&
             c->broadcast(c, d, 1000 * sizeof(float), R - 1) == K3C_OK &&
             cudaMemcpyAsync(h, d, cap * (size_t)(R + 1) * sizeof(float), cudaMemcpyDeviceToHost, st) == cudaSuccess &&
             cudaStreamSynchronize(st) == cudaSuccess && c->barrier(c) == K3C_OK;
        for (int q = 0; ok && q < R; q++) {
            mbt_fill(other, 1000, seed, 0, q, R, 0);
            for (size_t i = 0; i < 1000; i++) bad += f2u(h[cap + (size_t)q * 1000 + i]) != f2u(other[i]);
            if (q == R - 1)
                for (size_t i = 0; i < 1000; i++) bad += f2u(h[i]) != f2u(other[i]);
        }
    }
    if (!ok) fprintf(stderr, "    ipc rank %d: %s\n", rank, k3c_error_message());
    printf("  [ipc rank %d of %d: %d all-reduces, a gather and a broadcast: %ld values differ]\n", rank, R, calls, bad);
    c->free(c);
    cudaFree(d);
    cudaFreeHost(h);
    free(ref);
    free(other);
    cudaStreamDestroy(st);
    CHECK(ok);
    CHECK(bad == 0);
    printf("ipc rank %d: ok\n", rank);
}

extern char **environ;

/* Starts R children of this binary (gpu_mailbox_ipc_rank, K3C_MBT_IPC set), waits for them (bounded: a
 * child still running at the deadline is killed and fails the test); 0 when every child passed. */
static int mbt_spawn_ranks(int R, const char *mode, double limit_s, char *why, size_t why_n) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/ipc%d%s", test_tmpdir(), R, mode);
    MT(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    pid_t pid[MBT_MAX];
    for (int r = 0; r < R; r++) {
        char var[400], log[300];
        snprintf(var, sizeof var, "K3C_MBT_IPC=%d %d %s %llu %s", r, R, dir, (unsigned long long)test_seed(), mode);
        snprintf(log, sizeof log, "%s/log.%d", dir, r);
        size_t ne = 0;
        while (environ[ne]) ne++;
        char **env = calloc(ne + 2, sizeof *env);
        MT(env, "out of memory");
        for (size_t i = 0; i < ne; i++) env[i] = environ[i];
        env[ne] = var;
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
        char *argv[] = {"test_gpu", "=gpu_mailbox_ipc_rank", NULL};
        int e = posix_spawn(&pid[r], "/proc/self/exe", &fa, NULL, argv, env);
        posix_spawn_file_actions_destroy(&fa);
        free(env);
        MT(e == 0, "posix_spawn rank %d: %s", r, strerror(e));
    }
    int failed = 0, left = R, status[MBT_MAX], done[MBT_MAX] = {0};
    double deadline = mbt_now() + limit_s;
    while (left) {
        for (int r = 0; r < R; r++)
            if (!done[r] && waitpid(pid[r], &status[r], WNOHANG) == pid[r]) done[r] = 1, left--;
        if (left && mbt_now() > deadline) {
            for (int r = 0; r < R; r++)
                if (!done[r]) kill(pid[r], SIGKILL), waitpid(pid[r], &status[r], 0), done[r] = 1, status[r] = -1;
            snprintf(why, why_n, "killed at the %.0f s limit", limit_s);
            failed = 1;
            break;
        }
        struct timespec nap = {0, 10000000};
        nanosleep(&nap, NULL);
    }
    for (int r = 0; r < R; r++) {
        int passed = status[r] != -1 && WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0;
        char log[300], line[400];
        snprintf(log, sizeof log, "%s/log.%d", dir, r);
        FILE *f = fopen(log, "r");
        int said_ok = 0;
        while (f && fgets(line, sizeof line, f)) {
            if (strstr(line, "[ipc rank")) printf("  %s", strstr(line, "[ipc rank"));
            if (strstr(line, "ok\n") && strstr(line, "ipc rank")) said_ok = 1;
            if (!passed && strstr(line, ".c:")) snprintf(why, why_n, "rank %d: %s", r, line);
        }
        if (f) fclose(f);
        if (!passed || !said_ok) {
            failed = 1;
            if (!why[0]) snprintf(why, why_n, "rank %d exited with status %d (log %s)", r, status[r], log);
        }
    }
    return failed ? -1 : 0;
}

TEST(gpu_mailbox_ipc_processes) {
    static const struct { int R; const char *mode; } runs[] = {{2, "sum"}, {4, "sum"}, {2, "badcap"}};
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        char why[512] = "";
        double t0 = mbt_now();
        int rc = mbt_spawn_ranks(runs[k].R, runs[k].mode, 120.0, why, sizeof why);
        printf("  [%d processes on one device, %s: %s in %.1f s]\n", runs[k].R, runs[k].mode, rc ? why : "passed",
               mbt_now() - t0);
        CHECKF(rc == 0, "%d processes, %s: %s", runs[k].R, runs[k].mode, why);
    }
}
