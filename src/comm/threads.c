/* The in-memory group (comm/comm.h): N ranks of one process, one thread each, host memory.
 *
 * Every collective is two barriers around direct reads of the other ranks' published buffers: ranks publish
 * their pointer and size, meet (barrier A), each does its own share of the work, and meet again (barrier B)
 * before any rank returns, so no buffer is written or reused while another rank still reads it. The
 * all-reduce splits the elements into `size` contiguous slices; rank r alone reads and writes slice r of
 * every rank's buffer, summing element i as ((b_0[i] + b_1[i]) + b_2[i]) + ... and storing that one value in
 * every buffer, so all ranks hold the same bits, in rank order, whatever thread ran first.
 *
 * A barrier waits at most the group's timeout; a rank that times out, aborts, or finds its peers calling with
 * different sizes marks the group failed, and every rank's current and later calls then fail at once. */
#include "comm/comm.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"

struct k3c_comm_group {
    int size, timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long gen; /* barrier generation: bumped when the last rank arrives */
    int arrived;
    int failed;        /* set once: a timeout, an abort, mismatched calls */
    int joined, refs;
    int orphaned; /* k3c_comm_group_free was called: no more ranks will join */
    void **ptr;        /* [size] what each rank published for the current collective */
    size_t *bytes;     /* [size] */
    k3c_comm *comms;   /* [size] */
    uint8_t *taken;    /* [size] */
};

static void fail_locked(k3c_comm_group *g) {
    g->failed = 1;
    pthread_cond_broadcast(&g->cv);
}

/* Waits until every rank arrived at this barrier; K3C_ERR (with a message) if the group failed or the
 * timeout passed first (then the group fails for everyone). */
static int barrier_wait(k3c_comm_group *g, int rank, const char *what) {
    pthread_mutex_lock(&g->mu);
    if (g->failed) {
        pthread_mutex_unlock(&g->mu);
        return k3c_errorf("comm: rank %d of %d: %s: the group has failed (a rank aborted or timed out)", rank, g->size,
                          what);
    }
    unsigned long gen = g->gen;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return K3C_OK;
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += g->timeout_ms / 1000;
    dl.tv_nsec += (long)(g->timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    int timed_out = 0;
    while (g->gen == gen && !g->failed)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT && g->gen == gen && !g->failed) {
            timed_out = 1;
            fail_locked(g);
        }
    int ok = g->gen != gen; /* the barrier completed (a failure after it is the next call's) */
    int waiting = g->size - g->arrived;
    pthread_mutex_unlock(&g->mu);
    if (ok) return K3C_OK;
    if (timed_out)
        return k3c_errorf("comm: rank %d of %d: %s: timed out after %d ms waiting for %d other rank%s", rank, g->size,
                          what, g->timeout_ms, waiting, waiting == 1 ? "" : "s");
    return k3c_errorf("comm: rank %d of %d: %s: the group has failed (a rank aborted or timed out)", rank, g->size, what);
}

static void group_fail(k3c_comm_group *g) {
    pthread_mutex_lock(&g->mu);
    fail_locked(g);
    pthread_mutex_unlock(&g->mu);
}

/* Publish (ptr, bytes), barrier A, and check every rank called with the same size. */
static int publish(k3c_comm *c, void *ptr, size_t bytes, const char *what) {
    k3c_comm_group *g = c->ctx;
    g->ptr[c->rank] = ptr;
    g->bytes[c->rank] = bytes;
    K3C_TRY(barrier_wait(g, c->rank, what));
    for (int r = 0; r < g->size; r++)
        if (g->bytes[r] != bytes) {
            group_fail(g);
            return k3c_errorf("comm: rank %d of %d: %s of %zu bytes, but rank %d called it with %zu", c->rank, g->size,
                              what, bytes, r, g->bytes[r]);
        }
    return K3C_OK;
}

static int th_all_reduce(k3c_comm *c, float *buf, size_t n) {
    k3c_comm_group *g = c->ctx;
    K3C_TRY(publish(c, buf, n * sizeof(float), "all_reduce"));
    size_t lo = n * (size_t)c->rank / g->size, hi = n * (size_t)(c->rank + 1) / g->size;
    float *const *b = (float *const *)g->ptr;
    for (size_t i = lo; i < hi; i++) {
        float acc = b[0][i];
        for (int r = 1; r < g->size; r++) acc += b[r][i];
        for (int r = 0; r < g->size; r++) b[r][i] = acc;
    }
    return barrier_wait(g, c->rank, "all_reduce");
}

