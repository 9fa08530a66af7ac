/* CPU kernels (cpu/ops.h) against double-precision references written here from the spec
 * (KDA recurrent and chunked, absorbed MLA, AttnRes, SiTU, the router, MXFP4).
 * Inputs are fresh random values from test_seed(); outputs are poisoned with NaN before every call. */
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu/ops.h"
#include "test.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/rng.h"

/* ---------------------------------------------------------------- helpers */

static k3c_rng cpu_rng(void) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xc0ffee1234ull);
    return r;
}

static void fill_normal(k3c_rng *r, float *x, size_t n, double sd) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(k3c_rng_normal(r) * sd);
}

static double uniform(k3c_rng *r, double lo, double hi) { return lo + (hi - lo) * k3c_rng_uniform(r); }

/* bf16 -> double by placing the 16 bits in the top half of an IEEE single (independent of util/bf16.h). */
static double ref_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static float *fmalloc(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }
static double *dmalloc(size_t n) { return malloc((n ? n : 1) * sizeof(double)); }

/* ---------------------------------------------------------------- pool */

typedef struct pool_ctx {
    atomic_int *hits;
    atomic_int calls;
} pool_ctx;

static void pool_mark(void *ctx, int b, int e) {
    pool_ctx *c = ctx;
    atomic_fetch_add(&c->calls, 1);
    for (int i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
}

TEST(cpu_pool_covers_range_once) {
    int sizes[] = {1, 2, 7, 100, 10007};
    for (int threads = 0; threads <= 3; threads++) {
        k3c_pool *p = threads ? k3c_pool_create(threads) : NULL;
        CHECK(threads == 0 || p != NULL);
        CHECK(k3c_pool_threads(p) == (threads ? threads : 1));
        for (int rep = 0; rep < 20; rep++) {
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                int n = sizes[s];
                atomic_int *hits = calloc((size_t)n, sizeof *hits);
                pool_ctx c = {hits, 0};
                k3c_pool_for(p, n, pool_mark, &c);
                for (int i = 0; i < n; i++) CHECKF(hits[i] == 1, "threads %d n %d: index %d hit %d times", threads, n, i, (int)hits[i]);
                CHECK(atomic_load(&c.calls) >= 1);
                free(hits);
            }
        }
        k3c_pool_for(p, 0, pool_mark, NULL); /* empty range: fn not called */
        k3c_pool_free(p);
    }
}

/* k3c_pool_for_worker: every index once, worker numbers in [0, threads), and no worker number in use by two
 * calls at once (each call holds its number's flag for a while and fails if it finds it taken). */
typedef struct pool_worker_ctx {
    atomic_int *hits;
    atomic_int *busy; /* [threads] */
    int threads;
    atomic_int bad_worker, overlap;
} pool_worker_ctx;

static void pool_mark_worker(void *ctx, int b, int e, int worker) {
    pool_worker_ctx *c = ctx;
    if (worker < 0 || worker >= c->threads) {
        atomic_fetch_add(&c->bad_worker, 1);
        return;
    }
    if (atomic_exchange(&c->busy[worker], 1)) atomic_fetch_add(&c->overlap, 1);
    for (int i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
    for (volatile int spin = 0; spin < 2000; spin++) {
    }
    atomic_store(&c->busy[worker], 0);
}

TEST(cpu_pool_worker_numbers_distinct) {
    int sizes[] = {1, 2, 7, 100, 10007};
    for (int threads = 0; threads <= 4; threads++) {
        k3c_pool *p = threads ? k3c_pool_create(threads) : NULL;
        CHECK(threads == 0 || p != NULL);
        int nt = k3c_pool_threads(p);
        atomic_int busy[8] = {0};
        for (int rep = 0; rep < 20; rep++) {
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                int n = sizes[s];
                atomic_int *hits = calloc((size_t)n, sizeof *hits);
                pool_worker_ctx c = {hits, busy, nt, 0, 0};
                k3c_pool_for_worker(p, n, pool_mark_worker, &c);
                for (int i = 0; i < n; i++) CHECKF(hits[i] == 1, "threads %d n %d: index %d hit %d times", threads, n, i, (int)hits[i]);
                CHECKF(c.bad_worker == 0 && c.overlap == 0, "threads %d n %d: %d out-of-range worker numbers, %d overlaps",
                       threads, n, (int)c.bad_worker, (int)c.overlap);
                free(hits);
            }
        }
        k3c_pool_free(p);
    }
}

/* ---------------------------------------------------------------- matmul */

/* y and mag = sum |w x| (the scale of the f32 rounding error of each output). */
static void ref_matmul_bf16(const uint16_t *w, int rows, int cols, const float *x, int T, double *y, double *mag) {
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double s = 0, m = 0;
            for (int c = 0; c < cols; c++) {
                double p = ref_bf16(w[(size_t)r * cols + c]) * x[(size_t)t * cols + c];
                s += p;
                m += fabs(p);
            }
            y[(size_t)t * rows + r] = s;
            mag[(size_t)t * rows + r] = m;
        }
}

/* Each output within 2e-6 of its sum of |terms| (f32 accumulation error is ~sqrt(cols) * 6e-8 of that),
 * and the whole output within rel L2 1e-5 when it has enough entries for cancellation not to dominate. */
static int matmul_close(const float *y, const double *ref, const double *mag, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs(y[i] - ref[i]) <= 2e-6 * mag[i] + 1e-30)) return 0;
    return n < 16 || rel_l2_f32(y, ref, n) < 1e-5;
}

TEST(cpu_matmul_bf16_matches_double) {
    k3c_rng r = cpu_rng();
    k3c_pool *pool = k3c_pool_create(2);
    int rows_l[] = {1, 3, 4, 17, 64, 67, 300};
    int cols_l[] = {1, 5, 16, 33, 100, 257, 1000};
    int T_l[] = {1, 3, 9};
    for (size_t ri = 0; ri < sizeof rows_l / sizeof *rows_l; ri++)
        for (size_t ci = 0; ci < sizeof cols_l / sizeof *cols_l; ci++)
            for (size_t ti = 0; ti < sizeof T_l / sizeof *T_l; ti++) {
                int rows = rows_l[ri], cols = cols_l[ci], T = T_l[ti];
                uint16_t *w = malloc((size_t)rows * cols * 2);
                float *x = fmalloc((size_t)T * cols), *y = fmalloc((size_t)T * rows);
                double *ref = dmalloc((size_t)T * rows), *mag = dmalloc((size_t)T * rows);
                for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = f32_to_bf16((float)k3c_rng_normal(&r));
                fill_normal(&r, x, (size_t)T * cols, 1.0);
                ref_matmul_bf16(w, rows, cols, x, T, ref, mag);
                k3c_mat W = {w, rows, cols};
                for (int use_pool = 0; use_pool < 2; use_pool++) {
                    poison_f32(y, (size_t)T * rows);
                    k3c_matmul_bf16(use_pool ? pool : NULL, &W, x, T, y);
                    CHECKF(matmul_close(y, ref, mag, (size_t)T * rows), "bf16 matmul rows %d cols %d T %d pool %d: rel L2 %g",
                           rows, cols, T, use_pool, rel_l2_f32(y, ref, (size_t)T * rows));
                }
                free(w), free(x), free(y), free(ref), free(mag);
            }
    k3c_pool_free(pool);
}

TEST(cpu_bf16_row_is_exact) {
    k3c_rng r = cpu_rng();
    int rows = 5, cols = 37;
    uint16_t w[5 * 37];
    for (int i = 0; i < rows * cols; i++) w[i] = f32_to_bf16((float)k3c_rng_normal(&r));
    k3c_mat W = {w, rows, cols};
    float out[37];
    for (int row = 0; row < rows; row++) {
        poison_f32(out, 37);
        k3c_bf16_row(&W, row, out);
        for (int c = 0; c < cols; c++) CHECK(out[c] == ref_bf16(w[row * cols + c]));
    }
}

/* MXFP4 reference: element c of row r is the E2M1 code in nibble (c & 1) of byte c/2, times 2^(s - 127). */
static double ref_e2m1(int code) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (code & 8 ? -1 : 1) * mag[code & 7];
}

