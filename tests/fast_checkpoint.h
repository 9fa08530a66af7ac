/* Test and benchmark helper: a checkpoint of any config written fast (GB/s, not synth's MB/s), for tests and
 * benchmarks of loading, which do not look at the values beyond the loader's checks: bf16 matrices random and
 * finite (|v| < 2), MXFP4 codes random with scales 120..127, vectors zero (finite; K3's A_log padding must be
 * zero). Laid out as HF publishes: config.json, one shard per layer and one of the model-level tensors, each in
 * safetensors' writer order (dtype, then name), and model.safetensors.index.json. */
#ifndef K3C_TESTS_FAST_CHECKPOINT_H
#define K3C_TESTS_FAST_CHECKPOINT_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/config_json.h"
#include "format/safetensors.h"
#include "model/inventory.h"
#include "util/error.h"
#include "util/rng.h"

typedef struct fast_writer {
    const k3c_tensor_spec **specs; /* of the shard being written, in write order */
    uint64_t seed;
} fast_writer;

static int fast_fill(void *ctx, size_t index, const k3c_st_entry *e, void *bytes, size_t nbytes) {
    fast_writer *w = (fast_writer *)ctx;
    const k3c_tensor_spec *s = w->specs[index];
    uint64_t x = w->seed ^ k3c_hash_str(s->name);
    uint8_t *p = (uint8_t *)bytes;
    if (s->cls == K3C_TENSOR_VECTOR) {
        memset(p, 0, nbytes);
        return K3C_OK;
    }
    size_t i = 0;
    for (; i + 8 <= nbytes; i += 8) {
        uint64_t v = k3c_splitmix64(&x);
        if (s->cls == K3C_TENSOR_MATRIX) v &= 0xBFFFBFFFBFFFBFFFull; /* bf16 exponent below 128: finite, |v| < 2 */
        if (s->cls == K3C_TENSOR_MXFP4_SCALE) v = (v & 0x0707070707070707ull) + 0x7878787878787878ull;
        memcpy(p + i, &v, 8);
    }
    for (; i < nbytes; i++) p[i] = s->cls == K3C_TENSOR_MXFP4_SCALE ? 124 : s->cls == K3C_TENSOR_MATRIX ? 0 : 7;
    return K3C_OK;
}

static int fast_dtype_rank(k3c_dtype t) {
    return t == K3C_DTYPE_F32 ? 3 : t == K3C_DTYPE_BF16 ? 2 : t == K3C_DTYPE_F16 ? 1 : 0;
}

static int fast_by_dtype_then_name(const void *a, const void *b) {
    const k3c_tensor_spec *x = *(const k3c_tensor_spec *const *)a, *y = *(const k3c_tensor_spec *const *)b;
    int rx = fast_dtype_rank(x->dtype), ry = fast_dtype_rank(y->dtype);
    return rx != ry ? ry - rx : strcmp(x->name, y->name);
}

static int fast_path(char *out, const char *dir, const char *name) {
    if ((size_t)snprintf(out, 4096, "%s/%s", dir, name) >= 4096) return k3c_errorf("path too long: %s/%s", dir, name);
    return K3C_OK;
}

static int fast_shard_name(char *out, size_t n, int shard, int shards) {
    return snprintf(out, n, "model-%05d-of-%05d.safetensors", shard + 1, shards) < (int)n ? K3C_OK : K3C_ERR;
}

/* Writes DIR (created if missing) for config c. */
static int fast_checkpoint_write(const k3c_config *c, const char *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return k3c_errorf("mkdir %s: %s", dir, strerror(errno));
    char path[4096], name[64];
    K3C_TRY(fast_path(path, dir, "config.json"));
    K3C_TRY(k3c_config_write_json(c, path));
    k3c_inventory inv;
    K3C_TRY(k3c_inventory_build(c, NULL, &inv));
    const k3c_tensor_spec **list = (const k3c_tensor_spec **)malloc(sizeof *list * (inv.count + 1));
    k3c_st_entry *entries = (k3c_st_entry *)calloc(inv.count + 1, sizeof *entries);
    int *shard_of = (int *)malloc(sizeof *shard_of * (inv.count + 1));
    int rc = K3C_ERR, shards = c->num_layers + 1;
    uint64_t total = 0;
    FILE *f = NULL;
    if (!list || !entries || !shard_of) {
        k3c_errorf("out of memory for %zu tensors", inv.count);
        goto done;
    }
    for (int sh = 0; sh < shards; sh++) {
        int layer = sh < c->num_layers ? sh : -1;
        size_t n = 0;
        for (size_t i = 0; i < inv.count; i++)
            if (inv.specs[i].layer == layer) {
                list[n++] = &inv.specs[i];
                shard_of[i] = sh;
                total += k3c_tensor_spec_bytes(&inv.specs[i]);
            }
        qsort(list, n, sizeof *list, fast_by_dtype_then_name);
        for (size_t i = 0; i < n; i++) {
            memset(&entries[i], 0, sizeof entries[i]);
            entries[i].name = list[i]->name;
            entries[i].dtype = list[i]->dtype;
            entries[i].ndim = list[i]->ndim;
            for (int d = 0; d < list[i]->ndim; d++) entries[i].shape[d] = list[i]->shape[d];
        }
        fast_writer w = {list, 0x10adull};
        if (fast_shard_name(name, sizeof name, sh, shards) != K3C_OK || fast_path(path, dir, name) != K3C_OK ||
            k3c_st_write(path, entries, n, fast_fill, &w) != K3C_OK)
            goto done;
    }
    if (fast_path(path, dir, "model.safetensors.index.json") != K3C_OK) goto done;
    if (!(f = fopen(path, "w"))) {
        k3c_errorf("cannot create %s: %s", path, strerror(errno));
        goto done;
    }
    fprintf(f, "{\"metadata\": {\"total_size\": %llu}, \"weight_map\": {", (unsigned long long)total);
    for (size_t i = 0; i < inv.count; i++) {
        fast_shard_name(name, sizeof name, shard_of[i], shards);
        fprintf(f, "%s\"%s\": \"%s\"", i ? ", " : "", inv.specs[i].name, name);
    }
    fprintf(f, "}}\n");
    if (fclose(f) != 0) {
        k3c_errorf("writing %s failed", path);
        goto done;
    }
    rc = K3C_OK;
done:
    free(list);
    free(entries);
    free(shard_of);
    k3c_inventory_free(&inv);
    return rc;
}

/* Removes what fast_checkpoint_write wrote for a config of `layers` layers, and DIR when it is then empty. */
static void fast_checkpoint_remove(const char *dir, int layers) {
    char path[4096], name[64];
    for (int sh = 0; sh <= layers; sh++)
        if (fast_shard_name(name, sizeof name, sh, layers + 1) == K3C_OK && fast_path(path, dir, name) == K3C_OK)
            unlink(path);
    if (fast_path(path, dir, "model.safetensors.index.json") == K3C_OK) unlink(path);
    if (fast_path(path, dir, "config.json") == K3C_OK) unlink(path);
    rmdir(dir);
}

#endif
