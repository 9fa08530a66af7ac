/* The stock forward: the layer loop over backend ops, as the published modeling code runs it.
 *
 * Rounding contract (what every backend must reproduce; "rnd" = round to nearest-even bf16, stored in the
 * activation buffer; everything else is f32):
 *   embedding rows                 exact bf16 weights
 *   AttnRes Mix output             rnd  (as HF: Mix rounded, then RMSNorm)
 *   AttnRes prefix P, blocks       rnd  (every add P + A, P + F rounded; blocks are copies of P)
 *   plain residual h               rnd  (h + A, h + F rounded)
 *   RMSNorm outputs                rnd  (input / post norms, MLA q_a / kv_a norms, final norm)
 *   every matmul output            rnd  (projections, f_a/f_b, g_a/g_b, b_proj, o_proj, MLP, ...),
 *                                       except the final logits (f32)
 *   KDA conv + SiLU output         rnd; the conv window keeps the rounded pre-conv matmul outputs
 *   KDA q/k L2 norm (+ q scale)    f32; decay g, beta = sigmoid(b) f32; delta-rule state f32
 *   KDA delta-rule output o        rnd;  gated norm output rnd
 *   MLA latent row [c_normed|k_pe] rnd (kv_a matmul rnd, c normed rnd, k_pe as the matmul gave it)
 *   MLA attention output o         rnd  (absorbed: q_abs, scores, softmax, o_lat are f32 inside the op)
 *   MLA expanded (prompt segments) decompressed k_nope = W_UK c and v = W_UV c rnd (outputs of the kv_b
 *                                  matmul, f32 accumulate); scores, softmax, sum p v f32; o rnd
 *   MLA output gate o*sigmoid(g)   rnd
 *   gated activation (SwiGLU/SiTU) rnd
 *   MoE                            see backend/backend.h (moe)
 *
 * Batch invariance (docs/DESIGN.md): a row's arithmetic depends only on its request's tokens and its absolute
 * position, never on the other requests of the step, on speculation or on how the prompt was cut into steps.
 * Every op computes each row with a fixed reduction order (the backends' contract); what would still depend on
 * the step's shape is the choice between two forms of the same function, so that choice is made per row by
 * position, on a grid of aligned blocks:
 *   KDA, block C (chunk_min, default 64): the rows of a non-verify request at positions [k C, (k + 1) C) that
 *     all lie in this step run the chunked delta rule as one block (the backend's own chunking starts at the
 *     block); every other row (a prompt's ragged head or tail, decode, verify, commit) runs the recurrence,
 *     token by token, the same function for all of them. A request's rows then take up to three passes (rows
 *     before its first whole block, the whole blocks, the rows after), each continuing the state the last left.
 *   MLA, block E (mla_expand_min, default 128, a multiple of C): rows of a non-verify request in whole aligned
 *     E-blocks of the step attend in the expanded form (spec §3.2: latents decompressed once per step and
 *     shared by the rows), every other row in the absorbed form (spec §3.3). Both are the same function in
 *     exact arithmetic; in the contract they differ only by the rounding of the decompressed k / v.
 * A prompt cut only at multiples of the blocks (k3c_forward_prompt_piece) puts every whole block in one step,
 * so each row takes the same form however the prompt is cut; a cut elsewhere is valid but may change forms.
 * Cost: the expanded form decompresses context x (nope + v) x kv_lora per head and step, the absorbed one
 * spends about (2 kv_lora + rope) per row, position and head (plus q_abs and W_UV per row); at K3's shapes
 * the expanded form is cheaper in arithmetic only for chunks of more than ~170 rows (~340 for a chunk that
 * starts the context, whose rows see half of it on average), hence a default block of 128 rows.
 *
 * Buffers: every activation is a backend buffer [max_rows, width]; a step uses the first T rows. The
 * forward never reads them: it hands pointers and host metadata (segments, block tables) to the ops.
 *
 * Parallel ranks (forward.h k3c_forward_options groups; comm/comm.h). Every collective is preceded by a sync
 * of the backend (none with a stream-ordered communicator on a device backend: it is queued behind the ops),
 * and a failed one aborts the rank's groups and ends the step with the error. PP and DEP run on either kind
 * of backend: what crosses is backend memory (device buffers on the CUDA backend, its communicator staged
 * or NCCL), and the host reads of the exchange below (counts, routing tables) wait for the backend first.
 *   TP: the row-parallel partials summed in rank order (tp_sum), the logits gathered.
 *   PP: stage s runs layers [l0, l1) of the shard. What crosses a boundary is what the next layer reads: with
 *     AttnRes the completed block outputs res[0 .. nb) and the block-partial prefix res[nb], nb the blocks
 *     closed before l1 (P is never empty between layers: a layer ends with P + F), every row of the step;
 *     without AttnRes the residual h = res[0]. Bitwise copies, so a stage computes exactly what world size 1
 *     computes for its layers. One send per buffer, in order, to stage s + 1.
 *   DEP (ep): a rank's rows are its own requests'; attention, the dense MLP and the shared experts run on them
 *     locally with whole weights. Per MoE layer (moe_ep): every rank routes its rows (k3c_route order: pair
 *     (t, j) is row t's j-th selected expert), the routing tables are all-gathered, padded to the step's
 *     largest row count Tp (gathered once per step; -1 past a rank's rows, so an idle rank's table is all -1),
 *     each pair's expert input row goes to the rank holding its expert (all-to-all: per destination in rank
 *     order, in (t, j) order inside), the experts run there, their outputs come back in the same order, and
 *     the token's own rank sums them: r = rnd(sum_j w_j d_j) in j order. That order does not involve the
 *     ranks at all: a token's MoE output is bitwise world size 1's, whichever rank computed which expert (the
 *     expert products are row-invariant, backend.h).
 *   DCP (dcp, inside TP; mla_dcp): each MLA layer's latent cache is sharded by position over the DCP group,
 *     interleaved (position p on DCP rank p % dcp, at local slot p / dcp): a decode step then appends on one
 *     rank and every rank reads 1/dcp of the context, the same share, whatever the length (contiguous runs
 *     would put a decode's whole read on the rank holding the tail, and fill one rank before the next: vLLM's
 *     and SGLang's choice too, parallel.md §2.6). Only the owning rank stores a position's latent. Every rank
 *     absorbs its heads' queries, the group all-gathers them, each rank attends every head of the group over
 *     its own positions (the output normalized over them and its log-sum-exp per row and head, backend.h
 *     mla_attention_part), each rank's heads' partials go to it (an all-to-all, or an all-gather where the
 *     group has none) and it merges them in DCP rank order (mla_merge), then W_UV and o_proj as under TP.
 *     The merge runs on the same gathered bits on every rank in the same order,
 *     so the ranks agree bitwise; against TP without DCP the sums differ only by f32 reassociation. Prompt
 *     rows take the same path (sharded over the keys, every row absorbed): the expanded form would need every
 *     head's kv_b on every rank, or the context's latents gathered to each rank each layer (the bytes DCP
 *     saves), so under DCP there is no expanded block (mla_block 0).
 *   Hybrid (tp and ep): TP attention inside each DP group (the TP sums above), the MoE as DEP over every rank
 *     of the stage: the TP ranks of a group hold the same rows and each sends its pairs and combines them
 *     itself, so every TP rank ends with the same MoE output (its rows' experts run once per TP rank). */
#include "stock/forward.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "util/error.h"

struct k3c_forward {
    k3c_backend *be;
    const struct k3c_model *m;
    const k3c_config *c;
    k3c_forward_options o;
    int *aux_layers;
    int kda_block; /* C of the invariance grid (top of the file); 0: no chunked form */
    int mla_block; /* E; 0: no expanded form */

    void *arena; /* one backend allocation carved into the buffers below */
    int nres;    /* residual buffers: num_attn_res_blocks + 1 with AttnRes, else 1 */
    float **res; /* [nres] each [R, D] */
    float *a_in, *x, *A, *F;             /* [R, D] */
    float *kq, *kk, *kv, *cq, *ck, *cv;  /* [R, P] */
    float *kf, *kg, *ko, *kz, *ky;        /* [R, P] */
    float *klow;                         /* [R, dk] f_a / g_a output */
    float *kb, *kbeta;                   /* [R, H] */
    float *mqa, *mq, *mlat, *mo, *mg;    /* [R, q_lora], [R, Hm*qh], [R, lat], [R, Hm*v] x2 */
    float *ga, *gu;                      /* [R, I] dense MLP */
    float *G;                            /* [R, D] rows picked for logits */
    float *aux;                          /* [num_aux, R, D]: stream i of a step with N logits rows at i * N * D */
    float *logits;                       /* [R, V] f32 */

