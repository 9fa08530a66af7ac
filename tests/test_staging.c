/* util/staging: the plan and the run of staged copies, against a destination image built from the extents
 * alone (each extent's bytes at its offset, the gaps shorter than merge_gap zero, everything else untouched),
 * with a fake copy engine: copies queued in a FIFO and executed in order, as late as the ops allow (at
 * wait), or earlier at random, so that a buffer refilled before its copy completed shows as wrong bytes. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/staging.h"

#define POISON 0xA5

static size_t rnd(k3c_rng *r, size_t n) { return n ? (size_t)(k3c_rng_next(r) % n) : 0; }

/* n extents of odd sizes (empty, 1 byte, short, a few buffers long) and gaps (none, padding, far), their
 * sources anywhere in pool (overlapping sources are fine: sources are only read). */
typedef struct layout {
    k3c_stage_extent *ex;
    size_t n;
    uint8_t *pool;
    size_t pool_bytes;
    uint64_t dst_bytes;
} layout;

static void layout_free(layout *l) {
    free(l->ex);
    free(l->pool);
    memset(l, 0, sizeof *l);
}

static int layout_random(k3c_rng *r, size_t n, size_t buf, size_t gap, layout *l) {
    l->n = n;
    l->pool_bytes = 4 * buf + 4096;
    l->ex = calloc(n, sizeof *l->ex);
    l->pool = malloc(l->pool_bytes);
    if (!l->ex || !l->pool) return -1;
    for (size_t i = 0; i < l->pool_bytes; i++) l->pool[i] = (uint8_t)k3c_rng_next(r);
    uint64_t at = rnd(r, 3);
    for (size_t i = 0; i < n; i++) {
        size_t kind = rnd(r, 10), bytes;
        if (kind == 0) bytes = 0;
        else if (kind == 1) bytes = 1;
        else if (kind <= 5) bytes = 1 + rnd(r, 64);
        else if (kind <= 8) bytes = 1 + rnd(r, buf + 7);
        else bytes = buf * (1 + rnd(r, 3)) + rnd(r, 3); /* spans buffers */
        size_t g = rnd(r, 4);
        at += g == 0 ? 0 : g == 1 ? 1 + rnd(r, gap ? gap - 1 : 1) : g == 2 ? gap + rnd(r, 50) : rnd(r, 2);
        l->ex[i] = (k3c_stage_extent){.dst = at, .src = l->pool + rnd(r, l->pool_bytes - bytes), .bytes = bytes};
        at += bytes;
    }
    l->dst_bytes = at + 16;
    return 0;
}

/* The destination as the spec says it must end: extents' bytes at their offsets; between two consecutive
 * non-empty extents a gap shorter than merge_gap is zeros; the rest keeps POISON. writes: how many times
 * each byte must be written (1 or 0). */
static void expected_image(const layout *l, size_t gap, uint8_t *img, uint8_t *writes) {
    memset(img, POISON, l->dst_bytes);
    memset(writes, 0, l->dst_bytes);
    const k3c_stage_extent *prev = NULL;
    for (size_t i = 0; i < l->n; i++) {
        const k3c_stage_extent *e = &l->ex[i];
        if (!e->bytes) continue;
        if (prev) {
            uint64_t end = prev->dst + prev->bytes;
            if (e->dst > end && e->dst - end < gap) {
                memset(img + end, 0, e->dst - end);
                memset(writes + end, 1, e->dst - end);
            }
        }
        memcpy(img + e->dst, e->src, e->bytes);
        memset(writes + e->dst, 1, e->bytes);
        prev = e;
    }
}

/* ---- the plan alone ---- */

/* Replays a plan serially (each slot: its segments into one buffer, then its copies out of it) and checks
 * its invariants on the way. */
