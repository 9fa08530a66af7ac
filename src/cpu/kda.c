/* Kimi Delta Attention (spec §2.2, §2.3): short conv, decay gate, q/k normalisation, the gated delta rule in
 * recurrent and chunked form, and the gated output norm. Semantics follow FLA's naive_recurrent_kda /
 * naive_chunk_kda. The state of a head is S[d][e] (key channel d major), [H, dk, dv] f32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/vec.h"
#include "util/error.h"

void k3c_kda_conv_rows(const float *x, int T, int C, int W, const float *taps, const float *window, int t0, int t1,
                       float *out) {
    int h = W - 1; /* history length */
    for (int t = t0; t < t1 && t < T; t++) {
        for (int c = 0; c < C; c++) {
            const float *tap = taps + (size_t)c * W;
            float s = 0.0f;
            /* Tap j multiplies input t - h + j; inputs before this call come from the window. */
            for (int j = 0; j < W; j++) {
                int ti = t - h + j;
                float v = ti >= 0 ? x[(size_t)ti * C + c] : window[(size_t)(h + ti) * C + c];
                s += tap[j] * v;
            }
            out[(size_t)t * C + c] = s * k3c_sigmoidf(s);
        }
    }
}

void k3c_kda_conv_advance(const float *x, int T, int C, int W, float *window) {
    int h = W - 1;
    if (h <= 0) return;
    /* The window now ends at the last token: the last h rows of [window ; x]. */
    if (T >= h) {
        memcpy(window, x + (size_t)(T - h) * C, (size_t)h * C * sizeof(float));
    } else {
        memmove(window, window + (size_t)T * C, (size_t)(h - T) * C * sizeof(float));
        memcpy(window + (size_t)(h - T) * C, x, (size_t)T * C * sizeof(float));
    }
}

void k3c_kda_conv(const float *x, int T, int C, int W, const float *taps, float *window, float *out) {
    k3c_kda_conv_rows(x, T, C, W, taps, window, 0, T, out);
    k3c_kda_conv_advance(x, T, C, W, window);
}

void k3c_kda_gate(const k3c_config *c, const float *a_log, const float *dt_bias, const float *f, int T, float *g) {
    int H = c->kda_num_heads, dk = c->kda_head_dim, P = H * dk;
    float lb = c->kda_gate_lower_bound;
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            float A = expf(a_log[h]);
            for (int d = 0; d < dk; d++) {
                size_t i = (size_t)h * dk + d;
                float x = f[(size_t)t * P + i] + dt_bias[i];
                float gv;
                if (c->kda_has_lower_bound) {
                    gv = lb * k3c_sigmoidf(A * x); /* safe gate, in (lb, 0) */
                } else {
                    float sp = x > 20.0f ? x : log1pf(expf(x)); /* torch softplus threshold 20 */
                    gv = -A * sp;
                }
                g[(size_t)t * P + i] = gv;
            }
        }
    }
}

void k3c_kda_qk_norm(float *q, float *k, int T, int H, int dk) {
    float qscale = 1.0f / sqrtf((float)dk);
    for (size_t r = 0; r < (size_t)T * H; r++) {
        float *qr = q + r * dk, *kr = k + r * dk;
        float sq = 0.0f, sk = 0.0f;
        for (int d = 0; d < dk; d++) {
            sq += qr[d] * qr[d];
            sk += kr[d] * kr[d];
        }
        float rq = qscale / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
        for (int d = 0; d < dk; d++) {
            qr[d] *= rq;
            kr[d] *= rk;
        }
    }
}

/* One token of one head. u is scratch [dv]. The vector form (dv % 16 == 0, every model) does per element
 * exactly the scalar form's operations; the scalar loop serves other widths. */
