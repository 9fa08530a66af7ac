/* safetensors reading and writing.
 *
 * Reading trusts nothing in the file: the length prefix is checked against the file size, the JSON header is
 * parsed with cJSON and every entry is checked (dtype, shape, offsets, byte length, overlap, duplicates)
 * before any tensor pointer is handed out. Tensor data is never copied: the file is mapped read-only and
 * k3c_st_tensor.data points into the mapping, which lives until k3c_st_close.
 *
 * K3's MoE shards carry ~0.8 MB headers with ~5,400 entries, so everything here is O(n log n): entries are
 * walked as cJSON's child list (never looked up by key), then sorted by name (duplicates become neighbours)
 * and by offset (overlaps become neighbours). */
#include "format/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/json_kind.h"
#include "util/error.h"

/* A header larger than this is not a real checkpoint (K3's largest is ~1 MB); refusing it early keeps a
 * hostile length prefix from making us allocate and parse gigabytes. */
#define ST_MAX_HEADER (100ull << 20)
uint64_t k3c_st_numel(const k3c_st_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const k3c_st_tensor *)a)->name, ((const k3c_st_tensor *)b)->name);
}

static int by_offset(const void *a, const void *b) {
    const k3c_st_tensor *x = *(const k3c_st_tensor *const *)a, *y = *(const k3c_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int parse_metadata(const cJSON *meta, const char *where) {
    if (!cJSON_IsObject(meta)) return k3c_errorf("%s: __metadata__: expected an object, got %s", where, k3c_json_kind(meta));
    for (const cJSON *m = meta->child; m; m = m->next)
        if (!cJSON_IsString(m))
            return k3c_errorf("%s: __metadata__ key \"%s\": expected a string value, got %s", where,
                              m->string ? m->string : "", k3c_json_kind(m));
    return K3C_OK;
}

/* Fills t (everything but name and data) from one header entry. */
static int parse_entry(const cJSON *e, const char *name, uint64_t data_region_size, const char *where,
                       k3c_st_tensor *t) {
    if (!cJSON_IsObject(e)) return k3c_errorf("%s: tensor %s: expected an object, got %s", where, name, k3c_json_kind(e));
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
    for (const cJSON *f = e->child; f; f = f->next) {
        const cJSON **slot = NULL;
        if (strcmp(f->string, "dtype") == 0) slot = &dtype;
        else if (strcmp(f->string, "shape") == 0) slot = &shape;
        else if (strcmp(f->string, "data_offsets") == 0) slot = &offsets;
        else
            return k3c_errorf("%s: tensor %s: unknown field \"%s\" (expected dtype, shape, data_offsets)", where, name,
                              f->string);
        if (*slot) return k3c_errorf("%s: tensor %s: duplicate field \"%s\"", where, name, f->string);
        *slot = f;
    }
    if (!dtype) return k3c_errorf("%s: tensor %s: missing field dtype", where, name);
    if (!shape) return k3c_errorf("%s: tensor %s: missing field shape", where, name);
    if (!offsets) return k3c_errorf("%s: tensor %s: missing field data_offsets", where, name);

    if (!cJSON_IsString(dtype)) return k3c_errorf("%s: tensor %s: dtype: expected a string, got %s", where, name, k3c_json_kind(dtype));
    t->dtype = k3c_dtype_parse(dtype->valuestring);
    if (t->dtype == K3C_DTYPE_INVALID)
        return k3c_errorf("%s: tensor %s: unknown dtype \"%s\" (expected BF16, F16, F32, F64, U8, I8, I32, I64 or F8_E4M3)",
                          where, name, dtype->valuestring);

    if (!cJSON_IsArray(shape)) return k3c_errorf("%s: tensor %s: shape: expected an array, got %s", where, name, k3c_json_kind(shape));
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > K3C_ST_MAX_DIMS)
        return k3c_errorf("%s: tensor %s: shape has %d dimensions, at most %d supported", where, name, ndim, K3C_ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t numel = 1;
    int i = 0;
    for (const cJSON *d = shape->child; d; d = d->next, i++) {
        uint64_t v;
        if (!k3c_json_exact_u64(d, &v) || v > (uint64_t)INT64_MAX)
            return k3c_errorf("%s: tensor %s: shape[%d]: expected a non-negative integer, got %s%s", where, name, i,
                              k3c_json_kind(d), cJSON_IsNumber(d) ? " that is negative, fractional or too large" : "");
        t->shape[i] = (int64_t)v;
        if (__builtin_mul_overflow(numel, v, &numel))
            return k3c_errorf("%s: tensor %s: shape product overflows 64 bits", where, name);
    }
    size_t esize = k3c_dtype_size(t->dtype);
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)esize, &nbytes))
        return k3c_errorf("%s: tensor %s: byte size (%llu elements x %zu bytes) overflows 64 bits", where, name,
                          (unsigned long long)numel, esize);

    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
        return k3c_errorf("%s: tensor %s: data_offsets: expected an array [begin, end], got %s", where, name,
                          cJSON_IsArray(offsets) ? "an array of a different length" : k3c_json_kind(offsets));
    uint64_t begin, end;
    if (!k3c_json_exact_u64(offsets->child, &begin) || !k3c_json_exact_u64(offsets->child->next, &end))
        return k3c_errorf("%s: tensor %s: data_offsets: expected two non-negative integers", where, name);
    if (end < begin)
        return k3c_errorf("%s: tensor %s: data_offsets [%llu, %llu]: end < begin", where, name,
                          (unsigned long long)begin, (unsigned long long)end);
    if (end > data_region_size)
        return k3c_errorf("%s: tensor %s: data_offsets [%llu, %llu]: end is past the data region (%llu bytes)", where,
                          name, (unsigned long long)begin, (unsigned long long)end,
                          (unsigned long long)data_region_size);
    if (end - begin != nbytes)
        return k3c_errorf("%s: tensor %s: data_offsets [%llu, %llu] span %llu bytes, expected %llu (%s x %llu elements)",
                          where, name, (unsigned long long)begin, (unsigned long long)end,
                          (unsigned long long)(end - begin), (unsigned long long)nbytes, k3c_dtype_name(t->dtype),
                          (unsigned long long)numel);
    t->begin = begin;
    t->end = end;
    t->data = NULL;
    return K3C_OK;
}

