/* Matrix products y[t, r] = sum_c W[r, c] * x[t, c] with bf16 or MXFP4 weights and f32 activations, multiplied
 * in bf16 (VDPBF16PS) where x holds bf16 values (k3c_mm.xbf16, every product of the bf16 forward) and the
 * build targets AVX512-BF16, in f32 FMAs elsewhere (the f32 diagnostic, the MLA's f32 o_lat, other builds).
 *
 * Decode (T = 1) is bound by the weight stream, so the loops read each weight byte exactly once per call:
 * the pool splits the rows into units, a thread takes a unit of rows, and for that unit runs over all tokens
 * in register tiles of (rows x tokens) accumulators. While the token loop runs, the unit's rows stay in
 * L1/L2, so prefill does not re-stream the matrix from memory per token. Prompt rows (T >= 8, AVX-512) take
 * the blocked forms below: the tokens packed per tile (f32, or bf16 for the bf16 products), the unit's rows
 * in L2 (widened once into an f32 panel for the f32 products; MXFP4 decoded once into a bf16 panel for the
 * bf16 ones), compute-bound tiles; the pool still splits only the rows (output columns), never K.
 *
 * Batch invariance: every output y[t, r] is computed with one fixed sequence of operations that depends only
 * on W's row r, x's row t, cols and xbf16, never on T, on the tile a token lands in, or on the thread. So a
 * token's outputs are bit-identical whether it is decoded alone or inside a batched / verify step.
 *   bf16 products (xbf16 on an AVX512-BF16 build; bf16 and MXFP4 weights): x converted to bf16 (exact), the
 *     weights as bf16 (MXFP4: e2m1 * 2^(s-127), exact, or zero below 2^-126). 32-column block b, columns
 *     [32 b, 32 b + 32) (the last one zero-padded), goes to chain b % 2, a 16-lane f32 accumulator from +0,
 *     by one VDPBF16PS: lane i adds the product of column 32 b + 2 i + 1, then that of column 32 b + 2 i,
 *     each product exact and added with one rounding (an FMA), the accumulator and both factors read as zero
 *     below 2^-126 (DAZ), each of the two results stored as zero below 2^-126 (FTZ). Then a = chain 0 +
 *     chain 1 lane by lane, and the lanes summed as a[j] + a[j + 8] (j < 8), then + [j + 4], + [j + 2],
 *     + [j + 1] (dp_hsum; plain f32 adds, subnormals kept). What VDPBF16PS does here was measured on this
 *     machine (AMD EPYC, Zen 5, 2026-12-02): on 32 M random lanes (exponents within +-30) the result equals
 *     (acc + p_odd) + p_even rounded after each add, bit for bit, and neither (acc + p_even) + p_odd nor
 *     acc + (p_even + p_odd) nor one rounding of the three-term sum; on edge cases, the products are exact
 *     (2^127 * 2 added to -2^127 gives 2^127, 2^-126 * 0.5 added to 2^-126 gives 1.5 2^-126), a subnormal
 *     accumulator or factor reads as zero, and a subnormal intermediate (1.5 2^-126 - 2^-126) is flushed
 *     before the second product is added. tests/test_cpu_ops.c (cpu_matmul_xbf16_order_bitwise) holds the
 *     code to that emulation, tiny inputs included, for whoever writes one elsewhere.
 *   f32 products (xbf16 = 0, or a build without AVX512-BF16, which ignores xbf16):
 *   bf16 (AVX-512): four 16-lane accumulators, accumulator k takes columns [64i + 16k, 64i + 16k + 16) for
 *     i = 0, 1, ...; the remaining full 16-column blocks go to accumulator 0; then (a0 + a1) + (a2 + a3),
 *     _mm512_reduce_add_ps, and the last cols % 16 products added one by one (fmaf).
 *   bf16 (AVX2): the same with 8-lane accumulators (32-column stride) and a fixed horizontal sum.
 *   MXFP4 (AVX-512): per 32-column group g, the 16 even columns go to accumulator lo[g % 2] and the 16 odd
 *     ones to hi[g % 2], weight = e2m1 * 2^(s-127) exactly; then reduce((lo0 + lo1) + (hi0 + hi1)).
 *     (AVX2: four 8-lane pieces alternating between two accumulators, see mx_tile.)
 *   scalar fallback: one running sum per output in column order.
 * The blocked forms (prompt rows) perform exactly these sequences (see their comments). T = 1 takes the
 * one-token tile of the same code, so decode pays nothing for this: a single sequential stream per row with
 * four independent FMA chains, or two VDPBF16PS chains (measured best on this machine; interleaving 2 or 4
 * adjacent rows lost 25-50% of the bandwidth); MXFP4 rows in the bf16 products go two at a time from the two
 * halves of a range (two streams, dp_decode_mx), since one row's two chains leave its decode latency-bound.
 *
 * Checking the fallbacks by hand (they are not what -march=native builds):
 *   cc -std=gnu11 -O2 -Isrc -Iinclude -march=native -mno-avx512bf16 -c src/cpu/matmul.c   (AVX-512, f32 only)
 *   cc -std=gnu11 -O2 -Isrc -Iinclude -march=native -mno-avx512f -c src/cpu/matmul.c   (AVX2 path)
 *   cc -std=gnu11 -O2 -Isrc -Iinclude -march=x86-64 -c src/cpu/matmul.c               (scalar path)
 * and to run the tests on them (NVCC= skips the CUDA parts):
 *   make BUILD=build-f32 ARCHFLAGS="-march=native -mno-avx512bf16" NVCC= build-f32/test_k3c && build-f32/test_k3c cpu_
 *   make BUILD=build-avx2 ARCHFLAGS="-march=native -mno-avx512f" NVCC= build-avx2/test_k3c && build-avx2/test_k3c cpu_
 *   make BUILD=build-scalar ARCHFLAGS="-march=x86-64" NVCC= build-scalar/test_k3c && build-scalar/test_k3c cpu_ */
#include <math.h>
#include <string.h>

#include "cpu/ops.h"
#include "format/mxfp4.h"
#include "util/bf16.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define MM_AVX512 1
#if defined(__AVX512BF16__)
#define MM_DP 1 /* products of bf16 activations in VDPBF16PS (the bf16 dot-product section) */
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#define MM_AVX2 1
#endif

/* Below this many multiply-adds (over a whole batch) a call runs on the caller: waking workers would cost
 * more than the work. */
#define MM_INLINE_WORK 65536
/* A unit of parallel work: about this many weight elements (whole rows, a multiple of MM_ROWS). */
#define MM_UNIT_ELEMS 16384
/* MXFP4: the split copy of x lives on the stack, at most this many floats (64 KiB); token tiles are cut to
 * fit, and wider rows take the scalar path. */
#define MX_SPLIT_FLOATS 16384
/* Software prefetch distance (elements) in multi-token tiles: a small measured gain. */
#define MM_PREFETCH 1024

#if defined(MM_AVX512)
#define MM_ROWS 2 /* 2 rows x 3 tokens x 4 accumulators = 24 of 32 zmm */
#define MM_TOKS 3
#define MX_TOKS 4 /* 4 tokens x 4 accumulators = 16 zmm */
#elif defined(MM_AVX2)
#define MM_ROWS 1 /* 1 row x 3 tokens x 4 accumulators = 12 of 16 ymm */
#define MM_TOKS 3
#define MX_TOKS 4
#else
#define MM_ROWS 2
#define MM_TOKS 4
#define MX_TOKS 4
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* The tile loops over rows and tokens have compile-time trip counts after inlining; they must be fully
 * unrolled (GCC does not at -O2 by itself) so the accumulator arrays become registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* E2M1 code -> value (mxfp4.h: codes 8..15 are the negatives). Kept here so the kernel has no link-time
 * dependency on the codec. */
