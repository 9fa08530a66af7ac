/* Routed experts: MXFP4 or bf16 matvecs over the selected (token, slot) pairs. */
#include "cuda/moe.h"

#include <cuda_fp16.h>

#include "cuda/check.h"
#include "cuda/common.cuh"

#include "cuda/mma.cuh"

#define MOE_WARPS 8

__device__ __forceinline__ float rnd(float x, int round) { return round ? k3c_dev_bf16(k3c_dev_to_bf16(x)) : x; }

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* MXFP4 -> bf16 pairs, the scale folded in. Nibbles i and i + 4 of a 32-bit word (elements 8j + i and
 * 8j + i + 4) sit 16 bits apart: one shift puts their signs on bits 15 / 31 and their 3 magnitude bits
 * (e1 e0 m) on the bf16 exponent's low bits and the mantissa's top bit, which reads as e2m1 * 2^-126 (code
 * 1 as the bf16 subnormal 2^-127); one bf16x2 multiply by 2^(E - 1) makes it e2m1 * 2^(E - 127), exactly
 * (at most 2 significant bits). mul: 2^(E-1) as bf16x2 when E <= 128, else 2^127, then mul2 = 2^(E-128). */
template <int I>
__device__ __forceinline__ uint32_t mx_pair(uint32_t w, uint32_t mul, uint32_t mul2, bool big) {
    uint32_t t = w << (12 - 4 * I);
    uint32_t b = (t & 0x80008000u) | ((t >> 6) & 0x01c001c0u);
    b = bf16x2_mul(b, mul);
    return big ? bf16x2_mul(b, mul2) : b;
}

__device__ __forceinline__ void mx_scale(uint32_t e, uint32_t &mul, uint32_t &mul2, bool &big) {
    big = e > 128;
    uint32_t f = big ? 254u : e + 126u;
    mul = (f << 7) | (f << 23);
    uint32_t f2 = e - 1u; /* used only when e > 128 */
    mul2 = (f2 << 7) | (f2 << 23);
}

/* cp.async: global -> shared copies that complete in the background, so the bytes a warp has in flight no
 * longer cost registers (the register-fed kernel kept 32 KB per SM in flight and reached 0.34 of the copy
 * bandwidth). src_bytes 0 zero-fills the 16 bytes. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait(void) { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* One k step of a warp's 16-row band in shared memory: per matrix 16 rows x 64 bytes (4 pieces of 16 bytes:
 * MXFP4 groups 4s .. 4s+3 of 32 elements, or bf16 chunks 4s .. 4s+3 of 8), then per matrix 16 rows x 4
 * scale bytes (MXFP4). Lane (g, q) reads piece q of rows g and g + 8: 32 lanes read 512 contiguous bytes,
 * no bank conflicts. */
#define MOE_ROW_BYTES 64
template <int NM>
struct moe_stage {
    static constexpr int w_bytes = NM * 16 * MOE_ROW_BYTES;
    static constexpr int bytes = w_bytes + NM * 16 * 4;
};

/* Grouped experts on tensor cores (mma.cuh layout). Block (band group, pair p): only the first pair that
 * chose an expert (the leader) works; it gathers every pair with the same expert, in pair order, and runs
 * them as the B columns of the mma, 8 per pass, so each selected expert's weights stream from memory once
 * per step for all the tokens that chose it (later passes re-read from L2). A warp owns a band of 16 output
 * rows (of gate and up together when UP); the wpr warps of a row group split the k steps into contiguous
 * ranges whose partial sums are added in warp order (deterministic). Each warp streams its band through its
 * own ring of S stages in shared memory (cp.async, S - 1 steps in flight while it computes one), so no block
 * barrier sits in the loop. k step: bf16: 8 elements per lane (chunk 4 s + q of the row), one mma pair;
 * MXFP4: one 32-element scale group per lane (group 4 s + q), four mma pairs. x rows: token p / k of each
 * pair (gate/up) or the pair's own row (down). Invalid experts: the pair's rows are written as 0. */
