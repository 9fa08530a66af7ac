/* MoE router (spec §5.3) on the GPU, one token per block; cpu/ops.h k3c_route is the reference (same
 * selection, ties to the lower id, results ordered by decreasing selection score). */
#ifndef K3C_CUDA_ROUTER_H
#define K3C_CUDA_ROUTER_H

#include <cuda_runtime_api.h>

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

#ifdef __cplusplus
}
#endif

#endif
