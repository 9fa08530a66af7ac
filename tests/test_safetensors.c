/* safetensors: writer/reader round trip with fresh random bytes, and a table of malformed files that must
 * each be refused with a specific message naming the file. */
#define _GNU_SOURCE /* memmem */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

typedef struct {
    uint8_t **bytes; /* per entry, the payload to write */
    size_t fail_at;  /* entry index whose fill fails; (size_t)-1 for none */
} fill_ctx;

static int fill_from(void *ctx, size_t index, const k3c_st_entry *e, void *bytes, size_t nbytes) {
    fill_ctx *c = ctx;
    if (index == c->fail_at) return k3c_errorf("synthetic fill failure");
    if (nbytes) memcpy(bytes, c->bytes[index], nbytes);
    return K3C_OK;
}

static size_t entry_bytes(const k3c_st_entry *e) {
    size_t n = k3c_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) n *= (size_t)e->shape[d];
    return n;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

TEST(safetensors_write_read_round_trip) {
    k3c_rng rng;
    k3c_rng_seed(&rng, test_seed() ^ 0x5afe);
    const k3c_st_entry entries[] = {
        {"model.layers.0.w", K3C_DTYPE_BF16, 2, {3, 5}},
        {"b_f32", K3C_DTYPE_F32, 1, {7}},
        {"u8.packed", K3C_DTYPE_U8, 3, {2, 3, 4}},
        {"half", K3C_DTYPE_F16, 2, {1, 9}},
        {"int8", K3C_DTYPE_I8, 1, {10}},
        {"fp8", K3C_DTYPE_F8_E4M3, 2, {4, 4}},
        {"scalar", K3C_DTYPE_F32, 0, {0}},
        {"empty_rows", K3C_DTYPE_BF16, 2, {0, 3}},
        {"empty", K3C_DTYPE_U8, 1, {0}},
        {"quote\"and\\slash", K3C_DTYPE_I32, 1, {2}},
        {"A_last", K3C_DTYPE_I64, 1, {3}},
    };
    enum { N = sizeof entries / sizeof entries[0] };
    uint8_t *bytes[N];
    for (int i = 0; i < N; i++) {
        size_t nb = entry_bytes(&entries[i]);
        bytes[i] = malloc(nb ? nb : 1);
        for (size_t j = 0; j < nb; j++) bytes[i][j] = (uint8_t)k3c_rng_next(&rng);
    }
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/round_trip.safetensors", test_tmpdir());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fill_ctx ctx = {bytes, (size_t)-1};
    CHECK_OK(k3c_st_write(path, entries, N, fill_from, &ctx));
    CHECK(!file_exists(tmp));

    k3c_st_file f;
    CHECK_OK(k3c_st_open(&f, path));
    CHECK(f.header.num_tensors == N);
    const uint8_t *map = f.map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | map[i];
    CHECK(hlen % 8 == 0); /* padded: data starts 8-byte aligned */
    CHECK(memmem(map + 8, hlen, "\"__metadata__\":{\"format\":\"pt\"}", 30) != NULL);
    for (size_t i = 1; i < f.header.num_tensors; i++)
        CHECK(strcmp(f.header.tensors[i - 1].name, f.header.tensors[i].name) < 0);
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        const k3c_st_tensor *t = k3c_st_header_find(&f.header, entries[i].name);
        CHECKF(t != NULL, "tensor %s not found", entries[i].name);
        CHECK(t->dtype == entries[i].dtype && t->ndim == entries[i].ndim);
        for (int d = 0; d < t->ndim; d++) CHECK(t->shape[d] == entries[i].shape[d]);
        size_t nb = entry_bytes(&entries[i]);
        CHECK(t->end - t->begin == nb);
        CHECK(k3c_st_numel(t) * k3c_dtype_size(t->dtype) == nb);
        CHECK(t->data == map + 8 + hlen + t->begin);
        CHECKF(nb == 0 || memcmp(t->data, bytes[i], nb) == 0, "tensor %s bytes differ", entries[i].name);
        total += nb;
    }
    CHECK(f.header.data_size == total && f.map_size == 8 + hlen + total);
    CHECK(k3c_st_header_find(&f.header, "nope") == NULL);
    CHECK(k3c_st_header_find(&f.header, "") == NULL);
    k3c_st_close(&f);
    for (int i = 0; i < N; i++) free(bytes[i]);
}

