/* TEMPORARY: the serving scheduler's interface as agreed (SCHED_API.md), implemented by sched_adapter.c
 * over the engine's public step API until the scheduler lands in k3c.h; then both files go. */
#ifndef K3C_SERVER_SCHED_ADAPTER_H
#define K3C_SERVER_SCHED_ADAPTER_H

#include "k3c.h"

typedef struct k3c_scheduler k3c_scheduler;
typedef enum { K3C_SCHED_FCFS = 0, K3C_SCHED_PRIORITY = 1 } k3c_sched_policy;
typedef struct k3c_scheduler_options {
    int max_seqs, max_batched_tokens, max_queue;
    k3c_sched_policy policy;
    int spec_tokens, prefix_caching;
    size_t snapshot_bytes;
} k3c_scheduler_options;
typedef struct k3c_sched_sampling {
    k3c_sampling base;
    float min_p;
    float presence_penalty, frequency_penalty, repetition_penalty;
    int logprobs;
} k3c_sched_sampling;
typedef struct k3c_sched_request {
    const int32_t *prompt;
    int n_prompt;
    int max_new;
    k3c_sched_sampling sampling;
    const int32_t *stop_ids;
    int n_stop_ids;
    int ignore_eos;
    int priority;
    void *user;
} k3c_sched_request;
typedef enum { K3C_SCHED_TOKEN = 0, K3C_SCHED_FINISHED = 1 } k3c_sched_event_kind;
typedef enum { K3C_FINISH_NONE = 0, K3C_FINISH_STOP, K3C_FINISH_LENGTH, K3C_FINISH_ABORT, K3C_FINISH_ERROR } k3c_finish_reason;
typedef struct k3c_sched_event {
    k3c_sched_event_kind kind;
    uint64_t id;
    void *user;
    int32_t token;
    float logprob;
    int n_top;
    const int32_t *top_ids;
    const float *top_logprobs;
    k3c_finish_reason finish;
    int prompt_tokens, cached_tokens, completion_tokens;
} k3c_sched_event;
int k3c_scheduler_create(k3c_engine *e, const k3c_scheduler_options *o, k3c_scheduler **out);
void k3c_scheduler_free(k3c_scheduler *s);
int k3c_scheduler_submit(k3c_scheduler *s, const k3c_sched_request *q, uint64_t *id);
int k3c_scheduler_abort(k3c_scheduler *s, uint64_t id);
int k3c_scheduler_step(k3c_scheduler *s, const k3c_sched_event **events, int *n_events, int *busy);
typedef struct k3c_scheduler_stats {
    int running, waiting;
    long preemptions;
    long prompt_tokens, generation_tokens;
    long prefix_queries_tokens, prefix_hits_tokens;
    int blocks_total, blocks_used;
    int kda_slots_total, kda_slots_used;
    long snapshots, snapshot_bytes;
    long spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    long finished_stop, finished_length, finished_abort;
    long steps, executor_steps;
    long route_steps[4];
} k3c_scheduler_stats;
void k3c_scheduler_stats_get(k3c_scheduler *s, k3c_scheduler_stats *out);

#endif
