/* The KDA attention provider of the executor's step (decode/providers/provider.h): its packed input
 * projections as two grouped launches, the fused KDA decode kernel (or the stock launches past a few
 * blocks per SM), the verify copies of the commit fold's inputs, and o_proj into A. */
#ifdef K3C_HAVE_CUDA

#include <stddef.h>

#include "cuda/decode_copy.h"
#include "cuda/kda.h"
#include "decode/executor_cuda_internal.h"

static int kda_record(const k3c_provider *p, const k3c_exec_rec *s, k3c_provider_out *out) {
    k3c_decode_cuda *x = s->x;
    int l = p->layer;
    const k3c_config *c = x->c;
    const k3c_kda_weights *w = &x->m->weights.layers[l].kda;
    int T = s->T, H = c->kda_num_heads, dk = c->kda_head_dim, Wc = c->kda_conv_kernel;
    int k = x->kda_ord[l];
    /* every projection of the normed input in one launch (q, k, v, the decay gate's and the output gate's
     * low-rank halves, beta), then the two up-projections of the low-rank halves in another */
    k3c_exec_group in = {0}, up = {0};
    k3c_exec_group_add(x, &in, &w->q_proj, x->x, x->kq, 1);
    k3c_exec_group_add(x, &in, &w->k_proj, x->x, x->kk, 1);
    k3c_exec_group_add(x, &in, &w->v_proj, x->x, x->kv, 1);
    k3c_exec_group_add(x, &in, &w->f_a, x->x, x->klow, 1);
    k3c_exec_group_add(x, &in, &w->b_proj, x->x, x->kb, 1);
    k3c_exec_group_add(x, &up, &w->f_b, x->klow, x->kf, 1);
    if (w->g_proj.w) {
        k3c_exec_group_add(x, &in, &w->g_proj, x->x, x->kz, 1);
    } else {
        k3c_exec_group_add(x, &in, &w->g_a, x->x, x->klow2, 1);
        k3c_exec_group_add(x, &up, &w->g_b, x->klow2, x->kz, 1);
    }
    P_TRY("kda in-proj (group)", k3c_exec_group_run(x, &in, T));
    size_t P = (size_t)H * dk;
    if (s->q > 1) { /* verify: pre-conv rows to the slot's store (the kernels read the committed state and
                     * window in place and write neither back: read_only segments, fill_meta) */
        P_TRY("kda verify copies", k3c_cuda_copy_batch((k3c_cuda_copy *)(x->meta_d + x->off_pre) + (size_t)k * x->arows * PRE_COPIES,
                                  s->b * PRE_COPIES, x->st));
        STAMP_BYTES(2.0 * 4 * T * PRE_COPIES * P); /* read + write */
    }
    P_TRY("kda up-proj (group)", k3c_exec_group_run(x, &up, T));
    /* the fused provider: conv x3 + windows, gate and beta, q/k norms, the delta rule on the request's state,
     * the gated norm, in one kernel, bit for bit the stock op sequence (cuda/kda.h); for many requests those
     * separate launches instead (faster there: cuda/kda.cu k3c_cuda_kda_decode_fused_prefer), which also
     * write the pre-norm o */
    int fused = k3c_cuda_kda_decode_fused_prefer(s->b, H, dk, dk);
    P_TRY(fused ? "kda fused" : "kda separate", (fused ? k3c_cuda_kda_decode_fused : k3c_cuda_kda_decode_separate)(
        k3c_exec_segs(x, l), s->b, T, H, dk, dk, Wc, x->kq, x->kk, x->kv, WPTR(w->q_conv), WPTR(w->k_conv),
        WPTR(w->v_conv), x->kf, x->kb, WPTR(w->a_log), WPTR(w->dt_bias), c->kda_has_lower_bound,
        c->kda_gate_lower_bound, x->kz, WPTR(w->o_norm), c->rms_norm_eps, x->silu_gate, 1, x->cq, x->ck, x->cv,
        x->kg, x->kbeta, fused ? NULL : x->ko, x->ky, x->st));
    /* the f32 state and the conv window read and written, ~10 [T, P] activations in and out, the taps */
    STAMP_BYTES(2.0 * 4 * s->b * ((double)H * dk * dk + 3.0 * (Wc - 1) * P) + 4.0 * T * P * (fused ? 10 : 11) +
                4.0 * P * (3 * Wc + 1));
    /* verify: ck, cv, kg, kbeta (normed k, conv v, decay, beta) to the slot's store for the commit fold; the
     * fused kernel writes each of them once and never rewrites them, so copying after it is copying what the
     * stock path copies before its recurrence */
    if (s->q > 1) {
        P_TRY("kda verify copies", k3c_cuda_copy_batch((k3c_cuda_copy *)(x->meta_d + x->off_post) + (size_t)k * x->arows * POST_COPIES,
                                  s->b * POST_COPIES, x->st));
        STAMP_BYTES(2.0 * 4 * T * (3 * P + H));
    }
    L_TRY(k3c_exec_mm_rowpar(x, "kda o_proj", &w->o_proj, x->ky, T, x->A)); /* + its TP sum */
    out->a1 = x->A;
    out->a2 = NULL;
    return K3C_OK;
}

static int kda_build(k3c_provider *p) {
    (void)p; /* nothing derived: the launches read the loaded weights in place (q/k/v/f/b/g projections, conv taps, A_log, dt_bias, o_norm) */
    return K3C_OK;
}
static int kda_reload(k3c_provider *p) {
    (void)p;
    return K3C_OK;
}
static void kda_free(k3c_provider *p) { (void)p; }

const k3c_provider_kind k3c_provider_kda = {"kda", kda_build, kda_record, kda_reload, kda_free};

#endif
