/* config.json <-> k3c_config for Kimi K3 (nested text_config) and Kimi Linear (flat; official
 * linear_attn_config spelling or the transformers 5.x spelling). Parsing is strict about types and names
 * every field it rejects as "<file>: <json path> = <value>: <reason>"; unknown keys are ignored (a
 * PretrainedConfig dump carries dozens of generation defaults that do not concern the engine). */
#include "format/config_json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"
#include "util/file.h"

/* ======================================================================================================
 * Reading
 * ====================================================================================================== */

/* One JSON object being read: where (file label) and prefix (json path of the object) name errors. */
typedef struct jreader {
    const cJSON *obj;
    const char *where;
    const char *prefix;
} jreader;

static void value_text(const cJSON *v, char *buf, size_t n) {
    char *s = cJSON_PrintUnformatted(v);
    if (!s) {
        snprintf(buf, n, "?");
        return;
    }
    if (strlen(s) >= n && n > 4) {
        memcpy(buf, s, n - 4);
        strcpy(buf + n - 4, "...");
    } else {
        snprintf(buf, n, "%s", s);
    }
    cJSON_free(s);
}

static int type_error(const jreader *r, const char *key, const cJSON *v, const char *expected) {
    char val[80];
    value_text(v, val, sizeof val);
    return k3c_errorf("%s: %s%s = %s: expected %s", r->where, r->prefix, key, val, expected);
}

static int missing_error(const jreader *r, const char *key) {
    return k3c_errorf("%s: %s%s: missing (required)", r->where, r->prefix, key);
}

/* NULL when absent; JSON null is returned as a null item. */
static const cJSON *jget(const jreader *r, const char *key) {
    return r->obj ? cJSON_GetObjectItemCaseSensitive(r->obj, key) : NULL;
}

static int is_absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

static int as_int(const jreader *r, const char *key, const cJSON *v, int *out) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || floor(v->valuedouble) != v->valuedouble ||
        fabs(v->valuedouble) > INT_MAX)
        return type_error(r, key, v, "an integer");
    *out = (int)v->valuedouble;
    return K3C_OK;
}

/* Integer field; null or absent gives dflt, or an error when required. */
static int read_int(const jreader *r, const char *key, int required, int dflt, int *out) {
    const cJSON *v = jget(r, key);
    if (is_absent(v)) {
        if (required) return missing_error(r, key);
        *out = dflt;
        return K3C_OK;
    }
    return as_int(r, key, v, out);
}

/* Integer field under one of two names (the transformers attribute_map aliases); the first name present
 * wins, and both present with different values is an error. */
static int read_int_alias(const jreader *r, const char *key, const char *alias, int required, int dflt, int *out) {
    const cJSON *a = jget(r, key), *b = jget(r, alias);
    if (is_absent(a) && is_absent(b)) {
        if (required) return k3c_errorf("%s: %s%s (or %s): missing (required)", r->where, r->prefix, key, alias);
        *out = dflt;
        return K3C_OK;
    }
    int va = 0, vb = 0;
    if (!is_absent(a)) K3C_TRY(as_int(r, key, a, &va));
    if (!is_absent(b)) K3C_TRY(as_int(r, alias, b, &vb));
    if (!is_absent(a) && !is_absent(b) && va != vb)
        return k3c_errorf("%s: %s%s = %d and %s%s = %d: the two names of one field disagree", r->where, r->prefix,
                          key, va, r->prefix, alias, vb);
    *out = is_absent(a) ? vb : va;
    return K3C_OK;
}

static int read_float(const jreader *r, const char *key, int required, float dflt, float *out) {
    const cJSON *v = jget(r, key);
    if (is_absent(v)) {
        if (required) return missing_error(r, key);
        *out = dflt;
        return K3C_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return type_error(r, key, v, "a number");
    *out = (float)v->valuedouble;
    return K3C_OK;
}

static int as_bool(const jreader *r, const char *key, const cJSON *v, int *out) {
    if (!cJSON_IsBool(v)) return type_error(r, key, v, "true or false");
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return K3C_OK;
}

static int read_bool(const jreader *r, const char *key, int dflt, int *out) {
    const cJSON *v = jget(r, key);
    if (is_absent(v)) {
        *out = dflt;
        return K3C_OK;
    }
    return as_bool(r, key, v, out);
}

static int read_bool_alias(const jreader *r, const char *key, const char *alias, int dflt, int *out) {
    const cJSON *a = jget(r, key), *b = jget(r, alias);
    if (is_absent(a) && is_absent(b)) {
        *out = dflt;
        return K3C_OK;
    }
    int va = 0, vb = 0;
    if (!is_absent(a)) K3C_TRY(as_bool(r, key, a, &va));
    if (!is_absent(b)) K3C_TRY(as_bool(r, alias, b, &vb));
    if (!is_absent(a) && !is_absent(b) && va != vb)
        return k3c_errorf("%s: %s%s = %s and %s%s = %s: the two names of one field disagree", r->where, r->prefix,
                          key, va ? "true" : "false", r->prefix, alias, vb ? "true" : "false");
    *out = is_absent(a) ? vb : va;
    return K3C_OK;
}

/* String field; *out = NULL when absent or null. */
static int read_string(const jreader *r, const char *key, const char **out) {
    const cJSON *v = jget(r, key);
    *out = NULL;
    if (is_absent(v)) return K3C_OK;
    if (!cJSON_IsString(v)) return type_error(r, key, v, "a string");
    *out = v->valuestring;
    return K3C_OK;
}

/* Token id: an integer, null (-1), or a list (transformers allows eos_token_id lists: the first is used). */
static int read_token_id(const jreader *r, const char *key, int *out, int *present) {
    const cJSON *v = jget(r, key);
    *present = v != NULL;
    if (!v) return K3C_OK;
    if (cJSON_IsNull(v)) {
        *out = -1;
        return K3C_OK;
    }
    if (cJSON_IsArray(v)) {
        const cJSON *first = cJSON_GetArrayItem(v, 0);
        if (!first) {
            *out = -1;
            return K3C_OK;
        }
        return as_int(r, key, first, out);
    }
    return as_int(r, key, v, out);
}

/* ---- layer schedule ---- */

/* Marks the 1-based layer numbers of list `key` with `kind` in attn[] (0 = unset so far). */
static int mark_layer_list(const jreader *r, const char *key, const cJSON *list, int num_layers, k3c_attn_kind kind,
                           k3c_attn_kind *attn, const char *other_key) {
    if (!cJSON_IsArray(list)) return type_error(r, key, list, "a list of 1-based layer numbers");
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        char name[96];
        snprintf(name, sizeof name, "%s[%d]", key, i);
        int layer = 0;
        K3C_TRY(as_int(r, name, e, &layer));
        if (layer < 1 || layer > num_layers)
            return k3c_errorf("%s: %s%s = %d: outside 1..%d (1-based layer numbers, num_hidden_layers = %d)",
                              r->where, r->prefix, name, layer, num_layers, num_layers);
        if (attn[layer - 1] == kind)
            return k3c_errorf("%s: %s%s = %d: layer listed twice", r->where, r->prefix, name, layer);
        if (attn[layer - 1] != 0)
            return k3c_errorf("%s: %s%s = %d: layer is in both %s and %s", r->where, r->prefix, name, layer, key,
                              other_key);
        attn[layer - 1] = kind;
    }
    return K3C_OK;
}

