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
    unsigned long long owned_bytes;    /* f32 copies of small vectors */
};

/* Parses DIR/config.json, opens the checkpoint, checks every tensor of the inventory (present, dtype,
 * shape; A_log padding zero; no MXFP4 NaN scale) and binds it. Unknown tensors other than the vision /
 * projector ones are an error. */
int k3c_model_load(const char *dir, struct k3c_model **out);
void k3c_model_free(struct k3c_model *m);

#endif
