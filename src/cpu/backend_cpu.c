/* The CPU backend: the stock forward's ops (backend/backend.h) over host memory, with the kernels of
 * cpu/ops.h and the thread pool. Buffers are plain malloc'd memory; the MLA cache holds f32 values that are
 * bf16-rounded (kv_elem_bytes = 4). Every op output the contract calls "rounded" is rounded here, after
 * the kernel ran in f32. All scratch is allocated in init() from the limits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/resident.h"
#include "cpu/vec.h"
#include "model/model.h"
#include "backend/backend.h"
#include "util/bf16.h"
#include "util/fp8.h"
#include "util/error.h"
#include "util/log.h"

#define MM_QUEUE 16
/* Tokens per chunk of the chunked delta rule inside a block of the invariance grid (stock/forward.c): a
 * block is cut into chunks of KDA_CHUNK from its start (the last one shorter). */
#define KDA_CHUNK 64

typedef struct cpu_ctx {
    k3c_pool *pool;
    int threads;
    const k3c_config *c;
    k3c_backend_limits lim;
    int silu_gate;
    int exact; /* diagnostic: no bf16 rounding anywhere (validates the math against the float64 reference) */
    float *route_margins; /* tests only (k3c_backend_cpu_track_route_margins): per row, lowered by each MoE layer */
    int route_margin_rows;
    /* KDA: o of a commit (discarded); chunked-form scratch, kda_scratch_n floats per pool thread */
    float *kda_o;
    float *kda_scratch;
    size_t kda_scratch_n;
    /* MLA: q_abs [rows, Hm, lat], o_lat [rows, Hm, kv_lora], gathered latents [max_context, lat] */
    float *q_abs, *o_lat, *lat_rows;
    /* MoE */
    float *logits;     /* [rows, E] */
    int *idx;          /* [rows, k] */
    float *wts;        /* [rows, k] */
    float *z;          /* [rows, Rin] */
    int *pairs;        /* [pairs] (row * k + j) grouped by expert; pairs = rows * k, or the limits' max_expert_rows */
    int *counts;       /* [E + 1] */
    float *xe;         /* [pairs, Rin] */
    float *ea, *eu;    /* [pairs, F] */
    float *d;          /* [pairs, Rin] */
    float *r;          /* [rows, Rin] */
    float *rup;        /* [rows, D] */
    float *sa, *su;    /* [rows, Fs] */
    float *sh;         /* [rows, D] */
    int *inv;          /* [pairs] sorted position of pair (row * k + j) */
    k3c_mm *mm;        /* product lists handed to k3c_matmul_batch */
    k3c_mm *mla_mm;    /* [max_segs * Hm] W_UV products of the absorbed MLA, per segment and head */
    int *mla_rows;     /* [rows] rows of the segments an MLA call serves */
    k3c_mat *uv;       /* [Hm] per-head W_UV views of kv_b */
    /* Matmuls not yet run: consecutive independent products are merged into one k3c_matmul_batch (one pool
     * wake-up and one load-balancing tail instead of several). Every other op runs flush() first, so the
     * queue is invisible outside the backend; a matmul that reads or overwrites a queued product's output
     * (or input) flushes before it is queued. */
    k3c_mm pend[MM_QUEUE];
    int npend;
} cpu_ctx;

static void flush(cpu_ctx *x) {
    if (x->npend) {
        k3c_matmul_batch(x->pool, x->pend, x->npend);
        x->npend = 0;
    }
}

/* The rounding of a bf16 store; a no-op in the diagnostic exact mode (k3c_backend_cpu_set_exact). */
static inline float rnd(const cpu_ctx *x, float v) { return x->exact ? v : bf16_round(v); }
static void round_n(const cpu_ctx *x, float *p, size_t n) {
    if (x->exact) return;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) v16_store(p + i, v16_bf16_round(v16_load(p + i)));
    for (; i < n; i++) p[i] = bf16_round(p[i]);
}

/* Row-wise ops of a step over the pool: fn(ctx, t0, t1) for disjoint row ranges covering [0, T). Every op
 * handed here computes each row from that row's inputs alone, so the split changes no result; a step of
 * fewer than ROWS_PAR_MIN floats runs on the caller (decode: waking the workers costs more). */
#define ROWS_PAR_MIN 16384
static void par_rows(cpu_ctx *c, int T, size_t row_floats, void (*fn)(void *ctx, int t0, int t1), void *ctx) {
    k3c_pool_for((size_t)T * row_floats >= ROWS_PAR_MIN ? c->pool : NULL, T, fn, ctx);
}

/* ---- lifetime ---- */

static void *xcalloc(size_t n, size_t size, int *bad) {
    if (n == 0) n = 1;
    void *p = calloc(n, size);
    if (!p) *bad = 1;
    return p;
}

static void cpu_free_scratch(cpu_ctx *x) {
    free(x->kda_o); free(x->kda_scratch); free(x->q_abs); free(x->o_lat); free(x->lat_rows);
    free(x->logits); free(x->idx); free(x->wts); free(x->z); free(x->pairs); free(x->counts);
    free(x->xe); free(x->ea); free(x->eu); free(x->d); free(x->r); free(x->rup);
    free(x->sa); free(x->su); free(x->sh); free(x->inv); free(x->mm); free(x->uv);
    free(x->mla_mm); free(x->mla_rows);
}