static int replay(const k3c_stage_plan *p, uint8_t *dst, uint8_t *writes, uint64_t dst_bytes, char *why,
                  size_t why_n) {
    uint8_t *buf = malloc(p->buf_bytes);
    if (!buf) return snprintf(why, why_n, "out of memory"), -1;
    uint64_t payload = 0, zeros = 0, next_dst = 0;
    size_t segs = 0, copies = 0, done = 0;
    for (size_t s = 0; s < p->nslots; s++) {
        const k3c_stage_slot *sl = &p->slots[s];
        memset(buf, 0x5A, p->buf_bytes);
        if (sl->fill == 0 || sl->fill > p->buf_bytes || sl->seg0 != segs || sl->copy0 != copies || sl->done0 != done)
            return free(buf), snprintf(why, why_n, "slot %zu: fill %zu of %zu, seg0 %zu, copy0 %zu", s, sl->fill,
                                       p->buf_bytes, sl->seg0, sl->copy0), -1;
        size_t at = 0;
        for (size_t i = sl->seg0; i < sl->seg0 + sl->nseg; i++) {
            const k3c_stage_seg *g = &p->segs[i];
            if (g->buf_off != at || g->bytes == 0)
                return free(buf), snprintf(why, why_n, "slot %zu seg %zu at %zu, expected %zu", s, i, g->buf_off,
                                           at), -1;
            if (g->src) memcpy(buf + at, g->src, g->bytes), payload += g->bytes;
            else memset(buf + at, 0, g->bytes), zeros += g->bytes;
            at += g->bytes;
        }
        if (at != sl->fill) return free(buf), snprintf(why, why_n, "slot %zu: segments end at %zu", s, at), -1;
        at = 0;
        for (size_t i = sl->copy0; i < sl->copy0 + sl->ncopy; i++) {
            const k3c_stage_copy *c = &p->copies[i];
            if (c->buf_off != at || c->bytes == 0 || c->dst < next_dst || c->dst + c->bytes > dst_bytes)
                return free(buf), snprintf(why, why_n, "slot %zu copy %zu: buf %zu (expected %zu), dst %llu", s, i,
                                           c->buf_off, at, (unsigned long long)c->dst), -1;
            memcpy(dst + c->dst, buf + c->buf_off, c->bytes);
            for (size_t b = 0; b < c->bytes; b++) writes[c->dst + b]++;
            next_dst = c->dst + c->bytes;
            at += c->bytes;
        }
        if (at != sl->fill) return free(buf), snprintf(why, why_n, "slot %zu: copies end at %zu", s, at), -1;
        segs += sl->nseg;
        copies += sl->ncopy;
        done += sl->ndone;
    }
    free(buf);
    if (segs != p->nsegs || copies != p->ncopies || done != p->ndone || payload != p->payload || zeros != p->zero_bytes)
        return snprintf(why, why_n, "totals: %zu/%zu segs, %zu/%zu copies, %llu/%llu payload", segs, p->nsegs,
                        copies, p->ncopies, (unsigned long long)payload, (unsigned long long)p->payload), -1;
    return 0;
}

TEST(staging_plan_odd_sizes) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x57a9e);
    for (int round = 0; round < 60; round++) {
        size_t buf = 1 + rnd(&r, round < 5 ? 3 : 3000), gap = round % 3 == 0 ? 0 : 1 + rnd(&r, 300);
        layout l;
        CHECK(layout_random(&r, 1 + rnd(&r, 300), buf, gap, &l) == 0);
        uint8_t *want = malloc(l.dst_bytes), *want_w = malloc(l.dst_bytes);
        uint8_t *got = malloc(l.dst_bytes), *got_w = calloc(l.dst_bytes, 1);
        CHECK(want && want_w && got && got_w);
        expected_image(&l, gap, want, want_w);
        memset(got, POISON, l.dst_bytes);
        k3c_stage_plan p;
        CHECK_OK(k3c_stage_plan_build(l.ex, l.n, buf, gap, &p));
        char why[256] = "";
        CHECKF(replay(&p, got, got_w, l.dst_bytes, why, sizeof why) == 0, "round %d (buf %zu): %s", round, buf, why);
        size_t bad = 0, first = 0;
        for (uint64_t i = 0; i < l.dst_bytes; i++)
            if (got[i] != want[i] || got_w[i] != want_w[i]) first = bad++ ? first : (size_t)i;
        CHECKF(bad == 0, "round %d (buf %zu, gap %zu, %zu extents): %zu bytes wrong or not written once, the first "
               "at %zu", round, buf, gap, l.n, bad, first);
        /* every non-empty extent done once, in order, in the slot that holds its last byte */
        size_t k = 0;
        for (size_t i = 0; i < l.n; i++) {
            if (!l.ex[i].bytes) continue;
            CHECKF(k < p.ndone && p.done[k] == i, "round %d: done[%zu] is not extent %zu", round, k, i);
            k++;
        }
        CHECK(k == p.ndone);
        for (size_t s = 0, d = 0; s < p.nslots; s++)
            for (size_t j = 0; j < p.slots[s].ndone; j++, d++) {
                const k3c_stage_extent *e = &l.ex[p.done[d]];
                const k3c_stage_copy *c = &p.copies[p.slots[s].copy0 + p.slots[s].ncopy - 1];
                CHECKF(e->dst + e->bytes <= c->dst + c->bytes && e->dst + e->bytes > p.copies[p.slots[s].copy0].dst,
                       "round %d: extent %zu marked done in slot %zu, which does not hold its last byte", round,
                       p.done[d], s);
            }
        k3c_stage_plan_free(&p);
        free(want), free(want_w), free(got), free(got_w);
        layout_free(&l);
    }
}

