/* Synth -> load -> inspect, the tensor inventory of the published K3, and the transformers fixture.
 * Expected K3 numbers come from the released checkpoint (its index: 497,220 tensors = 2,122 BF16 + 506 F32 +
 * 494,592 U8, of which 168 BF16 are vision/projector) and its published total (2,779,931,837,184
 * parameters, including the vision tower and projector: 447,358,976 by their shapes). */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "format/checkpoint.h"
#include "format/mxfp4.h"
#include "k3c.h"
#include "model/inventory.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "test.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/rng.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static unsigned long long dir_bytes(const char *dir) {
    unsigned long long total = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[PATH_MAX];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) total += (unsigned long long)st.st_size;
    }
    closedir(d);
    return total;
}

/* 1 when the two files have identical bytes. */
static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Every spec of a loaded model bound to data with the spec's shape. */
static int all_bound(const struct k3c_model *m, char *why, size_t n) {
    for (size_t i = 0; i < m->inventory.count; i++) {
        const k3c_tensor_spec *s = &m->inventory.specs[i];
        int ok = 0;
        switch (s->cls) {
        case K3C_TENSOR_MATRIX:
            ok = s->mat && s->mat->w && s->mat->rows == s->shape[0] && s->mat->cols == s->shape[1];
            break;
        case K3C_TENSOR_VECTOR: ok = s->vec && *s->vec && s->vec_len > 0; break;
        case K3C_TENSOR_MXFP4_PACKED:
            ok = s->mx && s->mx->packed && s->mx->rows == s->shape[0] && s->mx->cols == 2 * s->shape[1];
            break;
        case K3C_TENSOR_MXFP4_SCALE: ok = s->mx && s->mx->scale && s->mx->rows == s->shape[0]; break;
        }
        if (!ok) {
            snprintf(why, n, "%s", s->name);
            return 0;
        }
    }
    return 1;
}

/* Truncation would only mean a test path longer than PATH_MAX: fail loudly rather than use a wrong path. */
static void path_join(char *out, size_t n, const char *dir, const char *name) {
    if ((size_t)snprintf(out, n, "%s/%s", dir, name) >= n) out[0] = '\0';
}

/* Sample standard deviation of a bf16 matrix. */
static double bf16_std(const k3c_mat *m) {
    double s = 0, s2 = 0;
    size_t n = (size_t)m->rows * (size_t)m->cols;
    for (size_t i = 0; i < n; i++) {
        double x = bf16_to_f32(m->w[i]);
        s += x;
        s2 += x * x;
    }
    return sqrt(s2 / n - (s / n) * (s / n));
}