TEST(cpu_matmul_mxfp4_matches_double) {
    k3c_rng r = cpu_rng();
    k3c_pool *pool = k3c_pool_create(2);
    int rows_l[] = {1, 3, 17, 65, 300};
    int cols_l[] = {32, 64, 96, 320, 1024};
    int T_l[] = {1, 3, 9, 17};
    for (size_t ri = 0; ri < sizeof rows_l / sizeof *rows_l; ri++)
        for (size_t ci = 0; ci < sizeof cols_l / sizeof *cols_l; ci++)
            for (size_t ti = 0; ti < sizeof T_l / sizeof *T_l; ti++) {
                int rows = rows_l[ri], cols = cols_l[ci], T = T_l[ti], groups = cols / 32;
                uint8_t *pk = malloc((size_t)rows * cols / 2), *sc = malloc((size_t)rows * groups);
                float *x = fmalloc((size_t)T * cols), *y = fmalloc((size_t)T * rows);
                double *ref = dmalloc((size_t)T * rows), *mag = dmalloc((size_t)T * rows);
                for (size_t i = 0; i < (size_t)rows * cols / 2; i++) pk[i] = (uint8_t)k3c_rng_next(&r);
                /* Scales 2^-10..2^13, and the subnormal 2^-127 (byte 0) on some groups. */
                for (size_t i = 0; i < (size_t)rows * groups; i++) {
                    uint64_t v = k3c_rng_next(&r);
                    sc[i] = v % 17 == 0 ? 0 : (uint8_t)(117 + v % 24);
                }
                fill_normal(&r, x, (size_t)T * cols, 1.0);
                for (int t = 0; t < T; t++)
                    for (int row = 0; row < rows; row++) {
                        double s = 0, m = 0;
                        for (int c = 0; c < cols; c++) {
                            uint8_t b = pk[(size_t)row * cols / 2 + c / 2];
                            int code = c & 1 ? b >> 4 : b & 15;
                            double p = ref_e2m1(code) * ldexp(1.0, sc[(size_t)row * groups + c / 32] - 127) *
                                       x[(size_t)t * cols + c];
                            s += p;
                            m += fabs(p);
                        }
                        ref[(size_t)t * rows + row] = s;
                        mag[(size_t)t * rows + row] = m;
                    }
                k3c_mxfp4_mat W = {pk, sc, rows, cols};
                for (int use_pool = 0; use_pool < 2; use_pool++) {
                    poison_f32(y, (size_t)T * rows);
                    k3c_matmul_mxfp4(use_pool ? pool : NULL, &W, x, T, y);
                    CHECKF(matmul_close(y, ref, mag, (size_t)T * rows), "mxfp4 matmul rows %d cols %d T %d pool %d: rel L2 %g",
                           rows, cols, T, use_pool, rel_l2_f32(y, ref, (size_t)T * rows));
                }
                free(pk), free(sc), free(x), free(y), free(ref), free(mag);
            }
    k3c_pool_free(pool);
}

/* The blocked form of prompt rows (cpu/matmul.c, T >= 8 with a pool) on random shapes: odd row and column
 * counts (leftover 16-column blocks and scalar tails, MXFP4 with an odd group count, rows split into column
 * blocks), T from 1 to 300, one and two threads; bf16 and MXFP4 against the float64 sums. */
TEST(cpu_matmul_blocked_matches_double) {
    k3c_rng r = cpu_rng();
    k3c_pool *pools[2] = {k3c_pool_create(1), k3c_pool_create(2)};
    for (int n = 0; n < 24; n++) {
        /* the last 6: rows wider than one column block (1792), fewer rows and tokens */
        int mx = n % 3 == 2, wide = n >= 18, rows = 1 + (int)(k3c_rng_next(&r) % (wide ? 40 : 150));
        int cols = mx ? 32 * (1 + (int)(k3c_rng_next(&r) % 33) + (wide ? 56 : 0))
                      : 1 + (int)(k3c_rng_next(&r) % 1100) + (wide ? 1792 : 0);
        int T = n < 2 ? (n ? 300 : 8) : 1 + (int)(k3c_rng_next(&r) % (wide ? 60 : 300)), groups = cols / 32;
        uint16_t *w = malloc((size_t)rows * cols * 2);
        uint8_t *pk = malloc((size_t)rows * cols / 2 + 1), *sc = malloc((size_t)rows * groups + 1);
        float *x = fmalloc((size_t)T * cols), *y = fmalloc((size_t)T * rows);
        double *ref = dmalloc((size_t)T * rows), *mag = dmalloc((size_t)T * rows), *wd = dmalloc((size_t)rows * cols);
        if (mx) {
            for (size_t i = 0; i < (size_t)rows * cols / 2; i++) pk[i] = (uint8_t)k3c_rng_next(&r);
            for (size_t i = 0; i < (size_t)rows * groups; i++) {
                uint64_t v = k3c_rng_next(&r);
                sc[i] = v % 17 == 0 ? 0 : (uint8_t)(117 + v % 24);
            }
            for (int row = 0; row < rows; row++)
                for (int c = 0; c < cols; c++) {
                    uint8_t b = pk[(size_t)row * cols / 2 + c / 2];
                    wd[(size_t)row * cols + c] =
                        ref_e2m1(c & 1 ? b >> 4 : b & 15) * ldexp(1.0, sc[(size_t)row * groups + c / 32] - 127);
                }
        } else {
            for (size_t i = 0; i < (size_t)rows * cols; i++) {
                w[i] = f32_to_bf16((float)k3c_rng_normal(&r));
                wd[i] = ref_bf16(w[i]);
            }
        }
        fill_normal(&r, x, (size_t)T * cols, 1.0);
        for (int t = 0; t < T; t++)
            for (int row = 0; row < rows; row++) {
                double s = 0, m = 0;
                for (int c = 0; c < cols; c++) {
                    double p = wd[(size_t)row * cols + c] * x[(size_t)t * cols + c];
                    s += p;
                    m += fabs(p);
                }
                ref[(size_t)t * rows + row] = s;
                mag[(size_t)t * rows + row] = m;
            }
        k3c_mat W = {w, rows, cols};
        k3c_mxfp4_mat Q = {pk, sc, rows, cols};
        for (int pi = 0; pi < 2; pi++) {
            poison_f32(y, (size_t)T * rows);
            if (mx) k3c_matmul_mxfp4(pools[pi], &Q, x, T, y);
            else k3c_matmul_bf16(pools[pi], &W, x, T, y);
            CHECKF(matmul_close(y, ref, mag, (size_t)T * rows), "%s rows %d cols %d T %d threads %d: rel L2 %g",
                   mx ? "mxfp4" : "bf16", rows, cols, T, pi + 1, rel_l2_f32(y, ref, (size_t)T * rows));
        }
        free(w), free(pk), free(sc), free(x), free(y), free(ref), free(mag), free(wd);
    }
    k3c_pool_free(pools[0]);
    k3c_pool_free(pools[1]);
}

/* ---------------------------------------------------------------- bf16 products (k3c_mm.xbf16) */

/* A random bf16 matrix or MXFP4 one as doubles (wd), its bf16 / packed form set in W or Q; x: bf16 values. */
static void dp_case(k3c_rng *r, int mx, int rows, int cols, uint16_t *w, uint8_t *pk, uint8_t *sc, double *wd) {
    int groups = cols / 32;
    if (mx) {
        for (size_t i = 0; i < (size_t)rows * cols / 2; i++) pk[i] = (uint8_t)k3c_rng_next(r);
        for (size_t i = 0; i < (size_t)rows * groups; i++) {
            uint64_t v = k3c_rng_next(r);
            /* 2^-10..2^13, and 2^-127 (subnormal), 2^-126, 2^-125: the decode's two routes meet at 2^-125 */
            sc[i] = v % 17 < 3 ? (uint8_t)(v % 17) : (uint8_t)(117 + v % 24);
        }
        for (int row = 0; row < rows; row++)
            for (int c = 0; c < cols; c++) {
                uint8_t b = pk[(size_t)row * cols / 2 + c / 2];
                wd[(size_t)row * cols + c] =
                    ref_e2m1(c & 1 ? b >> 4 : b & 15) * ldexp(1.0, sc[(size_t)row * groups + c / 32] - 127);
            }
    } else {
        for (size_t i = 0; i < (size_t)rows * cols; i++) {
            w[i] = f32_to_bf16((float)k3c_rng_normal(r));
            wd[i] = ref_bf16(w[i]);
        }
    }
}

