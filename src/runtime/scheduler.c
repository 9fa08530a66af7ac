/* The serving scheduler (include/k3c.h, serving scheduler section): vLLM v1's scheduling over one engine,
 * one engine step per k3c_scheduler_step.
 *
 * A request is its token list toks (the prompt, then every generated token appended) and `computed`, the
 * tokens the engine holds; the engine is fed toks[computed .. n_toks) and the row of the last one gives the
 * next token. A decode is the case n_toks - computed = 1; anything longer is prefill, cut into chunks. After
 * a preemption computed is 0 again and the generated tokens are prefilled as part of the prompt, so the
 * request resumes where it was (its sampler, generator and penalty counts included).
 *
 * A step: (1) the running requests in admission order, each a decode (or a verify of 1 + D tokens, one D for
 * the whole step so the step is a uniform verify, the executor's shape) or its next prompt chunk within the
 * token budget; a request whose blocks cannot be had preempts the policy's victim (FCFS the newest, PRIORITY
 * the largest (priority, arrival)), itself included, which then stops this pass; (2) when nobody was
 * preempted, waiting requests in policy order, while a slot, the budget and the blocks of their first chunk
 * are there (a head that does not fit stops admission: no overtaking); (3) one engine step; (4) sampling,
 * acceptance, commits, stops; full blocks enter the prefix cache and chunk ends on a boundary leave KDA
 * snapshots; finished requests release everything.
 *
 * Batch invariance (include/k3c.h, k3c_engine_prompt_piece): the engine computes a row in a block form
 * (chunked KDA, expanded MLA) exactly when the aligned block of that form around it (KDA 64, MLA 128 by
 * default; G = k3c_engine_prompt_grid is the larger, a multiple of the other) lies whole in one non-verify
 * item, so a request's rows take the forms k3c_generate gives them alone when
 *   - prompt chunks end where k3c_engine_prompt_piece allows (G = k3c_engine_prompt_grid multiples below the
 *     prompt's last whole grid block, formed = floor(n_prompt / G) G; anything past it): rows below formed are
 *     in block form, the prompt's tail is not;
 *   - generated tokens (replayed after a preemption) are fed as decoding fed them, in pieces that hold no
 *     whole block of the smallest unit of the grid (s->unit), and never in one chunk with the prompt;
 *   - a prefix hit at p brings rows computed in block form by another request: full cache blocks below that
 *     request's formed only are indexed (their rows are then those of any request whose prompt holds them
 *     below its own formed), and p <= formed, a multiple of G so that the rows after p, which this request
 *     computes itself, still find their blocks whole.
 * Hits and KDA snapshots therefore sit on the scheduler's grid lcm(MLA block, G) (s->grid), at most formed.
 * With prefix caching, chunks also stop at three grid positions where a snapshot pays ("align"): the last
 * one at most formed (so a longer prompt with the same start, a later turn of a chat, finds a state there),
 * the junction where a prompt's cached MLA blocks outrun its deepest snapshot (the next request with that
 * prefix then finds both), and the caller's prefix_hint. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k3c.h"
#include "runtime/constrained.h"
#include "runtime/drafter.h"
#include "runtime/engine_internal.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"
#include "runtime/sched_queue.h"
#include "runtime/spec_accept.h"
#include "util/error.h"
#include "util/log.h"

#define DEFAULT_MAX_QUEUE 1024
#define DEFAULT_SNAPSHOT_BYTES ((size_t)256 << 20)
#define MAX_LOGPROBS 21 /* OpenAI's top_logprobs bound (20) + the chosen token */

enum { SR_WAITING, SR_RUNNING };
enum { IT_PREFILL, IT_DECODE, IT_VERIFY };

typedef struct sreq {
    uint64_t id;
    void *user;
    int priority;
    uint64_t arrival;
    int32_t *toks;          /* [n_prompt + max_new] */
    int n_prompt, n_toks, max_new, generated;
    k3c_sched_sampling sp;
    k3c_sampler *smp;
    k3c_gmatch *gm;         /* the grammar's matcher (constrained decoding), or NULL */
    int32_t *stop;          /* [n_stop] */
    int n_stop, ignore_eos;
    int state;
    int eid;                /* engine request while running, else -1 */
    int computed;           /* tokens the engine holds */
    int cached_tokens;      /* the first admission's prefix hit */
    int admitted;           /* admitted at least once */
    int first_token;        /* emitted a token (counted once in prompt_tokens) */
    int decoding;           /* the last step emitted a token and the engine holds all but it */
    int preemptions;
    double t_submit, t_admit; /* monotonic seconds: submitted, first admitted */
    int formed;             /* rows below it are in block form: n_prompt's last multiple of G (file comment) */
    int junction;           /* prefill chunks stop here (tokens; 0 = none): see the file comment */
    int hint;               /* and here: the prefix_hint's last grid boundary */
    /* prefix cache: key and indexed block of each full block of toks[0 .. computed) processed so far */
    k3c_phash *keys;
    int32_t *canon;
    int n_keys;
    /* this step */
    int sched_n, sched_blocks, kind, D;
    int32_t *win;           /* [1 + spec_tokens] the verify window */
} sreq;

typedef struct ev_top {
    int off;                /* into top_ids / top_lps, -1 none */
} ev_top;

struct k3c_scheduler {
    k3c_engine *e;
    k3c_scheduler_options o;
    int V, bs, eos, max_context, num_blocks, q_max;
    int pgrid;                /* G, k3c_engine_prompt_grid */
    int grid;                 /* lcm(bs, G): where hits and snapshots sit */
    int unit;                 /* the smallest block of a form (0: none), for replayed tokens */
    k3c_prefix_cache pc;
    int pc_on;
    k3c_sched_queue waiting;
    k3c_queue_entry *running; /* [max_seqs] in admission order */
    int n_running;
    uint64_t next_id, next_arrival;
    /* cross-thread state, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sreq **inbox;
    int n_inbox, cap_inbox;
    uint64_t *aborts;
    int n_aborts, cap_aborts;
    int pub_waiting;          /* waiting + inbox as of the last step: submit's bound */
    int pub_busy;
    k3c_scheduler_stats pub;  /* stats as of the last step boundary */
    /* step scratch */
    k3c_step_item *items;
    sreq **item_req;
    float *logits;            /* [max_seqs * (1 + spec_tokens), V] */
    int32_t *ids;
    int32_t *emitted;         /* [1 + spec_tokens] */
    k3c_sched_event *ev;
    ev_top *ev_top;
    int n_ev, cap_ev;
    int32_t *top_ids;
    float *top_lps;
    int n_top_used, cap_top;
    int32_t *hit_blocks;      /* [max_blocks_per_request] */
    k3c_constrained_scratch cw; /* constrained requests' masks (this thread's) */
    int reserved;             /* blocks promised to this step's items */
    char msg[512];
    k3c_scheduler_stats st;
};

