/* Fused KDA decode kernel vs the 7 separate launches, both from src/cuda/kda.cu run under emu.h; and the
 * fused outputs (round 0) against a float64 reference written from the spec. */
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "emu.h"
#include "cuda/kda.h"
#include "cuda/common.cuh"
extern long emu_blocks_run;

typedef std::vector<float> V;
static std::mt19937_64 rng(12345);
static float nrm() { return std::normal_distribution<float>(0.f, 1.f)(rng); }
static float uni() { return std::uniform_real_distribution<float>(0.f, 1.f)(rng); }
static float bf(float x) { return k3c_dev_bf16(k3c_dev_to_bf16(x)); }
static V randv(size_t n, float sc, bool round) {
    V v(n);
    for (auto &x : v) x = round ? bf(nrm() * sc) : nrm() * sc;
    return v;
}
static int bitdiff(const V &a, const V &b) {
    if (a.size() != b.size()) return -1;
    int n = 0;
    for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], 4) != 0;
    return n;
}

struct Case {
    int H, dk, dv, W, nseg, q, has_lb, round, silu;
};

static int failures;

/* float64 reference of the whole decode provider: conv + SiLU, gate, beta, L2 norms, delta rule, gated norm */
static void reference(const Case &c, const V &xq, const V &xk, const V &xv, const V &tq, const V &tk, const V &tv,
                      const V &f, const V &b, const V &alog, const V &dtb, const V &z, const V &nw, float eps,
                      std::vector<std::vector<double>> &S, std::vector<std::vector<double>> &Win, std::vector<double> &y) {
    int H = c.H, dk = c.dk, dv = c.dv, W = c.W, Ck = H * dk, Cv = H * dv, T = c.nseg * c.q;
    std::vector<double> cq((size_t)T * Ck), ck((size_t)T * Ck), cv((size_t)T * Cv);
    auto silu = [](double x) { return x / (1 + exp(-x)); };
    for (int s = 0; s < c.nseg; s++) {
        const V *xs[3] = {&xq, &xk, &xv};
        const V *ts[3] = {&tq, &tk, &tv};
        std::vector<double> *os[3] = {&cq, &ck, &cv};
        for (int wch = 0; wch < 3; wch++) {
            int C = wch == 2 ? Cv : Ck;
            size_t wo = (size_t)wch * (W - 1) * C;
            for (int ch = 0; ch < C; ch++) {
                /* sequence = window (W-1 oldest first) then the request's q rows */
                std::vector<double> seq;
                for (int i = 0; i < W - 1; i++) seq.push_back(Win[s][wo + (size_t)i * C + ch]);
                for (int t = 0; t < c.q; t++) seq.push_back((*xs[wch])[(size_t)(s * c.q + t) * C + ch]);
                for (int t = 0; t < c.q; t++) {
                    double a = 0;
                    for (int j = 0; j < W; j++) a += (double)(*ts[wch])[(size_t)ch * W + j] * seq[t + j];
                    (*os[wch])[(size_t)(s * c.q + t) * C + ch] = silu(a);
                }
                for (int i = 0; i < W - 1; i++) Win[s][wo + (size_t)i * C + ch] = seq[seq.size() - (W - 1) + i];
            }
        }
    }
    y.assign((size_t)T * Cv, 0);
    for (int s = 0; s < c.nseg; s++)
        for (int t = 0; t < c.q; t++) {
            int r = s * c.q + t;
            for (int h = 0; h < H; h++) {
                double *qr = &cq[(size_t)r * Ck + h * dk], *kr = &ck[(size_t)r * Ck + h * dk];
                double sq = 0, sk = 0;
                for (int d = 0; d < dk; d++) sq += qr[d] * qr[d], sk += kr[d] * kr[d];
                for (int d = 0; d < dk; d++) qr[d] *= 1 / sqrt(dk) / sqrt(sq + 1e-6), kr[d] /= sqrt(sk + 1e-6);
                double A = exp((double)alog[h]), beta = 1 / (1 + exp(-(double)b[(size_t)r * H + h]));
                double *Sh = &S[s][(size_t)h * dk * dv];
                for (int d = 0; d < dk; d++) {
                    double x = (double)f[(size_t)r * Ck + h * dk + d] + dtb[h * dk + d], g;
                    g = c.has_lb ? -5.0 / (1 + exp(-A * x)) : -A * (x > 20 ? x : log1p(exp(x)));
                    for (int e = 0; e < dv; e++) Sh[(size_t)d * dv + e] *= exp(g);
                }
                std::vector<double> o(dv);
                for (int e = 0; e < dv; e++) {
                    double kS = 0;
                    for (int d = 0; d < dk; d++) kS += kr[d] * Sh[(size_t)d * dv + e];
                    double u = beta * (cv[(size_t)r * Cv + h * dv + e] - kS);
                    for (int d = 0; d < dk; d++) Sh[(size_t)d * dv + e] += kr[d] * u;
                    double a = 0;
                    for (int d = 0; d < dk; d++) a += qr[d] * Sh[(size_t)d * dv + e];
                    o[e] = a;
                }
                double ss = 0;
                for (int e = 0; e < dv; e++) ss += o[e] * o[e];
                double rs = 1 / sqrt(ss / dv + eps);
                for (int e = 0; e < dv; e++) {
                    double zz = z[(size_t)r * Cv + h * dv + e];
                    double gate = c.silu ? silu(zz) : 1 / (1 + exp(-zz));
                    y[(size_t)r * Cv + h * dv + e] = o[e] * rs * nw[e] * gate;
                }
            }
        }
}

