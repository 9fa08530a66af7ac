/* TEMPORARY (see sched_adapter.h): FCFS continuous batching over k3c_engine_step, no prefix cache, no
 * preemption, no speculation, penalties and min_p ignored. Enough to run the server end to end. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server/sched_adapter.h"

typedef struct sreq {
    uint64_t id;
    k3c_sched_request q;
    int32_t *prompt, *stops;
    int prefilled, generated, eng, aborted, state; /* 0 waiting, 1 running */
    int32_t last;
    k3c_sampler *smp;
    struct sreq *next;
} sreq;

struct k3c_scheduler {
    k3c_engine *e;
    k3c_scheduler_options o;
    pthread_mutex_t mu;
    sreq *waiting, *running;
    int n_waiting, n_running, V, ctx;
    uint64_t next_id;
    k3c_sched_event *ev;
    int n_ev, cap_ev;
    int32_t *top_ids;
    float *top_lps;
    int top_cap;
    float *logits;
    k3c_step_item *items;
    sreq **item_req;
    k3c_scheduler_stats st;
};

int k3c_scheduler_create(k3c_engine *e, const k3c_scheduler_options *o, k3c_scheduler **out) {
    k3c_scheduler *s = calloc(1, sizeof *s);
    s->e = e;
    s->o = *o;
    int slots = k3c_engine_max_requests(e);
    if (!s->o.max_seqs || s->o.max_seqs > slots) s->o.max_seqs = slots;
    if (!s->o.max_batched_tokens || s->o.max_batched_tokens > k3c_engine_max_rows(e)) s->o.max_batched_tokens = k3c_engine_max_rows(e);
    if (!s->o.max_queue) s->o.max_queue = 1024;
    pthread_mutex_init(&s->mu, NULL);
    s->V = k3c_engine_vocab(e);
    k3c_engine_memory mm;
    k3c_engine_memory_get(e, &mm);
    s->ctx = mm.max_context;
    s->logits = malloc(sizeof(float) * (size_t)s->V * (size_t)s->o.max_seqs);
    s->items = calloc((size_t)s->o.max_seqs, sizeof *s->items);
    s->item_req = calloc((size_t)s->o.max_seqs, sizeof *s->item_req);
    s->next_id = 1;
    s->st.kda_slots_total = slots;
    *out = s;
    return K3C_OK;
}

static void free_req(k3c_scheduler *s, sreq *r) {
    if (r->state == 1) k3c_request_close(s->e, r->eng);
    k3c_sampler_free(r->smp);
    free(r->prompt);
    free(r->stops);
    free(r);
}

