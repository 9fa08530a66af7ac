/* KDA kernels: conv, gate, q/k norm, the gated delta rule, gated output norm. */
#include "cuda/kda.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

__device__ __forceinline__ float maybe_round(float x, int round) {
    return round ? k3c_dev_bf16(k3c_dev_to_bf16(x)) : x;
}

/* One thread per channel, tokens in order; the window is read before it is advanced (same thread). */
__global__ void kda_conv_kernel(const float *__restrict__ x, int T, int C, int W, const float *__restrict__ taps,
                                float *window, int round, float *out) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int h = W - 1;
    const float *tap = taps + (size_t)c * W;
    for (int t = 0; t < T; t++) {
        float s = 0.0f;
        for (int j = 0; j < W; j++) {
            int ti = t - h + j;
            float v = ti >= 0 ? x[(size_t)ti * C + c] : window[(size_t)(h + ti) * C + c];
            s = fmaf(tap[j], v, s);
        }
        out[(size_t)t * C + c] = maybe_round(k3c_dev_silu(s), round);
    }
    /* New window = the last h rows of [window ; x]. */
    if (T >= h) {
        for (int i = 0; i < h; i++) window[(size_t)i * C + c] = x[(size_t)(T - h + i) * C + c];
    } else {
        for (int i = 0; i < h - T; i++) window[(size_t)i * C + c] = window[(size_t)(i + T) * C + c];
        for (int i = 0; i < T; i++) window[(size_t)(h - T + i) * C + c] = x[(size_t)i * C + c];
    }
}

extern "C" int k3c_cuda_kda_conv(const float *x, int T, int C, int W, const float *taps, float *window,
                                 int round_bf16, float *out, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (T < 0 || C <= 0 || W <= 0) return k3c_errorf("k3c_cuda_kda_conv: bad shape T %d C %d W %d", T, C, W);
    kda_conv_kernel<<<(C + 255) / 256, 256, 0, stream>>>(x, T, C, W, taps, window, round_bf16, out);
    K3C_CUDA_LAUNCHED("kda_conv");
    return K3C_OK;
}

__global__ void kda_gate_kernel(const float *__restrict__ f, const float *__restrict__ b, const float *__restrict__ a_log,
                                const float *__restrict__ dt_bias, int T, int H, int dk, int has_lb, float lb, float *g,
                                float *beta) {
    size_t P = (size_t)H * dk, n = (size_t)T * P;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t ch = i % P;
        float A = expf(a_log[ch / dk]);
        float x = f[i] + dt_bias[ch];
        if (has_lb) {
            g[i] = lb * k3c_dev_sigmoid(A * x);
        } else {
            float sp = x > 20.0f ? x : log1pf(expf(x)); /* torch softplus threshold 20 */
            g[i] = -A * sp;
        }
        if (beta && b && i < (size_t)T * H) beta[i] = k3c_dev_sigmoid(b[i]);
    }
}

extern "C" int k3c_cuda_kda_gate(const float *f, const float *b, const float *a_log, const float *dt_bias, int T,
                                 int H, int dk, int has_lower_bound, float lower_bound, float *g, float *beta,
                                 cudaStream_t stream) {
    size_t n = (size_t)T * H * dk;
    if (!n) return K3C_OK;
    size_t blocks = (n + 255) / 256;
    kda_gate_kernel<<<(unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, stream>>>(f, b, a_log, dt_bias, T, H, dk,
                                                                                   has_lower_bound, lower_bound, g, beta);
    K3C_CUDA_LAUNCHED("kda_gate");
    return K3C_OK;
}

/* One warp per (token, head) row. */
__global__ void kda_qk_norm_kernel(float *q, float *k, int rows, int dk, float qscale) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    float *qr = q + (size_t)r * dk, *kr = k + (size_t)r * dk;
    float sq = 0.0f, sk = 0.0f;
    for (int d = lane; d < dk; d += 32) {
        sq = fmaf(qr[d], qr[d], sq);
        sk = fmaf(kr[d], kr[d], sk);
    }
    sq = k3c_warp_sum(sq);
    sk = k3c_warp_sum(sk);
    float rq = qscale / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
    for (int d = lane; d < dk; d += 32) {
        qr[d] *= rq;
        kr[d] *= rk;
    }
}

