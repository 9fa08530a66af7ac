/* Independent float64 reference forward; see ref_forward.h. Written from the published
 * architecture, sharing no math with the engine. Layout conventions: activations are row-major [n tokens][width]
 * doubles; weight matrices stay in the mapped checkpoint and are converted to double one row at a time. */
#include "ref_forward.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/checkpoint.h"
#include "format/config_json.h"
#include "format/mxfp4.h"
#include "util/error.h"

/* ------------------------------------------------------------------------------------------------ */
/* element conversion (own code: the reference does not borrow the engine's helpers)                  */

static double bf16_bits_to_double(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double f16_bits_to_double(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0) v = ldexp(man, -24);
    else if (exp == 31) v = man ? NAN : INFINITY;
    else v = ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

/* A weight matrix [rows = out, cols = in] viewed in the mapped checkpoint. dtype U8 means MXFP4 (data =
 * packed [rows, cols/2], scale = E8M0 [rows, cols/32]). */
typedef struct rw {
    const void *data;
    const uint8_t *scale;
    k3c_dtype dtype;
    int rows, cols;
} rw;

/* Row r of w as doubles; tmp holds cols floats (MXFP4 dequantization). */
static void rw_row(const rw *w, int r, double *out, float *tmp) {
    size_t off = (size_t)r * (size_t)w->cols;
    int c, n = w->cols;
    switch (w->dtype) {
    case K3C_DTYPE_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + off;
        for (c = 0; c < n; c++) out[c] = bf16_bits_to_double(p[c]);
        break;
    }
    case K3C_DTYPE_F16: {
        const uint16_t *p = (const uint16_t *)w->data + off;
        for (c = 0; c < n; c++) out[c] = f16_bits_to_double(p[c]);
        break;
    }
    case K3C_DTYPE_F32: {
        const float *p = (const float *)w->data + off;
        for (c = 0; c < n; c++) out[c] = p[c];
        break;
    }
    case K3C_DTYPE_F64: {
        const double *p = (const double *)w->data + off;
        for (c = 0; c < n; c++) out[c] = p[c];
        break;
    }
    case K3C_DTYPE_U8: {
        const uint8_t *pk = (const uint8_t *)w->data + (size_t)r * (size_t)(n / 2);
        const uint8_t *sc = w->scale + (size_t)r * (size_t)(n / K3C_MXFP4_GROUP);
        k3c_mxfp4_dequant_row(pk, sc, n, tmp);
        for (c = 0; c < n; c++) out[c] = tmp[c];
        break;
    }
    default:
        for (c = 0; c < n; c++) out[c] = NAN;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* model                                                                                              */

typedef struct ref_layer {
    k3c_attn_kind kind;
    int moe;
    double *in_norm, *post_norm;          /* [D] */
    double *ares_w, *ares_n, *mres_w, *mres_n; /* AttnRes pseudo-queries and norms [D] (K3) */

    /* KDA */
    rw q, k, v, fa, fb, b, g, ga, gb, o;
    double *qconv, *kconv, *vconv; /* [P, W] */
    double *a_log;                 /* [H] */
    double *dt_bias;               /* [P] */
    double *onorm;                 /* [dk] */

    /* MLA (o and g shared with the KDA fields above: same checkpoint names) */
    rw mq, qa, qb, kva, kvb;
    double *qa_norm, *kva_norm;

    /* FFN: dense MLP, or the shared experts of a MoE layer */
    rw gate, up, down;
    int has_mlp;
    /* MoE */
    rw router;
    double *bias; /* [E] or NULL */
    rw rdown, rup;
    double *rnorm; /* [R] or NULL */
    rw *experts;   /* [E][3]: w1 (gate), w2 (down), w3 (up) */
} ref_layer;

struct ref_model {
    k3c_config cfg;
    int have_cfg;
    k3c_checkpoint ck;
    int have_ck;
    const char *prefix;
    char dir[1024];
    rw embed, lm_head;
    double *final_norm;
    double *ores_w, *ores_n;
    ref_layer *layers;
    long *route_counts; /* [L * E] selections per layer and expert, when a test asked for them */
    double (*latent_round)(double); /* applied to every cached MLA latent value when set (a cache format) */
};

void ref_count_routes(ref_model *m, long *counts) { m->route_counts = counts; }
void ref_set_latent_round(ref_model *m, double (*round_fn)(double)) { m->latent_round = round_fn; }

const k3c_config *ref_model_config(const ref_model *m) { return &m->cfg; }

static int is_float_dtype(k3c_dtype t) {
    return t == K3C_DTYPE_BF16 || t == K3C_DTYPE_F16 || t == K3C_DTYPE_F32 || t == K3C_DTYPE_F64;
}

static const k3c_st_tensor *lookup(ref_model *m, char *name, size_t cap, const char *fmt, va_list ap) {
    int len = snprintf(name, cap, "%s", m->prefix);
    vsnprintf(name + len, cap - (size_t)len, fmt, ap);
    return k3c_checkpoint_find(&m->ck, name);
}

static const k3c_st_tensor *find_opt(ref_model *m, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    const k3c_st_tensor *t = lookup(m, name, sizeof name, fmt, ap);
    va_end(ap);
    return t;
}

/* A float matrix [rows, cols] (2-D, exact shape). */
static int bind_mat(ref_model *m, rw *w, int rows, int cols, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    const k3c_st_tensor *t = lookup(m, name, sizeof name, fmt, ap);
    va_end(ap);
    if (!t) return k3c_errorf("ref: %s: tensor %s missing", m->dir, name);
    if (!is_float_dtype(t->dtype))
        return k3c_errorf("ref: tensor %s: expected a float dtype, got %s", name, k3c_dtype_name(t->dtype));
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return k3c_errorf("ref: tensor %s: expected shape [%d, %d], got ndim %d [%lld, %lld]", name, rows, cols,
                          t->ndim, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : -1));
    *w = (rw){.data = t->data, .scale = NULL, .dtype = t->dtype, .rows = rows, .cols = cols};
    return K3C_OK;
}

/* A float tensor read into a new double array of n values: numel must equal n (any shape), or be at
 * least n when min_only (A_log padding: the first n entries are used). */
static int bind_vec(ref_model *m, double **out, int n, int min_only, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    const k3c_st_tensor *t = lookup(m, name, sizeof name, fmt, ap);
    va_end(ap);
    if (!t) return k3c_errorf("ref: %s: tensor %s missing", m->dir, name);
    if (!is_float_dtype(t->dtype))
        return k3c_errorf("ref: tensor %s: expected a float dtype, got %s", name, k3c_dtype_name(t->dtype));
    uint64_t numel = k3c_st_numel(t);
    if (min_only ? numel < (uint64_t)n : numel != (uint64_t)n)
        return k3c_errorf("ref: tensor %s: expected %s%d elements, got %llu", name, min_only ? "at least " : "", n,
                          (unsigned long long)numel);
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) return k3c_errorf("ref: out of memory reading %s", name);
    rw tmp = {.data = t->data, .dtype = t->dtype, .rows = 1, .cols = n};
    rw_row(&tmp, 0, v, NULL);
    *out = v;
    return K3C_OK;
}

