/* The engine of include/k3c.h: a backend, the stock forward, the paged MLA cache, the KDA slots and the
 * request table, all allocated at creation. A step only takes cache blocks from the free list. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "model/model.h"
#include "runtime/engine_internal.h"
#include "runtime/kda_slots.h"
#include "runtime/kv_cache.h"
#include "stock/backend.h"
#include "stock/forward.h"
#include "util/error.h"

/* The CUDA backend exists only in builds with nvcc (K3C_HAVE_CUDA). The reference is strong there: a weak
 * one would not pull backend_cuda.o out of the static library. */
#ifdef K3C_HAVE_CUDA
static k3c_backend *(*const cuda_create)(int device) = k3c_backend_cuda_create;
static void (*const cuda_set_exact)(k3c_backend *be, int exact) = k3c_backend_cuda_set_exact;
#else
static k3c_backend *(*const cuda_create)(int device) = NULL;
static void (*const cuda_set_exact)(k3c_backend *be, int exact) = NULL;
#endif

typedef struct engine_request {
    int open;
    int length;   /* committed tokens */
    int pending;  /* tokens of an uncommitted verify, 0 when none */
    int nblocks;
    int32_t *blocks; /* [max_blocks_per_request] */
} engine_request;

struct k3c_engine {
    k3c_model *m;
    k3c_engine_options o;
    k3c_backend *be;
    k3c_forward *fwd;
    k3c_kv_cache kv;
    k3c_kda_slots ks;
    int max_blocks_per_request;
    engine_request *req; /* [max_requests], request id = KDA slot */
    int32_t *block_store;
    k3c_fwd_req *fr;     /* [max_requests] step scratch */
    int *aux_layers;     /* [o.num_aux] copy of the option */
    float *aux;          /* host [num_aux, max_rows, D]: the last step's streams, [num_aux, aux_rows, D] packed */
    int aux_rows;        /* logits rows of the last step; -1: none valid (no step yet, or it failed) */
    /* logits buffers malloc'ed because the backend's host_alloc refused (k3c_engine_logits_alloc's fallback),
     * so k3c_engine_logits_free gives them to free() and not to host_free; [n_fallback] of cap_fallback */
    float **fallback;
    int n_fallback, cap_fallback;
};

/* The aux layer list: strictly increasing indices in 0..num_layers, at most K3C_MAX_AUX. */
static int check_aux(const k3c_model *m, const k3c_engine_options *o) {
    int L = m->config.num_layers;
    if (o->num_aux < 0 || o->num_aux > K3C_MAX_AUX)
        return k3c_errorf("engine: num_aux %d outside 0..%d (K3C_MAX_AUX)", o->num_aux, K3C_MAX_AUX);
    if (o->num_aux > 0 && !o->aux_layers) return k3c_errorf("engine: num_aux %d but aux_layers is NULL", o->num_aux);
    for (int i = 0; i < o->num_aux; i++) {
        int a = o->aux_layers[i];
        if (a < 0 || a > L)
            return k3c_errorf("engine: aux_layers[%d] = %d outside 0..%d (layer indices; %d = the output)", i, a, L,
                              L);
        if (i > 0 && a <= o->aux_layers[i - 1])
            return k3c_errorf("engine: aux_layers[%d] = %d after %d: the list must be strictly increasing", i, a,
                              o->aux_layers[i - 1]);
    }
    return K3C_OK;
}

void k3c_engine_options_default(k3c_engine_options *o) {
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->max_requests = 4;
    o->max_rows = 256;
    o->max_context = 4096;
    o->block_size = 16;
    o->q_max = 8;
}