TEST(synth_tiny_writes_published_layout_and_loads) {
    k3c_config c;
    CHECK_OK(k3c_preset_config("tiny", &c));
    CHECK(c.family == K3C_FAMILY_K3);
    int L = c.num_layers;
    char dir[PATH_MAX];
    path_join(dir, sizeof dir, test_tmpdir(), "synth_tiny");
    double t0 = now_s();
    CHECK_OK(k3c_synth_write(&c, "tiny", test_seed(), dir));
    double secs = now_s() - t0;
    CHECKF(secs < 10.0, "synth tiny took %.2f s", secs);
    unsigned long long bytes = dir_bytes(dir);
    printf("[tiny: %.2f s, %.2f MB] ", secs, bytes / 1e6);
    CHECKF(bytes < 20u * 1000 * 1000, "tiny checkpoint is %llu bytes", bytes);
    /* K3 layout: one shard per layer, the model-level shard last, 6-digit total, index. */
    char p[PATH_MAX], name[64];
    for (int s = 1; s <= L + 1; s++) {
        snprintf(name, sizeof name, "model-%05d-of-%06d.safetensors", s, L + 1);
        path_join(p, sizeof p, dir, name);
        CHECKF(file_exists(p), "missing %s", p);
    }
    path_join(p, sizeof p, dir, "model.safetensors.index.json");
    CHECK(file_exists(p));
    path_join(p, sizeof p, dir, "model.safetensors");
    CHECK(!file_exists(p));

    struct k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    char why[200];
    int bound = all_bound(m, why, sizeof why);
    CHECKF(bound, "not bound: %s", why);
    CHECK(m->checkpoint.num_shards == L + 1);
    CHECK(m->checkpoint.num_tensors == m->inventory.count);
    /* Shard n holds exactly layer n-1, shard L+1 the model-level tensors. */
    for (int s = 0; s < m->checkpoint.num_shards; s++) {
        const k3c_st_file *sf = &m->checkpoint.shards[s];
        const char *base = strrchr(sf->path, '/');
        int idx = 0;
        CHECK(base && sscanf(base, "/model-%05d-of-", &idx) == 1);
        char want[64];
        if (idx <= L)
            snprintf(want, sizeof want, "language_model.model.layers.%d.", idx - 1);
        else
            snprintf(want, sizeof want, "language_model.model.embed_tokens.weight");
        int found = 0;
        for (size_t i = 0; i < sf->header.num_tensors; i++) {
            const char *nm = sf->header.tensors[i].name;
            if (idx <= L) CHECKF(strncmp(nm, want, strlen(want)) == 0, "%s in shard %d", nm, idx);
            found |= strncmp(nm, want, strlen(want)) == 0;
        }
        CHECK(found);
    }
    CHECK(m->owned_bytes > 0 && m->weight_bytes > 0);
    CHECK(m->weight_bytes < m->checkpoint.file_bytes);

    /* The scaling the spec asks for, measured on what was written. */
    const k3c_weights *w = &m->weights;
    CHECK_CLOSE(bf16_std(&w->embed), 1.0, 0.05, 0);
    CHECK_CLOSE(bf16_std(&w->lm_head), 1.0 / sqrt(c.hidden_size), 0, 0.05);
    for (int l = 0; l < L; l++) {
        const k3c_layer_weights *lw = &w->layers[l];
        if (lw->kind == K3C_ATTN_KDA) {
            int H = c.kda_num_heads;
            for (int h = 0; h < H; h++) {
                double A = exp(lw->kda.a_log[h]);
                CHECKF(A >= 1.0 && A <= 16.0 + 1e-3, "layer %d A_log[%d] = %g", l, h, lw->kda.a_log[h]);
            }
            CHECK_CLOSE(bf16_std(&lw->kda.o_proj), 0.5 / sqrt(k3c_config_kda_proj(&c)), 0, 0.1);
        } else {
            CHECK(lw->mla.kv_a_norm != NULL);
        }
        for (int i = 0; i < c.hidden_size; i++) CHECK(fabsf(lw->input_norm[i] - 1.0f) < 0.6f);
        if (lw->is_moe && c.expert_format == K3C_EXPERTS_MXFP4) {
            /* An expert dequantizes to ~N(0, 1/cols). */
            const k3c_mxfp4_mat *q = &lw->moe.experts[c.num_experts - 1].q1;
            float *row = malloc(sizeof(float) * (size_t)q->cols);
            double s2 = 0;
            for (int r = 0; r < q->rows; r++) {
                k3c_mxfp4_dequant_row(q->packed + (size_t)r * (q->cols / 2), q->scale + (size_t)r * (q->cols / 32),
                                      q->cols, row);
                for (int j = 0; j < q->cols; j++) s2 += (double)row[j] * row[j];
            }
            free(row);
            double std = sqrt(s2 / ((double)q->rows * q->cols));
            CHECK_CLOSE(std, 1.0 / sqrt(q->cols), 0, 0.15);
        }
    }
    k3c_model_free(m);
    k3c_config_free(&c);
}

