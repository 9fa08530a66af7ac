/* Synthetic checkpoints (model/synth.h). The weights are random but scaled so a forward pass stays
 * well-conditioned through every layer: projections keep unit RMS (N(0,1)/sqrt(in)), writes into the
 * residual stream are halved (o_proj, down projections, latent up-projection), norm weights sit near 1,
 * the router is sharp enough that routing is decisive yet every expert is used, and the KDA decay spans
 * fast to slow heads. Values depend only on (seed, tensor name): each tensor draws from its own stream
 * seeded with seed ^ k3c_hash_str(name); an MXFP4 pair (packed, scale) shares the stream of its base name
 * because both come from quantizing the same f32 matrix. */
#include "model/synth.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/config_json.h"
#include "format/mxfp4.h"
#include "format/safetensors.h"
#include "model/inventory.h"
#include "model/presets.h"
#include "text/tokenizer.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/rng.h"

/* ---------------------------------------------------------------- values ---- */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/* Standard deviation of a bf16 matrix's entries. */
static double matrix_std(const k3c_tensor_spec *s) {
    const char *n = s->name;
    double cols = (double)s->shape[1];
    if (ends_with(n, "embed_tokens.weight")) return 1.0; /* unit-RMS hidden states from the start */
    if (ends_with(n, "block_sparse_moe.gate.weight")) return 2.0 / sqrt(cols); /* router: decisive scores */
    if (ends_with(n, "routed_expert_down_proj.weight")) return 1.0 / sqrt(cols); /* into the latent, not residual */
    /* Everything that writes into the residual stream: half gain so the stream grows slowly with depth. */
    if (ends_with(n, "o_proj.weight") || ends_with(n, "down_proj.weight") || ends_with(n, "routed_expert_up_proj.weight") ||
        ends_with(n, ".w2.weight"))
        return 0.5 / sqrt(cols);
    return 1.0 / sqrt(cols);
}

/* The f32 values of a small vector tensor, all stored entries (padding included). */
static void vector_values(const k3c_config *c, const k3c_tensor_spec *s, k3c_rng *r, float *v, size_t n) {
    const char *name = s->name;
    if (ends_with(name, "A_log")) {
        /* A = exp(A_log) in [1, 16]; K3's padding entries stay exactly zero. */
        for (size_t i = 0; i < n; i++) v[i] = i < (size_t)s->vec_len ? (float)log(1.0 + 15.0 * k3c_rng_uniform(r)) : 0.0f;
    } else if (ends_with(name, "dt_bias")) {
        if (c->kda_has_lower_bound) {
            /* Safe gate g = lb * sigmoid(A * (f + dt_bias)), f ~ N(0,1): a bias near -2 puts heads with
             * A ~ 1 at decay ~0.5 per token and heads with A ~ 16 near 1 (long memory). */
            for (size_t i = 0; i < n; i++) v[i] = (float)(-2.0 + 0.5 * k3c_rng_normal(r));
        } else {
            /* g = -A * softplus(f + dt_bias): dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1]
             * (the usual Mamba-style init), so decays fall in about [0.85, 1). */
            for (size_t i = 0; i < n; i++) {
                double dt = exp(log(1e-3) + (log(1e-1) - log(1e-3)) * k3c_rng_uniform(r));
                v[i] = (float)(dt + log(-expm1(-dt)));
            }
        }
    } else if (ends_with(name, "conv1d.weight")) {
        for (size_t i = 0; i < n; i++) v[i] = (float)(0.5 * k3c_rng_normal(r));
    } else if (ends_with(name, "e_score_correction_bias")) {
        for (size_t i = 0; i < n; i++) v[i] = (float)(0.01 * k3c_rng_normal(r));
    } else if (ends_with(name, "_res_proj.weight")) {
        /* AttnRes pseudo-query: logits w . norm(v) have unit spread, so the depth softmax is not uniform. */
        double std = 1.0 / sqrt((double)c->hidden_size);
        for (size_t i = 0; i < n; i++) v[i] = (float)(std * k3c_rng_normal(r));
    } else { /* RMSNorm weights */
        for (size_t i = 0; i < n; i++) v[i] = (float)(1.0 + 0.1 * k3c_rng_normal(r));
    }
}

