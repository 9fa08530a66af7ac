/* The float64 reference forward (tests/ref) checked on its own: against transformers' Kimi Linear logits
 * (the external oracle), for causality, and on hand-checkable building blocks. */
#include <stdlib.h>

#include "format/checkpoint.h"
#include "model/presets.h"
#include "model/synth.h"
#include "ref/ref_forward.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

#define FIXTURE "tests/fixtures/kimi_linear_hf"

/* The prompt of oracle.json ("prompt_ids"), vocab 512. */
static const int oracle_ids[12] = {203, 290, 2, 239, 451, 327, 163, 54, 121, 360, 272, 272};


/* ||x - ref|| / ||ref|| with x double, ref float. */
static double rel_l2_df(const double *x, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isnan(ref[i])) return INFINITY;
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

TEST(ref_matches_transformers_kimi_linear) {
    ref_model *m;
    CHECK_OK(ref_model_open(FIXTURE, &m));
    const k3c_config *c = ref_model_config(m);
    CHECK(c->family == K3C_FAMILY_KIMI_LINEAR);
    int V = c->vocab_size, n = 12;
    CHECK(V == 512);
    double *lg = malloc((size_t)n * V * sizeof *lg);
    float *full = malloc((size_t)n * V * sizeof *full), *cached = malloc((size_t)n * V * sizeof *cached);
    CHECK(lg && full && cached);
    for (size_t i = 0; i < (size_t)n * V; i++) lg[i] = NAN;
    CHECK(test_read_f32(FIXTURE "/logits_full.f32", full, (size_t)n * V) == 0);
    CHECK(test_read_f32(FIXTURE "/logits_cached.f32", cached, (size_t)n * V) == 0);
    int rc = ref_logits(m, oracle_ids, n, lg);
    CHECKF(rc == 0, "ref_logits: %s", k3c_error_message());
    double worst_full = 0, worst_cached = 0;
    for (int i = 0; i < n; i++) {
        double ef = rel_l2_df(lg + (size_t)i * V, full + (size_t)i * V, (size_t)V);
        double ec = rel_l2_df(lg + (size_t)i * V, cached + (size_t)i * V, (size_t)V);
        worst_full = ef > worst_full || isnan(ef) ? ef : worst_full;
        worst_cached = ec > worst_cached || isnan(ec) ? ec : worst_cached;
        CHECKF(ef < 1e-4, "row %d: rel L2 vs logits_full = %.3g", i, ef);
        CHECKF(ec < 1e-4, "row %d: rel L2 vs logits_cached = %.3g", i, ec);
    }
    printf("    ref vs transformers: worst row rel L2 %.3g (full), %.3g (cached)\n", worst_full, worst_cached);
    free(lg), free(full), free(cached);
    ref_model_free(m);
}

/* Row i of a run over ids[0..n) equals the last row of a run over ids[0..i], for random ids and cut points. */
static void check_causal(ref_model *m, uint64_t seed, int n) {
    const k3c_config *c = ref_model_config(m);
    int V = c->vocab_size, ids[64];
    k3c_rng r;
    k3c_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) ids[i] = (int)(k3c_rng_next(&r) % (uint64_t)V);
    double *full = malloc((size_t)n * V * sizeof *full), *pre = malloc((size_t)n * V * sizeof *pre);
    CHECK(full && pre);
    CHECK_OK(ref_logits(m, ids, n, full));
    int cuts[3] = {1, 1 + (int)(k3c_rng_next(&r) % (uint64_t)(n - 1)), n - 1};
    for (int j = 0; j < 3; j++) {
        int k = cuts[j];
        for (size_t i = 0; i < (size_t)k * V; i++) pre[i] = NAN;
        CHECK_OK(ref_logits(m, ids, k, pre));
        for (size_t i = 0; i < (size_t)k * V; i++)
            CHECKF(fabs(pre[i] - full[i]) <= 1e-12 * (1 + fabs(full[i])), "prefix %d, element %zu: %.17g vs %.17g",
                   k, i, pre[i], full[i]);
    }
    free(full), free(pre);
}