TEST(synth_is_deterministic_per_seed) {
    char a[PATH_MAX], b[PATH_MAX], d[PATH_MAX];
    path_join(a, sizeof a, test_tmpdir(), "det_a");
    path_join(b, sizeof b, test_tmpdir(), "det_b");
    path_join(d, sizeof d, test_tmpdir(), "det_d");
    uint64_t seed = test_seed();
    CHECK_OK(k3c_synthesize("tiny", seed, a));
    CHECK_OK(k3c_synthesize("tiny", seed, b));
    CHECK_OK(k3c_synthesize("tiny", seed + 1, d));
    k3c_config c;
    CHECK_OK(k3c_preset_config("tiny", &c));
    char name[64], pa[PATH_MAX], pb[PATH_MAX], pd[PATH_MAX];
    for (int s = 1; s <= c.num_layers + 1; s++) {
        snprintf(name, sizeof name, "model-%05d-of-%06d.safetensors", s, c.num_layers + 1);
        path_join(pa, sizeof pa, a, name);
        path_join(pb, sizeof pb, b, name);
        path_join(pd, sizeof pd, d, name);
        CHECKF(same_file(pa, pb), "%s differs between two runs with the same seed", name);
        CHECKF(!same_file(pa, pd), "%s is the same for different seeds", name);
    }
    const char *same[] = {"config.json", "model.safetensors.index.json"};
    for (int i = 0; i < 2; i++) {
        path_join(pa, sizeof pa, a, same[i]);
        path_join(pd, sizeof pd, d, same[i]);
        CHECK(same_file(pa, pd)); /* structure does not depend on the seed */
    }
    /* Rewriting a previous synth output is allowed and replaces it; a foreign non-empty dir is refused. */
    CHECK_OK(k3c_synthesize("kimi-linear-tiny", seed, a));
    path_join(pa, sizeof pa, a, "model.safetensors.index.json");
    CHECK(!file_exists(pa));
    path_join(pa, sizeof pa, a, "model.safetensors");
    CHECK(file_exists(pa));
    char foreign[PATH_MAX];
    path_join(foreign, sizeof foreign, test_tmpdir(), "foreign");
    mkdir(foreign, 0755);
    path_join(pa, sizeof pa, foreign, "notes.txt");
    FILE *f = fopen(pa, "w");
    CHECK(f != NULL);
    fputs("mine\n", f);
    fclose(f);
    CHECK(k3c_synthesize("tiny", seed, foreign) != 0);
    CHECK(strstr(k3c_last_error(), "refusing") != NULL);
    k3c_config_free(&c);
}

/* The packed and scale bytes of an MXFP4 pair (bound to sp->mx) against rows of normals from the base
 * name's stream, quantized by k3c_mxfp4_quant_row: 1 when they match. */
static int checked_mx_pair(const k3c_tensor_spec *sp, uint64_t seed) {
    const k3c_mxfp4_mat *q = sp->mx;
    char base[sizeof sp->name];
    snprintf(base, sizeof base, "%s", sp->name);
    char *dot = strrchr(base, '.');
    if (dot) *dot = '\0';
    k3c_rng r;
    k3c_rng_seed(&r, seed ^ k3c_hash_str(base));
    int cols = q->cols, ok = 1;
    double std = 1.0 / sqrt((double)cols); /* synth's expert std, N(0, 1) / sqrt(in) */
    float *row = malloc(sizeof(float) * cols);
    uint8_t *pk = malloc(cols / 2), *sc = malloc(cols / 32);
    for (int i = 0; ok && row && pk && sc && i < q->rows; i++) {
        for (int j = 0; j < cols; j++) row[j] = (float)(std * k3c_rng_normal(&r));
        k3c_mxfp4_quant_row(row, cols, pk, sc);
        ok = !memcmp(pk, q->packed + (size_t)i * (cols / 2), cols / 2) &&
             !memcmp(sc, q->scale + (size_t)i * (cols / 32), cols / 32);
    }
    ok = ok && row && pk && sc;
    free(row), free(pk), free(sc);
    return ok;
}

