/* The ranks of a parallel engine (runtime/ranks.h): layout, communicators, the start-up check, failures. */
#include "runtime/ranks.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/rendezvous.h"
#include "model/layout.h"
#include "util/error.h"

/* In one process the ranks share the record of the first failure. */
struct k3c_rank_group {
    pthread_mutex_t mu;
    int refs;
    int rank; /* -1: nothing failed */
    long step;
    char msg[1024];
};

int k3c_ranks_layout(const k3c_config *c, const k3c_engine_options *o, k3c_layout *out, int *world) {
    k3c_layout l = o->layout;
    if (l.tp <= 0) l.tp = 1;
    if (l.pp <= 0) l.pp = 1;
    if (l.dp <= 0) l.dp = 1;
    if (l.ep <= 0) l.ep = 1;
    if (l.dcp <= 0) l.dcp = 1;
    l.hosts = 1;
    if (l.tp % l.dcp)
        return k3c_errorf("engine: dcp %d (--dcp): decode context parallelism shards the MLA cache over a divisor of "
                          "the tp %d ranks", l.dcp, l.tp);
    if (l.dcp > 1 && (l.pp > 1 || l.dp > 1))
        return k3c_errorf("engine: dcp %d with %s %d: decode context parallelism runs inside a TP group of one "
                          "stage without data parallelism (not built with --pp or --dp)", l.dcp, l.pp > 1 ? "pp" : "dp",
                          l.pp > 1 ? l.pp : l.dp);
    /* what the engine's step runs: TP inside a stage, PP stages, DP attention with EP MoE over the DP ranks */
    if (l.pp > c->num_layers)
        return k3c_errorf("engine: pp %d: more pipeline stages than the model's %d layers (a stage holds one "
                          "layer at least)", l.pp, c->num_layers);
    if (l.ep > 1 && l.ep != l.tp * l.dp)
        return k3c_errorf("engine: ep %d: expert parallelism spans the tp x dp = %d ranks of a stage (--ep), or is "
                          "off", l.ep, l.tp * l.dp);
    if (l.ep > 1 && l.dp < 2)
        return k3c_errorf("engine: ep %d: expert parallelism without data parallelism: --ep spreads the experts "
                          "over the DP ranks (--dp N --ep, N >= 2)", l.ep);
    if ((l.pp > 1 || l.dp > 1) && o->num_aux > 0)
        return k3c_errorf("engine: %d aux streams with %s %d: the hidden-state streams are not passed between %s",
                          o->num_aux, l.pp > 1 ? "pp" : "dp", l.pp > 1 ? l.pp : l.dp,
                          l.pp > 1 ? "pipeline stages" : "DP ranks");
    long long w = (long long)l.tp * l.pp * l.dp;
    if (l.tp > 4096 || w > 4096) return k3c_errorf("engine: tp %d x pp %d x dp %d ranks, at most 4096", l.tp, l.pp, l.dp);
    if (o->world_size < 0 || (o->world_size > 0 && o->world_size != w))
        return k3c_errorf("engine: world_size %d (--world-size), but the layout has tp %d x pp %d x dp %d = %lld ranks",
                          o->world_size, l.tp, l.pp, l.dp, w);
    if (o->rank < 0 || o->rank >= (o->world_size > 0 ? o->world_size : 1))
        return k3c_errorf("engine: rank %d (--rank) outside 0 .. %d%s", o->rank,
                          (o->world_size > 0 ? o->world_size : 1) - 1,
                          o->world_size > 0 ? "" : " (a rank other than 0 needs world_size: one process per rank)");
    if (w > 1) {
        /* the splits must divide: the planner's checks, on the config in hand (no weights read) */
        k3c_layout p = l;
        p.hbm_bytes_per_s = 1;
        k3c_layout_rank *rk = calloc((size_t)w, sizeof *rk);
        if (!rk) return k3c_errorf_kind(K3C_ERROR_OOM, "engine: out of memory for %lld ranks", w);
        int n = 0, rc = k3c_layout_plan_config(c, &p, rk, (int)w, &n);
        free(rk);
        if (rc != K3C_OK) return k3c_error_context("engine: tp %d x pp %d x dp %d, ep %d", l.tp, l.pp, l.dp, l.ep);
    }
    *out = l;
    *world = (int)w;
    return K3C_OK;
}

