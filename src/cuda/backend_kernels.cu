/* Glue kernels of the CUDA backend: row gathers, synthetic weight fills, multi-request KDA conv and
 * recurrent delta rule (cuda/backend_kernels.h). */
#include "cuda/backend_kernels.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

static unsigned grid_for(size_t n, int threads, unsigned cap) {
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b > cap ? cap : b);
}

/* ---- gather ---- */

__global__ void gather_rows_kernel(const float *__restrict__ src, const int *__restrict__ rows, int D,
                                   float *__restrict__ dst) {
    const float *s = src + (size_t)rows[blockIdx.x] * D;
    float *d = dst + (size_t)blockIdx.x * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) d[i] = s[i];
}

extern "C" int k3c_cuda_gather_rows(const float *src, const int *rows, int n, int D, float *dst, cudaStream_t stream) {
    if (n <= 0) return K3C_OK;
    gather_rows_kernel<<<n, 256, 0, stream>>>(src, rows, D, dst);
    K3C_CUDA_LAUNCHED("gather_rows");
    return K3C_OK;
}

/* ---- synthetic fills ---- */

/* splitmix64 finalizer of (seed, i): independent 64-bit words per index, no state. */
__device__ __forceinline__ uint64_t mix64(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void fill_bf16_normal_kernel(uint16_t *w, size_t n, float std, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed, i);
        /* Box-Muller on two 24-bit uniforms; u1 in (0, 1] so the log is finite. */
        float u1 = ((float)(h & 0xffffff) + 1.0f) * 0x1p-24f;
        float u2 = (float)((h >> 24) & 0xffffff) * 0x1p-24f;
        float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
        w[i] = k3c_dev_to_bf16(std * z);
    }
}

extern "C" int k3c_cuda_fill_bf16_normal(uint16_t *w, size_t n, float std, uint64_t seed, cudaStream_t stream) {
    if (!n) return K3C_OK;
    fill_bf16_normal_kernel<<<grid_for(n, 256, 8192), 256, 0, stream>>>(w, n, std, seed);
    K3C_CUDA_LAUNCHED("fill_bf16_normal");
    return K3C_OK;
}

__global__ void fill_bytes_kernel(uint8_t *p, size_t n, uint64_t seed, int scale_byte) {
    size_t words = (n + 7) / 8;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < words; j += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed, j);
        for (int b = 0; b < 8 && j * 8 + b < n; b++) {
            uint8_t v = (uint8_t)(h >> (8 * b));
            p[j * 8 + b] = scale_byte >= 0 ? (uint8_t)(scale_byte - (v & 1)) : v;
        }
    }
}

extern "C" int k3c_cuda_fill_mxfp4(uint8_t *packed, size_t n_packed, uint8_t *scale, size_t n_scale, int scale_byte,
                                   uint64_t seed, cudaStream_t stream) {
    if (scale_byte < 1 || scale_byte > 254)
        return k3c_errorf("k3c_cuda_fill_mxfp4: scale byte %d outside 1..254", scale_byte);
    if (n_packed) {
        fill_bytes_kernel<<<grid_for((n_packed + 7) / 8, 256, 8192), 256, 0, stream>>>(packed, n_packed, seed, -1);
        K3C_CUDA_LAUNCHED("fill_mxfp4 packed");
    }
    if (n_scale) {
        fill_bytes_kernel<<<grid_for((n_scale + 7) / 8, 256, 8192), 256, 0, stream>>>(scale, n_scale,
                                                                                     seed ^ 0x5ca1ab1eull, scale_byte);
        K3C_CUDA_LAUNCHED("fill_mxfp4 scale");
    }
    return K3C_OK;
}

/* ---- KDA, several requests per launch ---- */

__device__ __forceinline__ float maybe_round(float x, int round) { return round ? k3c_dev_bf16(k3c_dev_to_bf16(x)) : x; }

/* grid (ceil(C / 256), nseg): one thread per (channel, request), the request's tokens in order; the window is
 * read before it is advanced (same thread), as k3c_cuda_kda_conv. */
__global__ void kda_conv_segs_kernel(const float *__restrict__ x, const k3c_cuda_seg *__restrict__ segs, int C, int W,
                                     const float *__restrict__ taps, int which, int round, float *out) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    k3c_cuda_seg sg = segs[blockIdx.y];
    int T = sg.n, h = W - 1;
    if (T <= 0) return;
    const float *xs = x + (size_t)sg.row0 * C;
    float *os = out + (size_t)sg.row0 * C;
    float *window = sg.window + (size_t)which * h * C;
    const float *tap = taps + (size_t)c * W;
    for (int t = 0; t < T; t++) {
        float s = 0.0f;
        for (int j = 0; j < W; j++) {
            int ti = t - h + j;
            float v = ti >= 0 ? xs[(size_t)ti * C + c] : window[(size_t)(h + ti) * C + c];
            s = fmaf(tap[j], v, s);
        }
        os[(size_t)t * C + c] = maybe_round(k3c_dev_silu(s), round);
    }
    if (T >= h) {
        for (int i = 0; i < h; i++) window[(size_t)i * C + c] = xs[(size_t)(T - h + i) * C + c];
    } else {
        for (int i = 0; i < h - T; i++) window[(size_t)i * C + c] = window[(size_t)(i + T) * C + c];
        for (int i = 0; i < T; i++) window[(size_t)(h - T + i) * C + c] = xs[(size_t)i * C + c];
    }
}

