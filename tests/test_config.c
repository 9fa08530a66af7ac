/* config.json parsing, writing and validation; the built-in presets. Expected values are written here
 * from the published config.json files and the model's definition, not read
 * from the code under test. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/config_json.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/presets.h"
#include "test.h"
#include "util/error.h"

#define K3_FIXTURE "tests/fixtures/k3_config.json"
#define HF_FIXTURE "tests/fixtures/kimi_linear_hf/config.json"
#define KL48_FIXTURE "tests/fixtures/kimi_linear_48b_config.json"

/* Field-by-field equality; names the first difference in why. */
static int config_equal(const k3c_config *a, const k3c_config *b, char *why, size_t n) {
#define EQ(f)                                                                                                      \
    if (a->f != b->f) {                                                                                            \
        snprintf(why, n, "%s: %g vs %g", #f, (double)a->f, (double)b->f);                                          \
        return 0;                                                                                                  \
    }
    EQ(family) EQ(layer_spelling) EQ(vocab_size) EQ(hidden_size) EQ(num_layers) EQ(rms_norm_eps)
    EQ(mla_lora_norm_eps) EQ(tie_word_embeddings) EQ(max_position_embeddings) EQ(hidden_act) EQ(situ_beta)
    EQ(situ_linear_beta) EQ(attn_res_block_size) EQ(num_attn_res_blocks) EQ(first_k_dense_replace)
    EQ(moe_layer_freq) EQ(intermediate_size) EQ(num_experts) EQ(num_experts_per_token) EQ(num_shared_experts)
    EQ(moe_intermediate_size) EQ(routed_expert_hidden_size) EQ(latent_moe_use_norm) EQ(router_sigmoid)
    EQ(use_correction_bias) EQ(use_grouped_topk) EQ(num_expert_group) EQ(topk_group) EQ(moe_renormalize)
    EQ(routed_scaling_factor) EQ(expert_format) EQ(mxfp4_group_size) EQ(num_attention_heads)
    EQ(num_key_value_heads) EQ(q_lora_rank) EQ(kv_lora_rank) EQ(qk_nope_head_dim) EQ(qk_rope_head_dim)
    EQ(v_head_dim) EQ(mla_use_output_gate) EQ(kda_num_heads) EQ(kda_head_dim) EQ(kda_conv_kernel)
    EQ(kda_full_rank_gate) EQ(kda_has_lower_bound) EQ(kda_gate_lower_bound) EQ(kda_a_log_padded)
    EQ(bos_token_id) EQ(eos_token_id) EQ(pad_token_id)
#undef EQ
    for (int l = 0; l < a->num_layers; l++) {
        if (a->layer_attn[l] != b->layer_attn[l] || a->layer_is_moe[l] != b->layer_is_moe[l]) {
            snprintf(why, n, "layer %d: attn %d/%d moe %d/%d", l, a->layer_attn[l], b->layer_attn[l],
                     a->layer_is_moe[l], b->layer_is_moe[l]);
            return 0;
        }
    }
    return 1;
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

static cJSON *read_json(const char *path) {
    char *t = read_text(path, NULL);
    cJSON *j = t ? cJSON_Parse(t) : NULL;
    free(t);
    return j;
}

/* ---- the published K3 config ---- */

TEST(config_k3_published_fixture) {
    k3c_config c;
    CHECK_OK(k3c_config_load(K3_FIXTURE, &c));
    CHECK(c.family == K3C_FAMILY_K3);
    CHECK(c.layer_spelling == K3C_LAYERS_LINEAR_ATTN_CONFIG);
    CHECK(c.vocab_size == 163840 && c.hidden_size == 7168 && c.num_layers == 93);
    CHECK(c.rms_norm_eps == 1e-5f && c.mla_lora_norm_eps == 1e-6f);
    CHECK(c.tie_word_embeddings == 0 && c.max_position_embeddings == 1048576);
    CHECK(c.hidden_act == K3C_ACT_SITU && c.situ_beta == 4.0f && c.situ_linear_beta == 25.0f);
    CHECK(c.attn_res_block_size == 12 && c.num_attn_res_blocks == 8);
    CHECK(c.first_k_dense_replace == 1 && c.moe_layer_freq == 1 && c.intermediate_size == 33792);
    CHECK(c.num_experts == 896 && c.num_experts_per_token == 16 && c.num_shared_experts == 2);
    CHECK(c.moe_intermediate_size == 3072 && c.routed_expert_hidden_size == 3584 && c.latent_moe_use_norm == 1);
    CHECK(c.router_sigmoid == 1 && c.use_correction_bias == 1 && c.use_grouped_topk == 1);
    CHECK(c.num_expert_group == 1 && c.topk_group == 1 && c.moe_renormalize == 1);
    CHECK(c.routed_scaling_factor == 1.0f);
    CHECK(c.expert_format == K3C_EXPERTS_MXFP4 && c.mxfp4_group_size == 32);
    CHECK(c.num_attention_heads == 96 && c.num_key_value_heads == 96 && c.q_lora_rank == 1536);
    CHECK(c.kv_lora_rank == 512 && c.qk_nope_head_dim == 128 && c.qk_rope_head_dim == 64 && c.v_head_dim == 128);
    CHECK(c.mla_use_output_gate == 1);
    CHECK(c.kda_num_heads == 96 && c.kda_head_dim == 128 && c.kda_conv_kernel == 4);
    CHECK(c.kda_full_rank_gate == 1 && c.kda_has_lower_bound == 1 && c.kda_gate_lower_bound == -5.0f);
    CHECK(c.kda_a_log_padded == 1);
    CHECK(c.bos_token_id == 163584 && c.eos_token_id == 163586 && c.pad_token_id == 163839);
    CHECK(k3c_config_kda_proj(&c) == 12288 && k3c_config_mla_latent(&c) == 576);
    CHECK(k3c_config_shared_width(&c) == 6144 && k3c_config_expert_in(&c) == 3584);

    /* schedule (spec §1): MLA at 0-based 3, 7, ..., 91 and 92; KDA elsewhere; layer 0 dense */
    int kda = 0, mla = 0, moe = 0, blocks = 0;
    for (int l = 0; l < 93; l++) {
        int want_mla = (l % 4 == 3) || l == 92;
        CHECKF((c.layer_attn[l] == K3C_ATTN_MLA) == want_mla, "layer %d attn %d", l, c.layer_attn[l]);
        kda += c.layer_attn[l] == K3C_ATTN_KDA;
        mla += c.layer_attn[l] == K3C_ATTN_MLA;
        CHECKF(c.layer_is_moe[l] == (l >= 1), "layer %d moe %d", l, c.layer_is_moe[l]);
        moe += c.layer_is_moe[l];
        if (k3c_config_is_block_start(&c, l)) {
            CHECK(l % 12 == 0);
            blocks++;
        }
    }
    CHECK(kda == 69 && mla == 24 && moe == 92 && blocks == 8);
    CHECK(c.layer_attn[91] == K3C_ATTN_MLA && c.layer_attn[92] == K3C_ATTN_MLA && c.layer_attn[90] == K3C_ATTN_KDA);

    /* the k3 preset is exactly the published config */
    k3c_config p;
    char why[160];
    CHECK_OK(k3c_preset_config("k3", &p));
    int same = config_equal(&c, &p, why, sizeof why);
    k3c_config_free(&p);
    k3c_config_free(&c);
    CHECKF(same, "k3 preset vs published config: %s", why);
}

/* Token ids are read from text_config first and from the top level when text_config lacks them. */
TEST(config_k3_token_ids_at_top_level) {
    cJSON *j = read_json(K3_FIXTURE);
    CHECK(j);
    cJSON *tc = cJSON_GetObjectItem(j, "text_config");
    cJSON_DeleteItemFromObject(tc, "bos_token_id");
    cJSON_DeleteItemFromObject(tc, "eos_token_id");
    cJSON_DeleteItemFromObject(tc, "pad_token_id");
    cJSON_ReplaceItemInObject(j, "eos_token_id", cJSON_CreateNumber(7));
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    k3c_config c;
    int rc = k3c_config_parse_json(text, strlen(text), "k3", &c);
    free(text);
    CHECK_OK(rc);
    CHECK(c.bos_token_id == 163584 && c.eos_token_id == 7 && c.pad_token_id == 163839);
    k3c_config_free(&c);
}

/* ---- Kimi Linear ---- */

TEST(config_transformers_fixture) {
    k3c_config c;
    CHECK_OK(k3c_config_load(HF_FIXTURE, &c));
    CHECK(c.family == K3C_FAMILY_KIMI_LINEAR && c.layer_spelling == K3C_LAYERS_LAYER_TYPES);
    CHECK(c.vocab_size == 512 && c.hidden_size == 128 && c.num_layers == 5);
    CHECK(c.rms_norm_eps == 1e-5f && c.mla_lora_norm_eps == 1e-6f && c.max_position_embeddings == 1048576);
    CHECK(c.hidden_act == K3C_ACT_SILU && c.attn_res_block_size == 0 && c.num_attn_res_blocks == 0);
    static const k3c_attn_kind attn[5] = {K3C_ATTN_KDA, K3C_ATTN_KDA, K3C_ATTN_MLA, K3C_ATTN_KDA, K3C_ATTN_MLA};
    static const uint8_t moe[5] = {0, 1, 1, 1, 1};
    for (int l = 0; l < 5; l++) CHECK(c.layer_attn[l] == attn[l] && c.layer_is_moe[l] == moe[l]);
    CHECK(c.first_k_dense_replace == 1 && c.intermediate_size == 256);
    CHECK(c.num_experts == 8 && c.num_experts_per_token == 2 && c.num_shared_experts == 1);
    CHECK(c.moe_intermediate_size == 64 && c.routed_expert_hidden_size == 0 && c.latent_moe_use_norm == 0);
    CHECK(c.router_sigmoid == 1 && c.use_correction_bias == 1 && c.num_expert_group == 1 && c.topk_group == 1);
    CHECK(c.moe_renormalize == 1 && c.routed_scaling_factor == 2.446f && c.expert_format == K3C_EXPERTS_BF16);
    CHECK(c.num_attention_heads == 4 && c.num_key_value_heads == 4 && c.q_lora_rank == 0);
    CHECK(c.kv_lora_rank == 64 && c.qk_nope_head_dim == 32 && c.qk_rope_head_dim == 32 && c.v_head_dim == 32);
    CHECK(c.mla_use_output_gate == 0);
    CHECK(c.kda_num_heads == 4 && c.kda_head_dim == 32 && c.kda_conv_kernel == 4);
    CHECK(c.kda_full_rank_gate == 0 && c.kda_has_lower_bound == 0 && c.kda_a_log_padded == 0);
    CHECK(c.bos_token_id == 1 && c.eos_token_id == 2 && c.pad_token_id == 0 && c.tie_word_embeddings == 0);
    k3c_config_free(&c);
}

/* The official spelling (linear_attn_config, 1-based lists) of the released Kimi-Linear-48B-A3B. */
TEST(config_kimi_linear_official_spelling) {
    k3c_config c, p;
    CHECK_OK(k3c_config_load(KL48_FIXTURE, &c));
    CHECK(c.family == K3C_FAMILY_KIMI_LINEAR && c.layer_spelling == K3C_LAYERS_LINEAR_ATTN_CONFIG);
    int mla = 0;
    for (int l = 0; l < 27; l++) {
        int want = l == 3 || l == 7 || l == 11 || l == 15 || l == 19 || l == 23 || l == 26;
        CHECKF((c.layer_attn[l] == K3C_ATTN_MLA) == want, "layer %d", l);
        mla += want;
        CHECK(c.layer_is_moe[l] == (l >= 1));
    }
    CHECK(mla == 7);
    CHECK(c.hidden_size == 2304 && c.kda_num_heads == 32 && c.kda_head_dim == 128 && c.num_experts == 256);
    CHECK(c.q_lora_rank == 0 && c.routed_scaling_factor == 2.446f && c.expert_format == K3C_EXPERTS_BF16);
    CHECK(c.kda_has_lower_bound == 0 && c.kda_full_rank_gate == 0 && c.hidden_act == K3C_ACT_SILU);
    CHECK_OK(k3c_preset_config("kimi-linear-48b", &p));
    char why[160];
    int same = config_equal(&c, &p, why, sizeof why);
    k3c_config_free(&p);
    k3c_config_free(&c);
    CHECKF(same, "kimi-linear-48b preset vs released config: %s", why);
}

/* The transformers attribute_map aliases, and the first_k_dense_replace rule without mlp_layer_types. */
TEST(config_kimi_linear_aliases) {
    const char *json = "{\"model_type\": \"kimi_linear\", \"vocab_size\": 64, \"hidden_size\": 64,"
                       " \"num_hidden_layers\": 4, \"intermediate_size\": 96, \"moe_intermediate_size\": 32,"
                       " \"num_local_experts\": 6, \"num_experts_per_tok\": 3, \"n_shared_experts\": 2,"
                       " \"n_group\": 3, \"topk_group\": 2, \"norm_topk_prob\": false, \"max_position_embeddings\": 4096,"
                       " \"first_k_dense_replace\": 2, \"num_attention_heads\": 2, \"kv_lora_rank\": 16,"
                       " \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8, \"q_lora_rank\": 24,"
                       " \"linear_num_heads\": 2, \"linear_head_dim\": 16, \"linear_conv_kernel_dim\": 3,"
                       " \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\","
                       " \"full_attention\"], \"eos_token_id\": [5, 6], \"bos_token_id\": null}";
    k3c_config c;
    CHECK_OK(k3c_config_parse_json(json, strlen(json), "aliases", &c));
    CHECK(c.num_experts == 6 && c.num_experts_per_token == 3 && c.num_shared_experts == 2);
    CHECK(c.num_expert_group == 3 && c.topk_group == 2 && c.moe_renormalize == 0);
    CHECK(c.max_position_embeddings == 4096 && c.q_lora_rank == 24 && c.kda_conv_kernel == 3);
    CHECK(c.layer_is_moe[0] == 0 && c.layer_is_moe[1] == 0 && c.layer_is_moe[2] == 1 && c.layer_is_moe[3] == 1);
    CHECK(c.layer_attn[1] == K3C_ATTN_MLA && c.layer_attn[2] == K3C_ATTN_KDA);
    CHECK(c.eos_token_id == 5 && c.bos_token_id == -1 && c.pad_token_id == -1);
    CHECK(c.routed_scaling_factor == 2.446f && c.num_key_value_heads == 2);
    k3c_config_free(&c);

    /* the two names of one field disagreeing is an error naming both */
    cJSON *j = cJSON_Parse(json);
    CHECK(j);
    cJSON_AddNumberToObject(j, "num_experts", 8);
    char *bad = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    int rc = k3c_config_parse_json(bad, strlen(bad), "aliases", &c);
    free(bad);
    CHECK(rc == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "num_experts = 8") && strstr(k3c_error_message(), "num_local_experts = 6"));
}

/* ---- writing ---- */

/* Every preset: write -> parse gives the identical config, and writing is deterministic. */
TEST(config_round_trip_presets) {
    const char *const *names = k3c_preset_names();
    int count = 0;
    for (int i = 0; names[i]; i++, count++) {
        k3c_config a, b;
        char path[512], path2[512], why[160];
        snprintf(path, sizeof path, "%s/cfg_%s.json", test_tmpdir(), names[i]);
        snprintf(path2, sizeof path2, "%s/cfg_%s_2.json", test_tmpdir(), names[i]);
        CHECK_OK(k3c_preset_config(names[i], &a));
        CHECK_OK(k3c_config_write_json(&a, path));
        CHECK_OK(k3c_config_load(path, &b));
        int same = config_equal(&a, &b, why, sizeof why);
        CHECK_OK(k3c_config_write_json(&b, path2));
        char *t1 = read_text(path, NULL), *t2 = read_text(path2, NULL);
        int identical = t1 && t2 && strcmp(t1, t2) == 0;
        free(t1);
        free(t2);
        k3c_config_free(&a);
        k3c_config_free(&b);
        CHECKF(same, "preset %s: written and re-read config differs: %s", names[i], why);
        CHECKF(identical, "preset %s: writing is not deterministic", names[i]);
    }
    CHECK(count == 8);
    k3c_config c;
    CHECK(k3c_preset_config("nonesuch", &c) == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "nonesuch") && strstr(k3c_error_message(), "kimi-linear-tiny"));
    CHECK(k3c_preset_has_weights("tiny") && k3c_preset_has_weights("mini") && k3c_preset_has_weights("tiny-grouped"));
    CHECK(k3c_preset_has_weights("kimi-linear-tiny") && !k3c_preset_has_weights("k3-slice"));
    CHECK(!k3c_preset_has_weights("kimi-linear-48b") && !k3c_preset_has_weights("k3-tp8-rank"));
    CHECK(!k3c_preset_has_weights("k3") && !k3c_preset_has_weights("nonesuch"));
}

