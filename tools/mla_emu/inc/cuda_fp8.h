/* emulator shim (shadows ../moe_emu/inc/cuda_fp8.h): the FP8 E4M3 conversions common.cuh uses, emulated from
 * the PTX semantics of sm_90's instructions, not from util/fp8.h (main.c checks the two agree on every f32):
 *  - __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) = cvt.rn.satfinite.e4m3x2.f32: round to nearest
 *    even from the exact value (subnormal quantum 2^-9), |result| > 448 (incl. +-inf) -> sign-kept 448 (0x7e),
 *    NaN -> NaN (0x7f: the canonical NaN cuda_fp8.hpp's own host path returns; util/fp8.h keeps the sign,
 *    0xff for a negative NaN: both decode to NaN), -0 kept;
 *  - __nv_cvt_fp8_to_halfraw(c, __NV_E4M3) = cvt.rn.f16x2.e4m3x2: exact (every E4M3 value is an f16 value),
 *    NaN -> 0x7fff; __half2float = cvt.f32.f16: exact. */
#pragma once
#include <cmath>
#include <cstdint>
typedef uint8_t __nv_fp8_storage_t;
struct __half_raw { unsigned short x; };
struct __half {
    unsigned short x;
    __half(__half_raw r) : x(r.x) {}
};
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
void emu_fail(const char *fmt, ...);

static inline uint8_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat, __nv_fp8_interpretation_t kind) {
    if (sat != __NV_SATFINITE || kind != __NV_E4M3) emu_fail("fp8: only satfinite E4M3 is emulated");
    if (std::isnan(x)) return 0x7f;
    uint8_t sign = std::signbit(x) ? 0x80 : 0;
    double a = std::fabs((double)x);
    if (a > 448.0) return sign | 0x7e; /* beyond the largest finite (incl. inf); 448 < a < 464 rounds to 448 too */
    if (a == 0.0) return sign;
    int e;
    std::frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int E = e - 1 < -6 ? -6 : e - 1;
    double qn = std::ldexp(1.0, E - 3); /* 3 mantissa bits; below 2^-6 the quantum stays 2^-9 */
    double r = std::nearbyint(a / qn) * qn; /* a / qn exact (power of two), nearbyint: ties to even */
    if (r > 448.0) r = 448.0;
    if (r < std::ldexp(1.0, -6)) return sign | (uint8_t)(r / std::ldexp(1.0, -9)); /* subnormal (or 0) */
    std::frexp(r, &e);
    int m = (int)(r / std::ldexp(1.0, e - 1 - 3)) - 8;
    return sign | (uint8_t)((e - 1 + 7) << 3 | m);
}

static inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t c, __nv_fp8_interpretation_t kind) {
    if (kind != __NV_E4M3) emu_fail("fp8: only E4M3 is emulated");
    unsigned short sign = (c & 0x80) ? 0x8000 : 0;
    int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return __half_raw{0x7fff};
    if (e == 0 && m == 0) return __half_raw{sign};
    if (e == 0) { /* m 2^-9: normalise, f16 exponent of 2^k is k + 15 */
        int k = 31 - __builtin_clz(m); /* m = 2^k (1 + f) */
        unsigned short frac = (unsigned short)(((m << (10 - k)) & 0x3ff));
        return __half_raw{(unsigned short)(sign | (k - 9 + 15) << 10 | frac)};
    }
    return __half_raw{(unsigned short)(sign | (e - 7 + 15) << 10 | m << 7)};
}

static inline float __half2float(__half h) {
    unsigned s = h.x >> 15, e = (h.x >> 10) & 31, m = h.x & 0x3ff;
    float v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(1024 + m), (int)e - 25);
    return s ? -v : v;
}