/* The bf16 products against the float64 sums. Each output is a sum in f32 of exact products (a bf16 x bf16
 * product is exact in f32) along a path of at most ceil(cols / 32) + 5 roundings (a chain of VDPBF16PS steps,
 * the two chains' sum, a 4-level tree), so |y - sum| <= (ceil(cols / 32) + 6) 2^-24 sum |terms|, plus the
 * terms of MXFP4 weights below 2^-126 that are taken as zero (at most 1.5 2^-125 |x| each). Random shapes
 * (column tails, odd rows, MXFP4 with odd group counts, rows split into column blocks), T from 1 to 300, no
 * pool, one and two threads. */
TEST(cpu_matmul_xbf16_matches_double) {
    k3c_rng r = cpu_rng();
    k3c_pool *pools[3] = {NULL, k3c_pool_create(1), k3c_pool_create(2)};
    for (int n = 0; n < 30; n++) {
        int mx = n % 3 == 2, wide = n >= 24, rows = 1 + (int)(k3c_rng_next(&r) % (wide ? 40 : 150));
        int cols = mx ? 32 * (1 + (int)(k3c_rng_next(&r) % 33) + (wide ? 112 : 0))
                      : 1 + (int)(k3c_rng_next(&r) % 1100) + (wide ? 3584 : 0);
        int T = n < 3 ? (n == 0 ? 1 : n == 1 ? 8 : 300) : 1 + (int)(k3c_rng_next(&r) % (wide ? 40 : 300));
        uint16_t *w = malloc((size_t)rows * cols * 2);
        uint8_t *pk = malloc((size_t)rows * cols / 2 + 1), *sc = malloc((size_t)rows * cols / 32 + 1);
        float *x = fmalloc((size_t)T * cols), *y = fmalloc((size_t)T * rows);
        double *ref = dmalloc((size_t)T * rows), *tol = dmalloc((size_t)T * rows), *wd = dmalloc((size_t)rows * cols);
        dp_case(&r, mx, rows, cols, w, pk, sc, wd);
        for (size_t i = 0; i < (size_t)T * cols; i++) x[i] = bf16_round((float)k3c_rng_normal(&r));
#if defined(__AVX512BF16__) && defined(__AVX512F__)
        double steps = (cols + 31) / 32 + 6;
#else
        double steps = cols + 6; /* the f32 products: the scalar fallback's one running sum at worst */
#endif
        for (int t = 0; t < T; t++)
            for (int row = 0; row < rows; row++) {
                double s = 0, m = 0, flushed = 0;
                for (int c = 0; c < cols; c++) {
                    double wv = wd[(size_t)row * cols + c], p = wv * x[(size_t)t * cols + c];
                    s += p;
                    m += fabs(p);
                    if (wv != 0 && fabs(wv) < 0x1p-126) flushed += fabs(p);
                }
                ref[(size_t)t * rows + row] = s;
                tol[(size_t)t * rows + row] = steps * 0x1p-24 * 1.01 * m + flushed + 1e-35;
            }
        k3c_mat W = {w, rows, cols};
        k3c_mxfp4_mat Q = {pk, sc, rows, cols};
        for (int pi = 0; pi < 3; pi++) {
            poison_f32(y, (size_t)T * rows);
            k3c_mm mm = {.W = mx ? NULL : &W, .Wq = mx ? &Q : NULL, .x = x, .T = T, .y = y, .xbf16 = 1};
            k3c_matmul_batch(pools[pi], &mm, 1);
            for (size_t i = 0; i < (size_t)T * rows; i++)
                CHECKF(fabs(y[i] - ref[i]) <= tol[i], "%s rows %d cols %d T %d threads %d: output %zu = %.9g, sum %.9g, "
                       "bound %.3g", mx ? "mxfp4" : "bf16", rows, cols, T, pi, i, y[i], ref[i], tol[i]);
        }
        free(w), free(pk), free(sc), free(x), free(y), free(ref), free(tol), free(wd);
    }
    for (int pi = 1; pi < 3; pi++) k3c_pool_free(pools[pi]);
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
/* VDPBF16PS per f32 lane as the Intel SDM states it (the odd pair first, then the even one, each product
 * exact), with what cpu/matmul.c's header records of this machine: each product added with one rounding (an
 * FMA), the accumulator and both factors below 2^-126 read as zero (DAZ), a result below 2^-126 stored as
 * zero (FTZ). */
static float emu_daz(float v) { return fabsf(v) < 0x1p-126f ? copysignf(0.0f, v) : v; }

static float emu_dpbf16(float acc, float w1, float x1, float w0, float x0) {
    acc = emu_daz(fmaf(emu_daz(w1), emu_daz(x1), emu_daz(acc)));
    return emu_daz(fmaf(emu_daz(w0), emu_daz(x0), acc));
}

/* y[t, r] in the order cpu/matmul.c's header states: 32-column block b (the last zero-padded) into chain
 * b % 2 of 16 lanes, lane i taking columns 32 b + 2 i + 1 and 32 b + 2 i; the chains added lane by lane; the
 * 16 lanes summed as j + (j + 8), then + 4, + 2, + 1. */
static float emu_dot(const double *w, const float *x, int cols) {
    float acc[2][16] = {{0}}, a[16];
    for (int b = 0; b < (cols + 31) / 32; b++)
        for (int i = 0; i < 16; i++) {
            int c = 32 * b + 2 * i;
            float w0 = c < cols ? (float)w[c] : 0, x0 = c < cols ? x[c] : 0;
            float w1 = c + 1 < cols ? (float)w[c + 1] : 0, x1 = c + 1 < cols ? x[c + 1] : 0;
            acc[b % 2][i] = emu_dpbf16(acc[b % 2][i], w1, x1, w0, x0);
        }
    for (int i = 0; i < 16; i++) a[i] = acc[0][i] + acc[1][i];
    for (int h = 8; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) a[i] = a[i] + a[i + h];
    return a[0];
}
#endif

/* The bf16 products bit for bit: on an AVX512-BF16 build against the emulation above (so the order written in
 * cpu/matmul.c is the one the code runs), elsewhere against the f32 products (xbf16 is then ignored). Inputs
 * spread over 2^-40..2^40 with zeros and bf16 subnormals (DAZ), random shapes, T, threads, rounded or not. */
TEST(cpu_matmul_xbf16_order_bitwise) {
    k3c_rng r = cpu_rng();
    k3c_pool *pools[3] = {NULL, k3c_pool_create(1), k3c_pool_create(2)};
    for (int n = 0; n < 24; n++) {
        int mx = n % 3 == 2, wide = n >= 20, rows = 1 + (int)(k3c_rng_next(&r) % 70);
        int cols = mx ? 32 * (1 + (int)(k3c_rng_next(&r) % 30) + (wide ? 112 : 0))
                      : 1 + (int)(k3c_rng_next(&r) % 900) + (wide ? 3584 : 0);
        int T = 1 + (int)(k3c_rng_next(&r) % (wide ? 12 : 40)), round = n % 2;
        uint16_t *w = malloc((size_t)rows * cols * 2);
        uint8_t *pk = malloc((size_t)rows * cols / 2 + 1), *sc = malloc((size_t)rows * cols / 32 + 1);
        float *x = fmalloc((size_t)T * cols), *y = fmalloc((size_t)T * rows), *e = fmalloc((size_t)T * rows);
        double *wd = dmalloc((size_t)rows * cols);
        /* every fourth bf16 case tiny: products and partial sums around 2^-126, where DAZ / FTZ decide */
        int tiny = !mx && n % 4 == 3, ew = tiny ? -63 : 0, ex = tiny ? -63 : 0, spread = tiny ? 9 : 41;
        dp_case(&r, mx, rows, cols, w, pk, sc, wd);
        if (!mx)
            for (size_t i = 0; i < (size_t)rows * cols; i++) {
                uint64_t v = k3c_rng_next(&r);
                float f = v % 50 == 0 ? 0.0f : ldexpf((float)k3c_rng_normal(&r), ew + (int)(v % spread) - spread / 2);
                if (v % 47 == 1) f = ldexpf((float)k3c_rng_normal(&r), -130); /* a bf16 subnormal */
                w[i] = f32_to_bf16(f);
                wd[i] = ref_bf16(w[i]);
            }
        for (size_t i = 0; i < (size_t)T * cols; i++) {
            uint64_t v = k3c_rng_next(&r);
            float f = v % 50 == 0 ? 0.0f : ldexpf((float)k3c_rng_normal(&r), ex + (int)(v % spread) - spread / 2);
            if (v % 53 == 1) f = ldexpf((float)k3c_rng_normal(&r), -131);
            x[i] = bf16_round(f);
        }
        k3c_mat W = {w, rows, cols};
        k3c_mxfp4_mat Q = {pk, sc, rows, cols};
#if defined(__AVX512BF16__) && defined(__AVX512F__)
        for (int t = 0; t < T; t++)
            for (int row = 0; row < rows; row++) {
                float v = emu_dot(wd + (size_t)row * cols, x + (size_t)t * cols, cols);
                e[(size_t)t * rows + row] = round ? bf16_round(v) : v;
            }
#else
        k3c_mm f32 = {.W = mx ? NULL : &W, .Wq = mx ? &Q : NULL, .x = x, .T = T, .y = e, .round = round};
        k3c_matmul_batch(NULL, &f32, 1);
#endif
        for (int pi = 0; pi < 3; pi++) {
            poison_f32(y, (size_t)T * rows);
            k3c_mm mm = {.W = mx ? NULL : &W, .Wq = mx ? &Q : NULL, .x = x, .T = T, .y = y, .round = round, .xbf16 = 1};
            k3c_matmul_batch(pools[pi], &mm, 1);
            for (size_t i = 0; i < (size_t)T * rows; i++)
                CHECKF(memcmp(&y[i], &e[i], 4) == 0 && y[i] == y[i],
                       "%s rows %d cols %d T %d threads %d round %d: output %zu = %a, expected %a", mx ? "mxfp4" : "bf16",
                       rows, cols, T, pi, round, i, y[i], e[i]);
        }
        free(w), free(pk), free(sc), free(x), free(y), free(e), free(wd);
    }
    for (int pi = 1; pi < 3; pi++) k3c_pool_free(pools[pi]);
}

/* ---------------------------------------------------------------- elementwise */

TEST(cpu_rmsnorm_matches_double) {
    k3c_rng r = cpu_rng();
    int ns[] = {1, 3, 17, 4099};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        int n = ns[i];
        float *x = fmalloc(n), *w = fmalloc(n), *y = fmalloc(n);
        double *ref = dmalloc(n);
        fill_normal(&r, x, n, 3.0);
        fill_normal(&r, w, n, 1.0);
        float eps = 1e-5f;
        double ss = 0;
        for (int j = 0; j < n; j++) ss += (double)x[j] * x[j];
        double rs = 1.0 / sqrt(ss / n + eps);
        for (int j = 0; j < n; j++) ref[j] = x[j] * rs * w[j];
        poison_f32(y, n);
        k3c_rmsnorm(x, w, n, eps, y);
        CHECKF(rel_l2_f32(y, ref, n) < 1e-6, "n %d: %g", n, rel_l2_f32(y, ref, n));
        k3c_rmsnorm(x, w, n, eps, x); /* in place */
        CHECK(rel_l2_f32(x, ref, n) < 1e-6);
        free(x), free(w), free(y), free(ref);
    }
    /* eps inside the root: an all-zero row gives 0, and a tiny row is damped by eps. */
    float z[4] = {0, 0, 0, 1e-4f}, w1[4] = {1, 1, 1, 1}, y[4];
    poison_f32(y, 4);
    k3c_rmsnorm(z, w1, 4, 1e-5f, y);
    CHECK_CLOSE(y[3], 1e-4 / sqrt(1e-8 / 4 + 1e-5), 0, 1e-6);
    CHECK(y[0] == 0.0f);
}

