/* The tensor inventory: every tensor a checkpoint of a given config holds, with its published name, dtype
 * and shape, and the slot of k3c_weights it binds to. One list serves the loader (bind + check), synth
 * (write exactly this) and inspect (validate, count parameters and bytes). */
#ifndef K3C_MODEL_INVENTORY_H
#define K3C_MODEL_INVENTORY_H

#include <stddef.h>
#include <stdint.h>

#include "format/dtype.h"
#include "model/config.h"
#include "model/weights.h"

typedef enum k3c_tensor_class {
    K3C_TENSOR_MATRIX = 1, /* bf16 matrix, mapped in place; must be stored as BF16 */
    K3C_TENSOR_VECTOR,     /* small float tensor, converted to an owned f32 array (BF16/F16/F32 accepted) */
    K3C_TENSOR_MXFP4_PACKED,
    K3C_TENSOR_MXFP4_SCALE,
} k3c_tensor_class;

typedef struct k3c_tensor_spec {
    char name[160];     /* full published name, prefix included */
    k3c_dtype dtype;    /* dtype as published (what synth writes) */
    k3c_tensor_class cls;
    int ndim;
    int64_t shape[4];
    int layer;          /* -1 for model-level tensors */
    int expert;         /* -1 unless a routed expert's tensor */
    /* Where it binds: exactly one of these is non-NULL once k3c_inventory_bind_slots ran. */
    k3c_mat *mat;
    k3c_mxfp4_mat *mx;  /* for MXFP4_PACKED and MXFP4_SCALE (the same struct, two tensors) */
    float **vec;
    int vec_len;        /* elements the f32 vector keeps (A_log: first H of a padded [128]) */
} k3c_tensor_spec;

typedef struct k3c_inventory {
    k3c_tensor_spec *specs;
    size_t count;
} k3c_inventory;

/* Lists every tensor of the config, in a deterministic order (model-level first, then layer by layer,
 * experts in numeric order). When w is non-NULL the slots point into w, whose layer and expert arrays
 * this call allocates (k3c_weights_free releases them). */
int k3c_inventory_build(const k3c_config *c, k3c_weights *w, k3c_inventory *out);
void k3c_inventory_free(k3c_inventory *inv);
/* Bytes one spec occupies as published. */
uint64_t k3c_tensor_spec_bytes(const k3c_tensor_spec *s);
/* Logical parameter count of a spec (MXFP4 packed: 2 per byte; scales count 0). */
uint64_t k3c_tensor_spec_params(const k3c_tensor_spec *s);

/* Frees what k3c_inventory_build allocated in w and the f32 vectors the loader converted. */
void k3c_weights_free(k3c_weights *w);

#endif
