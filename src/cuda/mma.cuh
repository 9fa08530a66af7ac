/* Tensor-core helpers for the skinny (decode) products of gemm.cu and moe.cu (included by .cu files only).
 *
 * mma.sync m16n8k16 bf16 -> f32: A is 16 weight rows x 16 k, B is 16 k x 8 tokens. Lane l = 4 g + q holds
 * A rows g and g + 8, B column (token) g, and D rows g, g + 8 at token columns 2q, 2q + 1. Because a dot
 * product does not care in which order its k terms come, the kernels hand each lane 16 contiguous bytes of
 * a weight row and give B the activations of exactly those k positions (the same permutation on both
 * sides): every weight byte is loaded once, 16 bytes wide, straight into the A registers.
 *
 * Activations are f32. Split into three bf16 terms x = hi + mid + lo (8 + 8 + 8 significand bits, exact for
 * normal f32), the three products are exact and are summed in f32 by the tensor core, so the result matches
 * an f32 dot product to f32 rounding. When every activation of a step is already a bf16 value (the model's
 * bf16 activations), mid and lo are zero and the kernels skip their mma (a warp vote). */
#ifndef K3C_CUDA_MMA_CUH
#define K3C_CUDA_MMA_CUH

#include <stdint.h>

/* d += A B (m16n8k16, bf16 inputs, f32 accumulation). */
__device__ __forceinline__ void k3c_mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* bf16x2 with `lo` in the low half (the smaller k), round to nearest even. */
__device__ __forceinline__ uint32_t k3c_pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* bf16x2 of two f32 that are already bf16 values (low 16 bits zero): their upper halves, no conversion. */
__device__ __forceinline__ uint32_t k3c_pack_hi16(float lo, float hi) {
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

/* Whether eight activations are all bf16 values (then one mma term is exact). */
__device__ __forceinline__ bool k3c_bf16_exact8(float4 a, float4 b) {
    return ((__float_as_uint(a.x) | __float_as_uint(a.y) | __float_as_uint(a.z) | __float_as_uint(a.w) |
             __float_as_uint(b.x) | __float_as_uint(b.y) | __float_as_uint(b.z) | __float_as_uint(b.w)) & 0xffffu) == 0;
}

/* Three-term split of the pair (x0, x1): t[0] + t[1] + t[2] == (x0, x1) exactly. Returns whether the pair
 * needed more than the first term (some bits below bf16's 8). */
__device__ __forceinline__ bool k3c_split3(float x0, float x1, uint32_t (&t)[3]) {
    t[0] = k3c_pack_bf16x2(x0, x1);
    float r0 = x0 - __uint_as_float(t[0] << 16), r1 = x1 - __uint_as_float(t[0] & 0xffff0000u);
    t[1] = k3c_pack_bf16x2(r0, r1);
    r0 -= __uint_as_float(t[1] << 16);
    r1 -= __uint_as_float(t[1] & 0xffff0000u);
    t[2] = k3c_pack_bf16x2(r0, r1);
    return ((__float_as_uint(x0) | __float_as_uint(x1)) & 0xffffu) != 0;
}

#endif
