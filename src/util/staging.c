/* Staged copies (util/staging.h): the plan, and the run's readers and queueing. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "util/staging.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"

/* ---- plan ---- */

typedef struct builder {
    k3c_stage_plan *p;
    size_t cap_slots, cap_segs, cap_copies, cap_done;
    int oom;
} builder;

static void *grow(void *a, size_t *cap, size_t n, size_t size, int *oom) {
    if (n < *cap) return a;
    size_t c = *cap ? 2 * *cap : 64;
    void *b = realloc(a, c * size);
    if (!b) {
        *oom = 1;
        return NULL;
    }
    *cap = c;
    return b;
}

#define PUSH(bd, arr, n, cap)                                                                                      \
    do {                                                                                                           \
        void *g_ = grow((bd)->p->arr, &(bd)->cap, (bd)->p->n, sizeof *(bd)->p->arr, &(bd)->oom);                   \
        if (!g_) return;                                                                                           \
        (bd)->p->arr = g_;                                                                                         \
        (bd)->p->n++;                                                                                              \
    } while (0)

/* Appends n bytes from src (NULL: zeros) for destination dst to the plan: into the last slot while it has
 * room, continuing its last copy when dst follows it, new slots as needed. */
static void emit(builder *bd, const uint8_t *src, uint64_t dst, size_t n) {
    k3c_stage_plan *p = bd->p;
    while (n > 0 && !bd->oom) {
        if (p->nslots == 0 || p->slots[p->nslots - 1].fill == p->buf_bytes) {
            PUSH(bd, slots, nslots, cap_slots);
            p->slots[p->nslots - 1] = (k3c_stage_slot){.seg0 = p->nsegs, .copy0 = p->ncopies, .done0 = p->ndone};
        }
        k3c_stage_slot *s = &p->slots[p->nslots - 1];
        k3c_stage_copy *last = s->ncopy ? &p->copies[p->ncopies - 1] : NULL;
        if (!last || last->dst + last->bytes != dst) {
            PUSH(bd, copies, ncopies, cap_copies);
            p->copies[p->ncopies - 1] = (k3c_stage_copy){.buf_off = s->fill, .bytes = 0, .dst = dst};
            s->ncopy++;
        }
        size_t take = p->buf_bytes - s->fill < n ? p->buf_bytes - s->fill : n;
        PUSH(bd, segs, nsegs, cap_segs);
        p->segs[p->nsegs - 1] = (k3c_stage_seg){.buf_off = s->fill, .bytes = take, .src = src};
        s->nseg++;
        p->copies[p->ncopies - 1].bytes += take;
        s->fill += take;
        if (src) {
            s->payload += take;
            p->payload += take;
            src += take;
        } else {
            p->zero_bytes += take;
        }
        dst += take;
        n -= take;
    }
}

static void mark_done(builder *bd, size_t extent) {
    k3c_stage_plan *p = bd->p;
    PUSH(bd, done, ndone, cap_done);
    p->done[p->ndone - 1] = extent;
    p->slots[p->nslots - 1].ndone++;
}

int k3c_stage_plan_build(const k3c_stage_extent *ex, size_t n, size_t buf_bytes, size_t merge_gap,
                         k3c_stage_plan *out) {
    memset(out, 0, sizeof *out);
    if (buf_bytes == 0) return k3c_errorf("staging plan: buffers of 0 bytes");
    out->buf_bytes = buf_bytes;
    builder bd = {.p = out};
    uint64_t end = 0; /* destination end of the last planned extent */
    size_t prev = 0;
    int any = 0;
    for (size_t i = 0; i < n && !bd.oom; i++) {
        if (ex[i].bytes == 0) continue;
        if (ex[i].dst + ex[i].bytes < ex[i].dst) {
            k3c_stage_plan_free(out);
            return k3c_errorf("staging plan: extent %zu (%zu bytes at %llu) wraps around", i, ex[i].bytes,
                              (unsigned long long)ex[i].dst);
        }
        if (any && ex[i].dst < end) {
            k3c_stage_plan_free(out);
            return k3c_errorf("staging plan: extent %zu starts at %llu, before the end %llu of extent %zu (extents "
                              "must be sorted by destination and not overlap)",
                              i, (unsigned long long)ex[i].dst, (unsigned long long)end, prev);
        }
        if (any && ex[i].dst > end && ex[i].dst - end < merge_gap) emit(&bd, NULL, end, (size_t)(ex[i].dst - end));
        emit(&bd, ex[i].src, ex[i].dst, ex[i].bytes);
        if (!bd.oom) mark_done(&bd, i);
        end = ex[i].dst + ex[i].bytes;
        prev = i;
        any = 1;
    }
    if (bd.oom) {
        k3c_stage_plan_free(out);
        return k3c_errorf("staging plan: out of memory planning %zu extents", n);
    }
    return K3C_OK;
}

