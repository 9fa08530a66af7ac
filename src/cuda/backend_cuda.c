/* The CUDA backend of the stock forward (backend/backend.h): every op is one or a few launches of the kernels
 * in src/cuda on one stream, so a step is queued without host waits until the forward's download/sync.
 *
 * Weights: init() copies every tensor of the model's inventory once into ONE device arena (matrices, MXFP4
 * packed and scale bytes, f32 vectors, and per MoE layer a device array of k3c_cuda_expert), and keeps a
 * table host pointer -> device pointer sorted by host address; ops translate the host views they are given
 * (k3c_mat.w, vectors, the experts array) by binary search. A device-synthetic model (model.h) has no host
 * bytes: its matrices are generated in the arena by fill kernels instead (bf16 N(0, std^2) with synth's std,
 * MXFP4 random codes with scales that keep rows well-conditioned).
 *
 * Metadata (token ids, cache slots, block tables, segment arrays, source-pointer arrays): written into a
 * pinned host staging area and copied with cudaMemcpyAsync into a device mirror at the same offset, both
 * bump-allocated and reset at sync(). Stream order protects the device side; the host side is never reused
 * before a sync (when a step overflows the area, the op waits for the stream and starts over at 0).
 *
 * MLA cache element: bf16 (kv_elem_bytes = 2); the latent rows are bf16-rounded by the contract, so this is
 * exact. Errors: an op that fails records the first message and turns every later op into a no-op until
 * sync() reports it. */
#ifdef K3C_HAVE_CUDA /* the whole file: without nvcc the engine reports that CUDA is not built in */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda/attnres.h"
#include "cuda/backend_kernels.h"
#include "cuda/check.h"
#include "cuda/elementwise.h"
#include "cuda/gemm.h"
#include "cuda/kda.h"
#include "cuda/kernel_limits.h"
#include "cuda/mla.h"
#include "cuda/mla_expanded.h"
#include "cuda/moe.h"
#include "cuda/router.h"
#include "cuda/op_profile.h"
#include "cuda/upload.h"
#include "model/model.h"
#include "model/synth.h"
#include "backend/backend.h"
#include "util/error.h"
#include "util/log.h"
#include "util/rng.h"

typedef struct wmap_entry {
    uintptr_t host; /* host view (key) */
    size_t bytes;
    void *dev;      /* its copy in the arena */
} wmap_entry;

typedef struct cuda_ctx {
    int device;
    cudaStream_t stream;
    const struct k3c_model *m;
    const k3c_config *c;
    k3c_backend_limits lim;
    int silu_gate;
    int exact; /* diagnostic (k3c_backend_cuda_set_exact): no bf16 rounding, f32 MLA cache, no cuBLASLt */
    k3c_cuda_act act;
    k3c_cuda_router router;

    /* weights */
    void *arena;
    size_t arena_bytes;
    wmap_entry *map; /* sorted by host */
    size_t nmap;

    /* metadata staging: pinned host area and its device mirror */
    uint8_t *meta_host, *meta_dev;
    size_t meta_cap, meta_used;

    /* step scratch, one device allocation */
    void *scratch;
    float *q_abs, *o_lat;          /* MLA */
    float *mla_part;               /* MLA attention's position splits, mla_part_floats (cuda/mla.h) */
    size_t mla_part_floats;
    float *logits, *wts;           /* MoE router [R, E], [R, k] */
    int *idx;                      /* [R, k] */
    float *z, *h, *part, *r, *rup; /* MoE [R, Rin], [R*k, F], [R*k, Rin], [R, Rin], [R, D] */
    float *sa, *su, *sh;           /* shared expert [R, Fs] x2, [R, D] */
    float *kda_o;                  /* [R, P]: o of a commit when the caller passes none (unused by the kernels) */
    float *ones;                   /* [PK]: weights 1 of moe_experts' one-slot sum (PK: h's and part's rows) */
    k3c_cuda_gemm gemm;
    void *gemm_ws;
    uint16_t *xbf;
    int gemm_ready;
    /* MLA expanded form (cuda/mla_expanded.h): its own allocation, passes of mla_chunk positions */
    void *mla_x;
    int mla_chunk;

    k3c_op_profile *prof; /* NULL unless K3C_CUDA_PROFILE */
    k3c_cuda_upload_stats load; /* the weight upload of init */

    /* host scratch for building metadata (pinned area is written directly) */
    int failed;
    char err[1024];
    k3c_error_kind err_kind; /* of the recorded failure, reported by sync with err */
} cuda_ctx;

/* ---- errors ---- */

static void record(cuda_ctx *x, const char *op) {
    if (x->failed) return;
    x->failed = 1;
    snprintf(x->err, sizeof x->err, "%s: %s", op, k3c_error_message());
    x->err_kind = k3c_error_kind_get();
}

static void record_cuda(cuda_ctx *x, const char *op, cudaError_t e) {
    if (x->failed) return;
    x->failed = 1;
    snprintf(x->err, sizeof x->err, "%s: CUDA error %s (%s)", op, cudaGetErrorName(e), cudaGetErrorString(e));
    x->err_kind = K3C_CUDA_ERROR_KIND(e);
}

/* Also the timing site of the op profile (cuda/op_profile.h; a no-op unless K3C_CUDA_PROFILE is set). */
#define OP_TRY(x, op, call)                                                                                        \
    do {                                                                                                           \
        int prof_slot_ = k3c_op_profile_begin((x)->prof, (op), (x)->stream);                                       \
        if ((call) != K3C_OK) {                                                                                    \
            record((x), (op));                                                                                     \
            return;                                                                                                \
        }                                                                                                          \
        k3c_op_profile_end((x)->prof, prof_slot_, (x)->stream);                                                    \
    } while (0)

#define OP_CUDA(x, op, call)                                                                                       \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            record_cuda((x), (op), e_);                                                                            \
            return;                                                                                                \
        }                                                                                                          \
    } while (0)

/* The round_bf16 argument of the launchers: the contract's bf16 stores, or none in the exact diagnostic. */
#define RND(x) (!(x)->exact)

/* y [T, rows] = x W^T. The exact diagnostic keeps f32 activations, so it avoids cuBLASLt (which reads them as
 * bf16) and uses the streaming kernel for every T. */
static int mm(cuda_ctx *x, const uint16_t *W, int rows, int cols, const float *in, int T, float *y) {
    return k3c_cuda_matmul_bf16(x->exact ? NULL : &x->gemm, W, rows, cols, in, T, y, x->stream);
}

/* The same with the stock contract's bf16 rounding of the outputs (never in exact mode), fused into the
 * product's stores. */
static int mm_rounded(cuda_ctx *x, const uint16_t *W, int rows, int cols, const float *in, int T, float *y) {
    return k3c_cuda_matmul_bf16_round(x->exact ? NULL : &x->gemm, W, rows, cols, in, T, y, !x->exact, x->stream);
}

/* ---- weight table ---- */

static int by_host(const void *a, const void *b) {
    uintptr_t x = ((const wmap_entry *)a)->host, y = ((const wmap_entry *)b)->host;
    return x < y ? -1 : x > y;
}

/* Device address of the host view p (anywhere inside an uploaded tensor), or NULL. */
static void *wdev(const cuda_ctx *x, const void *p) {
    uintptr_t h = (uintptr_t)p;
    size_t lo = 0, hi = x->nmap;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x->map[mid].host <= h) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return NULL;
    const wmap_entry *e = &x->map[lo - 1];
    if (h - e->host >= (e->bytes ? e->bytes : 1)) return NULL;
    return (char *)e->dev + (h - e->host);
}

/* The device copy of a weight, or a recorded error naming the op. */
#define WDEV(x, op, ptr, out)                                                                                      \
    do {                                                                                                           \
        (out) = wdev((x), (ptr));                                                                                  \
        if (!(out)) {                                                                                              \
            if (!(x)->failed) {                                                                                    \
                (x)->failed = 1;                                                                                   \
                (x)->err_kind = K3C_ERROR_INTERNAL;                                                                \
                snprintf((x)->err, sizeof (x)->err, "%s: weight at host address %p was not uploaded in init",     \
                         (op), (const void *)(ptr));                                                               \
            }                                                                                                      \
            return;                                                                                                \
        }                                                                                                          \
    } while (0)

/* ---- metadata staging ---- */

/* Room for `bytes` of metadata: returns the pinned host pointer to fill, *dev its device mirror. NULL (error
 * recorded) only when one request exceeds the whole area. */
