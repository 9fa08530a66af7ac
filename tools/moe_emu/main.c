/* Drives moe.cu's launchers (k3c_cuda_moe_experts = gate/up, down, combine) under the emulator on the shapes
 * of tests/gpu/test_gpu_kernels.c moe_case and more, against (a) the CPU library's f32 matmuls and activation
 * (the GPU test's reference and metric) and (b) a float64 reference of h, part and out from the dequantized
 * weights, written from the formulas of cuda/moe.h. Outputs poisoned with NaN; h of invalid pairs must be 0.
 * Usage: emu [quick|all] ; EMU_WPR etc. are read from the environment (run.sh). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/ops.h"
#include "cuda/moe.h"
#include "format/mxfp4.h"
#include "gpu_util.h"
#include "util/bf16.h"

extern int emu_force_wpr, emu_cp_delay, emu_shuffle, emu_mma_f32seq, emu_mma_trunc;
extern unsigned long long emu_stream_bytes; /* emu.h: bytes of 16-byte weight loads and copies */
static FILE *dump; /* EMU_DUMP=file: every case's h, part and out appended as raw bytes (bitwise A/B of kernels) */

static double rel_l2(const float *x, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) return INFINITY;
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static double rel_l2f(const float *x, const float *ref, size_t n) {
    double *r = malloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++) r[i] = ref[i];
    double e = rel_l2(x, r, n);
    free(r);
    return e;
}
static double rnd_d(double v, int round) { return round ? bf16_round((float)v) : v; }
static double act_d(int situ, double g, double u) {
    if (situ) {
        double lin = 25.0 * tanh(u / 25.0);
        return 4.0 * tanh(g / 4.0) / (1.0 + exp(-g)) * lin;
    }
    return g / (1.0 + exp(-g)) * u;
}

static int failures;
static double worst_case;

/* skew 1: every pair but 1 in 40 picks expert 0 (one expert with thousands of pairs: several plist windows);
 * skew 2 (hot): every token picks expert 0 (in slot t % k) and k - 1 distinct others, as a router does when
 * one expert is every token's choice (with T > 32 pairs the hot expert takes several 32-pair tiles);
 * skew 3: k distinct experts a token, uniformly (a router's top-k without a favourite) */