/* An MXFP4 matrix: NAME.weight_packed U8 [rows, cols/2] and NAME.weight_scale U8 [rows, cols/32]. */
static int bind_mxfp4(ref_model *m, rw *w, int rows, int cols, const char *fmt, ...) {
    char base[512], name[600];
    va_list ap;
    va_start(ap, fmt);
    int len = snprintf(base, sizeof base, "%s", m->prefix);
    vsnprintf(base + len, sizeof base - (size_t)len, fmt, ap);
    va_end(ap);
    if (cols % K3C_MXFP4_GROUP != 0)
        return k3c_errorf("ref: %s: MXFP4 needs in-features %% %d == 0, got %d", base, K3C_MXFP4_GROUP, cols);
    snprintf(name, sizeof name, "%s.weight_packed", base);
    const k3c_st_tensor *p = k3c_checkpoint_find(&m->ck, name);
    snprintf(name, sizeof name, "%s.weight_scale", base);
    const k3c_st_tensor *s = k3c_checkpoint_find(&m->ck, name);
    if (!p || !s) return k3c_errorf("ref: %s: tensor %s.weight_%s missing", m->dir, base, p ? "scale" : "packed");
    if (p->dtype != K3C_DTYPE_U8 || p->ndim != 2 || p->shape[0] != rows || p->shape[1] != cols / 2)
        return k3c_errorf("ref: tensor %s.weight_packed: expected U8 [%d, %d]", base, rows, cols / 2);
    if (s->dtype != K3C_DTYPE_U8 || s->ndim != 2 || s->shape[0] != rows || s->shape[1] != cols / K3C_MXFP4_GROUP)
        return k3c_errorf("ref: tensor %s.weight_scale: expected U8 [%d, %d]", base, rows, cols / K3C_MXFP4_GROUP);
    *w = (rw){.data = p->data, .scale = s->data, .dtype = K3C_DTYPE_U8, .rows = rows, .cols = cols};
    return K3C_OK;
}

