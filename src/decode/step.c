/* The executor's recorded step (decode/executor_cuda_internal.h): the stock forward's layer loop
 * (stock/forward.c) as the CUDA backend's launches on the executor's fixed buffers, each layer part recorded
 * by its provider (decode/providers/), the residual stream's adds fused into the launch that reads it next. */
#ifdef K3C_HAVE_CUDA

#include <stdlib.h>

#include "cuda/attnres.h"
#include "cuda/check.h"
#include "cuda/elementwise.h"
#include "decode/executor_cuda_internal.h"

/* ---- the residual stream and the epilogue fusions (docs/kernels.md, "The executor: fused epilogues") ----
 * r.P holds the residual (plain models) or the AttnRes prefix (r.home = res[nb], where the current block's
 * prefix must be when the block closes: the Mix source array names it there; P NULL: a block just began and
 * its prefix is empty), and r.a1 non-NULL means an add is still owed to it: the residual is really
 * r(P + v), v = a2 ? r(a1 + a2) : a1 (P NULL: v itself), r the bf16 rounding, exactly what the stock path's
 * "moe out" and "residual add" (or the block start's copy) would have stored. The launch that reads the
 * residual next applies it and stores the sum: without AttnRes the next rmsnorm in place
 * (k3c_cuda_add_rmsnorm), with AttnRes the next Mix, into the prefix's other buffer
 * (k3c_cuda_attnres_mix_pending: the Mix's blocks of a row all read the old prefix, so none may overwrite
 * it). The other buffer of block nb's prefix alternates between res_alt and res[nb]: the first store of a
 * block goes to res_alt and a block has an even number of them (the Mix after its first attention, then
 * per later layer two, then the Mix that closes it: 2 * layers), so the last lands in res[nb], where the
 * source array has it; k3c_exec_record_step checks that at every block start. An aux stream point that
 * needs the residual of layer l materialized calls resid_settle there (the separate launches, that layer
 * only).
 * K3C_EXEC_FUSE=0 (a diagnostic for A/B runs, read at capture) settles every add at once instead: the
 * step's launches before these fusions. */
typedef struct resid {
    float *P, *home;
    const float *a1, *a2;
} resid;

static int fuse_epilogues(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("K3C_EXEC_FUSE");
        on = !(v && v[0] == '0');
    }
    return on;
}

/* The owed add as its own launches (the unfused step's "moe out", "residual add", block-start copy). */
static int resid_settle(k3c_decode_cuda *x, resid *r, int T) {
    if (!r->a1) return K3C_OK;
    size_t TD = (size_t)T * x->c->hidden_size;
    const float *v = r->a1;
    if (r->a2) {
        P_TRY("moe out", k3c_cuda_add(r->a1, r->a2, TD, 1, x->F, x->st));
        STAMP_BYTES(3.0 * 4 * TD);
        v = x->F;
    }
    if (!r->P) {
        K3C_CUDA_TRY(cudaMemcpyAsync(r->home, v, TD * sizeof(float), cudaMemcpyDeviceToDevice, x->st));
    } else { /* into home (the same sum wherever it lands): the unfused Mix reads the prefix there */
        P_TRY("residual add", k3c_cuda_add(r->P, v, TD, 1, r->home, x->st));
        STAMP_BYTES(3.0 * 4 * TD);
    }
    r->P = r->home;
    r->a1 = r->a2 = NULL;
    return K3C_OK;
}

/* The prefix into home, where the Mix source array names it, when a block closes. Without aux streams the
 * fused stores of a block are even in number and the last already landed there (resid above); a settle
 * for an aux stream can leave it in res_alt, and then one copy moves it. */
static int resid_home(k3c_decode_cuda *x, resid *r, int T) {
    if (!r->P || r->P == r->home) return K3C_OK;
    size_t TD = (size_t)T * x->c->hidden_size;
    K3C_CUDA_TRY(cudaMemcpyAsync(r->home, r->P, TD * sizeof(float), cudaMemcpyDeviceToDevice, x->st));
    r->P = r->home;
    return K3C_OK;
}

/* The residual is owed v = a2 ? r(a1 + a2) : a1 (a layer's attention or FFN output). */
static int resid_owe(k3c_decode_cuda *x, resid *r, const float *a1, const float *a2, int T) {
    r->a1 = a1;
    r->a2 = a2;
    return fuse_epilogues() ? K3C_OK : resid_settle(x, r, T);
}

/* y = rmsnorm(residual) with weight w (plain models: a layer's input or post-attention norm, or the final
 * norm), applying the owed add in the same launch. */