template <bool MX, bool UP, int S>
__global__ void __launch_bounds__(MOE_WARPS * 32, UP ? 2 : 3)
moe_mma_kernel(const k3c_cuda_expert *__restrict__ experts, int num_experts, int K, int R, const float *__restrict__ x,
               int x_by_token, const int *__restrict__ idx, int npairs, int k, k3c_cuda_act act, int round,
               float *__restrict__ out, int wpr, int plist_cap) {
    constexpr int NM = UP ? 2 : 1;
    constexpr int SB = moe_stage<NM>::bytes, WB = moe_stage<NM>::w_bytes;
    extern __shared__ __align__(16) unsigned char moe_smem[];
    int *plist = (int *)moe_smem;
    __shared__ float part[MOE_WARPS][NM][4][32];
    __shared__ int s_n, s_scan;
    int p = blockIdx.y, e = idx[p];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int groups = MOE_WARPS / wpr, group = warp / wpr, kw = warp % wpr;
    int row0 = (blockIdx.x * groups + group) * 16;
    if (e < 0 || e >= num_experts) {
        for (int i = threadIdx.x; i < groups * 16; i += blockDim.x) {
            int row = blockIdx.x * groups * 16 + i;
            if (row < R) out[(size_t)p * R + row] = 0.0f;
        }
        return;
    }
    int earlier = 0;
    for (int i = threadIdx.x; i < p; i += blockDim.x) earlier |= __ldg(idx + i) == e;
    if (__syncthreads_or(earlier)) return;
    unsigned char *ring = moe_smem + (size_t)plist_cap * sizeof(int) + (size_t)warp * S * SB;
    const k3c_cuda_expert ex = experts[e];
    const uint8_t *wbase[NM], *sbase[NM];
    if (MX) {
        wbase[0] = UP ? ex.gate_packed : ex.down_packed;
        sbase[0] = UP ? ex.gate_scale : ex.down_scale;
        if (UP) {
            wbase[NM - 1] = ex.up_packed;
            sbase[NM - 1] = ex.up_scale;
        }
    } else {
        wbase[0] = (const uint8_t *)(UP ? ex.gate_w : ex.down_w);
        if (UP) wbase[NM - 1] = (const uint8_t *)ex.up_w;
        sbase[0] = sbase[NM - 1] = NULL;
    }
    size_t row_bytes = MX ? (size_t)K / 2 : (size_t)K * 2;
    int nchunk = MX ? K >> 5 : K >> 3; /* 16-byte pieces of a row */
    int steps = (nchunk + 3) >> 2;
    /* the 4 scale bytes of a step go by one 4-byte cp.async when every row's scales are 4-aligned */
    bool scale_async = true;
    if (MX)
#pragma unroll
        for (int m = 0; m < NM; m++) scale_async = scale_async && (nchunk & 3) == 0 && ((uintptr_t)sbase[m] & 3) == 0;
    int s_lo = (int)((long long)kw * steps / wpr), s_hi = (int)((long long)(kw + 1) * steps / wpr);
    int ns = s_hi - s_lo;

    /* stage `slot` <- step s of the band (rows past R read row R - 1; pieces past the row are zero) */
    auto issue = [&](int s, int slot) {
        unsigned char *st = ring + (size_t)slot * SB;
#pragma unroll
        for (int j = 0; j < NM * 2; j++) {
            int i = lane + 32 * j, m = i >> 6, row = (i >> 2) & 15, piece = i & 3;
            int c = s * 4 + piece, r = min(row0 + row, R - 1);
            const uint8_t *src = wbase[m] + (size_t)r * row_bytes + (size_t)min(c, nchunk - 1) * 16;
            cp_async16(st + m * 16 * MOE_ROW_BYTES + row * MOE_ROW_BYTES + piece * 16, src, c < nchunk ? 16 : 0);
        }
        if (MX && lane < NM * 16) {
            int m = lane >> 4, row = lane & 15, r = min(row0 + row, R - 1);
            const uint8_t *src = sbase[m] + (size_t)r * nchunk + (size_t)s * 4;
            unsigned char *dst = st + WB + (m * 16 + row) * 4;
            if (scale_async) cp_async4(dst, src);
            else
                for (int b = 0; b < 4; b++) dst[b] = s * 4 + b < nchunk ? __ldg(src + b) : 0;
        }
    };

    /* The pairs that chose e, in pair order, gathered into plist a window of at most plist_cap at a time
     * (plist_cap >= 32: a whole ballot always fits), so shared memory does not grow with the step's pairs. */
    for (int scan = p; scan < npairs;) {
        __syncthreads(); /* every warp is done with the previous window's plist */
        if (warp == 0) {
            int n = 0, i0 = scan;
            for (; i0 < npairs && n + 32 <= plist_cap; i0 += 32) {
                int i = i0 + lane;
                bool m = i < npairs && __ldg(idx + i) == e;
                unsigned bal = __ballot_sync(0xffffffffu, m);
                if (m) plist[n + __popc(bal & ((1u << lane) - 1u))] = i;
                n += __popc(bal);
            }
            if (lane == 0) s_n = n, s_scan = i0;
        }
        __syncthreads();
        int n = s_n;
        scan = s_scan;
        for (int t0 = 0; t0 < n; t0 += 8) {
            int pn = t0 + g < n ? plist[t0 + g] : -1;
            const float *xg = x + (size_t)(pn < 0 ? 0 : (x_by_token ? pn / k : pn)) * K;
            float acc[NM][4];
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[m][i] = 0.0f;
            if (row0 < R) {
#pragma unroll
                for (int j = 0; j < S - 1; j++) {
                    if (j < ns) issue(s_lo + j, j);
                    cp_async_commit();
                }
                for (int j = 0; j < ns; j++) {
                    if (j + S - 1 < ns) issue(s_lo + j + S - 1, (j + S - 1) % S);
                    cp_async_commit();
                    cp_async_wait<S - 1>();
                    __syncwarp();
                    const unsigned char *st = ring + (size_t)(j % S) * SB;
                    int c = (s_lo + j) * 4 + q;
                    bool ok = pn >= 0 && c < nchunk;
                    uint4 va[NM], vb[NM];
#pragma unroll
                    for (int m = 0; m < NM; m++) {
                        va[m] = *(const uint4 *)(st + m * 16 * MOE_ROW_BYTES + g * MOE_ROW_BYTES + q * 16);
                        vb[m] = *(const uint4 *)(st + m * 16 * MOE_ROW_BYTES + (g + 8) * MOE_ROW_BYTES + q * 16);
                    }
                    /* independent accumulator chains per step (one per MXFP4 sub-step): a single chain of
                     * dependent mma was latency-bound (NOTES.md run 3) */
                    constexpr int CH = MX ? 4 : 1;
                    float d[NM][CH][4];
#pragma unroll
                    for (int m = 0; m < NM; m++)
#pragma unroll
                        for (int jj = 0; jj < CH; jj++)
#pragma unroll
                            for (int i = 0; i < 4; i++) d[m][jj][i] = 0.0f;
                    if (MX) {
                        uint32_t mula[NM], mul2a[NM], mulb[NM], mul2b[NM];
                        bool biga[NM], bigb[NM];
#pragma unroll
                        for (int m = 0; m < NM; m++) {
                            uint32_t sa = st[WB + (m * 16 + g) * 4 + q], sb = st[WB + (m * 16 + g + 8) * 4 + q];
                            mx_scale(sa, mula[m], mul2a[m], biga[m]);
                            mx_scale(sb, mulb[m], mul2b[m], bigb[m]);
                        }
#pragma unroll
                        for (int sub = 0; sub < 4; sub++) {
                            float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
                            if (ok) {
                                x0 = __ldg((const float4 *)(xg + (size_t)c * 32 + 8 * sub));
                                x1 = __ldg((const float4 *)(xg + (size_t)c * 32 + 8 * sub) + 1);
                            }
                            /* pairs (i, i + 4): B rows follow the A pairing of mx_pair */
                            uint32_t b0[3], b1[3], b2[3], b3[3];
                            bool exact = __all_sync(0xffffffffu, k3c_bf16_exact8(x0, x1));
                            if (exact) {
                                b0[0] = k3c_pack_hi16(x0.x, x1.x);
                                b1[0] = k3c_pack_hi16(x0.y, x1.y);
                                b2[0] = k3c_pack_hi16(x0.z, x1.z);
                                b3[0] = k3c_pack_hi16(x0.w, x1.w);
                            } else {
                                k3c_split3(x0.x, x1.x, b0);
                                k3c_split3(x0.y, x1.y, b1);
                                k3c_split3(x0.z, x1.z, b2);
                                k3c_split3(x0.w, x1.w, b3);
                            }
#pragma unroll
                            for (int m = 0; m < NM; m++) {
                                uint32_t wa = sub == 0 ? va[m].x : sub == 1 ? va[m].y : sub == 2 ? va[m].z : va[m].w;
                                uint32_t wb = sub == 0 ? vb[m].x : sub == 1 ? vb[m].y : sub == 2 ? vb[m].z : vb[m].w;
                                uint32_t a0 = mx_pair<0>(wa, mula[m], mul2a[m], biga[m]);
                                uint32_t a1 = mx_pair<1>(wa, mula[m], mul2a[m], biga[m]);
                                uint32_t a2 = mx_pair<2>(wa, mula[m], mul2a[m], biga[m]);
                                uint32_t a3 = mx_pair<3>(wa, mula[m], mul2a[m], biga[m]);
                                uint32_t c0 = mx_pair<0>(wb, mulb[m], mul2b[m], bigb[m]);
                                uint32_t c1 = mx_pair<1>(wb, mulb[m], mul2b[m], bigb[m]);
                                uint32_t c2 = mx_pair<2>(wb, mulb[m], mul2b[m], bigb[m]);
                                uint32_t c3 = mx_pair<3>(wb, mulb[m], mul2b[m], bigb[m]);
                                k3c_mma_bf16(d[m][sub], a0, c0, a1, c1, b0[0], b1[0]);
                                k3c_mma_bf16(d[m][sub], a2, c2, a3, c3, b2[0], b3[0]);
                                if (!exact) {
#pragma unroll
                                    for (int t = 1; t < 3; t++) {
                                        k3c_mma_bf16(d[m][sub], a0, c0, a1, c1, b0[t], b1[t]);
                                        k3c_mma_bf16(d[m][sub], a2, c2, a3, c3, b2[t], b3[t]);
                                    }
                                }
                            }
                        }
                    } else {
                        float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
                        if (ok) {
                            x0 = __ldg((const float4 *)(xg + (size_t)c * 8));
                            x1 = __ldg((const float4 *)(xg + (size_t)c * 8) + 1);
                        }
                        uint32_t b0[3], b1[3], b2[3], b3[3];
                        bool exact = __all_sync(0xffffffffu, k3c_bf16_exact8(x0, x1));
                        if (exact) {
                            b0[0] = k3c_pack_hi16(x0.x, x0.y);
                            b1[0] = k3c_pack_hi16(x0.z, x0.w);
                            b2[0] = k3c_pack_hi16(x1.x, x1.y);
                            b3[0] = k3c_pack_hi16(x1.z, x1.w);
                        } else {
                            k3c_split3(x0.x, x0.y, b0);
                            k3c_split3(x0.z, x0.w, b1);
                            k3c_split3(x1.x, x1.y, b2);
                            k3c_split3(x1.z, x1.w, b3);
                        }
#pragma unroll
                        for (int m = 0; m < NM; m++) {
                            const uint4 A = va[m], B = vb[m];
                            k3c_mma_bf16(d[m][0], A.x, B.x, A.y, B.y, b0[0], b1[0]);
                            k3c_mma_bf16(d[m][0], A.z, B.z, A.w, B.w, b2[0], b3[0]);
                            if (!exact) {
#pragma unroll
                                for (int t = 1; t < 3; t++) {
                                    k3c_mma_bf16(d[m][0], A.x, B.x, A.y, B.y, b0[t], b1[t]);
                                    k3c_mma_bf16(d[m][0], A.z, B.z, A.w, B.w, b2[t], b3[t]);
                                }
                            }
                        }
                    }
#pragma unroll
                    for (int m = 0; m < NM; m++)
#pragma unroll
                        for (int jj = 0; jj < CH; jj++)
#pragma unroll
                            for (int i = 0; i < 4; i++) acc[m][i] += d[m][jj][i];
                    __syncwarp(); /* every lane is done with this slot before a later step's copy lands in it */
                }
            }
            if (wpr > 1) {
#pragma unroll
                for (int m = 0; m < NM; m++)
#pragma unroll
                    for (int i = 0; i < 4; i++) part[warp][m][i][lane] = acc[m][i];
                __syncthreads();
                if (kw == 0) {
#pragma unroll
                    for (int m = 0; m < NM; m++)
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            float s = 0.0f;
                            for (int j = 0; j < wpr; j++) s += part[warp + j][m][i][lane];
                            acc[m][i] = s;
                        }
                }
            }
            /* acc[m]: (row g, column 2q), (row g, 2q+1), (row g+8, 2q), (row g+8, 2q+1); column = pair t0 + col */
            if (kw == 0 && row0 < R) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int row = row0 + g + (i >> 1) * 8, col = t0 + 2 * q + (i & 1);
                    if (row < R && col < n) {
                        float v;
                        if (UP) v = rnd(k3c_dev_gated_act(act.kind, act.beta, act.beta_lin, rnd(acc[0][i], round),
                                                          rnd(acc[NM - 1][i], round)), round);
                        else v = rnd(acc[0][i], round);
                        out[(size_t)plist[col] * R + row] = v;
                    }
                }
            }
            if (wpr > 1) __syncthreads();
        }
    }
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

