/* A checkpoint directory: the index (when there is one) is cross-checked against every shard header, so a
 * name resolves to exactly one mapped tensor or the open fails naming the shard. */
#include "format/checkpoint.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/error.h"
#include "util/file.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

static char *join_path(const char *dir, const char *file) {
    size_t a = strlen(dir), b = strlen(file);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, file, b + 1);
    return p;
}

/* K3's index maps 497,220 tensor names to shard files (~60 MB of JSON); a file above this is not an index. */
#define INDEX_MAX_BYTES ((size_t)1 << 30)

static int by_tensor_name(const void *a, const void *b) {
    return strcmp((*(const k3c_st_tensor *const *)a)->name, (*(const k3c_st_tensor *const *)b)->name);
}

/* Records live in each shard's header array: the shard is the one whose array holds the pointer. */
const char *k3c_checkpoint_shard_path(const k3c_checkpoint *ck, const k3c_st_tensor *t) {
    for (int s = 0; s < ck->num_shards; s++) {
        const k3c_st_header *h = &ck->shards[s].header;
        if (t >= h->tensors && t < h->tensors + h->num_tensors) return ck->shards[s].path;
    }
    return "?";
}

static size_t index_find(const k3c_index *ix, const char *name) {
    size_t lo = 0, hi = ix->num_names;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ix->names[mid], name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return (size_t)-1;
}

/* Shards are kept in file-name order (model-00001-... first), whatever order the index mentions them in. */
typedef struct {
    const char *file;
    int index_shard;
} shard_ref;

static int by_shard_file(const void *a, const void *b) {
    return strcmp(((const shard_ref *)a)->file, ((const shard_ref *)b)->file);
}

/* Every indexed name is in the shard the index names, and every shard tensor is indexed to its own shard
 * (which also rules out a name in two shards). */
static int check_index(const k3c_checkpoint *ck, const k3c_index *ix, const int *slot, const char *index_path) {
    for (size_t i = 0; i < ix->num_names; i++) {
        const k3c_st_file *f = &ck->shards[slot[ix->shard_of[i]]];
        if (!k3c_st_header_find(&f->header, ix->names[i]))
            return k3c_errorf("%s: tensor %s is indexed in %s, but that shard has no such tensor", index_path,
                              ix->names[i], f->path);
    }
    unsigned long long payload = 0;
    for (int s = 0; s < ck->num_shards; s++) {
        const k3c_st_file *f = &ck->shards[s];
        for (size_t j = 0; j < f->header.num_tensors; j++) {
            const k3c_st_tensor *t = &f->header.tensors[j];
            size_t i = index_find(ix, t->name);
            if (i == (size_t)-1)
                return k3c_errorf("%s: tensor %s is not in the index %s", f->path, t->name, index_path);
            if (slot[ix->shard_of[i]] != s)
                return k3c_errorf("%s: tensor %s is also in this shard, but the index places it in %s (a name in two shards)",
                                  f->path, t->name, ck->shards[slot[ix->shard_of[i]]].path);
            payload += t->end - t->begin;
        }
    }
    if (ix->total_size && ix->total_size != payload)
        return k3c_errorf("%s: metadata.total_size is %llu, but the shards' tensors hold %llu bytes", index_path,
                          ix->total_size, payload);
    return K3C_OK;
}

/* The merged name table over all shards, sorted; a name in two shards is an error. */
static int build_table(k3c_checkpoint *ck) {
    size_t n = 0;
    for (int s = 0; s < ck->num_shards; s++) n += ck->shards[s].header.num_tensors;
    ck->tensors = malloc((n ? n : 1) * sizeof *ck->tensors);
    if (!ck->tensors) return k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory for %zu tensors", ck->dir, n);
    size_t k = 0;
    for (int s = 0; s < ck->num_shards; s++)
        for (size_t j = 0; j < ck->shards[s].header.num_tensors; j++) ck->tensors[k++] = &ck->shards[s].header.tensors[j];
    ck->num_tensors = n;
    qsort(ck->tensors, n, sizeof *ck->tensors, by_tensor_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(ck->tensors[i - 1]->name, ck->tensors[i]->name) == 0)
            return k3c_errorf("%s: tensor %s is in two shards: %s and %s", ck->dir, ck->tensors[i]->name,
                              k3c_checkpoint_shard_path(ck, ck->tensors[i - 1]),
                              k3c_checkpoint_shard_path(ck, ck->tensors[i]));
    return K3C_OK;
}