/* The gated activations within a few f32 ulps of float64 (SiLU and SiTU, with and without the linear-part
 * tanh) over ordinary and extreme inputs, special values through, and an element's bits independent of the
 * array length and its position in it (the rows of a prompt and a lone decode token see the same values). */
TEST(cpu_gated_act_accurate_and_position_free) {
    k3c_rng r = cpu_rng();
    enum { N = 4000 };
    static float g[N], u[N], y[N], y1[40], gg[40], uu[40];
    const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-4f, -1e-4f, 0.3f, -0.3f, 20.0f, -20.0f, 90.0f, -90.0f,
                             1e30f, -1e30f, INFINITY, -INFINITY};
    int ns = (int)(sizeof special / sizeof *special);
    for (int i = 0; i < N; i++) {
        double sc = i % 4 == 0 ? 1.0 : i % 4 == 1 ? 6.0 : i % 4 == 2 ? 30.0 : 300.0;
        g[i] = (float)(k3c_rng_normal(&r) * sc);
        u[i] = (float)(k3c_rng_normal(&r) * sc);
    }
    for (int i = 0; i < ns * ns; i++) g[i] = special[i % ns], u[i] = special[i / ns];
    g[N - 1] = NAN, u[N - 2] = NAN;
    k3c_config c;
    memset(&c, 0, sizeof c);
    for (int mode = 0; mode < 3; mode++) {
        c.hidden_act = mode == 0 ? K3C_ACT_SILU : K3C_ACT_SITU;
        c.situ_beta = 4.0f;
        c.situ_linear_beta = mode == 2 ? 25.0f : 0.0f;
        poison_f32(y, N);
        k3c_gated_act(&c, g, u, N, y);
        for (int i = 0; i < N; i++) {
            double gd = g[i], ud = u[i], ref;
            if (mode == 0) ref = gd * ref_sigmoid(gd) * ud;
            else ref = 4.0 * tanh(gd / 4.0) * ref_sigmoid(gd) * (mode == 2 ? 25.0 * tanh(ud / 25.0) : ud);
            if (isnan(gd) || isnan(ud) || isnan(ref)) {
                CHECKF(isnan(y[i]) || !(isnan(gd) || isnan(ud)), "mode %d: NaN input %d gave %g", mode, i, y[i]);
                continue;
            }
            /* the reference's own f32 limits: overflow to inf, underflow below the smallest normal */
            if (fabs(ref) > 3.4e38) {
                CHECKF(isinf(y[i]) && (y[i] > 0) == (ref > 0), "mode %d i %d: %g vs %g", mode, i, y[i], ref);
                continue;
            }
            /* sigmoid(g) below the smallest normal f32 (g < -87) is subnormal: fewer bits in the product */
            double tol = ref_sigmoid(gd) < 1.18e-38 ? 1e-4 : 3e-7;
            CHECKF(fabs(y[i] - ref) <= tol * fabs(ref) + 1e-37, "mode %d i %d (g %g u %g): %.9g vs %.9g", mode, i,
                   g[i], u[i], y[i], ref);
        }
        for (int n = 1; n <= 33; n += 4)
            for (int off = 0; off + n <= 40; off += 7) {
                int src = (int)(k3c_rng_next(&r) % (N - 40));
                for (int k = 0; k < n; k++) gg[off + k] = g[src + k], uu[off + k] = u[src + k];
                poison_f32(y1, 40);
                k3c_gated_act(&c, gg + off, uu + off, n, y1 + off);
                for (int k = 0; k < n; k++)
                    CHECKF(!memcmp(&y1[off + k], &y[src + k], 4) || (isnan(y1[off + k]) && isnan(y[src + k])),
                           "mode %d: element %d alone (n %d, at %d) differs from it in the long array", mode, src + k,
                           n, off + k);
            }
    }
}

