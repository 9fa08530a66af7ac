/* One tensor-parallel rank's model: the shard of a loaded model that rank `rank` of `tp` holds, as vLLM
 * shards Kimi Linear and K3 (../shared/spec/vllm-runtime-notes.md §5.1, parallel.md §2.6; the same split as
 * model/layout.c counts). Its config is the rank's: KDA and MLA heads, the dense MLP's, the shared experts' and
 * every routed expert's intermediate dimension, and the vocabulary are the local counts; what is replicated
 * (norms, AttnRes, KDA f_a / g_a / o_norm, MLA q_a / kv_a and their norms, the router and correction bias, the
 * latent projections) keeps the full model's. The stock forward run on a shard with a TP communicator
 * (stock/forward.h k3c_forward_options.tp) sums the partial outputs (o_proj, the MLPs' down, the routed
 * latent and the shared expert, the embedding) and gathers the vocabulary-parallel logits.
 *
 * Memory: a column-parallel shard (split output rows: q/k/v, gates, up projections, w1 / w3) is a view into
 * the full model's tensor; a row-parallel one (split input columns: o_proj, down projections, w2) is copied
 * into the shard once here (its rows are strided in the published layout). Vectors are views. So the full
 * model must outlive its shards. The shard's inventory (model/inventory.h) is that of its local config,
 * bound to the shard's views and copies, so a device backend uploads exactly the rank's tensors. */
#ifndef K3C_MODEL_SHARD_H
#define K3C_MODEL_SHARD_H

#include "model/model.h"

/* Fails, naming the dimension, when tp does not divide one of the split dimensions (for MXFP4 experts the
 * local intermediate width must stay a multiple of the 32-element scale group). A device-synthetic model's
 * shard is device-synthetic (model.h): its row-parallel parts are ranges of the model's reservation too, not
 * copies, and a device backend generates every tensor of the rank from the seed, so values are the rank's own,
 * not the whole model's slice (benchmarks). tp = 1 gives a shard equal to the model. */
int k3c_model_shard_tp(const struct k3c_model *full, int rank, int tp, struct k3c_model **out);

/* What one rank of a layout holds (0 in a count means 1):
 *   tp: the TP split above;
 *   pp: pipeline stage pp_stage, layers [s L / pp, (s + 1) L / pp) as k3c_layout_plan assigns them
 *       (model/layout.h k3c_layout_stage_layers); the others keep their kind and have no weights, the
 *       embedding is stage 0's (and the last stage's when tied, as its LM head), the final norm, output
 *       AttnRes and LM head the last stage's. The stage's caches hold only its layers (cache/
 *       k3c_kv_cache_init_layers, k3c_kda_slots_init_layers over model.h k3c_model_stage_layers);
 *   ep: the routed experts [r E / ep, (r + 1) E / ep) of expert-parallel rank ep_rank, whole (not TP-split);
 *       the other experts[] entries are empty. Everything else (attention, dense MLP, router, latent
 *       projections, shared experts) is the full model's: data-parallel attention keeps a whole copy.
 *   tp and ep (the hybrid: TP attention groups, EP MoE over every tp x dp rank of a stage; ep a multiple of
 *       tp): attention, the dense MLP, the embedding and the LM head are the TP split, the MoE layers whole
 *       (router, latent projections, shared experts) with EP rank ep_rank's routed experts, and
 *       moe_intermediate_size stays the full model's. Column-parallel parts are views: the full model outlives
 *       the shard. */
typedef struct k3c_model_part {
    int tp_rank, tp;
    int pp_stage, pp;
    int ep_rank, ep;
} k3c_model_part;
int k3c_model_shard(const struct k3c_model *full, const k3c_model_part *part, struct k3c_model **out);
void k3c_model_shard_free(struct k3c_model *shard);

#endif
