/* Device-synthetic models (model/model.h k3c_model_synthetic): the inventory of a config bound as a load
 * would bind it, with no checkpoint behind it. Matrices and MXFP4 tensors get addresses inside one host
 * range reserved PROT_NONE and MAP_NORESERVE: never backed, so a benchmark preset of 100 GB costs no host
 * memory, and any host read of a weight faults at once instead of computing on garbage. The addresses are
 * still distinct per tensor, so a device backend can key its own copies by them. Small vectors are real
 * host arrays with the values synth would write (model/synth.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "model/model.h"
#include "model/synth.h"
#include "util/bf16.h"
#include "util/error.h"

/* Tensors start on 256-byte boundaries inside the reservation (the alignment a device arena uses too). */
static uint64_t align256(uint64_t n) { return (n + 255) & ~(uint64_t)255; }

static int is_device_tensor(const k3c_tensor_spec *s) { return s->cls != K3C_TENSOR_VECTOR; }

static int bind(struct k3c_model *m, uint64_t seed) {
    const k3c_inventory *inv = &m->inventory;
    uint64_t total = 0, weight_bytes = 0, owned = 0;
    for (size_t i = 0; i < inv->count; i++) {
        const k3c_tensor_spec *s = &inv->specs[i];
        weight_bytes += k3c_tensor_spec_bytes(s);
        if (is_device_tensor(s)) total += align256(k3c_tensor_spec_bytes(s));
    }
    if (total == 0) total = 256;
    void *base = mmap(NULL, (size_t)total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return k3c_errorf("device-synthetic model: cannot reserve %llu bytes of address space",
                          (unsigned long long)total);
    m->synthetic_base = base;
    m->synthetic_bytes = (size_t)total;
    uint8_t *p = base;
    for (size_t i = 0; i < inv->count; i++) {
        const k3c_tensor_spec *s = &inv->specs[i];
        uint64_t bytes = k3c_tensor_spec_bytes(s);
        switch (s->cls) {
        case K3C_TENSOR_MATRIX:
            if (s->mat) s->mat->w = (const uint16_t *)p;
            break;
        case K3C_TENSOR_MXFP4_PACKED:
            if (s->mx) s->mx->packed = p;
            break;
        case K3C_TENSOR_MXFP4_SCALE:
            if (s->mx) s->mx->scale = p;
            break;
        case K3C_TENSOR_VECTOR: {
            if (!s->vec) break;
            size_t stored = (size_t)(bytes / k3c_dtype_size(s->dtype));
            float *v = malloc(sizeof(float) * (stored > 0 ? stored : 1));
            if (!v) return k3c_errorf_kind(K3C_ERROR_OOM, "device-synthetic model: tensor %s: out of memory for %zu floats", s->name, stored);
            k3c_synth_vector_values(&m->config, s, seed, v, stored);
            /* as stored: synth writes non-F32 vectors as bf16, and a load converts them back */
            if (s->dtype != K3C_DTYPE_F32)
                for (size_t j = 0; j < stored; j++) v[j] = bf16_to_f32(f32_to_bf16(v[j]));
            free(*s->vec);
            *s->vec = v; /* the first vec_len entries are the model's (A_log padding ignored) */
            owned += sizeof(float) * (uint64_t)s->vec_len;
            break;
        }
        }
        if (is_device_tensor(s)) p += align256(bytes);
    }
    if (m->config.tie_word_embeddings) m->weights.lm_head = m->weights.embed;
    m->weight_bytes = weight_bytes;
    m->owned_bytes = owned;
    m->device_synthetic = 1;
    m->synthetic_seed = seed;
    return K3C_OK;
}

int k3c_model_synthetic(const k3c_config *c, uint64_t seed, struct k3c_model **out) {
    *out = NULL;
    if (k3c_config_validate(c) != K3C_OK) return k3c_error_context("device-synthetic model");
    struct k3c_model *m = calloc(1, sizeof *m);
    if (!m) return k3c_errorf_kind(K3C_ERROR_OOM, "device-synthetic model: out of memory");
    if (k3c_config_copy(&m->config, c) != K3C_OK || k3c_inventory_build(&m->config, &m->weights, &m->inventory) != K3C_OK ||
        bind(m, seed) != K3C_OK) {
        k3c_error_context("device-synthetic model");
        k3c_model_free(m);
        return K3C_ERR;
    }
    *out = m;
    return K3C_OK;
}
