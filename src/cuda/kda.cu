/* KDA kernels: conv, gate, q/k norm, the gated delta rule (recurrent and chunked), gated output norm, and
 * the fused decode kernel that runs all of them but the chunked one for decode / verify rows, through the
 * same per-element device functions. The multi-request (_segs) forms of the conv, recurrent and chunked
 * kernels are the same kernels as the single-request ones, with the request read from a device array. */
#include "cuda/kda.h"

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/kernel_limits.h"

__device__ __forceinline__ float maybe_round(float x, int round) {
    return round ? k3c_dev_bf16(k3c_dev_to_bf16(x)) : x;
}

/* ---- per-element / per-row math, shared by the separate kernels and the fused decode kernel ----
 * Each function below is the whole arithmetic of one output element (or of one warp's row) of a separate
 * kernel; the separate kernels and kda_decode_fused_kernel call them, so the fused kernel gives the same
 * bits (same operations, same order, same rounding points; the contractions are the explicit fmaf). */

/* Conv + SiLU of channel c at token t of x rows xs [*, C] (token 0 = row 0), the W - 1 tokens before the
 * first one read from window [W-1, C] (oldest first; not yet advanced). */
#define KDA_CONV_WMAX 4 /* conv widths up to this load all their taps and inputs before the first product */
__device__ __forceinline__ float kda_conv_value(const float *xs, const float *window, const float *tap, int C,
                                                int c, int W, int t, int round) {
    int h = W - 1;
    float s = 0.0f;
    if (W <= KDA_CONV_WMAX) {
        /* the loads first, then the products in tap order (the same sum as the loop below): a rolled loop
         * waits for each tap's two loads before issuing the next tap's, W round trips a token */
        float v[KDA_CONV_WMAX], tp[KDA_CONV_WMAX];
#pragma unroll
        for (int j = 0; j < KDA_CONV_WMAX; j++) {
            int ti = t - h + j;
            v[j] = j >= W ? 0.0f : ti >= 0 ? xs[(size_t)ti * C + c] : window[(size_t)(h + ti) * C + c];
            tp[j] = j < W ? tap[j] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < KDA_CONV_WMAX; j++)
            if (j < W) s = fmaf(tp[j], v[j], s);
        return maybe_round(k3c_dev_silu(s), round);
    }
    for (int j = 0; j < W; j++) {
        int ti = t - h + j;
        float v = ti >= 0 ? xs[(size_t)ti * C + c] : window[(size_t)(h + ti) * C + c];
        s = fmaf(tap[j], v, s);
    }
    return maybe_round(k3c_dev_silu(s), round);
}

/* Advances channel c of the window past T tokens of xs: new window = the last W - 1 rows of [window ; x]. */
__device__ __forceinline__ void kda_conv_advance(const float *xs, float *window, int C, int c, int W, int T) {
    int h = W - 1;
    if (T >= h) {
        for (int i = 0; i < h; i++) window[(size_t)i * C + c] = xs[(size_t)(T - h + i) * C + c];
    } else {
        for (int i = 0; i < h - T; i++) window[(size_t)i * C + c] = window[(size_t)(i + T) * C + c];
        for (int i = 0; i < T; i++) window[(size_t)(h - T + i) * C + c] = xs[(size_t)i * C + c];
    }
}

/* Decay gate of one element: f the f projection, dtb its dt_bias, alog its head's A_log. */
__device__ __forceinline__ float kda_gate_value(float f, float dtb, float alog, int has_lb, float lb) {
    float A = expf(alog);
    float x = f + dtb;
    if (has_lb) return lb * k3c_dev_sigmoid(A * x);
    float sp = x > 20.0f ? x : log1pf(expf(x)); /* torch softplus threshold 20 */
    return -A * sp;
}

/* The q and k L2-norm factors of one (token, head) row, by one whole warp (lanes stride d, butterfly sum);
 * every lane gets both. The normed values are qr[d] * rq and kr[d] * rk. */
__device__ __forceinline__ void kda_qk_norm_factors(const float *qr, const float *kr, int dk, float qscale, int lane,
                                                    float *rq, float *rk) {
    float sq = 0.0f, sk = 0.0f;
    for (int d = lane; d < dk; d += 32) {
        sq = fmaf(qr[d], qr[d], sq);
        sk = fmaf(kr[d], kr[d], sk);
    }
    sq = k3c_warp_sum(sq);
    sk = k3c_warp_sum(sk);
    *rq = qscale / sqrtf(sq + 1e-6f);
    *rk = 1.0f / sqrtf(sk + 1e-6f);
}

#define KDA_ROWS 32 /* key rows of the state per thread */
#define KDA_SLICE 32 /* value columns per block */

/* The recurrence's per-thread steps for one token; s = S[d0 .. d0+31][e] of value column e in registers,
 * ks / qs / as the token's k, q, exp(g) rows. First: decay, and this thread's part of (S^T k)[e]. */
__device__ __forceinline__ float kda_rec_decay_ks(float (&s)[KDA_ROWS], const float *ks, const float *as, int d0) {
    float kS = 0.0f;
#pragma unroll
    for (int i = 0; i < KDA_ROWS; i++) {
        s[i] *= as[d0 + i];
        kS = fmaf(ks[d0 + i], s[i], kS);
    }
    return kS;
}

/* Sum of the parts' partials of column el (red [parts][sw]), parts in order. */
__device__ __forceinline__ float kda_rec_sum(const float *red, int parts, int sw, int el) {
    float tot = 0.0f;
    for (int p = 0; p < parts; p++) tot += red[p * sw + el];
    return tot;
}

/* u = beta (v - S^T k) from the summed S^T k. */
__device__ __forceinline__ float kda_rec_u(float b, float v, float tot) { return b * (v - tot); }

/* Rank-1 update with u, and this thread's part of (S^T q)[e] from the updated state. */
__device__ __forceinline__ float kda_rec_update_oq(float (&s)[KDA_ROWS], const float *ks, const float *qs, float u,
                                                   int d0) {
    float oq = 0.0f;
#pragma unroll
    for (int i = 0; i < KDA_ROWS; i++) {
        s[i] = fmaf(ks[d0 + i], u, s[i]);
        oq = fmaf(qs[d0 + i], s[i], oq);
    }
    return oq;
}

/* Gated RMSNorm of one (token, head) row of dv by one whole warp: yrow[e] = o * rsqrt(mean(o^2) + eps) *
 * w * act(z), as the row's scale (every lane gets it) and each element's value from it: the fused kernel
 * calls the two with z and w staged in shared memory, the same arithmetic. */
