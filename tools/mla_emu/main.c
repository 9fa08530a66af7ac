/* Drives the expanded MLA launcher (cuda/mla_expanded.cu, with gemm.cu's streaming kernels: gemm NULL) and the
 * absorbed MLA kernels (cuda/mla.cu) under the emulator, against the CPU library:
 *  - expanded: the shapes of tests/gpu/test_gpu_mla_expanded.c gpu_mla_expanded_kernel (row counts 1, 3, 17,
 *    130, 300 from 0 and as continuations, block sizes 4 / 5 / 16 with shuffled tables, bf16 / f32 caches as
 *    the test picks them, plus an fp8 E4M3 run of every case, passes of the whole context, 48 and 100
 *    positions, round on and off) vs k3c_mla_attend_expanded (on the E4M3-rounded latents for fp8), the GPU
 *    test's metric and thresholds (rel L2 1e-5 f32, 5e-3 bf16); outputs and scratch NaN-poisoned, a poisoned
 *    row either side of the segment must stay untouched;
 *  - absorbed: k3c_cuda_mla_cache_write (cache bytes compared exactly with util/fp8.h / util/bf16.h, specials
 *    included), absorb_q, k3c_cuda_mla_attend and absorb_o for elem_bytes 1 / 2 / 4 vs the CPU absorbed
 *    attention (k3c_mla_attend) on the latents the cache holds (test_gpu_kernels.c mla_case's layout);
 *  - fp8: the emulated conversions vs util/fp8.h on every f32 and every byte (emu_fp8_selfcheck).
 * Usage: emu [quick|all|fp8] (quick: tiny dims + K3 dims without the 300-row cases; all: everything, incl.
 * 96 heads). EMU_ONLY=substring of a case line selects cases. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/ops.h"
#include "cuda/mla.h"
#include "cuda/mla_expanded.h"
#include "gpu_util.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/fp8.h"

extern int emu_cp_delay, emu_shuffle;
int emu_fp8_selfcheck(void);

static int failures, cases_run;

static double rel_l2(const float *x, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isnan(ref[i])) return INFINITY;
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static void poison(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static int all_poison(const float *x, size_t n) {
    const uint32_t *u = (const uint32_t *)x;
    for (size_t i = 0; i < n; i++)
        if (u[i] != 0xffffffffu) return 0;
    return 1;
}
static void shuffle(k3c_rng *r, int32_t *a, int n) {
    for (int i = 0; i < n; i++) a[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(k3c_rng_next(r) % (uint64_t)(i + 1));
        int32_t t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

typedef struct xshape {
    int Hm, nope, rope, vh, kvl;
} xshape;

static double worst[3][2]; /* [eb 1/2/4][round] */
static int eb_slot(int eb) { return eb == 1 ? 0 : eb == 2 ? 1 : 2; }