/* A fill failure leaves neither the file nor its .tmp behind; bad entries are refused before writing. */
TEST(safetensors_write_failure_leaves_nothing) {
    uint8_t a[4] = {1, 2, 3, 4}, b[8] = {0};
    uint8_t *bytes[2] = {a, b};
    const k3c_st_entry entries[] = {{"a", K3C_DTYPE_U8, 1, {4}}, {"b", K3C_DTYPE_F32, 1, {2}}};
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/fail.safetensors", test_tmpdir());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fill_ctx ctx = {bytes, 1};
    CHECK(k3c_st_write(path, entries, 2, fill_from, &ctx) == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "synthetic fill failure") && strstr(k3c_error_message(), "tensor b"));
    CHECK(!file_exists(path) && !file_exists(tmp));

    const k3c_st_entry dup[] = {{"a", K3C_DTYPE_U8, 1, {4}}, {"a", K3C_DTYPE_U8, 1, {4}}};
    ctx.fail_at = (size_t)-1;
    CHECK(k3c_st_write(path, dup, 2, fill_from, &ctx) == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "duplicate tensor name a"));
    const k3c_st_entry neg[] = {{"a", K3C_DTYPE_U8, 1, {-4}}};
    CHECK(k3c_st_write(path, neg, 1, fill_from, &ctx) == K3C_ERR);
    CHECK(strstr(k3c_error_message(), "negative"));
    CHECK(!file_exists(path) && !file_exists(tmp));
}

/* A file image: 8-byte prefix (the JSON's length unless overridden), the JSON, data_len zero bytes. */
typedef struct {
    const char *label;
    const char *json;
    size_t data_len;
    long long hlen; /* -1: strlen(json); -2: write only 5 bytes in all */
    const char *expect;
} bad_case;