__device__ __forceinline__ float kda_gated_norm_scale(const float *orow, int dv, float eps, int lane) {
    float ss = 0.0f;
    for (int e = lane; e < dv; e += 32) ss = fmaf(orow[e], orow[e], ss);
    ss = k3c_warp_sum(ss);
    return 1.0f / sqrtf(ss / (float)dv + eps);
}

__device__ __forceinline__ float kda_gated_norm_value(float o, float rs, float w, float zz, int silu, int round) {
    float gate = silu ? k3c_dev_silu(zz) : k3c_dev_sigmoid(zz);
    return maybe_round(o * rs * w * gate, round);
}

__device__ __forceinline__ void kda_gated_norm_row(const float *orow, const float *zrow, const float *w, int dv,
                                                   float eps, int silu, int round, float *yrow, int lane) {
    float rs = kda_gated_norm_scale(orow, dv, eps, lane);
    for (int e = lane; e < dv; e += 32) yrow[e] = kda_gated_norm_value(orow[e], rs, w[e], zrow[e], silu, round);
}

/* grid (ceil(C / 256), nseg): one thread per (channel, request), the request's tokens in order; the window
 * is read before it is advanced (same thread). The request is segs[blockIdx.y], or `one` when segs is NULL
 * (the single-request launcher): one kernel, so both launchers give the same bits. */
__global__ void kda_conv_kernel(const float *__restrict__ x, const k3c_cuda_seg *__restrict__ segs, k3c_cuda_seg one,
                                int C, int W, const float *__restrict__ taps, int which, int round, float *out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_KDA_CONV);
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    k3c_cuda_seg sg = segs ? segs[blockIdx.y] : one;
    int T = sg.n;
    if (T <= 0) return;
    const float *xs = x + (size_t)sg.row0 * C;
    float *os = out + (size_t)sg.row0 * C;
    float *window = sg.window + (size_t)which * (W - 1) * C;
    const float *tap = taps + (size_t)c * W;
    for (int t = 0; t < T; t++) os[(size_t)t * C + c] = kda_conv_value(xs, window, tap, C, c, W, t, round);
    if (!sg.read_only) kda_conv_advance(xs, window, C, c, W, T);
    K3C_STAMP_BLOCK_END(K3C_KID_KDA_CONV);
}

extern "C" int k3c_cuda_kda_conv(const float *x, int T, int C, int W, const float *taps, float *window,
                                 int round_bf16, float *out, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (T < 0 || C <= 0 || W <= 0) return k3c_errorf("k3c_cuda_kda_conv: bad shape T %d C %d W %d", T, C, W);
    k3c_cuda_seg one = {0, T, NULL, window};
    kda_conv_kernel<<<(C + 255) / 256, 256, 0, stream>>>(x, NULL, one, C, W, taps, 0, round_bf16, out);
    K3C_CUDA_LAUNCHED("kda_conv");
    return K3C_OK;
}

extern "C" int k3c_cuda_kda_conv_segs(const float *x, const k3c_cuda_seg *segs, int nseg, int C, int W,
                                      const float *taps, int which, int round_bf16, float *out, cudaStream_t stream) {
    if (nseg <= 0) return K3C_OK;
    if (C <= 0 || W <= 0 || nseg > 65535)
        return k3c_errorf("k3c_cuda_kda_conv_segs: bad shape C %d W %d nseg %d", C, W, nseg);
    k3c_cuda_seg none = {0, 0, NULL, NULL};
    dim3 grid((C + 255) / 256, nseg);
    kda_conv_kernel<<<grid, 256, 0, stream>>>(x, segs, none, C, W, taps, which, round_bf16, out);
    K3C_CUDA_LAUNCHED("kda_conv_segs");
    return K3C_OK;
}

__global__ void kda_gate_kernel(const float *__restrict__ f, const float *__restrict__ b, const float *__restrict__ a_log,
                                const float *__restrict__ dt_bias, int T, int H, int dk, int has_lb, float lb, float *g,
                                float *beta) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_KDA_GATE);
    size_t P = (size_t)H * dk, n = (size_t)T * P;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t ch = i % P;
        g[i] = kda_gate_value(f[i], dt_bias[ch], a_log[ch / dk], has_lb, lb);
        if (beta && b && i < (size_t)T * H) beta[i] = k3c_dev_sigmoid(b[i]);
    }
    K3C_STAMP_BLOCK_END(K3C_KID_KDA_GATE);
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
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_KDA_QK_NORM);
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    float *qr = q + (size_t)r * dk, *kr = k + (size_t)r * dk;
    float rq, rk;
    kda_qk_norm_factors(qr, kr, dk, qscale, lane, &rq, &rk);
    for (int d = lane; d < dk; d += 32) {
        qr[d] *= rq;
        kr[d] *= rk;
    }
    K3C_STAMP_BLOCK_END(K3C_KID_KDA_QK_NORM);
}

extern "C" int k3c_cuda_kda_qk_norm(float *q, float *k, int T, int H, int dk, cudaStream_t stream) {
    int rows = T * H;
    if (!rows) return K3C_OK;
    kda_qk_norm_kernel<<<(rows + 7) / 8, 256, 0, stream>>>(q, k, rows, dk, 1.0f / sqrtf((float)dk));
    K3C_CUDA_LAUNCHED("kda_qk_norm");
    return K3C_OK;
}

/* grid (H, ceil(dv / KDA_SLICE), nseg): the value columns of the state are independent (S^T k, u, the
 * rank-1 update and S^T q are all per column e), so each block owns a slice of at most KDA_SLICE columns of
 * one head of one request: thread (part, e) holds S[part*32 .. part*32+31][e] in registers, (dk / 32) *
 * slice threads. Per token: decay and S^T k (partials over parts reduced through shared memory), u = beta
 * (v - S^T k), rank-1 update, o = S^T q from the updated state (spec §2.2 step 7, FLA naive_recurrent_kda
 * order). Splitting the columns gives H * dv / 32 blocks per request instead of H (measured before: 96
 * blocks, 0.26 of copy bandwidth). The request is segs[blockIdx.z] (its state and rows [row0, row0 + n)),
 * or `one` when segs is NULL: the single- and multi-request launchers run this one kernel, so a column's
 * arithmetic and reduction order do not depend on which launcher ran it. states (single request only,
 * may be NULL) receives the state after each token. */