static int schedule_from_lists(const jreader *lr, const cJSON *kda, const cJSON *full, int num_layers,
                               k3c_attn_kind *attn) {
    memset(attn, 0, sizeof *attn * (size_t)num_layers);
    K3C_TRY(mark_layer_list(lr, "kda_layers", kda, num_layers, K3C_ATTN_KDA, attn, "full_attn_layers"));
    K3C_TRY(mark_layer_list(lr, "full_attn_layers", full, num_layers, K3C_ATTN_MLA, attn, "kda_layers"));
    for (int l = 0; l < num_layers; l++)
        if (attn[l] == 0)
            return k3c_errorf("%s: %skda_layers / full_attn_layers: layer %d (1-based) is in neither list", lr->where,
                              lr->prefix, l + 1);
    return K3C_OK;
}

/* A list of num_layers strings, each one of two names (value 1 for `one`, 0 for `zero`). */
static int read_string_schedule(const jreader *r, const char *key, const cJSON *list, int num_layers,
                                const char *one, const char *zero, uint8_t *out) {
    if (!cJSON_IsArray(list)) return type_error(r, key, list, "a list of strings");
    int n = cJSON_GetArraySize(list);
    if (n != num_layers)
        return k3c_errorf("%s: %s%s: %d entries, but num_hidden_layers = %d", r->where, r->prefix, key, n, num_layers);
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        char name[64];
        snprintf(name, sizeof name, "%s[%d]", key, i);
        if (!cJSON_IsString(e)) return type_error(r, name, e, "a string");
        if (strcmp(e->valuestring, one) == 0)
            out[i] = 1;
        else if (strcmp(e->valuestring, zero) == 0)
            out[i] = 0;
        else
            return k3c_errorf("%s: %s%s = \"%s\": unknown (expected \"%s\" or \"%s\")", r->where, r->prefix, name,
                              e->valuestring, one, zero);
    }
    return K3C_OK;
}

/* ---- quantization_config (compressed-tensors MXFP4, routed experts only) ---- */

static int read_quantization(const jreader *r, const cJSON *qc, k3c_config *c) {
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%squantization_config.", r->prefix);
    jreader q = {qc, r->where, prefix};
    if (!cJSON_IsObject(qc)) return type_error(r, "quantization_config", qc, "an object");
    const char *method = NULL, *format = NULL;
    K3C_TRY(read_string(&q, "quant_method", &method));
    if (method && strcmp(method, "compressed-tensors") != 0)
        return k3c_errorf("%s: %squant_method = \"%s\": unsupported quantization (only compressed-tensors MXFP4)",
                          r->where, prefix, method);
    K3C_TRY(read_string(&q, "format", &format));
    if (format && strcmp(format, "mxfp4-pack-quantized") != 0)
        return k3c_errorf("%s: %sformat = \"%s\": unsupported quantization format (only mxfp4-pack-quantized)",
                          r->where, prefix, format);
    const cJSON *groups = jget(&q, "config_groups");
    if (is_absent(groups)) return missing_error(&q, "config_groups");
    if (!cJSON_IsObject(groups) || !groups->child) return type_error(&q, "config_groups", groups, "a non-empty object");
    for (const cJSON *g = groups->child; g; g = g->next) {
        char gprefix[192];
        snprintf(gprefix, sizeof gprefix, "%sconfig_groups.%s.", prefix, g->string);
        jreader gr = {g, r->where, gprefix};
        if (!cJSON_IsObject(g)) return type_error(&q, "config_groups", g, "an object per group");
        const char *gformat = NULL;
        K3C_TRY(read_string(&gr, "format", &gformat));
        if (gformat && strcmp(gformat, "mxfp4-pack-quantized") != 0)
            return k3c_errorf("%s: %sformat = \"%s\": unsupported quantization format (only mxfp4-pack-quantized)",
                              r->where, gprefix, gformat);
        if (!gformat && !format) return missing_error(&q, "format");
        const cJSON *w = jget(&gr, "weights");
        if (is_absent(w)) return missing_error(&gr, "weights");
        if (!cJSON_IsObject(w)) return type_error(&gr, "weights", w, "an object");
        char wprefix[224];
        snprintf(wprefix, sizeof wprefix, "%sweights.", gprefix);
        jreader wr = {w, r->where, wprefix};
        int bits = 0, group = 0;
        K3C_TRY(read_int(&wr, "num_bits", 1, 0, &bits));
        K3C_TRY(read_int(&wr, "group_size", 1, 0, &group));
        if (bits != 4)
            return k3c_errorf("%s: %snum_bits = %d: unsupported (MXFP4 is 4 bits)", r->where, wprefix, bits);
        if (group != 32)
            return k3c_errorf("%s: %sgroup_size = %d: unsupported (MXFP4 groups are 32)", r->where, wprefix, group);
        const char *type = NULL, *strategy = NULL;
        K3C_TRY(read_string(&wr, "type", &type));
        if (type && strcmp(type, "float") != 0)
            return k3c_errorf("%s: %stype = \"%s\": unsupported (MXFP4 is type float)", r->where, wprefix, type);
        K3C_TRY(read_string(&wr, "strategy", &strategy));
        if (strategy && strcmp(strategy, "group") != 0)
            return k3c_errorf("%s: %sstrategy = \"%s\": unsupported (MXFP4 is strategy group)", r->where, wprefix,
                              strategy);
        c->mxfp4_group_size = group;
    }
    c->expert_format = K3C_EXPERTS_MXFP4;
    return K3C_OK;
}

/* ---- the decoder config (K3's text_config, or the whole flat Kimi Linear config) ---- */

