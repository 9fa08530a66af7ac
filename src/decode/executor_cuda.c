/* The specialized decode executor on CUDA (decode/executor_cuda.h says what it is and what is not built
 * yet). Layout of this file: build (buffers, weight addresses), the recorded step (the layer loop as
 * launches on fixed buffers, captured once per shape), prepare_kv / capture, run (metadata fill, replay,
 * logits), the plan table callbacks. */
#include "decode/executor_cuda.h"

#ifdef K3C_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cuda/attnres.h"
#include "cuda/backend_cuda.h"
#include "cuda/backend_kernels.h"
#include "cuda/check.h"
#include "cuda/decode_copy.h"
#include "cuda/elementwise.h"
#include "cuda/gemm.h"
#include "cuda/kda.h"
#include "cuda/mla.h"
#include "cuda/moe.h"
#include "cuda/op_profile.h"
#include "cuda/router.h"
#include "cuda/sample.h"
#include "cuda/measure.h"
#include "cuda/stamp.h"
#include "decode/prepared.h"
#include "decode/stamp_report.h"
#include "util/error.h"

#define PMAX K3C_PREPARED_MAX
#define QMAX K3C_PREPARED_Q_MAX
#define PRE_COPIES 3  /* per verifying request per KDA layer: pre-conv q, k, v rows */
typedef struct stamp_state stamp_state;
#define POST_COPIES 4 /* after the fused KDA kernel: normed k, v, g, beta rows */

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
    stamp_state *stamp;               /* K3C_CUDA_PROFILE=3: block stamps (below); NULL otherwise */

    int kv_prepared, eager, mbr, bs;
    cudaGraphExec_t graph[PMAX + 1][QMAX + 1];
    int num_captured;
    long replays;
    int batches[K3C_PREPARED_NUM_BATCHES];
    k3c_decode_executor ex;
};

/* K3C_CUDA_PROFILE=3 (cuda/stamp.h, decode/stamp_report.h): the next profiled step replays its graph with every
 * stamped kernel writing block stamps; the report maps them to the ops recorded at capture. Every MoE layer
 * routes into its own idx rows (idx_all) so that the step's routing is there to read after it (coverage,
 * expert bytes); each replay is timed with two events for the plain graph's GPU time. */
#define STAMP_EV 32 /* plain replays timed per shape (the last ones) */
struct stamp_state {
    k3c_cuda_stamps *dev;
    k3c_stamp_plan plan[PMAX + 1][QMAX + 1]; /* recorded at each shape's capture */
    k3c_stamp_plan *rec;                     /* the plan being recorded, NULL when not capturing */
    long n0, f0;                             /* kernel / cuBLASLt nodes when the open op began */
    int *idx_all;                            /* device, [num_layers][PMAX * K] */
    cudaEvent_t ev[2];
    float ev_ms[PMAX + 1][QMAX + 1][STAMP_EV];
    int ev_n[PMAX + 1][QMAX + 1];
    double bandwidth; /* copy bandwidth, measured at the first report */
    /* the last stamped step, kept for the report */
    int have, T, q;
    k3c_stamp_plan last_plan; /* the shape's plan + the arg-max after the graph */
    k3c_stamp_launch *L;
    size_t nl, dropped;
    k3c_stamp_parse info;
    int *route;             /* host, [num_layers][T * K] */
    unsigned char *is_moe;  /* [num_layers] */
    double positions, wall_ms, gpu_ms;
};

/* ---- build ---- */

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Device address of a backbone weight, or an error naming it. */
#define DW(x, host, out, what)                                                                                     \
    do {                                                                                                           \
        (out) = k3c_backend_cuda_weight((x)->v.be, (host));                                                        \
        if (!(out)) return k3c_errorf("decode executor: weight %s (host %p) has no device copy", (what),          \
                                      (const void *)(host));                                                     \
    } while (0)

static int alloc_buffers(k3c_decode_cuda *x) {
    const k3c_config *c = x->c;
    size_t R = PMAX, D = c->hidden_size, P = k3c_config_kda_proj(c), H = c->kda_num_heads;
    size_t dk = c->kda_head_dim, Hm = c->num_attention_heads, qh = k3c_config_mla_qk_head_dim(c);
    size_t lat = k3c_config_mla_latent(c), vh = c->v_head_dim, V = c->vocab_size, I = c->intermediate_size;
    size_t kvl = c->kv_lora_rank, E = c->num_experts, K = c->num_experts_per_token > 0 ? c->num_experts_per_token : 1;
    size_t Rin = k3c_config_expert_in(c), Fm = c->moe_intermediate_size, Fs = k3c_config_shared_width(c);
    size_t qa = c->q_lora_rank > 0 ? (size_t)c->q_lora_rank : 1;
    float **fl[] = {&x->a_in, &x->x, &x->A, &x->F, &x->G, &x->logits, &x->kq, &x->kk, &x->kv, &x->cq, &x->ck,
                    &x->cv, &x->kf, &x->kg, &x->ko, &x->kz, &x->ky, &x->klow, &x->klow2, &x->kb, &x->kbeta, &x->mqa, &x->mq,
                    &x->mlat, &x->mo, &x->mg, &x->ga, &x->gu, &x->q_abs, &x->o_lat, &x->rlog, &x->wts, &x->z,
                    &x->h, &x->part, &x->r, &x->rup, &x->sa, &x->su, &x->sh, (float **)&x->idx, (float **)&x->keys_d};
    _Static_assert(sizeof fl / sizeof fl[0] == 42, "buffer list");
    _Static_assert(K3C_ARGMAX_KEYS_MAX * sizeof(uint64_t) <= PMAX * 8 * sizeof(float), "keys_d's 8 floats a row");
    /* keys_h holds K3C_ARGMAX_KEYS_MAX keys: a step's rows x parts stays within it only while rows do (parts
     * fall to 1 past it, k3c_cuda_argmax_parts), and a specialized step has at most PMAX rows */
    _Static_assert(PMAX <= K3C_ARGMAX_KEYS_MAX, "keys_h: rows x parts within K3C_ARGMAX_KEYS_MAX");
    size_t w[] = {D, D, D, D, D, V, P, P, P, P, P, P, P, P, P, P, P, dk, dk, H, H, qa, Hm * qh, lat, Hm * vh, Hm * vh,
                  I, I, Hm * lat, Hm * kvl, E, K, Rin, K * Fm, K * Rin, Rin, D, Fs, Fs, D, K, 8};
    int alt = c->attn_res_block_size > 0;
    size_t n = sizeof w / sizeof w[0], total = (size_t)(x->nres + alt) * al256(R * D * 4);
    for (size_t i = 0; i < n; i++) total += al256(R * (w[i] ? w[i] : 1) * 4);
    total += al256(sizeof(float *) * (size_t)x->nres);
    K3C_CUDA_MALLOC(&x->dev, total);
    char *p = x->dev;
    x->res = calloc((size_t)x->nres, sizeof(float *));
    if (!x->res) return k3c_errorf_kind(K3C_ERROR_OOM, "decode executor: out of host memory");
    for (int i = 0; i < x->nres; i++, p += al256(R * D * 4)) x->res[i] = (float *)p;
    if (alt) {
        x->res_alt = (float *)p;
        p += al256(R * D * 4);
    }
    for (size_t i = 0; i < n; i++) {
        *fl[i] = (float *)p;
        p += al256(R * (w[i] ? w[i] : 1) * 4);
    }
    x->res_dev = (float **)p;
    K3C_CUDA_TRY(cudaMemcpy(x->res_dev, x->res, sizeof(float *) * (size_t)x->nres, cudaMemcpyHostToDevice));
    if (x->v.num_aux > 0) K3C_CUDA_MALLOC(&x->aux_dev, (size_t)x->v.num_aux * R * D * 4);

    /* cuBLASLt (rows > K3C_CUDA_GEMV_MAX_T), as the backend sizes it: the same workspace gives the same
     * heuristic choice, hence the same products as the stock path */
    size_t ws = (size_t)32 << 20, max_cols = 1;
    const k3c_inventory *inv = &x->m->inventory;
    for (size_t i = 0; i < inv->count; i++)
        if (inv->specs[i].cls == K3C_TENSOR_MATRIX && (size_t)inv->specs[i].shape[1] > max_cols)
            max_cols = (size_t)inv->specs[i].shape[1];
    K3C_CUDA_MALLOC(&x->gemm_ws, ws);
    if (x->c->kv_lora_rank > 0 && x->c->num_attention_heads > 0) {
        x->mla_part_floats = k3c_cuda_mla_attend_split_floats(x->c->kv_lora_rank);
        K3C_CUDA_MALLOC(&x->mla_part, x->mla_part_floats * sizeof(float));
    }
    K3C_CUDA_MALLOC(&x->xbf, R * max_cols * 2);
    K3C_TRY(k3c_cuda_gemm_init(&x->gemm, x->gemm_ws, ws, x->xbf, R * max_cols));
    x->gemm_ready = 1;
    K3C_CUDA_HOST_ALLOC(&x->keys_h, K3C_ARGMAX_KEYS_MAX * sizeof(uint64_t));
    return K3C_OK;
}

