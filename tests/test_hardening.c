/* Malformed checkpoints: a synthesized tiny K3 is copied and corrupted one way per case; k3c_model_load must
 * refuse each with a message naming the problem, and `k3c inspect` must exit non-zero. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format/config_json.h"
#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "test.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/rng.h"

/* ------------------------------------------------------------ file helpers ---- */

static int read_all(const char *path, uint8_t **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)n + 1);
    if (!*buf || fread(*buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(*buf);
        return -1;
    }
    (*buf)[n] = 0;
    *len = (size_t)n;
    fclose(f);
    return 0;
}

static int write_all(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(buf, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int copy_dir(const char *src, const char *dst) {
    if (mkdir(dst, 0755) != 0) return -1;
    DIR *d = opendir(src);
    if (!d) return -1;
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        if (de->d_name[0] == '.' && strcmp(de->d_name, K3C_SYNTH_MARKER) != 0) continue;
        char a[PATH_MAX], b[PATH_MAX];
        uint8_t *buf;
        size_t len;
        if ((size_t)snprintf(a, sizeof a, "%s/%s", src, de->d_name) >= sizeof a) return -1;
        if ((size_t)snprintf(b, sizeof b, "%s/%s", dst, de->d_name) >= sizeof b) return -1;
        rc = read_all(a, &buf, &len);
        if (rc == 0) {
            rc = write_all(b, buf, len);
            free(buf);
        }
    }
    closedir(d);
    return rc;
}

/* A shard opened for editing: header as cJSON, data region as bytes (plus room to append). */
typedef struct shard_edit {
    char path[PATH_MAX];
    cJSON *hdr;
    uint8_t *data;
    size_t data_len;
} shard_edit;

static int shard_load(shard_edit *e, const char *path) {
    uint8_t *buf;
    size_t len;
    snprintf(e->path, sizeof e->path, "%s", path);
    if (read_all(path, &buf, &len) != 0 || len < 8) return -1;
    uint64_t n;
    memcpy(&n, buf, 8);
    e->hdr = cJSON_ParseWithLength((const char *)buf + 8, (size_t)n);
    e->data_len = len - 8 - (size_t)n;
    e->data = malloc(e->data_len + 4096);
    memcpy(e->data, buf + 8 + n, e->data_len);
    free(buf);
    return e->hdr ? 0 : -1;
}

/* Writes the header back (spaces to a multiple of 8, as safetensors does) followed by the data. */
static int shard_save(shard_edit *e) {
    char *json = cJSON_PrintUnformatted(e->hdr);
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    size_t total = 8 + padded + e->data_len;
    uint8_t *buf = malloc(total);
    uint64_t n64 = padded;
    memcpy(buf, &n64, 8);
    memcpy(buf + 8, json, n);
    memset(buf + 8 + n, ' ', padded - n);
    memcpy(buf + 8 + padded, e->data, e->data_len);
    int rc = write_all(e->path, buf, total);
    free(buf);
    free(json);
    cJSON_Delete(e->hdr);
    free(e->data);
    return rc;
}

static uint64_t tensor_begin(cJSON *t) { return (uint64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(t, "data_offsets"), 0)->valuedouble; }

static void set_shape2(cJSON *t, double a, double b) {
    cJSON_ReplaceItemInObject(t, "shape", cJSON_CreateDoubleArray((double[]){a, b}, 2));
}

/* ------------------------------------------------------------ the fixture ---- */

typedef struct fixture {
    char base[PATH_MAX];
    int L;                /* layers */
    int kda_layer;        /* first KDA layer */
    int moe_layer;        /* first MoE layer */
    int H, D, E;          /* KDA heads, hidden, experts */
    int ok;
} fixture;

static fixture fx;

static const fixture *get_fixture(void) {
    if (fx.ok) return &fx;
    k3c_config c;
    if (k3c_preset_config("tiny", &c) != 0) return NULL;
    snprintf(fx.base, sizeof fx.base, "%s/hard_base", test_tmpdir());
    if (k3c_synth_write(&c, "tiny", test_seed(), fx.base) != 0) return NULL;
    fx.L = c.num_layers;
    fx.kda_layer = fx.moe_layer = -1;
    for (int l = c.num_layers - 1; l >= 0; l--) {
        if (c.layer_attn[l] == K3C_ATTN_KDA) fx.kda_layer = l;
        if (c.layer_is_moe[l]) fx.moe_layer = l;
    }
    fx.H = c.kda_num_heads;
    fx.D = c.hidden_size;
    fx.E = c.num_experts;
    fx.ok = c.expert_format == K3C_EXPERTS_MXFP4 && fx.kda_layer >= 0 && fx.moe_layer >= 0 &&
            c.kda_a_log_padded && fx.H % 128 != 0;
    k3c_config_free(&c);
    return fx.ok ? &fx : NULL;
}

static void shard_path(char *out, size_t n, const char *dir, int layer) {
    snprintf(out, n, "%.3900s/model-%05d-of-%06d.safetensors", dir, layer + 1, fx.L + 1);
}

static void name_of(char *out, size_t n, int layer, const char *suffix) {
    snprintf(out, n, "language_model.model.layers.%d.%s", layer, suffix);
}

/* Edits one tensor entry in a layer's shard: fn gets the header entry and the data region. */
typedef void (*tensor_fn)(cJSON *t, uint8_t *data, shard_edit *e);

static int edit_tensor(const char *dir, int layer, const char *suffix, tensor_fn fn) {
    char path[PATH_MAX], name[200];
    shard_path(path, sizeof path, dir, layer);
    name_of(name, sizeof name, layer, suffix);
    shard_edit e;
    if (shard_load(&e, path) != 0) return -1;
    cJSON *t = cJSON_GetObjectItem(e.hdr, name);
    if (!t) return -1;
    fn(t, e.data + tensor_begin(t), &e);
    return shard_save(&e);
}

/* Edits the index or the config as JSON. */
static int edit_json(const char *dir, const char *file, void (*fn)(cJSON *root)) {
    char path[PATH_MAX];
    uint8_t *buf;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (read_all(path, &buf, &len) != 0) return -1;
    cJSON *root = cJSON_Parse((const char *)buf);
    free(buf);
    if (!root) return -1;
    fn(root);
    char *out = cJSON_Print(root);
    int rc = write_all(path, out, strlen(out));
    free(out);
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------ corruptions ---- */

static int truncate_shard(const char *dir) {
    char path[PATH_MAX];
    shard_path(path, sizeof path, dir, fx.moe_layer);
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    return truncate(path, st.st_size - 1000);
}

static int header_len_past_end(const char *dir) {
    char path[PATH_MAX];
    uint8_t *buf;
    size_t len;
    shard_path(path, sizeof path, dir, fx.kda_layer);
    if (read_all(path, &buf, &len) != 0) return -1;
    uint64_t n = len; /* 8 + n > file size */
    memcpy(buf, &n, 8);
    int rc = write_all(path, buf, len);
    free(buf);
    return rc;
}

static void overlap_fn(cJSON *t, uint8_t *data, shard_edit *e) {
    /* post_attention_layernorm takes input_layernorm's bytes (same dtype and size). */
    char other[200];
    name_of(other, sizeof other, fx.kda_layer, "input_layernorm.weight");
    cJSON *o = cJSON_GetObjectItem(e->hdr, other);
    cJSON_ReplaceItemInObject(t, "data_offsets", cJSON_Duplicate(cJSON_GetObjectItem(o, "data_offsets"), 1));
}
static int overlapping_offsets(const char *dir) {
    return edit_tensor(dir, fx.kda_layer, "post_attention_layernorm.weight", overlap_fn);
}

static void out_of_range_fn(cJSON *t, uint8_t *data, shard_edit *e) {
    cJSON *off = cJSON_GetObjectItem(t, "data_offsets");
    double len = cJSON_GetArrayItem(off, 1)->valuedouble - cJSON_GetArrayItem(off, 0)->valuedouble;
    double begin = (double)e->data_len + 64;
    cJSON_ReplaceItemInObject(t, "data_offsets", cJSON_CreateDoubleArray((double[]){begin, begin + len}, 2));
}
static int out_of_range_offsets(const char *dir) {
    return edit_tensor(dir, fx.kda_layer, "self_attn.o_norm.weight", out_of_range_fn);
}

static void bytes_mismatch_fn(cJSON *t, uint8_t *data, shard_edit *e) {
    cJSON_ReplaceItemInObject(t, "shape", cJSON_CreateDoubleArray((double[]){fx.D + 1}, 1));
}
static int byte_length_mismatch(const char *dir) {
    return edit_tensor(dir, fx.kda_layer, "input_layernorm.weight", bytes_mismatch_fn);
}

static void rename_in_index(cJSON *root) {
    char name[200], bad[200];
    name_of(name, sizeof name, fx.kda_layer, "self_attn.dt_bias");
    name_of(bad, sizeof bad, fx.kda_layer, "self_attn.dt_bia5");
    cJSON *map = cJSON_GetObjectItem(root, "weight_map");
    cJSON *file = cJSON_DetachItemFromObject(map, name);
    cJSON_AddItemToObject(map, bad, file);
}
static int missing_tensor(const char *dir) {
    char path[PATH_MAX], name[200], bad[200];
    shard_path(path, sizeof path, dir, fx.kda_layer);
    name_of(name, sizeof name, fx.kda_layer, "self_attn.dt_bias");
    name_of(bad, sizeof bad, fx.kda_layer, "self_attn.dt_bia5");
    shard_edit e;
    if (shard_load(&e, path) != 0) return -1;
    cJSON *t = cJSON_DetachItemFromObject(e.hdr, name);
    if (!t) return -1;
    cJSON_AddItemToObject(e.hdr, bad, t);
    if (shard_save(&e) != 0) return -1;
    return edit_json(dir, "model.safetensors.index.json", rename_in_index);
}

static void reshape_fn(cJSON *t, uint8_t *data, shard_edit *e) {
    cJSON *shape = cJSON_GetObjectItem(t, "shape");
    double r = cJSON_GetArrayItem(shape, 0)->valuedouble, c = cJSON_GetArrayItem(shape, 1)->valuedouble;
    set_shape2(t, r * 2, c / 2); /* same bytes, wrong shape */
}
static int wrong_shape(const char *dir) { return edit_tensor(dir, fx.kda_layer, "self_attn.q_proj.weight", reshape_fn); }

static void f16_fn(cJSON *t, uint8_t *data, shard_edit *e) {
    cJSON_ReplaceItemInObject(t, "dtype", cJSON_CreateString("F16"));
}
static int wrong_dtype(const char *dir) { return edit_tensor(dir, fx.kda_layer, "self_attn.k_proj.weight", f16_fn); }

static void i8_fn(cJSON *t, uint8_t *data, shard_edit *e) { cJSON_ReplaceItemInObject(t, "dtype", cJSON_CreateString("I8")); }
static int wrong_dtype_mxfp4(const char *dir) {
    return edit_tensor(dir, fx.moe_layer, "block_sparse_moe.experts.1.w3.weight_packed", i8_fn);
}

static int bad_config_json(const char *dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *text = "{\"model_type\": \"kimi_k3\", \"text_config\": {\"hidden_size\": 256,";
    return write_all(path, text, strlen(text));
}

static int bad_index_json(const char *dir) {
    char path[PATH_MAX];
    uint8_t *buf;
    size_t len;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (read_all(path, &buf, &len) != 0) return -1;
    int rc = write_all(path, buf, len / 2);
    free(buf);
    return rc;
}

static void missing_shard_fn(cJSON *root) {
    char name[200];
    name_of(name, sizeof name, fx.moe_layer, "input_layernorm.weight");
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "weight_map"), name,
                              cJSON_CreateString("model-00099-of-000099.safetensors"));
}
static int index_names_missing_shard(const char *dir) {
    return edit_json(dir, "model.safetensors.index.json", missing_shard_fn);
}

