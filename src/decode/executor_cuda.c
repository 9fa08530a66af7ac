/* The specialized decode executor on CUDA (decode/executor_cuda.h says what it is and what is not built
 * yet). Layout: build (buffers, weight addresses, one provider per layer part: decode/providers/),
 * prepare_kv / capture (the recorded step, decode/step.c, captured once per shape), run (metadata fill,
 * replay, logits), the plan table callbacks. The state and the launch helpers the files share:
 * decode/executor_cuda_internal.h. */
#include "decode/executor_cuda.h"

#ifdef K3C_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cuda/check.h"
#include "cuda/decode_copy.h"
#include "cuda/mla.h"
#include "cuda/sample.h"
#include "cuda/measure.h"
#include "comm/mailbox_cuda.h"
#include "decode/executor_cuda_internal.h"

/* K3C_CUDA_PROFILE=3 (cuda/stamp.h, decode/stamp_report.h): the next profiled step replays its graph with every
 * stamped kernel writing block stamps; the report maps them to the ops recorded at capture. Every MoE layer
 * routes into its own idx rows (idx_all) so that the step's routing is there to read after it (coverage,
 * expert bytes); each replay is timed with two events for the plain graph's GPU time. */
#define STAMP_EV 32 /* plain replays timed per shape (the last ones) */
struct k3c_exec_stamps {
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

static int wide_begin(void *ctx, const k3c_fwd_req *reqs, int n, int T); /* the wide route, below */
static int wide_run(void *ctx, int l, const float *xin, float *aout, int T);

static int alloc_buffers(k3c_decode_cuda *x) {
    const k3c_config *c = x->c;
    size_t R = PMAX, D = c->hidden_size, P = k3c_config_kda_proj(c), H = c->kda_num_heads;
    size_t dk = c->kda_head_dim, Hm = c->num_attention_heads, qh = k3c_config_mla_qk_head_dim(c);
    size_t lat = k3c_config_mla_latent(c), vh = c->v_head_dim, V = x->vocab, I = c->intermediate_size;
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
    /* the attention providers' own buffers (kq .. mg, q_abs, o_lat) hold arows rows, the wide route's too; x
     * and A need not (a wide step hands the providers the stock forward's x and A, wide_run) */
    size_t rows[sizeof w / sizeof w[0]];
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        rows[i] = (i >= 6 && i <= 25) || i == 28 || i == 29 ? (size_t)x->arows : R;
    int alt = c->attn_res_block_size > 0;
    size_t n = sizeof w / sizeof w[0], total = (size_t)(x->nres + alt) * al256(R * D * 4);
    for (size_t i = 0; i < n; i++) total += al256(rows[i] * (w[i] ? w[i] : 1) * 4);
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
        p += al256(rows[i] * (w[i] ? w[i] : 1) * 4);
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
    K3C_CUDA_MALLOC(&x->xbf, (size_t)x->arows * max_cols * 2); /* cuBLASLt's bf16 inputs, up to arows rows */
    if (x->tp) { /* the LM head's part and every rank's, gathered (step.c) */
        K3C_CUDA_MALLOC(&x->lm_part, R * c->vocab_size * sizeof(float));
        K3C_CUDA_MALLOC(&x->gather, (size_t)x->tp_size * R * c->vocab_size * sizeof(float));
    }
    K3C_TRY(k3c_cuda_gemm_init(&x->gemm, x->gemm_ws, ws, x->xbf, (size_t)x->arows * max_cols));
    x->gemm_ready = 1;
    K3C_CUDA_HOST_ALLOC(&x->keys_h, K3C_ARGMAX_KEYS_MAX * sizeof(uint64_t));
    return K3C_OK;
}

/* Every weight the step itself uses must resolve (checked once here, so recording cannot fail on it); the
 * providers check their own parts' (build). */
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
    }
    (void)d;
    return K3C_OK;
}