/* K3 written form: every key k3c writes carries the published value (the k3 preset is the published
 * model), quantization_config is the published block exactly, and vision/auto_map are left out. */
TEST(config_k3_written_matches_published) {
    k3c_config c;
    char path[512];
    snprintf(path, sizeof path, "%s/k3_written.json", test_tmpdir());
    CHECK_OK(k3c_preset_config("k3", &c));
    CHECK_OK(k3c_config_write_json(&c, path));
    k3c_config_free(&c);
    cJSON *pub = read_json(K3_FIXTURE), *out = read_json(path);
    CHECK(pub && out);
    int keys = 0, ok = 1;
    char bad[128] = "";
    for (cJSON *it = out->child; it; it = it->next) {
        if (strcmp(it->string, "text_config") == 0) continue;
        cJSON *p = cJSON_GetObjectItemCaseSensitive(pub, it->string);
        if (!p || !cJSON_Compare(p, it, 1)) ok = 0, snprintf(bad, sizeof bad, "top-level %s", it->string);
    }
    cJSON *pt = cJSON_GetObjectItemCaseSensitive(pub, "text_config"), *ot = cJSON_GetObjectItemCaseSensitive(out, "text_config");
    CHECK(pt && ot);
    for (cJSON *it = ot->child; it; it = it->next, keys++) {
        cJSON *p = cJSON_GetObjectItemCaseSensitive(pt, it->string);
        if (!p || !cJSON_Compare(p, it, 1)) ok = 0, snprintf(bad, sizeof bad, "text_config.%s", it->string);
    }
    CHECK(!cJSON_GetObjectItemCaseSensitive(out, "auto_map") && !cJSON_GetObjectItemCaseSensitive(out, "vision_config"));
    CHECK(!cJSON_GetObjectItemCaseSensitive(ot, "auto_map"));
    CHECK(cJSON_GetObjectItemCaseSensitive(ot, "quantization_config"));
    cJSON_Delete(pub);
    cJSON_Delete(out);
    CHECKF(ok, "%s differs from the published config.json", bad);
    CHECK(keys >= 40);
}

