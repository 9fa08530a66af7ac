/* The engine of include/k3c.h: a backend, the stock forward, the paged MLA cache, the KDA slots, the
 * request table and (cuda) the specialized decode executor, all allocated at creation. A step only takes
 * cache blocks from the free list. Every step is planned here (decode/plan.h) and run by the executor on a
 * specialized route, else by the stock forward: the engine calls the executor, never the reverse. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode/executor.h"
#include "decode/executor_cuda.h"
#include "decode/prepared.h"
#include "k3c.h"
#include "model/model.h"
#include "model/shard.h"
#include "runtime/engine_internal.h"
#include "runtime/engine_ranks.h"
#include "runtime/ranks.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "backend/backend.h"
#include "stock/forward.h"
#include "util/error.h"
#include "util/log.h"

/* The CUDA backend exists only in builds with nvcc (K3C_HAVE_CUDA). The reference is strong there: a weak
 * one would not pull backend_cuda.o out of the static library. */
#ifdef K3C_HAVE_CUDA
static k3c_backend *(*const cuda_create)(int device) = k3c_backend_cuda_create;
static void (*const cuda_set_exact)(k3c_backend *be, int exact) = k3c_backend_cuda_set_exact;
#else
static k3c_backend *(*const cuda_create)(int device) = NULL;
static void (*const cuda_set_exact)(k3c_backend *be, int exact) = NULL;
#endif

typedef struct engine_request {
    int open;
    int length;   /* committed tokens */
    int pending;  /* tokens of an uncommitted verify, 0 when none */
    int nblocks;
    int32_t *blocks; /* [max_blocks_per_request] */
} engine_request;

struct k3c_engine {
    k3c_model *m;          /* the whole model (the public getters, the config) */
    k3c_engine_options o;
    /* one rank of a parallel group (runtime/engine_ranks.h; NULL at world size 1): its state, and the shard of
     * m it holds (NULL under tp 1); fm is the model the forward and the caches are built for (shard or m) */
    k3c_engine_ranks *xr;
    k3c_model *shard;
    const k3c_model *fm;
    int mem_share;         /* ranks in this process sharing its memory (the memory plan's limit is split) */
    int *nb;               /* [max_requests] step scratch: blocks each item's table holds */
    k3c_backend *be;
    k3c_forward *fwd;
    k3c_kv_cache kv;
    k3c_kda_slots ks;
    int max_blocks_per_request;
    engine_request *req; /* [max_requests], request id = KDA slot */
    int32_t *block_store;
    k3c_fwd_req *fr;     /* [max_requests] step scratch */
    int *aux_layers;     /* [o.num_aux] copy of the option */
    float *aux;          /* host [num_aux, max_rows, D]: the last step's streams, [num_aux, aux_rows, D] packed */
    int aux_rows;        /* logits rows of the last step; -1: none valid (no step yet, or it failed) */
    /* logits buffers malloc'ed because the backend's host_alloc refused (k3c_engine_logits_alloc's fallback),
     * so k3c_engine_logits_free gives them to free() and not to host_free; [n_fallback] of cap_fallback */
    float **fallback;
    int n_fallback, cap_fallback;
    /* routing: the executor (NULL: none; xc its CUDA build when the engine built it), whether it takes
     * steps now (k3c_engine_set_specialized), the capture policy's per-shape state (0 never planned, 1
     * planned once and run stock, 2 capture failed: stays stock), the step shape's scratch, the counts */
    const k3c_decode_executor *x;
    k3c_decode_cuda *xc;
    int spec_on;
    unsigned char seen[K3C_PREPARED_MAX + 1][K3C_PREPARED_Q_MAX + 1];
    int *ql;        /* [max_requests] query lengths */
    uint8_t *hp;    /* [max_requests] prompt flags */
    k3c_plan last_plan;
    int last_exec;  /* the last step ran on the executor */
    k3c_engine_stats st;
    int num_blocks_given;  /* o.num_blocks came from the caller (else max_requests x max_context) */
    k3c_engine_memory mem; /* the memory plan's reservation (k3c_engine_memory_get) */
    /* KDA snapshots of the prefix cache (k3c_engine_snapshots_reserve): snap_count buffers of snap_bytes
     * each, one backend allocation */
    void *snap_base;
    size_t snap_bytes;
    int snap_count;
};

/* The aux layer list: strictly increasing indices in 0..num_layers, at most K3C_MAX_AUX. */
static int check_aux(const k3c_model *m, const k3c_engine_options *o) {
    int L = m->config.num_layers;
    if (o->num_aux < 0 || o->num_aux > K3C_MAX_AUX)
        return k3c_errorf("engine: num_aux %d outside 0..%d (K3C_MAX_AUX)", o->num_aux, K3C_MAX_AUX);
    if (o->num_aux > 0 && !o->aux_layers) return k3c_errorf("engine: num_aux %d but aux_layers is NULL", o->num_aux);
    for (int i = 0; i < o->num_aux; i++) {
        int a = o->aux_layers[i];
        if (a < 0 || a > L)
            return k3c_errorf("engine: aux_layers[%d] = %d outside 0..%d (layer indices; %d = the output)", i, a, L,
                              L);
        if (i > 0 && a <= o->aux_layers[i - 1])
            return k3c_errorf("engine: aux_layers[%d] = %d after %d: the list must be strictly increasing", i, a,
                              o->aux_layers[i - 1]);
    }
    return K3C_OK;
}

static void fill_env(k3c_engine *e, k3c_decode_env *env) {
    *env = (k3c_decode_env){.m = e->fm, .be = e->be, .kv = &e->kv, .ks = &e->ks, .max_requests = e->o.max_requests,
                            .max_rows = e->o.max_rows, .max_context = e->o.max_context,
                            .block_size = e->o.block_size, .q_max = e->o.q_max,
                            .max_blocks_per_request = e->max_blocks_per_request, .aux_layers = e->aux_layers,
                            .num_aux = e->o.num_aux, .fwd = e->fwd}; /* fwd: the executor's wide route */
}

/* A TP rank's executor communicator: the TP group's mailbox, with slots for the executor's largest
 * collective (decode/executor_cuda.c check_tp_comm: PREPARED_MAX rows of the hidden size, the routed latent
 * or this rank's vocabulary part; a hybrid rank's wide steps up to K3C_WIDE_MAX rows). Every rank of the group gets the same answer (runtime/ranks.h); without
 * one the executor is built unprepared and every step plans stock (K3C_STOCK_TP_UNPREPARED), said once. */
static int executor_mailbox(k3c_engine *e, int dep, struct k3c_comm **out) {
    const k3c_config *c = &e->fm->config;
    size_t w = (size_t)c->hidden_size, rin = (size_t)k3c_config_expert_in(c), v = (size_t)c->vocab_size;
    if (rin > w) w = rin;
    if (v > w) w = v;
    size_t cap = (size_t)K3C_PREPARED_MAX * w;
    if (dep) { /* the hybrid's wide steps: their attention sums of up to K3C_WIDE_MAX rows of the hidden size */
        int wide = e->o.max_rows < K3C_WIDE_MAX ? e->o.max_rows : K3C_WIDE_MAX;
        if ((size_t)wide * c->hidden_size > cap) cap = (size_t)wide * c->hidden_size;
    }
    char why[512] = "";
    K3C_TRY(k3c_ranks_mailbox(e->xr, e->be, cap, out, why, sizeof why));
    if (!*out && k3c_ranks_rank(e->xr) == 0)
        k3c_log(K3C_LOG_INFO, "tp %d: no mailbox for the specialized executor, every step runs the stock forward: %s",
                k3c_ranks_place(e->xr)->layout.tp, why);
    return K3C_OK;
}