void k3c_scheduler_options_default(k3c_scheduler_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->prefix_caching = 1;
}

static void req_free(sreq *r) {
    if (!r) return;
    k3c_sampler_free(r->smp);
    k3c_gmatch_free(r->gm);
    free(r->toks);
    free(r->stop);
    free(r->keys);
    free(r->canon);
    free(r->win);
    free(r);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int gcd(int a, int b) {
    while (b) {
        int t = a % b;
        a = b, b = t;
    }
    return a;
}

/* The smallest block of a form on the engine's grid G (0: no block form at all), read from the rule
 * k3c_engine_prompt_piece applies: in a prompt of G + k tokens a cut at G + k - 1 lies past the prompt's last
 * whole block of each form, so it is allowed, until k reaches the smallest block u (then the block [G, G + u)
 * is whole and the cut would split it). */
static int smallest_unit(const k3c_engine *e, int G) {
    if (G <= 1) return 0;
    for (int k = 2; k < G; k++)
        if (k3c_engine_prompt_piece(e, 0, G + k, G + k - 1) != G + k - 1) return k;
    return G;
}

int k3c_scheduler_create(k3c_engine *e, const k3c_scheduler_options *opt, k3c_scheduler **out) {
    if (!out) return k3c_errorf("scheduler: the output handle is NULL");
    *out = NULL;
    if (!e) return k3c_errorf("scheduler: the engine is NULL");
    k3c_scheduler_options o;
    k3c_scheduler_options_default(&o);
    if (opt) o = *opt;
    k3c_engine_view v;
    k3c_engine_view_get(e, &v);
    int slots = k3c_engine_slots_free(e);
    if (o.max_seqs < 0 || o.max_batched_tokens < 0 || o.max_queue < 0 || o.spec_tokens < 0 ||
        o.snapshot_interval < 0)
        return k3c_errorf("scheduler: max_seqs %d, max_batched_tokens %d, max_queue %d, spec_tokens %d, "
                          "snapshot_interval %d: none may be negative", o.max_seqs, o.max_batched_tokens,
                          o.max_queue, o.spec_tokens, o.snapshot_interval);
    if (o.policy != K3C_SCHED_FCFS && o.policy != K3C_SCHED_PRIORITY)
        return k3c_errorf("scheduler: policy %d: expected K3C_SCHED_FCFS (0) or K3C_SCHED_PRIORITY (1)", o.policy);
    if (slots <= 0) return k3c_errorf("scheduler: the engine has no free request slot");
    if (o.max_seqs == 0 || o.max_seqs > slots) o.max_seqs = slots;
    if (o.max_batched_tokens == 0 || o.max_batched_tokens > v.max_rows) o.max_batched_tokens = v.max_rows;
    if (o.max_queue == 0) o.max_queue = DEFAULT_MAX_QUEUE;
    if (o.snapshot_interval == 0) o.snapshot_interval = 1;
    if (o.snapshot_bytes == 0) o.snapshot_bytes = DEFAULT_SNAPSHOT_BYTES;
    if (o.spec_tokens + 1 > v.q_max)
        return k3c_errorf("scheduler: spec_tokens %d: a verify of %d tokens exceeds the engine's q_max %d",
                          o.spec_tokens, o.spec_tokens + 1, v.q_max);
    /* Prompt chunks are cut where k3c_engine_prompt_piece allows (file comment), and a budget of one prompt
     * grid always allows one; hits and snapshots sit on multiples of both the grid and the MLA block. */
    int G = k3c_engine_prompt_grid(e);
    if (o.max_batched_tokens < G)
        return k3c_errorf("scheduler: max_batched_tokens %d is less than the engine's prompt grid of %d tokens "
                          "(k3c_engine_prompt_grid): a long prompt could not be cut into chunks",
                          o.max_batched_tokens, G);
    int grid = G / gcd(G, v.block_size) * v.block_size;

    k3c_scheduler *s = calloc(1, sizeof *s);
    if (!s) return k3c_errorf_kind(K3C_ERROR_OOM, "scheduler: out of memory");
    s->e = e;
    s->o = o;
    s->V = k3c_engine_vocab(e);
    s->bs = v.block_size;
    s->pgrid = G;
    s->grid = grid;
    s->unit = smallest_unit(e, G);
    s->eos = v.m->config.eos_token_id;
    s->max_context = v.max_context;
    s->num_blocks = v.kv->num_blocks;
    s->q_max = v.q_max;
    s->next_id = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    size_t A = (size_t)o.max_seqs, W = (size_t)o.spec_tokens + 1;
    s->running = malloc(sizeof *s->running * A);
    s->items = calloc(A, sizeof *s->items);
    s->item_req = malloc(sizeof *s->item_req * A);
    s->ids = malloc(sizeof(int32_t) * A * W);
    s->emitted = malloc(sizeof(int32_t) * W);
    s->hit_blocks = malloc(sizeof(int32_t) * (size_t)v.max_blocks_per_request);
    s->logits = k3c_engine_logits_alloc(e, (int)(A * W));
    int rc = s->running && s->items && s->item_req && s->ids && s->emitted && s->hit_blocks && s->logits
                 ? K3C_OK
                 : k3c_errorf_kind(K3C_ERROR_OOM, "scheduler: out of memory (%d requests x %d rows)", o.max_seqs,
                                   (int)W);
    if (rc == K3C_OK) rc = k3c_sched_queue_init(&s->waiting, o.policy, 64);
    if (rc == K3C_OK) rc = k3c_constrained_scratch_init(&s->cw, s->V);
    s->pc_on = o.prefix_caching != 0;
    if (rc == K3C_OK && s->pc_on) {
        size_t sb = k3c_engine_snapshot_bytes(e);
        int count = sb ? (int)(o.snapshot_bytes / sb < 1 << 20 ? o.snapshot_bytes / sb : 1 << 20) : 0;
        if (sb && count == 0)
            k3c_log(K3C_LOG_WARN, "scheduler: snapshot_bytes %zu holds no KDA snapshot of %zu bytes: prefix "
                    "caching finds no hits", o.snapshot_bytes, sb);
        s->st.snapshot_bytes_each = (long)sb;
        s->st.snapshots_max = count;
        rc = k3c_engine_snapshots_reserve(e, count);
        if (rc == K3C_OK) rc = k3c_prefix_cache_init(&s->pc, e, count);
        if (rc != K3C_OK) s->pc_on = 0;
    }
    if (rc != K3C_OK) {
        k3c_scheduler_free(s);
        return k3c_error_context("scheduler");
    }
    s->st.blocks_total = s->num_blocks;
    s->st.prefix_grid = grid;
    s->st.block_size = v.block_size;
    s->st.snapshot_bytes_limit = (long)o.snapshot_bytes;
    s->st.snapshot_interval = o.snapshot_interval;
    s->st.kda_slots_total = o.max_seqs;
    s->pub = s->st;
    *out = s;
    return K3C_OK;
}

static void close_engine(k3c_scheduler *s, sreq *r) {
    if (r->eid < 0) return;
    int n = 0;
    const int32_t *b = k3c_engine_request_blocks(s->e, r->eid, &n);
    int32_t *copy = n > 0 ? s->hit_blocks : NULL; /* the table goes with the close: keep the ids for the cache */
    if (copy) memcpy(copy, b, sizeof(int32_t) * (size_t)n);
    k3c_request_close(s->e, r->eid);
    r->eid = -1;
    if (copy && s->pc_on) k3c_prefix_cache_released(&s->pc, copy, n);
}

void k3c_scheduler_free(k3c_scheduler *s) {
    if (!s) return;
    for (int i = 0; i < s->n_running; i++) {
        sreq *r = s->running[i].req;
        close_engine(s, r);
        req_free(r);
    }
    for (int i = 0; i < s->waiting.n; i++) req_free(s->waiting.v[i].req);
    for (int i = 0; i < s->n_inbox; i++) req_free(s->inbox[i]);
    if (s->pc_on) k3c_prefix_cache_release(&s->pc);
    k3c_engine_snapshots_reserve(s->e, 0);
    k3c_sched_queue_release(&s->waiting);
    k3c_engine_logits_free(s->e, s->logits);
    free(s->running);
    free(s->items);
    free(s->item_req);
    free(s->ids);
    free(s->emitted);
    free(s->hit_blocks);
    k3c_constrained_scratch_release(&s->cw);
    free(s->inbox);
    free(s->aborts);
    free(s->ev);
    free(s->ev_top);
    free(s->top_ids);
    free(s->top_lps);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* ---- submit / abort (any thread) ---- */

static int check_request(const k3c_scheduler *s, const k3c_sched_request *q) {
    if (!q->prompt || q->n_prompt <= 0) return k3c_errorf("scheduler submit: empty prompt");
    if (q->max_new <= 0) return k3c_errorf("scheduler submit: max_new %d, expected >= 1", q->max_new);
    if ((long)q->n_prompt + q->max_new > s->max_context)
        return k3c_errorf("scheduler submit: prompt of %d tokens + max_new %d exceeds the context of %d tokens",
                          q->n_prompt, q->max_new, s->max_context);
    long blocks = ((long)q->n_prompt + q->max_new + s->bs - 1) / s->bs;
    if (blocks > s->num_blocks)
        return k3c_errorf("scheduler submit: prompt of %d tokens + max_new %d needs %ld cache blocks, the cache "
                          "has %d", q->n_prompt, q->max_new, blocks, s->num_blocks);
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= s->V)
            return k3c_errorf("scheduler submit: prompt token %d: id %d outside 0..%d", i, q->prompt[i], s->V - 1);
    if (q->n_stop_ids < 0 || (q->n_stop_ids > 0 && !q->stop_ids))
        return k3c_errorf("scheduler submit: %d stop ids but the list is NULL", q->n_stop_ids);
    for (int i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] < 0 || q->stop_ids[i] >= s->V)
            return k3c_errorf("scheduler submit: stop id %d outside 0..%d", q->stop_ids[i], s->V - 1);
    if (q->sampling.logprobs < 0 || q->sampling.logprobs > MAX_LOGPROBS)
        return k3c_errorf("scheduler submit: logprobs %d outside 0..%d (the chosen token + up to %d alternatives)",
                          q->sampling.logprobs, MAX_LOGPROBS, MAX_LOGPROBS - 1);
    if (q->prefix_hint < 0 || q->prefix_hint > q->n_prompt)
        return k3c_errorf("scheduler submit: prefix_hint %d outside 0..%d (the prompt)", q->prefix_hint, q->n_prompt);
    if (q->priority != 0 && s->o.policy != K3C_SCHED_PRIORITY)
        return k3c_errorf("scheduler submit: priority %d needs the priority policy (the scheduler runs FCFS)",
                          q->priority);
    return K3C_OK;
}

