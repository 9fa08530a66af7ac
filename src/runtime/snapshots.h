/* The KDA snapshot pool of the prefix cache: a fixed number of snapshot buffers (the engine's,
 * k3c_engine_snapshots_reserve, sized by the scheduler's snapshot_bytes cap) handed out with an owner (the
 * prefix-cache block the snapshot belongs to) and taken back least recently used first when the pool is
 * full. Bookkeeping only: the copies are the engine's (k3c_engine_snapshot_save / _restore). */
#ifndef K3C_RUNTIME_SNAPSHOTS_H
#define K3C_RUNTIME_SNAPSHOTS_H

typedef struct k3c_snap_pool {
    int count;        /* buffers */
    int used;
    int *owner;       /* [count] owner id, -1 = free */
    int *prev, *next; /* [count] LRU list of used buffers (head = least recently used) */
    int head, tail;
    int *free_ids;    /* [count] stack */
    int n_free;
} k3c_snap_pool;

int k3c_snap_pool_init(k3c_snap_pool *p, int count);
void k3c_snap_pool_release(k3c_snap_pool *p);
/* A buffer for owner; when none is free the least recently used one is taken from its owner, whose id goes
 * to *evicted (else -1). -1 when the pool has no buffers at all. */
int k3c_snap_pool_take(k3c_snap_pool *p, int owner, int *evicted);
/* Marks a buffer used now (a hit). */
void k3c_snap_pool_touch(k3c_snap_pool *p, int i);
void k3c_snap_pool_give(k3c_snap_pool *p, int i);

#endif