TEST(ref_is_causal_kimi_linear) {
    ref_model *m;
    CHECK_OK(ref_model_open(FIXTURE, &m));
    check_causal(m, test_seed(), 16);
    ref_model_free(m);
}

TEST(ref_attnres_mix_hand_checked) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x5eed);
    enum { D = 37 };
    double v0[D], w[D], nw[D], out[D];
    for (int d = 0; d < D; d++) {
        v0[d] = k3c_rng_normal(&r) * 3.0;
        w[d] = k3c_rng_normal(&r);
        nw[d] = 1.0 + 0.1 * k3c_rng_normal(&r);
        out[d] = NAN;
    }
    /* one source: exactly that source */
    const double *one[1] = {v0};
    ref_attnres_mix(one, 1, w, nw, D, 1e-5, out);
    for (int d = 0; d < D; d++) CHECKF(out[d] == v0[d], "d=%d: %.17g vs %.17g", d, out[d], v0[d]);

    /* two sources with hand-picked scores: v_a = (2, 0, ..), v_b = (0, 1, 0, ..), w = (1, 1, 0, ..), n = 1.
     * rms(v_a) = 2/sqrt(D) -> s_a = 2 / sqrt(4/D + eps); s_b = 1 / sqrt(1/D + eps); both sqrt(D) up to eps. */
    double a[D] = {0}, b[D] = {0}, ww[D] = {0}, ones[D];
    a[0] = 2, b[1] = 1, ww[0] = ww[1] = 1;
    for (int d = 0; d < D; d++) ones[d] = 1;
    double eps = 1e-5, sa = 2 / sqrt(4.0 / D + eps), sb = 1 / sqrt(1.0 / D + eps);
    double aa = 1 / (1 + exp(sb - sa)), ab = 1 - aa;
    const double *two[2] = {a, b};
    ref_attnres_mix(two, 2, ww, ones, D, eps, out);
    CHECK_CLOSE(out[0], 2 * aa, 1e-15, 1e-12);
    CHECK_CLOSE(out[1], ab, 1e-15, 1e-12);
    for (int d = 2; d < D; d++) CHECK(out[d] == 0);
    /* equal scores: the plain average */
    b[1] = 0, b[0] = 2;
    ref_attnres_mix(two, 2, ww, ones, D, eps, out);
    CHECK_CLOSE(out[0], 2.0, 0, 1e-15);
}

TEST(ref_route_hand_checked) {
    k3c_config c = {0};
    c.num_experts = 8;
    c.num_experts_per_token = 2;
    c.router_sigmoid = 1;
    c.use_grouped_topk = 1;
    c.num_expert_group = 4; /* groups {0,1} {2,3} {4,5} {6,7} */
    c.topk_group = 2;
    c.moe_renormalize = 1;
    c.routed_scaling_factor = 2.5f;
    /* sigmoid scores from logits; the bias moves expert 7 up for selection only. */
    double lg[8] = {0.0, 0.5, 2.0, -3.0, 1.0, 1.0, -1.0, -2.0};
    double bias[8] = {0, 0, 0, 0, 0, 0, 0, 0.9};
    double s[8];
    for (int e = 0; e < 8; e++) s[e] = 1 / (1 + exp(-lg[e]));
    /* group scores (sum of the group's top two): g0 = s0+s1, g1 = s2+s3, g2 = s4+s5, g3 = s6+s7+0.9.
     * s = .5 .622 .881 .047 .731 .731 .269 .119(+.9): g0 1.122, g1 .928, g2 1.462, g3 1.288 -> keep g2, g3.
     * Candidates 4 (.731), 5 (.731, tie: 4 first), 6 (.269), 7 (1.019): top-2 = 7, 4. */
    int idx[2];
    double wt[2];
    ref_route(&c, lg, bias, idx, wt);
    CHECK(idx[0] == 7 && idx[1] == 4);
    double sum = s[7] + s[4];
    CHECK_CLOSE(wt[0], s[7] / sum * 2.5, 0, 1e-12);
    CHECK_CLOSE(wt[1], s[4] / sum * 2.5, 0, 1e-12);
    /* ungrouped, tie between 4 and 5 at rank 2 (expert 2 first): lower id wins */
    c.num_expert_group = 1, c.topk_group = 1;
    ref_route(&c, lg, NULL, idx, wt);
    CHECK(idx[0] == 2 && idx[1] == 4);
    /* no renormalisation: raw scores times the scale */
    c.moe_renormalize = 0;
    ref_route(&c, lg, NULL, idx, wt);
    CHECK_CLOSE(wt[0], s[2] * 2.5, 0, 1e-12);
    /* softmax scores */
    c.router_sigmoid = 0, c.moe_renormalize = 1, c.routed_scaling_factor = 1;
    ref_route(&c, lg, NULL, idx, wt);
    CHECK(idx[0] == 2 && idx[1] == 4);
    CHECK_CLOSE(wt[0], exp(2.0) / (exp(2.0) + exp(1.0)), 0, 1e-12);
}