/* k3c_rng_jump(n) lands where n calls of k3c_rng_next do (jumps of every bit size up to 2^40, in pieces). */
TEST(rng_jump_matches_steps) {
    uint64_t steps[] = {0, 1, 2, 3, 63, 64, 65, 1000, 12345, (1u << 20) + 7};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        k3c_rng a, b;
        k3c_rng_seed(&a, test_seed() + i);
        b = a;
        for (uint64_t k = 0; k < steps[i]; k++) k3c_rng_next(&a);
        k3c_rng_jump(&b, steps[i]);
        CHECKF(!memcmp(&a, &b, sizeof a), "jump %llu differs from stepping", (unsigned long long)steps[i]);
        CHECK(k3c_rng_next(&a) == k3c_rng_next(&b));
    }
    /* a jump of 2^40 + 5 in one call equals the same distance in two calls */
    k3c_rng a, b;
    k3c_rng_seed(&a, test_seed());
    b = a;
    k3c_rng_jump(&a, (1ull << 40) + 5);
    k3c_rng_jump(&b, 1ull << 40);
    k3c_rng_jump(&b, 5);
    CHECK(!memcmp(&a, &b, sizeof a));
}

/* Synth on several threads writes the bytes a single thread writes (K3 shards and the Kimi Linear single
 * file), and those are the sequential streams of the spec: the embedding as seed ^ hash(name) normals times
 * its std in element order, an expert pair as rows of normals quantized one row at a time. */
TEST(synth_threads_same_bytes) {
    const char *presets[] = {"tiny", "kimi-linear-tiny"};
    uint64_t seed = test_seed();
    for (int pi = 0; pi < 2; pi++) {
        char one[PATH_MAX], many[PATH_MAX], name[64], pa[PATH_MAX], pb[PATH_MAX];
        snprintf(name, sizeof name, "thr1_%d", pi);
        path_join(one, sizeof one, test_tmpdir(), name);
        snprintf(name, sizeof name, "thr3_%d", pi);
        path_join(many, sizeof many, test_tmpdir(), name);
        k3c_config c;
        CHECK_OK(k3c_preset_config(presets[pi], &c));
        k3c_synth_options o1 = {.threads = 1}, o3 = {.threads = 3};
        CHECK_OK(k3c_synth_write_opts(&c, presets[pi], seed, one, &o1));
        CHECK_OK(k3c_synth_write_opts(&c, presets[pi], seed, many, &o3));
        int shards = c.family == K3C_FAMILY_KIMI_LINEAR ? 1 : c.num_layers + 1;
        for (int s = 1; s <= shards; s++) {
            if (shards == 1) snprintf(name, sizeof name, "model.safetensors");
            else snprintf(name, sizeof name, "model-%05d-of-%06d.safetensors", s, shards);
            path_join(pa, sizeof pa, one, name);
            path_join(pb, sizeof pb, many, name);
            CHECKF(same_file(pa, pb), "%s %s differs between 1 and 3 synth threads", presets[pi], name);
        }
        k3c_model *m;
        CHECK_OK(k3c_load(many, &m));
        int checked = 0;
        for (size_t i = 0; i < m->inventory.count; i++) {
            const k3c_tensor_spec *sp = &m->inventory.specs[i];
            if (sp->mat == &m->weights.embed) {
                k3c_rng r;
                k3c_rng_seed(&r, seed ^ k3c_hash_str(sp->name));
                double std = k3c_synth_matrix_std(sp);
                size_t n = (size_t)m->weights.embed.rows * m->weights.embed.cols;
                for (size_t k = 0; k < n; k++)
                    CHECKF(m->weights.embed.w[k] == f32_to_bf16((float)(std * k3c_rng_normal(&r))),
                           "%s: element %zu is not the stream's", sp->name, k);
                checked++;
            } else if (sp->cls == K3C_TENSOR_MXFP4_PACKED && sp->expert == 0 && !checked_mx_pair(sp, seed)) {
                CHECKF(0, "%s is not the stream's rows quantized", sp->name);
            }
        }
        CHECK(checked == 1);
        k3c_free(m);
        k3c_config_free(&c);
    }
}

