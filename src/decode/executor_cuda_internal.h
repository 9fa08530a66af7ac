/* The CUDA executor's state and launch helpers, shared by its files (not an interface: decode/executor_cuda.h
 * is). executor_cuda.c builds the state, prepares the caches, captures and replays; step.c records the layer
 * loop; the providers (decode/providers/) record each layer part's launches on the buffers named here.
 * Only for CUDA builds (K3C_HAVE_CUDA). */
#ifndef K3C_DECODE_EXECUTOR_CUDA_INTERNAL_H
#define K3C_DECODE_EXECUTOR_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda/backend_cuda.h"
#include "cuda/backend_kernels.h"
#include "cuda/gemm.h"
#include "cuda/kda.h"
#include "cuda/op_profile.h"
#include "cuda/router.h"
#include "cuda/stamp.h"
#include "decode/executor_cuda.h"
#include "decode/prepared.h"
#include "decode/providers/provider.h"
#include "decode/stamp_report.h"
#include "util/error.h"

#define PMAX K3C_PREPARED_MAX
#define QMAX K3C_PREPARED_Q_MAX
#define PRE_COPIES 3  /* per verifying request per KDA layer: pre-conv q, k, v rows */
#define POST_COPIES 4 /* after the fused KDA kernel: normed k, v, g, beta rows */
typedef struct k3c_exec_stamps k3c_exec_stamps; /* K3C_CUDA_PROFILE=3: block stamps (executor_cuda.c) */

struct k3c_decode_cuda {
    k3c_decode_env v;
    const k3c_model *m;
    const k3c_config *c;
    cudaStream_t st;
    k3c_cuda_gemm gemm;
    int gemm_ready;
    void *gemm_ws;
    uint16_t *xbf;
    k3c_cuda_act act;
    k3c_cuda_router router;
    int silu_gate, nres, nkda, *kda_ord; /* kda_ord[l]: ordinal of KDA layer l, -1 for MLA */

    /* device activations and scratch, one allocation */
    void *dev;
    float **res, **res_dev; /* host array of the AttnRes buffers; its device copy (Mix source arrays) */
    float *res_alt;         /* AttnRes: the prefix's other buffer (resid below); NULL without AttnRes */
    float *a_in, *x, *A, *F, *G, *logits;
    float *kq, *kk, *kv, *cq, *ck, *cv, *kf, *kg, *ko, *kz, *ky, *klow, *klow2, *kb, *kbeta;
    float *mqa, *mq, *mlat, *mo, *mg, *ga, *gu;
    float *q_abs, *o_lat, *rlog, *wts, *z, *h, *part, *r, *rup, *sa, *su, *sh;
    float *mla_part; /* MLA attention's position splits (cuda/mla.h), as the backend's: the same bits */
    size_t mla_part_floats;
    int *idx;
    uint64_t *keys_d; /* [K3C_ARGMAX_KEYS_MAX] the greedy arg-max's keys of row parts (run_argmax, cuda/sample.h) */
    uint64_t *keys_h; /* [K3C_ARGMAX_KEYS_MAX] page-locked: keys_d downloaded at the copy engine's rate */
    /* aux streams (engine option aux_layers, read at build): aux_dev [num_aux, PMAX, D]; a step of T rows
     * (every row a logits row) writes stream j at j * T * D, the engine's host layout, downloaded whole */
    float *aux_dev;

    /* metadata: pinned host block and its device mirror, same layout (offsets below), copied whole per step */
    uint8_t *meta_h, *meta_d;
    size_t meta_bytes, off_ids, off_slots, off_aoff, off_alen, off_tab, off_segs, off_pre, off_post;
    k3c_op_profile *prof;             /* NULL unless K3C_CUDA_PROFILE; times eager profiled steps only */
    int profile_next;                 /* the next replayable step runs eagerly, timed op by op */
    double host_ms[2];                /* with prof: host phases of run_cb (k3c_decode_cuda_host_profile) */
    k3c_exec_stamps *stamp;           /* K3C_CUDA_PROFILE=3: block stamps (executor_cuda.c); NULL otherwise */

