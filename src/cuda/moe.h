/* Routed experts on the GPU, grouped over the step's selected (token, slot) pairs: for pair p = t * k + j
 * with expert e = idx[p], h_p = act(W1_e x_t, W3_e x_t) (gate and up fused with the activation), then
 * part_p = W2_e h_p, and out[t] = sum_j weight[t, j] * part_{t*k+j} (in slot order: deterministic).
 * Weights are MXFP4 (dequantized in registers from packed nibbles and E8M0 scales, cpu/ops.h
 * k3c_matmul_mxfp4 is the reference) or bf16 (Kimi Linear). All pointers are device pointers. */
#ifndef K3C_CUDA_MOE_H
#define K3C_CUDA_MOE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One expert's matrices in device memory: gate (w1) and up (w3) [F, In], down (w2) [Out, F].
 * MXFP4: *_packed [rows, cols/2], *_scale [rows, cols/32]; bf16: *_w [rows, cols]. */
typedef struct k3c_cuda_expert {
    const uint8_t *gate_packed, *gate_scale, *up_packed, *up_scale, *down_packed, *down_scale;
    const uint16_t *gate_w, *up_w, *down_w;
} k3c_cuda_expert;

/* The gated activation (cpu/ops.h k3c_gated_act): kind 1 = SiLU, 2 = SiTU with beta, beta_lin. */
typedef struct k3c_cuda_act {
    int kind;
    float beta, beta_lin;
} k3c_cuda_act;

/* The device layout of MXFP4 packed weights: every writer of their standard bytes (a row's elements two to
 * a byte, low nibble first) calls this once on them, in place, before the kernels below read them (the
 * backend's upload does; tests and benchmarks that write expert bytes themselves too). bytes: whole 32-bit
 * words. The bits of each word are permuted (moe.cu mx_word); the scales are not touched. */
int k3c_cuda_mxfp4_repack(uint8_t *packed, size_t bytes, cudaStream_t stream);

/* experts: device array [num_experts]; mxfp4: 1 for MXFP4 matrices, 0 for bf16. x: [T, In];
 * idx, weight: [T, k] (an index outside [0, num_experts) contributes nothing); h: scratch [T*k, F];
 * part: scratch [T*k, Out]; out: [T, Out], which must not overlap the other arrays (the band path, MXFP4 or
 * bf16, keeps its tile table there until the final weighted sum writes it). In and F must be multiples of 32 (MXFP4) or 8 (bf16).
 * round_bf16: 1 = the stock contract's roundings (backend/backend.h moe): gate and up outputs, h, each
 * expert's down output and the weighted sum are rounded to bf16; 0 = none; K3C_CUDA_MOE_ROUND_HIDDEN = those
 * up to h only, each expert's down output and the weighted sum left f32 (backend.h moe_partial: a tensor
 * parallel rank's partial sums, rounded once after the sum across ranks). The kernels and their summation
 * order are the same in every mode: only the stores differ. */
#define K3C_CUDA_MOE_ROUND_HIDDEN 2
int k3c_cuda_moe_experts(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int In, int F, int Out,
                         const float *x, int T, const int *idx, const float *weight, int k, k3c_cuda_act act,
                         int round_bf16, float *h, float *part, float *out, cudaStream_t stream);

/* The expert-parallel combine (backend.h moe_combine): out[t, r] = sum_j weight[t k + j] *
 * part[pair_row[t k + j], r] in j order (fmaf from 0, as the weighted sum above; pair_row < 0 contributes
 * nothing), rounded to bf16 when round_bf16 is 1. pair_row, weight: [T, k]; part: the pairs' rows [*, Out]. So
 * with part's rows the experts' rounded outputs, out is bitwise the weighted sum k3c_cuda_moe_experts stores. */
int k3c_cuda_moe_combine_rows(const float *part, const int *pair_row, const float *weight, int k, int Out, int T,
                              int round_bf16, float *out, cudaStream_t stream);

/* The two halves, for tests and benchmarks: gate/up + activation into h, and down into part (unweighted);
 * down's pairs are T * k (k slots per token: it sizes the kernel's passes, any pairs are computed right). */
int k3c_cuda_moe_gate_up(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int In, int F,
                         const float *x, int T, const int *idx, int k, k3c_cuda_act act, int round_bf16, float *h,
                         cudaStream_t stream);
int k3c_cuda_moe_down(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int F, int Out, const float *h,
                      int pairs, int k, const int *idx, int round_bf16, float *part, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
