/* An independent FP8 E4M3 ("e4m3fn") reference for tests: the value of each code from the format's field
 * formula, and round-to-nearest by scanning every code (slow, obviously right). */
#ifndef K3C_TESTS_REF_FP8_H
#define K3C_TESTS_REF_FP8_H

/* (-1)^s 2^(e-7) (1 + m/8), subnormal (e = 0) 2^-6 (m/8), NaN for S.1111.111. */
double ref_e4m3_value(int code);
/* Nearest finite E4M3 value to x: ties to the code with an even mantissa, saturation at +-448, the sign of
 * zero kept, NaN for NaN. */
double ref_e4m3_nearest(double x);

#endif
