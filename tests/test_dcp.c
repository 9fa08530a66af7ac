/* Decode context parallel (stock/forward.c mla_dcp, backend.h mla_attention_part / mla_merge, docs/PARALLEL.md)
 * on CPU ranks.
 *
 * The ops against the formula: the partial attention of each rank over its interleaved positions and the merge
 * of the partials against softmax over the concatenated positions, computed here in double from q_abs, the
 * latents and kv_b (not through any code of the backend), rows that see none of a rank's positions included.
 *
 * The engine: TP 2 and 4 with DCP (dcp = tp, and dcp 2 inside tp 4) on the tiny K3 preset (its MLA layers)
 * and the embedded k3-fortune (tp 2: two MLA heads), several requests at once, prompts longer than a block,
 * a prompt cut into two steps, 64 decode steps; every step's logits hashed on every rank and compared
 * (k3c_engine_check_ranks: the ranks bitwise equal); against TP without DCP within 1e-5 with f32 activations
 * (the merge reassociates the f32 softmax sums, nothing else differs) and within the bf16 tolerance of
 * tests/test_ranks.c with bf16 ones. Then the capacity: the same cache blocks hold dcp times the tokens, and a
 * request past them is refused cleanly with the engine still serving the others. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "cache/kda_slots.h"
#include "cache/kv_cache.h"
#include "comm/comm.h"
#include "damp_residual.h"
#include "k3c.h"
#include "model/model.h"
#include "model/shard.h"
#include "model/synth.h"
#include "runtime/engine_internal.h"
#include "stock/forward.h"
#include "test.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/rng.h"
#include "tp_config.h"

static double urand(k3c_rng *g) { return (double)(k3c_rng_next(g) >> 11) * 0x1p-53 * 2.0 - 1.0; }

/* ---- the ops against the formula ---- */

/* One layer's cache of `n` DCP ranks for one request of N positions: rank r holds position p (p % n == r) at
 * local slot p / n, through a block table that is a permutation (paging exercised). */
