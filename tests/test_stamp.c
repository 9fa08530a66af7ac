/* The block-stamp report on the CPU (decode/stamp_report.h): synthetic records of launches whose every
 * block start, wait and warp end the test chose, shuffled as the regions of the device buffer would hand
 * them over; the expected launch, op, class and step numbers are worked out here from those times. */
#include <stdlib.h>
#include <string.h>

#include "decode/stamp_report.h"
#include "util/error.h"
#include "test.h"
#include "util/rng.h"

typedef struct recs {
    k3c_stamp_rec r[20000];
    size_t n;
} recs;

static void put(recs *R, uint32_t grid, int kid, int kind, uint32_t block, uint64_t t) {
    R->r[R->n++] = (k3c_stamp_rec){.t = t, .grid = grid, .info = K3C_STAMP_INFO(kind == K3C_STAMP_WAIT ? 0 : kid, kind, block)};
}

static void shuffle(recs *R, k3c_rng *g) {
    for (size_t i = R->n; i > 1; i--) {
        size_t j = k3c_rng_next(g) % i;
        k3c_stamp_rec t = R->r[i - 1];
        R->r[i - 1] = R->r[j];
        R->r[j] = t;
    }
}

/* Four launches of three ops (times in ns; see the expected values in stamp_op_stats_mapped). Grid ids wrap
 * past 2^32; a WAIT of a grid without BEGIN is an orphan; launch 1's block 1 has no END (its end: its WAIT). */
static void four_launches(recs *R) {
    R->n = 0;
    uint32_t g0 = 0xfffffffeu;
    put(R, g0, K3C_KID_GEMV_T1_GROUP, K3C_STAMP_BEGIN, 0, 1000);
    put(R, g0, 0, K3C_STAMP_WAIT, 0, 2000);
    put(R, g0, K3C_KID_GEMV_T1_GROUP, K3C_STAMP_END, 0, 4000);
    put(R, g0, K3C_KID_GEMV_T1_GROUP, K3C_STAMP_END, 0, 5000); /* the block's last warp */
    put(R, g0, K3C_KID_GEMV_T1_GROUP, K3C_STAMP_BEGIN, 1, 1500);
    put(R, g0, 0, K3C_STAMP_WAIT, 1, 2100);
    put(R, g0, K3C_KID_GEMV_T1_GROUP, K3C_STAMP_END, 1, 6000);
    uint32_t g1 = g0 + 1;
    put(R, g1, K3C_KID_MOE_BAND_LISTS, K3C_STAMP_BEGIN, 0, 5500);
    put(R, g1, K3C_KID_MOE_BAND_LISTS, K3C_STAMP_END, 0, 9000);
    put(R, g1, K3C_KID_MOE_BAND_LISTS, K3C_STAMP_BEGIN, 1, 5600);
    put(R, g1, 0, K3C_STAMP_WAIT, 1, 9500);
    uint32_t g2 = g1 + 1; /* 0 */
    put(R, g2, K3C_KID_MOE_BAND, K3C_STAMP_BEGIN, 0, 9800);
    put(R, g2, K3C_KID_MOE_BAND, K3C_STAMP_END, 0, 12000);
    uint32_t g3 = g2 + 1;
    put(R, g3, K3C_KID_MLA_ATTEND, K3C_STAMP_BEGIN, 0, 13000);
    put(R, g3, K3C_KID_MLA_ATTEND, K3C_STAMP_END, 0, 20000);
    put(R, g3, K3C_KID_MLA_ATTEND, K3C_STAMP_BEGIN, 1, 13100);
    put(R, g3, K3C_KID_MLA_ATTEND, K3C_STAMP_END, 1, 19000);
    put(R, g3, K3C_KID_MLA_ATTEND, K3C_STAMP_END, 1, 20500);
    put(R, 99, 0, K3C_STAMP_WAIT, 0, 3000); /* orphan */
}

