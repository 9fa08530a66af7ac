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

/* v16_sum of a[0..16) as one vector (lane j: v16_sum(a[j])), bit for bit: the same tree, lanes i and i + w
 * added for w = 8, 4, 2, 1, run on 16 vectors at once by shuffles that pair exactly the same lanes. */
static inline k3c_v16 v16_sum16(const k3c_v16 a[16]) {
    typedef int32_t idx16 __attribute__((vector_size(64)));
    const idx16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const idx16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const idx16 lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const idx16 hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const idx16 lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const idx16 hi2 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    const idx16 lo1 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const idx16 hi1 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    k3c_v16 u[8], w[4], z[2];
    for (int m = 0; m < 8; m++) /* [a[2m] lanes i + (i + 8) | a[2m + 1] likewise] */
        u[m] = __builtin_shuffle(a[2 * m], a[2 * m + 1], lo8) + __builtin_shuffle(a[2 * m], a[2 * m + 1], hi8);
    for (int m = 0; m < 4; m++) /* 4 lanes each of a[4m .. 4m + 3]: + 4 */
        w[m] = __builtin_shuffle(u[2 * m], u[2 * m + 1], lo4) + __builtin_shuffle(u[2 * m], u[2 * m + 1], hi4);
    for (int m = 0; m < 2; m++) /* 2 lanes each of a[8m .. 8m + 7]: + 2 */
        z[m] = __builtin_shuffle(w[2 * m], w[2 * m + 1], lo2) + __builtin_shuffle(w[2 * m], w[2 * m + 1], hi2);
    return __builtin_shuffle(z[0], z[1], lo1) + __builtin_shuffle(z[0], z[1], hi1); /* + 1 */
}

#endif
