/* Per-op GPU time of the stock path; see op_profile.h. */
#ifdef K3C_HAVE_CUDA /* the whole file */
#include "cuda/op_profile.h"

#include "util/log.h"

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
    /* replayed-graph mode (op_profile.h): stamp i >= 1 ends op stamp_op[i], stamp 0 is the step's start */
    int mode, stamp_mode, armed, nstamps, pending;
    unsigned long long *stamps_d, *stamps_h; /* [PROF_SLOTS + 1] */
    const char **stamp_op;
    double stamped_ms; /* start to last stamp, summed over the stamped steps collected */
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
    p->mode = atoi(v);
    if (ok && atoi(v) == 2) {
        p->stamp_mode = 1;
        p->stamps_h = calloc(PROF_SLOTS + 1, sizeof *p->stamps_h);
        p->stamp_op = calloc(PROF_SLOTS + 1, sizeof *p->stamp_op);
        ok = p->stamps_h && p->stamp_op &&
             cudaMalloc((void **)&p->stamps_d, (PROF_SLOTS + 1) * sizeof *p->stamps_d) == cudaSuccess;
    }
    if (!ok) {
        k3c_log(K3C_LOG_WARN, "K3C_CUDA_PROFILE: cannot create the event pool; profiling off");
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
    if (p->stamps_d) cudaFree(p->stamps_d);
    free(p->stamps_h);
    free(p->stamp_op);
    free(p);
}

int k3c_op_profile_stamps(const k3c_op_profile *p) { return p && p->stamp_mode; }
int k3c_op_profile_mode(const k3c_op_profile *p) { return p ? p->mode : 0; }

int k3c_op_profile_arm(k3c_op_profile *p, cudaStream_t s) {
    if (!p || !p->stamp_mode) return -1;
    p->armed = 1;
    p->nstamps = 1;
    p->stamp_op[0] = NULL;
    return k3c_cuda_stamp(p->stamps_d, s);
}

void k3c_op_profile_disarm(k3c_op_profile *p, int ran) {
    if (!p || !p->armed) return;
    p->armed = 0;
    p->pending = ran ? p->nstamps : 0; /* stamps of a graph that never ran are not read */
}

int k3c_op_profile_begin(k3c_op_profile *p, const char *op, cudaStream_t s) {
    if (!p) return -1;
    if (p->armed) { /* capturing the stamped graph: the stamp goes in at end() */
        if (p->nstamps > PROF_SLOTS) {
            p->dropped++;
            return -1;
        }
        p->stamp_op[p->nstamps] = op;
        return p->nstamps++;
    }
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
    if (p && slot >= 0 && p->armed) k3c_cuda_stamp(p->stamps_d + slot, s);
    else if (p && slot >= 0) cudaEventRecord(p->ev[2 * slot + 1], s);
}

static void add_total(k3c_op_profile *p, const char *op, double ms) {
    int t = 0;
    while (t < p->ntot && strcmp(p->tot[t].op, op)) t++;
    if (t == p->ntot) {
        if (p->ntot == PROF_NAMES) return;
        p->tot[p->ntot++] = (prof_total){.op = op};
    }
    p->tot[t].ms += ms;
    p->tot[t].calls++;
}

void k3c_op_profile_collect(k3c_op_profile *p) {
    if (!p) return;
    if (p->pending > 1 && /* the stamped graph has run; its stream is idle, the device may not be */
        cudaDeviceSynchronize() == cudaSuccess &&
        cudaMemcpy(p->stamps_h, p->stamps_d, (size_t)p->pending * sizeof *p->stamps_h, cudaMemcpyDeviceToHost) ==
            cudaSuccess) {
        for (int i = 1; i < p->pending; i++) add_total(p, p->stamp_op[i], (double)(p->stamps_h[i] - p->stamps_h[i - 1]) * 1e-6);
        p->stamped_ms += (double)(p->stamps_h[p->pending - 1] - p->stamps_h[0]) * 1e-6;
    }
    p->pending = 0;
    for (int i = 0; i < p->used; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) != cudaSuccess) continue;
        add_total(p, p->op[i], ms);
    }
    p->used = 0;
}

void k3c_op_profile_reset(k3c_op_profile *p) {
    if (!p) return;
    p->ntot = 0;
    p->used = 0;
    p->dropped = 0;
    p->stamped_ms = 0;
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
    if (p->stamped_ms > 0) /* the ops' times add up to the stamped steps exactly (consecutive stamps) */
        fprintf(f, "PROF stamped steps: %.3f ms on the GPU from the start stamp to the last, %.3f ms of wall time "
                   "(with the host's part)%s\n", p->stamped_ms, step_ms, p->dropped ? " (some ops not stamped: pool full)" : "");
    else if (step_ms > 0)
        fprintf(f, "PROF sum of ops %.3f ms of a %.3f ms step (the rest: launch gaps, host work)%s\n", sum, step_ms,
                p->dropped ? " (some calls not timed: pool full)" : "");
}

#endif