int k3c_checkpoint_open(k3c_checkpoint *ck, const char *dir) {
    memset(ck, 0, sizeof *ck);
    k3c_index ix = {0};
    char *index_path = NULL, *json = NULL;
    shard_ref *order = NULL; /* shards in the order they are opened */
    int *slot = NULL;        /* index shard number -> position in ck->shards */
    int rc = K3C_ERR;
    if (!(ck->dir = strdup(dir)) || !(index_path = join_path(dir, INDEX_NAME))) {
        k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", dir);
        goto done;
    }
    struct stat st;
    if (stat(index_path, &st) == 0) {
        size_t len = 0;
        if (k3c_read_file(index_path, INDEX_MAX_BYTES, &json, &len) != K3C_OK) goto done;
        if (k3c_index_parse(json, len, index_path, &ix) != K3C_OK) goto done;
        free(json);
        json = NULL;
        if (!(ck->shards = calloc((size_t)ix.num_shards, sizeof *ck->shards))) {
            k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", dir);
            goto done;
        }
        order = malloc((size_t)ix.num_shards * sizeof *order);
        slot = malloc((size_t)ix.num_shards * sizeof *slot);
        if (!order || !slot) {
            k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", dir);
            goto done;
        }
        for (int s = 0; s < ix.num_shards; s++) order[s] = (shard_ref){ix.shard_files[s], s};
        qsort(order, (size_t)ix.num_shards, sizeof *order, by_shard_file);
        for (int s = 0; s < ix.num_shards; s++) slot[order[s].index_shard] = s;
        for (int s = 0; s < ix.num_shards; s++) {
            char *path = join_path(dir, order[s].file);
            if (!path) {
                k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", dir);
                goto done;
            }
            int r = k3c_st_open(&ck->shards[s], path);
            free(path);
            if (r != K3C_OK) {
                k3c_error_context("%s: shard %d of %d", index_path, s + 1, ix.num_shards);
                goto done;
            }
            ck->num_shards = s + 1;
            ck->file_bytes += ck->shards[s].map_size;
        }
        if (check_index(ck, &ix, slot, index_path) != K3C_OK) goto done;
    } else {
        char *single = join_path(dir, SINGLE_NAME);
        if (!single) {
            k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", dir);
            goto done;
        }
        if (stat(single, &st) != 0) {
            free(single);
            k3c_errorf("no " SINGLE_NAME " or " INDEX_NAME " in %s", dir);
            goto done;
        }
        if (!(ck->shards = calloc(1, sizeof *ck->shards))) {
            free(single);
            k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", dir);
            goto done;
        }
        int r = k3c_st_open(&ck->shards[0], single);
        free(single);
        if (r != K3C_OK) goto done;
        ck->num_shards = 1;
        ck->file_bytes = ck->shards[0].map_size;
    }
    rc = build_table(ck);
done:
    free(order);
    free(slot);
    free(json);
    free(index_path);
    k3c_index_free(&ix);
    if (rc != K3C_OK) k3c_checkpoint_close(ck);
    return rc;
}

void k3c_checkpoint_close(k3c_checkpoint *ck) {
    for (int s = 0; s < ck->num_shards; s++) k3c_st_close(&ck->shards[s]);
    free(ck->shards);
    free(ck->tensors);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

long k3c_checkpoint_index(const k3c_checkpoint *ck, const char *name) {
    size_t lo = 0, hi = ck->num_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->tensors[mid]->name, name);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

const k3c_st_tensor *k3c_checkpoint_find(const k3c_checkpoint *ck, const char *name) {
    long i = k3c_checkpoint_index(ck, name);
    return i < 0 ? NULL : ck->tensors[i];
}