/* Kimi Linear written in the transformers form: exactly the keys transformers 5.17 saved, with its values
 * (initializer_range aside, which the fixture's writer chose and the engine does not read). */
TEST(config_transformers_written_matches_fixture) {
    k3c_config c;
    char path[512];
    snprintf(path, sizeof path, "%s/hf_written.json", test_tmpdir());
    CHECK_OK(k3c_config_load(HF_FIXTURE, &c));
    CHECK_OK(k3c_config_write_json(&c, path));
    k3c_config_free(&c);
    cJSON *fix = read_json(HF_FIXTURE), *out = read_json(path);
    CHECK(fix && out);
    CHECK(cJSON_GetArraySize(fix) == cJSON_GetArraySize(out));
    for (cJSON *it = fix->child; it; it = it->next) {
        cJSON *o = cJSON_GetObjectItemCaseSensitive(out, it->string);
        CHECKF(o, "key %s missing from the written config", it->string);
        if (strcmp(it->string, "initializer_range") == 0) continue;
        CHECKF(cJSON_Compare(it, o, 1), "key %s differs", it->string);
    }
    cJSON_Delete(fix);
    cJSON_Delete(out);
    /* Python's layout: 2-space indent, sorted keys, floats with a decimal point */
    char *t = read_text(path, NULL);
    CHECK(t);
    int layout = strncmp(t, "{\n  \"architectures\": [\n    \"KimiLinearForCausalLM\"\n  ],\n", 55) == 0 &&
                 strstr(t, "\"attention_dropout\": 0.0,") && strstr(t, "\"rms_norm_eps\": 1e-05,") &&
                 strstr(t, "\"routed_scaling_factor\": 2.446,") && strstr(t, "\"q_lora_rank\": null,");
    free(t);
    CHECK(layout);
}