__global__ void __launch_bounds__(512)
kda_recurrent_kernel(const k3c_cuda_seg *__restrict__ segs, k3c_cuda_seg one, const float *__restrict__ q,
                     const float *__restrict__ k, const float *__restrict__ v, const float *__restrict__ g,
                     const float *__restrict__ beta, int H, int dk, int dv, int sw, int round, float *o,
                     float *states) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_KDA_RECURRENT);
    extern __shared__ float sm[];
    k3c_cuda_seg sg = segs ? segs[blockIdx.z] : one;
    if (sg.n <= 0) return;
    int parts = dk / KDA_ROWS;
    float *qs = sm, *ks = qs + dk, *as = ks + dk, *vs = as + dk, *red1 = vs + sw, *red2 = red1 + parts * sw;
    int h = blockIdx.x, tid = threadIdx.x, el = tid % sw, part = tid / sw, d0 = part * KDA_ROWS;
    int e = blockIdx.y * sw + el;
    bool live = e < dv;
    int ec = live ? e : dv - 1;
    size_t hs = (size_t)dk * dv;
    float *S = sg.state + (size_t)h * hs;
    float s[KDA_ROWS];
#pragma unroll
    for (int i = 0; i < KDA_ROWS; i++) s[i] = S[(size_t)(d0 + i) * dv + ec];
    for (int t = 0; t < sg.n; t++) {
        size_t rk = (size_t)(sg.row0 + t) * H + h;
        for (int i = tid; i < dk; i += blockDim.x) {
            qs[i] = q[rk * dk + i];
            ks[i] = k[rk * dk + i];
            as[i] = expf(g[rk * dk + i]);
        }
        for (int i = tid; i < sw; i += blockDim.x) vs[i] = v[rk * dv + min(blockIdx.y * sw + i, dv - 1)];
        float b = beta[rk];
        __syncthreads();
        red1[part * sw + el] = kda_rec_decay_ks(s, ks, as, d0);
        __syncthreads();
        float u = kda_rec_u(b, vs[el], kda_rec_sum(red1, parts, sw, el));
        red2[part * sw + el] = kda_rec_update_oq(s, ks, qs, u, d0);
        if (states && live) {
            float *St = states + ((size_t)t * H + h) * hs;
#pragma unroll
            for (int i = 0; i < KDA_ROWS; i++) St[(size_t)(d0 + i) * dv + e] = s[i];
        }
        /* after this barrier nobody reads qs/ks/as/vs or red1 of this token, so the next token may overwrite
         * them; red2 is rewritten only after the next token's second barrier */
        __syncthreads();
        if (part == 0 && o && live) o[rk * dv + e] = maybe_round(kda_rec_sum(red2, parts, sw, el), round);
    }
    if (live && !sg.read_only)
#pragma unroll
        for (int i = 0; i < KDA_ROWS; i++) S[(size_t)(d0 + i) * dv + e] = s[i];
    K3C_STAMP_BLOCK_END(K3C_KID_KDA_RECURRENT);
}

/* Shape check and launch of kda_recurrent_kernel for nseg requests (segs NULL: the one request `one`). */
static int kda_recurrent_launch(const char *what, const k3c_cuda_seg *segs, int nseg, k3c_cuda_seg one,
                                const float *q, const float *k, const float *v, const float *g, const float *beta,
                                int H, int dk, int dv, int round_bf16, float *o, float *states, cudaStream_t stream) {
    if (dk <= 0 || dk % KDA_ROWS || dv <= 0 || (dk / KDA_ROWS) * (dv < KDA_SLICE ? dv : KDA_SLICE) > 512 || H <= 0 ||
        nseg > 65535)
        return k3c_errorf("%s: unsupported shape H %d dk %d dv %d nseg %d (dk a multiple of %d, dk/%d*min(dv,%d) "
                          "<= 512)", what, H, dk, dv, nseg, KDA_ROWS, KDA_ROWS, KDA_SLICE);
    int parts = dk / KDA_ROWS, sw = dv < KDA_SLICE ? dv : KDA_SLICE;
    size_t smem = (3 * (size_t)dk + sw + 2 * (size_t)parts * sw) * sizeof(float);
    dim3 grid(H, (dv + sw - 1) / sw, nseg);
    kda_recurrent_kernel<<<grid, parts * sw, smem, stream>>>(segs, one, q, k, v, g, beta, H, dk, dv, sw, round_bf16,
                                                             o, states);
    K3C_CUDA_LAUNCHED(what);
    return K3C_OK;
}

extern "C" int k3c_cuda_kda_recurrent(float *state, const float *q, const float *k, const float *v, const float *g,
                                      const float *beta, int T, int H, int dk, int dv, int round_bf16, float *o,
                                      float *states, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (T < 0) return k3c_errorf("k3c_cuda_kda_recurrent: bad token count %d", T);
    k3c_cuda_seg one = {0, T, state, NULL};
    return kda_recurrent_launch("k3c_cuda_kda_recurrent", NULL, 1, one, q, k, v, g, beta, H, dk, dv, round_bf16, o,
                                states, stream);
}

extern "C" int k3c_cuda_kda_recurrent_segs(const k3c_cuda_seg *segs, int nseg, const float *q, const float *k,
                                           const float *v, const float *g, const float *beta, int H, int dk, int dv,
                                           int round_bf16, float *o, cudaStream_t stream) {
    if (nseg <= 0) return K3C_OK;
    k3c_cuda_seg none = {0, 0, NULL, NULL};
    return kda_recurrent_launch("k3c_cuda_kda_recurrent_segs", segs, nseg, none, q, k, v, g, beta, H, dk, dv,
                                round_bf16, o, NULL, stream);
}

/* ---- chunked gated delta rule (spec §2.3) ----
 *
 * Chunks of KDA_CC = 32 tokens (fixed; the launchers' `chunk` argument is not used: the chunk length only
 * changes rounding). Block = KDA_CT = 256 threads (8 warps) for one (head, slice of KDA_CW = 32 value
 * columns, request); grid (H, dv / 32, nseg). As in the recurrent kernel the value columns are independent:
 * the key-side matrices of a chunk (L, Aqk, T below) do not depend on v or S, so each slice block computes
 * them itself (4x redundant at dv = 128, cheap next to giving the GPU H * dv / 32 blocks instead of H).
 * The block keeps its slice of the state, S[dk][32], in shared memory across the chunks.
 *
 * Per chunk of n <= 32 tokens, rows i, j in 0..31; rows n..31 are zero padding (q = k = v = beta = 0, g = 0,
 * so gam stays at its last real value), which makes every padded term vanish exactly (see below):
 *  0. load q, k, v (the slice), beta; gam[i][d] = sum_{t <= i} g_t[d] (one thread per key channel, f32,
 *     tokens in order), gl[d] = gam[31][d] (= gam[n-1][d]).
 *  1. L[i][j] = beta_i sum_d k_i k_j exp(gam_i - gam_j) (j < i), Aqk[i][j] = sum_d q_i k_j exp(gam_i - gam_j)
 *     (j <= i): one warp per row i (rows w, 15-w, 16+w, 31-w: 66 (i, j) pairs per warp), lanes split d,
 *     butterfly warp sums.
 *  2. warp 0: Tm = (I + L)^-1 Diag(beta), lower triangular, by forward substitution, lane c owning column c
 *     (Tm[j][c] only depends on column c, so no barrier inside): Tm[c][c] = beta_c,
 *     Tm[i][c] = -sum_{c <= j < i} L[i][j] Tm[j][c]. The other 7 warps meanwhile rewrite in place
 *     q -> q exp(gam), gam -> k exp(gam) ("Ke"), k -> k exp(gl - gam) ("Kd").
 *  3. R = V - Ke S, O1 = (q exp(gam)) S (registers), both from the incoming state.
 *  4. V' = Tm R (= U - W S of the spec: Tm V - Tm (Ke) S).
 *  5. o_i = O1_i + sum_{j <= i} Aqk[i][j] V'_j (rows < n written); S <- Diag(exp(gl)) S + Kd^T V'.
 * Phases 3-5 map thread (w, lane) to value column lane and rows w + 8 r (r < 4) or key rows w + 8 r.
 * Every exponent is gam_i - gam_j with i >= j, gam_i itself or gl - gam_i, all <= 0 for g <= 0: they may
 * underflow to 0 (strong decay: gam reaches -160 at g = -5), never overflow; exp(-gam) is never formed.
 * Padding: a padded row i has beta_i = 0 and k_i = 0, so L[i][*] = 0, Tm[i][*] = 0 (and Tm[*][i] = 0),
 * V'_i = 0, Kd_i = 0: padded rows add exactly nothing to the state, and their o is not written. */