static int bind_layer(ref_model *m, int l) {
    const k3c_config *c = &m->cfg;
    ref_layer *L = &m->layers[l];
    int D = c->hidden_size;
    L->kind = c->layer_attn[l];
    L->moe = c->layer_is_moe[l];
    const char *lp = "model.layers.";

    K3C_TRY(bind_vec(m, &L->in_norm, D, 0, "%s%d.input_layernorm.weight", lp, l));
    K3C_TRY(bind_vec(m, &L->post_norm, D, 0, "%s%d.post_attention_layernorm.weight", lp, l));
    if (c->attn_res_block_size > 0) {
        K3C_TRY(bind_vec(m, &L->ares_w, D, 0, "%s%d.self_attention_res_proj.weight", lp, l));
        K3C_TRY(bind_vec(m, &L->ares_n, D, 0, "%s%d.self_attention_res_norm.weight", lp, l));
        K3C_TRY(bind_vec(m, &L->mres_w, D, 0, "%s%d.mlp_res_proj.weight", lp, l));
        K3C_TRY(bind_vec(m, &L->mres_n, D, 0, "%s%d.mlp_res_norm.weight", lp, l));
    }

    if (L->kind == K3C_ATTN_KDA) {
        int H = c->kda_num_heads, dk = c->kda_head_dim, P = H * dk, W = c->kda_conv_kernel;
        const char *a = "self_attn.";
        K3C_TRY(bind_mat(m, &L->q, P, D, "%s%d.%sq_proj.weight", lp, l, a));
        K3C_TRY(bind_mat(m, &L->k, P, D, "%s%d.%sk_proj.weight", lp, l, a));
        K3C_TRY(bind_mat(m, &L->v, P, D, "%s%d.%sv_proj.weight", lp, l, a));
        K3C_TRY(bind_vec(m, &L->qconv, P * W, 0, "%s%d.%sq_conv1d.weight", lp, l, a));
        K3C_TRY(bind_vec(m, &L->kconv, P * W, 0, "%s%d.%sk_conv1d.weight", lp, l, a));
        K3C_TRY(bind_vec(m, &L->vconv, P * W, 0, "%s%d.%sv_conv1d.weight", lp, l, a));
        K3C_TRY(bind_mat(m, &L->fa, dk, D, "%s%d.%sf_a_proj.weight", lp, l, a));
        K3C_TRY(bind_mat(m, &L->fb, P, dk, "%s%d.%sf_b_proj.weight", lp, l, a));
        K3C_TRY(bind_mat(m, &L->b, H, D, "%s%d.%sb_proj.weight", lp, l, a));
        K3C_TRY(bind_vec(m, &L->a_log, H, c->kda_a_log_padded, "%s%d.%sA_log", lp, l, a));
        K3C_TRY(bind_vec(m, &L->dt_bias, P, 0, "%s%d.%sdt_bias", lp, l, a));
        K3C_TRY(bind_vec(m, &L->onorm, dk, 0, "%s%d.%so_norm.weight", lp, l, a));
        if (c->kda_full_rank_gate) {
            K3C_TRY(bind_mat(m, &L->g, P, D, "%s%d.%sg_proj.weight", lp, l, a));
        } else {
            K3C_TRY(bind_mat(m, &L->ga, dk, D, "%s%d.%sg_a_proj.weight", lp, l, a));
            K3C_TRY(bind_mat(m, &L->gb, P, dk, "%s%d.%sg_b_proj.weight", lp, l, a));
        }
        K3C_TRY(bind_mat(m, &L->o, D, P, "%s%d.%so_proj.weight", lp, l, a));
    } else {
        int Hm = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
        int vd = c->v_head_dim, R = c->kv_lora_rank, qd = Hm * (nope + rope);
        const char *a = "self_attn.";
        if (c->q_lora_rank > 0) {
            K3C_TRY(bind_mat(m, &L->qa, c->q_lora_rank, D, "%s%d.%sq_a_proj.weight", lp, l, a));
            K3C_TRY(bind_vec(m, &L->qa_norm, c->q_lora_rank, 0, "%s%d.%sq_a_layernorm.weight", lp, l, a));
            K3C_TRY(bind_mat(m, &L->qb, qd, c->q_lora_rank, "%s%d.%sq_b_proj.weight", lp, l, a));
        } else {
            K3C_TRY(bind_mat(m, &L->mq, qd, D, "%s%d.%sq_proj.weight", lp, l, a));
        }
        K3C_TRY(bind_mat(m, &L->kva, R + rope, D, "%s%d.%skv_a_proj_with_mqa.weight", lp, l, a));
        K3C_TRY(bind_vec(m, &L->kva_norm, R, 0, "%s%d.%skv_a_layernorm.weight", lp, l, a));
        K3C_TRY(bind_mat(m, &L->kvb, Hm * (nope + vd), R, "%s%d.%skv_b_proj.weight", lp, l, a));
        if (c->mla_use_output_gate) K3C_TRY(bind_mat(m, &L->g, Hm * vd, D, "%s%d.%sg_proj.weight", lp, l, a));
        K3C_TRY(bind_mat(m, &L->o, D, Hm * vd, "%s%d.%so_proj.weight", lp, l, a));
    }

    if (!L->moe) {
        /* K3 names the dense MLP mlp.*, transformers' Kimi Linear block_sparse_moe.* (sic). */
        const char *mod = find_opt(m, "%s%d.mlp.gate_proj.weight", lp, l) ? "mlp" : "block_sparse_moe";
        int I = c->intermediate_size;
        K3C_TRY(bind_mat(m, &L->gate, I, D, "%s%d.%s.gate_proj.weight", lp, l, mod));
        K3C_TRY(bind_mat(m, &L->up, I, D, "%s%d.%s.up_proj.weight", lp, l, mod));
        K3C_TRY(bind_mat(m, &L->down, D, I, "%s%d.%s.down_proj.weight", lp, l, mod));
        L->has_mlp = 1;
        return K3C_OK;
    }

    int E = c->num_experts, F = c->moe_intermediate_size, R = c->routed_expert_hidden_size;
    int X = R > 0 ? R : D;
    const char *mo = "block_sparse_moe.";
    K3C_TRY(bind_mat(m, &L->router, E, D, "%s%d.%sgate.weight", lp, l, mo));
    if (c->use_correction_bias)
        K3C_TRY(bind_vec(m, &L->bias, E, 0, "%s%d.%sgate.e_score_correction_bias", lp, l, mo));
    if (R > 0) {
        K3C_TRY(bind_mat(m, &L->rdown, R, D, "%s%d.%srouted_expert_down_proj.weight", lp, l, mo));
        K3C_TRY(bind_mat(m, &L->rup, D, R, "%s%d.%srouted_expert_up_proj.weight", lp, l, mo));
        if (c->latent_moe_use_norm)
            K3C_TRY(bind_vec(m, &L->rnorm, R, 0, "%s%d.%srouted_expert_norm.weight", lp, l, mo));
    }
    if (c->num_shared_experts > 0) {
        int S = c->num_shared_experts * F;
        K3C_TRY(bind_mat(m, &L->gate, S, D, "%s%d.%sshared_experts.gate_proj.weight", lp, l, mo));
        K3C_TRY(bind_mat(m, &L->up, S, D, "%s%d.%sshared_experts.up_proj.weight", lp, l, mo));
        K3C_TRY(bind_mat(m, &L->down, D, S, "%s%d.%sshared_experts.down_proj.weight", lp, l, mo));
        L->has_mlp = 1;
    }
    L->experts = calloc((size_t)E * 3, sizeof *L->experts);
    if (!L->experts) return k3c_errorf("ref: out of memory (layer %d experts)", l);
    for (int e = 0; e < E; e++) {
        rw *x = &L->experts[(size_t)e * 3];
        if (c->expert_format == K3C_EXPERTS_MXFP4) {
            if (c->mxfp4_group_size != K3C_MXFP4_GROUP)
                return k3c_errorf("ref: mxfp4_group_size %d unsupported (expected %d)", c->mxfp4_group_size,
                                  K3C_MXFP4_GROUP);
            K3C_TRY(bind_mxfp4(m, &x[0], F, X, "%s%d.%sexperts.%d.w1", lp, l, mo, e));
            K3C_TRY(bind_mxfp4(m, &x[1], X, F, "%s%d.%sexperts.%d.w2", lp, l, mo, e));
            K3C_TRY(bind_mxfp4(m, &x[2], F, X, "%s%d.%sexperts.%d.w3", lp, l, mo, e));
        } else {
            K3C_TRY(bind_mat(m, &x[0], F, X, "%s%d.%sexperts.%d.w1.weight", lp, l, mo, e));
            K3C_TRY(bind_mat(m, &x[1], X, F, "%s%d.%sexperts.%d.w2.weight", lp, l, mo, e));
            K3C_TRY(bind_mat(m, &x[2], F, X, "%s%d.%sexperts.%d.w3.weight", lp, l, mo, e));
        }
    }
    return K3C_OK;
}