/* The specialized decode executor where the options ask for it (k3c_specialized): cuda only, and not under
 * the exact f32 diagnostic (the executor replays the bf16 path's launches). AUTO builds it where it can and
 * runs stock, with a warning, where the build fails; ON fails then. Shapes are captured later (step_plan).
 * A rank of a TP group builds it over the group's mailbox (executor_mailbox), on its shard; every rank
 * decides alike (the same options, the same mailbox answer), so the plan's predicates are the same on every
 * rank, and rank 0's routing, sent with each step, is every rank's. */
static int build_executor(k3c_engine *e) {
    int mode = e->o.specialized;
    if (mode == K3C_SPECIALIZED_OFF) return K3C_OK;
    if (strcmp(e->o.device, "cuda") != 0 || e->o.exact_f32) {
        if (mode == K3C_SPECIALIZED_AUTO) return K3C_OK;
        return k3c_errorf("the specialized executor needs device cuda without exact_f32 (device %s%s)", e->o.device,
                          e->o.exact_f32 ? ", exact_f32" : "");
    }
    const k3c_rank *rk = e->xr ? k3c_ranks_place(e->xr) : NULL;
    /* DEP (DP attention at TP1, or the hybrid's TP groups, EP MoE, one stage): a DP rank's executor over its EP
     * group (decode/executor_cuda.h), each rank's own part of a step planned and run there (k3c_engine_dp_part) */
    int dep = rk && rk->layout.dp > 1 && rk->layout.ep > 1 && rk->layout.pp == 1;
    if (rk && !dep && (rk->layout.pp > 1 || rk->layout.dp > 1)) { /* the executor's TP group is the world's */
        if (mode == K3C_SPECIALIZED_AUTO) {
            if (rk->rank == 0)
                k3c_log(K3C_LOG_INFO, "pp %d, dp %d, ep %d, tp %d: the specialized executor runs under tp only or at "
                        "DEP / the hybrid (dp with ep, one stage), every step runs the stock forward", rk->layout.pp,
                        rk->layout.dp, rk->layout.ep, rk->layout.tp);
            return K3C_OK;
        }
        return k3c_errorf("the specialized executor runs under tp only, or at DEP / the hybrid with ep and one stage "
                          "(pp %d, dp %d, ep %d, tp %d)", rk->layout.pp, rk->layout.dp, rk->layout.ep, rk->layout.tp);
    }
    k3c_decode_env env;
    fill_env(e, &env);
    if (dep) env.ep = rk->fwd_ep ? rk->fwd_ep : rk->ep_comm; /* the forward's EP group (device memory on CUDA) */
    if (rk && rk->layout.tp > 1) {
        K3C_TRY(executor_mailbox(e, dep, &env.tp));
        if (!env.tp && mode == K3C_SPECIALIZED_ON)
            return k3c_errorf("the specialized executor at tp %d needs the TP group's mailbox (see the log)",
                              rk->layout.tp);
    }
    k3c_decode_cuda *xc = NULL;
    int rc = rk ? k3c_decode_cuda_build(&env, rk->tp_rank, rk->layout.tp, &xc) : k3c_decode_cuda_build(&env, 0, 1, &xc);
    if (rc == K3C_OK) rc = k3c_decode_cuda_prepare_kv(xc, 0);
    if (rk && rk->layout.tp > 1) { /* every rank has one, or none has: rank 0's routing is every rank's */
        char mine[1024];
        snprintf(mine, sizeof mine, "%s", rc == K3C_OK ? "" : k3c_error_message());
        int all = 0;
        if (k3c_ranks_agree(e->xr, e->be, rc == K3C_OK, &all) != K3C_OK) {
            k3c_decode_cuda_free(xc);
            return K3C_ERR;
        }
        if (rc == K3C_OK && !all)
            rc = k3c_errorf("the specialized executor was not built on another rank (its log says why)");
        else if (rc != K3C_OK) k3c_errorf("%s", mine);
    }
    if (rc != K3C_OK) {
        k3c_decode_cuda_free(xc);
        if (mode == K3C_SPECIALIZED_ON) return K3C_ERR;
        k3c_log(K3C_LOG_WARN, "the specialized decode executor was not built, every step runs stock: %s",
                k3c_error_message());
        k3c_error_clear();
        return K3C_OK;
    }
    e->xc = xc;
    e->x = k3c_decode_cuda_executor(xc);
    e->spec_on = 1;
    return K3C_OK;
}

void k3c_engine_options_default(k3c_engine_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->max_requests = 4;
    o->max_rows = 256;
    o->max_context = 0; /* min(4096, the model's context length), at creation */
    o->block_size = 16;
    o->q_max = 8;
    o->specialized = K3C_SPECIALIZED_AUTO;
}