/* Bf16 tensor element as double (the fixture is all bf16). */
static double bf16_at(const k3c_st_tensor *t, size_t i) {
    uint32_t u = (uint32_t)((const uint16_t *)t->data)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Taps: -1 is the embedding; the last layer's tap (the residual stream, no AttnRes in Kimi Linear) through
 * the final RMSNorm and lm_head gives the logits; one combined pass equals the separate calls. */
TEST(ref_hidden_taps_kimi_linear) {
    ref_model *m;
    CHECK_OK(ref_model_open(FIXTURE, &m));
    const k3c_config *c = ref_model_config(m);
    int n = 12, D = c->hidden_size, V = c->vocab_size, Lnum = c->num_layers;
    int layers[4] = {Lnum - 1, -1, 1, Lnum - 1};
    double *taps = malloc(4 * (size_t)n * D * sizeof *taps), *taps2 = malloc(4 * (size_t)n * D * sizeof *taps2);
    double *lg = malloc((size_t)n * V * sizeof *lg), *lg2 = malloc((size_t)n * V * sizeof *lg2);
    CHECK(taps && taps2 && lg && lg2);
    for (size_t i = 0; i < 4 * (size_t)n * D; i++) taps[i] = taps2[i] = NAN;
    CHECK_OK(ref_hidden(m, oracle_ids, n, layers, 4, taps));
    CHECK_OK(ref_logits(m, oracle_ids, n, lg));
    CHECK_OK(ref_forward(m, oracle_ids, n, lg2, layers, 4, taps2));
    CHECK(memcmp(lg, lg2, (size_t)n * V * sizeof *lg) == 0);
    CHECK(memcmp(taps, taps2, 4 * (size_t)n * D * sizeof *taps) == 0);
    CHECK(memcmp(taps, taps + 3 * (size_t)n * D, (size_t)n * D * sizeof *taps) == 0);

    k3c_checkpoint ck;
    CHECK_OK(k3c_checkpoint_open(&ck, FIXTURE));
    const k3c_st_tensor *emb = k3c_checkpoint_find(&ck, "model.embed_tokens.weight");
    const k3c_st_tensor *nrm = k3c_checkpoint_find(&ck, "model.norm.weight");
    const k3c_st_tensor *head = k3c_checkpoint_find(&ck, "lm_head.weight");
    CHECK(emb && nrm && head && emb->dtype == K3C_DTYPE_BF16 && nrm->dtype == K3C_DTYPE_BF16);
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++)
            CHECK(taps[((size_t)n + i) * D + d] == bf16_at(emb, (size_t)oracle_ids[i] * D + d));
    double h[D];
    for (int i = 0; i < n; i++) {
        const double *x = taps + (size_t)i * D;
        double ss = 0;
        for (int d = 0; d < D; d++) ss += x[d] * x[d];
        for (int d = 0; d < D; d++) h[d] = x[d] / sqrt(ss / D + c->rms_norm_eps) * bf16_at(nrm, (size_t)d);
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int d = 0; d < D; d++) s += bf16_at(head, (size_t)v * D + d) * h[d];
            CHECK_CLOSE(s, lg[(size_t)i * V + v], 1e-12, 1e-9);
        }
    }
    k3c_checkpoint_close(&ck);
    free(taps), free(taps2), free(lg), free(lg2);
    ref_model_free(m);
}