extern "C" int k3c_cuda_kda_qk_norm(float *q, float *k, int T, int H, int dk, cudaStream_t stream) {
    int rows = T * H;
    if (!rows) return K3C_OK;
    kda_qk_norm_kernel<<<(rows + 7) / 8, 256, 0, stream>>>(q, k, rows, dk, 1.0f / sqrtf((float)dk));
    K3C_CUDA_LAUNCHED("kda_qk_norm");
    return K3C_OK;
}

#define KDA_ROWS 32 /* key rows of the state per thread */
#define KDA_SLICE 32 /* value columns per block */

/* grid (H, ceil(dv / KDA_SLICE)): the value columns of the state are independent (S^T k, u, the rank-1
 * update and S^T q are all per column e), so each block owns a slice of at most KDA_SLICE columns of one
 * head: thread (part, e) holds S[part*32 .. part*32+31][e] in registers, (dk / 32) * slice threads. Per
 * token: decay and S^T k (partials over parts reduced through shared memory), u = beta (v - S^T k), rank-1
 * update, o = S^T q from the updated state (spec §2.2 step 7, FLA naive_recurrent_kda order). Splitting the
 * columns gives H * dv / 32 blocks instead of H (measured before: 96 blocks, 0.26 of copy bandwidth). */
__global__ void __launch_bounds__(512)
kda_recurrent_kernel(float *state, const float *__restrict__ q, const float *__restrict__ k,
                     const float *__restrict__ v, const float *__restrict__ g, const float *__restrict__ beta, int T,
                     int H, int dk, int dv, int sw, int round, float *o, float *states) {
    extern __shared__ float sm[];
    int parts = dk / KDA_ROWS;
    float *qs = sm, *ks = qs + dk, *as = ks + dk, *vs = as + dk, *red1 = vs + sw, *red2 = red1 + parts * sw;
    int h = blockIdx.x, tid = threadIdx.x, el = tid % sw, part = tid / sw, d0 = part * KDA_ROWS;
    int e = blockIdx.y * sw + el;
    bool live = e < dv;
    int ec = live ? e : dv - 1;
    size_t hs = (size_t)dk * dv;
    float *S = state + (size_t)h * hs;
    float s[KDA_ROWS];
#pragma unroll
    for (int i = 0; i < KDA_ROWS; i++) s[i] = S[(size_t)(d0 + i) * dv + ec];
    for (int t = 0; t < T; t++) {
        size_t rk = (size_t)t * H + h;
        for (int i = tid; i < dk; i += blockDim.x) {
            qs[i] = q[rk * dk + i];
            ks[i] = k[rk * dk + i];
            as[i] = expf(g[rk * dk + i]);
        }
        for (int i = tid; i < sw; i += blockDim.x) vs[i] = v[rk * dv + min(blockIdx.y * sw + i, dv - 1)];
        float b = beta[rk];
        __syncthreads();
        float kS = 0.0f;
#pragma unroll
        for (int i = 0; i < KDA_ROWS; i++) {
            s[i] *= as[d0 + i];
            kS = fmaf(ks[d0 + i], s[i], kS);
        }
        red1[part * sw + el] = kS;
        __syncthreads();
        float tot = 0.0f;
        for (int p = 0; p < parts; p++) tot += red1[p * sw + el];
        float u = b * (vs[el] - tot);
        float oq = 0.0f;
#pragma unroll
        for (int i = 0; i < KDA_ROWS; i++) {
            s[i] = fmaf(ks[d0 + i], u, s[i]);
            oq = fmaf(qs[d0 + i], s[i], oq);
        }
        red2[part * sw + el] = oq;
        if (states && live) {
            float *St = states + ((size_t)t * H + h) * hs;
#pragma unroll
            for (int i = 0; i < KDA_ROWS; i++) St[(size_t)(d0 + i) * dv + e] = s[i];
        }
        __syncthreads();
        if (part == 0 && o && live) {
            float acc = 0.0f;
            for (int p = 0; p < parts; p++) acc += red2[p * sw + el];
            o[rk * dv + e] = maybe_round(acc, round);
        }
    }
    if (live)
#pragma unroll
        for (int i = 0; i < KDA_ROWS; i++) S[(size_t)(d0 + i) * dv + e] = s[i];
}