static int cpu_init(k3c_backend *be, const struct k3c_model *m, const k3c_backend_limits *lim) {
    cpu_ctx *x = be->ctx;
    const k3c_config *c = &m->config;
    if (m->device_synthetic)
        return k3c_errorf("cpu backend: the model is device-synthetic (its matrices exist only in GPU memory, "
                          "generated by a device backend); use --device cuda or a synthesized checkpoint");
    x->c = c;
    x->lim = *lim;
    x->silu_gate = k3c_config_kda_silu_gate(c);
    size_t R = (size_t)lim->max_rows, D = c->hidden_size, P = k3c_config_kda_proj(c);
    size_t Hm = c->num_attention_heads, lat = k3c_config_mla_latent(c), kvl = c->kv_lora_rank;
    size_t E = c->num_experts, K = c->num_experts_per_token > 0 ? c->num_experts_per_token : 1;
    size_t Rin = k3c_config_expert_in(c), F = c->moe_intermediate_size, Fs = k3c_config_shared_width(c);
    size_t NP = R * K > (size_t)lim->max_expert_rows ? R * K : (size_t)lim->max_expert_rows; /* (row, expert) pairs */
    int bad = 0;
    x->kda_o = xcalloc(R * P, 4, &bad);
    if (c->kda_num_heads > 0) {
        x->kda_scratch_n = k3c_kda_chunk_scratch(KDA_CHUNK, c->kda_head_dim, c->kda_head_dim);
        x->kda_scratch = xcalloc((size_t)x->threads * x->kda_scratch_n, 4, &bad);
    }
    x->q_abs = xcalloc(R * Hm * lat, 4, &bad);
    x->o_lat = xcalloc(R * Hm * kvl, 4, &bad);
    x->lat_rows = xcalloc((size_t)lim->max_context * lat, 4, &bad);
    x->logits = xcalloc(R * E, 4, &bad);
    x->idx = xcalloc(R * K, sizeof(int), &bad);
    x->wts = xcalloc(R * K, 4, &bad);
    x->z = xcalloc(R * Rin, 4, &bad);
    x->pairs = xcalloc(NP, sizeof(int), &bad);
    x->counts = xcalloc(E + 1, sizeof(int), &bad);
    x->xe = xcalloc(NP * Rin, 4, &bad);
    x->ea = xcalloc(NP * F, 4, &bad);
    x->eu = xcalloc(NP * F, 4, &bad);
    x->d = xcalloc(NP * Rin, 4, &bad);
    x->r = xcalloc(R * Rin, 4, &bad);
    x->rup = xcalloc(R * D, 4, &bad);
    x->sa = xcalloc(R * Fs, 4, &bad);
    x->su = xcalloc(R * Fs, 4, &bad);
    x->sh = xcalloc(R * D, 4, &bad);
    x->inv = xcalloc(NP, sizeof(int), &bad);
    x->mm = xcalloc(2 * E + Hm + 8, sizeof(k3c_mm), &bad);
    x->uv = xcalloc(Hm, sizeof(k3c_mat), &bad);
    x->mla_mm = xcalloc((size_t)lim->max_segs * Hm, sizeof(k3c_mm), &bad);
    x->mla_rows = xcalloc(R, sizeof(int), &bad);
    if (bad) {
        cpu_free_scratch(x);
        memset(&x->kda_o, 0, sizeof *x - offsetof(cpu_ctx, kda_o));
        return k3c_errorf_kind(K3C_ERROR_OOM, "cpu backend: out of memory for step scratch (max_rows %d, max_context %d)",
                          lim->max_rows, lim->max_context);
    }
    /* the load (cpu/resident.h): the mapped weights read in now, not page by page in the first steps */
    uint64_t bytes = 0;
    double secs = 0;
    K3C_TRY(k3c_cpu_make_resident(x->pool, m, &bytes, &secs));
    if (bytes >= (256u << 20))
        k3c_log(K3C_LOG_INFO, "cpu: weights %.2f GB resident in %.3f s: %.2f GB/s (%d thread%s, mapped checkpoint)",
                bytes / 1e9, secs, secs > 0 ? bytes / 1e9 / secs : 0, x->threads, x->threads == 1 ? "" : "s");
    return K3C_OK;
}

static void cpu_destroy(k3c_backend *be) {
    if (!be) return;
    cpu_ctx *x = be->ctx;
    if (x) {
        cpu_free_scratch(x);
        k3c_pool_free(x->pool);
        free(x);
    }
    free(be);
}

static int cpu_sync(k3c_backend *be) {
    flush(be->ctx);
    return K3C_OK;
}

/* ---- memory ---- */

static void *cpu_alloc(k3c_backend *be, size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
        k3c_errorf_kind(K3C_ERROR_OOM, "cpu backend: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    return p;
}
static void cpu_freebuf(k3c_backend *be, void *p) {
    flush(be->ctx);
    free(p);
}
static void cpu_copy(k3c_backend *be, void *dst, const void *src, size_t bytes) {
    flush(be->ctx);
    if (bytes && dst != src) memmove(dst, src, bytes);
}
static void cpu_fill_bytes(k3c_backend *be, void *dst, int byte, size_t bytes) {
    flush(be->ctx);
    memset(dst, byte, bytes);
}
/* MemAvailable (kB) from /proc/meminfo: the kernel's estimate of what can be allocated without swapping; in a
 * cgroup (v2) with a memory.max, at most what is left under that limit (a container's MemAvailable is the
 * host's). */
static size_t cpu_mem_free(k3c_backend *be, const char **source) {
    *source = "MemAvailable in /proc/meminfo";
    unsigned long long avail = 0, max = 0, cur = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &avail) == 1) break;
        fclose(f);
    }
    avail *= 1024;
    FILE *fm = fopen("/sys/fs/cgroup/memory.max", "r"), *fc = fopen("/sys/fs/cgroup/memory.current", "r");
    if (fm && fc && fscanf(fm, "%llu", &max) == 1 && fscanf(fc, "%llu", &cur) == 1) { /* "max": no limit */
        unsigned long long left = max > cur ? max - cur : 0;
        if (!avail || left < avail) {
            avail = left;
            *source = "memory.max of the cgroup";
        }
    }
    if (fm) fclose(fm);
    if (fc) fclose(fc);
    return (size_t)avail;
}
static void cpu_gather_rows(k3c_backend *be, const float *src, const int *rows, int n, int D, float *dst) {
    flush(be->ctx);
    for (int i = 0; i < n; i++) memmove(dst + (size_t)i * D, src + (size_t)rows[i] * D, (size_t)D * 4);
}

/* ---- dense ---- */

static void cpu_embed(k3c_backend *be, const k3c_mat *E, const int32_t *ids, int T, float *out) {
    flush(be->ctx);
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * E->cols;
        if (ids[t] >= 0) {
            k3c_bf16_row(E, ids[t], o);
        } else { /* another rank's vocabulary row (backend.h): -0.0, which the all-reduce adds exactly */
            for (int i = 0; i < E->cols; i++) o[i] = -0.0f;
        }
    }
}

static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    const char *pa = a, *pb = b;
    return pa < pb + bn && pb < pa + an;
}

static void cpu_matmul(k3c_backend *be, const k3c_mat *W, const float *x, int T, float *y, int round) {
    cpu_ctx *c = be->ctx;
    size_t xn = (size_t)T * W->cols * 4, yn = (size_t)T * W->rows * 4;
    for (int i = 0; i < c->npend; i++) {
        const k3c_mm *q = &c->pend[i];
        size_t qx = (size_t)q->T * q->W->cols * 4, qy = (size_t)q->T * q->W->rows * 4;
        if (overlaps(x, xn, q->y, qy) || overlaps(y, yn, q->y, qy) || overlaps(y, yn, q->x, qx)) {
            flush(c);
            break;
        }
    }
    /* every matmul input of the forward is a rounded activation (stock/forward.c), so bf16 products */
    c->pend[c->npend++] = (k3c_mm){.W = W, .x = x, .T = T, .y = y, .round = round && !c->exact, .xbf16 = !c->exact};
    if (c->npend == MM_QUEUE) flush(c);
}

typedef struct norm_job {
    const cpu_ctx *c;
    const float *x, *w;
    int xs, ys, n;
    float eps;
    float *y;
} norm_job;

static void norm_rows(void *ctx, int b, int e) {
    norm_job *j = ctx;
    for (int t = b; t < e; t++) {
        float *y = j->y + (size_t)t * j->ys;
        k3c_rmsnorm(j->x + (size_t)t * j->xs, j->w, j->n, j->eps, y);
        round_n(j->c, y, j->n);
    }
}

