/* KDA per-request state, in slots: for every KDA layer and slot, the conv window [3][W-1][P] (the last W-1
 * pre-conv inputs of q, k and v, oldest first) and the fp32 recurrent state [H, dk, dv].
 *
 * Verify (speculative decoding) is read-only plus a commit fold (as vLLM's RecoverSSM):
 * a verify step copies the committed state and window of each verifying request into a per-step scratch
 * copy and runs on that copy, so the committed slot is untouched; it also saves, per layer, the inputs the
 * fold needs for each of its q tokens: the pre-conv q/k/v rows, the normalized k, the conv'd v, the decay g
 * and beta. commit(a) then runs the same conv and recurrent kernels over the first a saved tokens on the
 * committed slot, which is exactly what decoding those a tokens one at a time does to it (the same
 * kernels on the same values, so the result is bitwise equal).
 *
 * Everything is allocated once at engine creation: num_slots slots, verify windows of up to q_max tokens,
 * and scratch for max_segs verifying requests per step. */
#ifndef K3C_CACHE_KDA_SLOTS_H
#define K3C_CACHE_KDA_SLOTS_H

#include <stddef.h>

#include "model/config.h"
#include "backend/backend.h"

typedef struct k3c_kda_slots {
    int num_layers, num_slots, q_max, max_segs;
    int H, dk, P, W;
    size_t state_floats;   /* H * dk * dk */
    size_t window_floats;  /* 3 * (W-1) * P */
    size_t store_floats;   /* per slot per layer: q_max * (6P + H) */
    void *base;            /* one allocation for everything below */
    float **state;         /* [num_layers]: [num_slots, H, dk, dv], NULL for MLA layers */
    float **window;        /* [num_layers]: [num_slots, 3, W-1, P] */
    float **store;         /* [num_layers]: [num_slots, store_floats]: see k3c_kda_store_* */
    float *scratch_state;  /* [max_segs, H, dk, dv] verify copies (reused layer after layer) */
    float *scratch_window; /* [max_segs, 3, W-1, P] */
    float *conv_out;       /* [q_max, P] discarded conv output of a commit */
} k3c_kda_slots;

/* Bytes k3c_kda_slots_init allocates on the backend for these counts (the engine's memory plan). */
double k3c_kda_slots_bytes(const k3c_config *c, int num_slots, int q_max, int max_segs);
int k3c_kda_slots_init(k3c_kda_slots *ks, k3c_backend *be, const k3c_config *c, int num_slots, int q_max,
                       int max_segs);
/* The slots of the KDA layers among [first, end) only (a pipeline stage's, model.h k3c_model_stage_layers);
 * state[l], window[l] and store[l] are NULL outside them. */
int k3c_kda_slots_init_layers(k3c_kda_slots *ks, k3c_backend *be, const k3c_config *c, int first, int end,
                              int num_slots, int q_max, int max_segs);
double k3c_kda_slots_bytes_layers(const k3c_config *c, int first, int end, int num_slots, int q_max, int max_segs);
void k3c_kda_slots_release(k3c_kda_slots *ks, k3c_backend *be);
/* Zeroes a slot's state and window in every layer (a fresh sequence). */
void k3c_kda_slots_reset(k3c_kda_slots *ks, k3c_backend *be, int slot);

/* Snapshots of a slot (the prefix cache's KDA side, runtime/prefix_cache.h): per KDA layer in layer order the
 * fp32 state then the conv window, packed, in a backend buffer of snapshot_bytes. save and restore are
 * device-to-device copies on the backend's queue (be->copy: memcpy on the CPU, cudaMemcpyAsync on the CUDA
 * stream, so they order with the steps around them without a sync). 0 bytes for a model without KDA. */
size_t k3c_kda_slots_snapshot_bytes(const k3c_kda_slots *ks);
void k3c_kda_slots_save(k3c_kda_slots *ks, k3c_backend *be, int slot, void *dst);
void k3c_kda_slots_restore(k3c_kda_slots *ks, k3c_backend *be, int slot, const void *src);

/* Layout of one slot's verify store for one layer (floats from its start): pre-conv inputs x as
 * [3][q_max][P] (q, k, v), then k [q_max, P], v [q_max, P], g [q_max, P], beta [q_max, H]. */
static inline float *k3c_kda_store(const k3c_kda_slots *ks, int layer, int slot) {
    return ks->store[layer] + (size_t)slot * ks->store_floats;
}
static inline size_t k3c_kda_store_x(const k3c_kda_slots *ks, int which) { return (size_t)which * ks->q_max * ks->P; }
static inline size_t k3c_kda_store_k(const k3c_kda_slots *ks) { return (size_t)3 * ks->q_max * ks->P; }
static inline size_t k3c_kda_store_v(const k3c_kda_slots *ks) { return (size_t)4 * ks->q_max * ks->P; }
static inline size_t k3c_kda_store_g(const k3c_kda_slots *ks) { return (size_t)5 * ks->q_max * ks->P; }
static inline size_t k3c_kda_store_beta(const k3c_kda_slots *ks) { return (size_t)6 * ks->q_max * ks->P; }

#endif