static int read_decoder(const jreader *r, const cJSON *root, k3c_config *c) {
    const int k3 = c->family == K3C_FAMILY_K3;
    const char *s = NULL;

    /* dimensions */
    K3C_TRY(read_int(r, "vocab_size", 1, 0, &c->vocab_size));
    K3C_TRY(read_int(r, "hidden_size", 1, 0, &c->hidden_size));
    K3C_TRY(read_int(r, "num_hidden_layers", 1, 0, &c->num_layers));
    if (c->num_layers <= 0 || c->num_layers > 100000)
        return k3c_errorf("%s: %snum_hidden_layers = %d: must be in 1..100000", r->where, r->prefix, c->num_layers);
    K3C_TRY(read_float(r, "rms_norm_eps", 0, 1e-5f, &c->rms_norm_eps));
    c->mla_lora_norm_eps = 1e-6f; /* spec §9.1: q_a/kv_a_layernorm use the class default, not rms_norm_eps */
    K3C_TRY(read_bool(r, "tie_word_embeddings", 0, &c->tie_word_embeddings));
    K3C_TRY(read_int_alias(r, "max_position_embeddings", "model_max_length", 0, 1048576, &c->max_position_embeddings));
    int nextn = 0;
    K3C_TRY(read_int(r, "num_nextn_predict_layers", 0, 0, &nextn));
    if (nextn != 0)
        return k3c_errorf("%s: %snum_nextn_predict_layers = %d: MTP layers are not supported", r->where, r->prefix,
                          nextn);

    /* activation */
    K3C_TRY(read_string(r, "hidden_act", &s));
    if (!s) s = k3 ? "situ" : "silu";
    if (strcmp(s, "silu") == 0) {
        c->hidden_act = K3C_ACT_SILU;
    } else if (strcmp(s, "situ") == 0) {
        c->hidden_act = K3C_ACT_SITU;
    } else {
        return k3c_errorf("%s: %shidden_act = \"%s\": unknown activation (supported: silu, situ)", r->where, r->prefix,
                          s);
    }
    if (c->hidden_act == K3C_ACT_SITU) {
        K3C_TRY(read_float(r, "activation_situ_beta", 0, 4.0f, &c->situ_beta));
        const cJSON *lb = jget(r, "activation_situ_linear_beta");
        if (lb && cJSON_IsNull(lb))
            c->situ_linear_beta = 0; /* null: the up projection passes through */
        else
            K3C_TRY(read_float(r, "activation_situ_linear_beta", 0, 25.0f, &c->situ_linear_beta));
    } else {
        c->situ_beta = 0;
        c->situ_linear_beta = 0;
    }

    /* residual stream */
    K3C_TRY(read_int(r, "attn_res_block_size", 0, k3 ? 12 : 0, &c->attn_res_block_size));
    if (c->attn_res_block_size < 0)
        return k3c_errorf("%s: %sattn_res_block_size = %d: must not be negative", r->where, r->prefix,
                          c->attn_res_block_size);
    c->num_attn_res_blocks = k3c_config_attn_res_blocks(c->num_layers, c->attn_res_block_size);

    /* KDA: linear_attn_config (official) or linear_* (transformers 5.x) */
    const cJSON *lac = jget(r, "linear_attn_config");
    if (lac && !cJSON_IsNull(lac) && !cJSON_IsObject(lac)) return type_error(r, "linear_attn_config", lac, "an object");
    if (lac && cJSON_IsNull(lac)) lac = NULL;
    char lprefix[128];
    snprintf(lprefix, sizeof lprefix, "%slinear_attn_config.", r->prefix);
    jreader lr = {lac, r->where, lprefix};
    if (k3 && !lac) return missing_error(r, "linear_attn_config");
    if (!is_absent(jget(&lr, "num_heads")))
        K3C_TRY(read_int(&lr, "num_heads", 1, 0, &c->kda_num_heads));
    else if (k3)
        return missing_error(&lr, "num_heads");
    else
        K3C_TRY(read_int(r, "linear_num_heads", 1, 0, &c->kda_num_heads));
    if (!is_absent(jget(&lr, "head_dim")))
        K3C_TRY(read_int(&lr, "head_dim", 1, 0, &c->kda_head_dim));
    else if (k3)
        return missing_error(&lr, "head_dim");
    else
        K3C_TRY(read_int(r, "linear_head_dim", 1, 0, &c->kda_head_dim));
    if (!is_absent(jget(&lr, "short_conv_kernel_size")))
        K3C_TRY(read_int(&lr, "short_conv_kernel_size", 1, 0, &c->kda_conv_kernel));
    else
        K3C_TRY(read_int(r, "linear_conv_kernel_dim", 0, 4, &c->kda_conv_kernel));
    K3C_TRY(read_bool(&lr, "use_full_rank_gate", k3, &c->kda_full_rank_gate));
    const cJSON *lb = jget(&lr, "gate_lower_bound");
    if (!lb) {
        c->kda_has_lower_bound = k3;
        c->kda_gate_lower_bound = k3 ? -5.0f : 0.0f;
    } else if (cJSON_IsNull(lb)) {
        c->kda_has_lower_bound = 0;
        c->kda_gate_lower_bound = 0;
    } else {
        c->kda_has_lower_bound = 1;
        K3C_TRY(read_float(&lr, "gate_lower_bound", 1, 0, &c->kda_gate_lower_bound));
    }
    c->kda_a_log_padded = k3; /* storage fact of the family: K3 pads A_log to [128], Kimi Linear has [1,1,H,1] */

    /* attention schedule: layer_types and/or linear_attn_config.{kda,full_attn}_layers */
    c->layer_attn = calloc((size_t)c->num_layers, sizeof *c->layer_attn);
    c->layer_is_moe = calloc((size_t)c->num_layers, 1);
    if (!c->layer_attn || !c->layer_is_moe) return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory for %d layers", c->num_layers);
    const cJSON *kda = jget(&lr, "kda_layers"), *full = jget(&lr, "full_attn_layers");
    const cJSON *types = jget(r, "layer_types");
    int have_lists = !is_absent(kda) || !is_absent(full);
    if (have_lists && (is_absent(kda) || is_absent(full)))
        return missing_error(&lr, is_absent(kda) ? "kda_layers" : "full_attn_layers");
    if (have_lists) {
        K3C_TRY(schedule_from_lists(&lr, kda, full, c->num_layers, c->layer_attn));
        c->layer_spelling = K3C_LAYERS_LINEAR_ATTN_CONFIG;
    }
    if (!is_absent(types)) {
        uint8_t *is_linear = malloc((size_t)c->num_layers);
        if (!is_linear) return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory for %d layers", c->num_layers);
        int rc = read_string_schedule(r, "layer_types", types, c->num_layers, "linear_attention", "full_attention",
                                      is_linear);
        for (int l = 0; rc == K3C_OK && l < c->num_layers; l++) {
            k3c_attn_kind kind = is_linear[l] ? K3C_ATTN_KDA : K3C_ATTN_MLA;
            if (have_lists && c->layer_attn[l] != kind)
                rc = k3c_errorf("%s: %slayer_types[%d] = \"%s\": disagrees with %skda_layers / full_attn_layers",
                                r->where, r->prefix, l, is_linear[l] ? "linear_attention" : "full_attention", lprefix);
            c->layer_attn[l] = kind;
        }
        free(is_linear);
        K3C_TRY(rc);
        if (!have_lists) c->layer_spelling = K3C_LAYERS_LAYER_TYPES;
    }
    if (!have_lists && is_absent(types)) {
        if (k3) return missing_error(&lr, "kda_layers");
        return k3c_errorf("%s: %slayer_types (or linear_attn_config.kda_layers / full_attn_layers): missing (required)",
                          r->where, r->prefix);
    }
    if (k3 && !have_lists) return missing_error(&lr, "kda_layers");

    /* FFN schedule: mlp_layer_types (transformers 5.x) or first_k_dense_replace / moe_layer_freq */
    const cJSON *mlp = jget(r, "mlp_layer_types");
    K3C_TRY(read_int(r, "moe_layer_freq", 0, 1, &c->moe_layer_freq));
    if (c->moe_layer_freq <= 0)
        return k3c_errorf("%s: %smoe_layer_freq = %d: must be positive", r->where, r->prefix, c->moe_layer_freq);
    if (!is_absent(mlp)) {
        K3C_TRY(read_string_schedule(r, "mlp_layer_types", mlp, c->num_layers, "sparse", "dense", c->layer_is_moe));
        int leading_dense = 0;
        while (leading_dense < c->num_layers && !c->layer_is_moe[leading_dense]) leading_dense++;
        K3C_TRY(read_int(r, "first_k_dense_replace", 0, leading_dense, &c->first_k_dense_replace));
    } else {
        K3C_TRY(read_int(r, "first_k_dense_replace", 0, 1, &c->first_k_dense_replace));
        if (c->first_k_dense_replace < 0)
            return k3c_errorf("%s: %sfirst_k_dense_replace = %d: must not be negative", r->where, r->prefix,
                              c->first_k_dense_replace);
        for (int l = 0; l < c->num_layers; l++)
            c->layer_is_moe[l] = (uint8_t)k3c_config_rule_is_moe(c->first_k_dense_replace, c->moe_layer_freq, l);
    }
    K3C_TRY(read_int(r, "intermediate_size", 1, 0, &c->intermediate_size));

    /* MoE */
    K3C_TRY(read_int_alias(r, "num_experts", "num_local_experts", 1, 0, &c->num_experts));
    K3C_TRY(read_int_alias(r, "num_experts_per_token", "num_experts_per_tok", 1, 0, &c->num_experts_per_token));
    K3C_TRY(read_int_alias(r, "num_shared_experts", "n_shared_experts", 0, k3 ? 2 : 1, &c->num_shared_experts));
    K3C_TRY(read_int(r, "moe_intermediate_size", 1, 0, &c->moe_intermediate_size));
    K3C_TRY(read_int(r, "routed_expert_hidden_size", k3, 0, &c->routed_expert_hidden_size));
    K3C_TRY(read_bool(r, "latent_moe_use_norm", k3, &c->latent_moe_use_norm));
    K3C_TRY(read_string(r, "moe_router_activation_func", &s));
    if (!s || strcmp(s, "sigmoid") == 0)
        c->router_sigmoid = 1;
    else if (strcmp(s, "softmax") == 0)
        c->router_sigmoid = 0;
    else
        return k3c_errorf("%s: %smoe_router_activation_func = \"%s\": unknown router activation (sigmoid, softmax)",
                          r->where, r->prefix, s);
    K3C_TRY(read_string(r, "topk_method", &s));
    if (!s || strcmp(s, "noaux_tc") == 0)
        c->use_correction_bias = 1;
    else if (strcmp(s, "greedy") == 0 || strcmp(s, "group_limited_greedy") == 0)
        c->use_correction_bias = 0;
    else
        return k3c_errorf("%s: %stopk_method = \"%s\": unknown (noaux_tc, greedy, group_limited_greedy)", r->where,
                          r->prefix, s);
    /* transformers' Kimi Linear always selects on score + e_score_correction_bias, whatever topk_method says. */
    if (!k3) c->use_correction_bias = 1;
    K3C_TRY(read_bool(r, "use_grouped_topk", 1, &c->use_grouped_topk));
    K3C_TRY(read_int_alias(r, "num_expert_group", "n_group", 0, 1, &c->num_expert_group));
    K3C_TRY(read_int(r, "topk_group", 0, 1, &c->topk_group));
    K3C_TRY(read_bool_alias(r, "moe_renormalize", "norm_topk_prob", 1, &c->moe_renormalize));
    K3C_TRY(read_float(r, "routed_scaling_factor", 0, k3 ? 1.0f : 2.446f, &c->routed_scaling_factor));
    c->expert_format = K3C_EXPERTS_BF16;
    c->mxfp4_group_size = 0;
    const cJSON *qc = jget(r, "quantization_config");
    jreader root_reader = {root, r->where, ""};
    if (is_absent(qc) && root != r->obj) {
        qc = jget(&root_reader, "quantization_config");
        if (!is_absent(qc)) K3C_TRY(read_quantization(&root_reader, qc, c));
    } else if (!is_absent(qc)) {
        K3C_TRY(read_quantization(r, qc, c));
    }

    /* MLA (NoPE) */
    K3C_TRY(read_int(r, "num_attention_heads", 1, 0, &c->num_attention_heads));
    K3C_TRY(read_int(r, "num_key_value_heads", 0, c->num_attention_heads, &c->num_key_value_heads));
    K3C_TRY(read_int(r, "q_lora_rank", 0, 0, &c->q_lora_rank)); /* null: plain q_proj */
    K3C_TRY(read_int(r, "kv_lora_rank", 1, 0, &c->kv_lora_rank));
    K3C_TRY(read_int(r, "qk_nope_head_dim", 1, 0, &c->qk_nope_head_dim));
    K3C_TRY(read_int(r, "qk_rope_head_dim", 1, 0, &c->qk_rope_head_dim));
    K3C_TRY(read_int(r, "v_head_dim", 1, 0, &c->v_head_dim));
    K3C_TRY(read_bool(r, "mla_use_output_gate", k3, &c->mla_use_output_gate));
    int nope = 1;
    K3C_TRY(read_bool(r, "mla_use_nope", 1, &nope));
    if (!nope && c->qk_rope_head_dim > 0) {
        /* rope_theta / rope_scaling alone are transformers load-time defaults and mean nothing under NoPE;
         * only an explicit mla_use_nope = false asks for rotation, which k3c does not implement. */
        const char *param = !is_absent(jget(r, "rope_scaling"))      ? ", rope_scaling present"
                            : !is_absent(jget(r, "rope_parameters")) ? ", rope_parameters present"
                            : !is_absent(jget(r, "rope_theta"))      ? ", rope_theta present"
                                                                     : "";
        return k3c_errorf("%s: %smla_use_nope = false: rope not supported (qk_rope_head_dim = %d%s; k3c's MLA is NoPE)",
                          r->where, r->prefix, c->qk_rope_head_dim, param);
    }
    return K3C_OK;
}