static void *meta_alloc(cuda_ctx *x, size_t bytes, void **dev) {
    size_t need = (bytes + 15) & ~(size_t)15;
    if (need > x->meta_cap) {
        if (!x->failed) {
            x->failed = 1;
            x->err_kind = K3C_ERROR_INTERNAL;
            snprintf(x->err, sizeof x->err, "metadata of %zu bytes exceeds the %zu-byte staging area", bytes,
                     x->meta_cap);
        }
        return NULL;
    }
    if (x->meta_used + need > x->meta_cap) {
        /* the earlier copies out of the area must have finished before it is rewritten */
        cudaError_t e = cudaStreamSynchronize(x->stream);
        if (e != cudaSuccess) {
            record_cuda(x, "metadata staging: stream synchronize", e);
            return NULL;
        }
        x->meta_used = 0;
    }
    void *h = x->meta_host + x->meta_used;
    *dev = x->meta_dev + x->meta_used;
    x->meta_used += need;
    return h;
}

/* Queues the copy of a filled metadata block to its device mirror. */
static int meta_send(cuda_ctx *x, const void *host, void *dev, size_t bytes) {
    if (!bytes) return K3C_OK;
    cudaError_t e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, x->stream);
    if (e != cudaSuccess) {
        record_cuda(x, "metadata copy", e);
        return K3C_ERR;
    }
    return K3C_OK;
}

/* Copies n ints to the device through the staging area; NULL on failure (recorded). */
static int *meta_ints(cuda_ctx *x, const int32_t *src, int n) {
    void *dev;
    int *h = meta_alloc(x, sizeof(int) * (size_t)(n > 0 ? n : 1), &dev);
    if (!h) return NULL;
    for (int i = 0; i < n; i++) h[i] = src[i];
    return meta_send(x, h, dev, sizeof(int) * (size_t)n) == K3C_OK ? dev : NULL;
}

/* ---- lifetime ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct progress {
    const char *what;
    double total, done, t0, last;
    int show;
} progress;

/* Progress events (include/k3c.h k3c_set_progress; the default is the line on stderr) every 0.25 s. */
static void progress_update(progress *p, size_t add, int final) {
    p->done += (double)add;
    if (!p->show) return;
    double t = now_s();
    if (!final && t - p->last < 0.25) return;
    p->last = t;
    k3c_progress_report(p->what, p->done, p->total, t - p->t0, final);
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Host bytes of one inventory tensor as bound (vectors: the f32 array of vec_len). */
static const void *spec_host(const k3c_tensor_spec *s, size_t *bytes) {
    switch (s->cls) {
    case K3C_TENSOR_MATRIX:
        *bytes = (size_t)k3c_tensor_spec_bytes(s);
        return s->mat ? (const void *)s->mat->w : NULL;
    case K3C_TENSOR_MXFP4_PACKED:
        *bytes = (size_t)k3c_tensor_spec_bytes(s);
        return s->mx ? (const void *)s->mx->packed : NULL;
    case K3C_TENSOR_MXFP4_SCALE:
        *bytes = (size_t)k3c_tensor_spec_bytes(s);
        return s->mx ? (const void *)s->mx->scale : NULL;
    case K3C_TENSOR_VECTOR:
        *bytes = sizeof(float) * (size_t)s->vec_len;
        return s->vec ? (const void *)*s->vec : NULL;
    }
    return NULL;
}

/* The MXFP4 scale byte of a synthetic matrix with `cols` inputs: E2M1 codes drawn uniformly have RMS 2.93,
 * scales alternate between b and b-1 (mean square 0.625 * 4^(b-127)), so entries have RMS
 * 2.32 * 2^(b-127) ~ 1/sqrt(cols), the scale of synth's N(0, 1/cols) matrices. */
static int synthetic_scale_byte(int cols) {
    return 127 + (int)lround(-log2(2.32 * sqrt((double)(cols > 0 ? cols : 1))));
}

/* The upload's hooks (cuda/upload.h): the MXFP4 repack of a packed tensor queued right after its last copy,
 * and the progress line. */
typedef struct upload_hook_ctx {
    const k3c_inventory *inv;
    const size_t *spec_of; /* extent -> inventory index */
    void **devs;
    progress *pg;
    uint64_t queued;
} upload_hook_ctx;

static int upload_extent_done(void *ctx, size_t extent, cudaStream_t stream) {
    upload_hook_ctx *h = ctx;
    size_t i = h->spec_of[extent];
    const k3c_tensor_spec *s = &h->inv->specs[i];
    if (s->cls != K3C_TENSOR_MXFP4_PACKED) return K3C_OK;
    /* MXFP4 codes into the routed-experts kernels' layout (cuda/moe.h), in place on the device */
    if (k3c_cuda_mxfp4_repack(h->devs[i], (size_t)k3c_tensor_spec_bytes(s), stream) != K3C_OK)
        return k3c_error_context("cuda backend: %s", s->name);
    return K3C_OK;
}

static void upload_queued(void *ctx, uint64_t bytes) {
    upload_hook_ctx *h = ctx;
    progress_update(h->pg, (size_t)(bytes - h->queued), 0);
    h->queued = bytes;
}

/* Uploads (or, device-synthetic, generates) every inventory tensor into the arena entries already laid
 * out in x->map order of the inventory. Host bytes go through the staged upload (cuda/upload.h: pinned
 * buffers filled by reader threads while the previous ones copy); the arena is in inventory order, so the
 * extents are too. */
static int fill_arena(cuda_ctx *x, const struct k3c_model *m, void **devs) {
    const k3c_inventory *inv = &m->inventory;
    progress pg = {.what = m->device_synthetic ? "cuda: generating weights" : "cuda: uploading weights", .t0 = now_s()};
    k3c_stage_extent *ex = calloc(inv->count + 1, sizeof *ex);
    size_t *spec_of = calloc(inv->count + 1, sizeof *spec_of), n = 0;
    if (!ex || !spec_of) {
        free(ex);
        free(spec_of);
        return k3c_errorf("cuda backend: out of host memory planning the upload of %zu tensors", inv->count);
    }
    int rc = K3C_ERR;
    for (size_t i = 0; i < inv->count; i++) {
        size_t b;
        if (spec_host(&inv->specs[i], &b)) pg.total += (double)b;
    }
    pg.show = pg.total >= (double)(256u << 20);
    pg.last = pg.t0;
    for (size_t i = 0; i < inv->count; i++) {
        const k3c_tensor_spec *s = &inv->specs[i];
        size_t bytes;
        const uint8_t *src = spec_host(s, &bytes);
        if (!src || !devs[i]) continue;
        if (m->device_synthetic && s->cls != K3C_TENSOR_VECTOR) {
            uint64_t seed = (uint64_t)m->synthetic_seed ^ k3c_hash_str(s->name);
            if (s->cls == K3C_TENSOR_MATRIX) {
                if (k3c_cuda_fill_bf16_normal(devs[i], bytes / 2, (float)k3c_synth_matrix_std(s), seed, x->stream))
                    goto done;
            } else {
                int cols = s->mx ? s->mx->cols : 0;
                int sb = synthetic_scale_byte(cols);
                if (s->cls == K3C_TENSOR_MXFP4_PACKED) {
                    /* random codes in the standard layout, then the device layout as for real bytes */
                    if (k3c_cuda_fill_mxfp4(devs[i], bytes, NULL, 0, sb, seed, x->stream) ||
                        k3c_cuda_mxfp4_repack(devs[i], bytes, x->stream))
                        goto done;
                } else if (k3c_cuda_fill_mxfp4(NULL, 0, devs[i], bytes, sb, seed, x->stream)) {
                    goto done;
                }
            }
            progress_update(&pg, bytes, 0);
            continue;
        }
        ex[n] = (k3c_stage_extent){(uint64_t)((uint8_t *)devs[i] - (uint8_t *)x->arena), src, bytes};
        spec_of[n++] = i;
    }
    upload_hook_ctx hc = {.inv = inv, .spec_of = spec_of, .devs = devs, .pg = &pg};
    k3c_cuda_upload_hooks hooks = {.ctx = &hc, .extent_done = upload_extent_done, .queued = upload_queued};
    if (k3c_cuda_upload(x->arena, ex, n, x->stream, NULL, &hooks, &x->load) != K3C_OK) {
        k3c_error_context("cuda backend: weight upload");
        goto done;
    }
    cudaError_t e = cudaStreamSynchronize(x->stream);
    if (e != cudaSuccess) {
        k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "cuda backend: weight upload: %s", cudaGetErrorString(e));
        goto done;
    }
    if (m->device_synthetic) {
        progress_update(&pg, 0, 1);
    } else if (pg.show) {
        const k3c_cuda_upload_stats *st = &x->load;
        double gb = (double)st->run.payload / 1e9;
        k3c_log(K3C_LOG_INFO, "cuda: uploaded weights %.2f GB in %.3f s: %.2f GB/s (%d readers, %d x %zu MiB %s "
                              "staging)", gb, st->seconds, st->seconds > 0 ? gb / st->seconds : 0, st->run.readers,
                st->buffers, st->buffer_bytes >> 20, st->pinned ? "pinned" : "pageable");
    }
    rc = K3C_OK;
done:
    if (rc != K3C_OK) progress_update(&pg, 0, 1); /* ends the progress line */
    free(ex);
    free(spec_of);
    return rc;
}