static int rec_norm(k3c_decode_cuda *x, resid *r, const float *w, int T, float *y, int final) {
    const k3c_config *c = x->c;
    int D = c->hidden_size;
    if (!r->P) return k3c_errorf("decode executor: rmsnorm of an empty residual");
    if (!r->a1) {
        P_TRY(final ? "final norm" : "rmsnorm",
              k3c_cuda_rmsnorm(r->P, D, WPTR(w), T, D, c->rms_norm_eps, 1, y, D, x->st));
        STAMP_BYTES(4.0 * (2.0 * T + 1) * D);
        return K3C_OK;
    }
    const char *op = r->a2 ? (final ? "moe out + residual add + final norm" : "moe out + residual add + rmsnorm")
                           : (final ? "residual add + final norm" : "residual add + rmsnorm");
    P_TRY(op, k3c_cuda_add_rmsnorm(r->P, r->a1, r->a2, WPTR(w), T, D, c->rms_norm_eps, 1, y, x->st));
    STAMP_BYTES(4.0 * ((r->a2 ? 5.0 : 4.0) * T + 1) * D); /* P, a1, (a2) in, P and y out */
    r->a1 = r->a2 = NULL;
    return K3C_OK;
}

/* AttnRes Mix of the blocks res[0..nb-1] and the prefix (see the loop below), applying an owed add to the
 * prefix in the same launch (resid above). */
static const float *rec_mix(k3c_decode_cuda *x, resid *r, int nb, const float *proj, const float *norm, int T,
                            int *rc) {
    const k3c_config *c = x->c;
    const float *const *src = (const float *const *)x->res_dev;
    if (nb == 0) { /* the prefix alone: the Mix is the identity, as in the stock path */
        *rc = resid_settle(x, r, T);
        return r->P;
    }
    if (!r->a1) {
        if ((*rc = resid_home(x, r, T)) != K3C_OK) return NULL;
        int ps = k3c_op_profile_begin(x->prof, "attnres mix", x->st);
        k3c_exec_stamp_op_begin(x, "attnres mix");
        *rc = k3c_cuda_attnres_mix(src, nb + 1, T, c->hidden_size, WPTR(proj), WPTR(norm), c->rms_norm_eps, 1, x->a_in,
                                   x->st);
        k3c_exec_stamp_op_end(x);
        STAMP_BYTES(4.0 * ((nb + 2.0) * T + 2) * c->hidden_size); /* nb + 1 sources in, the mix out, proj, norm */
        k3c_op_profile_end(x->prof, ps, x->st);
        return x->a_in;
    }
    float *dst = r->P == x->res_alt ? r->home : x->res_alt;
    const char *op = r->a2 ? "attnres mix + moe out + residual add" : "attnres mix + residual add";
    int ps = k3c_op_profile_begin(x->prof, op, x->st);
    k3c_exec_stamp_op_begin(x, op);
    *rc = k3c_cuda_attnres_mix_pending(src, nb, r->P, r->a1, r->a2, 1, dst, T, c->hidden_size, WPTR(proj), WPTR(norm),
                                       c->rms_norm_eps, 1, x->a_in, x->st);
    k3c_exec_stamp_op_end(x);
    /* nb sources, the prefix and the owed addends in; the new prefix and the mix out; proj, norm */
    STAMP_BYTES(4.0 * ((nb + (r->a2 ? 5.0 : 4.0)) * T + 2) * c->hidden_size);
    k3c_op_profile_end(x->prof, ps, x->st);
    r->P = dst;
    r->a1 = r->a2 = NULL;
    return x->a_in;
}

/* The aux streams entering layer L (stock/forward.c aux_tap): P, the prefix (or residual) entering layer L,
 * copied for every stream tapping L. Every row of an executor step is a logits row, so the stock path's
 * row gather is the identity and this copy gives the same bits. Called where stock taps: after the
 * embedding (L = 0) and after layer L - 1's FFN add, which the recorded step leaves unfused (resid_settle) at such
 * a layer so that the updated prefix is stored for the copy (vLLM: bind_aux on the AttnRes entering an
 * aux layer). */
static int aux_taps(const k3c_decode_cuda *x, int L) {
    for (int j = 0; j < x->v.num_aux; j++)
        if (x->v.aux_layers[j] == L) return 1;
    return 0;
}
static int rec_aux(k3c_decode_cuda *x, int L, const float *P, int T) {
    size_t TD = (size_t)T * x->c->hidden_size;
    for (int j = 0; j < x->v.num_aux; j++)
        if (x->v.aux_layers[j] == L)
            K3C_CUDA_TRY(cudaMemcpyAsync(x->aux_dev + (size_t)j * TD, P, TD * sizeof(float), cudaMemcpyDeviceToDevice,
                                         x->st));
    return K3C_OK;
}