static int read_token_ids(const jreader *tc, const jreader *top, k3c_config *c) {
    const char *names[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    int *dst[3] = {&c->bos_token_id, &c->eos_token_id, &c->pad_token_id};
    for (int i = 0; i < 3; i++) {
        int present = 0;
        *dst[i] = -1;
        K3C_TRY(read_token_id(tc, names[i], dst[i], &present));
        if (!present && top && top->obj != tc->obj) K3C_TRY(read_token_id(top, names[i], dst[i], &present));
    }
    return K3C_OK;
}

int k3c_config_parse_json(const char *json, size_t len, const char *where, k3c_config *out) {
    memset(out, 0, sizeof *out);
    if (!where) where = "config.json";
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return k3c_errorf("%s: not valid JSON (near byte %zu of %zu)", where, at, len);
    }
    int rc = K3C_OK;
    k3c_config c = {0};
    jreader top = {root, where, ""};
    const char *model_type = NULL;
    if (!cJSON_IsObject(root)) {
        rc = k3c_errorf("%s: top level is not a JSON object", where);
        goto done;
    }
    if ((rc = read_string(&top, "model_type", &model_type)) != K3C_OK) goto done;
    if (!model_type) {
        rc = missing_error(&top, "model_type");
        goto done;
    }
    jreader tc = top;
    if (strcmp(model_type, "kimi_k3") == 0) {
        c.family = K3C_FAMILY_K3;
        const cJSON *text = jget(&top, "text_config");
        if (is_absent(text)) {
            rc = missing_error(&top, "text_config");
            goto done;
        }
        if (!cJSON_IsObject(text)) {
            rc = type_error(&top, "text_config", text, "an object");
            goto done;
        }
        tc = (jreader){text, where, "text_config."};
        const char *inner = NULL;
        if ((rc = read_string(&tc, "model_type", &inner)) != K3C_OK) goto done;
        if (inner && strcmp(inner, "kimi_linear") != 0) {
            rc = k3c_errorf("%s: text_config.model_type = \"%s\": expected \"kimi_linear\"", where, inner);
            goto done;
        }
    } else if (strcmp(model_type, "kimi_linear") == 0) {
        c.family = K3C_FAMILY_KIMI_LINEAR;
    } else {
        rc = k3c_errorf("%s: model_type = \"%s\": unsupported (kimi_k3, kimi_linear)", where, model_type);
        goto done;
    }
    c.layer_spelling = K3C_LAYERS_LINEAR_ATTN_CONFIG;
    if ((rc = read_decoder(&tc, root, &c)) != K3C_OK) goto done;
    if ((rc = read_token_ids(&tc, &top, &c)) != K3C_OK) goto done;
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s: %s", where, tc.prefix);
    rc = k3c_config_validate_named(&c, prefix);
done:
    cJSON_Delete(root);
    if (rc != K3C_OK) {
        k3c_config_free(&c);
        return K3C_ERR;
    }
    *out = c;
    return K3C_OK;
}

