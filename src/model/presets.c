/* Built-in configs. Each preset is written as the config.json fields it would have, in the family's
 * defaults (k3_base / kimi_linear_base), so that write -> parse gives back the identical struct. */
#include "model/presets.h"

#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "util/error.h"

/* K3's published values (its released config.json), the starting point of every K3-family preset. */
static k3c_config k3_base(void) {
    return (k3c_config){
        .family = K3C_FAMILY_K3,
        .layer_spelling = K3C_LAYERS_LINEAR_ATTN_CONFIG,
        .vocab_size = 163840,
        .hidden_size = 7168,
        .num_layers = 93,
        .rms_norm_eps = 1e-5f,
        .mla_lora_norm_eps = 1e-6f,
        .tie_word_embeddings = 0,
        .max_position_embeddings = 1048576,
        .hidden_act = K3C_ACT_SITU,
        .situ_beta = 4.0f,
        .situ_linear_beta = 25.0f,
        .attn_res_block_size = 12,
        .first_k_dense_replace = 1,
        .moe_layer_freq = 1,
        .intermediate_size = 33792,
        .num_experts = 896,
        .num_experts_per_token = 16,
        .num_shared_experts = 2,
        .moe_intermediate_size = 3072,
        .routed_expert_hidden_size = 3584,
        .latent_moe_use_norm = 1,
        .router_sigmoid = 1,
        .use_correction_bias = 1,
        .use_grouped_topk = 1,
        .num_expert_group = 1,
        .topk_group = 1,
        .moe_renormalize = 1,
        .routed_scaling_factor = 1.0f,
        .expert_format = K3C_EXPERTS_MXFP4,
        .mxfp4_group_size = 32,
        .num_attention_heads = 96,
        .num_key_value_heads = 96,
        .q_lora_rank = 1536,
        .kv_lora_rank = 512,
        .qk_nope_head_dim = 128,
        .qk_rope_head_dim = 64,
        .v_head_dim = 128,
        .mla_use_output_gate = 1,
        .kda_num_heads = 96,
        .kda_head_dim = 128,
        .kda_conv_kernel = 4,
        .kda_full_rank_gate = 1,
        .kda_has_lower_bound = 1,
        .kda_gate_lower_bound = -5.0f,
        .kda_a_log_padded = 1,
        .bos_token_id = 163584,
        .eos_token_id = 163586,
        .pad_token_id = 163839,
    };
}

/* Kimi-Linear-48B-A3B's released values (transformers' KimiLinearConfig defaults agree), official spelling. */
static k3c_config kimi_linear_base(void) {
    return (k3c_config){
        .family = K3C_FAMILY_KIMI_LINEAR,
        .layer_spelling = K3C_LAYERS_LINEAR_ATTN_CONFIG,
        .vocab_size = 163840,
        .hidden_size = 2304,
        .num_layers = 27,
        .rms_norm_eps = 1e-5f,
        .mla_lora_norm_eps = 1e-6f,
        .tie_word_embeddings = 0,
        .max_position_embeddings = 1048576,
        .hidden_act = K3C_ACT_SILU,
        .attn_res_block_size = 0,
        .first_k_dense_replace = 1,
        .moe_layer_freq = 1,
        .intermediate_size = 9216,
        .num_experts = 256,
        .num_experts_per_token = 8,
        .num_shared_experts = 1,
        .moe_intermediate_size = 1024,
        .routed_expert_hidden_size = 0,
        .latent_moe_use_norm = 0,
        .router_sigmoid = 1,
        .use_correction_bias = 1,
        .use_grouped_topk = 1,
        .num_expert_group = 1,
        .topk_group = 1,
        .moe_renormalize = 1,
        .routed_scaling_factor = 2.446f,
        .expert_format = K3C_EXPERTS_BF16,
        .mxfp4_group_size = 0,
        .num_attention_heads = 32,
        .num_key_value_heads = 32,
        .q_lora_rank = 0,
        .kv_lora_rank = 512,
        .qk_nope_head_dim = 128,
        .qk_rope_head_dim = 64,
        .v_head_dim = 128,
        .mla_use_output_gate = 0,
        .kda_num_heads = 32,
        .kda_head_dim = 128,
        .kda_conv_kernel = 4,
        .kda_full_rank_gate = 0,
        .kda_has_lower_bound = 0,
        .kda_gate_lower_bound = 0.0f,
        .kda_a_log_padded = 0,
        .bos_token_id = 163584,
        .eos_token_id = 163586,
        .pad_token_id = 163839,
    };
}

/* Allocates the schedule: MLA at the given 1-based layer numbers, KDA elsewhere; MoE by the
 * first_k_dense_replace / moe_layer_freq rule. Fills num_attn_res_blocks. */