typedef struct synth_ctx {
    const k3c_config *c;
    uint64_t seed;
    int threads;                   /* generator threads (>= 1) */
    const k3c_tensor_spec **specs; /* the entries of the file being written, in write order */
    float *row;                    /* scratch: one f32 row (vectors) */
    size_t row_cap;
    /* The other half of the last MXFP4 pair generated: both tensors of a pair come from one f32 matrix,
     * generated once when they are written one after the other (as the dtype-then-name order does). */
    char pair_base[sizeof ((k3c_tensor_spec *)0)->name];
    int pair_cls;       /* the class the cached bytes belong to, 0 = none */
    uint8_t *pair;      /* [pair_cap] */
    size_t pair_len, pair_cap;
    uint64_t done, total; /* tensor bytes written so far, of all files */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
} synth_ctx;

static int scratch(synth_ctx *x, size_t n) {
    if (n <= x->row_cap) return K3C_OK;
    float *row = realloc(x->row, n * sizeof *row);
    if (!row) return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory for a synth row of %zu values", n);
    x->row = row;
    x->row_cap = n;
    return K3C_OK;
}

/* ---- generation split over threads ----
 * A tensor's values are one stream (seed ^ name hash) read in element order, two draws per normal value.
 * A thread generating elements from e0 on jumps its copy of the stream ahead by 2 e0 draws (k3c_rng_jump),
 * so the bytes are the same for every thread count. */
#define SYNTH_PAR_MIN 16384 /* elements per thread below which a tensor is generated on one thread */

typedef struct synth_part {
    uint64_t stream;        /* seed ^ name hash */
    double std;
    int64_t cols;           /* MXFP4: row width (f32 values), group size g */
    int g;
    int64_t b, e;           /* MATRIX: elements [b, e); MXFP4: rows [b, e) */
    uint8_t *out;           /* MATRIX: bf16 bytes; MXFP4: packed rows */
    uint8_t *scale;         /* MXFP4: scale rows */
    int failed;
} synth_part;

static void *matrix_part(void *arg) {
    synth_part *p = arg;
    k3c_rng r;
    k3c_rng_seed(&r, p->stream);
    k3c_rng_jump(&r, 2 * (uint64_t)p->b);
    for (int64_t i = p->b; i < p->e; i++) {
        uint16_t h = f32_to_bf16((float)(p->std * k3c_rng_normal(&r)));
        memcpy(p->out + 2 * i, &h, 2);
    }
    return NULL;
}

static void *mxfp4_part(void *arg) {
    synth_part *p = arg;
    int64_t cols = p->cols;
    float *row = malloc((size_t)cols * sizeof *row);
    uint8_t *pk = malloc((size_t)cols / 2 + 1), *sc = malloc((size_t)(cols / p->g) + 1);
    if (!row || !pk || !sc) {
        p->failed = 1;
    } else {
        k3c_rng r;
        k3c_rng_seed(&r, p->stream);
        k3c_rng_jump(&r, 2 * (uint64_t)p->b * (uint64_t)cols);
        for (int64_t i = p->b; i < p->e; i++) {
            for (int64_t j = 0; j < cols; j++) row[j] = (float)(p->std * k3c_rng_normal(&r));
            k3c_mxfp4_quant_row(row, (int)cols, pk, sc);
            memcpy(p->out + (size_t)i * (size_t)(cols / 2), pk, (size_t)(cols / 2));
            memcpy(p->scale + (size_t)i * (size_t)(cols / p->g), sc, (size_t)(cols / p->g));
        }
    }
    free(row);
    free(pk);
    free(sc);
    return NULL;
}

/* Runs fn on `proto` split into up to x->threads equal parts of [0, n) (fewer when the parts would hold less
 * than SYNTH_PAR_MIN elements, `per` elements per unit of n), the caller taking the first. */
