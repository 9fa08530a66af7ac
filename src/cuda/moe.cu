/* Routed experts: MXFP4 or bf16 matvecs over the selected (token, slot) pairs. */
#include "cuda/moe.h"

#include <cuda_fp16.h>

#include "cuda/check.h"
#include "cuda/common.cuh"

#define MOE_WARPS 8
#define MOE_RPW 2

/* The input vector is staged in shared memory with 4 floats of padding after every 32, so that the float4
 * reads of a warp whose lanes own consecutive 32-element (MXFP4) or 8-element (bf16) runs fall in distinct
 * banks (4 wavefronts per 512 bytes, the minimum). */
__device__ __forceinline__ int pad_idx(int i) { return i + ((i >> 5) << 2); }
static size_t pad_floats(int n) { return (size_t)n + (size_t)((n + 31) / 32) * 4; }

__device__ void stage_vector(float *sx, const float *__restrict__ x, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) sx[pad_idx(i)] = x[i];
    __syncthreads();
}

__device__ __forceinline__ float rnd(float x, int round) { return round ? k3c_dev_bf16(k3c_dev_to_bf16(x)) : x; }

/* 2^(e - 127) for an E8M0 byte (e = 0: 2^-127, a subnormal; 255 never reaches here: the loader rejects it). */
__device__ __forceinline__ float e8m0(uint32_t e) { return e ? __uint_as_float(e << 23) : 0x1p-127f; }

/* Dot of one 32-element MXFP4 group (16 packed bytes) with xs[0..31] (padded staging, one run).
 * Nibble i of each 32-bit word (elements 8j+i) pairs with nibble i+4 (16 bits up): shifted so that their
 * sign bits land on bits 15 and 31, with the 3 magnitude bits moved to bits 9..11 / 25..27 they form a
 * half2 whose values are e2m1 * 2^-14 (code 1 becomes the fp16 subnormal 2^-15, exactly 0.5 * 2^-14). */
__device__ __forceinline__ float mxfp4_group_dot(uint4 p, const float *xs) {
    uint32_t words[4] = {p.x, p.y, p.z, p.w};
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float4 a = *(const float4 *)(xs + 8 * j), b = *(const float4 *)(xs + 8 * j + 4);
        float xa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t t = words[j] << (12 - 4 * i);
            uint32_t hb = (t & 0x80008000u) | ((t >> 3) & 0x0e000e00u);
            __half2 h = *reinterpret_cast<__half2 *>(&hb);
            float2 f = __half22float2(h);
            s = fmaf(f.x, xa[i], s);
            s = fmaf(f.y, xb[i], s);
        }
    }
    return s * 16384.0f;
}

/* Dot of 8 bf16 weights with xs[0..7]. */
__device__ __forceinline__ float bf16_chunk_dot(uint4 w, const float *xs) {
    float4 a = *(const float4 *)xs, b = *(const float4 *)(xs + 4);
    float s = 0.0f;
    s = fmaf(k3c_dev_bf16_lo(w.x), a.x, s);
    s = fmaf(k3c_dev_bf16_hi(w.x), a.y, s);
    s = fmaf(k3c_dev_bf16_lo(w.y), a.z, s);
    s = fmaf(k3c_dev_bf16_hi(w.y), a.w, s);
    s = fmaf(k3c_dev_bf16_lo(w.z), b.x, s);
    s = fmaf(k3c_dev_bf16_hi(w.z), b.y, s);
    s = fmaf(k3c_dev_bf16_lo(w.w), b.z, s);
    s = fmaf(k3c_dev_bf16_hi(w.w), b.w, s);
    return s;
}

/* Row r of a matrix dotted with the staged vector, this lane's share (chunks lane, lane+32, ...). A chunk is
 * 16 bytes: 32 MXFP4 elements (one scale group) or 8 bf16 elements. */