#define KDA_CC 32          /* tokens per chunk */
#define KDA_CW 32          /* value columns per block (one per lane) */
#define KDA_CT 256         /* threads per block */
#define KDA_CWARPS (KDA_CT / 32)
#define KDA_CR (KDA_CC / KDA_CWARPS) /* rows per thread in phases 3-5 */
#define KDA_CMAXK 256      /* largest dk: dk / 32 registers per lane in phase 1 */
static_assert(KDA_CC == 32 && KDA_CWARPS == 8, "phase 1's row pairing and phase 2's lane-per-column assume these");

/* Shared floats for key dim dk: q, k, gam [32][dk]; L, Aqk, Tm [32][32]; S [dk][32]; R, V' [32][32];
 * beta [32]; gl [dk]. dk = 128: 21,664 floats (86,656 bytes). */
static size_t kda_chunk_smem(int dk) {
    return (3 * (size_t)KDA_CC * dk + 3 * (size_t)KDA_CC * KDA_CC + (size_t)dk * KDA_CW +
            2 * (size_t)KDA_CC * KDA_CW + KDA_CC + (size_t)dk) * sizeof(float);
}

__global__ void __launch_bounds__(KDA_CT)
kda_chunked_kernel(const k3c_cuda_seg *__restrict__ segs, k3c_cuda_seg one, const float *__restrict__ q,
                   const float *__restrict__ k, const float *__restrict__ v, const float *__restrict__ g,
                   const float *__restrict__ beta, int H, int dk, int dv, int round, float *o) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_KDA_CHUNKED);
    extern __shared__ float sm[];
    k3c_cuda_seg sg = segs ? segs[blockIdx.z] : one;
    if (sg.n <= 0) return; /* block-uniform, before any barrier */
    const int C = KDA_CC;
    float *Qs = sm;                     /* [C][dk] q, then q exp(gam) */
    float *Ks = Qs + (size_t)C * dk;    /* [C][dk] k, then Kd = k exp(gl - gam) */
    float *Gs = Ks + (size_t)C * dk;    /* [C][dk] gam, then Ke = k exp(gam) */
    float *Ls = Gs + (size_t)C * dk;    /* [C][C] L (strictly lower part used) */
    float *As = Ls + C * C;             /* [C][C] Aqk (lower part with diagonal used) */
    float *Ts = As + C * C;             /* [C][C] Tm (fully written, zeros above the diagonal) */
    float *Ss = Ts + C * C;             /* [dk][KDA_CW] this slice of the state */
    float *Rs = Ss + (size_t)dk * KDA_CW; /* [C][KDA_CW] v, then R = V - Ke S */
    float *Vp = Rs + C * KDA_CW;        /* [C][KDA_CW] V' */
    float *bs = Vp + C * KDA_CW;        /* [C] beta */
    float *gl = bs + C;                 /* [dk] gam of the chunk's last token */
    const int h = blockIdx.x, e0 = blockIdx.y * KDA_CW, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int nm = dk / 32;
    const size_t hs = (size_t)dk * dv;
    float *S = sg.state + (size_t)h * hs;

    for (int i = tid; i < dk * KDA_CW; i += KDA_CT) Ss[i] = S[(size_t)(i / KDA_CW) * dv + e0 + i % KDA_CW];

    for (int t0 = 0; t0 < sg.n; t0 += C) {
        const int n = sg.n - t0 < C ? sg.n - t0 : C;
        const size_t r0 = (size_t)sg.row0 + t0; /* activation row of chunk row 0 */

        /* 0. Loads (padded rows zero) and the cumulative decay, tokens in order per key channel. */
        for (int i = tid; i < C * dk; i += KDA_CT) {
            int ri = i / dk, d = i % dk;
            size_t at = ((r0 + ri) * H + h) * dk + d;
            Qs[i] = ri < n ? q[at] : 0.0f;
            Ks[i] = ri < n ? k[at] : 0.0f;
        }
        for (int i = tid; i < C * KDA_CW; i += KDA_CT) {
            int ri = i / KDA_CW;
            Rs[i] = ri < n ? v[((r0 + ri) * H + h) * dv + e0 + i % KDA_CW] : 0.0f;
        }
        if (tid < C) bs[tid] = tid < n ? beta[(r0 + tid) * H + h] : 0.0f;
        for (int d = tid; d < dk; d += KDA_CT) {
            float gam = 0.0f;
            for (int i = 0; i < C; i++) {
                if (i < n) gam += g[((r0 + i) * H + h) * dk + d];
                Gs[(size_t)i * dk + d] = gam;
            }
            gl[d] = gam;
        }
        __syncthreads();

        /* 1. L and Aqk, one warp per row; lane holds row i's q, k, gam at d = lane + 32 m. */
        {
            const int rows[4] = {w, 15 - w, 16 + w, 31 - w};
#pragma unroll 1
            for (int ri = 0; ri < 4; ri++) {
                const int i = rows[ri];
                float qi[KDA_CMAXK / 32], ki[KDA_CMAXK / 32], gi[KDA_CMAXK / 32];
#pragma unroll
                for (int m = 0; m < KDA_CMAXK / 32; m++)
                    if (m < nm) {
                        size_t at = (size_t)i * dk + lane + 32 * m;
                        qi[m] = Qs[at];
                        ki[m] = Ks[at];
                        gi[m] = Gs[at];
                    }
                for (int j = 0; j <= i; j++) {
                    float kk = 0.0f, qk = 0.0f;
#pragma unroll
                    for (int m = 0; m < KDA_CMAXK / 32; m++)
                        if (m < nm) {
                            size_t at = (size_t)j * dk + lane + 32 * m;
                            float a = expf(gi[m] - Gs[at]) * Ks[at];
                            kk = fmaf(ki[m], a, kk);
                            qk = fmaf(qi[m], a, qk);
                        }
                    kk = k3c_warp_sum(kk);
                    qk = k3c_warp_sum(qk);
                    if (lane == 0) {
                        Ls[i * C + j] = j < i ? bs[i] * kk : 0.0f;
                        As[i * C + j] = qk;
                    }
                }
            }
        }
        __syncthreads();

        /* 2. Warp 0: Tm by forward substitution, lane c = column c, right-looking (acc[i] collects
         * -sum_j L[i][j] Tm[j][c] as the Tm[j][c] become known; for j < c Tm[j][c] = 0 adds nothing).
         * Warps 1-7: the exponentiated copies of q and k, in place (phase 1 is done with q, k, gam). */
        if (w == 0) {
            const int c = lane;
            float acc[KDA_CC];
#pragma unroll
            for (int i = 0; i < KDA_CC; i++) acc[i] = 0.0f;
#pragma unroll
            for (int j = 0; j < KDA_CC; j++) {
                float t = j < c ? 0.0f : (j == c ? bs[c] : acc[j]);
                Ts[j * C + c] = t;
#pragma unroll
                for (int i = j + 1; i < KDA_CC; i++) acc[i] = fmaf(-Ls[i * C + j], t, acc[i]);
            }
        } else {
            for (int i = tid - 32; i < C * dk; i += KDA_CT - 32) {
                int d = i % dk;
                float gi = Gs[i], kv = Ks[i];
                Qs[i] *= expf(gi);
                Gs[i] = kv * expf(gi);
                Ks[i] = kv * expf(gl[d] - gi);
            }
        }
        __syncthreads();

        /* 3. R = V - Ke S and O1 = (q exp(gam)) S for rows w + 8 r, column lane. */
        float o1[KDA_CR];
        {
            float rk[KDA_CR];
#pragma unroll
            for (int r = 0; r < KDA_CR; r++) rk[r] = o1[r] = 0.0f;
            for (int d = 0; d < dk; d++) {
                float s = Ss[d * KDA_CW + lane];
#pragma unroll
                for (int r = 0; r < KDA_CR; r++) {
                    size_t at = (size_t)(w + KDA_CWARPS * r) * dk + d;
                    rk[r] = fmaf(Gs[at], s, rk[r]);
                    o1[r] = fmaf(Qs[at], s, o1[r]);
                }
            }
#pragma unroll
            for (int r = 0; r < KDA_CR; r++) Rs[(w + KDA_CWARPS * r) * KDA_CW + lane] -= rk[r];
        }
        __syncthreads();

        /* 4. V' = Tm R (Tm lower triangular). */
#pragma unroll
        for (int r = 0; r < KDA_CR; r++) {
            const int i = w + KDA_CWARPS * r;
            float a = 0.0f;
            for (int c = 0; c <= i; c++) a = fmaf(Ts[i * C + c], Rs[c * KDA_CW + lane], a);
            Vp[i * KDA_CW + lane] = a;
        }
        __syncthreads();

        /* 5. Outputs from the incoming state plus the intra-chunk part; then the state moves to the chunk's
         * end (each thread updates its own elements S[w + 8 r'][lane], which nobody else reads here). */
        if (o) {
#pragma unroll
            for (int r = 0; r < KDA_CR; r++) {
                const int i = w + KDA_CWARPS * r;
                if (i < n) {
                    float a = o1[r];
                    for (int j = 0; j <= i; j++) a = fmaf(As[i * C + j], Vp[j * KDA_CW + lane], a);
                    o[((r0 + i) * H + h) * dv + e0 + lane] = maybe_round(a, round);
                }
            }
        }
        for (int d = w; d < dk; d += KDA_CWARPS) {
            float a = Ss[d * KDA_CW + lane] * expf(gl[d]);
            for (int i = 0; i < C; i++) a = fmaf(Ks[(size_t)i * dk + d], Vp[i * KDA_CW + lane], a);
            Ss[d * KDA_CW + lane] = a;
        }
        /* the next chunk's loads overwrite q, k, gam, R, beta, gl, which phase 5 reads */
        __syncthreads();
    }

    if (!sg.read_only)
        for (int i = tid; i < dk * KDA_CW; i += KDA_CT) S[(size_t)(i / KDA_CW) * dv + e0 + i % KDA_CW] = Ss[i];
    K3C_STAMP_BLOCK_END(K3C_KID_KDA_CHUNKED);
}