int k3c_scheduler_submit(k3c_scheduler *s, const k3c_sched_request *q, uint64_t *id) {
    if (!s || !q || !id)
        return k3c_errorf("scheduler submit: %s is NULL", !s ? "the scheduler" : !q ? "the request" : "the id output");
    K3C_TRY(check_request(s, q));
    sreq *r = calloc(1, sizeof *r);
    if (!r) return k3c_errorf_kind(K3C_ERROR_OOM, "scheduler submit: out of memory");
    r->user = q->user;
    r->priority = q->priority;
    r->n_prompt = r->n_toks = q->n_prompt;
    r->max_new = q->max_new;
    r->sp = q->sampling;
    r->ignore_eos = q->ignore_eos;
    r->formed = q->n_prompt / s->pgrid * s->pgrid;
    r->hint = q->prefix_hint > 0 && q->prefix_hint <= q->n_prompt ? q->prefix_hint / s->grid * s->grid : 0;
    r->eid = -1;
    r->n_stop = q->n_stop_ids;
    int max_blocks = (q->n_prompt + q->max_new) / s->bs + 1;
    r->toks = malloc(sizeof(int32_t) * ((size_t)q->n_prompt + (size_t)q->max_new));
    r->stop = malloc(sizeof(int32_t) * (size_t)(q->n_stop_ids + 1));
    r->keys = malloc(sizeof *r->keys * (size_t)max_blocks);
    r->canon = malloc(sizeof *r->canon * (size_t)max_blocks);
    r->win = malloc(sizeof(int32_t) * ((size_t)s->o.spec_tokens + 1));
    if (!r->toks || !r->stop || !r->keys || !r->canon || !r->win) {
        req_free(r);
        return k3c_errorf_kind(K3C_ERROR_OOM, "scheduler submit: out of memory (%d + %d tokens)", q->n_prompt,
                               q->max_new);
    }
    memcpy(r->toks, q->prompt, sizeof(int32_t) * (size_t)q->n_prompt);
    if (q->n_stop_ids) memcpy(r->stop, q->stop_ids, sizeof(int32_t) * (size_t)q->n_stop_ids);
    k3c_sampler_ext x = {.min_p = q->sampling.min_p, .presence = q->sampling.presence_penalty,
                         .frequency = q->sampling.frequency_penalty, .repetition = q->sampling.repetition_penalty};
    if (k3c_sampler_create_ext(&q->sampling.base, &x, s->V, &r->smp) != K3C_OK ||
        k3c_sampler_set_prompt(r->smp, q->prompt, q->n_prompt) != K3C_OK ||
        (q->grammar && k3c_gmatch_create(q->grammar, &r->gm) != K3C_OK)) {
        req_free(r);
        return k3c_error_context("scheduler submit");
    }
    pthread_mutex_lock(&s->mu);
    if (s->pub_waiting + s->n_inbox >= s->o.max_queue) {
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return 1;
    }
    if (s->n_inbox == s->cap_inbox) {
        int cap = s->cap_inbox ? 2 * s->cap_inbox : 16;
        sreq **ni = realloc(s->inbox, sizeof *ni * (size_t)cap);
        if (!ni) {
            pthread_mutex_unlock(&s->mu);
            req_free(r);
            return k3c_errorf_kind(K3C_ERROR_OOM, "scheduler submit: out of memory");
        }
        s->inbox = ni;
        s->cap_inbox = cap;
    }
    r->id = s->next_id++;
    r->arrival = s->next_arrival++;
    r->t_submit = now_s();
    s->inbox[s->n_inbox++] = r;
    *id = r->id;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int k3c_scheduler_abort(k3c_scheduler *s, uint64_t id) {
    if (!s) return k3c_errorf("scheduler abort: the scheduler is NULL");
    pthread_mutex_lock(&s->mu);
    int rc = K3C_OK;
    if (s->n_aborts == s->cap_aborts) {
        int cap = s->cap_aborts ? 2 * s->cap_aborts : 16;
        uint64_t *na = realloc(s->aborts, sizeof *na * (size_t)cap);
        if (na) s->aborts = na, s->cap_aborts = cap;
        else rc = k3c_errorf_kind(K3C_ERROR_OOM, "scheduler abort: out of memory");
    }
    if (rc == K3C_OK) s->aborts[s->n_aborts++] = id;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void k3c_scheduler_wait(k3c_scheduler *s, int timeout_ms) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    if (!s->n_inbox && !s->n_aborts && !s->pub_busy && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(timeout_ms % 1000) * 1000000L;
        ts.tv_sec += timeout_ms / 1000 + ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
}

void k3c_scheduler_stats_get(k3c_scheduler *s, k3c_scheduler_stats *out) {
    if (!out) return;
    if (!s) {
        memset(out, 0, sizeof *out);
        return;
    }
    pthread_mutex_lock(&s->mu);
    *out = s->pub;
    pthread_mutex_unlock(&s->mu);
}

/* ---- events ---- */

static k3c_sched_event *event_add(k3c_scheduler *s, sreq *r, k3c_sched_event_kind kind) {
    if (s->n_ev == s->cap_ev) {
        int cap = s->cap_ev ? 2 * s->cap_ev : 64;
        k3c_sched_event *ne = realloc(s->ev, sizeof *ne * (size_t)cap);
        if (!ne) return NULL;
        s->ev = ne;
        ev_top *nt = realloc(s->ev_top, sizeof *nt * (size_t)cap);
        if (!nt) return NULL;
        s->ev_top = nt;
        s->cap_ev = cap;
    }
    k3c_sched_event *ev = &s->ev[s->n_ev];
    *ev = (k3c_sched_event){.kind = kind, .id = r->id, .user = r->user, .stop_token = -1};
    s->ev_top[s->n_ev].off = -1;
    s->n_ev++;
    return ev;
}

/* Logprobs of a token from its logits row into the event (top alternatives into the step's arena). */
static void event_logprobs(k3c_scheduler *s, sreq *r, k3c_sched_event *ev, const float *row, int32_t tok,
                           float *lp_out) {
    int n_top = r->sp.logprobs - 1;
    if (r->sp.logprobs <= 0 || !row) return;
    if (s->n_top_used + n_top > s->cap_top) {
        int cap = s->cap_top ? 2 * s->cap_top : 256;
        while (cap < s->n_top_used + n_top) cap *= 2;
        int32_t *ni = realloc(s->top_ids, sizeof *ni * (size_t)cap);
        if (ni) s->top_ids = ni;
        float *nl = realloc(s->top_lps, sizeof *nl * (size_t)cap);
        if (nl) s->top_lps = nl;
        if (!ni || !nl) n_top = 0;
        else s->cap_top = cap;
    }
    k3c_sampler_logprobs(r->smp, row, tok, n_top, s->top_ids + s->n_top_used, s->top_lps + s->n_top_used, lp_out);
    if (ev && n_top > 0) {
        ev->n_top = n_top;
        s->ev_top[ev - s->ev].off = s->n_top_used;
        s->n_top_used += n_top;
    }
}

/* Removes r from the running set (index i) or the waiting queue, releases its engine request and frees it
 * after a FINISHED event. */
static void finish(k3c_scheduler *s, sreq *r, k3c_finish_reason why, int32_t stop_tok, float stop_lp,
                   const char *msg) {
    close_engine(s, r);
    if (r->state == SR_RUNNING) {
        for (int i = 0; i < s->n_running; i++)
            if (s->running[i].req == r) {
                memmove(s->running + i, s->running + i + 1, sizeof *s->running * (size_t)(s->n_running - i - 1));
                s->n_running--;
                break;
            }
    } else {
        k3c_sched_queue_remove(&s->waiting, r);
    }
    k3c_sched_event *ev = event_add(s, r, K3C_SCHED_FINISHED);
    if (ev) {
        ev->finish = why;
        ev->stop_token = stop_tok;
        ev->stop_logprob = stop_lp;
        ev->prompt_tokens = r->n_prompt;
        ev->cached_tokens = r->cached_tokens;
        ev->completion_tokens = r->generated;
        ev->preemptions = r->preemptions;
        ev->queue_seconds = (r->admitted ? r->t_admit : now_s()) - r->t_submit;
        if (msg) {
            snprintf(s->msg, sizeof s->msg, "%s", msg);
            ev->message = s->msg;
        }
    }
    switch (why) {
    case K3C_FINISH_STOP: s->st.finished_stop++; break;
    case K3C_FINISH_LENGTH: s->st.finished_length++; break;
    case K3C_FINISH_ABORT: s->st.finished_abort++; break;
    default: s->st.finished_error++; break;
    }
    req_free(r);
}

/* A generated token: 1 when the request finished with it (and is freed). row: its logits (logprobs). */
static int take_token(k3c_scheduler *s, sreq *r, int32_t tok, const float *row) {
    r->generated++;
    s->st.generation_tokens++;
    if (!r->first_token) {
        r->first_token = 1;
        s->st.prompt_tokens += r->n_prompt;
    }
    int stop = !r->ignore_eos && tok == s->eos;
    for (int i = 0; i < r->n_stop && !stop; i++) stop = tok == r->stop[i];
    if (stop) {
        float lp = 0;
        event_logprobs(s, r, NULL, row, tok, &lp);
        finish(s, r, K3C_FINISH_STOP, tok, lp, NULL);
        return 1;
    }
    r->toks[r->n_toks++] = tok;
    r->decoding = 1;
    k3c_sched_event *ev = event_add(s, r, K3C_SCHED_TOKEN);
    if (ev) {
        ev->token = tok;
        event_logprobs(s, r, ev, row, tok, &ev->logprob);
    }
    if (r->generated >= r->max_new) {
        finish(s, r, K3C_FINISH_LENGTH, -1, 0, NULL);
        return 1;
    }
    return 0;
}

/* ---- block accounting ---- */

/* Blocks the step can still promise: free ones, and cached ones nobody holds, less those promised. */
static int blocks_available(k3c_scheduler *s) {
    return k3c_engine_blocks_free(s->e) + (s->pc_on ? k3c_prefix_cache_evictable(&s->pc) : 0) - s->reserved;
}

/* New blocks r needs to hold computed + n tokens. */
static int blocks_needed(k3c_scheduler *s, sreq *r, int n) {
    int have = 0;
    if (r->eid >= 0) k3c_engine_request_blocks(s->e, r->eid, &have);
    int need = (r->computed + n + s->bs - 1) / s->bs - have;
    return need > 0 ? need : 0;
}

/* The next prefill piece of r from computed within budget tokens; 0 when no allowed cut fits. Below the
 * prompt's end: a chunk k3c_engine_prompt_piece allows, stopping at the snapshot positions (prefix caching:
 * the junction, the hint, the last grid boundary at most formed) and at the prompt's end. Past it (generated
 * tokens replayed after a preemption): a piece that holds no whole aligned block of s->unit tokens, so that
 * every row takes the form its decode step gave it (file comment). */
static int chunk_len(k3c_scheduler *s, sreq *r, int budget) {
    int pos = r->computed;
    if (pos >= r->n_prompt) {
        int end = r->n_toks;
        if (s->unit) {
            int whole = (pos + s->unit - 1) / s->unit * s->unit + s->unit; /* the first whole block's end */
            if (whole - 1 < end) end = whole - 1;
        }
        return end - pos < budget ? end - pos : budget;
    }
    int limit = r->n_prompt;
    if (s->pc_on) {
        int align = r->formed / s->grid * s->grid;
        if (r->junction > pos && r->junction < limit) limit = r->junction;
        if (r->hint > pos && r->hint < limit) limit = r->hint;
        if (align > pos && align < limit) limit = align;
    }
    return k3c_engine_prompt_piece(s->e, pos, r->n_prompt, limit - pos < budget ? limit - pos : budget);
}

/* Preempts r (recompute): its engine request is released and it waits at the front. Undoes its part of this
 * step if it had one. */
static int preempt(k3c_scheduler *s, sreq *r, int *budget) {
    if (r->sched_n) {
        *budget += r->sched_n;
        s->reserved -= r->sched_blocks;
        r->sched_n = r->sched_blocks = 0;
    }
    close_engine(s, r);
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i].req == r) {
            memmove(s->running + i, s->running + i + 1, sizeof *s->running * (size_t)(s->n_running - i - 1));
            s->n_running--;
            break;
        }
    r->state = SR_WAITING;
    r->computed = 0;
    r->decoding = 0;
    r->n_keys = 0;
    r->junction = 0;
    r->preemptions++;
    s->st.preemptions++;
    return k3c_sched_queue_push(&s->waiting, (k3c_queue_entry){r->priority, r->arrival, r}, 1);
}