/* Every weight the recorded step uses must resolve (checked once here, so recording cannot fail on it). */
static int check_weights(k3c_decode_cuda *x) {
    const k3c_weights *W = &x->m->weights;
    const void *d;
    DW(x, W->embed.w, d, "embed");
    DW(x, W->lm_head.w, d, "lm_head");
    DW(x, W->final_norm, d, "final_norm");
    for (int l = 0; l < x->c->num_layers; l++) {
        const k3c_layer_weights *lw = &W->layers[l];
        DW(x, lw->input_norm, d, "input_norm");
        DW(x, lw->post_norm, d, "post_norm");
        if (lw->is_moe) {
            DW(x, lw->moe.router.w, d, "router");
            DW(x, lw->moe.experts, d, "experts");
        }
    }
    (void)d;
    return K3C_OK;
}

static void stamp_free(stamp_state *sp) {
    if (!sp) return;
    k3c_cuda_stamps_free(sp->dev);
    for (int r = 0; r <= PMAX; r++)
        for (int q = 0; q <= QMAX; q++) k3c_stamp_plan_free(&sp->plan[r][q]);
    k3c_stamp_plan_free(&sp->last_plan);
    if (sp->idx_all) cudaFree(sp->idx_all);
    for (int i = 0; i < 2; i++)
        if (sp->ev[i]) cudaEventDestroy(sp->ev[i]);
    free(sp->L);
    free(sp->route);
    free(sp->is_moe);
    free(sp);
}

/* K3C_CUDA_PROFILE=3: the stamp buffers (cuda/stamp.h), the per-layer routing, the replay events. */
static int stamp_create(k3c_decode_cuda *x) {
    stamp_state *sp = calloc(1, sizeof *sp);
    if (!sp) return k3c_errorf_kind(K3C_ERROR_OOM, "decode executor: out of host memory for the block stamps");
    x->stamp = sp;
    int L = x->c->num_layers, K = x->c->num_experts_per_token > 0 ? x->c->num_experts_per_token : 1;
    K3C_TRY(k3c_cuda_stamps_create(0, &sp->dev));
    K3C_CUDA_MALLOC(&sp->idx_all, sizeof(int) * (size_t)L * PMAX * K);
    K3C_CUDA_TRY(cudaMemset(sp->idx_all, 0, sizeof(int) * (size_t)L * PMAX * K));
    for (int i = 0; i < 2; i++) K3C_CUDA_TRY(cudaEventCreate(&sp->ev[i]));
    sp->route = malloc(sizeof(int) * (size_t)L * PMAX * K);
    sp->is_moe = calloc((size_t)L, 1);
    if (!sp->route || !sp->is_moe) return k3c_errorf_kind(K3C_ERROR_OOM, "decode executor: out of host memory for the block stamps");
    for (int l = 0; l < L; l++) sp->is_moe[l] = (unsigned char)x->m->weights.layers[l].is_moe;
    return K3C_OK;
}

int k3c_decode_cuda_build(const k3c_decode_env *env, int rank, int world_size, k3c_decode_cuda **out) {
    *out = NULL;
    if (rank != 0 || world_size != 1)
        return k3c_errorf("decode executor: rank %d of %d: only (0, 1) is built (no tensor parallelism yet)", rank,
                          world_size);
    const k3c_decode_env v = *env;
    if (!k3c_backend_is_cuda(v.be)) return k3c_errorf("decode executor: the engine's backend is %s, not cuda", v.be->name);
    if (k3c_backend_cuda_exact(v.be))
        return k3c_errorf("decode executor: the backend runs the exact f32 diagnostic (no specialized path)");
    k3c_decode_cuda *x = calloc(1, sizeof *x);
    if (!x) return k3c_errorf_kind(K3C_ERROR_OOM, "decode executor: out of memory");
    x->v = v;
    x->m = v.m;
    x->c = &v.m->config;
    const k3c_config *c = x->c;
    x->silu_gate = k3c_config_kda_silu_gate(c);
    x->act = (k3c_cuda_act){c->hidden_act == K3C_ACT_SITU ? 2 : 1, c->situ_beta, c->situ_linear_beta};
    int G = c->use_grouped_topk && c->num_expert_group > 1 ? c->num_expert_group : 1;
    x->router = (k3c_cuda_router){c->num_experts, c->num_experts_per_token, c->router_sigmoid, c->use_correction_bias,
                                  G, c->topk_group, c->moe_renormalize, c->routed_scaling_factor};
    x->nres = c->attn_res_block_size > 0 ? (c->num_layers + c->attn_res_block_size - 1) / c->attn_res_block_size + 1
                                         : 1;
    x->kda_ord = malloc(sizeof(int) * (size_t)c->num_layers);
    if (!x->kda_ord) {
        free(x);
        return k3c_errorf_kind(K3C_ERROR_OOM, "decode executor: out of memory");
    }
    for (int l = 0; l < c->num_layers; l++) x->kda_ord[l] = c->layer_attn[l] == K3C_ATTN_KDA ? x->nkda++ : -1;
    memcpy(x->batches, k3c_prepared_batches, sizeof x->batches);
    x->ex = (k3c_decode_executor){.plan_table = {.batches = x->batches, .num_batches = K3C_PREPARED_NUM_BATCHES,
                                                 .wide_max = v.max_rows, .kv_prepared = 0, .needs_graphs = 1},
                                  .ctx = x};
    cudaError_t ce = cudaSetDevice(k3c_backend_cuda_device(v.be));
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&x->st, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        k3c_decode_cuda_free(x);
        return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(ce), "decode executor: stream: %s", cudaGetErrorString(ce));
    }
    x->prof = k3c_op_profile_create_from_env();
    if (alloc_buffers(x) != K3C_OK || check_weights(x) != K3C_OK ||
        (k3c_op_profile_mode(x->prof) == 3 && stamp_create(x) != K3C_OK)) {
        k3c_error_context("decode executor build: ");
        k3c_decode_cuda_free(x);
        return K3C_ERR;
    }
    *out = x;
    return K3C_OK;
}