static const float mx_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* 2^(e - 127) from the exponent bits (e = 0 is the subnormal 2^-127; 255 is NaN, rejected by the loader). */
ALWAYS_INLINE float mx_e8m0(uint8_t e) {
    uint32_t u = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : (uint32_t)e << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

ALWAYS_INLINE float mm_store(float s, int round) { return round ? bf16_round(s) : s; }

/* ================================ bf16 ================================ */

/* One tile: R weight rows (stride ldw) times NT tokens (stride ldx); y[t * ldy + r]. R and NT are
 * compile-time constants at every call site, so the accumulator arrays live in registers. */
#if defined(MM_AVX512)
ALWAYS_INLINE __m512 bf16x16_load(const uint16_t *p) {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

ALWAYS_INLINE void bf16_tile(const uint16_t *w, size_t ldw, int R, const float *x, size_t ldx, int NT, int cols,
                             float *y, size_t ldy, int round) {
    __m512 acc[MM_ROWS][MM_TOKS][4];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++)
            UNROLL
            for (int k = 0; k < 4; k++) acc[r][t][k] = _mm512_setzero_ps();
    int c = 0;
    for (; c + 64 <= cols; c += 64) {
        if (NT > 1) {
            UNROLL
            for (int r = 0; r < R; r++) {
                _mm_prefetch((const char *)(w + r * ldw + c + MM_PREFETCH), _MM_HINT_T0);
                _mm_prefetch((const char *)(w + r * ldw + c + MM_PREFETCH + 32), _MM_HINT_T0);
            }
        }
        UNROLL
        for (int k = 0; k < 4; k++) {
            __m512 wv[MM_ROWS];
            UNROLL
            for (int r = 0; r < R; r++) wv[r] = bf16x16_load(w + r * ldw + c + 16 * k);
            UNROLL
            for (int t = 0; t < NT; t++) {
                __m512 xv = _mm512_loadu_ps(x + t * ldx + c + 16 * k);
                UNROLL
                for (int r = 0; r < R; r++) acc[r][t][k] = _mm512_fmadd_ps(wv[r], xv, acc[r][t][k]);
            }
        }
    }
    for (; c + 16 <= cols; c += 16) {
        __m512 wv[MM_ROWS];
        UNROLL
        for (int r = 0; r < R; r++) wv[r] = bf16x16_load(w + r * ldw + c);
        UNROLL
        for (int t = 0; t < NT; t++) {
            __m512 xv = _mm512_loadu_ps(x + t * ldx + c);
            UNROLL
            for (int r = 0; r < R; r++) acc[r][t][0] = _mm512_fmadd_ps(wv[r], xv, acc[r][t][0]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++) {
            __m512 a = _mm512_add_ps(_mm512_add_ps(acc[r][t][0], acc[r][t][1]),
                                     _mm512_add_ps(acc[r][t][2], acc[r][t][3]));
            float s = _mm512_reduce_add_ps(a);
            for (int cc = c; cc < cols; cc++) s = fmaf(bf16_to_f32(w[r * ldw + cc]), x[t * ldx + cc], s);
            y[t * ldy + r] = mm_store(s, round);
        }
}
#elif defined(MM_AVX2)
ALWAYS_INLINE __m256 bf16x8_load(const uint16_t *p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

ALWAYS_INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ALWAYS_INLINE void bf16_tile(const uint16_t *w, size_t ldw, int R, const float *x, size_t ldx, int NT, int cols,
                             float *y, size_t ldy, int round) {
    __m256 acc[MM_ROWS][MM_TOKS][4];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++)
            UNROLL
            for (int k = 0; k < 4; k++) acc[r][t][k] = _mm256_setzero_ps();
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        UNROLL
        for (int k = 0; k < 4; k++) {
            __m256 wv[MM_ROWS];
            UNROLL
            for (int r = 0; r < R; r++) wv[r] = bf16x8_load(w + r * ldw + c + 8 * k);
            UNROLL
            for (int t = 0; t < NT; t++) {
                __m256 xv = _mm256_loadu_ps(x + t * ldx + c + 8 * k);
                UNROLL
                for (int r = 0; r < R; r++) acc[r][t][k] = _mm256_fmadd_ps(wv[r], xv, acc[r][t][k]);
            }
        }
    }
    for (; c + 8 <= cols; c += 8) {
        __m256 wv[MM_ROWS];
        UNROLL
        for (int r = 0; r < R; r++) wv[r] = bf16x8_load(w + r * ldw + c);
        UNROLL
        for (int t = 0; t < NT; t++) {
            __m256 xv = _mm256_loadu_ps(x + t * ldx + c);
            UNROLL
            for (int r = 0; r < R; r++) acc[r][t][0] = _mm256_fmadd_ps(wv[r], xv, acc[r][t][0]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++) {
            __m256 a = _mm256_add_ps(_mm256_add_ps(acc[r][t][0], acc[r][t][1]),
                                     _mm256_add_ps(acc[r][t][2], acc[r][t][3]));
            float s = hsum256(a);
            for (int cc = c; cc < cols; cc++) s = fmaf(bf16_to_f32(w[r * ldw + cc]), x[t * ldx + cc], s);
            y[t * ldy + r] = mm_store(s, round);
        }
}
#else
ALWAYS_INLINE void bf16_tile(const uint16_t *w, size_t ldw, int R, const float *x, size_t ldx, int NT, int cols,
                             float *y, size_t ldy, int round) {
    float acc[MM_ROWS][MM_TOKS] = {{0}};
    for (int c = 0; c < cols; c++) {
        float wv[MM_ROWS];
        UNROLL
        for (int r = 0; r < R; r++) wv[r] = bf16_to_f32(w[r * ldw + c]);
        UNROLL
        for (int t = 0; t < NT; t++) {
            float xv = x[t * ldx + c];
            UNROLL
            for (int r = 0; r < R; r++) acc[r][t] += wv[r] * xv;
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++) y[t * ldy + r] = mm_store(acc[r][t], round);
}
#endif

/* Dispatch a runtime (R, NT) to the specialised tile. */
#define BF16_TILE_CASE(RR, TT)                                                                                     \
    case (RR) * 16 + (TT): bf16_tile(w, ldw, RR, x, ldx, TT, cols, y, ldy, round); break;

static void bf16_tile_any(const uint16_t *w, size_t ldw, int R, const float *x, size_t ldx, int NT, int cols,
                          float *y, size_t ldy, int round) {
    switch (R * 16 + NT) {
        BF16_TILE_CASE(1, 1) BF16_TILE_CASE(1, 2) BF16_TILE_CASE(1, 3)
#if MM_TOKS >= 4
        BF16_TILE_CASE(1, 4)
#endif
#if MM_ROWS >= 2
        BF16_TILE_CASE(2, 1) BF16_TILE_CASE(2, 2) BF16_TILE_CASE(2, 3)
#if MM_TOKS >= 4
        BF16_TILE_CASE(2, 4)
#endif
#endif
    default: break; /* unreachable: R <= MM_ROWS, NT <= MM_TOKS */
    }
}

/* Rows [r0, r1) of W for all T tokens: one row at a time for decode (a single sequential stream), else
 * tiles of MM_ROWS rows, each tile's rows reused from cache by every token tile. */
static void bf16_rows(const k3c_mat *W, const float *x, size_t ldx, int T, float *y, size_t ldy, int round, int r0,
                      int r1) {
    size_t ldw = (size_t)W->cols;
    if (T == 1) {
        for (int r = r0; r < r1; r++) bf16_tile(W->w + (size_t)r * ldw, ldw, 1, x, ldx, 1, W->cols, y + r, ldy, round);
        return;
    }
    for (int r = r0; r < r1; r += MM_ROWS) {
        int R = r1 - r < MM_ROWS ? r1 - r : MM_ROWS;
        for (int t0 = 0; t0 < T; t0 += MM_TOKS) {
            int NT = T - t0 < MM_TOKS ? T - t0 : MM_TOKS;
            bf16_tile_any(W->w + (size_t)r * ldw, ldw, R, x + (size_t)t0 * ldx, ldx, NT, W->cols, y + (size_t)t0 * ldy + r,
                          ldy, round);
        }
    }
}

void k3c_bf16_row(const k3c_mat *W, int row, float *out) {
    const uint16_t *w = W->w + (size_t)row * W->cols;
    for (int c = 0; c < W->cols; c++) out[c] = bf16_to_f32(w[c]);
}

/* ================================ MXFP4 ================================ */

/* One weight row times NT tokens. Each 32-element group is dequantized once in registers (codes -> table
 * values -> times the group's power-of-two scale, exact) and used by all NT tokens.
 *
 * AVX-512: the 16 packed bytes of a group widen to 16 dwords (one shuffle); permutexvar looks up the low
 * nibble (even columns) directly, since it reads only the low 4 index bits, and the high nibble (odd
 * columns) after a shift. The token side is split to match: xs holds x with each group's 32 values reordered
 * as [16 even | 16 odd] (mx_split_x), made once per unit and token tile and reused by all of its rows. */
#if defined(MM_AVX512)
/* x [NT, cols] -> xs [NT, cols], per 32-group [even columns | odd columns]. */
static void mx_split_x(const float *x, size_t ldx, int NT, int cols, float *xs) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int t = 0; t < NT; t++)
        for (int c = 0; c < cols; c += 32) {
            __m512 a = _mm512_loadu_ps(x + t * ldx + c), b = _mm512_loadu_ps(x + t * ldx + c + 16);
            _mm512_storeu_ps(xs + (size_t)t * cols + c, _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(xs + (size_t)t * cols + c + 16, _mm512_permutex2var_ps(a, odd, b));
        }
}

/* The group scales of one row as floats (16 at a time: widen, shift into the exponent, patch e = 0 to the
 * subnormal 2^-127 and e = 255 to NaN, as mx_e8m0), so the group loop broadcasts them from memory. */
ALWAYS_INLINE void mx_scales(const uint8_t *sc, int groups, float *sf) {
    int g = 0;
    for (; g + 16 <= groups; g += 16) {
        __m512i u = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + g)));
        __m512i v = _mm512_slli_epi32(u, 23);
        v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(u, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000));
        v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(u, _mm512_set1_epi32(255)), _mm512_set1_epi32(0x7fc00000));
        _mm512_storeu_ps(sf + g, _mm512_castsi512_ps(v));
    }
    for (; g < groups; g++) sf[g] = mx_e8m0(sc[g]);
}