static void cpu_rmsnorm(k3c_backend *be, const float *x, int x_stride, const float *w, int T, int n, float eps,
                        float *y, int y_stride) {
    cpu_ctx *c = be->ctx;
    flush(c);
    norm_job j = {c, x, w, x_stride, y_stride, n, eps, y};
    k3c_pool_for(T > 1 ? c->pool : NULL, T, norm_rows, &j);
}

/* Elementwise ops in pieces of EW_PIECE elements (the rows of par_rows). */
#define EW_PIECE 4096
typedef struct ew_job {
    const cpu_ctx *c;
    const float *a, *b;
    float *out;
    size_t n;
} ew_job;

static void add_pieces(void *ctx, int b, int e) {
    ew_job *j = ctx;
    size_t i1 = (size_t)e * EW_PIECE < j->n ? (size_t)e * EW_PIECE : j->n;
    for (size_t i = (size_t)b * EW_PIECE; i < i1; i++) j->out[i] = j->a[i] + j->b[i];
    round_n(j->c, j->out + (size_t)b * EW_PIECE, i1 - (size_t)b * EW_PIECE);
}

static void cpu_add(k3c_backend *be, const float *a, const float *b, size_t n, float *out) {
    cpu_ctx *c = be->ctx;
    flush(c);
    ew_job j = {c, a, b, out, n};
    par_rows(c, (int)((n + EW_PIECE - 1) / EW_PIECE), EW_PIECE, add_pieces, &j);
}

typedef struct mix_job {
    const cpu_ctx *c;
    const float *const *src;
    int nsrc, D;
    const float *proj, *norm;
    float eps;
    float *out;
} mix_job;

static void mix_rows(void *ctx, int b, int e) {
    mix_job *j = ctx;
    const float *rows[64];
    const float **p = j->nsrc <= 64 ? rows : malloc(sizeof(float *) * j->nsrc);
    if (!p) return; /* only for > 64 sources, which no config has (K3: 9) */
    for (int t = b; t < e; t++) {
        for (int s = 0; s < j->nsrc; s++) p[s] = j->src[s] + (size_t)t * j->D;
        float *o = j->out + (size_t)t * j->D;
        k3c_attnres_mix(p, j->nsrc, j->D, j->proj, j->norm, j->eps, o);
        round_n(j->c, o, j->D);
    }
    if (p != rows) free(p);
}

static void cpu_attnres_mix(k3c_backend *be, const float *const *src, int nsrc, int T, int D, const float *proj,
                            const float *norm, float eps, float *out) {
    cpu_ctx *c = be->ctx;
    flush(c);
    mix_job j = {c, src, nsrc, D, proj, norm, eps, out};
    k3c_pool_for(T > 1 ? c->pool : NULL, T, mix_rows, &j);
}

/* The gated activation (libm tanhf / expf per element: ~0.1 us per 4 elements of SiTU) split over the pool
 * in pieces of ACT_PIECE elements; elementwise, so the split changes nothing. */
#define ACT_PIECE 512
typedef struct act_job {
    const cpu_ctx *c;
    const float *gate, *up;
    size_t n;
    float *out;
} act_job;

static void act_pieces(void *ctx, int b, int e) {
    act_job *j = ctx;
    size_t i0 = (size_t)b * ACT_PIECE, i1 = (size_t)e * ACT_PIECE < j->n ? (size_t)e * ACT_PIECE : j->n;
    k3c_gated_act(j->c->c, j->gate + i0, j->up + i0, (int)(i1 - i0), j->out + i0);
    round_n(j->c, j->out + i0, i1 - i0);
}

static void gated_act_par(cpu_ctx *c, const float *gate, const float *up, size_t n, float *out) {
    act_job j = {c, gate, up, n, out};
    k3c_pool_for(c->pool, (int)((n + ACT_PIECE - 1) / ACT_PIECE), act_pieces, &j);
}

static void cpu_gated_act(k3c_backend *be, const float *gate, const float *up, size_t n, float *out) {
    cpu_ctx *c = be->ctx;
    flush(c);
    gated_act_par(c, gate, up, n, out);
}

static void sigmoid_mul_pieces(void *ctx, int b, int e) {
    ew_job *j = ctx;
    size_t i1 = (size_t)e * EW_PIECE < j->n ? (size_t)e * EW_PIECE : j->n;
    for (size_t i = (size_t)b * EW_PIECE; i < i1; i++) j->out[i] = rnd(j->c, j->out[i] * k3c_sigmoidf(j->b[i]));
}

static void cpu_sigmoid_mul(k3c_backend *be, float *x, const float *g, size_t n) {
    cpu_ctx *c = be->ctx;
    flush(c);
    ew_job j = {c, NULL, g, x, n};
    par_rows(c, (int)((n + EW_PIECE - 1) / EW_PIECE), EW_PIECE, sigmoid_mul_pieces, &j);
}

/* ---- KDA ---- */

typedef struct conv_job {
    const cpu_ctx *c;
    const float *x, *taps, *window;
    int T, P, W;
    float *out;
} conv_job;

static void conv_rows(void *ctx, int b, int e) {
    conv_job *j = ctx;
    k3c_kda_conv_rows(j->x, j->T, j->P, j->W, j->taps, j->window, b, e, j->out);
    round_n(j->c, j->out + (size_t)b * j->P, (size_t)(e - b) * j->P);
}

static void cpu_kda_conv(k3c_backend *be, const float *x, const float *taps, int which, const k3c_seg *segs,
                         int nseg, float *out) {
    cpu_ctx *c = be->ctx;
    flush(c);
    int P = k3c_config_kda_proj(c->c), W = c->c->kda_conv_kernel;
    for (int s = 0; s < nseg; s++) {
        const k3c_seg *g = &segs[s];
        if (g->n <= 0) continue;
        float *window = g->window + (size_t)which * (W - 1) * P;
        conv_job j = {c, x + (size_t)g->row0 * P, taps, window, g->n, P, W, out + (size_t)g->row0 * P};
        par_rows(c, g->n, (size_t)P, conv_rows, &j);
        k3c_kda_conv_advance(j.x, g->n, P, W, window);
    }
}

typedef struct kda_rows_job {
    const cpu_ctx *c;
    const float *f, *b, *a_log, *dt_bias, *o, *z, *w;
    float *g, *beta, *q, *k, *y;
} kda_rows_job;

static void gate_rows(void *ctx, int b, int e) {
    kda_rows_job *j = ctx;
    size_t P = k3c_config_kda_proj(j->c->c), H = j->c->c->kda_num_heads;
    k3c_kda_gate(j->c->c, j->a_log, j->dt_bias, j->f + b * P, e - b, j->g + b * P);
    for (size_t i = b * H; i < e * H; i++) j->beta[i] = k3c_sigmoidf(j->b[i]);
}

static void cpu_kda_gate(k3c_backend *be, const float *f, const float *b, const float *a_log, const float *dt_bias,
                         int T, float *g, float *beta) {
    cpu_ctx *c = be->ctx;
    flush(c);
    kda_rows_job j = {.c = c, .f = f, .b = b, .a_log = a_log, .dt_bias = dt_bias, .g = g, .beta = beta};
    par_rows(c, T, k3c_config_kda_proj(c->c), gate_rows, &j);
}