static void scale_shape_fn(cJSON *t, uint8_t *data, shard_edit *e) { reshape_fn(t, data, e); }
static int mxfp4_scale_shape(const char *dir) {
    return edit_tensor(dir, fx.moe_layer, "block_sparse_moe.experts.2.w2.weight_scale", scale_shape_fn);
}

static void more_experts_fn(cJSON *root) {
    cJSON *tc = cJSON_GetObjectItem(root, "text_config");
    cJSON *ne = cJSON_GetObjectItem(tc, "num_experts");
    cJSON_SetNumberValue(ne, ne->valuedouble + 1);
}
static int config_more_experts(const char *dir) { return edit_json(dir, "config.json", more_experts_fn); }

/* tools/fuzz_load.py's finding: num_experts = 2^31 - 1 made the inventory ask for ~257 GB before any tensor
 * was compared (out of memory under ASan; a refusal, but naming memory, not the config, without it) */
static void huge_experts_fn(cJSON *root) {
    cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "text_config"), "num_experts"), 2147483647.0);
}
static int config_huge_experts(const char *dir) { return edit_json(dir, "config.json", huge_experts_fn); }

static void a_log_pad_fn(cJSON *t, uint8_t *data, shard_edit *e) {
    float one = 1.0f;
    memcpy(data + 4 * (size_t)fx.H, &one, 4); /* first padding entry */
}
static int a_log_padding_nonzero(const char *dir) {
    return edit_tensor(dir, fx.kda_layer, "self_attn.A_log", a_log_pad_fn);
}