static void place(k3c_rank *r, const k3c_layout *l, int rank, int timeout_ms) {
    memset(r, 0, sizeof *r);
    r->rank = rank;
    r->world = l->tp * l->pp * l->dp;
    r->layout = *l;
    r->tp_rank = rank % l->tp;
    r->dp_rank = rank / l->tp % l->dp;
    r->pp_stage = rank / (l->tp * l->dp);
    r->timeout_ms = timeout_ms;
}

static void group_unref(k3c_rank_group *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* The groups: one world group, and one TP group per (stage, dp rank) when TP is narrower than the world (the
 * pipeline and expert groups are split from the world by each rank's thread: k3c_rank_split). */
int k3c_ranks_threads(const k3c_layout *l, int timeout_ms, k3c_rank *ranks) {
    int world = l->tp * l->pp * l->dp, tp = l->tp;
    for (int r = 0; r < world; r++) place(&ranks[r], l, r, timeout_ms);
    k3c_rank_group *g = calloc(1, sizeof *g);
    if (!g) return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: out of memory");
    pthread_mutex_init(&g->mu, NULL);
    g->rank = -1;
    g->refs = world;
    k3c_comm_group *wg = NULL;
    int rc = k3c_comm_group_create(world, timeout_ms, &wg);
    for (int r = 0; r < world && rc == K3C_OK; r++) rc = k3c_comm_group_join(wg, r, &ranks[r].world_comm);
    for (int s = 0; s < world / tp && rc == K3C_OK; s++) {
        if (tp == world) {
            for (int r = 0; r < world; r++) ranks[r].tp_comm = ranks[r].world_comm;
            break;
        }
        k3c_comm_group *tg = NULL;
        rc = k3c_comm_group_create(tp, timeout_ms, &tg);
        for (int k = 0; k < tp && rc == K3C_OK; k++) rc = k3c_comm_group_join(tg, k, &ranks[s * tp + k].tp_comm);
        if (rc != K3C_OK && tg) k3c_comm_group_free(tg); /* frees it only if nobody joined */
    }
    /* DCP groups narrower than TP (runs of dcp consecutive ranks inside each TP group); dcp = tp uses the TP group */
    int dcp = l->dcp > 1 ? l->dcp : 1;
    for (int s = 0; dcp > 1 && dcp < tp && s < world / dcp && rc == K3C_OK; s++) {
        k3c_comm_group *dg = NULL;
        rc = k3c_comm_group_create(dcp, timeout_ms, &dg);
        for (int k = 0; k < dcp && rc == K3C_OK; k++) rc = k3c_comm_group_join(dg, k, &ranks[s * dcp + k].dcp_comm);
        if (rc != K3C_OK && dg) k3c_comm_group_free(dg);
    }
    for (int r = 0; r < world; r++) ranks[r].group = g;
    if (rc != K3C_OK) {
        if (wg) k3c_comm_group_free(wg);
        for (int r = 0; r < world; r++) k3c_rank_release(&ranks[r]);
        return k3c_error_context("ranks: the in-memory groups of %d ranks", world);
    }
    return K3C_OK;
}

int k3c_ranks_nccl(const k3c_layout *l, int rank, const char *rendezvous, int timeout_ms, k3c_rank *out) {
    int world = l->tp * l->pp * l->dp, tp = l->tp;
    place(out, l, rank, timeout_ms);
    if (!rendezvous || !*rendezvous)
        return k3c_errorf("engine: rank %d of %d: one process per rank needs a rendezvous file (--rendezvous PATH) "
                          "that every rank sees", rank, world);
    /* before anything waits: a build or host without NCCL fails here on every rank */
    if (k3c_comm_nccl_check() != K3C_OK) return k3c_error_context("engine: rank %d of %d", rank, world);
    out->rendezvous = strdup(rendezvous);
    if (!out->rendezvous) return k3c_errorf_kind(K3C_ERROR_OOM, "ranks: out of memory");
    unsigned char id[K3C_COMM_NCCL_ID_BYTES];
    int rc = rank == 0 ? k3c_comm_nccl_unique_id(id) : K3C_OK;
    if (rc == K3C_OK)
        rc = rank == 0 ? k3c_rendezvous_publish(rendezvous, id, world)
                       : k3c_rendezvous_wait(rendezvous, world, timeout_ms, id);
    if (rc == K3C_OK) rc = k3c_comm_nccl_create(id, rank, world, 0, NULL, &out->world_comm);
    /* creation returns once every rank has joined (or failed): the id is no longer needed */
    if (rank == 0) k3c_rendezvous_remove(rendezvous);
    if (rc == K3C_OK && tp < world) rc = k3c_comm_nccl_split(out->world_comm, rank / tp, rank % tp, &out->tp_comm);
    else if (rc == K3C_OK) out->tp_comm = out->world_comm;
    if (rc == K3C_OK && l->dcp > 1 && l->dcp < tp)
        rc = k3c_comm_nccl_split(out->world_comm, rank / l->dcp, rank % l->dcp, &out->dcp_comm);
    if (rc != K3C_OK) {
        k3c_rank_release(out);
        return k3c_error_context("engine: rank %d of %d", rank, world);
    }
    return K3C_OK;
}

int k3c_rank_split(k3c_rank *r) {
    const k3c_layout *l = &r->layout;
    k3c_comm *w = r->world_comm;
    int stage_ranks = l->tp * l->dp, stage = r->rank / stage_ranks;
    if ((l->pp > 1 || l->ep > 1) && !w->split)
        return k3c_errorf("ranks: the %s communicator cannot be split into groups", w->name);
    /* the colors and keys of k3c_comm_groups_split: every rank makes each split that exists, in this order */
    if (l->pp > 1 && w->split(w, r->rank % stage_ranks, stage, &r->pp_comm) != K3C_OK)
        return k3c_error_context("ranks: rank %d's pipeline group", r->rank);
    if (l->ep > 1 && w->split(w, stage, r->rank % stage_ranks, &r->ep_comm) != K3C_OK)
        return k3c_error_context("ranks: rank %d's expert group", r->rank);
    return K3C_OK;
}

void k3c_rank_release(k3c_rank *r) {
    if (!r) return;
    if (r->stage && r->be) r->be->free(r->be, r->stage);
    if (r->rows_stage && r->be) r->be->free(r->be, r->rows_stage);
    if (r->mailbox) r->mailbox->free(r->mailbox); /* before the TP group it was bootstrapped over */
    if (r->dcp_comm) r->dcp_comm->free(r->dcp_comm);
    if (r->pp_comm) r->pp_comm->free(r->pp_comm);
    if (r->ep_comm) r->ep_comm->free(r->ep_comm);
    if (r->fwd_pp) r->fwd_pp->free(r->fwd_pp);
    if (r->fwd_ep) r->fwd_ep->free(r->fwd_ep);
    if (r->tp_comm && r->tp_comm != r->world_comm) r->tp_comm->free(r->tp_comm);
    if (r->dev_world) r->dev_world->free(r->dev_world); /* after the groups split from it */
    if (r->world_comm) r->world_comm->free(r->world_comm);
    group_unref(r->group);
    free(r->rendezvous);
    memset(r, 0, sizeof *r);
}

int k3c_rank_stage(k3c_rank *r, k3c_backend *be, size_t max_bytes) {
    r->be = be;
    if (strcmp(r->world_comm->name, "nccl") != 0) return K3C_OK; /* host memory moves as it is */
    r->stage = be->alloc(be, max_bytes);
    if (!r->stage) return k3c_error_context("ranks: %zu bytes of staging for the step messages", max_bytes);
    r->stage_bytes = max_bytes;
    return K3C_OK;
}

int k3c_rank_broadcast(k3c_rank *r, void *host, size_t bytes) {
    k3c_comm *c = r->world_comm;
    if (!r->stage) return c->broadcast(c, host, bytes, 0);
    if (bytes > r->stage_bytes)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "ranks: a broadcast of %zu bytes, staging holds %zu", bytes,
                               r->stage_bytes);
    k3c_backend *be = r->be;
    if (r->rank == 0) {
        be->upload(be, r->stage, host, bytes);
        K3C_TRY(be->sync(be));
    }
    K3C_TRY(c->broadcast(c, r->stage, bytes, 0));
    K3C_TRY(c->barrier(c)); /* NCCL queues the broadcast on its stream: the barrier is the bounded wait */
    be->download(be, host, r->stage, bytes);
    return be->sync(be);
}

int k3c_rank_stage_rows(k3c_rank *r, size_t max_bytes) {
    if (!r->stage || (r->layout.pp == 1 && r->layout.dp == 1)) return K3C_OK; /* host memory moves as it is */
    r->rows_stage = r->be->alloc(r->be, max_bytes);
    if (!r->rows_stage) return k3c_error_context("ranks: %zu bytes of staging for the logits rows", max_bytes);
    r->rows_stage_bytes = max_bytes;
    return K3C_OK;
}

static int rows_fit(const k3c_rank *r, size_t bytes, const char *what) {
    if (bytes <= r->rows_stage_bytes) return K3C_OK;
    return k3c_errorf_kind(K3C_ERROR_INTERNAL, "ranks: %s of %zu bytes of logits rows, staging holds %zu", what, bytes,
                           r->rows_stage_bytes);
}

/* Over NCCL the pipeline group is on the backend's stream (k3c_rank_attach_device) and the world on the
 * legacy one; each staged call syncs the backend around the communicator's bounded wait (the barrier, or the
 * send / recv's own), so neither ordering is assumed. */
int k3c_rank_pp_broadcast(k3c_rank *r, void *host, size_t bytes) {
    k3c_comm *c = r->pp_comm;
    int root = r->layout.pp - 1;
    if (!r->rows_stage) return c->broadcast(c, host, bytes, root);
    K3C_TRY(rows_fit(r, bytes, "a pipeline broadcast"));
    k3c_backend *be = r->be;
    if (c->rank == root) {
        be->upload(be, r->rows_stage, host, bytes);
        K3C_TRY(be->sync(be));
    }
    K3C_TRY(c->broadcast(c, r->rows_stage, bytes, root));
    K3C_TRY(c->barrier(c));
    if (c->rank == root) return K3C_OK; /* its rows are in host already */
    be->download(be, host, r->rows_stage, bytes);
    return be->sync(be);
}

int k3c_rank_send_rows(k3c_rank *r, const void *host, size_t bytes, int peer) {
    k3c_comm *c = r->world_comm;
    if (!r->rows_stage) return c->send(c, host, bytes, peer);
    K3C_TRY(rows_fit(r, bytes, "a send"));
    k3c_backend *be = r->be;
    be->upload(be, r->rows_stage, host, bytes);
    K3C_TRY(be->sync(be));
    return c->send(c, r->rows_stage, bytes, peer); /* NCCL's send waits for itself (comm/nccl.c) */
}

int k3c_rank_recv_rows(k3c_rank *r, void *host, size_t bytes, int peer) {
    k3c_comm *c = r->world_comm;
    if (!r->rows_stage) return c->recv(c, host, bytes, peer);
    K3C_TRY(rows_fit(r, bytes, "a receive"));
    K3C_TRY(c->recv(c, r->rows_stage, bytes, peer)); /* done when it returns, as the send */
    k3c_backend *be = r->be;
    be->download(be, host, r->rows_stage, bytes);
    return be->sync(be);
}

int k3c_rank_all_gather(k3c_rank *r, const void *src, void *dst, size_t bytes) {
    k3c_comm *c = r->world_comm;
    if (!r->stage) return c->all_gather(c, src, dst, bytes);
    size_t all = bytes * (size_t)r->world;
    if (all > r->stage_bytes)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "ranks: an all-gather of %zu bytes, staging holds %zu", all,
                               r->stage_bytes);
    k3c_backend *be = r->be;
    char *mine = (char *)r->stage + bytes * (size_t)r->rank;
    be->upload(be, mine, src, bytes);
    K3C_TRY(be->sync(be));
    K3C_TRY(c->all_gather(c, mine, r->stage, bytes));
    K3C_TRY(c->barrier(c));
    be->download(be, dst, r->stage, all);
    return be->sync(be);
}