/* Tensors laid out as an arena lays them (each at the next multiple of 256): one copy per slot, whatever
 * the number of tensors, and the slots as many as the span needs. */
TEST(staging_plan_one_copy_per_slot) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x1c0b7);
    size_t n = 5000, buf = 64 << 10;
    k3c_stage_extent *ex = calloc(n, sizeof *ex);
    uint8_t src[4096];
    CHECK(ex);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = 1 + rnd(&r, sizeof src);
        ex[i] = (k3c_stage_extent){.dst = at, .src = src, .bytes = b};
        at = (at + b + 255) & ~(uint64_t)255;
    }
    uint64_t span = ex[n - 1].dst + ex[n - 1].bytes;
    k3c_stage_plan p;
    CHECK_OK(k3c_stage_plan_build(ex, n, buf, 256, &p));
    CHECKF(p.nslots == (span + buf - 1) / buf, "%zu slots for %llu bytes in buffers of %zu", p.nslots,
           (unsigned long long)span, buf);
    for (size_t s = 0; s < p.nslots; s++) CHECKF(p.slots[s].ncopy == 1, "slot %zu: %zu copies", s, p.slots[s].ncopy);
    CHECK(p.ndone == n);
    k3c_stage_plan_free(&p);
    free(ex);
}

TEST(staging_plan_refuses_overlap) {
    uint8_t src[64] = {0};
    k3c_stage_extent ex[3] = {{0, src, 10}, {10, src, 5}, {12, src, 4}};
    k3c_stage_plan p;
    k3c_error_clear();
    CHECK(k3c_stage_plan_build(ex, 3, 8, 0, &p) == K3C_ERR);
    CHECKF(strstr(k3c_error_message(), "extent 2 starts at 12, before the end 15 of extent 1"), "message: %s",
           k3c_error_message());
    CHECK(p.nslots == 0 && p.slots == NULL);
    k3c_stage_extent unsorted[2] = {{100, src, 1}, {50, src, 1}};
    CHECK(k3c_stage_plan_build(unsorted, 2, 8, 0, &p) == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "extent 1 starts at 50") != NULL);
}

/* ---- runs with a fake copy engine ---- */

typedef struct fake_copy {
    const uint8_t *src;
    uint64_t dst;
    size_t bytes;
} fake_copy;

typedef struct fake {
    pthread_t caller;
    k3c_rng r;
    uint8_t *const *bufs;
    size_t buf_bytes;
    int nbuf;
    uint8_t *dst, *writes, *queued_cnt;
    uint64_t dst_bytes;
    fake_copy *fifo; /* queued copies; [head, tail) not executed yet */
    size_t head, tail, cap;
    size_t mark[16]; /* per buffer: the FIFO position after its last marked copy */
    uint64_t next_dst, queued;
    const layout *l;
    size_t next_done;
    int fail_at, calls, waits;
    char bad[256];
} fake;

static void fail(fake *f, const char *msg) {
    if (!f->bad[0]) snprintf(f->bad, sizeof f->bad, "%s", msg);
}