/* tests/gpu/test_gpu_mla_expanded.c launcher_case, with the fp8 element and gemm NULL. */
static void expanded_case(const xshape *s, int n, int pos, int bs, int eb, int round, const int *chunks, int nchunks,
                          k3c_rng *r) {
    char name[160];
    snprintf(name, sizeof name, "expanded H%d nope%d rope%d v%d kvl%d n%d pos%d bs%d cache %s %s", s->Hm, s->nope,
             s->rope, s->vh, s->kvl, n, pos, bs, eb == 1 ? "fp8 " : eb == 2 ? "bf16" : "f32 ", round ? "bf16" : "f32 ");
    const char *only = getenv("EMU_ONLY");
    if (only && !strstr(name, only)) return;
    int N = pos + n, Lat = s->kvl + s->rope, qh = s->nope + s->rope, nb = (N + bs - 1) / bs, nblocks = nb + 3;
    size_t ncache = (size_t)nblocks * bs * Lat, nq = (size_t)n * s->Hm * qh, no = (size_t)n * s->Hm * s->vh;
    size_t nkvb = (size_t)s->Hm * (s->nope + s->vh) * s->kvl, rowo = (size_t)s->Hm * s->vh;
    float *cache = fmalloc(ncache), *q = fmalloc(nq), *ref = fmalloc(no), *got = fmalloc(no + 2 * rowo);
    uint16_t *kvb = malloc(nkvb * 2), *cbf = malloc(ncache * 2);
    uint8_t *c8 = malloc(ncache);
    int32_t *table = malloc(sizeof(int32_t) * nblocks);
    shuffle(r, table, nblocks);
    fill_bf16(r, kvb, nkvb, (float)(1.0 / sqrt((double)s->kvl)));
    poison(cache, ncache); /* positions >= N must never be read */
    for (int p = 0; p < N; p++) {
        float *row = cache + ((size_t)table[p / bs] * bs + p % bs) * Lat;
        for (int e = 0; e < Lat; e++) row[e] = bf16_round((float)k3c_rng_normal(r));
    }
    for (size_t i = 0; i < nq; i++) q[i] = bf16_round((float)(2.0 * k3c_rng_normal(r)));
    if (eb == 1) /* the device holds E4M3 bytes; the reference sees the values they decode to */
        for (size_t i = 0; i < ncache; i++) {
            c8[i] = k3c_f32_to_e4m3(cache[i]);
            if (!isnan(cache[i])) cache[i] = k3c_e4m3_to_f32(c8[i]);
        }
    k3c_mat W = {kvb, s->Hm * (s->nope + s->vh), s->kvl};
    float scale = 1.0f / sqrtf((float)qh);
    poison(ref, no);
    k3c_mla_attend_expanded(q, n, s->Hm, 0, s->Hm, s->nope, s->rope, s->vh, s->kvl, &W, cache, table, bs, pos, scale,
                            round, ref);
    if (round)
        for (size_t i = 0; i < no; i++) ref[i] = bf16_round(ref[i]);
    void *dcache;
    if (eb == 2) {
        for (size_t i = 0; i < ncache; i++) cbf[i] = isnan(cache[i]) ? 0xffffu : f32_to_bf16(cache[i]);
        dcache = dev_upload(cbf, ncache * 2);
    } else if (eb == 1) {
        dcache = dev_upload(c8, ncache);
    } else {
        dcache = dev_upload(cache, ncache * 4);
    }
    float *dq = dev_upload(q, nq * 4), *dout = dev_poisoned((no + 2 * rowo) * 4);
    uint16_t *dkvb = dev_upload(kvb, nkvb * 2);
    int *dtab = dev_upload(table, sizeof(int32_t) * nb);
    double thr = round ? 5e-3 : 1e-5, w = 0;
    int ok = 1;
    char why[256] = "";
    clock_t c0 = clock();
    for (int ci = 0; ci < nchunks && ok; ci++) {
        int chunk = chunks[ci] > 0 ? chunks[ci] : N;
        size_t sb = k3c_cuda_mla_expanded_scratch_bytes(chunk, n, s->Hm, s->nope, s->rope, s->vh, s->kvl);
        void *dscr = dev_poisoned(sb);
        cudaMemset(dout, 0xff, (no + 2 * rowo) * 4);
        if (k3c_cuda_mla_expanded(NULL, dkvb, dq, n, pos, dtab, bs, dcache, eb, s->Hm, s->nope, s->rope, s->vh,
                                  s->kvl, scale, round, dscr, chunk, n, dout + rowo, 0) != K3C_OK) {
            snprintf(why, sizeof why, "chunk %d: launcher: %s", chunk, k3c_error_message());
            ok = 0;
        } else {
            dev_download(got, dout, (no + 2 * rowo) * 4);
            double e = rel_l2(got + rowo, ref, no);
            if (!(e <= w)) w = e;
            if (!all_poison(got, rowo) || !all_poison(got + rowo + no, rowo))
                snprintf(why, sizeof why, "chunk %d: rows outside the segment were written", chunk), ok = 0;
            else if (!(e <= thr))
                snprintf(why, sizeof why, "chunk %d: rel L2 %.3e > %.0e", chunk, e, thr), ok = 0;
        }
        cudaFree(dscr);
    }
    double secs = (double)(clock() - c0) / CLOCKS_PER_SEC;
    double *ws = &worst[eb_slot(eb)][round];
    if (!(w <= *ws)) *ws = w;
    cases_run++;
    failures += !ok;
    printf("%-80s passes %d  rel L2 %.2e (thr %.0e) %s %s [%.1fs]\n", name, nchunks, w, thr, ok ? "ok" : "FAIL", why,
           secs);
    fflush(stdout);
    cudaFree(dcache), cudaFree(dq), cudaFree(dkvb), cudaFree(dtab), cudaFree(dout);
    free(cache), free(q), free(ref), free(got), free(kvb), free(cbf), free(c8), free(table);
}