void k3c_scheduler_free(k3c_scheduler *s) {
    if (!s) return;
    for (sreq *r = s->waiting, *n; r; r = n) n = r->next, free_req(s, r);
    for (sreq *r = s->running, *n; r; r = n) n = r->next, free_req(s, r);
    free(s->ev);
    free(s->top_ids);
    free(s->top_lps);
    free(s->logits);
    free(s->items);
    free(s->item_req);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int k3c_scheduler_submit(k3c_scheduler *s, const k3c_sched_request *q, uint64_t *id) {
    if (q->n_prompt < 1 || q->max_new < 1 || q->n_prompt + q->max_new > s->ctx) return -1;
    pthread_mutex_lock(&s->mu);
    if (s->n_waiting >= s->o.max_queue) {
        pthread_mutex_unlock(&s->mu);
        return 1;
    }
    sreq *r = calloc(1, sizeof *r);
    r->q = *q;
    r->prompt = malloc(sizeof(int32_t) * (size_t)q->n_prompt);
    memcpy(r->prompt, q->prompt, sizeof(int32_t) * (size_t)q->n_prompt);
    r->stops = malloc(sizeof(int32_t) * (size_t)(q->n_stop_ids + 1));
    if (q->n_stop_ids) memcpy(r->stops, q->stop_ids, sizeof(int32_t) * (size_t)q->n_stop_ids);
    r->id = s->next_id++;
    sreq **t = &s->waiting;
    while (*t) t = &(*t)->next;
    *t = r;
    s->n_waiting++;
    *id = r->id;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int k3c_scheduler_abort(k3c_scheduler *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    for (sreq *r = s->waiting; r; r = r->next) if (r->id == id) r->aborted = 1;
    for (sreq *r = s->running; r; r = r->next) if (r->id == id) r->aborted = 1;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static k3c_sched_event *push(k3c_scheduler *s) {
    if (s->n_ev == s->cap_ev) {
        s->cap_ev = s->cap_ev ? 2 * s->cap_ev : 64;
        s->ev = realloc(s->ev, sizeof *s->ev * (size_t)s->cap_ev);
    }
    k3c_sched_event *e = &s->ev[s->n_ev++];
    memset(e, 0, sizeof *e);
    return e;
}

static void finish(k3c_scheduler *s, sreq *r, k3c_finish_reason f) {
    k3c_sched_event *e = push(s);
    e->kind = K3C_SCHED_FINISHED;
    e->id = r->id;
    e->user = r->q.user;
    e->finish = f;
    e->prompt_tokens = r->q.n_prompt;
    e->completion_tokens = r->generated;
    if (f == K3C_FINISH_ABORT) s->st.finished_abort++;
    else if (f == K3C_FINISH_STOP) s->st.finished_stop++;
    else s->st.finished_length++;
}

/* drops finished / aborted requests from list *l */
static void reap(k3c_scheduler *s, sreq **l, int *n, int abort_only) {
    for (sreq **p = l; *p;) {
        sreq *r = *p;
        if (r->aborted) {
            finish(s, r, K3C_FINISH_ABORT);
            *p = r->next;
            (*n)--;
            free_req(s, r);
        } else {
            p = &r->next;
        }
    }
}

int k3c_scheduler_step(k3c_scheduler *s, const k3c_sched_event **events, int *n_events, int *busy) {
    s->n_ev = 0;
    pthread_mutex_lock(&s->mu);
    reap(s, &s->waiting, &s->n_waiting, 1);
    reap(s, &s->running, &s->n_running, 1);
    while (s->waiting && s->n_running < s->o.max_seqs) {
        sreq *r = s->waiting;
        s->waiting = r->next;
        s->n_waiting--;
        if (k3c_request_open(s->e, &r->eng) != K3C_OK) {
            pthread_mutex_unlock(&s->mu);
            return K3C_ERR;
        }
        r->state = 1;
        k3c_sampler_create(&r->q.sampling.base, s->V, &r->smp);
        r->next = NULL;
        sreq **t = &s->running;
        while (*t) t = &(*t)->next;
        *t = r;
        s->n_running++;
    }
    int n = 0, budget = s->o.max_batched_tokens;
    for (sreq *r = s->running; r; r = r->next)
        if (r->prefilled == r->q.n_prompt && budget > 0) {
            s->items[n] = (k3c_step_item){r->eng, &r->last, 1, 0, 0};
            s->item_req[n++] = r;
            budget--;
        }
    for (sreq *r = s->running; r; r = r->next)
        if (r->prefilled < r->q.n_prompt && budget > 0) {
            int take = r->q.n_prompt - r->prefilled;
            if (take > budget) take = budget;
            s->items[n] = (k3c_step_item){r->eng, r->prompt + r->prefilled, take, 0, 0};
            s->item_req[n++] = r;
            budget -= take;
        }
    pthread_mutex_unlock(&s->mu);
    if (n && k3c_engine_step(s->e, s->items, n, s->logits) != K3C_OK) return K3C_ERR;
    s->st.steps += n > 0;
    if (n) s->st.route_steps[0]++;
    for (int i = 0; i < n; i++) {
        sreq *r = s->item_req[i];
        if (r->prefilled < r->q.n_prompt) {
            r->prefilled += s->items[i].n;
            s->st.prompt_tokens += s->items[i].n;
            if (r->prefilled < r->q.n_prompt) continue;
        }
        const float *lg = s->logits + (size_t)i * (size_t)s->V;
        int32_t tok = k3c_sampler_sample(r->smp, lg);
        k3c_sched_event *e = push(s);
        e->kind = K3C_SCHED_TOKEN;
        e->id = r->id;
        e->user = r->q.user;
        e->token = tok;
        int want = r->q.sampling.logprobs;
        if (want) {
            float mx = -INFINITY;
            for (int v = 0; v < s->V; v++) mx = lg[v] > mx ? lg[v] : mx;
            double z = 0;
            for (int v = 0; v < s->V; v++) z += exp((double)lg[v] - mx);
            float lz = (float)(mx + log(z));
            e->logprob = lg[tok] - lz;
            int k = want - 1;
            if (k > 0) {
                /* top k by repeated selection (k <= 20) */
                int base = s->top_cap;
                s->top_cap += k;
                s->top_ids = realloc(s->top_ids, sizeof(int32_t) * (size_t)s->top_cap);
                s->top_lps = realloc(s->top_lps, sizeof(float) * (size_t)s->top_cap);
                for (int j = 0; j < k; j++) {
                    int best = -1;
                    for (int v = 0; v < s->V; v++) {
                        int used = 0;
                        for (int u = 0; u < j; u++) used |= s->top_ids[base + u] == v;
                        if (!used && (best < 0 || lg[v] > lg[best])) best = v;
                    }
                    s->top_ids[base + j] = best;
                    s->top_lps[base + j] = lg[best] - lz;
                }
                e->n_top = k;
                e->top_ids = (const int32_t *)(intptr_t)base; /* fixed up below */
            }
        }
        r->generated++;
        s->st.generation_tokens++;
        r->last = tok;
        int stop = 0;
        for (int j = 0; j < r->q.n_stop_ids; j++) stop |= r->stops[j] == tok;
        if (stop || r->generated >= r->q.max_new) {
            pthread_mutex_lock(&s->mu);
            finish(s, r, stop ? K3C_FINISH_STOP : K3C_FINISH_LENGTH);
            for (sreq **p = &s->running; *p; p = &(*p)->next)
                if (*p == r) {
                    *p = r->next;
                    break;
                }
            s->n_running--;
            free_req(s, r);
            pthread_mutex_unlock(&s->mu);
        }
    }
    for (int i = 0; i < s->n_ev; i++)
        if (s->ev[i].n_top) {
            intptr_t base = (intptr_t)s->ev[i].top_ids;
            s->ev[i].top_ids = s->top_ids + base;
            s->ev[i].top_logprobs = s->top_lps + base;
        }
    s->top_cap = 0;
    pthread_mutex_lock(&s->mu);
    *busy = s->n_running + s->n_waiting > 0;
    pthread_mutex_unlock(&s->mu);
    *events = s->ev;
    *n_events = s->n_ev;
    return K3C_OK;
}

void k3c_scheduler_stats_get(k3c_scheduler *s, k3c_scheduler_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->running = s->n_running;
    out->waiting = s->n_waiting;
    out->kda_slots_used = s->n_running;
    pthread_mutex_unlock(&s->mu);
}