static void qk_norm_rows(void *ctx, int b, int e) {
    kda_rows_job *j = ctx;
    size_t P = k3c_config_kda_proj(j->c->c);
    k3c_kda_qk_norm(j->q + b * P, j->k + b * P, e - b, j->c->c->kda_num_heads, j->c->c->kda_head_dim);
}

static void cpu_kda_qk_norm(k3c_backend *be, float *q, float *k, int T) {
    cpu_ctx *c = be->ctx;
    flush(c);
    kda_rows_job j = {.c = c, .q = q, .k = k};
    par_rows(c, T, k3c_config_kda_proj(c->c), qk_norm_rows, &j);
}

/* Heads of one segment per unit of parallel work: units = nseg * groups, group g of a segment takes heads
 * [g * hg, (g + 1) * hg). Heads are independent, so the split changes nothing in the results. */
typedef struct delta_job {
    cpu_ctx *c;
    const float *q, *k, *v, *g, *beta;
    const k3c_seg *segs;
    int groups, hg;
    float *o;
} delta_job;

static void head_groups(int H, int threads, int *groups, int *hg) {
    int g = threads > 1 ? 2 * threads : 1;
    if (g > H) g = H;
    if (g < 1) g = 1;
    *hg = (H + g - 1) / g;
    *groups = (H + *hg - 1) / *hg;
}

static void delta_units(void *ctx, int b, int e, int worker) {
    delta_job *j = ctx;
    const k3c_config *c = j->c->c;
    int H = c->kda_num_heads, dk = c->kda_head_dim, P = H * dk;
    for (int u = b; u < e; u++) {
        const k3c_seg *sg = &j->segs[u / j->groups];
        int h0 = (u % j->groups) * j->hg, h1 = h0 + j->hg < H ? h0 + j->hg : H;
        if (sg->n <= 0 || h0 >= h1) continue;
        size_t off = (size_t)sg->row0 * P;
        float *o = j->o + off;
        if (sg->chunked) /* block by block, each cut into chunks of KDA_CHUNK from its start */
            for (int t0 = 0; t0 < sg->n; t0 += sg->chunked) {
                size_t bo = (size_t)t0 * P;
                int bn = sg->n - t0 < sg->chunked ? sg->n - t0 : sg->chunked;
                k3c_kda_chunked_heads(sg->state, j->q + off + bo, j->k + off + bo, j->v + off + bo, j->g + off + bo,
                                      j->beta + ((size_t)sg->row0 + t0) * H, bn, H, h0, h1, dk, dk, KDA_CHUNK,
                                      j->c->kda_scratch + (size_t)worker * j->c->kda_scratch_n, o + bo);
            }
        else
            k3c_kda_recurrent_heads(sg->state, j->q + off, j->k + off, j->v + off, j->g + off,
                                    j->beta + (size_t)sg->row0 * H, sg->n, H, h0, h1, dk, dk, o);
        for (int t = 0; t < sg->n; t++) round_n(j->c, o + (size_t)t * P + (size_t)h0 * dk, (size_t)(h1 - h0) * dk);
    }
}

static void cpu_kda_delta(k3c_backend *be, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, const k3c_seg *segs, int nseg, float *o) {
    cpu_ctx *c = be->ctx;
    flush(c);
    delta_job j = {c, q, k, v, g, beta, segs, 1, 1, o ? o : c->kda_o};
    head_groups(c->c->kda_num_heads, c->threads, &j.groups, &j.hg);
    k3c_pool_for_worker(c->pool, nseg * j.groups, delta_units, &j);
}

static void gated_norm_rows(void *ctx, int b, int e) {
    kda_rows_job *j = ctx;
    const cpu_ctx *c = j->c;
    size_t H = c->c->kda_num_heads, dv = c->c->kda_head_dim, P = H * dv;
    k3c_kda_gated_norm(j->o + b * P, j->z + b * P, j->w, e - b, (int)H, (int)dv, c->c->rms_norm_eps, c->silu_gate,
                       j->y + b * P);
    round_n(c, j->y + b * P, (size_t)(e - b) * P);
}

static void cpu_kda_gated_norm(k3c_backend *be, const float *o, const float *z, const float *w, int T, float *y) {
    cpu_ctx *c = be->ctx;
    flush(c);
    kda_rows_job j = {.c = c, .o = o, .z = z, .w = w, .y = y};
    par_rows(c, T, (size_t)c->c->kda_num_heads * c->c->kda_head_dim, gated_norm_rows, &j);
}

/* ---- MLA ---- */

static void cpu_mla_cache_write(k3c_backend *be, const float *lat, const k3c_seg *segs, int nseg, void *cache) {
    cpu_ctx *c = be->ctx;
    flush(c);
    int L = k3c_config_mla_latent(c->c), bs = c->lim.block_size;
    float *cf = cache;
    for (int s = 0; s < nseg; s++) {
        const k3c_seg *g = &segs[s];
        for (int i = 0; i < g->n; i++) {
            int p = g->pos + i;
            if (g->dcp > 1) { /* interleaved over the DCP ranks (backend.h k3c_seg): this rank's positions only */
                if (p % g->dcp != g->dcp_rank) continue;
                p /= g->dcp;
            }
            size_t slot = (size_t)g->block_table[p / bs] * bs + p % bs;
            const float *src = lat + (size_t)(g->row0 + i) * L;
            if (c->lim.kv_fp8)
                for (int j = 0; j < L; j++) cf[slot * L + j] = k3c_e4m3_round(src[j]);
            else memcpy(cf + slot * L, src, (size_t)L * 4);
        }
    }
}

typedef struct absorb_job {
    const cpu_ctx *x;
    const k3c_config *c;
    const k3c_mla_weights *w;
    const float *in;  /* q [T, Hm*(nope+rope)] */
    const int *rows;  /* the rows to absorb (those of the call's segments) */
    float *out;       /* q_abs [T, Hm, lat] */
} absorb_job;

/* q_abs[t,h] = [W_UK[h]^T q_nope[t,h] | q_pe[t,h]]; W_UK[h] = kv_b rows h*(nope+v) .. + nope. Column c of
 * the product sums q_i * W[i][c] over i in order (one FMA chain per column, 16 columns per vector). */
