/* Batch invariance and split invariance of the CPU kernels (cpu/ops.h): a token's result must be bit for bit
 * the same whether it is computed alone (T = 1, the decode path) or as one row of a larger T, whatever the
 * thread split, the product batch, the head range or the cache paging. Accuracy against float64 is tested in
 * test_cpu_ops.c; here only bitwise equality between the forms is checked. Inputs are fresh random values
 * from test_seed(); outputs are poisoned with NaN before every call (NaN never compares equal). */
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "test.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/rng.h"

static k3c_rng batch_rng(void) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xba7c4ull);
    return r;
}

static float *fnew(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

static void fill(k3c_rng *r, float *x, size_t n, int bf16) {
    for (size_t i = 0; i < n; i++) {
        float v = (float)k3c_rng_normal(r);
        x[i] = bf16 ? bf16_round(v) : v;
    }
}

/* Bitwise equality that NaN never passes (a poisoned output left unwritten is a failure). */
static int same_bits(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != a[i] || memcmp(&a[i], &b[i], sizeof(float)) != 0) return 0;
    return 1;
}

/* y for all T tokens in one k3c_matmul_batch (with the pool, strided, rounded or not; f32 products and the
 * bf16 products of xbf16) against each token alone without the pool: k3c_matmul_bf16 / k3c_matmul_mxfp4,
 * or for xbf16 a one-token k3c_matmul_batch, then rounded by bf16_round. */
static void check_matmul(k3c_rng *r, k3c_pool *pool, const k3c_mat *W, const k3c_mxfp4_mat *Wq, int T) {
    int rows = W ? W->rows : Wq->rows, cols = W ? W->cols : Wq->cols;
    size_t ldx = (size_t)cols + 3, ldy = (size_t)rows + 5; /* strided on purpose */
    float *x = fnew((size_t)T * ldx), *y = fnew((size_t)T * ldy), *y1 = fnew(rows);
    fill(r, x, (size_t)T * ldx, 1);
    for (int xb = 0; xb < 2; xb++)
        for (int round = 0; round < 2; round++) {
            poison_f32(y, (size_t)T * ldy);
            k3c_mm m = {.W = W, .Wq = Wq, .x = x, .T = T, .y = y, .round = round, .ldx = ldx, .ldy = ldy, .xbf16 = xb};
            k3c_matmul_batch(pool, &m, 1);
            for (int t = 0; t < T; t++) {
                poison_f32(y1, rows);
                if (xb) {
                    k3c_mm one = {.W = W, .Wq = Wq, .x = x + t * ldx, .T = 1, .y = y1, .xbf16 = 1};
                    k3c_matmul_batch(NULL, &one, 1);
                } else if (W) {
                    k3c_matmul_bf16(NULL, W, x + t * ldx, 1, y1);
                } else {
                    k3c_matmul_mxfp4(NULL, Wq, x + t * ldx, 1, y1);
                }
                if (round)
                    for (int i = 0; i < rows; i++) y1[i] = bf16_round(y1[i]);
                CHECKF(same_bits(y + t * ldy, y1, rows),
                       "%s rows %d cols %d T %d token %d round %d xbf16 %d: batched row differs", W ? "bf16" : "mxfp4",
                       rows, cols, T, t, round, xb);
            }
        }
    free(x), free(y), free(y1);
}

TEST(cpu_matmul_batch_invariant_bf16) {
    k3c_rng r = batch_rng();
    k3c_pool *pool = k3c_pool_create(2);
    int rows_l[] = {1, 5, 66};
    int cols_l[] = {7, 16, 100, 1000, 1029};
    int T_l[] = {2, 3, 7, 16};
    for (size_t ri = 0; ri < 3; ri++)
        for (size_t ci = 0; ci < 5; ci++) {
            int rows = rows_l[ri], cols = cols_l[ci];
            uint16_t *w = malloc((size_t)rows * cols * 2);
            for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = f32_to_bf16((float)k3c_rng_normal(&r));
            k3c_mat W = {w, rows, cols};
            for (size_t ti = 0; ti < 4; ti++) check_matmul(&r, pool, &W, NULL, T_l[ti]);
            free(w);
        }
    k3c_pool_free(pool);
}