int k3c_engine_create(k3c_model *m, const k3c_engine_options *opt, k3c_engine **out) {
    *out = NULL;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    if (opt) {
        o = *opt;
        k3c_engine_options d;
        k3c_engine_options_default(&d);
        if (!o.device) o.device = d.device;
        if (o.max_requests <= 0) o.max_requests = d.max_requests;
        if (o.max_rows <= 0) o.max_rows = d.max_rows;
        if (o.max_context <= 0) o.max_context = d.max_context;
        if (o.block_size <= 0) o.block_size = d.block_size;
        if (o.q_max <= 0) o.q_max = d.q_max;
    }
    if (o.q_max > o.max_rows) return k3c_errorf("engine: q_max %d exceeds max_rows %d", o.q_max, o.max_rows);
    /* 64-bit: max_context and max_requests come from callers (CLI options), their product need not fit an int */
    int64_t mbr64 = ((int64_t)o.max_context + o.block_size - 1) / o.block_size;
    if (o.num_blocks <= 0) {
        int64_t blocks = mbr64 * o.max_requests;
        if (blocks > INT32_MAX)
            return k3c_errorf("engine: max_context %d x max_requests %d needs %lld cache blocks of %d tokens, "
                              "more than %d", o.max_context, o.max_requests, (long long)blocks, o.block_size,
                              INT32_MAX);
        o.num_blocks = (int)blocks;
    }
    int mbr = (int)mbr64;
    if (o.num_aux == 0) o.aux_layers = NULL;
    K3C_TRY(check_aux(m, &o));

    k3c_engine *e = calloc(1, sizeof *e);
    if (!e) return k3c_errorf("engine: out of memory");
    e->m = m;
    e->o = o;
    e->max_blocks_per_request = mbr;
    e->aux_rows = -1;
    if (o.num_aux > 0) {
        e->aux_layers = malloc(sizeof(int) * (size_t)o.num_aux);
        e->aux = malloc(sizeof(float) * (size_t)o.num_aux * o.max_rows * m->config.hidden_size);
        if (!e->aux_layers || !e->aux) {
            free(e->aux_layers);
            free(e->aux);
            free(e);
            return k3c_errorf("engine: out of host memory for %d aux streams of %d rows", o.num_aux, o.max_rows);
        }
        memcpy(e->aux_layers, o.aux_layers, sizeof(int) * (size_t)o.num_aux);
        e->o.aux_layers = e->aux_layers;
    }
    if (!strcmp(o.device, "cpu")) {
        e->be = k3c_backend_cpu_create(o.threads);
        if (e->be && o.exact_f32) k3c_backend_cpu_set_exact(e->be, 1);
    } else if (!strcmp(o.device, "cuda")) {
        if (!cuda_create) {
            free(e->aux_layers), free(e->aux), free(e);
            return k3c_errorf("engine: device 'cuda': this build has no CUDA backend");
        }
        e->be = cuda_create(0);
        if (e->be && o.exact_f32) cuda_set_exact(e->be, 1);
    } else {
        free(e->aux_layers), free(e->aux), free(e);
        return k3c_errorf("engine: unknown device '%s' (expected cpu or cuda)", o.device);
    }
    if (!e->be) {
        free(e->aux_layers), free(e->aux), free(e);
        return k3c_error_context("engine: device %s", o.device);
    }
    e->req = calloc((size_t)o.max_requests, sizeof *e->req);
    e->block_store = malloc(sizeof(int32_t) * (size_t)mbr * o.max_requests);
    e->fr = calloc((size_t)o.max_requests, sizeof *e->fr);
    if (!e->req || !e->block_store || !e->fr) {
        k3c_engine_free(e);
        return k3c_errorf("engine: out of host memory");
    }
    for (int i = 0; i < o.max_requests; i++) e->req[i].blocks = e->block_store + (size_t)i * mbr;

    k3c_forward_options fo = {.max_rows = o.max_rows, .max_segs = o.max_requests, .max_context = o.max_context,
                              .block_size = o.block_size, .chunk_min = o.chunk_min,
                              .mla_expand_min = o.mla_expand_min, .kv_fp8 = o.kv_fp8,
                              .aux_layers = e->aux_layers, .num_aux = o.num_aux};
    if (k3c_forward_create(e->be, m, &fo, &e->fwd) != K3C_OK ||
        k3c_kv_cache_init(&e->kv, e->be, &m->config, o.num_blocks, o.block_size) != K3C_OK ||
        k3c_kda_slots_init(&e->ks, e->be, &m->config, o.max_requests, o.q_max, o.max_requests) != K3C_OK) {
        k3c_engine_free(e);
        return k3c_error_context("engine");
    }
    *out = e;
    return K3C_OK;
}

void k3c_engine_free(k3c_engine *e) {
    if (!e) return;
    if (e->be) {
        k3c_forward_free(e->fwd);
        if (e->kv.layer) k3c_kv_cache_release(&e->kv, e->be);
        if (e->ks.state) k3c_kda_slots_release(&e->ks, e->be);
        e->be->destroy(e->be);
    }
    free(e->req);
    free(e->block_store);
    free(e->fr);
    free(e->aux_layers);
    free(e->aux);
    free(e->fallback); /* the list only: a buffer still held here is the caller's (k3c.h: free it before) */
    free(e);
}

int k3c_engine_vocab(const k3c_engine *e) { return e->m->config.vocab_size; }
int k3c_engine_max_rows(const k3c_engine *e) { return e->o.max_rows; }
int k3c_engine_hidden_size(const k3c_engine *e) { return e->m->config.hidden_size; }
int k3c_engine_prompt_grid(const k3c_engine *e) { return k3c_forward_prompt_grid(e->fwd); }

