/* The public API (include/k3c.h): thin wrappers over the library's internal calls, and model inspection
 * (k3c_model_info) read from the loaded model. */
#include "k3c.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "format/dtype.h"
#include "model/config.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/log.h"

_Static_assert(K3C_DTYPE_F64 < K3C_DTYPES, "k3c_model_info's dtype arrays hold every k3c_dtype");

const char *k3c_version(void) { return K3C_VERSION_STRING; }

int k3c_has_cuda(void) {
#ifdef K3C_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

const char *k3c_last_error(void) { return k3c_error_message(); }

k3c_error_kind k3c_last_error_kind(void) { return k3c_error_kind_get(); }

const char *k3c_error_kind_name(k3c_error_kind kind) {
    switch (kind) {
    case K3C_ERROR_NONE: return "none";
    case K3C_ERROR_INPUT: return "input";
    case K3C_ERROR_OOM: return "out of memory";
    case K3C_ERROR_DEVICE: return "device";
    case K3C_ERROR_IO: return "io";
    case K3C_ERROR_INTERNAL: return "internal";
    }
    return "?";
}

int k3c_load(const char *dir, k3c_model **out) {
    if (!out) return k3c_errorf("k3c_load: NULL out");
    *out = NULL;
    if (!dir) return k3c_errorf("k3c_load: NULL directory");
    return k3c_model_load(dir, out);
}

void k3c_free(k3c_model *m) {
    if (m) k3c_model_free(m);
}

/* synth's progress as the library's progress events, for checkpoints of 64 MB or more (tiny ones finish
 * before a line would mean anything). */
typedef struct synth_meter {
    char what[96];
    double t0;
} synth_meter;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void synth_progress(void *ctx, uint64_t done, uint64_t total) {
    synth_meter *p = ctx;
    if (total < ((uint64_t)64 << 20)) return;
    k3c_progress_report(p->what, (double)done, (double)total, mono_s() - p->t0, done >= total);
}

int k3c_synthesize_threads(const char *preset, uint64_t seed, const char *dir, int threads) {
    if (!preset || !dir) return k3c_errorf("k3c_synthesize: NULL %s", preset ? "directory" : "preset");
    if (threads < 0) return k3c_errorf("k3c_synthesize: threads %d is negative", threads);
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    synth_meter pm = {.t0 = mono_s()};
    snprintf(pm.what, sizeof pm.what, "synthesizing preset %s", preset);
    k3c_synth_options so = {.threads = threads, .progress = synth_progress, .progress_ctx = &pm};
    int rc = k3c_synth_write_opts(&c, preset, seed, dir, &so);
    k3c_config_free(&c);
    return rc;
}

int k3c_synthesize(const char *preset, uint64_t seed, const char *dir) {
    return k3c_synthesize_threads(preset, seed, dir, 0);
}

int k3c_model_synthesize_device(const char *preset, uint64_t seed, k3c_model **out) {
    if (!out) return k3c_errorf("k3c_model_synthesize_device: NULL out");
    *out = NULL;
    if (!preset) return k3c_errorf("k3c_model_synthesize_device: NULL preset");
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    int rc = k3c_model_synthetic(&c, seed, out);
    k3c_config_free(&c);
    return rc;
}

const char *k3c_dtype_name_of(int dtype) {
    return dtype > K3C_DTYPE_INVALID && dtype <= K3C_DTYPE_F64 ? k3c_dtype_name((k3c_dtype)dtype) : "INVALID";
}

k3c_layer_attention k3c_model_layer_attention(const k3c_model *m, int l) {
    if (!m || l < 0 || l >= m->config.num_layers) return (k3c_layer_attention)0;
    return m->config.layer_attn[l] == K3C_ATTN_KDA ? K3C_LAYER_KDA : K3C_LAYER_MLA;
}

k3c_layer_ffn k3c_model_layer_ffn(const k3c_model *m, int l) {
    if (!m || l < 0 || l >= m->config.num_layers) return (k3c_layer_ffn)0;
    return m->config.layer_is_moe[l] ? K3C_LAYER_MOE : K3C_LAYER_DENSE;
}

int k3c_model_layer_block_start(const k3c_model *m, int l) {
    if (!m || l < 0 || l >= m->config.num_layers) return 0;
    return k3c_config_is_block_start(&m->config, l);
}

int k3c_model_info_get(const k3c_model *m, k3c_model_info *out) {
    if (!m || !out) return k3c_errorf("k3c_model_info_get: NULL %s", m ? "out" : "model");
    const k3c_config *c = &m->config;
    k3c_model_info f;
    memset(&f, 0, sizeof f);
    int k3 = c->family == K3C_FAMILY_K3;
    f.family = k3 ? "Kimi K3" : "Kimi Linear";
    f.tensor_prefix = k3 ? "language_model." : "";
    f.hidden_size = c->hidden_size;
    f.vocab_size = c->vocab_size;
    f.num_layers = c->num_layers;
    for (int l = 0; l < c->num_layers; l++) {
        if (c->layer_attn[l] == K3C_ATTN_KDA) f.num_kda_layers++;
        else f.num_mla_layers++;
        if (c->layer_is_moe[l]) f.num_moe_layers++;
        else f.num_dense_layers++;
    }
    f.num_experts = c->num_experts;
    f.num_experts_per_token = c->num_experts_per_token;
    f.num_shared_experts = c->num_shared_experts;
    f.moe_intermediate_size = c->moe_intermediate_size;
    f.intermediate_size = c->intermediate_size;
    f.expert_in = k3c_config_expert_in(c);
    f.expert_dtype = c->expert_format == K3C_EXPERTS_MXFP4 ? "MXFP4" : "BF16";
    f.num_attention_heads = c->num_attention_heads;
    f.kv_lora_rank = c->kv_lora_rank;
    f.q_lora_rank = c->q_lora_rank;
    f.qk_rope_head_dim = c->qk_rope_head_dim;
    f.v_head_dim = c->v_head_dim;
    f.kda_num_heads = c->kda_num_heads;
    f.kda_head_dim = c->kda_head_dim;
    f.kda_conv_kernel = c->kda_conv_kernel;
    f.attn_res_block_size = c->attn_res_block_size;
    f.num_attn_res_blocks = c->num_attn_res_blocks;
    f.max_position_embeddings = c->max_position_embeddings;
    f.tie_word_embeddings = c->tie_word_embeddings;
    f.bos_token_id = c->bos_token_id;
    f.eos_token_id = c->eos_token_id;
    f.pad_token_id = c->pad_token_id;

    f.num_tensors = m->inventory.count;
    f.device_synthetic = m->device_synthetic;
    if (!m->device_synthetic) {
        f.num_shards = m->checkpoint.num_shards;
        f.num_skipped_tensors =
            m->checkpoint.num_tensors > m->inventory.count ? m->checkpoint.num_tensors - m->inventory.count : 0;
        f.file_bytes = m->checkpoint.file_bytes;
    }
    f.weight_bytes = m->weight_bytes;
    f.owned_bytes = m->owned_bytes;
    for (size_t i = 0; i < m->inventory.count; i++) {
        const k3c_tensor_spec *s = &m->inventory.specs[i];
        uint64_t p = k3c_tensor_spec_params(s), b = k3c_tensor_spec_bytes(s);
        f.params_total += p;
        if (s->expert >= 0) {
            f.params_routed += p;
            f.routed_expert_bytes += b;
        }
        if (s->mat == &m->weights.embed) {
            f.params_embedding = p;
            f.embedding_bytes = b;
        }
        /* the dtype as stored in the file (a device-synthetic model: as published) */
        const k3c_st_tensor *t = m->device_synthetic ? NULL : k3c_checkpoint_find(&m->checkpoint, s->name);
        int d = t ? (int)t->dtype : (int)s->dtype;
        if (d > K3C_DTYPE_INVALID && d < K3C_DTYPES) {
            f.dtype_bytes[d] += t ? t->end - t->begin : b;
            f.dtype_tensors[d]++;
        }
    }
    /* Per token only top-k of E routed experts run; the embedding is a row lookup, not a matmul, so it is
     * left out of "active" unless tied (then it is the LM head, which does run in full). */
    f.params_active = (double)(f.params_total - f.params_routed);
    if (c->num_experts > 0) f.params_active += (double)f.params_routed * c->num_experts_per_token / c->num_experts;
    if (!c->tie_word_embeddings) f.params_active -= (double)f.params_embedding;
    /* MLA caches the bf16 latent (kv_lora + rope) per token per layer; KDA keeps an fp32 [H, dk, dv] state
     * plus a bf16 window of the last W-1 pre-conv q/k/v inputs, per request per layer. */
    f.mla_cache_bytes_per_token = (uint64_t)k3c_config_mla_latent(c) * 2 * (uint64_t)f.num_mla_layers;
    f.kda_state_bytes = (uint64_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim * 4;
    f.kda_conv_bytes = (uint64_t)(c->kda_conv_kernel > 0 ? c->kda_conv_kernel - 1 : 0) * 3 * k3c_config_kda_proj(c) * 2;
    f.kda_state_bytes_per_request = (f.kda_state_bytes + f.kda_conv_bytes) * (uint64_t)f.num_kda_layers;
    *out = f;
    return K3C_OK;
}

int k3c_tokenizer_load_preset(const char *preset, k3c_tokenizer **out) {
    if (!out || !preset) return k3c_errorf("k3c_tokenizer_load_preset: NULL %s", out ? "preset" : "out");
    *out = NULL;
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    int rc = k3c_tokenizer_default(c.family == K3C_FAMILY_K3, c.vocab_size, out);
    k3c_config_free(&c);
    return rc != K3C_OK ? k3c_error_context("preset %s", preset) : K3C_OK;
}