template <bool MX>
__device__ __forceinline__ float row_dot_lane(const uint8_t *packed, const uint8_t *scale, const uint16_t *w, int row,
                                              int cols, const float *sx, int lane) {
    float acc = 0.0f;
    if (MX) {
        int chunks = cols >> 5;
        const uint8_t *pr = packed + (size_t)row * (cols >> 1), *sr = scale + (size_t)row * chunks;
        for (int c = lane; c < chunks; c += 32) {
            uint4 p = k3c_ld_stream16(pr + (size_t)c * 16);
            float sc = e8m0(__ldg(sr + c));
            acc = fmaf(mxfp4_group_dot(p, sx + 36 * c), sc, acc);
        }
    } else {
        int chunks = cols >> 3;
        const uint16_t *wr = w + (size_t)row * cols;
        for (int c = lane; c < chunks; c += 32) {
            uint4 v = k3c_ld_stream16(wr + (size_t)c * 8);
            acc += bf16_chunk_dot(v, sx + pad_idx(8 * c));
        }
    }
    return acc;
}

/* grid (ceil(F / rows per block), pairs): the block stages x of its pair's token, each warp computes MOE_RPW
 * rows of gate and up and writes act(gate, up). */
template <bool MX>
__global__ void __launch_bounds__(MOE_WARPS * 32)
moe_gate_up_kernel(const k3c_cuda_expert *__restrict__ experts, int num_experts, int In, int F,
                   const float *__restrict__ x, const int *__restrict__ idx, int k, k3c_cuda_act act, int round, float *h) {
    extern __shared__ float sx[];
    int p = blockIdx.y, t = p / k;
    int e = idx[p];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int row0 = (blockIdx.x * MOE_WARPS + warp) * MOE_RPW;
    float *hp = h + (size_t)p * F;
    if (e < 0 || e >= num_experts) {
        for (int r = 0; r < MOE_RPW; r++)
            if (lane == 0 && row0 + r < F) hp[row0 + r] = 0.0f;
        return;
    }
    const k3c_cuda_expert ex = experts[e];
    stage_vector(sx, x + (size_t)t * In, In);
    if (row0 >= F) return;
    /* All 2 * MOE_RPW rows (gate and up) advance together so that each lane has 2 * MOE_RPW 16-byte loads in
     * flight per step; rows past F re-read the last row and are not stored. */
    const uint8_t *gp[MOE_RPW], *up[MOE_RPW], *gs[MOE_RPW], *us[MOE_RPW];
    const uint16_t *gw[MOE_RPW], *uw[MOE_RPW];
#pragma unroll
    for (int r = 0; r < MOE_RPW; r++) {
        size_t row = (size_t)min(row0 + r, F - 1);
        if (MX) {
            gp[r] = ex.gate_packed + row * (In >> 1);
            up[r] = ex.up_packed + row * (In >> 1);
            gs[r] = ex.gate_scale + row * (In >> 5);
            us[r] = ex.up_scale + row * (In >> 5);
        } else {
            gw[r] = ex.gate_w + row * In;
            uw[r] = ex.up_w + row * In;
        }
    }
    float ga[MOE_RPW], ua[MOE_RPW];
#pragma unroll
    for (int r = 0; r < MOE_RPW; r++) ga[r] = ua[r] = 0.0f;
    if (MX) {
        int chunks = In >> 5;
        for (int c = lane; c < chunks; c += 32) {
            uint4 pg[MOE_RPW], pu[MOE_RPW];
            float sg[MOE_RPW], su[MOE_RPW];
#pragma unroll
            for (int r = 0; r < MOE_RPW; r++) {
                pg[r] = k3c_ld_stream16(gp[r] + (size_t)c * 16);
                pu[r] = k3c_ld_stream16(up[r] + (size_t)c * 16);
                sg[r] = e8m0(__ldg(gs[r] + c));
                su[r] = e8m0(__ldg(us[r] + c));
            }
#pragma unroll
            for (int r = 0; r < MOE_RPW; r++) {
                ga[r] = fmaf(mxfp4_group_dot(pg[r], sx + 36 * c), sg[r], ga[r]);
                ua[r] = fmaf(mxfp4_group_dot(pu[r], sx + 36 * c), su[r], ua[r]);
            }
        }
    } else {
        int chunks = In >> 3;
        for (int c = lane; c < chunks; c += 32) {
            uint4 vg[MOE_RPW], vu[MOE_RPW];
#pragma unroll
            for (int r = 0; r < MOE_RPW; r++) {
                vg[r] = k3c_ld_stream16(gw[r] + (size_t)c * 8);
                vu[r] = k3c_ld_stream16(uw[r] + (size_t)c * 8);
            }
#pragma unroll
            for (int r = 0; r < MOE_RPW; r++) {
                ga[r] += bf16_chunk_dot(vg[r], sx + pad_idx(8 * c));
                ua[r] += bf16_chunk_dot(vu[r], sx + pad_idx(8 * c));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MOE_RPW; r++) {
        float g = rnd(k3c_warp_sum(ga[r]), round), u = rnd(k3c_warp_sum(ua[r]), round);
        if (lane == 0 && row0 + r < F) hp[row0 + r] = rnd(k3c_dev_gated_act(act.kind, act.beta, act.beta_lin, g, u), round);
    }
}

template <bool MX>
__global__ void __launch_bounds__(MOE_WARPS * 32)
moe_down_kernel(const k3c_cuda_expert *__restrict__ experts, int num_experts, int F, int Out,
                const float *__restrict__ h, const int *__restrict__ idx, int round, float *part) {
    extern __shared__ float sx[];
    int p = blockIdx.y;
    int e = idx[p];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int row0 = (blockIdx.x * MOE_WARPS + warp) * MOE_RPW;
    float *pp = part + (size_t)p * Out;
    if (e < 0 || e >= num_experts) {
        for (int r = 0; r < MOE_RPW; r++)
            if (lane == 0 && row0 + r < Out) pp[row0 + r] = 0.0f;
        return;
    }
    const k3c_cuda_expert ex = experts[e];
    stage_vector(sx, h + (size_t)p * F, F);
#pragma unroll
    for (int r = 0; r < MOE_RPW; r++) {
        int row = row0 + r;
        if (row >= Out) break;
        float d = k3c_warp_sum(row_dot_lane<MX>(ex.down_packed, ex.down_scale, ex.down_w, row, F, sx, lane));
        if (lane == 0) pp[row] = rnd(d, round);
    }
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

template <typename K>
static int smem_opt_in(K kernel, size_t bytes) {
    if (bytes > 48 * 1024) K3C_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                            (int)bytes));
    return K3C_OK;
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
    size_t smem = pad_floats(In) * sizeof(float);
    dim3 grid((F + MOE_WARPS * MOE_RPW - 1) / (MOE_WARPS * MOE_RPW), T * k);
    if (mxfp4) {
        K3C_TRY(smem_opt_in(moe_gate_up_kernel<true>, smem));
        moe_gate_up_kernel<true><<<grid, MOE_WARPS * 32, smem, stream>>>(experts, num_experts, In, F, x, idx, k, act, round_bf16, h);
    } else {
        K3C_TRY(smem_opt_in(moe_gate_up_kernel<false>, smem));
        moe_gate_up_kernel<false><<<grid, MOE_WARPS * 32, smem, stream>>>(experts, num_experts, In, F, x, idx, k, act,
                                                                         round_bf16, h);
    }
    K3C_CUDA_LAUNCHED("moe_gate_up");
    return K3C_OK;
}

extern "C" int k3c_cuda_moe_down(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int F, int Out,
                                 const float *h, int pairs, const int *idx, int round_bf16, float *part,
                                 cudaStream_t stream) {
    K3C_TRY(check_dims(mxfp4, F, "intermediate width"));
    if (Out <= 0) return k3c_errorf("moe experts: output width %d", Out);
    if (pairs == 0) return K3C_OK;
    size_t smem = pad_floats(F) * sizeof(float);
    dim3 grid((Out + MOE_WARPS * MOE_RPW - 1) / (MOE_WARPS * MOE_RPW), pairs);
    if (mxfp4) {
        K3C_TRY(smem_opt_in(moe_down_kernel<true>, smem));
        moe_down_kernel<true><<<grid, MOE_WARPS * 32, smem, stream>>>(experts, num_experts, F, Out, h, idx, round_bf16, part);
    } else {
        K3C_TRY(smem_opt_in(moe_down_kernel<false>, smem));
        moe_down_kernel<false><<<grid, MOE_WARPS * 32, smem, stream>>>(experts, num_experts, F, Out, h, idx, round_bf16, part);
    }
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
