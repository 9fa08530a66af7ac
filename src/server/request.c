/* A generation request's lifetime (references), its byte queue for the client, and waking its connection. */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

srv_req *srv_req_new(srv_server *s, srv_params *p) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (pthread_mutex_init(&r->mu, NULL)) {
        free(r);
        return NULL;
    }
    r->refs = 1;
    r->server = s;
    r->p = *p;
    memset(p, 0, sizeof *p);
    r->text = s->text;
    r->metrics = &s->metrics;
    r->model_name = s->model_name;
    r->created = (long)time(NULL);
    r->t_arrival = srv_now();
    r->t_last_write = r->t_arrival;
    unsigned long id = atomic_fetch_add(&s->next_id, 1);
    snprintf(r->id, sizeof r->id, "%s-%lx%08lx", r->p.kind == SRV_CHAT ? "chatcmpl" : "cmpl", (unsigned long)r->created,
             id);
    pthread_mutex_lock(&s->list_mu);
    r->next = s->live;
    if (s->live) s->live->prev = r;
    s->live = r;
    s->n_live++;
    pthread_mutex_unlock(&s->list_mu);
    return r;
}

void srv_req_ref(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

/* The last reference goes under list_mu, in one critical section with the unlink: the ticker and the
 * shutdown take references to live requests under list_mu, and must never find one whose count reached 0
 * (it would be freed twice). Lock order: list_mu, then a request's mu. */
void srv_req_unref(srv_req *r) {
    if (!r) return;
    srv_server *s = r->server;
    pthread_mutex_lock(&s->list_mu);
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (!left) {
        if (r->prev) r->prev->next = r->next;
        else s->live = r->next;
        if (r->next) r->next->prev = r->prev;
        s->n_live--;
    }
    pthread_mutex_unlock(&s->list_mu);
    if (left) return;
    for (int i = 0; i < r->n_choices; i++) srv_choice_free(&r->choices[i]);
    free(r->choices);
    for (int i = 0; i < r->n_prompts; i++) free(r->prompt_ids[i]);
    free(r->prompt_ids);
    free(r->prompt_len);
    free(r->stop_ids);
    k3c_grammar_free(r->grammar); /* after every choice's FINISHED: the scheduler holds it until then */
    srv_buf_free(&r->out);
    free(r->body);
    srv_params_free(&r->p);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The suspended flag is set under mu by the MHD thread in the same critical section as its
 * MHD_suspend_connection call, and cleared here under mu before the resume: so each suspend is resumed
 * exactly once, and never a connection that is not suspended (undefined in MHD). A suspended connection
 * cannot complete, so conn is valid until the resume. */
void srv_req_wake(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    struct MHD_Connection *conn = r->suspended ? r->conn : NULL;
    r->suspended = 0;
    pthread_mutex_unlock(&r->mu);
    if (conn) MHD_resume_connection(conn);
}

void srv_req_push(srv_req *r, const char *bytes, size_t n, int complete) {
    pthread_mutex_lock(&r->mu);
    if (!r->gone) srv_buf_put(&r->out, bytes, n);
    if (complete) r->complete = 1;
    pthread_mutex_unlock(&r->mu);
    srv_req_wake(r);
}

void srv_req_abandon(srv_req *r) {
    srv_server *s = r->server;
    pthread_mutex_lock(&r->mu);
    int was = r->gone;
    r->gone = 1;
    pthread_mutex_unlock(&r->mu);
    if (was || !s->sched) return;
    /* the ids were set before the connection could complete, by the thread that submitted them; abort of a
     * finished id is a no-op */
    for (int i = 0; i < r->n_choices; i++)
        if (r->choices[i].submitted) k3c_scheduler_abort(s->sched, r->choices[i].sched_id);
}