static void kda_step(float *restrict S, const float *restrict q, const float *restrict k, const float *restrict v,
                     const float *restrict g, float beta, int dk, int dv, float *restrict o, float *restrict u) {
    if (dv % 16 == 0) {
        int nv = dv / 16;
        k3c_v16 uv[nv], ov[nv];
        for (int j = 0; j < nv; j++) uv[j] = v16_splat(0.0f);
        /* Decay each key row, and accumulate S^T k from the decayed state. */
        for (int d = 0; d < dk; d++) {
            k3c_v16 a = v16_splat(expf(g[d])), kd = v16_splat(k[d]);
            float *Sd = S + (size_t)d * dv;
            for (int j = 0; j < nv; j++) {
                k3c_v16 sv = v16_load(Sd + 16 * j) * a;
                v16_store(Sd + 16 * j, sv);
                uv[j] = kd * sv + uv[j];
            }
        }
        k3c_v16 bv = v16_splat(beta);
        for (int j = 0; j < nv; j++) {
            uv[j] = bv * (v16_load(v + 16 * j) - uv[j]);
            ov[j] = v16_splat(0.0f);
        }
        /* Rank-1 update, then the output from the updated state. */
        for (int d = 0; d < dk; d++) {
            k3c_v16 kd = v16_splat(k[d]), qd = v16_splat(q[d]);
            float *Sd = S + (size_t)d * dv;
            for (int j = 0; j < nv; j++) {
                k3c_v16 sv = kd * uv[j] + v16_load(Sd + 16 * j);
                v16_store(Sd + 16 * j, sv);
                ov[j] = qd * sv + ov[j];
            }
        }
        for (int j = 0; j < nv; j++) v16_store(o + 16 * j, ov[j]);
        return;
    }
    for (int e = 0; e < dv; e++) u[e] = 0.0f;
    for (int d = 0; d < dk; d++) {
        float a = expf(g[d]), kd = k[d];
        float *Sd = S + (size_t)d * dv;
        for (int e = 0; e < dv; e++) {
            Sd[e] *= a;
            u[e] += kd * Sd[e];
        }
    }
    for (int e = 0; e < dv; e++) {
        u[e] = beta * (v[e] - u[e]);
        o[e] = 0.0f;
    }
    for (int d = 0; d < dk; d++) {
        float kd = k[d], qd = q[d];
        float *Sd = S + (size_t)d * dv;
        for (int e = 0; e < dv; e++) {
            Sd[e] += kd * u[e];
            o[e] += qd * Sd[e];
        }
    }
}

void k3c_kda_recurrent_heads(float *state, const float *q, const float *k, const float *v, const float *g,
                             const float *beta, int T, int H, int h0, int h1, int dk, int dv, float *o) {
    if (T <= 0 || H <= 0 || dv <= 0) return;
    float u[dv]; /* per-token scratch, dv floats (128 for K3) */
    size_t hs = (size_t)dk * dv;
    for (int t = 0; t < T; t++)
        for (int h = h0; h < h1; h++) {
            size_t rk = (size_t)t * H + h;
            kda_step(state + h * hs, q + rk * dk, k + rk * dk, v + rk * dv, g + rk * dk, beta[rk], dk, dv,
                     o + rk * dv, u);
        }
}

void k3c_kda_recurrent(float *state, const float *q, const float *k, const float *v, const float *g,
                       const float *beta, int T, int H, int dk, int dv, float *o, float *states) {
    if (T <= 0 || H <= 0 || dv <= 0) return;
    size_t hs = (size_t)dk * dv;
    for (int t = 0; t < T; t++) {
        size_t rk = (size_t)t * H;
        k3c_kda_recurrent_heads(state, q + rk * dk, k + rk * dk, v + rk * dv, g + rk * dk, beta + rk, 1, H, 0, H, dk,
                                dv, o + rk * dv);
        if (states) memcpy(states + (size_t)t * H * hs, state, (size_t)H * hs * sizeof(float));
    }
}

/* Small dense products of the chunked form, vectorized over the output row (16 lanes, then a scalar tail).
 * Y[m][n] += sum_k A[m][k] B[k][n] for k = 0 .. K-1 in order, each term one contracted multiply-add into Y's
 * running value; rows in blocks of 4 and the row in pieces of 32 columns, so one B load serves 4 rows. The
 * order per element depends on K only, never on M, N or the blocking. */