static const bad_case bad_cases[] = {
    {"truncated", "{}", 0, -2, "shorter than the 8-byte header length"},
    {"hlen past eof", "{}", 0, 1000, "runs past the end of the file"},
    {"hlen zero", "{}", 0, 0, "header length is 0"},
    {"not json", "{\"a\": nope", 0, -1, "not valid JSON"},
    {"array root", "[1, 2]", 0, -1, "expected a JSON object, got an array"},
    {"trailing garbage", "{} x", 0, -1, "trailing bytes after the JSON object"},
    {"unknown dtype", "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1, "unknown dtype \"Q4_K\""},
    {"dtype not string", "{\"w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1, "dtype: expected a string"},
    {"negative shape", "{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, -1, "shape[0]: expected a non-negative integer"},
    {"fractional shape", "{\"w\":{\"dtype\":\"U8\",\"shape\":[2,1.5],\"data_offsets\":[0,3]}}", 3, -1, "shape[1]: expected a non-negative integer"},
    {"string shape", "{\"w\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2, -1, "got a string"},
    {"shape not array", "{\"w\":{\"dtype\":\"U8\",\"shape\":2,\"data_offsets\":[0,2]}}", 2, -1, "shape: expected an array, got a number"},
    {"too many dims", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, -1, "9 dimensions, at most 8"},
    {"shape overflow", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967297],\"data_offsets\":[0,1]}}", 1, -1, "shape product overflows"},
    {"byte overflow", "{\"w\":{\"dtype\":\"F64\",\"shape\":[4294967296,1073741824],\"data_offsets\":[0,1]}}", 1, -1, "byte size"},
    {"huge shape", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1e300],\"data_offsets\":[0,1]}}", 1, -1, "non-negative integer"},
    {"offsets past data", "{\"w\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 4, -1, "past the data region (4 bytes)"},
    {"end before begin", "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, -1, "end < begin"},
    {"offsets wrong length", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, -1, "expected an array [begin, end]"},
    {"offsets negative", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, -1, "expected two non-negative integers"},
    {"byte length mismatch", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, -1, "span 4 bytes, expected 8"},
    {"overlap", "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6, -1, "overlap"},
    {"contained overlap", "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[7,8]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 8, -1, "overlap"},
    {"duplicate name", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, -1, "duplicate tensor name a"},
    {"missing data_offsets", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, -1, "missing field data_offsets"},
    {"missing dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1, "missing field dtype"},
    {"unknown field", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1, -1, "unknown field \"x\""},
    {"entry not object", "{\"w\":[1]}", 0, -1, "tensor w: expected an object, got an array"},
    {"empty name", "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1, "empty name"},
    {"metadata not object", "{\"__metadata__\":\"pt\"}", 0, -1, "__metadata__: expected an object"},
    {"metadata value", "{\"__metadata__\":{\"format\":1}}", 0, -1, "expected a string value"},
    {"trailing data", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 3, -1, "but the tensors end at 1"},
};

TEST(safetensors_malformed_files_rejected) {
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        char path[512];
        snprintf(path, sizeof path, "%s/bad_%zu.safetensors", test_tmpdir(), i);
        size_t jlen = strlen(c->json);
        uint64_t hlen = c->hlen < 0 ? jlen : (uint64_t)c->hlen;
        size_t total = 8 + jlen + c->data_len;
        uint8_t *img = calloc(total, 1);
        for (int b = 0; b < 8; b++) img[b] = (uint8_t)(hlen >> (8 * b));
        memcpy(img + 8, c->json, jlen);
        if (c->hlen == -2) total = 5;
        FILE *fp = fopen(path, "wb");
        CHECK(fp && fwrite(img, 1, total, fp) == total);
        fclose(fp);
        free(img);
        k3c_st_file f;
        k3c_error_clear();
        int rc = k3c_st_open(&f, path);
        CHECKF(rc == K3C_ERR, "case '%s' was accepted", c->label);
        CHECKF(strstr(k3c_error_message(), c->expect) && strstr(k3c_error_message(), path),
               "case '%s': message \"%s\" lacks \"%s\" or the path", c->label, k3c_error_message(), c->expect);
        CHECK(f.map == NULL && f.header.tensors == NULL); /* nothing left half-open */
    }
}

/* Empty tensors occupy no bytes, so they may sit anywhere; gaps-free layouts in any order are fine. */
TEST(safetensors_accepts_empty_and_unordered_layouts) {
    const char *json = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                       "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[1,1]},"
                       "\"a\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[2,4]},"
                       "\"__metadata__\":{\"anything\":\"x\"}}   ";
    k3c_st_header h;
    CHECK_OK(k3c_st_parse_header(json, strlen(json), 4, "mem", &h));
    CHECK(h.num_tensors == 3 && h.data_size == 4);
    CHECK(strcmp(h.tensors[0].name, "a") == 0 && strcmp(h.tensors[2].name, "e") == 0);
    const k3c_st_tensor *a = k3c_st_header_find(&h, "a");
    CHECK(a && a->ndim == 0 && k3c_st_numel(a) == 1 && a->begin == 2 && a->end == 4 && a->data == NULL);
    k3c_st_header_free(&h);
    /* an empty tensor past the last data still counts toward data_size (found by the fuzzer) */
    const char *tail = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                       "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[6,6]}}";
    CHECK_OK(k3c_st_parse_header(tail, strlen(tail), 6, "mem", &h));
    CHECK(h.num_tensors == 2 && h.data_size == 6);
    k3c_st_header_free(&h);
}

/* Random byte flips of a valid file: every result is either a clean open or a clean error. */
TEST(safetensors_random_corruption_never_crashes) {
    k3c_rng rng;
    k3c_rng_seed(&rng, test_seed() ^ 0xc0ffee);
    const k3c_st_entry entries[] = {{"x.weight", K3C_DTYPE_BF16, 2, {4, 8}}, {"y", K3C_DTYPE_F32, 1, {3}},
                                    {"z", K3C_DTYPE_U8, 0, {0}}};
    uint8_t x[64], y[12], z[1];
    uint8_t *bytes[3] = {x, y, z};
    memset(x, 1, sizeof x);
    memset(y, 2, sizeof y);
    z[0] = 3;
    char path[512], bad[520];
    snprintf(path, sizeof path, "%s/corrupt.safetensors", test_tmpdir());
    snprintf(bad, sizeof bad, "%s/corrupt_mut.safetensors", test_tmpdir());
    fill_ctx ctx = {bytes, (size_t)-1};
    CHECK_OK(k3c_st_write(path, entries, 3, fill_from, &ctx));
    FILE *fp = fopen(path, "rb");
    uint8_t img[4096];
    size_t n = fread(img, 1, sizeof img, fp);
    fclose(fp);
    int opened = 0;
    for (int iter = 0; iter < 300; iter++) {
        uint8_t mut[4096];
        memcpy(mut, img, n);
        int flips = 1 + (int)(k3c_rng_next(&rng) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = k3c_rng_next(&rng) % n;
            /* mostly hit the prefix and the JSON, where parsing happens */
            if (k3c_rng_next(&rng) & 1) at = k3c_rng_next(&rng) % (n < 200 ? n : 200);
            mut[at] = (uint8_t)k3c_rng_next(&rng);
        }
        size_t len = n - (size_t)(k3c_rng_next(&rng) % 4 == 0 ? k3c_rng_next(&rng) % n : 0);
        fp = fopen(bad, "wb");
        fwrite(mut, 1, len, fp);
        fclose(fp);
        k3c_st_file f;
        if (k3c_st_open(&f, bad) == K3C_OK) {
            opened++;
            for (size_t t = 0; t < f.header.num_tensors; t++) {
                const k3c_st_tensor *tt = &f.header.tensors[t];
                CHECK((const uint8_t *)tt->data + (tt->end - tt->begin) <= (const uint8_t *)f.map + f.map_size);
            }
            k3c_st_close(&f);
        } else {
            CHECK(strstr(k3c_error_message(), bad) != NULL);
        }
    }
    (void)opened;
}

/* A K3 MoE shard's header: 896 experts x 6 tensors plus the layer's others, ~0.8 MB of JSON. The writer and
 * the strict reader must handle it quickly (nothing quadratic) and resolve every name. */
TEST(safetensors_k3_sized_header) {
    enum { EXPERTS = 896, N = EXPERTS * 6 + 24 };
    static char names[N][96];
    static k3c_st_entry entries[N];
    for (int i = 0; i < N; i++) {
        if (i < EXPERTS * 6)
            snprintf(names[i], sizeof names[i], "language_model.model.layers.42.block_sparse_moe.experts.%d.w%d.weight_%s",
                     i / 6, 1 + (i % 6) / 2, i % 2 ? "scale" : "packed");
        else
            snprintf(names[i], sizeof names[i], "language_model.model.layers.42.self_attn.extra_%d.weight", i);
        entries[i] = (k3c_st_entry){names[i], i % 2 ? K3C_DTYPE_U8 : K3C_DTYPE_BF16, 2, {1 + i % 3, 16}};
    }
    uint8_t fill_src[96];
    memset(fill_src, 0x5a, sizeof fill_src);
    uint8_t **bytes = malloc(N * sizeof *bytes);
    for (int i = 0; i < N; i++) bytes[i] = fill_src;
    char path[512];
    snprintf(path, sizeof path, "%s/k3_sized.safetensors", test_tmpdir());
    fill_ctx ctx = {bytes, (size_t)-1};
    CHECK_OK(k3c_st_write(path, entries, N, fill_from, &ctx));
    free(bytes);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    k3c_st_file f;
    CHECK_OK(k3c_st_open(&f, path));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | ((const uint8_t *)f.map)[i];
    CHECKF(hlen > 700000, "header only %llu bytes", (unsigned long long)hlen);
    CHECK(f.header.num_tensors == N);
    for (int i = 0; i < N; i++) {
        const k3c_st_tensor *t = k3c_st_header_find(&f.header, names[i]);
        CHECK(t && t->shape[0] == 1 + i % 3 && ((const uint8_t *)t->data)[0] == 0x5a);
    }
    CHECKF(secs < 2.0, "opening a %llu-byte header took %.3f s", (unsigned long long)hlen, secs);
    k3c_st_close(&f);
}
