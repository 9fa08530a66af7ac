/* The dense MLP provider of the executor's step (decode/providers/provider.h): gate and up as one grouped
 * launch, the gated activation, down into F (the part's one addend). */
#ifdef K3C_HAVE_CUDA

#include <stddef.h>

#include "cuda/elementwise.h"
#include "decode/executor_cuda_internal.h"

static int dense_mlp_record(const k3c_provider *p, const k3c_exec_rec *s, k3c_provider_out *out) {
    k3c_decode_cuda *x = p->x;
    int T = s->T;
    const k3c_layer_weights *lw = &x->m->weights.layers[p->layer];
    out->a1 = x->F;
    out->a2 = NULL;
    k3c_exec_group gu = {0}; /* gate and up in one launch */
    k3c_exec_group_add(x, &gu, &lw->mlp.gate, x->x, x->ga, 1);
    k3c_exec_group_add(x, &gu, &lw->mlp.up, x->x, x->gu, 1);
    P_TRY("mlp gate/up (group)", k3c_exec_group_run(x, &gu, T));
    int n = T * lw->mlp.gate.rows;
    P_TRY("mlp act", k3c_cuda_gated_act(x->act, x->ga, n, x->gu, n, 1, n, 1, x->ga, x->st));
    STAMP_BYTES(3.0 * 4 * n);
    L_TRY(k3c_exec_mm_rowpar(x, "mlp down", &lw->mlp.down, x->ga, T, x->F)); /* + its TP sum */
    return K3C_OK;
}

static int dense_mlp_build(k3c_provider *p) {
    (void)p; /* nothing derived: the launches read the loaded weights in place (gate, up, down) */
    return K3C_OK;
}
static int dense_mlp_reload(k3c_provider *p) {
    (void)p;
    return K3C_OK;
}
static void dense_mlp_free(k3c_provider *p) { (void)p; }

const k3c_provider_kind k3c_provider_dense_mlp = {"dense_mlp", dense_mlp_build, dense_mlp_record, dense_mlp_reload,
                                                  dense_mlp_free};

#endif
