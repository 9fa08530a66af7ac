/* FP8 E4M3 written from the format's definition alone (independent of src/util/fp8.h): code values from
 * the field formula and rounding as a scan over every code. */
#include "ref_fp8.h"

#include <math.h>

/* The value of code c by the format's definition: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 (m/8). */
double ref_e4m3_value(int c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

/* Nearest finite E4M3 value to x by scanning every code: ties to the code with an even mantissa; beyond the
 * largest finite value, that value (saturation). The sign of zero follows x. */
double ref_e4m3_nearest(double x) {
    if (isnan(x)) return NAN;
    double best = 0, bd = INFINITY;
    int bc = 0;
    for (int c = 0; c < 256; c++) {
        double v = ref_e4m3_value(c);
        if (isnan(v) || (!!signbit(v) != !!signbit(x) && v != 0)) continue;
        double d = fabs(v - x);
        if (d < bd || (d == bd && (c & 1) == 0 && (bc & 1) == 1)) bd = d, best = v, bc = c;
    }
    if (best == 0) return signbit(x) ? -0.0 : 0.0;
    return best;
}