static int set_schedule(k3c_config *c, const int *full_attn_1based, int n_full) {
    c->layer_attn = malloc(sizeof *c->layer_attn * (size_t)c->num_layers);
    c->layer_is_moe = malloc((size_t)c->num_layers);
    if (!c->layer_attn || !c->layer_is_moe) {
        k3c_config_free(c);
        return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory for a %d-layer preset", c->num_layers);
    }
    for (int l = 0; l < c->num_layers; l++) {
        c->layer_attn[l] = K3C_ATTN_KDA;
        c->layer_is_moe[l] = (uint8_t)k3c_config_rule_is_moe(c->first_k_dense_replace, c->moe_layer_freq, l);
    }
    for (int i = 0; i < n_full; i++) c->layer_attn[full_attn_1based[i] - 1] = K3C_ATTN_MLA;
    c->num_attn_res_blocks = k3c_config_attn_res_blocks(c->num_layers, c->attn_res_block_size);
    return K3C_OK;
}

/* K3's own schedule: MLA at 1-based 4, 8, ..., 92 and 93, truncated to the first num_layers layers. */
static int set_k3_schedule(k3c_config *c) {
    int full[32], n = 0;
    for (int l = 4; l <= c->num_layers && l <= 92; l += 4) full[n++] = l;
    if (c->num_layers == 93) full[n++] = 93;
    return set_schedule(c, full, n);
}

/* bos / eos / pad of a preset with weights: the ids of [BOS], [EOS] and [PAD] in the tokenizer `k3c synth`
 * writes beside it (text/tokenizer.h: the embedded default fills the vocabulary, its special slots last), so
 * the config and the tokenizer agree. */
static void tokenizer_ids(k3c_config *c) {
    int32_t bos, eos, pad;
    k3c_tokenizer_default_ids(c->family == K3C_FAMILY_K3, c->vocab_size, &bos, &eos, &pad);
    c->bos_token_id = bos;
    c->eos_token_id = eos;
    c->pad_token_id = pad;
}

/* 9 layers, every K3 structural feature: blocks start at 0 (KDA), 4 (KDA) and 8 (MLA); layers 7 and 8
 * are consecutive final MLA layers. About 12 MB in the published dtypes. */
static int preset_tiny(k3c_config *c) {
    *c = k3_base();
    c->vocab_size = 1024;
    c->hidden_size = 256;
    c->num_layers = 9;
    c->attn_res_block_size = 4;
    c->intermediate_size = 512;
    c->num_experts = 16;
    c->num_experts_per_token = 4;
    c->num_shared_experts = 2;
    c->moe_intermediate_size = 64;
    c->routed_expert_hidden_size = 128;
    c->num_attention_heads = 2;
    c->num_key_value_heads = 2;
    c->q_lora_rank = 64;
    c->kv_lora_rank = 128;
    c->qk_nope_head_dim = 32;
    c->qk_rope_head_dim = 32;
    c->v_head_dim = 32;
    c->kda_num_heads = 2;
    c->kda_head_dim = 128;
    tokenizer_ids(c);
    static const int full[] = {4, 8, 9};
    return set_schedule(c, full, 3);
}

/* tiny with grouped routing and a scaling factor, the branches K3 leaves unused (spec §8, test 3). */
static int preset_tiny_grouped(k3c_config *c) {
    K3C_TRY(preset_tiny(c));
    c->num_expert_group = 4;
    c->topk_group = 2;
    c->routed_scaling_factor = 2.5f;
    return K3C_OK;
}

/* spec §8, mini-cpu column. */
static int preset_mini(k3c_config *c) {
    *c = k3_base();
    c->vocab_size = 32768;
    c->hidden_size = 1024;
    c->num_layers = 13;
    c->attn_res_block_size = 4;
    c->intermediate_size = 4096;
    c->num_experts = 32;
    c->num_experts_per_token = 4;
    c->num_shared_experts = 2;
    c->moe_intermediate_size = 256;
    c->routed_expert_hidden_size = 512;
    c->num_attention_heads = 8;
    c->num_key_value_heads = 8;
    c->q_lora_rank = 384;
    c->kv_lora_rank = 512;
    c->qk_nope_head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    c->kda_num_heads = 8;
    c->kda_head_dim = 128;
    tokenizer_ids(c);
    static const int full[] = {4, 8, 12, 13};
    return set_schedule(c, full, 4);
}

