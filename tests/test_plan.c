/* The routing predicate table of decode/plan.c, a row per predicate and per combination that
 * matters. Expected routes are written from the spec, row by row. */
#include <string.h>

#include "decode/plan.h"
#include "test.h"

static const int prepared[] = {1, 2, 4, 8, 16, 24, 32, 48, 64};

/* Graphs captured: every prepared decode shape, and verify shapes with q = 4 only. */
static int captured_q1_q4(void *ctx, int rows, int q) {
    (void)ctx;
    return q == 1 || q == 4;
}

typedef struct {
    const char *what;
    int n;            /* requests */
    int qlen[8];      /* per request */
    uint8_t prompt[8];
    int stage_input, kv_prepared, needs_graphs;
    k3c_route route;
    k3c_stock_reason reason;
    int q;
} plan_row;

TEST(plan_predicate_table) {
    const plan_row rows[] = {
        {"decode b=1", 1, {1}, {0}, 0, 1, 1, K3C_ROUTE_DECODE, K3C_STOCK_NONE, 1},
        {"decode b=4", 4, {1, 1, 1, 1}, {0}, 0, 1, 1, K3C_ROUTE_DECODE, K3C_STOCK_NONE, 1},
        {"decode b=3 not prepared", 3, {1, 1, 1}, {0}, 0, 1, 1, K3C_ROUTE_STOCK, K3C_STOCK_UNPREPARED_ROWS, 1},
        {"pipeline stage input", 1, {1}, {0}, 1, 1, 1, K3C_ROUTE_STOCK, K3C_STOCK_STAGE_INPUT, 0},
        {"before prepare_kv", 2, {1, 1}, {0}, 0, 0, 1, K3C_ROUTE_STOCK, K3C_STOCK_KV_UNPREPARED, 1},
        {"prefill", 1, {7}, {1}, 0, 1, 1, K3C_ROUTE_STOCK, K3C_STOCK_PROMPT_ROWS, 0},
        {"prefill of 1 token", 1, {1}, {1}, 0, 1, 1, K3C_ROUTE_STOCK, K3C_STOCK_PROMPT_ROWS, 0},
        {"mixed prefill + decode", 2, {5, 1}, {1, 0}, 0, 1, 1, K3C_ROUTE_STOCK, K3C_STOCK_PROMPT_ROWS, 0},
        {"uniform verify q=4 x2", 2, {4, 4}, {0}, 0, 1, 1, K3C_ROUTE_VERIFY, K3C_STOCK_NONE, 4},
        {"uniform verify q=2 not captured", 4, {2, 2, 2, 2}, {0}, 0, 1, 1, K3C_ROUTE_STOCK, K3C_STOCK_NOT_CAPTURED, 2},
        {"uniform verify q=2 on a graphless backend", 4, {2, 2, 2, 2}, {0}, 0, 1, 0, K3C_ROUTE_VERIFY, K3C_STOCK_NONE, 2},
        {"partial drafts", 2, {4, 3}, {0}, 0, 1, 1, K3C_ROUTE_STOCK, K3C_STOCK_MIXED_VERIFY, 0},
        {"verify mixed with decode", 2, {4, 1}, {0}, 0, 1, 1, K3C_ROUTE_STOCK, K3C_STOCK_MIXED_VERIFY, 0},
        {"wide verify 80 rows", 8, {10, 10, 10, 10, 10, 10, 10, 10}, {0}, 0, 1, 1, K3C_ROUTE_WIDE, K3C_STOCK_NONE, 10},
        {"wide verify before prepare_kv", 8, {10, 10, 10, 10, 10, 10, 10, 10}, {0}, 0, 0, 1, K3C_ROUTE_STOCK,
         K3C_STOCK_KV_UNPREPARED, 10},
        {"verify past the wide cap", 8, {20, 20, 20, 20, 20, 20, 20, 20}, {0}, 0, 1, 1, K3C_ROUTE_STOCK,
         K3C_STOCK_UNPREPARED_ROWS, 20},
        {"decode rows past the cap are never wide", 1, {1}, {0}, 0, 1, 1, K3C_ROUTE_DECODE, K3C_STOCK_NONE, 1},
        {"verify rows not prepared, within the wide cap", 3, {4, 4, 4}, {0}, 0, 1, 1, K3C_ROUTE_WIDE, K3C_STOCK_NONE, 4},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const plan_row *r = &rows[i];
        k3c_plan_table t = {prepared, 9, 128, r->kv_prepared, r->needs_graphs, captured_q1_q4, NULL, 1, 0, 0};
        k3c_step_shape s = {r->n, r->qlen, r->prompt, r->stage_input};
        k3c_plan p = k3c_plan_step(&t, &s);
        CHECKF(p.route == r->route && p.reason == r->reason && (p.route == K3C_ROUTE_STOCK || p.q == r->q),
               "row '%s': route %d reason %s q %d, expected route %d reason %s q %d", r->what, p.route,
               k3c_stock_reason_name(p.reason), p.q, r->route, k3c_stock_reason_name(r->reason), r->q);
    }
}