static void stamp_free(k3c_exec_stamps *sp) {
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
    k3c_exec_stamps *sp = calloc(1, sizeof *sp);
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

/* One provider per layer part (decode/providers/provider.h), as the seed's build_providers: the attention of
 * layer l by its kind, its feed-forward MoE or dense. */
static int build_providers(k3c_decode_cuda *x) {
    int L = x->c->num_layers;
    x->attn = calloc((size_t)L, sizeof *x->attn);
    x->ffn = calloc((size_t)L, sizeof *x->ffn);
    if (!x->attn || !x->ffn) return k3c_errorf_kind(K3C_ERROR_OOM, "decode executor: out of host memory");
    for (int l = 0; l < L; l++) {
        const k3c_layer_weights *lw = &x->m->weights.layers[l];
        x->attn[l] = (k3c_provider){lw->kind == K3C_ATTN_KDA ? &k3c_provider_kda : &k3c_provider_mla, x, l, NULL};
        K3C_TRY(x->attn[l].kind->build(&x->attn[l]));
        if (x->dep) continue; /* DEP: the feed-forward is the stock forward's (its MoE the EP exchange); kind NULL */
        x->ffn[l] = (k3c_provider){lw->is_moe ? &k3c_provider_moe : &k3c_provider_dense_mlp, x, l, NULL};
        K3C_TRY(x->ffn[l].kind->build(&x->ffn[l]));
    }
    return K3C_OK;
}

static void free_providers(k3c_decode_cuda *x) {
    for (int l = 0; x->attn && l < x->c->num_layers; l++)
        if (x->attn[l].kind) x->attn[l].kind->free(&x->attn[l]);
    for (int l = 0; x->ffn && l < x->c->num_layers; l++)
        if (x->ffn[l].kind) x->ffn[l].kind->free(&x->ffn[l]);
    free(x->attn);
    free(x->ffn);
}

/* A TP rank's executor without a communicator its graphs can capture (none, the staged one's host wait,
 * NCCL's own streams): no buffers, no providers, no stream; its plan table (world size, tp_prepared 0)
 * routes every step stock, the same on every rank (every rank gets the same kind of communicator). */
static int build_tp_unprepared(const k3c_decode_env *v, int world_size, k3c_decode_cuda **out) {
    k3c_decode_cuda *x = calloc(1, sizeof *x);
    if (!x) return k3c_errorf_kind(K3C_ERROR_OOM, "decode executor: out of memory");
    x->v = *v;
    x->m = v->m;
    x->c = &v->m->config;
    x->tp_unprepared = 1;
    memcpy(x->batches, k3c_prepared_batches, sizeof x->batches);
    x->ex = (k3c_decode_executor){.plan_table = {.batches = x->batches, .num_batches = K3C_PREPARED_NUM_BATCHES,
                                                 .wide_max = 0, .kv_prepared = 0, .needs_graphs = 1,
                                                 .world_size = world_size, .tp_prepared = 0},
                                  .ctx = x};
    *out = x;
    return K3C_OK;
}

/* The TP communicator of a prepared rank: the mailbox of this rank of this world, with slots for the
 * step's largest collectives (PREPARED_MAX rows: the hidden and routed-latent sums, the LM head's part). */
static int check_tp_comm(const k3c_decode_env *v, int rank, int world_size, int wide_rows) {
    const k3c_config *c = &v->m->config;
    k3c_comm_mailbox_info info;
    K3C_TRY(k3c_comm_mailbox_get_info(v->tp, &info));
    if (v->tp->rank != rank || v->tp->size != world_size)
        return k3c_errorf("decode executor: rank %d of %d built over the TP communicator of rank %d of %d", rank,
                          world_size, v->tp->rank, v->tp->size);
    size_t D = (size_t)c->hidden_size, Rin = (size_t)k3c_config_expert_in(c), need = PMAX * (D > Rin ? D : Rin);
    size_t lm = (size_t)PMAX * c->vocab_size; /* floats of this rank's LM head part */
    size_t wide = (size_t)wide_rows * D;       /* a wide step's attention sums (its LM head is stock) */
    if (lm > need) need = lm;
    if (wide > need) need = wide;
    if (info.cap < need)
        return k3c_errorf("decode executor: rank %d of %d: the mailbox carries %zu floats a call, its steps need %zu "
                          "(%d rows of hidden %zu, routed latent %zu, vocabulary part %d, %d wide rows; "
                          "k3c_comm_mailbox_options.cap)",
                          rank, world_size, info.cap, need, PMAX, D, Rin, c->vocab_size, wide_rows);
    return K3C_OK;
}

int k3c_decode_cuda_build(const k3c_decode_env *env, int rank, int world_size, k3c_decode_cuda **out) {
    *out = NULL;
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return k3c_errorf("decode executor: rank %d of a world of %d", rank, world_size);
    const k3c_decode_env v = *env;
    if (!k3c_backend_is_cuda(v.be)) return k3c_errorf("decode executor: the engine's backend is %s, not cuda", v.be->name);
    if (world_size > 1 && (v.m->tp_size != world_size || v.m->tp_rank != rank))
        return k3c_errorf("decode executor: rank %d of %d needs that rank's model shard (model/shard.h), not %s", rank,
                          world_size, v.m->tp_size > 1 ? "another rank's" : "the whole model");
    /* DEP (env.ep): the attention on this DP rank's own requests (TP1; or, the hybrid, over the DP group's TP
     * ranks, world_size > 1, their mailbox env.tp), the MoE exchanged over the EP group by the stock forward */
    int dep = v.ep && v.ep->size > 1;
    if (dep && (v.m->ep_size != v.ep->size || v.m->ep_rank != v.ep->rank))
        return k3c_errorf("decode executor: EP rank %d of %d needs that rank's expert shard (model/shard.h)", v.ep->rank,
                          v.ep->size);
    if (dep && !v.fwd)
        return k3c_errorf("decode executor: a DEP rank runs every step through the stock forward (k3c_decode_env.fwd)");
    if (!dep && v.m->ep_size > 1)
        return k3c_errorf("decode executor: the model is EP rank %d's expert shard of %d, but the env has no EP group",
                          v.m->ep_rank, v.m->ep_size);
    if (world_size > 1 && !(v.tp && k3c_comm_is_mailbox(v.tp))) return build_tp_unprepared(&v, world_size, out);
    /* decode context parallel: the MLA cache holds this rank's share of the positions and the stock forward
     * merges the ranks' partial attention (stock/forward.c mla_dcp); the MLA provider reads a whole cache, so
     * such a rank stays unprepared and every step runs stock, on every rank of the group alike */
    if (world_size > 1 && v.kv && v.kv->dcp > 1) return build_tp_unprepared(&v, world_size, out);
    /* the wide route's rows (below): TP1, or a hybrid rank's (its TP attention sums over the mailbox, the
     * stock forward's other sums over its own communicator) */
    int wide_rows = (world_size == 1 || dep) && v.fwd ? (v.max_rows < K3C_WIDE_MAX ? v.max_rows : K3C_WIDE_MAX) : 0;
    if (wide_rows < 0) wide_rows = 0;
    if (world_size > 1) K3C_TRY(check_tp_comm(&v, rank, world_size, wide_rows));
    if (world_size == 1 && v.m->tp_size > 1)
        return k3c_errorf("decode executor: the model is rank %d's shard of a TP group of %d, built for world size 1",
                          v.m->tp_rank, v.m->tp_size);
    if (k3c_backend_cuda_exact(v.be))
        return k3c_errorf("decode executor: the backend runs the exact f32 diagnostic (no specialized path)");
    k3c_decode_cuda *x = calloc(1, sizeof *x);
    if (!x) return k3c_errorf_kind(K3C_ERROR_OOM, "decode executor: out of memory");
    x->v = v;
    x->m = v.m;
    x->c = &v.m->config;
    const k3c_config *c = x->c;
    x->tp = world_size > 1 ? v.tp : NULL;
    x->tp_rank = rank;
    x->tp_size = world_size;
    x->vocab = c->vocab_size * world_size;
    if (x->tp) { /* the row-parallel products' epilogue writes into the peers' slots (launch.c) */
        k3c_comm_mailbox_push push;
        int rc = k3c_comm_mailbox_push_targets(x->tp, &push);
        if (rc != K3C_OK) {
            free(x);
            return k3c_error_context("decode executor, TP rank %d of %d: ", rank, world_size);
        }
        x->tp_push.parity_floats = push.parity_floats;
        x->tp_push.parity_word = push.epoch;
        x->tp_push.skip = push.failed;
        for (int p = 0; p < push.ranks && p < K3C_CUDA_FANOUT_MAX; p++)
            if (push.slot[p]) x->tp_push.dst[x->tp_push.n++] = push.slot[p];
    }
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
    /* the wide route (the header), over the engine's stock forward, up to K3C_WIDE_MAX rows and the forward's
     * max_rows: at TP1, and on a hybrid rank (every step of a DP group's TP ranks is planned alike, so their
     * attention providers' sums pair); a plain TP rank's verify steps past the batches stay stock */
    x->dep = dep;
    x->wide_rows = wide_rows;
    x->arows = x->wide_rows > PMAX ? x->wide_rows : PMAX;
    x->wide_attn = (k3c_forward_attention){.ctx = x, .begin = wide_begin, .run = wide_run};
    /* DEP: no fully specialized step (the seed's build_dep: no batches, no graphs), every decode or uniform
     * verify step up to wide_rows wide */
    x->ex = (k3c_decode_executor){.plan_table = {.batches = x->batches,
                                                 .num_batches = dep ? 0 : K3C_PREPARED_NUM_BATCHES,
                                                 .wide_max = x->wide_rows, .kv_prepared = 0, .needs_graphs = !dep,
                                                 .world_size = world_size, .tp_prepared = 1, .wide_decode = dep},
                                  .ctx = x};
    cudaError_t ce = cudaSetDevice(k3c_backend_cuda_device(v.be));
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&x->st, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        k3c_decode_cuda_free(x);
        return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(ce), "decode executor: stream: %s", cudaGetErrorString(ce));
    }
    x->prof = k3c_op_profile_create_from_env();
    if (alloc_buffers(x) != K3C_OK || check_weights(x) != K3C_OK || build_providers(x) != K3C_OK ||
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
    if (x->lm_part) cudaFree(x->lm_part);
    if (x->gather) cudaFree(x->gather);
    if (x->meta_d) cudaFree(x->meta_d);
    if (x->meta_h) cudaFreeHost(x->meta_h);
    if (x->keys_h) cudaFreeHost(x->keys_h);
    k3c_op_profile_free(x->prof);
    stamp_free(x->stamp);
    if (x->st) cudaStreamDestroy(x->st);
    free_providers(x);
    free(x->res);
    free(x->kda_ord);
    free(x);
}

