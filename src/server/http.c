/* HTTP over libmicrohttpd: one internal epoll thread, connections suspended while they wait for the
 * scheduler and resumed from the scheduler thread (MHD_resume_connection is safe from any thread).
 *
 * A request body is read into memory up to --max-body bytes: a Content-Length past it is answered 413
 * before a byte of the body is read, a chunked body that grows past it is answered 413 (or, where MHD
 * cannot queue a response mid-body, the connection is closed) and the rest is never stored.
 *
 * Streams: a response from a content reader of unknown size (chunked encoding). The reader sends what the
 * request's byte queue holds; when it is empty it suspends the connection (returning 0 without suspending
 * would make MHD poll it in a busy loop) and whoever appends next resumes it. Non-streaming requests
 * suspend in the access handler and are resumed once their body is complete. MHD's completion callback
 * (NOTIFY_COMPLETED) aborts whatever the request still has in the scheduler: the client left, timed out or
 * was cut off. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/server.h"

typedef struct srv_conn {
    srv_server *s;
    srv_buf body;
    int answered;   /* a response is queued: further upload data is dropped */
    srv_req *req;   /* a generation request (one reference) */
} srv_conn;

static enum MHD_Result answer(struct MHD_Connection *conn, srv_conn *c, srv_route_result *rr) {
    c->answered = 1;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(rr->body_len, rr->body ? rr->body : (char *)"", rr->body ? MHD_RESPMEM_MUST_FREE
                                                                                                    : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(rr->body);
        return MHD_NO;
    }
    rr->body = NULL;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, rr->content_type ? rr->content_type : "application/json");
    if (rr->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", rr->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)rr->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result answer_error(struct MHD_Connection *conn, srv_conn *c, int status, const char *code,
                                    const char *fmt, const char *arg) {
    srv_error e;
    srv_fail(&e, status, NULL, code, NULL, fmt, arg);
    srv_route_result rr = {0};
    srv_route_error(&rr, &e);
    return answer(conn, c, &rr);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_req *r = cls;
    pthread_mutex_lock(&r->mu);
    if (r->out.len) {
        size_t n = r->out.len < max ? r->out.len : max;
        memcpy(buf, r->out.data, n);
        srv_buf_consume(&r->out, n);
        r->t_last_write = srv_now();
        pthread_mutex_unlock(&r->mu);
        return (ssize_t)n;
    }
    if (r->gone) {
        pthread_mutex_unlock(&r->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (r->complete) {
        pthread_mutex_unlock(&r->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    r->suspended = 1;
    MHD_suspend_connection(r->conn);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static void stream_free(void *cls) { srv_req_unref(cls); }

/* The request's response once it is complete: its body (non-streaming), under r->mu. */
static enum MHD_Result send_body(struct MHD_Connection *conn, srv_conn *c, srv_req *r) {
    srv_route_result rr = {.status = r->status ? r->status : 500, .body = r->body, .body_len = r->body_len};
    r->body = NULL;
    if (!rr.body) {
        srv_error e;
        srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory building the response");
        srv_route_error(&rr, &e);
    }
    return answer(conn, c, &rr);
}

static enum MHD_Result start_generation(struct MHD_Connection *conn, srv_conn *c, srv_req *r) {
    c->req = r;
    pthread_mutex_lock(&r->mu);
    r->conn = conn;
    if (r->p.stream) {
        pthread_mutex_unlock(&r->mu);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, r, stream_free);
        if (!resp) return MHD_NO;
        srv_req_ref(r); /* the response's */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        c->answered = 1;
        enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    enum MHD_Result ok = MHD_YES;
    if (r->complete) {
        ok = send_body(conn, c, r);
    } else {
        r->suspended = 1;
        MHD_suspend_connection(conn);
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv_server *s = cls;
    srv_conn *c = *con_cls;
    if (!c) {
        /* the headers: refuse what needs no body to refuse */
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        c->s = s;
        *con_cls = c;
        srv_route_result rr = {0};
        if (srv_route_check(method, url, &rr) ||
            srv_route_auth(s, url, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION), &rr))
            return answer(conn, c, &rr);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) {
            char lim[32];
            snprintf(lim, sizeof lim, "%zu", s->cfg.max_body);
            return answer_error(conn, c, 413, "request_too_large", "The request body is larger than %s bytes.", lim);
        }
        return MHD_YES;
    }
    if (c->answered && !c->req) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (c->body.len + *upload_size > s->cfg.max_body) {
            *upload_size = 0;
            char lim[32];
            snprintf(lim, sizeof lim, "%zu", s->cfg.max_body);
            return answer_error(conn, c, 413, "request_too_large", "The request body is larger than %s bytes.", lim);
        }
        srv_buf_put(&c->body, upload, *upload_size);
        *upload_size = 0;
        return c->body.failed ? MHD_NO : MHD_YES;
    }
    if (c->req) {
        /* resumed: the body is ready, or the client left */
        srv_req *r = c->req;
        pthread_mutex_lock(&r->mu);
        enum MHD_Result ok = MHD_YES;
        if (r->gone) ok = MHD_NO;
        else if (r->complete) ok = send_body(conn, c, r);
        else r->suspended = 1, MHD_suspend_connection(conn);
        pthread_mutex_unlock(&r->mu);
        return ok;
    }
    srv_route_result rr = {0};
    srv_route(s, method, url, c->body.data ? c->body.data : "", c->body.len, &rr);
    srv_buf_free(&c->body);
    if (rr.req) return start_generation(conn, c, rr.req);
    return answer(conn, c, &rr);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_conn *c = *con_cls;
    if (!c) return;
    srv_req *r = c->req;
    if (r) {
        pthread_mutex_lock(&r->mu);
        r->conn = NULL;
        r->suspended = 0;
        int done = r->complete && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
        pthread_mutex_unlock(&r->mu);
        if (!done) srv_req_abandon(r);
        srv_req_unref(r);
    }
    srv_buf_free(&c->body);
    free(c);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    fprintf(stderr, "k3c serve: http: ");
    vfprintf(stderr, fmt, ap);
}

int srv_http_start(srv_server *s) {
    union {
        struct sockaddr sa;
        struct sockaddr_in v4;
        struct sockaddr_in6 v6;
    } addr;
    memset(&addr, 0, sizeof addr);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, s->cfg.host, &addr.v4.sin_addr) == 1) {
        addr.v4.sin_family = AF_INET;
        addr.v4.sin_port = htons((uint16_t)s->cfg.port);
    } else if (inet_pton(AF_INET6, s->cfg.host, &addr.v6.sin6_addr) == 1) {
        addr.v6.sin6_family = AF_INET6;
        addr.v6.sin6_port = htons((uint16_t)s->cfg.port);
        flags |= MHD_USE_IPv6;
    } else {
        return srv_errorf("--host: '%s' is not an IPv4 or IPv6 address", s->cfg.host);
    }
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->cfg.port, NULL, NULL, on_access, s,
                              /* first, so that MHD's messages about the options go through it too */
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                              MHD_OPTION_SOCK_ADDR, &addr.sa,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
                              /* idle keep-alive and slow clients; suspended connections do not time out */
                              MHD_OPTION_CONNECTION_TIMEOUT, 60u,
                              MHD_OPTION_END);
    if (!s->mhd)
        return srv_errorf("cannot listen on %s port %d (in use, or not an address of this host)", s->cfg.host, s->cfg.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->cfg.port;
    return 0;
}

void srv_http_quiesce(srv_server *s) {
    if (!s->mhd) return;
    MHD_socket fd = MHD_quiesce_daemon(s->mhd);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void srv_http_stop(srv_server *s) {
    if (!s->mhd) return;
    /* MHD must not be stopped with suspended connections: every live request is marked gone and resumed
     * (a resumed stream ends, a resumed wait closes its connection) */
    pthread_mutex_lock(&s->list_mu);
    int n = 0, cap = s->n_live;
    srv_req **wake = cap ? malloc(sizeof *wake * (size_t)cap) : NULL;
    for (srv_req *r = s->live; r && wake && n < cap; r = r->next) {
        srv_req_ref(r);
        wake[n++] = r;
    }
    pthread_mutex_unlock(&s->list_mu);
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&wake[i]->mu);
        wake[i]->gone = 1;
        pthread_mutex_unlock(&wake[i]->mu);
        srv_req_wake(wake[i]);
    }
    for (int i = 0; i < n; i++) srv_req_unref(wake[i]);
    free(wake);
    MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}