TEST(cpu_gated_act_silu_and_situ) {
    k3c_rng r = cpu_rng();
    int n = 1001;
    float *g = fmalloc(n), *u = fmalloc(n), *y = fmalloc(n);
    double *ref = dmalloc(n);
    fill_normal(&r, g, n, 6.0); /* wide enough to reach tanh saturation at beta = 4 */
    fill_normal(&r, u, n, 30.0);
    k3c_config c;
    memset(&c, 0, sizeof c);
    for (int mode = 0; mode < 3; mode++) {
        c.hidden_act = mode == 0 ? K3C_ACT_SILU : K3C_ACT_SITU;
        c.situ_beta = 4.0f;
        c.situ_linear_beta = mode == 2 ? 25.0f : 0.0f;
        for (int i = 0; i < n; i++) {
            double gd = g[i], ud = u[i];
            if (mode == 0)
                ref[i] = gd * ref_sigmoid(gd) * ud;
            else
                ref[i] = 4.0 * tanh(gd / 4.0) * ref_sigmoid(gd) * (mode == 2 ? 25.0 * tanh(ud / 25.0) : ud);
        }
        poison_f32(y, n);
        k3c_gated_act(&c, g, u, n, y);
        for (int i = 0; i < n; i++) CHECKF(fabs(y[i] - ref[i]) <= 1e-5 * (1 + fabs(ref[i])), "mode %d i %d: %g vs %g", mode, i, y[i], ref[i]);
    }
    free(g), free(u), free(y), free(ref);
}

/* ---------------------------------------------------------------- KDA: conv, gate, norms */

TEST(cpu_kda_conv_window_advances) {
    k3c_rng r = cpu_rng();
    int Ws[] = {2, 4};
    int splits[][4] = {{1, 1, 1, 6}, {3, 6, 0, 0}, {2, 1, 5, 1}, {9, 0, 0, 0}};
    for (size_t wi = 0; wi < 2; wi++) {
        int W = Ws[wi], C = 17, T = 9, h = W - 1;
        float *taps = fmalloc((size_t)C * W), *x = fmalloc((size_t)T * C), *win0 = fmalloc((size_t)h * C);
        float *win = fmalloc((size_t)h * C), *out = fmalloc((size_t)T * C);
        double *ref = dmalloc((size_t)T * C);
        fill_normal(&r, taps, (size_t)C * W, 0.5);
        fill_normal(&r, x, (size_t)T * C, 1.0);
        fill_normal(&r, win0, (size_t)h * C, 1.0);
        /* Reference over the concatenated sequence [window ; x]: tap W-1 on the current token. */
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int j = 0; j < W; j++) {
                    int pos = t + j; /* index into [window ; x] of input t - (W-1) + j */
                    double v = pos < h ? win0[(size_t)pos * C + c] : x[(size_t)(pos - h) * C + c];
                    s += taps[(size_t)c * W + j] * v;
                }
                ref[(size_t)t * C + c] = s * ref_sigmoid(s);
            }
        for (size_t si = 0; si < sizeof splits / sizeof *splits; si++) {
            memcpy(win, win0, (size_t)h * C * sizeof(float));
            poison_f32(out, (size_t)T * C);
            int t0 = 0;
            for (int k = 0; k < 4 && splits[si][k]; k++) {
                k3c_kda_conv(x + (size_t)t0 * C, splits[si][k], C, W, taps, win, out + (size_t)t0 * C);
                t0 += splits[si][k];
            }
            CHECK(t0 == T);
            CHECKF(rel_l2_f32(out, ref, (size_t)T * C) < 1e-6, "W %d split %zu: %g", W, si, rel_l2_f32(out, ref, (size_t)T * C));
            for (int j = 0; j < h; j++)
                for (int c = 0; c < C; c++) CHECK(win[(size_t)j * C + c] == x[(size_t)(T - h + j) * C + c]);
        }
        free(taps), free(x), free(win0), free(win), free(out), free(ref);
    }
}

TEST(cpu_kda_gate_both_forms) {
    k3c_rng r = cpu_rng();
    k3c_config c;
    memset(&c, 0, sizeof c);
    c.kda_num_heads = 3;
    c.kda_head_dim = 5;
    int H = 3, dk = 5, P = 15, T = 3;
    float a_log[3], dt[15], f[45], g[45];
    fill_normal(&r, a_log, H, 1.0);
    fill_normal(&r, dt, P, 1.0);
    fill_normal(&r, f, (size_t)T * P, 4.0);
    f[0] = 25.0f - dt[0];     /* softplus linear branch (x > 20) */
    f[1] = 19.5f - dt[1];     /* just below the threshold */
    f[2] = -30.0f - dt[2];    /* very negative: softplus ~ e^-30 */
    for (int form = 0; form < 2; form++) {
        c.kda_has_lower_bound = form;
        c.kda_gate_lower_bound = -5.0f;
        poison_f32(g, 45);
        k3c_kda_gate(&c, a_log, dt, f, T, g);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < P; i++) {
                double A = exp((double)a_log[i / dk]), xv = (double)f[t * P + i] + dt[i], ref;
                if (form)
                    ref = -5.0 * ref_sigmoid(A * xv);
                else
                    ref = -A * (xv > 20 ? xv : log1p(exp(xv)));
                /* f32 rounding of the argument A x is amplified by |A x| in exp. */
                CHECKF(fabs(g[t * P + i] - ref) <= 1e-6 * (2 + fabs(A * xv)) * fabs(ref) + 1e-30, "form %d t %d i %d: %g vs %g", form, t, i, g[t * P + i], ref);
                CHECK(g[t * P + i] <= 0.0f);
                if (form) CHECK(g[t * P + i] >= -5.0f);
            }
    }
}

TEST(cpu_kda_qk_norm_and_gated_norm) {
    k3c_rng r = cpu_rng();
    int T = 3, H = 2, dk = 33, n = T * H * dk;
    float *q = fmalloc(n), *k = fmalloc(n), *q0 = fmalloc(n), *k0 = fmalloc(n);
    fill_normal(&r, q0, n, 2.0);
    fill_normal(&r, k0, n, 2.0);
    for (int i = 0; i < dk; i++) q0[i] = 1e-5f; /* a near-zero row: the 1e-6 inside the root dominates */
    memcpy(q, q0, n * sizeof(float));
    memcpy(k, k0, n * sizeof(float));
    k3c_kda_qk_norm(q, k, T, H, dk);
    for (int row = 0; row < T * H; row++) {
        double sq = 0, sk = 0;
        for (int d = 0; d < dk; d++) {
            sq += (double)q0[row * dk + d] * q0[row * dk + d];
            sk += (double)k0[row * dk + d] * k0[row * dk + d];
        }
        for (int d = 0; d < dk; d++) {
            CHECK_CLOSE(q[row * dk + d], q0[row * dk + d] / sqrt(sq + 1e-6) / sqrt((double)dk), 1e-9, 1e-6);
            CHECK_CLOSE(k[row * dk + d], k0[row * dk + d] / sqrt(sk + 1e-6), 1e-9, 1e-6);
        }
    }
    /* Gated RMSNorm with sigmoid (K3) and silu (transformers' Kimi Linear) gates. */
    int dv = 19, m = T * H * dv;
    float *o = fmalloc(m), *z = fmalloc(m), *w = fmalloc(dv), *y = fmalloc(m);
    double *ref = dmalloc(m);
    fill_normal(&r, o, m, 2.0);
    fill_normal(&r, z, m, 2.0);
    fill_normal(&r, w, dv, 1.0);
    for (int silu = 0; silu < 2; silu++) {
        for (int row = 0; row < T * H; row++) {
            double ss = 0;
            for (int e = 0; e < dv; e++) ss += (double)o[row * dv + e] * o[row * dv + e];
            double rs = 1.0 / sqrt(ss / dv + 1e-5);
            for (int e = 0; e < dv; e++) {
                double zz = z[row * dv + e], gate = silu ? zz * ref_sigmoid(zz) : ref_sigmoid(zz);
                ref[row * dv + e] = o[row * dv + e] * rs * w[e] * gate;
            }
        }
        poison_f32(y, m);
        k3c_kda_gated_norm(o, z, w, T, H, dv, 1e-5f, silu, y);
        CHECKF(rel_l2_f32(y, ref, m) < 1e-6, "silu %d: %g", silu, rel_l2_f32(y, ref, m));
    }
    free(q), free(k), free(q0), free(k0), free(o), free(z), free(w), free(y), free(ref);
}