/* ---- the stamp plan at capture (executor_cuda_internal.h: STAMP_BYTES, P_TRY) ---- */

k3c_stamp_plan *k3c_exec_stamp_plan(const k3c_decode_cuda *x) { return x->stamp ? x->stamp->rec : NULL; }

int *k3c_exec_moe_idx(k3c_decode_cuda *x, int l) {
    int K = x->c->num_experts_per_token;
    return x->stamp ? x->stamp->idx_all + (size_t)l * PMAX * K : x->idx;
}

void k3c_exec_stamp_op_begin(k3c_decode_cuda *x, const char *op) {
    k3c_exec_stamps *sp = x->stamp;
    if (!sp || !sp->rec) return;
    k3c_stamp_plan_begin(sp->rec, op);
    if (sp->rec->depth == 1) {
        sp->n0 = k3c_cuda_capture_kernel_nodes(x->st);
        sp->f0 = k3c_cuda_stamp_foreign_nodes();
    }
}
void k3c_exec_stamp_op_end(k3c_decode_cuda *x) {
    k3c_exec_stamps *sp = x->stamp;
    if (!sp || !sp->rec) return;
    long n1 = sp->rec->depth == 1 ? k3c_cuda_capture_kernel_nodes(x->st) : 0;
    long f = k3c_cuda_stamp_foreign_nodes() - sp->f0;
    if (sp->rec->depth != 1) k3c_stamp_plan_end(sp->rec, 0, 0);
    else k3c_stamp_plan_end(sp->rec, sp->n0 < 0 || n1 < 0 ? -1 : n1 - sp->n0 - f, f);
}

