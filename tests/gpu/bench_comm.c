/* All-reduce latency benchmark (not a test): k3c's mailbox all-reduce (comm/mailbox_cuda.h), one-shot and
 * two-shot, eager (calls launched back to back) and graph-replayed (the calls captured once, the graph
 * launched), f32 messages of 1 KB .. 4 MB, one host thread per rank, each rank on its own stream.
 *
 * One GPU visible: 2, 4 and 8 ranks on that one device. This measures the protocol's own cost (launch,
 * flags, spins, and every rank's traffic through the one HBM), not NVLink: the output says so.
 * Several GPUs visible: 2, 4 and 8 ranks (as many as there are GPUs), one per GPU, peer-mapped: the mailbox
 * and, beside it at the same sizes, NCCL's all-reduce (comm/nccl.c, one communicator per rank in this
 * process, NCCL_NVLS_ENABLE=0: NVLink multicast stays off); --one-device adds the one-device rows there too.
 *
 * A row's time: every rank records events around its calls on its own stream after a host barrier; a rank's
 * time per call is its span over the calls; the row is the slowest rank's, the median of RUNS runs (a
 * collective is done when its slowest rank is). Prints
 *   COMM <impl> <algo> ranks <R> gpus <G> <eager|graph> <bytes> <us per call>
 * and per (impl, ranks, mode) the size from which the two-shot was faster than the one-shot:
 *   CROSSOVER mailbox ranks <R> gpus <G> <mode> <bytes or none> (rule in use: <bytes>)
 * Usage: bench_comm [--ranks 2,4,8] [--iters N] [--one-device] [--no-nccl] [--no-graph] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "comm/comm.h"
#include "comm/mailbox_cuda.h"
#include "util/error.h"

#define DIE(...) do { fprintf(stderr, "bench_comm: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) DIE("%s: %s", #call, cudaGetErrorString(e_)); } while (0)
#define OK(call) do { if ((call) != 0) DIE("%s: %s", #call, k3c_error_message()); } while (0)

#define MAXR 8
#define RUNS 5

static const size_t sizes[] = {1024, 2048, 4096, 7168, 8192, 14336, 16384, 32768, 65536, 131072, 262144,
                               524288, 1 << 20, 2 << 20, 4 << 20};
#define NSIZES (sizeof sizes / sizeof *sizes)
#define MAX_BYTES ((size_t)4 << 20)

typedef enum { IMPL_MAILBOX, IMPL_NCCL } impl_kind;

typedef struct group {
    impl_kind impl;
    int R, gpus;
    int dev[MAXR];
    cudaStream_t st[MAXR];
    k3c_comm *c[MAXR];
    float *buf[MAXR];
    pthread_barrier_t bar;
} group;

typedef struct job {
    group *g;
    int rank, iters, graph;
    size_t n;
    k3c_mailbox_algo algo;
    double us[RUNS];
} job;

static int one_call(group *g, int r, size_t n, k3c_mailbox_algo algo) {
    if (g->impl == IMPL_MAILBOX) return k3c_comm_mailbox_all_reduce(g->c[r], g->buf[r], n, algo);
    return g->c[r]->all_reduce_f32(g->c[r], g->buf[r], n);
}

/* a failure in a rank's thread ends the process (the other ranks would wait at the next barrier) */
#define JCK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) DIE("rank %d: %s: %s", r, #call, cudaGetErrorString(e_)); } while (0)
#define JOK(call) do { if ((call) != 0) DIE("rank %d: %s: %s", r, #call, k3c_error_message()); } while (0)