static void free_all(cuda_ctx *x) {
    if (x->gemm_ready) k3c_cuda_gemm_free(&x->gemm);
    x->gemm_ready = 0;
    if (x->arena) cudaFree(x->arena);
    if (x->scratch) cudaFree(x->scratch);
    if (x->gemm_ws) cudaFree(x->gemm_ws);
    if (x->xbf) cudaFree(x->xbf);
    if (x->mla_x) cudaFree(x->mla_x);
    x->mla_x = NULL;
    if (x->meta_dev) cudaFree(x->meta_dev);
    if (x->meta_host) cudaFreeHost(x->meta_host);
    free(x->map);
    x->arena = x->scratch = x->gemm_ws = NULL;
    x->xbf = NULL;
    x->meta_dev = x->meta_host = NULL;
    x->map = NULL;
    x->nmap = 0;
}

static int cuda_init_inner(k3c_backend *be, const struct k3c_model *m, const k3c_backend_limits *lim) {
    cuda_ctx *x = be->ctx;
    const k3c_config *c = &m->config;
    const k3c_inventory *inv = &m->inventory;
    x->m = m;
    x->c = c;
    x->lim = *lim;
    x->silu_gate = k3c_config_kda_silu_gate(c);
    x->act = (k3c_cuda_act){c->hidden_act == K3C_ACT_SITU ? 2 : 1, c->situ_beta, c->situ_linear_beta};
    int G = c->use_grouped_topk && c->num_expert_group > 1 ? c->num_expert_group : 1;
    x->router = (k3c_cuda_router){c->num_experts, c->num_experts_per_token, c->router_sigmoid, c->use_correction_bias,
                                  G, c->topk_group, c->moe_renormalize, c->routed_scaling_factor};
    K3C_CUDA_TRY(cudaSetDevice(x->device));

    /* ---- the arena: every inventory tensor, then each MoE layer's expert table ---- */
    size_t n_moe = 0;
    for (int l = 0; l < c->num_layers; l++) n_moe += m->weights.layers[l].is_moe && m->weights.layers[l].moe.experts;
    x->map = calloc(inv->count + n_moe + 1, sizeof *x->map);
    void **devs = calloc(inv->count + 1, sizeof *devs);
    if (!x->map || !devs) {
        free(devs);
        return k3c_errorf_kind(K3C_ERROR_OOM, "cuda backend: out of host memory for the weight table (%zu tensors)", inv->count);
    }
    size_t total = 0, max_cols = 1;
    for (size_t i = 0; i < inv->count; i++) {
        size_t b;
        const void *h = spec_host(&inv->specs[i], &b);
        if (!h) continue;
        total += align256(b);
        if (inv->specs[i].cls == K3C_TENSOR_MATRIX && (size_t)inv->specs[i].shape[1] > max_cols)
            max_cols = (size_t)inv->specs[i].shape[1];
    }
    size_t experts_off = total;
    total += n_moe * align256(sizeof(k3c_cuda_expert) * (size_t)c->num_experts);
    cudaError_t e = cudaMalloc(&x->arena, total ? total : 256);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        free(devs);
        x->arena = NULL;
        return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "cuda backend: cannot allocate the weight arena of %.2f GB (device has %.2f GB free of "
                          "%.2f GB): %s", total / 1e9, fr / 1e9, tot / 1e9, cudaGetErrorString(e));
    }
    x->arena_bytes = total;
    size_t off = 0;
    for (size_t i = 0; i < inv->count; i++) {
        size_t b;
        const void *h = spec_host(&inv->specs[i], &b);
        if (!h) continue;
        devs[i] = (char *)x->arena + off;
        x->map[x->nmap++] = (wmap_entry){(uintptr_t)h, b, devs[i]};
        off += align256(b);
    }
    qsort(x->map, x->nmap, sizeof *x->map, by_host);
    for (size_t i = 1; i < x->nmap; i++)
        if (x->map[i].host < x->map[i - 1].host + x->map[i - 1].bytes) {
            free(devs);
            return k3c_errorf("cuda backend: two weights share host bytes at %p (a tensor bound twice?)",
                              (void *)x->map[i].host);
        }
    int rc = fill_arena(x, m, devs);
    free(devs);
    K3C_TRY(rc);

    /* expert tables: device views of each expert's three matrices */
    if (n_moe) {
        size_t E = (size_t)c->num_experts;
        k3c_cuda_expert *tab = calloc(E, sizeof *tab);
        if (!tab) return k3c_errorf_kind(K3C_ERROR_OOM, "cuda backend: out of host memory for an expert table of %zu", E);
        size_t moff = experts_off;
        int mx = c->expert_format == K3C_EXPERTS_MXFP4;
        size_t n_tables = x->nmap;
        for (int l = 0; l < c->num_layers; l++) {
            const k3c_moe_weights *w = &m->weights.layers[l].moe;
            if (!m->weights.layers[l].is_moe || !w->experts) continue;
            for (size_t j = 0; j < E; j++) {
                const k3c_expert *ex = &w->experts[j];
                k3c_cuda_expert d = {0};
                /* an expert-parallel shard's experts of other ranks (model/shard.h): an empty entry, which
                 * moe_experts refuses and moe never meets (the forward routes through moe_route there) */
                if (m->ep_size > 1 && !(mx ? (const void *)ex->q1.packed : (const void *)ex->w1.w)) {
                    tab[j] = d;
                    continue;
                }
                if (mx) {
                    d.gate_packed = wdev(x, ex->q1.packed); d.gate_scale = wdev(x, ex->q1.scale);
                    d.up_packed = wdev(x, ex->q3.packed);   d.up_scale = wdev(x, ex->q3.scale);
                    d.down_packed = wdev(x, ex->q2.packed); d.down_scale = wdev(x, ex->q2.scale);
                    if (!d.gate_packed || !d.gate_scale || !d.up_packed || !d.up_scale || !d.down_packed ||
                        !d.down_scale) {
                        free(tab);
                        return k3c_errorf("cuda backend: layer %d expert %zu: MXFP4 weights missing", l, j);
                    }
                } else {
                    d.gate_w = wdev(x, ex->w1.w); d.up_w = wdev(x, ex->w3.w); d.down_w = wdev(x, ex->w2.w);
                    if (!d.gate_w || !d.up_w || !d.down_w) {
                        free(tab);
                        return k3c_errorf("cuda backend: layer %d expert %zu: bf16 weights missing", l, j);
                    }
                }
                tab[j] = d;
            }
            void *dev = (char *)x->arena + moff;
            moff += align256(sizeof(k3c_cuda_expert) * E);
            e = cudaMemcpy(dev, tab, sizeof(k3c_cuda_expert) * E, cudaMemcpyHostToDevice);
            if (e != cudaSuccess) {
                free(tab);
                return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "cuda backend: expert table of layer %d: %s", l, cudaGetErrorString(e));
            }
            /* appended past the sorted part, which the lookups above and below keep using */
            x->map[n_tables++] = (wmap_entry){(uintptr_t)w->experts, sizeof(k3c_expert) * E, dev};
        }
        free(tab);
        x->nmap = n_tables;
        qsort(x->map, x->nmap, sizeof *x->map, by_host);
    }

    /* ---- step scratch ---- */
    size_t R = (size_t)lim->max_rows, D = c->hidden_size, P = k3c_config_kda_proj(c);
    size_t Hm = c->num_attention_heads, lat = k3c_config_mla_latent(c), kvl = c->kv_lora_rank;
    size_t E = c->num_experts, K = c->num_experts_per_token > 0 ? c->num_experts_per_token : 1;
    size_t Rin = k3c_config_expert_in(c), F = c->moe_intermediate_size, Fs = k3c_config_shared_width(c);
    /* the experts' rows: a step's pairs, or an expert-parallel rank's moe_experts call (every rank's pairs) */
    size_t PK = R * K > (size_t)lim->max_expert_rows ? R * K : (size_t)lim->max_expert_rows;
    x->mla_part_floats = Hm > 0 && kvl > 0 ? k3c_cuda_mla_attend_split_floats((int)kvl) : 0;
    size_t sizes[] = {R * Hm * lat, R * Hm * kvl, R * E, R * K, R * K, R * Rin, PK * F, PK * Rin,
                      R * Rin, R * D, R * Fs, R * Fs, R * D, R * P, x->mla_part_floats, PK};
    void **slots[] = {(void **)&x->q_abs, (void **)&x->o_lat, (void **)&x->logits, (void **)&x->wts,
                      (void **)&x->idx, (void **)&x->z, (void **)&x->h, (void **)&x->part, (void **)&x->r,
                      (void **)&x->rup, (void **)&x->sa, (void **)&x->su, (void **)&x->sh, (void **)&x->kda_o,
                      (void **)&x->mla_part, (void **)&x->ones};
    size_t n_slots = sizeof sizes / sizeof sizes[0], stotal = 0;
    for (size_t i = 0; i < n_slots; i++) stotal += align256(sizes[i] * 4 + 4);
    e = cudaMalloc(&x->scratch, stotal);
    if (e != cudaSuccess) {
        x->scratch = NULL;
        return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "cuda backend: step scratch of %.1f MB (max_rows %d): %s", stotal / 1e6, lim->max_rows,
                          cudaGetErrorString(e));
    }
    char *p = x->scratch;
    for (size_t i = 0; i < n_slots; i++) {
        *slots[i] = p;
        p += align256(sizes[i] * 4 + 4);
    }
    if (lim->max_expert_rows > 0) {
        float *one = malloc(sizeof(float) * PK);
        if (!one) return k3c_errorf_kind(K3C_ERROR_OOM, "cuda backend: out of host memory (%zu weights)", PK);
        for (size_t i = 0; i < PK; i++) one[i] = 1.0f;
        e = cudaMemcpy(x->ones, one, sizeof(float) * PK, cudaMemcpyHostToDevice);
        free(one);
        if (e != cudaSuccess)
            return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "cuda backend: expert weights: %s", cudaGetErrorString(e));
    }

    /* MLA expanded form: passes of up to K3C_CUDA_MLA_EXP_CHUNK positions (decompressed k/v of one pass, the
     * latents it gathers, and the running softmax state of max_rows rows between passes) */
    x->mla_chunk = lim->max_context < K3C_CUDA_MLA_EXP_CHUNK ? lim->max_context : K3C_CUDA_MLA_EXP_CHUNK;
    if (x->mla_chunk < 1) x->mla_chunk = 1;
    if (Hm > 0 && c->v_head_dim > 0 && kvl > 0) {
        size_t xb = k3c_cuda_mla_expanded_scratch_bytes(x->mla_chunk, lim->max_rows, c->num_attention_heads,
                                                        c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim,
                                                        c->kv_lora_rank);
        e = cudaMalloc(&x->mla_x, xb);
        if (e != cudaSuccess) {
            x->mla_x = NULL;
            return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "cuda backend: expanded MLA scratch of %.1f MB (passes of %d positions, max_rows %d): "
                              "%s", xb / 1e6, x->mla_chunk, lim->max_rows, cudaGetErrorString(e));
        }
    }

    /* cuBLASLt for products of more than K3C_CUDA_GEMV_MAX_T rows (also the expanded MLA's kv_b product of
     * mla_chunk latent rows) */
    size_t ws = (size_t)32 << 20, xbf_elems = R * max_cols;
    if ((size_t)x->mla_chunk * kvl > xbf_elems) xbf_elems = (size_t)x->mla_chunk * kvl;
    /* a failed allocation leaves its pointer NULL: free_all frees only what was allocated */
    K3C_CUDA_MALLOC(&x->gemm_ws, ws);
    K3C_CUDA_MALLOC(&x->xbf, xbf_elems * 2);
    K3C_TRY(k3c_cuda_gemm_init(&x->gemm, x->gemm_ws, ws, x->xbf, xbf_elems));
    x->gemm_ready = 1;

    /* metadata staging: per layer at most two Mix source arrays, three KDA conv segment arrays and one delta
     * array, or the MLA slots / row offsets / lengths / block tables; plus ids and logit rows. Twice that,
     * so a step normally never waits. */
    size_t nres = c->attn_res_block_size > 0 ? (size_t)c->num_layers / c->attn_res_block_size + 2 : 1;
    size_t S = (size_t)lim->max_segs, bpr = ((size_t)lim->max_context + lim->block_size - 1) / lim->block_size;
    size_t per_layer = 2 * (nres * 8 + 16) + 4 * (S * sizeof(k3c_cuda_seg) + 16) + 3 * (R * 4 + 16) +
                       S * bpr * 4 + 16;
    size_t cap = 2 * ((size_t)c->num_layers * per_layer + 2 * (R * 4 + 16) + nres * 8 + 16) + ((size_t)64 << 10);
    /* an expert-parallel MoE layer's expert ids (up to PK), its pair rows and its sent rows ([R, K] each) */
    if (lim->max_expert_rows > 0) cap += 2 * (PK * 4 + 2 * R * K * 4 + 64);
    x->meta_cap = cap;
    K3C_CUDA_HOST_ALLOC(&x->meta_host, cap);
    K3C_CUDA_MALLOC(&x->meta_dev, cap);
    x->meta_used = 0;
    K3C_CUDA_TRY(cudaStreamSynchronize(x->stream));
    return K3C_OK;
}