int k3c_engine_prompt_piece(const k3c_engine *e, int pos, int end, int max_tokens) {
    if (pos < 0 || pos >= end || max_tokens <= 0) return 0;
    return k3c_forward_prompt_piece(e->fwd, pos, end, max_tokens);
}

static int check_id(const k3c_engine *e, int id) {
    if (id < 0 || id >= e->o.max_requests || !e->req[id].open)
        return k3c_errorf("engine: request %d is not open", id);
    return K3C_OK;
}

int k3c_request_open(k3c_engine *e, int *id) {
    for (int i = 0; i < e->o.max_requests; i++) {
        engine_request *r = &e->req[i];
        if (r->open) continue;
        r->open = 1;
        r->length = r->pending = r->nblocks = 0;
        k3c_kda_slots_reset(&e->ks, e->be, i);
        *id = i;
        return e->be->sync(e->be);
    }
    return k3c_errorf("engine: all %d request slots are open", e->o.max_requests);
}

int k3c_request_close(k3c_engine *e, int id) {
    K3C_TRY(check_id(e, id));
    engine_request *r = &e->req[id];
    for (int b = r->nblocks - 1; b >= 0; b--) k3c_kv_cache_give(&e->kv, e->be, r->blocks[b], e->o.poison_freed_blocks);
    r->open = 0;
    r->nblocks = r->length = r->pending = 0;
    return e->be->sync(e->be);
}

int k3c_request_length(const k3c_engine *e, int id) {
    if (check_id(e, id) != K3C_OK) return -1;
    return e->req[id].length;
}

void k3c_engine_view_get(k3c_engine *e, k3c_engine_view *v) {
    *v = (k3c_engine_view){.m = e->m, .be = e->be, .kv = &e->kv, .ks = &e->ks, .max_requests = e->o.max_requests,
                           .max_rows = e->o.max_rows, .max_context = e->o.max_context,
                           .block_size = e->o.block_size, .q_max = e->o.q_max,
                           .max_blocks_per_request = e->max_blocks_per_request,
                           .aux_layers = e->aux_layers, .num_aux = e->o.num_aux, .aux = e->aux};
}

int k3c_engine_step_begin(k3c_engine *e, const k3c_step_item *items, int n, const k3c_fwd_req **reqs) {
    *reqs = e->fr;
    e->aux_rows = -1; /* valid again only once this step has run (step_end) */
    if (n > e->o.max_requests) return k3c_errorf("engine step: %d items, at most %d", n, e->o.max_requests);
    for (int i = 0; i < n; i++) {
        const k3c_step_item *it = &items[i];
        K3C_TRY(check_id(e, it->request));
        engine_request *r = &e->req[it->request];
        if (r->pending)
            return k3c_errorf("engine step: request %d has an uncommitted verify of %d tokens", it->request,
                              r->pending);
        for (int j = 0; j < i; j++)
            if (items[j].request == it->request)
                return k3c_errorf("engine step: request %d appears twice", it->request);
        if (it->n <= 0 || !it->tokens) return k3c_errorf("engine step: item %d has no tokens", i);
        if (it->n > e->o.max_context - r->length)
            return k3c_errorf("engine step: request %d would hold %lld tokens, max_context is %d", it->request,
                              (long long)r->length + it->n, e->o.max_context);
        /* blocks covering every row written this step */
        int need = (r->length + it->n + e->o.block_size - 1) / e->o.block_size;
        while (r->nblocks < need) {
            int b = k3c_kv_cache_take(&e->kv);
            if (b < 0) return k3c_errorf("engine step: the MLA cache is out of blocks (%d)", e->kv.num_blocks);
            r->blocks[r->nblocks++] = b;
        }
        e->fr[i] = (k3c_fwd_req){.ids = it->tokens, .n = it->n, .pos = r->length, .block_table = r->blocks,
                                 .slot = it->request, .verify = it->verify,
                                 .logits = (it->verify || it->all_logits) ? K3C_LOGITS_ALL : K3C_LOGITS_LAST};
    }
    return K3C_OK;
}

int k3c_step_logits_rows(const k3c_step_item *items, int n) {
    int rows = 0;
    for (int i = 0; i < n; i++) rows += items[i].verify || items[i].all_logits ? items[i].n : 1; /* step_begin's */
    return rows;
}

void k3c_engine_step_end(k3c_engine *e, const k3c_step_item *items, int n) {
    for (int i = 0; i < n; i++) {
        engine_request *r = &e->req[items[i].request];
        if (items[i].verify) r->pending = items[i].n;
        else r->length += items[i].n;
    }
    e->aux_rows = k3c_step_logits_rows(items, n);
}

