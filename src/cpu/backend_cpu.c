/* The CPU backend: the stock forward's ops (stock/backend.h) over host memory, with the kernels of
 * cpu/ops.h and the thread pool. Buffers are plain malloc'd memory; the MLA cache holds f32 values that are
 * bf16-rounded (kv_elem_bytes = 4). Every op output the contract calls "rounded" is rounded here, after
 * the kernel ran in f32. All scratch is allocated in init() from the limits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "model/model.h"
#include "stock/backend.h"
#include "util/bf16.h"
#include "util/error.h"

typedef struct cpu_ctx {
    k3c_pool *pool;
    int threads;
    const k3c_config *c;
    k3c_backend_limits lim;
    int silu_gate;
    int exact; /* diagnostic: no bf16 rounding anywhere (validates the math against the float64 reference) */
    /* KDA: o of a commit (discarded) */
    float *kda_o;
    /* MLA: q_abs [rows, Hm, lat], o_lat [rows, Hm, kv_lora], gathered latents [max_context, lat] */
    float *q_abs, *o_lat, *lat_rows;
    /* MoE */
    float *logits;     /* [rows, E] */
    int *idx;          /* [rows, k] */
    float *wts;        /* [rows, k] */
    float *z;          /* [rows, Rin] */
    int *pairs;        /* [rows * k] (row * k + j) grouped by expert */
    int *counts;       /* [E + 1] */
    float *xe;         /* [rows, Rin] */
    float *ea, *eu;    /* [rows, F] */
    float *d;          /* [rows * k, Rin] */
    float *r;          /* [rows, Rin] */
    float *rup;        /* [rows, D] */
    float *sa, *su;    /* [rows, Fs] */
    float *sh;         /* [rows, D] */
} cpu_ctx;

/* The rounding of a bf16 store; a no-op in the diagnostic exact mode (k3c_backend_cpu_set_exact). */
static inline float rnd(const cpu_ctx *x, float v) { return x->exact ? v : bf16_round(v); }
static void round_n(const cpu_ctx *x, float *p, size_t n) {
    if (x->exact) return;
    for (size_t i = 0; i < n; i++) p[i] = bf16_round(p[i]);
}

/* ---- lifetime ---- */

static void *xcalloc(size_t n, size_t size, int *bad) {
    if (n == 0) n = 1;
    void *p = calloc(n, size);
    if (!p) *bad = 1;
    return p;
}

static void cpu_free_scratch(cpu_ctx *x) {
    free(x->kda_o); free(x->q_abs); free(x->o_lat); free(x->lat_rows);
    free(x->logits); free(x->idx); free(x->wts); free(x->z); free(x->pairs); free(x->counts);
    free(x->xe); free(x->ea); free(x->eu); free(x->d); free(x->r); free(x->rup);
    free(x->sa); free(x->su); free(x->sh);
}

