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

#ifdef __cplusplus
}
#endif

#endif
