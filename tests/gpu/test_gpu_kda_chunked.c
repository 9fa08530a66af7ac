/* The chunked KDA kernel (cuda/kda.h k3c_cuda_kda_chunked) against the recurrence: a float64 recurrence
 * written here from spec §2.2 step 7 and the CPU f32 recurrence k3c_kda_recurrent, on fresh random inputs
 * (seeded from test_seed()), outputs poisoned (NaN) before each launch, lengths crossing the kernel's
 * 32-token chunks, both gate kinds' decay ranges, a decay strong enough that the cumulative decay within a
 * chunk underflows f32, nonzero initial states, round_bf16 0 and 1. Also: the multi-request launchers
 * (_segs) give per request the same bits as the single-request ones (one kernel behind both). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/kda.h"
#include "gpu_util.h"
#include "../test.h"
#include "util/error.h"

static k3c_rng rng_for(const char *name) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(name));
    return r;
}

/* Worst error per check, printed as "METRIC <kernel> rel_l2 <threshold> <worst>" at exit (as
 * test_gpu_kernels.c, for tools/gpu-check.sh). */
static struct { const char *kernel; double thr, worst; } notes[16];
static int num_notes;

static void note(const char *kernel, double thr, double e) {
    int i = 0;
    while (i < num_notes && !(strcmp(notes[i].kernel, kernel) == 0 && notes[i].thr == thr)) i++;
    if (i == num_notes) {
        if (num_notes == 16) return;
        notes[num_notes].kernel = kernel;
        notes[num_notes].thr = thr;
        notes[num_notes++].worst = 0.0;
    }
    if (!(e <= notes[i].worst)) notes[i].worst = e; /* NaN sticks */
}

__attribute__((destructor)) static void print_notes(void) {
    for (int i = 0; i < num_notes; i++)
        printf("METRIC %-28s rel_l2 %8.1e %10.3e\n", notes[i].kernel, notes[i].thr, notes[i].worst);
}

/* Decay ranges: K3's safe gate -5 sigmoid(.) in (-5, 0); Kimi Linear's -exp(A_log) softplus(f + dt_bias)
 * (A in [1, 16], dt_bias around softplus^-1 of [0.001, 0.1], as initialised); strong: g in (-40, 0), so the
 * cumulative decay of a 32-token chunk reaches ~-640 and exp of it underflows f32 (a kernel forming
 * exp(-gam) would give inf / NaN); weak: g in (-0.02, 0), the state remembers everything. */
enum { GATE_SAFE, GATE_KIMI, GATE_STRONG, GATE_WEAK, GATE_KINDS };
static const char *gate_name[] = {"safe", "kimi", "strong", "weak"};

typedef struct {
    int T, H, dk, dv;
    float *q, *k, *v, *g, *beta, *s0;
} kcase;

static void kcase_make(kcase *c, k3c_rng *r, int T, int H, int dk, int dv, int gate, float s0_scale) {
    size_t nk = (size_t)T * H * dk, nv = (size_t)T * H * dv, ns = (size_t)H * dk * dv;
    c->T = T, c->H = H, c->dk = dk, c->dv = dv;
    c->q = fmalloc(nk), c->k = fmalloc(nk), c->v = fmalloc(nv), c->g = fmalloc(nk);
    c->beta = fmalloc((size_t)T * H), c->s0 = fmalloc(ns);
    fill_normal(r, c->q, nk, 1.0f);
    fill_normal(r, c->k, nk, 1.0f);
    fill_normal(r, c->v, nv, 1.0f);
    fill_normal(r, c->s0, ns, s0_scale);
    k3c_kda_qk_norm(c->q, c->k, T, H, dk); /* unit k, q scaled by dk^-1/2, as the model feeds the rule */
    for (size_t i = 0; i < (size_t)T * H; i++) c->beta[i] = (float)k3c_rng_uniform(r);
    float A[64], bias[512];
    for (int h = 0; h < H && h < 64; h++) A[h] = (float)exp(log(16.0) * k3c_rng_uniform(r));
    for (int d = 0; d < dk && d < 512; d++) {
        double dt = exp(log(0.001) + (log(0.1) - log(0.001)) * k3c_rng_uniform(r));
        bias[d] = (float)log(expm1(dt));
    }
    for (size_t i = 0; i < nk; i++) {
        double u = k3c_rng_uniform(r), gv;
        if (gate == GATE_SAFE) {
            gv = -5.0 / (1.0 + exp(-2.0 * k3c_rng_normal(r)));
        } else if (gate == GATE_KIMI) {
            int h = (int)(i / dk % H), d = (int)(i % dk);
            double x = bias[d < 512 ? d : 0] + 0.5 * k3c_rng_normal(r);
            gv = -A[h < 64 ? h : 0] * (x > 20.0 ? x : log1p(exp(x)));
        } else if (gate == GATE_STRONG) {
            gv = -40.0 * u;
        } else {
            gv = -0.02 * u;
        }
        c->g[i] = (float)gv;
    }
}