/* A K3 feature cannot be written in the transformers form: refused, naming it. */
TEST(config_transformers_form_refuses_k3_features) {
    k3c_config c;
    char path[512];
    snprintf(path, sizeof path, "%s/refused.json", test_tmpdir());
    CHECK_OK(k3c_preset_config("kimi-linear-tiny", &c));
    c.mla_use_output_gate = 1;
    CHECK(k3c_config_write_json(&c, path) == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "mla_use_output_gate"));
    k3c_config_free(&c);
    FILE *f = fopen(path, "r");
    CHECK(!f); /* nothing half-written */
}

/* ---- presets ---- */

TEST(config_presets_structure) {
    k3c_config c;
    CHECK_OK(k3c_preset_config("tiny", &c));
    /* blocks start at 0 (KDA), 4 (KDA), 8 (MLA); 7 and 8 are consecutive MLA layers */
    CHECK(c.num_layers == 9 && c.attn_res_block_size == 4 && c.num_attn_res_blocks == 3);
    for (int l = 0; l < 9; l++) CHECK((c.layer_attn[l] == K3C_ATTN_MLA) == (l == 3 || l == 7 || l == 8));
    CHECK(k3c_config_is_block_start(&c, 8) && c.layer_attn[8] == K3C_ATTN_MLA);
    CHECK(c.layer_is_moe[0] == 0 && c.layer_is_moe[1] == 1);
    CHECK(c.expert_format == K3C_EXPERTS_MXFP4 && c.hidden_act == K3C_ACT_SITU && c.kda_full_rank_gate);
    CHECK(c.kda_has_lower_bound && c.mla_use_output_gate && c.q_lora_rank == 64 && c.routed_expert_hidden_size == 128);
    /* checkpoint size in the published dtypes (inventory): under 20 MB */
    k3c_inventory inv;
    CHECK_OK(k3c_inventory_build(&c, NULL, &inv));
    uint64_t bytes = 0;
    for (size_t i = 0; i < inv.count; i++) bytes += k3c_tensor_spec_bytes(&inv.specs[i]);
    k3c_inventory_free(&inv);
    k3c_config_free(&c);
    CHECKF(bytes < 20u * 1000 * 1000, "tiny is %llu bytes", (unsigned long long)bytes);

    CHECK_OK(k3c_preset_config("tiny-grouped", &c));
    CHECK(c.num_expert_group == 4 && c.topk_group == 2 && c.routed_scaling_factor == 2.5f);
    k3c_config_free(&c);

    CHECK_OK(k3c_preset_config("mini", &c));
    CHECK(c.hidden_size == 1024 && c.num_layers == 13 && c.num_attn_res_blocks == 4 && c.vocab_size == 32768);
    for (int l = 0; l < 13; l++) CHECK((c.layer_attn[l] == K3C_ATTN_MLA) == (l == 3 || l == 7 || l == 11 || l == 12));
    CHECK(c.layer_attn[12] == K3C_ATTN_MLA && k3c_config_is_block_start(&c, 12));
    CHECK(c.num_experts == 32 && c.num_experts_per_token == 4 && k3c_config_shared_width(&c) == 512);
    CHECK(c.routed_expert_hidden_size == 512 && c.q_lora_rank == 384 && c.intermediate_size == 4096);
    k3c_config_free(&c);

    CHECK_OK(k3c_preset_config("kimi-linear-tiny", &c));
    CHECK(c.family == K3C_FAMILY_KIMI_LINEAR && c.layer_spelling == K3C_LAYERS_LAYER_TYPES && c.num_layers == 6);
    for (int l = 0; l < 6; l++) CHECK((c.layer_attn[l] == K3C_ATTN_MLA) == (l == 3 || l == 5));
    CHECK(c.q_lora_rank == 0 && !c.kda_full_rank_gate && c.expert_format == K3C_EXPERTS_BF16);
    /* the tokenizer synth writes beside it: 766 base ranks, then [BOS] [EOS] ... [PAD] */
    CHECK(c.bos_token_id == 766 && c.eos_token_id == 767 && c.pad_token_id == 1021);
    k3c_config_free(&c);

    CHECK_OK(k3c_preset_config("k3-slice", &c));
    CHECK(c.num_layers == 12 && c.hidden_size == 7168 && c.num_experts == 64 && c.num_experts_per_token == 16);
    for (int l = 0; l < 12; l++) CHECK((c.layer_attn[l] == K3C_ATTN_MLA) == (l % 4 == 3));
    k3c_config_free(&c);

    CHECK_OK(k3c_preset_config("k3-tp8-rank", &c));
    CHECK(c.kda_num_heads == 12 && c.num_attention_heads == 12 && c.moe_intermediate_size == 384);
    CHECK(c.intermediate_size == 4224 && c.num_experts == 896 && c.vocab_size == 20480);
    CHECK(c.routed_expert_hidden_size == 3584 && k3c_config_shared_width(&c) == 768);
    k3c_config_free(&c);
}

