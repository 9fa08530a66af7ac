/* Row-wise and elementwise kernels. */
#include "cuda/elementwise.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

static unsigned grid_for(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 4096 ? 4096 : (b ? b : 1));
}

/* One block per row; the sum of squares is reduced in a fixed order that depends only on n: thread t
 * accumulates x[t], x[t + B], ... by fmaf in index order (B = min(1024, n rounded up to 32 threads)), then
 * k3c_block_sum adds the B partials by the warp butterfly and the warp sums in warp order. Independent of T
 * and of the other rows of the step: the final norm's order (stock/forward.c) relies on it.
 * Rows of up to NORM_EPT x B elements (K3's 7168, Kimi Linear's 2304) are held in registers: a thread's loads
 * are all issued before its sums, one memory round trip instead of one per element (the loop's loads wait
 * on each other: a stamped profile (2026-11-30) had a K3 rmsnorm at ~7 us a call in the replayed step, ~2.5 of them the
 * stamp's and the launch's). Same sums in the same order, so the same bits; longer rows take the loop. */
#define NORM_EPT 8
/* The register path's end, shared by both norm kernels: the block's sum of squares, the scale, and
 * y[i] = v[i] * r * w[i] for the thread's elements i = t, t + B, ... (rmsnorm_kernel's operations). */
__device__ __forceinline__ void norm_regs_store(const float (&v)[NORM_EPT], const float (&w)[NORM_EPT], float ss,
                                                float *red, int n, float eps, int round, float *yr) {
    ss = k3c_block_sum(ss, red);
    const float r = rsqrtf(ss / n + eps);
#pragma unroll
    for (int e = 0; e < NORM_EPT; e++) {
        const int i = threadIdx.x + e * blockDim.x;
        if (i < n) {
            const float y = v[e] * r * w[e];
            yr[i] = round ? k3c_dev_bf16(k3c_dev_to_bf16(y)) : y;
        }
    }
}

__global__ void rmsnorm_kernel(const float *x, int xs, const float *__restrict__ w, int n, float eps, int round,
                               float *y, int ys) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_RMSNORM);
    k3c_pdl_trigger(); /* a PDL-launched weight stream after this kernel may start (common.cuh) */
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * xs;
    float *yr = y + (size_t)blockIdx.x * ys;
    float ss = 0.0f;
    const int B = blockDim.x;
    if (n <= NORM_EPT * B) { /* the whole row in registers: every load issued before the sums (see above) */
        float xv[NORM_EPT], wv[NORM_EPT];
#pragma unroll
        for (int e = 0; e < NORM_EPT; e++) {
            const int i = threadIdx.x + e * B;
            xv[e] = i < n ? xr[i] : 0.0f;
            wv[e] = i < n ? w[i] : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < NORM_EPT; e++)
            if (threadIdx.x + e * B < n) ss = fmaf(xv[e], xv[e], ss);
        norm_regs_store(xv, wv, ss, red, n, eps, round, yr);
        K3C_STAMP_BLOCK_END(K3C_KID_RMSNORM);
        return;
    }
    for (int i = threadIdx.x; i < n; i += B) ss = fmaf(xr[i], xr[i], ss);
    ss = k3c_block_sum(ss, red);
    float r = rsqrtf(ss / n + eps);
    for (int i = threadIdx.x; i < n; i += B) {
        float v = xr[i] * r * w[i];
        yr[i] = round ? k3c_dev_bf16(k3c_dev_to_bf16(v)) : v;
    }
    K3C_STAMP_BLOCK_END(K3C_KID_RMSNORM);
}

extern "C" int k3c_cuda_rmsnorm(const float *x, int x_stride, const float *w, int T, int n, float eps, int round_bf16,
                                float *y, int y_stride, cudaStream_t stream) {
    if (T <= 0 || n <= 0) return T == 0 ? K3C_OK : k3c_errorf("k3c_cuda_rmsnorm: bad shape T %d n %d", T, n);
    rmsnorm_kernel<<<T, n >= 1024 ? 1024 : ((n + 31) / 32) * 32, 0, stream>>>(x, x_stride, w, n, eps, round_bf16, y, y_stride);
    K3C_CUDA_LAUNCHED("rmsnorm");
    return K3C_OK;
}

