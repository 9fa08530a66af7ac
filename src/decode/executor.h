/* What a specialized decode executor offers the runner (the routing of plan.h, the shapes of prepared.h).
 *
 * The runner describes every step once, asks k3c_plan_step (decode/plan.h) with the executor's plan table,
 * and on a specialized route (decode, uniform verify, wide verify) calls run; everything else runs the stock
 * forward through k3c_engine_step. A NULL executor means there is no specialized path (the CPU build): every
 * step runs stock, and the runner still takes and counts the plan decision against a nominal table.
 *
 * run has k3c_engine_step's contract exactly: the same items, the same logits rows (item by item: every row
 * of a verify item, the last row of a decode item), and the same effects on the engine's requests (lengths,
 * an uncommitted verify that k3c_request_commit then folds), so the runner cannot tell the two apart except
 * by speed. That is why the executor is built over the engine it serves (its caches and KDA slots). */
#ifndef K3C_DECODE_EXECUTOR_H
#define K3C_DECODE_EXECUTOR_H

#include "decode/plan.h"
#include "k3c.h"

typedef struct k3c_decode_executor {
    k3c_plan_table plan_table; /* the prepared set; may change as prepare_kv and graph capture proceed */
    void *ctx;
    /* Runs one step that k3c_plan_step routed to plan->route != K3C_ROUTE_STOCK. 0 or -1 (k3c_errorf). */
    int (*run)(void *ctx, const k3c_plan *plan, const k3c_step_item *items, int n, float *logits);
    /* The same step with greedy token ids instead of logits: ids[row] = the arg-max of that logits row in
     * runtime/sampler.c's greedy order (computed on the device, 4 bytes a row downloaded). NULL when the
     * executor has none; the runner calls it only when every request of the step samples greedily. */
    int (*run_argmax)(void *ctx, const k3c_plan *plan, const k3c_step_item *items, int n, int32_t *ids);
} k3c_decode_executor;

#endif