static int run_parts(const synth_ctx *x, const synth_part *proto, int64_t n, int64_t per, void *(*fn)(void *)) {
    int parts = x->threads;
    int64_t most = n * per / SYNTH_PAR_MIN;
    if (parts > most) parts = most > 1 ? (int)most : 1;
    if (parts > n) parts = n > 1 ? (int)n : 1;
    synth_part p[parts];
    pthread_t tid[parts];
    int started[parts];
    for (int i = 0; i < parts; i++) {
        p[i] = *proto;
        p[i].b = n * i / parts;
        p[i].e = n * (i + 1) / parts;
        started[i] = i > 0 && pthread_create(&tid[i], NULL, fn, &p[i]) == 0;
    }
    fn(&p[0]);
    for (int i = 1; i < parts; i++) {
        if (started[i]) pthread_join(tid[i], NULL);
        else fn(&p[i]); /* no thread: the caller does that part too */
    }
    for (int i = 0; i < parts; i++)
        if (p[i].failed) return k3c_errorf("out of memory for synth rows of %lld values", (long long)proto->cols);
    return K3C_OK;
}

static int fill_tensor(void *ctx, size_t index, const k3c_st_entry *e, void *bytes, size_t nbytes) {
    synth_ctx *x = ctx;
    const k3c_tensor_spec *s = x->specs[index];
    if (nbytes != k3c_tensor_spec_bytes(s))
        return k3c_errorf("synth: tensor %s: writer asked for %zu bytes, spec has %llu", s->name, nbytes,
                          (unsigned long long)k3c_tensor_spec_bytes(s));
    k3c_rng r;
    switch (s->cls) {
    case K3C_TENSOR_MATRIX: {
        synth_part p = {.stream = x->seed ^ k3c_hash_str(s->name), .std = matrix_std(s), .out = bytes};
        K3C_TRY(run_parts(x, &p, (int64_t)(nbytes / 2), 1, matrix_part));
        break;
    }
    case K3C_TENSOR_VECTOR: {
        k3c_rng_seed(&r, x->seed ^ k3c_hash_str(s->name));
        size_t n = nbytes / k3c_dtype_size(s->dtype);
        K3C_TRY(scratch(x, n));
        vector_values(x->c, s, &r, x->row, n);
        uint8_t *out = bytes;
        for (size_t i = 0; i < n; i++) {
            if (s->dtype == K3C_DTYPE_F32) {
                memcpy(out + 4 * i, &x->row[i], 4);
            } else {
                uint16_t h = f32_to_bf16(x->row[i]);
                memcpy(out + 2 * i, &h, 2);
            }
        }
        break;
    }
    case K3C_TENSOR_MXFP4_PACKED:
    case K3C_TENSOR_MXFP4_SCALE: {
        /* Both tensors of a pair come from the same f32 matrix, drawn from the base name's stream: the one
         * written first generates it and keeps the other's bytes for it. */
        char base[sizeof s->name];
        snprintf(base, sizeof base, "%s", s->name);
        char *dot = strrchr(base, '.');
        if (dot) *dot = '\0'; /* "...experts.E.w1" */
        if (x->pair_cls == (int)s->cls && x->pair_len == nbytes && !strcmp(x->pair_base, base)) {
            memcpy(bytes, x->pair, nbytes);
            x->pair_cls = 0;
            break;
        }
        int g = x->c->mxfp4_group_size > 0 ? x->c->mxfp4_group_size : K3C_MXFP4_GROUP;
        int64_t rows = s->shape[0];
        int64_t cols = s->cls == K3C_TENSOR_MXFP4_PACKED ? s->shape[1] * 2 : s->shape[1] * g;
        size_t other = s->cls == K3C_TENSOR_MXFP4_PACKED ? (size_t)rows * (size_t)(cols / g)
                                                          : (size_t)rows * (size_t)(cols / 2);
        if (other > x->pair_cap) {
            uint8_t *q = realloc(x->pair, other);
            if (!q) return k3c_errorf("out of memory for the %zu-byte half of MXFP4 pair %s", other, base);
            x->pair = q;
            x->pair_cap = other;
        }
        x->pair_cls = 0;
        synth_part p = {.stream = x->seed ^ k3c_hash_str(base), .std = 1.0 / sqrt((double)cols), .cols = cols, .g = g};
        p.out = s->cls == K3C_TENSOR_MXFP4_PACKED ? bytes : x->pair;
        p.scale = s->cls == K3C_TENSOR_MXFP4_PACKED ? x->pair : bytes;
        K3C_TRY(run_parts(x, &p, rows, cols, mxfp4_part));
        snprintf(x->pair_base, sizeof x->pair_base, "%s", base);
        x->pair_cls = s->cls == K3C_TENSOR_MXFP4_PACKED ? K3C_TENSOR_MXFP4_SCALE : K3C_TENSOR_MXFP4_PACKED;
        x->pair_len = other;
        break;
    }
    default:
        return k3c_errorf("synth: tensor %s: unknown class %d", s->name, (int)s->cls);
    }
    x->done += nbytes;
    if (x->progress) x->progress(x->progress_ctx, x->done, x->total);
    return K3C_OK;
}