/* ---------------------------------------------------------------- KDA: delta rule */

typedef struct kda_case {
    int T, H, dk, dv;
    float *q, *k, *v, *g, *beta, *s0; /* q normalised and scaled, k normalised; s0 [H, dk, dv] */
} kda_case;

/* Random inputs; decay: g in [glo, ghi] (log space, <= 0). */
static void kda_case_make(kda_case *c, k3c_rng *r, int T, int H, int dk, int dv, double glo, double ghi) {
    c->T = T, c->H = H, c->dk = dk, c->dv = dv;
    size_t nk = (size_t)T * H * dk, nv = (size_t)T * H * dv;
    c->q = fmalloc(nk), c->k = fmalloc(nk), c->v = fmalloc(nv), c->g = fmalloc(nk);
    c->beta = fmalloc((size_t)T * H), c->s0 = fmalloc((size_t)H * dk * dv);
    fill_normal(r, c->q, nk, 1.0);
    fill_normal(r, c->k, nk, 1.0);
    fill_normal(r, c->v, nv, 1.0);
    fill_normal(r, c->s0, (size_t)H * dk * dv, 0.3);
    for (size_t row = 0; row < (size_t)T * H; row++) {
        double sq = 0, sk = 0;
        for (int d = 0; d < dk; d++) sq += (double)c->q[row * dk + d] * c->q[row * dk + d];
        for (int d = 0; d < dk; d++) sk += (double)c->k[row * dk + d] * c->k[row * dk + d];
        for (int d = 0; d < dk; d++) c->q[row * dk + d] = (float)(c->q[row * dk + d] / sqrt(sq) / sqrt((double)dk));
        for (int d = 0; d < dk; d++) c->k[row * dk + d] = (float)(c->k[row * dk + d] / sqrt(sk));
        c->beta[row] = (float)uniform(r, 0.05, 0.95);
    }
    for (size_t i = 0; i < nk; i++) c->g[i] = (float)uniform(r, glo, ghi);
}

static void kda_case_free(kda_case *c) {
    free(c->q), free(c->k), free(c->v), free(c->g), free(c->beta), free(c->s0);
}

/* The recurrence of spec §2.2 step 7 in double: decay, delta correction, output from the updated state. */
static void ref_kda(const kda_case *c, double *S, double *o, double *states) {
    int H = c->H, dk = c->dk, dv = c->dv;
    double *u = dmalloc(dv);
    for (int t = 0; t < c->T; t++) {
        for (int h = 0; h < H; h++) {
            size_t rk = (size_t)t * H + h;
            const float *q = c->q + rk * dk, *k = c->k + rk * dk, *v = c->v + rk * dv, *g = c->g + rk * dk;
            double *Sh = S + (size_t)h * dk * dv;
            for (int d = 0; d < dk; d++)
                for (int e = 0; e < dv; e++) Sh[d * dv + e] *= exp((double)g[d]);
            for (int e = 0; e < dv; e++) {
                double sk = 0;
                for (int d = 0; d < dk; d++) sk += Sh[d * dv + e] * k[d];
                u[e] = c->beta[rk] * (v[e] - sk);
            }
            for (int d = 0; d < dk; d++)
                for (int e = 0; e < dv; e++) Sh[d * dv + e] += k[d] * u[e];
            for (int e = 0; e < dv; e++) {
                double s = 0;
                for (int d = 0; d < dk; d++) s += Sh[d * dv + e] * q[d];
                o[rk * dv + e] = s;
            }
        }
        if (states) memcpy(states + (size_t)t * H * dk * dv, S, (size_t)H * dk * dv * sizeof(double));
    }
    free(u);
}

TEST(cpu_kda_recurrent_matches_double_and_steps) {
    k3c_rng r = cpu_rng();
    int Ts[] = {1, 3, 9};
    for (size_t ti = 0; ti < 3; ti++) {
        kda_case c;
        int T = Ts[ti], H = 3, dk = 16, dv = 12; /* dk != dv catches a transposed state */
        kda_case_make(&c, &r, T, H, dk, dv, -1.0, -0.01);
        size_t hs = (size_t)H * dk * dv;
        double *S = dmalloc(hs), *o_ref = dmalloc((size_t)T * H * dv), *st_ref = dmalloc(hs * T);
        for (size_t i = 0; i < hs; i++) S[i] = c.s0[i];
        ref_kda(&c, S, o_ref, st_ref);

        float *state = fmalloc(hs), *o = fmalloc((size_t)T * H * dv), *states = fmalloc(hs * T);
        memcpy(state, c.s0, hs * sizeof(float));
        poison_f32(o, (size_t)T * H * dv);
        poison_f32(states, hs * T);
        k3c_kda_recurrent(state, c.q, c.k, c.v, c.g, c.beta, T, H, dk, dv, o, states);
        double eo = rel_l2_f32(o, o_ref, (size_t)T * H * dv), es = rel_l2_f32(state, S, hs);
        CHECKF(eo < 1e-5 && es < 1e-5, "T %d: o %g state %g", T, eo, es);
        for (int t = 0; t < T; t++) CHECK(rel_l2_f32(states + t * hs, st_ref + t * hs, hs) < 1e-5);

        /* The per-token copies equal the states of T single-token calls, bit for bit. */
        float *st1 = fmalloc(hs), *o1 = fmalloc((size_t)H * dv);
        memcpy(st1, c.s0, hs * sizeof(float));
        for (int t = 0; t < T; t++) {
            size_t ok = (size_t)t * H * dk, ov = (size_t)t * H * dv;
            poison_f32(o1, (size_t)H * dv);
            k3c_kda_recurrent(st1, c.q + ok, c.k + ok, c.v + ov, c.g + ok, c.beta + t * H, 1, H, dk, dv, o1, NULL);
            CHECK(memcmp(st1, states + t * hs, hs * sizeof(float)) == 0);
            CHECK(memcmp(o1, o + ov, (size_t)H * dv * sizeof(float)) == 0);
        }
        free(S), free(o_ref), free(st_ref), free(state), free(o), free(states), free(st1), free(o1);
        kda_case_free(&c);
    }
}

TEST(cpu_kda_chunked_equals_recurrent) {
    k3c_rng r = cpu_rng();
    int Ts[] = {1, 63, 64, 65, 130};
    /* Strong decay: g near the -5 lower bound, so the cumulative decay over a 64-token chunk reaches ~-320
     * (e^-320 underflows f32); weak decay: the state remembers the whole sequence. */
    double glo[] = {-5.0, -0.02}, ghi[] = {-4.9, -0.001};
    int chunks[] = {64, 64, 16};
    for (size_t ti = 0; ti < 5; ti++)
        for (int dec = 0; dec < 2; dec++)
            for (int ci = 0; ci < 3; ci++) {
                if (ci == 2 && Ts[ti] != 65) continue; /* a non-default chunk once */
                kda_case c;
                int T = Ts[ti], H = 2, dk = 32, dv = 24, C = chunks[ci];
                kda_case_make(&c, &r, T, H, dk, dv, glo[dec], ghi[dec]);
                size_t hs = (size_t)H * dk * dv, no = (size_t)T * H * dv;
                double *S = dmalloc(hs), *o_ref = dmalloc(no);
                for (size_t i = 0; i < hs; i++) S[i] = c.s0[i];
                ref_kda(&c, S, o_ref, NULL);
                float *st_r = fmalloc(hs), *st_c = fmalloc(hs), *o_r = fmalloc(no), *o_c = fmalloc(no);
                memcpy(st_r, c.s0, hs * sizeof(float));
                memcpy(st_c, c.s0, hs * sizeof(float));
                poison_f32(o_r, no);
                poison_f32(o_c, no);
                k3c_kda_recurrent(st_r, c.q, c.k, c.v, c.g, c.beta, T, H, dk, dv, o_r, NULL);
                CHECK_OK(k3c_kda_chunked(st_c, c.q, c.k, c.v, c.g, c.beta, T, H, dk, dv, ci == 1 ? 0 : C, o_c));
                double e_oc = rel_l2_f32(o_c, o_ref, no), e_sc = rel_l2_f32(st_c, S, hs);
                double e_or = rel_l2_f32(o_r, o_ref, no), e_rc = rel_l2_f32f32(o_c, o_r, no);
                CHECKF(e_oc < 1e-5 && e_sc < 1e-5 && e_or < 1e-5 && e_rc < 1e-5,
                       "T %d decay %d chunk %d: chunked o %g state %g, recurrent o %g, chunked vs recurrent %g", T,
                       dec, C, e_oc, e_sc, e_or, e_rc);
                free(S), free(o_ref), free(st_r), free(st_c), free(o_r), free(o_c);
                kda_case_free(&c);
            }
}