    /* host metadata, sized once */
    int32_t *ids;   /* [R] */
    int *rows;      /* [R] */
    k3c_seg *segs;  /* [max_segs] */
    k3c_seg *kda_parts; /* [3, max_segs]: pass j of the delta rule holds part j of each request (its first, ...) */
    k3c_seg *mla_abs;   /* [2 max_segs] this step's absorbed MLA segments (a request's rows around its blocks) */
    k3c_seg *mla_exp;   /* [max_segs] its expanded ones (a request's whole E-blocks) */
    int mla_nabs, mla_nexp;
    const float **srcs; /* [nres] Mix sources */

    /* tensor parallel (forward.h k3c_forward_options.tp): NULL at world size 1 */
    k3c_comm *tp;
    int vocab;          /* the full vocabulary (the shard's c->vocab_size is its part) */
    int32_t *ids_local; /* [R] host: a token's row in this rank's vocabulary part, -1 for another rank's */
    float *mr, *ms;     /* [R, expert_in], [R, D]: the MoE's partial routed and shared sums */
    float *gather;      /* [tp, R, V / tp]: the logits parts of every rank */
    int failed;         /* a collective of this step failed: the step returns the error */

    /* pipeline (top of the file): NULL with one stage */
    k3c_comm *pp;
    int l0, l1;         /* the stage's layers [l0, l1) */

    /* decode context parallel (top of the file, mla_dcp): NULL without */
    k3c_comm *dcp;
    float *dq, *dqg, *dqa; /* [R, Hm lat] absorbed queries; [dcp, R, Hm lat] gathered; [R, dcp Hm, lat] per row */
    float *dpk, *dpg;      /* [R, dcp Hm (kv_lora + 1)] this rank's partials [o_lat | lse]; [dcp, ...] gathered
                            * (or the packs sent, one per rank, with an all-to-all) */
    float *dpm;            /* [dcp, R, Hm (kv_lora + 1)]: this rank's heads' partials from every rank, part r
                            * [o_lat [T, Hm, kv_lora] | lse [T, Hm]] at r T Hm (kv_lora + 1) */
    int *dcp_rows;         /* [dcp R] host: row indices of the reorderings */

    /* DP attention + EP MoE (top of the file, moe_ep): NULL without */
    k3c_comm *ep;
    int ep_per;         /* experts per rank: expert e lives on rank e / ep_per */
    int ep_rows;        /* this step's Tp: the most rows any rank of the group has */
    int *ep_idx;        /* [R, K] host: this rank's routing, padded with -1 to Tp rows */
    int *ep_all;        /* [ep, R, K] host: every rank's, gathered ([ep, Tp, K] packed) */
    int *ep_send_rows;  /* [R K] host: the rows of z sent, in send order (per destination, (t, j) inside) */
    int *ep_pair;       /* [R K] host: pair (t, j)'s place in the send order (= its output's in ep_back) */
    int *ep_expert;     /* [ep R K] host: the expert of each received row */
    size_t *ep_sb, *ep_rb; /* [ep] bytes sent to / received from each rank */
    int *ep_cnt;        /* [ep + 1] backend: the ranks' row counts (the gather's source last) */
    int *ep_idx_buf, *ep_all_buf; /* [R K], [ep R K] backend copies of ep_idx and ep_all (in ep_cnt's block) */
    float *ep_w;        /* [R, K] routing weights */
    float *ep_z;        /* [R, expert_in] the expert input rows */
    float *ep_send, *ep_back;  /* [R K, expert_in]: dispatched rows; their experts' outputs, back */
    float *ep_recv, *ep_out;   /* [ep R K, expert_in]: rows received for this rank's experts; their outputs */
};

static size_t maxz(size_t a, size_t b) { return a > b ? a : b; }

/* A group given to the forward (forward.h): NULL or one rank is none. */
static k3c_comm *group(k3c_comm *c) { return c && c->size > 1 ? c : NULL; }

/* The layout the options describe against the model's shard and the backend (before anything is made). */
static int check_groups(const k3c_backend *be, const struct k3c_model *m, const k3c_forward_options *o) {
    k3c_comm *tp = group(o->tp), *pp = group(o->pp), *ep = group(o->ep);
    k3c_comm *all[3] = {tp, pp, ep};
    for (int i = 0; i < 3; i++)
        if (all[i] && strcmp(all[i]->name, "nccl") == 0 && strcmp(be->name, "cpu") == 0)
            return k3c_errorf("forward: an NCCL communicator moves device memory, the cpu backend's buffers are host "
                              "memory (use the in-memory group, comm/comm.h)");
    if (tp) {
        if (m->tp_size != tp->size || m->tp_rank != tp->rank)
            return k3c_errorf("forward: rank %d of a TP group of %d needs that rank's model shard (model/shard.h), "
                              "not %s", tp->rank, tp->size, m->tp_size > 1 ? "another rank's" : "the whole model");
        if (!be->round || !be->moe_partial)
            return k3c_errorf("forward: backend %s has no tensor-parallel ops (round, moe_partial)", be->name);
    }
    if (pp || m->pp_size > 1) {
        if (!pp || m->pp_size != pp->size || m->pp_stage != pp->rank)
            return k3c_errorf("forward: %s needs %s (model/shard.h k3c_model_shard)",
                              pp ? "stage %d of a pipeline" : "a pipeline stage's shard", pp ? "that stage's shard"
                                                                                            : "its pipeline group");
        /* the stage's buffers cross through the group's send / recv, in the backend's memory (checked below):
         * host memory on the cpu backend, device memory ordered on the backend's stream on a device backend */
        if (!pp->send || !pp->recv)
            return k3c_errorf("forward: the %s communicator has no send / recv, which pipeline stages need",
                              pp->name);
        if (o->num_aux > 0) return k3c_errorf("forward: aux streams with pipeline stages are not built");
    }
    if (o->dcp > 1) {
        k3c_comm *d = o->dcp_group ? group(o->dcp_group) : tp;
        if (!tp || tp->size % o->dcp != 0)
            return k3c_errorf("forward: dcp %d needs a TP group whose size it divides (tp %d)", o->dcp, tp ? tp->size : 1);
        if (!d || d->size != o->dcp || d->rank != tp->rank % o->dcp)
            return k3c_errorf("forward: dcp %d: %s", o->dcp,
                              o->dcp_group ? "the DCP group must hold dcp ranks, rank tp_rank % dcp"
                                           : "dcp smaller than tp needs its DCP group (dcp_group)");
        if (!be->mla_absorb || !be->mla_attention_part || !be->mla_merge)
            return k3c_errorf("forward: backend %s has no decode-context-parallel ops (mla_absorb, "
                              "mla_attention_part, mla_merge)", be->name);
        if (d->stream_ordered != tp->stream_ordered)
            return k3c_errorf("forward: dcp %d: the DCP group (%s) and the TP group (%s) work on different memory",
                              o->dcp, d->name, tp->name);
    }
    if (ep || m->ep_size > 1) {
        if (!ep || m->ep_size != ep->size || m->ep_rank != ep->rank)
            return k3c_errorf("forward: %s needs %s (model/shard.h k3c_model_shard)",
                              ep ? "an EP rank" : "an expert-parallel shard", ep ? "that rank's shard" : "its EP group");
        if (tp && (m->tp_size != tp->size || ep->size % tp->size))
            return k3c_errorf("forward: the hybrid layout (a TP group of %d with an EP group of %d) needs the EP group "
                              "to span whole TP groups and that rank's hybrid shard", tp->size, ep->size);
        if (!be->moe_route || !be->moe_experts || !be->moe_combine)
            return k3c_errorf("forward: backend %s has no expert-parallel ops (moe_route, moe_experts, moe_combine)",
                              be->name);
        if (!ep->all_to_all)
            return k3c_errorf("forward: the %s communicator has no all_to_all, which expert parallelism needs",
                              ep->name);
    }
    /* a communicator must work on the backend's memory (comm/comm.h): host memory for the CPU backend, device
     * memory on the backend's stream for a device backend */
    int host_be = strcmp(be->name, "cpu") == 0;
    for (int i = 0; i < 3; i++)
        if (all[i] && (all[i]->stream_ordered != 0) == host_be)
            return k3c_errorf("forward: rank %d: the %s communicator works on %s, backend %s on %s memory", all[i]->rank,
                              all[i]->name, all[i]->stream_ordered ? "device memory on a stream" : "host memory",
                              be->name, host_be ? "host" : "device");
    return K3C_OK;
}

