/* The engine's internal interface (the public one is include/k3c.h): the runner's step entry with the
 * prompt flags it knows, the plan of the last step, attaching an executor other than the engine's own
 * (tests), and read access to the engine's parts for tests. Not part of include/k3c.h: front ends never
 * see it, and decode/ does not include it (the engine hands the executor what it needs at build,
 * decode/executor.h k3c_decode_env). */
#ifndef K3C_RUNTIME_ENGINE_INTERNAL_H
#define K3C_RUNTIME_ENGINE_INTERNAL_H

#include <stdint.h>

#include "decode/executor.h"
#include "decode/executor_cuda.h"
#include "decode/plan.h"
#include "k3c.h"
#include "model/model.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "backend/backend.h"
#include "stock/forward.h"

typedef struct k3c_engine_view {
    const k3c_model *m;
    k3c_backend *be;
    k3c_kv_cache *kv;
    k3c_kda_slots *ks;
    k3c_forward *fwd;
    int max_requests, max_rows, max_context, block_size, q_max;
    /* block_size: the request tokens a cache block covers (kv->block_size x kv->dcp under DCP, kv_cache.h) */
    int max_blocks_per_request; /* block table length that covers max_context */
    /* aux streams (k3c_engine_options.aux_layers, validated): a path running a step writes stream j of its
     * N logits rows to aux + j * N * hidden (host, [num_aux, max_rows, hidden] floats) */
    const int *aux_layers;
    int num_aux;
    float *aux;
    k3c_decode_cuda *xc; /* the CUDA executor the engine built, or NULL */
} k3c_engine_view;

void k3c_engine_view_get(k3c_engine *e, k3c_engine_view *v);

/* k3c_engine_step / k3c_engine_step_greedy with the step's prompt flags given (has_prompt[i] for item i;
 * NULL: inferred as k3c.h says). logits: the step's logits rows (always given: a stock step writes them);
 * ids non-NULL: where the executor runs the step it writes only ids (greedy ids per logits row) and sets
 * *wrote_ids = 1; else the logits are written and *wrote_ids = 0. */
int k3c_engine_run_step(k3c_engine *e, const k3c_step_item *items, int n, const uint8_t *has_prompt,
                        float *logits, int32_t *ids, int *wrote_ids);
/* The plan of the most recent step (route STOCK, reason EMPTY before the first), and whether the executor
 * ran it. */
k3c_plan k3c_engine_last_plan(const k3c_engine *e);
int k3c_engine_last_step_executor(const k3c_engine *e);
/* A DP rank's own part of a step (runtime/engine_ranks.c; own: its requests, n = 0 its dummy step). With a
 * DEP executor (plan table wide_decode: decode/executor_cuda.h) the part is planned on the executor's table
 * and run there when it plans K3C_ROUTE_WIDE, else (and without one) by the stock forward. The DP ranks of a
 * step may so take different routes: both run the stock layer loop and make the same EP collectives in the same
 * order (decode/plan.h), and a dummy step is always the stock one. */
int k3c_engine_dp_part(k3c_engine *e, const k3c_fwd_req *own, int n, float *logits, float *aux);
/* Routes the engine's specialized steps to x instead of its own executor (NULL: none); x must outlive the
 * engine or be detached, and is not freed by it (the engine's own executor stays built, unused, until the
 * engine is freed). For tests of the routing with a fake executor on the CPU. */
void k3c_engine_set_executor(k3c_engine *e, const k3c_decode_executor *x);

/* ---- shared prefix blocks and KDA snapshots, for the serving scheduler's prefix cache ----
 * Opens a request whose block table starts with blocks[0 .. n): full blocks holding its first n x block_size
 * tokens, shared (each gets one more reference; k3c_request_close drops it). Its KDA slot is zeroed: restore
 * the snapshot of that prefix into it before its first step. n = 0 is k3c_request_open. */
int k3c_engine_request_open_prefix(k3c_engine *e, const int32_t *blocks, int n, int *id);
/* The request's block table and its length (valid until its next step or close); NULL if not open. */
const int32_t *k3c_engine_request_blocks(const k3c_engine *e, int id, int *n);
/* Blocks on the free list; references of one block; a reference more or less (at zero it is freed). */
int k3c_engine_blocks_free(const k3c_engine *e);
int k3c_engine_block_refs(const k3c_engine *e, int block);
void k3c_engine_block_ref(k3c_engine *e, int block);
void k3c_engine_block_unref(k3c_engine *e, int block);
/* Request slots not open. */
int k3c_engine_slots_free(const k3c_engine *e);
/* KDA snapshots (cache/kda_slots.h): the bytes of one (0 without KDA layers); count of them reserved on the
 * engine's device (replacing any earlier reservation; count 0 frees it); a request's slot saved into
 * snapshot snap, or snapshot snap restored into it (device-to-device, queued on the backend). */
size_t k3c_engine_snapshot_bytes(const k3c_engine *e);
int k3c_engine_snapshots_reserve(k3c_engine *e, int count);
int k3c_engine_snapshot_save(k3c_engine *e, int id, int snap);
int k3c_engine_snapshot_restore(k3c_engine *e, int id, int snap);

/* ---- ranks (runtime/engine_ranks.h) ----
 * k3c_engine_create's body for options it has normalized: the engine of one rank (x NULL: world size 1, the
 * whole model; else x's rank: its shard of m and its TP communicator). On failure x stays the caller's. */
struct k3c_engine_ranks;
int k3c_engine_build(k3c_model *m, const k3c_engine_options *o, int num_blocks_given, struct k3c_engine_ranks *x,
                     k3c_engine **out);
struct k3c_engine_ranks *k3c_engine_xr(const k3c_engine *e);
/* Data parallelism (k3c_engine_options.layout.dp): the DP ranks (1 without), and the one request id runs on.
 * open_dp: k3c_engine_request_open_prefix on DP rank dp (where its prefix blocks were computed; -1: the least
 * loaded, runtime/engine_ranks.h k3c_ranks_assign). */
int k3c_engine_dp_size(const k3c_engine *e);
int k3c_engine_request_dp(const k3c_engine *e, int id);
int k3c_engine_request_open_dp(k3c_engine *e, const int32_t *blocks, int n, int dp, int *id);
/* Diagnostic (tests): the requests placed on DP rank dp so far (0 without DP). */
long k3c_engine_dp_placed(const k3c_engine *e, int dp);
/* A rank's specialized executor as rank 0's messages drive it: capture one shape; run one step with rank 0's
 * plan (logits on the host; the stock forward's contract, decode/executor.h). */
int k3c_engine_exec_capture(k3c_engine *e, int rows, int q);
int k3c_engine_exec_step(k3c_engine *e, const k3c_plan *p, const k3c_fwd_req *reqs, int n, float *logits,
                         float *aux);
/* Diagnostic (tests): every following step, the ranks compare a hash of their logits (and aux streams), and a
 * difference fails it naming the rank; checked: the steps compared. No-ops at world size 1. */
void k3c_engine_check_ranks(k3c_engine *e, int on);
long k3c_engine_ranks_checked(const k3c_engine *e);

#endif