TEST(synth_kimi_linear_tiny_loads) {
    char dir[PATH_MAX], p[PATH_MAX];
    path_join(dir, sizeof dir, test_tmpdir(), "synth_kl_tiny");
    CHECK_OK(k3c_synthesize("kimi-linear-tiny", test_seed(), dir));
    path_join(p, sizeof p, dir, "model.safetensors");
    CHECK(file_exists(p));
    path_join(p, sizeof p, dir, "model.safetensors.index.json");
    CHECK(!file_exists(p));
    k3c_model *m;
    CHECK_OK(k3c_load(dir, &m));
    char why[200];
    int bound = all_bound(m, why, sizeof why);
    CHECKF(bound, "not bound: %s", why);
    CHECK(m->config.family == K3C_FAMILY_KIMI_LINEAR);
    CHECK(m->checkpoint.num_shards == 1);
    k3c_free(m);
}

/* Variants the presets may not cover, written by synth and loaded back: tied embeddings and MLA with
 * q_lora in the Kimi Linear spelling; a K3 with plain q_proj, no MLA output gate, low-rank KDA gate and
 * BF16 experts. */
static void check_variant(k3c_config *c, const char *tag) {
    k3c_inventory inv;
    CHECK_OK(k3c_inventory_build(c, NULL, &inv));
    int has_lm_head = 0;
    for (size_t i = 0; i < inv.count; i++) has_lm_head |= strstr(inv.specs[i].name, "lm_head.weight") != NULL;
    k3c_inventory_free(&inv);
    CHECK(has_lm_head == !c->tie_word_embeddings);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/variant_%s", test_tmpdir(), tag);
    CHECK_OK(k3c_synth_write(c, NULL, test_seed(), dir));
    struct k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    char why[200];
    int bound = all_bound(m, why, sizeof why);
    CHECKF(bound, "not bound: %s", why);
    if (c->tie_word_embeddings) CHECK(m->weights.lm_head.w == m->weights.embed.w);
    for (int l = 0; l < c->num_layers; l++) {
        const k3c_layer_weights *lw = &m->weights.layers[l];
        if (c->layer_attn[l] == K3C_ATTN_MLA) {
            CHECK((lw->mla.q_b.w != NULL) == (c->q_lora_rank > 0));
            CHECK((lw->mla.q_proj.w != NULL) == (c->q_lora_rank == 0));
            CHECK((lw->mla.g_proj.w != NULL) == (c->mla_use_output_gate != 0));
        } else {
            CHECK((lw->kda.g_proj.w != NULL) == (c->kda_full_rank_gate != 0));
            CHECK((lw->kda.g_a.w != NULL) == (c->kda_full_rank_gate == 0));
        }
        if (lw->is_moe) CHECK((lw->moe.experts[0].w1.w != NULL) == (c->expert_format == K3C_EXPERTS_BF16));
    }
    k3c_model_free(m);
}

TEST(synth_config_variants_load) {
    k3c_config c;
    CHECK_OK(k3c_preset_config("kimi-linear-tiny", &c));
    c.tie_word_embeddings = 1;
    c.q_lora_rank = c.kv_lora_rank;
    check_variant(&c, "kl");
    k3c_config_free(&c);
    CHECK_OK(k3c_preset_config("tiny", &c));
    c.tie_word_embeddings = 1;
    c.q_lora_rank = 0;
    c.mla_use_output_gate = 0;
    c.kda_full_rank_gate = 0;
    c.expert_format = K3C_EXPERTS_BF16;
    check_variant(&c, "k3");
    k3c_config_free(&c);
}

