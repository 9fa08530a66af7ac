/* The expanded MLA form on the GPU (cuda/mla_expanded.h, the CUDA backend's mla_attention_expanded) against
 * the CPU's (cpu/ops.h k3c_mla_attend_expanded, the CPU backend's op), fresh random inputs per run
 * (test_seed()), outputs poisoned (NaN) before every launch; NaN anywhere fails.
 *
 * Thresholds (rel L2 over the compared rows):
 *  - f32 (no rounding: f32 cache, the f32 streaming product): only the f32 summation order differs: 1e-5
 *    (the CPU op itself is within 8e-7 of float64, tests/test_mla_expanded.c);
 *  - bf16 (k_nope, v and o rounded, cuBLASLt product): where the GPU's and the CPU's f32 sums of a value
 *    straddle a bf16 rounding boundary they round one ulp (2^-8 relative) apart; such flips are rare
 *    (f32 noise ~1e-7 against a 4e-3 ulp), so 5e-3 is generous; a wrong index gives O(1).
 * Cases print "METRIC <name> rel_l2 <threshold> <worst>" lines (tools/gpu-check.sh tabulates them). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/gemm.h"
#include "cuda/mla_expanded.h"
#include "gpu_util.h"
#include "k3c.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "backend/backend.h"
#include "../test.h"
#include "util/error.h"

#define THR_F32 1e-5
#define THR_BF16 5e-3

static struct { char name[48]; double thr, worst; } notes[32];
static int num_notes;

static void note(const char *name, double thr, double e) {
    int i = 0;
    while (i < num_notes && strcmp(notes[i].name, name) != 0) i++;
    if (i == num_notes) {
        if (num_notes == 32) return;
        snprintf(notes[i].name, sizeof notes[i].name, "%s", name);
        notes[i].thr = thr;
        notes[i].worst = 0.0;
        num_notes++;
    }
    if (!(e <= notes[i].worst)) notes[i].worst = e; /* NaN sticks */
}

__attribute__((destructor)) static void print_notes(void) {
    for (int i = 0; i < num_notes; i++)
        printf("METRIC %-28s rel_l2 %8.1e %10.3e\n", notes[i].name, notes[i].thr, notes[i].worst);
}

/* Whether n floats are all the 0xff poison bytes (never written). */
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

/* ---- launcher level ---- */

typedef struct xshape {
    int Hm, nope, rope, vh, kvl;
} xshape;

/* One segment: n query rows at positions pos .. pos + n - 1 over a paged cache (block size bs, shuffled
 * table, unused slots poisoned), element eb; round: the bf16 contract (cuBLASLt product) or f32 throughout
 * (gemm NULL). Each chunk of chunks[] (passes of that many positions; <= 0: one pass) is run against the same
 * CPU result. Returns 0, or -1 with a message in *why. */