static char extra_name[200];
static void extra_index_fn(cJSON *root) {
    char file[64];
    snprintf(file, sizeof file, "model-%05d-of-%06d.safetensors", fx.kda_layer + 1, fx.L + 1);
    cJSON_AddItemToObject(cJSON_GetObjectItem(root, "weight_map"), extra_name, cJSON_CreateString(file));
    cJSON *ts = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "metadata"), "total_size");
    cJSON_SetNumberValue(ts, ts->valuedouble + 8);
}
/* Appends a 4-element BF16 tensor named extra_name to the KDA layer's shard and its index. */
static int add_extra(const char *dir) {
    char path[PATH_MAX];
    shard_path(path, sizeof path, dir, fx.kda_layer);
    shard_edit e;
    if (shard_load(&e, path) != 0) return -1;
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "dtype", "BF16");
    cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray((double[]){4}, 1));
    cJSON_AddItemToObject(t, "data_offsets",
                          cJSON_CreateDoubleArray((double[]){(double)e.data_len, (double)e.data_len + 8}, 2));
    cJSON_AddItemToObject(e.hdr, extra_name, t);
    memset(e.data + e.data_len, 0, 8);
    e.data_len += 8;
    if (shard_save(&e) != 0) return -1;
    return edit_json(dir, "model.safetensors.index.json", extra_index_fn);
}
static int unexpected_extra_tensor(const char *dir) {
    name_of(extra_name, sizeof extra_name, fx.kda_layer, "self_attn.extra_bias");
    return add_extra(dir);
}

