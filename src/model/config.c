#include "model/config.h"

#include <limits.h>
#include <math.h>
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
    dst->layer_attn = NULL;
    dst->layer_is_moe = NULL;
    if (src->num_layers <= 0 || !src->layer_attn || !src->layer_is_moe)
        return k3c_errorf("copying a config: num_hidden_layers = %d, layer arrays %s", src->num_layers,
                          src->layer_attn && src->layer_is_moe ? "present" : "missing");
    dst->layer_attn = malloc(sizeof *dst->layer_attn * (size_t)src->num_layers);
    dst->layer_is_moe = malloc((size_t)src->num_layers);
    if (!dst->layer_attn || !dst->layer_is_moe) {
        k3c_config_free(dst);
        return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory copying a config of %d layers", src->num_layers);
    }
    memcpy(dst->layer_attn, src->layer_attn, sizeof *dst->layer_attn * (size_t)src->num_layers);
    memcpy(dst->layer_is_moe, src->layer_is_moe, (size_t)src->num_layers);
    return K3C_OK;
}

/* ---- validation ----
 * Fields are named as the family's config.json spells them (K3 and the official Kimi Linear form:
 * linear_attn_config.*; transformers 5.x: linear_num_heads, layer_types, ...), so a user can find the line. */

static const char *spelled(const k3c_config *c, const char *official) {
    static const char *const map[][2] = {
        {"linear_attn_config.num_heads", "linear_num_heads"},
        {"linear_attn_config.head_dim", "linear_head_dim"},
        {"linear_attn_config.short_conv_kernel_size", "linear_conv_kernel_dim"},
        {"linear_attn_config.kda_layers", "layer_types"},
        {"max_position_embeddings", "model_max_length"},
        {"first_k_dense_replace", "mlp_layer_types"},
    };
    if (c->layer_spelling != K3C_LAYERS_LAYER_TYPES) return official;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i][0], official) == 0) return map[i][1];
    return official;
}

#define POSITIVE(field, value)                                                                                     \
    do {                                                                                                           \
        if ((value) <= 0)                                                                                          \
            return k3c_errorf("%s%s = %d: must be positive", prefix, spelled(c, field), (int)(value));            \
    } while (0)

#define NONNEGATIVE(field, value)                                                                                  \
    do {                                                                                                           \
        if ((value) < 0)                                                                                           \
            return k3c_errorf("%s%s = %d: must not be negative", prefix, spelled(c, field), (int)(value));        \
    } while (0)

#define POSITIVE_FINITE(field, value)                                                                              \
    do {                                                                                                           \
        if (!(isfinite(value) && (value) > 0))                                                                     \
            return k3c_errorf("%s%s = %g: must be a positive finite number", prefix, spelled(c, field),            \
                              (double)(value));                                                                    \
    } while (0)

#define FLAG(field, value)                                                                                         \
    do {                                                                                                           \
        if ((value) != 0 && (value) != 1)                                                                          \
            return k3c_errorf("%s%s = %d: must be 0 or 1", prefix, field, (int)(value));                          \
    } while (0)

static int validate_schedule(const k3c_config *c, const char *prefix) {
    const char *attn_field = spelled(c, "linear_attn_config.kda_layers");
    if (!c->layer_attn || !c->layer_is_moe)
        return k3c_errorf("%s%s: layer schedule missing", prefix, attn_field);
    for (int l = 0; l < c->num_layers; l++) {
        if (c->layer_attn[l] != K3C_ATTN_KDA && c->layer_attn[l] != K3C_ATTN_MLA)
            return k3c_errorf("%s%s: layer %d (0-based) has attention kind %d, neither KDA nor MLA", prefix,
                              attn_field, l, (int)c->layer_attn[l]);
        if (c->layer_is_moe[l] > 1)
            return k3c_errorf("%s%s: layer %d (0-based) has MoE flag %d", prefix,
                              spelled(c, "first_k_dense_replace"), l, c->layer_is_moe[l]);
    }
    return K3C_OK;
}

