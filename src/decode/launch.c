/* The launch helpers of the executor's recorded step (decode/executor_cuda_internal.h): one product, and
 * several products as one grouped launch. */
#ifdef K3C_HAVE_CUDA

#include <stdlib.h>

#include "decode/executor_cuda_internal.h"

int k3c_exec_mm(k3c_decode_cuda *x, const k3c_mat *W, const float *in, int T, float *y, int round) {
    if (!WPTR(W->w)) return k3c_errorf("decode executor: a [%d x %d] matrix has no device copy", W->rows, W->cols);
    STAMP_BYTES(2.0 * W->rows * W->cols + 4.0 * T * (W->rows + W->cols));
    return k3c_cuda_matmul_bf16_round(&x->gemm, WPTR(W->w), W->rows, W->cols, in, T, y, round, x->st);
}

void k3c_exec_group_add(k3c_decode_cuda *x, k3c_exec_group *g, const k3c_mat *W, const float *in, float *out,
                        int round) {
    const uint16_t *w = WPTR(W->w);
    if (!w || g->n == GROUP_MAX) {
        g->missing = 1;
        return;
    }
    g->seg[g->n++] = (k3c_cuda_gemv_seg){w, W->rows, W->cols, in, out, round};
}

int k3c_exec_group_run(k3c_decode_cuda *x, const k3c_exec_group *g, int T) {
    if (g->missing) return k3c_errorf("decode executor: a grouped projection's matrix has no device copy");
    for (int i = 0; i < g->n; i++) STAMP_BYTES(2.0 * g->seg[i].rows * g->seg[i].cols + 4.0 * T * (g->seg[i].rows + g->seg[i].cols));
    static int grouped = -1;
    if (grouped < 0) {
        const char *v = getenv("K3C_EXEC_GROUP");
        grouped = !(v && v[0] == '0');
    }
    if (grouped) return k3c_cuda_gemv_group(&x->gemm, g->seg, g->n, T, x->st);
    for (int i = 0; i < g->n; i++)
        L_TRY(k3c_cuda_matmul_bf16_round(&x->gemm, g->seg[i].W, g->seg[i].rows, g->seg[i].cols, g->seg[i].x, T,
                                         g->seg[i].y, g->seg[i].round, x->st));
    return K3C_OK;
}

#endif