static int fixture_dir(char *out, size_t n) {
    const char *rel = "tests/fixtures/kimi_linear_hf";
    snprintf(out, n, "%s", rel);
    if (file_exists(out)) return 1;
    if ((size_t)snprintf(out, n, "%s/../%s", test_exe_dir(), rel) >= n) return 0;
    return file_exists(out);
}

TEST(hf_kimi_linear_fixture_loads) {
    char dir[PATH_MAX];
    CHECK(fixture_dir(dir, sizeof dir));
    struct k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    char why[200];
    int bound = all_bound(m, why, sizeof why);
    CHECKF(bound, "not bound: %s", why);
    const k3c_config *c = &m->config;
    /* The fixture as saved by transformers 5.17: 5 layers, KDA at 0,1,3, MLA at 2,4; layer 0 dense. */
    CHECK(c->family == K3C_FAMILY_KIMI_LINEAR && c->num_layers == 5);
    const k3c_attn_kind kinds[5] = {K3C_ATTN_KDA, K3C_ATTN_KDA, K3C_ATTN_MLA, K3C_ATTN_KDA, K3C_ATTN_MLA};
    for (int l = 0; l < 5; l++) {
        CHECK(m->weights.layers[l].kind == kinds[l]);
        CHECK(m->weights.layers[l].is_moe == (l > 0));
    }
    const k3c_layer_weights *l0 = &m->weights.layers[0];
    CHECK(l0->kda.g_a.w && l0->kda.g_b.w && !l0->kda.g_proj.w);
    CHECK(l0->mlp.gate.w && l0->mlp.gate.rows == 256 && l0->mlp.gate.cols == 128);
    CHECK(m->weights.layers[2].mla.q_proj.w && !m->weights.layers[2].mla.q_a.w && !m->weights.layers[2].mla.g_proj.w);
    CHECK(m->weights.lm_head.w && m->weights.lm_head.w != m->weights.embed.w);
    /* A_log [1,1,4,1] bf16 -> 4 f32 values, equal to the stored bf16 bits. */
    const k3c_st_tensor *t = k3c_checkpoint_find(&m->checkpoint, "model.layers.3.self_attn.A_log");
    CHECK(t && t->ndim == 4 && t->shape[2] == 4);
    for (int h = 0; h < 4; h++) {
        uint16_t bits;
        memcpy(&bits, (const uint8_t *)t->data + 2 * h, 2);
        CHECK(m->weights.layers[3].kda.a_log[h] == bf16_to_f32(bits));
    }
    CHECK(m->weights.layers[1].moe.experts[7].w2.rows == 128 && m->weights.layers[1].moe.experts[7].w2.cols == 64);
    CHECK(m->weights.layers[1].moe.correction_bias != NULL);
    k3c_model_free(m);
}

