/* Parallel layouts from a config alone (include/k3c.h k3c_layout_plan says what is counted and how the
 * tensors split): the per-rank arithmetic over the tensor inventory (model/inventory.h), with no weights. */
#ifndef K3C_MODEL_LAYOUT_H
#define K3C_MODEL_LAYOUT_H

#include "k3c.h"
#include "model/config.h"

/* k3c_layout_plan over a config in hand. */
int k3c_layout_plan_config(const k3c_config *c, const k3c_layout *layout, k3c_layout_rank *ranks, int cap, int *n);

#endif