static void absorb_q(void *ctx, int b, int e) {
    absorb_job *j = ctx;
    const k3c_config *c = j->c;
    int Hm = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int kvl = c->kv_lora_rank, vh = c->v_head_dim, qh = nope + rope, lat = kvl + rope;
    const uint16_t *kvb = j->w->kv_b.w;
    int kv16 = kvl / 16 * 16;
    for (int th = b; th < e; th++) {
        int t = j->rows[th / Hm], h = th % Hm;
        const float *q = j->in + (size_t)t * Hm * qh + (size_t)h * qh;
        float *out = j->out + ((size_t)t * Hm + h) * lat;
        for (int cc = 0; cc < kvl; cc++) out[cc] = 0.0f;
        for (int i = 0; i < nope; i++) {
            const uint16_t *row = kvb + ((size_t)h * (nope + vh) + i) * kvl;
            float qi = q[i];
            k3c_v16 qv = v16_splat(qi);
            for (int cc = 0; cc < kv16; cc += 16) v16_store(out + cc, qv * v16_load_bf16(row + cc) + v16_load(out + cc));
            for (int cc = kv16; cc < kvl; cc++) out[cc] = fmaf(qi, bf16_to_f32(row[cc]), out[cc]);
        }
        memcpy(out + kvl, q + nope, (size_t)rope * 4);
    }
}

typedef struct attend_job {
    const cpu_ctx *x;
    const k3c_seg *segs;
    const float *cache;
    int groups, hg;
    float scale;
} attend_job;

static void attend_units(void *ctx, int b, int e) {
    attend_job *j = ctx;
    const k3c_config *c = j->x->c;
    int Hm = c->num_attention_heads, kvl = c->kv_lora_rank, rope = c->qk_rope_head_dim, lat = kvl + rope;
    for (int u = b; u < e; u++) {
        const k3c_seg *g = &j->segs[u / j->groups];
        int h0 = (u % j->groups) * j->hg, h1 = h0 + j->hg < Hm ? h0 + j->hg : Hm;
        if (g->n <= 0 || h0 >= h1) continue;
        k3c_mla_attend_paged(j->x->q_abs + (size_t)g->row0 * Hm * lat, g->n, Hm, h0, h1, kvl, rope, j->cache,
                             g->block_table, j->x->lim.block_size, g->pos, j->scale,
                             j->x->o_lat + (size_t)g->row0 * Hm * kvl);
    }
}

static void cpu_mla_attention(k3c_backend *be, const k3c_mla_weights *w, const float *q, const k3c_seg *segs,
                              int nseg, const void *cache, float *o) {
    cpu_ctx *x = be->ctx;
    flush(x);
    const k3c_config *c = x->c;
    int Hm = c->num_attention_heads, kvl = c->kv_lora_rank, rope = c->qk_rope_head_dim;
    int nope = c->qk_nope_head_dim, vh = c->v_head_dim;
    /* only the rows of these segments: the forward may hand the prompt segments of the step to
     * mla_attention_expanded, and their rows are neither computed nor written here */
    int nrows = 0;
    for (int s = 0; s < nseg; s++)
        for (int i = 0; i < segs[s].n; i++) x->mla_rows[nrows++] = segs[s].row0 + i;
    absorb_job aj = {x, c, w, q, x->mla_rows, x->q_abs};
    k3c_pool_for(x->pool, nrows * Hm, absorb_q, &aj);

    attend_job tj = {x, segs, cache, 1, 1, 1.0f / sqrtf((float)(nope + rope))};
    head_groups(Hm, x->threads, &tj.groups, &tj.hg);
    k3c_pool_for(x->pool, nseg * tj.groups, attend_units, &tj);

    /* o[t, h] = W_UV[h] o_lat[t, h], rounded: one strided product per segment and head, all in one batch
     * (batch invariant: a row's output does not depend on the segment's row count). W_UV[h] = kv_b rows
     * h*(nope+v) + nope .. + v. o_lat is f32 inside the op (not a rounded activation), so f32 products. */
    int n = 0;
    for (int h = 0; h < Hm; h++) x->uv[h] = (k3c_mat){w->kv_b.w + ((size_t)h * (nope + vh) + nope) * kvl, vh, kvl};
    for (int s = 0; s < nseg; s++) {
        if (segs[s].n <= 0) continue;
        size_t r0 = (size_t)segs[s].row0;
        for (int h = 0; h < Hm; h++)
            x->mla_mm[n++] = (k3c_mm){.W = &x->uv[h], .x = x->o_lat + (r0 * Hm + h) * kvl, .T = segs[s].n,
                                      .y = o + (r0 * Hm + h) * vh, .round = !x->exact, .ldx = (size_t)Hm * kvl,
                                      .ldy = (size_t)Hm * vh};
    }
    k3c_matmul_batch(x->pool, x->mla_mm, n);
}

/* ---- decode context parallel (backend.h mla_absorb, mla_attention_part, mla_merge) ---- */

static void cpu_mla_absorb(k3c_backend *be, const k3c_mla_weights *w, const float *q, int T, float *q_abs) {
    cpu_ctx *x = be->ctx;
    flush(x);
    for (int t = 0; t < T; t++) x->mla_rows[t] = t;
    absorb_job aj = {x, x->c, w, q, x->mla_rows, q_abs};
    k3c_pool_for(x->pool, T * x->c->num_attention_heads, absorb_q, &aj);
}

typedef struct part_job {
    const cpu_ctx *x;
    const float *q_abs;
    const k3c_seg *segs;
    const float *cache;
    int H, groups, hg;
    float scale;
    float *o_lat, *lse;
} part_job;

static void part_units(void *ctx, int b, int e) {
    part_job *j = ctx;
    const k3c_config *c = j->x->c;
    int kvl = c->kv_lora_rank, rope = c->qk_rope_head_dim, lat = kvl + rope, H = j->H;
    for (int u = b; u < e; u++) {
        const k3c_seg *g = &j->segs[u / j->groups];
        int h0 = (u % j->groups) * j->hg, h1 = h0 + j->hg < H ? h0 + j->hg : H;
        if (g->n <= 0 || h0 >= h1) continue;
        size_t r0 = (size_t)g->row0;
        k3c_mla_attend_part(j->q_abs + r0 * H * lat, g->n, H, h0, h1, kvl, rope, j->cache, g->block_table,
                            j->x->lim.block_size, g->pos, g->dcp, g->dcp_rank, j->scale, j->o_lat + r0 * H * kvl,
                            j->lse + r0 * H);
    }
}

static void cpu_mla_attention_part(k3c_backend *be, const float *q_abs, int H, const k3c_seg *segs, int nseg,
                                   const void *cache, float *o_lat, float *lse) {
    cpu_ctx *x = be->ctx;
    flush(x);
    const k3c_config *c = x->c;
    part_job j = {x, q_abs, segs, cache, H, 1, 1, 1.0f / sqrtf((float)(c->qk_nope_head_dim + c->qk_rope_head_dim)),
                  o_lat, lse};
    head_groups(H, x->threads, &j.groups, &j.hg);
    k3c_pool_for(x->pool, nseg * j.groups, part_units, &j);
}

typedef struct merge_job {
    const cpu_ctx *x;
    const float *o_parts, *lses;
    size_t stride;
    int n;
} merge_job;

static void merge_units(void *ctx, int b, int e) {
    merge_job *j = ctx;
    int Hm = j->x->c->num_attention_heads, kvl = j->x->c->kv_lora_rank;
    for (int u = b; u < e; u++)
        k3c_mla_merge(j->o_parts, j->lses, j->stride, j->n, Hm, kvl, u / Hm, u % Hm, j->x->o_lat + (size_t)u * kvl);
}

