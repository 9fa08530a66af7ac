/* Continuous batching over one engine (include/k3c.h, runner section).
 *
 * One k3c_runner_step = admit waiting requests into free slots, build ONE engine step from every active
 * request, run it through the engine (which plans it, decode/plan.h, and runs it on the specialized
 * executor where the plan allows, else the stock forward), then sample, accept drafts, commit verifies and
 * retire finished requests.
 *
 * Step composition. Decoding requests come first in the row budget (max_rows): a decode token, or a verify
 * window [t0, d1..dD]. Prefilling requests share what is left, up to prefill_budget, in admission order; a
 * request whose prompt does not fit waits for the next step with the rest of its prompt. Items: the decodes
 * and verifies first, then the prompt chunks, each group in admission order. A chunk ends where
 * k3c_engine_prompt_piece allows (the engine's invariance grid, or the prompt's end), so a request's rows
 * compute the same whatever else the step holds; a request with no such cut in what is left waits.
 *
 * Draft padding policy (so that decode steps are uniform verify steps, the ones the specialized executor
 * takes: predicate 6 of decode/plan.h). Per step one D is chosen for every greedy decoding request:
 *  - D = 0 (everyone decodes one token) when the drafter finds nothing for any of them: a uniform decode
 *    step, and no rows are spent on guesses nobody made;
 *  - otherwise D = spec_tokens, lowered to (the fewest tokens any of them still needs) - 1 so that no verify
 *    writes past where a plain decode would end (the context bound of a run without speculation holds),
 *    and to what max_rows allows; a request whose drafter found fewer than D tokens is padded by repeating
 *    its last token (a guess like any other: acceptance still checks it against the model).
 * Requests with temperature > 0 never speculate (greedy acceptance only, no rejection sampling): they decode
 * one token, which makes a step with verifies a mixed one (planned stock).
 *
 * Greedy acceptance. The verify's rows give the model's next token after [t0], [t0 d1], ..., [t0 d1..dD].
 * Drafts are accepted while they equal it; the first mismatch (or, all D accepted, the last row's token)
 * is the next sampled token. The engine then keeps t0 and the accepted drafts: k3c_request_commit(1 + a).
 * The emitted tokens are exactly the ones greedy decoding would have produced one at a time. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k3c.h"
#include "runtime/drafter.h"
#include "runtime/engine_internal.h"
#include "runtime/runner.h"
#include "util/error.h"

_Static_assert(K3C_ROUTES == K3C_ROUTE_WIDE + 1, "route count");
_Static_assert(K3C_STOCK_REASONS == K3C_STOCK_TP_UNPREPARED + 1, "stock reason count");

enum { REQ_WAITING, REQ_ACTIVE, REQ_DONE };

typedef struct run_req {
    int state;
    int32_t *hist;       /* [n_prompt + max_new]: prompt then generated tokens */
    int n_prompt, n_hist;
    int prefilled;       /* prompt tokens the engine holds */
    int generated, max_new;
    int32_t stop;
    k3c_sampling sampling;
    k3c_sampler *smp;    /* while active */
    int id;              /* engine request while active, else -1 */
} run_req;

/* What one item of the current step is, for walking the logits afterwards. */
enum { ITEM_PREFILL, ITEM_DECODE, ITEM_VERIFY };