/* ---------------------------------------------------------------- MLA */

TEST(cpu_mla_attend_matches_double) {
    k3c_rng r = cpu_rng();
    int Tqs[] = {1, 3, 9}, pasts[] = {0, 5, 130};
    int Hm = 3, kv = 16, rope = 8, Dq = kv + rope;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            int Tq = Tqs[a], np = pasts[b], n = np + Tq;
            float *q = fmalloc((size_t)Tq * Hm * Dq), *lat = fmalloc((size_t)n * Dq), *o = fmalloc((size_t)Tq * Hm * kv);
            double *ref = dmalloc((size_t)Tq * Hm * kv), *p = dmalloc(n);
            fill_normal(&r, q, (size_t)Tq * Hm * Dq, 3.0);
            fill_normal(&r, lat, (size_t)n * Dq, 1.0);
            /* A large scale makes raw scores ~100s: exp overflows f32 unless the max is subtracted. */
            float scale = b == 2 ? 10.0f : 1.0f / sqrtf(24.0f);
            for (int i = 0; i < Tq; i++)
                for (int h = 0; h < Hm; h++) {
                    const float *qv = q + ((size_t)i * Hm + h) * Dq;
                    int m = np + i + 1;
                    double mx = -INFINITY, sum = 0;
                    for (int t = 0; t < m; t++) {
                        double s = 0;
                        for (int d = 0; d < Dq; d++) s += (double)qv[d] * lat[(size_t)t * Dq + d];
                        p[t] = s * scale;
                        mx = fmax(mx, p[t]);
                    }
                    for (int t = 0; t < m; t++) sum += p[t] = exp(p[t] - mx);
                    for (int e = 0; e < kv; e++) {
                        double s = 0;
                        for (int t = 0; t < m; t++) s += p[t] * lat[(size_t)t * Dq + e];
                        ref[((size_t)i * Hm + h) * kv + e] = s / sum;
                    }
                }
            poison_f32(o, (size_t)Tq * Hm * kv);
            k3c_mla_attend(q, Tq, Hm, kv, rope, lat, np, scale, o);
            double e = rel_l2_f32(o, ref, (size_t)Tq * Hm * kv);
            /* With scale 10 a score error of 1e-6 relative is ~1e-4 absolute inside exp. */
            CHECKF(e < (b == 2 ? 1e-4 : 1e-5), "Tq %d n_past %d: rel L2 %g", Tq, np, e);
            free(q), free(lat), free(o), free(ref), free(p);
        }
}

/* ---------------------------------------------------------------- AttnRes */

TEST(cpu_attnres_mix_matches_double) {
    k3c_rng r = cpu_rng();
    int ns[] = {1, 2, 9}, Ds[] = {1, 7, 100};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            int n = ns[a], D = Ds[b];
            float *src = fmalloc((size_t)n * D), *proj = fmalloc(D), *norm = fmalloc(D), *out = fmalloc(D);
            const float *ptr[9];
            double *ref = dmalloc(D), s[9];
            fill_normal(&r, src, (size_t)n * D, 2.0);
            fill_normal(&r, proj, D, 1.0);
            fill_normal(&r, norm, D, 1.0);
            for (int j = 0; j < n; j++) ptr[j] = src + (size_t)j * D;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                double ss = 0, dot = 0;
                for (int d = 0; d < D; d++) {
                    ss += (double)ptr[j][d] * ptr[j][d];
                    dot += (double)ptr[j][d] * norm[d] * proj[d];
                }
                s[j] = dot / sqrt(ss / D + 1e-5);
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < n; j++) sum += s[j] = exp(s[j] - mx);
            /* the error bound scales with the terms, not with their sum: at D = 1 a weighted sum of 9 scalars
             * of both signs can cancel to near 0, and a relative error against it measures the cancellation
             * (seed 65358313353575: 1.5e-5) */
            double err2 = 0, mag2 = 0;
            for (int d = 0; d < D; d++) {
                double mag = 0;
                ref[d] = 0;
                for (int j = 0; j < n; j++) {
                    ref[d] += s[j] / sum * ptr[j][d];
                    mag += s[j] / sum * fabs(ptr[j][d]);
                }
                mag2 += mag * mag;
            }
            poison_f32(out, D);
            k3c_attnres_mix(ptr, n, D, proj, norm, 1e-5f, out);
            for (int d = 0; d < D; d++) err2 += ((double)out[d] - ref[d]) * ((double)out[d] - ref[d]);
            CHECKF(out[0] == out[0] && sqrt(err2) < 1e-5 * sqrt(mag2), "n %d D %d: error %g of term size %g", n, D,
                   sqrt(err2), sqrt(mag2));
            if (n == 1) CHECK(memcmp(out, src, (size_t)D * sizeof(float)) == 0); /* a single source passes exactly */
            /* out may be the last source (the partial prefix). */
            k3c_attnres_mix(ptr, n, D, proj, norm, 1e-5f, src + (size_t)(n - 1) * D);
            err2 = 0;
            for (int d = 0; d < D; d++) {
                double e = (double)src[(size_t)(n - 1) * D + d] - ref[d];
                err2 += e * e;
            }
            CHECK(sqrt(err2) < 1e-5 * sqrt(mag2));
            free(src), free(proj), free(norm), free(out), free(ref);
        }
}

/* ---------------------------------------------------------------- router */

typedef struct ref_item {
    double v;
    int id;
} ref_item;

static int ref_item_cmp(const void *a, const void *b) {
    const ref_item *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

/* Spec §5.3 / transformers' KimiMoEGate in double, with ties to the lower id. */
/* margin (may be NULL): the k-th selection score minus the (k+1)-th among the kept groups, and the last kept
 * group's score minus the first dropped one's; the smaller (k3c_route_margin's contract, in double). */
static void ref_route(const k3c_config *c, const float *logits, const float *bias, int *idx, double *w,
                      double *margin) {
    int E = c->num_experts, k = c->num_experts_per_token, G = c->num_expert_group;
    double *score = dmalloc(E);
    ref_item *sel = malloc((size_t)E * sizeof *sel), *tmp = malloc((size_t)E * sizeof *tmp);
    if (c->router_sigmoid) {
        for (int e = 0; e < E; e++) score[e] = ref_sigmoid(logits[e]);
    } else {
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, logits[e]);
        for (int e = 0; e < E; e++) sum += score[e] = exp(logits[e] - mx);
        for (int e = 0; e < E; e++) score[e] /= sum;
    }
    for (int e = 0; e < E; e++) sel[e] = (ref_item){score[e] + (c->use_correction_bias && bias ? bias[e] : 0), e};
    if (margin) *margin = INFINITY;
    if (c->use_grouped_topk && G > 1) {
        int per = E / G;
        ref_item *gs = malloc((size_t)G * sizeof *gs);
        for (int g = 0; g < G; g++) {
            memcpy(tmp, sel + g * per, (size_t)per * sizeof *tmp);
            qsort(tmp, per, sizeof *tmp, ref_item_cmp);
            gs[g] = (ref_item){tmp[0].v + (per > 1 ? tmp[1].v : 0), g};
        }
        qsort(gs, G, sizeof *gs, ref_item_cmp);
        if (margin) *margin = c->topk_group < G ? gs[c->topk_group - 1].v - gs[c->topk_group].v : INFINITY;
        for (int rank = c->topk_group; rank < G; rank++)
            for (int e = gs[rank].id * per; e < (gs[rank].id + 1) * per; e++) sel[e].v = -INFINITY;
        free(gs);
    }
    qsort(sel, E, sizeof *sel, ref_item_cmp);
    if (margin && k < E && sel[k].v > -INFINITY && sel[k - 1].v - sel[k].v < *margin) *margin = sel[k - 1].v - sel[k].v;
    double sum = 0;
    for (int i = 0; i < k; i++) sum += score[sel[i].id];
    for (int i = 0; i < k; i++) {
        idx[i] = sel[i].id;
        w[i] = (c->moe_renormalize ? score[idx[i]] / (sum + 1e-20) : score[idx[i]]) * c->routed_scaling_factor;
    }
    free(score), free(sel), free(tmp);
}

