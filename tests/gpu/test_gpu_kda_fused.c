/* The fused KDA decode kernel (cuda/kda.h k3c_cuda_kda_decode_fused) against the 7 separate launches it
 * replaces in the decode executor (conv x3, gate, q/k norm, recurrent_segs, gated norm; each of those is
 * tested against the CPU ops in test_gpu_kernels.c): on the same fresh random inputs (seeded from
 * test_seed()), several requests of q = 1 and q = 3 rows (and q = 9: more than one pass of the fused
 * kernel), K3 dims (H 96, dk = dv = 128, conv 4) and a small config, both gate kinds (safe gate with a
 * lower bound, softplus gate), sigmoid and SiLU output gates, round_bf16 1 (the executor's flags) and 0,
 * every output poisoned (NaN) before the launches: cq, ck, cv, g, beta, o, y, the states and the windows
 * must be bit-identical, and NaN-free. Also: o = NULL gives the same bits; read_only segments (a verify's)
 * give the same outputs through both the fused kernel and the separate launches and leave the states and
 * windows bitwise as they were; and dims the fused kernel does not take ((dk/32) dv > 512) run the separate
 * launches through the same launcher. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kda.h"
#include "gpu_util.h"
#include "../test.h"
#include "util/error.h"

static k3c_rng rng_for(const char *name) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(name));
    return r;
}

typedef struct {
    int H, dk, dv, W, nseg, q, has_lb, silu, round;
} fcase;

/* Device buffers of one run: outputs, and the requests' states / windows (copies of the same initial
 * values for every run). */
typedef struct {
    float *cq, *ck, *cv, *g, *beta, *o, *y, *state, *window;
    k3c_cuda_seg *segs;
} frun;

/* read_only: the segments a verify step passes (kda.h): state and window read, never written. */
static int frun_make(frun *u, const fcase *c, const float *s0, const float *w0, size_t sf, size_t wf, int read_only) {
    size_t T = (size_t)c->nseg * c->q, Ck = (size_t)c->H * c->dk, Cv = (size_t)c->H * c->dv;
    memset(u, 0, sizeof *u);
    u->cq = dev_poisoned(T * Ck * 4), u->ck = dev_poisoned(T * Ck * 4), u->g = dev_poisoned(T * Ck * 4);
    u->cv = dev_poisoned(T * Cv * 4), u->o = dev_poisoned(T * Cv * 4), u->y = dev_poisoned(T * Cv * 4);
    u->beta = dev_poisoned(T * c->H * 4);
    u->state = dev_upload(s0, sf * c->nseg * 4), u->window = dev_upload(w0, wf * c->nseg * 4);
    if (!u->cq || !u->ck || !u->g || !u->cv || !u->o || !u->y || !u->beta || !u->state || !u->window) return -1;
    k3c_cuda_seg h[8];
    if (c->nseg > 8) return -1;
    for (int s = 0; s < c->nseg && s < 8; s++)
        h[s] = (k3c_cuda_seg){s * c->q, c->q, u->state + (size_t)s * sf, u->window + (size_t)s * wf, read_only};
    u->segs = dev_upload(h, sizeof(k3c_cuda_seg) * (size_t)c->nseg);
    return u->segs ? 0 : -1;
}

static void frun_free(frun *u) {
    cudaFree(u->cq), cudaFree(u->ck), cudaFree(u->cv), cudaFree(u->g), cudaFree(u->beta), cudaFree(u->o);
    cudaFree(u->y), cudaFree(u->state), cudaFree(u->window), cudaFree(u->segs);
}

/* Downloads a device output and compares it with the reference run's: returns the count of differing
 * words (-1 when a copy failed), and counts NaN words of the reference into *nan. */
static long diff_words(const float *da, const float *db, size_t n, long *nan) {
    float *a = fmalloc(n), *b = fmalloc(n);
    long d = -1;
    if (a && b && dev_download(a, da, n * 4) == 0 && dev_download(b, db, n * 4) == 0) {
        d = 0;
        for (size_t i = 0; i < n; i++) {
            d += memcmp(&a[i], &b[i], 4) != 0;
            *nan += isnan(a[i]) != 0;
        }
    }
    free(a), free(b);
    return d;
}