/* Adds p to the engine's fallback list (grown by doubling). */
static int fallback_record(k3c_engine *e, float *p) {
    if (e->n_fallback == e->cap_fallback) {
        int cap = e->cap_fallback ? 2 * e->cap_fallback : 4;
        float **f = realloc(e->fallback, sizeof *f * (size_t)cap);
        if (!f) return K3C_ERR;
        e->fallback = f;
        e->cap_fallback = cap;
    }
    e->fallback[e->n_fallback++] = p;
    return K3C_OK;
}

float *k3c_engine_logits_alloc(k3c_engine *e, int rows) {
    if (rows < 1) {
        k3c_errorf("engine logits_alloc: %d rows (want >= 1)", rows);
        return NULL;
    }
    size_t row_bytes = (size_t)e->m->config.vocab_size * sizeof(float);
    if ((size_t)rows > SIZE_MAX / row_bytes) {
        k3c_errorf("engine logits_alloc: %d rows x vocab %d floats do not fit in memory", rows,
                   e->m->config.vocab_size);
        return NULL;
    }
    size_t bytes = (size_t)rows * row_bytes;
    if (!e->be->host_alloc) {
        float *p = malloc(bytes);
        if (!p)
            k3c_errorf("engine logits_alloc: out of host memory (%d rows x vocab %d)", rows, e->m->config.vocab_size);
        return p;
    }
    float *p = e->be->host_alloc(e->be, bytes);
    if (p) return p;
    /* Page-locked memory refused (the driver or the host will not pin that much): fall back to malloc.
     * Page-locked is only a speed-up: the download into malloc'ed memory goes through the driver's staging
     * (5-9 GB/s instead of ~55 on the H200 host, docs/BENCHMARKS.md), so the engine keeps working, slower,
     * and says so once per buffer. The buffer is recorded so logits_free hands it to free(). */
    char why[512];
    snprintf(why, sizeof why, "%s", k3c_error_message());
    p = malloc(bytes);
    if (!p || fallback_record(e, p) != K3C_OK) {
        free(p);
        k3c_errorf("engine logits_alloc: out of host memory (%d rows x vocab %d) after page-locked memory was "
                   "refused: %s", rows, e->m->config.vocab_size, why);
        return NULL;
    }
    fprintf(stderr, "k3c: warning: logits (%d rows x vocab %d) fall back to malloc'ed memory (a slower download): %s\n",
            rows, e->m->config.vocab_size, why);
    return p;
}

void k3c_engine_logits_free(k3c_engine *e, float *logits) {
    if (!logits) return;
    for (int i = 0; i < e->n_fallback; i++)
        if (e->fallback[i] == logits) { /* no wait as in host_free: a download into pageable memory is
                                          * synchronous to the host (CUDA), so none is in flight */
            e->fallback[i] = e->fallback[--e->n_fallback];
            free(logits);
            return;
        }
    if (e->be->host_free) e->be->host_free(e->be, logits);
    else free(logits);
}

int k3c_engine_step(k3c_engine *e, const k3c_step_item *items, int n, float *logits) {
    if (n <= 0) return K3C_OK;
    const k3c_fwd_req *fr;
    K3C_TRY(k3c_engine_step_begin(e, items, n, &fr));
    K3C_TRY(k3c_forward_step(e->fwd, &e->kv, &e->ks, fr, n, logits, e->aux));
    k3c_engine_step_end(e, items, n);
    return K3C_OK;
}

int k3c_request_commit(k3c_engine *e, int id, int accepted) {
    K3C_TRY(check_id(e, id));
    engine_request *r = &e->req[id];
    if (!r->pending) return k3c_errorf("engine commit: request %d has no verify to commit", id);
    if (accepted < 0 || accepted > r->pending)
        return k3c_errorf("engine commit: request %d: accepted %d outside 0..%d", id, accepted, r->pending);
    K3C_TRY(k3c_forward_commit(e->fwd, &e->ks, id, accepted));
    r->length += accepted;
    r->pending = 0;
    return K3C_OK;
}

int k3c_engine_aux(const k3c_engine *e, int j, float *out, int *rows) {
    if (e->o.num_aux == 0) return k3c_errorf("engine aux: the engine has no aux layers (k3c_engine_options.aux_layers)");
    if (j < 0 || j >= e->o.num_aux) return k3c_errorf("engine aux: stream %d outside 0..%d", j, e->o.num_aux - 1);
    if (e->aux_rows < 0)
        return k3c_errorf("engine aux: no step has run since the engine was created or the last step failed");
    size_t n = (size_t)e->aux_rows * e->m->config.hidden_size;
    if (n) {
        if (!out) return k3c_errorf("engine aux: no output buffer for %d rows", e->aux_rows);
        memcpy(out, e->aux + (size_t)j * n, n * sizeof(float));
    }
    if (rows) *rows = e->aux_rows;
    return K3C_OK;
}