/* Sorted by name: neighbours with equal names are duplicates (cJSON keeps every duplicate key). Then sorted
 * by offset: a non-empty tensor must start at or after the furthest end seen so far. */
static int check_layout(k3c_st_header *h, const char *where) {
    for (size_t i = 1; i < h->num_tensors; i++)
        if (strcmp(h->tensors[i - 1].name, h->tensors[i].name) == 0)
            return k3c_errorf("%s: duplicate tensor name %s", where, h->tensors[i].name);
    if (h->num_tensors == 0) return K3C_OK;
    const k3c_st_tensor **order = malloc(h->num_tensors * sizeof *order);
    if (!order) return k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory sorting %zu tensors", where, h->num_tensors);
    for (size_t i = 0; i < h->num_tensors; i++) order[i] = &h->tensors[i];
    qsort(order, h->num_tensors, sizeof *order, by_offset);
    const k3c_st_tensor *furthest = NULL;
    int rc = K3C_OK;
    /* data_size counts empty tensors' offsets too, so every tensor's [begin, end] lies within it. */
    h->data_size = 0;
    for (size_t i = 0; i < h->num_tensors; i++) {
        const k3c_st_tensor *t = order[i];
        if (t->end > h->data_size) h->data_size = t->end;
        if (t->begin == t->end) continue; /* an empty tensor occupies no bytes */
        if (furthest && t->begin < furthest->end) {
            rc = k3c_errorf("%s: tensors %s [%llu, %llu] and %s [%llu, %llu] overlap", where, furthest->name,
                            (unsigned long long)furthest->begin, (unsigned long long)furthest->end, t->name,
                            (unsigned long long)t->begin, (unsigned long long)t->end);
            break;
        }
        if (!furthest || t->end > furthest->end) furthest = t;
    }
    free(order);
    return rc;
}