/* ---- prepare_kv, capture ---- */

int k3c_decode_cuda_prepare_kv(k3c_decode_cuda *x, int eager) {
    const k3c_decode_env *v = &x->v;
    if (!v->kv || !v->kv->base || !v->ks)
        return k3c_errorf("decode executor: prepare_kv: the engine has no bound caches");
    if (x->meta_h || (x->tp_unprepared && x->kv_prepared)) return k3c_errorf("decode executor: prepare_kv called twice");
    if (x->tp_unprepared) { /* nothing to bind or capture: every step plans stock */
        x->kv_prepared = 1;
        x->ex.plan_table.kv_prepared = 1;
        return K3C_OK;
    }
    x->bs = v->block_size;
    x->mbr = v->max_blocks_per_request;
    size_t off = 0;
#define CARVE(field, bytes) (x->field = off, off += al256(bytes))
    /* arows rows (and requests: a request has a row at least) of every kind, the wide route's too */
    size_t A = (size_t)x->arows;
    CARVE(off_ids, sizeof(int) * A);
    CARVE(off_slots, sizeof(int) * A);
    CARVE(off_aoff, sizeof(int) * A);
    CARVE(off_alen, sizeof(int) * A);
    CARVE(off_tab, sizeof(int) * A * x->mbr);
    CARVE(off_segs, sizeof(k3c_cuda_seg) * A * (x->nkda ? x->nkda : 1));
    CARVE(off_pre, sizeof(k3c_cuda_copy) * A * PRE_COPIES * (x->nkda ? x->nkda : 1));
    CARVE(off_post, sizeof(k3c_cuda_copy) * A * POST_COPIES * (x->nkda ? x->nkda : 1));
#undef CARVE
    x->meta_bytes = off;
    K3C_CUDA_HOST_ALLOC(&x->meta_h, off);
    memset(x->meta_h, 0, off);
    K3C_CUDA_MALLOC(&x->meta_d, off);
    K3C_CUDA_TRY(cudaMemset(x->meta_d, 0, off));
    x->kv_prepared = 1;
    x->eager = eager;
    x->ex.plan_table.kv_prepared = 1;
    if (!eager || x->dep) return K3C_OK; /* DEP: no shapes to capture */
    int shapes[128][2];
    int n = k3c_prepared_shapes(v->q_max, v->max_requests, shapes, 128);
    for (int i = 0; i < n && i < 128; i++) K3C_TRY(k3c_decode_cuda_capture(x, shapes[i][0], shapes[i][1]));
    return K3C_OK;
}

