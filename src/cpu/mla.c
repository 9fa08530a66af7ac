/* MLA attention core in the absorbed form (spec §3.3), NoPE: each query row dots its per-head 576-vector
 * [W_UK^T q_nope | q_pe] with the cached latents [c_normed | k_pe], softmax over the causal prefix, and
 * averages the first kv_lora entries of the latents.
 *
 * Positions are taken a block of MLA_BLOCK at a time, and inside a block every head of the range is
 * served before the next block, so a block of latents is read from memory once and reused from L2 by all
 * heads (the latent is shared by the heads: MQA-like). The latent rows are read in place through the block
 * table (no gathered copy of the context). The softmax is the online form (running max and sum, output
 * rescaled when the max grows), which equals subtract-max softmax up to f32 rounding and needs no scratch
 * proportional to the context length. A row's result depends only on its own query and the positions it
 * sees: not on Tq, nor on the head range, nor on the paging. */
#include <math.h>

#include "cpu/ops.h"
#include "cpu/vec.h"

#define MLA_BLOCK 64

/* Dot of n floats: 16-lane partial sums over full vectors, v16_sum, then the tail in order. */
static inline float mla_dot(const float *a, const float *b, int n) {
    k3c_v16 s = v16_splat(0.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) s = v16_load(a + i) * v16_load(b + i) + s;
    float r = v16_sum(s);
    for (; i < n; i++) r = fmaf(a[i], b[i], r);
    return r;
}

/* out[0:n] = out * r + p * c, lane by lane (r = 1 when no rescale is due). */
static inline void mla_axpy(float *out, float r, float p, const float *c, int n) {
    k3c_v16 rv = v16_splat(r), pv = v16_splat(p);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        k3c_v16 o = v16_load(out + i) * rv; /* exact when r = 1 */
        v16_store(out + i, v16_load(c + i) * pv + o);
    }
    for (; i < n; i++) out[i] = fmaf(c[i], p, out[i] * r);
}

static inline const float *mla_row(const float *lat, const int32_t *table, int bs, int Dq, int p) {
    return table ? lat + ((size_t)table[p / bs] * bs + p % bs) * Dq : lat + (size_t)p * Dq;
}

static void mla_attend_rows(const float *q_abs, int Tq, int Hm, int h0, int h1, int kv_lora, int rope,
                            const float *lat, const int32_t *table, int bs, int n_past, float scale, float *o_lat) {
    int Dq = kv_lora + rope, nh = h1 - h0;
    if (nh <= 0) return;
    float m[nh], l[nh];
    for (int i = 0; i < Tq; i++) {
        int n = n_past + i + 1; /* causal: rows 0..n_past+i */
        for (int h = 0; h < nh; h++) {
            m[h] = -INFINITY;
            l[h] = 0.0f;
            float *out = o_lat + ((size_t)i * Hm + h0 + h) * kv_lora;
            for (int e = 0; e < kv_lora; e++) out[e] = 0.0f;
        }
        for (int t0 = 0; t0 < n; t0 += MLA_BLOCK) {
            int nb = n - t0 < MLA_BLOCK ? n - t0 : MLA_BLOCK;
            const float *rows[MLA_BLOCK];
            for (int tt = 0; tt < nb; tt++) rows[tt] = mla_row(lat, table, bs, Dq, t0 + tt);
            for (int h = 0; h < nh; h++) {
                const float *qv = q_abs + ((size_t)i * Hm + h0 + h) * Dq;
                float *out = o_lat + ((size_t)i * Hm + h0 + h) * kv_lora;
                float sc[MLA_BLOCK], bm = -INFINITY;
                for (int tt = 0; tt < nb; tt++) {
                    sc[tt] = mla_dot(qv, rows[tt], Dq) * scale;
                    if (sc[tt] > bm) bm = sc[tt];
                }
                float r = 1.0f;
                if (bm > m[h]) {
                    r = expf(m[h] - bm); /* m = -inf on the first block: r = 0, and l, out are 0 */
                    l[h] *= r;
                    m[h] = bm;
                }
                for (int tt = 0; tt < nb; tt++) {
                    float p = expf(sc[tt] - m[h]);
                    l[h] += p;
                    mla_axpy(out, tt == 0 ? r : 1.0f, p, rows[tt], kv_lora);
                }
            }
        }
        for (int h = 0; h < nh; h++) {
            float *out = o_lat + ((size_t)i * Hm + h0 + h) * kv_lora;
            float inv = 1.0f / l[h];
            for (int e = 0; e < kv_lora; e++) out[e] *= inv;
        }
    }
}

void k3c_mla_attend(const float *q_abs, int Tq, int Hm, int kv_lora, int rope, const float *lat, int n_past,
                    float scale, float *o_lat) {
    mla_attend_rows(q_abs, Tq, Hm, 0, Hm, kv_lora, rope, lat, NULL, 1, n_past, scale, o_lat);
}

void k3c_mla_attend_paged(const float *q_abs, int Tq, int Hm, int h0, int h1, int kv_lora, int rope,
                          const float *cache, const int32_t *block_table, int block_size, int n_past, float scale,
                          float *o_lat) {
    mla_attend_rows(q_abs, Tq, Hm, h0, h1, kv_lora, rope, cache, block_table, block_size, n_past, scale, o_lat);
}
