/* The waiting queue (runtime/sched_queue.h): an array kept in serving order. Insertions are O(n), n being
 * bounded by the scheduler's max_queue, which is cheaper than a heap's bookkeeping at these sizes and keeps
 * FCFS's front insertion and removal by id trivial. */
#include "runtime/sched_queue.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int k3c_sched_queue_init(k3c_sched_queue *q, k3c_sched_policy policy, int cap) {
    memset(q, 0, sizeof *q);
    q->policy = policy;
    if (cap < 16) cap = 16;
    q->v = malloc(sizeof *q->v * (size_t)cap);
    if (!q->v) return k3c_errorf_kind(K3C_ERROR_OOM, "scheduler queue: out of memory (%d entries)", cap);
    q->cap = cap;
    return K3C_OK;
}

void k3c_sched_queue_release(k3c_sched_queue *q) {
    free(q->v);
    memset(q, 0, sizeof *q);
}

/* a is served before b under PRIORITY */
static int before(const k3c_queue_entry *a, const k3c_queue_entry *b) {
    return a->priority != b->priority ? a->priority < b->priority : a->arrival < b->arrival;
}

int k3c_sched_queue_push(k3c_sched_queue *q, k3c_queue_entry x, int front) {
    if (q->n == q->cap) {
        k3c_queue_entry *v = realloc(q->v, sizeof *v * (size_t)q->cap * 2);
        if (!v) return k3c_errorf_kind(K3C_ERROR_OOM, "scheduler queue: out of memory (%d entries)", q->cap * 2);
        q->v = v;
        q->cap *= 2;
    }
    int at = q->n;
    if (q->policy == K3C_SCHED_PRIORITY) {
        while (at > 0 && before(&x, &q->v[at - 1])) at--;
    } else if (front) {
        at = 0;
    }
    memmove(q->v + at + 1, q->v + at, sizeof *q->v * (size_t)(q->n - at));
    q->v[at] = x;
    q->n++;
    return K3C_OK;
}

void *k3c_sched_queue_peek(const k3c_sched_queue *q) { return q->n ? q->v[0].req : NULL; }

void k3c_sched_queue_pop(k3c_sched_queue *q) {
    if (!q->n) return;
    memmove(q->v, q->v + 1, sizeof *q->v * (size_t)--q->n);
}

int k3c_sched_queue_remove(k3c_sched_queue *q, const void *req) {
    for (int i = 0; i < q->n; i++)
        if (q->v[i].req == req) {
            memmove(q->v + i, q->v + i + 1, sizeof *q->v * (size_t)(q->n - i - 1));
            q->n--;
            return 1;
        }
    return 0;
}

int k3c_sched_victim(k3c_sched_policy policy, const k3c_queue_entry *running, int n) {
    if (n <= 0) return -1;
    if (policy != K3C_SCHED_PRIORITY) return n - 1;
    int w = 0;
    for (int i = 1; i < n; i++)
        if (before(&running[w], &running[i])) w = i;
    return w;
}
