/* What a specialized decode executor offers the engine (the routing of plan.h, the shapes of prepared.h).
 *
 * The engine owns the executor (k3c_engine_options.specialized) and calls it, never the reverse. For every
 * step the engine takes the plan (k3c_plan_step with the executor's plan_table), validates the step and
 * takes its cache blocks, and then, on an executor route (decode, uniform verify, wide), calls step with
 * the prepared forward requests, exactly what it would hand k3c_forward_step; everything else it runs
 * through the stock forward itself. step has
 * k3c_forward_step's contract: the same rows out (every row of a verify request, the last row of a decode
 * request, request by request), the same effects on the caches and KDA slots (a verify leaves the
 * committed state as it was and saves the fold inputs for k3c_forward_commit), bitwise the same values.
 *
 * Which shapes exist: plan_table.captured(ctx, rows, q) answers, and only answers; capture(ctx, rows, q)
 * builds one. When to capture is the engine's policy (the second time a shape is planned, or all at once
 * in k3c_engine_warmup). */
#ifndef K3C_DECODE_EXECUTOR_H
#define K3C_DECODE_EXECUTOR_H

#include <stdint.h>

#include "decode/plan.h"
#include "model/model.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "backend/backend.h"
#include "stock/forward.h"

/* What the engine gives an executor at build: read access to the model, the backend and the caches the
 * steps will run on, and the engine's limits. The pointers stay valid for the executor's life. */
typedef struct k3c_decode_env {
    const struct k3c_model *m;
    k3c_backend *be;
    k3c_kv_cache *kv;
    k3c_kda_slots *ks;
    int max_requests, max_rows, max_context, block_size, q_max;
    int max_blocks_per_request; /* block table length that covers max_context */
    /* aux streams (k3c_engine_options.aux_layers, validated): a step writes stream j of its N logits rows
     * to aux + j * N * hidden (the aux argument of step) */
    const int *aux_layers;
    int num_aux;
    /* Tensor parallelism (world size > 1): the rank's TP communicator, the one its stock forward uses
     * (k3c_forward_options.tp). Only a graph-capturable one (the CUDA mailbox, comm/mailbox_cuda.h) prepares
     * the executor's providers for TP; NULL or another (staged, NCCL) leaves them unprepared: every step
     * stock (decode/executor_cuda.h). */
    struct k3c_comm *tp;
    /* The wide route (decode/executor_cuda.h): the engine's stock forward (created over the same model,
     * backend and layout), which a wide step runs with the executor's attention in place of its own
     * (stock/forward.h k3c_forward_step_attn). NULL: no wide route (wide steps then plan stock). */
    struct k3c_forward *fwd;
    /* DEP (data-parallel attention, expert-parallel MoE): the rank's EP group, the one its stock forward
     * exchanges the MoE rows over (k3c_forward_options.ep); in DEP the EP group is the stage's DP group, so
     * ep->rank is the DP rank and ep->size the DP size, and the model is that rank's expert shard. NULL or one
     * rank: none. A DEP rank's executor has no fully specialized step: every decode or uniform verify step up
     * to its wide cap is wide (fwd required), the rest stock. */
    struct k3c_comm *ep;
} k3c_decode_env;

typedef struct k3c_decode_executor {
    k3c_plan_table plan_table; /* the prepared set; changes as prepare_kv and capture proceed */
    void *ctx;
    /* Runs one step planned K3C_ROUTE_DECODE or K3C_ROUTE_VERIFY (plan->rows rows, plan->q per request,
     * every request a verify exactly when q > 1) over reqs[0 .. n-1]. logits: [rows, vocab] host; or, with
     * ids non-NULL, ids[row] = the arg-max of each logits row in runtime/sampler.c's greedy order, taken
     * on the device (logits is then not written). aux: the engine's aux buffer (NULL without aux layers).
     * K3C_ROUTE_WIDE: the same, but logits only (ids NULL: the stock LM head), the rows k3c_forward_step
     * returns for these requests; on a DEP rank n = 0 is its dummy step. 0 or -1 (k3c_errorf). */
    int (*step)(void *ctx, const k3c_plan *plan, const k3c_fwd_req *reqs, int n, float *logits, int32_t *ids,
                float *aux);
    /* Builds the shape (rows, q) now (captures its graph); 0 when it exists already. NULL where shapes
     * need no building (plan_table.needs_graphs = 0). */
    int (*capture)(void *ctx, int rows, int q);
    /* Shapes built so far (NULL: none are built). */
    int (*num_captured)(void *ctx);
} k3c_decode_executor;

#endif
