/* MLA attention core, NoPE, in two forms that are equal in exact arithmetic.
 *
 * Absorbed (spec §3.3; decode, verify): each query row dots its per-head 576-vector
 * [W_UK^T q_nope | q_pe] with the cached latents [c_normed | k_pe], softmax over the causal prefix, and
 * averages the first kv_lora entries of the latents.
 *
 * Positions are taken a block of MLA_BLOCK at a time, and inside a block every head of the range is
 * served before the next block, so a block of latents is read from memory once and reused from L2 by all
 * heads (the latent is shared by the heads: MQA-like). The latent rows are read in place through the block
 * table (no gathered copy of the context). The softmax is the online form (running max and sum, output
 * rescaled when the max grows), which equals subtract-max softmax up to f32 rounding and needs no scratch
 * proportional to the context length. A row's result depends only on its own query and the positions it
 * sees: not on Tq, nor on the head range, nor on the paging.
 *
 * Expanded (spec §3.2; prompt chunks): see k3c_mla_attend_expanded below. */
#include <math.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/vec.h"
#include "util/bf16.h"

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

/* dcp > 1 (k3c_mla_attend_part): the rows are the rank's local slots, row i sees the local slots of positions
 * 0 .. n_past + i that the rank holds; lse (NULL: none) gets m + log l per row and head. */
static void mla_attend_rows(const float *q_abs, int Tq, int Hm, int h0, int h1, int kv_lora, int rope,
                            const float *lat, const int32_t *table, int bs, int n_past, int dcp, int dcp_rank,
                            float scale, float *o_lat, float *lse) {
    int Dq = kv_lora + rope, nh = h1 - h0;
    if (nh <= 0) return;
    float m[nh], l[nh];
    for (int i = 0; i < Tq; i++) {
        int n = n_past + i + 1; /* causal: rows 0..n_past+i */
        if (dcp > 1) n = (n - dcp_rank + dcp - 1) / dcp; /* of which p % dcp == dcp_rank, at local slot p / dcp */
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
            if (n <= 0) { /* none of this rank's positions (dcp only): an empty partial */
                for (int e = 0; e < kv_lora; e++) out[e] = 0.0f;
                if (lse) lse[(size_t)i * Hm + h0 + h] = -INFINITY;
                continue;
            }
            float inv = 1.0f / l[h];
            for (int e = 0; e < kv_lora; e++) out[e] *= inv;
            if (lse) lse[(size_t)i * Hm + h0 + h] = m[h] + logf(l[h]);
        }
    }
}

void k3c_mla_attend(const float *q_abs, int Tq, int Hm, int kv_lora, int rope, const float *lat, int n_past,
                    float scale, float *o_lat) {
    mla_attend_rows(q_abs, Tq, Hm, 0, Hm, kv_lora, rope, lat, NULL, 1, n_past, 1, 0, scale, o_lat, NULL);
}

void k3c_mla_attend_paged(const float *q_abs, int Tq, int Hm, int h0, int h1, int kv_lora, int rope,
                          const float *cache, const int32_t *block_table, int block_size, int n_past, float scale,
                          float *o_lat) {
    mla_attend_rows(q_abs, Tq, Hm, h0, h1, kv_lora, rope, cache, block_table, block_size, n_past, 1, 0, scale, o_lat,
                    NULL);
}

void k3c_mla_attend_part(const float *q_abs, int Tq, int Hm, int h0, int h1, int kv_lora, int rope,
                         const float *cache, const int32_t *block_table, int block_size, int n_past, int dcp,
                         int dcp_rank, float scale, float *o_lat, float *lse) {
    mla_attend_rows(q_abs, Tq, Hm, h0, h1, kv_lora, rope, cache, block_table, block_size, n_past, dcp, dcp_rank, scale,
                    o_lat, lse);
}