static int launcher_case(const xshape *s, int n, int pos, int bs, int eb, int round, const int *chunks, int nchunks,
                         k3c_cuda_gemm *g, k3c_rng *r, double *worst, char *why, size_t why_n) {
    int N = pos + n, Lat = s->kvl + s->rope, qh = s->nope + s->rope, nb = (N + bs - 1) / bs, nblocks = nb + 3;
    size_t ncache = (size_t)nblocks * bs * Lat, nq = (size_t)n * s->Hm * qh, no = (size_t)n * s->Hm * s->vh;
    size_t nkvb = (size_t)s->Hm * (s->nope + s->vh) * s->kvl, rowo = (size_t)s->Hm * s->vh;
    float *cache = fmalloc(ncache), *q = fmalloc(nq), *ref = fmalloc(no), *got = fmalloc(no + 2 * rowo);
    uint16_t *kvb = malloc(nkvb * 2), *cbf = malloc(ncache * 2);
    int32_t *table = malloc(sizeof(int32_t) * nblocks);
    int rc = -1;
    void *dcache = NULL, *dscr = NULL;
    float *dq = NULL, *dout = NULL;
    uint16_t *dkvb = NULL;
    int *dtab = NULL;
    if (!cache || !q || !ref || !got || !kvb || !cbf || !table) {
        snprintf(why, why_n, "out of host memory");
        goto done;
    }
    shuffle(r, table, nblocks);
    fill_bf16(r, kvb, nkvb, (float)(1.0 / sqrt((double)s->kvl)));
    poison_f32(cache, ncache); /* positions >= N must never be read */
    for (int p = 0; p < N; p++) {
        float *row = cache + ((size_t)table[p / bs] * bs + p % bs) * Lat;
        for (int e = 0; e < Lat; e++) row[e] = bf16_round((float)k3c_rng_normal(r));
    }
    /* scores of a few units: a softmax far from uniform */
    for (size_t i = 0; i < nq; i++) q[i] = bf16_round((float)(2.0 * k3c_rng_normal(r)));
    k3c_mat W = {kvb, s->Hm * (s->nope + s->vh), s->kvl};
    float scale = 1.0f / sqrtf((float)qh);
    poison_f32(ref, no);
    k3c_mla_attend_expanded(q, n, s->Hm, 0, s->Hm, s->nope, s->rope, s->vh, s->kvl, &W, cache, table, bs, pos, scale,
                            round, ref);
    if (round)
        for (size_t i = 0; i < no; i++) ref[i] = bf16_round(ref[i]);

    if (eb == 2) {
        for (size_t i = 0; i < ncache; i++) cbf[i] = isnan(cache[i]) ? 0xffffu : f32_to_bf16(cache[i]);
        dcache = dev_upload(cbf, ncache * 2);
    } else {
        dcache = dev_upload(cache, ncache * 4);
    }
    dq = dev_upload(q, nq * 4);
    dkvb = dev_upload(kvb, nkvb * 2);
    dtab = dev_upload(table, sizeof(int32_t) * nb);
    dout = dev_poisoned((no + 2 * rowo) * 4); /* one poisoned row either side must stay untouched */
    if (!dcache || !dq || !dkvb || !dtab || !dout) {
        snprintf(why, why_n, "device allocation");
        goto done;
    }
    for (int ci = 0; ci < nchunks; ci++) {
        int chunk = chunks[ci] > 0 ? chunks[ci] : N;
        size_t sb = k3c_cuda_mla_expanded_scratch_bytes(chunk, n, s->Hm, s->nope, s->rope, s->vh, s->kvl);
        if (cudaMalloc(&dscr, sb) != cudaSuccess || cudaMemset(dscr, 0xff, sb) != cudaSuccess ||
            cudaMemset(dout, 0xff, (no + 2 * rowo) * 4) != cudaSuccess) {
            snprintf(why, why_n, "scratch of %zu bytes", sb);
            goto done;
        }
        if (k3c_cuda_mla_expanded(round ? g : NULL, dkvb, dq, n, pos, dtab, bs, dcache, eb, s->Hm, s->nope, s->rope,
                                  s->vh, s->kvl, scale, round, dscr, chunk, n, dout + rowo, 0) != K3C_OK) {
            snprintf(why, why_n, "launcher: %s", k3c_error_message());
            goto done;
        }
        if (dev_download(got, dout, (no + 2 * rowo) * 4) != 0) {
            snprintf(why, why_n, "download / kernel: %s", cudaGetErrorString(cudaGetLastError()));
            goto done;
        }
        cudaFree(dscr);
        dscr = NULL;
        double e = rel_l2_f32f32(got + rowo, ref, no);
        if (!(e <= *worst)) *worst = e;
        if (!all_poison(got, rowo) || !all_poison(got + rowo + no, rowo)) {
            snprintf(why, why_n, "chunk %d: rows outside the segment were written", chunk);
            goto done;
        }
        double thr = round ? THR_BF16 : THR_F32;
        if (!(e <= thr)) {
            snprintf(why, why_n, "chunk %d: rel L2 %.3e > %.0e", chunk, e, thr);
            goto done;
        }
    }
    rc = 0;
done:
    cudaFree(dcache), cudaFree(dq), cudaFree(dkvb), cudaFree(dtab), cudaFree(dout), cudaFree(dscr);
    free(cache), free(q), free(ref), free(got), free(kvb), free(cbf), free(table);
    return rc;
}

/* Shapes: K3's head dims with 4 and 96 heads, tiny's, dims that are not multiples of anything (tails in every
 * tile), no rope part, v wider than 128 (the 16-column kernel). Row counts 1, 3, 17, 130, 300 from position 0
 * and as continuations (pos > 0), block sizes 4 / 5 / 16 (contexts cross block boundaries), bf16 and f32
 * caches, one pass and passes of 48 / 100 positions (state carried between passes). */