void k3c_decode_cuda_free(k3c_decode_cuda *x) {
    if (!x) return;
    for (int r = 0; r <= PMAX; r++)
        for (int q = 0; q <= QMAX; q++)
            if (x->graph[r][q]) cudaGraphExecDestroy(x->graph[r][q]);
    if (x->gemm_ready) k3c_cuda_gemm_free(&x->gemm);
    if (x->dev) cudaFree(x->dev);
    if (x->aux_dev) cudaFree(x->aux_dev);
    if (x->gemm_ws) cudaFree(x->gemm_ws);
    if (x->mla_part) cudaFree(x->mla_part);
    if (x->xbf) cudaFree(x->xbf);
    if (x->meta_d) cudaFree(x->meta_d);
    if (x->meta_h) cudaFreeHost(x->meta_h);
    if (x->keys_h) cudaFreeHost(x->keys_h);
    k3c_op_profile_free(x->prof);
    stamp_free(x->stamp);
    if (x->st) cudaStreamDestroy(x->st);
    free(x->res);
    free(x->kda_ord);
    free(x);
}

/* ---- the recorded step: the stock forward's layer loop (stock/forward.c) as the CUDA backend's launches,
 * on this executor's fixed buffers and metadata. T = rows, b = T / q requests of q rows each. ---- */

typedef struct rec {
    k3c_decode_cuda *x;
    int T, q, b;
} rec;

#define L_TRY(call) K3C_TRY(call)

/* K3C_CUDA_PROFILE=3, while a shape is captured: an op of the plan (decode/stamp_report.h) begins / ends, its
 * stamped launches the kernel nodes it added less cuBLASLt's (cuda/stamp.h). No-ops otherwise. */
static void stamp_op_begin(k3c_decode_cuda *x, const char *op) {
    stamp_state *sp = x->stamp;
    if (!sp || !sp->rec) return;
    k3c_stamp_plan_begin(sp->rec, op);
    if (sp->rec->depth == 1) {
        sp->n0 = k3c_cuda_capture_kernel_nodes(x->st);
        sp->f0 = k3c_cuda_stamp_foreign_nodes();
    }
}
static void stamp_op_end(k3c_decode_cuda *x) {
    stamp_state *sp = x->stamp;
    if (!sp || !sp->rec) return;
    long n1 = sp->rec->depth == 1 ? k3c_cuda_capture_kernel_nodes(x->st) : 0;
    long f = k3c_cuda_stamp_foreign_nodes() - sp->f0;
    if (sp->rec->depth != 1) k3c_stamp_plan_end(sp->rec, 0, 0);
    else k3c_stamp_plan_end(sp->rec, sp->n0 < 0 || n1 < 0 ? -1 : n1 - sp->n0 - f, f);
}
/* The bytes an op moves (weights + activations), added to the plan's open or last op; the expression is
 * evaluated only while a plan is recorded. */
#define STAMP_BYTES(bytes)                                                                                         \
    do {                                                                                                           \
        if (x->stamp && x->stamp->rec) k3c_stamp_plan_bytes(x->stamp->rec, (double)(bytes));                     \
    } while (0)

/* A launcher call of the recorded step, bracketed by the executor's op profile (cuda/op_profile.h: a no-op
 * unless K3C_CUDA_PROFILE is set, and never while the stream captures, so only an eager profiled step,
 * k3c_decode_cuda_profile_next, is timed) and, at capture, by the stamp plan. x: the executor, in scope at
 * every use. */
#define P_TRY(op, call)                                                                                            \
    do {                                                                                                           \
        int ps_ = k3c_op_profile_begin(x->prof, (op), x->st);                                                       \
        stamp_op_begin(x, (op));                                                                                   \
        int rc_ = (call);                                                                                          \
        stamp_op_end(x);                                                                                           \
        k3c_op_profile_end(x->prof, ps_, x->st);                                                                   \
        if (rc_ != K3C_OK) return rc_;                                                                             \
    } while (0)
#define WPTR(host) k3c_backend_cuda_weight(x->v.be, (host))

static int mm(k3c_decode_cuda *x, const k3c_mat *W, const float *in, int T, float *y, int round) {
    if (!WPTR(W->w)) return k3c_errorf("decode executor: a [%d x %d] matrix has no device copy", W->rows, W->cols);
    STAMP_BYTES(2.0 * W->rows * W->cols + 4.0 * T * (W->rows + W->cols));
    return k3c_cuda_matmul_bf16_round(&x->gemm, WPTR(W->w), W->rows, W->cols, in, T, y, round, x->st);
}

/* The packed projections of a provider: the products that read one step input, or
 * that are otherwise independent, as one grouped launch (cuda/gemm.h k3c_cuda_gemv_group) over the weights
 * where the backend loaded them, so no packed copy exists to rebuild after a reload. Each product's outputs
 * are bitwise those of mm() on it alone, so the executor still matches the stock path bit for bit. */
#define GROUP_MAX K3C_CUDA_GEMV_GROUP_MAX
typedef struct group {
    k3c_cuda_gemv_seg seg[GROUP_MAX];
    int n, missing;
} group;

static void group_add(k3c_decode_cuda *x, group *g, const k3c_mat *W, const float *in, float *out, int round) {
    const uint16_t *w = WPTR(W->w);
    if (!w || g->n == GROUP_MAX) {
        g->missing = 1;
        return;
    }
    g->seg[g->n++] = (k3c_cuda_gemv_seg){w, W->rows, W->cols, in, out, round};
}