static int th_all_gather(k3c_comm *c, const void *src, void *dst, size_t bytes) {
    k3c_comm_group *g = c->ctx;
    K3C_TRY(publish(c, (void *)src, bytes, "all_gather"));
    for (int r = 0; r < g->size; r++) {
        char *d = (char *)dst + (size_t)r * bytes;
        if (d != g->ptr[r] && bytes) memcpy(d, g->ptr[r], bytes);
    }
    return barrier_wait(g, c->rank, "all_gather");
}

static int th_broadcast(k3c_comm *c, void *buf, size_t bytes, int root) {
    k3c_comm_group *g = c->ctx;
    if (root < 0 || root >= g->size) {
        group_fail(g);
        return k3c_errorf("comm: rank %d of %d: broadcast from rank %d", c->rank, g->size, root);
    }
    K3C_TRY(publish(c, buf, bytes, "broadcast"));
    if (c->rank != root && bytes) memcpy(buf, g->ptr[root], bytes);
    return barrier_wait(g, c->rank, "broadcast");
}

static int th_barrier(k3c_comm *c) { return barrier_wait(c->ctx, c->rank, "barrier"); }

static void th_abort(k3c_comm *c) { group_fail(c->ctx); }

static void group_destroy(k3c_comm_group *g) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->ptr);
    free(g->bytes);
    free(g->comms);
    free(g->taken);
    free(g);
}

static void th_free(k3c_comm *c) {
    k3c_comm_group *g = c->ctx;
    pthread_mutex_lock(&g->mu);
    /* The group lives until every rank has joined and left (or the creator gave up on the rest): a rank that
     * leaves before a slower one joins must not free the group under it. */
    int last = --g->refs == 0 && (g->joined == g->size || g->orphaned);
    pthread_mutex_unlock(&g->mu);
    if (last) group_destroy(g);
}

int k3c_comm_group_create(int size, int timeout_ms, k3c_comm_group **out) {
    *out = NULL;
    if (size < 1 || size > 4096) return k3c_errorf("comm group: %d ranks (1 .. 4096)", size);
    if (timeout_ms < 0) return k3c_errorf("comm group: timeout %d ms", timeout_ms);
    k3c_comm_group *g = calloc(1, sizeof *g);
    if (!g) return k3c_errorf_kind(K3C_ERROR_OOM, "comm group: out of memory");
    g->size = size;
    g->timeout_ms = timeout_ms ? timeout_ms : 60000;
    g->ptr = calloc((size_t)size, sizeof *g->ptr);
    g->bytes = calloc((size_t)size, sizeof *g->bytes);
    g->comms = calloc((size_t)size, sizeof *g->comms);
    g->taken = calloc((size_t)size, 1);
    if (!g->ptr || !g->bytes || !g->comms || !g->taken) {
        free(g->ptr), free(g->bytes), free(g->comms), free(g->taken), free(g);
        return k3c_errorf_kind(K3C_ERROR_OOM, "comm group: out of memory");
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return K3C_OK;
}

int k3c_comm_group_join(k3c_comm_group *g, int rank, k3c_comm **out) {
    *out = NULL;
    if (rank < 0 || rank >= g->size) return k3c_errorf("comm group: rank %d of %d", rank, g->size);
    pthread_mutex_lock(&g->mu);
    int taken = g->taken[rank];
    if (!taken) {
        g->taken[rank] = 1;
        g->joined++;
        g->refs++;
    }
    pthread_mutex_unlock(&g->mu);
    if (taken) return k3c_errorf("comm group: rank %d joined twice", rank);
    g->comms[rank] = (k3c_comm){"threads", rank, g->size, g, th_all_reduce, th_all_gather, th_broadcast, th_barrier,
                                th_abort, th_free, 0};
    *out = &g->comms[rank];
    return K3C_OK;
}

void k3c_comm_group_free(k3c_comm_group *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int now = g->refs == 0;
    g->orphaned = 1; /* the ranks still joined free it as the last one leaves */
    pthread_mutex_unlock(&g->mu);
    if (now) group_destroy(g);
}