/* A synthesized checkpoint of `preset` (fresh seed) in the scratch dir; returns the model or NULL. */
static ref_model *open_synth(const char *preset) {
    k3c_config c;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ref-%s", test_tmpdir(), preset);
    if (k3c_preset_config(preset, &c) != K3C_OK) return NULL;
    int rc = k3c_synth_write(&c, preset, test_seed(), dir);
    k3c_config_free(&c);
    ref_model *m = NULL;
    if (rc == K3C_OK && ref_model_open(dir, &m) != K3C_OK) m = NULL;
    return m;
}

/* Finite, position-dependent logits with a real spread over the vocabulary, and causal. */
static void check_synth_model(const char *preset, int expect_family) {
    ref_model *m = open_synth(preset);
    CHECKF(m, "%s: %s", preset, k3c_error_message());
    const k3c_config *c = ref_model_config(m);
    CHECK((int)c->family == expect_family);
    int n = 24, V = c->vocab_size, ids[24];
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xabc);
    for (int i = 0; i < n; i++) ids[i] = (int)(k3c_rng_next(&r) % (uint64_t)V);
    ids[n - 1] = ids[n - 2]; /* a repeated token: its rows still differ (the context differs) */
    double *lg = malloc((size_t)n * V * sizeof *lg);
    CHECK(lg);
    for (size_t i = 0; i < (size_t)n * V; i++) lg[i] = NAN;
    CHECK_OK(ref_logits(m, ids, n, lg));
    for (int i = 0; i < n; i++) {
        const double *x = lg + (size_t)i * V;
        double mean = 0, mabs = 0, var = 0;
        for (int v = 0; v < V; v++) {
            CHECKF(isfinite(x[v]), "%s: row %d, logit %d = %g", preset, i, v, x[v]);
            mean += x[v];
            mabs += fabs(x[v]);
        }
        mean /= V, mabs /= V;
        for (int v = 0; v < V; v++) var += (x[v] - mean) * (x[v] - mean);
        double sd = sqrt(var / V);
        /* spread over the vocabulary: not a constant row */
        CHECKF(sd > 0.1 * mabs && sd > 1e-3, "%s: row %d: std %.3g, mean |logit| %.3g", preset, i, sd, mabs);
        if (i > 0) { /* rows differ between positions (at least 1% of the row's scale in L2) */
            const double *y = x - V;
            double d2 = 0, n2 = 0;
            for (int v = 0; v < V; v++) d2 += (x[v] - y[v]) * (x[v] - y[v]), n2 += x[v] * x[v];
            CHECKF(sqrt(d2 / n2) > 1e-2, "%s: rows %d and %d nearly equal (rel %.3g)", preset, i - 1, i,
                   sqrt(d2 / n2));
        }
    }
    free(lg);
    check_causal(m, test_seed() ^ 0x77, 24);
    ref_model_free(m);
}

TEST(ref_synth_tiny_k3) { check_synth_model("tiny", K3C_FAMILY_K3); }
TEST(ref_synth_tiny_grouped_k3) { check_synth_model("tiny-grouped", K3C_FAMILY_K3); }
TEST(ref_synth_kimi_linear_tiny) { check_synth_model("kimi-linear-tiny", K3C_FAMILY_KIMI_LINEAR); }
