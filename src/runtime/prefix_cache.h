/* The prefix cache of the serving scheduler, for a hybrid model: full MLA blocks keyed by a hash chain of
 * their tokens, each with (maybe) a KDA snapshot of the state after its last token.
 *
 * A block's key is H(the parent block's key, its block_size tokens), 128 bits, the root's parent key zero:
 * equal keys mean equal token prefixes (the tokens and the parent's key are compared as well, so only a
 * 128-bit collision of the parent chain could alias). The cache holds one reference of every block it
 * indexes (the engine counts them, cache/kv_cache.h); a block nobody else references is free but cached,
 * in one LRU list, and goes back to the engine's free list (its snapshot with it) when the scheduler needs
 * blocks. A request's released blocks enter the list last block first, so a finished request's tail goes
 * before its head (vLLM's order).
 *
 * A hit needs both sides at the same boundary: the MLA blocks of the prefix and a snapshot of the KDA state
 * at its end (a model without KDA needs no snapshot). Snapshots live in a bounded pool (runtime/snapshots.h)
 * and are evicted least recently used, or with their block. */
#ifndef K3C_RUNTIME_PREFIX_CACHE_H
#define K3C_RUNTIME_PREFIX_CACHE_H

#include <stdint.h>

#include "k3c.h"
#include "runtime/snapshots.h"

typedef struct k3c_phash {
    uint64_t a, b;
} k3c_phash;

typedef struct k3c_prefix_cache {
    k3c_engine *e;
    int num_blocks, block_size;
    int need_snapshot;   /* the model has KDA layers */
    uint8_t *valid;      /* [num_blocks] an entry */
    k3c_phash *key, *parent;
    int32_t *tokens;     /* [num_blocks, block_size] */
    int *snap;           /* [num_blocks] snapshot buffer, -1 none */
    int *bucket_next;    /* [num_blocks] hash chain of the table's bucket */
    int *table;          /* [table_mask + 1] first block of each bucket, -1 empty */
    uint64_t table_mask;
    int *prev, *next;    /* [num_blocks] LRU of cached blocks no request holds (head: evicted first) */
    uint8_t *in_lru;
    int head, tail, n_lru;
    int n_entries;
    k3c_snap_pool snaps;
} k3c_prefix_cache;

/* snapshots: buffers reserved on the engine (k3c_engine_snapshots_reserve) for the pool. */
int k3c_prefix_cache_init(k3c_prefix_cache *pc, k3c_engine *e, int snapshots);
/* Drops the cache's reference of every block (they return to the engine's free list unless a request holds
 * them) and its memory. */
void k3c_prefix_cache_release(k3c_prefix_cache *pc);

/* The key of a block of tokens[0 .. block_size) after parent (the root's parent: {0, 0}). */
k3c_phash k3c_prefix_key(k3c_phash parent, const int32_t *tokens, int block_size);
/* Walks tokens[0 .. max_blocks x block_size) block by block: *matched = blocks found in a row, blocks[0 ..
 * matched) their ids; returns the deepest depth d <= matched with a snapshot at block d - 1 (0: none), or
 * matched when the model needs no snapshot. Takes no reference. */
int k3c_prefix_cache_lookup(k3c_prefix_cache *pc, const int32_t *tokens, int max_blocks, int32_t *blocks,
                            int *matched);
/* Data parallelism: a block's rows live in the caches of the DP rank that computed them, so each DP rank's
 * chains hang from a root of their own: the parent of a first block on DP rank dp (dp 0: {0, 0}, as without
 * DP), and the lookup among DP rank dp's chains. */
k3c_phash k3c_prefix_root(int dp);
int k3c_prefix_cache_lookup_dp(k3c_prefix_cache *pc, int dp, const int32_t *tokens, int max_blocks, int32_t *blocks,
                               int *matched);
/* A request is about to reference block b (a hit): it leaves the LRU list. */
void k3c_prefix_cache_acquire(k3c_prefix_cache *pc, int b);
/* Indexes block b, full with tokens[0 .. block_size) after parent, under key (k3c_prefix_key); the cache takes
 * a reference. Returns the block now indexed under key: b, or the block that already was (b is then left as
 * a plain block of its request). */
int k3c_prefix_cache_insert(k3c_prefix_cache *pc, int b, k3c_phash parent, k3c_phash key, const int32_t *tokens);
/* After a request released blocks[0 .. n) (k3c_request_close): those only the cache holds now enter the LRU
 * list, the last first. */
void k3c_prefix_cache_released(k3c_prefix_cache *pc, const int32_t *blocks, int n);
/* Blocks the cache can give back (held by nobody else). */
static inline int k3c_prefix_cache_evictable(const k3c_prefix_cache *pc) { return pc->n_lru; }
/* Gives the least recently used of those back to the engine's free list; 0 when there is none. */
int k3c_prefix_cache_evict(k3c_prefix_cache *pc);
/* The snapshot buffer of block b for a new snapshot (the least recently used one of another block when the
 * pool is full), or -1 (no pool; or b already has one: then *had = 1). */
int k3c_prefix_cache_snapshot_take(k3c_prefix_cache *pc, int b, int *had);
/* b's snapshot (marked used now), or -1. */
int k3c_prefix_cache_snapshot_of(k3c_prefix_cache *pc, int b);
/* Forgets b's snapshot (a save that failed). */
void k3c_prefix_cache_snapshot_drop(k3c_prefix_cache *pc, int b);

#endif