/* Whether the chunked kernel takes these dims (else the launchers run the recurrent kernel). */
static bool kda_chunk_fits(int dk, int dv) {
    return dk >= 32 && dk <= KDA_CMAXK && dk % 32 == 0 && dv >= KDA_CW && dv % KDA_CW == 0;
}

/* The chunked kernel's limit: its largest key dim's (kernel_limits.h). */
extern "C" int k3c_cuda_kda_limits(void) {
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)kda_chunked_kernel, kda_chunk_smem(KDA_CMAXK)));
    return K3C_OK;
}

static int kda_chunked_launch(const k3c_cuda_seg *segs, int nseg, k3c_cuda_seg one, const float *q, const float *k,
                              const float *v, const float *g, const float *beta, int H, int dk, int dv,
                              int round_bf16, float *o, cudaStream_t stream) {
    size_t smem = kda_chunk_smem(dk);
    /* above 48 KB of dynamic shared memory: the limit raised once per device (cuda/kernel_limits.h) */
    K3C_TRY(k3c_cuda_kernels_prepare());
    dim3 grid(H, dv / KDA_CW, nseg);
    kda_chunked_kernel<<<grid, KDA_CT, smem, stream>>>(segs, one, q, k, v, g, beta, H, dk, dv, round_bf16, o);
    K3C_CUDA_LAUNCHED("kda_chunked");
    return K3C_OK;
}

extern "C" int k3c_cuda_kda_chunked(float *state, const float *q, const float *k, const float *v, const float *g,
                                    const float *beta, int T, int H, int dk, int dv, int chunk, int round_bf16,
                                    float *o, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (T < 0 || H <= 0) return k3c_errorf("k3c_cuda_kda_chunked: bad shape T %d H %d", T, H);
    if (!kda_chunk_fits(dk, dv))
        return k3c_cuda_kda_recurrent(state, q, k, v, g, beta, T, H, dk, dv, round_bf16, o, NULL, stream);
    k3c_cuda_seg one = {0, T, state, NULL};
    return kda_chunked_launch(NULL, 1, one, q, k, v, g, beta, H, dk, dv, round_bf16, o, stream);
}

