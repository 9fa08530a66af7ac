/* The optional FP8 E4M3 MLA latent cache (k3c_engine_options.kv_fp8, util/fp8.h):
 *  - the codec against the format's definition: every code's value from the field formula, and encoding as
 *    the nearest representable value (ties to the even code, saturation at +-448) found by brute force over
 *    all codes, on fresh random inputs and on exact midpoints;
 *  - the engine with an fp8 cache (f32 activations) against the float64 reference whose cached latents
 *    (c_normed and k_pe) are rounded to the nearest E4M3 value by this file's own brute-force rounding: the
 *    fp8 engine must sit far closer to that reference than to the exact one (the rounding is applied where
 *    and as the format says), over prefill, token-by-token and prefill + decode plans;
 *  - the CLI option: accepted on the cpu, a bad value is a usage error, and an engine on cuda refuses it with
 *    a message (checked without a GPU: the engine refuses before it creates the device backend). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "ref/ref_forward.h"
#include "test.h"
#include "util/error.h"
#include "util/fp8.h"
#include "util/rng.h"

/* The value of code c by the format's definition: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 (m/8). */
static double e4m3_value(int c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

/* Nearest finite E4M3 value to x by scanning every code: ties to the code with an even mantissa; beyond the
 * largest finite value, that value (saturation). The sign of zero follows x. */
static double e4m3_nearest(double x) {
    if (isnan(x)) return NAN;
    double best = 0, bd = INFINITY;
    int bc = 0;
    for (int c = 0; c < 256; c++) {
        double v = e4m3_value(c);
        if (isnan(v) || (!!signbit(v) != !!signbit(x) && v != 0)) continue;
        double d = fabs(v - x);
        if (d < bd || (d == bd && (c & 1) == 0 && (bc & 1) == 1)) bd = d, best = v, bc = c;
    }
    if (best == 0) return signbit(x) ? -0.0 : 0.0;
    return best;
}

TEST(fp8_e4m3_every_code_decodes_to_the_format_value) {
    for (int c = 0; c < 256; c++) {
        double want = e4m3_value(c);
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
        double want = e4m3_nearest(x);
        float got = k3c_e4m3_round(x);
        CHECKF(got == want && !!signbit(got) == !!signbit(want), "x = %.9g: %.9g, want %.9g", x, got, want);
    }
    /* exact midpoints between neighbouring positive codes: ties go to the even code */
    for (int c = 0; c < 0x7e; c++) {
        float mid = (float)((e4m3_value(c) + e4m3_value(c + 1)) / 2); /* exact in f32: 5 significant bits */
        float want = (float)e4m3_value(c & 1 ? c + 1 : c);
        CHECKF(k3c_e4m3_round(mid) == want, "midpoint of 0x%02x/0x%02x: %g, want %g", c, c + 1, k3c_e4m3_round(mid),
               want);
        CHECKF(k3c_e4m3_round(-mid) == -want, "negative midpoint of 0x%02x/0x%02x", c, c + 1);
    }
    CHECK(k3c_e4m3_round(448.0f) == 448.0f && k3c_e4m3_round(464.0f) == 448.0f && k3c_e4m3_round(1e30f) == 448.0f);
    CHECK(k3c_e4m3_round(-INFINITY) == -448.0f);
    CHECK(isnan(k3c_e4m3_round(NAN)));
    CHECK(k3c_e4m3_round(ldexpf(1.0f, -11)) == 0.0f && signbit(k3c_e4m3_round(-ldexpf(1.0f, -11))));
}

/* ---- the engine with an fp8 cache against the reference with E4M3 latents ---- */

static double ref_round_e4m3(double x) { return e4m3_nearest(x); }

/* Prefill of ids in the given chunk sizes, all logits. */
static int run_chunks(k3c_engine *eng, const int32_t *ids, const int *chunks, int nchunks, int V, float *lg) {
    int id, done = 0;
    K3C_TRY(k3c_request_open(eng, &id));
    for (int c = 0; c < nchunks; c++) {
        k3c_step_item it = {.request = id, .tokens = ids + done, .n = chunks[c], .all_logits = 1};
        K3C_TRY(k3c_engine_step(eng, &it, 1, lg + (size_t)done * V));
        done += chunks[c];
    }
    return k3c_request_close(eng, id);
}

static double worst_row(const float *lg, const double *ref, int n, int V) {
    double w = 0;
    for (int i = 0; i < n; i++) {
        double e = rel_l2_f32(lg + (size_t)i * V, ref + (size_t)i * V, (size_t)V);
        if (!(e <= w)) w = e;
    }
    return w;
}

TEST(kv_fp8_forward_matches_reference_with_e4m3_latents) {
    /* tiny with every expert selected: no discrete routing choice for the fp8 rounding to flip */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fp8-tiny-dense", test_tmpdir());
    k3c_config c;
    CHECK_OK(k3c_preset_config("tiny", &c));
    c.num_experts_per_token = c.num_experts;
    c.topk_group = c.num_expert_group;
    int src = k3c_synth_write(&c, NULL, test_seed(), dir);
    k3c_config_free(&c);
    CHECK_OK(src);
    k3c_model *m;
    CHECK_OK(k3c_load(dir, &m));
    ref_model *ref;
    CHECK_OK(ref_model_open(dir, &ref));
    int V = m->config.vocab_size, n = 20;
    int32_t ids[20];
    int iids[20];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xf80);
    for (int i = 0; i < n; i++) iids[i] = ids[i] = (int32_t)(k3c_rng_next(&r) % (uint64_t)V);
    double *exact = malloc(sizeof(double) * n * V), *rounded = malloc(sizeof(double) * n * V);
    float *lg = malloc(sizeof(float) * n * V), *lg_bf16 = malloc(sizeof(float) * n * V);
    CHECK(exact && rounded && lg && lg_bf16);
    CHECK_OK(ref_logits(ref, iids, n, exact));
    ref_set_latent_round(ref, ref_round_e4m3);
    CHECK_OK(ref_logits(ref, iids, n, rounded));

    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 2;
    o.max_rows = 32;
    o.max_context = 64;
    o.block_size = 4;
    o.exact_f32 = 1;
    k3c_engine *plain, *fp8;
    CHECK_OK(k3c_engine_create(m, &o, &plain));
    o.kv_fp8 = 1;
    CHECK_OK(k3c_engine_create(m, &o, &fp8));
    struct { const char *name; int chunks[20]; int nchunks; } plans[] = {
        {"prefill", {20}, 1},
        {"token by token", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 20},
        {"prefill 12 + decode", {12, 1, 1, 1, 1, 1, 1, 1, 1}, 9},
    };
    for (size_t p = 0; p < sizeof plans / sizeof plans[0]; p++) {
        poison_f32(lg, (size_t)n * V);
        poison_f32(lg_bf16, (size_t)n * V);
        CHECK_OK(run_chunks(fp8, ids, plans[p].chunks, plans[p].nchunks, V, lg));
        CHECK_OK(run_chunks(plain, ids, plans[p].chunks, plans[p].nchunks, V, lg_bf16));
        double vs_rounded = worst_row(lg, rounded, n, V), vs_exact = worst_row(lg, exact, n, V);
        double plain_vs_exact = worst_row(lg_bf16, exact, n, V);
        printf("    tiny (k = E) f32, fp8 cache, %s: worst row rel L2 %.3g vs the E4M3-latent reference, %.3g vs "
               "the exact one (f32 cache vs exact: %.3g)\n",
               plans[p].name, vs_rounded, vs_exact, plain_vs_exact);
        /* A latent within f32 noise of an E4M3 rounding midpoint can round the other way than in float64
         * (one E4M3 step of one element): bounded well below the fp8 effect itself. */
        CHECKF(vs_rounded < 2e-3, "%s: %.3g vs the E4M3-latent reference", plans[p].name, vs_rounded);
        CHECKF(vs_rounded * 4 < vs_exact, "%s: fp8 engine %.3g from the E4M3 reference, %.3g from the exact one",
               plans[p].name, vs_rounded, vs_exact);
        CHECKF(plain_vs_exact < 1e-4, "%s: f32 cache %.3g from the exact reference", plans[p].name, plain_vs_exact);
    }
    k3c_engine_free(plain);
    k3c_engine_free(fp8);
    ref_model_free(ref);
    k3c_free(m);
    free(exact), free(rounded), free(lg), free(lg_bf16);
}

static int run_status(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(kv_fp8_cli_option) {
    char bin[PATH_MAX], cmd[2 * PATH_MAX + 256], out[PATH_MAX];
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(out, sizeof out, "%s/kv_fp8_cli.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' generate -n 4 --kv-cache fp8 >'%s' 2>&1", bin, out);
    CHECK(run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "'%s' generate -n 4 --kv-cache fp4 >/dev/null 2>&1", bin);
    CHECK(run_status(cmd) == 2);
    snprintf(cmd, sizeof cmd, "'%s' generate -n 4 --device cuda --kv-cache fp8 >'%s' 2>&1", bin, out);
    CHECK(run_status(cmd) == 1);
    FILE *f = fopen(out, "r");
    CHECK(f != NULL);
    char text[4096];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    CHECKF(strstr(text, "kv_fp8") != NULL && strstr(text, "cuda") != NULL, "message: %s", text);
}
