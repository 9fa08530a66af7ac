/* The in-memory group (comm/comm.h): N ranks of one process, one thread each, host memory.
 *
 * Every collective is two barriers around direct reads of the other ranks' published buffers: ranks publish
 * their pointer and size, meet (barrier A), each does its own share of the work, and meet again (barrier B)
 * before any rank returns, so no buffer is written or reused while another rank still reads it. The
 * all-reduce splits the elements into `size` contiguous slices; rank r alone reads and writes slice r of
 * every rank's buffer, summing element i as ((b_0[i] + b_1[i]) + b_2[i]) + ... and storing that one value in
 * every buffer, so all ranks hold the same bits, in rank order, whatever thread ran first. The all-to-all
 * has each rank copy its own receive parts out of the senders' published buffers.
 *
 * Point to point is a rendezvous per (sender, receiver) pair: the sender posts its buffer in the pair's box
 * and waits; the receiver waits for a post, copies it out and marks it taken, which releases the sender. So a
 * send's buffer is read only while its sender waits, and nothing is allocated per message.
 *
 * A wait lasts at most the group's timeout; a rank that times out, aborts, or finds its peers calling with
 * different sizes marks the group failed, and every rank's current and later calls then fail at once. Groups
 * split from one world form a family: a failure in any of them fails all of them (the lock order is family,
 * then group; no group lock is held while the family's is taken). */
#include "comm/comm.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"

typedef struct family {
    pthread_mutex_t mu;
    k3c_comm_group **groups; /* [n] the live groups split from one world (the world first) */
    int n, cap;
} family;

typedef struct p2p_box {
    const void *buf; /* the posted send, NULL when none */
    size_t bytes;
    int busy;        /* the receiver is copying it: the sender waits, failure or not (its buffer is read) */
    int taken;       /* the receiver has copied it: the sender may return */
} p2p_box;

struct k3c_comm_group {
    int size, timeout_ms;
    family *fam;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long gen; /* barrier generation: bumped when the last rank arrives */
    int arrived;
    int failed;        /* set once: a timeout, an abort, mismatched calls (here or in the family) */
    int joined, refs;
    int orphaned; /* k3c_comm_group_free was called: no more ranks will join */
    void **ptr;        /* [size] what each rank published for the current collective */
    size_t *bytes;     /* [size] */
    const size_t **sc, **rc; /* [size] all_to_all: each rank's send and receive counts */
    int *color, *key;  /* [size] split */
    k3c_comm_group **sub; /* [size] split: the group rank r joins (NULL: none) */
    int *sub_rank;     /* [size] and its rank there */
    p2p_box *box;      /* [size * size] box [src * size + dst] */
    k3c_comm *comms;   /* [size] */
    uint8_t *taken;    /* [size] */
};

static int group_new(int size, int timeout_ms, family *fam, k3c_comm_group **out);

/* Marks every group of g's family failed and wakes their waiters. Called with no group lock held. */
static void group_fail(k3c_comm_group *g) {
    family *f = g->fam;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->n; i++) {
        k3c_comm_group *x = f->groups[i];
        pthread_mutex_lock(&x->mu);
        x->failed = 1;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
    }
    pthread_mutex_unlock(&f->mu);
}

static struct timespec deadline(const k3c_comm_group *g) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += g->timeout_ms / 1000;
    dl.tv_nsec += (long)(g->timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    return dl;
}

static int failed_error(const k3c_comm_group *g, int rank, const char *what) {
    return k3c_errorf("comm: rank %d of %d: %s: the group has failed (a rank aborted, timed out or called "
                      "differently)", rank, g->size, what);
}

/* Waits until every rank arrived at this barrier; K3C_ERR (with a message) if the group failed or the
 * timeout passed first (then the group fails for everyone). */
