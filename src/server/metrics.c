#include "server/metrics.h"

#include <string.h>

/* vLLM's buckets (vllm/v1/metrics/loggers.py), so that its dashboards' quantile queries mean the same here */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                     1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4,  0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double len_bounds[] = {1,    2,    5,    10,    20,    50,    100,    200,    500,    1000,
                                    2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000, 1000000};
static const double n_bounds[] = {1, 2, 5, 10, 20};
static const double step_bounds[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

#define NB(a) ((int)(sizeof a / sizeof a[0]))

const char *srv_finish_name(srv_finish f) {
    static const char *const names[] = {"stop", "length", "abort", "error", "tool_calls"};
    return f >= 0 && f < SRV_FINISH_N ? names[f] : "error";
}

int srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    if (pthread_mutex_init(&m->mu, NULL)) return -1;
    m->ttft = (srv_hist){.bounds = ttft_bounds, .n = NB(ttft_bounds)};
    m->itl = (srv_hist){.bounds = itl_bounds, .n = NB(itl_bounds)};
    m->e2e = (srv_hist){.bounds = e2e_bounds, .n = NB(e2e_bounds)};
    m->prompt_len = (srv_hist){.bounds = len_bounds, .n = NB(len_bounds)};
    m->gen_len = (srv_hist){.bounds = len_bounds, .n = NB(len_bounds)};
    m->tpot = (srv_hist){.bounds = itl_bounds, .n = NB(itl_bounds)};
    m->queue = (srv_hist){.bounds = e2e_bounds, .n = NB(e2e_bounds)};
    m->prefill = (srv_hist){.bounds = e2e_bounds, .n = NB(e2e_bounds)};
    m->decode = (srv_hist){.bounds = e2e_bounds, .n = NB(e2e_bounds)};
    m->inference = (srv_hist){.bounds = e2e_bounds, .n = NB(e2e_bounds)};
    m->params_n = (srv_hist){.bounds = n_bounds, .n = NB(n_bounds)};
    m->params_max_tokens = (srv_hist){.bounds = len_bounds, .n = NB(len_bounds)};
    m->iteration_tokens = (srv_hist){.bounds = step_bounds, .n = NB(step_bounds)};
    return 0;
}

