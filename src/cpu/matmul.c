/* Matrix products y[t, r] = sum_c W[r, c] * x[t, c] with bf16 or MXFP4 weights and f32 activations.
 *
 * Decode (T = 1) is bound by the weight stream, so the loops read each weight byte exactly once per call:
 * the pool splits the rows, a thread takes a block of rows, and for that block runs over all tokens in
 * register tiles of (rows x tokens) accumulators. While the token loop runs, the block's rows stay in L1/L2,
 * so prefill does not re-stream the matrix from memory per token.
 *
 * Three code paths, picked by what the compiler targets (the Makefile uses -march=native):
 *   __AVX512F__  16 lanes; bf16 -> f32 by widening u16 to u32 and shifting into the upper half;
 *                MXFP4 codes looked up in a 16-entry register table with permutexvar.
 *   __AVX2__     8 lanes; MXFP4 magnitude via permutevar8x32 over 8 entries, sign from code bit 3.
 *   otherwise    portable scalar loops.
 * All accumulate in f32; each output is the sum of per-lane partial sums (so the reduction order differs
 * from a sequential sum, within f32 rounding).
 *
 * Checking the fallbacks by hand (they are not what -march=native builds):
 *   cc -std=gnu11 -O2 -Isrc -Iinclude -march=native -mno-avx512f -c src/cpu/matmul.c   (AVX2 path)
 *   cc -std=gnu11 -O2 -Isrc -Iinclude -march=x86-64 -c src/cpu/matmul.c               (scalar path)
 * and to run the tests on them (NVCC= skips the CUDA parts):
 *   make BUILD=build-avx2 ARCHFLAGS="-march=native -mno-avx512f" NVCC= build-avx2/test_k3c && build-avx2/test_k3c cpu_
 *   make BUILD=build-scalar ARCHFLAGS="-march=x86-64" NVCC= build-scalar/test_k3c && build-scalar/test_k3c cpu_ */
#include <string.h>

#include "cpu/ops.h"
#include "format/mxfp4.h"
#include "util/bf16.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* Below this many multiply-adds a call runs on the caller: waking workers would cost more. */
#define MM_INLINE_WORK 65536

/* Rows per register tile (both formats' weight-row blocks). */
#define MM_ROWS 4
/* Software prefetch distance (elements) in the multi-token tile: a small measured gain. */
#define MM_PREFETCH 1024
#if defined(__AVX512F__)
#define MM_TOKS 4   /* 4x4 accumulators + 4 weight vectors + x: 21 of 32 zmm */
#define MX_TOKS 8
#elif defined(__AVX2__)
#define MM_TOKS 2   /* 4x2 accumulators + 4 weight vectors + x: 13 of 16 ymm */
#define MX_TOKS 4
#else
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
    if (e == 0) return 0x1p-127f;
    uint32_t u = e == 255 ? 0x7fc00000u : (uint32_t)e << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ================================ bf16 ================================ */

/* One tile: R weight rows (stride ldw) times NT tokens (stride ldx); y[t * ldy + r]. R and NT are
 * compile-time constants at every call site, so the accumulator arrays live in registers. */