TEST(cpu_matmul_batch_invariant_mxfp4) {
    k3c_rng r = batch_rng();
    k3c_pool *pool = k3c_pool_create(2);
    int rows_l[] = {1, 3, 70};
    int cols_l[] = {32, 96, 512, 3584};
    int T_l[] = {2, 5, 9};
    for (size_t ri = 0; ri < 3; ri++)
        for (size_t ci = 0; ci < 4; ci++) {
            int rows = rows_l[ri], cols = cols_l[ci], groups = cols / 32;
            uint8_t *pk = malloc((size_t)rows * cols / 2), *sc = malloc((size_t)rows * groups);
            for (size_t i = 0; i < (size_t)rows * cols / 2; i++) pk[i] = (uint8_t)k3c_rng_next(&r);
            for (size_t i = 0; i < (size_t)rows * groups; i++) {
                uint64_t v = k3c_rng_next(&r);
                sc[i] = v % 13 == 0 ? 0 : (uint8_t)(117 + v % 24); /* some subnormal 2^-127 scales */
            }
            k3c_mxfp4_mat W = {pk, sc, rows, cols};
            for (size_t ti = 0; ti < 3; ti++) check_matmul(&r, pool, NULL, &W, T_l[ti]);
            free(pk), free(sc);
        }
    k3c_pool_free(pool);
}

/* Prompt rows through the blocked form (T >= 8 with a pool): every row of a batch of T = 8 .. 300 equals the
 * row alone (the T = 1 decode path), bitwise, for odd shapes (tails, leftover 16-column blocks and groups,
 * rows split into column blocks), strided, on one and two threads. */
TEST(cpu_matmul_blocked_row_invariant) {
    k3c_rng r = batch_rng();
    k3c_pool *pools[2] = {k3c_pool_create(1), k3c_pool_create(2)};
    int T_l[] = {8, 9, 31, 100, 300};
    for (int n = 0; n < 10; n++) { /* the last 4 wider than one column block (1792) */
        int mx = n % 2, wide = n >= 6, rows = 1 + (int)(k3c_rng_next(&r) % (wide ? 30 : 100));
        int cols = mx ? 32 * (1 + (int)(k3c_rng_next(&r) % 40) + (wide ? 56 : 0))
                      : 1 + (int)(k3c_rng_next(&r) % 1200) + (wide ? 1792 : 0);
        int groups = cols / 32;
        uint16_t *w = malloc((size_t)rows * cols * 2);
        uint8_t *pk = malloc((size_t)rows * cols / 2 + 1), *sc = malloc((size_t)rows * groups + 1);
        for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = f32_to_bf16((float)k3c_rng_normal(&r));
        for (size_t i = 0; i < (size_t)rows * cols / 2; i++) pk[i] = (uint8_t)k3c_rng_next(&r);
        for (size_t i = 0; i < (size_t)rows * groups; i++) {
            uint64_t v = k3c_rng_next(&r);
            sc[i] = v % 13 == 0 ? 0 : (uint8_t)(117 + v % 24);
        }
        k3c_mat W = {w, rows, cols};
        k3c_mxfp4_mat Q = {pk, sc, rows, cols};
        for (size_t ti = 0; ti < sizeof T_l / sizeof *T_l; ti++)
            check_matmul(&r, pools[(n + ti) % 2], mx ? NULL : &W, mx ? &Q : NULL, T_l[ti]);
        free(w), free(pk), free(sc);
    }
    k3c_pool_free(pools[0]);
    k3c_pool_free(pools[1]);
}

/* A NaN in one token row reaches that row's outputs only: the blocked tiles never mix rows (f32 and bf16
 * products). */