/* ------------------------------------------------------------- layout ---- */

/* safetensors' own writer orders tensors by dtype (wider first) then name; mirroring it makes a synth
 * shard look like a published one, down to the lexicographic expert order (0, 1, 10, 100, ...). */
static int dtype_rank(k3c_dtype t) {
    switch (t) {
    case K3C_DTYPE_F32: return 3;
    case K3C_DTYPE_BF16: return 2;
    case K3C_DTYPE_F16: return 1;
    default: return 0;
    }
}

static int by_dtype_then_name(const void *a, const void *b) {
    const k3c_tensor_spec *x = *(const k3c_tensor_spec *const *)a, *y = *(const k3c_tensor_spec *const *)b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}

static int write_shard(synth_ctx *x, const char *path, const k3c_tensor_spec **specs, size_t n) {
    qsort(specs, n, sizeof *specs, by_dtype_then_name);
    k3c_st_entry *entries = calloc(n ? n : 1, sizeof *entries);
    if (!entries) return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory for %zu shard entries", n);
    for (size_t i = 0; i < n; i++) {
        entries[i].name = specs[i]->name;
        entries[i].dtype = specs[i]->dtype;
        entries[i].ndim = specs[i]->ndim;
        for (int d = 0; d < specs[i]->ndim; d++) entries[i].shape[d] = specs[i]->shape[d];
    }
    x->specs = specs;
    int rc = k3c_st_write(path, entries, n, fill_tensor, x);
    free(entries);
    if (rc != K3C_OK) return k3c_error_context("synth: writing %s", path);
    return K3C_OK;
}

typedef struct index_row {
    const char *name;
    int shard;
} index_row;

static int by_row_name(const void *a, const void *b) {
    return strcmp(((const index_row *)a)->name, ((const index_row *)b)->name);
}

/* model.safetensors.index.json as transformers writes it: metadata.total_size (payload bytes) and the
 * weight_map sorted by tensor name. Names are [A-Za-z0-9._] only, so no JSON escaping is needed. */
static int write_index(const char *dir, const k3c_inventory *inv, const int *shard_of, char (*files)[64],
                       uint64_t total) {
    index_row *rows = malloc(sizeof *rows * (inv->count ? inv->count : 1));
    if (!rows) return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory for the index of %zu tensors", inv->count);
    for (size_t i = 0; i < inv->count; i++) rows[i] = (index_row){inv->specs[i].name, shard_of[i]};
    qsort(rows, inv->count, sizeof *rows, by_row_name);
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(rows);
        return k3c_errorf_kind(K3C_ERROR_IO, "synth: cannot create %s: %s", tmp, strerror(errno));
    }
    fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n", (unsigned long long)total);
    for (size_t i = 0; i < inv->count; i++)
        fprintf(f, "    \"%s\": \"%s\"%s\n", rows[i].name, files[rows[i].shard], i + 1 < inv->count ? "," : "");
    fprintf(f, "  }\n}\n");
    free(rows);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        unlink(tmp);
        return k3c_errorf_kind(K3C_ERROR_IO, "synth: writing %s failed", tmp);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return k3c_errorf_kind(K3C_ERROR_IO, "synth: renaming %s to %s: %s", tmp, path, strerror(errno));
    }
    return K3C_OK;
}