static void moe_case(const char *name, int mxfp4, int situ, int In, int F, int Out, int E, int T, int k, int round,
                     int skew, unsigned seed) {
    k3c_rng r;
    k3c_rng_seed(&r, seed);
    k3c_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.hidden_act = situ ? K3C_ACT_SITU : K3C_ACT_SILU;
    cfg.situ_beta = 4.0f;
    cfg.situ_linear_beta = 25.0f;
    int dims[3][2] = {{F, In}, {F, In}, {Out, F}};
    k3c_mxfp4_mat q[64][3];
    k3c_mat bm[64][3];
    float *deq[64][3];
    k3c_cuda_expert de[64];
    memset(de, 0, sizeof de);
    for (int e = 0; e < E; e++)
        for (int m = 0; m < 3; m++) {
            int rows = dims[m][0], cols = dims[m][1];
            deq[e][m] = fmalloc((size_t)rows * cols);
            if (mxfp4) {
                uint8_t *p = malloc((size_t)rows * cols / 2), *s = malloc((size_t)rows * cols / 32);
                float *row = fmalloc(cols);
                for (int i = 0; i < rows; i++) { /* as the GPU test's make_mx: group magnitudes vary */
                    fill_normal(&r, row, cols, 1.0f);
                    for (int c = 0; c < cols; c++) row[c] *= ldexpf(1.0f, (c / 32 + i) % 7 - 3);
                    k3c_mxfp4_quant_row(row, cols, p + (size_t)i * cols / 2, s + (size_t)i * cols / 32);
                    k3c_mxfp4_dequant_row(p + (size_t)i * cols / 2, s + (size_t)i * cols / 32, cols,
                                          deq[e][m] + (size_t)i * cols);
                }
                free(row);
                q[e][m] = (k3c_mxfp4_mat){p, s, rows, cols};
                uint8_t *dp = dev_upload(p, (size_t)rows * cols / 2);
                const uint8_t *ds = dev_upload(s, (size_t)rows * cols / 32);
                if (k3c_cuda_mxfp4_repack(dp, (size_t)rows * cols / 2, 0)) { /* the kernels' device layout */
                    fprintf(stderr, "moe_emu: repack failed\n");
                    exit(1);
                }
                if (m == 0) de[e].gate_packed = dp, de[e].gate_scale = ds;
                if (m == 1) de[e].up_packed = dp, de[e].up_scale = ds;
                if (m == 2) de[e].down_packed = dp, de[e].down_scale = ds;
            } else {
                uint16_t *w = malloc((size_t)rows * cols * 2);
                fill_bf16(&r, w, (size_t)rows * cols, 0.1f);
                for (size_t i = 0; i < (size_t)rows * cols; i++) deq[e][m][i] = bf16_to_f32(w[i]);
                bm[e][m] = (k3c_mat){w, rows, cols};
                const uint16_t *d = dev_upload(w, (size_t)rows * cols * 2);
                if (m == 0) de[e].gate_w = d;
                if (m == 1) de[e].up_w = d;
                if (m == 2) de[e].down_w = d;
            }
        }
    int P = T * k;
    float *x = fmalloc((size_t)T * In), *wt = fmalloc(P);
    int *idx = malloc(sizeof(int) * P);
    fill_normal(&r, x, (size_t)T * In, mxfp4 ? 0.05f : 1.0f);
    if (round)
        for (size_t i = 0; i < (size_t)T * In; i++) x[i] = bf16_round(x[i]);
    for (int i = 0; i < P; i++) {
        idx[i] = (int)(k3c_rng_next(&r) % (uint64_t)(E + 1)) - (i == 1 ? 1 : 0); /* pair 1 may be invalid */
        if (idx[i] >= E) idx[i] = E - 1;
        if (skew == 1 && i != 1 && k3c_rng_next(&r) % 40) idx[i] = 0;
        wt[i] = (float)k3c_rng_uniform(&r);
    }
    if (skew >= 2) /* k <= E: distinct experts a token, with skew 2 expert 0 among them (pair 1 keeps its id) */
        for (int t = 0; t < T; t++) {
            int pool[64], lo = skew == 2; /* the others from lo .. E - 1 */
            for (int e = 0; e < E; e++) pool[e] = e;
            for (int j = 0; j < k - lo; j++) { /* a partial shuffle of lo .. E - 1 */
                int s2 = lo + j + (int)(k3c_rng_next(&r) % (uint64_t)(E - lo - j)), tmp = pool[lo + j];
                pool[lo + j] = pool[s2], pool[s2] = tmp;
            }
            for (int j = 0, o = lo; j < k; j++) {
                int p = t * k + j;
                if (p == 1) continue;
                idx[p] = lo && j == t % k ? 0 : pool[o++];
            }
        }
    /* (a) the GPU test's reference: CPU f32 library */
    float *ga = fmalloc(F), *ua = fmalloc(F), *d = fmalloc(Out), *ref = fmalloc((size_t)T * Out);
    /* (b) float64 */
    double *h64 = calloc((size_t)P * F, 8), *p64 = calloc((size_t)P * Out, 8), *o64 = calloc((size_t)T * Out, 8);
    for (int t = 0; t < T; t++) {
        float *o = ref + (size_t)t * Out;
        for (int i = 0; i < Out; i++) o[i] = 0.0f;
        const float *xt = x + (size_t)t * In;
        for (int j = 0; j < k; j++) {
            int pi = t * k + j, e = idx[pi];
            if (e < 0) continue;
            if (mxfp4) {
                k3c_matmul_mxfp4(NULL, &q[e][0], xt, 1, ga);
                k3c_matmul_mxfp4(NULL, &q[e][1], xt, 1, ua);
            } else {
                k3c_matmul_bf16(NULL, &bm[e][0], xt, 1, ga);
                k3c_matmul_bf16(NULL, &bm[e][1], xt, 1, ua);
            }
            if (round) for (int i = 0; i < F; i++) ga[i] = bf16_round(ga[i]), ua[i] = bf16_round(ua[i]);
            k3c_gated_act(&cfg, ga, ua, F, ga);
            if (round) for (int i = 0; i < F; i++) ga[i] = bf16_round(ga[i]);
            if (mxfp4) k3c_matmul_mxfp4(NULL, &q[e][2], ga, 1, d);
            else k3c_matmul_bf16(NULL, &bm[e][2], ga, 1, d);
            if (round) for (int i = 0; i < Out; i++) d[i] = bf16_round(d[i]);
            for (int i = 0; i < Out; i++) o[i] += wt[pi] * d[i];

            for (int f = 0; f < F; f++) {
                double sg = 0, su = 0;
                for (int c = 0; c < In; c++) {
                    sg += (double)deq[e][0][(size_t)f * In + c] * xt[c];
                    su += (double)deq[e][1][(size_t)f * In + c] * xt[c];
                }
                h64[(size_t)pi * F + f] = rnd_d(act_d(situ, rnd_d(sg, round), rnd_d(su, round)), round);
            }
            for (int o2 = 0; o2 < Out; o2++) {
                double s = 0;
                for (int f = 0; f < F; f++) s += (double)deq[e][2][(size_t)o2 * F + f] * h64[(size_t)pi * F + f];
                p64[(size_t)pi * Out + o2] = rnd_d(s, round);
                o64[(size_t)t * Out + o2] += (double)wt[pi] * p64[(size_t)pi * Out + o2];
            }
        }
        if (round)
            for (int i = 0; i < Out; i++) o[i] = bf16_round(o[i]), o64[(size_t)t * Out + i] = rnd_d(o64[(size_t)t * Out + i], 1);
    }
    k3c_cuda_expert *dtab = dev_upload(de, sizeof *de * E);
    float *dx = dev_upload(x, (size_t)T * In * 4), *dwt = dev_upload(wt, (size_t)P * 4);
    int *didx = dev_upload(idx, sizeof(int) * P);
    float *dh = dev_poisoned((size_t)P * F * 4), *dpart = dev_poisoned((size_t)P * Out * 4);
    float *dout = dev_poisoned((size_t)T * Out * 4);
    k3c_cuda_act act = {situ ? 2 : 1, 4.0f, 25.0f};
    clock_t c0 = clock();
    emu_stream_bytes = 0;
    if (k3c_cuda_moe_experts(dtab, E, mxfp4, In, F, Out, dx, T, didx, dwt, k, act, round, dh, dpart, dout, 0)) {
        printf("%s: launcher error\n", name);
        failures++;
        return;
    }
    double secs = (double)(clock() - c0) / CLOCKS_PER_SEC;
    /* weight bytes streamed over those of the experts the pairs selected (each read once: 1.00); MXFP4
     * counts the packed nibbles (its scales go by byte loads), bf16 the weights */
    double sel = 0;
    {
        unsigned char used[64] = {0};
        for (int i = 0; i < P; i++)
            if (idx[i] >= 0 && idx[i] < E && !used[idx[i]]) used[idx[i]] = 1, sel += 1;
        sel *= (2.0 * F * In + (double)Out * F) * (mxfp4 ? 0.5 : 2.0);
    }
    double passes = sel > 0 ? (double)emu_stream_bytes / sel : 0;
    if (dump) {
        size_t nh = (size_t)P * F, np = (size_t)P * Out, no = (size_t)T * Out;
        float *hb = fmalloc(nh > np ? (nh > no ? nh : no) : (np > no ? np : no));
        cudaMemcpy(hb, dh, nh * 4, cudaMemcpyDeviceToHost);
        fwrite(hb, 4, nh, dump);
        cudaMemcpy(hb, dpart, np * 4, cudaMemcpyDeviceToHost);
        fwrite(hb, 4, np, dump);
        cudaMemcpy(hb, dout, no * 4, cudaMemcpyDeviceToHost);
        fwrite(hb, 4, no, dump);
        free(hb);
    }
    /* the GPU test's metric and threshold */
    double e_test = rel_l2f(dout, ref, (size_t)T * Out);
    double thr = round ? 1e-2 : (T * Out >= 16 ? 1e-5 : 5e-5);
    /* the bf16 per-pair path (cuda/moe.cu moe_pair_limit: up to K3C_MOE_PAIR_MAX, default 64, pairs with
     * Out >= F) writes h and out only: its down kernel sums the pairs of a token in registers, so part is
     * not compared there */
    const char *lim = getenv("K3C_MOE_PAIR_MAX"), *pg = getenv("K3C_MOE_PAIR_GEMV");
    const int bf16_pair = !mxfp4 && Out >= F && !(pg && atoi(pg) == 0) && P <= (lim && atoi(lim) > 0 ? atoi(lim) : 64);
    double e_h = rel_l2(dh, h64, (size_t)P * F), e_p = bf16_pair ? 0.0 : rel_l2(dpart, p64, (size_t)P * Out);
    double e_o = rel_l2(dout, o64, (size_t)T * Out);
    int zero_ok = 1; /* invalid pairs: h and part rows are 0 */
    for (int i = 0; i < P; i++)
        if (idx[i] < 0)
            for (int f = 0; f < F; f++) zero_ok &= dh[(size_t)i * F + f] == 0.0f;
    /* the expert-parallel form (cuda/backend_cuda.c moe_experts + moe_combine): the valid pairs' input rows
     * gathered in a scrambled order (reversed), one slot a row with weight 1, then k3c_cuda_moe_combine_rows
     * through each pair's row: against the CPU reference with the same bound, and bitwise against out where
     * the launcher took the same path (the same pair count: no invalid pair) */
    int nv = 0, *prow = malloc(sizeof(int) * P), *eidx = malloc(sizeof(int) * P);
    float *xs = fmalloc((size_t)P * In), *one = fmalloc(P);
    for (int i = P - 1; i >= 0; i--) {
        prow[i] = idx[i] >= 0 ? nv : -1;
        if (idx[i] < 0) continue;
        memcpy(xs + (size_t)nv * In, x + (size_t)(i / k) * In, (size_t)In * 4);
        eidx[nv] = idx[i];
        one[nv++] = 1.0f;
    }
    float *dxs = dev_upload(xs, (size_t)(nv ? nv : 1) * In * 4), *done = dev_upload(one, (size_t)(nv ? nv : 1) * 4);
    int *deidx = dev_upload(eidx, sizeof(int) * (nv ? nv : 1)), *dprow = dev_upload(prow, sizeof(int) * P);
    float *dh2 = dev_poisoned((size_t)P * F * 4), *dp2 = dev_poisoned((size_t)P * Out * 4);
    float *dd = dev_poisoned((size_t)P * Out * 4), *dout2 = dev_poisoned((size_t)T * Out * 4);
    int ep_rc = k3c_cuda_moe_experts(dtab, E, mxfp4, In, F, Out, dxs, nv, deidx, done, 1, act, round, dh2, dp2, dd, 0);
    if (!ep_rc) ep_rc = k3c_cuda_moe_combine_rows(dd, dprow, dwt, k, Out, T, round, dout2, 0);
    double e_ep = ep_rc ? INFINITY : rel_l2f(dout2, ref, (size_t)T * Out);
    int ep_same = !ep_rc && !memcmp(dout2, dout, (size_t)T * Out * 4);
    cudaFree(dxs); cudaFree(done); cudaFree(deidx); cudaFree(dprow); cudaFree(dh2); cudaFree(dp2); cudaFree(dd);
    cudaFree(dout2);
    free(prow), free(eidx), free(xs), free(one);
    int ok = e_test < thr && zero_ok && e_h < thr && e_p < thr && e_o < thr && e_ep < thr;
    failures += !ok;
    printf("%-34s ep form (%d pairs, scrambled) vs cpu %.2e, %s out\n", name, nv, e_ep,
           ep_same ? "bitwise" : "NOT bitwise");
    if (e_test > worst_case && !round) worst_case = e_test;
    printf("%-34s wpr %s  out vs cpu %.2e (thr %.0e)  vs f64: h %.2e part %.2e out %.2e  streamed %.2fx  %s%s  "
           "[%.1fs cpu]\n",
           name, emu_force_wpr ? (char[]){(char)('0' + emu_force_wpr), 0} : "auto", e_test, thr, e_h, e_p, e_o,
           passes, ok ? "ok" : "FAIL", zero_ok ? "" : " (invalid pair h not 0)", secs);
    fflush(stdout);
    for (int e = 0; e < E; e++) {
        cudaFree((void *)de[e].gate_packed); cudaFree((void *)de[e].gate_scale);
        cudaFree((void *)de[e].up_packed); cudaFree((void *)de[e].up_scale);
        cudaFree((void *)de[e].down_packed); cudaFree((void *)de[e].down_scale);
        cudaFree((void *)de[e].gate_w); cudaFree((void *)de[e].up_w); cudaFree((void *)de[e].down_w);
        for (int m = 0; m < 3; m++) {
            free(deq[e][m]);
            if (mxfp4) free((void *)q[e][m].packed), free((void *)q[e][m].scale);
            else free((void *)bm[e][m].w);
        }
    }
    cudaFree(dtab); cudaFree(dx); cudaFree(dwt); cudaFree(didx); cudaFree(dh); cudaFree(dpart); cudaFree(dout);
    free(x); free(wt); free(idx); free(ga); free(ua); free(d); free(ref); free(h64); free(p64); free(o64);
}