TEST(dcp_ops_partial_and_merge_match_softmax) {
    k3c_config c;
    CHECK_OK(tp_config(0, 0, &c));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/dcp_ops", test_tmpdir());
    int rc = k3c_synth_write(&c, NULL, test_seed(), dir);
    k3c_config_free(&c);
    CHECK_OK(rc);
    k3c_model *m;
    CHECK_OK(k3c_model_load(dir, &m));
    const k3c_config *cf = &m->config;
    int l = 0;
    while (l < cf->num_layers && cf->layer_attn[l] != K3C_ATTN_MLA) l++;
    CHECK(l < cf->num_layers);
    const k3c_mla_weights *w = &m->weights.layers[l].mla;
    int Hm = cf->num_attention_heads, kvl = cf->kv_lora_rank, rope = cf->qk_rope_head_dim, lat = kvl + rope;
    int nope = cf->qk_nope_head_dim, vh = cf->v_head_dim, bs = 4;
    double scale = 1.0 / sqrt((double)(nope + rope));
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xdc9);
    for (int n = 2; n <= 4; n++) {
        /* one request: rows at positions pos .. pos + T - 1 (the first ones see fewer positions than ranks) */
        int pos = n == 2 ? 0 : 37, T = n == 2 ? 5 : 3, N = pos + T, local = (N + n - 1) / n, nb = (local + bs - 1) / bs;
        k3c_backend *be[4];
        float *cache[4];
        int32_t table[64];
        for (int b = 0; b < nb; b++) table[b] = (b * 5 + 3) % nb; /* a permutation of 0 .. nb - 1 (5 coprime to nb) */
        CHECK(nb <= 64);
        float *lat_all = malloc(sizeof(float) * (size_t)N * lat);                 /* position p's latent */
        float *q = malloc(sizeof(float) * (size_t)T * Hm * lat);                  /* [T, Hm, lat] */
        /* part r at parts + r Sp: o_lat [T, Hm, kvl], then lse [T, Hm] (the forward's layout, mla_merge's stride) */
        size_t o_len = (size_t)T * Hm * kvl, Sp = o_len + (size_t)T * Hm;
        float *parts = malloc(sizeof(float) * (size_t)n * Sp);
        float *o = malloc(sizeof(float) * (size_t)T * Hm * vh);
        for (size_t i = 0; i < (size_t)N * lat; i++) lat_all[i] = (float)(urand(&g) * 2.0);
        for (size_t i = 0; i < (size_t)T * Hm * lat; i++) q[i] = (float)(urand(&g) * 1.5);
        k3c_backend_limits lim = {.max_rows = T, .max_segs = 2, .max_context = N, .block_size = bs};
        for (int r = 0; r < n; r++) {
            be[r] = k3c_backend_cpu_create(1);
            k3c_backend_cpu_set_exact(be[r], 1);
            CHECK_OK(be[r]->init(be[r], m, &lim));
            cache[r] = calloc((size_t)nb * bs * lat, sizeof(float));
            for (int p = r; p < N; p += n) {
                int j = p / n;
                memcpy(cache[r] + ((size_t)table[j / bs] * bs + j % bs) * lat, lat_all + (size_t)p * lat,
                       sizeof(float) * lat);
            }
            poison_f32(parts + r * Sp, Sp);
            k3c_seg sg = {.row0 = 0, .n = T, .pos = pos, .block_table = table, .dcp = n, .dcp_rank = r};
            be[r]->mla_attention_part(be[r], q, Hm, &sg, 1, cache[r], parts + r * Sp, parts + r * Sp + o_len);
            CHECK_OK(be[r]->sync(be[r]));
        }
        poison_f32(o, (size_t)T * Hm * vh);
        be[0]->mla_merge(be[0], w, parts, parts + o_len, Sp, n, T, o);
        CHECK_OK(be[0]->sync(be[0]));
        /* the same merge on another rank's backend: the same bits */
        float *o1 = malloc(sizeof(float) * (size_t)T * Hm * vh);
        be[n - 1]->mla_merge(be[n - 1], w, parts, parts + o_len, Sp, n, T, o1);
        CHECK_OK(be[n - 1]->sync(be[n - 1]));
        CHECK(memcmp(o, o1, sizeof(float) * (size_t)T * Hm * vh) == 0);
        free(o1);
        /* the formula, in double: per row and head the scores of every position the row sees */
        double worst_lse = 0, worst_part = 0, worst_o = 0;
        int empty = 0;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < Hm; h++) {
                const float *qv = q + ((size_t)t * Hm + h) * lat;
                int see = pos + t + 1;
                double s[256], mx = -INFINITY;
                CHECK(see <= 256);
                for (int p = 0; p < see; p++) {
                    double d = 0;
                    for (int k = 0; k < lat; k++) d += (double)qv[k] * lat_all[(size_t)p * lat + k];
                    s[p] = d * scale;
                    if (s[p] > mx) mx = s[p];
                }
                double ol[1024] = {0}, sum = 0;
                CHECK(kvl <= 1024);
                for (int p = 0; p < see; p++) {
                    double e = exp(s[p] - mx);
                    sum += e;
                    for (int k = 0; k < kvl; k++) ol[k] += e * lat_all[(size_t)p * lat + k];
                }
                for (int k = 0; k < kvl; k++) ol[k] /= sum;
                /* each rank's partial: its positions only */
                for (int r = 0; r < n; r++) {
                    double rm = -INFINITY, rs = 0, po[1024] = {0};
                    for (int p = r; p < see; p += n) rm = s[p] > rm ? s[p] : rm;
                    for (int p = r; p < see; p += n) {
                        double e = exp(s[p] - rm);
                        rs += e;
                        for (int k = 0; k < kvl; k++) po[k] += e * lat_all[(size_t)p * lat + k];
                    }
                    float got_l = parts[r * Sp + o_len + (size_t)t * Hm + h];
                    const float *got_o = parts + r * Sp + ((size_t)t * Hm + h) * kvl;
                    if (rs == 0) { /* none of rank r's positions */
                        empty++;
                        CHECKF(got_l == -INFINITY, "n %d rank %d row %d: lse %g for no positions", n, r, t, got_l);
                        for (int k = 0; k < kvl; k++) CHECK(got_o[k] == 0.0f);
                        continue;
                    }
                    double dl = fabs(got_l - (rm + log(rs)));
                    if (!(dl <= worst_lse)) worst_lse = dl;
                    for (int k = 0; k < kvl; k++) {
                        double d = fabs(got_o[k] - po[k] / rs);
                        if (!(d <= worst_part)) worst_part = d;
                    }
                }
                /* o = W_UV[h] o_lat */
                for (int e = 0; e < vh; e++) {
                    const uint16_t *wr = w->kv_b.w + ((size_t)h * (nope + vh) + nope + e) * kvl;
                    double ref = 0, mag = 0;
                    for (int k = 0; k < kvl; k++) ref += (double)bf16_to_f32(wr[k]) * ol[k], mag += fabs(bf16_to_f32(wr[k]) * ol[k]);
                    double d = fabs(o[((size_t)t * Hm + h) * vh + e] - ref) / (mag > 1e-30 ? mag : 1e-30);
                    if (!(d <= worst_o)) worst_o = d;
                }
            }
        printf("    dcp %d: lse |err| %.3g, partial o_lat |err| %.3g, merged o rel err %.3g; %d (row, head, rank) "
               "partials without positions\n", n, worst_lse, worst_part, worst_o, empty);
        CHECKF(worst_lse <= 1e-5 && worst_part <= 1e-5 && worst_o <= 1e-5, "dcp %d: %.3g / %.3g / %.3g", n, worst_lse,
               worst_part, worst_o);
        if (n == 2) CHECK(empty > 0); /* pos 0: row 0 sees position 0 only, rank 1 none */
        for (int r = 0; r < n; r++) {
            be[r]->destroy(be[r]);
            free(cache[r]);
        }
        free(lat_all), free(q), free(parts), free(o);
    }
    k3c_model_free(m);
}