static void nan_scale_fn(cJSON *t, uint8_t *data, shard_edit *e) { data[5] = 255; }
static int nan_mxfp4_scale(const char *dir) {
    return edit_tensor(dir, fx.moe_layer, "block_sparse_moe.experts.3.w1.weight_scale", nan_scale_fn);
}

static void nan_norm_fn(cJSON *t, uint8_t *data, shard_edit *e) {
    uint16_t nan = 0x7fc0;
    memcpy(data + 2, &nan, 2);
}
static int nan_norm_weight(const char *dir) {
    return edit_tensor(dir, fx.kda_layer, "post_attention_layernorm.weight", nan_norm_fn);
}

static int shard_file_deleted(const char *dir) {
    char path[PATH_MAX];
    shard_path(path, sizeof path, dir, fx.moe_layer);
    return unlink(path);
}

static void fewer_layers_fn(cJSON *root) {
    /* Drop the last layer from the config: its tensors become unexpected (or the layer lists disagree). */
    cJSON *tc = cJSON_GetObjectItem(root, "text_config");
    cJSON *n = cJSON_GetObjectItem(tc, "num_hidden_layers");
    cJSON_SetNumberValue(n, n->valuedouble - 1);
}
static int config_fewer_layers(const char *dir) { return edit_json(dir, "config.json", fewer_layers_fn); }

typedef struct hard_case {
    const char *name;
    int (*corrupt)(const char *dir);
    const char *expect; /* substring of the load error */
    int cli;            /* also run `k3c inspect` on it */
} hard_case;

