/* Parallel layouts (k3c_layout_plan, k3c plan): per-rank bytes against sums written by hand from the
 * published tensor tables (../shared/spec/k3-checkpoint.md §2 for K3; Kimi-Linear-48B-A3B's config.json
 * shapes), not from the inventory the code walks. */
#include <stdlib.h>

#include "k3c.h"
#include "model/layout.h"
#include "model/presets.h"
#include "test.h"
#include "util/error.h"

#define U(x) ((uint64_t)(x))

/* K3 (k3-checkpoint.md §2.1-2.6): bytes of one layer's parts as published, each tensor as `share` of TP
 * ranks hold it (split tensors / tp, replicated whole). */
typedef struct k3_parts {
    uint64_t model_embed, model_head, common, kda, mla, dense, moe_nonexpert, expert;
} k3_parts;

static k3_parts k3_bytes(uint64_t tp) {
    k3_parts p;
    p.model_embed = U(163840) * 7168 * 2 / tp;                                /* embed_tokens, vocab split */
    p.model_head = U(163840) * 7168 * 2 / tp + 7168 * 2 + 7168 * 2 + 7168 * 2; /* lm_head + norm + output AttnRes */
    /* every layer: 2 norms, 2 AttnRes proj + norm (replicated); g_proj, o_proj (split) */
    p.common = 6 * U(7168) * 2 + (U(12288) * 7168 * 2 + U(7168) * 12288 * 2) / tp;
    p.kda = (3 * U(12288) * 7168 * 2         /* q, k, v */
             + 3 * U(12288) * 4 * 4          /* convs [12288, 1, 4] F32 */
             + U(12288) * 128 * 2            /* f_b */
             + U(96) * 7168 * 2              /* b_proj */
             + U(12288) * 4) / tp            /* dt_bias F32 */
            + U(128) * 7168 * 2              /* f_a, replicated */
            + 128 * 4 + 128 * 4;             /* A_log [128] F32 (whole), o_norm [128] F32 */
    p.mla = (U(18432) * 1536 * 2 + U(24576) * 512 * 2) / tp                  /* q_b, kv_b */
            + U(1536) * 7168 * 2 + 1536 * 2 + U(576) * 7168 * 2 + 512 * 2; /* q_a, its norm, kv_a, its norm */
    p.dense = 3 * U(33792) * 7168 * 2 / tp;
    p.moe_nonexpert = U(896) * 7168 * 2 + 896 * 4                 /* router, correction bias (F32) */
                      + U(3584) * 7168 * 2 + 3584 * 2 + U(7168) * 3584 * 2 /* latent down, norm, up */
                      + 3 * U(6144) * 7168 * 2 / tp;               /* shared experts (2 x 3072) */
    p.expert = U(17547264) / tp; /* one routed expert: w1, w2, w3 packed + scales (§2.6: 17,547,264 B) */
    return p;
}

/* K3's schedule (§1): MLA at zero-based L % 4 == 3 (L <= 91) and 92; layer 0 dense, 1..92 MoE. */
static int k3_is_mla(int l) { return l == 92 || l % 4 == 3; }

static uint64_t k3_stage_bytes(uint64_t tp, int first, int end, int embed, int head, uint64_t *experts) {
    k3_parts p = k3_bytes(tp);
    uint64_t b = (embed ? p.model_embed : 0) + (head ? p.model_head : 0);
    *experts = 0;
    for (int l = first; l < end; l++) {
        b += p.common + (k3_is_mla(l) ? p.mla : p.kda);
        if (l == 0) {
            b += p.dense;
        } else {
            b += p.moe_nonexpert + 896 * p.expert;
            *experts += 896 * p.expert;
        }
    }
    return b;
}

static k3c_layout layout_of(int tp, int pp, int dp, int ep, int hosts) {
    return (k3c_layout){.tp = tp, .pp = pp, .dp = dp, .ep = ep, .hosts = hosts, .gpu_mem = (uint64_t)143771 << 20,
                        .context = 8192, .requests = 4, .hbm_bytes_per_s = 4.2e12};
}