static int cuda_init(k3c_backend *be, const struct k3c_model *m, const k3c_backend_limits *lim) {
    cuda_ctx *x = be->ctx;
    if (lim->kv_fp8) be->kv_elem_bytes = 1; /* E4M3 bytes, written and read by the MLA kernels (cuda/mla.cu) */
    x->prof = k3c_op_profile_create_from_env(); /* once per lifetime, like every other allocation of init */
    if (cuda_init_inner(be, m, lim) != K3C_OK) {
        free_all(x);
        return k3c_error_context("cuda backend (device %d)", x->device);
    }
    return K3C_OK;
}

static void cuda_destroy(k3c_backend *be) {
    if (!be) return;
    cuda_ctx *x = be->ctx;
    if (x) {
        if (x->stream) cudaStreamSynchronize(x->stream);
        free_all(x);
        k3c_op_profile_free(x->prof);
        if (x->stream) cudaStreamDestroy(x->stream);
        free(x);
    }
    free(be);
}

static int cuda_sync(k3c_backend *be) {
    cuda_ctx *x = be->ctx;
    cudaError_t e = cudaStreamSynchronize(x->stream);
    x->meta_used = 0;
    if (e != cudaSuccess) record_cuda(x, "stream", e);
    else k3c_op_profile_collect(x->prof);
    if (x->failed) {
        x->failed = 0;
        return k3c_errorf_kind(x->err_kind ? x->err_kind : K3C_ERROR_DEVICE, "cuda backend: %s", x->err);
    }
    return K3C_OK;
}

/* ---- memory ---- */

static void *cuda_alloc(k3c_backend *be, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "cuda backend: cannot allocate %zu bytes (%.2f GB free of %.2f GB): %s", bytes, fr / 1e9,
                   tot / 1e9, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cuda_freebuf(k3c_backend *be, void *p) {
    cuda_ctx *x = be->ctx;
    if (!p) return;
    cudaStreamSynchronize(x->stream);
    cudaFree(p);
}

static size_t cuda_mem_free(k3c_backend *be, const char **source) {
    cuda_ctx *x = be->ctx;
    size_t fr = 0, tot = 0;
    *source = "cudaMemGetInfo free";
    if (cudaSetDevice(x->device) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 0;
    return fr;
}

/* Page-locked host memory for the logits (k3c_engine_logits_alloc). A download into pageable memory is
 * staged by the driver through its own pinned buffers: 7.4 GB/s for kimi-linear-48b's 42 MB of b=64 logits
 * on the H200 host (k3c bench, 2026-11-30: 5.65 ms of a 30.8 ms step); into page-locked memory the copy engine
 * writes it directly. */
static void *cuda_host_alloc(k3c_backend *be, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 256, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "cuda backend: cannot allocate %zu bytes of page-locked host memory: %s", bytes,
                   cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cuda_host_free(k3c_backend *be, void *p) {
    cuda_ctx *x = be->ctx;
    if (!p) return;
    cudaStreamSynchronize(x->stream);
    cudaFreeHost(p);
}

/* Pageable host memory: the stream drained first, without the driver's lock (cuda/check.h
 * k3c_cuda_host_pageable says why); page-locked memory (the engine's logits) is copied asynchronously. */
static void cuda_upload(k3c_backend *be, void *dst, const void *host_src, size_t bytes) {
    cuda_ctx *x = be->ctx;
    if (x->failed || !bytes) return;
    if (k3c_cuda_host_pageable(host_src)) OP_CUDA(x, "upload (draining the stream)", cudaStreamSynchronize(x->stream));
    OP_CUDA(x, "upload", cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, x->stream));
}

static void cuda_download(k3c_backend *be, void *host_dst, const void *src, size_t bytes) {
    cuda_ctx *x = be->ctx;
    if (x->failed || !bytes) return;
    if (k3c_cuda_host_pageable(host_dst)) OP_CUDA(x, "download (draining the stream)", cudaStreamSynchronize(x->stream));
    OP_CUDA(x, "download", cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, x->stream));
}

static void cuda_copy(k3c_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *x = be->ctx;
    if (x->failed || !bytes || dst == src) return;
    OP_CUDA(x, "copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, x->stream));
}

static void cuda_fill_bytes(k3c_backend *be, void *dst, int byte, size_t bytes) {
    cuda_ctx *x = be->ctx;
    if (x->failed || !bytes) return;
    OP_CUDA(x, "fill_bytes", cudaMemsetAsync(dst, byte, bytes, x->stream));
}

static void cuda_gather_rows(k3c_backend *be, const float *src, const int *rows, int n, int D, float *dst) {
    cuda_ctx *x = be->ctx;
    if (x->failed || n <= 0) return;
    int *d = meta_ints(x, rows, n);
    if (!d) return;
    OP_TRY(x, "gather_rows", k3c_cuda_gather_rows(src, d, n, D, dst, x->stream));
}

/* ---- dense ---- */

static void cuda_embed(k3c_backend *be, const k3c_mat *E, const int32_t *ids, int T, float *out) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const uint16_t *w;
    WDEV(x, "embed", E->w, w);
    int *d = meta_ints(x, ids, T);
    if (!d) return;
    OP_TRY(x, "embed", k3c_cuda_embed(w, E->rows, E->cols, d, T, out, x->stream));
}

static void cuda_matmul(k3c_backend *be, const k3c_mat *W, const float *in, int T, float *y, int round) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const uint16_t *w;
    WDEV(x, "matmul", W->w, w);
    OP_TRY(x, "matmul", k3c_cuda_matmul_bf16_round(x->exact ? NULL : &x->gemm, w, W->rows, W->cols, in, T, y,
                                                   round && !x->exact, x->stream));
}

