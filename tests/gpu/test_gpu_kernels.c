/* GPU kernels against their CPU counterparts (cpu/ops.h), on fresh random inputs (seeded from test_seed()),
 * outputs poisoned (NaN) before each launch, awkward sizes. Metric: relative L2 error ||gpu - cpu|| / ||cpu||
 * (NaN anywhere fails); each test states its threshold. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/attnres.h"
#include "cuda/elementwise.h"
#include "cuda/gemm.h"
#include "cuda/kda.h"
#include "cuda/mla.h"
#include "cuda/moe.h"
#include "cuda/moe_pair.h"
#include "cuda/router.h"
#include "cuda/sample.h"
#include "k3c.h"
#include "format/mxfp4.h"
#include "gpu_util.h"
#include "ref_attnres64.h"
#include "../test.h"
#include "util/error.h"

#define CUDA_OK(call) CHECKF((call) == cudaSuccess, "%s failed", #call)

static k3c_rng rng_for(const char *name) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(name));
    return r;
}

/* Worst error per kernel and threshold, printed as "METRIC <kernel> rel_l2 <threshold> <worst>" lines at exit
 * (tools/gpu-check.sh turns them into its summary table). */
static struct { const char *kernel; double thr, worst; } notes[64];
static int num_notes;

static void note(const char *kernel, double thr, double e) {
    int i = 0;
    while (i < num_notes && !(strcmp(notes[i].kernel, kernel) == 0 && notes[i].thr == thr)) i++;
    if (i == num_notes) {
        if (num_notes == 64) return;
        notes[num_notes++] = (typeof(notes[0])){kernel, thr, 0.0};
    }
    if (!(e <= notes[i].worst)) notes[i].worst = e; /* NaN sticks */
}

__attribute__((destructor)) static void print_notes(void) {
    for (int i = 0; i < num_notes; i++)
        printf("METRIC %-28s rel_l2 %8.1e %10.3e\n", notes[i].kernel, notes[i].thr, notes[i].worst);
}

static void round_host(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

/* ---- gemv / gemm ---- */

/* Relative L2 error of a product y [T, rows] = x [T, cols] W^T against ref, each output's squared scale the
 * larger of ref's square and the sum of its terms' squares (the size a sum of random-signed terms has). With
 * the plain ||ref|| a single output whose terms cancel to near zero fails any summation order but the
 * reference's: rows 1, cols 264, T 1 read 1.89e-5 under seed 8016205010052, two fp32 orders of one dot. */
static double rel_l2_product(const float *y, const float *ref, const uint16_t *W, const float *x, int rows, int cols,
                             int T) {
    double num = 0, den = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < rows; j++) {
            double sq = 0, r = ref[(size_t)t * rows + j], d = (double)y[(size_t)t * rows + j] - r;
            for (int i = 0; i < cols; i++) {
                double p = (double)bf16_to_f32(W[(size_t)j * cols + i]) * x[(size_t)t * cols + i];
                sq += p * p;
            }
            num += d * d;
            den += r * r > sq ? r * r : sq;
        }
    if (!(num == num) || !(den > 0)) return INFINITY; /* NaN, or no scale to measure against */
    return sqrt(num / den);
}

/* Streaming kernel (f32 activations, so only the summation order differs), any T (tiles of
 * K3C_CUDA_GEMV_MAX_T): rel L2 < 1e-5 (rel_l2_product). k3c_cuda_matmul_bf16 with cuBLASLt (T > K3C_CUDA_GEMV_MAX_T,
 * activations rounded to bf16 first): against the CPU on the rounded activations, rel L2 < 1e-4. */
TEST(gpu_matmul_bf16) {
    k3c_rng r = rng_for("matmul");
    static const int rows_l[] = {1, 3, 17, 64, 1000}, cols_l[] = {8, 20, 264, 1032};
    static const int T_l[] = {1, 2, 3, 4, 5, 6, 7, 8, 13, 40};
    void *ws = NULL;
    CUDA_OK(cudaMalloc(&ws, 8 << 20));
    uint16_t *xbf = NULL;
    CUDA_OK(cudaMalloc((void **)&xbf, 40 * 1032 * 2));
    k3c_cuda_gemm g;
    CHECK_OK(k3c_cuda_gemm_init(&g, ws, 8 << 20, xbf, 40 * 1032));
    for (size_t a = 0; a < sizeof rows_l / sizeof *rows_l; a++)
        for (size_t b = 0; b < sizeof cols_l / sizeof *cols_l; b++)
            for (size_t c = 0; c < sizeof T_l / sizeof *T_l; c++) {
                int rows = rows_l[a], cols = cols_l[b], T = T_l[c];
                uint16_t *W = malloc((size_t)rows * cols * 2);
                float *x = fmalloc((size_t)T * cols), *y = fmalloc((size_t)T * rows), *ref = fmalloc((size_t)T * rows);
                fill_bf16(&r, W, (size_t)rows * cols, 1.0f);
                fill_normal(&r, x, (size_t)T * cols, 1.0f);
                int lt = T > K3C_CUDA_GEMV_MAX_T;
                float *xr = fmalloc((size_t)T * cols);
                memcpy(xr, x, (size_t)T * cols * 4);
                if (lt) round_host(xr, (size_t)T * cols);
                k3c_mat m = {W, rows, cols};
                poison_f32(ref, (size_t)T * rows);
                k3c_matmul_bf16(NULL, &m, xr, T, ref);
                void *dW = dev_upload(W, (size_t)rows * cols * 2), *dx = dev_upload(x, (size_t)T * cols * 4);
                float *dy = dev_poisoned((size_t)T * rows * 4);
                CHECK(dW && dx && dy);
                CHECK_OK(k3c_cuda_matmul_bf16(&g, dW, rows, cols, dx, T, dy, 0));
                CHECK(dev_download(y, dy, (size_t)T * rows * 4) == 0);
                double e = rel_l2_product(y, ref, W, xr, rows, cols, T);
                note(lt ? "gemm_bf16_cublaslt" : "gemv_bf16_stream", lt ? 1e-4 : 1e-5, e);
                CHECKF(e < (lt ? 1e-4 : 1e-5), "rows %d cols %d T %d: rel L2 %.3g", rows, cols, T, e);
                { /* the rounded product: exactly the bf16 values of the unrounded one (fused into the stores) */
                    float *yr = fmalloc((size_t)T * rows);
                    CHECK(cudaMemset(dy, 0xff, (size_t)T * rows * 4) == cudaSuccess);
                    CHECK_OK(k3c_cuda_matmul_bf16_round(&g, dW, rows, cols, dx, T, dy, 1, 0));
                    CHECK(dev_download(yr, dy, (size_t)T * rows * 4) == 0);
                    round_host(y, (size_t)T * rows);
                    size_t bad = 0;
                    for (size_t i = 0; i < (size_t)T * rows; i++) bad += memcmp(&yr[i], &y[i], 4) != 0;
                    CHECKF(bad == 0, "rows %d cols %d T %d: %zu rounded outputs differ from round(product)", rows,
                           cols, T, bad);
                    free(yr);
                }
                if (lt) { /* the streaming kernel on the same shape, f32 activations */
                    k3c_matmul_bf16(NULL, &m, x, T, ref);
                    CHECK(cudaMemset(dy, 0xff, (size_t)T * rows * 4) == cudaSuccess);
                    CHECK_OK(k3c_cuda_gemv_bf16(dW, rows, cols, dx, T, dy, 0));
                    CHECK(dev_download(y, dy, (size_t)T * rows * 4) == 0);
                    e = rel_l2_product(y, ref, W, x, rows, cols, T);
                    note("gemv_bf16_stream", 1e-5, e);
                    CHECKF(e < 1e-5, "stream rows %d cols %d T %d: rel L2 %.3g", rows, cols, T, e);
                }
                cudaFree(dW); cudaFree(dx); cudaFree(dy);
                free(W); free(x); free(xr); free(y); free(ref);
            }
    k3c_cuda_gemm_free(&g);
    cudaFree(ws);
    cudaFree(xbf);
}

/* x rounded to bf16 values but for about one element in 4096 (kept f32). */
static void mostly_bf16(k3c_rng *r, float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (k3c_rng_next(r) % 4096 != 0) x[i] = bf16_round(x[i]);
}

/* Grouped products (k3c_cuda_gemv_group): each product's outputs bitwise equal to the same product run alone
 * through k3c_cuda_matmul_bf16_round (the executor relies on it for bitwise parity with the stock path), and
 * the unrounded ones against the CPU (rel L2 < 1e-5). Random groups of 1..8 products mixing short matrices
 * (T = 1 kernel, token by token) and long ones (tensor-core kernel at T > 1), shared and separate inputs,
 * an unaligned width (scalar kernel), T = 1..8 and 11 (past the streaming cap: each product alone). A third
 * of the inputs are bf16 values but for about one element in 4096, so that the tensor-core kernel meets runs
 * of steps whose activations are all bf16-exact (one mma term), runs with a few steps that are not (three
 * terms) and the mix inside a run (its exactness vote: cuda/gemm.cu). */
TEST(gpu_gemv_group) {
    k3c_rng r = rng_for("gemv_group");
    static const int rows_l[] = {1, 3, 17, 64, 255, 256, 300, 1000}, cols_l[] = {8, 264, 1032, 2056};
    static const int T_l[] = {1, 2, 3, 5, 8, 11};
    CHECK(k3c_cuda_gemv_group(NULL, NULL, 0, 1, 0) == K3C_ERR);
    for (size_t c = 0; c < sizeof T_l / sizeof *T_l; c++)
        for (int trial = 0; trial < 3; trial++) {
            int T = T_l[c], n = 1 + (int)(k3c_rng_next(&r) % K3C_CUDA_GEMV_GROUP_MAX);
            int shared_cols = cols_l[k3c_rng_next(&r) % 4];
            k3c_cuda_gemv_seg seg[K3C_CUDA_GEMV_GROUP_MAX];
            uint16_t *W[K3C_CUDA_GEMV_GROUP_MAX];
            float *x[K3C_CUDA_GEMV_GROUP_MAX], *dy_alone[K3C_CUDA_GEMV_GROUP_MAX];
            float *dxs = NULL; /* the input shared by the products that use it */
            float *xs = fmalloc((size_t)T * shared_cols);
            fill_normal(&r, xs, (size_t)T * shared_cols, 1.0f);
            if (k3c_rng_next(&r) % 3 == 0) mostly_bf16(&r, xs, (size_t)T * shared_cols);
            dxs = dev_upload(xs, (size_t)T * shared_cols * 4);
            CHECK(dxs != NULL);
            for (int i = 0; i < n; i++) {
                int rows = rows_l[k3c_rng_next(&r) % 8], own = k3c_rng_next(&r) % 2;
                int cols = own ? cols_l[k3c_rng_next(&r) % 4] : shared_cols;
                if (trial == 2 && i == 0) { cols = 100; own = 1; } /* 100 % 8 != 0: the scalar kernel */
                W[i] = malloc((size_t)rows * cols * 2);
                fill_bf16(&r, W[i], (size_t)rows * cols, 1.0f);
                if (own) {
                    x[i] = fmalloc((size_t)T * cols);
                    fill_normal(&r, x[i], (size_t)T * cols, 1.0f);
                    if (k3c_rng_next(&r) % 3 == 0) mostly_bf16(&r, x[i], (size_t)T * cols);
                } else {
                    x[i] = xs;
                }
                seg[i] = (k3c_cuda_gemv_seg){dev_upload(W[i], (size_t)rows * cols * 2), rows, cols,
                                             own ? dev_upload(x[i], (size_t)T * cols * 4) : dxs,
                                             dev_poisoned((size_t)T * rows * 4), (int)(k3c_rng_next(&r) % 2)};
                dy_alone[i] = dev_poisoned((size_t)T * rows * 4);
                CHECK(seg[i].W && seg[i].x && seg[i].y && dy_alone[i]);
            }
            CHECK_OK(k3c_cuda_gemv_group(NULL, seg, n, T, 0));
            for (int i = 0; i < n; i++)
                CHECK_OK(k3c_cuda_matmul_bf16_round(NULL, seg[i].W, seg[i].rows, seg[i].cols, seg[i].x, T,
                                                    dy_alone[i], seg[i].round, 0));
            CUDA_OK(cudaDeviceSynchronize());
            for (int i = 0; i < n; i++) {
                size_t ny = (size_t)T * seg[i].rows;
                float *y = fmalloc(ny), *ya = fmalloc(ny), *ref = fmalloc(ny);
                CHECK(dev_download(y, seg[i].y, ny * 4) == 0 && dev_download(ya, dy_alone[i], ny * 4) == 0);
                size_t bad = 0, nan = 0;
                for (size_t j = 0; j < ny; j++) {
                    bad += memcmp(&y[j], &ya[j], 4) != 0;
                    nan += isnan(y[j]);
                }
                CHECKF(bad == 0 && nan == 0, "T %d product %d of %d (rows %d cols %d round %d): %zu outputs differ "
                       "from the product alone, %zu NaN", T, i, n, seg[i].rows, seg[i].cols, seg[i].round, bad, nan);
                if (!seg[i].round) {
                    k3c_mat m = {W[i], seg[i].rows, seg[i].cols};
                    poison_f32(ref, ny);
                    k3c_matmul_bf16(NULL, &m, x[i], T, ref);
                    double e = rel_l2_f32f32(y, ref, ny);
                    note("gemv_group", 1e-5, e);
                    CHECKF(e < 1e-5, "T %d product %d: rel L2 %.3g vs the CPU", T, i, e);
                }
                free(y); free(ya); free(ref);
            }
            for (int i = 0; i < n; i++) {
                cudaFree((void *)seg[i].W);
                cudaFree(seg[i].y);
                cudaFree(dy_alone[i]);
                if (seg[i].x != dxs) { cudaFree((void *)seg[i].x); free(x[i]); }
                free(W[i]);
            }
            cudaFree(dxs);
            free(xs);
        }
}