extern "C" int k3c_cuda_kda_recurrent(float *state, const float *q, const float *k, const float *v, const float *g,
                                      const float *beta, int T, int H, int dk, int dv, int round_bf16, float *o,
                                      float *states, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (dk <= 0 || dk % KDA_ROWS || dv <= 0 || (dk / KDA_ROWS) * (dv < KDA_SLICE ? dv : KDA_SLICE) > 512 || H <= 0 ||
        T < 0)
        return k3c_errorf("k3c_cuda_kda_recurrent: unsupported shape H %d dk %d dv %d (dk a multiple of %d, "
                          "dk/%d*min(dv,%d) <= 512)", H, dk, dv, KDA_ROWS, KDA_ROWS, KDA_SLICE);
    int parts = dk / KDA_ROWS, sw = dv < KDA_SLICE ? dv : KDA_SLICE;
    size_t smem = (3 * (size_t)dk + sw + 2 * (size_t)parts * sw) * sizeof(float);
    dim3 grid(H, (dv + sw - 1) / sw);
    kda_recurrent_kernel<<<grid, parts * sw, smem, stream>>>(state, q, k, v, g, beta, T, H, dk, dv, sw, round_bf16, o,
                                                             states);
    K3C_CUDA_LAUNCHED("kda_recurrent");
    return K3C_OK;
}

extern "C" int k3c_cuda_kda_chunked(float *state, const float *q, const float *k, const float *v, const float *g,
                                    const float *beta, int T, int H, int dk, int dv, int chunk, int round_bf16,
                                    float *o, cudaStream_t stream) {
    return k3c_cuda_kda_recurrent(state, q, k, v, g, beta, T, H, dk, dv, round_bf16, o, NULL, stream);
}

/* One warp per (token, head) row. */
__global__ void kda_gated_norm_kernel(const float *__restrict__ o, const float *__restrict__ z,
                                      const float *__restrict__ w, int rows, int dv, float eps, int silu, int round,
                                      float *y) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float *orow = o + (size_t)r * dv, *zrow = z + (size_t)r * dv;
    float ss = 0.0f;
    for (int e = lane; e < dv; e += 32) ss = fmaf(orow[e], orow[e], ss);
    ss = k3c_warp_sum(ss);
    float rs = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int e = lane; e < dv; e += 32) {
        float zz = zrow[e];
        float gate = silu ? k3c_dev_silu(zz) : k3c_dev_sigmoid(zz);
        y[(size_t)r * dv + e] = maybe_round(orow[e] * rs * w[e] * gate, round);
    }
}

extern "C" int k3c_cuda_kda_gated_norm(const float *o, const float *z, const float *w, int T, int H, int dv, float eps,
                                       int silu_gate, int round_bf16, float *y, cudaStream_t stream) {
    int rows = T * H;
    if (!rows) return K3C_OK;
    kda_gated_norm_kernel<<<(rows + 7) / 8, 256, 0, stream>>>(o, z, w, rows, dv, eps, silu_gate, round_bf16, y);
    K3C_CUDA_LAUNCHED("kda_gated_norm");
    return K3C_OK;
}