TEST(layout_k3_world1_spec_bytes) {
    k3c_layout l = layout_of(1, 1, 1, 1, 1);
    k3c_layout_rank r[1];
    int n = 0;
    CHECK_OK(k3c_layout_plan(NULL, "k3", &l, r, 1, &n));
    CHECK(n == 1);
    uint64_t experts, want = k3_stage_bytes(1, 0, 93, 1, 1, &experts);
    CHECKF(r[0].weight_bytes == want, "K3 text bytes %llu, the spec's tables sum to %llu",
           (unsigned long long)r[0].weight_bytes, (unsigned long long)want);
    CHECK(r[0].routed_expert_bytes == experts);
    /* the published payload (k3-checkpoint.md §1, 1,560,860,324,864 B) is this plus the vision tower and
     * projector, which k3c skips: the text model is less, and by less than a GB */
    CHECK(want < U(1560860324864) && U(1560860324864) - want < U(1000000000));
    CHECK(r[0].num_kda_layers == 69 && r[0].num_mla_layers == 24 && r[0].num_moe_layers == 92);
    CHECK(r[0].mla_bytes_per_token == U(576) * 2 * 24);
    CHECK(r[0].kda_bytes_per_request == 69 * (U(96) * 128 * 128 * 4 + 3 * U(3) * 12288 * 4));
    CHECK(!r[0].fits);
    l.kv_fp8 = 1; /* FP8 E4M3 latents: one byte an element */
    CHECK_OK(k3c_layout_plan(NULL, "k3", &l, r, 1, &n));
    CHECK(r[0].mla_bytes_per_token == U(576) * 24 && r[0].mla_cache_bytes == U(576) * 24 * 8192 * 4);
}

TEST(layout_k3_tp8_pp2_per_rank) {
    k3c_layout l = layout_of(8, 2, 1, 1, 2);
    k3c_layout_rank r[16];
    int n = 0;
    CHECK_OK(k3c_layout_plan(NULL, "k3", &l, r, 16, &n));
    CHECK(n == 16);
    uint64_t e0, e1;
    uint64_t s0 = k3_stage_bytes(8, 0, 46, 1, 0, &e0), s1 = k3_stage_bytes(8, 46, 93, 0, 1, &e1);
    for (int i = 0; i < 16; i++) {
        const k3c_layout_rank *k = &r[i];
        int st = i / 8;
        CHECKF(k->pp_stage == st && k->tp_rank == i % 8 && k->host == st && k->dp_rank == 0, "rank %d placed at tp %d "
               "pp %d host %d", i, k->tp_rank, k->pp_stage, k->host);
        CHECK(k->layer_first == (st ? 46 : 0) && k->num_layers == (st ? 47 : 46));
        CHECKF(k->weight_bytes == (st ? s1 : s0), "rank %d: %llu bytes, by hand %llu", i,
               (unsigned long long)k->weight_bytes, (unsigned long long)(st ? s1 : s0));
        CHECK(k->routed_expert_bytes == (st ? e1 : e0));
        /* stage 0: MLA 3, 7, ..., 43 (11); stage 1: 47, ..., 91 and 92 (13) */
        CHECK(k->num_mla_layers == (st ? 13 : 11) && k->num_kda_layers == (st ? 34 : 35));
        CHECK(k->mla_bytes_per_token == U(576) * 2 * (st ? 13 : 11));
        CHECK(k->mla_cache_bytes == k->mla_bytes_per_token * 8192 * 4);
        /* 12 local heads: state 12 x 128 x 128 f32, window 3 x 3 x 1536 f32 */
        CHECK(k->kda_bytes_per_request == (st ? 34 : 35) * (U(12) * 128 * 128 * 4 + U(3) * 3 * 1536 * 4));
        CHECK(k->kda_bytes == 4 * k->kda_bytes_per_request);
        CHECK(k->total_bytes == k->weight_bytes + k->mla_cache_bytes + k->kda_bytes);
        CHECK(k->fits == (k->total_bytes <= ((uint64_t)143771 << 20)));
        CHECK(k->fits);
        CHECK(k->floor_ms > 0 && isfinite(k->floor_ms));
    }
    /* one stage on 8 GPUs does not fit: 205 GB a rank */
    l = layout_of(8, 1, 1, 1, 1);
    CHECK_OK(k3c_layout_plan(NULL, "k3", &l, r, 16, &n));
    CHECK(n == 8 && !r[0].fits && r[0].weight_bytes > ((uint64_t)143771 << 20));
}

/* The floor of Kimi-Linear-48B at world size 1, one request, written out: every non-expert weight once, the
 * embedding as one bf16 row, 8 distinct experts of 256 in each of 26 MoE layers (one row selects k = 8),
 * the MLA cache read over context + 1 positions and one row written, the KDA state and window read + written. */