int k3c_decode_cuda_capture(k3c_decode_cuda *x, int rows, int q) {
    if (x->tp_unprepared)
        return k3c_errorf("decode executor: rank %d of %d: the providers are not prepared for tensor parallelism "
                          "(every step runs stock)", x->m->tp_rank, x->m->tp_size);
    if (!x->kv_prepared) return k3c_errorf("decode executor: capture before prepare_kv");
    if (x->dep) return k3c_errorf("decode executor: a DEP rank captures no shapes (every step it takes is wide)");
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
    int rc = k3c_exec_record_step(x, rows, q);
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
    /* TP: uploaded now, so that the first replay, which the peers' mailbox kernels may already wait for,
     * does no more than launch (an upload may wait for the device, where the peers spin) */
    if (x->tp && ((ce = cudaGraphUpload(ge, x->st)) != cudaSuccess || (ce = cudaStreamSynchronize(x->st)) != cudaSuccess)) {
        cudaGraphExecDestroy(ge);
        return k3c_errorf_kind(K3C_CUDA_ERROR_KIND(ce), "decode executor: uploading (%d rows, q %d): %s", rows, q,
                               cudaGetErrorString(ce));
    }
    x->graph[rows][q] = ge;
    x->num_captured++;
    return K3C_OK;
}

