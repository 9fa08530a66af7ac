/* Drives three launchers under tools/moe_emu's CPU emulation of CUDA, against references written here or in
 * the CPU library (the GPU tests' checks, for kernels changed when no GPU was at hand):
 *  - k3c_cuda_attnres_mix (cuda/attnres.cu): n 1, 2, 9, 11 sources (11: two source tiles), T 1, 5, 40, D 7,
 *    256, 7168 (T 40 only at D <= 256) against a float64 mix from the formula (rel L2 < 2e-5, gpu_attnres_mix's
 *    metric); the output NaN-poisoned, every element must be written;
 *  - k3c_cuda_matmul_bf16_round (cuda/gemm.cu, gemm NULL: the streaming kernels): rows 1, 3, 17, 64, 300, cols 8,
 *    264, 1032, T 1..8 against k3c_matmul_bf16 (rel L2 < 1e-5, gpu_matmul_bf16's threshold), and the rounded
 *    product equal to round(product) bit for bit;
 *  - k3c_cuda_matmul_bf16_fanout (cuda/gemm.cu): rows 64, 300, cols 264, 1032, T 1..8, parity 0, parity 1 and
 *    skip: y bitwise the unfused launcher's, each of 3 destinations' parity region bitwise y, the rest untouched;
 *  - the block stamps (cuda/stamp.cuh, K3C_CUDA_PROFILE=3) on a stamped rmsnorm (T 3, n 300: 10 warps a
 *    block) and a T = 1 GEMV (rows 300, cols 1032): outputs bitwise those of the same launches unstamped,
 *    one BEGIN a block, one WAIT a block where the kernel waits (the GEMV), one END a warp, one grid id a
 *    launch, parsed by decode/stamp_report.c into the two launches; nothing written once off again.
 * Usage: emu [quick|all] (quick leaves out D 7168 with T 5). EMU_ONLY=attnres|gemm|fanout. The router runs through
 * its own GPU test under emulation: gpu_tests.sh gpu_router. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/attnres.h"
#include "cuda/elementwise.h"
#include "cuda/gemm.h"
#include "cuda/stamp.h"
#include "decode/stamp_report.h"
#include "gpu_util.h"
#include "ref_attnres64.h"
#include "util/bf16.h"

static int failures, cases_run;

static double rel_l2_64(const float *x, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) return INFINITY;
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static double rel_l2_32(const float *x, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isnan(ref[i])) return INFINITY;
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static void verdict(const char *what, double e, double thr) {
    cases_run++;
    int ok = e < thr;
    if (!ok) failures++;
    printf("%-48s rel L2 %.3g (thr %.0e) %s\n", what, e, thr, ok ? "ok" : "FAIL");
}

static void attnres_cases(k3c_rng *r, int all) {
    static const int n_l[] = {1, 2, 9, 11}, T_l[] = {1, 5, 40}, D_l[] = {7, 256, 7168};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++) {
                int n = n_l[a], T = T_l[b], D = D_l[c];
                if (T == 40 && D > 256) continue;
                if (!all && T == 5 && D == 7168) continue;
                float *src[16], *dsrc[16];
                for (int j = 0; j < n; j++) {
                    src[j] = fmalloc((size_t)T * D);
                    fill_normal(r, src[j], (size_t)T * D, 1.0f + j);
                    dsrc[j] = dev_upload(src[j], (size_t)T * D * 4);
                }
                float *proj = fmalloc(D), *norm = fmalloc(D), *out = fmalloc((size_t)T * D);
                fill_normal(r, proj, D, 0.3f);
                fill_normal(r, norm, D, 1.0f);
                double *ref = malloc(sizeof(double) * T * D);
                for (int t = 0; t < T; t++) {
                    const float *rows[16];
                    for (int j = 0; j < n; j++) rows[j] = src[j] + (size_t)t * D;
                    attnres_ref64(rows, n, D, proj, norm, 1e-5, ref + (size_t)t * D);
                }
                void *dptr = dev_upload(dsrc, sizeof(float *) * n);
                float *dproj = dev_upload(proj, (size_t)D * 4), *dnorm = dev_upload(norm, (size_t)D * 4);
                float *dout = dev_poisoned((size_t)T * D * 4);
                char what[96];
                snprintf(what, sizeof what, "attnres n %d T %d D %d", n, T, D);
                if (k3c_cuda_attnres_mix(dptr, n, T, D, dproj, dnorm, 1e-5f, 0, dout, 0) ||
                    dev_download(out, dout, (size_t)T * D * 4)) {
                    verdict(what, INFINITY, 2e-5);
                } else {
                    verdict(what, rel_l2_64(out, ref, (size_t)T * D), 2e-5);
                }
                for (int j = 0; j < n; j++) { cudaFree(dsrc[j]); free(src[j]); }
                cudaFree(dptr); cudaFree(dproj); cudaFree(dnorm); cudaFree(dout);
                free(proj); free(norm); free(out); free(ref);
            }
}

static void gemm_cases(k3c_rng *r) {
    static const int rows_l[] = {1, 3, 17, 64, 300}, cols_l[] = {8, 264, 1032};
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 3; b++)
            for (int T = 1; T <= 8; T++) {
                int rows = rows_l[a], cols = cols_l[b];
                uint16_t *W = malloc((size_t)rows * cols * 2);
                float *x = fmalloc((size_t)T * cols), *y = fmalloc((size_t)T * rows), *yr = fmalloc((size_t)T * rows),
                      *ref = fmalloc((size_t)T * rows);
                fill_bf16(r, W, (size_t)rows * cols, 1.0f);
                fill_normal(r, x, (size_t)T * cols, 1.0f);
                k3c_mat m = {W, rows, cols};
                k3c_matmul_bf16(NULL, &m, x, T, ref);
                void *dW = dev_upload(W, (size_t)rows * cols * 2), *dx = dev_upload(x, (size_t)T * cols * 4);
                float *dy = dev_poisoned((size_t)T * rows * 4), *dyr = dev_poisoned((size_t)T * rows * 4);
                char what[96];
                snprintf(what, sizeof what, "gemm rows %d cols %d T %d", rows, cols, T);
                if (k3c_cuda_matmul_bf16_round(NULL, dW, rows, cols, dx, T, dy, 0, 0) ||
                    k3c_cuda_matmul_bf16_round(NULL, dW, rows, cols, dx, T, dyr, 1, 0) ||
                    dev_download(y, dy, (size_t)T * rows * 4) || dev_download(yr, dyr, (size_t)T * rows * 4)) {
                    verdict(what, INFINITY, 1e-5);
                } else {
                    double e = rel_l2_32(y, ref, (size_t)T * rows);
                    size_t bad = 0;
                    for (size_t i = 0; i < (size_t)T * rows; i++) {
                        float rv = bf16_round(y[i]);
                        bad += memcmp(&rv, &yr[i], 4) != 0;
                    }
                    if (bad) printf("  %zu rounded outputs differ from round(product)\n", bad);
                    verdict(what, bad ? INFINITY : e, 1e-5);
                }
                cudaFree(dW); cudaFree(dx); cudaFree(dy); cudaFree(dyr);
                free(W); free(x); free(y); free(yr); free(ref);
            }
}

/* The fanout product (k3c_cuda_matmul_bf16_fanout, the pushed one-shot's push): y bitwise the unfused
 * launcher's (round 0), every destination's parity region (the parity word's low bit) bitwise y, the other
 * parity and the floats past them untouched; with the skip word set, y alone. */