TEST(layout_kimi_linear_48b_bytes_and_floor) {
    /* config.json of Kimi-Linear-48B-A3B: hidden 2304, 27 layers (MLA at 1-based 4, 8, ..., 24, 27), 32 KDA
     * heads x 128, 32 MLA heads, kv_lora 512 + rope 64, nope 128, v 128, no q_lora, no MLA gate; dense layer 0
     * of 9216; 26 MoE layers of 256 bf16 experts of 1024 (top 8) + 1 shared; all tensors bf16 */
    uint64_t D = 2304, P = 4096;
    uint64_t kda = (3 * P * D + 3 * P * 4 + 128 * D + P * 128 + 32 * D + 128 * D + P * 128 + 32 + P + 128 + D * P) * 2;
    uint64_t mla = (32 * 192 * D + 576 * D + 512 + 32 * 256 * 512 + D * P) * 2;
    uint64_t common = 2 * D * 2, dense = 3 * U(9216) * D * 2;
    uint64_t expert = 3 * U(1024) * D * 2, moe_ne = (256 * D + 256 + 3 * 1024 * D) * 2;
    uint64_t embed = U(163840) * D * 2, head = embed + D * 2;
    uint64_t total = embed + head + 27 * common + 20 * kda + 7 * mla + dense + 26 * (moe_ne + 256 * expert);
    k3c_layout l = layout_of(1, 1, 1, 1, 1);
    l.requests = 1;
    l.context = 100;
    k3c_layout_rank r[2];
    int n = 0;
    CHECK_OK(k3c_layout_plan(NULL, "kimi-linear-48b", &l, r, 2, &n));
    CHECKF(r[0].weight_bytes == total, "%llu bytes, by hand %llu", (unsigned long long)r[0].weight_bytes,
           (unsigned long long)total);
    double distinct = 256.0 * (1.0 - pow(1.0 - 8.0 / 256, 1));
    double slot = 32.0 * 128 * 128 * 4 + 3.0 * 3 * P * 4;
    double step = (double)(total - 26 * 256 * expert - embed) + 2.0 * D + 26 * distinct * (double)expert +
                  7 * (101.0 * 576 * 2 + 576 * 2) + 20 * 2 * slot;
    CHECK_CLOSE(r[0].step_bytes, step, 0, 1e-12);
    CHECK_CLOSE(r[0].floor_ms, step / 4.2e12 * 1e3, 0, 1e-12);
    CHECK(r[0].fits);
    /* TP 2: everything but the replicated parts halves */
    l = layout_of(2, 1, 1, 1, 1);
    CHECK_OK(k3c_layout_plan(NULL, "kimi-linear-48b", &l, r, 2, &n));
    uint64_t repl = 27 * common + D * 2 /* final norm */ + 20 * (2 * 128 * D + 32 + 128) * 2 /* f_a, g_a, A_log, o_norm */
                    + 7 * (576 * D + 512) * 2 + 26 * (256 * D + 256) * 2;
    CHECK(n == 2 && r[0].weight_bytes == r[1].weight_bytes);
    CHECKF(r[0].weight_bytes == (total - repl) / 2 + repl, "tp 2: %llu, by hand %llu",
           (unsigned long long)r[0].weight_bytes, (unsigned long long)((total - repl) / 2 + repl));
    CHECK(r[0].kda_bytes_per_request == 20 * (U(16) * 128 * 128 * 4 + U(3) * 3 * 2048 * 4));
}

/* EP over the 16 ranks of one stage: 896 / 16 = 56 whole experts a rank, every other tensor TP 16; DEP
 * (tp 1, dp 8, ep 8): attention replicated, 112 experts a rank, and the experts see all 8 ranks' rows. */
TEST(layout_k3_expert_parallel) {
    k3c_layout l = layout_of(16, 1, 1, 16, 2);
    k3c_layout_rank r[16];
    int n = 0;
    CHECK_OK(k3c_layout_plan(NULL, "k3", &l, r, 16, &n));
    uint64_t e, tp_all = k3_stage_bytes(16, 0, 93, 1, 1, &e);
    uint64_t want = tp_all - e + 92 * U(56) * 17547264;
    for (int i = 0; i < 16; i++) {
        CHECK(r[i].ep_rank == i && r[i].routed_expert_bytes == 92 * U(56) * 17547264);
        CHECKF(r[i].weight_bytes == want, "rank %d: %llu, by hand %llu", i, (unsigned long long)r[i].weight_bytes,
               (unsigned long long)want);
    }
    l = layout_of(1, 1, 8, 8, 1);
    k3c_layout_rank d[8];
    CHECK_OK(k3c_layout_plan(NULL, "k3", &l, d, 8, &n));
    CHECK(n == 8 && d[3].dp_rank == 3 && d[3].ep_rank == 3 && d[3].tp_rank == 0);
    CHECK(d[3].routed_expert_bytes == 92 * U(112) * 17547264);
    /* the floor reads the experts selected by 8 ranks x 4 rows: 896 (1 - (1 - 16/896)^32) distinct, 1/8 here */
    uint64_t ne = d[3].weight_bytes - d[3].routed_expert_bytes;
    double distinct = 896.0 * (1.0 - pow(1.0 - 16.0 / 896, 32));
    double experts = 92 * distinct / 896 * (112.0 * 17547264);
    double kv = 24 * (4 * 8193.0 * 576 * 2 + 4 * 576 * 2), slot = 96.0 * 128 * 128 * 4 + 9.0 * 12288 * 4;
    double step = (double)ne - 163840.0 * 7168 * 2 + 2.0 * 4 * 7168 + experts + kv + 69 * 4 * 2 * slot;
    CHECK_CLOSE(d[3].step_bytes, step, 0, 1e-9);
}