void k3c_rank_fail(k3c_rank *r, long step, const char *msg) {
    if (r->group) {
        pthread_mutex_lock(&r->group->mu);
        if (r->group->rank < 0) {
            r->group->rank = r->rank;
            r->group->step = step;
            snprintf(r->group->msg, sizeof r->group->msg, "%s", msg ? msg : "");
        }
        pthread_mutex_unlock(&r->group->mu);
    } else if (r->rendezvous) {
        k3c_rendezvous_note_failure(r->rendezvous, r->rank, step, msg);
    }
    if (r->dcp_comm) r->dcp_comm->abort(r->dcp_comm);
    if (r->tp_comm && r->tp_comm != r->world_comm) r->tp_comm->abort(r->tp_comm);
    if (r->pp_comm) r->pp_comm->abort(r->pp_comm);
    if (r->ep_comm) r->ep_comm->abort(r->ep_comm);
    if (r->fwd_pp) r->fwd_pp->abort(r->fwd_pp);
    if (r->fwd_ep) r->fwd_ep->abort(r->fwd_ep);
    if (r->dev_world) r->dev_world->abort(r->dev_world);
    if (r->dev_group) {
        /* failed before its backend joined the device group (k3c_rank_attach_device): join it to fail it, so
         * the peers already in its collectives (the staged world's split) stop waiting now */
        int pd = r->layout.pp > 1 || r->layout.dp > 1;
        k3c_comm *c = NULL;
        if (k3c_comm_group_join(r->dev_group, pd ? r->rank : r->tp_rank, &c) == K3C_OK) {
            c->abort(c);
            c->free(c);
        } else {
            k3c_error_clear();
        }
        r->dev_group = NULL;
    }
    if (r->world_comm) r->world_comm->abort(r->world_comm);
}