int k3c_config_load(const char *path, k3c_config *out) {
    char *buf = NULL;
    size_t n = 0;
    /* A config.json is a few KB; K3's is ~10 KB. Refuse absurd sizes instead of reading them. */
    if (k3c_read_file(path, (size_t)64 << 20, &buf, &n) != K3C_OK) return K3C_ERR;
    int rc = k3c_config_parse_json(buf, n, path, out);
    free(buf);
    return rc;
}

/* ======================================================================================================
 * Writing: Python's json.dumps(indent=2, sort_keys=True) layout, as save_pretrained writes it.
 * Floats are cJSON raw items holding their shortest float32 repr (so a written config reads back to the
 * same float), always with a '.' or exponent as Python prints floats.
 * ====================================================================================================== */

static void float_text(float v, char *buf, size_t n) {
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, n, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", n - strlen(buf) - 1);
}

typedef struct jbuild {
    int failed;
} jbuild;

static cJSON *checked(jbuild *b, cJSON *item) {
    if (!item) b->failed = 1;
    return item;
}

static void put(jbuild *b, cJSON *obj, const char *key, cJSON *item) {
    if (!item || !obj) {
        b->failed = 1;
        cJSON_Delete(item);
        return;
    }
    if (!cJSON_AddItemToObject(obj, key, item)) {
        b->failed = 1;
        cJSON_Delete(item);
    }
}

static void put_int(jbuild *b, cJSON *obj, const char *key, int v) { put(b, obj, key, cJSON_CreateNumber(v)); }
static void put_int_or_null(jbuild *b, cJSON *obj, const char *key, int v, int is_null) {
    put(b, obj, key, is_null ? cJSON_CreateNull() : cJSON_CreateNumber(v));
}
static void put_bool(jbuild *b, cJSON *obj, const char *key, int v) { put(b, obj, key, cJSON_CreateBool(v != 0)); }
static void put_str(jbuild *b, cJSON *obj, const char *key, const char *v) { put(b, obj, key, cJSON_CreateString(v)); }
static void put_float(jbuild *b, cJSON *obj, const char *key, float v) {
    char text[48];
    float_text(v, text, sizeof text);
    put(b, obj, key, cJSON_CreateRaw(text));
}
static void put_str_list(jbuild *b, cJSON *obj, const char *key, const char *const *v, int n) {
    cJSON *a = checked(b, cJSON_CreateArray());
    for (int i = 0; a && i < n; i++)
        if (!cJSON_AddItemToArray(a, checked(b, cJSON_CreateString(v[i])))) b->failed = 1;
    put(b, obj, key, a);
}