/* ---- admission ---- */

/* Opens r on the engine, with the longest cached prefix that has both its blocks and a snapshot; *start =
 * the tokens it then holds. Returns 0 when r does not fit now (nothing changed), 1 admitted, -1 error. */
static int admit(k3c_scheduler *s, sreq *r, int budget) {
    int hit = 0, matched = 0, dp = -1;
    if (s->pc_on) {
        /* at most formed (file comment), and one token short of the end: its row samples */
        int limit = r->formed < r->n_toks - 1 ? r->formed : r->n_toks - 1;
        /* under data parallelism the DP rank with the deepest hit (then the longest match, then the lowest
         * rank) takes the request, as its blocks' rows are in that rank's caches; with nothing cached on any, the
         * engine places it on the least loaded */
        int dps = k3c_engine_dp_size(s->e), best = -1, bm = 0, bd = 0;
        for (int d = 0; d < dps; d++) {
            int m = 0, h = k3c_prefix_cache_lookup_dp(&s->pc, d, r->toks, limit / s->bs, s->hit_blocks, &m);
            while (h > 0 && (h * s->bs % s->grid || (s->pc.need_snapshot && s->pc.snap[s->hit_blocks[h - 1]] < 0)))
                h--;
            if (h > best || (h == best && m > bm)) best = h, bm = m, bd = d;
        }
        if (bd != dps - 1) /* hit_blocks holds the last rank's lookup: the chosen one's again */
            k3c_prefix_cache_lookup_dp(&s->pc, bd, r->toks, limit / s->bs, s->hit_blocks, &matched);
        hit = best;
        matched = bm;
        if (dps > 1 && (hit > 0 || bm > 0)) dp = bd;
    }
    r->computed = hit * s->bs;
    /* the junction: cached blocks past the deepest snapshot; the first chunk stops there to leave one */
    int junction = matched * s->bs < r->formed ? matched * s->bs : r->formed;
    r->junction = junction / s->grid * s->grid > r->computed ? junction / s->grid * s->grid : 0;
    int c = chunk_len(s, r, budget);
    if (c == 0) {
        r->computed = 0;
        return 0;
    }
    int in_lru = 0;
    for (int i = 0; i < hit; i++) in_lru += s->pc.in_lru[s->hit_blocks[i]];
    int need = (r->computed + c + s->bs - 1) / s->bs - hit;
    if (blocks_available(s) - in_lru < need) {
        r->computed = 0;
        return 0;
    }
    for (int i = 0; i < hit; i++) k3c_prefix_cache_acquire(&s->pc, s->hit_blocks[i]);
    if (k3c_engine_request_open_dp(s->e, s->hit_blocks, hit, dp, &r->eid) != K3C_OK) {
        r->eid = -1;
        r->computed = 0;
        if (hit) k3c_prefix_cache_released(&s->pc, s->hit_blocks, hit);
        return -1;
    }
    if (hit > 0 && s->pc.need_snapshot) {
        int snap = k3c_prefix_cache_snapshot_of(&s->pc, s->hit_blocks[hit - 1]);
        if (snap < 0 || k3c_engine_snapshot_restore(s->e, r->eid, snap) != K3C_OK) {
            close_engine(s, r);
            r->computed = 0;
            return snap < 0 ? k3c_errorf_kind(K3C_ERROR_INTERNAL, "scheduler: a hit without its snapshot") : -1;
        }
    }
    for (int i = 0; i < hit; i++) {
        r->keys[i] = s->pc.key[s->hit_blocks[i]];
        r->canon[i] = s->hit_blocks[i];
    }
    r->n_keys = hit;
    if (!r->admitted) r->cached_tokens = r->computed, r->t_admit = now_s();
    r->admitted = 1;
    s->st.prefix_queries_tokens += r->n_toks;
    s->st.prefix_hits_tokens += r->computed;
    r->state = SR_RUNNING;
    r->kind = IT_PREFILL;
    r->sched_n = c;
    r->sched_blocks = need;
    s->reserved += need;
    s->running[s->n_running++] = (k3c_queue_entry){r->priority, r->arrival, r};
    return 1;
}