static void cpu_mla_merge(k3c_backend *be, const k3c_mla_weights *w, const float *o_parts, const float *lses,
                          size_t stride, int n, int T, float *o) {
    cpu_ctx *x = be->ctx;
    flush(x);
    const k3c_config *c = x->c;
    int Hm = c->num_attention_heads, kvl = c->kv_lora_rank, nope = c->qk_nope_head_dim, vh = c->v_head_dim;
    if (T <= 0) return;
    merge_job j = {x, o_parts, lses, stride, n};
    k3c_pool_for(x->pool, T * Hm, merge_units, &j);
    /* o = rnd(W_UV[h] lat) per head, as cpu_mla_attention ends (the same strided products, one of T rows) */
    for (int h = 0; h < Hm; h++) {
        x->uv[h] = (k3c_mat){w->kv_b.w + ((size_t)h * (nope + vh) + nope) * kvl, vh, kvl};
        x->mla_mm[h] = (k3c_mm){.W = &x->uv[h], .x = x->o_lat + (size_t)h * kvl, .T = T, .y = o + (size_t)h * vh,
                                .round = !x->exact, .ldx = (size_t)Hm * kvl, .ldy = (size_t)Hm * vh};
    }
    k3c_matmul_batch(x->pool, x->mla_mm, Hm);
}

/* The expanded form (spec §3.2) for prompt segments: per (segment, head group) unit, the cached latents
 * are decompressed through kv_b once and shared by the segment's rows (cpu/mla.c). The decompressed
 * k_nope and v are rounded to bf16 (they are outputs of a bf16 matmul in the contract of
 * stock/forward.c), except in the exact diagnostic; o is rounded after the kernel. */
typedef struct expand_job {
    const cpu_ctx *x;
    const k3c_mla_weights *w;
    const float *q;
    const k3c_seg *segs;
    const float *cache;
    int groups, hg;
    float scale;
    float *o;
} expand_job;

static void expand_units(void *ctx, int b, int e) {
    expand_job *j = ctx;
    const k3c_config *c = j->x->c;
    int Hm = c->num_attention_heads, kvl = c->kv_lora_rank, rope = c->qk_rope_head_dim;
    int nope = c->qk_nope_head_dim, vh = c->v_head_dim;
    for (int u = b; u < e; u++) {
        const k3c_seg *g = &j->segs[u / j->groups];
        int h0 = (u % j->groups) * j->hg, h1 = h0 + j->hg < Hm ? h0 + j->hg : Hm;
        if (g->n <= 0 || h0 >= h1) continue;
        float *o = j->o + (size_t)g->row0 * Hm * vh;
        k3c_mla_attend_expanded(j->q + (size_t)g->row0 * Hm * (nope + rope), g->n, Hm, h0, h1, nope, rope, vh, kvl,
                                &j->w->kv_b, j->cache, g->block_table, j->x->lim.block_size, g->pos, j->scale,
                                !j->x->exact, o);
        for (int t = 0; t < g->n; t++) round_n(j->x, o + ((size_t)t * Hm + h0) * vh, (size_t)(h1 - h0) * vh);
    }
}

static void cpu_mla_attention_expanded(k3c_backend *be, const k3c_mla_weights *w, const float *q,
                                       const k3c_seg *segs, int nseg, const void *cache, float *o) {
    cpu_ctx *x = be->ctx;
    flush(x);
    const k3c_config *c = x->c;
    expand_job j = {x, w, q, segs, cache, 1, 1, 1.0f / sqrtf((float)(c->qk_nope_head_dim + c->qk_rope_head_dim)),
                    o};
    head_groups(c->num_attention_heads, x->threads, &j.groups, &j.hg);
    k3c_pool_for(x->pool, nseg * j.groups, expand_units, &j);
}

/* ---- MoE ---- */

static k3c_mm expert_mm(const cpu_ctx *x, const k3c_mat *Wb, const k3c_mxfp4_mat *Wq, const float *in, int n,
                        float *out) {
    if (x->c->expert_format == K3C_EXPERTS_MXFP4)
        return (k3c_mm){.Wq = Wq, .x = in, .T = n, .y = out, .round = !x->exact, .xbf16 = !x->exact};
    return (k3c_mm){.W = Wb, .x = in, .T = n, .y = out, .round = !x->exact, .xbf16 = !x->exact};
}

/* r[t] = sum_j wts[t, j] d[pair (t, j)], in j order, rounded (not in moe_partial: part). One function for
 * moe and moe_combine, so that both sum with the same operations. */
typedef struct sum_job {
    const cpu_ctx *x;
    const float *d, *wts;
    const int *inv; /* [T K] the row of d holding pair (t, j) */
    int part;
    float *r;
} sum_job;

static void moe_sum_rows(void *ctx, int b, int e) {
    const sum_job *sj = ctx;
    const cpu_ctx *x = sj->x;
    int K = x->c->num_experts_per_token, Rin = k3c_config_expert_in(x->c);
    for (int t = b; t < e; t++) {
        float *r = sj->r + (size_t)t * Rin;
        const float *dj[K];
        for (int j = 0; j < K; j++) dj[j] = sj->d + (size_t)sj->inv[t * K + j] * Rin;
        for (int i = 0; i < Rin; i++) {
            float acc = 0;
            for (int j = 0; j < K; j++) acc += sj->wts[t * K + j] * dj[j][i];
            r[i] = sj->part ? acc : rnd(x, acc);
        }
    }
}

/* After the routed experts' weighted sum in x->r: the latent MoE's norm and up-projection, then the shared
 * expert's output (x->sh) added, into out; what moe and the expert-parallel combine share. */
static void moe_finish(cpu_ctx *x, const k3c_config *c, const k3c_moe_weights *w, int T, int D, int Rin, int latent,
                       int shared, int rd, float *out) {
    k3c_mm *mm = x->mm;
    const float *routed = x->r;
    if (latent) {
        if (c->latent_moe_use_norm) {
            norm_job j = {x, x->r, w->latent_norm, Rin, Rin, Rin, c->rms_norm_eps, x->r};
            k3c_pool_for(T > 1 ? x->pool : NULL, T, norm_rows, &j);
        }
        mm[0] = (k3c_mm){.W = &w->latent_up, .x = x->r, .T = T, .y = x->rup, .round = rd, .xbf16 = rd};
        k3c_matmul_batch(x->pool, mm, 1);
        routed = x->rup;
    }
    if (shared) {
        ew_job j = {x, routed, x->sh, out, (size_t)T * D};
        par_rows(x, (int)((j.n + EW_PIECE - 1) / EW_PIECE), EW_PIECE, add_pieces, &j);
    } else {
        memmove(out, routed, (size_t)T * D * 4);
    }
}

/* Three batches per layer whatever T and k are: {router, latent down, shared gate, shared up} (all read y),
 * {W1, W3 of every selected expert}, {W2 of every selected expert, shared down}. The (row, j) pairs are
 * grouped by expert; pair s of the grouped order has its input row at xe + s * Rin (or in place in z when
 * the expert has one row), its hidden at ea + s * F, its output at d + s * Rin. */
