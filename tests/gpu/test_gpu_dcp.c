/* Decode context parallel on the CUDA backend, several ranks on one GPU (one host thread, one backend and stream
 * per rank, the staged communicator of comm/staged.c between them, as tests/gpu/test_gpu_tp.c runs TP). Mirrors
 * tests/test_dcp.c:
 *  - the ops (backend.h mla_attention_part, mla_merge: cuda/mla.cu's split attention with its LSE, the DCP merge
 *    kernel) against softmax over the concatenated positions computed here in double, in the exact diagnostic
 *    (an f32 cache), rows without any of a rank's positions included;
 *  - the stock forward of TP 2 and TP 4 rank shards with dcp = tp on the tiny K3 config of test_tp.c, a 70-token
 *    prompt and 64 decode steps (the inputs forced, the same in every run), against the same TP without DCP on
 *    the GPU: f32 every row within 1e-5; bf16 no farther from the f32 function (TP without DCP, f32) than 2x TP
 *    without DCP's own bf16 logits (and within 3x of those); every rank's logits bitwise rank 0's.
 * Prints "METRIC <name> rel_l2 <threshold> <value>" lines (tools/gpu-check.sh tabulates them). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "comm/comm.h"
#include "cuda/backend_cuda.h"
#include "model/model.h"
#include "model/shard.h"
#include "model/synth.h"
#include "stock/forward.h"
#include "../test.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/rng.h"
#include "../tp_config.h"

static void dcp_metric(const char *name, double thr, double value) {
    printf("METRIC %-28s rel_l2 %8.1e %10.3e\n", name, thr, value);
}

static double urand(k3c_rng *g) { return (double)(k3c_rng_next(g) >> 11) * 0x1p-53 * 2.0 - 1.0; }

static int dcp_model(int dense, const char *name, k3c_model **m) {
    k3c_config c;
    K3C_TRY(tp_config(0, dense, &c));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    int rc = k3c_synth_write(&c, NULL, test_seed(), dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    return k3c_model_load(dir, m);
}

/* ---- the ops ---- */

