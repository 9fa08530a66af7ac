/* The snapshot pool's LRU bookkeeping (runtime/snapshots.h): a doubly linked list threaded through arrays,
 * every operation O(1). */
#include "runtime/snapshots.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int k3c_snap_pool_init(k3c_snap_pool *p, int count) {
    memset(p, 0, sizeof *p);
    p->head = p->tail = -1;
    if (count <= 0) return K3C_OK;
    p->owner = malloc(sizeof(int) * (size_t)count);
    p->prev = malloc(sizeof(int) * (size_t)count);
    p->next = malloc(sizeof(int) * (size_t)count);
    p->free_ids = malloc(sizeof(int) * (size_t)count);
    if (!p->owner || !p->prev || !p->next || !p->free_ids) {
        k3c_snap_pool_release(p);
        return k3c_errorf_kind(K3C_ERROR_OOM, "snapshot pool: out of memory (%d snapshots)", count);
    }
    p->count = count;
    for (int i = 0; i < count; i++) {
        p->owner[i] = -1;
        p->free_ids[i] = count - 1 - i;
    }
    p->n_free = count;
    return K3C_OK;
}

void k3c_snap_pool_release(k3c_snap_pool *p) {
    free(p->owner);
    free(p->prev);
    free(p->next);
    free(p->free_ids);
    memset(p, 0, sizeof *p);
    p->head = p->tail = -1;
}

static void unlink_lru(k3c_snap_pool *p, int i) {
    if (p->prev[i] >= 0) p->next[p->prev[i]] = p->next[i];
    else p->head = p->next[i];
    if (p->next[i] >= 0) p->prev[p->next[i]] = p->prev[i];
    else p->tail = p->prev[i];
}

static void push_tail(k3c_snap_pool *p, int i) {
    p->prev[i] = p->tail;
    p->next[i] = -1;
    if (p->tail >= 0) p->next[p->tail] = i;
    else p->head = i;
    p->tail = i;
}

int k3c_snap_pool_take(k3c_snap_pool *p, int owner, int *evicted) {
    *evicted = -1;
    if (p->count == 0) return -1;
    int i;
    if (p->n_free > 0) {
        i = p->free_ids[--p->n_free];
        p->used++;
    } else {
        i = p->head;
        unlink_lru(p, i);
        *evicted = p->owner[i];
    }
    p->owner[i] = owner;
    push_tail(p, i);
    return i;
}

void k3c_snap_pool_touch(k3c_snap_pool *p, int i) {
    unlink_lru(p, i);
    push_tail(p, i);
}

void k3c_snap_pool_give(k3c_snap_pool *p, int i) {
    if (p->owner[i] < 0) return;
    unlink_lru(p, i);
    p->owner[i] = -1;
    p->free_ids[p->n_free++] = i;
    p->used--;
}
