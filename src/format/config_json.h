/* HF config.json <-> k3c_config, for both families:
 *  - K3: top level {model_type "kimi_k3", text_config {... model_type "kimi_linear", quantization_config ...}};
 *  - Kimi Linear: flat; layer schedule either as linear_attn_config {kda_layers, full_attn_layers} (1-based,
 *    official) or as transformers 5.x writes it (layer_types, mlp_layer_types, linear_num_heads, ...).
 * Parsing validates (k3c_config_validate) and names the field, value and reason on error. */
#ifndef K3C_FORMAT_CONFIG_JSON_H
#define K3C_FORMAT_CONFIG_JSON_H

#include <stddef.h>

#include "model/config.h"

int k3c_config_parse_json(const char *json, size_t len, const char *where, k3c_config *out);
/* Reads and parses a config.json file. */
int k3c_config_load(const char *path, k3c_config *out);
/* Writes config.json in the family's published spelling (K3: nested, with quantization_config when the
 * experts are MXFP4; Kimi Linear: as transformers 5.17 save_pretrained writes it). Atomic (tmp + rename). */
int k3c_config_write_json(const k3c_config *c, const char *path);

#endif
