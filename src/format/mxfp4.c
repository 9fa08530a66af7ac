/* MXFP4 codec: E2M1 elements (two per byte, even element in the low nibble) with one E8M0 scale per 32. */
#include "format/mxfp4.h"

#include <math.h>
#include <string.h>

const float k3c_e2m1_values[16] = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

float k3c_e8m0_to_f32(uint8_t e) {
    if (e == 255) return NAN;
    /* e in 1..254 is exactly an f32 biased exponent with a zero mantissa; e = 0 is 2^-127, the f32
     * subnormal with only the top mantissa bit set. */
    uint32_t bits = e ? (uint32_t)e << 23 : 0x00400000u;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void k3c_mxfp4_dequant_row(const uint8_t *packed, const uint8_t *scale, int cols, float *out) {
    for (int g = 0; g < cols / K3C_MXFP4_GROUP; g++) {
        float s = k3c_e8m0_to_f32(scale[g]);
        const uint8_t *p = packed + g * (K3C_MXFP4_GROUP / 2);
        float *o = out + g * K3C_MXFP4_GROUP;
        for (int i = 0; i < K3C_MXFP4_GROUP / 2; i++) {
            o[2 * i] = k3c_e2m1_values[p[i] & 15] * s;
            o[2 * i + 1] = k3c_e2m1_values[p[i] >> 4] * s;
        }
    }
}

/* Magnitude code (0..7) nearest to v >= 0 on the grid {0, .5, 1, 1.5, 2, 3, 4, 6}; a value exactly halfway
 * goes to the even code, as round-to-nearest-even does for E2M1's mantissa bit. Values past 6 saturate. */
static int e2m1_round_magnitude(double v) {
    static const double mid[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0}; /* between code c and c + 1 */
    int c = 0;
    while (c < 7 && v > mid[c]) c++;
    /* v == mid[c]: the loop stopped at the lower code c; ties go up when c is odd. */
    if (c < 7 && v == mid[c] && (c & 1)) c++;
    return c;
}

/* Smallest e with max <= 6 * 2^e, from max = m * 2^k (m in [0.5, 1)): 6 * 2^e = 0.75 * 2^(e+3). Exact,
 * unlike log2 of a rounded quotient. */
static int smallest_scale_exponent(float max) {
    if (!(max > 0.0f)) return -127; /* all zeros (or NaN): any scale is exact; take the smallest */
    if (isinf(max)) return 127;
    int k;
    double m = frexp((double)max, &k);
    return m <= 0.75 ? k - 3 : k - 2;
}

void k3c_mxfp4_quant_row(const float *x, int cols, uint8_t *packed, uint8_t *scale) {
    for (int g = 0; g < cols / K3C_MXFP4_GROUP; g++) {
        const float *xg = x + g * K3C_MXFP4_GROUP;
        float max = 0.0f;
        for (int i = 0; i < K3C_MXFP4_GROUP; i++) {
            float a = fabsf(xg[i]);
            if (a > max) max = a; /* NaN never compares greater: it does not drive the scale */
        }
        int e = smallest_scale_exponent(max);
        if (e < -127) e = -127; /* E8M0 holds 2^-127 .. 2^127 (byte 255 is NaN) */
        if (e > 127) e = 127;
        scale[g] = (uint8_t)(e + 127);
        uint8_t *p = packed + g * (K3C_MXFP4_GROUP / 2);
        for (int i = 0; i < K3C_MXFP4_GROUP; i++) {
            /* Scaling by a power of two in double is exact for every finite float. NaN elements become +0. */
            double v = isnan(xg[i]) ? 0.0 : ldexp(fabs((double)xg[i]), -e);
            int code = e2m1_round_magnitude(v) | (signbit(xg[i]) && !isnan(xg[i]) ? 8 : 0);
            if (i & 1) p[i / 2] = (uint8_t)((p[i / 2] & 0x0f) | (code << 4));
            else p[i / 2] = (uint8_t)code;
        }
    }
}

int k3c_mxfp4_scales_have_nan(const uint8_t *scale, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (scale[i] == 255) return 1;
    return 0;
}