TEST(gpu_mla_expanded_kernel) {
    static const xshape shapes[] = {
        {4, 128, 64, 128, 512}, {2, 32, 32, 32, 128}, {3, 20, 8, 12, 40}, {2, 16, 0, 16, 48}, {2, 64, 32, 160, 96},
    };
    static const int cases[][2] = {{1, 0}, {3, 0}, {17, 0}, {130, 0}, {300, 0},
                                   {1, 45}, {3, 7}, {17, 33}, {130, 61}, {300, 9}};
    static const int bss[] = {4, 5, 16};
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x6d6c6178ull);
    void *ws = NULL;
    uint16_t *xbf = NULL;
    size_t xbf_elems = (size_t)1 << 20;
    CHECK(cudaMalloc(&ws, 8 << 20) == cudaSuccess && cudaMalloc((void **)&xbf, xbf_elems * 2) == cudaSuccess);
    k3c_cuda_gemm g;
    CHECK_OK(k3c_cuda_gemm_init(&g, ws, 8 << 20, xbf, xbf_elems));
    char why[512];
    int k = 0, failed = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes && !failed; si++)
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases && !failed; ci++, k++)
            for (int round = 0; round <= 1 && !failed; round++) {
                int n = cases[ci][0], pos = cases[ci][1], bs = bss[k % 3], eb = (k + round) % 2 ? 2 : 4;
                const int chunks[] = {0, 48, 100};
                double worst = 0;
                if (launcher_case(&shapes[si], n, pos, bs, eb, round, chunks, pos + n > 48 ? 3 : 1, &g, &r, &worst,
                                  why, sizeof why) != 0)
                    failed = 1;
                note(round ? "mla_expanded_kernel_bf16" : "mla_expanded_kernel_f32", round ? THR_BF16 : THR_F32, worst);
                if (failed)
                    test_fail(__FILE__, __LINE__, "heads %d nope %d rope %d v %d kv_lora %d, n %d pos %d bs %d cache %s %s: %s",
                              shapes[si].Hm, shapes[si].nope, shapes[si].rope, shapes[si].vh, shapes[si].kvl, n, pos,
                              bs, eb == 2 ? "bf16" : "f32", round ? "bf16" : "f32", why);
            }
    /* K3's 96 heads (the per-GPU head count of the k3-slice preset): the grid's head dimension */
    static const xshape k3 = {96, 128, 64, 128, 512};
    for (int round = 0; round <= 1 && !failed; round++) {
        const int chunks[] = {0, 100};
        double worst = 0;
        if (launcher_case(&k3, 17, 100, 16, round ? 2 : 4, round, chunks, 2, &g, &r, &worst, why, sizeof why) != 0) {
            failed = 1;
            test_fail(__FILE__, __LINE__, "96 heads, n 17 pos 100 %s: %s", round ? "bf16" : "f32", why);
        }
        note(round ? "mla_expanded_kernel_bf16" : "mla_expanded_kernel_f32", round ? THR_BF16 : THR_F32, worst);
    }
    k3c_cuda_gemm_free(&g);
    cudaFree(ws), cudaFree(xbf);
}

/* ---- backend op level ---- */

typedef struct benv {
    char dir[512];
    k3c_model *m;
    k3c_backend *cpu, *gpu;
} benv;

static void benv_close(benv *e) {
    if (e->cpu) e->cpu->destroy(e->cpu);
    if (e->gpu) e->gpu->destroy(e->gpu);
    if (e->m) k3c_free(e->m);
    memset(e, 0, sizeof *e);
}

static int benv_open(benv *e, const char *preset, int exact, const k3c_backend_limits *lim) {
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "%s/gpumlax-%s%s", test_tmpdir(), preset, exact ? "-f32" : "");
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    int rc = k3c_synth_write(&c, preset, test_seed() ^ k3c_hash_str(preset) ^ 0x6d6c61ull, e->dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    K3C_TRY(k3c_load(e->dir, &e->m));
    if (!(e->cpu = k3c_backend_cpu_create(2))) return K3C_ERR;
    if (!(e->gpu = k3c_backend_cuda_create(0))) return K3C_ERR;
    if (exact) {
        k3c_backend_cpu_set_exact(e->cpu, 1);
        k3c_backend_cuda_set_exact(e->gpu, 1);
    }
    K3C_TRY(e->cpu->init(e->cpu, e->m, lim));
    K3C_TRY(e->gpu->init(e->gpu, e->m, lim));
    if (!e->gpu->mla_attention_expanded) return k3c_errorf("the CUDA backend has no mla_attention_expanded");
    return K3C_OK;
}