/* "1.23 GiB" */
static const char *human_bytes(char *buf, size_t n, double b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int i = 0;
    while (b >= 1024 && i < 6) b /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

/* The memory plan: the caches (the MLA latent cache of num_blocks blocks and the KDA state of max_requests
 * slots) are the engine's only reservations that grow with max_requests x max_context, so they are sized
 * from the options and checked against the limit (memory_limit, or what the device has free once the
 * weights and step buffers are in place) before anything is allocated for them. A need past the limit is
 * refused, naming the options that set it; nothing is reserved beyond the limit. */
static int plan_memory(k3c_engine *e) {
    const k3c_engine_options *o = &e->o;
    const k3c_config *c = &e->fm->config;
    int lf = 0, le = 0; /* a pipeline stage plans the caches of its own layers */
    k3c_model_stage_layers(e->fm, &lf, &le);
    double kv = k3c_kv_cache_bytes_layers(c, lf, le, e->be->kv_elem_bytes, (double)o->num_blocks * o->block_size);
    int dcp = o->layout.dcp > 1 ? o->layout.dcp : 1; /* the cache holds dcp tokens per local slot (kv_cache.h) */
    double kda = k3c_kda_slots_bytes_layers(c, lf, le, o->max_requests, o->q_max, o->max_requests);
    const char *source = "memory_limit";
    double limit = (double)o->memory_limit;
    if (!o->memory_limit) limit = e->be->mem_free ? (double)e->be->mem_free(e->be, &source) : 0;
    if (e->mem_share > 1) { /* ranks in one process: each rank's caches take their share of its memory */
        limit /= e->mem_share;
        source = o->memory_limit ? "memory_limit split over the ranks in this process"
                                 : "free memory split over the ranks in this process";
    }
    char need[32], lim[32], kvs[32], kdas[32];
    human_bytes(need, sizeof need, kv + kda);
    human_bytes(lim, sizeof lim, limit);
    human_bytes(kvs, sizeof kvs, kv);
    human_bytes(kdas, sizeof kdas, kda);
    if (limit > 0 && kv + kda > limit) {
        if (e->num_blocks_given)
            return k3c_errorf("num_blocks %d (%d tokens each) and the KDA state of %d requests need %s "
                              "(MLA cache %s, KDA state %s), more than the memory limit of %s (%s): lower "
                              "num_blocks or max_requests, or raise memory_limit (--memory-limit)",
                              o->num_blocks, o->block_size, o->max_requests, need, kvs, kdas, lim, source);
        return k3c_errorf("max_requests %d x max_context %d tokens need %s of caches (MLA cache %s, KDA "
                          "state %s), more than the memory limit of %s on %s (%s): lower max_requests "
                          "(--max-requests) or max_context (--max-context, -n), or raise memory_limit "
                          "(--memory-limit)",
                          o->max_requests, o->max_context, need, kvs, kdas, lim, e->be->name, source);
    }
    e->mem = (k3c_engine_memory){.cache_bytes = (size_t)(kv + kda), .kv_bytes = (size_t)kv,
                                 .kda_bytes = (size_t)kda, .limit = (size_t)limit, .limit_source = source,
                                 .max_requests = o->max_requests, .max_context = o->max_context,
                                 .cache_tokens = (long)o->num_blocks * o->block_size * dcp};
    return K3C_OK;
}

int k3c_engine_create(k3c_model *m, const k3c_engine_options *opt, k3c_engine **out) {
    if (!out) return k3c_errorf("engine: no output handle (NULL)");
    *out = NULL;
    if (!m) return k3c_errorf("engine: no model (NULL)");
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    if (opt) {
        o = *opt;
        k3c_engine_options d;
        k3c_engine_options_default(&d);
        if (!o.device) o.device = d.device;
        if (o.max_requests <= 0) o.max_requests = d.max_requests;
        if (o.max_rows <= 0) o.max_rows = d.max_rows;
        if (o.block_size <= 0) o.block_size = d.block_size;
        if (o.q_max <= 0) o.q_max = d.q_max;
    }
    /* the model's context length: positions past it are outside what it was built for (its RoPE and
     * training), so no request may hold more */
    const int model_ctx = m->config.max_position_embeddings;
    if (o.max_context <= 0) o.max_context = model_ctx > 0 && model_ctx < 4096 ? model_ctx : 4096;
    if (model_ctx > 0 && o.max_context > model_ctx)
        return k3c_errorf("engine: max_context %d tokens exceeds the model's context length of %d "
                          "(max_position_embeddings in config.json)", o.max_context, model_ctx);
    if (o.q_max > o.max_rows) return k3c_errorf("engine: q_max %d exceeds max_rows %d", o.q_max, o.max_rows);
    if (o.specialized < K3C_SPECIALIZED_AUTO || o.specialized > K3C_SPECIALIZED_ON)
        return k3c_errorf("engine: specialized %d: expected K3C_SPECIALIZED_AUTO (%d), _OFF (%d) or _ON (%d)",
                          o.specialized, K3C_SPECIALIZED_AUTO, K3C_SPECIALIZED_OFF, K3C_SPECIALIZED_ON);
    /* 64-bit: max_context and max_requests come from callers (CLI options), their product need not fit an int */
    /* under DCP a block covers block_size x dcp of a request's tokens (cache/kv_cache.h) */
    int64_t tpb = (int64_t)o.block_size * (o.layout.dcp > 1 ? o.layout.dcp : 1);
    int64_t mbr64 = ((int64_t)o.max_context + tpb - 1) / tpb;
    int num_blocks_given = o.num_blocks > 0;
    if (o.num_blocks <= 0) {
        int64_t blocks = mbr64 * o.max_requests;
        if (blocks > INT32_MAX)
            return k3c_errorf("engine: max_context %d x max_requests %d needs %lld cache blocks of %d tokens, "
                              "more than %d", o.max_context, o.max_requests, (long long)blocks, o.block_size,
                              INT32_MAX);
        o.num_blocks = (int)blocks;
    }
    if (o.num_aux == 0) o.aux_layers = NULL;
    K3C_TRY(check_aux(m, &o));
    k3c_layout layout;
    int world = 1;
    K3C_TRY(k3c_ranks_layout(&m->config, &o, &layout, &world));
    if (world > 1) return k3c_engine_ranks_create(m, &o, &layout, world, num_blocks_given, out);
    return k3c_engine_build(m, &o, num_blocks_given, NULL, out);
}

int k3c_engine_build(k3c_model *m, const k3c_engine_options *opt, int num_blocks_given, k3c_engine_ranks *xr,
                     k3c_engine **out) {
    *out = NULL;
    const k3c_engine_options o = *opt;
    int dcp = o.layout.dcp > 1 ? o.layout.dcp : 1;
    int64_t tpb = (int64_t)o.block_size * dcp;
    int mbr = (int)(((int64_t)o.max_context + tpb - 1) / tpb);
    k3c_engine *e = calloc(1, sizeof *e);
    if (!e) return k3c_errorf_kind(K3C_ERROR_OOM, "engine: out of memory");
    e->m = m;
    e->fm = m;
    e->o = o;
    e->num_blocks_given = num_blocks_given;
    e->mem_share = 1;
    /* e->xr is set once the engine is built: until then a failure leaves the rank state to the caller */
    const k3c_rank *rk = xr ? k3c_ranks_place(xr) : NULL;
    if (rk && (rk->layout.tp > 1 || rk->layout.pp > 1 || rk->layout.ep > 1)) {
        /* this rank's shard of the model (views into m, its row-parallel parts copied: model/shard.h): its TP
         * split, its stage's layers, its expert rank's experts */
        k3c_model_part part = {.tp_rank = rk->tp_rank, .tp = rk->layout.tp, .pp_stage = rk->pp_stage,
                               .pp = rk->layout.pp,
                               .ep_rank = rk->layout.ep > 1 ? rk->rank % (rk->layout.tp * rk->layout.dp) : 0,
                               .ep = rk->layout.ep};
        if (k3c_model_shard(m, &part, &e->shard) != K3C_OK) {
            k3c_engine_free(e);
            return k3c_error_context("engine: rank %d of %d", rk->rank, rk->world);
        }
        e->fm = e->shard;
    }
    /* ranks in this process share its memory: the host's (cpu), or each device's (cuda, rank % devices) */
    if (rk && rk->group) e->mem_share = strcmp(o.device, "cuda") ? rk->world : k3c_rank_device_share(rk);
    e->max_blocks_per_request = mbr;
    e->aux_rows = -1;
    /* From here every failure goes through k3c_engine_free, which releases what was set up and nothing twice
     * (each part's init leaves a zeroed, freeable state when it fails). */
    if (o.num_aux > 0) {
        e->aux_layers = malloc(sizeof(int) * (size_t)o.num_aux);
        e->aux = malloc(sizeof(float) * (size_t)o.num_aux * o.max_rows * m->config.hidden_size);
        if (!e->aux_layers || !e->aux) {
            k3c_engine_free(e);
            return k3c_errorf_kind(K3C_ERROR_OOM, "engine: out of host memory for %d aux streams of %d rows", o.num_aux, o.max_rows);
        }
        memcpy(e->aux_layers, o.aux_layers, sizeof(int) * (size_t)o.num_aux);
        e->o.aux_layers = e->aux_layers;
    }
    if (!strcmp(o.device, "cpu")) {
        e->be = k3c_backend_cpu_create(o.threads);
        if (e->be && o.exact_f32) k3c_backend_cpu_set_exact(e->be, 1);
    } else if (!strcmp(o.device, "cuda")) {
        if (!cuda_create) {
            k3c_engine_free(e);
            return k3c_errorf_kind(K3C_ERROR_DEVICE, "engine: device 'cuda': this build has no CUDA backend");
        }
        e->be = cuda_create(xr ? k3c_ranks_device(xr) : 0);
        if (e->be && xr && k3c_ranks_attach_backend(xr, e->be) != K3C_OK) {
            k3c_engine_free(e);
            return K3C_ERR;
        }
        if (e->be && o.exact_f32) cuda_set_exact(e->be, 1);
    } else {
        k3c_engine_free(e);
        return k3c_errorf("engine: unknown device '%s' (expected cpu or cuda)", o.device);
    }
    if (!e->be) {
        k3c_engine_free(e);
        return k3c_error_context("engine: device %s", o.device);
    }
    e->req = calloc((size_t)o.max_requests, sizeof *e->req);
    e->block_store = malloc(sizeof(int32_t) * (size_t)mbr * o.max_requests);
    e->fr = calloc((size_t)o.max_requests, sizeof *e->fr);
    e->ql = calloc((size_t)o.max_requests, sizeof *e->ql);
    e->hp = calloc((size_t)o.max_requests, sizeof *e->hp);
    e->nb = calloc((size_t)o.max_requests, sizeof *e->nb);
    if (!e->req || !e->block_store || !e->fr || !e->ql || !e->hp || !e->nb) {
        k3c_engine_free(e);
        return k3c_errorf_kind(K3C_ERROR_OOM, "engine: out of host memory");
    }
    for (int i = 0; i < o.max_requests; i++) e->req[i].blocks = e->block_store + (size_t)i * mbr;

    k3c_forward_options fo = {.max_rows = o.max_rows, .max_segs = o.max_requests, .max_context = o.max_context,
                              .block_size = o.block_size, .chunk_min = o.chunk_min,
                              .mla_expand_min = o.mla_expand_min, .kv_fp8 = o.kv_fp8,
                              .aux_layers = e->aux_layers, .num_aux = o.num_aux, .tp = rk ? rk->tp_comm : NULL,
                              .dcp = dcp, .dcp_group = rk ? rk->dcp_comm : NULL,
                              /* ranks in one process on cuda: the forward's own staged groups (runtime/ranks.h) */
                              .pp = !rk ? NULL : rk->fwd_pp ? rk->fwd_pp : rk->pp_comm,
                              .ep = !rk ? NULL : rk->fwd_ep ? rk->fwd_ep : rk->ep_comm};
    /* a pipeline stage's caches hold its own layers only; a DP rank's the same geometry as rank 0's (block ids
     * and slots are rank 0's: the blocks and slots of the requests placed on it are the ones it touches) */
    int lf = 0, le = 0;
    k3c_model_stage_layers(e->fm, &lf, &le);
    if (k3c_forward_create(e->be, e->fm, &fo, &e->fwd) != K3C_OK || plan_memory(e) != K3C_OK ||
        k3c_kv_cache_init_layers(&e->kv, e->be, &e->fm->config, lf, le, o.num_blocks, o.block_size) != K3C_OK ||
        k3c_kda_slots_init_layers(&e->ks, e->be, &e->fm->config, lf, le, o.max_requests, o.q_max,
                                  o.max_requests) != K3C_OK) {
        k3c_engine_free(e);
        return rk ? k3c_error_context("engine: rank %d of %d", rk->rank, rk->world) : k3c_error_context("engine");
    }
    e->kv.dcp = dcp;
    e->last_plan = (k3c_plan){.route = K3C_ROUTE_STOCK, .reason = K3C_STOCK_EMPTY};
    e->xr = xr;
    if (build_executor(e) != K3C_OK) {
        e->xr = NULL;
        k3c_engine_free(e);
        return k3c_error_context("engine: specialized decode executor");
    }
    const k3c_decode_executor *tx = xr ? k3c_ranks_test_executor_make(e) : NULL;
    if (tx) k3c_engine_set_executor(e, tx);
    *out = e;
    return K3C_OK;
}

void k3c_engine_free(k3c_engine *e) {
    if (!e) return;
    k3c_ranks_stop(e->xr); /* rank 0: the followers stop (and, in this process, are joined) first */
    k3c_decode_cuda_free(e->xc); /* before the caches and the backend it runs on */
    if (e->be) {
        if (e->snap_base) e->be->free(e->be, e->snap_base);
        k3c_forward_free(e->fwd);
        k3c_kv_cache_release(&e->kv, e->be);
        k3c_kda_slots_release(&e->ks, e->be);
        /* the rank's communicators after the forward that used them, its buffers before their backend */
        k3c_ranks_free(e->xr);
        e->xr = NULL;
        e->be->destroy(e->be);
    }
    k3c_ranks_free(e->xr);
    free(e->req);
    free(e->block_store);
    free(e->fr);
    free(e->ql);
    free(e->hp);
    free(e->nb);
    k3c_model_shard_free(e->shard);
    free(e->aux_layers);
    free(e->aux);
    free(e->fallback); /* the list only: a buffer still held here is the caller's (k3c.h: free it before) */
    free(e);
}

int k3c_engine_memory_get(const k3c_engine *e, k3c_engine_memory *out) {
    if (!e || !out) return k3c_errorf("engine memory: %s is NULL", e ? "the output" : "the engine");
    *out = e->mem;
    return K3C_OK;
}

/* The public entry points refuse a NULL handle or output with a message instead of dereferencing it; the
 * getters then return -1. */
static int null_engine(const char *what) { return k3c_errorf("%s: the engine is NULL", what); }

int k3c_engine_vocab(const k3c_engine *e) { return e ? e->m->config.vocab_size : null_engine("engine vocab"); }
int k3c_engine_max_rows(const k3c_engine *e) { return e ? e->o.max_rows : null_engine("engine max_rows"); }
int k3c_engine_hidden_size(const k3c_engine *e) {
    return e ? e->m->config.hidden_size : null_engine("engine hidden_size");
}
int k3c_engine_max_requests(const k3c_engine *e) {
    return e ? e->o.max_requests : null_engine("engine max_requests");
}
const char *k3c_engine_device(const k3c_engine *e) {
    return !e ? "" : !strcmp(e->o.device, "cuda") ? "cuda" : "cpu"; /* static strings, not the caller's option */
}
int k3c_engine_prompt_grid(const k3c_engine *e) {
    return e ? k3c_forward_prompt_grid(e->fwd) : null_engine("engine prompt_grid");
}

int k3c_engine_prompt_piece(const k3c_engine *e, int pos, int end, int max_tokens) {
    if (!e) return null_engine("engine prompt_piece");
    if (pos < 0 || pos >= end || max_tokens <= 0) return 0;
    return k3c_forward_prompt_piece(e->fwd, pos, end, max_tokens);
}

/* A follower rank's engine takes no calls of its own: rank 0 leads them all (k3c_engine_follow). */
static int leads(const k3c_engine *e, const char *what) {
    if (e->xr && k3c_ranks_rank(e->xr) != 0)
        return k3c_errorf("%s: this engine is rank %d of %d, which follows rank 0's steps (k3c_engine_follow) and "
                          "takes none of its own", what, k3c_ranks_rank(e->xr), k3c_ranks_world(e->xr));
    return K3C_OK;
}

/* One reference of a block dropped; on a rank group a block poisoned as it is freed is poisoned on every
 * rank (each holds its own copy of the replicated MLA cache). */
static int give_block(k3c_engine *e, int block) {
    k3c_kv_cache_give(&e->kv, e->be, block, e->o.poison_freed_blocks);
    if (e->xr && e->o.poison_freed_blocks && e->kv.ref[block] == 0)
        return k3c_ranks_log(e->xr, K3C_RANK_OP_POISON, block, 0, NULL, 0);
    return K3C_OK;
}

static int check_id(const k3c_engine *e, int id) {
    if (!e) return null_engine("engine request");
    if (id < 0 || id >= e->o.max_requests || !e->req[id].open)
        return k3c_errorf("engine: request %d is not open", id);
    return K3C_OK;
}

int k3c_request_open(k3c_engine *e, int *id) { return k3c_engine_request_open_prefix(e, NULL, 0, id); }

int k3c_engine_request_open_prefix(k3c_engine *e, const int32_t *blocks, int n, int *id) {
    return k3c_engine_request_open_dp(e, blocks, n, -1, id);
}

int k3c_engine_request_open_dp(k3c_engine *e, const int32_t *blocks, int n, int dp, int *id) {
    if (!e || !id) return k3c_errorf("engine request_open: %s is NULL", e ? "the id output" : "the engine");
    K3C_TRY(leads(e, "engine request_open"));
    if (n < 0 || n >= e->max_blocks_per_request || (n > 0 && !blocks))
        return k3c_errorf("engine request_open: a prefix of %d blocks (a request holds at most %d, the last "
                          "one its own)", n, e->max_blocks_per_request);
    for (int b = 0; b < n; b++)
        if (blocks[b] < 0 || blocks[b] >= e->kv.num_blocks || e->kv.ref[blocks[b]] <= 0)
            return k3c_errorf_kind(K3C_ERROR_INTERNAL, "engine request_open: prefix block %d (id %d) is not held",
                                   b, blocks[b]);
    for (int i = 0; i < e->o.max_requests; i++) {
        engine_request *r = &e->req[i];
        if (r->open) continue;
        r->open = 1;
        r->pending = 0;
        for (int b = 0; b < n; b++) {
            r->blocks[b] = blocks[b];
            k3c_kv_cache_ref(&e->kv, blocks[b]);
        }
        r->nblocks = n;
        r->length = n * e->o.block_size * (e->kv.dcp > 1 ? e->kv.dcp : 1);
        k3c_kda_slots_reset(&e->ks, e->be, i);
        *id = i;
        if (e->xr) K3C_TRY(k3c_ranks_log(e->xr, K3C_RANK_OP_OPEN, i, 0, blocks, n));
        if (e->xr && k3c_ranks_assign(e->xr, i, dp) < 0) return K3C_ERR;
        return e->be->sync(e->be);
    }
    return k3c_errorf("engine: all %d request slots are open", e->o.max_requests);
}

const int32_t *k3c_engine_request_blocks(const k3c_engine *e, int id, int *n) {
    if (check_id(e, id) != K3C_OK) return NULL;
    *n = e->req[id].nblocks;
    return e->req[id].blocks;
}

int k3c_engine_blocks_free(const k3c_engine *e) { return e->kv.num_free; }
int k3c_engine_block_refs(const k3c_engine *e, int block) { return e->kv.ref[block]; }
void k3c_engine_block_ref(k3c_engine *e, int block) { k3c_kv_cache_ref(&e->kv, block); }
void k3c_engine_block_unref(k3c_engine *e, int block) {
    give_block(e, block); /* a group that failed here fails the next step, which reports it */
}

int k3c_engine_slots_free(const k3c_engine *e) {
    int n = 0;
    for (int i = 0; i < e->o.max_requests; i++) n += !e->req[i].open;
    return n;
}

size_t k3c_engine_snapshot_bytes(const k3c_engine *e) { return k3c_kda_slots_snapshot_bytes(&e->ks); }

int k3c_engine_snapshots_reserve(k3c_engine *e, int count) {
    K3C_TRY(leads(e, "engine snapshots_reserve"));
    if (e->snap_base) e->be->free(e->be, e->snap_base);
    e->snap_base = NULL;
    e->snap_count = 0;
    e->snap_bytes = k3c_kda_slots_snapshot_bytes(&e->ks);
    if (count > 0 && e->snap_bytes > 0) {
        e->snap_base = e->be->alloc(e->be, e->snap_bytes * (size_t)count);
        if (!e->snap_base) return k3c_error_context("engine: %d KDA snapshots of %zu bytes", count, e->snap_bytes);
        e->snap_count = count;
    }
    /* every rank its own snapshots of its own KDA heads */
    return e->xr ? k3c_ranks_log(e->xr, K3C_RANK_OP_SNAP_RESERVE, count > 0 ? count : 0, 0, NULL, 0) : K3C_OK;
}

static int check_snap(const k3c_engine *e, int id, int snap) {
    K3C_TRY(check_id(e, id));
    if (snap < 0 || snap >= e->snap_count)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "engine snapshot %d outside 0..%d", snap, e->snap_count - 1);
    if (e->req[id].pending)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "engine snapshot: request %d has an uncommitted verify", id);
    return K3C_OK;
}