/* ---- invalid configs ---- */

/* Replaces (or deletes, value NULL) the member at a dotted path. */
static int mutate(cJSON *root, const char *path, const char *value) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    cJSON *obj = root;
    char *key = buf, *dot;
    while ((dot = strchr(key, '.'))) {
        *dot = 0;
        obj = cJSON_GetObjectItemCaseSensitive(obj, key);
        if (!obj) return 0;
        key = dot + 1;
    }
    if (!value) {
        cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
        return 1;
    }
    cJSON *v = cJSON_Parse(value);
    if (!v) return 0;
    if (cJSON_GetObjectItemCaseSensitive(obj, key)) return cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v);
    return cJSON_AddItemToObject(obj, key, v);
}

TEST(config_invalid_configs_are_named) {
    static const struct {
        char base; /* K: tiny written as K3; T: the transformers fixture */
        const char *path, *value;
        const char *expect1, *expect2;
    } cases[] = {
        {'K', "text_config.num_experts_per_token", "20", "text_config.num_experts_per_token = 20",
         "larger than num_experts (16)"},
        {'K', "text_config.linear_attn_config.kda_layers", "[1,2,3,4,5,6,7]", "full_attn_layers", "in both"},
        {'K', "text_config.linear_attn_config.kda_layers", "[1,2,3,5,6]", "kda_layers", "layer 7 (1-based) is in neither"},
        {'K', "text_config.linear_attn_config.kda_layers", "[0,1,2,3,5,6,7]", "kda_layers[0] = 0", "outside 1..9"},
        {'K', "text_config.linear_attn_config.full_attn_layers", "[4,8,10]", "full_attn_layers[2] = 10", "outside"},
        {'K', "text_config.linear_attn_config.full_attn_layers", "[4,8,8,9]", "full_attn_layers[2] = 8", "twice"},
        {'K', "text_config.hidden_act", "\"gelu\"", "text_config.hidden_act = \"gelu\"", "unknown activation"},
        {'K', "text_config.num_expert_group", "3", "num_expert_group = 3", "does not divide num_experts (16)"},
        {'K', "text_config.topk_group", "2", "topk_group = 2", "larger than num_expert_group (1)"},
        {'K', "text_config.num_expert_group", "8", "num_experts_per_token = 4", "topk_group"},
        {'K', "text_config.hidden_size", "0", "hidden_size = 0", "must be positive"},
        {'K', "text_config.qk_nope_head_dim", "-4", "qk_nope_head_dim = -4", "must be positive"},
        {'K', "text_config.moe_intermediate_size", "48", "moe_intermediate_size = 48", "multiple of 32"},
        {'K', "text_config.routed_expert_hidden_size", "100", "routed_expert_hidden_size = 100", "multiple of 32"},
        {'K', "text_config.quantization_config.format", "\"nvfp4-pack-quantized\"", "quantization_config.format",
         "unsupported quantization format"},
        {'K', "text_config.quantization_config.config_groups.group_0.weights.group_size", "16", "group_size = 16",
         "unsupported"},
        {'K', "text_config.quantization_config.quant_method", "\"fp8\"", "quant_method", "unsupported"},
        {'K', "text_config.moe_router_activation_func", "\"relu\"", "moe_router_activation_func = \"relu\"",
         "unknown router activation"},
        {'K', "text_config.topk_method", "\"random\"", "topk_method = \"random\"", "unknown"},
        {'K', "text_config.num_experts", "\"16\"", "text_config.num_experts = \"16\"", "expected an integer"},
        {'K', "text_config.num_attention_heads", "2.5", "num_attention_heads = 2.5", "expected an integer"},
        {'K', "text_config.linear_attn_config.use_full_rank_gate", "1", "use_full_rank_gate = 1", "true or false"},
        {'K', "text_config.rms_norm_eps", "\"1e-5\"", "rms_norm_eps", "expected a number"},
        {'K', "text_config.num_nextn_predict_layers", "1", "num_nextn_predict_layers = 1", "not supported"},
        {'K', "text_config.mla_use_nope", "false", "mla_use_nope = false", "rope not supported"},
        {'K', "text_config.hidden_size", NULL, "text_config.hidden_size", "missing"},
        {'K', "text_config.linear_attn_config", NULL, "text_config.linear_attn_config", "missing"},
        {'K', "text_config.linear_attn_config.full_attn_layers", NULL, "full_attn_layers", "missing"},
        {'K', "text_config.linear_attn_config.gate_lower_bound", "2.0", "gate_lower_bound = 2", "negative"},
        {'K', "text_config.eos_token_id", "5000", "eos_token_id = 5000", "outside the vocabulary"},
        {'K', "text_config.model_type", "\"deepseek_v3\"", "text_config.model_type", "kimi_linear"},
        {'K', "model_type", "\"llama\"", "model_type = \"llama\"", "unsupported"},
        {'K', "text_config", "[]", "text_config", "expected an object"},
        /* derived widths that would overflow an int */
        {'K', "text_config.num_attention_heads", "2000000000",
         "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim) = 128000000000", "larger than"},
        {'K', "text_config.kv_lora_rank", "2147483647", "kv_lora_rank + qk_rope_head_dim", "larger than"},
        {'K', "text_config.linear_attn_config.head_dim", "65536", "(KDA state)", "larger than"},
        /* num_heads x head_dim x head_dim past int64 (tools/fuzz_load.py under UBSan): refused, no overflow */
        {'K', "text_config.linear_attn_config.head_dim", "2147483647", "num_heads x head_dim =", "larger than"},
        {'K', "text_config.num_shared_experts", "100000000", "num_shared_experts x moe_intermediate_size",
         "larger than"},
        {'K', "text_config.attn_res_block_size", "2147483647", "attn_res_block_size = 2147483647", "too large"},
        {'T', "layer_types", "[\"linear_attention\",\"full_attention\"]", "layer_types", "2 entries"},
        {'T', "layer_types", "[\"linear_attention\",\"mamba\",\"full_attention\",\"linear_attention\",\"full_attention\"]",
         "layer_types[1] = \"mamba\"", "unknown"},
        {'T', "mlp_layer_types", "[\"dense\",\"moe\",\"sparse\",\"sparse\",\"sparse\"]", "mlp_layer_types[1] = \"moe\"",
         "unknown"},
        {'T', "linear_num_heads", NULL, "linear_num_heads", "missing"},
        {'T', "hidden_act", "\"relu\"", "hidden_act = \"relu\"", "unknown activation"},
        {'T', "num_experts_per_token", "9", "num_experts_per_token = 9", "larger than num_experts (8)"},
        {'T', "num_hidden_layers", "\"5\"", "num_hidden_layers = \"5\"", "expected an integer"},
        {'T', "moe_renormalize", "\"yes\"", "moe_renormalize", "true or false"},
    };
    k3c_config tiny;
    char kpath[512];
    snprintf(kpath, sizeof kpath, "%s/invalid_base.json", test_tmpdir());
    CHECK_OK(k3c_preset_config("tiny", &tiny));
    CHECK_OK(k3c_config_write_json(&tiny, kpath));
    k3c_config_free(&tiny);
    int n = (int)(sizeof cases / sizeof cases[0]);
    CHECK(n >= 12);
    for (int i = 0; i < n; i++) {
        cJSON *root = read_json(cases[i].base == 'K' ? kpath : HF_FIXTURE);
        CHECK(root);
        CHECKF(mutate(root, cases[i].path, cases[i].value), "case %d: cannot set %s", i, cases[i].path);
        char *text = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        k3c_config c;
        k3c_error_clear();
        int rc = k3c_config_parse_json(text, strlen(text), "config.json", &c);
        free(text);
        if (rc == K3C_OK) k3c_config_free(&c);
        CHECKF(rc == K3C_ERR, "case %d (%s = %s) was accepted", i, cases[i].path, cases[i].value ? cases[i].value : "deleted");
        const char *msg = k3c_error_message();
        CHECKF(strncmp(msg, "config.json: ", 13) == 0 && strstr(msg, cases[i].expect1) && strstr(msg, cases[i].expect2),
               "case %d (%s): message \"%s\" lacks \"%s\" / \"%s\"", i, cases[i].path, msg, cases[i].expect1,
               cases[i].expect2);
    }
    /* not JSON at all, and a JSON array */
    k3c_config c;
    CHECK(k3c_config_parse_json("{\"model_type\": ", 15, "config.json", &c) == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "not valid JSON"));
    CHECK(k3c_config_parse_json("[1]", 3, "config.json", &c) == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "not a JSON object"));
    CHECK(k3c_config_load("tests/fixtures/does_not_exist.json", &c) == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "does_not_exist.json"));
}