int k3c_forward_create(k3c_backend *be, const struct k3c_model *m, const k3c_forward_options *o, k3c_forward **out) {
    *out = NULL;
    const k3c_config *c = &m->config;
    if (o->max_rows <= 0 || o->max_segs <= 0 || o->max_context <= 0 || o->block_size <= 0)
        return k3c_errorf("forward: max_rows %d, max_segs %d, max_context %d, block_size %d must be positive",
                          o->max_rows, o->max_segs, o->max_context, o->block_size);
    if (o->num_aux < 0 || (o->num_aux > 0 && !o->aux_layers))
        return k3c_errorf("forward: %d aux layers, %s list", o->num_aux, o->aux_layers ? "a" : "no");
    for (int i = 0; i < o->num_aux; i++)
        if (o->aux_layers[i] < 0 || o->aux_layers[i] > c->num_layers)
            return k3c_errorf("forward: aux layer %d outside 0..%d", o->aux_layers[i], c->num_layers);
    k3c_forward *f = calloc(1, sizeof *f);
    if (!f) return k3c_errorf_kind(K3C_ERROR_OOM, "forward: out of memory");
    f->be = be;
    f->m = m;
    f->c = c;
    f->o = *o;
    if (o->num_aux > 0) {
        f->aux_layers = malloc(sizeof(int) * o->num_aux);
        if (!f->aux_layers) goto oom;
        memcpy(f->aux_layers, o->aux_layers, sizeof(int) * o->num_aux);
    }
    f->o.aux_layers = f->aux_layers;
    if (check_groups(be, m, o) != K3C_OK) {
        free(f->aux_layers);
        free(f);
        return K3C_ERR;
    }
    f->tp = group(o->tp);
    f->pp = group(o->pp);
    f->ep = group(o->ep);
    f->dcp = o->dcp > 1 ? (o->dcp_group ? o->dcp_group : f->tp) : NULL;
    int tp = f->tp ? f->tp->size : 1, nep = f->ep ? f->ep->size : 1;
    f->vocab = c->vocab_size * tp;
    k3c_model_stage_layers(m, &f->l0, &f->l1);
    f->ep_per = c->num_experts / nep;
    size_t K = c->num_experts_per_token > 0 ? (size_t)c->num_experts_per_token : 1;

    /* a request's rows split into up to two absorbed MLA segments around its whole blocks; an EP rank's
     * experts may get every rank's pairs */
    k3c_backend_limits lim = {o->max_rows, 2 * o->max_segs, o->max_context, o->block_size, o->kv_fp8,
                              f->ep ? (int)((size_t)nep * o->max_rows * K) : 0};
    if (be->init(be, m, &lim) != K3C_OK) {
        free(f->aux_layers);
        free(f);
        return k3c_error_context("backend %s: init: ", be->name);
    }
    /* the blocks (top of the file): a block that no step can hold is no block; one row would make decode rows
     * blocks, unlike verify rows */
    int has_kda = 0, has_mla = 0;
    for (int l = 0; l < c->num_layers; l++) {
        if (c->layer_attn[l] == K3C_ATTN_KDA) has_kda = 1;
        else has_mla = 1;
    }
    int C = o->chunk_min > 0 ? o->chunk_min : 64, E = o->mla_expand_min > 0 ? o->mla_expand_min : 128;
    if (C < 2) C = 2;
    if (E < 2) E = 2;
    f->kda_block = has_kda && C <= o->max_rows ? C : 0;
    if (f->kda_block) E = (E + C - 1) / C * C;
    f->mla_block = has_mla && be->mla_attention_expanded && E <= o->max_rows && !f->dcp ? E : 0;

    size_t R = o->max_rows, D = c->hidden_size, P = k3c_config_kda_proj(c), H = c->kda_num_heads;
    size_t dk = c->kda_head_dim, Hm = c->num_attention_heads, qh = k3c_config_mla_qk_head_dim(c);
    size_t lat = k3c_config_mla_latent(c), vh = c->v_head_dim, V = c->vocab_size;
    size_t I = c->intermediate_size, Rin = k3c_config_expert_in(c);
    int has_moe = 0;
    for (int l = 0; l < c->num_layers; l++) has_moe |= c->layer_is_moe[l] != 0;
    /* blocks are written at l % S == 0: ceil(L / S) of them, plus the partial prefix */
    f->nres = c->attn_res_block_size > 0 ? (c->num_layers + c->attn_res_block_size - 1) / c->attn_res_block_size + 1
                                         : 1;
    /* widths, in the order they are carved */
    size_t widths[64];
    float **slots[64];
    int n = 0;
    f->res = calloc((size_t)f->nres, sizeof(float *));
    f->srcs = calloc((size_t)f->nres, sizeof(float *));
    f->ids = malloc(sizeof(int32_t) * R);
    f->rows = malloc(sizeof(int) * R);
    f->segs = calloc((size_t)o->max_segs, sizeof(k3c_seg));
    f->kda_parts = calloc(3 * (size_t)o->max_segs, sizeof(k3c_seg));
    f->mla_abs = calloc(2 * (size_t)o->max_segs, sizeof(k3c_seg));
    f->mla_exp = calloc((size_t)o->max_segs, sizeof(k3c_seg));
    if (!f->res || !f->srcs || !f->ids || !f->rows || !f->segs || !f->kda_parts || !f->mla_abs || !f->mla_exp)
        goto oom;
    if (f->tp && !(f->ids_local = malloc(sizeof(int32_t) * R))) goto oom;
    if (f->dcp && !(f->dcp_rows = malloc(sizeof(int) * R * (size_t)o->dcp))) goto oom;
    if (f->ep) {
        size_t NE = (size_t)nep;
        f->ep_idx = malloc(sizeof(int) * R * K);
        f->ep_all = malloc(sizeof(int) * NE * R * K);
        f->ep_send_rows = malloc(sizeof(int) * R * K);
        f->ep_pair = malloc(sizeof(int) * R * K);
        f->ep_expert = malloc(sizeof(int) * NE * R * K);
        f->ep_sb = calloc(NE, sizeof(size_t));
        f->ep_rb = calloc(NE, sizeof(size_t));
        if (!f->ep_idx || !f->ep_all || !f->ep_send_rows || !f->ep_pair || !f->ep_expert || !f->ep_sb || !f->ep_rb)
            goto oom;
        /* the gathered counts and routing tables: one backend allocation of ints */
        f->ep_cnt = be->alloc(be, sizeof(int) * (NE + 1 + R * K + NE * R * K));
        if (!f->ep_cnt) {
            k3c_error_context("forward: ");
            k3c_forward_free(f);
            return K3C_ERR;
        }
        f->ep_idx_buf = f->ep_cnt + NE + 1;
        f->ep_all_buf = f->ep_idx_buf + R * K;
    }
#define CARVE(ptr, w) (slots[n] = &(ptr), widths[n] = (w), n++)
    CARVE(f->a_in, D); CARVE(f->x, D); CARVE(f->A, D); CARVE(f->F, D); CARVE(f->G, D);
    CARVE(f->logits, V);
    if (P) {
        CARVE(f->kq, P); CARVE(f->kk, P); CARVE(f->kv, P); CARVE(f->cq, P); CARVE(f->ck, P); CARVE(f->cv, P);
        CARVE(f->kf, P); CARVE(f->kg, P); CARVE(f->ko, P); CARVE(f->kz, P); CARVE(f->ky, P);
        CARVE(f->klow, dk); CARVE(f->kb, H); CARVE(f->kbeta, H);
    }
    if (Hm) {
        CARVE(f->mqa, maxz(c->q_lora_rank, 1)); CARVE(f->mq, Hm * qh); CARVE(f->mlat, lat);
        CARVE(f->mo, Hm * vh); CARVE(f->mg, Hm * vh);
    }
    if (f->dcp && Hm) {
        size_t nd = (size_t)o->dcp, kvl = c->kv_lora_rank;
        CARVE(f->dq, Hm * lat); CARVE(f->dqg, nd * Hm * lat); CARVE(f->dqa, nd * Hm * lat);
        /* dpg: the packs sent (all-to-all), or every rank's whole pack (all-gather: dcp times more) */
        size_t ng = f->dcp->all_to_all ? nd : nd * nd;
        CARVE(f->dpk, nd * Hm * (kvl + 1)); CARVE(f->dpg, ng * Hm * (kvl + 1));
        CARVE(f->dpm, nd * Hm * (kvl + 1));
    }
    if (I) { CARVE(f->ga, I); CARVE(f->gu, I); }
    if (f->tp) {
        if (has_moe) { CARVE(f->mr, Rin); CARVE(f->ms, D); }
        CARVE(f->gather, V * (size_t)tp);
    }
    if (f->ep && has_moe) { /* widths per row of max_rows: K pairs a row, up to nep ranks' pairs */
        CARVE(f->ep_w, K); CARVE(f->ep_z, Rin); CARVE(f->ep_send, K * Rin); CARVE(f->ep_back, K * Rin);
        CARVE(f->ep_recv, (size_t)nep * K * Rin); CARVE(f->ep_out, (size_t)nep * K * Rin);
    }
#undef CARVE
    /* Each buffer starts on a 256-byte boundary: device kernels read rows with 16-byte vector loads and
     * cuBLASLt prefers 256-byte operands, and a width such as the EP weights' k a row (R k floats) would
     * otherwise shift every buffer after it (on the H200, 2026-12-02: Kimi Linear's DEP step stopped at a
     * misaligned address in the add kernel). */
#define FWD_ALIGN_FLOATS 64
#define FWD_ROUND(v) (((v) + FWD_ALIGN_FLOATS - 1) / FWD_ALIGN_FLOATS * FWD_ALIGN_FLOATS)
    size_t total = (size_t)f->nres * FWD_ROUND((size_t)R * D);
    for (int i = 0; i < n; i++) total += FWD_ROUND((size_t)R * widths[i]);
    total += FWD_ROUND((size_t)o->num_aux * D * R);
    f->arena = be->alloc(be, total * sizeof(float));
    if (!f->arena) {
        k3c_error_context("forward: activation buffers (%zu floats): ", total);
        k3c_forward_free(f);
        return K3C_ERR;
    }
    float *p = f->arena;
    for (int i = 0; i < f->nres; i++, p += FWD_ROUND((size_t)R * D)) f->res[i] = p;
    for (int i = 0; i < n; i++) {
        *slots[i] = p;
        p += FWD_ROUND((size_t)R * widths[i]);
    }
#undef FWD_ROUND
#undef FWD_ALIGN_FLOATS
    f->aux = o->num_aux > 0 ? p : NULL;
    *out = f;
    return K3C_OK;
oom:
    k3c_forward_free(f);
    return k3c_errorf_kind(K3C_ERROR_OOM, "forward: out of host memory");
}