int k3c_engine_snapshot_save(k3c_engine *e, int id, int snap) {
    K3C_TRY(check_snap(e, id, snap));
    k3c_kda_slots_save(&e->ks, e->be, id, (char *)e->snap_base + e->snap_bytes * (size_t)snap);
    return e->xr ? k3c_ranks_log(e->xr, K3C_RANK_OP_SNAP_SAVE, id, snap, NULL, 0) : K3C_OK;
}

int k3c_engine_snapshot_restore(k3c_engine *e, int id, int snap) {
    K3C_TRY(check_snap(e, id, snap));
    k3c_kda_slots_restore(&e->ks, e->be, id, (char *)e->snap_base + e->snap_bytes * (size_t)snap);
    return e->xr ? k3c_ranks_log(e->xr, K3C_RANK_OP_SNAP_RESTORE, id, snap, NULL, 0) : K3C_OK;
}

int k3c_request_close(k3c_engine *e, int id) {
    K3C_TRY(check_id(e, id));
    K3C_TRY(leads(e, "engine request_close"));
    engine_request *r = &e->req[id];
    int rc = K3C_OK;
    for (int b = r->nblocks - 1; b >= 0; b--)
        if (give_block(e, r->blocks[b]) != K3C_OK) rc = K3C_ERR;
    r->open = 0;
    r->nblocks = r->length = r->pending = 0;
    if (e->xr && rc == K3C_OK) rc = k3c_ranks_log(e->xr, K3C_RANK_OP_CLOSE, id, 0, NULL, 0);
    if (e->be->sync(e->be) != K3C_OK) rc = K3C_ERR;
    return rc;
}