/* Accumulators per token: lo[p], hi[p] for groups g with g % 2 == p (two independent FMA chains per
 * column parity: one chain per parity left the loop FMA-latency bound at ~4 cycles per group). */
ALWAYS_INLINE void mx_tile(const uint8_t *pk, const uint8_t *sc, int groups, const float *xs, int NT, float *y,
                           size_t ldy, int round) {
    const __m512 tab = _mm512_loadu_ps(mx_e2m1);
    size_t ldx = (size_t)groups * 32;
    float sf[MX_SPLIT_FLOATS / 32];
    mx_scales(sc, groups, sf);
    __m512 lo[2][MX_TOKS], hi[2][MX_TOKS];
    UNROLL
    for (int t = 0; t < NT; t++) lo[0][t] = hi[0][t] = lo[1][t] = hi[1][t] = _mm512_setzero_ps();
    int g = 0;
    for (; g + 2 <= groups; g += 2) {
        UNROLL
        for (int q = 0; q < 2; q++) {
            __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(pk + (size_t)(g + q) * 16)));
            __m512 s = _mm512_set1_ps(sf[g + q]);
            __m512 w0 = _mm512_mul_ps(_mm512_permutexvar_ps(d, tab), s);
            __m512 w1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab), s);
            UNROLL
            for (int t = 0; t < NT; t++) {
                const float *xg = xs + t * ldx + (size_t)(g + q) * 32;
                lo[q][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xg), lo[q][t]);
                hi[q][t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xg + 16), hi[q][t]);
            }
        }
    }
    if (g < groups) {
        __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(pk + (size_t)g * 16)));
        __m512 s = _mm512_set1_ps(sf[g]);
        __m512 w0 = _mm512_mul_ps(_mm512_permutexvar_ps(d, tab), s);
        __m512 w1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab), s);
        UNROLL
        for (int t = 0; t < NT; t++) {
            const float *xg = xs + t * ldx + (size_t)g * 32;
            lo[0][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xg), lo[0][t]);
            hi[0][t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xg + 16), hi[0][t]);
        }
    }
    UNROLL
    for (int t = 0; t < NT; t++) {
        __m512 a = _mm512_add_ps(_mm512_add_ps(lo[0][t], lo[1][t]), _mm512_add_ps(hi[0][t], hi[1][t]));
        y[t * ldy] = mm_store(_mm512_reduce_add_ps(a), round);
    }
}
#else
#if defined(MM_AVX2)
/* 8 codes (bytes) -> 8 values: magnitude from an 8-entry table by the low 3 bits, sign from bit 3. */
ALWAYS_INLINE __m256 mx_lookup8(__m128i codes8, __m256 mag) {
    __m256i idx = _mm256_cvtepu8_epi32(codes8);
    __m256 v = _mm256_permutevar8x32_ps(mag, idx);
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(v, _mm256_castsi256_ps(sign));
}

ALWAYS_INLINE void mx_tile(const uint8_t *pk, const uint8_t *sc, int groups, const float *x, int NT, float *y,
                           size_t ldy, int round) {
    const __m256 mag = _mm256_loadu_ps(mx_e2m1);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    size_t ldx = (size_t)groups * 32;
    __m256 acc[MX_TOKS], acc2[MX_TOKS];
    UNROLL
    for (int t = 0; t < NT; t++) acc[t] = acc2[t] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m128i b = _mm_loadu_si128((const __m128i *)(pk + (size_t)g * 16));
        __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
        __m128i c0 = _mm_unpacklo_epi8(lo, hi), c1 = _mm_unpackhi_epi8(lo, hi);
        __m256 s = _mm256_set1_ps(mx_e8m0(sc[g]));
        __m256 w[4];
        w[0] = _mm256_mul_ps(mx_lookup8(c0, mag), s);
        w[1] = _mm256_mul_ps(mx_lookup8(_mm_srli_si128(c0, 8), mag), s);
        w[2] = _mm256_mul_ps(mx_lookup8(c1, mag), s);
        w[3] = _mm256_mul_ps(mx_lookup8(_mm_srli_si128(c1, 8), mag), s);
        UNROLL
        for (int t = 0; t < NT; t++) {
            const float *xg = x + t * ldx + (size_t)g * 32;
            acc[t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xg), acc[t]);
            acc2[t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xg + 8), acc2[t]);
            acc[t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xg + 16), acc[t]);
            acc2[t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg + 24), acc2[t]);
        }
    }
    UNROLL
    for (int t = 0; t < NT; t++) y[t * ldy] = mm_store(hsum256(_mm256_add_ps(acc[t], acc2[t])), round);
}
#else
ALWAYS_INLINE void mx_tile(const uint8_t *pk, const uint8_t *sc, int groups, const float *x, int NT, float *y,
                           size_t ldy, int round) {
    size_t ldx = (size_t)groups * 32;
    float acc[MX_TOKS] = {0};
    for (int g = 0; g < groups; g++) {
        float s = mx_e8m0(sc[g]), w[32];
        for (int i = 0; i < 16; i++) {
            uint8_t b = pk[(size_t)g * 16 + i];
            w[2 * i] = mx_e2m1[b & 15] * s;
            w[2 * i + 1] = mx_e2m1[b >> 4] * s;
        }
        UNROLL
        for (int t = 0; t < NT; t++) {
            const float *xg = x + t * ldx + (size_t)g * 32;
            for (int i = 0; i < 32; i++) acc[t] += w[i] * xg[i];
        }
    }
    UNROLL
    for (int t = 0; t < NT; t++) y[t * ldy] = mm_store(acc[t], round);
}
#endif
#endif

#define MX_TILE_CASE(TT)                                                                                           \
    case TT: mx_tile(pk, sc, groups, xs, TT, y, ldy, round); break;

static void mx_tile_any(const uint8_t *pk, const uint8_t *sc, int groups, const float *xs, int NT, float *y,
                        size_t ldy, int round) {
    switch (NT) {
        MX_TILE_CASE(1) MX_TILE_CASE(2) MX_TILE_CASE(3) MX_TILE_CASE(4)
#if MX_TOKS >= 8
        MX_TILE_CASE(5) MX_TILE_CASE(6) MX_TILE_CASE(7) MX_TILE_CASE(8)
#endif
    default: break; /* unreachable: NT <= MX_TOKS */
    }
}

/* Scalar form for rows wider than MX_SPLIT_FLOATS (no model has one: K3's experts are 3584 wide): one
 * running sum in column order. It depends only on the row and the token, so it is batch invariant too. */
static float mx_row_scalar(const uint8_t *pk, const uint8_t *sc, int groups, const float *x) {
    float s = 0;
    for (int g = 0; g < groups; g++) {
        float scale = mx_e8m0(sc[g]);
        for (int i = 0; i < 32; i++) {
            uint8_t b = pk[(size_t)g * 16 + i / 2];
            s = fmaf(mx_e2m1[i & 1 ? b >> 4 : b & 15] * scale, x[g * 32 + i], s);
        }
    }
    return s;
}

/* Rows [r0, r1) for all tokens, token tile by token tile: the tile's x is split once (AVX-512), then every
 * row of the range runs over it (the range's packed rows are re-read from L1/L2 per token tile). */