/* One rank's part of one row: warm-up, then RUNS timed runs, each after a barrier of every rank's thread. */
static void *rank_row(void *p) {
    job *j = p;
    group *g = j->g;
    const int r = j->rank;
    cudaStream_t st = g->st[r];
    cudaEvent_t a = NULL, b = NULL;
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ge = NULL;
    JCK(cudaSetDevice(g->dev[r]));
    JCK(cudaEventCreate(&a));
    JCK(cudaEventCreate(&b));
    for (int k = 0; k < 5; k++) JOK(one_call(g, r, j->n, j->algo));
    if (j->graph) {
        JCK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        int rc = 0;
        for (int k = 0; k < j->iters && rc == 0; k++) rc = one_call(g, r, j->n, j->algo);
        cudaError_t e = cudaStreamEndCapture(st, &gr);
        JOK(rc);
        JCK(e);
        JCK(cudaGraphInstantiate(&ge, gr, 0));
        JCK(cudaGraphLaunch(ge, st)); /* the first launch uploads the graph */
    }
    JCK(cudaStreamSynchronize(st));
    for (int run = 0; run < RUNS; run++) {
        pthread_barrier_wait(&g->bar);
        JCK(cudaEventRecord(a, st));
        if (j->graph)
            JCK(cudaGraphLaunch(ge, st));
        else
            for (int k = 0; k < j->iters; k++) JOK(one_call(g, r, j->n, j->algo));
        JCK(cudaEventRecord(b, st));
        JCK(cudaEventSynchronize(b));
        float ms = 0;
        JCK(cudaEventElapsedTime(&ms, a, b));
        j->us[run] = ms * 1e3 / j->iters;
    }
    if (g->impl == IMPL_MAILBOX) JOK(k3c_comm_mailbox_check(g->c[r]));
    if (ge) cudaGraphExecDestroy(ge);
    if (gr) cudaGraphDestroy(gr);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    return NULL;
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The row's time (us per call). */
static double run_row(group *g, size_t bytes, k3c_mailbox_algo algo, int graph, int iters) {
    job jobs[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < g->R; r++) {
        jobs[r] = (job){.g = g, .rank = r, .iters = iters, .graph = graph, .n = bytes / sizeof(float), .algo = algo};
        pthread_create(&th[r], NULL, rank_row, &jobs[r]);
    }
    double worst[RUNS] = {0};
    for (int r = 0; r < g->R; r++) {
        pthread_join(th[r], NULL);
        for (int k = 0; k < RUNS; k++)
            if (jobs[r].us[k] > worst[k]) worst[k] = jobs[r].us[k];
    }
    qsort(worst, RUNS, sizeof *worst, cmp_d);
    return worst[RUNS / 2];
}

typedef struct nccl_init_job {
    group *g;
    int r;
    const unsigned char *id;
    int rc;
    char err[300];
} nccl_init_job;

static void *nccl_init(void *p) {
    nccl_init_job *j = p;
    if (cudaSetDevice(j->g->dev[j->r]) != cudaSuccess ||
        k3c_comm_nccl_create(j->id, j->r, j->g->R, j->g->dev[j->r], j->g->st[j->r], &j->g->c[j->r]) != K3C_OK) {
        j->rc = -1;
        snprintf(j->err, sizeof j->err, "%s", k3c_error_message());
    }
    return NULL;
}

/* 0, or (NCCL only) -1 with the reason printed: NCCL did not load or its communicators did not start. */
static int group_open(group *g, impl_kind impl, int R, int gpus) {
    memset(g, 0, sizeof *g);
    g->impl = impl;
    g->R = R;
    g->gpus = gpus;
    for (int r = 0; r < R; r++) {
        g->dev[r] = gpus == 1 ? 0 : r;
        CK(cudaSetDevice(g->dev[r]));
        CK(cudaStreamCreateWithFlags(&g->st[r], cudaStreamNonBlocking));
    }
    for (int r = 0; r < R; r++) {
        CK(cudaSetDevice(g->dev[r]));
        CK(cudaMalloc((void **)&g->buf[r], MAX_BYTES));
        CK(cudaMemset(g->buf[r], 0, MAX_BYTES)); /* zeros: the sums stay zeros, replay after replay */
    }
    CK(cudaSetDevice(0));
    if (impl == IMPL_MAILBOX) {
        k3c_comm_mailbox_options o = {.cap = MAX_BYTES / sizeof(float)};
        OK(k3c_comm_mailbox_create(R, g->dev, (void *const *)g->st, &o, g->c));
    } else {
        unsigned char id[K3C_COMM_NCCL_ID_BYTES];
        if (k3c_comm_nccl_unique_id(id) != K3C_OK) {
            printf("# %s: the NCCL rows are skipped\n", k3c_error_message());
            return -1;
        }
        /* ncclCommInitRank blocks until every rank has joined: one thread per rank */
        nccl_init_job ij[MAXR];
        pthread_t th[MAXR];
        for (int r = 0; r < R; r++) ij[r] = (nccl_init_job){g, r, id, 0, ""};
        for (int r = 0; r < R; r++) pthread_create(&th[r], NULL, nccl_init, &ij[r]);
        int failed = 0;
        for (int r = 0; r < R; r++) {
            pthread_join(th[r], NULL);
            if (ij[r].rc) failed = 1, printf("# nccl rank %d: %s: the NCCL rows are skipped\n", r, ij[r].err);
        }
        if (failed) return -1; /* the communicators that started are left to the process's end */
    }
    pthread_barrier_init(&g->bar, NULL, (unsigned)R);
    return 0;
}

static void group_close(group *g) {
    for (int r = 0; r < g->R; r++) {
        CK(cudaSetDevice(g->dev[r]));
        CK(cudaStreamSynchronize(g->st[r]));
    }
    for (int r = 0; r < g->R; r++) {
        if (g->c[r]) g->c[r]->free(g->c[r]);
        cudaSetDevice(g->dev[r]);
        cudaFree(g->buf[r]);
        cudaStreamDestroy(g->st[r]);
    }
    cudaSetDevice(0);
    pthread_barrier_destroy(&g->bar);
}

static int iters_for(size_t bytes) { return bytes >= ((size_t)1 << 20) ? 30 : 100; }

/* Every size and algorithm of one group: COMM rows, then the crossover per mode. */
static void sweep(group *g, int iters_override, int graphs) {
    const char *impl = g->impl == IMPL_MAILBOX ? "mailbox" : "nccl";
    k3c_comm_mailbox_info info = {0};
    if (g->impl == IMPL_MAILBOX) OK(k3c_comm_mailbox_get_info(g->c[0], &info));
    for (int graph = 0; graph <= graphs; graph++) {
        const char *mode = graph ? "graph" : "eager";
        double t[NSIZES][2];
        for (size_t s = 0; s < NSIZES; s++) {
            int iters = iters_override ? iters_override : iters_for(sizes[s]);
            if (g->impl == IMPL_NCCL) {
                double us = run_row(g, sizes[s], K3C_MAILBOX_AUTO, graph, iters);
                printf("COMM %-7s %-8s ranks %d gpus %d %s %8zu %10.2f\n", impl, "nccl", g->R, g->gpus, mode, sizes[s], us);
                fflush(stdout);
                continue;
            }
            for (int a = 0; a < 2; a++) {
                k3c_mailbox_algo algo = a ? K3C_MAILBOX_TWO_SHOT : K3C_MAILBOX_ONE_SHOT;
                t[s][a] = run_row(g, sizes[s], algo, graph, iters);
                printf("COMM %-7s %-8s ranks %d gpus %d %s %8zu %10.2f\n", impl, a ? "two-shot" : "one-shot", g->R,
                       g->gpus, mode, sizes[s], t[s][a]);
                fflush(stdout);
            }
        }
        if (g->impl != IMPL_MAILBOX) continue;
        /* the smallest size from which the two-shot stays faster at every larger size */
        size_t from = 0;
        for (size_t s = NSIZES; s-- > 0;) {
            if (!(t[s][1] > 0 && t[s][0] > 0 && t[s][1] < t[s][0])) break;
            from = sizes[s];
        }
        char rule[32];
        if (info.two_shot_bytes == SIZE_MAX)
            snprintf(rule, sizeof rule, "never");
        else
            snprintf(rule, sizeof rule, "%zu", info.two_shot_bytes);
        if (from)
            printf("CROSSOVER mailbox ranks %d gpus %d %s %zu (rule in use: %s; %d blocks a rank)\n", g->R, g->gpus,
                   mode, from, rule, info.blocks);
        else
            printf("CROSSOVER mailbox ranks %d gpus %d %s none (rule in use: %s; %d blocks a rank)\n", g->R, g->gpus,
                   mode, rule, info.blocks);
    }
}

int main(int argc, char **argv) {
    /* before the first CUDA call: a hardware queue per stream (several ranks on one device), and NVLink
     * multicast off for NCCL (never NVLS on these hosts) */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    int ranks[3] = {2, 4, 8}, nranks = 3, iters = 0, one_device = 0, nccl = 1, graphs = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ranks") && i + 1 < argc) {
            nranks = 0;
            for (char *s = strtok(argv[++i], ","); s && nranks < 3; s = strtok(NULL, ",")) ranks[nranks++] = atoi(s);
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--one-device"))
            one_device = 1;
        else if (!strcmp(argv[i], "--no-nccl"))
            nccl = 0;
        else if (!strcmp(argv[i], "--no-graph"))
            graphs = 0;
        else
            DIE("usage: bench_comm [--ranks 2,4,8] [--iters N] [--one-device] [--no-nccl] [--no-graph]");
    }
    for (int k = 0; k < nranks; k++)
        if (ranks[k] < 2 || ranks[k] > MAXR) DIE("--ranks: %d (2 .. %d)", ranks[k], MAXR);
    int ngpu = 0;
    CK(cudaGetDeviceCount(&ngpu));
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# bench_comm: f32 all-reduce, us per call: the slowest rank's mean over a run of calls, median of %d "
           "runs; %d x %s visible\n", RUNS, ngpu, prop.name);
    if (ngpu == 1 || one_device) {
        printf("# one device, every rank on it: this measures the mailbox protocol's own cost (launches, flags, spins,\n"
               "# every rank's traffic through the one HBM), not NVLink or any link between GPUs\n");
        for (int k = 0; k < nranks; k++) {
            group g;
            group_open(&g, IMPL_MAILBOX, ranks[k], 1);
            sweep(&g, iters, graphs);
            group_close(&g);
        }
    }
    if (ngpu > 1) {
        printf("# one rank per GPU (peer-mapped); NCCL beside the mailbox at the same sizes, NCCL_NVLS_ENABLE=0\n");
        for (int k = 0; k < nranks; k++) {
            if (ranks[k] > ngpu) {
                printf("# %d ranks: only %d GPUs visible, skipped\n", ranks[k], ngpu);
                continue;
            }
            group g;
            group_open(&g, IMPL_MAILBOX, ranks[k], ranks[k]);
            sweep(&g, iters, graphs);
            group_close(&g);
            if (nccl && group_open(&g, IMPL_NCCL, ranks[k], ranks[k]) == 0) {
                sweep(&g, iters, graphs);
                group_close(&g);
            }
        }
    }
    return 0;
}