int k3c_decode_cuda_process_weights_after_loading(k3c_decode_cuda *x) {
    /* No derived copies exist yet (no packed projections): the graphs read the backbone in place, so new
     * weights in the same storage are used by the next replay. Check the addresses did not move; each
     * provider re-derives its own part (none derives anything yet) and checks its addresses. */
    if (x->tp_unprepared) return K3C_OK; /* no providers */
    K3C_TRY(check_weights(x));
    for (int l = 0; l < x->c->num_layers; l++) {
        K3C_TRY(x->attn[l].kind->reload(&x->attn[l]));
        if (x->ffn[l].kind) K3C_TRY(x->ffn[l].kind->reload(&x->ffn[l])); /* none at DEP */
    }
    return K3C_OK;
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
    int bs = x->bs, V = x->vocab;
    /* TP: the embedding's rows are this rank's part of the vocabulary (ids outside it -1: a row of -0.0) */
    int v0 = x->c->vocab_size * x->tp_rank, Vl = x->c->vocab_size;
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
            ids[t] = !x->tp ? r->ids[j] : r->ids[j] >= v0 && r->ids[j] < v0 + Vl ? r->ids[j] - v0 : -1;
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
                k3c_cuda_copy *c0 = pre + ((size_t)k * x->arows + i) * PRE_COPIES;
                c0[0] = (k3c_cuda_copy){x->kq + row0 * P, stv + k3c_kda_store_x(ks, 0), (long long)rows};
                c0[1] = (k3c_cuda_copy){x->kk + row0 * P, stv + k3c_kda_store_x(ks, 1), (long long)rows};
                c0[2] = (k3c_cuda_copy){x->kv + row0 * P, stv + k3c_kda_store_x(ks, 2), (long long)rows};
                k3c_cuda_copy *c1 = post + ((size_t)k * x->arows + i) * POST_COPIES;
                c1[0] = (k3c_cuda_copy){x->ck + row0 * P, stv + k3c_kda_store_k(ks), (long long)rows};
                c1[1] = (k3c_cuda_copy){x->cv + row0 * P, stv + k3c_kda_store_v(ks), (long long)rows};
                c1[2] = (k3c_cuda_copy){x->kg + row0 * P, stv + k3c_kda_store_g(ks), (long long)rows};
                c1[3] = (k3c_cuda_copy){x->kbeta + row0 * ks->H, stv + k3c_kda_store_beta(ks), (long long)q * ks->H};
            }
            /* verify (q > 1) reads the committed slot and leaves it as it was (the stock path runs on a scratch
             * copy of it: the same values in, the same bits out); commit folds the accepted tokens in */
            segs[(size_t)k * x->arows + i] = (k3c_cuda_seg){i * q, q, state, window, q > 1};
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
    size_t V = (size_t)x->vocab;
    double t0 = x->prof ? wall_ms() : 0;
    int parts = ids ? argmax_parts(T) : 0;
    if (ids) { /* after the graph, not in it: the same graph serves both kinds of step */
        K3C_TRY(k3c_cuda_argmax_keys(x->logits, T, (int)V, parts, x->keys_d, x->st));
        K3C_CUDA_TRY(cudaMemcpyAsync(x->keys_h, x->keys_d, (size_t)T * parts * sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, x->st));
    } else {
        /* pageable: the step drained first (cuda/check.h k3c_cuda_host_pageable: at TP on one device a
         * pageable copy that waits inside the driver stalls the peers' launches) */
        if (k3c_cuda_host_pageable(logits)) K3C_CUDA_TRY(cudaStreamSynchronize(x->st));
        K3C_CUDA_TRY(cudaMemcpyAsync(logits, x->logits, (size_t)T * V * sizeof(float), cudaMemcpyDeviceToHost, x->st));
    }
    if (x->v.num_aux > 0 && k3c_cuda_host_pageable(aux)) K3C_CUDA_TRY(cudaStreamSynchronize(x->st));
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
    int rc = k3c_op_profile_arm(x->prof, x->st) == 0 ? k3c_exec_record_step(x, T, q)
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
    k3c_exec_stamps *sp = x->stamp;
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
    if (argmax) k3c_stamp_plan_add(&sp->last_plan, "argmax", 1, 4.0 * T * x->vocab);
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
    k3c_exec_stamps *sp = x->stamp;
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
    if (x->tp_unprepared)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "decode executor: rank %d of %d: a step routed to an executor not "
                               "prepared for tensor parallelism", x->m->tp_rank, x->m->tp_size);
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
        K3C_TRY(k3c_op_profile_stamps(x->prof) ? run_stamped(x, T, q) : k3c_exec_record_step(x, T, q));
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

