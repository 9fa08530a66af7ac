/* The tiny configs the parallel tests share (CPU ranks, engine ranks, PP / DEP, the GPU's TP ranks): tiny K3
 * (MXFP4 experts, AttnRes) or tiny Kimi Linear with heads and widths that split 8 ways: 8 KDA heads of 32, 8
 * MLA heads, routed experts 256 wide (MXFP4: 32 a rank at TP 8) or 64 (bf16), dense 512, vocabulary 1024.
 * dense_routing: every expert selected, so no routing near-tie can flip between a sum and its split. */
#ifndef K3C_TESTS_TP_CONFIG_H
#define K3C_TESTS_TP_CONFIG_H

#include "k3c.h"
#include "model/config.h"
#include "model/presets.h"
#include "util/error.h"

static inline int tp_config(int kimi_linear, int dense_routing, k3c_config *c) {
    K3C_TRY(k3c_preset_config(kimi_linear ? "kimi-linear-tiny" : "tiny", c));
    c->kda_num_heads = 8;
    c->kda_head_dim = 32;
    c->num_attention_heads = 8;
    c->num_key_value_heads = 8;
    c->moe_intermediate_size = kimi_linear ? 64 : 256;
    c->intermediate_size = 512;
    if (dense_routing) {
        c->num_experts_per_token = c->num_experts;
        c->topk_group = c->num_expert_group;
    }
    return k3c_config_validate(c);
}

#endif
