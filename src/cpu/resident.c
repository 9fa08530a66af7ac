/* Faulting the mapped weights in; see resident.h. */
#define _GNU_SOURCE /* MADV_POPULATE_READ */
#include "cpu/resident.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "model/model.h"
#include "util/error.h"

/* Page-aligned pieces of the weights, a few per thread and small enough to balance. */
#define RESIDENT_PIECE ((size_t)4 << 20)

typedef struct piece {
    uintptr_t lo, hi; /* page-aligned: whole pages of the mapping (a tensor's first and last page are mapped) */
} piece;

typedef struct resident_job {
    const piece *pieces;
    size_t page;
    volatile uint8_t sink;
} resident_job;

static void fault_in(void *ctx, int begin, int end) {
    resident_job *j = ctx;
    uint8_t acc = 0;
    for (int i = begin; i < end; i++) {
        const piece *p = &j->pieces[i];
#ifdef MADV_POPULATE_READ
        /* one call maps every page of the piece (Linux 5.14+); older kernels say EINVAL and get the loop */
        if (madvise((void *)p->lo, p->hi - p->lo, MADV_POPULATE_READ) == 0) continue;
#endif
        for (uintptr_t a = p->lo; a < p->hi; a += j->page) acc ^= *(const volatile uint8_t *)a;
    }
    j->sink ^= acc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int k3c_cpu_make_resident(k3c_pool *pool, const struct k3c_model *m, uint64_t *bytes, double *seconds) {
    double t0 = now_s();
    const k3c_inventory *inv = &m->inventory;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 0, cap = 0;
    piece *pc = NULL;
    *bytes = 0;
    for (size_t i = 0; i < inv->count; i++) {
        const k3c_tensor_spec *s = &inv->specs[i];
        const void *p = s->cls == K3C_TENSOR_MATRIX          ? (s->mat ? (const void *)s->mat->w : NULL)
                        : s->cls == K3C_TENSOR_MXFP4_PACKED ? (s->mx ? (const void *)s->mx->packed : NULL)
                        : s->cls == K3C_TENSOR_MXFP4_SCALE  ? (s->mx ? (const void *)s->mx->scale : NULL)
                                                            : NULL; /* vectors: owned f32 copies */
        uint64_t b = k3c_tensor_spec_bytes(s);
        if (!p || !b) continue;
        *bytes += b;
        uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(page - 1), end = ((uintptr_t)p + b + page - 1) & ~(uintptr_t)(page - 1);
        if (n && lo >= pc[n - 1].lo && lo <= pc[n - 1].hi && end > pc[n - 1].hi &&
            pc[n - 1].hi - pc[n - 1].lo < RESIDENT_PIECE) { /* continues the last piece (adjacent tensors) */
            uintptr_t top = pc[n - 1].lo + RESIDENT_PIECE;
            pc[n - 1].hi = end < top ? end : top;
            lo = pc[n - 1].hi;
        }
        for (; lo < end; lo += RESIDENT_PIECE) {
            if (n == cap) {
                piece *q = realloc(pc, (cap = cap ? 2 * cap : 256) * sizeof *pc);
                if (!q) {
                    free(pc);
                    return k3c_errorf("cpu backend: out of memory listing %zu pieces of the weights", n);
                }
                pc = q;
            }
            pc[n++] = (piece){lo, end - lo < RESIDENT_PIECE ? end : lo + RESIDENT_PIECE};
        }
    }
    if (n > (size_t)INT32_MAX) {
        free(pc);
        return k3c_errorf("cpu backend: %zu pieces of weights to fault in, more than %d", n, INT32_MAX);
    }
    resident_job j = {.pieces = pc, .page = page};
    if (n) k3c_pool_for(pool, (int)n, fault_in, &j);
    free(pc);
    *seconds = now_s() - t0;
    return K3C_OK;
}