static void mx_rows(const k3c_mxfp4_mat *W, const float *x, size_t ldx, int T, float *y, size_t ldy, int round,
                    int r0, int r1) {
    int cols = W->cols, groups = cols / K3C_MXFP4_GROUP;
    if (cols > MX_SPLIT_FLOATS) {
        for (int t = 0; t < T; t++)
            for (int r = r0; r < r1; r++)
                y[t * ldy + r] = mm_store(mx_row_scalar(W->packed + (size_t)r * (cols / 2),
                                                        W->scale + (size_t)r * groups, groups, x + (size_t)t * ldx),
                                          round);
        return;
    }
    int tt = MX_SPLIT_FLOATS / (cols > 0 ? cols : 1);
    if (tt > MX_TOKS) tt = MX_TOKS;
#if defined(MM_AVX512)
    float xs_buf[MX_SPLIT_FLOATS];
#endif
    for (int t0 = 0; t0 < T; t0 += tt) {
        int NT = T - t0 < tt ? T - t0 : tt;
#if defined(MM_AVX512)
        mx_split_x(x + (size_t)t0 * ldx, ldx, NT, groups * 32, xs_buf);
        const float *xs = xs_buf;
#else
        /* mx_tile reads token t at xs + t * cols: copy when x is strided */
        float xs_buf[MX_SPLIT_FLOATS];
        const float *xs = x + (size_t)t0 * ldx;
        if (ldx != (size_t)cols) {
            for (int t = 0; t < NT; t++) memcpy(xs_buf + (size_t)t * cols, xs + t * ldx, (size_t)cols * sizeof(float));
            xs = xs_buf;
        }
#endif
        for (int r = r0; r < r1; r++)
            mx_tile_any(W->packed + (size_t)r * (cols / 2), W->scale + (size_t)r * groups, groups, xs, NT,
                        y + (size_t)t0 * ldy + r, ldy, round);
    }
}

/* ================================ blocked (prompt rows) ================================ */

/* Products of many tokens (T >= BK_MIN_T) on AVX-512. A unit of up to BK_ROWS weight rows is widened to f32
 * once into a panel in the thread's pool scratch (bf16: exact; MXFP4: the values mx_tile computes, in its
 * per-group [16 even | 16 odd] column order). The tokens then run over the panel in tiles of BK_TOKS, each
 * tile's x packed side by side (a few pages: rows of a wide activation buffer are a page apart each, and on
 * 4 KiB pages the TLB misses cost a third of the rate) and kept in L1, while the panel streams from L2 one
 * row per register tile of one row x BK_TOKS tokens (two rows x three tokens, the other 24-register shape,
 * moves twice the panel bytes per output and measured 10% slower). The weights are read from memory once per
 * product, the token rows once per unit.
 *
 * Each output is computed with exactly the operation sequence of bf16_tile / mx_tile (the batch-invariance
 * rule at the top of this file): accumulator j of 16 lanes takes the 16 columns at offset 16 j of every
 * 64-column block, in block order, by FMA from zero; then
 *   bf16:  leftover full 16-column blocks into accumulator 0; (a0 + a1) + (a2 + a3); _mm512_reduce_add_ps;
 *          the last cols % 16 products one by one (fmaf);
 *   MXFP4: (columns in the split order, so a0 = lo[0], a1 = hi[0], a2 = lo[1], a3 = hi[1] of mx_tile) a
 *          leftover group's halves into a0 and a1; (a0 + a2) + (a1 + a3); _mm512_reduce_add_ps.
 * The panel holds the same f32 values the tiles compute on the fly, so every output is bit-identical to the
 * T = 1 path: only where operands come from changes, never the K order. */
#if defined(MM_AVX512)
#define BK_MIN_T 8  /* below this the row-stream tiles win: a few tokens cannot amortize the widening */
#define BK_TOKS 6   /* 1 row x 6 tokens x 4 accumulators = 24 of 32 zmm */
#define BK_ROWS 64  /* rows per unit (up to the panel): a token tile is packed once per unit */
/* Columns per block of a product wider than 1.75 BK_KC, in equal blocks of at most BK_KC (multiples of 64):
 * a token tile's block, up to 24 KiB (42 KiB unblocked), stays in L1; 1600 columns measured 7% faster in
 * one block than in two. */
#define BK_KC 1024
/* Of the pool's per-thread scratch: the panel (192 KiB), the packed x of one token tile's column block, and
 * for products wider than BK_KC the accumulators of every row of the unit between blocks. */
#define BK_PANEL_FLOATS (48 * 1024)
#define BK_XS_FLOATS (BK_TOKS * BK_KC * 7 / 4)
#define BK_ACC_VECS (BK_ROWS * BK_TOKS * 4)
_Static_assert((BK_PANEL_FLOATS + BK_XS_FLOATS + 16 * BK_ACC_VECS) * 4 <= K3C_POOL_SCRATCH, "pool scratch too small");

/* One panel row p (all cols) times NT tokens, columns [c0, c1) of it; x holds the tile's columns from c0 on
 * (token stride ldx, 64-byte aligned). A block after the first resumes the accumulators from save, one that
 * is not the last (c1 < cols) leaves them there; the last writes y[t * ldy]. */
ALWAYS_INLINE void bk_tile(const float *p, const float *x, size_t ldx, int NT, int c0, int c1, int cols, int mx,
                           int blocked, __m512 *save, float *y, size_t ldy, int round) {
    if (!blocked) c0 = 0, c1 = cols; /* a compile-time 0: the one-block tile, without the resume and save */
    __m512 acc[BK_TOKS][4];
    UNROLL
    for (int t = 0; t < NT; t++)
        UNROLL
        for (int k = 0; k < 4; k++) acc[t][k] = blocked && c0 ? save[4 * t + k] : _mm512_setzero_ps();
    x -= c0;
    int c = c0;
    for (; c + 64 <= c1; c += 64) {
        UNROLL
        for (int k = 0; k < 4; k++) {
            __m512 wv = _mm512_load_ps(p + c + 16 * k);
            UNROLL
            for (int t = 0; t < NT; t++)
                acc[t][k] = _mm512_fmadd_ps(wv, _mm512_load_ps(x + t * ldx + c + 16 * k), acc[t][k]);
        }
    }
    if (blocked && c1 < cols) {
        UNROLL
        for (int t = 0; t < NT; t++)
            UNROLL
            for (int k = 0; k < 4; k++) save[4 * t + k] = acc[t][k];
        return;
    }
    if (mx) {
        if (c + 32 <= cols) { /* a leftover group: even half -> a0, odd half -> a1 */
            UNROLL
            for (int k = 0; k < 2; k++) {
                __m512 wv = _mm512_load_ps(p + c + 16 * k);
                UNROLL
                for (int t = 0; t < NT; t++)
                    acc[t][k] = _mm512_fmadd_ps(wv, _mm512_load_ps(x + t * ldx + c + 16 * k), acc[t][k]);
            }
            c += 32;
        }
    } else {
        for (; c + 16 <= cols; c += 16) {
            __m512 wv = _mm512_load_ps(p + c);
            UNROLL
            for (int t = 0; t < NT; t++) acc[t][0] = _mm512_fmadd_ps(wv, _mm512_load_ps(x + t * ldx + c), acc[t][0]);
        }
    }
    UNROLL
    for (int t = 0; t < NT; t++) {
        __m512 a = mx ? _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][2]), _mm512_add_ps(acc[t][1], acc[t][3]))
                      : _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), _mm512_add_ps(acc[t][2], acc[t][3]));
        float s = _mm512_reduce_add_ps(a);
        for (int cc = c; cc < cols; cc++) s = fmaf(p[cc], x[t * ldx + cc], s);
        y[t * ldy] = mm_store(s, round);
    }
}

#define BK_TILE_CASE(TT, MX, BL)                                                                                   \
    case TT: bk_tile(p, x, ldx, TT, c0, c1, cols, MX, BL, save, y, ldy, round); break;
#define BK_TILE_CASES(MX, BL)                                                                                      \
    BK_TILE_CASE(1, MX, BL) BK_TILE_CASE(2, MX, BL) BK_TILE_CASE(3, MX, BL) BK_TILE_CASE(4, MX, BL)               \
    BK_TILE_CASE(5, MX, BL) BK_TILE_CASE(6, MX, BL)

static void bk_tile_any(const float *p, const float *x, size_t ldx, int NT, int c0, int c1, int cols, int mx,
                        __m512 *save, float *y, size_t ldy, int round) {
    switch ((c1 - c0 < cols) * 2 + mx) {
    case 0: switch (NT) { BK_TILE_CASES(0, 0) default: break; } break; /* NT <= BK_TOKS */
    case 1: switch (NT) { BK_TILE_CASES(1, 0) default: break; } break;
    case 2: switch (NT) { BK_TILE_CASES(0, 1) default: break; } break;
    default: switch (NT) { BK_TILE_CASES(1, 1) default: break; } break;
    }
}

/* Panel row stride: cols rounded up to 16 floats, so every row starts 64-byte aligned. */
static size_t bk_ldp(int cols) { return ((size_t)cols + 15) / 16 * 16; }

/* Rows per blocked unit of a product, or 0 where the blocked form does not apply (few tokens, no pool
 * scratch, a panel row wider than the panel, or an MXFP4 row on mx_row_scalar's path). */