/* K3C_EXEC_GROUP=0 (a diagnostic for A/B runs, read at capture) launches each product on its own instead. */
static int group_run(k3c_decode_cuda *x, const group *g, int T) {
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

static k3c_cuda_seg *segs_of(k3c_decode_cuda *x, int l) {
    return (k3c_cuda_seg *)(x->meta_d + x->off_segs) + (size_t)x->kda_ord[l] * PMAX;
}

static int rec_kda(const rec *s, int l) {
    k3c_decode_cuda *x = s->x;
    const k3c_config *c = x->c;
    const k3c_kda_weights *w = &x->m->weights.layers[l].kda;
    int T = s->T, H = c->kda_num_heads, dk = c->kda_head_dim, Wc = c->kda_conv_kernel;
    int k = x->kda_ord[l];
    /* every projection of the normed input in one launch (q, k, v, the decay gate's and the output gate's
     * low-rank halves, beta), then the two up-projections of the low-rank halves in another */
    group in = {0}, up = {0};
    group_add(x, &in, &w->q_proj, x->x, x->kq, 1);
    group_add(x, &in, &w->k_proj, x->x, x->kk, 1);
    group_add(x, &in, &w->v_proj, x->x, x->kv, 1);
    group_add(x, &in, &w->f_a, x->x, x->klow, 1);
    group_add(x, &in, &w->b_proj, x->x, x->kb, 1);
    group_add(x, &up, &w->f_b, x->klow, x->kf, 1);
    if (w->g_proj.w) {
        group_add(x, &in, &w->g_proj, x->x, x->kz, 1);
    } else {
        group_add(x, &in, &w->g_a, x->x, x->klow2, 1);
        group_add(x, &up, &w->g_b, x->klow2, x->kz, 1);
    }
    P_TRY("kda in-proj (group)", group_run(x, &in, T));
    size_t P = (size_t)H * dk;
    if (s->q > 1) { /* verify: pre-conv rows to the slot's store (the kernels read the committed state and
                     * window in place and write neither back: read_only segments, fill_meta) */
        P_TRY("kda verify copies", k3c_cuda_copy_batch((k3c_cuda_copy *)(x->meta_d + x->off_pre) + (size_t)k * PMAX * PRE_COPIES,
                                  s->b * PRE_COPIES, x->st));
        STAMP_BYTES(2.0 * 4 * T * PRE_COPIES * P); /* read + write */
    }
    P_TRY("kda up-proj (group)", group_run(x, &up, T));
    /* the fused provider: conv x3 + windows, gate and beta, q/k norms, the delta rule on the request's state,
     * the gated norm, in one kernel, bit for bit the stock op sequence (cuda/kda.h); for many requests those
     * separate launches instead (faster there: cuda/kda.cu k3c_cuda_kda_decode_fused_prefer), which also
     * write the pre-norm o */
    int fused = k3c_cuda_kda_decode_fused_prefer(s->b, H, dk, dk);
    P_TRY(fused ? "kda fused" : "kda separate", (fused ? k3c_cuda_kda_decode_fused : k3c_cuda_kda_decode_separate)(
        segs_of(x, l), s->b, T, H, dk, dk, Wc, x->kq, x->kk, x->kv, WPTR(w->q_conv), WPTR(w->k_conv),
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
        P_TRY("kda verify copies", k3c_cuda_copy_batch((k3c_cuda_copy *)(x->meta_d + x->off_post) + (size_t)k * PMAX * POST_COPIES,
                                  s->b * POST_COPIES, x->st));
        STAMP_BYTES(2.0 * 4 * T * (3 * P + H));
    }
    P_TRY("kda o_proj", mm(x, &w->o_proj, x->ky, T, x->A, 1));
    return K3C_OK;
}

static int rec_mla(const rec *s, int l) {
    k3c_decode_cuda *x = s->x;
    const k3c_config *c = x->c;
    const k3c_mla_weights *w = &x->m->weights.layers[l].mla;
    int T = s->T, lat = k3c_config_mla_latent(c), Hm = c->num_attention_heads, nope = c->qk_nope_head_dim;
    int rope = c->qk_rope_head_dim, vh = c->v_head_dim, kvl = c->kv_lora_rank;
    /* the projections of the normed input in one launch: the query (or its low-rank half), the latent with
     * its rope part, the output gate */
    int gate = c->mla_use_output_gate && w->g_proj.w;
    group in = {0};
    if (c->q_lora_rank > 0) group_add(x, &in, &w->q_a, x->x, x->mqa, 1);
    else group_add(x, &in, &w->q_proj, x->x, x->mq, 1);
    group_add(x, &in, &w->kv_a, x->x, x->mlat, 1);
    if (gate) group_add(x, &in, &w->g_proj, x->x, x->mg, 1);
    P_TRY("mla in-proj (group)", group_run(x, &in, T));
    if (c->q_lora_rank > 0) {
        P_TRY("mla norms", k3c_cuda_rmsnorm(x->mqa, c->q_lora_rank, WPTR(w->q_a_norm), T, c->q_lora_rank, c->mla_lora_norm_eps, 1,
                               x->mqa, c->q_lora_rank, x->st));
        STAMP_BYTES(4.0 * (2.0 * T + 1) * c->q_lora_rank);
        P_TRY("mla q_b", mm(x, &w->q_b, x->mqa, T, x->mq, 1));
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
    if (x->stamp && x->stamp->rec) k3c_stamp_plan_positions(x->stamp->rec, (double)lat * eb); /* each row's positions */
    P_TRY("mla absorb o", k3c_cuda_mla_absorb_o(kvb, x->o_lat, T, Hm, nope, vh, kvl, 1, x->mo, x->st));
    STAMP_BYTES(2.0 * Hm * vh * kvl + 4.0 * T * Hm * (kvl + vh)); /* kv_b's value rows */
    if (gate) {
        P_TRY("mla gate", k3c_cuda_mul_sigmoid(x->mo, x->mg, (size_t)T * w->g_proj.rows, 1, x->mo, x->st));
        STAMP_BYTES(3.0 * 4 * T * w->g_proj.rows);
    }
    P_TRY("mla o_proj", mm(x, &w->o_proj, x->mo, T, x->A, 1));
    return K3C_OK;
}

/* cuda_moe of the backend as a front, the persistent experts and a tail (the MoE provider): the
 * front is one grouped launch of every product of the MoE input (router logits in f32, the latent
 * down-projection, the shared expert's gate and up), then routing and the shared activation (one launch);
 * the tail one grouped launch of the latent up-projection and the shared down-projection. Same kernels and
 * reductions per product as the backend, so the same outputs. The sum of the two (the backend's "moe out")
 * is left to the launch that reads the residual next (resid below): *routed and *shared (NULL without shared
 * experts) are the two addends. */
static int rec_moe(k3c_decode_cuda *x, int l, const k3c_moe_weights *w, const float *y, int T, const float **routed_out,
                   const float **shared_out) {
    const k3c_config *c = x->c;
    int E = c->num_experts, K = c->num_experts_per_token;
    int *idx = x->stamp ? x->stamp->idx_all + (size_t)l * PMAX * K : x->idx; /* K3C_CUDA_PROFILE=3: kept per layer */
    int Rin = k3c_config_expert_in(c), Fm = c->moe_intermediate_size;
    int latent = c->routed_expert_hidden_size > 0, shared = w->shared.gate.w != NULL;
    int Fs = shared ? w->shared.gate.rows : 0;
    cudaStream_t st = x->st;
    const float *bias = c->use_correction_bias && w->correction_bias ? WPTR(w->correction_bias) : NULL;
    group front = {0}, tail = {0};
    group_add(x, &front, &w->router, y, x->rlog, 0);
    if (latent) group_add(x, &front, &w->latent_down, y, x->z, 1);
    if (shared) {
        group_add(x, &front, &w->shared.gate, y, x->sa, 1);
        group_add(x, &front, &w->shared.up, y, x->su, 1);
    }
    P_TRY("moe front (group)", group_run(x, &front, T));
    /* with shared experts, routing and their activation (both read only the front's outputs) in one launch,
     * the bits of the two (cuda/router.h): one launch fewer a layer */
    if (shared)
        P_TRY("moe route + shared act", k3c_cuda_route_act(&x->router, x->rlog, bias, T, idx, x->wts, x->act, x->sa,
                                                           Fs, x->su, Fs, Fs, 1, x->sa, st));
    else
        P_TRY("moe route", k3c_cuda_route(&x->router, x->rlog, bias, T, idx, x->wts, st));
    STAMP_BYTES(4.0 * T * (E + 2 * K + 3.0 * Fs));
    int mx = c->expert_format == K3C_EXPERTS_MXFP4;
    P_TRY("moe experts", k3c_cuda_moe_experts(WPTR(w->experts), E, mx, Rin, Fm, Rin, latent ? x->z : y, T, idx, x->wts,
                                              K, x->act, 1, x->h, x->part, x->r, st));
    /* the routed experts' bytes come from the step's routing (the report): gate, up and down, each [Fm, Rin],
     * MXFP4 as half a byte a weight and a scale byte per 32, bf16 as 2; activations per pair */
    STAMP_BYTES(4.0 * T * K * (2.0 * Rin + 2.0 * Fm) + 4.0 * T * Rin);
    if (x->stamp && x->stamp->rec) k3c_stamp_plan_experts(x->stamp->rec, l, 3.0 * Fm * Rin * (mx ? 0.5 + 1.0 / 32 : 2.0));
    const float *routed = x->r;
    if (latent) {
        if (c->latent_moe_use_norm) {
            P_TRY("moe latent norm", k3c_cuda_rmsnorm(x->r, Rin, WPTR(w->latent_norm), T, Rin, c->rms_norm_eps, 1, x->r, Rin, st));
            STAMP_BYTES(4.0 * (2.0 * T + 1) * Rin);
        }
        group_add(x, &tail, &w->latent_up, x->r, x->rup, 1);
        routed = x->rup;
    }
    if (shared) group_add(x, &tail, &w->shared.down, x->sa, x->sh, 1);
    if (tail.n) P_TRY("moe tail (group)", group_run(x, &tail, T));
    *routed_out = routed;
    *shared_out = shared ? x->sh : NULL;
    return K3C_OK;
}

/* The FFN of layer l on x->x; its output, to be added to the residual, is r(*a1 + *a2) (*a2 non-NULL: an
 * MoE's routed and shared parts) or *a1. */
static int rec_ffn(k3c_decode_cuda *x, int l, int T, const float **a1, const float **a2) {
    const k3c_layer_weights *lw = &x->m->weights.layers[l];
    if (lw->is_moe) return rec_moe(x, l, &lw->moe, x->x, T, a1, a2);
    *a1 = x->F;
    *a2 = NULL;
    group gu = {0}; /* gate and up in one launch */
    group_add(x, &gu, &lw->mlp.gate, x->x, x->ga, 1);
    group_add(x, &gu, &lw->mlp.up, x->x, x->gu, 1);
    P_TRY("mlp gate/up (group)", group_run(x, &gu, T));
    int n = T * lw->mlp.gate.rows;
    P_TRY("mlp act", k3c_cuda_gated_act(x->act, x->ga, n, x->gu, n, 1, n, 1, x->ga, x->st));
    STAMP_BYTES(3.0 * 4 * n);
    P_TRY("mlp down", mm(x, &lw->mlp.down, x->ga, T, x->F, 1));
    return K3C_OK;
}

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
 * source array has it; record_step checks that at every block start. An aux stream point that needs the
 * residual of layer l materialized calls resid_settle there (the separate launches, that layer only).
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
        stamp_op_begin(x, "attnres mix");
        *rc = k3c_cuda_attnres_mix(src, nb + 1, T, c->hidden_size, WPTR(proj), WPTR(norm), c->rms_norm_eps, 1, x->a_in,
                                   x->st);
        stamp_op_end(x);
        STAMP_BYTES(4.0 * ((nb + 2.0) * T + 2) * c->hidden_size); /* nb + 1 sources in, the mix out, proj, norm */
        k3c_op_profile_end(x->prof, ps, x->st);
        return x->a_in;
    }
    float *dst = r->P == x->res_alt ? r->home : x->res_alt;
    const char *op = r->a2 ? "attnres mix + moe out + residual add" : "attnres mix + residual add";
    int ps = k3c_op_profile_begin(x->prof, op, x->st);
    stamp_op_begin(x, op);
    *rc = k3c_cuda_attnres_mix_pending(src, nb, r->P, r->a1, r->a2, 1, dst, T, c->hidden_size, WPTR(proj), WPTR(norm),
                                       c->rms_norm_eps, 1, x->a_in, x->st);
    stamp_op_end(x);
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
 * embedding (L = 0) and after layer L - 1's FFN add, which record_step leaves unfused (resid_settle) at
 * such a layer so that the updated prefix is stored for the copy (vLLM: bind_aux on the AttnRes entering an
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

static int record_step(k3c_decode_cuda *x, int T, int q) {
    const k3c_config *c = x->c;
    const k3c_weights *W = &x->m->weights;
    rec s = {x, T, q, T / q};
    int D = c->hidden_size, attnres = c->attn_res_block_size > 0, nb = 0, rc = K3C_OK;
    resid r = {x->res[0], x->res[0], NULL, NULL};
    const float *a1, *a2;
    P_TRY("embed", k3c_cuda_embed(WPTR(W->embed.w), W->embed.rows, W->embed.cols, (const int *)(x->meta_d + x->off_ids), T,
                                  r.P, x->st));
    STAMP_BYTES(6.0 * T * D);
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
        L_TRY(lw->kind == K3C_ATTN_KDA ? rec_kda(&s, l) : rec_mla(&s, l));
        L_TRY(resid_owe(x, &r, x->A, NULL, T));
        if (attnres) {
            const float *m_in = rec_mix(x, &r, nb, lw->mlp_res_proj, lw->mlp_res_norm, T, &rc);
            L_TRY(rc);
            P_TRY("rmsnorm", k3c_cuda_rmsnorm(m_in, D, WPTR(lw->post_norm), T, D, c->rms_norm_eps, 1, x->x, D, x->st));
            STAMP_BYTES(4.0 * (2.0 * T + 1) * D);
        } else {
            L_TRY(rec_norm(x, &r, lw->post_norm, T, x->x, 0)); /* + the attention's add */
        }
        L_TRY(rec_ffn(x, l, T, &a1, &a2));
        L_TRY(resid_owe(x, &r, a1, a2, T));
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
    P_TRY("lm head", mm(x, &W->lm_head, x->G, T, x->logits, 0));
    return K3C_OK;
}

/* ---- prepare_kv, capture ---- */

int k3c_decode_cuda_prepare_kv(k3c_decode_cuda *x, int eager) {
    const k3c_decode_env *v = &x->v;
    if (!v->kv || !v->kv->base || !v->ks)
        return k3c_errorf("decode executor: prepare_kv: the engine has no bound caches");
    if (x->meta_h) return k3c_errorf("decode executor: prepare_kv called twice");
    x->bs = v->block_size;
    x->mbr = v->max_blocks_per_request;
    size_t off = 0;
#define CARVE(field, bytes) (x->field = off, off += al256(bytes))
    CARVE(off_ids, sizeof(int) * PMAX);
    CARVE(off_slots, sizeof(int) * PMAX);
    CARVE(off_aoff, sizeof(int) * PMAX);
    CARVE(off_alen, sizeof(int) * PMAX);
    CARVE(off_tab, sizeof(int) * (size_t)PMAX * x->mbr);
    CARVE(off_segs, sizeof(k3c_cuda_seg) * (size_t)PMAX * (x->nkda ? x->nkda : 1));
    CARVE(off_pre, sizeof(k3c_cuda_copy) * (size_t)PMAX * PRE_COPIES * (x->nkda ? x->nkda : 1));
    CARVE(off_post, sizeof(k3c_cuda_copy) * (size_t)PMAX * POST_COPIES * (x->nkda ? x->nkda : 1));
#undef CARVE
    x->meta_bytes = off;
    K3C_CUDA_HOST_ALLOC(&x->meta_h, off);
    memset(x->meta_h, 0, off);
    K3C_CUDA_MALLOC(&x->meta_d, off);
    K3C_CUDA_TRY(cudaMemset(x->meta_d, 0, off));
    x->kv_prepared = 1;
    x->eager = eager;
    x->ex.plan_table.kv_prepared = 1;
    if (!eager) return K3C_OK;
    int shapes[128][2];
    int n = k3c_prepared_shapes(v->q_max, v->max_requests, shapes, 128);
    for (int i = 0; i < n && i < 128; i++) K3C_TRY(k3c_decode_cuda_capture(x, shapes[i][0], shapes[i][1]));
    return K3C_OK;
}

int k3c_decode_cuda_capture(k3c_decode_cuda *x, int rows, int q) {
    if (!x->kv_prepared) return k3c_errorf("decode executor: capture before prepare_kv");
    if (!k3c_prepared_shape(rows, q, x->v.q_max, x->v.max_requests))
        return k3c_errorf("decode executor: (%d rows, q %d) is not a prepared shape", rows, q);
    if (x->graph[rows][q]) return K3C_OK;
    cudaGraph_t g = NULL;
    K3C_CUDA_TRY(cudaStreamBeginCapture(x->st, cudaStreamCaptureModeRelaxed));
    if (x->stamp) { /* K3C_CUDA_PROFILE=3: the shape's plan of ops, with their launch counts and bytes */
        k3c_stamp_plan_free(&x->stamp->plan[rows][q]);
        x->stamp->rec = &x->stamp->plan[rows][q];
        k3c_cuda_stamp_counting(1);
    }
    int rc = record_step(x, rows, q);
    if (x->stamp) {
        x->stamp->rec = NULL;
        k3c_cuda_stamp_counting(0);
    }
    cudaError_t ce = cudaStreamEndCapture(x->st, &g);
    if (rc != K3C_OK) {
        if (g) cudaGraphDestroy(g);
        return k3c_error_context("decode executor: capturing (%d rows, q %d): ", rows, q);
    }
    if (ce != cudaSuccess)
        return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(ce), "decode executor: capturing (%d rows, q %d): %s", rows, q, cudaGetErrorString(ce));
    cudaGraphExec_t ge = NULL;
    ce = cudaGraphInstantiate(&ge, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess)
        return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(ce), "decode executor: instantiating (%d rows, q %d): %s", rows, q, cudaGetErrorString(ce));
    x->graph[rows][q] = ge;
    x->num_captured++;
    return K3C_OK;
}

int k3c_decode_cuda_process_weights_after_loading(k3c_decode_cuda *x) {
    /* No derived copies exist yet (no packed projections): the graphs read the backbone in place, so new
     * weights in the same storage are used by the next replay. Check the addresses did not move. */
    return check_weights(x);
}

/* ---- plan table callbacks and run ---- */

/* Whether the shape's graph exists; capturing is k3c_decode_cuda_capture's, when the engine asks. */
static int captured_cb(void *ctx, int rows, int q) {
    const k3c_decode_cuda *x = ctx;
    return rows >= 1 && rows <= PMAX && q >= 1 && q <= QMAX && x->kv_prepared && x->graph[rows][q] != NULL;
}

/* Fills the metadata of one step (b requests of q rows) into the pinned block. */
static int fill_meta(k3c_decode_cuda *x, const k3c_fwd_req *reqs, int b, int q) {
    const k3c_decode_env *v = &x->v;
    const k3c_kda_slots *ks = v->ks;
    int *ids = (int *)(x->meta_h + x->off_ids), *slots = (int *)(x->meta_h + x->off_slots);
    int *aoff = (int *)(x->meta_h + x->off_aoff), *alen = (int *)(x->meta_h + x->off_alen);
    int *tab = (int *)(x->meta_h + x->off_tab);
    k3c_cuda_seg *segs = (k3c_cuda_seg *)(x->meta_h + x->off_segs);
    k3c_cuda_copy *pre = (k3c_cuda_copy *)(x->meta_h + x->off_pre), *post = (k3c_cuda_copy *)(x->meta_h + x->off_post);
    int bs = x->bs, V = x->c->vocab_size;
    size_t sf = ks ? ks->state_floats : 0, wf = ks ? ks->window_floats : 0;
    for (int i = 0; i < b; i++) {
        const k3c_fwd_req *r = &reqs[i];
        if (r->n != q) return k3c_errorf("decode executor: request %d runs %d tokens in a q = %d step", i, r->n, q);
        if ((q > 1) != (r->verify != 0))
            return k3c_errorf("decode executor: request %d: verify flag %d in a q = %d step", i, r->verify, q);
        if (r->pos + q > v->max_context)
            return k3c_errorf("decode executor: request %d reaches %d tokens, max_context %d", i, r->pos + q,
                              v->max_context);
        int nbk = (r->pos + q + bs - 1) / bs;
        for (int k = 0; k < x->mbr; k++) tab[(size_t)i * x->mbr + k] = k < nbk ? r->block_table[k] : 0;
        for (int j = 0; j < q; j++) {
            int t = i * q + j, p = r->pos + j;
            if (r->ids[j] < 0 || r->ids[j] >= V)
                return k3c_errorf("decode executor: request %d token %d: id %d outside 0..%d", i, j, r->ids[j], V - 1);
            ids[t] = r->ids[j];
            slots[t] = r->block_table[p / bs] * bs + p % bs;
            aoff[t] = i * x->mbr;
            alen[t] = p + 1;
        }
        for (int l = 0; l < x->c->num_layers; l++) {
            int k = x->kda_ord[l];
            if (k < 0) continue;
            float *state = ks->state[l] + (size_t)r->slot * sf, *window = ks->window[l] + (size_t)r->slot * wf;
            if (q > 1) {
                float *stv = k3c_kda_store(ks, l, r->slot);
                size_t P = ks->P, rows = (size_t)q * P, row0 = (size_t)i * q;
                k3c_cuda_copy *c0 = pre + ((size_t)k * PMAX + i) * PRE_COPIES;
                c0[0] = (k3c_cuda_copy){x->kq + row0 * P, stv + k3c_kda_store_x(ks, 0), (long long)rows};
                c0[1] = (k3c_cuda_copy){x->kk + row0 * P, stv + k3c_kda_store_x(ks, 1), (long long)rows};
                c0[2] = (k3c_cuda_copy){x->kv + row0 * P, stv + k3c_kda_store_x(ks, 2), (long long)rows};
                k3c_cuda_copy *c1 = post + ((size_t)k * PMAX + i) * POST_COPIES;
                c1[0] = (k3c_cuda_copy){x->ck + row0 * P, stv + k3c_kda_store_k(ks), (long long)rows};
                c1[1] = (k3c_cuda_copy){x->cv + row0 * P, stv + k3c_kda_store_v(ks), (long long)rows};
                c1[2] = (k3c_cuda_copy){x->kg + row0 * P, stv + k3c_kda_store_g(ks), (long long)rows};
                c1[3] = (k3c_cuda_copy){x->kbeta + row0 * ks->H, stv + k3c_kda_store_beta(ks), (long long)q * ks->H};
            }
            /* verify (q > 1) reads the committed slot and leaves it as it was (the stock path runs on a scratch
             * copy of it: the same values in, the same bits out); commit folds the accepted tokens in */
            segs[(size_t)k * PMAX + i] = (k3c_cuda_seg){i * q, q, state, window, q > 1};
        }
    }
    return K3C_OK;
}

static double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Parts a row of the greedy arg-max: k3c_cuda_argmax_parts's ~256 blocks, or one block a row with
 * K3C_EXEC_ARGMAX_PARTS=1 (the A/B of the split; the ids are the same either way). */
static int argmax_parts(int T) {
    static int one = -1;
    if (one < 0) {
        const char *v = getenv("K3C_EXEC_ARGMAX_PARTS");
        one = v && v[0] == '1' && v[1] == 0;
    }
    return one ? 1 : k3c_cuda_argmax_parts(T);
}

/* The step's results to the host, with one synchronization: the logits straight into the caller's buffer
 * as the stock path downloads them, or (ids non-NULL) each row's greedy token id, then the aux streams when
 * the engine asked for them. The ids: the arg-max's best key of each part of each row (~256 blocks in all,
 * cuda/sample.h) into page-locked keys_h, a row's parts reduced here (2 KB at most). 2026-11-30 (H200, k3-slice
 * b=64, K3C_CUDA_PROFILE=1): through a pinned staging buffer in 16 chunks, each copied out by the host as it
 * landed, the copy-out alone took 6.4 ms of a 41.1 ms step, and the direct download made the step 37.7 ms
 * against the stock path's 38.7 in the same process (A/B by a switch since removed). The caller's buffer itself
 * page-locked (k3c_engine_logits_alloc, as the runner and the bench use) removes the staging altogether:
 * kimi-linear-48b b=64 26.14 ms against 29.76-31.98 into malloc'ed memory (k3c bench, 2026-11-30). */
static int download_results(k3c_decode_cuda *x, int T, float *logits, int32_t *ids, float *aux) {
    size_t V = (size_t)x->c->vocab_size;
    double t0 = x->prof ? wall_ms() : 0;
    int parts = ids ? argmax_parts(T) : 0;
    if (ids) { /* after the graph, not in it: the same graph serves both kinds of step */
        K3C_TRY(k3c_cuda_argmax_keys(x->logits, T, (int)V, parts, x->keys_d, x->st));
        K3C_CUDA_TRY(cudaMemcpyAsync(x->keys_h, x->keys_d, (size_t)T * parts * sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, x->st));
    } else {
        K3C_CUDA_TRY(cudaMemcpyAsync(logits, x->logits, (size_t)T * V * sizeof(float), cudaMemcpyDeviceToHost, x->st));
    }
    if (x->v.num_aux > 0) /* the engine's aux streams, [num_aux, T, D] as stock packs them (decode/executor.h) */
        K3C_CUDA_TRY(cudaMemcpyAsync(aux, x->aux_dev, (size_t)x->v.num_aux * T * x->c->hidden_size * sizeof(float),
                                     cudaMemcpyDeviceToHost, x->st));
    K3C_CUDA_TRY(cudaStreamSynchronize(x->st));
    if (ids)
        for (int r = 0; r < T; r++) ids[r] = k3c_argmax_key_id(x->keys_h + (size_t)r * parts, parts);
    if (x->prof) x->host_ms[1] += wall_ms() - t0; /* waiting for the step and its downloads together */
    return K3C_OK;
}

/* The step captured again with a time stamp after every op (cuda/op_profile.h, K3C_CUDA_PROFILE=2), that
 * graph run once and freed; the op profile reads the stamps at its next collect. */
static int run_stamped(k3c_decode_cuda *x, int T, int q) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    K3C_CUDA_TRY(cudaStreamBeginCapture(x->st, cudaStreamCaptureModeRelaxed));
    int rc = k3c_op_profile_arm(x->prof, x->st) == 0 ? record_step(x, T, q)
                                                      : k3c_errorf("decode executor: the op profile's first stamp failed");
    cudaError_t ce = cudaStreamEndCapture(x->st, &g);
    if (rc == K3C_OK && ce == cudaSuccess) ce = cudaGraphInstantiate(&ge, g, 0);
    if (g) cudaGraphDestroy(g);
    if (rc == K3C_OK && ce == cudaSuccess) ce = cudaGraphUpload(ge, x->st);
    if (rc == K3C_OK && ce == cudaSuccess) ce = cudaGraphLaunch(ge, x->st);
    k3c_op_profile_disarm(x->prof, rc == K3C_OK && ce == cudaSuccess);
    if (ge) { /* destroyed once the stream is idle: the launch above must have finished */
        cudaStreamSynchronize(x->st);
        cudaGraphExecDestroy(ge);
    }
    if (rc != K3C_OK) return rc;
    if (ce != cudaSuccess) return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(ce), "decode executor: the stamped profile step: %s", cudaGetErrorString(ce));
    return K3C_OK;
}