extern "C" int k3c_cuda_kda_chunked_segs(const k3c_cuda_seg *segs, int nseg, const float *q, const float *k,
                                         const float *v, const float *g, const float *beta, int H, int dk, int dv,
                                         int round_bf16, float *o, cudaStream_t stream) {
    if (nseg <= 0) return K3C_OK;
    if (!kda_chunk_fits(dk, dv))
        return k3c_cuda_kda_recurrent_segs(segs, nseg, q, k, v, g, beta, H, dk, dv, round_bf16, o, stream);
    if (H <= 0 || nseg > 65535)
        return k3c_errorf("k3c_cuda_kda_chunked_segs: bad shape H %d nseg %d", H, nseg);
    k3c_cuda_seg none = {0, 0, NULL, NULL};
    return kda_chunked_launch(segs, nseg, none, q, k, v, g, beta, H, dk, dv, round_bf16, o, stream);
}

/* One warp per (token, head) row. */
__global__ void kda_gated_norm_kernel(const float *__restrict__ o, const float *__restrict__ z,
                                      const float *__restrict__ w, int rows, int dv, float eps, int silu, int round,
                                      float *y) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_KDA_GATED_NORM);
    k3c_pdl_trigger(); /* a PDL-launched weight stream after this kernel may start (common.cuh) */
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    kda_gated_norm_row(o + (size_t)r * dv, z + (size_t)r * dv, w, dv, eps, silu, round, y + (size_t)r * dv, lane);
    K3C_STAMP_BLOCK_END(K3C_KID_KDA_GATED_NORM);
}

extern "C" int k3c_cuda_kda_gated_norm(const float *o, const float *z, const float *w, int T, int H, int dv, float eps,
                                       int silu_gate, int round_bf16, float *y, cudaStream_t stream) {
    int rows = T * H;
    if (!rows) return K3C_OK;
    kda_gated_norm_kernel<<<(rows + 7) / 8, 256, 0, stream>>>(o, z, w, rows, dv, eps, silu_gate, round_bf16, y);
    K3C_CUDA_LAUNCHED("kda_gated_norm");
    return K3C_OK;
}

/* ---- the fused KDA decode provider (the executor's KDA layer in one kernel) ----
 *
 * One block per (head, request), grid (H, nseg), owning all dv value columns of the head: thread (part, e)
 * = threadIdx.x = part * dv + e holds S[part*32 .. part*32+31][e] in registers exactly as the recurrent
 * kernel's thread of column e does (that kernel splits the columns into slices of 32 only for parallelism;
 * a column's arithmetic and its reduction over the parts, in part order, do not depend on the slice), so
 * (dk / 32) * dv threads (512 at dk = dv = 128; the same thread count per head as the recurrent kernel's
 * dv / 32 slice blocks), rounded up to whole warps (the extra lanes hold no state but take part in the
 * barriers and the warp-per-row phases). Owning the whole head is what the gated norm needs: its RMS is over
 * the head's dv outputs, which are all in this block's shared memory after the recurrence.
 *
 * The tokens of the request run in passes of up to ft (<= 8) tokens; per pass, each phase calls the separate
 * kernels' per-element functions above, so every value is the one the separate kernel writes:
 *  A. conv + SiLU (+ round) of the head's 2 dk + dv q, k, v channels, one thread per channel, tokens in order
 *     (the window is read, not advanced: a channel's window is advanced by its own thread after the last
 *     pass, as the conv kernel does after its last token); the gate g and exp(g) of the head's dk channels,
 *     beta = sigmoid(b). cv, g, beta are written out (the commit store copies them), q, k, v, exp(g), beta
 *     kept in shared memory.
 *  B. q / k L2 norms, one warp per token row (the qk_norm kernel's row math); the normed q, k go to shared
 *     memory and out to cq, ck.
 *  C. the gated delta rule, token by token (the recurrent kernel's token body, same barriers); o (rounded)
 *     into shared memory, and out to o when o is not NULL.
 *  D. the gated RMSNorm, one warp per token row (the gated_norm kernel's row math) -> y.
 * Nothing the fused kernel writes is read back from global memory, so the outputs may be read by any later
 * launch (verify's commit copies of ck, cv, g, beta run after it). */
#define KDA_FT 8           /* tokens per pass (K3C_PREPARED_Q_MAX: one pass for every prepared step) */
#define KDA_FMAXT 512      /* threads per block */
#define KDA_FSMEM 49152    /* dynamic shared memory per block without the opt-in */

static int kda_fused_threads(int dk, int dv) { return ((dk / KDA_ROWS) * dv + 31) / 32 * 32; }

/* Shared floats for a pass of ft tokens: q, k, exp(g) [ft][dk]; v, o [ft][dv]; beta [ft]; two reduction
 * rows [parts][dv]; then the pass's inputs staged by cp.async at its start: f and dt_bias [ft][dk] (by gate
 * item), b [ft], z and the norm weight [ft][dv] (by the gated norm's element). */
static size_t kda_fused_smem_floats(int dk, int dv, int ft) {
    return (size_t)ft * (3 * (size_t)dk + 2 * (size_t)dv + 1) + 2 * (size_t)(dk / KDA_ROWS) * dv +
           (size_t)ft * (2 * (size_t)dk + 1 + 2 * (size_t)dv);
}

/* Tokens per pass for these dims, 0 when the fused kernel does not take them. */
static int kda_fused_ft(int dk, int dv) {
    if (dk <= 0 || dk % KDA_ROWS || dv <= 0 || (dk / KDA_ROWS) * dv > KDA_FMAXT) return 0;
    int ft = KDA_FT;
    while (ft > 0 && kda_fused_smem_floats(dk, dv, ft) * sizeof(float) > KDA_FSMEM) ft--;
    return ft;
}