void k3c_forward_free(k3c_forward *f) {
    if (!f) return;
    if (f->arena) f->be->free(f->be, f->arena);
    free(f->res);
    free(f->srcs);
    free(f->ids);
    free(f->rows);
    free(f->segs);
    free(f->kda_parts);
    free(f->mla_abs);
    free(f->mla_exp);
    free(f->ids_local);
    free(f->dcp_rows);
    free(f->aux_layers);
    free(f->ep_idx);
    free(f->ep_all);
    free(f->ep_send_rows);
    free(f->ep_pair);
    free(f->ep_expert);
    free(f->ep_sb);
    free(f->ep_rb);
    if (f->ep_cnt) f->be->free(f->be, f->ep_cnt);
    free(f);
}

int k3c_forward_logit_rows(const k3c_fwd_req *reqs, int nreq) {
    int n = 0;
    for (int i = 0; i < nreq; i++) {
        if (reqs[i].verify || reqs[i].logits == K3C_LOGITS_ALL) n += reqs[i].n;
        else if (reqs[i].logits == K3C_LOGITS_LAST && reqs[i].n > 0) n += 1;
    }
    return n;
}

/* ---- the invariance grid (top of the file) ---- */

/* The whole aligned U-blocks among a request's rows of this step, as row offsets [*a, *b) into its segment
 * (both ends at multiples of U in positions); *a = *b = n when there is none (U = 0, a verify, or no block
 * lies inside). */
static void whole_blocks(const k3c_seg *sg, int verify, int U, int *a, int *b) {
    *a = *b = sg->n;
    if (U <= 0 || verify) return;
    int lo = (sg->pos + U - 1) / U * U, hi = (sg->pos + sg->n) / U * U;
    if (hi <= lo) return;
    *a = lo - sg->pos;
    *b = hi - sg->pos;
}

/* Rows [a, b) of a segment as a segment of its own. */
static k3c_seg sub_seg(const k3c_seg *sg, int a, int b, int chunked) {
    k3c_seg p = *sg;
    p.row0 += a;
    p.pos += a;
    p.n = b - a;
    p.chunked = chunked;
    return p;
}

/* Whether cutting a prompt that ends at `end` at position p keeps every whole block of the prompt in one
 * piece: p is the end, or for each block U a multiple of U or past the prompt's last whole U-block (no
 * block there can be whole in any cutting). */
static int safe_cut(const k3c_forward *f, int p, int end) {
    if (p >= end) return 1;
    const int units[2] = {f->kda_block, f->mla_block};
    for (int i = 0; i < 2; i++)
        if (units[i] > 0 && p % units[i] != 0 && p < end / units[i] * units[i]) return 0;
    return 1;
}

int k3c_forward_prompt_piece(const k3c_forward *f, int pos, int end, int max_tokens) {
    int m = end - pos < max_tokens ? end - pos : max_tokens;
    while (m > 0 && !safe_cut(f, pos + m, end)) m--;
    return m > 0 ? m : 0;
}

int k3c_forward_prompt_grid(const k3c_forward *f) {
    return f->mla_block ? f->mla_block : f->kda_block ? f->kda_block : 1;
}

/* ---- collectives ---- */

/* After a failed backend sync or collective: the step fails, and every group of the rank is aborted so that
 * the other ranks' collectives fail instead of waiting (comm/comm.h). The message says which group. */
static void abort_groups(k3c_forward *f) {
    f->failed = 1;
    k3c_comm *g[4] = {f->tp, f->pp, f->ep, f->dcp != f->tp ? f->dcp : NULL};
    for (int i = 0; i < 4; i++)
        if (g[i]) g[i]->abort(g[i]);
}

static void fail_step(k3c_forward *f, const char *what, const k3c_comm *c) {
    k3c_error_context("%s rank %d of %d: ", what, c->rank, c->size);
    abort_groups(f);
}

/* Before a collective, 0 after a failure: a host-memory communicator reads the buffers when it runs, so the
 * backend's queued ops must have finished (sync); a stream-ordered one is queued behind them on the backend's
 * stream (comm/comm.h), and an op that failed is reported at the step's end instead. */
static int ready(k3c_forward *f, const char *what, const k3c_comm *c) {
    if (f->failed) return 0;
    if (c->stream_ordered || f->be->sync(f->be) == K3C_OK) return 1;
    fail_step(f, what, c);
    return 0;
}

/* ---- tensor parallel ---- */

/* buf [n] = the sum over the TP ranks of their partials (comm/comm.h: f32, rank 0 first, the same bits on
 * every rank), rounded where the one product it stands for would have been (round). A failure aborts the
 * group (the other ranks' collectives fail instead of waiting) and is returned at the end of the step. */
static void tp_sum(k3c_forward *f, float *buf, size_t n, int round) {
    if (!ready(f, "tp", f->tp)) return;
    if (f->tp->all_reduce_f32(f->tp, buf, n) != K3C_OK) {
        fail_step(f, "tp", f->tp);
        return;
    }
    if (round) f->be->round(f->be, buf, n);
}

/* A row-parallel product (o_proj, a down projection): rnd(W x) at world size 1; under TP each rank's part
 * unrounded, then their rounded sum. */
static void matmul_rowpar(k3c_forward *f, const k3c_mat *W, const float *x, int T, float *y) {
    f->be->matmul(f->be, W, x, T, y, !f->tp);
    if (f->tp) tp_sum(f, y, (size_t)T * W->rows, 1);
}

/* The MoE of a TP rank: the backend's partial (backend.h moe_partial), the two sums, then what moe does
 * after them: the latent norm and up-projection, out = rnd(r + s). */