static void fanout_cases(k3c_rng *r) {
    static const int rows_l[] = {64, 300}, cols_l[] = {264, 1032};
    enum { ND = 3 };
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int T = 1; T <= 8; T++)
                for (int mode = 0; mode < 3; mode++) { /* parity 0, parity 1, skip */
                    int rows = rows_l[a], cols = cols_l[b];
                    size_t n = (size_t)T * rows, pf = n + 40; /* parity 1's offset: past parity 0's n floats */
                    uint16_t *W = malloc((size_t)rows * cols * 2);
                    float *x = fmalloc((size_t)T * cols), *y = fmalloc(n), *y0 = fmalloc(n), *dst = fmalloc(2 * pf + 8);
                    fill_bf16(r, W, (size_t)rows * cols, 1.0f);
                    fill_normal(r, x, (size_t)T * cols, 1.0f);
                    uint32_t words[2] = {mode == 1 ? 7u : 8u, mode == 2}; /* the epoch word, the skip word */
                    void *dW = dev_upload(W, (size_t)rows * cols * 2), *dx = dev_upload(x, (size_t)T * cols * 4);
                    uint32_t *dwords = dev_upload(words, sizeof words);
                    float *dy = dev_poisoned(n * 4), *dy0 = dev_poisoned(n * 4), *dd[ND];
                    k3c_cuda_fanout fo = {.n = ND, .parity_floats = pf, .parity_word = dwords, .skip = dwords + 1};
                    for (int d = 0; d < ND; d++) fo.dst[d] = dd[d] = dev_poisoned((2 * pf + 8) * 4);
                    char what[96];
                    snprintf(what, sizeof what, "fanout rows %d cols %d T %d %s", rows, cols, T,
                             mode == 2 ? "skip" : mode ? "parity 1" : "parity 0");
                    int bad = !k3c_cuda_fanout_ok(dW, rows, cols, dx, T) ||
                              k3c_cuda_matmul_bf16_round(NULL, dW, rows, cols, dx, T, dy0, 0, 0) ||
                              k3c_cuda_matmul_bf16_fanout(dW, rows, cols, dx, T, dy, &fo, 0) ||
                              dev_download(y, dy, n * 4) || dev_download(y0, dy0, n * 4);
                    if (!bad) bad = memcmp(y, y0, n * 4) != 0;
                    for (int d = 0; d < ND && !bad; d++) {
                        bad = dev_download(dst, dd[d], (2 * pf + 8) * 4);
                        for (size_t i = 0; i < 2 * pf + 8 && !bad; i++) {
                            size_t at = mode == 1 ? pf : 0;
                            int written = mode != 2 && i >= at && i < at + n;
                            uint32_t got, want = 0xffffffffu; /* dev_poisoned's bytes where nothing was written */
                            memcpy(&got, &dst[i], 4);
                            if (written) memcpy(&want, &y[i - at], 4);
                            bad = got != want;
                        }
                    }
                    verdict(what, bad ? INFINITY : 0, 1e-30);
                    cudaFree(dW); cudaFree(dx); cudaFree(dwords); cudaFree(dy); cudaFree(dy0);
                    for (int d = 0; d < ND; d++) cudaFree(dd[d]);
                    free(W); free(x); free(y); free(y0); free(dst);
                }
}