TEST(gpu_dcp_ops_match_softmax) {
    k3c_model *m;
    CHECK_OK(dcp_model(0, "gpu_dcp_ops", &m));
    const k3c_config *cf = &m->config;
    int l = 0;
    while (l < cf->num_layers && cf->layer_attn[l] != K3C_ATTN_MLA) l++;
    CHECK(l < cf->num_layers);
    const k3c_mla_weights *w = &m->weights.layers[l].mla;
    int Hm = cf->num_attention_heads, kvl = cf->kv_lora_rank, rope = cf->qk_rope_head_dim, lat = kvl + rope;
    int nope = cf->qk_nope_head_dim, vh = cf->v_head_dim, bs = 4;
    double scale = 1.0 / sqrt((double)(nope + rope));
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x9dc);
    k3c_backend *be = k3c_backend_cuda_create(0);
    CHECK(be != NULL);
    if (!be) return;
    k3c_backend_cuda_set_exact(be, 1);
    int pos = 0, T = 6, n = 4, N = pos + T; /* row 0 sees position 0 only: ranks 1..3 empty for it */
    k3c_backend_limits lim = {.max_rows = T, .max_segs = 2, .max_context = 64, .block_size = bs};
    CHECK_OK(be->init(be, m, &lim));
    CHECK(be->kv_elem_bytes == 4);
    int local = (N + n - 1) / n, nb = (local + bs - 1) / bs;
    int32_t table[8];
    for (int b = 0; b < nb; b++) table[b] = nb - 1 - b;
    float *lat_all = malloc(sizeof(float) * (size_t)N * lat), *q = malloc(sizeof(float) * (size_t)T * Hm * lat);
    size_t o_len = (size_t)T * Hm * kvl, Sp = o_len + (size_t)T * Hm; /* part r at r Sp: [o_lat | lse] */
    float *host_parts = malloc(sizeof(float) * (size_t)n * Sp), *o = malloc(sizeof(float) * (size_t)T * Hm * vh);
    for (size_t i = 0; i < (size_t)N * lat; i++) lat_all[i] = (float)(urand(&g) * 2.0);
    for (size_t i = 0; i < (size_t)T * Hm * lat; i++) q[i] = (float)(urand(&g) * 1.5);
    size_t cache_f = (size_t)nb * bs * lat, parts_f = (size_t)n * Sp;
    float *dcache = be->alloc(be, sizeof(float) * cache_f), *dq = be->alloc(be, sizeof(float) * (size_t)T * Hm * lat);
    float *dparts = be->alloc(be, sizeof(float) * parts_f);
    float *dout = be->alloc(be, sizeof(float) * (size_t)T * Hm * vh);
    CHECK(dcache && dq && dparts && dout);
    be->upload(be, dq, q, sizeof(float) * (size_t)T * Hm * lat);
    be->fill_bytes(be, dparts, 0xff, sizeof(float) * parts_f);
    float *hc = calloc(cache_f, sizeof(float));
    for (int r = 0; r < n; r++) {
        memset(hc, 0, sizeof(float) * cache_f);
        for (int p = r; p < N; p += n) {
            int j = p / n;
            memcpy(hc + ((size_t)table[j / bs] * bs + j % bs) * lat, lat_all + (size_t)p * lat, sizeof(float) * lat);
        }
        be->upload(be, dcache, hc, sizeof(float) * cache_f);
        k3c_seg sg = {.row0 = 0, .n = T, .pos = pos, .block_table = table, .dcp = n, .dcp_rank = r};
        be->mla_attention_part(be, dq, Hm, &sg, 1, dcache, dparts + r * Sp, dparts + r * Sp + o_len);
        CHECK_OK(be->sync(be));
    }
    be->mla_merge(be, w, dparts, dparts + o_len, Sp, n, T, dout);
    CHECK_OK(be->sync(be));
    be->download(be, host_parts, dparts, sizeof(float) * parts_f);
    be->download(be, o, dout, sizeof(float) * (size_t)T * Hm * vh);
    CHECK_OK(be->sync(be));
    double worst_lse = 0, worst_o = 0;
    int empty = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hm; h++) {
            const float *qv = q + ((size_t)t * Hm + h) * lat;
            int see = pos + t + 1;
            double s[64], mx = -INFINITY, ol[1024] = {0}, sum = 0;
            for (int p = 0; p < see; p++) {
                double d = 0;
                for (int k = 0; k < lat; k++) d += (double)qv[k] * lat_all[(size_t)p * lat + k];
                s[p] = d * scale;
                mx = s[p] > mx ? s[p] : mx;
            }
            for (int p = 0; p < see; p++) {
                double e = exp(s[p] - mx);
                sum += e;
                for (int k = 0; k < kvl; k++) ol[k] += e * lat_all[(size_t)p * lat + k];
            }
            for (int r = 0; r < n; r++) {
                double rm = -INFINITY, rs = 0;
                for (int p = r; p < see; p += n) rm = s[p] > rm ? s[p] : rm;
                for (int p = r; p < see; p += n) rs += exp(s[p] - rm);
                float got = host_parts[r * Sp + o_len + (size_t)t * Hm + h];
                if (rs == 0) {
                    empty++;
                    CHECK(got == -INFINITY);
                    continue;
                }
                double d = fabs(got - (rm + log(rs)));
                if (!(d <= worst_lse)) worst_lse = d;
            }
            for (int e = 0; e < vh; e++) {
                const uint16_t *wr = w->kv_b.w + ((size_t)h * (nope + vh) + nope + e) * kvl;
                double ref = 0, mag = 0;
                for (int k = 0; k < kvl; k++) {
                    ref += (double)bf16_to_f32(wr[k]) * ol[k] / sum;
                    mag += fabs((double)bf16_to_f32(wr[k]) * ol[k] / sum);
                }
                double d = fabs(o[((size_t)t * Hm + h) * vh + e] - ref) / (mag > 1e-30 ? mag : 1e-30);
                if (!(d <= worst_o)) worst_o = d;
            }
        }
    printf("INFO gpu dcp ops: lse |err| %.3g, merged o rel err %.3g, %d empty partials\n", worst_lse, worst_o, empty);
    dcp_metric("gpu_dcp_merge", 1e-5, worst_o);
    CHECK(empty > 0);
    CHECKF(worst_lse <= 1e-5 && worst_o <= 1e-5, "lse %.3g, o %.3g", worst_lse, worst_o);
    be->free(be, dcache), be->free(be, dq), be->free(be, dparts), be->free(be, dout);
    be->destroy(be);
    free(lat_all), free(q), free(host_parts), free(o), free(hc);
    k3c_model_free(m);
}