/* ---- the engine ---- */

/* Three requests: A a 140-token prompt (a whole aligned 128-row MLA block: the expanded form without DCP), B 37
 * tokens, C 44 tokens in two steps (24, then 20 at position 24); then DECODE steps of all three at once, the
 * decode inputs forced (the same in every run, so every run's rows compare the same inputs). Block size 8:
 * every prompt spans several blocks. */
enum { NA = 140, NB = 37, NC1 = 24, NC2 = 20, DECODE = 64 };
enum { ROWS = NA + NB + NC1 + NC2 + 2 + 3 * DECODE };

typedef struct erun {
    float *lg; /* [ROWS, V] every logits row, in step order */
    long steps, checked;
    long cache_tokens;
} erun;

static int engine_dcp_run(k3c_model *m, int tp, int dcp, int exact, const int32_t *toks, erun *r) {
    memset(r, 0, sizeof *r);
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = tp;
    o.exact_f32 = exact;
    o.layout.tp = tp;
    o.layout.dcp = dcp;
    o.rank_timeout_ms = 30000;
    o.max_requests = 3;
    o.max_rows = NA + NB + NC1;
    o.max_context = NA + 1 + DECODE + 8;
    o.block_size = 8;
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    k3c_engine_check_ranks(e, 1);
    int V = k3c_engine_vocab(e), id[3] = {-1, -1, -1}, rc = K3C_OK;
    r->lg = malloc(sizeof(float) * (size_t)ROWS * V);
    if (!r->lg) rc = k3c_errorf("out of memory");
    else poison_f32(r->lg, (size_t)ROWS * V);
    for (int i = 0; i < 3 && rc == K3C_OK; i++) rc = k3c_request_open(e, &id[i]);
    const int32_t *ta = toks, *tb = toks + NA, *tc = toks + NA + NB, *td = toks + NA + NB + NC1 + NC2;
    size_t row = 0;
    if (rc == K3C_OK) {
        k3c_step_item it[3] = {{.request = id[0], .tokens = ta, .n = NA, .all_logits = 1},
                               {.request = id[1], .tokens = tb, .n = NB, .all_logits = 1},
                               {.request = id[2], .tokens = tc, .n = NC1, .all_logits = 1}};
        rc = k3c_engine_step(e, it, 3, r->lg);
        row += NA + NB + NC1;
    }
    if (rc == K3C_OK) { /* C's prompt goes on (a prefill at position 24) beside A's and B's first decode rows */
        k3c_step_item it[3] = {{.request = id[2], .tokens = tc + NC1, .n = NC2, .all_logits = 1},
                               {.request = id[0], .tokens = td, .n = 1},
                               {.request = id[1], .tokens = td + 1, .n = 1}};
        rc = k3c_engine_step(e, it, 3, r->lg + row * V);
        row += NC2 + 2;
    }
    for (int s = 0; s < DECODE && rc == K3C_OK; s++) {
        k3c_step_item it[3];
        for (int i = 0; i < 3; i++) it[i] = (k3c_step_item){.request = id[i], .tokens = td + 2 + 3 * s + i, .n = 1};
        rc = k3c_engine_step(e, it, 3, r->lg + row * V);
        row += 3;
    }
    k3c_engine_stats st;
    k3c_engine_stats_get(e, &st);
    r->steps = st.steps;
    r->checked = k3c_engine_ranks_checked(e);
    k3c_engine_memory mem;
    if (k3c_engine_memory_get(e, &mem) == K3C_OK) r->cache_tokens = mem.cache_tokens;
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    for (int i = 0; i < 3; i++)
        if (id[i] >= 0) k3c_request_close(e, id[i]);
    k3c_engine_free(e);
    if (rc == K3C_OK && row != ROWS) return k3c_errorf("%zu logits rows, expected %d", row, ROWS);
    if (rc == K3C_OK && (r->checked != r->steps || r->steps != 2 + DECODE))
        return k3c_errorf("%ld of %ld steps compared across the ranks", r->checked, r->steps);
    return rc == K3C_OK ? K3C_OK : k3c_errorf("tp %d dcp %d: %s", tp, dcp, msg);
}

static double worst_row(const float *a, const float *b, int rows, int V) {
    double w = 0;
    for (int i = 0; i < rows; i++) {
        double d = rel_l2_f32f32(a + (size_t)i * V, b + (size_t)i * V, (size_t)V);
        if (!(d <= w)) w = d;
    }
    return w;
}

/* For each (tp, dcp): f32 within 1e-5 of tp without dcp; bf16 no farther from the f32 function (tp without dcp,
 * f32) than 2x tp without dcp's own bf16 logits are, and within 3x that from those. */