TEST(plan_decode_rows_beyond_prepared_run_stock) {
    /* 65 decode rows: past PREPARED_MAX and q == 1, so not wide either. */
    int q[65];
    uint8_t prompt[65] = {0};
    for (int i = 0; i < 65; i++) q[i] = 1;
    k3c_plan_table t = {prepared, 9, 128, 1, 0, NULL, NULL, 1, 0, 0};
    k3c_step_shape s = {65, q, prompt, 0};
    k3c_plan p = k3c_plan_step(&t, &s);
    CHECK(p.route == K3C_ROUTE_STOCK && p.reason == K3C_STOCK_UNPREPARED_ROWS && p.rows == 65);
}

TEST(plan_empty_step_runs_stock) {
    k3c_plan_table t = {prepared, 9, 128, 1, 0, NULL, NULL, 1, 0, 0};
    k3c_step_shape s = {0, NULL, NULL, 0};
    CHECK(k3c_plan_step(&t, &s).route == K3C_ROUTE_STOCK);
}

/* Tensor parallelism (issue 26): world size > 1 with providers not prepared for it runs every step stock,
 * decode and verify shapes that would otherwise be specialized included, for the same reason on every rank
 * (the table is all the planner reads); prepared, or at world size 0 / 1, the plan is unchanged. */
TEST(plan_tp_unprepared_runs_every_step_stock) {
    int q1[4] = {1, 1, 1, 1}, q4[2] = {4, 4}, qp[1] = {7};
    uint8_t none[4] = {0}, prompt[1] = {1};
    k3c_step_shape decode = {4, q1, none, 0}, verify = {2, q4, none, 0}, prefill = {1, qp, prompt, 0};
    for (int ws = 0; ws <= 8; ws++)
        for (int prep = 0; prep <= 1; prep++) {
            k3c_plan_table t = {prepared, 9, 128, 1, 1, captured_q1_q4, NULL, ws, prep, 0};
            k3c_plan d = k3c_plan_step(&t, &decode), v = k3c_plan_step(&t, &verify), p = k3c_plan_step(&t, &prefill);
            if (ws > 1 && !prep) {
                CHECKF(d.route == K3C_ROUTE_STOCK && d.reason == K3C_STOCK_TP_UNPREPARED && d.rows == 4,
                       "world size %d: decode planned route %d (%s)", ws, d.route, k3c_stock_reason_name(d.reason));
                CHECK(v.route == K3C_ROUTE_STOCK && v.reason == K3C_STOCK_TP_UNPREPARED && v.rows == 8);
                CHECK(p.route == K3C_ROUTE_STOCK && p.reason == K3C_STOCK_TP_UNPREPARED);
            } else {
                CHECKF(d.route == K3C_ROUTE_DECODE && v.route == K3C_ROUTE_VERIFY && v.q == 4,
                       "world size %d prepared %d: decode route %d, verify route %d", ws, prep, d.route, v.route);
                CHECK(p.route == K3C_ROUTE_STOCK && p.reason == K3C_STOCK_PROMPT_ROWS);
            }
        }
    k3c_plan_table t = {prepared, 9, 128, 1, 1, captured_q1_q4, NULL, 2, 0, 0};
    k3c_step_shape stage = {1, q1, none, 1}, empty = {0, NULL, NULL, 0};
    CHECK(k3c_plan_step(&t, &stage).reason == K3C_STOCK_STAGE_INPUT);
    CHECK(k3c_plan_step(&t, &empty).reason == K3C_STOCK_EMPTY);
    CHECK(strstr(k3c_stock_reason_name(K3C_STOCK_TP_UNPREPARED), "tensor parallel") != NULL);
}

/* DEP (decode/plan.h, the seed's build_dep): no prepared batches, wide_decode, wide_max the rank's cap. Every
 * decode or uniform verify step up to the cap is wide (decode rows too, unlike wide verify at world size 1);
 * prompt rows, mixed q, steps past the cap and an empty step (an idle rank's dummy step) run stock, and so
 * does everything before prepare_kv. No graphs are consulted (none exist at DEP). */