TEST(k3_inventory_matches_published_counts) {
    k3c_config c;
    CHECK_OK(k3c_preset_config("k3", &c));
    k3c_inventory inv;
    k3c_weights w;
    double t0 = now_s();
    CHECK_OK(k3c_inventory_build(&c, &w, &inv));
    double secs = now_s() - t0;
    size_t n_bf16 = 0, n_f32 = 0, n_u8 = 0;
    unsigned long long params = 0, bytes = 0;
    for (size_t i = 0; i < inv.count; i++) {
        const k3c_tensor_spec *s = &inv.specs[i];
        n_bf16 += s->dtype == K3C_DTYPE_BF16;
        n_f32 += s->dtype == K3C_DTYPE_F32;
        n_u8 += s->dtype == K3C_DTYPE_U8;
        params += k3c_tensor_spec_params(s);
        bytes += k3c_tensor_spec_bytes(s);
    }
    printf("[k3: %zu tensors, %zu BF16, %zu F32, %zu U8, %llu params, %llu bytes, %.2f s] ", inv.count, n_bf16, n_f32,
           n_u8, params, bytes, secs);
    CHECKF(secs < 2.0, "building the K3 inventory took %.2f s", secs);
    CHECK(inv.count == 497052);
    CHECK(n_bf16 == 2122 - 168 && n_f32 == 506 && n_u8 == 494592);
    /* HDR's total counts the vision tower + projector too: 447,358,976 parameters from spec §4 shapes. */
    CHECK(params + 447358976ull == 2779931837184ull);
    /* Spot checks against spec §2 tables. */
    int seen = 0;
    for (size_t i = 0; i < inv.count; i++) {
        const k3c_tensor_spec *s = &inv.specs[i];
        if (!strcmp(s->name, "language_model.model.layers.0.self_attn.A_log")) {
            CHECK(s->ndim == 1 && s->shape[0] == 128 && s->dtype == K3C_DTYPE_F32 && s->vec_len == 96);
            seen++;
        } else if (!strcmp(s->name, "language_model.model.layers.92.block_sparse_moe.experts.895.w2.weight_scale")) {
            CHECK(s->ndim == 2 && s->shape[0] == 3584 && s->shape[1] == 96 && s->cls == K3C_TENSOR_MXFP4_SCALE);
            seen++;
        } else if (!strcmp(s->name, "language_model.model.layers.91.self_attn.q_b_proj.weight")) {
            CHECK(s->shape[0] == 18432 && s->shape[1] == 1536);
            seen++;
        } else if (!strcmp(s->name, "language_model.model.layers.0.mlp.down_proj.weight")) {
            CHECK(s->shape[0] == 7168 && s->shape[1] == 33792);
            seen++;
        } else if (!strcmp(s->name, "language_model.model.output_attn_res_proj.weight")) {
            CHECK(s->ndim == 2 && s->shape[0] == 1 && s->shape[1] == 7168 && s->cls == K3C_TENSOR_VECTOR);
            seen++;
        } else if (!strcmp(s->name, "language_model.model.layers.4.self_attn.q_conv1d.weight")) {
            CHECK(s->ndim == 3 && s->shape[0] == 12288 && s->shape[1] == 1 && s->shape[2] == 4 &&
                  s->dtype == K3C_DTYPE_F32);
            seen++;
        }
        CHECK(strstr(s->name, "layers.3.self_attn.A_log") == NULL); /* layer 3 is MLA */
        CHECK(strstr(s->name, ".mlp.") == NULL || strstr(s->name, "layers.0.mlp.") != NULL);
    }
    CHECK(seen == 6);
    /* Slots: expert 895 of layer 92 bound to its weights entry with the logical shape. */
    CHECK(w.layers[92].moe.experts[895].q2.rows == 3584 && w.layers[92].moe.experts[895].q2.cols == 3072);
    CHECK(w.layers[3].kind == K3C_ATTN_MLA && w.layers[92].kind == K3C_ATTN_MLA && w.layers[90].kind == K3C_ATTN_KDA);
    k3c_inventory_free(&inv);
    k3c_weights_free(&w);
    k3c_config_free(&c);
}

