/* The model, the engine, the scheduler, and the thread that steps it: each step's events go through their
 * choice's text pipeline (output.c) into the request's byte queue, and the request's connection is resumed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

static const char *base_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t a = n;
    while (a > 0 && dir[a - 1] != '/') a--;
    static char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)(n - a), dir + a);
    return buf;
}

/* The engine's options: the same on every rank of a multi-process launch (their start-up check compares them). */
static void engine_options(const srv_config *c, k3c_engine_options *o) {
    k3c_engine_options_default(o);
    o->device = c->device;
    o->threads = c->threads;
    o->max_requests = c->max_seqs;
    o->max_rows = c->max_batched_tokens;
    o->max_context = c->max_context;
    o->memory_limit = c->memory_limit;
    o->num_blocks = c->kv_blocks;
    o->exact_f32 = c->exact_f32;
    if (c->spec + 1 > o->q_max) o->q_max = c->spec + 1;
    o->layout = c->layout;
    o->rank = c->rank;
    o->world_size = c->world_size;
    o->rendezvous = c->rendezvous;
    o->rank_timeout_ms = c->rank_timeout_ms;
}

int srv_follow(const srv_config *c, int (*load)(const srv_config *cfg, k3c_model **m)) {
    k3c_model *m = NULL;
    k3c_engine *e = NULL;
    k3c_engine_options o;
    engine_options(c, &o);
    int rc = load(c, &m) == K3C_OK && k3c_engine_create(m, &o, &e) == K3C_OK ? 0 : -1;
    if (rc == 0) {
        fprintf(stderr, "k3c serve: rank %d of %d: following rank 0's steps\n", k3c_engine_rank(e),
                k3c_engine_world_size(e));
        rc = k3c_engine_follow(e) == K3C_OK ? 0 : -1;
    }
    if (rc) fprintf(stderr, "k3c serve: rank %d: %s\n", c->rank, srv_error_message());
    k3c_engine_free(e);
    if (m) k3c_free(m);
    return rc;
}

int srv_engine_load(srv_server *s) {
    const srv_config *c = &s->cfg;
    if (s->load(c, &s->model) != K3C_OK) return -1;
    k3c_model_info info;
    if (k3c_model_info_get(s->model, &info) != K3C_OK) return -1;
    const char *preset = c->preset ? c->preset : "tiny";
    if (srv_text_create(c->model_dir, c->model_dir ? NULL : preset, info.family, &s->text) != K3C_OK) return -1;
    k3c_engine_options o;
    engine_options(c, &o);
    if (k3c_engine_create(s->model, &o, &s->engine) != K3C_OK) return -1;
    k3c_engine_memory mm;
    if (k3c_engine_memory_get(s->engine, &mm) != K3C_OK) return -1;
    s->max_context = mm.max_context;
    s->vocab = k3c_engine_vocab(s->engine);
    if (k3c_tokenizer_vocab(srv_text_tokenizer(s->text)) > s->vocab)
        return srv_errorf("the tokenizer has %d ids, more than the model's vocabulary %d",
                          k3c_tokenizer_vocab(srv_text_tokenizer(s->text)), s->vocab);
    /* every prepared step shape captured now, so no request pays a capture (a no-op on the cpu) */
    if (k3c_engine_warmup(s->engine) != K3C_OK) return -1;
    k3c_scheduler_options so;
    k3c_scheduler_options_default(&so);
    so.max_seqs = c->max_seqs;
    so.max_batched_tokens = c->max_batched_tokens;
    so.max_queue = c->max_queue;
    so.spec_tokens = c->spec;
    so.prefix_caching = c->prefix_caching;
    so.policy = c->priority_policy ? K3C_SCHED_PRIORITY : K3C_SCHED_FCFS;
    so.snapshot_bytes = c->snapshot_bytes;
    so.snapshot_interval = c->snapshot_interval;
    if (k3c_scheduler_create(s->engine, &so, &s->sched) != K3C_OK) return -1;
    snprintf(s->model_name, sizeof s->model_name, "%s",
             c->served_name ? c->served_name : c->model_dir ? base_name(c->model_dir) : preset);
    return 0;
}

static srv_finish finish_of(k3c_finish_reason f) {
    switch (f) {
    case K3C_FINISH_STOP: return SRV_FINISH_STOP;
    case K3C_FINISH_LENGTH: return SRV_FINISH_LENGTH;
    case K3C_FINISH_ABORT: return SRV_FINISH_ABORT;
    default: return SRV_FINISH_ERROR;
    }
}

