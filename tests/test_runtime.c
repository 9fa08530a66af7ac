/* Runtime pieces beside the forward: the sampler, the MLA block allocator and the engine's logits buffers. */
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "logits_alloc_case.h"
#include "cache/kv_cache.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

TEST(runtime_sampler_greedy_and_top_k1) {
    int V = 1000;
    float *lg = malloc(sizeof(float) * V);
    CHECK(lg);
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    for (int i = 0; i < V; i++) lg[i] = (float)k3c_rng_normal(&r);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (lg[i] > lg[best]) best = i;
    k3c_sampler *g, *k1;
    k3c_sampling sg = {0}, sk = {.temperature = 1.5f, .top_k = 1, .seed = test_seed()};
    CHECK_OK(k3c_sampler_create(&sg, V, &g));
    CHECK_OK(k3c_sampler_create(&sk, V, &k1));
    for (int t = 0; t < 20; t++) {
        CHECK(k3c_sampler_sample(g, lg) == best);
        CHECK(k3c_sampler_sample(k1, lg) == best);
    }
    k3c_sampler_free(g);
    k3c_sampler_free(k1);
    free(lg);
}

/* Frequencies of temperature sampling follow softmax(l / T); top-p keeps the smallest nucleus. */
TEST(runtime_sampler_distribution) {
    float lg[4] = {0.0f, 1.0f, 2.0f, -1.0f};
    double T = 0.7, p[4], z = 0;
    for (int i = 0; i < 4; i++) z += p[i] = exp(lg[i] / T);
    int cnt[4] = {0};
    k3c_sampling s = {.temperature = (float)T, .seed = test_seed()};
    k3c_sampler *x;
    CHECK_OK(k3c_sampler_create(&s, 4, &x));
    int N = 40000;
    for (int i = 0; i < N; i++) cnt[k3c_sampler_sample(x, lg)]++;
    k3c_sampler_free(x);
    for (int i = 0; i < 4; i++) CHECK_CLOSE((double)cnt[i] / N, p[i] / z, 0.015, 0);
    /* top-p 0.5: p(2) alone is ~0.76 of the mass, so only token 2 remains */
    k3c_sampling sp = {.temperature = (float)T, .top_p = 0.5f, .seed = test_seed() + 1};
    CHECK_OK(k3c_sampler_create(&sp, 4, &x));
    for (int i = 0; i < 200; i++) CHECK(k3c_sampler_sample(x, lg) == 2);
    k3c_sampler_free(x);
    /* same seed, same stream */
    k3c_sampler *a, *b;
    k3c_sampling ss = {.temperature = 1.0f, .top_k = 3, .seed = test_seed()};
    CHECK_OK(k3c_sampler_create(&ss, 4, &a));
    CHECK_OK(k3c_sampler_create(&ss, 4, &b));
    for (int i = 0; i < 100; i++) {
        int ta = k3c_sampler_sample(a, lg);
        CHECK(ta == k3c_sampler_sample(b, lg));
        CHECK(ta != 3); /* outside the top 3 */
    }
    k3c_sampler_free(a);
    k3c_sampler_free(b);
}

/* Top-k sampling (with and without top-p) picks exactly what ranking the whole vocabulary would: a
 * reference that sorts every id (logit descending, ties to the lower id), keeps the first k, forms softmax(l / T)
 * in double over that order, cuts the nucleus, and draws one uniform from the top 53 bits of the same seeded
 * generator. Logits are quantised so that ties are frequent (the order among equal logits matters). */
typedef struct ranked {
    float l;
    int id;
} ranked;

static int ranked_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return x->id - y->id;
}

static int ref_sample(const float *lg, int V, const k3c_sampling *s, k3c_rng *rng, ranked *rk, float *prob) {
    for (int i = 0; i < V; i++) rk[i] = (ranked){lg[i], i};
    qsort(rk, (size_t)V, sizeof *rk, ranked_desc);
    int n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += prob[i] = (float)exp(((double)rk[i].l - rk[0].l) / s->temperature);
    if (s->top_p > 0 && s->top_p < 1) {
        /* the nucleus share: over the kept top-k, or (top-p alone) over every id, summed in id order */
        double z = sum, acc = 0;
        if (n == V) {
            z = 0;
            for (int i = 0; i < V; i++) z += exp(((double)lg[i] - rk[0].l) / s->temperature);
        }
        for (int i = 0; i < n; i++) {
            acc += prob[i] / z;
            if (acc >= s->top_p) {
                n = i + 1;
                break;
            }
        }
        sum = 0;
        for (int i = 0; i < n; i++) sum += prob[i];
    }
    double u = (double)(k3c_rng_next(rng) >> 11) * 0x1.0p-53 * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += prob[i];
        if (u < acc) return rk[i].id;
    }
    return rk[n - 1].id;
}

