/* MXFP4 weights on the GPU: E2M1 codes and E8M0 scales into bf16 pairs for the mma (the routed-experts
 * kernels of cuda/moe.cu and cuda/moe_pair.cu). Device code only. */
#ifndef K3C_CUDA_MXFP4_CUH
#define K3C_CUDA_MXFP4_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* MXFP4 -> bf16 pairs. The dequant is most of this kernel's instructions at decode (docs/kernels.md: ~550
 * warp instructions per 2 KB step at one row, issue-bound at 0.41 of copy bandwidth), so the packed weights
 * live on the GPU in a layout of their own, made once when they are written (k3c_cuda_mxfp4_repack, cuda/moe.cu):
 * each 32-bit word keeps its 8 E2M1 codes (elements 8j .. 8j + 7 of a row), with their bits moved so that the
 * four bf16 pairs (elements i and i + 4, i = 0..3) come out with 1, 2, 2 and 3 integer ops (8 a word, was
 * 17 with the bf16x2 multiplies). A pair's bf16 bits: in each half, the sign on bit 15 and the magnitude
 * e1 e0 m on bits 8..6 (the exponent's low bits and the mantissa's top bit), i.e. the set
 * P = {6, 7, 8, 15, 22, 23, 24, 31} of the word, reading e2m1 * 2^-126 (code 1 as the subnormal 2^-127);
 * one bf16x2 multiply by 2^(E - 1) makes it e2m1 * 2^(E - 127), exactly (at most 2 significant bits).
 * Pair 0 is stored at P (w & M), pair 1 at P + 3 (rotate right 3, & M), pair 2 at P + 6 (rotate right 6,
 * & M), pair 3 on the 8 bits left, {0, 1, 3, 4, 16, 17, 19, 20}, placed so that one integer multiply by
 * 4 + 128 + 4096 (shifted copies by 2, 7 and 12 that never overlap: no carries) lands each on its bit of P.
 * The pairs are bitwise the ones the standard layout's 17-op form produced (checked over random words by
 * the GPU test and the emulator). mul: 2^(E-1) as bf16x2 when E <= 128, else 2^127, and then
 * mul2 = 2^(E-128) (1 when E <= 128); a warp with no E > 128 in a step (real weights: E > 128 means
 * |w| > 12) skips the second multiply. */
#define MX_P 0x81c081c0u
__device__ __forceinline__ void mx_word(uint32_t w, uint32_t mul, uint32_t (&b)[4]) {
    b[0] = bf16x2_mul(w & MX_P, mul);
    b[1] = bf16x2_mul(__funnelshift_r(w, w, 3) & MX_P, mul);
    b[2] = bf16x2_mul(__funnelshift_r(w, w, 6) & MX_P, mul);
    b[3] = bf16x2_mul(((w & 0x001b001bu) * 4228u) & MX_P, mul);
}

/* bf16x2 multipliers of an E8M0 scale byte e, as in the comment above: mx_mul = 2^(min(e, 128) - 1) in both
 * halves (the exponent field min(e, 128) + 126, placed in both halves by one multiply), and mx_mul2 =
 * 2^(e - 128), needed only when e > 128 (so computed only on that path). */
__device__ __forceinline__ uint32_t mx_mul(uint32_t e) { return (min(e, 128u) + 126u) * 0x00800080u; }
__device__ __forceinline__ uint32_t mx_mul2(uint32_t e) { return (e > 128u ? e - 1u : 127u) * 0x00800080u; }

#endif
