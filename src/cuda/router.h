/* MoE router (spec §5.3) on the GPU, one token per block; cpu/ops.h k3c_route is the reference (same
 * selection, ties to the lower id, results ordered by decreasing selection score). */
#ifndef K3C_CUDA_ROUTER_H
#define K3C_CUDA_ROUTER_H

#include <cuda_runtime_api.h>

#include "cuda/moe.h" /* k3c_cuda_act */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3c_cuda_router {
    int num_experts, k;
    int sigmoid;         /* 1: sigmoid scores; 0: softmax */
    int use_bias;        /* select on score + bias */
    int num_groups;      /* grouped top-k when > 1 (and topk_group < num_groups) */
    int topk_group;
    int renormalize;
    float scale;         /* routed_scaling_factor */
} k3c_cuda_router;

/* logits: [T, E] f32; bias: [E] or NULL; idx, weight: [T, k]. */
int k3c_cuda_route(const k3c_cuda_router *r, const float *logits, const float *bias, int T, int *idx, float *weight,
                   cudaStream_t stream);

/* k3c_cuda_route and k3c_cuda_gated_act(act, gate, gate_stride, up, up_stride, T, n, round_bf16, out) in one
 * launch, the same bits as the two (cuda/elementwise.h: out [T, n] dense; out may be gate or up when that
 * stride is n). Why: a decode step's MoE routes and forms the shared expert's activation from the same
 * front launch, and each launch of a replayed graph costs ~2-3 us. The routing buffers (logits, bias, idx,
 * weight) must not overlap the activation's (gate, up, out). Every block lets a PDL-launched successor
 * start at once (cuda/common.cuh): it must wait before it reads idx, weight or out. */
int k3c_cuda_route_act(const k3c_cuda_router *r, const float *logits, const float *bias, int T, int *idx,
                       float *weight, k3c_cuda_act act, const float *gate, int gate_stride, const float *up,
                       int up_stride, int n, int round_bf16, float *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
