/* k3c serve: an OpenAI-compatible HTTP server over the serving scheduler.
 *
 * Threads:
 *   - MHD's internal epoll thread: every connection's I/O, the routes, request parsing and tokenizing,
 *     submitting to the scheduler (routes.c, http.c);
 *   - the scheduler thread: k3c_scheduler_step in a loop, each event through its choice's text pipeline into
 *     the request's byte queue, then the connection resumed (engine.c, output.c);
 *   - the ticker: every 200 ms a ": ping" heartbeat into streams that waited 500 ms for a byte, and a look
 *     at the socket of every suspended connection, so a client that left while its request waited or
 *     prefilled is noticed and its request aborted within a second (ticker.c);
 *   - the main thread: loads the model (while /health answers 503), then waits for SIGTERM / SIGINT and
 *     drains (server.c).
 * Front end: include/k3c.h only. */
#ifndef K3C_SERVER_SERVER_H
#define K3C_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "k3c.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/text.h"

typedef struct srv_config {
    const char *model_dir;   /* NULL: `preset` (or the default the loader picks) */
    const char *preset;      /* without model_dir: a preset (synthesized; a config-only one on the device) */
    const char *served_name; /* the model's name in the API; NULL: the directory's last part, or "tiny" */
    const char *host;        /* "127.0.0.1" */
    int port;                /* 8000; 0 = any free port (printed) */
    const char *device;      /* "cpu" | "cuda" */
    int threads;             /* cpu engine threads, 0 = one per core */
    const char *api_key;     /* NULL: none required */
    int max_seqs;            /* requests running at once (the engine's KDA slots) */
    int max_batched_tokens;  /* tokens per step */
    int max_queue;           /* waiting requests before 429 */
    int max_context;         /* tokens one request may hold; 0 = the engine's default */
    size_t memory_limit;     /* bytes the caches may take; 0 = what the device has free */
    int kv_blocks;           /* MLA cache blocks; 0 = enough for max_seqs full contexts */
    int spec;                /* prompt-lookup drafts per verify; 0 = off */
    int prefix_caching;      /* 1 = on */
    int priority_policy;     /* 1: the scheduler serves by request priority (lower first), else FCFS */
    size_t snapshot_bytes;   /* KDA snapshot memory of the prefix cache; 0 = the scheduler's default (256 MiB) */
    int snapshot_interval;   /* a snapshot kept every this many prefix grids of a prompt; 0 = 1 */
    int exact_f32;           /* diagnostic: the engine's exact_f32 (activations kept in f32) */
    size_t max_body;         /* request bodies past this are refused (413) before they are read whole */
    double grace_s;          /* SIGTERM: running requests get this long to finish, then they are aborted */
    int max_connections;
    const char *port_file;   /* where the bound port is written once listening (tests); NULL: none */
    /* parallel ranks (k3c_engine_options.layout, rank, world_size, rendezvous, rank_timeout_ms) */
    k3c_layout layout;
    int rank, world_size;
    const char *rendezvous;
    int rank_timeout_ms;
} srv_config;

typedef struct srv_server {
    srv_config cfg;
    int (*load)(const struct srv_config *cfg, k3c_model **m);
    struct MHD_Daemon *mhd;
    int port;                /* bound */
    /* the model, once loaded (ready = 1 afterwards; nothing below changes after that) */
    k3c_model *model;
    k3c_engine *engine;
    k3c_scheduler *sched;
    srv_text *text;
    int vocab, max_context;
    char model_name[256];
    atomic_int ready;        /* /health 200 and generation accepted */
    atomic_int draining;     /* SIGTERM: new requests get 503 */
    atomic_ulong next_id;
    srv_metrics metrics;
    /* the scheduler thread */
    pthread_t sched_thread;
    int sched_started;
    atomic_int stop;
    atomic_int fatal;        /* the engine's rank group failed: the server exits non-zero (fatal_message) */
    char fatal_message[2048];
    /* the live requests (the ticker walks them) */
    pthread_mutex_t list_mu;
    srv_req *live;
    int n_live;
    pthread_t ticker;
    int ticker_started;
    atomic_int ticker_stop;
} srv_server;

/* Runs the server until SIGTERM / SIGINT; 0 after a clean drain, -1 with a message (k3c_last_error or the
 * server's own, through srv_error_message). load(cfg, &m) loads the model cfg names (model_dir, or preset,
 * or a default; on failure it leaves a message through srv_errorf or k3c_last_error). */
int srv_run(const srv_config *cfg, int (*load)(const srv_config *cfg, k3c_model **m));
const char *srv_error_message(void);
int srv_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* http.c */
int srv_http_start(srv_server *s);
void srv_http_stop(srv_server *s);
/* Stops accepting connections (the listening socket is closed); those already open are served. */
void srv_http_quiesce(srv_server *s);

/* request.c */
srv_req *srv_req_new(srv_server *s, srv_params *p); /* takes p (zeroed on return); refs = 1 */
void srv_req_ref(srv_req *r);
void srv_req_unref(srv_req *r);
/* Appends bytes for the client (under mu) and resumes the connection if it waits. */
void srv_req_push(srv_req *r, const char *bytes, size_t n, int complete);
/* Resumes the connection if it is suspended (after out / body / complete changed). */
void srv_req_wake(srv_req *r);
/* The client left: abort every choice still in the scheduler (any thread). */
void srv_req_abandon(srv_req *r);

/* engine.c: the model and the scheduler thread */
int srv_engine_load(srv_server *s);
/* A rank other than 0 of a multi-process launch (cfg->rank > 0): loads the model, makes its engine with the
 * options rank 0's server uses, and follows rank 0's steps until rank 0 ends; no HTTP. 0 or -1. */
int srv_follow(const srv_config *cfg, int (*load)(const srv_config *cfg, k3c_model **m));
int srv_engine_start(srv_server *s);
void srv_engine_stop(srv_server *s);
void srv_engine_free(srv_server *s);
void srv_engine_gauges(srv_server *s, srv_sched_gauges *g);

/* routes.c: a complete request (method, path, body) -> a response, or a request handed to the scheduler.
 * Returns the status and fills *body (malloc'd JSON or text) and *content_type, or returns 0 with *req set
 * (a generation request queued: the caller streams or waits for it). */
typedef struct srv_route_result {
    int status;
    char *body;
    size_t body_len;
    const char *content_type;
    srv_req *req;            /* generation: queued, one reference for the connection */
    int retry_after;         /* 429 / 503: seconds for Retry-After */
} srv_route_result;
/* Which handler a path has, and whether the method fits: 0 known, 404 / 405 otherwise (error body). */
int srv_route_check(const char *method, const char *url, srv_route_result *out);
void srv_route(srv_server *s, const char *method, const char *url, const char *body, size_t len,
               srv_route_result *out);
/* An error response (JSON body) into out. */
void srv_route_error(srv_route_result *out, const srv_error *e);
/* The Authorization header against --api-key: 0 ok, 401 with the body filled. */
int srv_route_auth(const srv_server *s, const char *url, const char *authorization, srv_route_result *out);

/* ticker.c */
int srv_ticker_start(srv_server *s);
void srv_ticker_stop(srv_server *s);

#endif