static void router_config(k3c_config *c, int E, int k, int sigmoid, int bias, int G, int topk_group, int renorm,
                          float factor) {
    memset(c, 0, sizeof *c);
    c->num_experts = E, c->num_experts_per_token = k, c->router_sigmoid = sigmoid, c->use_correction_bias = bias;
    c->use_grouped_topk = G > 1, c->num_expert_group = G, c->topk_group = topk_group;
    c->moe_renormalize = renorm, c->routed_scaling_factor = factor;
}

TEST(cpu_router_matches_reference) {
    k3c_rng r = cpu_rng();
    struct { int E, k, sig, bias, G, tg, renorm; float f; } cases[] = {
        {64, 6, 1, 1, 1, 1, 1, 2.446f}, {896, 16, 1, 1, 1, 1, 1, 1.0f}, {64, 8, 1, 1, 8, 3, 1, 1.0f},
        {60, 4, 0, 0, 1, 1, 1, 1.0f},   {32, 5, 0, 1, 4, 2, 0, 1.5f},   {16, 16, 1, 1, 1, 1, 1, 1.0f},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int rep = 0; rep < 20; rep++) {
            k3c_config c;
            router_config(&c, cases[ci].E, cases[ci].k, cases[ci].sig, cases[ci].bias, cases[ci].G, cases[ci].tg,
                          cases[ci].renorm, cases[ci].f);
            int E = c.num_experts, k = c.num_experts_per_token;
            float *logits = fmalloc(E), *bias = fmalloc(E), wt[16];
            int idx[16], ridx[16];
            double rw[16];
            fill_normal(&r, logits, E, 2.0);
            fill_normal(&r, bias, E, 0.1);
            if (rep % 2) /* ties: many equal logits and biases */
                for (int e = 0; e < E; e++) logits[e] = (float)(e % 3), bias[e] = 0.0f;
            poison_f32(wt, 16);
            k3c_route(&c, logits, bias, idx, wt);
            ref_route(&c, logits, bias, ridx, rw, NULL);
            for (int i = 0; i < k; i++) {
                CHECKF(idx[i] == ridx[i], "case %zu rep %d: slot %d expert %d, expected %d", ci, rep, i, idx[i], ridx[i]);
                CHECK_CLOSE(wt[i], rw[i], 1e-7, 1e-5);
            }
            free(logits), free(bias);
        }
}

/* k3c_route_margin against the reference's margin (double), and its meaning: moving the best unselected
 * expert's logit up by a little more than the margin (in score units) changes the selection, by a little
 * less does not (ungrouped sigmoid cases, where the score is monotone in the logit). */
TEST(cpu_router_margin) {
    k3c_rng r = cpu_rng();
    struct { int E, k, sig, bias, G, tg; } cases[] = {
        {64, 6, 1, 1, 1, 1}, {896, 16, 1, 1, 1, 1}, {64, 8, 1, 1, 8, 3}, {60, 4, 0, 0, 1, 1}, {32, 5, 0, 1, 4, 2},
        {16, 16, 1, 1, 1, 1}, {32, 4, 1, 0, 1, 1},
    };
    int flips_checked = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int rep = 0; rep < 20; rep++) {
            k3c_config c;
            router_config(&c, cases[ci].E, cases[ci].k, cases[ci].sig, cases[ci].bias, cases[ci].G, cases[ci].tg, 1,
                          1.0f);
            int E = c.num_experts, k = c.num_experts_per_token;
            float *logits = fmalloc(E), *bias = fmalloc(E);
            int ridx[16];
            double rw[16], ref;
            fill_normal(&r, logits, E, 2.0);
            fill_normal(&r, bias, E, 0.1);
            float m = k3c_route_margin(&c, logits, bias);
            ref_route(&c, logits, bias, ridx, rw, &ref);
            CHECKF(!isnan(m) && m >= 0.0f, "case %zu rep %d: margin %g", ci, rep, m);
            if (isinf(ref)) CHECKF(isinf(m), "case %zu rep %d: margin %g, expected none", ci, rep, m);
            else CHECK_CLOSE(m, ref, 1e-6, 0);
            if (cases[ci].sig && cases[ci].G == 1 && k < E && m > 1e-4f) {
                /* the best unselected expert: the reference's k-th pick after a lift of its score */
                int idx[16], idx2[16];
                float wt[16];
                k3c_route(&c, logits, bias, idx, wt);
                int out = -1;
                float best = -INFINITY;
                for (int e = 0; e < E; e++) {
                    int chosen = 0;
                    for (int i = 0; i < k; i++) chosen |= idx[i] == e;
                    float v = 1.0f / (1.0f + expf(-logits[e])) + (c.use_correction_bias ? bias[e] : 0.0f);
                    if (!chosen && v > best) best = v, out = e;
                }
                float s0 = 1.0f / (1.0f + expf(-logits[out]));
                if (s0 + 1.05 * m > 0.999) goto next; /* a score the sigmoid cannot reach precisely */
                for (int side = 0; side < 2; side++) {
                    double target = s0 + m * (side ? 1.05 : 0.95); /* the score just over / under the boundary */
                    float saved = logits[out];
                    logits[out] = (float)log(target / (1.0 - target));
                    k3c_route(&c, logits, bias, idx2, wt);
                    int in = 0;
                    for (int i = 0; i < k; i++) in |= idx2[i] == out;
                    CHECKF(in == side, "case %zu rep %d: expert %d %s the selection after a lift of %.2f margins",
                           ci, rep, out, in ? "entered" : "stayed out of", side ? 1.05 : 0.95);
                    logits[out] = saved;
                }
                flips_checked++;
            }
        next:
            free(logits), free(bias);
        }
    CHECK(flips_checked >= 20);
}

TEST(cpu_router_grouped_selection) {
    /* 4 groups of 4. The single best expert (id 0) sits in a group whose second best is poor, so by the
     * top-2 sum its group loses to groups 1 and 2 with topk_group = 2, and expert 0 must not be chosen. */
    k3c_config c;
    router_config(&c, 16, 3, 1, 1, 4, 2, 1, 1.0f);
    float logits[16], bias[16] = {0};
    float v[16] = {5, -5, -5, -5, 2, 2, 2, -5, 1.5f, 1.5f, -5, -5, 1, 1, 1, 1};
    memcpy(logits, v, sizeof v);
    int idx[3];
    float w[3];
    poison_f32(w, 3);
    k3c_route(&c, logits, bias, idx, w);
    CHECK(idx[0] == 4 && idx[1] == 5 && idx[2] == 6); /* three equal scores: lower ids first */
    for (int i = 0; i < 3; i++) CHECK_CLOSE(w[i], 1.0 / 3.0, 0, 1e-6);
    /* The correction bias steers selection but not weights: lift group 3 and expert 15 above the rest. */
    bias[12] = bias[13] = 0.6f, bias[15] = 0.7f;
    k3c_route(&c, logits, bias, idx, w);
    CHECK(idx[0] == 15 && idx[1] == 12 && idx[2] == 13);
    double s1 = 1 / (1 + exp(-1.0));
    for (int i = 0; i < 3; i++) CHECK_CLOSE(w[i], s1 / (3 * s1), 0, 1e-6);
}
