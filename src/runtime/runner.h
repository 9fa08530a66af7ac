/* The runner's internal interface (the public one is include/k3c.h's runner section): attaching a
 * specialized decode executor, and what tests inspect. */
#ifndef K3C_RUNTIME_RUNNER_H
#define K3C_RUNTIME_RUNNER_H

#include "decode/executor.h"
#include "decode/plan.h"
#include "k3c.h"

/* Routes the runner's specialized steps to x (NULL: none, every step stock). x must outlive the runner or
 * be detached; the runner reads x->plan_table at every step, so the executor may update it (prepare_kv,
 * graph capture) between steps. */
void k3c_runner_set_executor(k3c_runner *r, const k3c_decode_executor *x);

/* The plan table used without an executor: every row count 1..64 prepared (the spec's PREPARED_MAX), wide
 * verify up to 256 rows, KV prepared, no graphs. The counts then classify each step by its shape alone. */
const k3c_plan_table *k3c_runner_nominal_table(void);

/* The plan of the most recent step (route STOCK, reason EMPTY before the first). */
k3c_plan k3c_runner_last_plan(const k3c_runner *r);

#endif
