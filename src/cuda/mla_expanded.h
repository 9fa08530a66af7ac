/* MLA in the expanded form (spec §3.2) on the GPU, for prompt segments: the cached latents of one request
 * are decompressed through kv_b into per-head keys and values, then a tiled causal attention runs over them.
 * cpu/ops.h k3c_mla_attend_expanded is the reference; backend/backend.h mla_attention_expanded the contract.
 *
 * One segment (one request's n query rows at positions pos .. pos + n - 1, attending positions 0 .. pos + i)
 * is processed in passes over the context, `chunk` positions at a time, so the scratch does not grow with the
 * context length:
 *   1. gather the chunk's latent rows [c | k_pe] through the block table into contiguous f32 rows;
 *   2. kv [len, Hm * (nope + vh)] = c kv_b^T (k3c_cuda_matmul_bf16: cuBLASLt, or the f32 streaming kernel
 *      when gemm is NULL), f32 accumulate; per head the columns are [k_nope (nope) | v (vh)];
 *   3. attention of all n rows over the chunk, every head: k_nope and v rounded to bf16 as they are read
 *      (round_bf16), scores (q_nope . k_nope + q_pe . k_pe) * scale, online softmax in f32; the running
 *      max, sum and output of each (row, head) are kept in the scratch between passes, and the last pass
 *      divides by the sum and writes o (rounded to bf16 when round_bf16).
 * With chunk >= pos + n (the usual case) there is one pass and the running state never leaves registers.
 *
 * Cache: one layer's [num_blocks, block_size, kvl + rope], element bf16 (elem_bytes 2) or f32 (4). All
 * pointers are device pointers; calls are asynchronous on `stream`. */
#ifndef K3C_CUDA_MLA_EXPANDED_H
#define K3C_CUDA_MLA_EXPANDED_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda/gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Positions decompressed per pass by the backend: the scratch of a pass is chunk * Hm * (nope + vh) f32
 * (201 MB at 96 heads of K3's dims, 67 MB at 32). */
#define K3C_CUDA_MLA_EXP_CHUNK 2048

/* Limits of the attention kernel: v_head_dim <= 256; its shared memory
 * 4 * (64 * qh + 32 * (qh + 1) + 32 * vh + 32 * 68) bytes (qh = nope + rope) must fit the device's
 * per-block opt-in limit (227 KB on Hopper: qh up to ~500). */
#define K3C_CUDA_MLA_EXP_MAX_V 256

/* Bytes of scratch k3c_cuda_mla_expanded needs for passes of `chunk` positions and segments of at most
 * max_rows rows (every part 256-byte aligned). */
size_t k3c_cuda_mla_expanded_scratch_bytes(int chunk, int max_rows, int Hm, int nope, int rope, int vh, int kvl);

/* The expanded attention of one segment. q: its rows [n, Hm * (nope + rope)], per head [q_nope | q_pe];
 * table: its block table (device ints; position p in block table[p / block_size]); cache as above;
 * kv_b: [Hm * (nope + vh), kvl] bf16. o: its rows [n, Hm * vh]; only those are written. gemm: cuBLASLt state
 * whose activation staging holds chunk * kvl elements, or NULL (f32 streaming kernel: exact f32 products).
 * round_bf16: round k_nope, v and o to bf16 (the stock contract), 0 = f32 throughout. scratch: at least
 * k3c_cuda_mla_expanded_scratch_bytes(chunk, max_rows, ...) bytes; n <= max_rows. */
int k3c_cuda_mla_expanded(k3c_cuda_gemm *gemm, const uint16_t *kv_b, const float *q, int n, int pos,
                          const int *table, int block_size, const void *cache, int elem_bytes, int Hm, int nope,
                          int rope, int vh, int kvl, float scale, int round_bf16, void *scratch, int chunk,
                          int max_rows, float *o, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
