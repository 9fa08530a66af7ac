/* k3c_model_load: config.json -> inventory -> every tensor found, checked (dtype, shape, values where cheap
 * and meaningful) and bound. Matrices stay in the mapping; small vectors become owned f32 arrays. Any
 * checkpoint tensor the inventory does not name is an error, except K3's vision tower and projector,
 * which a text engine skips (168 tensors of the released checkpoint). */
#include "model/model.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "format/config_json.h"
#include "format/mxfp4.h"
#include "util/bf16.h"
#include "util/error.h"

static void shape_str(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

static int check_dtype(const k3c_tensor_spec *s, const k3c_st_tensor *t, const char *file) {
    int ok;
    switch (s->cls) {
    /* F32 / F16 are converted to the bf16 the kernels read, when every value converts exactly (convert_matrix) */
    case K3C_TENSOR_MATRIX:
        ok = t->dtype == K3C_DTYPE_BF16 || t->dtype == K3C_DTYPE_F32 || t->dtype == K3C_DTYPE_F16;
        break;
    case K3C_TENSOR_VECTOR:
        ok = t->dtype == K3C_DTYPE_BF16 || t->dtype == K3C_DTYPE_F16 || t->dtype == K3C_DTYPE_F32;
        break;
    default: ok = t->dtype == K3C_DTYPE_U8; break;
    }
    if (ok) return K3C_OK;
    const char *want = s->cls == K3C_TENSOR_MATRIX   ? "BF16"
                       : s->cls == K3C_TENSOR_VECTOR ? "BF16, F16 or F32"
                                                     : "U8 (MXFP4)";
    return k3c_errorf("tensor %s in %s: expected dtype %s, got %s", s->name, file, want, k3c_dtype_name(t->dtype));
}

static int check_shape(const k3c_tensor_spec *s, const k3c_st_tensor *t, const char *file) {
    int same = t->ndim == s->ndim;
    for (int i = 0; same && i < s->ndim; i++) same = t->shape[i] == s->shape[i];
    if (same) return K3C_OK;
    char want[96], got[96];
    shape_str(want, sizeof want, s->ndim, s->shape);
    shape_str(got, sizeof got, t->ndim, t->shape);
    return k3c_errorf("tensor %s in %s: expected shape %s, got %s", s->name, file, want, got);
}

static float element_f32(const void *data, k3c_dtype dt, size_t i) {
    const uint8_t *p = data;
    switch (dt) {
    case K3C_DTYPE_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case K3C_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return f16_to_f32(h);
    }
    default: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return bf16_to_f32(h);
    }
    }
}

/* Converts a small float tensor to an owned f32 array of vec_len entries. Stored entries past vec_len
 * (K3's A_log padding) must be zero: anything else means the layout is not what we think it is. */
static int bind_vector(const k3c_tensor_spec *s, const k3c_st_tensor *t, const char *file, uint64_t *owned) {
    uint64_t numel = k3c_st_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(s->vec_len > 0 ? s->vec_len : 1));
    if (!v) return k3c_errorf_kind(K3C_ERROR_OOM, "tensor %s: out of memory for %d floats", s->name, s->vec_len);
    for (uint64_t i = 0; i < numel; i++) {
        float x = element_f32(t->data, t->dtype, (size_t)i);
        if (!isfinite(x)) {
            free(v);
            return k3c_errorf("tensor %s in %s: element %llu is %g (not finite)", s->name, file,
                              (unsigned long long)i, (double)x);
        }
        if (i < (uint64_t)s->vec_len) {
            v[i] = x;
        } else if (x != 0.0f) {
            free(v);
            return k3c_errorf("tensor %s in %s: padding entry %llu is %g, expected 0 (only the first %d entries "
                              "are real)",
                              s->name, file, (unsigned long long)i, (double)x, s->vec_len);
        }
    }
    free(*s->vec);
    *s->vec = v;
    *owned += sizeof(float) * (uint64_t)s->vec_len;
    return K3C_OK;
}

