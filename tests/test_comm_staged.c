/* The staged communicator (comm/staged.c) on CPU ranks: its point to point, all-to-all and split (what
 * pipeline stages and expert-parallel ranks on one GPU go through) and its all-reduce, compiled here against a
 * stand-in for the CUDA runtime calls it makes. The stand-in's "device" memory is host memory and its streams
 * defer every copy until the stream is queried or synchronized (the first query after a copy answers "not
 * ready", so the staged code's polling loop runs): a staged call that read its staging before waiting for the
 * stream, or that let a later copy in overwrite a copy back not yet done, reads stale or poisoned bytes here,
 * as it would on a GPU. What it cannot show: the real runtime's behaviour (tests/gpu/test_gpu_ppep.c runs the
 * same calls on the device). Payloads are checked bytewise against what each sender wrote; receive buffers are
 * poisoned; sizes change every call, a third of them 0. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the stand-in (the real header's guard keeps it out of this translation unit) ---- */
#define __CUDA_RUNTIME_API_H__
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorNotReady = 600, cudaErrorInvalidValue = 1 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1 };
#define cudaHostAllocDefault 0

typedef struct emu_op {
    void *dst;
    const void *src;
    size_t bytes;
} emu_op;

typedef struct emu_stream {
    pthread_mutex_t mu;
    emu_op ops[64];
    int n, asked, capturing;
    long copies;
} emu_stream;
typedef emu_stream *cudaStream_t;

static const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
static cudaError_t cudaGetDeviceCount(int *n) { return *n = 1, cudaSuccess; }
static cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
static cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    *p = malloc(bytes);
    if (*p) memset(*p, 0x5a, bytes); /* never what a sender wrote */
    return *p ? cudaSuccess : cudaErrorInvalidValue;
}
static cudaError_t cudaFreeHost(void *p) { return free(p), cudaSuccess; }
static cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
    *st = s->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
/* Queued: the bytes are read when the stream runs it, as on a GPU. */
static cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k, cudaStream_t s) {
    (void)k;
    pthread_mutex_lock(&s->mu);
    int full = s->n == 64;
    if (!full) s->ops[s->n++] = (emu_op){dst, src, bytes};
    s->asked = 0;
    pthread_mutex_unlock(&s->mu);
    return full ? cudaErrorInvalidValue : cudaSuccess;
}
static void emu_run(cudaStream_t s) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++) memmove(s->ops[i].dst, s->ops[i].src, s->ops[i].bytes);
    s->copies += s->n;
    s->n = 0;
    pthread_mutex_unlock(&s->mu);
}
/* Pending copies: "not ready" once, then they run. */
static cudaError_t cudaStreamQuery(cudaStream_t s) {
    pthread_mutex_lock(&s->mu);
    int wait = s->n > 0 && !s->asked;
    s->asked = 1;
    pthread_mutex_unlock(&s->mu);
    if (wait) return cudaErrorNotReady;
    emu_run(s);
    return cudaSuccess;
}

/* the communicator under test, its entry point renamed away from the library's */
#ifndef K3C_HAVE_CUDA
#define K3C_HAVE_CUDA 1
#endif
#define k3c_comm_staged_create emu_staged_create
#include "../src/comm/staged.c"
#undef k3c_comm_staged_create

#include "test.h"
#include "util/rng.h"