/* Sorts object keys recursively (json.dumps(sort_keys=True)); arrays keep their order. */
static void sort_keys(cJSON *node) {
    if (!node) return;
    for (cJSON *ch = node->child; ch; ch = ch->next) sort_keys(ch);
    if (!cJSON_IsObject(node) || !node->child) return;
    /* insertion sort on the linked list: configs have ~100 keys */
    cJSON *sorted = NULL;
    cJSON *item = node->child;
    while (item) {
        cJSON *next = item->next;
        item->next = item->prev = NULL;
        if (!sorted || strcmp(item->string, sorted->string) < 0) {
            item->next = sorted;
            sorted = item;
        } else {
            cJSON *p = sorted;
            while (p->next && strcmp(p->next->string, item->string) <= 0) p = p->next;
            item->next = p->next;
            p->next = item;
        }
        item = next;
    }
    /* cJSON's list: prev links, and child->prev points at the last item */
    cJSON *last = NULL;
    for (cJSON *p = sorted; p; p = p->next) {
        p->prev = last;
        last = p;
    }
    sorted->prev = last;
    node->child = sorted;
}

typedef struct sbuf {
    char *data;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_put(sbuf *s, const char *text, size_t n) {
    if (s->failed) return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (s->len + n + 1 > cap) cap *= 2;
        char *d = realloc(s->data, cap);
        if (!d) {
            s->failed = 1;
            return;
        }
        s->data = d;
        s->cap = cap;
    }
    memcpy(s->data + s->len, text, n);
    s->len += n;
    s->data[s->len] = 0;
}
static void sb_str(sbuf *s, const char *text) { sb_put(s, text, strlen(text)); }
static void sb_indent(sbuf *s, int depth) {
    for (int i = 0; i < depth; i++) sb_put(s, "  ", 2);
}

/* JSON string with Python's ensure_ascii escaping (bytes >= 0x80 are passed as \u00XX of each byte:
 * k3c only writes ASCII keys and values). */
static void sb_json_string(sbuf *s, const char *v) {
    sb_put(s, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': sb_str(s, "\\\""); break;
        case '\\': sb_str(s, "\\\\"); break;
        case '\n': sb_str(s, "\\n"); break;
        case '\r': sb_str(s, "\\r"); break;
        case '\t': sb_str(s, "\\t"); break;
        case '\b': sb_str(s, "\\b"); break;
        case '\f': sb_str(s, "\\f"); break;
        default:
            if (*p < 0x20 || *p >= 0x7f) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                sb_str(s, esc);
            } else {
                sb_put(s, (const char *)p, 1);
            }
        }
    }
    sb_put(s, "\"", 1);
}

static void print_node(sbuf *s, const cJSON *n, int depth) {
    if (cJSON_IsObject(n) || cJSON_IsArray(n)) {
        int obj = cJSON_IsObject(n);
        if (!n->child) {
            sb_str(s, obj ? "{}" : "[]");
            return;
        }
        sb_str(s, obj ? "{\n" : "[\n");
        for (const cJSON *ch = n->child; ch; ch = ch->next) {
            sb_indent(s, depth + 1);
            if (obj) {
                sb_json_string(s, ch->string);
                sb_str(s, ": ");
            }
            print_node(s, ch, depth + 1);
            sb_str(s, ch->next ? ",\n" : "\n");
        }
        sb_indent(s, depth);
        sb_str(s, obj ? "}" : "]");
    } else if (cJSON_IsRaw(n)) {
        sb_str(s, n->valuestring);
    } else if (cJSON_IsString(n)) {
        sb_json_string(s, n->valuestring);
    } else if (cJSON_IsNumber(n)) {
        char num[32];
        snprintf(num, sizeof num, "%.0f", n->valuedouble); /* numbers we create are integers */
        sb_str(s, num);
    } else if (cJSON_IsBool(n)) {
        sb_str(s, cJSON_IsTrue(n) ? "true" : "false");
    } else {
        sb_str(s, "null");
    }
}

/* 1-based layer lists of linear_attn_config. */
static cJSON *layer_list(jbuild *b, const k3c_config *c, k3c_attn_kind kind) {
    cJSON *a = checked(b, cJSON_CreateArray());
    for (int l = 0; a && l < c->num_layers; l++)
        if (c->layer_attn[l] == kind && !cJSON_AddItemToArray(a, checked(b, cJSON_CreateNumber(l + 1)))) b->failed = 1;
    return a;
}

static int check_moe_rule(const k3c_config *c, const char *form) {
    for (int l = 0; l < c->num_layers; l++)
        if (c->layer_is_moe[l] != k3c_config_rule_is_moe(c->first_k_dense_replace, c->moe_layer_freq, l))
            return k3c_errorf("writing %s config.json: layer %d is %s, which first_k_dense_replace = %d / "
                              "moe_layer_freq = %d cannot express",
                              form, l, c->layer_is_moe[l] ? "MoE" : "dense", c->first_k_dense_replace,
                              c->moe_layer_freq);
    return K3C_OK;
}

/* The compressed-tensors block exactly as K3's released config.json has it. */
static cJSON *quantization_block(jbuild *b) {
    cJSON *q = checked(b, cJSON_CreateObject());
    cJSON *groups = checked(b, cJSON_CreateObject());
    cJSON *g0 = checked(b, cJSON_CreateObject());
    cJSON *w = checked(b, cJSON_CreateObject());
    put_str(b, g0, "format", "mxfp4-pack-quantized");
    put(b, g0, "input_activations", cJSON_CreateNull());
    put(b, g0, "output_activations", cJSON_CreateNull());
    static const char *const targets[] = {"Linear"};
    put_str_list(b, g0, "targets", targets, 1);
    put(b, w, "actorder", cJSON_CreateNull());
    put(b, w, "block_structure", cJSON_CreateNull());
    put_bool(b, w, "dynamic", 0);
    put_int(b, w, "group_size", 32);
    put_int(b, w, "num_bits", 4);
    put_str(b, w, "observer", "minmax");
    put(b, w, "observer_kwargs", cJSON_CreateObject());
    put_str(b, w, "scale_dtype", "torch.uint8");
    put_str(b, w, "strategy", "group");
    put_bool(b, w, "symmetric", 1);
    put_str(b, w, "type", "float");
    put(b, w, "zp_dtype", cJSON_CreateNull());
    put(b, g0, "weights", w);
    put(b, groups, "group_0", g0);
    put(b, q, "config_groups", groups);
    put_str(b, q, "format", "mxfp4-pack-quantized");
    put(b, q, "global_compression_ratio", cJSON_CreateNull());
    static const char *const ignore[] = {
        "re:.*self_attn.*",    "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        "re:.*lm_head.*",      "re:.*vision_tower.*",   "re:.*mm_projector.*",
    };
    put_str_list(b, q, "ignore", ignore, 6);
    put(b, q, "kv_cache_scheme", cJSON_CreateNull());
    put_str(b, q, "quant_method", "compressed-tensors");
    put_str(b, q, "quantization_status", "compressed");
    return q;
}

