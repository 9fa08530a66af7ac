/* MXFP4 codec against references written from the OCP MX spec: E2M1 decoded from its bit fields
 * (sign, 2-bit exponent with bias 1, 1-bit mantissa), E8M0 as 2^(s-127), and a brute-force quantizer. */
#include <stdlib.h>

#include "format/mxfp4.h"
#include "test.h"
#include "util/rng.h"

/* E2M1 from the bit fields, not from the codec's table. */
static double e2m1_ref(int code) {
    int sign = code >> 3, e = (code >> 1) & 3, m = code & 1;
    double mag = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, e - 1);
    return sign ? -mag : mag;
}

static int same_float(float a, float b) {
    if (isnan(a) || isnan(b)) return 0;
    return a == b && signbit(a) == signbit(b);
}

TEST(mxfp4_e2m1_table_matches_bit_fields) {
    for (int c = 0; c < 16; c++) {
        CHECKF(same_float(k3c_e2m1_values[c], (float)e2m1_ref(c)), "code %d: %g vs %g", c, k3c_e2m1_values[c], e2m1_ref(c));
    }
    CHECK(k3c_e2m1_values[7] == 6.0f && k3c_e2m1_values[15] == -6.0f);
    CHECK(k3c_e2m1_values[8] == 0.0f && signbit(k3c_e2m1_values[8]) && !signbit(k3c_e2m1_values[0]));
}

TEST(mxfp4_e8m0_scales) {
    for (int s = 0; s < 255; s++) {
        float f = k3c_e8m0_to_f32((uint8_t)s);
        CHECKF(!isnan(f) && (double)f == ldexp(1.0, s - 127), "scale byte %d -> %g", s, f);
    }
    CHECK(isnan(k3c_e8m0_to_f32(255)));
    CHECK(k3c_e8m0_to_f32(121) == 1.0f / 64); /* the spec's example */
}

/* Every code at several scales (including the extremes 0 and 254), in a random position, both nibbles. */
TEST(mxfp4_dequant_every_code_every_position) {
    k3c_rng rng;
    k3c_rng_seed(&rng, test_seed());
    const int scales[] = {0, 1, 2, 100, 121, 126, 127, 128, 200, 253, 254};
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        for (int rep = 0; rep < 4; rep++) {
            enum { COLS = 128 };
            int codes[COLS];
            uint8_t packed[COLS / 2], scale[COLS / 32];
            float out[COLS];
            for (int i = 0; i < COLS; i++) codes[i] = i % 16;
            for (int i = COLS - 1; i > 0; i--) { /* shuffle so every code lands in odd and even slots */
                int j = (int)(k3c_rng_next(&rng) % (uint64_t)(i + 1)), t = codes[i];
                codes[i] = codes[j];
                codes[j] = t;
            }
            for (int i = 0; i < COLS / 2; i++) packed[i] = (uint8_t)(codes[2 * i] | (codes[2 * i + 1] << 4));
            for (int g = 0; g < COLS / 32; g++) scale[g] = (uint8_t)(g == 0 ? (uint64_t)scales[si] : k3c_rng_next(&rng) % 255);
            poison_f32(out, COLS);
            k3c_mxfp4_dequant_row(packed, scale, COLS, out);
            for (int i = 0; i < COLS; i++) {
                /* the exact product in double, rounded once to f32 (overflows to inf at scale 254) */
                float want = (float)(e2m1_ref(codes[i]) * ldexp(1.0, scale[i / 32] - 127));
                CHECKF(!isnan(out[i]) && out[i] == want && signbit(out[i]) == signbit(want),
                       "scale %d code %d at %d: got %g want %g", scale[i / 32], codes[i], i, out[i], want);
            }
        }
    }
}

TEST(mxfp4_nibble_order_and_signed_zero) {
    uint8_t packed[16] = {0x21, 0x87, 0xf0}, scale[1] = {127};
    float out[32];
    poison_f32(out, 32);
    k3c_mxfp4_dequant_row(packed, scale, 32, out);
    CHECK(out[0] == 0.5f && out[1] == 1.0f);           /* even element = low nibble */
    CHECK(out[2] == 6.0f && out[3] == 0.0f && signbit(out[3])); /* code 8 is -0 */
    CHECK(out[4] == 0.0f && !signbit(out[4]) && out[5] == -6.0f);
    for (int i = 6; i < 32; i++) CHECK(out[i] == 0.0f && !signbit(out[i]));
}

TEST(mxfp4_nan_scale_detected) {
    k3c_rng rng;
    k3c_rng_seed(&rng, test_seed() ^ 0x55);
    uint8_t s[300];
    for (int i = 0; i < 300; i++) s[i] = (uint8_t)(k3c_rng_next(&rng) % 255);
    CHECK(!k3c_mxfp4_scales_have_nan(s, 300));
    int at = (int)(k3c_rng_next(&rng) % 300);
    s[at] = 255;
    CHECK(k3c_mxfp4_scales_have_nan(s, 300));
    CHECK(!k3c_mxfp4_scales_have_nan(s, (size_t)at)); /* only the first n bytes are looked at */
    uint8_t packed[16] = {0x10}, scale[1] = {255};
    float out[32];
    k3c_mxfp4_dequant_row(packed, scale, 32, out);
    CHECK(isnan(out[0]) && isnan(out[1]));
}

/* Brute-force quantizer: smallest e in [-127, 127] with max|x| <= 6 * 2^e, then for each element the nearest
 * of the eight codes sharing its sign, ties to the even code. */
