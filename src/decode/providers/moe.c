/* The MoE provider of the executor's step (decode/providers/provider.h): the front, the persistent routed
 * experts and the tail; its two addends (routed, shared) are summed by the launch that reads the residual
 * next (decode/step.c). */
#ifdef K3C_HAVE_CUDA

#include <stddef.h>

#include "cuda/elementwise.h"
#include "cuda/moe.h"
#include "decode/executor_cuda_internal.h"

/* cuda_moe of the backend as a front, the persistent experts and a tail (the MoE provider): the
 * front is one grouped launch of every product of the MoE input (router logits in f32, the latent
 * down-projection, the shared expert's gate and up), then routing and the shared activation (one launch);
 * the tail one grouped launch of the latent up-projection and the shared down-projection. Same kernels and
 * reductions per product as the backend, so the same outputs. The sum of the two (the backend's "moe out")
 * is left to the launch that reads the residual next (resid, decode/step.c): *routed and *shared (NULL without shared
 * experts) are the two addends. */
static int rec_moe(k3c_decode_cuda *x, int l, const k3c_moe_weights *w, const float *y, int T, const float **routed_out,
                   const float **shared_out) {
    const k3c_config *c = x->c;
    int E = c->num_experts, K = c->num_experts_per_token;
    int *idx = k3c_exec_moe_idx(x, l); /* K3C_CUDA_PROFILE=3: kept per layer */
    int Rin = k3c_config_expert_in(c), Fm = c->moe_intermediate_size;
    int latent = c->routed_expert_hidden_size > 0, shared = w->shared.gate.w != NULL;
    int Fs = shared ? w->shared.gate.rows : 0;
    cudaStream_t st = x->st;
    const float *bias = c->use_correction_bias && w->correction_bias ? WPTR(w->correction_bias) : NULL;
    k3c_exec_group front = {0}, tail = {0};
    k3c_exec_group_add(x, &front, &w->router, y, x->rlog, 0);
    if (latent) k3c_exec_group_add(x, &front, &w->latent_down, y, x->z, 1);
    if (shared) {
        k3c_exec_group_add(x, &front, &w->shared.gate, y, x->sa, 1);
        k3c_exec_group_add(x, &front, &w->shared.up, y, x->su, 1);
    }
    P_TRY("moe front (group)", k3c_exec_group_run(x, &front, T));
    /* with shared experts, routing and their activation (both read only the front's outputs) in one launch,
     * the bits of the two (cuda/router.h): one launch fewer a layer */
    if (shared)
        P_TRY("moe route + shared act", k3c_cuda_route_act(&x->router, x->rlog, bias, T, idx, x->wts, x->act, x->sa,
                                                           Fs, x->su, Fs, Fs, 1, x->sa, st));
    else
        P_TRY("moe route", k3c_cuda_route(&x->router, x->rlog, bias, T, idx, x->wts, st));
    STAMP_BYTES(4.0 * T * (E + 2 * K + 3.0 * Fs));
    int mx = c->expert_format == K3C_EXPERTS_MXFP4;
    /* under TP (stock/forward.c moe_tp over the backend's moe_partial) the rank's experts' down outputs and
     * their weighted sum stay f32 (K3C_CUDA_MOE_ROUND_HIDDEN: the same kernels, only the stores differ), are
     * summed across the ranks and rounded once */
    P_TRY("moe experts", k3c_cuda_moe_experts(WPTR(w->experts), E, mx, Rin, Fm, Rin, latent ? x->z : y, T, idx, x->wts,
                                              K, x->act, x->tp ? K3C_CUDA_MOE_ROUND_HIDDEN : 1, x->h, x->part, x->r,
                                              st));
    /* the routed experts' bytes come from the step's routing (the report): gate, up and down, each [Fm, Rin],
     * MXFP4 as half a byte a weight and a scale byte per 32, bf16 as 2; activations per pair */
    STAMP_BYTES(4.0 * T * K * (2.0 * Rin + 2.0 * Fm) + 4.0 * T * Rin);
    k3c_stamp_plan *sp = k3c_exec_stamp_plan(x);
    if (sp) k3c_stamp_plan_experts(sp, l, 3.0 * Fm * Rin * (mx ? 0.5 + 1.0 / 32 : 2.0));
    /* the routed sum (under TP) and, with the latent norm, the norm: under TP one mailbox launch where it can
     * (k3c_exec_tp_sum_rmsnorm: the same bits) */
    if (latent && c->latent_moe_use_norm)
        L_TRY(k3c_exec_tp_sum_rmsnorm(x, x->r, T, Rin, WPTR(w->latent_norm), c->rms_norm_eps));
    else
        L_TRY(k3c_exec_tp_sum(x, x->r, (size_t)T * Rin, 1));
    const float *routed = x->r;
    if (latent) {
        k3c_exec_group_add(x, &tail, &w->latent_up, x->r, x->rup, 1);
        routed = x->rup;
    }
    if (shared) k3c_exec_group_add(x, &tail, &w->shared.down, x->sa, x->sh, !x->tp);
    if (tail.n) P_TRY("moe tail (group)", k3c_exec_group_run(x, &tail, T));
    /* The shared part's own TP sum: stock's moe_tp sums the routed latent [T, Rin] and the shared output
     * [T, D] in two reductions (the routed one before the latent norm and up-projection, which need the
     * whole sum), so the same two here, in its order; a single reduction of routed + shared (the layouts
     * note's one all-reduce a layer) would round differently from the stock TP forward. */
    if (shared) L_TRY(k3c_exec_tp_sum(x, x->sh, (size_t)T * c->hidden_size, 1));
    *routed_out = routed;
    *shared_out = shared ? x->sh : NULL;
    return K3C_OK;
}

static int moe_record(const k3c_provider *p, const k3c_exec_rec *s, k3c_provider_out *out) {
    k3c_decode_cuda *x = p->x;
    return rec_moe(x, p->layer, &x->m->weights.layers[p->layer].moe, x->x, s->T, &out->a1, &out->a2);
}

/* The router and the experts must resolve (checked at build, so recording cannot fail on them); nothing is
 * derived from them (the experts are read as the backend repacked them at upload), so a reload only checks
 * that they did not move. */
static int moe_check(const k3c_provider *p) {
    k3c_decode_cuda *x = p->x;
    const k3c_layer_weights *lw = &x->m->weights.layers[p->layer];
    const void *d;
    DW(x, lw->moe.router.w, d, "router");
    DW(x, lw->moe.experts, d, "experts");
    (void)d;
    return K3C_OK;
}
static int moe_build(k3c_provider *p) { return moe_check(p); }
static int moe_reload(k3c_provider *p) { return moe_check(p); }
static void moe_free(k3c_provider *p) { (void)p; }

const k3c_provider_kind k3c_provider_moe = {"moe", moe_build, moe_record, moe_reload, moe_free};

#endif
