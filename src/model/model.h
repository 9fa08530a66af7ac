/* A loaded model: its config, its checkpoint mapping and every weight bound (model/weights.h). */
#ifndef K3C_MODEL_MODEL_H
#define K3C_MODEL_MODEL_H

#include "format/checkpoint.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/weights.h"

struct k3c_model {
    k3c_config config;
    k3c_checkpoint checkpoint; /* the mapped shards the matrices point into */
    k3c_inventory inventory;
    k3c_weights weights;
    unsigned long long weight_bytes;   /* bytes of the bound tensors as stored */
    unsigned long long owned_bytes;    /* f32 copies of small vectors, bf16 copies of F32 / F16 matrices */
    void **owned;                      /* [n_owned] the bf16 copies (matrices stored as F32 / F16) */
    size_t n_owned, cap_owned;
    /* Device-synthetic (k3c_model_synthetic): every matrix and MXFP4 tensor points into one host address
     * range reserved with PROT_NONE, never backed and never to be read on the host (a read faults); a
     * device backend generates those weights in its own memory from synthetic_seed at init. The small
     * vectors are real host arrays. Host backends refuse such a model. */
    int device_synthetic;
    unsigned long long synthetic_seed;
    void *synthetic_base;              /* the reservation (munmap'ed by k3c_model_free) */
    size_t synthetic_bytes;
    /* A tensor-parallel rank's shard (model/shard.h): tp_size > 1, and the config's heads, intermediate widths
     * and vocabulary are the rank's; 0 / 0 for a whole model. */
    int tp_rank, tp_size;
    /* A pipeline stage (model/shard.h): pp_size > 1, and only layers [layer_first, layer_end) have weights
     * (the others keep their kind, with no tensors), the embedding only on stage 0, the final norm, output
     * AttnRes and LM head only on the last. 0 / 0 for a whole model (k3c_model_stage_layers gives all). */
    int pp_stage, pp_size, layer_first, layer_end;
    /* An expert-parallel rank (model/shard.h): ep_size > 1, and only the routed experts [expert_first,
     * expert_end) of every MoE layer have weights (the others are empty entries of experts[]). */
    int ep_rank, ep_size, expert_first, expert_end;
};

/* The layers a model holds: [0, L) for a whole model or a TP shard, the stage's for a pipeline stage. */
static inline void k3c_model_stage_layers(const struct k3c_model *m, int *first, int *end) {
    *first = m->pp_size > 1 ? m->layer_first : 0;
    *end = m->pp_size > 1 ? m->layer_end : m->config.num_layers;
}

/* Parses DIR/config.json, opens the checkpoint, checks every tensor of the inventory (present, dtype,
 * shape; A_log padding zero; every value finite: no NaN / Inf weight, no MXFP4 NaN scale) and binds it. Unknown tensors other than the vision /
 * projector ones are an error. */
int k3c_model_load(const char *dir, struct k3c_model **out);
void k3c_model_free(struct k3c_model *m);

/* A device-synthetic model of config c (see device_synthetic above): inventory and binding as a load would
 * give, vectors with the values synth would write for seed, no checkpoint anywhere. For benchmarks of
 * presets too large to write to disk. */
int k3c_model_synthetic(const k3c_config *c, uint64_t seed, struct k3c_model **out);

#endif