/* ---- MoE experts ---- */

static void config_act(k3c_config *c, int situ) {
    memset(c, 0, sizeof *c);
    c->hidden_act = situ ? K3C_ACT_SITU : K3C_ACT_SILU;
    c->situ_beta = 4.0f;
    c->situ_linear_beta = 25.0f;
}

typedef struct host_expert {
    k3c_mxfp4_mat q[3]; /* gate, up, down */
    k3c_mat b[3];
} host_expert;

static int make_mx(k3c_rng *r, int rows, int cols, k3c_mxfp4_mat *m) {
    uint8_t *p = malloc((size_t)rows * cols / 2), *s = malloc((size_t)rows * cols / 32);
    float *row = fmalloc(cols);
    if (!p || !s || !row) return -1;
    for (int i = 0; i < rows; i++) {
        fill_normal(r, row, cols, 1.0f);
        /* vary the group magnitudes so the scales differ */
        for (int c = 0; c < cols; c++) row[c] *= ldexpf(1.0f, (c / 32 + i) % 7 - 3);
        k3c_mxfp4_quant_row(row, cols, p + (size_t)i * cols / 2, s + (size_t)i * cols / 32);
    }
    free(row);
    m->packed = p;
    m->scale = s;
    m->rows = rows;
    m->cols = cols;
    return 0;
}

/* The MXFP4 device layout (cuda/moe.h k3c_cuda_mxfp4_repack) against its description in moe.cu, written here
 * from the description: in each 32-bit word, element i (code bits 4i .. 4i + 3, bit 3 the sign) of pair
 * i mod 4 goes to the low half (i < 4) or the high half (i >= 4) of that pair's bf16 bits, sign to bit 15 and
 * e1, e0, m to bits 8, 7, 6 of the half; pairs 0, 1, 2 are stored rotated left by 0, 3, 6, pair 3 at the
 * sources that a multiply by 4 + 128 + 4096 (shifts 2, 7, 12) moves onto those bits. Random words, a
 * poisoned output first. Then the extraction itself: mx_word's integer ops on the repacked word, emulated
 * here, give each element's bf16 bits e2m1 * 2^-126. */
static uint32_t repack_ref(uint32_t v) {
    static const int half_bit[4] = {6, 7, 8, 15}; /* m, e0, e1, sign */
    uint32_t r = 0;
    for (int i = 0; i < 8; i++)
        for (int b = 0; b < 4; b++) {
            int pair = i & 3, dst = half_bit[b] + (i >= 4 ? 16 : 0), src_pos;
            if (pair < 3) src_pos = (dst + 3 * pair) & 31;
            else { /* the source s with s + shift == dst for the one shift of {2, 7, 12} landing there */
                static const int shift_of[4] = {2, 7, 7, 12}; /* for m, e0, e1, sign */
                src_pos = dst - shift_of[b];
            }
            if (v >> (4 * i + b) & 1u) r |= 1u << src_pos;
        }
    return r;
}

static uint32_t rotr32(uint32_t v, int n) { return n ? v >> n | v << (32 - n) : v; }

TEST(gpu_mxfp4_repack) {
    k3c_rng r = rng_for("mxfp4_repack");
    size_t n = 4099; /* words, not a multiple of the block size */
    uint32_t *w = malloc(n * 4), *got = malloc(n * 4);
    for (size_t i = 0; i < n; i++) w[i] = (uint32_t)k3c_rng_next(&r);
    w[0] = 0, w[1] = 0xffffffffu, w[2] = 0x88888888u; /* all zero, all set, signs only */
    uint32_t *d = dev_upload(w, n * 4);
    CHECK(d);
    CHECK_OK(k3c_cuda_mxfp4_repack((uint8_t *)d, n * 4, 0));
    memset(got, 0x5a, n * 4);
    CHECK(dev_download(got, d, n * 4) == 0);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad += got[i] != repack_ref(w[i]);
        /* each element's bf16 bits from the repacked word, as moe.cu mx_word extracts them */
        uint32_t v = got[i], pr[4] = {v & 0x81c081c0u, rotr32(v, 3) & 0x81c081c0u, rotr32(v, 6) & 0x81c081c0u,
                                       ((v & 0x001b001bu) * 4228u) & 0x81c081c0u};
        for (int e = 0; e < 8; e++) {
            uint32_t code = w[i] >> (4 * e) & 15u, half = e < 4 ? pr[e] & 0xffffu : pr[e - 4] >> 16;
            uint32_t want = (code & 8u) << 12 | (code & 7u) << 6;
            bad += half != want;
        }
    }
    note("mxfp4_repack(exact)", 0.0, (double)bad); /* the count of words or elements that differ */
    CHECKF(bad == 0, "%zu words or elements differ", bad);
    CHECKF(k3c_cuda_mxfp4_repack((uint8_t *)d, 6, 0) != K3C_OK, "a length of 6 bytes was accepted");
    cudaFree(d);
    free(w), free(got);
}

/* A random bf16 matrix [rows, cols] (fill_bf16, scale 0.1) on the device; its host copy goes to *host, or is
 * freed when host is NULL. */
static const uint16_t *dev_rand_bf16(k3c_rng *r, int rows, int cols, uint16_t **host) {
    size_t n = (size_t)rows * cols;
    uint16_t *w = malloc(n * 2);
    fill_bf16(r, w, n, 0.1f);
    const uint16_t *d = dev_upload(w, n * 2);
    if (host) *host = w;
    else free(w);
    return d;
}

/* Matrix m (0 gate, 1 up, 2 down) of a bf16 expert. */
static void expert_set_bf16(k3c_cuda_expert *e, int m, const uint16_t *d) {
    if (m == 0) e->gate_w = d;
    if (m == 1) e->up_w = d;
    if (m == 2) e->down_w = d;
}

/* The routing of a moe test and its weights: ROUTE_ANY draws each pair's expert (repeats within a token
 * allowed, pair 1 may be invalid), ROUTE_TOPK k distinct experts a token (a router's top-k; pair 1 may be invalid), ROUTE_HOT the
 * same with expert 0 among every token's k (in slot t % k): one expert with a pair of every token, several
 * band tiles of it past 32 tokens. */
enum { ROUTE_ANY, ROUTE_TOPK, ROUTE_HOT };
static void moe_route(k3c_rng *r, int route, int E, int T, int k, int *idx, float *wt) {
    for (int i = 0; i < T * k; i++) {
        idx[i] = (int)(k3c_rng_next(r) % (uint64_t)(E + 1)) - (i == 1 ? 1 : 0); /* pair 1 may be invalid (-1) */
        if (idx[i] >= E) idx[i] = E - 1;
        wt[i] = (float)k3c_rng_uniform(r);
    }
    if (route == ROUTE_ANY) return;
    const int lo = route == ROUTE_HOT; /* the other slots from lo .. E - 1 */
    int *pool = malloc(sizeof(int) * E);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) pool[e] = e;
        for (int j = 0; j < k - lo; j++) { /* a partial shuffle: k - lo distinct of lo .. E - 1 (k <= E) */
            int s = lo + j + (int)(k3c_rng_next(r) % (uint64_t)(E - lo - j)), tmp = pool[lo + j];
            pool[lo + j] = pool[s], pool[s] = tmp;
        }
        for (int j = 0, o = lo; j < k; j++)
            if (t * k + j != 1) idx[t * k + j] = lo && j == t % k ? 0 : pool[o++];
    }
    free(pool);
}

/* Routed experts (gate/up fused with the activation, then down, weighted sum) against the CPU matmuls and
 * activation, per (token, slot) pair. Unrounded: rel L2 < 1e-5; with the stock roundings on both sides
 * (a bf16 tie can flip an ulp): rel L2 < 1e-2. */
