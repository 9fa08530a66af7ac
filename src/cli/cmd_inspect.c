/* k3c inspect DIR: loads a checkpoint with full validation, then prints its structure: family, layer
 * schedule, parameter counts (total and active per token), bytes per dtype, per-token KV cache and
 * per-request KDA state, and the loaded memory footprint. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static void human(char *buf, size_t size, double bytes) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    snprintf(buf, size, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
}

static void count(char *buf, size_t size, double n) {
    if (n >= 1e12)
        snprintf(buf, size, "%.4g T", n / 1e12);
    else if (n >= 1e9)
        snprintf(buf, size, "%.4g B", n / 1e9);
    else if (n >= 1e6)
        snprintf(buf, size, "%.4g M", n / 1e6);
    else if (n >= 1e3)
        snprintf(buf, size, "%.4g K", n / 1e3);
    else
        snprintf(buf, size, "%.4g", n);
}

static void print_schedule(const k3c_model *m, const k3c_model_info *f) {
    printf("\nlayer schedule:\n  %5s  %-4s  %-5s  %s\n", "layer", "attn", "ffn", "AttnRes");
    for (int l = 0; l < f->num_layers; l++) {
        char res[32] = "";
        if (f->attn_res_block_size > 0 && k3c_model_layer_block_start(m, l))
            snprintf(res, sizeof res, "block %d start", l / f->attn_res_block_size);
        printf("  %5d  %-4s  %-5s  %s\n", l, k3c_model_layer_attention(m, l) == K3C_LAYER_KDA ? "KDA" : "MLA",
               k3c_model_layer_ffn(m, l) == K3C_LAYER_MOE ? "MoE" : "dense", res);
    }
}

static void print_params(const k3c_model_info *f) {
    char a[32], b[32], r[32], e[32];
    count(a, sizeof a, (double)f->params_total);
    count(b, sizeof b, f->params_active);
    count(r, sizeof r, (double)f->params_routed);
    count(e, sizeof e, (double)f->params_embedding);
    printf("\nparameters:\n");
    printf("  total              %llu (%s), routed experts %llu (%s), embedding %llu (%s)\n",
           (unsigned long long)f->params_total, a, (unsigned long long)f->params_routed, r,
           (unsigned long long)f->params_embedding, e);
    printf("  active per token   %.0f (%s): non-expert weights + %d/%d of the routed experts; embedding %s\n",
           f->params_active, b, f->num_experts_per_token, f->num_experts,
           f->tie_word_embeddings ? "counted (tied: it is also the LM head)" : "not counted (a row lookup)");
}

static void print_bytes(const k3c_model_info *f) {
    printf("\nbytes per dtype (model tensors as stored):\n");
    char h[32];
    for (int d = 0; d < K3C_DTYPES; d++) {
        if (!f->dtype_tensors[d]) continue;
        human(h, sizeof h, (double)f->dtype_bytes[d]);
        printf("  %-6s %8llu tensors  %16llu bytes (%s)\n", k3c_dtype_name_of(d),
               (unsigned long long)f->dtype_tensors[d], (unsigned long long)f->dtype_bytes[d], h);
    }
    if (f->num_skipped_tensors)
        printf("  skipped: %zu vision_tower./mm_projector. tensors (not part of the text model)\n",
               f->num_skipped_tensors);
}

static void print_state(const k3c_model_info *f) {
    char h1[32], h2[32];
    human(h1, sizeof h1, (double)f->mla_cache_bytes_per_token);
    human(h2, sizeof h2, (double)f->kda_state_bytes_per_request);
    printf("\ncache:\n");
    printf("  MLA KV cache per token    %llu bytes (%s): bf16 latent %d x %d MLA layers\n",
           (unsigned long long)f->mla_cache_bytes_per_token, h1, f->kv_lora_rank + f->qk_rope_head_dim,
           f->num_mla_layers);
    printf("  KDA state per request     %llu bytes (%s): %d KDA layers x (fp32 state %llu + bf16 conv window %llu)\n",
           (unsigned long long)f->kda_state_bytes_per_request, h2, f->num_kda_layers,
           (unsigned long long)f->kda_state_bytes, (unsigned long long)f->kda_conv_bytes);
}

int cmd_inspect(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
            printf("usage: k3c inspect DIR\n");
            return 0;
        }
        fprintf(stderr, "usage: k3c inspect DIR\n");
        return 2;
    }
    k3c_model *m;
    k3c_model_info f;
    if (k3c_load(argv[1], &m) != K3C_OK || k3c_model_info_get(m, &f) != K3C_OK) {
        fprintf(stderr, "k3c inspect: %s\n", cli_error());
        return 1;
    }
    printf("checkpoint %s: valid (%zu tensors checked, %d shard%s)\n", argv[1], f.num_tensors, f.num_shards,
           f.num_shards == 1 ? "" : "s");
    printf("family: %s (tensor prefix \"%s\")\n", f.family, f.tensor_prefix);
    printf("dims: hidden %d, vocab %d, layers %d (%d KDA, %d MLA; %d dense, %d MoE), experts %d (top-%d, %s)%s\n",
           f.hidden_size, f.vocab_size, f.num_layers, f.num_kda_layers, f.num_mla_layers, f.num_dense_layers,
           f.num_moe_layers, f.num_experts, f.num_experts_per_token, f.expert_dtype,
           f.attn_res_block_size > 0 ? "" : ", plain residual");
    if (f.attn_res_block_size > 0)
        printf("AttnRes: block size %d, %d blocks\n", f.attn_res_block_size, f.num_attn_res_blocks);
    print_schedule(m, &f);
    print_params(&f);
    print_bytes(&f);
    print_state(&f);
    char h1[32], h2[32], h3[32];
    human(h1, sizeof h1, (double)f.file_bytes);
    human(h2, sizeof h2, (double)f.owned_bytes);
    human(h3, sizeof h3, (double)(f.file_bytes + f.owned_bytes));
    printf("\nmemory when loaded: %s mapped (shard files) + %s owned (f32 vectors) = %s\n", h1, h2, h3);
    k3c_free(m);
    return 0;
}
