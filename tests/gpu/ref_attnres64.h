/* The float64 AttnRes mix of one row, written from the formula (spec: logits v . (norm * proj) / rms(v),
 * softmax over the sources, weighted sum): the reference of tests/gpu's gpu_attnres_mix and of
 * tools/kernels_emu. At most 16 sources. */
#ifndef K3C_TESTS_GPU_REF_ATTNRES64_H
#define K3C_TESTS_GPU_REF_ATTNRES64_H

#include <math.h>

static inline void attnres_ref64(const float *const *rows, int n, int D, const float *proj, const float *norm,
                                 double eps, double *out) {
    double a[16], mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < n; j++) {
        double ss = 0.0, dot = 0.0;
        for (int d = 0; d < D; d++) {
            ss += (double)rows[j][d] * rows[j][d];
            dot += (double)rows[j][d] * ((double)norm[d] * proj[d]);
        }
        a[j] = dot / sqrt(ss / D + eps);
        if (a[j] > mx) mx = a[j];
    }
    for (int j = 0; j < n; j++) sum += a[j] = exp(a[j] - mx);
    for (int d = 0; d < D; d++) {
        double acc = 0.0;
        for (int j = 0; j < n; j++) acc += a[j] / sum * rows[j][d];
        out[d] = acc;
    }
}

#endif