static void check_engine(k3c_model *m, const char *name, const int (*layouts)[2], int nl) {
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    int V = info.vocab_size;
    int32_t toks[NA + NB + NC1 + NC2 + 2 + 3 * DECODE];
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xdc);
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) toks[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    int rc = K3C_OK;
    for (int li = 0; li < nl && rc == K3C_OK; li++) {
        int tp = layouts[li][0], dcp = layouts[li][1];
        erun f32, f32d, bf, bfd;
        memset(&f32, 0, sizeof f32), memset(&f32d, 0, sizeof f32d), memset(&bf, 0, sizeof bf), memset(&bfd, 0, sizeof bfd);
        rc = engine_dcp_run(m, tp, 1, 1, toks, &f32);
        if (rc == K3C_OK) rc = engine_dcp_run(m, tp, dcp, 1, toks, &f32d);
        if (rc == K3C_OK) rc = engine_dcp_run(m, tp, 1, 0, toks, &bf);
        if (rc == K3C_OK) rc = engine_dcp_run(m, tp, dcp, 0, toks, &bfd);
        if (rc == K3C_OK) {
            double wf = worst_row(f32d.lg, f32.lg, ROWS, V);
            double noise = worst_row(bf.lg, f32.lg, ROWS, V), wb = worst_row(bfd.lg, bf.lg, ROWS, V);
            double wfn = worst_row(bfd.lg, f32.lg, ROWS, V);
            int pb = NA + NB + NC1; /* prefill rows of the first step */
            printf("    %s tp %d dcp %d: f32 worst row rel L2 vs tp %d without dcp %.3g (prefill %.3g, later %.3g); "
                   "bf16 %.3g from tp %d's bf16, %.3g from the f32 function (tp %d's own bf16 %.3g); %ld of %ld steps "
                   "every rank bitwise rank 0; the default cache (max_requests full contexts) %ld tokens (without dcp %ld)\n", name, tp, dcp, tp, wf,
                   worst_row(f32d.lg, f32.lg, pb, V),
                   worst_row(f32d.lg + (size_t)pb * V, f32.lg + (size_t)pb * V, ROWS - pb, V), wb, tp, wfn, tp, noise,
                   bfd.checked, bfd.steps, f32d.cache_tokens, f32.cache_tokens);
            if (!(wf <= 1e-5)) rc = k3c_errorf("%s tp %d dcp %d f32: rel L2 %.3g over 1e-5", name, tp, dcp, wf);
            /* no worse an approximation of the function than tp's bf16 (x 2), and so (triangle inequality) within
             * 3x of tp's bf16 */
            else if (!(wfn <= 2.0 * noise && wb <= 3.0 * noise))
                rc = k3c_errorf("%s tp %d dcp %d bf16: %.3g from the f32 function (x 2 allowed), %.3g from tp %d (x 3), "
                                "against tp %d's own %.3g", name, tp, dcp, wfn, wb, tp, tp, noise);
            /* the same bytes: num_blocks defaults to max_requests full contexts, which take 1 / dcp the blocks */
            else if (f32d.cache_tokens < f32.cache_tokens || f32d.cache_tokens > f32.cache_tokens + 3 * 8 * dcp)
                rc = k3c_errorf("cache of %ld tokens under dcp %d, %ld without", f32d.cache_tokens, dcp, f32.cache_tokens);
        }
        free(f32.lg), free(f32d.lg), free(bf.lg), free(bfd.lg);
    }
    CHECKF(rc == K3C_OK, "%s", k3c_error_message());
}

/* dense routing (every expert selected, tp_config.h): no routing near-tie flips an expert between the bf16 runs,
 * whose distances then measure rounding, as in tests/test_ranks.c */
static int tiny_k3(const char *name, k3c_model **m) {
    k3c_config c;
    K3C_TRY(tp_config(0, 1, &c));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    int rc = k3c_synth_write(&c, NULL, test_seed(), dir);
    k3c_config_free(&c);
    K3C_TRY(rc);
    return k3c_load(dir, m);
}

TEST(dcp_engine_tiny_k3_matches_tp) {
    k3c_model *m;
    CHECK_OK(tiny_k3("dcp_k3", &m));
    static const int layouts[][2] = {{2, 2}, {4, 4}, {4, 2}};
    check_engine(m, "tiny k3", layouts, 3);
    k3c_free(m);
}

TEST(dcp_engine_k3_fortune_matches_tp) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/dcp_fortune", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0 || errno == EEXIST);
    CHECK_OK(k3c_default_model_write(dir));
    k3c_model *m;
    CHECK_OK(k3c_load(dir, &m));
    static const int layouts[][2] = {{2, 2}};
    check_engine(m, "k3-fortune", layouts, 1);
    k3c_free(m);
}

/* The same cache blocks hold dcp times the tokens; past them a request is refused with a message and the
 * engine goes on serving the requests it holds. */
