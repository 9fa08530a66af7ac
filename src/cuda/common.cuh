/* Device helpers shared by the k3c CUDA kernels, and host helpers for launch plans and limits (included by .cu files
 * only). */
#ifndef K3C_CUDA_COMMON_CUH
#define K3C_CUDA_COMMON_CUH

#include <stdint.h>
#include <stdlib.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include "cuda/stamp.cuh"

/* bf16 -> f32: the bf16 bits are the upper half of the f32. */
__device__ __forceinline__ float k3c_dev_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float k3c_dev_bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float k3c_dev_bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* f32 -> bf16 bits, round to nearest even, NaN kept quiet (as util/bf16.h). */
__device__ __forceinline__ uint16_t k3c_dev_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* FP8 E4M3 (the optional MLA latent cache element): the hardware conversions, round to nearest even,
 * saturating finite values at +-448 (util/fp8.h is the host codec with the same rounding). */
__device__ __forceinline__ uint8_t k3c_dev_to_e4m3(float f) {
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float k3c_dev_e4m3(uint8_t c) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
    return __half2float(__half(h));
}

/* Programmatic dependent launch (PDL). A kernel launched with the programmatic-serialization attribute
 * (k3c_pdl_enabled) may start while the kernel before it in the stream is still finishing, once every block
 * of that kernel has called k3c_pdl_trigger or exited; it must call k3c_pdl_wait before it reads anything an
 * earlier kernel wrote or writes anything an earlier kernel reads (the wait returns when the earlier grid
 * has completed and its writes are visible; immediately in a kernel launched without the attribute). So a
 * weight-streaming kernel can start loading weights, which no kernel of a step writes, during the tail of
 * the kernel before it. The trigger in a kernel only lets a PDL-launched successor start early; it changes
 * nothing for one launched normally. */
__device__ __forceinline__ void k3c_pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void k3c_pdl_wait(void) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
#ifndef K3C_TEST_NOWAIT
    K3C_STAMP_WAITED(); /* K3C_CUDA_PROFILE=3: when the dependency let this block go on (cuda/stamp.cuh) */
#endif
}
/* cp.async of 4 bytes, global -> shared, completing in the background (no register holds the value); a
 * thread's copies are visible to that thread after its cp_async_wait<0>, to others after a barrier too */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait(void) { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* Bring the 128-byte line holding p into L2 (no registers held, nothing returned). */
__device__ __forceinline__ void k3c_prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* A 16-byte streaming load that skips L1: weights are read once per step. */
__device__ __forceinline__ uint4 k3c_ld_stream16(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* A selection key, larger = better: the value's order in the high word (NaN below -inf, -0 as +0), the
 * inverted index in the low word (equal values: the lower index wins), so one unsigned comparison is the
 * total order of the CPU references (cpu/ops.h k3c_route's `better`, runtime/sampler.c's greedy arg-max).
 * The router's top-k sort and the greedy arg-max both use it. */
__device__ __forceinline__ unsigned long long k3c_select_key(float v, int i) {
    unsigned int u = __float_as_uint(v == 0.0f ? 0.0f : v); /* -0 as +0 */
    unsigned int ord = v != v ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)ord << 32) | (0xffffffffu - (unsigned int)i);
}

/* __shfl_xor_sync of a 64-bit value (two 32-bit shuffles), every lane of the warp taking part. */
__device__ __forceinline__ unsigned long long k3c_shfl_xor_u64(unsigned long long v, int m) {
    unsigned int lo = __shfl_xor_sync(0xffffffffu, (unsigned int)v, m);
    unsigned int hi = __shfl_xor_sync(0xffffffffu, (unsigned int)(v >> 32), m);
    return ((unsigned long long)hi << 32) | lo;
}

__device__ __forceinline__ float k3c_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float k3c_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * `red` is shared scratch of 32 floats; the function syncs before reusing it. */
__device__ __forceinline__ float k3c_block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = k3c_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = lane < nw ? red[lane] : 0.0f;
    return k3c_warp_sum(s);
}

__device__ __forceinline__ float k3c_dev_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float k3c_dev_silu(float x) { return x / (1.0f + expf(-x)); }