int k3c_request_length(const k3c_engine *e, int id) {
    if (check_id(e, id) != K3C_OK) return -1;
    return e->req[id].length;
}

void k3c_engine_view_get(k3c_engine *e, k3c_engine_view *v) {
    *v = (k3c_engine_view){.m = e->m, .be = e->be, .kv = &e->kv, .ks = &e->ks, .fwd = e->fwd,
                           .max_requests = e->o.max_requests, .max_rows = e->o.max_rows,
                           .max_context = e->o.max_context,
                           .block_size = e->o.block_size * (e->kv.dcp > 1 ? e->kv.dcp : 1), .q_max = e->o.q_max,
                           .max_blocks_per_request = e->max_blocks_per_request, .aux_layers = e->aux_layers,
                           .num_aux = e->o.num_aux, .aux = e->aux, .xc = e->xc};
}

static int step_begin(k3c_engine *e, const k3c_step_item *items, int n, const k3c_fwd_req **reqs) {
    *reqs = e->fr;
    e->aux_rows = -1; /* valid again only once this step has run (step_end) */
    if (n > e->o.max_requests) return k3c_errorf("engine step: %d items, at most %d", n, e->o.max_requests);
    for (int i = 0; i < n; i++) {
        const k3c_step_item *it = &items[i];
        K3C_TRY(check_id(e, it->request));
        engine_request *r = &e->req[it->request];
        if (r->pending)
            return k3c_errorf("engine step: request %d has an uncommitted verify of %d tokens", it->request,
                              r->pending);
        for (int j = 0; j < i; j++)
            if (items[j].request == it->request)
                return k3c_errorf("engine step: request %d appears twice", it->request);
        if (it->n <= 0 || !it->tokens) return k3c_errorf("engine step: item %d has no tokens", i);
        if (it->n > e->o.max_context - r->length)
            return k3c_errorf("engine step: request %d would hold %lld tokens, max_context is %d", it->request,
                              (long long)r->length + it->n, e->o.max_context);
        /* blocks covering every row written this step */
        int need = k3c_kv_cache_blocks_for(&e->kv, (long long)r->length + it->n);
        while (r->nblocks < need) {
            int b = k3c_kv_cache_take(&e->kv);
            if (b < 0) return k3c_errorf("engine step: the MLA cache is out of blocks (%d)", e->kv.num_blocks);
            r->blocks[r->nblocks++] = b;
        }
        e->nb[i] = r->nblocks;
        e->fr[i] = (k3c_fwd_req){.ids = it->tokens, .n = it->n, .pos = r->length, .block_table = r->blocks,
                                 .slot = it->request, .verify = it->verify,
                                 .logits = (it->verify || it->all_logits) ? K3C_LOGITS_ALL : K3C_LOGITS_LAST};
    }
    return K3C_OK;
}

