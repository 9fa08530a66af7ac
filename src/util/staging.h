/* Staged copies: host bytes (mapped checkpoint tensors, small owned arrays) into a destination that only a
 * copy engine writes (GPU memory), through a few host staging buffers that are allocated once. Planning is
 * apart from running, so that the arithmetic of the plan and the order of the run are tested on the CPU with
 * a fake copy (tests/test_staging.c); cuda/upload.c runs it with pinned buffers, one stream and events.
 *
 * Plan: the extents (destination offset, source, bytes), sorted by destination, are laid end to end into
 * slots of buf_bytes; slot s goes through buffer s % nbuf. A slot's segments say which source bytes land
 * where in its buffer, its copies which buffer ranges go where in the destination. Two extents whose gap is
 * shorter than merge_gap (alignment padding) share a copy, the gap written as zeros, so a slot is normally
 * one copy whatever the number of tensors in it (K3 has ~500k). An extent of 0 bytes is not planned.
 *
 * Run: reader threads fill the slots in order, in pieces of at most `piece` bytes claimed one at a time (a
 * piece of any slot whose buffer is free: several slots fill at once). The calling thread queues each
 * filled slot's copies (ops->copy), in slot order, then marks its buffer (ops->mark); a buffer is refilled
 * only after ops->wait says the copies marked on it are complete. When it returns every copy is complete. */
#ifndef K3C_UTIL_STAGING_H
#define K3C_UTIL_STAGING_H

#include <stddef.h>
#include <stdint.h>

typedef struct k3c_stage_extent {
    uint64_t dst;    /* byte offset in the destination */
    const void *src; /* host bytes */
    size_t bytes;
} k3c_stage_extent;

typedef struct k3c_stage_seg {
    size_t buf_off;     /* where in the slot's buffer */
    size_t bytes;
    const uint8_t *src; /* source bytes, or NULL: zeros (a gap inside a copy) */
} k3c_stage_seg;

typedef struct k3c_stage_copy {
    size_t buf_off; /* buffer bytes [buf_off, buf_off + bytes) ... */
    size_t bytes;
    uint64_t dst;   /* ... go to destination bytes [dst, dst + bytes) */
} k3c_stage_copy;

typedef struct k3c_stage_slot {
    size_t seg0, nseg;   /* its segments: sorted, covering [0, fill) end to end */
    size_t copy0, ncopy; /* its copies: sorted, covering [0, fill) end to end */
    size_t done0, ndone; /* entries of plan.done: the extents whose last byte is in this slot */
    size_t fill;         /* buffer bytes used, 1..buf_bytes */
    uint64_t payload;    /* extent bytes among them (the rest are gap zeros) */
} k3c_stage_slot;

typedef struct k3c_stage_plan {
    size_t buf_bytes;
    k3c_stage_slot *slots;
    size_t nslots;
    k3c_stage_seg *segs;
    size_t nsegs;
    k3c_stage_copy *copies;
    size_t ncopies;
    size_t *done; /* extent indices, increasing */
    size_t ndone;
    uint64_t payload, zero_bytes;
} k3c_stage_plan;

/* Plans extents ex[0..n) (sorted by dst, not overlapping: otherwise an error naming the extent) for buffers
 * of buf_bytes. */
int k3c_stage_plan_build(const k3c_stage_extent *ex, size_t n, size_t buf_bytes, size_t merge_gap,
                         k3c_stage_plan *out);
void k3c_stage_plan_free(k3c_stage_plan *p);

/* What a run does with the filled buffers. All are called on the thread that called k3c_stage_run. */
typedef struct k3c_stage_ops {
    void *ctx;
    /* queue the copy of bytes at src (inside buffer buf) to destination offset dst; may return before it
     * is done (the buffer is not rewritten before wait(buf)) */
    int (*copy)(void *ctx, int buf, const uint8_t *src, uint64_t dst, size_t bytes);
    int (*mark)(void *ctx, int buf); /* after a slot's copies from buf have been queued */
    int (*wait)(void *ctx, int buf); /* block until every copy marked on buf is complete */
    /* NULL, or: the last copy of extent i has been queued (e.g. queue a conversion of it after it) */
    int (*extent_done)(void *ctx, size_t extent);
    /* NULL, or: payload bytes queued so far, after each slot */
    void (*queued)(void *ctx, uint64_t bytes);
} k3c_stage_ops;

typedef struct k3c_stage_stats {
    uint64_t payload, zero_bytes;
    size_t slots, copies;
    int readers, buffers; /* as run (readers: threads that started; 0: the caller filled the buffers) */
    double seconds;       /* the whole run: start of the first fill to the last copy complete */
    double wait_fill_s;   /* the caller waiting for readers to fill a slot */
    double wait_copy_s;   /* the caller in ops->wait (copies not done yet) */
} k3c_stage_stats;

/* Runs plan p through bufs[0..nbuf) (each of p->buf_bytes) with `readers` threads (0: the caller fills
 * each slot itself before queueing it) and pieces of `piece` bytes (0: 2 MiB). On an error of an op it
 * stops the readers, waits for the marked copies and returns K3C_ERR with that op's message; copies queued
 * after the last mark (an error in mark or extent_done) may still run: drain the engine before freeing. */
int k3c_stage_run(const k3c_stage_plan *p, uint8_t *const *bufs, int nbuf, int readers, size_t piece,
                  const k3c_stage_ops *ops, k3c_stage_stats *stats);

/* Reader threads for a load: min(8, the cores this process may run on). */
int k3c_stage_default_readers(void);

#endif
