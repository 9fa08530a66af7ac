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

/* ---- exp in double, 8 lanes ----
 * exp(x), x clamped to [-700, 700] (NaN stays NaN), relative error below 1e-15: x = k ln2 + r with
 * |r| <= ln2 / 2 (ln2 in two parts), exp(r) by its Taylor series to r^12, times 2^k from the exponent bits.
 * Rounded to f32 it is within half an ulp of exp but for rare ties (libm's expf is the same to an ulp, at
 * several times the cost per element). */
typedef double k3c_v8d __attribute__((vector_size(64)));
typedef int64_t k3c_v8l __attribute__((vector_size(64)));
typedef float k3c_v8f __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) k3c_v8d v8d_select(k3c_v8l m, k3c_v8d a, k3c_v8d b) {
    return (k3c_v8d)(((k3c_v8l)a & m) | ((k3c_v8l)b & ~m)); /* m ? a : b, lane by lane */
}

static inline __attribute__((always_inline)) k3c_v8d v8d_exp(k3c_v8d x) {
    const k3c_v8d lo = (k3c_v8d){0} - 700.0, hi = (k3c_v8d){0} + 700.0;
    x = v8d_select(x < lo, lo, x);
    x = v8d_select(x > hi, hi, x);
    const double shift = 0x1.8p52;
    k3c_v8d k = (x * 0x1.71547652b82fep0 + shift) - shift; /* round(x / ln2) */
    k3c_v8d r = x - k * 0x1.62e42fee00000p-1;
    r = r - k * 0x1.a39ef35793c76p-33;
    k3c_v8d p = (k3c_v8d){0} + 1.0 / 479001600.0;
    const double c[12] = {1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0,
                          1.0 / 120.0,      1.0 / 24.0,      1.0 / 6.0,      0.5,            1.0,          1.0};
    for (int i = 0; i < 12; i++) p = p * r + c[i];
    k3c_v8l e = (__builtin_convertvector(k, k3c_v8l) + 1023) << 52;
    return p * (k3c_v8d)e;
}

/* exp of 16 f32 lanes through v8d_exp, rounded once. */
static inline __attribute__((always_inline)) k3c_v16 v16_exp(k3c_v16 x) {
    float f[16];
    memcpy(f, &x, sizeof f);
    k3c_v8f a, b;
    memcpy(&a, f, sizeof a);
    memcpy(&b, f + 8, sizeof b);
    a = __builtin_convertvector(v8d_exp(__builtin_convertvector(a, k3c_v8d)), k3c_v8f);
    b = __builtin_convertvector(v8d_exp(__builtin_convertvector(b, k3c_v8d)), k3c_v8f);
    memcpy(f, &a, sizeof a);
    memcpy(f + 8, &b, sizeof b);
    memcpy(&x, f, sizeof x);
    return x;
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