static void cuda_rmsnorm(k3c_backend *be, const float *in, int x_stride, const float *w, int T, int n, float eps,
                         float *y, int y_stride) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const float *wd;
    WDEV(x, "rmsnorm", w, wd);
    OP_TRY(x, "rmsnorm", k3c_cuda_rmsnorm(in, x_stride, wd, T, n, eps, RND(x), y, y_stride, x->stream));
}

static void cuda_add(k3c_backend *be, const float *a, const float *b, size_t n, float *out) {
    cuda_ctx *x = be->ctx;
    if (x->failed || !n) return;
    OP_TRY(x, "add", k3c_cuda_add(a, b, n, RND(x), out, x->stream));
}

static void cuda_attnres_mix(k3c_backend *be, const float *const *src, int nsrc, int T, int D, const float *proj,
                             const float *norm, float eps, float *out) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const float *pd, *nd;
    WDEV(x, "attnres_mix", proj, pd);
    WDEV(x, "attnres_mix", norm, nd);
    /* the kernel's blocks read every source while others write out (cuda/attnres.h) */
    size_t bytes = sizeof(float) * (size_t)T * D;
    for (int i = 0; i < nsrc; i++)
        if ((const char *)out < (const char *)src[i] + bytes && (const char *)src[i] < (const char *)out + bytes) {
            OP_TRY(x, "attnres_mix", k3c_errorf("attnres_mix: the output overlaps source %d of %d", i, nsrc));
        }
    void *dev;
    const float **h = meta_alloc(x, sizeof(float *) * (size_t)nsrc, &dev);
    if (!h) return;
    for (int i = 0; i < nsrc; i++) h[i] = src[i];
    if (meta_send(x, h, dev, sizeof(float *) * (size_t)nsrc) != K3C_OK) return;
    OP_TRY(x, "attnres_mix", k3c_cuda_attnres_mix(dev, nsrc, T, D, pd, nd, eps, RND(x), out, x->stream));
}

static void cuda_gated_act(k3c_backend *be, const float *gate, const float *up, size_t n, float *out) {
    cuda_ctx *x = be->ctx;
    if (x->failed || !n) return;
    if (n > 0x7fffffff) {
        k3c_errorf("%zu elements (at most 2^31 - 1 per call)", n);
        record(x, "gated_act");
        return;
    }
    OP_TRY(x, "gated_act", k3c_cuda_gated_act(x->act, gate, (int)n, up, (int)n, 1, (int)n, RND(x), out, x->stream));
}

static void cuda_sigmoid_mul(k3c_backend *be, float *v, const float *g, size_t n) {
    cuda_ctx *x = be->ctx;
    if (x->failed || !n) return;
    OP_TRY(x, "sigmoid_mul", k3c_cuda_mul_sigmoid(v, g, n, RND(x), v, x->stream));
}

/* ---- KDA ---- */

/* Device array of the segments with rows (chunked: 1 keeps only chunked ones, 0 only recurrent, -1 all);
 * *count gets their number. NULL on failure or when none qualify. */
static k3c_cuda_seg *stage_segs(cuda_ctx *x, const k3c_seg *segs, int nseg, int chunked, int *count) {
    *count = 0;
    void *dev;
    k3c_cuda_seg *h = meta_alloc(x, sizeof(k3c_cuda_seg) * (size_t)(nseg > 0 ? nseg : 1), &dev);
    if (!h) return NULL;
    int n = 0;
    for (int s = 0; s < nseg; s++) {
        if (segs[s].n <= 0 || (chunked >= 0 && (segs[s].chunked != 0) != chunked)) continue;
        h[n++] = (k3c_cuda_seg){segs[s].row0, segs[s].n, segs[s].state, segs[s].window, 0};
    }
    if (!n || meta_send(x, h, dev, sizeof(k3c_cuda_seg) * (size_t)n) != K3C_OK) return NULL;
    *count = n;
    return dev;
}

static void cuda_kda_conv(k3c_backend *be, const float *in, const float *taps, int which, const k3c_seg *segs,
                          int nseg, float *out) {
    cuda_ctx *x = be->ctx;
    if (x->failed) return;
    const float *td;
    WDEV(x, "kda_conv", taps, td);
    int n;
    k3c_cuda_seg *d = stage_segs(x, segs, nseg, -1, &n);
    if (!n) return;
    OP_TRY(x, "kda_conv", k3c_cuda_kda_conv_segs(in, d, n, k3c_config_kda_proj(x->c), x->c->kda_conv_kernel, td,
                                                 which, RND(x), out, x->stream));
}

static void cuda_kda_gate(k3c_backend *be, const float *f, const float *b, const float *a_log, const float *dt_bias,
                          int T, float *g, float *beta) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const float *ad, *dd;
    WDEV(x, "kda_gate", a_log, ad);
    WDEV(x, "kda_gate", dt_bias, dd);
    const k3c_config *c = x->c;
    OP_TRY(x, "kda_gate", k3c_cuda_kda_gate(f, b, ad, dd, T, c->kda_num_heads, c->kda_head_dim, c->kda_has_lower_bound,
                                            c->kda_gate_lower_bound, g, beta, x->stream));
}

static void cuda_kda_qk_norm(k3c_backend *be, float *q, float *k, int T) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    OP_TRY(x, "kda_qk_norm", k3c_cuda_kda_qk_norm(q, k, T, x->c->kda_num_heads, x->c->kda_head_dim, x->stream));
}

static void cuda_kda_delta(k3c_backend *be, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, const k3c_seg *segs, int nseg, float *o) {
    cuda_ctx *x = be->ctx;
    if (x->failed) return;
    int H = x->c->kda_num_heads, dk = x->c->kda_head_dim;
    /* prompt rows: one chunked launch for all prompt requests; everything else: one recurrent launch */
    int n;
    k3c_cuda_seg *d = stage_segs(x, segs, nseg, 1, &n);
    if (x->failed) return;
    if (n)
        OP_TRY(x, "kda_delta (chunked)",
               k3c_cuda_kda_chunked_segs(d, n, q, k, v, g, beta, H, dk, dk, RND(x), o, x->stream));
    d = stage_segs(x, segs, nseg, 0, &n);
    if (!n) return;
    OP_TRY(x, "kda_delta", k3c_cuda_kda_recurrent_segs(d, n, q, k, v, g, beta, H, dk, dk, RND(x), o, x->stream));
}

static void cuda_kda_gated_norm(k3c_backend *be, const float *o, const float *z, const float *w, int T, float *y) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const float *wd;
    WDEV(x, "kda_gated_norm", w, wd);
    OP_TRY(x, "kda_gated_norm", k3c_cuda_kda_gated_norm(o, z, wd, T, x->c->kda_num_heads, x->c->kda_head_dim,
                                                        x->c->rms_norm_eps, x->silu_gate, RND(x), y, x->stream));
}

/* ---- MLA ---- */

static int rows_of(const k3c_seg *segs, int nseg) {
    int T = 0;
    for (int s = 0; s < nseg; s++)
        if (segs[s].n > 0 && segs[s].row0 + segs[s].n > T) T = segs[s].row0 + segs[s].n;
    return T;
}

