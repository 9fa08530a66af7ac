/* 16-lane f32 vectors for the CPU kernels, written with GCC vector extensions so one source serves every
 * target: AVX-512 makes them one zmm, AVX2 two ymm, plain x86-64 SSE pieces. Private to src/cpu.
 *
 * Every kernel that uses them reduces in a fixed order that depends only on the vector length, never on
 * the thread, tile or batch size (the batch-invariance rule of cpu/matmul.c). a * b + c is contracted into
 * an FMA by GCC (-ffp-contract=fast, the GNU C default) at every site alike. */
#ifndef K3C_CPU_VEC_H
#define K3C_CPU_VEC_H

#include <stdint.h>
#include <string.h>

/* Without AVX-512 GCC warns that passing these by value changes the ABI; every function here is static
 * inline and never crosses an object-file boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float k3c_v16 __attribute__((vector_size(64)));
typedef uint16_t k3c_u16x16 __attribute__((vector_size(32)));
typedef uint32_t k3c_u32x16 __attribute__((vector_size(64)));

static inline k3c_v16 v16_load(const float *p) {
    k3c_v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void v16_store(float *p, k3c_v16 v) { memcpy(p, &v, sizeof v); }
static inline k3c_v16 v16_splat(float s) { return (k3c_v16){0} + s; }
/* 16 bf16 values widened to f32 (exact). */
static inline k3c_v16 v16_load_bf16(const uint16_t *p) {
    k3c_u16x16 h;
    memcpy(&h, p, sizeof h);
    k3c_u32x16 w = __builtin_convertvector(h, k3c_u32x16) << 16;
    k3c_v16 f;
    memcpy(&f, &w, sizeof f);
    return f;
}
/* bf16_round (util/bf16.h) on 16 lanes, bit for bit: nearest-even, NaN kept quiet. */
static inline k3c_v16 v16_bf16_round(k3c_v16 v) {
    k3c_u32x16 u;
    memcpy(&u, &v, sizeof u);
    k3c_u32x16 r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    k3c_u32x16 nan = (k3c_u32x16)((u & 0x7fffffffu) > 0x7f800000u); /* all ones where NaN */
    r = (r & ~nan) | (((u >> 16 | 0x40u) << 16) & nan);
    memcpy(&v, &r, sizeof v);
    return v;
}

/* Lane sum as a fixed tree: halves added pairwise (8, 4, 2, 1). */
static inline float v16_sum(k3c_v16 v) {
    float a[16];
    memcpy(a, &v, sizeof a);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) a[i] += a[i + w];
    return a[0];
}

#endif