static void fused_case(k3c_rng *r, const fcase *c) {
    int H = c->H, dk = c->dk, dv = c->dv, W = c->W, T = c->nseg * c->q, Ck = H * dk, Cv = H * dv;
    /* windows [3][W-1][C] per request, the region of conv `which` at which * (W-1) * C with its own C (as
     * k3c_cuda_kda_conv_segs): dv >= dk keeps the three regions apart */
    size_t sf = (size_t)H * dk * dv, wf = (size_t)3 * (W - 1) * (Cv > Ck ? Cv : Ck);
    size_t nk = (size_t)T * Ck, nv = (size_t)T * Cv;
    float *xq = fmalloc(nk), *xk = fmalloc(nk), *xv = fmalloc(nv), *f = fmalloc(nk), *b = fmalloc((size_t)T * H);
    float *z = fmalloc(nv), *tq = fmalloc((size_t)Ck * W), *tk = fmalloc((size_t)Ck * W), *tv = fmalloc((size_t)Cv * W);
    float *alog = fmalloc(H), *dtb = fmalloc(Ck), *nw = fmalloc(dv);
    float *s0 = fmalloc(sf * c->nseg), *w0 = fmalloc(wf * c->nseg);
    fill_normal(r, xq, nk, 1.0f), fill_normal(r, xk, nk, 1.0f), fill_normal(r, xv, nv, 1.0f);
    fill_normal(r, f, nk, 1.0f), fill_normal(r, b, (size_t)T * H, 1.0f), fill_normal(r, z, nv, 1.0f);
    fill_normal(r, tq, (size_t)Ck * W, 0.5f), fill_normal(r, tk, (size_t)Ck * W, 0.5f);
    fill_normal(r, tv, (size_t)Cv * W, 0.5f);
    fill_normal(r, s0, sf * c->nseg, 0.3f), fill_normal(r, w0, wf * c->nseg, 1.0f);
    /* A_log: log of [1, 16] (Kimi Linear's init) for the softplus gate, around 0 for the safe gate; dt_bias
     * softplus^-1 of [0.001, 0.1]; norm weight around 1 */
    for (int h = 0; h < H; h++)
        alog[h] = c->has_lb ? 0.5f * (float)k3c_rng_normal(r) : (float)log(1.0 + 15.0 * k3c_rng_uniform(r));
    for (int i = 0; i < Ck; i++) dtb[i] = (float)log(expm1(0.001 + 0.1 * k3c_rng_uniform(r)));
    for (int e = 0; e < dv; e++) nw[e] = 1.0f + 0.3f * (float)k3c_rng_normal(r);
    if (c->round) { /* the model's bf16 stores: the projections and the windows hold bf16 values */
        float *rb[] = {xq, xk, f}, *rv[] = {xv, z};
        for (int i = 0; i < 3; i++)
            for (size_t j = 0; j < nk; j++) rb[i][j] = bf16_round(rb[i][j]);
        for (int i = 0; i < 2; i++)
            for (size_t j = 0; j < nv; j++) rv[i][j] = bf16_round(rv[i][j]);
        for (size_t j = 0; j < wf * c->nseg; j++) w0[j] = bf16_round(w0[j]);
    }
    float *d_xq = dev_upload(xq, nk * 4), *d_xk = dev_upload(xk, nk * 4), *d_xv = dev_upload(xv, nv * 4);
    float *d_f = dev_upload(f, nk * 4), *d_b = dev_upload(b, (size_t)T * H * 4), *d_z = dev_upload(z, nv * 4);
    float *d_tq = dev_upload(tq, (size_t)Ck * W * 4), *d_tk = dev_upload(tk, (size_t)Ck * W * 4);
    float *d_tv = dev_upload(tv, (size_t)Cv * W * 4), *d_al = dev_upload(alog, (size_t)H * 4);
    float *d_dt = dev_upload(dtb, (size_t)Ck * 4), *d_nw = dev_upload(nw, (size_t)dv * 4);
    /* D, E: read_only segments (verify), fused and separate; I: never launched, the initial state / window */
    frun A, B, C, D, E, I;
    int ok = d_xq && d_xk && d_xv && d_f && d_b && d_z && d_tq && d_tk && d_tv && d_al && d_dt && d_nw;
    ok = frun_make(&A, c, s0, w0, sf, wf, 0) == 0 && frun_make(&B, c, s0, w0, sf, wf, 0) == 0 &&
         frun_make(&C, c, s0, w0, sf, wf, 0) == 0 && frun_make(&D, c, s0, w0, sf, wf, 1) == 0 &&
         frun_make(&E, c, s0, w0, sf, wf, 1) == 0 && frun_make(&I, c, s0, w0, sf, wf, 0) == 0 && ok;
    float eps = 1e-5f, lb = -5.0f;
    int fits = k3c_cuda_kda_decode_fused_fits(dk, dv);
    if (ok) { /* A: the separate launches, in the order the executor ran them */
        ok = k3c_cuda_kda_conv_segs(d_xq, A.segs, c->nseg, Ck, W, d_tq, 0, c->round, A.cq, 0) == K3C_OK &&
             k3c_cuda_kda_conv_segs(d_xk, A.segs, c->nseg, Ck, W, d_tk, 1, c->round, A.ck, 0) == K3C_OK &&
             k3c_cuda_kda_conv_segs(d_xv, A.segs, c->nseg, Cv, W, d_tv, 2, c->round, A.cv, 0) == K3C_OK &&
             k3c_cuda_kda_gate(d_f, d_b, d_al, d_dt, T, H, dk, c->has_lb, lb, A.g, A.beta, 0) == K3C_OK &&
             k3c_cuda_kda_qk_norm(A.cq, A.ck, T, H, dk, 0) == K3C_OK &&
             k3c_cuda_kda_recurrent_segs(A.segs, c->nseg, A.cq, A.ck, A.cv, A.g, A.beta, H, dk, dv, c->round, A.o,
                                         0) == K3C_OK &&
             k3c_cuda_kda_gated_norm(A.o, d_z, d_nw, T, H, dv, eps, c->silu, c->round, A.y, 0) == K3C_OK;
        /* B: fused, o written; C: fused, o NULL (where the dims take the fused kernel) */
        ok = ok &&
             k3c_cuda_kda_decode_fused(B.segs, c->nseg, T, H, dk, dv, W, d_xq, d_xk, d_xv, d_tq, d_tk, d_tv, d_f, d_b,
                                       d_al, d_dt, c->has_lb, lb, d_z, d_nw, eps, c->silu, c->round, B.cq, B.ck, B.cv,
                                       B.g, B.beta, B.o, B.y, 0) == K3C_OK;
        ok = ok && (!fits || k3c_cuda_kda_decode_fused(C.segs, c->nseg, T, H, dk, dv, W, d_xq, d_xk, d_xv, d_tq, d_tk,
                                                       d_tv, d_f, d_b, d_al, d_dt, c->has_lb, lb, d_z, d_nw, eps,
                                                       c->silu, c->round, C.cq, C.ck, C.cv, C.g, C.beta, NULL, C.y,
                                                       0) == K3C_OK);
        ok = ok &&
             k3c_cuda_kda_decode_fused(D.segs, c->nseg, T, H, dk, dv, W, d_xq, d_xk, d_xv, d_tq, d_tk, d_tv, d_f, d_b,
                                       d_al, d_dt, c->has_lb, lb, d_z, d_nw, eps, c->silu, c->round, D.cq, D.ck, D.cv,
                                       D.g, D.beta, D.o, D.y, 0) == K3C_OK &&
             k3c_cuda_kda_decode_separate(E.segs, c->nseg, T, H, dk, dv, W, d_xq, d_xk, d_xv, d_tq, d_tk, d_tv, d_f,
                                          d_b, d_al, d_dt, c->has_lb, lb, d_z, d_nw, eps, c->silu, c->round, E.cq,
                                          E.ck, E.cv, E.g, E.beta, E.o, E.y, 0) == K3C_OK;
        ok = ok && cudaDeviceSynchronize() == cudaSuccess;
        if (!ok) fprintf(stderr, "kda fused case: %s / %s\n", k3c_error_message(),
                         cudaGetErrorString(cudaGetLastError()));
    }
    static const char *names[] = {"cq", "ck", "cv", "g", "beta", "o", "y", "state", "window"};
    long diffB[9], diffC[9], diffD[9], diffE[9], nanB = 0, nanC = 0, nanD = 0;
    for (int i = 0; i < 9; i++) diffB[i] = diffC[i] = diffD[i] = diffE[i] = 0;
    if (ok) {
        const float *a[9] = {A.cq, A.ck, A.cv, A.g, A.beta, A.o, A.y, A.state, A.window};
        const float *pb[9] = {B.cq, B.ck, B.cv, B.g, B.beta, B.o, B.y, B.state, B.window};
        const float *pc[9] = {C.cq, C.ck, C.cv, C.g, C.beta, C.o, C.y, C.state, C.window};
        size_t n[9] = {nk, nk, nv, nk, (size_t)T * H, nv, nv, sf * c->nseg, wf * c->nseg};
        for (int i = 0; i < 9; i++) {
            diffB[i] = diff_words(pb[i], a[i], n[i], &nanB);
            if (fits && i != 5) diffC[i] = diff_words(pc[i], a[i], n[i], &nanC);
        }
        /* read_only: the same outputs as A, the state and window still the initial ones (I's). Only where
         * the three window regions are apart (dv >= dk): else v's region overlaps k's, which the in-place
         * run advances before v's conv reads it */
        const float *pd[9] = {D.cq, D.ck, D.cv, D.g, D.beta, D.o, D.y, D.state, D.window};
        const float *pe[9] = {E.cq, E.ck, E.cv, E.g, E.beta, E.o, E.y, E.state, E.window};
        for (int i = 0; i < 9 && dv >= dk; i++) {
            const float *ref = i < 7 ? a[i] : i == 7 ? I.state : I.window;
            diffD[i] = diff_words(pd[i], ref, n[i], &nanD);
            diffE[i] = diff_words(pe[i], ref, n[i], &nanD);
        }
    }
    cudaFree(d_xq), cudaFree(d_xk), cudaFree(d_xv), cudaFree(d_f), cudaFree(d_b), cudaFree(d_z);
    cudaFree(d_tq), cudaFree(d_tk), cudaFree(d_tv), cudaFree(d_al), cudaFree(d_dt), cudaFree(d_nw);
    frun_free(&A), frun_free(&B), frun_free(&C), frun_free(&D), frun_free(&E), frun_free(&I);
    free(xq), free(xk), free(xv), free(f), free(b), free(z), free(tq), free(tk), free(tv), free(alog), free(dtb);
    free(nw), free(s0), free(w0);

    CHECKF(ok, "H %d dk %d dv %d nseg %d q %d: launch or copy failed", H, dk, dv, c->nseg, c->q);
    if (!ok) return;
    for (int i = 0; i < 9; i++) {
        CHECKF(diffB[i] == 0, "H %d dk %d dv %d W %d nseg %d q %d lb %d silu %d round %d: fused %s differs from the "
               "separate launches in %ld words", H, dk, dv, W, c->nseg, c->q, c->has_lb, c->silu, c->round, names[i],
               diffB[i]);
        CHECKF(diffC[i] == 0, "H %d dk %d dv %d nseg %d q %d: fused with o = NULL: %s differs in %ld words", H, dk, dv,
               c->nseg, c->q, names[i], diffC[i]);
        CHECKF(diffD[i] == 0 && diffE[i] == 0, "H %d dk %d dv %d nseg %d q %d: read_only segments: %s differs from %s "
               "in %ld (fused) / %ld (separate) words", H, dk, dv, c->nseg, c->q, names[i],
               i < 7 ? "the in-place run's" : "the initial one", diffD[i], diffE[i]);
    }
    CHECKF(nanD == 0, "H %d dk %d dv %d nseg %d q %d: %ld NaN words in the read_only runs' outputs", H, dk, dv,
           c->nseg, c->q, nanD);
    CHECKF(nanB == 0 && nanC == 0, "H %d dk %d dv %d nseg %d q %d: %ld / %ld NaN words in the fused outputs", H, dk,
           dv, c->nseg, c->q, nanB, nanC);
}