/* The backend's cache element from f32 values (NaN kept as the all-ones poison). */
static void *cache_bytes(const float *v, size_t n, int eb) {
    if (eb == 4) {
        float *f = fmalloc(n);
        if (f) memcpy(f, v, n * 4);
        return f;
    }
    uint16_t *b = malloc(n * 2 + 2);
    if (b)
        for (size_t i = 0; i < n; i++) b[i] = isnan(v[i]) ? 0xffffu : f32_to_bf16(v[i]);
    return b;
}

/* One call of each backend's op over the same segments; o rows [T, Hm * vh] downloaded into oc / og. */
static int both_ops(benv *e, const k3c_mla_weights *w, const float *q, size_t nq, const float *cache, size_t ncache,
                    const k3c_seg *segs, int nseg, int T, float *oc, float *og, int absorbed_gpu) {
    const k3c_config *c = &e->m->config;
    size_t no = (size_t)T * c->num_attention_heads * c->v_head_dim;
    k3c_backend *bes[2] = {e->cpu, e->gpu};
    float *outs[2] = {oc, og};
    for (int b = 0; b < 2; b++) {
        k3c_backend *be = bes[b];
        if (!outs[b]) continue;
        int eb = be->kv_elem_bytes;
        void *hc = cache_bytes(cache, ncache, eb);
        void *dc = be->alloc(be, ncache * eb), *dq = be->alloc(be, nq * 4), *dout = be->alloc(be, no * 4);
        int rc = hc && dc && dq && dout ? K3C_OK : k3c_errorf("backend %s: allocation", be->name);
        if (rc == K3C_OK) {
            be->upload(be, dc, hc, ncache * eb);
            be->upload(be, dq, q, nq * 4);
            be->fill_bytes(be, dout, 0xff, no * 4);
            if (b == 1 && absorbed_gpu) be->mla_attention(be, w, dq, segs, nseg, dc, dout);
            else be->mla_attention_expanded(be, w, dq, segs, nseg, dc, dout);
            be->download(be, outs[b], dout, no * 4);
            rc = be->sync(be);
            if (rc != K3C_OK) k3c_error_context("backend %s", be->name);
        }
        if (dc) be->free(be, dc);
        if (dq) be->free(be, dq);
        if (dout) be->free(be, dout);
        free(hc);
        K3C_TRY(rc);
    }
    return K3C_OK;
}

/* Several segments in one call on the tiny model (blocks of 4 tokens, one shuffled pool of blocks): a row
 * that belongs to no segment (must stay poisoned), a 130-row prompt, a 17-row continuation at 40, a 3-row
 * continuation at 9, and 40 rows at 2100 (context 2140 > the 2048-position pass: two passes). CPU op vs CUDA
 * op per segment; in f32 also the CUDA expanded op vs the CUDA absorbed op (equal in exact arithmetic). A
 * segment past max_context is refused with a message naming the limit. */