TEST(stamp_launches_four) {
    static recs R;
    k3c_rng g;
    k3c_rng_seed(&g, test_seed());
    four_launches(&R);
    shuffle(&R, &g);
    k3c_stamp_launch *L;
    size_t nl;
    k3c_stamp_parse info;
    CHECK_OK(k3c_stamp_launches(R.r, R.n, &L, &nl, &info));
    CHECK(nl == 4 && info.records == R.n && info.orphans == 1 && info.inversions == 0 && !info.by_time && !info.dup_begin);
    CHECK(L[0].grid == 0xfffffffeu && L[1].grid == 0xffffffffu && L[2].grid == 0 && L[3].grid == 1);
    CHECK(L[0].kid == K3C_KID_GEMV_T1_GROUP && L[1].kid == K3C_KID_MOE_BAND_LISTS && L[3].kid == K3C_KID_MLA_ATTEND);
    CHECK(L[0].blocks == 2 && L[0].s0 == 1000 && L[0].s1 == 1500 && L[0].w0 == 2000 && L[0].w1 == 2100 &&
          L[0].e0 == 5000 && L[0].e1 == 6000 && L[0].blocks_no_end == 0);
    CHECK(L[1].blocks == 2 && L[1].blocks_no_end == 1 && L[1].e0 == 9000 && L[1].e1 == 9500 && L[1].w0 == 9500);
    CHECK(L[2].blocks == 1 && L[2].w0 == 0 && L[2].e0 == 12000);
    CHECK(L[3].e0 == 20000 && L[3].e1 == 20500);
    free(L);
}

/* Random launches: each block's start, optional wait and its warps' ends drawn here; the parse must give each
 * launch's first/last start and end exactly, in launch order, from the records in any order. */
TEST(stamp_launches_random) {
    static recs R;
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0x5157);
    for (int round = 0; round < 20; round++) {
        R.n = 0;
        int n = 1 + (int)(k3c_rng_next(&g) % 40);
        uint64_t s0[40], s1[40], e0[40], e1[40], t = 1000000 + k3c_rng_next(&g) % 1000;
        int blocks[40], noend[40];
        uint32_t base = (uint32_t)k3c_rng_next(&g);
        for (int l = 0; l < n; l++) {
            blocks[l] = 1 + (int)(k3c_rng_next(&g) % 30);
            noend[l] = 0;
            s0[l] = e0[l] = UINT64_MAX;
            s1[l] = e1[l] = 0;
            for (int b = 0; b < blocks[l]; b++) {
                /* a block's end: its last warp's END; with none, its WAIT (or its BEGIN without one) */
                uint64_t bs = t + (b == 0 ? 0 : 1 + k3c_rng_next(&g) % 3000), be = bs, last = 0;
                put(&R, base + (uint32_t)l, 1 + l % (K3C_KID_COUNT - 1), K3C_STAMP_BEGIN, (uint32_t)b, bs);
                if (k3c_rng_next(&g) % 2) {
                    be = bs + k3c_rng_next(&g) % 500;
                    put(&R, base + (uint32_t)l, 0, K3C_STAMP_WAIT, (uint32_t)b, be);
                }
                int warps = (int)(k3c_rng_next(&g) % 9); /* 0: no END at all */
                if (!warps) noend[l]++;
                for (int w = 0; w < warps; w++) {
                    uint64_t we = bs + 100 + k3c_rng_next(&g) % 20000;
                    put(&R, base + (uint32_t)l, 1 + l % (K3C_KID_COUNT - 1), K3C_STAMP_END, (uint32_t)b, we);
                    last = we > last ? we : last;
                }
                if (warps) be = last;
                s0[l] = bs < s0[l] ? bs : s0[l];
                s1[l] = bs > s1[l] ? bs : s1[l];
                e0[l] = be < e0[l] ? be : e0[l];
                e1[l] = be > e1[l] ? be : e1[l];
            }
            t += 1 + k3c_rng_next(&g) % 5000; /* the next launch starts no earlier */
        }
        shuffle(&R, &g);
        k3c_stamp_launch *L;
        size_t nl;
        k3c_stamp_parse info;
        CHECK_OK(k3c_stamp_launches(R.r, R.n, &L, &nl, &info));
        CHECKF(nl == (size_t)n && info.inversions == 0 && info.orphans == 0, "round %d: %zu launches of %d", round, nl, n);
        for (int l = 0; l < n; l++)
            CHECKF(L[l].grid == base + (uint32_t)l && L[l].blocks == blocks[l] && L[l].blocks_no_end == noend[l] &&
                       L[l].s0 == s0[l] && L[l].s1 == s1[l] && L[l].e0 == e0[l] && L[l].e1 == e1[l] &&
                       L[l].kid == 1 + l % (K3C_KID_COUNT - 1),
                   "round %d launch %d", round, l);
        free(L);
    }
}

