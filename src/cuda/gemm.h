/* bf16 matrix products on the GPU: y[T, rows] = x[T, cols] * W^T with W bf16 row-major [rows, cols]
 * (nn.Linear layout), x and y f32, f32 accumulation (cpu/ops.h k3c_matmul_bf16 is the reference).
 *
 * T <= K3C_CUDA_GEMV_MAX_T (decode, verify): a weight-streaming kernel that reads each weight row once for
 * all T tokens with 16-byte loads, several rows per warp. Larger T (prefill): cuBLASLt on tensor cores, the
 * activations first rounded to bf16 into a caller-provided staging buffer (so prefill products see bf16
 * inputs, as the model's bf16 activations are anyway). All pointers are device pointers; calls are
 * asynchronous on `stream`. */
#ifndef K3C_CUDA_GEMM_H
#define K3C_CUDA_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The streaming kernel covers T <= 8 (T = 1 on CUDA cores, 2..8 on tensor cores with one 8-token mma
 * column per token: the weights are read once for all of them); larger T goes to cuBLASLt. */
#define K3C_CUDA_GEMV_MAX_T 8

/* cuBLASLt state and the device scratch it uses (both owned by the caller's arena). */
/* A prepared cuBLASLt product of one shape and pointer alignment: its descriptors and the heuristic's
 * algorithm, asked for once (the heuristic costs tens of microseconds of host time a call, during which a
 * prefill step's GPU idles). */
#define K3C_CUDA_GEMM_PLANS 64
typedef struct k3c_cuda_gemm_plan {
    int rows, cols, T, align; /* align: the pointers' common alignment in bytes (4 .. 256) */
    void *op, *la, *lb, *ld;  /* cublasLtMatmulDesc_t, cublasLtMatrixLayout_t x 3 */
    unsigned char algo[64];   /* cublasLtMatmulAlgo_t (64 bytes) */
} k3c_cuda_gemm_plan;

typedef struct k3c_cuda_gemm {
    void *lt;                 /* cublasLtHandle_t; NULL: large T falls back to the streaming kernel */
    void *workspace;          /* device, cuBLASLt workspace */
    size_t workspace_bytes;
    uint16_t *xbf;            /* device, bf16 staging for activations */
    size_t xbf_elems;
    k3c_cuda_gemm_plan plans[K3C_CUDA_GEMM_PLANS]; /* the shapes seen so far (a model has a few dozen) */
    int nplans, next_evict;
} k3c_cuda_gemm;

/* Creates the cuBLASLt handle. workspace / xbf: device buffers the caller keeps alive (32 MiB of workspace
 * is plenty on Hopper; xbf must hold T * cols elements of the largest prefill product). */
int k3c_cuda_gemm_init(k3c_cuda_gemm *g, void *workspace, size_t workspace_bytes, uint16_t *xbf,
                       size_t xbf_elems);
void k3c_cuda_gemm_free(k3c_cuda_gemm *g);

/* y[T, rows] = x[T, cols] W^T. g may be NULL (then only the streaming kernel is used, for any T). */
int k3c_cuda_matmul_bf16(k3c_cuda_gemm *g, const uint16_t *W, int rows, int cols, const float *x, int T,
                         float *y, cudaStream_t stream);

/* The same with the stock contract's bf16 rounding of the outputs (round_bf16 1): fused into the streaming
 * kernels' stores; after cuBLASLt, a rounding pass. */
int k3c_cuda_matmul_bf16_round(k3c_cuda_gemm *g, const uint16_t *W, int rows, int cols, const float *x, int T,
                               float *y, int round_bf16, cudaStream_t stream);

/* The streaming kernel alone, any T (it tiles tokens by K3C_CUDA_GEMV_MAX_T, re-reading W per tile). */
int k3c_cuda_gemv_bf16(const uint16_t *W, int rows, int cols, const float *x, int T, float *y,
                       cudaStream_t stream);

/* A product whose outputs also go elsewhere (the specialized executor's row-parallel products at TP: the
 * pushed one-shot of comm/mailbox.h, each output written straight into every peer's mailbox slot). Every
 * output y[i] (f32: the product is not rounded) is also stored (st.global.cg: to L2, over NVLink for another
 * GPU's memory) at dst[d] + p * parity_floats + i for each destination d, p the low bit of *parity_word
 * (device memory) as the kernel reads it after the kernels before it on the stream have completed; none of
 * them when *skip (device memory) is nonzero. The kernel fences its stores (__threadfence_system) before it
 * ends. The same kernels, plan and reduction order as k3c_cuda_matmul_bf16_round(round 0) at T <= 8, so y
 * holds the same bits. */
#define K3C_CUDA_FANOUT_MAX 8
typedef struct k3c_cuda_fanout {
    int n;
    float *dst[K3C_CUDA_FANOUT_MAX];
    size_t parity_floats;
    const uint32_t *parity_word, *skip;
} k3c_cuda_fanout;
/* 1 when k3c_cuda_matmul_bf16_fanout runs this product (T 1 .. K3C_CUDA_GEMV_MAX_T, the streaming kernels'
 * alignment: W and x 16-byte aligned, cols a multiple of 8), else 0 (the caller keeps its unfused path). */
int k3c_cuda_fanout_ok(const uint16_t *W, int rows, int cols, const float *x, int T);
int k3c_cuda_matmul_bf16_fanout(const uint16_t *W, int rows, int cols, const float *x, int T, float *y,
                                const k3c_cuda_fanout *fo, cudaStream_t stream);

/* Grouped products (the executor's packed projections): several matrices streamed by
 * one launch (T = 1, or T <= K3C_CUDA_GEMV_MAX_T with every matrix of >= 256 rows) or two (T > 1 with short
 * matrices beside long ones: those run token by token in a launch of their own), instead of one launch per
 * matrix and token. Each product has its own matrix, input [T, cols], output [T, rows] and rounding; the
 * weights are read in place where they were loaded, so a reload needs nothing rebuilt. Every product's
 * outputs are bitwise those of k3c_cuda_matmul_bf16_round on it alone (same kernel code, same split of
 * each row's k range, chosen as for the matrix alone). No product may read another one's output. T > 8:
 * each product as k3c_cuda_matmul_bf16_round runs it. */
#define K3C_CUDA_GEMV_GROUP_MAX 8
typedef struct k3c_cuda_gemv_seg {
    const uint16_t *W; /* device, bf16 [rows, cols] */
    int rows, cols;
    const float *x;    /* device, [T, cols] */
    float *y;          /* device, [T, rows] */
    int round;         /* 1: outputs rounded to bf16 values */
} k3c_cuda_gemv_seg;
int k3c_cuda_gemv_group(k3c_cuda_gemm *g, const k3c_cuda_gemv_seg *segs, int n, int T, cudaStream_t stream);

/* x f32 -> bf16 bits (round to nearest even), n elements. */
int k3c_cuda_f32_to_bf16(const float *x, size_t n, uint16_t *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
