/* The runner's internal interface (the public one is include/k3c.h's runner section): what tests inspect.
 * The runner plans nothing itself: the engine plans and routes every step (runtime/engine_internal.h). */
#ifndef K3C_RUNTIME_RUNNER_H
#define K3C_RUNTIME_RUNNER_H

#include "decode/plan.h"
#include "k3c.h"

/* The plan table an engine without an executor plans against (decode/plan.h k3c_plan_nominal_table). */
const k3c_plan_table *k3c_runner_nominal_table(void);

/* The plan of the most recent step (route STOCK, reason EMPTY before the first). */
k3c_plan k3c_runner_last_plan(const k3c_runner *r);

#endif
