/* The prefix cache (runtime/prefix_cache.h): a chained hash table over the blocks' keys and an LRU list of
 * the blocks only the cache holds, both threaded through per-block arrays (every operation O(1) but the
 * walk of a bucket and of a prompt's blocks). */
#include "runtime/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/engine_internal.h"
#include "util/error.h"

/* splitmix64's finalizer: a bijection of 64 bits with full avalanche. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Two lanes of different constants, each a chain of mix64 over (state, token): 128 bits of key. */
k3c_phash k3c_prefix_key(k3c_phash parent, const int32_t *tokens, int block_size) {
    uint64_t a = parent.a ^ 0x243f6a8885a308d3ull, b = parent.b ^ 0x13198a2e03707344ull;
    for (int i = 0; i < block_size; i++) {
        uint64_t t = (uint32_t)tokens[i];
        a = mix64(a ^ (t + 0x9e3779b97f4a7c15ull));
        b = mix64(b + t * 0xff51afd7ed558ccdull + 0xc4ceb9fe1a85ec53ull);
    }
    return (k3c_phash){a, b};
}

static int key_eq(k3c_phash x, k3c_phash y) { return x.a == y.a && x.b == y.b; }

int k3c_prefix_cache_init(k3c_prefix_cache *pc, k3c_engine *e, int snapshots) {
    memset(pc, 0, sizeof *pc);
    pc->head = pc->tail = -1;
    k3c_engine_view v;
    k3c_engine_view_get(e, &v);
    int N = v.kv->num_blocks, bs = v.block_size;
    pc->e = e;
    pc->num_blocks = N;
    pc->block_size = bs;
    pc->need_snapshot = k3c_engine_snapshot_bytes(e) > 0;
    uint64_t cap = 1;
    while (cap < 2 * (uint64_t)N) cap <<= 1;
    pc->table_mask = cap - 1;
    pc->valid = calloc((size_t)N, 1);
    pc->key = malloc(sizeof(k3c_phash) * (size_t)N);
    pc->parent = malloc(sizeof(k3c_phash) * (size_t)N);
    pc->tokens = malloc(sizeof(int32_t) * (size_t)N * (size_t)bs);
    pc->snap = malloc(sizeof(int) * (size_t)N);
    pc->bucket_next = malloc(sizeof(int) * (size_t)N);
    pc->table = malloc(sizeof(int) * (size_t)cap);
    pc->prev = malloc(sizeof(int) * (size_t)N);
    pc->next = malloc(sizeof(int) * (size_t)N);
    pc->in_lru = calloc((size_t)N, 1);
    if (!pc->valid || !pc->key || !pc->parent || !pc->tokens || !pc->snap || !pc->bucket_next || !pc->table ||
        !pc->prev || !pc->next || !pc->in_lru) {
        k3c_prefix_cache_release(pc);
        return k3c_errorf_kind(K3C_ERROR_OOM, "prefix cache: out of memory (%d blocks)", N);
    }
    for (int b = 0; b < N; b++) pc->snap[b] = -1;
    for (uint64_t i = 0; i < cap; i++) pc->table[i] = -1;
    if (pc->need_snapshot && k3c_snap_pool_init(&pc->snaps, snapshots) != K3C_OK) {
        k3c_prefix_cache_release(pc);
        return k3c_error_context("prefix cache");
    }
    return K3C_OK;
}

static void lru_unlink(k3c_prefix_cache *pc, int b) {
    if (!pc->in_lru[b]) return;
    if (pc->prev[b] >= 0) pc->next[pc->prev[b]] = pc->next[b];
    else pc->head = pc->next[b];
    if (pc->next[b] >= 0) pc->prev[pc->next[b]] = pc->prev[b];
    else pc->tail = pc->prev[b];
    pc->in_lru[b] = 0;
    pc->n_lru--;
}

static void lru_push(k3c_prefix_cache *pc, int b) {
    pc->prev[b] = pc->tail;
    pc->next[b] = -1;
    if (pc->tail >= 0) pc->next[pc->tail] = b;
    else pc->head = b;
    pc->tail = b;
    pc->in_lru[b] = 1;
    pc->n_lru++;
}

static int *bucket(k3c_prefix_cache *pc, k3c_phash k) { return &pc->table[(k.a ^ (k.b >> 7)) & pc->table_mask]; }

/* Removes b's entry: out of its bucket and the LRU list, its snapshot freed, the cache's reference dropped. */
static void remove_entry(k3c_prefix_cache *pc, int b) {
    int *p = bucket(pc, pc->key[b]);
    while (*p != b) p = &pc->bucket_next[*p];
    *p = pc->bucket_next[b];
    lru_unlink(pc, b);
    if (pc->snap[b] >= 0) k3c_snap_pool_give(&pc->snaps, pc->snap[b]);
    pc->snap[b] = -1;
    pc->valid[b] = 0;
    pc->n_entries--;
    k3c_engine_block_unref(pc->e, b);
}