int k3c_rank_failure(const k3c_rank *r, int *rank, long *step, char *msg, size_t cap) {
    if (r->group) {
        pthread_mutex_lock(&r->group->mu);
        int found = r->group->rank >= 0;
        if (found) {
            *rank = r->group->rank;
            *step = r->group->step;
            if (cap) snprintf(msg, cap, "%s", r->group->msg);
        }
        pthread_mutex_unlock(&r->group->mu);
        return found;
    }
    return k3c_rendezvous_find_failure(r->rendezvous, r->world, rank, step, msg, cap);
}

/* ---- the start-up check ---- */

static const char *const fp_names[K3C_FP_FIELDS] = {
    [K3C_FP_VERSION] = "library version", [K3C_FP_CONFIG] = "model config (hash)",
    [K3C_FP_WEIGHTS] = "model weight bytes", [K3C_FP_WORLD] = "world size", [K3C_FP_TP] = "tp", [K3C_FP_PP] = "pp",
    [K3C_FP_DP] = "dp", [K3C_FP_EP] = "ep", [K3C_FP_RANK] = "rank", [K3C_FP_DEVICE] = "device",
    [K3C_FP_EXACT_F32] = "exact_f32", [K3C_FP_KV_FP8] = "kv_fp8", [K3C_FP_MAX_CONTEXT] = "max_context",
    [K3C_FP_MAX_REQUESTS] = "max_requests", [K3C_FP_MAX_ROWS] = "max_rows", [K3C_FP_BLOCK_SIZE] = "block_size",
    [K3C_FP_NUM_BLOCKS] = "num_blocks", [K3C_FP_Q_MAX] = "q_max", [K3C_FP_CHUNK_MIN] = "chunk_min",
    [K3C_FP_MLA_EXPAND_MIN] = "mla_expand_min", [K3C_FP_AUX_LAYERS] = "aux_layers (hash)",
    [K3C_FP_POISON] = "poison_freed_blocks", [K3C_FP_DCP] = "dcp",
};

