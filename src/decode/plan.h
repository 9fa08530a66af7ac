/* The specialized decode's one routing decision per step (the predicates of plan.c, in order).
 *
 * k3c_plan reads only step metadata that is identical on every tensor-parallel rank (row counts, query
 * lengths, prompt flags, the pipeline stage) and the executor's own build-time state, so every rank takes
 * the same path: the executor's mailboxes need that, or they deadlock. It never looks at token ids,
 * positions or cache contents.
 *
 * DEP (data-parallel attention, expert-parallel MoE): each DP rank plans its own step, whose shape differs
 * from its peers' (its own requests; an idle rank's dummy step plans stock, K3C_STOCK_EMPTY), so the EP
 * group's ranks may take different routes in the same step. That is safe because both routes a DEP rank
 * takes run the same stock layer loop: the wide route replaces only the attention, which is local at TP1 and
 * makes no collective, so every rank makes the same EP calls in the same order either way (the row-count
 * all-gather at the step's start, then per MoE layer the routing tables' all-gather and the two
 * all-to-alls: stock/forward.c moe_ep), whatever route each took. The table is build-time state, the same on
 * every rank (wide_decode, wide_max from the same options). */
#ifndef K3C_DECODE_PLAN_H
#define K3C_DECODE_PLAN_H

#include <stdint.h>

/* What the runtime knows about a step before running it. */
typedef struct k3c_step_shape {
    int num_requests;
    const int *query_lens;     /* [num_requests]: tokens each request runs this step */
    const uint8_t *has_prompt; /* [num_requests]: 1 for prompt rows (prefill, chunked prefill, fresh prompt) */
    int stage_input;           /* 1 when the step starts from another pipeline stage's hidden states */
} k3c_step_shape;

/* The executor's prepared set, fixed at build time, plus what prepare_kv / graph capture have done since. */
typedef struct k3c_plan_table {
    const int *batches;      /* prepared row counts of fully specialized steps, ascending (1, 2, 4, ..., 64) */
    int num_batches;
    int wide_max;            /* largest uniform-verify row count the wide path takes (0: none) */
    int kv_prepared;         /* prepare_kv bound the real cache (a memory-sizing cache never is) */
    int needs_graphs;        /* the backend replays captured graphs (CUDA): uncaptured shapes run stock */
    /* captured(ctx, rows, q): whether the graph of that shape exists; consulted only when needs_graphs. */
    int (*captured)(void *ctx, int rows, int q);
    void *captured_ctx;
    /* Tensor parallelism: the executor's world size (0 or 1: none) and whether its providers are prepared for
     * it (sharded weights, the all-reduces on its stream). World size > 1 unprepared: every step stock, on
     * every rank alike (both are build-time state, the same on all ranks). */
    int world_size;
    int tp_prepared;
    /* DEP (decode/executor.h k3c_decode_env.ep): decode steps (q = 1) take the wide route too, up to wide_max
     * rows (the seed's build_dep: no batches, every decode or uniform verify step wide). */
    int wide_decode;
} k3c_plan_table;

typedef enum k3c_route {
    K3C_ROUTE_STOCK = 0,  /* run the stock forward */
    K3C_ROUTE_DECODE,     /* fully specialized, every request decodes one token */
    K3C_ROUTE_VERIFY,     /* fully specialized uniform verify: every request verifies q tokens */
    K3C_ROUTE_WIDE,       /* uniform verify past the specialized cap (DEP: every decode or uniform verify step):
                           * the stock layer loop with the specialized TP1 attention, launched eagerly */
} k3c_route;

/* Why a step runs stock (or K3C_STOCK_NONE when it does not): one value per routing predicate. */
typedef enum k3c_stock_reason {
    K3C_STOCK_NONE = 0,
    K3C_STOCK_STAGE_INPUT,      /* 1. a partial-model (pipeline stage) input */
    K3C_STOCK_UNPREPARED_ROWS,  /* 2. a row count with no prepared providers */
    K3C_STOCK_KV_UNPREPARED,    /* 3. before prepare_kv bound the cache */
    K3C_STOCK_NOT_CAPTURED,     /* 4. its graph is not captured yet */
    K3C_STOCK_PROMPT_ROWS,      /* 5. prompt rows */
    K3C_STOCK_MIXED_VERIFY,     /* 6. requests do not all run the same q */
    K3C_STOCK_EMPTY,            /*    no rows at all */
    K3C_STOCK_TP_UNPREPARED,    /* 0. world size > 1 and the providers are not prepared for TP (checked after
                                 *    the stage input and empty checks, before every per-step one) */
} k3c_stock_reason;

typedef struct k3c_plan {
    k3c_route route;
    k3c_stock_reason reason;
    int rows; /* total rows of the step */
    int q;    /* tokens per request on a specialized route */
} k3c_plan;

k3c_plan k3c_plan_step(const k3c_plan_table *table, const k3c_step_shape *step);
/* The table an engine without an executor plans against: every row count 1..64 prepared (the spec's
 * PREPARED_MAX), wide verify up to 256 rows, KV prepared, no graphs. The counts then classify each step by
 * its shape alone. */
const k3c_plan_table *k3c_plan_nominal_table(void);
const char *k3c_stock_reason_name(k3c_stock_reason r);

#endif
