/* The paged MLA latent cache: per MLA layer one buffer [num_blocks, block_size, kv_lora + rope] on the
 * backend (element = be->kv_elem_bytes), shared block ids across layers (a request's block table is the
 * same for every layer), and a free list of blocks. Allocated once at engine creation.
 *
 * Blocks are reference counted so that full blocks can be shared (the prefix cache, runtime/prefix_cache.h):
 * take hands out a block with one reference, ref adds one (another request's block table, or the prefix
 * cache's own hold), give drops one and returns the block to the free list at zero. Shared blocks are never
 * written again: only full blocks are shared, and a request appends to blocks of its own. */
#ifndef K3C_CACHE_KV_CACHE_H
#define K3C_CACHE_KV_CACHE_H

#include <stddef.h>

#include "model/config.h"
#include "backend/backend.h"

typedef struct k3c_kv_cache {
    int num_layers, num_blocks, block_size;
    int latent;           /* kv_lora + rope */
    void *base;           /* one allocation for every MLA layer */
    void **layer;         /* [num_layers]: the layer's cache, NULL for KDA layers */
    size_t layer_bytes;
    int *free_ids;        /* stack of free block ids */
    int num_free;
    int *ref;             /* [num_blocks] references; 0 = on the free list */
    /* Decode context parallel (stock/forward.h k3c_forward_options.dcp): > 1 when the cache is one rank's
     * share of a DCP group's, interleaved by position (backend.h k3c_seg): a request's block table then lists
     * the same block ids on every rank of the group, block j holding local slots [j bs, (j + 1) bs), i.e.
     * this rank's positions among [j bs dcp, (j + 1) bs dcp). So a block covers bs x dcp of the request's
     * tokens at the bytes of bs: the cache holds dcp times the tokens. 0 or 1: none (set after init). */
    int dcp;
} k3c_kv_cache;

/* Blocks a request of `tokens` positions needs in its table (ceil(ceil(tokens / dcp) / block_size): the
 * local slots of DCP rank 0, which holds the most). */
static inline int k3c_kv_cache_blocks_for(const k3c_kv_cache *kv, long long tokens) {
    long long per = (long long)kv->block_size * (kv->dcp > 1 ? kv->dcp : 1);
    return (int)((tokens + per - 1) / per);
}

/* Bytes the cache of `tokens` token positions takes on a backend of elem_bytes per element (the memory plan
 * of the engine sizes num_blocks from it); a double, so that an absurd request compares instead of wrapping. */
double k3c_kv_cache_bytes(const k3c_config *c, int elem_bytes, double tokens);
/* Fails with *kv zeroed (nothing to release); release is a no-op on a zeroed cache and zeroes it. */
int k3c_kv_cache_init(k3c_kv_cache *kv, k3c_backend *be, const k3c_config *c, int num_blocks, int block_size);
/* The cache of the MLA layers among [first, end) only (a pipeline stage's, model.h k3c_model_stage_layers);
 * layer[l] is NULL outside them. */
int k3c_kv_cache_init_layers(k3c_kv_cache *kv, k3c_backend *be, const k3c_config *c, int first, int end,
                             int num_blocks, int block_size);
double k3c_kv_cache_bytes_layers(const k3c_config *c, int first, int end, int elem_bytes, double tokens);
void k3c_kv_cache_release(k3c_kv_cache *kv, k3c_backend *be);
/* Pops a free block (one reference); -1 when none is left. */
int k3c_kv_cache_take(k3c_kv_cache *kv);
/* One more reference to a block that has one at least. */
void k3c_kv_cache_ref(k3c_kv_cache *kv, int block);
/* Drops a reference; at zero the block returns to the free list. With poison set its contents in every layer
 * are then overwritten with NaN first (a debug hook: any later read of a stale row shows up as NaN). */
void k3c_kv_cache_give(k3c_kv_cache *kv, k3c_backend *be, int block, int poison);

#endif
