/* A tensor-parallel rank's shard of a loaded model (model/shard.h). */
#include "model/shard.h"

#include <stdlib.h>
#include <string.h>

#include "model/layout.h"
#include "util/error.h"

typedef struct shard {
    k3c_model *m;
    int rank, tp;
    int first, end;   /* the stage's layers */
    int e0, e1;       /* the experts this rank holds */
    int first_stage, last_stage;
    int moe_whole;    /* the hybrid layout (tp > 1 with ep > 1): the MoE layers' weights not TP-split */
} shard;

static int own(shard *s, void *p) {
    k3c_model *m = s->m;
    if (m->n_owned == m->cap_owned) {
        size_t cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **o = realloc(m->owned, cap * sizeof *o);
        if (!o) {
            free(p);
            return k3c_errorf_kind(K3C_ERROR_OOM, "tp shard: out of host memory");
        }
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return K3C_OK;
}

static int divides(const shard *s, int n, const char *what, int layer) {
    if (n % s->tp == 0) return K3C_OK;
    return layer >= 0 ? k3c_errorf("tp shard: tp %d does not divide %s (%d) of layer %d", s->tp, what, n, layer)
                      : k3c_errorf("tp shard: tp %d does not divide %s (%d)", s->tp, what, n);
}

/* Column-parallel: this rank's rows [rank r, (rank + 1) r) of W, a view. */
static int rows_of(const shard *s, const k3c_mat *W, k3c_mat *out, const char *what, int layer) {
    *out = *W;
    if (!W->w || s->tp == 1) return K3C_OK;
    K3C_TRY(divides(s, W->rows, what, layer));
    out->rows = W->rows / s->tp;
    out->w = W->w + (size_t)s->rank * out->rows * W->cols;
    return K3C_OK;
}

/* Row-parallel: this rank's columns [rank c, (rank + 1) c) of every row of W, copied (strided in W). */
static int cols_of(shard *s, const k3c_mat *W, k3c_mat *out, const char *what, int layer) {
    *out = *W;
    if (!W->w || s->tp == 1) return K3C_OK;
    K3C_TRY(divides(s, W->cols, what, layer));
    int c = W->cols / s->tp;
    if (s->m->device_synthetic) { /* no host bytes to copy: a range of W's the size of the part, generated later */
        out->w = W->w + (size_t)s->rank * W->rows * c;
        out->cols = c;
        return K3C_OK;
    }
    uint16_t *p = malloc((size_t)W->rows * c * sizeof *p);
    if (!p) return k3c_errorf_kind(K3C_ERROR_OOM, "tp shard: out of host memory for %s of layer %d", what, layer);
    for (int r = 0; r < W->rows; r++) memcpy(p + (size_t)r * c, W->w + (size_t)r * W->cols + (size_t)s->rank * c, (size_t)c * 2);
    K3C_TRY(own(s, p));
    out->w = p;
    out->cols = c;
    return K3C_OK;
}

/* MXFP4 experts: rows (w1, w3) as views of packed and scale; columns (w2) copied, whole 32-groups. */
static int mx_rows_of(const shard *s, const k3c_mxfp4_mat *W, k3c_mxfp4_mat *out, int group, int layer) {
    *out = *W;
    if (!W->packed || s->tp == 1) return K3C_OK;
    K3C_TRY(divides(s, W->rows, "an MXFP4 expert's rows", layer));
    out->rows = W->rows / s->tp;
    out->packed = W->packed + (size_t)s->rank * out->rows * (W->cols / 2);
    out->scale = W->scale + (size_t)s->rank * out->rows * (W->cols / group);
    return K3C_OK;
}

static int mx_cols_of(shard *s, const k3c_mxfp4_mat *W, k3c_mxfp4_mat *out, int group, int layer) {
    *out = *W;
    if (!W->packed || s->tp == 1) return K3C_OK;
    if (W->cols % (s->tp * group))
        return k3c_errorf("tp shard: tp %d leaves %d columns of an MXFP4 expert's down projection per rank in layer "
                          "%d, not a multiple of its scale group %d", s->tp, W->cols / s->tp, layer, group);
    int c = W->cols / s->tp, pb = c / 2, sb = c / group;
    if (s->m->device_synthetic) { /* as cols_of: ranges of W's, generated on the device */
        out->packed = W->packed + (size_t)s->rank * W->rows * pb;
        out->scale = W->scale + (size_t)s->rank * W->rows * sb;
        out->cols = c;
        return K3C_OK;
    }
    uint8_t *p = malloc((size_t)W->rows * pb), *q = malloc((size_t)W->rows * sb);
    if (!p || !q) {
        free(p), free(q);
        return k3c_errorf_kind(K3C_ERROR_OOM, "tp shard: out of host memory for experts of layer %d", layer);
    }
    for (int r = 0; r < W->rows; r++) {
        memcpy(p + (size_t)r * pb, W->packed + (size_t)r * (W->cols / 2) + (size_t)s->rank * pb, (size_t)pb);
        memcpy(q + (size_t)r * sb, W->scale + (size_t)r * (W->cols / group) + (size_t)s->rank * sb, (size_t)sb);
    }
    if (own(s, p) != K3C_OK) {
        free(q);
        return K3C_ERR;
    }
    K3C_TRY(own(s, q));
    out->packed = p;
    out->scale = q;
    out->cols = c;
    return K3C_OK;
}

/* This rank's part of a per-channel vector of n_full entries (NULL stays NULL). */
static float *part(const shard *s, float *v, int n_full) { return v ? v + (size_t)s->rank * (n_full / s->tp) : NULL; }

static int shard_kda(shard *s, const k3c_config *c, const k3c_kda_weights *w, k3c_kda_weights *o, int l) {
    int P = k3c_config_kda_proj(c), W = c->kda_conv_kernel, H = c->kda_num_heads;
    *o = *w;
    K3C_TRY(divides(s, H, "the KDA heads", l));
    K3C_TRY(rows_of(s, &w->q_proj, &o->q_proj, "q_proj", l));
    K3C_TRY(rows_of(s, &w->k_proj, &o->k_proj, "k_proj", l));
    K3C_TRY(rows_of(s, &w->v_proj, &o->v_proj, "v_proj", l));
    K3C_TRY(rows_of(s, &w->f_b, &o->f_b, "f_b_proj", l));
    K3C_TRY(rows_of(s, &w->b_proj, &o->b_proj, "b_proj", l));
    K3C_TRY(rows_of(s, &w->g_proj, &o->g_proj, "g_proj", l));
    K3C_TRY(rows_of(s, &w->g_b, &o->g_b, "g_b_proj", l));
    K3C_TRY(cols_of(s, &w->o_proj, &o->o_proj, "o_proj", l));
    /* taps [P, W] per channel; A_log [H] per head; dt_bias [P] per channel; f_a, g_a, o_norm replicated */
    o->q_conv = w->q_conv ? w->q_conv + (size_t)s->rank * (P / s->tp) * W : NULL;
    o->k_conv = w->k_conv ? w->k_conv + (size_t)s->rank * (P / s->tp) * W : NULL;
    o->v_conv = w->v_conv ? w->v_conv + (size_t)s->rank * (P / s->tp) * W : NULL;
    o->a_log = part(s, w->a_log, H);
    o->dt_bias = part(s, w->dt_bias, P);
    return K3C_OK;
}

static int shard_mla(shard *s, const k3c_config *c, const k3c_mla_weights *w, k3c_mla_weights *o, int l) {
    *o = *w;
    K3C_TRY(divides(s, c->num_attention_heads, "the MLA heads", l));
    K3C_TRY(rows_of(s, &w->q_proj, &o->q_proj, "q_proj", l));
    K3C_TRY(rows_of(s, &w->q_b, &o->q_b, "q_b_proj", l));
    K3C_TRY(rows_of(s, &w->kv_b, &o->kv_b, "kv_b_proj", l));
    K3C_TRY(rows_of(s, &w->g_proj, &o->g_proj, "g_proj", l));
    K3C_TRY(cols_of(s, &w->o_proj, &o->o_proj, "o_proj", l));
    return K3C_OK; /* q_a, kv_a and their norms replicated: every rank computes the whole latent */
}

static int shard_mlp(shard *s, const k3c_mlp_weights *w, k3c_mlp_weights *o, int l) {
    *o = *w;
    K3C_TRY(rows_of(s, &w->gate, &o->gate, "an MLP's gate_proj", l));
    K3C_TRY(rows_of(s, &w->up, &o->up, "an MLP's up_proj", l));
    return cols_of(s, &w->down, &o->down, "an MLP's down_proj", l);
}

static int shard_moe(shard *s, const k3c_config *c, const k3c_moe_weights *w, k3c_moe_weights *o, int l) {
    *o = *w; /* router, correction bias and the latent projections replicated */
    o->experts = NULL;
    K3C_TRY(shard_mlp(s, &w->shared, &o->shared, l));
    o->experts = calloc((size_t)c->num_experts, sizeof *o->experts);
    if (!o->experts) return k3c_errorf_kind(K3C_ERROR_OOM, "tp shard: out of host memory for the experts of layer %d", l);
    int g = c->mxfp4_group_size > 0 ? c->mxfp4_group_size : 32;
    for (int e = s->e0; e < s->e1; e++) {
        const k3c_expert *x = &w->experts[e];
        k3c_expert *y = &o->experts[e];
        if (c->expert_format == K3C_EXPERTS_MXFP4) {
            K3C_TRY(mx_rows_of(s, &x->q1, &y->q1, g, l));
            K3C_TRY(mx_rows_of(s, &x->q3, &y->q3, g, l));
            K3C_TRY(mx_cols_of(s, &x->q2, &y->q2, g, l));
        } else {
            K3C_TRY(rows_of(s, &x->w1, &y->w1, "an expert's w1", l));
            K3C_TRY(rows_of(s, &x->w3, &y->w3, "an expert's w3", l));
            K3C_TRY(cols_of(s, &x->w2, &y->w2, "an expert's w2", l));
        }
    }
    return K3C_OK;
}

/* Where slot p (inside the scratch weights `from` the inventory was built over) lies in the shard's weights
 * `to`: the same field of the same layer / expert, or NULL. */
static void *slot_in(const k3c_weights *from, k3c_weights *to, const k3c_tensor_spec *sp, const void *p) {
    const char *base;
    char *dst;
    size_t size;
    if (sp->layer >= 0 && sp->expert >= 0) {
        base = (const char *)&from->layers[sp->layer].moe.experts[sp->expert];
        dst = (char *)&to->layers[sp->layer].moe.experts[sp->expert];
        size = sizeof(k3c_expert);
    } else if (sp->layer >= 0) {
        base = (const char *)&from->layers[sp->layer];
        dst = (char *)&to->layers[sp->layer];
        size = sizeof(k3c_layer_weights);
    } else {
        base = (const char *)from;
        dst = (char *)to;
        size = sizeof(k3c_weights);
    }
    const char *q = p;
    return q >= base && q < base + size ? dst + (q - base) : NULL;
}

/* The shard's tensor inventory (model/inventory.h): the local config's, each spec bound to the shard's own
 * slot, so that a device backend uploads exactly the rank's tensors (views and copies) as it would a loaded
 * model's. Each bound matrix's shape must be the spec's: a check that the split above and the local config
 * agree. */
static int shard_inventory(k3c_model *m) {
    k3c_weights tmp;
    K3C_TRY(k3c_inventory_build(&m->config, &tmp, &m->inventory));
    int rc = K3C_OK;
    size_t kept = 0; /* the specs of tensors the rank holds, compacted in place */
    for (size_t i = 0; i < m->inventory.count && rc == K3C_OK; i++) {
        k3c_tensor_spec *sp = &m->inventory.specs[i];
        void *old = sp->mat ? (void *)sp->mat : sp->mx ? (void *)sp->mx : (void *)sp->vec;
        if (sp->layer >= 0 && sp->expert >= 0 && !m->weights.layers[sp->layer].moe.experts)
            continue; /* a layer of another pipeline stage: no experts array at all */
        void *slot = old ? slot_in(&tmp, &m->weights, sp, old) : NULL;
        if (!slot) {
            rc = k3c_errorf_kind(K3C_ERROR_INTERNAL, "tp shard: tensor %s has no slot", sp->name);
            break;
        }
        /* a tensor the rank does not hold (another stage's layers and end, another EP rank's experts) has an
         * empty slot: it leaves the rank's inventory */
        if (sp->mat ? !((k3c_mat *)slot)->w : sp->mx ? !((k3c_mxfp4_mat *)slot)->packed : !*(float **)slot)
            continue;
        int rows = (int)sp->shape[0], cols = sp->ndim > 1 ? (int)sp->shape[1] : 1, ok = 1;
        if (sp->mat) {
            sp->mat = slot;
            ok = sp->mat->rows == rows && sp->mat->cols == cols;
        } else if (sp->mx) {
            sp->mx = slot;
            ok = sp->mx->rows == rows && (sp->cls == K3C_TENSOR_MXFP4_SCALE || sp->mx->cols == 2 * cols);
        } else {
            sp->vec = slot;
        }
        if (!ok)
            rc = k3c_errorf_kind(K3C_ERROR_INTERNAL, "tp shard: tensor %s is [%d, %d] in the rank's config, the shard "
                                 "holds [%d, %d]", sp->name, rows, cols, sp->mat ? sp->mat->rows : sp->mx->rows,
                                 sp->mat ? sp->mat->cols : sp->mx->cols);
        m->inventory.specs[kept++] = *sp;
    }
    if (rc == K3C_OK) m->inventory.count = kept;
    k3c_weights_free(&tmp);
    return rc;
}

static int build(shard *s, const k3c_model *full) {
    k3c_model *m = s->m;
    const k3c_config *c = &full->config;
    const k3c_weights *W = &full->weights;
    k3c_weights *w = &m->weights;
    int has_kda = 0, has_mla = 0;
    for (int l = 0; l < c->num_layers; l++) {
        has_kda |= c->layer_attn[l] == K3C_ATTN_KDA;
        has_mla |= c->layer_attn[l] == K3C_ATTN_MLA;
    }
    K3C_TRY(k3c_config_copy(&m->config, c));
    k3c_config *lc = &m->config;
    K3C_TRY(divides(s, c->vocab_size, "the vocabulary", -1));
    lc->vocab_size /= s->tp;
    if (has_kda) lc->kda_num_heads /= s->tp;
    if (has_mla) {
        lc->num_attention_heads /= s->tp;
        lc->num_key_value_heads = lc->num_key_value_heads >= s->tp ? lc->num_key_value_heads / s->tp : 1;
    }
    lc->intermediate_size /= s->tp;
    if (!s->moe_whole) lc->moe_intermediate_size /= s->tp;
    shard whole = *s; /* the MoE side of the hybrid: the same rank and stage, no TP split */
    whole.tp = 1;
    whole.rank = 0;

    *w = *W;
    w->layers = calloc((size_t)c->num_layers, sizeof *w->layers);
    if (!w->layers) return k3c_errorf_kind(K3C_ERROR_OOM, "tp shard: out of host memory");
    w->num_layers = c->num_layers;
    K3C_TRY(rows_of(s, &W->embed, &w->embed, "the embedding's vocabulary", -1));
    K3C_TRY(rows_of(s, &W->lm_head, &w->lm_head, "the LM head's vocabulary", -1));
    /* a pipeline stage: the embedding on the first, the output side on the last (a tied LM head is the
     * embedding's matrix, held there as lm_head) */
    if (!s->first_stage) w->embed = (k3c_mat){0};
    if (!s->last_stage) {
        w->lm_head = (k3c_mat){0};
        w->final_norm = w->out_res_proj = w->out_res_norm = NULL;
    }
    for (int l = 0; l < c->num_layers; l++) {
        const k3c_layer_weights *a = &W->layers[l];
        k3c_layer_weights *b = &w->layers[l];
        if (l < s->first || l >= s->end) { /* another stage's layer: its kind only */
            *b = (k3c_layer_weights){.kind = a->kind, .is_moe = a->is_moe};
            continue;
        }
        *b = *a;
        b->moe.experts = NULL;
        if (a->kind == K3C_ATTN_KDA) K3C_TRY(shard_kda(s, c, &a->kda, &b->kda, l));
        else K3C_TRY(shard_mla(s, c, &a->mla, &b->mla, l));
        if (a->is_moe) K3C_TRY(shard_moe(s->moe_whole ? &whole : s, c, &a->moe, &b->moe, l));
        else K3C_TRY(shard_mlp(s, &a->mlp, &b->mlp, l));
    }
    return shard_inventory(m);
}

int k3c_model_shard_tp(const k3c_model *full, int rank, int tp, k3c_model **out) {
    k3c_model_part p = {.tp_rank = rank, .tp = tp};
    return k3c_model_shard(full, &p, out);
}

int k3c_model_shard(const k3c_model *full, const k3c_model_part *part, k3c_model **out) {
    *out = NULL;
    if (!full) return k3c_errorf("shard: no model");
    int tp = part->tp > 0 ? part->tp : 1, pp = part->pp > 0 ? part->pp : 1, ep = part->ep > 0 ? part->ep : 1;
    int rank = part->tp_rank, stage = part->pp_stage, er = part->ep_rank;
    const k3c_config *c = &full->config;
    if (tp < 1 || rank < 0 || rank >= tp) return k3c_errorf("tp shard: rank %d of %d", rank, tp);
    if (stage < 0 || stage >= pp) return k3c_errorf("pp shard: stage %d of %d", stage, pp);
    if (pp > c->num_layers) return k3c_errorf("pp shard: %d stages for %d layers", pp, c->num_layers);
    if (er < 0 || er >= ep) return k3c_errorf("ep shard: rank %d of %d", er, ep);
    if (ep > 1 && c->num_experts % ep)
        return k3c_errorf("ep shard: ep %d does not divide the %d routed experts", ep, c->num_experts);
    if (ep > 1 && tp > 1 && ep % tp)
        return k3c_errorf("ep shard: ep %d with tp %d: the expert ranks span whole TP groups", ep, tp);
    if (full->tp_size > 1) return k3c_errorf("tp shard: the model is already a shard (rank %d of %d)", full->tp_rank, full->tp_size);
    if (full->pp_size > 1 || full->ep_size > 1)
        return k3c_errorf("shard: the model is already a shard (pp stage %d of %d, ep rank %d of %d)", full->pp_stage,
                          full->pp_size, full->ep_rank, full->ep_size);
    k3c_model *m = calloc(1, sizeof *m);
    if (!m) return k3c_errorf_kind(K3C_ERROR_OOM, "tp shard: out of host memory");
    m->tp_rank = rank;
    m->tp_size = tp;
    /* a device-synthetic model's shard is one too: its tensors ranges of the model's reservation (never read on
     * the host), generated by the device backend from the seed and each tensor's name, so a rank makes only
     * its own part (values of their own, not the whole model's slice: for benchmarks) */
    m->device_synthetic = full->device_synthetic;
    m->synthetic_seed = full->synthetic_seed;
    shard s = {m, rank, tp, 0, c->num_layers, 0, c->num_experts, 1, 1, ep > 1 && tp > 1};
    if (pp > 1) {
        k3c_layout_stage_layers(c->num_layers, pp, stage, &s.first, &s.end);
        s.first_stage = stage == 0;
        s.last_stage = stage == pp - 1;
        m->pp_stage = stage;
        m->pp_size = pp;
        m->layer_first = s.first;
        m->layer_end = s.end;
    }
    if (ep > 1) {
        k3c_layout_rank_experts(c->num_experts, ep, er, &s.e0, &s.e1);
        m->ep_rank = er;
        m->ep_size = ep;
        m->expert_first = s.e0;
        m->expert_end = s.e1;
    }
    if (build(&s, full) != K3C_OK) {
        if (pp > 1 || ep > 1) k3c_error_context("shard (tp rank %d of %d, pp stage %d of %d, ep rank %d of %d): ", rank,
                                                tp, stage, pp, er, ep);
        else k3c_error_context("tp shard (rank %d of %d): ", rank, tp);
        k3c_model_shard_free(m);
        return K3C_ERR;
    }
    *out = m;
    return K3C_OK;
}

void k3c_model_shard_free(k3c_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    for (int l = 0; m->weights.layers && l < m->weights.num_layers; l++) free(m->weights.layers[l].moe.experts);
    free(m->weights.layers);
    k3c_inventory_free(&m->inventory);
    k3c_config_free(&m->config);
    free(m);
}