/* K3C_CUDA_PROFILE=3, after a replay (its stream idle): the graph's event time; after the stamped one, the
 * stamps off and downloaded with the step's routing, kept for k3c_decode_cuda_stamp_report. */
static int stamp_collect(k3c_decode_cuda *x, int T, int q, int stamped, int argmax, double t_begin) {
    stamp_state *sp = x->stamp;
    float ms = 0;
    K3C_CUDA_TRY(cudaEventElapsedTime(&ms, sp->ev[0], sp->ev[1]));
    if (!stamped) {
        sp->ev_ms[T][q][sp->ev_n[T][q]++ % STAMP_EV] = ms;
        return K3C_OK;
    }
    sp->wall_ms = wall_ms() - t_begin;
    sp->gpu_ms = ms;
    K3C_TRY(k3c_cuda_stamps_off(sp->dev, x->st));
    K3C_CUDA_TRY(cudaStreamSynchronize(x->st));
    const k3c_stamp_rec *rec;
    size_t n;
    K3C_TRY(k3c_cuda_stamps_download(sp->dev, &rec, &n, &sp->dropped));
    free(sp->L);
    sp->L = NULL;
    K3C_TRY(k3c_stamp_launches(rec, n, &sp->L, &sp->nl, &sp->info));
    int L = x->c->num_layers, K = x->c->num_experts_per_token > 0 ? x->c->num_experts_per_token : 1;
    for (int l = 0; l < L; l++)
        if (sp->is_moe[l])
            K3C_CUDA_TRY(cudaMemcpy(sp->route + (size_t)l * T * K, sp->idx_all + (size_t)l * PMAX * K,
                                    sizeof(int) * (size_t)T * K, cudaMemcpyDeviceToHost));
    const int *alen = (const int *)(x->meta_h + x->off_alen);
    sp->positions = 0;
    for (int t = 0; t < T; t++) sp->positions += alen[t];
    /* the shape's plan, and the arg-max after the graph (cuda/sample.h: one launch) when the step took it */
    const k3c_stamp_plan *pl = &sp->plan[T][q];
    k3c_stamp_plan_free(&sp->last_plan);
    for (int i = 0; i < pl->n && !sp->last_plan.failed; i++) {
        k3c_stamp_plan_add(&sp->last_plan, pl->op[i].name, 0, 0);
        if (!sp->last_plan.failed) sp->last_plan.op[sp->last_plan.n - 1] = pl->op[i];
    }
    sp->last_plan.failed |= pl->failed || pl->n == 0;
    if (argmax) k3c_stamp_plan_add(&sp->last_plan, "argmax", 1, 4.0 * T * x->c->vocab_size);
    sp->T = T;
    sp->q = q;
    sp->have = 1;
    return K3C_OK;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int k3c_decode_cuda_stamp_report(k3c_decode_cuda *x, FILE *f, double plain_ms) {
    stamp_state *sp = x->stamp;
    if (!sp) return k3c_errorf("decode executor: no block stamps (K3C_CUDA_PROFILE=3 was not set when the executor was built)");
    if (!sp->have) return k3c_errorf("decode executor: no stamped step since the last report");
    if (sp->bandwidth == 0 && k3c_cuda_copy_bandwidth(&sp->bandwidth) != K3C_OK) sp->bandwidth = 0;
    int T = sp->T, q = sp->q, n = sp->ev_n[T][q] < STAMP_EV ? sp->ev_n[T][q] : STAMP_EV;
    float ev[STAMP_EV];
    memcpy(ev, sp->ev_ms[T][q], sizeof(float) * (size_t)n);
    qsort(ev, (size_t)n, sizeof *ev, cmp_float);
    fprintf(f, "STAMP b=%d q=%d: the graph on the GPU (two events around the launch): stamped %.3f ms, plain %.3f ms "
               "(median of the last %d replays of this shape); the stamped step's executor wall time %.3f ms\n",
            T / q, q, sp->gpu_ms, n ? ev[n / 2] : 0.0, n, sp->wall_ms);
    k3c_stamp_step st = {.rows = T, .q = q, .bandwidth = sp->bandwidth, .plain_ms = plain_ms, .stamped_ms = sp->wall_ms,
                         .positions = sp->positions, .tick_ns = k3c_cuda_stamps_tick_ns(sp->dev), .dropped = sp->dropped,
                         .route = sp->route, .layers = x->c->num_layers,
                         .k = x->c->num_experts_per_token > 0 ? x->c->num_experts_per_token : 1,
                         .experts = x->c->num_experts, .is_moe = sp->is_moe};
    int rc = k3c_stamp_report(f, &sp->last_plan, sp->L, sp->nl, &sp->info, &st);
    sp->have = 0;
    return rc;
}

/* One step: logits into the caller's buffer, or (ids non-NULL) only each row's greedy token id. */
static int run_step(k3c_decode_cuda *x, const k3c_plan *plan, const k3c_fwd_req *reqs, int n, float *logits,
                    int32_t *ids, float *aux) {
    int q = plan->q, T = plan->rows;
    if ((plan->route != K3C_ROUTE_DECODE && plan->route != K3C_ROUTE_VERIFY) || q < 1 || q > QMAX || T < 1 ||
        T > PMAX || n * q != T || !x->graph[T][q])
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "decode executor: no captured graph for route %d, %d requests, %d "
                               "rows, q %d", (int)plan->route, n, T, q);
    if (x->v.num_aux > 0 && !aux) return k3c_errorf_kind(K3C_ERROR_INTERNAL, "decode executor: no aux buffer");
    double t_begin = x->prof ? wall_ms() : 0;
    K3C_TRY(x->v.be->sync(x->v.be)); /* the backend's stream is idle before this stream touches its caches */
    K3C_TRY(fill_meta(x, reqs, n, q));
    K3C_CUDA_TRY(cudaMemcpyAsync(x->meta_d, x->meta_h, x->meta_bytes, cudaMemcpyHostToDevice, x->st));
    if (x->prof) x->host_ms[0] += wall_ms() - t_begin; /* metadata and its upload issued */
    int stamped = 0;
    if (x->profile_next && x->prof && !x->stamp) { /* the same launches as the graph, eagerly or stamped (header) */
        x->profile_next = 0;
        K3C_TRY(k3c_op_profile_stamps(x->prof) ? run_stamped(x, T, q) : record_step(x, T, q));
    } else if (x->stamp) { /* K3C_CUDA_PROFILE=3: every replay timed; the profiled one with block stamps on */
        stamped = x->profile_next;
        x->profile_next = 0;
        if (stamped) K3C_TRY(k3c_cuda_stamps_on(x->stamp->dev, x->st));
        K3C_CUDA_TRY(cudaEventRecord(x->stamp->ev[0], x->st));
        K3C_CUDA_TRY(cudaGraphLaunch(x->graph[T][q], x->st));
        K3C_CUDA_TRY(cudaEventRecord(x->stamp->ev[1], x->st));
    } else {
        K3C_CUDA_TRY(cudaGraphLaunch(x->graph[T][q], x->st));
    }
    K3C_TRY(download_results(x, T, logits, ids, aux)); /* the arg-max in it is stamped too */
    if (x->stamp) K3C_TRY(stamp_collect(x, T, q, stamped, ids != NULL, t_begin));
    k3c_op_profile_collect(x->prof); /* the stream is idle after the downloads */
    x->replays++;
    return K3C_OK;
}