static void moe_tp(k3c_forward *f, const k3c_moe_weights *w, int T) {
    k3c_backend *be = f->be;
    const k3c_config *c = f->c;
    size_t D = c->hidden_size, Rin = k3c_config_expert_in(c);
    int shared = w->shared.gate.w != NULL;
    be->moe_partial(be, w, f->x, T, f->mr, shared ? f->ms : NULL);
    tp_sum(f, f->mr, (size_t)T * Rin, 1);
    if (c->routed_expert_hidden_size > 0) {
        if (c->latent_moe_use_norm)
            be->rmsnorm(be, f->mr, (int)Rin, w->latent_norm, T, (int)Rin, c->rms_norm_eps, f->mr, (int)Rin);
        be->matmul(be, &w->latent_up, f->mr, T, f->F, 1);
    } else {
        be->copy(be, f->F, f->mr, (size_t)T * D * sizeof(float));
    }
    if (shared) {
        tp_sum(f, f->ms, (size_t)T * D, 1);
        be->add(be, f->F, f->ms, (size_t)T * D, f->F);
    }
}

/* ---- pipeline stages (top of the file) ---- */

/* The AttnRes blocks closed before layer l: the state that enters layer l is res[0 .. nb] (nb + 1 buffers,
 * the prefix last); 0 without AttnRes (res[0] is the residual). */
static int blocks_before(const k3c_config *c, int l) {
    int nb = 0;
    if (c->attn_res_block_size > 0)
        for (int i = 0; i < l; i++) nb += k3c_config_is_block_start(c, i);
    return nb;
}

static void pp_recv(k3c_forward *f, int nb, int T) {
    size_t bytes = (size_t)T * f->c->hidden_size * sizeof(float);
    for (int i = 0; i <= nb && !f->failed; i++)
        if (f->pp->recv(f->pp, f->res[i], bytes, f->pp->rank - 1) != K3C_OK) fail_step(f, "pp", f->pp);
}

static void pp_send(k3c_forward *f, int nb, int T) {
    size_t bytes = (size_t)T * f->c->hidden_size * sizeof(float);
    if (!ready(f, "pp", f->pp)) return;
    for (int i = 0; i <= nb && !f->failed; i++)
        if (f->pp->send(f->pp, f->res[i], bytes, f->pp->rank + 1) != K3C_OK) fail_step(f, "pp", f->pp);
}

/* ---- DP attention + EP MoE (top of the file) ---- */

/* After a download the host reads at once (the exchange's counts and tables): a device backend queues the
 * copy on its stream, so wait for it; 0 after a failure (the backend's message, the groups aborted). */
static int host_read(k3c_forward *f, const char *what) {
    if (f->failed) return 0;
    if (f->be->sync(f->be) == K3C_OK) return 1;
    k3c_error_context("ep rank %d of %d: %s: ", f->ep->rank, f->ep->size, what);
    abort_groups(f);
    return 0;
}

/* This step's Tp: every rank's row count, gathered (the first collective of a DEP step). */
static void ep_begin(k3c_forward *f, int T) {
    int n = f->ep->size;
    f->ep_rows = 0;
    f->be->upload(f->be, f->ep_cnt + n, &T, sizeof(int));
    if (!ready(f, "ep", f->ep)) return;
    if (f->ep->all_gather(f->ep, f->ep_cnt + n, f->ep_cnt, sizeof(int)) != K3C_OK) {
        fail_step(f, "ep", f->ep);
        return;
    }
    int cnt[n];
    f->be->download(f->be, cnt, f->ep_cnt, sizeof(int) * n);
    if (!host_read(f, "the row counts")) return;
    for (int r = 0; r < n; r++) {
        if (cnt[r] < 0 || cnt[r] > f->o.max_rows) {
            k3c_errorf("ep rank %d of %d: rank %d has %d rows, this rank's max_rows is %d (every rank of the group "
                       "needs the same max_rows)", f->ep->rank, n, r, cnt[r], f->o.max_rows);
            abort_groups(f);
            return;
        }
        if (cnt[r] > f->ep_rows) f->ep_rows = cnt[r];
    }
}

/* The MoE of a DEP rank over its T rows (f->x normed, out f->F); T = 0 on an idle rank, which still serves its
 * experts. Every rank calls it for every MoE layer of the step: one all-gather and two all-to-alls. */
static void moe_ep(k3c_forward *f, const k3c_moe_weights *w, int T) {
    k3c_backend *be = f->be;
    k3c_comm *ep = f->ep;
    int K = f->c->num_experts_per_token, n = ep->size, me = ep->rank, Tp = f->ep_rows;
    size_t Rin = k3c_config_expert_in(f->c), row = Rin * sizeof(float), TK = (size_t)Tp * K;
    if (f->failed || Tp == 0) return;
    /* 1. this rank's routing; the tables of every rank, padded to Tp rows */
    if (T > 0) be->moe_route(be, w, f->x, T, f->ep_idx, f->ep_w, f->ep_z);
    for (int i = 0; i < T * K; i++)
        if (f->ep_idx[i] < 0 || f->ep_idx[i] >= f->c->num_experts) { /* a device backend's failed route */
            if (!host_read(f, "moe_route")) return;
            k3c_errorf("ep rank %d of %d: moe_route gave row %d expert %d (0..%d)", me, n, i / K, f->ep_idx[i],
                       f->c->num_experts - 1);
            abort_groups(f);
            return;
        }
    for (size_t i = (size_t)T * K; i < TK; i++) f->ep_idx[i] = -1;
    be->upload(be, f->ep_idx_buf, f->ep_idx, TK * sizeof(int));
    if (!ready(f, "ep", ep)) return;
    if (ep->all_gather(ep, f->ep_idx_buf, f->ep_all_buf, TK * sizeof(int)) != K3C_OK) {
        fail_step(f, "ep", ep);
        return;
    }
    be->download(be, f->ep_all, f->ep_all_buf, (size_t)n * TK * sizeof(int));
    if (!host_read(f, "the routing tables")) return;
    /* 2. dispatch: this rank's pairs to their experts' ranks, per rank in (t, j) order */
    int ns = 0;
    for (int p = 0; p < n; p++) {
        int first = ns;
        for (int i = 0; i < T * K; i++)
            if (f->ep_idx[i] / f->ep_per == p) {
                f->ep_send_rows[ns] = i / K;
                f->ep_pair[i] = ns++;
            }
        f->ep_sb[p] = (size_t)(ns - first) * row;
    }
    /* what arrives: each rank's pairs whose expert is here, in that rank's send order */
    int nr = 0;
    for (int s = 0; s < n; s++) {
        int first = nr;
        const int *t = f->ep_all + (size_t)s * TK;
        for (size_t i = 0; i < TK; i++)
            if (t[i] >= 0 && t[i] / f->ep_per == me) f->ep_expert[nr++] = t[i];
        f->ep_rb[s] = (size_t)(nr - first) * row;
    }
    be->gather_rows(be, f->ep_z, f->ep_send_rows, ns, (int)Rin, f->ep_send);
    if (!ready(f, "ep", ep)) return;
    if (ep->all_to_all(ep, f->ep_send, f->ep_sb, f->ep_recv, f->ep_rb) != K3C_OK) {
        fail_step(f, "ep", ep);
        return;
    }
    /* 3. the experts held here, on every rank's rows; their outputs back where the rows came from */
    be->moe_experts(be, w, f->ep_recv, f->ep_expert, nr, f->ep_out);
    if (!ready(f, "ep", ep)) return;
    if (ep->all_to_all(ep, f->ep_out, f->ep_rb, f->ep_back, f->ep_sb) != K3C_OK) {
        fail_step(f, "ep", ep);
        return;
    }
    /* 4. combine on the token's rank, in j order (ep_back is in send order: pair (t, j) at ep_pair) */
    if (T > 0) be->moe_combine(be, w, f->x, T, f->ep_w, f->ep_back, f->ep_pair, f->F);
}

/* ---- layers ---- */