static void moe_case_routed(int mxfp4, int situ, int In, int F, int Out, int E, int T, int k, int round, int route) {
    k3c_rng r = rng_for("moe");
    k3c_config cfg;
    config_act(&cfg, situ);
    host_expert *he = calloc(E, sizeof *he);
    k3c_cuda_expert *de = calloc(E, sizeof *de);
    int dims[3][2] = {{F, In}, {F, In}, {Out, F}};
    for (int e = 0; e < E; e++)
        for (int m = 0; m < 3; m++) {
            if (mxfp4) {
                CHECK(make_mx(&r, dims[m][0], dims[m][1], &he[e].q[m]) == 0);
                uint8_t *p = dev_upload(he[e].q[m].packed, (size_t)dims[m][0] * dims[m][1] / 2);
                const uint8_t *s = dev_upload(he[e].q[m].scale, (size_t)dims[m][0] * dims[m][1] / 32);
                CHECK(p && s);
                CHECK_OK(k3c_cuda_mxfp4_repack(p, (size_t)dims[m][0] * dims[m][1] / 2, 0)); /* the device layout */
                if (m == 0) { de[e].gate_packed = p; de[e].gate_scale = s; }
                if (m == 1) { de[e].up_packed = p; de[e].up_scale = s; }
                if (m == 2) { de[e].down_packed = p; de[e].down_scale = s; }
            } else {
                uint16_t *w = NULL;
                const uint16_t *d = dev_rand_bf16(&r, dims[m][0], dims[m][1], &w);
                he[e].b[m] = (k3c_mat){w, dims[m][0], dims[m][1]};
                CHECK(d);
                expert_set_bf16(&de[e], m, d);
            }
        }
    float *x = fmalloc((size_t)T * In), *wt = fmalloc((size_t)T * k);
    int *idx = malloc(sizeof(int) * T * k);
    fill_normal(&r, x, (size_t)T * In, mxfp4 ? 0.05f : 1.0f);
    if (round) round_host(x, (size_t)T * In);
    moe_route(&r, route, E, T, k, idx, wt);
    /* CPU reference */
    float *ga = fmalloc(F), *ua = fmalloc(F), *d = fmalloc(Out), *ref = fmalloc((size_t)T * Out);
    for (int t = 0; t < T; t++) {
        float *o = ref + (size_t)t * Out;
        for (int i = 0; i < Out; i++) o[i] = 0.0f;
        for (int j = 0; j < k; j++) {
            int e = idx[t * k + j];
            if (e < 0) continue;
            const float *xt = x + (size_t)t * In;
            if (mxfp4) {
                k3c_matmul_mxfp4(NULL, &he[e].q[0], xt, 1, ga);
                k3c_matmul_mxfp4(NULL, &he[e].q[1], xt, 1, ua);
            } else {
                k3c_matmul_bf16(NULL, &he[e].b[0], xt, 1, ga);
                k3c_matmul_bf16(NULL, &he[e].b[1], xt, 1, ua);
            }
            if (round) { round_host(ga, F); round_host(ua, F); }
            k3c_gated_act(&cfg, ga, ua, F, ga);
            if (round) round_host(ga, F);
            if (mxfp4) k3c_matmul_mxfp4(NULL, &he[e].q[2], ga, 1, d);
            else k3c_matmul_bf16(NULL, &he[e].b[2], ga, 1, d);
            if (round) round_host(d, Out);
            for (int i = 0; i < Out; i++) o[i] += wt[t * k + j] * d[i];
        }
        if (round) round_host(o, Out);
    }
    k3c_cuda_expert *dtab = dev_upload(de, sizeof *de * E);
    float *dx = dev_upload(x, (size_t)T * In * 4), *dwt = dev_upload(wt, (size_t)T * k * 4);
    int *didx = dev_upload(idx, sizeof(int) * T * k);
    float *dh = dev_poisoned((size_t)T * k * F * 4), *dpart = dev_poisoned((size_t)T * k * Out * 4);
    float *dout = dev_poisoned((size_t)T * Out * 4), *out = fmalloc((size_t)T * Out);
    CHECK(dtab && dx && dwt && didx && dh && dpart && dout);
    k3c_cuda_act act = {situ ? 2 : 1, 4.0f, 25.0f};
    CHECK_OK(k3c_cuda_moe_experts(dtab, E, mxfp4, In, F, Out, dx, T, didx, dwt, k, act, round, dh, dpart, dout, 0));
    CHECK(dev_download(out, dout, (size_t)T * Out * 4) == 0);
    double e = rel_l2_f32f32(out, ref, (size_t)T * Out);
    /* With a handful of outputs the rel L2 is one or two cancelling dot products, where the f32 CPU reference's
     * own rounding reaches ~1.6e-5 (seen: In 32, F 32, Out 1); over >= 16 outputs 1e-5. Kimi Linear's In 2304,
     * F 1024 (36 tokens x 8) once needed 2e-5: the grouped kernel chained its mma through one accumulator and
     * read 1.2e-5-1.4e-5 (H200, 2026-11-30); with fresh accumulators added in f32 it reads 5.6e-7 (bf16) and
     * 4.5e-7 (MXFP4) with the band kernels off, as the band kernels do (docs/kernels.md). */
    double thr = round ? 1e-2 : (T * Out < 16 ? 5e-5 : 1e-5);
    note(mxfp4 ? (round ? "moe_mxfp4_rounded" : "moe_mxfp4") : (round ? "moe_bf16_rounded" : "moe_bf16"), thr, e);
    CHECKF(e < thr, "mxfp4 %d situ %d In %d F %d Out %d E %d T %d k %d round %d route %d: rel L2 %.3g", mxfp4,
           situ, In, F, Out, E, T, k, round, route, e);
    if (round) {
        /* the tensor-parallel partial (moe.h K3C_CUDA_MOE_ROUND_HIDDEN) on the same experts and pairs, every
         * weight 1: h bitwise the stock mode's (the same kernels round it the same), and with one slot a token
         * the unrounded output rounded is the stock output (fmaf(1, d, 0) = d: only the stores differ) */
        size_t nh = (size_t)T * k * F, no = (size_t)T * Out;
        float *ones = fmalloc((size_t)T * k), *h1 = fmalloc(nh), *h2 = fmalloc(nh), *o1 = fmalloc(no), *o2 = fmalloc(no);
        for (int i = 0; i < T * k; i++) ones[i] = 1.0f;
        float *d1 = dev_upload(ones, (size_t)T * k * 4);
        CHECK(d1);
        for (int mode = 1; mode <= 2; mode++) {
            CHECK(cudaMemset(dh, 0xff, nh * 4) == cudaSuccess && cudaMemset(dout, 0xff, no * 4) == cudaSuccess);
            CHECK_OK(k3c_cuda_moe_experts(dtab, E, mxfp4, In, F, Out, dx, T, didx, d1, k, act,
                                          mode == 1 ? 1 : K3C_CUDA_MOE_ROUND_HIDDEN, dh, dpart, dout, 0));
            CHECK(dev_download(mode == 1 ? h1 : h2, dh, nh * 4) == 0 && dev_download(mode == 1 ? o1 : o2, dout, no * 4) == 0);
        }
        CHECKF(!memcmp(h1, h2, nh * 4), "mxfp4 %d In %d F %d Out %d T %d k %d: the partial mode's h differs", mxfp4,
               In, F, Out, T, k);
        long bad = 0;
        for (size_t i = 0; i < no; i++) {
            float u = o2[i];
            round_host(&u, 1);
            bad += k == 1 ? !(u == o1[i]) : !(o2[i] == o2[i]);
        }
        double e2 = rel_l2_f32f32(o2, o1, no);
        CHECKF(bad == 0 && e2 < 1e-2, "mxfp4 %d In %d F %d Out %d T %d k %d: partial mode: %ld outputs differ (rel L2 "
               "%.3g to the stock mode)", mxfp4, In, F, Out, T, k, bad, e2);
        cudaFree(d1);
        free(ones), free(h1), free(h2), free(o1), free(o2);
    }
    for (int i = 0; i < E; i++) {
        cudaFree((void *)de[i].gate_packed); cudaFree((void *)de[i].gate_scale);
        cudaFree((void *)de[i].up_packed); cudaFree((void *)de[i].up_scale);
        cudaFree((void *)de[i].down_packed); cudaFree((void *)de[i].down_scale);
        cudaFree((void *)de[i].gate_w); cudaFree((void *)de[i].up_w); cudaFree((void *)de[i].down_w);
        for (int m = 0; m < 3; m++) {
            free((void *)he[i].q[m].packed); free((void *)he[i].q[m].scale); free((void *)he[i].b[m].w);
        }
    }
    cudaFree(dtab); cudaFree(dx); cudaFree(dwt); cudaFree(didx); cudaFree(dh); cudaFree(dpart); cudaFree(dout);
    free(he); free(de); free(x); free(wt); free(idx); free(ga); free(ua); free(d); free(ref); free(out);
}
static void moe_case(int mxfp4, int situ, int In, int F, int Out, int E, int T, int k, int round) {
    moe_case_routed(mxfp4, situ, In, F, Out, E, T, k, round, ROUTE_ANY);
}

TEST(gpu_moe_mxfp4) {
    moe_case(1, 1, 96, 64, 17, 5, 3, 3, 0);
    moe_case(1, 0, 32, 32, 1, 2, 1, 2, 0);
    moe_case(1, 1, 1056, 96, 64, 4, 2, 2, 0);
    moe_case(1, 1, 3584, 3072, 3584, 4, 2, 2, 0); /* K3's expert shape */
    moe_case(1, 1, 96, 64, 17, 5, 3, 3, 1);
    moe_case(1, 1, 160, 64, 40, 2, 9, 2, 0); /* 9 pairs per expert: two 8-column passes of the grouped kernel */
    moe_case(1, 0, 160, 64, 40, 3, 11, 3, 1);
    /* the per-pair path (cuda/moe.cu: <= 16 pairs by default, 64 with K3C_MOE_PAIR_MX=1; Out >= F): f32
     * activations (three terms), rounded (one), a width of 3 scale groups (a partial step); 64 pairs (the
     * band path by default) */
    moe_case(1, 1, 1056, 96, 128, 6, 5, 3, 0);
    moe_case(1, 0, 1056, 96, 128, 6, 5, 3, 1);
    moe_case(1, 0, 96, 64, 64, 9, 8, 8, 0);
    /* the band path (more pairs than the per-pair path takes, Out >= F; the grouped kernel with
     * K3C_MOE_BAND_MX=0): one tile per expert, experts of several tiles (40 pairs over 3 experts, rounded),
     * K3's expert shape at 4 tokens x 8 slots */
    moe_case(1, 1, 256, 128, 256, 12, 8, 4, 0);
    moe_case(1, 0, 96, 64, 100, 3, 20, 2, 1);
    moe_case(1, 1, 3584, 3072, 3584, 16, 4, 8, 0);
    /* more than 8 pairs an expert: tiles of 16 (k3c_cuda_moe_band_cols; gpu-check also forces 8 and 16 on
     * every band case with K3C_MOE_BAND_COLS): f32 activations (three terms) at 12 pairs an expert, K3's
     * shape at 9 x 8 over 8 experts (tiles of 9..16 pairs, and experts of two tiles) */
    moe_case(1, 1, 256, 128, 256, 2, 12, 2, 0);
    moe_case(1, 1, 3584, 3072, 3584, 8, 9, 8, 0);
    /* one slot a token, rounded: the partial mode against the stock one bitwise (moe_case), on the grouped
     * kernel (Out < F), the per-pair path (5 pairs) and the band kernels (40 pairs) */
    moe_case(1, 1, 96, 64, 17, 5, 7, 1, 1);
    moe_case(1, 1, 256, 64, 128, 6, 5, 1, 1);
    moe_case(1, 0, 256, 64, 128, 6, 40, 1, 1);
    /* 9-64 pairs an expert: tiles of 32 (16 where the plane does not fit): 20 and 33 an expert (tiles of 1-32
     * pairs, experts of two tiles), f32 and rounded; one expert chosen by every token (64 pairs: two tiles);
     * k3-slice's routing at 64 tokens (16 distinct of 64 experts a token, ~16 pairs an expert); K3's shape at
     * 12 and (one expert hot) 20 pairs an expert */
    moe_case_routed(1, 1, 256, 128, 256, 4, 40, 2, 0, ROUTE_ANY);
    moe_case_routed(1, 0, 96, 64, 100, 3, 33, 3, 1, ROUTE_ANY);
    moe_case_routed(1, 1, 160, 96, 96, 6, 64, 3, 0, ROUTE_HOT);
    moe_case_routed(1, 1, 64, 32, 128, 64, 64, 16, 1, ROUTE_TOPK); /* Out 128: room for the tile table */
    moe_case_routed(1, 1, 3584, 3072, 3584, 4, 24, 2, 0, ROUTE_TOPK);
    moe_case_routed(1, 0, 3584, 3072, 3584, 4, 40, 2, 1, ROUTE_HOT);
}

/* The band kernels' tile widths (k3c_cuda_moe_band_cols_force: 8, 16, 32) give a pair the same bits: an
 * mma's output column depends on its B column alone, and each pair's k steps are summed in the same order at
 * every width (cuda/moe_pair.cu). h, part and out poisoned before each run; NaN never matches. */
static void band_widths_case(int situ, int In, int F, int E, int T, int k, int round, int route) {
    k3c_rng r = rng_for("moe_band_widths");
    k3c_cuda_expert *de = calloc(E, sizeof *de);
    int dims[3][2] = {{F, In}, {F, In}, {In, F}};
    for (int e = 0; e < E; e++)
        for (int m = 0; m < 3; m++) {
            k3c_mxfp4_mat q;
            CHECK(make_mx(&r, dims[m][0], dims[m][1], &q) == 0);
            uint8_t *p = dev_upload(q.packed, (size_t)dims[m][0] * dims[m][1] / 2);
            const uint8_t *sc = dev_upload(q.scale, (size_t)dims[m][0] * dims[m][1] / 32);
            CHECK(p && sc);
            CHECK_OK(k3c_cuda_mxfp4_repack(p, (size_t)dims[m][0] * dims[m][1] / 2, 0));
            if (m == 0) de[e].gate_packed = p, de[e].gate_scale = sc;
            if (m == 1) de[e].up_packed = p, de[e].up_scale = sc;
            if (m == 2) de[e].down_packed = p, de[e].down_scale = sc;
            free((void *)q.packed);
            free((void *)q.scale);
        }
    int P = T * k;
    float *x = fmalloc((size_t)T * In), *wt = fmalloc(P);
    int *idx = malloc(sizeof(int) * P);
    fill_normal(&r, x, (size_t)T * In, 0.05f);
    if (round) round_host(x, (size_t)T * In);
    moe_route(&r, route, E, T, k, idx, wt);
    k3c_cuda_expert *dtab = dev_upload(de, sizeof *de * E);
    float *dx = dev_upload(x, (size_t)T * In * 4), *dwt = dev_upload(wt, (size_t)P * 4);
    int *didx = dev_upload(idx, sizeof(int) * P);
    size_t nh = (size_t)P * F, np = (size_t)P * In, no = (size_t)T * In;
    float *dh = dev_poisoned(nh * 4), *dpart = dev_poisoned(np * 4), *dout = dev_poisoned(no * 4);
    CHECK(dtab && dx && dwt && didx && dh && dpart && dout);
    CHECK(k3c_cuda_moe_band_cols_force(24) != K3C_OK && k3c_cuda_moe_band_cols_force(-1) != K3C_OK);
    k3c_cuda_act act = {situ ? 2 : 1, 4.0f, 25.0f};
    static const int widths[4] = {0, 8, 16, 32}; /* 0: the default (32 here: more than 8 pairs an expert) */
    float *h[4], *part[4], *out[4];
    for (int v = 0; v < 4; v++) {
        h[v] = fmalloc(nh), part[v] = fmalloc(np), out[v] = fmalloc(no);
        CHECK(cudaMemset(dh, 0xff, nh * 4) == cudaSuccess && cudaMemset(dpart, 0xff, np * 4) == cudaSuccess &&
              cudaMemset(dout, 0xff, no * 4) == cudaSuccess);
        CHECK_OK(k3c_cuda_moe_band_cols_force(widths[v]));
        CHECK_OK(k3c_cuda_moe_experts(dtab, E, 1, In, F, In, dx, T, didx, dwt, k, act, round, dh, dpart, dout, 0));
        CHECK(dev_download(h[v], dh, nh * 4) == 0 && dev_download(part[v], dpart, np * 4) == 0 &&
              dev_download(out[v], dout, no * 4) == 0);
    }
    CHECK_OK(k3c_cuda_moe_band_cols_force(0));
    size_t differ = 0, nan = 0;
    for (int v = 1; v < 4; v++) {
        for (size_t i = 0; i < nh; i++) differ += memcmp(&h[v][i], &h[0][i], 4) != 0;
        for (size_t i = 0; i < np; i++) differ += memcmp(&part[v][i], &part[0][i], 4) != 0;
        for (size_t i = 0; i < no; i++) differ += memcmp(&out[v][i], &out[0][i], 4) != 0;
    }
    for (size_t i = 0; i < nh; i++) nan += isnan(h[0][i]);
    for (size_t i = 0; i < np; i++) nan += isnan(part[0][i]);
    for (size_t i = 0; i < no; i++) nan += isnan(out[0][i]);
    CHECKF(differ == 0 && nan == 0, "In %d F %d E %d T %d k %d round %d route %d: %zu values differ between widths, "
           "%zu NaN", In, F, E, T, k, round, route, differ, nan);
    for (int e = 0; e < E; e++) {
        cudaFree((void *)de[e].gate_packed); cudaFree((void *)de[e].gate_scale);
        cudaFree((void *)de[e].up_packed); cudaFree((void *)de[e].up_scale);
        cudaFree((void *)de[e].down_packed); cudaFree((void *)de[e].down_scale);
    }
    for (int v = 0; v < 4; v++) free(h[v]), free(part[v]), free(out[v]);
    cudaFree(dtab); cudaFree(dx); cudaFree(dwt); cudaFree(didx); cudaFree(dh); cudaFree(dpart); cudaFree(dout);
    free(de); free(x); free(wt); free(idx);
}