/* Grid ids against launch order (three launches, ids descending as time goes on): counted as inversions,
 * and the launches ordered by their first start. A block stamped BEGIN twice is a shared grid id. */
TEST(stamp_launches_order_by_time) {
    static recs R;
    R.n = 0;
    put(&R, 30, K3C_KID_ADD, K3C_STAMP_BEGIN, 0, 100);
    put(&R, 20, K3C_KID_RMSNORM, K3C_STAMP_BEGIN, 0, 200);
    put(&R, 10, K3C_KID_EMBED, K3C_STAMP_BEGIN, 0, 300);
    put(&R, 10, K3C_KID_EMBED, K3C_STAMP_BEGIN, 0, 310);
    k3c_stamp_launch *L;
    size_t nl;
    k3c_stamp_parse info;
    CHECK_OK(k3c_stamp_launches(R.r, R.n, &L, &nl, &info));
    CHECK(nl == 3 && info.by_time && info.inversions > 0 && info.dup_begin == 1);
    CHECK(L[0].grid == 30 && L[1].grid == 20 && L[2].grid == 10 && L[2].e1 == 300);
    free(L);
}

static void three_op_plan(k3c_stamp_plan *p) {
    *p = (k3c_stamp_plan){0};
    k3c_stamp_plan_begin(p, "kda in-proj (group)");
    k3c_stamp_plan_bytes(p, 1e6);
    k3c_stamp_plan_end(p, 1, 0);
    k3c_stamp_plan_begin(p, "moe experts");
    k3c_stamp_plan_begin(p, "inner"); /* nested: part of the outer op */
    k3c_stamp_plan_end(p, 7, 7);
    k3c_stamp_plan_end(p, 2, 1);
    k3c_stamp_plan_bytes(p, 1000);
    k3c_stamp_plan_experts(p, 2, 1e5);
    k3c_stamp_plan_begin(p, "mla attend");
    k3c_stamp_plan_end(p, 1, 0);
    k3c_stamp_plan_positions(p, 10);
}

static int route_ids[3][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {3, 5, 3, 7}};
static const unsigned char is_moe3[3] = {0, 0, 1};

static k3c_stamp_step step3(void) {
    return (k3c_stamp_step){.rows = 2, .q = 1, .bandwidth = 4e12, .plain_ms = 0.018, .stamped_ms = 0.021,
                            .positions = 50, .tick_ns = 32, .route = &route_ids[0][0], .layers = 3, .k = 2,
                            .experts = 8, .is_moe = is_moe3};
}