static void free_layer(ref_layer *L) {
    double **vs[] = {&L->in_norm, &L->post_norm, &L->ares_w, &L->ares_n, &L->mres_w, &L->mres_n,
                     &L->qconv,   &L->kconv,     &L->vconv,  &L->a_log,  &L->dt_bias, &L->onorm,
                     &L->qa_norm, &L->kva_norm,  &L->bias,   &L->rnorm};
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) free(*vs[i]);
    free(L->experts);
}

void ref_model_free(ref_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.num_layers; l++) free_layer(&m->layers[l]);
        free(m->layers);
    }
    free(m->final_norm);
    free(m->ores_w);
    free(m->ores_n);
    if (m->have_ck) k3c_checkpoint_close(&m->ck);
    if (m->have_cfg) k3c_config_free(&m->cfg);
    free(m);
}

static int model_bind(ref_model *m) {
    const k3c_config *c = &m->cfg;
    int D = c->hidden_size, V = c->vocab_size;
    if (c->attn_res_block_size < 0 || D <= 0 || V <= 0 || c->num_layers <= 0)
        return k3c_errorf("ref: %s: bad config dims", m->dir);
    K3C_TRY(bind_mat(m, &m->embed, V, D, "model.embed_tokens.weight"));
    if (!c->tie_word_embeddings && find_opt(m, "lm_head.weight"))
        K3C_TRY(bind_mat(m, &m->lm_head, V, D, "lm_head.weight"));
    else if (!c->tie_word_embeddings)
        return k3c_errorf("ref: %s: tensor %slm_head.weight missing (tie_word_embeddings is false)", m->dir, m->prefix);
    else
        m->lm_head = m->embed;
    K3C_TRY(bind_vec(m, &m->final_norm, D, 0, "model.norm.weight"));
    if (c->attn_res_block_size > 0) {
        K3C_TRY(bind_vec(m, &m->ores_w, D, 0, "model.output_attn_res_proj.weight"));
        K3C_TRY(bind_vec(m, &m->ores_n, D, 0, "model.output_attn_res_norm.weight"));
    }
    m->layers = calloc((size_t)c->num_layers, sizeof *m->layers);
    if (!m->layers) return k3c_errorf("ref: out of memory");
    for (int l = 0; l < c->num_layers; l++) K3C_TRY(bind_layer(m, l));
    return K3C_OK;
}

int ref_model_open(const char *dir, ref_model **out) {
    *out = NULL;
    ref_model *m = calloc(1, sizeof *m);
    if (!m) return k3c_errorf("ref: out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (k3c_config_load(path, &m->cfg) != K3C_OK) {
        ref_model_free(m);
        return k3c_error_context("ref: %s", path);
    }
    m->have_cfg = 1;
    if (k3c_checkpoint_open(&m->ck, dir) != K3C_OK) {
        ref_model_free(m);
        return k3c_error_context("ref: checkpoint %s", dir);
    }
    m->have_ck = 1;
    m->prefix = m->cfg.family == K3C_FAMILY_K3 ? "language_model." : "";
    if (model_bind(m) != K3C_OK) {
        ref_model_free(m);
        return K3C_ERR;
    }
    *out = m;
    return K3C_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* math                                                                                               */

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x / (1.0 + exp(-x)); }

/* y[t, r] = sum_c W[r, c] x[t, c] for t < n: each weight row is converted once and dotted with every token. */
static int linear(const rw *w, const double *x, int n, double *y) {
    double *row = malloc((size_t)w->cols * sizeof *row);
    float *tmp = malloc((size_t)w->cols * sizeof *tmp);
    if (!row || !tmp) {
        free(row);
        free(tmp);
        return k3c_errorf("ref: out of memory (linear %dx%d)", w->rows, w->cols);
    }
    for (int r = 0; r < w->rows; r++) {
        rw_row(w, r, row, tmp);
        for (int t = 0; t < n; t++) {
            const double *xt = x + (size_t)t * (size_t)w->cols;
            double s = 0;
            for (int c = 0; c < w->cols; c++) s += row[c] * xt[c];
            y[(size_t)t * (size_t)w->rows + (size_t)r] = s;
        }
    }
    free(row);
    free(tmp);
    return K3C_OK;
}

/* y = x / sqrt(mean(x^2) + eps) * w   (w NULL: no weight). y may alias x. */
static void rmsnorm(const double *x, const double *w, int d, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < d; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++) y[i] = x[i] * r * (w ? w[i] : 1.0);
}

static void rmsnorm_rows(const double *x, const double *w, int n, int d, double eps, double *y) {
    for (int t = 0; t < n; t++) rmsnorm(x + (size_t)t * d, w, d, eps, y + (size_t)t * d);
}