int k3c_step_logits_rows(const k3c_step_item *items, int n) {
    if (!items) return n > 0 ? k3c_errorf("step logits rows: %d items but the list is NULL", n) : 0;
    int rows = 0;
    for (int i = 0; i < n; i++) rows += items[i].verify || items[i].all_logits ? items[i].n : 1; /* step_begin's */
    return rows;
}

static void step_end(k3c_engine *e, const k3c_step_item *items, int n) {
    for (int i = 0; i < n; i++) {
        engine_request *r = &e->req[items[i].request];
        if (items[i].verify) r->pending = items[i].n;
        else r->length += items[i].n;
    }
    e->aux_rows = k3c_step_logits_rows(items, n);
}

/* Adds p to the engine's fallback list (grown by doubling). */
static int fallback_record(k3c_engine *e, float *p) {
    if (e->n_fallback == e->cap_fallback) {
        int cap = e->cap_fallback ? 2 * e->cap_fallback : 4;
        float **f = realloc(e->fallback, sizeof *f * (size_t)cap);
        if (!f) return K3C_ERR;
        e->fallback = f;
        e->cap_fallback = cap;
    }
    e->fallback[e->n_fallback++] = p;
    return K3C_OK;
}

float *k3c_engine_logits_alloc(k3c_engine *e, int rows) {
    if (!e) {
        null_engine("engine logits_alloc");
        return NULL;
    }
    if (rows < 1) {
        k3c_errorf("engine logits_alloc: %d rows (want >= 1)", rows);
        return NULL;
    }
    size_t row_bytes = (size_t)e->m->config.vocab_size * sizeof(float);
    if ((size_t)rows > SIZE_MAX / row_bytes) {
        k3c_errorf_kind(K3C_ERROR_OOM, "engine logits_alloc: %d rows x vocab %d floats do not fit in memory", rows,
                   e->m->config.vocab_size);
        return NULL;
    }
    size_t bytes = (size_t)rows * row_bytes;
    if (!e->be->host_alloc) {
        float *p = malloc(bytes);
        if (!p)
            k3c_errorf_kind(K3C_ERROR_OOM, "engine logits_alloc: out of host memory (%d rows x vocab %d)", rows, e->m->config.vocab_size);
        return p;
    }
    float *p = e->be->host_alloc(e->be, bytes);
    if (p) return p;
    /* Page-locked memory refused (the driver or the host will not pin that much): fall back to malloc.
     * Page-locked is only a speed-up: the download into malloc'ed memory goes through the driver's staging
     * (5-9 GB/s instead of ~55 on the H200 host, docs/BENCHMARKS.md), so the engine keeps working, slower,
     * and says so once per buffer. The buffer is recorded so logits_free hands it to free(). */
    char why[512];
    snprintf(why, sizeof why, "%s", k3c_error_message());
    p = malloc(bytes);
    if (!p || fallback_record(e, p) != K3C_OK) {
        free(p);
        k3c_errorf_kind(K3C_ERROR_OOM, "engine logits_alloc: out of host memory (%d rows x vocab %d) after page-locked memory was "
                   "refused: %s", rows, e->m->config.vocab_size, why);
        return NULL;
    }
    k3c_log(K3C_LOG_WARN, "logits (%d rows x vocab %d) fall back to malloc'ed memory (a slower download): %s", rows,
            e->m->config.vocab_size, why);
    return p;
}

void k3c_engine_logits_free(k3c_engine *e, float *logits) {
    if (!e || !logits) return; /* without its engine a buffer cannot be told page-locked or not: kept */
    for (int i = 0; i < e->n_fallback; i++)
        if (e->fallback[i] == logits) { /* no wait as in host_free: a download into pageable memory is
                                          * synchronous to the host (CUDA), so none is in flight */
            e->fallback[i] = e->fallback[--e->n_fallback];
            free(logits);
            return;
        }
    if (e->be->host_free) e->be->host_free(e->be, logits);
    else free(logits);
}

/* The plan of the step whose shape is in e->ql / e->hp. A prepared shape without its graph runs stock the
 * first time it is planned (that warms the kernels and their host-side caches up) and is captured the
 * second; a capture that fails leaves the shape on the stock path for good. */