static void op_case(int exact) {
    k3c_backend_limits lim = {.max_rows = 200, .max_segs = 4, .max_context = 2400, .block_size = 4};
    benv e;
    int rc = benv_open(&e, "tiny", exact, &lim);
    if (rc != K3C_OK) benv_close(&e);
    CHECK_OK(rc);
    const k3c_config *c = &e.m->config;
    int l = 0;
    while (l < c->num_layers && e.m->weights.layers[l].kind != K3C_ATTN_MLA) l++;
    CHECK(l < c->num_layers);
    const k3c_mla_weights *w = &e.m->weights.layers[l].mla;
    int Hm = c->num_attention_heads, qh = c->qk_nope_head_dim + c->qk_rope_head_dim, vh = c->v_head_dim;
    int Lat = c->kv_lora_rank + c->qk_rope_head_dim, bs = lim.block_size;
    enum { NS = 4, T = 191 };
    static const int row0[NS] = {1, 131, 148, 151}, nn[NS] = {130, 17, 3, 40}, pp[NS] = {0, 40, 9, 2100};
    int nblocks = 0;
    for (int s = 0; s < NS; s++) nblocks += (pp[s] + nn[s] + bs - 1) / bs;
    nblocks += 5;
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x6f70ull ^ (uint64_t)exact);
    int32_t *pool = malloc(sizeof(int32_t) * nblocks);
    size_t ncache = (size_t)nblocks * bs * Lat, nq = (size_t)T * Hm * qh, no = (size_t)T * Hm * vh;
    float *cache = fmalloc(ncache), *q = fmalloc(nq), *oc = fmalloc(no), *og = fmalloc(no), *oa = fmalloc(no);
    CHECK(pool && cache && q && oc && og && oa);
    shuffle(&r, pool, nblocks);
    poison_f32(cache, ncache);
    k3c_seg segs[NS + 1];
    memset(segs, 0, sizeof segs);
    for (int s = 0, used = 0; s < NS; s++) {
        int N = pp[s] + nn[s];
        segs[s] = (k3c_seg){.row0 = row0[s], .n = nn[s], .pos = pp[s], .block_table = pool + used};
        for (int p = 0; p < N; p++) {
            float *row = cache + ((size_t)pool[used + p / bs] * bs + p % bs) * Lat;
            for (int x = 0; x < Lat; x++) row[x] = bf16_round((float)k3c_rng_normal(&r));
        }
        used += (N + bs - 1) / bs;
    }
    for (size_t i = 0; i < nq; i++) q[i] = bf16_round((float)(2.0 * k3c_rng_normal(&r)));
    rc = both_ops(&e, w, q, nq, cache, ncache, segs, NS, T, oc, og, 0);
    if (rc == K3C_OK && exact) rc = both_ops(&e, w, q, nq, cache, ncache, segs, NS, T, NULL, oa, 1);
    if (rc != K3C_OK) benv_close(&e);
    CHECK_OK(rc);
    size_t ro = (size_t)Hm * vh;
    CHECK(all_poison(og, ro)); /* row 0: no segment's */
    double thr = exact ? THR_F32 : THR_BF16;
    for (int s = 0; s < NS; s++) {
        size_t off = (size_t)row0[s] * ro, m = (size_t)nn[s] * ro;
        double err = rel_l2_f32f32(og + off, oc + off, m);
        note(exact ? "mla_expanded_op_f32" : "mla_expanded_op_bf16", thr, err);
        printf("    %s segment %d (n %d, pos %d): cuda vs cpu rel L2 %.3e", exact ? "f32" : "bf16", s, nn[s], pp[s], err);
        if (exact) {
            double ea = rel_l2_f32f32(og + off, oa + off, m);
            note("mla_expanded_vs_absorbed_f32", THR_F32, ea);
            printf(", vs cuda absorbed %.3e", ea);
            CHECKF(ea <= THR_F32, "segment %d: cuda expanded vs cuda absorbed rel L2 %.3e > %.0e", s, ea, THR_F32);
        }
        printf("\n");
        CHECKF(err <= thr, "segment %d (n %d, pos %d): cuda vs cpu rel L2 %.3e > %.0e", s, nn[s], pp[s], err, thr);
    }

    /* refusal: a segment reaching past max_context (the scratch's limit) */
    k3c_seg bad = {.row0 = 0, .n = 20, .pos = lim.max_context - 10, .block_table = pool};
    e.gpu->mla_attention_expanded(e.gpu, w, q, &bad, 1, NULL, og); /* refused before any pointer is used */
    rc = e.gpu->sync(e.gpu);
    CHECK(rc != K3C_OK && strstr(k3c_error_message(), "max_context") != NULL);
    CHECK_OK(e.gpu->sync(e.gpu)); /* the error was reported once; the backend works on */
    free(pool), free(cache), free(q), free(oc), free(og), free(oa);
    benv_close(&e);
}

TEST(gpu_mla_expanded_op_f32) { op_case(1); }
TEST(gpu_mla_expanded_op_bf16) { op_case(0); }

/* ---- model level ---- */

#define FWD_ROWS 320
#define F32_WORST 1e-4  /* tests/gpu/test_gpu_forward.c's f32 bound */
#define F32_MEDIAN 1e-5
#define BF16_MEDIAN 5e-2 /* test_gpu_forward.c's bf16 bound (dense routing): bf16 flips grow through layers */

