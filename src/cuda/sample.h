/* Sampling on the GPU: greedy (arg-max) token ids of logits rows, so that a greedy step downloads 4 bytes a
 * row instead of the row's vocab floats. */
#ifndef K3C_CUDA_SAMPLE_H
#define K3C_CUDA_SAMPLE_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ids[r] = the arg-max of logits[r, 0..V) for r < rows, in runtime/sampler.c's greedy order: the largest
 * value, the lowest index among equal ones (+0 and -0 equal), a NaN below every number (all NaN: 0). */
int k3c_cuda_argmax_rows(const float *logits, int rows, int V, int32_t *ids, cudaStream_t stream);

/* The same arg-max taken by many blocks a row, finished on the host: one block a row reads a whole
 * 163840-wide row through one SM, which at b = 1 leaves the rest of the GPU idle. keys[r * parts + p] = the
 * best key of part p of row r (parts: equal runs of the row; a part past the row's end gives key 0): the
 * value's order in the high word, 0xffffffff - index in the low word, so one unsigned maximum over a row's
 * parts (k3c_argmax_key_id) gives its id, whatever the parts. */
#define K3C_ARGMAX_PARTS_MAX 64  /* parts a row at most */
#define K3C_ARGMAX_KEYS_MAX 256  /* k3c_cuda_argmax_parts keeps rows * parts at most this (or rows, past it) */
int k3c_cuda_argmax_parts(int rows); /* the parts for a step of rows rows: ~256 blocks in all */
int k3c_cuda_argmax_keys(const float *logits, int rows, int V, int parts, uint64_t *keys, cudaStream_t stream);

/* The id of the best of n keys of k3c_cuda_argmax_keys (host). */
static inline int32_t k3c_argmax_key_id(const uint64_t *keys, int n) {
    uint64_t k = 0;
    for (int i = 0; i < n; i++) k = keys[i] > k ? keys[i] : k;
    return (int32_t)(0xffffffffu - (uint32_t)k);
}

#ifdef __cplusplus
}
#endif

#endif
