/* safetensors: strict reading (mmap, every header number checked against the file) and writing.
 * File layout: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
 * optional "__metadata__", then the data region; offsets are relative to the data region. */
#ifndef K3C_FORMAT_SAFETENSORS_H
#define K3C_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "format/dtype.h"

#define K3C_ST_MAX_DIMS 8

typedef struct k3c_st_tensor {
    char *name;
    k3c_dtype dtype;
    int ndim;
    int64_t shape[K3C_ST_MAX_DIMS];
    uint64_t begin, end; /* byte offsets within the data region */
    const void *data;    /* begin mapped into memory (NULL while only a header was parsed) */
} k3c_st_tensor;

typedef struct k3c_st_header {
    k3c_st_tensor *tensors; /* sorted by name */
    size_t num_tensors;
    uint64_t data_size; /* bytes the tensors cover; the data region must be exactly this long */
} k3c_st_header;

/* Parses and validates a header (the JSON bytes only, not the 8-byte length prefix). data_region_size is
 * the file size minus 8 minus header_len: every tensor must lie inside it, no two may overlap, and
 * dtype size x shape must equal end - begin. `where` names the file in error messages. */
int k3c_st_parse_header(const char *json, size_t len, uint64_t data_region_size, const char *where,
                        k3c_st_header *out);
void k3c_st_header_free(k3c_st_header *h);
/* Binary search by name; NULL when absent. */
const k3c_st_tensor *k3c_st_header_find(const k3c_st_header *h, const char *name);

/* One mapped shard. */
typedef struct k3c_st_file {
    char *path;
    void *map;
    size_t map_size;
    k3c_st_header header;
} k3c_st_file;

int k3c_st_open(k3c_st_file *f, const char *path);
void k3c_st_close(k3c_st_file *f);

/* Element count of a tensor (product of shape). */
uint64_t k3c_st_numel(const k3c_st_tensor *t);

/* ---- writing ---- */
typedef struct k3c_st_entry {
    const char *name;
    k3c_dtype dtype;
    int ndim;
    int64_t shape[K3C_ST_MAX_DIMS];
} k3c_st_entry;

/* Fills `bytes` (exactly the tensor's byte length) for entry `index`. */
typedef int (*k3c_st_fill_fn)(void *ctx, size_t index, const k3c_st_entry *e, void *bytes, size_t nbytes);

/* Writes a safetensors file: header with tensors in the given order, data laid out contiguously, each
 * tensor produced by fill. Written to PATH.tmp and renamed, so a failure never leaves a half file. */
int k3c_st_write(const char *path, const k3c_st_entry *entries, size_t n, k3c_st_fill_fn fill, void *ctx);

#endif