static int step_cb(void *ctx, const k3c_plan *plan, const k3c_fwd_req *reqs, int n, float *logits, int32_t *ids,
                   float *aux) {
    return run_step(ctx, plan, reqs, n, logits, ids, aux);
}

static int capture_cb(void *ctx, int rows, int q) { return k3c_decode_cuda_capture(ctx, rows, q); }
static int num_captured_cb(void *ctx) { return k3c_decode_cuda_num_captured(ctx); }

const k3c_decode_executor *k3c_decode_cuda_executor(k3c_decode_cuda *x) {
    x->ex.step = step_cb;
    x->ex.capture = capture_cb;
    x->ex.num_captured = num_captured_cb;
    x->ex.plan_table.captured = captured_cb;
    x->ex.plan_table.captured_ctx = x;
    return &x->ex;
}

int k3c_decode_cuda_num_captured(const k3c_decode_cuda *x) { return x->num_captured; }

void k3c_decode_cuda_counts(const k3c_decode_cuda *x, long *replays) {
    if (replays) *replays = x->replays;
}

void k3c_decode_cuda_profile_next(k3c_decode_cuda *x) {
    x->profile_next = 1;
    x->host_ms[0] = x->host_ms[1] = 0;
}
void k3c_decode_cuda_host_profile(const k3c_decode_cuda *x, double ms[2]) {
    for (int i = 0; i < 2; i++) ms[i] = x->prof ? x->host_ms[i] : 0;
}
struct k3c_op_profile *k3c_decode_cuda_profile(k3c_decode_cuda *x) { return x->prof; }

