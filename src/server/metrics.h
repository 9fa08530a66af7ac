/* /metrics: Prometheus text exposition with vLLM's metric names and meanings under a k3c: prefix (so that
 * dashboards and autoscalers built for vLLM read it), plus the KDA state slots, the prefix cache's KDA
 * snapshots and the engine's steps per route. Latency histograms are observed here, by the server, from
 * the times tokens reach it; counters and gauges of the scheduler are read from its stats when rendered. */
#ifndef K3C_SERVER_METRICS_H
#define K3C_SERVER_METRICS_H

#include <pthread.h>

#include "k3c.h"
#include "server/buf.h"

#define SRV_HIST_MAX_BUCKETS 24

typedef struct srv_hist {
    const double *bounds; /* upper bounds, increasing; +Inf implied */
    int n;
    unsigned long counts[SRV_HIST_MAX_BUCKETS + 1]; /* per bucket (not cumulative); [n] = above the last */
    double sum;
    unsigned long count;
} srv_hist;

typedef enum srv_finish {
    SRV_FINISH_STOP = 0, SRV_FINISH_LENGTH, SRV_FINISH_ABORT, SRV_FINISH_ERROR, SRV_FINISH_TOOL_CALLS, SRV_FINISH_N
} srv_finish;
/* OpenAI's finish_reason strings ("stop", "length", "abort", "error", "tool_calls") */
const char *srv_finish_name(srv_finish f);

/* What the scheduler reports (k3c_scheduler_stats, copied by the scheduler thread's owner at render time),
 * and the configuration cache_config_info shows. */
typedef struct srv_sched_gauges {
    int running, waiting;
    long preemptions, prompt_tokens, generation_tokens;
    long prefill_tokens; /* prompt rows computed (cached ones not, recomputed ones again) */
    long prefix_queries, prefix_hits;
    int blocks_total, blocks_used, kda_slots_total, kda_slots_used;
    long snapshots, snapshot_bytes;
    long spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    long spec_accepted_by_pos[K3C_SCHED_SPEC_POS];
    long steps, executor_steps, route_steps[4];
    /* configuration */
    int block_size, prefix_grid, prefix_caching, spec_tokens, max_seqs, max_batched_tokens;
    long snapshot_bytes_limit;
    int snapshot_interval;
} srv_sched_gauges;

/* One finished choice: its finish reason, e2e, and vLLM's phases (seconds; < 0 where the choice produced no
 * token): queue (arrival to first admission), prefill (admission to first token), decode (first to last
 * token), inference (admission to last token), time per output token (decode / (tokens - 1), >= 2 tokens). */
typedef struct srv_finish_times {
    double e2e, queue, prefill, decode, inference, tpot;
} srv_finish_times;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    srv_hist ttft, itl, e2e, prompt_len, gen_len;
    srv_hist tpot, queue, prefill, decode, inference; /* vLLM's request phase histograms */
    srv_hist params_n, params_max_tokens, iteration_tokens;
    unsigned long finished[SRV_FINISH_N];
    unsigned long rejected_queue_full, rejected_invalid;
    unsigned long http_requests;
} srv_metrics;

int srv_metrics_init(srv_metrics *m);
void srv_metrics_free(srv_metrics *m);
void srv_hist_observe(srv_hist *h, double v); /* caller holds m->mu */
void srv_metrics_finished(srv_metrics *m, srv_finish f, const srv_finish_times *t, int prompt_tokens, int gen_tokens);
/* A generation request accepted: its n and max_tokens (the limit it runs under). */
void srv_metrics_request(srv_metrics *m, int n, long max_tokens);
/* One engine step of `tokens` tokens. */
void srv_metrics_iteration(srv_metrics *m, int tokens);
void srv_metrics_token_times(srv_metrics *m, double ttft_s, const double *itl_s, int n_itl);
void srv_metrics_count(srv_metrics *m, unsigned long *counter);
/* The exposition text for model `model_name`. */
void srv_metrics_render(srv_metrics *m, const srv_sched_gauges *g, const char *model_name, srv_buf *out);

#endif