static int validate_moe(const k3c_config *c, const char *prefix) {
    POSITIVE("num_experts", c->num_experts);
    POSITIVE("num_experts_per_token", c->num_experts_per_token);
    if (c->num_experts_per_token > c->num_experts)
        return k3c_errorf("%snum_experts_per_token = %d: larger than num_experts (%d)", prefix,
                          c->num_experts_per_token, c->num_experts);
    POSITIVE("moe_intermediate_size", c->moe_intermediate_size);
    NONNEGATIVE("num_shared_experts", c->num_shared_experts);
    NONNEGATIVE("routed_expert_hidden_size", c->routed_expert_hidden_size);
    POSITIVE("num_expert_group", c->num_expert_group);
    if (c->num_experts % c->num_expert_group != 0)
        return k3c_errorf("%snum_expert_group = %d: does not divide num_experts (%d)", prefix, c->num_expert_group,
                          c->num_experts);
    POSITIVE("topk_group", c->topk_group);
    if (c->topk_group > c->num_expert_group)
        return k3c_errorf("%stopk_group = %d: larger than num_expert_group (%d)", prefix, c->topk_group,
                          c->num_expert_group);
    int selectable = c->topk_group * (c->num_experts / c->num_expert_group);
    if (c->num_experts_per_token > selectable)
        return k3c_errorf("%snum_experts_per_token = %d: larger than the %d experts of the topk_group = %d best "
                          "groups (num_experts %d / num_expert_group %d each)",
                          prefix, c->num_experts_per_token, selectable, c->topk_group, c->num_experts,
                          c->num_expert_group);
    POSITIVE_FINITE("routed_scaling_factor", c->routed_scaling_factor);
    FLAG("latent_moe_use_norm", c->latent_moe_use_norm);
    FLAG("moe_router_activation_func (sigmoid)", c->router_sigmoid);
    FLAG("topk_method (noaux_tc)", c->use_correction_bias);
    FLAG("use_grouped_topk", c->use_grouped_topk);
    FLAG("moe_renormalize", c->moe_renormalize);
    if (c->latent_moe_use_norm && c->routed_expert_hidden_size == 0)
        return k3c_errorf("%slatent_moe_use_norm = true: needs routed_expert_hidden_size > 0", prefix);

    if (c->expert_format == K3C_EXPERTS_MXFP4) {
        if (c->mxfp4_group_size != 32)
            return k3c_errorf("%squantization_config group_size = %d: only 32 (MXFP4) is supported", prefix,
                              c->mxfp4_group_size);
        const char *in_field = c->routed_expert_hidden_size > 0 ? "routed_expert_hidden_size" : "hidden_size";
        if (k3c_config_expert_in(c) % 32 != 0)
            return k3c_errorf("%s%s = %d: not a multiple of 32, required by MXFP4 experts", prefix, in_field,
                              k3c_config_expert_in(c));
        if (c->moe_intermediate_size % 32 != 0)
            return k3c_errorf("%smoe_intermediate_size = %d: not a multiple of 32, required by MXFP4 experts",
                              prefix, c->moe_intermediate_size);
    } else if (c->expert_format != K3C_EXPERTS_BF16) {
        return k3c_errorf("%squantization_config: expert format %d is neither BF16 nor MXFP4", prefix,
                          (int)c->expert_format);
    }
    return K3C_OK;
}

/* a * b, or INT64_MAX where the product does not fit: the widths below multiply three int fields, whose
 * product a hostile config.json can push past int64 too (num_heads x 2^31 x 2^31, tools/fuzz_load.py) */
static int64_t mul_sat(int64_t a, int64_t b) {
    int64_t p;
    return __builtin_mul_overflow(a, b, &p) ? INT64_MAX : p;
}

/* Every width the code derives from two fields (config.h helpers, projection shapes) is an int: each must
 * fit, or a hostile config.json would overflow (undefined behaviour) before any shape check could catch it. */