#if defined(__AVX512F__)
ALWAYS_INLINE __m512 bf16x16_load(const uint16_t *p) {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

ALWAYS_INLINE void bf16_tile(const uint16_t *w, size_t ldw, int R, const float *x, size_t ldx, int NT, int cols,
                             float *y, size_t ldy) {
    __m512 acc[MM_ROWS][MM_TOKS];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    int c = 0;
    for (; c + 16 <= cols; c += 16) {
        __m512 wv[MM_ROWS];
        UNROLL
        for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(w + r * ldw + c + MM_PREFETCH), _MM_HINT_T0);
            wv[r] = bf16x16_load(w + r * ldw + c);
        }
        UNROLL
        for (int t = 0; t < NT; t++) {
            __m512 xv = _mm512_loadu_ps(x + t * ldx + c);
            UNROLL
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++) {
            float s = _mm512_reduce_add_ps(acc[r][t]);
            for (int cc = c; cc < cols; cc++) s += bf16_to_f32(w[r * ldw + cc]) * x[t * ldx + cc];
            y[t * ldy + r] = s;
        }
}
#elif defined(__AVX2__)
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
                             float *y, size_t ldy) {
    __m256 acc[MM_ROWS][MM_TOKS];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    int c = 0;
    for (; c + 8 <= cols; c += 8) {
        __m256 wv[MM_ROWS];
        UNROLL
        for (int r = 0; r < R; r++) wv[r] = bf16x8_load(w + r * ldw + c);
        UNROLL
        for (int t = 0; t < NT; t++) {
            __m256 xv = _mm256_loadu_ps(x + t * ldx + c);
            UNROLL
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < NT; t++) {
            float s = hsum256(acc[r][t]);
            for (int cc = c; cc < cols; cc++) s += bf16_to_f32(w[r * ldw + cc]) * x[t * ldx + cc];
            y[t * ldy + r] = s;
        }
}
#else
ALWAYS_INLINE void bf16_tile(const uint16_t *w, size_t ldw, int R, const float *x, size_t ldx, int NT, int cols,
                             float *y, size_t ldy) {
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
        for (int t = 0; t < NT; t++) y[t * ldy + r] = acc[r][t];
}
#endif

/* Decode (T = 1): one row at a time with four accumulators across the columns. A single sequential
 * stream per thread keeps the hardware prefetchers ahead; four rows interleaved (the tile above) measured
 * ~25% less bandwidth on this machine. */
#if defined(__AVX512F__)
static void bf16_row1(const uint16_t *w, const float *x, int cols, float *y) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int c = 0;
    for (; c + 64 <= cols; c += 64) {
        a0 = _mm512_fmadd_ps(bf16x16_load(w + c), _mm512_loadu_ps(x + c), a0);
        a1 = _mm512_fmadd_ps(bf16x16_load(w + c + 16), _mm512_loadu_ps(x + c + 16), a1);
        a2 = _mm512_fmadd_ps(bf16x16_load(w + c + 32), _mm512_loadu_ps(x + c + 32), a2);
        a3 = _mm512_fmadd_ps(bf16x16_load(w + c + 48), _mm512_loadu_ps(x + c + 48), a3);
    }
    for (; c + 16 <= cols; c += 16) a0 = _mm512_fmadd_ps(bf16x16_load(w + c), _mm512_loadu_ps(x + c), a0);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; c < cols; c++) s += bf16_to_f32(w[c]) * x[c];
    *y = s;
}
#elif defined(__AVX2__)
static void bf16_row1(const uint16_t *w, const float *x, int cols, float *y) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
        a0 = _mm256_fmadd_ps(bf16x8_load(w + c), _mm256_loadu_ps(x + c), a0);
        a1 = _mm256_fmadd_ps(bf16x8_load(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
        a2 = _mm256_fmadd_ps(bf16x8_load(w + c + 16), _mm256_loadu_ps(x + c + 16), a2);
        a3 = _mm256_fmadd_ps(bf16x8_load(w + c + 24), _mm256_loadu_ps(x + c + 24), a3);
    }
    for (; c + 8 <= cols; c += 8) a0 = _mm256_fmadd_ps(bf16x8_load(w + c), _mm256_loadu_ps(x + c), a0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; c < cols; c++) s += bf16_to_f32(w[c]) * x[c];
    *y = s;
}
#else
static void bf16_row1(const uint16_t *w, const float *x, int cols, float *y) {
    bf16_tile(w, (size_t)cols, 1, x, (size_t)cols, 1, cols, y, 1);
}
#endif

/* Dispatch a runtime (R, NT) to the specialised tile. */
#define BF16_TILE_CASE(RR, TT)                                                                                     \
    case (RR) * 16 + (TT): bf16_tile(w, ldw, RR, x, ldx, TT, cols, y, ldy); break;

