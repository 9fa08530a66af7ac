/* The serving scheduler (include/k3c.h, serving scheduler section). Stub: the interface compiles and
 * refuses to run until the implementation lands. */
#include <string.h>

#include "k3c.h"
#include "util/error.h"

void k3c_scheduler_options_default(k3c_scheduler_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->prefix_caching = 1;
}

int k3c_scheduler_create(k3c_engine *e, const k3c_scheduler_options *o, k3c_scheduler **out) {
    (void)e, (void)o;
    if (out) *out = NULL;
    return k3c_errorf_kind(K3C_ERROR_INTERNAL, "scheduler: not implemented yet");
}

void k3c_scheduler_free(k3c_scheduler *s) { (void)s; }

int k3c_scheduler_submit(k3c_scheduler *s, const k3c_sched_request *q, uint64_t *id) {
    (void)s, (void)q, (void)id;
    return k3c_errorf_kind(K3C_ERROR_INTERNAL, "scheduler: not implemented yet");
}

int k3c_scheduler_abort(k3c_scheduler *s, uint64_t id) {
    (void)s, (void)id;
    return K3C_OK;
}

int k3c_scheduler_step(k3c_scheduler *s, const k3c_sched_event **events, int *n_events, int *busy) {
    (void)s;
    if (events) *events = NULL;
    if (n_events) *n_events = 0;
    if (busy) *busy = 0;
    return k3c_errorf_kind(K3C_ERROR_INTERNAL, "scheduler: not implemented yet");
}

void k3c_scheduler_wait(k3c_scheduler *s, int timeout_ms) { (void)s, (void)timeout_ms; }

void k3c_scheduler_stats_get(k3c_scheduler *s, k3c_scheduler_stats *out) {
    (void)s;
    if (out) memset(out, 0, sizeof *out);
}