/* ---- after a step: the prefix cache ---- */

/* Indexes r's full blocks of computed tokens below formed (file comment: rows past it are not in the block
 * forms another request's prompt may need); after a prompt chunk that ended on the grid, a snapshot of its
 * KDA state there. */
static void cache_blocks(k3c_scheduler *s, sreq *r, int was_prefill) {
    if (!s->pc_on || r->eid < 0) return;
    int nb = 0;
    const int32_t *blocks = k3c_engine_request_blocks(s->e, r->eid, &nb);
    int full = (r->computed < r->formed ? r->computed : r->formed) / s->bs;
    for (int k = r->n_keys; k < full && k < nb; k++) {
        k3c_phash parent = k > 0 ? r->keys[k - 1] : k3c_prefix_root(k3c_engine_request_dp(s->e, r->eid));
        const int32_t *t = r->toks + (size_t)k * s->bs;
        k3c_phash key = k3c_prefix_key(parent, t, s->bs);
        r->keys[k] = key;
        r->canon[k] = k3c_prefix_cache_insert(&s->pc, blocks[k], parent, key, t);
        r->n_keys = k + 1;
    }
    if (!was_prefill || !s->pc.need_snapshot || r->computed % s->grid || r->computed > r->formed || full == 0 ||
        r->n_keys < full)
        return;
    int align = r->formed / s->grid * s->grid;
    if (r->computed / s->grid % s->o.snapshot_interval && r->computed != align && r->computed != r->junction &&
        r->computed != r->hint)
        return;
    int had = 0, b = r->canon[full - 1];
    int snap = k3c_prefix_cache_snapshot_take(&s->pc, b, &had);
    if (snap < 0) return;
    if (k3c_engine_snapshot_save(s->e, r->eid, snap) != K3C_OK) {
        k3c_log(K3C_LOG_WARN, "scheduler: a KDA snapshot failed: %s", k3c_error_message());
        k3c_error_clear();
        k3c_prefix_cache_snapshot_drop(&s->pc, b);
    }
}

