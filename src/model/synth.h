/* Synthetic checkpoints: a config's full tensor inventory filled with deterministic, well-conditioned
 * random weights, written in exactly the published layout of its family:
 *  - K3: one shard per layer (model-00001 = layer 0, ...) plus one for the model-level tensors, named
 *    model-%05d-of-%06d.safetensors, and model.safetensors.index.json (metadata.total_size, weight_map);
 *  - Kimi Linear: a single model.safetensors, no index (what transformers writes for a small model).
 * Every tensor depends only on (seed, tensor name). */
#ifndef K3C_MODEL_SYNTH_H
#define K3C_MODEL_SYNTH_H

#include <stdint.h>

#include <stddef.h>

#include "model/config.h"
#include "model/inventory.h"

/* Name of the marker file synth leaves in DIR, so that a later synth may overwrite its own output but
 * never a directory it did not write. */
#define K3C_SYNTH_MARKER ".k3c-synth"

/* Writes config.json, the tokenizer (tiktoken.model + tokenizer_config.json: text/tokenizer.h's default
 * sized to the vocabulary) and, unless preset_name names a preset without weights (k3c_preset_has_weights
 * == 0), the weights. DIR is created if absent; a non-empty DIR without the marker is refused; a previous synth
 * output is replaced (its checkpoint files are removed first). Shards are written one at a time (tmp +
 * rename), the index last. preset_name may be NULL (an ad-hoc config: weights are written). */
int k3c_synth_write(const k3c_config *c, const char *preset_name, uint64_t seed, const char *dir);

/* How k3c_synth_write_opts runs; the files it writes do not depend on any of it. */
typedef struct k3c_synth_options {
    int threads; /* generator threads; 0 = one per online core */
    /* Called after each tensor with the tensor bytes generated so far and in all (from the calling thread). */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
} k3c_synth_options;
/* k3c_synth_write with options (o NULL: the defaults, as k3c_synth_write). */
int k3c_synth_write_opts(const k3c_config *c, const char *preset_name, uint64_t seed, const char *dir,
                         const k3c_synth_options *o);

/* What synth would write, for device-synthetic models (model/synthetic.c): the standard deviation of a bf16
 * matrix's entries, and the f32 values of a small vector tensor (all n stored entries, padding included),
 * drawn from the same (seed, tensor name) stream as the file writer. */
double k3c_synth_matrix_std(const k3c_tensor_spec *s);
void k3c_synth_vector_values(const k3c_config *c, const k3c_tensor_spec *s, uint64_t seed, float *v, size_t n);

#endif