TEST(gpu_moe_mxfp4_band_widths) {
    band_widths_case(1, 256, 128, 4, 40, 2, 0, ROUTE_ANY);   /* f32 activations: three terms a tile */
    band_widths_case(0, 96, 64, 6, 64, 3, 1, ROUTE_HOT);     /* rounded; a hot expert of 64 pairs */
    band_widths_case(1, 128, 32, 64, 64, 16, 1, ROUTE_TOPK); /* k3-slice's routing at 64 tokens */
    band_widths_case(1, 3584, 256, 4, 40, 2, 1, ROUTE_HOT);  /* K3's width: the 32-column plane at 224 KB */
}

TEST(gpu_moe_bf16) {
    moe_case(0, 0, 64, 24, 17, 5, 3, 3, 0);
    moe_case(0, 1, 8, 8, 3, 2, 1, 1, 0);
    moe_case(0, 0, 2304, 1024, 2304, 3, 2, 2, 0); /* Kimi Linear's expert shape */
    moe_case(0, 0, 64, 24, 17, 5, 3, 3, 1);
    moe_case(0, 1, 72, 40, 24, 2, 9, 2, 0);
    /* the per-pair GEMV path (cuda/moe.cu: bf16, <= 64 pairs, Out >= F): awkward widths, rounded, 64 pairs */
    moe_case(0, 1, 264, 40, 48, 6, 5, 3, 0);
    moe_case(0, 0, 264, 40, 48, 6, 5, 3, 1);
    moe_case(0, 0, 1032, 256, 1032, 16, 8, 8, 0);
    /* past 64 pairs: the band kernels (the per-pair path with K3C_MOE_PAIR_MAX=256, the grouped kernel with
     * K3C_MOE_BAND_BF16=0; gpu-check runs all three): 160 pairs over 20 experts, rounded and not */
    moe_case(0, 0, 264, 40, 48, 20, 20, 8, 1);
    moe_case(0, 1, 136, 64, 72, 12, 20, 8, 0);
    /* past 256 pairs (band, or grouped with K3C_MOE_BAND_BF16=0 also under K3C_MOE_PAIR_MAX=256): 320 pairs
     * over 12 experts, rounded over 5 (experts of many tiles), Kimi Linear's shape at 36 tokens */
    moe_case(0, 1, 136, 64, 72, 12, 40, 8, 0);
    moe_case(0, 0, 72, 40, 48, 5, 33, 8, 1);
    moe_case(0, 0, 2304, 1024, 2304, 16, 36, 8, 0);
    /* the band kernels take Kimi Linear's widths (2304 / 8 = 288 chunks a row: 192 was MXFP4's limit, and the
     * case above ran the grouped kernel until an H200 run (2026-11-30) showed band and grouped timed the same) */
    CHECK(k3c_cuda_moe_band_fits(0, 2304, 1024, 288) && k3c_cuda_moe_band_fits(0, 6144, 6144, 1024));
    CHECK(!k3c_cuda_moe_band_fits(0, 6152, 1024, 8) && !k3c_cuda_moe_band_fits(1, 6176, 1024, 8));
    /* one slot a token, rounded (the partial mode bitwise, moe_case): grouped (Out < F), per-pair (9 pairs),
     * band (80 pairs) */
    moe_case(0, 0, 64, 24, 17, 5, 3, 1, 1);
    moe_case(0, 1, 72, 40, 48, 4, 9, 1, 1);
    moe_case(0, 0, 64, 24, 32, 5, 80, 1, 1);
}

/* The bf16 per-pair kernels' four register / occupancy variants (k3c_cuda_moe_pair_occ_force; the default is
 * 1) give the same bits: each lane takes its chunks and the experts in the same order at every variant
 * (cuda/moe_pair.cu). h and out poisoned before each run; NaN never matches. */
static void pair_variants_case(int situ, int In, int F, int E, int T, int k, int round) {
    k3c_rng r = rng_for("moe_pair_variants");
    k3c_cuda_expert *de = calloc(E, sizeof *de);
    int dims[3][2] = {{F, In}, {F, In}, {In, F}};
    for (int e = 0; e < E; e++)
        for (int m = 0; m < 3; m++) {
            const uint16_t *d = dev_rand_bf16(&r, dims[m][0], dims[m][1], NULL);
            CHECK(d);
            expert_set_bf16(&de[e], m, d);
        }
    float *x = fmalloc((size_t)T * In), *wt = fmalloc((size_t)T * k);
    int *idx = malloc(sizeof(int) * T * k);
    fill_normal(&r, x, (size_t)T * In, 1.0f);
    if (round) round_host(x, (size_t)T * In);
    for (int i = 0; i < T * k; i++) {
        idx[i] = (int)(k3c_rng_next(&r) % (uint64_t)E) - (i == 1 ? E : 0); /* pair 1 may be invalid */
        wt[i] = (float)k3c_rng_uniform(&r);
    }
    k3c_cuda_expert *dtab = dev_upload(de, sizeof *de * E);
    float *dx = dev_upload(x, (size_t)T * In * 4), *dwt = dev_upload(wt, (size_t)T * k * 4);
    int *didx = dev_upload(idx, sizeof(int) * T * k);
    size_t nh = (size_t)T * k * F, no = (size_t)T * In;
    float *dh = dev_poisoned(nh * 4), *dpart = dev_poisoned((size_t)T * k * In * 4), *dout = dev_poisoned(no * 4);
    float *h[4], *out[4];
    CHECK(dtab && dx && dwt && didx && dh && dpart && dout);
    CHECK(k3c_cuda_moe_pair_occ_force(4) != K3C_OK && k3c_cuda_moe_pair_occ_force(-2) != K3C_OK);
    k3c_cuda_act act = {situ ? 2 : 1, 4.0f, 25.0f};
    for (int v = 0; v < 4; v++) {
        h[v] = fmalloc(nh), out[v] = fmalloc(no);
        CHECK(cudaMemset(dh, 0xff, nh * 4) == cudaSuccess && cudaMemset(dout, 0xff, no * 4) == cudaSuccess);
        CHECK_OK(k3c_cuda_moe_pair_occ_force(v));
        CHECK_OK(k3c_cuda_moe_pair_bf16(dtab, E, In, F, In, dx, T, didx, dwt, k, act, round, dh, dout, 0));
        CHECK(dev_download(h[v], dh, nh * 4) == 0 && dev_download(out[v], dout, no * 4) == 0);
    }
    CHECK_OK(k3c_cuda_moe_pair_occ_force(-1));
    size_t differ = 0, nan = 0;
    for (int v = 1; v < 4; v++) {
        for (size_t i = 0; i < nh; i++) differ += memcmp(&h[v][i], &h[0][i], 4) != 0;
        for (size_t i = 0; i < no; i++) differ += memcmp(&out[v][i], &out[0][i], 4) != 0;
    }
    for (size_t i = 0; i < no; i++) nan += isnan(out[0][i]);
    for (size_t i = 0; i < nh; i++) nan += isnan(h[0][i]);
    CHECKF(differ == 0 && nan == 0, "In %d F %d T %d k %d round %d: %zu values differ between variants, %zu NaN", In,
           F, T, k, round, differ, nan);
    for (int e = 0; e < E; e++) {
        cudaFree((void *)de[e].gate_w); cudaFree((void *)de[e].up_w); cudaFree((void *)de[e].down_w);
    }
    for (int v = 0; v < 4; v++) free(h[v]), free(out[v]);
    cudaFree(dtab); cudaFree(dx); cudaFree(dwt); cudaFree(didx); cudaFree(dh); cudaFree(dpart); cudaFree(dout);
    free(de); free(x); free(wt); free(idx);
}

TEST(gpu_moe_bf16_pair_variants) {
    pair_variants_case(0, 264, 40, 6, 5, 3, 0);   /* awkward widths, k odd (an empty slot at 2 experts at once) */
    pair_variants_case(1, 264, 40, 6, 5, 3, 1);   /* rounded, SiTU */
    pair_variants_case(0, 2304, 1024, 16, 1, 8, 0); /* Kimi Linear's shape, one token */
    pair_variants_case(0, 1032, 256, 16, 8, 8, 0);  /* 64 pairs */
}

/* ---- elementwise ---- */

/* rmsnorm with strided rows: rel L2 < 1e-6; columns past n untouched (still poisoned). */
TEST(gpu_rmsnorm) {
    k3c_rng r = rng_for("rmsnorm");
    /* 9000: past NORM_EPT x 1024, the kernel's loop path */
    static const int T_l[] = {1, 3, 17}, n_l[] = {1, 7, 128, 7168, 9000};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 5; b++) {
            int T = T_l[a], n = n_l[b], xs = n + 3, ys = n + 5;
            float *x = fmalloc((size_t)T * xs), *w = fmalloc(n), *ref = fmalloc((size_t)T * n), *y = fmalloc((size_t)T * ys);
            fill_normal(&r, x, (size_t)T * xs, 2.0f);
            fill_normal(&r, w, n, 1.0f);
            for (int t = 0; t < T; t++) k3c_rmsnorm(x + (size_t)t * xs, w, n, 1e-5f, ref + (size_t)t * n);
            float *dx = dev_upload(x, (size_t)T * xs * 4), *dw = dev_upload(w, (size_t)n * 4);
            float *dy = dev_poisoned((size_t)T * ys * 4);
            CHECK(dx && dw && dy);
            CHECK_OK(k3c_cuda_rmsnorm(dx, xs, dw, T, n, 1e-5f, 0, dy, ys, 0));
            CHECK(dev_download(y, dy, (size_t)T * ys * 4) == 0);
            float *yc = fmalloc((size_t)T * n);
            for (int t = 0; t < T; t++) {
                memcpy(yc + (size_t)t * n, y + (size_t)t * ys, (size_t)n * 4);
                for (int i = n; i < ys; i++) CHECKF(isnan(y[(size_t)t * ys + i]), "column %d past n written", i);
            }
            double e = rel_l2_f32f32(yc, ref, (size_t)T * n);
            note("rmsnorm", 1e-6, e);
            CHECKF(e < 1e-6, "T %d n %d: rel L2 %.3g", T, n, e);
            cudaFree(dx); cudaFree(dw); cudaFree(dy);
            free(x); free(w); free(ref); free(y); free(yc);
        }
}

/* The fused residual add(s) + rmsnorm (executor epilogues): bitwise the separate k3c_cuda_add calls and
 * k3c_cuda_rmsnorm it replaces, on the stored sum and on the normed output, with and without the second
 * addend and the rounding; the stored sum also exactly the spec's r(p + r(a1 + a2)) computed here on the
 * host, and the unrounded output within rel L2 1e-6 of the CPU rmsnorm of that sum. */