/* ---- the step ---- */

static sreq *find_req(k3c_scheduler *s, uint64_t id) {
    for (int i = 0; i < s->n_running; i++)
        if (((sreq *)s->running[i].req)->id == id) return s->running[i].req;
    for (int i = 0; i < s->waiting.n; i++)
        if (((sreq *)s->waiting.v[i].req)->id == id) return s->waiting.v[i].req;
    return NULL;
}

/* Takes the submits and aborts of other threads. */
static int take_inbox(k3c_scheduler *s) {
    pthread_mutex_lock(&s->mu);
    int rc = K3C_OK;
    for (int i = 0; i < s->n_inbox && rc == K3C_OK; i++) {
        rc = k3c_sched_queue_push(&s->waiting, (k3c_queue_entry){s->inbox[i]->priority, s->inbox[i]->arrival,
                                                                  s->inbox[i]}, 0);
        if (rc == K3C_OK) s->inbox[i] = NULL;
    }
    int k = 0;
    for (int i = 0; i < s->n_inbox; i++)
        if (s->inbox[i]) s->inbox[k++] = s->inbox[i];
    s->n_inbox = k;
    /* the abort list is taken whole (abort starts a new one), so it is walked without the lock */
    uint64_t *ab = s->aborts;
    int n_ab = s->n_aborts;
    s->aborts = NULL;
    s->n_aborts = s->cap_aborts = 0;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_ab; i++) {
        sreq *r = find_req(s, ab[i]);
        if (r) finish(s, r, K3C_FINISH_ABORT, -1, 0, NULL);
    }
    free(ab);
    return rc;
}

