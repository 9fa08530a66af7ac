/* Elementwise ops of the stock forward: RMSNorm and the gated activations (SwiGLU, SiTU). f32 in and out;
 * the caller rounds to bf16 where the model stores bf16. */
#include <math.h>

#include "cpu/ops.h"

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

void k3c_gated_act(const k3c_config *c, const float *gate, const float *up, int n, float *out) {
    if (c->hidden_act == K3C_ACT_SITU) {
        /* SiTU (spec §5.1): beta * tanh(g / beta) * sigmoid(g) * lin(u). */
        float beta = c->situ_beta, bl = c->situ_linear_beta;
        for (int i = 0; i < n; i++) {
            float g = gate[i], u = up[i];
            float lin = bl != 0.0f ? bl * tanhf(u / bl) : u;
            out[i] = beta * tanhf(g / beta) * k3c_sigmoidf(g) * lin;
        }
    } else {
        for (int i = 0; i < n; i++) out[i] = gate[i] * k3c_sigmoidf(gate[i]) * up[i];
    }
}