void k3c_mla_merge(const float *o_parts, const float *lses, size_t stride, int n, int Hm, int kv_lora, int t, int h,
                   float *lat) {
    size_t o_part = stride, l_part = stride, rh = (size_t)t * Hm + h;
    float M = -INFINITY, w[n];
    for (int r = 0; r < n; r++) M = fmaxf(M, lses[r * l_part + rh]);
    float L = 0.0f;
    for (int r = 0; r < n; r++) {
        float x = lses[r * l_part + rh];
        w[r] = x == -INFINITY ? 0.0f : expf(x - M);
        L += w[r];
    }
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int e = 0; e < kv_lora; e++) {
        float s = 0.0f;
        for (int r = 0; r < n; r++) s = fmaf(w[r], o_parts[r * o_part + rh * kv_lora + e], s);
        lat[e] = s * inv;
    }
}

/* ---- expanded form (spec §3.2) ----
 *
 * Per head, the cached latents are decompressed a block of MLA_EXP_BLOCK positions at a time through that
 * head's slice of kv_b ([W_UK[h] (nope rows) | W_UV[h] (v rows)], each [kv_lora]) into k_nope [blk, nope]
 * and v [blk, v], and every query row of the call that sees the block consumes it (online softmax, as in
 * the absorbed kernel). The decompression, O(context x (nope + v) x kv_lora) per head, is done once per
 * call and shared by the Tq query rows: that is what makes this form worth it for prompt chunks, and not
 * for decode (Tq = 1), where the absorbed form reads each latent once per head with no decompression.
 * Scratch is the block (k, v, four weight rows in f32) and the running max / sum per row, on the stack:
 * (blk * (nope + v) + 4 * kv_lora + 2 * Tq) floats. */
#define MLA_EXP_BLOCK 32

/* The 16 dots of 4 f32 rows w[0..3] with 4 rows a[0..3] (n floats each): 8 loads per 16 FMAs, so the
 * loop is bound by the FMAs, not the loads. Each dot out[r][k] = w[r] . a[k] is reduced like mla_dot:
 * 16-lane partial sums over full vectors, v16_sum, then the tail in order, whatever the blocking. */
static inline void mla_dot4x4(const float *const *w, const float *const *a, int n, float out[4][4]) {
    /* named accumulators: GCC keeps them in registers (an array of vectors was spilled) */
    k3c_v16 z = v16_splat(0.0f);
    k3c_v16 s00 = z, s01 = z, s02 = z, s03 = z, s10 = z, s11 = z, s12 = z, s13 = z;
    k3c_v16 s20 = z, s21 = z, s22 = z, s23 = z, s30 = z, s31 = z, s32 = z, s33 = z;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        k3c_v16 a0 = v16_load(a[0] + i), a1 = v16_load(a[1] + i), a2 = v16_load(a[2] + i), a3 = v16_load(a[3] + i);
        k3c_v16 w0 = v16_load(w[0] + i);
        s00 = w0 * a0 + s00, s01 = w0 * a1 + s01, s02 = w0 * a2 + s02, s03 = w0 * a3 + s03;
        k3c_v16 w1 = v16_load(w[1] + i);
        s10 = w1 * a0 + s10, s11 = w1 * a1 + s11, s12 = w1 * a2 + s12, s13 = w1 * a3 + s13;
        k3c_v16 w2 = v16_load(w[2] + i);
        s20 = w2 * a0 + s20, s21 = w2 * a1 + s21, s22 = w2 * a2 + s22, s23 = w2 * a3 + s23;
        k3c_v16 w3 = v16_load(w[3] + i);
        s30 = w3 * a0 + s30, s31 = w3 * a1 + s31, s32 = w3 * a2 + s32, s33 = w3 * a3 + s33;
    }
    const k3c_v16 acc[16] = {s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33};
    float sums[16];
    v16_store(sums, v16_sum16(acc));
    for (int r = 0; r < 4; r++)
        for (int k = 0; k < 4; k++) out[r][k] = sums[4 * r + k];
    for (; i < n; i++)
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < 4; k++) out[r][k] = fmaf(w[r][i], a[k][i], out[r][k]);
}

/* out = out * r + sum_tt p[tt] v[tt] for tt = 0 .. n-1 in order: out * r rounded once, then one FMA per key,
 * with out held in registers across the keys (128 floats at a time) instead of loaded and stored per key
 * (mla_axpy per key: the same sums up to how the compiler contracts its first step; a remainder of vh below
 * 128 floats still goes through it). The sequence per element depends on n and the block only. */
