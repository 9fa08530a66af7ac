/* k3c inspect DIR: loads a checkpoint with full validation, then prints its structure: family, layer
 * schedule, parameter counts (total and active per token), bytes per dtype, per-token KV cache and
 * per-request KDA state, and the loaded memory footprint. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "format/dtype.h"
#include "model/model.h"
#include "util/error.h"

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

static void print_schedule(const k3c_config *c) {
    printf("\nlayer schedule:\n  %5s  %-4s  %-5s  %s\n", "layer", "attn", "ffn", "AttnRes");
    for (int l = 0; l < c->num_layers; l++) {
        char res[32] = "";
        if (c->attn_res_block_size > 0 && k3c_config_is_block_start(c, l))
            snprintf(res, sizeof res, "block %d start", l / c->attn_res_block_size);
        printf("  %5d  %-4s  %-5s  %s\n", l, c->layer_attn[l] == K3C_ATTN_KDA ? "KDA" : "MLA",
               c->layer_is_moe[l] ? "MoE" : "dense", res);
    }
}

static void print_params(const struct k3c_model *m) {
    const k3c_config *c = &m->config;
    unsigned long long total = 0, routed = 0, embed = 0;
    for (size_t i = 0; i < m->inventory.count; i++) {
        const k3c_tensor_spec *s = &m->inventory.specs[i];
        unsigned long long p = k3c_tensor_spec_params(s);
        total += p;
        if (s->expert >= 0) routed += p;
        if (s->mat == &m->weights.embed) embed = p;
    }
    /* Per token only top-k of E routed experts run; the embedding is a row lookup, not a matmul, so it
     * is left out of "active" unless tied (then it is the LM head, which does run in full). */
    double active = (double)(total - routed);
    if (c->num_experts > 0) active += (double)routed * c->num_experts_per_token / c->num_experts;
    int embed_active = c->tie_word_embeddings;
    if (!embed_active) active -= (double)embed;
    char a[32], b[32], r[32], e[32];
    count(a, sizeof a, (double)total);
    count(b, sizeof b, active);
    count(r, sizeof r, (double)routed);
    count(e, sizeof e, (double)embed);
    printf("\nparameters:\n");
    printf("  total              %llu (%s), routed experts %llu (%s), embedding %llu (%s)\n", total, a, routed, r, embed,
           e);
    printf("  active per token   %.0f (%s): non-expert weights + %d/%d of the routed experts; embedding %s\n", active,
           b, c->num_experts_per_token, c->num_experts,
           embed_active ? "counted (tied: it is also the LM head)" : "not counted (a row lookup)");
}

static void print_bytes(const struct k3c_model *m) {
    const k3c_checkpoint *ck = &m->checkpoint;
    enum { NT = 16 };
    unsigned long long bytes[NT] = {0}, tensors[NT] = {0};
    for (size_t i = 0; i < m->inventory.count; i++) {
        const k3c_st_tensor *t = k3c_checkpoint_find(ck, m->inventory.specs[i].name);
        if (!t || (int)t->dtype < 0 || (int)t->dtype >= NT) continue;
        bytes[t->dtype] += t->end - t->begin;
        tensors[t->dtype]++;
    }
    printf("\nbytes per dtype (model tensors as stored):\n");
    char h[32];
    for (int d = 0; d < NT; d++) {
        if (!tensors[d]) continue;
        human(h, sizeof h, (double)bytes[d]);
        printf("  %-6s %8llu tensors  %16llu bytes (%s)\n", k3c_dtype_name((k3c_dtype)d), tensors[d], bytes[d], h);
    }
    size_t skipped = ck->num_tensors > m->inventory.count ? ck->num_tensors - m->inventory.count : 0;
    if (skipped) printf("  skipped: %zu vision_tower./mm_projector. tensors (not part of the text model)\n", skipped);
}

static void print_state(const struct k3c_model *m) {
    const k3c_config *c = &m->config;
    int n_kda = 0, n_mla = 0;
    for (int l = 0; l < c->num_layers; l++) {
        if (c->layer_attn[l] == K3C_ATTN_KDA)
            n_kda++;
        else
            n_mla++;
    }
    /* MLA caches the bf16 latent (kv_lora + rope) per token per layer; KDA keeps an fp32 [H, dk, dv]
     * state plus a bf16 window of the last W-1 pre-conv q/k/v inputs, per request per layer. */
    unsigned long long kv = (unsigned long long)k3c_config_mla_latent(c) * 2 * (unsigned long long)n_mla;
    unsigned long long kda_state = (unsigned long long)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim * 4;
    unsigned long long kda_conv = (unsigned long long)(c->kda_conv_kernel - 1) * 3 * k3c_config_kda_proj(c) * 2;
    unsigned long long per_req = (kda_state + kda_conv) * (unsigned long long)n_kda;
    char h1[32], h2[32];
    human(h1, sizeof h1, (double)kv);
    human(h2, sizeof h2, (double)per_req);
    printf("\ncache:\n");
    printf("  MLA KV cache per token    %llu bytes (%s): bf16 latent %d x %d MLA layers\n", kv, h1,
           k3c_config_mla_latent(c), n_mla);
    printf("  KDA state per request     %llu bytes (%s): %d KDA layers x (fp32 state %llu + bf16 conv window %llu)\n",
           per_req, h2, n_kda, kda_state, kda_conv);
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
    struct k3c_model *m;
    if (k3c_model_load(argv[1], &m) != K3C_OK) {
        fprintf(stderr, "k3c inspect: %s\n", k3c_error_message());
        return 1;
    }
    const k3c_config *c = &m->config;
    int n_kda = 0, n_moe = 0;
    for (int l = 0; l < c->num_layers; l++) {
        n_kda += c->layer_attn[l] == K3C_ATTN_KDA;
        n_moe += c->layer_is_moe[l] != 0;
    }
    printf("checkpoint %s: valid (%zu tensors checked, %d shard%s)\n", argv[1], m->inventory.count,
           m->checkpoint.num_shards, m->checkpoint.num_shards == 1 ? "" : "s");
    printf("family: %s\n", c->family == K3C_FAMILY_K3 ? "Kimi K3 (tensor prefix \"language_model.\")"
                                                      : "Kimi Linear (tensor prefix \"\")");
    printf("dims: hidden %d, vocab %d, layers %d (%d KDA, %d MLA; %d dense, %d MoE), experts %d (top-%d, %s)%s\n",
           c->hidden_size, c->vocab_size, c->num_layers, n_kda, c->num_layers - n_kda, c->num_layers - n_moe, n_moe,
           c->num_experts, c->num_experts_per_token, c->expert_format == K3C_EXPERTS_MXFP4 ? "MXFP4" : "BF16",
           c->attn_res_block_size > 0 ? "" : ", plain residual");
    if (c->attn_res_block_size > 0)
        printf("AttnRes: block size %d, %d blocks\n", c->attn_res_block_size, c->num_attn_res_blocks);
    print_schedule(c);
    print_params(m);
    print_bytes(m);
    print_state(m);
    char h1[32], h2[32], h3[32];
    human(h1, sizeof h1, (double)m->checkpoint.file_bytes);
    human(h2, sizeof h2, (double)m->owned_bytes);
    human(h3, sizeof h3, (double)(m->checkpoint.file_bytes + m->owned_bytes));
    printf("\nmemory when loaded: %s mapped (shard files) + %s owned (f32 vectors) = %s\n", h1, h2, h3);
    k3c_model_free(m);
    return 0;
}
