/* AttnRes mix: one block per row; per-source reductions in a fixed tree, softmax over sources in f32. */
#include "cuda/attnres.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

__global__ void attnres_mix_kernel(const float *const *__restrict__ src, int nsrc, int D, const float *__restrict__ proj,
                                   const float *__restrict__ norm, float eps, int round, float *out) {
    extern __shared__ float alpha[]; /* [nsrc] */
    __shared__ float red[32];
    size_t row = (size_t)blockIdx.x * D;
    for (int j = 0; j < nsrc; j++) {
        const float *v = src[j] + row;
        float ss = 0.0f, dot = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float x = v[d];
            ss = fmaf(x, x, ss);
            dot = fmaf(x, norm[d] * proj[d], dot);
        }
        ss = k3c_block_sum(ss, red);
        dot = k3c_block_sum(dot, red);
        if (threadIdx.x == 0) alpha[j] = dot * rsqrtf(ss / (float)D + eps);
    }
    __syncthreads();
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < nsrc; j++) mx = fmaxf(mx, alpha[j]);
    for (int j = 0; j < nsrc; j++) sum += expf(alpha[j] - mx);
    float inv = 1.0f / sum;
    __syncthreads(); /* every thread has read the logits */
    for (int j = threadIdx.x; j < nsrc; j += blockDim.x) alpha[j] = expf(alpha[j] - mx) * inv;
    __syncthreads();
    /* Element by element over all sources, so out may alias a source. */
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < nsrc; j++) acc = fmaf(alpha[j], src[j][row + d], acc);
        out[row + d] = round ? k3c_dev_bf16(k3c_dev_to_bf16(acc)) : acc;
    }
}

extern "C" int k3c_cuda_attnres_mix(const float *const *src, int nsrc, int T, int D, const float *proj,
                                    const float *norm, float eps, int round_bf16, float *out, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (nsrc <= 0 || D <= 0 || T < 0)
        return k3c_errorf("k3c_cuda_attnres_mix: bad shape nsrc %d T %d D %d", nsrc, T, D);
    /* The weights array is padded to whole 16-byte vectors (compute-sanitizer saw a 12-byte shared read
     * past a 1- or 2-entry array in the forward test). */
    size_t smem = ((size_t)(nsrc + 3) / 4 * 4 + 4) * sizeof(float);
    attnres_mix_kernel<<<T, 256, smem, stream>>>(src, nsrc, D, proj, norm, eps, round_bf16,
                                                                          out);
    K3C_CUDA_LAUNCHED("attnres_mix");
    return K3C_OK;
}