/* ---- the forward ---- */

enum { NP = 70, NN = 64, BS = 16 };

typedef struct dcp_rank {
    const k3c_model *m;
    k3c_comm_group *grp;
    int rank, dcp, exact;
    const int32_t *toks; /* [NP + NN]: the prompt, then the forced decode inputs */
    float *lg;           /* [NP + NN, V] */
    int rc;
    char err[512];
} dcp_rank;

static int dcp_run_rank(dcp_rank *r) {
    const k3c_config *c = &r->m->config;
    int V = c->vocab_size * r->m->tp_size, ctx = NP + NN, dcp = r->dcp > 1 ? r->dcp : 1;
    k3c_backend *be = k3c_backend_cuda_create(0);
    if (!be) return K3C_ERR;
    k3c_backend_cuda_set_exact(be, r->exact);
    k3c_comm *comm = NULL;
    int rc = k3c_comm_staged_create(r->grp, r->rank, 0, k3c_backend_cuda_stream(be), 60000, &comm);
    k3c_forward_options o = {.max_rows = NP, .max_segs = 2, .max_context = ctx + 1, .block_size = BS, .tp = comm,
                             .dcp = r->dcp};
    k3c_forward *f = NULL;
    k3c_kv_cache kv = {0};
    k3c_kda_slots ks = {0};
    int32_t table[64];
    int nb = ((ctx + dcp - 1) / dcp + BS - 1) / BS; /* the local slots of DCP rank 0 */
    if (rc == K3C_OK) rc = k3c_forward_create(be, r->m, &o, &f);
    if (rc == K3C_OK) rc = k3c_kv_cache_init(&kv, be, c, nb + 1, BS);
    if (rc == K3C_OK) rc = k3c_kda_slots_init(&ks, be, c, 1, 1, 2);
    if (rc == K3C_OK) {
        kv.dcp = dcp;
        k3c_kda_slots_reset(&ks, be, 0);
        for (int i = 0; i < nb; i++) table[i] = k3c_kv_cache_take(&kv);
        k3c_fwd_req q = {.ids = r->toks, .n = NP, .pos = 0, .block_table = table, .slot = 0, .logits = K3C_LOGITS_ALL};
        rc = k3c_forward_step(f, &kv, &ks, &q, 1, r->lg, NULL);
        for (int s = 0; s < NN && rc == K3C_OK; s++) {
            q = (k3c_fwd_req){.ids = r->toks + NP + s, .n = 1, .pos = NP + s, .block_table = table, .slot = 0,
                              .logits = K3C_LOGITS_LAST};
            rc = k3c_forward_step(f, &kv, &ks, &q, 1, r->lg + (size_t)(NP + s) * V, NULL);
        }
    }
    if (rc != K3C_OK) {
        snprintf(r->err, sizeof r->err, "%s", k3c_error_message());
        if (comm) comm->abort(comm);
    }
    k3c_kda_slots_release(&ks, be);
    k3c_kv_cache_release(&kv, be);
    k3c_forward_free(f);
    if (comm) comm->free(comm);
    be->destroy(be);
    return rc;
}

static void *dcp_thread(void *p) {
    dcp_rank *r = p;
    r->rc = dcp_run_rank(r);
    return NULL;
}