static int barrier_wait(k3c_comm_group *g, int rank, const char *what) {
    pthread_mutex_lock(&g->mu);
    if (g->failed) {
        pthread_mutex_unlock(&g->mu);
        return failed_error(g, rank, what);
    }
    unsigned long gen = g->gen;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return K3C_OK;
    }
    struct timespec dl = deadline(g);
    int timed_out = 0;
    while (g->gen == gen && !g->failed)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT && g->gen == gen && !g->failed) {
            timed_out = 1;
            break;
        }
    int ok = g->gen != gen; /* the barrier completed (a failure after it is the next call's) */
    int waiting = g->size - g->arrived;
    pthread_mutex_unlock(&g->mu);
    if (ok) return K3C_OK;
    if (timed_out) {
        group_fail(g);
        return k3c_errorf("comm: rank %d of %d: %s: timed out after %d ms waiting for %d other rank%s", rank, g->size,
                          what, g->timeout_ms, waiting, waiting == 1 ? "" : "s");
    }
    return failed_error(g, rank, what);
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

/* ---- point to point ---- */

static int peer_ok(k3c_comm *c, int peer, const char *what) {
    k3c_comm_group *g = c->ctx;
    if (peer >= 0 && peer < g->size && peer != c->rank) return K3C_OK;
    group_fail(g);
    return k3c_errorf("comm: rank %d of %d: %s with rank %d (another rank of the group)", c->rank, g->size, what, peer);
}

static int th_send(k3c_comm *c, const void *buf, size_t bytes, int peer) {
    k3c_comm_group *g = c->ctx;
    K3C_TRY(peer_ok(c, peer, "send"));
    p2p_box *b = &g->box[(size_t)c->rank * g->size + peer];
    struct timespec dl = deadline(g);
    int timed_out = 0, done = 0;
    pthread_mutex_lock(&g->mu);
    /* the box is free here: this rank's previous send to peer returned only once taken, and cleared it */
    b->buf = buf ? buf : (const void *)b; /* non-NULL marks the post, even for 0 bytes */
    b->bytes = bytes;
    b->taken = 0;
    pthread_cond_broadcast(&g->cv);
    for (;;) {
        if (b->taken) break;
        if (b->busy) { /* a copy out of buf is under way: it ends without waiting on anyone */
            pthread_cond_wait(&g->cv, &g->mu);
            continue;
        }
        if (g->failed || timed_out) break;
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT) timed_out = 1;
    }
    done = b->taken;
    b->buf = NULL;
    b->taken = 0;
    int failed = g->failed;
    pthread_mutex_unlock(&g->mu);
    if (done && !failed) return K3C_OK;
    if (timed_out) {
        group_fail(g);
        return k3c_errorf("comm: rank %d of %d: send of %zu bytes to rank %d: timed out after %d ms (no recv)", c->rank,
                          g->size, bytes, peer, g->timeout_ms);
    }
    return failed_error(g, c->rank, "send");
}

static int th_recv(k3c_comm *c, void *buf, size_t bytes, int peer) {
    k3c_comm_group *g = c->ctx;
    K3C_TRY(peer_ok(c, peer, "recv"));
    p2p_box *b = &g->box[(size_t)peer * g->size + c->rank];
    struct timespec dl = deadline(g);
    int timed_out = 0;
    pthread_mutex_lock(&g->mu);
    while ((!b->buf || b->taken) && !g->failed)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT && (!b->buf || b->taken) && !g->failed) {
            timed_out = 1;
            break;
        }
    int posted = b->buf && !b->taken && !g->failed;
    const void *src = b->buf;
    size_t sent = b->bytes;
    if (posted && sent == bytes) b->busy = 1;
    pthread_mutex_unlock(&g->mu);
    if (!posted) {
        if (!timed_out) return failed_error(g, c->rank, "recv");
        group_fail(g);
        return k3c_errorf("comm: rank %d of %d: recv of %zu bytes from rank %d: timed out after %d ms (no send)",
                          c->rank, g->size, bytes, peer, g->timeout_ms);
    }
    if (sent != bytes) {
        group_fail(g);
        return k3c_errorf("comm: rank %d of %d: recv of %zu bytes from rank %d, which sends %zu", c->rank, g->size,
                          bytes, peer, sent);
    }
    if (bytes) memcpy(buf, src, bytes); /* busy: the sender waits, src stays valid */
    pthread_mutex_lock(&g->mu);
    b->busy = 0;
    b->taken = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return K3C_OK;
}

