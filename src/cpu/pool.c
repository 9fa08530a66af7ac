/* A fixed pool of worker threads for parallel-for over rows. The caller thread always takes part, so a pool
 * of N threads starts N-1 workers.
 *
 * Work is split into chunks that threads claim from one atomic cursor; a call returns when every chunk is
 * *finished*, not when every worker has checked in. That matters on a loaded machine: decode calls
 * k3c_pool_for hundreds of times per token with ~5-100 us of work each, and a worker that is descheduled (or
 * still waking from sleep) when a job is published simply misses it; the caller and the other workers do
 * its share. Waiting for every worker to acknowledge every job (the previous design) cost a scheduler time
 * slice whenever a core was taken by another process: 2 threads were measured 10x slower than 1 on a busy
 * 2-core machine. Only a worker that claimed a chunk and is then preempted still delays the call, by at most
 * that chunk (chunks are small: POOL_CHUNKS_PER_THREAD per thread).
 *
 * The cursor packs (job generation, chunk count, next chunk) into 64 bits and is advanced by compare-and-swap
 * only while next < count, so a worker that wakes late can never claim a chunk of a finished job: a claim
 * succeeds only on the current job, and the job's fields (fn, ctx, n, chunk) are stable until all of its
 * chunks, the claimed one included, are finished.
 *
 * Wake-up: workers spin briefly on the cursor before sleeping on a condition variable; the caller signals
 * only when some worker sleeps. Calls on one pool from several threads are serialised (call_mu); a call from
 * inside fn on the same pool would deadlock and is not supported. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu/ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spin iterations before a waiting worker goes to sleep: ~1 ms at the measured 23 ns per pause (AMD EPYC).
 * 4000 (~90 us) let workers fall asleep inside a tiny decode step (serial stretches between pool calls),
 * and the futex wake-ups that followed cost 25% of tiny's step time. */
#define POOL_SPIN 40000
/* Spin iterations of the caller waiting for claimed chunks before it starts yielding its core. */
#define POOL_CALLER_SPIN 20000
/* Chunks per thread: enough for load balance and to bound what a preempted worker holds up, few enough
 * that the cursor is not contended. */
#define POOL_CHUNKS_PER_THREAD 8
/* The cursor: gen in bits 32..63, chunk count in 16..31, next chunk in 0..15. */
#define CUR_GEN(c) ((uint32_t)((c) >> 32))
#define CUR_COUNT(c) ((int)(((c) >> 16) & 0xffff))
#define CUR_NEXT(c) ((int)((c) & 0xffff))
#define POOL_MAX_CHUNKS 0xffff

struct k3c_pool {
    int threads;          /* including the caller */
    pthread_t *workers;   /* [threads - 1] */
    pthread_mutex_t mu;   /* guards sleeping on wake */
    pthread_cond_t wake;  /* a new job or stop */
    pthread_mutex_t call_mu;

    /* The current job, written by the caller before the cursor is published. */
    void (*fn)(void *ctx, int begin, int end);
    void (*fnw)(void *ctx, int begin, int end, int worker); /* instead of fn for k3c_pool_for_worker */
    void *ctx;
    int n, chunk;
    _Atomic uint64_t cursor;
    atomic_int finished; /* chunks of the current job done */
    atomic_int sleepers; /* workers blocked (or about to block) on wake */
    atomic_int stop;
    atomic_int next_worker; /* worker numbers handed out at thread start (the caller is 0) */
    char *scratch;          /* [threads, K3C_POOL_SCRATCH] (k3c_pool_scratch) */
};