/* Keeps a buffer the model owns (freed by k3c_model_free). */
static int own(struct k3c_model *m, void *p) {
    if (m->n_owned == m->cap_owned) {
        size_t cap = m->cap_owned ? 2 * m->cap_owned : 8;
        void **o = realloc(m->owned, cap * sizeof *o);
        if (!o) return k3c_errorf("out of memory");
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return K3C_OK;
}

/* A matrix stored as F32 or F16 (transformers 5.24 keeps the MoE router in F32) becomes an owned bf16 copy,
 * the layout every kernel reads, when the conversion loses nothing: each value must be exactly a bf16 value.
 * A value that is not (an f32 router trained in f32) is refused: rounding it would change the routing. */
static int convert_matrix(struct k3c_model *m, const k3c_tensor_spec *s, const k3c_st_tensor *t, const char *file,
                          uint64_t *owned) {
    uint64_t n = k3c_st_numel(t);
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    if (!w) return k3c_errorf("tensor %s: out of memory converting %llu %s values to bf16", s->name,
                              (unsigned long long)n, k3c_dtype_name(t->dtype));
    for (uint64_t i = 0; i < n; i++) {
        float x = element_f32(t->data, t->dtype, (size_t)i);
        uint16_t h = f32_to_bf16(x);
        if (!isfinite(x) || bf16_to_f32(h) != x) {
            free(w);
            int64_t cols = s->shape[1];
            if (!isfinite(x))
                return k3c_errorf("tensor %s in %s: element %llu (row %lld, col %lld) is %g (not finite)", s->name,
                                  file, (unsigned long long)i, (long long)(i / (uint64_t)cols),
                                  (long long)(i % (uint64_t)cols), (double)x);
            return k3c_errorf("tensor %s in %s: expected dtype BF16, got %s whose element %llu (%.9g) is not a bf16 "
                              "value (the kernels read BF16: F32 and F16 are taken only when every value converts "
                              "without loss)",
                              s->name, file, k3c_dtype_name(t->dtype), (unsigned long long)i, (double)x);
        }
        w[i] = h;
    }
    if (own(m, w) != K3C_OK) {
        free(w);
        return k3c_errorf("tensor %s: out of memory", s->name);
    }
    if (s->mat) s->mat->w = w;
    *owned += sizeof(uint16_t) * n;
    return K3C_OK;
}

static int bind_spec(struct k3c_model *m, const k3c_tensor_spec *s, const k3c_st_tensor *t, const char *file,
                     uint64_t *owned) {
    K3C_TRY(check_dtype(s, t, file));
    K3C_TRY(check_shape(s, t, file));
    switch (s->cls) {
    case K3C_TENSOR_MATRIX:
        if (t->dtype != K3C_DTYPE_BF16) return convert_matrix(m, s, t, file, owned);
        /* Kernels read bf16 matrices as uint16_t: an odd data offset would be a misaligned view. */
        if ((uintptr_t)t->data % 2)
            return k3c_errorf("tensor %s in %s: data offset %llu is not 2-byte aligned", s->name, file,
                              (unsigned long long)t->begin);
        if (s->mat) s->mat->w = t->data;
        break;
    case K3C_TENSOR_VECTOR:
        if (s->vec) K3C_TRY(bind_vector(s, t, file, owned));
        break;
    case K3C_TENSOR_MXFP4_PACKED:
        if (s->mx) s->mx->packed = t->data;
        break;
    case K3C_TENSOR_MXFP4_SCALE:
        /* E8M0 255 is NaN: a corrupt or mis-identified tensor. Scanning all scales is 1/16 of the expert
         * bytes; it is the price of refusing a bad file at load instead of emitting NaN logits later. */
        if (k3c_mxfp4_scales_have_nan(t->data, (size_t)k3c_st_numel(t))) {
            const uint8_t *sc = t->data;
            uint64_t n = k3c_st_numel(t), i = 0;
            while (i < n && sc[i] != 255) i++;
            int64_t per_row = s->shape[1];
            return k3c_errorf("tensor %s in %s: MXFP4 scale byte 255 (E8M0 NaN) at row %lld, group %lld", s->name,
                              file, (long long)(i / (uint64_t)per_row), (long long)(i % (uint64_t)per_row));
        }
        if (s->mx) s->mx->scale = t->data;
        break;
    }
    return K3C_OK;
}

/* ---- every bf16 matrix finite ----
 * A NaN or Inf weight loads fine and turns every logit it touches into NaN (greedy then emits token 0 with
 * exit 0), so the mapped bf16 matrices are scanned once at load for an all-ones exponent. The scan reads every
 * matrix byte (the CPU would read them at the first step anyway, a device backend at its upload): 64-bit words
 * of four bf16, split in chunks over the machine's cores. Converted matrices were checked when converted, the
 * vectors when bound and MXFP4 scales by bind_spec; E2M1 codes have no NaN. */

/* Index of the first bf16 in w[0..n) whose exponent is all ones (Inf or NaN), or n. */
static size_t first_nonfinite_bf16(const uint16_t *w, size_t n) {
    const uint64_t E = 0x7f807f807f807f80ull, ONE = 0x0001000100010001ull, HI = 0x8000800080008000ull;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint64_t x;
        memcpy(&x, w + i, 8);
        uint64_t t = ~x & E; /* a lane is 0 exactly where all 8 exponent bits are set (lanes stay < 0x8000) */
        if ((t - ONE) & ~t & HI) break;
    }
    for (; i < n; i++)
        if ((w[i] & 0x7f80) == 0x7f80) return i;
    return n;
}