/* The one D of this step's verifies (file comment): 0 when no decoding request's drafter found anything. */
static int choose_drafts(k3c_scheduler *s, int budget) {
    int d = s->o.spec_tokens, n_dec = 0, any = 0, D = d;
    if (d == 0) return 0;
    for (int i = 0; i < s->n_running; i++) {
        sreq *r = s->running[i].req;
        if (r->n_toks - r->computed != 1) continue;
        n_dec++;
        r->win[0] = r->toks[r->n_toks - 1];
        int found = k3c_draft_ngram(r->toks, r->n_toks, d, r->win + 1);
        for (int k = found; k < d; k++) r->win[1 + k] = r->win[k]; /* pad: repeat the last */
        any |= found > 0;
        int need = r->max_new - r->generated; /* no verify writes past where plain decoding would end */
        if (need - 1 < D) D = need - 1;
    }
    if (!any || n_dec == 0) return 0;
    if (n_dec * (1 + D) > budget) D = budget / n_dec - 1;
    return D > 0 ? D : 0;
}

/* Schedules the running requests, then admits; returns K3C_ERR only on an engine failure at admission. */
static int schedule(k3c_scheduler *s) {
    int budget = s->o.max_batched_tokens, preempted = 0;
    s->reserved = 0;
    for (int i = 0; i < s->n_running; i++) {
        sreq *r = s->running[i].req;
        r->sched_n = r->sched_blocks = 0;
    }
    int D = choose_drafts(s, budget);
    for (int i = 0; i < s->n_running; i++) {
        sreq *r = s->running[i].req;
        int n, kind;
        if (r->n_toks - r->computed == 1) {
            kind = D > 0 ? IT_VERIFY : IT_DECODE;
            n = 1 + D;
            if (n > budget) continue;
        } else {
            kind = IT_PREFILL;
            n = chunk_len(s, r, budget);
            if (n == 0) continue;
        }
        int need = blocks_needed(s, r, n), self = 0;
        while (blocks_available(s) < need) {
            int v = k3c_sched_victim(s->o.policy, s->running, s->n_running);
            sreq *victim = s->running[v].req;
            if (victim == r) self = 1;
            if (v < i) i--;
            K3C_TRY(preempt(s, victim, &budget));
            preempted = 1;
            if (self) break;
        }
        if (self) break; /* vLLM: the request preempted itself, the pass ends */
        r->kind = kind;
        r->D = kind == IT_VERIFY ? D : 0;
        r->sched_n = n;
        r->sched_blocks = need;
        s->reserved += need;
        budget -= n;
    }
    while (!preempted && s->n_running < s->o.max_seqs && budget > 0 && k3c_engine_slots_free(s->e) > 0) {
        sreq *r = k3c_sched_queue_peek(&s->waiting);
        if (!r) break;
        int a = admit(s, r, budget);
        if (a < 0) {
            k3c_sched_queue_pop(&s->waiting);
            r->state = SR_RUNNING; /* not in the queue any more */
            finish(s, r, K3C_FINISH_ERROR, -1, 0, k3c_error_message());
            k3c_error_clear();
            continue;
        }
        if (a == 0) break;
        k3c_sched_queue_pop(&s->waiting);
        budget -= r->sched_n;
    }
    /* the promised blocks on the free list: cached blocks nobody holds go first, least recently used */
    while (s->pc_on && k3c_engine_blocks_free(s->e) < s->reserved)
        if (!k3c_prefix_cache_evict(&s->pc)) break;
    return K3C_OK;
}