static int validate_widths(const k3c_config *c, const char *prefix) {
    const int64_t H = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    const struct {
        const char *what;
        int64_t value;
    } w[] = {
        {"linear_attn_config.num_heads x head_dim", (int64_t)c->kda_num_heads * c->kda_head_dim},
        {"linear_attn_config.num_heads x head_dim x head_dim (KDA state)",
         mul_sat((int64_t)c->kda_num_heads * c->kda_head_dim, c->kda_head_dim)},
        {"num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)", H * (nope + rope)},
        {"num_attention_heads x (qk_nope_head_dim + v_head_dim)", H * (nope + c->v_head_dim)},
        {"kv_lora_rank + qk_rope_head_dim", (int64_t)c->kv_lora_rank + rope},
        {"num_shared_experts x moe_intermediate_size", (int64_t)c->num_shared_experts * c->moe_intermediate_size},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if (w[i].value > INT_MAX)
            return k3c_errorf("%s%s = %lld: larger than %d", prefix, w[i].what, (long long)w[i].value, INT_MAX);
    return K3C_OK;
}

int k3c_config_validate_named(const k3c_config *c, const char *prefix) {
    if (!prefix) prefix = "";
    if (c->family != K3C_FAMILY_K3 && c->family != K3C_FAMILY_KIMI_LINEAR)
        return k3c_errorf("%smodel_type: unknown family %d", prefix, (int)c->family);
    if (c->layer_spelling != K3C_LAYERS_LINEAR_ATTN_CONFIG && c->layer_spelling != K3C_LAYERS_LAYER_TYPES)
        return k3c_errorf("%slinear_attn_config: unknown layer spelling %d", prefix, (int)c->layer_spelling);
    if (c->family == K3C_FAMILY_K3 && c->layer_spelling != K3C_LAYERS_LINEAR_ATTN_CONFIG)
        return k3c_errorf("%slayer_types: K3 configs spell the schedule as linear_attn_config", prefix);

    POSITIVE("vocab_size", c->vocab_size);
    POSITIVE("hidden_size", c->hidden_size);
    POSITIVE("num_hidden_layers", c->num_layers);
    POSITIVE_FINITE("rms_norm_eps", c->rms_norm_eps);
    POSITIVE_FINITE("mla_lora_norm_eps", c->mla_lora_norm_eps);
    POSITIVE("max_position_embeddings", c->max_position_embeddings);
    FLAG("tie_word_embeddings", c->tie_word_embeddings);

    if (c->hidden_act == K3C_ACT_SITU) {
        POSITIVE_FINITE("activation_situ_beta", c->situ_beta);
        if (!(isfinite(c->situ_linear_beta) && c->situ_linear_beta >= 0))
            return k3c_errorf("%sactivation_situ_linear_beta = %g: must be a finite number >= 0 (0 = null)", prefix,
                              (double)c->situ_linear_beta);
    } else if (c->hidden_act != K3C_ACT_SILU) {
        return k3c_errorf("%shidden_act: unknown activation %d (supported: silu, situ)", prefix, (int)c->hidden_act);
    }

    NONNEGATIVE("attn_res_block_size", c->attn_res_block_size);
    /* the stock forward sizes its tables as (L + S - 1) / S in int */
    if (c->attn_res_block_size > INT_MAX - c->num_layers)
        return k3c_errorf("%sattn_res_block_size = %d: too large (at most %d for %d layers)", prefix,
                          c->attn_res_block_size, INT_MAX - c->num_layers, c->num_layers);
    int blocks = k3c_config_attn_res_blocks(c->num_layers, c->attn_res_block_size);
    if (c->num_attn_res_blocks != blocks)
        return k3c_errorf("%sattn_res_block_size = %d: num_attn_res_blocks is %d, expected %d for %d layers", prefix,
                          c->attn_res_block_size, c->num_attn_res_blocks, blocks, c->num_layers);

    K3C_TRY(validate_schedule(c, prefix));
    NONNEGATIVE("first_k_dense_replace", c->first_k_dense_replace);
    POSITIVE("moe_layer_freq", c->moe_layer_freq);
    POSITIVE("intermediate_size", c->intermediate_size);
    K3C_TRY(validate_moe(c, prefix));

    /* MLA */
    POSITIVE("num_attention_heads", c->num_attention_heads);
    POSITIVE("num_key_value_heads", c->num_key_value_heads);
    NONNEGATIVE("q_lora_rank", c->q_lora_rank);
    POSITIVE("kv_lora_rank", c->kv_lora_rank);
    POSITIVE("qk_nope_head_dim", c->qk_nope_head_dim);
    NONNEGATIVE("qk_rope_head_dim", c->qk_rope_head_dim);
    POSITIVE("v_head_dim", c->v_head_dim);
    FLAG("mla_use_output_gate", c->mla_use_output_gate);

    /* KDA */
    POSITIVE("linear_attn_config.num_heads", c->kda_num_heads);
    POSITIVE("linear_attn_config.head_dim", c->kda_head_dim);
    POSITIVE("linear_attn_config.short_conv_kernel_size", c->kda_conv_kernel);
    FLAG("linear_attn_config.use_full_rank_gate", c->kda_full_rank_gate);
    FLAG("linear_attn_config.gate_lower_bound (present)", c->kda_has_lower_bound);
    FLAG("A_log padding", c->kda_a_log_padded);
    if (c->kda_has_lower_bound && !(isfinite(c->kda_gate_lower_bound) && c->kda_gate_lower_bound < 0))
        return k3c_errorf("%slinear_attn_config.gate_lower_bound = %g: must be a negative finite number", prefix,
                          (double)c->kda_gate_lower_bound);

    K3C_TRY(validate_widths(c, prefix));

    /* Token ids: -1 = absent (null); otherwise an embedding row. */
    const struct {
        const char *name;
        int id;
    } ids[] = {{"bos_token_id", c->bos_token_id}, {"eos_token_id", c->eos_token_id}, {"pad_token_id", c->pad_token_id}};
    for (size_t i = 0; i < 3; i++)
        if (ids[i].id < -1 || ids[i].id >= c->vocab_size)
            return k3c_errorf("%s%s = %d: outside the vocabulary [0, %d)", prefix, ids[i].name, ids[i].id,
                              c->vocab_size);
    return K3C_OK;
}

int k3c_config_validate(const k3c_config *c) { return k3c_config_validate_named(c, ""); }
