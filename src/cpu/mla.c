/* MLA attention core in the absorbed form (spec §3.3), NoPE: each query row dots its per-head 576-vector
 * [W_UK^T q_nope | q_pe] with the cached latents [c_normed | k_pe], softmax over the causal prefix, and
 * averages the first kv_lora entries of the latents. */
#include <math.h>

#include "cpu/ops.h"

/* Scores are computed a block at a time into a stack buffer; the softmax is the online form (running max
 * and sum, output rescaled when the max grows), which equals subtract-max softmax up to f32 rounding and
 * needs no scratch proportional to the context length. */
#define MLA_BLOCK 64

static float mla_dot(const float *a, const float *b, int n) {
    float s[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) s[k] += a[i + k] * b[i + k];
    for (; i < n; i++) s[0] += a[i] * b[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

void k3c_mla_attend(const float *q_abs, int Tq, int Hm, int kv_lora, int rope, const float *lat, int n_past,
                    float scale, float *o_lat) {
    int Dq = kv_lora + rope;
    for (int i = 0; i < Tq; i++) {
        int n = n_past + i + 1; /* causal: rows 0..n_past+i */
        for (int h = 0; h < Hm; h++) {
            const float *qv = q_abs + ((size_t)i * Hm + h) * Dq;
            float *out = o_lat + ((size_t)i * Hm + h) * kv_lora;
            for (int e = 0; e < kv_lora; e++) out[e] = 0.0f;
            float m = -INFINITY, l = 0.0f;
            for (int t0 = 0; t0 < n; t0 += MLA_BLOCK) {
                int nb = n - t0 < MLA_BLOCK ? n - t0 : MLA_BLOCK;
                float sc[MLA_BLOCK], bm = -INFINITY;
                for (int tt = 0; tt < nb; tt++) {
                    sc[tt] = mla_dot(qv, lat + (size_t)(t0 + tt) * Dq, Dq) * scale;
                    if (sc[tt] > bm) bm = sc[tt];
                }
                if (bm > m) {
                    float r = expf(m - bm); /* m = -inf on the first block: r = 0, and l, out are 0 */
                    l *= r;
                    for (int e = 0; e < kv_lora; e++) out[e] *= r;
                    m = bm;
                }
                for (int tt = 0; tt < nb; tt++) {
                    float p = expf(sc[tt] - m);
                    const float *c = lat + (size_t)(t0 + tt) * Dq;
                    l += p;
                    for (int e = 0; e < kv_lora; e++) out[e] += p * c[e];
                }
            }
            float inv = 1.0f / l;
            for (int e = 0; e < kv_lora; e++) out[e] *= inv;
        }
    }
}