static void kda_gemm(float *restrict Y, size_t ldy, const float *restrict A, size_t lda, const float *restrict B,
                     size_t ldb, int M, int N, int K) {
    int m = 0;
    for (; m + 4 <= M; m += 4) {
        int n = 0;
        for (; n + 32 <= N; n += 32) {
            k3c_v16 y[4][2];
            for (int i = 0; i < 4; i++)
                for (int h = 0; h < 2; h++) y[i][h] = v16_load(Y + (m + i) * ldy + n + 16 * h);
            for (int k = 0; k < K; k++) {
                k3c_v16 b0 = v16_load(B + k * ldb + n), b1 = v16_load(B + k * ldb + n + 16);
                for (int i = 0; i < 4; i++) {
                    k3c_v16 a = v16_splat(A[(m + i) * lda + k]);
                    y[i][0] = a * b0 + y[i][0];
                    y[i][1] = a * b1 + y[i][1];
                }
            }
            for (int i = 0; i < 4; i++)
                for (int h = 0; h < 2; h++) v16_store(Y + (m + i) * ldy + n + 16 * h, y[i][h]);
        }
        for (; n + 16 <= N; n += 16) {
            k3c_v16 y[4];
            for (int i = 0; i < 4; i++) y[i] = v16_load(Y + (m + i) * ldy + n);
            for (int k = 0; k < K; k++) {
                k3c_v16 b0 = v16_load(B + k * ldb + n);
                for (int i = 0; i < 4; i++) y[i] = v16_splat(A[(m + i) * lda + k]) * b0 + y[i];
            }
            for (int i = 0; i < 4; i++) v16_store(Y + (m + i) * ldy + n, y[i]);
        }
        for (; n < N; n++)
            for (int i = 0; i < 4; i++) {
                float y = Y[(m + i) * ldy + n];
                for (int k = 0; k < K; k++) y = A[(m + i) * lda + k] * B[k * ldb + n] + y;
                Y[(m + i) * ldy + n] = y;
            }
    }
    for (; m < M; m++) {
        int n = 0;
        for (; n + 16 <= N; n += 16) {
            k3c_v16 y = v16_load(Y + m * ldy + n);
            for (int k = 0; k < K; k++) y = v16_splat(A[m * lda + k]) * v16_load(B + k * ldb + n) + y;
            v16_store(Y + m * ldy + n, y);
        }
        for (; n < N; n++) {
            float y = Y[m * ldy + n];
            for (int k = 0; k < K; k++) y = A[m * lda + k] * B[k * ldb + n] + y;
            Y[m * ldy + n] = y;
        }
    }
}

/* y[0..n) += a * x[0..n) */
static void kda_axpy(float *restrict y, float a, const float *restrict x, int n) {
    int i = 0;
    k3c_v16 av = v16_splat(a);
    for (; i + 16 <= n; i += 16) v16_store(y + i, av * v16_load(x + i) + v16_load(y + i));
    for (; i < n; i++) y[i] = a * x[i] + y[i];
}

/* out[d] = exp(x[d] - y[d]) for d < n (y NULL: exp(x[d])) through v16_exp (cpu/vec.h; the same function for
 * a short tail, padded): libm's expf per element was half the chunked form's time. */
static void kda_exp(const float *x, const float *y, int n, float *out) {
    int d = 0;
    for (; d + 16 <= n; d += 16) {
        k3c_v16 v = v16_load(x + d);
        v16_store(out + d, v16_exp(y ? v - v16_load(y + d) : v));
    }
    if (d < n) {
        float t[16] = {0};
        for (int i = d; i < n; i++) t[i - d] = y ? x[i] - y[i] : x[i];
        v16_store(t, v16_exp(v16_load(t)));
        memcpy(out + d, t, (size_t)(n - d) * sizeof(float));
    }
}