#define SCAN_CHUNK ((size_t)1 << 22) /* bf16 values per job: 8 MB */

typedef struct scan_job {
    size_t spec;       /* inventory index */
    size_t off, n;     /* element range of the matrix */
} scan_job;

typedef struct scan_ctx {
    const k3c_inventory *inv;
    scan_job *jobs;
    size_t njobs;
    atomic_size_t next;
    pthread_mutex_t mu;
    size_t bad_job, bad_elem; /* the first bad element in job order; bad_job = njobs: none */
} scan_ctx;

static void *scan_worker(void *arg) {
    scan_ctx *x = arg;
    for (;;) {
        size_t j = atomic_fetch_add(&x->next, 1);
        if (j >= x->njobs) return NULL;
        const scan_job *b = &x->jobs[j];
        const uint16_t *w = x->inv->specs[b->spec].mat->w + b->off;
        size_t k = first_nonfinite_bf16(w, b->n);
        if (k < b->n) {
            pthread_mutex_lock(&x->mu);
            if (j < x->bad_job) x->bad_job = j, x->bad_elem = b->off + k;
            pthread_mutex_unlock(&x->mu);
        }
    }
}

static int check_finite(struct k3c_model *m) {
    const k3c_inventory *inv = &m->inventory;
    const k3c_checkpoint *ck = &m->checkpoint;
    size_t njobs = 0, total = 0;
    for (size_t i = 0; i < inv->count; i++) {
        const k3c_tensor_spec *s = &inv->specs[i];
        if (s->cls != K3C_TENSOR_MATRIX || !s->mat || !s->mat->w) continue;
        const k3c_st_tensor *t = k3c_checkpoint_find(ck, s->name);
        if (!t || t->dtype != K3C_DTYPE_BF16) continue; /* converted: checked already */
        size_t n = (size_t)s->mat->rows * s->mat->cols;
        njobs += (n + SCAN_CHUNK - 1) / SCAN_CHUNK;
        total += n;
    }
    scan_ctx x = {.inv = inv, .njobs = njobs, .bad_job = njobs};
    x.jobs = malloc(sizeof *x.jobs * (njobs ? njobs : 1));
    if (!x.jobs) return k3c_errorf("out of memory scanning %zu weight chunks", njobs);
    size_t j = 0;
    for (size_t i = 0; i < inv->count; i++) {
        const k3c_tensor_spec *s = &inv->specs[i];
        if (s->cls != K3C_TENSOR_MATRIX || !s->mat || !s->mat->w) continue;
        const k3c_st_tensor *t = k3c_checkpoint_find(ck, s->name);
        if (!t || t->dtype != K3C_DTYPE_BF16) continue;
        size_t n = (size_t)s->mat->rows * s->mat->cols;
        for (size_t off = 0; off < n; off += SCAN_CHUNK)
            x.jobs[j++] = (scan_job){i, off, n - off < SCAN_CHUNK ? n - off : SCAN_CHUNK};
    }
    atomic_init(&x.next, 0);
    pthread_mutex_init(&x.mu, NULL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = total < ((size_t)32 << 20) ? 1 : cores > 16 ? 16 : cores > 1 ? (int)cores : 1;
    pthread_t th[16];
    int started = 0;
    for (int i = 1; i < nt; i++)
        if (pthread_create(&th[started], NULL, scan_worker, &x) == 0) started++;
    scan_worker(&x);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&x.mu);
    int rc = K3C_OK;
    if (x.bad_job < njobs) {
        const k3c_tensor_spec *s = &inv->specs[x.jobs[x.bad_job].spec];
        uint16_t h = s->mat->w[x.bad_elem];
        rc = k3c_errorf("tensor %s in %s: element %zu (row %zu, col %zu) is %s (bf16 0x%04x): not finite", s->name,
                        k3c_checkpoint_shard_path(ck, k3c_checkpoint_find(ck, s->name)), x.bad_elem,
                        x.bad_elem / (size_t)s->mat->cols, x.bad_elem % (size_t)s->mat->cols,
                        h & 0x7f ? "NaN" : h & 0x8000 ? "-Inf" : "Inf", h);
    }
    free(x.jobs);
    return rc;
}

static int starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* Counts in config.json that imply more tensors than the checkpoint holds are refused before the inventory
 * is built from them: the inventory allocates per layer and per routed expert, and a config.json with
 * num_experts = 2147483647 (tools/fuzz_load.py) asked for ~257 GB before a single tensor was compared. Every
 * layer has at least one tensor and every routed expert at least three (gate, up, down), whatever the format. */