/* E4M3 / bf16 / f32 value of v as the cache element eb holds it (NaN kept). */
static float held(float v, int eb) {
    return eb == 1 ? k3c_e4m3_round(v) : eb == 2 ? (isnan(v) ? v : bf16_round(v)) : v;
}

/* k3c_cuda_mla_cache_write alone: every element byte-exact with the host codec, specials included (ties,
 * 448 / 464 / 480, inf, subnormals, -0, NaN); a negative slot skipped; other slots untouched. */
static void cache_write_case(int eb, k3c_rng *r) {
    int T = 7, Lat = 200, nslots = 12;
    static const float sp[] = {0.0f, -0.0f, 448.0f, 449.0f, 463.99f, 464.0f, 464.01f, 480.0f, -500.0f, INFINITY,
                               -INFINITY, NAN, 1e30f, 0.015625f, 0.0146484375f, 0.001953125f, 0.0009765625f,
                               0.00097656256f, 0.0029296875f, 1.0625f, 1.1875f, -3.25f, 0.00048828125f, 1e-30f};
    int nsp = (int)(sizeof sp / sizeof *sp);
    float *lat = fmalloc((size_t)T * Lat);
    for (size_t i = 0; i < (size_t)T * Lat; i++)
        lat[i] = i < (size_t)nsp ? sp[i] : (float)(k3c_rng_normal(r) * ldexp(1.0, (int)(i % 23) - 12));
    int slots[7] = {3, 0, -1, 11, 5, 7, 1};
    size_t nc = (size_t)nslots * Lat * eb;
    unsigned char *host = malloc(nc), *want = malloc(nc);
    memset(want, 0x5c, nc);
    for (int t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        for (int i = 0; i < Lat; i++) {
            float v = lat[(size_t)t * Lat + i];
            size_t at = (size_t)slots[t] * Lat + i;
            if (eb == 1) want[at] = k3c_f32_to_e4m3(v);
            else if (eb == 2) {
                uint16_t b = f32_to_bf16(v);
                memcpy(want + 2 * at, &b, 2);
            } else
                memcpy(want + 4 * at, &v, 4);
        }
    }
    float *dlat = dev_upload(lat, (size_t)T * Lat * 4);
    int *dslots = dev_upload(slots, sizeof slots);
    void *dc = NULL;
    cudaMalloc(&dc, nc);
    cudaMemset(dc, 0x5c, nc);
    int ok = k3c_cuda_mla_cache_write(dlat, dslots, T, Lat, eb, dc, 0) == K3C_OK && dev_download(host, dc, nc) == 0;
    int diff = 0, nan_sign = 0;
    for (size_t i = 0; ok && i < nc; i++)
        if (host[i] != want[i]) {
            /* a negative NaN: util/fp8.h keeps the sign (0xff), the hardware gives the canonical 0x7f */
            if (eb == 1 && host[i] == 0x7f && (want[i] & 0x7f) == 0x7f) nan_sign++;
            else diff++;
        }
    ok = ok && diff == 0;
    cases_run++;
    failures += !ok;
    printf("%-80s %d bytes differ%s  %s\n",
           eb == 1 ? "cache_write fp8 (24 specials, 1376 normal at 2^-12..2^10)" : eb == 2 ? "cache_write bf16" : "cache_write f32", diff,
           nan_sign ? " (NaN sign only)" : "", ok ? "ok" : "FAIL");
    cudaFree(dlat), cudaFree(dslots), cudaFree(dc);
    free(lat), free(host), free(want);
}

/* test_gpu_kernels.c mla_case with elem_bytes eb: two requests (a 5-row prefill at 0 and a 1-row decode at
 * 37, or longer ones), block size 16, shuffled tables; the step's latents written by cache_write. */