static void cuda_mla_cache_write(k3c_backend *be, const float *lat, const k3c_seg *segs, int nseg, void *cache) {
    cuda_ctx *x = be->ctx;
    if (x->failed) return;
    int T = rows_of(segs, nseg), bs = x->lim.block_size;
    if (T <= 0) return;
    void *dev;
    int *slots = meta_alloc(x, sizeof(int) * (size_t)T, &dev);
    if (!slots) return;
    for (int t = 0; t < T; t++) slots[t] = -1;
    for (int s = 0; s < nseg; s++)
        for (int i = 0; i < segs[s].n; i++) {
            int p = segs[s].pos + i, d = segs[s].dcp;
            if (d > 1) { /* interleaved over the DCP ranks (backend.h k3c_seg): this rank's positions only */
                if (p % d != segs[s].dcp_rank) continue;
                p /= d;
            }
            slots[segs[s].row0 + i] = segs[s].block_table[p / bs] * bs + p % bs;
        }
    if (meta_send(x, slots, dev, sizeof(int) * (size_t)T) != K3C_OK) return;
    OP_TRY(x, "mla_cache_write", k3c_cuda_mla_cache_write(lat, dev, T, k3c_config_mla_latent(x->c), be->kv_elem_bytes,
                                                          cache, x->stream));
}

/* The rows' block tables for the MLA decode kernels, uploaded: per row the offset of its request's table in
 * tab and the positions it attends, over the request's own slots: under decode context parallelism
 * (seg.dcp > 1) this rank's share of them (k3c_dcp_local), else every position. 0, or K3C_ERR with x failed. */
static int mla_row_tables(cuda_ctx *x, const k3c_seg *segs, int nseg, int T, int bs, int **doff, int **dlens,
                          int **dtab) {
    size_t ntab = 0;
    for (int s = 0; s < nseg; s++)
        if (segs[s].n > 0)
            ntab += (size_t)(k3c_dcp_local(segs[s].pos + segs[s].n, segs[s].dcp, 0) + bs - 1) / bs;
    void *dev;
    int *h = meta_alloc(x, sizeof(int) * (2 * (size_t)T + ntab), &dev);
    if (!h) return K3C_ERR;
    int *off = h, *lens = h + T, *tab = h + 2 * T;
    for (int t = 0; t < T; t++) off[t] = lens[t] = 0;
    size_t k = 0;
    for (int s = 0; s < nseg; s++) {
        const k3c_seg *g = &segs[s];
        if (g->n <= 0) continue;
        int nb = (k3c_dcp_local(g->pos + g->n, g->dcp, 0) + bs - 1) / bs;
        for (int i = 0; i < g->n; i++) {
            off[g->row0 + i] = (int)k;
            lens[g->row0 + i] = k3c_dcp_local(g->pos + i + 1, g->dcp, g->dcp_rank);
        }
        for (int b = 0; b < nb; b++) tab[k++] = g->block_table[b];
    }
    if (meta_send(x, h, dev, sizeof(int) * (2 * (size_t)T + ntab)) != K3C_OK) return K3C_ERR;
    *doff = dev;
    *dlens = *doff + T;
    *dtab = *doff + 2 * T;
    return K3C_OK;
}

static void cuda_mla_attention(k3c_backend *be, const k3c_mla_weights *w, const float *q, const k3c_seg *segs,
                               int nseg, const void *cache, float *o) {
    cuda_ctx *x = be->ctx;
    if (x->failed) return;
    const k3c_config *c = x->c;
    int Hm = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int vh = c->v_head_dim, kvl = c->kv_lora_rank, bs = x->lim.block_size;
    int T = rows_of(segs, nseg);
    if (T <= 0) return;
    const uint16_t *kvb;
    WDEV(x, "mla_attention", w->kv_b.w, kvb);
    int *doff, *dlens, *dtab;
    if (mla_row_tables(x, segs, nseg, T, bs, &doff, &dlens, &dtab) != K3C_OK) return;
    float scale = 1.0f / sqrtf((float)(nope + rope));
    OP_TRY(x, "mla absorb_q", k3c_cuda_mla_absorb_q(kvb, q, T, Hm, nope, rope, vh, kvl, x->q_abs, x->stream));
    OP_TRY(x, "mla attend", k3c_cuda_mla_attend(x->q_abs, doff, dlens, dtab, bs, cache, be->kv_elem_bytes, T, Hm, kvl,
                                                rope, scale, x->o_lat, x->mla_part, x->mla_part_floats,
                                                x->stream));
    OP_TRY(x, "mla absorb_o", k3c_cuda_mla_absorb_o(kvb, x->o_lat, T, Hm, nope, vh, kvl, RND(x), o, x->stream));
}

/* ---- decode context parallel (backend.h mla_absorb, mla_attention_part, mla_merge) ---- */

static void cuda_mla_absorb(k3c_backend *be, const k3c_mla_weights *w, const float *q, int T, float *q_abs) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const k3c_config *c = x->c;
    const uint16_t *kvb;
    WDEV(x, "mla_absorb", w->kv_b.w, kvb);
    OP_TRY(x, "mla_absorb", k3c_cuda_mla_absorb_q(kvb, q, T, c->num_attention_heads, c->qk_nope_head_dim,
                                                  c->qk_rope_head_dim, c->v_head_dim, c->kv_lora_rank, q_abs,
                                                  x->stream));
}

/* The rows' local slots: row i of a segment sees k3c_dcp_local(pos + i + 1) of them, through the same table. */
static void cuda_mla_attention_part(k3c_backend *be, const float *q_abs, int H, const k3c_seg *segs, int nseg,
                                    const void *cache, float *o_lat, float *lse) {
    cuda_ctx *x = be->ctx;
    if (x->failed) return;
    const k3c_config *c = x->c;
    int kvl = c->kv_lora_rank, rope = c->qk_rope_head_dim, bs = x->lim.block_size;
    int T = rows_of(segs, nseg);
    if (T <= 0) return;
    int *doff, *dlens, *dtab;
    if (mla_row_tables(x, segs, nseg, T, bs, &doff, &dlens, &dtab) != K3C_OK) return;
    float scale = 1.0f / sqrtf((float)(c->qk_nope_head_dim + rope));
    OP_TRY(x, "mla_attention_part",
           k3c_cuda_mla_attend_lse(q_abs, doff, dlens, dtab, bs, cache, be->kv_elem_bytes, T, H, kvl, rope, scale,
                                   o_lat, lse, x->mla_part, x->mla_part_floats, x->stream));
}

static void cuda_mla_merge(k3c_backend *be, const k3c_mla_weights *w, const float *o_parts, const float *lses,
                           size_t stride, int n, int T, float *o) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const k3c_config *c = x->c;
    int Hm = c->num_attention_heads, kvl = c->kv_lora_rank;
    const uint16_t *kvb;
    WDEV(x, "mla_merge", w->kv_b.w, kvb);
    OP_TRY(x, "mla_merge", k3c_cuda_mla_dcp_merge(o_parts, lses, stride, n, T, Hm, kvl, x->o_lat, x->stream));
    OP_TRY(x, "mla_merge absorb_o", k3c_cuda_mla_absorb_o(kvb, x->o_lat, T, Hm, c->qk_nope_head_dim, c->v_head_dim,
                                                          kvl, RND(x), o, x->stream));
}

/* The expanded form (spec §3.2) for prompt segments: per segment, passes over its context that gather the
 * cached latents, decompress them through kv_b (cuBLASLt; the f32 streaming kernel in the exact diagnostic)
 * and attend (cuda/mla_expanded.h). Segments run one after another on the stream, sharing the scratch. */
static void cuda_mla_attention_expanded(k3c_backend *be, const k3c_mla_weights *w, const float *q, const k3c_seg *segs,
                                        int nseg, const void *cache, float *o) {
    cuda_ctx *x = be->ctx;
    if (x->failed) return;
    const k3c_config *c = x->c;
    int Hm = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int vh = c->v_head_dim, kvl = c->kv_lora_rank, bs = x->lim.block_size;
    const uint16_t *kvb;
    WDEV(x, "mla_attention_expanded", w->kv_b.w, kvb);
    size_t ntab = 0;
    for (int s = 0; s < nseg; s++) {
        const k3c_seg *g = &segs[s];
        if (g->n <= 0) continue;
        if (!x->mla_x || g->n > x->lim.max_rows || g->pos < 0 || g->pos + g->n > x->lim.max_context) {
            k3c_errorf("segment %d: rows %d at position %d exceed the limits the scratch was sized for (max_rows "
                       "%d, max_context %d)%s", s, g->n, g->pos, x->lim.max_rows, x->lim.max_context,
                       x->mla_x ? "" : " (no MLA scratch)");
            record(x, "mla_attention_expanded");
            return;
        }
        ntab += (size_t)(g->pos + g->n + bs - 1) / bs;
    }
    if (!ntab) return;
    void *dev;
    int *tab = meta_alloc(x, sizeof(int) * ntab, &dev);
    if (!tab) return;
    size_t k = 0;
    for (int s = 0; s < nseg; s++) {
        const k3c_seg *g = &segs[s];
        if (g->n <= 0) continue;
        int nb = (g->pos + g->n + bs - 1) / bs;
        for (int b = 0; b < nb; b++) tab[k++] = g->block_table[b];
    }
    if (meta_send(x, tab, dev, sizeof(int) * ntab) != K3C_OK) return;
    float scale = 1.0f / sqrtf((float)(nope + rope));
    k = 0;
    for (int s = 0; s < nseg; s++) {
        const k3c_seg *g = &segs[s];
        if (g->n <= 0) continue;
        OP_TRY(x, "mla_attention_expanded",
               k3c_cuda_mla_expanded(x->exact ? NULL : &x->gemm, kvb, q + (size_t)g->row0 * Hm * (nope + rope), g->n,
                                     g->pos, (const int *)dev + k, bs, cache, be->kv_elem_bytes, Hm, nope, rope, vh,
                                     kvl, scale, RND(x), x->mla_x, x->mla_chunk, x->lim.max_rows,
                                     o + (size_t)g->row0 * Hm * vh, x->stream));
        k += (size_t)(g->pos + g->n + bs - 1) / bs;
    }
}