static int bk_unit_rows(const k3c_mm *m, int have_scratch) {
    int cols = m->W ? m->W->cols : m->Wq->cols;
    if (!have_scratch || m->T < BK_MIN_T || cols <= 0 || (m->Wq && cols > MX_SPLIT_FLOATS)) return 0;
    size_t rows = BK_PANEL_FLOATS / bk_ldp(cols);
    return rows > BK_ROWS ? BK_ROWS : (int)rows;
}

/* Rows [r0, r1) of one product for all its tokens: widen the rows into the panel, then token tile by token
 * tile and column block by column block, every row of the panel. */
static void bk_rows(const k3c_mm *m, size_t ldx, size_t ldy, int r0, int r1, float *scratch) {
    int cols = m->W ? m->W->cols : m->Wq->cols, mx = m->Wq != NULL, T = m->T;
    size_t ldp = bk_ldp(cols);
    float *panel = scratch, *xs = scratch + BK_PANEL_FLOATS;
    __m512 *save = (__m512 *)(xs + BK_XS_FLOATS); /* [row][token][4] */
    for (int r = r0; r < r1; r++) {
        float *pr = panel + (size_t)(r - r0) * ldp;
        if (!mx) {
            const uint16_t *w = m->W->w + (size_t)r * cols;
            int c = 0;
            for (; c + 16 <= cols; c += 16) _mm512_store_ps(pr + c, bf16x16_load(w + c));
            for (; c < cols; c++) pr[c] = bf16_to_f32(w[c]);
        } else {
            const __m512 tab = _mm512_loadu_ps(mx_e2m1);
            int groups = cols / K3C_MXFP4_GROUP;
            const uint8_t *pk = m->Wq->packed + (size_t)r * (cols / 2), *sc = m->Wq->scale + (size_t)r * groups;
            float sf[MX_SPLIT_FLOATS / 32];
            mx_scales(sc, groups, sf);
            for (int g = 0; g < groups; g++) {
                __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(pk + (size_t)g * 16)));
                __m512 s = _mm512_set1_ps(sf[g]);
                __m512 odd = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab);
                _mm512_store_ps(pr + 32 * g, _mm512_mul_ps(_mm512_permutexvar_ps(d, tab), s));
                _mm512_store_ps(pr + 32 * g + 16, _mm512_mul_ps(odd, s));
            }
        }
    }
    int nblk = 4 * cols <= 7 * BK_KC ? 1 : (cols + BK_KC - 1) / BK_KC;
    int kc = nblk == 1 ? cols : ((cols + nblk - 1) / nblk + 63) / 64 * 64;
    for (int t0 = 0; t0 < T; t0 += BK_TOKS) {
        int NT = T - t0 < BK_TOKS ? T - t0 : BK_TOKS;
        for (int c0 = 0; c0 < cols; c0 += kc) {
            int c1 = c0 + kc < cols ? c0 + kc : cols;
            size_t ld = bk_ldp(c1 - c0);
            const float *xt = m->x + (size_t)t0 * ldx + c0;
            /* The tile's token rows packed side by side (MXFP4: split as mx_tile reads them, per 32-column
             * group, so blocks at multiples of 64 split alike): a few pages that stay in the TLB, where rows
             * of a wide activation buffer are a page apart each (4 KiB pages: the misses cost a third). */
            if (mx) mx_split_x(xt, ldx, NT, c1 - c0, xs);
            else
                for (int t = 0; t < NT; t++) memcpy(xs + (size_t)t * ld, xt + (size_t)t * ldx, (size_t)(c1 - c0) * 4);
            for (int r = r0; r < r1; r++)
                bk_tile_any(panel + (size_t)(r - r0) * ldp, xs, ld, NT, c0, c1, cols, mx,
                            save + (size_t)(r - r0) * BK_TOKS * 4, m->y + (size_t)t0 * ldy + r, ldy, m->round);
        }
    }
}
#endif

/* ================================ bf16 dot products (AVX512-BF16) ================================ */

/* Products whose x holds bf16 values (k3c_mm.xbf16: every activation of the rounding contract) multiply in
 * bf16: x is converted to bf16 (exact, its values are bf16) and each 32-column block is one VDPBF16PS per
 * (row, token), two bf16 products per f32 lane, twice the multiply rate of f32 FMAs on this machine (453
 * against 230 GFLOP/s on one core). bf16 weights are read as they are stored; MXFP4 weights are decoded to
 * bf16 (e2m1 x 2^(s-127) is exact in bf16 down to 2^-126; below it VCVTNEPS2BF16 and VDPBF16PS treat the
 * value as zero). Row-stream tiles (decode, few tokens) convert x in registers as they load it; the blocked
 * form (T >= BK_MIN_T) packs each token tile's x as bf16 once per unit and runs 2-row x 6-token register
 * tiles over the rows (for MXFP4, the unit's rows decoded into a bf16 panel in the pool scratch). */
#if defined(MM_DP)
#define DP_ROWS 2 /* 2 rows x 6 tokens x 2 chains = 24 of 32 zmm; measured 1.15-1.3x the 1 x 6 tile */
#define DP_TOKS 6
/* Blocked: a unit's weight rows (MXFP4: its bf16 panel) at most this many bf16 values, so they stay in L2
 * while every token tile runs over them; columns in blocks of at most DP_KC (a multiple of 64: the chain of
 * a 32-column block is its parity) beyond 1.75 DP_KC, so a token tile's bf16 x (24 KiB) stays in L1. */
#define DP_PANEL_ELEMS (96 * 1024)
#define DP_KC 2048
#define DP_XS_ELEMS (DP_TOKS * (DP_KC * 7 / 4 + 32))
_Static_assert(DP_XS_ELEMS * 2 % 64 == 0, "the accumulators after the packed x must stay aligned");
_Static_assert(DP_PANEL_ELEMS * 2 + DP_XS_ELEMS * 2 + BK_ROWS * DP_TOKS * 2 * 64 <= K3C_POOL_SCRATCH,
               "pool scratch too small");

/* The 16 lanes in a fixed tree: lane j + lane j+8, then + j+4, + j+2, + j+1 (the order an emulation must
 * follow; not _mm512_reduce_add_ps, whose order is the compiler's). */
ALWAYS_INLINE float dp_hsum(__m512 a) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* Columns [c, c + n) of an f32 row as 32 bf16 (n < 32: zeros past n; the loads are masked). */
ALWAYS_INLINE __m512bh dp_x32(const float *x, int n) {
    if (n >= 32) return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
    __mmask16 lo = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1), hi = n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + 16), _mm512_maskz_loadu_ps(lo, x));
}

ALWAYS_INLINE __m512bh dp_w32(const uint16_t *w, int n) {
    if (n >= 32) return (__m512bh)_mm512_loadu_si512(w);
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1u << n) - 1), w);
}

/* One register tile: R bf16 weight rows (stride ldw) x NT tokens. x is f32 (xbf = 0: token stride ldx,
 * converted as loaded) or bf16 packed by dp_pack (xbf = 1: columns from c0 on, stride ldx, zero past the
 * row's end). Columns [c0, c1) of cols when blocked (c0, c1 multiples of 64 but the last c1 = cols): a block
 * after the first resumes the accumulators from save, one before the last leaves them there.
 * Accumulation order of y[t, r] (the batch-invariance rule at the top of this file): block b (columns
 * [32 b, 32 b + 32), the last one zero-padded) goes to chain b % 2 by one VDPBF16PS; y = dp_hsum(chain 0 +
 * chain 1). */