TEST(dcp_engine_capacity_and_refusal) {
    k3c_model *m;
    CHECK_OK(tiny_k3("dcp_cap", &m));
    int32_t toks[160];
    for (int i = 0; i < 160; i++) toks[i] = (int32_t)(i * 7 % 1000);
    for (int dcp = 1; dcp <= 2; dcp++) {
        k3c_engine_options o;
        k3c_engine_options_default(&o);
        o.threads = 2;
        o.layout.tp = 2;
        o.layout.dcp = dcp;
        o.max_requests = 2;
        o.max_rows = 128;
        o.max_context = 160;
        o.block_size = 16;
        o.num_blocks = 4; /* 4 x 16 local slots: 64 tokens, or 128 under dcp 2 */
        k3c_engine *e = NULL;
        CHECK_OK(k3c_engine_create(m, &o, &e));
        k3c_engine_memory mem;
        CHECK_OK(k3c_engine_memory_get(e, &mem));
        CHECK(mem.cache_tokens == 64L * dcp);
        int V = k3c_engine_vocab(e), a = -1, b = -1;
        float *lg = malloc(sizeof(float) * (size_t)V);
        CHECK_OK(k3c_request_open(e, &a));
        k3c_step_item it = {.request = a, .tokens = toks, .n = 100};
        int rc = k3c_engine_step(e, &it, 1, lg);
        if (dcp == 1) {
            CHECK(rc == K3C_ERR && strstr(k3c_error_message(), "out of blocks"));
        } else {
            CHECKF(rc == K3C_OK, "dcp 2: a 100-token prompt in 128 tokens of cache: %s", k3c_error_message());
            for (int s = 0; s < 20; s++) { /* to 120 tokens: 60 local slots, the 4 blocks */
                it = (k3c_step_item){.request = a, .tokens = toks + 100 + s, .n = 1};
                CHECK_OK(k3c_engine_step(e, &it, 1, lg));
            }
            CHECK_OK(k3c_request_open(e, &b));
            it = (k3c_step_item){.request = b, .tokens = toks, .n = 40};
            CHECK(k3c_engine_step(e, &it, 1, lg) == K3C_ERR);
            CHECK(strstr(k3c_error_message(), "out of blocks"));
            CHECK(!k3c_engine_failed(e));
            for (int s = 0; s < 8; s++) { /* A still decodes, to the cache's 128 tokens */
                it = (k3c_step_item){.request = a, .tokens = toks + 120 + s, .n = 1};
                CHECK_OK(k3c_engine_step(e, &it, 1, lg));
            }
            for (int i = 0; i < V; i++) CHECK(isfinite(lg[i]));
            it = (k3c_step_item){.request = a, .tokens = toks + 128, .n = 1}; /* the 129th: no block left */
            CHECK(k3c_engine_step(e, &it, 1, lg) == K3C_ERR && strstr(k3c_error_message(), "out of blocks"));
            CHECK_OK(k3c_request_close(e, b));
        }
        CHECK_OK(k3c_request_close(e, a));
        free(lg);
        k3c_engine_free(e);
    }
    /* layouts the engine refuses: dcp not dividing tp, dcp without tp */
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.layout.tp = 4;
    o.layout.dcp = 3;
    k3c_engine *e = NULL;
    CHECK(k3c_engine_create(m, &o, &e) == K3C_ERR && !e && strstr(k3c_error_message(), "dcp 3"));
    o.layout.tp = 1;
    o.layout.dcp = 2;
    CHECK(k3c_engine_create(m, &o, &e) == K3C_ERR && !e && strstr(k3c_error_message(), "dcp 2"));
    k3c_free(m);
}

/* k3c plan --dcp: the rank's share of the MLA cache and the tokens it holds. */
TEST(dcp_plan_prints_the_rank_share) {
    k3c_layout l = {.tp = 8, .pp = 1, .dp = 1, .ep = 1, .hosts = 1, .gpu_mem = (uint64_t)143771 << 20,
                    .context = 8193, .requests = 2, .hbm_bytes_per_s = 4.2e12};
    k3c_layout_rank r1[8], r8[8];
    int n = 0;
    CHECK_OK(k3c_layout_plan(NULL, "k3", &l, r1, 8, &n));
    l.dcp = 8;
    CHECK_OK(k3c_layout_plan(NULL, "k3", &l, r8, 8, &n));
    CHECK(n == 8);
    for (int i = 0; i < 8; i++) {
        CHECK(r1[i].mla_tokens == 2u * 8193 && r8[i].mla_tokens == 2u * 1025); /* ceil(8193 / 8) */
        CHECK(r8[i].mla_cache_bytes == r8[i].mla_bytes_per_token * 2 * 1025);
        CHECK(r8[i].mla_bytes_per_token == r1[i].mla_bytes_per_token && r8[i].floor_ms < r1[i].floor_ms);
    }
    l.dcp = 3;
    CHECK(k3c_layout_plan(NULL, "k3", &l, r8, 8, &n) == K3C_ERR && strstr(k3c_error_message(), "dcp 3"));
    char k3c[4096], cmd[8192];
    CHECK(test_k3c_binary(k3c, sizeof k3c));
    snprintf(cmd, sizeof cmd, "%s plan --preset k3 --tp 8 --dcp 8 --context 8193 --requests 2 | grep -q 'holds 2050 of "
             "the 16386 MLA token positions'", k3c);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s plan --preset k3 --tp 8 --dcp 3 >/dev/null 2>&1", k3c);
    CHECK(test_run_status(cmd) == 1);
}