TEST(cpu_matmul_blocked_nan_stays_in_its_row) {
    k3c_rng r = batch_rng();
    k3c_pool *pool = k3c_pool_create(2);
    int rows = 67, cols = 301, T = 50, bad = 1 + (int)(k3c_rng_next(&r) % (T - 2));
    uint16_t *w = malloc((size_t)rows * cols * 2);
    for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = f32_to_bf16((float)k3c_rng_normal(&r));
    k3c_mat W = {w, rows, cols};
    float *x = fnew((size_t)T * cols), *y = fnew((size_t)T * rows), *y0 = fnew((size_t)T * rows);
    for (int xb = 0; xb < 2; xb++) {
        fill(&r, x, (size_t)T * cols, 1);
        k3c_mm m = {.W = &W, .x = x, .T = T, .y = y0, .xbf16 = xb};
        poison_f32(y0, (size_t)T * rows);
        k3c_matmul_batch(pool, &m, 1);
        x[(size_t)bad * cols + cols / 2] = NAN;
        m.y = y;
        poison_f32(y, (size_t)T * rows);
        k3c_matmul_batch(pool, &m, 1);
        for (int t = 0; t < T; t++) {
            if (t == bad) {
                for (int i = 0; i < rows; i++)
                    CHECKF(isnan(y[(size_t)t * rows + i]), "row %d output %d is not NaN (xbf16 %d)", t, i, xb);
            } else {
                CHECKF(same_bits(y + (size_t)t * rows, y0 + (size_t)t * rows, rows),
                       "row %d changed by a NaN in row %d (xbf16 %d)", t, bad, xb);
            }
        }
    }
    free(w), free(x), free(y), free(y0);
    k3c_pool_free(pool);
}

/* Several products in one batch equal the same products run one by one. */
TEST(cpu_matmul_batch_equals_separate) {
    k3c_rng r = batch_rng();
    k3c_pool *pool = k3c_pool_create(2);
    enum { N = 5, T = 3 };
    int rows[N] = {64, 3, 200, 17, 128}, cols[N] = {256, 64, 96, 1000, 512};
    uint16_t *w[N];
    k3c_mat W[N];
    float *x[N], *y[N], *ys[N];
    k3c_mm mm[N];
    for (int i = 0; i < N; i++) {
        w[i] = malloc((size_t)rows[i] * cols[i] * 2);
        for (size_t k = 0; k < (size_t)rows[i] * cols[i]; k++) w[i][k] = f32_to_bf16((float)k3c_rng_normal(&r));
        W[i] = (k3c_mat){w[i], rows[i], cols[i]};
        x[i] = fnew((size_t)T * cols[i]);
        y[i] = fnew((size_t)T * rows[i]);
        ys[i] = fnew((size_t)T * rows[i]);
        fill(&r, x[i], (size_t)T * cols[i], 1);
        poison_f32(y[i], (size_t)T * rows[i]);
        mm[i] = (k3c_mm){.W = &W[i], .x = x[i], .T = T, .y = y[i], .round = i & 1, .xbf16 = i % 3 == 1};
    }
    k3c_matmul_batch(pool, mm, N);
    for (int i = 0; i < N; i++) {
        poison_f32(ys[i], (size_t)T * rows[i]);
        k3c_mm alone = {.W = &W[i], .x = x[i], .T = T, .y = ys[i], .xbf16 = i % 3 == 1};
        k3c_matmul_batch(pool, &alone, 1);
        if (i & 1)
            for (size_t k = 0; k < (size_t)T * rows[i]; k++) ys[i][k] = bf16_round(ys[i][k]);
        CHECKF(same_bits(y[i], ys[i], (size_t)T * rows[i]), "product %d of the batch differs from it alone", i);
        free(w[i]), free(x[i]), free(y[i]), free(ys[i]);
    }
    k3c_pool_free(pool);
}

/* Paged attention over a shuffled block table, split into head ranges, equals k3c_mla_attend over the rows
 * gathered in order; and row i of a Tq-row call equals that row alone (n_past + i). */