extern "C" int k3c_cuda_kda_conv_segs(const float *x, const k3c_cuda_seg *segs, int nseg, int C, int W,
                                      const float *taps, int which, int round_bf16, float *out, cudaStream_t stream) {
    if (nseg <= 0) return K3C_OK;
    if (C <= 0 || W <= 0 || nseg > 65535)
        return k3c_errorf("k3c_cuda_kda_conv_segs: bad shape C %d W %d nseg %d", C, W, nseg);
    dim3 grid((C + 255) / 256, nseg);
    kda_conv_segs_kernel<<<grid, 256, 0, stream>>>(x, segs, C, W, taps, which, round_bf16, out);
    K3C_CUDA_LAUNCHED("kda_conv_segs");
    return K3C_OK;
}

#define KDA_ROWS 32 /* key rows of the state per thread */

/* grid (H, nseg), block (dk / 32) * dv threads: k3c_cuda_kda_recurrent's kernel with the request picked by
 * blockIdx.y (its state and row range). Thread (part, e) holds S[part*32 .. part*32+31][e] in registers; per
 * token: decay and S^T k (partials over parts reduced through shared memory), u = beta (v - S^T k), rank-1
 * update, o = S^T q from the updated state. */
__global__ void __launch_bounds__(512)
kda_recurrent_segs_kernel(const k3c_cuda_seg *__restrict__ segs, const float *__restrict__ q,
                          const float *__restrict__ k, const float *__restrict__ v, const float *__restrict__ g,
                          const float *__restrict__ beta, int H, int dk, int dv, int round, float *o) {
    extern __shared__ float sm[];
    k3c_cuda_seg sg = segs[blockIdx.y];
    if (sg.n <= 0) return;
    int parts = dk / KDA_ROWS;
    float *qs = sm, *ks = qs + dk, *as = ks + dk, *vs = as + dk, *red1 = vs + dv, *red2 = red1 + parts * dv;
    int h = blockIdx.x, tid = threadIdx.x, e = tid % dv, part = tid / dv, d0 = part * KDA_ROWS;
    size_t hs = (size_t)dk * dv;
    float *S = sg.state + (size_t)h * hs;
    float s[KDA_ROWS];
#pragma unroll
    for (int i = 0; i < KDA_ROWS; i++) s[i] = S[(size_t)(d0 + i) * dv + e];
    for (int t = 0; t < sg.n; t++) {
        size_t rk = (size_t)(sg.row0 + t) * H + h;
        for (int i = tid; i < dk; i += blockDim.x) {
            qs[i] = q[rk * dk + i];
            ks[i] = k[rk * dk + i];
            as[i] = expf(g[rk * dk + i]);
        }
        for (int i = tid; i < dv; i += blockDim.x) vs[i] = v[rk * dv + i];
        float b = beta[rk];
        __syncthreads();
        float kS = 0.0f;
#pragma unroll
        for (int i = 0; i < KDA_ROWS; i++) {
            s[i] *= as[d0 + i];
            kS = fmaf(ks[d0 + i], s[i], kS);
        }
        red1[part * dv + e] = kS;
        __syncthreads();
        float tot = 0.0f;
        for (int p = 0; p < parts; p++) tot += red1[p * dv + e];
        float u = b * (vs[e] - tot);
        float oq = 0.0f;
#pragma unroll
        for (int i = 0; i < KDA_ROWS; i++) {
            s[i] = fmaf(ks[d0 + i], u, s[i]);
            oq = fmaf(qs[d0 + i], s[i], oq);
        }
        red2[part * dv + e] = oq;
        /* after this barrier nobody reads qs/ks/as/vs or red1 of this token, so the next token may overwrite
         * them; red2 is rewritten only after the next token's second barrier */
        __syncthreads();
        if (part == 0 && o) {
            float acc = 0.0f;
            for (int p = 0; p < parts; p++) acc += red2[p * dv + e];
            o[rk * dv + e] = maybe_round(acc, round);
        }
    }
#pragma unroll
    for (int i = 0; i < KDA_ROWS; i++) S[(size_t)(d0 + i) * dv + e] = s[i];
}

extern "C" int k3c_cuda_kda_recurrent_segs(const k3c_cuda_seg *segs, int nseg, const float *q, const float *k,
                                           const float *v, const float *g, const float *beta, int H, int dk, int dv,
                                           int round_bf16, float *o, cudaStream_t stream) {
    if (nseg <= 0) return K3C_OK;
    if (dk <= 0 || dk % KDA_ROWS || dv <= 0 || (dk / KDA_ROWS) * dv > 512 || H <= 0 || nseg > 65535)
        return k3c_errorf("k3c_cuda_kda_recurrent_segs: unsupported shape H %d dk %d dv %d nseg %d (dk a multiple "
                          "of %d, dk/%d*dv <= 512)", H, dk, dv, nseg, KDA_ROWS, KDA_ROWS);
    int parts = dk / KDA_ROWS;
    size_t smem = (3 * (size_t)dk + dv + 2 * (size_t)parts * dv) * sizeof(float);
    dim3 grid(H, nseg);
    kda_recurrent_segs_kernel<<<grid, parts * dv, smem, stream>>>(segs, q, k, v, g, beta, H, dk, dv, round_bf16, o);
    K3C_CUDA_LAUNCHED("kda_recurrent_segs");
    return K3C_OK;
}