static void mla_axpy_block(float *out, float r, const float *p, const float *v, int n, int vh) {
    int e = 0;
    for (; e + 128 <= vh; e += 128) {
        k3c_v16 o[8], rv = v16_splat(r);
        for (int k = 0; k < 8; k++) o[k] = v16_load(out + e + 16 * k) * rv; /* exact when r = 1 */
        for (int tt = 0; tt < n; tt++) {
            k3c_v16 pv = v16_splat(p[tt]);
            const float *c = v + (size_t)tt * vh + e;
            for (int k = 0; k < 8; k++) o[k] = v16_load(c + 16 * k) * pv + o[k];
        }
        for (int k = 0; k < 8; k++) v16_store(out + e + 16 * k, o[k]);
    }
    if (e < vh)
        for (int tt = 0; tt < n; tt++) mla_axpy(out + e, tt == 0 ? r : 1.0f, p[tt], v + (size_t)tt * vh + e, vh - e);
}

/* Scores of one query row against n <= 16 keys of a block: out[j] = (mla_dot(q, kb + j nope, nope) +
 * mla_dot(q + nope, kr[j], rope)) * scale, bit for bit (each dot's lanes accumulate in the same order and
 * v16_sum16 sums them as v16_sum), eight keys' FMA chains interleaved. kr and kb must hold 16 keys (the
 * caller pads with a valid one). */
static void mla_scores16(const float *q, const float *kb, int nope, const float *const *kr, int rope, int n,
                         float scale, float *out) {
    int nn = nope / 16 * 16, rr = rope / 16 * 16;
    k3c_v16 an[16], ar[16];
    for (int j0 = 0; j0 < 16; j0 += 8) {
        k3c_v16 s[8];
        for (int j = 0; j < 8; j++) s[j] = v16_splat(0.0f);
        for (int i = 0; i < nn; i += 16) {
            k3c_v16 qv = v16_load(q + i);
            for (int j = 0; j < 8; j++) s[j] = qv * v16_load(kb + (size_t)(j0 + j) * nope + i) + s[j];
        }
        for (int j = 0; j < 8; j++) an[j0 + j] = s[j], s[j] = v16_splat(0.0f);
        for (int i = 0; i < rr; i += 16) {
            k3c_v16 qv = v16_load(q + nope + i);
            for (int j = 0; j < 8; j++) s[j] = qv * v16_load(kr[j0 + j] + i) + s[j];
        }
        for (int j = 0; j < 8; j++) ar[j0 + j] = s[j];
    }
    float dn[16], dr[16];
    v16_store(dn, v16_sum16(an));
    v16_store(dr, v16_sum16(ar));
    for (int j = 0; j < n; j++) {
        float a = dn[j], b = dr[j];
        for (int i = nn; i < nope; i++) a = fmaf(q[i], kb[(size_t)j * nope + i], a);
        for (int i = rr; i < rope; i++) b = fmaf(q[nope + i], kr[j][i], b);
        out[j] = (a + b) * scale;
    }
}

