/* The model description every other part reads: one struct for both families (Kimi K3 and Kimi Linear),
 * filled from an HF config.json (format/config_json.c) or from a built-in preset (model/presets.c).
 * Field comments give the K3 value, as its published config.json and modeling code define it. */
#ifndef K3C_MODEL_CONFIG_H
#define K3C_MODEL_CONFIG_H

#include <stdint.h>

typedef enum k3c_family {
    K3C_FAMILY_K3 = 1,          /* nested text_config, tensor prefix "language_model." */
    K3C_FAMILY_KIMI_LINEAR = 2, /* flat config, tensor prefix "" ("model.", "lm_head.") */
} k3c_family;

typedef enum k3c_activation {
    K3C_ACT_SILU = 1, /* SwiGLU: silu(g) * u */
    K3C_ACT_SITU = 2, /* SiTU (spec §5.1) */
} k3c_activation;

typedef enum k3c_attn_kind {
    K3C_ATTN_KDA = 1,
    K3C_ATTN_MLA = 2,
} k3c_attn_kind;

typedef enum k3c_expert_format {
    K3C_EXPERTS_BF16 = 1,  /* experts.{e}.w{1,2,3}.weight, BF16 (Kimi Linear) */
    K3C_EXPERTS_MXFP4 = 2, /* experts.{e}.w{1,2,3}.weight_packed / weight_scale (K3) */
} k3c_expert_format;

/* How config.json spelled the layer schedule (kept so a config can be written back the same way). */
typedef enum k3c_layer_spelling {
    K3C_LAYERS_LINEAR_ATTN_CONFIG = 1, /* linear_attn_config.kda_layers / full_attn_layers (official) */
    K3C_LAYERS_LAYER_TYPES = 2,        /* transformers 5.x: layer_types / mlp_layer_types */
} k3c_layer_spelling;

typedef struct k3c_config {
    k3c_family family;
    k3c_layer_spelling layer_spelling;

    /* ---- dimensions ---- */
    int vocab_size;          /* 163840 */
    int hidden_size;         /* D = 7168 */
    int num_layers;          /* L = 93 */
    float rms_norm_eps;      /* 1e-5: every decoder RMSNorm, the KDA gated o_norm, the latent-MoE norm */
    float mla_lora_norm_eps; /* q_a_layernorm / kv_a_layernorm eps: 1e-6 (spec §9.1) */
    int tie_word_embeddings; /* 0 */
    int max_position_embeddings;

    /* ---- activation ---- */
    k3c_activation hidden_act; /* SiTU for K3, SiLU for Kimi Linear */
    float situ_beta;           /* 4.0 */
    float situ_linear_beta;    /* 25.0; 0 means "null" (up passes through) */

    /* ---- residual stream ---- */
    int attn_res_block_size; /* S = 12 (block AttnRes); 0 = plain pre-norm residual (Kimi Linear) */
    int num_attn_res_blocks; /* ceil(L / S) = 8; 0 without AttnRes */

    /* ---- layer schedule (arrays of num_layers, owned by the config) ---- */
    k3c_attn_kind *layer_attn; /* KDA or MLA per 0-based layer */
    uint8_t *layer_is_moe;     /* 1 = MoE FFN, 0 = dense MLP */

    /* ---- dense MLP ---- */
    int first_k_dense_replace; /* 1 */
    int moe_layer_freq;        /* 1 */
    int intermediate_size;     /* 33792 (dense MLP width) */

    /* ---- MoE ---- */
    int num_experts;               /* E = 896 */
    int num_experts_per_token;     /* k = 16 */
    int num_shared_experts;        /* 2: one fused MLP of width num_shared_experts * moe_intermediate_size */
    int moe_intermediate_size;     /* F = 3072 */
    int routed_expert_hidden_size; /* R = 3584 latent width; 0 = experts at full hidden size (Kimi Linear) */
    int latent_moe_use_norm;       /* 1 */
    int router_sigmoid;            /* 1 = sigmoid scores ("sigmoid"); 0 = softmax */
    int use_correction_bias;       /* 1 = topk_method "noaux_tc": select on score + e_score_correction_bias */
    int use_grouped_topk;          /* 1 */
    int num_expert_group;          /* 1 */
    int topk_group;                /* 1 */
    int moe_renormalize;           /* 1 */
    float routed_scaling_factor;   /* 1.0 (Kimi Linear: 2.446) */
    k3c_expert_format expert_format;
    int mxfp4_group_size; /* 32 */

    /* ---- MLA (NoPE) ---- */
    int num_attention_heads; /* 96 */
    int num_key_value_heads; /* 96, unused by MLA math, kept to write configs back */
    int q_lora_rank;         /* 1536; 0 = plain q_proj (Kimi Linear) */
    int kv_lora_rank;        /* 512 */
    int qk_nope_head_dim;    /* 128 */
    int qk_rope_head_dim;    /* 64 (not rotated) */
    int v_head_dim;          /* 128 */
    int mla_use_output_gate; /* 1 (K3), 0 (Kimi Linear) */

    /* ---- KDA ---- */
    int kda_num_heads;        /* Hk = 96 */
    int kda_head_dim;         /* dk = dv = 128 */
    int kda_conv_kernel;      /* W = 4 */
    int kda_full_rank_gate;   /* 1 = g_proj [H*dk, D]; 0 = g_a_proj [dk, D] + g_b_proj [H*dk, dk] */
    int kda_has_lower_bound;  /* 1 = safe gate lower_bound * sigmoid(...); 0 = -exp(A_log) * softplus(...) */
    float kda_gate_lower_bound; /* -5.0 */
    int kda_a_log_padded;     /* 1 = A_log stored [round_up(H,128)] (K3); 0 = [1,1,H,1] (Kimi Linear) */

    /* ---- token ids ---- */
    int bos_token_id, eos_token_id, pad_token_id;
} k3c_config;