__global__ void __launch_bounds__(KDA_FMAXT)
kda_decode_fused_kernel(const k3c_cuda_seg *__restrict__ segs, const float *__restrict__ xq,
                        const float *__restrict__ xk, const float *__restrict__ xv, const float *__restrict__ tq,
                        const float *__restrict__ tk, const float *__restrict__ tv, int W, const float *__restrict__ f,
                        const float *__restrict__ b, const float *__restrict__ a_log,
                        const float *__restrict__ dt_bias, int has_lb, float lb, const float *__restrict__ z,
                        const float *__restrict__ nw, float eps, int silu, int H, int dk, int dv, float qscale, int ft,
                        int round, float *cq, float *ck, float *cv, float *g, float *beta, float *o, float *y) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_KDA_DECODE_FUSED);
    /* a PDL-launched weight stream after this kernel (the o-projection) may start and prefetch its weights
     * while the heads run: at decode this grid has requests x heads blocks, far fewer than the SMs' room */
    k3c_pdl_trigger();
    extern __shared__ float sm[];
    const k3c_cuda_seg sg = segs[blockIdx.y];
    if (sg.n <= 0) return; /* block-uniform, before any barrier */
    const int h = blockIdx.x, tid = threadIdx.x, nthr = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const int nwarp = nthr >> 5, parts = dk / KDA_ROWS, el = tid % dv, part = tid / dv, d0 = part * KDA_ROWS;
    const bool live = tid < parts * dv; /* holds state column el, rows d0 .. d0+31 */
    const int Ck = H * dk, Cv = H * dv, nch = 2 * dk + dv;
    float *qs = sm, *ks = qs + (size_t)ft * dk, *as = ks + (size_t)ft * dk, *vs = as + (size_t)ft * dk;
    float *os = vs + (size_t)ft * dv, *bs = os + (size_t)ft * dv, *red1 = bs + ft, *red2 = red1 + parts * dv;
    float *f_st = red2 + parts * dv, *dtb_st = f_st + (size_t)ft * dk, *b_st = dtb_st + (size_t)ft * dk;
    float *z_st = b_st + ft, *nw_st = z_st + (size_t)ft * dv;
    const float alog = a_log[h]; /* issued here, used in A's gate loop */
    float *S = sg.state + (size_t)h * dk * dv;
    float s[KDA_ROWS];
    if (live)
#pragma unroll
        for (int i = 0; i < KDA_ROWS; i++) s[i] = S[(size_t)(d0 + i) * dv + el];

    for (int t0 = 0; t0 < sg.n; t0 += ft) {
        const int m = sg.n - t0 < ft ? sg.n - t0 : ft;
        const size_t r0 = (size_t)sg.row0 + t0; /* activation row of the pass's first token */

        /* The pass's other inputs, copied in the background while the conv below waits for its own: each
         * thread stages exactly the elements it uses later (the gate items and beta of A, its lanes' elements
         * of D), so its own wait makes them visible and no barrier is needed. Read where they are used, they
         * were ~3 round trips after the conv's (f, b, then z, one after another); the values and the
         * arithmetic are the same. */
        for (int i = tid; i < m * dk; i += nthr) {
            const int j = i / dk, d = i % dk;
            cp_async4(f_st + i, f + (r0 + j) * Ck + (size_t)h * dk + d);
            cp_async4(dtb_st + i, dt_bias + (size_t)h * dk + d);
        }
        if (tid < m) cp_async4(b_st + tid, b + (r0 + tid) * H + h);
        for (int j = warp; j < m; j += nwarp)
            for (int e = lane; e < dv; e += 32) {
                cp_async4(z_st + j * dv + e, z + (r0 + j) * Cv + (size_t)h * dv + e);
                cp_async4(nw_st + j * dv + e, nw + e);
            }
        cp_async_commit();

        /* A. conv of channel i of the head (q: 0..dk-1, k: dk..2dk-1, v: 2dk..), gate, beta */
        for (int i = tid; i < nch; i += nthr) {
            const int which = i < dk ? 0 : i < 2 * dk ? 1 : 2, d = i - which * dk;
            const int C = which == 2 ? Cv : Ck, c = h * (which == 2 ? dv : dk) + d;
            const float *xs = (which == 0 ? xq : which == 1 ? xk : xv) + (size_t)sg.row0 * C;
            const float *tap = (which == 0 ? tq : which == 1 ? tk : tv) + (size_t)c * W;
            const float *win = sg.window + (size_t)which * (W - 1) * C;
            float *dst = which == 0 ? qs : which == 1 ? ks : vs;
            const int ld = which == 2 ? dv : dk;
            for (int j = 0; j < m; j++) {
                float val = kda_conv_value(xs, win, tap, C, c, W, t0 + j, round);
                dst[j * ld + d] = val;
                if (which == 2) cv[(r0 + j) * Cv + c] = val;
            }
        }
        cp_async_wait<0>(); /* this thread's staged inputs (above) */
        for (int i = tid; i < m * dk; i += nthr) {
            const int j = i / dk, d = i % dk;
            const size_t at = (r0 + j) * Ck + (size_t)h * dk + d;
            float gv = kda_gate_value(f_st[i], dtb_st[i], alog, has_lb, lb);
            g[at] = gv;
            as[j * dk + d] = expf(gv);
        }
        if (tid < m) {
            float bv = k3c_dev_sigmoid(b_st[tid]);
            beta[(r0 + tid) * H + h] = bv;
            bs[tid] = bv;
        }
        __syncthreads();

        /* B. q / k norms, a warp per token (each lane rescales the elements it summed) */
        for (int j = warp; j < m; j += nwarp) {
            float rq, rk;
            kda_qk_norm_factors(qs + j * dk, ks + j * dk, dk, qscale, lane, &rq, &rk);
            for (int d = lane; d < dk; d += 32) {
                const size_t at = (r0 + j) * Ck + (size_t)h * dk + d;
                float qn = qs[j * dk + d] * rq, kn = ks[j * dk + d] * rk;
                qs[j * dk + d] = qn;
                ks[j * dk + d] = kn;
                cq[at] = qn;
                ck[at] = kn;
            }
        }
        __syncthreads();

        /* C. the recurrence; red1 / red2 reuse as in kda_recurrent_kernel: red1 of token j is read only
         * between its two barriers, red2 only after the second, before the next token's first */
        for (int j = 0; j < m; j++) {
            if (live) red1[part * dv + el] = kda_rec_decay_ks(s, ks + j * dk, as + j * dk, d0);
            __syncthreads();
            if (live) {
                float u = kda_rec_u(bs[j], vs[j * dv + el], kda_rec_sum(red1, parts, dv, el));
                red2[part * dv + el] = kda_rec_update_oq(s, ks + j * dk, qs + j * dk, u, d0);
            }
            __syncthreads();
            if (live && part == 0) {
                float ov = maybe_round(kda_rec_sum(red2, parts, dv, el), round);
                os[j * dv + el] = ov;
                if (o) o[(r0 + j) * Cv + (size_t)h * dv + el] = ov;
            }
        }
        __syncthreads();

        /* D. gated norm, a warp per token. No barrier after it: the next pass writes q, k, exp(g), v, beta
         * (last read in C, before the barrier above) and o only in its C, after two more barriers. */
        for (int j = warp; j < m; j += nwarp) {
            const size_t at = (r0 + j) * Cv + (size_t)h * dv;
            const float rs = kda_gated_norm_scale(os + j * dv, dv, eps, lane);
            for (int e = lane; e < dv; e += 32)
                y[at + e] = kda_gated_norm_value(os[j * dv + e], rs, nw_st[j * dv + e], z_st[j * dv + e], silu, round);
        }
    }

    if (sg.read_only) { /* verify: the committed state and window stay as they were */
        K3C_STAMP_BLOCK_END(K3C_KID_KDA_DECODE_FUSED);
        return;
    }
    /* windows: each channel by the thread that read it in A */
    for (int i = tid; i < nch; i += nthr) {
        const int which = i < dk ? 0 : i < 2 * dk ? 1 : 2, d = i - which * dk;
        const int C = which == 2 ? Cv : Ck, c = h * (which == 2 ? dv : dk) + d;
        const float *xs = (which == 0 ? xq : which == 1 ? xk : xv) + (size_t)sg.row0 * C;
        kda_conv_advance(xs, sg.window + (size_t)which * (W - 1) * C, C, c, W, sg.n);
    }
    if (live)
