/* Synthesized weights are scaled so a forward pass stays well-conditioned (issue: synth presets): checked on
 * the float64 reference, so the property belongs to the weights, not to the engine under test. Over a few
 * hundred random tokens: the hidden state's RMS stays in a bounded range after every layer, every routed
 * expert of every MoE layer is selected at least once, and the logits are far from constant. */
#include <stdlib.h>

#include "model/presets.h"
#include "model/synth.h"
#include "ref/ref_forward.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

static void check_conditioning(const char *preset) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/cond-%s", test_tmpdir(), preset);
    k3c_config c;
    CHECK_OK(k3c_preset_config(preset, &c));
    CHECK_OK(k3c_synth_write(&c, preset, test_seed(), dir));
    ref_model *m;
    CHECK_OK(ref_model_open(dir, &m));
    int L = c.num_layers, E = c.num_experts, D = c.hidden_size, V = c.vocab_size;
    enum { SEQS = 4, N = 64 };
    int *layers = malloc(sizeof(int) * L);
    long *counts = calloc((size_t)L * E, sizeof *counts);
    double *hidden = malloc(sizeof(double) * (size_t)L * N * D), *logits = malloc(sizeof(double) * (size_t)N * V);
    CHECK(layers && counts && hidden && logits);
    for (int l = 0; l < L; l++) layers[l] = l;
    ref_count_routes(m, counts);
    k3c_rng rng;
    k3c_rng_seed(&rng, test_seed() ^ 0x5eed);
    double rms_min = INFINITY, rms_max = 0, std_min = INFINITY;
    for (int s = 0; s < SEQS; s++) {
        int ids[N];
        for (int i = 0; i < N; i++) ids[i] = (int)(k3c_rng_next(&rng) % (uint64_t)V);
        CHECK_OK(ref_forward(m, ids, N, logits, layers, L, hidden));
        for (size_t r = 0; r < (size_t)L * N; r++) {
            double ss = 0;
            for (int d = 0; d < D; d++) ss += hidden[r * D + d] * hidden[r * D + d];
            double rms = sqrt(ss / D);
            CHECKF(isfinite(rms), "preset %s: non-finite hidden state", preset);
            if (rms < rms_min) rms_min = rms;
            if (rms > rms_max) rms_max = rms;
        }
        for (int i = 0; i < N; i++) {
            double mean = 0, var = 0;
            for (int v = 0; v < V; v++) mean += logits[(size_t)i * V + v] / V;
            for (int v = 0; v < V; v++) var += pow(logits[(size_t)i * V + v] - mean, 2) / V;
            if (sqrt(var) < std_min) std_min = sqrt(var);
        }
    }
    printf("    [%s: hidden RMS %.3f..%.3f over %d layers x %d tokens; smallest logit std %.3f] ", preset, rms_min,
           rms_max, L, SEQS * N, std_min);
    CHECKF(rms_min > 0.05 && rms_max < 20, "preset %s: hidden RMS %.3g..%.3g outside [0.05, 20]", preset, rms_min,
           rms_max);
    CHECKF(std_min > 0.3, "preset %s: logits nearly constant (std %.3g)", preset, std_min);
    for (int l = 0; l < L; l++) {
        if (!c.layer_is_moe[l]) continue;
        for (int e = 0; e < E; e++)
            CHECKF(counts[(size_t)l * E + e] > 0, "preset %s: layer %d expert %d never routed over %d tokens", preset, l,
                   e, SEQS * N);
    }
    ref_model_free(m);
    k3c_config_free(&c);
    free(layers), free(counts), free(hidden), free(logits);
}

TEST(synth_conditioning_tiny) { check_conditioning("tiny"); }
TEST(synth_conditioning_tiny_grouped) { check_conditioning("tiny-grouped"); }
TEST(synth_conditioning_kimi_linear_tiny) { check_conditioning("kimi-linear-tiny"); }