/* Gated-MLP activation (§5.1 / §10): out = act(g, u) element-wise. */
static void gated_act(const k3c_config *c, const double *g, const double *u, size_t len, double *out) {
    for (size_t i = 0; i < len; i++) {
        if (c->hidden_act == K3C_ACT_SITU) {
            double b = c->situ_beta, bl = c->situ_linear_beta;
            double gg = b * tanh(g[i] / b) * sigmoid(g[i]);
            double uu = bl > 0 ? bl * tanh(u[i] / bl) : u[i];
            out[i] = gg * uu;
        } else {
            out[i] = silu(g[i]) * u[i];
        }
    }
}

void ref_attnres_mix(const double *const *sources, int num_sources, const double *w, const double *n, int dim,
                     double eps, double *out) {
    double s[num_sources > 0 ? num_sources : 1], mx = -INFINITY;
    for (int j = 0; j < num_sources; j++) {
        const double *v = sources[j];
        double ss = 0, dot = 0;
        for (int d = 0; d < dim; d++) {
            ss += v[d] * v[d];
            dot += v[d] * n[d] * w[d];
        }
        s[j] = dot / sqrt(ss / dim + eps);
        if (s[j] > mx) mx = s[j];
    }
    double z = 0;
    for (int j = 0; j < num_sources; j++) z += (s[j] = exp(s[j] - mx));
    for (int d = 0; d < dim; d++) out[d] = 0;
    for (int j = 0; j < num_sources; j++) {
        double a = s[j] / z;
        for (int d = 0; d < dim; d++) out[d] += a * sources[j][d];
    }
}

void ref_route(const k3c_config *c, const double *logits, const double *bias, int *idx, double *weight) {
    int E = c->num_experts, K = c->num_experts_per_token;
    double scores[E], choice[E];
    if (c->router_sigmoid) {
        for (int e = 0; e < E; e++) scores[e] = sigmoid(logits[e]);
    } else {
        double mx = -INFINITY, z = 0;
        for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
        for (int e = 0; e < E; e++) z += (scores[e] = exp(logits[e] - mx));
        for (int e = 0; e < E; e++) scores[e] /= z;
    }
    for (int e = 0; e < E; e++) choice[e] = scores[e] + (bias ? bias[e] : 0.0);

    int G = c->num_expert_group;
    if (c->use_grouped_topk && G > 1) {
        /* Group score: the sum of its two best choice values; keep topk_group groups, mask the rest. */
        int gs = E / G;
        double gscore[G];
        int keep[G];
        for (int g = 0; g < G; g++) {
            double b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * gs; e < (g + 1) * gs; e++) {
                if (choice[e] > b1) {
                    b2 = b1;
                    b1 = choice[e];
                } else if (choice[e] > b2) {
                    b2 = choice[e];
                }
            }
            gscore[g] = gs >= 2 ? b1 + b2 : b1;
            keep[g] = 0;
        }
        for (int k = 0; k < c->topk_group; k++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            keep[best] = 1;
        }
        for (int e = 0; e < E; e++)
            if (!keep[e / gs]) choice[e] = -INFINITY;
    }

    unsigned char taken[E];
    memset(taken, 0, sizeof taken);
    double sum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) /* strict >: ties go to the lower id */
            if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
        taken[best] = 1;
        idx[k] = best;
        weight[k] = scores[best];
        sum += scores[best];
    }
    for (int k = 0; k < K; k++) {
        if (c->moe_renormalize) weight[k] /= sum + 1e-20;
        weight[k] *= c->routed_scaling_factor;
    }
}

/* ---- KDA (§2.2, recurrent form; §10 for Kimi Linear's decay) ---- */

