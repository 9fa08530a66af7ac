/* MLA (NoPE, absorbed form, spec §3.3) on the GPU: latent cache writes, the per-head absorptions through
 * kv_b, and paged decode attention over block tables. cpu/ops.h k3c_mla_attend is the reference of the
 * attention core. The cache of one layer is [num_blocks, block_size, Lat] with Lat = kv_lora + rope, row =
 * [c_normed | k_pe], element bf16 (elem_bytes 2) or f32 (4). All pointers are device pointers. */
#ifndef K3C_CUDA_MLA_H
#define K3C_CUDA_MLA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cache[slots[t]] = lat[t] for t < T (slot = block * block_size + offset; a negative slot is skipped). */
int k3c_cuda_mla_cache_write(const float *lat, const int *slots, int T, int Lat, int elem_bytes, void *cache,
                             cudaStream_t stream);

/* q_abs[t, h] = [W_UK[h]^T q_nope[t, h] | q_pe[t, h]] with W_UK[h] = kv_b rows h*(nope+vh) .. + nope
 * ([nope, kvl] bf16). q: [T, Hm*(nope+rope)]; q_abs: [T, Hm, kvl + rope]. */
int k3c_cuda_mla_absorb_q(const uint16_t *kv_b, const float *q, int T, int Hm, int nope, int rope, int vh, int kvl,
                          float *q_abs, cudaStream_t stream);

/* o[t, h*vh + e] = sum_c W_UV[h][e][c] o_lat[t, h, c], W_UV[h] = kv_b rows h*(nope+vh) + nope .. + vh. */
int k3c_cuda_mla_absorb_o(const uint16_t *kv_b, const float *o_lat, int T, int Hm, int nope, int vh, int kvl,
                          int round_bf16, float *o, cudaStream_t stream);

/* Attention of T query rows: row t attends cache positions 0 .. lens[t]-1 (lens[t] >= 1) of the request whose
 * block table starts at tables + table_off[t] (position p in block tables[table_off[t] + p / block_size]).
 * q_abs [T, Hm, kvl + rope]; o_lat [T, Hm, kvl]; softmax in f32 (online form). kvl + rope <= 768. part:
 * device scratch of part_floats floats for the position splits (k3c_cuda_mla_attend_split_floats(kvl) of
 * them always allow as many as the launch wants; NULL: no splits, one block per row and head walks every
 * position). The split count depends only on T, Hm and whether part has that room, so every caller with
 * such a part computes the same bits for the same rows. */
int k3c_cuda_mla_attend(const float *q_abs, const int *table_off, const int *lens, const int *tables, int block_size,
                        const void *cache, int elem_bytes, int T, int Hm, int kvl, int rope, float scale,
                        float *o_lat, float *part, size_t part_floats, cudaStream_t stream);
/* Floats of split scratch that never limit k3c_cuda_mla_attend's splits (4.3 MB at kvl 512 on an H200). */
size_t k3c_cuda_mla_attend_split_floats(int kvl);
/* Decode context parallel (backend.h mla_attention_part): the same attention (the per-head kernels and their
 * split merge) also writing lse [T, Hm] = M + log L of each row's softmax (M its max score, L the sum of
 * e^(s - M)); a row with lens[t] = 0 (none of the rank's positions) gets o_lat 0 and lse -inf. */
int k3c_cuda_mla_attend_lse(const float *q_abs, const int *table_off, const int *lens, const int *tables, int block_size,
                            const void *cache, int elem_bytes, int T, int Hm, int kvl, int rope, float scale,
                            float *o_lat, float *lse, float *part, size_t part_floats, cudaStream_t stream);
/* lat [T, Hm, kvl] = the exact merge of n partials (backend.h mla_merge): part r's o_lat [T, Hm, kvl] at
 * o_parts + r * stride, its lse [T, Hm] at lses + r * stride; weights e^(lse_r - max) summed and applied in r
 * order (n <= 64). */
int k3c_cuda_mla_dcp_merge(const float *o_parts, const float *lses, size_t stride, int n, int T, int Hm, int kvl,
                           float *lat, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