/* ---- MoE ---- */

static void moe_finish(cuda_ctx *x, const k3c_moe_weights *w, const float *y, int T, float *out);

/* moe (out), or with r_part moe_partial (backend.h): the same launches up to the experts' hidden
 * activations; then the experts' down products and their weighted sum unrounded straight into r_part
 * (cuda/moe.h K3C_CUDA_MOE_ROUND_HIDDEN: the same kernels, only the stores differ), the shared expert's down
 * product unrounded into s_part, and nothing after (the forward sums them across the ranks first). */
static void moe_run(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, float *out, float *r_part,
                    float *s_part) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const int part = r_part != NULL;
    const k3c_config *c = x->c;
    int D = c->hidden_size, E = c->num_experts, K = c->num_experts_per_token;
    int Rin = k3c_config_expert_in(c), F = c->moe_intermediate_size;
    cudaStream_t st = x->stream;
    const uint16_t *wr;
    const k3c_cuda_expert *ex;
    const float *bias = NULL;
    WDEV(x, "moe router", w->router.w, wr);
    WDEV(x, "moe experts", w->experts, ex);
    if (c->use_correction_bias && w->correction_bias) WDEV(x, "moe bias", w->correction_bias, bias);

    /* router: f32 logits of the rounded y, then the selection */
    OP_TRY(x, "moe router", mm(x, wr, w->router.rows, w->router.cols, y, T, x->logits));
    OP_TRY(x, "moe route", k3c_cuda_route(&x->router, x->logits, bias, T, x->idx, x->wts, st));

    const float *z = y;
    if (c->routed_expert_hidden_size > 0) {
        const uint16_t *wd;
        WDEV(x, "moe latent_down", w->latent_down.w, wd);
        OP_TRY(x, "moe latent_down", mm_rounded(x, wd, w->latent_down.rows, w->latent_down.cols, y, T, x->z));
        z = x->z;
    }
    int round = part && RND(x) ? K3C_CUDA_MOE_ROUND_HIDDEN : RND(x);
    OP_TRY(x, "moe experts", k3c_cuda_moe_experts(ex, E, c->expert_format == K3C_EXPERTS_MXFP4, Rin, F, Rin, z, T,
                                                  x->idx, x->wts, K, x->act, round, x->h, x->part,
                                                  part ? r_part : x->r, st));
    if (part) {
        if (!w->shared.gate.w) return;
        int Fs = w->shared.gate.rows;
        const uint16_t *sg, *su, *sd;
        WDEV(x, "moe_partial shared", w->shared.gate.w, sg);
        WDEV(x, "moe_partial shared", w->shared.up.w, su);
        WDEV(x, "moe_partial shared", w->shared.down.w, sd);
        OP_TRY(x, "moe_partial shared gate", mm_rounded(x, sg, Fs, D, y, T, x->sa));
        OP_TRY(x, "moe_partial shared up", mm_rounded(x, su, Fs, D, y, T, x->su));
        OP_TRY(x, "moe_partial shared act", k3c_cuda_gated_act(x->act, x->sa, Fs, x->su, Fs, T, Fs, RND(x), x->sa, st));
        OP_TRY(x, "moe_partial shared down", mm(x, sd, D, Fs, x->sa, T, s_part));
        return;
    }
    moe_finish(x, w, y, T, out);
}

/* After the routed experts' weighted sum in x->r [T, expert_in]: the latent norm and up-projection, the
 * shared expert of y, out = rnd(routed + shared); what moe and the expert-parallel combine share. */
static void moe_finish(cuda_ctx *x, const k3c_moe_weights *w, const float *y, int T, float *out) {
    const k3c_config *c = x->c;
    int D = c->hidden_size, Rin = k3c_config_expert_in(c);
    cudaStream_t st = x->stream;
    const float *routed = x->r;
    if (c->routed_expert_hidden_size > 0) {
        if (c->latent_moe_use_norm) {
            const float *nd;
            WDEV(x, "moe latent_norm", w->latent_norm, nd);
            OP_TRY(x, "moe latent_norm", k3c_cuda_rmsnorm(x->r, Rin, nd, T, Rin, c->rms_norm_eps, RND(x), x->r, Rin, st));
        }
        const uint16_t *wu;
        WDEV(x, "moe latent_up", w->latent_up.w, wu);
        OP_TRY(x, "moe latent_up", mm_rounded(x, wu, w->latent_up.rows, w->latent_up.cols, x->r, T, x->rup));
        routed = x->rup;
    }
    if (w->shared.gate.w) {
        int Fs = w->shared.gate.rows;
        const uint16_t *sg, *su, *sd;
        WDEV(x, "moe shared", w->shared.gate.w, sg);
        WDEV(x, "moe shared", w->shared.up.w, su);
        WDEV(x, "moe shared", w->shared.down.w, sd);
        OP_TRY(x, "moe shared gate", mm_rounded(x, sg, Fs, D, y, T, x->sa));
        OP_TRY(x, "moe shared up", mm_rounded(x, su, Fs, D, y, T, x->su));
        OP_TRY(x, "moe shared act", k3c_cuda_gated_act(x->act, x->sa, Fs, x->su, Fs, T, Fs, RND(x), x->sa, st));
        OP_TRY(x, "moe shared down", mm_rounded(x, sd, D, Fs, x->sa, T, x->sh));
        OP_TRY(x, "moe out", k3c_cuda_add(routed, x->sh, (size_t)T * D, RND(x), out, st));
    } else {
        OP_CUDA(x, "moe out", cudaMemcpyAsync(out, routed, sizeof(float) * (size_t)T * D, cudaMemcpyDeviceToDevice, st));
    }
}

/* ---- expert parallel (backend.h moe_route, moe_experts, moe_combine): moe_run cut where the forward
 * exchanges (token, expert) pairs between ranks. The same kernels (the router, the experts' launcher, the
 * weighted sum's arithmetic, moe_finish), so a token's output is moe's function; whether its bits are moe's
 * depends on the experts' launcher taking the same path for the rank's pair count as for the step's (it
 * chooses by pairs, docs/DESIGN.md "Batch invariance"). ---- */

/* The router and z as moe_run computes them; the selection downloaded into the host's idx (the forward
 * builds the exchange from it), which makes this op wait for the stream. On a failure (recorded, reported by
 * sync) idx is all -1, which the forward refuses. */
static void cuda_moe_route(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, int *idx, float *wts,
                           float *z) {
    cuda_ctx *x = be->ctx;
    const k3c_config *c = x->c;
    int K = c->num_experts_per_token;
    if (T <= 0) return;
    for (int i = 0; i < T * K; i++) idx[i] = -1;
    if (x->failed) return;
    cudaStream_t st = x->stream;
    const uint16_t *wr;
    const float *bias = NULL;
    WDEV(x, "moe_route router", w->router.w, wr);
    if (c->use_correction_bias && w->correction_bias) WDEV(x, "moe_route bias", w->correction_bias, bias);
    OP_TRY(x, "moe_route router", mm(x, wr, w->router.rows, w->router.cols, y, T, x->logits));
    OP_TRY(x, "moe_route route", k3c_cuda_route(&x->router, x->logits, bias, T, x->idx, wts, st));
    if (c->routed_expert_hidden_size > 0) {
        const uint16_t *wd;
        WDEV(x, "moe_route latent_down", w->latent_down.w, wd);
        OP_TRY(x, "moe_route latent_down", mm_rounded(x, wd, w->latent_down.rows, w->latent_down.cols, y, T, z));
    } else if (z != y) {
        OP_CUDA(x, "moe_route z", cudaMemcpyAsync(z, y, sizeof(float) * (size_t)T * c->hidden_size,
                                                  cudaMemcpyDeviceToDevice, st));
    }
    /* through the pinned staging (a pageable destination would make the copy itself wait) */
    void *dev;
    int *h = meta_alloc(x, sizeof(int) * (size_t)T * K, &dev);
    if (!h) return;
    OP_CUDA(x, "moe_route idx", cudaMemcpyAsync(h, x->idx, sizeof(int) * (size_t)T * K, cudaMemcpyDeviceToHost, st));
    OP_CUDA(x, "moe_route idx", cudaStreamSynchronize(st));
    memcpy(idx, h, sizeof(int) * (size_t)T * K);
}

