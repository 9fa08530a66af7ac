/* MXFP4 (OCP microscaling FP4, as compressed-tensors "mxfp4-pack-quantized" stores it):
 * packed[r, c/2] holds E2M1 element c in the low nibble when c is even, the high nibble when odd;
 * scale[r, c/32] is an E8M0 byte; W[r,c] = e2m1(nibble) * 2^(scale - 127). Codes 8..15 are negative
 * (8 is -0). Scale 255 is NaN in E8M0 and is rejected by the loader. */
#ifndef K3C_FORMAT_MXFP4_H
#define K3C_FORMAT_MXFP4_H

#include <stddef.h>
#include <stdint.h>

#define K3C_MXFP4_GROUP 32

/* The 16 E2M1 values, index = 4-bit code. */
extern const float k3c_e2m1_values[16];

/* 2^(e - 127) as a float; e = 0 gives 2^-127 (a subnormal), e = 255 gives NaN. */
float k3c_e8m0_to_f32(uint8_t e);

/* Dequantizes one row of `cols` logical elements (cols % 32 == 0). */
void k3c_mxfp4_dequant_row(const uint8_t *packed, const uint8_t *scale, int cols, float *out);

/* Quantizes one row (cols % 32 == 0): per group, the scale is the smallest power of two with
 * max|x| / scale <= 6, each element rounded to the nearest E2M1 value (ties to even code). Used by synth
 * and tests; a round trip of values already on the grid is exact. */
void k3c_mxfp4_quant_row(const float *x, int cols, uint8_t *packed, uint8_t *scale);

/* 1 when any scale byte of a row is 255 (NaN). */
int k3c_mxfp4_scales_have_nan(const uint8_t *scale, size_t n);

#endif