/* The block stamps on two stamped kernels (see the file comment). */
static void stamp_cases(k3c_rng *r) {
    enum { CAP = 256, T = 3, N = 300, ROWS = 300, COLS = 1032 };
    k3c_stamp_ctl on = {0}, off = {0};
    on.cap = CAP;
    if (cudaMalloc((void **)&on.rec, sizeof(k3c_stamp_rec) * CAP * K3C_STAMP_REGIONS) ||
        cudaMalloc((void **)&on.count, sizeof(unsigned) * K3C_STAMP_REGIONS)) {
        verdict("stamps: buffers", INFINITY, 1);
        return;
    }
    cudaMemset(on.count, 0, sizeof(unsigned) * K3C_STAMP_REGIONS);
    float *x = fmalloc((size_t)T * N), *w = fmalloc(N), *xg = fmalloc(COLS), *y0 = fmalloc(T * N), *y1 = fmalloc(T * N);
    float *g0 = fmalloc(ROWS), *g1 = fmalloc(ROWS);
    uint16_t *W = malloc((size_t)ROWS * COLS * 2);
    fill_normal(r, x, (size_t)T * N, 1.0f);
    fill_normal(r, w, N, 1.0f);
    fill_normal(r, xg, COLS, 1.0f);
    fill_bf16(r, W, (size_t)ROWS * COLS, 1.0f);
    void *dx = dev_upload(x, (size_t)T * N * 4), *dw = dev_upload(w, N * 4), *dW = dev_upload(W, (size_t)ROWS * COLS * 2);
    void *dxg = dev_upload(xg, COLS * 4);
    float *dy = dev_poisoned((size_t)T * N * 4), *dg = dev_poisoned(ROWS * 4);
    int bad = 0;
    unsigned total1 = 0; /* records after the stamped pass */
    /* unstamped, then stamped, then unstamped again: the same bits each time */
    for (int pass = 0; pass < 3 && !bad; pass++) {
        if (pass == 1 && (k3c_stamp_bind_elementwise(&on, NULL) || k3c_stamp_bind_gemm(&on, NULL))) bad = 1;
        if (pass == 2 && (k3c_stamp_bind_elementwise(&off, NULL) || k3c_stamp_bind_gemm(&off, NULL))) bad = 1;
        if (bad || k3c_cuda_rmsnorm(dx, N, dw, T, N, 1e-6f, 1, dy, N, 0) ||
            k3c_cuda_matmul_bf16_round(NULL, dW, ROWS, COLS, dxg, 1, dg, 1, 0) ||
            dev_download(pass ? y1 : y0, dy, (size_t)T * N * 4) || dev_download(pass ? g1 : g0, dg, ROWS * 4))
            bad = 1;
        if (pass && (memcmp(y0, y1, (size_t)T * N * 4) || memcmp(g0, g1, ROWS * 4))) {
            printf("  pass %d: outputs differ from the unstamped launches\n", pass);
            bad = 1;
        }
        if (pass == 1) { /* the records of the stamped pass, regions packed */
            unsigned cnt[K3C_STAMP_REGIONS];
            static k3c_stamp_rec rec[CAP * K3C_STAMP_REGIONS], all[CAP * K3C_STAMP_REGIONS];
            size_t n = 0;
            dev_download(cnt, on.count, sizeof cnt);
            dev_download(rec, on.rec, sizeof rec);
            for (int g = 0; g < K3C_STAMP_REGIONS; g++) {
                total1 += cnt[g];
                for (unsigned i = 0; i < cnt[g] && i < CAP; i++) all[n++] = rec[(size_t)g * CAP + i];
            }
            k3c_stamp_launch *L = NULL;
            size_t nl = 0;
            k3c_stamp_parse info;
            int begins[2] = {0}, waits[2] = {0}, ends[2] = {0};
            if (k3c_stamp_launches(all, n, &L, &nl, &info) || nl != 2) {
                printf("  %zu records, %zu launches (want 2)\n", n, nl);
                bad = 1;
            } else {
                for (size_t i = 0; i < n; i++) {
                    int l = all[i].grid == L[0].grid ? 0 : all[i].grid == L[1].grid ? 1 : -1, k = K3C_STAMP_KIND(all[i].info);
                    if (l < 0) bad = 1;
                    else if (k == K3C_STAMP_BEGIN) begins[l]++;
                    else if (k == K3C_STAMP_WAIT) waits[l]++;
                    else ends[l]++;
                }
                /* rmsnorm: T blocks of 320 threads (10 warps), no PDL wait; the GEMV: 8-warp blocks, each waits */
                if (L[0].kid != K3C_KID_RMSNORM || L[0].blocks != T || begins[0] != T || waits[0] != 0 ||
                    ends[0] != 10 * T || L[0].blocks_no_end || L[1].kid != K3C_KID_GEMV_T1 || begins[1] != L[1].blocks ||
                    waits[1] != L[1].blocks || ends[1] != 8 * L[1].blocks || L[1].blocks_no_end || info.orphans ||
                    info.dup_begin || L[0].e1 < L[0].s0 || L[1].e1 < L[1].s0) {
                    printf("  launches: %s %d blocks (%d/%d/%d), %s %d blocks (%d/%d/%d)\n", k3c_stamp_kid_name(L[0].kid),
                           L[0].blocks, begins[0], waits[0], ends[0], k3c_stamp_kid_name(L[1].kid), L[1].blocks, begins[1],
                           waits[1], ends[1]);
                    bad = 1;
                }
            }
            free(L);
        }
    }
    unsigned cnt[K3C_STAMP_REGIONS], total = 0;
    dev_download(cnt, on.count, sizeof cnt);
    for (int g = 0; g < K3C_STAMP_REGIONS; g++) total += cnt[g];
    if (!bad && (total == 0 || total != total1)) {
        printf("  %u records after the unstamped pass, %u after the stamped one\n", total, total1);
        bad = 1;
    }
    verdict("stamps: rmsnorm + gemv_t1, records and bits", bad ? INFINITY : 0, 1e-30);
    cudaFree(on.rec); cudaFree(on.count); cudaFree(dx); cudaFree(dw); cudaFree(dW); cudaFree(dxg); cudaFree(dy); cudaFree(dg);
    free(x); free(w); free(xg); free(y0); free(y1); free(g0); free(g1); free(W);
}

int main(int argc, char **argv) {
    int all = argc > 1 && strcmp(argv[1], "all") == 0;
    const char *only = getenv("EMU_ONLY");
    k3c_rng r;
    k3c_rng_seed(&r, 20261129);
    if (!only || strstr("attnres", only)) attnres_cases(&r, all);
    if (!only || strstr("gemm", only)) gemm_cases(&r);
    if (!only || strstr("fanout", only)) fanout_cases(&r);
    if (!only || strstr("stamps", only)) stamp_cases(&r);
    printf("kernels_emu: %d case(s), %d failure(s)\n", cases_run, failures);
    return failures != 0;
}