/* ---- the scheduler and the CLI ---- */

enum { NJOBS = 4, SNEW = 20, PREFIX = 64, OWN = 24, CONT = 12 };

typedef struct sjob {
    int32_t prompt[PREFIX + OWN + CONT + 1];
    int n_prompt;
    int32_t out[SNEW];
    float gap[SNEW];
    int n_out, finished;
    uint64_t id;
} sjob;

/* Every job through one scheduler on tp 2 (dcp 1 or 2), f32: chunked prefill, a shared prefix (hinted: prefix
 * hits), three prompt-lookup drafts a verify, three requests on too few blocks (preemptions), freed blocks
 * poisoned on every rank. The cache blocks are the same bytes per block, so dcp 2 gets half of them. */
static int sched_run(k3c_model *m, int dcp, sjob *jobs, k3c_scheduler_stats *out, long *checked, long *steps) {
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.threads = 2;
    o.exact_f32 = 1;
    o.layout.tp = 2;
    o.layout.dcp = dcp;
    o.rank_timeout_ms = 30000;
    o.max_requests = 3;
    o.max_rows = 64;
    o.max_context = PREFIX + OWN + CONT + 1 + SNEW;
    o.block_size = 8;
    o.chunk_min = 16;
    o.mla_expand_min = 32;
    o.q_max = 4;
    o.poison_freed_blocks = 1;
    o.num_blocks = 22 / dcp; /* 176 tokens: fewer than three full contexts and the cached prefix */
    k3c_engine *e = NULL;
    K3C_TRY(k3c_engine_create(m, &o, &e));
    k3c_engine_check_ranks(e, 1);
    k3c_scheduler_options so;
    k3c_scheduler_options_default(&so);
    so.max_seqs = 3;
    so.max_batched_tokens = 48;
    so.spec_tokens = 3;
    k3c_scheduler *s = NULL;
    int rc = k3c_scheduler_create(e, &so, &s);
    for (int j = 0; j < NJOBS && rc == K3C_OK; j++) {
        jobs[j].n_out = jobs[j].finished = 0;
        k3c_sched_request q = {.prompt = jobs[j].prompt, .n_prompt = jobs[j].n_prompt, .max_new = SNEW,
                               .ignore_eos = 1, .prefix_hint = PREFIX, .user = &jobs[j]};
        q.sampling.logprobs = 3;
        if (k3c_scheduler_submit(s, &q, &jobs[j].id) != 0) rc = k3c_errorf("submit: %s", k3c_error_message());
    }
    int busy = 1, k = 0;
    while (rc == K3C_OK && busy) {
        const k3c_sched_event *ev;
        int n;
        rc = k3c_scheduler_step(s, &ev, &n, &busy);
        for (int i = 0; i < n && rc == K3C_OK; i++) {
            sjob *j = ev[i].user;
            if (ev[i].kind == K3C_SCHED_TOKEN && j->n_out < SNEW) {
                j->gap[j->n_out] = ev[i].n_top >= 2 ? ev[i].top_logprobs[0] - ev[i].top_logprobs[1] : 0;
                j->out[j->n_out++] = ev[i].token;
            } else if (ev[i].kind == K3C_SCHED_FINISHED) {
                j->finished = 1;
                if (ev[i].finish == K3C_FINISH_ERROR) rc = k3c_errorf("job failed: %s", ev[i].message);
            }
        }
        if (++k > 5000) rc = k3c_errorf("still busy after %d steps", k);
    }
    k3c_scheduler_stats_get(s, out);
    *checked = k3c_engine_ranks_checked(e);
    k3c_engine_stats est;
    k3c_engine_stats_get(e, &est);
    *steps = est.steps;
    char msg[1024] = "";
    if (rc != K3C_OK) snprintf(msg, sizeof msg, "%s", k3c_error_message());
    k3c_scheduler_free(s);
    k3c_engine_free(e);
    return rc == K3C_OK ? K3C_OK : k3c_errorf("dcp %d: %s", dcp, msg);
}

static int collect_token(void *u, int32_t tok) {
    int32_t *c = u;
    c[1 + c[0]++] = tok;
    return 0;
}