TEST(stamp_op_stats_mapped) {
    static recs R;
    four_launches(&R);
    k3c_stamp_launch *L;
    size_t nl;
    k3c_stamp_parse info;
    CHECK_OK(k3c_stamp_launches(R.r, R.n, &L, &nl, &info));
    k3c_stamp_plan p;
    three_op_plan(&p);
    CHECK(p.n == 3 && !p.failed && p.op[1].kernels == 2 && p.op[1].foreign == 1);
    k3c_stamp_step st = step3();
    k3c_stamp_opstat os[3];
    CHECK_OK(k3c_stamp_op_stats(&p, L, nl, &st, os));
    /* op 0: launch 0; t0 = 1000 ns */
    CHECK_CLOSE(os[0].s0, 0, 1e-9, 0);
    CHECK_CLOSE(os[0].ramp, 0.5, 1e-9, 0);
    CHECK_CLOSE(os[0].wait, 1.0, 1e-9, 0);
    CHECK_CLOSE(os[0].drain, 1.0, 1e-9, 0);
    CHECK_CLOSE(os[0].span, 5.0, 1e-9, 0);
    CHECK_CLOSE(os[0].gap, -0.5, 1e-9, 0); /* op 1 starts at 4.5 us, before op 0 ends at 5.0 */
    CHECK_CLOSE(os[0].pitch, 4.5, 1e-9, 0);
    CHECK(os[0].cls == K3C_SCLASS_GEMV && os[0].blocks == 2 && os[0].bytes == 1e6);
    /* op 1: launches 1 and 2: starts 5500, 5600, 9800; ends 9000, 9500 (the WAIT), 12000 */
    CHECK_CLOSE(os[1].s0, 4.5, 1e-9, 0);
    CHECK_CLOSE(os[1].ramp, 4.3, 1e-9, 0);
    CHECK_CLOSE(os[1].drain, 3.0, 1e-9, 0);
    CHECK_CLOSE(os[1].span, 6.5, 1e-9, 0);
    CHECK_CLOSE(os[1].gap, 1.0, 1e-9, 0);
    CHECK_CLOSE(os[1].pitch, 7.5, 1e-9, 0);
    CHECK(os[1].cls == K3C_SCLASS_EXPERTS && os[1].launches == 2 && os[1].blocks == 3);
    CHECK_CLOSE(os[1].bytes, 1000 + 3 * 1e5, 0, 1e-12); /* experts 3, 5, 7 of layer 2 */
    CHECK(isnan(os[1].wait) == 0 && os[1].wait > 0);
    /* op 2: the last: its span is its pitch */
    CHECK_CLOSE(os[2].span, 7.5, 1e-9, 0);
    CHECK_CLOSE(os[2].pitch, 7.5, 1e-9, 0);
    CHECK_CLOSE(os[2].drain, 0.5, 1e-9, 0);
    CHECK(isnan(os[2].wait) && os[2].cls == K3C_SCLASS_MLA);
    CHECK_CLOSE(os[2].bytes, 500, 0, 1e-12);
    CHECK_CLOSE(os[0].pitch + os[1].pitch + os[2].pitch, 19.5, 1e-9, 0);
    /* a plan whose launch count differs does not map */
    p.op[2].kernels = 2;
    CHECK(k3c_stamp_op_stats(&p, L, nl, &st, os) != 0);
    k3c_stamp_plan_free(&p);
    free(L);
}

/* The report's text: read back from a temporary file. */
static char *report_text(const k3c_stamp_plan *p, const k3c_stamp_launch *L, size_t nl, const k3c_stamp_parse *info,
                         const k3c_stamp_step *st) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    if (k3c_stamp_report(f, p, L, nl, info, st) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    char *s = malloc((size_t)n + 1);
    rewind(f);
    if (s) s[fread(s, 1, (size_t)n, f)] = 0;
    fclose(f);
    return s;
}

/* The line of s that starts with prefix, copied into line (NULL: none). */
static const char *line_of(const char *s, const char *prefix, char *line, size_t cap) {
    for (const char *p = s; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, strlen(prefix)) == 0) {
            size_t n = strcspn(p, "\n");
            n = n < cap - 1 ? n : cap - 1;
            memcpy(line, p, n);
            line[n] = 0;
            return line;
        }
    return NULL;
}