ALWAYS_INLINE void dp_tile(const uint16_t *w, size_t ldw, int R, const void *x, size_t ldx, int xbf, int NT,
                           int c0, int c1, int cols, int blocked, __m512 *save, float *y, size_t ldy, int round) {
    if (!blocked) c0 = 0, c1 = cols;
    const float *xf = x;
    const uint16_t *xb = (const uint16_t *)x - c0;
    __m512 acc[DP_ROWS][DP_TOKS][2];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++)
            UNROLL
            for (int k = 0; k < 2; k++)
                acc[r][t][k] = blocked && c0 ? save[(r * DP_TOKS + t) * 2 + k] : _mm512_setzero_ps();
    int c = c0;
    for (; c + 64 <= c1; c += 64) {
        UNROLL
        for (int k = 0; k < 2; k++) {
            __m512bh wv[DP_ROWS];
            UNROLL
            for (int r = 0; r < R; r++) wv[r] = dp_w32(w + r * ldw + c + 32 * k, 32);
            UNROLL
            for (int t = 0; t < NT; t++) {
                __m512bh xv = xbf ? (__m512bh)_mm512_load_si512(xb + t * ldx + c + 32 * k)
                                  : dp_x32(xf + t * ldx + c + 32 * k, 32);
                UNROLL
                for (int r = 0; r < R; r++) acc[r][t][k] = _mm512_dpbf16_ps(acc[r][t][k], wv[r], xv);
            }
        }
    }
    if (blocked && c1 < cols) {
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int t = 0; t < NT; t++)
                UNROLL
                for (int k = 0; k < 2; k++) save[(r * DP_TOKS + t) * 2 + k] = acc[r][t][k];
        return;
    }
    for (; c < cols; c += 32) { /* at most two blocks: an even full one, then the zero-padded rest */
        int n = cols - c < 32 ? cols - c : 32, k = (c >> 5) & 1;
        __m512bh wv[DP_ROWS];
        UNROLL
        for (int r = 0; r < R; r++) wv[r] = dp_w32(w + r * ldw + c, n);
        UNROLL
        for (int t = 0; t < NT; t++) {
            __m512bh xv = xbf ? (__m512bh)_mm512_load_si512(xb + t * ldx + c) : dp_x32(xf + t * ldx + c, n);
            UNROLL
            for (int r = 0; r < R; r++) {
                if (k) acc[r][t][1] = _mm512_dpbf16_ps(acc[r][t][1], wv[r], xv);
                else acc[r][t][0] = _mm512_dpbf16_ps(acc[r][t][0], wv[r], xv);
            }
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++)
            y[t * ldy + r] = mm_store(dp_hsum(_mm512_add_ps(acc[r][t][0], acc[r][t][1])), round);
}

/* Rows [0, nrows) of a panel (stride ldw) x NT tokens: tiles of DP_ROWS rows, one dispatch for all. */
ALWAYS_INLINE void dp_tiles(const uint16_t *w, size_t ldw, int nrows, const void *x, size_t ldx, int xbf, int NT,
                            int c0, int c1, int cols, int blocked, __m512 *save, float *y, size_t ldy, int round) {
    int r = 0;
    for (; r + DP_ROWS <= nrows; r += DP_ROWS)
        dp_tile(w + r * ldw, ldw, DP_ROWS, x, ldx, xbf, NT, c0, c1, cols, blocked,
                save ? save + (size_t)r * DP_TOKS * 2 : NULL, y + r, ldy, round);
    if (r < nrows)
        dp_tile(w + r * ldw, ldw, 1, x, ldx, xbf, NT, c0, c1, cols, blocked, save ? save + (size_t)r * DP_TOKS * 2 : NULL,
                y + r, ldy, round);
}

#define DP_TILES_CASE(TT, XBF, BL)                                                                                 \
    case TT: dp_tiles(w, ldw, nrows, x, ldx, XBF, TT, c0, c1, cols, BL, save, y, ldy, round); break;
#define DP_TILES_CASES(XBF, BL)                                                                                    \
    DP_TILES_CASE(1, XBF, BL) DP_TILES_CASE(2, XBF, BL) DP_TILES_CASE(3, XBF, BL) DP_TILES_CASE(4, XBF, BL)         \
    DP_TILES_CASE(5, XBF, BL) DP_TILES_CASE(6, XBF, BL)

/* nrows rows x NT tokens: f32 x converted as loaded (whole rows), or packed bf16 x (one column block of a
 * blocked product, or whole rows). */
static void dp_rows_f32x(const uint16_t *w, size_t ldw, int nrows, const float *x, size_t ldx, int NT, int cols,
                         float *y, size_t ldy, int round) {
    int c0 = 0, c1 = cols;
    __m512 *save = NULL;
    switch (NT) {
        DP_TILES_CASES(0, 0)
    default: break; /* unreachable: NT <= DP_TOKS */
    }
}

static void dp_rows_packed(const uint16_t *w, size_t ldw, int nrows, const uint16_t *x, size_t ldx, int NT, int c0,
                           int c1, int cols, __m512 *save, float *y, size_t ldy, int round) {
    if (c1 - c0 < cols) {
        switch (NT) {
            DP_TILES_CASES(1, 1)
        default: break;
        }
    } else {
        switch (NT) {
            DP_TILES_CASES(1, 0)
        default: break;
        }
    }
}

/* Padded bf16 row length of a block of n columns: a multiple of 32 (64 bytes). */
static size_t dp_ld(int n) { return ((size_t)n + 31) / 32 * 32; }

/* Columns [0, n) of NT f32 token rows (stride ldx) as bf16 rows of dp_ld(n) (stride ld), zero-padded. */
static void dp_pack(const float *x, size_t ldx, int NT, int n, uint16_t *out, size_t ld) {
    for (int t = 0; t < NT; t++)
        for (int c = 0; c < n; c += 32) _mm512_store_si512(out + t * ld + c, (__m512i)dp_x32(x + t * ldx + c, n - c));
}

/* One MXFP4 group (16 packed bytes) as 32 bf16 in column order, e2m1 * 2^(s-127) exactly. Word 2i of the
 * index holds byte i (vpermw reads its low 5 bits: the low nibble, the table repeating at 16) and word 2i + 1
 * its high nibble; the table holds the e2m1 values in bf16, and the scale is added to the exponent of the
 * nonzero ones (exact while the result is normal: 2 <= s <= 252). Other scales take the f32 route: the
 * table times 2^(s-127), exact, rounded to bf16 (zero below 2^-126, as VDPBF16PS reads it anyway). */
static const uint16_t mx_e2m1_bf16[32] = {
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0, 0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0,
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0, 0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0};

ALWAYS_INLINE __m512bh dp_mx_group(const uint8_t *pk, uint8_t s) {
    __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)pk));
    __m512i idx = _mm512_or_si512(d, _mm512_slli_epi32(d, 12));
    if (__builtin_expect(s < 2 || s > 252, 0)) {
        __m512 t = _mm512_mul_ps(_mm512_loadu_ps(mx_e2m1), _mm512_set1_ps(mx_e8m0(s)));
        __m512i tw = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(t));
        return (__m512bh)_mm512_permutexvar_epi16(idx, _mm512_inserti64x4(tw, _mm512_castsi512_si256(tw), 1));
    }
    __m512i w = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(mx_e2m1_bf16));
    __mmask32 nz = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(7));
    return (__m512bh)_mm512_mask_add_epi16(w, nz, w, _mm512_set1_epi16((short)((s - 127) * 128)));
}

/* R MXFP4 rows (packed stride ldp, scales stride lds) x NT tokens of packed bf16 x, each group decoded in
 * registers and used by every token: group g is block g of dp_tile's order (chain g % 2). */