/* Kimi Linear as transformers 5.17 names it (layer_types spelling), for the transformers oracle. */
static int preset_kimi_linear_tiny(k3c_config *c) {
    *c = kimi_linear_base();
    c->layer_spelling = K3C_LAYERS_LAYER_TYPES;
    c->vocab_size = 1024;
    c->hidden_size = 256;
    c->num_layers = 6;
    c->intermediate_size = 512;
    c->num_experts = 8;
    c->num_experts_per_token = 2;
    c->num_shared_experts = 1;
    c->moe_intermediate_size = 64;
    c->num_attention_heads = 2;
    c->num_key_value_heads = 2;
    c->kv_lora_rank = 128;
    c->qk_nope_head_dim = 32;
    c->qk_rope_head_dim = 32;
    c->v_head_dim = 32;
    c->kda_num_heads = 2;
    c->kda_head_dim = 128;
    tokenizer_ids(c);
    static const int full[] = {4, 6}; /* linear, linear, linear, full, linear, full */
    return set_schedule(c, full, 2);
}

/* Benchmark: K3's exact layer dims for K3's first 12 layers (one AttnRes block), 64 experts. */
static int preset_k3_slice(k3c_config *c) {
    *c = k3_base();
    c->num_layers = 12;
    c->num_experts = 64;
    c->num_experts_per_token = 16;
    return set_k3_schedule(c);
}

/* Benchmark: Kimi-Linear-48B-A3B as released (moonshotai/Kimi-Linear-48B-A3B-Instruct config.json:
 * full_attn_layers [4, 8, 12, 16, 20, 24, 27], the other 20 layers KDA). */
static int preset_kimi_linear_48b(k3c_config *c) {
    *c = kimi_linear_base();
    static const int full[] = {4, 8, 12, 16, 20, 24, 27};
    return set_schedule(c, full, 7);
}

/* Benchmark: one rank of K3 under TP8 for the first 12 layers: heads, expert/shared/dense widths and the
 * vocabulary split 8 ways; the MLA latent (kv_lora, q_lora) and the MoE latent R are replicated. */
static int preset_k3_tp8_rank(k3c_config *c) {
    *c = k3_base();
    c->num_layers = 12;
    c->vocab_size = 163840 / 8;
    c->kda_num_heads = 96 / 8;
    c->num_attention_heads = 96 / 8;
    c->num_key_value_heads = 96 / 8;
    c->moe_intermediate_size = 3072 / 8;
    c->intermediate_size = 33792 / 8;
    /* token ids of the full vocabulary fall outside one rank's slice */
    c->bos_token_id = c->eos_token_id = c->pad_token_id = -1;
    return set_k3_schedule(c);
}

/* The full published K3 (inventory arithmetic, config round trips). */
static int preset_k3(k3c_config *c) {
    *c = k3_base();
    return set_k3_schedule(c);
}

typedef struct preset {
    const char *name;
    int (*fill)(k3c_config *);
    int has_weights;
} preset;

static const preset presets[] = {
    {"tiny", preset_tiny, 1},
    {"tiny-grouped", preset_tiny_grouped, 1},
    {"mini", preset_mini, 1},
    {"kimi-linear-tiny", preset_kimi_linear_tiny, 1},
    {"k3-slice", preset_k3_slice, 0},
    {"kimi-linear-48b", preset_kimi_linear_48b, 0},
    {"k3-tp8-rank", preset_k3_tp8_rank, 0},
    {"k3", preset_k3, 0},
};
#define NUM_PRESETS (sizeof presets / sizeof presets[0])

static const char *const preset_name_list[NUM_PRESETS + 1] = {
    "tiny", "tiny-grouped", "mini", "kimi-linear-tiny", "k3-slice", "kimi-linear-48b", "k3-tp8-rank", "k3", NULL,
};

const char *const *k3c_preset_names(void) { return preset_name_list; }

static const preset *find(const char *name) {
    for (size_t i = 0; name && i < NUM_PRESETS; i++)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    return NULL;
}

int k3c_preset_config(const char *name, k3c_config *out) {
    memset(out, 0, sizeof *out);
    const preset *p = find(name);
    if (!p) {
        char known[256] = "";
        for (size_t i = 0; i < NUM_PRESETS; i++) {
            if (i) strncat(known, ", ", sizeof known - strlen(known) - 1);
            strncat(known, presets[i].name, sizeof known - strlen(known) - 1);
        }
        return k3c_errorf("preset \"%s\": unknown (known: %s)", name ? name : "(null)", known);
    }
    K3C_TRY(p->fill(out));
    if (k3c_config_validate(out) != K3C_OK) {
        k3c_config_free(out);
        return k3c_error_context("preset %s", name);
    }
    return K3C_OK;
}

int k3c_preset_has_weights(const char *name) {
    const preset *p = find(name);
    return p ? p->has_weights : 0;
}