TEST(stamp_report_tables) {
    static recs R;
    four_launches(&R);
    k3c_stamp_launch *L;
    size_t nl;
    k3c_stamp_parse info;
    CHECK_OK(k3c_stamp_launches(R.r, R.n, &L, &nl, &info));
    k3c_stamp_plan p;
    three_op_plan(&p);
    k3c_stamp_step st = step3();
    char *s = report_text(&p, L, nl, &info, &st), line[1024];
    CHECK(s);
    CHECKF(strstr(s, "mapped to ops") && !strstr(s, "NOT mapped"), "%s", s);
    CHECK(line_of(s, "STAMPSTEP b=2 q=1 gpu_us 19.50 ", line, sizeof line));
    /* bytes 1e6 + 3.01e5 + 500 = 1.3015 MB over 4 TB/s: 0.325375 us of floor */
    CHECKF(strstr(line, "1.3 MB, floor 0.33 us at 4000 GB/s copy: 0.017 of floor"), "%s", line);
    CHECKF(strstr(line, "sum of spans 19.00, gaps 0.50 (+1.00 idle, -0.50 overlapped)"), "%s", line);
    CHECKF(strstr(line, "(the stamps' cost: +0.003 ms)"), "%s", line);
    /* the experts' class line: 1 op, 2 launches, span 6.5, gap 1.0, pitch 7.5, 0.301 MB */
    CHECK(line_of(s, "STAMPCLASS b=2 q=1 experts", line, sizeof line));
    double span, gap, pitch, ramp, drain, mb;
    int ops, launches;
    char cls[16];
    CHECKF(sscanf(line + strlen("STAMPCLASS b=2 q=1 experts"), "%15s %d %d %lf %lf %lf %lf %lf %lf", cls, &ops, &launches,
                  &span, &gap, &pitch, &ramp, &drain, &mb) == 9, "%s", line);
    CHECK(ops == 1 && launches == 2 && fabs(span - 6.5) < 1e-6 && fabs(gap - 1.0) < 1e-6 && fabs(pitch - 7.5) < 1e-6 &&
          fabs(mb - 0.301) < 1e-6);
    CHECK(line_of(s, "STAMPCLASS b=2 q=1 GEMV", line, sizeof line));
    CHECK(line_of(s, "STAMPNAME b=2 q=1 mla attend", line, sizeof line));
    CHECK(line_of(s, "STAMPOP b=2 q=1    1 moe experts *", line, sizeof line)); /* * : cuBLASLt kernels in it */
    CHECK(line_of(s, "COVER b=2 q=1 layer   2:    3 distinct experts of 8, 4 pairs, at most 2 on one expert", line,
                  sizeof line));
    CHECKF(line_of(s, "COVER b=2 q=1: 1 MoE layers", line, sizeof line) && strstr(line, " 1:2 2:1"), "%s", s);
    for (const char *q = s; (q = strstr(q, "STAMPCLASS")) != NULL; q++) {
        size_t n = strcspn(q, "\n");
        n = n < sizeof line - 1 ? n : sizeof line - 1;
        memcpy(line, q, n);
        line[n] = 0;
        CHECKF(!strstr(line, "nan"), "NaN in %s", line);
    }
    free(s);
    /* launches that do not match the plan: listed by kernel, no op table */
    p.op[0].kernels = 2;
    s = report_text(&p, L, nl, &info, &st);
    CHECK(s && strstr(s, "NOT mapped (launch count differs") && strstr(s, "STAMPL b=2 q=1    3 mla_attend"));
    /* then each launch is an op of its kernel's class: moe_band_lists and moe_band are the experts' two */
    CHECK(line_of(s, "STAMPOP b=2 q=1    1 moe_band_lists", line, sizeof line));
    CHECK(line_of(s, "STAMPCLASS b=2 q=1 experts", line, sizeof line));
    CHECKF(sscanf(line + strlen("STAMPCLASS b=2 q=1 experts"), "%15s %d %d %lf %lf %lf", cls, &ops, &launches, &span,
                  &gap, &pitch) == 6 && ops == 2 && launches == 2 && fabs(pitch - 7.5) < 1e-6, "%s", line);
    CHECK(line_of(s, "STAMPSTEP b=2 q=1 gpu_us 19.50 ", line, sizeof line));
    free(s);
    k3c_stamp_plan_free(&p);
    free(L);
}