/* tp ranks of the shards on the GPU, dcp 1 or tp; out [NP + NN, V] rank 0's logits (every rank's checked equal). */
static int dcp_run(k3c_model **sh, int tp, int dcp, int exact, const int32_t *toks, int V, float *out) {
    k3c_comm_group *grp;
    K3C_TRY(k3c_comm_group_create(tp, 60000, &grp));
    dcp_rank runs[8];
    pthread_t th[8];
    size_t n = (size_t)(NP + NN) * V;
    for (int k = 0; k < tp; k++) {
        runs[k] = (dcp_rank){.m = sh[k], .grp = grp, .rank = k, .dcp = dcp, .exact = exact, .toks = toks,
                             .lg = malloc(sizeof(float) * n)};
        if (!runs[k].lg) return k3c_errorf("out of memory");
        poison_f32(runs[k].lg, n);
    }
    for (int k = 0; k < tp; k++) pthread_create(&th[k], NULL, dcp_thread, &runs[k]);
    for (int k = 0; k < tp; k++) pthread_join(th[k], NULL);
    int rc = K3C_OK;
    for (int k = 0; k < tp && rc == K3C_OK; k++)
        if (runs[k].rc != K3C_OK) rc = k3c_errorf("tp %d dcp %d rank %d: %s", tp, dcp, k, runs[k].err);
    for (int k = 1; k < tp && rc == K3C_OK; k++)
        if (memcmp(runs[k].lg, runs[0].lg, sizeof(float) * n))
            rc = k3c_errorf("tp %d dcp %d: rank %d's logits differ from rank 0's", tp, dcp, k);
    if (rc == K3C_OK) memcpy(out, runs[0].lg, sizeof(float) * n);
    for (int k = 0; k < tp; k++) free(runs[k].lg);
    return rc;
}

static double dcp_worst(const float *a, const float *b, int rows, int V) {
    double w = 0;
    for (int i = 0; i < rows; i++) {
        double d = rel_l2_f32f32(a + (size_t)i * V, b + (size_t)i * V, (size_t)V);
        if (!(d <= w)) w = d;
    }
    return w;
}

TEST(gpu_dcp_forward_tiny_k3) {
    k3c_model *m;
    CHECK_OK(dcp_model(1, "gpu_dcp_fwd", &m));
    int V = m->config.vocab_size;
    int32_t toks[NP + NN];
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xd0c);
    for (int i = 0; i < NP + NN; i++) toks[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    size_t n = (size_t)(NP + NN) * V;
    float *f32 = malloc(sizeof(float) * n), *f32d = malloc(sizeof(float) * n);
    float *bf = malloc(sizeof(float) * n), *bfd = malloc(sizeof(float) * n);
    for (int tp = 2; tp <= 4; tp *= 2) {
        k3c_model *sh[8] = {0};
        for (int k = 0; k < tp; k++) CHECK_OK(k3c_model_shard_tp(m, k, tp, &sh[k]));
        int rc = dcp_run(sh, tp, 1, 1, toks, V, f32);
        if (rc == K3C_OK) rc = dcp_run(sh, tp, tp, 1, toks, V, f32d);
        if (rc == K3C_OK) rc = dcp_run(sh, tp, 1, 0, toks, V, bf);
        if (rc == K3C_OK) rc = dcp_run(sh, tp, tp, 0, toks, V, bfd);
        for (int k = 0; k < tp; k++) k3c_model_shard_free(sh[k]);
        CHECKF(rc == K3C_OK, "%s", k3c_error_message());
        if (rc != K3C_OK) break;
        double wf = dcp_worst(f32d, f32, NP + NN, V), noise = dcp_worst(bf, f32, NP + NN, V);
        double wb = dcp_worst(bfd, bf, NP + NN, V), wfn = dcp_worst(bfd, f32, NP + NN, V);
        printf("INFO gpu tp %d dcp %d: f32 worst row %.3g vs tp %d; bf16 %.3g from tp %d's bf16, %.3g from the f32 "
               "function (tp %d's own %.3g); ranks bitwise equal\n", tp, tp, wf, tp, wb, tp, wfn, tp, noise);
        char name[64];
        snprintf(name, sizeof name, "gpu_dcp_tp%d_f32", tp);
        dcp_metric(name, 1e-5, wf);
        CHECKF(wf <= 1e-5, "tp %d dcp f32: %.3g over 1e-5", tp, wf);
        CHECKF(wfn <= 2.0 * noise && wb <= 3.0 * noise, "tp %d dcp bf16: %.3g from the f32 function (x 2), %.3g from "
               "tp's bf16 (x 3), against %.3g", tp, wfn, wb, noise);
    }
    free(f32), free(f32d), free(bf), free(bfd);
    k3c_model_free(m);
}