/* KDA (spec §2): x [T, D] normed input -> f->A. */
static void kda_layer(k3c_forward *f, int l, k3c_kda_slots *ks, const k3c_fwd_req *reqs, int nreq, int T) {
    k3c_backend *be = f->be;
    const k3c_kda_weights *w = &f->m->weights.layers[l].kda;
    size_t P = ks->P;
    be->matmul(be, &w->q_proj, f->x, T, f->kq, 1);
    be->matmul(be, &w->k_proj, f->x, T, f->kk, 1);
    be->matmul(be, &w->v_proj, f->x, T, f->kv, 1);

    /* per request: the committed slot, or (verify) a scratch copy of it; verify saves its pre-conv rows */
    int nv = 0;
    for (int s = 0; s < nreq; s++) {
        k3c_seg *sg = &f->segs[s];
        const k3c_fwd_req *r = &reqs[s];
        float *state = ks->state[l] + (size_t)r->slot * ks->state_floats;
        float *window = ks->window[l] + (size_t)r->slot * ks->window_floats;
        if (r->verify) {
            float *ss = ks->scratch_state + (size_t)nv * ks->state_floats;
            float *sw = ks->scratch_window + (size_t)nv * ks->window_floats;
            nv++;
            be->copy(be, ss, state, ks->state_floats * sizeof(float));
            be->copy(be, sw, window, ks->window_floats * sizeof(float));
            state = ss;
            window = sw;
            float *st = k3c_kda_store(ks, l, r->slot);
            const float *xs[3] = {f->kq, f->kk, f->kv};
            for (int which = 0; which < 3; which++)
                be->copy(be, st + k3c_kda_store_x(ks, which), xs[which] + (size_t)sg->row0 * P,
                         (size_t)sg->n * P * sizeof(float));
        }
        sg->state = state;
        sg->window = window;
        sg->chunked = 0;
    }
    be->kda_conv(be, f->kq, w->q_conv, 0, f->segs, nreq, f->cq);
    be->kda_conv(be, f->kk, w->k_conv, 1, f->segs, nreq, f->ck);
    be->kda_conv(be, f->kv, w->v_conv, 2, f->segs, nreq, f->cv);

    be->matmul(be, &w->f_a, f->x, T, f->klow, 1);
    be->matmul(be, &w->f_b, f->klow, T, f->kf, 1);
    be->matmul(be, &w->b_proj, f->x, T, f->kb, 1);
    be->kda_gate(be, f->kf, f->kb, w->a_log, w->dt_bias, T, f->kg, f->kbeta);
    be->kda_qk_norm(be, f->cq, f->ck, T);

    for (int s = 0; s < nreq; s++) {
        if (!reqs[s].verify) continue;
        const k3c_seg *sg = &f->segs[s];
        float *st = k3c_kda_store(ks, l, reqs[s].slot);
        size_t rows = (size_t)sg->n * P * sizeof(float), off = (size_t)sg->row0 * P;
        be->copy(be, st + k3c_kda_store_k(ks), f->ck + off, rows);
        be->copy(be, st + k3c_kda_store_v(ks), f->cv + off, rows);
        be->copy(be, st + k3c_kda_store_g(ks), f->kg + off, rows);
        be->copy(be, st + k3c_kda_store_beta(ks), f->kbeta + (size_t)sg->row0 * ks->H,
                 (size_t)sg->n * ks->H * sizeof(float));
    }
    /* the delta rule in up to three passes (top of the file): part j of every request in pass j */
    int np[3] = {0, 0, 0};
    k3c_seg *parts = f->kda_parts;
    size_t S = (size_t)f->o.max_segs;
    for (int s = 0; s < nreq; s++) {
        const k3c_seg *sg = &f->segs[s];
        int a, b, k = 0;
        whole_blocks(sg, reqs[s].verify, f->kda_block, &a, &b);
        k3c_seg p[3];
        if (a > 0) p[k++] = sub_seg(sg, 0, a, 0);
        if (b > a) p[k++] = sub_seg(sg, a, b, f->kda_block);
        if (b < sg->n) p[k++] = sub_seg(sg, b, sg->n, 0);
        for (int j = 0; j < k; j++) parts[j * S + np[j]++] = p[j];
    }
    for (int j = 0; j < 3 && np[j] > 0; j++)
        be->kda_delta(be, f->cq, f->ck, f->cv, f->kg, f->kbeta, parts + j * S, np[j], f->ko);

    if (w->g_proj.w) {
        be->matmul(be, &w->g_proj, f->x, T, f->kz, 1);
    } else {
        be->matmul(be, &w->g_a, f->x, T, f->klow, 1);
        be->matmul(be, &w->g_b, f->klow, T, f->kz, 1);
    }
    be->kda_gated_norm(be, f->ko, f->kz, w->o_norm, T, f->ky);
    matmul_rowpar(f, &w->o_proj, f->ky, T, f->A);
}

/* The attention of an MLA layer under DCP (top of the file): f->mq -> f->mo, every row of the step over the
 * positions of the whole group. H = dcp x Hm heads (Hm this rank's): the group's in rank order. */
static void mla_dcp(k3c_forward *f, const k3c_mla_weights *w, const void *cache, int nreq, int T) {
    k3c_backend *be = f->be;
    const k3c_config *c = f->c;
    k3c_comm *d = f->dcp;
    int n = d->size, me = d->rank, Hm = c->num_attention_heads, kvl = c->kv_lora_rank;
    size_t lat = k3c_config_mla_latent(c), H = (size_t)n * Hm, Tz = (size_t)T;
    /* 1. the group's absorbed queries: [n, T, Hm lat] gathered, reordered to [T, n Hm, lat] */
    be->mla_absorb(be, w, f->mq, T, f->dq);
    if (!ready(f, "dcp", d)) return;
    if (d->all_gather(d, f->dq, f->dqg, Tz * Hm * lat * sizeof(float)) != K3C_OK) {
        fail_step(f, "dcp", d);
        return;
    }
    for (int t = 0; t < T; t++)
        for (int g = 0; g < n; g++) f->dcp_rows[t * n + g] = g * T + t;
    be->gather_rows(be, f->dqg, f->dcp_rows, T * n, (int)(Hm * lat), f->dqa);
    /* 2. every head over this rank's positions: [T, H, kvl] then [T, H] lse, packed for one gather */
    float *po = f->dpk, *pl = f->dpk + Tz * H * kvl;
    be->mla_attention_part(be, f->dqa, (int)H, f->segs, nreq, cache, po, pl);
    /* 3. every rank gets its own heads' partials (slot me of each row's n Hm) from every rank, into f->dpm: an
     * all-to-all of exactly those where the group has one (threads, NCCL), else the gather of every rank's whole
     * pack and the pick (the groups of ranks on one GPU: staged, mailbox). The same bits either way. */
    size_t S = Tz * H * (kvl + 1), Sp = Tz * Hm * (kvl + 1), ol = Tz * Hm * kvl; /* a pack; a part; its o_lat */
    if (d->all_to_all) {
        size_t bytes[n];
        for (int q = 0; q < n; q++) {
            for (int t = 0; t < T; t++) f->dcp_rows[t] = t * n + q;
            be->gather_rows(be, po, f->dcp_rows, T, Hm * kvl, f->dpg + q * Sp);
            be->gather_rows(be, pl, f->dcp_rows, T, Hm, f->dpg + q * Sp + ol);
            bytes[q] = Sp * sizeof(float);
        }
        if (!ready(f, "dcp", d)) return;
        if (d->all_to_all(d, f->dpg, bytes, f->dpm, bytes) != K3C_OK) {
            fail_step(f, "dcp", d);
            return;
        }
    } else {
        if (!ready(f, "dcp", d)) return;
        if (d->all_gather(d, f->dpk, f->dpg, S * sizeof(float)) != K3C_OK) {
            fail_step(f, "dcp", d);
            return;
        }
        for (int t = 0; t < T; t++) f->dcp_rows[t] = t * n + me;
        for (int r = 0; r < n; r++) {
            const float *src = f->dpg + (size_t)r * S;
            be->gather_rows(be, src, f->dcp_rows, T, Hm * kvl, f->dpm + r * Sp);
            be->gather_rows(be, src + Tz * H * kvl, f->dcp_rows, T, Hm, f->dpm + r * Sp + ol);
        }
    }
    /* 4. the merge, in rank order */
    be->mla_merge(be, w, f->dpm, f->dpm + ol, Sp, n, T, f->mo);
}

/* MLA, NoPE (spec §3): x [T, D] -> f->A; writes the step's latent rows into the cache first, then attends
 * absorbed or expanded per row (f->mla_abs, f->mla_exp: see the top of this file), or through the DCP group. */
