#include "decode/plan.h"

#include <stddef.h>

static int is_prepared_batch(const k3c_plan_table *t, int rows) {
    for (int i = 0; i < t->num_batches; i++)
        if (t->batches[i] == rows) return 1;
    return 0;
}

static k3c_plan stock(k3c_stock_reason reason, int rows, int q) {
    return (k3c_plan){.route = K3C_ROUTE_STOCK, .reason = reason, .rows = rows, .q = q};
}

/* The predicates (k3c_stock_reason, numbered in plan.h) run cheapest first; the first that fails names
 * the reason. The uniformity check comes before the row-count check because q is needed to tell a wide
 * verify step (rows past the specialized cap, q > 1) from an unprepared decode step (which is wide only on
 * a DEP rank, wide_decode). */
k3c_plan k3c_plan_step(const k3c_plan_table *t, const k3c_step_shape *s) {
    int rows = 0;
    for (int r = 0; r < s->num_requests; r++) rows += s->query_lens[r];
    if (s->stage_input) return stock(K3C_STOCK_STAGE_INPUT, rows, 0);
    if (s->num_requests <= 0 || rows <= 0) return stock(K3C_STOCK_EMPTY, rows, 0);
    if (t->world_size > 1 && !t->tp_prepared) return stock(K3C_STOCK_TP_UNPREPARED, rows, 0);
    for (int r = 0; r < s->num_requests; r++)
        if (s->has_prompt[r]) return stock(K3C_STOCK_PROMPT_ROWS, rows, 0);
    int q = s->query_lens[0];
    for (int r = 1; r < s->num_requests; r++)
        if (s->query_lens[r] != q) return stock(K3C_STOCK_MIXED_VERIFY, rows, 0);
    k3c_route route;
    if (is_prepared_batch(t, rows)) route = q == 1 ? K3C_ROUTE_DECODE : K3C_ROUTE_VERIFY;
    else if ((q > 1 || t->wide_decode) && rows <= t->wide_max) route = K3C_ROUTE_WIDE;
    else return stock(K3C_STOCK_UNPREPARED_ROWS, rows, q);
    if (!t->kv_prepared) return stock(K3C_STOCK_KV_UNPREPARED, rows, q);
    /* Wide steps run the stock layer loop (with specialized attention cores): not one captured graph. */
    if (route != K3C_ROUTE_WIDE && t->needs_graphs && !(t->captured && t->captured(t->captured_ctx, rows, q)))
        return stock(K3C_STOCK_NOT_CAPTURED, rows, q);
    return (k3c_plan){.route = route, .reason = K3C_STOCK_NONE, .rows = rows, .q = q};
}

static const int nominal_batches[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                      17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                                      33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48,
                                      49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64};
static const k3c_plan_table nominal = {.batches = nominal_batches,
                                       .num_batches = (int)(sizeof nominal_batches / sizeof nominal_batches[0]),
                                       .wide_max = 256, .kv_prepared = 1, .needs_graphs = 0};

const k3c_plan_table *k3c_plan_nominal_table(void) { return &nominal; }

const char *k3c_stock_reason_name(k3c_stock_reason r) {
    switch (r) {
    case K3C_STOCK_NONE: return "specialized";
    case K3C_STOCK_STAGE_INPUT: return "pipeline-stage input";
    case K3C_STOCK_UNPREPARED_ROWS: return "row count not prepared";
    case K3C_STOCK_KV_UNPREPARED: return "KV cache not prepared";
    case K3C_STOCK_NOT_CAPTURED: return "graph not captured";
    case K3C_STOCK_PROMPT_ROWS: return "prompt rows";
    case K3C_STOCK_MIXED_VERIFY: return "non-uniform query lengths";
    case K3C_STOCK_EMPTY: return "empty step";
    case K3C_STOCK_TP_UNPREPARED: return "executor not prepared for tensor parallelism";
    }
    return "?";
}