static void moe_run(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, float *out, float *r_part,
                    float *s_part) {
    cpu_ctx *x = be->ctx;
    flush(x);
    int part = r_part != NULL; /* moe_partial: stop at the cross-rank sums (backend.h) */
    const k3c_config *c = x->c;
    int D = c->hidden_size, E = c->num_experts, K = c->num_experts_per_token;
    int Rin = k3c_config_expert_in(c), F = c->moe_intermediate_size;
    int latent = c->routed_expert_hidden_size > 0, shared = w->shared.gate.w != NULL, rd = !x->exact;
    int Fs = shared ? w->shared.gate.rows : 0;
    k3c_mm *mm = x->mm;
    int n = 0;

    /* router logits (f32, from the rounded y), z = rnd(W_rdown y), shared gate / up */
    mm[n++] = (k3c_mm){.W = &w->router, .x = y, .T = T, .y = x->logits, .round = 0, .xbf16 = rd};
    if (latent) mm[n++] = (k3c_mm){.W = &w->latent_down, .x = y, .T = T, .y = x->z, .round = rd, .xbf16 = rd};
    if (shared) {
        mm[n++] = (k3c_mm){.W = &w->shared.gate, .x = y, .T = T, .y = x->sa, .round = rd, .xbf16 = rd};
        mm[n++] = (k3c_mm){.W = &w->shared.up, .x = y, .T = T, .y = x->su, .round = rd, .xbf16 = rd};
    }
    k3c_matmul_batch(x->pool, mm, n);
    for (int t = 0; t < T; t++)
        k3c_route(c, x->logits + (size_t)t * E, w->correction_bias, x->idx + (size_t)t * K, x->wts + (size_t)t * K);
    if (x->route_margins)
        for (int t = 0; t < T && t < x->route_margin_rows; t++) {
            float m = k3c_route_margin(c, x->logits + (size_t)t * E, w->correction_bias);
            if (m < x->route_margins[t]) x->route_margins[t] = m;
        }
    const float *z = latent ? x->z : y;

    /* group (row, j) pairs by expert (counting sort keeps row order inside an expert) */
    memset(x->counts, 0, sizeof(int) * (E + 1));
    for (int i = 0; i < T * K; i++) x->counts[x->idx[i] + 1]++;
    for (int e = 0; e < E; e++) x->counts[e + 1] += x->counts[e];
    for (int i = 0; i < T * K; i++) x->pairs[x->counts[x->idx[i]]++] = i;
    for (int e = E; e > 0; e--) x->counts[e] = x->counts[e - 1];
    x->counts[0] = 0;
    for (int s = 0; s < T * K; s++) x->inv[x->pairs[s]] = s;

    n = 0;
    for (int e = 0; e < E; e++) {
        int b = x->counts[e], ne = x->counts[e + 1] - b;
        if (ne == 0) continue;
        const float *in;
        if (ne == 1) {
            in = z + (size_t)(x->pairs[b] / K) * Rin;
        } else {
            for (int i = 0; i < ne; i++)
                memcpy(x->xe + (size_t)(b + i) * Rin, z + (size_t)(x->pairs[b + i] / K) * Rin, (size_t)Rin * 4);
            in = x->xe + (size_t)b * Rin;
        }
        const k3c_expert *ex = &w->experts[e];
        mm[n++] = expert_mm(x, &ex->w1, &ex->q1, in, ne, x->ea + (size_t)b * F);
        mm[n++] = expert_mm(x, &ex->w3, &ex->q3, in, ne, x->eu + (size_t)b * F);
    }
    k3c_matmul_batch(x->pool, mm, n);
    gated_act_par(x, x->ea, x->eu, (size_t)T * K * F, x->ea);
    if (shared) gated_act_par(x, x->sa, x->su, (size_t)T * Fs, x->sa);

    n = 0;
    for (int e = 0; e < E; e++) {
        int b = x->counts[e], ne = x->counts[e + 1] - b;
        if (ne == 0) continue;
        const k3c_expert *ex = &w->experts[e];
        mm[n] = expert_mm(x, &ex->w2, &ex->q2, x->ea + (size_t)b * F, ne, x->d + (size_t)b * Rin);
        if (part) mm[n].round = 0;
        n++;
    }
    if (shared) mm[n++] = (k3c_mm){.W = &w->shared.down, .x = x->sa, .T = T, .y = part ? s_part : x->sh,
                                   .round = rd && !part, .xbf16 = rd};
    k3c_matmul_batch(x->pool, mm, n);

    /* weighted sum in j order */
    sum_job sj = {x, x->d, x->wts, x->inv, part, x->r};
    par_rows(x, T, (size_t)K * Rin, moe_sum_rows, &sj);
    if (part) {
        memcpy(r_part, x->r, (size_t)T * Rin * 4);
        return;
    }
    moe_finish(x, c, w, T, D, Rin, latent, shared, rd, out);
}

static void cpu_moe(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, float *out) {
    moe_run(be, w, y, T, out, NULL, NULL);
}

static void cpu_moe_partial(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, float *r_part,
                            float *s_part) {
    moe_run(be, w, y, T, NULL, r_part, s_part);
}

/* ---- expert parallel (backend.h moe_route, moe_experts, moe_combine): moe_run's three batches, cut at the
 * exchange; the same products and the same sum, so the rounding is moe's ---- */

static void cpu_moe_route(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, int *idx, float *wts,
                          float *z) {
    cpu_ctx *x = be->ctx;
    flush(x);
    const k3c_config *c = x->c;
    int D = c->hidden_size, E = c->num_experts, K = c->num_experts_per_token;
    int latent = c->routed_expert_hidden_size > 0;
    k3c_mm *mm = x->mm;
    int n = 0;
    mm[n++] = (k3c_mm){.W = &w->router, .x = y, .T = T, .y = x->logits, .round = 0, .xbf16 = !x->exact};
    if (latent) mm[n++] = (k3c_mm){.W = &w->latent_down, .x = y, .T = T, .y = z, .round = !x->exact, .xbf16 = !x->exact};
    k3c_matmul_batch(x->pool, mm, n);
    if (!latent && z != y) memmove(z, y, (size_t)T * D * 4);
    for (int t = 0; t < T; t++)
        k3c_route(c, x->logits + (size_t)t * E, w->correction_bias, idx + (size_t)t * K, wts + (size_t)t * K);
    if (x->route_margins)
        for (int t = 0; t < T && t < x->route_margin_rows; t++) {
            float m = k3c_route_margin(c, x->logits + (size_t)t * E, w->correction_bias);
            if (m < x->route_margins[t]) x->route_margins[t] = m;
        }
}