void srv_metrics_free(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void srv_hist_observe(srv_hist *h, double v) {
    int i = 0;
    while (i < h->n && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void srv_metrics_finished(srv_metrics *m, srv_finish f, const srv_finish_times *t, int prompt_tokens, int gen_tokens) {
    pthread_mutex_lock(&m->mu);
    /* vLLM's finished_reason is the engine's (stop, length, abort, error): a request that ended in tool calls
     * stopped */
    m->finished[f == SRV_FINISH_TOOL_CALLS ? SRV_FINISH_STOP : f < 0 || f >= SRV_FINISH_N ? SRV_FINISH_ERROR : f]++;
    srv_hist_observe(&m->e2e, t->e2e);
    srv_hist_observe(&m->prompt_len, prompt_tokens);
    srv_hist_observe(&m->gen_len, gen_tokens);
    if (t->queue >= 0) srv_hist_observe(&m->queue, t->queue);
    if (t->prefill >= 0) srv_hist_observe(&m->prefill, t->prefill);
    if (t->decode >= 0) srv_hist_observe(&m->decode, t->decode);
    if (t->inference >= 0) srv_hist_observe(&m->inference, t->inference);
    if (t->tpot >= 0) srv_hist_observe(&m->tpot, t->tpot);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_request(srv_metrics *m, int n, long max_tokens) {
    pthread_mutex_lock(&m->mu);
    srv_hist_observe(&m->params_n, n);
    srv_hist_observe(&m->params_max_tokens, (double)max_tokens);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_iteration(srv_metrics *m, int tokens) {
    pthread_mutex_lock(&m->mu);
    srv_hist_observe(&m->iteration_tokens, tokens);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_token_times(srv_metrics *m, double ttft_s, const double *itl_s, int n_itl) {
    pthread_mutex_lock(&m->mu);
    if (ttft_s >= 0) srv_hist_observe(&m->ttft, ttft_s);
    for (int i = 0; i < n_itl; i++) srv_hist_observe(&m->itl, itl_s[i]);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_count(srv_metrics *m, unsigned long *counter) {
    pthread_mutex_lock(&m->mu);
    (*counter)++;
    pthread_mutex_unlock(&m->mu);
}

/* ---- exposition ---- */

static void head(srv_buf *o, const char *name, const char *type, const char *help) {
    srv_buf_printf(o, "# HELP k3c:%s %s\n# TYPE k3c:%s %s\n", name, help, name, type);
}

static void gauge(srv_buf *o, const char *lab, const char *name, const char *help, double v) {
    head(o, name, "gauge", help);
    srv_buf_printf(o, "k3c:%s{%s} %.17g\n", name, lab, v);
}

/* Counters: TYPE names the family without _total, the sample carries it (what prometheus_client writes). */
static void counter(srv_buf *o, const char *lab, const char *name, const char *help, double v) {
    head(o, name, "counter", help);
    srv_buf_printf(o, "k3c:%s_total{%s} %.17g\n", name, lab, v);
}

static void hist(srv_buf *o, const char *lab, const char *name, const char *help, const srv_hist *h) {
    head(o, name, "histogram", help);
    unsigned long cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        srv_buf_printf(o, "k3c:%s_bucket{%s,le=\"%g\"} %lu\n", name, lab, h->bounds[i], cum);
    }
    cum += h->counts[h->n];
    srv_buf_printf(o, "k3c:%s_bucket{%s,le=\"+Inf\"} %lu\n", name, lab, cum);
    srv_buf_printf(o, "k3c:%s_sum{%s} %.17g\nk3c:%s_count{%s} %lu\n", name, lab, h->sum, name, lab, h->count);
}

static void label_value(srv_buf *o, const char *s) {
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') srv_buf_put(o, "\\", 1), srv_buf_put(o, s, 1);
        else if (*s == '\n') srv_buf_puts(o, "\\n");
        else srv_buf_put(o, s, 1);
    }
}

void srv_metrics_render(srv_metrics *m, const srv_sched_gauges *g, const char *model_name, srv_buf *o) {
    srv_buf lb = {0};
    srv_buf_puts(&lb, "model_name=\"");
    label_value(&lb, model_name);
    srv_buf_puts(&lb, "\",engine=\"0\""); /* vLLM's labels; k3c serves one engine */
    const char *lab = lb.failed ? "" : lb.data;

    head(o, "cache_config_info", "gauge", "Information of the LLMEngine CacheConfig (labels; the value is 1).");
    srv_buf_printf(o, "k3c:cache_config_info{%s,block_size=\"%d\",num_gpu_blocks=\"%d\",enable_prefix_caching=\"%s\","
                   "prefix_grid=\"%d\",kda_slots=\"%d\",kda_snapshot_bytes_limit=\"%ld\",kda_snapshot_interval=\"%d\","
                   "max_num_seqs=\"%d\",max_num_batched_tokens=\"%d\",num_speculative_tokens=\"%d\"} 1\n",
                   lab, g->block_size, g->blocks_total, g->prefix_caching ? "True" : "False", g->prefix_grid,
                   g->kda_slots_total, g->snapshot_bytes_limit, g->snapshot_interval, g->max_seqs, g->max_batched_tokens,
                   g->spec_tokens);
    gauge(o, lab, "num_requests_running", "Number of requests in model execution batches.", g->running);
    gauge(o, lab, "num_requests_waiting", "Number of requests waiting to be processed.", g->waiting);
    gauge(o, lab, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage (MLA blocks in use).",
          g->blocks_total ? (double)g->blocks_used / g->blocks_total : 0);
    gauge(o, lab, "kv_cache_blocks_used", "MLA cache blocks held by requests.", g->blocks_used);
    gauge(o, lab, "kv_cache_blocks_total", "MLA cache blocks.", g->blocks_total);
    gauge(o, lab, "kda_slot_usage_perc", "KDA state slots in use. 1 means 100 percent usage.",
          g->kda_slots_total ? (double)g->kda_slots_used / g->kda_slots_total : 0);
    gauge(o, lab, "kda_slots_used", "KDA state slots held by requests.", g->kda_slots_used);
    gauge(o, lab, "kda_snapshots", "KDA state snapshots kept by the prefix cache.", (double)g->snapshots);
    gauge(o, lab, "kda_snapshot_bytes", "Bytes of the KDA state snapshots kept by the prefix cache.",
          (double)g->snapshot_bytes);
    counter(o, lab, "num_preemptions", "Cumulative number of preemptions from the engine.", (double)g->preemptions);
    counter(o, lab, "prompt_tokens", "Number of prefill tokens processed.", (double)g->prompt_tokens);
    counter(o, lab, "generation_tokens", "Number of generation tokens processed.", (double)g->generation_tokens);
    counter(o, lab, "prompt_tokens_computed",
            "Prompt tokens the engine computed: prefix-cache hits not included, recomputes after a preemption "
            "included.", (double)g->prefill_tokens);
    counter(o, lab, "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
            (double)g->prefix_queries);
    counter(o, lab, "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            (double)g->prefix_hits);
    counter(o, lab, "spec_decode_num_drafts", "Number of spec decoding drafts.", (double)g->spec_drafts);
    counter(o, lab, "spec_decode_num_draft_tokens", "Number of draft tokens.", (double)g->spec_draft_tokens);
    counter(o, lab, "spec_decode_num_accepted_tokens", "Number of accepted tokens.", (double)g->spec_accepted_tokens);
    head(o, "spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted tokens per draft position.");
    for (int i = 0; i < g->spec_tokens && i < K3C_SCHED_SPEC_POS; i++)
        srv_buf_printf(o, "k3c:spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} %ld\n", lab, i,
                       g->spec_accepted_by_pos[i]);
    static const char *const routes[] = {"stock", "decode", "verify", "wide"};
    head(o, "engine_steps", "counter", "Engine steps by the route the plan chose.");
    for (int r = 0; r < 4; r++) srv_buf_printf(o, "k3c:engine_steps_total{%s,route=\"%s\"} %ld\n", lab, routes[r], g->route_steps[r]);
    counter(o, lab, "executor_steps", "Engine steps the specialized decode executor ran.", (double)g->executor_steps);

    pthread_mutex_lock(&m->mu);
    head(o, "request_success", "counter", "Count of successfully processed requests.");
    for (int f = 0; f < SRV_FINISH_TOOL_CALLS; f++)
        srv_buf_printf(o, "k3c:request_success_total{%s,finished_reason=\"%s\"} %lu\n", lab, srv_finish_name(f),
                       m->finished[f]);
    head(o, "request_rejected", "counter", "Requests refused before they were queued.");
    srv_buf_printf(o, "k3c:request_rejected_total{%s,reason=\"queue_full\"} %lu\n", lab, m->rejected_queue_full);
    srv_buf_printf(o, "k3c:request_rejected_total{%s,reason=\"invalid\"} %lu\n", lab, m->rejected_invalid);
    hist(o, lab, "time_to_first_token_seconds", "Histogram of time to first token in seconds.", &m->ttft);
    hist(o, lab, "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &m->itl);
    hist(o, lab, "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &m->e2e);
    hist(o, lab, "request_prompt_tokens", "Number of prefill tokens processed.", &m->prompt_len);
    hist(o, lab, "request_generation_tokens", "Number of generation tokens processed.", &m->gen_len);
    hist(o, lab, "request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
         &m->tpot);
    hist(o, lab, "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", &m->queue);
    hist(o, lab, "request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", &m->prefill);
    hist(o, lab, "request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", &m->decode);
    hist(o, lab, "request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
         &m->inference);
    hist(o, lab, "request_params_n", "Histogram of the n request parameter.", &m->params_n);
    hist(o, lab, "request_params_max_tokens", "Histogram of the max_tokens request parameter.", &m->params_max_tokens);
    hist(o, lab, "iteration_tokens_total", "Histogram of number of tokens per engine_step.", &m->iteration_tokens);
    pthread_mutex_unlock(&m->mu);
    srv_buf_free(&lb);
}