/* Warps per band: the leaders (distinct experts) are not known on the host; estimate min(pairs, experts)
 * and spread bands x leaders evenly over the resident blocks (as gemm.cu's plan). */
static int moe_wpr(int bands, int leaders, int steps, int cap) {
    int best_wpr = 1;
    double best = -1.0;
    for (int wpr = 1; wpr <= MOE_WARPS; wpr *= 2) {
        if (wpr > 1 && steps < 2 * wpr) break; /* at least two steps per warp: a pipeline, not a prologue */
        int groups = MOE_WARPS / wpr;
        long long items = (long long)((bands + groups - 1) / groups) * leaders;
        double eff;
        if (items <= cap) {
            eff = (double)items * MOE_WARPS / (16.0 * sm_count());
            if (eff > 1.0) eff = 1.0;
        } else {
            long long waves = (items + cap - 1) / cap;
            eff = (double)items / ((double)waves * cap);
        }
        if (eff > best + 0.02) {
            best = eff;
            best_wpr = wpr;
        }
    }
    return best_wpr;
}

template <bool MX, bool UP, int S>
static int moe_launch(const k3c_cuda_expert *experts, int num_experts, int K, int R, const float *x, int x_by_token,
                      const int *idx, int npairs, int k, k3c_cuda_act act, int round, float *out, cudaStream_t s) {
    static int occ, occ_smem, smem_set;
    auto kernel = moe_mma_kernel<MX, UP, S>;
    constexpr size_t ring = (size_t)MOE_WARPS * S * moe_stage<UP ? 2 : 1>::bytes;
    /* plist window: every pair when they are few, else 2048 per window (8 KB); a multiple of 4 so the ring
     * starts 16-byte aligned, and >= 32 so one ballot always fits */
    int plist_cap = npairs < 2048 ? (npairs + 3) & ~3 : 2048;
    if (plist_cap < 32) plist_cap = 32;
    size_t smem = (size_t)plist_cap * sizeof(int) + ring;
    if ((int)smem > smem_set) {
        K3C_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = (int)smem;
    }
    /* blocks per SM at this launch's shared memory (the plist window grows with the step's pairs up to 8 KB,
     * which can take gate/up from 2 blocks per SM to 1); asked again only when the size changes */
    if ((int)smem != occ_smem) {
        int b = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, MOE_WARPS * 32, smem) != cudaSuccess || b < 1)
            b = 1;
        occ = b;
        occ_smem = (int)smem;
    }
    int bands = (R + 15) / 16, nchunk = MX ? K >> 5 : K >> 3, steps = (nchunk + 3) >> 2;
    int leaders = npairs < num_experts ? npairs : num_experts;
    int wpr = moe_wpr(bands, leaders, steps, occ * sm_count());
    int groups = MOE_WARPS / wpr;
    dim3 grid((bands + groups - 1) / groups, npairs);
    kernel<<<grid, MOE_WARPS * 32, smem, s>>>(experts, num_experts, K, R, x, x_by_token, idx, npairs, k, act, round,
                                              out, wpr, plist_cap);
    return K3C_OK;
}