/* Dot of n floats: 16-lane partial sums over full vectors, v16_sum, then the tail in order. */
static float kda_dot(const float *a, const float *b, int n) {
    k3c_v16 s = v16_splat(0.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) s = v16_load(a + i) * v16_load(b + i) + s;
    float r = v16_sum(s);
    for (; i < n; i++) r = fmaf(a[i], b[i], r);
    return r;
}

/* Rows per sub-chunk of the pairwise products (below). */
#define KDA_SUB 16

/* Scratch of one chunk of one head, carved from the caller's scratch (k3c_kda_chunk_scratch floats). */
typedef struct kda_chunk_buf {
    float *gam; /* [C, dk] cumulative log decay within the chunk, non-increasing in i */
    float *L;   /* [C, C]  L[i][j] = beta_i sum_d k_i k_j exp(gam_i - gam_j), j < i */
    float *Aqk; /* [C, C]  sum_d q_i k_j exp(gam_i - gam_j), j <= i */
    float *W;   /* [C, dk] T (exp(gam) . K); before that, the transposed decayed keys [dk, C] of the pairs */
    float *U;   /* [C, dv] T V, then V' = U - W S */
    float *P;   /* [2 KDA_SUB, dk] one sub-chunk's decayed q and k; later Q . exp(gam) ([C, dk] in W) */
    float *a;   /* [dk]    one row of exponentiated differences */
    float *e;   /* [dk]    the chunk's total decay */
} kda_chunk_buf;

/* One chunk of n <= C tokens of head h, tokens t0..t0+n-1 (spec §2.3). S: this head's [dk, dv] state. Every
 * exponent is a difference gam_i - gam_j with i >= j (or gam_i itself, the difference from the chunk start),
 * which is <= 0 because g <= 0: it may underflow to 0 but never overflows.
 *
 * The pairwise products exp(gam_i - gam_j) for i, j in different sub-chunks of KDA_SUB rows are factored
 * through the first row r of i's sub-chunk, exp(gam_i - gam_r) exp(gam_r - gam_j), both factors <= 1 since
 * j < r <= i: one exponential per (row, channel) and sub-chunk instead of one per (pair, channel), and the
 * sums become small matrix products. Pairs inside a sub-chunk take exp(gam_i - gam_j) directly. */