TEST(runtime_sampler_top_k_matches_full_ranking) {
    int V = 5000;
    float *lg = malloc(sizeof(float) * V), *prob = malloc(sizeof(float) * V);
    ranked *rk = malloc(sizeof *rk * V);
    CHECK(lg && prob && rk);
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x70b4);
    int ks[] = {1, 2, 7, 40, 1000, V - 1, V};
    float ps[] = {0.0f, 0.5f, 0.9f, 0.99f, 1.0f};
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
        for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++) {
            if (ks[ki] == V && (ps[pi] == 0.0f || ps[pi] == 1.0f)) continue; /* no filter: the unranked path */
            k3c_sampling s = {.temperature = 0.5f + (float)k3c_rng_uniform(&r), .top_k = ks[ki], .top_p = ps[pi],
                              .seed = k3c_rng_next(&r)};
            k3c_sampler *x;
            CHECK_OK(k3c_sampler_create(&s, V, &x));
            k3c_rng ref;
            k3c_rng_seed(&ref, s.seed);
            for (int t = 0; t < 30; t++) {
                /* a step of 1/8 over a few units: hundreds of ids share each value; every other token peaked
                 * (8x wider spread: a nucleus of a few to a few hundred ids, the partial-ranking path of
                 * top-p alone) */
                float spread = t % 2 ? 8.0f : 1.0f;
                for (int i = 0; i < V; i++) lg[i] = (float)(int)(k3c_rng_normal(&r) * 16 * spread) / 8.0f;
                int want = ref_sample(lg, V, &s, &ref, rk, prob);
                int got = k3c_sampler_sample(x, lg);
                CHECKF(got == want, "top_k %d top_p %g token %d: sampled %d, full ranking %d", s.top_k,
                       (double)s.top_p, t, got, want);
            }
            k3c_sampler_free(x);
        }
    free(lg), free(prob), free(rk);
}

/* The block free list hands out every block exactly once and takes them back. */
TEST(runtime_kv_blocks) {
    k3c_config c = {0};
    k3c_attn_kind kinds[2] = {K3C_ATTN_KDA, K3C_ATTN_MLA};
    c.num_layers = 2;
    c.layer_attn = kinds;
    c.kv_lora_rank = 8;
    c.qk_rope_head_dim = 4;
    k3c_backend *be = k3c_backend_cpu_create(1);
    CHECK(be);
    k3c_kv_cache kv;
    CHECK_OK(k3c_kv_cache_init(&kv, be, &c, 5, 4));
    CHECK(kv.layer[0] == NULL && kv.layer[1] != NULL);
    int seen[5] = {0};
    for (int i = 0; i < 5; i++) {
        int b = k3c_kv_cache_take(&kv);
        CHECK(b >= 0 && b < 5 && !seen[b]);
        seen[b] = 1;
    }
    CHECK(k3c_kv_cache_take(&kv) == -1);
    k3c_kv_cache_give(&kv, be, 3, 1);
    float *blk = (float *)kv.layer[1] + 3 * 4 * 12;
    for (int i = 0; i < 4 * 12; i++) CHECK(isnan(blk[i]));
    CHECK(k3c_kv_cache_take(&kv) == 3);
    k3c_kv_cache_release(&kv, be);
    be->destroy(be);
}

/* Cache sizing from caller options is 64-bit: max_context x max_requests beyond an int is refused with a
 * message, never an overflowed (undefined, then undersized) block count; an oversized step is refused too. */
TEST(runtime_engine_rejects_oversized_options) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/engine-opts-tiny", test_tmpdir());
    CHECK_OK(k3c_synthesize("tiny", test_seed(), dir));
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    k3c_engine_options o;
    k3c_engine_options_default(&o);
    o.max_requests = 4096;
    o.max_context = 0x7ffffff0;
    k3c_engine *e = NULL;
    CHECK(k3c_engine_create(m, &o, &e) != K3C_OK);
    CHECKF(strstr(k3c_last_error(), "context length of 1048576") != NULL, "message: %s", k3c_last_error());
    CHECK(e == NULL);
    /* within the model's context, the block count of 4096 x 2^20 one-token blocks does not fit an int */
    o.max_context = 1 << 20;
    o.block_size = 1;
    CHECK(k3c_engine_create(m, &o, &e) != K3C_OK);
    CHECKF(strstr(k3c_last_error(), "cache blocks") != NULL, "message: %s", k3c_last_error());
    CHECK(e == NULL);

    k3c_engine_options_default(&o);
    o.max_requests = 1;
    o.max_context = 8;
    o.max_rows = 4;
    o.q_max = 1;
    CHECK_OK(k3c_engine_create(m, &o, &e));
    int id = -1;
    CHECK_OK(k3c_request_open(e, &id));
    int32_t tok = 1;
    k3c_step_item it = {.request = id, .tokens = &tok, .n = 0x7fffffff};
    float lg[1];
    CHECK(k3c_engine_step(e, &it, 1, lg) != K3C_OK);
    CHECKF(strstr(k3c_last_error(), "max_context") != NULL, "message: %s", k3c_last_error());
    k3c_engine_free(e);
    k3c_free(m);
}

/* A NaN temperature or top_p is refused at creation instead of sampling from NaN probabilities. */
TEST(runtime_sampler_rejects_nan) {
    k3c_sampler *x = NULL;
    k3c_sampling s = {.temperature = NAN};
    CHECK(k3c_sampler_create(&s, 10, &x) != K3C_OK && x == NULL);
    s = (k3c_sampling){.temperature = INFINITY};
    CHECK(k3c_sampler_create(&s, 10, &x) != K3C_OK && x == NULL);
    s = (k3c_sampling){.temperature = 1.0f, .top_p = NAN};
    CHECK(k3c_sampler_create(&s, 10, &x) != K3C_OK && x == NULL);
    s = (k3c_sampling){.temperature = -1.0f, .top_p = 2.0f}; /* documented: greedy, top-p off */
    CHECK_OK(k3c_sampler_create(&s, 10, &x));
    k3c_sampler_free(x);
}

/* k3c_engine_logits_alloc on the CPU engine (malloc'ed): steps into it as into any buffer (tests/logits_alloc_case.h;
 * test_gpu runs the same case on the CUDA engine, where the buffer is page-locked). */
TEST(runtime_engine_logits_alloc) { logits_alloc_case("cpu"); }

/* k3c_engine_logits_alloc when page-locked memory is refused, on the CPU engine through a stub host_alloc
 * (tests/logits_alloc_case.h; test_gpu runs the same case on the CUDA engine). */
TEST(runtime_engine_logits_fallback) { logits_fallback_case("cpu"); }