static void put_token_ids(jbuild *b, cJSON *obj, const k3c_config *c) {
    put_int_or_null(b, obj, "bos_token_id", c->bos_token_id, c->bos_token_id < 0);
    put_int_or_null(b, obj, "eos_token_id", c->eos_token_id, c->eos_token_id < 0);
    put_int_or_null(b, obj, "pad_token_id", c->pad_token_id, c->pad_token_id < 0);
}

/* The official decoder spelling: K3's text_config, or a flat Kimi Linear config in the released
 * Kimi-Linear-48B-A3B form. Keys whose value is the Kimi Linear default are left out of the flat form so it
 * looks like the released file; K3's text_config always carries every engine-relevant key. */
static int official_decoder(jbuild *b, cJSON *o, const k3c_config *c) {
    const int k3 = c->family == K3C_FAMILY_K3;
    const char *form = k3 ? "K3" : "Kimi Linear (linear_attn_config)";
    K3C_TRY(check_moe_rule(c, form));
    if (!c->use_correction_bias && !k3)
        return k3c_errorf("writing %s config.json: Kimi Linear always uses the correction bias (topk_method noaux_tc)",
                          form);
    static const char *const arch[] = {"KimiLinearForCausalLM"};
    put_str_list(b, o, "architectures", arch, 1);
    put_str(b, o, "model_type", "kimi_linear");
    put_str(b, o, "dtype", "bfloat16");
    put_token_ids(b, o, c);
    put_int(b, o, "vocab_size", c->vocab_size);
    put_int(b, o, "hidden_size", c->hidden_size);
    put_int(b, o, "num_hidden_layers", c->num_layers);
    put_float(b, o, "rms_norm_eps", c->rms_norm_eps);
    put_bool(b, o, "tie_word_embeddings", c->tie_word_embeddings);
    put_int(b, o, k3 ? "max_position_embeddings" : "model_max_length", c->max_position_embeddings);
    put_int(b, o, "num_nextn_predict_layers", 0);
    put_str(b, o, "hidden_act", c->hidden_act == K3C_ACT_SITU ? "situ" : "silu");
    if (c->hidden_act == K3C_ACT_SITU) {
        put_float(b, o, "activation_situ_beta", c->situ_beta);
        if (c->situ_linear_beta == 0)
            put(b, o, "activation_situ_linear_beta", cJSON_CreateNull());
        else
            put_float(b, o, "activation_situ_linear_beta", c->situ_linear_beta);
    }
    if (k3 || c->attn_res_block_size) put_int(b, o, "attn_res_block_size", c->attn_res_block_size);
    put_int(b, o, "first_k_dense_replace", c->first_k_dense_replace);
    put_int(b, o, "moe_layer_freq", c->moe_layer_freq);
    put_int(b, o, "intermediate_size", c->intermediate_size);

    cJSON *lac = checked(b, cJSON_CreateObject());
    put(b, lac, "full_attn_layers", layer_list(b, c, K3C_ATTN_MLA));
    put(b, lac, "kda_layers", layer_list(b, c, K3C_ATTN_KDA));
    put_int(b, lac, "head_dim", c->kda_head_dim);
    put_int(b, lac, "num_heads", c->kda_num_heads);
    put_int(b, lac, "short_conv_kernel_size", c->kda_conv_kernel);
    if (k3 || c->kda_full_rank_gate) put_bool(b, lac, "use_full_rank_gate", c->kda_full_rank_gate);
    if (c->kda_has_lower_bound)
        put_float(b, lac, "gate_lower_bound", c->kda_gate_lower_bound);
    else if (k3)
        put(b, lac, "gate_lower_bound", cJSON_CreateNull());
    put(b, o, "linear_attn_config", lac);

    put_int(b, o, "num_experts", c->num_experts);
    put_int(b, o, "num_experts_per_token", c->num_experts_per_token);
    put_int(b, o, "num_shared_experts", c->num_shared_experts);
    put_int(b, o, "moe_intermediate_size", c->moe_intermediate_size);
    if (k3 || c->routed_expert_hidden_size) put_int(b, o, "routed_expert_hidden_size", c->routed_expert_hidden_size);
    if (k3 || c->latent_moe_use_norm) put_bool(b, o, "latent_moe_use_norm", c->latent_moe_use_norm);
    put_str(b, o, "moe_router_activation_func", c->router_sigmoid ? "sigmoid" : "softmax");
    if (k3) put_str(b, o, "topk_method", c->use_correction_bias ? "noaux_tc" : "greedy");
    put_bool(b, o, "use_grouped_topk", c->use_grouped_topk);
    put_int(b, o, "num_expert_group", c->num_expert_group);
    put_int(b, o, "topk_group", c->topk_group);
    put_bool(b, o, "moe_renormalize", c->moe_renormalize);
    put_float(b, o, "routed_scaling_factor", c->routed_scaling_factor);
    if (c->expert_format == K3C_EXPERTS_MXFP4) put(b, o, "quantization_config", quantization_block(b));

    put_int(b, o, "num_attention_heads", c->num_attention_heads);
    put_int(b, o, "num_key_value_heads", c->num_key_value_heads);
    put_int_or_null(b, o, "q_lora_rank", c->q_lora_rank, c->q_lora_rank == 0);
    put_int(b, o, "kv_lora_rank", c->kv_lora_rank);
    put_int(b, o, "qk_nope_head_dim", c->qk_nope_head_dim);
    put_int(b, o, "qk_rope_head_dim", c->qk_rope_head_dim);
    put_int(b, o, "v_head_dim", c->v_head_dim);
    put_bool(b, o, "mla_use_nope", 1);
    if (k3 || c->mla_use_output_gate) put_bool(b, o, "mla_use_output_gate", c->mla_use_output_gate);
    return K3C_OK;
}

/* Exactly the keys transformers 5.17 KimiLinearConfig.save_pretrained writes (compare
 * tests/fixtures/kimi_linear_hf/config.json); refuses configs that KimiLinearForCausalLM cannot express. */