TEST(cli_synth_and_inspect) {
    char bin[PATH_MAX], dir[PATH_MAX], cmd[4 * PATH_MAX], out[PATH_MAX];
    CHECK(test_k3c_binary(bin, sizeof bin));
    path_join(dir, sizeof dir, test_tmpdir(), "cli_tiny");
    path_join(out, sizeof out, test_tmpdir(), "cli_inspect.txt");
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --out '%s' --seed 7 >/dev/null", bin, dir);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' > '%s' 2>&1", bin, dir, out);
    CHECK(test_run_status(cmd) == 0);
    FILE *f = fopen(out, "r");
    CHECK(f != NULL);
    char text[65536];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    CHECK(strstr(text, "family: Kimi K3") != NULL);
    CHECK(strstr(text, "layer schedule") != NULL);
    CHECK(strstr(text, "active per token") != NULL);
    CHECK(strstr(text, "KV cache per token") != NULL);
    CHECK(strstr(text, "block 0 start") != NULL);
    /* usage errors exit 2, runtime errors 1 */
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 2);
    snprintf(cmd, sizeof cmd, "'%s' synth --preset no-such-preset --out '%s/x' >/dev/null 2>&1", bin, dir);
    CHECK(test_run_status(cmd) == 1);
    snprintf(cmd, sizeof cmd, "'%s' inspect >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 2);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s/nonexistent' >/dev/null 2>&1", bin, dir);
    CHECK(test_run_status(cmd) == 1);
    /* non-finite floats are bad values (strtod takes "nan"); cache sizing beyond an int is an error */
    snprintf(cmd, sizeof cmd, "'%s' generate --temperature nan -n 1 >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 2);
    snprintf(cmd, sizeof cmd, "'%s' run --prompts 1 --top-p inf >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 2);
    snprintf(cmd, sizeof cmd, "'%s' run --prompts '1;2' --max-requests 4096 -n 1073741824 >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 1);
    /* bench: --verify is for the GPU bench; widths outside 1..8 are usage errors before any device is touched */
    snprintf(cmd, sizeof cmd, "'%s' bench --device cpu --verify 2 >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 2);
#ifdef K3C_HAVE_CUDA
    snprintf(cmd, sizeof cmd, "'%s' bench --device cuda --preset tiny --verify 1,9 >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 2);
    snprintf(cmd, sizeof cmd, "'%s' bench --device cuda --preset tiny --batches 1,65 >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 2);
#endif
}

/* bench --model DIR: the cpu rows for a checkpoint folder (tools/llama-cpu-compare.sh reads them), each
 * prefill row against the peak of the instruction the products run on; a folder that does not load is a
 * runtime error. */
TEST(cli_bench_model_dir) {
    char bin[PATH_MAX], dir[PATH_MAX], cmd[4 * PATH_MAX], out[PATH_MAX];
    CHECK(test_k3c_binary(bin, sizeof bin));
    path_join(dir, sizeof dir, test_tmpdir(), "bench_tiny");
    path_join(out, sizeof out, test_tmpdir(), "bench_tiny.txt");
    snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny --out '%s' --seed 3 >/dev/null", bin, dir);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd,
             "'%s' bench --device cpu --model '%s/' --threads 1 --steps 2 --prefill 16,9 --runs 1 > '%s' 2>/dev/null",
             bin, dir, out);
    CHECK(test_run_status(cmd) == 0);
    FILE *f = fopen(out, "r");
    CHECK(f != NULL);
    char text[16384];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    CHECKF(strstr(text, "bench_tiny cpu   decode ") && strstr(text, "bench_tiny cpu   prefill    16 tokens") &&
               strstr(text, "bench_tiny cpu   prefill     9 tokens"),
           "bench --model rows missing: %s", text);
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    CHECKF(strstr(text, "peak bf16 dot-product rate") && strstr(text, "% of the bf16 dot-product peak"), "%s", text);
#else
    CHECKF(!strstr(text, "bf16 dot-product") && strstr(text, "% of the f32 FMA peak"), "%s", text);
#endif
    snprintf(cmd, sizeof cmd, "'%s' bench --model '%s/nonexistent' --prefill 0 --steps 1 >/dev/null 2>&1", bin, dir);
    CHECK(test_run_status(cmd) == 1);
}

TEST(synth_config_only_presets) {
    const char *const *names = k3c_preset_names();
    CHECK(names != NULL);
    for (; *names; names++) {
        if (k3c_preset_has_weights(*names)) continue;
        char dir[PATH_MAX], p[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/config_only_%s", test_tmpdir(), *names);
        CHECK_OK(k3c_synthesize(*names, 1, dir));
        path_join(p, sizeof p, dir, "config.json");
        CHECK(file_exists(p));
        CHECK(dir_bytes(dir) < 1u << 20); /* config + marker only */
    }
}