#pragma unroll
        for (int i = 0; i < KDA_ROWS; i++) S[(size_t)(d0 + i) * dv + el] = s[i];
    K3C_STAMP_BLOCK_END(K3C_KID_KDA_DECODE_FUSED);
}

extern "C" int k3c_cuda_kda_decode_fused_fits(int dk, int dv) { return kda_fused_ft(dk, dv) > 0; }

/* The launches the fused kernel equals (kda.h), one after the other. */
extern "C" int k3c_cuda_kda_decode_separate(const k3c_cuda_seg *segs, int nseg, int T, int H, int dk, int dv, int W,
                                            const float *xq, const float *xk, const float *xv, const float *taps_q,
                                            const float *taps_k, const float *taps_v, const float *f, const float *b,
                                            const float *a_log, const float *dt_bias, int has_lower_bound,
                                            float lower_bound, const float *z, const float *norm_w, float eps,
                                            int silu_gate, int round_bf16, float *cq, float *ck, float *cv, float *g,
                                            float *beta, float *o, float *y, cudaStream_t stream) {
    if (nseg <= 0 || T <= 0) return K3C_OK;
    if (!o) return k3c_errorf("k3c_cuda_kda_decode_separate: o is required (the delta rule's output)");
    K3C_TRY(k3c_cuda_kda_conv_segs(xq, segs, nseg, H * dk, W, taps_q, 0, round_bf16, cq, stream));
    K3C_TRY(k3c_cuda_kda_conv_segs(xk, segs, nseg, H * dk, W, taps_k, 1, round_bf16, ck, stream));
    K3C_TRY(k3c_cuda_kda_conv_segs(xv, segs, nseg, H * dv, W, taps_v, 2, round_bf16, cv, stream));
    K3C_TRY(k3c_cuda_kda_gate(f, b, a_log, dt_bias, T, H, dk, has_lower_bound, lower_bound, g, beta, stream));
    K3C_TRY(k3c_cuda_kda_qk_norm(cq, ck, T, H, dk, stream));
    K3C_TRY(k3c_cuda_kda_recurrent_segs(segs, nseg, cq, ck, cv, g, beta, H, dk, dv, round_bf16, o, stream));
    return k3c_cuda_kda_gated_norm(o, z, norm_w, T, H, dv, eps, silu_gate, round_bf16, y, stream);
}

/* 2026-11-30 (H200, k3c bench): the specialized decode step with the fused kernel was slower than the stock one at 64
 * requests (k3-slice 42.2 against 37.8 ms, 96 heads; kimi-linear-48b 51.0 against 48.5 ms, 32 heads) and
 * faster at 8 and fewer. A block owns a whole head's state (512 threads, 64 KB of registers: 2 blocks per
 * SM), a chain of dependent phases; the separate recurrent kernel splits the columns into 4x as many
 * smaller blocks, which keep more of them in flight. So past a few blocks per SM the separate launches win.
 * The limit in blocks (requests x heads): K3C_KDA_FUSED_MAX_BLOCKS, default 4 per SM. */
extern "C" int k3c_cuda_kda_decode_fused_prefer(int nseg, int H, int dk, int dv) {
    if (!kda_fused_ft(dk, dv)) return 0;
    static long limit = -1;
    if (limit < 0) {
        const char *v = getenv("K3C_KDA_FUSED_MAX_BLOCKS");
        limit = v && *v ? atol(v) : 4L * k3c_cuda_sm_count();
    }
    return (long)nseg * H <= limit;
}

extern "C" int k3c_cuda_kda_decode_fused(const k3c_cuda_seg *segs, int nseg, int T, int H, int dk, int dv, int W,
                                         const float *xq, const float *xk, const float *xv, const float *taps_q,
                                         const float *taps_k, const float *taps_v, const float *f, const float *b,
                                         const float *a_log, const float *dt_bias, int has_lower_bound,
                                         float lower_bound, const float *z, const float *norm_w, float eps,
                                         int silu_gate, int round_bf16, float *cq, float *ck, float *cv, float *g,
                                         float *beta, float *o, float *y, cudaStream_t stream) {
    if (nseg <= 0 || T <= 0) return K3C_OK;
    if (H <= 0 || W <= 0 || nseg > 65535)
        return k3c_errorf("k3c_cuda_kda_decode_fused: bad shape H %d W %d nseg %d", H, W, nseg);
    float qscale = 1.0f / sqrtf((float)dk); /* as k3c_cuda_kda_qk_norm */
    int ft = kda_fused_ft(dk, dv);
    if (!ft) /* dims the fused kernel does not take: the separate launches, which it equals */
        return k3c_cuda_kda_decode_separate(segs, nseg, T, H, dk, dv, W, xq, xk, xv, taps_q, taps_k, taps_v, f, b,
                                            a_log, dt_bias, has_lower_bound, lower_bound, z, norm_w, eps, silu_gate,
                                            round_bf16, cq, ck, cv, g, beta, o, y, stream);
    size_t smem = kda_fused_smem_floats(dk, dv, ft) * sizeof(float);
    dim3 grid(H, nseg);
    kda_decode_fused_kernel<<<grid, kda_fused_threads(dk, dv), smem, stream>>>(
        segs, xq, xk, xv, taps_q, taps_k, taps_v, W, f, b, a_log, dt_bias, has_lower_bound, lower_bound, z, norm_w,
        eps, silu_gate, H, dk, dv, qscale, ft, round_bf16, cq, ck, cv, g, beta, o, y);
    K3C_CUDA_LAUNCHED("kda_decode_fused");
    return K3C_OK;
}

K3C_STAMP_TU(kda) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
