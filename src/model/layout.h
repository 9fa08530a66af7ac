/* Parallel layouts from a config alone (include/k3c.h k3c_layout_plan says what is counted and how the
 * tensors split): the per-rank arithmetic over the tensor inventory (model/inventory.h), with no weights. */
#ifndef K3C_MODEL_LAYOUT_H
#define K3C_MODEL_LAYOUT_H

#include "k3c.h"
#include "model/config.h"

/* k3c_layout_plan over a config in hand. */
int k3c_layout_plan_config(const k3c_config *c, const k3c_layout *layout, k3c_layout_rank *ranks, int cap, int *n);

/* The placement the plan counts and the shards hold (model/shard.h): pipeline stage s of pp takes layers
 * [first, end) = [s L / pp, (s + 1) L / pp); expert-parallel rank r of ep holds the routed experts
 * [r E / ep, (r + 1) E / ep) whole (ep divides E). */
void k3c_layout_stage_layers(int L, int pp, int s, int *first, int *end);
void k3c_layout_rank_experts(int E, int ep, int r, int *first, int *end);

#endif
