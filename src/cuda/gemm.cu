/* bf16 matrix products: a weight-streaming kernel for skinny T (decode) and cuBLASLt for prefill. */
#include "cuda/gemm.h"

#include <cublasLt.h>

#include "cuda/check.h"
#include "cuda/common.cuh"

#define GEMV_WARPS 8

/* acc[r][t] += W[row r, chunk c] . x[t, chunk c] for the TT tokens (8 bf16 weights per chunk). */
template <int TT, int RPW>
__device__ __forceinline__ void gemv_chunk(float (&acc)[RPW][TT], const uint4 (&wv)[RPW], const float *__restrict__ x,
                                           int c, int cols, int T) {
#pragma unroll
    for (int t = 0; t < TT; t++) {
        if (t < T) {
            const float4 *xp = (const float4 *)(x + (size_t)t * cols + (size_t)c * 8);
            float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                float s = acc[r][t];
                s = fmaf(k3c_dev_bf16_lo(wv[r].x), a.x, s);
                s = fmaf(k3c_dev_bf16_hi(wv[r].x), a.y, s);
                s = fmaf(k3c_dev_bf16_lo(wv[r].y), a.z, s);
                s = fmaf(k3c_dev_bf16_hi(wv[r].y), a.w, s);
                s = fmaf(k3c_dev_bf16_lo(wv[r].z), b.x, s);
                s = fmaf(k3c_dev_bf16_hi(wv[r].z), b.y, s);
                s = fmaf(k3c_dev_bf16_lo(wv[r].w), b.z, s);
                s = fmaf(k3c_dev_bf16_hi(wv[r].w), b.w, s);
                acc[r][t] = s;
            }
        }
    }
}

/* A block of GEMV_WARPS warps is split into row groups of `wpr` warps (wpr divides GEMV_WARPS); each group
 * owns RPW consecutive rows and its warps split the row's 16-byte chunks (8 bf16) between them: lane l of
 * warp k reads chunks l + 32k, l + 32k + 32 wpr, ..., so a warp's loads of one row are 512 contiguous bytes
 * (coalesced). Splitting a row over several warps keeps enough loads in flight when a matrix has few rows.
 * The TT token vectors are read through L1 (small and shared by every warp of the SM), one pair of float4
 * per chunk per token, reused for all RPW rows. Partial sums are reduced across the warp, then across the
 * group's warps in a fixed order (deterministic). */
template <int TT, int RPW>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_bf16_vec(const uint16_t *__restrict__ W, int rows, int cols, const float *__restrict__ x, int T,
              float *__restrict__ y, int wpr) {
    __shared__ float part[GEMV_WARPS][RPW][TT];
    int warp_in_block = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int group = warp_in_block / wpr, k = warp_in_block % wpr;
    int row0 = (blockIdx.x * (GEMV_WARPS / wpr) + group) * RPW;
    int chunks = cols >> 3;
    const uint16_t *wr[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) wr[r] = W + (size_t)min(row0 + r, rows - 1) * cols;
    float acc[RPW][TT];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < TT; t++) acc[r][t] = 0.0f;

    if (row0 < rows) {
        /* Two chunks per row per step: 2 * RPW independent 16-byte loads in flight per lane. */
        int step = 32 * wpr;
        for (int c = lane + 32 * k; c < chunks; c += 2 * step) {
            int c2 = c + step;
            bool two = c2 < chunks;
            uint4 wv[RPW], wv2[RPW];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                wv[r] = k3c_ld_stream16(wr[r] + (size_t)c * 8);
                wv2[r] = two ? k3c_ld_stream16(wr[r] + (size_t)c2 * 8) : make_uint4(0, 0, 0, 0);
            }
            gemv_chunk<TT, RPW>(acc, wv, x, c, cols, T);
            if (two) gemv_chunk<TT, RPW>(acc, wv2, x, c2, cols, T);
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < TT; t++) {
            float s = k3c_warp_sum(acc[r][t]);
            if (wpr == 1) {
                if (lane == 0 && t < T && row0 + r < rows) y[(size_t)t * rows + row0 + r] = s;
            } else if (lane == 0) {
                part[warp_in_block][r][t] = s;
            }
        }
    if (wpr == 1) return;
    __syncthreads();
    /* The group's first warp sums the wpr partials of each (row, token), lanes over (row, token) pairs. */
    if (k == 0) {
        for (int i = lane; i < RPW * TT; i += 32) {
            int r = i / TT, t = i % TT;
            float s = 0.0f;
            for (int j = 0; j < wpr; j++) s += part[warp_in_block + j][r][t];
            if (t < T && row0 + r < rows) y[(size_t)t * rows + row0 + r] = s;
        }
    }
}

