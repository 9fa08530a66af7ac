/* The tensor inventory of a config, in the published naming of its family (K3's
 * released checkpoint; transformers 5.17's save names for Kimi Linear). Order: model-level tensors, then layer by
 * layer (norms, AttnRes, attention, FFN), routed experts in numeric order.
 *
 * The full K3 has 497,052 text tensors, so specs are appended into one array grown by doubling and names
 * are formatted once; nothing here is quadratic. */
#include "model/inventory.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

typedef struct builder {
    const k3c_config *c;
    k3c_inventory *inv;
    size_t cap;
    const char *prefix;  /* "language_model." (K3) or "" */
    k3c_dtype vec_dtype; /* dtype of the "F32 in K3" vectors: conv, A_log, dt_bias, o_norm, correction bias */
} builder;

/* Appends one spec; the slot pointers may be NULL (inventory without weights). The shape is passed as
 * ndim values; for matrices the slot's rows/cols are filled from it so the weights know their shapes
 * before the loader binds the data. */
static k3c_tensor_spec *add(builder *b, k3c_tensor_class cls, k3c_dtype dtype, int layer, int expert, int ndim,
                            const int64_t *shape, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static k3c_tensor_spec *add(builder *b, k3c_tensor_class cls, k3c_dtype dtype, int layer, int expert, int ndim,
                            const int64_t *shape, const char *fmt, ...) {
    k3c_inventory *inv = b->inv;
    if (inv->count == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        k3c_tensor_spec *specs = realloc(inv->specs, cap * sizeof *specs);
        if (!specs) {
            k3c_errorf_kind(K3C_ERROR_OOM, "out of memory growing the tensor inventory to %zu entries", cap);
            return NULL;
        }
        inv->specs = specs;
        b->cap = cap;
    }
    k3c_tensor_spec *s = &inv->specs[inv->count];
    memset(s, 0, sizeof *s);
    size_t len = strlen(b->prefix);
    memcpy(s->name, b->prefix, len);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s->name + len, sizeof s->name - len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof s->name - len) {
        k3c_errorf("tensor name %s... longer than %zu bytes", s->name, sizeof s->name - 1);
        return NULL;
    }
    s->cls = cls;
    s->dtype = dtype;
    s->layer = layer;
    s->expert = expert;
    s->ndim = ndim;
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        s->shape[i] = shape[i];
        numel *= (uint64_t)shape[i];
    }
    s->vec_len = cls == K3C_TENSOR_VECTOR ? (int)numel : 0;
    inv->count++;
    return s;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

/* Points a matrix spec at its slot (NULL: inventory without weights); the slot learns its shape now and its
 * data when the loader binds it. */
static void bind_mat(k3c_tensor_spec *s, k3c_mat *m) {
    s->mat = m;
    if (m) *m = (k3c_mat){.w = NULL, .rows = (int)s->shape[0], .cols = (int)s->shape[1]};
}