static int transformers_decoder(jbuild *b, cJSON *o, const k3c_config *c) {
    const struct {
        int bad;
        const char *what;
    } unsupported[] = {
        {c->hidden_act != K3C_ACT_SILU, "hidden_act situ"},
        {c->attn_res_block_size != 0, "attn_res_block_size (AttnRes)"},
        {c->kda_full_rank_gate, "use_full_rank_gate"},
        {c->kda_has_lower_bound, "gate_lower_bound"},
        {c->kda_a_log_padded, "padded A_log"},
        {c->mla_use_output_gate, "mla_use_output_gate"},
        {c->routed_expert_hidden_size != 0, "routed_expert_hidden_size (latent MoE)"},
        {c->latent_moe_use_norm, "latent_moe_use_norm"},
        {c->expert_format != K3C_EXPERTS_BF16, "MXFP4 experts"},
        {!c->router_sigmoid, "softmax router"},
        {!c->use_correction_bias, "routing without the correction bias"},
        {!c->use_grouped_topk, "use_grouped_topk = false"},
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (unsupported[i].bad)
            return k3c_errorf("writing Kimi Linear config.json (transformers layer_types form): %s cannot be "
                              "expressed by transformers' KimiLinearForCausalLM",
                              unsupported[i].what);
    static const char *const arch[] = {"KimiLinearForCausalLM"};
    put_str_list(b, o, "architectures", arch, 1);
    put_bool(b, o, "attention_bias", 0);
    put_float(b, o, "attention_dropout", 0.0f);
    put_token_ids(b, o, c);
    put_str(b, o, "dtype", "bfloat16");
    put_int(b, o, "head_dim", c->qk_rope_head_dim); /* transformers sets head_dim = qk_rope_head_dim */
    put_str(b, o, "hidden_act", "silu");
    put_int(b, o, "hidden_size", c->hidden_size);
    put_float(b, o, "initializer_range", 0.02f);
    put_int(b, o, "intermediate_size", c->intermediate_size);
    put_int(b, o, "kv_lora_rank", c->kv_lora_rank);
    const char **names = malloc(sizeof *names * (size_t)c->num_layers);
    if (!names) return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory writing %d layer types", c->num_layers);
    for (int l = 0; l < c->num_layers; l++)
        names[l] = c->layer_attn[l] == K3C_ATTN_KDA ? "linear_attention" : "full_attention";
    put_str_list(b, o, "layer_types", names, c->num_layers);
    for (int l = 0; l < c->num_layers; l++) names[l] = c->layer_is_moe[l] ? "sparse" : "dense";
    put_str_list(b, o, "mlp_layer_types", names, c->num_layers);
    free(names);
    put_int(b, o, "linear_conv_kernel_dim", c->kda_conv_kernel);
    put_int(b, o, "linear_head_dim", c->kda_head_dim);
    put_int(b, o, "linear_num_heads", c->kda_num_heads);
    put_int(b, o, "model_max_length", c->max_position_embeddings);
    put_str(b, o, "model_type", "kimi_linear");
    put_int(b, o, "moe_intermediate_size", c->moe_intermediate_size);
    put_bool(b, o, "moe_renormalize", c->moe_renormalize);
    put_int(b, o, "num_attention_heads", c->num_attention_heads);
    put_int(b, o, "num_expert_group", c->num_expert_group);
    put_int(b, o, "num_experts", c->num_experts);
    put_int(b, o, "num_experts_per_token", c->num_experts_per_token);
    put_int(b, o, "num_hidden_layers", c->num_layers);
    put_int(b, o, "num_key_value_heads", c->num_key_value_heads);
    put_int(b, o, "num_shared_experts", c->num_shared_experts);
    put_int(b, o, "pretraining_tp", 1);
    put_int_or_null(b, o, "q_lora_rank", c->q_lora_rank, c->q_lora_rank == 0);
    put_int(b, o, "qk_head_dim", k3c_config_mla_qk_head_dim(c));
    put_int(b, o, "qk_nope_head_dim", c->qk_nope_head_dim);
    put_int(b, o, "qk_rope_head_dim", c->qk_rope_head_dim);
    put_float(b, o, "rms_norm_eps", c->rms_norm_eps);
    put_float(b, o, "routed_scaling_factor", c->routed_scaling_factor);
    put_bool(b, o, "tie_word_embeddings", c->tie_word_embeddings);
    put_int(b, o, "topk_group", c->topk_group);
    put_str(b, o, "transformers_version", "5.17.0");
    put_bool(b, o, "use_cache", 1);
    put_int(b, o, "v_head_dim", c->v_head_dim);
    put_int(b, o, "vocab_size", c->vocab_size);
    return K3C_OK;
}

static int write_file_atomic(const char *path, const char *data, size_t n) {
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) return k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", path);
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int rc = k3c_errorf_kind(K3C_ERROR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    int ok = fwrite(data, 1, n, f) == n;
    ok = (fflush(f) == 0) && ok;
    ok = (fsync(fileno(f)) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int rc = k3c_errorf_kind(K3C_ERROR_IO, "%s: writing failed: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return rc;
    }
    free(tmp);
    return K3C_OK;
}

int k3c_config_write_json(const k3c_config *c, const char *path) {
    K3C_TRY(k3c_config_validate_named(c, "writing config.json: "));
    jbuild b = {0};
    cJSON *root = cJSON_CreateObject();
    if (!root) return k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", path);
    int rc = K3C_OK;
    if (c->family == K3C_FAMILY_K3) {
        static const char *const arch[] = {"KimiK3ForConditionalGeneration"};
        put_str_list(&b, root, "architectures", arch, 1);
        put_str(&b, root, "dtype", "bfloat16");
        put_str(&b, root, "model_type", "kimi_k3");
        put_token_ids(&b, root, c);
        put_bool(&b, root, "tie_word_embeddings", c->tie_word_embeddings);
        cJSON *text = cJSON_CreateObject();
        if (!text) b.failed = 1;
        rc = text ? official_decoder(&b, text, c) : K3C_OK;
        put(&b, root, "text_config", text);
    } else if (c->layer_spelling == K3C_LAYERS_LAYER_TYPES) {
        rc = transformers_decoder(&b, root, c);
    } else {
        rc = official_decoder(&b, root, c);
    }
    if (rc == K3C_OK && b.failed) rc = k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory building config.json", path);
    if (rc != K3C_OK) {
        cJSON_Delete(root);
        return k3c_error_context("%s", path);
    }
    sort_keys(root);
    sbuf s = {0};
    print_node(&s, root, 0);
    sb_str(&s, "\n");
    cJSON_Delete(root);
    if (s.failed) {
        free(s.data);
        return k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory printing config.json", path);
    }
    rc = write_file_atomic(path, s.data, s.len);
    free(s.data);
    return rc;
}