int k3c_st_parse_header(const char *json, size_t len, uint64_t data_region_size, const char *where,
                        k3c_st_header *out) {
    memset(out, 0, sizeof *out);
    if (len == 0) return k3c_errorf("%s: header length is 0", where);
    if (len > ST_MAX_HEADER)
        return k3c_errorf("%s: header length %zu exceeds the %llu-byte limit", where, len, ST_MAX_HEADER);
    /* cJSON gets its own NUL-terminated copy (at most a few MB): the mapped header is not terminated, and the
     * copy keeps any over-read inside our buffer. */
    char *buf = malloc(len + 1);
    if (!buf) return k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory for a %zu-byte header", where, len);
    memcpy(buf, json, len);
    buf[len] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    int rc = K3C_ERR;
    if (!root) {
        k3c_errorf("%s: header is not valid JSON (error at byte %zu of %zu)", where,
                   end && end >= buf ? (size_t)(end - buf) : (size_t)0, len);
        goto done;
    }
    /* The reference writer pads the header with spaces; anything else after the object is corruption. */
    for (const char *p = end; p < buf + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            k3c_errorf("%s: header has trailing bytes after the JSON object (at byte %zu of %zu)", where,
                       (size_t)(p - buf), len);
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        k3c_errorf("%s: header: expected a JSON object, got %s", where, k3c_json_kind(root));
        goto done;
    }
    size_t n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n++;
    out->tensors = calloc(n ? n : 1, sizeof *out->tensors);
    if (!out->tensors) {
        k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory for %zu tensors", where, n);
        goto done;
    }
    int seen_metadata = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string;
        if (!name || !name[0]) {
            k3c_errorf("%s: a tensor has an empty name", where);
            goto done;
        }
        if (strcmp(name, "__metadata__") == 0) {
            if (seen_metadata++) {
                k3c_errorf("%s: duplicate __metadata__", where);
                goto done;
            }
            if (parse_metadata(e, where) != K3C_OK) goto done;
            continue;
        }
        k3c_st_tensor *t = &out->tensors[out->num_tensors];
        if (parse_entry(e, name, data_region_size, where, t) != K3C_OK) goto done;
        if (!(t->name = strdup(name))) {
            k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", where);
            goto done;
        }
        out->num_tensors++;
    }
    qsort(out->tensors, out->num_tensors, sizeof *out->tensors, by_name);
    rc = check_layout(out, where);
done:
    cJSON_Delete(root);
    free(buf);
    if (rc != K3C_OK) k3c_st_header_free(out);
    return rc;
}

void k3c_st_header_free(k3c_st_header *h) {
    for (size_t i = 0; i < h->num_tensors; i++) free(h->tensors[i].name);
    free(h->tensors);
    memset(h, 0, sizeof *h);
}