TEST(gpu_add_rmsnorm) {
    k3c_rng r = rng_for("add_rmsnorm");
    /* 9000: past NORM_EPT x 1024, the kernel's loop path */
    static const int T_l[] = {1, 3, 17}, n_l[] = {1, 7, 128, 1000, 2304, 7168, 9000};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 7; b++)
            for (int mode = 0; mode < 4; mode++) {
                int T = T_l[a], n = n_l[b], two = mode & 1, round = mode >> 1;
                size_t N = (size_t)T * n, bytes = N * 4;
                float *p = fmalloc(N), *a1 = fmalloc(N), *a2 = fmalloc(N), *w = fmalloc(n);
                fill_normal(&r, p, N, 3.0f);
                fill_normal(&r, a1, N, 1.0f);
                fill_normal(&r, a2, N, 0.5f);
                fill_normal(&r, w, n, 1.0f);
                float *dp = dev_upload(p, bytes), *dq = dev_upload(p, bytes), *da1 = dev_upload(a1, bytes);
                float *da2 = dev_upload(a2, bytes), *dw = dev_upload(w, (size_t)n * 4);
                float *dy = dev_poisoned(bytes), *dys = dev_poisoned(bytes), *df = dev_poisoned(bytes);
                CHECK(dp && dq && da1 && da2 && dw && dy && dys && df);
                /* fused on dp -> dy; the separate sequence on dq -> dys (f: the first sum, as "moe out") */
                CHECK_OK(k3c_cuda_add_rmsnorm(dp, da1, two ? da2 : NULL, dw, T, n, 1e-5f, round, dy, 0));
                const float *addend = da1;
                if (two) {
                    CHECK_OK(k3c_cuda_add(da1, da2, N, round, df, 0));
                    addend = df;
                }
                CHECK_OK(k3c_cuda_add(dq, addend, N, round, dq, 0));
                CHECK_OK(k3c_cuda_rmsnorm(dq, n, dw, T, n, 1e-5f, round, dys, n, 0));
                float *gp = fmalloc(N), *gq = fmalloc(N), *gy = fmalloc(N), *gys = fmalloc(N), *ref = fmalloc(N);
                CHECK(dev_download(gp, dp, bytes) == 0 && dev_download(gq, dq, bytes) == 0);
                CHECK(dev_download(gy, dy, bytes) == 0 && dev_download(gys, dys, bytes) == 0);
                size_t bad_p = 0, bad_y = 0, bad_host = 0;
                for (size_t i = 0; i < N; i++) {
                    bad_p += memcmp(&gp[i], &gq[i], 4) != 0;
                    bad_y += memcmp(&gy[i], &gys[i], 4) != 0 || isnan(gy[i]);
                    float v = a1[i];
                    if (two) v = round ? bf16_round(a1[i] + a2[i]) : a1[i] + a2[i];
                    v = round ? bf16_round(p[i] + v) : p[i] + v;
                    bad_host += memcmp(&v, &gp[i], 4) != 0;
                }
                CHECKF(bad_p == 0 && bad_y == 0 && bad_host == 0,
                       "T %d n %d two %d round %d: %zu sums, %zu outputs differ from the separate kernels, %zu sums "
                       "from the host", T, n, two, round, bad_p, bad_y, bad_host);
                if (!round) {
                    for (int t = 0; t < T; t++) k3c_rmsnorm(gp + (size_t)t * n, w, n, 1e-5f, ref + (size_t)t * n);
                    double e = rel_l2_f32f32(gy, ref, N);
                    note("add_rmsnorm", 1e-6, e);
                    CHECKF(e < 1e-6, "T %d n %d two %d: rel L2 %.3g", T, n, two, e);
                }
                cudaFree(dp); cudaFree(dq); cudaFree(da1); cudaFree(da2); cudaFree(dw);
                cudaFree(dy); cudaFree(dys); cudaFree(df);
                free(p); free(a1); free(a2); free(w); free(gp); free(gq); free(gy); free(gys); free(ref);
            }
}

/* SiLU and SiTU gated activation, strided inputs: rel L2 < 1e-6. */
TEST(gpu_gated_act) {
    k3c_rng r = rng_for("act");
    for (int situ = 0; situ < 2; situ++) {
        int T = 5, n = 1001;
        k3c_config cfg;
        config_act(&cfg, situ);
        float *gu = fmalloc((size_t)T * 2 * n), *ref = fmalloc((size_t)T * n), *out = fmalloc((size_t)T * n);
        fill_normal(&r, gu, (size_t)T * 2 * n, 8.0f);
        for (int t = 0; t < T; t++)
            k3c_gated_act(&cfg, gu + (size_t)t * 2 * n, gu + (size_t)t * 2 * n + n, n, ref + (size_t)t * n);
        float *dgu = dev_upload(gu, (size_t)T * 2 * n * 4), *dout = dev_poisoned((size_t)T * n * 4);
        CHECK(dgu && dout);
        k3c_cuda_act act = {situ ? 2 : 1, 4.0f, 25.0f};
        CHECK_OK(k3c_cuda_gated_act(act, dgu, 2 * n, dgu + n, 2 * n, T, n, 0, dout, 0));
        CHECK(dev_download(out, dout, (size_t)T * n * 4) == 0);
        double e = rel_l2_f32f32(out, ref, (size_t)T * n);
        note("gated_act", 1e-6, e);
        CHECKF(e < 1e-6, "situ %d: rel L2 %.3g", situ, e);
        cudaFree(dgu); cudaFree(dout);
        free(gu); free(ref); free(out);
    }
}

/* Embedding gather: exact. */
TEST(gpu_embed) {
    k3c_rng r = rng_for("embed");
    int V = 1000, D = 77, T = 9;
    uint16_t *E = malloc((size_t)V * D * 2);
    fill_bf16(&r, E, (size_t)V * D, 1.0f);
    int ids[9];
    for (int t = 0; t < T; t++) ids[t] = (int)(k3c_rng_next(&r) % V);
    ids[0] = V - 1;
    float *ref = fmalloc((size_t)T * D), *out = fmalloc((size_t)T * D);
    k3c_mat m = {E, V, D};
    for (int t = 0; t < T; t++) k3c_bf16_row(&m, ids[t], ref + (size_t)t * D);
    void *dE = dev_upload(E, (size_t)V * D * 2), *dids = dev_upload(ids, sizeof ids);
    float *dout = dev_poisoned((size_t)T * D * 4);
    CHECK(dE && dids && dout);
    CHECK_OK(k3c_cuda_embed(dE, V, D, dids, T, dout, 0));
    CHECK(dev_download(out, dout, (size_t)T * D * 4) == 0);
    double e = rel_l2_f32f32(out, ref, (size_t)T * D);
    note("embed(exact)", 0.0, e);
    CHECK(e == 0.0);
    cudaFree(dE); cudaFree(dids); cudaFree(dout);
    free(E); free(ref); free(out);
}

/* ---- AttnRes ---- */

/* Mix over 1, 2 and 9 sources against a float64 reference: rel L2 < 2e-5. Why not the f32 CPU kernel: its
 * logits (sums of 7168 products, ~N(0, 25) here) are summed sequentially, and their f32 error moves the
 * softmax weights by up to 5e-5 of the output (measured against float64 over 200 rows); the CUDA kernel's
 * tree-reduced sums, emulated on the CPU in its order over 4000 rows, stay within 5.7e-6 of float64. */
TEST(gpu_attnres_mix) {
    k3c_rng r = rng_for("attnres");
    static const int n_l[] = {1, 2, 9}, T_l[] = {1, 5}, D_l[] = {7, 256, 7168};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 3; c++) {
                int n = n_l[a], T = T_l[b], D = D_l[c];
                float *src[9], *dsrc[9];
                for (int j = 0; j < n; j++) {
                    src[j] = fmalloc((size_t)T * D);
                    fill_normal(&r, src[j], (size_t)T * D, 1.0f + j);
                    dsrc[j] = dev_upload(src[j], (size_t)T * D * 4);
                    CHECK(dsrc[j]);
                }
                float *proj = fmalloc(D), *norm = fmalloc(D), *out = fmalloc((size_t)T * D);
                fill_normal(&r, proj, D, 0.3f);
                fill_normal(&r, norm, D, 1.0f);
                double *ref64 = malloc(sizeof(double) * T * D);
                for (int t = 0; t < T; t++) {
                    const float *rows[9];
                    for (int j = 0; j < n; j++) rows[j] = src[j] + (size_t)t * D;
                    attnres_ref64(rows, n, D, proj, norm, 1e-5, ref64 + (size_t)t * D);
                }
                void *dptr = dev_upload(dsrc, sizeof(float *) * n);
                float *dproj = dev_upload(proj, (size_t)D * 4), *dnorm = dev_upload(norm, (size_t)D * 4);
                float *dout = dev_poisoned((size_t)T * D * 4);
                CHECK(dptr && dproj && dnorm && dout);
                CHECK_OK(k3c_cuda_attnres_mix(dptr, n, T, D, dproj, dnorm, 1e-5f, 0, dout, 0));
                CHECK(dev_download(out, dout, (size_t)T * D * 4) == 0);
                double e = rel_l2_f32(out, ref64, (size_t)T * D);
                note("attnres_mix(vs_f64)", 2e-5, e);
                CHECKF(e < 2e-5, "n %d T %d D %d: rel L2 %.3g", n, T, D, e);
                free(ref64);
                for (int j = 0; j < n; j++) { cudaFree(dsrc[j]); free(src[j]); }
                cudaFree(dptr); cudaFree(dproj); cudaFree(dnorm); cudaFree(dout);
                free(proj); free(norm); free(out);
            }
}

/* The mix with a pending prefix (executor epilogues): bitwise the separate adds into a buffer followed by
 * k3c_cuda_attnres_mix over the blocks and that buffer, on the output and on the stored prefix p_new (also
 * exactly the host's r(p_old + r(a1 + a2))); p_old untouched. Block counts around the 8-source tile edge. */
TEST(gpu_attnres_mix_pending) {
    k3c_rng r = rng_for("attnres_pending");
    static const int nb_l[] = {0, 1, 3, 7, 8, 9}, T_l[] = {1, 5}, D_l[] = {7, 256, 7168};
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 3; c++)
                for (int mode = 0; mode < 3; mode++) { /* (p_old, a1, a2), (p_old, a1), (a1: a copy) */
                    int nb = nb_l[a], T = T_l[b], D = D_l[c], round = (a + b + c + mode) & 1;
                    if (D == 7168 && nb > 3 && mode != 0) continue; /* the emulator's time */
                    size_t N = (size_t)T * D, bytes = N * 4;
                    float *src[10], *dsrc[10];
                    for (int j = 0; j < nb + 1; j++) {
                        src[j] = fmalloc(N);
                        fill_normal(&r, src[j], N, 1.0f + j);
                        dsrc[j] = dev_upload(src[j], bytes); /* dsrc[nb]: p_old */
                        CHECK(dsrc[j]);
                    }
                    float *a1 = fmalloc(N), *a2 = fmalloc(N), *proj = fmalloc(D), *norm = fmalloc(D);
                    fill_normal(&r, a1, N, 2.0f);
                    fill_normal(&r, a2, N, 0.7f);
                    fill_normal(&r, proj, D, 0.3f);
                    fill_normal(&r, norm, D, 1.0f);
                    float *da1 = dev_upload(a1, bytes), *da2 = dev_upload(a2, bytes);
                    float *dproj = dev_upload(proj, (size_t)D * 4), *dnorm = dev_upload(norm, (size_t)D * 4);
                    float *dnew = dev_poisoned(bytes), *dout = dev_poisoned(bytes), *douts = dev_poisoned(bytes);
                    float *dv = dev_poisoned(bytes), *df = dev_poisoned(bytes);
                    CHECK(da1 && da2 && dproj && dnorm && dnew && dout && douts && dv && df);
                    const float *p_old = mode < 2 ? dsrc[nb] : NULL, *a2p = mode == 0 ? da2 : NULL;
                    void *dptr = dev_upload(dsrc, sizeof(float *) * (nb + 1));
                    CHECK(dptr);
                    CHECK_OK(k3c_cuda_attnres_mix_pending(dptr, nb, p_old, da1, a2p, round, dnew, T, D, dproj, dnorm,
                                                          1e-5f, round, dout, 0));
                    /* the separate sequence: the adds into dv, then the plain mix over the blocks and dv */
                    const float *addend = da1;
                    if (a2p) {
                        CHECK_OK(k3c_cuda_add(da1, da2, N, round, df, 0));
                        addend = df;
                    }
                    if (p_old) CHECK_OK(k3c_cuda_add(p_old, addend, N, round, dv, 0));
                    else CUDA_OK(cudaMemcpy(dv, addend, bytes, cudaMemcpyDeviceToDevice));
                    float *srcs[10];
                    for (int j = 0; j < nb; j++) srcs[j] = dsrc[j];
                    srcs[nb] = dv;
                    void *dptr2 = dev_upload(srcs, sizeof(float *) * (nb + 1));
                    CHECK(dptr2);
                    CHECK_OK(k3c_cuda_attnres_mix(dptr2, nb + 1, T, D, dproj, dnorm, 1e-5f, round, douts, 0));
                    float *gnew = fmalloc(N), *gout = fmalloc(N), *gouts = fmalloc(N), *gold = fmalloc(N);
                    CHECK(dev_download(gnew, dnew, bytes) == 0 && dev_download(gout, dout, bytes) == 0);
                    CHECK(dev_download(gouts, douts, bytes) == 0 && dev_download(gold, dsrc[nb], bytes) == 0);
                    size_t bad_out = 0, bad_new = 0, bad_old = 0;
                    for (size_t i = 0; i < N; i++) {
                        float v = a1[i];
                        if (mode == 0) v = round ? bf16_round(a1[i] + a2[i]) : a1[i] + a2[i];
                        if (mode < 2) v = round ? bf16_round(src[nb][i] + v) : src[nb][i] + v;
                        bad_new += memcmp(&v, &gnew[i], 4) != 0;
                        bad_out += memcmp(&gout[i], &gouts[i], 4) != 0 || isnan(gout[i]);
                        bad_old += memcmp(&gold[i], &src[nb][i], 4) != 0;
                    }
                    CHECKF(bad_out == 0 && bad_new == 0 && bad_old == 0,
                           "nb %d T %d D %d mode %d round %d: %zu outputs differ from the separate kernels, %zu "
                           "prefix values from the host, %zu p_old values changed", nb, T, D, mode, round, bad_out,
                           bad_new, bad_old);
                    for (int j = 0; j < nb + 1; j++) { cudaFree(dsrc[j]); free(src[j]); }
                    cudaFree(da1); cudaFree(da2); cudaFree(dproj); cudaFree(dnorm); cudaFree(dnew); cudaFree(dout);
                    cudaFree(douts); cudaFree(dv); cudaFree(df); cudaFree(dptr); cudaFree(dptr2);
                    free(a1); free(a2); free(proj); free(norm); free(gnew); free(gout); free(gouts); free(gold);
                }
}