int k3c_exec_record_step(k3c_decode_cuda *x, int T, int q) {
    const k3c_config *c = x->c;
    const k3c_weights *W = &x->m->weights;
    k3c_exec_rec s = {x, T, q, T / q};
    int D = c->hidden_size, attnres = c->attn_res_block_size > 0, nb = 0, rc = K3C_OK;
    resid r = {x->res[0], x->res[0], NULL, NULL};
    k3c_provider_out o;
    P_TRY("embed", k3c_cuda_embed(WPTR(W->embed.w), W->embed.rows, W->embed.cols, (const int *)(x->meta_d + x->off_ids), T,
                                  r.P, x->st));
    STAMP_BYTES(6.0 * T * D);
    /* TP: the vocabulary-parallel embedding (stock/forward.c): the ids are this rank's rows (fill_meta), -1
     * for another rank's tokens, whose rows are -0.0; the sum (unrounded: exactly one rank adds a value) */
    L_TRY(k3c_exec_tp_sum(x, r.P, (size_t)T * D, 0));
    L_TRY(rec_aux(x, 0, r.P, T));
    for (int l = 0; l < c->num_layers; l++) {
        const k3c_layer_weights *lw = &W->layers[l];
        if (attnres) {
            const float *a_in = rec_mix(x, &r, nb, lw->attn_res_proj, lw->attn_res_norm, T, &rc);
            L_TRY(rc);
            if (k3c_config_is_block_start(c, l)) { /* the prefix becomes block nb; the next one starts empty */
                L_TRY(resid_home(x, &r, T));
                nb++;
                r.home = x->res[nb];
                r.P = NULL;
            }
            P_TRY("rmsnorm", k3c_cuda_rmsnorm(a_in, D, WPTR(lw->input_norm), T, D, c->rms_norm_eps, 1, x->x, D, x->st));
            STAMP_BYTES(4.0 * (2.0 * T + 1) * D);
        } else {
            L_TRY(rec_norm(x, &r, lw->input_norm, T, x->x, 0)); /* + the previous layer's FFN add */
        }
        L_TRY(x->attn[l].kind->record(&x->attn[l], &s, &o)); /* KDA or MLA: o.a1 = A */
        L_TRY(resid_owe(x, &r, o.a1, o.a2, T));
        if (attnres) {
            const float *m_in = rec_mix(x, &r, nb, lw->mlp_res_proj, lw->mlp_res_norm, T, &rc);
            L_TRY(rc);
            P_TRY("rmsnorm", k3c_cuda_rmsnorm(m_in, D, WPTR(lw->post_norm), T, D, c->rms_norm_eps, 1, x->x, D, x->st));
            STAMP_BYTES(4.0 * (2.0 * T + 1) * D);
        } else {
            L_TRY(rec_norm(x, &r, lw->post_norm, T, x->x, 0)); /* + the attention's add */
        }
        L_TRY(x->ffn[l].kind->record(&x->ffn[l], &s, &o)); /* MoE (routed, shared) or dense MLP */
        L_TRY(resid_owe(x, &r, o.a1, o.a2, T));
        if (aux_taps(x, l + 1)) { /* the stream needs the residual stored here: this layer's add unfused */
            L_TRY(resid_settle(x, &r, T));
            L_TRY(rec_aux(x, l + 1, r.P, T));
        }
    }
    /* every row is a logits row (decode: a request's only row; verify: all of them), so the stock path's
     * row gather is the identity; final norm in the same kernel and order as stock (stock/forward.c), read
     * straight from the Mix's output or the residual (the stock path's copy to G first changes no value) */
    if (attnres) {
        const float *h = rec_mix(x, &r, nb, W->out_res_proj, W->out_res_norm, T, &rc);
        L_TRY(rc);
        P_TRY("final norm", k3c_cuda_rmsnorm(h, D, WPTR(W->final_norm), T, D, c->rms_norm_eps, 1, x->G, D, x->st));
        STAMP_BYTES(4.0 * (2.0 * T + 1) * D);
    } else {
        L_TRY(rec_norm(x, &r, W->final_norm, T, x->G, 1));
    }
    if (!x->tp) {
        P_TRY("lm head", k3c_exec_mm(x, &W->lm_head, x->G, T, x->logits, 0));
        return K3C_OK;
    }
    /* TP: this rank's [T, V / tp] part, every rank's gathered ([tp, T, V / tp], the stock path's gather over
     * the same communicator), then each part into its columns of the [T, V] logits (the stock path's
     * per-row downloads, here one strided copy per rank inside the graph) */
    size_t Vl = (size_t)c->vocab_size, part = (size_t)T * Vl;
    P_TRY("lm head", k3c_exec_mm(x, &W->lm_head, x->G, T, x->lm_part, 0));
    L_TRY(k3c_exec_tp_gather(x, x->lm_part, x->gather, part));
    for (int k = 0; k < x->tp_size; k++)
        K3C_CUDA_TRY(cudaMemcpy2DAsync(x->logits + (size_t)k * Vl, (size_t)x->vocab * sizeof(float),
                                       x->gather + (size_t)k * part, Vl * sizeof(float), Vl * sizeof(float),
                                       (size_t)T, cudaMemcpyDeviceToDevice, x->st));
    return K3C_OK;
}

#endif