/* ------------------------------------------------------------ directory ---- */

static int mkdir_p(const char *dir) {
    char buf[4096];
    if ((size_t)snprintf(buf, sizeof buf, "%s", dir) >= sizeof buf) return k3c_errorf("synth: path too long: %s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return k3c_errorf_kind(K3C_ERROR_IO, "synth: mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return k3c_errorf_kind(K3C_ERROR_IO, "synth: mkdir %s: %s", buf, strerror(errno));
    return K3C_OK;
}

/* The files a synth run writes (and so may remove when it rewrites its own output). */
static int is_checkpoint_file(const char *name) {
    return !strcmp(name, "config.json") || !strcmp(name, "model.safetensors") || !strcmp(name, "tiktoken.model") ||
           !strcmp(name, "tokenizer_config.json") ||
           !strcmp(name, "model.safetensors.index.json") || !fnmatch("model-*-of-*.safetensors", name, 0) ||
           !fnmatch("*.tmp", name, 0);
}

/* Creates DIR, or accepts an empty one, or a previous synth output (whose checkpoint files it removes so
 * no stale shard or index survives a change of preset). Anything else is refused. */
static int prepare_dir(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT) return k3c_errorf_kind(K3C_ERROR_IO, "synth: %s: %s", dir, strerror(errno));
        return mkdir_p(dir);
    }
    if (!S_ISDIR(st.st_mode)) return k3c_errorf("synth: %s exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (!d) return k3c_errorf_kind(K3C_ERROR_IO, "synth: cannot open directory %s: %s", dir, strerror(errno));
    int entries = 0, marker = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        entries++;
        if (!strcmp(de->d_name, K3C_SYNTH_MARKER)) marker = 1;
    }
    if (entries && !marker) {
        closedir(d);
        return k3c_errorf("synth: refusing to write into %s: the directory is not empty and is not a k3c synth "
                          "output (no %s marker)",
                          dir, K3C_SYNTH_MARKER);
    }
    rewinddir(d);
    while ((de = readdir(d))) {
        if (!is_checkpoint_file(de->d_name)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (unlink(path) != 0 && errno != ENOENT) {
            closedir(d);
            return k3c_errorf_kind(K3C_ERROR_IO, "synth: cannot remove the previous %s: %s", path, strerror(errno));
        }
    }
    closedir(d);
    return K3C_OK;
}

static int write_marker(const char *dir, const char *preset, uint64_t seed) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, K3C_SYNTH_MARKER);
    FILE *f = fopen(path, "w");
    if (!f) return k3c_errorf_kind(K3C_ERROR_IO, "synth: cannot create %s: %s", path, strerror(errno));
    fprintf(f, "k3c synth\npreset %s\nseed %llu\n", preset ? preset : "(config)", (unsigned long long)seed);
    if (fclose(f) != 0) return k3c_errorf_kind(K3C_ERROR_IO, "synth: writing %s failed", path);
    return K3C_OK;
}

/* -------------------------------------------------------------- driver ---- */