static const hard_case cases[] = {
    {"truncated_shard", truncate_shard, "past the data region", 1},
    {"header_len_past_end", header_len_past_end, "runs past the end of the file", 0},
    {"overlapping_offsets", overlapping_offsets, "overlap", 0},
    {"out_of_range_offsets", out_of_range_offsets, "past the data region", 0},
    {"byte_length_mismatch", byte_length_mismatch, "span", 0},
    {"missing_tensor", missing_tensor, "self_attn.dt_bias: missing", 1},
    {"wrong_shape", wrong_shape, "expected shape [", 0},
    {"wrong_dtype", wrong_dtype, "expected dtype BF16, got F16", 0},
    {"wrong_dtype_mxfp4", wrong_dtype_mxfp4, "expected dtype U8 (MXFP4), got I8", 0},
    {"bad_config_json", bad_config_json, "config.json: not valid JSON", 1},
    {"bad_index_json", bad_index_json, "not valid JSON", 0},
    {"index_names_missing_shard", index_names_missing_shard, "model-00099-of-000099.safetensors", 0},
    {"mxfp4_scale_shape", mxfp4_scale_shape, "w2.weight_scale in", 0},
    {"config_more_experts", config_more_experts, "block_sparse_moe.gate.weight in", 0},
    {"config_huge_experts", config_huge_experts, "num_experts = 2147483647 over", 1},
    {"a_log_padding_nonzero", a_log_padding_nonzero, "padding entry", 1},
    {"unexpected_extra_tensor", unexpected_extra_tensor, "unexpected tensor language_model.model.layers", 1},
    {"nan_mxfp4_scale", nan_mxfp4_scale, "E8M0 NaN", 1},
    {"nan_norm_weight", nan_norm_weight, "not finite", 0},
    {"shard_file_deleted", shard_file_deleted, "cannot open", 0},
    {"config_fewer_layers", config_fewer_layers, "num_hidden_layers = ", 0},
};

TEST(hardening_malformed_checkpoints_are_rejected) {
    const fixture *f = get_fixture();
    CHECKF(f != NULL, "could not synthesize the tiny base checkpoint: %s", k3c_error_message());
    /* The untouched copy loads: every failure below is due to its corruption alone. */
    struct k3c_model *m;
    CHECK_OK(k3c_model_load(f->base, &m));
    k3c_model_free(m);
    char bin[PATH_MAX];
    int have_bin = test_k3c_binary(bin, sizeof bin);
    CHECK(have_bin);
    int n = (int)(sizeof cases / sizeof cases[0]);
    CHECK(n >= 15);
    for (int i = 0; i < n; i++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/hard_%s", test_tmpdir(), cases[i].name);
        CHECKF(copy_dir(f->base, dir) == 0, "copying to %s", dir);
        CHECKF(cases[i].corrupt(dir) == 0, "case %s: corrupting failed", cases[i].name);
        m = NULL;
        int rc = k3c_model_load(dir, &m);
        CHECKF(rc != 0 && m == NULL, "case %s: loaded a corrupt checkpoint", cases[i].name);
        CHECKF(strstr(k3c_error_message(), cases[i].expect) != NULL, "case %s: message \"%s\" lacks \"%s\"",
               cases[i].name, k3c_error_message(), cases[i].expect);
        if (cases[i].cli) {
            char cmd[2 * PATH_MAX + 64];
            snprintf(cmd, sizeof cmd, "'%s' inspect '%s' >/dev/null 2>&1", bin, dir);
            int st = test_run_status(cmd);
            CHECKF(st == 1, "case %s: k3c inspect exit status %d", cases[i].name, st);
        }
    }
}

/* K3's vision tower and projector tensors are skipped, not errors (spec §4); the same name without the
 * K3 family would be. */
TEST(hardening_vision_tensors_are_skipped) {
    const fixture *f = get_fixture();
    CHECK(f != NULL);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/hard_vision", test_tmpdir());
    CHECK(copy_dir(f->base, dir) == 0);
    snprintf(extra_name, sizeof extra_name, "vision_tower.encoder.final_layernorm.weight");
    CHECK(add_extra(dir) == 0);
    struct k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    CHECK(m->checkpoint.num_tensors == m->inventory.count + 1);
    k3c_model_free(m);
}

/* VECTOR tensors may be stored as BF16, F16 or F32 whatever the published dtype: a norm re-stored as F32
 * and the F32 o_norm re-stored as F16 load to the same (exactly representable) values. */
static int widened_bytes;
static void total_size_fn(cJSON *root) {
    cJSON *ts = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "metadata"), "total_size");
    cJSON_SetNumberValue(ts, ts->valuedouble + widened_bytes);
}