TEST(layout_refuses_what_does_not_divide) {
    k3c_layout_rank r[64];
    int n = 7;
    k3c_layout l = layout_of(3, 1, 1, 1, 1);
    CHECK(k3c_layout_plan(NULL, "k3", &l, r, 64, &n) == K3C_ERR && n == 0);
    CHECK(strstr(k3c_error_message(), "tp 3"));
    l = layout_of(16, 1, 1, 4, 1); /* ep must span tp x dp */
    CHECK(k3c_layout_plan(NULL, "k3", &l, r, 64, &n) == K3C_ERR && strstr(k3c_error_message(), "ep 4"));
    l = layout_of(8, 2, 1, 1, 3); /* 16 ranks over 3 hosts */
    CHECK(k3c_layout_plan(NULL, "k3", &l, r, 64, &n) == K3C_ERR && strstr(k3c_error_message(), "3 hosts"));
    l = layout_of(8, 2, 1, 1, 1);
    CHECK(k3c_layout_plan(NULL, "k3", &l, r, 8, &n) == K3C_ERR && strstr(k3c_error_message(), "16 ranks"));
    l = layout_of(64, 1, 1, 1, 1); /* 96 heads do not split 64 ways */
    CHECK(k3c_layout_plan(NULL, "k3", &l, r, 64, &n) == K3C_ERR && strstr(k3c_error_message(), "96"));
    l = layout_of(1, 1, 1, 1, 1);
    CHECK(k3c_layout_plan(NULL, NULL, &l, r, 64, &n) == K3C_ERR);
    CHECK(k3c_layout_plan("x", "k3", &l, r, 64, &n) == K3C_ERR);
    CHECK(k3c_layout_plan(NULL, "no-such-preset", &l, r, 64, &n) == K3C_ERR);
    /* tiny: 2 KDA heads, 2 MLA heads; tp 2 works, tp 4 does not */
    l = layout_of(2, 1, 1, 1, 1);
    CHECK_OK(k3c_layout_plan(NULL, "tiny", &l, r, 64, &n));
    l = layout_of(4, 1, 1, 1, 1);
    CHECK(k3c_layout_plan(NULL, "tiny", &l, r, 64, &n) == K3C_ERR);
}

/* --config reads config.json (a file or its directory) exactly as the preset it was written from. */
TEST(layout_plan_cli_config_matches_preset) {
    char bin[4096], dir[4200], cmd[16384];
    CHECK(test_k3c_binary(bin, sizeof bin));
    snprintf(dir, sizeof dir, "%s/layout_k3", test_tmpdir());
    CHECK_OK(k3c_synthesize("k3", 1, dir));
    k3c_layout l = layout_of(8, 2, 1, 1, 2);
    k3c_layout_rank a[16], b[16];
    int n = 0, m = 0;
    CHECK_OK(k3c_layout_plan(dir, NULL, &l, a, 16, &n));
    CHECK_OK(k3c_layout_plan(NULL, "k3", &l, b, 16, &m));
    CHECK(n == 16 && m == 16 && memcmp(a, b, sizeof a) == 0);
    snprintf(cmd, sizeof cmd, "%s plan --config %s/config.json --tp 8 --pp 2 --hosts 2 --requests 4 > %s/plan.txt", bin,
             dir, dir);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "grep -q '^ *15 *1 *7 *1 *0 *46-92 *%llu ' %s/plan.txt", (unsigned long long)a[15].weight_bytes,
             dir);
    CHECK(test_run_status(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s plan --preset k3 --tp 3 > /dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 1);
    snprintf(cmd, sizeof cmd, "%s plan --tp 2 > /dev/null 2>&1", bin);
    CHECK(test_run_status(cmd) == 2);
}