static double secs(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static unsigned char byte_of(int s, int d, int k, size_t i) { return (unsigned char)(s * 131 + d * 31 + k * 7 + i * 13 + 1); }

#define CALLS 40
#define MAXB 3000
#define CAP (8 * MAXB)

typedef struct sjob {
    k3c_comm_group *grp;
    int rank, size;
    size_t (*counts)[8][8];
    long bad, copies;
    int rc;
    char err[400];
} sjob;

/* Per call: a chain 0 -> 1 -> ... -> n - 1 (recv, then send), an all-to-all of the call's counts, an
 * all-reduce of a few floats; then a split into even and odd ranks, an all-reduce and a send / recv there. The
 * "device" buffers are poisoned (0xa5) before each receive; results are read after a stream sync only. */
static int staged_rank(sjob *j) {
    emu_stream st = {.mu = PTHREAD_MUTEX_INITIALIZER};
    k3c_comm *c = NULL, *sub = NULL;
    unsigned char *ds = malloc(CAP), *dr = malloc(CAP);
    int n = j->size, me = j->rank, rc = ds && dr ? K3C_OK : k3c_errorf("out of memory");
    if (rc == K3C_OK) rc = emu_staged_create(j->grp, me, 0, &st, 5000, &c);
    for (int k = 0; k < CALLS && rc == K3C_OK; k++) {
        size_t (*cnt)[8] = j->counts[k];
        if (me > 0) {
            size_t b = cnt[me - 1][me];
            memset(dr, 0xa5, CAP);
            rc = c->recv(c, dr, b, me - 1);
            emu_run(&st);
            for (size_t i = 0; i < CAP && rc == K3C_OK; i++) j->bad += dr[i] != (i < b ? byte_of(me - 1, me, k, i) : 0xa5);
        }
        if (rc == K3C_OK && me < n - 1) {
            size_t b = cnt[me][me + 1];
            for (size_t i = 0; i < b; i++) ds[i] = byte_of(me, me + 1, k, i);
            rc = c->send(c, ds, b, me + 1);
        }
        size_t sb[8], rb[8], so = 0, ro = 0;
        for (int p = 0; p < n; p++) sb[p] = cnt[me][p], rb[p] = cnt[p][me];
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < sb[p]; i++) ds[so + i] = byte_of(me, p, k, i);
            so += sb[p];
        }
        memset(dr, 0xa5, CAP);
        if (rc == K3C_OK) rc = c->all_to_all(c, ds, sb, dr, rb);
        emu_run(&st);
        for (int p = 0; p < n && rc == K3C_OK; p++) {
            for (size_t i = 0; i < rb[p]; i++) j->bad += dr[ro + i] != byte_of(p, me, k, i);
            ro += rb[p];
        }
        for (size_t i = ro; i < CAP && rc == K3C_OK; i++) j->bad += dr[i] != 0xa5;
        float v[3] = {(float)(me + k), -0.0f, 0.5f}, want[3] = {0, -0.0f, 0};
        for (int r = 0; r < n; r++) want[0] += (float)(r + k), want[2] += 0.5f;
        if (rc == K3C_OK) rc = c->all_reduce_f32(c, v, 3);
        emu_run(&st);
        if (rc == K3C_OK) j->bad += memcmp(v, want, sizeof v) != 0;
    }
    if (rc == K3C_OK) rc = c->split(c, me % 2, -me, &sub); /* keyed in reverse: sub-rank 0 is the highest */
    int m = (n + 1 - me % 2) / 2, sr = (n - 1 - me) / 2;
    if (rc == K3C_OK && (!sub || sub->size != m || sub->rank != sr || !sub->stream_ordered || !sub->send))
        rc = k3c_errorf("rank %d: split gave rank %d of %d, expected %d of %d", me, sub ? sub->rank : -1,
                        sub ? sub->size : -1, sr, m);
    if (rc == K3C_OK && m > 1) {
        float v[2] = {(float)me, 1.0f};
        rc = sub->all_reduce_f32(sub, v, 2);
        emu_run(&st);
        float want[2] = {0, 0};
        for (int r = n - 1; r >= 0; r--) /* in sub-rank order: the highest world rank first */
            if (r % 2 == me % 2) want[0] += (float)r, want[1] += 1.0f;
        if (rc == K3C_OK) j->bad += memcmp(v, want, sizeof v) != 0;
        if (rc == K3C_OK && sub->rank == 0) {
            for (int i = 0; i < 100; i++) ds[i] = (unsigned char)(i ^ me);
            rc = sub->send(sub, ds, 100, 1);
        } else if (rc == K3C_OK && sub->rank == 1) {
            memset(dr, 0xa5, 100);
            rc = sub->recv(sub, dr, 100, 0);
            emu_run(&st);
            int from = me + 2; /* sub-rank 0: the next higher rank of this parity */
            for (int i = 0; i < 100; i++) j->bad += dr[i] != (unsigned char)(i ^ from);
        }
    }
    if (rc != K3C_OK) snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
    if (sub) sub->free(sub);
    if (c) c->free(c);
    emu_run(&st);
    j->copies = st.copies;
    free(ds), free(dr);
    return rc;
}