/* Each row through its expert: k3c_cuda_moe_experts with one slot a row (weight 1: the weighted sum of one
 * rounded output is that output, fmaf(1, d, 0) = d), so d's rows are moe's d_j. */
static void cuda_moe_experts(k3c_backend *be, const k3c_moe_weights *w, const float *in, const int *expert, int n,
                             float *d) {
    cuda_ctx *x = be->ctx;
    if (x->failed || n <= 0) return;
    const k3c_config *c = x->c;
    int E = c->num_experts, mx = c->expert_format == K3C_EXPERTS_MXFP4;
    int Rin = k3c_config_expert_in(c), F = c->moe_intermediate_size, K = c->num_experts_per_token;
    size_t PK = (size_t)x->lim.max_rows * K;
    if ((size_t)x->lim.max_expert_rows > PK) PK = (size_t)x->lim.max_expert_rows;
    if (!x->lim.max_expert_rows || (size_t)n > PK) {
        k3c_errorf("%d rows, the scratch holds %zu (limits.max_expert_rows %d)", n, PK, x->lim.max_expert_rows);
        record(x, "moe_experts");
        return;
    }
    for (int i = 0; i < n; i++) {
        int e = expert[i];
        const k3c_expert *ex = e >= 0 && e < E && w->experts ? &w->experts[e] : NULL;
        if (!ex || !(mx ? (const void *)ex->q1.packed : (const void *)ex->w1.w)) {
            k3c_errorf("row %d: expert %d is not held here", i, e);
            record(x, "moe_experts");
            return;
        }
    }
    const k3c_cuda_expert *tab;
    WDEV(x, "moe_experts", w->experts, tab);
    int *dev = meta_ints(x, expert, n);
    if (!dev) return;
    OP_TRY(x, "moe_experts", k3c_cuda_moe_experts(tab, E, mx, Rin, F, Rin, in, n, dev, x->ones, 1, x->act, RND(x),
                                                  x->h, x->part, d, x->stream));
}

/* r = the weighted sum of each token's pairs' rows of d in j order (moe's arithmetic, cuda/moe.h
 * k3c_cuda_moe_combine_rows), then moe_finish. */
static void cuda_moe_combine(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, const float *wts,
                             const float *d, const int *pair_row, float *out) {
    cuda_ctx *x = be->ctx;
    if (x->failed || T <= 0) return;
    const k3c_config *c = x->c;
    int K = c->num_experts_per_token, Rin = k3c_config_expert_in(c);
    int *rows = meta_ints(x, pair_row, T * K);
    if (!rows) return;
    OP_TRY(x, "moe_combine", k3c_cuda_moe_combine_rows(d, rows, wts, K, Rin, T, RND(x), x->r, x->stream));
    moe_finish(x, w, y, T, out);
}

static void cuda_moe(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, float *out) {
    moe_run(be, w, y, T, out, NULL, NULL);
}

static void cuda_moe_partial(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, float *r_part,
                             float *s_part) {
    moe_run(be, w, y, T, NULL, r_part, s_part);
}

/* The rounding of a cross-rank sum (backend.h round): the kernel every rounded store of this backend uses
 * (k3c_dev_to_bf16, nearest even); none in the exact diagnostic. */
static void cuda_round(k3c_backend *be, float *p, size_t n) {
    cuda_ctx *x = be->ctx;
    if (x->failed || !n || x->exact) return;
    OP_TRY(x, "round", k3c_cuda_round_bf16(p, n, x->stream));
}

/* ---- views for the specialized decode executor (declared in cuda/backend_cuda.h by its owner) ---- */

int k3c_backend_is_cuda(const k3c_backend *be) {
    return be && be->init == cuda_init && be->ctx && ((const cuda_ctx *)be->ctx)->arena;
}

void *k3c_backend_cuda_weight(k3c_backend *be, const void *host) { return wdev(be->ctx, host); }

void k3c_backend_cuda_arena(k3c_backend *be, void **base, size_t *bytes) {
    const cuda_ctx *x = be->ctx;
    *base = x->arena;
    *bytes = x->arena_bytes;
}

int k3c_backend_cuda_device(const k3c_backend *be) { return ((const cuda_ctx *)be->ctx)->device; }

int k3c_backend_cuda_exact(const k3c_backend *be) { return ((const cuda_ctx *)be->ctx)->exact; }

void *k3c_backend_cuda_stream(const k3c_backend *be) { return ((const cuda_ctx *)be->ctx)->stream; }

void k3c_backend_cuda_load_stats(const k3c_backend *be, k3c_cuda_upload_stats *out) {
    *out = ((const cuda_ctx *)be->ctx)->load;
}

k3c_op_profile *k3c_backend_cuda_profile(k3c_backend *be) {
    return be && be->name && !strcmp(be->name, "cuda") ? ((cuda_ctx *)be->ctx)->prof : NULL;
}

void k3c_backend_cuda_set_exact(k3c_backend *be, int exact) {
    ((cuda_ctx *)be->ctx)->exact = exact;
    be->kv_elem_bytes = exact ? 4 : 2; /* f32 latents: nothing is rounded in this mode */
}

k3c_backend *k3c_backend_cuda_create(int device) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        k3c_errorf_kind(K3C_ERROR_DEVICE, "cuda backend: no usable GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return NULL;
    }
    if (device < 0 || device >= count) {
        k3c_errorf("cuda backend: device %d outside 0..%d", device, count - 1);
        return NULL;
    }
    k3c_backend *be = calloc(1, sizeof *be);
    cuda_ctx *x = calloc(1, sizeof *x);
    if (!be || !x) {
        free(be);
        free(x);
        k3c_errorf_kind(K3C_ERROR_OOM, "cuda backend: out of memory");
        return NULL;
    }
    x->device = device;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        k3c_errorf_kind(K3C_CUDA_ERROR_KIND(e), "cuda backend: device %d: %s", device, cudaGetErrorString(e));
        free(be);
        free(x);
        return NULL;
    }
    /* every kernel's shared memory limit, now: raised during a step, it can wait for a peer rank's copies
     * queued behind a spinning collective (cuda/kernel_limits.h) */
    if (k3c_cuda_kernels_prepare() != K3C_OK) {
        cudaStreamDestroy(x->stream);
        free(be);
        free(x);
        return NULL;
    }
    be->name = "cuda";
    be->ctx = x;
    be->kv_elem_bytes = 2;
    be->init = cuda_init;
    be->destroy = cuda_destroy;
    be->sync = cuda_sync;
    be->alloc = cuda_alloc;
    be->free = cuda_freebuf;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->copy = cuda_copy;
    be->fill_bytes = cuda_fill_bytes;
    be->mem_free = cuda_mem_free;
    be->host_alloc = cuda_host_alloc;
    be->host_free = cuda_host_free;
    be->gather_rows = cuda_gather_rows;
    be->mla_absorb = cuda_mla_absorb;
    be->mla_attention_part = cuda_mla_attention_part;
    be->mla_merge = cuda_mla_merge;
    be->embed = cuda_embed;
    be->matmul = cuda_matmul;
    be->rmsnorm = cuda_rmsnorm;
    be->add = cuda_add;
    be->attnres_mix = cuda_attnres_mix;
    be->gated_act = cuda_gated_act;
    be->sigmoid_mul = cuda_sigmoid_mul;
    be->kda_conv = cuda_kda_conv;
    be->kda_gate = cuda_kda_gate;
    be->kda_qk_norm = cuda_kda_qk_norm;
    be->kda_delta = cuda_kda_delta;
    be->kda_gated_norm = cuda_kda_gated_norm;
    be->mla_cache_write = cuda_mla_cache_write;
    be->mla_attention = cuda_mla_attention;
    be->mla_attention_expanded = cuda_mla_attention_expanded;
    be->moe = cuda_moe;
    be->round = cuda_round;
    be->moe_partial = cuda_moe_partial;
    be->moe_route = cuda_moe_route;
    be->moe_experts = cuda_moe_experts;
    be->moe_combine = cuda_moe_combine;
    return be;
}

#else
typedef int k3c_backend_cuda_not_built; /* ISO C wants a non-empty translation unit */
#endif
