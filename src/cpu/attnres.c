/* Block Attention Residuals mixing operator (spec §4.2): a softmax over the depth axis of RMS-normalised
 * source logits, applied to the raw sources. */
#include <math.h>

#include "cpu/ops.h"

void k3c_attnres_mix(const float *const *sources, int n, int D, const float *proj, const float *norm, float eps,
                     float *out) {
    if (n <= 0) return;
    float alpha[n]; /* n = completed blocks + 1 (9 for K3) */
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *v = sources[j];
        float ss = 0.0f, dot = 0.0f;
        for (int d = 0; d < D; d++) {
            ss += v[d] * v[d];
            dot += v[d] * norm[d] * proj[d];
        }
        alpha[j] = dot / sqrtf(ss / (float)D + eps);
        if (alpha[j] > mx) mx = alpha[j];
    }
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        alpha[j] = expf(alpha[j] - mx);
        sum += alpha[j];
    }
    for (int j = 0; j < n; j++) alpha[j] /= sum;
    /* Element by element over all sources, so out may alias one of them. */
    for (int d = 0; d < D; d++) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += alpha[j] * sources[j][d];
        out[d] = acc;
    }
}