/* ---- the wide route (the header; stock/forward.h k3c_forward_attention) ---- */

/* The step's metadata, as for a captured step (fill_meta: b requests of q rows), uploaded on the backend's
 * stream, where the providers' launches read it (wide_run). The pinned block is free: every step ends with
 * its stream drained. */
static int wide_begin(void *ctx, const k3c_fwd_req *reqs, int n, int T) {
    k3c_decode_cuda *x = ctx;
    int q = n > 0 ? reqs[0].n : 0;
    if (n < 1 || q < 1 || q > QMAX || n * q != T || T > x->wide_rows)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "decode executor: a wide step of %d requests, %d rows (q %d): "
                               "the wide route takes uniform steps of at most %d rows, q at most %d", n, T, q,
                               x->wide_rows, QMAX);
    K3C_TRY(fill_meta(x, reqs, n, q));
    x->wide_q = q;
    K3C_CUDA_TRY(cudaMemcpyAsync(x->meta_d, x->meta_h, x->meta_bytes, cudaMemcpyHostToDevice, x->st));
    return K3C_OK;
}

/* Layer l's attention provider on the stock forward's normed input xin, its output into the stock forward's
 * A: the provider reads x->x and leaves its output in x->A, so both name the stock buffers for the call (the
 * captured graphs keep the addresses they were recorded with). Launched eagerly on x->st, which run_wide
 * points at the backend's stream: ordered after the stock ops that wrote xin, before those that read A. */
static int wide_run(void *ctx, int l, const float *xin, float *aout, int T) {
    k3c_decode_cuda *x = ctx;
    const k3c_provider *p = &x->attn[l];
    k3c_exec_rec s = {x, T, x->wide_q, T / x->wide_q};
    float *own_x = x->x, *own_a = x->A;
    x->x = (float *)xin;
    x->A = aout;
    k3c_provider_out o = {0};
    int rc = p->kind->record(p, &s, &o);
    x->x = own_x;
    x->A = own_a;
    K3C_TRY(rc);
    if (o.a1 != aout || o.a2)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "decode executor: layer %d's %s provider left its output elsewhere",
                               l, p->kind->name);
    return K3C_OK;
}

/* A step planned K3C_ROUTE_WIDE: the engine's stock forward with the attention providers in place of its
 * attention (k3c_forward_step_attn), on the backend's stream; logits as the stock forward returns them (the
 * LM head is the stock one: no device arg-max). A DEP rank's dummy step (n = 0) is the stock dummy step, the
 * same collectives. A refusal here, before the stock step, aborts a DEP rank's EP group: its peers wait in the
 * step's first collective. */