/* Handles the results of the step just run (ids: greedy ids per row, or NULL: logits). */
static void finish_step(k3c_scheduler *s, int n, int with_ids) {
    size_t row = 0;
    int V = s->V;
    for (int i = 0; i < n; i++) {
        sreq *r = s->item_req[i];
        const k3c_step_item *it = &s->items[i];
        if (r->kind == IT_VERIFY) {
            int D = it->n - 1, cnt;
            const float *rows = s->logits + row * (size_t)V;
            if (with_ids) {
                cnt = 0;
                while (cnt < D && s->ids[row + cnt] == r->win[1 + cnt]) cnt++;
                for (int j = 0; j < cnt; j++) s->emitted[j] = r->win[1 + j];
                s->emitted[cnt] = s->ids[row + cnt];
                cnt++;
            } else if (r->gm) {
                if (k3c_constrained_accept(r->smp, r->gm, rows, r->win + 1, D, r->max_new - r->generated, &s->cw,
                                           s->emitted, &cnt) != K3C_OK) {
                    finish(s, r, K3C_FINISH_ERROR, -1, 0, k3c_error_message());
                    k3c_error_clear();
                    row += (size_t)it->n;
                    continue;
                }
            } else {
                cnt = k3c_spec_accept(r->smp, rows, V, r->win + 1, D, s->emitted);
            }
            int acc = cnt - 1; /* drafts kept */
            s->st.spec_drafts++;
            s->st.spec_draft_tokens += D;
            s->st.spec_accepted_tokens += acc;
            for (int j = 0; j < acc && j < K3C_SCHED_SPEC_POS; j++) s->st.spec_accepted_by_pos[j]++;
            if (k3c_request_commit(s->e, r->eid, 1 + acc) != K3C_OK) {
                finish(s, r, K3C_FINISH_ERROR, -1, 0, k3c_error_message());
                k3c_error_clear();
                row += (size_t)it->n;
                continue;
            }
            r->computed += 1 + acc;
            if (!r->decoding) s->st.prefill_tokens++; /* a prompt's last token verified with drafts */
            int done = 0;
            for (int j = 0; j < cnt && !done; j++)
                done = take_token(s, r, s->emitted[j], with_ids ? NULL : rows + (size_t)j * V);
            if (!done) cache_blocks(s, r, 0);
            row += (size_t)it->n;
            continue;
        }
        int was_prefill = r->kind == IT_PREFILL && it->n > 1;
        r->computed += it->n;
        if (!r->decoding) s->st.prefill_tokens += it->n;
        if (r->computed < r->n_toks) { /* a chunk short of the end: no token yet */
            cache_blocks(s, r, was_prefill);
            row++;
            continue;
        }
        const float *lg = with_ids ? NULL : s->logits + row * (size_t)V;
        int32_t tok;
        if (r->gm) {
            if (k3c_constrained_next(r->smp, r->gm, lg, r->max_new - r->generated, &s->cw, &tok) != K3C_OK) {
                finish(s, r, K3C_FINISH_ERROR, -1, 0, k3c_error_message());
                k3c_error_clear();
                row++;
                continue;
            }
        } else {
            tok = with_ids ? s->ids[row] : k3c_sampler_next(r->smp, lg);
        }
        if (!with_ids) k3c_sampler_observe(r->smp, tok);
        row++;
        if (!take_token(s, r, tok, lg)) cache_blocks(s, r, was_prefill);
    }
}

static void publish(k3c_scheduler *s) {
    s->st.running = s->n_running;
    s->st.waiting = s->waiting.n;
    int used = 0, cached = 0;
    k3c_engine_view v;
    k3c_engine_view_get(s->e, &v);
    for (int b = 0; b < s->num_blocks; b++) {
        int refs = v.kv->ref[b], in_cache = s->pc_on && s->pc.valid[b];
        used += refs > in_cache;
        cached += in_cache;
    }
    s->st.blocks_used = used;
    s->st.blocks_cached = cached;
    s->st.kda_slots_used = s->n_running;
    s->st.snapshots = s->pc_on ? s->pc.snaps.used : 0;
    s->st.snapshot_bytes = (long)s->st.snapshots * (long)k3c_engine_snapshot_bytes(s->e);
    pthread_mutex_lock(&s->mu);
    s->pub = s->st;
    s->pub.waiting += s->n_inbox;
    s->pub_waiting = s->waiting.n;
    s->pub_busy = s->n_running > 0 || s->waiting.n > 0;
    pthread_mutex_unlock(&s->mu);
}

int k3c_scheduler_step(k3c_scheduler *s, const k3c_sched_event **events, int *n_events, int *busy) {
    if (events) *events = NULL;
    if (n_events) *n_events = 0;
    if (busy) *busy = 0;
    if (!s || !events || !n_events || !busy)
        return k3c_errorf("scheduler step: %s is NULL", !s ? "the scheduler" : "an output");
    s->n_ev = 0;
    s->n_top_used = 0;
    int rc = take_inbox(s);
    if (rc == K3C_OK) rc = schedule(s);
    int n = 0, plain = 1;
    s->st.last_step_tokens = 0;
    if (rc == K3C_OK) {
        /* decodes and verifies first, then prompt chunks, each group in admission order */
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < s->n_running; i++) {
                sreq *r = s->running[i].req;
                if (!r->sched_n || (r->kind == IT_PREFILL) != pass) continue;
                const int32_t *t = r->kind == IT_VERIFY ? r->win : r->toks + r->computed;
                s->items[n] = (k3c_step_item){.request = r->eid, .tokens = t, .n = r->sched_n,
                                              .verify = r->kind == IT_VERIFY};
                s->item_req[n++] = r;
                plain &= k3c_sampler_plain_greedy(r->smp) && r->sp.logprobs == 0 && !r->gm;
            }
    }
    if (rc == K3C_OK && n > 0) {
        int wrote = 0, tokens = 0;
        for (int i = 0; i < n; i++) tokens += s->items[i].n;
        rc = k3c_engine_run_step(s->e, s->items, n, NULL, s->logits, plain ? s->ids : NULL, &wrote);
        if (rc == K3C_OK) {
            s->st.last_step_tokens = tokens;
            s->st.steps++;
            s->st.route_steps[k3c_engine_last_plan(s->e).route]++;
            s->st.executor_steps += k3c_engine_last_step_executor(s->e);
            if (plain && !wrote) { /* a stock step wrote logits: take the greedy ids from them */
                int rows = k3c_step_logits_rows(s->items, n);
                for (int r = 0; r < rows; r++) s->ids[r] = k3c_greedy_token(s->logits + (size_t)r * s->V, s->V);
            }
            finish_step(s, n, plain);
        } else {
            /* the engine's state of these requests is unknown: they end, the others go on */
            char why[512];
            snprintf(why, sizeof why, "%s", k3c_error_message());
            for (int i = 0; i < n; i++) finish(s, s->item_req[i], K3C_FINISH_ERROR, -1, 0, why);
        }
    }
    for (int i = 0; i < s->n_running; i++) ((sreq *)s->running[i].req)->sched_n = 0;
    for (int i = 0; i < s->n_ev; i++)
        if (s->ev_top[i].off >= 0) {
            s->ev[i].top_ids = s->top_ids + s->ev_top[i].off;
            s->ev[i].top_logprobs = s->top_lps + s->ev_top[i].off;
        }
    publish(s);
    *events = s->ev;
    *n_events = s->n_ev;
    pthread_mutex_lock(&s->mu);
    *busy = s->n_running > 0 || s->waiting.n > 0 || s->n_inbox > 0 || s->n_aborts > 0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}