/* ---- all-to-all ---- */

static int th_all_to_all(k3c_comm *c, const void *send, const size_t *send_bytes, void *recv,
                         const size_t *recv_bytes) {
    k3c_comm_group *g = c->ctx;
    int n = g->size, me = c->rank;
    g->ptr[me] = (void *)send;
    g->sc[me] = send_bytes;
    g->rc[me] = recv_bytes;
    K3C_TRY(barrier_wait(g, me, "all_to_all"));
    /* every rank checks every pair, so each one names the mismatch itself; all of them find the same one and
     * meet once more before failing, since the counts are read where their owners keep them */
    int bs = -1, bd = -1;
    size_t bsent = 0, bwant = 0;
    for (int s = 0; s < n && bs < 0; s++)
        for (int d = 0; d < n; d++)
            if (g->sc[s][d] != g->rc[d][s]) {
                bs = s, bd = d, bsent = g->sc[s][d], bwant = g->rc[d][s];
                break;
            }
    if (bs >= 0) {
        K3C_TRY(barrier_wait(g, me, "all_to_all"));
        group_fail(g);
        return k3c_errorf("comm: rank %d of %d: all_to_all: rank %d sends %zu bytes to rank %d, which expects %zu", me,
                          n, bs, bsent, bd, bwant);
    }
    size_t at = 0;
    for (int s = 0; s < n; s++) {
        size_t off = 0; /* where sender s's part for this rank starts in its buffer */
        for (int d = 0; d < me; d++) off += g->sc[s][d];
        if (recv_bytes[s]) memcpy((char *)recv + at, (const char *)g->ptr[s] + off, recv_bytes[s]);
        at += recv_bytes[s];
    }
    return barrier_wait(g, me, "all_to_all");
}

/* ---- split ---- */

static int th_split(k3c_comm *c, int color, int key, k3c_comm **out) {
    k3c_comm_group *g = c->ctx;
    int n = g->size, me = c->rank;
    *out = NULL;
    g->color[me] = color;
    g->key[me] = key;
    K3C_TRY(barrier_wait(g, me, "split"));
    /* the lowest rank of each color makes its group and tells its members where they are */
    int lead = color >= 0;
    for (int r = 0; r < me && lead; r++) lead = g->color[r] != color;
    int bad = 0;
    if (lead) {
        int m = 0;
        for (int r = 0; r < n; r++) m += g->color[r] == color;
        k3c_comm_group *s = NULL;
        bad = group_new(m, g->timeout_ms, g->fam, &s) != K3C_OK;
        for (int r = 0; r < n; r++) {
            if (g->color[r] != color) continue;
            int rank = 0; /* ranked by (key, rank) */
            for (int q = 0; q < n; q++)
                if (g->color[q] == color && (g->key[q] < g->key[r] || (g->key[q] == g->key[r] && q < r))) rank++;
            g->sub[r] = s;
            g->sub_rank[r] = rank;
        }
        if (bad) group_fail(g);
    }
    if (barrier_wait(g, me, "split") != K3C_OK) {
        if (lead && !bad && g->sub[me]) k3c_comm_group_free(g->sub[me]);
        return bad ? k3c_error_context("comm: rank %d of %d: split: ", me, n) : K3C_ERR;
    }
    int rc = color < 0 ? K3C_OK : k3c_comm_group_join(g->sub[me], g->sub_rank[me], out);
    /* every member joined before any returns: a member's free must not end the group before another joins */
    if (barrier_wait(g, me, "split") != K3C_OK) {
        if (*out) (*out)->free(*out);
        *out = NULL;
        return K3C_ERR;
    }
    return rc;
}