typedef struct fenv {
    char dir[512];
    k3c_model *m;
    k3c_engine *cpu, *gpu, *gabs; /* gabs: CUDA with the expanded form off (every step absorbed) */
    int V;
} fenv;

static void fenv_close(fenv *e) {
    k3c_engine_free(e->cpu);
    k3c_engine_free(e->gpu);
    k3c_engine_free(e->gabs);
    if (e->m) k3c_free(e->m);
    memset(e, 0, sizeof *e);
}

/* Dense routing (k = E: no expert-selection flips), blocks of 4 tokens, default mla_expand_min (128). */
static int fenv_open(fenv *e, const char *preset, int exact) {
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "%s/gpumlaxf-%s%s", test_tmpdir(), preset, exact ? "-f32" : "");
    k3c_config c;
    K3C_TRY(k3c_preset_config(preset, &c));
    c.num_experts_per_token = c.num_experts;
    c.topk_group = c.num_expert_group;
    int rc = k3c_synth_write(&c, NULL, test_seed() ^ k3c_hash_str(preset) ^ 0x66776dull, e->dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    K3C_TRY(k3c_load(e->dir, &e->m));
    e->V = e->m->config.vocab_size;
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 3;
    o.max_rows = FWD_ROWS;
    o.max_context = 512;
    o.block_size = 4;
    o.exact_f32 = exact;
    o.device = "cpu";
    K3C_TRY(k3c_engine_create(e->m, &o, &e->cpu));
    o.device = "cuda";
    o.specialized = K3C_SPECIALIZED_OFF; /* the stock forward is what this file checks */
    K3C_TRY(k3c_engine_create(e->m, &o, &e->gpu));
    o.mla_expand_min = 1 << 30;
    K3C_TRY(k3c_engine_create(e->m, &o, &e->gabs));
    return K3C_OK;
}

typedef struct rowstats {
    double *err;
    int n;
    double worst;
} rowstats;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const rowstats *s) {
    double *v = malloc(sizeof(double) * (s->n ? s->n : 1));
    for (int i = 0; i < s->n; i++) v[i] = s->err[i] != s->err[i] ? INFINITY : s->err[i];
    qsort(v, s->n, sizeof *v, cmp_double);
    double m = s->n ? v[s->n / 2] : 0;
    free(v);
    return m;
}

/* Request A: a 300-token prompt as 170 + 130 (both expanded; the second continues at 170); then one step
 * with A's decode (absorbed), B's 140-row prompt and C's 128-row prompt (two expanded segments in one call),
 * then two steps decoding all three. Every logit row on the three engines; st: CUDA vs CPU, sa: CUDA
 * expanded vs CUDA absorbed-only; differ: whether those two were ever not bitwise equal. */
