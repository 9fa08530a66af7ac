/* Elementwise ops of the stock forward: RMSNorm and the gated activations (SwiGLU, SiTU). f32 in and out;
 * the caller rounds to bf16 where the model stores bf16. */
#include <math.h>
#include <string.h>

#include "cpu/ops.h"

/* Without AVX-512 GCC warns that passing these by value changes the ABI; all are static inline here. */
#pragma GCC diagnostic ignored "-Wpsabi"

void k3c_rmsnorm(const float *x, const float *w, int n, float eps, float *y) {
    /* Four partial sums: shorter dependency chains and a smaller rounding error than one running sum. */
    float s[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) s[k] += x[i + k] * x[i + k];
    for (; i < n; i++) s[0] += x[i] * x[i];
    float r = 1.0f / sqrtf(((s[0] + s[1]) + (s[2] + s[3])) / (float)n + eps);
    for (i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* ---- the gated activations, 8 elements at a time in double ----
 * sigmoid and tanh are evaluated in double from one exponential (below) and rounded to f32 once, so each
 * is within an ulp of the exact value in f32 (libm's expf / tanhf per element cost 80% of a prompt's
 * activation time). Every element goes through the same 8-lane code, the last partial group included
 * (copied into a full one), so an element's value does not depend on where it sits in the array: the
 * rows of a batch and of a single decode token get the same bits. */
typedef double act_v8d __attribute__((vector_size(64)));
typedef float act_v8f __attribute__((vector_size(32)));
typedef int64_t act_v8l __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) act_v8d act_select(act_v8l m, act_v8d a, act_v8d b) { /* m ? a : b, lane by lane */
    return (act_v8d)(((act_v8l)a & m) | ((act_v8l)b & ~m));
}

/* exp(x), x clamped to [-700, 700] (NaN stays NaN), relative error below 1e-15: x = k ln2 + r with
 * |r| <= ln2 / 2 (ln2 in two parts), exp(r) by its Taylor series to r^12, times 2^k from the exponent bits. */
static inline __attribute__((always_inline)) act_v8d act_exp(act_v8d x) {
    const act_v8d lo = (act_v8d){0} - 700.0, hi = (act_v8d){0} + 700.0;
    x = act_select(x < lo, lo, x);
    x = act_select(x > hi, hi, x);
    const double shift = 0x1.8p52;
    act_v8d k = (x * 0x1.71547652b82fep0 + shift) - shift; /* round(x / ln2) */
    act_v8d r = x - k * 0x1.62e42fee00000p-1;
    r = r - k * 0x1.a39ef35793c76p-33;
    act_v8d p = (act_v8d){0} + 1.0 / 479001600.0;
    const double c[12] = {1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0,
                          1.0 / 120.0,      1.0 / 24.0,      1.0 / 6.0,      0.5,            1.0,          1.0};
    for (int i = 0; i < 12; i++) p = p * r + c[i];
    act_v8l e = (__builtin_convertvector(k, act_v8l) + 1023) << 52;
    return p * (act_v8d)e;
}

/* tanh(y): (1 - e) / (1 + e) with e = exp(-2|y|), sign restored; y itself for |y| < 2^-12, where the rest
 * of the series is below half an f32 ulp. */
static inline __attribute__((always_inline)) act_v8d act_tanh(act_v8d y) {
    const act_v8l sign = (act_v8l){0} + (int64_t)0x8000000000000000ull;
    act_v8d a = (act_v8d)((act_v8l)y & ~sign);
    act_v8d e = act_exp(-2.0 * a);
    act_v8d t = act_select(a < 0x1p-12, a, (1.0 - e) / (1.0 + e));
    return (act_v8d)((act_v8l)t | ((act_v8l)y & sign));
}

static inline __attribute__((always_inline)) act_v8f act_sigmoid(act_v8f g) {
    act_v8d d = __builtin_convertvector(g, act_v8d);
    return __builtin_convertvector(1.0 / (1.0 + act_exp(-d)), act_v8f);
}

static inline __attribute__((always_inline)) act_v8f act_tanhf(act_v8f y) {
    return __builtin_convertvector(act_tanh(__builtin_convertvector(y, act_v8d)), act_v8f);
}

/* 8 outputs: SiTU (spec §5.1) beta * tanh(g / beta) * sigmoid(g) * lin(u), else SiLU g * sigmoid(g) * u,
 * in the f32 operation order of the formula. */
static inline __attribute__((always_inline)) act_v8f act8(const k3c_config *c, act_v8f g, act_v8f u) {
    if (c->hidden_act == K3C_ACT_SITU) {
        float beta = c->situ_beta, bl = c->situ_linear_beta;
        act_v8f lin = bl != 0.0f ? bl * act_tanhf(u / bl) : u;
        return beta * act_tanhf(g / beta) * act_sigmoid(g) * lin;
    }
    return g * act_sigmoid(g) * u;
}

void k3c_gated_act(const k3c_config *c, const float *gate, const float *up, int n, float *out) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        act_v8f g, u;
        memcpy(&g, gate + i, sizeof g);
        memcpy(&u, up + i, sizeof u);
        act_v8f y = act8(c, g, u);
        memcpy(out + i, &y, sizeof y);
    }
    if (i < n) {
        act_v8f g = {0}, u = {0};
        memcpy(&g, gate + i, (size_t)(n - i) * sizeof(float));
        memcpy(&u, up + i, (size_t)(n - i) * sizeof(float));
        act_v8f y = act8(c, g, u);
        memcpy(out + i, &y, (size_t)(n - i) * sizeof(float));
    }
}
