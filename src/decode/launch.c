/* The launch helpers of the executor's recorded step (decode/executor_cuda_internal.h): one product, and
 * several products as one grouped launch. */
#ifdef K3C_HAVE_CUDA

#include <stdlib.h>

#include "comm/mailbox_cuda.h"
#include "cuda/elementwise.h"
#include "cuda/stamp.h"
#include "decode/executor_cuda_internal.h"

int k3c_exec_mm(k3c_decode_cuda *x, const k3c_mat *W, const float *in, int T, float *y, int round) {
    if (!WPTR(W->w)) return k3c_errorf("decode executor: a [%d x %d] matrix has no device copy", W->rows, W->cols);
    STAMP_BYTES(2.0 * W->rows * W->cols + 4.0 * T * (W->rows + W->cols));
    return k3c_cuda_matmul_bf16_round(&x->gemm, WPTR(W->w), W->rows, W->cols, in, T, y, round, x->st);
}

/* The mailbox kernels write no block stamps (cuda/stamp.h): counted as foreign launches, as cuBLASLt's. */
static int tp_reduce(k3c_decode_cuda *x, float *buf, size_t n) {
    long fb = k3c_cuda_stamp_foreign_begin(x->st);
    int rc = k3c_comm_mailbox_all_reduce_on(x->tp, buf, n, x->st);
    k3c_cuda_stamp_foreign_end(x->st, fb);
    return rc;
}

static int tp_reduce_round(k3c_decode_cuda *x, float *buf, size_t n) {
    long fb = k3c_cuda_stamp_foreign_begin(x->st);
    int rc = k3c_comm_mailbox_all_reduce_round_on(x->tp, buf, n, x->st);
    k3c_cuda_stamp_foreign_end(x->st, fb);
    return rc;
}

static int tp_reduce_norm(k3c_decode_cuda *x, float *buf, int T, int n, const float *w, float eps) {
    long fb = k3c_cuda_stamp_foreign_begin(x->st);
    int rc = k3c_comm_mailbox_reduce_rmsnorm_on(x->tp, buf, T, n, w, eps, x->st);
    k3c_cuda_stamp_foreign_end(x->st, fb);
    return rc;
}

static int tp_gather(k3c_decode_cuda *x, const float *src, float *dst, size_t bytes) {
    long fb = k3c_cuda_stamp_foreign_begin(x->st);
    int rc = k3c_comm_mailbox_all_gather_on(x->tp, src, dst, bytes, x->st);
    k3c_cuda_stamp_foreign_end(x->st, fb);
    return rc;
}

int k3c_exec_tp_gather(k3c_decode_cuda *x, const float *src, float *dst, size_t n) {
    P_TRY("tp gather", tp_gather(x, src, dst, n * sizeof(float)));
    STAMP_BYTES(4.0 * n * (x->tp_size + 1));
    return K3C_OK;
}

int k3c_exec_tp_sum(k3c_decode_cuda *x, float *buf, size_t n, int round) {
    if (!x->tp || !n) return K3C_OK;
    if (round && k3c_comm_mailbox_one_shot(x->tp, n)) { /* the sum and its rounding in one launch: the same bits */
        P_TRY("tp all-reduce + round", tp_reduce_round(x, buf, n));
        STAMP_BYTES(4.0 * n * (x->tp_size + 1));
        x->fused_round++;
        return K3C_OK;
    }
    P_TRY("tp all-reduce", tp_reduce(x, buf, n));
    STAMP_BYTES(4.0 * n * (x->tp_size + 1)); /* this rank's push, the peers' reads */
    if (round) {
        P_TRY("tp round", k3c_cuda_round_bf16(buf, n, x->st));
        STAMP_BYTES(8.0 * n);
    }
    return K3C_OK;
}

/* The pushed one-shot's finish (its sum rounded). */
static int tp_finish(k3c_decode_cuda *x, float *buf, size_t n) {
    long fb = k3c_cuda_stamp_foreign_begin(x->st);
    int rc = k3c_comm_mailbox_finish_on(x->tp, buf, n, 1, x->st);
    k3c_cuda_stamp_foreign_end(x->st, fb);
    return rc;
}

/* Every rank decides alike (the same T, shapes and one-shot rule; buffers and shards allocated alike); and
 * were one rank to take the fused path where another does not, the finish and the one-shot exchange the
 * same data under the same flags (mailbox_dev.cu mbx_finish), so the calls would still pair, bitwise. */
int k3c_exec_mm_rowpar(k3c_decode_cuda *x, const char *op, const k3c_mat *W, const float *in, int T, float *y) {
    size_t n = (size_t)T * W->rows;
    const uint16_t *w = WPTR(W->w);
    if (x->tp && x->tp_push.n && w && k3c_comm_mailbox_one_shot(x->tp, n) &&
        k3c_cuda_fanout_ok(w, W->rows, W->cols, in, T)) {
        P_TRY(op, k3c_cuda_matmul_bf16_fanout(w, W->rows, W->cols, in, T, y, &x->tp_push, x->st));
        STAMP_BYTES(2.0 * W->rows * W->cols + 4.0 * T * (W->rows + W->cols) + 4.0 * n * (x->tp_size - 1));
        P_TRY("tp all-reduce", tp_finish(x, y, n)); /* flags, wait, the rank-order sum, rounded */
        STAMP_BYTES(4.0 * n * x->tp_size);
        x->fused_rowpar++;
        return K3C_OK;
    }
    P_TRY(op, k3c_exec_mm(x, W, in, T, y, !x->tp));
    return k3c_exec_tp_sum(x, y, n, 1);
}

int k3c_exec_tp_sum_rmsnorm(k3c_decode_cuda *x, float *buf, int T, int n, const float *w, float eps) {
    size_t all = (size_t)T * n;
    if (x->tp && w && n % 4 == 0 && k3c_comm_mailbox_one_shot(x->tp, all)) {
        P_TRY("tp all-reduce + norm", tp_reduce_norm(x, buf, T, n, w, eps));
        STAMP_BYTES(4.0 * all * (x->tp_size + 2) + 4.0 * n);
        x->fused_norm++;
        return K3C_OK;
    }
    L_TRY(k3c_exec_tp_sum(x, buf, all, 1));
    P_TRY("moe latent norm", k3c_cuda_rmsnorm(buf, n, w, T, n, eps, 1, buf, n, x->st));
    STAMP_BYTES(4.0 * (2.0 * T + 1) * n);
    return K3C_OK;
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