ALWAYS_INLINE void dp_mx_tile(const uint8_t *pk, size_t ldp, const uint8_t *sc, size_t lds, int R, int groups,
                              const uint16_t *xb, size_t ldx, int NT, float *y, size_t ldy, int round) {
    __m512 acc[DP_ROWS][DP_TOKS][2];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
    int g = 0;
    for (; g + 2 <= groups; g += 2) {
        UNROLL
        for (int k = 0; k < 2; k++) {
            __m512bh wv[DP_ROWS];
            UNROLL
            for (int r = 0; r < R; r++) wv[r] = dp_mx_group(pk + r * ldp + (size_t)(g + k) * 16, sc[r * lds + g + k]);
            UNROLL
            for (int t = 0; t < NT; t++) {
                __m512bh xv = (__m512bh)_mm512_load_si512(xb + t * ldx + (size_t)(g + k) * 32);
                UNROLL
                for (int r = 0; r < R; r++) acc[r][t][k] = _mm512_dpbf16_ps(acc[r][t][k], wv[r], xv);
            }
        }
    }
    if (g < groups) {
        __m512bh wv[DP_ROWS];
        UNROLL
        for (int r = 0; r < R; r++) wv[r] = dp_mx_group(pk + r * ldp + (size_t)g * 16, sc[r * lds + g]);
        UNROLL
        for (int t = 0; t < NT; t++) {
            __m512bh xv = (__m512bh)_mm512_load_si512(xb + t * ldx + (size_t)g * 32);
            UNROLL
            for (int r = 0; r < R; r++) acc[r][t][0] = _mm512_dpbf16_ps(acc[r][t][0], wv[r], xv);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++)
            y[t * ldy + r] = mm_store(dp_hsum(_mm512_add_ps(acc[r][t][0], acc[r][t][1])), round);
}

#define DP_MX_CASE(RR, TT)                                                                                         \
    case (RR) * 16 + (TT): dp_mx_tile(pk, ldp, sc, lds, RR, groups, xb, ldx, TT, y, ldy, round); break;

static void dp_mx_tile_any(const uint8_t *pk, size_t ldp, const uint8_t *sc, size_t lds, int R, int groups,
                           const uint16_t *xb, size_t ldx, int NT, float *y, size_t ldy, int round) {
    switch (R * 16 + NT) {
        DP_MX_CASE(1, 1) DP_MX_CASE(1, 2) DP_MX_CASE(1, 3) DP_MX_CASE(1, 4) DP_MX_CASE(1, 5) DP_MX_CASE(1, 6)
        DP_MX_CASE(2, 1) DP_MX_CASE(2, 2) DP_MX_CASE(2, 3) DP_MX_CASE(2, 4) DP_MX_CASE(2, 5) DP_MX_CASE(2, 6)
    default: break; /* unreachable: R <= DP_ROWS, NT <= DP_TOKS */
    }
}

/* One MXFP4 row as bf16 (the blocked form's panel): the values dp_mx_tile computes in registers. */
static void dp_mx_row(const uint8_t *pk, const uint8_t *sc, int groups, uint16_t *out) {
    for (int g = 0; g < groups; g++)
        _mm512_store_si512(out + (size_t)g * 32, (__m512i)dp_mx_group(pk + (size_t)g * 16, sc[g]));
}

/* Decode (one token, x packed as bf16): rows [r0, r1) each in one pass, the row loop here so that a row
 * costs no call or dispatch (a 2 KiB row streams in ~240 cycles; a call per row cost 15%). The order is
 * dp_tile's. A bf16 row whose start is 4-byte but not 64-byte aligned (the usual case in a mapped
 * checkpoint) is read as aligned lines, each block taken from two of them by one VPERMT2D: 64-byte loads
 * that straddle two lines measured 20-25% slower from memory. */
static void dp_decode_bf16(const k3c_mat *W, int r0, int r1, const uint16_t *xb, float *y, int round) {
    int cols = W->cols;
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const char *lo_end = (const char *)W->w, *hi_end = (const char *)(W->w + (size_t)W->rows * cols);
    size_t span = 64 * (2 * (size_t)(cols / 64) + 1); /* bytes of the lines one row's loop loads */
    for (int r = r0; r < r1; r++) {
        const uint16_t *w = W->w + (size_t)r * cols;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        size_t mis = (uintptr_t)w & 63;
        int c = 0;
        /* the lines stray past the row into its neighbours, so only where they stay inside the matrix
         * (not the first row's head nor the last row's tail): every load is within the array */
        if (mis && mis % 4 == 0 && (const char *)w - mis >= lo_end && (const char *)w - mis + span <= hi_end) {
            const __m512i *ln = (const __m512i *)(const void *)((const char *)w - mis);
            __m512i idx = _mm512_add_epi32(iota, _mm512_set1_epi32((int)(mis / 4))), lo = _mm512_load_si512(ln);
            for (; c + 64 <= cols; c += 64, ln += 2) {
                __m512i l1 = _mm512_load_si512(ln + 1), l2 = _mm512_load_si512(ln + 2);
                a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_permutex2var_epi32(lo, idx, l1),
                                      (__m512bh)_mm512_load_si512(xb + c));
                a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_permutex2var_epi32(l1, idx, l2),
                                      (__m512bh)_mm512_load_si512(xb + c + 32));
                lo = l2;
            }
        } else {
            for (; c + 64 <= cols; c += 64) {
                a0 = _mm512_dpbf16_ps(a0, dp_w32(w + c, 32), (__m512bh)_mm512_load_si512(xb + c));
                a1 = _mm512_dpbf16_ps(a1, dp_w32(w + c + 32, 32), (__m512bh)_mm512_load_si512(xb + c + 32));
            }
        }
        for (; c < cols; c += 32) {
            __m512bh wv = dp_w32(w + c, cols - c), xv = (__m512bh)_mm512_load_si512(xb + c);
            if ((c >> 5) & 1) a1 = _mm512_dpbf16_ps(a1, wv, xv);
            else a0 = _mm512_dpbf16_ps(a0, wv, xv);
        }
        y[r] = mm_store(dp_hsum(_mm512_add_ps(a0, a1)), round);
    }
}

/* Two MXFP4 rows a and b (b may be NULL) times one token: group g is block g (chain g % 2), decoded in
 * registers; the two rows' four chains hide the VDPBF16PS latency that one row's two chains leave exposed
 * (the decode is compute-bound here). */
ALWAYS_INLINE void dp_mx_dot2(const uint8_t *pa, const uint8_t *sa, const uint8_t *pb, const uint8_t *sb, int groups,
                              const uint16_t *xb, float *ya, float *yb, int round) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    int g = 0;
    for (; g + 2 <= groups; g += 2) {
        __m512bh x0 = (__m512bh)_mm512_load_si512(xb + (size_t)g * 32);
        __m512bh x1 = (__m512bh)_mm512_load_si512(xb + (size_t)g * 32 + 32);
        a0 = _mm512_dpbf16_ps(a0, dp_mx_group(pa + (size_t)g * 16, sa[g]), x0);
        a1 = _mm512_dpbf16_ps(a1, dp_mx_group(pa + (size_t)g * 16 + 16, sa[g + 1]), x1);
        if (pb) {
            b0 = _mm512_dpbf16_ps(b0, dp_mx_group(pb + (size_t)g * 16, sb[g]), x0);
            b1 = _mm512_dpbf16_ps(b1, dp_mx_group(pb + (size_t)g * 16 + 16, sb[g + 1]), x1);
        }
    }
    if (g < groups) {
        __m512bh x0 = (__m512bh)_mm512_load_si512(xb + (size_t)g * 32);
        a0 = _mm512_dpbf16_ps(a0, dp_mx_group(pa + (size_t)g * 16, sa[g]), x0);
        if (pb) b0 = _mm512_dpbf16_ps(b0, dp_mx_group(pb + (size_t)g * 16, sb[g]), x0);
    }
    *ya = mm_store(dp_hsum(_mm512_add_ps(a0, a1)), round);
    if (pb) *yb = mm_store(dp_hsum(_mm512_add_ps(b0, b1)), round);
}

/* Decode of MXFP4 rows [r0, r1): row r0 + i beside row r0 + h + i (h = half the range), two sequential
 * streams (two adjacent rows at once measured 0.55x one row from memory, the halves 1.0x). */
static void dp_decode_mx(const k3c_mxfp4_mat *W, int r0, int r1, const uint16_t *xb, float *y, int round) {
    int groups = W->cols / K3C_MXFP4_GROUP, h = (r1 - r0 + 1) / 2;
    size_t ldp = (size_t)W->cols / 2;
    for (int i = 0; i < h; i++) {
        int ra = r0 + i, rb = r0 + h + i;
        const uint8_t *pa = W->packed + (size_t)ra * ldp, *sa = W->scale + (size_t)ra * groups;
        if (rb < r1)
            dp_mx_dot2(pa, sa, W->packed + (size_t)rb * ldp, W->scale + (size_t)rb * groups, groups, xb, y + ra, y + rb,
                       round);
        else
            dp_mx_dot2(pa, sa, NULL, NULL, groups, xb, y + ra, NULL, round);
    }
}

/* The bf16 copy of a token tile of the row-stream tiles lives on the stack: at most this many values (64
 * KiB); wider rows convert x in registers instead (the same values, so the same outputs). */
#define DP_XROW_ELEMS 32768

/* Rows [r0, r1) of a product for T < BK_MIN_T tokens (or without pool scratch), token tile by token tile
 * (x converted to bf16 once per tile), tiles of DP_ROWS rows x the tile's tokens. */
static void dp_rows(const k3c_mm *m, size_t ldx, size_t ldy, int r0, int r1) {
    int cols = m->W ? m->W->cols : m->Wq->cols, T = m->T;
    size_t ld = dp_ld(cols);
    int tt = ld <= DP_XROW_ELEMS ? (int)(DP_XROW_ELEMS / ld) : 0;
    if (tt > DP_TOKS) tt = DP_TOKS;
    uint16_t xs[DP_XROW_ELEMS] __attribute__((aligned(64)));
    for (int t0 = 0; t0 < T; t0 += tt ? tt : DP_TOKS) {
        int NT = T - t0 < (tt ? tt : DP_TOKS) ? T - t0 : (tt ? tt : DP_TOKS);
        const float *xt = m->x + (size_t)t0 * ldx;
        float *yt = m->y + (size_t)t0 * ldy;
        if (tt) dp_pack(xt, ldx, NT, cols, xs, ld);
        if (T == 1 && tt) {
            if (m->Wq) dp_decode_mx(m->Wq, r0, r1, xs, yt, m->round);
            else dp_decode_bf16(m->W, r0, r1, xs, yt, m->round);
            return;
        }
        if (m->Wq) { /* cols <= MX_SPLIT_FLOATS, so tt > 0 */
            for (int r = r0; r < r1; r += DP_ROWS) {
                int R = r1 - r < DP_ROWS ? r1 - r : DP_ROWS;
                dp_mx_tile_any(m->Wq->packed + (size_t)r * (cols / 2), (size_t)cols / 2,
                               m->Wq->scale + (size_t)r * (cols / 32), (size_t)cols / 32, R, cols / 32, xs, ld, NT,
                               yt + r, ldy, m->round);
            }
        } else if (tt) {
            dp_rows_packed(m->W->w + (size_t)r0 * cols, (size_t)cols, r1 - r0, xs, ld, NT, 0, cols, cols, NULL, yt + r0,
                           ldy, m->round);
        } else {
            dp_rows_f32x(m->W->w + (size_t)r0 * cols, (size_t)cols, r1 - r0, xt, ldx, NT, cols, yt + r0, ldy, m->round);
        }
    }
}