/* ---- router ---- */

/* Same experts in the same order as k3c_route; weights rel L2 < 1e-6. */
TEST(gpu_router) {
    k3c_rng r = rng_for("router");
    struct { int E, k, sigmoid, groups, topk_group, renorm; float scale; } cases[] = {
        {896, 16, 1, 1, 1, 1, 1.0f}, {64, 1, 1, 1, 1, 1, 2.5f}, {256, 8, 1, 8, 3, 1, 2.446f},
        {100, 7, 0, 1, 1, 0, 1.0f},  {17, 17, 0, 1, 1, 1, 1.0f}, {896, 16, 1, 32, 4, 0, 1.5f},
        {2000, 16, 1, 1, 1, 1, 1.0f}, /* 8 keys a thread, the most the kernel sorts */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        int E = cases[ci].E, k = cases[ci].k, T = 7;
        k3c_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.num_experts = E;
        cfg.num_experts_per_token = k;
        cfg.router_sigmoid = cases[ci].sigmoid;
        cfg.use_correction_bias = 1;
        cfg.use_grouped_topk = cases[ci].groups > 1;
        cfg.num_expert_group = cases[ci].groups;
        cfg.topk_group = cases[ci].topk_group;
        cfg.moe_renormalize = cases[ci].renorm;
        cfg.routed_scaling_factor = cases[ci].scale;
        float *lg = fmalloc((size_t)T * E), *bias = fmalloc(E), *wref = fmalloc((size_t)T * k), *w = fmalloc((size_t)T * k);
        int *iref = malloc(sizeof(int) * T * k), *idx = malloc(sizeof(int) * T * k);
        fill_normal(&r, lg, (size_t)T * E, 2.0f);
        fill_normal(&r, bias, E, 0.1f);
        for (int t = 0; t < T; t++) k3c_route(&cfg, lg + (size_t)t * E, bias, iref + t * k, wref + t * k);
        k3c_cuda_router rc = {E, k, cases[ci].sigmoid, 1, cases[ci].groups, cases[ci].topk_group, cases[ci].renorm,
                              cases[ci].scale};
        float *dlg = dev_upload(lg, (size_t)T * E * 4), *db = dev_upload(bias, (size_t)E * 4);
        float *dw = dev_poisoned((size_t)T * k * 4);
        int *didx = dev_poisoned(sizeof(int) * T * k);
        CHECK(dlg && db && dw && didx);
        CHECK_OK(k3c_cuda_route(&rc, dlg, db, T, didx, dw, 0));
        CHECK(dev_download(idx, didx, sizeof(int) * T * k) == 0);
        CHECK(dev_download(w, dw, (size_t)T * k * 4) == 0);
        for (int i = 0; i < T * k; i++) CHECKF(idx[i] == iref[i], "case %zu: slot %d: expert %d, cpu %d", ci, i, idx[i], iref[i]);
        double e = rel_l2_f32f32(w, wref, (size_t)T * k);
        note("router(ids_exact,weights)", 1e-6, e);
        CHECKF(e < 1e-6, "case %zu: weights rel L2 %.3g", ci, e);
        cudaFree(dlg); cudaFree(db); cudaFree(dw); cudaFree(didx);
        free(lg); free(bias); free(wref); free(w); free(iref); free(idx);
    }
    /* more experts than the sort holds: an error that says so, nothing launched */
    k3c_cuda_router big = {4096, 8, 1, 0, 1, 1, 1, 1.0f};
    CHECK(k3c_cuda_route(&big, NULL, NULL, 1, NULL, NULL, 0) != K3C_OK);
    CHECK(strstr(k3c_error_message(), "4096 experts") != NULL);
}

/* Greedy ids on the device against runtime/sampler.c's order (k3c_greedy_token), exact: random rows, rows of
 * three values only (ties everywhere), +0 / -0, -inf, NaNs among numbers, NaN first, all NaN; outputs
 * poisoned. */
TEST(gpu_argmax_rows) {
    k3c_rng r = rng_for("argmax_rows");
    /* widths of a multiple of 4 take the float4 path (4: one load; 4100: a second round for one thread),
     * the others the scalar one (163843: K3's vocabulary + 3) */
    static const int Vs[] = {1, 4, 7, 1000, 4100, 163840, 163843};
    for (int vi = 0; vi < (int)(sizeof Vs / sizeof Vs[0]); vi++) {
        int V = Vs[vi], rows = 7;
        float *lg = fmalloc((size_t)rows * V);
        fill_normal(&r, lg, (size_t)rows * V, 3.0f);
        for (int t = 1; t < rows; t++)
            for (int e = 0; e < V; e++) {
                uint32_t u = (uint32_t)(k3c_rng_next(&r) >> 32);
                float *v = &lg[(size_t)t * V + e];
                if (t == 1) *v = (float)((int)(u % 3) - 1);
                if (t == 2 && u % 5 == 0) *v = (u & 8) ? -0.0f : 0.0f;
                if (t == 2 && u % 7 == 0) *v = -INFINITY;
                if (t == 3 && u % 3 == 0) *v = NAN;
                if (t == 4 && e == 0) *v = NAN;
                if (t == 5) *v = NAN;
                if (t == 6) *v = (u & 1) ? -0.0f : 0.0f;
            }
        int32_t ref[7], got[7];
        for (int t = 0; t < rows; t++) ref[t] = k3c_greedy_token(lg + (size_t)t * V, V);
        float *d = dev_upload(lg, (size_t)rows * V * 4);
        int32_t *di = dev_poisoned(sizeof(int32_t) * rows);
        CHECK(d && di);
        CHECK_OK(k3c_cuda_argmax_rows(d, rows, V, di, 0));
        CHECK(dev_download(got, di, sizeof got) == 0);
        for (int t = 0; t < rows; t++) CHECKF(got[t] == ref[t], "V %d row %d: id %d, cpu %d", V, t, got[t], ref[t]);
        /* the same rows in parts, reduced on the host as the executor does: parts that split ties, put the
         * maximum in a later part, or (64 parts of a short row) run past the row's end */
        static const int parts_list[] = {1, 2, 3, 7, K3C_ARGMAX_PARTS_MAX};
        uint64_t *dk = dev_poisoned(sizeof(uint64_t) * rows * K3C_ARGMAX_PARTS_MAX);
        uint64_t hk[7 * K3C_ARGMAX_PARTS_MAX];
        CHECK(dk != NULL);
        for (int pi = 0; pi < (int)(sizeof parts_list / sizeof parts_list[0]); pi++) {
            int parts = parts_list[pi];
            CHECK_OK(k3c_cuda_argmax_keys(d, rows, V, parts, dk, 0));
            CHECK(dev_download(hk, dk, sizeof(uint64_t) * rows * parts) == 0);
            for (int t = 0; t < rows; t++) {
                int32_t id = k3c_argmax_key_id(hk + (size_t)t * parts, parts);
                CHECKF(id == ref[t], "V %d row %d in %d parts: id %d, cpu %d", V, t, parts, id, ref[t]);
            }
        }
        cudaFree(dk);
        cudaFree(d);
        cudaFree(di);
        free(lg);
    }
    /* the executor's parts: within the key buffer, and impossible part counts refused */
    for (int rows = 1; rows <= 300; rows++) {
        int parts = k3c_cuda_argmax_parts(rows);
        CHECKF(parts >= 1 && parts <= K3C_ARGMAX_PARTS_MAX &&
                   (size_t)rows * parts <= (size_t)(rows > K3C_ARGMAX_KEYS_MAX ? rows : K3C_ARGMAX_KEYS_MAX),
               "rows %d: %d parts", rows, parts);
    }
    CHECK(k3c_cuda_argmax_keys((const float *)1, 1, 8, 0, (uint64_t *)1, 0) != K3C_OK);
    CHECK(k3c_cuda_argmax_keys((const float *)1, 1, 8, K3C_ARGMAX_PARTS_MAX + 1, (uint64_t *)1, 0) != K3C_OK);
}

/* Selection order at its edges, ids exact against cpu/ops.h k3c_route: many equal scores (ties go to the
 * lower id), +0 and -0 (equal), -inf, and NaN scores (below every number, among themselves by id), in
 * sigmoid routing with no bias so that the scores keep those values. */
TEST(gpu_router_ties_nan) {
    k3c_rng r = rng_for("router_ties");
    static const int Es[] = {64, 256, 896}, ks[] = {8, 8, 16};
    for (int ci = 0; ci < 3; ci++) {
        int E = Es[ci], k = ks[ci], T = 5;
        k3c_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.num_experts = E;
        cfg.num_experts_per_token = k;
        cfg.router_sigmoid = 1;
        cfg.num_expert_group = 1;
        cfg.topk_group = 1;
        cfg.moe_renormalize = 1;
        cfg.routed_scaling_factor = 1.0f;
        float *lg = fmalloc((size_t)T * E), *wref = fmalloc((size_t)T * k), *w = fmalloc((size_t)T * k);
        int *iref = malloc(sizeof(int) * T * k), *idx = malloc(sizeof(int) * T * k);
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) {
                /* row 0: three values only (ties everywhere); 1: +-0 and -inf mixed in; 2: NaNs among them;
                 * 3: more NaNs than numbers; 4: all NaN */
                uint32_t u = (uint32_t)(k3c_rng_next(&r) >> 32);
                float v = (float)((int)(u % 3) - 1);
                if (t >= 1 && u % 7 == 0) v = (u & 8) ? -0.0f : 0.0f;
                if (t >= 1 && u % 11 == 0) v = -INFINITY;
                if ((t == 2 && u % 5 == 0) || (t == 3 && u % 4 != 0) || t == 4) v = NAN;
                lg[(size_t)t * E + e] = v;
            }
        for (int t = 0; t < T; t++) k3c_route(&cfg, lg + (size_t)t * E, NULL, iref + t * k, wref + t * k);
        k3c_cuda_router rc = {E, k, 1, 0, 1, 1, 1, 1.0f};
        float *dlg = dev_upload(lg, (size_t)T * E * 4), *dw = dev_poisoned((size_t)T * k * 4);
        int *didx = dev_poisoned(sizeof(int) * T * k);
        CHECK(dlg && dw && didx);
        CHECK_OK(k3c_cuda_route(&rc, dlg, NULL, T, didx, dw, 0));
        CHECK(dev_download(idx, didx, sizeof(int) * T * k) == 0);
        CHECK(dev_download(w, dw, (size_t)T * k * 4) == 0);
        for (int i = 0; i < T * k; i++)
            CHECKF(idx[i] == iref[i], "E %d: row %d slot %d: expert %d, cpu %d", E, i / k, i % k, idx[i], iref[i]);
        for (int i = 0; i < 3 * k; i++) /* rows 0-2 have k numbers at least: their weights are numbers */
            CHECKF(w[i] == w[i] && fabsf(w[i] - wref[i]) <= 1e-6f * fabsf(wref[i]) + 1e-7f,
                   "E %d: row %d slot %d: weight %g, cpu %g", E, i / k, i % k, w[i], wref[i]);
        cudaFree(dlg); cudaFree(dw); cudaFree(didx);
        free(lg); free(wref); free(w); free(iref); free(idx);
    }
}

/* Routing and the shared expert's activation in one launch (k3c_cuda_route_act) against k3c_cuda_route then
 * k3c_cuda_gated_act on the same inputs: ids, weights and activations bitwise equal, every output written
 * (outputs poisoned, ids in range, no NaN). 8, 256 (grouped) and 896 experts; T 1, 3, 64 (64 x 16400: more
 * activation elements than gated_act's 4096 blocks of 256, so its grid-stride loop runs); SiLU and SiTU,
 * rounding on and off, out in place on gate (stride n) or apart (gate and up the halves of one row). */