static void bf16_tile_any(const uint16_t *w, size_t ldw, int R, const float *x, size_t ldx, int NT, int cols,
                          float *y, size_t ldy) {
    switch (R * 16 + NT) {
        BF16_TILE_CASE(1, 1) BF16_TILE_CASE(2, 1) BF16_TILE_CASE(3, 1) BF16_TILE_CASE(4, 1)
        BF16_TILE_CASE(1, 2) BF16_TILE_CASE(2, 2) BF16_TILE_CASE(3, 2) BF16_TILE_CASE(4, 2)
#if MM_TOKS >= 4
        BF16_TILE_CASE(1, 3) BF16_TILE_CASE(2, 3) BF16_TILE_CASE(3, 3) BF16_TILE_CASE(4, 3)
        BF16_TILE_CASE(1, 4) BF16_TILE_CASE(2, 4) BF16_TILE_CASE(3, 4) BF16_TILE_CASE(4, 4)
#endif
    default: break; /* unreachable: R <= MM_ROWS, NT <= MM_TOKS */
    }
}

typedef struct mm_job {
    const void *W; /* k3c_mat or k3c_mxfp4_mat */
    const float *x;
    int T;
    float *y;
} mm_job;

/* Rows [b*MM_ROWS, e*MM_ROWS) for all tokens: the block's rows are loaded from memory once, then reused
 * from cache by every token tile. */
static void bf16_rows(void *ctx, int b, int e) {
    const mm_job *j = ctx;
    const k3c_mat *W = j->W;
    size_t ldw = (size_t)W->cols;
    if (j->T == 1) {
        for (int r = b * MM_ROWS; r < e * MM_ROWS && r < W->rows; r++)
            bf16_row1(W->w + (size_t)r * ldw, j->x, W->cols, j->y + r);
        return;
    }
    for (int rb = b; rb < e; rb++) {
        int r0 = rb * MM_ROWS;
        int R = W->rows - r0 < MM_ROWS ? W->rows - r0 : MM_ROWS;
        for (int t0 = 0; t0 < j->T; t0 += MM_TOKS) {
            int NT = j->T - t0 < MM_TOKS ? j->T - t0 : MM_TOKS;
            bf16_tile_any(W->w + (size_t)r0 * ldw, ldw, R, j->x + (size_t)t0 * W->cols, (size_t)W->cols, NT,
                          W->cols, j->y + (size_t)t0 * W->rows + r0, (size_t)W->rows);
        }
    }
}

void k3c_matmul_bf16(k3c_pool *p, const k3c_mat *W, const float *x, int T, float *y) {
    if (T <= 0 || W->rows <= 0) return;
    mm_job j = {W, x, T, y};
    int blocks = (W->rows + MM_ROWS - 1) / MM_ROWS;
    if ((double)W->rows * W->cols * T < MM_INLINE_WORK) p = NULL;
    k3c_pool_for(p, blocks, bf16_rows, &j);
}

void k3c_bf16_row(const k3c_mat *W, int row, float *out) {
    const uint16_t *w = W->w + (size_t)row * W->cols;
    for (int c = 0; c < W->cols; c++) out[c] = bf16_to_f32(w[c]);
}

/* ================================ MXFP4 ================================ */

/* One weight row times NT tokens. Each 32-element group is dequantized once in registers (codes -> table
 * values -> times the group's power-of-two scale, exact) and used by all NT tokens. */
