/* Built-in model configs: test models that keep every structural feature (tiny, mini, kimi-linear-tiny)
 * and the presets the decode benchmarks report (k3-slice, kimi-linear-48b, k3-tp8-rank), plus
 * the full published K3 (k3) for inventory arithmetic. */
#ifndef K3C_MODEL_PRESETS_H
#define K3C_MODEL_PRESETS_H

#include "model/config.h"

/* Fills out (caller frees with k3c_config_free); error naming the preset and the known names if unknown. */
int k3c_preset_config(const char *name, k3c_config *out);
/* NULL-terminated list of preset names. */
const char *const *k3c_preset_names(void);
/* 1 when synth writes the preset's weights; 0 for benchmark presets (config only: their weights are
 * generated in device memory by the benchmark). */
int k3c_preset_has_weights(const char *name);

#endif
