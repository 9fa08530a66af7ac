/* Test helper: a preset's checkpoint synthesized into a folder, optionally with dense routing (every expert
 * selected, and every group kept), which makes the forward independent of routing near-ties, so that a
 * float64 reference or another backend can be compared row by row. */
#ifndef K3C_TESTS_SYNTH_PRESET_H
#define K3C_TESTS_SYNTH_PRESET_H

#include <stdint.h>

#include "model/config.h"
#include "model/presets.h"
#include "model/synth.h"
#include "util/error.h"

static inline int test_synth_preset(const char *preset, int dense_routing, uint64_t seed, const char *dir) {
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    if (dense_routing) {
        c.num_experts_per_token = c.num_experts;
        c.topk_group = c.num_expert_group;
    }
    /* the preset's name only when the config is the preset's own (the synthesizer's conditioning keys on it) */
    int rc = k3c_synth_write(&c, dense_routing ? NULL : preset, seed, dir);
    k3c_config_free(&c);
    return rc;
}

#endif