TEST(gpu_route_act) {
    k3c_rng r = rng_for("route_act");
    struct { int E, k, sigmoid, groups, topk_group, renorm; float scale; int n; } cases[] = {
        {8, 2, 0, 1, 1, 0, 1.0f, 16400}, {256, 8, 1, 8, 4, 1, 2.446f, 1024}, {896, 16, 1, 1, 1, 1, 2.5f, 37},
    };
    static const int Ts[] = {1, 3, 64};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int ti = 0; ti < 3; ti++)
            for (int v = 0; v < 8; v++) {
                int E = cases[ci].E, k = cases[ci].k, n = cases[ci].n, T = Ts[ti];
                int situ = v & 1, round = v >> 1 & 1, inplace = v >> 2 & 1;
                k3c_cuda_router rc = {E, k, cases[ci].sigmoid, 1, cases[ci].groups, cases[ci].topk_group,
                                      cases[ci].renorm, cases[ci].scale};
                k3c_cuda_act act = {situ ? 2 : 1, 4.0f, 25.0f};
                /* in place: gate [T, n] (stride n), overwritten, so one copy per path; apart: [T, 2n] rows of
                 * gate then up */
                int gs = inplace ? n : 2 * n, us = inplace ? n : 2 * n;
                size_t NK = (size_t)T * k, N = (size_t)T * n, GU = (size_t)T * 2 * n;
                float *lg = fmalloc((size_t)T * E), *bias = fmalloc(E), *gu = fmalloc(GU);
                fill_normal(&r, lg, (size_t)T * E, 2.0f);
                fill_normal(&r, bias, E, 0.1f);
                fill_normal(&r, gu, GU, 8.0f);
                float *dlg = dev_upload(lg, (size_t)T * E * 4), *db = dev_upload(bias, (size_t)E * 4);
                float *dgu_s = dev_upload(gu, GU * 4), *dgu_f = dev_upload(gu, GU * 4);
                float *dw_s = dev_poisoned(NK * 4), *dw_f = dev_poisoned(NK * 4);
                int *di_s = dev_poisoned(NK * sizeof(int)), *di_f = dev_poisoned(NK * sizeof(int));
                float *dout_s = inplace ? dgu_s : dev_poisoned(N * 4), *dout_f = inplace ? dgu_f : dev_poisoned(N * 4);
                CHECK(dlg && db && dgu_s && dgu_f && dw_s && dw_f && di_s && di_f && dout_s && dout_f);
                /* in place: the first T n floats are the gate rows, the next T n the up rows */
                const float *g_s = dgu_s, *u_s = inplace ? dgu_s + N : dgu_s + n;
                const float *g_f = dgu_f, *u_f = inplace ? dgu_f + N : dgu_f + n;
                CHECK_OK(k3c_cuda_route(&rc, dlg, db, T, di_s, dw_s, 0));
                CHECK_OK(k3c_cuda_gated_act(act, g_s, gs, u_s, us, T, n, round, dout_s, 0));
                CHECK_OK(k3c_cuda_route_act(&rc, dlg, db, T, di_f, dw_f, act, g_f, gs, u_f, us, n, round, dout_f, 0));
                int *is = malloc(NK * sizeof(int)), *ifu = malloc(NK * sizeof(int));
                float *ws = fmalloc(NK), *wf = fmalloc(NK), *os = fmalloc(N), *of = fmalloc(N);
                CHECK(dev_download(is, di_s, NK * sizeof(int)) == 0 && dev_download(ifu, di_f, NK * sizeof(int)) == 0);
                CHECK(dev_download(ws, dw_s, NK * 4) == 0 && dev_download(wf, dw_f, NK * 4) == 0);
                CHECK(dev_download(os, dout_s, N * 4) == 0 && dev_download(of, dout_f, N * 4) == 0);
                size_t bad_i = 0, bad_w = 0, bad_o = 0;
                for (size_t i = 0; i < NK; i++) {
                    bad_i += is[i] != ifu[i] || ifu[i] < 0 || ifu[i] >= E;
                    bad_w += memcmp(&ws[i], &wf[i], 4) != 0 || isnan(wf[i]) || isnan(ws[i]);
                }
                for (size_t i = 0; i < N; i++) bad_o += memcmp(&os[i], &of[i], 4) != 0 || isnan(of[i]) || isnan(os[i]);
                CHECKF(bad_i == 0 && bad_w == 0 && bad_o == 0,
                       "E %d k %d T %d n %d situ %d round %d in place %d: %zu ids, %zu weights, %zu activations differ "
                       "from the separate launches (or are unwritten)", E, k, T, n, situ, round, inplace, bad_i, bad_w,
                       bad_o);
                cudaFree(dlg); cudaFree(db); cudaFree(dgu_s); cudaFree(dgu_f); cudaFree(dw_s); cudaFree(dw_f);
                cudaFree(di_s); cudaFree(di_f);
                if (!inplace) { cudaFree(dout_s); cudaFree(dout_f); }
                free(lg); free(bias); free(gu); free(is); free(ifu); free(ws); free(wf); free(os); free(of);
            }
    /* the router's limits hold here too: an error naming the function, nothing launched */
    k3c_cuda_router big = {4096, 8, 1, 0, 1, 1, 1, 1.0f};
    k3c_cuda_act silu = {1, 0.0f, 0.0f};
    CHECK(k3c_cuda_route_act(&big, NULL, NULL, 1, NULL, NULL, silu, NULL, 8, NULL, 8, 8, 0, NULL, 0) != K3C_OK);
    CHECK(strstr(k3c_error_message(), "k3c_cuda_route_act: 4096 experts") != NULL);
}

/* ---- KDA ---- */

/* Conv + window over consecutive calls (token counts below and above W-1): outputs rel L2 < 1e-5 (fma vs
 * separate multiply-add; with C = 1 a single value's relative error), the window exactly. */
TEST(gpu_kda_conv) {
    k3c_rng r = rng_for("conv");
    static const int C_l[] = {1, 17, 300};
    static const int calls[] = {1, 2, 3, 5, 70, 1};
    int W = 4;
    for (int a = 0; a < 3; a++) {
        int C = C_l[a];
        float *taps = fmalloc((size_t)C * W), *win = fmalloc((size_t)(W - 1) * C);
        fill_normal(&r, taps, (size_t)C * W, 0.5f);
        fill_normal(&r, win, (size_t)(W - 1) * C, 1.0f);
        float *dtaps = dev_upload(taps, (size_t)C * W * 4), *dwin = dev_upload(win, (size_t)(W - 1) * C * 4);
        CHECK(dtaps && dwin);
        for (int ci = 0; ci < 6; ci++) {
            int T = calls[ci];
            float *x = fmalloc((size_t)T * C), *ref = fmalloc((size_t)T * C), *out = fmalloc((size_t)T * C);
            fill_normal(&r, x, (size_t)T * C, 1.0f);
            k3c_kda_conv(x, T, C, W, taps, win, ref);
            float *dx = dev_upload(x, (size_t)T * C * 4), *dout = dev_poisoned((size_t)T * C * 4);
            CHECK(dx && dout);
            CHECK_OK(k3c_cuda_kda_conv(dx, T, C, W, dtaps, dwin, 0, dout, 0));
            CHECK(dev_download(out, dout, (size_t)T * C * 4) == 0);
            double e = rel_l2_f32f32(out, ref, (size_t)T * C);
            note("kda_conv", 1e-5, e);
            CHECKF(e < 1e-5, "C %d call %d T %d: rel L2 %.3g", C, ci, T, e);
            float *wgot = fmalloc((size_t)(W - 1) * C);
            CHECK(dev_download(wgot, dwin, (size_t)(W - 1) * C * 4) == 0);
            CHECKF(rel_l2_f32f32(wgot, win, (size_t)(W - 1) * C) == 0.0, "C %d call %d: window differs", C, ci);
            cudaFree(dx); cudaFree(dout);
            free(x); free(ref); free(out); free(wgot);
        }
        cudaFree(dtaps); cudaFree(dwin);
        free(taps); free(win);
    }
}

/* Both gate forms and beta: rel L2 < 1e-6; q/k norm: rel L2 < 1e-6. */
TEST(gpu_kda_gate_qk_norm) {
    k3c_rng r = rng_for("gate");
    int T = 3, H = 5, dk = 32, P = H * dk;
    for (int lb = 0; lb < 2; lb++) {
        k3c_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.kda_num_heads = H;
        cfg.kda_head_dim = dk;
        cfg.kda_has_lower_bound = lb;
        cfg.kda_gate_lower_bound = -5.0f;
        float *f = fmalloc((size_t)T * P), *b = fmalloc((size_t)T * H), *alog = fmalloc(H), *dtb = fmalloc(P);
        fill_normal(&r, f, (size_t)T * P, 8.0f); /* some above the softplus threshold 20 */
        fill_normal(&r, b, (size_t)T * H, 2.0f);
        fill_normal(&r, alog, H, 1.0f);
        fill_normal(&r, dtb, P, 1.0f);
        float *gref = fmalloc((size_t)T * P), *g = fmalloc((size_t)T * P), *beta = fmalloc((size_t)T * H);
        k3c_kda_gate(&cfg, alog, dtb, f, T, gref);
        float *df = dev_upload(f, (size_t)T * P * 4), *db = dev_upload(b, (size_t)T * H * 4);
        float *dal = dev_upload(alog, (size_t)H * 4), *ddt = dev_upload(dtb, (size_t)P * 4);
        float *dg = dev_poisoned((size_t)T * P * 4), *dbeta = dev_poisoned((size_t)T * H * 4);
        CHECK(df && db && dal && ddt && dg && dbeta);
        CHECK_OK(k3c_cuda_kda_gate(df, db, dal, ddt, T, H, dk, lb, -5.0f, dg, dbeta, 0));
        CHECK(dev_download(g, dg, (size_t)T * P * 4) == 0);
        CHECK(dev_download(beta, dbeta, (size_t)T * H * 4) == 0);
        double e = rel_l2_f32f32(g, gref, (size_t)T * P);
        note("kda_gate", 1e-6, e);
        CHECKF(e < 1e-6, "lower bound %d: gate rel L2 %.3g", lb, e);
        for (int i = 0; i < T * H; i++) CHECK_CLOSE(beta[i], k3c_sigmoidf(b[i]), 1e-7, 1e-6);
        cudaFree(df); cudaFree(db); cudaFree(dal); cudaFree(ddt); cudaFree(dg); cudaFree(dbeta);
        free(f); free(b); free(alog); free(dtb); free(gref); free(g); free(beta);
    }
    int dkn = 128;
    size_t n = (size_t)T * H * dkn;
    float *q = fmalloc(n), *k = fmalloc(n), *q2 = fmalloc(n), *k2 = fmalloc(n);
    fill_normal(&r, q, n, 3.0f);
    fill_normal(&r, k, n, 3.0f);
    float *dq = dev_upload(q, n * 4), *dk_ = dev_upload(k, n * 4);
    CHECK(dq && dk_);
    k3c_kda_qk_norm(q, k, T, H, dkn);
    CHECK_OK(k3c_cuda_kda_qk_norm(dq, dk_, T, H, dkn, 0));
    CHECK(dev_download(q2, dq, n * 4) == 0);
    CHECK(dev_download(k2, dk_, n * 4) == 0);
    double eq = rel_l2_f32f32(q2, q, n), ek = rel_l2_f32f32(k2, k, n);
    note("kda_qk_norm", 1e-6, eq > ek ? eq : ek);
    CHECKF(eq < 1e-6 && ek < 1e-6, "qk norm rel L2 %.3g %.3g", eq, ek);
    cudaFree(dq); cudaFree(dk_);
    free(q); free(k); free(q2); free(k2);
}

/* Delta rule: outputs and final state against k3c_kda_recurrent (rel L2 < 1e-5), per-token states too, and
 * the chunked entry against k3c_kda_chunked (chunk 64) over lengths crossing chunk boundaries (rel L2 < 1e-4). */