/* The gated activation act(g) * lin(u) (cpu/ops.h k3c_gated_act): kind 1 SiLU, 2 SiTU. */
__device__ __forceinline__ float k3c_dev_gated_act(int kind, float beta, float beta_lin, float g, float u) {
    if (kind == 2) {
        float a = beta * tanhf(g / beta) * k3c_dev_sigmoid(g);
        float l = beta_lin != 0.0f ? beta_lin * tanhf(u / beta_lin) : u;
        return a * l;
    }
    return k3c_dev_silu(g) * u;
}

/* The residual stream's update as the stock path forms it (two k3c_cuda_add launches): v = a1, or a1 + a2
 * rounded when has_a2; then p + v rounded when has_p. add_rmsnorm_kernel (both of its paths) and the AttnRes
 * Mix's pending source (attnres.cu) form it here, so the executor's fused launches store the bits of the
 * separate adds. */
__device__ __forceinline__ float k3c_dev_residual(float a1, bool has_a2, float a2, bool has_p, float p, int round) {
    float v = a1;
    if (has_a2) {
        const float s = v + a2;
        v = round ? k3c_dev_bf16(k3c_dev_to_bf16(s)) : s;
    }
    if (has_p) {
        const float s = p + v;
        v = round ? k3c_dev_bf16(k3c_dev_to_bf16(s)) : s;
    }
    return v;
}

/* k3c_cuda_gated_act's elements first, first + step, ... of its T x n outputs (out dense [T, n], out[i] from
 * gate and up of row i / n, column i % n; rounded to bf16 when round): the per-element work of
 * gated_act_kernel and of the router's fused launch (router.cu route_act_kernel), one definition so both
 * store the same bits. Each element is read and written by one thread, so out may be gate (or up) when
 * that stride is n. */
__device__ __forceinline__ void k3c_dev_gated_act_span(int kind, float beta, float beta_lin, const float *gate, int gs,
                                                       const float *up, int us, int T, int n, int round, float *out,
                                                       size_t first, size_t step) {
    size_t total = (size_t)T * n;
    for (size_t i = first; i < total; i += step) {
        int t = (int)(i / n), c = (int)(i % n);
        float v = k3c_dev_gated_act(kind, beta, beta_lin, gate[(size_t)t * gs + c], up[(size_t)t * us + c]);
        out[i] = round ? k3c_dev_bf16(k3c_dev_to_bf16(v)) : v;
    }
}

/* Host side: whether launches that support it use PDL: on unless K3C_PDL=0. An A/B (H200, 2026-11-30;
 * docs/kernels.md) measured it: bf16 GEMVs back to back 0.56 -> 0.69 of copy bandwidth at 4096 x 4096,
 * kimi-linear-48b b=1 specialized step 4.85 -> 4.53 ms. It was opt-in while two GPU runs with it failed one
 * test each (one a routing near-tie, now counted as a tie); then the whole GPU script from a fresh
 * copy with K3C_PDL=1 passed 36 of 36 with clean sanitizers, so it is the default. */
static inline int k3c_pdl_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("K3C_PDL");
        on = !(v && v[0] == '0');
    }
    return on;
}

/* Host side: the device's multiprocessor count, asked once per translation unit (132 on an H200; 132 if the
 * query fails, so a launch plan never divides by zero). */
static inline int k3c_cuda_sm_count(void) {
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

/* Host side, for cuda/kernel_limits.h's per-file parts: raises kernel fn's dynamic shared memory limit on
 * the current device to `bytes` (0: no bound of its own, for kernels whose launch size follows the model's
 * dims), at most what a block may opt in to beside fn's static shared memory (a launch asking more fails
 * there, with the launcher's own message about the dims). */
static inline cudaError_t k3c_cuda_smem_limit(const void *fn, size_t bytes) {
    int dev = 0, optin = 0;
    cudaFuncAttributes a;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, fn);
    if (e != cudaSuccess) return e;
    size_t avail = (size_t)optin > a.sharedSizeBytes ? (size_t)optin - a.sharedSizeBytes : 0;
    if (!bytes || bytes > avail) bytes = avail;
    return cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

#endif
