/* The loaded model: every weight bound by role, with its shape. Large matrices are views into the mapped
 * checkpoint (bf16 or MXFP4 bytes, never copied); small vectors (norm weights, conv taps, A_log, dt_bias,
 * correction bias) are converted once to f32 arrays owned by the model, whatever float dtype the file used.
 *
 * Matrices are row-major [rows = out features, cols = in features], as nn.Linear stores them. */
#ifndef K3C_MODEL_WEIGHTS_H
#define K3C_MODEL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

typedef struct k3c_mat {
    const uint16_t *w; /* bf16 [rows, cols]; NULL when the weight does not exist */
    int rows, cols;
} k3c_mat;

typedef struct k3c_mxfp4_mat {
    const uint8_t *packed; /* [rows, cols/2], even column in the low nibble */
    const uint8_t *scale;  /* [rows, cols/32], E8M0 */
    int rows, cols;        /* logical shape */
} k3c_mxfp4_mat;

/* One routed expert: gate (w1), up (w3), down (w2). Exactly one of the two formats is set. */
typedef struct k3c_expert {
    k3c_mat w1, w2, w3;             /* K3C_EXPERTS_BF16 */
    k3c_mxfp4_mat q1, q2, q3;       /* K3C_EXPERTS_MXFP4 */
} k3c_expert;

typedef struct k3c_kda_weights {
    k3c_mat q_proj, k_proj, v_proj; /* [P, D], P = H * dk */
    float *q_conv, *k_conv, *v_conv; /* [P, W] taps; tap W-1 multiplies the current token */
    k3c_mat f_a, f_b;               /* [dk, D], [P, dk]: decay-gate input */
    k3c_mat b_proj;                 /* [H, D]: beta logits */
    k3c_mat g_proj;                 /* [P, D] full-rank output gate (K3) */
    k3c_mat g_a, g_b;               /* [dk, D], [P, dk] low-rank output gate (Kimi Linear) */
    float *a_log;                   /* [H] (padding stripped) */
    float *dt_bias;                 /* [P] */
    float *o_norm;                  /* [dk], shared by all heads */
    k3c_mat o_proj;                 /* [D, P] */
} k3c_kda_weights;

typedef struct k3c_mla_weights {
    k3c_mat q_proj;      /* [Hm*(nope+rope), D] when q_lora_rank == 0 */
    k3c_mat q_a;         /* [q_lora, D] */
    float *q_a_norm;     /* [q_lora] */
    k3c_mat q_b;         /* [Hm*(nope+rope), q_lora]; per head [nope | rope] */
    k3c_mat kv_a;        /* [kv_lora + rope, D] */
    float *kv_a_norm;    /* [kv_lora] */
    k3c_mat kv_b;        /* [Hm*(nope+v), kv_lora]; per head rows [k_nope (nope) | v (v_head)] */
    k3c_mat g_proj;      /* [Hm*v, D] sigmoid output gate, when mla_use_output_gate */
    k3c_mat o_proj;      /* [D, Hm*v] */
} k3c_mla_weights;

typedef struct k3c_mlp_weights {
    k3c_mat gate, up; /* [I, D] */
    k3c_mat down;     /* [D, I] */
} k3c_mlp_weights;

typedef struct k3c_moe_weights {
    k3c_mat router;           /* [E, D] (computed in fp32) */
    float *correction_bias;   /* [E] or NULL */
    k3c_mat latent_down;      /* [R, D] (K3) */
    float *latent_norm;       /* [R] */
    k3c_mat latent_up;        /* [D, R] */
    k3c_mlp_weights shared;   /* width num_shared * F; .gate.w == NULL when no shared experts */
    k3c_expert *experts;      /* [E] */
} k3c_moe_weights;

typedef struct k3c_layer_weights {
    k3c_attn_kind kind;
    int is_moe;
    float *input_norm, *post_norm;    /* [D] */
    float *attn_res_proj, *attn_res_norm; /* [D] w_a, n_a as stored */
    float *mlp_res_proj, *mlp_res_norm;   /* [D] w_m, n_m */
    k3c_kda_weights kda;
    k3c_mla_weights mla;
    k3c_mlp_weights mlp; /* dense layers */
    k3c_moe_weights moe; /* MoE layers */
} k3c_layer_weights;

typedef struct k3c_weights {
    k3c_mat embed;                     /* [V, D] */
    k3c_mat lm_head;                   /* [V, D] (== embed when tied) */
    float *final_norm;                 /* [D] */
    float *out_res_proj, *out_res_norm; /* [D] (AttnRes only) */
    k3c_layer_weights *layers;         /* [L] */
    int num_layers;                    /* L: entries of layers (k3c_weights_free walks them) */
} k3c_weights;

#endif
