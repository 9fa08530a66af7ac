/* The MLA attention provider of the executor's step (decode/providers/provider.h): the projections of the
 * normed input as one grouped launch, the latent norm and cache write, the absorbed attention over the
 * paged latent cache, the output gate and o_proj into A. */
#ifdef K3C_HAVE_CUDA

#include <math.h>
#include <stddef.h>

#include "cuda/elementwise.h"
#include "cuda/mla.h"
#include "decode/executor_cuda_internal.h"

static int mla_record(const k3c_provider *p, const k3c_exec_rec *s, k3c_provider_out *out) {
    k3c_decode_cuda *x = s->x;
    int l = p->layer;
    const k3c_config *c = x->c;
    const k3c_mla_weights *w = &x->m->weights.layers[l].mla;
    int T = s->T, lat = k3c_config_mla_latent(c), Hm = c->num_attention_heads, nope = c->qk_nope_head_dim;
    int rope = c->qk_rope_head_dim, vh = c->v_head_dim, kvl = c->kv_lora_rank;
    /* the projections of the normed input in one launch: the query (or its low-rank half), the latent with
     * its rope part, the output gate */
    int gate = c->mla_use_output_gate && w->g_proj.w;
    k3c_exec_group in = {0};
    if (c->q_lora_rank > 0) k3c_exec_group_add(x, &in, &w->q_a, x->x, x->mqa, 1);
    else k3c_exec_group_add(x, &in, &w->q_proj, x->x, x->mq, 1);
    k3c_exec_group_add(x, &in, &w->kv_a, x->x, x->mlat, 1);
    if (gate) k3c_exec_group_add(x, &in, &w->g_proj, x->x, x->mg, 1);
    P_TRY("mla in-proj (group)", k3c_exec_group_run(x, &in, T));
    if (c->q_lora_rank > 0) {
        P_TRY("mla norms", k3c_cuda_rmsnorm(x->mqa, c->q_lora_rank, WPTR(w->q_a_norm), T, c->q_lora_rank, c->mla_lora_norm_eps, 1,
                               x->mqa, c->q_lora_rank, x->st));
        STAMP_BYTES(4.0 * (2.0 * T + 1) * c->q_lora_rank);
        P_TRY("mla q_b", k3c_exec_mm(x, &w->q_b, x->mqa, T, x->mq, 1));
    }
    P_TRY("mla norms", k3c_cuda_rmsnorm(x->mlat, lat, WPTR(w->kv_a_norm), T, kvl, c->mla_lora_norm_eps, 1, x->mlat, lat, x->st));
    STAMP_BYTES(4.0 * (2.0 * T * lat + kvl));
    void *cache = x->v.kv->layer[l];
    int eb = x->v.be->kv_elem_bytes;
    P_TRY("mla cache write", k3c_cuda_mla_cache_write(x->mlat, (const int *)(x->meta_d + x->off_slots), T, lat, eb, cache, x->st));
    STAMP_BYTES((4.0 + eb) * T * lat);
    const uint16_t *kvb = WPTR(w->kv_b.w);
    float scale = 1.0f / sqrtf((float)(nope + rope));
    P_TRY("mla absorb q", k3c_cuda_mla_absorb_q(kvb, x->mq, T, Hm, nope, rope, vh, kvl, x->q_abs, x->st));
    STAMP_BYTES(2.0 * Hm * nope * kvl + 4.0 * T * Hm * ((nope + rope) + lat)); /* kv_b's nope rows */
    P_TRY("mla attend", k3c_cuda_mla_attend(x->q_abs, (const int *)(x->meta_d + x->off_aoff), (const int *)(x->meta_d + x->off_alen),
                              (const int *)(x->meta_d + x->off_tab), x->bs, cache, eb, T, Hm, kvl, rope, scale,
                              x->o_lat, x->mla_part, x->mla_part_floats, x->st));
    STAMP_BYTES(4.0 * T * Hm * (lat + kvl));
    k3c_stamp_plan *sp = k3c_exec_stamp_plan(x);
    if (sp) k3c_stamp_plan_positions(sp, (double)lat * eb); /* each row's positions */
    P_TRY("mla absorb o", k3c_cuda_mla_absorb_o(kvb, x->o_lat, T, Hm, nope, vh, kvl, 1, x->mo, x->st));
    STAMP_BYTES(2.0 * Hm * vh * kvl + 4.0 * T * Hm * (kvl + vh)); /* kv_b's value rows */
    if (gate) {
        P_TRY("mla gate", k3c_cuda_mul_sigmoid(x->mo, x->mg, (size_t)T * w->g_proj.rows, 1, x->mo, x->st));
        STAMP_BYTES(3.0 * 4 * T * w->g_proj.rows);
    }
    L_TRY(k3c_exec_mm_rowpar(x, "mla o_proj", &w->o_proj, x->mo, T, x->A)); /* + its TP sum */
    out->a1 = x->A;
    out->a2 = NULL;
    return K3C_OK;
}

static int mla_build(k3c_provider *p) {
    (void)p; /* nothing derived: the launches read the loaded weights in place (the absorptions read kv_b where it was loaded) */
    return K3C_OK;
}
static int mla_reload(k3c_provider *p) {
    (void)p;
    return K3C_OK;
}
static void mla_free(k3c_provider *p) { (void)p; }

const k3c_provider_kind k3c_provider_mla = {"mla", mla_build, mla_record, mla_reload, mla_free};

#endif