TEST(cpu_mla_attend_paged_and_row_invariant) {
    k3c_rng r = batch_rng();
    int Hm = 5, kvl = 48, rope = 16, Dq = kvl + rope, bs = 4, n_past = 70, Tq = 3, n = n_past + Tq;
    int nblocks = (n + bs - 1) / bs + 3;
    int32_t table[64];
    int perm[64];
    for (int i = 0; i < nblocks; i++) perm[i] = i;
    for (int i = nblocks - 1; i > 0; i--) {
        int j = (int)(k3c_rng_next(&r) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < nblocks; i++) table[i] = perm[i];
    float *lat = fnew((size_t)n * Dq), *cache = fnew((size_t)nblocks * bs * Dq), *q = fnew((size_t)Tq * Hm * Dq);
    float *o_ref = fnew((size_t)Tq * Hm * kvl), *o = fnew((size_t)Tq * Hm * kvl), *o1 = fnew((size_t)Hm * kvl);
    fill(&r, lat, (size_t)n * Dq, 1);
    fill(&r, q, (size_t)Tq * Hm * Dq, 0);
    poison_f32(cache, (size_t)nblocks * bs * Dq);
    for (int p = 0; p < n; p++)
        memcpy(cache + ((size_t)table[p / bs] * bs + p % bs) * Dq, lat + (size_t)p * Dq, (size_t)Dq * sizeof(float));
    float scale = 0.125f;
    poison_f32(o_ref, (size_t)Tq * Hm * kvl);
    k3c_mla_attend(q, Tq, Hm, kvl, rope, lat, n_past, scale, o_ref);
    poison_f32(o, (size_t)Tq * Hm * kvl);
    k3c_mla_attend_paged(q, Tq, Hm, 0, 2, kvl, rope, cache, table, bs, n_past, scale, o);
    k3c_mla_attend_paged(q, Tq, Hm, 2, Hm, kvl, rope, cache, table, bs, n_past, scale, o);
    CHECK(same_bits(o, o_ref, (size_t)Tq * Hm * kvl));
    for (int i = 0; i < Tq; i++) {
        poison_f32(o1, (size_t)Hm * kvl);
        k3c_mla_attend(q + (size_t)i * Hm * Dq, 1, Hm, kvl, rope, lat, n_past + i, scale, o1);
        CHECKF(same_bits(o1, o_ref + (size_t)i * Hm * kvl, (size_t)Hm * kvl), "query row %d alone differs", i);
    }
    free(lat), free(cache), free(q), free(o_ref), free(o), free(o1);
}

/* The delta rule over head ranges equals the all-heads call, recurrent and chunked. */
TEST(cpu_kda_head_ranges_equal_all_heads) {
    k3c_rng r = batch_rng();
    int T = 21, H = 3, dk = 32, dv = 32, P = H * dk;
    size_t S = (size_t)H * dk * dv;
    float *q = fnew((size_t)T * P), *k = fnew((size_t)T * P), *v = fnew((size_t)T * P), *g = fnew((size_t)T * P);
    float *beta = fnew((size_t)T * H), *s0 = fnew(S), *sa = fnew(S), *sb = fnew(S);
    float *oa = fnew((size_t)T * P), *ob = fnew((size_t)T * P);
    fill(&r, q, (size_t)T * P, 0);
    fill(&r, k, (size_t)T * P, 0);
    fill(&r, v, (size_t)T * P, 0);
    fill(&r, s0, S, 0);
    for (size_t i = 0; i < (size_t)T * P; i++) g[i] = -0.5f * (float)k3c_rng_uniform(&r);
    for (size_t i = 0; i < (size_t)T * H; i++) beta[i] = (float)k3c_rng_uniform(&r);
    k3c_kda_qk_norm(q, k, T, H, dk);
    for (int chunked = 0; chunked < 2; chunked++) {
        memcpy(sa, s0, S * sizeof(float));
        memcpy(sb, s0, S * sizeof(float));
        poison_f32(oa, (size_t)T * P);
        poison_f32(ob, (size_t)T * P);
        if (chunked) {
            float *scratch = fnew(k3c_kda_chunk_scratch(8, dk, dv));
            CHECK_OK(k3c_kda_chunked(sa, q, k, v, g, beta, T, H, dk, dv, 8, oa));
            k3c_kda_chunked_heads(sb, q, k, v, g, beta, T, H, 1, H, dk, dv, 8, scratch, ob);
            k3c_kda_chunked_heads(sb, q, k, v, g, beta, T, H, 0, 1, dk, dv, 8, scratch, ob);
            free(scratch);
        } else {
            k3c_kda_recurrent(sa, q, k, v, g, beta, T, H, dk, dv, oa, NULL);
            k3c_kda_recurrent_heads(sb, q, k, v, g, beta, T, H, 2, H, dk, dv, ob);
            k3c_kda_recurrent_heads(sb, q, k, v, g, beta, T, H, 0, 2, dk, dv, ob);
        }
        CHECKF(same_bits(oa, ob, (size_t)T * P), "%s: outputs differ by head range", chunked ? "chunked" : "recurrent");
        CHECKF(same_bits(sa, sb, S), "%s: states differ by head range", chunked ? "chunked" : "recurrent");
    }
    free(q), free(k), free(v), free(g), free(beta), free(s0), free(sa), free(sb), free(oa), free(ob);
}