/* mla_use_nope true (or absent) with rope_theta / rope_scaling present is NoPE: accepted. */
TEST(config_rope_params_under_nope_accepted) {
    cJSON *root = read_json(HF_FIXTURE);
    CHECK(root);
    CHECK(mutate(root, "rope_theta", "10000.0") && mutate(root, "rope_scaling", "{\"type\": \"yarn\"}"));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    k3c_config c;
    int rc = k3c_config_parse_json(text, strlen(text), "config.json", &c);
    free(text);
    CHECK_OK(rc);
    k3c_config_free(&c);
}

/* Validation of structs built in code (not from JSON) names fields too. */
TEST(config_validate_struct) {
    k3c_config c;
    CHECK_OK(k3c_preset_config("mini", &c));
    CHECK_OK(k3c_config_validate(&c));
    c.topk_group = 3;
    CHECK(k3c_config_validate(&c) == K3C_ERR && strstr(k3c_error_message(), "topk_group = 3"));
    c.topk_group = 1;
    c.num_attn_res_blocks = 3;
    CHECK(k3c_config_validate(&c) == K3C_ERR && strstr(k3c_error_message(), "attn_res_block_size"));
    c.num_attn_res_blocks = 4;
    c.layer_attn[5] = (k3c_attn_kind)7;
    CHECK(k3c_config_validate(&c) == K3C_ERR && strstr(k3c_error_message(), "layer 5"));
    c.layer_attn[5] = K3C_ATTN_KDA;
    CHECK_OK(k3c_config_validate(&c));
    k3c_config copy;
    CHECK_OK(k3c_config_copy(&copy, &c));
    char why[160];
    int same = config_equal(&c, &copy, why, sizeof why);
    k3c_config_free(&copy);
    k3c_config_free(&c);
    CHECKF(same, "copy differs: %s", why);
}