TEST(plan_dep_every_decode_or_verify_step_wide) {
    typedef struct {
        const char *what;
        int n, qlen[8];
        uint8_t prompt[8];
        int kv_prepared;
        k3c_route route;
        k3c_stock_reason reason;
        int rows, q;
    } dep_row;
    const dep_row rows[] = {
        {"decode b=1", 1, {1}, {0}, 1, K3C_ROUTE_WIDE, K3C_STOCK_NONE, 1, 1},
        {"decode b=3 (no batch set at DEP)", 3, {1, 1, 1}, {0}, 1, K3C_ROUTE_WIDE, K3C_STOCK_NONE, 3, 1},
        {"decode b=8", 8, {1, 1, 1, 1, 1, 1, 1, 1}, {0}, 1, K3C_ROUTE_WIDE, K3C_STOCK_NONE, 8, 1},
        {"verify 2 x 4", 2, {4, 4}, {0}, 1, K3C_ROUTE_WIDE, K3C_STOCK_NONE, 8, 4},
        {"verify 8 x 12 = 96 rows, the cap", 8, {12, 12, 12, 12, 12, 12, 12, 12}, {0}, 1, K3C_ROUTE_WIDE,
         K3C_STOCK_NONE, 96, 12},
        {"verify 8 x 13 = 104 rows, past the cap", 8, {13, 13, 13, 13, 13, 13, 13, 13}, {0}, 1, K3C_ROUTE_STOCK,
         K3C_STOCK_UNPREPARED_ROWS, 104, 13},
        {"decode before prepare_kv", 2, {1, 1}, {0}, 0, K3C_ROUTE_STOCK, K3C_STOCK_KV_UNPREPARED, 2, 1},
        {"prefill", 1, {9}, {1}, 1, K3C_ROUTE_STOCK, K3C_STOCK_PROMPT_ROWS, 9, 0},
        {"prefill + decode", 2, {9, 1}, {1, 0}, 1, K3C_ROUTE_STOCK, K3C_STOCK_PROMPT_ROWS, 10, 0},
        {"verify mixed with decode", 2, {4, 1}, {0}, 1, K3C_ROUTE_STOCK, K3C_STOCK_MIXED_VERIFY, 5, 0},
        {"a dummy step", 0, {0}, {0}, 1, K3C_ROUTE_STOCK, K3C_STOCK_EMPTY, 0, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const dep_row *r = &rows[i];
        /* captured: never called (no graphs at DEP); a graph check would send every step stock */
        k3c_plan_table t = {.batches = prepared, .num_batches = 0, .wide_max = 96, .kv_prepared = r->kv_prepared,
                            .needs_graphs = 0, .world_size = 1, .tp_prepared = 1, .wide_decode = 1};
        k3c_step_shape s = {r->n, r->qlen, r->prompt, 0};
        k3c_plan p = k3c_plan_step(&t, &s);
        CHECKF(p.route == r->route && p.reason == r->reason && p.rows == r->rows &&
                   (p.route == K3C_ROUTE_STOCK || p.q == r->q),
               "DEP row '%s': route %d reason %s rows %d q %d, expected route %d reason %s rows %d q %d", r->what,
               p.route, k3c_stock_reason_name(p.reason), p.rows, p.q, r->route, k3c_stock_reason_name(r->reason),
               r->rows, r->q);
    }
    /* without wide_decode (world size 1) the same decode shapes are never wide */
    int q3[3] = {1, 1, 1};
    uint8_t none[3] = {0};
    k3c_plan_table t1 = {.batches = prepared, .num_batches = 0, .wide_max = 96, .kv_prepared = 1, .world_size = 1,
                         .tp_prepared = 1};
    k3c_step_shape s3 = {3, q3, none, 0};
    k3c_plan p = k3c_plan_step(&t1, &s3);
    CHECK(p.route == K3C_ROUTE_STOCK && p.reason == K3C_STOCK_UNPREPARED_ROWS);
}

/* The wide route at world size 1 needs a cap: wide_max 0 (a TP rank's executor, or one without the stock
 * forward, decode/executor_cuda.h) plans every verify shape outside the batch set stock, the batch set's shapes
 * as before. */
TEST(plan_no_wide_route_without_a_cap) {
    int q4[3] = {4, 4, 4}, q8[2] = {4, 4};
    uint8_t none[3] = {0};
    k3c_plan_table t = {prepared, 9, 0, 1, 0, NULL, NULL, 1, 1, 0};
    k3c_step_shape wide = {3, q4, none, 0}, batch = {2, q8, none, 0};
    k3c_plan a = k3c_plan_step(&t, &wide), b = k3c_plan_step(&t, &batch);
    CHECK(a.route == K3C_ROUTE_STOCK && a.reason == K3C_STOCK_UNPREPARED_ROWS && a.rows == 12);
    CHECK(b.route == K3C_ROUTE_VERIFY && b.q == 4 && b.rows == 8);
}