/* A bf16 matrix [rows, cols] bound to *m (m may be NULL). */
static int add_mat(builder *b, k3c_mat *m, int layer, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int add_mat(builder *b, k3c_mat *m, int layer, int64_t rows, int64_t cols, const char *fmt, ...) {
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    k3c_tensor_spec *s = add(b, K3C_TENSOR_MATRIX, K3C_DTYPE_BF16, layer, -1, 2, SHAPE(rows, cols), "%s", name);
    if (!s) return K3C_ERR;
    bind_mat(s, m);
    return K3C_OK;
}

/* A vector bound to *v (converted to f32 by the loader), with the given stored shape. */
static int add_vec(builder *b, float **v, k3c_dtype dtype, int layer, int ndim, const int64_t *shape,
                   const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int add_vec(builder *b, float **v, k3c_dtype dtype, int layer, int ndim, const int64_t *shape,
                   const char *fmt, ...) {
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    k3c_tensor_spec *s = add(b, K3C_TENSOR_VECTOR, dtype, layer, -1, ndim, shape, "%s", name);
    if (!s) return K3C_ERR;
    s->vec = v;
    return K3C_OK;
}

/* One routed expert projection [rows, cols]: BF16 `.weight`, or MXFP4 `.weight_packed` + `.weight_scale`. */
static int add_expert_proj(builder *b, k3c_expert *ex, int which, int layer, int e, int64_t rows, int64_t cols) {
    const k3c_config *c = b->c;
    if (c->expert_format == K3C_EXPERTS_MXFP4) {
        k3c_mxfp4_mat *mx = ex ? (which == 1 ? &ex->q1 : which == 2 ? &ex->q2 : &ex->q3) : NULL;
        int g = c->mxfp4_group_size > 0 ? c->mxfp4_group_size : 32;
        k3c_tensor_spec *s = add(b, K3C_TENSOR_MXFP4_PACKED, K3C_DTYPE_U8, layer, e, 2, SHAPE(rows, cols / 2),
                                 "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight_packed", layer, e, which);
        if (!s) return K3C_ERR;
        s->mx = mx;
        s = add(b, K3C_TENSOR_MXFP4_SCALE, K3C_DTYPE_U8, layer, e, 2, SHAPE(rows, cols / g),
                "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight_scale", layer, e, which);
        if (!s) return K3C_ERR;
        s->mx = mx;
        if (mx) {
            mx->rows = (int)rows;
            mx->cols = (int)cols;
            mx->packed = NULL;
            mx->scale = NULL;
        }
        return K3C_OK;
    }
    k3c_mat *m = ex ? (which == 1 ? &ex->w1 : which == 2 ? &ex->w2 : &ex->w3) : NULL;
    k3c_tensor_spec *s = add(b, K3C_TENSOR_MATRIX, K3C_DTYPE_BF16, layer, e, 2, SHAPE(rows, cols),
                             "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight", layer, e, which);
    if (!s) return K3C_ERR;
    bind_mat(s, m);
    return K3C_OK;
}

static int add_kda(builder *b, k3c_kda_weights *k, int l) {
    const k3c_config *c = b->c;
    int64_t D = c->hidden_size, H = c->kda_num_heads, dk = c->kda_head_dim, P = k3c_config_kda_proj(c),
            W = c->kda_conv_kernel;
    K3C_TRY(add_mat(b, k ? &k->q_proj : NULL, l, P, D, "model.layers.%d.self_attn.q_proj.weight", l));
    K3C_TRY(add_mat(b, k ? &k->k_proj : NULL, l, P, D, "model.layers.%d.self_attn.k_proj.weight", l));
    K3C_TRY(add_mat(b, k ? &k->v_proj : NULL, l, P, D, "model.layers.%d.self_attn.v_proj.weight", l));
    /* Depthwise conv weights as nn.Conv1d stores them: [P, 1, W]; the f32 copy is [P, W]. */
    K3C_TRY(add_vec(b, k ? &k->q_conv : NULL, b->vec_dtype, l, 3, SHAPE(P, 1, W),
                    "model.layers.%d.self_attn.q_conv1d.weight", l));
    K3C_TRY(add_vec(b, k ? &k->k_conv : NULL, b->vec_dtype, l, 3, SHAPE(P, 1, W),
                    "model.layers.%d.self_attn.k_conv1d.weight", l));
    K3C_TRY(add_vec(b, k ? &k->v_conv : NULL, b->vec_dtype, l, 3, SHAPE(P, 1, W),
                    "model.layers.%d.self_attn.v_conv1d.weight", l));
    K3C_TRY(add_mat(b, k ? &k->f_a : NULL, l, dk, D, "model.layers.%d.self_attn.f_a_proj.weight", l));
    K3C_TRY(add_mat(b, k ? &k->f_b : NULL, l, P, dk, "model.layers.%d.self_attn.f_b_proj.weight", l));
    K3C_TRY(add_mat(b, k ? &k->b_proj : NULL, l, H, D, "model.layers.%d.self_attn.b_proj.weight", l));
    if (c->kda_full_rank_gate) {
        K3C_TRY(add_mat(b, k ? &k->g_proj : NULL, l, P, D, "model.layers.%d.self_attn.g_proj.weight", l));
    } else {
        K3C_TRY(add_mat(b, k ? &k->g_a : NULL, l, dk, D, "model.layers.%d.self_attn.g_a_proj.weight", l));
        K3C_TRY(add_mat(b, k ? &k->g_b : NULL, l, P, dk, "model.layers.%d.self_attn.g_b_proj.weight", l));
    }
    /* A_log: K3 zero-pads to a multiple of 128 entries (only the first H are real); Kimi Linear keeps
     * the [1, 1, H, 1] parameter shape of the reference module. Either way the f32 copy holds H values. */
    if (c->kda_a_log_padded) {
        int64_t padded = (H + 127) / 128 * 128;
        K3C_TRY(add_vec(b, k ? &k->a_log : NULL, b->vec_dtype, l, 1, SHAPE(padded), "model.layers.%d.self_attn.A_log",
                        l));
    } else {
        K3C_TRY(add_vec(b, k ? &k->a_log : NULL, b->vec_dtype, l, 4, SHAPE(1, 1, H, 1),
                        "model.layers.%d.self_attn.A_log", l));
    }
    b->inv->specs[b->inv->count - 1].vec_len = (int)H;
    K3C_TRY(add_vec(b, k ? &k->dt_bias : NULL, b->vec_dtype, l, 1, SHAPE(P), "model.layers.%d.self_attn.dt_bias", l));
    K3C_TRY(add_vec(b, k ? &k->o_norm : NULL, b->vec_dtype, l, 1, SHAPE(dk), "model.layers.%d.self_attn.o_norm.weight",
                    l));
    K3C_TRY(add_mat(b, k ? &k->o_proj : NULL, l, D, P, "model.layers.%d.self_attn.o_proj.weight", l));
    return K3C_OK;
}

static int add_mla(builder *b, k3c_mla_weights *m, int l) {
    const k3c_config *c = b->c;
    int64_t D = c->hidden_size, Hm = c->num_attention_heads, qk = k3c_config_mla_qk_head_dim(c), ql = c->q_lora_rank,
            kv = c->kv_lora_rank, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim, v = c->v_head_dim;
    if (ql > 0) {
        K3C_TRY(add_mat(b, m ? &m->q_a : NULL, l, ql, D, "model.layers.%d.self_attn.q_a_proj.weight", l));
        K3C_TRY(add_vec(b, m ? &m->q_a_norm : NULL, K3C_DTYPE_BF16, l, 1, SHAPE(ql),
                        "model.layers.%d.self_attn.q_a_layernorm.weight", l));
        K3C_TRY(add_mat(b, m ? &m->q_b : NULL, l, Hm * qk, ql, "model.layers.%d.self_attn.q_b_proj.weight", l));
    } else {
        K3C_TRY(add_mat(b, m ? &m->q_proj : NULL, l, Hm * qk, D, "model.layers.%d.self_attn.q_proj.weight", l));
    }
    K3C_TRY(add_mat(b, m ? &m->kv_a : NULL, l, kv + rope, D, "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l));
    K3C_TRY(add_vec(b, m ? &m->kv_a_norm : NULL, K3C_DTYPE_BF16, l, 1, SHAPE(kv),
                    "model.layers.%d.self_attn.kv_a_layernorm.weight", l));
    K3C_TRY(add_mat(b, m ? &m->kv_b : NULL, l, Hm * (nope + v), kv, "model.layers.%d.self_attn.kv_b_proj.weight", l));
    if (c->mla_use_output_gate)
        K3C_TRY(add_mat(b, m ? &m->g_proj : NULL, l, Hm * v, D, "model.layers.%d.self_attn.g_proj.weight", l));
    K3C_TRY(add_mat(b, m ? &m->o_proj : NULL, l, D, Hm * v, "model.layers.%d.self_attn.o_proj.weight", l));
    return K3C_OK;
}

static int add_mlp(builder *b, k3c_mlp_weights *m, int l, const char *module, int64_t width) {
    int64_t D = b->c->hidden_size;
    K3C_TRY(add_mat(b, m ? &m->gate : NULL, l, width, D, "model.layers.%d.%sgate_proj.weight", l, module));
    K3C_TRY(add_mat(b, m ? &m->up : NULL, l, width, D, "model.layers.%d.%sup_proj.weight", l, module));
    K3C_TRY(add_mat(b, m ? &m->down : NULL, l, D, width, "model.layers.%d.%sdown_proj.weight", l, module));
    return K3C_OK;
}

static int add_moe(builder *b, k3c_moe_weights *m, int l) {
    const k3c_config *c = b->c;
    int64_t D = c->hidden_size, E = c->num_experts, F = c->moe_intermediate_size, R = c->routed_expert_hidden_size,
            in = k3c_config_expert_in(c);
    K3C_TRY(add_mat(b, m ? &m->router : NULL, l, E, D, "model.layers.%d.block_sparse_moe.gate.weight", l));
    if (c->use_correction_bias)
        K3C_TRY(add_vec(b, m ? &m->correction_bias : NULL, b->vec_dtype, l, 1, SHAPE(E),
                        "model.layers.%d.block_sparse_moe.gate.e_score_correction_bias", l));
    if (R > 0) {
        K3C_TRY(add_mat(b, m ? &m->latent_down : NULL, l, R, D,
                        "model.layers.%d.block_sparse_moe.routed_expert_down_proj.weight", l));
        if (c->latent_moe_use_norm)
            K3C_TRY(add_vec(b, m ? &m->latent_norm : NULL, K3C_DTYPE_BF16, l, 1, SHAPE(R),
                            "model.layers.%d.block_sparse_moe.routed_expert_norm.weight", l));
        K3C_TRY(add_mat(b, m ? &m->latent_up : NULL, l, D, R,
                        "model.layers.%d.block_sparse_moe.routed_expert_up_proj.weight", l));
    }
    if (c->num_shared_experts > 0)
        K3C_TRY(add_mlp(b, m ? &m->shared : NULL, l, "block_sparse_moe.shared_experts.", k3c_config_shared_width(c)));
    for (int e = 0; e < E; e++) {
        k3c_expert *ex = m ? &m->experts[e] : NULL;
        K3C_TRY(add_expert_proj(b, ex, 1, l, e, F, in));
        K3C_TRY(add_expert_proj(b, ex, 2, l, e, in, F));
        K3C_TRY(add_expert_proj(b, ex, 3, l, e, F, in));
    }
    return K3C_OK;
}

static int add_layer(builder *b, k3c_layer_weights *lw, int l) {
    const k3c_config *c = b->c;
    int64_t D = c->hidden_size;
    K3C_TRY(add_vec(b, lw ? &lw->input_norm : NULL, K3C_DTYPE_BF16, l, 1, SHAPE(D),
                    "model.layers.%d.input_layernorm.weight", l));
    K3C_TRY(add_vec(b, lw ? &lw->post_norm : NULL, K3C_DTYPE_BF16, l, 1, SHAPE(D),
                    "model.layers.%d.post_attention_layernorm.weight", l));
    if (c->attn_res_block_size > 0) {
        /* The AttnRes pseudo-queries are Linear(D, 1) weights: stored [1, D]. */
        K3C_TRY(add_vec(b, lw ? &lw->attn_res_proj : NULL, K3C_DTYPE_BF16, l, 2, SHAPE(1, D),
                        "model.layers.%d.self_attention_res_proj.weight", l));
        K3C_TRY(add_vec(b, lw ? &lw->attn_res_norm : NULL, K3C_DTYPE_BF16, l, 1, SHAPE(D),
                        "model.layers.%d.self_attention_res_norm.weight", l));
        K3C_TRY(add_vec(b, lw ? &lw->mlp_res_proj : NULL, K3C_DTYPE_BF16, l, 2, SHAPE(1, D),
                        "model.layers.%d.mlp_res_proj.weight", l));
        K3C_TRY(add_vec(b, lw ? &lw->mlp_res_norm : NULL, K3C_DTYPE_BF16, l, 1, SHAPE(D),
                        "model.layers.%d.mlp_res_norm.weight", l));
    }
    if (c->layer_attn[l] == K3C_ATTN_KDA)
        K3C_TRY(add_kda(b, lw ? &lw->kda : NULL, l));
    else
        K3C_TRY(add_mla(b, lw ? &lw->mla : NULL, l));
    if (c->layer_is_moe[l]) {
        K3C_TRY(add_moe(b, lw ? &lw->moe : NULL, l));
    } else {
        /* K3 names the dense MLP `mlp.`; transformers' Kimi Linear keeps `block_sparse_moe.` (sic). */
        const char *module = c->family == K3C_FAMILY_K3 ? "mlp." : "block_sparse_moe.";
        K3C_TRY(add_mlp(b, lw ? &lw->mlp : NULL, l, module, c->intermediate_size));
    }
    return K3C_OK;
}

static int build(builder *b, k3c_weights *w) {
    const k3c_config *c = b->c;
    int64_t D = c->hidden_size, V = c->vocab_size;
    K3C_TRY(add_mat(b, w ? &w->embed : NULL, -1, V, D, "model.embed_tokens.weight"));
    if (!c->tie_word_embeddings) K3C_TRY(add_mat(b, w ? &w->lm_head : NULL, -1, V, D, "lm_head.weight"));
    K3C_TRY(add_vec(b, w ? &w->final_norm : NULL, K3C_DTYPE_BF16, -1, 1, SHAPE(D), "model.norm.weight"));
    if (c->attn_res_block_size > 0) {
        K3C_TRY(add_vec(b, w ? &w->out_res_proj : NULL, K3C_DTYPE_BF16, -1, 2, SHAPE(1, D),
                        "model.output_attn_res_proj.weight"));
        K3C_TRY(add_vec(b, w ? &w->out_res_norm : NULL, K3C_DTYPE_BF16, -1, 1, SHAPE(D),
                        "model.output_attn_res_norm.weight"));
    }
    for (int l = 0; l < c->num_layers; l++) K3C_TRY(add_layer(b, w ? &w->layers[l] : NULL, l));
    return K3C_OK;
}

int k3c_inventory_build(const k3c_config *c, k3c_weights *w, k3c_inventory *out) {
    memset(out, 0, sizeof *out);
    if (c->num_layers <= 0 || !c->layer_attn || !c->layer_is_moe)
        return k3c_errorf("tensor inventory: config has no layer schedule (num_layers %d)", c->num_layers);
    if (c->expert_format == K3C_EXPERTS_MXFP4) {
        int g = c->mxfp4_group_size > 0 ? c->mxfp4_group_size : 32;
        int in = k3c_config_expert_in(c);
        if (in % g || c->moe_intermediate_size % g)
            return k3c_errorf("tensor inventory: MXFP4 experts need widths divisible by group %d (expert in %d, "
                              "moe_intermediate_size %d)",
                              g, in, c->moe_intermediate_size);
    }
    if (w) {
        memset(w, 0, sizeof *w);
        w->layers = calloc((size_t)c->num_layers, sizeof *w->layers);
        if (!w->layers) return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory allocating %d layers of weights", c->num_layers);
        w->num_layers = c->num_layers;
        for (int l = 0; l < c->num_layers; l++) {
            k3c_layer_weights *lw = &w->layers[l];
            lw->kind = c->layer_attn[l];
            lw->is_moe = c->layer_is_moe[l];
            if (lw->is_moe && c->num_experts > 0) {
                lw->moe.experts = calloc((size_t)c->num_experts, sizeof *lw->moe.experts);
                if (!lw->moe.experts) {
                    k3c_weights_free(w);
                    return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory allocating %d experts of layer %d", c->num_experts, l);
                }
            }
        }
    }
    builder b = {
        .c = c,
        .inv = out,
        .prefix = c->family == K3C_FAMILY_K3 ? "language_model." : "",
        /* K3 publishes the KDA small tensors and the correction bias in F32; a transformers bf16 save
         * (Kimi Linear) stores everything in BF16. */
        .vec_dtype = c->family == K3C_FAMILY_K3 ? K3C_DTYPE_F32 : K3C_DTYPE_BF16,
    };
    if (build(&b, w) != K3C_OK) {
        k3c_inventory_free(out);
        if (w) k3c_weights_free(w);
        return K3C_ERR;
    }
    return K3C_OK;
}

void k3c_inventory_free(k3c_inventory *inv) {
    free(inv->specs);
    inv->specs = NULL;
    inv->count = 0;
}

uint64_t k3c_tensor_spec_bytes(const k3c_tensor_spec *s) {
    uint64_t n = k3c_dtype_size(s->dtype);
    for (int i = 0; i < s->ndim; i++) n *= (uint64_t)s->shape[i];
    return n;
}

uint64_t k3c_tensor_spec_params(const k3c_tensor_spec *s) {
    uint64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= (uint64_t)s->shape[i];
    switch (s->cls) {
    case K3C_TENSOR_MXFP4_PACKED: return 2 * n; /* two E2M1 weights per byte */
    case K3C_TENSOR_MXFP4_SCALE: return 0;      /* scales are not parameters of the logical matrix */
    default: return n;
    }
}

static void free_vec(float **v) {
    free(*v);
    *v = NULL;
}

void k3c_weights_free(k3c_weights *w) {
    if (!w) return;
    free_vec(&w->final_norm);
    free_vec(&w->out_res_proj);
    free_vec(&w->out_res_norm);
    for (int l = 0; w->layers && l < w->num_layers; l++) {
        k3c_layer_weights *lw = &w->layers[l];
        float **vecs[] = {&lw->input_norm,    &lw->post_norm,     &lw->attn_res_proj,  &lw->attn_res_norm,
                          &lw->mlp_res_proj,  &lw->mlp_res_norm,  &lw->kda.q_conv,     &lw->kda.k_conv,
                          &lw->kda.v_conv,    &lw->kda.a_log,     &lw->kda.dt_bias,    &lw->kda.o_norm,
                          &lw->mla.q_a_norm,  &lw->mla.kv_a_norm, &lw->moe.correction_bias, &lw->moe.latent_norm};
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) free_vec(vecs[i]);
        free(lw->moe.experts);
        lw->moe.experts = NULL;
    }
    free(w->layers);
    w->layers = NULL;
    w->num_layers = 0;
}