/* Random corruptions of the published config (byte flips, truncations, digit swaps) never crash and are
 * either accepted (a valid config) or rejected with a message naming the file. */
TEST(config_random_corruptions) {
    size_t len = 0;
    char *orig = read_text(K3_FIXTURE, &len);
    CHECK(orig && len > 100);
    char *buf = malloc(len + 1);
    CHECK(buf);
    uint64_t s = test_seed() | 1;
    int rejected = 0;
    for (int iter = 0; iter < 400; iter++) {
        memcpy(buf, orig, len + 1);
        size_t n = len;
        int edits = 1 + (int)(s % 4);
        for (int e = 0; e < edits; e++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            if (n < 2) break;
            size_t at = (size_t)(s % n);
            switch ((s >> 32) % 4) {
            case 0: buf[at] = (char)(s >> 40); break;                           /* any byte */
            case 1: if (buf[at] >= '0' && buf[at] <= '9') buf[at] = (char)('0' + (s >> 40) % 10); break;
            case 2: n = at ? at : 1; break;                                     /* truncate */
            default: buf[at] = "{}[]\",:-e0"[(s >> 40) % 10]; break;            /* JSON punctuation */
            }
        }
        k3c_config c;
        k3c_error_clear();
        if (k3c_config_parse_json(buf, n, "fuzz.json", &c) == K3C_OK) {
            CHECK_OK(k3c_config_validate(&c));
            k3c_config_free(&c);
        } else {
            rejected++;
            CHECKF(strncmp(k3c_error_message(), "fuzz.json: ", 11) == 0, "message: %s", k3c_error_message());
        }
    }
    free(buf);
    free(orig);
    CHECK(rejected > 0);
}