/* The residual add(s) and the rmsnorm after them in one launch (elementwise.h k3c_cuda_add_rmsnorm): one
 * block per row with rmsnorm_kernel's block size, so each thread first forms and stores exactly the
 * elements it then squares (t, t + B, ...: no barrier between a thread's store and its own reads), and the
 * sum of squares, the scale and the output are rmsnorm_kernel's on the stored row, operation for operation.
 * The adds are add_kernel's per element (a + b, then the bf16 rounding), so the stored row is bitwise what
 * k3c_cuda_add (and, with a2, a first k3c_cuda_add(a1, a2)) would have stored. */
__global__ void add_rmsnorm_kernel(float *p, const float *a1, const float *a2, const float *__restrict__ w, int n,
                                   float eps, int round, float *y) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_ADD_RMSNORM);
    k3c_pdl_trigger(); /* a PDL-launched weight stream after this kernel may start (common.cuh) */
    __shared__ float red[32];
    size_t row = (size_t)blockIdx.x * n;
    float *pr = p + row, *yr = y + row;
    float ss = 0.0f;
    const int B = blockDim.x;
    if (n <= NORM_EPT * B) { /* in registers, as rmsnorm_kernel: every load of the row issued first */
        float av[NORM_EPT], bv[NORM_EPT], pv[NORM_EPT], wv[NORM_EPT];
#pragma unroll
        for (int e = 0; e < NORM_EPT; e++) {
            const int i = threadIdx.x + e * B;
            const bool in = i < n;
            av[e] = in ? a1[row + i] : 0.0f;
            bv[e] = in && a2 ? a2[row + i] : 0.0f;
            pv[e] = in ? pr[i] : 0.0f;
            wv[e] = in ? w[i] : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < NORM_EPT; e++) {
            const int i = threadIdx.x + e * B;
            if (i >= n) continue;
            const float v = k3c_dev_residual(av[e], a2 != NULL, bv[e], true, pv[e], round);
            pr[i] = v;
            pv[e] = v;
            ss = fmaf(v, v, ss);
        }
        norm_regs_store(pv, wv, ss, red, n, eps, round, yr);
        K3C_STAMP_BLOCK_END(K3C_KID_ADD_RMSNORM);
        return;
    }
    for (int i = threadIdx.x; i < n; i += B) {
        const float v = k3c_dev_residual(a1[row + i], a2 != NULL, a2 ? a2[row + i] : 0.0f, true, pr[i], round);
        pr[i] = v;
        ss = fmaf(v, v, ss);
    }
    ss = k3c_block_sum(ss, red);
    float r = rsqrtf(ss / n + eps);
    for (int i = threadIdx.x; i < n; i += B) {
        float v = pr[i] * r * w[i];
        yr[i] = round ? k3c_dev_bf16(k3c_dev_to_bf16(v)) : v;
    }
    K3C_STAMP_BLOCK_END(K3C_KID_ADD_RMSNORM);
}

extern "C" int k3c_cuda_add_rmsnorm(float *p, const float *a1, const float *a2, const float *w, int T, int n,
                                    float eps, int round_bf16, float *y, cudaStream_t stream) {
    if (T <= 0 || n <= 0) return T == 0 ? K3C_OK : k3c_errorf("k3c_cuda_add_rmsnorm: bad shape T %d n %d", T, n);
    add_rmsnorm_kernel<<<T, n >= 1024 ? 1024 : ((n + 31) / 32) * 32, 0, stream>>>(p, a1, a2, w, n, eps, round_bf16, y);
    K3C_CUDA_LAUNCHED("add_rmsnorm");
    return K3C_OK;
}