void k3c_stage_plan_free(k3c_stage_plan *p) {
    free(p->slots);
    free(p->segs);
    free(p->copies);
    free(p->done);
    size_t b = p->buf_bytes;
    memset(p, 0, sizeof *p);
    p->buf_bytes = b;
}

/* ---- run ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct run_state {
    const k3c_stage_plan *p;
    uint8_t *const *bufs;
    int nbuf;
    size_t piece;
    pthread_mutex_t mu;
    pthread_cond_t cv_open;   /* readers: more slots open, or stop */
    pthread_cond_t cv_filled; /* the caller: a slot's last piece is filled */
    size_t next_slot, next_piece; /* the next piece to claim */
    size_t open_end;              /* slots below it may be filled (their buffer's earlier copies are done) */
    size_t *left;                 /* per slot: pieces not filled yet */
    int stop;
} run_state;

static size_t slot_pieces(const run_state *r, size_t s) { return (r->p->slots[s].fill + r->piece - 1) / r->piece; }

/* Fills buffer bytes [k * piece, (k + 1) * piece) of slot s from its segments. */
static void fill_piece(const run_state *r, size_t s, size_t k) {
    const k3c_stage_slot *sl = &r->p->slots[s];
    const k3c_stage_seg *seg = r->p->segs + sl->seg0;
    uint8_t *buf = r->bufs[s % (size_t)r->nbuf];
    size_t lo = k * r->piece, hi = lo + r->piece < sl->fill ? lo + r->piece : sl->fill;
    /* the first segment ending past lo */
    size_t a = 0, b = sl->nseg;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (seg[m].buf_off + seg[m].bytes <= lo) a = m + 1;
        else b = m;
    }
    for (size_t i = a; i < sl->nseg && seg[i].buf_off < hi; i++) {
        size_t x = seg[i].buf_off > lo ? seg[i].buf_off : lo;
        size_t y = seg[i].buf_off + seg[i].bytes < hi ? seg[i].buf_off + seg[i].bytes : hi;
        if (seg[i].src) memcpy(buf + x, seg[i].src + (x - seg[i].buf_off), y - x);
        else memset(buf + x, 0, y - x);
    }
}

static void *reader_main(void *arg) {
    run_state *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->stop || r->next_slot >= r->p->nslots) break;
        if (r->next_slot >= r->open_end) {
            pthread_cond_wait(&r->cv_open, &r->mu);
            continue;
        }
        size_t s = r->next_slot, k = r->next_piece++;
        if (r->next_piece == slot_pieces(r, s)) {
            r->next_slot++;
            r->next_piece = 0;
        }
        pthread_mutex_unlock(&r->mu);
        fill_piece(r, s, k);
        pthread_mutex_lock(&r->mu);
        if (--r->left[s] == 0) pthread_cond_signal(&r->cv_filled);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Opens the next slot to the readers: its buffer's previous slot (open_end - nbuf, already queued) must
 * have finished copying. */
static int open_next(run_state *r, const k3c_stage_ops *ops, k3c_stage_stats *st) {
    size_t s = r->open_end;
    if (s >= (size_t)r->nbuf) {
        double t = now_s();
        int rc = ops->wait(ops->ctx, (int)(s % (size_t)r->nbuf));
        st->wait_copy_s += now_s() - t;
        if (rc != K3C_OK) return K3C_ERR;
    }
    pthread_mutex_lock(&r->mu);
    r->open_end = s + 1;
    pthread_cond_broadcast(&r->cv_open);
    pthread_mutex_unlock(&r->mu);
    return K3C_OK;
}