static void delta_case(int H, int dk, int dv, int T, int chunked) {
    k3c_rng r = rng_for("delta");
    size_t nk = (size_t)T * H * dk, nv = (size_t)T * H * dv, ns = (size_t)H * dk * dv;
    float *q = fmalloc(nk), *k = fmalloc(nk), *v = fmalloc(nv), *g = fmalloc(nk), *beta = fmalloc((size_t)T * H);
    float *S = fmalloc(ns), *Sref = fmalloc(ns), *o = fmalloc(nv), *oref = fmalloc(nv);
    fill_normal(&r, q, nk, 1.0f);
    fill_normal(&r, k, nk, 1.0f);
    fill_normal(&r, v, nv, 1.0f);
    fill_normal(&r, S, ns, 0.3f);
    for (size_t i = 0; i < nk; i++) g[i] = -5.0f * (float)k3c_rng_uniform(&r) * (float)k3c_rng_uniform(&r);
    for (int i = 0; i < T * H; i++) beta[i] = (float)k3c_rng_uniform(&r);
    k3c_kda_qk_norm(q, k, T, H, dk);
    float *dq = dev_upload(q, nk * 4), *dk_ = dev_upload(k, nk * 4), *dv_ = dev_upload(v, nv * 4);
    float *dg = dev_upload(g, nk * 4), *dbeta = dev_upload(beta, (size_t)T * H * 4), *dS = dev_upload(S, ns * 4);
    float *dout = dev_poisoned(nv * 4), *dstates = chunked ? NULL : dev_poisoned(ns * T * 4);
    CHECK(dq && dk_ && dv_ && dg && dbeta && dS && dout && (chunked || dstates));
    memcpy(Sref, S, ns * 4);
    float *sref = chunked ? NULL : fmalloc(ns * T);
    if (chunked) k3c_kda_chunked(Sref, q, k, v, g, beta, T, H, dk, dv, 64, oref);
    else k3c_kda_recurrent(Sref, q, k, v, g, beta, T, H, dk, dv, oref, sref);
    if (chunked) CHECK_OK(k3c_cuda_kda_chunked(dS, dq, dk_, dv_, dg, dbeta, T, H, dk, dv, 64, 0, dout, 0));
    else CHECK_OK(k3c_cuda_kda_recurrent(dS, dq, dk_, dv_, dg, dbeta, T, H, dk, dv, 0, dout, dstates, 0));
    CHECK(dev_download(o, dout, nv * 4) == 0);
    CHECK(dev_download(S, dS, ns * 4) == 0);
    double tol = chunked ? 1e-4 : 1e-5;
    double eo = rel_l2_f32f32(o, oref, nv), es = rel_l2_f32f32(S, Sref, ns);
    note(chunked ? "kda_chunked(o,state)" : "kda_recurrent(o,state)", tol, eo > es ? eo : es);
    CHECKF(eo < tol && es < tol, "H %d dk %d dv %d T %d chunked %d: o rel L2 %.3g, state %.3g", H, dk, dv, T, chunked,
           eo, es);
    if (!chunked) {
        float *st = fmalloc(ns * T);
        CHECK(dev_download(st, dstates, ns * T * 4) == 0);
        double e = rel_l2_f32f32(st, sref, ns * T);
        CHECKF(e < tol, "per-token states rel L2 %.3g", e);
        free(st);
        free(sref);
        cudaFree(dstates);
    }
    cudaFree(dq); cudaFree(dk_); cudaFree(dv_); cudaFree(dg); cudaFree(dbeta); cudaFree(dS); cudaFree(dout);
    free(q); free(k); free(v); free(g); free(beta); free(S); free(Sref); free(o); free(oref);
}

TEST(gpu_kda_recurrent) {
    static const int T_l[] = {1, 2, 3, 5, 8};
    for (int i = 0; i < 5; i++) delta_case(3, 128, 128, T_l[i], 0);
    delta_case(2, 64, 32, 7, 0);
    delta_case(1, 32, 96, 4, 0);
}

TEST(gpu_kda_chunked) {
    static const int T_l[] = {1, 63, 64, 65, 130};
    for (int i = 0; i < 5; i++) delta_case(2, 128, 128, T_l[i], 1);
}

/* Gated output norm, sigmoid and silu gates: rel L2 < 1e-6. */
TEST(gpu_kda_gated_norm) {
    k3c_rng r = rng_for("gnorm");
    int T = 3, H = 5, dv = 128;
    size_t n = (size_t)T * H * dv;
    for (int silu = 0; silu < 2; silu++) {
        float *o = fmalloc(n), *z = fmalloc(n), *w = fmalloc(dv), *ref = fmalloc(n), *y = fmalloc(n);
        fill_normal(&r, o, n, 1.0f);
        fill_normal(&r, z, n, 2.0f);
        fill_normal(&r, w, dv, 1.0f);
        k3c_kda_gated_norm(o, z, w, T, H, dv, 1e-5f, silu, ref);
        float *d_o = dev_upload(o, n * 4), *dz = dev_upload(z, n * 4), *dw = dev_upload(w, (size_t)dv * 4);
        float *dy = dev_poisoned(n * 4);
        CHECK(d_o && dz && dw && dy);
        CHECK_OK(k3c_cuda_kda_gated_norm(d_o, dz, dw, T, H, dv, 1e-5f, silu, 0, dy, 0));
        CHECK(dev_download(y, dy, n * 4) == 0);
        double e = rel_l2_f32f32(y, ref, n);
        note("kda_gated_norm", 1e-6, e);
        CHECKF(e < 1e-6, "silu %d: rel L2 %.3g", silu, e);
        cudaFree(d_o); cudaFree(dz); cudaFree(dw); cudaFree(dy);
        free(o); free(z); free(w); free(ref); free(y);
    }
}

/* ---- MLA ---- */

/* Two requests in one step (a 5-row prefill from position 0 and a 1-row decode at position 37), block size
 * 16 with shuffled block tables, so rows cross block boundaries; bf16 and f32 caches. absorb_q, attention
 * and absorb_o against a double-precision-free CPU path (k3c_mla_attend on the latents the cache holds):
 * rel L2 < 1e-5. */
static void mla_case(int Hm, int nope, int rope, int vh, int kvl, int eb) {
    k3c_rng r = rng_for("mla");
    int bs = 16, nblocks = 8, Lat = kvl + rope, qh = nope + rope;
    int seg_pos[2] = {0, 37}, seg_n[2] = {5, 1}, T = 6;
    int tables[2][4];
    int perm[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int i = 7; i > 0; i--) {
        int j = (int)(k3c_rng_next(&r) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 4; i++) tables[s][i] = perm[s * 4 + i];
    /* Earlier positions of request 1 (0..36) are already cached; this step writes its row 37 and rows 0..4 of
     * request 0. Host mirror of the cache in f32 (values the device cache holds). */
    size_t cache_elems = (size_t)nblocks * bs * Lat;
    float *cache = fmalloc(cache_elems);
    fill_normal(&r, cache, cache_elems, 1.0f);
    if (eb == 2) round_host(cache, cache_elems);
    void *dcache;
    if (eb == 2) {
        uint16_t *cb = malloc(cache_elems * 2);
        for (size_t i = 0; i < cache_elems; i++) cb[i] = f32_to_bf16(cache[i]);
        dcache = dev_upload(cb, cache_elems * 2);
        free(cb);
    } else {
        dcache = dev_upload(cache, cache_elems * 4);
    }
    float *lat = fmalloc((size_t)T * Lat), *q = fmalloc((size_t)T * Hm * qh);
    fill_normal(&r, lat, (size_t)T * Lat, 1.0f);
    round_host(lat, (size_t)T * Lat);
    fill_normal(&r, q, (size_t)T * Hm * qh, 1.0f);
    size_t nkvb = (size_t)Hm * (nope + vh) * kvl;
    uint16_t *kvb = malloc(nkvb * 2);
    fill_bf16(&r, kvb, nkvb, 0.1f);
    int slots[6], toff[6], lens[6], flat[8];
    for (int s = 0, row = 0; s < 2; s++)
        for (int i = 0; i < seg_n[s]; i++, row++) {
            int p = seg_pos[s] + i;
            slots[row] = tables[s][p / bs] * bs + p % bs;
            toff[row] = 4 * s;
            lens[row] = p + 1;
            memcpy(cache + (size_t)slots[row] * Lat, lat + (size_t)row * Lat, (size_t)Lat * 4);
        }
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 4; i++) flat[4 * s + i] = tables[s][i];
    /* CPU reference: absorb q, attend over each request's latents in position order, absorb o. */
    float *qabs = fmalloc((size_t)T * Hm * Lat), *olat = fmalloc((size_t)T * Hm * kvl), *oref = fmalloc((size_t)T * Hm * vh);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hm; h++) {
            for (int c = 0; c < kvl; c++) {
                float acc = 0.0f;
                for (int i = 0; i < nope; i++)
                    acc += q[(size_t)t * Hm * qh + h * qh + i] * bf16_to_f32(kvb[((size_t)h * (nope + vh) + i) * kvl + c]);
                qabs[((size_t)t * Hm + h) * Lat + c] = acc;
            }
            for (int i = 0; i < rope; i++)
                qabs[((size_t)t * Hm + h) * Lat + kvl + i] = q[(size_t)t * Hm * qh + h * qh + nope + i];
        }
    float scale = 1.0f / sqrtf((float)qh);
    float *rows = fmalloc((size_t)64 * Lat);
    for (int s = 0, row0 = 0; s < 2; s++) {
        int len = seg_pos[s] + seg_n[s];
        for (int p = 0; p < len; p++)
            memcpy(rows + (size_t)p * Lat, cache + ((size_t)tables[s][p / bs] * bs + p % bs) * Lat, (size_t)Lat * 4);
        k3c_mla_attend(qabs + (size_t)row0 * Hm * Lat, seg_n[s], Hm, kvl, rope, rows, seg_pos[s], scale,
                       olat + (size_t)row0 * Hm * kvl);
        row0 += seg_n[s];
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hm; h++)
            for (int e = 0; e < vh; e++) {
                float acc = 0.0f;
                for (int c = 0; c < kvl; c++)
                    acc += bf16_to_f32(kvb[((size_t)h * (nope + vh) + nope + e) * kvl + c]) * olat[((size_t)t * Hm + h) * kvl + c];
                oref[(size_t)t * Hm * vh + h * vh + e] = acc;
            }
    /* GPU */
    float *dlat = dev_upload(lat, (size_t)T * Lat * 4), *dq = dev_upload(q, (size_t)T * Hm * qh * 4);
    int *dslots = dev_upload(slots, sizeof slots), *dtoff = dev_upload(toff, sizeof toff);
    int *dlens = dev_upload(lens, sizeof lens), *dflat = dev_upload(flat, sizeof flat);
    uint16_t *dkvb = dev_upload(kvb, nkvb * 2);
    float *dqabs = dev_poisoned((size_t)T * Hm * Lat * 4), *dolat = dev_poisoned((size_t)T * Hm * kvl * 4);
    float *dout = dev_poisoned((size_t)T * Hm * vh * 4);
    CHECK(dcache && dlat && dq && dslots && dtoff && dlens && dflat && dkvb && dqabs && dolat && dout);
    CHECK_OK(k3c_cuda_mla_cache_write(dlat, dslots, T, Lat, eb, dcache, 0));
    CHECK_OK(k3c_cuda_mla_absorb_q(dkvb, dq, T, Hm, nope, rope, vh, kvl, dqabs, 0));
    /* attention twice: one block per row and head (no scratch), then split over positions (most splits hold
     * a position or none at these lengths: the empty-split path), both against the reference */
    size_t npart = k3c_cuda_mla_attend_split_floats(kvl);
    float *dpart = dev_poisoned(npart * 4), *got = fmalloc((size_t)T * Hm * Lat);
    CHECK(dpart && got);
    CHECK_OK(k3c_cuda_mla_attend(dqabs, dtoff, dlens, dflat, bs, dcache, eb, T, Hm, kvl, rope, scale, dolat, NULL, 0,
                                 0));
    CHECK(dev_download(got, dolat, (size_t)T * Hm * kvl * 4) == 0);
    double e0 = rel_l2_f32f32(got, olat, (size_t)T * Hm * kvl);
    note("mla_attend(paged,one_split)", 1e-5, e0);
    CHECKF(e0 < 1e-5, "Hm %d kvl %d rope %d eb %d: o_lat without splits %.3g", Hm, kvl, rope, eb, e0);
    CHECK(cudaMemset(dolat, 0xff, (size_t)T * Hm * kvl * 4) == cudaSuccess);
    CHECK_OK(k3c_cuda_mla_attend(dqabs, dtoff, dlens, dflat, bs, dcache, eb, T, Hm, kvl, rope, scale, dolat, dpart,
                                 npart, 0));
    CHECK_OK(k3c_cuda_mla_absorb_o(dkvb, dolat, T, Hm, nope, vh, kvl, 0, dout, 0));
    cudaFree(dpart);
    CHECK(dev_download(got, dqabs, (size_t)T * Hm * Lat * 4) == 0);
    double e1 = rel_l2_f32f32(got, qabs, (size_t)T * Hm * Lat);
    CHECK(dev_download(got, dolat, (size_t)T * Hm * kvl * 4) == 0);
    double e2 = rel_l2_f32f32(got, olat, (size_t)T * Hm * kvl);
    CHECK(dev_download(got, dout, (size_t)T * Hm * vh * 4) == 0);
    double e3 = rel_l2_f32f32(got, oref, (size_t)T * Hm * vh);
    note("mla_absorb_q", 1e-5, e1);
    note("mla_attend(paged)", 1e-5, e2);
    note("mla_absorb_o", 1e-5, e3);
    CHECKF(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5, "Hm %d kvl %d rope %d eb %d: q_abs %.3g o_lat %.3g o %.3g", Hm, kvl, rope,
           eb, e1, e2, e3);
    cudaFree(dcache); cudaFree(dlat); cudaFree(dq); cudaFree(dslots); cudaFree(dtoff); cudaFree(dlens);
    cudaFree(dflat); cudaFree(dkvb); cudaFree(dqabs); cudaFree(dolat); cudaFree(dout);
    free(cache); free(lat); free(q); free(kvb); free(qabs); free(olat); free(oref); free(rows); free(got);
}

TEST(gpu_mla) {
    mla_case(3, 16, 32, 16, 64, 2);
    mla_case(3, 16, 32, 16, 64, 4);
    mla_case(4, 128, 64, 128, 512, 2); /* K3's head dims */
    mla_case(1, 8, 0, 8, 32, 4);
}