#if defined(__AVX512F__)
ALWAYS_INLINE void mx_tile(const uint8_t *pk, const uint8_t *sc, int groups, const float *x, size_t ldx, int NT,
                           float *y, size_t ldy) {
    const __m512 tab = _mm512_loadu_ps(mx_e2m1);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    /* Two accumulators per token (one per half group): halves the FMA dependency chain. */
    __m512 acc[MX_TOKS], acc2[MX_TOKS];
    UNROLL
    for (int t = 0; t < NT; t++) acc[t] = acc2[t] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m128i b = _mm_loadu_si128((const __m128i *)(pk + (size_t)g * 16));
        __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
        /* Interleave: even columns are low nibbles, odd columns high nibbles. */
        __m128i c0 = _mm_unpacklo_epi8(lo, hi), c1 = _mm_unpackhi_epi8(lo, hi);
        __m512 s = _mm512_set1_ps(mx_e8m0(sc[g]));
        __m512 w0 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(c0), tab), s);
        __m512 w1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(c1), tab), s);
        UNROLL
        for (int t = 0; t < NT; t++) {
            const float *xg = x + t * ldx + (size_t)g * 32;
            acc[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xg), acc[t]);
            acc2[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xg + 16), acc2[t]);
        }
    }
    UNROLL
    for (int t = 0; t < NT; t++) y[t * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t], acc2[t]));
}
#elif defined(__AVX2__)
/* 8 codes (bytes) -> 8 values: magnitude from an 8-entry table by the low 3 bits, sign from bit 3. */
ALWAYS_INLINE __m256 mx_lookup8(__m128i codes8, __m256 mag) {
    __m256i idx = _mm256_cvtepu8_epi32(codes8);
    __m256 v = _mm256_permutevar8x32_ps(mag, idx);
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(v, _mm256_castsi256_ps(sign));
}

ALWAYS_INLINE void mx_tile(const uint8_t *pk, const uint8_t *sc, int groups, const float *x, size_t ldx, int NT,
                           float *y, size_t ldy) {
    const __m256 mag = _mm256_loadu_ps(mx_e2m1);
    const __m128i low4 = _mm_set1_epi8(0x0f);
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
    for (int t = 0; t < NT; t++) y[t * ldy] = hsum256(_mm256_add_ps(acc[t], acc2[t]));
}
#else
ALWAYS_INLINE void mx_tile(const uint8_t *pk, const uint8_t *sc, int groups, const float *x, size_t ldx, int NT,
                           float *y, size_t ldy) {
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
    for (int t = 0; t < NT; t++) y[t * ldy] = acc[t];
}
#endif

#define MX_TILE_CASE(TT)                                                                                           \
    case TT: mx_tile(pk, sc, groups, x, ldx, TT, y, ldy); break;

static void mx_tile_any(const uint8_t *pk, const uint8_t *sc, int groups, const float *x, size_t ldx, int NT,
                        float *y, size_t ldy) {
    switch (NT) {
        MX_TILE_CASE(1) MX_TILE_CASE(2) MX_TILE_CASE(3) MX_TILE_CASE(4)
#if MX_TOKS >= 8
        MX_TILE_CASE(5) MX_TILE_CASE(6) MX_TILE_CASE(7) MX_TILE_CASE(8)
#endif
    default: break; /* unreachable: NT <= MX_TOKS */
    }
}

static void mx_rows(void *ctx, int b, int e) {
    const mm_job *j = ctx;
    const k3c_mxfp4_mat *W = j->W;
    int groups = W->cols / K3C_MXFP4_GROUP;
    for (int r = b; r < e; r++) {
        const uint8_t *pk = W->packed + (size_t)r * (W->cols / 2);
        const uint8_t *sc = W->scale + (size_t)r * groups;
        for (int t0 = 0; t0 < j->T; t0 += MX_TOKS) {
            int NT = j->T - t0 < MX_TOKS ? j->T - t0 : MX_TOKS;
            mx_tile_any(pk, sc, groups, j->x + (size_t)t0 * W->cols, (size_t)W->cols, NT,
                        j->y + (size_t)t0 * W->rows + r, (size_t)W->rows);
        }
    }
}

/* cols must be a multiple of 32 (the loader checks it); a partial last group would be ignored. */
void k3c_matmul_mxfp4(k3c_pool *p, const k3c_mxfp4_mat *W, const float *x, int T, float *y) {
    if (T <= 0 || W->rows <= 0) return;
    mm_job j = {W, x, T, y};
    if ((double)W->rows * W->cols * T < MM_INLINE_WORK) p = NULL;
    k3c_pool_for(p, W->rows, mx_rows, &j);
}