static void kda_chunk(float *restrict S, const float *q, const float *k, const float *v, const float *g,
                      const float *beta, int t0, int n, int H, int h, int dk, int dv, int C, kda_chunk_buf *b,
                      float *o) {
    size_t sk = (size_t)H * dk, sv = (size_t)H * dv; /* token strides */
#define QROW(i) (q + (size_t)(t0 + (i)) * sk + (size_t)h * dk)
#define KROW(i) (k + (size_t)(t0 + (i)) * sk + (size_t)h * dk)
#define VROW(i) (v + (size_t)(t0 + (i)) * sv + (size_t)h * dv)
#define GROW(i) (g + (size_t)(t0 + (i)) * sk + (size_t)h * dk)
#define OROW(i) (o + (size_t)(t0 + (i)) * sv + (size_t)h * dv)
#define BETA(i) (beta[(size_t)(t0 + (i)) * H + h])
    float *gam = b->gam, *a = b->a;
    for (int d = 0; d < dk; d++) gam[d] = GROW(0)[d];
    for (int i = 1; i < n; i++)
        for (int d = 0; d < dk; d++) gam[(size_t)i * dk + d] = gam[(size_t)(i - 1) * dk + d] + GROW(i)[d];

    /* Pairwise decayed products for L (strictly lower) and Aqk (lower, diagonal included). */
    for (int r = 0; r < n; r += KDA_SUB) {
        int re = r + KDA_SUB < n ? r + KDA_SUB : n, ns = re - r;
        const float *gr = gam + (size_t)r * dk;
        if (r > 0) {
            /* KT[d][j] = k_j[d] exp(gam_r - gam_j) (in W), P = [q_i; k_i] exp(gam_i - gam_r) */
            float *KT = b->W, *Pq = b->P, *Pk = b->P + (size_t)KDA_SUB * dk;
            for (int j = 0; j < r; j++) {
                const float *kj = KROW(j), *gj = gam + (size_t)j * dk;
                kda_exp(gr, gj, dk, a);
                for (int d = 0; d < dk; d++) KT[(size_t)d * C + j] = kj[d] * a[d];
            }
            for (int i = r; i < re; i++) {
                const float *qi = QROW(i), *ki = KROW(i), *gi = gam + (size_t)i * dk;
                kda_exp(gi, gr, dk, a);
                for (int d = 0; d < dk; d++) {
                    Pq[(size_t)(i - r) * dk + d] = qi[d] * a[d];
                    Pk[(size_t)(i - r) * dk + d] = ki[d] * a[d];
                }
            }
            for (int i = r; i < re; i++)
                for (int j = 0; j < r; j++) b->L[(size_t)i * C + j] = b->Aqk[(size_t)i * C + j] = 0.0f;
            kda_gemm(b->L + (size_t)r * C, C, Pk, dk, KT, C, ns, r, dk);
            kda_gemm(b->Aqk + (size_t)r * C, C, Pq, dk, KT, C, ns, r, dk);
            for (int i = r; i < re; i++) {
                float bi = BETA(i);
                for (int j = 0; j < r; j++) b->L[(size_t)i * C + j] *= bi;
            }
        }
        for (int i = r; i < re; i++) {
            const float *qi = QROW(i), *ki = KROW(i), *gi = gam + (size_t)i * dk;
            for (int j = r; j < i; j++) {
                const float *kj = KROW(j), *gj = gam + (size_t)j * dk;
                kda_exp(gi, gj, dk, a);
                for (int d = 0; d < dk; d++) a[d] *= kj[d];
                b->L[(size_t)i * C + j] = BETA(i) * kda_dot(ki, a, dk);
                b->Aqk[(size_t)i * C + j] = kda_dot(qi, a, dk);
            }
            b->Aqk[(size_t)i * C + i] = kda_dot(qi, ki, dk);
        }
    }

    /* Forward substitution: (I + L) X = Diag(beta) Y for Y = exp(gam) . K (-> W) and Y = V (-> U). */
    for (int i = 0; i < n; i++) {
        float bi = BETA(i);
        float *Wi = b->W + (size_t)i * dk, *Ui = b->U + (size_t)i * dv;
        const float *ki = KROW(i), *vi = VROW(i), *gi = gam + (size_t)i * dk;
        kda_exp(gi, NULL, dk, a);
        for (int d = 0; d < dk; d++) Wi[d] = bi * a[d] * ki[d];
        for (int e = 0; e < dv; e++) Ui[e] = bi * vi[e];
        for (int j = 0; j < i; j++) {
            float l = -b->L[(size_t)i * C + j];
            kda_axpy(Wi, l, b->W + (size_t)j * dk, dk);
            kda_axpy(Ui, l, b->U + (size_t)j * dv, dv);
        }
    }

    /* V' = U - W S (the delta-rule corrections against the incoming state). */
    for (size_t i = 0; i < (size_t)n * dk; i++) b->W[i] = -b->W[i];
    kda_gemm(b->U, dv, b->W, dk, S, dv, n, dv, dk);

    /* O = (Q . exp(gam)) S + tril(Aqk) V', from the incoming state; Q . exp(gam) in W. */
    for (int i = 0; i < n; i++) {
        const float *qi = QROW(i), *gi = gam + (size_t)i * dk;
        float *oi = OROW(i);
        kda_exp(gi, NULL, dk, a);
        for (int d = 0; d < dk; d++) b->W[(size_t)i * dk + d] = qi[d] * a[d];
        for (int e = 0; e < dv; e++) oi[e] = 0.0f;
    }
    kda_gemm(OROW(0), sv, b->W, dk, S, dv, n, dv, dk);
    for (int i = 0; i < n; i++) {
        float *oi = OROW(i);
        for (int j = 0; j <= i; j++) kda_axpy(oi, b->Aqk[(size_t)i * C + j], b->U + (size_t)j * dv, dv);
    }

    /* S <- Diag(exp(gam_last)) S + (K . exp(gam_last - gam))^T V'; the decayed keys transposed in W. */
    const float *gl = gam + (size_t)(n - 1) * dk;
    kda_exp(gl, NULL, dk, b->e);
    for (int d = 0; d < dk; d++) {
        float *Sd = S + (size_t)d * dv, decay = b->e[d];
        for (int e = 0; e < dv; e++) Sd[e] *= decay;
    }
    for (int j = 0; j < n; j++) {
        kda_exp(gl, gam + (size_t)j * dk, dk, a);
        for (int d = 0; d < dk; d++) b->W[(size_t)d * C + j] = KROW(j)[d] * a[d];
    }
    kda_gemm(S, dv, b->W, C, b->U, dv, dk, dv, n);
#undef QROW
#undef KROW
#undef VROW
#undef GROW
#undef OROW
#undef BETA
}