static void *staged_thread(void *p) {
    sjob *j = p;
    j->rc = staged_rank(j);
    return NULL;
}

TEST(comm_staged_emulated_p2p_all_to_all_split) {
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x5747);
    static size_t counts[CALLS][8][8];
    for (int n = 2; n <= 5; n++) {
        for (int k = 0; k < CALLS; k++)
            for (int s = 0; s < n; s++)
                for (int d = 0; d < n; d++) counts[k][s][d] = k3c_rng_next(&g) % 3 == 0 ? 0 : 1 + k3c_rng_next(&g) % MAXB;
        k3c_comm_group *grp;
        CHECK_OK(k3c_comm_group_create(n, 5000, &grp));
        sjob jobs[8];
        pthread_t th[8];
        for (int r = 0; r < n; r++) {
            jobs[r] = (sjob){.grp = grp, .rank = r, .size = n, .counts = counts};
            pthread_create(&th[r], NULL, staged_thread, &jobs[r]);
        }
        for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
        long bad = 0, copies = 0;
        for (int r = 0; r < n; r++) {
            CHECKF(jobs[r].rc == K3C_OK, "%d ranks: rank %d: %s", n, r, jobs[r].err);
            bad += jobs[r].bad;
            copies += jobs[r].copies;
        }
        CHECKF(bad == 0, "%d ranks: %ld bytes or sums differ from what was sent", n, bad);
        CHECK(copies > (long)n * CALLS); /* the copies went through the emulated streams */
    }
}

/* A recv of another size than the send: both ranks fail at once (the group's mismatch), not at the timeout. */
typedef struct mjob {
    k3c_comm_group *grp;
    int rank, rc;
    double t;
} mjob;

static void *mismatch_thread(void *p) {
    mjob *j = p;
    emu_stream st = {.mu = PTHREAD_MUTEX_INITIALIZER};
    unsigned char buf[256] = {0};
    k3c_comm *c;
    j->rc = emu_staged_create(j->grp, j->rank, 0, &st, 5000, &c);
    if (j->rc != K3C_OK) return NULL;
    double t0 = secs();
    j->rc = j->rank == 0 ? c->send(c, buf, 64, 1) : c->recv(c, buf, 128, 0);
    j->t = secs() - t0;
    c->free(c);
    emu_run(&st);
    return NULL;
}

TEST(comm_staged_emulated_mismatch_fails_both) {
    k3c_comm_group *grp;
    CHECK_OK(k3c_comm_group_create(2, 3000, &grp));
    mjob j[2] = {{grp, 0, K3C_OK, 0}, {grp, 1, K3C_OK, 0}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, mismatch_thread, &j[k]);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) CHECKF(j[k].rc == K3C_ERR && j[k].t < 2.5, "rank %d: rc %d after %.2f s", k, j[k].rc, j[k].t);
}

/* A call while the stream is being captured into a CUDA graph: refused (a host wait cannot be captured), and
 * the group fails with it. */
TEST(comm_staged_emulated_refuses_capture) {
    k3c_comm_group *grp;
    CHECK_OK(k3c_comm_group_create(1, 1000, &grp));
    emu_stream st = {.mu = PTHREAD_MUTEX_INITIALIZER};
    k3c_comm *c;
    CHECK_OK(emu_staged_create(grp, 0, 0, &st, 1000, &c));
    unsigned char a[8] = {0}, b[8];
    size_t n[1] = {8};
    st.capturing = 1;
    CHECK(c->all_to_all(c, a, n, b, n) == K3C_ERR && strstr(k3c_error_message(), "captured"));
    st.capturing = 0;
    CHECK(c->send(c, a, 8, 0) == K3C_ERR); /* the group failed (and a send to itself is refused anyway) */
    c->free(c);
    emu_run(&st);
}
