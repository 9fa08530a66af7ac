/* Per-op GPU time of the stock path; see op_profile.h. */
#ifdef K3C_HAVE_CUDA /* the whole file */
#include "cuda/op_profile.h"

#include <stdlib.h>
#include <string.h>

#define PROF_SLOTS 8192 /* timed calls per sync interval (a K3 step makes ~40 per layer) */
#define PROF_NAMES 128

typedef struct prof_total {
    const char *op; /* a string literal of backend_cuda.c */
    double ms;
    long calls;
} prof_total;

struct k3c_op_profile {
    cudaEvent_t *ev; /* [2 * PROF_SLOTS]: begin, end */
    const char **op; /* [PROF_SLOTS] */
    int used, dropped;
    prof_total tot[PROF_NAMES];
    int ntot;
};

k3c_op_profile *k3c_op_profile_create_from_env(void) {
    const char *v = getenv("K3C_CUDA_PROFILE");
    if (!v || !atoi(v)) return NULL;
    k3c_op_profile *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ev = calloc(2 * PROF_SLOTS, sizeof *p->ev);
    p->op = calloc(PROF_SLOTS, sizeof *p->op);
    int ok = p->ev && p->op;
    for (int i = 0; ok && i < 2 * PROF_SLOTS; i++) ok = cudaEventCreate(&p->ev[i]) == cudaSuccess;
    if (!ok) {
        fprintf(stderr, "k3c: K3C_CUDA_PROFILE: cannot create the event pool; profiling off\n");
        k3c_op_profile_free(p);
        return NULL;
    }
    return p;
}

void k3c_op_profile_free(k3c_op_profile *p) {
    if (!p) return;
    for (int i = 0; p->ev && i < 2 * PROF_SLOTS; i++)
        if (p->ev[i]) cudaEventDestroy(p->ev[i]);
    free(p->ev);
    free(p->op);
    free(p);
}

int k3c_op_profile_begin(k3c_op_profile *p, const char *op, cudaStream_t s) {
    if (!p) return -1;
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) return -1;
    if (p->used >= PROF_SLOTS) {
        p->dropped++;
        return -1;
    }
    int slot = p->used++;
    p->op[slot] = op;
    cudaEventRecord(p->ev[2 * slot], s);
    return slot;
}

void k3c_op_profile_end(k3c_op_profile *p, int slot, cudaStream_t s) {
    if (p && slot >= 0) cudaEventRecord(p->ev[2 * slot + 1], s);
}

void k3c_op_profile_collect(k3c_op_profile *p) {
    if (!p) return;
    for (int i = 0; i < p->used; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) != cudaSuccess) continue;
        int t = 0;
        while (t < p->ntot && strcmp(p->tot[t].op, p->op[i])) t++;
        if (t == p->ntot) {
            if (p->ntot == PROF_NAMES) continue;
            p->tot[p->ntot++] = (prof_total){.op = p->op[i]};
        }
        p->tot[t].ms += ms;
        p->tot[t].calls++;
    }
    p->used = 0;
}

void k3c_op_profile_reset(k3c_op_profile *p) {
    if (!p) return;
    p->ntot = 0;
    p->used = 0;
    p->dropped = 0;
}

static int by_ms(const void *a, const void *b) {
    double x = ((const prof_total *)a)->ms, y = ((const prof_total *)b)->ms;
    return (x < y) - (x > y);
}

void k3c_op_profile_report(const k3c_op_profile *p, FILE *f, double step_ms) {
    if (!p) return;
    prof_total t[PROF_NAMES];
    double sum = 0;
    memcpy(t, p->tot, sizeof(prof_total) * (size_t)p->ntot);
    qsort(t, (size_t)p->ntot, sizeof *t, by_ms);
    for (int i = 0; i < p->ntot; i++) sum += t[i].ms;
    for (int i = 0; i < p->ntot; i++)
        fprintf(f, "PROF %-28s %6ld calls %10.1f us %6.1f%%\n", t[i].op, t[i].calls, t[i].ms * 1e3,
                sum > 0 ? 100 * t[i].ms / sum : 0);
    if (step_ms > 0)
        fprintf(f, "PROF sum of ops %.3f ms of a %.3f ms step (the rest: launch gaps, host work)%s\n", sum, step_ms,
                p->dropped ? " (some calls not timed: pool full)" : "");
}

#endif