/* out[t, r] = sum_j weight[t, j] * part[t*k + j, r], j in order; invalid experts contribute nothing. */
__global__ void moe_combine_kernel(const float *__restrict__ part, const float *__restrict__ weight,
                                   const int *__restrict__ idx, int num_experts, int k, int Out, int T, int round,
                                   float *out) {
    size_t n = (size_t)T * Out;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / Out), r = (int)(i % Out);
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            int p = t * k + j, e = idx[p];
            if (e >= 0 && e < num_experts) s = fmaf(weight[p], part[(size_t)p * Out + r], s);
        }
        out[i] = rnd(s, round);
    }
}

static int check_dims(int mxfp4, int a, const char *what) {
    int q = mxfp4 ? 32 : 8;
    if (a <= 0 || a % q) return k3c_errorf("moe experts: %s = %d must be a positive multiple of %d", what, a, q);
    return K3C_OK;
}

extern "C" int k3c_cuda_moe_gate_up(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int In, int F,
                                    const float *x, int T, const int *idx, int k, k3c_cuda_act act, int round_bf16,
                                    float *h, cudaStream_t stream) {
    K3C_TRY(check_dims(mxfp4, In, "input width"));
    if (F <= 0) return k3c_errorf("moe experts: intermediate width %d", F);
    if (T * k == 0) return K3C_OK;
    if (mxfp4) K3C_TRY((moe_launch<true, true, 6>(experts, num_experts, In, F, x, 1, idx, T * k, k, act, round_bf16, h, stream)));
    else K3C_TRY((moe_launch<false, true, 6>(experts, num_experts, In, F, x, 1, idx, T * k, k, act, round_bf16, h, stream)));
    K3C_CUDA_LAUNCHED("moe_gate_up");
    return K3C_OK;
}