__global__ void gated_act_kernel(k3c_cuda_act act, const float *__restrict__ gate, int gs, const float *__restrict__ up,
                                 int us, int T, int n, int round, float *out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_GATED_ACT);
    k3c_pdl_trigger(); /* a PDL-launched weight stream after this kernel may start (common.cuh) */
    k3c_dev_gated_act_span(act.kind, act.beta, act.beta_lin, gate, gs, up, us, T, n, round, out,
                           (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
    K3C_STAMP_BLOCK_END(K3C_KID_GATED_ACT);
}

extern "C" int k3c_cuda_gated_act(k3c_cuda_act act, const float *gate, int gate_stride, const float *up,
                                  int up_stride, int T, int n, int round_bf16, float *out, cudaStream_t stream) {
    size_t total = (size_t)T * n;
    if (!total) return K3C_OK;
    gated_act_kernel<<<grid_for(total, 256), 256, 0, stream>>>(act, gate, gate_stride, up, up_stride, T, n, round_bf16, out);
    K3C_CUDA_LAUNCHED("gated_act");
    return K3C_OK;
}

__global__ void embed_kernel(const uint16_t *__restrict__ table, int V, int D, const int *__restrict__ ids,
                             float *out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_EMBED);
    int id = ids[blockIdx.x];
    float *o = out + (size_t)blockIdx.x * D;
    int ok = id >= 0 && id < V;
    const uint16_t *row = table + (size_t)(ok ? id : 0) * D;
    /* -0.0 for an id outside the table: a vocabulary-parallel rank's rows of another rank's tokens
     * (backend.h embed), which the cross-rank sum adds exactly (x + -0.0 is x, -0.0 included) */
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = ok ? k3c_dev_bf16(row[i]) : -0.0f;
    K3C_STAMP_BLOCK_END(K3C_KID_EMBED);
}

extern "C" int k3c_cuda_embed(const uint16_t *table, int V, int D, const int *ids, int T, float *out,
                              cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    embed_kernel<<<T, 256, 0, stream>>>(table, V, D, ids, out);
    K3C_CUDA_LAUNCHED("embed");
    return K3C_OK;
}

__global__ void add_kernel(const float *a, const float *b, size_t n, int round, float *out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_ADD);
    k3c_pdl_trigger(); /* a PDL-launched weight stream after this kernel may start (common.cuh) */
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = a[i] + b[i];
        out[i] = round ? k3c_dev_bf16(k3c_dev_to_bf16(s)) : s;
    }
    K3C_STAMP_BLOCK_END(K3C_KID_ADD);
}

extern "C" int k3c_cuda_add(const float *a, const float *b, size_t n, int round_bf16, float *out,
                            cudaStream_t stream) {
    if (!n) return K3C_OK;
    add_kernel<<<grid_for(n, 256), 256, 0, stream>>>(a, b, n, round_bf16, out);
    K3C_CUDA_LAUNCHED("add");
    return K3C_OK;
}

__global__ void round_kernel(float *x, size_t n) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_ROUND);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = k3c_dev_bf16(k3c_dev_to_bf16(x[i]));
    K3C_STAMP_BLOCK_END(K3C_KID_ROUND);
}

extern "C" int k3c_cuda_round_bf16(float *x, size_t n, cudaStream_t stream) {
    if (!n) return K3C_OK;
    round_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n);
    K3C_CUDA_LAUNCHED("round_bf16");
    return K3C_OK;
}

__global__ void sigmoid_kernel(const float *x, size_t n, float *out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_SIGMOID);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = k3c_dev_sigmoid(x[i]);
    K3C_STAMP_BLOCK_END(K3C_KID_SIGMOID);
}

extern "C" int k3c_cuda_sigmoid(const float *x, size_t n, float *out, cudaStream_t stream) {
    if (!n) return K3C_OK;
    sigmoid_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, out);
    K3C_CUDA_LAUNCHED("sigmoid");
    return K3C_OK;
}

__global__ void mul_sigmoid_kernel(const float *x, const float *z, size_t n, int round, float *y) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MUL_SIGMOID);
    k3c_pdl_trigger(); /* a PDL-launched weight stream after this kernel may start (common.cuh) */
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i] * k3c_dev_sigmoid(z[i]);
        y[i] = round ? k3c_dev_bf16(k3c_dev_to_bf16(v)) : v;
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MUL_SIGMOID);
}

extern "C" int k3c_cuda_mul_sigmoid(const float *x, const float *z, size_t n, int round_bf16, float *y,
                                    cudaStream_t stream) {
    if (!n) return K3C_OK;
    mul_sigmoid_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, z, n, round_bf16, y);
    K3C_CUDA_LAUNCHED("mul_sigmoid");
    return K3C_OK;
}

K3C_STAMP_TU(elementwise) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