/* Claims and runs chunks of the current job until none is left; worker: the number of the calling thread. */
static void pool_run_chunks(k3c_pool *p, int worker) {
    uint64_t c = atomic_load_explicit(&p->cursor, memory_order_acquire);
    for (;;) {
        if (CUR_NEXT(c) >= CUR_COUNT(c)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->cursor, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* c reloaded */
        int b = CUR_NEXT(c) * p->chunk;
        int e = b + p->chunk < p->n ? b + p->chunk : p->n;
        if (p->fnw) p->fnw(p->ctx, b, e, worker);
        else p->fn(p->ctx, b, e);
        atomic_fetch_add_explicit(&p->finished, 1, memory_order_release);
        c = atomic_load_explicit(&p->cursor, memory_order_acquire);
    }
}

static void *pool_worker(void *arg) {
    k3c_pool *p = arg;
    int worker = atomic_fetch_add(&p->next_worker, 1) + 1;
    uint32_t seen = 0;
    for (;;) {
        int spins = 0;
        uint64_t c;
        while (CUR_GEN(c = atomic_load_explicit(&p->cursor, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_acquire)) {
            if (++spins < POOL_SPIN) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            /* sleepers before the re-check (both seq_cst): the caller either sees a sleeper and signals
             * under mu, or published before our re-check and we see its generation. */
            atomic_fetch_add(&p->sleepers, 1);
            while (CUR_GEN(atomic_load(&p->cursor)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = CUR_GEN(c);
        pool_run_chunks(p, worker);
    }
}

k3c_pool *k3c_pool_create(int threads) {
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    k3c_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->threads = threads;
    if (posix_memalign((void **)&p->scratch, 64, (size_t)threads * K3C_POOL_SCRATCH)) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->call_mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    atomic_init(&p->cursor, 0);
    atomic_init(&p->finished, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next_worker, 0);
    if (threads > 1) {
        p->workers = calloc((size_t)threads - 1, sizeof *p->workers);
        if (!p->workers) {
            k3c_pool_free(p);
            return NULL;
        }
        for (int i = 0; i < threads - 1; i++) {
            if (pthread_create(&p->workers[i], NULL, pool_worker, p) != 0) {
                /* Run with the workers that did start. */
                p->threads = i + 1;
                break;
            }
        }
    }
    return p;
}

void k3c_pool_free(k3c_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; p->workers && i < p->threads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->call_mu);
    pthread_cond_destroy(&p->wake);
    free(p->scratch);
    free(p);
}

int k3c_pool_threads(const k3c_pool *p) { return p ? p->threads : 1; }

void *k3c_pool_scratch(k3c_pool *p, int worker) {
    return p ? p->scratch + (size_t)worker * K3C_POOL_SCRATCH : NULL;
}

/* One parallel-for: exactly one of fn, fnw is set. */
static void pool_run(k3c_pool *p, int n, void (*fn)(void *, int, int), void (*fnw)(void *, int, int, int),
                     void *ctx) {
    if (n <= 0) return;
    if (!p || p->threads <= 1 || n == 1) {
        if (fn) {
            fn(ctx, 0, n);
            return;
        }
        /* Under call_mu, so that worker 0 is not in use by a concurrent call on the same pool. */
        if (p) pthread_mutex_lock(&p->call_mu);
        fnw(ctx, 0, n, 0);
        if (p) pthread_mutex_unlock(&p->call_mu);
        return;
    }
    pthread_mutex_lock(&p->call_mu);
    int chunks = p->threads * POOL_CHUNKS_PER_THREAD;
    if (chunks > POOL_MAX_CHUNKS) chunks = POOL_MAX_CHUNKS;
    if (chunks > n) chunks = n;
    p->fn = fn;
    p->fnw = fnw;
    p->ctx = ctx;
    p->n = n;
    p->chunk = (n + chunks - 1) / chunks;
    int count = (n + p->chunk - 1) / p->chunk;
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    uint32_t gen = CUR_GEN(atomic_load_explicit(&p->cursor, memory_order_relaxed)) + 1;
    /* seq_cst: ordered before the sleepers load below (see pool_worker). */
    atomic_store(&p->cursor, (uint64_t)gen << 32 | (uint64_t)count << 16);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }

    pool_run_chunks(p, 0);

    /* Every chunk is claimed now; wait for the ones other threads hold. */
    int spins = 0;
    while (atomic_load_explicit(&p->finished, memory_order_acquire) != count) {
        if (++spins < POOL_CALLER_SPIN) cpu_relax();
        else sched_yield();
    }
    pthread_mutex_unlock(&p->call_mu);
}

void k3c_pool_for(k3c_pool *p, int n, void (*fn)(void *ctx, int begin, int end), void *ctx) {
    pool_run(p, n, fn, NULL, ctx);
}

void k3c_pool_for_worker(k3c_pool *p, int n, void (*fn)(void *ctx, int begin, int end, int worker), void *ctx) {
    pool_run(p, n, NULL, fn, ctx);
}