static void kcase_free(kcase *c) {
    free(c->q), free(c->k), free(c->v), free(c->g), free(c->beta), free(c->s0);
}

/* Spec §2.2 step 7 in double, per token and head: S <- Diag(exp g) S; u = beta (v - S^T k); S += k u^T;
 * o = S^T q. S [H][dk][dv] starts as s0. */
static void ref_recurrence(const kcase *c, double *S, double *o) {
    int H = c->H, dk = c->dk, dv = c->dv;
    for (size_t i = 0; i < (size_t)H * dk * dv; i++) S[i] = c->s0[i];
    double *u = malloc(sizeof(double) * (size_t)dv);
    for (int t = 0; t < c->T; t++)
        for (int h = 0; h < H; h++) {
            size_t rk = (size_t)t * H + h;
            const float *q = c->q + rk * dk, *k = c->k + rk * dk, *v = c->v + rk * dv, *g = c->g + rk * dk;
            double *Sh = S + (size_t)h * dk * dv;
            for (int d = 0; d < dk; d++) {
                double a = exp((double)g[d]);
                for (int e = 0; e < dv; e++) Sh[(size_t)d * dv + e] *= a;
            }
            for (int e = 0; e < dv; e++) {
                double kS = 0;
                for (int d = 0; d < dk; d++) kS += (double)k[d] * Sh[(size_t)d * dv + e];
                u[e] = c->beta[rk] * ((double)v[e] - kS);
            }
            for (int d = 0; d < dk; d++)
                for (int e = 0; e < dv; e++) Sh[(size_t)d * dv + e] += (double)k[d] * u[e];
            for (int e = 0; e < dv; e++) {
                double s = 0;
                for (int d = 0; d < dk; d++) s += (double)q[d] * Sh[(size_t)d * dv + e];
                o[rk * dv + e] = s;
            }
        }
    free(u);
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* One case: chunked with round_bf16 0 (o and final state within tol of the float64 recurrence and of the
 * CPU f32 recurrence), round_bf16 1 (state bit-identical, o = bf16(o of the round-0 run) bit for bit) and
 * o = NULL (state bit-identical). */
static void chunked_case(k3c_rng *r, int T, int H, int dk, int dv, int gate, float s0_scale, double tol) {
    kcase c;
    kcase_make(&c, r, T, H, dk, dv, gate, s0_scale);
    size_t nk = (size_t)T * H * dk, nv = (size_t)T * H * dv, ns = (size_t)H * dk * dv;
    double *Sd = malloc(sizeof(double) * ns), *od = malloc(sizeof(double) * nv);
    ref_recurrence(&c, Sd, od);
    float *Sr = fmalloc(ns), *orr = fmalloc(nv);
    memcpy(Sr, c.s0, ns * 4);
    poison_f32(orr, nv);
    k3c_kda_recurrent(Sr, c.q, c.k, c.v, c.g, c.beta, T, H, dk, dv, orr, NULL);

    float *dq = dev_upload(c.q, nk * 4), *dk_ = dev_upload(c.k, nk * 4), *dv_ = dev_upload(c.v, nv * 4);
    float *dg = dev_upload(c.g, nk * 4), *db = dev_upload(c.beta, (size_t)T * H * 4);
    float *dS0 = dev_upload(c.s0, ns * 4), *dS1 = dev_upload(c.s0, ns * 4), *dS2 = dev_upload(c.s0, ns * 4);
    float *do0 = dev_poisoned(nv * 4), *do1 = dev_poisoned(nv * 4);
    float *S0 = fmalloc(ns), *S1 = fmalloc(ns), *S2 = fmalloc(ns), *o0 = fmalloc(nv), *o1 = fmalloc(nv);
    int ok = dq && dk_ && dv_ && dg && db && dS0 && dS1 && dS2 && do0 && do1;
    if (ok) {
        ok = k3c_cuda_kda_chunked(dS0, dq, dk_, dv_, dg, db, T, H, dk, dv, 64, 0, do0, 0) == K3C_OK &&
             k3c_cuda_kda_chunked(dS1, dq, dk_, dv_, dg, db, T, H, dk, dv, 64, 1, do1, 0) == K3C_OK &&
             k3c_cuda_kda_chunked(dS2, dq, dk_, dv_, dg, db, T, H, dk, dv, 64, 1, NULL, 0) == K3C_OK;
        if (!ok) fprintf(stderr, "k3c_cuda_kda_chunked: %s\n", k3c_error_message());
    }
    ok = ok && dev_download(S0, dS0, ns * 4) == 0 && dev_download(S1, dS1, ns * 4) == 0 &&
         dev_download(S2, dS2, ns * 4) == 0 && dev_download(o0, do0, nv * 4) == 0 &&
         dev_download(o1, do1, nv * 4) == 0;
    double eo = INFINITY, es = INFINITY, ero = INFINITY, ers = INFINITY;
    int same_state = 0, o_rounded = 0;
    if (ok) {
        eo = rel_l2_f32(o0, od, nv), es = rel_l2_f32(S0, Sd, ns);
        ero = rel_l2_f32f32(o0, orr, nv), ers = rel_l2_f32f32(S0, Sr, ns);
        same_state = memcmp(S0, S1, ns * 4) == 0 && memcmp(S0, S2, ns * 4) == 0;
        o_rounded = 1;
        for (size_t i = 0; i < nv; i++)
            if (bits(o1[i]) != bits(bf16_round(o0[i]))) o_rounded = 0;
    }
    cudaFree(dq), cudaFree(dk_), cudaFree(dv_), cudaFree(dg), cudaFree(db);
    cudaFree(dS0), cudaFree(dS1), cudaFree(dS2), cudaFree(do0), cudaFree(do1);
    free(S0), free(S1), free(S2), free(o0), free(o1), free(Sd), free(od), free(Sr), free(orr);
    kcase_free(&c);

    double worst = fmax(fmax(eo, es), fmax(ero, ers));
    note(gate == GATE_STRONG ? "kda_chunked(strong_decay)" : "kda_chunked(o,state)", tol, worst);
    CHECKF(ok, "T %d H %d dk %d dv %d: launch or copy failed", T, H, dk, dv);
    CHECKF(eo < tol && es < tol && ero < tol && ers < tol,
           "T %d H %d dk %d dv %d gate %s s0 %g: vs float64 o %.3g state %.3g; vs CPU f32 recurrence o %.3g state "
           "%.3g (tol %g)", T, H, dk, dv, gate_name[gate], s0_scale, eo, es, ero, ers, tol);
    CHECKF(same_state, "T %d H %d dk %d dv %d: final state differs between round_bf16 0 / 1 / o NULL", T, H, dk, dv);
    CHECKF(o_rounded, "T %d H %d dk %d dv %d: round_bf16 output is not bf16(o of the f32 run)", T, H, dk, dv);
}

/* rel L2 tolerance: 1e-5, except strong decay: gam there reaches ~-640 in f32, whose ulp (6e-5) is the
 * error of an exponent gam_i - gam_j, so terms that survive the decay carry ~1e-5 relative error. */
static double tol_for(int gate) { return gate == GATE_STRONG ? 3e-5 : 1e-5; }

/* K3 / Kimi Linear / every preset: dk = dv = 128; one head and several; lengths around the 32-token chunks
 * (and the spec's 64). */
TEST(gpu_kda_chunked_vs_recurrence) {
    k3c_rng r = rng_for("kda_chunked");
    static const int T_l[] = {1, 3, 17, 63, 64, 65, 200};
    static const int H_l[] = {1, 3};
    for (int gate = 0; gate < GATE_KINDS; gate++)
        for (int ti = 0; ti < 7; ti++)
            for (int hi = 0; hi < 2; hi++) chunked_case(&r, T_l[ti], H_l[hi], 128, 128, gate, 0.3f, tol_for(gate));
    /* a fresh (zero) state once per gate kind */
    for (int gate = 0; gate < GATE_KINDS; gate++) chunked_case(&r, 40, 2, 128, 128, gate, 0.0f, tol_for(gate));
}

/* Other dims the chunked kernel takes (dk a multiple of 32 in [32, 256], dv a multiple of 32; dk != dv
 * catches a transposed state), and dv = 24, which it hands to the recurrent kernel. */
TEST(gpu_kda_chunked_dims) {
    k3c_rng r = rng_for("kda_chunked_dims");
    static const int dims[][2] = {{64, 32}, {32, 96}, {256, 64}, {96, 128}, {32, 24}};
    static const int T_l[] = {1, 33, 65, 100};
    for (int di = 0; di < 5; di++)
        for (int ti = 0; ti < 4; ti++)
            for (int gate = GATE_SAFE; gate <= GATE_KIMI; gate++)
                chunked_case(&r, T_l[ti], 2, dims[di][0], dims[di][1], gate, 0.3f, tol_for(gate));
}

/* Requests of lengths 1, 31, 0, 64, 90 in one batch (rows concatenated, each with its own state and conv
 * window): the _segs launchers give per request the same bits as the single-request launchers on that
 * request's rows (chunked, recurrent, conv); and with read_only segments (a verify's) the same outputs, the
 * states and windows left as they were. */
TEST(gpu_kda_segs_match_single) {
    k3c_rng r = rng_for("kda_segs");
    enum { NS = 5 };
    static const int len[NS] = {1, 31, 0, 64, 90};
    int H = 2, dk = 128, dv = 128, W = 4, C = H * dk, Tt = 0, row0[NS];
    for (int s = 0; s < NS; s++) row0[s] = Tt, Tt += len[s];
    size_t nk = (size_t)Tt * H * dk, nv = (size_t)Tt * H * dv, ns = (size_t)H * dk * dv;
    size_t nw = (size_t)3 * (W - 1) * C; /* a request's windows: q, k, v */
    kcase c;
    kcase_make(&c, &r, Tt, H, dk, dv, GATE_SAFE, 0.3f);
    float *s0 = fmalloc(ns * NS), *win = fmalloc(nw * NS), *taps = fmalloc((size_t)C * W);
    fill_normal(&r, s0, ns * NS, 0.3f);
    fill_normal(&r, win, nw * NS, 1.0f);
    fill_normal(&r, taps, (size_t)C * W, 0.5f);
    float *dq = dev_upload(c.q, nk * 4), *dk_ = dev_upload(c.k, nk * 4), *dv_ = dev_upload(c.v, nv * 4);
    float *dg = dev_upload(c.g, nk * 4), *db = dev_upload(c.beta, (size_t)Tt * H * 4);
    float *dtaps = dev_upload(taps, (size_t)C * W * 4);
    float *dS_seg = dev_upload(s0, ns * NS * 4), *dS_one = dev_upload(s0, ns * NS * 4);
    float *dW_seg = dev_upload(win, nw * NS * 4), *dW_one = dev_upload(win, nw * NS * 4);
    float *do_seg = dev_poisoned(nv * 4), *do_one = dev_poisoned(nv * 4);
    float *dc_seg = dev_poisoned(nk * 4), *dc_one = dev_poisoned(nk * 4);
    k3c_cuda_seg hs[NS];
    for (int s = 0; s < NS; s++)
        hs[s] = (k3c_cuda_seg){row0[s], len[s], dS_seg + ns * s, dW_seg + nw * s, 0};
    k3c_cuda_seg *dsegs = dev_upload(hs, sizeof hs);
    CHECK(dq && dk_ && dv_ && dg && db && dtaps && dS_seg && dS_one && dW_seg && dW_one && do_seg && do_one &&
          dc_seg && dc_one && dsegs);
    float *S_seg = fmalloc(ns * NS), *S_one = fmalloc(ns * NS), *o_seg = fmalloc(nv), *o_one = fmalloc(nv);
    float *W_seg = fmalloc(nw * NS), *W_one = fmalloc(nw * NS), *c_seg = fmalloc(nk), *c_one = fmalloc(nk);
    for (int pass = 0; pass < 2; pass++) { /* 0: chunked, 1: recurrent; each after the conv of k (which 1) */
        CHECK(cudaMemcpy(dS_seg, s0, ns * NS * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        CHECK(cudaMemcpy(dS_one, s0, ns * NS * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        CHECK(cudaMemset(do_seg, 0xff, nv * 4) == cudaSuccess && cudaMemset(do_one, 0xff, nv * 4) == cudaSuccess);
        if (pass == 0) {
            CHECK_OK(k3c_cuda_kda_chunked_segs(dsegs, NS, dq, dk_, dv_, dg, db, H, dk, dv, 1, do_seg, 0));
            CHECK_OK(k3c_cuda_kda_conv_segs(dk_, dsegs, NS, C, W, dtaps, 1, 1, dc_seg, 0));
        } else {
            CHECK_OK(k3c_cuda_kda_recurrent_segs(dsegs, NS, dq, dk_, dv_, dg, db, H, dk, dv, 1, do_seg, 0));
        }
        for (int s = 0; s < NS; s++) {
            if (!len[s]) continue;
            size_t ok = (size_t)row0[s] * H * dk, ov = (size_t)row0[s] * H * dv;
            if (pass == 0) {
                CHECK_OK(k3c_cuda_kda_chunked(dS_one + ns * s, dq + ok, dk_ + ok, dv_ + ov, dg + ok,
                                              db + (size_t)row0[s] * H, len[s], H, dk, dv, 64, 1, do_one + ov, 0));
                CHECK_OK(k3c_cuda_kda_conv(dk_ + ok, len[s], C, W, dtaps, dW_one + nw * s + (size_t)(W - 1) * C, 1,
                                           dc_one + ok, 0));
            } else {
                CHECK_OK(k3c_cuda_kda_recurrent(dS_one + ns * s, dq + ok, dk_ + ok, dv_ + ov, dg + ok,
                                                db + (size_t)row0[s] * H, len[s], H, dk, dv, 1, do_one + ov, NULL,
                                                0));
            }
        }
        CHECK(dev_download(S_seg, dS_seg, ns * NS * 4) == 0 && dev_download(S_one, dS_one, ns * NS * 4) == 0);
        CHECK(dev_download(o_seg, do_seg, nv * 4) == 0 && dev_download(o_one, do_one, nv * 4) == 0);
        const char *what = pass == 0 ? "chunked" : "recurrent";
        CHECKF(rel_l2_f32f32(o_one, o_seg, nv) < 1e30, "%s: NaN in o", what); /* every row written */
        CHECKF(memcmp(o_seg, o_one, nv * 4) == 0, "%s: _segs o differs from the single-request launches", what);
        CHECKF(memcmp(S_seg, S_one, ns * NS * 4) == 0, "%s: _segs states differ from the single-request launches",
               what);
        /* the empty request's state is untouched */
        CHECKF(memcmp(S_seg + ns * 2, s0 + ns * 2, ns * 4) == 0, "%s: state of the empty request changed", what);
        if (pass == 0) {
            CHECK(dev_download(W_seg, dW_seg, nw * NS * 4) == 0 && dev_download(W_one, dW_one, nw * NS * 4) == 0);
            CHECK(dev_download(c_seg, dc_seg, nk * 4) == 0 && dev_download(c_one, dc_one, nk * 4) == 0);
            CHECKF(rel_l2_f32f32(c_one, c_seg, nk) < 1e30, "conv: NaN in out");
            CHECK(memcmp(c_seg, c_one, nk * 4) == 0);
            CHECK(memcmp(W_seg, W_one, nw * NS * 4) == 0);
        }
    }
    /* and the chunked result is the recurrence (tolerance as above) */
    {
        float *o_ch = fmalloc(nv);
        /* o_seg now holds the recurrent pass; redo the chunked _segs pass into o_ch */
        CHECK(cudaMemcpy(dS_seg, s0, ns * NS * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        CHECK(cudaMemset(do_seg, 0xff, nv * 4) == cudaSuccess);
        CHECK_OK(k3c_cuda_kda_chunked_segs(dsegs, NS, dq, dk_, dv_, dg, db, H, dk, dv, 0, do_seg, 0));
        CHECK(dev_download(o_ch, do_seg, nv * 4) == 0);
        /* the segments' states live in dS_seg: back to the initial states before the recurrent run */
        CHECK(cudaMemcpy(dS_seg, s0, ns * NS * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        CHECK_OK(k3c_cuda_kda_recurrent_segs(dsegs, NS, dq, dk_, dv_, dg, db, H, dk, dv, 0, do_one, 0));
        CHECK(dev_download(o_one, do_one, nv * 4) == 0);
        double e = rel_l2_f32f32(o_ch, o_one, nv);
        note("kda_chunked_segs(o)", 1e-5, e);
        CHECKF(e < 1e-5, "chunked _segs vs recurrent _segs: o rel L2 %.3g", e);
        free(o_ch);
    }
    { /* read_only segments (a verify's, kda.h): each _segs launcher gives the in-place run's outputs and leaves
       * the states and windows as they were */
        k3c_cuda_seg hr[NS];
        for (int s = 0; s < NS; s++) hr[s] = hs[s], hr[s].read_only = 1;
        k3c_cuda_seg *dro = dev_upload(hr, sizeof hr);
        CHECK(dro != NULL);
        for (int kind = 0; kind < 3; kind++) { /* chunked, recurrent, conv of k */
            const char *what = kind == 0 ? "chunked" : kind == 1 ? "recurrent" : "conv";
            float *dout = kind == 2 ? dc_seg : do_seg, *out_a = kind == 2 ? c_seg : o_seg;
            float *out_b = kind == 2 ? c_one : o_one;
            size_t n = kind == 2 ? nk : nv;
            for (int ro = 0; ro < 2; ro++) {
                const k3c_cuda_seg *sg = ro ? dro : dsegs;
                CHECK(cudaMemcpy(dS_seg, s0, ns * NS * 4, cudaMemcpyHostToDevice) == cudaSuccess);
                CHECK(cudaMemcpy(dW_seg, win, nw * NS * 4, cudaMemcpyHostToDevice) == cudaSuccess);
                CHECK(cudaMemset(dout, 0xff, n * 4) == cudaSuccess);
                if (kind == 0) CHECK_OK(k3c_cuda_kda_chunked_segs(sg, NS, dq, dk_, dv_, dg, db, H, dk, dv, 1, dout, 0));
                if (kind == 1) CHECK_OK(k3c_cuda_kda_recurrent_segs(sg, NS, dq, dk_, dv_, dg, db, H, dk, dv, 1, dout, 0));
                if (kind == 2) CHECK_OK(k3c_cuda_kda_conv_segs(dk_, sg, NS, C, W, dtaps, 1, 1, dout, 0));
                CHECK(dev_download(ro ? out_b : out_a, dout, n * 4) == 0);
            }
            CHECK(dev_download(S_seg, dS_seg, ns * NS * 4) == 0 && dev_download(W_seg, dW_seg, nw * NS * 4) == 0);
            CHECKF(rel_l2_f32f32(out_b, out_a, n) < 1e30, "%s read_only: NaN in the output", what);
            CHECKF(memcmp(out_a, out_b, n * 4) == 0, "%s read_only: the output differs from the in-place run's", what);
            CHECKF(memcmp(S_seg, s0, ns * NS * 4) == 0, "%s read_only: a state changed", what);
            CHECKF(memcmp(W_seg, win, nw * NS * 4) == 0, "%s read_only: a window changed", what);
        }
        cudaFree(dro);
    }
    cudaFree(dq), cudaFree(dk_), cudaFree(dv_), cudaFree(dg), cudaFree(db), cudaFree(dtaps);
    cudaFree(dS_seg), cudaFree(dS_one), cudaFree(dW_seg), cudaFree(dW_one), cudaFree(do_seg), cudaFree(do_one);
    cudaFree(dc_seg), cudaFree(dc_one), cudaFree(dsegs);
    free(S_seg), free(S_one), free(o_seg), free(o_one), free(W_seg), free(W_one), free(c_seg), free(c_one);
    free(s0), free(win), free(taps);
    kcase_free(&c);
}