static int fwd_cases(fenv *e, k3c_rng *r, rowstats *st, rowstats *sa, int *differ) {
    int V = e->V;
    float *lc = malloc(sizeof(float) * (size_t)FWD_ROWS * V), *lg = malloc(sizeof(float) * (size_t)FWD_ROWS * V);
    float *la = malloc(sizeof(float) * (size_t)FWD_ROWS * V);
    int32_t *ids = malloc(sizeof(int32_t) * 600);
    int rc = lc && lg && la && ids ? K3C_OK : k3c_errorf("out of memory");
    for (int i = 0; rc == K3C_OK && i < 600; i++) ids[i] = (int32_t)(k3c_rng_next(r) % (uint64_t)V);
    int req[3] = {-1, -1, -1};
    k3c_engine *engs[3] = {e->cpu, e->gpu, e->gabs};
    for (int q = 0; rc == K3C_OK && q < 3; q++)
        for (int k = 0; rc == K3C_OK && k < 3; k++) {
            int id;
            rc = k3c_request_open(engs[k], &id);
            if (rc == K3C_OK && k > 0 && id != req[q]) rc = k3c_errorf("request ids differ between engines");
            req[q] = id;
        }
    int32_t dec[3];
    for (int step = 0; rc == K3C_OK && step < 5; step++) {
        k3c_step_item it[3];
        int ni = 0;
        if (step == 0) it[ni++] = (k3c_step_item){.request = req[0], .tokens = ids, .n = 170, .all_logits = 1};
        if (step == 1) it[ni++] = (k3c_step_item){.request = req[0], .tokens = ids + 170, .n = 130, .all_logits = 1};
        if (step == 2) {
            dec[0] = ids[300];
            it[ni++] = (k3c_step_item){.request = req[0], .tokens = &dec[0], .n = 1};
            it[ni++] = (k3c_step_item){.request = req[1], .tokens = ids + 301, .n = 140, .all_logits = 1};
            it[ni++] = (k3c_step_item){.request = req[2], .tokens = ids + 441, .n = 128, .all_logits = 1};
        }
        if (step >= 3) {
            for (int q = 0; q < 3; q++) {
                dec[q] = ids[570 + 3 * step + q];
                it[ni++] = (k3c_step_item){.request = req[q], .tokens = &dec[q], .n = 1};
            }
        }
        int rows = 0;
        for (int i = 0; i < ni; i++) rows += it[i].all_logits ? it[i].n : 1;
        poison_f32(lc, (size_t)rows * V), poison_f32(lg, (size_t)rows * V), poison_f32(la, (size_t)rows * V);
        rc = k3c_engine_step(e->cpu, it, ni, lc);
        if (rc == K3C_OK) rc = k3c_engine_step(e->gpu, it, ni, lg);
        if (rc == K3C_OK) rc = k3c_engine_step(e->gabs, it, ni, la);
        if (rc != K3C_OK) break;
        for (int row = 0; row < rows; row++) {
            const float *c = lc + (size_t)row * V, *g = lg + (size_t)row * V, *a = la + (size_t)row * V;
            double x = rel_l2_f32f32(g, c, V), y = rel_l2_f32f32(g, a, V);
            st->err[st->n++] = x;
            sa->err[sa->n++] = y;
            if (!(x <= st->worst)) st->worst = x;
            if (!(y <= sa->worst)) sa->worst = y;
            if (memcmp(g, a, sizeof(float) * V) != 0) *differ = 1;
        }
    }
    free(lc), free(lg), free(la), free(ids);
    return rc;
}

static void fwd_check(const char *preset, int exact) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ k3c_hash_str(preset) ^ (uint64_t)exact ^ 0x66ull);
    static double e1[1024], e2[1024];
    rowstats st = {e1, 0, 0}, sa = {e2, 0, 0};
    int differ = 0;
    fenv e;
    int rc = fenv_open(&e, preset, exact);
    if (rc == K3C_OK) rc = fwd_cases(&e, &r, &st, &sa, &differ);
    fenv_close(&e);
    CHECK_OK(rc);
    double med = median(&st), meda = median(&sa);
    char name[64];
    printf("    %s %s (dense routing): %d rows, cuda vs cpu worst %.3e median %.3e; cuda expanded vs cuda absorbed "
           "worst %.3e median %.3e%s\n", preset, exact ? "f32" : "bf16", st.n, st.worst, med, sa.worst, meda,
           differ ? "" : " (bitwise equal)");
    snprintf(name, sizeof name, "mlax_fwd_%s_%s_median", preset, exact ? "f32" : "bf16");
    note(name, exact ? F32_MEDIAN : BF16_MEDIAN, med);
    /* the expanded op ran on the GPU: its rounding (bf16) or summation order (f32) differs from absorbed */
    CHECKF(differ, "%s: CUDA with and without the expanded form bitwise equal: the expanded op did not run?", preset);
    if (exact) {
        CHECKF(st.worst <= F32_WORST && med <= F32_MEDIAN, "%s f32: cuda vs cpu worst row %.3e (bound %.0e), median "
               "%.3e (bound %.0e)", preset, st.worst, F32_WORST, med, F32_MEDIAN);
        CHECKF(sa.worst <= F32_WORST, "%s f32: cuda expanded vs absorbed worst row %.3e > %.0e", preset, sa.worst,
               F32_WORST);
    } else {
        CHECKF(med <= BF16_MEDIAN, "%s bf16: cuda vs cpu median row %.3e > %.0e", preset, med, BF16_MEDIAN);
    }
}

TEST(gpu_mla_expanded_forward_tiny_f32) { fwd_check("tiny", 1); }
TEST(gpu_mla_expanded_forward_kimi_linear_tiny_f32) { fwd_check("kimi-linear-tiny", 1); }
TEST(gpu_mla_expanded_forward_tiny_bf16) { fwd_check("tiny", 0); }
