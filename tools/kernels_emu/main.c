/* Drives three launchers under tools/moe_emu's CPU emulation of CUDA, against references written here or in
 * the CPU library (the GPU tests' checks, for kernels changed when no GPU was at hand):
 *  - k3c_cuda_attnres_mix (cuda/attnres.cu): n 1, 2, 9, 11 sources (11: two source tiles), T 1, 5, 40, D 7,
 *    256, 7168 (T 40 only at D <= 256) against a float64 mix from the formula (rel L2 < 2e-5, gpu_attnres_mix's
 *    metric); the output NaN-poisoned, every element must be written;
 *  - k3c_cuda_matmul_bf16_round (cuda/gemm.cu, gemm NULL: the streaming kernels): rows 1, 3, 17, 64, 300, cols 8,
 *    264, 1032, T 1..8 against k3c_matmul_bf16 (rel L2 < 1e-5, gpu_matmul_bf16's threshold), and the rounded
 *    product equal to round(product) bit for bit.
 * Usage: emu [quick|all] (quick leaves out D 7168 with T 5). EMU_ONLY=attnres|gemm. The router runs through
 * its own GPU test under emulation: gpu_tests.sh gpu_router. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/attnres.h"
#include "cuda/gemm.h"
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

int main(int argc, char **argv) {
    int all = argc > 1 && strcmp(argv[1], "all") == 0;
    const char *only = getenv("EMU_ONLY");
    k3c_rng r;
    k3c_rng_seed(&r, 20261129);
    if (!only || strstr("attnres", only)) attnres_cases(&r, all);
    if (!only || strstr("gemm", only)) gemm_cases(&r);
    printf("kernels_emu: %d case(s), %d failure(s)\n", cases_run, failures);
    return failures != 0;
}
