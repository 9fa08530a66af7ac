/* The serving scheduler's waiting queue and its policies (vLLM v1's): FCFS serves in arrival order and puts
 * a preempted request back at the front; PRIORITY serves the lowest (priority, arrival) first, a preempted
 * request going back by that key (its arrival keeps it ahead of later ones of its priority). Victims of a
 * preemption: FCFS the newest running request (running.pop()), PRIORITY the largest (priority, arrival). */
#ifndef K3C_RUNTIME_SCHED_QUEUE_H
#define K3C_RUNTIME_SCHED_QUEUE_H

#include <stdint.h>

#include "k3c.h"

typedef struct k3c_queue_entry {
    int priority;
    uint64_t arrival;
    void *req;
} k3c_queue_entry;

typedef struct k3c_sched_queue {
    k3c_sched_policy policy;
    k3c_queue_entry *v; /* [cap], v[0] served first */
    int n, cap;
} k3c_sched_queue;

int k3c_sched_queue_init(k3c_sched_queue *q, k3c_sched_policy policy, int cap);
void k3c_sched_queue_release(k3c_sched_queue *q);
/* front: a preempted request (FCFS: ahead of everyone; PRIORITY: by its key as any other). Fails only when
 * growing the array fails. */
int k3c_sched_queue_push(k3c_sched_queue *q, k3c_queue_entry x, int front);
/* The next request to serve, NULL when empty; pop removes it. */
void *k3c_sched_queue_peek(const k3c_sched_queue *q);
void k3c_sched_queue_pop(k3c_sched_queue *q);
/* Removes req wherever it is; 1 when it was there. */
int k3c_sched_queue_remove(k3c_sched_queue *q, const void *req);
/* The victim among running[0 .. n) (in admission order) under the policy: its index, -1 when n = 0. */
int k3c_sched_victim(k3c_sched_policy policy, const k3c_queue_entry *running, int n);

#endif