static int write_weights(const k3c_config *c, uint64_t seed, const char *dir, const k3c_synth_options *o) {
    k3c_inventory inv;
    K3C_TRY(k3c_inventory_build(c, NULL, &inv));
    synth_ctx x = {.c = c, .seed = seed, .threads = o && o->threads > 0 ? o->threads : 0};
    if (x.threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        x.threads = n > 0 ? (int)n : 1;
    }
    if (o) {
        x.progress = o->progress;
        x.progress_ctx = o->progress_ctx;
    }
    for (size_t i = 0; i < inv.count; i++) x.total += k3c_tensor_spec_bytes(&inv.specs[i]);
    const k3c_tensor_spec **list = malloc(sizeof *list * (inv.count ? inv.count : 1));
    int *shard_of = malloc(sizeof *shard_of * (inv.count ? inv.count : 1));
    int rc = K3C_ERR;
    char path[4096];
    if (!list || !shard_of) {
        k3c_errorf_kind(K3C_ERROR_OOM, "out of memory planning %zu tensors", inv.count);
        goto done;
    }
    if (c->family == K3C_FAMILY_KIMI_LINEAR) {
        for (size_t i = 0; i < inv.count; i++) list[i] = &inv.specs[i];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = write_shard(&x, path, list, inv.count);
        goto done;
    }
    /* K3: shard n (1-based) holds layer n-1, shard L+1 the model-level tensors (spec §4). */
    int total = c->num_layers + 1;
    char(*files)[64] = malloc(sizeof *files * (size_t)total);
    if (!files) {
        k3c_errorf_kind(K3C_ERROR_OOM, "out of memory naming %d shards", total);
        goto done;
    }
    uint64_t total_bytes = 0;
    for (int sh = 0; sh < total; sh++) {
        int layer = sh < c->num_layers ? sh : -1;
        snprintf(files[sh], sizeof files[sh], "model-%05d-of-%06d.safetensors", sh + 1, total);
        size_t n = 0;
        for (size_t i = 0; i < inv.count; i++) {
            if (inv.specs[i].layer != layer) continue;
            list[n++] = &inv.specs[i];
            shard_of[i] = sh;
            total_bytes += k3c_tensor_spec_bytes(&inv.specs[i]);
        }
        snprintf(path, sizeof path, "%s/%s", dir, files[sh]);
        if (write_shard(&x, path, list, n) != K3C_OK) {
            free(files);
            goto done;
        }
    }
    rc = write_index(dir, &inv, shard_of, files, total_bytes);
    free(files);
done:
    free(list);
    free(shard_of);
    free(x.row);
    free(x.pair);
    k3c_inventory_free(&inv);
    return rc;
}

int k3c_synth_write(const k3c_config *c, const char *preset_name, uint64_t seed, const char *dir) {
    return k3c_synth_write_opts(c, preset_name, seed, dir, NULL);
}

int k3c_synth_write_opts(const k3c_config *c, const char *preset_name, uint64_t seed, const char *dir,
                         const k3c_synth_options *o) {
    if (!c || !dir || !*dir)
        return k3c_errorf("synth: %s", !c ? "no config (NULL)" : dir ? "an empty directory path" : "no directory (NULL)");
    if (k3c_config_validate(c) != K3C_OK) return k3c_error_context("synth %s", preset_name ? preset_name : dir);
    /* every file path below is dir + "/" + a name of at most 40 bytes, formatted into 4096-byte buffers:
     * checked once here, so none of them can be truncated into a different path */
    if (strlen(dir) + 64 > 4096)
        return k3c_errorf("synth: directory path too long (%zu bytes): %.80s...", strlen(dir), dir);
    K3C_TRY(prepare_dir(dir));
    K3C_TRY(write_marker(dir, preset_name, seed));
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    /* the tokenizer written below decides bos / eos / pad where it fills the vocabulary (a published model's
     * larger vocabulary keeps the config's own ids) */
    k3c_config ids = *c; /* a shallow copy: written, never freed */
    int32_t bos, eos, pad;
    if (k3c_tokenizer_default_ids(c->family == K3C_FAMILY_K3, c->vocab_size, &bos, &eos, &pad)) {
        ids.bos_token_id = bos;
        ids.eos_token_id = eos;
        ids.pad_token_id = pad;
    }
    K3C_TRY(k3c_config_write_json(&ids, path));
    /* a published checkpoint ships its tokenizer beside the weights: the embedded default, sized to the vocab */
    if (k3c_tokenizer_write_default(dir, c->family == K3C_FAMILY_K3, c->vocab_size) != K3C_OK)
        return k3c_error_context("synth: tokenizer");
    if (preset_name && !k3c_preset_has_weights(preset_name)) return K3C_OK;
    return write_weights(c, seed, dir, o);
}

/* ------------------------------------------------------- device-synthetic ---- */

double k3c_synth_matrix_std(const k3c_tensor_spec *s) { return matrix_std(s); }

void k3c_synth_vector_values(const k3c_config *c, const k3c_tensor_spec *s, uint64_t seed, float *v, size_t n) {
    k3c_rng r;
    k3c_rng_seed(&r, seed ^ k3c_hash_str(s->name));
    vector_values(c, s, &r, v, n);
}