static k3c_plan step_plan(k3c_engine *e, int n) {
    /* a DEP executor plans each DP rank's own part (k3c_engine_dp_part), not the whole step */
    int with_x = e->x && e->spec_on && !e->x->plan_table.wide_decode;
    const k3c_plan_table *t = with_x ? &e->x->plan_table : k3c_plan_nominal_table();
    k3c_step_shape sh = {.num_requests = n, .query_lens = e->ql, .has_prompt = e->hp};
    k3c_plan p = k3c_plan_step(t, &sh);
    if (with_x && p.route == K3C_ROUTE_STOCK && p.reason == K3C_STOCK_NOT_CAPTURED && e->x->capture &&
        p.rows >= 1 && p.rows <= K3C_PREPARED_MAX && p.q >= 1 && p.q <= K3C_PREPARED_Q_MAX) {
        unsigned char *seen = &e->seen[p.rows][p.q];
        if (*seen == 0) {
            *seen = 1;
        } else if (*seen == 1) {
            /* a rank group captures together (k3c_ranks_capture), before any rank's step of the shape */
            if ((e->xr ? k3c_ranks_capture(e->xr, p.rows, p.q) : e->x->capture(e->x->ctx, p.rows, p.q)) == K3C_OK) {
                p = k3c_plan_step(t, &sh);
            } else {
                *seen = 2;
                k3c_log(K3C_LOG_DEBUG, "capturing the step shape (%d rows, q %d) failed, it runs stock: %s", p.rows,
                        p.q, k3c_error_message());
                k3c_error_clear();
            }
        }
    }
    /* a rank group's capture that failed on some rank: rank 0 may hold the graph, its peers not */
    if (with_x && e->xr && (p.route == K3C_ROUTE_DECODE || p.route == K3C_ROUTE_VERIFY) && p.rows >= 1 &&
        p.rows <= K3C_PREPARED_MAX && p.q >= 1 && p.q <= K3C_PREPARED_Q_MAX && e->seen[p.rows][p.q] == 2)
        p = (k3c_plan){.route = K3C_ROUTE_STOCK, .reason = K3C_STOCK_NOT_CAPTURED, .rows = p.rows, .q = p.q};
    return p;
}

/* Without the caller's flags, a request's rows are prompt rows unless it verifies, or decodes one token after its
 * first step. */
static uint8_t infer_prompt(const k3c_fwd_req *r) { return !r->verify && (r->n > 1 || r->pos == 0); }

/* Whether the requests are the executor's shape for a plan of q tokens each: all verifies when q > 1, none when
 * q = 1. */
static int verify_matches_q(const k3c_fwd_req *reqs, int n, int q) {
    for (int i = 0; i < n; i++)
        if ((reqs[i].verify != 0) != (q > 1)) return 0;
    return 1;
}

int k3c_engine_run_step(k3c_engine *e, const k3c_step_item *items, int n, const uint8_t *has_prompt,
                        float *logits, int32_t *ids, int *wrote_ids) {
    if (wrote_ids) *wrote_ids = 0;
    if (!e || (n > 0 && !items)) return k3c_errorf("engine step: NULL %s", e ? "items" : "engine");
    if (n <= 0) return K3C_OK;
    if (!items || !logits)
        return k3c_errorf("engine step: %d items, but %s is NULL", n, items ? "logits" : "the item list");
    K3C_TRY(leads(e, "engine step"));
    const k3c_fwd_req *fr;
    K3C_TRY(step_begin(e, items, n, &fr));
    for (int i = 0; i < n; i++) {
        e->ql[i] = items[i].n;
        e->hp[i] = has_prompt ? has_prompt[i] != 0 : infer_prompt(&fr[i]);
    }
    k3c_plan p = step_plan(e, n);
    e->last_plan = p;
    e->last_exec = 0;
    e->st.steps++;
    e->st.route_steps[p.route]++;
    if (p.route == K3C_ROUTE_STOCK) e->st.stock_reason_steps[p.reason]++;
    /* a step planned q > 1 whose items are not all verifies (or q = 1 with a verify) is not the executor's
     * shape; wide steps go to the executor on a single rank only (a TP rank's executor plans none: its
     * wide_max is 0, decode/executor_cuda.h) */
    int wide = p.route == K3C_ROUTE_WIDE;
    int exec = e->x && e->spec_on && !e->x->plan_table.wide_decode &&
               (p.route == K3C_ROUTE_DECODE || p.route == K3C_ROUTE_VERIFY || (wide && !e->xr)) &&
               verify_matches_q(fr, n, p.q);
    if (exec && e->xr) { /* every rank's executor: rank 0 sends the step with its plan (logits on every rank, so
                          * the ranks' check can compare them; greedy ids taken from them here) */
        K3C_TRY(k3c_ranks_step(e->xr, &p, fr, e->nb, n, logits, e->aux));
        e->last_exec = 1;
        e->st.executor_steps++;
    } else if (exec) { /* a wide step returns logits (the stock LM head): the greedy ids are taken from them */
        K3C_TRY(e->x->step(e->x->ctx, &p, fr, n, ids && !wide ? NULL : logits, wide ? NULL : ids, e->aux));
        e->last_exec = 1;
        e->st.executor_steps++;
        if (ids && !wide) {
            e->st.greedy_id_steps++;
            if (wrote_ids) *wrote_ids = 1;
        }
    } else if (e->xr) { /* every rank runs it: rank 0 sends it, then runs its own part */
        K3C_TRY(k3c_ranks_step(e->xr, NULL, fr, e->nb, n, logits, e->aux));
    } else {
        K3C_TRY(k3c_forward_step(e->fwd, &e->kv, &e->ks, fr, n, logits, e->aux));
    }
    step_end(e, items, n);
    return K3C_OK;
}

int k3c_engine_step(k3c_engine *e, const k3c_step_item *items, int n, float *logits) {
    return k3c_engine_run_step(e, items, n, NULL, logits, NULL, NULL);
}

int k3c_engine_step_greedy(k3c_engine *e, const k3c_step_item *items, int n, int32_t *ids, float *logits) {
    if (!ids || !logits) return k3c_errorf("engine step_greedy: NULL %s buffer", ids ? "logits" : "ids");
    int got = 0;
    K3C_TRY(k3c_engine_run_step(e, items, n, NULL, logits, ids, &got));
    if (!got) {
        int rows = k3c_step_logits_rows(items, n), V = e->m->config.vocab_size;
        for (int r = 0; r < rows; r++) ids[r] = k3c_greedy_token(logits + (size_t)r * V, V);
    }
    return K3C_OK;
}

int k3c_engine_dp_part(k3c_engine *e, const k3c_fwd_req *own, int n, float *logits, float *aux) {
    const k3c_decode_executor *x = e->x && e->spec_on && e->x->plan_table.wide_decode ? e->x : NULL;
    if (!x || n <= 0) return k3c_forward_step(e->fwd, &e->kv, &e->ks, own, n, logits, aux); /* n = 0: the dummy step */
    int ql[n];
    uint8_t hp[n];
    for (int i = 0; i < n; i++) {
        ql[i] = own[i].n;
        hp[i] = infer_prompt(&own[i]);
    }
    k3c_step_shape sh = {.num_requests = n, .query_lens = ql, .has_prompt = hp};
    k3c_plan p = k3c_plan_step(&x->plan_table, &sh);
    if (p.route != K3C_ROUTE_WIDE || !verify_matches_q(own, n, p.q)) return k3c_forward_step(e->fwd, &e->kv, &e->ks, own, n, logits, aux);
    K3C_TRY(x->step(x->ctx, &p, own, n, logits, NULL, aux));
    e->st.executor_steps++; /* this rank's own parts (each rank counts its own) */
    return K3C_OK;
}

k3c_plan k3c_engine_last_plan(const k3c_engine *e) { return e->last_plan; }
int k3c_engine_last_step_executor(const k3c_engine *e) { return e->last_exec; }