void k3c_mla_attend_expanded(const float *q, int Tq, int Hm, int h0, int h1, int nope, int rope, int vh,
                             int kv_lora, const k3c_mat *kv_b, const float *cache, const int32_t *block_table,
                             int block_size, int n_past, float scale, int round_kv, float *o) {
    int Dq = kv_lora + rope, qh = nope + rope, kvw = nope + vh, n = n_past + Tq;
    if (Tq <= 0 || h1 <= h0) return;
    float kb[MLA_EXP_BLOCK * (nope > 0 ? nope : 1)], vb[MLA_EXP_BLOCK * vh], wf[4 * kv_lora];
    float m[Tq], l[Tq];
    int kv16 = kv_lora / 16 * 16;
    memset(kb, 0, sizeof kb); /* mla_scores16 reads whole 16-key groups, past a short block's keys */
    for (int h = h0; h < h1; h++) {
        for (int i = 0; i < Tq; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
            float *out = o + ((size_t)i * Hm + h) * vh;
            for (int e = 0; e < vh; e++) out[e] = 0.0f;
        }
        for (int t0 = 0; t0 < n; t0 += MLA_EXP_BLOCK) {
            int nb = n - t0 < MLA_EXP_BLOCK ? n - t0 : MLA_EXP_BLOCK;
            const float *rows[MLA_EXP_BLOCK + 3];
            for (int tt = 0; tt < nb; tt++) rows[tt] = mla_row(cache, block_table, block_size, Dq, t0 + tt);
            for (int tt = nb; tt < nb + 3; tt++) rows[tt] = rows[0]; /* padding for the 4-wide dots */
            /* the keys' rope parts, padded to whole 16-key groups with the first (scores computed, unused) */
            const float *kr[MLA_EXP_BLOCK + 16];
            for (int tt = 0; tt < nb + 16; tt++) kr[tt] = (tt < nb ? rows[tt] : rows[0]) + kv_lora;

            /* decompress: rows d .. d+3 of the head's kv_b slice (widened to f32 once per block) against
             * every latent of the block; each value is rounded to bf16 (round_kv) as the output of a bf16
             * matmul is in the stock rounding contract. Past the slice's last row the row index is clamped
             * (computed, not stored). */
            for (int d0 = 0; d0 < kvw; d0 += 4) {
                const float *wp[4];
                for (int r = 0; r < 4; r++) {
                    int d = d0 + r < kvw ? d0 + r : kvw - 1;
                    const uint16_t *wr = kv_b->w + ((size_t)h * kvw + d) * kv_lora;
                    float *f = wf + (size_t)r * kv_lora;
                    for (int c = 0; c < kv16; c += 16) v16_store(f + c, v16_load_bf16(wr + c));
                    for (int c = kv16; c < kv_lora; c++) f[c] = bf16_to_f32(wr[c]);
                    wp[r] = f;
                }
                for (int tt = 0; tt < nb; tt += 4) {
                    float r4[4][4];
                    mla_dot4x4(wp, rows + tt, kv_lora, r4);
                    for (int r = 0; r < 4 && d0 + r < kvw; r++) {
                        int d = d0 + r;
                        float *dst = d < nope ? kb + d : vb + (d - nope);
                        int stride = d < nope ? nope : vh;
                        for (int k = 0; k < 4 && tt + k < nb; k++)
                            dst[(size_t)(tt + k) * stride] = round_kv ? bf16_round(r4[r][k]) : r4[r][k];
                    }
                }
            }

            /* rows that see the block: row i sees positions 0 .. n_past + i */
            int i0 = t0 - n_past > 0 ? t0 - n_past : 0;
            for (int i = i0; i < Tq; i++) {
                int nv = n_past + i + 1 - t0;
                if (nv > nb) nv = nb;
                const float *qv = q + ((size_t)i * Hm + h) * qh;
                float *out = o + ((size_t)i * Hm + h) * vh;
                float sc[MLA_EXP_BLOCK] = {0}, bm = -INFINITY; /* whole 16-lane groups: the rest 0 */
                for (int t16 = 0; t16 < nv; t16 += 16)
                    mla_scores16(qv, kb + (size_t)t16 * nope, nope, kr + t16, rope, nv - t16 < 16 ? nv - t16 : 16,
                                 scale, sc + t16);
                for (int tt = 0; tt < nv; tt++)
                    if (sc[tt] > bm) bm = sc[tt];
                float r = 1.0f;
                if (bm > m[i]) {
                    r = expf(m[i] - bm); /* m = -inf on the first block: r = 0, and l, out are 0 */
                    l[i] *= r;
                    m[i] = bm;
                }
                /* probabilities 16 at a time (v16_exp, cpu/vec.h: libm's expf per pair was a fifth of a
                 * long prompt's attention), summed in key order */
                float pr[MLA_EXP_BLOCK];
                k3c_v16 mv = v16_splat(m[i]);
                for (int t16 = 0; t16 < nv; t16 += 16) v16_store(pr + t16, v16_exp(v16_load(sc + t16) - mv));
                for (int tt = 0; tt < nv; tt++) l[i] += pr[tt];
                mla_axpy_block(out, r, pr, vb, nv, vh);
            }
        }
        for (int i = 0; i < Tq; i++) {
            float *out = o + ((size_t)i * Hm + h) * vh;
            float inv = 1.0f / l[i];
            for (int e = 0; e < vh; e++) out[e] *= inv;
        }
    }
}
