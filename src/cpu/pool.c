/* A fixed pool of worker threads for parallel-for over rows. The caller thread always takes part, so a pool
 * of N threads starts N-1 workers. Work is handed out dynamically in chunks (an atomic cursor), a few chunks
 * per thread, so a slow thread (another process on the core) does not hold up the rest.
 *
 * Wake-up: workers spin briefly on a generation counter before sleeping on a condition variable, because
 * decode calls k3c_pool_for hundreds of times per token with ~10-100 us of work each, and a futex wake costs
 * about as much. Calls on one pool from several threads are serialised (call_mu); a call from inside fn on
 * the same pool would deadlock and is not supported. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu/ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spin iterations (~a few microseconds) before a waiting thread goes to sleep. */
#define POOL_SPIN 4000
/* Chunks per thread: enough for load balance, few enough that the atomic cursor is not contended. */
#define POOL_CHUNKS_PER_THREAD 4

struct k3c_pool {
    int threads;          /* including the caller */
    pthread_t *workers;   /* [threads - 1] */
    pthread_mutex_t mu;   /* guards sleeping on wake / done */
    pthread_cond_t wake;  /* a new job (gen changed) or stop */
    pthread_cond_t done;  /* the last worker finished the job */
    pthread_mutex_t call_mu;

    /* The current job, written by the caller before gen is bumped. */
    void (*fn)(void *ctx, int begin, int end);
    void *ctx;
    int n, chunk;
    atomic_int next;    /* next unclaimed index */
    atomic_int active;  /* workers still inside the job */
    atomic_uint gen;    /* job generation */
    atomic_int stop;
};

/* Claims chunks until none are left. */
static void pool_run_chunks(k3c_pool *p) {
    for (;;) {
        int b = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (b >= p->n) return;
        int e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->ctx, b, e);
    }
}

static void *pool_worker(void *arg) {
    k3c_pool *p = arg;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_acquire)) {
            if (++spins < POOL_SPIN) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        pool_run_chunks(p);
        if (atomic_fetch_sub_explicit(&p->active, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
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
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->call_mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
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
    pthread_cond_destroy(&p->done);
    free(p);
}

int k3c_pool_threads(const k3c_pool *p) { return p ? p->threads : 1; }

void k3c_pool_for(k3c_pool *p, int n, void (*fn)(void *ctx, int begin, int end), void *ctx) {
    if (n <= 0) return;
    if (!p || p->threads <= 1 || n == 1) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&p->call_mu);
    int chunks = p->threads * POOL_CHUNKS_PER_THREAD;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = (n + chunks - 1) / chunks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->active, p->threads - 1, memory_order_relaxed);
    /* The release on gen publishes the job fields to workers that acquire it. */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    pool_run_chunks(p);

    int spins = 0;
    while (atomic_load_explicit(&p->active, memory_order_acquire) != 0) {
        if (++spins < POOL_SPIN) {
            cpu_relax();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->active) != 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->call_mu);
}