static int check_counts(const k3c_config *c, const k3c_checkpoint *ck, const char *dir) {
    const uint64_t have = ck->num_tensors;
    if ((uint64_t)c->num_layers > have)
        return k3c_errorf("config.json: %d layers, but the checkpoint in %s holds %llu tensors in all", c->num_layers,
                          dir, (unsigned long long)have);
    uint64_t moe_layers = 0;
    for (int l = 0; c->layer_is_moe && l < c->num_layers; l++) moe_layers += c->layer_is_moe[l] != 0;
    const uint64_t need = moe_layers * (uint64_t)(c->num_experts > 0 ? c->num_experts : 0) * 3;
    if (need > have)
        return k3c_errorf("config.json: num_experts = %d over %llu MoE layers implies at least %llu expert tensors, "
                          "but the checkpoint in %s holds %llu tensors in all",
                          c->num_experts, (unsigned long long)moe_layers, (unsigned long long)need, dir,
                          (unsigned long long)have);
    return K3C_OK;
}

static int load_into(struct k3c_model *m, const char *dir) {
    char path[4096];
    /* "" would name "/config.json" */
    if (!dir || !*dir) return k3c_errorf("checkpoint directory: %s path", dir ? "an empty" : "no (NULL)");
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return k3c_errorf("checkpoint directory path too long: %s", dir);
    K3C_TRY(k3c_config_load(path, &m->config));
    K3C_TRY(k3c_checkpoint_open(&m->checkpoint, dir));
    K3C_TRY(check_counts(&m->config, &m->checkpoint, dir));
    K3C_TRY(k3c_inventory_build(&m->config, &m->weights, &m->inventory));

    const k3c_checkpoint *ck = &m->checkpoint;
    uint8_t *used = calloc(ck->num_tensors ? ck->num_tensors : 1, 1);
    if (!used) return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory marking %zu tensors", ck->num_tensors);
    uint64_t weight_bytes = 0, owned = 0;
    for (size_t i = 0; i < m->inventory.count; i++) {
        const k3c_tensor_spec *s = &m->inventory.specs[i];
        long ix = k3c_checkpoint_index(ck, s->name);
        if (ix < 0) {
            free(used);
            return k3c_errorf("tensor %s: missing from the checkpoint in %s (the config implies it)", s->name, dir);
        }
        const k3c_st_tensor *t = ck->tensors[ix];
        if (bind_spec(m, s, t, k3c_checkpoint_shard_path(ck, t), &owned) != K3C_OK) {
            free(used);
            return K3C_ERR;
        }
        used[ix] = 1;
        weight_bytes += t->end - t->begin;
    }
    for (size_t i = 0; i < ck->num_tensors; i++) {
        if (used[i]) continue;
        const k3c_st_tensor *t = ck->tensors[i];
        /* The multimodal parts of K3 are not part of the text model (spec §4: exactly 168 tensors). */
        if (m->config.family == K3C_FAMILY_K3 &&
            (starts_with(t->name, "vision_tower.") || starts_with(t->name, "mm_projector.")))
            continue;
        free(used);
        return k3c_errorf("unexpected tensor %s in %s (not part of the model the config describes)", t->name,
                          k3c_checkpoint_shard_path(ck, t));
    }
    free(used);
    K3C_TRY(check_finite(m));
    if (m->config.tie_word_embeddings) m->weights.lm_head = m->weights.embed;
    m->weight_bytes = weight_bytes;
    m->owned_bytes = owned;
    return K3C_OK;
}

int k3c_model_load(const char *dir, struct k3c_model **out) {
    if (!out) return k3c_errorf("loading %s: the output handle is NULL", dir ? dir : "(NULL)");
    *out = NULL;
    struct k3c_model *m = calloc(1, sizeof *m);
    if (!m) return k3c_errorf_kind(K3C_ERROR_OOM, "out of memory allocating a model");
    if (load_into(m, dir) != K3C_OK) {
        k3c_error_context("loading %s", dir ? dir : "(NULL)");
        k3c_model_free(m);
        return K3C_ERR;
    }
    *out = m;
    return K3C_OK;
}

void k3c_model_free(struct k3c_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    k3c_weights_free(&m->weights);
    k3c_inventory_free(&m->inventory);
    if (m->checkpoint.dir || m->checkpoint.shards) k3c_checkpoint_close(&m->checkpoint);
    k3c_config_free(&m->config);
    if (m->synthetic_base) munmap(m->synthetic_base, m->synthetic_bytes);
    free(m);
}
