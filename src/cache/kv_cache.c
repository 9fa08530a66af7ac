#include "cache/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static int mla_layers(const k3c_config *c, int first, int end) {
    int n = 0;
    for (int l = first; l < end; l++) n += c->layer_attn[l] == K3C_ATTN_MLA;
    return n;
}

double k3c_kv_cache_bytes(const k3c_config *c, int elem_bytes, double tokens) {
    return k3c_kv_cache_bytes_layers(c, 0, c->num_layers, elem_bytes, tokens);
}

double k3c_kv_cache_bytes_layers(const k3c_config *c, int first, int end, int elem_bytes, double tokens) {
    if (first < 0) first = 0;
    if (end > c->num_layers) end = c->num_layers;
    return tokens * k3c_config_mla_latent(c) * elem_bytes * mla_layers(c, first, end);
}

int k3c_kv_cache_init(k3c_kv_cache *kv, k3c_backend *be, const k3c_config *c, int num_blocks, int block_size) {
    return k3c_kv_cache_init_layers(kv, be, c, 0, c->num_layers, num_blocks, block_size);
}

/* On failure everything is released here and *kv is left zeroed: k3c_kv_cache_release on it is a no-op, so
 * an owner that releases whatever it initialized never frees these arrays twice. */
int k3c_kv_cache_init_layers(k3c_kv_cache *kv, k3c_backend *be, const k3c_config *c, int first, int end,
                             int num_blocks, int block_size) {
    memset(kv, 0, sizeof *kv);
    const int L = c->num_layers; /* a local: the stores through kv below would make the compiler re-read it */
    if (L <= 0) return k3c_errorf("kv cache: num_layers %d must be positive", L);
    if (first < 0 || end > L || first >= end)
        return k3c_errorf("kv cache: layers [%d, %d) of a model of %d", first, end, L);
    if (num_blocks <= 0 || block_size <= 0)
        return k3c_errorf("kv cache: num_blocks %d and block_size %d must be positive", num_blocks, block_size);
    kv->num_blocks = num_blocks;
    kv->num_layers = L;
    kv->block_size = block_size;
    kv->latent = k3c_config_mla_latent(c);
    kv->layer_bytes = (size_t)num_blocks * block_size * kv->latent * be->kv_elem_bytes;
    int n_mla = mla_layers(c, first, end);
    kv->layer = calloc((size_t)L, sizeof *kv->layer);
    kv->free_ids = malloc(sizeof(int) * (size_t)num_blocks);
    kv->ref = calloc((size_t)num_blocks, sizeof(int));
    if (!kv->layer || !kv->free_ids || !kv->ref) {
        k3c_kv_cache_release(kv, be);
        return k3c_errorf_kind(K3C_ERROR_OOM, "kv cache: out of host memory (%d blocks)", num_blocks);
    }
    if (n_mla > 0) {
        kv->base = be->alloc(be, kv->layer_bytes * n_mla);
        if (!kv->base) {
            k3c_kv_cache_release(kv, be);
            return k3c_error_context("kv cache (%d MLA layers x %zu bytes)", n_mla, kv->layer_bytes);
        }
        /* zeroed so that a bug reading unwritten rows gives a finite, reproducible result */
        be->fill_bytes(be, kv->base, 0, kv->layer_bytes * n_mla);
        int i = 0;
        for (int l = first; l < end; l++)
            if (c->layer_attn[l] == K3C_ATTN_MLA) kv->layer[l] = (char *)kv->base + kv->layer_bytes * i++;
    }
    /* lowest ids on top of the stack */
    for (int b = 0; b < num_blocks; b++) kv->free_ids[b] = num_blocks - 1 - b;
    kv->num_free = num_blocks;
    return K3C_OK;
}

void k3c_kv_cache_release(k3c_kv_cache *kv, k3c_backend *be) {
    if (kv->base && be) be->free(be, kv->base);
    free(kv->layer);
    free(kv->free_ids);
    free(kv->ref);
    memset(kv, 0, sizeof *kv);
}

int k3c_kv_cache_take(k3c_kv_cache *kv) {
    if (kv->num_free <= 0) return -1;
    int b = kv->free_ids[--kv->num_free];
    kv->ref[b] = 1;
    return b;
}

void k3c_kv_cache_ref(k3c_kv_cache *kv, int block) { kv->ref[block]++; }

void k3c_kv_cache_give(k3c_kv_cache *kv, k3c_backend *be, int block, int poison) {
    if (--kv->ref[block] > 0) return;
    if (poison) {
        size_t bb = (size_t)kv->block_size * kv->latent * be->kv_elem_bytes;
        for (int l = 0; l < kv->num_layers; l++)
            if (kv->layer[l]) be->fill_bytes(be, (char *)kv->layer[l] + bb * block, 0xff, bb);
    }
    kv->free_ids[kv->num_free++] = block;
}