    int kv_prepared, eager, mbr, bs;
    /* A tensor-parallel rank (world size > 1) whose providers are not prepared for TP: nothing is built, the
     * plan table sends every step to the stock forward (decode/plan.h K3C_STOCK_TP_UNPREPARED). */
    int tp_unprepared;
    /* A TP-prepared rank (world size > 1 over the CUDA mailbox): tp its communicator (NULL at world size 1),
     * the step's collectives launched on st inside the graphs (k3c_exec_tp_sum, the LM head's gather);
     * vocab the whole vocabulary (c->vocab_size is the shard's part), the width of logits; lm_part [PMAX, V / tp]
     * this rank's LM head rows, gather [tp, PMAX, V / tp] every rank's, laid into logits' columns. */
    struct k3c_comm *tp;
    int tp_rank, tp_size, vocab;
    /* tp_push: where a row-parallel product's epilogue writes this rank's part into the peers' mailbox slots
     * (the pushed one-shot, comm/mailbox.h; launch.c k3c_exec_mm_rowpar); fused_rowpar / fused_norm: the
     * fused row-parallel products and fused MoE reduce + norms recorded so far, fused_round the rounded sums
     * made by one launch (k3c_exec_tp_sum: the shared expert's; k3c_decode_cuda_tp_fusions). */
    k3c_cuda_fanout tp_push;
    long fused_rowpar, fused_norm, fused_round;
    float *lm_part, *gather;
    /* The wide route (executor_cuda.h; the seed's run_wide): the engine's stock forward run with the attention
     * providers in place of its attention (stock/forward.h k3c_forward_attention, filled by wide_attn). arows:
     * the rows the attention providers' buffers and the step metadata hold, max(PMAX, wide_rows), the stride
     * of the per-layer metadata arrays (k3c_exec_segs, the verify copies); wide_rows: the wide route's cap
     * (0: no wide route: TP > 1, or no stock forward in the env); dep: a DEP rank (env.ep), whose every
     * decode and uniform verify step up to wide_rows is wide and which has no graphs and no feed-forward
     * providers (its MoE is the stock EP exchange). */
    int arows, wide_rows, dep;
    int wide_q;       /* the wide step in progress: its q (wide_begin) */
    long wide_steps;  /* wide steps run */
    k3c_forward_attention wide_attn;
    cudaGraphExec_t graph[PMAX + 1][QMAX + 1];
    int num_captured;
    long replays;
    int batches[K3C_PREPARED_NUM_BATCHES];
    k3c_decode_executor ex;
    /* one provider per layer part (decode/providers/provider.h): attn[l] KDA or MLA, ffn[l] MoE or dense MLP */
    k3c_provider *attn, *ffn;
};

static inline size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Device address of a backbone weight, or an error naming it. */
#define DW(x, host, out, what)                                                                                     \
    do {                                                                                                           \
        (out) = k3c_backend_cuda_weight((x)->v.be, (host));                                                        \
        if (!(out)) return k3c_errorf("decode executor: weight %s (host %p) has no device copy", (what),          \
                                      (const void *)(host));                                                     \
    } while (0)

/* ---- the recorded step (step.c): the stock forward's layer loop (stock/forward.c) as the CUDA backend's
 * launches, on this executor's fixed buffers and metadata. T = rows, b = T / q requests of q rows each. ---- */

typedef struct k3c_exec_rec {
    k3c_decode_cuda *x;
    int T, q, b;
} k3c_exec_rec;

#define L_TRY(call) K3C_TRY(call)

/* K3C_CUDA_PROFILE=3, while a shape is captured (executor_cuda.c): the plan being recorded
 * (decode/stamp_report.h), NULL otherwise (always NULL without the stamps). */
k3c_stamp_plan *k3c_exec_stamp_plan(const k3c_decode_cuda *x);
/* An op of the plan begins / ends, its stamped launches the kernel nodes it added less cuBLASLt's
 * (cuda/stamp.h). No-ops unless a plan is recorded. */
void k3c_exec_stamp_op_begin(k3c_decode_cuda *x, const char *op);
void k3c_exec_stamp_op_end(k3c_decode_cuda *x);
/* The routing rows MoE layer l writes: x->idx, or with the stamps its own rows (kept for the report). */
int *k3c_exec_moe_idx(k3c_decode_cuda *x, int l);
/* The bytes an op moves (weights + activations), added to the plan's open or last op; the expression is
 * evaluated only while a plan is recorded. */
#define STAMP_BYTES(bytes)                                                                                         \
    do {                                                                                                           \
        k3c_stamp_plan *sp_ = k3c_exec_stamp_plan(x);                                                              \
        if (sp_) k3c_stamp_plan_bytes(sp_, (double)(bytes));                                                       \
    } while (0)

/* A launcher call of the recorded step, bracketed by the executor's op profile (cuda/op_profile.h: a no-op
 * unless K3C_CUDA_PROFILE is set, and never while the stream captures, so only an eager profiled step,
 * k3c_decode_cuda_profile_next, is timed) and, at capture, by the stamp plan. x: the executor, in scope at
 * every use. */