TEST(hardening_vector_dtypes_accepted) {
    const fixture *f = get_fixture();
    CHECK(f != NULL);
    char dir[PATH_MAX], path[PATH_MAX], norm[200], onorm[200];
    snprintf(dir, sizeof dir, "%s/hard_vec_dtypes", test_tmpdir());
    CHECK(copy_dir(f->base, dir) == 0);
    shard_path(path, sizeof path, dir, fx.kda_layer);
    name_of(norm, sizeof norm, fx.kda_layer, "input_layernorm.weight");
    name_of(onorm, sizeof onorm, fx.kda_layer, "self_attn.o_norm.weight");
    shard_edit e;
    CHECK(shard_load(&e, path) == 0);
    /* Room for the re-stored tensors, appended after the data (the old bytes become an unused gap). */
    cJSON *tn = cJSON_GetObjectItem(e.hdr, norm), *to = cJSON_GetObjectItem(e.hdr, onorm);
    CHECK(tn && to && !strcmp(cJSON_GetObjectItem(to, "dtype")->valuestring, "F32"));
    int dk = (int)cJSON_GetArrayItem(cJSON_GetObjectItem(to, "shape"), 0)->valuedouble;
    size_t need = e.data_len + 4 * (size_t)fx.D + 2 * (size_t)dk;
    e.data = realloc(e.data, need);
    float *want_norm = malloc(sizeof(float) * (size_t)fx.D);
    const uint8_t *old = e.data + tensor_begin(tn);
    size_t at = e.data_len;
    for (int i = 0; i < fx.D; i++) {
        uint16_t b;
        memcpy(&b, old + 2 * i, 2);
        want_norm[i] = bf16_to_f32(b);
        memcpy(e.data + at + 4 * (size_t)i, &want_norm[i], 4);
    }
    cJSON_ReplaceItemInObject(tn, "dtype", cJSON_CreateString("F32"));
    cJSON_ReplaceItemInObject(tn, "data_offsets", cJSON_CreateDoubleArray((double[]){at, at + 4.0 * fx.D}, 2));
    at += 4 * (size_t)fx.D;
    for (int i = 0; i < dk; i++) {
        uint16_t h = (uint16_t)(0x3C00 + i); /* f16 1 + i/1024 */
        memcpy(e.data + at + 2 * (size_t)i, &h, 2);
    }
    cJSON_ReplaceItemInObject(to, "dtype", cJSON_CreateString("F16"));
    cJSON_ReplaceItemInObject(to, "data_offsets", cJSON_CreateDoubleArray((double[]){at, at + 2.0 * dk}, 2));
    e.data_len = need;
    CHECK(shard_save(&e) == 0);
    widened_bytes = 2 * fx.D - 2 * dk; /* BF16 -> F32 adds 2 bytes/elem, F32 -> F16 saves 2 */
    CHECK(edit_json(dir, "model.safetensors.index.json", total_size_fn) == 0);
    struct k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    const k3c_layer_weights *lw = &m->weights.layers[fx.kda_layer];
    for (int i = 0; i < fx.D; i++) CHECK(lw->input_norm[i] == want_norm[i]);
    for (int i = 0; i < dk; i++) CHECK(lw->kda.o_norm[i] == 1.0f + i / 1024.0f);
    free(want_norm);
    k3c_model_free(m);
}

/* ------------------------------------------------ non-finite weights, FIFOs, empty paths ---- */

/* A NaN or Inf in a bf16 matrix is refused at load, naming the tensor and the first bad element (it loaded and
 * generated token 0 everywhere, exit 0). */
static void nan_matrix_fn(cJSON *t, uint8_t *data, shard_edit *e) {
    uint16_t nan = 0x7fc0;
    memcpy(data + 2 * 5, &nan, 2);
    memcpy(data + 2 * 9, &nan, 2); /* the first one is reported */
}
static int nan_matrix_weight(const char *dir) {
    return edit_tensor(dir, fx.kda_layer, "self_attn.q_proj.weight", nan_matrix_fn);
}
static void inf_matrix_fn(cJSON *t, uint8_t *data, shard_edit *e) {
    uint16_t ninf = 0xff80;
    memcpy(data + 2 * 7, &ninf, 2);
}
static int inf_matrix_weight(const char *dir) {
    return edit_tensor(dir, fx.moe_layer, "self_attn.o_proj.weight", inf_matrix_fn);
}

static const hard_case finite_cases[] = {
    {"nan_matrix_weight", nan_matrix_weight, "q_proj.weight in", 1},
    {"inf_matrix_weight", inf_matrix_weight, "o_proj.weight in", 1},
};