static void quant_ref(const float *x, uint8_t *codes, uint8_t *scale) {
    double max = 0;
    for (int i = 0; i < 32; i++) max = fmax(max, fabs((double)x[i]));
    int e = -127;
    while (e < 127 && max > 6.0 * ldexp(1.0, e)) e++;
    *scale = (uint8_t)(e + 127);
    for (int i = 0; i < 32; i++) {
        int base = signbit(x[i]) ? 8 : 0, best = base;
        double best_d = INFINITY;
        for (int c = base; c < base + 8; c++) {
            double d = fabs((double)x[i] - e2m1_ref(c) * ldexp(1.0, e));
            if (d < best_d || (d == best_d && !(c & 1))) {
                best_d = d;
                best = c;
            }
        }
        codes[i] = (uint8_t)best;
    }
}

TEST(mxfp4_quant_matches_brute_force) {
    k3c_rng rng;
    k3c_rng_seed(&rng, test_seed() ^ 0xabc);
    enum { COLS = 32 * 64 };
    static float x[COLS], out[COLS];
    uint8_t packed[COLS / 2], scale[COLS / 32];
    for (int g = 0; g < COLS / 32; g++) {
        int kind = g % 8;
        double mag = ldexp(1.0, (int)(k3c_rng_next(&rng) % 60) - 30);
        for (int i = 0; i < 32; i++) {
            double v = k3c_rng_normal(&rng) * mag;
            if (kind == 1) v = 0.0;                       /* all zero: smallest scale */
            if (kind == 2) v *= 1e-38 / mag;              /* near the bottom of E8M0 */
            if (kind == 3) v *= 1e-44 / mag;              /* f32 subnormals: scale clamps at byte 0 */
            if (kind == 4 && i == 5) v = -0.0;
            x[g * 32 + i] = (float)v;
        }
    }
    memset(packed, 0xee, sizeof packed);
    memset(scale, 0xee, sizeof scale);
    k3c_mxfp4_quant_row(x, COLS, packed, scale);
    poison_f32(out, COLS);
    k3c_mxfp4_dequant_row(packed, scale, COLS, out);
    for (int g = 0; g < COLS / 32; g++) {
        uint8_t codes[32], s;
        quant_ref(x + g * 32, codes, &s);
        CHECKF(scale[g] == s, "group %d: scale %d, expected %d", g, scale[g], s);
        for (int i = 0; i < 32; i++) {
            int c = g * 32 + i, got = (packed[c / 2] >> (4 * (c & 1))) & 15;
            CHECKF(got == codes[i], "group %d elem %d: x=%g code %d, expected %d", g, i, x[c], got, codes[i]);
            /* error at most half the widest grid step (2 * 2^e) */
            CHECKF(!isnan(out[c]) && fabs((double)out[c] - x[c]) <= ldexp(1.0, s - 127) * (1 + 1e-12),
                   "group %d elem %d: x=%g deq %g", g, i, x[c], out[c]);
        }
    }
}

/* Values exactly halfway between grid points go to the even code. */
TEST(mxfp4_quant_ties_to_even_code) {
    const double mids[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
    const int want[7] = {0, 2, 2, 4, 4, 6, 6}; /* 0|.5, .5|1, 1|1.5, 1.5|2, 2|3, 3|4, 4|6 */
    for (int e = -3; e <= 3; e++) {
        float x[32];
        uint8_t packed[16], scale[1];
        for (int i = 0; i < 32; i++) x[i] = 0;
        x[31] = (float)ldexp(6.0, e); /* pins the scale to 2^e */
        for (int k = 0; k < 7; k++) {
            x[2 * k] = (float)ldexp(mids[k], e);
            x[2 * k + 15] = (float)-ldexp(mids[k], e);
        }
        k3c_mxfp4_quant_row(x, 32, packed, scale);
        CHECK(scale[0] == 127 + e);
        for (int k = 0; k < 7; k++) {
            int a = 2 * k, b = 2 * k + 15;
            int ca = (packed[a / 2] >> (4 * (a & 1))) & 15, cb = (packed[b / 2] >> (4 * (b & 1))) & 15;
            CHECKF(ca == want[k], "+%g: code %d, expected %d", mids[k], ca, want[k]);
            CHECKF(cb == (want[k] | 8), "-%g: code %d, expected %d", mids[k], cb, want[k] | 8);
        }
    }
}

/* On-grid values (codes x 2^s) come back bit-exact, signed zeros included. */
TEST(mxfp4_round_trip_on_grid_exact) {
    k3c_rng rng;
    k3c_rng_seed(&rng, test_seed() ^ 0x777);
    enum { COLS = 32 * 32 };
    static float x[COLS], out[COLS];
    uint8_t packed[COLS / 2], scale[COLS / 32];
    for (int g = 0; g < COLS / 32; g++) {
        int s = 10 + (int)(k3c_rng_next(&rng) % 240);
        int top = g % 3 == 0 ? 5 : 8; /* some groups never reach 6: the quantizer picks a smaller scale */
        for (int i = 0; i < 32; i++) {
            int code = (int)(k3c_rng_next(&rng) % (uint64_t)top) | (int)(k3c_rng_next(&rng) & 8);
            x[g * 32 + i] = (float)(e2m1_ref(code) * ldexp(1.0, s - 127));
        }
    }
    k3c_mxfp4_quant_row(x, COLS, packed, scale);
    poison_f32(out, COLS);
    k3c_mxfp4_dequant_row(packed, scale, COLS, out);
    for (int i = 0; i < COLS; i++) CHECKF(same_float(out[i], x[i]), "elem %d: %g -> %g", i, x[i], out[i]);
}