static void execute(fake *f, size_t upto) {
    while (f->head < upto) {
        const fake_copy *c = &f->fifo[f->head++];
        memcpy(f->dst + c->dst, c->src, c->bytes);
        for (size_t b = 0; b < c->bytes; b++) f->writes[c->dst + b]++;
    }
}

/* now and then the engine runs ahead */
static void drift(fake *f) {
    if (rnd(&f->r, 3) == 0) execute(f, f->head + rnd(&f->r, f->tail - f->head + 1));
}

static int fake_call(fake *f) {
    if (!pthread_equal(pthread_self(), f->caller)) fail(f, "an op was called off the calling thread");
    if (f->fail_at && ++f->calls == f->fail_at) return k3c_errorf("fake copy engine: failure at call %d", f->calls);
    return K3C_OK;
}

static int fake_copy_op(void *ctx, int buf, const uint8_t *src, uint64_t dst, size_t bytes) {
    fake *f = ctx;
    K3C_TRY(fake_call(f));
    if (buf < 0 || buf >= f->nbuf || src < f->bufs[buf] || src + bytes > f->bufs[buf] + f->buf_bytes || !bytes)
        fail(f, "a copy outside its buffer");
    if (dst < f->next_dst || dst + bytes > f->dst_bytes) fail(f, "a copy out of destination order or range");
    f->next_dst = dst + bytes;
    for (size_t b = 0; b < bytes && dst + bytes <= f->dst_bytes; b++) f->queued_cnt[dst + b]++;
    if (f->tail == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 256;
        f->fifo = realloc(f->fifo, f->cap * sizeof *f->fifo);
    }
    f->fifo[f->tail++] = (fake_copy){src, dst, bytes};
    drift(f);
    return K3C_OK;
}

static int fake_mark(void *ctx, int buf) {
    fake *f = ctx;
    K3C_TRY(fake_call(f));
    f->mark[buf] = f->tail;
    return K3C_OK;
}

static int fake_wait(void *ctx, int buf) {
    fake *f = ctx;
    f->waits++;
    K3C_TRY(fake_call(f));
    execute(f, f->mark[buf] > f->head ? f->mark[buf] : f->head);
    return K3C_OK;
}

static int fake_done(void *ctx, size_t i) {
    fake *f = ctx;
    K3C_TRY(fake_call(f));
    while (f->next_done < f->l->n && !f->l->ex[f->next_done].bytes) f->next_done++;
    if (i != f->next_done++) fail(f, "extent_done out of order");
    const k3c_stage_extent *e = &f->l->ex[i];
    for (size_t b = 0; b < e->bytes; b++)
        if (f->queued_cnt[e->dst + b] != 1) fail(f, "extent_done before all its bytes were queued");
    drift(f);
    return K3C_OK;
}

static void fake_queued(void *ctx, uint64_t bytes) {
    fake *f = ctx;
    if (bytes < f->queued) fail(f, "queued bytes went down");
    f->queued = bytes;
}