static int kda_forward(const ref_model *m, const ref_layer *L, const double *x, int n, double *out) {
    const k3c_config *c = &m->cfg;
    int H = c->kda_num_heads, dk = c->kda_head_dim, P = H * dk, W = c->kda_conv_kernel;
    size_t nP = (size_t)n * P;
    double *raw = malloc(3 * nP * sizeof *raw), *cv = malloc(3 * nP * sizeof *cv);
    double *fa = malloc((size_t)n * dk * sizeof *fa), *f = malloc(nP * sizeof *f), *z = malloc(nP * sizeof *z);
    double *bl = malloc((size_t)n * H * sizeof *bl), *y = malloc(nP * sizeof *y);
    double *S = calloc((size_t)H * dk * dk, sizeof *S);
    double *q = malloc((size_t)dk * sizeof *q), *k = malloc((size_t)dk * sizeof *k);
    double *alpha = malloc((size_t)dk * sizeof *alpha), *u = malloc((size_t)dk * sizeof *u);
    int rc = K3C_ERR;
    if (!raw || !cv || !fa || !f || !z || !bl || !y || !S || !q || !k || !alpha || !u) {
        k3c_errorf("ref: out of memory (KDA, n=%d)", n);
        goto done;
    }
    /* 1. projections */
    if (linear(&L->q, x, n, raw) || linear(&L->k, x, n, raw + nP) || linear(&L->v, x, n, raw + 2 * nP)) goto done;
    if (linear(&L->fa, x, n, fa) || linear(&L->fb, fa, n, f) || linear(&L->b, x, n, bl)) goto done;
    if (c->kda_full_rank_gate) {
        if (linear(&L->g, x, n, z)) goto done;
    } else {
        if (linear(&L->ga, x, n, fa) || linear(&L->gb, fa, n, z)) goto done;
    }
    /* 2. causal depthwise conv (tap W-1 on the current token, zeros before the start) + SiLU */
    const double *wts[3] = {L->qconv, L->kconv, L->vconv};
    for (int s = 0; s < 3; s++) {
        const double *in = raw + s * nP;
        for (int t = 0; t < n; t++)
            for (int ch = 0; ch < P; ch++) {
                double acc = 0;
                for (int j = 0; j < W; j++) {
                    int tt = t - (W - 1) + j;
                    if (tt >= 0) acc += wts[s][(size_t)ch * W + j] * in[(size_t)tt * P + ch];
                }
                cv[s * nP + (size_t)t * P + ch] = silu(acc);
            }
    }
    /* 3-8. per token, per head: l2norm, decay, beta, delta rule, gated output norm */
    double scale = 1.0 / sqrt((double)dk), eps = c->rms_norm_eps;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            const double *qc = cv + (size_t)t * P + (size_t)h * dk;
            const double *kc = cv + nP + (size_t)t * P + (size_t)h * dk;
            const double *vc = cv + 2 * nP + (size_t)t * P + (size_t)h * dk;
            double qs = 0, ks = 0;
            for (int d = 0; d < dk; d++) {
                qs += qc[d] * qc[d];
                ks += kc[d] * kc[d];
            }
            double qn = 1.0 / sqrt(qs + 1e-6), kn = 1.0 / sqrt(ks + 1e-6);
            for (int d = 0; d < dk; d++) {
                q[d] = qc[d] * qn * scale;
                k[d] = kc[d] * kn;
                double a = f[(size_t)t * P + (size_t)h * dk + d] + L->dt_bias[(size_t)h * dk + d], g;
                if (c->kda_has_lower_bound) {
                    g = c->kda_gate_lower_bound * sigmoid(exp(L->a_log[h]) * a);
                } else {
                    double sp = a > 20.0 ? a : log1p(exp(a));
                    g = -exp(L->a_log[h]) * sp;
                }
                alpha[d] = exp(g);
            }
            double beta = sigmoid(bl[(size_t)t * H + h]);
            double *Sh = S + (size_t)h * dk * dk; /* Sh[d * dk + e]: key channel d, value channel e */
            for (int d = 0; d < dk; d++)
                for (int e = 0; e < dk; e++) Sh[d * dk + e] *= alpha[d];
            for (int e = 0; e < dk; e++) {
                double mem = 0;
                for (int d = 0; d < dk; d++) mem += k[d] * Sh[d * dk + e];
                u[e] = beta * (vc[e] - mem);
            }
            for (int d = 0; d < dk; d++)
                for (int e = 0; e < dk; e++) Sh[d * dk + e] += k[d] * u[e];
            double *yo = y + (size_t)t * P + (size_t)h * dk;
            for (int e = 0; e < dk; e++) {
                double o = 0;
                for (int d = 0; d < dk; d++) o += q[d] * Sh[d * dk + e];
                yo[e] = o;
            }
            rmsnorm(yo, L->onorm, dk, eps, yo);
            const double *zz = z + (size_t)t * P + (size_t)h * dk;
            /* sigmoid gate in both families: transformers 5.17's KimiLinearRMSNormGated uses sigmoid too, and
             * its saved logits (tests/fixtures/kimi_linear_hf) agree only with sigmoid, not silu. */
            for (int e = 0; e < dk; e++) yo[e] *= sigmoid(zz[e]);
        }
    /* 9. output projection */
    if (linear(&L->o, y, n, out)) goto done;
    rc = K3C_OK;
done:
    free(raw), free(cv), free(fa), free(f), free(z), free(bl), free(y), free(S), free(q), free(k), free(alpha), free(u);
    return rc;
}

/* ---- MLA (§3.2, expanded form, NoPE) ---- */

static int mla_forward(const ref_model *m, const ref_layer *L, const double *x, int n, double *out) {
    const k3c_config *c = &m->cfg;
    int Hm = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim, vd = c->v_head_dim;
    int R = c->kv_lora_rank, qh = nope + rope, kvh = nope + vd, QL = c->q_lora_rank;
    double *q = malloc((size_t)n * Hm * qh * sizeof *q);
    double *cq = QL > 0 ? malloc((size_t)n * QL * sizeof *cq) : NULL;
    double *ckv = malloc((size_t)n * (R + rope) * sizeof *ckv), *c_n = malloc((size_t)n * R * sizeof *c_n);
    double *kv = malloc((size_t)n * Hm * kvh * sizeof *kv), *o = malloc((size_t)n * Hm * vd * sizeof *o);
    double *gz = c->mla_use_output_gate ? malloc((size_t)n * Hm * vd * sizeof *gz) : NULL;
    double *p = malloc((size_t)n * sizeof *p);
    int rc = K3C_ERR;
    if (!q || (QL > 0 && !cq) || !ckv || !c_n || !kv || !o || (c->mla_use_output_gate && !gz) || !p) {
        k3c_errorf("ref: out of memory (MLA, n=%d)", n);
        goto done;
    }
    if (QL > 0) {
        if (linear(&L->qa, x, n, cq)) goto done;
        rmsnorm_rows(cq, L->qa_norm, n, QL, c->mla_lora_norm_eps, cq);
        if (linear(&L->qb, cq, n, q)) goto done;
    } else if (linear(&L->mq, x, n, q)) {
        goto done;
    }
    if (linear(&L->kva, x, n, ckv)) goto done;
    for (int t = 0; t < n; t++)
        rmsnorm(ckv + (size_t)t * (R + rope), L->kva_norm, R, c->mla_lora_norm_eps, c_n + (size_t)t * R);
    if (m->latent_round) /* what a cache stores: c_normed and k_pe, every later use reads these */
        for (int t = 0; t < n; t++) {
            for (int d = 0; d < R; d++) c_n[(size_t)t * R + d] = m->latent_round(c_n[(size_t)t * R + d]);
            for (int d = 0; d < rope; d++)
                ckv[(size_t)t * (R + rope) + R + d] = m->latent_round(ckv[(size_t)t * (R + rope) + R + d]);
        }
    if (linear(&L->kvb, c_n, n, kv)) goto done; /* per head [k_nope | v] */
    double scale = 1.0 / sqrt((double)qh);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < Hm; h++) {
            const double *qi = q + ((size_t)i * Hm + h) * qh;
            double mx = -INFINITY, zsum = 0;
            for (int t = 0; t <= i; t++) {
                const double *kn = kv + ((size_t)t * Hm + h) * kvh;
                const double *kpe = ckv + (size_t)t * (R + rope) + R; /* shared by all heads, not rotated */
                double s = 0;
                for (int d = 0; d < nope; d++) s += qi[d] * kn[d];
                for (int d = 0; d < rope; d++) s += qi[nope + d] * kpe[d];
                p[t] = s * scale;
                if (p[t] > mx) mx = p[t];
            }
            for (int t = 0; t <= i; t++) zsum += (p[t] = exp(p[t] - mx));
            double *oi = o + ((size_t)i * Hm + h) * vd;
            for (int e = 0; e < vd; e++) oi[e] = 0;
            for (int t = 0; t <= i; t++) {
                const double *vt = kv + ((size_t)t * Hm + h) * kvh + nope;
                double a = p[t] / zsum;
                for (int e = 0; e < vd; e++) oi[e] += a * vt[e];
            }
        }
    if (c->mla_use_output_gate) {
        if (linear(&L->g, x, n, gz)) goto done;
        for (size_t i = 0; i < (size_t)n * Hm * vd; i++) o[i] *= sigmoid(gz[i]);
    }
    if (linear(&L->o, o, n, out)) goto done;
    rc = K3C_OK;