const char *k3c_rank_fingerprint_field(int field) {
    return field >= 0 && field < K3C_FP_FIELDS ? fp_names[field] : "?";
}

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    return h * 0xbf58476d1ce4e5b9ull;
}

static uint64_t mix_f(uint64_t h, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return mix(h, u);
}

/* Every field of the config that changes what the model computes (the layer arrays included). */
static uint64_t config_hash(const k3c_config *c) {
    const int ints[] = {
        (int)c->family, c->vocab_size, c->hidden_size, c->num_layers, c->tie_word_embeddings,
        c->max_position_embeddings, (int)c->hidden_act, c->attn_res_block_size, c->num_attn_res_blocks,
        c->first_k_dense_replace, c->moe_layer_freq, c->intermediate_size, c->num_experts,
        c->num_experts_per_token, c->num_shared_experts, c->moe_intermediate_size, c->routed_expert_hidden_size,
        c->latent_moe_use_norm, c->router_sigmoid, c->use_correction_bias, c->use_grouped_topk,
        c->num_expert_group, c->topk_group, c->moe_renormalize, (int)c->expert_format, c->mxfp4_group_size,
        c->num_attention_heads, c->q_lora_rank, c->kv_lora_rank, c->qk_nope_head_dim, c->qk_rope_head_dim,
        c->v_head_dim, c->mla_use_output_gate, c->kda_num_heads, c->kda_head_dim, c->kda_conv_kernel,
        c->kda_full_rank_gate, c->kda_has_lower_bound, c->kda_a_log_padded, c->bos_token_id, c->eos_token_id,
        c->pad_token_id,
    };
    uint64_t h = 0x6b3363636f6e6667ull;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) h = mix(h, (uint64_t)(int64_t)ints[i]);
    const float fl[] = {c->rms_norm_eps, c->mla_lora_norm_eps, c->situ_beta, c->situ_linear_beta,
                        c->routed_scaling_factor, c->kda_gate_lower_bound};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) h = mix_f(h, fl[i]);
    for (int l = 0; l < c->num_layers; l++) {
        h = mix(h, c->layer_attn ? (uint64_t)c->layer_attn[l] : 0);
        h = mix(h, c->layer_is_moe ? c->layer_is_moe[l] : 0);
    }
    return h;
}

