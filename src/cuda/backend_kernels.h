/* Glue kernels of the CUDA backend (cuda/backend_cuda.c) that the kernel launchers of src/cuda do not
 * provide: row gathers, synthetic weight fills (device-synthetic models), and multi-request forms of the
 * KDA conv and recurrent delta rule (one launch for a whole decode batch instead of one per request). All
 * pointers are device pointers; calls are asynchronous on `stream`. */
#ifndef K3C_CUDA_BACKEND_KERNELS_H
#define K3C_CUDA_BACKEND_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One request's rows of a step and its KDA state / conv window for the current layer (device copy of the
 * host k3c_seg's fields the kernels need). */
typedef struct k3c_cuda_seg {
    int row0, n;
    float *state;  /* [H, dk, dv] */
    float *window; /* [3][W-1][P]; the conv adds which * (W-1) * P */
} k3c_cuda_seg;

/* dst[i, :] = src[rows[i], :] for i < n, rows of D floats. */
int k3c_cuda_gather_rows(const float *src, const int *rows, int n, int D, float *dst, cudaStream_t stream);

/* w[i] = bf16(std * N(0,1)), the normal drawn from a hash of (seed, i): deterministic, order-free. */
int k3c_cuda_fill_bf16_normal(uint16_t *w, size_t n, float std, uint64_t seed, cudaStream_t stream);
/* MXFP4: packed bytes uniformly random (two random E2M1 codes each), scale bytes scale_byte or
 * scale_byte - 1 (hash of (seed, i)), so a row's dot products keep a chosen magnitude. */
int k3c_cuda_fill_mxfp4(uint8_t *packed, size_t n_packed, uint8_t *scale, size_t n_scale, int scale_byte,
                        uint64_t seed, cudaStream_t stream);

/* Causal depthwise conv + SiLU (cuda/kda.h k3c_cuda_kda_conv) for nseg requests at once: seg s's rows
 * [row0, row0 + n) of x [*, C] against its window segs[s].window + which * (W-1) * C, advanced in place;
 * out rounded to bf16 when round_bf16. */
int k3c_cuda_kda_conv_segs(const float *x, const k3c_cuda_seg *segs, int nseg, int C, int W, const float *taps,
                           int which, int round_bf16, float *out, cudaStream_t stream);

/* The recurrent gated delta rule (cuda/kda.h k3c_cuda_kda_recurrent, same arithmetic and order) for nseg
 * requests at once, each on its own segs[s].state; rows of seg s are [row0, row0 + n) of q, k, g [*, H*dk],
 * v [*, H*dv], beta [*, H]; o may be NULL. Same shape limits: dk a multiple of 32, (dk/32) * dv <= 512. */
int k3c_cuda_kda_recurrent_segs(const k3c_cuda_seg *segs, int nseg, const float *q, const float *k, const float *v,
                                const float *g, const float *beta, int H, int dk, int dv, int round_bf16, float *o,
                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
