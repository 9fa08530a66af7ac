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
        k3c_plan_table t = {prepared, 9, 128, r->kv_prepared, r->needs_graphs, captured_q1_q4, NULL, 1, 0};
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
    k3c_plan_table t = {prepared, 9, 128, 1, 0, NULL, NULL, 1, 0};
    k3c_step_shape s = {65, q, prompt, 0};
    k3c_plan p = k3c_plan_step(&t, &s);
    CHECK(p.route == K3C_ROUTE_STOCK && p.reason == K3C_STOCK_UNPREPARED_ROWS && p.rows == 65);
}

TEST(plan_empty_step_runs_stock) {
    k3c_plan_table t = {prepared, 9, 128, 1, 0, NULL, NULL, 1, 0};
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
            k3c_plan_table t = {prepared, 9, 128, 1, 1, captured_q1_q4, NULL, ws, prep};
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
    k3c_plan_table t = {prepared, 9, 128, 1, 1, captured_q1_q4, NULL, 2, 0};
    k3c_step_shape stage = {1, q1, none, 1}, empty = {0, NULL, NULL, 0};
    CHECK(k3c_plan_step(&t, &stage).reason == K3C_STOCK_STAGE_INPUT);
    CHECK(k3c_plan_step(&t, &empty).reason == K3C_STOCK_EMPTY);
    CHECK(strstr(k3c_stock_reason_name(K3C_STOCK_TP_UNPREPARED), "tensor parallel") != NULL);
}