/* One event: the choice's pipeline, then the bytes to the client. */
static void on_event(srv_server *s, const k3c_sched_event *ev, srv_buf *scratch) {
    srv_choice *c = ev->user;
    srv_req *r = c->req;
    scratch->len = 0;
    scratch->failed = 0;
    if (ev->kind == K3C_SCHED_TOKEN) {
        int rc = srv_choice_token(c, ev->token, ev->logprob, ev->n_top, ev->top_ids, ev->top_logprobs, scratch);
        /* settled by a stop string (the scheduler does not know it) or a stop token (it does: a no-op) */
        if (rc == 1) k3c_scheduler_abort(s->sched, ev->id);
        if (scratch->len || scratch->failed) srv_req_push(r, scratch->data, scratch->len, 0);
        return;
    }
    if (ev->finish == K3C_FINISH_ERROR)
        fprintf(stderr, "k3c serve: request %s failed: %s\n", r->id, ev->message ? ev->message : "(no message)");
    srv_choice_finished(c, finish_of(ev->finish), ev->cached_tokens, ev->completion_tokens, ev->queue_seconds, scratch);
    pthread_mutex_lock(&r->mu);
    int last = --r->n_open == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) {
        srv_req_finalize(r, scratch);
        if (r->p.stream) {
            srv_req_push(r, scratch->data, scratch->len, 1);
        } else {
            pthread_mutex_lock(&r->mu);
            r->body = srv_buf_take(scratch, &r->body_len);
            r->complete = 1;
            pthread_mutex_unlock(&r->mu);
            srv_req_wake(r);
        }
    } else if (scratch->len) {
        srv_req_push(r, scratch->data, scratch->len, 0);
    }
    srv_req_unref(r); /* the choice's reference: the scheduler is done with it */
}

static void *sched_main(void *arg) {
    srv_server *s = arg;
    srv_buf scratch = {0};
    int busy = 0;
    long steps = 0;
    k3c_scheduler_stats st;
    while (!atomic_load(&s->stop)) {
        /* submits and aborts wake the wait; the timeout bounds how long a stop request waits */
        if (!busy) k3c_scheduler_wait(s->sched, 100);
        const k3c_sched_event *ev = NULL;
        int n = 0;
        /* a failed step ends the requests it touched (FINISHED with ERROR among the events); the others go
         * on and the scheduler stays usable */
        int failed = k3c_scheduler_step(s->sched, &ev, &n, &busy) != K3C_OK;
        if (failed) fprintf(stderr, "k3c serve: a scheduler step failed: %s\n", k3c_last_error());
        for (int i = 0; i < n; i++) on_event(s, &ev[i], &scratch);
        /* a rank group that failed cannot run another step: the server ends, non-zero (server.c) */
        if (failed && k3c_engine_failed(s->engine) && !atomic_load(&s->fatal)) {
            snprintf(s->fatal_message, sizeof s->fatal_message, "%s", k3c_last_error());
            atomic_store(&s->fatal, 1);
            kill(getpid(), SIGTERM);
        }
        k3c_scheduler_stats_get(s->sched, &st);
        if (st.steps != steps) srv_metrics_iteration(&s->metrics, st.last_step_tokens);
        steps = st.steps;
    }
    srv_buf_free(&scratch);
    return NULL;
}

int srv_engine_start(srv_server *s) {
    if (pthread_create(&s->sched_thread, NULL, sched_main, s)) return srv_errorf("cannot start the scheduler thread");
    s->sched_started = 1;
    return 0;
}

void srv_engine_stop(srv_server *s) {
    if (!s->sched_started) return;
    atomic_store(&s->stop, 1);
    pthread_join(s->sched_thread, NULL);
    s->sched_started = 0;
}

void srv_engine_free(srv_server *s) {
    k3c_scheduler_free(s->sched);
    s->sched = NULL;
    k3c_engine_free(s->engine);
    s->engine = NULL;
    srv_text_free(s->text);
    s->text = NULL;
    if (s->model) k3c_free(s->model);
    s->model = NULL;
}

void srv_engine_gauges(srv_server *s, srv_sched_gauges *g) {
    k3c_scheduler_stats st;
    memset(g, 0, sizeof *g);
    if (!s->sched) return;
    k3c_scheduler_stats_get(s->sched, &st);
    g->running = st.running;
    g->waiting = st.waiting;
    g->preemptions = st.preemptions;
    g->prompt_tokens = st.prompt_tokens;
    g->generation_tokens = st.generation_tokens;
    g->prefill_tokens = st.prefill_tokens;
    g->prefix_queries = st.prefix_queries_tokens;
    g->prefix_hits = st.prefix_hits_tokens;
    g->blocks_total = st.blocks_total;
    g->blocks_used = st.blocks_used;
    g->kda_slots_total = st.kda_slots_total;
    g->kda_slots_used = st.kda_slots_used;
    g->snapshots = st.snapshots;
    g->snapshot_bytes = st.snapshot_bytes;
    g->spec_drafts = st.spec_drafts;
    g->spec_draft_tokens = st.spec_draft_tokens;
    g->spec_accepted_tokens = st.spec_accepted_tokens;
    g->steps = st.steps;
    g->executor_steps = st.executor_steps;
    for (int i = 0; i < 4; i++) g->route_steps[i] = st.route_steps[i];
    for (int i = 0; i < K3C_SCHED_SPEC_POS; i++) g->spec_accepted_by_pos[i] = st.spec_accepted_by_pos[i];
    g->block_size = st.block_size;
    g->prefix_grid = st.prefix_grid;
    g->prefix_caching = s->cfg.prefix_caching;
    g->spec_tokens = s->cfg.spec;
    g->max_seqs = st.kda_slots_total;
    g->max_batched_tokens = s->cfg.max_batched_tokens;
    g->snapshot_bytes_limit = st.snapshot_bytes_limit;
    g->snapshot_interval = st.snapshot_interval;
}
