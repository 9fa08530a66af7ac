/* Heartbeats and clients that left. MHD does not see a client leave while its connection is suspended,
 * and a request that waits in the queue or prefills a long prompt writes nothing for a while. Every 200 ms
 * the ticker
 *   - peeks at the socket of every suspended connection (MSG_PEEK, so MHD's input is untouched): end of
 *     file or an error means the client is gone, and its request is aborted at once;
 *   - writes ": ping" (an SSE comment, which clients ignore) into every stream that has had nothing to
 *     send for 500 ms, so a dead peer also shows up as a failed write within about a second.
 * A suspended connection cannot complete, so its socket stays open while the ticker looks at it (the
 * request's mutex is held from the check of `suspended` to the end of the peek). */
#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "server/server.h"

#define TICK_NS 200000000L
#define PING_AFTER_S 0.5

static int peer_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void tick(srv_server *s) {
    pthread_mutex_lock(&s->list_mu);
    int n = 0, cap = s->n_live;
    srv_req **reqs = cap ? malloc(sizeof *reqs * (size_t)cap) : NULL;
    for (srv_req *r = s->live; r && reqs && n < cap; r = r->next) {
        srv_req_ref(r);
        reqs[n++] = r;
    }
    pthread_mutex_unlock(&s->list_mu);
    double now = srv_now();
    for (int i = 0; i < n; i++) {
        srv_req *r = reqs[i];
        pthread_mutex_lock(&r->mu);
        int gone = 0, ping = 0;
        if (r->suspended && r->conn && !r->gone && !r->complete) {
            gone = peer_gone(r->conn);
            ping = !gone && r->p.stream && now - r->t_last_write >= PING_AFTER_S;
            if (ping) {
                srv_buf_puts(&r->out, ": ping\n\n");
                r->t_last_write = now;
            }
        }
        pthread_mutex_unlock(&r->mu);
        if (gone) srv_req_abandon(r);
        if (gone || ping) srv_req_wake(r);
        srv_req_unref(r);
    }
    free(reqs);
}

static void *ticker_main(void *arg) {
    srv_server *s = arg;
    while (!atomic_load(&s->ticker_stop)) {
        struct timespec ts = {0, TICK_NS};
        nanosleep(&ts, NULL);
        tick(s);
    }
    return NULL;
}

int srv_ticker_start(srv_server *s) {
    if (pthread_create(&s->ticker, NULL, ticker_main, s)) return srv_errorf("cannot start the ticker thread");
    s->ticker_started = 1;
    return 0;
}

void srv_ticker_stop(srv_server *s) {
    if (!s->ticker_started) return;
    atomic_store(&s->ticker_stop, 1);
    pthread_join(s->ticker, NULL);
    s->ticker_started = 0;
}
