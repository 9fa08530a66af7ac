#include "model/config.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

void k3c_config_free(k3c_config *c) {
    free(c->layer_attn);
    free(c->layer_is_moe);
    c->layer_attn = NULL;
    c->layer_is_moe = NULL;
}

int k3c_config_copy(k3c_config *dst, const k3c_config *src) {
    *dst = *src;
    dst->layer_attn = malloc(sizeof *dst->layer_attn * (size_t)src->num_layers);
    dst->layer_is_moe = malloc((size_t)src->num_layers);
    if (!dst->layer_attn || !dst->layer_is_moe) {
        k3c_config_free(dst);
        return k3c_errorf("out of memory copying a config of %d layers", src->num_layers);
    }
    memcpy(dst->layer_attn, src->layer_attn, sizeof *dst->layer_attn * (size_t)src->num_layers);
    memcpy(dst->layer_is_moe, src->layer_is_moe, (size_t)src->num_layers);
    return K3C_OK;
}