/* Queues slot s: its copies, the mark of its buffer, the extents it completes. */
static int queue_slot(const run_state *r, size_t s, const k3c_stage_ops *ops, uint64_t *queued) {
    const k3c_stage_plan *p = r->p;
    const k3c_stage_slot *sl = &p->slots[s];
    int b = (int)(s % (size_t)r->nbuf);
    for (size_t i = sl->copy0; i < sl->copy0 + sl->ncopy; i++)
        K3C_TRY(ops->copy(ops->ctx, b, r->bufs[b] + p->copies[i].buf_off, p->copies[i].dst, p->copies[i].bytes));
    K3C_TRY(ops->mark(ops->ctx, b));
    for (size_t i = sl->done0; ops->extent_done && i < sl->done0 + sl->ndone; i++)
        K3C_TRY(ops->extent_done(ops->ctx, p->done[i]));
    *queued += sl->payload;
    if (ops->queued) ops->queued(ops->ctx, *queued);
    return K3C_OK;
}

static int run_slots(run_state *r, int readers, const k3c_stage_ops *ops, k3c_stage_stats *st) {
    const size_t n = r->p->nslots, nbuf = (size_t)r->nbuf;
    uint64_t queued = 0;
    for (size_t s = 0; s < n; s++) {
        while (r->open_end <= s) K3C_TRY(open_next(r, ops, st));
        if (readers == 0) {
            for (size_t k = 0; k < slot_pieces(r, s); k++) fill_piece(r, s, k);
        } else {
            double t = now_s();
            pthread_mutex_lock(&r->mu);
            while (r->left[s] > 0) pthread_cond_wait(&r->cv_filled, &r->mu);
            pthread_mutex_unlock(&r->mu);
            st->wait_fill_s += now_s() - t;
        }
        K3C_TRY(queue_slot(r, s, ops, &queued));
        /* Slot s + nbuf - 1 reuses the buffer of slot s - 1: waiting for that copy here (slot s's is queued
         * behind it, so the copy engine stays busy) lets readers start it while slot s copies. */
        while (readers > 0 && r->open_end < n && r->open_end + 1 <= s + nbuf) K3C_TRY(open_next(r, ops, st));
    }
    return K3C_OK;
}

int k3c_stage_run(const k3c_stage_plan *p, uint8_t *const *bufs, int nbuf, int readers, size_t piece,
                  const k3c_stage_ops *ops, k3c_stage_stats *stats) {
    k3c_stage_stats st = {.payload = p->payload, .zero_bytes = p->zero_bytes, .slots = p->nslots,
                          .copies = p->ncopies, .buffers = nbuf};
    if (stats) *stats = st;
    if (nbuf < 1) return k3c_errorf("staging run: %d buffers", nbuf);
    if (readers < 0) readers = 0;
    run_state r = {.p = p, .bufs = bufs, .nbuf = nbuf, .piece = piece ? piece : (size_t)2 << 20};
    r.left = calloc(p->nslots ? p->nslots : 1, sizeof *r.left);
    pthread_t *th = calloc(readers ? (size_t)readers : 1, sizeof *th);
    if (!r.left || !th) {
        free(r.left);
        free(th);
        return k3c_errorf("staging run: out of memory for %zu slots", p->nslots);
    }
    for (size_t s = 0; s < p->nslots; s++) r.left[s] = slot_pieces(&r, s);
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv_open, NULL);
    pthread_cond_init(&r.cv_filled, NULL);
    double t0 = now_s();
    int started = 0;
    while (started < readers && pthread_create(&th[started], NULL, reader_main, &r) == 0) started++;
    st.readers = started;

    int rc = run_slots(&r, started, ops, &st);
    char saved[1024] = "";
    if (rc != K3C_OK) snprintf(saved, sizeof saved, "%s", k3c_error_message());
    pthread_mutex_lock(&r.mu);
    r.stop = 1;
    pthread_cond_broadcast(&r.cv_open);
    pthread_mutex_unlock(&r.mu);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    /* every copy complete before the buffers go back to the caller, also after an error */
    double t = now_s();
    for (int b = 0; b < nbuf && (size_t)b < p->nslots; b++)
        if (ops->wait(ops->ctx, b) != K3C_OK && rc == K3C_OK) rc = K3C_ERR;
    st.wait_copy_s += now_s() - t;
    st.seconds = now_s() - t0;
    if (saved[0]) k3c_errorf("%s", saved);
    pthread_cond_destroy(&r.cv_filled);
    pthread_cond_destroy(&r.cv_open);
    pthread_mutex_destroy(&r.mu);
    free(r.left);
    free(th);
    if (stats) *stats = st;
    return rc;
}

int k3c_stage_default_readers(void) {
    int n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0) n = 1;
    return n < 8 ? n : 8;
}