static void absorbed_case(int Hm, int nope, int rope, int vh, int kvl, int eb, int n0, int pos1, k3c_rng *r) {
    char name[160];
    snprintf(name, sizeof name, "absorbed H%d nope%d rope%d v%d kvl%d eb%d rows %d@0 + 1@%d", Hm, nope, rope, vh, kvl,
             eb, n0, pos1);
    const char *only = getenv("EMU_ONLY");
    if (only && !strstr(name, only)) return;
    int bs = 16, Lat = kvl + rope, qh = nope + rope;
    int seg_pos[2] = {0, pos1}, seg_n[2] = {n0, 1}, T = n0 + 1;
    int per = (pos1 + 1 + bs - 1) / bs, per0 = (n0 + bs - 1) / bs;
    if (per0 > per) per = per0;
    int nblocks = 2 * per;
    int32_t *perm = malloc(sizeof(int32_t) * nblocks), *flat = perm;
    shuffle(r, perm, nblocks);
    size_t cache_elems = (size_t)nblocks * bs * Lat;
    float *cache = fmalloc(cache_elems);
    fill_normal(r, cache, cache_elems, 1.0f);
    for (size_t i = 0; i < cache_elems; i++) cache[i] = held(cache[i], eb);
    float *lat = fmalloc((size_t)T * Lat), *q = fmalloc((size_t)T * Hm * qh);
    fill_normal(r, lat, (size_t)T * Lat, 1.0f);
    fill_normal(r, q, (size_t)T * Hm * qh, 1.0f);
    size_t nkvb = (size_t)Hm * (nope + vh) * kvl;
    uint16_t *kvb = malloc(nkvb * 2);
    fill_bf16(r, kvb, nkvb, 0.1f);
    int *slots = malloc(sizeof(int) * T), *toff = malloc(sizeof(int) * T), *lens = malloc(sizeof(int) * T);
    void *dcache = NULL;
    {
        unsigned char *cb = malloc(cache_elems * 4);
        for (size_t i = 0; i < cache_elems; i++) {
            if (eb == 1) cb[i] = k3c_f32_to_e4m3(cache[i]);
            else if (eb == 2) ((uint16_t *)cb)[i] = f32_to_bf16(cache[i]);
            else ((float *)cb)[i] = cache[i];
        }
        dcache = dev_upload(cb, cache_elems * eb);
        free(cb);
    }
    for (int s = 0, row = 0; s < 2; s++)
        for (int i = 0; i < seg_n[s]; i++, row++) {
            int p = seg_pos[s] + i;
            slots[row] = perm[s * per + p / bs] * bs + p % bs;
            toff[row] = per * s;
            lens[row] = p + 1;
            for (int x = 0; x < Lat; x++) cache[(size_t)slots[row] * Lat + x] = held(lat[(size_t)row * Lat + x], eb);
        }
    float *qabs = fmalloc((size_t)T * Hm * Lat), *olat = fmalloc((size_t)T * Hm * kvl), *oref = fmalloc((size_t)T * Hm * vh);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hm; h++) {
            for (int c = 0; c < kvl; c++) {
                float acc = 0.0f;
                for (int i = 0; i < nope; i++)
                    acc += q[(size_t)t * Hm * qh + h * qh + i] * bf16_to_f32(kvb[((size_t)h * (nope + vh) + i) * kvl + c]);
                qabs[((size_t)t * Hm + h) * Lat + c] = acc;
            }
            for (int i = 0; i < rope; i++) qabs[((size_t)t * Hm + h) * Lat + kvl + i] = q[(size_t)t * Hm * qh + h * qh + nope + i];
        }
    float scale = 1.0f / sqrtf((float)qh);
    float *rows = fmalloc((size_t)per * bs * Lat);
    for (int s = 0, row0 = 0; s < 2; s++) {
        int len = seg_pos[s] + seg_n[s];
        for (int p = 0; p < len; p++)
            memcpy(rows + (size_t)p * Lat, cache + ((size_t)perm[s * per + p / bs] * bs + p % bs) * Lat, (size_t)Lat * 4);
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
    float *dlat = dev_upload(lat, (size_t)T * Lat * 4), *dq = dev_upload(q, (size_t)T * Hm * qh * 4);
    int *dslots = dev_upload(slots, sizeof(int) * T), *dtoff = dev_upload(toff, sizeof(int) * T);
    int *dlens = dev_upload(lens, sizeof(int) * T), *dflat = dev_upload(flat, sizeof(int32_t) * nblocks);
    uint16_t *dkvb = dev_upload(kvb, nkvb * 2);
    float *dqabs = dev_poisoned((size_t)T * Hm * Lat * 4), *dolat = dev_poisoned((size_t)T * Hm * kvl * 4);
    float *dout = dev_poisoned((size_t)T * Hm * vh * 4);
    /* the attention split over positions (as the backend and the executor run it), or with EMU_NOSPLIT=1 one
     * block per row and head */
    int nosplit = getenv("EMU_NOSPLIT") && atoi(getenv("EMU_NOSPLIT"));
    size_t npart = nosplit ? 0 : k3c_cuda_mla_attend_split_floats(kvl);
    float *dpart = npart ? dev_poisoned(npart * 4) : NULL;
    int ok = k3c_cuda_mla_cache_write(dlat, dslots, T, Lat, eb, dcache, 0) == K3C_OK &&
             k3c_cuda_mla_absorb_q(dkvb, dq, T, Hm, nope, rope, vh, kvl, dqabs, 0) == K3C_OK &&
             k3c_cuda_mla_attend(dqabs, dtoff, dlens, dflat, bs, dcache, eb, T, Hm, kvl, rope, scale, dolat, dpart,
                                 npart, 0) == K3C_OK &&
             k3c_cuda_mla_absorb_o(dkvb, dolat, T, Hm, nope, vh, kvl, 0, dout, 0) == K3C_OK;
    float *got = fmalloc((size_t)T * Hm * Lat);
    double e1 = INFINITY, e2 = INFINITY, e3 = INFINITY;
    if (ok) {
        dev_download(got, dqabs, (size_t)T * Hm * Lat * 4);
        e1 = rel_l2(got, qabs, (size_t)T * Hm * Lat);
        dev_download(got, dolat, (size_t)T * Hm * kvl * 4);
        e2 = rel_l2(got, olat, (size_t)T * Hm * kvl);
        dev_download(got, dout, (size_t)T * Hm * vh * 4);
        e3 = rel_l2(got, oref, (size_t)T * Hm * vh);
    }
    ok = ok && e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5;
    cases_run++;
    failures += !ok;
    printf("%-80s q_abs %.2e o_lat %.2e o %.2e (thr 1e-05) %s\n", name, e1, e2, e3, ok ? "ok" : "FAIL");
    fflush(stdout);
    cudaFree(dcache); cudaFree(dlat); cudaFree(dq); cudaFree(dslots); cudaFree(dtoff); cudaFree(dlens);
    cudaFree(dflat); cudaFree(dkvb); cudaFree(dqabs); cudaFree(dolat); cudaFree(dout); if (dpart) cudaFree(dpart);
    free(perm); free(cache); free(lat); free(q); free(kvb); free(slots); free(toff); free(lens); free(qabs);
    free(olat); free(oref); free(rows); free(got);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "quick";
    const char *e;
    if ((e = getenv("EMU_CP"))) emu_cp_delay = strcmp(e, "delay") == 0;
    if ((e = getenv("EMU_SHUFFLE"))) emu_shuffle = atoi(e);
    int all = strcmp(mode, "all") == 0;
    if (strcmp(mode, "fp8") == 0) return emu_fp8_selfcheck() != 0;
    k3c_rng r;
    k3c_rng_seed(&r, getenv("EMU_SEED") ? strtoull(getenv("EMU_SEED"), NULL, 0) : 0x6d6c61656d75ull);
    printf("mla_emu: mode %s, shuffle %d\n", mode, emu_shuffle);
    for (int eb = 1; eb <= 4; eb *= 2) cache_write_case(eb, &r);
    for (int eb = 1; eb <= 4; eb *= 2) {
        absorbed_case(3, 16, 32, 16, 64, eb, 5, 37, &r);
        absorbed_case(4, 128, 64, 128, 512, eb, 5, 37, &r);
        absorbed_case(2, 32, 32, 32, 128, eb, 40, 150, &r);
    }
    /* 64 rows over 40 heads at kvl 512: the absorptions' blocks then take several 8-token tiles each (absorb_q
     * 32 tokens a block, absorb_o 16 with 132 SMs), weights held across tiles */
    absorbed_case(40, 32, 32, 32, 512, 2, 63, 70, &r);
    /* the head-group attention (mla_attend_hg_kernel): 96 heads = 6 groups of 16 with a long row split over
     * positions (and merged), per element size; 20 heads = 2 groups of 12 (8 + 2 heads past Hm); 6 heads = one
     * group of 8; kvl 704 + rope 64 (Lat 768: groups of 8, 88 value chunks); 8 rows x 96 heads with 2 splits */
    for (int eb = 1; eb <= 4; eb *= 2) absorbed_case(96, 32, 64, 32, 512, eb, 1, 300, &r);
    absorbed_case(20, 16, 32, 16, 64, 2, 9, 200, &r);
    absorbed_case(6, 16, 32, 16, 128, 1, 3, 90, &r);
    absorbed_case(10, 16, 64, 16, 704, 2, 2, 100, &r);
    absorbed_case(96, 32, 64, 32, 512, 1, 7, 500, &r);
    /* the GPU test's shapes and cases */
    static const xshape shapes[] = {
        {4, 128, 64, 128, 512}, {2, 32, 32, 32, 128}, {3, 20, 8, 12, 40}, {2, 16, 0, 16, 48}, {2, 64, 32, 160, 96},
    };
    static const int cs[][2] = {{1, 0}, {3, 0}, {17, 0}, {130, 0}, {300, 0}, {1, 45}, {3, 7}, {17, 33}, {130, 61}, {300, 9}};
    static const int bss[] = {4, 5, 16};
    int k = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++, k++)
            for (int round = 0; round <= 1; round++) {
                int n = cs[ci][0], pos = cs[ci][1], bs = bss[k % 3], eb = (k + round) % 2 ? 2 : 4;
                const int chunks[] = {0, 48, 100};
                int nch = pos + n > 48 ? 3 : 1;
                if (!all && si == 0 && n == 300) continue;
                expanded_case(&shapes[si], n, pos, bs, eb, round, chunks, nch, &r);
                expanded_case(&shapes[si], n, pos, bs, 1, round, chunks, nch, &r); /* fp8 cache */
            }
    /* beyond the GPU test: a block's last row whose last key opens a new key tile (position = p0 mod 32),
     * the only place where the attention kernel's key-tile bound kend matters (33 rows from 0; 64 from 1:
     * a full row tile; 95 from 1 with passes of 48: both) */
    static const int xc[][2] = {{33, 0}, {64, 1}, {95, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int ci = 0; ci < 3; ci++)
            for (int round = 0; round <= 1; round++) {
                const int chunks[] = {0, 48, 100};
                expanded_case(&shapes[si], xc[ci][0], xc[ci][1], 4 + ci, round ? 2 : 4, round, chunks, 3, &r);
                expanded_case(&shapes[si], xc[ci][0], xc[ci][1], 4 + ci, 1, round, chunks, 3, &r);
            }
    if (all) { /* K3's 96 heads */
        static const xshape k3 = {96, 128, 64, 128, 512};
        const int chunks[] = {0, 100};
        for (int round = 0; round <= 1; round++) expanded_case(&k3, 17, 100, 16, round ? 2 : 4, round, chunks, 2, &r);
        expanded_case(&k3, 17, 100, 16, 1, 0, chunks, 2, &r);
    }
    static const char *ebn[3] = {"fp8", "bf16", "f32"};
    for (int s = 0; s < 3; s++)
        printf("worst expanded rel L2, %s cache: round off %.2e (thr 1e-5), round on %.2e (thr 5e-3)\n", ebn[s],
               worst[s][0], worst[s][1]);
    printf("mla_emu: %d case(s), %d failure(s)\n", cases_run, failures);
    return failures != 0;
}
