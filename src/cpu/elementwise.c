/* Elementwise ops of the stock forward: RMSNorm and the gated activations (SwiGLU, SiTU). f32 in and out;
 * the caller rounds to bf16 where the model stores bf16. */
#include <math.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/vec.h"

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
 * sigmoid and tanh are evaluated in double from one exponential (v8d_exp, cpu/vec.h) and rounded to f32
 * once, so each is within an ulp of the exact value in f32 (libm's expf / tanhf per element cost 80% of a
 * prompt's activation time). Every element goes through the same 8-lane code, the last partial group included
 * (copied into a full one), so an element's value does not depend on where it sits in the array: the
 * rows of a batch and of a single decode token get the same bits. */
/* tanh(y): (1 - e) / (1 + e) with e = exp(-2|y|), sign restored; y itself for |y| < 2^-12, where the rest
 * of the series is below half an f32 ulp. */
static inline __attribute__((always_inline)) k3c_v8d act_tanh(k3c_v8d y) {
    const k3c_v8l sign = (k3c_v8l){0} + (int64_t)0x8000000000000000ull;
    k3c_v8d a = (k3c_v8d)((k3c_v8l)y & ~sign);
    k3c_v8d e = v8d_exp(-2.0 * a);
    k3c_v8d t = v8d_select(a < 0x1p-12, a, (1.0 - e) / (1.0 + e));
    return (k3c_v8d)((k3c_v8l)t | ((k3c_v8l)y & sign));
}

static inline __attribute__((always_inline)) k3c_v8f act_sigmoid(k3c_v8f g) {
    k3c_v8d d = __builtin_convertvector(g, k3c_v8d);
    return __builtin_convertvector(1.0 / (1.0 + v8d_exp(-d)), k3c_v8f);
}

static inline __attribute__((always_inline)) k3c_v8f act_tanhf(k3c_v8f y) {
    return __builtin_convertvector(act_tanh(__builtin_convertvector(y, k3c_v8d)), k3c_v8f);
}

/* 8 outputs: SiTU (spec §5.1) beta * tanh(g / beta) * sigmoid(g) * lin(u), else SiLU g * sigmoid(g) * u,
 * in the f32 operation order of the formula. */
static inline __attribute__((always_inline)) k3c_v8f act8(const k3c_config *c, k3c_v8f g, k3c_v8f u) {
    if (c->hidden_act == K3C_ACT_SITU) {
        float beta = c->situ_beta, bl = c->situ_linear_beta;
        k3c_v8f lin = bl != 0.0f ? bl * act_tanhf(u / bl) : u;
        return beta * act_tanhf(g / beta) * act_sigmoid(g) * lin;
    }
    return g * act_sigmoid(g) * u;
}

void k3c_gated_act(const k3c_config *c, const float *gate, const float *up, int n, float *out) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        k3c_v8f g, u;
        memcpy(&g, gate + i, sizeof g);
        memcpy(&u, up + i, sizeof u);
        k3c_v8f y = act8(c, g, u);
        memcpy(out + i, &y, sizeof y);
    }
    if (i < n) {
        k3c_v8f g = {0}, u = {0};
        memcpy(&g, gate + i, (size_t)(n - i) * sizeof(float));
        memcpy(&u, up + i, (size_t)(n - i) * sizeof(float));
        k3c_v8f y = act8(c, g, u);
        memcpy(out + i, &y, (size_t)(n - i) * sizeof(float));
    }
}
