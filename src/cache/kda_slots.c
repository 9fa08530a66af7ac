#include "cache/kda_slots.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static int kda_layers(const k3c_config *c, int first, int end) {
    int n = 0;
    for (int l = first; l < end; l++) n += c->layer_attn[l] == K3C_ATTN_KDA;
    return n;
}

/* Floats of the one allocation of k3c_kda_slots_init (its carving below): per KDA layer num_slots states,
 * windows and verify stores, then max_segs scratch states and windows and the commit's conv output. */
static double slots_floats(const k3c_config *c, int first, int end, int num_slots, int q_max, int max_segs) {
    int n_kda = kda_layers(c, first, end);
    if (n_kda == 0) return 0;
    double P = k3c_config_kda_proj(c), state = (double)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim;
    double window = 3.0 * (c->kda_conv_kernel - 1) * P, store = (double)q_max * (6 * P + c->kda_num_heads);
    return (double)num_slots * (state + window + store) * n_kda + (double)max_segs * (state + window) + q_max * P;
}

double k3c_kda_slots_bytes(const k3c_config *c, int num_slots, int q_max, int max_segs) {
    return slots_floats(c, 0, c->num_layers, num_slots, q_max, max_segs) * sizeof(float);
}

double k3c_kda_slots_bytes_layers(const k3c_config *c, int first, int end, int num_slots, int q_max, int max_segs) {
    if (first < 0) first = 0;
    if (end > c->num_layers) end = c->num_layers;
    return slots_floats(c, first, end, num_slots, q_max, max_segs) * sizeof(float);
}

int k3c_kda_slots_init(k3c_kda_slots *ks, k3c_backend *be, const k3c_config *c, int num_slots, int q_max,
                       int max_segs) {
    return k3c_kda_slots_init_layers(ks, be, c, 0, c->num_layers, num_slots, q_max, max_segs);
}

/* On failure *ks is released and zeroed (k3c_kda_slots_release on it is a no-op). */
int k3c_kda_slots_init_layers(k3c_kda_slots *ks, k3c_backend *be, const k3c_config *c, int first, int end,
                              int num_slots, int q_max, int max_segs) {
    memset(ks, 0, sizeof *ks);
    const int L = c->num_layers; /* a local: the stores through ks below would make the compiler re-read it */
    if (L <= 0) return k3c_errorf("kda slots: num_layers %d must be positive", L);
    if (first < 0 || end > L || first >= end)
        return k3c_errorf("kda slots: layers [%d, %d) of a model of %d", first, end, L);
    if (num_slots <= 0 || q_max <= 0 || max_segs <= 0)
        return k3c_errorf("kda slots: num_slots %d, q_max %d, max_segs %d must be positive", num_slots, q_max,
                          max_segs);
    ks->num_layers = L;
    ks->num_slots = num_slots;
    ks->q_max = q_max;
    ks->max_segs = max_segs;
    ks->H = c->kda_num_heads;
    ks->dk = c->kda_head_dim;
    ks->P = k3c_config_kda_proj(c);
    ks->W = c->kda_conv_kernel;
    ks->state_floats = (size_t)ks->H * ks->dk * ks->dk;
    ks->window_floats = (size_t)3 * (ks->W - 1) * ks->P;
    ks->store_floats = (size_t)q_max * (6 * (size_t)ks->P + ks->H);
    int n_kda = kda_layers(c, first, end);
    ks->state = calloc((size_t)L, sizeof(float *));
    ks->window = calloc((size_t)L, sizeof(float *));
    ks->store = calloc((size_t)L, sizeof(float *));
    if (!ks->state || !ks->window || !ks->store) {
        k3c_kda_slots_release(ks, be);
        return k3c_errorf_kind(K3C_ERROR_OOM, "kda slots: out of host memory");
    }
    if (n_kda == 0) return K3C_OK;
    size_t total = (size_t)slots_floats(c, first, end, num_slots, q_max, max_segs);
    ks->base = be->alloc(be, total * sizeof(float));
    if (!ks->base) {
        k3c_kda_slots_release(ks, be);
        return k3c_error_context("kda slots (%d layers x %d slots, q_max %d)", n_kda, num_slots, q_max);
    }
    be->fill_bytes(be, ks->base, 0, total * sizeof(float));
    float *p = ks->base;
    for (int l = first; l < end; l++) {
        if (c->layer_attn[l] != K3C_ATTN_KDA) continue;
        ks->state[l] = p;
        p += (size_t)num_slots * ks->state_floats;
        ks->window[l] = p;
        p += (size_t)num_slots * ks->window_floats;
        ks->store[l] = p;
        p += (size_t)num_slots * ks->store_floats;
    }
    ks->scratch_state = p;
    p += (size_t)max_segs * ks->state_floats;
    ks->scratch_window = p;
    p += (size_t)max_segs * ks->window_floats;
    ks->conv_out = p;
    return K3C_OK;
}

void k3c_kda_slots_release(k3c_kda_slots *ks, k3c_backend *be) {
    if (ks->base && be) be->free(be, ks->base);
    free(ks->state);
    free(ks->window);
    free(ks->store);
    memset(ks, 0, sizeof *ks);
}

void k3c_kda_slots_reset(k3c_kda_slots *ks, k3c_backend *be, int slot) {
    for (int l = 0; l < ks->num_layers; l++) {
        if (!ks->state[l]) continue;
        be->fill_bytes(be, ks->state[l] + (size_t)slot * ks->state_floats, 0, ks->state_floats * sizeof(float));
        be->fill_bytes(be, ks->window[l] + (size_t)slot * ks->window_floats, 0, ks->window_floats * sizeof(float));
    }
}

size_t k3c_kda_slots_snapshot_bytes(const k3c_kda_slots *ks) {
    size_t n = 0;
    for (int l = 0; l < ks->num_layers; l++)
        if (ks->state[l]) n += (ks->state_floats + ks->window_floats) * sizeof(float);
    return n;
}

void k3c_kda_slots_save(k3c_kda_slots *ks, k3c_backend *be, int slot, void *dst) {
    float *p = dst;
    for (int l = 0; l < ks->num_layers; l++) {
        if (!ks->state[l]) continue;
        be->copy(be, p, ks->state[l] + (size_t)slot * ks->state_floats, ks->state_floats * sizeof(float));
        p += ks->state_floats;
        be->copy(be, p, ks->window[l] + (size_t)slot * ks->window_floats, ks->window_floats * sizeof(float));
        p += ks->window_floats;
    }
}

void k3c_kda_slots_restore(k3c_kda_slots *ks, k3c_backend *be, int slot, const void *src) {
    const float *p = src;
    for (int l = 0; l < ks->num_layers; l++) {
        if (!ks->state[l]) continue;
        be->copy(be, ks->state[l] + (size_t)slot * ks->state_floats, p, ks->state_floats * sizeof(float));
        p += ks->state_floats;
        be->copy(be, ks->window[l] + (size_t)slot * ks->window_floats, p, ks->window_floats * sizeof(float));
        p += ks->window_floats;
    }
}