TEST(dcp_scheduler_tp2_matches_tp2) {
    k3c_config c;
    CHECK_OK(tp_config(0, 0, &c));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dcp_sched", test_tmpdir());
    int rc = k3c_synth_write(&c, NULL, test_seed(), dir);
    k3c_config_free(&c);
    CHECK_OK(rc);
    CHECK_OK(damp_residual_writes_in(dir, 0.05f)); /* nearly a bigram model: drafts get accepted */
    k3c_model *m;
    CHECK_OK(k3c_load(dir, &m));
    k3c_model_info info;
    CHECK_OK(k3c_model_info_get(m, &info));
    static sjob a[NJOBS], b[NJOBS];
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x5cd);
    /* each prompt: the shared prefix, 8 .. 23 tokens of its own ending in t, the model's greedy continuation of
     * that (world size 1) and t again, so that the prompt-lookup drafts of the continuation get accepted (as
     * tests/test_ranks.c builds them) */
    k3c_engine_options go;
    k3c_engine_options_default(&go);
    go.exact_f32 = 1;
    go.max_requests = 1;
    go.max_context = PREFIX + OWN + CONT;
    k3c_engine *ge = NULL;
    CHECK_OK(k3c_engine_create(m, &go, &ge));
    for (int j = 0; j < NJOBS; j++) {
        int own = 8 + 5 * j;
        for (int i = 0; i < PREFIX + own; i++)
            a[j].prompt[i] = j > 0 && i < PREFIX ? a[0].prompt[i] : (int32_t)(k3c_rng_next(&g) % (uint64_t)info.vocab_size);
        int32_t cont[1 + CONT] = {0};
        rc = k3c_generate(ge, a[j].prompt, PREFIX + own, CONT, NULL, collect_token, cont, NULL);
        if (rc != K3C_OK) k3c_engine_free(ge);
        CHECK_OK(rc);
        memcpy(a[j].prompt + PREFIX + own, cont + 1, sizeof(int32_t) * CONT);
        a[j].prompt[PREFIX + own + CONT] = a[j].prompt[PREFIX + own - 1];
        a[j].n_prompt = PREFIX + own + CONT + 1;
        b[j] = a[j];
    }
    k3c_engine_free(ge);
    k3c_scheduler_stats sa, sb;
    long ca, cb, stepa, stepb;
    rc = sched_run(m, 1, a, &sa, &ca, &stepa);
    if (rc == K3C_OK) rc = sched_run(m, 2, b, &sb, &cb, &stepb);
    k3c_free(m);
    CHECKF(rc == K3C_OK, "%s", k3c_error_message());
    int equal = 0, ties = 0;
    for (int j = 0; j < NJOBS; j++) {
        CHECKF(a[j].finished && b[j].finished && a[j].n_out == SNEW && b[j].n_out == SNEW, "job %d unfinished", j);
        int t = 0;
        while (t < SNEW && a[j].out[t] == b[j].out[t]) t++;
        equal += t;
        if (t < SNEW) { /* only at a near-tie of tp 2's logits */
            CHECKF(a[j].gap[t] < 1e-4f, "job %d: the dcp stream parts at token %d (margin %g)", j, t, (double)a[j].gap[t]);
            ties++;
        }
    }
    printf("    scheduler tp 2 dcp 2 (f32): %d of %d tokens as tp 2 (%d streams parted at a near-tie); %ld steps (%ld "
           "tp 2), all %ld compared across the ranks; drafts accepted %ld / %ld; prefix hits %ld tokens (%ld tp 2); "
           "preemptions %ld (%ld tp 2)\n", equal, NJOBS * SNEW, ties, stepb, stepa, cb, sb.spec_accepted_tokens,
           sb.spec_draft_tokens, sb.prefix_hits_tokens, sa.prefix_hits_tokens, sb.preemptions, sa.preemptions);
    CHECKF(cb == stepb, "%ld of %ld steps compared across the ranks", cb, stepb);
    CHECKF(sb.spec_accepted_tokens > 0 && sb.prefix_hits_tokens > 0 && sb.preemptions > 0,
           "accepted drafts %ld, prefix hits %ld, preemptions %ld", sb.spec_accepted_tokens, sb.prefix_hits_tokens,
           sb.preemptions);
}

TEST(dcp_cli_generate_equals_tp) {
    char k3c[4096], cmd[16384], out1[4300], out2[4300];
    CHECK(test_k3c_binary(k3c, sizeof k3c));
    snprintf(out1, sizeof out1, "%s/dcp_cli_1.txt", test_tmpdir());
    snprintf(out2, sizeof out2, "%s/dcp_cli_2.txt", test_tmpdir());
    const char *args = "generate --prompt 'A penny saved is' -n 48 --ignore-eos --exact-f32 --tp 2";
    snprintf(cmd, sizeof cmd, "%s %s > %s 2>/dev/null", k3c, args, out1);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s %s --dcp 2 > %s 2>/dev/null", k3c, args, out2);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "cmp -s %s %s && test -s %s", out1, out2, out1);
    CHECKF(test_run_status(cmd) == 0, "k3c generate --tp 2 --dcp 2 printed other text than --tp 2 (%s, %s)", out1, out2);
    snprintf(cmd, sizeof cmd, "%s generate --prompt-ids 1,2 -n 2 --tp 2 --dcp 4 2>&1 | grep -q 'dcp 4'", k3c);
    CHECK(test_run_status(cmd) == 0);
}

/* ---- the forward: the two exchanges ---- */