extern "C" int k3c_cuda_moe_down(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int F, int Out,
                                 const float *h, int pairs, const int *idx, int round_bf16, float *part,
                                 cudaStream_t stream) {
    K3C_TRY(check_dims(mxfp4, F, "intermediate width"));
    if (Out <= 0) return k3c_errorf("moe experts: output width %d", Out);
    if (pairs == 0) return K3C_OK;
    k3c_cuda_act none = {1, 0.0f, 0.0f};
    if (mxfp4) K3C_TRY((moe_launch<true, false, 8>(experts, num_experts, F, Out, h, 0, idx, pairs, 1, none, round_bf16, part, stream)));
    else K3C_TRY((moe_launch<false, false, 8>(experts, num_experts, F, Out, h, 0, idx, pairs, 1, none, round_bf16, part, stream)));
    K3C_CUDA_LAUNCHED("moe_down");
    return K3C_OK;
}

extern "C" int k3c_cuda_moe_experts(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int In, int F,
                                    int Out, const float *x, int T, const int *idx, const float *weight, int k,
                                    k3c_cuda_act act, int round_bf16, float *h, float *part, float *out,
                                    cudaStream_t stream) {
    K3C_TRY(k3c_cuda_moe_gate_up(experts, num_experts, mxfp4, In, F, x, T, idx, k, act, round_bf16, h, stream));
    K3C_TRY(k3c_cuda_moe_down(experts, num_experts, mxfp4, F, Out, h, T * k, idx, round_bf16, part, stream));
    size_t n = (size_t)T * Out;
    if (n == 0) return K3C_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 2048) blocks = 2048;
    moe_combine_kernel<<<(unsigned)blocks, 256, 0, stream>>>(part, weight, idx, num_experts, k, Out, T, round_bf16, out);
    K3C_CUDA_LAUNCHED("moe_combine");
    return K3C_OK;
}