void k3c_prefix_cache_release(k3c_prefix_cache *pc) {
    if (pc->valid)
        for (int b = 0; b < pc->num_blocks; b++)
            if (pc->valid[b]) remove_entry(pc, b);
    free(pc->valid);
    free(pc->key);
    free(pc->parent);
    free(pc->tokens);
    free(pc->snap);
    free(pc->bucket_next);
    free(pc->table);
    free(pc->prev);
    free(pc->next);
    free(pc->in_lru);
    k3c_snap_pool_release(&pc->snaps);
    memset(pc, 0, sizeof *pc);
    pc->head = pc->tail = -1;
}

static int find(k3c_prefix_cache *pc, k3c_phash parent, k3c_phash key, const int32_t *tokens) {
    for (int b = *bucket(pc, key); b >= 0; b = pc->bucket_next[b])
        if (key_eq(pc->key[b], key) && key_eq(pc->parent[b], parent) &&
            !memcmp(pc->tokens + (size_t)b * pc->block_size, tokens, sizeof(int32_t) * (size_t)pc->block_size))
            return b;
    return -1;
}

k3c_phash k3c_prefix_root(int dp) {
    if (dp <= 0) return (k3c_phash){0, 0}; /* world size 1's root */
    return (k3c_phash){mix64(0x6470000000000000ull + (uint64_t)dp), mix64(0x7064000000000000ull + (uint64_t)dp)};
}

int k3c_prefix_cache_lookup(k3c_prefix_cache *pc, const int32_t *tokens, int max_blocks, int32_t *blocks,
                            int *matched) {
    return k3c_prefix_cache_lookup_dp(pc, 0, tokens, max_blocks, blocks, matched);
}

int k3c_prefix_cache_lookup_dp(k3c_prefix_cache *pc, int dp, const int32_t *tokens, int max_blocks, int32_t *blocks,
                               int *matched) {
    k3c_phash parent = k3c_prefix_root(dp);
    int m = 0, best = 0;
    for (; m < max_blocks; m++) {
        const int32_t *t = tokens + (size_t)m * pc->block_size;
        k3c_phash key = k3c_prefix_key(parent, t, pc->block_size);
        int b = find(pc, parent, key, t);
        if (b < 0) break;
        blocks[m] = b;
        if (!pc->need_snapshot || pc->snap[b] >= 0) best = m + 1;
        parent = key;
    }
    *matched = m;
    return best;
}

void k3c_prefix_cache_acquire(k3c_prefix_cache *pc, int b) { lru_unlink(pc, b); }

int k3c_prefix_cache_insert(k3c_prefix_cache *pc, int b, k3c_phash parent, k3c_phash key, const int32_t *tokens) {
    int had = find(pc, parent, key, tokens);
    if (had >= 0) return had;
    if (pc->valid[b]) return b; /* indexed already (a shared block of the request's prefix) */
    pc->valid[b] = 1;
    pc->key[b] = key;
    pc->parent[b] = parent;
    memcpy(pc->tokens + (size_t)b * pc->block_size, tokens, sizeof(int32_t) * (size_t)pc->block_size);
    pc->snap[b] = -1;
    int *head = bucket(pc, key);
    pc->bucket_next[b] = *head;
    *head = b;
    pc->n_entries++;
    k3c_engine_block_ref(pc->e, b);
    return b;
}

void k3c_prefix_cache_released(k3c_prefix_cache *pc, const int32_t *blocks, int n) {
    for (int i = n - 1; i >= 0; i--) {
        int b = blocks[i];
        if (pc->valid[b] && !pc->in_lru[b] && k3c_engine_block_refs(pc->e, b) == 1) lru_push(pc, b);
    }
}

int k3c_prefix_cache_evict(k3c_prefix_cache *pc) {
    if (pc->head < 0) return 0;
    remove_entry(pc, pc->head);
    return 1;
}

int k3c_prefix_cache_snapshot_take(k3c_prefix_cache *pc, int b, int *had) {
    *had = pc->snap[b] >= 0;
    if (*had || !pc->valid[b]) return -1;
    int evicted;
    int i = k3c_snap_pool_take(&pc->snaps, b, &evicted);
    if (i < 0) return -1;
    if (evicted >= 0) pc->snap[evicted] = -1;
    pc->snap[b] = i;
    return i;
}

int k3c_prefix_cache_snapshot_of(k3c_prefix_cache *pc, int b) {
    if (!pc->valid[b] || pc->snap[b] < 0) return -1;
    k3c_snap_pool_touch(&pc->snaps, pc->snap[b]);
    return pc->snap[b];
}

void k3c_prefix_cache_snapshot_drop(k3c_prefix_cache *pc, int b) {
    if (pc->snap[b] < 0) return;
    k3c_snap_pool_give(&pc->snaps, pc->snap[b]);
    pc->snap[b] = -1;
}