/* Rows grouped by expert (counting sort: input order inside an expert), as moe_run groups its pairs. */
static void cpu_moe_experts(k3c_backend *be, const k3c_moe_weights *w, const float *in, const int *expert, int n,
                            float *d) {
    cpu_ctx *x = be->ctx;
    flush(x);
    if (n <= 0) return;
    const k3c_config *c = x->c;
    int E = c->num_experts, Rin = k3c_config_expert_in(c), F = c->moe_intermediate_size;
    k3c_mm *mm = x->mm;
    memset(x->counts, 0, sizeof(int) * (E + 1));
    for (int i = 0; i < n; i++) x->counts[expert[i] + 1]++;
    for (int e = 0; e < E; e++) x->counts[e + 1] += x->counts[e];
    for (int i = 0; i < n; i++) x->pairs[x->counts[expert[i]]++] = i;
    for (int e = E; e > 0; e--) x->counts[e] = x->counts[e - 1];
    x->counts[0] = 0;
    int m = 0;
    for (int e = 0; e < E; e++) {
        int b = x->counts[e], ne = x->counts[e + 1] - b;
        if (ne == 0) continue;
        const float *src;
        if (ne == 1) {
            src = in + (size_t)x->pairs[b] * Rin;
        } else {
            for (int i = 0; i < ne; i++)
                memcpy(x->xe + (size_t)(b + i) * Rin, in + (size_t)x->pairs[b + i] * Rin, (size_t)Rin * 4);
            src = x->xe + (size_t)b * Rin;
        }
        const k3c_expert *ex = &w->experts[e];
        mm[m++] = expert_mm(x, &ex->w1, &ex->q1, src, ne, x->ea + (size_t)b * F);
        mm[m++] = expert_mm(x, &ex->w3, &ex->q3, src, ne, x->eu + (size_t)b * F);
    }
    k3c_matmul_batch(x->pool, mm, m);
    gated_act_par(x, x->ea, x->eu, (size_t)n * F, x->ea);
    m = 0;
    for (int e = 0; e < E; e++) {
        int b = x->counts[e], ne = x->counts[e + 1] - b;
        if (ne == 0) continue;
        const k3c_expert *ex = &w->experts[e];
        mm[m++] = expert_mm(x, &ex->w2, &ex->q2, x->ea + (size_t)b * F, ne, x->d + (size_t)b * Rin);
    }
    k3c_matmul_batch(x->pool, mm, m);
    for (int s = 0; s < n; s++) memcpy(d + (size_t)x->pairs[s] * Rin, x->d + (size_t)s * Rin, (size_t)Rin * 4);
}

static void cpu_moe_combine(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, const float *wts,
                            const float *d, const int *pair_row, float *out) {
    cpu_ctx *x = be->ctx;
    flush(x);
    const k3c_config *c = x->c;
    int D = c->hidden_size, K = c->num_experts_per_token, Rin = k3c_config_expert_in(c);
    int latent = c->routed_expert_hidden_size > 0, shared = w->shared.gate.w != NULL, rd = !x->exact;
    int Fs = shared ? w->shared.gate.rows : 0;
    k3c_mm *mm = x->mm;
    if (shared) {
        mm[0] = (k3c_mm){.W = &w->shared.gate, .x = y, .T = T, .y = x->sa, .round = rd, .xbf16 = rd};
        mm[1] = (k3c_mm){.W = &w->shared.up, .x = y, .T = T, .y = x->su, .round = rd, .xbf16 = rd};
        k3c_matmul_batch(x->pool, mm, 2);
        gated_act_par(x, x->sa, x->su, (size_t)T * Fs, x->sa);
        mm[0] = (k3c_mm){.W = &w->shared.down, .x = x->sa, .T = T, .y = x->sh, .round = rd, .xbf16 = rd};
        k3c_matmul_batch(x->pool, mm, 1);
    }
    sum_job sj = {x, d, wts, pair_row, 0, x->r};
    par_rows(x, T, (size_t)K * Rin, moe_sum_rows, &sj);
    moe_finish(x, c, w, T, D, Rin, latent, shared, rd, out);
}

static void cpu_round(k3c_backend *be, float *p, size_t n) {
    flush(be->ctx);
    round_n(be->ctx, p, n);
}

void k3c_backend_cpu_set_exact(k3c_backend *be, int exact) { ((cpu_ctx *)be->ctx)->exact = exact; }

void k3c_backend_cpu_track_route_margins(k3c_backend *be, float *margins, int rows) {
    cpu_ctx *x = be->ctx;
    x->route_margins = margins;
    x->route_margin_rows = margins ? rows : 0;
}

/* Test hook (backend/backend.h): whether backends created from now on offer the expanded MLA op. */
static int cpu_mla_expanded_default = 1;
void k3c_backend_cpu_test_mla_expanded(int on) { cpu_mla_expanded_default = on != 0; }

k3c_backend *k3c_backend_cpu_create(int threads) {
    k3c_backend *be = calloc(1, sizeof *be);
    cpu_ctx *x = calloc(1, sizeof *x);
    if (!be || !x) {
        free(be);
        free(x);
        k3c_errorf_kind(K3C_ERROR_OOM, "cpu backend: out of memory");
        return NULL;
    }
    x->pool = k3c_pool_create(threads);
    if (!x->pool) {
        free(be);
        free(x);
        k3c_errorf_kind(K3C_ERROR_OOM, "cpu backend: cannot create the thread pool (%d threads)", threads);
        return NULL;
    }
    x->threads = k3c_pool_threads(x->pool);
    be->name = "cpu";
    be->ctx = x;
    be->kv_elem_bytes = 4;
    be->init = cpu_init;
    be->destroy = cpu_destroy;
    be->sync = cpu_sync;
    be->alloc = cpu_alloc;
    be->free = cpu_freebuf;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->copy = cpu_copy;
    be->fill_bytes = cpu_fill_bytes;
    be->mem_free = cpu_mem_free;
    be->gather_rows = cpu_gather_rows;
    be->embed = cpu_embed;
    be->matmul = cpu_matmul;
    be->rmsnorm = cpu_rmsnorm;
    be->add = cpu_add;
    be->attnres_mix = cpu_attnres_mix;
    be->gated_act = cpu_gated_act;
    be->sigmoid_mul = cpu_sigmoid_mul;
    be->kda_conv = cpu_kda_conv;
    be->kda_gate = cpu_kda_gate;
    be->kda_qk_norm = cpu_kda_qk_norm;
    be->kda_delta = cpu_kda_delta;
    be->kda_gated_norm = cpu_kda_gated_norm;
    be->mla_cache_write = cpu_mla_cache_write;
    be->mla_attention = cpu_mla_attention;
    be->mla_attention_expanded = cpu_mla_expanded_default ? cpu_mla_attention_expanded : NULL;
    be->mla_absorb = cpu_mla_absorb;
    be->mla_attention_part = cpu_mla_attention_part;
    be->mla_merge = cpu_mla_merge;
    be->moe = cpu_moe;
    be->round = cpu_round;
    be->moe_partial = cpu_moe_partial;
    be->moe_route = cpu_moe_route;
    be->moe_experts = cpu_moe_experts;
    be->moe_combine = cpu_moe_combine;
    return be;
}