done:
    free(q), free(cq), free(ckv), free(c_n), free(kv), free(o), free(gz), free(p);
    return rc;
}

/* ---- FFN (§5) ---- */

/* out = down(act(gate y, up y)) over n tokens. */
static int mlp_forward(const ref_model *m, const rw *gate, const rw *up, const rw *down, const double *y, int n,
                       double *out) {
    size_t len = (size_t)n * gate->rows;
    double *g = malloc(len * sizeof *g), *u = malloc(len * sizeof *u);
    int rc = K3C_ERR;
    if (!g || !u) {
        k3c_errorf("ref: out of memory (MLP)");
        goto done;
    }
    if (linear(gate, y, n, g) || linear(up, y, n, u)) goto done;
    gated_act(&m->cfg, g, u, len, g);
    if (linear(down, g, n, out)) goto done;
    rc = K3C_OK;
done:
    free(g), free(u);
    return rc;
}

static int moe_forward(const ref_model *m, const ref_layer *L, const double *y, int n, double *out) {
    const k3c_config *c = &m->cfg;
    int D = c->hidden_size, E = c->num_experts, K = c->num_experts_per_token, F = c->moe_intermediate_size;
    int R = c->routed_expert_hidden_size, X = R > 0 ? R : D;
    double *logits = malloc((size_t)n * E * sizeof *logits), *wts = malloc((size_t)n * K * sizeof *wts);
    int *idx = malloc((size_t)n * K * sizeof *idx), *tok = malloc((size_t)n * sizeof *tok);
    double *tw = malloc((size_t)n * sizeof *tw);
    double *z = R > 0 ? malloc((size_t)n * R * sizeof *z) : NULL;
    double *acc = calloc((size_t)n * X, sizeof *acc);
    double *xin = malloc((size_t)n * X * sizeof *xin), *h1 = malloc((size_t)n * F * sizeof *h1);
    double *h3 = malloc((size_t)n * F * sizeof *h3), *h2 = malloc((size_t)n * X * sizeof *h2);
    double *sh = L->has_mlp ? malloc((size_t)n * D * sizeof *sh) : NULL;
    int rc = K3C_ERR;
    if (!logits || !wts || !idx || !tok || !tw || (R > 0 && !z) || !acc || !xin || !h1 || !h3 || !h2 ||
        (L->has_mlp && !sh)) {
        k3c_errorf("ref: out of memory (MoE)");
        goto done;
    }
    /* router on y (fp32 in the engines; double here) */
    if (linear(&L->router, y, n, logits)) goto done;
    for (int t = 0; t < n; t++) ref_route(c, logits + (size_t)t * E, L->bias, idx + (size_t)t * K, wts + (size_t)t * K);
    if (m->route_counts)
        for (int j = 0; j < n * K; j++) m->route_counts[(size_t)(L - m->layers) * E + idx[j]]++;
    const double *ein = y;
    if (R > 0) {
        if (linear(&L->rdown, y, n, z)) goto done;
        ein = z;
    }
    /* experts, batched per expert over the tokens that chose it */
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (idx[(size_t)t * K + k] == e) {
                    tok[cnt] = t;
                    tw[cnt] = wts[(size_t)t * K + k];
                    memcpy(xin + (size_t)cnt * X, ein + (size_t)t * X, (size_t)X * sizeof *xin);
                    cnt++;
                }
        if (!cnt) continue;
        const rw *ex = &L->experts[(size_t)e * 3];
        if (linear(&ex[0], xin, cnt, h1) || linear(&ex[2], xin, cnt, h3)) goto done;
        gated_act(c, h1, h3, (size_t)cnt * F, h1);
        if (linear(&ex[1], h1, cnt, h2)) goto done;
        for (int i = 0; i < cnt; i++)
            for (int d = 0; d < X; d++) acc[(size_t)tok[i] * X + d] += tw[i] * h2[(size_t)i * X + d];
    }
    if (R > 0) {
        if (L->rnorm) rmsnorm_rows(acc, L->rnorm, n, R, c->rms_norm_eps, acc);
        if (linear(&L->rup, acc, n, out)) goto done;
    } else {
        memcpy(out, acc, (size_t)n * D * sizeof *out);
    }
    if (L->has_mlp) {
        if (mlp_forward(m, &L->gate, &L->up, &L->down, y, n, sh)) goto done;
        for (size_t i = 0; i < (size_t)n * D; i++) out[i] += sh[i];
    }
    rc = K3C_OK;