static int cpu_init(k3c_backend *be, const struct k3c_model *m, const k3c_backend_limits *lim) {
    cpu_ctx *x = be->ctx;
    const k3c_config *c = &m->config;
    x->c = c;
    x->lim = *lim;
    x->silu_gate = k3c_config_kda_silu_gate(c);
    size_t R = (size_t)lim->max_rows, D = c->hidden_size, P = k3c_config_kda_proj(c);
    size_t Hm = c->num_attention_heads, lat = k3c_config_mla_latent(c), kvl = c->kv_lora_rank;
    size_t E = c->num_experts, K = c->num_experts_per_token > 0 ? c->num_experts_per_token : 1;
    size_t Rin = k3c_config_expert_in(c), F = c->moe_intermediate_size, Fs = k3c_config_shared_width(c);
    int bad = 0;
    x->kda_o = xcalloc(R * P, 4, &bad);
    x->q_abs = xcalloc(R * Hm * lat, 4, &bad);
    x->o_lat = xcalloc(R * Hm * kvl, 4, &bad);
    x->lat_rows = xcalloc((size_t)lim->max_context * lat, 4, &bad);
    x->logits = xcalloc(R * E, 4, &bad);
    x->idx = xcalloc(R * K, sizeof(int), &bad);
    x->wts = xcalloc(R * K, 4, &bad);
    x->z = xcalloc(R * Rin, 4, &bad);
    x->pairs = xcalloc(R * K, sizeof(int), &bad);
    x->counts = xcalloc(E + 1, sizeof(int), &bad);
    x->xe = xcalloc(R * Rin, 4, &bad);
    x->ea = xcalloc(R * F, 4, &bad);
    x->eu = xcalloc(R * F, 4, &bad);
    x->d = xcalloc(R * K * Rin, 4, &bad);
    x->r = xcalloc(R * Rin, 4, &bad);
    x->rup = xcalloc(R * D, 4, &bad);
    x->sa = xcalloc(R * Fs, 4, &bad);
    x->su = xcalloc(R * Fs, 4, &bad);
    x->sh = xcalloc(R * D, 4, &bad);
    if (bad) {
        cpu_free_scratch(x);
        memset(&x->kda_o, 0, sizeof *x - offsetof(cpu_ctx, kda_o));
        return k3c_errorf("cpu backend: out of memory for step scratch (max_rows %d, max_context %d)",
                          lim->max_rows, lim->max_context);
    }
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

static int cpu_sync(k3c_backend *be) { return K3C_OK; }

/* ---- memory ---- */

static void *cpu_alloc(k3c_backend *be, size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
        k3c_errorf("cpu backend: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    return p;
}
static void cpu_freebuf(k3c_backend *be, void *p) { free(p); }
static void cpu_copy(k3c_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memmove(dst, src, bytes);
}
static void cpu_fill_bytes(k3c_backend *be, void *dst, int byte, size_t bytes) { memset(dst, byte, bytes); }
static void cpu_gather_rows(k3c_backend *be, const float *src, const int *rows, int n, int D, float *dst) {
    for (int i = 0; i < n; i++) memmove(dst + (size_t)i * D, src + (size_t)rows[i] * D, (size_t)D * 4);
}

/* ---- dense ---- */

static void cpu_embed(k3c_backend *be, const k3c_mat *E, const int32_t *ids, int T, float *out) {
    for (int t = 0; t < T; t++) k3c_bf16_row(E, ids[t], out + (size_t)t * E->cols);
}

static void cpu_matmul(k3c_backend *be, const k3c_mat *W, const float *x, int T, float *y, int round) {
    cpu_ctx *c = be->ctx;
    k3c_matmul_bf16(c->pool, W, x, T, y);
    if (round) round_n(c, y, (size_t)T * W->rows);
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
    norm_job j = {c, x, w, x_stride, y_stride, n, eps, y};
    k3c_pool_for(T > 1 ? c->pool : NULL, T, norm_rows, &j);
}

static void cpu_add(k3c_backend *be, const float *a, const float *b, size_t n, float *out) {
    cpu_ctx *c = be->ctx;
    for (size_t i = 0; i < n; i++) out[i] = rnd(c, a[i] + b[i]);
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
    mix_job j = {c, src, nsrc, D, proj, norm, eps, out};
    k3c_pool_for(T > 1 ? c->pool : NULL, T, mix_rows, &j);
}

static void cpu_gated_act(k3c_backend *be, const float *gate, const float *up, size_t n, float *out) {
    cpu_ctx *c = be->ctx;
    k3c_gated_act(c->c, gate, up, (int)n, out);
    round_n(c, out, n);
}

static void cpu_sigmoid_mul(k3c_backend *be, float *x, const float *g, size_t n) {
    cpu_ctx *c = be->ctx;
    for (size_t i = 0; i < n; i++) x[i] = rnd(c, x[i] * k3c_sigmoidf(g[i]));
}

/* ---- KDA ---- */

static void cpu_kda_conv(k3c_backend *be, const float *x, const float *taps, int which, const k3c_seg *segs,
                         int nseg, float *out) {
    cpu_ctx *c = be->ctx;
    int P = k3c_config_kda_proj(c->c), W = c->c->kda_conv_kernel;
    for (int s = 0; s < nseg; s++) {
        const k3c_seg *g = &segs[s];
        if (g->n <= 0) continue;
        float *o = out + (size_t)g->row0 * P;
        k3c_kda_conv(x + (size_t)g->row0 * P, g->n, P, W, taps, g->window + (size_t)which * (W - 1) * P, o);
        round_n(c, o, (size_t)g->n * P);
    }
}

static void cpu_kda_gate(k3c_backend *be, const float *f, const float *b, const float *a_log, const float *dt_bias,
                         int T, float *g, float *beta) {
    cpu_ctx *c = be->ctx;
    k3c_kda_gate(c->c, a_log, dt_bias, f, T, g);
    size_t n = (size_t)T * c->c->kda_num_heads;
    for (size_t i = 0; i < n; i++) beta[i] = k3c_sigmoidf(b[i]);
}

static void cpu_kda_qk_norm(k3c_backend *be, float *q, float *k, int T) {
    cpu_ctx *c = be->ctx;
    k3c_kda_qk_norm(q, k, T, c->c->kda_num_heads, c->c->kda_head_dim);
}

typedef struct delta_job {
    cpu_ctx *c;
    const float *q, *k, *v, *g, *beta;
    const k3c_seg *segs;
    float *o;
} delta_job;

static void delta_segs(void *ctx, int b, int e) {
    delta_job *j = ctx;
    const k3c_config *c = j->c->c;
    int H = c->kda_num_heads, dk = c->kda_head_dim, P = H * dk;
    for (int s = b; s < e; s++) {
        const k3c_seg *sg = &j->segs[s];
        if (sg->n <= 0) continue;
        size_t off = (size_t)sg->row0 * P;
        float *o = j->o + off;
        if (sg->chunked)
            k3c_kda_chunked(sg->state, j->q + off, j->k + off, j->v + off, j->g + off, j->beta + (size_t)sg->row0 * H,
                            sg->n, H, dk, dk, 64, o);
        else
            k3c_kda_recurrent(sg->state, j->q + off, j->k + off, j->v + off, j->g + off,
                              j->beta + (size_t)sg->row0 * H, sg->n, H, dk, dk, o, NULL);
        round_n(j->c, o, (size_t)sg->n * P);
    }
}

static void cpu_kda_delta(k3c_backend *be, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, const k3c_seg *segs, int nseg, float *o) {
    cpu_ctx *c = be->ctx;
    delta_job j = {c, q, k, v, g, beta, segs, o ? o : c->kda_o};
    k3c_pool_for(nseg > 1 ? c->pool : NULL, nseg, delta_segs, &j);
}

static void cpu_kda_gated_norm(k3c_backend *be, const float *o, const float *z, const float *w, int T, float *y) {
    cpu_ctx *c = be->ctx;
    int H = c->c->kda_num_heads, dv = c->c->kda_head_dim;
    k3c_kda_gated_norm(o, z, w, T, H, dv, c->c->rms_norm_eps, c->silu_gate, y);
    round_n(c, y, (size_t)T * H * dv);
}

/* ---- MLA ---- */

static void cpu_mla_cache_write(k3c_backend *be, const float *lat, const k3c_seg *segs, int nseg, void *cache) {
    cpu_ctx *c = be->ctx;
    int L = k3c_config_mla_latent(c->c), bs = c->lim.block_size;
    float *cf = cache;
    for (int s = 0; s < nseg; s++) {
        const k3c_seg *g = &segs[s];
        for (int i = 0; i < g->n; i++) {
            int p = g->pos + i;
            size_t slot = (size_t)g->block_table[p / bs] * bs + p % bs;
            memcpy(cf + slot * L, lat + (size_t)(g->row0 + i) * L, (size_t)L * 4);
        }
    }
}

typedef struct absorb_job {
    const cpu_ctx *x;
    const k3c_config *c;
    const k3c_mla_weights *w;
    const float *in;  /* q [T, Hm*(nope+rope)] or o_lat [T, Hm, kv_lora] */
    float *out;       /* q_abs [T, Hm, lat] or o [T, Hm*v] */
} absorb_job;

/* q_abs[t,h] = [W_UK[h]^T q_nope[t,h] | q_pe[t,h]]; W_UK[h] = kv_b rows h*(nope+v) .. + nope. */
static void absorb_q(void *ctx, int b, int e) {
    absorb_job *j = ctx;
    const k3c_config *c = j->c;
    int Hm = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int kvl = c->kv_lora_rank, vh = c->v_head_dim, qh = nope + rope, lat = kvl + rope;
    const uint16_t *kvb = j->w->kv_b.w;
    float acc[kvl];
    for (int th = b; th < e; th++) {
        int t = th / Hm, h = th % Hm;
        const float *q = j->in + (size_t)t * Hm * qh + (size_t)h * qh;
        float *out = j->out + ((size_t)t * Hm + h) * lat;
        memset(acc, 0, sizeof acc);
        for (int i = 0; i < nope; i++) {
            const uint16_t *row = kvb + ((size_t)h * (nope + vh) + i) * kvl;
            float qi = q[i];
            for (int cc = 0; cc < kvl; cc++) acc[cc] += qi * bf16_to_f32(row[cc]);
        }
        memcpy(out, acc, sizeof acc);
        memcpy(out + kvl, q + nope, (size_t)rope * 4);
    }
}

/* o[t,h,e] = sum_c W_UV[h][e][c] o_lat[t,h,c]; W_UV[h] = kv_b rows h*(nope+v) + nope .. + v; rounded. */
static void absorb_o(void *ctx, int b, int e) {
    absorb_job *j = ctx;
    const k3c_config *c = j->c;
    int Hm = c->num_attention_heads, nope = c->qk_nope_head_dim, kvl = c->kv_lora_rank, vh = c->v_head_dim;
    const uint16_t *kvb = j->w->kv_b.w;
    for (int th = b; th < e; th++) {
        int t = th / Hm, h = th % Hm;
        const float *ol = j->in + ((size_t)t * Hm + h) * kvl;
        float *o = j->out + (size_t)t * Hm * vh + (size_t)h * vh;
        for (int ee = 0; ee < vh; ee++) {
            const uint16_t *row = kvb + ((size_t)h * (nope + vh) + nope + ee) * kvl;
            float acc = 0;
            for (int cc = 0; cc < kvl; cc++) acc += bf16_to_f32(row[cc]) * ol[cc];
            o[ee] = rnd(j->x, acc);
        }
    }
}

static void cpu_mla_attention(k3c_backend *be, const k3c_mla_weights *w, const float *q, const k3c_seg *segs,
                              int nseg, const void *cache, float *o) {
    cpu_ctx *x = be->ctx;
    const k3c_config *c = x->c;
    int Hm = c->num_attention_heads, kvl = c->kv_lora_rank, rope = c->qk_rope_head_dim, lat = kvl + rope;
    int bs = x->lim.block_size;
    int T = 0;
    for (int s = 0; s < nseg; s++)
        if (segs[s].row0 + segs[s].n > T) T = segs[s].row0 + segs[s].n;
    absorb_job aj = {x, c, w, q, x->q_abs};
    k3c_pool_for(x->pool, T * Hm, absorb_q, &aj);
    float scale = 1.0f / sqrtf((float)(c->qk_nope_head_dim + rope));
    const float *cf = cache;
    for (int s = 0; s < nseg; s++) {
        const k3c_seg *g = &segs[s];
        if (g->n <= 0) continue;
        int len = g->pos + g->n;
        for (int p = 0; p < len; p++) {
            size_t slot = (size_t)g->block_table[p / bs] * bs + p % bs;
            memcpy(x->lat_rows + (size_t)p * lat, cf + slot * lat, (size_t)lat * 4);
        }
        k3c_mla_attend(x->q_abs + (size_t)g->row0 * Hm * lat, g->n, Hm, kvl, rope, x->lat_rows, g->pos, scale,
                       x->o_lat + (size_t)g->row0 * Hm * kvl);
    }
    absorb_job oj = {x, c, w, x->o_lat, o};
    k3c_pool_for(x->pool, T * Hm, absorb_o, &oj);
}

/* ---- MoE ---- */

static void expert_mm(cpu_ctx *x, const k3c_mat *Wb, const k3c_mxfp4_mat *Wq, const float *in, int n, float *out) {
    if (x->c->expert_format == K3C_EXPERTS_MXFP4) {
        k3c_matmul_mxfp4(x->pool, Wq, in, n, out);
        round_n(x, out, (size_t)n * Wq->rows);
    } else {
        k3c_matmul_bf16(x->pool, Wb, in, n, out);
        round_n(x, out, (size_t)n * Wb->rows);
    }
}

static void cpu_moe(k3c_backend *be, const k3c_moe_weights *w, const float *y, int T, float *out) {
    cpu_ctx *x = be->ctx;
    const k3c_config *c = x->c;
    int D = c->hidden_size, E = c->num_experts, K = c->num_experts_per_token;
    int Rin = k3c_config_expert_in(c), F = c->moe_intermediate_size;

    /* router: f32 logits from the rounded y */
    k3c_matmul_bf16(x->pool, &w->router, y, T, x->logits);
    for (int t = 0; t < T; t++)
        k3c_route(c, x->logits + (size_t)t * E, w->correction_bias, x->idx + (size_t)t * K, x->wts + (size_t)t * K);

    const float *z = y;
    if (c->routed_expert_hidden_size > 0) {
        k3c_matmul_bf16(x->pool, &w->latent_down, y, T, x->z);
        round_n(x, x->z, (size_t)T * Rin);
        z = x->z;
    }

    /* group (row, j) pairs by expert (counting sort keeps row order inside an expert) */
    memset(x->counts, 0, sizeof(int) * (E + 1));
    for (int i = 0; i < T * K; i++) x->counts[x->idx[i] + 1]++;
    for (int e = 0; e < E; e++) x->counts[e + 1] += x->counts[e];
    {
        /* reuse counts as cursors: fill then shift back */
        for (int i = 0; i < T * K; i++) x->pairs[x->counts[x->idx[i]]++] = i;
        for (int e = E; e > 0; e--) x->counts[e] = x->counts[e - 1];
        x->counts[0] = 0;
    }
    for (int e = 0; e < E; e++) {
        int b = x->counts[e], n = x->counts[e + 1] - b;
        if (n == 0) continue;
        for (int i = 0; i < n; i++)
            memcpy(x->xe + (size_t)i * Rin, z + (size_t)(x->pairs[b + i] / K) * Rin, (size_t)Rin * 4);
        const k3c_expert *ex = &w->experts[e];
        expert_mm(x, &ex->w1, &ex->q1, x->xe, n, x->ea);
        expert_mm(x, &ex->w3, &ex->q3, x->xe, n, x->eu);
        k3c_gated_act(c, x->ea, x->eu, n * F, x->ea);
        round_n(x, x->ea, (size_t)n * F);
        expert_mm(x, &ex->w2, &ex->q2, x->ea, n, x->xe); /* xe reused: [n, Rin] */
        for (int i = 0; i < n; i++)
            memcpy(x->d + (size_t)x->pairs[b + i] * Rin, x->xe + (size_t)i * Rin, (size_t)Rin * 4);
    }
    /* weighted sum in j order */
    for (int t = 0; t < T; t++) {
        float *r = x->r + (size_t)t * Rin;
        for (int i = 0; i < Rin; i++) {
            float acc = 0;
            for (int j = 0; j < K; j++) acc += x->wts[t * K + j] * x->d[((size_t)t * K + j) * Rin + i];
            r[i] = rnd(x, acc);
        }
    }
    const float *routed = x->r;
    if (c->routed_expert_hidden_size > 0) {
        if (c->latent_moe_use_norm) {
            norm_job j = {x, x->r, w->latent_norm, Rin, Rin, Rin, c->rms_norm_eps, x->r};
            k3c_pool_for(T > 1 ? x->pool : NULL, T, norm_rows, &j);
        }
        k3c_matmul_bf16(x->pool, &w->latent_up, x->r, T, x->rup);
        round_n(x, x->rup, (size_t)T * D);
        routed = x->rup;
    }
    if (w->shared.gate.w) {
        int Fs = w->shared.gate.rows;
        k3c_matmul_bf16(x->pool, &w->shared.gate, y, T, x->sa);
        round_n(x, x->sa, (size_t)T * Fs);
        k3c_matmul_bf16(x->pool, &w->shared.up, y, T, x->su);
        round_n(x, x->su, (size_t)T * Fs);
        k3c_gated_act(c, x->sa, x->su, T * Fs, x->sa);
        round_n(x, x->sa, (size_t)T * Fs);
        k3c_matmul_bf16(x->pool, &w->shared.down, x->sa, T, x->sh);
        for (size_t i = 0; i < (size_t)T * D; i++) out[i] = rnd(x, routed[i] + rnd(x, x->sh[i]));
    } else {
        memmove(out, routed, (size_t)T * D * 4);
    }
}

void k3c_backend_cpu_set_exact(k3c_backend *be, int exact) { ((cpu_ctx *)be->ctx)->exact = exact; }

k3c_backend *k3c_backend_cpu_create(int threads) {
    k3c_backend *be = calloc(1, sizeof *be);
    cpu_ctx *x = calloc(1, sizeof *x);
    if (!be || !x) {
        free(be);
        free(x);
        k3c_errorf("cpu backend: out of memory");
        return NULL;
    }
    x->pool = k3c_pool_create(threads);
    if (!x->pool) {
        free(be);
        free(x);
        k3c_errorf("cpu backend: cannot create the thread pool (%d threads)", threads);
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
    be->moe = cpu_moe;
    return be;
}
