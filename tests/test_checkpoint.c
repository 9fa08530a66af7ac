/* Checkpoint directories and model.safetensors.index.json: valid layouts open with every tensor resolving to
 * its bytes; every inconsistency between index and shards is refused naming the shard. */
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "format/checkpoint.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

/* Tensor bytes are a function of (seed, name), so a reader can check them without keeping copies. */
static void expected_bytes(uint64_t seed, const char *name, uint8_t *out, size_t n) {
    k3c_rng r;
    k3c_rng_seed(&r, seed ^ k3c_hash_str(name));
    for (size_t i = 0; i < n; i++) out[i] = (uint8_t)k3c_rng_next(&r);
}

static int fill_named(void *ctx, size_t index, const k3c_st_entry *e, void *bytes, size_t nbytes) {
    expected_bytes(*(uint64_t *)ctx, e->name, bytes, nbytes);
    return K3C_OK;
}

static void make_dir(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", test_tmpdir(), name);
    mkdir(out, 0755);
}

static int write_text(const char *dir, const char *file, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A shard of U8/BF16 tensors named names[0..n); shapes vary with the position. */
static int write_shard(const char *dir, const char *file, const char *const *names, size_t n, uint64_t seed) {
    k3c_st_entry *e = calloc(n ? n : 1, sizeof *e);
    for (size_t i = 0; i < n; i++) {
        e[i].name = names[i];
        e[i].dtype = i % 2 ? K3C_DTYPE_BF16 : K3C_DTYPE_U8;
        e[i].ndim = 2;
        e[i].shape[0] = 1 + (int64_t)(i % 5);
        e[i].shape[1] = 3 + (int64_t)(i % 7);
    }
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = k3c_st_write(path, e, n, fill_named, &seed);
    free(e);
    return rc;
}

static int check_tensor_bytes(const k3c_st_tensor *t, uint64_t seed) {
    size_t n = (size_t)(t->end - t->begin);
    uint8_t *want = malloc(n ? n : 1);
    expected_bytes(seed, t->name, want, n);
    int ok = memcmp(want, t->data, n) == 0;
    free(want);
    return ok;
}

static unsigned long long file_size(const char *dir, const char *file) {
    char path[600];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return stat(path, &st) == 0 ? (unsigned long long)st.st_size : 0;
}

#define CHECK_ERR_HAS(expr, ...)                                                                                   \
    do {                                                                                                           \
        k3c_error_clear();                                                                                         \
        CHECKF((expr) == K3C_ERR, "%s unexpectedly succeeded", #expr);                                             \
        const char *subs_[] = {__VA_ARGS__};                                                                       \
        for (size_t s_ = 0; s_ < sizeof subs_ / sizeof subs_[0]; s_++)                                             \
            CHECKF(strstr(k3c_error_message(), subs_[s_]), "message \"%s\" lacks \"%s\"", k3c_error_message(),     \
                   subs_[s_]);                                                                                     \
    } while (0)

/* ---- index parsing ---- */

TEST(index_parse_valid) {
    const char *json = "{\"metadata\": {\"total_size\": 1560860324864, \"other\": \"x\"},\n"
                       " \"weight_map\": {\"z.w\": \"model-00002-of-000002.safetensors\",\n"
                       "   \"a.w\": \"model-00001-of-000002.safetensors\",\n"
                       "   \"m.w\": \"model-00002-of-000002.safetensors\"}, \"extra\": 1}\n";
    k3c_index ix;
    CHECK_OK(k3c_index_parse(json, strlen(json), "idx", &ix));
    CHECK(ix.total_size == 1560860324864ull);
    CHECK(ix.num_names == 3 && ix.num_shards == 2);
    CHECK(strcmp(ix.shard_files[0], "model-00002-of-000002.safetensors") == 0); /* first-seen order */
    CHECK(strcmp(ix.names[0], "a.w") == 0 && strcmp(ix.names[1], "m.w") == 0 && strcmp(ix.names[2], "z.w") == 0);
    CHECK(ix.shard_of[0] == 1 && ix.shard_of[1] == 0 && ix.shard_of[2] == 0);
    k3c_index_free(&ix);
    const char *no_meta = "{\"weight_map\": {\"a\": \"f\"}}";
    CHECK_OK(k3c_index_parse(no_meta, strlen(no_meta), "idx", &ix));
    CHECK(ix.total_size == 0 && ix.num_names == 1);
    k3c_index_free(&ix);
}

TEST(index_parse_rejects_malformed) {
    static const struct {
        const char *json, *expect;
    } cases[] = {
        {"{\"weight_map\": {\"a\": \"f\"", "not valid JSON"},
        {"[]", "expected a JSON object, got an array"},
        {"{\"weight_map\": [\"a\"]}", "weight_map: expected an object, got an array"},
        {"{\"weight_map\": {\"a\": 3}}", "weight_map[a]: expected a file name string, got a number"},
        {"{\"weight_map\": {\"a\": \"../x\"}}", "file name \"../x\""},
        {"{\"weight_map\": {\"a\": \"sub/x\"}}", "contains '/'"},
        {"{\"weight_map\": {\"a\": \"\"}}", "is empty"},
        {"{\"weight_map\": {\"\": \"f\"}}", "empty tensor name"},
        {"{\"weight_map\": {}}", "weight_map is empty"},
        {"{\"metadata\": {}}", "missing weight_map"},
        {"{\"weight_map\": {\"a\": \"f\", \"b\": \"g\", \"a\": \"g\"}}", "tensor a more than once"},
        {"{\"weight_map\": {\"a\": \"f\"}, \"weight_map\": {\"b\": \"f\"}}", "duplicate key weight_map"},
        {"{\"metadata\": {\"total_size\": -5}, \"weight_map\": {\"a\": \"f\"}}", "total_size: expected a non-negative integer"},
        {"{\"metadata\": {\"total_size\": \"5\"}, \"weight_map\": {\"a\": \"f\"}}", "total_size: expected a non-negative integer"},
        {"{\"metadata\": 1, \"weight_map\": {\"a\": \"f\"}}", "metadata: expected an object"},
        {"{\"weight_map\": {\"a\": \"f\"}} {}", "trailing bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        k3c_index ix;
        k3c_error_clear();
        CHECKF(k3c_index_parse(cases[i].json, strlen(cases[i].json), "the_index.json", &ix) == K3C_ERR,
               "accepted: %s", cases[i].json);
        CHECKF(strstr(k3c_error_message(), cases[i].expect) && strstr(k3c_error_message(), "the_index.json"),
               "%s: message \"%s\" lacks \"%s\"", cases[i].json, k3c_error_message(), cases[i].expect);
        CHECK(ix.names == NULL && ix.shard_files == NULL);
    }
}

/* K3's index has 497,220 entries over 96 files (~60 MB): parse one of that size and check it end to end. */
TEST(index_parse_k3_sized) {
    enum { LAYERS = 92, EXPERTS = 896, SHARDS = 96 };
    size_t cap = 64u << 20, len = 0;
    char *json = malloc(cap);
    len += (size_t)snprintf(json + len, cap - len, "{\"metadata\": {\"total_size\": 1560860324864}, \"weight_map\": {");
    size_t count = 0;
    for (int l = 1; l <= LAYERS; l++)
        for (int e = 0; e < EXPERTS; e++)
            for (int w = 1; w <= 3; w++)
                for (int k = 0; k < 2; k++) {
                    len += (size_t)snprintf(json + len, cap - len,
                                            "%s\"language_model.model.layers.%d.block_sparse_moe.experts.%d.w%d.weight_%s\": "
                                            "\"model-%05d-of-000096.safetensors\"",
                                            count ? ",\n" : "\n", l, e, w, k ? "scale" : "packed", l + 1);
                    count++;
                }
    /* the remaining names, spread over every shard so all 96 files appear */
    for (size_t i = 0; count < 497220; i++, count++)
        len += (size_t)snprintf(json + len, cap - len, ",\n\"other.%zu.weight\": \"model-%05d-of-000096.safetensors\"", i,
                                (int)(i % SHARDS) + 1);
    len += (size_t)snprintf(json + len, cap - len, "\n}}\n");
    CHECK(len < cap - 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    k3c_index ix;
    CHECK_OK(k3c_index_parse(json, len, "k3_index", &ix));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    CHECK(ix.num_names == 497220 && ix.num_shards == SHARDS);
    for (size_t i = 1; i < ix.num_names; i++) CHECK(strcmp(ix.names[i - 1], ix.names[i]) < 0);
    const char *probe = "language_model.model.layers.7.block_sparse_moe.experts.100.w2.weight_scale";
    size_t lo = 0, hi = ix.num_names;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (strcmp(ix.names[mid], probe) < 0) lo = mid + 1;
        else hi = mid;
    }
    CHECK(lo < ix.num_names && strcmp(ix.names[lo], probe) == 0);
    CHECK(strcmp(ix.shard_files[ix.shard_of[lo]], "model-00008-of-000096.safetensors") == 0);
    /* generous: a quadratic step would take minutes, the linear parse well under a second */
    CHECKF(secs < 10.0, "parsing a %zu-byte index took %.2f s", len, secs);
    k3c_index_free(&ix);
    free(json);
}

/* ---- checkpoint directories ---- */

TEST(checkpoint_single_file) {
    uint64_t seed = test_seed() ^ 0x51;
    char dir[512];
    make_dir(dir, sizeof dir, "ck_single");
    const char *names[] = {"model.norm.weight", "lm_head.weight", "model.embed_tokens.weight", "x"};
    CHECK_OK(write_shard(dir, "model.safetensors", names, 4, seed));
    k3c_checkpoint ck;
    CHECK_OK(k3c_checkpoint_open(&ck, dir));
    CHECK(ck.num_shards == 1 && ck.num_tensors == 4);
    CHECK(ck.file_bytes == file_size(dir, "model.safetensors") && ck.file_bytes > 0);
    for (int i = 0; i < 4; i++) {
        const k3c_st_tensor *t = k3c_checkpoint_find(&ck, names[i]);
        CHECKF(t && strcmp(t->name, names[i]) == 0, "%s missing", names[i]);
        CHECKF(check_tensor_bytes(t, seed), "%s bytes differ", names[i]);
    }
    CHECK(k3c_checkpoint_find(&ck, "model.norm") == NULL);
    k3c_checkpoint_close(&ck);
}

TEST(checkpoint_sharded_with_index) {
    uint64_t seed = test_seed() ^ 0x52;
    k3c_rng rng;
    k3c_rng_seed(&rng, seed);
    enum { SHARDS = 3, N = 60 };
    char dir[512];
    make_dir(dir, sizeof dir, "ck_sharded");
    char names[N][48];
    const char *by_shard[SHARDS][N];
    size_t count[SHARDS] = {0};
    int shard_of[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.w%llu", i, (unsigned long long)(k3c_rng_next(&rng) % 1000));
        shard_of[i] = i < SHARDS ? i : (int)(k3c_rng_next(&rng) % SHARDS); /* every shard non-empty */
        by_shard[shard_of[i]][count[shard_of[i]]++] = names[i];
    }
    char files[SHARDS][64];
    unsigned long long bytes = 0;
    for (int s = 0; s < SHARDS; s++) {
        snprintf(files[s], sizeof files[s], "model-%05d-of-%06d.safetensors", s + 1, SHARDS);
        CHECK_OK(write_shard(dir, files[s], by_shard[s], count[s], seed));
        bytes += file_size(dir, files[s]);
    }
    /* total_size = sum of tensor bytes, computed from the shapes write_shard uses */
    unsigned long long payload = 0;
    for (int s = 0; s < SHARDS; s++)
        for (size_t i = 0; i < count[s]; i++) payload += (i % 2 ? 2u : 1u) * (1 + i % 5) * (3 + i % 7);
    size_t cap = 16384, len = 0;
    char *json = malloc(cap);
    len += (size_t)snprintf(json + len, cap - len, "{\"metadata\": {\"total_size\": %llu}, \"weight_map\": {", payload);
    /* listed backwards, so the index mentions the files out of order */
    for (int i = N - 1; i >= 0; i--)
        len += (size_t)snprintf(json + len, cap - len, "%s\"%s\": \"%s\"", i < N - 1 ? ", " : "", names[i],
                                files[shard_of[i]]);
    snprintf(json + len, cap - len, "}}");
    CHECK(write_text(dir, "model.safetensors.index.json", json) == 0);
    free(json);

    k3c_checkpoint ck;
    CHECK_OK(k3c_checkpoint_open(&ck, dir));
    CHECK(ck.num_shards == SHARDS && ck.num_tensors == N && ck.file_bytes == bytes);
    for (int s = 0; s < SHARDS; s++) { /* shards in file-name order */
        size_t pl = strlen(ck.shards[s].path), fl = strlen(files[s]);
        CHECKF(pl >= fl && strcmp(ck.shards[s].path + pl - fl, files[s]) == 0, "shard %d is %s", s, ck.shards[s].path);
    }
    for (size_t i = 1; i < ck.num_tensors; i++) CHECK(strcmp(ck.tensors[i - 1]->name, ck.tensors[i]->name) < 0);
    for (int i = 0; i < N; i++) {
        const k3c_st_tensor *t = k3c_checkpoint_find(&ck, names[i]);
        CHECKF(t != NULL, "%s missing", names[i]);
        CHECKF(check_tensor_bytes(t, seed), "%s bytes differ", names[i]);
        const k3c_st_header *h = &ck.shards[shard_of[i]].header;
        CHECKF(t >= h->tensors && t < h->tensors + h->num_tensors, "%s resolved to the wrong shard", names[i]);
    }
    k3c_checkpoint_close(&ck);
}

TEST(checkpoint_missing_files) {
    char dir[512];
    make_dir(dir, sizeof dir, "ck_empty");
    k3c_checkpoint ck;
    char want[700];
    snprintf(want, sizeof want, "no model.safetensors or model.safetensors.index.json in %s", dir);
    CHECK_ERR_HAS(k3c_checkpoint_open(&ck, dir), want);
    CHECK(ck.shards == NULL && ck.tensors == NULL);
}

/* Index/shard disagreements, each refused with the shard path in the message. */
TEST(checkpoint_index_inconsistencies) {
    uint64_t seed = test_seed() ^ 0x53;
    const char *s1[] = {"a", "b"}, *s2[] = {"c"}, *s2_dup[] = {"c", "a"};
    k3c_checkpoint ck;
    char dir[512], path[700];

    make_dir(dir, sizeof dir, "ck_missing_shard");
    CHECK_OK(write_shard(dir, "s1.safetensors", s1, 2, seed));
    CHECK(write_text(dir, "model.safetensors.index.json",
                     "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}") == 0);
    snprintf(path, sizeof path, "%s/s2.safetensors", dir);
    CHECK_ERR_HAS(k3c_checkpoint_open(&ck, dir), path, "cannot open");

    make_dir(dir, sizeof dir, "ck_unindexed");
    CHECK_OK(write_shard(dir, "s1.safetensors", s1, 2, seed));
    CHECK(write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"s1.safetensors\"}}") == 0);
    snprintf(path, sizeof path, "%s/s1.safetensors", dir);
    CHECK_ERR_HAS(k3c_checkpoint_open(&ck, dir), path, "tensor b is not in the index");

    make_dir(dir, sizeof dir, "ck_not_in_shard");
    CHECK_OK(write_shard(dir, "s1.safetensors", s1, 2, seed));
    CHECK_OK(write_shard(dir, "s2.safetensors", s2, 1, seed));
    CHECK(write_text(dir, "model.safetensors.index.json",
                     "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s1.safetensors\","
                     " \"d\": \"s2.safetensors\"}}") == 0);
    snprintf(path, sizeof path, "%s/s1.safetensors", dir);
    CHECK_ERR_HAS(k3c_checkpoint_open(&ck, dir), path, "tensor c is indexed in", "no such tensor");

    make_dir(dir, sizeof dir, "ck_two_shards");
    CHECK_OK(write_shard(dir, "s1.safetensors", s1, 2, seed));
    CHECK_OK(write_shard(dir, "s2.safetensors", s2_dup, 2, seed));
    CHECK(write_text(dir, "model.safetensors.index.json",
                     "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}") == 0);
    snprintf(path, sizeof path, "%s/s2.safetensors", dir);
    CHECK_ERR_HAS(k3c_checkpoint_open(&ck, dir), path, "tensor a", "a name in two shards");

    make_dir(dir, sizeof dir, "ck_total_size");
    CHECK_OK(write_shard(dir, "s1.safetensors", s1, 2, seed));
    /* a: U8 [1,3] = 3 bytes, b: BF16 [2,4] = 16 bytes */
    CHECK(write_text(dir, "model.safetensors.index.json",
                     "{\"metadata\": {\"total_size\": 20}, \"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\"}}") == 0);
    CHECK_ERR_HAS(k3c_checkpoint_open(&ck, dir), "total_size is 20", "hold 19 bytes");
    CHECK(write_text(dir, "model.safetensors.index.json",
                     "{\"metadata\": {\"total_size\": 19}, \"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\"}}") == 0);
    CHECK_OK(k3c_checkpoint_open(&ck, dir));
    k3c_checkpoint_close(&ck);

    make_dir(dir, sizeof dir, "ck_bad_index");
    CHECK(write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../s1.safetensors\"}}") == 0);
    CHECK_ERR_HAS(k3c_checkpoint_open(&ck, dir), "model.safetensors.index.json", "../s1.safetensors");
}

/* The checkpoint transformers saved (tests/fixtures) opens, with the names it is known to use. */
TEST(checkpoint_opens_transformers_fixture) {
    k3c_checkpoint ck;
    CHECK_OK(k3c_checkpoint_open(&ck, "tests/fixtures/kimi_linear_hf"));
    CHECK(ck.num_shards == 1 && ck.num_tensors > 10);
    const k3c_st_tensor *t = k3c_checkpoint_find(&ck, "model.embed_tokens.weight");
    CHECK(t && t->dtype == K3C_DTYPE_BF16 && t->ndim == 2);
    CHECK(k3c_checkpoint_find(&ck, "lm_head.weight") && k3c_checkpoint_find(&ck, "model.norm.weight"));
    CHECK(k3c_checkpoint_find(&ck, "model.layers.0.input_layernorm.weight"));
    k3c_checkpoint_close(&ck);
}