/* K3 / Kimi Linear dims: the executor's decode (q 1) and verify (q 3) rows, its round flags; both gates. */
TEST(gpu_kda_fused_k3_dims) {
    k3c_rng r = rng_for("kda_fused_k3");
    static const fcase cs[] = {
        {96, 128, 128, 4, 3, 1, 1, 0, 1}, {96, 128, 128, 4, 3, 3, 1, 0, 1}, {96, 128, 128, 4, 4, 1, 0, 0, 1},
        {96, 128, 128, 4, 2, 3, 0, 1, 1}, {96, 128, 128, 4, 2, 3, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) fused_case(&r, &cs[i]);
}

/* A small config (the tiny preset's H 4, dk 32), dv != dk, conv widths 2-4, q up to 9 (two passes of the
 * fused kernel), and dims the fused kernel hands to the separate launches. */
TEST(gpu_kda_fused_small) {
    k3c_rng r = rng_for("kda_fused_small");
    static const fcase cs[] = {
        {4, 32, 32, 4, 3, 1, 1, 0, 1},  {4, 32, 32, 4, 3, 3, 0, 1, 1},   {4, 32, 32, 4, 3, 3, 1, 0, 0},
        {4, 32, 32, 4, 2, 9, 0, 0, 1},  {3, 64, 96, 3, 2, 3, 1, 1, 1},   {2, 32, 48, 2, 2, 3, 0, 0, 1},
        {5, 32, 32, 4, 8, 1, 0, 1, 1},  {2, 256, 128, 4, 2, 3, 0, 0, 1}, /* (dk/32) dv = 1024: separate launches */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) fused_case(&r, &cs[i]);
}
