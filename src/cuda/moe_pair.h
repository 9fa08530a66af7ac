/* Routed experts at decode, one (token, slot) pair per expert product (cuda/moe_pair.cu): the kernels
 * k3c_cuda_moe_experts (cuda/moe.h) takes for few pairs. Internal to the CUDA backend. */
#ifndef K3C_CUDA_MOE_PAIR_H
#define K3C_CUDA_MOE_PAIR_H

#include "cuda/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* bf16 experts: h [T * k, F] = act(gate, up) of each pair, then out [T, Out] = the weighted sum of each
 * token's k down projections, with the stock roundings (two launches; the weighted sum as
 * moe_combine_kernel's). x: [T, In]; idx, weight: [T, k] (an invalid expert id contributes nothing).
 * round_bf16: as k3c_cuda_moe_experts takes it (0, 1 or K3C_CUDA_MOE_ROUND_HIDDEN). */
int k3c_cuda_moe_pair_bf16(const k3c_cuda_expert *experts, int num_experts, int In, int F, int Out, const float *x,
                           int T, const int *idx, const float *weight, int k, k3c_cuda_act act, int round_bf16,
                           float *h, float *out, cudaStream_t stream);

/* For tests: the bf16 per-pair kernels' register / occupancy variant (0..3, cuda/moe_pair.cu) for every later
 * launch of this process, or -1 for the default (K3C_MOE_PAIR_OCC, else 1). Not thread-safe: set it between
 * launches. */
int k3c_cuda_moe_pair_occ_force(int variant);

/* MXFP4 experts, one launch over nm matrices per pair (2: gate into y0 and up into y1, rows of F from x,
 * x_per_pair pairs per input row; 1: down into y0 from h): y [pair, rows], rounded as asked. */
int k3c_cuda_moe_pair_mx(const k3c_cuda_expert *experts, int num_experts, const int *idx, int pairs, int nm, int rows,
                         int cols, const float *x, int x_per_pair, float *y0, float *y1, int round_bf16,
                         cudaStream_t stream);

/* Whether k3c_cuda_moe_pair_mx takes widths In and F (its staged activation plane is bounded). */
int k3c_cuda_moe_pair_mx_fits(int In, int F);

/* Experts by expert band (moe_pair.cu), MXFP4 or bf16: each selected expert streamed once for up to
 * tile_cols of its pairs (more: once more per tile). k3c_cuda_moe_band_cols gives the tile width for a call
 * with rows of In (gate/up) and F (down): 8, or for MXFP4 with many pairs an expert 32 where its plane fits,
 * else 16; k3c_cuda_moe_band_cols_force (tests; not thread-safe: set it between launches) forces 8, 16 or
 * 32 (32 falls back to 16 where it does not fit) for every later call, 0 restores the default, and a pair's
 * outputs are the same bits at every width; k3c_cuda_moe_band_lists sorts the pairs of idx [pairs] by
 * expert into tiles of that width in `lists` (k3c_cuda_moe_band_lists_ints(pairs) ints of device scratch);
 * k3c_cuda_moe_band, given the same width, then computes what k3c_cuda_moe_pair_mx would for nm matrices a
 * pair (rows of pairs with an invalid expert: 0). fits: widths and pair counts the kernels take. */
int k3c_cuda_moe_band_fits(int mxfp4, int In, int F, int pairs);
int k3c_cuda_moe_band_cols(int mxfp4, int pairs, int num_experts, int In, int F);
int k3c_cuda_moe_band_cols_force(int cols);
size_t k3c_cuda_moe_band_lists_ints(int pairs);
int k3c_cuda_moe_band_lists(const int *idx, int pairs, int num_experts, int tile_cols, int *lists,
                            cudaStream_t stream);
int k3c_cuda_moe_band(const k3c_cuda_expert *experts, int num_experts, int mxfp4, const int *lists, int pairs,
                      int tile_cols, int nm, int rows, int cols, const float *x, int x_per_pair, float *y0, float *y1,
                      int round_bf16, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