done:
    free(logits), free(wts), free(idx), free(tok), free(tw), free(z), free(acc), free(xin), free(h1), free(h3), free(h2);
    free(sh);
    return rc;
}

/* ---- whole model (§7) ---- */

/* Mix over blocks[0..nb-1] (each [n][D]) and P, for every token. */
static void mix_rows(const double *blocks, int nb, const double *P, const double *w, const double *nw, int n, int D,
                     double eps, double *out) {
    const double *src[nb + 1];
    for (int t = 0; t < n; t++) {
        for (int j = 0; j < nb; j++) src[j] = blocks + ((size_t)j * n + t) * D;
        src[nb] = P + (size_t)t * D;
        ref_attnres_mix(src, nb + 1, w, nw, D, eps, out + (size_t)t * D);
    }
}

int ref_forward(ref_model *m, const int *ids, int n, double *logits, const int *layers, int num_layers,
                double *out) {
    const k3c_config *c = &m->cfg;
    int D = c->hidden_size, V = c->vocab_size, Lnum = c->num_layers, S = c->attn_res_block_size;
    if (n < 1) return k3c_errorf("ref: n = %d, expected >= 1", n);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) return k3c_errorf("ref: token %d: id %d out of range [0, %d)", i, ids[i], V);
    for (int j = 0; j < num_layers; j++)
        if (layers[j] < -1 || layers[j] >= Lnum)
            return k3c_errorf("ref: tap %d: layer %d out of range [-1, %d)", j, layers[j], Lnum);
    if (num_layers > 0 && !out) return k3c_errorf("ref: taps requested with no output buffer");

    size_t nD = (size_t)n * D;
    int nbmax = S > 0 ? (Lnum + S - 1) / S : 0;
    double *P = malloc(nD * sizeof *P), *xin = malloc(nD * sizeof *xin), *A = malloc(nD * sizeof *A);
    double *blocks = nbmax ? malloc((size_t)nbmax * nD * sizeof *blocks) : NULL;
    int rc = K3C_ERR;
    if (!P || !xin || !A || (nbmax && !blocks)) {
        k3c_errorf("ref: out of memory (forward, n=%d)", n);
        goto done;
    }
    /* embedding: P (AttnRes: the first prefix) or h (plain residual); both live in P */
    for (int i = 0; i < n; i++) rw_row(&m->embed, ids[i], P + (size_t)i * D, NULL);
    for (int j = 0; j < num_layers; j++)
        if (layers[j] == -1) memcpy(out + (size_t)j * nD, P, nD * sizeof *P);

    int nb = 0;
    double eps = c->rms_norm_eps;
    for (int l = 0; l < Lnum; l++) {
        const ref_layer *L = &m->layers[l];
        int p_empty = 0;
        /* attention side */
        if (S > 0) {
            mix_rows(blocks, nb, P, L->ares_w, L->ares_n, n, D, eps, xin);
            if (l % S == 0) { /* close the block: the prefix so far becomes a source, P restarts empty */
                memcpy(blocks + (size_t)nb * nD, P, nD * sizeof *P);
                nb++;
                p_empty = 1;
            }
            rmsnorm_rows(xin, L->in_norm, n, D, eps, xin);
        } else {
            rmsnorm_rows(P, L->in_norm, n, D, eps, xin);
        }
        if (L->kind == K3C_ATTN_KDA) {
            if (kda_forward(m, L, xin, n, A)) goto layer_err;
        } else {
            if (mla_forward(m, L, xin, n, A)) goto layer_err;
        }
        for (size_t i = 0; i < nD; i++) P[i] = p_empty ? A[i] : P[i] + A[i];
        /* MLP side */
        if (S > 0) {
            mix_rows(blocks, nb, P, L->mres_w, L->mres_n, n, D, eps, xin);
            rmsnorm_rows(xin, L->post_norm, n, D, eps, xin);
        } else {
            rmsnorm_rows(P, L->post_norm, n, D, eps, xin);
        }
        if (L->moe) {
            if (moe_forward(m, L, xin, n, A)) goto layer_err;
        } else {
            if (mlp_forward(m, &L->gate, &L->up, &L->down, xin, n, A)) goto layer_err;
        }
        for (size_t i = 0; i < nD; i++) P[i] += A[i];
        for (int j = 0; j < num_layers; j++)
            if (layers[j] == l) memcpy(out + (size_t)j * nD, P, nD * sizeof *P);
        continue;
    layer_err:
        k3c_error_context("ref: layer %d (%s)", l, L->kind == K3C_ATTN_KDA ? "KDA" : "MLA");
        goto done;
    }
    if (logits) {
        if (S > 0) mix_rows(blocks, nb, P, m->ores_w, m->ores_n, n, D, eps, xin);
        else memcpy(xin, P, nD * sizeof *P);
        rmsnorm_rows(xin, m->final_norm, n, D, eps, xin);
        if (linear(&m->lm_head, xin, n, logits)) goto done;
    }
    rc = K3C_OK;
done:
    free(P), free(xin), free(A), free(blocks);
    return rc;
}

int ref_logits(ref_model *m, const int *ids, int n, double *logits) {
    return ref_forward(m, ids, n, logits, NULL, 0, NULL);
}

int ref_hidden(ref_model *m, const int *ids, int n, const int *layers, int num_layers, double *out) {
    return ref_forward(m, ids, n, NULL, layers, num_layers, out);
}
