/* model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {name: file, ...}}.
 *
 * K3's index is ~60 MB with 497,220 entries in 96 files, so nothing here is quadratic: cJSON parses once,
 * the weight_map is walked as a child list, file names go through a small hash table, and names are sorted
 * once (duplicates become neighbours). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/checkpoint.h"
#include "format/json_kind.h"
#include "util/error.h"

typedef struct {
    const char *name; /* points into the cJSON tree while parsing */
    int shard;
} index_pair;

/* Open-addressing set of distinct shard file names -> position in shard_files. */
typedef struct {
    int *slots; /* -1 = empty, else index into the shard_files array */
    size_t cap;
} file_table;

static uint64_t hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static int table_grow(file_table *t, char **files, size_t cap) {
    int *slots = malloc(cap * sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < cap; i++) slots[i] = -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slots[i] < 0) continue;
        size_t j = hash_str(files[t->slots[i]]) & (cap - 1);
        while (slots[j] >= 0) j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

static int is_valid_file_name(const char *f) { return f[0] && !strchr(f, '/') && !strstr(f, ".."); }

static int by_pair_name(const void *a, const void *b) {
    return strcmp(((const index_pair *)a)->name, ((const index_pair *)b)->name);
}

static int parse_metadata(const cJSON *meta, const char *where, k3c_index *out) {
    if (!cJSON_IsObject(meta)) return k3c_errorf("%s: metadata: expected an object, got %s", where, k3c_json_kind(meta));
    /* Only total_size is interpreted; other metadata keys are informational and ignored. */
    int seen = 0;
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (strcmp(m->string, "total_size") != 0) continue;
        if (seen++) return k3c_errorf("%s: metadata: duplicate key total_size", where);
        uint64_t v;
        if (!k3c_json_exact_u64(m, &v))
            return k3c_errorf("%s: metadata.total_size: expected a non-negative integer, got %s", where, k3c_json_kind(m));
        out->total_size = v;
    }
    return K3C_OK;
}

int k3c_index_parse(const char *json, size_t len, const char *where, k3c_index *out) {
    memset(out, 0, sizeof *out);
    /* A NUL-terminated copy for cJSON: the input need not be terminated. */
    char *buf = malloc(len + 1);
    if (!buf) return k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory for a %zu-byte index", where, len);
    memcpy(buf, json, len);
    buf[len] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    index_pair *pairs = NULL;
    file_table table = {0};
    size_t files_cap = 0;
    int rc = K3C_ERR;
    if (!root) {
        k3c_errorf("%s: not valid JSON (error at byte %zu of %zu)", where,
                   end && end >= buf ? (size_t)(end - buf) : (size_t)0, len);
        goto done;
    }
    for (const char *p = end; p < buf + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            k3c_errorf("%s: trailing bytes after the JSON object (at byte %zu of %zu)", where, (size_t)(p - buf), len);
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        k3c_errorf("%s: expected a JSON object, got %s", where, k3c_json_kind(root));
        goto done;
    }
    const cJSON *map = NULL, *meta = NULL;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "weight_map") == 0) {
            if (map) {
                k3c_errorf("%s: duplicate key weight_map", where);
                goto done;
            }
            map = e;
        } else if (strcmp(e->string, "metadata") == 0) {
            if (meta) {
                k3c_errorf("%s: duplicate key metadata", where);
                goto done;
            }
            meta = e;
        }
    }
    if (meta && parse_metadata(meta, where, out) != K3C_OK) goto done;
    if (!map) {
        k3c_errorf("%s: missing weight_map", where);
        goto done;
    }
    if (!cJSON_IsObject(map)) {
        k3c_errorf("%s: weight_map: expected an object, got %s", where, k3c_json_kind(map));
        goto done;
    }
    size_t n = 0;
    for (const cJSON *e = map->child; e; e = e->next) n++;
    if (n == 0) {
        k3c_errorf("%s: weight_map is empty", where);
        goto done;
    }
    if (!(pairs = malloc(n * sizeof *pairs)) || table_grow(&table, NULL, 64) != 0) {
        k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory for %zu entries", where, n);
        goto done;
    }
    size_t k = 0;
    for (const cJSON *e = map->child; e; e = e->next, k++) {
        if (!e->string[0]) {
            k3c_errorf("%s: weight_map has an empty tensor name", where);
            goto done;
        }
        if (!cJSON_IsString(e)) {
            k3c_errorf("%s: weight_map[%s]: expected a file name string, got %s", where, e->string, k3c_json_kind(e));
            goto done;
        }
        const char *file = e->valuestring;
        if (!is_valid_file_name(file)) {
            k3c_errorf("%s: weight_map[%s]: file name \"%s\" is empty or contains '/' or \"..\"", where, e->string, file);
            goto done;
        }
        size_t j = hash_str(file) & (table.cap - 1);
        while (table.slots[j] >= 0 && strcmp(out->shard_files[table.slots[j]], file) != 0) j = (j + 1) & (table.cap - 1);
        if (table.slots[j] < 0) {
            if ((size_t)out->num_shards == files_cap) {
                files_cap = files_cap ? 2 * files_cap : 16;
                char **f = realloc(out->shard_files, files_cap * sizeof *f);
                if (!f) {
                    k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", where);
                    goto done;
                }
                out->shard_files = f;
            }
            if (!(out->shard_files[out->num_shards] = strdup(file))) {
                k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", where);
                goto done;
            }
            table.slots[j] = out->num_shards++;
            /* keep the load factor under 1/2 */
            if ((size_t)out->num_shards * 2 > table.cap && table_grow(&table, out->shard_files, table.cap * 2) != 0) {
                k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", where);
                goto done;
            }
            pairs[k].shard = out->num_shards - 1;
        } else {
            pairs[k].shard = table.slots[j];
        }
        pairs[k].name = e->string;
    }
    qsort(pairs, n, sizeof *pairs, by_pair_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(pairs[i - 1].name, pairs[i].name) == 0) {
            k3c_errorf("%s: weight_map lists tensor %s more than once", where, pairs[i].name);
            goto done;
        }
    out->names = calloc(n, sizeof *out->names);
    out->shard_of = malloc(n * sizeof *out->shard_of);
    if (!out->names || !out->shard_of) {
        k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory for %zu entries", where, n);
        goto done;
    }
    out->num_names = n;
    for (size_t i = 0; i < n; i++) {
        out->shard_of[i] = pairs[i].shard;
        if (!(out->names[i] = strdup(pairs[i].name))) {
            k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", where);
            goto done;
        }
    }
    rc = K3C_OK;
done:
    free(table.slots);
    free(pairs);
    cJSON_Delete(root);
    free(buf);
    if (rc != K3C_OK) k3c_index_free(out);
    return rc;
}

void k3c_index_free(k3c_index *ix) {
    if (ix->names)
        for (size_t i = 0; i < ix->num_names; i++) free(ix->names[i]);
    free(ix->names);
    free(ix->shard_of);
    for (int i = 0; i < ix->num_shards; i++) free(ix->shard_files[i]);
    free(ix->shard_files);
    memset(ix, 0, sizeof *ix);
}
