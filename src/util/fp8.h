/* FP8 E4M3 ("e4m3fn": 1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities, S.1111.111 is NaN;
 * largest finite 448, smallest normal 2^-6, smallest subnormal 2^-9), the element of the optional fp8 MLA
 * latent cache. Encoding rounds to nearest, ties to even, and saturates finite values beyond 448 to +-448 (a
 * cache must not turn a large latent into NaN); NaN stays NaN; -0 keeps its sign. No scale: the latent cache
 * stores values at scale 1 (k3c applies no calibration). */
#ifndef K3C_UTIL_FP8_H
#define K3C_UTIL_FP8_H

#include <math.h>
#include <stdint.h>

static inline float k3c_e4m3_to_f32(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9); /* subnormal: m/8 * 2^-6 */
    else v = ldexpf((float)(8 + m), e - 10);   /* (1 + m/8) * 2^(e-7) */
    return (c & 0x80) ? -v : v;
}

static inline uint8_t k3c_f32_to_e4m3(float f) {
    uint8_t sign = signbit(f) ? 0x80 : 0;
    if (isnan(f)) return (uint8_t)(sign | 0x7f);
    float a = fabsf(f);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7e);
    if (a < 0.015625f) { /* below the smallest normal: multiples of 2^-9 (q = 8 is the smallest normal's code) */
        int q = (int)nearbyintf(a * 512.0f);
        return (uint8_t)(sign | q);
    }
    int ex;
    frexpf(a, &ex);                                   /* a = fr 2^ex, fr in [0.5, 1): a in [2^(ex-1), 2^ex) */
    int E = ex - 1;                                   /* -6 .. 8 */
    int q = (int)nearbyintf(ldexpf(a, 3 - E));        /* 8 .. 16: the significand in eighths, rounded (exact scaling) */
    if (q == 16) q = 8, E++;                          /* rounded up into the next binade */
    if (E > 8 || (E == 8 && q > 14)) return (uint8_t)(sign | 0x7e); /* only reachable by rounding past 448 */
    return (uint8_t)(sign | ((E + 7) << 3) | (q - 8));
}

/* The rounding an fp8 cache store applies. */
static inline float k3c_e4m3_round(float f) { return k3c_e4m3_to_f32(k3c_f32_to_e4m3(f)); }

#endif