#define P_TRY(op, call)                                                                                            \
    do {                                                                                                           \
        int ps_ = k3c_op_profile_begin(x->prof, (op), x->st);                                                       \
        k3c_exec_stamp_op_begin(x, (op));                                                                          \
        int rc_ = (call);                                                                                          \
        k3c_exec_stamp_op_end(x);                                                                                  \
        k3c_op_profile_end(x->prof, ps_, x->st);                                                                   \
        if (rc_ != K3C_OK) return rc_;                                                                             \
    } while (0)
#define WPTR(host) k3c_backend_cuda_weight(x->v.be, (host))

/* Records the whole step of T rows, q per request (step.c); the capture and the profiled runs call it. */
int k3c_exec_record_step(k3c_decode_cuda *x, int T, int q);

/* ---- launch helpers (launch.c) ---- */

/* y = W in over T rows, the backend's product (mm of the stock path); an error when W has no device copy. */
int k3c_exec_mm(k3c_decode_cuda *x, const k3c_mat *W, const float *in, int T, float *y, int round);

/* Tensor parallel (x->tp; no-ops without): buf [n] = the sum over the ranks of their buf (the mailbox on the
 * executor's stream: f32, rank 0 first, as the stock forward's tp_sum over the same communicator), rounded
 * to bf16 after it when round (the stock path's be->round: the same rounding; inside the one-shot's launch
 * where the sum is a one-shot, else the backend's rounding pass after it). */
int k3c_exec_tp_sum(k3c_decode_cuda *x, float *buf, size_t n, int round);
/* Tensor parallel (x->tp set): dst [tp, n] = every rank's src [n], in rank order (the LM head's gather). */
int k3c_exec_tp_gather(k3c_decode_cuda *x, const float *src, float *dst, size_t n);
/* A row-parallel product (o_proj, a down projection; op: its name in the profile), stock/forward.c
 * matmul_rowpar: rnd(W in) at world size 1; under TP this rank's part unrounded, then the rounded sum of the
 * ranks' parts. Under TP, where the product is a streaming GEMV (T <= 8, aligned) and the sum a one-shot: the
 * pushed one-shot (the GEMV's epilogue writes the part into every peer's slot, then the mailbox's finish
 * sums and rounds), the same bits in one launch fewer; else the product, the all-reduce and the rounding. */
int k3c_exec_mm_rowpar(k3c_decode_cuda *x, const char *op, const k3c_mat *W, const float *in, int T, float *y);
/* buf [T, n] = rmsnorm(buf, w, eps) rounded to bf16, where under TP buf is first bf16(the sum over the ranks of
 * buf) (stock's moe_tp: the routed experts' sum, its rounding and the latent norm); under TP one mailbox launch
 * where the sum is a one-shot and n a multiple of 4 (comm/mailbox_cuda.h k3c_comm_mailbox_reduce_rmsnorm_on:
 * the same bits), else the all-reduce, the rounding and the backend's rmsnorm (the norm alone without TP). */
int k3c_exec_tp_sum_rmsnorm(k3c_decode_cuda *x, float *buf, int T, int n, const float *w, float eps);

/* The packed projections of a provider: the products that read one step input, or
 * that are otherwise independent, as one grouped launch (cuda/gemm.h k3c_cuda_gemv_group) over the weights
 * where the backend loaded them, so no packed copy exists to rebuild after a reload. Each product's outputs
 * are bitwise those of k3c_exec_mm() on it alone, so the executor still matches the stock path bit for bit. */
#define GROUP_MAX K3C_CUDA_GEMV_GROUP_MAX
typedef struct k3c_exec_group {
    k3c_cuda_gemv_seg seg[GROUP_MAX];
    int n, missing;
} k3c_exec_group;

void k3c_exec_group_add(k3c_decode_cuda *x, k3c_exec_group *g, const k3c_mat *W, const float *in, float *out,
                        int round);
/* K3C_EXEC_GROUP=0 (a diagnostic for A/B runs, read at capture) launches each product on its own instead. */
int k3c_exec_group_run(k3c_decode_cuda *x, const k3c_exec_group *g, int T);

/* The KDA segment descriptors of layer l in the device metadata (fill_meta writes them per step; arows a
 * layer). */
static inline k3c_cuda_seg *k3c_exec_segs(k3c_decode_cuda *x, int l) {
    return (k3c_cuda_seg *)(x->meta_d + x->off_segs) + (size_t)x->kda_ord[l] * x->arows;
}

#endif
