/* srv_run: listen first (so /health answers 503 while the model loads), load, serve, and on SIGTERM or
 * SIGINT drain: stop accepting, give running requests the grace period, abort what is left, exit 0. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

static char srv_message[1024];

int srv_errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(srv_message, sizeof srv_message, fmt, ap);
    va_end(ap);
    return -1;
}

const char *srv_error_message(void) { return srv_message[0] ? srv_message : k3c_last_error(); }

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int live_count(srv_server *s) {
    pthread_mutex_lock(&s->list_mu);
    int n = s->n_live;
    pthread_mutex_unlock(&s->list_mu);
    return n;
}

static int wait_idle(srv_server *s, double seconds) {
    double end = srv_now() + seconds;
    while (live_count(s) > 0 && srv_now() < end) sleep_s(0.02);
    return live_count(s);
}

/* Aborts every choice still in the scheduler; their clients get an error (a stream: an error event). */
static void abort_all(srv_server *s) {
    pthread_mutex_lock(&s->list_mu);
    for (srv_req *r = s->live; r; r = r->next)
        for (int i = 0; i < r->n_choices; i++)
            if (r->choices[i].submitted) k3c_scheduler_abort(s->sched, r->choices[i].sched_id);
    pthread_mutex_unlock(&s->list_mu);
}

static int write_port_file(const char *path, int port) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return srv_errorf("--port-file: cannot write %s", tmp);
    int bad = fprintf(f, "%d\n", port) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        remove(tmp);
        return srv_errorf("--port-file: cannot write %s", path);
    }
    return 0;
}

int srv_run(const srv_config *cfg, int (*load)(const srv_config *cfg, k3c_model **m)) {
    srv_server *s = calloc(1, sizeof *s);
    if (!s) return srv_errorf("out of memory");
    s->cfg = *cfg;
    s->load = load;
    pthread_mutex_init(&s->list_mu, NULL);
    int rc = -1;
    if (srv_metrics_init(&s->metrics)) goto done;
    /* SIGTERM / SIGINT are taken by sigwait below: blocked here, before any thread starts, so every thread
     * inherits the mask and none of them runs a handler. A write to a closed socket fails instead of
     * killing the process. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (srv_http_start(s)) goto done;
    fprintf(stderr, "k3c serve: listening on http://%s:%d (loading the model)\n", cfg->host, s->port);
    if (cfg->port_file && write_port_file(cfg->port_file, s->port)) goto done;
    if (srv_ticker_start(s)) goto done;
    if (srv_engine_load(s) || srv_engine_start(s)) goto done;
    atomic_store(&s->ready, 1);
    fprintf(stderr, "k3c serve: ready: model %s on %s, context %d, %d running at once, queue %d\n", s->model_name,
            cfg->device, s->max_context, cfg->max_seqs, cfg->max_queue);
    k3c_scheduler_stats st;
    k3c_scheduler_stats_get(s->sched, &st);
    if (cfg->prefix_caching)
        fprintf(stderr, "k3c serve: prefix caching: hits on multiples of %d tokens; KDA snapshots of %.1f KiB, %d of "
                "them in %.1f MiB (--snapshot-memory)\n", st.prefix_grid, st.snapshot_bytes_each / 1024.0,
                st.snapshots_max, st.snapshot_bytes_limit / 1048576.0);
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {}
    if (atomic_load(&s->fatal)) { /* the engine can run no step: what is still queued gets an error */
        atomic_store(&s->draining, 1);
        srv_http_quiesce(s);
        abort_all(s);
        wait_idle(s, 2.0);
        srv_errorf("the engine failed: %s", s->fatal_message);
        goto done;
    }
    fprintf(stderr, "k3c serve: %s: draining (%.1f s grace)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg->grace_s);
    atomic_store(&s->draining, 1);
    srv_http_quiesce(s);
    if (wait_idle(s, cfg->grace_s)) {
        fprintf(stderr, "k3c serve: aborting %d request(s) still running\n", live_count(s));
        abort_all(s);
        wait_idle(s, 2.0);
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "k3c serve: %s\n", srv_error_message());
    srv_engine_stop(s);
    srv_ticker_stop(s);
    srv_http_stop(s);
    srv_engine_free(s);
    srv_metrics_free(&s->metrics);
    pthread_mutex_destroy(&s->list_mu);
    free(s);
    return rc;
}