#else /* no CUDA in this build */

#include "util/error.h"

int k3c_decode_cuda_build(const k3c_decode_env *env, int rank, int world_size, k3c_decode_cuda **out) {
    (void)env, (void)rank, (void)world_size;
    *out = NULL;
    return k3c_errorf_kind(K3C_ERROR_DEVICE, "decode executor: this build has no CUDA");
}
int k3c_decode_cuda_capture(k3c_decode_cuda *x, int rows, int q) { (void)x, (void)rows, (void)q; return k3c_errorf("decode executor: no CUDA"); }
int k3c_decode_cuda_prepare_kv(k3c_decode_cuda *x, int eager) { (void)x, (void)eager; return k3c_errorf("decode executor: no CUDA"); }
int k3c_decode_cuda_process_weights_after_loading(k3c_decode_cuda *x) { (void)x; return k3c_errorf("decode executor: no CUDA"); }
const k3c_decode_executor *k3c_decode_cuda_executor(k3c_decode_cuda *x) { (void)x; return NULL; }
int k3c_decode_cuda_num_captured(const k3c_decode_cuda *x) { (void)x; return 0; }
void k3c_decode_cuda_counts(const k3c_decode_cuda *x, long *replays) {
    (void)x;
    if (replays) *replays = 0;
}
void k3c_decode_cuda_free(k3c_decode_cuda *x) { (void)x; }
void k3c_decode_cuda_profile_next(k3c_decode_cuda *x) { (void)x; }
void k3c_decode_cuda_host_profile(const k3c_decode_cuda *x, double ms[2]) {
    (void)x;
    ms[0] = ms[1] = 0;
}
struct k3c_op_profile *k3c_decode_cuda_profile(k3c_decode_cuda *x) { (void)x; return NULL; }
int k3c_decode_cuda_stamp_report(k3c_decode_cuda *x, FILE *f, double plain_ms) {
    (void)x, (void)f, (void)plain_ms;
    return k3c_errorf("decode executor: no CUDA");
}

#endif