/* Any shape or alignment: one warp per (row, token), scalar loads. */
__global__ void gemv_bf16_scalar(const uint16_t *__restrict__ W, int rows, int cols, const float *__restrict__ x,
                                 int T, float *__restrict__ y) {
    long long warp = (long long)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (warp >= (long long)rows * T) return;
    int row = (int)(warp % rows), t = (int)(warp / rows);
    const uint16_t *w = W + (size_t)row * cols;
    const float *xt = x + (size_t)t * cols;
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s = fmaf(k3c_dev_bf16(w[c]), xt[c], s);
    s = k3c_warp_sum(s);
    if (lane == 0) y[(size_t)t * rows + row] = s;
}

static int sm_count(void) {
    static int count;
    if (!count) {
        int dev = 0, n = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) !=
                                                      cudaSuccess)
            n = 132;
        count = n > 0 ? n : 132;
    }
    return count;
}

/* Fewest warps per row that still gives about four blocks per SM (more warps per row, fewer rows in flight). */
template <int TT, int RPW>
static void launch_vec(const uint16_t *W, int rows, int cols, const float *x, int T, float *y, cudaStream_t s) {
    int wpr = 1, want = 4 * sm_count();
    while (wpr < GEMV_WARPS) {
        int rows_per_block = GEMV_WARPS / wpr * RPW;
        if ((rows + rows_per_block - 1) / rows_per_block >= want) break;
        if (32 * 2 * wpr > (cols >> 3)) break; /* no point splitting a short row further */
        wpr *= 2;
    }
    int rows_per_block = GEMV_WARPS / wpr * RPW;
    int blocks = (rows + rows_per_block - 1) / rows_per_block;
    gemv_bf16_vec<TT, RPW><<<blocks, GEMV_WARPS * 32, 0, s>>>(W, rows, cols, x, T, y, wpr);
}

static int gemv_tile(const uint16_t *W, int rows, int cols, const float *x, int T, float *y, cudaStream_t s) {
    int aligned = cols % 8 == 0 && ((uintptr_t)W & 15) == 0 && ((uintptr_t)x & 15) == 0;
    if (!aligned) {
        long long warps = (long long)rows * T;
        gemv_bf16_scalar<<<(unsigned)((warps + GEMV_WARPS - 1) / GEMV_WARPS), GEMV_WARPS * 32, 0, s>>>(W, rows, cols,
                                                                                                      x, T, y);
    } else if (T == 1) {
        launch_vec<1, 4>(W, rows, cols, x, T, y, s);
    } else if (T == 2) {
        launch_vec<2, 4>(W, rows, cols, x, T, y, s);
    } else {
        launch_vec<4, 2>(W, rows, cols, x, T, y, s);
    }
    K3C_CUDA_LAUNCHED("gemv_bf16");
    return K3C_OK;
}

extern "C" int k3c_cuda_gemv_bf16(const uint16_t *W, int rows, int cols, const float *x, int T, float *y,
                                  cudaStream_t stream) {
    if (rows <= 0 || cols <= 0 || T < 0)
        return k3c_errorf("k3c_cuda_gemv_bf16: bad shape rows %d cols %d T %d", rows, cols, T);
    for (int t0 = 0; t0 < T; t0 += K3C_CUDA_GEMV_MAX_T) {
        int n = T - t0 < K3C_CUDA_GEMV_MAX_T ? T - t0 : K3C_CUDA_GEMV_MAX_T;
        K3C_TRY(gemv_tile(W, rows, cols, x + (size_t)t0 * cols, n, y + (size_t)t0 * rows, stream));
    }
    return K3C_OK;
}