/* Rows per blocked unit (0: the row-stream tiles): as bk_unit_rows, on the bf16 panel. */
static int dp_unit_rows(const k3c_mm *m, int have_scratch) {
    int cols = m->W ? m->W->cols : m->Wq->cols;
    if (!have_scratch || m->T < BK_MIN_T || cols <= 0) return 0;
    size_t rows = DP_PANEL_ELEMS / dp_ld(cols);
    return rows > BK_ROWS ? BK_ROWS : (int)rows;
}

/* Rows [r0, r1) of one product for all its tokens, blocked: (MXFP4) decode the rows into the panel, then
 * token tile by token tile and column block by column block, x packed as bf16, every row pair of the unit. */
static void dp_blocked_rows(const k3c_mm *m, size_t ldx, size_t ldy, int r0, int r1, void *scratch) {
    int cols = m->W ? m->W->cols : m->Wq->cols, T = m->T;
    uint16_t *panel = scratch, *xs = panel + DP_PANEL_ELEMS;
    __m512 *save = (__m512 *)(xs + DP_XS_ELEMS); /* [row][token][2] */
    const uint16_t *w;
    size_t ldw;
    if (m->W) {
        w = m->W->w + (size_t)r0 * cols, ldw = (size_t)cols;
    } else {
        int groups = cols / K3C_MXFP4_GROUP;
        ldw = dp_ld(cols);
        for (int r = r0; r < r1; r++)
            dp_mx_row(m->Wq->packed + (size_t)r * (cols / 2), m->Wq->scale + (size_t)r * groups, groups,
                      panel + (size_t)(r - r0) * ldw);
        w = panel;
    }
    int nblk = 4 * cols <= 7 * DP_KC ? 1 : (cols + DP_KC - 1) / DP_KC;
    int kc = nblk == 1 ? cols : ((cols + nblk - 1) / nblk + 63) / 64 * 64;
    for (int t0 = 0; t0 < T; t0 += DP_TOKS) {
        int NT = T - t0 < DP_TOKS ? T - t0 : DP_TOKS;
        for (int c0 = 0; c0 < cols; c0 += kc) {
            int c1 = c0 + kc < cols ? c0 + kc : cols;
            size_t ld = dp_ld(c1 - c0);
            for (int t = 0; t < NT; t++) { /* packed side by side: a few pages (see bk_rows), zero-padded */
                const float *xt = m->x + (size_t)(t0 + t) * ldx + c0;
                for (int c = 0; c < c1 - c0; c += 32)
                    _mm512_store_si512(xs + t * ld + c, (__m512i)dp_x32(xt + c, c1 - c0 - c));
            }
            dp_rows_packed(w, ldw, r1 - r0, xs, ld, NT, c0, c1, cols, save, m->y + (size_t)t0 * ldy + r0, ldy,
                           m->round);
        }
    }
}
#endif

/* ================================ batches ================================ */

typedef struct mm_batch {
    k3c_pool *pool;
    const k3c_mm *mm;
    int n;
    const int *unit_rows; /* [n] rows per unit of product i */
    const int *blocked;   /* [n] product i runs blocked (bk_rows, dp_blocked_rows) */
    const int *dp;        /* [n] product i multiplies in bf16 (the bf16 dot-product section) */
    const int *first;     /* [n + 1] first unit of product i */
} mm_batch;

static void mm_units(void *ctx, int b, int e, int worker) {
    const mm_batch *j = ctx;
    int i = 0;
    while (i < j->n && j->first[i + 1] <= b) i++;
    for (int u = b; u < e;) {
        while (j->first[i + 1] <= u) i++;
        const k3c_mm *m = &j->mm[i];
        int ue = e < j->first[i + 1] ? e : j->first[i + 1];
        int rows = m->W ? m->W->rows : m->Wq->rows, cols = m->W ? m->W->cols : m->Wq->cols;
        int r0 = (u - j->first[i]) * j->unit_rows[i];
        int r1 = (ue - j->first[i]) * j->unit_rows[i];
        if (r1 > rows) r1 = rows;
        size_t ldx = m->ldx ? m->ldx : (size_t)cols, ldy = m->ldy ? m->ldy : (size_t)rows;
#if defined(MM_DP)
        if (j->dp[i]) {
            if (j->blocked[i])
                for (int ru = r0; ru < r1; ru += j->unit_rows[i])
                    dp_blocked_rows(m, ldx, ldy, ru, r1 - ru < j->unit_rows[i] ? r1 : ru + j->unit_rows[i],
                                    k3c_pool_scratch(j->pool, worker));
            else dp_rows(m, ldx, ldy, r0, r1);
            u = ue;
            continue;
        }
#endif
#if defined(MM_AVX512)
        if (j->blocked[i]) /* one panel per unit */
            for (int ru = r0; ru < r1; ru += j->unit_rows[i])
                bk_rows(m, ldx, ldy, ru, r1 - ru < j->unit_rows[i] ? r1 : ru + j->unit_rows[i],
                        k3c_pool_scratch(j->pool, worker));
        else
#endif
        if (m->W) bf16_rows(m->W, m->x, ldx, m->T, m->y, ldy, m->round, r0, r1);
        else mx_rows(m->Wq, m->x, ldx, m->T, m->y, ldy, m->round, r0, r1);
        u = ue;
    }
}

void k3c_matmul_batch(k3c_pool *p, const k3c_mm *mm, int n) {
    if (n <= 0) return;
    int ur[n], blocked[n], dp[n], first[n + 1]; /* n: a layer's products at most (2 per routed expert + a few) */
    double work = 0;
    for (int i = 0; i < n; i++) {
        const k3c_mm *m = &mm[i];
        int rows = m->W ? m->W->rows : m->Wq->rows, cols = m->W ? m->W->cols : m->Wq->cols;
        if (m->T > 0 && rows > 0) work += (double)rows * cols * m->T;
    }
    if (work < MM_INLINE_WORK) p = NULL;
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        const k3c_mm *m = &mm[i];
        int rows = m->W ? m->W->rows : m->Wq->rows, cols = m->W ? m->W->cols : m->Wq->cols;
        blocked[i] = dp[i] = 0;
        if (m->T <= 0 || rows <= 0) {
            ur[i] = 1;
            first[i + 1] = first[i];
            continue;
        }
        int u = 0;
#if defined(MM_DP)
        /* MXFP4 rows wider than the scales of dp_mx_tile stay on mx_row_scalar (no model has one) */
        dp[i] = m->xbf16 && (m->W || cols <= MX_SPLIT_FLOATS);
        if (dp[i]) u = dp_unit_rows(m, p != NULL);
        else
#endif
#if defined(MM_AVX512)
        u = bk_unit_rows(m, p != NULL);
#endif
        blocked[i] = u > 0;
        if (!u) {
            u = MM_UNIT_ELEMS / (cols > 0 ? cols : 1);
            u = (u + MM_ROWS - 1) / MM_ROWS * MM_ROWS;
            if (u < MM_ROWS) u = MM_ROWS;
        }
        ur[i] = u;
        first[i + 1] = first[i] + (rows + u - 1) / u;
    }
    mm_batch j = {p, mm, n, ur, blocked, dp, first};
    k3c_pool_for_worker(p, first[n], mm_units, &j);
}

void k3c_matmul_bf16(k3c_pool *p, const k3c_mat *W, const float *x, int T, float *y) {
    k3c_mm m = {.W = W, .x = x, .T = T, .y = y};
    k3c_matmul_batch(p, &m, 1);
}

/* cols must be a multiple of 32 (the loader checks it); a partial last group would be ignored. */
void k3c_matmul_mxfp4(k3c_pool *p, const k3c_mxfp4_mat *W, const float *x, int T, float *y) {
    k3c_mm m = {.Wq = W, .x = x, .T = T, .y = y};
    k3c_matmul_batch(p, &m, 1);
}