void k3c_rank_fingerprint_fill(k3c_rank_fingerprint *f, const k3c_config *c, uint64_t weight_bytes,
                               const k3c_engine_options *o, const k3c_rank *r) {
    memset(f, 0, sizeof *f);
    uint64_t *v = f->v;
    v[K3C_FP_VERSION] = K3C_VERSION_NUMBER;
    v[K3C_FP_CONFIG] = config_hash(c);
    v[K3C_FP_WEIGHTS] = weight_bytes;
    v[K3C_FP_WORLD] = (uint64_t)r->world;
    v[K3C_FP_TP] = (uint64_t)r->layout.tp;
    v[K3C_FP_PP] = (uint64_t)r->layout.pp;
    v[K3C_FP_DP] = (uint64_t)r->layout.dp;
    v[K3C_FP_EP] = (uint64_t)r->layout.ep;
    v[K3C_FP_RANK] = (uint64_t)r->rank;
    v[K3C_FP_DEVICE] = !strcmp(o->device, "cpu") ? 1 : !strcmp(o->device, "cuda") ? 2 : 3;
    v[K3C_FP_EXACT_F32] = o->exact_f32 != 0;
    v[K3C_FP_KV_FP8] = o->kv_fp8 != 0;
    v[K3C_FP_MAX_CONTEXT] = (uint64_t)o->max_context;
    v[K3C_FP_MAX_REQUESTS] = (uint64_t)o->max_requests;
    v[K3C_FP_MAX_ROWS] = (uint64_t)o->max_rows;
    v[K3C_FP_BLOCK_SIZE] = (uint64_t)o->block_size;
    v[K3C_FP_NUM_BLOCKS] = (uint64_t)o->num_blocks;
    v[K3C_FP_Q_MAX] = (uint64_t)o->q_max;
    v[K3C_FP_CHUNK_MIN] = (uint64_t)o->chunk_min;
    v[K3C_FP_MLA_EXPAND_MIN] = (uint64_t)o->mla_expand_min;
    uint64_t aux = mix(0, (uint64_t)o->num_aux);
    for (int i = 0; i < o->num_aux; i++) aux = mix(aux, (uint64_t)o->aux_layers[i]);
    v[K3C_FP_AUX_LAYERS] = aux;
    v[K3C_FP_POISON] = o->poison_freed_blocks != 0;
    v[K3C_FP_DCP] = (uint64_t)r->layout.dcp;
}

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static int fault_rank = -1, fault_stall, skew_rank = -1, skew_field;
static long fault_step;