__global__ void f32_to_bf16_kernel(const float *__restrict__ x, size_t n, uint16_t *__restrict__ out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = k3c_dev_to_bf16(x[i]);
}

extern "C" int k3c_cuda_f32_to_bf16(const float *x, size_t n, uint16_t *out, cudaStream_t stream) {
    if (n == 0) return K3C_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    f32_to_bf16_kernel<<<(unsigned)blocks, 256, 0, stream>>>(x, n, out);
    K3C_CUDA_LAUNCHED("f32_to_bf16");
    return K3C_OK;
}

#define LT_TRY(call)                                                                                               \
    do {                                                                                                           \
        cublasStatus_t st_ = (call);                                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                        \
            rc = k3c_errorf("%s:%d: %s: cuBLASLt status %d", __FILE__, __LINE__, #call, (int)st_);                 \
            goto done;                                                                                             \
        }                                                                                                          \
    } while (0)

extern "C" int k3c_cuda_gemm_init(k3c_cuda_gemm *g, void *workspace, size_t workspace_bytes, uint16_t *xbf,
                                  size_t xbf_elems) {
    g->lt = NULL;
    g->workspace = workspace;
    g->workspace_bytes = workspace_bytes;
    g->xbf = xbf;
    g->xbf_elems = xbf_elems;
    cublasLtHandle_t h;
    cublasStatus_t st = cublasLtCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) return k3c_errorf("cublasLtCreate: status %d", (int)st);
    g->lt = h;
    return K3C_OK;
}

extern "C" void k3c_cuda_gemm_free(k3c_cuda_gemm *g) {
    if (g->lt) cublasLtDestroy((cublasLtHandle_t)g->lt);
    g->lt = NULL;
}

/* Column-major view for cuBLASLt: Y^T [rows, T] = W [cols x rows col-major]^T * X^T [cols, T]; so A = W with
 * op T (lda = cols), B = x as bf16 [cols, T] (ldb = cols), D = y [rows, T] (ldd = rows), all f32-accumulated. */
static int lt_matmul(k3c_cuda_gemm *g, const uint16_t *W, int rows, int cols, int T, float *y, cudaStream_t s) {
    int rc = K3C_OK;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    float alpha = 1.0f, beta = 0.0f;
    LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_TRY(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, cols, rows, cols));
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, cols, T, cols));
    LT_TRY(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, rows, T, rows));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->workspace_bytes,
                                                sizeof g->workspace_bytes));
    LT_TRY(cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)g->lt, op, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found < 1) {
        rc = k3c_errorf("cuBLASLt: no algorithm for bf16 [%d x %d] x [%d x %d]", rows, cols, cols, T);
        goto done;
    }
    LT_TRY(cublasLtMatmul((cublasLtHandle_t)g->lt, op, &alpha, W, la, g->xbf, lb, &beta, y, ld, y, ld, &heur.algo,
                          g->workspace, g->workspace_bytes, s));
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return rc;
}

extern "C" int k3c_cuda_matmul_bf16(k3c_cuda_gemm *g, const uint16_t *W, int rows, int cols, const float *x, int T,
                                    float *y, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0 || T < 0)
        return k3c_errorf("k3c_cuda_matmul_bf16: bad shape rows %d cols %d T %d", rows, cols, T);
    if (T == 0) return K3C_OK;
    if (T <= K3C_CUDA_GEMV_MAX_T || !g || !g->lt) return k3c_cuda_gemv_bf16(W, rows, cols, x, T, y, stream);
    size_t n = (size_t)T * cols;
    if (n > g->xbf_elems)
        return k3c_errorf("k3c_cuda_matmul_bf16: activation staging holds %zu elements, product needs %zu (T %d, "
                          "cols %d)", g->xbf_elems, n, T, cols);
    K3C_TRY(k3c_cuda_f32_to_bf16(x, n, g->xbf, stream));
    return lt_matmul(g, W, rows, cols, T, y, stream);
}