static void mla_layer(k3c_forward *f, int l, k3c_kv_cache *kv, int nreq, int T) {
    k3c_backend *be = f->be;
    const k3c_config *c = f->c;
    const k3c_mla_weights *w = &f->m->weights.layers[l].mla;
    int lat = k3c_config_mla_latent(c);
    if (c->q_lora_rank > 0) {
        be->matmul(be, &w->q_a, f->x, T, f->mqa, 1);
        be->rmsnorm(be, f->mqa, c->q_lora_rank, w->q_a_norm, T, c->q_lora_rank, c->mla_lora_norm_eps, f->mqa,
                    c->q_lora_rank);
        be->matmul(be, &w->q_b, f->mqa, T, f->mq, 1);
    } else {
        be->matmul(be, &w->q_proj, f->x, T, f->mq, 1);
    }
    be->matmul(be, &w->kv_a, f->x, T, f->mlat, 1);
    be->rmsnorm(be, f->mlat, lat, w->kv_a_norm, T, c->kv_lora_rank, c->mla_lora_norm_eps, f->mlat, lat);
    be->mla_cache_write(be, f->mlat, f->segs, nreq, kv->layer[l]);
    /* absorbed first: the expanded op writes only its segments' rows, the absorbed one may write others */
    if (f->dcp) mla_dcp(f, w, kv->layer[l], nreq, T);
    else if (f->mla_nabs) be->mla_attention(be, w, f->mq, f->mla_abs, f->mla_nabs, kv->layer[l], f->mo);
    if (f->mla_nexp) be->mla_attention_expanded(be, w, f->mq, f->mla_exp, f->mla_nexp, kv->layer[l], f->mo);
    if (c->mla_use_output_gate && w->g_proj.w) {
        be->matmul(be, &w->g_proj, f->x, T, f->mg, 1);
        be->sigmoid_mul(be, f->mo, f->mg, (size_t)T * w->g_proj.rows);
    }
    matmul_rowpar(f, &w->o_proj, f->mo, T, f->A);
}

/* FFN: y = f->x (normed) -> f->F. */
static void ffn_layer(k3c_forward *f, int l, int T) {
    k3c_backend *be = f->be;
    const k3c_layer_weights *lw = &f->m->weights.layers[l];
    if (lw->is_moe) {
        if (f->ep) moe_ep(f, &lw->moe, T); /* the hybrid too: its MoE weights are whole (model/shard.h) */
        else if (f->tp) moe_tp(f, &lw->moe, T);
        else be->moe(be, &lw->moe, f->x, T, f->F);
        return;
    }
    be->matmul(be, &lw->mlp.gate, f->x, T, f->ga, 1);
    be->matmul(be, &lw->mlp.up, f->x, T, f->gu, 1);
    be->gated_act(be, f->ga, f->gu, (size_t)T * lw->mlp.gate.rows, f->ga);
    matmul_rowpar(f, &lw->mlp.down, f->ga, T, f->F);
}

/* AttnRes Mix of blocks[0..nb-1] ++ P into out. One source is that source exactly (softmax of one = 1). */
static const float *mix(k3c_forward *f, int nb, const float *P, const float *proj, const float *norm, int T,
                        float *out) {
    if (nb == 0) return P;
    for (int j = 0; j < nb; j++) f->srcs[j] = f->res[j];
    f->srcs[nb] = P;
    f->be->attnres_mix(f->be, f->srcs, nb + 1, T, f->c->hidden_size, proj, norm, f->c->rms_norm_eps, out);
    return out;
}

/* Aux streams entering layer L (see forward.h): copies the logits rows of P (the prefix or residual that
 * enters layer L) into the aux buffer of every stream tapping L. The rows are ascending, so nrows == T means
 * every row (a decode or verify step): a plain copy then, no gather. */
static void aux_tap(k3c_forward *f, int L, const float *P, int T, int nrows) {
    size_t D = f->c->hidden_size;
    for (int i = 0; i < f->o.num_aux; i++) {
        if (f->aux_layers[i] != L || nrows == 0) continue;
        float *dst = f->aux + (size_t)i * nrows * D;
        if (nrows == T) f->be->copy(f->be, dst, P, (size_t)T * D * sizeof(float));
        else f->be->gather_rows(f->be, P, f->rows, nrows, (int)D, dst);
    }
}