struct k3c_runner {
    k3c_engine *e;
    k3c_runner_options o;
    int V, max_rows, max_active;
    run_req *req;         /* [cap_req] in submission order */
    int n_req, cap_req;
    int next_wait;        /* first request that may still be waiting (FIFO admission) */
    int *active;          /* [max_active] request indices in admission order */
    int n_active;
    /* step scratch, sized once for max_active items */
    k3c_step_item *items;
    int *item_req, *item_kind;
    int *query_lens;
    uint8_t *has_prompt;
    int32_t *win;         /* [max_active * (1 + spec_tokens)] verify windows */
    float *logits;        /* [max_active * (1 + spec_tokens) rows, V] */
    int32_t *ids;         /* [max_active * (1 + spec_tokens)] greedy token ids, when the step produced ids */
    int step_ids;         /* the step just run produced ids (run_argmax), not logits */
    k3c_plan last_plan;
    k3c_runner_stats st;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const k3c_plan_table *k3c_runner_nominal_table(void) { return k3c_plan_nominal_table(); }

void k3c_runner_options_default(k3c_runner_options *o) {
    if (o) memset(o, 0, sizeof *o);
}

k3c_plan k3c_runner_last_plan(const k3c_runner *r) { return r->last_plan; }

/* The engine has no accessor for its slot count: open requests until it refuses, then close them. Only
 * slots free now count, which is what the runner can use. */
static int probe_slots(k3c_engine *e, int *slots) {
    int cap = 64, n = 0, rc = K3C_OK;
    int *ids = malloc(sizeof(int) * (size_t)cap);
    if (!ids) return k3c_errorf_kind(K3C_ERROR_OOM, "runner: out of memory");
    for (;;) {
        if (n == cap) {
            int *ni = realloc(ids, sizeof(int) * (size_t)(cap *= 2));
            if (!ni) break; /* enough slots to run with; the ones probed so far count */
            ids = ni;
        }
        if (k3c_request_open(e, &ids[n]) != K3C_OK) break;
        n++;
    }
    k3c_error_clear();
    for (int i = 0; i < n; i++)
        if (k3c_request_close(e, ids[i]) != K3C_OK) rc = K3C_ERR;
    free(ids);
    if (rc != K3C_OK) return k3c_error_context("runner: probing the engine's request slots");
    if (n == 0) return k3c_errorf("runner: the engine has no free request slot");
    *slots = n;
    return K3C_OK;
}

int k3c_runner_create(k3c_engine *e, const k3c_runner_options *opt, k3c_runner **out) {
    if (!out) return k3c_errorf("runner: the output handle is NULL");
    *out = NULL;
    if (!e) return k3c_errorf("runner: the engine is NULL");
    k3c_runner_options o;
    k3c_runner_options_default(&o);
    if (opt) o = *opt;
    int max_rows = k3c_engine_max_rows(e);
    if (o.spec_tokens < 0) return k3c_errorf("runner: spec_tokens %d is negative", o.spec_tokens);
    if (o.spec_tokens + 1 > max_rows)
        return k3c_errorf("runner: spec_tokens %d: a verify of %d tokens exceeds max_rows %d", o.spec_tokens,
                          o.spec_tokens + 1, max_rows);
    if (o.prefill_budget < 0) return k3c_errorf("runner: prefill_budget %d is negative", o.prefill_budget);
    if (o.prefill_budget == 0 || o.prefill_budget > max_rows) o.prefill_budget = max_rows;
    /* a smaller budget could never take a whole block of the invariance grid (k3c_engine_prompt_piece) */
    if (o.prefill_budget < k3c_engine_prompt_grid(e)) o.prefill_budget = k3c_engine_prompt_grid(e);
    if (o.max_active < 0) return k3c_errorf("runner: max_active %d is negative", o.max_active);
    int slots = 0;
    K3C_TRY(probe_slots(e, &slots));
    if (o.max_active == 0 || o.max_active > slots) o.max_active = slots;
    /* every active request must be able to decode in the same step */
    if (o.max_active > max_rows) o.max_active = max_rows;

    k3c_runner *r = calloc(1, sizeof *r);
    if (!r) return k3c_errorf_kind(K3C_ERROR_OOM, "runner: out of memory");
    r->e = e;
    r->o = o;
    r->V = k3c_engine_vocab(e);
    r->max_rows = max_rows;
    r->max_active = o.max_active;
    size_t A = (size_t)o.max_active, W = (size_t)o.spec_tokens + 1;
    r->active = malloc(sizeof(int) * A);
    r->items = calloc(A, sizeof *r->items);
    r->item_req = malloc(sizeof(int) * A);
    r->item_kind = malloc(sizeof(int) * A);
    r->query_lens = malloc(sizeof(int) * A);
    r->has_prompt = malloc(A);
    r->win = malloc(sizeof(int32_t) * A * W);
    r->logits = k3c_engine_logits_alloc(e, (int)(A * W)); /* page-locked on a device engine, else malloc'ed */
    r->ids = malloc(sizeof(int32_t) * A * W);
    if (!r->logits) { /* out of host memory: refused page-locked memory already fell back to malloc */
        k3c_runner_free(r);
        return k3c_error_context("runner: logits for %d requests x %d rows", o.max_active, (int)W);
    }
    if (!r->active || !r->items || !r->item_req || !r->item_kind || !r->query_lens || !r->has_prompt ||
        !r->win || !r->ids) {
        k3c_runner_free(r);
        return k3c_errorf_kind(K3C_ERROR_OOM, "runner: out of memory (%d requests x %d rows)", o.max_active, (int)W);
    }
    r->last_plan = (k3c_plan){.route = K3C_ROUTE_STOCK, .reason = K3C_STOCK_EMPTY};
    *out = r;
    return K3C_OK;
}

static void req_release(k3c_runner *r, run_req *q) {
    if (q->id >= 0) k3c_request_close(r->e, q->id);
    q->id = -1;
    k3c_sampler_free(q->smp);
    q->smp = NULL;
}

void k3c_runner_free(k3c_runner *r) {
    if (!r) return;
    for (int i = 0; i < r->n_req; i++) {
        req_release(r, &r->req[i]);
        free(r->req[i].hist);
    }
    free(r->req);
    free(r->active);
    free(r->items);
    free(r->item_req);
    free(r->item_kind);
    free(r->query_lens);
    free(r->has_prompt);
    free(r->win);
    k3c_engine_logits_free(r->e, r->logits);
    free(r->ids);
    free(r);
}

int k3c_runner_submit(k3c_runner *r, const k3c_runner_request *in, int *handle) {
    if (!r || !in || !handle)
        return k3c_errorf("runner submit: %s is NULL", !r ? "the runner" : !in ? "the request" : "the handle output");
    if (!in->prompt || in->n_prompt <= 0) return k3c_errorf("runner submit: empty prompt");
    if (in->max_new <= 0) return k3c_errorf("runner submit: max_new %d, expected >= 1", in->max_new);
    for (int i = 0; i < in->n_prompt; i++)
        if (in->prompt[i] < 0 || in->prompt[i] >= r->V)
            return k3c_errorf("runner submit: prompt token %d: id %d outside 0..%d", i, in->prompt[i], r->V - 1);
    if (in->sampling.top_k < 0) return k3c_errorf("runner submit: top_k %d is negative", in->sampling.top_k);
    if (r->n_req == r->cap_req) {
        int cap = r->cap_req ? 2 * r->cap_req : 16;
        run_req *nr = realloc(r->req, sizeof *nr * (size_t)cap);
        if (!nr) return k3c_errorf_kind(K3C_ERROR_OOM, "runner submit: out of memory");
        r->req = nr;
        r->cap_req = cap;
    }
    run_req q = {.state = REQ_WAITING, .n_prompt = in->n_prompt, .n_hist = in->n_prompt, .max_new = in->max_new,
                 .stop = in->stop_token, .sampling = in->sampling, .id = -1};
    q.hist = malloc(sizeof(int32_t) * ((size_t)in->n_prompt + (size_t)in->max_new));
    if (!q.hist) return k3c_errorf_kind(K3C_ERROR_OOM, "runner submit: out of memory (%d + %d tokens)", in->n_prompt, in->max_new);
    memcpy(q.hist, in->prompt, sizeof(int32_t) * (size_t)in->n_prompt);
    r->req[r->n_req] = q;
    *handle = r->n_req++;
    return K3C_OK;
}

static int admit(k3c_runner *r) {
    while (r->n_active < r->max_active && r->next_wait < r->n_req) {
        run_req *q = &r->req[r->next_wait];
        if (q->state != REQ_WAITING) {
            r->next_wait++;
            continue;
        }
        K3C_TRY(k3c_sampler_create(&q->sampling, r->V, &q->smp));
        if (k3c_request_open(r->e, &q->id) != K3C_OK) {
            q->id = -1;
            k3c_sampler_free(q->smp);
            q->smp = NULL;
            return k3c_error_context("runner: request %d", r->next_wait);
        }
        q->state = REQ_ACTIVE;
        r->active[r->n_active++] = r->next_wait++;
    }
    return K3C_OK;
}

/* Appends a generated token; 1 when the request is finished. */
static int emit(k3c_runner *r, run_req *q, int32_t tok) {
    q->hist[q->n_hist++] = tok;
    q->generated++;
    r->st.generated++;
    return q->generated >= q->max_new || (q->stop >= 0 && tok == q->stop);
}

static int spec_eligible(const k3c_runner *r, const run_req *q) {
    return r->o.spec_tokens > 0 && q->sampling.temperature <= 0;
}

/* Builds the step's items (see the file comment for the policy); returns the item count. */
static int build_step(k3c_runner *r) {
    int d = r->o.spec_tokens, W = d + 1;
    int n_dec = 0, any_draft = 0, D = d, found[r->n_active];
    for (int a = 0; a < r->n_active; a++) {
        run_req *q = &r->req[r->active[a]];
        found[a] = 0;
        if (q->prefilled < q->n_prompt) continue;
        n_dec++;
        if (!spec_eligible(r, q)) continue;
        int32_t *w = r->win + (size_t)a * W;
        w[0] = q->hist[q->n_hist - 1];
        found[a] = k3c_draft_ngram(q->hist, q->n_hist, d, w + 1);
        if (found[a] > 0) any_draft = 1;
        int need = q->max_new - q->generated; /* >= 1 while active */
        if (need - 1 < D) D = need - 1;
    }
    if (!any_draft) D = 0;
    if (n_dec > 0 && n_dec * (1 + D) > r->max_rows) D = r->max_rows / n_dec - 1;
    if (D < 0) D = 0;

    int n = 0, rows = 0;
    for (int a = 0; a < r->n_active; a++) {
        run_req *q = &r->req[r->active[a]];
        if (q->prefilled < q->n_prompt) continue;
        int32_t *w = r->win + (size_t)a * W;
        k3c_step_item *it = &r->items[n];
        if (D > 0 && spec_eligible(r, q)) {
            for (int k = found[a] < D ? found[a] : D; k < D; k++) w[1 + k] = w[k]; /* pad: repeat the last */
            r->st.drafts_padded += found[a] < D ? D - found[a] : 0;
            r->st.drafts_proposed += D;
            r->st.verify_items++;
            *it = (k3c_step_item){.request = q->id, .tokens = w, .n = 1 + D, .verify = 1};
            r->item_kind[n] = ITEM_VERIFY;
        } else {
            w[0] = q->hist[q->n_hist - 1];
            *it = (k3c_step_item){.request = q->id, .tokens = w, .n = 1};
            r->item_kind[n] = ITEM_DECODE;
        }
        r->item_req[n] = r->active[a];
        rows += it->n;
        n++;
    }
    int budget = r->max_rows - rows < r->o.prefill_budget ? r->max_rows - rows : r->o.prefill_budget;
    for (int a = 0; a < r->n_active && budget > 0; a++) {
        run_req *q = &r->req[r->active[a]];
        if (q->prefilled >= q->n_prompt) continue;
        int c = k3c_engine_prompt_piece(r->e, q->prefilled, q->n_prompt, budget);
        if (c == 0) continue; /* no cut on the grid within what is left: it waits */
        budget -= c;
        r->items[n] = (k3c_step_item){.request = q->id, .tokens = q->hist + q->prefilled, .n = c};
        r->item_kind[n] = ITEM_PREFILL;
        r->item_req[n] = r->active[a];
        n++;
    }
    return n;
}

/* The token of logits row `row` of the step just run: its greedy id when the step produced ids (every
 * request greedy), else the request's sampler on the row. */
static int32_t row_token(const k3c_runner *r, const run_req *q, size_t row) {
    return r->step_ids ? r->ids[row] : k3c_sampler_sample(q->smp, r->logits + row * (size_t)r->V);
}

/* Walks the logits rows of the step just run: samples, accepts, commits. Marks finished requests REQ_DONE. */
static int finish_step(k3c_runner *r, int n) {
    size_t row = 0;
    for (int i = 0; i < n; i++) {
        run_req *q = &r->req[r->item_req[i]];
        const k3c_step_item *it = &r->items[i];
        int done = 0;
        switch (r->item_kind[i]) {
        case ITEM_PREFILL:
            q->prefilled += it->n;
            r->st.prompt_tokens += it->n;
            if (q->prefilled == q->n_prompt) done = emit(r, q, row_token(r, q, row));
            row++;
            break;
        case ITEM_DECODE:
            done = emit(r, q, row_token(r, q, row));
            row++;
            break;
        case ITEM_VERIFY: {
            int D = it->n - 1, acc = 0;
            int32_t next = -1;
            for (int j = 0; j <= D; j++) {
                next = row_token(r, q, row + (size_t)j);
                if (j == D || next != it->tokens[1 + j]) break;
                acc++;
            }
            row += (size_t)it->n;
            if (k3c_request_commit(r->e, q->id, 1 + acc) != K3C_OK)
                return k3c_error_context("runner: request %d", r->item_req[i]);
            r->st.drafts_accepted += acc;
            for (int j = 0; j < acc && !done; j++) done = emit(r, q, it->tokens[1 + j]);
            if (!done) done = emit(r, q, next);
            break;
        }
        }
        if (done) q->state = REQ_DONE;
    }
    return K3C_OK;
}

int k3c_runner_step(k3c_runner *r, int *busy) {
    if (!r || !busy) return k3c_errorf("runner step: %s is NULL", r ? "the busy output" : "the runner");
    double t0 = now_s();
    *busy = 0;
    K3C_TRY(admit(r));
    if (r->n_active == 0) return K3C_OK;
    int n = build_step(r);
    int rows = 0;
    for (int i = 0; i < n; i++) {
        r->query_lens[i] = r->items[i].n;
        r->has_prompt[i] = r->item_kind[i] == ITEM_PREFILL;
        rows += r->items[i].n;
    }
    /* every request greedy: where the executor runs the step only token ids come back from the device */
    int greedy = 1;
    for (int i = 0; i < n && greedy; i++) greedy = r->req[r->item_req[i]].sampling.temperature <= 0;
    r->step_ids = 0;
    int rc = k3c_engine_run_step(r->e, r->items, n, r->has_prompt, r->logits, greedy ? r->ids : NULL, &r->step_ids);
    if (rc != K3C_OK) return k3c_error_context("runner: step (%d items, %d rows)", n, rows);
    k3c_plan plan = k3c_engine_last_plan(r->e);
    r->last_plan = plan;
    r->st.steps++;
    r->st.route_steps[plan.route]++;
    if (plan.route == K3C_ROUTE_STOCK) r->st.stock_reason_steps[plan.reason]++;
    if (k3c_engine_last_step_executor(r->e)) r->st.executor_steps++;
    K3C_TRY(finish_step(r, n));
    /* retire finished requests, keeping the admission order of the rest */
    int k = 0;
    for (int a = 0; a < r->n_active; a++) {
        run_req *q = &r->req[r->active[a]];
        if (q->state == REQ_DONE) {
            int id = q->id;
            q->id = -1;
            k3c_sampler_free(q->smp);
            q->smp = NULL;
            if (k3c_request_close(r->e, id) != K3C_OK) return k3c_error_context("runner: request %d", r->active[a]);
        } else {
            r->active[k++] = r->active[a];
        }
    }
    r->n_active = k;
    r->st.seconds += now_s() - t0;
    *busy = r->n_active > 0 || r->next_wait < r->n_req;
    return K3C_OK;
}

int k3c_runner_run(k3c_runner *r) {
    if (!r) return k3c_errorf("runner run: the runner is NULL");
    int busy = 1;
    while (busy) K3C_TRY(k3c_runner_step(r, &busy));
    return K3C_OK;
}

int k3c_runner_output(const k3c_runner *r, int handle, const int32_t **tokens, int *n, int *finished) {
    if (!r || !tokens || !n)
        return k3c_errorf("runner output: %s is NULL",
                          !r ? "the runner" : !tokens ? "the tokens output" : "the count output");
    if (handle < 0 || handle >= r->n_req) return k3c_errorf("runner: no request %d (%d submitted)", handle, r->n_req);
    const run_req *q = &r->req[handle];
    *tokens = q->hist + q->n_prompt;
    *n = q->generated;
    if (finished) *finished = q->state == REQ_DONE;
    return K3C_OK;
}

void k3c_runner_stats_get(const k3c_runner *r, k3c_runner_stats *out) {
    if (!out) return;
    if (r) *out = r->st;
    else memset(out, 0, sizeof *out);
}

const char *k3c_runner_route_name(int route) { return k3c_route_name(route); }

const char *k3c_runner_reason_name(int reason) { return k3c_stock_reason_text(reason); }