TEST(hardening_nonfinite_matrix_weights_refused) {
    const fixture *f = get_fixture();
    CHECK(f != NULL);
    char bin[PATH_MAX];
    CHECK(test_k3c_binary(bin, sizeof bin));
    const char *want[] = {"element 5 (row 0, col 5) is NaN (bf16 0x7fc0): not finite",
                          "element 7 (row 0, col 7) is -Inf (bf16 0xff80): not finite"};
    for (int i = 0; i < 2; i++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/hard_%s", test_tmpdir(), finite_cases[i].name);
        CHECK(copy_dir(f->base, dir) == 0);
        CHECK(finite_cases[i].corrupt(dir) == 0);
        struct k3c_model *m = NULL;
        CHECK(k3c_model_load(dir, &m) != 0 && m == NULL);
        CHECKF(strstr(k3c_error_message(), finite_cases[i].expect) && strstr(k3c_error_message(), want[i]),
               "case %s: %s", finite_cases[i].name, k3c_error_message());
        char cmd[2 * PATH_MAX + 64];
        snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' -n 2 >/dev/null 2>&1", bin, dir);
        CHECKF(test_run_status(cmd) == 1, "case %s: generate did not fail", finite_cases[i].name);
    }
}

/* A FIFO where the loader expects a file (config.json, the index, a shard) is refused, not waited on
 * forever: each load runs in a child with a 20 s alarm. */
static int load_refuses_in_child(const char *dir, const char *expect, char *msg, size_t n) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        struct k3c_model *m = NULL;
        int rc = k3c_model_load(dir, &m);
        _exit(rc != 0 && m == NULL && strstr(k3c_error_message(), expect) ? 0 : 3);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    snprintf(msg, n, WIFSIGNALED(st) ? "load still blocked after 20 s (signal %d)" : "load did not refuse (%d)",
             WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    return -1;
}

TEST(hardening_fifo_files_refused) {
    const fixture *f = get_fixture();
    CHECK(f != NULL);
    char shard[64];
    snprintf(shard, sizeof shard, "model-%05d-of-%06d.safetensors", fx.kda_layer + 1, fx.L + 1);
    const char *files[] = {"config.json", "model.safetensors.index.json", shard};
    for (int i = 0; i < 3; i++) {
        char dir[PATH_MAX], path[PATH_MAX + 64], msg[128];
        snprintf(dir, sizeof dir, "%s/hard_fifo_%d", test_tmpdir(), i);
        CHECK(copy_dir(f->base, dir) == 0);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        CHECK(unlink(path) == 0 && mkfifo(path, 0644) == 0);
        CHECKF(load_refuses_in_child(dir, "not a regular file", msg, sizeof msg) == 0, "%s as a FIFO: %s", files[i],
               msg);
    }
}

/* An empty checkpoint path is refused (it read "/config.json"). */
TEST(hardening_empty_model_path_refused) {
    struct k3c_model *m = NULL;
    CHECK(k3c_model_load("", &m) != 0 && m == NULL);
    CHECKF(strstr(k3c_error_message(), "empty") != NULL, "%s", k3c_error_message());
    char bin[PATH_MAX], cmd[PATH_MAX + 64];
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(cmd, sizeof cmd, "'%s' inspect '' 2>&1 | grep -q 'an empty path'", bin);
    CHECK(test_run_status(cmd) == 0);
}

/* ------------------------------------------------ float dtypes that convert without loss ---- */

/* Re-stores a BF16 tensor as F32 (appended after the data; the old bytes become an unused gap); nudge > 0
 * moves element nudge - 1 off the bf16 grid by one f32 ulp. Returns the bytes added, -1 on failure. */
static int widen_f32(const char *dir, int layer, const char *suffix, int nudge) {
    char path[PATH_MAX], name[200];
    if (layer >= 0) {
        shard_path(path, sizeof path, dir, layer);
        name_of(name, sizeof name, layer, suffix);
    } else {
        snprintf(path, sizeof path, "%.3900s/model-%05d-of-%06d.safetensors", dir, fx.L + 1, fx.L + 1);
        snprintf(name, sizeof name, "language_model.%s", suffix);
    }
    shard_edit e;
    if (shard_load(&e, path) != 0) return -1;
    cJSON *t = cJSON_GetObjectItem(e.hdr, name);
    if (!t || strcmp(cJSON_GetObjectItem(t, "dtype")->valuestring, "BF16")) {
        cJSON_Delete(e.hdr);
        free(e.data);
        return -1;
    }
    cJSON *off = cJSON_GetObjectItem(t, "data_offsets");
    size_t b = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
    size_t n = ((size_t)cJSON_GetArrayItem(off, 1)->valuedouble - b) / 2;
    uint8_t *grown = realloc(e.data, e.data_len + 4 * n + 4096);
    if (!grown) return -1;
    e.data = grown;
    size_t at = e.data_len;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, e.data + b + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        if (nudge > 0 && i == (size_t)nudge - 1) u += 1;
        memcpy(e.data + at + 4 * i, &u, 4);
    }
    cJSON_ReplaceItemInObject(t, "dtype", cJSON_CreateString("F32"));
    cJSON_ReplaceItemInObject(t, "data_offsets", cJSON_CreateDoubleArray((double[]){at, at + 4.0 * n}, 2));
    e.data_len += 4 * n;
    if (shard_save(&e) != 0) return -1;
    return (int)(2 * n);
}