int k3c_rank_fingerprint_check(k3c_rank *r, const k3c_rank_fingerprint *mine, int *differ) {
    *differ = 0;
    k3c_rank_fingerprint me = *mine;
    pthread_mutex_lock(&hook_mu);
    if (skew_rank == r->rank && skew_field >= 0 && skew_field < K3C_FP_FIELDS) me.v[skew_field] += 1;
    pthread_mutex_unlock(&hook_mu);
    k3c_rank_fingerprint *all = malloc(sizeof *all * (size_t)r->world);
    if (!all) return k3c_errorf_kind(K3C_ERROR_OOM, "start-up check: out of memory");
    if (k3c_rank_all_gather(r, &me, all, sizeof me) != K3C_OK) {
        free(all);
        return k3c_error_context("start-up check (rank %d of %d: every rank's fingerprint)", r->rank, r->world);
    }
    int rc = K3C_OK;
    for (int q = 0; q < r->world && rc == K3C_OK; q++)
        for (int f = 0; f < K3C_FP_FIELDS && rc == K3C_OK; f++) {
            uint64_t want = f == K3C_FP_RANK ? (uint64_t)q : all[0].v[f], got = all[q].v[f];
            if (got == want) continue;
            int hex = f == K3C_FP_CONFIG || f == K3C_FP_AUX_LAYERS;
            if (f == K3C_FP_RANK)
                rc = k3c_errorf("start-up check: the rank in place %d of %d says it is rank %llu: two processes were "
                                "started with the same --rank", q, r->world, (unsigned long long)got);
            else
                rc = k3c_errorf(hex ? "start-up check: rank %d's %s is %#llx, rank 0's %#llx: every rank must run the "
                                      "same model with the same options"
                                    : "start-up check: rank %d's %s is %llu, rank 0's %llu: every rank must run the "
                                      "same model with the same options",
                                q, fp_names[f], (unsigned long long)got, (unsigned long long)want);
        }
    free(all);
    *differ = rc != K3C_OK;
    return rc;
}

void k3c_ranks_test_fault(int rank, long step, int stall) {
    pthread_mutex_lock(&hook_mu);
    fault_rank = rank;
    fault_step = step;
    fault_stall = stall;
    pthread_mutex_unlock(&hook_mu);
}

void k3c_ranks_test_skew(int rank, int field) {
    pthread_mutex_lock(&hook_mu);
    skew_rank = rank;
    skew_field = field;
    pthread_mutex_unlock(&hook_mu);
}

int k3c_ranks_fault_at(int rank, long step) {
    pthread_mutex_lock(&hook_mu);
    int f = fault_rank >= 0 && rank == fault_rank && step == fault_step ? 1 + (fault_stall != 0) : 0;
    pthread_mutex_unlock(&hook_mu);
    return f;
}