static int step(k3c_forward *f, k3c_kv_cache *kv, k3c_kda_slots *ks, const k3c_fwd_req *reqs, int nreq,
                float *logits, float *aux, const k3c_forward_attention *attn) {
    k3c_backend *be = f->be;
    const k3c_config *c = f->c;
    const k3c_weights *W = &f->m->weights;
    int D = c->hidden_size;
    f->failed = 0;
    if (nreq <= 0 && !f->ep) return K3C_OK;
    if (nreq < 0) return k3c_errorf("forward step: %d requests", nreq);
    if (nreq > f->o.max_segs) return k3c_errorf("forward step: %d requests, at most %d", nreq, f->o.max_segs);
    int T = 0;
    for (int s = 0; s < nreq; s++) {
        const k3c_fwd_req *r = &reqs[s];
        if (r->n <= 0) return k3c_errorf("forward step: request %d has %d tokens", s, r->n);
        if (r->verify && r->n > ks->q_max)
            return k3c_errorf("forward step: request %d verifies %d tokens, q_max is %d", s, r->n, ks->q_max);
        if (r->pos + r->n > f->o.max_context)
            return k3c_errorf("forward step: request %d reaches %d tokens, max_context is %d", s, r->pos + r->n,
                              f->o.max_context);
        if (r->slot < 0 || r->slot >= ks->num_slots)
            return k3c_errorf("forward step: request %d slot %d outside 0..%d", s, r->slot, ks->num_slots - 1);
        if (T + r->n > f->o.max_rows)
            return k3c_errorf("forward step: more than max_rows %d rows", f->o.max_rows);
        for (int i = 0; i < r->n; i++) {
            if (r->ids[i] < 0 || r->ids[i] >= f->vocab)
                return k3c_errorf("forward step: request %d token %d: id %d outside 0..%d", s, i, r->ids[i],
                                  f->vocab - 1);
            f->ids[T + i] = r->ids[i];
        }
        f->segs[s] = (k3c_seg){.row0 = T, .n = r->n, .pos = r->pos, .block_table = r->block_table,
                               .dcp = f->dcp ? f->dcp->size : 1, .dcp_rank = f->dcp ? f->dcp->rank : 0};
        T += r->n;
    }
    for (int s = 0; s < nreq; s++)
        for (int j = 0; j < s; j++)
            if (reqs[j].slot == reqs[s].slot)
                return k3c_errorf("forward step: requests %d and %d share slot %d", j, s, reqs[s].slot);

    /* MLA form per row (top of the file): whole E-blocks expanded, the rows around them absorbed */
    f->mla_nabs = f->mla_nexp = 0;
    for (int s = 0; s < nreq; s++) {
        const k3c_seg *sg = &f->segs[s];
        int a, b;
        whole_blocks(sg, reqs[s].verify, f->mla_block, &a, &b);
        if (a > 0) f->mla_abs[f->mla_nabs++] = sub_seg(sg, 0, a, 0);
        if (b > a) f->mla_exp[f->mla_nexp++] = sub_seg(sg, a, b, 0);
        if (b < sg->n) f->mla_abs[f->mla_nabs++] = sub_seg(sg, b, sg->n, 0);
    }

    /* the logits rows (ascending): picked for the final norm, and the rows of the aux streams */
    int nrows = 0;
    for (int s = 0; s < nreq; s++) {
        const k3c_seg *sg = &f->segs[s];
        if (reqs[s].verify || reqs[s].logits == K3C_LOGITS_ALL)
            for (int i = 0; i < sg->n; i++) f->rows[nrows++] = sg->row0 + i;
        else if (reqs[s].logits == K3C_LOGITS_LAST)
            f->rows[nrows++] = sg->row0 + sg->n - 1;
    }
    int last = f->l1 == c->num_layers; /* the stage with the logits (every rank without PP) */
    if (nrows > 0 && !logits && last)
        return k3c_errorf("forward step: %d logit rows requested but no output buffer", nrows);
    int want_aux = aux && f->o.num_aux > 0;
    if (attn && f->dcp)
        return k3c_errorf("forward step: an attention override at decode context parallel (its attention merges "
                          "across the group)");
    if (attn && (!attn->run || !attn->begin)) return k3c_errorf("forward step: an attention override without its calls");
    if (attn && T > 0 && attn->begin(attn->ctx, reqs, nreq, T) != K3C_OK)
        return k3c_error_context("forward step: attention override: ");

    int attnres = c->attn_res_block_size > 0;
    int nb = blocks_before(c, f->l0), p_empty = 0;
    float *P = f->res[nb];
    if (f->ep) ep_begin(f, T);
    if (f->l0 > 0) { /* a later pipeline stage: what the stage before hands over (top of the file) */
        pp_recv(f, nb, T);
    } else if (T == 0) { /* a DEP rank's dummy step: no rows of its own */
    } else if (f->tp) { /* the vocabulary-parallel embedding: this rank's rows, -0.0 for the others', summed exactly */
        int32_t v0 = (int32_t)c->vocab_size * f->tp->rank;
        for (int t = 0; t < T; t++)
            f->ids_local[t] = f->ids[t] >= v0 && f->ids[t] < v0 + c->vocab_size ? f->ids[t] - v0 : -1;
        be->embed(be, &W->embed, f->ids_local, T, P);
        tp_sum(f, P, (size_t)T * D, 0);
    } else {
        be->embed(be, &W->embed, f->ids, T, P);
    }
    if (want_aux) aux_tap(f, 0, P, T, nrows);
    size_t TD = (size_t)T * D;

    for (int l = f->l0; l < f->l1 && !f->failed; l++) {
        const k3c_layer_weights *lw = &W->layers[l];
        if (T == 0) { /* the dummy step serves the others' MoE rows, nothing else */
            if (lw->is_moe) ffn_layer(f, l, 0);
            continue;
        }
        /* ---- attention side ---- */
        const float *a_in = P;
        if (attnres) {
            a_in = mix(f, nb, P, lw->attn_res_proj, lw->attn_res_norm, T, f->a_in);
            if (k3c_config_is_block_start(c, l)) {
                /* close the block: P's buffer becomes block nb; the prefix restarts empty in the next one */
                nb++;
                P = f->res[nb];
                p_empty = 1;
            }
        }
        be->rmsnorm(be, a_in, D, lw->input_norm, T, D, c->rms_norm_eps, f->x, D);
        if (attn) { /* the override (forward.h): x -> A, o_proj included; a failure ends the step */
            if (attn->run(attn->ctx, l, f->x, f->A, T) != K3C_OK) {
                k3c_error_context("layer %d's attention override: ", l);
                abort_groups(f);
                break;
            }
        } else if (lw->kind == K3C_ATTN_KDA) {
            kda_layer(f, l, ks, reqs, nreq, T);
        } else {
            mla_layer(f, l, kv, nreq, T);
        }
        if (p_empty) be->copy(be, P, f->A, TD * sizeof(float));
        else be->add(be, P, f->A, TD, P);
        p_empty = 0;
        /* ---- MLP side ---- */
        const float *m_in = attnres ? mix(f, nb, P, lw->mlp_res_proj, lw->mlp_res_norm, T, f->a_in) : P;
        be->rmsnorm(be, m_in, D, lw->post_norm, T, D, c->rms_norm_eps, f->x, D);
        ffn_layer(f, l, T);
        be->add(be, P, f->F, TD, P);
        if (want_aux) aux_tap(f, l + 1, P, T, nrows); /* entering layer l + 1 (or the output AttnRes) */
    }

    if (!last) pp_send(f, blocks_before(c, f->l1), T); /* nb, also after a dummy step (which closes none) */
    if (nrows > 0 && last && !f->failed) {
        const float *h = attnres ? mix(f, nb, P, W->out_res_proj, W->out_res_norm, T, f->a_in) : P;
        be->gather_rows(be, h, f->rows, nrows, D, f->G);
        /* The final norm (batch-invariant): row by row, each row's sum of squares in an order that depends
         * only on D, never on how many rows the step has or which other requests share it (CPU: four strided
         * partial sums, cpu/elementwise.c; CUDA: one block per row, fmaf partials per thread then a fixed tree,
         * cuda/elementwise.cu). So a row's final-normed hidden state, and its logits, are the same whether it
         * came from a prefill, a decode or a verify step, and the executor (same kernel, executor_cuda.c)
         * returns exactly what this path returns. */
        be->rmsnorm(be, f->G, D, W->final_norm, nrows, D, c->rms_norm_eps, f->G, D);
        be->matmul(be, &W->lm_head, f->G, nrows, f->logits, 0);
        if (!f->tp) {
            be->download(be, logits, f->logits, (size_t)nrows * c->vocab_size * sizeof(float));
        } else if (ready(f, "tp", f->tp)) { /* every rank's [nrows, V / tp] part, gathered, into each row's columns */
            size_t Vl = c->vocab_size, part = (size_t)nrows * Vl;
            if (f->tp->all_gather(f->tp, f->logits, f->gather, part * sizeof(float)) != K3C_OK) {
                fail_step(f, "tp", f->tp);
            } else {
                for (int r = 0; r < f->tp->size; r++)
                    for (int i = 0; i < nrows; i++)
                        be->download(be, logits + (size_t)i * f->vocab + (size_t)r * Vl,
                                     f->gather + (size_t)r * part + (size_t)i * Vl, Vl * sizeof(float));
            }
        }
        if (want_aux) be->download(be, aux, f->aux, (size_t)f->o.num_aux * nrows * D * sizeof(float));
    }
    if (f->failed) return k3c_error_context("forward step: ");
    if (be->sync(be) != K3C_OK) {
        /* with a stream-ordered communicator an op's failure shows only here: the peers' next collective
         * fails instead of waiting for this rank */
        abort_groups(f);
        return k3c_error_context("forward step on %s: ", be->name);
    }
    return K3C_OK;
}

int k3c_forward_step(k3c_forward *f, k3c_kv_cache *kv, k3c_kda_slots *ks, const k3c_fwd_req *reqs, int nreq,
                     float *logits, float *aux) {
    return k3c_forward_step_attn(f, kv, ks, reqs, nreq, logits, aux, NULL);
}

int k3c_forward_step_attn(k3c_forward *f, k3c_kv_cache *kv, k3c_kda_slots *ks, const k3c_fwd_req *reqs, int nreq,
                          float *logits, float *aux, const k3c_forward_attention *attn) {
    int rc = step(f, kv, ks, reqs, nreq, logits, aux, attn);
    /* a DEP rank's requests are its own: a step it refuses (or a backend error before any collective) is
     * one its peers still wait in, so they are told (TP and PP ranks run the same requests and refuse alike) */
    if (rc != K3C_OK && f->ep && !f->failed) abort_groups(f);
    return rc;
}

int k3c_forward_commit(k3c_forward *f, k3c_kda_slots *ks, int slot, int accepted) {
    k3c_backend *be = f->be;
    if (slot < 0 || slot >= ks->num_slots) return k3c_errorf("commit: slot %d outside 0..%d", slot, ks->num_slots - 1);
    if (accepted < 0 || accepted > ks->q_max)
        return k3c_errorf("commit: %d accepted tokens outside 0..%d", accepted, ks->q_max);
    if (accepted == 0) return K3C_OK;
    for (int l = f->l0; l < f->l1; l++) { /* the stage's layers (all of them without PP) */
        if (f->c->layer_attn[l] != K3C_ATTN_KDA) continue;
        const k3c_kda_weights *w = &f->m->weights.layers[l].kda;
        float *st = k3c_kda_store(ks, l, slot);
        k3c_seg sg = {.row0 = 0, .n = accepted,
                      .state = ks->state[l] + (size_t)slot * ks->state_floats,
                      .window = ks->window[l] + (size_t)slot * ks->window_floats, .chunked = 0};
        const float *taps[3] = {w->q_conv, w->k_conv, w->v_conv};
        for (int which = 0; which < 3; which++)
            be->kda_conv(be, st + k3c_kda_store_x(ks, which), taps[which], which, &sg, 1, ks->conv_out);
        /* the recurrence with q = k: its output is discarded, only the state update matters */
        const float *k = st + k3c_kda_store_k(ks);
        be->kda_delta(be, k, k, st + k3c_kda_store_v(ks), st + k3c_kda_store_g(ks), st + k3c_kda_store_beta(ks),
                      &sg, 1, NULL);
    }
    if (be->sync(be) != K3C_OK) return k3c_error_context("commit on %s: ", be->name);
    return K3C_OK;
}