const k3c_st_tensor *k3c_st_header_find(const k3c_st_header *h, const char *name) {
    size_t lo = 0, hi = h->num_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(h->tensors[mid].name, name);
        if (c == 0) return &h->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ---- files ---- */

int k3c_st_open(k3c_st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    /* O_NONBLOCK: a FIFO is refused below instead of waited on (its open blocks until a writer comes) */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return k3c_errorf_kind(K3C_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return k3c_errorf_kind(K3C_ERROR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return k3c_errorf("%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        close(fd);
        return k3c_errorf("%s: file is %llu bytes, shorter than the 8-byte header length", path,
                          (unsigned long long)size);
    }
    /* MAP_PRIVATE + PROT_READ: the checkpoint is never written, and pages are shared with the page cache. */
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) return k3c_errorf_kind(K3C_ERROR_IO, "%s: mmap of %llu bytes failed: %s", path, (unsigned long long)size, strerror(map_errno));
    f->map = map;
    f->map_size = size;
    if (!(f->path = strdup(path))) {
        k3c_st_close(f);
        return k3c_errorf_kind(K3C_ERROR_OOM, "%s: out of memory", path);
    }
    const uint8_t *p = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen == 0) {
        k3c_st_close(f);
        return k3c_errorf("%s: header length is 0", path);
    }
    if (hlen > size - 8) {
        k3c_st_close(f);
        return k3c_errorf("%s: header length %llu runs past the end of the file (%llu bytes after the prefix)", path,
                          (unsigned long long)hlen, (unsigned long long)(size - 8));
    }
    uint64_t data_region = size - 8 - hlen;
    if (k3c_st_parse_header((const char *)p + 8, hlen, data_region, path, &f->header) != K3C_OK) {
        k3c_st_close(f);
        return K3C_ERR;
    }
    if (f->header.data_size != data_region) {
        unsigned long long covered = f->header.data_size;
        k3c_st_close(f);
        return k3c_errorf("%s: data region is %llu bytes but the tensors end at %llu (trailing bytes)", path,
                          (unsigned long long)data_region, covered);
    }
    const uint8_t *data = p + 8 + hlen;
    for (size_t i = 0; i < f->header.num_tensors; i++) f->header.tensors[i].data = data + f->header.tensors[i].begin;
    return K3C_OK;
}

void k3c_st_close(k3c_st_file *f) {
    k3c_st_header_free(&f->header);
    if (f->map) munmap(f->map, f->map_size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ---- writing ---- */

typedef struct strbuf {
    char *p;
    size_t len, cap;
    int oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_puts(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(strbuf *b, uint64_t v) {
    char tmp[24];
    sb_put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v));
}

/* A JSON string literal: quote, backslash and control bytes escaped; other bytes (UTF-8) copied as is. */
static void sb_json_string(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            char esc[8];
            sb_put(b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", c));
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Byte lengths of the entries, with the same checks a reader applies, so we never write a file we would refuse. */
static int plan_entries(const char *path, const k3c_st_entry *entries, size_t n, uint64_t *nbytes) {
    for (size_t i = 0; i < n; i++) {
        const k3c_st_entry *e = &entries[i];
        if (!e->name || !e->name[0]) return k3c_errorf("writing %s: entry %zu has an empty name", path, i);
        if (strcmp(e->name, "__metadata__") == 0) return k3c_errorf("writing %s: __metadata__ is not a tensor name", path);
        size_t esize = k3c_dtype_size(e->dtype);
        if (esize == 0) return k3c_errorf("writing %s: tensor %s: invalid dtype %d", path, e->name, (int)e->dtype);
        if (e->ndim < 0 || e->ndim > K3C_ST_MAX_DIMS)
            return k3c_errorf("writing %s: tensor %s: %d dimensions, expected 0..%d", path, e->name, e->ndim, K3C_ST_MAX_DIMS);
        uint64_t b = esize;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0) return k3c_errorf("writing %s: tensor %s: shape[%d] = %lld is negative", path, e->name, d, (long long)e->shape[d]);
            if (__builtin_mul_overflow(b, (uint64_t)e->shape[d], &b))
                return k3c_errorf("writing %s: tensor %s: byte size overflows 64 bits", path, e->name);
        }
        nbytes[i] = b;
    }
    if (n > 1) {
        const char **names = malloc(n * sizeof *names);
        if (!names) return k3c_errorf_kind(K3C_ERROR_OOM, "writing %s: out of memory", path);
        for (size_t i = 0; i < n; i++) names[i] = entries[i].name;
        qsort(names, n, sizeof *names, cmp_str_ptr);
        for (size_t i = 1; i < n; i++)
            if (strcmp(names[i - 1], names[i]) == 0) {
                int rc = k3c_errorf("writing %s: duplicate tensor name %s", path, names[i]);
                free(names);
                return rc;
            }
        free(names);
    }
    return K3C_OK;
}

int k3c_st_write(const char *path, const k3c_st_entry *entries, size_t n, k3c_st_fill_fn fill, void *ctx) {
    uint64_t *nbytes = calloc(n ? n : 1, sizeof *nbytes);
    if (!nbytes) return k3c_errorf_kind(K3C_ERROR_OOM, "writing %s: out of memory", path);
    strbuf hdr = {0};
    char *tmp = NULL;
    void *bytes = NULL;
    int fd = -1, rc = K3C_ERR;
    if (plan_entries(path, entries, n, nbytes) != K3C_OK) goto done;

    /* Header: __metadata__ first, then the tensors in the caller's order, data laid out contiguously. */
    uint64_t offset = 0, largest = 0;
    sb_puts(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        const k3c_st_entry *e = &entries[i];
        sb_puts(&hdr, ",");
        sb_json_string(&hdr, e->name);
        sb_puts(&hdr, ":{\"dtype\":\"");
        sb_puts(&hdr, k3c_dtype_name(e->dtype));
        sb_puts(&hdr, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            if (d) sb_puts(&hdr, ",");
            sb_u64(&hdr, (uint64_t)e->shape[d]);
        }
        sb_puts(&hdr, "],\"data_offsets\":[");
        sb_u64(&hdr, offset);
        sb_puts(&hdr, ",");
        sb_u64(&hdr, offset + nbytes[i]);
        sb_puts(&hdr, "]}");
        offset += nbytes[i];
        if (nbytes[i] > largest) largest = nbytes[i];
    }
    sb_puts(&hdr, "}");
    /* Spaces to a multiple of 8, as the reference writer does: the data region then starts 8-byte aligned. */
    while (!hdr.oom && hdr.len % 8) sb_puts(&hdr, " ");
    if (hdr.oom) {
        k3c_errorf_kind(K3C_ERROR_OOM, "writing %s: out of memory building the header", path);
        goto done;
    }

    size_t plen = strlen(path);
    if (!(tmp = malloc(plen + 5))) {
        k3c_errorf_kind(K3C_ERROR_OOM, "writing %s: out of memory", path);
        goto done;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    /* One buffer, sized for the largest tensor, reused for all: fill writes into it, then it goes to disk. */
    if (largest > SIZE_MAX || !(bytes = malloc(largest ? (size_t)largest : 1))) {
        k3c_errorf_kind(K3C_ERROR_OOM, "writing %s: out of memory for a %llu-byte tensor", path, (unsigned long long)largest);
        goto done;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        k3c_errorf_kind(K3C_ERROR_IO, "writing %s: cannot create %s: %s", path, tmp, strerror(errno));
        free(tmp);
        tmp = NULL; /* nothing of ours to remove */
        goto done;
    }
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++) prefix[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
    if (write_all(fd, prefix, 8) != 0 || write_all(fd, hdr.p, hdr.len) != 0) {
        k3c_errorf_kind(K3C_ERROR_IO, "writing %s: %s", tmp, strerror(errno));
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (fill(ctx, i, &entries[i], bytes, (size_t)nbytes[i]) != K3C_OK) {
            k3c_error_context("writing %s: tensor %s", path, entries[i].name);
            goto done;
        }
        if (write_all(fd, bytes, (size_t)nbytes[i]) != 0) {
            k3c_errorf_kind(K3C_ERROR_IO, "writing %s: tensor %s: %s", tmp, entries[i].name, strerror(errno));
            goto done;
        }
    }
    /* fsync before rename: after a crash the final name holds either the old file or the complete new one. */
    if (fsync(fd) != 0) {
        k3c_errorf_kind(K3C_ERROR_IO, "writing %s: fsync: %s", tmp, strerror(errno));
        goto done;
    }
    int cr = close(fd);
    fd = -1;
    if (cr != 0) {
        k3c_errorf_kind(K3C_ERROR_IO, "writing %s: close: %s", tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        k3c_errorf_kind(K3C_ERROR_IO, "writing %s: rename from %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    rc = K3C_OK;
done:
    if (fd >= 0) close(fd);
    if (rc != K3C_OK && tmp) unlink(tmp);
    free(tmp);
    free(bytes);
    free(hdr.p);
    free(nbytes);
    return rc;
}