void k3c_engine_set_executor(k3c_engine *e, const k3c_decode_executor *x) {
    e->x = x;
    e->spec_on = x != NULL;
    memset(e->seen, 0, sizeof e->seen);
}

void k3c_engine_stats_get(const k3c_engine *e, k3c_engine_stats *out) {
    if (!out) return;
    if (!e) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = e->st;
    out->specialized = e->x && e->spec_on;
    out->graphs_captured = e->x && e->x->num_captured ? e->x->num_captured(e->x->ctx) : 0;
}

int k3c_engine_set_specialized(k3c_engine *e, int on) {
    if (!e) return k3c_errorf("engine set_specialized: NULL engine");
    if (on && !e->x)
        return k3c_errorf("engine set_specialized: this engine has no specialized executor (device %s, option "
                          "specialized %d)", e->o.device, e->o.specialized);
    e->spec_on = on != 0;
    return K3C_OK;
}

int k3c_engine_warmup(k3c_engine *e) {
    if (!e) return k3c_errorf("engine warmup: NULL engine");
    if (!e->x || !e->x->capture) return K3C_OK;
    if (e->x->plan_table.world_size > 1 && !e->x->plan_table.tp_prepared) return K3C_OK; /* every step stock */
    int shapes[K3C_PREPARED_NUM_BATCHES * K3C_PREPARED_Q_MAX][2];
    int n = k3c_prepared_shapes(e->o.q_max, e->o.max_requests, shapes,
                                K3C_PREPARED_NUM_BATCHES * K3C_PREPARED_Q_MAX);
    if (e->xr) K3C_TRY(leads(e, "engine warmup"));
    for (int i = 0; i < n; i++)
        if ((e->xr ? k3c_ranks_capture(e->xr, shapes[i][0], shapes[i][1])
                   : e->x->capture(e->x->ctx, shapes[i][0], shapes[i][1])) != K3C_OK) {
            if (e->xr) e->seen[shapes[i][0]][shapes[i][1]] = 2; /* stock on every rank from here */
            return k3c_error_context("engine warmup: shape (%d rows, q %d)", shapes[i][0], shapes[i][1]);
        }
    return K3C_OK;
}

const char *k3c_route_name(int route) {
    switch (route) {
    case K3C_ROUTE_STOCK: return "stock";
    case K3C_ROUTE_DECODE: return "decode";
    case K3C_ROUTE_VERIFY: return "verify";
    case K3C_ROUTE_WIDE: return "wide";
    }
    return "?";
}

const char *k3c_stock_reason_text(int reason) {
    if (reason < 0 || reason >= K3C_STOCK_REASONS) return "?";
    return k3c_stock_reason_name((k3c_stock_reason)reason);
}

int k3c_request_commit(k3c_engine *e, int id, int accepted) {
    K3C_TRY(check_id(e, id));
    engine_request *r = &e->req[id];
    if (!r->pending) return k3c_errorf("engine commit: request %d has no verify to commit", id);
    if (accepted < 0 || accepted > r->pending)
        return k3c_errorf("engine commit: request %d: accepted %d outside 0..%d", id, accepted, r->pending);
    K3C_TRY(leads(e, "engine commit"));
    /* a request on another DP rank is committed there (its verify ran there) */
    if (!e->xr || k3c_ranks_slot_dp(e->xr, id) == 0) K3C_TRY(k3c_forward_commit(e->fwd, &e->ks, id, accepted));
    r->length += accepted;
    r->pending = 0;
    return e->xr ? k3c_ranks_log(e->xr, K3C_RANK_OP_COMMIT, id, accepted, NULL, 0) : K3C_OK;
}

int k3c_engine_aux(const k3c_engine *e, int j, float *out, int *rows) {
    if (!e) return null_engine("engine aux");
    if (e->o.num_aux == 0) return k3c_errorf("engine aux: the engine has no aux layers (k3c_engine_options.aux_layers)");
    if (j < 0 || j >= e->o.num_aux) return k3c_errorf("engine aux: stream %d outside 0..%d", j, e->o.num_aux - 1);
    if (e->aux_rows < 0)
        return k3c_errorf("engine aux: no step has run since the engine was created or the last step failed");
    size_t n = (size_t)e->aux_rows * e->m->config.hidden_size;
    if (n) {
        if (!out) return k3c_errorf("engine aux: no output buffer for %d rows", e->aux_rows);
        memcpy(out, e->aux + (size_t)j * n, n * sizeof(float));
    }
    if (rows) *rows = e->aux_rows;
    return K3C_OK;
}

/* ---- ranks (runtime/engine_ranks.h) ---- */

int k3c_engine_rank(const k3c_engine *e) {
    if (!e) return null_engine("engine rank");
    return e->xr ? k3c_ranks_rank(e->xr) : 0;
}

int k3c_engine_world_size(const k3c_engine *e) {
    if (!e) return null_engine("engine world_size");
    return e->xr ? k3c_ranks_world(e->xr) : 1;
}

int k3c_engine_follow(k3c_engine *e) {
    if (!e) return null_engine("engine follow");
    if (!e->xr || k3c_ranks_rank(e->xr) == 0)
        return k3c_errorf("engine follow: this engine is rank 0 of %d: it leads (its steps are the calls made on "
                          "it); only the other ranks follow", k3c_engine_world_size(e));
    return k3c_ranks_follow(e->xr);
}

int k3c_engine_dp_size(const k3c_engine *e) { return e && e->xr ? k3c_ranks_dp(e->xr) : 1; }
int k3c_engine_request_dp(const k3c_engine *e, int id) { return e && e->xr ? k3c_ranks_slot_dp(e->xr, id) : 0; }
long k3c_engine_dp_placed(const k3c_engine *e, int dp) { return e && e->xr ? k3c_ranks_placed(e->xr, dp) : 0; }

int k3c_engine_failed(const k3c_engine *e) { return e && e->xr && k3c_ranks_failed(e->xr) != NULL; }

k3c_engine_ranks *k3c_engine_xr(const k3c_engine *e) { return e->xr; }

int k3c_engine_exec_capture(k3c_engine *e, int rows, int q) {
    if (!e->x || !e->x->capture)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "engine: rank %d has no specialized executor to capture (%d rows, "
                               "q %d) on", k3c_engine_rank(e), rows, q);
    return e->x->capture(e->x->ctx, rows, q);
}

int k3c_engine_exec_step(k3c_engine *e, const k3c_plan *p, const k3c_fwd_req *reqs, int n, float *logits,
                         float *aux) {
    if (!e->x || !e->spec_on)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "engine: rank %d: an executor step (%d rows, q %d), but the rank "
                               "has no specialized executor on", k3c_engine_rank(e), p->rows, p->q);
    if (k3c_ranks_rank(e->xr) != 0) e->st.executor_steps++; /* rank 0 counts its own in k3c_engine_run_step */
    return e->x->step(e->x->ctx, p, reqs, n, logits, NULL, aux);
}

void k3c_engine_check_ranks(k3c_engine *e, int on) {
    if (e->xr) k3c_ranks_set_check(e->xr, on);
}

long k3c_engine_ranks_checked(const k3c_engine *e) { return e->xr ? k3c_ranks_checked(e->xr) : 0; }