static double rel_l2(const V &a, const std::vector<double> &b) {
    double n = 0, d = 0;
    for (size_t i = 0; i < a.size(); i++) n += (a[i] - b[i]) * (a[i] - b[i]), d += b[i] * b[i];
    return std::isfinite(n) ? sqrt(n / (d > 0 ? d : 1)) : INFINITY;
}

static void run_case(const Case &c) {
    int H = c.H, dk = c.dk, dv = c.dv, W = c.W, Ck = H * dk, Cv = H * dv, T = c.nseg * c.q;
    bool rnd = c.round;
    V xq = randv((size_t)T * Ck, 1, rnd), xk = randv((size_t)T * Ck, 1, rnd), xv = randv((size_t)T * Cv, 1, rnd);
    V tq = randv((size_t)Ck * W, 0.5f, true), tk = randv((size_t)Ck * W, 0.5f, true), tv = randv((size_t)Cv * W, 0.5f, true);
    V f = randv((size_t)T * Ck, 1, rnd), b = randv((size_t)T * H, 1, rnd), z = randv((size_t)T * Cv, 1, rnd);
    V alog(H), dtb((size_t)Ck), nw = randv(dv, 0.3f, true);
    for (auto &x : nw) x = bf(1.0f + x);
    for (auto &x : alog) x = bf(logf(1.0f + 15.0f * uni()));
    for (auto &x : dtb) x = bf(logf(expm1f(0.001f + 0.1f * uni())));
    if (c.has_lb) for (auto &x : alog) x = bf(0.5f * nrm());
    size_t sf = (size_t)H * dk * dv, wf = (size_t)3 * (W - 1) * (Ck > Cv ? Ck : Cv);
    std::vector<V> st0(c.nseg), win0(c.nseg);
    for (int s = 0; s < c.nseg; s++) st0[s] = randv(sf, 0.3f, false), win0[s] = randv(wf, 1, rnd);
    float eps = 1e-5f, lb = -5.0f;

    auto make_segs = [&](std::vector<V> &st, std::vector<V> &win) {
        std::vector<k3c_cuda_seg> sg(c.nseg);
        for (int s = 0; s < c.nseg; s++) sg[s] = {s * c.q, c.q, st[s].data(), win[s].data()};
        return sg;
    };
    float nan = __builtin_nanf("");
    /* unfused: the 7 launches, as rec_kda ran them */
    std::vector<V> stA = st0, winA = win0, stB = st0, winB = win0, stC = st0, winC = win0;
    V cqA((size_t)T * Ck, nan), ckA = cqA, gA = cqA, cvA((size_t)T * Cv, nan), oA = cvA, yA = cvA, bA((size_t)T * H, nan);
    auto sgA = make_segs(stA, winA);
    int rc = 0;
    rc |= k3c_cuda_kda_conv_segs(xq.data(), sgA.data(), c.nseg, Ck, W, tq.data(), 0, c.round, cqA.data(), 0);
    rc |= k3c_cuda_kda_conv_segs(xk.data(), sgA.data(), c.nseg, Ck, W, tk.data(), 1, c.round, ckA.data(), 0);
    rc |= k3c_cuda_kda_conv_segs(xv.data(), sgA.data(), c.nseg, Cv, W, tv.data(), 2, c.round, cvA.data(), 0);
    rc |= k3c_cuda_kda_gate(f.data(), b.data(), alog.data(), dtb.data(), T, H, dk, c.has_lb, lb, gA.data(), bA.data(), 0);
    rc |= k3c_cuda_kda_qk_norm(cqA.data(), ckA.data(), T, H, dk, 0);
    rc |= k3c_cuda_kda_recurrent_segs(sgA.data(), c.nseg, cqA.data(), ckA.data(), cvA.data(), gA.data(), bA.data(), H,
                                      dk, dv, c.round, oA.data(), 0);
    rc |= k3c_cuda_kda_gated_norm(oA.data(), z.data(), nw.data(), T, H, dv, eps, c.silu, c.round, yA.data(), 0);
    /* fused, with o and (where it fits) without */
    V cqB((size_t)T * Ck, nan), ckB = cqB, gB = cqB, cvB((size_t)T * Cv, nan), oB = cvB, yB = cvB, bB((size_t)T * H, nan);
    V cqC = cqB, ckC = cqB, gC = cqB, cvC = cvB, yC = cvB, bC = bB;
    auto sgB = make_segs(stB, winB), sgC = make_segs(stC, winC);
    long b0 = emu_blocks_run;
    rc |= k3c_cuda_kda_decode_fused(sgB.data(), c.nseg, T, H, dk, dv, W, xq.data(), xk.data(), xv.data(), tq.data(),
                                    tk.data(), tv.data(), f.data(), b.data(), alog.data(), dtb.data(), c.has_lb, lb,
                                    z.data(), nw.data(), eps, c.silu, c.round, cqB.data(), ckB.data(), cvB.data(),
                                    gB.data(), bB.data(), oB.data(), yB.data(), 0);
    long fused_blocks = emu_blocks_run - b0;
    bool fits = k3c_cuda_kda_decode_fused_fits(dk, dv);
    if (fits)
        rc |= k3c_cuda_kda_decode_fused(sgC.data(), c.nseg, T, H, dk, dv, W, xq.data(), xk.data(), xv.data(),
                                        tq.data(), tk.data(), tv.data(), f.data(), b.data(), alog.data(), dtb.data(),
                                        c.has_lb, lb, z.data(), nw.data(), eps, c.silu, c.round, cqC.data(),
                                        ckC.data(), cvC.data(), gC.data(), bC.data(), NULL, yC.data(), 0);
    int d[10] = {bitdiff(cqA, cqB), bitdiff(ckA, ckB), bitdiff(cvA, cvB), bitdiff(gA, gB), bitdiff(bA, bB),
                 bitdiff(oA, oB), bitdiff(yA, yB), 0, 0, 0};
    for (int s = 0; s < c.nseg; s++) d[7] += bitdiff(stA[s], stB[s]), d[8] += bitdiff(winA[s], winB[s]);
    if (fits) {
        d[9] = bitdiff(cqB, cqC) + bitdiff(ckB, ckC) + bitdiff(cvB, cvC) + bitdiff(gB, gC) + bitdiff(bB, bC) +
               bitdiff(yB, yC);
        for (int s = 0; s < c.nseg; s++) d[9] += bitdiff(stB[s], stC[s]) + bitdiff(winB[s], winC[s]);
    }
    int nan_y = 0;
    for (float v : yB) nan_y += std::isnan(v);
    /* float64 reference (meaningful with round 0) */
    std::vector<std::vector<double>> Sd(c.nseg), Wd(c.nseg);
    for (int s = 0; s < c.nseg; s++) Sd[s].assign(st0[s].begin(), st0[s].end()), Wd[s].assign(win0[s].begin(), win0[s].end());
    std::vector<double> yd;
    reference(c, xq, xk, xv, tq, tk, tv, f, b, alog, dtb, z, nw, eps, Sd, Wd, yd);
    double ey = rel_l2(yB, yd), es = 0;
    for (int s = 0; s < c.nseg; s++) es = fmax(es, rel_l2(stB[s], Sd[s]));
    int dsum = 0;
    for (int i = 0; i < 10; i++) dsum += d[i] != 0;
    double tol = c.round ? 2e-2 : 2e-5;
    bool ok = rc == 0 && dsum == 0 && nan_y == 0 && ey < tol && es < tol;
    failures += !ok;
    printf("%s H %2d dk %3d dv %3d W %d nseg %d q %d lb %d round %d silu %d fits %d (fused blocks %ld): bit diffs "
           "cq %d ck %d cv %d g %d beta %d o %d y %d state %d window %d o=NULL-run %d; nan %d; vs f64: y %.2e "
           "state %.2e\n",
           ok ? "ok  " : "FAIL", H, dk, dv, W, c.nseg, c.q, c.has_lb, c.round, c.silu, fits, fused_blocks, d[0], d[1],
           d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], nan_y, ey, es);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int big = argc > 1 && atoi(argv[1]);
    std::vector<Case> cs = {
        {4, 32, 32, 4, 3, 1, 1, 1, 0}, {4, 32, 32, 4, 3, 3, 0, 1, 1}, {4, 32, 32, 4, 3, 3, 1, 0, 0},
        {4, 32, 32, 4, 2, 1, 0, 0, 1}, {3, 64, 64, 3, 2, 3, 0, 0, 0}, {3, 64, 96, 3, 2, 3, 1, 1, 0},
        {2, 32, 64, 4, 2, 3, 1, 0, 1}, {2, 32, 48, 4, 2, 3, 0, 1, 0}, {4, 32, 32, 4, 2, 9, 0, 0, 0},
        {4, 32, 32, 2, 2, 11, 1, 1, 1}, {2, 128, 128, 4, 2, 3, 0, 0, 0}, {2, 128, 128, 4, 2, 1, 1, 1, 0},
        {2, 256, 128, 4, 2, 3, 0, 1, 0}, /* (dk/32) dv = 1024 > 512: the launcher's separate-launch path */
    };
    if (big) cs = {{96, 128, 128, 4, 3, 1, 1, 1, 0}, {96, 128, 128, 4, 3, 3, 1, 1, 0},
                   {96, 128, 128, 4, 2, 3, 0, 1, 1}, {96, 128, 128, 4, 2, 1, 0, 0, 1}};
    for (auto &c : cs) run_case(c);
    printf("%d failures\n", failures);
    return failures != 0;
}