size_t k3c_kda_chunk_scratch(int chunk, int dk, int dv) {
    size_t C = chunk > 0 ? (size_t)chunk : 64;
    return C * dk * 2 + C * C * 2 + C * dv + (size_t)(2 * KDA_SUB + 2) * dk;
}

void k3c_kda_chunked_heads(float *state, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int T, int H, int h0, int h1, int dk, int dv, int chunk,
                           float *scratch, float *o) {
    if (T <= 0 || H <= 0) return;
    int C = chunk > 0 ? chunk : 64;
    if (C > T) C = T;
    /* Carved for C = min(chunk, T) <= chunk rows, inside the k3c_kda_chunk_scratch(chunk, ...) floats. */
    kda_chunk_buf b;
    b.gam = scratch;
    b.W = b.gam + (size_t)C * dk;
    b.L = b.W + (size_t)C * dk;
    b.Aqk = b.L + (size_t)C * C;
    b.U = b.Aqk + (size_t)C * C;
    b.P = b.U + (size_t)C * dv;
    b.a = b.P + (size_t)2 * KDA_SUB * dk;
    b.e = b.a + dk;
    size_t hs = (size_t)dk * dv;
    for (int h = h0; h < h1; h++)
        for (int t0 = 0; t0 < T; t0 += C)
            kda_chunk(state + h * hs, q, k, v, g, beta, t0, T - t0 < C ? T - t0 : C, H, h, dk, dv, C, &b, o);
}

int k3c_kda_chunked(float *state, const float *q, const float *k, const float *v, const float *g,
                    const float *beta, int T, int H, int dk, int dv, int chunk, float *o) {
    if (T <= 0 || H <= 0) return K3C_OK;
    size_t need = k3c_kda_chunk_scratch(chunk, dk, dv);
    float *scratch = malloc(need * sizeof(float));
    if (!scratch)
        return k3c_errorf_kind(K3C_ERROR_OOM, "kda chunked: out of memory for %zu floats of chunk scratch (chunk %d, dk %d, dv %d)",
                          need, chunk, dk, dv);
    k3c_kda_chunked_heads(state, q, k, v, g, beta, T, H, 0, H, dk, dv, chunk, scratch, o);
    free(scratch);
    return K3C_OK;
}

void k3c_kda_gated_norm(const float *o, const float *z, const float *w, int T, int H, int dv, float eps,
                        int silu_gate, float *y) {
    for (size_t r = 0; r < (size_t)T * H; r++) {
        const float *orow = o + r * dv, *zrow = z + r * dv;
        float *yrow = y + r * dv;
        float ss = 0.0f;
        for (int e = 0; e < dv; e++) ss += orow[e] * orow[e];
        float rs = 1.0f / sqrtf(ss / (float)dv + eps);
        for (int e = 0; e < dv; e++) {
            float gate = silu_gate ? zrow[e] * k3c_sigmoidf(zrow[e]) : k3c_sigmoidf(zrow[e]);
            yrow[e] = orow[e] * rs * w[e] * gate;
        }
    }
}