/* ---- lifetime ---- */

static void group_destroy(k3c_comm_group *g) {
    family *f = g->fam;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->n; i++)
        if (f->groups[i] == g) {
            f->groups[i] = f->groups[--f->n];
            break;
        }
    int last = f->n == 0;
    pthread_mutex_unlock(&f->mu);
    if (last) {
        pthread_mutex_destroy(&f->mu);
        free(f->groups);
        free(f);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->ptr);
    free(g->bytes);
    free(g->sc);
    free(g->rc);
    free(g->color);
    free(g->key);
    free(g->sub);
    free(g->sub_rank);
    free(g->box);
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

/* A group of size ranks in family fam (NULL: a new family, a world). */
static int group_new(int size, int timeout_ms, family *fam, k3c_comm_group **out) {
    *out = NULL;
    if (size < 1 || size > 4096) return k3c_errorf("comm group: %d ranks (1 .. 4096)", size);
    if (timeout_ms < 0) return k3c_errorf("comm group: timeout %d ms", timeout_ms);
    k3c_comm_group *g = calloc(1, sizeof *g);
    family *f = fam ? fam : calloc(1, sizeof *f);
    if (!g || !f) {
        free(g);
        if (!fam) free(f);
        return k3c_errorf_kind(K3C_ERROR_OOM, "comm group: out of memory");
    }
    size_t n = (size_t)size;
    g->size = size;
    g->timeout_ms = timeout_ms ? timeout_ms : 60000;
    g->ptr = calloc(n, sizeof *g->ptr);
    g->bytes = calloc(n, sizeof *g->bytes);
    g->sc = calloc(n, sizeof *g->sc);
    g->rc = calloc(n, sizeof *g->rc);
    g->color = calloc(n, sizeof *g->color);
    g->key = calloc(n, sizeof *g->key);
    g->sub = calloc(n, sizeof *g->sub);
    g->sub_rank = calloc(n, sizeof *g->sub_rank);
    g->box = calloc(n * n, sizeof *g->box);
    g->comms = calloc(n, sizeof *g->comms);
    g->taken = calloc(n, 1);
    int bad = !g->ptr || !g->bytes || !g->sc || !g->rc || !g->color || !g->key || !g->sub || !g->sub_rank ||
              !g->box || !g->comms || !g->taken;
    if (!fam && !bad) {
        pthread_mutex_init(&f->mu, NULL);
        f->groups = NULL;
    }
    if (!bad) {
        pthread_mutex_lock(&f->mu);
        if (f->n == f->cap) {
            int cap = f->cap ? 2 * f->cap : 8;
            k3c_comm_group **gs = realloc(f->groups, (size_t)cap * sizeof *gs);
            if (gs) f->groups = gs, f->cap = cap;
            else bad = 1;
        }
        if (!bad) f->groups[f->n++] = g;
        pthread_mutex_unlock(&f->mu);
    }
    if (bad) {
        free(g->ptr), free(g->bytes), free(g->sc), free(g->rc), free(g->color), free(g->key), free(g->sub);
        free(g->sub_rank), free(g->box), free(g->comms), free(g->taken), free(g);
        if (!fam) {
            pthread_mutex_destroy(&f->mu);
            free(f->groups);
            free(f);
        }
        return k3c_errorf_kind(K3C_ERROR_OOM, "comm group: out of memory");
    }
    g->fam = f;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return K3C_OK;
}

int k3c_comm_group_create(int size, int timeout_ms, k3c_comm_group **out) {
    return group_new(size, timeout_ms, NULL, out);
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
    g->comms[rank] = (k3c_comm){.name = "threads", .rank = rank, .size = g->size, .ctx = g,
                                .all_reduce_f32 = th_all_reduce, .all_gather = th_all_gather,
                                .broadcast = th_broadcast, .barrier = th_barrier, .abort = th_abort, .free = th_free,
                                .send = th_send, .recv = th_recv, .all_to_all = th_all_to_all, .split = th_split};
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