typedef struct fwd_rank {
    const k3c_model *m;
    k3c_comm *tp, *dcp_group; /* dcp_group: tp's communicator with or without its all_to_all */
    const int32_t *toks;      /* [40 + 16] */
    float *lg;                /* [40 + 16, V] */
    int rc;
} fwd_rank;

enum { FP = 40, FN = 16 };

static int fwd_run(fwd_rank *r) {
    const k3c_config *c = &r->m->config;
    int V = c->vocab_size * r->m->tp_size, bs = 8;
    k3c_backend *be = k3c_backend_cpu_create(1);
    if (!be) return K3C_ERR;
    k3c_forward_options o = {.max_rows = FP, .max_segs = 1, .max_context = FP + FN, .block_size = bs, .tp = r->tp,
                             .dcp = r->tp->size, .dcp_group = r->dcp_group};
    k3c_forward *f = NULL;
    k3c_kv_cache kv = {0};
    k3c_kda_slots ks = {0};
    int32_t table[16];
    int nb = ((FP + FN + 1) / 2 + bs - 1) / bs;
    int rc = k3c_forward_create(be, r->m, &o, &f);
    if (rc == K3C_OK) rc = k3c_kv_cache_init(&kv, be, c, nb, bs);
    if (rc == K3C_OK) rc = k3c_kda_slots_init(&ks, be, c, 1, 1, 1);
    if (rc == K3C_OK) {
        k3c_kda_slots_reset(&ks, be, 0);
        for (int i = 0; i < nb; i++) table[i] = k3c_kv_cache_take(&kv);
        k3c_fwd_req q = {.ids = r->toks, .n = FP, .block_table = table, .slot = 0, .logits = K3C_LOGITS_ALL};
        rc = k3c_forward_step(f, &kv, &ks, &q, 1, r->lg, NULL);
        for (int s = 0; s < FN && rc == K3C_OK; s++) {
            q = (k3c_fwd_req){.ids = r->toks + FP + s, .n = 1, .pos = FP + s, .block_table = table, .slot = 0,
                              .logits = K3C_LOGITS_LAST};
            rc = k3c_forward_step(f, &kv, &ks, &q, 1, r->lg + (size_t)(FP + s) * V, NULL);
        }
    }
    k3c_kda_slots_release(&ks, be);
    k3c_kv_cache_release(&kv, be);
    k3c_forward_free(f);
    be->destroy(be);
    return rc;
}

static void *fwd_thread(void *p) {
    fwd_rank *r = p;
    r->rc = fwd_run(r);
    return NULL;
}

TEST(dcp_forward_exchanges_agree) {
    k3c_model *m;
    CHECK_OK(tiny_k3("dcp_fwd", &m));
    int V = m->config.vocab_size, tp = 4;
    int32_t toks[FP + FN];
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xe7c);
    for (int i = 0; i < FP + FN; i++) toks[i] = (int32_t)(k3c_rng_next(&g) % (uint64_t)V);
    size_t n = (size_t)(FP + FN) * V;
    float *lg[2][4];
    k3c_model *sh[4];
    for (int k = 0; k < tp; k++) CHECK_OK(k3c_model_shard_tp(m, k, tp, &sh[k]));
    for (int way = 0; way < 2; way++) { /* 0: all-to-all; 1: the all-gather and pick */
        k3c_comm_group *grp;
        CHECK_OK(k3c_comm_group_create(tp, 30000, &grp));
        fwd_rank runs[4];
        k3c_comm *c[4], nog[4];
        pthread_t th[4];
        for (int k = 0; k < tp; k++) {
            CHECK_OK(k3c_comm_group_join(grp, k, &c[k]));
            CHECK(c[k]->all_to_all != NULL);
            nog[k] = *c[k];
            nog[k].all_to_all = NULL;
            lg[way][k] = malloc(sizeof(float) * n);
            poison_f32(lg[way][k], n);
            runs[k] = (fwd_rank){.m = sh[k], .tp = c[k], .dcp_group = way ? &nog[k] : NULL, .toks = toks,
                                 .lg = lg[way][k]};
        }
        for (int k = 0; k < tp; k++) pthread_create(&th[k], NULL, fwd_thread, &runs[k]);
        for (int k = 0; k < tp; k++) pthread_join(th[k], NULL);
        for (int k = 0; k < tp; k++) {
            CHECKF(runs[k].rc == K3C_OK, "way %d rank %d: %s", way, k, k3c_error_message());
            c[k]->free(c[k]);
        }
    }
    int same = 1;
    for (int way = 0; way < 2; way++)
        for (int k = 0; k < tp; k++) same &= memcmp(lg[way][k], lg[0][0], sizeof(float) * n) == 0;
    for (int i = 0; i < (int)n; i++) CHECK(isfinite(lg[0][0][i]));
    CHECKF(same, "the all-to-all and the all-gather of the partials (or the ranks) gave different logits");
    for (int way = 0; way < 2; way++)
        for (int k = 0; k < tp; k++) free(lg[way][k]);
    for (int k = 0; k < tp; k++) k3c_model_shard_free(sh[k]);
    k3c_free(m);
}
