/* The optional FP8 E4M3 MLA latent cache (k3c_engine_options.kv_fp8, util/fp8.h):
 *  - the codec against the format's definition: every code's value from the field formula, and encoding as
 *    the nearest representable value (ties to the even code, saturation at +-448) found by brute force over
 *    all codes, on fresh random inputs and on exact midpoints;
 *    (tests/ref/ref_fp8.c, also the rounding the float64 reference applies to its latents in
 *    test_forward.c's forward_kv_fp8_vs_ref_e4m3_latents);
 *  - the CLI option: accepted, a bad value is a usage error. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "test.h"
#include "util/error.h"
#include "util/fp8.h"
#include "ref/ref_fp8.h"
#include "util/rng.h"

TEST(fp8_e4m3_every_code_decodes_to_the_format_value) {
    for (int c = 0; c < 256; c++) {
        double want = ref_e4m3_value(c);
        float got = k3c_e4m3_to_f32((uint8_t)c);
        if (isnan(want)) {
            CHECKF(isnan(got), "code 0x%02x: %g, want NaN", c, got);
            continue;
        }
        CHECKF(got == want && !!signbit(got) == !!signbit(want), "code 0x%02x: %g, want %g", c, got, want);
        /* every finite code round-trips to itself (-0 included) */
        CHECKF(k3c_f32_to_e4m3(got) == c, "code 0x%02x: encodes back to 0x%02x", c, k3c_f32_to_e4m3(got));
    }
    CHECK(k3c_e4m3_to_f32(0x7e) == 448.0f && k3c_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
}

TEST(fp8_e4m3_encode_is_nearest_even_and_saturates) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xf8);
    /* random magnitudes 2^-14 .. 2^10 (underflow to zero, subnormals, normals, saturation), both signs */
    for (int i = 0; i < 200000; i++) {
        double u = (double)(k3c_rng_next(&r) >> 11) / 9007199254740992.0;
        float x = (float)ldexp(1.0 + u, (int)(k3c_rng_next(&r) % 25) - 14);
        if (k3c_rng_next(&r) & 1) x = -x;
        double want = ref_e4m3_nearest(x);
        float got = k3c_e4m3_round(x);
        CHECKF(got == want && !!signbit(got) == !!signbit(want), "x = %.9g: %.9g, want %.9g", x, got, want);
    }
    /* exact midpoints between neighbouring positive codes: ties go to the even code */
    for (int c = 0; c < 0x7e; c++) {
        float mid = (float)((ref_e4m3_value(c) + ref_e4m3_value(c + 1)) / 2); /* exact in f32: 5 significant bits */
        float want = (float)ref_e4m3_value(c & 1 ? c + 1 : c);
        CHECKF(k3c_e4m3_round(mid) == want, "midpoint of 0x%02x/0x%02x: %g, want %g", c, c + 1, k3c_e4m3_round(mid),
               want);
        CHECKF(k3c_e4m3_round(-mid) == -want, "negative midpoint of 0x%02x/0x%02x", c, c + 1);
    }
    CHECK(k3c_e4m3_round(448.0f) == 448.0f && k3c_e4m3_round(464.0f) == 448.0f && k3c_e4m3_round(1e30f) == 448.0f);
    CHECK(k3c_e4m3_round(-INFINITY) == -448.0f);
    CHECK(isnan(k3c_e4m3_round(NAN)));
    CHECK(k3c_e4m3_round(ldexpf(1.0f, -11)) == 0.0f && signbit(k3c_e4m3_round(-ldexpf(1.0f, -11))));
}

TEST(kv_fp8_cli_option) {
    char bin[PATH_MAX], cmd[2 * PATH_MAX + 256], out[PATH_MAX];
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(out, sizeof out, "%s/kv_fp8_cli.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' generate -n 4 --kv-cache fp8 >'%s' 2>&1", bin, out);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "'%s' generate -n 4 --kv-cache fp4 >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 2);
    /* on cuda the option is accepted (the run itself needs a GPU: gpu_forward_tiny_kv_fp8 checks it there) */
    snprintf(cmd, sizeof cmd, "'%s' generate -n 4 --device cuda --kv-cache fp8 >/dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) != 2);
}