/* Frees the layer arrays; the struct itself belongs to the caller. */
void k3c_config_free(k3c_config *c);
/* Deep copy (layer arrays included). */
int k3c_config_copy(k3c_config *dst, const k3c_config *src);
/* Checks every cross-field rule (dims that divide, top-k <= experts, layer lists, ...). On failure the
 * error message names the field, the value and the reason. */
int k3c_config_validate(const k3c_config *c);
/* The same checks, with every field named as config.json spells it for this family, each message starting
 * with prefix (e.g. "dir/config.json: text_config."). k3c_config_validate uses an empty prefix. */
int k3c_config_validate_named(const k3c_config *c, const char *prefix);
/* The layer-0-dense rule of config.json: layer l is MoE when l >= first_k_dense_replace and
 * l % moe_layer_freq == 0 (the schedule K3 and Kimi Linear publish). */
static inline int k3c_config_rule_is_moe(int first_k_dense_replace, int moe_layer_freq, int l) {
    return l >= first_k_dense_replace && moe_layer_freq > 0 && l % moe_layer_freq == 0;
}

/* Derived quantities. */
static inline int k3c_config_kda_proj(const k3c_config *c) { return c->kda_num_heads * c->kda_head_dim; }
static inline int k3c_config_mla_qk_head_dim(const k3c_config *c) { return c->qk_nope_head_dim + c->qk_rope_head_dim; }
static inline int k3c_config_mla_latent(const k3c_config *c) { return c->kv_lora_rank + c->qk_rope_head_dim; }
static inline int k3c_config_shared_width(const k3c_config *c) { return c->num_shared_experts * c->moe_intermediate_size; }
/* Width the routed experts see: the latent R for K3, the hidden size for Kimi Linear. */
static inline int k3c_config_expert_in(const k3c_config *c) {
    return c->routed_expert_hidden_size > 0 ? c->routed_expert_hidden_size : c->hidden_size;
}
/* ceil(L / S) AttnRes blocks, 0 without AttnRes (S = 0); in 64 bits, as S comes from config.json. */
static inline int k3c_config_attn_res_blocks(int num_layers, int block_size) {
    return block_size > 0 && num_layers > 0 ? (int)(((int64_t)num_layers + block_size - 1) / block_size) : 0;
}
/* 1 where layer l starts an AttnRes block (l % S == 0). */
static inline int k3c_config_is_block_start(const k3c_config *c, int l) {
    return c->attn_res_block_size > 0 && l % c->attn_res_block_size == 0;
}

#endif