TEST(staging_run_fake_engine) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x4ead);
    static const int readers[] = {0, 1, 2, 3, 8};
    for (int round = 0; round < 40; round++) {
        size_t buf = 1 + rnd(&r, round < 4 ? 5 : 4000), gap = rnd(&r, 2) ? 256 : rnd(&r, 40);
        int nbuf = 1 + (int)rnd(&r, 5), nr = readers[round % 5];
        size_t piece = 1 + rnd(&r, 2 * buf);
        layout l;
        CHECK(layout_random(&r, 1 + rnd(&r, 400), buf, gap, &l) == 0);
        uint8_t *want = malloc(l.dst_bytes), *want_w = malloc(l.dst_bytes);
        uint8_t **bufs = calloc((size_t)nbuf, sizeof *bufs);
        fake f = {.caller = pthread_self(), .buf_bytes = buf, .nbuf = nbuf, .dst_bytes = l.dst_bytes, .l = &l};
        k3c_rng_seed(&f.r, k3c_rng_next(&r));
        f.dst = malloc(l.dst_bytes);
        f.writes = calloc(l.dst_bytes, 1);
        f.queued_cnt = calloc(l.dst_bytes, 1);
        CHECK(want && want_w && bufs && f.dst && f.writes && f.queued_cnt);
        for (int b = 0; b < nbuf; b++) CHECK((bufs[b] = malloc(buf)) != NULL);
        f.bufs = bufs;
        expected_image(&l, gap, want, want_w);
        memset(f.dst, POISON, l.dst_bytes);
        k3c_stage_plan p;
        CHECK_OK(k3c_stage_plan_build(l.ex, l.n, buf, gap, &p));
        k3c_stage_ops ops = {&f, fake_copy_op, fake_mark, fake_wait, fake_done, fake_queued};
        k3c_stage_stats st;
        CHECK_OK(k3c_stage_run(&p, bufs, nbuf, nr, piece, &ops, &st));
        CHECKF(!f.bad[0], "round %d (buf %zu x %d, %d readers, piece %zu): %s", round, buf, nbuf, nr, piece, f.bad);
        CHECKF(f.head == f.tail, "round %d: the run returned with %zu copies not complete", round, f.tail - f.head);
        size_t bad = 0, first = 0;
        for (uint64_t i = 0; i < l.dst_bytes; i++)
            if (f.dst[i] != want[i] || f.writes[i] != want_w[i]) first = bad++ ? first : (size_t)i;
        CHECKF(bad == 0, "round %d (buf %zu x %d, %d readers, piece %zu, %zu slots): %zu bytes wrong or not "
               "written once, the first at %zu", round, buf, nbuf, nr, piece, p.nslots, bad, first);
        CHECK(f.queued == p.payload && st.payload == p.payload && st.slots == p.nslots);
        CHECK(st.readers == nr);
        while (f.next_done < l.n && !l.ex[f.next_done].bytes) f.next_done++;
        CHECKF(f.next_done == l.n, "round %d: extent_done stopped at %zu of %zu", round, f.next_done, l.n);
        k3c_stage_plan_free(&p);
        for (int b = 0; b < nbuf; b++) free(bufs[b]);
        free(bufs), free(want), free(want_w), free(f.dst), free(f.writes), free(f.queued_cnt), free(f.fifo);
        layout_free(&l);
    }
}

/* A failing op ends the run with its message, the readers joined and every marked copy complete (copies
 * queued after the last mark are the caller's to drain, util/staging.h). */
TEST(staging_run_copy_error) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xe770);
    for (int fail_at = 1; fail_at < 40; fail_at += 3) {
        layout l;
        size_t buf = 100;
        CHECK(layout_random(&r, 200, buf, 16, &l) == 0);
        uint8_t *bufs[3];
        for (int b = 0; b < 3; b++) CHECK((bufs[b] = malloc(buf)) != NULL);
        fake f = {.caller = pthread_self(), .bufs = bufs, .buf_bytes = buf, .nbuf = 3, .dst_bytes = l.dst_bytes,
                  .l = &l, .fail_at = fail_at};
        k3c_rng_seed(&f.r, k3c_rng_next(&r));
        f.dst = malloc(l.dst_bytes);
        f.writes = calloc(l.dst_bytes, 1);
        f.queued_cnt = calloc(l.dst_bytes, 1);
        k3c_stage_plan p;
        CHECK_OK(k3c_stage_plan_build(l.ex, l.n, buf, 16, &p));
        k3c_stage_ops ops = {&f, fake_copy_op, fake_mark, fake_wait, fake_done, NULL};
        k3c_error_clear();
        CHECK(k3c_stage_run(&p, bufs, 3, 4, 7, &ops, NULL) == K3C_ERR);
        char want[64];
        snprintf(want, sizeof want, "failure at call %d", fail_at);
        CHECKF(strstr(k3c_error_message(), want), "message: %s", k3c_error_message());
        size_t marked = 0;
        for (int b = 0; b < 3; b++) marked = f.mark[b] > marked ? f.mark[b] : marked;
        CHECKF(f.head >= marked, "fail_at %d: %zu marked copies left running", fail_at, marked - f.head);
        k3c_stage_plan_free(&p);
        for (int b = 0; b < 3; b++) free(bufs[b]);
        free(f.dst), free(f.writes), free(f.queued_cnt), free(f.fifo);
        layout_free(&l);
    }
}