/* All prompt rows' logits of a checkpoint, one prefill step on the CPU. */
static float *prompt_logits(const char *dir, const int32_t *ids, int n, int *vocab) {
    k3c_model *m = NULL;
    if (k3c_load(dir, &m) != 0) return NULL;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 1;
    o.max_context = n;
    o.threads = 2;
    k3c_engine *e = NULL;
    float *lg = NULL;
    int id;
    if (k3c_engine_create(m, &o, &e) == 0 && k3c_request_open(e, &id) == 0) {
        *vocab = k3c_engine_vocab(e);
        lg = malloc(sizeof(float) * (size_t)n * *vocab);
        poison_f32(lg, (size_t)n * *vocab);
        k3c_step_item it = {.request = id, .tokens = ids, .n = n, .all_logits = 1};
        if (lg && k3c_engine_step(e, &it, 1, lg) != 0) {
            free(lg);
            lg = NULL;
        }
    }
    k3c_engine_free(e);
    k3c_free(m);
    return lg;
}

/* transformers 5.24 saves the MoE router (gate.weight) in F32: a checkpoint whose routers and norms hold their
 * bf16 values as F32 loads (the kernels read the router as bf16: the conversion is exact) and gives the bf16
 * checkpoint's logits bitwise; an F32 router value off the bf16 grid is refused with its element. */
TEST(hardening_f32_router_and_norms_accepted) {
    const fixture *f = get_fixture();
    CHECK(f != NULL);
    char dir[PATH_MAX], bad[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/hard_f32_router", test_tmpdir());
    snprintf(bad, sizeof bad, "%s/hard_f32_router_lossy", test_tmpdir());
    CHECK(copy_dir(f->base, dir) == 0 && copy_dir(f->base, bad) == 0);
    widened_bytes = 0;
    int routers = 0;
    for (int l = 0; l < fx.L; l++) {
        int w;
        if ((w = widen_f32(dir, l, "block_sparse_moe.gate.weight", 0)) > 0) widened_bytes += w, routers++;
        CHECK((w = widen_f32(dir, l, "input_layernorm.weight", 0)) > 0);
        widened_bytes += w;
        CHECK((w = widen_f32(dir, l, "post_attention_layernorm.weight", 0)) > 0);
        widened_bytes += w;
    }
    int w = widen_f32(dir, -1, "model.norm.weight", 0);
    CHECK(w > 0);
    widened_bytes += w;
    CHECK(routers > 0);
    CHECK(edit_json(dir, "model.safetensors.index.json", total_size_fn) == 0);
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    int32_t ids[12];
    int V0 = 0, V1 = 0;
    for (int i = 0; i < 12; i++) ids[i] = 1 + (int32_t)(k3c_rng_next(&r) % 500);
    float *want = prompt_logits(f->base, ids, 12, &V0);
    float *got = prompt_logits(dir, ids, 12, &V1);
    CHECKF(want && got, "%s", k3c_error_message());
    CHECK(V0 == V1 && V0 > 0);
    for (size_t i = 0; i < (size_t)12 * V0; i++) CHECK(!isnan(want[i]));
    CHECK(memcmp(want, got, sizeof(float) * 12 * (size_t)V0) == 0);
    free(want);
    free(got);
    /* one router value one f32 ulp off the bf16 grid: not convertible without loss */
    widened_bytes = widen_f32(bad, fx.moe_layer, "block_sparse_moe.gate.weight", 4);
    CHECK(widened_bytes > 0);
    CHECK(edit_json(bad, "model.safetensors.index.json", total_size_fn) == 0);
    struct k3c_model *m = NULL;
    CHECK(k3c_model_load(bad, &m) != 0);
    CHECKF(strstr(k3c_error_message(), "gate.weight in") && strstr(k3c_error_message(), "got F32 whose element 3") &&
               strstr(k3c_error_message(), "not a bf16 value"),
           "%s", k3c_error_message());
}