static int run_wide(k3c_decode_cuda *x, const k3c_plan *plan, const k3c_fwd_req *reqs, int n, float *logits,
                    int32_t *ids, float *aux) {
    int rc = K3C_OK;
    if (!x->wide_rows)
        rc = k3c_errorf_kind(K3C_ERROR_INTERNAL, "decode executor: a wide step, but this executor has no wide route "
                             "(TP %d, stock forward %s)", x->tp_size, x->v.fwd ? "given" : "not given");
    else if (!x->kv_prepared || !x->meta_h)
        rc = k3c_errorf_kind(K3C_ERROR_INTERNAL, "decode executor: a wide step before prepare_kv");
    else if (ids)
        rc = k3c_errorf_kind(K3C_ERROR_INTERNAL, "decode executor: a wide step returns logits (the stock LM head), not ids");
    else if (plan->rows > x->wide_rows || (n == 0 && !x->dep) || n < 0)
        rc = k3c_errorf_kind(K3C_ERROR_INTERNAL, "decode executor: a wide step of %d requests, %d rows (cap %d%s)", n,
                             plan->rows, x->wide_rows, x->dep ? "" : "; an empty step only on a DEP rank");
    if (rc != K3C_OK) {
        if (x->dep) x->v.ep->abort(x->v.ep);
        if (x->tp) x->tp->abort(x->tp);
        return rc;
    }
    /* the op profile times the replayed steps' ops on x->st and collects after them: a wide step is not
     * profiled (its stock ops are the stock path's, cuda/op_profile.h) */
    cudaStream_t own = x->st;
    k3c_op_profile *prof = x->prof;
    x->st = (cudaStream_t)k3c_backend_cuda_stream(x->v.be);
    x->prof = NULL;
    rc = k3c_forward_step_attn(x->v.fwd, x->v.kv, x->v.ks, reqs, n, logits, aux, &x->wide_attn);
    x->st = own;
    x->prof = prof;
    if (rc == K3C_OK) x->wide_steps++;
    return rc;
}

/* A TP rank's step ends with the mailbox's report (its kernels fail, after the timeout at most, when a peer
 * does not come; the stream is drained by then); a failure of any kind aborts the group, so the peers' waits
 * end at once instead of at their timeout, and every later collective of the group fails. */
static int step_cb(void *ctx, const k3c_plan *plan, const k3c_fwd_req *reqs, int n, float *logits, int32_t *ids,
                   float *aux) {
    k3c_decode_cuda *x = ctx;
    int rc = plan->route == K3C_ROUTE_WIDE ? run_wide(x, plan, reqs, n, logits, ids, aux)
                                           : run_step(x, plan, reqs, n, logits, ids, aux);
    if (x->tp && rc == K3C_OK) rc = k3c_comm_mailbox_check(x->tp);
    if (x->tp && rc != K3C_OK) {
        x->tp->abort(x->tp);
        return k3c_error_context("decode executor, TP rank %d of %d: ", x->tp_rank, x->tp_size);
    }
    return rc;
}

static int capture_cb(void *ctx, int rows, int q) { return k3c_decode_cuda_capture(ctx, rows, q); }
static int num_captured_cb(void *ctx) { return k3c_decode_cuda_num_captured(ctx); }

const k3c_decode_executor *k3c_decode_cuda_executor(k3c_decode_cuda *x) {
    x->ex.step = step_cb;
    x->ex.capture = x->dep ? NULL : capture_cb; /* DEP: no shapes (k3c_engine_warmup then captures nothing) */
    x->ex.num_captured = num_captured_cb;
    x->ex.plan_table.captured = captured_cb;
    x->ex.plan_table.captured_ctx = x;
    return &x->ex;
}

int k3c_decode_cuda_num_captured(const k3c_decode_cuda *x) { return x->num_captured; }

void k3c_decode_cuda_counts(const k3c_decode_cuda *x, long *replays) {
    if (replays) *replays = x->replays;
}

void k3c_decode_cuda_tp_fusions(const k3c_decode_cuda *x, long *rowpar, long *norm, long *round) {
    if (rowpar) *rowpar = x->fused_rowpar;
    if (norm) *norm = x->fused_norm;
    if (round) *round = x->fused_round;
}
long k3c_decode_cuda_wide_steps(const k3c_decode_cuda *x) { return x->wide_steps; }

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
void k3c_decode_cuda_tp_fusions(const k3c_decode_cuda *x, long *rowpar, long *norm, long *round) {
    (void)x;
    if (rowpar) *rowpar = 0;
    if (norm) *norm = 0;
    if (round) *round = 0;
}
void k3c_decode_cuda_free(k3c_decode_cuda *x) { (void)x; }
long k3c_decode_cuda_wide_steps(const k3c_decode_cuda *x) { (void)x; return 0; }
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