TEST(stamp_coverage_counts) {
    k3c_rng g;
    k3c_rng_seed(&g, test_seed() ^ 0xc0fe);
    int ids[64 * 16], pairs[896], ref[896];
    for (int round = 0; round < 10; round++) {
        int E = round % 2 ? 896 : 64, n = 1 + (int)(k3c_rng_next(&g) % (64 * 16)), bad_ref = 0, d_ref = 0;
        memset(ref, 0, sizeof ref);
        for (int i = 0; i < n; i++) {
            ids[i] = (int)(k3c_rng_next(&g) % (E + 2)) - 1; /* -1 and E are out of range */
            if (ids[i] < 0 || ids[i] >= E) bad_ref++;
            else ref[ids[i]]++;
        }
        for (int e = 0; e < E; e++) d_ref += ref[e] > 0;
        int bad, d = k3c_stamp_coverage(ids, n, E, pairs, &bad);
        CHECK(d == d_ref && bad == bad_ref && memcmp(pairs, ref, sizeof(int) * (size_t)E) == 0);
    }
}

TEST(stamp_classes_and_names) {
    static const struct {
        const char *op;
        int cls;
    } c[] = {{"kda in-proj (group)", K3C_SCLASS_GEMV},  {"kda up-proj (group)", K3C_SCLASS_GEMV},
             {"kda o_proj", K3C_SCLASS_GEMV},           {"mla in-proj (group)", K3C_SCLASS_GEMV},
             {"mla q_b", K3C_SCLASS_GEMV},              {"mla o_proj", K3C_SCLASS_GEMV},
             {"mlp gate/up (group)", K3C_SCLASS_GEMV},  {"mlp down", K3C_SCLASS_GEMV},
             {"kda fused", K3C_SCLASS_KDA},             {"kda separate", K3C_SCLASS_KDA},
             {"kda verify copies", K3C_SCLASS_KDA},     {"mla norms", K3C_SCLASS_MLA},
             {"mla attend", K3C_SCLASS_MLA},            {"mla gate", K3C_SCLASS_MLA},
             {"moe front (group)", K3C_SCLASS_MOE_FT},  {"moe route + shared act", K3C_SCLASS_MOE_FT},
             {"moe latent norm", K3C_SCLASS_MOE_FT},    {"moe tail (group)", K3C_SCLASS_MOE_FT},
             {"moe experts", K3C_SCLASS_EXPERTS},       {"moe out", K3C_SCLASS_NORM},
             {"moe out + residual add + rmsnorm", K3C_SCLASS_NORM},
             {"attnres mix + moe out + residual add", K3C_SCLASS_NORM},
             {"residual add + final norm", K3C_SCLASS_NORM}, {"rmsnorm", K3C_SCLASS_NORM},
             {"final norm", K3C_SCLASS_NORM},           {"lm head", K3C_SCLASS_LM_HEAD},
             {"argmax", K3C_SCLASS_ARGMAX},             {"embed", K3C_SCLASS_OTHER},
             {"mlp act", K3C_SCLASS_OTHER}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        CHECKF(k3c_stamp_class_of_op(c[i].op) == c[i].cls, "%s: class %d, want %d", c[i].op,
               k3c_stamp_class_of_op(c[i].op), c[i].cls);
    for (int k = 1; k < K3C_KID_COUNT; k++) {
        const char *n = k3c_stamp_kid_name(k);
        CHECKF(n && strcmp(n, "?") && strcmp(n, "-"), "kid %d has no name", k);
        for (int j = 1; j < k; j++) CHECKF(strcmp(n, k3c_stamp_kid_name(j)), "kids %d and %d share %s", j, k, n);
        int cls = k3c_stamp_class_of_kid(k);
        CHECK(cls >= 0 && cls < K3C_SCLASS_COUNT);
    }
    CHECK(k3c_stamp_class_of_kid(K3C_KID_MOE_BAND) == K3C_SCLASS_EXPERTS &&
          k3c_stamp_class_of_kid(K3C_KID_ARGMAX) == K3C_SCLASS_ARGMAX);
    CHECK(!strcmp(k3c_stamp_kid_name(K3C_KID_COUNT), "?"));
}