typedef struct { const char *name; int mx, situ, In, F, Out, E, T, k, round, skew, big; } mcase;
static const mcase cases[] = {
    /* tests/gpu/test_gpu_kernels.c gpu_moe_mxfp4 */
    {"mx In96 F64 Out17 E5 T3 k3", 1, 1, 96, 64, 17, 5, 3, 3, 0, 0, 0},
    {"mx In32 F32 Out1 E2 T1 k2", 1, 0, 32, 32, 1, 2, 1, 2, 0, 0, 0},
    {"mx In1056 F96 Out64 E4 T2 k2", 1, 1, 1056, 96, 64, 4, 2, 2, 0, 0, 0},
    {"mx K3 3584x3072 E4 T2 k2", 1, 1, 3584, 3072, 3584, 4, 2, 2, 0, 0, 1},
    {"mx In96 F64 Out17 rounded", 1, 1, 96, 64, 17, 5, 3, 3, 1, 0, 0},
    {"mx In160 F64 Out40 E2 T9 k2", 1, 1, 160, 64, 40, 2, 9, 2, 0, 0, 0},
    {"mx In160 F64 Out40 E3 T11 k3 rnd", 1, 0, 160, 64, 40, 3, 11, 3, 1, 0, 0},
    /* gpu_moe_bf16 */
    {"bf16 In64 F24 Out17 E5 T3 k3", 0, 0, 64, 24, 17, 5, 3, 3, 0, 0, 0},
    {"bf16 In8 F8 Out3 E2 T1 k1", 0, 1, 8, 8, 3, 2, 1, 1, 0, 0, 0},
    {"bf16 KL 2304x1024 E3 T2 k2", 0, 0, 2304, 1024, 2304, 3, 2, 2, 0, 0, 1},
    /* Kimi Linear's K with many experts and ~1.6 pairs each: the launcher halves the B columns (8 -> 4) */
    {"bf16 In2304 F256 Out64 E64 T32 k2", 0, 0, 2304, 256, 64, 64, 32, 2, 0, 0, 1},
    {"bf16 In64 F24 Out17 rounded", 0, 0, 64, 24, 17, 5, 3, 3, 1, 0, 0},
    {"bf16 In72 F40 Out24 E2 T9 k2", 0, 1, 72, 40, 24, 2, 9, 2, 0, 0, 0},
    /* beyond the GPU test: > 2048 pairs of one expert (several plist windows), an 8-row-multiple-only bf16
     * K, many steps for the wpr split */
    {"mx In64 F32 Out40 T800 k3 skew", 1, 1, 64, 32, 40, 2, 800, 3, 0, 1, 0},
    {"bf16 In16 F8 Out24 T800 k3 skew", 0, 0, 16, 8, 24, 2, 800, 3, 0, 1, 0},
    {"mx In1024 F256 Out64 E3 T5 k2", 1, 0, 1024, 256, 64, 3, 5, 2, 0, 0, 0},
    /* the MXFP4 per-pair kernels (cuda/moe_pair.cu: up to 16 pairs and Out >= F), small: rows of whole and
     * of partial 4-group steps, 16-row bands full and cut, an invalid pair */
    {"mx pair In256 F128 Out256 E5 T2 k3", 1, 1, 256, 128, 256, 5, 2, 3, 0, 0, 0},
    {"mx pair In96 F96 Out100 E3 T1 k3 rnd", 1, 0, 96, 96, 100, 3, 1, 3, 1, 0, 0},
    /* more than 16 pairs with Out >= F: the MXFP4 band kernels (moe_pair.cu; one tile of <= 8 pairs per
     * expert, then experts with several tiles, f32 activations: three terms) */
    {"mx band In256 F128 Out256 E12 T8 k4", 1, 1, 256, 128, 256, 12, 8, 4, 0, 0, 0},
    {"mx band In96 F64 Out100 E3 T20 k2 rnd", 1, 0, 96, 64, 100, 3, 20, 2, 1, 0, 0},
    {"mx band In160 F96 Out96 E5 T9 k3", 1, 1, 160, 96, 96, 5, 9, 3, 0, 0, 0},
    {"mx band K3 3584x3072 E16 T4 k8", 1, 1, 3584, 3072, 3584, 16, 4, 8, 0, 0, 1},
    /* more than 8 pairs an expert: tiles of 16 (two column groups; K3C_MOE_BAND_COLS=8 / 16 forces a width) */
    {"mx band16 In256 F128 Out256 E2 T12 k2", 1, 1, 256, 128, 256, 2, 12, 2, 0, 0, 0},
    {"mx band16 K3 3584x3072 E8 T9 k8", 1, 1, 3584, 3072, 3584, 8, 9, 8, 0, 0, 1},
    /* 9-64 pairs an expert (the wide tiles; every pair of an expert with up to 32 in one pass): 10, 20 and
     * 33 an expert on average (tiles of 1-32 pairs, 1-4 column groups, experts of two tiles), f32 (three
     * terms) and rounded; hot routing (one expert chosen by every token: 64 pairs, two tiles); K3's width
     * (the 224 KB plane of the gate/up rows) with a narrow F to keep the emulation short */
    {"mx band32 In256 F128 Out256 E8 T40 k2", 1, 1, 256, 128, 256, 8, 40, 2, 0, 0, 0},
    {"mx band32 In256 F128 Out256 E4 T40 k2", 1, 0, 256, 128, 256, 4, 40, 2, 0, 0, 0},
    {"mx band32 In96 F64 Out100 E3 T33 k3 rnd", 1, 1, 96, 64, 100, 3, 33, 3, 1, 0, 0},
    {"mx band32 In160 F96 Out96 E6 T64 k3 hot", 1, 1, 160, 96, 96, 6, 64, 3, 0, 2, 0},
    {"mx band32 In128 F64 Out64 E16 T64 k4 hot rnd", 1, 0, 128, 64, 64, 16, 64, 4, 1, 2, 0},
    {"mx band32 In64 F32 Out40 E2 T64 k1 hot", 1, 1, 64, 32, 40, 2, 64, 1, 0, 2, 0},
    /* k3-slice's routing at b = 32 and 64 (16 distinct of 64 experts a token: ~8 and ~16 pairs an expert),
     * rounded as the model runs (one term: "streamed" counts the passes over each selected expert); Out 128:
     * the band path keeps its tile table (2 + 4 pairs ints) in out (T x Out floats) */
    {"mx band In64 F32 Out128 E64 T32 k16 rnd", 1, 1, 64, 32, 128, 64, 32, 16, 1, 3, 0},
    {"mx band32 In64 F32 Out128 E64 T64 k16 rnd", 1, 1, 64, 32, 128, 64, 64, 16, 1, 3, 0},
    {"mx band32 K3 In3584 F256 E4 T24 k2", 1, 1, 3584, 256, 3584, 4, 24, 2, 0, 0, 1},
    {"mx band32 K3 In3584 F256 E4 T40 k2 hot rnd", 1, 0, 3584, 256, 3584, 4, 40, 2, 1, 2, 1},
    /* bf16 past the per-pair path's 256 pairs: the band kernels (partial steps, experts of many tiles) */
    {"bf16 band In64 F32 Out64 E12 T40 k8", 0, 1, 64, 32, 64, 12, 40, 8, 0, 0, 0},
    {"bf16 band In72 F40 Out48 E5 T33 k8 rnd", 0, 0, 72, 40, 48, 5, 33, 8, 1, 0, 0},
    {"bf16 band In136 F64 Out72 E3 T40 k7", 0, 1, 136, 64, 72, 3, 40, 7, 0, 0, 0},
    {"bf16 band KL 2304x1024 E16 T36 k8", 0, 0, 2304, 1024, 2304, 16, 36, 8, 0, 0, 1},
    {"bf16 In520 F136 Out48 E3 T5 k2", 0, 1, 520, 136, 48, 3, 5, 2, 0, 0, 0},
    /* the bf16 per-pair kernels (moe_pair.cu: up to 64 pairs and Out >= F): partial load batches of gate/up
     * (33 chunks) and down (17), fewer slots than the down kernel's 4 experts at once and more than 4 */
    {"bf16 pair In264 F136 Out200 E4 T3 k3", 0, 1, 264, 136, 200, 4, 3, 3, 0, 0, 0},
    {"bf16 pair In264 F136 Out200 E6 T2 k5 rnd", 0, 0, 264, 136, 200, 6, 2, 5, 1, 0, 0},
};

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "quick";
    const char *e;
    if ((e = getenv("EMU_CP"))) emu_cp_delay = strcmp(e, "delay") == 0;
    if ((e = getenv("EMU_SHUFFLE"))) emu_shuffle = atoi(e);
    if ((e = getenv("EMU_MMA"))) emu_mma_f32seq = strcmp(e, "f32seq") == 0, emu_mma_trunc = strcmp(e, "trunc") == 0;
    const char *only = getenv("EMU_ONLY");
    if ((e = getenv("EMU_DUMP")) && !(dump = fopen(e, "wb"))) {
        fprintf(stderr, "moe_emu: cannot write %s\n", e);
        return 2;
    }
    static const int wprs[] = {0, 1, 2, 4, 8};
    int all = strcmp(mode, "all") == 0, big = strcmp(mode, "big") == 0;
    printf("moe_emu: cp.async %s, shuffle %d, mma %s\n", emu_cp_delay ? "delayed to wait_group" : "immediate",
           emu_shuffle, emu_mma_trunc ? "truncating accumulation model" : emu_mma_f32seq ? "f32 sequential" : "exact sum, one rounding");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (only && !strstr(cases[c].name, only)) continue;
        if (cases[c].big && !(all || big)) continue;
        if (!cases[c].big && big) continue;
        for (int w = 0; w < 5; w++) {
            if (cases[c].big && wprs[w] && wprs[w] != 8 && !all) continue; /* big shapes: auto and 8 */
            if (getenv("EMU_WPR")) { if (w) break; emu_force_wpr = atoi(getenv("EMU_WPR")); }
            else emu_force_wpr = wprs[w];
            const mcase *m = &cases[c];
            moe_case(m->name, m->mx, m->situ, m->In, m->F, m->Out, m->E, m->T, m->k, m->round, m->skew,
                     0x9e3779b9u * (unsigned)(c + 1) + (unsigned)w);
        }
    }
    if (dump) fclose(dump);
    printf("moe_emu: %d failure(s); worst unrounded out rel L2 vs the CPU reference %.2e\n", failures, worst_case);
    return failures != 0;
}
